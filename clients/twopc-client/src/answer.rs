//! What the API answers, typed. Every code is an enum with an `Other` fallback: a newer server's new
//! code reaches an older client as `Other("NEW_CODE")`, never as a decoding error. The enums are
//! `#[non_exhaustive]`: a later version may name a code this one reads as `Other` (a match needs a
//! wildcard arm).

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use crate::Error;

/// An enum of the contract's upper-case codes, with `Other` for any code this client does not know.
macro_rules! code_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        #[non_exhaustive]
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
        /// A held transaction ([`Transaction::hold`](crate::Transaction::hold)): every participant
        /// prepared, and the locks stay until its caller commits or aborts it, or until `holdUntil`.
        Prepared = "PREPARED",
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
        /// `commit` or `abort` of a transaction that was not held (it was decided when submitted).
        NotHeld = "NOT_HELD",
        /// The access policy does not let this caller write an item of the request (403).
        Forbidden = "FORBIDDEN",
        /// A guard (`min`, `max`, `check`) on an item this caller may not read (400).
        GuardNotAllowed = "GUARD_NOT_ALLOWED",
        /// A held request (`holdMs`) crediting an item this caller does not own (403): it would hold the
        /// owner's item for the whole hold.
        HeldCreditNotAllowed = "HELD_CREDIT_NOT_ALLOWED",
        /// An `Age-Token` not issued for this caller and body, or expired (400).
        InvalidAgeToken = "INVALID_AGE_TOKEN",
        /// The `Age-Token`'s retry already ran under another transaction id (409).
        AgeTokenUsed = "AGE_TOKEN_USED",
        /// The local stack only: a POST without `Content-Type: application/json` (415).
        UnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE",
        /// An operator's `retry` of a transaction that is not decided (409).
        NotDecided = "NOT_DECIDED",
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
    /// A held transaction's deadline (epoch milliseconds): it must be committed by then, or it aborts.
    /// Present in every answer about a held transaction once it was held; `None` for any other.
    #[serde(default)]
    pub hold_until: Option<u64>,
    /// An attempt after the first of a request refused for contention and retried by the coordinator
    /// with its age: its number (`None`: the first).
    #[serde(default)]
    pub attempts: Option<u32>,
    /// An answer refused for contention: the token that keeps the request's age on a retry (the
    /// `Age-Token` header of the same request sent again).
    #[serde(default)]
    pub age_token: Option<String>,
    /// An attempt refused for contention and retried by the coordinator: the next attempt's id (its
    /// outcome is the request's; follow it with [`Client::get`](crate::Client::get)).
    #[serde(default)]
    pub retried_as: Option<String>,
    /// An attempt after the first: the id of its request's first attempt.
    #[serde(default)]
    pub first_transaction_id: Option<String>,
    /// A retry with an age token: the refused attempt whose age it keeps (its request is its own).
    #[serde(default)]
    pub age_of: Option<String>,
    /// A refused attempt whose age a retry with its age token took: that retry's id.
    #[serde(default)]
    pub age_claimed_by: Option<String>,
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

/// The outcome of a transaction: every answer that says what happened to it. A later version may add
/// variants (a match needs a wildcard arm).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Outcome {
    /// Every participant committed (`COMMITTED`).
    Committed(TransactionState),
    /// Not finished: `status` is `COMMITTING` (decided: the sweeper applies what is left) or, from
    /// `GET` only, `PREPARING` (not decided yet).
    Pending(TransactionState),
    /// A held transaction ([`Transaction::hold`](crate::Transaction::hold)), `PREPARED`: every
    /// participant prepared and its locks stay until [`Client::commit`](crate::Client::commit) or
    /// [`Client::abort`](crate::Client::abort), or until [`hold_until`](Outcome::hold_until), after
    /// which it aborts.
    Held(TransactionState),
    /// A participant refused or did not answer, or a held transaction was aborted or expired; nothing
    /// was applied (`ABORTED`).
    Aborted(TransactionState),
}

