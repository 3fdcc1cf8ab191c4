//! The attempts command: a request runs as one transaction, or, refused for contention only, as a chain of
//! attempts that keep its age (issue 41). Each attempt is an ordinary transaction over the phase engine;
//! this file adds what only attempts know: where a retry starts preparing (the hot item, the refusal's
//! place), when a refusal is retried (its abort names the next attempt, `retriedAs`, in the same write),
//! and the `ageToken` a final refusal answers with. A held request's hold, and one phase, are routed from
//! here to their own commands.

use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::{info, warn};

use super::ballot::{self, Verdict};
use super::engine::{Decided, PrepareOrder, Recording};
use super::one_phase::takes_one_phase_as;
use super::reply::{DriveError, Reply};
use super::{Coordinator, MAX_ATTEMPTS, MIN_ATTEMPT_MS, NO_TIME_TO_BEGIN};
use crate::attempts::ContentionAbort;
use crate::faults::CoordinatorCrash;
use crate::model::Status;
use crate::record::{ParticipantEntry, TransactionRecord};
use crate::telemetry;

/// What one attempt of a request came to: its answer, and the attempt's record when it ended aborted (its
/// abort recorded), for the coordinator to judge whether to retry it.
pub(super) struct Attempted {
    pub reply: Reply,
    pub refused: Option<Refused>,
}

impl From<Reply> for Attempted {
    fn from(reply: Reply) -> Attempted {
        Attempted { reply, refused: None }
    }
}

/// An attempt whose abort is recorded, with its votes, and the participant where a lock refused it.
pub(super) struct Refused {
    pub record: TransactionRecord,
    pub blocked_at: Option<usize>,
}

impl Coordinator {
    /// Runs a request's attempts: each is an ordinary transaction; one refused for contention only is
    /// followed by the next, with the same age, which prepares one participant at a time starting where
    /// the refusal was: holding nothing there, it waits for the older transaction's lock to go instead of
    /// being refused by it again. The next attempt is named (`retriedAs`) in the same write as the refused
    /// attempt's abort, so only this execution's own refusal is ever retried, and the link is on the record
    /// before its end. The answer is the last attempt's; a final refusal for contention carries the
    /// `ageToken` a caller's retry keeps the age with. `created`: the first attempt's record is written.
    pub(super) async fn run(
        &self,
        mut record: TransactionRecord,
        mut created: bool,
        answer_by: Instant,
        body_hash: &str,
        timeout_ms: u64,
        current: &std::sync::Mutex<String>,
    ) -> Result<Reply, DriveError> {
        // A request on an item that refused others lately starts there, one participant at a time.
        let mut first = self.hot.first_hot(&record.participants);
        loop {
            let attempted = self.run_attempt(record, created, answer_by, first).await?;
            created = false;
            let Some(refused) = attempted.refused else { return Ok(attempted.reply) };
            if let Some(at) = refused.blocked_at {
                self.hot.mark(&refused.record.participants[at]);
            }
            let Some(next_id) = refused.record.successor().map(str::to_owned) else {
                return Ok(self.with_age_token(attempted.reply, &refused.record, body_hash, timeout_ms).await);
            };
            self.faults.check(CoordinatorCrash::AfterClaim)?;
            // The refused attempt's second phase may have taken the time the next one needed: then the next
            // one is fenced (it never begins) and its abort is the request's answer.
            let budget_left = answer_by.saturating_duration_since(Instant::now());
            let now = self.clock.now_ms();
            if now > refused.record.deadline.saturating_sub(MIN_ATTEMPT_MS)
                || budget_left < Duration::from_millis(MIN_ATTEMPT_MS)
            {
                let fenced = self.transactions.fence_attempt(&next_id, now, NO_TIME_TO_BEGIN, &refused.record).await?;
                return Ok(Reply::for_record(&fenced));
            }
            let attempt = refused.record.attempt_number() + 1;
            let next = refused.record.next_attempt(next_id, attempt, self.clock.now_ms());
            info!(tx = %next.transaction_id, attempt, "retrying a refusal for contention");
            *current.lock().expect("the attempt's id is never poisoned") = next.transaction_id.clone();
            record = next;
            first = refused.blocked_at;
        }
    }

