//! Participant messages signed in v1 and sealed in v2 (issue 45, step 1): a participant takes both, the
//! coordinator's messages in either version survive lost replies, duplicates and late copies, a
//! deployment halfway through the switch (a v2 coordinator, a v1 sweeper) finishes what it starts, and
//! the participant function verifies an envelope over the bytes as sent.

use serde_json::{Value, json};
use twopc::auth::{Envelope, LocalKeys, SignatureVersion};

use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::{Action, ParticipantRequest, Status, Vote};
use twopc_tests::{EdgeFault, TestEnv, call_coordinator, rest_event};

fn transfer(amount: &str) -> Value {
    TestEnv::transfer(("service-a", "A"), ("service-b", "B"), amount)
}

async fn funded() -> TestEnv {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    env
}

/// Lost replies, duplicates and late copies of sealed messages: the transfer happens once.
#[tokio::test]
async fn sealed_messages_lost_duplicated_and_late_apply_once() {
    let env = funded().await;
    env.invoker.set("service-a", Action::Prepare, EdgeFault::LoseReply);
    // A keyed request's prepare is sent once: late, it is the only delivery (its answer never seen).
    env.invoker.set("service-b", Action::Prepare, EdgeFault::LateDelivery(std::time::Duration::from_millis(300)));
    env.invoker.set("service-a", Action::Commit, EdgeFault::Duplicate);
    env.invoker.set("service-b", Action::Commit, EdgeFault::LoseReply);
    let (status, answer) = env.post(&transfer("30"), Some("sealed-1")).await;
    assert!(matches!(status, 409 | 200 | 202), "{answer}");
    env.invoker.clear();
    env.settle().await;
    // The late prepare's lock (out of the locks index) is the sweeper's, past the deadline: the abort
    // waited for it, open.
    env.clock.advance(60_000);
    env.sweep_until_quiet().await;
    let (_, again) = env.post(&transfer("30"), Some("sealed-1")).await;
    let committed = again["status"] == "COMMITTED";
    let (a, b) = (env.balance("service-a", "A").await, env.balance("service-b", "B").await);
    assert_eq!((a.as_str(), b.as_str()), if committed { ("70", "30") } else { ("100", "0") }, "{again}");
    assert!(env.locked_items().await.is_empty(), "no lock stays");
    let calls = env.invoker.calls();
    assert!(!calls.is_empty() && calls.iter().all(|c| c.sealed), "every message of the world's coordinator is sealed");
    assert!(calls.iter().any(|c| c.late_copy), "a late copy was delivered: {calls:?}");

    // Without faults it commits, every message sealed.
    let (status, answer) = env.post(&transfer("10"), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
}

/// A deployment halfway through the switch: the coordinator seals (v2), the sweeper still signs (v1);
/// the sweeper finishes the coordinator's transaction, at the same participants.
#[tokio::test]
async fn a_v1_sweeper_finishes_what_a_v2_coordinator_decided() {
    let env = funded().await;
    let invoker = env.fresh_invoker();
    let coordinator = env.coordinator_with(&invoker, Faults::crash_at(CoordinatorCrash::AfterDecision));
    let event =
        rest_event("POST", "/transactions", "/transactions", None, json!({}), Some(&transfer("25").to_string()));
    let (status, answer) = call_coordinator(&coordinator, &event).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (500, Some("CRASHED")), "{answer}");
    let id = answer["transactionId"].as_str().unwrap().to_owned();
    assert!(invoker.calls().iter().all(|c| c.sealed));
    env.clock.advance(10_000);
    env.sweep_until_quiet().await;
    assert_eq!(env.transactions.get(&id).await.unwrap().unwrap().status, Status::Committed);
    assert_eq!(env.balance("service-a", "A").await, "75");
    assert_eq!(env.balance("service-b", "B").await, "25");
}

/// A coordinator still on v1 is taken as before.
#[tokio::test]
async fn a_v1_coordinator_still_commits() {
    let env = funded().await;
    let invoker = env.fresh_invoker();
    let coordinator = env.coordinator_of(&invoker).with_signature(SignatureVersion::V1);
    let event = rest_event("POST", "/transactions", "/transactions", None, json!({}), Some(&transfer("5").to_string()));
    let (status, answer) = call_coordinator(&coordinator, &event).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert!(invoker.calls().iter().all(|c| !c.sealed));
}

/// The participant function's entry: an envelope whose message another serializer wrote (key order,
/// whitespace, number forms) is verified over those bytes and acted on; a changed byte is refused, and
/// nothing is locked.
#[tokio::test]
async fn the_participant_function_opens_an_envelope_over_the_bytes_sent() {
    let env = funded().await;
    let participant = &env.participants["service-a"];
    let now = env.clock_now();
    let text = format!(
        "{{\n  \"transactionId\": \"tx-envelope-1\",\n  \"action\": \"prepare\",\n  \"startedAt\": {now},\n  \"deadline\": {},\n  \"operations\": [ {{ \"op\": \"add\", \"key\": {{\"entityId\": \"A\"}}, \"field\": \"balance\", \"delta\": -1.0E1, \"min\": 0 }} ]\n}}",
        now + 5_000
    );
    let seal = |message: &str| {
        let key = LocalKeys::key_set("service-a").signing_key(now).unwrap().clone();
        let input = twopc::auth::signing_input_v2("service-a", &key.id, now, message.as_bytes());
        Envelope {
            envelope: twopc::auth::ENVELOPE_V2.into(),
            key_id: key.id,
            signed_at: now,
            mac: hex::encode(twopc::auth::hmac_sha256(key.secret.as_bytes(), &input)),
            message: message.to_owned(),
        }
    };
    let mut forged = seal(&text);
    forged.message = forged.message.replace("-1.0E1", "-1.0E3");
    let refused = participant::handle(participant, serde_json::to_value(&forged).unwrap()).await;
    assert!(refused.is_err(), "a changed byte is refused: {refused:?}");
    assert!(env.locked_items().await.is_empty(), "the refused message locked nothing");

    let answer = participant::handle(participant, serde_json::to_value(seal(&text)).unwrap()).await.unwrap();
    assert_eq!(answer.vote, Some(Vote::Prepared), "{answer:?}");
    assert_eq!(env.locked_items().await.len(), 1);
    // Its abort, signed in v1 as a sweeper that has not switched yet signs it, releases the lock.
    let abort = ParticipantRequest {
        operations: vec![json!({"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": -10, "min": 0})],
        ..ParticipantRequest::new(Action::Abort, "tx-envelope-1")
    };
    let answer =
        participant::handle(participant, serde_json::to_value(env.signed("service-a", abort)).unwrap()).await.unwrap();
    assert_eq!(answer.status.as_deref(), Some("ABORTED"), "{answer:?}");
    assert!(env.locked_items().await.is_empty());
    assert_eq!(env.balance("service-a", "A").await, "100");
}
