//! Issue 31: a resource participant (participant/resource.rs `Driver`): an external payment API reached
//! through try (authorize), confirm (capture) and cancel (void), behind a barrier entry per transaction in
//! the service's own table.
//!
//! The resource is a process of its own with its key store (`State::res`): each call carries an
//! idempotency key per transaction and phase; the resource does a key's request once and answers a repeat
//! with the stored first answer. Try requests travel as messages (`State::rnet`) that may land late (after
//! the prepare gave up, after the abort and the cancel), twice, or never, and whose answer may be lost.
//! The confirm and the cancel (and the recheck's calls) are one step each with the resource: a late
//! repeat of either under its key only gets the stored answer, which the authorization's own state
//! already gives (`Res`).
//!
//! The barrier entry (`State::barriers`), each write one step with the code's condition:
//! - prepare: the cutoff check, then TRYING if there is no entry (`begin`: a put `attribute_not_exists`),
//!   and the first try request sent; an existing TRYING entry is the same try (its token); TRIED votes
//!   PREPARED with its token, REFUSED refuses, CANCELLED and CONFIRMED refuse (no try). The answer:
//!   TRYING → TRIED (conditioned on TRYING and the token) and PREPARED; a decline → REFUSED (nothing held).
//!   The write that fails (a cancel came first) refuses TIMEOUT.
//! - abort: no entry → CANCELLED (empty rollback, no call); TRYING or TRIED as read → `cancelled`
//!   (conditioned on TRYING or TRIED, a step of its own), its lock kept, due at the recheck; then, if the
//!   read was TRIED, the void of the known reservation under the cancel's key; CANCELLED → the void of a
//!   known reservation not voided yet, and once due (every try request landed or never will) the recheck:
//!   the try's request again under its key (the stored answer, or the try done now), the void of what it
//!   reserved under a key of its own, `rechecked` and the lock released.
//! - commit: TRIED with the voted token → capture under the confirm key, then TRIED → CONFIRMED (its own
//!   step); CONFIRMED → COMMITTED; else NOT_PREPARED.

use super::{Ctx, Reading};
use crate::config::{ItemId, Svc, Tx};
use crate::state::*;
use crate::{Event, TwoPc, Violation};

fn bit(tx: Tx) -> u8 {
    1 << tx
}

impl TwoPc {
    /// Lock slots: the items, then (with a resource) the barrier entry of each transaction, whose lock the
    /// sweeper finds in the locks index like an item's.
    pub(crate) fn slots(&self) -> std::ops::Range<ItemId> {
        let barriers = if self.cfg.resource.is_some() { self.cfg.txs.len() } else { 0 };
        0..(self.cfg.items.len() + barriers) as ItemId
    }

    /// The transaction whose barrier entry a slot is (None: an item).
    fn slot_barrier(&self, slot: ItemId) -> Option<Tx> {
        (slot as usize).checked_sub(self.cfg.items.len()).map(|tx| tx as Tx)
    }

    pub(crate) fn slot_svc(&self, slot: ItemId) -> Svc {
        match self.slot_barrier(slot) {
            None => self.cfg.items[slot as usize].svc,
            Some(_) => self.cfg.resource.expect("a barrier slot needs a resource"),
        }
    }

    pub(crate) fn slot_lock(&self, s: &State, slot: ItemId) -> Option<Lock> {
        match self.slot_barrier(slot) {
            None => s.items[slot as usize].lock,
            Some(tx) => s.barriers[tx as usize].filter(|e| e.lock).map(|e| Lock {
                tx,
                token: e.token,
                late: false,
                margin: false,
                pending: None,
                held: false,
                // A barrier entry's lock is always in the locks index (issue 48 leaves the resource as it is).
                indexed: true,
            }),
        }
    }

    /// Whether `tx` holds a lock anywhere (an item's, or its barrier entry's).
    pub(crate) fn holds_lock(&self, s: &State, tx: Tx) -> bool {
        self.slots().any(|i| self.slot_lock(s, i).is_some_and(|l| l.tx == tx))
    }

