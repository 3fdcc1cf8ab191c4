//! A participant of one service: how it is built (its table, keys, rules, operations, resource), the one
//! entry every message goes through first ([`Participant::handle`], [`Participant::handle_sealed`]: the
//! signature, then the action), and the second phase: commit, hold, abort. A prepare and a one-phase
//! commit are [`super::prepare`]'s; a resource's try, confirm and cancel are [`super::resource`]'s.

use std::time::Duration;

use futures::future::try_join_all;
use serde_json::Value;
use tracing::{Instrument, info, info_span, warn};

use super::answers::{refused, status};
use super::expressions::check_list;
use super::store::{CommitOutcome, DataTable};
use super::{Operations, Rules};
use crate::clock::SharedClock;
use crate::custom::{Catalog, OperationSchema};
use crate::model::message::{OnePhase, Prepare};
use crate::model::{
    ErrorCode, Invalid, Message, Operation, ParticipantRequest, ParticipantResponse, RefusalCode, STATUS_ABORTED,
    STATUS_COMMITTED, STATUS_FAILED, STATUS_HELD, STATUS_NOT_PREPARED,
};
use crate::record::TransactionStore;
use crate::store::{Item, StoreError};

use super::locks::{Cutoff, Order};
/// An older transaction waits for a younger one's lock at most this long in all, and never more than
/// half of what is left before its deadline; then it refuses TIMEOUT (out of time, not of priority): an
/// older transaction is never refused CONFLICT because of a younger one. Below the participant function's
/// 10 s timeout.
const MAX_LOCK_WAIT_MS: u64 = 5_000;

#[derive(Debug, thiserror::Error)]
pub enum ParticipantError {
    #[error("invalid participant request: {0}")]
    Invalid(#[from] Invalid),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("transaction {owner} holds a lock this participant cannot resolve: {detail}")]
    Unresolvable { owner: String, detail: String },
    /// The message is not the coordinator's or the sweeper's: refused before anything was done.
    #[error("message refused: {0}")]
    Unauthenticated(#[from] crate::auth::Unauthenticated),
}

#[derive(Debug, Clone)]
pub struct Participant {
    pub(super) service: String,
    pub(super) table: DataTable,
    pub(super) transactions: TransactionStore,
    pub(super) clock: SharedClock,
    pub(super) max_lock_wait_ms: u64,
    /// This service's keys: only a message signed with one of them is acted on ([`crate::auth`]).
    pub(super) keys: std::sync::Arc<dyn crate::auth::KeySource>,
    /// The service's own rules, judged at prepare (none: the generic participant).
    pub(super) rules: Option<std::sync::Arc<dyn Rules>>,
    /// The service's own operation kinds (none: the built-in ones only), and their schemas.
    pub(super) operations: Option<std::sync::Arc<dyn Operations>>,
    pub(super) catalog: Catalog,
    /// The service's resource beyond DynamoDB, driven through try, confirm and cancel (none: items).
    pub(super) resource: Option<super::resource::Driver>,
}

impl std::fmt::Debug for dyn Operations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Operations")
    }
}

impl std::fmt::Debug for dyn Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Rules")
    }
}

impl Participant {
    pub fn new(
        service: impl Into<String>,
        table: DataTable,
        transactions: TransactionStore,
        clock: SharedClock,
    ) -> Self {
        Participant {
            service: service.into(),
            table,
            transactions,
            clock,
            max_lock_wait_ms: MAX_LOCK_WAIT_MS,
            keys: std::sync::Arc::new(crate::auth::LocalKeys),
            rules: None,
            operations: None,
            catalog: Catalog::default(),
            resource: None,
        }
    }

