//! The coordinator: validates a request, prepares every participant at once, decides by a conditional
//! write, drives commit or abort, and answers. The sweeper drives decided transactions with the same
//! code ([`Coordinator::recover`]).
//!
//! Presumed abort: a request without an `Idempotency-Key` writes no record before its decision. The
//! decision to commit *creates* the record as COMMITTING, conditionally; lock resolution that finds a
//! lock whose owner has no record creates it ABORTED the same way, so exactly one of the two exists,
//! and a transaction without a record can never have committed. A keyed request writes its record
//! first (PREPARING), because the record is what makes a retry find the first execution.
//!
//! Every record write carries the execution's own id, so a write that took effect but whose reply was
//! lost (and whose retry then fails its condition) is recognised as this execution's own. A decision
//! write that fails is never taken to mean "not decided": the abort decision is written conditionally
//! over it (a fence), and only the record that results says whether the locks may be released.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::{Value, json};
use tracing::{Instrument, error, info, info_span, warn};

use crate::access::{Caller, Policy, entity_ids};
use crate::attempts::{AgeClaim, ContentionAbort};
use crate::auth::{KeySource, SignatureVersion};
use crate::clock::{SharedClock, resolvable_after};
use crate::custom::{Catalog, Catalogs};
use crate::faults::{CoordinatorCrash, Crashed, Faults};
use crate::hold::HoldPolicy;
use crate::invoke::{InvokeError, ParticipantInvoker};
use crate::model::message::{Abort, Commit, Hold, OnePhase, Prepare};
use crate::model::{
    Action, ErrorCode, Invalid, Message, Operation, ParticipantResponse, RefusalCode, STATUS_ABORTED, STATUS_COMMITTED,
    STATUS_HELD, STATUS_NOT_PREPARED, STATUS_RECORD_EXISTS, Status, TransactionRequest, Vote,
};
use crate::record::{ParticipantEntry, TransactionRecord, TransactionStore, Transition};
use crate::store::{StoreError, WriteOutcome};
use crate::telemetry;

mod chain;
#[cfg(test)]
mod request_tests;
mod seen;

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
/// Why an attempt recorded ABORTED by a retried key's replay never ran.
const ATTEMPT_NOT_STARTED: &str = "the coordinator stopped before this attempt began";
/// A request refused for contention (CONFLICT) is tried again by the coordinator, keeping its age, up to
/// this many attempts in all ([`crate::age`]).
pub const MAX_ATTEMPTS: u32 = 16;
/// Another attempt starts only with at least this long left before the request's deadline.
const MIN_ATTEMPT_MS: u64 = 100;
/// A retried keyed request follows its attempts' `retriedAs` links at most this far.
const MAX_CHAIN_HOPS: usize = 256;
/// Expired owners resolved for one prepare (or one-phase commit) before its refusal stands: one per item
/// it meets locked, at most a few in practice.
const MAX_RESOLUTIONS_PER_MESSAGE: u32 = 4;

