//! Trust boundaries (issue 42): a participant applies at commit, and at every roll-forward, exactly what
//! it voted for at prepare, whatever a later record or message says. Against DynamoDB Local.

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::json;
use twopc::model::{Status, Vote};
use twopc_client::{Transaction, op};
use twopc_tests::TestEnv;
use twopc_tests::contention::message;

const ALICE: &str = "arn:aws:iam::123456789012:user/alice";

/// A = 100 (service-a), B = 0 (service-b).
async fn world() -> TestEnv {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    env
}

/// Posts a transfer of 30 from A to B held for a minute, as ALICE: its id, PREPARED.
async fn held_transfer(env: &TestEnv) -> String {
    let mut body = Transaction::new()
        .participant("service-a", [op::add("A", "balance", -30).min(0)])
        .participant("service-b", [op::add("B", "balance", 30)])
        .to_json();
    body["holdMs"] = json!(60_000);
    let mut event = twopc_tests::rest_event(
        "POST",
        "/transactions",
        "/transactions",
        None,
        json!({"content-type": "application/json"}),
        Some(&body.to_string()),
    );
    event["requestContext"]["identity"]["userArn"] = json!(ALICE);
    let (status, answer) = env.call(&event).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("PREPARED")), "{answer}");
    answer["transactionId"].as_str().unwrap().to_owned()
}

/// The record's operations rewritten as a participant's operator could (straight to the table): every
/// `add`'s delta times 1000; with `status`, the status too; with `drop_b`, B taken off service-b's list.
async fn rewrite_record(env: &TestEnv, id: &str, status: Option<Status>, drop_b: bool) {
    let mut record = env.transactions.get(id).await.unwrap().expect("record");
    for entry in &mut record.participants {
        for op in &mut entry.operations {
            let mut json = op.to_json();
            let delta: f64 = json["delta"].as_f64().expect("an add");
            json["delta"] = json!(delta * 1000.0);
            *op = twopc::model::Operation::parse(&json, "operation").expect("an add");
        }
        if drop_b && entry.service == "service-b" {
            entry.operations.clear();
        }
    }
    if let Some(status) = status {
        record.status = status;
    }
    env.client
        .put_item()
        .table_name(env.transactions.table())
        .set_item(Some(record.to_item()))
        .send()
        .await
        .expect("put");
}

/// Whether `id`'s record says it was decided abort.
async fn aborted(env: &TestEnv, id: &str) -> bool {
    let record = env.transactions.get(id).await.unwrap().expect("record");
    matches!(record.status, Status::Aborting | Status::Aborted)
}

#[tokio::test]
async fn a_commit_applies_what_was_voted_not_what_the_record_says_later() {
    let env = world().await;
    let id = held_transfer(&env).await;
    rewrite_record(&env, &id, None, false).await;

    let mut event = twopc_tests::decision_event(&id, "commit");
    event["requestContext"]["identity"]["userArn"] = json!(ALICE);
    let (status, answer) = env.call(&event).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_eq!(env.balance("service-a", "A").await, "70");
    assert_eq!(env.balance("service-b", "B").await, "30");
    assert!(env.locked_items().await.is_empty());
}

#[tokio::test]
async fn a_commit_message_naming_other_operations_applies_the_voted_ones() {
    let env = world().await;
    let id = held_transfer(&env).await;
    let token = env.transactions.get(&id).await.unwrap().unwrap().participants[1].lock_token.clone();

    // Signed like the coordinator's, but naming another field, another delta, another kind of operation.
    for (i, operations) in [
        json!([{"op": "add", "key": {"entityId": "B"}, "field": "balance", "delta": 30000}]),
        json!([{"op": "add", "key": {"entityId": "B"}, "field": "other", "delta": 30}]),
        json!([{"op": "set", "key": {"entityId": "B"}, "set": {"balance": 1000000}}]),
        json!([{"op": "delete", "key": {"entityId": "B"}}]),
        json!([{"op": "check", "key": {"entityId": "B"}}]),
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            // Each case on a fresh lock of its own transaction: the last one committed B.
            env.put_account("service-b", "B", "0").await;
        }
        let (tx, token) = if i == 0 { (id.clone(), token.clone()) } else { prepared_credit(&env, i).await };
        let mut commit = json!({"action": "commit", "transactionId": tx, "operations": operations});
        if let Some(token) = &token {
            commit["lockToken"] = json!(token);
        }
        let reply = env.participants["service-b"].handle(&env.signed("service-b", message(commit))).await.unwrap();
        assert_eq!(reply.status.as_deref(), Some("COMMITTED"), "case {i}: {reply:?}");
        let item = env.item("service-b", "B").await.expect("B is still there");
        assert_eq!(env.balance("service-b", "B").await, "30", "case {i}: {item}");
        assert!(item.get("lock").is_none() && item["data"].get("other").is_none(), "case {i}: {item}");
    }
}

