//! What the coordinator answers: the contract's HTTP replies, and the 503s that say what a caller may
//! conclude when the transaction store failed or the coordinator stopped short.

use std::time::Instant;

use serde_json::{Value, json};
use tracing::error;

use crate::faults::Crashed;
use crate::model::{ErrorCode, Invalid, Status};
use crate::record::TransactionRecord;
use crate::store::StoreError;

/// An HTTP answer: status code and JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    /// Answered on its commit decision, the second phase left for after the answer (the caller's `Prefer:
    /// respond-async`, applied): the function says so in `Preference-Applied`. A 202 COMMITTING whose
    /// answer budget ran out is not one.
    pub answered_on_decision: bool,
}

impl Reply {
    /// The contract's error answer: `{"error": {"code", "message"}}`.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Reply {
        let body = json!({"error": {"code": code.as_str(), "message": message.into()}});
        Reply { status: code.http_status(), body, answered_on_decision: false }
    }

    /// A 200 with `body`.
    pub fn ok(body: Value) -> Reply {
        Reply { status: 200, body, answered_on_decision: false }
    }

    pub(super) fn invalid(invalid: Invalid) -> Reply {
        Reply::error(invalid.code, invalid.message)
    }

    /// A POST's answer from the record it ended with: as [`Reply::for_record`], but an undecided
    /// transaction is a 503 with its id (202 means a decided commit).
    pub fn answering(record: &TransactionRecord) -> Reply {
        if record.status != Status::Preparing {
            return Reply::for_record(record);
        }
        let id = &record.transaction_id;
        let mut reply = Reply::error(
            ErrorCode::Unavailable,
            format!(
                "transaction {id} is not decided yet (its first execution is still at work or stopped before \
                 deciding); the outcome is not known yet: GET /transactions/{id} tells it once it is decided"
            ),
        );
        reply.body["transactionId"] = Value::String(id.clone());
        reply
    }

    /// A read's answer (`GET /transactions/{id}`): the record's body with 200 whatever its state, since
    /// the read succeeded; the body's `status` tells the outcome. (A POST answers with its outcome's code,
    /// [`Reply::for_record`]: a `curl -f`, a cache or a monitor would count an aborted transaction's read
    /// as a failed request.)
    pub fn reading(record: &TransactionRecord) -> Reply {
        Reply { status: 200, ..Reply::for_record(record) }
    }

    /// The contract's status code for a record's state. A decided abort is answered as the outcome it is
    /// (ABORTED: nothing applied, ever), while the sweeper may still be releasing its locks.
    pub fn for_record(record: &TransactionRecord) -> Reply {
        let status = match record.status {
            Status::Committed => 200,
            Status::Committing | Status::Preparing | Status::Prepared => 202,
            Status::Aborting | Status::Aborted => 409,
        };
        let mut body = record.to_response();
        if record.status == Status::Aborting {
            body["status"] = Value::String(Status::Aborted.as_str().to_owned());
        }
        Reply { status, body, answered_on_decision: false }
    }
}

/// When, and on what, a request is answered: by `by` at the latest (its answer budget), and, when
/// `on_decision` (the caller's `Prefer: respond-async`, applied), as soon as its commit decision is durable.
#[derive(Debug, Clone, Copy)]
pub struct Answering {
    pub by: Instant,
    pub on_decision: bool,
}

/// What one attempt of a request came to: its answer, and the attempt's record when it ended aborted (its
/// abort recorded), for the coordinator to judge whether to retry it.
pub struct Attempted {
    pub reply: Reply,
    pub refused: Option<Refused>,
}

impl From<Reply> for Attempted {
    fn from(reply: Reply) -> Attempted {
        Attempted { reply, refused: None }
    }
}

/// An attempt whose abort is recorded, with its votes, and the participant where a lock refused it.
pub struct Refused {
    pub record: TransactionRecord,
    pub blocked_at: Option<usize>,
    /// The next attempt this execution created with its abort (when the abort it wrote names it).
    pub next: Option<TransactionRecord>,
}

impl Refused {
    /// The attempt to begin next: the one this execution created, when the record's link names it.
    pub fn next_attempt(self) -> Option<TransactionRecord> {
        let next = self.next?;
        (self.record.successor() == Some(next.transaction_id.as_str())).then_some(next)
    }
}

/// Why driving a transaction stopped short of an answer.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Crashed(#[from] Crashed),
    /// The decision could not be recorded, nor an abort over it; `released`: it certainly did not happen,
    /// so the transaction was aborted and its locks released.
    #[error("the decision could not be recorded: {error}")]
    Unrecorded { error: StoreError, released: bool },
}

/// The answer for a drive that stopped short: a 503 (or the injected crash) with the transaction's id.
pub(super) fn drive_error_reply(error: DriveError, id: &str) -> Reply {
    match error {
        DriveError::Store(e) => unavailable(&e, Some(id)),
        DriveError::Unrecorded { error, released: true } => {
            error!(error = %error, "answering 503: aborted, decision refused");
            let mut reply = Reply::error(
                ErrorCode::Unavailable,
                "the transaction store refused to record the decision, so the transaction was aborted: \
                 nothing was applied and its locks are released",
            );
            reply.body["transactionId"] = Value::String(id.to_owned());
            reply
        }
        DriveError::Unrecorded { error, released: false } => unavailable(&error, Some(id)),
        DriveError::Crashed(c) => {
            let mut reply = Reply::error(ErrorCode::Crashed, c.to_string());
            reply.body["transactionId"] = Value::String(id.to_owned());
            reply
        }
    }
}

/// A 503 in the system's own words: which store failed and what the caller may conclude; the DynamoDB
/// error itself (operation, table, the service's text) goes to the log only.
pub(super) fn unavailable(error: &StoreError, id: Option<&str>) -> Reply {
    error!(error = %error, "answering 503");
    let mut reply = Reply::error(
        ErrorCode::Unavailable,
        format!(
            "the transaction store could not be reached; the outcome is {}",
            match id {
                Some(id) => format!("not known yet: GET /transactions/{id} tells it once recovery has run"),
                None => "unchanged".to_owned(),
            }
        ),
    );
    if let Some(id) = id {
        reply.body["transactionId"] = Value::String(id.to_owned());
    }
    reply
}
