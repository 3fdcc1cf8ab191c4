//! The recovery command: the sweeper's rule, and a key's replay's or a held decision's when the first
//! execution stopped. An undecided record past its expiry (its deadline, or its `holdUntil`, and twice the
//! clock margin) is aborted by the same conditional write lock resolution uses; a decided one is driven to
//! its end by the phase engine.

use super::reply::DriveError;
use super::{Coordinator, Driven};
use crate::clock::resolvable_after;
use crate::model::Status;
use crate::record::{TransactionRecord, Transition};

impl Coordinator {
    /// Drives a decided transaction to its end: commits (or aborts) at every participant that holds
    /// locks, then the terminal status. A participant that cannot be reached leaves it open for the
    /// sweeper, and the record says so.
    pub async fn finish(&self, record: TransactionRecord) -> Result<TransactionRecord, DriveError> {
        Ok(self.drive(record).await?.record)
    }

    /// Brings an open transaction to its end: the sweeper's rule, and an idempotent retry's when the
    /// first execution stopped. PREPARING past its deadline (and twice the clock margin) is aborted by the
    /// same conditional write that lock resolution uses; a PREPARING one within it is left alone.
    /// Returns the record as it ends up, and whether this call wrote its terminal status.
    pub async fn recover(&self, record: TransactionRecord) -> Result<Driven, DriveError> {
        let record = self.abort_expired(record).await?;
        self.drive(record).await
    }

    /// A PREPARING record past its deadline and twice the clock margin (every resolver's rule,
    /// `crate::clock::resolvable_after`) is aborted by the conditional write lock resolution uses; any
    /// other record is returned as it is. Returns the record as it then is.
    pub(super) async fn abort_expired(&self, record: TransactionRecord) -> Result<TransactionRecord, DriveError> {
        let undecided = matches!(record.status, Status::Preparing | Status::Prepared);
        if !undecided || self.clock.now_ms() <= resolvable_after(record.expiry()) {
            return Ok(record);
        }
        let reason = crate::recovery::expiry_reason(record.status);
        let transition = self
            .transition_retrying(
                &record.transaction_id,
                record.status,
                Status::Aborting,
                record.is_keyed(),
                None,
                Some(reason),
            )
            .await?;
        Ok(match transition {
            Transition::Done(r) | Transition::Lost(Some(r)) => r,
            Transition::Lost(None) => record,
        })
    }
}