impl Outcome {
    /// Decodes an answer of `POST /transactions`, `GET /transactions/{id}`, and a held transaction's
    /// `POST /transactions/{id}/commit` and `/abort`: an outcome for 200, 202 and 409, the typed
    /// [`Error`] for every other status and for a 409 that carries an error (`NOT_HELD`:
    /// [`Error::NotHeld`]). Also for callers that reach a coordinator in-process and hold its status
    /// and body.
    ///
    /// The variant is the transaction's state, which the body's `status` says: a 202 `PREPARED` is
    /// [`Outcome::Held`]; a decision route answers the call that won with 200 (an abort's 200 is
    /// [`Outcome::Aborted`]) and the other decision with 409 (a commit that won, read by `abort`, is
    /// [`Outcome::Committed`] or [`Outcome::Pending`]). A status this client does not know is read by
    /// the HTTP status: 200 committed, 202 pending, 409 aborted.
    pub fn from_response(status: u16, body: &[u8]) -> Result<Outcome, Error> {
        if !matches!(status, 200 | 202 | 409) {
            return Err(Error::from_status(status, body));
        }
        let state = match serde_json::from_slice::<TransactionState>(body) {
            Ok(state) => state,
            Err(e) => {
                // A 409 about the call rather than the transaction: `{"error": {"code": "NOT_HELD", ...}}`.
                let is_error = serde_json::from_slice::<Value>(body).is_ok_and(|v| v.get("error").is_some());
                if status == 409 && is_error {
                    return Err(Error::from_status(status, body));
                }
                return Err(Error::Decode {
                    status,
                    message: e.to_string(),
                    body: String::from_utf8_lossy(body).into_owned(),
                });
            }
        };
        Ok(match (&state.status, status) {
            (Status::Committed, _) => Outcome::Committed(state),
            (Status::Preparing | Status::Committing, _) => Outcome::Pending(state),
            (Status::Prepared, _) => Outcome::Held(state),
            (Status::Aborting | Status::Aborted, _) => Outcome::Aborted(state),
            (_, 200) => Outcome::Committed(state),
            (_, 202) => Outcome::Pending(state),
            _ => Outcome::Aborted(state),
        })
    }

    pub fn state(&self) -> &TransactionState {
        match self {
            Outcome::Committed(s) | Outcome::Pending(s) | Outcome::Held(s) | Outcome::Aborted(s) => s,
        }
    }

    pub fn into_state(self) -> TransactionState {
        match self {
            Outcome::Committed(s) | Outcome::Pending(s) | Outcome::Held(s) | Outcome::Aborted(s) => s,
        }
    }

    pub fn transaction_id(&self) -> &str {
        &self.state().transaction_id
    }

    /// The HTTP status `POST /transactions` answers this outcome with (a held transaction's `commit` or
    /// `abort` answers its own call's outcome with 200, and the other decision's with 409; a
    /// `GET /transactions/{id}` that finds the transaction answers 200 whatever its state).
    pub fn http_status(&self) -> u16 {
        match self {
            Outcome::Committed(_) => 200,
            Outcome::Pending(_) | Outcome::Held(_) => 202,
            Outcome::Aborted(_) => 409,
        }
    }

    pub fn is_committed(&self) -> bool {
        matches!(self, Outcome::Committed(_))
    }

    pub fn is_aborted(&self) -> bool {
        matches!(self, Outcome::Aborted(_))
    }

    /// Whether the transaction is held, waiting for its caller's commit or abort.
    pub fn is_held(&self) -> bool {
        matches!(self, Outcome::Held(_))
    }

