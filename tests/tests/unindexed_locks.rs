//! Issue 48, fewer write units: an attempt whose record was written before its prepares (keyed, retried)
//! locks its items out of the locks index (`recorded`), 2 index writes fewer per item; the record, open
//! in the open-transactions index, is how the sweeper finds those locks. A prepare that went unanswered
//! may still lock after the releases: such an abort is left open until the sweeper, past the lock cutoff,
//! releases again. Against DynamoDB Local, with lost, late and duplicated messages, a coordinator that
//! stops, and a lock write that took effect but whose reply was lost.

use std::time::Duration;

use serde_json::{Value, json};
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::{Action, Status};
use twopc_tests::contention::assert_no_locks;
use twopc_tests::{DynamoFault, DynamoFaults, EdgeFault, Rule, TestEnv};

/// A transfer whose credit to B has a `max`: it takes B's lock, not a pending credit (whose entry, found the
/// same way, `hot_receivers.rs` tests).
fn transfer(amount: &str) -> Value {
    let mut body = TestEnv::transfer(("service-a", "A"), ("service-b", "B"), amount);
    body["timeoutMs"] = json!(2_000);
    body["participants"][1]["operations"][0]["max"] = json!(1_000_000);
    body
}

async fn accounts(env: &TestEnv) {
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
}

/// Whether the item carries a lock, and whether that lock is in the locks index.
async fn lock_of(env: &TestEnv, service: &str, id: &str) -> (bool, bool) {
    let item = env.item(service, id).await.unwrap();
    (item.get("lock").is_some(), item.get("lockShard").is_some() && item.get("lockExpiresAt").is_some())
}

/// Expired locks the sweeper's locks index lists in a service's table, long past every deadline.
async fn indexed_locks(env: &TestEnv, service: &str) -> usize {
    let far = env.clock_now() + 3_600_000;
    env.participants[service].table().expired_locks(far, 100).await.unwrap().len()
}

/// Past the deadline of a transaction of [`transfer`] and the sweeper's grace.
fn past_deadline(env: &TestEnv) {
    env.clock.advance(2_000 + twopc::sweeper::SweepLimits::default().grace_ms + 1);
}

/// A keyed request's coordinator stops after both prepares: its locks are in no index, yet the sweeper
/// finds them through the record and aborts it. An unkeyed request's locks (recorded at its decision)
/// are in the index as before, which is how the sweeper finds them.
#[tokio::test]
async fn a_recorded_attempts_locks_stay_out_of_the_index_and_its_record_finds_them() {
    let env = TestEnv::new().await;
    accounts(&env).await;
    let crashing = env.coordinator_with(&env.invoker, Faults::crash_at(CoordinatorCrash::AfterPrepares(2)));
    let caller = crashing.access().iam(None);
    let keyed = crashing.submit_by(transfer("10").to_string().as_bytes(), Some("stops"), &caller).await;
    assert_eq!(keyed.status, 500, "{}", keyed.body);

    assert_eq!(lock_of(&env, "service-a", "A").await, (true, false), "locked, not indexed");
    assert_eq!(lock_of(&env, "service-b", "B").await, (true, false), "locked, not indexed");
    assert_eq!((indexed_locks(&env, "service-a").await, indexed_locks(&env, "service-b").await), (0, 0));

    past_deadline(&env);
    let reports = env.sweep_until_quiet().await;
    assert_eq!(reports.iter().map(|r| r.aborted).sum::<u32>(), 1, "{reports:?}");
    assert_no_locks(&env).await;

    let unkeyed = crashing.submit_by(transfer("10").to_string().as_bytes(), None, &caller).await;
    assert_eq!(unkeyed.status, 500, "{}", unkeyed.body);
    assert_eq!(lock_of(&env, "service-a", "A").await, (true, true), "an unkeyed request's lock is indexed");
    assert_eq!(indexed_locks(&env, "service-b").await, 1);
    env.clock.advance(2_000 + twopc::sweeper::SweepLimits::default().grace_ms + 1);
    env.sweep_until_quiet().await;
    assert_no_locks(&env).await;
    assert_eq!((env.balance("service-a", "A").await, env.balance("service-b", "B").await), ("100".into(), "0".into()));
}

