//! Issue 41: retry chains with holds and age tokens together (`twopc_model::chain`; DETAILS.md, "Retry
//! chains with holds and age tokens").
//!
//! The first tests check the fixed protocol over every reachable state: every property holds and every
//! `sometimes` check is met. The others switch one fix off at a time and assert the checker finds the defect
//! it prevents, printing the trace (breadth first, cut at the first state that violates the property:
//! `Run::expect_violation`; not always the shortest, as the checker's threads hand work out in batches).
//!
//! The configurations are small (seconds at most: no locks, a vote left to chance): `together` has
//! `MAX_ATTEMPTS` 4 and two faults of each kind already. One `MODEL_BIG` configuration: `together` with the
//! operator's abort too (issue 47).

use twopc_model::chain::{
    ALL_END, Body, CAnswer, CPc, ChainBudget, ChainConfig, ChainModel, ChainSwitches, DECISIONS, Decider, FIRST, Id,
    KEY_ANSWERS, LINKS, OPERATOR_ENDS, OWN_BODY, OWN_OUTCOME, OWN_REFUSAL, RPc, TOKEN_RETRY, check,
};

/// A crash between a link and the next attempt, a failed token retry write, a resolver racing a slow
/// coordinator: two of each.
const FAULTS: ChainBudget = ChainBudget { crash: 2, write_fails: 2, resolver: 2 };

/// The configuration with one fix (or two) switched off. The defect tests run small sizes (`MAX_ATTEMPTS` 2,
/// no fault, a replay only where the defect needs one), for short traces.
fn switched(cfg: ChainConfig, f: impl FnOnce(&mut ChainSwitches)) -> ChainModel {
    let mut sw = ChainSwitches::default();
    f(&mut sw);
    ChainModel::new(cfg.switches(sw))
}

/// K1 held, `MAX_ATTEMPTS` 4: its caller commits and aborts it (to its first id or the answered one), its key
/// is replayed, a resolver may race its slow coordinator, and its holds expire.
#[test]
fn held() {
    let run = check(ChainModel::new(ChainConfig::held(FAULTS).max_attempts(4)), None);
    run.assert_all_hold();
    assert!(run.unique > 300, "not vacuous: {} states", run.unique);
}

/// K1 refused for contention, retried with its age token under K2, another body under K2, each key replayed
/// twice; `MAX_ATTEMPTS` 4.
#[test]
fn tokens() {
    let run = check(ChainModel::new(ChainConfig::tokens(FAULTS).max_attempts(4)), None);
    run.assert_all_hold();
    assert!(run.unique > 5_000, "not vacuous: {} states", run.unique);
}

/// Both: K1 held with its caller's commit and abort, its token retry (held too: the same body) under K2,
/// another body under K2, each key replayed twice; `MAX_ATTEMPTS` 4, two faults of each kind.
#[test]
fn together() {
    let cfg = ChainConfig::together(FAULTS).max_attempts(4);
    let run = check(ChainModel::new(cfg), None);
    run.assert_all_hold();
    assert!(run.unique > 10_000, "not vacuous: {} states", run.unique);
}

/// Issue 47: an operator's abort (`POST /admin/transactions/{id}/abort`) of K1's request, not held, sent at
/// any moment to any of its attempts: it races its coordinator's commit (PREPARING → COMMITTING), its
/// contention abort naming the next attempt (and that attempt's create), a resolver, the replays and the
/// token retry; `MAX_ATTEMPTS` 4, two faults of each kind.
#[test]
fn operator() {
    let run = check(ChainModel::new(ChainConfig::operator(FAULTS).max_attempts(4)), None);
    run.assert_all_hold();
    assert!(run.unique > 5_000, "not vacuous: {} states", run.unique);
}

/// Issue 47, held: `held` (its caller's commit and abort, the hold's expiry) with the operator's abort too,
/// which races the coordinator's PREPARED write, its contention abort, and the caller's routes.
#[test]
fn operator_held() {
    let run = check(ChainModel::new(ChainConfig::operator_held(FAULTS).max_attempts(4)), None);
    run.assert_all_hold();
    assert!(run.unique > 5_000, "not vacuous: {} states", run.unique);
}

/// Issue 47, everything together: `together` with the operator's abort of K1's request. With `MODEL_BIG=1`
/// only: 9,349,573 states, about 4 minutes on two threads (CI runs `operator` and `operator_held`).
#[test]
fn together_with_the_operator() {
    if !std::env::var("MODEL_BIG").is_ok_and(|v| v == "1") {
        eprintln!("together_with_the_operator: MODEL_BIG=1 runs it");
        return;
    }
    let cfg = ChainConfig::together(FAULTS).max_attempts(4).with_operator(true);
    let run = check(ChainModel::new(cfg), None);
    run.assert_all_hold();
}

