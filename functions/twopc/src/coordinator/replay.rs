//! The replay command: a request whose key (or age token) ran already is answered from its first
//! execution's record, never run twice. The same body gets that execution's answer, another body a 422.
//! A replay follows the request's chain of attempts (issue 41) to the one that lives, waits while its
//! coordinator may still be at work, and finishes what a stopped one left, as recovery would.
//!
//! A step along the chain follows an attempt only if it is the same request's (issue 42,
//! [`TransactionRecord::same_request`]): the caller of the attempt it started from, the same body. A
//! record under the id the chain names that is another's (written by someone who could write the table)
//! is neither followed, nor driven, nor decided: the walk ends at the request's own last attempt.
//!
//! A key names its transaction here too ([`caller_idempotent_id`]), and the held command follows the
//! same chain with [`own_attempt`].

use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::error;

use super::ballot::Votes;
use super::reply::{DriveError, Reply, drive_error_reply, unavailable};
use super::{Coordinator, MAX_ATTEMPTS};
use crate::access::Caller;
use crate::clock::resolvable_after;
use crate::model::{ErrorCode, Status};
use crate::record::TransactionRecord;
use crate::store::StoreError;

/// Why an attempt recorded ABORTED by a retried key's replay never ran.
pub(super) const ATTEMPT_NOT_STARTED: &str = "the coordinator stopped before this attempt began";
/// A retried keyed request follows its attempts' `retriedAs` links at most this far.
pub(super) const MAX_CHAIN_HOPS: usize = 256;

/// The answer of a request whose record `id` exists already (its replay); None when there is none.
/// When it cannot be read, a 503 that names `unread` (GET tells): `id` where the request runs under
/// it, none where it may have run under another id (a key answers for one request only).
pub(super) async fn answer_if_recorded(
    c: &Coordinator,
    id: &str,
    request_hash: Option<&str>,
    answer_by: Instant,
    unread: Option<&str>,
) -> Option<Reply> {
    match c.engine.transactions.get(id).await {
        Ok(Some(existing)) => Some(match replay(c, existing, request_hash, answer_by).await {
            Ok(reply) => reply,
            Err(e) => drive_error_reply(e, id),
        }),
        Ok(None) => None,
        Err(e) => Some(unavailable(&e, unread)),
    }
}

/// A key's first execution from before keys were scoped per caller: recorded under the key's id
/// alone ([`idempotent_id`]), found only by its own caller (its recorded principal, or, for a record
/// without one, any IAM caller: the only kind there was). Another caller's record there is none of
/// this caller's business: its key is its own.
pub(super) async fn first_execution_before_scoping(
    c: &Coordinator,
    key: &str,
    caller: &Caller,
) -> Result<Option<TransactionRecord>, StoreError> {
    if caller.principal.is_none() {
        // Unscoped already: the ordinary path finds it.
        return Ok(None);
    }
    let existing = c.engine.transactions.get(&idempotent_id(key)).await?;
    Ok(existing.filter(|record| match record.principal.as_deref() {
        Some(principal) => caller.principal.as_deref() == Some(principal),
        None => caller.is_iam(),
    }))
}

/// A retried keyed request: the same body gets the first execution's answer, another body a 422.
/// Within `answer_by`: it waits while the first execution may still be at work (until its deadline
/// and twice the clock margin), then aborts it if it is still undecided, drives a decided one, and
/// answers what the record then says: 200 or 409 once ended, 202 or 409 once decided, 503 with the
/// id while undecided (202 would say "decided commit").
pub(super) async fn replay(
    c: &Coordinator,
    existing: TransactionRecord,
    request_hash: Option<&str>,
    answer_by: Instant,
) -> Result<Reply, DriveError> {
    if existing.request_hash.is_some() && existing.request_hash.as_deref() != request_hash {
        return Ok(Reply::error(
            ErrorCode::IdempotencyKeyReused,
            format!(
                "Idempotency-Key was used for transaction {} with a different request body",
                existing.transaction_id
            ),
        ));
    }
    // Each attempt followed is the same request's (issue 42): the caller and body of the key's record.
    let owner = existing.clone();
    let mut record = existing;
    let mut hops = 0;
    let mut foreign = false;
    loop {
        // Its attempts: each one retried names the next (which a replay that finds it missing fences).
        while let Some(next) = record.successor().map(str::to_owned).filter(|_| hops < MAX_CHAIN_HOPS && !foreign) {
            hops += 1;
            match attempt_named(c, &next, &record, &owner, answer_by).await? {
                Some(attempt) => record = attempt,
                None => foreign = true,
            }
        }
        let mut wait = Duration::from_millis(20);
        // A held one answers at once: PREPARED (202 with holdUntil) while the hold lasts. An attempt
        // refused for contention may still be retried by its coordinator until its deadline.
        while (!record.status.is_terminal() || may_be_retried(c, &record))
            && record.status != Status::Prepared
            && record.successor().is_none()
            && c.engine.clock.now_ms() <= resolvable_after(record.deadline)
        {
            let left = answer_by.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            tokio::time::sleep(wait.min(left)).await;
            wait = (wait * 2).min(Duration::from_millis(250));
            match c.engine.transactions.get(&record.transaction_id).await? {
                Some(now) => record = now,
                None => break,
            }
        }
        if may_be_retried(c, &record) {
            // Its coordinator stopped between the attempts, or is slower than the deadline: the next
            // attempt is fenced, so that this answer stays the request's answer.
            let next = crate::record::attempt_id(record.first_id(), record.attempt_number() + 1);
            let now = c.engine.clock.now_ms();
            c.engine.transactions.fence_attempt(&next, now, ATTEMPT_NOT_STARTED, &record).await?;
            if let Some(current) = c.engine.transactions.get(&record.transaction_id).await? {
                record = current;
            }
        }
        if record.successor().is_none() || hops >= MAX_CHAIN_HOPS || foreign {
            break;
        }
    }
    if hops >= MAX_CHAIN_HOPS && record.successor().is_some() && !foreign {
        let mut reply = Reply::error(
            ErrorCode::Unavailable,
            format!(
                "the request's attempts go on past {MAX_CHAIN_HOPS}; the outcome is not known from here: GET \
                 /transactions/{} and follow its retriedAs",
                record.transaction_id
            ),
        );
        reply.body["transactionId"] = Value::String(record.transaction_id.clone());
        return Ok(reply);
    }
    // The first execution stopped (its coordinator crashed) or is slower than the budget: finish it as
    // recovery would, as far as the budget allows.
    record = super::recover::abort_expired(c, record).await?;
    if matches!(record.status, Status::Committing | Status::Aborting) {
        record = c.engine.drive_within(record, answer_by, false).await?;
    }
    // No age token from a replay: a request's token comes with its own answer and expires with it.
    Ok(Reply::answering(&record))
}

