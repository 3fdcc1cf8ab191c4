//! Issue 29: participants accept only the coordinator's and the sweeper's messages. Against DynamoDB
//! Local, through `Participant::handle` (the one entry the Lambda handler, the local stack and the tests
//! all use): unsigned, wrongly signed, replayed-from-another-transaction and stale messages of every
//! action change nothing; the attacks an account's other principals could make before change nothing;
//! keys rotate without a refused message.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use twopc::auth::{CachedKeys, Key, KeySet, KeySource, LocalKeys, MemoryKeys};
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::{ParticipantRequest, ParticipantResponse};
use twopc::participant::{Participant, ParticipantError};
use twopc_tests::{TestEnv, call_coordinator, rest_event};

fn message(value: Value) -> ParticipantRequest {
    serde_json::from_value(value).expect("a participant message")
}

async fn post_via(coordinator: &twopc::coordinator::Coordinator, body: &Value) -> (u16, Value) {
    let event = rest_event("POST", "/transactions", "/transactions", None, json!({}), Some(&body.to_string()));
    call_coordinator(coordinator, &event).await
}

/// Everything a participant's table holds, to tell that a refused message changed nothing.
async fn tables(env: &TestEnv) -> Vec<Value> {
    let mut all = vec![];
    for participant in env.participants.values() {
        let mut items: Vec<Value> = env
            .scan(participant.table().name())
            .await
            .iter()
            .map(|i| Value::Object(twopc::attr::item_to_json(i)))
            .collect();
        items.sort_by_key(|i| i["entityId"].to_string());
        all.extend(items);
    }
    all.extend(env.records().await);
    all
}

fn refused(answer: &Result<ParticipantResponse, ParticipantError>) -> bool {
    matches!(answer, Err(ParticipantError::Unauthenticated(_)))
}

