//! Issue 48, answer on decision: a POST with `Prefer: respond-async` is answered 202 COMMITTING as soon as
//! its commit decision is durable, and its second phase goes on after the answer; stopped there (a crash,
//! lost and late messages), the sweeper finishes it. Against DynamoDB Local.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use twopc::after_answer::Spawned;
use twopc::coordinator::Coordinator;
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::{Action, Status};
use twopc_tests::{EdgeFault, TestEnv, rest_event};

fn transfer(amount: &str) -> Value {
    let mut body = TestEnv::transfer(("service-a", "A"), ("service-b", "B"), amount);
    body["timeoutMs"] = json!(2_000);
    body
}

async fn post(coordinator: &Coordinator, body: &Value, key: Option<&str>, respond_async: bool) -> (u16, Value) {
    let caller = coordinator.access().iam(None);
    let reply = coordinator.submit_preferring(body.to_string().as_bytes(), key, None, &caller, respond_async).await;
    (reply.status, reply.body)
}

/// Until the record of `id` is `status` (the second phase after the answer), or a bound.
async fn until_status(env: &TestEnv, id: &str, status: Status) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if env.transactions.get(id).await.unwrap().is_some_and(|r| r.status == status) {
            return;
        }
        assert!(Instant::now() < deadline, "{id} never became {status}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A coordinator that applies the preference: its after-answer work runs as a task of its own.
fn answering_early(env: &TestEnv, invoker: &twopc_tests::FaultyInvoker, faults: Faults) -> Coordinator {
    env.coordinator_with(invoker, faults).with_after_answer(Arc::new(Spawned))
}

async fn accounts(env: &TestEnv) {
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
}

/// The 202 comes once the decision is durable, before the commits (slow here) land; the second phase then
/// ends the transaction. Without the preference, or on a coordinator that cannot run work after its
/// answer, the answer comes at the end, as before.
#[tokio::test]
async fn a_request_preferring_respond_async_is_answered_on_its_commit_decision() {
    let env = TestEnv::new().await;
    accounts(&env).await;
    let invoker = env.fresh_invoker();
    // Long enough that no pause of a loaded machine lets the second phase end before the record is read.
    invoker.set("service-b", Action::Commit, EdgeFault::DelayReply(Duration::from_millis(1_500)));
    let coordinator = answering_early(&env, &invoker, Faults::default());

    let (status, answer) = post(&coordinator, &transfer("10"), None, true).await;

    assert_eq!((status, answer["status"].as_str()), (202, Some("COMMITTING")), "{answer}");
    let id = answer["transactionId"].as_str().unwrap().to_owned();
    let record = env.transactions.get(&id).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Committing, "answered before the second phase ended");
    until_status(&env, &id, Status::Committed).await;
    env.settle().await;
    assert_eq!(env.balance("service-a", "A").await, "90");
    assert_eq!(env.balance("service-b", "B").await, "10");
    twopc_tests::contention::assert_no_locks(&env).await;

    let (status, answer) = post(&coordinator, &transfer("5"), None, false).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "no preference: {answer}");
    let (status, answer) = post(&env.coordinator, &transfer("5"), None, true).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "not applied here: {answer}");
    assert_eq!(env.balance("service-a", "A").await, "80");
}

/// A refusal is answered at its end, preference or not: an abort is answered once its locks are released.
#[tokio::test]
async fn an_abort_is_answered_at_its_end_whatever_the_preference() {
    let env = TestEnv::new().await;
    accounts(&env).await;
    let coordinator = answering_early(&env, &env.fresh_invoker(), Faults::default());
    let (status, answer) = post(&coordinator, &transfer("500"), None, true).await;
    assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{answer}");
    twopc_tests::contention::assert_no_locks(&env).await;
}

/// The second phase after the answer stops (a crash after the first commit), its commit messages are
/// duplicated and delivered late: the sweeper finishes it past the deadline, applied once. Then the key's
/// replay, with the preference or without (it is not part of the request's hash), answers the same
/// transaction, committed, never 422.
#[tokio::test]
async fn a_second_phase_stopped_after_the_answer_is_finished_by_the_sweeper() {
    let env = TestEnv::new().await;
    accounts(&env).await;
    let invoker = env.fresh_invoker();
    invoker.set("service-a", Action::Commit, EdgeFault::Duplicate);
    invoker.set("service-b", Action::Commit, EdgeFault::LateCopy(Duration::from_millis(200)));
    let crashing = answering_early(&env, &invoker, Faults::crash_at(CoordinatorCrash::AfterCommits(1)));

    let (status, answer) = post(&crashing, &transfer("10"), Some("early"), true).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("COMMITTING")), "{answer}");
    let id = answer["transactionId"].as_str().unwrap().to_owned();
    // The crash ends the second phase after the answer: nothing finishes it but the sweeper.
    let stopped = env.transactions.get(&id).await.unwrap().unwrap();
    assert_eq!(stopped.status, Status::Committing, "{stopped:?}");
    env.clock.advance(2_000 + twopc::sweeper::SweepLimits::default().grace_ms);
    let reports = env.sweep_until_quiet().await;
    assert_eq!(reports.iter().map(|r| r.committed).sum::<u32>(), 1, "the sweeper finished it: {reports:?}");
    assert_eq!(env.transactions.get(&id).await.unwrap().unwrap().status, Status::Committed);
    let replaying = answering_early(&env, &env.fresh_invoker(), Faults::default());
    for respond_async in [true, false] {
        let (status, replay) = post(&replaying, &transfer("10"), Some("early"), respond_async).await;
        assert_eq!(
            (status, replay["transactionId"].as_str()),
            (200, Some(id.as_str())),
            "the same transaction: {replay}"
        );
    }
    env.settle().await;
    assert_eq!(env.balance("service-a", "A").await, "90", "applied once");
    assert_eq!(env.balance("service-b", "B").await, "10", "applied once");
    twopc_tests::contention::assert_no_locks(&env).await;
}

/// Through the coordinator function's handler: `Prefer: respond-async` (among other preferences, in any
/// case) is answered 202 with `Preference-Applied: respond-async`; without it, 200 and no such header.
#[tokio::test]
async fn the_handler_says_when_it_applied_the_preference() {
    let env = TestEnv::new().await;
    accounts(&env).await;
    let invoker = env.fresh_invoker();
    invoker.set("service-b", Action::Commit, EdgeFault::DelayReply(Duration::from_millis(200)));
    let coordinator = answering_early(&env, &invoker, Faults::default());
    let body = transfer("10").to_string();
    for (prefer, applied) in [(Some("wait=5, Respond-Async"), true), (None, false)] {
        let headers = match prefer {
            Some(prefer) => json!({"Content-Type": "application/json", "Prefer": prefer}),
            None => json!({"Content-Type": "application/json"}),
        };
        let event = rest_event("POST", "/transactions", "/transactions", None, headers, Some(&body));
        let request = lambda_http::request::from_str(&event.to_string()).unwrap();
        let response = coordinator::handle(&coordinator, request).await;
        let said = response.headers().get("preference-applied").map(|v| v.to_str().unwrap().to_owned());
        let expected = if applied { (202, Some("respond-async".to_owned())) } else { (200, None) };
        assert_eq!((response.status().as_u16(), said), expected, "Prefer: {prefer:?}");
    }
}
