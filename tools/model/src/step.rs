//! The transition relation: every action of the model, each one atomic step of the code.
//!
//! Granularity: one DynamoDB conditional write (or one consistent read) is one atomic step, with
//! the same condition as the code's. Purely local work next to it (sending the messages a step
//! decides, reading the clock right before a write whose outcome only the writer sees) is folded
//! into that step: no other process can observe the difference. A write "with its reply lost"
//! ([`Fault::LostReply`]) takes effect, then the writer's next step is the SDK's retry of the same
//! request (same condition, same values, e.g. the same lock token), and the writer acts on the
//! retry's answer.
//!
//! A write refused for size ([`Fault::Oversized`], or any later write that would make the same record
//! larger) changes nothing; record/store.rs then reads the record and, if it is still in the status the
//! write expected, writes the shortened form under the same condition. The refusal, the read and the
//! shortened write are one step: nothing another process does in between can be told apart from it
//! happening before the step. DynamoDB is taken to evaluate a write's condition before its size: a
//! write whose condition fails is answered as such. (The code answers both the same way: after a
//! refusal for size it reads the record and, finding another status, follows it.)

use crate::config::{ItemId, Op, OpKind, Svc, Tx};
use crate::state::*;
use crate::{Event, TwoPc, Violation};

mod judged;
mod resource;

/// A fault that may come with a step: a DynamoDB write that takes effect but whose reply is lost, a
/// write DynamoDB refuses (4xx, not applied), or the first write of a record refused for its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    None,
    LostReply,
    Refused,
    /// A write that would make its record larger is refused as invalid (`ValidationException`: the
    /// record would pass 400 KB), and so is every later such write of that record
    /// ([`Record::oversized`]). `commit_fits`: a commit decision's shortened form (its votes with
    /// their lock tokens, without the free text) still fits; else it is refused too.
    Oversized {
        commit_fits: bool,
    },
    /// The participant's answer is lost on its way back (the caller keeps waiting: a re-sent copy
    /// may answer it, else it times out).
    DropReply,
}

/// How the clock checks of one step read in the margin: bit k set = the k-th check of this step that
/// may read either way ([`Reading::Either`]) reads past its line (a participant past its lock cutoff,
/// `deadline + M`; a resolver past `expiry + 2M`); clear = before it. Checks that the phase decides take
/// no bit. Printed `-` when no check reads past.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Late(pub u8);

impl std::fmt::Debug for Late {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 == 0 { write!(f, "-") } else { write!(f, "late:{:b}", self.0) }
    }
}

/// What a process's clock check may read, given the phase of the coordinator's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reading {
    /// Before the line, whatever the skew.
    Before,
    /// Either way: the skew decides (the step's [`Late`] bit).
    Either,
    /// Past the line, whatever the skew.
    Past,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The coordinator's clock passes the next line of a transaction's deadline D: D itself (the margin
    /// begins: the coordinator decides abort, each participant's and resolver's check may read either
    /// way), then D + 3M (every clock past every line). Without the margin (`Config::margin` off): D for
    /// every clock at once.
    Deadline(Tx),
    /// Issue 32: the clocks pass the next line of a held transaction's `holdUntil` H: H by some coordinator's
    /// clock (its commit route's check may read either way), then every coordinator's (a resolver's check of
    /// H + 2M may read either way), then H + 2M by every clock. Without the margin: all at once.
    HoldExpiry(Tx),
    /// A coordinator execution crashes: it writes nothing more and never answers.
    Crash(u8),
    /// The network delivers a second copy of a request (the SDK re-sends a timed-out Invoke).
    Duplicate(u8),
    /// The network loses a request or an answer.
    Lose(u8),
    /// A message in flight arrives: a request starts a participant handler (its first step runs at
    /// once), an answer reaches the coordinator or sweeper that waits for it.
    Deliver(u8, Fault, Late),
    /// A participant handler's next step.
    Task(u8, Fault, Late),
    /// Wait-die: a waiting (older) prepare's wait budget runs out: REFUSED CONFLICT.
    TaskGiveUp(u8),
    /// A coordinator execution's next step (for a not yet started execution: the client sends it).
    Coord(u8, Fault, Late),
    /// An actor stops waiting for an invocation: free when it can no longer be answered (lost) or
    /// the transaction's deadline passed (prepares), else a timeout fault (the message may still be
    /// delivered later).
    GiveUp(Dest),
    /// The sweeper's next step (when idle and there is work: a scheduled run starts).
    Sweep(Fault, Late),
    /// A retried key's answer budget (27 s, which the model cannot measure) runs out: it stops waiting
    /// or driving and answers what the record said (`replay` → `Reply::answering`).
    Budget(u8),
    /// Issue 30: a service is redeployed with another version of its own operation (`balance - 2q`).
    Redeploy(Svc),
    /// Issue 31: a try request lands at the resource, which does the try under its key the first time and
    /// answers any repeat with the stored first answer; the answer reaches the prepare waiting for it (the
    /// fault: it is lost on its way back).
    TryLand(u8, Fault),
    /// Issue 31: the network delivers a second copy of a try request.
    TryDup(u8),
    /// Issue 31: the network loses a try request (it never lands).
    TryLose(u8),
    /// Issue 42, with `participants_cannot_write_records` off: a participant's operator writes COMMITTING
    /// over the record of a transaction its service takes part in (held, aborting or aborted), straight to
    /// the table, as the participant roles' grants before the fix allowed.
    ForgeCommit(Tx),
    /// Issue 31: a resource prepare stops waiting for its try's answer: at its cutoff (its call's timeout:
    /// it refuses UNAVAILABLE, the entry stays TRYING), or before it on a timeout (a fault while the
    /// request is still in flight: it may land later) or once no answer can come, and sends the try again.
    TryTimeout(u8, Late),
}

/// Per-step context: the fault the action brings, whether a write used it, and a log for traces.
pub(crate) struct Ctx {
    fault: Fault,
    used: bool,
    /// The step's [`Late`] bits, and how many checks that read either way it made.
    late: u8,
    checks: u8,
    /// The step does not happen after all (a retried key that keeps waiting).
    void: bool,
    pub log: Option<Vec<String>>,
}

impl Ctx {
    /// A clock check: whether this process's clock reads past its line. In the margin, the step's next
    /// [`Late`] bit says.
    fn reads_past(&mut self, r: Reading, what: impl FnOnce() -> String) -> bool {
        match r {
            Reading::Before => false,
            Reading::Past => true,
            Reading::Either => {
                let past = self.late & (1 << self.checks) != 0;
                self.checks += 1;
                self.note(|| format!("  (the skew decides: {}? {})", what(), if past { "yes" } else { "no" }));
                past
            }
        }
    }

    /// At a write that takes effect: is its reply lost?
    fn lost_reply(&mut self, s: &mut State) -> bool {
        if self.fault == Fault::LostReply && !self.used {
            self.used = true;
            s.budget.db_reply -= 1;
            s.budget.total -= 1;
            self.note(|| "  (DynamoDB applied the write; its reply is lost: the SDK retries)".into());
            true
        } else {
            false
        }
    }

    /// At a decision write: does DynamoDB refuse it (4xx, not applied)?
    fn refused(&mut self, s: &mut State) -> bool {
        if self.fault == Fault::Refused && !self.used {
            self.used = true;
            s.budget.refused -= 1;
            s.budget.total -= 1;
            self.note(|| "  (DynamoDB refuses the write: 4xx, not applied)".into());
            true
        } else {
            false
        }
    }

    /// At a write that would make `tx`'s record larger (its condition holds): does DynamoDB refuse it
    /// as invalid? Always once the record was refused so; else when this step brings the fault, which
    /// marks the record for ever.
    fn for_size(&mut self, s: &mut State, tx: Tx) -> bool {
        let rec = s.records[tx as usize].as_mut().expect("a growing write needs a record");
        if rec.oversized {
            self.note(|| "  (DynamoDB refuses the write as invalid: the record would pass 400 KB)".into());
            return true;
        }
        if matches!(self.fault, Fault::Oversized { .. }) && !self.used {
            self.used = true;
            rec.oversized = true;
            s.budget.oversized -= 1;
            s.budget.total -= 1;
            self.note(|| {
                "  (DynamoDB refuses the write as invalid: the record would pass 400 KB; it refuses every write that \
                 makes this record larger from now on)"
                    .into()
            });
            return true;
        }
        false
    }

    /// After [`Ctx::for_size`] refused a commit decision: does its shortened form fit?
    fn commit_fits(&self) -> bool {
        self.fault == (Fault::Oversized { commit_fits: true }) && self.used
    }

    /// At a participant's answer: is it lost on the way back?
    fn drop_reply(&mut self, s: &mut State) -> bool {
        if self.fault == Fault::DropReply && !self.used {
            self.used = true;
            s.budget.loss -= 1;
            s.budget.total -= 1;
            self.note(|| "  (the answer is lost on its way back)".into());
            true
        } else {
            false
        }
    }

    fn note(&mut self, f: impl FnOnce() -> String) {
        if let Some(log) = &mut self.log {
            log.push(f());
        }
    }
}

fn bit(tx: Tx) -> u8 {
    1 << tx
}

fn guard(op: &Op, item: &Item) -> bool {
    match op.kind {
        OpKind::Add { delta, min } => min.is_none_or(|m| item.balance + delta >= m),
        // A rule and a service's own operation are judged on the item as read (`judge`), not in the write.
        OpKind::Check | OpKind::Ruled { .. } | OpKind::Custom { .. } | OpKind::Charge => true,
    }
}

/// The owner's fate as lock resolution reads it from its record (recovery.rs `owner_fate`/`decide`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// No record: create it ABORTED (`abort_if_absent`).
    Absent,
    /// PREPARING, or PREPARED past `holdUntil + 2M` (issue 32): `from` → ABORTING. (recovery.rs `decide`
    /// answers Undecided for a PREPARING owner until `deadline + 2M` by the resolver's clock; every resolver
    /// reads the owner's record only after it found its lock (expiring at that same deadline) or its record
    /// resolvable by the same, monotone, clock, so the model never meets Undecided for PREPARING.)
    Transition(Status),
    /// Issue 32: PREPARED, the resolver's clock at or before `holdUntil + 2M` (its lock expires at the
    /// deadline when no hold message extended it): the lock stands (a prepare is refused CONFLICT, the sweeper
    /// leaves it). With `resolver_extends_hold` (the fix), only before it: [`Fate::Held`] now.
    Undecided,
    /// Issue 32 (`OwnerFate::Held`): PREPARED within its hold: the lock stands, and belongs at `holdUntil`
    /// (its hold message may have been lost): moved there with the lockToken the record lists for this
    /// service (a prepare's `extend_lock`, the sweeper's hold message).
    Held(u8),
    /// COMMITTING: roll forward with the lockToken the record lists for this service.
    Commit(u8),
    /// COMMITTED (a lock left is a late copy's), ABORTING, ABORTED: release.
    Release,
}

impl TwoPc {
    /// Applies an action; `None` when it does not apply (a fault the step cannot use).
    pub(crate) fn apply(&self, s0: &State, action: Action, log: bool) -> Option<(State, Vec<String>)> {
        let mut s = s0.clone();
        let (fault, late) = match action {
            Action::Deliver(_, f, l) | Action::Task(_, f, l) | Action::Coord(_, f, l) | Action::Sweep(f, l) => (f, l.0),
            Action::TryLand(_, f) => (f, 0),
            Action::TryTimeout(_, l) => (Fault::None, l.0),
            _ => (Fault::None, 0),
        };
        let mut ctx = Ctx { fault, used: false, late, checks: 0, void: false, log: log.then(Vec::new) };
        match action {
            Action::HoldExpiry(tx) => {
                let next = if self.cfg.margin { s.hold_phase(tx) + 1 } else { phase::PAST };
                s.set_hold_phase(tx, next);
                self.progress(&mut s);
                ctx.note(|| match (self.cfg.margin, next) {
                    (false, _) => format!("{}'s hold expires (holdUntil passes for every clock)", self.tx_name(tx)),
                    (_, phase::CUTOFF) => {
                        format!("{}'s holdUntil passes by some coordinator's clock", self.tx_name(tx))
                    }
                    (_, phase::RESOLVABLE) => format!(
                        "{}: every coordinator's clock past holdUntil; resolvers' clocks near holdUntil + 2M",
                        self.tx_name(tx)
                    ),
                    _ => format!("{}: every clock past holdUntil + 2M", self.tx_name(tx)),
                });
                // The hold expiring is a reason to abort a transaction still held.
                if s.status(tx) == Some(Status::Prepared) {
                    s.ghost.reason |= bit(tx);
                }
            }
            Action::Deadline(tx) => {
                let next = if self.cfg.margin { s.phase(tx) + 1 } else { phase::PAST };
                s.set_phase(tx, next);
                self.progress(&mut s);
                ctx.note(|| match (self.cfg.margin, next) {
                    (false, _) => format!("{}'s deadline passes", self.tx_name(tx)),
                    (_, phase::CUTOFF) => {
                        format!(
                            "{}'s deadline passes by its coordinator's clock: participants' cutoffs near",
                            self.tx_name(tx)
                        )
                    }
                    (_, phase::RESOLVABLE) => format!(
                        "{}: every participant's clock past deadline + M; resolvers' clocks near deadline + 2M",
                        self.tx_name(tx)
                    ),
                    _ => format!("{}: every clock past deadline + 2M", self.tx_name(tx)),
                });
                let deciding = self.execs_of(tx).any(|ci| matches!(s.coords[ci as usize].pc, p if in_progress(p)));
                if deciding {
                    s.ghost.reason |= bit(tx);
                }
            }
            Action::Budget(ci) => {
                ctx.note(|| format!("{}: the answer budget runs out", self.coord_name(ci)));
                self.budget_spent(&mut s, ci, &mut ctx);
            }
            Action::ForgeCommit(tx) => {
                s.forged = true;
                ctx.note(|| {
                    format!(
                        "a participant's operator writes {}'s record as COMMITTING, straight to the table",
                        self.tx_name(tx)
                    )
                });
                self.set_status(&mut s, tx, Status::Committing, None, &mut ctx);
            }
            Action::Redeploy(svc) => {
                s.deployed |= 1 << svc;
                self.event(&mut s, Event::Redeployed);
                ctx.note(|| {
                    format!("{} is redeployed: its operation now computes stock - 2q", self.cfg.services[svc as usize])
                });
            }
            Action::TryLand(i, _) => {
                let m = s.rnet.remove(i as usize);
                ctx.note(|| format!("a try request of {} lands at the resource", self.tx_name(m.tx)));
                self.try_land(&mut s, m, &mut ctx);
            }
            Action::TryDup(i) => {
                let m = s.rnet[i as usize];
                s.budget.dup -= 1;
                s.budget.total -= 1;
                self.progress(&mut s);
                ctx.note(|| format!("network duplicates a try request of {}", self.tx_name(m.tx)));
                s.rnet.push(m);
            }
            Action::TryLose(i) => {
                let m = s.rnet.remove(i as usize);
                s.budget.loss -= 1;
                s.budget.total -= 1;
                self.progress(&mut s);
                ctx.note(|| format!("network loses a try request of {}", self.tx_name(m.tx)));
            }
            Action::TryTimeout(i, _) => {
                let t = s.tasks.remove(i as usize);
                ctx.note(|| format!("{}: waiting for the try's answer", self.task_name(&t)));
                self.try_timeout(&mut s, t, &mut ctx);
            }
            Action::Crash(ci) => {
                s.budget.crash -= 1;
                s.budget.total -= 1;
                let tx = self.execs[ci as usize].0;
                s.ghost.reason |= bit(tx);
                ctx.note(|| format!("{} crashes", self.coord_name(ci)));
                if s.coords[ci as usize].answer.is_some() {
                    self.event(&mut s, Event::CrashedAfterEarlyAnswer);
                }
                self.answer(&mut s, ci, Answer::Crashed, &mut ctx);
            }
            Action::Duplicate(i) => {
                let m = s.net[i as usize];
                let Msg { to, req, reply } = m;
                s.budget.dup -= 1;
                s.budget.total -= 1;
                self.progress(&mut s);
                let req = match req {
                    Req::Prepare { tx, exec, copy } => Req::Prepare { tx, exec, copy: copy + 1 },
                    Req::OnePhase { tx, exec, copy } => Req::OnePhase { tx, exec, copy: copy + 1 },
                    other => other,
                };
                ctx.note(|| format!("network duplicates {}", self.msg_name(&m)));
                s.net.push(Msg { to, req, reply });
            }
            Action::Lose(i) => {
                let m = s.net.remove(i as usize);
                s.budget.loss -= 1;
                s.budget.total -= 1;
                self.progress(&mut s);
                ctx.note(|| format!("network loses {}", self.msg_name(&m)));
                s.ghost.reason |= bit(m.req.tx());
            }
            Action::Deliver(i, ..) => {
                let m = s.net.remove(i as usize);
                ctx.note(|| format!("deliver {}", self.msg_name(&m)));
                self.deliver_req(&mut s, m.to, m.req, m.reply, &mut ctx);
            }
            Action::Task(i, ..) => {
                let t = s.tasks.remove(i as usize);
                ctx.note(|| format!("{}: {:?}", self.task_name(&t), t.pc));
                let t = match t.pc {
                    // Woken: the lock it waited for changed or expired; retry at once.
                    TPc::Wait { .. } => Task { pc: self.resume_pc(&t), retrying: false, ..t },
                    _ => t,
                };
                self.task_step(&mut s, t, &mut ctx);
            }
            Action::TaskGiveUp(i) => {
                let t = s.tasks.remove(i as usize);
                ctx.note(|| format!("{}: wait budget spent", self.task_name(&t)));
                self.refuse(&mut s, t, &mut ctx);
            }
            Action::Coord(ci, ..) => {
                ctx.note(|| format!("{}: {:?}", self.coord_name(ci), s.coords[ci as usize].pc));
                self.coord_step(&mut s, ci, &mut ctx);
            }
            Action::GiveUp(dest) => {
                if self.live(&s, dest) && !self.free_give_up(&s, dest) {
                    s.budget.loss -= 1;
                    s.budget.total -= 1;
                    if dest.actor != SWEEPER {
                        s.ghost.reason |= bit(self.execs[dest.actor as usize].0);
                    }
                    ctx.note(|| {
                        format!("{} times out waiting on {}", self.actor_name(dest.actor), self.slot_name(&s, dest))
                    });
                } else {
                    ctx.note(|| {
                        format!("{} stops waiting on {}", self.actor_name(dest.actor), self.slot_name(&s, dest))
                    });
                }
                self.progress(&mut s);
                self.deliver_rep(&mut s, dest, None, &mut ctx);
            }
            Action::Sweep(..) => {
                ctx.note(|| format!("sweeper: {:?}", s.sweeper.pc));
                self.sweep_step(&mut s, &mut ctx);
            }
        }
        if ctx.fault != Fault::None && !ctx.used || ctx.late >> ctx.checks != 0 || ctx.void {
            return None;
        }
        self.normalize(&mut s);
        Some((s, ctx.log.unwrap_or_default()))
    }

