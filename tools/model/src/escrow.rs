//! Issue 48, item 3: escrow credits on hot receivers. A hot item (a merchant's account) receives many credits
//! at once; a credit (an `add` with a positive delta and no guard, of a transaction recorded first) no longer
//! takes the item's exclusive lock: it writes an entry of its own in the item's `credits` map (its escrow),
//! which its commit applies and removes. Exclusive operations wait for the credits to drain (a drain marker
//! keeps new ones out meanwhile); a debit guarded by `min` locks beside the credits, its guard counting the
//! committed balance only. A model of its own, next to [`crate::TwoPc`]: one hot item, what the escrow adds
//! to its conditional writes, and just enough of each transaction (its record, one prepare, its second phase,
//! the sweeper) to let every fault that matters reach it.
//!
//! What is modelled (DETAILS.md, "Escrow credits on hot receivers", says what is left out):
//!
//! | step | the design |
//! |---|---|
//! | start | the coordinator writes the record PREPARING (in the index the sweeper scans), then sends the prepare to the hot item H, once |
//! | credit prepare | one conditional write: `no lock AND (no drain marker OR it expired) AND no entry of T AND lastTx <> T AND size(credits) < cap` → entry T with a fresh token, PREPARED with it. Failed: an entry of T there → PREPARED with its token (an earlier delivery, a lost reply); a lock, an unexpired marker or a full map → wait (the message stays, a later step) or refuse CONFLICT (wait-die by age: the model allows both to every prepare); `lastTx = T` → refused (T's commit passed already) |
//! | exclusive prepare | a put P: `no lock AND lastTx <> T AND credits empty` → lock {T, fresh token}; credits pending → refuse CONFLICT, or write the drain marker (`drain = T`) and poll: each poll is the same conditional write (removing the marker), taken once the credits drained and no lock is left |
//! | debit prepare | D (add, delta < 0, `min`): `no lock AND lastTx <> T AND balance + delta >= min` (the committed balance only): no wait for credits, no marker |
//! | lost DB reply | a prepare's write took effect, its reply lost: the handler retries (fresh token, the cutoff checked first): it finds its entry (lock) and votes its token; past the cutoff, or the entry gone, it answers an error (outcome unknown), not a refusal |
//! | cutoff | a prepare (a retry, a poll) past its transaction's cutoff writes nothing (TIMEOUT): phase 2 of the clock below |
//! | decision | the vote of H in, or the deadline passed (phase ≥ 1): all PREPARED before the deadline (and the second participant's vote yes, left to chance) → PREPARING → COMMITTING with H's voted token; else → ABORTING. The record moved already (the sweeper) → followed |
//! | second phase | the commit (with the voted token) or abort to H, the coordinator's or the sweeper's; its ack; then COMMITTED, or ABORTED if every prepare answered (clean); an abort with an unanswered prepare stays ABORTING for the sweeper |
//! | commit of a credit | `credits[T].token = voted` → `balance += delta`, `lastTx = T`, entry removed; no entry → done (absence is the proof, not `lastTx`); an entry of T with another token (a copy's) → removed unapplied |
//! | commit of an exclusive op | `lock = {T, voted}` → applied (a debit adds its delta; a put writes its value and the item anew), `lastTx = T`, released; a lock of T with another token → released; none → done |
//! | abort | entry of T removed (any token), lock of T released |
//! | resolution | anyone meeting an entry whose owner is past deadline + 2M reads the record: COMMITTING with the voted token = the entry's → applied and removed; COMMITTING with another token, COMMITTED, ABORTING, ABORTED → removed unapplied; PREPARING → left |
//! | sweeper | past deadline + 2M: PREPARING → ABORTING; then it re-sends the commit or abort (whoever sent one before) and, on its ack, writes the terminal status |
//!
//! The clock: per transaction, the phase of its deadline: 0 before it, 1 past it (no commit decision; a
//! prepare or poll may still land: before its cutoff), 2 past deadline + 2M (no prepare lands; the sweeper and
//! resolvers act). Faults (budgets): a reply lost (a vote, an ack) or a commit or abort lost; a commit or abort
//! copied (delivered again at any later time); a DynamoDB write that took effect with its reply lost; a crash
//! of the coordinator; and, out of the design (a recorded prepare is sent once), a copy of a credit's prepare,
//! which is what leaves a stray entry. A late prepare needs no budget: it is in flight until it lands.

use stateright::{Model, Property};

pub use crate::report::check;
use crate::report::{Run, Traced};
use crate::state::Status;

/// A transaction, by its index in [`EscrowConfig::txs`] (also its age: wait-die is not modelled, see the step
/// "credit prepare").
pub type Tx = u8;

/// What a transaction does to the hot item H.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `add` with a positive delta and no guard: an escrow entry.
    Credit(i8),
    /// `add` with a negative delta guarded by `min` (no `max`): an exclusive lock that does not wait for
    /// credits; its guard counts the committed balance only; its commit adds its delta.
    Debit { delta: i8, min: i8 },
    /// `put` (any exclusive operation: set, delete, check, custom, an add with `max`): an exclusive lock taken
    /// once the credits drained; its commit writes this value and the item anew.
    Put(i8),
}

impl Kind {
    fn credit(self) -> bool {
        matches!(self, Kind::Credit(_))
    }
}

/// The escrow's rules the model can get wrong, one at a time. `EscrowSwitches::default()` (all off) is the
/// design; each switch is a wrong behaviour the checker must find.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EscrowSwitches {
    /// A credit's commit (and resolution of a COMMITTING owner's entry) applies when `lastTx <> T`, as an
    /// exclusive lock's may, instead of when the entry's token is the voted one; without an entry too.
    pub commit_by_last_tx: bool,
    /// A credit's commit (and resolution) applies an entry of T whatever its token.
    pub apply_any_token: bool,
    /// The debit's guard counts the pending credits: `balance + Σ pending + delta >= min`.
    pub guard_counts_pending: bool,
    /// An exclusive prepare locks while credits are pending (no drain).
    pub exclusive_ignores_credits: bool,
}

/// Faults left (each is consumed when it happens).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EscrowBudget {
    /// A reply lost (a vote, an ack of a commit or abort), or a commit or abort lost on its way.
    pub loss: u8,
    /// A commit or abort copied: the copy is delivered at any later time.
    pub dup: u8,
    /// A DynamoDB write of a prepare took effect, its reply lost.
    pub db_reply: u8,
    /// The coordinator crashes (after its record; the sweeper finishes).
    pub crash: u8,
    /// Out of the design: a credit's prepare copied (a recorded prepare is sent once). Its late write is a
    /// stray entry, with another token.
    pub copy: u8,
}

