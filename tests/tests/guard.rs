//! Issue 45, step 5: every message passes one guard before either branch (the service's items, or its
//! resource) acts on it. Checked on both branches alike: a message the coordinator or the sweeper did not
//! sign is refused with nothing read or written; a prepare or a one-phase commit that arrives past its
//! cutoff is answered TIMEOUT, in the same words, with no lock, no barrier entry, no call to the
//! resource and no record; a second-phase message has no cutoff and is still carried out.

use serde_json::{Value, json};
use twopc::clock::CLOCK_MARGIN_MS;
use twopc::model::{Action, ParticipantRequest, RefusalCode, Vote};
use twopc::participant::ParticipantError;
use twopc_tests::TestEnv;

const CARD: &str = "4242424242424242";

async fn world() -> TestEnv {
    let env = TestEnv::with_services(&["service-a", "payments"]).await;
    env.put_account("service-a", "A", "100").await;
    env
}

fn debit() -> Value {
    json!({"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": -10, "min": 0})
}

/// An unsigned message of `action` to `service` with `operations`, its deadline `deadline`.
fn message(action: Action, tx: &str, operations: Vec<Value>, deadline: u64) -> ParticipantRequest {
    ParticipantRequest {
        operations,
        deadline: Some(deadline),
        started_at: Some(deadline - 1_000),
        ..ParticipantRequest::new(action, tx)
    }
}

/// A deadline whose cutoff (the deadline and the clock margin) passed a second ago.
fn passed(env: &TestEnv) -> u64 {
    env.clock_now() - CLOCK_MARGIN_MS - 1_000
}

async fn barrier_entry(env: &TestEnv, tx: &str) -> Option<Value> {
    env.item("payments", &format!("barrier#{tx}")).await
}

fn payment_calls(env: &TestEnv) -> usize {
    env.payment_api.as_deref().expect("the payments service's API").calls().len()
}

#[tokio::test]
async fn a_late_prepare_is_answered_timeout_by_the_guard_on_both_branches_and_nothing_is_written() {
    let env = world().await;
    let late = passed(&env);
    let items = env.signed("service-a", message(Action::Prepare, "tx-late-items", vec![debit()], late));
    let charge = payments::charge("late", CARD, 100);
    let resource = env.signed("payments", message(Action::Prepare, "tx-late-resource", vec![charge], late));

    let on_items = env.participants["service-a"].handle(&items).await.expect("an answer");
    let on_resource = env.participants["payments"].handle(&resource).await.expect("an answer");

    for answer in [&on_items, &on_resource] {
        assert_eq!((answer.vote, answer.code), (Some(Vote::Refused), Some(RefusalCode::Timeout)), "{answer:?}");
        let reason = answer.reason.as_deref().unwrap_or_default();
        assert!(reason.starts_with("the prepare arrived after the deadline: "), "one set of words: {reason}");
    }
    assert!(env.locked_items().await.is_empty(), "no lock");
    assert_eq!(barrier_entry(&env, "tx-late-resource").await, None, "no barrier entry");
    assert_eq!(payment_calls(&env), 0, "the resource was not called");
}

#[tokio::test]
async fn a_late_one_phase_commit_is_answered_timeout_and_creates_no_record() {
    let env = world().await;
    let tx = "tx-late-one-phase";
    let record = json!({"transactionId": tx, "status": "COMMITTED"});
    let one_phase = ParticipantRequest {
        one_phase_record: Some(record),
        ..message(Action::Commit, tx, vec![debit()], passed(&env))
    };

    let answer = env.participants["service-a"].handle(&env.signed("service-a", one_phase)).await.expect("an answer");

    assert_eq!((answer.vote, answer.code), (Some(Vote::Refused), Some(RefusalCode::Timeout)), "{answer:?}");
    assert!(
        answer.reason.as_deref().unwrap_or_default().starts_with("the one-phase commit arrived after the deadline")
    );
    assert!(env.transactions.get(tx).await.unwrap().is_none(), "no record");
    assert_eq!(env.item("service-a", "A").await.unwrap()["data"]["balance"], json!(100), "nothing applied");
}

