//! The state of the whole system: DynamoDB (items, records), the network, every process (coordinator
//! executions, participant handlers, the sweeper), the clock (deadlines), the faults left, and ghost
//! variables that only the properties read.

use crate::config::{Budget, ItemId, Svc, Tx};

/// `twopc::model::Status` of the transactions table, mirrored rather than imported: the model depends
/// on stateright alone (not on the AWS SDK the core pulls in), and its states need `Hash` and `Ord`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    Preparing,
    /// Issue 32: a held transaction whose participants all prepared in time: its caller commits or aborts
    /// it (or the hold expires, past `holdUntil`).
    Prepared,
    Committing,
    Committed,
    Aborting,
    Aborted,
}

impl Status {
    pub fn terminal(self) -> bool {
        matches!(self, Status::Committed | Status::Aborted)
    }
    pub fn commit(self) -> bool {
        matches!(self, Status::Committing | Status::Committed)
    }
    pub fn abort(self) -> bool {
        matches!(self, Status::Aborting | Status::Aborted)
    }
    /// The terminal status a decided status is driven to.
    pub fn terminal_of(self) -> Status {
        match self {
            Status::Committing | Status::Committed => Status::Committed,
            _ => Status::Aborted,
        }
    }
}

/// An item's `lock` map: `{transactionId, token}` (expiresAt is the owner's deadline: whether a
/// resolver may take the lock for expired depends on the phase of its owner's clock, `State::phase`).
/// `late` is a ghost: the lock was written after this participant had processed an abort of the same
/// transaction (a stray lock of a late copy). `margin` is a ghost for a `sometimes` check only: the lock
/// was written while its owner was in the clock margin (phase 1); it is left out of the state's identity.
/// `held` (issue 32): a hold message moved the lock's expiry to its owner's `holdUntil` (the later of the
/// deadline and `holdUntil`: `extend_lock` only moves it later).
/// `pending` is the item's `pending` written with the lock (issue 30): the new value a service's own
/// operation computed at prepare, which its vote stands for and its commit applies (with `apply_pending`
/// off, the code before the fix kept nothing: then it is a ghost, the value the vote stood for).
/// `indexed` (issue 48): the lock write set `lockShard`/`lockExpiresAt`, the keys of the sparse locks index
/// `locks-by-expiry`, so the sweeper's `expired_locks` can find it. With `unindexed_recorded_locks` a lock of
/// an attempt recorded first (PREPARING before any prepare) and not held is written without them: only its
/// record (recovery of an open record) or a contact (another prepare meeting it) can find it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lock {
    pub tx: Tx,
    pub token: u8,
    pub late: bool,
    pub margin: bool,
    pub pending: Option<i8>,
    pub held: bool,
    pub indexed: bool,
}

impl std::hash::Hash for Lock {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.tx.hash(h);
        self.token.hash(h);
        self.late.hash(h);
        self.pending.hash(h);
        self.held.hash(h);
        self.indexed.hash(h);
    }
}

/// A participant table's item: `data.balance`, `version` (every commit moves it, issue 29), `lastTx`,
/// `lock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Item {
    pub balance: i8,
    pub version: u8,
    pub last_tx: Option<Tx>,
    pub lock: Option<Lock>,
}

/// Where a resource participant's barrier entry stands (participant/barrier.rs `State`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BState {
    /// Written before the first try request (`begin`, `attribute_not_exists`); the try's outcome unknown.
    Trying,
    /// The resource reserved; the entry knows what (`tried`).
    Tried,
    /// The resource refused the try: nothing held.
    Refused,
    Confirmed,
    Cancelled,
}

/// A resource participant's barrier entry of one transaction (`barrier#<transaction>` in its table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    pub state: BState,
    /// The token of the prepare that wrote it (its vote reports it; a commit must name it).
    pub token: u8,
    /// `tried` is recorded: the reservation the try answered (TRIED, or CANCELLED from TRIED).
    pub tried: bool,
    /// CANCELLED: the cancel call for `tried` went through (`cancelledCall`).
    pub cancelled_call: bool,
    /// CANCELLED: the repeat of the cancel is done (`rechecked`; an empty rollback is born rechecked).
    pub rechecked: bool,
    /// The entry carries a lock, in the locks index, for the sweeper: TRYING and TRIED until the
    /// deadline, CANCELLED until its recheck is due.
    pub lock: bool,
}