/// The prepare to B is held back by the network: the coordinator gets no vote, aborts and releases A,
/// and B's lock is written after that, out of the index. The abort is answered 409 ABORTED but its
/// record stays ABORTING; past the deadline the sweeper releases B and ends it. (Before the rule, the
/// abort was ended at once, and B's lock stayed for good: no index, no open record led to it.)
#[tokio::test]
async fn a_prepare_delivered_after_the_abort_is_released_by_the_sweeper() {
    let env = TestEnv::new().await;
    accounts(&env).await;
    env.invoker.set("service-b", Action::Prepare, EdgeFault::LateDelivery(Duration::from_millis(300)));

    let (status, answer) = env.post(&transfer("10"), Some("held-back")).await;
    assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{answer}");
    let id = answer["transactionId"].as_str().unwrap().to_owned();
    env.settle().await;
    assert_eq!(lock_of(&env, "service-b", "B").await, (true, false), "the late prepare locked, out of the index");
    let record = env.transactions.get(&id).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Aborting, "left open for the sweeper: {record:?}");

    past_deadline(&env);
    let reports = env.sweep_until_quiet().await;
    assert_eq!(reports.iter().map(|r| r.aborted).sum::<u32>(), 1, "{reports:?}");
    assert_eq!(env.transactions.get(&id).await.unwrap().unwrap().status, Status::Aborted);
    assert_no_locks(&env).await;
    let (status, replay) = env.post(&transfer("10"), Some("held-back")).await;
    assert_eq!((status, &replay["transactionId"]), (409, &answer["transactionId"]), "{replay}");
    assert_eq!((env.balance("service-a", "A").await, env.balance("service-b", "B").await), ("100".into(), "0".into()));
}

/// B's lock write takes effect and DynamoDB answers a server error, or no answer comes at all (the
/// connection fails): the write's outcome is unknown, and it might even land a little later, so B does not
/// write again (a retry's lock could be committed first, and the item changed, before it lands): it answers
/// an error, and the coordinator's release takes the lock. B's execution is over, so anything it gave up on
/// lands within the clock margin: the coordinator waits that long and ends the abort itself. So for a
/// participant that fails. An invoke lost in transit may still arrive (the test above): only that one is
/// left to the sweeper. A refusal, or a prepare that never ran (throttled by Lambda), ends at once.
#[tokio::test]
async fn a_prepare_without_a_vote_is_ended_once_its_writes_have_landed() {
    let faults = DynamoFaults::new(0);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    accounts(&env).await;
    let table = env.table("service-b").to_owned();
    for (key, fault) in [("server-error", DynamoFault::LoseReply), ("no-answer", DynamoFault::DropConnection)] {
        faults.add(Rule::new(fault).operation("UpdateItem").table(&table).body_contains("PREPARED").nth(1));
        let (status, answer) = env.post(&transfer("10"), Some(key)).await;
        // Written again, B would have found its own lock and voted with it: the transfer would commit.
        assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{key}: {answer}");
        let record = env.transactions.get(answer["transactionId"].as_str().unwrap()).await.unwrap().unwrap();
        assert_eq!(record.status, Status::Aborted, "{key}: ended by its coordinator");
        assert_no_locks(&env).await;
        faults.clear();
    }
    for (key, amount, fault) in [
        ("failed", "10", Some(EdgeFault::Fail)),
        ("refused", "500", None),
        ("throttled", "10", Some(EdgeFault::Throttled)),
    ] {
        env.invoker.clear();
        if let Some(fault) = fault {
            env.invoker.set("service-b", Action::Prepare, fault);
        }
        let (status, answer) = env.post(&transfer(amount), Some(key)).await;
        assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{key}: {answer}");
        let record = env.transactions.get(answer["transactionId"].as_str().unwrap()).await.unwrap().unwrap();
        assert_eq!(record.status, Status::Aborted, "{key}: ended by its coordinator");
    }
    assert_no_locks(&env).await;
    assert_eq!((env.balance("service-a", "A").await, env.balance("service-b", "B").await), ("100".into(), "0".into()));
}

