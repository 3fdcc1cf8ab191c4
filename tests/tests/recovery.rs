//! Recovery: crashed coordinators, expired locks, and sweepers racing coordinators and each other.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use twopc::clock::{Clock, SharedClock, ShiftedClock};
use twopc::coordinator::Coordinator;
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::invoke::{InvokeError, ParticipantInvoker};
use twopc::model::{Action, ParticipantRequest, ParticipantResponse, Status};
use twopc_client::{Transaction, op};
use twopc_tests::{EdgeFault, FaultyInvoker, TestEnv, call_coordinator, rest_event};

fn transfer(from: &str, to: &str, amount: i64) -> Value {
    Transaction::new()
        .participant("service-a", [op::add(from, "balance", -amount).min(0)])
        .participant("service-b", [op::add(to, "balance", amount)])
        .to_json()
}

/// Posts through a coordinator that crashes at `crash`; returns the transaction id it was running.
async fn post_crashing(env: &TestEnv, body: &Value, crash: CoordinatorCrash) -> String {
    post_crashing_keyed(env, body, crash, None).await
}

/// [`post_crashing`] with an optional `Idempotency-Key`: a keyed request writes its record (PREPARING)
/// before it prepares; one without writes it only at the decision.
async fn post_crashing_keyed(env: &TestEnv, body: &Value, crash: CoordinatorCrash, key: Option<&str>) -> String {
    let coordinator = env.coordinator_with(&env.fresh_invoker(), Faults::crash_at(crash));
    let headers = key.map_or(json!({}), |key| json!({"Idempotency-Key": key}));
    let event = rest_event("POST", "/transactions", "/transactions", None, headers, Some(&body.to_string()));
    let (status, answer) = call_coordinator(&coordinator, &event).await;
    assert_eq!(status, 500, "{answer}");
    assert_eq!(answer["error"]["code"], "CRASHED");
    answer["transactionId"].as_str().unwrap().to_owned()
}

async fn status_of(env: &TestEnv, id: &str) -> Status {
    env.transactions.get(id).await.unwrap().expect("record").status
}

#[tokio::test]
async fn a_transaction_left_committing_is_finished_by_one_sweep() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    let id = post_crashing(&env, &transfer("A", "B", 30), CoordinatorCrash::AfterDecision).await;
    assert_eq!(status_of(&env, &id).await, Status::Committing);
    assert_eq!(env.locked_items().await.len(), 2);
    let (status, answer) = env.get(&id).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTING")));

    env.clock.advance(10_000);
    let report = env.sweeper(None).sweep().await.unwrap();

    assert_eq!(report.committed, 1, "{report:?}");
    let (status, answer) = env.get(&id).await;
    assert_eq!(status, 200);
    assert_eq!(answer["status"], "COMMITTED");
    assert_eq!(env.balance("service-a", "A").await, "70");
    assert_eq!(env.balance("service-b", "B").await, "30");
    assert!(env.locked_items().await.is_empty());
}

#[tokio::test]
async fn an_expired_lock_whose_owner_is_committing_is_rolled_forward_not_taken() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    env.put_account("service-b", "C", "0").await;
    let owner = post_crashing(&env, &transfer("A", "B", 30), CoordinatorCrash::AfterDecision).await;
    env.clock.advance(10_000);

    // A new transfer meets the owner's expired lock on A: A must first receive the owner's -30.
    let (status, answer) = env.post(&transfer("A", "C", 50), None).await;

    assert_eq!(status, 200, "{answer}");
    assert_eq!(env.balance("service-a", "A").await, "20");
    assert_eq!(env.balance("service-b", "C").await, "50");
    let a = env.item("service-a", "A").await.unwrap();
    assert_eq!(a["version"], json!(2), "both commits applied to A, each once");
    // A transfer of 80 would have passed the guard had the lock simply been taken (100 - 80 >= 0).
    let (status, _) = env.post(&transfer("A", "C", 80), None).await;
    assert_eq!(status, 409);
    // B still holds the owner's lock until a sweep finishes the owner.
    env.sweep_until_quiet().await;
    assert_eq!(env.balance("service-b", "B").await, "30");
    assert_eq!(status_of(&env, &owner).await, Status::Committed);
    assert!(env.locked_items().await.is_empty());
}