#[derive(Clone, Debug)]
pub struct EscrowTx {
    pub name: &'static str,
    pub kind: Kind,
    /// A second participant (not modelled but by its vote, yes or no, left to chance): aborts happen.
    pub other: bool,
}

#[derive(Clone, Debug)]
pub struct EscrowConfig {
    pub name: &'static str,
    /// H's committed balance at the start.
    pub initial: i8,
    /// The most pending credits H holds.
    pub cap: u8,
    pub txs: Vec<EscrowTx>,
    pub budget: EscrowBudget,
    pub switches: EscrowSwitches,
}

impl EscrowConfig {
    /// H at 0; C1 and C2 credit 1 each, each with a second participant that may vote no; D debits 1 with
    /// `min` 0, alone (it can only lock once a credit committed). Cap 2: both credits pending at once.
    pub fn credits(budget: EscrowBudget) -> EscrowConfig {
        EscrowConfig {
            name: "credits and a debit",
            initial: 0,
            cap: 2,
            txs: vec![
                EscrowTx { name: "C1", kind: Kind::Credit(1), other: true },
                EscrowTx { name: "C2", kind: Kind::Credit(1), other: true },
                EscrowTx { name: "D", kind: Kind::Debit { delta: -1, min: 0 }, other: false },
            ],
            budget,
            switches: EscrowSwitches::default(),
        }
    }

    /// [`EscrowConfig::credits`] without the debit: the credits alone, with every fault.
    pub fn two_credits(budget: EscrowBudget) -> EscrowConfig {
        let mut cfg = EscrowConfig::credits(budget);
        cfg.name = "two credits";
        cfg.txs.truncate(2);
        cfg
    }

    /// H at 0; C1 and C2 credit 1 each (a second participant each); P puts 3, alone, waiting for the credits
    /// to drain (the drain marker). Cap 1: a credit meets a full map.
    pub fn put(budget: EscrowBudget) -> EscrowConfig {
        EscrowConfig {
            name: "credits and a put",
            initial: 0,
            cap: 1,
            txs: vec![
                EscrowTx { name: "C1", kind: Kind::Credit(1), other: true },
                EscrowTx { name: "C2", kind: Kind::Credit(1), other: true },
                EscrowTx { name: "P", kind: Kind::Put(3), other: false },
            ],
            budget,
            switches: EscrowSwitches::default(),
        }
    }

    pub fn switches(mut self, switches: EscrowSwitches) -> EscrowConfig {
        self.switches = switches;
        self
    }

    pub fn cap(mut self, cap: u8) -> EscrowConfig {
        self.cap = cap;
        self
    }

    fn debit(&self) -> Option<(Tx, i8)> {
        self.txs.iter().position(|t| matches!(t.kind, Kind::Debit { .. })).map(|i| match self.txs[i].kind {
            Kind::Debit { min, .. } => (i as Tx, min),
            _ => unreachable!(),
        })
    }

    fn put_tx(&self) -> Option<Tx> {
        self.txs.iter().position(|t| matches!(t.kind, Kind::Put(_))).map(|i| i as Tx)
    }
}

/// A pending credit's entry in `credits`: its token; `copy` is a ghost: written by a copy of the prepare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub token: u8,
    pub copy: bool,
}

/// The exclusive lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lock {
    pub tx: Tx,
    pub token: u8,
}

/// The hot item H.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Item {
    pub balance: i8,
    pub last_tx: Option<Tx>,
    pub lock: Option<Lock>,
    /// `credits[t]`: transaction t's entry.
    pub credits: Vec<Option<Entry>>,
    /// The drain marker: the exclusive prepare waiting, and whether the marker expired.
    pub drain: Option<(Tx, bool)>,
}

impl Item {
    pub fn pending(&self) -> usize {
        self.credits.iter().flatten().count()
    }
}

/// Where a transaction's coordinator is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CPc {
    /// Not started: no record.
    Start,
    /// Record PREPARING, prepare sent: it waits for H's vote (or the deadline).
    Collect,
    /// Decided (the record's status): its commit or abort sent, it waits for the ack.
    Drive,
    Done,
    Crashed,
}

/// H's answer to the prepare, as the coordinator received it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Vote {
    None,
    Prepared(u8),
    /// CONFLICT, TIMEOUT (the cutoff: nothing written), INSUFFICIENT_FUNDS, NOT_PREPARED.
    Refused,
    /// An error: a write of unknown outcome (a lost DynamoDB reply whose retry could not vote).
    Unknown,
}

/// H's handler of the prepare, between steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hnd {
    Idle,
    /// Its write took effect with its reply lost: the SDK's retry is next (`true`: the retry of a copy's).
    Retry(bool),
    /// An exclusive prepare that wrote the drain marker: it polls.
    Draining,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TxState {
    pub pc: CPc,
    pub status: Option<Status>,
    /// The record's voted token of H (COMMITTING).
    pub voted: Option<u8>,
    pub vote: Vote,
    /// The phase of the deadline (0, 1, 2: above).
    pub phase: u8,
    /// Copies of the prepare in flight.
    pub prep: u8,
    pub hnd: Hnd,
    /// Copies of the commit or abort in flight (which one: the record's decision).
    pub second: u8,
    /// The sweeper sent the commit or abort and waits for its ack.
    pub sweep: bool,
    /// Tokens handed out (each write of the prepare takes a fresh one).
    pub tokens: u8,
    /// Ghost: the prepare was copied (the copy's write is a stray).
    pub copied: bool,
    /// Ghost: applications of the transaction's operation to H.
    pub applied: u8,
    /// Ghost: applied after the put's last application (what the put's value does not cover).
    pub after_put: bool,
}

/// Ghost bits: properties a step can break when it happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EscrowViolation {
    /// An operation applied a second time.
    AppliedTwice,
    /// An operation applied while its transaction is not decided commit.
    BadApply,
    /// An entry applied whose token is not the voted one (a stray: a copy's).
    StrayApplied,
    /// The debit's guard passed only because it counted pending credits.
    GuardCountedPending,
}