/// An HTTP answer: status code and JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    /// The contract's error answer: `{"error": {"code", "message"}}`.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Reply {
        Reply { status: code.http_status(), body: json!({"error": {"code": code.as_str(), "message": message.into()}}) }
    }

    fn invalid(invalid: Invalid) -> Reply {
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
        Reply { status, body }
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

    /// Sends one message to a participant, signed with its service's current key.
    pub async fn call(&self, service: &str, message: &Message) -> Result<ParticipantResponse, InvokeError> {
        let request = &message.to_wire();
        let unsigned =
            |e: crate::auth::KeyError| InvokeError::Unsigned { service: service.to_owned(), message: e.to_string() };
        match self.signature {
            SignatureVersion::V1 => {
                let signed = crate::auth::sign(self.keys.as_ref(), service, request, self.clock.now_ms())
                    .await
                    .map_err(unsigned)?;
                self.invoker.invoke(service, &signed).await
            }
            SignatureVersion::V2 => {
                let sealed = crate::auth::seal(self.keys.as_ref(), service, request, self.clock.now_ms())
                    .await
                    .map_err(unsigned)?;
                self.invoker.invoke_sealed(service, &sealed).await
            }
        }
    }

    /// The answer of a request whose record `id` exists already (its replay); None when there is none.
    /// When it cannot be read, a 503 that names `unread` (GET tells): `id` where the request runs under
    /// it, none where it may have run under another id (a key answers for one request only).
    async fn answer_if_recorded(
        &self,
        id: &str,
        request_hash: Option<&str>,
        answer_by: std::time::Instant,
        unread: Option<&str>,
    ) -> Option<Reply> {
        match self.transactions.get(id).await {
            Ok(Some(existing)) => Some(match self.replay(existing, request_hash, answer_by).await {
                Ok(reply) => reply,
                Err(e) => drive_error_reply(e, id),
            }),
            Ok(None) => None,
            Err(e) => Some(unavailable(&e, unread)),
        }
    }

    /// The service of a request that commits in one phase: a sole participant, not held, whose operations
    /// [`takes_one_phase`].
    fn one_phase_service(&self, record: &TransactionRecord) -> Option<String> {
        match record.participants.as_slice() {
            // (A name with `~` could pass for another's prefix: such a service commits in two phases.)
            [sole]
                if !record.is_held()
                    && !sole.service.contains('~')
                    && takes_one_phase(&sole.operations, self.catalogs.of(&sole.service)) =>
            {
                Some(sole.service.clone())
            }
            _ => None,
        }
    }

    /// [`Coordinator::call`] for a prepare or a one-phase commit: a refusal that names an expired lock's
    /// owner the participant may not decide ([`ParticipantResponse::unresolved_owner`]) is resolved here,
    /// with this role's rights and from that owner's own record only (past its expiry it is aborted by the
    /// same conditional write every resolver races its coordinator with), and the message sent again.
    /// An owner with no record is left to the sweeper, which reads the lock itself: a participant's word
    /// alone never makes this coordinator write a decision.
    async fn call_resolving(&self, service: &str, message: &Message) -> Result<ParticipantResponse, InvokeError> {
        let mut resolved = 0;
        loop {
            let response = self.call(service, message).await?;
            let Some(owner) = response.unresolved_owner.as_deref() else { return Ok(response) };
            if resolved == MAX_RESOLUTIONS_PER_MESSAGE || owner == message.transaction_id() {
                return Ok(response);
            }
            resolved += 1;
            match crate::recovery::resolve_recorded(&self.transactions, owner, self.clock.now_ms()).await {
                Ok(true) => info!(service, owner, "resolved an expired lock's owner for a participant; asking again"),
                Ok(false) => return Ok(response),
                Err(e) => {
                    warn!(service, owner, error = %e, "could not resolve an expired lock's owner");
                    return Ok(response);
                }
            }
        }
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

    /// `GET /transactions/{id}` from a caller without a principal.
    pub async fn get(&self, id: &str) -> Reply {
        self.get_by(id, &self.access.iam(None)).await
    }

    /// `GET /transactions/{id}` from `caller`: a transaction it may not see ([`Policy::may_see`]) is
    /// answered as an unknown one, so its id tells nothing.
    pub async fn get_by(&self, id: &str, caller: &Caller) -> Reply {
        match self.transactions.get(id).await {
            Ok(Some(record)) if self.access.may_see(caller, record.principal.as_deref()) => {
                self.as_seen_by(caller, Reply::reading(&record), &record).await
            }
            Ok(_) => Reply::error(ErrorCode::NotFound, format!("no transaction {id}")),
            Err(e) => unavailable(&e, None),
        }
    }

    /// A record's answer as `caller` may see it ([`Policy::redact_answer`], and others' transactions
    /// unnamed: [`Coordinator::hide_others_transactions`]).
    async fn as_seen_by(&self, caller: &Caller, mut reply: Reply, record: &TransactionRecord) -> Reply {
        if caller.admin {
            return reply;
        }
        let items: Vec<Vec<String>> = record.participants.iter().map(|p| entity_ids(&p.operations)).collect();
        self.access.redact_answer(caller, &mut reply.body, &items);
        self.hide_others_transactions(caller, &mut reply.body).await;
        reply
    }

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
        let started = std::time::Instant::now();
        let reply = self.answer(body, idempotency_key, age_token, caller).await;
        telemetry::answered(reply.status, &reply.body, started.elapsed());
        reply
    }

    async fn answer(
        &self,
        body: &[u8],
        idempotency_key: Option<&str>,
        age_token: Option<&str>,
        caller: &Caller,
    ) -> Reply {
        let request = match parse_request_with(body, |s| self.services.contains(s), &self.catalogs) {
            Ok(request) => request,
            Err(invalid) => return Reply::invalid(invalid),
        };
        // Before anything is written or locked: what this caller may not do, and a hold longer than a
        // service (or the deployment) accepts.
        if let Err(refused) = self.access.check_request(caller, &request) {
            info!(principal = caller.principal.as_deref().unwrap_or("-"), code = %refused.code, reason = %refused.message, "request refused by the access policy");
            return Reply::invalid(refused);
        }
        if let Err(invalid) = self.holds.check(&request) {
            return Reply::invalid(invalid);
        }
        // An admin's answer is shown whole: the items are read out only for the others'.
        let items: Vec<Vec<String>> = match caller.admin {
            true => Vec::new(),
            false => request.participants.iter().map(|p| entity_ids(&p.operations)).collect(),
        };
        let mut reply = self.answer_authorized(request, idempotency_key, age_token, caller).await;
        self.access.redact_answer(caller, &mut reply.body, &items);
        self.hide_others_transactions(caller, &mut reply.body).await;
        reply
    }

    async fn answer_authorized(
        &self,
        request: TransactionRequest,
        idempotency_key: Option<&str>,
        age_token: Option<&str>,
        caller: &Caller,
    ) -> Reply {
        let answer_by = std::time::Instant::now() + self.answer_budget;
        let body_hash = request.canonical_hash();
        // Checked before anything is read or written: a token this caller cannot use is a 400.
        let age = match age_token {
            None => None,
            Some(token) => {
                let principal = caller.principal.as_deref();
                let now = self.clock.now_ms();
                match crate::age::verify(self.age_keys.as_ref(), token, principal, &body_hash, now).await {
                    Ok(age) => Some(age),
                    Err(crate::age::AgeTokenError::Keys(message)) => {
                        error!(error = %message, "the age token's key could not be read");
                        return Reply::error(
                            ErrorCode::Unavailable,
                            "the Age-Token could not be checked (its key could not be read); nothing was written",
                        );
                    }
                    Err(refused) => return Reply::error(ErrorCode::InvalidAgeToken, refused.to_string()),
                }
            }
        };
        let (mut id, request_hash) = match idempotency_key {
            // A retry with an age token is idempotent by its token: its id is the token's next attempt's, and
            // its record is written first, so the same token sent again finds it. (`-r`: not the id the
            // coordinator's own retry would have had, which a retried key's replay may have fenced.)
            None => match &age {
                Some(age) => (format!("{}-r{}", age.first_transaction_id, age.attempt), Some(body_hash.clone())),
                None => (format!("tx-{}", uuid::Uuid::new_v4().simple()), None),
            },
            Some(key) if key.is_empty() || key.len() > 255 => {
                return Reply::invalid(Invalid::new(
                    ErrorCode::InvalidIdempotencyKey,
                    "Idempotency-Key must be 1 to 255 characters",
                ));
            }
            Some(key) => {
                let hash = body_hash.clone();
                match self.first_execution_before_scoping(key, caller).await {
                    Ok(Some(existing)) => {
                        let id = existing.transaction_id.clone();
                        return match self.replay(existing, Some(&hash), answer_by).await {
                            Ok(reply) => reply,
                            Err(e) => drive_error_reply(e, &id),
                        };
                    }
                    Ok(None) => {}
                    Err(e) => return unavailable(&e, None),
                }
                (caller_idempotent_id(caller.principal.as_deref(), key), Some(hash))
            }
        };
        let now = self.clock.now_ms();
        let mut record = TransactionRecord::preparing(id.clone(), &request, request_hash.clone(), now);
        // One phase: the sole participant writes the record in the same write as its items, under an id only
        // its own service's role may put (issue 42: no participant role may write another's record). Not
        // for a token's retry, whose record is written before it runs.
        if age.is_none()
            && let Some(service) = self.one_phase_service(&record)
        {
            // A keyed request that ran in one phase before ids were scoped ran under the key's plain id; one
            // since, under the scoped id: an unread plain id names neither.
            if idempotency_key.is_some()
                && let Some(reply) = self.answer_if_recorded(&id, record.request_hash.as_deref(), answer_by, None).await
            {
                return reply;
            }
            let scoped = one_phase_id(&service, &id);
            record = TransactionRecord::preparing(scoped.clone(), &request, request_hash, now);
            id = scoped;
        }
        record.principal = caller.principal.clone();
        if let Err(invalid) = record.check_first_write() {
            return Reply::invalid(invalid);
        }
        let mut created = false;
        if let Some(age) = &age {
            // A key (or the same token) that ran already is answered from its record: nothing is claimed for
            // it, so that no chain ever links to a transaction of another body, or to one of its own. Read
            // first, not left to the claim's write: the key may name the refused attempt itself, and one
            // TransactWriteItems cannot touch one item twice.
            if let Some(reply) =
                self.answer_if_recorded(&id, record.request_hash.as_deref(), answer_by, Some(&id)).await
            {
                return reply;
            }
            // A request of its own (its first attempt, its own key) that keeps the refused request's age.
            record.started_at = Some(age.started_at);
            record.age_of = Some(age.retry_of.clone());
            // The claim of the refused attempt's age and this retry's record, in one write: a token runs one
            // retry at most, and a claim never names a record that does not exist or runs another body.
            let opened = record.clone().opened();
            match retrying("age claim", |_| self.transactions.claim_age(&age.retry_of, &opened)).await {
                Ok(AgeClaim::Claimed) => created = true,
                Ok(AgeClaim::Exists(existing)) => {
                    return match self.replay(*existing, record.request_hash.as_deref(), answer_by).await {
                        Ok(reply) => reply,
                        Err(e) => drive_error_reply(e, &id),
                    };
                }
                // Signed by this coordinator for this caller and body, yet naming an attempt of another
                // caller or body (a record changed behind it): not this request's age (issue 42).
                Ok(AgeClaim::Refused(Some(current))) if !record.same_request(&current) => {
                    error!(refused = %age.retry_of, "an age token names an attempt of another caller or body");
                    return Reply::error(
                        ErrorCode::InvalidAgeToken,
                        format!(
                            "the Age-Token's transaction {} is not this caller's request with this body; nothing \
                             was written",
                            age.retry_of
                        ),
                    );
                }
                Ok(AgeClaim::Refused(current)) => {
                    let why = match current.as_deref() {
                        Some(c) if c.age_claimed_by.is_some() => {
                            format!("already ran as {}", c.age_claimed_by.as_deref().unwrap_or_default())
                        }
                        Some(c) if c.retried_as.is_some() => {
                            format!("was retried as {}", c.retried_as.as_deref().unwrap_or_default())
                        }
                        _ => "cannot be retried with a token (its abort was not its refusal for contention)".to_owned(),
                    };
                    return Reply::error(
                        ErrorCode::AgeTokenUsed,
                        format!(
                            "the Age-Token's retry of transaction {} {why}: a token keeps its age for one retry; \
                             this one wrote nothing",
                            age.retry_of
                        ),
                    );
                }
                Err(e) => return unavailable(&e, None),
            }
        }
        let span = info_span!("transaction", tx = %id);
        let abandon_at = tokio::time::Instant::from_std(answer_by + ABANDON_AFTER_BUDGET);
        // The attempt now running: what a 503 or a crash names (an earlier attempt's GET says ABORTED).
        let current = std::sync::Mutex::new(id.clone());
        // Boxed: the attempts' state machine is large, and a caller's stack need not hold it.
        let run =
            Box::pin(self.run(record, created, answer_by, &body_hash, request.timeout_ms, &current).instrument(span));
        let ran = tokio::time::timeout_at(abandon_at, run).await;
        let id = current.lock().expect("the attempt's id is never poisoned").clone();
        let ran = match ran {
            Ok(ran) => ran,
            Err(_) => {
                error!(tx = %id, "the answer budget ran out in a step that did not return; abandoned like a crash");
                let mut reply = Reply::error(
                    ErrorCode::Unavailable,
                    format!(
                        "the transaction store did not answer in time; the outcome is not known yet: \
                         GET /transactions/{id} tells it once recovery has run"
                    ),
                );
                reply.body["transactionId"] = Value::String(id);
                return reply;
            }
        };
        match ran {
            Ok(reply) => reply,
            Err(e) => drive_error_reply(e, &id),
        }
    }

    /// A key's first execution from before keys were scoped per caller: recorded under the key's id
    /// alone ([`idempotent_id`]), found only by its own caller (its recorded principal, or, for a record
    /// without one, any IAM caller: the only kind there was). Another caller's record there is none of
    /// this caller's business: its key is its own.
    async fn first_execution_before_scoping(
        &self,
        key: &str,
        caller: &Caller,
    ) -> Result<Option<TransactionRecord>, StoreError> {
        if caller.principal.is_none() {
            // Unscoped already: the ordinary path finds it.
            return Ok(None);
        }
        let existing = self.transactions.get(&idempotent_id(key)).await?;
        Ok(existing.filter(|record| match record.principal.as_deref() {
            Some(principal) => caller.principal.as_deref() == Some(principal),
            None => caller.is_iam(),
        }))
    }

    /// Runs a request's attempts: each is an ordinary transaction; one refused for contention only is
    /// followed by the next, with the same age, which prepares one participant at a time starting where
    /// the refusal was: holding nothing there, it waits for the older transaction's lock to go instead of
    /// being refused by it again. The next attempt is named (`retriedAs`) in the same write as the refused
    /// attempt's abort, so only this execution's own refusal is ever retried, and the link is on the record
    /// before its end. The answer is the last attempt's; a final refusal for contention carries the
    /// `ageToken` a caller's retry keeps the age with. `created`: the first attempt's record is written.
    async fn run(
        &self,
        mut record: TransactionRecord,
        mut created: bool,
        answer_by: std::time::Instant,
        body_hash: &str,
        timeout_ms: u64,
        current: &std::sync::Mutex<String>,
    ) -> Result<Reply, DriveError> {
        // A request on an item that refused others lately starts there, one participant at a time.
        let mut first = self.hot.first_hot(&record.participants);
        loop {
            let attempted = self.run_attempt(record, created, answer_by, first).await?;
            created = false;
            let Some(refused) = attempted.refused else { return Ok(attempted.reply) };
            if let Some(at) = refused.blocked_at {
                self.hot.mark(&refused.record.participants[at]);
            }
            let Some(next_id) = refused.record.successor().map(str::to_owned) else {
                return Ok(self.with_age_token(attempted.reply, &refused.record, body_hash, timeout_ms).await);
            };
            self.faults.check(CoordinatorCrash::AfterClaim)?;
            // The refused attempt's second phase may have taken the time the next one needed: then the next
            // one is fenced (it never begins) and its abort is the request's answer.
            let budget_left = answer_by.saturating_duration_since(std::time::Instant::now());
            let now = self.clock.now_ms();
            if now > refused.record.deadline.saturating_sub(MIN_ATTEMPT_MS)
                || budget_left < Duration::from_millis(MIN_ATTEMPT_MS)
            {
                let fenced = self.transactions.fence_attempt(&next_id, now, NO_TIME_TO_BEGIN, &refused.record).await?;
                return Ok(Reply::for_record(&fenced));
            }
            let attempt = refused.record.attempt_number() + 1;
            let next = refused.record.next_attempt(next_id, attempt, self.clock.now_ms());
            info!(tx = %next.transaction_id, attempt, "retrying a refusal for contention");
            *current.lock().expect("the attempt's id is never poisoned") = next.transaction_id.clone();
            record = next;
            first = refused.blocked_at;
        }
    }

    /// `reply` with the `ageToken` of its request when its last attempt was refused for contention only
    /// (CONFLICT, or TIMEOUT waiting for a younger lock): a caller's retry with it keeps the request's age.
    async fn with_age_token(
        &self,
        mut reply: Reply,
        last: &TransactionRecord,
        body_hash: &str,
        timeout_ms: u64,
    ) -> Reply {
        // Only an attempt whose recorded abort is its own refusal for contention, not retried by its coordinator.
        if reply.status != 409 || !last.refused_for_contention || last.retried_as.is_some() {
            return reply;
        }
        let now = self.clock.now_ms();
        let age = crate::age::Age {
            started_at: last.age(),
            principal: last.principal.clone(),
            body_hash: body_hash.to_owned(),
            first_transaction_id: last.first_id().to_owned(),
            retry_of: last.transaction_id.clone(),
            attempt: last.attempt_number() + 1,
            expires_at: now + timeout_ms,
            key_id: String::new(),
        };
        match crate::age::issue(self.age_keys.as_ref(), age, now).await {
            Ok(token) => reply.body["ageToken"] = Value::String(token),
            Err(e) => warn!(error = %e, "could not sign an age token; answering without one"),
        }
        reply
    }

    /// One attempt; a retry prepares the participant at index `first` first (where its predecessor was
    /// refused).
    async fn run_attempt(
        &self,
        record: TransactionRecord,
        created: bool,
        answer_by: std::time::Instant,
        first: Option<usize>,
    ) -> Result<Attempted, DriveError> {
        // A held transaction never commits in one phase: its decision is the caller's, later. Nor does one
        // whose record is written already (a token's retry): one phase creates its record as it commits.
        if let [sole] = record.participants.as_slice()
            && !record.is_held()
            && !created
            && takes_one_phase(&sole.operations, self.catalogs.of(&sole.service))
            && is_one_phase_id(&record.transaction_id, &sole.service)
        {
            return self.run_one_phase(record, answer_by).await;
        }
        let started = std::time::Instant::now();
        // A held transaction is recorded first too: its record is what its commit and abort find.
        let keyed = record.is_keyed() || record.is_held();
        if keyed && !created {
            // A keyed request must never run twice: the record is written first and only the writer prepares.
            if let Some(existing) = self.create_own(&record.clone().opened()).await? {
                return Ok(self.replay(existing, record.request_hash.as_deref(), answer_by).await?.into());
            }
            self.faults.check(CoordinatorCrash::AfterCreate)?;
        }
        let votes = self.prepare_all(&record, first).await?;
        let blocked_at = votes.iter().position(|v| v.blocked_by.is_some());
        let blocked_by = blocked_at.and_then(|at| votes[at].blocked_by.clone());
        let prepared = started.elapsed();
        telemetry::phase(telemetry::PREPARE_LATENCY, prepared);
        let deciding = std::time::Instant::now();
        let all_prepared = votes.iter().all(|p| p.vote == Some(Vote::Prepared));
        let in_time = self.clock.now_ms() <= record.deadline;
        let (to, reason) = match (all_prepared, in_time) {
            (true, true) if record.is_held() => (Status::Prepared, None),
            (true, true) => (Status::Committing, None),
            (true, false) => {
                (Status::Aborting, Some("the deadline passed before every participant prepared".to_owned()))
            }
            (false, _) => (Status::Aborting, Some(abort_reason(&votes))),
        };
        let contention = match to {
            Status::Aborting => self.contention_abort(&record, &votes, blocked_by.as_deref(), answer_by).await,
            _ => ContentionAbort::default(),
        };
        let decided = if keyed {
            self.decide_recorded(&record, to, votes, reason, &contention).await?
        } else {
            let mut record = record;
            record.participants = votes;
            record.reason = reason;
            record.updated_at = self.clock.now_ms();
            if to == Status::Aborting {
                let (reply, aborted) = self.abort_unrecorded(contention.applied_to(record), started).await?;
                let refused = aborted.map(|record| Refused { record, blocked_at });
                return Ok(Attempted { reply, refused });
            }
            match self.decide_unrecorded(record).await? {
                Ok(decided) => decided,
                Err(aborted) => return Ok(aborted.into()),
            }
        };
        self.faults.check(CoordinatorCrash::AfterDecision)?;
        telemetry::phase(telemetry::DECISION_LATENCY, deciding.elapsed());
        if decided.status == Status::Prepared {
            // Held: the locks now expire at holdUntil. A crash before leaves them their deadline, and whoever
            // meets one then finds its owner PREPARED, undecided until holdUntil.
            self.extend_locks(&decided).await;
            info!(hold_until = decided.hold_until, "transaction held");
            return Ok(Reply::for_record(&decided).into());
        }
        let second_phase = std::time::Instant::now();
        let finished = self.drive_within(decided.clone(), answer_by).await?;
        if decided.status == Status::Committing && finished.status.is_terminal() {
            telemetry::phase(telemetry::COMMIT_LATENCY, second_phase.elapsed());
        }
        info!(
            status = %finished.status,
            prepare_ms = prepared.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "transaction answered"
        );
        let reply = Reply::for_record(&finished);
        let refused = matches!(finished.status, Status::Aborting | Status::Aborted)
            .then(|| Refused { record: with_votes(finished, decided.participants), blocked_at });
        Ok(Attempted { reply, refused })
    }

    /// Drives a decided transaction until `answer_by` at most: the record as it then is (terminal, or still
    /// decided, the sweeper finishing it).
    async fn drive_within(
        &self,
        decided: TransactionRecord,
        answer_by: std::time::Instant,
    ) -> Result<TransactionRecord, DriveError> {
        let remaining = answer_by.saturating_duration_since(std::time::Instant::now());
        match tokio::time::timeout(remaining, self.drive(decided.clone())).await {
            Ok(driven) => Ok(driven?.record),
            Err(_) => {
                warn!(status = %decided.status, "answer budget spent before the second phase ended; the sweeper finishes it");
                Ok(decided)
            }
        }
    }

    /// The decision of a keyed transaction: PREPARING → COMMITTING or ABORTING on its record, with the
    /// votes. Whatever the record then says is the decision (lock resolution may have aborted it first;
    /// a status found as this execution wanted it is its own write whose reply was lost: only this
    /// execution ever writes COMMITTING; an ABORTING found is the abort either way, but only this
    /// execution's own carries its `refusedForContention` and `retriedAs`, which alone lead to a retry).
    async fn decide_recorded(
        &self,
        record: &TransactionRecord,
        to: Status,
        votes: Vec<ParticipantEntry>,
        reason: Option<String>,
        contention: &ContentionAbort,
    ) -> Result<TransactionRecord, DriveError> {
        let id = &record.transaction_id;
        let written = match to {
            Status::Prepared => {
                let hold_until = self.clock.now_ms() + record.hold_ms.unwrap_or_default();
                let votes = &votes;
                retrying("hold write", |_| async move {
                    self.transactions.hold(id, self.clock.now_ms(), votes, hold_until).await
                })
                .await
            }
            Status::Aborting => self.abort_retrying(id, &votes, reason.as_deref(), contention).await,
            _ => self.transition_retrying(id, Status::Preparing, to, true, Some(&votes), reason.as_deref()).await,
        };
        let transition = match written {
            Ok(transition) => transition,
            // Settled by writing the abort over it, conditionally: the record then says which one happened.
            // An abort's fence is the same decision, with what it says of itself.
            Err(e) => {
                warn!(error = %e, "decision write failed; fencing it with an abort");
                let reason = Some(UNRECORDED_DECISION);
                let fence = self.abort_retrying(id, &votes, reason, contention).await;
                match fence {
                    Ok(transition) => transition,
                    Err(_) => return Err(self.unrecorded_decision(record, e).await),
                }
            }
        };
        match transition {
            // A decision written shortened (the record would have passed 400 KB) may lack the votes: shown.
            Transition::Done(record) => Ok(with_votes(record, votes)),
            Transition::Lost(Some(current)) => {
                if current.status != to {
                    warn!(status = %current.status, "the record was decided otherwise first; following it");
                }
                Ok(with_votes(current, votes))
            }
            Transition::Lost(None) => {
                Err(StoreError::internal("UpdateItem", self.transactions.table(), format!("record {id} disappeared"))
                    .into())
            }
        }
    }

    /// The commit decision of a transaction without a record: the record is created COMMITTING. `Err` is
    /// the answer when the transaction ended aborted instead: lock resolution recorded it ABORTED first,
    /// or the decision could not be written and the abort written over it won.
    async fn decide_unrecorded(
        &self,
        record: TransactionRecord,
    ) -> Result<Result<TransactionRecord, Reply>, DriveError> {
        let committing = TransactionRecord { status: Status::Committing, ..record.clone() }.opened();
        let existing = match self.create_own(&committing).await {
            Ok(None) => return Ok(Ok(committing)),
            Ok(Some(existing)) => existing,
            Err(e) => {
                // Unknown whether the COMMITTING record exists: an ABORTED one created conditionally decides.
                warn!(error = %e, "decision write failed; fencing it with an abort");
                let mut aborted = record.clone().ended(Status::Aborted, self.clock.now_ms());
                aborted.reason = Some(UNRECORDED_DECISION.to_owned());
                // Whatever made DynamoDB refuse the decision, it cannot be in the fence: an aborted record
                // needs no operations, nothing is ever finished from it.
                aborted.participants.iter_mut().for_each(|p| p.operations.clear());
                let fenced = match self.create_own(&aborted).await {
                    Ok(fenced) => fenced,
                    Err(_) => return Err(self.unrecorded_decision(&record, e).await),
                };
                match fenced {
                    None => {
                        self.abort_participants(&record).await?;
                        return Ok(Err(Reply::for_record(&aborted)));
                    }
                    Some(existing) if existing.execution_id == committing.execution_id => {
                        return Ok(Ok(with_votes(existing, committing.participants)));
                    }
                    Some(existing) => existing,
                }
            }
        };
        // Lock resolution found a lock of this transaction expired and recorded it aborted first. It released
        // only the locks it found expired: release the rest.
        warn!(status = %existing.status, "lock resolution decided first");
        self.abort_participants(&record).await?;
        Ok(Err(Reply::for_record(&with_votes(existing, record.participants))))
    }

    /// Neither the decision nor the abort written over it could be recorded. Only this execution can ever
    /// write its transaction's commit decision, so if DynamoDB refused every attempt at it, it certainly
    /// did not happen: the transaction is aborted and its locks released before the 503. If any attempt
    /// may have taken effect, the record may say COMMITTING: nothing is released, and lock resolution
    /// settles the locks from the record once they expire.
    async fn unrecorded_decision(&self, record: &TransactionRecord, error: StoreError) -> DriveError {
        let released = error.outcome == WriteOutcome::NotApplied;
        if released {
            match self.abort_participants(record).await {
                Ok(_) => warn!("decision refused by the transaction store; locks released"),
                Err(crashed) => return crashed.into(),
            }
        }
        DriveError::Unrecorded { error, released }
    }

    /// Aborts a transaction that has no record yet: presumed abort, so nothing had to be written before
    /// the decision. The ABORTED record is created (conditionally: lock resolution may have written it
    /// first) while every participant releases what it may hold; the answer comes once they have. No one
    /// else can ever decide commit for it, so the releases need not wait for the record.
    async fn abort_unrecorded(
        &self,
        record: TransactionRecord,
        started: std::time::Instant,
    ) -> Result<(Reply, Option<TransactionRecord>), DriveError> {
        let record = record.ended(Status::Aborted, self.clock.now_ms());
        let (created, released) = futures::join!(self.create_own(&record), self.abort_participants(&record));
        released?;
        let record = match created {
            Ok(None) => record,
            Ok(Some(existing)) => with_votes(existing, record.participants),
            Err(e) => {
                error!(error = %e, "could not record the abort");
                let mut reply = Reply::error(
                    ErrorCode::Unavailable,
                    "the transaction was aborted and nothing was applied, but its record could not be written: \
                     GET may not find it",
                );
                reply.body["transactionId"] = Value::String(record.transaction_id);
                return Ok((reply, None));
            }
        };
        info!(status = %record.status, total_ms = started.elapsed().as_millis() as u64, "transaction answered");
        Ok((Reply::for_record(&record), Some(record)))
    }

    /// One writing participant: no vote to collect from anyone else, so it applies its operations and the
    /// record is created COMMITTED in the same atomic write (two requests to DynamoDB instead of five).
    /// Whatever goes wrong on the way, the record decides: if the participant's reply is lost, the
    /// coordinator creates the record as ABORTED, conditionally, and exactly one of the two writes exists.
    async fn run_one_phase(
        &self,
        record: TransactionRecord,
        answer_by: std::time::Instant,
    ) -> Result<Attempted, DriveError> {
        let started = std::time::Instant::now();
        let now = self.clock.now_ms();
        let mut committed = record.clone().ended(Status::Committed, now);
        committed.participants[0].vote = Some(Vote::Prepared);
        let entry = &record.participants[0];
        let request = Message::OnePhase(OnePhase {
            transaction_id: record.transaction_id.clone(),
            operations: entry.operations.clone(),
            deadline: Some(record.deadline),
            started_at: Some(record.age()),
            principal: record.principal.clone(),
            record: serde_json::to_value(&committed).expect("records serialize"),
        });
        let budget = Duration::from_millis(record.deadline.saturating_sub(now));
        let answer = tokio::time::timeout(budget, self.call_resolving(&entry.service, &request)).await;
        let mut aborted = record.clone().ended(Status::Aborted, now);
        match answer {
            Ok(Ok(response)) if response.status.as_deref() == Some(STATUS_COMMITTED) => {
                info!(total_ms = started.elapsed().as_millis() as u64, "committed in one phase");
                return Ok(Reply::for_record(&committed).into());
            }
            Ok(Ok(response)) if response.status.as_deref() == Some(STATUS_RECORD_EXISTS) => {
                let existing = self.transactions.get(&record.transaction_id).await?;
                return match existing {
                    Some(existing) => {
                        Ok(self.replay(existing, record.request_hash.as_deref(), answer_by).await?.into())
                    }
                    None => Err(StoreError::internal(
                        "GetItem",
                        self.transactions.table(),
                        format!("record {} reported but not found", record.transaction_id),
                    )
                    .into()),
                };
            }
            Ok(Ok(response)) => record_vote(&mut aborted.participants[0], response),
            Ok(Err(e)) => {
                aborted.participants[0].code = Some(RefusalCode::Unavailable);
                warn!(error = %e, "one-phase commit failed");
                aborted.participants[0].reason = Some(e.public_reason());
            }
            Err(_) => {
                aborted.participants[0].code = Some(RefusalCode::Timeout);
                aborted.participants[0].reason = Some("no answer before the transaction's deadline".to_owned());
            }
        }
        aborted.reason = Some(abort_reason(&aborted.participants));
        aborted.updated_at = self.clock.now_ms();
        // Conditional: if the participant's write landed after all (a lost reply), its COMMITTED record wins.
        // The record found is terminal (one phase writes only COMMITTED or ABORTED), so replay answers
        // it at once, or 422 for a keyed request whose key was used with another body.
        let blocked_by = aborted.participants[0].blocked_by.clone();
        let contention = self.contention_abort(&record, &aborted.participants, blocked_by.as_deref(), answer_by).await;
        let aborted = contention.applied_to(aborted);
        match self.create_own(&aborted).await? {
            None => {
                let blocked_at = blocked_by.as_ref().map(|_| 0);
                Ok(Attempted {
                    reply: Reply::for_record(&aborted),
                    refused: Some(Refused { record: aborted, blocked_at }),
                })
            }
            Some(existing) => Ok(self.replay(existing, record.request_hash.as_deref(), answer_by).await?.into()),
        }
    }

    /// A retried keyed request: the same body gets the first execution's answer, another body a 422.
    /// Within `answer_by`: it waits while the first execution may still be at work (until its deadline
    /// and twice the clock margin), then aborts it if it is still undecided, drives a decided one, and
    /// answers what the record then says: 200 or 409 once ended, 202 or 409 once decided, 503 with the
    /// id while undecided (202 would say "decided commit").
    async fn replay(
        &self,
        existing: TransactionRecord,
        request_hash: Option<&str>,
        answer_by: std::time::Instant,
    ) -> Result<Reply, DriveError> {
        if existing.request_hash.is_some() && existing.request_hash.as_deref() != request_hash {
            return Ok(Reply::error(
                ErrorCode::IdempotencyKeyReused,
                format!(
                    "Idempotency-Key was used for transaction {} with a different request body",
                    existing.transaction_id
                ),
            ));
        }
        // Each attempt followed is the same request's (issue 42): the caller and body of the key's record.
        let owner = existing.clone();
        let mut record = existing;
        let mut hops = 0;
        let mut foreign = false;
        loop {
            // Its attempts: each one retried names the next (which a replay that finds it missing fences).
            while let Some(next) = record.successor().map(str::to_owned).filter(|_| hops < MAX_CHAIN_HOPS && !foreign) {
                hops += 1;
                match self.attempt_named(&next, &record, &owner, answer_by).await? {
                    Some(attempt) => record = attempt,
                    None => foreign = true,
                }
            }
            let mut wait = Duration::from_millis(20);
            // A held one answers at once: PREPARED (202 with holdUntil) while the hold lasts. An attempt
            // refused for contention may still be retried by its coordinator until its deadline.
            while (!record.status.is_terminal() || self.may_be_retried(&record))
                && record.status != Status::Prepared
                && record.successor().is_none()
                && self.clock.now_ms() <= resolvable_after(record.deadline)
            {
                let left = answer_by.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                tokio::time::sleep(wait.min(left)).await;
                wait = (wait * 2).min(Duration::from_millis(250));
                match self.transactions.get(&record.transaction_id).await? {
                    Some(now) => record = now,
                    None => break,
                }
            }
            if self.may_be_retried(&record) {
                // Its coordinator stopped between the attempts, or is slower than the deadline: the next
                // attempt is fenced, so that this answer stays the request's answer.
                let next = crate::record::attempt_id(record.first_id(), record.attempt_number() + 1);
                let now = self.clock.now_ms();
                self.transactions.fence_attempt(&next, now, ATTEMPT_NOT_STARTED, &record).await?;
                if let Some(current) = self.transactions.get(&record.transaction_id).await? {
                    record = current;
                }
            }
            if record.successor().is_none() || hops >= MAX_CHAIN_HOPS || foreign {
                break;
            }
        }
        if hops >= MAX_CHAIN_HOPS && record.successor().is_some() && !foreign {
            let mut reply = Reply::error(
                ErrorCode::Unavailable,
                format!(
                    "the request's attempts go on past {MAX_CHAIN_HOPS}; the outcome is not known from here: GET \
                     /transactions/{} and follow its retriedAs",
                    record.transaction_id
                ),
            );
            reply.body["transactionId"] = Value::String(record.transaction_id.clone());
            return Ok(reply);
        }
        // The first execution stopped (its coordinator crashed) or is slower than the budget: finish it as
        // recovery would, as far as the budget allows.
        record = self.abort_expired(record).await?;
        if matches!(record.status, Status::Committing | Status::Aborting) {
            record = self.drive_within(record, answer_by).await?;
        }
        // No age token from a replay: a request's token comes with its own answer and expires with it.
        Ok(Reply::answering(&record))
    }

    /// Sends prepare to every participant at once, each bounded by the deadline, and records the votes.
    ///
    /// A retry (an attempt after the first) prepares one participant at a time, `first` first (where its
    /// predecessor was refused), then in the request's order, and stops at the first that does not
    /// prepare: its first prepare holds no lock anywhere, so it may wait for any transaction's lock
    /// instead of being refused by an older one (no wait can close a cycle through a transaction that
    /// holds nothing), and a refused retry locked little.
    async fn prepare_all(
        &self,
        record: &TransactionRecord,
        first: Option<usize>,
    ) -> Result<Vec<ParticipantEntry>, Crashed> {
        let sequential =
            self.sequential_prepares || record.attempt_number() > 1 || record.age_of.is_some() || first.is_some();
        let sole = record.participants.len() == 1;
        // Collected first: a lazy iterator's closure inside this future would stop it being provably Send.
        let order: Vec<usize> = match first.filter(|&f| sequential && f < record.participants.len()) {
            Some(f) => std::iter::once(f).chain((0..record.participants.len()).filter(|&i| i != f)).collect(),
            None => (0..record.participants.len()).collect(),
        };
        let prepares: Vec<_> = order
            .iter()
            .enumerate()
            .map(|(position, &index)| {
                let entry = &record.participants[index];
                let request = Message::Prepare(Prepare {
                    transaction_id: record.transaction_id.clone(),
                    operations: entry.operations.clone(),
                    deadline: Some(record.deadline),
                    started_at: Some(record.age()),
                    principal: record.principal.clone(),
                    held: record.is_held(),
                    holds_no_locks: sole || (sequential && position == 0),
                });
                async move {
                    let sent = self.clock.now_ms();
                    // Each bounded by the deadline from when it is sent (one at a time, a later one starts later).
                    let budget = Duration::from_millis(record.deadline.saturating_sub(sent));
                    let result = tokio::time::timeout(budget, self.call_resolving(&entry.service, &request)).await;
                    if let Ok(Ok(ParticipantResponse { received_at: Some(at), answered_at: Some(answered), .. })) =
                        &result
                    {
                        telemetry::clock_skew(&entry.service, sent, self.clock.now_ms(), *at, *answered);
                    }
                    (index, result)
                }
            })
            .collect();
        let width = if sequential { 1 } else { record.participants.len().max(1) };
        let mut pending = futures::stream::iter(prepares).buffer_unordered(width);
        let mut votes = record.participants.clone();
        let mut answered = 0;
        while let Some((index, result)) = pending.next().await {
            let prepared = matches!(&result, Ok(Ok(response)) if response.vote == Some(Vote::Prepared));
            let entry = &mut votes[index];
            match result {
                Ok(Ok(response)) => record_vote(entry, response),
                Ok(Err(e)) => {
                    warn!(service = %entry.service, error = %e, "prepare failed");
                    entry.code = Some(RefusalCode::Unavailable);
                    entry.reason = Some(e.public_reason());
                }
                Err(_) => {
                    warn!(service = %entry.service, "prepare timed out");
                    entry.code = Some(RefusalCode::Timeout);
                    entry.reason = Some("no answer before the transaction's deadline".to_owned());
                }
            }
            answered += 1;
            self.faults.check(CoordinatorCrash::AfterPrepares(answered))?;
            if sequential && !prepared {
                // The attempt aborts: the participants after it are not asked (abort releases nothing there).
                break;
            }
        }
        Ok(votes)
    }

    /// Drives a decided transaction to its end: commits (or aborts) at every participant that holds
    /// locks, then the terminal status. A participant that cannot be reached leaves it open for the
    /// sweeper, and the record says so.
    pub async fn finish(&self, record: TransactionRecord) -> Result<TransactionRecord, DriveError> {
        Ok(self.drive(record).await?.record)
    }

    /// [`Coordinator::finish`], also telling whether this call wrote the terminal status, and which
    /// participants did not acknowledge and why.
    async fn drive(&self, record: TransactionRecord) -> Result<Driven, DriveError> {
        let (action, terminal) = match record.status {
            Status::Committing => (Action::Commit, Status::Committed),
            Status::Aborting => (Action::Abort, Status::Aborted),
            _ => return Ok(Driven { record, finished_here: false, unacknowledged: vec![] }),
        };
        let unacknowledged = match action {
            Action::Commit => self.commit_participants(&record).await?,
            _ => self.abort_participants(&record).await?,
        };
        if !unacknowledged.is_empty() {
            return Ok(Driven { record, finished_here: false, unacknowledged });
        }
        self.faults.check(CoordinatorCrash::BeforeTerminal)?;
        let keyed = record.is_keyed();
        let (record, finished_here) =
            match self.transition_retrying(&record.transaction_id, record.status, terminal, keyed, None, None).await? {
                Transition::Done(done) => (done, true),
                // A sweeper finished it at the same time: the outcome is the same.
                Transition::Lost(Some(current)) => (current, false),
                Transition::Lost(None) => (record, false),
            };
        Ok(Driven { record, finished_here, unacknowledged: vec![] })
    }

    async fn commit_participants(&self, record: &TransactionRecord) -> Result<Vec<String>, Crashed> {
        let targets = record.participants.iter().filter(|p| !p.read_only).collect::<Vec<_>>();
        self.second_phase(record, Action::Commit, &targets).await
    }

    /// Everyone who may hold a lock: all but those whose PREPARED vote said they only read. A refusal or
    /// no answer proves nothing: an earlier delivery of the same prepare may have taken the lock (and an
    /// abort where nothing was locked is an empty rollback).
    async fn abort_participants(&self, record: &TransactionRecord) -> Result<Vec<String>, Crashed> {
        let targets = record.participants.iter().filter(|p| !p.read_only).collect::<Vec<_>>();
        self.second_phase(record, Action::Abort, &targets).await
    }

    async fn second_phase(
        &self,
        record: &TransactionRecord,
        action: Action,
        targets: &[&ParticipantEntry],
    ) -> Result<Vec<String>, Crashed> {
        let mut pending: FuturesUnordered<_> = targets
            .iter()
            .map(|entry| {
                let transaction_id = record.transaction_id.clone();
                let operations = entry.operations.clone();
                let request = match action {
                    Action::Commit => {
                        Message::Commit(Commit { transaction_id, operations, lock_token: entry.lock_token.clone() })
                    }
                    _ => Message::Abort(Abort { transaction_id, operations }),
                };
                async move { (entry.service.as_str(), self.deliver(&entry.service, &request).await) }
            })
            .collect();
        let mut unacknowledged = vec![];
        let mut answered = 0;
        while let Some((service, delivered)) = pending.next().await {
            if let Err(why) = delivered {
                error!(service, action = action.as_str(), why, "participant did not acknowledge; left for the sweeper");
                unacknowledged.push(format!("{service} did not acknowledge the {}: {why}", action.as_str()));
            }
            answered += 1;
            self.faults.check(CoordinatorCrash::AfterCommits(answered))?;
        }
        Ok(unacknowledged)
    }

    /// One commit or abort, retried until the participant acknowledges it; or why it did not, in words
    /// fit for the record (the participant's own reason, or the invoke's public one).
    async fn deliver(&self, service: &str, request: &Message) -> Result<(), String> {
        let mut why = String::new();
        for attempt in 0..SECOND_PHASE_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
            match tokio::time::timeout(SECOND_PHASE_TIMEOUT, self.call(service, request)).await {
                Ok(Ok(response)) if acknowledged(request.action(), &response) => return Ok(()),
                Ok(Ok(response)) => {
                    warn!(service, ?response, "unexpected second-phase answer");
                    why = match (&response.status, &response.reason) {
                        (Some(status), Some(reason)) => format!("{status}: {reason}"),
                        (status, _) => format!("answered {}", status.as_deref().unwrap_or("no status")),
                    };
                }
                Ok(Err(e)) => {
                    warn!(service, error = %e, attempt, "second-phase delivery failed");
                    why = e.public_reason();
                }
                Err(_) => {
                    warn!(service, attempt, "second-phase delivery timed out");
                    why = format!("no answer within {SECOND_PHASE_TIMEOUT:?}");
                }
            }
        }
        Err(why)
    }

    /// Brings an open transaction to its end: the sweeper's rule, and an idempotent retry's when the
    /// first execution stopped. PREPARING past its deadline (and twice the clock margin) is aborted by the
    /// same conditional write that lock resolution uses; a PREPARING one within it is left alone.
    /// Returns the record as it ends up, and whether this call wrote its terminal status.
    pub async fn recover(&self, record: TransactionRecord) -> Result<Driven, DriveError> {
        let record = self.abort_expired(record).await?;
        self.drive(record).await
    }

    /// A PREPARING record past its deadline and twice the clock margin (every resolver's rule,
    /// `crate::clock::resolvable_after`) is aborted by the conditional write lock resolution uses; any
    /// other record is returned as it is. Returns the record as it then is.
    async fn abort_expired(&self, record: TransactionRecord) -> Result<TransactionRecord, DriveError> {
        let undecided = matches!(record.status, Status::Preparing | Status::Prepared);
        if !undecided || self.clock.now_ms() <= resolvable_after(record.expiry()) {
            return Ok(record);
        }
        let reason = crate::recovery::expiry_reason(record.status);
        let transition = self
            .transition_retrying(
                &record.transaction_id,
                record.status,
                Status::Aborting,
                record.is_keyed(),
                None,
                Some(reason),
            )
            .await?;
        Ok(match transition {
            Transition::Done(r) | Transition::Lost(Some(r)) => r,
            Transition::Lost(None) => record,
        })
    }

    /// Creates a record unless one exists, retried on infrastructure errors: `Some` is the record another
    /// write created first. A record found with this execution's id and this status is this very write
    /// (an attempt whose reply was lost, retried by the SDK or here), and counts as created: an execution
    /// never creates two records with the same status.
    async fn create_own(&self, record: &TransactionRecord) -> Result<Option<TransactionRecord>, StoreError> {
        retrying("record write", |_| async move {
            Ok(match self.transactions.create(record).await? {
                Some(existing)
                    if existing.execution_id.is_some()
                        && existing.execution_id == record.execution_id
                        && existing.status == record.status =>
                {
                    None
                }
                found => found,
            })
        })
        .await
    }

    /// This execution's abort decision of its keyed attempt `id` ([`TransactionStore::decide_abort`]), retried
    /// on infrastructure errors: a retry that finds ABORTING with this execution's `retriedAs` or
    /// `refusedForContention` found its own earlier write; any other ABORTING is someone else's abort.
    async fn abort_retrying(
        &self,
        id: &str,
        votes: &[ParticipantEntry],
        reason: Option<&str>,
        contention: &ContentionAbort,
    ) -> Result<Transition, StoreError> {
        retrying("abort decision", |_| {
            self.transactions.decide_abort(id, true, self.clock.now_ms(), votes, reason, contention)
        })
        .await
    }

    /// A status change, retried on infrastructure errors: its condition makes a repeat harmless, and a
    /// retry that finds the status it wanted found its own earlier write.
    async fn transition_retrying(
        &self,
        id: &str,
        from: Status,
        to: Status,
        keyed: bool,
        participants: Option<&[ParticipantEntry]>,
        reason: Option<&str>,
    ) -> Result<Transition, StoreError> {
        retrying("status write", |_| async move {
            self.transactions.transition(id, from, to, keyed, self.clock.now_ms(), participants, reason).await
        })
        .await
    }
}

