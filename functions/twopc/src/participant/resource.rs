//! Resources beyond DynamoDB: anything that can reserve and confirm (an external payment API, a
//! relational database) joins a transaction through [`Resource`]: try at prepare, confirm at commit,
//! cancel at abort. The library drives them with the guarantees its item participant has:
//!
//! - **At most once per transaction.** A barrier entry per transaction and service, in the service's own
//!   table (`entityId` `barrier#<transaction>`), is written with a condition before the resource is
//!   called: a try happens only after the entry says TRYING, a confirm only from TRIED with the token the
//!   vote reported, and every call carries an idempotency key per transaction and phase
//!   (`<transaction>:<service>:try`, `:confirm`, `:cancel`, `:recheck`), so a call whose answer was lost
//!   is repeated, never doubled.
//! - **Empty rollback.** A cancel that finds no entry writes one, CANCELLED, and calls nothing.
//! - **Late messages.** A try that arrives after its cancel, or after its transaction ended, finds the
//!   entry and calls nothing.
//! - **Late calls.** The barrier stops late messages, not late requests: a try request that reaches the
//!   resource after the cancel (an authorization landing after its void) would leave something held. No
//!   try is sent after the transaction's cutoff (its deadline and the clock margin), and a request is
//!   assumed to reach the resource within [`TRY_IN_FLIGHT_MS`] of being sent or never; so a cancel is
//!   repeated once that long after the cutoff: the repeat first recovers what the try did (it sends the
//!   try's request again with the try's key, which returns the stored first answer, or does the try now),
//!   then undoes it with a key of its own (a repeat under the cancel's key would only return the first
//!   cancel's stored answer), unless what it recovers is the reservation the first cancel already undid
//!   (an entry cancelled when TRIED): a resource may refuse to undo a reservation twice.
//! - **A confirm never turns into an abort.** After a commit decision a confirm that fails is retried
//!   (by the coordinator, then the sweeper, with backoff), and the transaction stays `COMMITTING`, its
//!   `sweepError` saying why, the sweeper's `Stuck` metric counting it, until the resource confirms.
//!
//! An entry waiting for something (TRYING and TRIED until the deadline; CANCELLED until its recheck is
//! due) carries a lock like a locked item's, in the locks index: the sweeper finds it there when it is
//! due and sends the participant the commit or abort its transaction's record says, as for any lock.
//!
//! A finished entry (REFUSED, CONFIRMED, CANCELLED with its recheck done or nothing to recheck) holds no
//! lock and carries `expireAt`, the table's TTL attribute, so that DynamoDB deletes it once nothing can
//! need it: not before [`Driver::needed_until`] (the last moment a late prepare could still begin a try
//! and find the entry, see there), plus [`BARRIER_RETENTION_MS`]. An entry written before entries
//! expired gets its expiry when it finishes, or, finished already, when a message of its transaction
//! next finds it.

use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;
use tracing::{info, warn};

use super::OperationRefusal;
use super::answers::{operation_refused, prepared, refused, status, stored_refusal};
use super::barrier::{Barrier, Begun, Entry, State};
use crate::expr::{Expr, n};
use crate::model::{
    Operation, ParticipantResponse, RefusalCode, STATUS_ABORTED, STATUS_COMMITTED, STATUS_NOT_PREPARED,
};
use crate::store::StoreError;
use crate::tables::item_attr as a;

/// How long a try request may be in flight: one sent at `t` reaches the resource before
/// `t + TRY_IN_FLIGHT_MS` or never. The cancel is repeated once this long after the transaction's cutoff.
pub const TRY_IN_FLIGHT_MS: u64 = 60_000;

/// How long a finished barrier entry is kept past the bound of `Driver::needed_until`: as long as a finished
/// transaction's record ([`crate::record::RETENTION_SECONDS`]), for whoever looks into what happened to
/// a reservation. Safety needs none of it.
pub const BARRIER_RETENTION_MS: u64 = crate::record::RETENTION_SECONDS * 1_000;

