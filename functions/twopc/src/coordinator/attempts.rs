//! The attempts command: a request runs as one transaction, or, refused for contention only, as a chain of
//! attempts that keep its age (issue 41). Each attempt is an ordinary transaction over the phase engine;
//! this file adds what only attempts know: where a retry starts preparing (the hot item, the refusal's
//! place), when a refusal is retried (its abort names the next attempt, `retriedAs`, in the same write),
//! and the `ageToken` a final refusal answers with. Each attempt runs in one phase (`one_phase.rs`) or in
//! two (`two_phase.rs`, which holds a held request for its caller).

use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::{info, warn};

use super::ballot::Votes;
use super::one_phase::takes_one_phase_as;
use super::reply::{Answering, DriveError, Reply};
use super::{Coordinator, MAX_ATTEMPTS, MIN_ATTEMPT_MS, NO_TIME_TO_BEGIN};
use crate::attempts::ContentionAbort;
use crate::faults::CoordinatorCrash;
use crate::model::Status;
use crate::record::{ParticipantEntry, TransactionRecord, Transition};

/// Runs a request's attempts: each is an ordinary transaction; one refused for contention only is
/// followed by the next, with the same age, which prepares one participant at a time starting where
/// the refusal was: holding nothing there, it waits for the older transaction's lock to go instead of
/// being refused by it again. The next attempt is named (`retriedAs`) in the same write as the refused
/// attempt's abort, so only this execution's own refusal is ever retried, and the link is on the record
/// before its end. The answer is the last attempt's; a final refusal for contention carries the
/// `ageToken` a caller's retry keeps the age with. `created`: the first attempt's record is written.
pub(super) async fn run(
    c: &Coordinator,
    mut record: TransactionRecord,
    mut created: bool,
    answering: Answering,
    body_hash: &str,
    timeout_ms: u64,
    current: &std::sync::Mutex<String>,
) -> Result<Reply, DriveError> {
    // A request on an item that refused others lately starts there, one participant at a time.
    let mut first = c.hot.first_hot(&record.participants);
    loop {
        // A held transaction never commits in one phase: its decision is the caller's, later. Nor does one
        // whose record is written already (a token's retry): one phase creates its record as it commits.
        let attempted = if !created && takes_one_phase_as(&record, c.catalogs()) {
            super::one_phase::run_one_phase(c, record, answering.by).await?
        } else {
            super::two_phase::run_two_phase(c, record, created, answering, first).await?
        };
        let Some(refused) = attempted.refused else { return Ok(attempted.reply) };
        if let Some(at) = refused.blocked_at {
            c.hot.mark(&refused.record.participants[at]);
        }
        let blocked_at = refused.blocked_at;
        let deadline = refused.record.deadline;
        let last = refused.record.clone();
        let Some(next) = refused.next_attempt() else {
            return Ok(c.with_age_token(attempted.reply, &last, body_hash, timeout_ms).await);
        };
        c.engine.faults.check(CoordinatorCrash::AfterClaim)?;
        // The refused attempt's second phase may have taken the time the next one needed: then the next
        // one, created with the link and never begun, is ended (nothing was sent for it) and its abort is
        // the request's answer. Conditional: a caller's or an operator's abort may have ended it first.
        let budget_left = answering.by.saturating_duration_since(Instant::now());
        let now = c.engine.clock.now_ms();
        if now > deadline.saturating_sub(MIN_ATTEMPT_MS) || budget_left < Duration::from_millis(MIN_ATTEMPT_MS) {
            let id = &next.transaction_id;
            let keyed = next.is_keyed();
            let ended = c
                .engine
                .transition_retrying(id, Status::Preparing, Status::Aborted, keyed, None, Some(NO_TIME_TO_BEGIN))
                .await?;
            return match ended {
                Transition::Done(ended) | Transition::Lost(Some(ended)) => Ok(Reply::for_record(&ended)),
                Transition::Lost(None) => {
                    let table = c.engine.transactions.table();
                    Err(crate::store::StoreError::internal("UpdateItem", table, format!("record {id} disappeared"))
                        .into())
                }
            };
        }
        // Read before it begins: a caller's held abort or an operator's abort, following the chain, may have
        // ended it already, and its prepares would then lock items nobody releases before they expire.
        match c.engine.transactions.get(&next.transaction_id).await? {
            Some(found) if found.status == Status::Preparing && found.execution_id == next.execution_id => {}
            Some(found) => {
                info!(tx = %found.transaction_id, status = %found.status, "the next attempt was decided before it began");
                return Ok(Reply::for_record(&found));
            }
            None => {
                let table = c.engine.transactions.table();
                let missing = format!("record {} written with its link but not found", next.transaction_id);
                return Err(crate::store::StoreError::internal("GetItem", table, missing).into());
            }
        }
        info!(tx = %next.transaction_id, attempt = next.attempt_number(), "retrying a refusal for contention");
        *current.lock().expect("the attempt's id is never poisoned") = next.transaction_id.clone();
        record = next;
        // Its record was created with the link.
        created = true;
        first = blocked_at;
    }
}

