//! A typed client of the two-phase-commit system's REST and WebSocket APIs.
//!
//! - [`Transaction`] and the [`op`] builders write the contract's request body; they need no HTTP
//!   (`to_json`, `body_bytes`), so the same request can go to an in-process coordinator.
//! - [`Client`] submits it under an `Idempotency-Key` and retries transport errors, timeouts, 429, 502,
//!   503 and 504 under the same key (the server dedupes: a transaction never runs twice), signs with
//!   SigV4 for an IAM-authorized API, and answers a typed [`Outcome`] or [`Error`].
//! - Decide later: a transaction sent with [`Transaction::hold`] is answered [`Outcome::Held`] once every
//!   participant prepared, and keeps its locks until [`Client::commit`] or [`Client::abort`] (an
//!   approval, a risk check), or until its `holdUntil`, after which it aborts.
//! - [`subscribe`] follows entities and transactions over the WebSocket API as a stream of typed
//!   [`Push`]es; [`presign_websocket_url`] signs the `$connect` of an IAM-authorized one.
//!
//! Amounts are exact decimals ([`Decimal`]), written as JSON numbers with their digits: this crate
//! turns on `serde_json`'s `arbitrary_precision`, which keeps every JSON number as its text.
//!
//! The public enums are `#[non_exhaustive]`: a later version may add a variant or a code without a
//! breaking change, so a `match` on one needs a wildcard arm. The codes also read any code this
//! version does not know as `Other`.
//!
//! A complete example is in docs/api.md ("The Rust client"), compiled as a test of this crate.

mod answer;
mod client;
mod error;
mod request;
mod sign;
mod subscribe;
mod tls;

pub use answer::{ApiError, ErrorCode, Outcome, ParticipantState, RefusalCode, Status, TransactionState, Vote};
pub use aws_credential_types::Credentials;
pub use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
pub use client::{AdminQuery, Client, Retry};
pub use error::Error;
pub use request::{Decimal, Key, NotADecimal, Operation, Participant, Transaction, op};
pub use sign::{SERVICE, Signer, presign_websocket_url, presign_websocket_url_at, sign_headers};
pub use subscribe::{Change, Commit, Push, RefusedTopic, Subscription, subscribe, topic};
pub use tls::http_client_builder;

/// docs/api.md's example, compiled (and its other Rust blocks run) as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/api.md")]
struct ReadmeExamples;