    /// `reply` with the `ageToken` of its request when its last attempt was refused for contention only
    /// (CONFLICT, or TIMEOUT waiting for a younger lock): a caller's retry with it keeps the request's age.
    async fn with_age_token(
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
        let now = self.clock.now_ms();
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

    /// One attempt over the phase engine; a retry prepares the participant at index `first` first (where its
    /// predecessor was refused). A keyed or held request is recorded first (`created`: already written),
    /// any other only at its decision (presumed abort).
    async fn run_attempt(
        &self,
        record: TransactionRecord,
        created: bool,
        answer_by: Instant,
        first: Option<usize>,
    ) -> Result<Attempted, DriveError> {
        // A held transaction never commits in one phase: its decision is the caller's, later. Nor does one
        // whose record is written already (a token's retry): one phase creates its record as it commits.
        if !created && takes_one_phase_as(&record, self.catalogs()) {
            return self.run_one_phase(record, answer_by).await;
        }
        let started = Instant::now();
        // A held transaction is recorded first too: its record is what its commit and abort find.
        let recording = match record.is_keyed() || record.is_held() {
            true => Recording::RecordFirst,
            false => Recording::AtDecision,
        };
        if recording == Recording::RecordFirst && !created {
            // A keyed request must never run twice: the record is written first and only the writer prepares.
            if let Some(existing) = self.create_own(&record.clone().opened()).await? {
                return Ok(self.replay(existing, record.request_hash.as_deref(), answer_by).await?.into());
            }
            self.faults.check(CoordinatorCrash::AfterCreate)?;
        }
        let votes = self.prepare(&record, &self.prepare_order(&record, first)).await?;
        let blocked = ballot::blocked(&votes);
        let blocked_at = blocked.map(|(at, _)| at);
        let prepared = started.elapsed();
        telemetry::phase(telemetry::PREPARE_LATENCY, prepared);
        let deciding = Instant::now();
        let decided = match ballot::verdict(&votes, self.clock.now_ms() <= record.deadline) {
            Verdict::Commit if record.is_held() => Decided::Open(self.hold(&record, votes).await?),
            Verdict::Commit => self.commit(record, votes, recording).await?,
            Verdict::Abort(reason) => {
                let blocker = blocked.map(|(_, blocker)| blocker.to_owned());
                let own = self.contention_abort(&record, &votes, blocker.as_deref(), answer_by).await;
                self.abort(record, votes, reason, &own, recording).await?
            }
        };
        let decided = match decided {
            Decided::Open(decided) => decided,
            Decided::Ended { reply, aborted } => {
                let status = reply.body["status"].as_str().unwrap_or("-").to_owned();
                info!(status, total_ms = started.elapsed().as_millis() as u64, "transaction answered");
                return Ok(Attempted { reply, refused: aborted.map(|record| Refused { record, blocked_at }) });
            }
        };
        self.faults.check(CoordinatorCrash::AfterDecision)?;
        telemetry::phase(telemetry::DECISION_LATENCY, deciding.elapsed());
        if decided.status == Status::Prepared {
            return Ok(self.answer_held(decided).await.into());
        }
        let second_phase = Instant::now();
        let finished = self.drive_within(decided.clone(), answer_by).await?;
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
        let refused = matches!(finished.status, Status::Aborting | Status::Aborted)
            .then(|| Refused { record: super::engine::with_votes(finished, decided.participants), blocked_at });
        Ok(Attempted { reply, refused })
    }

    /// A retry (an attempt after the first, or a caller's retry with an age token) or a request on a hot
    /// item prepares one participant at a time, `first` first; any other, everyone at once.
    fn prepare_order(&self, record: &TransactionRecord, first: Option<usize>) -> PrepareOrder {
        let participants = record.participants.len();
        let one_at_a_time =
            self.sequential_prepares || record.attempt_number() > 1 || record.age_of.is_some() || first.is_some();
        match one_at_a_time {
            true => PrepareOrder::one_at_a_time(participants, first),
            false => PrepareOrder::all_at_once(participants),
        }
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
        let refused = ballot::refused_for_contention(votes);
        let attempt = record.attempt_number();
        let last_start = record.deadline.saturating_sub(MIN_ATTEMPT_MS);
        let budget_left = answer_by.saturating_duration_since(Instant::now());
        let retried = ballot::retryable(votes)
            && attempt < MAX_ATTEMPTS
            && self.clock.now_ms() <= last_start
            && budget_left >= Duration::from_millis(MIN_ATTEMPT_MS)
            && !self.held_blocker(blocked_by).await;
        let successor = retried.then(|| crate::record::attempt_id(record.first_id(), attempt + 1));
        ContentionAbort { refused, successor }
    }

    /// Whether the transaction whose lock refused an attempt is held for its caller's decision (or cannot be
    /// read: then the refusal is the answer too).
    async fn held_blocker(&self, blocked_by: Option<&str>) -> bool {
        let Some(blocker) = blocked_by else { return false };
        match self.transactions.get(blocker).await {
            Ok(Some(holder)) => holder.status == Status::Prepared,
            Ok(None) => false,
            Err(e) => {
                warn!(error = %e, blocker, "could not read the blocking transaction; answering the refusal");
                true
            }
        }
    }
}