    /// The same participant, driving the service's `resource` (see [`super::resource`]): its operations
    /// are the resource's kinds, tried at prepare, confirmed at commit, cancelled at abort, behind a
    /// barrier in the service's table. Panics if the resource's schemas are not valid.
    pub fn with_resource(self, resource: impl super::resource::Resource) -> Participant {
        let schemas =
            resource.schemas().into_iter().map(|schema| OperationSchema { resource: true, ..schema }).collect();
        let catalog = Catalog::new(schemas)
            .unwrap_or_else(|e| panic!("service {}: invalid operation schemas: {e}", self.service));
        let driver = super::resource::Driver {
            resource: std::sync::Arc::new(resource),
            barrier: super::barrier::Barrier::new(self.table.client().clone(), self.table.name()),
            try_in_flight_ms: super::resource::TRY_IN_FLIGHT_MS,
        };
        Participant { resource: Some(driver), catalog, ..self }
    }

    /// The same resource participant, taking `in_flight` as the longest a try request may be in flight
    /// (by default [`super::resource::TRY_IN_FLIGHT_MS`]).
    pub fn with_try_in_flight(self, in_flight: Duration) -> Participant {
        let resource = self
            .resource
            .map(|driver| super::resource::Driver { try_in_flight_ms: in_flight.as_millis() as u64, ..driver });
        Participant { resource, ..self }
    }

    /// The same participant, speaking the service's own operation kinds (see [`super::Operations`]).
    /// Panics if their schemas are not valid (a kind named like a built-in one, declared twice, ...): a
    /// service that declares them wrong should not start.
    pub fn with_operations(self, operations: impl Operations) -> Participant {
        let catalog = Catalog::new(operations.schemas())
            .unwrap_or_else(|e| panic!("service {}: invalid operation schemas: {e}", self.service));
        Participant { operations: Some(std::sync::Arc::new(operations)), catalog, ..self }
    }

    /// The service's own operation kinds, as the coordinator's `SERVICE_OPERATIONS` takes them.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The same participant, judging every prepare by the service's own `rules` (see [`super::Rules`]).
    pub fn with_rules(self, rules: impl Rules) -> Participant {
        Participant { rules: Some(std::sync::Arc::new(rules)), ..self }
    }

    /// The same participant, verifying messages with `keys` (by default the local development keys,
    /// [`crate::auth::LocalKeys`]; the deployed function always reads its own from the environment).
    pub fn with_keys(self, keys: std::sync::Arc<dyn crate::auth::KeySource>) -> Participant {
        Participant { keys, ..self }
    }

    /// The same participant letting an older transaction wait up to `wait` for a younger one's lock.
    pub fn with_max_lock_wait(self, wait: Duration) -> Participant {
        Participant { max_lock_wait_ms: wait.as_millis() as u64, ..self }
    }

    pub fn service(&self) -> &str {
        &self.service
    }

    pub fn table(&self) -> &DataTable {
        &self.table
    }

    /// A message signed in v1 (its `signature` inside it), checked before anything else: only the
    /// coordinator's and the sweeper's messages are acted on.
    pub async fn handle(&self, request: &ParticipantRequest) -> Result<ParticipantResponse, ParticipantError> {
        let received_at = self.clock.now_ms();
        let checked = crate::auth::verify(self.keys.as_ref(), &self.service, request, received_at).await;
        self.answer(request, received_at, checked).await
    }

    /// A message sealed in v2 (an [`Envelope`](crate::auth::Envelope)): opened, its MAC checked over the
    /// bytes as sent, before anything else.
    pub async fn handle_sealed(
        &self,
        envelope: &crate::auth::Envelope,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let received_at = self.clock.now_ms();
        match crate::auth::open(self.keys.as_ref(), &self.service, envelope, received_at).await {
            Ok(request) => self.answer(&request, received_at, Ok(())).await,
            Err(refused) => {
                warn!(service = %self.service, error = %refused, "message refused: not sealed by the coordinator or the sweeper");
                Err(refused.into())
            }
        }
    }

    async fn answer(
        &self,
        request: &ParticipantRequest,
        received_at: u64,
        checked: Result<(), crate::auth::Unauthenticated>,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let span = info_span!("participant", tx = %request.transaction_id, service = %self.service, action = request.action.as_str());
        async {
            if let Err(refused) = checked {
                warn!(error = %refused, "message refused: not signed by the coordinator or the sweeper");
                return Err(refused.into());
            }
            let message = Message::read(request, &self.catalog)?;
            check_list(message.operations(), "operations")?;
            let response = match &self.resource {
                Some(driver) => self.drive_resource(driver, message).await?,
                None => self.drive_items(message).await?,
            };
            info!(vote = ?response.vote, status = ?response.status, reason = ?response.reason, "answered");
            let answered_at = Some(self.clock.now_ms());
            Ok(ParticipantResponse { received_at: Some(received_at), answered_at, ..response })
        }
        .instrument(span)
        .await
    }

