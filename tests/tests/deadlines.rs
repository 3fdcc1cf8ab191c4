//! Issue 28, defects 1 to 3, against DynamoDB Local: every path of the coordinator (a retried key and
//! its recovery included) answers within the answer budget, and says only what the record says; a
//! prepare takes no lock after its deadline and the clock margin M, however its attempts are delayed;
//! clocks skewed by M/2 either way never abort a transaction that would otherwise commit.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::{Value, json};
use twopc::clock::{CLOCK_MARGIN_MS, SharedClock, SkewedClock, lock_cutoff, resolvable_after};
use twopc::coordinator::Coordinator;
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::invoke::{InProcessInvoker, InvokeError, ParticipantInvoker};
use twopc::model::{Action, ParticipantRequest, ParticipantResponse};
use twopc::participant::Participant;
use twopc_tests::{DynamoFault, DynamoFaults, EdgeFault, Rule, TestEnv, call_coordinator, rest_event};

async fn post_via(coordinator: &Coordinator, body: &Value, key: Option<&str>) -> (u16, Value) {
    let headers = key.map_or(json!({}), |key| json!({"Idempotency-Key": key}));
    let event = rest_event("POST", "/transactions", "/transactions", None, headers, Some(&body.to_string()));
    call_coordinator(coordinator, &event).await
}

fn transfer(from: &str, to: &str, timeout_ms: u64) -> Value {
    let mut body = TestEnv::transfer(("service-a", from), ("service-b", to), "10");
    body["timeoutMs"] = json!(timeout_ms);
    body
}

async fn accounts(env: &TestEnv, from: &str, to: &str) {
    env.put_account("service-a", from, "100").await;
    env.put_account("service-b", to, "0").await;
}

async fn assert_no_locks(env: &TestEnv) {
    let locked = env.locked_items().await;
    assert!(locked.is_empty(), "locks left: {locked:#?}");
}

/// Slack for the machine on top of a budget: the answer comes within the budget and this.
const SLACK: Duration = Duration::from_millis(800);

// ---------------------------------------------------------------------------------------------------
// Defect 1: a retried key answers within the budget, and only what the record says
// ---------------------------------------------------------------------------------------------------

/// A keyed transfer with a 15 s timeout whose coordinator stopped right after writing PREPARING,
/// retried at once: the retry used to wait for the deadline and 2 s, then recover and drive without
/// bound (32 s with a slow participant, after API Gateway had answered 504 without an id). Now it
/// answers within the budget: still undecided, a 503 with the id (a 202 would say "decided commit").
#[tokio::test]
async fn a_retry_finding_its_transaction_undecided_answers_503_with_the_id_within_the_budget() {
    let env = TestEnv::new().await;
    accounts(&env, "A", "B").await;
    let body = transfer("A", "B", 15_000);
    let stopped = env.coordinator_with(&env.fresh_invoker(), Faults::crash_at(CoordinatorCrash::AfterCreate));
    let (status, first) = post_via(&stopped, &body, Some("undecided")).await;
    assert_eq!(status, 500, "{first}");

    let budget = Duration::from_secs(2);
    let retry = env.coordinator_with(&env.fresh_invoker(), Faults::default()).with_answer_budget(budget);
    let started = Instant::now();
    let (status, answer) = post_via(&retry, &body, Some("undecided")).await;
    let elapsed = started.elapsed();

    assert!(elapsed < budget + SLACK, "answered after {elapsed:?}: {answer}");
    assert_eq!((status, answer["error"]["code"].as_str()), (503, Some("UNAVAILABLE")), "{answer}");
    assert_eq!(answer["transactionId"], first["transactionId"]);
    let (_, got) = env.get(first["transactionId"].as_str().unwrap()).await;
    assert_eq!(got["status"], "PREPARING", "the answer said what the record says: undecided");
}

