//! DynamoDB's limits on what the protocol stores (issue 27), against DynamoDB Local: item sizes as
//! DynamoDB counts them; the nesting bound at its exact limit in every place a value is stored; the
//! transaction record's bound, a request at the bound driven through every transition (commit, abort,
//! fence, postponement, lock resolution's abort) with the longest reasons and `sweepError`; and records
//! that reach 400 KB anyway (written before the bound, or refused as invalid) still ending.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{Value, json};
use twopc::coordinator::Coordinator;
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::{Action, MAX_PARTICIPANTS, Status};
use twopc::record::{MAX_REASON_BYTES, MAX_RECORD_BYTES, MAX_SWEEP_ERROR_BYTES, TransactionRecord};
use twopc::size::{MAX_ITEM_BYTES, item_size};
use twopc::store::shard_of;
use twopc_tests::{DynamoFault, DynamoFaults, EdgeFault, Rule, TestEnv, call_coordinator, rest_event};

type Item = HashMap<String, AttributeValue>;

/// `levels` maps (or lists) nested around the number 1: `{"d": {"d": 1}}` for 2.
fn nested(levels: usize, list: bool) -> Value {
    (0..levels).fold(json!(1), |inner, _| if list { json!([inner]) } else { json!({"d": inner}) })
}

/// An element that DynamoDB counts at almost twice its JSON: empty lists nested 20 deep. Padding made
/// of them reaches the record's bound with a body well under the 256 KiB limit.
fn dense_element() -> Value {
    (0..19).fold(json!([]), |inner, _| json!([inner]))
}

/// The bytes of the first write of `body`'s record, with the largest timestamps of today's digit count
/// (a timestamp ending in zeros takes fewer bytes): the coordinator's own record is never larger.
fn first_write_bytes(env: &TestEnv, body: &Value, keyed: bool) -> usize {
    let request = twopc::coordinator::parse_request(body.to_string().as_bytes(), |_| true).expect("a valid request");
    let hash = keyed.then(|| request.canonical_hash());
    let now = env.clock_now() / 10 * 10 + 1;
    let id = format!("tx-{}", "0".repeat(32));
    // A one-phase request's id carries its service (issue 42): one participant, not held, writing.
    let id = match request.participants.as_slice() {
        [sole] if request.hold_ms.is_none() => twopc::coordinator::one_phase_id(&sole.service, &id),
        _ => id,
    };
    TransactionRecord::preparing(id, &request, hash, now).first_write_bytes()
}

/// `body` with the data of its first operation padded (dense lists, then a string for the last bytes)
/// so that its record's first write takes exactly `target` bytes.
fn padded(env: &TestEnv, body: &Value, keyed: bool, target: usize) -> Value {
    let mut body = body.clone();
    fn data(body: &mut Value) -> &mut serde_json::Map<String, Value> {
        let op = &mut body["participants"][0]["operations"][0];
        let field = if op["op"] == "set" { "set" } else { "data" };
        op[field].as_object_mut().expect("an operation with data")
    }
    data(&mut body).insert("fill".into(), json!(""));
    data(&mut body).insert("dense".into(), json!([]));
    let unpadded = first_write_bytes(env, &body, keyed);
    let element = 1 + twopc::size::value_size(&twopc::attr::to_attribute(&dense_element()));
    let count = (target - unpadded - 64) / element;
    data(&mut body).insert("dense".into(), Value::Array(vec![dense_element(); count]));
    let rest = target - first_write_bytes(env, &body, keyed);
    data(&mut body).insert("fill".into(), json!("f".repeat(rest)));
    assert_eq!(first_write_bytes(env, &body, keyed), target);
    assert!(body.to_string().len() < twopc::model::MAX_BODY_BYTES, "the body stays under 256 KiB");
    body
}

fn services() -> Vec<String> {
    (0..MAX_PARTICIPANTS).map(|i| format!("s{i:02}")).collect()
}

async fn world(faults: DynamoFaults) -> TestEnv {
    let names = services();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let env = TestEnv::with_dynamo_faults(&names, faults).await;
    for service in &names {
        env.put_account(service, "A", "100").await;
    }
    env
}

