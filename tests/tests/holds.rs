//! Decide later (issue 32): a transaction with `holdMs` holds its prepares for its caller's
//! `POST /transactions/{id}/commit` or `/abort`, until `holdUntil`; past it (and twice the clock margin)
//! resolvers abort it. Against DynamoDB Local, through the coordinator function's handler.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use twopc::clock::{CLOCK_MARGIN_MS, SharedClock, SkewedClock};
use twopc::hold::HoldPolicy;
use twopc::model::{Action, Status};
use twopc_client::{Transaction, op};
use twopc_tests::{DynamoFault, EdgeFault, Rule, TestEnv, call_coordinator, rest_event};

const ALICE: &str = "arn:aws:iam::123456789012:user/alice";
const MALLORY: &str = "arn:aws:iam::123456789012:user/mallory";

/// A transfer of `amount` from A (service-a) to `to` (service-b), held `hold_ms`.
fn held_transfer(to: &str, amount: i64, hold_ms: u64) -> Value {
    let mut body = Transaction::new()
        .participant("service-a", [op::add("A", "balance", -amount).min(0)])
        .participant("service-b", [op::add(to, "balance", amount)])
        .to_json();
    body["holdMs"] = json!(hold_ms);
    body
}

fn transfer(from: &str, to: &str, amount: i64) -> Value {
    TestEnv::transfer(("service-a", from), ("service-b", to), &amount.to_string())
}

/// A world with A = 100 (service-a), B = 0 and C = 0 (service-b).
async fn world() -> TestEnv {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    env.put_account("service-b", "C", "0").await;
    env
}

/// `event` as sent by `principal` (an IAM caller: API Gateway puts its ARN in the request context).
fn as_caller(mut event: Value, principal: Option<&str>) -> Value {
    if let Some(arn) = principal {
        event["requestContext"]["identity"]["userArn"] = json!(arn);
    }
    event
}

async fn post_as(env: &TestEnv, body: &Value, key: Option<&str>, principal: Option<&str>) -> (u16, Value) {
    let mut headers = json!({"content-type": "application/json"});
    if let Some(key) = key {
        headers["Idempotency-Key"] = json!(key);
    }
    let event = rest_event("POST", "/transactions", "/transactions", None, headers, Some(&body.to_string()));
    env.call(&as_caller(event, principal)).await
}

/// `POST /transactions/{id}/{decision}` ("commit" or "abort") from `principal`.
fn decision_event(id: &str, decision: &str, principal: Option<&str>) -> Value {
    as_caller(twopc_tests::decision_event(id, decision), principal)
}

async fn decide(env: &TestEnv, id: &str, decision: &str, principal: Option<&str>) -> (u16, Value) {
    env.call(&decision_event(id, decision, principal)).await
}

/// Posts a held transfer of 30 from A to `to` as ALICE, expecting it held: its id and holdUntil.
async fn hold(env: &TestEnv, to: &str, hold_ms: u64) -> (String, u64) {
    let before = env.clock_now();
    let (status, answer) = post_as(env, &held_transfer(to, 30, hold_ms), None, Some(ALICE)).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("PREPARED")), "{answer}");
    let hold_until = answer["holdUntil"].as_u64().expect("holdUntil");
    assert!(hold_until >= before + hold_ms && hold_until <= env.clock_now() + hold_ms, "{answer}");
    (answer["transactionId"].as_str().unwrap().to_owned(), hold_until)
}

async fn record(env: &TestEnv, id: &str) -> twopc::record::TransactionRecord {
    env.transactions.get(id).await.unwrap().expect("record")
}

/// The lock's expiry on an item (None: no lock).
async fn lock_expiry(env: &TestEnv, service: &str, id: &str) -> Option<u64> {
    env.item(service, id).await.and_then(|item| item["lock"]["expiresAt"].as_u64())
}

/// Nothing applied: A, B, C as the world started, no lock left.
async fn untouched(env: &TestEnv) {
    assert_eq!(env.balance("service-a", "A").await, "100");
    assert_eq!(env.balance("service-b", "B").await, "0");
    assert_eq!(env.balance("service-b", "C").await, "0");
    assert!(env.locked_items().await.is_empty(), "{:?}", env.locked_items().await);
}