    // ----- helpers -----------------------------------------------------------------------------

    /// The service an invocation slot talks to, for traces.
    fn slot_name(&self, s: &State, d: Dest) -> String {
        let tx = if d.actor == SWEEPER {
            match &s.sweeper.pc {
                SPc::DriveAwait { tx, .. } => Some(*tx),
                SPc::LockAwait { svc, .. } => return format!("{} (lock resolution)", self.cfg.services[*svc as usize]),
                _ => None,
            }
        } else {
            Some(self.execs[d.actor as usize].0)
        };
        match tx {
            Some(tx) => self.cfg.services[self.svc_of(tx, d.slot as usize) as usize].to_owned(),
            None => format!("slot {}", d.slot),
        }
    }

    /// Canonical form: the multisets sorted, and what can no longer matter forgotten, so that states
    /// that differ only in it are one state.
    fn normalize(&self, s: &mut State) {
        // Where a prepare of T may still lock: bit tx * 8 + svc.
        let mut may_lock = 0u32;
        for (tx, svc, req) in
            s.net.iter().map(|m| (m.req.tx(), m.to, m.req)).chain(s.tasks.iter().map(|t| (t.req.tx(), t.svc, t.req)))
        {
            if matches!(req, Req::Prepare { .. }) {
                may_lock |= 1 << (tx as u32 * 8 + svc as u32);
            }
        }
        // A copy nobody waits for, whose delivery can change nothing any more, is as good as lost:
        // a prepare or one-phase commit after its deadline (refused TIMEOUT); a commit or abort of T
        // where T holds no lock and can take none.
        let net = std::mem::take(&mut s.net);
        s.net = net
            .into_iter()
            .filter(|m| {
                if m.reply.is_some() {
                    return true;
                }
                let tx = m.req.tx();
                match m.req {
                    Req::Prepare { .. } | Req::OnePhase { .. } => s.phase(tx) < phase::RESOLVABLE,
                    Req::Commit { .. } | Req::Abort { .. } => self.may_hold(s, tx, m.to),
                    Req::Hold { token, .. } => self.extends(s, tx, m.to, token),
                }
            })
            .collect();
        s.net.sort_unstable();
        s.tasks.sort_unstable();
        // A try request nobody waits for, landing once its key was used, changes nothing (the stored answer).
        let res = std::mem::take(&mut s.res);
        s.rnet.retain(|m| m.from.is_some() || res[m.tx as usize] == Res::Unused);
        s.res = res;
        s.rnet.sort_unstable();
        // A reason to abort matters until the transaction is decided.
        s.ghost.reason |= s.ghost.decided_commit | s.ghost.decided_abort;
        // "This participant processed T's abort" matters while a prepare of T may still lock there.
        s.ghost.abort_processed &= may_lock;
        for c in &mut s.coords {
            if c.pc == CPc::Done {
                c.abort_unacked = 0;
                for v in c.votes.iter_mut() {
                    *v = Vote::Unknown;
                }
            }
        }
        // A deadline nothing can observe any more is as good as passed.
        for tx in 0..self.cfg.txs.len() as Tx {
            if s.phase(tx) != phase::PAST && self.deadline_unobservable(s, tx) {
                s.set_phase(tx, phase::PAST);
            }
            self.skip_unread_phases(s, tx);
            // Issue 32: a `holdUntil` nothing reads any more (decided, no lock extended to it, no hold message
            // that may still extend one) is as good as passed.
            if s.hold_phase(tx) != phase::PAST
                && s.status(tx).is_some_and(|st| st != Status::Preparing && st != Status::Prepared)
                && !self.hold_live(s, tx)
            {
                s.set_hold_phase(tx, phase::PAST);
            }
        }
        if s.sweeper.pc == SPc::Idle {
            s.sweeper.votes.clear();
            for x in s.sweeper.inv.iter_mut() {
                *x = Inv::Idle;
            }
            s.ghost.seen &= !Event::Progress.bit();
        }
        // A terminal record's votes and sweepAt are read by no one, and no write that would make it
        // larger is ever sent to it.
        for r in s.records.iter_mut().flatten() {
            if r.status.terminal() {
                r.votes = None;
                r.sweep_at = 0;
                r.oversized = false;
            }
        }
    }