#[tokio::test]
async fn a_sweeper_abort_that_wins_the_race_makes_the_coordinator_abort() {
    let env = TestEnv::new().await;
    // Keyed: the sweeper aborts the PREPARING record. Unkeyed: there is no record yet, so it resolves
    // the two expired locks, recording the owner ABORTED first.
    for (round, key) in [Some("sweeper-wins"), None].into_iter().enumerate() {
        let (from, to) = (format!("A{round}"), format!("B{round}"));
        env.put_account("service-a", &from, "100").await;
        env.put_account("service-b", &to, "0").await;
        // service-b prepares, then its answer takes a while; meanwhile a sweeper whose clock is past the
        // deadline aborts the transaction.
        let invoker = env.fresh_invoker();
        // Long enough that the sweep below ends first even on a loaded machine (at 600 ms a busy CI
        // machine let the prepare answer first and the coordinator release a lock itself).
        invoker.set("service-b", Action::Prepare, EdgeFault::Delay(Duration::from_secs(2)));
        let coordinator = env.coordinator_with(&invoker, Faults::default());
        let body = transfer(&from, &to, 30).to_string();
        let headers = key.map_or(json!({}), |key| json!({"Idempotency-Key": key}));
        let event = rest_event("POST", "/transactions", "/transactions", None, headers, Some(&body));
        let client = tokio::spawn(async move { call_coordinator(&coordinator, &event).await });
        let waited = std::time::Instant::now();
        while env.locked_items().await.len() < 2 {
            assert!(!client.is_finished(), "the transfer ended before its delayed prepare answered");
            assert!(waited.elapsed() < Duration::from_secs(10), "the prepares never took their locks");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Past the transfer's deadline, twice the clock margin and the sweeper's grace; within the window
        // in which a participant accepts what the sweeper signs.
        let late = ShiftedClock::new();
        late.advance(10_000);
        let report = env.sweeper(Some(late as SharedClock)).sweep().await.unwrap();
        match key {
            Some(_) => assert_eq!(report.aborted, 1, "{report:?}"),
            None => assert_eq!((report.aborted, report.locks_released), (0, 2), "{report:?}"),
        }

        let (status, answer) = client.await.unwrap();

        assert_eq!(status, 409, "the coordinator follows the winning abort: {answer}");
        assert_eq!(answer["status"], "ABORTED");
        let id = answer["transactionId"].as_str().unwrap();
        assert_eq!(status_of(&env, id).await, Status::Aborted);
        assert_eq!(env.balance("service-a", &from).await, "100");
        assert_eq!(env.balance("service-b", &to).await, "0");
        assert!(env.locked_items().await.is_empty());
    }
}

#[tokio::test]
async fn a_coordinator_that_stops_before_deciding_leaves_no_record_and_its_locks_are_released() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    let id = post_crashing(&env, &transfer("A", "B", 30), CoordinatorCrash::AfterPrepares(2)).await;
    // Presumed abort: nothing is recorded before the decision.
    assert_eq!(env.get(&id).await.0, 404);
    assert_eq!(env.locked_items().await.len(), 2);
    // Before the deadline the locks stand: a transaction begun since is refused (CONFLICT by the older
    // lock; its retry, holding nothing, waits for it as long as its own deadline allows: TIMEOUT).
    let (status, answer) = env.post(&transfer("A", "B", 5), None).await;
    assert_eq!(status, 409, "{answer}");
    assert!(["CONFLICT", "TIMEOUT"].contains(&answer["participants"][0]["code"].as_str().unwrap_or("")), "{answer}");
    assert!(answer["ageToken"].is_string(), "a refusal for contention carries an age token: {answer}");

    env.clock.advance(60_000);
    let report = env.sweeper(None).sweep().await.unwrap();

    assert_eq!(report.locks_released, 2, "{report:?}");
    let (status, answer) = env.get(&id).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("ABORTED")));
    assert_eq!(env.balance("service-a", "A").await, "100");
    assert_eq!(env.balance("service-b", "B").await, "0");
    assert!(env.locked_items().await.is_empty());
}

