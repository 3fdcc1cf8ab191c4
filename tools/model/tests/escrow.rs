//! Issue 48, item 3: escrow credits on hot receivers (`twopc_model::escrow`; DETAILS.md, "Escrow credits on
//! hot receivers"). A credit writes an entry of its own in the hot item's `credits` map instead of taking its
//! lock; its commit applies the entry whose token is the voted one; exclusive operations wait for the credits
//! to drain; a debit guarded by `min` locks beside them, its guard counting the committed balance only.
//!
//! The first tests check the design over every reachable state: every property holds and every `sometimes`
//! check is met. The others turn one wrong behaviour on at a time and assert the checker finds what the
//! design prevents, printing the trace cut at the first state that violates the property (breadth first:
//! a shortest one, give or take the checker's batches).
//!
//! `MODEL_BIG=1` runs `credits_and_debit` and `put` with all five faults.

use twopc_model::escrow::{
    ABOVE_MIN, APPLIED_ONCE, EXCLUSIVE_ALONE, EscrowBudget, EscrowConfig, EscrowModel, EscrowSwitches, EscrowViolation,
    GUARD_COMMITTED, Kind, NO_STRAY, QUIESCENT, check,
};
use twopc_model::state::Status;

/// A lost reply (a vote, an ack), a copied commit or abort, a coordinator's crash: one of each.
const FAULTS: EscrowBudget = EscrowBudget { loss: 1, dup: 1, db_reply: 0, crash: 1, copy: 0 };

/// And a lost DynamoDB reply of a prepare's write, and a copy of a credit's prepare (out of the design).
const ALL: EscrowBudget = EscrowBudget { loss: 1, dup: 1, db_reply: 1, crash: 1, copy: 1 };

fn big() -> bool {
    std::env::var("MODEL_BIG").is_ok_and(|v| v == "1")
}

fn switched(cfg: EscrowConfig, f: impl FnOnce(&mut EscrowSwitches)) -> EscrowModel {
    let mut sw = EscrowSwitches::default();
    f(&mut sw);
    EscrowModel::new(cfg.switches(sw))
}

/// C1 and C2 credit 1 each (a second participant each, which may vote no), D debits 1 with `min` 0; cap 2.
#[test]
fn credits_and_debit() {
    let run = check(EscrowModel::new(EscrowConfig::credits(if big() { ALL } else { FAULTS })), None);
    run.assert_all_hold();
    assert!(run.unique > 100_000, "not vacuous: {} states", run.unique);
}

/// C1 and C2 alone, with all five faults: lost DynamoDB replies and a copied prepare's stray entry too.
#[test]
fn two_credits_all_faults() {
    let run = check(EscrowModel::new(EscrowConfig::two_credits(ALL)), None);
    run.assert_all_hold();
    assert!(run.unique > 100_000, "not vacuous: {} states", run.unique);
}

/// C1 and C2 credit 1 each, P puts 3 once the credits drained (the drain marker); cap 1.
#[test]
fn put() {
    let run = check(EscrowModel::new(EscrowConfig::put(if big() { ALL } else { FAULTS })), None);
    run.assert_all_hold();
    assert!(run.unique > 100_000, "not vacuous: {} states", run.unique);
}

/// `commit_by_last_tx`: C1 commits (applied, `lastTx = C1`) and its commit is copied; C2 commits (`lastTx =
/// C2`); the copy of C1's commit finds `lastTx <> C1` and applies C1 again.
#[test]
fn a_commit_by_last_tx_applies_a_credit_twice() {
    let budget = EscrowBudget { dup: 1, ..EscrowBudget::default() };
    let model = switched(EscrowConfig::two_credits(budget), |s| s.commit_by_last_tx = true);
    let run = check(model, Some(APPLIED_ONCE));
    let path = run.expect_violation(APPLIED_ONCE);
    let last = path.last_state();
    assert!(last.violated(EscrowViolation::AppliedTwice));
    assert!(last.txs.iter().any(|x| x.applied == 2), "a credit applied twice");
}

/// `apply_any_token`: a copy of C1's prepare lands after C1's commit and C2's (so `lastTx <> C1`): a stray
/// entry of C1 with another token, which a copy of C1's commit (or resolution) applies.
#[test]
fn applying_any_token_applies_a_stray_entry() {
    let budget = EscrowBudget { dup: 1, copy: 1, ..EscrowBudget::default() };
    let model = switched(EscrowConfig::two_credits(budget), |s| s.apply_any_token = true);
    let run = check(model.clone(), Some(NO_STRAY));
    let path = run.expect_violation(NO_STRAY);
    let last = path.last_state();
    assert!(last.violated(EscrowViolation::StrayApplied));
    assert!(last.txs.iter().any(|x| x.applied == 2), "the credit applied twice");
    let run = check(model, Some(APPLIED_ONCE));
    run.expect_violation(APPLIED_ONCE);
}

/// `guard_counts_pending`: C1's entry pending, D's guard counts it (0 + 1 - 1 >= 0) and D locks; C1's other
/// participant votes no, C1 aborts; D commits: the balance is -1.
#[test]
fn a_guard_that_counts_pending_credits_overdraws() {
    let model = switched(EscrowConfig::credits(EscrowBudget::default()), |s| s.guard_counts_pending = true);
    let run = check(model.clone(), Some(GUARD_COMMITTED));
    run.expect_violation(GUARD_COMMITTED);
    let run = check(model, Some(ABOVE_MIN));
    let path = run.expect_violation(ABOVE_MIN);
    let last = path.last_state();
    assert!(last.item.balance < 0);
    assert!(last.txs.iter().enumerate().any(|(t, x)| t < 2 && x.status.is_some_and(Status::abort)), "a credit aborted");
}

/// `exclusive_ignores_credits`: P locks while C1's entry is pending (property 4); and, P's commit writing the
/// item anew, C1's entry is gone: C1's commit finds none, takes it for applied, and the credit is lost.
#[test]
fn an_exclusive_lock_beside_credits_loses_a_credit() {
    let model = switched(EscrowConfig::put(EscrowBudget::default()), |s| s.exclusive_ignores_credits = true);
    let run = check(model.clone(), Some(EXCLUSIVE_ALONE));
    let path = run.expect_violation(EXCLUSIVE_ALONE);
    let last = path.last_state();
    assert!(last.item.lock.is_some_and(|l| matches!(run.model.cfg.txs[l.tx as usize].kind, Kind::Put(_))));
    let run = check(model, Some(QUIESCENT));
    let path = run.expect_violation(QUIESCENT);
    let last = path.last_state();
    assert!(
        last.txs.iter().any(|x| x.status == Some(Status::Committed) && x.applied == 0),
        "a committed credit never applied"
    );
}
