//! The chain of a request's attempts, as the coordinator walks it (issue 41): whether an abort of its own
//! names the next attempt, and how a key's replay and a held decision reach the attempt that lives.
//!
//! A step along the chain follows an attempt only if it is the same request's (issue 42,
//! [`TransactionRecord::same_request`]): the caller of the attempt it started from, the same body. A
//! record under the id the chain names that is another's (written by someone who could write the table)
//! is neither followed, nor driven, nor decided: the walk ends at the request's own last attempt.

use super::*;

impl Coordinator {
    /// What an attempt's abort records of its own: whether it is a refusal for contention only, and the
    /// attempt it is retried as, when it is one the coordinator retries: refused for contention (CONFLICT)
    /// only, attempts and time left, and not blocked by a transaction held for its caller's decision
    /// (outside the bound: its refusal is the answer).
    pub(super) async fn contention_abort(
        &self,
        record: &TransactionRecord,
        votes: &[ParticipantEntry],
        blocked_by: Option<&str>,
        answer_by: std::time::Instant,
    ) -> ContentionAbort {
        let refused = refused_for_contention(votes);
        let attempt = record.attempt_number();
        let last_start = record.deadline.saturating_sub(MIN_ATTEMPT_MS);
        let budget_left = answer_by.saturating_duration_since(std::time::Instant::now());
        let retried = retryable_votes(votes)
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

    /// The attempt `id` that `earlier`'s `retriedAs` names. Its coordinator creates it once the earlier
    /// attempt's abort is driven, so it is waited for while that coordinator may still be at work (until
    /// the earlier attempt's deadline and twice the clock margin, within `answer_by`); if it still has no
    /// record then (its coordinator stopped after naming it, or is slower than the budget), it is recorded
    /// ABORTED first, conditionally, on its request's behalf ([`TransactionStore::fence_attempt`]), so that
    /// it can never begin afterwards. None: the record there is not `owner`'s request's (its caller or its
    /// body is another's), which the chain does not follow.
    pub(super) async fn attempt_named(
        &self,
        id: &str,
        earlier: &TransactionRecord,
        owner: &TransactionRecord,
        answer_by: std::time::Instant,
    ) -> Result<Option<TransactionRecord>, StoreError> {
        let mut wait = Duration::from_millis(20);
        loop {
            if let Some(record) = self.transactions.get(id).await? {
                return Ok(own_attempt(owner, record));
            }
            let left = answer_by.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || self.clock.now_ms() > resolvable_after(earlier.deadline) {
                break;
            }
            tokio::time::sleep(wait.min(left)).await;
            wait = (wait * 2).min(Duration::from_millis(250));
        }
        let fenced = self.transactions.fence_attempt(id, self.clock.now_ms(), ATTEMPT_NOT_STARTED, earlier).await?;
        Ok(own_attempt(owner, fenced))
    }

    /// Whether an aborted attempt's coordinator may still start the next one. Only a record written before
    /// issue 41 can be in that state (its coordinator named the next attempt after the abort, then): refused
    /// for contention only, attempts left, not retried yet, and its deadline (with the clock margins) not
    /// passed. Today's coordinator names the next attempt in the abort itself (and marks its own refusal
    /// `refusedForContention`): an abort that names none is final.
    pub(super) fn may_be_retried(&self, record: &TransactionRecord) -> bool {
        matches!(record.status, Status::Aborting | Status::Aborted)
            && !record.refused_for_contention
            && record.retried_as.is_none()
            && record.attempt_number() < MAX_ATTEMPTS
            && retryable_votes(&record.participants)
            && self.clock.now_ms() <= resolvable_after(record.deadline)
    }

    /// The attempt of `record`'s request that lives: its coordinator's chain followed from `record`. One named
    /// but not begun is fenced by an abort (it can then never begin); for a commit it is still preparing
    /// (`Err`: the 503 that says so). One that is not `record`'s request's (another caller, another body)
    /// is not followed: the last attempt of its own is the one that lives.
    pub(super) async fn live_attempt(
        &self,
        mut record: TransactionRecord,
        decision: HeldDecision,
        hops: &mut usize,
    ) -> Result<Result<TransactionRecord, Reply>, DriveError> {
        let owner = record.clone();
        while let Some(next) = record.successor().map(str::to_owned).filter(|_| *hops < MAX_CHAIN_HOPS) {
            *hops += 1;
            let attempt = match (self.transactions.get(&next).await?, decision) {
                (Some(attempt), _) => attempt,
                (None, HeldDecision::Abort) => {
                    self.transactions.fence_attempt(&next, self.clock.now_ms(), HELD_ABORT_REASON, &record).await?
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
}

/// `attempt` when it is an attempt of `owner`'s request (its caller, its body); else None, logged: a record
/// under an id the chain names that is another's was written by someone other than the coordinator.
fn own_attempt(owner: &TransactionRecord, attempt: TransactionRecord) -> Option<TransactionRecord> {
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