impl EscrowViolation {
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// Things that happened, for the `sometimes` checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EscrowEvent {
    /// A commit found no entry (no lock) of its transaction: applied already (a copy, a re-drive).
    CommitFoundNothing,
    /// A commit removed an entry of its transaction with another token, unapplied.
    CommitRemovedStray,
    ResolvedApplied,
    ResolvedRemoved,
    /// A prepare's write landed after its transaction decided abort.
    LateEntry,
    /// A lost DB reply's retry voted the token of the entry (lock) the first write left.
    RetryFoundOwn,
    /// A credit was refused for a full map.
    RefusedFull,
    /// A credit was refused for a lock or an unexpired drain marker.
    RefusedLocked,
    DrainWritten,
    /// An exclusive prepare locked after writing the drain marker.
    LockedAfterDrain,
    /// The debit locked while a credit was pending.
    DebitBesideCredit,
    /// A copy's stray entry removed unapplied.
    StrayRemoved,
    /// An abort with an unanswered prepare left ABORTING by its coordinator.
    LeftOpen,
}

impl EscrowEvent {
    pub fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EscrowState {
    pub item: Item,
    pub txs: Vec<TxState>,
    pub budget: EscrowBudget,
    pub violations: u8,
    /// [`EscrowEvent`] bits: left out of the state's identity (below).
    pub seen: u32,
}

/// A state's identity (its hash, which is what the checker tells states apart by) leaves out the events
/// seen, which would multiply the states by the paths that lead to each (a `sometimes` check met only on a
/// path that joins another is then lost; none is: they are all met).
impl std::hash::Hash for EscrowState {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.item.hash(h);
        self.txs.hash(h);
        self.budget.hash(h);
        self.violations.hash(h);
    }
}

impl EscrowState {
    pub fn violated(&self, v: EscrowViolation) -> bool {
        self.violations & v.bit() != 0
    }

    pub fn saw(&self, e: EscrowEvent) -> bool {
        self.seen & e.bit() != 0
    }

    pub fn status(&self, t: Tx) -> Option<Status> {
        self.txs[t as usize].status
    }

    /// Nothing in progress: no message in flight, no handler or coordinator or sweeper at work, every record
    /// (of a transaction that started) terminal.
    pub fn quiescent(&self) -> bool {
        self.txs.iter().all(|x| {
            matches!(x.pc, CPc::Start | CPc::Done | CPc::Crashed)
                && x.prep == 0
                && x.second == 0
                && x.hnd == Hnd::Idle
                && !x.sweep
                && x.status.is_none_or(Status::terminal)
        })
    }
}

/// A fault a delivery may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    None,
    /// The reply is lost (budget `loss`).
    ReplyLost,
    /// The message is copied: a copy stays in flight (budget `dup`; `copy` for a prepare).
    Copied,
    /// The prepare's DynamoDB write takes effect, its reply lost (budget `db_reply`).
    DbReply,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EscrowAction {
    /// The coordinator writes the record PREPARING and sends the prepare.
    Start(Tx),
    /// The coordinator decides (`true`: the second participant voted yes).
    Decide(Tx, bool),
    /// The coordinator's wait for the ack ends (the message or its reply lost): the record is left open.
    GiveUp(Tx),
    Crash(Tx),
    /// The transaction's deadline moves to its next phase.
    Deadline(Tx),
    /// A copy of the prepare lands at H (or is refused; a blocked one that waits takes no step).
    Prepare(Tx, Fault),
    /// An exclusive prepare meeting pending credits writes the drain marker and polls.
    Drain(Tx),
    /// A draining exclusive prepare's poll.
    Poll(Tx),
    /// The SDK's retry after a lost DynamoDB reply.
    Retry(Tx),
    /// A copy of the commit or abort lands at H.
    Second(Tx, Fault),
    /// Someone meets the transaction's entry past its deadline + 2M and resolves it.
    Resolve(Tx),
    /// The drain marker expires.
    Expire,
    /// The sweeper (past deadline + 2M): PREPARING → ABORTING, then the commit or abort sent.
    Sweep(Tx),
    /// The sweeper's wait for its ack ends (the message or its reply lost); its next run sends again.
    SweepGiveUp(Tx),
}

/// The outcome of a prepare's conditional write (and the read after a failed condition).
enum Outcome {
    /// Written (or found: `fresh` false): PREPARED with this token.
    Prepared { token: u8, fresh: bool },
    /// A lock, an unexpired marker, a full map: wait or refuse CONFLICT; `by_credits`: only pending credits
    /// (an exclusive prepare may write the drain marker).
    Blocked { by_credits: bool, full: bool },
    /// `lastTx = T`, a failed guard.
    Refused,
}

#[derive(Clone, Debug)]
pub struct EscrowModel {
    pub cfg: EscrowConfig,
}

/// The property names tests look for.
pub const APPLIED_ONCE: &str = "no operation (no credit) is applied twice";
pub const DECIDED_COMMIT: &str = "an operation is applied only while its transaction is decided commit";
pub const QUIESCENT: &str = "at quiescence the balance is the initial one plus the committed deltas (a put's value \
                             plus those applied after it), every committed operation applied once, none other, no \
                             entry (but a copy's stray under a terminal record) and no lock left";
pub const ABOVE_MIN: &str = "the balance never goes below the debit's min";
pub const GUARD_COMMITTED: &str = "the debit's guard never counts a pending credit";
pub const EXCLUSIVE_ALONE: &str = "an exclusive (not debit) lock never coexists with a pending credit entry";
pub const NO_STRAY: &str = "a stray entry (not the voted token's) is never applied";

impl EscrowModel {
    pub fn new(cfg: EscrowConfig) -> EscrowModel {
        assert!(cfg.txs.len() <= 4, "a few transactions");
        assert!(cfg.txs.iter().filter(|t| !t.kind.credit()).count() <= 1, "one exclusive transaction at most");
        EscrowModel { cfg }
    }

