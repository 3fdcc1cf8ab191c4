//! Issue 35: a request refused for contention is retried by its coordinator keeping its age, and the oldest
//! contending request is never refused for ever. A model of its own, next to [`crate::TwoPc`]: the retry
//! loop is above the two-phase commit (each attempt is an ordinary transaction, which the main model
//! checks), so this one keeps of each attempt only what the retry reads and writes, and checks every
//! interleaving of two or three requests contending for the same two items.
//!
//! What is modelled (DETAILS.md, "Retries that keep their age", says what is left out):
//!
//! | step | mirrors |
//! |---|---|
//! | start | `submit::answer_authorized` → `attempts::run` → `run_two_phase`: attempt 1 of request `Lk`; its age (`startedAt`) is the coordinator's clock, so the requests' ages are the order of their first starts (L0 oldest). A keyed attempt's record is created PREPARING first (`create_own`). Its prepares go out at once (`PhaseEngine::prepare`, in parallel), or, with [`AgeConfig::hot_first_attempts`], one at a time from either item (`HotItems::first_hot`: an item that refused a transaction lately, in its coordinator's memory; of two, the first by service and entity: any choice covers it) |
//! | prepare | participant/prepare.rs `settle`: the item free → locked for the attempt; locked by another attempt O: if this one may wait for O (`Waiting::may_wait_for`: it holds no lock anywhere, `holds_no_locks`, the first prepare of an attempt that prepares one at a time; or it is older by (startedAt, id)), it waits (`wait_for_release`: no step until the item's lock is no longer O's, then it tries again — the code skips the lock write when the lock passed to an owner it may wait for and waits for that one, which is this step's try failing and waiting again, without the request; or its one read of O's record, `settle_owner` after a few polls, finds O decided, settles O's lock and tries again); else O's record is read (`settle_owner`): decided → O's lock settled (`resolve`: rolled forward or released) and tried again, a step later; undecided → refused CONFLICT at once, naming O (`blockedBy`). Each prepare is a step of its own, in any order (the network reorders); one at a time, the next prepare is sent when the previous one locked |
//! | decision | `run_two_phase`: every vote asked for is in (`PhaseEngine::prepare`: in parallel it waits for every vote, one at a time it stops at the first refusal: the other participant is not asked) → all locked: commit (keyed `transition` PREPARING → COMMITTING, unkeyed `create` COMMITTING); a refusal: abort (keyed → ABORTING; unkeyed `create_abort`: ABORTED created while the releases are on their way), keeping the first participant (in the request's order A, B) whose vote names a `blockedBy`: where (`blocked_at`) and whom |
//! | second phase | `drive`: each commit or release lands at its item (a step per item; a lock a prepare settled already is found gone), then the terminal write (COMMITTED / keyed ABORTED) |
//! | claim | `next_attempt`: attempt < `MAX_ATTEMPTS` (else the request gives up: 409), then `TransactionStore::claim_successor` (`SET retriedAs = :next IF status IN (ABORTING, ABORTED) AND (attribute_not_exists(retriedAs) OR retriedAs = :next)`); its reply may be lost, and the SDK's retry finds `retriedAs = :next` (`Claim::Claimed`). No wait for the blocker ([`AgeSwitches::retry_waits_at_refusal`]). Since issue 41 the code names the successor in the abort write itself (`retriedAs` with `refusedForContention`), which [`crate::chain`] models; for wait-die's bound the two are the same step |
//! | next attempt | `TransactionRecord::next_attempt`: attempt n + 1 with the same `startedAt` (its age), its record created PREPARING first if keyed; a record found there (a replay fenced it) → the coordinator follows it: ABORTED, 409, and stops. Then `run_two_phase(first = blocked_at)` → `PhaseEngine::prepare`: one participant at a time, from the one where attempt n was refused (A if no vote named a `blockedBy`), its first prepare `holds_no_locks` |
//! | replay | a client's retry with the same Idempotency-Key (`replay`): finds attempt 1's record, follows `retriedAs` links (a read per hop); a link to an attempt without a record → the fence (`abort_if_absent`: created ABORTED conditionally; if the create loses, the record found is followed); a record COMMITTING/COMMITTED → 202/200; a record decided abort that names no successor → see [`AgeSwitches::replay_waits_for_retry`]; a PREPARING one → it waits |
//!
//! Faults: the claim's reply lost (a budget), and the coordinator crashing between the claim and creating
//! the next attempt (a budget): a replay then finds the link to no record and fences it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use stateright::{Model, Property};

pub use crate::report::check;
use crate::report::{Run, Traced};
use crate::state::Status;

/// A request (a client's POST, the chain of attempts the coordinator runs for it), by its index in
/// [`AgeConfig::requests`]. The index is also the order of first starts: L0 starts first.
pub type Rq = u8;

/// The items every request wants: A at service-a, B at service-b.
pub const ITEMS: [&str; 2] = ["A", "B"];

/// Issue 35's changes the model can switch back, one at a time. `AgeSwitches::default()` is the protocol as
/// the code implements it (the working tree after `git show 1c8e426`: a retry prepares one participant at a
/// time from where its predecessor was refused, its first prepare waiting for any lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AgeSwitches {
    /// On: attempt n + 1 carries its request's first `startedAt` (`TransactionRecord::next_attempt`, the
    /// record's `startedAt`). Off (before issue 35: a client's retry was a new transaction): a retry is as
    /// young as the coordinator's clock at its start, younger than every age handed out so far.
    pub kept_age: bool,
    /// On: a prepare that may wait waits until the lock changes (`wait_for_release`; its budget, up to 5 s,
    /// ends in TIMEOUT, which is not retried: out of the model, which has no clock). Off (the wait limit
    /// before issue 35, `MAX_LOCK_WAIT_MS = 200`, then CONFLICT): a waiting prepare may give up at any moment
    /// and refuse CONFLICT, which its coordinator retries as any other CONFLICT.
    pub older_waits: bool,
    /// On (`run` → `PhaseEngine::prepare` (its `PrepareOrder`)): a retry prepares one participant at a time, from the one where its
    /// predecessor was refused (`blocked_at`), and its first prepare, holding no lock anywhere
    /// (`holds_no_locks`), waits for the lock there whoever holds it (`Waiting::may_wait_for`) instead of
    /// being refused by it again; the next prepare follows wait-die. Off: a retry prepares as a first attempt
    /// does, every participant at once with wait-die, and starts at once (no wait for the blocker either).
    pub retry_waits_at_refusal: bool,
    /// On (`PhaseEngine::prepare`: `width` 1 whenever `holds_no_locks` is set on the first prepare): an attempt whose
    /// first prepare says it holds no lock sends its next prepare only once that one locked, so that it
    /// really holds none while it waits. Off: its prepares go out at once, the first still saying it holds
    /// no lock (the flag without the order that makes it true): its wait can close a cycle.
    pub one_at_a_time: bool,
    /// On (participant/prepare.rs `settle` → `settle_owner`): a prepare that may not wait for a live lock
    /// reads its owner's record first, and a decided owner's lock (COMMITTING or ABORTING or ended: its commit
    /// or release is on its way) is settled at once, as lock resolution does (`resolve`: rolled forward or
    /// released), and the lock is tried again; a waiting prepare reads it once after a few polls, and does
    /// the same. Off (design.md as written): the lock is taken by its age; a decided attempt's lock stays
    /// until its commit or release lands, and refuses a younger prepare until then (the retry's second one
    /// included), as often as it comes back: the attempts are not bounded by the number of older attempts.
    pub decided_owner_settled: bool,
    /// On (the coordinator's `replay` → `may_be_retried`): a replay that finds the chain's last record decided
    /// abort, refused for contention only, with attempts left and naming no successor, waits (its coordinator
    /// may still claim the next attempt and run it) until a successor is named, or its answer budget or the
    /// deadline runs out (at any moment, in the model); then it fences the next attempt's id (`abort_if_absent`:
    /// created ABORTED unless it exists) and reads the record again: a successor named meanwhile is followed,
    /// else it answers 409, and the coordinator's create of that attempt loses to the fence. Off (design.md
    /// as written: "the answer is the last record's"): it answers 409 at once, and the coordinator may then
    /// claim the next attempt and commit it.
    pub replay_waits_for_retry: bool,
}