    /// The executions of `tx`'s POST (not its route calls).
    pub(crate) fn execs_of(&self, tx: Tx) -> impl Iterator<Item = u8> + '_ {
        self.execs
            .iter()
            .enumerate()
            .filter(move |(i, (t, _))| *t == tx && self.route_of[*i].is_none())
            .map(|(i, _)| i as u8)
    }

    /// Issue 32: whether `tx`'s `holdUntil` may still be read: its record is PREPARED, a lock of it was
    /// extended to it, or a hold message in flight may still extend one.
    pub(crate) fn hold_live(&self, s: &State, tx: Tx) -> bool {
        s.status(tx) == Some(Status::Prepared)
            || s.items.iter().any(|it| it.lock.is_some_and(|l| l.tx == tx && l.held))
            || s.net
                .iter()
                .any(|m| matches!(m.req, Req::Hold { tx: t, token } if t == tx && self.extends(s, tx, m.to, token)))
    }

    /// Issue 32: whether a hold message of `tx` with `token` to `svc` would extend a lock there.
    fn extends(&self, s: &State, tx: Tx, svc: Svc, token: u8) -> bool {
        s.items.iter().enumerate().any(|(i, it)| {
            self.cfg.items[i].svc == svc && it.lock.is_some_and(|l| l.tx == tx && l.token == token && !l.held)
        })
    }

    fn part_of(&self, tx: Tx, svc: Svc) -> usize {
        self.cfg.txs[tx as usize].part_of(svc).expect("the transaction has a part at this service")
    }

    fn ops(&self, tx: Tx, svc: Svc) -> &[Op] {
        &self.cfg.txs[tx as usize].parts[self.part_of(tx, svc)].ops
    }

    fn svc_of(&self, tx: Tx, part: usize) -> Svc {
        self.cfg.txs[tx as usize].parts[part].svc
    }

    fn nparts(&self, tx: Tx) -> usize {
        self.cfg.txs[tx as usize].parts.len()
    }

    fn voted_token(&self, s: &State, tx: Tx, svc: Svc) -> Option<u8> {
        let p = self.part_of(tx, svc);
        match s.record(tx)?.votes.as_ref()?.get(p) {
            Some(Vote::Prepared { token, .. }) => Some(*token),
            _ => None,
        }
    }

    /// Marks that something durable happened (for the sweeper's progress check).
    fn progress(&self, s: &mut State) {
        s.ghost.seen |= Event::Progress.bit();
    }

    fn event(&self, s: &mut State, e: Event) {
        s.ghost.seen |= e.bit();
    }

    fn violate(&self, s: &mut State, v: Violation, ctx: &mut Ctx) {
        s.ghost.violations |= v.bit();
        ctx.note(|| format!("  !! VIOLATION: {}", v.name()));
    }

    /// Ghost: an abort decision for `tx` is being made; it needs a reason (no self-abort).
    fn abort_decided(&self, s: &mut State, tx: Tx, ctx: &mut Ctx) {
        if s.ghost.reason & bit(tx) == 0 {
            self.violate(s, Violation::SelfAbort, ctx);
        }
        s.ghost.decided_abort |= bit(tx);
    }

    /// Writes a record (creation or conditional status change; the caller checked the condition).
    fn write_record(&self, s: &mut State, tx: Tx, rec: Record, ctx: &mut Ctx) {
        let old = s.status(tx);
        let legal = matches!(
            (old, rec.status),
            (None, _)
                | (Some(Status::Preparing), Status::Prepared | Status::Committing | Status::Aborting)
                | (Some(Status::Prepared), Status::Committing | Status::Aborting)
                | (Some(Status::Committing), Status::Committed)
                | (Some(Status::Aborting), Status::Aborted)
        );
        if !legal {
            self.violate(s, Violation::StatusBackwards, ctx);
        }
        if rec.status.commit() {
            s.ghost.decided_commit |= bit(tx);
        }
        if rec.status.abort() && !old.is_some_and(Status::abort) {
            self.abort_decided(s, tx, ctx);
        }
        if rec.oversized && rec.status.terminal() {
            self.event(s, Event::OversizedEnded);
        }
        ctx.note(|| format!("  record {} := {:?}", self.tx_name(tx), rec.status));
        s.records[tx as usize] = Some(rec);
        self.progress(s);
    }

    fn set_status(&self, s: &mut State, tx: Tx, status: Status, votes: Option<Vec<Vote>>, ctx: &mut Ctx) {
        let mut rec = s.records[tx as usize].clone().expect("a status change needs a record");
        rec.status = status;
        if votes.is_some() {
            rec.votes = votes;
        }
        self.write_record(s, tx, rec, ctx);
    }

    #[allow(clippy::too_many_arguments)]
    fn take_lock(&self, s: &mut State, item: ItemId, tx: Tx, svc: Svc, token: u8, pending: Option<i8>, ctx: &mut Ctx) {
        let late = s.ghost.abort_processed & (1 << (tx as u32 * 8 + svc as u32)) != 0;
        let ended = s.status(tx).is_some_and(Status::terminal)
            || self.execs_of(tx).any(|ci| s.coords[ci as usize].answer.is_some());
        if ended {
            self.event(s, Event::StrayLock);
        }
        let margin = s.phase(tx) == phase::CUTOFF;
        if margin {
            self.event(s, Event::LockInMargin);
        }
        if s.phase(tx) >= phase::RESOLVABLE {
            self.event(s, Event::LockPastCutoff);
        }
        ctx.note(|| format!("  lock {} for {} (token {token})", self.cfg.items[item as usize].name, self.tx_name(tx)));
        let indexed = !self.unindexed(tx);
        s.items[item as usize].lock = Some(Lock { tx, token, late, margin, pending, held: false, indexed });
        self.progress(s);
    }

    /// Issue 48 (`unindexed_recorded_locks`): `tx`'s lock writes leave the item out of the locks index: it is
    /// recorded first (keyed, two phases: PREPARING before any prepare) and not held.
    pub(crate) fn unindexed(&self, tx: Tx) -> bool {
        let spec = &self.cfg.txs[tx as usize];
        self.cfg.switches.unindexed_recorded_locks && spec.keyed && !spec.one_phase() && !spec.held
    }

    /// Issue 48: the lock in `slot` as the sweeper's `expired_locks` can see it (only one in the locks index).
    pub(crate) fn slot_indexed_lock(&self, s: &State, slot: ItemId) -> Option<Lock> {
        self.slot_lock(s, slot).filter(|l| l.indexed)
    }

    /// Issue 48 (`revisit_unclean_prepares`): a POST's own execution of an attempt with unindexed locks, aborting
    /// with an unclean prepare (one it sent and got no vote for), or an operator's abort of such an attempt
    /// (`operator_abort_left_open`: it cannot know whether a prepare is still in flight), leaves its record
    /// ABORTING for the sweeper, which acts only past deadline + 2M, after every lock cutoff.
    fn leaves_abort_open(&self, s: &State, ci: u8) -> bool {
        let (tx, _) = self.execs[ci as usize];
        let sw = self.cfg.switches;
        let c = &s.coords[ci as usize];
        if !self.unindexed(tx) {
            return false;
        }
        match self.route_of[ci as usize] {
            None => sw.revisit_unclean_prepares && !c.replay && c.votes.contains(&Vote::NoAnswer),
            Some(crate::config::Route::Operator) => sw.operator_abort_left_open,
            Some(_) => false,
        }
    }

    /// Removes `lock` from `item`, checking that the owner's record allows it.
    fn release_lock(&self, s: &mut State, item: ItemId, svc: Svc, ctx: &mut Ctx) {
        let lock = s.items[item as usize].lock.expect("a lock to release");
        let tx = lock.tx;
        let ok = match s.status(tx) {
            Some(Status::Aborting | Status::Aborted | Status::Committed) => true,
            // Only a stray lock (not the voted token) may be released under COMMITTING.
            Some(Status::Committing) => {
                self.cfg.switches.token_check && self.voted_token(s, tx, svc) != Some(lock.token)
            }
            // No record, or PREPARING: only once the sole execution that may commit decided not to.
            _ => s.ghost.no_commit & bit(tx) != 0,
        };
        if !ok {
            self.violate(s, Violation::BadRelease, ctx);
        }
        ctx.note(|| format!("  release {}'s lock on {}", self.tx_name(tx), self.cfg.items[item as usize].name));
        if lock.margin {
            self.event(s, Event::MarginLockEnded);
        }
        s.items[item as usize].lock = None;
        self.progress(s);
    }

    /// Applies `tx`'s operation on `item` (a commit or a roll-forward): it must be decided commit. Every
    /// commit moves the item's version. A service's own operation applies, in two phases, the value its
    /// prepare kept in `pending` (`apply_pending`; off: computed again by the operation as deployed now),
    /// in one phase the value it computed in this attempt (`computed`).
    #[allow(clippy::too_many_arguments)]
    fn apply_op(
        &self,
        s: &mut State,
        tx: Tx,
        svc: Svc,
        item: ItemId,
        two_phase: bool,
        computed: Option<i8>,
        ctx: &mut Ctx,
    ) {
        if two_phase && !s.status(tx).is_some_and(Status::commit) {
            self.violate(s, Violation::BadRollForward, ctx);
        }
        let p = self.part_of(tx, svc);
        for (o, op) in self.cfg.txs[tx as usize].parts[p].ops.iter().enumerate() {
            if op.item != item {
                continue;
            }
            let it = s.items[item as usize];
            let new = match op.kind {
                OpKind::Add { delta, .. } | OpKind::Ruled { delta } => it.balance + delta,
                OpKind::Custom { q } => self.custom_value(s, tx, svc, q, &it, two_phase, computed, ctx),
                OpKind::Check | OpKind::Charge => continue,
            };
            let it = &mut s.items[item as usize];
            let old = it.balance;
            it.balance = new;
            it.version += 1;
            it.last_tx = Some(tx);
            s.ghost.applied[self.cfg.op_index(tx, p, o)] += 1;
            ctx.note(|| {
                format!(
                    "  apply {}'s {:?} to {}: {old} -> {new}",
                    self.tx_name(tx),
                    op.kind,
                    self.cfg.items[item as usize].name
                )
            });
        }
        if two_phase {
            if s.items[item as usize].lock.is_some_and(|l| l.margin) {
                self.event(s, Event::MarginLockEnded);
            }
            s.items[item as usize].lock = None;
        }
        self.progress(s);
    }

    fn waiting(&self, s: &State, d: Dest) -> bool {
        let inv = if d.actor == SWEEPER { &s.sweeper.inv } else { &s.coords[d.actor as usize].inv };
        inv.get(d.slot as usize) == Some(&Inv::Waiting)
    }

    /// Whether anything in flight may still answer invocation `d`.
    pub(crate) fn live(&self, s: &State, d: Dest) -> bool {
        s.net.iter().any(|m| m.reply == Some(d)) || s.tasks.iter().any(|t| t.reply == Some(d))
    }

    /// A give-up that costs no fault: nothing can answer any more, or a prepare (or one-phase commit)
    /// whose transaction's deadline passed (`PhaseEngine::prepare` waits until the deadline).
    pub(crate) fn free_give_up(&self, s: &State, d: Dest) -> bool {
        if !self.live(s, d) {
            return true;
        }
        if d.actor == SWEEPER {
            return false;
        }
        let c = &s.coords[d.actor as usize];
        matches!(c.pc, CPc::CollectVotes | CPc::OnePhaseWait) && s.passed(self.execs[d.actor as usize].0)
    }

    /// The invocation `d` got its answer or was given up: nothing else answers it any more.
    fn orphan(&self, s: &mut State, d: Dest) {
        for m in &mut s.net {
            if m.reply == Some(d) {
                m.reply = None;
            }
        }
        for t in &mut s.tasks {
            if t.reply == Some(d) {
                t.reply = None;
            }
        }
    }

    fn send(&self, s: &mut State, to: Svc, req: Req, reply: Option<Dest>, ctx: &mut Ctx) {
        ctx.note(|| format!("  send {:?} to {}", req, self.cfg.services[to as usize]));
        s.net.push(Msg { to, req, reply });
    }

    /// A handler's answer reaches its caller, if the caller still waits for it. (Its loss or delay
    /// is the caller's timeout: `Action::GiveUp` while the handler is still at work.)
    fn finish(&self, s: &mut State, t: Task, ans: Ans, ctx: &mut Ctx) {
        ctx.note(|| format!("  {} answers {:?}", self.task_name(&t), ans));
        if let Some(d) = t.reply
            && self.waiting(s, d)
        {
            if ctx.drop_reply(s) {
                s.ghost.reason |= bit(t.req.tx());
            } else {
                self.deliver_rep(s, d, Some(ans), ctx);
            }
        }
    }

    fn refuse(&self, s: &mut State, t: Task, ctx: &mut Ctx) {
        s.ghost.reason |= bit(t.req.tx());
        self.finish(s, t, Ans::Vote(Vote::Refused), ctx);
    }

    /// participant/locks.rs `Cutoff::passed`, on arrival (guard.rs) and before every attempt of a lock write
    /// (prepare, check-only prepare, one-phase commit): is the participant's clock past `deadline + M`?
    /// (Before issue 28, `lock_cutoff` off: only on arrival, in `deliver_req`.)
    fn past_cutoff(&self, s: &mut State, t: &Task, ctx: &mut Ctx) -> bool {
        if !self.cfg.switches.lock_cutoff {
            return false;
        }
        let r = self.cutoff_reading(s, t.req.tx());
        ctx.reads_past(r, || format!("{}'s clock past the lock cutoff", self.cfg.services[t.svc as usize]))
    }

    /// What a participant's cutoff check may read (`deadline + M` by its clock): before, either way
    /// (`phase::CUTOFF`), then past.
    pub(crate) fn cutoff_reading(&self, s: &State, tx: Tx) -> Reading {
        match s.phase(tx) {
            phase::ON_TIME => Reading::Before,
            phase::CUTOFF => Reading::Either,
            _ => Reading::Past,
        }
    }

    /// What a resolver's check of `owner`'s lock or record may read (`expiry + 2M` by its clock): before,
    /// either way (`phase::RESOLVABLE`), then past. Without the margin (`resolver_margin` off: the plain
    /// expiry by its clock), either way from the start: a clock ahead of the coordinator's by less than M
    /// may be past the deadline while the coordinator's is not.
    pub(crate) fn resolvable(&self, s: &State, owner: Tx) -> Reading {
        match s.phase(owner) {
            phase::PAST => Reading::Past,
            phase::RESOLVABLE => Reading::Either,
            _ if self.cfg.switches.resolver_margin => Reading::Before,
            _ => Reading::Either,
        }
    }

    /// A resolver's check: may it act on `owner`'s lock or undecided record now?
    fn resolver_reads_past(&self, s: &mut State, owner: Tx, ctx: &mut Ctx) -> bool {
        let r = self.resolvable(s, owner);
        let line = if self.cfg.switches.resolver_margin { "expiry + 2M" } else { "expiry" };
        let past = ctx.reads_past(r, || format!("the resolver's clock past {}'s {line}", self.tx_name(owner)));
        if past && r == Reading::Either && s.phase(owner) == phase::RESOLVABLE {
            self.event(s, Event::ResolvedInMargin);
        }
        past
    }

    /// Issue 32: what a coordinator's check of `tx`'s `holdUntil` H may read (the commit route: its clock
    /// past H?): before, either way (hold phase 1), then past.
    pub(crate) fn hold_coord_reading(&self, s: &State, tx: Tx) -> Reading {
        match s.hold_phase(tx) {
            phase::ON_TIME => Reading::Before,
            phase::CUTOFF => Reading::Either,
            _ => Reading::Past,
        }
    }

    /// Issue 32: what a resolver's check of a PREPARED owner's `holdUntil + 2M` may read: before, either way
    /// (hold phase 2), then past.
    pub(crate) fn hold_resolvable(&self, s: &State, tx: Tx) -> Reading {
        match s.hold_phase(tx) {
            phase::PAST => Reading::Past,
            phase::RESOLVABLE => Reading::Either,
            _ => Reading::Before,
        }
    }

    /// Issue 32: a resolver's check of a PREPARED owner: past its `holdUntil + 2M`?
    fn hold_resolver_reads_past(&self, s: &mut State, tx: Tx, ctx: &mut Ctx) -> bool {
        let r = self.hold_resolvable(s, tx);
        ctx.reads_past(r, || format!("the resolver's clock past {}'s holdUntil + 2M", self.tx_name(tx)))
    }

    /// What a resolver's check of a lock may read: its expiry is its owner's deadline, or (extended by a
    /// hold message, issue 32) the later of the deadline and `holdUntil`: past only once past both.
    pub(crate) fn lock_reading(&self, s: &State, l: &Lock) -> Reading {
        let d = self.resolvable(s, l.tx);
        if !l.held {
            return d;
        }
        match (d, self.hold_resolvable(s, l.tx)) {
            (Reading::Before, _) | (_, Reading::Before) => Reading::Before,
            (Reading::Past, Reading::Past) => Reading::Past,
            _ => Reading::Either,
        }
    }

    /// A resolver's check of a lock it met (a prepare, the sweeper): expired and twice the margin?
    pub(crate) fn lock_reads_past(&self, s: &mut State, l: Lock, ctx: &mut Ctx) -> bool {
        if !l.held {
            return self.resolver_reads_past(s, l.tx, ctx);
        }
        let r = self.lock_reading(s, &l);
        ctx.reads_past(r, || format!("the resolver's clock past {}'s extended lock expiry + 2M", self.tx_name(l.tx)))
    }

    /// What a resolver's check of an open record may read: a PREPARED one's `holdUntil + 2M` (its `sweepAt`
    /// moved to `holdUntil`), another's deadline + 2M.
    pub(crate) fn record_reading(&self, s: &State, tx: Tx) -> Reading {
        if s.status(tx) == Some(Status::Prepared) { self.hold_resolvable(s, tx) } else { self.resolvable(s, tx) }
    }

    fn record_reads_past(&self, s: &mut State, tx: Tx, ctx: &mut Ctx) -> bool {
        if s.status(tx) == Some(Status::Prepared) {
            self.hold_resolver_reads_past(s, tx, ctx)
        } else {
            self.resolver_reads_past(s, tx, ctx)
        }
    }

    /// Issue 32: Late bits a resolver's step may need for the `holdUntil + 2M` checks of PREPARED owners
    /// (generous: bits a step does not use make its variant void).
    pub(crate) fn hold_checks(&self, s: &State) -> u32 {
        2 * (0..self.cfg.txs.len() as Tx).filter(|&tx| self.hold_resolvable(s, tx) == Reading::Either).count() as u32
    }

    /// Issue 32: Late bits of a route call's first step: `abort_expired` (the deadline's or the hold's line)
    /// and the commit route's check of `holdUntil`.
    pub(crate) fn route_checks(&self, s: &State, tx: Tx) -> u32 {
        [self.resolvable(s, tx), self.hold_resolvable(s, tx), self.hold_coord_reading(s, tx)]
            .iter()
            .filter(|&&r| r == Reading::Either)
            .count() as u32
    }

    /// Issue 32: a resolver aborts a PREPARED owner (the hold expired): it must be past `holdUntil + 2M` by
    /// the resolver's clock, which no coordinator's clock at or before `holdUntil` can be at the same moment.
    fn held_expiry_abort(&self, s: &mut State, tx: Tx, ctx: &mut Ctx) {
        if s.hold_phase(tx) < phase::RESOLVABLE {
            self.violate(s, Violation::HeldAbortedEarly, ctx);
        }
        self.event(s, Event::HoldExpired);
    }

    /// Refused TIMEOUT: the participant's clock is past the cutoff.
    fn refuse_late(&self, s: &mut State, t: Task, ctx: &mut Ctx) {
        ctx.note(|| "  past the lock cutoff: REFUSED TIMEOUT".into());
        if s.phase(t.req.tx()) == phase::CUTOFF {
            self.event(s, Event::RefusedInMargin);
        }
        self.refuse(s, t, ctx)
    }

    /// Where a prepare (or one-phase commit) goes back to after resolving a lock or waiting.
    fn resume_pc(&self, t: &Task) -> TPc {
        let tx = t.req.tx();
        if matches!(t.req, Req::Prepare { .. } | Req::OnePhase { .. }) && self.ops(tx, t.svc).iter().any(Op::judged) {
            // Read and judged again, then locked on condition of the version read (issues 29, 30).
            return TPc::Judge;
        }
        match t.req {
            Req::OnePhase { .. } => TPc::OnePhase,
            Req::Prepare { tx, .. }
                if self.cfg.txs[tx as usize].parts[self.part_of(tx, t.svc)].read_only()
                    && !self.cfg.txs[tx as usize].held =>
            {
                TPc::ReadCheck
            }
            _ => TPc::Lock,
        }
    }

    /// recovery.rs `decide`, read by a resolver (a PREPARED owner's `holdUntil + 2M` checked by its clock).
    fn fate(&self, s: &mut State, owner: Tx, svc: Svc, ctx: &mut Ctx) -> Fate {
        match s.status(owner) {
            None => Fate::Absent,
            Some(Status::Committing) => {
                if self.cfg.txs[owner as usize].held && s.hold_phase(owner) >= phase::RESOLVABLE {
                    self.event(s, Event::CommitBeatExpiry);
                }
                Fate::Commit(self.voted_token(s, owner, svc).unwrap_or(0))
            }
            Some(Status::Committed | Status::Aborting | Status::Aborted) => Fate::Release,
            Some(Status::Preparing) => Fate::Transition(Status::Preparing),
            // Before the fix: a PREPARED owner taken like a PREPARING one past its deadline.
            Some(Status::Prepared) if !self.cfg.switches.held_undecided => Fate::Transition(Status::Prepared),
            Some(Status::Prepared) if self.hold_resolver_reads_past(s, owner, ctx) => {
                Fate::Transition(Status::Prepared)
            }
            Some(Status::Prepared) => self.held_fate(s, owner, svc),
        }
    }

    /// Issue 32: a PREPARED owner within its hold (`OwnerFate::Held`, also a `Transition::Lost` to a hold
    /// recorded meanwhile): its lock moved to `holdUntil` with the voted token; before the fix, Undecided.
    fn held_fate(&self, s: &State, owner: Tx, svc: Svc) -> Fate {
        match self.voted_token(s, owner, svc) {
            Some(token) if self.cfg.switches.resolver_extends_hold => Fate::Held(token),
            _ => Fate::Undecided,
        }
    }

    /// Issue 32: lock resolution left a lock of a PREPARED owner (undecided until `holdUntil + 2M`).
    fn left_undecided(&self, s: &mut State, owner: Tx, item: ItemId, ctx: &mut Ctx) {
        ctx.note(|| format!("  owner {} is held (PREPARED): the lock stands", self.tx_name(owner)));
        if s.items[item as usize].lock.is_some_and(|l| l.tx == owner && !l.held) {
            self.event(s, Event::UndecidedHeldLock);
        }
    }

    /// Issue 32 (the fix): a resolver found a lock of a held owner that no hold message extended, and moves it
    /// (its `extend_lock`, the next step; the sweeper's hold message, in flight). The event is set here, where
    /// the state shows the move under way (a task, a message), not where it lands: a hold message of the
    /// coordinator landing first leads to the same state without it.
    fn moves_held_lock(&self, s: &mut State, owner: Tx, item: ItemId, e: Event) {
        if s.items[item as usize].lock.is_some_and(|l| l.tx == owner && !l.held) {
            self.event(s, e);
        }
    }

    /// What a lock the handler's write met means (participant/locks.rs `classify_lock_failure`, the other
    /// transaction's lock part): resolve an expired one (past `expiry + 2M` by this participant's clock),
    /// wait for a younger one's, refuse an older one's.
    fn met_lock(&self, s: &mut State, mut t: Task, lock: Lock, item: ItemId, ctx: &mut Ctx) {
        let tx = t.req.tx();
        if self.lock_reads_past(s, lock, ctx) {
            ctx.note(|| {
                format!(
                    "  meets {}'s lock on {}, expired: lock resolution",
                    self.tx_name(lock.tx),
                    self.cfg.items[item as usize].name
                )
            });
            t.pc = TPc::Resolve { owner: lock.tx, item, stage: RStage::Get };
            s.tasks.push(t);
        } else if s.status(lock.tx).is_some_and(|status| status != Status::Preparing && status != Status::Prepared) {
            // Issue 35, `owner_is_decided`: a live lock whose owner is decided (a late prepare's stray lock, or
            // one whose second phase is in flight) is settled now, as lock resolution would after its expiry.
            ctx.note(|| format!("  meets {}'s lock, its owner decided: lock resolution", self.tx_name(lock.tx)));
            self.event(s, Event::DecidedOwnerResolved);
            t.pc = TPc::Resolve { owner: lock.tx, item, stage: RStage::Get };
            s.tasks.push(t);
        } else if tx < lock.tx {
            // Wait-die by (startedAt, id): the older one waits for the younger one's lock.
            ctx.note(|| "  older: waits".into());
            t.pc = TPc::Wait { owner: lock.tx, item };
            s.tasks.push(t);
        } else {
            ctx.note(|| "  younger: dies".into());
            if s.status(lock.tx) == Some(Status::Prepared) {
                self.event(s, Event::HeldLockRefused);
            }
            self.refuse(s, t, ctx);
        }
    }

    // ----- participant ---------------------------------------------------------------------------

    /// participant/protocol.rs `Participant::handle`: a request arrives, passes the guard (guard.rs: its
    /// signature, its reading, a prepare's arrival cutoff, which is the first attempt's check in
    /// `past_cutoff`), and its branch's first step runs (port.rs: items, or a resource's `res_deliver`).
    fn deliver_req(&self, s: &mut State, svc: Svc, req: Req, reply: Option<Dest>, ctx: &mut Ctx) {
        let tx = req.tx();
        if s.status(tx).is_some_and(Status::terminal) {
            self.event(s, Event::LateDelivery);
        }
        if let Req::Hold { tx, token } = req
            && !self.cfg.is_resource(svc)
        {
            // Issue 32: participant.rs `hold` / store.rs `extend_lock`, per item (its lost reply's retry changes
            // nothing: folded). Answered HELD, which only the sweeper waits for (`resolve_lock`'s hold).
            for i in 0..self.ops(tx, svc).len() {
                let item = self.ops(tx, svc)[i].item;
                self.extend_lock(s, tx, item, token, ctx);
            }
            if reply.is_some() {
                let t = Task { svc, req, reply, pc: TPc::Lock, retrying: false, burned: 0 };
                self.finish(s, t, Ans::Held, ctx);
            }
            return;
        }
        if self.cfg.is_resource(svc) {
            return self.res_deliver(s, svc, req, reply, ctx);
        }
        let mut t = Task { svc, req, reply, pc: TPc::Lock, retrying: false, burned: 0 };
        match req {
            Req::Prepare { .. } | Req::OnePhase { .. } if !self.cfg.switches.lock_cutoff => {
                // Before issue 28: checked once, on arrival, against the plain deadline (a participant's clock
                // may be past it while the coordinator's is not: phase 0 reads either way); no later check.
                let r = if s.phase(tx) >= phase::RESOLVABLE { Reading::Past } else { Reading::Either };
                if ctx.reads_past(r, || format!("{}'s clock past the deadline", self.cfg.services[svc as usize])) {
                    ctx.note(|| "  after the deadline: REFUSED TIMEOUT".into());
                    if s.phase(tx) == phase::ON_TIME {
                        self.event(s, Event::RefusedOnTime);
                    }
                    return self.refuse(s, t, ctx);
                }
                t.pc = self.resume_pc(&t);
            }
            // Checked before every attempt (`task_step` → `past_cutoff`).
            Req::Prepare { .. } | Req::OnePhase { .. } => t.pc = self.resume_pc(&t),
            Req::Commit { .. } => t.pc = TPc::Commit { at: 0, all: true },
            Req::Abort { .. } => {
                s.ghost.abort_processed |= 1 << (tx as u32 * 8 + svc as u32);
                t.pc = TPc::Abort { at: 0 };
            }
            Req::Hold { .. } => unreachable!("a hold is done on delivery"),
        }
        self.task_step(s, t, ctx);
    }

    fn task_step(&self, s: &mut State, t: Task, ctx: &mut Ctx) {
        match t.pc {
            TPc::Lock => self.prepare_lock(s, t, ctx),
            TPc::ReadCheck => self.prepare_read(s, t, ctx),
            TPc::OnePhase => self.one_phase_write(s, t, ctx),
            TPc::Wait { .. } => unreachable!("a waiting handler is woken by Action::Task"),
            TPc::Resolve { owner, item, stage } => self.resolve_step(s, t, owner, item, stage, ctx),
            TPc::Commit { at, all } => self.commit_step(s, t, at, all, ctx),
            TPc::ReleaseStray { at, token } => {
                // items.rs commit_item: a lock of T with another token is a late copy's: release it
                // (condition on that token), apply nothing, answer NOT_PREPARED.
                let Req::Commit { tx, .. } = t.req else { unreachable!() };
                let item = self.ops(tx, t.svc)[at as usize].item;
                if s.items[item as usize].lock.is_some_and(|l| l.tx == tx && l.token == token) {
                    self.release_lock(s, item, t.svc, ctx);
                    self.event(s, Event::StrayReleased);
                }
                self.commit_next(s, t, at + 1, false, ctx);
            }
            TPc::Abort { at } => self.abort_step(s, t, at, ctx),
            TPc::Judge => self.judge(s, t, ctx),
            TPc::LockSeen { seen, value } => self.lock_seen(s, t, seen, value, ctx),
            TPc::OnePhaseSeen { seen, value } => self.one_phase_seen(s, t, seen, value, ctx),
            TPc::RTryAwait { .. } => unreachable!("a try's answer comes with Action::TryLand"),
            TPc::RTried { reserved, token } => self.res_tried(s, t, reserved, token, ctx),
            TPc::RCancel { seen_tried } => self.res_cancel(s, t, seen_tried, ctx),
            TPc::RVoid => self.res_void(s, t, ctx),
            TPc::RAbort => self.res_abort(s, t, ctx),
            TPc::RConfirmed => self.res_confirmed(s, t, ctx),
        }
    }

    /// items.rs `DataTable::lock_all` (`lock_write` per item, sent by store/write.rs `conditional`; one TransactWriteItems for several),
    /// and participant.rs `prepare`'s reading of a failed condition.
    /// Fixed condition: `attribute_not_exists(lock) AND (attribute_not_exists(lastTx) OR lastTx <> T)
    /// AND guard`, update `SET lock = {T, token}`. Today's (`token_check` off): `(attribute_not_exists(lock)
    /// OR lock.transactionId = T) AND ...`, no token.
    fn prepare_lock(&self, s: &mut State, mut t: Task, ctx: &mut Ctx) {
        let Req::Prepare { tx, exec, copy } = t.req else { unreachable!() };
        let sw = self.cfg.switches;
        // A retry after a write whose reply was lost is a new attempt (a new token), checked again; the
        // SDK's retry of the same request (`fresh_token_per_attempt` off) is the same attempt.
        if (sw.fresh_token_per_attempt || !t.retrying) && self.past_cutoff(s, &t, ctx) {
            return self.refuse_late(s, t, ctx);
        }
        // The token is per delivery (exec, copy): design.md's "token of this execution", which the
        // SDK's retry and the handler's own next attempt re-send. With `fresh_token_per_attempt`, a
        // token that was written once is never written again: every attempt after a write that took
        // effect unacknowledged has a new one.
        let burned = if sw.fresh_token_per_attempt { t.burned } else { 0 };
        let token = if sw.token_check { 1 + (exec * 2 + copy) * 4 + burned } else { 0 };
        let ops = self.ops(tx, t.svc);
        let failed = ops.iter().position(|op| {
            let it = &s.items[op.item as usize];
            let lock_ok = match it.lock {
                None => true,
                Some(l) => !sw.token_check && l.tx == tx,
            };
            !(lock_ok && it.last_tx != Some(tx) && guard(op, it))
        });
        let retrying = std::mem::take(&mut t.retrying);
        let Some(i) = failed else {
            for op in ops {
                self.take_lock(s, op.item, tx, t.svc, token, None, ctx);
            }
            if ctx.lost_reply(s) {
                t.retrying = true;
                t.burned += 1;
                s.tasks.push(t);
                return;
            }
            return self.finish(s, t, Ans::Vote(Vote::Prepared { token, read_only: false }), ctx);
        };
        let item = ops[i].item;
        let it = s.items[item as usize];
        if let Some(l) = it.lock {
            if l.tx == tx {
                // The fix: a lock of T itself (a re-delivery while the first lock stands, or this very
                // write's retry): PREPARED with the token the lock carries, if every item carries it.
                let all =
                    ops.iter().all(|o| s.items[o.item as usize].lock.is_some_and(|m| m.tx == tx && m.token == l.token));
                if !all {
                    return self.refuse(s, t, ctx);
                }
                if retrying {
                    self.event(s, Event::OwnWriteRecognised);
                }
                return self.finish(s, t, Ans::Vote(Vote::Prepared { token: l.token, read_only: false }), ctx);
            }
            return self.met_lock(s, t, l, item, ctx);
        }
        // lastTx = T: already committed here; or a guard failed.
        self.refuse(s, t, ctx)
    }

    /// participant.rs `prepare_read_only` (participant/locks.rs `check_holds`): read, vote, lock nothing.
    fn prepare_read(&self, s: &mut State, t: Task, ctx: &mut Ctx) {
        let tx = t.req.tx();
        if self.past_cutoff(s, &t, ctx) {
            return self.refuse_late(s, t, ctx);
        }
        for op in self.ops(tx, t.svc) {
            let it = s.items[op.item as usize];
            if let Some(l) = it.lock
                && l.tx != tx
            {
                return self.met_lock(s, t, l, op.item, ctx);
            }
            if it.last_tx == Some(tx) || !guard(op, &it) {
                return self.refuse(s, t, ctx);
            }
        }
        self.finish(s, t, Ans::Vote(Vote::Prepared { token: 0, read_only: true }), ctx);
    }

    /// items.rs `DataTable::apply_one_phase`: one TransactWriteItems: each item
    /// `attribute_not_exists(lock) AND guard` + apply; the record Put `attribute_not_exists`.
    fn one_phase_write(&self, s: &mut State, mut t: Task, ctx: &mut Ctx) {
        let Req::OnePhase { tx, exec, .. } = t.req else { unreachable!() };
        // The SDK's retry of the TransactWriteItems (a lost reply) is the same attempt: not checked again.
        if !t.retrying && self.past_cutoff(s, &t, ctx) {
            return self.refuse_late(s, t, ctx);
        }
        let ops = self.ops(tx, t.svc);
        let item_failed = ops.iter().position(|op| {
            let it = &s.items[op.item as usize];
            !(it.lock.is_none() && guard(op, it))
        });
        let retrying = std::mem::take(&mut t.retrying);
        match item_failed {
            None if s.record(tx).is_none() => {
                for op in ops {
                    self.apply_op(s, tx, t.svc, op.item, false, None, ctx);
                }
                s.ghost.executed_by[tx as usize] |= 1 << exec;
                let votes = vec![Vote::Prepared { token: 0, read_only: false }];
                self.write_record(s, tx, Record::new(Status::Committed, exec, Some(votes)), ctx);
                self.event(s, Event::OnePhaseCommitted);
                if ctx.lost_reply(s) {
                    t.retrying = true;
                    s.tasks.push(t);
                    return;
                }
                self.finish(s, t, Ans::Committed, ctx)
            }
            None => {
                // The record's condition failed: a duplicate, or an abort written after a lost reply.
                if retrying {
                    self.event(s, Event::OwnWriteRecognised);
                }
                self.event(s, Event::OnePhaseRecordExists);
                self.finish(s, t, Ans::RecordExists, ctx)
            }
            Some(i) => {
                let item = ops[i].item;
                match s.items[item as usize].lock {
                    Some(l) if l.tx != tx => self.met_lock(s, t, l, item, ctx),
                    _ => self.refuse(s, t, ctx),
                }
            }
        }
    }

    /// participant.rs `resolve` / recovery.rs `owner_fate`, one DynamoDB step per stage.
    fn resolve_step(&self, s: &mut State, mut t: Task, owner: Tx, item: ItemId, stage: RStage, ctx: &mut Ctx) {
        let retrying = std::mem::take(&mut t.retrying);
        let sw = self.cfg.switches;
        let next = |fate: Fate| -> Option<RStage> {
            Some(match fate {
                Fate::Absent => RStage::CreateAborted,
                Fate::Transition(from) => RStage::Transition { from },
                Fate::Commit(token) => RStage::RollForward { token },
                Fate::Release => RStage::Release,
                Fate::Held(token) => RStage::Extend { token },
                Fate::Undecided => return None,
            })
        };
        // Undecided (issue 32, a PREPARED owner within its hold, before the fix): refused CONFLICT, naming the
        // holder.
        let goto = |me: &Self, s: &mut State, mut t: Task, stage: Option<RStage>, ctx: &mut Ctx| match stage {
            Some(stage) => {
                if matches!(stage, RStage::Extend { .. }) {
                    // Its refusal CONFLICT is certain now (the next step): marked where the state shows it (the
                    // state after the refusal may be reached first by a refusal for another reason).
                    me.event(s, Event::HeldLockRefused);
                    me.moves_held_lock(s, owner, item, Event::PrepareMovesHeldLock);
                }
                t.pc = TPc::Resolve { owner, item, stage };
                s.tasks.push(t);
            }
            None => {
                me.left_undecided(s, owner, item, ctx);
                me.event(s, Event::HeldLockRefused);
                me.refuse(s, t, ctx);
            }
        };
        let resume = |me: &Self, s: &mut State, mut t: Task| {
            t.pc = me.resume_pc(&t);
            s.tasks.push(t);
        };
        match stage {
            RStage::Get => {
                // The read of the owner's record is folded into the write it leads to: that write's
                // condition re-checks what the read saw, so nothing can come between that matters.
                let fate = self.fate(s, owner, t.svc, ctx);
                ctx.note(|| format!("  owner {}'s fate: {fate:?}", self.tx_name(owner)));
                match next(fate) {
                    // Issue 32: `extend_lock` is a write of its own, conditioned on the lock, not the record
                    // (the owner may be decided by the time it lands): a step of its own.
                    Some(stage @ RStage::Extend { .. }) => goto(self, s, t, Some(stage), ctx),
                    Some(stage) => self.resolve_step(s, t, owner, item, stage, ctx),
                    None => goto(self, s, t, None, ctx),
                }
            }
            RStage::CreateAborted => {
                if s.record(owner).is_none() {
                    self.event(s, Event::ResolutionRecordedAbort);
                    let rec = Record::new(Status::Aborted, NOBODY, None);
                    self.write_record(s, owner, rec, ctx);
                    if ctx.lost_reply(s) {
                        t.retrying = true;
                        return s.tasks.push(t);
                    }
                    return goto(self, s, t, Some(RStage::Release), ctx);
                }
                if retrying {
                    self.event(s, Event::OwnWriteRecognised);
                }
                let fate = self.fate(s, owner, t.svc, ctx);
                goto(self, s, t, next(fate), ctx);
            }
            RStage::Transition { from } => {
                if s.status(owner) == Some(from) {
                    // With its reason (EXPIRED_REASON): a write that makes the record larger.
                    if ctx.for_size(s, owner) {
                        if !sw.shortened_writes {
                            // Before issue 27: `owner_fate` fails, and so does this prepare.
                            ctx.note(|| "  lock resolution fails: the handler answers an error".into());
                            return self.refuse(s, t, ctx);
                        }
                        // `transition`: read the record (still PREPARING, checked here) and write the
                        // shortened ABORTING (no reason) with the same condition, in the same step:
                        // the refused write changed nothing anyone could see in between.
                        self.event(s, Event::ShortenedWrite);
                    }
                    if from == Status::Prepared {
                        self.held_expiry_abort(s, owner, ctx);
                    } else {
                        self.event(s, Event::ResolutionAbortedPreparing);
                    }
                    self.set_status(s, owner, Status::Aborting, None, ctx);
                    if ctx.lost_reply(s) {
                        t.retrying = true;
                        return s.tasks.push(t);
                    }
                    return goto(self, s, t, Some(RStage::Release), ctx);
                }
                // Lost: follow the winner (a PREPARING owner held meanwhile: `Transition::Lost`, Held).
                let fate = match s.status(owner) {
                    Some(Status::Preparing) => Fate::Undecided,
                    Some(Status::Prepared) => self.held_fate(s, owner, t.svc),
                    _ => self.fate(s, owner, t.svc, ctx),
                };
                goto(self, s, t, next(fate), ctx);
            }
            RStage::RollForward { token } => {
                let it = s.items[item as usize];
                let held = if sw.token_check {
                    it.lock.is_some_and(|l| l.tx == owner && l.token == token)
                } else {
                    it.lock.is_some_and(|l| l.tx == owner) && it.last_tx != Some(owner)
                };
                if held {
                    self.apply_op(s, owner, t.svc, item, true, None, ctx);
                    self.event(s, Event::RolledForward);
                    if ctx.lost_reply(s) {
                        t.retrying = true;
                        return s.tasks.push(t);
                    }
                    return resume(self, s, t);
                }
                match it.lock {
                    Some(l) if sw.token_check && l.tx == owner && it.last_tx != Some(owner) => {
                        goto(self, s, t, Some(RStage::ReleaseStray { token: l.token }), ctx)
                    }
                    _ => resume(self, s, t),
                }
            }
            RStage::Release => {
                if s.items[item as usize].lock.is_some_and(|l| l.tx == owner) {
                    self.release_lock(s, item, t.svc, ctx);
                    if ctx.lost_reply(s) {
                        t.retrying = true;
                        return s.tasks.push(t);
                    }
                }
                resume(self, s, t)
            }
            RStage::ReleaseStray { token } => {
                if s.items[item as usize].lock.is_some_and(|l| l.tx == owner && l.token == token) {
                    self.release_lock(s, item, t.svc, ctx);
                    self.event(s, Event::StrayReleased);
                }
                resume(self, s, t)
            }
            RStage::Extend { token } => {
                // Issue 32, participant/prepare.rs `resolve`, `OwnerFate::Held`: `extend_lock(owner, key, voted
                // token, holdUntil)` (its lost reply's retry meets the lock extended and changes nothing: folded),
                // then refused CONFLICT, naming the holder.
                self.extend_lock(s, owner, item, token, ctx);
                ctx.note(|| format!("  owner {} is held (PREPARED): refused CONFLICT", self.tx_name(owner)));
                self.event(s, Event::HeldLockRefused);
                self.refuse(s, t, ctx)
            }
        }
    }

    /// Issue 32: store.rs `extend_lock`: `lock.transactionId = T AND lock.token = lockToken AND expiresAt <
    /// holdUntil` → `expiresAt = holdUntil` (a lock gone, of another token, or extended already is left
    /// alone).
    fn extend_lock(&self, s: &mut State, tx: Tx, item: ItemId, token: u8, ctx: &mut Ctx) {
        match s.items[item as usize].lock.as_mut() {
            Some(l) if l.tx == tx && l.token == token && !l.held => {
                l.held = true;
                ctx.note(|| {
                    format!(
                        "  {}'s lock on {} now expires at its holdUntil",
                        self.tx_name(tx),
                        self.cfg.items[item as usize].name
                    )
                });
                self.progress(s);
            }
            _ => {}
        }
    }

    /// items.rs `DataTable::commit_item`. Fixed condition: `lock.transactionId = T AND lock.token =
    /// lockToken`; today's: `lock.transactionId = T AND lastTx <> T`.
    fn commit_step(&self, s: &mut State, mut t: Task, at: u8, all: bool, ctx: &mut Ctx) {
        let Req::Commit { tx, token } = t.req else { unreachable!() };
        let sw = self.cfg.switches;
        let op = self.ops(tx, t.svc)[at as usize];
        let it = s.items[op.item as usize];
        let retrying = std::mem::take(&mut t.retrying);
        if op.kind == OpKind::Check {
            // commit_item of a check: release(tx).
            if it.lock.is_some_and(|l| l.tx == tx) {
                self.release_lock(s, op.item, t.svc, ctx);
            }
            return self.commit_next(s, t, at + 1, all, ctx);
        }
        let held = if sw.token_check {
            it.lock.is_some_and(|l| l.tx == tx && l.token == token)
        } else {
            it.lock.is_some_and(|l| l.tx == tx) && it.last_tx != Some(tx)
        };
        if held {
            self.apply_op(s, tx, t.svc, op.item, true, None, ctx);
            if ctx.lost_reply(s) {
                t.retrying = true;
                s.tasks.push(t);
                return;
            }
            return self.commit_next(s, t, at + 1, all, ctx);
        }
        if it.last_tx == Some(tx) {
            if retrying {
                self.event(s, Event::OwnWriteRecognised);
            }
            return self.commit_next(s, t, at + 1, all, ctx);
        }
        match it.lock {
            Some(l) if sw.token_check && l.tx == tx => {
                t.pc = TPc::ReleaseStray { at, token: l.token };
                s.tasks.push(t);
            }
            _ => self.commit_next(s, t, at + 1, false, ctx),
        }
    }

    fn commit_next(&self, s: &mut State, mut t: Task, at: u8, all: bool, ctx: &mut Ctx) {
        if at as usize >= self.ops(t.req.tx(), t.svc).len() {
            let ans = if all { Ans::Committed } else { Ans::NotPrepared };
            return self.finish(s, t, ans, ctx);
        }
        t.pc = TPc::Commit { at, all };
        s.tasks.push(t);
    }

    /// items.rs `DataTable::release`: condition `lock.transactionId = T` (any token).
    fn abort_step(&self, s: &mut State, mut t: Task, at: u8, ctx: &mut Ctx) {
        let Req::Abort { tx, item } = t.req else { unreachable!() };
        let items: Vec<ItemId> = match item {
            Some(i) => vec![i],
            None => self.ops(tx, t.svc).iter().map(|o| o.item).collect(),
        };
        let i = items[at as usize];
        t.retrying = false;
        if s.items[i as usize].lock.is_some_and(|l| l.tx == tx) {
            self.release_lock(s, i, t.svc, ctx);
            if ctx.lost_reply(s) {
                t.retrying = true;
                s.tasks.push(t);
                return;
            }
        }
        if at as usize + 1 < items.len() {
            t.pc = TPc::Abort { at: at + 1 };
            s.tasks.push(t);
        } else {
            self.finish(s, t, Ans::Aborted, ctx);
        }
    }

    // ----- coordinator ---------------------------------------------------------------------------

    /// the coordinator's `abort_participants`: fixed: every participant but read-only PREPARED voters;
    /// today's (`abort_everyone` off): also skips those that voted REFUSED.
    fn abort_targets(&self, votes: &[Vote]) -> Vec<usize> {
        let everyone = self.cfg.switches.abort_everyone;
        (0..votes.len())
            .filter(|&p| match votes[p] {
                Vote::Prepared { read_only: true, .. } => false,
                Vote::Refused => everyone,
                _ => true,
            })
            .collect()
    }

    fn commit_targets(votes: &[Vote]) -> Vec<usize> {
        (0..votes.len()).filter(|&p| matches!(votes[p], Vote::Prepared { read_only: false, .. })).collect()
    }

    /// the coordinator's `second_phase`: commit (with each vote's lockToken) to the PREPARED writers, or
    /// abort to the abort targets, each its own invocation.
    fn invoke_all(&self, s: &mut State, actor: u8, tx: Tx, commit: bool, votes: &[Vote], ctx: &mut Ctx) {
        let targets = if commit { Self::commit_targets(votes) } else { self.abort_targets(votes) };
        let inv = if actor == SWEEPER { &mut s.sweeper.inv } else { &mut s.coords[actor as usize].inv };
        for x in inv.iter_mut() {
            *x = Inv::Idle;
        }
        for &p in &targets {
            inv[p] = Inv::Waiting;
        }
        for &p in &targets {
            let svc = self.svc_of(tx, p);
            if !self.may_hold(s, tx, svc) {
                // Nothing of T at this participant, and nothing that could still lock there: whenever
                // the message arrives it changes nothing and is acknowledged. Acknowledged now.
                ctx.note(|| {
                    format!(
                        "  {} holds nothing of {}: acknowledged at once",
                        self.cfg.services[svc as usize],
                        self.tx_name(tx)
                    )
                });
                let inv = if actor == SWEEPER { &mut s.sweeper.inv } else { &mut s.coords[actor as usize].inv };
                inv[p] = Inv::Acked;
                continue;
            }
            let req = if commit {
                let Vote::Prepared { token, .. } = votes[p] else { unreachable!("commit goes to PREPARED voters") };
                Req::Commit { tx, token }
            } else {
                Req::Abort { tx, item: None }
            };
            self.send(s, svc, req, Some(Dest { actor, slot: p as u8 }), ctx);
        }
        self.progress(s);
    }

    /// Nothing reads `tx`'s deadline any more: no message, handler or lock of it, its executions
    /// done (or not started while its record is terminal), its record terminal (or absent once its
    /// executions are done).
    fn deadline_unobservable(&self, s: &State, tx: Tx) -> bool {
        let terminal = s.status(tx).is_some_and(Status::terminal);
        s.net.iter().all(|m| m.req.tx() != tx)
            && s.tasks.iter().all(|t| t.req.tx() != tx)
            && !self.holds_lock(s, tx)
            && self.execs_of(tx).all(|ci| match s.coords[ci as usize].pc {
                CPc::Done => true,
                CPc::Start => terminal,
                _ => false,
            })
            && (terminal || s.record(tx).is_none() && self.execs_of(tx).all(|ci| s.coords[ci as usize].pc == CPc::Done))
    }

    /// A phase of T's deadline that nothing can tell from the next one is skipped: the next one allows
    /// everything it allows (a check that reads either way includes the reading of the phase before), and
    /// follows it anyway. The coordinator's clock (at or before D) is read while an execution of T may
    /// still decide, wait for prepares, or start; the participants' cutoffs while a prepare or one-phase
    /// commit of T may still lock; resolvers' checks while T holds a lock or has an open record, or an
    /// execution of T may still create one or wait in `replay`.
    fn skip_unread_phases(&self, s: &mut State, tx: Tx) {
        loop {
            let p = s.phase(tx);
            let unread = match p {
                phase::ON_TIME => !self.coordinator_clock_read(s, tx) && !self.may_still_lock(s, tx),
                phase::CUTOFF => !self.may_still_lock(s, tx),
                phase::RESOLVABLE => self.resolvers_idle(s, tx),
                _ => return,
            };
            if !unread {
                return;
            }
            if !self.cfg.margin {
                // Phase 0 → 3 at once: only when no phase in between would be read either.
                if self.resolvers_idle(s, tx) {
                    s.set_phase(tx, phase::PAST);
                }
                return;
            }
            s.set_phase(tx, p + 1);
        }
    }

    /// Whether an execution of T may still read its clock against the deadline (decide, wait for
    /// prepares or a one-phase answer, or start: a retry may replay and wait).
    fn coordinator_clock_read(&self, s: &State, tx: Tx) -> bool {
        self.execs_of(tx).any(|ci| {
            let pc = s.coords[ci as usize].pc;
            in_progress(pc) || matches!(pc, CPc::Start | CPc::Replay)
        })
    }

    /// Whether no resolver's check of T can matter: T holds no lock and cannot take one, its record is
    /// not open and no execution may still create it open, and no retry of it waits or may wait.
    fn resolvers_idle(&self, s: &State, tx: Tx) -> bool {
        let terminal = s.status(tx).is_some_and(Status::terminal);
        !self.open(s, tx)
            && !self.holds_lock(s, tx)
            && (self.cfg.switches.lock_cutoff || !self.may_still_lock(s, tx))
            && self.execs_of(tx).all(|ci| match s.coords[ci as usize].pc {
                CPc::Start => terminal,
                CPc::CreatePreparing | CPc::CollectVotes | CPc::Decide | CPc::WriteDecision { .. } | CPc::Replay => {
                    false
                }
                _ => true,
            })
    }

    /// Whether a participant may still check T's lock cutoff: a prepare or one-phase commit of T in
    /// flight or at work, or an execution of T that may still send one.
    fn may_still_lock(&self, s: &State, tx: Tx) -> bool {
        let locks = |r: &Req| matches!(r, Req::Prepare { .. } | Req::OnePhase { .. }) && r.tx() == tx;
        s.net.iter().any(|m| locks(&m.req))
            || s.tasks.iter().any(|t| locks(&t.req))
            || self.execs_of(tx).any(|ci| matches!(s.coords[ci as usize].pc, CPc::Start | CPc::CreatePreparing))
    }

    /// Whether `tx` holds a lock at `svc`, or a prepare of it may still take one there. At a resource: a
    /// prepare of it may still come or is at work there, or its barrier entry is one an abort or commit
    /// acts on (TRYING, TRIED, a CANCELLED one with its lock or a reservation not voided yet).
    fn may_hold(&self, s: &State, tx: Tx, svc: Svc) -> bool {
        if self.cfg.is_resource(svc) {
            return s.net.iter().any(|m| m.to == svc && matches!(m.req, Req::Prepare { tx: t, .. } if t == tx))
                || s.tasks.iter().any(|t| t.svc == svc && matches!(t.req, Req::Prepare { tx: x, .. } if x == tx))
                || s.barriers[tx as usize].is_some_and(|e| {
                    e.lock
                        || matches!(e.state, BState::Trying | BState::Tried)
                        || e.state == BState::Cancelled && e.tried && !e.cancelled_call
                });
        }
        s.items.iter().enumerate().any(|(i, it)| self.cfg.items[i].svc == svc && it.lock.is_some_and(|l| l.tx == tx))
            || s.net.iter().any(|m| m.to == svc && matches!(m.req, Req::Prepare { tx: t, .. } if t == tx))
            || s.tasks.iter().any(|t| t.svc == svc && matches!(t.req, Req::Prepare { tx: x, .. } if x == tx))
    }

    /// Answers the client. An abort it answers (409, or 503 after a refused decision) must leave no
    /// lock of the transaction behind but late copies' and those whose abort went unacknowledged.
    fn answer(&self, s: &mut State, ci: u8, a: Answer, ctx: &mut Ctx) {
        let (tx, _) = self.execs[ci as usize];
        let n = s.coords[ci as usize].inv.len();
        for slot in 0..n {
            self.orphan(s, Dest { actor: ci, slot: slot as u8 });
        }
        let c = &mut s.coords[ci as usize];
        c.pc = CPc::Done;
        c.retrying = false;
        for x in c.inv.iter_mut() {
            *x = Inv::Idle;
        }
        // Issue 48: an answer sent on the decision stays the caller's: what the execution does after it
        // (its end, or its crash) answers nobody.
        if c.answer.is_none() {
            c.answer = Some(a);
        }
        let unacked = c.abort_unacked;
        ctx.note(|| format!("  {} answers {:?}", self.coord_name(ci), a));
        self.progress(s);
        if matches!(a, Answer::Conflict | Answer::Unavailable { aborted: true } | Answer::AbortOk) {
            let left = s.items.iter().enumerate().any(|(i, it)| {
                it.lock.is_some_and(|l| {
                    let svc = self.cfg.items[i].svc;
                    l.tx == tx && !l.late && unacked & (1 << self.part_of(tx, svc)) == 0
                })
            });
            if left {
                self.violate(s, Violation::LockLeftByAbort, ctx);
            }
        }
    }

    /// `Reply::answering` (the fix of issue 28): COMMITTED 200, COMMITTING 202, ABORTING/ABORTED 409,
    /// PREPARING 503 with the id, outcome unknown; `Reply::for_record` (`replay_answers_record` off)
    /// answers PREPARING 202. Only a retried key whose budget ran out answers a PREPARING record.
    /// Issue 32: a held POST answers PREPARED 202 (`Answer::Held`); the abort route answers an abort 200 and
    /// a commit 409; the commit route as a POST (a record still undecided: 503).
    fn answer_for(&self, s: &mut State, ci: u8, status: Status, ctx: &mut Ctx) {
        let route = self.route_of[ci as usize];
        let a = match status {
            _ if matches!(route, Some(crate::config::Route::Abort | crate::config::Route::Operator)) => {
                if status.commit() {
                    if route == Some(crate::config::Route::Operator) {
                        self.event(s, Event::OperatorAbortLost);
                    }
                    Answer::AbortLost
                } else if status.abort() {
                    Answer::AbortOk
                } else {
                    Answer::Unavailable { aborted: false }
                }
            }
            Status::Committed => Answer::Ok,
            Status::Prepared if route.is_none() => Answer::Held,
            Status::Prepared => Answer::Unavailable { aborted: false },
            Status::Preparing if self.cfg.switches.replay_answers_record || route.is_some() => {
                Answer::Unavailable { aborted: false }
            }
            Status::Committing | Status::Preparing => Answer::Accepted,
            Status::Aborting | Status::Aborted => Answer::Conflict,
        };
        self.answer(s, ci, a, ctx);
    }

    /// the coordinator's `replay` within `answer_by`: the budget runs out while it waits (it stops and
    /// answers the record it last read: `abort_expired` does nothing to a PREPARING record within the
    /// margin, and `drive_within` has no time left), or while it drives (`drive_within` returns the
    /// decided record). Whatever the record said: 503 PREPARING, 202 COMMITTING, 409 ABORTING, or its end.
    fn budget_spent(&self, s: &mut State, ci: u8, ctx: &mut Ctx) {
        let (tx, _) = self.execs[ci as usize];
        let status = match s.coords[ci as usize].pc {
            CPc::Replay => s.status(tx).expect("replay follows a record"),
            CPc::DriveAwait { status } => status,
            CPc::TerminalWrite { to: Status::Committed } => Status::Committing,
            CPc::TerminalWrite { .. } => Status::Aborting,
            pc => unreachable!("no answer budget at {pc:?}"),
        };
        match status {
            Status::Preparing => self.event(s, Event::RetryUndecided),
            Status::Committing | Status::Aborting if !s.status(tx).is_some_and(Status::terminal) => {
                self.event(s, Event::RetryDecidedUnfinished)
            }
            _ => {}
        }
        if status == Status::Aborting {
            // An abort it answers without every participant's acknowledgement: those locks are the first
            // execution's or the sweeper's to release (as for an unacknowledged abort).
            let c = &mut s.coords[ci as usize];
            for (p, x) in c.inv.iter().enumerate() {
                if c.pc == CPc::Replay || *x != Inv::Acked {
                    c.abort_unacked |= 1 << p;
                }
            }
        }
        self.answer_for(s, ci, status, ctx);
    }

    /// the coordinator's `drive` for a decided record: send commit or abort, then wait. (Issue 32: a PREPARED
    /// record is not driven: held.)
    fn drive(&self, s: &mut State, ci: u8, status: Status, ctx: &mut Ctx) {
        if status == Status::Prepared {
            return self.hold_and_answer(s, ci, ctx);
        }
        let (tx, _) = self.execs[ci as usize];
        let votes = s.coords[ci as usize].votes.clone();
        // Issue 48: a POST's own execution (not a retried key's replay, not a route) knows the commit is
        // decided: it answers now and drives the second phase after its answer.
        let own_post = self.route_of[ci as usize].is_none() && !s.coords[ci as usize].replay;
        if self.cfg.answer_on_decision
            && own_post
            && status == Status::Committing
            && s.coords[ci as usize].answer.is_none()
        {
            s.coords[ci as usize].answer = Some(Answer::Accepted);
            ctx.note(|| {
                format!(
                    "  {} answers {:?} on its decision; the second phase goes on",
                    self.coord_name(ci),
                    Answer::Accepted
                )
            });
            self.event(s, Event::AnsweredOnDecision);
        }
        self.invoke_all(s, ci, tx, status == Status::Committing, &votes, ctx);
        s.coords[ci as usize].pc = CPc::DriveAwait { status };
        self.check_drive_done(s, ci, ctx);
    }

    /// Issue 32, `run` once PREPARED is recorded: `extend_locks` (a hold message, with the voted token, to every
    /// participant that locked something; best effort, its answer only logged) and the 202 PREPARED. (The code
    /// answers once the holds are answered or timed out; answering first adds only interleavings: a hold
    /// message may be late anyway.) A retried key answers the 202 and sends nothing.
    fn hold_and_answer(&self, s: &mut State, ci: u8, ctx: &mut Ctx) {
        let (tx, _) = self.execs[ci as usize];
        if !s.coords[ci as usize].replay {
            let votes = s.coords[ci as usize].votes.clone();
            for (p, v) in votes.iter().enumerate() {
                if let Vote::Prepared { token, read_only: false } = *v {
                    self.send(s, self.svc_of(tx, p), Req::Hold { tx, token }, None, ctx);
                }
            }
        }
        self.answer(s, ci, Answer::Held, ctx);
    }

    /// Issue 32, the coordinator's `decide_held` (`POST /transactions/{id}/commit` or `/abort`): the record read
    /// (folded into the write it leads to: each write is conditional on the status read, and a write that
    /// loses is followed from the status found); `abort_expired` first (PREPARING past its deadline, PREPARED
    /// past its `holdUntil`, and twice the margin, by this coordinator's clock: ABORTING); then the caller's
    /// decision, conditional on the status read: a commit only from PREPARED and while this coordinator's clock
    /// is at or before `holdUntil` (past it: the abort instead), 503 from PREPARING; an abort from PREPARED or
    /// PREPARING. A decided record is driven (`drive_within`), a terminal one answered.
    fn route_step(&self, s: &mut State, ci: u8, ctx: &mut Ctx) {
        let (tx, _) = self.execs[ci as usize];
        let me = ci as usize;
        let route = self.route_of[me].expect("a route call");
        let rec = s.record(tx).cloned().expect("a route call finds its record");
        if let Some(v) = rec.votes.clone() {
            s.coords[me].votes = v;
        }
        let from = rec.status;
        // Issue 47, before the fix: an operator's abort that read the record undecided (any earlier moment)
        // writes ABORTING unconditionally, over a decision made since.
        let unconditional = route == crate::config::Route::Operator
            && !self.cfg.switches.operator_writes_conditionally
            && from == Status::Committing;
        if !matches!(from, Status::Preparing | Status::Prepared) && !unconditional {
            return self.follow(s, ci, ctx);
        }
        if route == crate::config::Route::Operator {
            return self.operator_abort(s, ci, from, ctx);
        }
        let expired = if from == Status::Prepared {
            self.hold_resolver_reads_past(s, tx, ctx)
        } else {
            self.resolver_reads_past(s, tx, ctx)
        };
        let commit = !expired && route == crate::config::Route::Commit;
        if commit && from == Status::Preparing {
            ctx.note(|| "  still preparing: 503".into());
            return self.answer(s, ci, Answer::Unavailable { aborted: false }, ctx);
        }
        let in_time = commit
            && !ctx.reads_past(self.hold_coord_reading(s, tx), || "the coordinator's clock past holdUntil".into());
        if in_time {
            if s.hold_phase(tx) >= phase::RESOLVABLE {
                self.violate(s, Violation::CommitAfterHold, ctx);
            }
            self.event(s, Event::HeldCommitted);
            self.set_status(s, tx, Status::Committing, None, ctx);
        } else {
            // The caller's abort, or its hold expired: a reason to abort.
            s.ghost.reason |= bit(tx);
            if expired && from == Status::Prepared {
                self.held_expiry_abort(s, tx, ctx);
                if route == crate::config::Route::Commit {
                    // The commit came after the expiry: 409.
                    self.event(s, Event::CommitRouteExpired);
                }
            } else if commit {
                ctx.note(|| "  past holdUntil: the abort instead".into());
                self.event(s, Event::CommitRouteExpired);
            } else if !expired && from == Status::Prepared {
                self.event(s, Event::HeldAborted);
            } else if !expired {
                self.event(s, Event::AbortBeforeHold);
            }
            self.set_status(s, tx, Status::Aborting, None, ctx);
        }
        if ctx.lost_reply(s) {
            s.coords[me].retrying = true;
            s.coords[me].pc = CPc::HeldRetry;
            return;
        }
        let status = s.status(tx).expect("decided");
        self.drive(s, ci, status, ctx);
    }

    /// Issue 47, `POST /admin/transactions/{id}/abort` (`coordinator/admin.rs`, `abort` → `decide_on_chain`)
    /// of an undecided record, held or not: the status read → ABORTING ("aborted by an operator", a reason to
    /// abort), in one step with its read as the caller's abort (the write is conditional on the status read;
    /// lost, the record found is followed, which `route_step` does when it reads a decided one); then driven,
    /// 200 (or 409 if a commit won). No clock is read: an operator's abort is an abort whatever the deadline
    /// or `holdUntil` (`decide_on_chain`'s `abort_expired` aborts it all the same, with the expiry's reason).
    fn operator_abort(&self, s: &mut State, ci: u8, from: Status, ctx: &mut Ctx) {
        let (tx, _) = self.execs[ci as usize];
        let me = ci as usize;
        s.ghost.reason |= bit(tx);
        match from {
            Status::Prepared => self.event(s, Event::OperatorAbortedHeld),
            Status::Preparing => self.event(s, Event::OperatorAbortedPreparing),
            // `operator_writes_conditionally` off: over a commit.
            _ => {}
        }
        // Its coordinator decided commit (or the hold), and its write comes next: it loses to this one.
        let committing = self.execs_of(tx).any(|o| {
            matches!(s.coords[o as usize].pc, CPc::WriteDecision { to: Status::Committing | Status::Prepared })
        });
        if committing {
            self.event(s, Event::CommitLostToOperator);
        }
        self.set_status(s, tx, Status::Aborting, None, ctx);
        if ctx.lost_reply(s) {
            s.coords[me].retrying = true;
            s.coords[me].pc = CPc::HeldRetry;
            return;
        }
        self.drive(s, ci, Status::Aborting, ctx);
    }

    /// Abort everyone it may have locked, then answer (409 if `recorded`, else 503).
    fn abort_all(&self, s: &mut State, ci: u8, then: CPc, ctx: &mut Ctx) {
        let (tx, _) = self.execs[ci as usize];
        let votes = s.coords[ci as usize].votes.clone();
        self.invoke_all(s, ci, tx, false, &votes, ctx);
        s.coords[ci as usize].pc = then;
        self.check_abort_done(s, ci, ctx);
    }

    /// Follows a record someone else decided (`with_votes`, then `finish`).
    fn follow(&self, s: &mut State, ci: u8, ctx: &mut Ctx) {
        let (tx, _) = self.execs[ci as usize];
        let rec = s.record(tx).cloned().expect("a record to follow");
        let c = &mut s.coords[ci as usize];
        c.retrying = false;
        if let Some(v) = rec.votes {
            c.votes = v;
        }
        match rec.status {
            Status::Committing | Status::Aborting | Status::Prepared => self.drive(s, ci, rec.status, ctx),
            status => self.answer_for(s, ci, status, ctx),
        }
    }

    /// `PhaseEngine::prepare`: send prepare to every participant at once.
    fn send_prepares(&self, s: &mut State, ci: u8, ctx: &mut Ctx) {
        let (tx, e) = self.execs[ci as usize];
        s.ghost.executed_by[tx as usize] |= 1 << e;
        for p in 0..self.nparts(tx) {
            s.coords[ci as usize].inv[p] = Inv::Waiting;
            let req = Req::Prepare { tx, exec: e, copy: 0 };
            self.send(s, self.svc_of(tx, p), req, Some(Dest { actor: ci, slot: p as u8 }), ctx);
        }
        s.coords[ci as usize].pc = CPc::CollectVotes;
        self.progress(s);
    }

    fn coord_step(&self, s: &mut State, ci: u8, ctx: &mut Ctx) {
        let (tx, e) = self.execs[ci as usize];
        let spec = &self.cfg.txs[tx as usize];
        let sw = self.cfg.switches;
        let me = ci as usize;
        let pc = s.coords[me].pc;
        let retrying = std::mem::take(&mut s.coords[me].retrying);
        match pc {
            CPc::Start if self.route_of[me].is_some() => self.route_step(s, ci, ctx),
            CPc::HeldRetry => {
                // The retry's condition (the status it read) fails on its own write: follow the record.
                self.event(s, Event::OwnWriteRecognised);
                self.follow(s, ci, ctx);
            }
            CPc::Start => {
                // the coordinator's `submit` → `run`.
                self.progress(s);
                if spec.one_phase() {
                    // `run_one_phase`: the sole participant commits with the COMMITTED record.
                    s.coords[me].inv[0] = Inv::Waiting;
                    let req = Req::OnePhase { tx, exec: e, copy: 0 };
                    self.send(s, spec.parts[0].svc, req, Some(Dest { actor: ci, slot: 0 }), ctx);
                    s.coords[me].pc = CPc::OnePhaseWait;
                } else if spec.keyed {
                    s.coords[me].pc = CPc::CreatePreparing;
                    self.coord_step(s, ci, ctx);
                } else {
                    self.send_prepares(s, ci, ctx);
                }
            }
            CPc::CreatePreparing => {
                // record/store.rs `TransactionStore::create` (attribute_not_exists), the keyed record first;
                // then `PhaseEngine::prepare`.
                match s.record(tx) {
                    None => {
                        let rec = Record::new(Status::Preparing, e, None);
                        self.write_record(s, tx, rec, ctx);
                        if ctx.lost_reply(s) {
                            s.coords[me].retrying = true;
                        } else {
                            self.send_prepares(s, ci, ctx);
                        }
                    }
                    Some(r) if sw.recognise_own_writes && r.exec == e && r.status == Status::Preparing => {
                        // The fix (defect 8): my own write whose reply was lost (`create_own`: this execution's
                        // id and the status it wrote; a record moved on since, e.g. aborted by a resolver, is
                        // replayed).
                        self.event(s, Event::OwnWriteRecognised);
                        self.send_prepares(s, ci, ctx);
                    }
                    Some(_) => {
                        // Another execution's record (today: also my own): replay it.
                        self.event(s, Event::Replayed);
                        s.coords[me].pc = CPc::Replay;
                        s.coords[me].replay = true;
                    }
                }
            }
            CPc::Decide => self.decide(s, ci, ctx),
            CPc::WriteDecision { to } => {
                if ctx.refused(s) {
                    // Every attempt refused (a 4xx): not applied, unless an earlier attempt's reply was
                    // lost (`retrying` keeps that outcome unknown).
                    s.ghost.reason |= bit(tx);
                    return self.decision_failed(s, ci, to, retrying && sw.refusal_after_unknown_is_unknown, true, ctx);
                }
                let votes = s.coords[me].votes.clone();
                if spec.keyed {
                    // record/store.rs `transition` PREPARING → to (condition status = PREPARING), with the votes
                    // (and, for an abort, the reason): a write that makes the record larger.
                    if s.status(tx) == Some(Status::Preparing) {
                        if ctx.for_size(s, tx) {
                            s.ghost.reason |= bit(tx);
                            // The shortened form: ABORTING keeps the participants as they are; COMMITTING
                            // must add the votes' lock tokens, and may still be too large.
                            let fits = to == Status::Aborting || ctx.commit_fits();
                            if !(sw.shortened_writes && fits) {
                                // Refused as invalid: `retrying` returns the error at once (the record is
                                // still PREPARING: no earlier attempt applied), and the abort is written
                                // over it.
                                return self.decision_failed(s, ci, to, false, false, ctx);
                            }
                            self.event(s, Event::ShortenedWrite);
                            if to == Status::Committing {
                                self.event(s, Event::ShortenedCommit);
                            }
                            // (A hold's shortened form keeps the votes too, as a commit's.)
                            let kept = if to != Status::Aborting { Some(votes) } else { None };
                            self.set_status(s, tx, to, kept, ctx);
                        } else {
                            self.set_status(s, tx, to, Some(votes), ctx);
                        }
                        if ctx.lost_reply(s) {
                            s.coords[me].retrying = true;
                        } else {
                            self.drive(s, ci, to, ctx);
                        }
                        return;
                    }
                    if retrying && s.status(tx) == Some(to) {
                        self.event(s, Event::OwnWriteRecognised);
                    }
                    // Lost: my own write (retry), or lock resolution aborted it first: follow.
                    return self.follow(s, ci, ctx);
                }
                // Unkeyed commit: create the record COMMITTING (attribute_not_exists).
                match s.record(tx) {
                    None => {
                        let rec = Record::new(Status::Committing, e, Some(votes));
                        self.write_record(s, tx, rec, ctx);
                        if ctx.lost_reply(s) {
                            s.coords[me].retrying = true;
                        } else {
                            self.drive(s, ci, Status::Committing, ctx);
                        }
                    }
                    Some(r) if r.exec == e => {
                        self.event(s, Event::OwnWriteRecognised);
                        self.follow(s, ci, ctx);
                    }
                    Some(r) if r.status == Status::Aborted => {
                        // Lock resolution recorded it ABORTED first: abort everyone, answer 409.
                        self.event(s, Event::CommitLostToResolution);
                        self.abort_all(s, ci, CPc::AbortAwait { recorded: true }, ctx);
                    }
                    Some(_) => self.follow(s, ci, ctx),
                }
            }
            CPc::Fence { unknown } => self.fence(s, ci, unknown, retrying, ctx),
            CPc::AbortCreate => {
                // `create_abort`: create the ABORTED record (conditional; 503 if it cannot be written).
                if ctx.refused(s) {
                    s.ghost.reason |= bit(tx);
                    s.coords[me].pc = CPc::AbortAwait { recorded: false };
                    return self.check_abort_done(s, ci, ctx);
                }
                if s.record(tx).is_none() {
                    let votes = s.coords[me].votes.clone();
                    let rec = Record::new(Status::Aborted, e, Some(votes));
                    self.write_record(s, tx, rec, ctx);
                    if ctx.lost_reply(s) {
                        s.coords[me].retrying = true;
                        return;
                    }
                } else if retrying {
                    self.event(s, Event::OwnWriteRecognised);
                }
                s.coords[me].pc = CPc::AbortAwait { recorded: true };
                self.check_abort_done(s, ci, ctx);
            }
            CPc::TerminalWrite { to } => {
                // record/store.rs `transition` COMMITTING → COMMITTED / ABORTING → ABORTED.
                let from = if to == Status::Committed { Status::Committing } else { Status::Aborting };
                if s.status(tx) == Some(from) {
                    self.set_status(s, tx, to, None, ctx);
                    if ctx.lost_reply(s) {
                        s.coords[me].retrying = true;
                        return;
                    }
                    return self.answer_for(s, ci, to, ctx);
                }
                if retrying && s.status(tx) == Some(to) {
                    self.event(s, Event::OwnWriteRecognised);
                }
                let status = s.status(tx).expect("a decided record");
                self.answer_for(s, ci, status, ctx);
            }
            CPc::Replay => {
                // `replay`: it waits while the record is open and its clock is at or before the deadline
                // and twice the margin (the first execution may still be at work); then `abort_expired`
                // (PREPARING) or `drive_within` (decided). (The answer budget may end the wait first:
                // `Action::Budget`.)
                let rec = s.record(tx).cloned().expect("replay follows a record");
                if rec.status.terminal() {
                    self.event(s, Event::ReplayAnswered);
                    return self.answer_for(s, ci, rec.status, ctx);
                }
                if rec.status == Status::Prepared {
                    // Issue 32: held: the 202 PREPARED at once; past `holdUntil + 2M`, `abort_expired` first
                    // (the read folded into its conditional write).
                    if !self.hold_resolver_reads_past(s, tx, ctx) {
                        self.event(s, Event::ReplayAnswered);
                        return self.answer_for(s, ci, Status::Prepared, ctx);
                    }
                    s.ghost.reason |= bit(tx);
                    self.held_expiry_abort(s, tx, ctx);
                    self.set_status(s, tx, Status::Aborting, None, ctx);
                    if let Some(v) = rec.votes {
                        s.coords[me].votes = v;
                    }
                    if ctx.lost_reply(s) {
                        s.coords[me].retrying = true;
                        s.coords[me].pc = CPc::HeldRetry;
                        return;
                    }
                    return self.drive(s, ci, Status::Aborting, ctx);
                }
                if !self.resolver_reads_past(s, tx, ctx) {
                    // Still waiting: no step.
                    ctx.void = true;
                    return;
                }
                if rec.status == Status::Preparing {
                    s.coords[me].pc = CPc::RecoverTransition;
                } else {
                    s.coords[me].votes = rec.votes.unwrap_or_else(|| vec![Vote::Unknown; spec.parts.len()]);
                    self.drive(s, ci, rec.status, ctx);
                }
            }
            CPc::RecoverTransition => {
                // `abort_expired`: PREPARING past its deadline and twice the margin → ABORTING with a
                // reason (the rule lock resolution uses): a write that makes the record larger.
                if s.status(tx) == Some(Status::Preparing) {
                    if ctx.for_size(s, tx) {
                        if !sw.shortened_writes {
                            // Before issue 27: `recover` fails: 503, the outcome unknown to the client.
                            return self.answer(s, ci, Answer::Unavailable { aborted: false }, ctx);
                        }
                        self.event(s, Event::ShortenedWrite);
                    }
                    self.set_status(s, tx, Status::Aborting, None, ctx);
                    if ctx.lost_reply(s) {
                        s.coords[me].retrying = true;
                        return;
                    }
                    s.coords[me].votes = vec![Vote::Unknown; spec.parts.len()];
                    return self.drive(s, ci, Status::Aborting, ctx);
                }
                self.follow(s, ci, ctx);
            }
            CPc::OnePhaseGet => {
                let status = s.status(tx).expect("RECORD_EXISTS");
                self.answer_for(s, ci, status, ctx);
            }
            CPc::OnePhaseAbort => {
                // `run_one_phase`: create the record ABORTED (conditional): of the participant's write
                // and this one, exactly one exists. Refused: 503, outcome unknown (a late copy may commit).
                if ctx.refused(s) {
                    s.ghost.reason |= bit(tx);
                    return self.answer(s, ci, Answer::Unavailable { aborted: false }, ctx);
                }
                match s.record(tx) {
                    None => {
                        let votes = s.coords[me].votes.clone();
                        let rec = Record::new(Status::Aborted, e, Some(votes));
                        self.write_record(s, tx, rec, ctx);
                        if ctx.lost_reply(s) {
                            s.coords[me].retrying = true;
                            return;
                        }
                        self.answer(s, ci, Answer::Conflict, ctx);
                    }
                    Some(r) => {
                        let status = r.status;
                        if retrying {
                            self.event(s, Event::OwnWriteRecognised);
                        }
                        self.answer_for(s, ci, status, ctx);
                    }
                }
            }
            CPc::CollectVotes | CPc::AbortAwait { .. } | CPc::DriveAwait { .. } | CPc::OnePhaseWait | CPc::Done => {
                unreachable!("{pc:?} has no step of its own")
            }
        }
    }

    /// A decision write that failed (`refused`: by a 4xx, else as invalid for its size); `unknown`: an
    /// earlier attempt may have applied it. the coordinator's `PhaseEngine::settle` / `create_commit`:
    /// the abort is written over it (the fence), and the record then says what happened.
    fn decision_failed(&self, s: &mut State, ci: u8, to: Status, unknown: bool, refused: bool, ctx: &mut Ctx) {
        let (tx, _) = self.execs[ci as usize];
        let sw = self.cfg.switches;
        if refused && !sw.refusal_after_unknown_is_unknown {
            // design.md taken literally: a refusal is "certainly not applied": abort at once.
            return self.decision_refused(s, ci, to, ctx);
        }
        if !sw.release_on_refused_decision {
            // Before issue 19 (defect 10): 503 at once, nothing released, no fence.
            if !unknown {
                s.ghost.no_commit |= bit(tx);
            }
            return self.answer(s, ci, Answer::Unavailable { aborted: !unknown }, ctx);
        }
        if !refused {
            self.event(s, Event::SizeRefusedDecisionFenced);
        }
        s.coords[ci as usize].pc = CPc::Fence { unknown };
    }

    /// The fence: the abort written conditionally over a decision write that failed. Keyed: `transition`
    /// PREPARING → ABORTING with the votes and a reason (a write that makes the record larger; refused
    /// for size, it is written shortened, which always fits); unkeyed: `create` ABORTED (a first
    /// write). Refused (every attempt, a 4xx): `unrecorded_decision`.
    fn fence(&self, s: &mut State, ci: u8, unknown: bool, retrying: bool, ctx: &mut Ctx) {
        let (tx, e) = self.execs[ci as usize];
        let me = ci as usize;
        let sw = self.cfg.switches;
        if ctx.refused(s) {
            return self.unrecorded_decision(s, ci, unknown, ctx);
        }
        if self.cfg.txs[tx as usize].keyed {
            if s.status(tx) == Some(Status::Preparing) {
                if ctx.for_size(s, tx) {
                    if !sw.shortened_writes {
                        return self.unrecorded_decision(s, ci, unknown, ctx);
                    }
                    // The shortened ABORTING: the participants as they are, no reason.
                    self.event(s, Event::ShortenedWrite);
                    self.event(s, Event::FenceShortened);
                    self.set_status(s, tx, Status::Aborting, None, ctx);
                } else {
                    let votes = s.coords[me].votes.clone();
                    self.set_status(s, tx, Status::Aborting, Some(votes), ctx);
                }
                self.event(s, Event::RefusedDecisionReleased);
                if ctx.lost_reply(s) {
                    self.event(s, Event::FenceLostReply);
                    s.coords[me].retrying = true;
                    return;
                }
                return self.drive(s, ci, Status::Aborting, ctx);
            }
            match s.status(tx) {
                Some(Status::Aborting | Status::Aborted) if retrying => self.event(s, Event::OwnWriteRecognised),
                Some(Status::Committing | Status::Committed) => self.event(s, Event::FenceFoundDecision),
                _ => {}
            }
            // `Transition::Lost`: my decision after all (its outcome was unknown), my own fence (a retry),
            // or lock resolution's abort: follow the record.
            return self.follow(s, ci, ctx);
        }
        match s.record(tx).cloned() {
            None => {
                let votes = s.coords[me].votes.clone();
                self.write_record(s, tx, Record::new(Status::Aborted, e, Some(votes)), ctx);
                self.event(s, Event::RefusedDecisionReleased);
                if ctx.lost_reply(s) {
                    self.event(s, Event::FenceLostReply);
                    s.coords[me].retrying = true;
                    return;
                }
                self.abort_all(s, ci, CPc::AbortAwait { recorded: true }, ctx);
            }
            Some(r) if r.exec == e && r.status == Status::Aborted => {
                // `create_own`: my own fence, whose reply was lost.
                self.event(s, Event::OwnWriteRecognised);
                self.abort_all(s, ci, CPc::AbortAwait { recorded: true }, ctx);
            }
            Some(r) if r.exec == e => {
                // My COMMITTING decision applied after all: follow it.
                self.event(s, Event::FenceFoundDecision);
                self.follow(s, ci, ctx);
            }
            Some(_) => {
                // Lock resolution recorded it ABORTED first: release the rest, answer 409.
                self.event(s, Event::CommitLostToResolution);
                self.abort_all(s, ci, CPc::AbortAwait { recorded: true }, ctx);
            }
        }
    }

    /// the coordinator's `unrecorded_decision`: neither the decision nor the fence could be written. If the
    /// decision certainly did not apply, the transaction is aborted and its locks released before the
    /// 503; if it may have (`unknown`), nothing is released and the 503 says the outcome is unknown.
    fn unrecorded_decision(&self, s: &mut State, ci: u8, unknown: bool, ctx: &mut Ctx) {
        let (tx, _) = self.execs[ci as usize];
        if unknown {
            self.event(s, Event::UnknownLeftToRecovery);
            return self.answer(s, ci, Answer::Unavailable { aborted: false }, ctx);
        }
        s.ghost.no_commit |= bit(tx);
        self.abort_decided(s, tx, ctx);
        self.event(s, Event::RefusedDecisionReleased);
        self.event(s, Event::UnrecordedReleased);
        self.abort_all(s, ci, CPc::AbortAwait { recorded: false }, ctx);
    }

    /// design.md taken literally (`refusal_after_unknown_is_unknown` off): a refused decision write
    /// certainly did not apply; abort at once.
    fn decision_refused(&self, s: &mut State, ci: u8, to: Status, ctx: &mut Ctx) {
        let (tx, _) = self.execs[ci as usize];
        s.ghost.no_commit |= bit(tx);
        if !self.cfg.switches.release_on_refused_decision {
            // Today: 503 at once, nothing released.
            return self.answer(s, ci, Answer::Unavailable { aborted: true }, ctx);
        }
        // The fix (defect 10): the transaction is aborted; release every lock before answering.
        self.abort_decided(s, tx, ctx);
        self.event(s, Event::RefusedDecisionReleased);
        if self.cfg.txs[tx as usize].keyed {
            if to != Status::Aborting {
                // Record the abort (PREPARING → ABORTING), then drive it as any abort.
                s.coords[ci as usize].pc = CPc::WriteDecision { to: Status::Aborting };
            } else {
                // Even the abort cannot be written: release everything, answer 503.
                self.abort_all(s, ci, CPc::AbortAwait { recorded: false }, ctx);
            }
        } else {
            // `create_abort`: abort to the participants and create the ABORTED record.
            self.abort_all(s, ci, CPc::AbortCreate, ctx);
        }
    }

    /// `run`: all PREPARED and now ≤ deadline → commit, else abort. The clock is read here; the
    /// decision write is the next step (lock resolution may come between).
    fn decide(&self, s: &mut State, ci: u8, ctx: &mut Ctx) {
        let (tx, _) = self.execs[ci as usize];
        let me = ci as usize;
        let all_prepared = s.coords[me].votes.iter().all(|v| matches!(v, Vote::Prepared { .. }));
        let commit = all_prepared && !s.passed(tx);
        let held = self.cfg.txs[tx as usize].held;
        ctx.note(|| {
            format!(
                "  decide: {}",
                if !commit {
                    "abort"
                } else if held {
                    "hold"
                } else {
                    "commit"
                }
            )
        });
        if commit {
            // Issue 32: a held transaction is recorded PREPARED (its `hold` write) instead.
            let to = if held { Status::Prepared } else { Status::Committing };
            s.coords[me].pc = CPc::WriteDecision { to };
            return;
        }
        s.ghost.no_commit |= bit(tx);
        self.abort_decided(s, tx, ctx);
        // An abort's write races nothing that could commit: it is done in the same step.
        if self.cfg.txs[tx as usize].keyed {
            s.coords[me].pc = CPc::WriteDecision { to: Status::Aborting };
        } else {
            // `create_abort`: abort to the participants and create the ABORTED record.
            self.abort_all(s, ci, CPc::AbortCreate, ctx);
        }
        self.coord_step(s, ci, ctx);
    }

    fn check_abort_done(&self, s: &mut State, ci: u8, ctx: &mut Ctx) {
        let c = &mut s.coords[ci as usize];
        let CPc::AbortAwait { recorded } = c.pc else { return };
        if c.inv.contains(&Inv::Waiting) {
            return;
        }
        for (p, x) in c.inv.iter().enumerate() {
            if *x == Inv::Failed {
                c.abort_unacked |= 1 << p;
            }
        }
        let a = if recorded { Answer::Conflict } else { Answer::Unavailable { aborted: true } };
        self.answer(s, ci, a, ctx);
    }

    fn check_drive_done(&self, s: &mut State, ci: u8, ctx: &mut Ctx) {
        let leave_open = self.leaves_abort_open(s, ci);
        let c = &mut s.coords[ci as usize];
        let CPc::DriveAwait { status } = c.pc else { return };
        if c.inv.contains(&Inv::Waiting) {
            return;
        }
        if !c.inv.contains(&Inv::Failed) {
            if status == Status::Aborting && leave_open {
                // Issue 48: the releases are acknowledged, but a late prepare may still lock after them: the
                // record stays open (ABORTING, `sweepAt` = the deadline), the sweeper finishes it.
                self.event(s, Event::UncleanAbortLeftOpen);
                ctx.note(|| "  an unclean prepare: ABORTING left open for the sweeper".into());
                return self.answer_for(s, ci, status, ctx);
            }
            c.pc = CPc::TerminalWrite { to: status.terminal_of() };
            return;
        }
        if status == Status::Aborting {
            for (p, x) in c.inv.iter().enumerate() {
                if *x == Inv::Failed {
                    c.abort_unacked |= 1 << p;
                }
            }
        }
        // Not every participant acknowledged: answer the record (202 / 409), the sweeper finishes.
        self.answer_for(s, ci, status, ctx);
    }

    /// An answer (or a give-up: `ans` None) for invocation `d`.
    fn deliver_rep(&self, s: &mut State, d: Dest, ans: Option<Ans>, ctx: &mut Ctx) {
        self.orphan(s, d);
        if d.actor == SWEEPER {
            return self.sweeper_rep(s, d, ans, ctx);
        }
        let ci = d.actor;
        let me = ci as usize;
        let p = d.slot as usize;
        match s.coords[me].pc {
            CPc::CollectVotes => {
                let vote = match ans {
                    Some(Ans::Vote(v)) => v,
                    _ => Vote::NoAnswer,
                };
                s.coords[me].votes[p] = vote;
                s.coords[me].inv[p] = if ans.is_some() { Inv::Acked } else { Inv::Failed };
                if !s.coords[me].inv.contains(&Inv::Waiting) {
                    s.coords[me].pc = CPc::Decide;
                    if !s.coords[me].votes.iter().all(|v| matches!(v, Vote::Prepared { .. })) {
                        // Abort whatever the clock says: decided in this same step.
                        self.decide(s, ci, ctx);
                    }
                }
            }
            CPc::OnePhaseWait => {
                s.coords[me].inv[0] = Inv::Acked;
                match ans {
                    Some(Ans::Committed) => self.answer(s, ci, Answer::Ok, ctx),
                    Some(Ans::RecordExists) => s.coords[me].pc = CPc::OnePhaseGet,
                    Some(Ans::Vote(v)) => {
                        s.coords[me].votes[0] = v;
                        s.coords[me].pc = CPc::OnePhaseAbort;
                    }
                    _ => {
                        s.coords[me].votes[0] = Vote::NoAnswer;
                        s.coords[me].pc = CPc::OnePhaseAbort;
                    }
                }
            }
            pc => {
                let commit = pc == CPc::DriveAwait { status: Status::Committing };
                let acked = match ans {
                    Some(Ans::Committed | Ans::NotPrepared) => commit,
                    Some(Ans::Aborted) => !commit,
                    _ => false,
                };
                s.coords[me].inv[p] = if acked { Inv::Acked } else { Inv::Failed };
                self.check_abort_done(s, ci, ctx);
                self.check_drive_done(s, ci, ctx);
            }
        }
    }

    // ----- sweeper -------------------------------------------------------------------------------

    /// Whether a scheduled sweeper run certainly has something to find, whatever its clock: an open
    /// record past its deadline and twice the margin (`open_before`), or a lock past its expiry and twice
    /// the margin (`expired_locks`).
    pub(crate) fn sweeper_has_work(&self, s: &State) -> bool {
        self.sweeper_work(s, Reading::Past)
    }

    /// Whether a sweeper run may find something, as its clock reads (also in the margin).
    pub(crate) fn sweeper_may_have_work(&self, s: &State) -> bool {
        self.sweeper_work(s, Reading::Either) || self.sweeper_work(s, Reading::Past)
    }

    /// (Issue 32: a lock of a PREPARED owner within its hold, expired at its deadline because its hold message
    /// was lost or is late, is work too: the run sends the hold it missed, which moves the lock to `holdUntil`.
    /// Before the fix, `resolver_extends_hold` off, the run left it, changing nothing: `SweeperStuck`.)
    fn sweeper_work(&self, s: &State, r: Reading) -> bool {
        (0..self.cfg.txs.len() as Tx).any(|tx| self.open(s, tx) && self.record_reading(s, tx) == r)
            || self.slots().any(|i| self.slot_indexed_lock(s, i).is_some_and(|_| self.slot_reading(s, i) == r))
    }

    fn open(&self, s: &State, tx: Tx) -> bool {
        s.record(tx).is_some_and(|r| !r.status.terminal())
    }

    /// How many clock checks a sweeper step may make that read either way (the [`Late`] bits it may use).
    pub(crate) fn sweeper_checks(&self, s: &State) -> u32 {
        let either = |tx: Tx| self.record_reading(s, tx) == Reading::Either;
        let locks_from = |svc: Svc| {
            self.slots()
                .filter(|&i| {
                    self.slot_svc(i) >= svc
                        && self.slot_indexed_lock(s, i).is_some()
                        && self.slot_reading(s, i) == Reading::Either
                })
                .count() as u32
        };
        self.hold_checks(s)
            + match &s.sweeper.pc {
                SPc::Idle => {
                    (0..self.cfg.txs.len() as Tx).filter(|&tx| self.open(s, tx) && either(tx)).count() as u32
                        + locks_from(0)
                }
                SPc::QueryLocks { svc } => locks_from(*svc),
                SPc::GetItem { item, .. } => {
                    (self.slot_lock(s, *item).is_some() && self.slot_reading(s, *item) == Reading::Either) as u32
                }
                _ => 0,
            }
    }

    /// `recover_transaction` of the next entry of this run's read, or on to the locks.
    fn sweep_next_tx(&self, s: &mut State, rest: &[Tx]) {
        s.sweeper.pc = match rest.split_first() {
            Some((&tx, rest)) => SPc::GetTx { tx, rest: rest.to_vec() },
            None => SPc::QueryLocks { svc: 0 },
        };
    }

    /// `recover_transaction`: read the record (folded into the index read for the first entry), then
    /// `recover`: PREPARING past its deadline and twice the margin (it was listed by the same clock) →
    /// ABORTING; COMMITTING/ABORTING → drive.
    fn sweep_recover(&self, s: &mut State, tx: Tx, rest: Vec<Tx>, ctx: &mut Ctx) {
        match s.record(tx).cloned() {
            Some(r) if r.status == Status::Preparing => {
                s.sweeper.pc = SPc::Transition { tx, from: Status::Preparing, rest }
            }
            // Issue 32: held (`abort_expired` by `holdUntil + 2M`), else its caller decides (`Skipped`).
            Some(r) if r.status == Status::Prepared => {
                if self.hold_resolver_reads_past(s, tx, ctx) {
                    s.sweeper.pc = SPc::Transition { tx, from: Status::Prepared, rest }
                } else {
                    self.sweep_next_tx(s, &rest)
                }
            }
            Some(r) if !r.status.terminal() => {
                s.sweeper.votes = r.votes.unwrap_or_else(|| vec![Vote::Unknown; self.nparts(tx)]);
                self.sweep_drive(s, tx, r.status, rest, ctx);
            }
            _ => self.sweep_next_tx(s, &rest),
        }
    }

    fn sweep_drive(&self, s: &mut State, tx: Tx, status: Status, rest: Vec<Tx>, ctx: &mut Ctx) {
        let votes = s.sweeper.votes.clone();
        self.invoke_all(s, SWEEPER, tx, status == Status::Committing, &votes, ctx);
        s.sweeper.pc = SPc::DriveAwait { tx, status, rest };
        self.check_sweeper_drive(s, ctx);
    }

    /// The locks index of a table (`expired_locks`: expired before `now - 2M` by the sweeper's clock,
    /// sorted by lockExpiresAt = the owner's deadline, at most K), read together with the first item and
    /// its owner's record.
    fn sweep_locks(&self, s: &mut State, svc: Svc, ctx: &mut Ctx) {
        let mut locked: Vec<(Tx, ItemId)> = vec![];
        for i in self.slots() {
            if self.slot_svc(i) != svc {
                continue;
            }
            // Issue 48: the locks index lists only indexed locks.
            if let Some(l) = self.slot_indexed_lock(s, i)
                && self.slot_reads_past(s, i, ctx)
            {
                locked.push((l.tx, i));
            }
        }
        locked.sort();
        locked.truncate(self.cfg.sweep_k as usize);
        match locked.split_first() {
            Some((&(_, item), rest)) => {
                let rest = rest.iter().map(|&(_, i)| i).collect();
                self.sweep_get_item(s, svc, item, rest, ctx)
            }
            // Nothing in this table: the next table's index is read in the same step.
            None if (svc as usize + 1) < self.cfg.services.len() => self.sweep_locks(s, svc + 1, ctx),
            None => self.sweep_next_item(s, svc, &[], ctx),
        }
    }

    fn sweep_next_item(&self, s: &mut State, svc: Svc, rest: &[ItemId], ctx: &mut Ctx) {
        s.sweeper.pc = match rest.split_first() {
            Some((&item, rest)) => SPc::GetItem { svc, item, rest: rest.to_vec() },
            None if (svc as usize + 1) < self.cfg.services.len() => SPc::QueryLocks { svc: svc + 1 },
            None => {
                // The run ends. It had something to do: it (or someone meanwhile) must have changed
                // something, else every later run would find the same, for ever.
                if s.ghost.seen & Event::Progress.bit() == 0 {
                    self.violate(s, Violation::SweeperStuck, ctx);
                }
                SPc::Idle
            }
        };
    }

    /// sweeper.rs `resolve_lock`: the item (still locked, expired?) and its owner's fate.
    fn sweep_get_item(&self, s: &mut State, svc: Svc, item: ItemId, rest: Vec<ItemId>, ctx: &mut Ctx) {
        let lock = self.slot_lock(s, item);
        match lock {
            // Still locked, and past its expiry and twice the margin by the sweeper's clock (read again: a
            // lock listed already reads past; another transaction's lock since is checked anew).
            Some(l) if self.slot_reads_past(s, item, ctx) => {
                let fate = self.fate(s, l.tx, svc, ctx);
                self.sweep_resolve(s, svc, item, l.tx, rest, fate, ctx)
            }
            _ => self.sweep_next_item(s, svc, &rest, ctx),
        }
    }

    /// The sweeper sends commit or abort for lock resolution (sweeper.rs `resolve_lock`).
    #[allow(clippy::too_many_arguments)]
    fn sweep_resolve(
        &self,
        s: &mut State,
        svc: Svc,
        item: ItemId,
        owner: Tx,
        rest: Vec<ItemId>,
        fate: Fate,
        ctx: &mut Ctx,
    ) {
        let req = match fate {
            Fate::Absent => {
                s.sweeper.pc = SPc::OwnerCreate { svc, item, owner, rest };
                return;
            }
            Fate::Transition(from) => {
                s.sweeper.pc = SPc::OwnerTransition { svc, item, owner, from, rest };
                return;
            }
            // Issue 32: a PREPARED owner within its hold: `LockOutcome::Waiting`, on to the next lock (before
            // the fix; with it, Held).
            Fate::Undecided => {
                self.left_undecided(s, owner, item, ctx);
                return self.sweep_next_item(s, svc, &rest, ctx);
            }
            // Issue 32 (the fix): the hold it missed, so that the lock leaves the head of the index until
            // `holdUntil` (`Action::Hold` with the voted lockToken); awaited, then `LockOutcome::Waiting`.
            Fate::Held(token) => {
                ctx.note(|| format!("  owner {} is held (PREPARED): the hold it missed", self.tx_name(owner)));
                self.moves_held_lock(s, owner, item, Event::SweeperMovesHeldLock);
                Req::Hold { tx: owner, token }
            }
            Fate::Commit(token) => {
                self.event(s, Event::SweeperRollForward);
                Req::Commit { tx: owner, token }
            }
            // A lock of a finished commit came from a late copy; or the owner aborted: key-only abort.
            Fate::Release => Req::Abort { tx: owner, item: Some(item) },
        };
        for x in s.sweeper.inv.iter_mut() {
            *x = Inv::Idle;
        }
        s.sweeper.inv[0] = Inv::Waiting;
        self.send(s, svc, req, Some(Dest { actor: SWEEPER, slot: 0 }), ctx);
        s.sweeper.pc = SPc::LockAwait { svc, rest };
    }

    fn sweep_step(&self, s: &mut State, ctx: &mut Ctx) {
        let retrying = std::mem::take(&mut s.sweeper.retrying);
        let pc = s.sweeper.pc.clone();
        match pc {
            SPc::Idle => {
                // A run starts: `open_before` (sweepAt before `now - 2M` by its clock: the deadline, or a
                // postponement's later time; sorted by sweepAt), at most K; the first one's record.
                s.ghost.seen &= !Event::Progress.bit();
                if !self.sweeper_has_work(s) {
                    // A run whose clock may read nothing due (the margin): nothing is asked of it.
                    self.progress(s);
                }
                let mut due: Vec<Tx> = vec![];
                for tx in 0..self.cfg.txs.len() as Tx {
                    if self.open(s, tx) && self.record_reads_past(s, tx, ctx) {
                        due.push(tx);
                    }
                }
                due.sort_by_key(|&tx| (s.record(tx).map(|r| r.sweep_at), tx));
                due.truncate(self.cfg.sweep_k as usize);
                match due.split_first() {
                    Some((&tx, rest)) => self.sweep_recover(s, tx, rest.to_vec(), ctx),
                    None => self.sweep_locks(s, 0, ctx),
                }
            }
            SPc::GetTx { tx, rest } => self.sweep_recover(s, tx, rest, ctx),
            SPc::Transition { tx, from, rest } => {
                // `Coordinator::recover`: PREPARING past its deadline (PREPARED past its `holdUntil`) and twice
                // the margin → ABORTING, with a reason: a write that makes the record larger.
                if s.status(tx) == Some(from) {
                    if ctx.for_size(s, tx) {
                        if !self.cfg.switches.shortened_writes {
                            // Before issue 27: `recover` fails; the entry is postponed.
                            s.sweeper.pc = SPc::Postpone { tx, rest };
                            return;
                        }
                        self.event(s, Event::ShortenedWrite);
                    }
                    if from == Status::Prepared {
                        self.held_expiry_abort(s, tx, ctx);
                    }
                    self.set_status(s, tx, Status::Aborting, None, ctx);
                    if ctx.lost_reply(s) {
                        s.sweeper.retrying = true;
                        return;
                    }
                    s.sweeper.votes = vec![Vote::Unknown; self.nparts(tx)];
                    return self.sweep_drive(s, tx, Status::Aborting, rest, ctx);
                }
                self.sweep_recover(s, tx, rest, ctx);
            }
            SPc::Terminal { tx, to, rest } => {
                let from = if to == Status::Committed { Status::Committing } else { Status::Aborting };
                if s.status(tx) == Some(from) {
                    self.set_status(s, tx, to, None, ctx);
                    self.event(s, Event::SweeperFinished);
                    if ctx.lost_reply(s) {
                        s.sweeper.retrying = true;
                        return;
                    }
                } else if retrying {
                    self.event(s, Event::OwnWriteRecognised);
                }
                self.sweep_next_tx(s, &rest);
            }
            SPc::QueryLocks { svc } => self.sweep_locks(s, svc, ctx),
            SPc::GetItem { svc, item, rest } => self.sweep_get_item(s, svc, item, rest, ctx),
            SPc::OwnerCreate { svc, item, owner, rest } => {
                if s.record(owner).is_none() {
                    self.event(s, Event::ResolutionRecordedAbort);
                    let rec = Record::new(Status::Aborted, NOBODY, None);
                    self.write_record(s, owner, rec, ctx);
                    if ctx.lost_reply(s) {
                        s.sweeper.retrying = true;
                        return;
                    }
                } else if retrying {
                    self.event(s, Event::OwnWriteRecognised);
                }
                let fate = self.fate(s, owner, svc, ctx);
                self.sweep_resolve(s, svc, item, owner, rest, fate, ctx);
            }
            SPc::OwnerTransition { svc, item, owner, from, rest } => {
                if s.status(owner) == Some(from) {
                    if ctx.for_size(s, owner) {
                        if !self.cfg.switches.shortened_writes {
                            // Before issue 27: `owner_fate` fails; on to the next lock.
                            return self.sweep_next_item(s, svc, &rest, ctx);
                        }
                        self.event(s, Event::ShortenedWrite);
                    }
                    if from == Status::Prepared {
                        self.held_expiry_abort(s, owner, ctx);
                    } else {
                        self.event(s, Event::ResolutionAbortedPreparing);
                    }
                    self.set_status(s, owner, Status::Aborting, None, ctx);
                    if ctx.lost_reply(s) {
                        s.sweeper.retrying = true;
                        return;
                    }
                } else if s.status(owner) == Some(Status::Preparing) {
                    self.left_undecided(s, owner, item, ctx);
                    return self.sweep_next_item(s, svc, &rest, ctx);
                } else if s.status(owner) == Some(Status::Prepared) {
                    // Issue 32, `Transition::Lost` to a hold recorded meanwhile: Held (before the fix, undecided).
                    let fate = self.held_fate(s, owner, svc);
                    return self.sweep_resolve(s, svc, item, owner, rest, fate, ctx);
                }
                let fate = self.fate(s, owner, svc, ctx);
                self.sweep_resolve(s, svc, item, owner, rest, fate, ctx);
            }
            SPc::Postpone { tx, rest } => {
                // record/store.rs `postpone`: `sweepAt` later, with the attempts and the error (a write that
                // makes the record larger), if the record is open (`attribute_exists(openShard)`), whatever
                // its status: this run's own recovery may have moved it PREPARING → ABORTING.
                if ctx.refused(s) {
                    // Not applied; the sweeper logs it and goes on: the entry stays where it is.
                    self.event(s, Event::PostponeRefused);
                    return self.sweep_next_tx(s, &rest);
                }
                if self.open(s, tx) {
                    let shortened = ctx.for_size(s, tx);
                    if shortened && !self.cfg.switches.shortened_writes {
                        // Before issue 27: refused, for ever; the entry never moves back.
                        ctx.note(|| "  not postponed".into());
                        return self.sweep_next_tx(s, &rest);
                    }
                    if let Some(r) = s.records[tx as usize].as_mut() {
                        r.sweep_at = (r.sweep_at + 1).min(3);
                    }
                    ctx.note(|| format!("  {}'s sweepAt pushed back", self.tx_name(tx)));
                    self.progress(s);
                    // Shortened: `sweepAt` only, the attempts and the error removed; it still moves back.
                    if shortened {
                        self.event(s, Event::ShortenedWrite);
                        self.event(s, Event::ShortenedPostpone);
                    } else {
                        self.event(s, Event::SweepAtPushed);
                    }
                    if ctx.lost_reply(s) {
                        // The SDK's retry sends the same values under the same condition: whatever it
                        // meets, it changes nothing this attempt did not (folded into this step).
                        self.event(s, Event::PostponeLostReply);
                    }
                }
                self.sweep_next_tx(s, &rest);
            }
            SPc::DriveAwait { .. } | SPc::LockAwait { .. } => unreachable!("waiting has no step"),
        }
    }

    fn check_sweeper_drive(&self, s: &mut State, _ctx: &mut Ctx) {
        let SPc::DriveAwait { tx, status, rest } = s.sweeper.pc.clone() else { return };
        if s.sweeper.inv.contains(&Inv::Waiting) {
            return;
        }
        if s.sweeper.inv.contains(&Inv::Failed) {
            // Defect 7's fix: an entry it could not finish is postponed (its own step).
            s.sweeper.pc = SPc::Postpone { tx, rest };
        } else {
            s.sweeper.pc = SPc::Terminal { tx, to: status.terminal_of(), rest };
        }
    }

    fn sweeper_rep(&self, s: &mut State, d: Dest, ans: Option<Ans>, ctx: &mut Ctx) {
        match s.sweeper.pc.clone() {
            SPc::DriveAwait { status, .. } => {
                let commit = status == Status::Committing;
                let acked = match ans {
                    Some(Ans::Committed | Ans::NotPrepared) => commit,
                    Some(Ans::Aborted) => !commit,
                    _ => false,
                };
                s.sweeper.inv[d.slot as usize] = if acked { Inv::Acked } else { Inv::Failed };
                self.check_sweeper_drive(s, ctx);
            }
            SPc::LockAwait { svc, rest } => {
                s.sweeper.inv[0] = Inv::Idle;
                self.sweep_next_item(s, svc, &rest, ctx);
            }
            pc => unreachable!("sweeper answer in {pc:?}"),
        }
    }
}

/// Before the decision is written: a deadline passing now is a reason to abort.
pub(crate) fn in_progress(pc: CPc) -> bool {
    matches!(
        pc,
        CPc::CreatePreparing
            | CPc::CollectVotes
            | CPc::Decide
            | CPc::WriteDecision { .. }
            | CPc::Fence { .. }
            | CPc::OnePhaseWait
    )
}