impl Coordinator {
    /// `reply` with the `ageToken` of its request when its last attempt was refused for contention only
    /// (CONFLICT, or TIMEOUT waiting for a younger lock): a caller's retry with it keeps the request's age.
    pub(super) async fn with_age_token(
        &self,
        mut reply: Reply,
        last: &TransactionRecord,
        body_hash: &str,
        timeout_ms: u64,
    ) -> Reply {
        // Only an attempt whose recorded abort is its own refusal for contention, not retried by its coordinator.
        if reply.status != 409 || !last.refused_for_contention || last.retried_as.is_some() {
            return reply;
        }
        let now = self.engine.clock.now_ms();
        let age = crate::age::Age {
            started_at: last.age(),
            principal: last.principal.clone(),
            body_hash: body_hash.to_owned(),
            first_transaction_id: last.first_id().to_owned(),
            retry_of: last.transaction_id.clone(),
            attempt: last.attempt_number() + 1,
            expires_at: now + timeout_ms,
            key_id: String::new(),
        };
        match crate::age::issue(self.age_keys.as_ref(), age, now).await {
            Ok(token) => reply.body["ageToken"] = Value::String(token),
            Err(e) => warn!(error = %e, "could not sign an age token; answering without one"),
        }
        reply
    }

    /// What an attempt's abort records of its own: whether it is a refusal for contention only, and the
    /// attempt it is retried as, when it is one the coordinator retries: refused for contention (CONFLICT)
    /// only, attempts and time left, and not blocked by a transaction held for its caller's decision
    /// (outside the bound: its refusal is the answer).
    pub(super) async fn contention_abort(
        &self,
        record: &TransactionRecord,
        votes: &[ParticipantEntry],
        blocked_by: Option<&str>,
        answer_by: Instant,
    ) -> ContentionAbort {
        let refused = votes.refused_for_contention();
        let attempt = record.attempt_number();
        let last_start = record.deadline.saturating_sub(MIN_ATTEMPT_MS);
        let budget_left = answer_by.saturating_duration_since(Instant::now());
        let retried = votes.retryable()
            && attempt < MAX_ATTEMPTS
            && self.engine.clock.now_ms() <= last_start
            && budget_left >= Duration::from_millis(MIN_ATTEMPT_MS)
            && !self.held_blocker(blocked_by).await;
        let next = retried.then(|| {
            let id = crate::record::attempt_id(record.first_id(), attempt + 1);
            Box::new(record.next_attempt(id, attempt + 1, self.engine.clock.now_ms()).opened())
        });
        ContentionAbort { refused, next }
    }

    /// Whether the transaction whose lock refused an attempt is held for its caller's decision (or cannot be
    /// read: then the refusal is the answer too).
    pub(super) async fn held_blocker(&self, blocked_by: Option<&str>) -> bool {
        let Some(blocker) = blocked_by else { return false };
        match self.engine.transactions.get(blocker).await {
            Ok(Some(holder)) => holder.status == Status::Prepared,
            Ok(None) => false,
            Err(e) => {
                warn!(error = %e, blocker, "could not read the blocking transaction; answering the refusal");
                true
            }
        }
    }
}