/// A prepare of a credit of 30 to B at service-b, for a transaction of its own: its id and the voted token.
async fn prepared_credit(env: &TestEnv, n: usize) -> (String, Option<String>) {
    let tx = format!("tx-voted-{n}");
    let now = env.clock_now();
    let prepare = message(json!({"action": "prepare", "transactionId": tx, "deadline": now + 20_000,
        "operations": [{"op": "add", "key": {"entityId": "B"}, "field": "balance", "delta": 30}]}));
    let vote = env.participants["service-b"].handle(&env.signed("service-b", prepare)).await.unwrap();
    assert_eq!(vote.vote, Some(Vote::Prepared), "{vote:?}");
    (tx, vote.lock_token)
}

#[tokio::test]
async fn a_roll_forward_applies_what_was_voted_even_for_an_item_the_record_no_longer_lists() {
    let env = world().await;
    let id = held_transfer(&env).await;
    // Decided commit, its operations rewritten and B taken off service-b's list.
    rewrite_record(&env, &id, Some(Status::Committing), true).await;
    // Past the locks' expiry: the next transaction on A and B resolves them (rolls them forward).
    let hold_until = env.transactions.get(&id).await.unwrap().unwrap().hold_until.expect("held");
    env.clock.advance(hold_until + 2 * twopc::clock::CLOCK_MARGIN_MS + 1 - env.clock_now());

    let (status, answer) = env.post(&TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "1"), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_eq!(env.balance("service-a", "A").await, "69");
    assert_eq!(env.balance("service-b", "B").await, "31");
    // (The record itself stays COMMITTING: a commit message with no operations is refused as invalid. Only a
    // role that can rewrite records could do that, and none but the coordinator's and the sweeper's can.)
    assert!(env.locked_items().await.is_empty(), "{:?}", env.locked_items().await);
}

#[tokio::test]
async fn a_lock_taken_before_the_upgrade_commits_what_its_message_says() {
    let env = world().await;
    let id = held_transfer(&env).await;
    // A lock as a participant before issue 42 wrote it: no voted operation beside it.
    for (service, key) in [("service-a", "A"), ("service-b", "B")] {
        env.client
            .update_item()
            .table_name(env.table(service))
            .key("entityId", AttributeValue::S(key.to_owned()))
            .update_expression("REMOVE #lock.#op")
            .expression_attribute_names("#lock", "lock")
            .expression_attribute_names("#op", "op")
            .send()
            .await
            .expect("update");
    }
    let mut event = twopc_tests::decision_event(&id, "commit");
    event["requestContext"]["identity"]["userArn"] = json!(ALICE);
    let (status, answer) = env.call(&event).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_eq!(env.balance("service-a", "A").await, "70");
    assert_eq!(env.balance("service-b", "B").await, "30");
}

/// A prepare of a debit of 1 from A at service-a for `tx`, signed as its coordinator would send it.
fn prepare_on_a(env: &TestEnv, tx: &str) -> twopc::model::ParticipantRequest {
    let now = env.clock_now();
    env.signed(
        "service-a",
        message(json!({"action": "prepare", "transactionId": tx, "deadline": now + 20_000, "startedAt": now,
            "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": -1}]})),
    )
}

/// Moves the world's clock past `expiry` and twice the clock margin: resolvers may act on it.
fn past(env: &TestEnv, expiry: u64) {
    let now = env.clock_now();
    let due = expiry + 2 * twopc::clock::CLOCK_MARGIN_MS + 1;
    env.clock.advance(due.saturating_sub(now));
}

