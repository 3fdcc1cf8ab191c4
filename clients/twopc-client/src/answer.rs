//! What the API answers, typed. Every code is an enum with an `Other` fallback: a newer server's new
//! code reaches an older client as `Other("NEW_CODE")`, never as a decoding error.

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use crate::Error;

/// An enum of the contract's upper-case codes, with `Other` for any code this client does not know.
macro_rules! code_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
            /// A code this version of the client does not know.
            Other(String),
        }

        impl $name {
            /// Every code this client knows.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $text,)*
                    $name::Other(text) => text,
                }
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> $name {
                match text {
                    $($text => $name::$variant,)*
                    other => $name::Other(other.to_owned()),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                Ok($name::from(<String as ::serde::Deserialize>::deserialize(d)?.as_str()))
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}
pub(crate) use code_enum;

code_enum! {
    /// A transaction's status. Answers say `ABORTED` for a decided abort whose locks are still being
    /// released, so `ABORTING` is seen only in a record read elsewhere.
    Status {
        Preparing = "PREPARING",
        Committing = "COMMITTING",
        Committed = "COMMITTED",
        Aborting = "ABORTING",
        Aborted = "ABORTED",
    }
}

code_enum! {
    /// A participant's vote.
    Vote {
        Prepared = "PREPARED",
        Refused = "REFUSED",
    }
}

code_enum! {
    /// Why a participant did not prepare.
    RefusalCode {
        /// Another live transaction holds a lock on the item; a retry may go through.
        Conflict = "CONFLICT",
        /// A guard does not hold: `min`/`max`, `ifNotExists`, a `check`, a non-numeric field, a limit.
        ConditionFailed = "CONDITION_FAILED",
        /// The item does not exist.
        NotFound = "NOT_FOUND",
        /// No answer before the transaction's deadline.
        Timeout = "TIMEOUT",
        /// The participant failed or could not be reached.
        Unavailable = "UNAVAILABLE",
        /// The operation does not fit the participant's table (the wrong key attributes).
        Invalid = "INVALID",
        /// One of the service's own rules refused: its own code is [`ParticipantState::service_code`].
        Rule = "RULE",
    }
}

code_enum! {
    /// The `code` of an error answer (`{"error": {"code", "message"}}`).
    ErrorCode {
        InvalidRequest = "INVALID_REQUEST",
        MalformedJson = "MALFORMED_JSON",
        BodyTooLarge = "BODY_TOO_LARGE",
        NoParticipants = "NO_PARTICIPANTS",
        NoOperations = "NO_OPERATIONS",
        /// A service that is not in the coordinator's registry.
        UnknownService = "UNKNOWN_SERVICE",
        DuplicateService = "DUPLICATE_SERVICE",
        UnknownOperation = "UNKNOWN_OPERATION",
        DuplicateItem = "DUPLICATE_ITEM",
        /// A DynamoDB limit the commit would meet (the message names it).
        LimitExceeded = "LIMIT_EXCEEDED",
        InvalidIdempotencyKey = "INVALID_IDEMPOTENCY_KEY",
        NotFound = "NOT_FOUND",
        MethodNotAllowed = "METHOD_NOT_ALLOWED",
        IdempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED",
        /// The coordinator stopped while driving the transaction (injected faults in tests only).
        Crashed = "CRASHED",
        Unavailable = "UNAVAILABLE",
    }
}

/// One participant in an answer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ParticipantState {
    pub service: String,
    /// Absent when the participant never answered.
    #[serde(default)]
    pub vote: Option<Vote>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub code: Option<RefusalCode>,
    /// A `RULE` refusal: the service's own code.
    #[serde(default, rename = "serviceCode")]
    pub service_code: Option<String>,
}

/// The body of a transaction answer (`POST` and `GET`). Fields a newer server adds are ignored.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionState {
    pub transaction_id: String,
    pub status: Status,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub participants: Vec<ParticipantState>,
    /// Epoch milliseconds.
    pub created_at: u64,
    pub updated_at: u64,
}

impl TransactionState {
    /// The participants that refused (or never answered), with their codes.
    pub fn refusals(&self) -> impl Iterator<Item = &ParticipantState> {
        self.participants.iter().filter(|p| p.vote != Some(Vote::Prepared))
    }

    /// Whether any participant refused with this code.
    pub fn refused_with(&self, code: &RefusalCode) -> bool {
        self.participants.iter().any(|p| p.code.as_ref() == Some(code))
    }
}