/// What the resource (the payment API) did under a transaction's try key: nothing yet, or its stored
/// first answer (declined, or an authorization, with what became of it). Capture and void are kept per
/// authorization: a second capture of a captured one or void of a voided one is answered OK; a capture of
/// a voided one or a void of a captured one is refused (409).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Res {
    Unused,
    Declined,
    /// Authorized: money held.
    Held,
    Captured,
    Voided,
}

/// A try request on its way to the resource: it may land late (after its sender gave up, after the
/// abort and the cancel), twice, or never. `from` is the prepare handler waiting for its answer (its
/// request, which names the delivery), None once nobody waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TryMsg {
    pub tx: Tx,
    pub from: Option<Req>,
}

/// A participant entry's vote, as the coordinator collected it or the record stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Vote {
    /// No vote recorded (a record written without votes, or not asked yet).
    Unknown,
    /// No answer: the prepare or its reply was lost, or the deadline came first.
    NoAnswer,
    Refused,
    /// PREPARED, with the lock token the vote reported (0 when the participant locked nothing, or
    /// when `token_check` is off).
    Prepared {
        token: u8,
        read_only: bool,
    },
}

/// A transaction record.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    pub status: Status,
    /// `executionId` of the writer that created it ([`NOBODY`]: lock resolution).
    pub exec: u8,
    /// `participants[i].vote` and `lockToken`, when the record carries votes.
    pub votes: Option<Vec<Vote>>,
    /// `sweepAt` as a rank: how many times the sweeper pushed it back (saturating).
    pub sweep_at: u8,
    /// The record is so near 400 KB that DynamoDB refuses every write that would make it larger (a
    /// `ValidationException`, whatever the retry): set by the first such write refused
    /// ([`crate::Budget::oversized`]), for ever after. Only its open life matters: cleared once terminal.
    pub oversized: bool,
}

impl Record {
    /// A record as its first write creates it (bounded by validation: never refused for size).
    pub fn new(status: Status, exec: u8, votes: Option<Vec<Vote>>) -> Record {
        Record { status, exec, votes, sweep_at: 0, oversized: false }
    }
}

/// The executionId of records that lock resolution creates.
pub const NOBODY: u8 = 0xFE;
/// The actor number of the sweeper in a [`Dest`].
pub const SWEEPER: u8 = 0xFF;

/// Where a participant's answer goes: an actor (a coordinator execution by index, or the sweeper)
/// and the slot of the invocation it waits on (the participant's index in the transaction).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dest {
    pub actor: u8,
    pub slot: u8,
}

/// A participant request (`ParticipantRequest`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Req {
    /// prepare{transactionId, deadline, startedAt, operations}; `exec` and `copy` make the lock
    /// token this delivery writes (a duplicate is another copy, hence another token).
    Prepare { tx: Tx, exec: u8, copy: u8 },
    /// commit with `onePhaseRecord` (the sole participant applies and writes the COMMITTED record).
    OnePhase { tx: Tx, exec: u8, copy: u8 },
    /// commit{transactionId, operations, lockToken}.
    Commit { tx: Tx, token: u8 },
    /// abort{transactionId, operations}; `item` = Some: the sweeper's key-only abort of one lock.
    Abort { tx: Tx, item: Option<ItemId> },
    /// Issue 32: hold{transactionId, operations, lockToken, holdUntil}: the locks of T with `token` expire at
    /// `holdUntil` now (best effort: nobody waits for the answer).
    Hold { tx: Tx, token: u8 },
}

impl Req {
    pub fn tx(&self) -> Tx {
        match *self {
            Req::Prepare { tx, .. }
            | Req::OnePhase { tx, .. }
            | Req::Commit { tx, .. }
            | Req::Abort { tx, .. }
            | Req::Hold { tx, .. } => tx,
        }
    }
}

/// A participant's answer (`ParticipantResponse`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ans {
    Vote(Vote),
    Committed,
    NotPrepared,
    Aborted,
    RecordExists,
    /// A resource participant's FAILED: the confirm or cancel its resource did not carry out (not an
    /// acknowledgement: the message is sent again).
    Failed,
    /// Issue 32: the answer to a hold message (HELD), which only the sweeper waits for.
    Held,
}