#[tokio::test]
async fn a_participant_refuses_an_expired_owner_instead_of_deciding_it_and_the_coordinator_decides() {
    let env = world().await;
    let id = held_transfer(&env).await;
    let hold_until = env.transactions.get(&id).await.unwrap().unwrap().hold_until.expect("held");
    past(&env, hold_until);

    // The participant only reads: it names the owner and writes nothing to the record.
    let vote = env.participants["service-a"].handle(&prepare_on_a(&env, "tx-next")).await.unwrap();
    assert_eq!((vote.vote, vote.unresolved_owner.as_deref()), (Some(Vote::Refused), Some(id.as_str())), "{vote:?}");
    assert_eq!(env.transactions.get(&id).await.unwrap().unwrap().status, Status::Prepared, "the record is untouched");

    // Through the coordinator, which may decide: the expired hold is aborted, the new transfer commits.
    let (status, answer) = env.post(&TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "1"), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert!(aborted(&env, &id).await, "the hold was aborted");
    assert_eq!(env.balance("service-a", "A").await, "99");
    env.sweep_until_quiet().await;
    assert!(env.locked_items().await.is_empty(), "{:?}", env.locked_items().await);
}

#[tokio::test]
async fn a_one_phase_commit_meeting_an_expired_owner_is_resolved_by_the_coordinator() {
    let env = world().await;
    let id = held_transfer(&env).await;
    let hold_until = env.transactions.get(&id).await.unwrap().unwrap().hold_until.expect("held");
    past(&env, hold_until);

    let body = Transaction::new().participant("service-a", [op::add("A", "balance", -1).min(0)]).to_json();
    let (status, answer) = env.post(&body, None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert!(aborted(&env, &id).await, "the hold was aborted");
    assert_eq!(env.balance("service-a", "A").await, "99");
}

#[tokio::test]
async fn an_owner_with_no_record_is_left_to_the_sweeper_which_reads_the_lock() {
    let env = world().await;
    // A lock whose owner never wrote a record (its coordinator stopped before it could).
    let vote = env.participants["service-a"].handle(&prepare_on_a(&env, "tx-ghost")).await.unwrap();
    assert_eq!(vote.vote, Some(Vote::Prepared), "{vote:?}");
    past(&env, env.clock_now() + 20_000);

    let vote = env.participants["service-a"].handle(&prepare_on_a(&env, "tx-next")).await.unwrap();
    assert_eq!((vote.vote, vote.unresolved_owner.as_deref()), (Some(Vote::Refused), Some("tx-ghost")), "{vote:?}");
    assert!(env.raw_record("tx-ghost").await.is_none(), "a participant writes no record");

    // Through the coordinator: it cannot resolve an owner with no record, and a retry could not wait it
    // out: the refusal is the answer at once, not a burst of attempts.
    let (status, answer) = env.post(&TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "1"), None).await;
    assert_eq!((status, answer["participants"][0]["code"].as_str()), (409, Some("CONFLICT")), "{answer}");
    assert!(answer.get("attempts").is_none(), "one attempt: {answer}");
    assert!(env.raw_record("tx-ghost").await.is_none(), "nor does the coordinator, on a participant's word");

    env.sweep_until_quiet().await;
    assert!(aborted(&env, "tx-ghost").await);
    assert!(env.locked_items().await.is_empty(), "{:?}", env.locked_items().await);
}

