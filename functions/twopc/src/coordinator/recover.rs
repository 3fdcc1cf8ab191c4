//! The recovery command: the sweeper's rule, and a key's replay's or a held decision's when the first
//! execution stopped. An undecided record past its expiry (its deadline, or its `holdUntil`, and twice the
//! clock margin) is aborted by the same conditional write lock resolution uses; a decided one is driven to
//! its end by the phase engine.

use super::Coordinator;
use super::reply::DriveError;
use crate::clock::resolvable_after;
use crate::model::Status;
use crate::record::{TransactionRecord, Transition};

/// An undecided record (PREPARING, or PREPARED held) past its expiry (its deadline, or `holdUntil`) and
/// twice the clock margin (every resolver's rule, `crate::clock::resolvable_after`) is aborted by the
/// conditional write lock resolution uses; any other record is returned as it is. Returns the record as
/// it then is.
pub(super) async fn abort_expired(c: &Coordinator, record: TransactionRecord) -> Result<TransactionRecord, DriveError> {
    let undecided = matches!(record.status, Status::Preparing | Status::Prepared);
    if !undecided || c.engine.clock.now_ms() <= resolvable_after(record.expiry()) {
        return Ok(record);
    }
    let reason = crate::recovery::expiry_reason(record.status);
    let transition = c
        .engine
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
