//! The coordinator: validates a request, prepares its participants, decides by a conditional write,
//! drives commit or abort, and answers. The sweeper drives decided transactions with the same code
//! ([`Coordinator::recover`]).
//!
//! One phase engine (`engine.rs`: prepare, decide, drive the second phase) and a command for each way a
//! transaction is asked for, each in a file of its own:
//! - `submit.rs`: `POST /transactions`, parsed, authorized and routed;
//! - `attempts.rs`: a request as attempts that keep its age when refused for contention, hot items first;
//! - `two_phase.rs`: one attempt with several participants, recorded first or at its decision;
//! - `one_phase.rs`: a sole writing participant commits with its record in one write;
//! - `held.rs`: a held transaction, and its caller's commit or abort;
//! - `replay.rs`: a key or an age token that ran already, answered from its first execution;
//! - `recover.rs`: the sweeper's rule for a transaction a crash left open;
//! - `seen.rs`: `GET /transactions/{id}`, and what a caller may see of an answer;
//! - `admin.rs`: the operators' views and actions (`/admin`).
//!
//! `ballot.rs` types the votes the engine decides by; `reply.rs` is what every command answers.
//!
//! Every record write carries the execution's own id, so a write that took effect but whose reply was
//! lost (and whose retry then fails its condition) is recognised as this execution's own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::access::{Caller, Policy};
use crate::auth::{KeySource, SignatureVersion};
use crate::clock::SharedClock;
use crate::custom::Catalogs;
use crate::faults::Faults;
use crate::hold::HoldPolicy;
use crate::invoke::{InvokeError, ParticipantInvoker};
use crate::model::{Message, ParticipantResponse};
use crate::record::{TransactionRecord, TransactionStore};
use crate::telemetry;

mod admin;
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
mod submit;
mod two_phase;

pub use admin::{
    AdminRequest, DEFAULT_LOCK_AGE_MS, DEFAULT_OUTCOMES_SINCE_MS, HistoryError, ListQuery, OPERATOR_ABORT_REASON,
    OutcomeHistory, OutcomePage, OutcomesQuery, admin_view, listed_outcome,
};
pub use engine::Driven;
use engine::PhaseEngine;
pub use held::HELD_ABORT_REASON;
pub use one_phase::{is_one_phase_id, one_phase_id, one_phase_prefix};
pub use replay::{caller_idempotent_id, idempotent_id};
pub use reply::{DriveError, Reply};
pub use submit::{parse_request, parse_request_with};

/// The coordinator answers within this long of a request, below API Gateway's 29-second integration
/// timeout, on every path (a first execution, a retried key, its recovery): a commit still being
/// applied then is answered 202 with its id, an abort 409, an undecided transaction 503 with its id;
/// the sweeper finishes them.
pub const ANSWER_BUDGET: Duration = Duration::from_millis(27_000);
/// A second phase run after an answer on the decision (`Prefer: respond-async`) may go on this long past
/// its request's answer budget: the invocation, which ends only when it does, stays within the coordinator
/// function's 45 s timeout; what is left then is the sweeper's.
pub const AFTER_ANSWER_BUDGET: Duration = Duration::from_millis(15_000);
/// Past the answer budget, a step that has not returned (a DynamoDB call that hangs) is abandoned, as a
/// crash would abandon it, and the answer is a 503 with the id: still a second before API Gateway's 29 s.
const ABANDON_AFTER_BUDGET: Duration = Duration::from_millis(1_000);
/// Why an attempt its coordinator named never ran: the refused one's abort took the time it needed.
const NO_TIME_TO_BEGIN: &str = "too little time was left before the deadline to begin this attempt";
/// A request refused for contention (CONFLICT) is tried again by the coordinator, keeping its age, up to
/// this many attempts in all ([`crate::age`]).
pub const MAX_ATTEMPTS: u32 = 16;
/// Another attempt starts only with at least this long left before the request's deadline.
const MIN_ATTEMPT_MS: u64 = 100;

#[derive(Clone)]
pub struct Coordinator {
    /// Prepare, decide, drive the second phase: what every command runs its transactions through.
    engine: PhaseEngine,
    /// Its own key, which signs and verifies age tokens ([`crate::age`]): no participant can read it.
    age_keys: Arc<dyn KeySource>,
    /// Each service's own operation kinds, validated before anything is written ([`crate::custom`]).
    catalogs: Arc<Catalogs>,
    services: BTreeSet<String>,
    sequential_prepares: bool,
    answer_budget: Duration,
    /// Which held transactions are accepted ([`crate::hold`]).
    holds: Arc<HoldPolicy>,
    /// Who may do what ([`crate::access`]).
    access: Arc<Policy>,
    /// Items that refused a transaction for contention lately ([`crate::hot`]).
    hot: Arc<crate::hot::HotItems>,
    /// service → its table, read (never written) by the operators' views of locks ([`admin`]).
    data_tables: Arc<BTreeMap<String, crate::participant::DataTable>>,
    /// Where `GET /admin/outcomes` reads the outcome events back ([`admin::OutcomeHistory`]); None: 503.
    outcome_history: Option<Arc<dyn admin::OutcomeHistory>>,
    /// Where a request answered on its commit decision finishes its second phase ([`crate::after_answer`]);
    /// None: `Prefer: respond-async` is not applied (a preference may be ignored), the answer comes at the end.
    after_answer: Option<Arc<dyn crate::after_answer::AfterAnswer>>,
}

