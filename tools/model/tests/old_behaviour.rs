//! Proof that the check is not vacuous: with ONE fix switched back to the behaviour before it, the
//! checker finds the defect it fixes (issues 19, 27, 28, 29, 30, 31 and 32), and prints the trace (breadth first: a
//! shortest one).

use twopc_model::config::{Budget, Config, Switches};
use twopc_model::report::check;
use twopc_model::state::{Answer, BState, Res, Status, phase};
use twopc_model::{TwoPc, Violation};

fn budget(f: impl FnOnce(&mut Budget)) -> Budget {
    let mut b = Budget::default();
    f(&mut b);
    b
}

/// Defect 1: a late duplicate prepare re-locks an item its transaction already committed (after
/// another transaction committed there), and the re-drive of the still-COMMITTING transaction
/// applies its operation a second time.
#[test]
fn defect_1_late_duplicate_prepare_applies_twice() {
    let cfg = Config::transfers(budget(|b| {
        b.dup = 1;
        b.crash = 1;
        b.total = 2;
    }))
    .sweeper_races_coordinators(false)
    .margin(false)
    .switches(Switches { token_check: false, ..Switches::default() });
    let run = check(TwoPc::new(cfg), Some("each operation applied at most once"));
    let path = run.expect_counterexample("each operation applied at most once");
    let last = path.last_state();
    assert!(last.ghost.applied.iter().any(|&n| n > 1), "an operation is applied twice");
}

/// Defect 8: the keyed PREPARING record's reply is lost; the SDK's retry finds the record this very
/// execution wrote, takes it for another execution's, waits out the deadline and aborts itself.
#[test]
fn defect_8_lost_reply_makes_a_keyed_transaction_abort_itself() {
    let cfg = Config::keyed(budget(|b| {
        b.db_reply = 1;
        b.total = 1;
    }))
    .sweeper_races_coordinators(false)
    .margin(false)
    .switches(Switches { recognise_own_writes: false, ..Switches::default() });
    let run = check(TwoPc::new(cfg), Some("no self-abort"));
    let path = run.expect_counterexample("no self-abort");
    assert!(path.last_state().records[0].as_ref().is_some_and(|r| r.status.abort()), "T1 is aborted");
}

/// Defect 9: a prepare's first delivery locks and its answer is lost; the re-sent copy arrives after
/// the deadline and answers REFUSED; the abort skips the participant that refused, and the
/// transaction is answered 409 with its lock still held.
#[test]
fn defect_9_abort_skips_a_refused_participant_that_holds_a_lock() {
    let cfg = Config::transfers(budget(|b| {
        b.dup = 1;
        b.loss = 1;
        b.total = 2;
    }))
    .sweeper_races_coordinators(false)
    .margin(false)
    .switches(Switches { abort_everyone: false, ..Switches::default() });
    let run = check(TwoPc::new(cfg), Some("no lock left behind by an abort"));
    let path = run.expect_counterexample("no lock left behind by an abort");
    let last = path.last_state();
    assert!(last.coords.iter().any(|c| c.answer == Some(Answer::Conflict)), "answered 409");
}

/// Defect 10: DynamoDB refuses the decision write (a 4xx); the coordinator answers 503 at once and
/// releases nothing: the locks stay until the deadline (lock griefing).
#[test]
fn defect_10_refused_decision_leaves_the_locks() {
    let cfg = Config::transfers(budget(|b| {
        b.refused = 1;
        b.total = 1;
    }))
    .sweeper_races_coordinators(false)
    .margin(false)
    .switches(Switches { release_on_refused_decision: false, ..Switches::default() });
    let run = check(TwoPc::new(cfg), Some("no lock left behind by an abort"));
    let path = run.expect_counterexample("no lock left behind by an abort");
    let last = path.last_state();
    assert!(last.coords.iter().any(|c| c.answer == Some(Answer::Unavailable { aborted: true })), "answered 503");
    assert!(last.records.iter().all(|r| r.as_ref().is_none_or(|r| r.status != Status::Committing)));
}