/// A held transaction's decision: `POST /transactions/{id}/commit` and `/abort`.
impl Coordinator {
    /// `POST /transactions/{id}/commit` from `principal`: a held transaction (PREPARED) commits if the
    /// coordinator's clock is not past its `holdUntil` (200 COMMITTED, or 202 COMMITTING while a participant
    /// has not acknowledged); past it, it is aborted (409 ABORTED). Unknown, or created by another
    /// principal: 404. Not held: 409 NOT_HELD. Repeated after the commit won: the same answer; after an
    /// abort (the caller's or the expiry's): 409 with the decided body.
    pub async fn commit_held(&self, id: &str, principal: Option<&str>) -> Reply {
        self.decide_held_within(id, &self.access.iam(principal), HeldDecision::Commit).await
    }

    /// [`Coordinator::commit_held`] from `caller`: only the principal that created it, or an admin.
    pub async fn commit_held_by(&self, id: &str, caller: &Caller) -> Reply {
        self.decide_held_within(id, caller, HeldDecision::Commit).await
    }

    /// [`Coordinator::abort_held`] from `caller`: only the principal that created it, or an admin.
    pub async fn abort_held_by(&self, id: &str, caller: &Caller) -> Reply {
        self.decide_held_within(id, caller, HeldDecision::Abort).await
    }

