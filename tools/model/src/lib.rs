//! An exhaustive model check of the two-phase-commit protocol of `functions/twopc`, as the code
//! implements it after the fixes of issue 19 (design.md), issue 27 (records refused for size) and issue
//! 28 (one clock margin M; a retried key answers what the record says), with switches back to the
//! behaviour before each fix.
//!
//! The model is a [`stateright::Model`]: its state is DynamoDB (participant items, transaction
//! records), the network (every message in flight), every process (coordinator executions,
//! participant handlers, the sweeper), the clock (the phase of each transaction's deadline,
//! `state::phase`) and what is left of each fault budget. Each action is one atomic step of the code,
//! named after the function it mirrors (see `step.rs`). The properties are in [`TwoPc::properties`].
//!
//! Run it with `cargo test -p twopc-model`; README.md says what is checked and how to run larger
//! configurations.

/// Issue 35: retries that keep their age (wait-die), a model of its own.
pub mod age;
/// Issue 41: retry chains with holds and age tokens together, a model of its own.
pub mod chain;
pub mod config;
/// Issue 48, item 3: escrow credits on hot receivers, a model of its own.
pub mod escrow;
pub mod report;
pub mod state;
mod step;

use stateright::{Model, Property};

pub use config::{Budget, Config, Switches};
pub use state::State;
pub use step::{Action, Fault, Late};

use config::{Svc, Tx};
use state::*;
use step::Reading;

/// A property a step can break at the moment it happens (a ghost bit; the `always` properties read them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    /// An abort decision with no reason to abort.
    SelfAbort,
    /// A lock released while its owner's record does not allow it.
    BadRelease,
    /// A 2PC operation applied while its transaction is not decided commit.
    BadRollForward,
    /// A status write that is not a forward move.
    StatusBackwards,
    /// An abort answered while a lock of the transaction that no late copy took is still held.
    LockLeftByAbort,
    /// A sweeper run that had work to do ended with nothing changed anywhere.
    SweeperStuck,
    /// Issue 29: a lock (or one-phase write) taken on an item whose version moved since its rule judged it.
    StaleJudgement,
    /// Issue 30: a commit wrote another value than the one its prepare computed and voted for.
    CommittedNotVoted,
    /// Issue 31: the resource was asked to capture a voided reservation or to void a captured one.
    ResourceMisuse,
    /// Issue 32: a commit decision of a held transaction written while every coordinator's clock is past its
    /// `holdUntil`.
    CommitAfterHold,
    /// Issue 32: a held (PREPARED) transaction aborted by a resolver (lock resolution, the sweeper, a route's
    /// or a retried key's `abort_expired`) while some coordinator's clock may still be at or before its
    /// `holdUntil` (its caller may still commit).
    HeldAbortedEarly,
}

impl Violation {
    pub fn bit(self) -> u16 {
        1 << (self as u16)
    }
    pub fn name(self) -> &'static str {
        match self {
            Violation::SelfAbort => "abort without a reason (self-abort)",
            Violation::BadRelease => "lock released against its owner's record",
            Violation::BadRollForward => "operation applied without a commit decision",
            Violation::StatusBackwards => "status moved backwards",
            Violation::LockLeftByAbort => "lock left behind by an answered abort",
            Violation::SweeperStuck => "sweeper run with work to do changed nothing",
            Violation::StaleJudgement => "a rule judged a stale item (locked at another version than it judged)",
            Violation::CommittedNotVoted => "a commit applied another value than its prepare voted for",
            Violation::ResourceMisuse => "a voided reservation confirmed, or a confirmed one voided",
            Violation::CommitAfterHold => "a held transaction's commit written after its holdUntil",
            Violation::HeldAbortedEarly => "a held transaction aborted by a resolver before holdUntil + 2M",
        }
    }
}

/// Things that happened, for the `sometimes` checks (a property cannot hold vacuously).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Something durable changed since the sweeper's run started (cleared while it is idle).
    Progress,
    LateDelivery,
    StrayLock,
    StrayReleased,
    RolledForward,
    SweeperRollForward,
    ResolutionRecordedAbort,
    ResolutionAbortedPreparing,
    SweeperFinished,
    SweepAtPushed,
    OwnWriteRecognised,
    Replayed,
    ReplayAnswered,
    RefusedDecisionReleased,
    CommitLostToResolution,
    OnePhaseCommitted,
    OnePhaseRecordExists,
    /// A write refused for size was written again shortened (issue 27).
    ShortenedWrite,
    /// A commit decision refused for size was written shortened (its votes and tokens fit).
    ShortenedCommit,
    /// A decision refused for size fell back to the fence.
    SizeRefusedDecisionFenced,
    /// The fence was written shortened (the record refuses to grow).
    FenceShortened,
    /// A record refused for size reached its terminal status.
    OversizedEnded,
    /// The fence took effect and its reply was lost.
    FenceLostReply,
    /// The fence met the decision it fences: applied after all (its outcome was unknown).
    FenceFoundDecision,
    /// `unrecorded_decision` released the locks (the decision certainly not applied).
    UnrecordedReleased,
    /// `unrecorded_decision` with the decision's outcome unknown: 503, nothing released.
    UnknownLeftToRecovery,
    /// A postponement refused (4xx, not applied).
    PostponeRefused,
    /// A postponement applied with its reply lost.
    PostponeLostReply,
    /// A postponement refused for size was written shortened and moved the entry back.
    ShortenedPostpone,
    /// A lock written while its transaction was in the clock margin (issue 28).
    LockInMargin,
    /// A lock written in the margin later released or applied (rolled forward or committed).
    MarginLockEnded,
    /// A participant's cutoff check in the margin read past `deadline + M`: REFUSED TIMEOUT.
    RefusedInMargin,
    /// A resolver's check in the margin read past `expiry + 2M`, and it acted on the lock or record.
    ResolvedInMargin,
    /// A retried key answered 503 (outcome unknown) while the record was PREPARING.
    RetryUndecided,
    /// A retried key answered 202 or 409 for a decided transaction not finished yet.
    RetryDecidedUnfinished,
    /// A lock written once every participant's clock is past the cutoff (only before issue 28's fix,
    /// `lock_cutoff` off: a prepare that arrived in time and locked after a wait or a lock resolution).
    LockPastCutoff,
    /// A prepare refused as late while its coordinator's clock was at or before the deadline (only
    /// before the fix: the plain deadline by a participant's clock ahead of the coordinator's).
    RefusedOnTime,
    /// Issue 29: a rule refused the item as read.
    RuleRefused,
    /// Issues 29, 30: a judged lock (or one-phase) write found the item changed since it was judged, and
    /// the prepare judged it again.
    Rejudged,
    /// Issue 30: a service's own operation refused the item as read (below zero).
    CustomRefused,
    /// Issue 30: the service was redeployed.
    Redeployed,
    /// Issue 30: a commit applied a pending value that the operation as deployed now would not compute.
    PendingAfterRedeploy,
    /// Issue 31: an abort found no entry and wrote CANCELLED (empty rollback).
    EmptyRollback,
    /// Issue 31: a prepare found its entry CANCELLED (or CONFIRMED): no try.
    TryAfterCancel,
    /// Issue 31: the try's TRIED write found the entry cancelled while the try ran.
    TriedAfterCancel,
    /// Issue 31: a try request landed and reserved after its transaction was decided abort or its entry
    /// cancelled.
    TryLandedLate,
    /// Issue 31: a try request got the stored first answer of its key.
    TryAnsweredFromStore,
    /// Issue 31: a prepare's try call timed out (or lost its answer) and it sent the try again.
    TryResent,
    /// Issue 31: the resource captured a reservation.
    ResourceConfirmed,
    /// Issue 31: the resource voided a reservation.
    ResourceVoided,
    /// Issue 31: an abort voided the reservation its entry knew (the cancel's key).
    CancelVoided,
    /// Issue 31: an abort read TRYING and cancelled an entry that had become TRIED (no void till the recheck).
    CancelMissedTried,
    /// Issue 31: a recheck was done.
    Rechecked,
    /// Issue 31: a recheck voided a reservation that was still held (a late try's, or one a cancel missed).
    RecheckReleased,
    /// Issue 32: the caller's commit route wrote PREPARED → COMMITTING.
    HeldCommitted,
    /// Issue 32: the caller's abort route wrote PREPARED → ABORTING.
    HeldAborted,
    /// Issue 32: the caller's abort route wrote PREPARING → ABORTING, before the hold was recorded.
    AbortBeforeHold,
    /// Issue 47: an operator's abort wrote PREPARING → ABORTING (its coordinator still preparing).
    OperatorAbortedPreparing,
    /// Issue 47: an operator's abort wrote PREPARED → ABORTING (a held transaction).
    OperatorAbortedHeld,
    /// Issue 47: an operator's abort found the transaction decided commit: 409.
    OperatorAbortLost,
    /// Issue 47: a coordinator's commit decision (PREPARING → COMMITTING, or PREPARED) lost to an operator's
    /// abort: it follows the record and drives the abort.
    CommitLostToOperator,
    /// Issue 48: a POST's coordinator answered 202 COMMITTING on its durable commit decision
    /// ([`Config::answer_on_decision`]) and goes on with the second phase after answering.
    AnsweredOnDecision,
    /// Issue 48: a coordinator that answered on its decision crashed before the end: the sweeper (or lock
    /// resolution) finishes the second phase.
    CrashedAfterEarlyAnswer,
    /// Issue 32: a resolver (lock resolution, the sweeper, a route's or retry's `abort_expired`) aborted a
    /// PREPARED transaction past its `holdUntil` and twice the margin.
    HoldExpired,
    /// Issue 32: the commit route read its clock past `holdUntil` and wrote the abort instead (409).
    CommitRouteExpired,
    /// Issue 32: a resolver past `holdUntil + 2M` found a held owner decided commit by its caller (the commit
    /// won the race with the expiry) and rolled its lock forward.
    CommitBeatExpiry,
    /// Issue 32: a prepare (or one-phase commit) met a lock of a PREPARED owner and was refused CONFLICT.
    HeldLockRefused,
    /// Issue 32: a resolver found a lock of a PREPARED owner expired by its deadline (its hold message lost
    /// or not there yet) and left it: the owner undecided until `holdUntil + 2M` (before the fix,
    /// `resolver_extends_hold` off).
    UndecidedHeldLock,
    /// Issue 32: a prepare's lock resolution found a lock of a PREPARED owner within its hold that no hold
    /// message extended, and goes on to move it to `holdUntil` (`extend_lock` with the voted token).
    PrepareMovesHeldLock,
    /// Issue 32: the sweeper found a lock of a PREPARED owner within its hold that no hold message extended,
    /// and sent the hold it missed (`resolve_lock`).
    SweeperMovesHeldLock,
    /// Issue 35: a prepare met a live lock whose owner is decided and resolved it at once.
    DecidedOwnerResolved,
    /// Issue 48 (`revisit_unclean_prepares`): an abort with an unclean prepare (or an operator's) was answered
    /// with its record left ABORTING for the sweeper.
    UncleanAbortLeftOpen,
}