/// Decided but unfinished, with a participant slower than the budget: the retry of a transaction left
/// PREPARING past its deadline aborts it and answers 409 ABORTED; the retry of one left COMMITTING
/// answers 202 COMMITTING; each within the budget, with the id, and the sweeper finishes them.
#[tokio::test]
async fn a_retry_finding_its_transaction_decided_answers_within_the_budget_with_a_slow_participant() {
    let env = TestEnv::new().await;
    let budget = Duration::from_secs(2);
    for (round, (crash, action, expected)) in [
        (CoordinatorCrash::AfterPrepares(2), Action::Abort, (409, "ABORTED")),
        (CoordinatorCrash::AfterDecision, Action::Commit, (202, "COMMITTING")),
    ]
    .into_iter()
    .enumerate()
    {
        let (from, to) = (format!("A{round}"), format!("B{round}"));
        accounts(&env, &from, &to).await;
        let body = transfer(&from, &to, 1_000);
        let key = format!("decided-{round}");
        let stopped = env.coordinator_with(&env.fresh_invoker(), Faults::crash_at(crash));
        let (status, first) = post_via(&stopped, &body, Some(&key)).await;
        assert_eq!(status, 500, "{first}");
        env.clock.advance(resolvable_after(1_000) + 1);

        let slow = env.fresh_invoker();
        slow.set("service-b", action, EdgeFault::DelayReply(Duration::from_secs(12)));
        let retry = env.coordinator_with(&slow, Faults::default()).with_answer_budget(budget);
        let started = Instant::now();
        let (status, answer) = post_via(&retry, &body, Some(&key)).await;
        let elapsed = started.elapsed();

        assert!(elapsed < budget + SLACK, "{crash:?}: answered after {elapsed:?}: {answer}");
        assert_eq!((status, answer["status"].as_str()), (expected.0, Some(expected.1)), "{crash:?}: {answer}");
        assert_eq!(answer["transactionId"], first["transactionId"]);
    }
    env.clock.advance(60_000);
    env.sweep_until_quiet().await;
    assert_eq!(env.balance("service-a", "A0").await, "100");
    assert_eq!(env.balance("service-b", "B1").await, "10");
    assert_no_locks(&env).await;
}

/// A step that does not return (DynamoDB answers a record read 10 s late) is abandoned at the budget,
/// as a crash would abandon it: the answer is a 503 with the id, still well before API Gateway's 29 s.
#[tokio::test]
async fn a_store_that_does_not_answer_is_abandoned_at_the_budget() {
    let faults = DynamoFaults::new(0);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    accounts(&env, "A", "B").await;
    let body = transfer("A", "B", 15_000);
    let stopped = env.coordinator_with(&env.fresh_invoker(), Faults::crash_at(CoordinatorCrash::AfterCreate));
    let (_, first) = post_via(&stopped, &body, Some("hanging")).await;
    faults.add(
        Rule::new(DynamoFault::Late(Duration::from_secs(10))).operation("GetItem").table(env.transactions.table()),
    );

    let budget = Duration::from_secs(1);
    let retry = env.coordinator_with(&env.fresh_invoker(), Faults::default()).with_answer_budget(budget);
    let started = Instant::now();
    let (status, answer) = post_via(&retry, &body, Some("hanging")).await;
    let elapsed = started.elapsed();
    faults.clear();

    assert!(elapsed < budget + Duration::from_secs(1) + SLACK, "answered after {elapsed:?}: {answer}");
    assert_eq!((status, answer["error"]["code"].as_str()), (503, Some("UNAVAILABLE")), "{answer}");
    assert_eq!(answer["transactionId"], first["transactionId"]);
}

// ---------------------------------------------------------------------------------------------------
// Defect 2: no lock after the deadline and the clock margin
// ---------------------------------------------------------------------------------------------------

/// Calls participants as Lambda does: the participant's work goes on when the caller stops waiting
/// (a timeout drops only the caller's future). `settle` waits for every call still at work.
#[derive(Clone)]
struct Detached {
    inner: InProcessInvoker,
    running: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Detached {
    async fn settle(&self) {
        let running = std::mem::take(&mut *self.running.lock().unwrap());
        for call in running {
            call.await.expect("a participant call panicked");
        }
    }
}

impl ParticipantInvoker for Detached {
    fn invoke<'a>(
        &'a self,
        service: &'a str,
        request: &'a ParticipantRequest,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>> {
        let (inner, service_name, request) = (self.inner.clone(), service.to_owned(), request.clone());
        let (answer, answered) = tokio::sync::oneshot::channel();
        let call = tokio::spawn(async move {
            let _ = answer.send(inner.invoke(&service_name, &request).await);
        });
        self.running.lock().unwrap().push(call);
        Box::pin(async move {
            answered.await.unwrap_or_else(|_| {
                Err(InvokeError::Transport { service: service.to_owned(), message: "no answer".into() })
            })
        })
    }
}