    /// `POST /transactions/{id}/abort` from `principal`: a held transaction aborts (200 ABORTED, once its
    /// participants released, or the answer budget ran out and the sweeper finishes it). Repeated, or
    /// after the hold expired: 200 ABORTED again; after a commit: 409 with the committed body.
    pub async fn abort_held(&self, id: &str, principal: Option<&str>) -> Reply {
        self.decide_held_within(id, &self.access.iam(principal), HeldDecision::Abort).await
    }

    async fn decide_held_within(&self, id: &str, caller: &Caller, decision: HeldDecision) -> Reply {
        let answer_by = std::time::Instant::now() + self.answer_budget;
        let abandon_at = tokio::time::Instant::from_std(answer_by + ABANDON_AFTER_BUDGET);
        let span = info_span!("held", tx = %id, decision = ?decision);
        let decided = self.decide_held(id, caller, decision, answer_by).instrument(span);
        let ran = match tokio::time::timeout_at(abandon_at, decided).await {
            Ok(ran) => ran,
            Err(_) => {
                error!(tx = %id, "the answer budget ran out in a step that did not return; abandoned like a crash");
                Err(DriveError::Store(StoreError::internal(
                    "UpdateItem",
                    self.transactions.table(),
                    "no answer in time",
                )))
            }
        };
        match ran {
            Ok(reply) => reply,
            Err(DriveError::Store(e)) | Err(DriveError::Unrecorded { error: e, .. }) => unavailable(&e, Some(id)),
            Err(DriveError::Crashed(c)) => {
                let mut reply = Reply::error(ErrorCode::Crashed, c.to_string());
                reply.body["transactionId"] = Value::String(id.to_owned());
                reply
            }
        }
    }