impl Default for AgeSwitches {
    fn default() -> Self {
        AgeSwitches {
            kept_age: true,
            older_waits: true,
            retry_waits_at_refusal: true,
            one_at_a_time: true,
            decided_owner_settled: true,
            replay_waits_for_retry: true,
        }
    }
}

/// Faults left (each is consumed when it happens).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AgeBudget {
    /// A coordinator crashes after its claim of the next attempt took effect, before it created (or started)
    /// that attempt.
    pub crash: u8,
    /// A claim write takes effect and its reply is lost (the SDK retries the same conditional write).
    pub claim_reply: u8,
}

/// One request: both items, in the order A, B (`participants`: `blocked_at` is the first in that order whose
/// vote names a `blockedBy`).
#[derive(Clone, Debug)]
pub struct Request {
    pub name: &'static str,
    /// With an Idempotency-Key: each attempt's record is created PREPARING before its prepares.
    pub keyed: bool,
    /// Its client sends the same key again, once, at any moment after the first (a replay). Keyed only.
    pub replay: bool,
}

#[derive(Clone, Debug)]
pub struct AgeConfig {
    pub name: &'static str,
    pub requests: Vec<Request>,
    /// `MAX_ATTEMPTS` (16 in the code): an attempt refused at this number is not retried (the request gives
    /// up). The configurations set it to [`AgeConfig::bound`]: that no request gives up then is the bound.
    pub max_attempts: u8,
    /// A first attempt may also prepare one participant at a time, from either item (`HotItems::first_hot`:
    /// its coordinator saw that item refuse a transaction lately, which the model leaves to chance); else
    /// every first attempt prepares in parallel. Not L0's: the oldest waits at every lock either way, so its
    /// prepares one at a time are one of the orders its parallel ones may arrive in (and it would multiply
    /// the states by five).
    pub hot_first_attempts: bool,
    pub budget: AgeBudget,
    pub switches: AgeSwitches,
}

impl AgeConfig {
    /// L0 (unkeyed) and L1 (keyed, its client retries the key once) contend for A and B.
    pub fn two(budget: AgeBudget) -> AgeConfig {
        AgeConfig {
            name: "two requests",
            requests: vec![
                Request { name: "L0", keyed: false, replay: false },
                Request { name: "L1", keyed: true, replay: true },
            ],
            max_attempts: 2,
            hot_first_attempts: true,
            budget,
            switches: AgeSwitches::default(),
        }
    }

    /// [`AgeConfig::two`] and L2 (unkeyed), which starts after L1's first attempt started (a later arrival).
    pub fn three(budget: AgeBudget) -> AgeConfig {
        let mut cfg = AgeConfig::two(budget);
        cfg.name = "three requests";
        cfg.requests.push(Request { name: "L2", keyed: false, replay: false });
        cfg.max_attempts = cfg.bound();
        cfg
    }

    /// [`AgeConfig::three`] with every request keyed and replayed once (larger: `MODEL_BIG`).
    pub fn three_keyed(budget: AgeBudget) -> AgeConfig {
        let mut cfg = AgeConfig::three(budget);
        cfg.name = "three keyed requests";
        for r in &mut cfg.requests {
            r.keyed = true;
            r.replay = true;
        }
        cfg
    }

    pub fn switches(mut self, switches: AgeSwitches) -> AgeConfig {
        self.switches = switches;
        self
    }

    pub fn hot_first_attempts(mut self, hot: bool) -> AgeConfig {
        self.hot_first_attempts = hot;
        self
    }

    pub fn max_attempts(mut self, n: u8) -> AgeConfig {
        self.max_attempts = n;
        self
    }

    /// The attempts request `k` (L0 the oldest) may need: 1, 2, 4, ... 2^k. Each refused attempt names one
    /// older attempt, undecided (`blockedBy`; a decided one's lock is settled, not refused by). The next
    /// attempt's first prepare, where that one refused it, holds nothing and waits until that lock goes, that
    /// is until the named attempt is decided; its other prepare may be refused, by an undecided attempt, so
    /// not one named before. So no older attempt is named twice, and request k needs at most 1 + the attempts
    /// of L0..L(k-1).
    pub fn bound_of(k: usize) -> u8 {
        1 << k
    }

    /// The attempts the youngest request may need ([`AgeConfig::bound_of`]).
    pub fn bound(&self) -> u8 {
        Self::bound_of(self.requests.len() - 1)
    }
}

/// Attempt `n` (from 1) of request `req`: its id is the request's first id, then `-n` for n ≥ 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attempt {
    pub req: Rq,
    pub n: u8,
}

/// An item's `lock`: the owner attempt and its `startedAt` (the lock keeps it: wait-die compares it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ALock {
    pub owner: Attempt,
    pub age: u8,
}

/// An attempt's record in the transactions table: its status, and whether `retriedAs` names the next
/// attempt (the only id anyone claims: `<first>-<n+1>`). `fenced` is a ghost: a replay created it ABORTED.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ARecord {
    pub status: Status,
    pub retried_as: bool,
    pub fenced: bool,
}

impl ARecord {
    /// Written by the attempt's coordinator.
    fn new(status: Status) -> ARecord {
        ARecord { status, retried_as: false, fenced: false }
    }

    /// A replay's fence (`abort_if_absent`).
    fn fence() -> ARecord {
        ARecord { status: Status::Aborted, retried_as: false, fenced: true }
    }
}

/// One prepare of the current attempt, at one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prep {
    /// Not sent: no attempt yet, or the later prepare of an attempt that prepares one at a time, before the
    /// earlier one locked (not asked at all if that one is refused).
    Idle,
    /// On its way (or arrived): its lock attempt is the next step.
    Sent,
    /// As `Sent`, a step after it settled a decided attempt's live lock (`true`: a waiting prepare's read of
    /// the owner's record did). Kept apart for a `sometimes` check only (the next step merges it back).
    Settled(bool),
    /// Waits for this attempt's lock on the item to go (older, or holding no lock anywhere).
    Waiting(Attempt),
    /// Locked: voted PREPARED.
    Locked,
    /// Refused CONFLICT, naming the lock's owner (`blockedBy`; none after a wait given up).
    Refused(Option<Attempt>),
    /// Nothing left at the item (its commit or release landed, or it was refused, or not asked).
    Done,
}

/// Where a request's coordinator is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum APc {
    /// The request is not sent yet.
    Start,
    /// The attempt's prepares are out: it waits for the votes.
    Collect,
    /// Decided: the commits or releases are on their way (`Action::Second`); then the terminal write.
    Drive {
        commit: bool,
    },
    /// Aborted and released: the cap check and the claim.
    Claim,
    /// The claim took effect and its reply was lost: the SDK's retry.
    ClaimRetry,
    /// Claimed: the next attempt starts.
    Next,
    Done,
    Crashed,
}

/// What a coordinator or a replay answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AAnswer {
    /// 200 COMMITTED.
    Ok,
    /// 202 COMMITTING (a replay only).
    Accepted,
    /// 409 ABORTED.
    Conflict,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ACoord {
    pub pc: APc,
    /// The attempt at work (0 before the first).
    pub n: u8,
    /// Its `startedAt`.
    pub age: u8,
    pub preps: [Prep; 2],
    /// An attempt that prepares one participant at a time: the item it prepares first, whose prepare says
    /// it holds no lock (`holds_no_locks`). `None`: its prepares go out at once, wait-die for each.
    pub first: Option<u8>,
    /// The aborted attempt's refusal: where (`blocked_at`) and whom it names (`blockedBy`).
    pub blocked_at: Option<u8>,
    pub blocker: Option<Attempt>,
    /// The attempt the previous attempt's refusal named (for `sometimes` checks).
    pub prev_blocker: Option<Attempt>,
    /// The older attempts that refused this request so far at A and at B, a bit each ([`AgeModel::bit`]);
    /// for `sometimes` checks only, so left out of the state's identity.
    pub refused_by: [u32; 2],
    /// The older attempts this request's refused attempts named as their blocker (`blockedBy`), a bit each.
    pub named: u32,
    pub answer: Option<AAnswer>,
}