impl Coordinator {
    pub fn new(
        transactions: TransactionStore,
        invoker: Arc<dyn ParticipantInvoker>,
        services: impl IntoIterator<Item = String>,
        clock: SharedClock,
    ) -> Coordinator {
        Coordinator {
            engine: PhaseEngine {
                transactions,
                invoker,
                keys: Arc::new(crate::auth::LocalKeys),
                signature: SignatureVersion::V1,
                clock,
                faults: Faults::default(),
            },
            age_keys: crate::age::process_keys(),
            catalogs: Arc::new(Catalogs::default()),
            services: services.into_iter().collect(),
            sequential_prepares: false,
            answer_budget: ANSWER_BUDGET,
            holds: Arc::new(HoldPolicy::default()),
            hot: Arc::new(crate::hot::HotItems::default()),
            access: Arc::new(Policy::default()),
            data_tables: Arc::new(BTreeMap::new()),
            outcome_history: None,
            after_answer: None,
        }
    }

    /// The same coordinator, reading the participants' tables (service → table, `PARTICIPANT_TABLES`)
    /// for the operators' views of locks.
    pub fn with_data_tables(self, tables: BTreeMap<String, crate::participant::DataTable>) -> Coordinator {
        Coordinator { data_tables: Arc::new(tables), ..self }
    }

    /// The same coordinator, answering `GET /admin/outcomes` from `history`.
    /// Applies `Prefer: respond-async`: a request that asks is answered 202 COMMITTING once its commit
    /// decision is durable, and `after` finishes its second phase ([`crate::after_answer`]).
    pub fn with_after_answer(mut self, after: Arc<dyn crate::after_answer::AfterAnswer>) -> Coordinator {
        self.after_answer = Some(after);
        self
    }

    /// Whether `Prefer: respond-async` is applied ([`Coordinator::with_after_answer`]).
    pub fn answers_on_decision(&self) -> bool {
        self.after_answer.is_some()
    }

    pub fn with_outcome_history(self, history: Arc<dyn admin::OutcomeHistory>) -> Coordinator {
        Coordinator { outcome_history: Some(history), ..self }
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
        Coordinator { engine: PhaseEngine { signature: version, ..self.engine }, ..self }
    }

    pub fn with_keys(self, keys: Arc<dyn KeySource>) -> Coordinator {
        Coordinator { engine: PhaseEngine { keys, ..self.engine }, ..self }
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
        Coordinator { engine: PhaseEngine { faults, ..self.engine.clone() }, ..self.clone() }
    }

    pub fn transactions(&self) -> &TransactionStore {
        &self.engine.transactions
    }

    pub fn invoker(&self) -> &Arc<dyn ParticipantInvoker> {
        &self.engine.invoker
    }

    pub fn clock(&self) -> &SharedClock {
        &self.engine.clock
    }
}

/// The commands as the functions call them: each runs in a file of its own.
impl Coordinator {
    /// `POST /transactions` from a caller without a principal.
    pub async fn submit(&self, body: &[u8], idempotency_key: Option<&str>) -> Reply {
        self.submit_as(body, idempotency_key, None).await
    }

    /// `POST /transactions` from the IAM principal `principal` (its canonical form, [`crate::principal`]).
    pub async fn submit_as(&self, body: &[u8], idempotency_key: Option<&str>, principal: Option<&str>) -> Reply {
        self.submit_by(body, idempotency_key, &self.access.iam(principal)).await
    }

    /// `POST /transactions` from `caller`: authorized by the access policy before anything is written;
    /// its principal is recorded on the transaction and passed to every participant, and its key is its
    /// own (the same key from another caller is another transaction).
    pub async fn submit_by(&self, body: &[u8], idempotency_key: Option<&str>, caller: &Caller) -> Reply {
        self.submit_retry_by(body, idempotency_key, None, caller).await
    }

    /// [`Coordinator::submit_by`] with the `Age-Token` of an earlier request refused for contention: the
    /// retry keeps that request's age ([`crate::age`]).
    pub async fn submit_retry_by(
        &self,
        body: &[u8],
        idempotency_key: Option<&str>,
        age_token: Option<&str>,
        caller: &Caller,
    ) -> Reply {
        self.submit_preferring(body, idempotency_key, age_token, caller, false).await
    }