/// Moves the world's clock past `hold_until` and twice the clock margin: resolvers may act.
fn past_expiry(env: &TestEnv, hold_until: u64) {
    let now = env.clock_now();
    env.clock.advance(hold_until + 2 * CLOCK_MARGIN_MS + 1 - now.min(hold_until + 2 * CLOCK_MARGIN_MS + 1));
}

#[tokio::test]
async fn an_approved_hold_commits_and_its_repeat_answers_the_same() {
    let env = world().await;
    let (id, hold_until) = hold(&env, "B", 60_000).await;

    // Held: the locks stay, expiring at holdUntil; plain reads see the committed data; GET shows the hold.
    assert_eq!(lock_expiry(&env, "service-a", "A").await, Some(hold_until));
    assert_eq!(lock_expiry(&env, "service-b", "B").await, Some(hold_until));
    assert_eq!(env.balance("service-a", "A").await, "100");
    let held = record(&env, &id).await;
    assert_eq!((held.status, held.hold_until, held.sweep_at), (Status::Prepared, Some(hold_until), Some(hold_until)));
    let (status, got) = env.get(&id).await;
    assert_eq!((status, got["status"].as_str(), got["holdUntil"].as_u64()), (200, Some("PREPARED"), Some(hold_until)));
    assert!(env.sweeper(None).sweep().await.unwrap().is_quiet(), "a hold is not the sweeper's before it ends");

    let (status, answer) = decide(&env, &id, "commit", Some(ALICE)).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_eq!(env.balance("service-a", "A").await, "70");
    assert_eq!(env.balance("service-b", "B").await, "30");
    assert!(env.locked_items().await.is_empty());

    let (status, again) = decide(&env, &id, "commit", Some(ALICE)).await;
    assert_eq!((status, again["status"].as_str()), (200, Some("COMMITTED")), "{again}");
    // The other call after the decision: 409 with the decided body.
    let (status, abort) = decide(&env, &id, "abort", Some(ALICE)).await;
    assert_eq!((status, abort["status"].as_str()), (409, Some("COMMITTED")), "{abort}");
    assert_eq!(env.item("service-a", "A").await.unwrap()["version"], json!(1));
}

#[tokio::test]
async fn a_rejected_hold_aborts_and_releases_everything() {
    let env = world().await;
    let (id, _) = hold(&env, "B", 60_000).await;

    let (status, answer) = decide(&env, &id, "abort", Some(ALICE)).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("ABORTED")), "{answer}");
    untouched(&env).await;
    assert_eq!(record(&env, &id).await.status, Status::Aborted);

    let (status, again) = decide(&env, &id, "abort", Some(ALICE)).await;
    assert_eq!((status, again["status"].as_str()), (200, Some("ABORTED")), "{again}");
    let (status, commit) = decide(&env, &id, "commit", Some(ALICE)).await;
    assert_eq!((status, commit["status"].as_str()), (409, Some("ABORTED")), "{commit}");
    untouched(&env).await;
}

#[tokio::test]
async fn an_expired_hold_is_aborted_by_the_sweeper() {
    let env = world().await;
    let (id, hold_until) = hold(&env, "B", 1_000).await;

    // Within holdUntil and twice the clock margin: the sweeper leaves it.
    env.clock.advance(1_000);
    assert!(env.sweeper(None).sweep().await.unwrap().is_quiet());
    assert_eq!(record(&env, &id).await.status, Status::Prepared);

    past_expiry(&env, hold_until);
    let report = env.sweeper(None).sweep().await.unwrap();
    assert_eq!(report.aborted, 1, "{report:?}");
    let ended = record(&env, &id).await;
    assert_eq!(ended.status, Status::Aborted);
    assert_eq!(ended.reason.as_deref(), Some(twopc::recovery::HOLD_EXPIRED_REASON));
    untouched(&env).await;

    let (status, commit) = decide(&env, &id, "commit", Some(ALICE)).await;
    assert_eq!((status, commit["status"].as_str()), (409, Some("ABORTED")), "{commit}");
}