    /// A held transaction's deadline (epoch milliseconds), in every answer about it once it was held.
    pub fn hold_until(&self) -> Option<u64> {
        self.state().hold_until
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

    fn body(status: &str, hold_until: Option<u64>) -> Vec<u8> {
        let mut body = serde_json::json!({"transactionId": "tx-1", "status": status, "participants": [
            {"service": "inventory", "vote": "PREPARED"}, {"service": "service-a", "vote": "PREPARED"}
        ], "createdAt": 1, "updatedAt": 2});
        if let Some(hold_until) = hold_until {
            body["holdUntil"] = hold_until.into();
        }
        body.to_string().into_bytes()
    }

    #[test]
    fn a_held_answer_is_its_own_outcome_with_its_hold_until() {
        let held = Outcome::from_response(202, &body("PREPARED", Some(600_001))).unwrap();
        assert!(held.is_held() && !held.is_committed() && !held.is_aborted(), "{held:?}");
        assert_eq!((held.hold_until(), held.http_status(), held.transaction_id()), (Some(600_001), 202, "tx-1"));
        assert_eq!(held.state().status, Status::Prepared);
        // A decided commit's 202 is still pending, and a transaction that was never held has no holdUntil.
        let committing = Outcome::from_response(202, &body("COMMITTING", None)).unwrap();
        assert!(matches!(&committing, Outcome::Pending(s) if s.status == Status::Committing && s.hold_until.is_none()));
        assert!(matches!(Outcome::from_response(202, &body("PREPARING", None)), Ok(Outcome::Pending(_))));
    }

    fn variant(outcome: &Outcome) -> &'static str {
        match outcome {
            Outcome::Committed(_) => "Committed",
            Outcome::Pending(_) => "Pending",
            Outcome::Held(_) => "Held",
            Outcome::Aborted(_) => "Aborted",
        }
    }

    #[test]
    fn decisions_are_read_by_the_transactions_status() {
        let cases = [
            // commit: 200 COMMITTED, 202 COMMITTING, 409 ABORTED (aborted first, or expired).
            (200, "COMMITTED", "Committed"),
            (202, "COMMITTING", "Pending"),
            (409, "ABORTED", "Aborted"),
            // abort: 200 ABORTED (its own call won), 409 COMMITTED or COMMITTING (a commit won).
            (200, "ABORTED", "Aborted"),
            (409, "COMMITTED", "Committed"),
            (409, "COMMITTING", "Pending"),
        ];
        for (status, state, expected) in cases {
            let outcome = Outcome::from_response(status, &body(state, Some(600_001))).unwrap();
            assert_eq!(variant(&outcome), expected, "{status} {state}: {outcome:?}");
            assert_eq!(outcome.hold_until(), Some(600_001), "a held transaction's answers keep holdUntil");
        }
        // A status this client does not know is read by the HTTP status.
        for (status, expected) in [(200, "Committed"), (202, "Pending"), (409, "Aborted")] {
            let outcome = Outcome::from_response(status, &body("SETTLING", None)).unwrap();
            assert_eq!(variant(&outcome), expected, "{status}: {outcome:?}");
        }
    }

    #[test]
    fn a_conflict_with_an_error_is_an_error() {
        let not_held =
            br#"{"transactionId":"tx-1","error":{"code":"NOT_HELD","message":"transaction tx-1 was not held"}}"#;
        match Outcome::from_response(409, not_held) {
            Err(e @ Error::NotHeld(_)) => {
                assert_eq!(e.code(), Some(&ErrorCode::NotHeld));
                assert!(e.to_string().contains("was not held"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        // A 409 error this client does not know: the status and the body.
        let other = br#"{"error":{"code":"LATER","message":"m"}}"#;
        assert!(matches!(Outcome::from_response(409, other), Err(Error::Status { status: 409, .. })));
        // A 409 that is neither a transaction nor an error stays a decoding error.
        assert!(matches!(Outcome::from_response(409, b"{}"), Err(Error::Decode { status: 409, .. })));
    }

    #[test]
    fn a_body_of_the_wrong_shape_is_a_decoding_error_with_the_body() {
        match Outcome::from_response(200, b"<html>oops</html>") {
            Err(Error::Decode { status: 200, body, .. }) => assert_eq!(body, "<html>oops</html>"),
            other => panic!("{other:?}"),
        }
    }
}
