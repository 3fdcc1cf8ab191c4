//! What the hot-item tests share (`tests/tests/contention.rs`, `tests/tests/retries.rs`): an older
//! transaction holding an item, its abort, raw participant messages, and the waits for a refusal.

use std::time::Duration;

use serde_json::{Value, json};
use twopc::model::{ParticipantRequest, Vote};

use crate::{FaultyInvoker, TestEnv};

pub fn a(id: &str) -> (&'static str, &str) {
    ("service-a", id)
}
pub fn b(id: &str) -> (&'static str, &str) {
    ("service-b", id)
}

pub fn message(value: Value) -> ParticipantRequest {
    serde_json::from_value(value).expect("a participant message")
}

pub async fn assert_no_locks(env: &TestEnv) {
    let locked = env.locked_items().await;
    assert!(locked.is_empty(), "locks left: {locked:#?}");
}

/// Takes 1 from item `id` of service-a: the operations of the raw participant messages below.
pub fn debit(id: &str) -> Value {
    json!([{"op": "add", "key": {"entityId": id}, "field": "balance", "delta": -1}])
}

/// A prepare of [`debit`] for `tx` at service-a, signed, as its own coordinator would send it.
pub fn raw_prepare(env: &TestEnv, tx: &str, id: &str, deadline: u64, started_at: u64) -> ParticipantRequest {
    env.signed(
        "service-a",
        message(json!({"action": "prepare", "transactionId": tx, "deadline": deadline, "startedAt": started_at,
            "operations": debit(id)})),
    )
}

/// A transaction older than anything the test submits, holding item `id` of service-a.
pub async fn older_holder(env: &TestEnv, tx: &str, id: &str) {
    let now = env.clock_now();
    let prepare = raw_prepare(env, tx, id, now + 20_000, now - 60_000);
    let vote = env.participants["service-a"].handle(&prepare).await.unwrap();
    assert_eq!(vote.vote, Some(Vote::Prepared), "{vote:?}");
}

/// A = 100 on service-a, held by `tx-older` (older than anything the test submits), and B = 0 on service-b.
pub async fn a_held_by_an_older_transaction(env: &TestEnv) {
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    older_holder(env, "tx-older", "A").await;
}

/// The older holder decided abort, as its coordinator would: its record, then its lock released.
pub async fn abort_holder(env: &TestEnv, tx: &str, id: &str) {
    env.transactions.abort_if_absent(tx, env.clock_now(), "aborted by the test").await.unwrap();
    let abort =
        env.signed("service-a", message(json!({"action": "abort", "transactionId": tx, "operations": debit(id)})));
    env.participants["service-a"].handle(&abort).await.unwrap();
}

/// Until a prepare sent through `invoker` was refused CONFLICT.
pub async fn refused_once(invoker: &FaultyInvoker) {
    while !invoker.calls().iter().any(|c| c.answer == "REFUSED:CONFLICT") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