/// Defect 1 (`own_refusal_only` off: the coordinator retries whatever aborted its attempt). The caller
/// aborts its held request while K1 still prepares (200 ABORTED); K1's votes come back CONFLICT, its abort
/// loses to the caller's, it folds its votes into the record it found, claims K1-2 and runs it: K1-2 is held
/// PREPARED, and the caller's commit of the id the POST answered commits it: a payment the caller rejected.
#[test]
fn defect_41_1_a_coordinator_retries_over_its_callers_abort() {
    let model =
        switched(ChainConfig::held(ChainBudget::default()).max_attempts(2).replays(0), |s| s.own_refusal_only = false);
    let run = check(model.clone(), Some(OWN_REFUSAL));
    let path = run.expect_violation(OWN_REFUSAL);
    let last = path.last_state();
    let k1 = last.record(Id { ns: 0, n: 1 }).expect("K1");
    assert_eq!(k1.by, Some(Decider::Caller), "K1 was aborted by its caller");
    assert!(last.record(Id { ns: 0, n: 2 }).is_some(), "and K1-2 follows it");
    let run = check(model, Some(KEY_ANSWERS));
    let path = run.expect_violation(KEY_ANSWERS);
    let last = path.last_state();
    assert_eq!(last.routes[1].map(|a| a.answer), Some(CAnswer::AbortedOk), "the caller's abort: 200 ABORTED");
    assert_eq!(last.routes[0].map(|a| a.answer), Some(CAnswer::Committed), "its commit: 200 COMMITTED");
}

/// Defect 1's second part (`routes_follow_chain` off: the caller's commit and abort act on the id they are
/// sent to). K1 is refused for contention and retried as K1-2; the caller's abort sent to K1 answers 200
/// ABORTED while K1-2 lives; K1-2 is held PREPARED and the caller's commit of the answered id commits it.
#[test]
fn defect_41_1_a_route_to_a_retried_attempt_answers_aborted_while_its_successor_lives() {
    let model = switched(ChainConfig::held(ChainBudget::default()).max_attempts(2).replays(0), |s| {
        s.routes_follow_chain = false
    });
    let run = check(model, Some(KEY_ANSWERS));
    let path = run.expect_violation(KEY_ANSWERS);
    let last = path.last_state();
    let k1 = last.record(Id { ns: 0, n: 1 }).expect("K1");
    assert_eq!(k1.by, Some(Decider::Own), "K1 was refused for contention by its coordinator");
    assert_eq!(last.routes[1].map(|a| (a.answer, a.from)), Some((CAnswer::AbortedOk, Some(Id { ns: 0, n: 1 }))));
    assert!((2..=2).any(|n| last.record(Id { ns: 0, n }).is_some_and(|r| r.status.commit())), "K1-2 committed");
}

/// The design's "the held commit/abort follows the coordinator chain", made precise
/// (`routes_fence_successor` off: a route stops at a link to no record, and answers from the attempt it
/// has). K1 is refused for contention and links K1-2 in its abort; before K1-2's record is created, the
/// caller's abort finds K1 ABORTED naming K1-2, which has no record, and answers 200 ABORTED from K1; K1-2 is
/// then created, held, and committed by the caller's commit of the id the POST answered. With the fix the
/// route fences K1-2 (ABORTED), as a replay does, and the coordinator's create loses to the fence.
#[test]
fn design_41_a_route_that_stops_at_a_link_to_no_record_answers_aborted_before_the_successor_commits() {
    // A link without a record (the two writes of the coordinator before `link_with_record`; since then, only
    // records written by an older coordinator): the window the route meets.
    let model = switched(ChainConfig::held(ChainBudget::default()).max_attempts(2).replays(0), |s| {
        s.routes_fence_successor = false;
        s.link_with_record = false;
    });
    let run = check(model, Some(KEY_ANSWERS));
    let path = run.expect_violation(KEY_ANSWERS);
    let last = path.last_state();
    assert_eq!(last.routes[1].map(|a| (a.answer, a.from)), Some((CAnswer::AbortedOk, Some(Id { ns: 0, n: 1 }))));
    assert!(last.record(Id { ns: 0, n: 2 }).is_some_and(|r| r.status.commit()), "K1-2 committed");
}