/// The reported case: the lock write throttled 7 times, `timeoutMs` 1000: the client got 409 and 0.4 s
/// later the item was locked by the aborted transaction (the prepare's 12 attempts, with backoff of about
/// 41 s in all, never looked at the deadline again). Now every attempt checks `deadline + M` first and
/// no pause runs past it: the prepare gives up and nothing is ever locked.
#[tokio::test]
async fn a_prepare_whose_lock_writes_are_throttled_locks_nothing_after_the_abort() {
    let faults = DynamoFaults::new(0);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    // Before the fix: the 8th attempt (7 throttles) locked 0.3 s after the 409, the 12th (11) 20 s after.
    for (round, throttles) in [7, 11].into_iter().enumerate() {
        let (from, to) = (format!("A{round}"), format!("B{round}"));
        accounts(&env, &from, &to).await;
        faults.add(
            Rule::new(DynamoFault::Throttle).operation("UpdateItem").table(env.table("service-a")).times(throttles),
        );
        let invoker =
            Detached { inner: InProcessInvoker::new(env.participants.values().cloned()), running: Default::default() };
        let coordinator = Coordinator::new(
            env.transactions.clone(),
            Arc::new(invoker.clone()),
            env.participants.keys().cloned(),
            env.clock.clone(),
        );

        let (status, answer) = post_via(&coordinator, &transfer(&from, &to, 1_000), None).await;
        assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{answer}");
        invoker.settle().await;
        faults.clear();

        assert_no_locks(&env).await;
        // Every lock write it made was throttled: it stopped before the first one that would have gone through.
        let throttled = faults.fired();
        assert!(
            (2..=throttles as usize).contains(&throttled),
            "{throttles} throttles: {throttled} lock writes refused"
        );
        faults.forget();
    }
}

/// The same rule for a prepare on its own: an attempt is never made past `deadline + M`, whatever
/// the attempts before it cost, and the answer is a TIMEOUT refusal.
#[tokio::test]
async fn every_attempt_of_a_lock_write_checks_the_cutoff_first() {
    let faults = DynamoFaults::new(0);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    env.put_account("service-a", "A", "100").await;
    faults.add(Rule::new(DynamoFault::Throttle).operation("UpdateItem").table(env.table("service-a")));
    let deadline = env.clock_now() + 300;
    let prepare: ParticipantRequest = serde_json::from_value(json!({
        "action": "prepare", "transactionId": "tx-cutoff", "deadline": deadline, "startedAt": deadline - 300,
        "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": -1, "min": 0}]
    }))
    .unwrap();

    let answer = env.participants["service-a"].handle(&env.signed("service-a", prepare)).await.expect("an answer");

    assert_eq!(answer.code, Some(twopc::model::RefusalCode::Timeout), "{answer:?}");
    assert!(env.clock_now() > lock_cutoff(deadline), "it gave up at the cutoff, not before");
    assert!(env.clock_now() < lock_cutoff(deadline) + 300, "and not long after it");
    assert_no_locks(&env).await;
}

// ---------------------------------------------------------------------------------------------------
// Defect 3: clocks skewed by M/2 either way
// ---------------------------------------------------------------------------------------------------

/// A clock that moves only when the test moves it: the coordinator and the participants (each skewed
/// off it) see exactly the moments the test chooses.
#[derive(Debug)]
struct ManualClock(std::sync::atomic::AtomicU64);

impl ManualClock {
    fn new(now_ms: u64) -> Arc<ManualClock> {
        Arc::new(ManualClock(now_ms.into()))
    }
    fn set(&self, now_ms: u64) {
        self.0.store(now_ms, std::sync::atomic::Ordering::SeqCst);
    }
}

impl twopc::clock::Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Holds back the prepares to one service until the test opens it, and says when one arrives.
struct Hold {
    service: &'static str,
    arrived: tokio::sync::Notify,
    open: tokio::sync::Semaphore,
}

impl Hold {
    fn new(service: &'static str) -> Arc<Hold> {
        Arc::new(Hold { service, arrived: tokio::sync::Notify::new(), open: tokio::sync::Semaphore::new(0) })
    }
    fn open(&self) {
        self.open.add_permits(1_000);
    }
}

struct Held {
    inner: InProcessInvoker,
    hold: Option<Arc<Hold>>,
}

impl ParticipantInvoker for Held {
    fn invoke<'a>(
        &'a self,
        service: &'a str,
        request: &'a ParticipantRequest,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>> {
        Box::pin(async move {
            if let Some(hold) = &self.hold
                && service == hold.service
                && request.action == Action::Prepare
            {
                hold.arrived.notify_one();
                let _pass = hold.open.acquire().await.expect("never closed");
            }
            self.inner.invoke(service, request).await
        })
    }
}