/// A prepare held back in the network locks B after the abort's releases, before the participants' lock
/// cutoff (deadline + the clock margin). The cutoff is under a second away, so the coordinator waits for
/// it, releases again and ends the abort itself: no sweeper, no lock left. (Ending the abort at once would
/// leave B's lock behind a terminal record.)
#[tokio::test]
async fn a_prepare_landing_before_the_cutoff_is_released_by_its_coordinator() {
    let env = TestEnv::new().await;
    accounts(&env).await;
    let mut body = transfer("10");
    body["timeoutMs"] = json!(300);
    env.invoker.set("service-b", Action::Prepare, EdgeFault::LateDelivery(Duration::from_millis(150)));
    let (status, answer) = env.post(&body, Some("held-back-briefly")).await;
    assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{answer}");
    let record = env.transactions.get(answer["transactionId"].as_str().unwrap()).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Aborted, "ended by its coordinator: {record:?}");
    env.settle().await;
    let late = env.invoker.calls().into_iter().filter(|c| c.late_copy).map(|c| c.answer).collect::<Vec<_>>();
    assert_eq!(late, ["PREPARED"], "the held-back prepare locked B");
    assert_no_locks(&env).await;
}

/// A lock write out of the index that DynamoDB refused (throttled: a 4xx, certainly not applied) is
/// written again, and the transfer commits.
#[tokio::test]
async fn a_refused_lock_write_is_written_again() {
    let faults = DynamoFaults::new(0);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    accounts(&env).await;
    let table = env.table("service-b").to_owned();
    faults.add(Rule::new(DynamoFault::Throttle).operation("UpdateItem").table(&table).body_contains("PREPARED").nth(1));
    let (status, answer) = env.post(&transfer("10"), Some("throttled-write")).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_eq!(faults.fired(), 1, "the first lock write was refused");
    assert_eq!(env.balance("service-b", "B").await, "10");
    assert_no_locks(&env).await;
}

/// A copy of a prepare (which the coordinator never makes: a prepare goes once, without the SDK's retries;
/// a proxy that retries could, and the invoker here copies a recorded prepare only when told so) lands after its transaction committed and another committed the item: its stray lock is
/// in no index and no open record names it. It holds nothing back: the next transaction on the item
/// meets it, finds its owner ended, releases it and commits; the operation was applied once.
#[tokio::test]
async fn a_duplicated_prepares_stray_lock_is_released_by_the_next_transaction_on_the_item() {
    let env = TestEnv::new().await;
    accounts(&env).await;
    env.invoker.set("service-b", Action::Prepare, EdgeFault::ProxyCopy(Duration::from_millis(400)));
    let (status, first) = env.post(&transfer("10"), Some("duplicated")).await;
    assert_eq!((status, first["status"].as_str()), (200, Some("COMMITTED")), "{first}");
    env.invoker.clear();
    let (status, second) = env.post(&transfer("5"), Some("between")).await;
    assert_eq!((status, second["status"].as_str()), (200, Some("COMMITTED")), "{second}");
    env.settle().await;
    let item = env.item("service-b", "B").await.unwrap();
    assert_eq!(item["lock"]["transactionId"], first["transactionId"], "the stray lock: {item}");
    assert_eq!(indexed_locks(&env, "service-b").await, 0);

    let (status, third) = env.post(&transfer("1"), Some("after")).await;
    assert_eq!((status, third["status"].as_str()), (200, Some("COMMITTED")), "{third}");
    assert_no_locks(&env).await;
    assert_eq!((env.balance("service-a", "A").await, env.balance("service-b", "B").await), ("84".into(), "16".into()));
}

/// The pairs: a held keyed request keeps its locks in the index (its hold moves their expiry there, where
/// the sweeper looks for a hold that ran out), and a keyed request on the one-phase path takes no lock.
#[tokio::test]
async fn a_held_request_keeps_indexed_locks_and_a_one_phase_request_takes_none() {
    let env = TestEnv::new().await;
    accounts(&env).await;
    let mut held = transfer("10");
    held["holdMs"] = json!(60_000);
    let (status, answer) = env.post(&held, Some("held")).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("PREPARED")), "{answer}");
    assert_eq!(lock_of(&env, "service-a", "A").await, (true, true), "a held lock is indexed");
    assert_eq!(lock_of(&env, "service-b", "B").await, (true, true), "a held lock is indexed");
    let caller = env.coordinator.access().iam(None);
    let id = answer["transactionId"].as_str().unwrap();
    let committed = env.coordinator.commit_held_by(id, &caller).await;
    assert_eq!(committed.body["status"], "COMMITTED", "{}", committed.body);
    assert_no_locks(&env).await;

    let mut sole = TestEnv::transfer(("service-a", "A"), ("service-a", "A"), "0");
    sole["participants"] = json!([{"service": "service-a", "operations": [
        {"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": 1}]}]);
    let (status, answer) = env.post(&sole, Some("sole")).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_no_locks(&env).await;
    assert_eq!(env.balance("service-a", "A").await, "91");
}