#[tokio::test]
async fn a_commit_after_hold_until_is_refused_and_aborts_it() {
    let env = world().await;
    let (id, hold_until) = hold(&env, "B", 1_000).await;
    env.clock.advance(hold_until + 1 - env.clock_now());

    let (status, commit) = decide(&env, &id, "commit", Some(ALICE)).await;
    assert_eq!((status, commit["status"].as_str()), (409, Some("ABORTED")), "{commit}");
    assert_eq!(commit["reason"].as_str(), Some(twopc::recovery::HOLD_EXPIRED_REASON));
    untouched(&env).await;
}

#[tokio::test]
async fn a_prepare_meeting_a_held_lock_is_refused_naming_the_holder_until_the_hold_expires() {
    let env = world().await;
    let (id, hold_until) = hold(&env, "B", 20_000).await;

    let (status, answer) = env.post(&transfer("A", "C", 10), None).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["participants"][0]["code"], "CONFLICT", "{answer}");
    assert!(answer["participants"][0]["reason"].as_str().unwrap().contains(&id), "{answer}");

    // Past the transaction's deadline but within its hold: still the holder's.
    env.clock.advance(10_000);
    let (status, answer) = env.post(&transfer("A", "C", 10), None).await;
    assert_eq!((status, answer["participants"][0]["code"].as_str()), (409, Some("CONFLICT")), "{answer}");
    assert_eq!(record(&env, &id).await.status, Status::Prepared);

    // Past the hold: the prepare resolves the held owner (aborts it) and takes the item.
    past_expiry(&env, hold_until);
    let (status, answer) = env.post(&transfer("A", "C", 10), None).await;
    assert_eq!(status, 200, "{answer}");
    assert!(matches!(record(&env, &id).await.status, Status::Aborting | Status::Aborted));
    env.sweep_until_quiet().await;
    assert_eq!(record(&env, &id).await.status, Status::Aborted);
    assert_eq!(env.balance("service-a", "A").await, "90");
    assert_eq!(env.balance("service-b", "B").await, "0");
    assert_eq!(env.balance("service-b", "C").await, "10");
    assert!(env.locked_items().await.is_empty());
}

#[tokio::test]
async fn a_check_only_participant_locks_what_it_checks_when_held() {
    let env = world().await;
    let mut body = Transaction::new()
        .participant("service-a", [op::add("A", "balance", -30).min(0)])
        .participant("service-b", [op::check("B").exists(true)])
        .to_json();
    body["holdMs"] = json!(60_000);
    let (status, answer) = post_as(&env, &body, None, Some(ALICE)).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("PREPARED")), "{answer}");
    let id = answer["transactionId"].as_str().unwrap().to_owned();
    let hold_until = answer["holdUntil"].as_u64().unwrap();
    assert_eq!(lock_expiry(&env, "service-b", "B").await, Some(hold_until), "the checked item is locked");
    assert!(!record(&env, &id).await.participants[1].read_only);

    // Another transaction cannot change what the held one checked.
    let credit = Transaction::new().participant("service-b", [op::add("B", "balance", 1)]).to_json();
    let (status, answer) = env.post(&credit, None).await;
    assert_eq!((status, answer["participants"][0]["code"].as_str()), (409, Some("CONFLICT")), "{answer}");

    let (status, answer) = decide(&env, &id, "commit", Some(ALICE)).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert!(env.locked_items().await.is_empty());
    assert_eq!(env.balance("service-a", "A").await, "70");
    assert_eq!(env.item("service-b", "B").await.unwrap()["version"], json!(0), "a check changes nothing");

    // Without holdMs a check-only participant still locks nothing.
    let body = Transaction::new()
        .participant("service-a", [op::add("A", "balance", -1).min(0)])
        .participant("service-b", [op::check("B").exists(true)])
        .to_json();
    let (status, answer) = env.post(&body, None).await;
    assert_eq!(status, 200, "{answer}");
    let plain = answer["transactionId"].as_str().unwrap();
    let calls = env.invoker.calls();
    let b_calls: Vec<Action> =
        calls.iter().filter(|c| c.transaction_id == plain && c.service == "service-b").map(|c| c.action).collect();
    assert_eq!(b_calls, [Action::Prepare], "read only: no second phase");
}