/// A coordinator on `clock`, whose participants run on clocks of their own: `skews` (ms, by service)
/// off it; prepares to one service held back when `hold` is given.
fn skewed_coordinator(
    env: &TestEnv,
    clock: &Arc<ManualClock>,
    skews: &BTreeMap<&str, i64>,
    hold: Option<Arc<Hold>>,
) -> Coordinator {
    let participants: Vec<Participant> = env
        .participants
        .iter()
        .map(|(service, p)| {
            let base: SharedClock = clock.clone();
            let skewed: SharedClock = SkewedClock::new(base, skews.get(service.as_str()).copied().unwrap_or(0));
            Participant::new(service.clone(), p.table().clone(), env.transactions.clone(), skewed)
        })
        .collect();
    let invoker = Held { inner: InProcessInvoker::new(participants), hold };
    Coordinator::new(env.transactions.clone(), Arc::new(invoker), env.participants.keys().cloned(), clock.clone())
}

/// A participant running M/2 ahead gets a prepare 50 ms before the deadline by the coordinator's clock
/// (75 ms after it by its own): it still locks, and the transfer commits. (It used to refuse: TIMEOUT.)
/// Participants M/2 behind and M/2 ahead commit an ordinary transfer too.
#[tokio::test]
async fn a_prepare_reaching_a_participant_ahead_by_half_the_margin_just_before_the_deadline_commits() {
    let env = TestEnv::new().await;
    let half = (CLOCK_MARGIN_MS / 2) as i64;
    let start = env.clock_now();
    let clock = ManualClock::new(start);
    accounts(&env, "A", "B").await;
    let hold = Hold::new("service-a");
    let skews = BTreeMap::from([("service-a", half), ("service-b", -half)]);
    let coordinator = skewed_coordinator(&env, &clock, &skews, Some(hold.clone()));
    let first = tokio::spawn(async move { post_via(&coordinator, &transfer("A", "B", 1_000), None).await });
    hold.arrived.notified().await;
    clock.set(start + 950);
    hold.open();
    let (status, answer) = first.await.unwrap();
    assert_eq!(status, 200, "{answer}");

    accounts(&env, "C", "D").await;
    let skews = BTreeMap::from([("service-a", -half), ("service-b", half)]);
    let (status, answer) =
        post_via(&skewed_coordinator(&env, &clock, &skews, None), &transfer("C", "D", 1_000), None).await;
    assert_eq!(status, 200, "{answer}");
    assert_no_locks(&env).await;
}

/// A participant running M/2 ahead meets the lock of a transaction whose deadline has passed by its
/// clock but not by its coordinator's: it must not take the lock for expired and abort a transaction
/// that would otherwise commit (it used to: no record yet, so it recorded the holder ABORTED). It refuses
/// CONFLICT, and the holder commits; the refused transfer's retry (issue 35) waits for the holder's
/// decision and commits after it.
#[tokio::test]
async fn a_resolver_ahead_by_half_the_margin_never_aborts_a_live_transaction() {
    let env = TestEnv::new().await;
    let half = (CLOCK_MARGIN_MS / 2) as i64;
    let start = env.clock_now();
    let clock = ManualClock::new(start);
    accounts(&env, "A", "B").await;
    env.put_account("service-b", "C", "0").await;
    // T1 locks A; its prepare to service-b is held back.
    let hold = Hold::new("service-b");
    let t1 = skewed_coordinator(&env, &clock, &BTreeMap::new(), Some(hold.clone()));
    let first = tokio::spawn(async move { post_via(&t1, &transfer("A", "B", 1_000), None).await });
    hold.arrived.notified().await;
    while env.locked_items().await.is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // 60 ms before T1's deadline by its coordinator's clock: 65 ms past it by the clock of T2's service-a.
    clock.set(start + 940);
    let t2 = skewed_coordinator(&env, &clock, &BTreeMap::from([("service-a", half)]), None);
    let second = tokio::spawn(async move { post_via(&t2, &transfer("A", "C", 1_000), None).await });
    // T2's first attempt is refused and recorded aborted (presumed abort: its record says why).
    let refused = loop {
        let aborted = env.records().await.into_iter().find(|r| r["status"] == "ABORTED");
        if let Some(record) = aborted {
            break record;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(refused["participants"][0]["code"], "CONFLICT", "{refused}");

    hold.open();
    let (status, answer) = first.await.unwrap();
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "the holder commits: {answer}");
    let (status, retried) = second.await.unwrap();
    assert_eq!((status, retried["attempts"].as_u64()), (200, Some(2)), "the retry after the holder: {retried}");
    assert_eq!(env.balance("service-b", "B").await, "10");
    assert_eq!(env.balance("service-b", "C").await, "10");
    assert_no_locks(&env).await;
}
