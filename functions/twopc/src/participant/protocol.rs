//! A participant of one service: how it is built (its table, keys, rules, operations, resource), and the
//! one entry every message goes through ([`Participant::handle`], [`Participant::handle_sealed`]): the
//! guard first ([`super::guard`]: signature, reading, cutoff), then this participant's branch
//! ([`super::port`]: its items, or its resource).

use std::time::Duration;

use serde_json::Value;
use tracing::{Instrument, info_span};

use super::expressions::check_list;
use super::store::DataTable;
use super::{Operations, Rules};
use crate::clock::SharedClock;
use crate::custom::{Catalog, OperationSchema};
use crate::model::{Invalid, Operation, ParticipantRequest, ParticipantResponse};
use crate::record::TransactionStore;
use crate::store::{Item, StoreError};

use super::locks::Cutoff;

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
    /// A recorded prepare's credits take pending entries (issue 48, [`super::credits`]); off for the first
    /// deploy of an upgrade, while participants that ignore entries may still run.
    pub(super) pending_credits: bool,
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
            pending_credits: true,
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

    /// The same participant, taking pending credits for recorded credits (`true`, the default) or the lock
    /// for every credit (`false`: the first deploy of an upgrade, `PENDING_CREDITS=off`). Either way it
    /// commits, aborts and waits for the entries it finds.
    pub fn with_pending_credits(self, pending_credits: bool) -> Participant {
        Participant { pending_credits, ..self }
    }

    pub fn service(&self) -> &str {
        &self.service
    }

    pub fn table(&self) -> &DataTable {
        &self.table
    }

    /// A message signed in v1 (its `signature` inside it): through the guard (`guard.rs`), then to
    /// the branch of this participant (`port.rs`).
    pub async fn handle(&self, request: &ParticipantRequest) -> Result<ParticipantResponse, ParticipantError> {
        let received_at = self.clock.now_ms();
        async {
            let admission = self.admit(request, received_at).await?;
            self.answer(admission, received_at).await
        }
        .instrument(message_span(&self.service, request))
        .await
    }

    /// A message sealed in v2 (an [`Envelope`](crate::auth::Envelope)): opened by the guard, its MAC
    /// checked over the bytes as sent, before anything else.
    pub async fn handle_sealed(
        &self,
        envelope: &crate::auth::Envelope,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let received_at = self.clock.now_ms();
        let (request, admission) = self.admit_sealed(envelope, received_at).await?;
        self.answer(admission, received_at).instrument(message_span(&self.service, &request)).await
    }

    pub(super) fn keys(&self, operations: &[Operation]) -> Result<Vec<Item>, String> {
        operations.iter().map(|op| self.table.key(op.key())).collect()
    }
}

/// Every line a message's handling logs names its transaction, service and action.
fn message_span(service: &str, request: &ParticipantRequest) -> tracing::Span {
    info_span!("participant", tx = %request.transaction_id, service = %service, action = request.action.as_str())
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
