//! The held command: a transaction whose request had `holdMs` prepares and is held PREPARED for its
//! caller's decision, `POST /transactions/{id}/commit` or `/abort`, until its `holdUntil`. The hold is
//! recorded over the phase engine's decision write, its locks are extended to `holdUntil`, and the
//! caller's decision goes to the request's attempt that lives, conditionally on the status it read.

use std::time::Instant;

use serde_json::Value;
use tracing::{Instrument, error, info, info_span, warn};

use super::engine::{SECOND_PHASE_TIMEOUT, retrying};
use super::replay::{MAX_CHAIN_HOPS, own_attempt};
use super::reply::{DriveError, Reply, unavailable};
use super::{ABANDON_AFTER_BUDGET, Coordinator};
use crate::access::Caller;
use crate::attempts::ContentionAbort;
use crate::model::message::Hold;
use crate::model::{ErrorCode, Message, STATUS_HELD, Status, Vote};
use crate::record::{ParticipantEntry, TransactionRecord, Transition};
use crate::store::StoreError;

/// The decision a caller makes about a held transaction (or an operator's abort of any undecided one),
/// with the reason an abort records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeldDecision {
    Commit,
    Abort(&'static str),
}

/// The reason a held transaction aborted by its caller keeps.
pub const HELD_ABORT_REASON: &str = "aborted by its caller while held";

/// The hold decision of a request that asked for one, every participant prepared: PREPARING → PREPARED
/// on its record, with the votes, its locks to expire at `holdUntil` (the engine settles a failed write).
pub(super) async fn hold(
    c: &Coordinator,
    record: &TransactionRecord,
    votes: Vec<ParticipantEntry>,
) -> Result<TransactionRecord, DriveError> {
    let id = &record.transaction_id;
    let hold_until = c.engine.clock.now_ms() + record.hold_ms.unwrap_or_default();
    let written = retrying("hold write", |_| {
        let votes = &votes;
        async move { c.engine.transactions.hold(id, c.engine.clock.now_ms(), votes, hold_until).await }
    })
    .await;
    c.engine.settle(record, Status::Prepared, written, votes, &ContentionAbort::default()).await
}

/// The answer of a transaction just held: its locks now expire at `holdUntil`. A crash before leaves
/// them their deadline, and whoever meets one then finds its owner PREPARED, undecided until holdUntil.
pub(super) async fn answer_held(c: &Coordinator, held: TransactionRecord) -> Reply {
    extend_locks(c, &held).await;
    info!(hold_until = held.hold_until, "transaction held");
    Reply::for_record(&held)
}

pub(super) async fn decide_held_within(c: &Coordinator, id: &str, caller: &Caller, decision: HeldDecision) -> Reply {
    let answer_by = Instant::now() + c.answer_budget;
    let abandon_at = tokio::time::Instant::from_std(answer_by + ABANDON_AFTER_BUDGET);
    let span = info_span!("held", tx = %id, decision = ?decision);
    let decided = decide_held(c, id, caller, decision, answer_by).instrument(span);
    let ran = match tokio::time::timeout_at(abandon_at, decided).await {
        Ok(ran) => ran,
        Err(_) => {
            error!(tx = %id, "the answer budget ran out in a step that did not return; abandoned like a crash");
            Err(DriveError::Store(StoreError::internal(
                "UpdateItem",
                c.engine.transactions.table(),
                "no answer in time",
            )))
        }
    };
    match ran {
        Ok(reply) => reply,
        Err(DriveError::Store(e)) | Err(DriveError::Unrecorded { error: e, .. }) => unavailable(&e, Some(id)),
        Err(DriveError::Crashed(crash)) => {
            let mut reply = Reply::error(ErrorCode::Crashed, crash.to_string());
            reply.body["transactionId"] = Value::String(id.to_owned());
            reply
        }
    }
}

