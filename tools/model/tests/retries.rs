//! Issue 35: a request refused for contention (CONFLICT) is retried by its coordinator keeping its age
//! (wait-die's order), and the oldest contending request is never refused for ever (`twopc_model::age`;
//! DETAILS.md, "Retries that keep their age").
//!
//! The first tests check the protocol as the code implements it (a retry prepares one participant at a
//! time from where its predecessor was refused, its first prepare, holding no lock, waiting for any lock)
//! over every reachable state: every property holds, no wait closes a cycle, and every `sometimes` check is
//! met. The others switch one change back at a time and assert the checker finds what it prevents, printing
//! the trace (breadth first, so a short one, which may run a step or two past the violation: stateright
//! hands work out in batches).
//!
//! `MODEL_BIG=1` checks `three_requests` with every request keyed and replayed, two faults of each kind.

use twopc_model::age::{
    AAnswer, ALL_END, AgeBudget, AgeConfig, AgeEvent, AgeModel, AgeSwitches, AgeViolation, Attempt, NO_CYCLE, Prep,
    RPc, WITHIN_BOUND, check,
};

/// A lost claim reply and a crash between the claim and the next attempt, one of each.
const FAULTS: AgeBudget = AgeBudget { crash: 1, claim_reply: 1 };

const GIVES_UP: &str = "no request gives up: every request commits within the attempt bound";
const BY_YOUNGER: &str = "no request is refused CONFLICT by a request that started after it";

fn big() -> bool {
    std::env::var("MODEL_BIG").is_ok_and(|v| v == "1")
}

fn switched(cfg: AgeConfig, f: impl FnOnce(&mut AgeSwitches)) -> AgeModel {
    let mut sw = AgeSwitches::default();
    f(&mut sw);
    AgeModel::new(cfg.switches(sw))
}

/// L0 (unkeyed) and L1 (keyed, replayed once): L1 needs two attempts at most.
#[test]
fn two_requests() {
    let run = check(AgeModel::new(AgeConfig::two(FAULTS)), None);
    run.assert_all_hold();
    assert!(run.unique > 1_000, "not vacuous: {} states", run.unique);
}

/// L0, L1 (keyed, replayed once) and L2, a later arrival: L2 needs four attempts at most (each refused
/// attempt names one of L0's, L1's and L1-2's attempts, none twice), and no request more than
/// `AgeConfig::bound_of` its place.
#[test]
fn three_requests() {
    let cfg =
        if big() { AgeConfig::three_keyed(AgeBudget { crash: 2, claim_reply: 2 }) } else { AgeConfig::three(FAULTS) };
    let run = check(AgeModel::new(cfg), None);
    run.assert_all_hold();
    assert!(run.unique > 100_000, "not vacuous: {} states", run.unique);
}

/// The bound, measured: with attempts to spare (`MAX_ATTEMPTS` 8), no request Lk makes more than 2^k
/// attempts, and each makes that many on some path: at most 1, 2 attempts with two requests, 1, 2, 4 with
/// three.
#[test]
fn the_bound_holds_with_attempts_to_spare() {
    for cfg in [AgeConfig::two(AgeBudget::default()), AgeConfig::three(AgeBudget::default())] {
        let run = check(AgeModel::new(cfg.max_attempts(8)), None);
        run.assert_all_hold();
        let bound: Vec<u8> = (0..run.model.cfg.requests.len()).map(AgeConfig::bound_of).collect();
        assert_eq!(run.model.most_attempts(), bound, "the most attempts of L0, L1, ...");
    }
}

/// The bound is tight: with one attempt fewer than `AgeConfig::bound`, the youngest request may be refused
/// at every attempt and give up (two requests: L1 refused by L0; three: L2's attempts naming L0, L1, L1-2).
#[test]
fn the_bound_is_tight() {
    for cfg in [AgeConfig::two(AgeBudget::default()), AgeConfig::three(AgeBudget::default())] {
        let bound = cfg.bound();
        let cfg = cfg.max_attempts(bound - 1);
        let run = check(AgeModel::new(cfg), Some(GIVES_UP));
        let path = run.expect_counterexample(GIVES_UP);
        let last = path.last_state();
        let youngest = run.model.cfg.requests.len() - 1;
        assert_eq!(last.coords[youngest].n, run.model.cfg.max_attempts, "the youngest gave up at its last attempt");
        assert!(!last.violated(AgeViolation::RefusedByYounger), "refused by older requests only");
        assert!(!last.violated(AgeViolation::NamedTwice), "a different older attempt each time");
    }
}

/// Before issue 35 (`kept_age` off): a retry is a new transaction, as young as the clock at its start. L1 is
/// refused by L0 and comes back younger than L2, which arrived after L1's first attempt: L2's lock refuses
/// its second prepare. Every refusal is then also a chance to be refused again: L1, with one older request,
/// makes more than two attempts.
#[test]
fn before_35_a_retry_that_loses_its_age_is_refused_by_a_later_request() {
    let model = switched(AgeConfig::three(AgeBudget::default()), |s| s.kept_age = false);
    let run = check(model.clone(), Some(BY_YOUNGER));
    let path = run.expect_counterexample(BY_YOUNGER);
    let last = path.last_state();
    assert!(last.violated(AgeViolation::RefusedByYounger));
    assert!(last.coords[1].n >= 2 && last.coords[1].age > last.coords[2].age, "L1's retry is younger than L2");
    let run = check(model, Some(WITHIN_BOUND));
    let path = run.expect_counterexample(WITHIN_BOUND);
    assert!(path.last_state().coords[1].n > AgeConfig::bound_of(1), "L1 past its bound");
}

