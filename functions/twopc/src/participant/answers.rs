//! The answers a participant gives, in the protocol's words: one set, for items and for resources alike.

use serde_json::Value;
use tracing::info;

use super::{OperationRefusal, Refusal};
use crate::model::{MAX_SERVICE_CODE_BYTES, ParticipantResponse, RefusalCode, Vote};

/// PREPARED, with the token of the locks it took (none for a prepare that locked nothing).
pub(super) fn prepared(lock_token: Option<String>) -> ParticipantResponse {
    ParticipantResponse { vote: Some(Vote::Prepared), lock_token, ..Default::default() }
}

pub(super) fn refused(code: RefusalCode, reason: String) -> ParticipantResponse {
    ParticipantResponse { vote: Some(Vote::Refused), code: Some(code), reason: Some(reason), ..Default::default() }
}

/// A CONFLICT refusal by `owner`'s lock, naming it (`blockedBy`): the coordinator's retry starts there, or
/// does not happen if `owner` is held for its caller's decision.
pub(super) fn blocked(owner: &str, reason: String) -> ParticipantResponse {
    ParticipantResponse { blocked_by: Some(owner.to_owned()), ..refused(RefusalCode::Conflict, reason) }
}

/// The answer of a commit, an abort or a hold.
pub(super) fn status(status: &str, reason: Option<String>) -> ParticipantResponse {
    ParticipantResponse { status: Some(status.to_owned()), reason, ..Default::default() }
}

/// A service's refusal as a vote: REFUSED with the code RULE and the service's own code.
pub(super) fn rule_refused(refusal: Refusal) -> ParticipantResponse {
    info!(service_code = %refusal.code, reason = %refusal.reason, "the service refused");
    ParticipantResponse {
        service_code: Some(crate::record::cut(&refusal.code, MAX_SERVICE_CODE_BYTES)),
        ..refused(RefusalCode::Rule, refusal.reason)
    }
}

/// A service's own operation (or resource) refusing, as a vote.
pub(super) fn operation_refused(refusal: OperationRefusal) -> ParticipantResponse {
    match refusal {
        OperationRefusal::Invalid(reason) => refused(RefusalCode::Invalid, reason),
        OperationRefusal::ConditionFailed(reason) => refused(RefusalCode::ConditionFailed, reason),
        OperationRefusal::Rule(refusal) => rule_refused(refusal),
    }
}

/// A refusal as a barrier entry keeps it: the protocol's code, or a service's own (then RULE).
pub(super) fn stored_refusal(code: &str, reason: &str) -> ParticipantResponse {
    match serde_json::from_value::<RefusalCode>(Value::String(code.to_owned())) {
        Ok(code) => refused(code, reason.to_owned()),
        Err(_) => {
            ParticipantResponse { service_code: Some(code.to_owned()), ..refused(RefusalCode::Rule, reason.to_owned()) }
        }
    }
}
