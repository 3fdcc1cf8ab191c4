//! The participant library: a service's participant is its rules plus one call into this library.
//!
//! ```no_run
//! use twopc::model::Operation;
//! use twopc::participant::{Participant, Prepared, Refusal, Rules};
//!
//! /// Only the account's owner may debit it.
//! struct OwnerOnly;
//!
//! impl Rules for OwnerOnly {
//!     fn check(&self, prepared: &Prepared<'_>) -> Result<(), Refusal> {
//!         let owner = prepared.data.and_then(|d| d.get("owner")).and_then(|o| o.as_str());
//!         let debits = matches!(prepared.operation, Operation::Add { delta, .. } if delta.to_string().starts_with('-'));
//!         if debits && owner != prepared.principal {
//!             return Err(Refusal::new("NOT_OWNER", "only the account's owner may debit it"));
//!         }
//!         Ok(())
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let participant = participant::from_env().await?.with_rules(OwnerOnly);
//! # Ok(()) }
//! # mod participant { pub async fn from_env() -> Result<twopc::participant::Participant, twopc::config::ConfigError> { unimplemented!() } }
//! ```
//!
//! [`Participant::handle`] is the one entry of every message (the Lambda handler, the local stack and the
//! tests all go through it). Everything that makes the protocol safe is here, and a service's code cannot
//! go around it: a message is acted on only if the coordinator or the sweeper signed it
//! ([`crate::auth`]); prepare locks each item with a conditional write and a token of its own; commit
//! applies only the lock its vote reported; lock resolution, idempotency (`lastTx`), empty rollback and
//! late messages are handled for every service alike.
//!
//! A service's [`Rules`] are judged at prepare, on the item as it will be locked: the library reads the
//! items, asks the rules about each operation ([`Prepared`]: the operation, the item's committed data and
//! version, the caller's principal), and writes the lock only on condition that the item is still at the
//! version the rules saw; if it changed in between, the prepare decides again. A rule sees only the items
//! of its own operations (one that needs another item puts a `check` on it, which locks it). A rule's
//! [`Refusal`] is a `REFUSED` vote with the code `RULE`, the service's own code in `serviceCode` and its
//! reason. A participant without rules (the generic participant) reads nothing more than before.
//!
//! The library's seams: `protocol` (the participant and its one entry), `guard` (what every message
//! passes first: signature, reading, arrival cutoff), `port` (the branch a message then goes to: the
//! items, or a resource), `prepare` and `locks` (locks, tokens, resolution, wait-die, the cutoff),
//! [`store`] (the item store: the table's items and the writes that lock, commit and release them),
//! [`operations`] (what an operation does to an item), [`resource`] and `barrier` (try, confirm, cancel).

mod answers;
mod barrier;
pub mod credits;
pub mod expressions;
mod guard;
mod locks;
pub mod operations;
mod port;
mod prepare;
mod protocol;
pub mod resource;
pub mod store;

pub use crate::custom::{FieldSchema, FieldType, OperationSchema};
pub use locks::Order;
pub use protocol::{Participant, ParticipantError, parse_operations, parse_operations_for};
pub use resource::{Resource, ResourceCall, ResourceError};
pub use store::DataTable;

use serde_json::{Map, Value};

use crate::model::Operation;

/// Participant: the service it serves and the table it owns.
pub const SERVICE_NAME: &str = "SERVICE_NAME";
pub const DATA_TABLE_NAME: &str = "DATA_TABLE_NAME";
/// `on` (the default) or `off`: whether a recorded prepare's credits take pending entries
/// ([`Participant::with_pending_credits`]; `off` for the first deploy of an upgrade).
pub const PENDING_CREDITS: &str = "PENDING_CREDITS";

/// [`PENDING_CREDITS`]'s value: `on` or `off`.
pub fn pending_credits_setting(value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(other) => Err(format!("must be \"on\" or \"off\", not \"{other}\"")),
    }
}

/// A service's own rules, judged at prepare.
pub trait Rules: Send + Sync + 'static {
    /// Judges one operation on its item as it will be locked. `Err` refuses the transaction.
    fn check(&self, prepared: &Prepared<'_>) -> Result<(), Refusal>;
}

/// What a rule sees of one operation at prepare.
#[derive(Debug, Clone, Copy)]
pub struct Prepared<'a> {
    pub service: &'a str,
    pub transaction_id: &'a str,
    /// Who asked for the transaction (canonical, [`crate::principal`]); None for a caller without one.
    pub principal: Option<&'a str>,
    pub operation: &'a Operation,
    /// The item's committed `data` as it is and as it stays while locked; None for no such item.
    pub data: Option<&'a Map<String, Value>>,
    /// The item's `version` (every commit moves it); None for an item without one.
    pub version: Option<u64>,
}

/// A service's own operation kinds ([`crate::custom`]): `{"op": "reserve", "key": {...}, "quantity": 3}`.
pub trait Operations: Send + Sync + 'static {
    /// The kinds and their fields: what the coordinator validates (its `SERVICE_OPERATIONS`), what the spec
    /// shows, what the participant parses.
    fn schemas(&self) -> Vec<OperationSchema>;
    /// What the operation (one of these kinds, its fields as declared) makes of the item, judged on the
    /// item as it will be locked: the item's new `data`. The prepare keeps it beside the lock, and the
    /// commit applies exactly that (never computed again). Refuse with a reason the caller can read.
    fn prepare(&self, prepared: &Prepared<'_>) -> Result<Map<String, Value>, OperationRefusal>;
}

/// Why one of a service's own operations cannot be prepared on its item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperationRefusal {
    /// The operation cannot apply to this item as asked (what only the participant can judge): INVALID.
    Invalid(String),
    /// The item's state does not allow it (stock below zero, say, with the numbers): CONDITION_FAILED.
    ConditionFailed(String),
    /// A rule of the service: RULE, with its own code.
    Rule(Refusal),
}

/// A rule's refusal: the service's own code (at most [`MAX_SERVICE_CODE_BYTES`], shown in `serviceCode`)
/// and why (shown as the vote's `reason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: String,
    pub reason: String,
}

pub use crate::model::MAX_SERVICE_CODE_BYTES;

impl Refusal {
    pub fn new(code: impl Into<String>, reason: impl Into<String>) -> Refusal {
        Refusal { code: code.into(), reason: reason.into() }
    }
}