/// A transaction over every service: the first puts item `p` (the padding goes into its data: a new
/// item each time, since the lock's `pending` holds a copy of it beside the item's data), every other
/// one adds 1 to its account A.
fn at_every_service(p: &str) -> Value {
    let mut participants =
        vec![json!({"service": "s00", "operations": [{"op": "put", "key": {"entityId": p}, "data": {"x": 1}}]})];
    participants.extend(services().iter().skip(1).map(|s| {
        json!({"service": s, "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": 1}]})
    }));
    json!({"participants": participants, "timeoutMs": 10000})
}

async fn post_via(coordinator: &Coordinator, body: &Value, key: Option<&str>) -> (u16, Value) {
    let headers = key.map_or(json!({}), |key| json!({"Idempotency-Key": key}));
    let event = rest_event("POST", "/transactions", "/transactions", None, headers, Some(&body.to_string()));
    call_coordinator(coordinator, &event).await
}

async fn assert_no_locks(env: &TestEnv) {
    let locked = env.locked_items().await;
    assert!(locked.is_empty(), "locks left: {}", locked.len());
}

/// Every answer of a record agrees with GET, and GET with the record (200 whatever the state: the body's
/// `status` tells it).
async fn assert_get_says(env: &TestEnv, id: &str, body_status: &str) -> Value {
    let (got, answer) = env.get(id).await;
    assert_eq!((got, answer["status"].as_str().unwrap()), (200, body_status), "{answer}");
    answer
}

// ---------------------------------------------------------------------------------------------------
// Sizes and nesting as DynamoDB Local counts them
// ---------------------------------------------------------------------------------------------------

/// `twopc::size` counts what DynamoDB Local counts: an item of every kind of value this system writes
/// (numbers of every form, nested lists and maps, empty ones, booleans, nulls, multi-byte text), padded
/// to 409,600 bytes as sized here, is stored; one byte more is refused.
#[tokio::test]
async fn item_sizes_match_dynamodb_local_byte_for_byte() {
    let env = TestEnv::new().await;
    let numbers = [
        "0",
        "1",
        "12",
        "123",
        "100",
        "0.1",
        "1.5",
        "-1",
        "1E-130",
        "1234567890123",
        "-9.9999999999999999999999999999999999999E+125",
        "-9.9999999999999999999999999999999999999E+124",
        "1.2345678901234567890123456789012345678",
        "99999999999999999999999999999999999999",
    ];
    let contents = [
        json!({"numbers": numbers.iter().map(|n| n.parse::<Value>().unwrap()).collect::<Vec<_>>()}),
        json!({"deep": nested(26, false), "lists": nested(26, true), "empty": [[], {}, [[]], {"é": {}}]}),
        json!({"flags": [true, false, null], "text": "é€😀", "map": {"ä": 1, "long name here": [1, "x"]}}),
        json!({"dense": vec![dense_element(); 500]}),
    ];
    for (i, data) in contents.iter().enumerate() {
        let mut item: Item = twopc::attr::to_item(data.as_object().unwrap());
        item.insert("entityId".into(), AttributeValue::S(format!("size-{i}")));
        item.insert("pad".into(), AttributeValue::S(String::new()));
        let pad = MAX_ITEM_BYTES - item_size(&item);
        for (extra, fits) in [(0, true), (1, false)] {
            item.insert("pad".into(), AttributeValue::S("p".repeat(pad + extra)));
            assert_eq!(item_size(&item), MAX_ITEM_BYTES + extra);
            let put =
                env.client.put_item().table_name(env.table("service-a")).set_item(Some(item.clone())).send().await;
            assert_eq!(put.is_ok(), fits, "content {i} at {} bytes: {put:?}", MAX_ITEM_BYTES + extra);
        }
    }
}