/// Issue 27: a record DynamoDB refuses to make larger (written near 400 KB by an earlier version, or a
/// size misjudged). Without the shortened writes, every write that adds to it is refused for ever: the
/// decision, its fence, the sweeper's `recover` and `postpone`, lock resolution's abort. The record
/// stays PREPARING past its deadline, and every sweeper run finds it and changes nothing.
#[test]
fn defect_27_a_record_refused_for_size_never_ends() {
    let cfg = Config::keyed(budget(|b| {
        b.oversized = 1;
        b.total = 1;
    }))
    .sweeper_races_coordinators(false)
    .margin(false)
    .switches(Switches { shortened_writes: false, ..Switches::default() });
    let name = "once faults stop, every transaction ends and no lock is left";
    let run = check(TwoPc::new(cfg), Some(name));
    let path = run.expect_counterexample(name);
    let last = path.last_state();
    assert!(
        last.records.iter().flatten().any(|r| r.oversized && !r.status.terminal()),
        "an open record refused for size"
    );
    assert!(last.ghost.violations & Violation::SweeperStuck.bit() != 0, "a sweeper run that changed nothing");
}

/// Issue 28, the resolvers' margin: a resolver acts on a lock once its own clock is past the plain
/// expiry, and its clock may run ahead of the coordinator's (by less than M here). A prepare of T2 meets
/// T1's lock while T1's coordinator's clock is still at or before the deadline (it could still decide
/// commit), takes the lock for expired, and aborts T1 by recording it ABORTED: an abort nothing gave a
/// reason for (the self-abort a participant whose clock runs 5 s ahead caused).
#[test]
fn defect_28_a_resolver_without_the_margin_aborts_a_live_transaction() {
    let cfg = Config::transfers(Budget::default())
        .sweeper_races_coordinators(false)
        .switches(Switches { resolver_margin: false, ..Switches::default() });
    let run = check(TwoPc::new(cfg), Some("no self-abort"));
    let path = run.expect_counterexample("no self-abort");
    let last = path.last_state();
    assert!(last.ghost.violations & Violation::SelfAbort.bit() != 0);
    assert!(last.records.iter().flatten().any(|r| r.status.abort()), "a transaction aborted");
    assert!((0..2).any(|tx| last.phase(tx) == phase::ON_TIME), "while its coordinator's clock is on time");
}

/// Issue 28, the replay's answer: a retried key whose answer budget runs out while the first execution
/// is still deciding answers what `Reply::for_record` says of PREPARING, 202, which the contract reads
/// as "decided commit": the answer does not agree with the record (which may yet be aborted).
#[test]
fn defect_28_a_retry_answers_an_undecided_transaction_202() {
    let cfg = Config::keyed(Budget::default())
        .sweeper_races_coordinators(false)
        .switches(Switches { replay_answers_record: false, ..Switches::default() });
    let name = "every answer agrees with the record";
    let run = check(TwoPc::new(cfg), Some(name));
    let path = run.expect_counterexample(name);
    let last = path.last_state();
    assert!(last.coords.iter().any(|c| c.replay && c.answer == Some(Answer::Accepted)), "the retry answered 202");
    assert!(!last.status(0).is_some_and(Status::commit), "T1 not decided commit");
}

/// Issue 28, the participants' cutoff: before the fix a participant checked the plain deadline, by its
/// own clock, once, when the prepare arrived. That refuses prepares the coordinator could still count
/// (a clock ahead) and lets a prepare that arrived in time lock after a wait or a lock resolution, once
/// every clock is past the cutoff. The checker finds both, and no counterexample to any property: a
/// lock written late is, to every other process, a late copy's lock, which the protocol survives anyway
/// (aborts go to every participant, commits check the voted token, resolvers go by the record); a
/// refusal is a reason to abort. What the cutoff buys is that no lock outlives `deadline + M` by more
/// than a write's flight, so resolvers acting after `expiry + 2M` never race a new lock: time, not safety.
#[test]
fn defect_28_the_old_participant_check_breaks_no_property() {
    let cfg = Config::transfers(Budget::default())
        .sweeper_races_coordinators(false)
        .switches(Switches { lock_cutoff: false, ..Switches::default() });
    check(TwoPc::new(cfg), None).assert_all_hold();
}

/// Issue 29, the rule's version condition: a transfer's debit is judged by the service's rule on A as
/// read; a deposit commits on A in between; without the condition the lock write still succeeds, and the
/// vote stands for a judgement of a value A no longer has.
#[test]
fn defect_29_a_lock_without_the_version_condition_keeps_a_stale_judgement() {
    let cfg = Config::rules(Budget::default())
        .sweeper_races_coordinators(false)
        .margin(false)
        .switches(Switches { rule_version_condition: false, ..Switches::default() });
    let name = "a rule never judged a stale item";
    let run = check(TwoPc::new(cfg), Some(name));
    let path = run.expect_counterexample(name);
    assert!(path.last_state().ghost.violations & Violation::StaleJudgement.bit() != 0);
}