impl std::hash::Hash for ACoord {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.pc.hash(h);
        self.n.hash(h);
        self.age.hash(h);
        self.preps.hash(h);
        self.first.hash(h);
        self.blocked_at.hash(h);
        self.blocker.hash(h);
        self.prev_blocker.hash(h);
        self.named.hash(h);
        self.answer.hash(h);
    }
}

/// A replay (the client's retry of a keyed request): not sent, following the chain at attempt k, or answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RPc {
    Idle,
    At(u8),
    Answered(AAnswer),
}

/// Ghost bits: properties a step can break when it happens (the `always` properties read them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AgeViolation {
    /// A prepare refused CONFLICT by the lock of a request that started after its own.
    RefusedByYounger,
    /// The oldest request (L0) refused.
    OldestRefused,
    /// A request refused at its last allowed attempt (`MAX_ATTEMPTS`): it gives up, 409.
    GaveUp,
    /// A refused attempt named as its blocker an older attempt that an earlier attempt of its request named.
    NamedTwice,
}

impl AgeViolation {
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// Things that happened, for the `sometimes` checks (a property cannot hold vacuously). Each is part of the
/// state's identity, and so multiplies the states: what a state shows while it lasts (a wait, a settled
/// lock) or for good (a crash, a replay's answer) is read from the state instead ([`AgeState::waits`],
/// [`Prep::Settled`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgeEvent {
    /// A prepare was refused CONFLICT by the lock of a decided attempt (`decided_owner_settled` off).
    RefusedByDecided,
    /// A request refused by the same attempt of an older one a second time (that attempt not named the first
    /// time: another participant's refusal was).
    RefusedTwiceBySame,
    /// The same, at the same item both times.
    RefusedTwiceBySameAtItem,
    OwnClaimRecognised,
    ReplayFollowed,
    /// A replay waiting at an aborted end ran out of budget and fenced the next attempt's id.
    ReplayFencedNext,
    /// A coordinator claimed the next attempt after a replay had fenced it.
    ClaimAfterFence,
    Fenced,
    /// A coordinator's create of its next attempt found it fenced: it stops (409).
    LateCoordinatorStopped,
}

impl AgeEvent {
    pub fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgeState {
    pub locks: [Option<ALock>; 2],
    /// `records[req][n - 1]`: attempt n's record.
    pub records: Vec<Vec<Option<ARecord>>>,
    pub coords: Vec<ACoord>,
    pub replays: Vec<RPc>,
    /// The next `startedAt` the clock hands out.
    pub clock: u8,
    pub budget: AgeBudget,
    pub violations: u8,
    /// [`AgeEvent`] bits.
    pub seen: u32,
}

/// A state's identity (its hash, which is what the checker tells states apart by) includes the events seen,
/// so that a `sometimes` check met on one path only is not lost where two paths join (the model's states are
/// few), but not what only `ACoord::refused_by` says, which would make the count vary with the threads.
impl std::hash::Hash for AgeState {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.locks.hash(h);
        self.records.hash(h);
        self.coords.hash(h);
        self.replays.hash(h);
        self.clock.hash(h);
        self.budget.hash(h);
        self.violations.hash(h);
        // What `ACoord::refused_by` (not in the identity) leads to is not either.
        (self.seen & !(AgeEvent::RefusedTwiceBySame.bit() | AgeEvent::RefusedTwiceBySameAtItem.bit())).hash(h);
    }
}

impl AgeState {
    pub fn record(&self, a: Attempt) -> Option<ARecord> {
        self.records[a.req as usize].get(a.n as usize - 1).copied().flatten()
    }

    fn record_mut(&mut self, a: Attempt) -> &mut Option<ARecord> {
        &mut self.records[a.req as usize][a.n as usize - 1]
    }

    /// Decided: a record exists with a status other than PREPARING (`settle_owner`; an unkeyed attempt has
    /// no record before its decision).
    pub fn decided(&self, a: Attempt) -> bool {
        self.record(a).is_some_and(|r| r.status != Status::Preparing)
    }

    /// Some attempt of `req` is decided commit.
    pub fn chain_commits(&self, req: Rq) -> bool {
        self.records[req as usize].iter().flatten().any(|r| r.status.commit())
    }

    pub fn chain_committed(&self, req: Rq) -> bool {
        self.records[req as usize].iter().flatten().any(|r| r.status == Status::Committed)
    }

    pub fn violated(&self, v: AgeViolation) -> bool {
        self.violations & v.bit() != 0
    }

    pub fn saw(&self, e: AgeEvent) -> bool {
        self.seen & e.bit() != 0
    }

    /// The prepares of the current attempts that wait for a lock its owner still holds: (request, its
    /// coordinator, the item, the lock).
    pub fn waits(&self) -> impl Iterator<Item = (Rq, &ACoord, u8, ALock)> {
        self.coords.iter().enumerate().filter(|(_, c)| c.pc == APc::Collect).flat_map(move |(r, c)| {
            (0..2u8).filter_map(move |i| match (c.preps[i as usize], self.locks[i as usize]) {
                (Prep::Waiting(o), Some(l)) if l.owner == o => Some((r as Rq, c, i, l)),
                _ => None,
            })
        })
    }

    /// Some prepare settled a decided attempt's live lock a step ago (`true`: a waiting one).
    pub fn settled(&self, by_waiter: bool) -> bool {
        self.coords.iter().any(|c| c.preps.contains(&Prep::Settled(by_waiter)))
    }

    /// Who waits for whom: bit `o` of `waits_for()[r]` is set if a prepare of request r's current attempt
    /// waits for a lock that request o's attempt still holds (a wait that cannot end unless o moves).
    pub fn waits_for(&self) -> [u8; 3] {
        let mut edges = [0u8; 3];
        for (r, _, _, l) in self.waits() {
            edges[r as usize] |= 1 << l.owner.req;
        }
        edges
    }

    /// Some prepare waits for a lock whose owner waits, directly or through others, for a lock of the first's
    /// attempt.
    pub fn wait_cycle(&self) -> bool {
        cycle_in(self.waits_for())
    }
}