/// The wait limit before issue 35 (`older_waits` off, `MAX_LOCK_WAIT_MS = 200` with CONFLICT): L0, the
/// oldest, waits for L1's lock on one item, gives up and is refused CONFLICT because of a younger request;
/// it is retried, and refused so again: nothing bounds the attempts of the oldest one.
#[test]
fn before_35_the_wait_limit_refuses_the_oldest_request() {
    let model = switched(AgeConfig::two(AgeBudget::default()), |s| s.older_waits = false);
    let run = check(model.clone(), Some(BY_YOUNGER));
    let path = run.expect_counterexample(BY_YOUNGER);
    assert!(path.last_state().violated(AgeViolation::OldestRefused), "the refused one is L0");
    let run = check(model, Some(GIVES_UP));
    let path = run.expect_counterexample(GIVES_UP);
    assert!(path.last_state().violated(AgeViolation::GaveUp));
}

/// `retry_waits_at_refusal` off: the retry prepares as a first attempt does, both participants at once with
/// wait-die, and at once: the attempt that refused it still holds its lock undecided, and refuses it again,
/// attempt after attempt: L1 gives up while L0 has not even decided.
#[test]
fn a_retry_that_does_not_wait_at_its_refusal_runs_out_of_attempts() {
    let model = switched(AgeConfig::two(AgeBudget::default()), |s| s.retry_waits_at_refusal = false);
    let run = check(model, Some(GIVES_UP));
    let path = run.expect_counterexample(GIVES_UP);
    let last = path.last_state();
    assert!(last.violated(AgeViolation::GaveUp));
    assert!(last.violated(AgeViolation::NamedTwice), "L0's attempt named twice");
    assert!(!last.violated(AgeViolation::RefusedByYounger), "refused by L0 only");
}

/// `one_at_a_time` off: a retry's prepares go out at once, the first still saying it holds no lock. L1-2
/// locks B, and its prepare at A waits for L0's lock there, whatever the age, while L0, older, waits for
/// L1-2's lock on B: a cycle of waits, which nothing ends (no wait budget in the model). The checker finds
/// the cycle (an `always` property) and the stuck state (no request can end: the `eventually` property).
#[test]
fn a_retry_whose_prepares_go_out_at_once_can_deadlock() {
    // Without hot first attempts, whose shortest deadlock (6 steps) is L1's first attempt's, the same way.
    let cfg = AgeConfig::two(AgeBudget::default()).hot_first_attempts(false).max_attempts(4);
    let model = switched(cfg, |s| s.one_at_a_time = false);
    let run = check(model.clone(), Some(NO_CYCLE));
    let path = run.expect_counterexample(NO_CYCLE);
    let last = path.last_state();
    assert!(last.wait_cycle());
    let run = check(model, Some(ALL_END));
    let path = run.expect_counterexample(ALL_END);
    let last = path.last_state();
    assert!(last.wait_cycle(), "stuck in the cycle of waits");
    assert!(
        last.coords.iter().all(|c| c.preps.iter().any(|p| matches!(p, Prep::Waiting(_)))),
        "both requests wait, for ever"
    );
}

/// The correction `decided_owner_settled` (design.md as written: off; the code settles such a lock,
/// `settle_owner`): L1 is refused at B by L0; L1-2 locks B (L0's commit landed there) and its prepare at A
/// meets L0's lock, L0 decided commit and its commit to A still on its way, and is refused CONFLICT again by
/// the same attempt: L1 gives up, refused at every attempt by L0's one attempt.
#[test]
fn design_35_a_decided_blockers_lock_refuses_the_retry_again() {
    let model = switched(AgeConfig::two(AgeBudget::default()), |s| s.decided_owner_settled = false);
    let run = check(model, Some(GIVES_UP));
    let path = run.expect_counterexample(GIVES_UP);
    let last = path.last_state();
    assert!(last.saw(AgeEvent::RefusedByDecided), "refused by a decided attempt");
    assert!(last.violated(AgeViolation::GaveUp) && last.violated(AgeViolation::NamedTwice));
}

/// The correction `replay_waits_for_retry` (design.md as written: off, "the answer is the last record's"; the
/// code waits while the attempt `may_be_retried`, then fences the next one): L1-1 is aborted (refused by L0)
/// and recorded ABORTED; before its coordinator claims L1-2, the client's retry of the key finds L1-1
/// ABORTED, naming no successor, and answers 409; then the coordinator claims L1-2, which commits: the client
/// was told "aborted" of a request that committed.
#[test]
fn design_35_a_replay_answers_409_for_a_chain_that_then_commits() {
    let model = switched(AgeConfig::two(AgeBudget::default()), |s| s.replay_waits_for_retry = false);
    let name = "every answer, the coordinator's and a replay's, agrees with the chain";
    let run = check(model, Some(name));
    let path = run.expect_counterexample(name);
    let last = path.last_state();
    assert_eq!(last.replays[1], RPc::Answered(AAnswer::Conflict), "the replay answered 409");
    assert!(last.record(Attempt { req: 1, n: 2 }).is_some_and(|r| r.status.commit()), "L1-2 decided commit");
}