/// A transfer of 10 from A to B is prepared (its coordinator stopped after the prepares): both items hold
/// its locks. Before, any principal allowed to invoke a participant could then: commit A without the lock
/// token with its own operation (+1000 landed on a lock taken for -10); abort B although the record says
/// COMMITTING; commit in one phase with a record that says ABORTED. Now every such message, and every
/// other forgery, is refused before anything is done, for every action.
#[tokio::test]
async fn forged_and_stale_messages_of_every_action_change_nothing() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    let stopped = env.coordinator_with(&env.fresh_invoker(), Faults::crash_at(CoordinatorCrash::AfterPrepares(2)));
    let (status, answer) = post_via(&stopped, &TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "10")).await;
    assert_eq!(status, 500, "{answer}");
    let tx = answer["transactionId"].as_str().unwrap().to_owned();
    let before = tables(&env).await;
    let a = &env.participants["service-a"];
    let now = env.clock_now();
    let add = |delta: i64| json!([{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": delta}]);

    let commit_plus_1000 = message(json!({"action": "commit", "transactionId": tx, "operations": add(1000)}));
    let abort = message(json!({"action": "abort", "transactionId": tx, "operations": add(-10)}));
    let prepare = message(json!({"action": "prepare", "transactionId": "tx-forged", "deadline": now + 10_000,
        "startedAt": now, "operations": add(-50)}));
    let record = json!({"transactionId": "tx-one", "status": "ABORTED", "participants": [], "createdAt": now,
        "updatedAt": now, "deadline": now + 10_000});
    let one_phase = message(json!({"action": "commit", "transactionId": "tx-one", "deadline": now + 10_000,
        "startedAt": now, "operations": add(1000), "onePhaseRecord": record}));
    let another_key = KeySet::single("local", &"k".repeat(32));
    for message in [commit_plus_1000, abort, prepare, one_phase] {
        let action =
            format!("{:?}{}", message.action, if message.one_phase_record.is_some() { " (one phase)" } else { "" });
        // Unsigned.
        assert!(refused(&a.handle(&message).await), "{action}: unsigned");
        // Signed with a key that is not service-a's (another service's, or one of nobody's).
        let for_b = env.signed("service-b", message.clone());
        assert!(refused(&a.handle(&for_b).await), "{action}: signed for service-b");
        let foreign = twopc::auth::sign_with(&another_key, "service-a", &message, now).unwrap();
        assert!(refused(&a.handle(&foreign).await), "{action}: another key");
        // A genuine signature, moved to another transaction.
        let mut moved = env.signed("service-a", message.clone());
        moved.transaction_id = "tx-elsewhere".into();
        assert!(refused(&a.handle(&moved).await), "{action}: replayed for another transaction");
        // Stale: signed longer ago than a copy may arrive.
        let old = now - twopc::auth::MAX_MESSAGE_AGE_MS - twopc::clock::CLOCK_MARGIN_MS - 1_000;
        let stale = twopc::auth::sign_with(&LocalKeys::key_set("service-a"), "service-a", &message, old).unwrap();
        assert!(refused(&a.handle(&stale).await), "{action}: stale");
        assert_eq!(tables(&env).await, before, "{action}: a refused message changed nothing");
    }

    // The coordinator's own messages still go through: the sweeper finishes the transfer, once.
    env.clock.advance(60_000);
    env.sweep_until_quiet().await;
    assert_eq!(env.balance("service-a", "A").await, "100", "the unrecorded transfer was aborted");
    assert_eq!(env.get(&tx).await.1["status"], "ABORTED");
    assert!(env.locked_items().await.is_empty());
}

/// A participant with a cached copy of the keys (the deployed setting) and a coordinator with its own:
/// a new key added with `notBefore` one cache TTL ahead is in every cache before anyone signs with it,
/// and the old one is removed once every signer has moved on. Transfers run the whole time: none is
/// refused. Added to be used at once instead, the new key is refused by a participant whose cache still
/// has only the old one: that is why the wait.
#[tokio::test]
async fn keys_rotate_without_a_refused_message() {
    let env = TestEnv::new().await;
    let store = MemoryKeys::new();
    let first = Key { id: "k1".into(), secret: "first key of the test".into(), not_before: 0 };
    for service in ["service-a", "service-b"] {
        store.set(service, KeySet { keys: vec![first.clone()] });
    }
    let ttl = Duration::from_millis(400);
    let cached = || -> Arc<dyn KeySource> { Arc::new(CachedKeys::new(store.clone(), ttl)) };
    let participants: Vec<Participant> = env.participants.values().map(|p| p.clone().with_keys(cached())).collect();
    let invoker = twopc_tests::FaultyInvoker::new(twopc::invoke::InProcessInvoker::new(participants));
    let coordinator = env.coordinator_with(&invoker, Faults::default()).with_keys(cached());
    env.put_account("service-a", "A", "1000").await;
    env.put_account("service-b", "B", "0").await;
    let transfer = TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "1");
    let mut committed = 0;
    let mut transfer_for = |until: Instant| {
        let (coordinator, transfer) = (coordinator.clone(), transfer.clone());
        async move {
            let mut done = 0;
            while Instant::now() < until {
                let (status, answer) = post_via(&coordinator, &transfer).await;
                assert_eq!(status, 200, "every transfer commits during the rotation: {answer}");
                done += 1;
            }
            done
        }
    };
    // Warm every cache with k1 alone.
    committed += transfer_for(Instant::now() + ttl / 2).await;
    // Rotate: k2 signs from one TTL (and a margin) from now; meanwhile everyone learns it.
    let second = Key {
        id: "k2".into(),
        secret: "second key of the test".into(),
        not_before: env.clock_now() + ttl.as_millis() as u64 + 100,
    };
    for service in ["service-a", "service-b"] {
        store.set(service, KeySet { keys: vec![first.clone(), second.clone()] });
    }
    committed += transfer_for(Instant::now() + ttl * 3).await;
    // Every signer signs with k2 now: k1 goes.
    for service in ["service-a", "service-b"] {
        store.set(service, KeySet { keys: vec![second.clone()] });
    }
    committed += transfer_for(Instant::now() + ttl * 2).await;
    assert_eq!(env.balance("service-b", "B").await, committed.to_string());

    // Rotated without the wait: a participant whose cache still holds only k2 refuses k3 for up to a TTL.
    let participant = env.participants["service-a"].clone().with_keys(cached());
    let probe = message(json!({"action": "abort", "transactionId": "tx-probe",
        "operations": [{"op": "delete", "key": {"entityId": "nothing"}}]}));
    let now = env.clock_now();
    let signed = |set: &KeySet| twopc::auth::sign_with(set, "service-a", &probe, now).unwrap();
    assert!(participant.handle(&signed(&KeySet { keys: vec![second.clone()] })).await.is_ok(), "k2 is cached");
    let third = Key { id: "k3".into(), secret: "third key of the test".into(), not_before: 0 };
    store.set("service-a", KeySet { keys: vec![second.clone(), third.clone()] });
    let answer = participant.handle(&signed(&KeySet { keys: vec![third] })).await;
    assert!(refused(&answer), "a key used before the caches have it is refused: {answer:?}");
}
