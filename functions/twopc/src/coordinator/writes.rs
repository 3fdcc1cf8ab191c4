//! The coordinator's writes to a transaction record, each conditional and retried on infrastructure
//! errors: a retry that finds what it wanted found its own earlier write (every record write carries
//! the execution's id), and one that ends in an error says whether any attempt may have taken effect.

use std::time::Duration;

use tracing::warn;

use super::Coordinator;
use crate::attempts::ContentionAbort;
use crate::model::Status;
use crate::record::{ParticipantEntry, TransactionRecord, Transition};
use crate::store::{StoreError, WriteOutcome};

impl Coordinator {
    /// Creates a record unless one exists, retried on infrastructure errors: `Some` is the record another
    /// write created first. A record found with this execution's id and this status is this very write
    /// (an attempt whose reply was lost, retried by the SDK or here), and counts as created: an execution
    /// never creates two records with the same status.
    pub(super) async fn create_own(&self, record: &TransactionRecord) -> Result<Option<TransactionRecord>, StoreError> {
        retrying("record write", |_| async move {
            Ok(match self.transactions.create(record).await? {
                Some(existing)
                    if existing.execution_id.is_some()
                        && existing.execution_id == record.execution_id
                        && existing.status == record.status =>
                {
                    None
                }
                found => found,
            })
        })
        .await
    }

    /// This execution's abort decision of its keyed attempt `id` ([`TransactionStore::decide_abort`]), retried
    /// on infrastructure errors: a retry that finds ABORTING with this execution's `retriedAs` or
    /// `refusedForContention` found its own earlier write; any other ABORTING is someone else's abort.
    pub(super) async fn abort_retrying(
        &self,
        id: &str,
        votes: &[ParticipantEntry],
        reason: Option<&str>,
        contention: &ContentionAbort,
    ) -> Result<Transition, StoreError> {
        retrying("abort decision", |_| {
            self.transactions.decide_abort(id, true, self.clock.now_ms(), votes, reason, contention)
        })
        .await
    }

    /// A status change, retried on infrastructure errors: its condition makes a repeat harmless, and a
    /// retry that finds the status it wanted found its own earlier write.
    pub(super) async fn transition_retrying(
        &self,
        id: &str,
        from: Status,
        to: Status,
        keyed: bool,
        participants: Option<&[ParticipantEntry]>,
        reason: Option<&str>,
    ) -> Result<Transition, StoreError> {
        retrying("status write", |_| async move {
            self.transactions.transition(id, from, to, keyed, self.clock.now_ms(), participants, reason).await
        })
        .await
    }
}

/// A conditional write to a transaction record, tried up to three times on infrastructure errors. The
/// error it ends with says the write may have taken effect if any attempt may have.
pub(super) async fn retrying<T, Fut>(what: &str, mut write: impl FnMut(u32) -> Fut) -> Result<T, StoreError>
where
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut last: Option<StoreError> = None;
    for attempt in 0..3u32 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(25 << attempt)).await;
        }
        match write(attempt).await {
            Ok(done) => return Ok(done),
            Err(mut e) => {
                warn!(error = %e, attempt, "{what} failed");
                if last.as_ref().is_some_and(|l| l.outcome == WriteOutcome::Unknown) {
                    e.outcome = WriteOutcome::Unknown;
                }
                // Refused as invalid, it would be refused again: the caller fences it.
                if e.invalid {
                    return Err(e);
                }
                last = Some(e);
            }
        }
    }
    Err(last.expect("at least one attempt"))
}
