//! The two-phase attempt: an attempt of a request with several participants (or one that cannot commit in
//! one phase) over the phase engine. A keyed or held request is recorded first, any other only at its
//! decision (presumed abort); a held one is held for its caller instead of committed; an abort records
//! what the attempts command needs to retry it.

use std::time::Instant;

use tracing::{Instrument, info, warn};

use super::Coordinator;
use super::ballot::{Verdict, Votes};
use super::engine::{Decided, PrepareOrder, Recording};
use super::reply::{Answering, Attempted, DriveError, Refused, Reply};
use crate::faults::CoordinatorCrash;
use crate::model::Status;
use crate::record::TransactionRecord;
use crate::telemetry;

/// One two-phase attempt over the phase engine; a retry prepares the participant at index `first` first (where its
/// predecessor was refused). A keyed or held request is recorded first (`created`: already written),
/// any other only at its decision (presumed abort).
pub(super) async fn run_two_phase(
    c: &Coordinator,
    record: TransactionRecord,
    created: bool,
    answering: Answering,
    first: Option<usize>,
) -> Result<Attempted, DriveError> {
    let answer_by = answering.by;
    let started = Instant::now();
    // A held transaction is recorded first too: its record is what its commit and abort find. So is an
    // attempt created with the link that names it (a retry: its record exists before it begins).
    let recording =
        if created || record.is_keyed() || record.is_held() { Recording::RecordFirst } else { Recording::AtDecision };
    if recording == Recording::RecordFirst && !created {
        // A keyed request must never run twice: the record is written first and only the writer prepares.
        if let Some(existing) = c.engine.create_own(&record.clone().opened()).await? {
            return Ok(super::replay::replay(c, existing, record.request_hash.as_deref(), answer_by).await?.into());
        }
        c.engine.faults.check(CoordinatorCrash::AfterCreate)?;
    }
    // Keyed only: a keyed record is kept for ever, so whoever meets a stray lock of it later finds its
    // owner's outcome; an unkeyed retried attempt's record expires (TTL), and its locks stay indexed.
    let unindexed = recording == Recording::RecordFirst && record.is_keyed() && !record.is_held();
    let order = PrepareOrder { recorded: unindexed, ..c.prepare_order(&record, first) };
    let votes = c.engine.prepare(&record, &order).await?;
    // A prepare without a vote may still write its lock, out of the locks index: an abort then ends only
    // once that write has landed ([`super::engine::PhaseEngine::drive_answered`]). By when, by this
    // coordinator's clock; `None`: no such write can come.
    let answered_at = c.engine.clock.now_ms();
    let late_locks_land_by = votes
        .iter()
        .filter(|v| unindexed && v.unanswered())
        .map(|v| match v.ended_without_vote {
            true => answered_at + crate::clock::CLOCK_MARGIN_MS,
            false => crate::clock::lock_cutoff(record.deadline),
        })
        .max();
    let blocked = votes.blocked();
    let blocked_at = blocked.map(|(at, _)| at);
    let prepared = started.elapsed();
    telemetry::phase(telemetry::PREPARE_LATENCY, prepared);
    let deciding = Instant::now();
    // The next attempt its own contention abort creates, if it retries.
    let mut next = None;
    let decided = match votes.verdict(c.engine.clock.now_ms() <= record.deadline) {
        Verdict::Commit if record.is_held() => Decided::Open(super::held::hold(c, &record, votes).await?),
        Verdict::Commit => c.engine.commit(record, votes, recording).await?,
        Verdict::Abort(reason) => {
            let blocker = blocked.map(|(_, blocker)| blocker.to_owned());
            let own = c.contention_abort(&record, &votes, blocker.as_deref(), answer_by).await;
            let decided = c.engine.abort(record, votes, reason, &own, recording).await?;
            next = own.next.map(|n| *n);
            decided
        }
    };
    let decided = match decided {
        Decided::Open(decided) => decided,
        Decided::Ended { reply, aborted } => {
            let status = reply.body["status"].as_str().unwrap_or("-").to_owned();
            info!(status, total_ms = started.elapsed().as_millis() as u64, "transaction answered");
            return Ok(Attempted { reply, refused: aborted.map(|record| Refused { record, blocked_at, next }) });
        }
    };
    c.engine.faults.check(CoordinatorCrash::AfterDecision)?;
    telemetry::phase(telemetry::DECISION_LATENCY, deciding.elapsed());
    if decided.status == Status::Prepared {
        return Ok(super::held::answer_held(c, decided).await.into());
    }
    if answering.on_decision
        && decided.status == Status::Committing
        && let Some(after) = &c.after_answer
    {
        return Ok(answer_on_decision(c, after.as_ref(), decided, started, answer_by).into());
    }
    let second_phase = Instant::now();
    let mut finished = c.engine.drive_within(decided.clone(), answer_by, late_locks_land_by.is_none()).await?;
    if let Some(land_by) = late_locks_land_by
        && finished.status == Status::Aborting
    {
        finished = end_abort_when_landed(c, finished, land_by, answer_by).await?;
    }
    if decided.status == Status::Committing && finished.status.is_terminal() {
        telemetry::phase(telemetry::COMMIT_LATENCY, second_phase.elapsed());
    }
    info!(
        status = %finished.status,
        prepare_ms = prepared.as_millis() as u64,
        total_ms = started.elapsed().as_millis() as u64,
        "transaction answered"
    );
    let reply = Reply::for_record(&finished);
    let refused = matches!(finished.status, Status::Aborting | Status::Aborted).then(|| Refused {
        record: super::engine::with_votes(finished, decided.participants),
        blocked_at,
        next,
    });
    Ok(Attempted { reply, refused })
}