/// A resource the library drives through try, confirm and cancel. Each call gets an idempotency key that
/// is the same for every attempt of that call in this transaction: send it with the request, so that the
/// resource does what it asks once, and answers a repeat with the stored first answer.
pub trait Resource: Send + Sync + 'static {
    /// The operation kinds the service speaks (custom kinds, [`crate::custom`]): what the coordinator
    /// validates and the participant parses.
    fn schemas(&self) -> Vec<super::OperationSchema>;

    /// Reserves what `call.operations` ask (authorize a payment). `Ok`: what was reserved, as the
    /// confirm and the cancel need it (an authorization id), kept in the barrier. `Refused`: nothing is
    /// held (a declined card): the transaction aborts with that refusal. `Failed`: the outcome is not
    /// known (a timeout, a 5xx): the library tries again with the same key while the deadline allows.
    fn try_reserve<'a>(&'a self, call: &'a ResourceCall<'a>) -> BoxFuture<'a, Result<Value, ResourceError>>;

    /// Makes the reservation final (capture). Called only after a commit decision: `Failed` is retried,
    /// never turned into an abort; `Refused` is treated as `Failed`.
    fn confirm<'a>(&'a self, call: &'a ResourceCall<'a>, tried: &'a Value) -> BoxFuture<'a, Result<(), ResourceError>>;

    /// Releases the reservation (void), which `tried` describes. Idempotent under `call.idempotency_key`.
    fn cancel<'a>(&'a self, call: &'a ResourceCall<'a>, tried: &'a Value) -> BoxFuture<'a, Result<(), ResourceError>>;
}

/// One call to a resource.
#[derive(Debug, Clone)]
pub struct ResourceCall<'a> {
    pub service: &'a str,
    pub transaction_id: &'a str,
    /// The transaction's caller (canonical); None when it had none. Present at prepare only.
    pub principal: Option<&'a str>,
    /// The operations of this service in the transaction (its own kinds, as the coordinator validated
    /// them). Empty for a cancel the sweeper sends, which knows only the transaction.
    pub operations: &'a [Operation],
    /// The same for every attempt of this call in this transaction: `<transaction>:<service>:<phase>`.
    pub idempotency_key: String,
    /// How long the call may still run (its requests' timeouts must end within it): the time left until
    /// the transaction's cutoff, at a try; None for a confirm or a cancel, which have no deadline.
    pub time_left: Option<Duration>,
}

/// Why a resource call did not do what it asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceError {
    /// A definite no: nothing is held (a declined card, an invalid request).
    Refused(OperationRefusal),
    /// Not known to have happened, or known not to have: the call may be repeated with the same key.
    Failed(String),
}

/// A resource call failed in a way that must be repeated: the message is answered with an error, so that
/// its sender (the coordinator, the sweeper) tries again.
#[derive(Debug, thiserror::Error)]
#[error("the resource of {service} did not {what}: {message}")]
pub struct ResourceFailed {
    pub service: String,
    pub what: &'static str,
    pub message: String,
}

/// How a participant drives its resource.
#[derive(Clone)]
pub(crate) struct Driver {
    pub resource: std::sync::Arc<dyn Resource>,
    pub barrier: Barrier,
    pub try_in_flight_ms: u64,
}

impl Driver {
    /// A held transaction: its entry, TRIED with the voted `token`, is due at `until` now, so that it does
    /// not head the sweeper's index before the hold ends (the sweeper finds its owner PREPARED and leaves
    /// it anyway). Any other entry is left as it is. Answered HELD either way.
    pub(crate) async fn hold(
        &self,
        tx: &str,
        token: Option<&str>,
        until: u64,
    ) -> Result<ParticipantResponse, StoreError> {
        if let Some(token) = token {
            let mut e = Expr::new();
            let (lock, expires, index) = (e.name(a::LOCK), e.name("expiresAt"), e.name(a::LOCK_EXPIRES_AT));
            let due = e.value(n(until));
            let update = format!("SET {lock}.{expires} = {due}, {index} = {due}");
            if !self.barrier.transition(tx, &[State::Tried], Some(token), e, update).await? {
                warn!(tx, "hold: the barrier entry is not TRIED with the voted token; left as it is");
            }
        }
        Ok(status(crate::model::STATUS_HELD, None))
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("barrier", &self.barrier)
            .field("try_in_flight_ms", &self.try_in_flight_ms)
            .finish()
    }
}

/// What a prepare knows of its transaction.
pub(crate) struct Prepare<'a> {
    pub service: &'a str,
    pub tx: &'a str,
    pub principal: Option<&'a str>,
    pub operations: &'a [Operation],
    pub deadline: Option<u64>,
    pub started_at: Option<u64>,
}

/// Pauses between try attempts: 50 ms doubling, to at most 1 s.
fn pause(attempt: u32) -> Duration {
    Duration::from_millis((50u64 << attempt.min(5)).min(1_000))
}