    /// [`Coordinator::submit_retry_by`], answered on its commit decision when `respond_async` (the
    /// caller's `Prefer: respond-async`) and the coordinator applies it ([`Coordinator::with_after_answer`]):
    /// 202 COMMITTING once the decision is durable, the second phase after the answer. Not part of the
    /// request's hash: a key's replay, an age token and the answer's outcome are the same either way.
    pub async fn submit_preferring(
        &self,
        body: &[u8],
        idempotency_key: Option<&str>,
        age_token: Option<&str>,
        caller: &Caller,
        respond_async: bool,
    ) -> Reply {
        let started = Instant::now();
        let on_decision = respond_async && self.after_answer.is_some();
        let reply = submit::answer(self, body, idempotency_key, age_token, caller, on_decision).await;
        telemetry::answered(reply.status, &reply.body, started.elapsed());
        reply
    }

    /// `GET /transactions/{id}` from a caller without a principal.
    pub async fn get(&self, id: &str) -> Reply {
        self.get_by(id, &self.access.iam(None)).await
    }

    /// `GET /transactions/{id}` from `caller`: a transaction it may not see ([`Policy::may_see`]) is
    /// answered as an unknown one, so its id tells nothing.
    pub async fn get_by(&self, id: &str, caller: &Caller) -> Reply {
        seen::read(self, id, caller).await
    }

    /// `POST /transactions/{id}/commit` from `principal`: a held transaction (PREPARED) commits if the
    /// coordinator's clock is not past its `holdUntil` (200 COMMITTED, or 202 COMMITTING while a participant
    /// has not acknowledged); past it, it is aborted (409 ABORTED). Unknown, or created by another
    /// principal: 404. Not held: 409 NOT_HELD. Repeated after the commit won: the same answer; after an
    /// abort (the caller's or the expiry's): 409 with the decided body.
    pub async fn commit_held(&self, id: &str, principal: Option<&str>) -> Reply {
        held::decide_held_within(self, id, &self.access.iam(principal), held::HeldDecision::Commit).await
    }

    /// [`Coordinator::commit_held`] from `caller`: only the principal that created it, or an admin.
    pub async fn commit_held_by(&self, id: &str, caller: &Caller) -> Reply {
        held::decide_held_within(self, id, caller, held::HeldDecision::Commit).await
    }

    /// [`Coordinator::abort_held`] from `caller`: only the principal that created it, or an admin.
    pub async fn abort_held_by(&self, id: &str, caller: &Caller) -> Reply {
        held::decide_held_within(self, id, caller, held::HeldDecision::Abort(held::HELD_ABORT_REASON)).await
    }

    /// `POST /transactions/{id}/abort` from `principal`: a held transaction aborts (200 ABORTED, once its
    /// participants released, or the answer budget ran out and the sweeper finishes it). Repeated, or
    /// after the hold expired: 200 ABORTED again; after a commit: 409 with the committed body.
    pub async fn abort_held(&self, id: &str, principal: Option<&str>) -> Reply {
        held::decide_held_within(
            self,
            id,
            &self.access.iam(principal),
            held::HeldDecision::Abort(held::HELD_ABORT_REASON),
        )
        .await
    }

    /// An operator's request (`/admin`): 403 for a caller the access policy does not name as an operator,
    /// before anything is read or written.
    pub async fn admin(&self, request: AdminRequest, caller: &Caller) -> Reply {
        admin::answer(self, request, caller).await
    }

    /// How many transactions and locks the operators' stuck view lists (`/admin/stuck` with `lock_age_ms`):
    /// the sweeper's gauge. Reads only.
    pub async fn stuck_count(&self, lock_age_ms: u64) -> Result<u32, crate::store::StoreError> {
        Ok(admin::stuck(self, lock_age_ms).await?.count() as u32)
    }

    /// Drives a decided transaction to its end: commits (or aborts) at every participant that holds
    /// locks, then the terminal status. A participant that cannot be reached leaves it open for the
    /// sweeper, and the record says so.
    pub async fn finish(&self, record: TransactionRecord) -> Result<TransactionRecord, DriveError> {
        Ok(self.engine.drive(record).await?.record)
    }

    /// Brings an open transaction to its end: the sweeper's rule, and an idempotent retry's when the
    /// first execution stopped. PREPARING past its deadline (and twice the clock margin) is aborted by the
    /// same conditional write that lock resolution uses; a PREPARING one within it is left alone.
    /// Returns the record as it ends up, and whether this call wrote its terminal status.
    pub async fn recover(&self, record: TransactionRecord) -> Result<Driven, DriveError> {
        let record = recover::abort_expired(self, record).await?;
        self.engine.drive(record).await
    }

    /// Sends one message to a participant, signed with its service's current key.
    pub async fn call(&self, service: &str, message: &Message) -> Result<ParticipantResponse, InvokeError> {
        self.engine.call(service, message).await
    }
}
