//! `docs/participant-protocol.md` is the wire as the code speaks it: every example is what the code
//! parses and writes again byte for byte, valid under the page's schema; every signature verifies under
//! the page's key and is computed again to the same MAC from the signing input the page prints; the
//! schemas' lists are the code's. A change of how a message is written or signed fails here first.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;
use twopc::auth::{Envelope, KeySet, hmac_sha256, open, seal_with, sign_with, signing_input, signing_input_v2, verify};
use twopc::custom::Catalog;
use twopc::model::{
    Action, Message, Operation, ParticipantRequest, ParticipantResponse, RefusalCode, STATUS_ABORTED, STATUS_COMMITTED,
    STATUS_FAILED, STATUS_HELD, STATUS_NOT_PREPARED, STATUS_RECORD_EXISTS, Vote,
};

const DOC: &str = "docs/participant-protocol.md";
const KEY_ID: &str = "doc-key-1";
const SECRET: &str = "a secret of the documentation, never deployed";
const SIGNED_AT: u64 = 1_796_000_000_000;

/// A fenced block and the `name=value` words of its info string.
struct Block {
    attributes: Vec<(String, String)>,
    text: String,
}

impl Block {
    fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

fn blocks() -> Vec<Block> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(DOC);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{DOC}: {e}"));
    let mut found = Vec::new();
    let mut current: Option<Block> = None;
    for line in text.lines() {
        match &mut current {
            None => {
                if let Some(info) = line.strip_prefix("```").filter(|info| !info.is_empty()) {
                    let attributes = info
                        .split_whitespace()
                        .filter_map(|w| w.split_once('='))
                        .map(|(n, v)| (n.to_owned(), v.to_owned()))
                        .collect();
                    current = Some(Block { attributes, text: String::new() });
                }
            }
            Some(_) if line == "```" => found.push(current.take().expect("a block")),
            Some(block) => {
                if !block.text.is_empty() {
                    block.text.push('\n');
                }
                block.text.push_str(line);
            }
        }
    }
    found
}

fn schema(blocks: &[Block], name: &str) -> (Value, jsonschema::Validator) {
    let block = blocks.iter().find(|b| b.attribute("schema") == Some(name)).unwrap_or_else(|| panic!("schema {name}"));
    let schema: Value = serde_json::from_str(&block.text).unwrap_or_else(|e| panic!("schema {name}: {e}"));
    let validator = jsonschema::draft202012::new(&schema).unwrap_or_else(|e| panic!("schema {name} compiles: {e}"));
    (schema, validator)
}

fn valid(validator: &jsonschema::Validator, what: &str, value: &Value) {
    let errors: Vec<String> = validator.iter_errors(value).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{what} is not valid under its schema: {errors:?}\n{value}");
}

fn strings(value: &Value) -> BTreeSet<String> {
    value.as_array().expect("a list").iter().map(|v| v.as_str().expect("a string").to_owned()).collect()
}