    pub fn tx_name(&self, t: Tx) -> &'static str {
        self.cfg.txs[t as usize].name
    }

    fn kind(&self, t: Tx) -> Kind {
        self.cfg.txs[t as usize].kind
    }

    /// The prepare's conditional write at H (a retry's or poll's too): applied to `n` if it writes.
    fn prepare_write(&self, n: &mut EscrowState, t: Tx, copy: bool) -> Outcome {
        let sw = self.cfg.switches;
        let it = &mut n.item;
        match self.kind(t) {
            Kind::Credit(_) => {
                if let Some(e) = it.credits[t as usize] {
                    return Outcome::Prepared { token: e.token, fresh: false };
                }
                let marker = it.drain.is_some_and(|(_, expired)| !expired);
                if it.lock.is_some() || marker {
                    return Outcome::Blocked { by_credits: false, full: false };
                }
                if it.pending() >= self.cfg.cap as usize {
                    return Outcome::Blocked { by_credits: false, full: true };
                }
                if it.last_tx == Some(t) {
                    return Outcome::Refused;
                }
                let x = &mut n.txs[t as usize];
                x.tokens += 1;
                let token = x.tokens;
                it.credits[t as usize] = Some(Entry { token, copy });
                Outcome::Prepared { token, fresh: true }
            }
            kind => {
                match it.lock {
                    Some(l) if l.tx == t => return Outcome::Prepared { token: l.token, fresh: false },
                    Some(_) => return Outcome::Blocked { by_credits: false, full: false },
                    None => {}
                }
                if it.last_tx == Some(t) {
                    return Outcome::Refused;
                }
                let pending: i8 = it
                    .credits
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.is_some())
                    .map(|(c, _)| match self.kind(c as Tx) {
                        Kind::Credit(d) => d,
                        _ => 0,
                    })
                    .sum();
                match kind {
                    Kind::Debit { delta, min } => {
                        let counted = if sw.guard_counts_pending { pending } else { 0 };
                        if it.balance + counted + delta < min {
                            return Outcome::Refused;
                        }
                        if it.balance + delta < min {
                            n.violations |= EscrowViolation::GuardCountedPending.bit();
                        }
                        if pending > 0 {
                            n.seen |= EscrowEvent::DebitBesideCredit.bit();
                        }
                    }
                    _ => {
                        if it.pending() > 0 && !sw.exclusive_ignores_credits {
                            return Outcome::Blocked { by_credits: true, full: false };
                        }
                    }
                }
                let x = &mut n.txs[t as usize];
                x.tokens += 1;
                let token = x.tokens;
                it.lock = Some(Lock { tx: t, token });
                if it.drain.is_some_and(|(d, _)| d == t) {
                    it.drain = None;
                }
                Outcome::Prepared { token, fresh: true }
            }
        }
    }

    /// The operation of `t` applied to H (ghosts checked): `token_ok` says whether it is the voted token's.
    fn apply_op(&self, n: &mut EscrowState, t: Tx, token_ok: bool, say: &mut impl FnMut(String)) {
        let x = &mut n.txs[t as usize];
        x.applied += 1;
        if x.applied > 1 {
            n.violations |= EscrowViolation::AppliedTwice.bit();
        }
        if !x.status.is_some_and(Status::commit) {
            n.violations |= EscrowViolation::BadApply.bit();
        }
        if !token_ok {
            n.violations |= EscrowViolation::StrayApplied.bit();
        }
        match self.kind(t) {
            Kind::Credit(d) | Kind::Debit { delta: d, .. } => {
                n.item.balance += d;
                n.txs[t as usize].after_put = true;
            }
            Kind::Put(v) => {
                n.item.balance = v;
                for c in &mut n.item.credits {
                    *c = None;
                }
                for x in &mut n.txs {
                    x.after_put = false;
                }
            }
        }
        n.item.last_tx = Some(t);
        say(format!(
            "{} applied{}: balance {}",
            self.tx_name(t),
            if token_ok { "" } else { " (NOT the voted token's)" },
            n.item.balance
        ));
    }

    /// A commit of `t` with the voted token lands at H.
    fn commit(&self, n: &mut EscrowState, t: Tx, say: &mut impl FnMut(String)) {
        let sw = self.cfg.switches;
        let voted = n.txs[t as usize].voted.expect("a commit carries the voted token");
        if self.kind(t).credit() {
            let entry = n.item.credits[t as usize];
            if sw.commit_by_last_tx {
                if n.item.last_tx != Some(t) {
                    n.item.credits[t as usize] = None;
                    self.apply_op(n, t, entry.is_none_or(|e| e.token == voted), say);
                } else {
                    n.item.credits[t as usize] = None;
                    say("lastTx = T: done".into());
                }
                return;
            }
            match entry {
                Some(e) if e.token == voted || sw.apply_any_token => {
                    n.item.credits[t as usize] = None;
                    self.apply_op(n, t, e.token == voted, say);
                }
                Some(e) => {
                    n.item.credits[t as usize] = None;
                    n.seen |= EscrowEvent::CommitRemovedStray.bit();
                    if e.copy {
                        n.seen |= EscrowEvent::StrayRemoved.bit();
                    }
                    say(format!(
                        "an entry of {} with token {} (not {voted}) removed unapplied",
                        self.tx_name(t),
                        e.token
                    ));
                }
                None => {
                    n.seen |= EscrowEvent::CommitFoundNothing.bit();
                    say("no entry: done (applied already)".into());
                }
            }
        } else {
            match n.item.lock {
                Some(l) if l.tx == t && l.token == voted => {
                    n.item.lock = None;
                    self.apply_op(n, t, true, say);
                }
                Some(l) if l.tx == t => {
                    n.item.lock = None;
                    say("a lock of T with another token released".into());
                }
                _ => {
                    n.seen |= EscrowEvent::CommitFoundNothing.bit();
                    say("no lock of T: done".into());
                }
            }
        }
    }

    /// An abort of `t` lands at H.
    fn abort(&self, n: &mut EscrowState, t: Tx, say: &mut impl FnMut(String)) {
        if n.item.credits[t as usize].take().is_some() {
            say(format!("entry of {} removed", self.tx_name(t)));
        }
        if n.item.lock.is_some_and(|l| l.tx == t) {
            n.item.lock = None;
            say(format!("lock of {} released", self.tx_name(t)));
        }
    }

    /// H's answer reaches the coordinator (if it still waits for it).
    fn answer(n: &mut EscrowState, t: Tx, vote: Vote) {
        let x = &mut n.txs[t as usize];
        if x.pc == CPc::Collect && x.vote == Vote::None {
            x.vote = vote;
        }
    }

    /// The commit or abort sent (by the coordinator or the sweeper).
    fn send_second(n: &mut EscrowState, t: Tx) {
        n.txs[t as usize].second += 1;
    }

    /// The coordinator's terminal write, on the ack of its commit or abort (the same step: nothing else
    /// reads the record between them but the sweeper, which waits for the coordinator to stop).
    fn finish(&self, n: &mut EscrowState, t: Tx, say: &mut impl FnMut(String)) {
        let x = &mut n.txs[t as usize];
        x.pc = CPc::Done;
        let status = x.status.expect("decided");
        if status.terminal() {
            say("terminal already".into());
        } else if status.commit() {
            x.status = Some(Status::Committed);
            say(format!("the coordinator, acked: {} COMMITTED", self.tx_name(t)));
        } else if matches!(x.vote, Vote::Prepared(_) | Vote::Refused) {
            x.status = Some(Status::Aborted);
            say(format!("the coordinator, acked: {} ABORTED (every prepare answered)", self.tx_name(t)));
        } else {
            n.seen |= EscrowEvent::LeftOpen.bit();
            say(format!(
                "the coordinator, acked: {} left ABORTING (a prepare unanswered) for the sweeper",
                self.tx_name(t)
            ));
        }
    }

    /// One step; `None` if it is not enabled. With `log`, what it did, line by line (for traces).
    pub fn apply(&self, s: &EscrowState, action: EscrowAction, log: bool) -> Option<(EscrowState, Vec<String>)> {
        let mut n = s.clone();
        let mut lines = vec![];
        let mut say = |line: String| {
            if log {
                lines.push(line);
            }
        };
        match action {
            EscrowAction::Start(t) => {
                let x = &mut n.txs[t as usize];
                if x.pc != CPc::Start {
                    return None;
                }
                x.pc = CPc::Collect;
                x.status = Some(Status::Preparing);
                x.prep = 1;
                say(format!("{}: record PREPARING, prepare sent to H", self.tx_name(t)));
            }
            EscrowAction::Decide(t, other_yes) => {
                let x = &mut n.txs[t as usize];
                if x.pc != CPc::Collect
                    || (!other_yes && !self.cfg.txs[t as usize].other)
                    || (x.vote == Vote::None && x.phase == 0)
                {
                    return None;
                }
                if x.status == Some(Status::Preparing) {
                    match x.vote {
                        Vote::Prepared(k) if x.phase == 0 && other_yes => {
                            x.status = Some(Status::Committing);
                            x.voted = Some(k);
                            say(format!("{}: PREPARING → COMMITTING, H's token {k}", self.tx_name(t)));
                        }
                        v => {
                            x.status = Some(Status::Aborting);
                            say(format!(
                                "{}: PREPARING → ABORTING (H: {v:?}, other: {}, phase {})",
                                self.tx_name(t),
                                if other_yes { "yes" } else { "no" },
                                x.phase
                            ));
                        }
                    }
                } else {
                    say(format!("{}: the record is {:?} already: followed", self.tx_name(t), x.status));
                }
                x.pc = CPc::Drive;
                Self::send_second(&mut n, t);
            }
            EscrowAction::GiveUp(t) => {
                let x = &mut n.txs[t as usize];
                if x.pc != CPc::Drive || x.second > 0 {
                    return None;
                }
                x.pc = CPc::Done;
                say(format!("{}: no ack: the record is left {:?} for the sweeper", self.tx_name(t), x.status));
            }
            EscrowAction::Crash(t) => {
                let x = &mut n.txs[t as usize];
                if n.budget.crash == 0 || !matches!(x.pc, CPc::Collect | CPc::Drive) || !self.kind(t).credit() {
                    return None;
                }
                n.budget.crash -= 1;
                x.pc = CPc::Crashed;
            }
            EscrowAction::Deadline(t) => {
                let x = &mut n.txs[t as usize];
                if x.pc == CPc::Start || x.phase >= 2 {
                    return None;
                }
                x.phase += 1;
            }
            EscrowAction::Prepare(t, fault) => {
                if n.txs[t as usize].prep == 0 {
                    return None;
                }
                if fault != Fault::None && !self.kind(t).credit() {
                    return None;
                }
                match fault {
                    Fault::None => {}
                    Fault::ReplyLost => {
                        if n.budget.loss == 0 {
                            return None;
                        }
                        n.budget.loss -= 1;
                    }
                    Fault::Copied => {
                        if n.budget.copy == 0 {
                            return None;
                        }
                        n.budget.copy -= 1;
                        n.txs[t as usize].prep += 1;
                    }
                    Fault::DbReply => {
                        if n.budget.db_reply == 0 {
                            return None;
                        }
                        n.budget.db_reply -= 1;
                    }
                }
                let copy = n.txs[t as usize].copied;
                if fault == Fault::Copied {
                    n.txs[t as usize].copied = true;
                }
                n.txs[t as usize].prep -= 1;
                if n.txs[t as usize].phase >= 2 {
                    if fault == Fault::DbReply {
                        return None;
                    }
                    say("past the cutoff: TIMEOUT, nothing written".into());
                    if fault != Fault::ReplyLost {
                        Self::answer(&mut n, t, Vote::Refused);
                    }
                } else {
                    match self.prepare_write(&mut n, t, copy) {
                        Outcome::Prepared { token, fresh } => {
                            if fresh && n.txs[t as usize].status.is_some_and(Status::abort) {
                                n.seen |= EscrowEvent::LateEntry.bit();
                            }
                            say(format!(
                                "{} at H: {} token {token}",
                                self.tx_name(t),
                                if fresh { "written," } else { "found its own," }
                            ));
                            match fault {
                                Fault::DbReply => {
                                    if !fresh {
                                        return None;
                                    }
                                    n.txs[t as usize].hnd = Hnd::Retry(copy);
                                    say("the write's reply lost: the SDK retries".into());
                                }
                                Fault::ReplyLost => say("the vote is lost".into()),
                                _ => Self::answer(&mut n, t, Vote::Prepared(token)),
                            }
                        }
                        Outcome::Blocked { full, .. } => {
                            if fault == Fault::DbReply {
                                return None;
                            }
                            if self.kind(t).credit() {
                                n.seen |=
                                    if full { EscrowEvent::RefusedFull } else { EscrowEvent::RefusedLocked }.bit();
                            }
                            say(format!(
                                "{} blocked ({}): refused CONFLICT (waiting is not taking this step yet)",
                                self.tx_name(t),
                                if full { "the map is full" } else { "a lock, a marker or pending credits" }
                            ));
                            if fault != Fault::ReplyLost {
                                Self::answer(&mut n, t, Vote::Refused);
                            }
                        }
                        Outcome::Refused => {
                            if fault == Fault::DbReply {
                                return None;
                            }
                            say(format!("{} refused (lastTx = T, or its guard)", self.tx_name(t)));
                            if fault != Fault::ReplyLost {
                                Self::answer(&mut n, t, Vote::Refused);
                            }
                        }
                    }
                }
            }
            EscrowAction::Drain(t) => {
                let x = &n.txs[t as usize];
                if x.prep == 0 || x.phase >= 2 || !matches!(self.kind(t), Kind::Put(_)) {
                    return None;
                }
                let mut probe = n.clone();
                if !matches!(self.prepare_write(&mut probe, t, false), Outcome::Blocked { by_credits: true, .. }) {
                    return None;
                }
                n.txs[t as usize].prep -= 1;
                n.txs[t as usize].hnd = Hnd::Draining;
                n.item.drain = Some((t, false));
                n.seen |= EscrowEvent::DrainWritten.bit();
                say(format!("credits pending: drain marker {} written; it polls", self.tx_name(t)));
            }
            EscrowAction::Poll(t) => {
                if n.txs[t as usize].hnd != Hnd::Draining {
                    return None;
                }
                if n.txs[t as usize].phase >= 2 {
                    n.txs[t as usize].hnd = Hnd::Idle;
                    say("past the cutoff: TIMEOUT (the marker stays until it expires)".into());
                    Self::answer(&mut n, t, Vote::Refused);
                } else {
                    match self.prepare_write(&mut n, t, false) {
                        Outcome::Prepared { token, .. } => {
                            n.txs[t as usize].hnd = Hnd::Idle;
                            n.seen |= EscrowEvent::LockedAfterDrain.bit();
                            say(format!("drained: locked, token {token}, marker removed"));
                            Self::answer(&mut n, t, Vote::Prepared(token));
                        }
                        Outcome::Blocked { .. } => return None,
                        Outcome::Refused => {
                            n.txs[t as usize].hnd = Hnd::Idle;
                            Self::answer(&mut n, t, Vote::Refused);
                        }
                    }
                }
            }
            EscrowAction::Retry(t) => {
                let Hnd::Retry(copy) = n.txs[t as usize].hnd else { return None };
                n.txs[t as usize].hnd = Hnd::Idle;
                if n.txs[t as usize].phase >= 2 {
                    say("the retry is past the cutoff: an error (outcome unknown)".into());
                    Self::answer(&mut n, t, Vote::Unknown);
                } else {
                    match self.prepare_write(&mut n, t, copy) {
                        Outcome::Prepared { token, fresh } => {
                            if !fresh {
                                n.seen |= EscrowEvent::RetryFoundOwn.bit();
                            } else if n.txs[t as usize].status.is_some_and(Status::abort) {
                                n.seen |= EscrowEvent::LateEntry.bit();
                            }
                            say(format!(
                                "the retry: {} token {token}",
                                if fresh { "written," } else { "found its own," }
                            ));
                            Self::answer(&mut n, t, Vote::Prepared(token));
                        }
                        _ => {
                            say("the retry fails: an error (outcome unknown)".into());
                            Self::answer(&mut n, t, Vote::Unknown);
                        }
                    }
                }
            }
            EscrowAction::Second(t, fault) => {
                if n.txs[t as usize].second == 0 || (fault != Fault::None && !self.kind(t).credit()) {
                    return None;
                }
                match fault {
                    Fault::None => {}
                    Fault::ReplyLost => {
                        if n.budget.loss == 0 {
                            return None;
                        }
                        n.budget.loss -= 1;
                    }
                    Fault::Copied => {
                        if n.budget.dup == 0 {
                            return None;
                        }
                        n.budget.dup -= 1;
                        n.txs[t as usize].second += 1;
                    }
                    Fault::DbReply => return None,
                }
                n.txs[t as usize].second -= 1;
                let status = n.txs[t as usize].status.expect("decided");
                if status.commit() {
                    say(format!("commit of {} at H", self.tx_name(t)));
                    self.commit(&mut n, t, &mut say);
                } else {
                    say(format!("abort of {} at H", self.tx_name(t)));
                    self.abort(&mut n, t, &mut say);
                }
                if fault == Fault::ReplyLost {
                    say("its ack is lost".into());
                } else if n.txs[t as usize].pc == CPc::Drive {
                    self.finish(&mut n, t, &mut say);
                } else if n.txs[t as usize].sweep {
                    let x = &mut n.txs[t as usize];
                    x.sweep = false;
                    let status = x.status.expect("decided");
                    if !status.terminal() {
                        x.status = Some(status.terminal_of());
                        say(format!("the sweeper, acked: {} {:?}", self.tx_name(t), status.terminal_of()));
                    }
                }
            }
            EscrowAction::Resolve(t) => {
                let x = &n.txs[t as usize];
                let e = n.item.credits[t as usize]?;
                if x.phase < 2 || x.status == Some(Status::Preparing) {
                    return None;
                }
                let sw = self.cfg.switches;
                let status = x.status.expect("recorded");
                let voted = x.voted;
                let apply = status == Status::Committing
                    && if sw.commit_by_last_tx {
                        n.item.last_tx != Some(t)
                    } else {
                        sw.apply_any_token || voted == Some(e.token)
                    };
                n.item.credits[t as usize] = None;
                say(format!("an entry of {} (token {}) met; its record {status:?}", self.tx_name(t), e.token));
                if apply {
                    n.seen |= EscrowEvent::ResolvedApplied.bit();
                    self.apply_op(&mut n, t, voted == Some(e.token), &mut say);
                } else {
                    n.seen |= EscrowEvent::ResolvedRemoved.bit();
                    if e.copy {
                        n.seen |= EscrowEvent::StrayRemoved.bit();
                    }
                    say("removed unapplied".into());
                }
            }
            EscrowAction::Expire => {
                match &mut n.item.drain {
                    Some((_, expired)) if !*expired => *expired = true,
                    _ => return None,
                }
                say("the drain marker expired".into());
            }
            EscrowAction::Sweep(t) => {
                let x = &mut n.txs[t as usize];
                if x.phase < 2
                    || x.sweep
                    || x.status.is_none_or(Status::terminal)
                    || !matches!(x.pc, CPc::Done | CPc::Crashed)
                {
                    return None;
                }
                if x.status == Some(Status::Preparing) {
                    x.status = Some(Status::Aborting);
                    say(format!("sweeper: {} PREPARING → ABORTING (past deadline + 2M)", self.tx_name(t)));
                }
                x.sweep = true;
                say(format!("sweeper: {:?} of {} sent", x.status.expect("decided"), self.tx_name(t)));
                Self::send_second(&mut n, t);
            }
            EscrowAction::SweepGiveUp(t) => {
                let x = &mut n.txs[t as usize];
                if !x.sweep || x.second > 0 {
                    return None;
                }
                x.sweep = false;
                say("sweeper: no ack; its next run sends again".into());
            }
        }
        self.normalise(&mut n);
        Some((n, lines))
    }

    /// A transaction that ended (its record terminal, its coordinator stopped, nothing of it in flight or at
    /// H) is past its deadline + 2M for good: its phase, which nothing reads any more, is set to 2, so that
    /// the moments its clock moved after its end make no states of their own.
    fn normalise(&self, n: &mut EscrowState) {
        for t in 0..n.txs.len() {
            let x = &mut n.txs[t];
            // Past the deadline, with no prepare (retry, poll) of it left that could land: the cutoff is as good
            // as passed (a resolver or the sweeper acting earlier than deadline + 2M is more behaviour, not
            // less), and so is phase 2.
            if x.phase == 1 && x.prep == 0 && x.hnd == Hnd::Idle {
                x.phase = 2;
            }
            // What nothing reads any more: the vote once the coordinator stopped, an ack nobody waits for.
            if matches!(x.pc, CPc::Done | CPc::Crashed) {
                x.vote = Vote::None;
            }
            let x = &n.txs[t];
            if x.phase < 2
                && matches!(x.pc, CPc::Done | CPc::Crashed)
                && x.status.is_some_and(Status::terminal)
                && x.prep == 0
                && x.second == 0
                && x.hnd == Hnd::Idle
                && !x.sweep
                && n.item.credits[t].is_none()
                && n.item.lock.is_none_or(|l| l.tx as usize != t)
            {
                n.txs[t].phase = 2;
            }
        }
    }

    /// The quiescence property ([`QUIESCENT`]), at a quiescent state.
    fn settled_right(&self, s: &EscrowState) -> bool {
        if s.item.lock.is_some() {
            return false;
        }
        let mut expected = self.cfg.initial;
        if let Some(p) = self.cfg.put_tx()
            && s.status(p) == Some(Status::Committed)
            && let Kind::Put(v) = self.kind(p)
        {
            expected = v;
        }
        for (t, x) in s.txs.iter().enumerate() {
            let t = t as Tx;
            let committed = x.status == Some(Status::Committed);
            if x.applied != u8::from(committed) {
                return false;
            }
            let counts = self.cfg.put_tx().is_none_or(|p| s.status(p) != Some(Status::Committed) || x.after_put);
            match self.kind(t) {
                Kind::Credit(d) | Kind::Debit { delta: d, .. } if committed && counts => expected += d,
                _ => {}
            }
            if let Some(e) = s.item.credits[t as usize]
                && !(e.copy && x.status.is_some_and(Status::terminal))
            {
                return false;
            }
        }
        s.item.balance == expected
    }
}