    /// A CANCELLED entry's lock expires at its recheck (`cancelled` moves `expiresAt` to `recheckAt`).
    fn recheck_lock(&self, s: &State, slot: ItemId) -> Option<Tx> {
        self.slot_barrier(slot).filter(|&tx| s.barriers[tx as usize].is_some_and(|e| e.state == BState::Cancelled))
    }

    /// What the sweeper's check of the lock in `slot` reads: an item's, a TRYING or TRIED entry's lock
    /// expires at its owner's deadline; a CANCELLED entry's once its recheck is due.
    pub(crate) fn slot_reading(&self, s: &State, slot: ItemId) -> Reading {
        let Some(l) = self.slot_lock(s, slot) else { return Reading::Before };
        match self.recheck_lock(s, slot) {
            Some(tx) if self.recheck_due(s, tx) => Reading::Past,
            Some(_) => Reading::Before,
            None => self.lock_reading(s, &l),
        }
    }

    /// The sweeper's check of the lock in `slot` (a step's reading, [`TwoPc::slot_reading`]).
    pub(super) fn slot_reads_past(&self, s: &mut State, slot: ItemId, ctx: &mut Ctx) -> bool {
        let Some(l) = self.slot_lock(s, slot) else { return false };
        match self.recheck_lock(s, slot) {
            Some(tx) => self.recheck_due(s, tx),
            None => self.lock_reads_past(s, l, ctx),
        }
    }

    /// A CANCELLED entry's recheck is due (`recheck_at`: the cutoff and `TRY_IN_FLIGHT_MS`): no try is sent
    /// after the cutoff, and a request lands within the time in flight or never. In the model: every clock
    /// past the deadline's last line, and no try request of T in flight (each landed or was lost).
    pub(crate) fn recheck_due(&self, s: &State, tx: Tx) -> bool {
        s.phase(tx) == phase::PAST && s.rnet.iter().all(|m| m.tx != tx)
    }

    fn entry(s: &mut State, tx: Tx) -> &mut Entry {
        s.barriers[tx as usize].as_mut().expect("a barrier entry")
    }

    fn note_entry(&self, s: &State, tx: Tx, ctx: &mut Ctx) {
        let e = s.barriers[tx as usize];
        ctx.note(|| format!("  barrier#{} := {e:?}", self.tx_name(tx)));
    }

    /// `Participant::handle` → `drive_resource`: a message arrives at the resource participant.
    pub(super) fn res_deliver(&self, s: &mut State, svc: Svc, req: Req, reply: Option<Dest>, ctx: &mut Ctx) {
        let t = Task { svc, req, reply, pc: TPc::RAbort, retrying: false, burned: 0 };
        match req {
            Req::Prepare { .. } => self.res_prepare(s, t, ctx),
            Req::Commit { .. } => self.res_commit(s, t, ctx),
            Req::Abort { .. } => self.res_abort(s, t, ctx),
            Req::OnePhase { .. } => unreachable!("a resource commits in two phases"),
            Req::Hold { .. } => unreachable!("no held transaction charges a resource in the model"),
        }
    }