#[tokio::test]
async fn unknown_another_principals_and_unheld_transactions_are_told_apart() {
    let mut env = world().await;
    // Only ALICE is an admin among the IAM callers (by default every IAM caller is one, and may decide
    // any transaction): MALLORY is held to her own.
    let policy = format!(r#"{{"iamAdmins": ["{ALICE}"]}}"#);
    env.coordinator = env.coordinator.clone().with_access(twopc::access::Policy::parse(Some(&policy)).unwrap());
    let (id, _) = hold(&env, "B", 60_000).await;

    for decision in ["commit", "abort"] {
        let (status, answer) = decide(&env, "tx-0000000000000000000000000000000", decision, Some(ALICE)).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("NOT_FOUND")), "{answer}");
        // Another principal's transaction is as unknown as one that does not exist.
        let (status, answer) = decide(&env, &id, decision, Some(MALLORY)).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("NOT_FOUND")), "{answer}");
    }
    // A caller without identity (no authorizer checked it: the local stack without --auth) is an admin
    // only where every IAM caller is one, not here.
    for decision in ["commit", "abort"] {
        let (status, answer) = decide(&env, &id, decision, None).await;
        assert_eq!(status, 404, "{answer}");
    }
    assert_eq!(record(&env, &id).await.status, Status::Prepared, "nothing changed");

    env.put_account("service-a", "D", "100").await;
    let (status, plain) = post_as(&env, &transfer("D", "C", 5), None, Some(ALICE)).await;
    assert_eq!(status, 200, "{plain}");
    let plain_id = plain["transactionId"].as_str().unwrap();
    for decision in ["commit", "abort"] {
        let (status, answer) = decide(&env, plain_id, decision, Some(ALICE)).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (409, Some("NOT_HELD")), "{answer}");
    }
    assert_eq!(record(&env, plain_id).await.status, Status::Committed);

    let (status, answer) = decide(&env, &id, "commit", Some(ALICE)).await;
    assert_eq!(status, 200, "the creator may: {answer}");
}

#[tokio::test]
async fn a_hold_over_a_services_maximum_is_refused_before_anything_is_locked() {
    let env = world().await;
    let policy = HoldPolicy::parse(Some(r#"{"service-b": {"maxHoldMs": 60000}}"#), None).unwrap();
    let coordinator = env.coordinator_of(&env.invoker).with_hold_policy(policy);
    let post = |body: &Value| {
        let event = rest_event("POST", "/transactions", "/transactions", None, json!({}), Some(&body.to_string()));
        let coordinator = coordinator.clone();
        async move { call_coordinator(&coordinator, &event).await }
    };

    let (status, answer) = post(&held_transfer("B", 30, 60_001)).await;
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("service-b") && message.contains("60000 ms"), "{message}");
    // service-a's default: 15 minutes.
    let (status, answer) = post(&held_transfer("B", 30, 15 * 60_000 + 1)).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("900000 ms"), "{answer}");
    untouched(&env).await;
    assert!(env.records().await.is_empty(), "nothing written");
    assert!(env.invoker.calls().is_empty(), "no participant asked");

    let (status, answer) = post(&held_transfer("B", 30, 60_000)).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("PREPARED")), "{answer}");
}