impl Model for EscrowModel {
    type State = EscrowState;
    type Action = EscrowAction;

    fn init_states(&self) -> Vec<EscrowState> {
        let n = self.cfg.txs.len();
        vec![EscrowState {
            item: Item { balance: self.cfg.initial, last_tx: None, lock: None, credits: vec![None; n], drain: None },
            txs: vec![
                TxState {
                    pc: CPc::Start,
                    status: None,
                    voted: None,
                    vote: Vote::None,
                    phase: 0,
                    prep: 0,
                    hnd: Hnd::Idle,
                    second: 0,
                    sweep: false,
                    tokens: 0,
                    copied: false,
                    applied: 0,
                    after_put: false,
                };
                n
            ],
            budget: self.cfg.budget,
            violations: 0,
            seen: 0,
        }]
    }

    /// Every action that may be enabled; `next_state` answers `None` for those that are not.
    fn actions(&self, s: &EscrowState, out: &mut Vec<EscrowAction>) {
        use EscrowAction::*;
        for t in 0..self.cfg.txs.len() as Tx {
            let x = &s.txs[t as usize];
            match x.pc {
                CPc::Start => out.push(Start(t)),
                CPc::Collect => {
                    out.push(Decide(t, true));
                    out.push(Decide(t, false));
                    out.push(Crash(t));
                }
                CPc::Drive => {
                    out.push(GiveUp(t));
                    out.push(Crash(t));
                }
                CPc::Done | CPc::Crashed => {}
            }
            if x.pc != CPc::Start {
                out.push(Deadline(t));
            }
            if x.prep > 0 {
                for f in [Fault::None, Fault::ReplyLost, Fault::Copied, Fault::DbReply] {
                    out.push(Prepare(t, f));
                }
                out.push(Drain(t));
            }
            match x.hnd {
                Hnd::Retry(_) => out.push(Retry(t)),
                Hnd::Draining => out.push(Poll(t)),
                Hnd::Idle => {}
            }
            if x.second > 0 {
                for f in [Fault::None, Fault::ReplyLost, Fault::Copied] {
                    out.push(Second(t, f));
                }
            }
            if s.item.credits[t as usize].is_some() {
                out.push(Resolve(t));
            }
            if x.phase >= 2 {
                out.push(Sweep(t));
                out.push(SweepGiveUp(t));
            }
        }
        if s.item.drain.is_some() {
            out.push(Expire);
        }
    }

