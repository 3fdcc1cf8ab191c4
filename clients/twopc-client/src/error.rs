use crate::answer::{ApiError, ErrorCode};

/// Everything that can stop a call short of an [`Outcome`](crate::Outcome). An aborted transaction
/// is an outcome, not an error. A later version may add variants (a match needs a wildcard arm).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// 400: the request is invalid (the message says what is wrong); nothing was written.
    #[error("invalid request: {0}")]
    Invalid(ApiError),
    /// 422: the `Idempotency-Key` was used before with another body.
    #[error("Idempotency-Key reused with another body: {0}")]
    IdempotencyKeyReused(ApiError),
    /// 404: no such transaction (`GET`; for `commit` and `abort` also one another principal created),
    /// or an unknown route.
    #[error("not found: {0}")]
    NotFound(ApiError),
    /// 403 `FORBIDDEN`: the access policy does not let this caller write an item of the request (the
    /// message says which and why); or 403 `HELD_CREDIT_NOT_ALLOWED`: a held request (`holdMs`) credits
    /// an item this caller does not own. Nothing was written.
    #[error("forbidden: {0}")]
    Forbidden(ApiError),
    /// 409 `NOT_HELD`: `commit` or `abort` of a transaction that was not held (it was decided when it
    /// was submitted; the message says how). Nothing changed.
    #[error("not held: {0}")]
    NotHeld(ApiError),
    /// 503 on every attempt: the transaction store could not be reached, or (`commit`) the held
    /// transaction is still preparing. With a `transaction_id`, the message says whether the outcome is
    /// known; `GET` it later.
    #[error("unavailable{}: {error}", transaction_id.as_ref().map(|id| format!(" ({id})")).unwrap_or_default())]
    Unavailable { transaction_id: Option<String>, error: ApiError },
    /// Any other status (after the retries, for 429, 502 and 504), with the body as text.
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },
    /// The server could not be reached or did not answer in time, on every attempt.
    #[error("transport: {0}")]
    Transport(#[source] reqwest::Error),
    /// A 200, 202 or 409 whose body is not a transaction (nor, for a 409, an error).
    #[error("HTTP {status} answered a body that is not a transaction ({message}): {body}")]
    Decode { status: u16, message: String, body: String },
    /// The URL cannot be called or signed.
    #[error("invalid URL {url}: {message}")]
    Url { url: String, message: String },
    /// No credentials to sign with.
    #[error("credentials: {0}")]
    Credentials(#[source] aws_credential_types::provider::error::CredentialsError),
    #[error("signing: {0}")]
    Signing(String),
    /// No TLS configuration for `https://` or `wss://` (no root certificates on this system).
    #[error("TLS: {0}")]
    Tls(String),
    #[error("WebSocket: {0}")]
    WebSocket(#[source] tokio_tungstenite::tungstenite::Error),
    /// A WebSocket message that is not JSON.
    #[error("WebSocket message is not JSON ({message}): {text}")]
    Push { message: String, text: String },
}

impl Error {
    /// The typed error of a status other than 200, 202 and 409, or of a 409 that carries an error.
    pub(crate) fn from_status(status: u16, body: &[u8]) -> Error {
        let (error, transaction_id) = ApiError::parse(body);
        match status {
            400 => Error::Invalid(error),
            404 => Error::NotFound(error),
            403 if error.code == ErrorCode::Forbidden || error.code == ErrorCode::HeldCreditNotAllowed => {
                Error::Forbidden(error)
            }
            409 if error.code == ErrorCode::NotHeld => Error::NotHeld(error),
            422 => Error::IdempotencyKeyReused(error),
            503 => Error::Unavailable { transaction_id, error },
            _ => Error::Status { status, body: String::from_utf8_lossy(body).into_owned() },
        }
    }

    /// The error answer's code, for the errors that carry one.
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            Error::Invalid(e)
            | Error::IdempotencyKeyReused(e)
            | Error::NotFound(e)
            | Error::NotHeld(e)
            | Error::Forbidden(e) => Some(&e.code),
            Error::Unavailable { error, .. } => Some(&error.code),
            _ => None,
        }
    }
}