    /// `Driver::prepare`: the cutoff check, the barrier's TRYING entry (`begin`), the first try request.
    fn res_prepare(&self, s: &mut State, mut t: Task, ctx: &mut Ctx) {
        let Req::Prepare { tx, exec, copy } = t.req else { unreachable!() };
        if self.past_cutoff(s, &t, ctx) {
            return self.refuse_late(s, t, ctx);
        }
        let mut token = 1 + (exec * 2 + copy) * 4;
        if self.cfg.switches.barrier {
            match s.barriers[tx as usize] {
                None => {
                    s.barriers[tx as usize] = Some(Entry {
                        state: BState::Trying,
                        token,
                        tried: false,
                        cancelled_call: false,
                        rechecked: false,
                        lock: true,
                    });
                    self.note_entry(s, tx, ctx);
                    self.progress(s);
                }
                Some(e) => match e.state {
                    BState::Trying => {
                        ctx.note(|| "  TRYING already (an earlier delivery): the same try, its token".into());
                        token = e.token;
                    }
                    BState::Tried => {
                        let vote = Vote::Prepared { token: e.token, read_only: false };
                        return self.finish(s, t, Ans::Vote(vote), ctx);
                    }
                    BState::Refused => return self.refuse(s, t, ctx),
                    BState::Cancelled | BState::Confirmed => {
                        ctx.note(|| format!("  the entry is {:?}: REFUSED TIMEOUT, no try", e.state));
                        self.event(s, Event::TryAfterCancel);
                        return self.refuse(s, t, ctx);
                    }
                },
            }
        }
        self.send_try(s, &t, ctx);
        t.pc = TPc::RTryAwait { token };
        s.tasks.push(t);
    }

    fn send_try(&self, s: &mut State, t: &Task, ctx: &mut Ctx) {
        let tx = t.req.tx();
        ctx.note(|| format!("  send a try request of {} (key {}:try)", self.tx_name(tx), self.tx_name(tx)));
        s.rnet.push(TryMsg { tx, from: Some(t.req) });
    }

    /// The resource does the try under T's key: the first request authorizes (or is declined, as T's card
    /// is) and its answer is stored; any later one gets the stored answer. Returns whether it reserved.
    fn try_under_key(&self, s: &mut State, tx: Tx, ctx: &mut Ctx) -> bool {
        match s.res[tx as usize] {
            Res::Unused => {
                let declined = s.declined & bit(tx) != 0;
                s.res[tx as usize] = if declined { Res::Declined } else { Res::Held };
                self.progress(s);
                let cancelled = s.barriers[tx as usize].is_some_and(|e| e.state == BState::Cancelled);
                if !declined && (cancelled || s.ghost.decided_abort & bit(tx) != 0) {
                    self.event(s, Event::TryLandedLate);
                }
                ctx.note(|| {
                    format!(
                        "  the resource {} (first request under the key)",
                        if declined { "declines" } else { "authorizes: money held" }
                    )
                });
                !declined
            }
            Res::Declined => {
                ctx.note(|| "  the stored first answer: declined".into());
                false
            }
            _ => {
                ctx.note(|| "  the stored first answer: the authorization".into());
                self.event(s, Event::TryAnsweredFromStore);
                true
            }
        }
    }

    /// A try request lands: the resource answers under its key; the answer reaches the prepare waiting for
    /// it (unless it is lost), which records it in its next step.
    pub(super) fn try_land(&self, s: &mut State, m: TryMsg, ctx: &mut Ctx) {
        let reserved = self.try_under_key(s, m.tx, ctx);
        let Some(req) = m.from else { return };
        let svc = self.cfg.resource.expect("a resource");
        let waiting =
            s.tasks.iter().position(|t| t.svc == svc && t.req == req && matches!(t.pc, TPc::RTryAwait { .. }));
        let Some(k) = waiting else { return };
        if ctx.drop_reply(s) {
            return;
        }
        let mut t = s.tasks.remove(k);
        let TPc::RTryAwait { token } = t.pc else { unreachable!() };
        for m in &mut s.rnet {
            if m.from == Some(req) {
                m.from = None;
            }
        }
        ctx.note(|| format!("  the answer reaches {}", self.task_name(&t)));
        t.pc = TPc::RTried { reserved, token };
        s.tasks.push(t);
    }