/// A request in flight to a participant, and where its answer goes. (An answer reaches its caller in
/// the handler's last step: an answer lost or late is the caller's timeout, [`crate::Action::GiveUp`].)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    pub to: Svc,
    pub req: Req,
    pub reply: Option<Dest>,
}

/// An invocation an actor made, per slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Inv {
    Idle,
    Waiting,
    Acked,
    /// Given up: no answer (lost, timed out) or an answer that does not acknowledge.
    Failed,
}

/// Where a participant handler is (participant.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TPc {
    /// `prepare`: the lock write (`DataTable::lock_all`), first or again.
    Lock,
    /// `prepare_read_only`: read the checked items.
    ReadCheck,
    /// `commit_one_phase`: the TransactWriteItems (`DataTable::apply_one_phase`).
    OnePhase,
    /// Wait-die: an older transaction waits for a younger one's live lock on `item`.
    Wait { owner: Tx, item: ItemId },
    /// `Participant::resolve`: an expired lock of `owner` on `item`.
    Resolve { owner: Tx, item: ItemId, stage: RStage },
    /// `Participant::commit`: `commit_item` of the `at`-th item; `all` = every item so far applied
    /// or already committed.
    Commit { at: u8, all: bool },
    /// `commit_item` found a stray lock of this transaction with another token: release it.
    ReleaseStray { at: u8, token: u8 },
    /// `Participant::abort`: `release` of the `at`-th item.
    Abort { at: u8 },
    /// Issues 29, 30: `judge`: read the item and judge it (a rule; a service's own operation computes the
    /// new value), before the lock write (two-phase) or the one-phase write.
    Judge,
    /// The lock write after `judge`, conditioned on the item's version being `seen`; `value` is what a
    /// service's own operation computed (kept in `pending`).
    LockSeen { seen: u8, value: i8 },
    /// `apply_one_phase` after `judge`, conditioned on the version `seen`, applying `value` (custom) or the delta.
    OnePhaseSeen { seen: u8, value: i8 },
    /// Issue 31, a resource participant's prepare (`Driver::prepare`): waiting for the answer of its try
    /// request (it gives up at its cutoff, or earlier on a timeout, and then sends the request again).
    /// `token`: its own, or the one of the TRYING entry an earlier delivery wrote (the same try).
    RTryAwait { token: u8 },
    /// The try's answer came: record it (TRYING → TRIED, or REFUSED) and vote.
    RTried { reserved: bool, token: u8 },
    /// `Driver::abort` read TRYING or TRIED (`seen_tried`): the `cancelled` write, conditioned on the entry
    /// being TRYING or TRIED (either: what it was when read is not part of the condition).
    RCancel { seen_tried: bool },
    /// `cancel_call`: void the reservation the entry knows, under the cancel's key, and mark `cancelledCall`.
    RVoid,
    /// `Driver::abort`, (again) from the read of the entry.
    RAbort,
    /// `Driver::commit`: the entry was TRIED with the voted token and the resource captured: TRIED →
    /// CONFIRMED (token), releasing its lock.
    RConfirmed,
}

/// Stages of lock resolution (recovery.rs `owner_fate`, participant `resolve`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RStage {
    /// Read the owner's record.
    Get,
    /// `TransactionStore::abort_if_absent`.
    CreateAborted,
    /// `TransactionStore::transition` `from` (PREPARING, or PREPARED) → ABORTING (owner past its deadline,
    /// or its `holdUntil`, and twice the margin).
    Transition { from: Status },
    /// `DataTable::commit_item` for the owner, with the lockToken its record lists.
    RollForward { token: u8 },
    /// `DataTable::release` of the owner's lock.
    Release,
    /// commit_item met a stray lock of the owner (another token): release it.
    ReleaseStray { token: u8 },
    /// Issue 32: the owner is held (PREPARED within its `holdUntil + 2M`): `DataTable::extend_lock` of the
    /// lock met, with the lockToken its record lists for this service, to `holdUntil`; then refused CONFLICT.
    Extend { token: u8 },
}

