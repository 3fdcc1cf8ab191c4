//! The coordinator: validates a request, prepares every participant at once, decides by a conditional
//! write, drives commit or abort, and answers. The sweeper drives decided transactions with the same
//! code ([`Coordinator::recover`]).
//!
//! One phase engine ([`engine`]: prepare, decide, drive the second phase) and a command for each way a
//! transaction is asked for, each in a file of its own:
//! - [`submit`]: `POST /transactions`, parsed, authorized and routed;
//! - [`attempts`]: a request as attempts that keep its age when refused for contention, hot items first;
//! - [`one_phase`]: a sole writing participant commits with its record in one write;
//! - [`held`]: a held transaction, and its caller's commit or abort;
//! - [`replay`]: a key or an age token that ran already, answered from its first execution;
//! - [`recover`]: the sweeper's rule for a transaction a crash left open;
//! - [`seen`]: `GET /transactions/{id}`, and what a caller may see of an answer.
//!
//! [`ballot`] types the votes the engine decides by; [`send`] signs and delivers messages; [`writes`]
//! retries the record writes; [`reply`] is what every command answers.
//!
//! Every record write carries the execution's own id, so a write that took effect but whose reply was
//! lost (and whose retry then fails its condition) is recognised as this execution's own.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::access::Policy;
use crate::auth::{KeySource, SignatureVersion};
use crate::clock::SharedClock;
use crate::custom::Catalogs;
use crate::faults::Faults;
use crate::hold::HoldPolicy;
use crate::invoke::ParticipantInvoker;
use crate::record::{TransactionRecord, TransactionStore};

mod attempts;
mod ballot;
mod engine;
mod held;
mod one_phase;
mod recover;
mod replay;
mod reply;
#[cfg(test)]
mod request_tests;
mod seen;
mod send;
mod submit;
mod writes;

pub use held::HELD_ABORT_REASON;
pub use one_phase::{is_one_phase_id, one_phase_id, one_phase_prefix};
pub use reply::{DriveError, Reply};
pub use submit::{caller_idempotent_id, idempotent_id, parse_request, parse_request_with};

/// One commit or abort message gets this long before it is counted as failed and tried again.
const SECOND_PHASE_TIMEOUT: Duration = Duration::from_secs(5);
const SECOND_PHASE_ATTEMPTS: u32 = 3;
/// The coordinator answers within this long of a request, below API Gateway's 29-second integration
/// timeout, on every path (a first execution, a retried key, its recovery): a commit still being
/// applied then is answered 202 with its id, an abort 409, an undecided transaction 503 with its id;
/// the sweeper finishes them.
pub const ANSWER_BUDGET: Duration = Duration::from_millis(27_000);
/// Past the answer budget, a step that has not returned (a DynamoDB call that hangs) is abandoned, as a
/// crash would abandon it, and the answer is a 503 with the id: still a second before API Gateway's 29 s.
const ABANDON_AFTER_BUDGET: Duration = Duration::from_millis(1_000);
/// What a caller is told when the decision could not be recorded and the locks were released.
const UNRECORDED_DECISION: &str = "the decision could not be recorded, so the transaction was aborted";
/// Why an attempt its coordinator named never ran: the refused one's abort took the time it needed.
const NO_TIME_TO_BEGIN: &str = "too little time was left before the deadline to begin this attempt";
/// A request refused for contention (CONFLICT) is tried again by the coordinator, keeping its age, up to
/// this many attempts in all ([`crate::age`]).
pub const MAX_ATTEMPTS: u32 = 16;
/// Another attempt starts only with at least this long left before the request's deadline.
const MIN_ATTEMPT_MS: u64 = 100;
/// Expired owners resolved for one prepare (or one-phase commit) before its refusal stands: one per item
/// it meets locked, at most a few in practice.
const MAX_RESOLUTIONS_PER_MESSAGE: u32 = 4;

#[derive(Clone)]
pub struct Coordinator {
    transactions: TransactionStore,
    invoker: Arc<dyn ParticipantInvoker>,
    /// The participants' keys: every message is signed with its service's ([`crate::auth`]).
    keys: Arc<dyn KeySource>,
    /// How messages are signed: v1 until every participant verifies v2 (infra/DEPLOY.md).
    signature: SignatureVersion,
    /// Its own key, which signs and verifies age tokens ([`crate::age`]): no participant can read it.
    age_keys: Arc<dyn KeySource>,
    /// Each service's own operation kinds, validated before anything is written ([`crate::custom`]).
    catalogs: Arc<Catalogs>,
    services: BTreeSet<String>,
    clock: SharedClock,
    faults: Faults,
    sequential_prepares: bool,
    answer_budget: Duration,
    /// Which held transactions are accepted ([`crate::hold`]).
    holds: Arc<HoldPolicy>,
    /// Who may do what ([`crate::access`]).
    access: Arc<Policy>,
    /// Items that refused a transaction for contention lately ([`crate::hot`]).
    hot: Arc<crate::hot::HotItems>,
}