impl Event {
    pub fn bit(self) -> u128 {
        1 << (self as u128)
    }
}

/// The model: a configuration (items, transactions, budgets, switches).
#[derive(Clone, Debug)]
pub struct TwoPc {
    pub cfg: Config,
    /// Coordinator executions: (transaction, execution number), by coordinator index; the route calls of
    /// issue 32 last ([`config::ROUTE`]).
    pub execs: Vec<(Tx, u8)>,
    /// Issue 32: the route a coordinator is at work on (None: an execution of the transaction's POST).
    pub route_of: Vec<Option<config::Route>>,
}

impl TwoPc {
    pub fn new(cfg: Config) -> TwoPc {
        // `prepare_lock` numbers a delivery's lock token by (execution, copy, written attempts): the
        // numbers stay distinct, as the code's random tokens are, only while a message is copied at
        // most once and at most 3 lock writes lose their reply. Beyond that two deliveries would share
        // a token and the check could miss a commit under another delivery's token (defect 1).
        assert!(
            cfg.budget.dup <= 1 && cfg.budget.db_reply <= 3,
            "lock tokens are distinct per delivery only with dup <= 1 and db_reply <= 3 (step.rs, prepare_lock)"
        );
        for t in &cfg.txs {
            for p in &t.parts {
                // `LockSeen` and `OnePhaseSeen` carry the version and value of one item.
                assert!(
                    !p.ops.iter().any(config::Op::judged) || p.ops.len() == 1,
                    "a judged operation (rule, custom) is the only one of its participant"
                );
                let charges = p.ops.iter().filter(|o| o.kind == config::OpKind::Charge).count();
                assert!(
                    (charges > 0) == cfg.is_resource(p.svc) && charges <= 1 && (charges == 0 || p.ops.len() == 1),
                    "a resource participant has one charge, and only a resource charges"
                );
            }
        }
        assert!(cfg.txs.len() <= 4 && cfg.items.len() + cfg.txs.len() < 0xFF, "lock slots fit an ItemId");
        for (t, spec) in cfg.txs.iter().enumerate() {
            // A held request is recorded first: the model's `keyed`; its routes need its record.
            assert!(!spec.held || spec.keyed, "a held transaction is recorded first (keyed)");
            assert!(
                cfg.routes.iter().all(|&(tx, r)| {
                    let spec = &cfg.txs[tx as usize];
                    if r == config::Route::Operator { spec.keyed } else { spec.held }
                }) || t > 0,
                "the caller's routes of held txs only, an operator's abort of keyed ones"
            );
        }
        let execs = cfg.executions();
        let route_of =
            execs.iter().map(|&(_, e)| e.checked_sub(config::ROUTE).map(|k| cfg.routes[k as usize].1)).collect();
        TwoPc { cfg, execs, route_of }
    }