    async fn decide_held(
        &self,
        id: &str,
        caller: &Caller,
        decision: HeldDecision,
        answer_by: std::time::Instant,
    ) -> Result<Reply, DriveError> {
        // Another principal's transaction is answered as an unknown one: its id tells nothing.
        let record = match self.transactions.get(id).await? {
            Some(record) if self.access.may_see(caller, record.principal.as_deref()) => record,
            _ => return Ok(Reply::error(ErrorCode::NotFound, format!("no transaction {id}"))),
        };
        if !record.is_held() {
            let mut reply = Reply::error(
                ErrorCode::NotHeld,
                format!(
                    "transaction {id} was not held (its request had no holdMs): it was decided when it was \
                     submitted, and is {}",
                    Reply::for_record(&record).body["status"].as_str().unwrap_or_default()
                ),
            );
            reply.body["transactionId"] = Value::String(id.to_owned());
            return Ok(reply);
        }
        // An attempt its coordinator retried: the decision is the request's, so it goes to the attempt that
        // lives, and so after each write it lost (the coordinator's own abort may have named the next attempt
        // between this call's read and its write). A status may move on between the read and the write (the
        // first execution recording PREPARED, a concurrent call, the expiry): each write is conditional on the
        // status read, and a lost one is followed by another from the record found, until it is decided.
        let mut record = record;
        let mut hops = 0;
        for _ in 0..4 {
            record = match self.live_attempt(record, decision, &mut hops).await? {
                Ok(live) => live,
                Err(reply) => return Ok(reply),
            };
            // Past its deadline still preparing (its coordinator stopped), or past its hold: aborted first, as
            // recovery would (an expiry's abort names no successor).
            record = self.abort_expired(record).await?;
            let current_id = record.transaction_id.clone();
            match (record.status, decision) {
                (Status::Preparing, HeldDecision::Commit) => {
                    let mut reply = Reply::error(
                        ErrorCode::Unavailable,
                        format!(
                            "transaction {current_id} is still preparing: it can be committed once it is PREPARED \
                             (GET /transactions/{current_id} tells)"
                        ),
                    );
                    reply.body["transactionId"] = Value::String(current_id);
                    return Ok(reply);
                }
                (Status::Preparing | Status::Prepared, _) => match self.write_held_decision(&record, decision).await? {
                    Transition::Done(decided) => {
                        record = decided;
                        break;
                    }
                    Transition::Lost(Some(current)) => record = current,
                    Transition::Lost(None) => {
                        return Err(StoreError::internal(
                            "UpdateItem",
                            self.transactions.table(),
                            format!("record {current_id} disappeared"),
                        )
                        .into());
                    }
                },
                _ if record.successor().is_some() => {}
                _ => break,
            }
        }
        // The last write lost to the coordinator's own abort naming the next attempt: that one decides.
        if record.successor().is_some() {
            record = match self.live_attempt(record, decision, &mut hops).await? {
                Ok(live) => live,
                Err(reply) => return Ok(reply),
            };
        }
        if matches!(record.status, Status::Committing | Status::Aborting) {
            record = self.drive_within(record, answer_by).await?;
        }
        let mut reply = Reply::for_record(&record);
        reply.status = match (record.status, decision) {
            (Status::Committed | Status::Committing, HeldDecision::Commit) => reply.status,
            (Status::Aborting | Status::Aborted, HeldDecision::Abort) => 200,
            // Not decided yet (the writes kept losing to status changes): as a retried POST would be told.
            (Status::Preparing | Status::Prepared, _) => return Ok(Reply::answering(&record)),
            // The other decision won: the decided body.
            _ => 409,
        };
        info!(status = %record.status, http = reply.status, "held transaction answered");
        Ok(self.as_seen_by(caller, reply, &record).await)
    }