    /// The prepare stops waiting for its try's answer. Its call's timeout is the cutoff: past it (by its
    /// clock) it stops trying and refuses UNAVAILABLE, the entry staying TRYING. Before it, a timeout while
    /// its request is still in flight is a fault (the request may land later), and giving up once no
    /// answer can come (the request or its answer lost) is free; then it sends the try again, same key.
    pub(super) fn try_timeout(&self, s: &mut State, t: Task, ctx: &mut Ctx) {
        let tx = t.req.tx();
        let in_flight = s.rnet.iter().any(|m| m.from == Some(t.req));
        let r = self.cutoff_reading(s, tx);
        let past = ctx.reads_past(r, || format!("{}'s clock past the cutoff", self.cfg.services[t.svc as usize]));
        for m in &mut s.rnet {
            if m.from == Some(t.req) {
                m.from = None;
            }
        }
        if past {
            ctx.note(|| {
                "  the try call ends at the cutoff: no more tries; the entry stays TRYING: REFUSED UNAVAILABLE".into()
            });
            return self.refuse(s, t, ctx);
        }
        if in_flight {
            if s.budget.loss == 0 || s.budget.total == 0 {
                ctx.void = true;
                return;
            }
            s.budget.loss -= 1;
            s.budget.total -= 1;
            ctx.note(|| "  the try call times out, its request still in flight (it may land later)".into());
        } else {
            ctx.note(|| "  no answer can come any more".into());
        }
        self.event(s, Event::TryResent);
        self.send_try(s, &t, ctx);
        let TPc::RTryAwait { .. } = t.pc else { unreachable!() };
        s.tasks.push(t);
    }

    /// The try's answer: TRYING → TRIED (with what it reserved, conditioned on TRYING and the token) and
    /// PREPARED; a decline: TRYING → REFUSED (its lock released) and REFUSED. A write that fails: TRIED
    /// with this token already (its own write, the reply lost) is PREPARED; anything else means a cancel
    /// came first: REFUSED TIMEOUT. Without the barrier, the answer is recorded as TRIED if there is no
    /// entry (an entry TRIED by another delivery of the same try is its vote).
    pub(super) fn res_tried(&self, s: &mut State, t: Task, reserved: bool, token: u8, ctx: &mut Ctx) {
        let tx = t.req.tx();
        let e = s.barriers[tx as usize];
        if !self.cfg.switches.barrier {
            if !reserved {
                return self.refuse(s, t, ctx);
            }
            return match e {
                None => {
                    s.barriers[tx as usize] = Some(Entry {
                        state: BState::Tried,
                        token,
                        tried: true,
                        cancelled_call: false,
                        rechecked: false,
                        lock: true,
                    });
                    self.note_entry(s, tx, ctx);
                    self.progress(s);
                    self.finish(s, t, Ans::Vote(Vote::Prepared { token, read_only: false }), ctx)
                }
                Some(e) if e.state == BState::Tried => {
                    self.finish(s, t, Ans::Vote(Vote::Prepared { token: e.token, read_only: false }), ctx)
                }
                Some(_) => self.refuse(s, t, ctx),
            };
        }
        let mine = e.is_some_and(|e| e.state == BState::Trying && e.token == token);
        if !reserved {
            if mine {
                let entry = Self::entry(s, tx);
                entry.state = BState::Refused;
                entry.lock = false;
                self.note_entry(s, tx, ctx);
                self.progress(s);
            }
            ctx.note(|| "  declined: REFUSED RULE, nothing held".into());
            return self.refuse(s, t, ctx);
        }
        if mine {
            let entry = Self::entry(s, tx);
            entry.state = BState::Tried;
            entry.tried = true;
            self.note_entry(s, tx, ctx);
            self.progress(s);
            return self.finish(s, t, Ans::Vote(Vote::Prepared { token, read_only: false }), ctx);
        }
        if e.is_some_and(|e| e.state == BState::Tried && e.token == token) {
            return self.finish(s, t, Ans::Vote(Vote::Prepared { token, read_only: false }), ctx);
        }
        ctx.note(|| "  the entry is no longer TRYING: cancelled while the try ran: REFUSED TIMEOUT".into());
        self.event(s, Event::TriedAfterCancel);
        self.refuse(s, t, ctx)
    }