#[tokio::test]
async fn a_one_phase_record_is_written_under_its_services_prefix() {
    let env = world().await;
    let body = Transaction::new().participant("service-a", [op::add("A", "balance", -1).min(0)]).to_json();
    let (status, answer) = env.post(&body, None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    let id = answer["transactionId"].as_str().unwrap();
    assert!(id.starts_with("1p~service-a~tx-"), "{id}");
    assert_eq!(env.get(id).await.0, 200);

    // Keyed: the same key and body answer the same.
    let (status, first) = env.post(&body, Some("key-1")).await;
    assert_eq!(status, 200, "{first}");
    let (status, again) = env.post(&body, Some("key-1")).await;
    assert_eq!((status, &again["transactionId"]), (200, &first["transactionId"]), "{again}");
    assert_eq!(env.balance("service-a", "A").await, "98");

    // A key whose one-phase run was recorded before the prefix, under the key's plain id, is found there.
    let (status, legacy) = env.post(&body, Some("key-2")).await;
    assert_eq!(status, 200, "{legacy}");
    let scoped = legacy["transactionId"].as_str().unwrap();
    let plain = scoped.strip_prefix("1p~service-a~").expect("a one-phase id");
    let mut record = env.transactions.get(scoped).await.unwrap().unwrap();
    record.transaction_id = plain.to_owned();
    env.client.put_item().table_name(env.transactions.table()).set_item(Some(record.to_item())).send().await.unwrap();
    env.client
        .delete_item()
        .table_name(env.transactions.table())
        .key("transactionId", AttributeValue::S(scoped.to_owned()))
        .send()
        .await
        .unwrap();
    let (status, replayed) = env.post(&body, Some("key-2")).await;
    assert_eq!((status, replayed["transactionId"].as_str()), (200, Some(plain)), "{replayed}");
    assert_eq!(env.balance("service-a", "A").await, "97", "applied once");
}

/// Sets the `lock.op` of `key`'s lock at `service` to `value`, as another version of the code might keep it.
async fn set_kept_vote(env: &TestEnv, service: &str, key: &str, value: AttributeValue) {
    env.client
        .update_item()
        .table_name(env.table(service))
        .key("entityId", AttributeValue::S(key.to_owned()))
        .update_expression("SET #lock.#op = :v")
        .expression_attribute_names("#lock", "lock")
        .expression_attribute_names("#op", "op")
        .expression_attribute_values(":v", value)
        .send()
        .await
        .expect("update");
}

async fn commit_as_alice(env: &TestEnv, id: &str) -> (u16, serde_json::Value) {
    let mut event = twopc_tests::decision_event(id, "commit");
    event["requestContext"]["identity"]["userArn"] = json!(ALICE);
    env.call(&event).await
}

#[tokio::test]
async fn a_vote_kept_in_another_form_is_applied_not_released_as_a_stray() {
    let env = world().await;
    let id = held_transfer(&env).await;
    // The same vote, its fields in another order (as another version of the code might write them).
    set_kept_vote(&env, "service-b", "B", AttributeValue::S(r#"{"delta":"30","field":"balance","op":"add"}"#.into()))
        .await;
    let (status, answer) = commit_as_alice(&env, &id).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_eq!(env.balance("service-b", "B").await, "30", "applied, not released unapplied");
    assert!(env.locked_items().await.is_empty());
}

#[tokio::test]
async fn a_vote_that_cannot_be_read_leaves_the_commit_open_instead_of_ending_it_unapplied() {
    let env = world().await;
    let id = held_transfer(&env).await;
    set_kept_vote(&env, "service-b", "B", AttributeValue::N("1".into())).await;
    commit_as_alice(&env, &id).await;
    // Not COMMITTED with B unapplied: still COMMITTING, B's lock kept for an operator (and the sweeper).
    let record = env.transactions.get(&id).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Committing, "{record:?}");
    assert_eq!(env.balance("service-b", "B").await, "0");
    assert!(env.item("service-b", "B").await.unwrap().get("lock").is_some(), "the lock stays");
}

#[tokio::test]
async fn the_largest_set_validation_accepts_commits_in_two_phases() {
    let env = world().await;
    let body = |n: usize| {
        let fields: serde_json::Map<String, serde_json::Value> =
            (0..n).map(|i| (format!("f{i:03}"), json!(i))).collect();
        json!({"participants": [
            {"service": "service-a", "operations": [{"op": "set", "key": {"entityId": "A"}, "set": fields}]},
            {"service": "service-b", "operations": [{"op": "add", "key": {"entityId": "B"}, "field": "balance", "delta": 1}]}]})
    };
    let accepted = |n: usize| twopc::coordinator::parse_request(body(n).to_string().as_bytes(), |_| true).is_ok();
    let largest = (1..1_000).take_while(|&n| accepted(n)).last().expect("some set is accepted");
    assert!(largest < 999, "validation bounds a set's fields");
    let (status, answer) = env.post(&body(largest), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{largest} fields: {answer}");
    let a = env.item("service-a", "A").await.unwrap();
    assert_eq!(a["data"][format!("f{:03}", largest - 1)], json!(largest - 1), "every field written");
    assert!(env.locked_items().await.is_empty());
}