/// The second phase has no cutoff: an abort long after the deadline still releases, on either branch.
#[tokio::test]
async fn a_late_abort_passes_the_guard_on_both_branches() {
    let env = world().await;
    let deadline = env.clock_now() + 5_000;
    let prepare = env.signed("service-a", message(Action::Prepare, "tx-abort-late", vec![debit()], deadline));
    let vote = env.participants["service-a"].handle(&prepare).await.expect("an answer");
    assert_eq!(vote.vote, Some(Vote::Prepared), "{vote:?}");
    assert_eq!(env.locked_items().await.len(), 1);

    let late = passed(&env);
    let items = env.signed("service-a", message(Action::Abort, "tx-abort-late", vec![debit()], late));
    let charge = payments::charge("abort-late", CARD, 100);
    let resource = env.signed("payments", message(Action::Abort, "tx-abort-late-resource", vec![charge], late));
    let on_items = env.participants["service-a"].handle(&items).await.expect("an answer");
    let on_resource = env.participants["payments"].handle(&resource).await.expect("an answer");

    assert_eq!(on_items.status.as_deref(), Some("ABORTED"), "{on_items:?}");
    assert_eq!(on_resource.status.as_deref(), Some("ABORTED"), "{on_resource:?}");
    assert!(env.locked_items().await.is_empty(), "the lock was released");
    let entry = barrier_entry(&env, "tx-abort-late-resource").await.expect("the empty rollback's entry");
    assert_eq!(
        (&entry["barrier"]["state"], &entry["barrier"]["emptyRollback"]),
        (&json!("CANCELLED"), &json!(true)),
        "{entry}"
    );
}

/// A message nobody signed is refused before either branch reads or writes anything.
#[tokio::test]
async fn an_unsigned_message_reaches_neither_branch() {
    let env = world().await;
    let deadline = env.clock_now() + 5_000;
    let charge = payments::charge("unsigned", CARD, 100);
    for (service, operations) in [("service-a", vec![debit()]), ("payments", vec![charge])] {
        let unsigned = message(Action::Prepare, &format!("tx-unsigned-{service}"), operations, deadline);
        let refused = env.participants[service].handle(&unsigned).await;
        assert!(matches!(refused, Err(ParticipantError::Unauthenticated(_))), "{service}: {refused:?}");
    }
    assert!(env.locked_items().await.is_empty());
    assert_eq!(barrier_entry(&env, "tx-unsigned-payments").await, None);
    assert_eq!(payment_calls(&env), 0);
}

/// What a branch cannot take at all is refused as such, late or not (the order of the checks before the
/// guard): a key that does not fit the table, a built-in operation sent to a resource, a one-phase commit
/// to a resource, are INVALID even past the cutoff.
#[tokio::test]
async fn what_a_branch_cannot_take_is_refused_invalid_even_when_late() {
    let env = world().await;
    let late = passed(&env);
    let wrong_key = json!({"op": "add", "key": {"sku": "A"}, "field": "balance", "delta": -10});
    let one_phase = |tx: &str, operations: Vec<Value>| ParticipantRequest {
        one_phase_record: Some(json!({"transactionId": tx, "status": "COMMITTED"})),
        ..message(Action::Commit, tx, operations, late)
    };
    let charge = payments::charge("late-one-phase", CARD, 100);
    let cases = [
        ("service-a", message(Action::Prepare, "tx-wrong-key", vec![wrong_key.clone()], late)),
        ("service-a", one_phase("tx-wrong-key-one-phase", vec![wrong_key])),
        ("payments", message(Action::Prepare, "tx-built-in-to-resource", vec![debit()], late)),
        ("payments", one_phase("tx-one-phase-to-resource", vec![charge])),
    ];
    for (service, request) in cases {
        let tx = request.transaction_id.clone();
        let answer = env.participants[service].handle(&env.signed(service, request)).await.expect("an answer");
        assert_eq!((answer.vote, answer.code), (Some(Vote::Refused), Some(RefusalCode::Invalid)), "{tx}: {answer:?}");
    }
    assert!(env.locked_items().await.is_empty());
    assert_eq!(payment_calls(&env), 0);
}