    /// The caller's decision, written conditionally on the status read (PREPARED, or PREPARING for an abort
    /// that comes before the hold is recorded), retried on infrastructure errors. A commit is written only
    /// while the coordinator's clock is at or before `holdUntil`, checked before every attempt: past it the
    /// attempt writes the abort instead (which an earlier attempt's commit, its reply lost, defeats: the
    /// record then says COMMITTING). Resolvers abort a held transaction only after `holdUntil` and twice the
    /// clock margin by their clocks, and every one of these writes is conditional: exactly one decision wins.
    async fn write_held_decision(
        &self,
        record: &TransactionRecord,
        decision: HeldDecision,
    ) -> Result<Transition, StoreError> {
        let id = &record.transaction_id;
        let from = record.status;
        let hold_until = record.hold_until.unwrap_or(0);
        let keyed = record.is_keyed();
        retrying("held decision write", |_| async move {
            let now = self.clock.now_ms();
            let (to, reason) = match decision {
                HeldDecision::Commit if from == Status::Prepared && now <= hold_until => (Status::Committing, None),
                HeldDecision::Commit => (Status::Aborting, Some(crate::recovery::HOLD_EXPIRED_REASON)),
                HeldDecision::Abort => (Status::Aborting, Some(HELD_ABORT_REASON)),
            };
            // Decided: due for the sweeper as a transaction decided now would be (after its timeout), not at
            // holdUntil any more.
            let sweep_at = now + record.deadline.saturating_sub(record.created_at);
            self.transactions.transition_due(id, from, to, keyed, now, reason, sweep_at).await
        })
        .await
    }

