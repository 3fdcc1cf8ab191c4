//! Issues 29 and 30: operations judged on the item as read. A service's rules (`Rules::check`) and its own
//! operations (`Operations::prepare`) look at the item before it is locked: participant/prepare.rs `judge`
//! reads the item, asks the rule or computes the new value, and the lock write (`DataTable::lock_all`, or
//! `apply_one_phase`) is conditioned on the item's `version` being the one read (participant/expressions.rs `Seen`). A write
//! that fails because the item changed in between (`classify_lock_failure` → Unexplained) is the next
//! attempt: read and judged again. A service's own operation keeps the value it computed in `pending`
//! beside the lock, and the commit applies exactly that (`SET data = pending`).
//!
//! One step is the read and the judgement (`TPc::Judge`, with the attempt's cutoff check), the next the
//! conditional write (`TPc::LockSeen`, `TPc::OnePhaseSeen`): another commit may come between them.

use super::{Ctx, guard};
use crate::config::{OpKind, Svc, Tx};
use crate::state::*;
use crate::{Event, TwoPc, Violation};

impl TwoPc {
    /// What the service's own operation computes now: `balance - q * k`, k = 2 once the service was
    /// redeployed with its new version.
    pub(super) fn deployed_factor(&self, s: &State, svc: Svc) -> i8 {
        1 + ((s.deployed >> svc) & 1) as i8
    }

    /// `judge`: the attempt's cutoff check, then the item as read: another transaction's lock is resolved,
    /// waited for or refused as always (`Judged::Locked`); else the rule judges it (REFUSED RULE) or the
    /// operation computes its new value (REFUSED CONDITION_FAILED below zero), and the write comes next,
    /// conditioned on the version read.
    pub(super) fn judge(&self, s: &mut State, mut t: Task, ctx: &mut Ctx) {
        let tx = t.req.tx();
        if self.past_cutoff(s, &t, ctx) {
            return self.refuse_late(s, t, ctx);
        }
        let op = self.ops(tx, t.svc)[0];
        let it = s.items[op.item as usize];
        if let Some(l) = it.lock
            && l.tx != tx
        {
            return self.met_lock(s, t, l, op.item, ctx);
        }
        let name = self.cfg.items[op.item as usize].name;
        let value = match op.kind {
            OpKind::Ruled { delta } => {
                if it.balance + delta < 0 {
                    ctx.note(|| {
                        format!(
                            "  the rule judges {name}={} (version {}): no overdraft: REFUSED RULE",
                            it.balance, it.version
                        )
                    });
                    self.event(s, Event::RuleRefused);
                    return self.refuse(s, t, ctx);
                }
                ctx.note(|| format!("  the rule judges {name}={} (version {}): holds", it.balance, it.version));
                0
            }
            OpKind::Custom { q } => {
                let k = self.deployed_factor(s, t.svc);
                let value = it.balance - q * k;
                if value < 0 {
                    ctx.note(|| {
                        format!(
                            "  the operation computes {name} = {} - {q}*{k} < 0: REFUSED CONDITION_FAILED",
                            it.balance
                        )
                    });
                    self.event(s, Event::CustomRefused);
                    return self.refuse(s, t, ctx);
                }
                ctx.note(|| {
                    format!(
                        "  the operation computes {name} = {} - {q}*{k} = {value} (version {})",
                        it.balance, it.version
                    )
                });
                value
            }
            _ => unreachable!("only rules and a service's own operations are judged"),
        };
        t.pc = match t.req {
            Req::OnePhase { .. } => TPc::OnePhaseSeen { seen: it.version, value },
            _ => TPc::LockSeen { seen: it.version, value },
        };
        s.tasks.push(t);
    }

    /// The item is as the judgement saw it: its version is the one read (`rule_version_condition`; off, no
    /// such condition). A write that takes effect on an item whose version moved since is the violation.
    fn seen_holds(&self, it: &Item, seen: u8) -> bool {
        !self.cfg.switches.rule_version_condition || it.version == seen
    }

    fn check_fresh(&self, s: &mut State, it: &Item, seen: u8, ctx: &mut Ctx) {
        if it.version != seen {
            ctx.note(|| format!("  (judged at version {seen}, written at version {})", it.version));
            self.violate(s, Violation::StaleJudgement, ctx);
        }
    }