/// Longest this coordinator waits for an unanswered prepare's lock write to land, to end an abort itself.
const LANDING_WAIT: std::time::Duration = std::time::Duration::from_millis(1_000);

/// An abort left open because a prepare went unanswered (its lock may still land, out of the index), when
/// that write lands soon (`land_by`, this coordinator's clock): a participant whose execution failed (its
/// abandoned writes land within the clock margin), or a prepare that gave no answer before the deadline
/// (the participants' lock cutoff is a margin away). The coordinator waits for it, one more margin for
/// the clocks' skew, releases again and ends the abort, rather than leaving every such request to the
/// sweeper's next run. Farther away (an invoke that failed in transit early, which may still arrive),
/// the record stays for the sweeper.
async fn end_abort_when_landed(
    c: &Coordinator,
    open: TransactionRecord,
    land_by: u64,
    answer_by: Instant,
) -> Result<TransactionRecord, DriveError> {
    let ended_after = land_by + crate::clock::CLOCK_MARGIN_MS;
    let wait = std::time::Duration::from_millis(ended_after.saturating_sub(c.engine.clock.now_ms()) + 1);
    if wait > LANDING_WAIT || Instant::now() + wait >= answer_by {
        return Ok(open);
    }
    tokio::time::sleep(wait).await;
    // Every lock write of the attempt has landed: the releases now come after all of them.
    c.engine.drive_within(open, answer_by, true).await
}

/// Issue 48: the 202 COMMITTING of a request that asked to be answered on its decision (`Prefer:
/// respond-async`), now that the commit decision is durable; its second phase is handed to the after-answer
/// work ([`crate::after_answer`]), until [`super::AFTER_ANSWER_BUDGET`] past the request's answer budget.
/// Stopped there, the sweeper finishes it.
fn answer_on_decision(
    c: &Coordinator,
    after: &dyn crate::after_answer::AfterAnswer,
    decided: TransactionRecord,
    started: Instant,
    answer_by: Instant,
) -> Reply {
    let reply = Reply { answered_on_decision: true, ..Reply::for_record(&decided) };
    let engine = c.engine.clone();
    let finish_by = answer_by + super::AFTER_ANSWER_BUDGET;
    let span = tracing::Span::current();
    after.defer(Box::pin(
        async move {
            let second_phase = Instant::now();
            match engine.drive_within(decided, finish_by, true).await {
                Ok(finished) if finished.status.is_terminal() => {
                    telemetry::phase(telemetry::COMMIT_LATENCY, second_phase.elapsed());
                    info!(status = %finished.status, "second phase finished after the answer");
                }
                Ok(finished) => info!(status = %finished.status, "second phase left to the sweeper"),
                Err(e) => warn!(error = %e, "second phase after the answer stopped; the sweeper finishes it"),
            }
        }
        .instrument(span),
    ));
    info!(total_ms = started.elapsed().as_millis() as u64, "transaction answered on its commit decision");
    reply
}

impl Coordinator {
    /// A retry (an attempt after the first, or a caller's retry with an age token) or a request on a hot
    /// item prepares one participant at a time, `first` first; any other, everyone at once.
    pub(super) fn prepare_order(&self, record: &TransactionRecord, first: Option<usize>) -> PrepareOrder {
        let participants = record.participants.len();
        let one_at_a_time =
            self.sequential_prepares || record.attempt_number() > 1 || record.age_of.is_some() || first.is_some();
        if one_at_a_time {
            PrepareOrder::one_at_a_time(participants, first)
        } else {
            PrepareOrder::all_at_once(participants)
        }
    }
}