    pub fn tx_name(&self, tx: Tx) -> &'static str {
        self.cfg.txs[tx as usize].name
    }

    pub fn coord_name(&self, ci: u8) -> String {
        let (tx, e) = self.execs[ci as usize];
        if let Some(route) = self.route_of[ci as usize] {
            return match route {
                config::Route::Commit => format!("caller's commit of {}", self.tx_name(tx)),
                config::Route::Abort => format!("caller's abort of {}", self.tx_name(tx)),
                config::Route::Operator => format!("operator's abort of {}", self.tx_name(tx)),
            };
        }
        if self.cfg.txs[tx as usize].executions > 1 {
            format!("coordinator {}#{}", self.tx_name(tx), e + 1)
        } else {
            format!("coordinator {}", self.tx_name(tx))
        }
    }

    pub fn actor_name(&self, actor: u8) -> String {
        if actor == SWEEPER { "sweeper".into() } else { self.coord_name(actor) }
    }

    pub fn task_name(&self, t: &Task) -> String {
        format!("{} handling {:?}", self.cfg.services[t.svc as usize], t.req)
    }

    pub fn msg_name(&self, m: &Msg) -> String {
        format!(
            "{:?} to {}{}",
            m.req,
            self.cfg.services[m.to as usize],
            m.reply.map(|d| format!(" (for {})", self.actor_name(d.actor))).unwrap_or_default()
        )
    }

    fn begun(&self, s: &State, tx: Tx) -> bool {
        self.execs_of(tx).any(|ci| s.coords[ci as usize].pc != CPc::Start)
    }

    /// No step can happen but a client sending a request it has not sent yet: the network is empty,
    /// every handler finished, every execution answered, every deadline and its margins passed, the
    /// sweeper idle with nothing to find.
    pub fn settled(&self, s: &State) -> bool {
        s.net.is_empty()
            && s.rnet.is_empty()
            && s.tasks.is_empty()
            && s.sweeper.pc == SPc::Idle
            && s.coords.iter().all(|c| matches!(c.pc, CPc::Start | CPc::Done))
            && (0..self.cfg.txs.len() as Tx).all(|tx| s.phase(tx) == phase::PAST || !self.begun(s, tx))
            && (0..self.cfg.txs.len() as Tx).all(|tx| s.hold_phase(tx) == phase::PAST || !self.hold_live(s, tx))
            && !self.sweeper_has_work(s)
    }

    fn fault_variants(&self, s: &State, k: Writes) -> Vec<Fault> {
        let mut v = vec![Fault::None];
        let b = s.budget;
        if b.total == 0 {
            return v;
        }
        if k.writes && b.db_reply > 0 {
            v.push(Fault::LostReply);
        }
        if k.refusable && b.refused > 0 {
            v.push(Fault::Refused);
        }
        // The first refusal for size of a record that can still grow (later ones need no fault).
        if let Some(tx) = k.grows
            && b.oversized > 0
            && s.record(tx).is_some_and(|r| !r.oversized && !r.status.terminal())
        {
            v.push(Fault::Oversized { commit_fits: false });
            if k.commit_decision && self.cfg.switches.shortened_writes {
                v.push(Fault::Oversized { commit_fits: true });
            }
        }
        v
    }

    /// A participant handler's step: its writes may lose their reply, lock resolution's abort of a
    /// PREPARING owner may be refused for size, its answer may be lost.
    fn task_variants(&self, s: &State, writes: bool, grows: Option<Tx>, answers: bool) -> Vec<Fault> {
        let mut v = self.fault_variants(s, Writes { writes, grows, ..Writes::default() });
        if answers && s.budget.total > 0 && s.budget.loss > 0 {
            v.push(Fault::DropReply);
        }
        v
    }

    /// Steps and their faults, by coordinator pc: whether it has a step, and what it writes.
    fn coord_kind(&self, ci: usize, pc: CPc) -> (bool, Writes) {
        let (tx, _) = self.execs[ci];
        let spec = &self.cfg.txs[tx as usize];
        let keyed = spec.keyed && !spec.one_phase();
        let plain = Writes { writes: true, ..Writes::default() };
        let decision = Writes { writes: true, refusable: true, ..Writes::default() };
        let grows = keyed.then_some(tx);
        let kind = match pc {
            CPc::Start => Writes { writes: keyed, ..Writes::default() },
            // Deciding abort writes the abort at once.
            CPc::Decide => Writes { grows, ..decision },
            CPc::CreatePreparing => plain,
            CPc::WriteDecision { to } => {
                Writes { grows, commit_decision: keyed && to == Status::Committing, ..decision }
            }
            CPc::Fence { .. } => Writes { grows, ..decision },
            CPc::AbortCreate | CPc::OnePhaseAbort => decision,
            CPc::TerminalWrite { .. } => plain,
            CPc::RecoverTransition => Writes { grows, ..plain },
            CPc::Replay | CPc::OnePhaseGet | CPc::HeldRetry => Writes::default(),
            CPc::CollectVotes | CPc::AbortAwait { .. } | CPc::DriveAwait { .. } | CPc::OnePhaseWait | CPc::Done => {
                return (false, Writes::default());
            }
        };
        (true, kind)
    }

    /// How many clock checks a participant's lock attempt for `tx` may make that read either way: its
    /// own cutoff, and whether a lock it meets (another transaction's) reads expired.
    fn attempt_checks(&self, s: &State, tx: Tx) -> u32 {
        let own = if self.cfg.switches.lock_cutoff {
            self.cutoff_reading(s, tx) == Reading::Either
        } else {
            // Before issue 28: checked on arrival only, against the plain deadline.
            s.phase(tx) < phase::RESOLVABLE
        };
        let other = (0..self.cfg.txs.len() as Tx).any(|o| {
            o != tx && (self.resolvable(s, o) == Reading::Either || self.hold_resolvable(s, o) == Reading::Either)
        });
        own as u32 + other as u32
    }
}

/// What a step may write, for its fault variants.
#[derive(Clone, Copy, Debug, Default)]
struct Writes {
    /// It writes to DynamoDB: the reply may be lost.
    writes: bool,
    /// DynamoDB may refuse it (4xx): decision writes, the fence, abort records, postponements.
    refusable: bool,
    /// It may make this transaction's record larger: DynamoDB may refuse it for size.
    grows: Option<Tx>,
    /// A keyed commit decision: its shortened form may or may not fit.
    commit_decision: bool,
}

fn popcount(x: u8) -> u32 {
    x.count_ones()
}

/// The [`Late`] variants of a step that may make `checks` clock checks that read either way.
fn lates(checks: u32) -> impl Iterator<Item = Late> {
    assert!(checks < 8, "a step's clock checks that read either way fit in a Late byte");
    (0..1u8 << checks).map(Late)
}

impl Model for TwoPc {
    type State = State;
    type Action = Action;