#[tokio::test]
async fn a_retried_held_post_answers_the_hold_at_once_and_the_outcome_after_it() {
    let env = world().await;
    let body = held_transfer("B", 30, 60_000);
    let (status, first) = post_as(&env, &body, Some("order-1"), Some(ALICE)).await;
    assert_eq!((status, first["status"].as_str()), (202, Some("PREPARED")), "{first}");

    let started = Instant::now();
    let (status, again) = post_as(&env, &body, Some("order-1"), Some(ALICE)).await;
    assert!(started.elapsed() < Duration::from_millis(1_500), "answered at once: {:?}", started.elapsed());
    assert_eq!(status, 202);
    assert_eq!(again, first, "the same 202");

    let id = first["transactionId"].as_str().unwrap();
    let (status, _) = decide(&env, id, "commit", Some(ALICE)).await;
    assert_eq!(status, 200);
    let (status, after) = post_as(&env, &body, Some("order-1"), Some(ALICE)).await;
    assert_eq!((status, after["status"].as_str()), (200, Some("COMMITTED")), "{after}");

    // A held retry after the hold expired: the expiry's outcome.
    let (status, second) = post_as(&env, &held_transfer("C", 10, 1_000), Some("order-2"), Some(ALICE)).await;
    assert_eq!(status, 202, "{second}");
    past_expiry(&env, second["holdUntil"].as_u64().unwrap());
    let (status, after) = post_as(&env, &held_transfer("C", 10, 1_000), Some("order-2"), Some(ALICE)).await;
    assert_eq!((status, after["status"].as_str()), (409, Some("ABORTED")), "{after}");
    assert_eq!(env.balance("service-b", "C").await, "0");
    assert!(env.locked_items().await.is_empty());
}

#[tokio::test]
async fn concurrent_approvals_commit_once() {
    let env = world().await;
    let (id, _) = hold(&env, "B", 60_000).await;
    let answers = futures::future::join_all((0..4).map(|_| decide(&env, &id, "commit", Some(ALICE)))).await;
    for (status, answer) in &answers {
        assert_eq!((*status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    }
    assert_eq!(env.balance("service-a", "A").await, "70");
    assert_eq!(env.balance("service-b", "B").await, "30");
    assert_eq!(env.item("service-b", "B").await.unwrap()["version"], json!(1), "applied once");
    assert!(env.locked_items().await.is_empty());
}

#[tokio::test]
async fn approve_racing_reject_has_one_winner() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "1000").await;
    env.put_account("service-b", "B", "0").await;
    let (mut committed, mut aborted) = (0, 0);
    for _ in 0..6 {
        let (id, _) = hold(&env, "B", 60_000).await;
        let (commit, abort) =
            futures::join!(decide(&env, &id, "commit", Some(ALICE)), decide(&env, &id, "abort", Some(ALICE)));
        let ended = record(&env, &id).await;
        match ended.status {
            Status::Committed => {
                committed += 1;
                assert_eq!((commit.0, commit.1["status"].as_str()), (200, Some("COMMITTED")), "{commit:?}");
                assert_eq!((abort.0, abort.1["status"].as_str()), (409, Some("COMMITTED")), "{abort:?}");
            }
            Status::Aborted => {
                aborted += 1;
                assert_eq!((abort.0, abort.1["status"].as_str()), (200, Some("ABORTED")), "{abort:?}");
                assert_eq!((commit.0, commit.1["status"].as_str()), (409, Some("ABORTED")), "{commit:?}");
            }
            other => panic!("{id} ended {other}: {commit:?} {abort:?}"),
        }
    }
    assert_eq!(env.balance("service-b", "B").await, (30 * committed).to_string());
    assert_eq!(env.balance("service-a", "A").await, (1000 - 30 * committed).to_string());
    assert!(env.locked_items().await.is_empty());
    println!("{committed} committed, {aborted} aborted");
}

