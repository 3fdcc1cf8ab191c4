//! The fixed protocol (design.md, with the two corrections the model found, see DETAILS.md): every
//! property holds over every reachable state of each configuration, and every `sometimes` check is
//! met. Each test prints the number of distinct states explored.
//!
//! The first configurations pass a deadline for every clock at once (`Config::margin` off: the clock
//! as before issue 28, which keeps them small); the `_margin` ones have the clock margin of issue 28
//! (participants' cutoffs, then resolvers' checks, each reading either way in turn).
//!
//! `MODEL_BIG=1` checks larger configurations: every fault kind, two in all, and the sweeper racing
//! live coordinators (records refused for size only in the `_oversized` configurations); the `_margin`
//! ones with larger budgets (each test says), the sweeper between coordinators.

use twopc_model::TwoPc;
use twopc_model::config::{Budget, Config, SMALL, Switches};
use twopc_model::report::check;

fn big() -> bool {
    std::env::var("MODEL_BIG").is_ok_and(|v| v == "1")
}

/// At most one fault of each listed kind, `total` in all.
fn faults(kinds: &str, total: u8) -> Budget {
    let mut b = Budget { total, ..Budget::default() };
    for kind in kinds.split(',') {
        match kind {
            "crash" => b.crash = 1,
            "db_reply" => b.db_reply = 1,
            "dup" => b.dup = 1,
            "loss" => b.loss = 1,
            "refused" => b.refused = 1,
            "oversized" => b.oversized = 1,
            other => panic!("unknown fault kind {other}"),
        }
    }
    b
}

/// The CI configuration as given, or with MODEL_BIG every fault kind, two in all, and the sweeper
/// racing live coordinators.
fn run(make: fn(Budget) -> Config, budget: Budget, races: bool) {
    let cfg = if big() {
        make(SMALL).sweeper_races_coordinators(true)
    } else {
        make(budget).sweeper_races_coordinators(races)
    };
    check(TwoPc::new(cfg.margin(false)), None).assert_all_hold();
}

/// With the clock margin (issue 28): the CI budget as given, or with MODEL_BIG the larger one. The
/// sweeper runs between coordinators.
fn run_margin(make: fn(Budget) -> Config, budget: Budget, big_budget: Budget) {
    let budget = if big() { big_budget } else { budget };
    check(TwoPc::new(make(budget).sweeper_races_coordinators(false).margin(true)), None).assert_all_hold();
}

#[test]
fn transfers_duplicate_and_loss() {
    run(Config::transfers, faults("dup,loss", 2), false);
}

#[test]
fn transfers_crash_lost_reply_refused() {
    run(Config::transfers, faults("crash,db_reply,refused", 2), false);
}

#[test]
fn transfers_sweeper_racing_coordinators() {
    run(Config::transfers, faults("crash,db_reply,refused", 1), true);
}

#[test]
fn keyed() {
    run(Config::keyed, SMALL, false);
}

#[test]
fn one_phase() {
    run(Config::one_phase, Budget { total: 3, ..SMALL }, false);
}

/// Records refused for size (issue 27), with the CI budget as given, or with MODEL_BIG all six fault
/// kinds, two in all, and the sweeper racing live coordinators.
fn run_oversized(make: fn(Budget) -> Config, budget: Budget) {
    let cfg = if big() {
        make(Budget { oversized: 1, ..SMALL }).sweeper_races_coordinators(true)
    } else {
        make(budget).sweeper_races_coordinators(false)
    };
    check(TwoPc::new(cfg.margin(false)), None).assert_all_hold();
}

/// A keyed decision, its fence, lock resolution, the sweeper's and a replay's `recover`, and the
/// sweeper's postponement, each refused for size and written shortened; the fence and postponements
/// refused (4xx) or losing their reply; crashes and losses to leave work for the sweeper.
#[test]
fn keyed_oversized() {
    run_oversized(Config::keyed, faults("oversized,crash,loss,refused,db_reply", 3));
}