/// Whether the relation `edges` (bit `o` of `edges[r]`: r waits for o) among three requests has a cycle.
pub fn cycle_in(edges: [u8; 3]) -> bool {
    // reach[r]: whom r waits for, directly or through others (paths of up to three edges after two rounds).
    let mut reach = edges;
    for _ in 0..2 {
        for reached in &mut reach {
            for (o, e) in edges.iter().enumerate() {
                if *reached & (1 << o) != 0 {
                    *reached |= e;
                }
            }
        }
    }
    (0..3).any(|r| reach[r] & (1 << r) != 0)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AgeAction {
    /// The coordinator's next step; `true`: the claim it writes takes effect with its reply lost.
    Coord(Rq, bool),
    /// The request's first attempt starts one participant at a time from this item (a hot item).
    StartAt(Rq, u8),
    /// The coordinator crashes between its claim and the next attempt.
    Crash(Rq),
    /// The current attempt's prepare at an item tries to lock it (arriving, or woken by the lock's change),
    /// or, waiting, reads the lock's owner's record.
    Prepare(Rq, u8),
    /// A waiting prepare's wait ends (the wait limit, [`AgeSwitches::older_waits`] off): REFUSED CONFLICT.
    GiveUp(Rq, u8),
    /// The current attempt's commit or release lands at an item.
    Second(Rq, u8),
    /// The replay's next step.
    Replay(Rq),
}

/// The model: a configuration.
#[derive(Clone, Debug)]
pub struct AgeModel {
    pub cfg: AgeConfig,
    /// The most attempts of each request any state explored showed: kept by the property "no request makes
    /// more attempts than its bound", which the checker evaluates at every state (a measure next to the
    /// check, shared by the model's clones).
    pub most: Arc<[AtomicU8; 3]>,
}

impl AgeModel {
    pub fn new(cfg: AgeConfig) -> AgeModel {
        assert!((2..=3).contains(&cfg.requests.len()), "two or three requests");
        assert!(cfg.requests.iter().all(|r| r.keyed || !r.replay), "only a keyed request is replayed");
        assert!(cfg.max_attempts >= 1 && cfg.max_attempts <= 8, "attempts fit a byte of `ACoord::named`");
        AgeModel { cfg, most: Arc::default() }
    }

    pub fn attempt_name(&self, a: Attempt) -> String {
        let name = self.cfg.requests[a.req as usize].name;
        if a.n == 1 { name.to_owned() } else { format!("{name}-{}", a.n) }
    }

    fn keyed(&self, req: Rq) -> bool {
        self.cfg.requests[req as usize].keyed
    }

    /// The most attempts each request made in the states explored so far.
    pub fn most_attempts(&self) -> Vec<u8> {
        self.most.iter().take(self.cfg.requests.len()).map(|m| m.load(Ordering::Relaxed)).collect()
    }

    /// An attempt's prepares as they go out: one at a time from `first` (the others not sent yet), else all.
    fn sent(&self, first: Option<u8>) -> [Prep; 2] {
        match first {
            Some(f) if self.cfg.switches.one_at_a_time => {
                let mut preps = [Prep::Idle; 2];
                preps[f as usize] = Prep::Sent;
                preps
            }
            _ => [Prep::Sent; 2],
        }
    }

    /// Every request ended (its coordinator answered, gave up, or crashed; its replay answered) and no lock
    /// is left.
    pub fn ended(&self, s: &AgeState) -> bool {
        s.coords.iter().all(|c| matches!(c.pc, APc::Done | APc::Crashed))
            && s.locks.iter().all(Option::is_none)
            && s.replays.iter().enumerate().all(|(r, p)| !self.cfg.requests[r].replay || matches!(p, RPc::Answered(_)))
    }

    /// Every request committed, but one a fence stopped (a replay ran out of budget before the coordinator's
    /// next attempt) or whose coordinator crashed: no request is refused for ever.
    pub fn all_committed(&self, s: &AgeState) -> bool {
        (0..self.cfg.requests.len()).all(|r| {
            s.chain_committed(r as Rq)
                || s.coords[r].pc == APc::Crashed
                || s.records[r].iter().flatten().any(|x| x.fenced)
        })
    }

    /// One step; `None` if it is not enabled. With `log`, what it did, line by line (for traces).
    pub fn apply(&self, s: &AgeState, action: AgeAction, log: bool) -> Option<(AgeState, Vec<String>)> {
        let mut n = s.clone();
        let mut lines = vec![];
        let mut say = |line: String| {
            if log {
                lines.push(line);
            }
        };
        match action {
            AgeAction::Coord(r, lost) => self.coord(&mut n, r, lost, None, &mut say)?,
            AgeAction::StartAt(r, i) => {
                if !self.cfg.hot_first_attempts || r == 0 {
                    return None;
                }
                self.coord(&mut n, r, false, Some(i), &mut say)?
            }
            AgeAction::Crash(r) => {
                let c = &mut n.coords[r as usize];
                if n.budget.crash == 0 || !matches!(c.pc, APc::ClaimRetry | APc::Next) {
                    return None;
                }
                c.pc = APc::Crashed;
                n.budget.crash -= 1;
                say(format!(
                    "coordinator of {} crashes after claiming attempt {}, before starting it",
                    self.cfg.requests[r as usize].name,
                    c.n + 1
                ));
            }
            AgeAction::Prepare(r, i) => self.prepare(&mut n, r, i, &mut say)?,
            AgeAction::GiveUp(r, i) => {
                let c = &n.coords[r as usize];
                let me = Attempt { req: r, n: c.n };
                let Prep::Waiting(o) = c.preps[i as usize] else { return None };
                let still = n.locks[i as usize].is_some_and(|l| l.owner == o);
                if self.cfg.switches.older_waits || !still {
                    return None;
                }
                n.coords[r as usize].preps[i as usize] = Prep::Refused(None);
                self.refusal(&mut n, me, o, i);
                say(format!(
                    "{}'s prepare at {} gives up waiting for {}'s lock (the wait limit): REFUSED CONFLICT",
                    self.attempt_name(me),
                    ITEMS[i as usize],
                    self.attempt_name(o)
                ));
            }
            AgeAction::Second(r, i) => {
                let c = &mut n.coords[r as usize];
                if !matches!(c.pc, APc::Drive { .. }) || c.preps[i as usize] != Prep::Locked {
                    return None;
                }
                let me = Attempt { req: r, n: c.n };
                let commit = c.pc == (APc::Drive { commit: true });
                c.preps[i as usize] = Prep::Done;
                let what = if commit { "commit" } else { "release" };
                if n.locks[i as usize].is_some_and(|l| l.owner == me) {
                    n.locks[i as usize] = None;
                    say(format!("{}'s {what} lands at {}: the lock is gone", self.attempt_name(me), ITEMS[i as usize]));
                } else {
                    // Settled by a prepare that met it (`settle_owner`): `commit_item` / `release` find it done.
                    say(format!(
                        "{}'s {what} lands at {}: a prepare settled its lock already",
                        self.attempt_name(me),
                        ITEMS[i as usize]
                    ));
                }
            }
            AgeAction::Replay(r) => self.replay(&mut n, r, &mut say)?,
        }
        Some((n, lines))
    }

    /// An attempt's bit in [`ACoord::refused_by`] and [`ACoord::named`].
    pub fn bit(a: Attempt) -> u32 {
        1 << (a.req as u32 * 8 + (a.n as u32 - 1))
    }

    /// A CONFLICT refusal of `me` by the lock of `owner` at item `i`: the ghost checks.
    fn refusal(&self, s: &mut AgeState, me: Attempt, owner: Attempt, i: u8) {
        let bit = Self::bit(owner);
        let c = &mut s.coords[me.req as usize];
        if (c.refused_by[0] | c.refused_by[1]) & bit != 0 {
            s.seen |= AgeEvent::RefusedTwiceBySame.bit();
        }
        if c.refused_by[i as usize] & bit != 0 {
            s.seen |= AgeEvent::RefusedTwiceBySameAtItem.bit();
        }
        c.refused_by[i as usize] |= bit;
        if owner.req > me.req {
            s.violations |= AgeViolation::RefusedByYounger.bit();
        }
        if me.req == 0 {
            s.violations |= AgeViolation::OldestRefused.bit();
        }
    }

    /// `resolve`: the live lock of a decided attempt settled (a COMMITTING or ended owner's rolled forward, an
    /// ABORTING or ABORTED one's released); the prepare tries again, a step later.
    fn settle(&self, s: &mut AgeState, r: Rq, i: u8, by_waiter: bool) -> String {
        let l = s.locks[i as usize].expect("a live lock");
        let status = s.record(l.owner).map(|x| x.status).expect("decided");
        s.locks[i as usize] = None;
        s.coords[r as usize].preps[i as usize] = Prep::Settled(by_waiter);
        format!(
            "{}'s record is decided ({status:?}): it settles the lock ({}) and will try again",
            self.attempt_name(l.owner),
            if status.commit() { "rolled forward" } else { "released" }
        )
    }

    fn prepare(&self, s: &mut AgeState, r: Rq, i: u8, say: &mut impl FnMut(String)) -> Option<()> {
        let sw = self.cfg.switches;
        let c = &s.coords[r as usize];
        let (me, age, lockless, prev_blocker) = (Attempt { req: r, n: c.n }, c.age, c.first == Some(i), c.prev_blocker);
        let lock = s.locks[i as usize];
        let item = ITEMS[i as usize];
        match c.preps[i as usize] {
            Prep::Sent | Prep::Settled(_) => {}
            Prep::Waiting(o) if lock.is_some_and(|l| l.owner == o) => {
                // Still O's lock: only the waiter's read of O's record (once, after a few polls; the model
                // lets it come at any moment) ends the wait now, if O is decided.
                if !(sw.decided_owner_settled && s.decided(o)) {
                    return None;
                }
                let settled = self.settle(s, r, i, true);
                say(format!(
                    "{}'s prepare, waiting at {item}, reads the owner's record: {settled}",
                    self.attempt_name(me)
                ));
                return Some(());
            }
            // Woken: the lock it waits for is no longer that attempt's; it tries again.
            Prep::Waiting(_) => {}
            _ => return None,
        }
        let Some(l) = lock else {
            s.locks[i as usize] = Some(ALock { owner: me, age });
            let c = &mut s.coords[r as usize];
            c.preps[i as usize] = Prep::Locked;
            let other = 1 - i as usize;
            let next = c.preps[other] == Prep::Idle;
            if next {
                // One at a time: its vote in, the coordinator sends the next prepare.
                c.preps[other] = Prep::Sent;
            }
            say(format!(
                "{}'s prepare locks {item}: PREPARED{}",
                self.attempt_name(me),
                if next { format!("; its prepare to {} is sent", ITEMS[other]) } else { String::new() }
            ));
            return Some(());
        };
        assert!(l.owner.req != r, "an attempt starts only once its predecessor's locks are released");
        let owner = self.attempt_name(l.owner);
        let older = (age, me) < (l.age, l.owner);
        // `Waiting::may_wait_for`: it holds no lock anywhere, or it is older (wait-die, by (startedAt, id)).
        if lockless || older {
            s.coords[r as usize].preps[i as usize] = Prep::Waiting(l.owner);
            say(format!(
                "{}'s prepare (age {age}) meets the lock on {item} of {owner} (age {}), {}: it waits",
                self.attempt_name(me),
                l.age,
                match (lockless, older) {
                    (false, _) => "younger",
                    (true, true) => "younger, holding no lock",
                    (true, false) => "older, but holding no lock anywhere",
                }
            ));
            if lockless && prev_blocker == Some(l.owner) {
                say(format!("  (the attempt that refused {}'s predecessor here)", self.attempt_name(me)));
            }
            return Some(());
        }
        // `settle_owner`, before a refusal.
        let decided = s.decided(l.owner);
        if decided && sw.decided_owner_settled {
            let settled = self.settle(s, r, i, false);
            say(format!("{}'s prepare meets the lock on {item} of {owner}, older: {settled}", self.attempt_name(me)));
            return Some(());
        }
        s.coords[r as usize].preps[i as usize] = Prep::Refused(Some(l.owner));
        self.refusal(s, me, l.owner, i);
        if decided {
            s.seen |= AgeEvent::RefusedByDecided.bit();
        }
        say(format!(
            "{}'s prepare (age {age}) meets the lock on {item} of {owner} (age {}), older{}: REFUSED CONFLICT, \
             blockedBy {owner}",
            self.attempt_name(me),
            l.age,
            if decided { " and decided" } else { "" },
        ));
        if l.owner.req > r {
            say(format!("  !! {} is refused by a request that started after its own", self.attempt_name(me)));
        }
        Some(())
    }

    /// The coordinator's next step; `hot`: a first attempt that prepares one at a time from that item.
    fn coord(&self, s: &mut AgeState, r: Rq, lost: bool, hot: Option<u8>, say: &mut impl FnMut(String)) -> Option<()> {
        let cfg = &self.cfg;
        let ri = r as usize;
        let name = cfg.requests[ri].name;
        let keyed = self.keyed(r);
        let c = s.coords[ri].clone();
        let me = Attempt { req: r, n: c.n };
        // Only a claim write can lose its reply; only a start can choose a hot item.
        if lost && !(s.budget.claim_reply > 0 && c.pc == APc::Claim && c.n < cfg.max_attempts) {
            return None;
        }
        if hot.is_some() && c.pc != APc::Start {
            return None;
        }
        match c.pc {
            APc::Start => {
                // The order of first starts is the requests' order.
                if ri > 0 && s.coords[ri - 1].pc == APc::Start {
                    return None;
                }
                say(self.begin(s, r, 1, true, hot));
            }
            APc::Collect => {
                // Every vote asked for is in: one at a time, the other participant is not asked after a refusal.
                if c.preps.iter().any(|p| matches!(p, Prep::Sent | Prep::Settled(_) | Prep::Waiting(_))) {
                    return None;
                }
                let commit = c.preps.iter().all(|p| *p == Prep::Locked);
                assert!(commit || c.preps.iter().any(|p| matches!(p, Prep::Refused(_))), "a vote is missing");
                let status = if commit {
                    Status::Committing
                } else if keyed {
                    Status::Aborting
                } else {
                    Status::Aborted
                };
                let rec = s.record_mut(me);
                if keyed {
                    assert_eq!(rec.map(|r| r.status), Some(Status::Preparing), "only its coordinator decides");
                } else {
                    assert!(rec.is_none(), "an unkeyed attempt has no record before its decision");
                }
                *rec = Some(ARecord::new(status));
                let c = &mut s.coords[ri];
                // `blocked_at`: the first participant, in the request's order, whose vote names a `blockedBy`.
                c.blocked_at = c.preps.iter().position(|p| matches!(p, Prep::Refused(Some(_)))).map(|i| i as u8);
                c.blocker = c.blocked_at.and_then(|i| match c.preps[i as usize] {
                    Prep::Refused(b) => b,
                    _ => None,
                });
                if let Some(b) = c.blocker {
                    if c.named & Self::bit(b) != 0 {
                        s.violations |= AgeViolation::NamedTwice.bit();
                    }
                    c.named |= Self::bit(b);
                }
                let unasked = c.preps.contains(&Prep::Idle);
                for p in &mut c.preps {
                    if matches!(p, Prep::Refused(_) | Prep::Idle) {
                        *p = Prep::Done;
                    }
                }
                c.pc = APc::Drive { commit };
                say(format!(
                    "{} decides {}: record {status:?}{}{}",
                    self.attempt_name(me),
                    if commit { "commit" } else { "abort" },
                    match (c.blocker, c.blocked_at) {
                        (Some(b), Some(at)) =>
                            format!(" (blockedBy {} at {})", self.attempt_name(b), ITEMS[at as usize]),
                        _ => String::new(),
                    },
                    if unasked { "; the other participant was not asked" } else { "" }
                ));
            }
            APc::Drive { commit } => {
                if c.preps.contains(&Prep::Locked) {
                    return None;
                }
                let rec = s.record_mut(me).as_mut().expect("decided");
                if commit {
                    rec.status = Status::Committed;
                    let c = &mut s.coords[ri];
                    c.answer = Some(AAnswer::Ok);
                    c.pc = APc::Done;
                    say(format!("{} writes COMMITTED and answers 200", self.attempt_name(me)));
                } else {
                    if keyed {
                        rec.status = Status::Aborted;
                        say(format!("{} writes ABORTED (every lock released)", self.attempt_name(me)));
                    } else {
                        say(format!("{}'s releases all landed", self.attempt_name(me)));
                    }
                    s.coords[ri].pc = APc::Claim;
                }
            }
            APc::Claim => {
                if c.n >= cfg.max_attempts {
                    s.violations |= AgeViolation::GaveUp.bit();
                    let c = &mut s.coords[ri];
                    c.answer = Some(AAnswer::Conflict);
                    c.pc = APc::Done;
                    say(format!("{name} was refused at its last allowed attempt ({}): it gives up, 409", c.n));
                    return Some(());
                }
                let rec = s.record_mut(me).as_mut().expect("an aborted attempt has its record");
                assert!(rec.status.abort(), "claimed only after an abort");
                rec.retried_as = true;
                let next_attempt = Attempt { req: r, n: c.n + 1 };
                if s.record(next_attempt).is_some_and(|x| x.fenced) {
                    s.seen |= AgeEvent::ClaimAfterFence.bit();
                }
                let next = self.attempt_name(next_attempt);
                let c = &mut s.coords[ri];
                if lost {
                    s.budget.claim_reply -= 1;
                    c.pc = APc::ClaimRetry;
                    say(format!(
                        "{name} claims {next} (retriedAs on {}): it takes effect, its reply is lost",
                        self.attempt_name(me)
                    ));
                } else {
                    c.pc = APc::Next;
                    say(format!("{name} claims {next} (retriedAs on {})", self.attempt_name(me)));
                }
            }
            APc::ClaimRetry => {
                assert!(s.record(me).is_some_and(|r| r.retried_as), "the claim took effect");
                s.seen |= AgeEvent::OwnClaimRecognised.bit();
                s.coords[ri].pc = APc::Next;
                say(format!("{name}'s retry of the claim finds retriedAs naming its own next attempt: Claimed"));
            }
            APc::Next => {
                let next = Attempt { req: r, n: c.n + 1 };
                if keyed && s.record(next).is_some() {
                    let c = &mut s.coords[ri];
                    c.answer = Some(AAnswer::Conflict);
                    c.pc = APc::Done;
                    s.seen |= AgeEvent::LateCoordinatorStopped.bit();
                    say(format!(
                        "{name}'s create of {} finds it fenced (ABORTED): it follows it, answers 409 and stops",
                        self.attempt_name(next)
                    ));
                    return Some(());
                }
                let sw = cfg.switches;
                // `run`: `first = refused.blocked_at`; `PhaseEngine::prepare`: one at a time from there (from A without).
                let first = sw.retry_waits_at_refusal.then(|| c.blocked_at.unwrap_or(0));
                say(self.begin(s, r, next.n, !sw.kept_age, first));
            }
            APc::Done | APc::Crashed => return None,
        }
        Some(())
    }

    /// Attempt `n` of request `r` starts: its age the request's (`fresh`: the clock's, which moves on), its
    /// prepares one at a time from `first` or else in parallel, its record created PREPARING first if keyed;
    /// the refusal of the attempt before it becomes `prev_blocker`. Returns the trace line.
    fn begin(&self, s: &mut AgeState, r: Rq, n: u8, fresh: bool, first: Option<u8>) -> String {
        let a = Attempt { req: r, n };
        let keyed = self.keyed(r);
        if keyed {
            *s.record_mut(a) = Some(ARecord::new(Status::Preparing));
        }
        let preps = self.sent(first);
        let c = &mut s.coords[r as usize];
        if fresh {
            c.age = s.clock;
            s.clock += 1;
        }
        c.n = n;
        c.first = first;
        c.preps = preps;
        c.prev_blocker = c.blocker.take();
        c.blocked_at = None;
        c.pc = APc::Collect;
        format!(
            "{} starts (startedAt {}){}; {}",
            self.attempt_name(a),
            c.age,
            if keyed { ", its record created PREPARING" } else { "" },
            self.sent_line(first)
        )
    }

    fn sent_line(&self, first: Option<u8>) -> String {
        match first {
            None => "its prepares to A and B are on their way".to_owned(),
            Some(f) if self.cfg.switches.one_at_a_time => {
                format!("one at a time: its prepare to {} (holding no lock) is on its way", ITEMS[f as usize])
            }
            Some(f) => format!(
                "its prepares to A and B are on their way, the one to {} saying it holds no lock",
                ITEMS[f as usize]
            ),
        }
    }
    fn replay(&self, s: &mut AgeState, r: Rq, say: &mut impl FnMut(String)) -> Option<()> {
        let ri = r as usize;
        let k = match s.replays[ri] {
            // Sent once the first request's record exists (its create finds it); its first read is folded in.
            RPc::Idle if self.cfg.requests[ri].replay => 1,
            RPc::At(k) => k,
            _ => return None,
        };
        let a = Attempt { req: r, n: k };
        let next = Attempt { req: r, n: k + 1 };
        let name = self.attempt_name(a);
        let answer = |s: &mut AgeState, ans: AAnswer| s.replays[ri] = RPc::Answered(ans);
        let Some(rec) = s.record(a) else {
            if k == 1 {
                return None;
            }
            // `attempt_named`: a link to no record: `abort_if_absent`, then the record is followed: ABORTED,
            // refused for nothing (not retryable): 409.
            *s.record_mut(a) = Some(ARecord::fence());
            s.seen |= AgeEvent::Fenced.bit();
            answer(s, AAnswer::Conflict);
            say(format!(
                "the replay finds no record of {name}, named by retriedAs: it fences it (created ABORTED) and answers 409"
            ));
            return Some(());
        };
        match rec.status {
            Status::Preparing | Status::Prepared => return None,
            Status::Committing => {
                answer(s, AAnswer::Accepted);
                say(format!("the replay finds {name} COMMITTING: 202"));
            }
            Status::Committed => {
                answer(s, AAnswer::Ok);
                say(format!("the replay finds {name} COMMITTED: 200"));
            }
            Status::Aborting | Status::Aborted if rec.retried_as => {
                s.replays[ri] = RPc::At(k + 1);
                s.seen |= AgeEvent::ReplayFollowed.bit();
                say(format!(
                    "the replay finds {name} {:?}, retriedAs {}: it follows the link",
                    rec.status,
                    self.attempt_name(next)
                ));
            }
            Status::Aborting | Status::Aborted => {
                // `may_be_retried`: refused for contention only (a fenced record was refused for nothing), attempts
                // left, no successor named.
                let may_be_retried = !rec.fenced && k < self.cfg.max_attempts;
                if may_be_retried && self.cfg.switches.replay_waits_for_retry {
                    // It waits for a successor to be named (no step: the link, once written, is followed);
                    // this step is its answer budget (or the deadline) running out first: the next attempt
                    // fenced, the record read again (folded: a link written in between is followed to the fence).
                    if s.record(next).is_none() {
                        *s.record_mut(next) = Some(ARecord::fence());
                    }
                    s.seen |= AgeEvent::ReplayFencedNext.bit();
                    answer(s, AAnswer::Conflict);
                    say(format!(
                        "the replay waited at {name} {:?} for a successor; its budget runs out: it fences {} \
                         (created ABORTED), finds {name} still naming none, and answers 409",
                        rec.status,
                        self.attempt_name(next)
                    ));
                } else {
                    answer(s, AAnswer::Conflict);
                    say(format!("the replay finds {name} {:?}, no successor named: 409", rec.status));
                }
            }
        }
        Some(())
    }

    /// `always`: no attempt after the first begins (its coordinator at work on it, or a record not created by
    /// a fence) unless its predecessor is decided abort and names it (`retriedAs`); and none that was fenced.
    fn chains_well_formed(&self, s: &AgeState) -> bool {
        (0..self.cfg.requests.len()).all(|r| {
            let c = &s.coords[r];
            (2..=self.cfg.max_attempts).all(|n| {
                let a = Attempt { req: r as Rq, n };
                let started = c.pc != APc::Start && c.n >= n;
                let rec = s.record(a);
                let begun = started || rec.is_some_and(|x| !x.fenced);
                let prev = s.record(Attempt { req: r as Rq, n: n - 1 });
                (!begun || prev.is_some_and(|p| p.status.abort() && p.retried_as))
                    && !(started && rec.is_some_and(|x| x.fenced))
            })
        })
    }

    /// `always`: 200 ⇒ an attempt COMMITTED; 202 ⇒ an attempt decided commit; 409 ⇒ no attempt of the
    /// request is ever decided commit (checked in every later state too).
    fn answers_agree(&self, s: &AgeState) -> bool {
        let agree = |r: usize, a: Option<AAnswer>| match a {
            Some(AAnswer::Ok) => s.chain_committed(r as Rq),
            Some(AAnswer::Accepted) => s.chain_commits(r as Rq),
            Some(AAnswer::Conflict) => !s.chain_commits(r as Rq),
            None => true,
        };
        (0..self.cfg.requests.len()).all(|r| {
            let replayed = match s.replays[r] {
                RPc::Answered(a) => Some(a),
                _ => None,
            };
            agree(r, s.coords[r].answer) && agree(r, replayed)
        })
    }
}

fn seen<const E: u32>(_: &AgeModel, s: &AgeState) -> bool {
    s.seen & (1 << E) != 0
}

/// `sometimes`: request `K` makes its [`AgeConfig::bound_of`]-th attempt (the bound is reached).
fn reaches_bound<const K: usize>(_: &AgeModel, s: &AgeState) -> bool {
    s.coords[K].n == AgeConfig::bound_of(K)
}

/// The property names tests look for.
pub const NO_CYCLE: &str =
    "no cycle of waits: no prepare waits for a lock whose owner waits, directly or through others, for one of its own";
pub const ALL_END: &str = "every request ends, committed unless a fence or a crash stopped it, and no lock is left";
pub const WITHIN_BOUND: &str = "no request Lk makes more than 2^k attempts (L0 1, L1 2, L2 4)";

impl Model for AgeModel {
    type State = AgeState;
    type Action = AgeAction;

    fn init_states(&self) -> Vec<AgeState> {
        let nreq = self.cfg.requests.len();
        vec![AgeState {
            locks: [None; 2],
            records: vec![vec![None; self.cfg.max_attempts as usize]; nreq],
            coords: vec![
                ACoord {
                    pc: APc::Start,
                    n: 0,
                    age: 0,
                    preps: [Prep::Idle; 2],
                    first: None,
                    blocked_at: None,
                    blocker: None,
                    prev_blocker: None,
                    refused_by: [0; 2],
                    named: 0,
                    answer: None
                };
                nreq
            ],
            replays: vec![RPc::Idle; nreq],
            clock: 0,
            budget: self.cfg.budget,
            violations: 0,
            seen: 0,
        }]
    }

    /// Every action that may be enabled; `next_state` answers `None` for those that are not.
    fn actions(&self, s: &AgeState, out: &mut Vec<AgeAction>) {
        for r in 0..self.cfg.requests.len() as Rq {
            let c = &s.coords[r as usize];
            match c.pc {
                APc::Done | APc::Crashed => {}
                APc::Start => {
                    out.push(AgeAction::Coord(r, false));
                    if self.cfg.hot_first_attempts && r > 0 {
                        out.push(AgeAction::StartAt(r, 0));
                        out.push(AgeAction::StartAt(r, 1));
                    }
                }
                APc::Claim => {
                    out.push(AgeAction::Coord(r, false));
                    out.push(AgeAction::Coord(r, true));
                }
                APc::ClaimRetry | APc::Next => {
                    out.push(AgeAction::Coord(r, false));
                    out.push(AgeAction::Crash(r));
                }
                APc::Collect => {
                    out.push(AgeAction::Coord(r, false));
                    for i in 0..2 {
                        out.push(AgeAction::Prepare(r, i));
                        out.push(AgeAction::GiveUp(r, i));
                    }
                }
                APc::Drive { .. } => {
                    out.push(AgeAction::Coord(r, false));
                    out.push(AgeAction::Second(r, 0));
                    out.push(AgeAction::Second(r, 1));
                }
            }
            if matches!(s.replays[r as usize], RPc::Idle | RPc::At(_)) {
                out.push(AgeAction::Replay(r));
            }
        }
    }

    fn next_state(&self, s: &AgeState, action: AgeAction) -> Option<AgeState> {
        self.apply(s, action, false).map(|(n, _)| n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let cfg = &self.cfg;
        let sw = cfg.switches;
        let b = cfg.budget;
        let replayed = cfg.requests.iter().any(|r| r.replay);
        let mut p = vec![
            Property::<Self>::always("no request is refused CONFLICT by a request that started after it", |_, s| {
                !s.violated(AgeViolation::RefusedByYounger)
            }),
            Property::<Self>::always(
                "the oldest request is never refused (it commits at its first attempt)",
                |_, s| !s.violated(AgeViolation::OldestRefused),
            ),
            Property::<Self>::always("no request gives up: every request commits within the attempt bound", |_, s| {
                !s.violated(AgeViolation::GaveUp)
            }),
            Property::<Self>::always(WITHIN_BOUND, |m, s| {
                s.coords.iter().enumerate().all(|(k, c)| {
                    m.most[k].fetch_max(c.n, Ordering::Relaxed);
                    c.n <= AgeConfig::bound_of(k)
                })
            }),
            Property::<Self>::always(
                "no request names the same older attempt as its blocker twice (the bound's argument)",
                |_, s| !s.violated(AgeViolation::NamedTwice),
            ),
            Property::<Self>::always(NO_CYCLE, |_, s| !s.wait_cycle()),
            Property::<Self>::always("at most one attempt of a request commits", |m, s| {
                (0..m.cfg.requests.len())
                    .all(|r| s.records[r].iter().flatten().filter(|x| x.status.commit()).count() <= 1)
            }),
            Property::<Self>::always(
                "an attempt after the first begins only once its predecessor is decided abort and names it, never once \
                 fenced",
                |m, s| m.chains_well_formed(s),
            ),
            Property::<Self>::always(
                "every answer, the coordinator's and a replay's, agrees with the chain",
                |m, s| m.answers_agree(s),
            ),
            Property::<Self>::always("a lock belongs to its request's current attempt, voting or deciding", |_, s| {
                s.locks.iter().flatten().all(|l| {
                    let c = &s.coords[l.owner.req as usize];
                    c.n == l.owner.n && matches!(c.pc, APc::Collect | APc::Drive { .. })
                })
            }),
            Property::<Self>::eventually(ALL_END, |m, s| m.ended(s) && m.all_committed(s)),
            Property::<Self>::sometimes("sometimes every request commits", |m, s| {
                (0..m.cfg.requests.len()).all(|r| s.chain_committed(r as Rq))
            }),
            Property::<Self>::sometimes("sometimes an attempt after a retry commits", |_, s| {
                s.records.iter().any(|chain| chain.iter().skip(1).flatten().any(|r| r.status == Status::Committed))
            }),
            Property::<Self>::sometimes("sometimes an older prepare waits for a younger one's lock", |_, s| {
                s.waits().any(|(_, c, i, _)| c.first != Some(i))
            }),
        ];
        // The bound is reached (where `MAX_ATTEMPTS` allows it): it is tight.
        if cfg.max_attempts >= AgeConfig::bound_of(1) {
            p.push(Property::<Self>::sometimes("sometimes L1 makes its second attempt", reaches_bound::<1>));
        }
        if cfg.requests.len() >= 3 && cfg.max_attempts >= AgeConfig::bound_of(2) {
            p.push(Property::<Self>::sometimes("sometimes L2 makes its fourth attempt", reaches_bound::<2>));
        }
        if sw.retry_waits_at_refusal {
            p.push(Property::<Self>::sometimes(
                "sometimes a retry's first prepare, holding no lock, waits for the attempt that refused its \
                 predecessor (older) there",
                |_, s| s.waits().any(|(_, c, i, l)| c.first == Some(i) && c.prev_blocker == Some(l.owner)),
            ));
        }
        // L0's prepares are never one at a time (`AgeConfig::hot_first_attempts`): a younger request's are.
        if sw.retry_waits_at_refusal && cfg.requests.len() >= 3 {
            p.push(Property::<Self>::sometimes(
                "sometimes a prepare holding no lock waits for a younger one's lock",
                |_, s| {
                    s.waits().any(|(r, c, i, l)| {
                        c.first == Some(i) && (c.age, Attempt { req: r, n: c.n }) < (l.age, l.owner)
                    })
                },
            ));
        }
        if cfg.hot_first_attempts {
            p.push(Property::<Self>::sometimes(
                "sometimes a first attempt prepares one participant at a time (a hot item)",
                |_, s| s.coords.iter().any(|c| c.n == 1 && c.first.is_some()),
            ));
        }
        if sw.decided_owner_settled {
            p.push(Property::<Self>::sometimes(
                "sometimes a prepare meets a decided older attempt's live lock and settles it",
                |_, s| s.settled(false),
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes a waiting prepare reads its lock's owner's record, decided, and settles the lock",
                |_, s| s.settled(true),
            ));
        }
        if cfg.requests.len() >= 3 && sw.decided_owner_settled && sw.retry_waits_at_refusal {
            p.push(Property::<Self>::sometimes(
                "sometimes one attempt of an older request refuses a younger one twice (named once)",
                seen::<{ AgeEvent::RefusedTwiceBySame as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes one attempt of an older request refuses a younger one twice at the same item (named once)",
                seen::<{ AgeEvent::RefusedTwiceBySameAtItem as u32 }>,
            ));
        }
        if b.claim_reply > 0 {
            p.push(Property::<Self>::sometimes(
                "sometimes a claim's reply is lost and its retry finds its own claim",
                seen::<{ AgeEvent::OwnClaimRecognised as u32 }>,
            ));
        }
        if b.crash > 0 {
            p.push(Property::<Self>::sometimes(
                "sometimes a coordinator crashes between its claim and the next attempt",
                |_, s| s.coords.iter().any(|c| c.pc == APc::Crashed),
            ));
        }
        if replayed {
            p.push(Property::<Self>::sometimes(
                "sometimes a replay follows a retriedAs link",
                seen::<{ AgeEvent::ReplayFollowed as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes a replay fences a successor without a record",
                seen::<{ AgeEvent::Fenced as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes a late coordinator's create of its next attempt loses to a fence, and it stops",
                seen::<{ AgeEvent::LateCoordinatorStopped as u32 }>,
            ));
            p.push(Property::<Self>::sometimes("sometimes a replay answers 409", |_, s| {
                s.replays.contains(&RPc::Answered(AAnswer::Conflict))
            }));
            p.push(Property::<Self>::sometimes("sometimes a replay answers a commit made after a retry", |_, s| {
                s.replays.iter().enumerate().any(|(r, p)| {
                    matches!(p, RPc::Answered(AAnswer::Ok | AAnswer::Accepted))
                        && s.records[r].iter().skip(1).flatten().any(|x| x.status.commit())
                })
            }));
            if sw.replay_waits_for_retry {
                p.push(Property::<Self>::sometimes(
                    "sometimes a replay waiting at an aborted attempt runs out of budget and fences the next one",
                    seen::<{ AgeEvent::ReplayFencedNext as u32 }>,
                ));
                p.push(Property::<Self>::sometimes(
                    "sometimes a coordinator claims the next attempt after a replay fenced it",
                    seen::<{ AgeEvent::ClaimAfterFence as u32 }>,
                ));
            }
            if b.crash > 0 {
                p.push(Property::<Self>::sometimes(
                    "sometimes a replay fences the successor a crashed coordinator claimed",
                    |_, s| {
                        s.coords.iter().enumerate().any(|(r, c)| {
                            c.pc == APc::Crashed
                                && s.records[r].get(c.n as usize).copied().flatten().is_some_and(|x| x.fenced)
                        })
                    },
                ));
            }
        }
        p
    }

    fn format_action(&self, action: &AgeAction) -> String {
        format!("{action:?}")
    }
}

/// What one exhaustive check of the age model found ([`check`]); [`AgeModel::most_attempts`] reads, after
/// it, the most attempts each request made in the states explored.
pub type AgeRun = Run<AgeModel>;

impl Traced for AgeModel {
    fn heading(&self) -> String {
        let cfg = &self.cfg;
        let sw = cfg.switches;
        let off = crate::report::switched_off(&[
            ("kept_age", sw.kept_age),
            ("older_waits", sw.older_waits),
            ("retry_waits_at_refusal", sw.retry_waits_at_refusal),
            ("one_at_a_time", sw.one_at_a_time),
            ("decided_owner_settled", sw.decided_owner_settled),
            ("replay_waits_for_retry", sw.replay_waits_for_retry),
        ]);
        format!(
            "age model {:?} ({}; MAX_ATTEMPTS {}; first attempts {}; faults: crash {} lost claim reply {})",
            cfg.name,
            if off.is_empty() { "the code's protocol".to_owned() } else { format!("OFF: {}", off.join(", ")) },
            cfg.max_attempts,
            if cfg.hot_first_attempts { "in parallel or one at a time" } else { "in parallel" },
            cfg.budget.crash,
            cfg.budget.claim_reply,
        )
    }

    fn tail(&self) -> String {
        let most: Vec<String> =
            self.cfg.requests.iter().zip(self.most_attempts()).map(|(r, m)| format!("{} {m}", r.name)).collect();
        format!("; most attempts seen: {}", most.join(", "))
    }

    fn explain(&self, s: &AgeState, action: AgeAction) -> Option<Vec<String>> {
        self.apply(s, action, true).map(|(_, lines)| lines)
    }

    /// One line: locks, records, answers.
    fn summary(&self, s: &AgeState) -> String {
        let locks: Vec<String> = (0..2)
            .map(|i| format!("{}: {}", ITEMS[i], s.locks[i].map_or("free".to_owned(), |l| self.attempt_name(l.owner))))
            .collect();
        let mut records = vec![];
        for (r, chain) in s.records.iter().enumerate() {
            for (k, rec) in chain.iter().enumerate() {
                if let Some(rec) = rec {
                    records.push(format!(
                        "{} {:?}{}{}",
                        self.attempt_name(Attempt { req: r as Rq, n: k as u8 + 1 }),
                        rec.status,
                        if rec.retried_as { " retriedAs→next" } else { "" },
                        if rec.fenced { " (fenced)" } else { "" }
                    ));
                }
            }
        }
        let answers: Vec<String> = (0..s.coords.len())
            .map(|r| {
                let replay = match s.replays[r] {
                    RPc::Answered(a) => format!(", replay {a:?}"),
                    _ => String::new(),
                };
                format!("{} {:?} {:?}{replay}", self.cfg.requests[r].name, s.coords[r].pc, s.coords[r].answer)
            })
            .collect();
        format!("locks [{}]; records [{}]; [{}]", locks.join(", "), records.join(", "), answers.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three requests' first attempts collecting votes, none locked or waiting yet.
    fn collecting() -> AgeState {
        let model = AgeModel::new(AgeConfig::three(AgeBudget::default()));
        let mut s = model.init_states().remove(0);
        for (r, c) in s.coords.iter_mut().enumerate() {
            c.pc = APc::Collect;
            c.n = 1;
            c.age = r as u8;
            c.preps = [Prep::Sent; 2];
        }
        s
    }

    fn attempt(req: Rq) -> Attempt {
        Attempt { req, n: 1 }
    }

    /// Request `owner` holds item `i`, and request `waiter` waits for it there.
    fn wait(s: &mut AgeState, waiter: Rq, owner: Rq, i: usize) {
        s.locks[i] = Some(ALock { owner: attempt(owner), age: owner });
        s.coords[owner as usize].preps[i] = Prep::Locked;
        s.coords[waiter as usize].preps[i] = Prep::Waiting(attempt(owner));
    }

    #[test]
    fn two_requests_waiting_for_each_others_locks_are_a_cycle() {
        let mut s = collecting();
        wait(&mut s, 0, 1, 0);
        assert!(!s.wait_cycle(), "one wait alone");
        wait(&mut s, 1, 0, 1);
        assert_eq!(s.waits_for(), [0b010, 0b001, 0]);
        assert!(s.wait_cycle());
    }

    #[test]
    fn a_wait_for_a_lock_that_changed_hands_is_no_edge() {
        let mut s = collecting();
        wait(&mut s, 0, 1, 0);
        wait(&mut s, 1, 0, 1);
        // L1's lock on A went: L0 is woken (its next step tries again), so it waits for no one.
        s.locks[0] = None;
        assert_eq!(s.waits_for(), [0, 0b001, 0]);
        assert!(!s.wait_cycle());
    }

    #[test]
    fn a_cycle_through_three_requests_is_found_and_a_chain_is_not() {
        // L0 waits for L1 at A, L1 for L2 at B: a chain.
        let mut s = collecting();
        s.locks = [Some(ALock { owner: attempt(1), age: 1 }), Some(ALock { owner: attempt(2), age: 2 })];
        s.coords[0].preps = [Prep::Waiting(attempt(1)), Prep::Sent];
        s.coords[1].preps = [Prep::Locked, Prep::Waiting(attempt(2))];
        s.coords[2].preps = [Prep::Sent, Prep::Locked];
        assert!(!s.wait_cycle());
        // And L2 waits for L1 at A: L1 → L2 → L1, with L0 hanging off it.
        s.coords[2].preps[0] = Prep::Waiting(attempt(1));
        assert!(s.wait_cycle());
        // Two items allow no cycle of three (each waits for one holder at most, and a waiter holds the other
        // item at most), but the relation is checked as one: L0 → L1 → L2 → L0, and a self-loop.
        assert!(cycle_in([0b010, 0b100, 0b001]));
        assert!(cycle_in([0, 0b010, 0]));
        assert!(!cycle_in([0b110, 0b100, 0]));
    }
}