fn names<T: serde::Serialize>(values: impl IntoIterator<Item = T>) -> BTreeSet<String> {
    values.into_iter().map(|v| serde_json::to_value(v).unwrap().as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn every_message_example_is_the_codes_and_its_signature_the_documented_one() {
    let blocks = blocks();
    let (_, validator) = schema(&blocks, "message");
    let keys = twopc::auth::MemoryKeys::new();
    let mut examples = 0;
    let mut actions = BTreeSet::new();
    for block in blocks.iter().filter(|b| b.attribute("example").is_some_and(|e| !e.starts_with("answer-"))) {
        let name = block.attribute("example").unwrap();
        let service = block.attribute("service").unwrap_or_else(|| panic!("{name} names the service it is signed for"));
        keys.set(service, KeySet::single(KEY_ID, SECRET));
        let sent: Value = serde_json::from_str(&block.text).unwrap_or_else(|e| panic!("{name}: {e}"));
        valid(&validator, name, &sent);
        let message: ParticipantRequest = serde_json::from_str(&block.text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(serde_json::to_value(&message).unwrap(), sent, "{name}: the code writes it otherwise");
        actions.insert(message.action.as_str());

        // The documented signature verifies, and signing the message again gives it back.
        verify(keys.as_ref(), service, &message, SIGNED_AT).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut unsigned = message.clone();
        unsigned.signature = None;
        let signed = sign_with(&KeySet::single(KEY_ID, SECRET), service, &unsigned, SIGNED_AT).unwrap();
        assert_eq!(signed.signature, message.signature, "{name}: the MAC the code computes");

        // Where the page prints the signing input, it is the code's, and its HMAC is the MAC.
        if let Some(input) = blocks.iter().find(|b| b.attribute("signing-input") == Some(name)) {
            assert_eq!(input.attribute("service"), Some(service), "{name}");
            let bytes = signing_input(service, KEY_ID, SIGNED_AT, &unsigned);
            assert_eq!(input.text, String::from_utf8(bytes.clone()).unwrap(), "{name}: the signing input");
            let mac = hex::encode(twopc::auth::hmac_sha256(SECRET.as_bytes(), input.text.as_bytes()));
            assert_eq!(Some(mac), message.signature.as_ref().map(|s| s.mac.clone()), "{name}");
            examples += 1;
        }
        // Any other field changes the MAC: the signature covers the whole message.
        let mut changed = message.clone();
        changed.transaction_id.push('x');
        assert!(
            verify(keys.as_ref(), service, &changed, SIGNED_AT).await.is_err(),
            "{name}: a changed message verifies"
        );
    }
    assert!(examples >= 2, "the page prints the signing input of two examples");
    assert_eq!(
        actions,
        [Action::Prepare, Action::Commit, Action::Abort, Action::Hold].iter().map(|a| a.as_str()).collect()
    );
}

/// Step 4's typed messages leave the wire as it was: every example reads as its action's message and
/// that message writes the example again, field for field.
#[test]
fn every_message_example_reads_as_its_typed_message_and_writes_back_the_same() {
    let blocks = blocks();
    let mut read = BTreeSet::new();
    let mut normalized = vec![];
    for block in blocks.iter().filter(|b| b.attribute("example").is_some_and(|e| !e.starts_with("answer-"))) {
        let name = block.attribute("example").unwrap();
        let sent: Value = serde_json::from_str(&block.text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let request: ParticipantRequest = serde_json::from_value(sent.clone()).unwrap();
        let message = Message::read(&request, &Catalog::any()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(message.action(), request.action, "{name}");
        let written = ParticipantRequest { signature: request.signature.clone(), ..message.to_wire() };
        // Operations are written as the coordinator has always sent them, in the form a parsed operation
        // writes (`-0` as `0`: the value the participant writes to the item either way); every other
        // field as it came.
        let mut expected = sent.clone();
        expected["operations"] = twopc::participant::parse_operations_for(&request.operations, &Catalog::any())
            .unwrap()
            .iter()
            .map(Operation::to_json)
            .collect();
        if expected != sent {
            normalized.push(name);
        }
        assert_eq!(serde_json::to_value(&written).unwrap(), expected, "{name}: the typed message writes it otherwise");
        read.insert(format!("{:?}", std::mem::discriminant(&message)));
    }
    assert_eq!(read.len(), 5, "an example of each message: prepare, one-phase commit, commit, hold, abort");
    // Only the example written to show number forms is not in the form the coordinator sends.
    assert_eq!(normalized, ["prepare-values"]);
}

#[test]
fn every_answer_example_is_the_codes() {
    let blocks = blocks();
    let (_, validator) = schema(&blocks, "answer");
    let mut seen = BTreeSet::new();
    for block in blocks.iter().filter(|b| b.attribute("example").is_some_and(|e| e.starts_with("answer-"))) {
        let name = block.attribute("example").unwrap();
        let sent: Value = serde_json::from_str(&block.text).unwrap_or_else(|e| panic!("{name}: {e}"));
        valid(&validator, name, &sent);
        let answer: ParticipantResponse = serde_json::from_str(&block.text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(serde_json::to_value(&answer).unwrap(), sent, "{name}: the code writes it otherwise");
        seen.insert(answer.outcome().to_owned());
    }
    for outcome in ["PREPARED", "REFUSED", STATUS_COMMITTED, STATUS_ABORTED, STATUS_HELD, STATUS_FAILED] {
        assert!(seen.contains(outcome), "no example answers {outcome}");
    }
}

#[test]
fn the_schemas_lists_are_the_codes() {
    let blocks = blocks();
    let (message, _) = schema(&blocks, "message");
    let (answer, _) = schema(&blocks, "answer");
    let actions: BTreeSet<String> =
        [Action::Prepare, Action::Commit, Action::Abort, Action::Hold].iter().map(|a| a.as_str().to_owned()).collect();
    assert_eq!(strings(&message["properties"]["action"]["enum"]), actions);
    assert_eq!(strings(&answer["properties"]["vote"]["enum"]), names(Vote::ALL));
    assert_eq!(strings(&answer["properties"]["code"]["enum"]), names(RefusalCode::ALL));
    let statuses =
        [STATUS_COMMITTED, STATUS_NOT_PREPARED, STATUS_ABORTED, STATUS_HELD, STATUS_RECORD_EXISTS, STATUS_FAILED];
    assert_eq!(strings(&answer["properties"]["status"]["enum"]), statuses.iter().map(|s| s.to_string()).collect());
    // Every field the code writes is in the schema (a new one fails here until the page names it).
    let written = |value: Value| -> BTreeSet<String> { value.as_object().unwrap().keys().cloned().collect() };
    let full = ParticipantRequest {
        deadline: Some(1),
        one_phase_record: Some(serde_json::json!({})),
        started_at: Some(1),
        lock_token: Some("t".into()),
        principal: Some("p".into()),
        held: true,
        hold_until: Some(1),
        holds_no_locks: true,
        recorded: true,
        signature: Some(twopc::auth::MessageSignature { key_id: "k".into(), signed_at: 1, mac: "m".into() }),
        ..ParticipantRequest::new(Action::Prepare, "tx")
    };
    let documented: BTreeSet<String> = message["properties"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(written(serde_json::to_value(&full).unwrap()), documented, "the message's fields");
    let full = ParticipantResponse {
        vote: Some(Vote::Refused),
        status: Some("x".into()),
        code: Some(RefusalCode::Rule),
        reason: Some("r".into()),
        read_only: true,
        lock_token: Some("t".into()),
        service_code: Some("s".into()),
        received_at: Some(1),
        answered_at: Some(1),
        blocked_by: Some("b".into()),
        unresolved_owner: Some("o".into()),
    };
    let documented: BTreeSet<String> = answer["properties"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(written(serde_json::to_value(&full).unwrap()), documented, "the answer's fields");
}

/// The sample events a newcomer invokes are messages the page describes.
#[test]
fn the_sample_participant_events_are_valid_messages() {
    let blocks = blocks();
    let (_, validator) = schema(&blocks, "message");
    let events = Path::new(env!("CARGO_MANIFEST_DIR")).join("../events");
    for action in ["prepare", "commit", "abort"] {
        let path = events.join(format!("participant-{action}.json"));
        let event: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        valid(&validator, &path.display().to_string(), &event);
    }
}

/// The v2 example: valid under the envelope's schema, opened under the page's key to the v1 example's
/// message, its printed signing input the code's, and the code seals that message to the same envelope.
#[tokio::test]
async fn the_envelope_example_opens_to_the_same_message() {
    let blocks = blocks();
    let (_, validator) = schema(&blocks, "envelope");
    let block = blocks.iter().find(|b| b.attribute("envelope").is_some()).expect("an envelope example");
    let name = block.attribute("envelope").unwrap();
    let service = block.attribute("service").expect("the service it is sealed for");
    let sent: Value = serde_json::from_str(&block.text).unwrap();
    valid(&validator, name, &sent);
    let envelope: Envelope = serde_json::from_str(&block.text).unwrap();
    let keys = twopc::auth::MemoryKeys::new();
    keys.set(service, KeySet::single(KEY_ID, SECRET));
    let opened = open(keys.as_ref(), service, &envelope, SIGNED_AT).await.expect("the envelope opens");
    let example = blocks.iter().find(|b| b.attribute("example") == Some(name)).expect("the v1 example it seals");
    let mut message: ParticipantRequest = serde_json::from_str(&example.text).unwrap();
    message.signature = None;
    assert_eq!(opened, message);
    let input = blocks.iter().find(|b| b.attribute("signing-input-v2") == Some(name)).expect("its signing input");
    let bytes = signing_input_v2(service, KEY_ID, SIGNED_AT, envelope.message.as_bytes());
    assert_eq!(input.text.as_bytes(), bytes.as_slice());
    assert_eq!(hex::encode(hmac_sha256(SECRET.as_bytes(), &bytes)), envelope.mac);
    let sealed = seal_with(&KeySet::single(KEY_ID, SECRET), service, &message, SIGNED_AT).unwrap();
    assert_eq!(sealed, envelope, "the code seals the message to the printed envelope");
}