    /// Moves the expiry of a held transaction's locks to its `holdUntil`: a hold message to every
    /// participant that locked something, with the token its vote reported. Best effort: a participant
    /// that does not answer keeps its locks' deadline, and whoever meets one of them then finds the owner
    /// PREPARED, undecided until `holdUntil`, as it would anyway.
    async fn extend_locks(&self, record: &TransactionRecord) {
        let Some(hold_until) = record.hold_until else { return };
        let holds: Vec<_> = record
            .participants
            .iter()
            .filter(|p| p.vote == Some(Vote::Prepared) && !p.read_only)
            .map(|entry| {
                let request = Message::Hold(Hold {
                    transaction_id: record.transaction_id.clone(),
                    operations: entry.operations.clone(),
                    lock_token: entry.lock_token.clone(),
                    hold_until,
                });
                async move {
                    match tokio::time::timeout(SECOND_PHASE_TIMEOUT, self.call(&entry.service, &request)).await {
                        Ok(Ok(response)) if response.status.as_deref() == Some(STATUS_HELD) => {}
                        other => warn!(service = %entry.service, answer = ?other.ok(), "locks not extended to holdUntil; they keep their deadline"),
                    }
                }
            })
            .collect();
        futures::future::join_all(holds).await;
    }
}

/// The decision a caller makes about a held transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeldDecision {
    Commit,
    Abort,
}

/// The reason a held transaction aborted by its caller keeps.
pub const HELD_ABORT_REASON: &str = "aborted by its caller while held";