pub(super) async fn decide_held(
    c: &Coordinator,
    id: &str,
    caller: &Caller,
    decision: HeldDecision,
    answer_by: Instant,
) -> Result<Reply, DriveError> {
    // Another principal's transaction is answered as an unknown one: its id tells nothing.
    let record = match c.engine.transactions.get(id).await? {
        Some(record) if c.access.may_see(caller, record.principal.as_deref()) => record,
        _ => return Ok(Reply::error(ErrorCode::NotFound, format!("no transaction {id}"))),
    };
    if !record.is_held() {
        let mut reply = Reply::error(
            ErrorCode::NotHeld,
            format!(
                "transaction {id} was not held (its request had no holdMs): it was decided when it was \
                 submitted, and is {}",
                Reply::for_record(&record).body["status"].as_str().unwrap_or_default()
            ),
        );
        reply.body["transactionId"] = Value::String(id.to_owned());
        return Ok(reply);
    }
    let record = match decide_on_chain(c, record, decision, answer_by).await? {
        Ok(record) => record,
        Err(reply) => return Ok(reply),
    };
    let mut reply = Reply::for_record(&record);
    reply.status = match (record.status, decision) {
        (Status::Committed | Status::Committing, HeldDecision::Commit) => reply.status,
        (Status::Aborting | Status::Aborted, HeldDecision::Abort(_)) => 200,
        // Not decided yet (the writes kept losing to status changes): as a retried POST would be told.
        (Status::Preparing | Status::Prepared, _) => return Ok(Reply::answering(&record)),
        // The other decision won: the decided body.
        _ => 409,
    };
    info!(status = %record.status, http = reply.status, "held transaction answered");
    Ok(super::seen::as_seen_by(c, caller, reply, &record).await)
}

/// `decision` written to the attempt of `record`'s request that lives, then its second phase driven within
/// `answer_by`: the record as it then is, or the answer that stops it (a commit of an attempt still
/// preparing). An attempt its coordinator retried: the decision is the request's, so it goes to the
/// attempt that lives, and so after each write it lost (the coordinator's own abort may have named the
/// next attempt between this call's read and its write). A status may move on between the read and the
/// write (the first execution recording PREPARED, a concurrent call, the expiry): each write is conditional
/// on the status read, and a lost one is followed by another from the record found, until it is decided.
pub(super) async fn decide_on_chain(
    c: &Coordinator,
    record: TransactionRecord,
    decision: HeldDecision,
    answer_by: Instant,
) -> Result<Result<TransactionRecord, Reply>, DriveError> {
    let mut record = record;
    let mut hops = 0;
    for _ in 0..4 {
        record = match live_attempt(c, record, decision, &mut hops).await? {
            Ok(live) => live,
            Err(reply) => return Ok(Err(reply)),
        };
        // Past its deadline still preparing (its coordinator stopped), or past its hold: aborted first, as
        // recovery would (an expiry's abort names no successor).
        record = super::recover::abort_expired(c, record).await?;
        let current_id = record.transaction_id.clone();
        match (record.status, decision) {
            (Status::Preparing, HeldDecision::Commit) => {
                let mut reply = Reply::error(
                    ErrorCode::Unavailable,
                    format!(
                        "transaction {current_id} is still preparing: it can be committed once it is PREPARED \
                         (GET /transactions/{current_id} tells)"
                    ),
                );
                reply.body["transactionId"] = Value::String(current_id);
                return Ok(Err(reply));
            }
            (Status::Preparing | Status::Prepared, _) => match write_held_decision(c, &record, decision).await? {
                Transition::Done(decided) => {
                    record = decided;
                    break;
                }
                Transition::Lost(Some(current)) => record = current,
                Transition::Lost(None) => {
                    return Err(StoreError::internal(
                        "UpdateItem",
                        c.engine.transactions.table(),
                        format!("record {current_id} disappeared"),
                    )
                    .into());
                }
            },
            _ if record.successor().is_some() => {}
            _ => break,
        }
    }
    // The last write lost to the coordinator's own abort naming the next attempt: that one decides.
    if record.successor().is_some() {
        record = match live_attempt(c, record, decision, &mut hops).await? {
            Ok(live) => live,
            Err(reply) => return Ok(Err(reply)),
        };
    }
    if matches!(record.status, Status::Committing | Status::Aborting) {
        record = c.engine.drive_within(record, answer_by, false).await?;
    }
    Ok(Ok(record))
}