    /// An item participant's answer: the item store's locks, commits and releases.
    async fn drive_items(&self, message: Message) -> Result<ParticipantResponse, ParticipantError> {
        Ok(match message {
            Message::Prepare(m) => {
                self.prepare(&m.transaction_id, order_of_prepare(&m), m.principal.as_deref(), &m.operations, m.held)
                    .await?
            }
            Message::OnePhase(m) => {
                let order = order_of_one_phase(&m);
                self.commit_one_phase(&m.transaction_id, order, m.principal.as_deref(), &m.operations, &m.record)
                    .await?
            }
            Message::Commit(m) => self.commit(&m.transaction_id, &m.operations, m.lock_token.as_deref()).await?,
            Message::Hold(m) => {
                self.hold(&m.transaction_id, &m.operations, m.lock_token.as_deref(), m.hold_until).await?
            }
            Message::Abort(m) => self.abort(&m.transaction_id, &m.operations).await?,
        })
    }

    /// A resource participant's answer: its try, confirm or cancel, behind the barrier.
    async fn drive_resource(
        &self,
        driver: &super::resource::Driver,
        message: Message,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let now = || self.clock.now_ms();
        match message {
            Message::Prepare(m) => {
                if let Some(other) = m.operations.iter().find(|op| !matches!(op, Operation::Custom { .. })) {
                    return Ok(refused(
                        RefusalCode::Invalid,
                        format!("{} speaks only its own operations, not \"{}\"", self.service, other.kind()),
                    ));
                }
                let order = order_of_prepare(&m);
                let prepare = super::resource::Prepare {
                    service: &self.service,
                    tx: &m.transaction_id,
                    principal: m.principal.as_deref(),
                    operations: &m.operations,
                    deadline: order.deadline,
                    started_at: order.priority(),
                };
                Ok(driver.prepare(prepare, now).await?)
            }
            // A resource cannot commit atomically with the record: the coordinator commits it in two
            // phases (its schemas are marked `resource`), and a one-phase commit is refused unapplied.
            Message::OnePhase(_) => {
                Ok(refused(RefusalCode::Invalid, format!("{} is a resource: it commits in two phases", self.service)))
            }
            Message::Commit(m) => {
                failed_resource(driver.commit(&self.service, &m.transaction_id, m.lock_token.as_deref(), now).await)
            }
            Message::Abort(m) => failed_resource(driver.abort(&self.service, &m.transaction_id, now).await),
            Message::Hold(m) => Ok(driver.hold(&m.transaction_id, m.lock_token.as_deref(), m.hold_until).await?),
        }
    }

    pub(super) fn keys(&self, operations: &[Operation]) -> Result<Vec<Item>, String> {
        operations.iter().map(|op| self.table.key(op.key())).collect()
    }

    async fn commit(
        &self,
        tx: &str,
        operations: &[Operation],
        token: Option<&str>,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let keys = self.keys(operations).map_err(|m| Invalid::new(ErrorCode::InvalidRequest, m))?;
        let outcomes =
            try_join_all(operations.iter().zip(&keys).map(|(op, key)| self.table.commit_item(tx, op, key, token)))
                .await?;
        let unproven: Vec<String> = outcomes
            .iter()
            .zip(operations)
            .filter_map(|(outcome, op)| match outcome {
                CommitOutcome::NotPrepared { detail } => Some(format!("entity {}: {detail}", op.key_text())),
                _ => None,
            })
            .collect();
        if unproven.is_empty() {
            return Ok(status(STATUS_COMMITTED, None));
        }
        warn!(?unproven, "commit found no lock of this transaction and no lastTx to prove it");
        Ok(status(STATUS_NOT_PREPARED, Some(unproven.join("; "))))
    }

