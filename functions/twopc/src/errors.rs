//! The REST API's error codes (the contract's `error.code`) and [`Invalid`], a request refused with one
//! before anything is written.

use std::fmt;

/// The REST API's error codes (`{"error": {"code", "message"}}`), each with the HTTP status it is
/// answered with. One list, so that `openapi.yaml` is checked against it (tests/tests/openapi.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// A field is missing, has the wrong type or value, or is not one the operation takes.
    InvalidRequest,
    MalformedJson,
    BodyTooLarge,
    NoParticipants,
    NoOperations,
    UnknownService,
    DuplicateService,
    UnknownOperation,
    DuplicateItem,
    /// A value DynamoDB could not store or express (key size, nesting, number range, expression size).
    LimitExceeded,
    InvalidIdempotencyKey,
    NotFound,
    MethodNotAllowed,
    IdempotencyKeyReused,
    /// A fault injected for tests stopped the coordinator; never answered in production.
    Crashed,
    Unavailable,
    /// `POST /transactions/{id}/commit` or `/abort` on a transaction that was not held.
    NotHeld,
    /// The access policy does not let this caller write an item of the request (403).
    Forbidden,
    /// A guard (`min`, `max`, `check`) on an item the caller may not read (400).
    GuardNotAllowed,
    /// A non-admin's held request (`holdMs`) that credits an item its caller does not own: it would hold
    /// the owner's item for the whole hold (403).
    HeldCreditNotAllowed,
    /// An `Age-Token` header that is not one the coordinator issued for this caller and this body, or has
    /// expired (400).
    InvalidAgeToken,
    /// An `Age-Token` whose retry already ran under another transaction id (409).
    AgeTokenUsed,
    /// The local stack only: a POST without `Content-Type: application/json` (415), which a page of
    /// another origin could send without a CORS preflight.
    UnsupportedMediaType,
    /// An operator's `retry` of a transaction that is not decided (PREPARING, or PREPARED held): only its
    /// coordinator, its caller or an `abort` decides it (409).
    NotDecided,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 24] = [
        ErrorCode::InvalidRequest,
        ErrorCode::MalformedJson,
        ErrorCode::BodyTooLarge,
        ErrorCode::NoParticipants,
        ErrorCode::NoOperations,
        ErrorCode::UnknownService,
        ErrorCode::DuplicateService,
        ErrorCode::UnknownOperation,
        ErrorCode::DuplicateItem,
        ErrorCode::LimitExceeded,
        ErrorCode::InvalidIdempotencyKey,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::IdempotencyKeyReused,
        ErrorCode::Crashed,
        ErrorCode::Unavailable,
        ErrorCode::NotHeld,
        ErrorCode::Forbidden,
        ErrorCode::GuardNotAllowed,
        ErrorCode::HeldCreditNotAllowed,
        ErrorCode::InvalidAgeToken,
        ErrorCode::AgeTokenUsed,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::NotDecided,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::MalformedJson => "MALFORMED_JSON",
            ErrorCode::BodyTooLarge => "BODY_TOO_LARGE",
            ErrorCode::NoParticipants => "NO_PARTICIPANTS",
            ErrorCode::NoOperations => "NO_OPERATIONS",
            ErrorCode::UnknownService => "UNKNOWN_SERVICE",
            ErrorCode::DuplicateService => "DUPLICATE_SERVICE",
            ErrorCode::UnknownOperation => "UNKNOWN_OPERATION",
            ErrorCode::DuplicateItem => "DUPLICATE_ITEM",
            ErrorCode::LimitExceeded => "LIMIT_EXCEEDED",
            ErrorCode::InvalidIdempotencyKey => "INVALID_IDEMPOTENCY_KEY",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            ErrorCode::IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED",
            ErrorCode::Crashed => "CRASHED",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::NotHeld => "NOT_HELD",
            ErrorCode::Forbidden => "FORBIDDEN",
            ErrorCode::GuardNotAllowed => "GUARD_NOT_ALLOWED",
            ErrorCode::HeldCreditNotAllowed => "HELD_CREDIT_NOT_ALLOWED",
            ErrorCode::InvalidAgeToken => "INVALID_AGE_TOKEN",
            ErrorCode::AgeTokenUsed => "AGE_TOKEN_USED",
            ErrorCode::UnsupportedMediaType => "UNSUPPORTED_MEDIA_TYPE",
            ErrorCode::NotDecided => "NOT_DECIDED",
        }
    }

    /// The HTTP status an answer with this code has.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::IdempotencyKeyReused => 422,
            ErrorCode::Crashed => 500,
            ErrorCode::Unavailable => 503,
            ErrorCode::NotHeld => 409,
            ErrorCode::AgeTokenUsed | ErrorCode::NotDecided => 409,
            ErrorCode::Forbidden | ErrorCode::HeldCreditNotAllowed => 403,
            ErrorCode::UnsupportedMediaType => 415,
            _ => 400,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A request that cannot be carried out as written; becomes a 400 with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    pub code: ErrorCode,
    pub message: String,
}

impl Invalid {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Invalid { code, message: message.into() }
    }
    pub(crate) fn at(path: &str, message: impl fmt::Display) -> Self {
        Invalid::new(ErrorCode::InvalidRequest, format!("{path}: {message}"))
    }
}