    fn next_state(&self, s: &EscrowState, action: EscrowAction) -> Option<EscrowState> {
        self.apply(s, action, false).map(|(n, _)| n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let cfg = &self.cfg;
        let b = cfg.budget;
        let credits = cfg.txs.iter().filter(|t| t.kind.credit()).count();
        let mut p = vec![
            Property::<Self>::always(APPLIED_ONCE, |_, s| !s.violated(EscrowViolation::AppliedTwice)),
            Property::<Self>::always(DECIDED_COMMIT, |_, s| !s.violated(EscrowViolation::BadApply)),
            Property::<Self>::always(QUIESCENT, |m, s| !s.quiescent() || m.settled_right(s)),
            Property::<Self>::always(EXCLUSIVE_ALONE, |m, s| {
                s.item.lock.is_none_or(|l| matches!(m.kind(l.tx), Kind::Debit { .. })) || s.item.pending() == 0
            }),
            Property::<Self>::always(NO_STRAY, |_, s| !s.violated(EscrowViolation::StrayApplied)),
            Property::<Self>::sometimes("sometimes every transaction commits", |_, s| {
                s.txs.iter().all(|x| x.status == Some(Status::Committed))
            }),
            Property::<Self>::sometimes("sometimes a credit aborts after its entry was written", |m, s| {
                s.txs.iter().enumerate().any(|(t, x)| {
                    m.kind(t as Tx).credit() && x.status == Some(Status::Aborted) && x.tokens > 0 && x.applied == 0
                })
            }),
            Property::<Self>::sometimes(
                "sometimes a prepare's write lands after its transaction decided abort",
                seen::<{ EscrowEvent::LateEntry as u32 }>,
            ),
            Property::<Self>::sometimes(
                "sometimes an abort with an unanswered prepare is left ABORTING, and the sweeper ends it",
                |_, s| {
                    s.saw(EscrowEvent::LeftOpen)
                        && s.txs
                            .iter()
                            .any(|x| x.status == Some(Status::Aborted) && !x.sweep && x.pc == CPc::Done && x.tokens > 0)
                },
            ),
            Property::<Self>::sometimes(
                "sometimes resolution applies an entry (its owner COMMITTING, the voted token)",
                seen::<{ EscrowEvent::ResolvedApplied as u32 }>,
            ),
            Property::<Self>::sometimes(
                "sometimes resolution removes an entry unapplied",
                seen::<{ EscrowEvent::ResolvedRemoved as u32 }>,
            ),
        ];
        if b.dup > 0 || b.loss > 0 {
            p.push(Property::<Self>::sometimes(
                "sometimes a commit finds no entry or lock of its transaction (applied already)",
                seen::<{ EscrowEvent::CommitFoundNothing as u32 }>,
            ));
        }
        if credits < cfg.txs.len() {
            p.push(Property::<Self>::sometimes(
                "sometimes a credit is refused for a lock or a drain marker",
                |_, s| s.saw(EscrowEvent::RefusedLocked),
            ));
        }
        if cfg.cap >= 2 && credits >= 2 {
            p.push(Property::<Self>::sometimes("sometimes two credits are pending at once", |_, s| {
                s.item.pending() >= 2
            }));
        }
        if (cfg.cap as usize) < credits {
            p.push(Property::<Self>::sometimes(
                "sometimes a credit is refused for a full map",
                seen::<{ EscrowEvent::RefusedFull as u32 }>,
            ));
        }
        if cfg.debit().is_some() {
            p.push(Property::<Self>::always(ABOVE_MIN, |m, s| {
                m.cfg.debit().is_none_or(|(_, min)| s.item.balance >= min)
            }));
            p.push(Property::<Self>::always(GUARD_COMMITTED, |_, s| !s.violated(EscrowViolation::GuardCountedPending)));
            p.push(Property::<Self>::sometimes(
                "sometimes the debit locks while a credit is pending",
                seen::<{ EscrowEvent::DebitBesideCredit as u32 }>,
            ));
            p.push(Property::<Self>::sometimes("sometimes the debit commits", |m, s| {
                m.cfg.debit().is_some_and(|(d, _)| s.status(d) == Some(Status::Committed))
            }));
        }
        if cfg.put_tx().is_some() && !cfg.switches.exclusive_ignores_credits {
            p.push(Property::<Self>::sometimes(
                "sometimes the put writes the drain marker",
                seen::<{ EscrowEvent::DrainWritten as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes the credits drained while the put polls (its next poll locks)",
                |_, s| {
                    s.item.pending() == 0
                        && s.item.lock.is_none()
                        && s.txs.iter().any(|x| x.hnd == Hnd::Draining && x.phase < 2)
                },
            ));
            p.push(Property::<Self>::sometimes("sometimes a drain marker expires", |_, s| {
                s.item.drain.is_some_and(|(_, expired)| expired)
            }));
        }
        if b.db_reply > 0 {
            p.push(Property::<Self>::sometimes(
                "sometimes a lost DynamoDB reply's retry votes the token its first write left",
                seen::<{ EscrowEvent::RetryFoundOwn as u32 }>,
            ));
        }
        if b.crash > 0 {
            p.push(Property::<Self>::sometimes(
                "sometimes a crashed coordinator's commit is finished by the sweeper",
                |_, s| s.txs.iter().any(|x| x.pc == CPc::Crashed && x.status == Some(Status::Committed)),
            ));
        }
        if b.copy > 0 && (b.dup > 0 || b.loss > 0) {
            p.push(Property::<Self>::sometimes(
                "sometimes a commit removes an entry of its transaction with another token (a copy's), unapplied",
                seen::<{ EscrowEvent::CommitRemovedStray as u32 }>,
            ));
        }
        if b.copy > 0 {
            p.push(Property::<Self>::sometimes(
                "sometimes a copy's stray entry is removed unapplied",
                seen::<{ EscrowEvent::StrayRemoved as u32 }>,
            ));
        }
        p
    }

    fn format_action(&self, action: &EscrowAction) -> String {
        format!("{action:?}")
    }
}

/// `sometimes`: the event `E` happened.
fn seen<const E: u32>(_: &EscrowModel, s: &EscrowState) -> bool {
    s.seen & (1 << E) != 0
}

/// What one exhaustive check of the escrow model found ([`check`]).
pub type EscrowRun = Run<EscrowModel>;

impl Traced for EscrowModel {
    fn heading(&self) -> String {
        let cfg = &self.cfg;
        let sw = cfg.switches;
        let on: Vec<&str> = [
            ("commit_by_last_tx", sw.commit_by_last_tx),
            ("apply_any_token", sw.apply_any_token),
            ("guard_counts_pending", sw.guard_counts_pending),
            ("exclusive_ignores_credits", sw.exclusive_ignores_credits),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| *name)
        .collect();
        let b = cfg.budget;
        format!(
            "escrow model {:?} ({}; cap {}; faults: loss {} duplicate {} lost DB reply {} crash {} prepare copy {})",
            cfg.name,
            if on.is_empty() { "the design".to_owned() } else { format!("WRONG: {}", on.join(", ")) },
            cfg.cap,
            b.loss,
            b.dup,
            b.db_reply,
            b.crash,
            b.copy,
        )
    }

    fn explain(&self, s: &EscrowState, action: EscrowAction) -> Option<Vec<String>> {
        self.apply(s, action, true).map(|(_, lines)| lines)
    }

    /// One line: H, then each transaction's record and ghosts.
    fn summary(&self, s: &EscrowState) -> String {
        let it = &s.item;
        let credits: Vec<String> = it
            .credits
            .iter()
            .enumerate()
            .filter_map(|(t, e)| {
                e.map(|e| format!("{}/{}{}", self.tx_name(t as Tx), e.token, if e.copy { " (copy)" } else { "" }))
            })
            .collect();
        let txs: Vec<String> = s
            .txs
            .iter()
            .enumerate()
            .map(|(t, x)| {
                format!(
                    "{} {:?} {:?} applied {}",
                    self.tx_name(t as Tx),
                    x.pc,
                    x.status.map_or("-".to_owned(), |st| format!("{st:?}")),
                    x.applied
                )
            })
            .collect();
        format!(
            "H balance {} lastTx {} lock {} credits [{}] drain {:?}; [{}]",
            it.balance,
            it.last_tx.map_or("-", |t| self.tx_name(t)),
            it.lock.map_or("-".to_owned(), |l| format!("{}/{}", self.tx_name(l.tx), l.token)),
            credits.join(", "),
            it.drain.map(|(t, e)| (self.tx_name(t), e)),
            txs.join(", ")
        )
    }
}