impl Driver {
    fn call<'a>(&self, service: &'a str, tx: &'a str, operations: &'a [Operation], phase: &str) -> ResourceCall<'a> {
        ResourceCall {
            service,
            transaction_id: tx,
            principal: None,
            operations,
            idempotency_key: format!("{tx}:{service}:{phase}"),
            time_left: None,
        }
    }

    /// When the cancel of a transaction with this deadline is repeated: every try request was sent by
    /// the cutoff, and reaches the resource within the time in flight or never.
    fn recheck_at(&self, deadline: Option<u64>, now: u64) -> u64 {
        deadline.map_or(now, crate::clock::lock_cutoff).max(now) + self.try_in_flight_ms
    }

    /// Until when (epoch ms) the barrier entry of a transaction with this `deadline`, finished at `now`,
    /// must exist: past the last moment a prepare of its transaction could begin a try and find the
    /// entry gone. A prepare begins one only by its clock's cutoff (the deadline and the clock margin M);
    /// its write of the first entry, sent by then, lands within the time in flight or never (as a try
    /// request does); and the table's clock, which its TTL follows, may be M ahead of the participant's.
    /// So: `max(cutoff, now) + in flight + M`, the time of the cancel's repeat plus M. An entry that knows
    /// no deadline (a cancel before any try) takes the latest its transaction can have: it was created
    /// before the abort was sent, by a clock at most M ahead, and lasts at most `MAX_TIMEOUT_MS` (every
    /// prepare the coordinator sends carries the transaction's deadline).
    pub(crate) fn needed_until(&self, deadline: Option<u64>, now: u64) -> u64 {
        use crate::clock::CLOCK_MARGIN_MS;
        let deadline = deadline.unwrap_or(now + CLOCK_MARGIN_MS + crate::model::MAX_TIMEOUT_MS);
        self.recheck_at(Some(deadline), now) + CLOCK_MARGIN_MS
    }

    /// The `expireAt` (epoch seconds) of a finished entry: [`Driver::needed_until`] and the retention.
    fn expire_at(&self, deadline: Option<u64>, now: u64) -> u64 {
        (self.needed_until(deadline, now) + BARRIER_RETENTION_MS).div_ceil(1_000)
    }

    /// An entry an older version finished without an expiry gets one now (a failure to write it only
    /// leaves it for the next message: it answers nothing).
    async fn expire_old(&self, tx: &str, entry: &Entry, now: u64) {
        if !entry.lacks_expiry() {
            return;
        }
        match self.barrier.expire(tx, self.expire_at(entry.deadline, now)).await {
            Ok(true) => info!("an entry of an older version expires now"),
            Ok(false) => {}
            Err(e) => warn!(error = %e, "could not give an older entry its expiry; left for the next message"),
        }
    }

    pub(crate) async fn prepare(
        &self,
        p: Prepare<'_>,
        now: impl Fn() -> u64,
    ) -> Result<ParticipantResponse, StoreError> {
        let started = now();
        let deadline = p.deadline.unwrap_or(started + super::store::DEFAULT_LOCK_MS);
        // (A prepare that arrived past its cutoff was answered by the guard.)
        let cutoff = crate::clock::lock_cutoff(deadline);
        let mut token = uuid::Uuid::new_v4().simple().to_string();
        let times = (deadline, p.started_at.unwrap_or(started), started);
        match self.barrier.begin(p.tx, &token, p.operations, times).await? {
            Begun::Written => {}
            Begun::Existing(entry) => {
                self.expire_old(p.tx, &entry, started).await;
                match entry.state {
                    // A repeated prepare (or the first one's write, whose answer was lost): the same try.
                    State::Trying => token = entry.token.unwrap_or(token),
                    State::Tried => return Ok(prepared(entry.token)),
                    State::Refused => {
                        let (code, reason) = entry.refusal.unwrap_or_default();
                        return Ok(stored_refusal(&code, &reason));
                    }
                    State::Cancelled => {
                        info!("a try after its cancel: nothing done");
                        return Ok(refused(
                            RefusalCode::Timeout,
                            "the transaction was cancelled before this prepare arrived".into(),
                        ));
                    }
                    State::Confirmed => {
                        return Ok(refused(
                            RefusalCode::Timeout,
                            "the transaction had ended before this prepare arrived".into(),
                        ));
                    }
                }
            }
        }
        let mut last_failure = String::new();
        for attempt in 0.. {
            let at = now();
            if at > cutoff {
                break;
            }
            let mut call = self.call(p.service, p.tx, p.operations, "try");
            call.principal = p.principal;
            call.time_left = Some(Duration::from_millis(cutoff - at + 1));
            let outcome =
                match tokio::time::timeout(Duration::from_millis(cutoff - at + 1), self.resource.try_reserve(&call))
                    .await
                {
                    Ok(outcome) => outcome,
                    Err(_) => Err(ResourceError::Failed("no answer before the deadline".into())),
                };
            match outcome {
                Ok(tried) => {
                    if self.barrier.tried(p.tx, &token, &tried).await? {
                        return Ok(prepared(Some(token)));
                    }
                    // Not TRYING with this token any more: the write landed and its answer was lost, or a
                    // cancel came first.
                    return Ok(match self.barrier.get(p.tx).await? {
                        Some(entry) if entry.state == State::Tried && entry.token.as_deref() == Some(&token) => {
                            prepared(Some(token))
                        }
                        _ => refused(RefusalCode::Timeout, "the transaction was cancelled while its try ran".into()),
                    });
                }
                Err(ResourceError::Refused(refusal)) => {
                    let vote = operation_refused(refusal);
                    let code = vote
                        .service_code
                        .clone()
                        .or_else(|| {
                            vote.code
                                .and_then(|c| serde_json::to_value(c).ok())
                                .and_then(|c| c.as_str().map(str::to_owned))
                        })
                        .unwrap_or_default();
                    let refusal = (code.as_str(), vote.reason.as_deref().unwrap_or(""));
                    self.barrier.refused(p.tx, &token, refusal, self.expire_at(Some(deadline), now())).await?;
                    return Ok(vote);
                }
                Err(ResourceError::Failed(why)) => {
                    warn!(attempt, error = %why, "the resource's try failed; trying again with the same key");
                    last_failure = why;
                    let wait = pause(attempt).min(Duration::from_millis(cutoff.saturating_sub(now()) + 1));
                    tokio::time::sleep(wait).await;
                }
            }
        }
        // The entry stays TRYING: the abort that follows cancels it, and repeats the cancel once every
        // try request sent is known to have landed or never to land.
        Ok(refused(
            RefusalCode::Unavailable,
            format!("the resource did not answer the try: {}", crate::record::cut(&last_failure, 400)),
        ))
    }

    pub(crate) async fn commit(
        &self,
        service: &str,
        tx: &str,
        token: Option<&str>,
        now: impl Fn() -> u64,
    ) -> Result<ParticipantResponse, ResourceFailedOr> {
        let Some(entry) = self.barrier.get(tx).await? else {
            return Ok(status(STATUS_NOT_PREPARED, Some("no try of this transaction".into())));
        };
        match entry.state {
            State::Confirmed => {
                self.expire_old(tx, &entry, now()).await;
                Ok(status(STATUS_COMMITTED, None))
            }
            State::Tried if token.is_none() || token == entry.token.as_deref() => {
                let tried = entry.tried.unwrap_or(Value::Null);
                let call = self.call(service, tx, &[], "confirm");
                match self.resource.confirm(&call, &tried).await {
                    Ok(()) => {}
                    Err(
                        ResourceError::Failed(message)
                        | ResourceError::Refused(
                            OperationRefusal::Invalid(message) | OperationRefusal::ConditionFailed(message),
                        ),
                    ) => {
                        return Err(ResourceFailed { service: service.to_owned(), what: "confirm", message }.into());
                    }
                    Err(ResourceError::Refused(OperationRefusal::Rule(refusal))) => {
                        return Err(ResourceFailed {
                            service: service.to_owned(),
                            what: "confirm",
                            message: refusal.reason,
                        }
                        .into());
                    }
                }
                let token = entry.token.unwrap_or_default();
                if !self.barrier.confirmed(tx, &token, self.expire_at(entry.deadline, now())).await? {
                    let now_state = self.barrier.get(tx).await?.map(|e| e.state);
                    if now_state != Some(State::Confirmed) {
                        warn!(state = ?now_state, "confirmed by the resource, but the barrier moved");
                    }
                }
                Ok(status(STATUS_COMMITTED, None))
            }
            other => Ok(status(STATUS_NOT_PREPARED, Some(format!("the barrier is {}", other.as_str())))),
        }
    }

    pub(crate) async fn abort(
        &self,
        service: &str,
        tx: &str,
        now: impl Fn() -> u64,
    ) -> Result<ParticipantResponse, ResourceFailedOr> {
        let entry = match self.barrier.get(tx).await? {
            Some(entry) => entry,
            None => match self.barrier.cancel_empty(tx, now(), self.expire_at(None, now())).await? {
                Begun::Written => {
                    info!("cancel before any try: an empty rollback");
                    return Ok(status(STATUS_ABORTED, None));
                }
                // A prepare wrote its entry meanwhile: cancel that.
                Begun::Existing(entry) => *entry,
            },
        };
        let fail =
            |what, message| ResourceFailedOr::Resource(ResourceFailed { service: service.to_owned(), what, message });
        match entry.state {
            State::Refused => {
                self.expire_old(tx, &entry, now()).await;
                Ok(status(STATUS_ABORTED, None))
            }
            State::Confirmed => {
                warn!("an abort of a confirmed transaction: nothing to cancel");
                self.expire_old(tx, &entry, now()).await;
                Ok(status(STATUS_ABORTED, None))
            }
            State::Trying | State::Tried => {
                let recheck_at = self.recheck_at(entry.deadline, now());
                if !self.barrier.cancelled(tx, recheck_at).await? {
                    // It moved meanwhile (a try recorded, or another abort): judge it again.
                    return Box::pin(self.abort(service, tx, now)).await;
                }
                info!(recheck_at, "cancelled; the cancel is repeated once every try request has landed");
                if let Some(tried) = entry.tried.filter(|_| entry.state == State::Tried) {
                    self.cancel_call(service, tx, &tried, &now).await.map_err(|m| fail("cancel", m))?;
                }
                Ok(status(STATUS_ABORTED, None))
            }
            State::Cancelled => {
                // Whether the reservation the entry knows (TRIED when cancelled) is voided by now.
                let mut voided = entry.cancelled_call;
                if let Some(tried) = entry.tried.as_ref().filter(|_| !entry.cancelled_call) {
                    self.cancel_call(service, tx, tried, &now).await.map_err(|m| fail("cancel", m))?;
                    voided = true;
                }
                let due = entry.recheck_at.is_some_and(|at| now() >= at);
                if entry.rechecked || !due {
                    self.expire_old(tx, &entry, now()).await;
                    return Ok(status(STATUS_ABORTED, None));
                }
                // The repeat: what the try did (its request again, under its key), then undone.
                let recover = self.call(service, tx, &entry.operations, "try");
                match self.resource.try_reserve(&recover).await {
                    // The try's stored answer is the reservation the cancel voided: voiding it again would
                    // be refused by a resource that voids once (a canceled payment is not canceled twice),
                    // at every repeat. An entry cancelled while TRYING knows no reservation: its recovered
                    // try is undone below.
                    Ok(tried) if voided && entry.tried.as_ref() == Some(&tried) => {
                        info!("the repeated cancel found the reservation the cancel had voided: nothing more to undo");
                    }
                    Ok(tried) => {
                        let call = self.call(service, tx, &[], "recheck");
                        self.resource.cancel(&call, &tried).await.map_err(|e| fail("cancel", describe(e)))?;
                        info!(%tried, "the repeated cancel undid what the try had reserved");
                    }
                    Err(ResourceError::Refused(_)) => info!("the repeated cancel found nothing reserved"),
                    Err(ResourceError::Failed(message)) => return Err(fail("recover the try", message)),
                }
                self.barrier.mark(tx, "rechecked", now(), Some(self.expire_at(entry.deadline, now()))).await?;
                Ok(status(STATUS_ABORTED, None))
            }
        }
    }

    async fn cancel_call(&self, service: &str, tx: &str, tried: &Value, now: &impl Fn() -> u64) -> Result<(), String> {
        let call = self.call(service, tx, &[], "cancel");
        self.resource.cancel(&call, tried).await.map_err(describe)?;
        self.barrier.mark(tx, "cancelledCall", now(), None).await.map_err(|e| e.to_string())?;
        Ok(())
    }
}

fn describe(error: ResourceError) -> String {
    match error {
        ResourceError::Failed(message) => message,
        ResourceError::Refused(OperationRefusal::Invalid(m) | OperationRefusal::ConditionFailed(m)) => m,
        ResourceError::Refused(OperationRefusal::Rule(r)) => format!("{}: {}", r.code, r.reason),
    }
}

/// A resource participant's failures: its store's, or its resource's (to be repeated).
#[derive(Debug, thiserror::Error)]
pub enum ResourceFailedOr {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Resource(#[from] ResourceFailed),
}