/// The review of defect 1's fix (`route_refollows_after_lost_write` off: a route whose conditional write
/// lost goes on from the record found at the attempt it read, as the code did before). The caller's abort
/// reads K1 PREPARING; before its write, K1's votes come back CONFLICT and its coordinator writes PREPARING →
/// ABORTING with `retriedAs` K1-2; the route's write (expects PREPARING) loses, and it answers 200 ABORTED
/// from K1, while K1-2 is created, held PREPARED, and committed by the caller's commit of the answered id.
/// With the fix the route follows the chain again from K1 and aborts K1-2 (or fences it, not yet created).
#[test]
fn defect_41_review_a_held_abort_that_loses_its_write_stops_at_the_attempt_it_read() {
    let model = switched(ChainConfig::held(ChainBudget::default()).max_attempts(2).replays(0), |s| {
        s.route_refollows_after_lost_write = false
    });
    let run = check(model, Some(KEY_ANSWERS));
    let path = run.expect_violation(KEY_ANSWERS);
    let last = path.last_state();
    let k1 = last.record(Id { ns: 0, n: 1 }).expect("K1");
    assert_eq!(k1.by, Some(Decider::Own), "K1 was refused for contention by its coordinator");
    assert_eq!(k1.retried_as, Some(Id { ns: 0, n: 2 }), "naming K1-2");
    assert_eq!(last.routes[1].map(|a| (a.answer, a.from)), Some((CAnswer::AbortedOk, Some(Id { ns: 0, n: 1 }))));
    assert!(last.record(Id { ns: 0, n: 2 }).is_some_and(|r| r.status.commit()), "K1-2 committed");
    // The same, read against the records: the caller's 200 ABORTED while an attempt of K1's commits.
    let run = check(run.model.clone(), Some(OWN_OUTCOME));
    run.expect_violation(OWN_OUTCOME);
}

/// Defect 2 (`atomic_token_claim` off: the token retry's claim is written before its record). The token
/// retry claims K1 for K2; before its record is written (its write fails, or it is slower), another body
/// under K2 creates K2's record and runs: the claim names a transaction of another body.
#[test]
fn defect_41_2_a_token_claim_names_another_bodys_transaction() {
    let model = switched(ChainConfig::tokens(ChainBudget::default()).max_attempts(2).replays(1), |s| {
        s.atomic_token_claim = false
    });
    let run = check(model, Some(LINKS));
    let path = run.expect_violation(LINKS);
    let last = path.last_state();
    assert!(last.record(Id { ns: 1, n: 1 }).is_some_and(|r| r.body == Body::Y), "K2 runs body Y");
    // With the claim's old kind of link too (the code before both fixes), K1's replay follows it into the
    // other body's outcome: a key answered with another request's outcome.
    let model = switched(ChainConfig::tokens(ChainBudget::default()).max_attempts(2).replays(1), |s| {
        s.atomic_token_claim = false;
        s.token_links_apart = false;
    });
    let run = check(model, Some(OWN_BODY));
    let path = run.expect_violation(OWN_BODY);
    let last = path.last_state();
    let said: Vec<_> = last.replays[0].iter().filter_map(RPc::said).collect();
    assert!(
        said.iter().any(|a| a.from.and_then(|f| last.record(f)).is_some_and(|r| r.body == Body::Y)),
        "K1's replay answered body Y's outcome"
    );
}

/// Defect 3 (`token_links_apart` off: the token claim writes `retriedAs`). K1 is refused for contention:
/// 409 ABORTED with an age token; the token retry under K2 claims K1 (`retriedAs` = K2) and commits; K1's
/// replay follows `retriedAs` into it and answers 200 COMMITTED: one key, both outcomes.
#[test]
fn defect_41_3_a_keys_replay_follows_a_token_retry_into_another_outcome() {
    let model = switched(ChainConfig::tokens(ChainBudget::default()).max_attempts(2).replays(1), |s| {
        s.token_links_apart = false
    });
    let run = check(model, Some(KEY_ANSWERS));
    let path = run.expect_violation(KEY_ANSWERS);
    let last = path.last_state();
    assert_eq!(last.coords[FIRST as usize].said.map(|a| a.answer), Some(CAnswer::Aborted), "K1's POST: 409");
    assert!(
        last.replays[0].iter().any(|r| matches!(r, RPc::Answered(a) if a.answer == CAnswer::Committed)),
        "K1's replay: 200"
    );
    assert!(last.request_commits(TOKEN_RETRY), "the token retry committed");
    // The same, read against the records: K1's replay answered 200 with no attempt of K1's committed.
    let run = check(run.model.clone(), Some(OWN_OUTCOME));
    run.expect_violation(OWN_OUTCOME);
}