    /// `lock_all` after `judge`: `attribute_not_exists(lock) AND lastTx <> T AND version = seen`, with a
    /// fresh token, and `pending` = the computed value for a service's own operation. Folded with the
    /// cutoff (the write is abandoned at it). A failed condition: a lock of T itself is its vote (an
    /// earlier attempt whose reply was lost), another's is resolved, waited for or refused, `lastTx = T`
    /// refuses; else the item changed since it was judged: judged again.
    pub(super) fn lock_seen(&self, s: &mut State, mut t: Task, seen: u8, value: i8, ctx: &mut Ctx) {
        let Req::Prepare { tx, exec, copy } = t.req else { unreachable!() };
        let sw = self.cfg.switches;
        if self.past_cutoff(s, &t, ctx) {
            return self.refuse_late(s, t, ctx);
        }
        let burned = if sw.fresh_token_per_attempt { t.burned } else { 0 };
        let token = if sw.token_check { 1 + (exec * 2 + copy) * 4 + burned } else { 0 };
        let op = self.ops(tx, t.svc)[0];
        let it = s.items[op.item as usize];
        let retrying = std::mem::take(&mut t.retrying);
        if it.lock.is_none() && it.last_tx != Some(tx) && guard(&op, &it) && self.seen_holds(&it, seen) {
            self.check_fresh(s, &it, seen, ctx);
            let pending = matches!(op.kind, OpKind::Custom { .. }).then_some(value);
            self.take_lock(s, op.item, tx, t.svc, token, pending, ctx);
            if ctx.lost_reply(s) {
                // The next attempt reads and judges again, and finds its own lock.
                t.retrying = true;
                t.burned += 1;
                t.pc = TPc::Judge;
                s.tasks.push(t);
                return;
            }
            return self.finish(s, t, Ans::Vote(Vote::Prepared { token, read_only: false }), ctx);
        }
        match it.lock {
            Some(l) if l.tx == tx => {
                if retrying {
                    self.event(s, Event::OwnWriteRecognised);
                }
                self.finish(s, t, Ans::Vote(Vote::Prepared { token: l.token, read_only: false }), ctx)
            }
            Some(l) => self.met_lock(s, t, l, op.item, ctx),
            None if it.last_tx == Some(tx) => self.refuse(s, t, ctx),
            None => {
                ctx.note(|| {
                    format!("  the item changed since it was judged (version {seen} -> {}): judged again", it.version)
                });
                self.event(s, Event::Rejudged);
                t.pc = TPc::Judge;
                s.tasks.push(t);
            }
        }
    }

    /// `apply_one_phase` after `judge`: the items `attribute_not_exists(lock) AND version = seen`, applying
    /// the delta or the computed value, and the COMMITTED record `attribute_not_exists` in one
    /// TransactWriteItems. A failed record condition is RECORD_EXISTS whatever the items' (`apply_one_phase`
    /// looks at the record's reason first); an item changed since it was judged: judged again.
    pub(super) fn one_phase_seen(&self, s: &mut State, mut t: Task, seen: u8, value: i8, ctx: &mut Ctx) {
        let Req::OnePhase { tx, exec, .. } = t.req else { unreachable!() };
        // The SDK's retry of the TransactWriteItems (a lost reply) is the same attempt: not checked again.
        if !t.retrying && self.past_cutoff(s, &t, ctx) {
            return self.refuse_late(s, t, ctx);
        }
        let op = self.ops(tx, t.svc)[0];
        let it = s.items[op.item as usize];
        let retrying = std::mem::take(&mut t.retrying);
        if s.record(tx).is_some() {
            if retrying {
                self.event(s, Event::OwnWriteRecognised);
            }
            self.event(s, Event::OnePhaseRecordExists);
            return self.finish(s, t, Ans::RecordExists, ctx);
        }
        if it.lock.is_none() && self.seen_holds(&it, seen) {
            self.check_fresh(s, &it, seen, ctx);
            let computed = matches!(op.kind, OpKind::Custom { .. }).then_some(value);
            self.apply_op(s, tx, t.svc, op.item, false, computed, ctx);
            s.ghost.executed_by[tx as usize] |= 1 << exec;
            let votes = vec![Vote::Prepared { token: 0, read_only: false }];
            self.write_record(s, tx, Record::new(Status::Committed, exec, Some(votes)), ctx);
            self.event(s, Event::OnePhaseCommitted);
            if ctx.lost_reply(s) {
                t.retrying = true;
                s.tasks.push(t);
                return;
            }
            return self.finish(s, t, Ans::Committed, ctx);
        }
        match it.lock {
            Some(l) if l.tx != tx => self.met_lock(s, t, l, op.item, ctx),
            Some(_) => self.refuse(s, t, ctx),
            None => {
                ctx.note(|| {
                    format!("  the item changed since it was judged (version {seen} -> {}): judged again", it.version)
                });
                self.event(s, Event::Rejudged);
                t.pc = TPc::Judge;
                s.tasks.push(t);
            }
        }
    }

    /// The value a service's own operation writes: in one phase what this attempt computed; in two phases
    /// what its prepare kept in `pending` (`apply_pending`), or (off) what the operation as deployed now
    /// computes from the item. It must be the value the vote stood for.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn custom_value(
        &self,
        s: &mut State,
        tx: Tx,
        svc: Svc,
        q: i8,
        it: &Item,
        two_phase: bool,
        computed: Option<i8>,
        ctx: &mut Ctx,
    ) -> i8 {
        if !two_phase {
            return computed.expect("a one-phase commit applies what it computed");
        }
        let voted = it.lock.filter(|l| l.tx == tx).and_then(|l| l.pending);
        let now = it.balance - q * self.deployed_factor(s, svc);
        let value = if self.cfg.switches.apply_pending { voted.expect("pending is kept beside the lock") } else { now };
        if voted != Some(now) {
            // The operation as deployed now would compute another value than the one voted for.
            self.event(s, Event::PendingAfterRedeploy);
        }
        if Some(value) != voted {
            ctx.note(|| format!("  (the prepare voted for {voted:?}; the commit writes {value})"));
            self.violate(s, Violation::CommittedNotVoted, ctx);
        }
        value
    }
}