/// Defect 2 of issue 27: a field nested one level deeper than DynamoDB stores passed validation and
/// its record could never be written. The deepest value that fits commits (keyed, unkeyed and in one
/// phase: the record, the lock's `pending` and the item all store it); one level more is a 400
/// `LIMIT_EXCEEDED` that writes nothing.
#[tokio::test]
async fn values_at_the_nesting_limit_commit_and_one_level_more_is_refused() {
    let env = TestEnv::new().await;
    env.put_account("service-b", "B", "0").await;
    // item → participants → entry → operations → operation → data → x: x and 25 more maps inside it
    // are the deepest DynamoDB stores (26 containers from x down).
    let deepest = 26;
    for list in [false, true] {
        for (round, key) in [Some("nesting-keyed"), None].into_iter().enumerate() {
            let id = format!("N{round}{list}");
            let body = |levels: usize| {
                json!({"participants": [
                    {"service": "service-a", "operations": [{"op": "put", "key": {"entityId": id}, "data": {"x": nested(levels, list)}}]},
                    {"service": "service-b", "operations": [{"op": "add", "key": {"entityId": "B"}, "field": "balance", "delta": 1}]}
                ]})
            };
            let key = key.map(|k| format!("{k}-{list}"));
            let (status, answer) = env.post(&body(deepest + 1), key.as_deref()).await;
            assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("LIMIT_EXCEEDED")), "{answer}");
            assert!(answer["error"]["message"].as_str().unwrap().contains("limit is 32 levels"), "{answer}");
            assert!(env.item("service-a", &id).await.is_none());
            assert!(env.records().await.is_empty(), "nothing written");

            let (status, answer) = env.post(&body(deepest), key.as_deref()).await;
            assert_eq!(status, 200, "{answer}");
            let stored = env.item("service-a", &id).await.unwrap();
            assert_eq!(stored["data"]["x"], nested(deepest, list));
            let tx = answer["transactionId"].as_str().unwrap();
            let record = env.raw_record(tx).await.expect("the record");
            let record = Value::Object(twopc::attr::item_to_json(&record));
            assert_eq!(record["participants"][0]["operations"][0]["data"]["x"], nested(deepest, list));
            env.records().await.iter().for_each(|r| assert_eq!(r["status"], "COMMITTED"));
            // Recorded as committed: clear the table's view for the next round's "nothing written".
            env.client
                .delete_item()
                .table_name(env.transactions.table())
                .key("transactionId", AttributeValue::S(tx.into()))
                .send()
                .await
                .unwrap();
        }
        // One phase: the record is written with the item, in one TransactWriteItems.
        let body = |levels: usize| json!({"participants": [{"service": "service-a", "operations": [{"op": "set", "key": {"entityId": format!("N0{list}")}, "set": {"y": nested(levels, list)}}]}]});
        let (status, answer) = env.post(&body(deepest + 1), None).await;
        assert_eq!(status, 400, "{answer}");
        let (status, answer) = env.post(&body(deepest), None).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(env.item("service-a", &format!("N0{list}")).await.unwrap()["data"]["y"], nested(deepest, list));
        let tx = answer["transactionId"].as_str().unwrap();
        env.client
            .delete_item()
            .table_name(env.transactions.table())
            .key("transactionId", AttributeValue::S(tx.into()))
            .send()
            .await
            .unwrap();
    }
    assert_no_locks(&env).await;
}

// ---------------------------------------------------------------------------------------------------
// The record's bound
// ---------------------------------------------------------------------------------------------------

/// Defect 1 of issue 27, as reported: a keyed request whose puts carry nested lists made a PREPARING
/// record just under 400 KB; both participants locked, the decision (votes and tokens) and its fence
/// were refused for size, and the record said PREPARING for ever. Now it is a 400 `LIMIT_EXCEEDED`
/// naming the bound, before anything is written.
#[tokio::test]
async fn a_record_that_fits_only_until_the_decision_is_refused_before_anything_is_written() {
    let env = TestEnv::new().await;
    let part = |service: &str, id: &str| json!({"service": service, "operations": [{"op": "put", "key": {"entityId": id}, "data": {"x": 1}}]});
    let body = json!({"participants": [part("service-a", "A"), part("service-b", "B")], "timeoutMs": 3000});
    // Just under 400 KB: the votes of the decision push it over.
    let body = padded(&env, &body, true, MAX_ITEM_BYTES - 40);
    assert!(body.to_string().len() < 230 * 1024, "about 220 KB of JSON: {}", body.to_string().len());

    let (status, answer) = env.post(&body, Some("nested-lists")).await;

    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("LIMIT_EXCEEDED")), "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("the limit is {MAX_RECORD_BYTES} bytes")), "{message}");
    assert!(env.records().await.is_empty(), "no record");
    assert!(env.item("service-a", "A").await.is_none() && env.item("service-b", "B").await.is_none());
}