/// Issue 47, an operator's abort that does not follow `retriedAs` (`operator_follows_chain` off: it acts on
/// the id it is sent to). K1 is refused for contention and its coordinator names K1-2 in its abort; the
/// operator's abort of K1 finds K1 ABORTED and answers 200 ABORTED (or its write, after a read of K1
/// PREPARING, loses to that abort and answers from K1), while K1-2 goes on and commits: the operator was
/// told the request is aborted, and it committed. With the fix the operator follows K1 → K1-2 and aborts it
/// (or fences it, not yet created), and the request ends.
#[test]
fn issue_47_an_operator_abort_that_stops_at_the_id_it_is_sent_to_lets_the_retry_commit() {
    let model = switched(ChainConfig::operator(ChainBudget::default()).max_attempts(2).replays(0), |s| {
        s.operator_follows_chain = false
    });
    let run = check(model, Some(KEY_ANSWERS));
    let path = run.expect_violation(KEY_ANSWERS);
    let last = path.last_state();
    assert_eq!(last.op_said.map(|a| (a.answer, a.from)), Some((CAnswer::AbortedOk, Some(Id { ns: 0, n: 1 }))));
    assert!(last.record(Id { ns: 0, n: 2 }).is_some_and(|r| r.status.commit()), "K1-2 committed");
    let run = check(run.model.clone(), Some(OWN_OUTCOME));
    run.expect_violation(OWN_OUTCOME);
}

/// Issue 47, an operator's abort written unconditionally (`operator_writes_conditionally` off). The operator
/// reads K1 (or K1-2, after a retry) PREPARING; its votes are all PREPARED and its coordinator writes
/// PREPARING → COMMITTING (200); the operator's write then lands over the commit: one attempt decided both ways. With the fix the write
/// is conditional on PREPARING, loses, and the operator is answered 409 with the committed body.
#[test]
fn issue_47_an_unconditional_operator_abort_overwrites_its_coordinators_commit() {
    let model = switched(ChainConfig::operator(ChainBudget::default()).max_attempts(2).replays(0), |s| {
        s.operator_writes_conditionally = false
    });
    let run = check(model.clone(), Some(DECISIONS));
    let path = run.expect_violation(DECISIONS);
    let last = path.last_state();
    let read = last.op_said.and_then(|a| a.from).and_then(|id| last.record(id)).expect("the operator's record");
    assert_eq!((read.status.abort(), read.by), (true, Some(Decider::Operator)), "aborted by the operator");
    assert_eq!(last.coords[FIRST as usize].said.map(|a| a.answer), Some(CAnswer::Committed), "after its 200");
    // Over the coordinator's contention abort naming K1-2 instead, the operator's write leaves that link on a
    // record it decided: the request goes on after the operator's abort.
    let run = check(model, Some(OPERATOR_ENDS));
    run.expect_violation(OPERATOR_ENDS);
}

/// Issue 47, one outcome per request (`link_with_record` off: the coordinator writes the link in its abort,
/// then creates the next attempt a step later). A request is refused for contention and its coordinator
/// names the next attempt in its abort, then crashes before creating it. Nobody reads the key again: no
/// replay, no route, no operator. Nothing ever fences that attempt, so the request never ends: no record
/// says how it ended, and the outcomes function, which announces an attempt's end only when it names no
/// successor, never sends its outcome. With the fix the link and the next attempt's record are one write:
/// the crash leaves that attempt PREPARING, the sweeper aborts it past its deadline, and its end is the
/// request's outcome.
#[test]
fn issue_47_a_request_whose_coordinator_stopped_after_naming_its_next_attempt_never_ends_unread() {
    let budget = ChainBudget { crash: 1, ..ChainBudget::default() };
    let model = switched(ChainConfig::tokens(budget).max_attempts(2).replays(0), |s| s.link_with_record = false);
    let run = check(model.clone(), Some(ALL_END));
    let path = run.expect_counterexample(ALL_END);
    let last = path.last_state();
    let (_, named) = last
        .all_records()
        .find(|(_, r)| r.retried_as.is_some_and(|next| last.record(next).is_none()))
        .expect("an attempt naming a successor that was never begun nor fenced");
    assert!(named.status.abort() && named.by == Some(Decider::Own), "its own coordinator's abort named it");
    let coordinator = named.ex.expect("created by a request's coordinator");
    assert_eq!(last.coords[coordinator as usize].pc, CPc::Crashed, "which crashed before creating it");
    // With the fix, the same configuration ends every request.
    let fixed = check(ChainModel::new(ChainConfig::tokens(budget).max_attempts(2).replays(0)), None);
    fixed.assert_all_hold();
}

/// Issue 47: the chains an older coordinator wrote (a link, then the next attempt's create, two writes)
/// still meet today's replays, routes and operator's abort during an upgrade: their fences of a link to no
/// record keep every property (`held`, `operator_held` and `together` with `link_with_record` off). Without
/// crashes: a coordinator that stopped between the two writes is the defect above, which today's
/// coordinator does not have; here the routes and replays meet the window between them.
#[test]
fn links_written_before_the_link_came_with_its_record() {
    let faults = ChainBudget { crash: 0, ..FAULTS };
    for cfg in [ChainConfig::held(faults), ChainConfig::operator_held(faults), ChainConfig::together(faults)] {
        let run = check(switched(cfg.max_attempts(3), |s| s.link_with_record = false), None);
        run.assert_all_hold();
    }
}