/// Issue 30, the pending value: the service is redeployed between a reserve's prepare and its commit;
/// a commit that computes the value again applies the new code's result, not the one the prepare voted for.
#[test]
fn defect_30_a_commit_that_computes_again_applies_what_no_prepare_voted_for() {
    let cfg = Config::custom(Budget::default())
        .sweeper_races_coordinators(false)
        .margin(false)
        .switches(Switches { apply_pending: false, ..Switches::default() });
    let name = "a commit applies the value its prepare voted for";
    let run = check(TwoPc::new(cfg), Some(name));
    let path = run.expect_counterexample(name);
    let last = path.last_state();
    assert!(last.ghost.violations & Violation::CommittedNotVoted.bit() != 0);
    assert!(last.deployed != 0, "after a redeploy");
}

/// Issue 31, the barrier: without an entry written before the try, a prepare that gives up on its try
/// leaves nothing for the abort to find; the abort writes nothing, and the try request that lands late
/// authorizes money that nothing ever voids.
#[test]
fn defect_31_without_the_barrier_a_late_try_holds_money_for_ever() {
    let cfg = Config::resource(Budget::default())
        .sweeper_races_coordinators(false)
        .margin(false)
        .switches(Switches { barrier: false, ..Switches::default() });
    let name = "once everything settles, no reservation is held";
    let run = check(TwoPc::new(cfg), Some(name));
    let path = run.expect_counterexample(name);
    let last = path.last_state();
    assert!(last.status(0).is_some_and(Status::abort), "T1 aborted");
    assert_eq!(last.res[0], Res::Held, "its authorization still held");
    assert!(last.barriers[0].is_none(), "with no barrier entry to say so");
}

/// Issue 31, the recheck: an abort reads the entry TRYING while the try's answer is on its way; the
/// cancel then finds it TRIED and cancels it without voiding what the late try authorized. Without the
/// repeated cancel nothing voids it.
#[test]
fn defect_31_without_the_recheck_a_reservation_made_during_the_cancel_stays_held() {
    let cfg = Config::resource(Budget::default())
        .sweeper_races_coordinators(false)
        .margin(false)
        .switches(Switches { recheck: false, ..Switches::default() });
    let name = "once everything settles, no reservation is held";
    let run = check(TwoPc::new(cfg), Some(name));
    let path = run.expect_counterexample(name);
    let last = path.last_state();
    assert_eq!(last.res[0], Res::Held, "T1's authorization still held");
    assert!(last.barriers[0].is_some_and(|e| e.state == BState::Cancelled), "under a cancelled entry");
}

/// Issue 32, a held owner undecided until its `holdUntil`: T1 is held (PREPARED, answered 202) and its hold
/// messages have not extended its locks yet (lost, or still on their way), so its locks still expire at its
/// deadline. Once that passes, T2's deposit meets T1's lock on A and resolves it; a resolver that takes a
/// PREPARED owner like a PREPARING one past its deadline aborts T1, whose caller may still commit it until
/// `holdUntil`.
#[test]
fn defect_32_a_resolver_that_ignores_the_hold_aborts_a_held_transaction() {
    let cfg = Config::held(Budget::default())
        .sweeper_races_coordinators(false)
        .margin(false)
        .switches(Switches { held_undecided: false, ..Switches::default() });
    let name = "a held transaction is never aborted by a resolver before holdUntil + 2M";
    let run = check(TwoPc::new(cfg), Some(name));
    let path = run.expect_counterexample(name);
    let last = path.last_state();
    assert!(last.ghost.violations & Violation::HeldAbortedEarly.bit() != 0);
    assert!(last.status(0).is_some_and(Status::abort), "T1 aborted");
    assert_eq!(last.hold_phase(0), phase::ON_TIME, "while its caller may still commit it");
    assert!(last.coords.iter().any(|c| c.answer == Some(Answer::Held)), "after T1 was answered 202 PREPARED");
}

