//! The contract's data, each part in a module of its own: operations ([`operation`]), the REST request ([`request`]), a transaction's status ([`status`]) and
//! the participant messages ([`message`], typed; [`wire`], as they travel); with the REST API's error codes ([`crate::errors`]). Everything
//! is re-exported here, so `twopc::model::Operation` names it as before.

pub mod message;
pub mod operation;
pub mod request;
pub mod status;
pub mod wire;

pub use crate::errors::{ErrorCode, Invalid};
pub use message::Message;
pub use operation::{
    Key, MAX_KEY_BYTES, MAX_KEY_NAME_BYTES, MAX_NESTING, MAX_OPERATIONS_PER_PARTICIPANT, MAX_PARTICIPANTS, Operation,
    key_text,
};
pub use request::{
    DEFAULT_MAX_HOLD_MS, DEFAULT_SERVICE_MAX_HOLD_MS, DEFAULT_TIMEOUT_MS, MAX_BODY_BYTES, MAX_TIMEOUT_MS, MIN_HOLD_MS,
    MIN_TIMEOUT_MS, ParticipantPart, TransactionRequest,
};
pub use status::Status;
pub use wire::{
    Action, MAX_SERVICE_CODE_BYTES, ParticipantRequest, ParticipantResponse, RefusalCode, STATUS_ABORTED,
    STATUS_COMMITTED, STATUS_FAILED, STATUS_HELD, STATUS_NOT_PREPARED, STATUS_RECORD_EXISTS, Vote, canonical_json,
};