    /// An unkeyed execution (two-phase or one-phase) writes nothing before its first messages, and a
    /// message may be delayed any time: it starts with them already in flight. A keyed one starts by
    /// writing its record, and a client's retry is sent at any moment: those start later.
    fn init_states(&self) -> Vec<State> {
        let cfg = &self.cfg;
        let nparts = |tx: Tx| cfg.txs[tx as usize].parts.len();
        let maxparts = cfg.txs.iter().map(|t| t.parts.len()).max().unwrap_or(1);
        let ntx = cfg.txs.len();
        let resource = cfg.resource.is_some();
        let mut s = State {
            items: cfg
                .items
                .iter()
                .map(|i| Item { balance: i.balance, version: 0, last_tx: None, lock: None })
                .collect(),
            barriers: if resource { vec![None; ntx] } else { vec![] },
            res: if resource { vec![Res::Unused; ntx] } else { vec![] },
            rnet: vec![],
            declined: 0,
            deployed: 0,
            forged: false,
            records: vec![None; cfg.txs.len()],
            clock: 0,
            hold: 0,
            coords: self
                .execs
                .iter()
                .map(|&(tx, _)| Coord {
                    pc: CPc::Start,
                    retrying: false,
                    votes: vec![Vote::Unknown; nparts(tx)],
                    inv: vec![Inv::Idle; nparts(tx)],
                    answer: None,
                    abort_unacked: 0,
                    replay: false,
                })
                .collect(),
            net: vec![],
            tasks: vec![],
            sweeper: Sweeper { pc: SPc::Idle, retrying: false, votes: vec![], inv: vec![Inv::Idle; maxparts] },
            budget: cfg.budget,
            ghost: Ghost {
                applied: vec![0; cfg.op_count()],
                decided_commit: 0,
                decided_abort: 0,
                no_commit: 0,
                reason: 0,
                executed_by: vec![0; cfg.txs.len()],
                abort_processed: 0,
                violations: 0,
                seen: 0,
            },
        };
        for ci in 0..self.execs.len() {
            let (tx, e) = self.execs[ci];
            if e == 0 && !cfg.txs[tx as usize].keyed {
                s = self.next_state(&s, Action::Coord(ci as u8, Fault::None, Late(0))).expect("an unkeyed start sends");
            }
        }
        // Issue 31: each transaction that charges a card has a good or a declined one.
        let charging: Vec<Tx> =
            (0..ntx as Tx).filter(|&tx| cfg.txs[tx as usize].parts.iter().any(|p| cfg.is_resource(p.svc))).collect();
        (0..1u8 << charging.len())
            .map(|choice| {
                let mut s = s.clone();
                for (k, &tx) in charging.iter().enumerate() {
                    if choice & (1 << k) != 0 {
                        s.declined |= 1 << tx;
                    }
                }
                s
            })
            .collect()
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let ntx = self.cfg.txs.len() as Tx;
        for tx in 0..ntx {
            if s.phase(tx) != phase::PAST && self.begun(s, tx) {
                out.push(Action::Deadline(tx));
            }
            if s.hold_phase(tx) != phase::PAST && self.hold_live(s, tx) {
                out.push(Action::HoldExpiry(tx));
            }
        }
        for (ci, c) in s.coords.iter().enumerate() {
            let (tx, e) = self.execs[ci];
            let (has_step, kind) = self.coord_kind(ci, c.pc);
            let mut checks = 0;
            let enabled = match c.pc {
                // Issue 32: the caller commits once it has the 202; it may abort once the record exists.
                CPc::Start if self.route_of[ci].is_some() => {
                    // Issue 47: the operator's abort reads no clock.
                    if self.route_of[ci] != Some(config::Route::Operator) {
                        checks = self.route_checks(s, tx);
                    }
                    match self.route_of[ci] {
                        Some(config::Route::Commit) => {
                            self.execs_of(tx).any(|o| s.coords[o as usize].answer == Some(Answer::Held))
                        }
                        _ => s.record(tx).is_some(),
                    }
                }
                // A client's retry is sent after its first request.
                CPc::Start => {
                    e == 0 || self.execs_of(tx).any(|o| o != ci as u8 && s.coords[o as usize].pc != CPc::Start)
                }
                // Issue 32: a held (PREPARED) record is answered at once, or aborted past its hold.
                CPc::Replay if s.status(tx) == Some(Status::Prepared) => {
                    checks = (self.hold_resolvable(s, tx) == Reading::Either) as u32;
                    true
                }
                // It waits until the record ends or its clock is past the deadline and twice the margin.
                CPc::Replay => {
                    let terminal = s.status(tx).is_some_and(Status::terminal);
                    let r = self.resolvable(s, tx);
                    checks = (!terminal && r == Reading::Either) as u32;
                    terminal || r != Reading::Before
                }
                _ => has_step,
            };
            if enabled {
                for f in self.fault_variants(s, kind) {
                    for l in lates(checks) {
                        out.push(Action::Coord(ci as u8, f, l));
                    }
                }
            }
            if c.replay && matches!(c.pc, CPc::Replay | CPc::DriveAwait { .. } | CPc::TerminalWrite { .. }) {
                out.push(Action::Budget(ci as u8));
            }
            for (slot, x) in c.inv.iter().enumerate() {
                let d = Dest { actor: ci as u8, slot: slot as u8 };
                if *x == Inv::Waiting && (self.free_give_up(s, d) || s.budget.loss > 0 && s.budget.total > 0) {
                    out.push(Action::GiveUp(d));
                }
            }
            if !matches!(c.pc, CPc::Start | CPc::Done) && s.budget.crash > 0 && s.budget.total > 0 {
                out.push(Action::Crash(ci as u8));
            }
        }
        for (i, m) in s.net.iter().enumerate() {
            if i > 0 && s.net[i - 1] == *m {
                continue;
            }
            let i = i as u8;
            let locks = matches!(m.req, Req::Prepare { .. } | Req::OnePhase { .. });
            // (A hold's lost reply is folded: its retry changes nothing.)
            let hold = matches!(m.req, Req::Hold { .. });
            let writes = !hold && (!locks || s.phase(m.req.tx()) < phase::RESOLVABLE);
            let answers = m.reply.is_some();
            let checks = if locks { self.attempt_checks(s, m.req.tx()) } else { 0 };
            for f in self.task_variants(s, writes, None, answers) {
                for l in lates(checks) {
                    out.push(Action::Deliver(i, f, l));
                }
            }
            // Issue 48, point 1 (`recorded_prepares_sent_once`): a prepare of an attempt whose locks are
            // unindexed is sent once (its invoke without SDK retries, an HTTPS participant called once), so
            // that a vote received means no other execution of it is in flight; it may still be lost or late.
            let sent_once = matches!(m.req, Req::Prepare { tx, .. } if self.unindexed(tx))
                && self.cfg.switches.recorded_prepares_sent_once;
            if s.budget.dup > 0 && s.budget.total > 0 && !sent_once {
                out.push(Action::Duplicate(i));
            }
            if s.budget.loss > 0 && s.budget.total > 0 {
                out.push(Action::Lose(i));
            }
        }
        for (i, t) in s.tasks.iter().enumerate() {
            let i = i as u8;
            let tx = t.req.tx();
            match t.pc {
                TPc::Wait { owner, item } => {
                    // Woken when the lock it waits for changes, or when its clock may read it expired.
                    let held = s.items[item as usize].lock.is_some_and(|l| l.tx == owner)
                        && self.resolvable(s, owner) == Reading::Before;
                    if !held {
                        for f in self.task_variants(s, true, None, t.reply.is_some()) {
                            for l in lates(self.attempt_checks(s, tx)) {
                                out.push(Action::Task(i, f, l));
                            }
                        }
                    }
                    out.push(Action::TaskGiveUp(i));
                }
                TPc::ReadCheck => {
                    for f in self.task_variants(s, false, None, t.reply.is_some()) {
                        for l in lates(self.attempt_checks(s, tx)) {
                            out.push(Action::Task(i, f, l));
                        }
                    }
                }
                TPc::Lock | TPc::OnePhase | TPc::LockSeen { .. } | TPc::OnePhaseSeen { .. } => {
                    for f in self.task_variants(s, true, None, t.reply.is_some()) {
                        for l in lates(self.attempt_checks(s, tx)) {
                            out.push(Action::Task(i, f, l));
                        }
                    }
                }
                // The read and the judgement: no write (its cutoff check, a lock it may meet).
                TPc::Judge => {
                    for f in self.task_variants(s, false, None, t.reply.is_some()) {
                        for l in lates(self.attempt_checks(s, tx)) {
                            out.push(Action::Task(i, f, l));
                        }
                    }
                }
                // A resource prepare waits for its try's answer (`Action::TryLand`), or stops waiting.
                TPc::RTryAwait { .. } => {
                    let r = self.cutoff_reading(s, tx);
                    for l in lates((r == Reading::Either) as u32) {
                        out.push(Action::TryTimeout(i, l));
                    }
                }
                // A resource participant's steps: their barrier writes' lost replies are folded (the SDK's
                // retry meets its own write, which the code reads as the same outcome); the answer may be lost.
                TPc::RTried { .. } | TPc::RCancel { .. } | TPc::RVoid | TPc::RAbort | TPc::RConfirmed => {
                    for f in self.task_variants(s, false, None, t.reply.is_some()) {
                        out.push(Action::Task(i, f, Late(0)));
                    }
                }
                // Lock resolution: reading the owner's record may lead to aborting it (a growing write); a
                // PREPARED owner's `holdUntil + 2M` may read either way (issue 32).
                // Issue 32: `extend_lock`'s lost reply is folded (its retry meets the lock extended): no write fault.
                TPc::Resolve { stage: RStage::Extend { .. }, .. } => {
                    for f in self.task_variants(s, false, None, t.reply.is_some()) {
                        out.push(Action::Task(i, f, Late(0)));
                    }
                }
                TPc::Resolve {
                    owner, stage: RStage::Get | RStage::Transition { .. } | RStage::CreateAborted, ..
                } => {
                    for f in self.task_variants(s, true, Some(owner), t.reply.is_some()) {
                        for l in lates(self.hold_checks(s)) {
                            out.push(Action::Task(i, f, l));
                        }
                    }
                }
                _ => {
                    for f in self.task_variants(s, true, None, t.reply.is_some()) {
                        out.push(Action::Task(i, f, Late(0)));
                    }
                }
            }
        }
        // Issue 31: try requests in flight to the resource.
        for (i, m) in s.rnet.iter().enumerate() {
            if i > 0 && s.rnet[i - 1] == *m {
                continue;
            }
            let i = i as u8;
            out.push(Action::TryLand(i, Fault::None));
            let svc = self.cfg.resource.expect("try requests go to a resource");
            let answered = m.from.is_some_and(|req| {
                s.tasks.iter().any(|t| t.svc == svc && t.req == req && matches!(t.pc, TPc::RTryAwait { .. }))
            });
            if answered && s.budget.loss > 0 && s.budget.total > 0 {
                out.push(Action::TryLand(i, Fault::DropReply));
            }
            if s.budget.dup > 0 && s.budget.total > 0 {
                out.push(Action::TryDup(i));
            }
            if s.budget.loss > 0 && s.budget.total > 0 {
                out.push(Action::TryLose(i));
            }
        }
        // Issue 42: before the fix, a participant's operator could write any record (once, at any moment).
        if !self.cfg.switches.participants_cannot_write_records && !s.forged {
            for tx in 0..self.cfg.txs.len() as Tx {
                if s.status(tx).is_some_and(|st| matches!(st, Status::Prepared | Status::Aborting | Status::Aborted)) {
                    out.push(Action::ForgeCommit(tx));
                }
            }
        }
        // Issue 30: a service with its own operations is redeployed (once) at any moment.
        if self.cfg.redeploy {
            for svc in 0..self.cfg.services.len() as Svc {
                let custom = self
                    .cfg
                    .txs
                    .iter()
                    .flat_map(|t| &t.parts)
                    .any(|p| p.svc == svc && p.ops.iter().any(|o| matches!(o.kind, config::OpKind::Custom { .. })));
                if custom && s.deployed & (1 << svc) == 0 {
                    out.push(Action::Redeploy(svc));
                }
            }
        }
        let sweep_checks = self.sweeper_checks(s);
        match &s.sweeper.pc {
            SPc::Idle => {
                let may_start = self.cfg.sweeper_races_coordinators
                    || s.coords.iter().all(|c| matches!(c.pc, CPc::Start | CPc::Done));
                if may_start && self.sweeper_may_have_work(s) {
                    for l in lates(sweep_checks) {
                        out.push(Action::Sweep(Fault::None, l));
                    }
                }
            }
            SPc::DriveAwait { .. } | SPc::LockAwait { .. } => {
                for (slot, x) in s.sweeper.inv.iter().enumerate() {
                    let d = Dest { actor: SWEEPER, slot: slot as u8 };
                    if *x == Inv::Waiting && (self.free_give_up(s, d) || s.budget.loss > 0 && s.budget.total > 0) {
                        out.push(Action::GiveUp(d));
                    }
                }
            }
            SPc::Terminal { .. } => {
                for f in self.fault_variants(s, Writes { writes: true, ..Writes::default() }) {
                    out.push(Action::Sweep(f, Late(0)));
                }
            }
            SPc::OwnerCreate { .. } => {
                for f in self.fault_variants(s, Writes { writes: true, ..Writes::default() }) {
                    for l in lates(self.hold_checks(s)) {
                        out.push(Action::Sweep(f, l));
                    }
                }
            }
            &SPc::Transition { tx, .. } | &SPc::OwnerTransition { owner: tx, .. } => {
                for f in self.fault_variants(s, Writes { writes: true, grows: Some(tx), ..Writes::default() }) {
                    for l in lates(self.hold_checks(s)) {
                        out.push(Action::Sweep(f, l));
                    }
                }
            }
            &SPc::Postpone { tx, .. } => {
                let k = Writes { writes: true, refusable: true, grows: Some(tx), ..Writes::default() };
                for f in self.fault_variants(s, k) {
                    out.push(Action::Sweep(f, Late(0)));
                }
            }
            _ => {
                for l in lates(sweep_checks) {
                    out.push(Action::Sweep(Fault::None, l));
                }
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        self.apply(s, action, false).map(|(n, _)| n)
    }

    fn format_action(&self, action: &Action) -> String {
        format!("{action:?}")
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut p = vec![
            Property::<Self>::always("each operation applied at most once", |_, s| {
                s.ghost.applied.iter().all(|&n| n <= 1)
            }),
            Property::<Self>::always("an aborted transaction never applies anything", |m, s| {
                (0..m.cfg.txs.len()).all(|tx| {
                    s.ghost.decided_abort & (1 << tx) == 0 || m.ops_of(tx as Tx).all(|o| s.ghost.applied[o] == 0)
                })
            }),
            Property::<Self>::always("a COMMITTED transaction applied all its operations", |m, s| {
                (0..m.cfg.txs.len()).all(|tx| {
                    s.status(tx as Tx) != Some(Status::Committed)
                        || m.writing_ops_of(tx as Tx).all(|o| s.ghost.applied[o] == 1)
                })
            }),
            Property::<Self>::always("one decision per transaction, status only moves forward", |_, s| {
                s.ghost.decided_commit & s.ghost.decided_abort == 0
                    && s.ghost.violations & Violation::StatusBackwards.bit() == 0
            }),
            Property::<Self>::always("no lock released or rolled forward against its owner's record", |_, s| {
                s.ghost.violations & (Violation::BadRelease.bit() | Violation::BadRollForward.bit()) == 0
            }),
            Property::<Self>::always("conservation: balances never negative, sum constant", |m, s| {
                if s.items.iter().any(|i| i.balance < 0) {
                    return false;
                }
                if s.records.iter().flatten().any(|r| r.status == Status::Committing) {
                    return true;
                }
                let sum: i32 = (0..s.items.len())
                    .filter(|&i| m.cfg.money_item(i as config::ItemId))
                    .map(|i| s.items[i].balance as i32)
                    .sum();
                let committed: i32 = (0..m.cfg.txs.len())
                    .filter(|&tx| s.status(tx as Tx) == Some(Status::Committed))
                    .map(|tx| m.cfg.txs[tx].net_delta())
                    .sum();
                sum == m.cfg.initial_sum() + committed
            }),
            Property::<Self>::always("a key never executes twice", |_, s| {
                s.ghost.executed_by.iter().all(|&b| popcount(b) <= 1)
            }),
            Property::<Self>::always("every answer agrees with the record", |m, s| m.answers_agree(s, false)),
            Property::<Self>::always("no self-abort", |_, s| s.ghost.violations & Violation::SelfAbort.bit() == 0),
            Property::<Self>::always("no lock left behind by an abort", |_, s| {
                s.ghost.violations & Violation::LockLeftByAbort.bit() == 0
            }),
            Property::<Self>::always("check-only participants lock nothing", |m, s| {
                s.items.iter().enumerate().all(|(i, it)| {
                    it.lock.is_none_or(|l| {
                        let spec = &m.cfg.txs[l.tx as usize];
                        // (Issue 32: a held transaction's check-only participants lock what they check.)
                        spec.held || !spec.part_of(m.cfg.items[i].svc).is_some_and(|p| spec.parts[p].read_only())
                    })
                })
            }),
            Property::<Self>::always("once faults stop, every transaction ends and no lock is left", |m, s| {
                if s.ghost.violations & Violation::SweeperStuck.bit() != 0 {
                    return false;
                }
                !m.settled(s) || m.clean(s)
            }),
            Property::<Self>::eventually("every transaction ends", |m, s| {
                m.clean(s)
                    && s.coords
                        .iter()
                        .enumerate()
                        .all(|(ci, c)| c.pc == CPc::Done || m.route_of[ci].is_some() && c.pc == CPc::Start)
            }),
        ];
        p.extend(self.feature_properties());
        p.extend(self.sanity_checks());
        p
    }
}

fn seen<const E: u32>(_: &TwoPc, s: &State) -> bool {
    s.ghost.seen & (1 << E) != 0
}

impl TwoPc {
    fn ops_of(&self, tx: Tx) -> impl Iterator<Item = usize> + '_ {
        let spec = &self.cfg.txs[tx as usize];
        spec.parts
            .iter()
            .enumerate()
            .flat_map(move |(p, part)| (0..part.ops.len()).map(move |o| self.cfg.op_index(tx, p, o)))
    }

    fn writing_ops_of(&self, tx: Tx) -> impl Iterator<Item = usize> + '_ {
        let spec = &self.cfg.txs[tx as usize];
        spec.parts.iter().enumerate().flat_map(move |(p, part)| {
            part.ops
                .iter()
                .enumerate()
                .filter(|(_, op)| op.kind != config::OpKind::Check)
                .map(move |(o, _)| self.cfg.op_index(tx, p, o))
        })
    }