/// A request whose record is at the bound commits keyed (record first), unkeyed (the COMMITTING record
/// with 32 votes is the first write) and in one phase; a few bytes over the bound is refused.
#[tokio::test]
async fn a_record_at_the_bound_commits_keyed_unkeyed_and_in_one_phase() {
    let env = world(DynamoFaults::new(0)).await;
    for (round, key) in [Some("at-the-bound"), None].into_iter().enumerate() {
        let body = padded(&env, &at_every_service(&format!("P{round}")), key.is_some(), MAX_RECORD_BYTES);
        let (status, answer) = env.post(&body, key).await;
        assert_eq!(status, 200, "{}", shorten(&answer));
        assert_eq!(answer["participants"].as_array().unwrap().len(), MAX_PARTICIPANTS);
        assert_eq!(env.balance("s31", "A").await, (101 + round).to_string());
        assert_get_says(&env, answer["transactionId"].as_str().unwrap(), "COMMITTED").await;
    }
    // The same time as the rounds above: a 400 KB one-phase write under a loaded machine takes seconds.
    let one_phase =
        json!({"participants": [at_every_service("P-one-phase")["participants"][0].clone()], "timeoutMs": 10000});
    let (status, answer) = env.post(&padded(&env, &one_phase, false, MAX_RECORD_BYTES), None).await;
    assert_eq!(status, 200, "{}", shorten(&answer));

    let records = env.records().await.len();
    // The coordinator's timestamps may take a byte less each than the test's: 8 bytes over is over.
    let over = padded(&env, &at_every_service("P-over"), true, MAX_RECORD_BYTES + 8);
    let (status, answer) = env.post(&over, Some("over-the-bound")).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("LIMIT_EXCEEDED")), "{}", shorten(&answer));
    assert_eq!(env.records().await.len(), records, "nothing written");
    assert_eq!(env.balance("s31", "A").await, "102");
    assert_no_locks(&env).await;
}

/// At the bound, every participant refuses with a reason longer than a record keeps (its key alone
/// is 600 bytes): the abort is recorded with each reason and the record's reason cut to
/// `MAX_REASON_BYTES`, and the answer and GET say the same.
#[tokio::test]
async fn a_record_at_the_bound_aborts_with_the_longest_reasons() {
    let env = world(DynamoFaults::new(0)).await;
    let long_key = "k".repeat(600);
    let participants: Vec<Value> = services()
        .iter()
        .map(|s| json!({"service": s, "operations": [{"op": "set", "key": {"entityId": long_key}, "set": {"x": 1}}]}))
        .collect();
    let body = padded(&env, &json!({"participants": participants, "timeoutMs": 10000}), true, MAX_RECORD_BYTES);

    let (status, answer) = env.post(&body, Some("longest-reasons")).await;

    assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{}", shorten(&answer));
    for p in answer["participants"].as_array().unwrap() {
        let reason = p["reason"].as_str().unwrap();
        assert_eq!(p["code"], "NOT_FOUND");
        assert!(reason.len() <= MAX_REASON_BYTES && reason.ends_with('…'), "{} bytes", reason.len());
    }
    let reason = answer["reason"].as_str().unwrap();
    assert!(reason.len() <= MAX_REASON_BYTES && reason.ends_with('…'));
    let got = assert_get_says(&env, answer["transactionId"].as_str().unwrap(), "ABORTED").await;
    assert_eq!(got, answer);
    assert_no_locks(&env).await;
}