    /// A held transaction's locks with the voted `token` now expire at `until` (a lock that is gone, or
    /// carries another token, is left alone): answered HELD either way, the coordinator only logs it.
    async fn hold(
        &self,
        tx: &str,
        operations: &[Operation],
        token: Option<&str>,
        until: u64,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let keys: Vec<Item> = operations.iter().filter_map(|op| self.table.key(op.key()).ok()).collect();
        let extended = try_join_all(keys.iter().map(|key| self.table.extend_lock(tx, key, token, until))).await?;
        let missing = extended.iter().filter(|done| !**done).count();
        if missing > 0 {
            warn!(missing, "hold: some locks of the voted token are not there (already finished, or never taken)");
        }
        Ok(status(STATUS_HELD, None))
    }

    /// Releases whatever the transaction holds. A key that does not fit this table (its prepare was
    /// refused as invalid) can hold nothing, so it is skipped rather than failing the abort: an abort that
    /// could never succeed would leave its transaction ABORTING for ever.
    async fn abort(&self, tx: &str, operations: &[Operation]) -> Result<ParticipantResponse, ParticipantError> {
        let keys: Vec<Item> = operations.iter().filter_map(|op| self.table.key(op.key()).ok()).collect();
        try_join_all(keys.iter().map(|key| self.table.release(tx, key, None, "abort"))).await?;
        Ok(status(STATUS_ABORTED, None))
    }
}

/// Wait-die's place of a prepare.
fn order_of_prepare(m: &Prepare) -> Order {
    Order { started_at: m.started_at, deadline: m.deadline, holds_no_locks: m.holds_no_locks }
}

/// A one-phase commit is its transaction's only write: it holds nothing anywhere while it waits.
fn order_of_one_phase(m: &OnePhase) -> Order {
    Order { started_at: m.started_at, deadline: m.deadline, holds_no_locks: true }
}

/// A resource that did not confirm or cancel is answered FAILED with why (the resource's own words,
/// kept in the record's `sweepError`), not acknowledged: the coordinator and the sweeper send it again.
fn failed_resource(
    outcome: Result<ParticipantResponse, super::resource::ResourceFailedOr>,
) -> Result<ParticipantResponse, ParticipantError> {
    match outcome {
        Ok(response) => Ok(response),
        Err(super::resource::ResourceFailedOr::Store(e)) => Err(e.into()),
        Err(super::resource::ResourceFailedOr::Resource(e)) => {
            warn!(error = %e, "the resource failed; the message is to be sent again");
            Ok(status(STATUS_FAILED, Some(crate::record::cut(&e.to_string(), 400))))
        }
    }
}

/// A message's operations, as the coordinator validated them, and writable by this library's writes.
pub fn parse_operations(values: &[Value]) -> Result<Vec<Operation>, Invalid> {
    parse_operations_for(values, &Catalog::default())
}

/// [`parse_operations`], taking also the kinds of `catalog`.
pub fn parse_operations_for(values: &[Value], catalog: &Catalog) -> Result<Vec<Operation>, Invalid> {
    let list = Value::Array(values.to_vec());
    let operations = Operation::parse_list_for(Some(&list), "operations", catalog)?;
    check_list(&operations, "operations")?;
    Ok(operations)
}

impl Participant {
    /// The pause before the next attempt, never past the cutoff: a pause that would end after it is cut
    /// short, and the next attempt's check refuses.
    pub(super) async fn backoff(&self, attempt: u32, cutoff: Cutoff) {
        let jitter = uuid::Uuid::new_v4().as_u128() as u64 % 20;
        let pause = 10 * (1u64 << attempt) + jitter;
        let now = self.clock.now_ms();
        let pause = match cutoff.0 {
            // Past the cutoff at its end: the attempt after it would be refused, so refuse now (a pause of
            // nothing, and the check that follows sees the cutoff passed only once it has).
            Some(cutoff) if now + pause > cutoff => cutoff.saturating_sub(now) + 1,
            _ => pause,
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}