/// A participant handler at work on one delivered request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Task {
    pub svc: Svc,
    pub req: Req,
    pub reply: Option<Dest>,
    pub pc: TPc,
    /// The next step is the SDK's retry of a write whose reply was lost.
    pub retrying: bool,
    /// Lock writes of this handler that took effect without their reply (each burns its token).
    pub burned: u8,
}

/// The answer a coordinator execution gave its client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    /// 200 COMMITTED
    Ok,
    /// 202 COMMITTING
    Accepted,
    /// 409 ABORTED
    Conflict,
    /// 503; `aborted`: the coordinator knows the transaction is aborted (its decision write was
    /// refused), as opposed to an outcome it does not know.
    Unavailable { aborted: bool },
    /// The coordinator crashed: no answer (500 / a dropped connection).
    Crashed,
    /// Issue 32: a held POST's 202 PREPARED (with `holdUntil`).
    Held,
    /// Issue 32: the abort route's 200 ABORTED.
    AbortOk,
    /// Issue 32: the abort route's 409 with the committed body (the commit won).
    AbortLost,
}

/// Where a coordinator execution is (the coordinator: functions/twopc/src/coordinator/).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CPc {
    /// Not started (a client retry that has not been sent yet).
    Start,
    /// `TransactionStore::create` of the keyed PREPARING record.
    CreatePreparing,
    /// `PhaseEngine::prepare`: waiting for the votes.
    CollectVotes,
    /// Every vote in (or given up): read the clock and decide.
    Decide,
    /// The decision write: keyed `transition` PREPARING → `to`, unkeyed `create` COMMITTING.
    WriteDecision {
        to: Status,
    },
    /// `PhaseEngine::settle` / `create_commit`: the decision write failed; the abort is written over
    /// it conditionally (the fence): keyed `transition` PREPARING → ABORTING with the votes and a
    /// reason, unkeyed `create` ABORTED. `unknown`: the decision write's outcome is unknown (an
    /// earlier attempt may have applied it), which decides what `unrecorded_decision` may release if
    /// the fence fails too.
    Fence {
        unknown: bool,
    },
    /// `create_abort`: create the ABORTED record.
    AbortCreate,
    /// Waiting for abort acknowledgements before answering: 409 when `recorded`, else 503.
    AbortAwait {
        recorded: bool,
    },
    /// `drive`: waiting for the acknowledgements.
    DriveAwait {
        status: Status,
    },
    /// `drive`: `transition` to the terminal status.
    TerminalWrite {
        to: Status,
    },
    /// `replay`: another execution of the key runs it; wait while it may still be at work (until the
    /// deadline and twice the clock margin by this execution's clock), or until the answer budget runs out.
    Replay,
    /// `replay` → `abort_expired`: PREPARING past its deadline and twice the margin → ABORTING.
    RecoverTransition,
    /// `run_one_phase`: waiting for the sole participant's answer.
    OnePhaseWait,
    /// `run_one_phase`: RECORD_EXISTS: read the record and answer it.
    OnePhaseGet,
    /// `run_one_phase`: no commit: create the ABORTED record conditionally.
    OnePhaseAbort,
    /// Issue 32, a route call (`decide_held`): the SDK's retry of its decision write whose reply was lost: the
    /// write's condition (the status it read) fails, and it follows the record.
    HeldRetry,
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Coord {
    pub pc: CPc,
    pub retrying: bool,
    /// The votes it collected (or took from the record it drives), per participant.
    pub votes: Vec<Vote>,
    pub inv: Vec<Inv>,
    pub answer: Option<Answer>,
    /// Ghost: bit p = an abort to participant p was not acknowledged.
    pub abort_unacked: u8,
    /// A retried key (`replay`): it answers within the answer budget, which may run out at any moment
    /// ([`crate::Action::Budget`]), and answers what the record says.
    pub replay: bool,
}