/// At the bound: a decision DynamoDB refuses on every attempt is fenced by the abort with the 32 votes
/// and its reason; a transaction left COMMITTING is postponed with the longest `sweepError` and then
/// finished; one left PREPARING is aborted by lock resolution (with its reason) when a later
/// transaction meets its expired lock, and the sweeper ends it.
#[tokio::test]
async fn a_record_at_the_bound_is_fenced_postponed_and_resolved() {
    let faults = DynamoFaults::new(0);
    let env = world(faults.clone()).await;
    let body = |p: &str| padded(&env, &at_every_service(p), true, MAX_RECORD_BYTES);

    // The fence: every attempt at COMMITTING is throttled, so the abort is written over it.
    let decision = Rule::new(DynamoFault::Throttle).operation("UpdateItem").table(env.transactions.table());
    faults.add(decision.body_contains("\"COMMITTING\""));
    let (status, answer) = env.post(&body("P-fenced"), Some("fenced")).await;
    faults.clear();
    assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{}", shorten(&answer));
    assert!(answer["participants"].as_array().unwrap().iter().all(|p| p["vote"] == "PREPARED"));
    assert_get_says(&env, answer["transactionId"].as_str().unwrap(), "ABORTED").await;
    assert_no_locks(&env).await;

    // Left COMMITTING by a crash: postponed with the longest error the sweeper could write, then finished.
    let crashing = env.coordinator_with(&env.fresh_invoker(), Faults::crash_at(CoordinatorCrash::AfterDecision));
    let (status, answer) = post_via(&crashing, &body("P-postponed"), Some("postponed")).await;
    assert_eq!(status, 500, "{}", shorten(&answer));
    let id = answer["transactionId"].as_str().unwrap().to_owned();
    let later = env.clock_now() + 60_000;
    let postponed = env.transactions.postpone(&id, later, 7, &"e".repeat(100_000)).await;
    assert!(postponed.expect("postponed"), "still COMMITTING and open");
    let record = env.transactions.get(&id).await.unwrap().unwrap();
    assert_eq!(record.sweep_error.as_ref().map(String::len), Some(MAX_SWEEP_ERROR_BYTES));
    assert_eq!(record.sweep_at, Some(later));
    env.clock.advance(120_000);
    env.sweep_until_quiet().await;
    assert_get_says(&env, &id, "COMMITTED").await;

    // Left PREPARING by a crash after the prepares: a later deposit meets an expired lock and aborts it.
    let crashing = env.coordinator_with(&env.fresh_invoker(), Faults::crash_at(CoordinatorCrash::AfterPrepares(32)));
    let (status, answer) = post_via(&crashing, &body("P-resolved"), Some("resolved")).await;
    assert_eq!(status, 500, "{}", shorten(&answer));
    let id = answer["transactionId"].as_str().unwrap().to_owned();
    env.clock.advance(11_000);
    // With a `max`, the deposit takes the lock and waits for pending credits, so it meets the crashed
    // keyed transaction's credit (a pending entry, which a credit without a guard would pass by).
    let deposit = json!({"participants": [{"service": "s05", "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": 1, "max": 1_000_000}]}]});
    let (status, answer) = env.post(&deposit, None).await;
    assert_eq!(status, 200, "{}", shorten(&answer));
    let record = env.transactions.get(&id).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Aborting);
    assert_eq!(record.reason.as_deref(), Some(twopc::recovery::EXPIRED_REASON));
    env.sweep_until_quiet().await;
    assert_get_says(&env, &id, "ABORTED").await;
    assert_no_locks(&env).await;
    // The first commit and the deposit, each once.
    assert_eq!(env.balance("s05", "A").await, "102");
}

// ---------------------------------------------------------------------------------------------------
// Records at 400 KB anyway: every transaction still ends
// ---------------------------------------------------------------------------------------------------