#[tokio::test]
async fn a_coordinator_decision_that_wins_makes_recovery_commit() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    // Keyed, so the record is PREPARING while the participants prepare. The decision below is written
    // without the votes, so without tokens: B's credit has a `max` to take the lock (a pending credit, which
    // only its token tells from a late copy's, is never committed without one).
    let mut body = transfer("A", "B", 30);
    body["participants"][1]["operations"][0]["max"] = serde_json::json!(1_000_000);
    let id = post_crashing_keyed(&env, &body, CoordinatorCrash::AfterPrepares(2), Some("decision-wins")).await;
    // Recovery read the record while it was PREPARING...
    let stale = env.transactions.get(&id).await.unwrap().unwrap();
    assert_eq!(stale.status, Status::Preparing);
    // ...and the coordinator's decision lands before recovery's abort write.
    let decided =
        env.transactions.transition(&id, Status::Preparing, Status::Committing, true, env.clock_now(), None, None);
    assert!(matches!(decided.await.unwrap(), twopc::record::Transition::Done(_)));
    env.clock.advance(60_000);

    // The sweeper's rule is the coordinator's recover(): drive the stale view through it.
    let coordinator = env.coordinator_with(&env.fresh_invoker(), Faults::default());
    let finished = coordinator.recover(stale).await.unwrap().record;

    assert_eq!(finished.status, Status::Committed);
    assert_eq!(env.balance("service-a", "A").await, "70");
    assert_eq!(env.balance("service-b", "B").await, "30");
    assert!(env.locked_items().await.is_empty());
}

/// service-b's prepare does its work at once and answers after `delay`; with `past_deadline`, the shared
/// clock has moved past the transaction's deadline by the time the answer arrives.
struct SlowPrepare {
    inner: FaultyInvoker,
    clock: Arc<ShiftedClock>,
    delay: Duration,
    past_deadline: bool,
}

impl ParticipantInvoker for SlowPrepare {
    fn invoke<'a>(
        &'a self,
        service: &'a str,
        request: &'a ParticipantRequest,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>> {
        Box::pin(async move {
            let answer = self.inner.invoke(service, request).await;
            if service == "service-b" && request.action == Action::Prepare {
                tokio::time::sleep(self.delay).await;
                if self.past_deadline {
                    let deadline = request.deadline.expect("a prepare carries its deadline");
                    self.clock.advance(deadline.saturating_sub(self.clock.now_ms()) + 1);
                }
            }
            answer
        })
    }
}