/// Where the sweeper is (sweeper.rs). `rest` is what is left of this run's bounded read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SPc {
    Idle,
    /// `recover_transaction`: read the record.
    GetTx {
        tx: Tx,
        rest: Vec<Tx>,
    },
    /// `Coordinator::recover` (`abort_expired`): PREPARING past its deadline and twice the margin, or PREPARED
    /// past its `holdUntil` and twice the margin → ABORTING, conditional on the status `from` it read.
    Transition {
        tx: Tx,
        from: Status,
        rest: Vec<Tx>,
    },
    DriveAwait {
        tx: Tx,
        status: Status,
        rest: Vec<Tx>,
    },
    /// `recover_transaction`: `postpone` an entry it could not finish (`sweepAt` later, with the
    /// attempts and the error), conditional on the record being open (`attribute_exists(openShard)`),
    /// whatever its status: its own recovery may have moved it PREPARING → ABORTING before failing.
    Postpone {
        tx: Tx,
        rest: Vec<Tx>,
    },
    /// `drive`: the terminal transition.
    Terminal {
        tx: Tx,
        to: Status,
        rest: Vec<Tx>,
    },
    /// `DataTable::expired_locks` of one table.
    QueryLocks {
        svc: Svc,
    },
    /// `resolve_lock`: read the item, then (`owner_fate`) its owner's record.
    GetItem {
        svc: Svc,
        item: ItemId,
        rest: Vec<ItemId>,
    },
    /// `abort_if_absent`.
    OwnerCreate {
        svc: Svc,
        item: ItemId,
        owner: Tx,
        rest: Vec<ItemId>,
    },
    /// PREPARING past its deadline (PREPARED past its `holdUntil`) and twice the margin → ABORTING.
    OwnerTransition {
        svc: Svc,
        item: ItemId,
        owner: Tx,
        from: Status,
        rest: Vec<ItemId>,
    },
    /// Waiting for the participant's answer to the commit or abort it sent.
    LockAwait {
        svc: Svc,
        rest: Vec<ItemId>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sweeper {
    pub pc: SPc,
    pub retrying: bool,
    pub votes: Vec<Vote>,
    pub inv: Vec<Inv>,
}

/// Ghost variables: history the properties need and the code does not keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ghost {
    /// Per operation (flattened, `Config::op_index`): how many times it was applied.
    pub applied: Vec<u8>,
    /// Bit per tx: a COMMITTING or COMMITTED status was ever written.
    pub decided_commit: u8,
    /// Bit per tx: an ABORTING or ABORTED status was ever written, or its coordinator decided abort.
    pub decided_abort: u8,
    /// Bit per tx: the only execution that may write COMMITTING decided not to (it can never commit).
    pub no_commit: u8,
    /// Bit per tx: the transaction has a reason to abort (a refusal, a lost or late message, a crash,
    /// a refused write, its deadline passing while it was still being decided).
    pub reason: u8,
    /// Per tx: bit e = execution e sent prepares or applied its one-phase commit.
    pub executed_by: Vec<u8>,
    /// Bit tx * 8 + svc: that participant processed an abort of that transaction.
    pub abort_processed: u32,
    /// Bits of [`crate::Violation`]: properties that a step broke (checked at the moment it happened).
    pub violations: u16,
    /// Bits of [`crate::Event`]: things that happened (for the "sometimes" sanity checks).
    pub seen: u128,
}