/// An open record of `size` bytes, as a version without the bound could write it: each service puts
/// its account A to `balance` (the record's size is the two puts' data together; each item holds only
/// its own), and holds the lock of A, expired, with the token its vote reports.
async fn old_record(env: &TestEnv, id: &str, status: Status, balance: i64, size: usize) -> TransactionRecord {
    let now = env.clock_now();
    let token = |i: usize| format!("{i:032}");
    let services: Vec<String> = env.participants.keys().cloned().collect();
    let put = |note: usize| {
        let op = json!({"op": "put", "key": {"entityId": "A"}, "data": {"balance": balance, "note": "n".repeat(note)}});
        twopc::model::Operation::parse(&op, "operation").unwrap()
    };
    let mut record = TransactionRecord {
        transaction_id: id.to_owned(),
        status,
        participants: services
            .iter()
            .enumerate()
            .map(|(i, s)| twopc::record::ParticipantEntry {
                service: s.clone(),
                operations: vec![put(0)],
                vote: (status == Status::Committing).then_some(twopc::model::Vote::Prepared),
                code: None,
                reason: None,
                read_only: false,
                lock_token: (status == Status::Committing).then(|| token(i)),
                service_code: None,
                blocked_by: None,
                unresolved_owner: None,
                never_ran: false,
                ended_without_vote: false,
            })
            .collect(),
        created_at: now - 60_000,
        updated_at: now - 60_000,
        deadline: now - 30_000,
        reason: None,
        request_hash: Some("0".repeat(64)),
        expire_at: None,
        open_shard: None,
        sweep_at: None,
        sweep_attempts: None,
        sweep_error: None,
        execution_id: Some("0".repeat(32)),
        principal: None,
        hold_ms: None,
        hold_until: None,
        started_at: None,
        attempt: None,
        first_transaction_id: None,
        retried_as: None,
        refused_for_contention: false,
        age_claimed_by: None,
        age_of: None,
        body_hash: Some("0".repeat(64)),
        audit: Vec::new(),
    }
    .opened();
    let short = item_size(&record.to_item());
    record.participants[1].operations[0] = put((size - short) / 2);
    let rest = size - item_size(&record.to_item());
    record.participants[0].operations[0] = put(rest);
    let item = record.to_item();
    assert_eq!(item_size(&item), size);
    env.client.put_item().table_name(env.transactions.table()).set_item(Some(item)).send().await.expect("put");
    for (i, service) in services.iter().enumerate() {
        let lock = AttributeValue::M(HashMap::from([
            ("transactionId".to_owned(), AttributeValue::S(id.to_owned())),
            ("status".to_owned(), AttributeValue::S("PREPARED".into())),
            ("expiresAt".to_owned(), AttributeValue::N(record.deadline.to_string())),
            ("startedAt".to_owned(), AttributeValue::N(record.created_at.to_string())),
            ("token".to_owned(), AttributeValue::S(token(i))),
        ]));
        env.client
            .update_item()
            .table_name(env.table(service))
            .key("entityId", AttributeValue::S("A".into()))
            .update_expression("SET #lock = :lock, lockShard = :shard, lockExpiresAt = :at")
            .expression_attribute_names("#lock", "lock")
            .expression_attribute_values(":lock", lock)
            .expression_attribute_values(":shard", AttributeValue::S(shard_of(id, "lock")))
            .expression_attribute_values(":at", AttributeValue::N(record.deadline.to_string()))
            .send()
            .await
            .expect("lock");
    }
    record
}

/// Records of about 400 KB written before records were bounded: every write that adds to them (the
/// abort's reason, the sweeper's error) is refused for size. A PREPARING one past its deadline still
/// ends ABORTED with its locks released; a COMMITTING one whose participant fails is still postponed
/// (its entry moves back in the index) and, once the participant answers, ends COMMITTED.
#[tokio::test]
async fn records_at_400_kb_written_before_the_bound_still_end() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "A", "100").await;
    let size = MAX_ITEM_BYTES - 8;
    old_record(&env, "tx-old-preparing", Status::Preparing, 105, size).await;

    let reports = env.sweep_until_quiet().await;

    assert_get_says(&env, "tx-old-preparing", "ABORTED").await;
    assert_no_locks(&env).await;
    assert_eq!(env.balance("service-a", "A").await, "100");
    assert!(reports.iter().all(|r| r.errors == 0), "{reports:?}");

    let old = old_record(&env, "tx-old-committing", Status::Committing, 105, size).await;
    let invoker = env.fresh_invoker();
    invoker.set("service-b", Action::Commit, EdgeFault::Fail);
    let coordinator = Coordinator::new(
        env.transactions.clone(),
        Arc::new(invoker.clone()),
        env.participants.keys().cloned(),
        env.clock.clone(),
    );
    let tables = env.participants.iter().map(|(s, p)| (s.clone(), p.table().clone())).collect();
    let sweeper = twopc::sweeper::Sweeper::new(coordinator, tables, twopc::sweeper::SweepLimits::default());
    let report = sweeper.sweep().await.expect("sweep");
    // Stuck, and (the lock of service-b being expired too) its roll-forward failed as well.
    assert_eq!((report.stuck, report.errors), (1, 2), "{report:?}");
    let record = env.transactions.get("tx-old-committing").await.unwrap().unwrap();
    assert!(record.sweep_at > old.sweep_at, "the entry moved back in the index: {:?}", record.sweep_at);
    // Postponed shortened: no error, no count of attempts (the full postponement did not fit).
    assert_eq!((record.sweep_attempts, record.sweep_error), (None, None));
    assert_eq!(env.balance("service-a", "A").await, "105", "service-a committed");

    invoker.clear();
    env.clock.advance(60_000);
    let report = sweeper.sweep().await.expect("sweep");
    assert_eq!(report.committed, 1, "{report:?}");
    assert_get_says(&env, "tx-old-committing", "COMMITTED").await;
    assert_eq!(env.balance("service-b", "A").await, "105");
    assert_no_locks(&env).await;
}