    /// `Driver::commit`: TRIED with the voted token → capture (confirm key), then the CONFIRMED write (next
    /// step); CONFIRMED already → COMMITTED; else NOT_PREPARED.
    fn res_commit(&self, s: &mut State, mut t: Task, ctx: &mut Ctx) {
        let Req::Commit { tx, token } = t.req else { unreachable!() };
        match s.barriers[tx as usize] {
            Some(e) if e.state == BState::Confirmed => self.finish(s, t, Ans::Committed, ctx),
            Some(e) if e.state == BState::Tried && e.token == token => {
                if !self.capture(s, tx, t.svc, ctx) {
                    return self.finish(s, t, Ans::Failed, ctx);
                }
                t.pc = TPc::RConfirmed;
                s.tasks.push(t);
            }
            e => {
                ctx.note(|| format!("  the entry is {:?}: NOT_PREPARED", e.map(|e| e.state)));
                self.finish(s, t, Ans::NotPrepared, ctx)
            }
        }
    }

    /// The resource captures T's authorization (confirm key): only ever for a transaction decided commit.
    fn capture(&self, s: &mut State, tx: Tx, svc: Svc, ctx: &mut Ctx) -> bool {
        if !s.status(tx).is_some_and(Status::commit) {
            self.violate(s, Violation::BadRollForward, ctx);
        }
        match s.res[tx as usize] {
            Res::Held => {
                s.res[tx as usize] = Res::Captured;
                s.ghost.applied[self.cfg.op_index(tx, self.cfg.txs[tx as usize].part_of(svc).expect("a part"), 0)] += 1;
                self.event(s, Event::ResourceConfirmed);
                self.progress(s);
                ctx.note(|| "  the resource captures the authorization".into());
                true
            }
            Res::Captured => {
                ctx.note(|| "  captured already: OK".into());
                true
            }
            Res::Voided => {
                ctx.note(|| "  the resource refuses: the authorization is voided (409)".into());
                self.violate(s, Violation::ResourceMisuse, ctx);
                false
            }
            Res::Unused | Res::Declined => {
                ctx.note(|| "  the resource has no authorization to capture".into());
                false
            }
        }
    }

    /// TRIED → CONFIRMED with the token, its lock released; a write that fails changes nothing (another
    /// delivery confirmed it): COMMITTED either way.
    pub(super) fn res_confirmed(&self, s: &mut State, t: Task, ctx: &mut Ctx) {
        let Req::Commit { tx, token } = t.req else { unreachable!() };
        if let Some(e) = s.barriers[tx as usize].as_mut()
            && e.state == BState::Tried
            && e.token == token
        {
            e.state = BState::Confirmed;
            e.lock = false;
            self.note_entry(s, tx, ctx);
            self.progress(s);
        }
        self.finish(s, t, Ans::Committed, ctx)
    }

    /// The resource voids T's authorization (cancel or recheck key): only ever for a transaction not
    /// committed. Returns whether the call went through.
    fn void(&self, s: &mut State, tx: Tx, ctx: &mut Ctx) -> bool {
        match s.res[tx as usize] {
            Res::Held => {
                s.res[tx as usize] = Res::Voided;
                self.progress(s);
                self.event(s, Event::ResourceVoided);
                ctx.note(|| "  the resource voids the authorization: money released".into());
                true
            }
            Res::Captured => {
                ctx.note(|| "  the resource refuses: the authorization is captured (409)".into());
                self.violate(s, Violation::ResourceMisuse, ctx);
                false
            }
            Res::Voided => {
                ctx.note(|| "  voided already: OK".into());
                true
            }
            Res::Unused | Res::Declined => true,
        }
    }