/// Two unkeyed transactions: their records are created decided (never refused for size); the
/// sweeper's postponements of an entry it cannot finish are refused (4xx), lose their reply, or are
/// refused for size and written shortened, while the other entry waits behind (K = 1).
#[test]
fn transfers_oversized() {
    run_oversized(Config::transfers, faults("oversized,crash,loss,refused,db_reply", 3));
}

#[test]
fn check_only() {
    run(Config::check_only, faults("dup,loss,crash", 2), false);
}

/// Issue 28: a keyed transfer and a one-phase deposit with the clock margin: prepares locking or refused
/// TIMEOUT as each participant's clock reads its cutoff, resolvers (a prepare meeting a lock, the
/// sweeper, the retried key) acting or not as each reads `expiry + 2M`, and the retry answering what
/// the record says (503 while undecided, 202/409 once decided) whenever its answer budget runs out.
#[test]
fn keyed_margin() {
    run_margin(Config::keyed, faults("crash,db_reply,dup,loss,refused", 1), SMALL);
}

/// The margin with a crash and a loss: locks left to expire, resolved by a prepare or the sweeper in
/// the margin, a retry waiting on a crashed execution's record.
#[test]
fn keyed_margin_crash_loss() {
    run_margin(Config::keyed, faults("crash,loss", 2), faults("crash,loss,dup", 3));
}

/// Two transfers against each other with the margin: a prepare meets the other's lock whose clock
/// reads it expired or not (wait-die or resolution), presumed abort racing resolution's ABORTED.
#[test]
fn transfers_margin() {
    run_margin(Config::transfers, faults("crash,db_reply,dup,loss,refused", 1), SMALL);
}

#[test]
fn one_phase_margin() {
    run_margin(Config::one_phase, faults("crash,db_reply,dup,loss,refused", 2), Budget { total: 3, ..SMALL });
}

#[test]
fn check_only_margin() {
    run_margin(Config::check_only, faults("crash,dup,loss", 1), faults("crash,dup,loss", 2));
}

/// design.md taken literally: the SDK's retry of a lock write re-sends the same token. The checker
/// finds an operation applied twice (DETAILS.md, "What the model found").
#[test]
fn design_literal_same_token_on_sdk_retry_applies_twice() {
    let cfg = Config::keyed(faults("dup,db_reply", 2))
        .sweeper_races_coordinators(false)
        .margin(false)
        // Issue 48: the copy is of keyed T1's prepare, which `recorded_prepares_sent_once` never copies once its
        // locks are unindexed: the locks indexed as before, to show this defect alone.
        .switches(Switches { fresh_token_per_attempt: false, unindexed_recorded_locks: false, ..Switches::default() });
    let run = check(TwoPc::new(cfg), Some("each operation applied at most once"));
    let path = run.expect_counterexample("each operation applied at most once");
    assert!(path.last_state().ghost.applied.iter().any(|&n| n > 1));
}

/// design.md taken literally: a decision write refused on the SDK's retry (after a first attempt
/// whose reply was lost) is taken as certainly not applied, and the locks are released against a
/// COMMITTING record.
#[test]
fn design_literal_refusal_on_sdk_retry_releases_against_commit() {
    let cfg = Config::transfers(faults("db_reply,refused", 2))
        .sweeper_races_coordinators(false)
        .margin(false)
        .switches(Switches { refusal_after_unknown_is_unknown: false, ..Switches::default() });
    let name = "no lock released or rolled forward against its owner's record";
    let run = check(TwoPc::new(cfg), Some(name));
    run.expect_counterexample(name);
}

/// Issue 29: a transfer whose debit a service's rule judges on the item as read, against a one-phase
/// deposit the rule judges too: a commit between a read and its lock write fails the write (version
/// condition) and the prepare judges again.
#[test]
fn rules() {
    run(Config::rules, faults("crash,db_reply,dup,loss,refused", 2), true);
}

#[test]
fn rules_margin() {
    run_margin(
        Config::rules,
        faults("crash,db_reply,dup,loss,refused", 1),
        faults("crash,db_reply,dup,loss,refused", 2),
    );
}