/// A decision DynamoDB refuses as invalid (as it refuses a record past 400 KB) is written again
/// shortened; refused even so, the abort is written over it, shortened too when its reason is refused;
/// and a shortened write whose reply is lost is recognised as the writer's own.
#[tokio::test]
async fn a_decision_refused_as_invalid_is_written_shortened_or_fenced() {
    let faults = DynamoFaults::new(0);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    let decision = || Rule::new(DynamoFault::Invalid).operation("UpdateItem").table(env.transactions.table());
    let rounds: [(&str, Vec<Rule>, u16); 3] = [
        ("shortened", vec![decision().body_contains("\"COMMITTING\"").nth(1)], 200),
        (
            "shortened, its reply lost",
            vec![
                decision().body_contains("\"COMMITTING\"").nth(1),
                Rule::new(DynamoFault::LoseReply)
                    .operation("UpdateItem")
                    .table(env.transactions.table())
                    .body_contains("\"COMMITTING\"")
                    .nth(1),
            ],
            200,
        ),
        (
            "fenced, shortened",
            vec![
                decision().body_contains("\"COMMITTING\""),
                decision().body_contains("the decision could not be recorded"),
            ],
            409,
        ),
    ];
    for (round, (name, rules, expected)) in rounds.into_iter().enumerate() {
        let (from, to) = (format!("A{round}"), format!("B{round}"));
        env.put_account("service-a", &from, "100").await;
        env.put_account("service-b", &to, "0").await;
        for rule in rules {
            faults.add(rule);
        }
        let body = TestEnv::transfer(("service-a", &from), ("service-b", &to), "10");
        let (status, answer) = env.post(&body, Some(&format!("invalid-{round}"))).await;
        faults.clear();
        assert_eq!(status, expected, "{name}: {answer}");
        let id = answer["transactionId"].as_str().unwrap();
        let (moved, body_status) = if expected == 200 { ("90", "COMMITTED") } else { ("100", "ABORTED") };
        let got = assert_get_says(&env, id, body_status).await;
        if expected == 409 {
            // The shortened abort keeps no reason; the answer still gives one, as the contract wants.
            assert_eq!(got["reason"], twopc::record::SHORTENED_REASON, "{name}");
            assert_eq!(answer["reason"], twopc::record::SHORTENED_REASON, "{name}");
        }
        assert_eq!(env.balance("service-a", &from).await, moved, "{name}");
        assert_no_locks(&env).await;
    }
    // Unkeyed: the COMMITTING record is the first write; refused as invalid, the ABORTED one is created.
    env.put_account("service-a", "A9", "100").await;
    env.put_account("service-b", "B9", "0").await;
    faults.add(Rule::new(DynamoFault::Invalid).operation("PutItem").body_contains("\"COMMITTING\""));
    let (status, answer) = env.post(&TestEnv::transfer(("service-a", "A9"), ("service-b", "B9"), "10"), None).await;
    faults.clear();
    assert_eq!(status, 409, "{answer}");
    assert_get_says(&env, answer["transactionId"].as_str().unwrap(), "ABORTED").await;
    assert_eq!(env.balance("service-a", "A9").await, "100");
    assert_no_locks(&env).await;
}

/// A long answer in a failure message, cut for reading.
fn shorten(answer: &Value) -> String {
    let text = answer.to_string();
    if text.len() > 600 { format!("{}…", &text[..600]) } else { text }
}