    /// 200 ⇒ COMMITTED, 202 ⇒ COMMITTING/COMMITTED, 409 ⇒ ABORTING/ABORTED, a 503 after a refused
    /// decision ⇒ never a commit; and `settled`: 202 ⇒ COMMITTED, 409 ⇒ ABORTED.
    /// Issue 32: a held POST's 202 PREPARED ⇒ PREPARED or later; the commit route's 200/202/409 as a POST's;
    /// the abort route's 200 ⇒ ABORTING/ABORTED, its 409 ⇒ COMMITTING/COMMITTED (once settled COMMITTED).
    fn answers_agree(&self, s: &State, settled: bool) -> bool {
        s.coords.iter().enumerate().all(|(ci, c)| {
            let status = s.status(self.execs[ci].0);
            match c.answer {
                Some(Answer::Held) => status.is_some_and(|st| st != Status::Preparing),
                Some(Answer::AbortOk) => status.is_some_and(Status::abort),
                Some(Answer::AbortLost) if settled => status == Some(Status::Committed),
                Some(Answer::AbortLost) => status.is_some_and(Status::commit),
                Some(Answer::Ok) => status == Some(Status::Committed),
                Some(Answer::Accepted) if settled => status == Some(Status::Committed),
                Some(Answer::Accepted) => status.is_some_and(Status::commit),
                Some(Answer::Conflict) if settled => status == Some(Status::Aborted),
                Some(Answer::Conflict) => status.is_some_and(Status::abort),
                Some(Answer::Unavailable { aborted: true }) => !status.is_some_and(Status::commit),
                _ => true,
            }
        })
    }