/// The coordinator's clock just before holdUntil (it may still commit); a sweeper's clock ahead by more
/// than twice the clock margin (it may already abort): the race the margins never allow with real skews, run
/// anyway. Exactly one decision wins each time, and everyone follows it.
#[tokio::test]
async fn approve_racing_expiry_has_one_winner() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "1000").await;
    env.put_account("service-b", "B", "0").await;
    let ahead: SharedClock = SkewedClock::new(env.clock.clone(), (2 * CLOCK_MARGIN_MS + 100) as i64);
    let sweeper = env.sweeper(Some(ahead));
    let mut committed = 0;
    for _ in 0..6 {
        let (id, hold_until) = hold(&env, "B", 1_000).await;
        env.clock.advance((hold_until - 50).saturating_sub(env.clock_now()));
        let (commit, swept) = futures::join!(decide(&env, &id, "commit", Some(ALICE)), sweeper.sweep());
        swept.unwrap();
        env.sweep_until_quiet().await;
        let ended = record(&env, &id).await;
        match ended.status {
            Status::Committed => {
                committed += 1;
                assert_eq!(commit.0, 200, "{commit:?}");
            }
            Status::Aborted => {
                assert_eq!((commit.0, commit.1["status"].as_str()), (409, Some("ABORTED")), "{commit:?}")
            }
            other => panic!("{id} ended {other}: {commit:?}"),
        }
    }
    assert_eq!(env.balance("service-b", "B").await, (30 * committed).to_string());
    assert_eq!(env.balance("service-a", "A").await, (1000 - 30 * committed).to_string());
    assert!(env.locked_items().await.is_empty());
}

/// Faults on the way: the hold messages lost (the locks keep their deadline, and whoever meets them finds
/// the owner held), commit answers lost (202 COMMITTING, the sweeper finishes), late copies of every
/// message (they change nothing), and DynamoDB writes of the record that took effect but whose reply was
/// lost (recognised as the writer's own).
#[tokio::test]
async fn holds_survive_lost_duplicated_and_late_messages_and_lost_dynamodb_replies() {
    let env = world().await;
    // The hold messages never arrive: the locks keep the transaction's deadline.
    env.invoker.set("service-a", Action::Hold, EdgeFault::Fail);
    env.invoker.set("service-b", Action::Hold, EdgeFault::LoseReply);
    let (id, hold_until) = hold(&env, "B", 60_000).await;
    let deadline = record(&env, &id).await.deadline;
    assert_eq!(lock_expiry(&env, "service-a", "A").await, Some(deadline), "not extended");
    assert_eq!(lock_expiry(&env, "service-b", "B").await, Some(hold_until), "extended, its reply lost");
    // Past the deadline: the sweeper finds the lock due and its owner held, and leaves both, sending the
    // hold that was lost: the lock moves to holdUntil and leaves the head of the sweeper's index (else it
    // would take one of each run's places for the whole hold).
    env.invoker.clear();
    env.clock.advance(deadline + 2 * CLOCK_MARGIN_MS + 1 - env.clock_now());
    let report = env.sweeper(None).sweep().await.unwrap();
    assert_eq!((report.locks_waiting, report.aborted), (1, 0), "{report:?}");
    assert_eq!(lock_expiry(&env, "service-a", "A").await, Some(hold_until), "moved by the sweeper");
    let report = env.sweeper(None).sweep().await.unwrap();
    assert_eq!((report.locks_waiting, report.aborted), (0, 0), "nothing due: {report:?}");
    let (status, answer) = env.post(&transfer("A", "C", 10), None).await;
    assert_eq!((status, answer["participants"][0]["code"].as_str()), (409, Some("CONFLICT")), "{answer}");
    assert!(answer["participants"][0]["reason"].as_str().unwrap().contains(&id), "{answer}");

    // The commit: service-b's answers lost (it commits, the coordinator cannot tell), late copies of
    // service-a's commit.
    env.invoker.clear();
    env.invoker.set("service-b", Action::Commit, EdgeFault::LoseReply);
    env.invoker.set("service-a", Action::Commit, EdgeFault::LateCopy(Duration::from_millis(300)));
    let (status, answer) = decide(&env, &id, "commit", Some(ALICE)).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("COMMITTING")), "{answer}");
    env.invoker.clear();
    env.settle().await;
    // Decided: due for the sweeper after the transaction's timeout, as any decision, not at holdUntil.
    let decided = record(&env, &id).await;
    assert!(decided.sweep_at < Some(hold_until), "{decided:?}");
    env.clock.advance(5_000);
    env.sweep_until_quiet().await;
    let (status, answer) = decide(&env, &id, "commit", Some(ALICE)).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_eq!(env.balance("service-a", "A").await, "70");
    assert_eq!(env.balance("service-b", "B").await, "30");
    assert!(env.locked_items().await.is_empty());

    // Late and duplicated prepares and holds of a second hold: nothing locked twice, nothing left.
    env.invoker.set("service-a", Action::Prepare, EdgeFault::LateCopy(Duration::from_millis(500)));
    env.invoker.set("service-b", Action::Prepare, EdgeFault::Duplicate);
    env.invoker.set("service-a", Action::Hold, EdgeFault::Duplicate);
    env.invoker.set("service-b", Action::Hold, EdgeFault::LateCopy(Duration::from_millis(500)));
    let (second, _) = hold(&env, "C", 60_000).await;
    env.invoker.clear();
    let (status, answer) = decide(&env, &second, "abort", Some(ALICE)).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("ABORTED")), "{answer}");
    env.settle().await;
    // A late prepare may have locked again after the abort (before the deadline, as for any transaction):
    // its lock expires at the deadline, and the sweeper releases it.
    env.clock.advance(5_000);
    env.sweep_until_quiet().await;
    assert!(env.locked_items().await.is_empty(), "{:?}", env.locked_items().await);
    assert_eq!(env.balance("service-a", "A").await, "70");
    assert_eq!(env.balance("service-b", "C").await, "0");
}