/// Issue 30: a service's own operation (reserve) computes the new value at prepare and its commit
/// applies it, while the service may be redeployed with another version of the operation at any
/// moment. One fault of each kind, the sweeper racing live coordinators (with two faults, no run of
/// this configuration happens to release a stray lock, a generic check that other configurations meet).
#[test]
fn custom() {
    let cfg =
        Config::custom(faults("crash,db_reply,dup,loss,refused", 1)).sweeper_races_coordinators(true).margin(false);
    check(TwoPc::new(cfg), None).assert_all_hold();
}

#[test]
fn custom_margin() {
    run_margin(
        Config::custom,
        faults("crash,db_reply,dup,loss,refused", 1),
        faults("crash,db_reply,dup,loss,refused", 1),
    );
}

/// Issue 31: an order's stock and a card charge at a resource participant (try, confirm, cancel behind a
/// barrier entry), the card good or declined; try requests landing late, twice or never, answers lost,
/// the repeated cancel (recheck) voiding a reservation a late try made.
#[test]
fn resource() {
    run(Config::resource, faults("crash,db_reply,dup,loss,refused", 2), true);
}

#[test]
fn resource_margin() {
    run_margin(
        Config::resource,
        faults("crash,db_reply,dup,loss,refused", 1),
        faults("crash,db_reply,dup,loss,refused", 2),
    );
}

/// Issue 32: a held transfer (recorded first; PREPARED and 202 once both prepared in time; hold messages
/// extending its locks to `holdUntil`, late or twice) whose caller commits, aborts, both (racing) or neither
/// (the hold expires), against a one-phase deposit that meets its lock: refused CONFLICT while the hold lasts,
/// resolving it (aborting the expired hold, or rolling the caller's commit forward) after. Crashes, lost
/// DynamoDB replies (the hold write's, a route's decision write's), duplicates and refused writes, one in all.
#[test]
fn held() {
    run(Config::held, faults("crash,db_reply,dup,refused", 1), false);
}

/// Issue 32 with a crash and a loss: hold messages lost (locks left at their deadline, found expired and left
/// to their held owner), a route's coordinator crashing after its decision, the sweeper finishing it.
#[test]
fn held_crash_loss() {
    run(Config::held, faults("crash,loss", 2), false);
}

/// Issue 32 with the clock margin, on `holdUntil` as on the deadline: the commit route's check reading either
/// way once some coordinator's clock is past `holdUntil`, resolvers' checks once every coordinator's is.
#[test]
fn held_margin() {
    run_margin(Config::held, faults("crash", 1), faults("crash,loss", 1));
}

/// Issue 47: an operator's abort of T1, a keyed transfer not held, at any moment once its record exists:
/// it races its coordinator's decision (PREPARING → COMMITTING, conditional on PREPARING: exactly one wins),
/// its prepares (a lock taken after the abort is processed is a late one, released by resolution), and T2's
/// one-phase deposit meeting T1's lock.
#[test]
fn operator() {
    run(Config::operator, faults("crash,db_reply,loss,refused", 2), false);
}

/// Issue 47, held: the operator's abort racing the caller's commit and abort, the hold's expiry, and the
/// coordinator's PREPARED write.
#[test]
fn operator_held() {
    run(Config::operator_held, faults("crash,db_reply,refused", 1), false);
}

/// Issue 48: both POSTs ask to be answered on their commit decision (`Prefer: respond-async`): T1 unkeyed
/// (its COMMITTING record created at the decision), T2 keyed and sent twice. The 202 COMMITTING comes as
/// soon as the execution knows its decision is durable; the second phase goes on after it and may crash,
/// lose messages or lose a DynamoDB reply, the sweeper and lock resolution finishing it. Every earlier
/// property must hold: a 202 says the transaction commits, and it does.
#[test]
fn answer_on_decision() {
    run(Config::answer_on_decision, faults("crash,db_reply,loss", 1), false);
}