/// The attempt of `record`'s request that lives: its coordinator's chain followed from `record`. One named
/// but not begun is fenced by an abort (it can then never begin); for a commit it is still preparing
/// (`Err`: the 503 that says so). One that is not `record`'s request's (another caller, another body)
/// is not followed: the last attempt of its own is the one that lives.
pub(super) async fn live_attempt(
    c: &Coordinator,
    mut record: TransactionRecord,
    decision: HeldDecision,
    hops: &mut usize,
) -> Result<Result<TransactionRecord, Reply>, DriveError> {
    let owner = record.clone();
    while let Some(next) = record.successor().map(str::to_owned).filter(|_| *hops < MAX_CHAIN_HOPS) {
        *hops += 1;
        let attempt = match (c.engine.transactions.get(&next).await?, decision) {
            (Some(attempt), _) => attempt,
            (None, HeldDecision::Abort(reason)) => {
                c.engine.transactions.fence_attempt(&next, c.engine.clock.now_ms(), reason, &record).await?
            }
            (None, HeldDecision::Commit) => {
                let mut reply = Reply::error(
                    ErrorCode::Unavailable,
                    format!(
                        "transaction {} was retried as {next}, which is still preparing: it can be committed \
                         once it is PREPARED (GET /transactions/{next} tells)",
                        record.transaction_id
                    ),
                );
                reply.body["transactionId"] = Value::String(next);
                return Ok(Err(reply));
            }
        };
        match own_attempt(&owner, attempt) {
            Some(attempt) => record = attempt,
            None => break,
        }
    }
    Ok(Ok(record))
}

/// The caller's decision, written conditionally on the status read (PREPARED, or PREPARING for an abort
/// that comes before the hold is recorded), retried on infrastructure errors. A commit is written only
/// while the coordinator's clock is at or before `holdUntil`, checked before every attempt: past it the
/// attempt writes the abort instead (which an earlier attempt's commit, its reply lost, defeats: the
/// record then says COMMITTING). Resolvers abort a held transaction only after `holdUntil` and twice the
/// clock margin by their clocks, and every one of these writes is conditional: exactly one decision wins.
pub(super) async fn write_held_decision(
    c: &Coordinator,
    record: &TransactionRecord,
    decision: HeldDecision,
) -> Result<Transition, StoreError> {
    let id = &record.transaction_id;
    let from = record.status;
    let hold_until = record.hold_until.unwrap_or(0);
    let keyed = record.is_keyed();
    retrying("held decision write", |_| async move {
        let now = c.engine.clock.now_ms();
        let (to, reason) = match decision {
            HeldDecision::Commit if from == Status::Prepared && now <= hold_until => (Status::Committing, None),
            HeldDecision::Commit => (Status::Aborting, Some(crate::recovery::HOLD_EXPIRED_REASON)),
            HeldDecision::Abort(reason) => (Status::Aborting, Some(reason)),
        };
        // Decided: due for the sweeper as a transaction decided now would be (after its timeout), not at
        // holdUntil any more.
        let sweep_at = (now + record.deadline.saturating_sub(record.created_at)).max(record.deadline);
        c.engine.transactions.transition_due(id, from, to, keyed, now, reason, sweep_at).await
    })
    .await
}

/// Moves the expiry of a held transaction's locks to its `holdUntil`: a hold message to every
/// participant that locked something, with the token its vote reported. Best effort: a participant
/// that does not answer keeps its locks' deadline, and whoever meets one of them then finds the owner
/// PREPARED, undecided until `holdUntil`, as it would anyway.
pub(super) async fn extend_locks(c: &Coordinator, record: &TransactionRecord) {
    let Some(hold_until) = record.hold_until else { return };
    let holds: Vec<_> = record
        .participants
        .iter()
        .filter(|p| p.vote == Some(Vote::Prepared) && !p.read_only)
        .map(|entry| {
            let request = Message::Hold(Hold {
                transaction_id: record.transaction_id.clone(),
                operations: entry.operations.clone(),
                lock_token: entry.lock_token.clone(),
                hold_until,
            });
            async move {
                match tokio::time::timeout(SECOND_PHASE_TIMEOUT, c.engine.call(&entry.service, &request)).await {
                    Ok(Ok(response)) if response.status.as_deref() == Some(STATUS_HELD) => {}
                    other => warn!(service = %entry.service, answer = ?other.ok(), "locks not extended to holdUntil; they keep their deadline"),
                }
            }
        })
        .collect();
    futures::future::join_all(holds).await;
}