#[tokio::test]
async fn a_sweeper_and_a_coordinator_never_produce_two_outcomes() {
    /// How a round's last vote lands against its deadline.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Landing {
        /// Well within it (5 s of timeout): the coordinator commits.
        InTime,
        /// After it, by the controllable clock: the coordinator, or a sweeper first, aborts.
        Late,
        /// Around it, in real time (a 300 ms timeout): either outcome, but only one.
        Racing(u64),
    }
    let env = TestEnv::new().await;
    // No grace: the sweeper acts the moment a deadline passes.
    let limits = twopc::sweeper::SweepLimits { grace_ms: 0, ..Default::default() };
    let sweeper = Arc::new(env.sweeper_with(None, limits));
    let rounds = [
        Landing::InTime,
        Landing::Late,
        Landing::Racing(150),
        Landing::Racing(250),
        Landing::Racing(350),
        Landing::Racing(450),
        Landing::InTime,
        Landing::Late,
    ];
    let mut outcomes = vec![];
    for (round, landing) in rounds.into_iter().enumerate() {
        let (from, to) = (format!("A{round}"), format!("B{round}"));
        env.put_account("service-a", &from, "100").await;
        env.put_account("service-b", &to, "0").await;
        let (timeout_ms, delay) = match landing {
            Landing::InTime => (5_000, 50),
            Landing::Late => (300, 50),
            Landing::Racing(delay) => (300, delay),
        };
        let invoker = SlowPrepare {
            inner: env.fresh_invoker(),
            clock: env.clock.clone(),
            delay: Duration::from_millis(delay),
            past_deadline: landing == Landing::Late,
        };
        let coordinator = Coordinator::new(
            env.transactions.clone(),
            Arc::new(invoker),
            env.participants.keys().cloned(),
            env.clock.clone(),
        );
        let mut body = transfer(&from, &to, 10);
        body["timeoutMs"] = json!(timeout_ms);
        let event = rest_event("POST", "/transactions", "/transactions", None, json!({}), Some(&body.to_string()));
        let client = tokio::spawn(async move { call_coordinator(&coordinator, &event).await });
        let racing = {
            let sweeper = sweeper.clone();
            tokio::spawn(async move {
                for _ in 0..40 {
                    sweeper.sweep().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            })
        };
        let (status, answer) = client.await.unwrap();
        racing.await.unwrap();
        let id = answer["transactionId"].as_str().unwrap();
        let record = status_of(&env, id).await;
        let (a, b) = (env.balance("service-a", &from).await, env.balance("service-b", &to).await);
        match status {
            200 => assert_eq!((record, a.as_str(), b.as_str()), (Status::Committed, "90", "10"), "{landing:?}"),
            409 => assert_eq!((record, a.as_str(), b.as_str()), (Status::Aborted, "100", "0"), "{landing:?}"),
            other => panic!("unexpected answer {other} ({landing:?}): {answer}"),
        }
        match landing {
            Landing::InTime => assert_eq!(status, 200, "every vote in time, nothing to abort: {answer}"),
            Landing::Late => assert_eq!(status, 409, "the last vote came after the deadline: {answer}"),
            Landing::Racing(_) => {}
        }
        outcomes.push((landing, status));
    }
    println!("outcomes: {outcomes:?}");
    env.clock.advance(60_000);
    env.sweep_until_quiet().await;
    assert!(env.locked_items().await.is_empty());
}

#[tokio::test]
async fn two_sweepers_at_once_never_double_apply() {
    let env = TestEnv::new().await;
    let crashes = [
        CoordinatorCrash::AfterDecision,
        CoordinatorCrash::AfterCommits(1),
        CoordinatorCrash::BeforeTerminal,
        CoordinatorCrash::AfterDecision,
        CoordinatorCrash::AfterCommits(1),
    ];
    for (i, crash) in crashes.iter().enumerate() {
        env.put_account("service-a", &format!("A{i}"), "100").await;
        env.put_account("service-b", &format!("B{i}"), "0").await;
        post_crashing(&env, &transfer(&format!("A{i}"), &format!("B{i}"), 25), *crash).await;
    }
    env.clock.advance(60_000);
    let (one, two) = (env.sweeper(None), env.sweeper(None));

    let (first, second) = futures::join!(one.sweep(), two.sweep());

    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.committed + second.committed, 5, "each transaction finished once: {first:?} {second:?}");
    env.sweep_until_quiet().await;
    for i in 0..crashes.len() {
        assert_eq!(env.balance("service-a", &format!("A{i}")).await, "75");
        assert_eq!(env.balance("service-b", &format!("B{i}")).await, "25");
        assert_eq!(env.item("service-b", &format!("B{i}")).await.unwrap()["version"], json!(1));
    }
    assert!(env.locked_items().await.is_empty());
}