/// The attempt `id` that `earlier`'s `retriedAs` names. Its coordinator creates it once the earlier
/// attempt's abort is driven, so it is waited for while that coordinator may still be at work (until
/// the earlier attempt's deadline and twice the clock margin, within `answer_by`); if it still has no
/// record then (its coordinator stopped after naming it, or is slower than the budget), it is recorded
/// ABORTED first, conditionally, on its request's behalf (`TransactionStore::fence_attempt`), so that
/// it can never begin afterwards. None: the record there is not `owner`'s request's (its caller or its
/// body is another's), which the chain does not follow.
pub(super) async fn attempt_named(
    c: &Coordinator,
    id: &str,
    earlier: &TransactionRecord,
    owner: &TransactionRecord,
    answer_by: Instant,
) -> Result<Option<TransactionRecord>, StoreError> {
    let mut wait = Duration::from_millis(20);
    loop {
        if let Some(record) = c.engine.transactions.get(id).await? {
            return Ok(own_attempt(owner, record));
        }
        let left = answer_by.saturating_duration_since(Instant::now());
        if left.is_zero() || c.engine.clock.now_ms() > resolvable_after(earlier.deadline) {
            break;
        }
        tokio::time::sleep(wait.min(left)).await;
        wait = (wait * 2).min(Duration::from_millis(250));
    }
    let fenced = c.engine.transactions.fence_attempt(id, c.engine.clock.now_ms(), ATTEMPT_NOT_STARTED, earlier).await?;
    Ok(own_attempt(owner, fenced))
}

/// Whether an aborted attempt's coordinator may still start the next one. Only a record written before
/// issue 41 can be in that state (its coordinator named the next attempt after the abort, then): refused
/// for contention only, attempts left, not retried yet, and its deadline (with the clock margins) not
/// passed. Today's coordinator names the next attempt in the abort itself (and marks its own refusal
/// `refusedForContention`): an abort that names none is final.
pub(super) fn may_be_retried(c: &Coordinator, record: &TransactionRecord) -> bool {
    matches!(record.status, Status::Aborting | Status::Aborted)
        && !record.refused_for_contention
        && record.retried_as.is_none()
        && record.attempt_number() < MAX_ATTEMPTS
        && record.participants.retryable()
        && c.engine.clock.now_ms() <= resolvable_after(record.deadline)
}

/// `attempt` when it is an attempt of `owner`'s request (its caller, its body); else None, logged: a record
/// under an id the chain names that is another's was written by someone other than the coordinator.
pub(super) fn own_attempt(owner: &TransactionRecord, attempt: TransactionRecord) -> Option<TransactionRecord> {
    if owner.same_request(&attempt) {
        return Some(attempt);
    }
    error!(
        tx = %owner.transaction_id,
        attempt = %attempt.transaction_id,
        "the chain names an attempt of another caller or body; not followed"
    );
    None
}

/// The transaction id of `principal`'s keyed request: the same key from the same caller always names the
/// same transaction, and from another caller another one. A request without a principal (no authorizer
/// ran) keeps the key's own id.
pub fn caller_idempotent_id(principal: Option<&str>, key: &str) -> String {
    use sha2::{Digest, Sha256};
    match principal {
        None => idempotent_id(key),
        Some(principal) => {
            let mut hash = Sha256::new();
            hash.update(b"twopc/idempotency-key/v2\0");
            hash.update(principal.as_bytes());
            hash.update(b"\0");
            hash.update(key.as_bytes());
            format!("tx-{}", &hex::encode(hash.finalize())[..32])
        }
    }
}

/// The transaction id of a keyed request before keys were scoped per caller (and still, for a request
/// without a principal): the key alone names it.
pub fn idempotent_id(key: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("tx-{}", &hex::encode(Sha256::digest(key.as_bytes()))[..32])
}