    /// Every record terminal (or absent: presumed abort), no lock (an item's, a barrier entry's), every
    /// answer final and right.
    fn clean(&self, s: &State) -> bool {
        s.records.iter().all(|r| r.as_ref().is_none_or(|r| r.status.terminal()))
            && self.slots().all(|i| self.slot_lock(s, i).is_none())
            && self.answers_agree(s, true)
            && s.coords.iter().all(|c| c.pc == CPc::Start || c.answer.is_some())
    }

    fn has_op(&self, f: impl Fn(&config::OpKind) -> bool) -> bool {
        self.cfg.txs.iter().flat_map(|t| &t.parts).flat_map(|p| &p.ops).any(|o| f(&o.kind))
    }

    /// The ghost index of `tx`'s charge (its resource participant's operation).
    fn charge_op(&self, tx: Tx) -> Option<usize> {
        let spec = &self.cfg.txs[tx as usize];
        let part = spec.parts.iter().position(|p| self.cfg.is_resource(p.svc))?;
        Some(self.cfg.op_index(tx, part, 0))
    }

    /// The properties of issues 29 to 32, in the configurations that have what they are about.
    fn feature_properties(&self) -> Vec<Property<Self>> {
        let mut p = vec![];
        if self.cfg.txs.iter().any(|t| t.held) {
            p.push(Property::<Self>::always(
                "no commit decision written after holdUntil by the coordinator's clock",
                |_, s| s.ghost.violations & Violation::CommitAfterHold.bit() == 0,
            ));
            p.push(Property::<Self>::always(
                "a held transaction is never aborted by a resolver before holdUntil + 2M",
                |_, s| s.ghost.violations & Violation::HeldAbortedEarly.bit() == 0,
            ));
            p.push(Property::<Self>::always(
                "once everything settles, every held transaction is decided and its locks released",
                |m, s| {
                    !m.settled(s)
                        || (0..m.cfg.txs.len() as Tx)
                            .filter(|&tx| m.cfg.txs[tx as usize].held)
                            .all(|tx| s.status(tx).is_none_or(Status::terminal) && !m.holds_lock(s, tx))
                },
            ));
        }
        if self.has_op(|k| matches!(k, config::OpKind::Ruled { .. } | config::OpKind::Custom { .. })) {
            p.push(Property::<Self>::always("a rule never judged a stale item", |_, s| {
                s.ghost.violations & Violation::StaleJudgement.bit() == 0
            }));
        }
        if self.has_op(|k| matches!(k, config::OpKind::Custom { .. })) {
            p.push(Property::<Self>::always("a commit applies the value its prepare voted for", |_, s| {
                s.ghost.violations & Violation::CommittedNotVoted.bit() == 0
            }));
        }
        if self.cfg.resource.is_some() {
            p.push(Property::<Self>::always("nothing is confirmed for a transaction not decided commit", |m, s| {
                (0..m.cfg.txs.len() as Tx)
                    .all(|tx| s.res[tx as usize] != Res::Captured || s.status(tx).is_some_and(Status::commit))
            }));
            p.push(Property::<Self>::always("never both confirmed and voided", |_, s| {
                s.ghost.violations & Violation::ResourceMisuse.bit() == 0
            }));
            p.push(Property::<Self>::always(
                "a committed transaction's reservation is confirmed exactly once",
                |m, s| {
                    let settled = m.settled(s);
                    (0..m.cfg.txs.len() as Tx).all(|tx| {
                        m.charge_op(tx).is_none_or(|o| {
                            s.ghost.applied[o] <= 1
                                && (!settled
                                    || s.status(tx) != Some(Status::Committed)
                                    || s.res[tx as usize] == Res::Captured && s.ghost.applied[o] == 1)
                        })
                    })
                },
            ));
            p.push(Property::<Self>::always("once everything settles, no reservation is held", |m, s| {
                !m.settled(s) || s.res.iter().all(|&r| r != Res::Held)
            }));
        }
        p
    }