    /// `Driver::abort`, from the read of the entry.
    pub(super) fn res_abort(&self, s: &mut State, mut t: Task, ctx: &mut Ctx) {
        let tx = t.req.tx();
        let sw = self.cfg.switches;
        let Some(e) = s.barriers[tx as usize] else {
            if sw.barrier {
                s.barriers[tx as usize] = Some(Entry {
                    state: BState::Cancelled,
                    token: 0,
                    tried: false,
                    cancelled_call: false,
                    rechecked: true,
                    lock: false,
                });
                self.note_entry(s, tx, ctx);
                self.progress(s);
                self.event(s, Event::EmptyRollback);
                ctx.note(|| "  no entry: CANCELLED written (empty rollback), nothing called".into());
            } else {
                ctx.note(|| "  no entry: nothing to cancel".into());
            }
            return self.finish(s, t, Ans::Aborted, ctx);
        };
        match e.state {
            BState::Refused | BState::Confirmed => self.finish(s, t, Ans::Aborted, ctx),
            BState::Trying | BState::Tried => {
                t.pc = TPc::RCancel { seen_tried: e.state == BState::Tried };
                s.tasks.push(t);
            }
            BState::Cancelled => {
                if e.tried && !e.cancelled_call {
                    if !self.void(s, tx, ctx) {
                        return self.finish(s, t, Ans::Failed, ctx);
                    }
                    Self::entry(s, tx).cancelled_call = true;
                    self.progress(s);
                }
                if sw.recheck && !e.rechecked && self.recheck_due(s, tx) {
                    ctx.note(|| "  the recheck is due: the try's request again, under the try's key".into());
                    let held = s.res[tx as usize] == Res::Held;
                    if self.try_under_key(s, tx, ctx) {
                        if !self.void(s, tx, ctx) {
                            return self.finish(s, t, Ans::Failed, ctx);
                        }
                        if held {
                            self.event(s, Event::RecheckReleased);
                        }
                    }
                    let entry = Self::entry(s, tx);
                    entry.rechecked = true;
                    entry.lock = false;
                    self.note_entry(s, tx, ctx);
                    self.progress(s);
                    self.event(s, Event::Rechecked);
                }
                self.finish(s, t, Ans::Aborted, ctx)
            }
        }
    }

    /// `cancelled`: TRYING or TRIED → CANCELLED (whichever it is now), its lock kept and due at the
    /// recheck (`recheck` off: released, nothing to come back for); then the void of the reservation the
    /// read saw (TRIED). The entry moved meanwhile: judged again.
    pub(super) fn res_cancel(&self, s: &mut State, mut t: Task, seen_tried: bool, ctx: &mut Ctx) {
        let tx = t.req.tx();
        match s.barriers[tx as usize] {
            Some(e) if matches!(e.state, BState::Trying | BState::Tried) => {
                if !seen_tried && e.state == BState::Tried {
                    ctx.note(|| {
                        "  read TRYING, the entry is TRIED now: cancelled without its void (the recheck's)".into()
                    });
                    self.event(s, Event::CancelMissedTried);
                }
                let entry = Self::entry(s, tx);
                entry.state = BState::Cancelled;
                entry.lock = self.cfg.switches.recheck;
                self.note_entry(s, tx, ctx);
                self.progress(s);
                if seen_tried {
                    t.pc = TPc::RVoid;
                    s.tasks.push(t);
                    return;
                }
                self.finish(s, t, Ans::Aborted, ctx)
            }
            _ => {
                ctx.note(|| "  the entry moved since it was read: judged again".into());
                self.res_abort(s, t, ctx)
            }
        }
    }

    /// `cancel_call`: the void of the reservation the entry knows, under the cancel's key, then
    /// `cancelledCall` marked.
    pub(super) fn res_void(&self, s: &mut State, t: Task, ctx: &mut Ctx) {
        let tx = t.req.tx();
        if !self.void(s, tx, ctx) {
            return self.finish(s, t, Ans::Failed, ctx);
        }
        if let Some(e) = s.barriers[tx as usize].as_mut()
            && e.state == BState::Cancelled
        {
            e.cancelled_call = true;
            self.progress(s);
        }
        self.event(s, Event::CancelVoided);
        self.finish(s, t, Ans::Aborted, ctx)
    }
}