/// The outcome of a transaction: every answer that says what happened to it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// 200: every participant committed.
    Committed(TransactionState),
    /// 202: not finished. `status` is `COMMITTING` (decided: the sweeper applies what is left) or, from
    /// `GET` only, `PREPARING` (not decided yet).
    Pending(TransactionState),
    /// 409: a participant refused or did not answer; nothing was applied.
    Aborted(TransactionState),
}

impl Outcome {
    /// Decodes an answer of `POST /transactions` or `GET /transactions/{id}`: an outcome for 200, 202
    /// and 409, the typed [`Error`] for every other status. Also for callers that reach a coordinator
    /// in-process and hold its status and body.
    pub fn from_response(status: u16, body: &[u8]) -> Result<Outcome, Error> {
        let state = || {
            serde_json::from_slice::<TransactionState>(body).map_err(|e| Error::Decode {
                status,
                message: e.to_string(),
                body: String::from_utf8_lossy(body).into_owned(),
            })
        };
        match status {
            200 => Ok(Outcome::Committed(state()?)),
            202 => Ok(Outcome::Pending(state()?)),
            409 => Ok(Outcome::Aborted(state()?)),
            _ => Err(Error::from_status(status, body)),
        }
    }

    pub fn state(&self) -> &TransactionState {
        match self {
            Outcome::Committed(s) | Outcome::Pending(s) | Outcome::Aborted(s) => s,
        }
    }

    pub fn into_state(self) -> TransactionState {
        match self {
            Outcome::Committed(s) | Outcome::Pending(s) | Outcome::Aborted(s) => s,
        }
    }

    pub fn transaction_id(&self) -> &str {
        &self.state().transaction_id
    }

    /// The HTTP status the outcome was answered with.
    pub fn http_status(&self) -> u16 {
        match self {
            Outcome::Committed(_) => 200,
            Outcome::Pending(_) => 202,
            Outcome::Aborted(_) => 409,
        }
    }

    pub fn is_committed(&self) -> bool {
        matches!(self, Outcome::Committed(_))
    }

    pub fn is_aborted(&self) -> bool {
        matches!(self, Outcome::Aborted(_))
    }
}

/// An error answer's `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl ApiError {
    /// The error of a body, and the `transactionId` a 503 carries. A body not in the contract's shape
    /// (a gateway's own error page) keeps its text as the message, under an empty code.
    pub(crate) fn parse(body: &[u8]) -> (ApiError, Option<String>) {
        let value: Option<Value> = serde_json::from_slice(body).ok();
        let id = value.as_ref().and_then(|v| v["transactionId"].as_str()).map(str::to_owned);
        let error = value.as_ref().and_then(ApiError::from_value).unwrap_or_else(|| ApiError {
            code: ErrorCode::Other(String::new()),
            message: String::from_utf8_lossy(body).into_owned(),
        });
        (error, id)
    }

    /// The `error` member of an answer already read as JSON, if it has one.
    pub(crate) fn from_value(value: &Value) -> Option<ApiError> {
        let e = value.get("error").filter(|e| e.is_object())?;
        Some(ApiError {
            code: ErrorCode::from(e["code"].as_str().unwrap_or_default()),
            message: e["message"].as_str().unwrap_or_default().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_codes_and_fields_are_kept_or_ignored() {
        let body = br#"{"transactionId":"tx-1","status":"SETTLED","participants":[{"service":"a","vote":"ABSTAINED","code":"QUOTA","reason":"r"},{"service":"b"}],"createdAt":1,"updatedAt":2,"newField":{"x":1}}"#;
        let outcome = Outcome::from_response(200, body).unwrap();
        let state = outcome.state();
        assert_eq!(state.status, Status::Other("SETTLED".into()));
        assert_eq!(state.participants[0].vote, Some(Vote::Other("ABSTAINED".into())));
        assert_eq!(state.participants[0].code, Some(RefusalCode::Other("QUOTA".into())));
        assert_eq!(state.participants[1].vote, None);
        assert_eq!(state.refusals().count(), 2);
    }

    #[test]
    fn a_body_of_the_wrong_shape_is_a_decoding_error_with_the_body() {
        match Outcome::from_response(200, b"<html>oops</html>") {
            Err(Error::Decode { status: 200, body, .. }) => assert_eq!(body, "<html>oops</html>"),
            other => panic!("{other:?}"),
        }
    }
}