/// Issue 32, the lock of a held owner left at its deadline (`git show e14f8bd`): T1 is held (PREPARED, answered
/// 202) and its hold messages have not extended its locks (lost, or still on their way), so they expire at
/// its deadline. Once it passes, a sweeper run lists them (`expired_locks`), finds their owner PREPARED within
/// its hold and leaves them (`LockOutcome::Waiting`): the run changes nothing, and every later run until
/// `holdUntil + 2M` lists the same locks in its K places. With the fix the run sends the hold they missed.
#[test]
fn defect_32_a_sweeper_run_that_leaves_a_held_owners_lock_changes_nothing() {
    let cfg = Config::held(Budget::default())
        .sweeper_races_coordinators(false)
        .margin(false)
        .switches(Switches { resolver_extends_hold: false, ..Switches::default() });
    let name = "once faults stop, every transaction ends and no lock is left";
    let run = check(TwoPc::new(cfg), Some(name));
    let path = run.expect_counterexample(name);
    // The state the run left (the path may go on after it: a hold message delivered late).
    let states = path.into_states();
    let stuck = states.iter().find(|s| s.ghost.violations & Violation::SweeperStuck.bit() != 0);
    let stuck = stuck.expect("a sweeper run that changed nothing");
    assert_eq!(stuck.status(0), Some(Status::Prepared), "T1 held");
    assert!(stuck.items.iter().any(|it| it.lock.is_some_and(|l| l.tx == 0 && !l.held)), "a lock at its deadline");
    assert_eq!(stuck.hold_phase(0), phase::ON_TIME, "within the hold");
}

/// Issue 42, a participant's role that may write records: T1 is held (PREPARED, answered 202) and its
/// caller aborts it (ABORTING); a participant's operator then writes T1's record as COMMITTING straight to
/// the table, as the participant roles' PutItem and UpdateItem grants allowed: a commit decided over an
/// abort. With the fix no participant role can write a record of a transaction of several participants.
#[test]
fn defect_42_a_participant_role_that_may_write_records_decides_commit_over_an_abort() {
    let cfg = Config::held(Budget::default())
        .sweeper_races_coordinators(false)
        .margin(false)
        .switches(Switches { participants_cannot_write_records: false, ..Switches::default() });
    let name = "one decision per transaction, status only moves forward";
    let run = check(TwoPc::new(cfg), Some(name));
    let path = run.expect_counterexample(name);
    let last = path.last_state();
    assert!(last.forged, "the operator wrote the record");
    assert!(last.ghost.violations & Violation::StatusBackwards.bit() != 0, "COMMITTING written over an abort");
}

/// Issue 47, an operator's abort written unconditionally (`operator_writes_conditionally` off): T1, keyed
/// and not held, is read PREPARING by an operator's abort; its votes are in and its coordinator writes
/// PREPARING → COMMITTING; the operator's write, not conditional on the status it read, lands over it:
/// ABORTING over a commit decision. With the fix the write is conditional, loses, and the operator is
/// answered 409 (the commit is driven).
#[test]
fn defect_47_an_unconditional_operator_abort_writes_an_abort_over_a_commit() {
    let cfg = Config::operator(Budget::default())
        .sweeper_races_coordinators(false)
        .margin(false)
        .switches(Switches { operator_writes_conditionally: false, ..Switches::default() });
    let name = "one decision per transaction, status only moves forward";
    let run = check(TwoPc::new(cfg), Some(name));
    let path = run.expect_counterexample(name);
    let last = path.last_state();
    assert!(last.ghost.violations & Violation::StatusBackwards.bit() != 0, "ABORTING written over COMMITTING");
    assert!(last.ghost.decided_commit & 1 != 0, "T1 was decided commit");
}

/// Issue 47: the operator's abort is a reason to abort, and admitting it hides no self-abort. In the
/// operator's configuration with issue 28's resolver margin switched off, a resolver whose clock runs ahead
/// still aborts T1 while its coordinator could commit, with no operator involved: "no self-abort" fails.
#[test]
fn issue_47_the_operators_reason_hides_no_self_abort() {
    let cfg = Config::operator(Budget::default())
        .sweeper_races_coordinators(false)
        .switches(Switches { resolver_margin: false, ..Switches::default() });
    let run = check(TwoPc::new(cfg), Some("no self-abort"));
    let path = run.expect_counterexample("no self-abort");
    let last = path.last_state();
    assert!(last.ghost.violations & Violation::SelfAbort.bit() != 0);
    assert!((0..2).any(|tx| last.phase(tx) == phase::ON_TIME), "while its coordinator's clock is on time");
}
