//! Issue 48, item 2 (fewer write units): a lock of an attempt recorded first (keyed, PREPARING before any
//! prepare) and not held is written without the locks-index attributes (`unindexed_recorded_locks`). The
//! sweeper cannot find such a lock through `locks-by-expiry`; only the record's recovery or a contact can.
//! A late prepare's stray lock is then left for ever unless the record stays open until every lock cutoff
//! has passed (`revisit_unclean_prepares`) and no prepare of such an attempt is duplicated
//! (`recorded_prepares_sent_once`). DETAILS.md, "Unindexed locks of recorded attempts (issue 48)".

use twopc_model::TwoPc;
use twopc_model::config::{Budget, Config, Switches};
use twopc_model::report::check;
use twopc_model::state::Status;

const ENDS: &str = "once faults stop, every transaction ends and no lock is left";

fn budget(f: impl FnOnce(&mut Budget)) -> Budget {
    let mut b = Budget::default();
    f(&mut b);
    b
}

fn loss() -> Budget {
    budget(|b| {
        b.loss = 1;
        b.total = 1;
    })
}

/// (a) Unindexed locks without the fix: T1 (keyed) times out on a prepare still in flight, aborts, its
/// release reaches the participant first and is acknowledged, ABORTED is written; the prepare lands after
/// (before the lock cutoff): a stray lock nobody lists.
#[test]
fn unindexed_without_revisit_leaves_a_stray_lock() {
    let cfg = Config::keyed(loss())
        .sweeper_races_coordinators(false)
        .margin(false)
        .switches(Switches { revisit_unclean_prepares: false, ..Switches::default() });
    let run = check(TwoPc::new(cfg), Some(ENDS));
    let path = run.expect_violation(ENDS);
    let last = path.last_state();
    assert_eq!(last.status(0), Some(Status::Aborted), "T1's record is terminal");
    assert!(last.items.iter().any(|i| i.lock.is_some_and(|l| l.tx == 0 && !l.indexed)), "an unindexed lock of T1");
}

/// (c) Point 1 justified: with the fix but a prepare of a recorded attempt duplicated by the network (its
/// invoke retried), a vote received no longer means no other execution is in flight.
#[test]
fn unindexed_with_duplicated_recorded_prepares_leaves_a_stray_lock() {
    let cfg = Config::keyed(budget(|b| {
        b.dup = 1;
        b.total = 1;
    }))
    .sweeper_races_coordinators(false)
    .margin(false)
    .switches(Switches { recorded_prepares_sent_once: false, ..Switches::default() });
    let run = check(TwoPc::new(cfg), Some(ENDS));
    let path = run.expect_violation(ENDS);
    let last = path.last_state();
    assert!(last.status(0).is_some_and(Status::terminal), "T1's record is terminal");
    assert!(last.items.iter().any(|i| i.lock.is_some_and(|l| l.tx == 0 && !l.indexed)), "an unindexed lock of T1");
}

/// (b) The plan with its fix, with or without the clock margin: every property holds.
fn unindexed_with_revisit_holds(margin: bool) {
    let cfg = Config::keyed(budget(|b| {
        b.dup = 1;
        b.loss = 1;
        b.crash = 1;
        b.total = 2;
    }))
    .sweeper_races_coordinators(false)
    .margin(margin);
    check(TwoPc::new(cfg), None).assert_all_hold();
}

#[test]
fn unindexed_with_revisit() {
    unindexed_with_revisit_holds(false);
}

#[test]
fn unindexed_with_revisit_margin() {
    unindexed_with_revisit_holds(true);
}

/// Not in the plan: an operator's abort (issue 47) writes ABORTED as soon as its releases are acknowledged,
/// whatever the clock. A prepare of T1 still in flight lands after its release: a stray unindexed lock under a
/// terminal record, with no fault at all. `operator_abort_left_open` leaves the record ABORTING instead.
#[test]
fn an_operators_abort_that_writes_aborted_leaves_a_stray_lock() {
    let cfg = Config::operator(Budget::default())
        .sweeper_races_coordinators(false)
        .margin(false)
        .switches(Switches { operator_abort_left_open: false, ..Switches::default() });
    let run = check(TwoPc::new(cfg), Some(ENDS));
    let path = run.expect_violation(ENDS);
    let last = path.last_state();
    assert_eq!(last.status(0), Some(Status::Aborted), "T1's record is terminal");
    assert!(last.items.iter().any(|i| i.lock.is_some_and(|l| l.tx == 0 && !l.indexed)), "an unindexed lock of T1");
}