#[tokio::test]
async fn record_writes_whose_replies_were_lost_are_the_writers_own() {
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], twopc_tests::DynamoFaults::new(0)).await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    let table = env.transactions.table().to_owned();
    for fault in [DynamoFault::LoseReply, DynamoFault::DropConnection] {
        // The hold (PREPARING → PREPARED) and the commit decision (PREPARED → COMMITTING) each take effect
        // and lose their reply; the SDK's retry meets its own write.
        env.dynamo_faults.clear();
        env.dynamo_faults.add(Rule::new(fault).operation("UpdateItem").table(&table).body_contains("holdUntil").nth(1));
        let (id, _) = hold(&env, "B", 60_000).await;
        env.dynamo_faults
            .add(Rule::new(fault).operation("UpdateItem").table(&table).body_contains("COMMITTING").nth(1));
        let (status, answer) = decide(&env, &id, "commit", Some(ALICE)).await;
        assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{fault:?}: {answer}");
        assert_eq!(env.dynamo_faults.fired(), 2, "{fault:?}");
        env.dynamo_faults.forget();
    }
    env.dynamo_faults.clear();
    assert_eq!(env.balance("service-a", "A").await, "40");
    assert_eq!(env.balance("service-b", "B").await, "60");
    assert!(env.locked_items().await.is_empty());
}

/// A prepare that meets a held transaction's lock past its deadline (its hold message lost, so lock
/// resolution finds the owner held and moves the lock) is refused naming the holder, like one meeting the
/// lock within its deadline: held locks are outside the retries' bound, so its coordinator answers the
/// refusal at once instead of retrying into a wait the hold outlasts.
#[tokio::test]
async fn a_prepare_resolving_a_held_lock_is_refused_at_once_not_retried() {
    let env = world().await;
    env.invoker.set("service-a", Action::Hold, EdgeFault::Fail);
    let (id, hold_until) = hold(&env, "B", 60_000).await;
    let deadline = record(&env, &id).await.deadline;
    assert_eq!(lock_expiry(&env, "service-a", "A").await, Some(deadline), "not extended");
    env.invoker.clear();
    env.clock.advance(deadline + 2 * CLOCK_MARGIN_MS + 1 - env.clock_now());

    let (status, answer) = env.post(&transfer("A", "C", 10), None).await;

    assert_eq!((status, answer["participants"][0]["code"].as_str()), (409, Some("CONFLICT")), "{answer}");
    assert!(answer["participants"][0]["reason"].as_str().unwrap().contains(&id), "{answer}");
    assert!(answer.get("attempts").is_none(), "not retried: {answer}");
    assert_eq!(lock_expiry(&env, "service-a", "A").await, Some(hold_until), "moved by the resolving prepare");
}