/// A conditional write to a transaction record, tried up to three times on infrastructure errors. The
/// error it ends with says the write may have taken effect if any attempt may have.
async fn retrying<T, Fut>(what: &str, mut write: impl FnMut(u32) -> Fut) -> Result<T, StoreError>
where
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut last: Option<StoreError> = None;
    for attempt in 0..3u32 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(25 << attempt)).await;
        }
        match write(attempt).await {
            Ok(done) => return Ok(done),
            Err(mut e) => {
                warn!(error = %e, attempt, "{what} failed");
                if last.as_ref().is_some_and(|l| l.outcome == WriteOutcome::Unknown) {
                    e.outcome = WriteOutcome::Unknown;
                }
                // Refused as invalid, it would be refused again: the caller fences it.
                if e.invalid {
                    return Err(e);
                }
                last = Some(e);
            }
        }
    }
    Err(last.expect("at least one attempt"))
}

/// What a one-phase transaction's id starts with: its sole participant's service between `1p~` and `~`.
/// Its participant's role may put records only under ids of this form for its own service (the
/// templates' `dynamodb:LeadingKeys`), so it can write the record of its own one-phase commits and no
/// other (issue 42). A service whose name has `~` never commits in one phase.
pub fn one_phase_prefix(service: &str) -> String {
    format!("1p~{service}~")
}

/// `id` as the id of a one-phase transaction of `service`.
pub fn one_phase_id(service: &str, id: &str) -> String {
    format!("{}{id}", one_phase_prefix(service))
}

/// Whether `id` is the id of a one-phase transaction of `service` (its attempts' ids too: they extend it).
pub fn is_one_phase_id(id: &str, service: &str) -> bool {
    id.starts_with(&one_phase_prefix(service))
}

/// A sole participant commits in one phase when it writes something and deletes nothing, and its
/// operations leave room for the record in one `TransactWriteItems` (100 items at most). A delete
/// stays two-phase: the stream tells a delete by a commit from any other delete only by the lock of
/// the transaction the removed item carried. So does a resource's operation (`catalog` marks it): a
/// resource beyond DynamoDB cannot commit in the same write as the record.
fn takes_one_phase(operations: &[Operation], catalog: &Catalog) -> bool {
    let resource = |op: &Operation| catalog.schema(op.kind()).is_some_and(|schema| schema.resource);
    operations.len() < crate::model::MAX_OPERATIONS_PER_PARTICIPANT
        && operations.iter().any(|op| !op.is_read_only())
        && !operations.iter().any(|op| matches!(op, Operation::Delete { .. }) || resource(op))
}

/// A record another writer decided, shown with the votes this coordinator collected when it has none.
fn with_votes(mut record: TransactionRecord, votes: Vec<ParticipantEntry>) -> TransactionRecord {
    if record.participants.iter().all(|p| p.vote.is_none()) {
        record.participants = votes;
    }
    record
}

fn record_vote(entry: &mut ParticipantEntry, response: ParticipantResponse) {
    match response.vote {
        Some(Vote::Prepared) => {
            entry.vote = Some(Vote::Prepared);
            entry.read_only = response.read_only;
            entry.lock_token = response.lock_token;
        }
        Some(Vote::Refused) => {
            entry.vote = Some(Vote::Refused);
            entry.code = response.code;
            entry.blocked_by = response.blocked_by.filter(|_| response.code == Some(RefusalCode::Conflict));
            entry.unresolved_owner = response.unresolved_owner;
            entry.service_code =
                response.service_code.map(|c| crate::record::cut(&c, crate::model::MAX_SERVICE_CODE_BYTES));
            // As the record keeps it: the answer and GET then say the same.
            entry.reason = response.reason.map(|r| crate::record::cut(&r, crate::record::MAX_REASON_BYTES));
        }
        None => {
            entry.code = Some(RefusalCode::Unavailable);
            entry.reason = Some(format!("prepare answered without a vote: {response:?}"));
        }
    }
}

/// What one attempt of a request came to: its answer, and the attempt's record when it ended aborted (its
/// abort recorded), for the coordinator to judge whether to retry it.
struct Attempted {
    reply: Reply,
    refused: Option<Refused>,
}

impl From<Reply> for Attempted {
    fn from(reply: Reply) -> Attempted {
        Attempted { reply, refused: None }
    }
}

/// An attempt whose abort is recorded, with its votes, and the participant where a lock refused it.
struct Refused {
    record: TransactionRecord,
    blocked_at: Option<usize>,
}

fn retryable_votes(votes: &[ParticipantEntry]) -> bool {
    // An owner the coordinator could not resolve (no record: the sweeper's) is no contention a retry could
    // wait out: the refusal is the answer, not a burst of attempts until the sweeper's next run.
    votes.iter().any(|p| p.code == Some(RefusalCode::Conflict))
        && votes.iter().all(prepared_conflicted_or_unasked)
        && votes.iter().all(|p| p.unresolved_owner.is_none())
}

/// A vote that does not stand in a retry's way: prepared, refused for contention, or not asked (a retry's
/// sequential prepares stop at the first refusal).
fn prepared_conflicted_or_unasked(p: &ParticipantEntry) -> bool {
    p.vote == Some(Vote::Prepared) || p.code == Some(RefusalCode::Conflict) || (p.vote.is_none() && p.code.is_none())
}

/// Refused for contention only: CONFLICT, or TIMEOUT (an older transaction that waited for a younger one's
/// lock as long as its deadline allowed), or the deadline passed while every participant prepared.
fn refused_for_contention(votes: &[ParticipantEntry]) -> bool {
    votes.iter().all(|p| prepared_conflicted_or_unasked(p) || p.code == Some(RefusalCode::Timeout)) && !votes.is_empty()
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

/// Whether an answer completes the second phase for that participant.
///
/// A commit answered NOT_PREPARED counts as applied, and that is sound: commit is only ever sent for a
/// transaction decided COMMITTING, for which every participant voted PREPARED, so each of its items
/// held a lock of this transaction. That lock goes away only by committing the item (here, or by lock
/// resolution rolling it forward), never by an abort: aborts and releases happen only for transactions
/// decided ABORTING, and a status never moves backwards. So a lock that is gone was applied, even when
/// a later commit by another transaction has since replaced `lastTx`.
fn acknowledged(action: Action, response: &ParticipantResponse) -> bool {
    matches!(
        (action, response.status.as_deref()),
        (Action::Commit, Some(STATUS_COMMITTED | STATUS_NOT_PREPARED)) | (Action::Abort, Some(STATUS_ABORTED))
    )
}

fn abort_reason(votes: &[ParticipantEntry]) -> String {
    let reasons = votes
        .iter()
        .filter(|p| p.vote != Some(Vote::Prepared))
        .map(|p| format!("{}: {}", p.service, p.reason.as_deref().unwrap_or("did not prepare")))
        .collect::<Vec<_>>()
        .join("; ");
    crate::record::cut(&reasons, crate::record::MAX_REASON_BYTES)
}

/// Validates a request body (`TransactionRequest::parse`) and that every operation can be written by the
/// participants' writes (DynamoDB's expression limit): what the coordinator accepts, before anything is
/// written.
pub fn parse_request(body: &[u8], is_registered: impl Fn(&str) -> bool) -> Result<TransactionRequest, Invalid> {
    parse_request_with(body, is_registered, &Catalogs::default())
}

/// [`parse_request`], each service's operations taking also its own kinds (`catalogs`).
pub fn parse_request_with(
    body: &[u8],
    is_registered: impl Fn(&str) -> bool,
    catalogs: &Catalogs,
) -> Result<TransactionRequest, Invalid> {
    let request = TransactionRequest::parse_with(body, is_registered, catalogs)?;
    for (i, part) in request.participants.iter().enumerate() {
        crate::participant::expressions::check_list(&part.operations, &format!("participants[{i}].operations"))?;
    }
    Ok(request)
}

/// The answer for a drive that stopped short: a 503 (or the injected crash) with the transaction's id.
fn drive_error_reply(error: DriveError, id: &str) -> Reply {
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

/// The transaction id of `principal`'s keyed request: the same key from the same caller always names the
/// same transaction, and from another caller another one. A request without a principal (no authorizer
/// ran) keeps the key's own id.
pub fn caller_idempotent_id(principal: Option<&str>, key: &str) -> String {
    use sha2::{Digest, Sha256};
    match principal {
        None => idempotent_id(key),
        Some(principal) => {
            let mut hash = Sha256::new();
            hash.update(b"twopc/idempotency-key/v2\0");
            hash.update(principal.as_bytes());
            hash.update(b"\0");
            hash.update(key.as_bytes());
            format!("tx-{}", &hex::encode(hash.finalize())[..32])
        }
    }
}

/// The transaction id of a keyed request before keys were scoped per caller (and still, for a request
/// without a principal): the key alone names it.
pub fn idempotent_id(key: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("tx-{}", &hex::encode(Sha256::digest(key.as_bytes()))[..32])
}

/// A 503 in the system's own words: which store failed and what the caller may conclude; the DynamoDB
/// error itself (operation, table, the service's text) goes to the log only.
fn unavailable(error: &StoreError, id: Option<&str>) -> Reply {
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