/// The events seen (`Ghost::seen`) are left out of a state's identity (its hash, which is what the
/// checker deduplicates on): they are history for the `sometimes` checks only, and keeping them
/// would multiply the state space by the histories that lead to one and the same state. Only the
/// sweeper's progress bit, which the liveness check reads, and issue 32's undecided held lock (met only
/// with `resolver_extends_hold` off: the fix moves the lock, which a state shows) are kept.
impl std::hash::Hash for Ghost {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.applied.hash(h);
        self.decided_commit.hash(h);
        self.decided_abort.hash(h);
        self.no_commit.hash(h);
        self.reason.hash(h);
        self.executed_by.hash(h);
        self.abort_processed.hash(h);
        self.violations.hash(h);
        (self.seen & crate::Event::Progress.bit()).hash(h);
        // Issue 32: a resolver leaving a held owner's lock changes nothing else a state shows (the prepare is
        // refused as it would be by wait-die): kept, so that its `sometimes` check sees it.
        (self.seen & crate::Event::UndecidedHeldLock.bit()).hash(h);
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub items: Vec<Item>,
    /// Issue 31: the resource participant's barrier entries, per transaction (empty without a resource).
    pub barriers: Vec<Option<Entry>>,
    /// Issue 31: what the resource did under each transaction's try key (empty without a resource).
    pub res: Vec<Res>,
    /// Issue 31: try requests in flight to the resource (a multiset, kept sorted).
    pub rnet: Vec<TryMsg>,
    /// Issue 31: bit per tx: its card is declined (the resource refuses its try), chosen at the start.
    pub declined: u8,
    /// Issue 30: bit per service: it was redeployed (its own operation computes `balance - 2q`).
    pub deployed: u8,
    /// Issue 42, with `participants_cannot_write_records` off: a participant's operator has written a record
    /// straight to the table (once).
    pub forged: bool,
    pub records: Vec<Option<Record>>,
    /// Two bits per tx: the phase of its deadline by its coordinator's clock ([`phase`]; it moves
    /// forward at any moment after the transaction began).
    pub clock: u8,
    /// Issue 32: two bits per tx: the phase of its `holdUntil` H ([`phase`] read with H for D: 0 every
    /// coordinator's clock at or before H, 1 a coordinator's check reads either way, 2 every coordinator past
    /// H and a resolver's check of H + 2M reads either way, 3 every clock past H + 2M). It starts at 0 when
    /// PREPARED is written (H is the coordinator's clock then, plus `holdMs` ≥ 1 s > 2M) and moves forward at
    /// any moment while the record is PREPARED or a lock extended to H is held.
    pub hold: u8,
    pub coords: Vec<Coord>,
    /// Messages in flight (a multiset, kept sorted).
    pub net: Vec<Msg>,
    /// Participant handlers at work (kept sorted).
    pub tasks: Vec<Task>,
    pub sweeper: Sweeper,
    pub budget: Budget,
    pub ghost: Ghost,
}

/// Phases of a transaction's deadline D, in real time. Clocks differ pairwise by less than M
/// (`clock.rs` `CLOCK_MARGIN_MS`): at any moment all of them lie in a band narrower than M around the
/// coordinator's clock c. A participant may lock while its clock is at or before D + M
/// (`lock_cutoff`), a resolver may act once its clock is past D + 2M (`resolvable_after`); no two
/// clocks can be on those two sides at the same moment (they would differ by more than M), so a moment
/// where some participant may still lock comes before every moment where some resolver may act.
pub mod phase {
    /// c ≤ D: the coordinator may decide commit; every participant is before its cutoff (its clock
    /// < D + M), every resolver before D + 2M.
    pub const ON_TIME: u8 = 0;
    /// c > D and some participant may still be before its cutoff: the coordinator decides abort; a
    /// participant's cutoff check reads either way; no resolver is past D + 2M.
    pub const CUTOFF: u8 = 1;
    /// Every participant past its cutoff; a resolver's check (its clock past D + 2M?) reads either way.
    /// (When a resolver acts, the coordinator's clock is past D + M.)
    pub const RESOLVABLE: u8 = 2;
    /// Every clock past D + 2M: every resolver acts.
    pub const PAST: u8 = 3;
}

impl State {
    /// The phase of `tx`'s deadline by its coordinator's clock ([`phase`]).
    pub fn phase(&self, tx: Tx) -> u8 {
        (self.clock >> (2 * tx)) & 3
    }
    pub fn set_phase(&mut self, tx: Tx, p: u8) {
        self.clock = self.clock & !(3 << (2 * tx)) | p << (2 * tx);
    }
    /// The phase of `tx`'s `holdUntil` (issue 32).
    pub fn hold_phase(&self, tx: Tx) -> u8 {
        (self.hold >> (2 * tx)) & 3
    }
    pub fn set_hold_phase(&mut self, tx: Tx, p: u8) {
        self.hold = self.hold & !(3 << (2 * tx)) | p << (2 * tx);
    }
    /// The coordinator's clock is past the deadline.
    pub fn passed(&self, tx: Tx) -> bool {
        self.phase(tx) != phase::ON_TIME
    }
    pub fn record(&self, tx: Tx) -> Option<&Record> {
        self.records[tx as usize].as_ref()
    }
    pub fn status(&self, tx: Tx) -> Option<Status> {
        self.record(tx).map(|r| r.status)
    }
}