impl Coordinator {
    pub fn new(
        transactions: TransactionStore,
        invoker: Arc<dyn ParticipantInvoker>,
        services: impl IntoIterator<Item = String>,
        clock: SharedClock,
    ) -> Coordinator {
        Coordinator {
            transactions,
            invoker,
            keys: Arc::new(crate::auth::LocalKeys),
            signature: SignatureVersion::V1,
            age_keys: crate::age::process_keys(),
            catalogs: Arc::new(Catalogs::default()),
            services: services.into_iter().collect(),
            clock,
            faults: Faults::default(),
            sequential_prepares: false,
            answer_budget: ANSWER_BUDGET,
            holds: Arc::new(HoldPolicy::default()),
            hot: Arc::new(crate::hot::HotItems::default()),
            access: Arc::new(Policy::default()),
        }
    }

    /// The same coordinator, authorizing callers as `policy` says (the function reads `ACCESS_POLICY`).
    pub fn with_access(self, policy: Policy) -> Coordinator {
        Coordinator { access: Arc::new(policy), ..self }
    }

    pub fn access(&self) -> &Policy {
        &self.access
    }

    /// The same coordinator, accepting held transactions as `policy` says (by default every service
    /// accepts holds of up to 15 minutes; the function reads `HOLD_POLICY` and `MAX_HOLD_MS`).
    pub fn with_hold_policy(self, policy: HoldPolicy) -> Coordinator {
        Coordinator { holds: Arc::new(policy), ..self }
    }

    /// The same coordinator, signing participant messages with `keys` (by default the local development
    /// keys, [`crate::auth::LocalKeys`]; the deployed functions always read theirs from the environment).
    /// Signs participant messages in `version` (`PARTICIPANT_SIGNATURE`).
    pub fn with_signature(self, version: SignatureVersion) -> Coordinator {
        Coordinator { signature: version, ..self }
    }

    pub fn with_keys(self, keys: Arc<dyn KeySource>) -> Coordinator {
        Coordinator { keys, ..self }
    }

    /// The same coordinator, signing and verifying age tokens with `keys` (by default a random key of this
    /// process, [`crate::age::process_keys`]; the deployed function reads its own from `AGE_TOKEN_KEY`).
    pub fn with_age_keys(self, age_keys: Arc<dyn KeySource>) -> Coordinator {
        Coordinator { age_keys, ..self }
    }

    /// The same coordinator, validating each service's own operation kinds (its `SERVICE_OPERATIONS`).
    pub fn with_operations(self, catalogs: Catalogs) -> Coordinator {
        Coordinator { catalogs: Arc::new(catalogs), ..self }
    }

    /// Each service's own operation kinds, as this coordinator validates them.
    pub fn catalogs(&self) -> &Catalogs {
        &self.catalogs
    }

    /// The same coordinator answering within `budget` instead of [`ANSWER_BUDGET`].
    pub fn with_answer_budget(&self, budget: Duration) -> Coordinator {
        Coordinator { answer_budget: budget, ..self.clone() }
    }

    /// Prepares one participant after another, as the seed design did: only for comparison in benchmarks.
    pub fn with_sequential_prepares(&self) -> Coordinator {
        Coordinator { sequential_prepares: true, ..self.clone() }
    }

    /// The same coordinator, crashing at one point (tests only).
    pub fn with_faults(&self, faults: Faults) -> Coordinator {
        Coordinator { faults, ..self.clone() }
    }

    pub fn transactions(&self) -> &TransactionStore {
        &self.transactions
    }

    pub fn invoker(&self) -> &Arc<dyn ParticipantInvoker> {
        &self.invoker
    }

    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }
}

/// What driving a decided transaction came to.
#[derive(Debug, Clone)]
pub struct Driven {
    /// The record as it then is.
    pub record: TransactionRecord,
    /// Whether this call wrote its terminal status.
    pub finished_here: bool,
    /// The participants that did not acknowledge, each with why (empty once all did).
    pub unacknowledged: Vec<String>,
}