    /// `sometimes` properties of issues 29 to 32.
    fn feature_sanity_checks(&self) -> Vec<Property<Self>> {
        let cfg = &self.cfg;
        let sw = cfg.switches;
        let b = cfg.budget;
        let mut p = vec![];
        if cfg.routes.iter().any(|&(_, r)| r == config::Route::Operator) {
            p.push(Property::<Self>::sometimes(
                "sometimes an operator aborts a transaction still preparing",
                seen::<{ Event::OperatorAbortedPreparing as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes an operator's abort wins over its coordinator's decided commit (or hold)",
                seen::<{ Event::CommitLostToOperator as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes an operator's abort finds the transaction committed: 409",
                seen::<{ Event::OperatorAbortLost as u32 }>,
            ));
            if cfg.txs.iter().any(|t| t.held) {
                p.push(Property::<Self>::sometimes(
                    "sometimes an operator aborts a held (PREPARED) transaction",
                    seen::<{ Event::OperatorAbortedHeld as u32 }>,
                ));
            }
        }
        let unindexed = (0..cfg.txs.len() as Tx).any(|tx| self.unindexed(tx));
        if unindexed && cfg.switches.revisit_unclean_prepares && cfg.budget.loss > 0 {
            p.push(Property::<Self>::sometimes(
                "sometimes an abort with an unclean prepare leaves its record ABORTING for the sweeper",
                seen::<{ Event::UncleanAbortLeftOpen as u32 }>,
            ));
        }
        if cfg.answer_on_decision {
            p.push(Property::<Self>::sometimes(
                "sometimes a POST is answered 202 COMMITTING on its commit decision",
                seen::<{ Event::AnsweredOnDecision as u32 }>,
            ));
            if cfg.budget.crash > 0 {
                p.push(Property::<Self>::sometimes(
                    "sometimes a coordinator answered on its decision crashes before the end, which others finish",
                    seen::<{ Event::CrashedAfterEarlyAnswer as u32 }>,
                ));
            }
        }
        if cfg.txs.iter().any(|t| t.held) {
            let routes = |r: config::Route| cfg.routes.iter().any(|&(_, x)| x == r);
            if routes(config::Route::Commit) {
                p.push(Property::<Self>::sometimes(
                    "sometimes a held transaction is committed by its caller",
                    seen::<{ Event::HeldCommitted as u32 }>,
                ));
                p.push(Property::<Self>::sometimes(
                    "sometimes a commit and the expiry race and the expiry wins (the commit route past holdUntil \
                     writes the abort)",
                    seen::<{ Event::CommitRouteExpired as u32 }>,
                ));
                p.push(Property::<Self>::sometimes(
                    "sometimes a commit and the expiry race and the commit wins (a resolver past holdUntil + 2M \
                     rolls the caller's commit forward)",
                    seen::<{ Event::CommitBeatExpiry as u32 }>,
                ));
            }
            if routes(config::Route::Abort) {
                p.push(Property::<Self>::sometimes(
                    "sometimes a held transaction is aborted by its caller",
                    seen::<{ Event::HeldAborted as u32 }>,
                ));
                p.push(Property::<Self>::sometimes(
                    "sometimes the caller's abort comes before the hold is recorded",
                    seen::<{ Event::AbortBeforeHold as u32 }>,
                ));
            }
            p.push(Property::<Self>::sometimes(
                "sometimes a hold expires and a resolver or the sweeper aborts it",
                seen::<{ Event::HoldExpired as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes a prepare meets a held transaction's lock and is refused CONFLICT",
                seen::<{ Event::HeldLockRefused as u32 }>,
            ));
            if sw.held_undecided && sw.resolver_extends_hold {
                p.push(Property::<Self>::sometimes(
                    "sometimes a prepare finds a lock its hold message did not extend expired, its owner held, and \
                     moves it to holdUntil",
                    seen::<{ Event::PrepareMovesHeldLock as u32 }>,
                ));
                p.push(Property::<Self>::sometimes(
                    "sometimes the sweeper finds a lock its hold message did not extend expired, its owner held, and \
                     sends the hold it missed",
                    seen::<{ Event::SweeperMovesHeldLock as u32 }>,
                ));
            } else if sw.held_undecided {
                p.push(Property::<Self>::sometimes(
                    "sometimes a lock its hold message did not extend is found expired and left to its owner",
                    seen::<{ Event::UndecidedHeldLock as u32 }>,
                ));
            }
        }
        let judged = self.has_op(|k| matches!(k, config::OpKind::Ruled { .. } | config::OpKind::Custom { .. }));
        if judged && sw.rule_version_condition {
            p.push(Property::<Self>::sometimes(
                "sometimes a judged write finds the item changed since it was judged, and judges it again",
                seen::<{ Event::Rejudged as u32 }>,
            ));
        }
        if self.has_op(|k| matches!(k, config::OpKind::Ruled { .. })) {
            p.push(Property::<Self>::sometimes("sometimes every transaction a rule judged commits", |m, s| {
                (0..m.cfg.txs.len()).all(|tx| s.status(tx as Tx) == Some(Status::Committed))
            }));
        }
        if self.has_op(|k| matches!(k, config::OpKind::Custom { .. })) {
            p.push(Property::<Self>::sometimes(
                "sometimes a service's own operation refuses the item as read",
                seen::<{ Event::CustomRefused as u32 }>,
            ));
            if cfg.redeploy {
                p.push(Property::<Self>::sometimes(
                    "sometimes a commit after a redeploy applies what its prepare computed before it",
                    seen::<{ Event::PendingAfterRedeploy as u32 }>,
                ));
            }
        }
        if cfg.resource.is_some() {
            p.push(Property::<Self>::sometimes(
                "sometimes a reservation is confirmed",
                seen::<{ Event::ResourceConfirmed as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes a reservation is voided",
                seen::<{ Event::ResourceVoided as u32 }>,
            ));
            p.push(Property::<Self>::sometimes("sometimes a declined card aborts the transaction", |m, s| {
                (0..m.cfg.txs.len() as Tx)
                    .any(|tx| s.res[tx as usize] == Res::Declined && s.status(tx) == Some(Status::Aborted))
            }));
            if sw.barrier && (b.loss > 0 || b.dup > 0 || b.crash > 0) {
                p.push(Property::<Self>::sometimes(
                    "sometimes an abort finds no entry and writes it CANCELLED (empty rollback)",
                    seen::<{ Event::EmptyRollback as u32 }>,
                ));
            }
            if sw.barrier && b.dup > 0 {
                p.push(Property::<Self>::sometimes(
                    "sometimes a prepare finds its entry cancelled and sends no try",
                    seen::<{ Event::TryAfterCancel as u32 }>,
                ));
            }
            p.push(Property::<Self>::sometimes(
                "sometimes a try request lands after its transaction was decided abort or cancelled",
                seen::<{ Event::TryLandedLate as u32 }>,
            ));
            if sw.barrier {
                p.push(Property::<Self>::sometimes(
                    "sometimes a try's TRIED write finds the entry cancelled while the try ran",
                    seen::<{ Event::TriedAfterCancel as u32 }>,
                ));
                p.push(Property::<Self>::sometimes(
                    "sometimes an abort that read TRYING cancels an entry that became TRIED",
                    seen::<{ Event::CancelMissedTried as u32 }>,
                ));
            }
            if sw.barrier && sw.recheck {
                p.push(Property::<Self>::sometimes(
                    "sometimes a recheck voids a reservation still held",
                    seen::<{ Event::RecheckReleased as u32 }>,
                ));
            }
            if b.dup > 0 || b.loss > 0 {
                p.push(Property::<Self>::sometimes(
                    "sometimes a repeated try request gets the stored first answer",
                    seen::<{ Event::TryAnsweredFromStore as u32 }>,
                ));
            }
        }
        p
    }

    /// `sometimes` properties: each thing the safety properties are about does happen.
    fn sanity_checks(&self) -> Vec<Property<Self>> {
        let cfg = &self.cfg;
        let b = cfg.budget;
        let sw = cfg.switches;
        let keyed = cfg.txs.iter().any(|t| t.keyed && t.executions > 1);
        let one_phase = cfg.txs.iter().any(|t| t.one_phase());
        let read_only = cfg.txs.iter().any(|t| t.parts.iter().any(|p| p.read_only()));
        let unkeyed_2pc = cfg.txs.iter().any(|t| !t.keyed && !t.one_phase());
        let keyed_2pc = cfg.txs.iter().any(|t| t.keyed && !t.one_phase());
        // Two transactions with an operation on the same item (one may meet the other's lock).
        let shared = cfg.items.iter().enumerate().any(|(i, _)| {
            cfg.txs.iter().filter(|t| t.parts.iter().flat_map(|p| &p.ops).any(|o| o.item as usize == i)).count() >= 2
        });
        let mut p = vec![Property::<Self>::sometimes("sometimes both commit", |_, s| {
            s.records.iter().all(|r| r.as_ref().is_some_and(|r| r.status == Status::Committed))
        })];
        if cfg.txs.len() >= 2 {
            p.push(Property::<Self>::sometimes("sometimes one commits and the other aborts", |_, s| {
                s.records.iter().flatten().any(|r| r.status == Status::Committed)
                    && s.records.iter().flatten().any(|r| r.status == Status::Aborted)
            }));
        }
        if b.crash > 0 || b.loss > 0 || cfg.sweeper_races_coordinators {
            p.push(Property::<Self>::sometimes(
                "sometimes the sweeper finishes a transaction",
                seen::<{ Event::SweeperFinished as u32 }>,
            ));
        }
        if unkeyed_2pc {
            p.push(Property::<Self>::sometimes(
                "sometimes an expired lock's owner is recorded ABORTED",
                seen::<{ Event::ResolutionRecordedAbort as u32 }>,
            ));
        }
        if b.dup > 0 {
            p.push(Property::<Self>::sometimes(
                "sometimes a copy arrives after its transaction ended",
                seen::<{ Event::LateDelivery as u32 }>,
            ));
        }
        if b.dup > 0 && b.total >= 2 {
            p.push(Property::<Self>::sometimes(
                "sometimes a late copy takes a stray lock",
                seen::<{ Event::StrayLock as u32 }>,
            ));
        }
        // Issue 35: a prepare meets a live lock whose owner is decided (its second phase not landed yet, or a
        // late copy's stray lock) and settles it at once.
        if shared && b.total >= 2 {
            p.push(Property::<Self>::sometimes(
                "sometimes a prepare settles a live lock of a decided owner at once",
                seen::<{ Event::DecidedOwnerResolved as u32 }>,
            ));
        }
        // A prepare meets another transaction's expired lock (of an owner decided commit).
        if (b.crash > 0 || b.loss > 0) && shared {
            p.push(Property::<Self>::sometimes(
                "sometimes an expired lock is rolled forward",
                seen::<{ Event::RolledForward as u32 }>,
            ));
        }
        // The lock pass finds a lock of a COMMITTING owner: one whose commit was lost, or one the run's
        // bounded read (K = 1) of open transactions did not reach (two two-phase transactions), in a run
        // that another transaction's stray lock started before the owner's record was due: a late copy's,
        // one left by a loss, or (before issue 28's cutoff) one a prepare's retry wrote after the deadline.
        let two_phase_txs = cfg.txs.iter().filter(|t| !t.one_phase()).count();
        let stray_locks = b.dup > 0 || b.loss > 0 || cfg.sweeper_races_coordinators || !sw.lock_cutoff;
        // Issue 48: the sweeper's lock pass sees only indexed locks (`unindexed_recorded_locks`).
        let indexed_2pc = (0..cfg.txs.len()).any(|t| !cfg.txs[t].one_phase() && !self.unindexed(t as Tx));
        if b.crash > 0 && (two_phase_txs >= 2 && stray_locks || b.loss > 0) && indexed_2pc {
            p.push(Property::<Self>::sometimes(
                "sometimes the sweeper rolls a lock forward",
                seen::<{ Event::SweeperRollForward as u32 }>,
            ));
        }
        if b.loss > 0 && b.crash > 0 && b.total >= 2 {
            p.push(Property::<Self>::sometimes(
                "sometimes the sweeper pushes sweepAt back",
                seen::<{ Event::SweepAtPushed as u32 }>,
            ));
        }
        if b.db_reply > 0 {
            p.push(Property::<Self>::sometimes(
                "sometimes a lost reply's retry finds the writer's own write",
                seen::<{ Event::OwnWriteRecognised as u32 }>,
            ));
        }
        if b.refused > 0 && sw.release_on_refused_decision {
            p.push(Property::<Self>::sometimes(
                "sometimes a refused decision releases the locks",
                seen::<{ Event::RefusedDecisionReleased as u32 }>,
            ));
        }
        let fixed_fence = sw.release_on_refused_decision && sw.refusal_after_unknown_is_unknown;
        // A decision fails: refused (4xx), or refused for size (a keyed one).
        let decision_fails = b.refused > 0 || b.oversized > 0 && keyed_2pc;
        if fixed_fence && decision_fails && b.db_reply > 0 && b.total >= 2 {
            p.push(Property::<Self>::sometimes(
                "sometimes a fence takes effect with its reply lost",
                seen::<{ Event::FenceLostReply as u32 }>,
            ));
        }
        if fixed_fence && b.refused > 0 && b.db_reply > 0 && b.total >= 2 {
            p.push(Property::<Self>::sometimes(
                "sometimes a fence finds the decision it fences written after all",
                seen::<{ Event::FenceFoundDecision as u32 }>,
            ));
        }
        if fixed_fence && (b.refused >= 2 || b.refused > 0 && b.oversized > 0 && keyed_2pc) && b.total >= 2 {
            p.push(Property::<Self>::sometimes(
                "sometimes a fence is refused too and the locks are released (unrecorded decision)",
                seen::<{ Event::UnrecordedReleased as u32 }>,
            ));
        }
        if fixed_fence && b.refused >= 2 && b.db_reply > 0 && b.total >= 3 {
            p.push(Property::<Self>::sometimes(
                "sometimes an unrecorded decision of unknown outcome releases nothing",
                seen::<{ Event::UnknownLeftToRecovery as u32 }>,
            ));
        }
        // The sweeper postpones an entry whose drive a participant did not acknowledge (a loss): one
        // its coordinator left open by crashing, or one it drives while the coordinator still runs.
        let postpones = b.loss > 0 && (b.crash > 0 || cfg.sweeper_races_coordinators);
        let to_postpone = if cfg.sweeper_races_coordinators { 1 } else { 2 };
        if postpones && b.refused > 0 && b.total > to_postpone {
            p.push(Property::<Self>::sometimes(
                "sometimes a postponement is refused",
                seen::<{ Event::PostponeRefused as u32 }>,
            ));
        }
        if postpones && b.db_reply > 0 && b.total > to_postpone {
            p.push(Property::<Self>::sometimes(
                "sometimes a postponement takes effect with its reply lost",
                seen::<{ Event::PostponeLostReply as u32 }>,
            ));
        }
        if b.oversized > 0 && sw.shortened_writes {
            p.push(Property::<Self>::sometimes(
                "sometimes a write refused for size is written shortened",
                seen::<{ Event::ShortenedWrite as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes a record refused for size still ends",
                seen::<{ Event::OversizedEnded as u32 }>,
            ));
            if postpones && b.total > to_postpone {
                p.push(Property::<Self>::sometimes(
                    "sometimes a shortened postponement moves an entry back",
                    seen::<{ Event::ShortenedPostpone as u32 }>,
                ));
            }
        }
        if b.oversized > 0 && sw.shortened_writes && keyed_2pc && fixed_fence {
            p.push(Property::<Self>::sometimes(
                "sometimes a decision refused for size falls back to the fence",
                seen::<{ Event::SizeRefusedDecisionFenced as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes the fence is written shortened",
                seen::<{ Event::FenceShortened as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes a commit decision is written shortened",
                seen::<{ Event::ShortenedCommit as u32 }>,
            ));
        }
        // Issue 48: a prepare of an attempt with unindexed locks is never copied (`recorded_prepares_sent_once`).
        let copied_prepares = (0..cfg.txs.len()).any(|t| {
            let sent_once = self.unindexed(t as Tx) && sw.recorded_prepares_sent_once;
            !cfg.txs[t].one_phase() && !sent_once
        });
        if b.dup > 0 && sw.token_check && one_phase && (b.loss > 0 || b.crash > 0) && b.total >= 2 && copied_prepares {
            p.push(Property::<Self>::sometimes(
                "sometimes a commit releases a stray lock",
                seen::<{ Event::StrayReleased as u32 }>,
            ));
        }
        if keyed {
            p.push(Property::<Self>::sometimes(
                "sometimes a retried key answers 503 while the transaction is undecided",
                seen::<{ Event::RetryUndecided as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes a retried key answers 202 or 409 for a decided transaction not finished yet",
                seen::<{ Event::RetryDecidedUnfinished as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes a retried key replays the first execution",
                seen::<{ Event::ReplayAnswered as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes lock resolution aborts a PREPARING owner",
                seen::<{ Event::ResolutionAbortedPreparing as u32 }>,
            ));
        }
        if !sw.lock_cutoff && two_phase_txs >= 2 {
            p.push(Property::<Self>::sometimes(
                "sometimes (old check) a lock is written once every participant is past its cutoff",
                seen::<{ Event::LockPastCutoff as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes (old check) a prepare is refused as late while its coordinator could still commit",
                seen::<{ Event::RefusedOnTime as u32 }>,
            ));
        }
        if cfg.margin && sw.lock_cutoff {
            p.push(Property::<Self>::sometimes(
                "sometimes a participant's cutoff check in the margin refuses TIMEOUT",
                seen::<{ Event::RefusedInMargin as u32 }>,
            ));
        }
        if cfg.margin && two_phase_txs > 0 {
            p.push(Property::<Self>::sometimes(
                "sometimes a lock is written in the margin (past the deadline, before the cutoff)",
                seen::<{ Event::LockInMargin as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes a lock written in the margin is later released or applied",
                seen::<{ Event::MarginLockEnded as u32 }>,
            ));
        }
        if cfg.margin && sw.resolver_margin && (two_phase_txs >= 2 || keyed || b.crash > 0 || b.loss > 0) {
            p.push(Property::<Self>::sometimes(
                "sometimes a resolver's check in the margin reads past expiry + 2M and it acts",
                seen::<{ Event::ResolvedInMargin as u32 }>,
            ));
        }
        if one_phase {
            p.push(Property::<Self>::sometimes(
                "sometimes a one-phase commit applies",
                seen::<{ Event::OnePhaseCommitted as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes a one-phase commit finds its record",
                seen::<{ Event::OnePhaseRecordExists as u32 }>,
            ));
        }
        if !one_phase && !read_only && (shared || cfg.sweeper_races_coordinators) {
            p.push(Property::<Self>::sometimes(
                "sometimes a commit loses to lock resolution",
                seen::<{ Event::CommitLostToResolution as u32 }>,
            ));
        }
        if read_only {
            p.push(Property::<Self>::sometimes(
                "sometimes the transaction with a check-only participant commits",
                |m, s| {
                    (0..m.cfg.txs.len()).any(|tx| {
                        m.cfg.txs[tx].parts.iter().any(|p| p.read_only())
                            && s.status(tx as Tx) == Some(Status::Committed)
                    })
                },
            ));
        }
        p.extend(self.feature_sanity_checks());
        p
    }
}
