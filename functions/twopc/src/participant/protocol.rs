//! A participant: prepare (lock and validate), commit, abort, for the items of one service's table.

use std::time::Duration;

use futures::future::try_join_all;
use serde_json::Value;
use tracing::{Instrument, info, info_span, warn};

use super::answers::{blocked, operation_refused, prepared, refused, rule_refused, status};
use super::expressions::{LockSpec, Seen, check_list};
use super::operations::{self, unrepresentable_result};
use super::store::{CommitOutcome, DEFAULT_LOCK_MS, DataTable, Lock, LockAttempt, OnePhase, find};
use super::{Operations, Prepared, Rules};
use crate::clock::{CLOCK_MARGIN_MS, SharedClock};
use crate::custom::{Catalog, OperationSchema};
use crate::model::{
    Action, ErrorCode, Invalid, Operation, ParticipantRequest, ParticipantResponse, RefusalCode, STATUS_ABORTED,
    STATUS_COMMITTED, STATUS_FAILED, STATUS_HELD, STATUS_NOT_PREPARED, STATUS_RECORD_EXISTS, Status, Vote,
};
use crate::record::TransactionStore;
use crate::recovery::{OwnerFate, read_owner_fate};
use crate::store::{Item, StoreError, get_s};
use crate::tables::item_attr as a;

/// Attempts at taking the locks when something changes underneath (an expired lock resolved, contention,
/// a wait for a younger transaction's lock).
const LOCK_ATTEMPTS: u32 = 12;
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
    service: String,
    table: DataTable,
    transactions: TransactionStore,
    clock: SharedClock,
    max_lock_wait_ms: u64,
    /// This service's keys: only a message signed with one of them is acted on ([`crate::auth`]).
    keys: std::sync::Arc<dyn crate::auth::KeySource>,
    /// The service's own rules, judged at prepare (none: the generic participant).
    rules: Option<std::sync::Arc<dyn Rules>>,
    /// The service's own operation kinds (none: the built-in ones only), and their schemas.
    operations: Option<std::sync::Arc<dyn Operations>>,
    catalog: Catalog,
    /// The service's resource beyond DynamoDB, driven through try, confirm and cancel (none: items).
    resource: Option<super::resource::Driver>,
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
            // A prepare is judged against the service's own kinds; a commit or an abort finishes what a
            // prepare judged, whatever kinds this deployment knows now.
            let any = Catalog::any();
            let catalog = match request.action {
                Action::Prepare => &self.catalog,
                Action::Commit if request.one_phase_record.is_some() => &self.catalog,
                Action::Commit | Action::Abort | Action::Hold => &any,
            };
            let operations = parse_operations_for(&request.operations, catalog)?;
            let tx = &request.transaction_id;
            // A one-phase commit is its transaction's only write: it holds nothing anywhere while it waits.
            let holds_no_locks = request.holds_no_locks || request.one_phase_record.is_some();
            let order = Order { started_at: request.started_at, deadline: request.deadline, holds_no_locks };
            let principal = request.principal.as_deref();
            if let Some(driver) = &self.resource {
                let response = self.drive_resource(driver, request, order, &operations).await?;
                info!(vote = ?response.vote, status = ?response.status, reason = ?response.reason, "answered");
                let answered_at = Some(self.clock.now_ms());
                return Ok(ParticipantResponse { received_at: Some(received_at), answered_at, ..response });
            }
            let response = match request.action {
                Action::Prepare => self.prepare(tx, order, principal, &operations, request.held).await?,
                Action::Commit => match &request.one_phase_record {
                    Some(record) => self.commit_one_phase(tx, order, principal, &operations, record).await?,
                    None => self.commit(tx, &operations, request.lock_token.as_deref()).await?,
                },
                Action::Abort => self.abort(&request.transaction_id, &operations).await?,
                Action::Hold => {
                    let until = hold_until(request)?;
                    self.hold(tx, &operations, request.lock_token.as_deref(), until).await?
                }
            };
            info!(vote = ?response.vote, status = ?response.status, reason = ?response.reason, "answered");
            let answered_at = Some(self.clock.now_ms());
            Ok(ParticipantResponse { received_at: Some(received_at), answered_at, ..response })
        }
        .instrument(span)
        .await
    }

    /// A resource participant's answer: its try, confirm or cancel, behind the barrier.
    async fn drive_resource(
        &self,
        driver: &super::resource::Driver,
        request: &ParticipantRequest,
        order: Order,
        operations: &[Operation],
    ) -> Result<ParticipantResponse, ParticipantError> {
        let tx = &request.transaction_id;
        let now = || self.clock.now_ms();
        match request.action {
            Action::Prepare => {
                if let Some(other) = operations.iter().find(|op| !matches!(op, Operation::Custom { .. })) {
                    return Ok(refused(
                        RefusalCode::Invalid,
                        format!("{} speaks only its own operations, not \"{}\"", self.service, other.kind()),
                    ));
                }
                let prepare = super::resource::Prepare {
                    service: &self.service,
                    tx,
                    principal: request.principal.as_deref(),
                    operations,
                    deadline: order.deadline,
                    started_at: order.priority(),
                };
                Ok(driver.prepare(prepare, now).await?)
            }
            // A resource cannot commit atomically with the record: the coordinator commits it in two
            // phases (its schemas are marked `resource`), and a one-phase commit is refused unapplied.
            Action::Commit if request.one_phase_record.is_some() => {
                Ok(refused(RefusalCode::Invalid, format!("{} is a resource: it commits in two phases", self.service)))
            }
            Action::Commit => {
                failed_resource(driver.commit(&self.service, tx, request.lock_token.as_deref(), now).await)
            }
            Action::Abort => failed_resource(driver.abort(&self.service, tx, now).await),
            Action::Hold => Ok(driver.hold(tx, request.lock_token.as_deref(), hold_until(request)?).await?),
        }
    }

    fn keys(&self, operations: &[Operation]) -> Result<Vec<Item>, String> {
        operations.iter().map(|op| self.table.key(op.key())).collect()
    }

    /// Locks the items of `operations` for `tx` (a participant whose operations only `check` reads them and
    /// locks nothing, unless the transaction is `held`: a check means nothing over a long hold otherwise).
    async fn prepare(
        &self,
        tx: &str,
        order: Order,
        principal: Option<&str>,
        operations: &[Operation],
        held: bool,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let keys = match self.keys(operations) {
            Ok(keys) => keys,
            Err(reason) => return Ok(refused(RefusalCode::Invalid, reason)),
        };
        let now = self.clock.now_ms();
        let cutoff = Cutoff::of(order);
        if let Some(late) = cutoff.passed(now, "prepare arrived") {
            // Locking now would only hold the item for a transaction that can no longer commit.
            return Ok(late);
        }
        if !held && operations.iter().all(Operation::is_read_only) {
            return self.prepare_read_only(tx, order, principal, operations, &keys).await;
        }
        let work: Vec<(Operation, Item)> = operations.iter().cloned().zip(keys).collect();
        let waiting = Waiting::new(tx, order, now, self.max_lock_wait_ms);
        let expires_at = order.deadline.unwrap_or(now + DEFAULT_LOCK_MS);
        let started_at = order.priority().unwrap_or(now);
        while let Some(attempt) = waiting.next_attempt() {
            // Every attempt checks the cutoff first: no lock is written for a transaction whose deadline
            // (and the clock margin) passed, however long the attempts before took.
            if let Some(late) = cutoff.passed(self.clock.now_ms(), "the items could not be locked before") {
                return Ok(late);
            }
            // Every attempt at the lock write carries a token no other request ever carried (the write is
            // sent once, without SDK retries): the vote reports the token of the lock it saw taken, and a
            // request of this prepare that lands late — after the item was committed and changed again —
            // can only take a lock whose token no vote reported, which commit releases without applying.
            // With rules or own operations: judged on the items as they are, locked only if they still are.
            let (ready, seen) = match self.judge(tx, principal, &work).await? {
                Judged::Refused(refusal) => return Ok(refusal),
                Judged::Locked(index, item) => {
                    if let Some(answer) =
                        self.after_lock_failure(tx, &work, vec![(index, item)], &waiting, attempt).await?
                    {
                        return Ok(answer);
                    }
                    continue;
                }
                Judged::Ready(ready, seen) => (ready, seen),
            };
            let token = uuid::Uuid::new_v4().simple().to_string();
            let spec = LockSpec { tx, token: &token, expires_at, started_at };
            let timeout = cutoff.left(self.clock.now_ms());
            let locked = match self.table.lock_all(spec, &ready, timeout, &seen).await {
                Ok(locked) => locked,
                // Whether it took effect or not, the next attempt finds out: a lock of this transaction is
                // then its own, and its token is the vote's.
                Err(e) if attempt + 1 < LOCK_ATTEMPTS => {
                    warn!(error = %e, attempt, "lock write failed; trying again with a new token");
                    self.backoff(attempt, cutoff).await;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            match locked {
                LockAttempt::Locked(returned) => return self.verify_locked(tx, &token, &work, returned).await,
                LockAttempt::Contention => self.backoff(attempt, cutoff).await,
                LockAttempt::Unstorable(reason) => return Ok(refused(RefusalCode::ConditionFailed, reason)),
                LockAttempt::ConditionFailed(failed) => {
                    if let Some(answer) = self.after_lock_failure(tx, &work, failed, &waiting, attempt).await? {
                        return Ok(answer);
                    }
                }
            }
        }
        Ok(refused(
            RefusalCode::Conflict,
            format!("could not lock the items after {LOCK_ATTEMPTS} attempts: they kept changing"),
        ))
    }

    /// The guards held when the locks were taken; one thing they cannot express remains: that an `add`'s
    /// result fits in a DynamoDB number. Checked here on the locked values, and the locks released if not.
    async fn verify_locked(
        &self,
        tx: &str,
        token: &str,
        work: &[(Operation, Item)],
        returned: Vec<Item>,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let adds: Vec<&(Operation, Item)> = work.iter().filter(|(op, _)| matches!(op, Operation::Add { .. })).collect();
        if adds.is_empty() {
            return Ok(prepared(Some(token.to_owned())));
        }
        let items = if returned.is_empty() {
            let keys: Vec<Item> = adds.iter().map(|(_, key)| key.clone()).collect();
            self.table.get_many(&keys).await?
        } else {
            returned
        };
        let problem =
            adds.iter().find_map(|(op, key)| find(&items, key).and_then(|item| unrepresentable_result(op, item)));
        let Some(problem) = problem else { return Ok(prepared(Some(token.to_owned()))) };
        try_join_all(work.iter().map(|(_, key)| self.table.release(tx, key, Some(token), "unrepresentable result")))
            .await?;
        Ok(refused(RefusalCode::ConditionFailed, problem))
    }

    /// Classifies a failed lock write from the items as they were: the answer to give (`Some`), or `None`
    /// once the way is clear to try again (an expired lock resolved, or a pause when an item changed).
    async fn after_lock_failure(
        &self,
        tx: &str,
        work: &[(Operation, Item)],
        failed: Vec<(usize, Option<Item>)>,
        waiting: &Waiting<'_>,
        attempt: u32,
    ) -> Result<Option<ParticipantResponse>, ParticipantError> {
        let now = self.clock.now_ms();
        let mut failures = Vec::with_capacity(failed.len());
        for (index, returned) in failed {
            let (op, key) = &work[index];
            let item = match returned {
                Some(item) => Some(item),
                // Not every endpoint returns the item with the failure: read it.
                None => self.table.get(key).await?,
            };
            failures.push((key, classify_lock_failure(tx, op, item.as_ref(), now)));
        }
        let ours: Vec<&Option<String>> = failures
            .iter()
            .filter_map(|(_, f)| match f {
                LockFailure::Ours { token } => Some(token),
                _ => None,
            })
            .collect();
        if let Some(first) = ours.first() {
            // An earlier delivery of this prepare (or this write's own attempt whose reply was lost) locked
            // the items: its vote stands, with its token. Locks on only some of them mean the transaction is
            // already being finished here, so nothing more may be locked for it.
            if ours.len() == work.len() && ours.iter().all(|token| token == first) {
                return Ok(Some(prepared((*first).clone())));
            }
            return Ok(Some(refused(
                RefusalCode::Conflict,
                format!("transaction {tx} holds only some of its items here: it is already being finished"),
            )));
        }
        let (key, failure) = failures.swap_remove(0);
        self.settle(failure, key, waiting, attempt).await
    }

    /// What a lock failure means for this attempt: a refusal to answer (`Some`), or `None` to try again.
    async fn settle(
        &self,
        failure: LockFailure,
        key: &Item,
        waiting: &Waiting<'_>,
        attempt: u32,
    ) -> Result<Option<ParticipantResponse>, ParticipantError> {
        match failure {
            LockFailure::Refused { code, reason } => Ok(Some(refused(code, reason))),
            LockFailure::Expired { owner } => self.resolve(&owner, key).await,
            LockFailure::Held { owner, started_at, entity } => {
                if !waiting.may_wait_for(&owner, started_at) {
                    // Wait-die: the younger one yields at once, and says to whom (its retry starts there), unless
                    // the owner is decided or held (read first, below).
                    if let Some(settled) = self.settle_owner(&owner, key, &entity).await? {
                        return Ok(settled);
                    }
                    return Ok(Some(blocked(&owner, locked_by(&entity, &owner))));
                }
                let began = self.clock.now_ms();
                let last_owner = match self.wait_for_release(key, &entity, owner, waiting).await? {
                    Waited::Released => return Ok(None),
                    Waited::Settled(answer) => return Ok(answer),
                    Waited::OutOfTime { owner } => owner,
                };
                Ok(Some(refused(
                    RefusalCode::Timeout,
                    format!(
                        "{}; waited {} ms for it, as long as the deadline allows",
                        locked_by(&entity, &last_owner),
                        self.clock.now_ms().saturating_sub(began)
                    ),
                )))
            }
            LockFailure::Ours { .. } | LockFailure::Unexplained => {
                self.backoff(attempt, waiting.cutoff).await;
                Ok(None)
            }
        }
    }

    /// What a live lock's owner's record says, read only. Decided already (a late prepare's stray lock, or
    /// one whose second phase is in flight): settled now, as lock resolution would after its expiry (its
    /// owner can never need it again, and it would refuse every younger transaction until then); the
    /// answer is `Some(None)`, try again. Held for its caller's decision (outside the bound): refused
    /// CONFLICT at once whatever the age. Undecided or without a record: `None`, left alone.
    async fn settle_owner(
        &self,
        owner: &str,
        key: &Item,
        entity: &str,
    ) -> Result<Option<Option<ParticipantResponse>>, ParticipantError> {
        match self.transactions.get(owner).await?.map(|r| r.status) {
            None | Some(Status::Preparing) => Ok(None),
            Some(Status::Prepared) => {
                Ok(Some(Some(blocked(owner, format!("{}, held for its caller's decision", locked_by(entity, owner))))))
            }
            Some(_) => Ok(Some(self.resolve(owner, key).await?)),
        }
    }

    /// A transaction that may wait for `owner`'s lock on `key` (older, or holding nothing): polls the item
    /// until the lock is no longer `owner`'s (released, or expired and resolvable: the next attempt resolves
    /// it). A lock that passed to another live holder this transaction may wait for is waited for in turn,
    /// without a lock write that could only fail: when a hot lock is released every waiter's poll sees it,
    /// and all but the first to write would lose the race. After a few polls with the same holder its record
    /// is read once ([`Participant::settle_owner`]): a decided or held owner is not waited for. `OutOfTime`
    /// once the wait budget is spent, with the holder it waited for last.
    async fn wait_for_release(
        &self,
        key: &Item,
        entity: &str,
        mut owner: String,
        waiting: &Waiting<'_>,
    ) -> Result<Waited, ParticipantError> {
        let mut polls = 0;
        let mut polls_of_owner = 0;
        while let Some(pause) = waiting.pause(polls, self.clock.now_ms()) {
            tokio::time::sleep(pause).await;
            polls += 1;
            polls_of_owner += 1;
            if polls_of_owner == OWNER_CHECK_AFTER_POLLS
                && let Some(answer) = self.settle_owner(&owner, key, entity).await?
            {
                return Ok(Waited::Settled(answer));
            }
            let item = self.table.get(key).await?;
            let now = self.clock.now_ms();
            match item.as_ref().and_then(Lock::of) {
                Some(lock)
                    if now <= crate::clock::resolvable_after(lock.expires_at) && lock.transaction_id == owner => {}
                Some(lock)
                    if now <= crate::clock::resolvable_after(lock.expires_at)
                        && lock.transaction_id != waiting.tx
                        && waiting.may_wait_for(&lock.transaction_id, lock.started_at) =>
                {
                    owner = lock.transaction_id;
                    polls_of_owner = 0;
                }
                _ => {
                    waiting.waits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Ok(Waited::Released);
                }
            }
        }
        Ok(Waited::OutOfTime { owner })
    }

    /// A participant that only checks locks nothing: it votes on what it reads now and takes no part
    /// in the second phase. Its guarantee is that the checks held at the moment of prepare.
    async fn prepare_read_only(
        &self,
        tx: &str,
        order: Order,
        principal: Option<&str>,
        operations: &[Operation],
        keys: &[Item],
    ) -> Result<ParticipantResponse, ParticipantError> {
        let waiting = Waiting::new(tx, order, self.clock.now_ms(), self.max_lock_wait_ms);
        while let Some(attempt) = waiting.next_attempt() {
            if let Some(late) = waiting.cutoff.passed(self.clock.now_ms(), "the checked items could not be read before")
            {
                return Ok(late);
            }
            let items = try_join_all(keys.iter().map(|key| self.table.get(key))).await?;
            let now = self.clock.now_ms();
            let failure = operations
                .iter()
                .zip(&items)
                .zip(keys)
                .find_map(|((op, item), key)| check_holds(tx, op, item.as_ref(), now).err().map(|f| (f, key)));
            let Some((failure, key)) = failure else {
                // The service's rules judge what was read (nothing is locked: a check holds when it is read).
                for (op, item) in operations.iter().zip(&items) {
                    if let Some(refusal) = self.rule_refusal(tx, principal, op, item.as_ref()) {
                        return Ok(refusal);
                    }
                }
                return Ok(ParticipantResponse { vote: Some(Vote::Prepared), read_only: true, ..Default::default() });
            };
            if let Some(refusal) = self.settle(failure, key, &waiting, attempt).await? {
                return Ok(refusal);
            }
        }
        Ok(refused(RefusalCode::Conflict, "the checked items kept changing".to_owned()))
    }

    /// The service's rules and own operations on the items as they are now: a refusal, or the work to lock
    /// (each custom operation with the data it computed) and what each item was seen at (the lock write's
    /// condition). Without rules or custom operations nothing is read and nothing is conditioned. An item
    /// another transaction holds is not judged: that lock is resolved or waited for as always, and the next
    /// attempt judges again.
    async fn judge(&self, tx: &str, principal: Option<&str>, work: &[(Operation, Item)]) -> Result<Judged, StoreError> {
        let custom = work.iter().any(|(op, _)| matches!(op, Operation::Custom { .. }));
        if self.rules.is_none() && !custom {
            return Ok(Judged::Ready(work.to_vec(), vec![]));
        }
        let keys: Vec<Item> = work.iter().map(|(_, key)| key.clone()).collect();
        let items = match keys.as_slice() {
            [key] => self.table.get(key).await?.into_iter().collect(),
            _ => self.table.get_many(&keys).await?,
        };
        let mut seen = Vec::with_capacity(work.len());
        let mut ready = Vec::with_capacity(work.len());
        for (index, (op, key)) in work.iter().enumerate() {
            let item = find(&items, key);
            if item.and_then(Lock::of).is_some_and(|l| l.transaction_id != tx) {
                return Ok(Judged::Locked(index, item.cloned()));
            }
            if let Some(refusal) = self.rule_refusal(tx, principal, op, item) {
                return Ok(Judged::Refused(refusal));
            }
            let op = match op {
                Operation::Custom { kind, key: op_key, fields, .. } => {
                    let computed = match self.compute(tx, principal, op, item) {
                        Ok(computed) => computed,
                        Err(refusal) => return Ok(Judged::Refused(*refusal)),
                    };
                    Operation::Custom {
                        kind: kind.clone(),
                        key: op_key.clone(),
                        fields: fields.clone(),
                        computed: Some(computed),
                    }
                }
                op => op.clone(),
            };
            ready.push((op, key.clone()));
            seen.push(Seen::of(item));
        }
        Ok(Judged::Ready(ready, seen))
    }

    /// What one of the service's own operations makes of the item: its new data, or the refusal to vote.
    fn compute(
        &self,
        tx: &str,
        principal: Option<&str>,
        op: &Operation,
        item: Option<&Item>,
    ) -> Result<serde_json::Map<String, Value>, Box<ParticipantResponse>> {
        let Some(operations) = &self.operations else {
            return Err(Box::new(refused(
                RefusalCode::Invalid,
                format!("service {} has no operation \"{}\"", self.service, op.kind()),
            )));
        };
        let (data, version) = item_view(item);
        let prepared = Prepared {
            service: &self.service,
            transaction_id: tx,
            principal,
            operation: op,
            data: data.as_ref(),
            version,
        };
        operations.prepare(&prepared).map_err(|refusal| Box::new(operation_refused(refusal)))
    }

    /// The REFUSED vote of the first rule that refuses `op` on `item`, if any.
    fn rule_refusal(
        &self,
        tx: &str,
        principal: Option<&str>,
        op: &Operation,
        item: Option<&Item>,
    ) -> Option<ParticipantResponse> {
        let rules = self.rules.as_ref()?;
        let (data, version) = item_view(item);
        let prepared = Prepared {
            service: &self.service,
            transaction_id: tx,
            principal,
            operation: op,
            data: data.as_ref(),
            version,
        };
        rules.check(&prepared).err().map(rule_refused)
    }

    /// Resolves an expired lock of `owner` on one item. `Some` is the refusal to give when the owner is
    /// still deciding; `None` means the item is free to try again.
    async fn resolve(&self, owner: &str, key: &Item) -> Result<Option<ParticipantResponse>, ParticipantError> {
        let now = self.clock.now_ms();
        // Read only: a participant may not write another transaction's decision (issue 42).
        let fate = read_owner_fate(&self.transactions, owner, now).await?;
        warn!(owner, ?key, fate = fate_name(&fate), "resolving a lock (expired, or its owner decided)");
        match fate {
            OwnerFate::Expired => {
                return Ok(Some(ParticipantResponse {
                    unresolved_owner: Some(owner.to_owned()),
                    ..blocked(
                        owner,
                        format!(
                            "entity is locked by transaction {owner}, past its deadline and undecided; \
                             it is aborted by the coordinator or the sweeper, not by a participant"
                        ),
                    )
                }));
            }
            OwnerFate::Undecided => {
                return Ok(Some(blocked(
                    owner,
                    format!("entity is locked by transaction {owner}, which is still deciding"),
                )));
            }
            OwnerFate::Held(record) => {
                // Its hold message may have been lost: the lock belongs at holdUntil, with the voted token.
                let token =
                    record.participants.iter().find(|p| p.service == self.service).and_then(|p| p.lock_token.clone());
                if let (Some(until), Some(token)) = (record.hold_until, token) {
                    self.table.extend_lock(owner, key, Some(&token), until).await?;
                }
                return Ok(Some(blocked(
                    owner,
                    format!("entity is locked by transaction {owner}, which is held for its caller's decision"),
                )));
            }
            OwnerFate::Abort | OwnerFate::Committed => {
                self.table.release(owner, key, None, "lock resolution").await?;
            }
            OwnerFate::Commit(record) => {
                let entry = record.participants.iter().find(|p| p.service == self.service);
                let op = entry
                    .into_iter()
                    .flat_map(|p| p.operations.iter())
                    .map(|v| Operation::parse_for(v, "record", &Catalog::any()))
                    .filter_map(Result::ok)
                    .find(|op| self.table.key(op.key()).as_ref() == Ok(key));
                // With the token the owner's record lists: a stray lock of a late prepare is released, not applied.
                let token = entry.and_then(|p| p.lock_token.as_deref());
                match op {
                    Some(op) => {
                        self.table.commit_item(owner, &op, key, token).await?;
                    }
                    // What commits is the vote the lock keeps, not the record's list (which may have been
                    // changed after the vote): an item the record no longer lists is still rolled forward.
                    None => {
                        if self.table.commit_as_voted(owner, key, token).await?.is_none() {
                            return Err(ParticipantError::Unresolvable {
                                owner: owner.to_owned(),
                                detail: "its record does not list this item, and its lock keeps no vote".to_owned(),
                            });
                        }
                    }
                }
            }
        }
        Ok(None)
    }

    /// Prepare and commit in one atomic write, for a transaction with no other writing participant.
    async fn commit_one_phase(
        &self,
        tx: &str,
        order: Order,
        principal: Option<&str>,
        operations: &[Operation],
        record: &Value,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let keys = match self.keys(operations) {
            Ok(keys) => keys,
            Err(reason) => return Ok(refused(RefusalCode::Invalid, reason)),
        };
        let record = match record {
            Value::Object(map) if map.get("transactionId").and_then(Value::as_str) == Some(tx) => {
                crate::attr::to_item(map)
            }
            _ => {
                return Err(Invalid::new(
                    ErrorCode::InvalidRequest,
                    "onePhaseRecord must be this transaction's record",
                )
                .into());
            }
        };
        let cutoff = Cutoff::of(order);
        let work: Vec<(Operation, Item)> = operations.iter().cloned().zip(keys).collect();
        let waiting = Waiting::new(tx, order, self.clock.now_ms(), self.max_lock_wait_ms);
        while let Some(attempt) = waiting.next_attempt() {
            // As for a lock write: no attempt once the deadline and the clock margin passed.
            let what =
                if attempt == 0 { "the one-phase commit arrived" } else { "the items could not be committed before" };
            if let Some(late) = cutoff.passed(self.clock.now_ms(), what) {
                return Ok(late);
            }
            let (ready, seen) = match self.judge(tx, principal, &work).await? {
                Judged::Refused(refusal) => return Ok(refusal),
                Judged::Locked(index, item) => {
                    if let Some(refusal) =
                        self.after_lock_failure(tx, &work, vec![(index, item)], &waiting, attempt).await?
                    {
                        return Ok(refusal);
                    }
                    continue;
                }
                Judged::Ready(ready, seen) => (ready, seen),
            };
            match self.table.apply_one_phase(tx, &ready, self.transactions.table(), record.clone(), &seen).await? {
                OnePhase::Committed => return Ok(status(STATUS_COMMITTED, None)),
                OnePhase::RecordExists => return Ok(status(STATUS_RECORD_EXISTS, None)),
                OnePhase::Unstorable(message) => return Ok(refused(RefusalCode::ConditionFailed, message)),
                OnePhase::Contention => self.backoff(attempt, cutoff).await,
                OnePhase::ConditionFailed { index, item } => {
                    let failed = vec![(index, item)];
                    if let Some(refusal) = self.after_lock_failure(tx, &work, failed, &waiting, attempt).await? {
                        return Ok(refusal);
                    }
                }
            }
        }
        Ok(refused(
            RefusalCode::Conflict,
            format!("could not commit after {LOCK_ATTEMPTS} attempts: the items kept changing"),
        ))
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

/// A hold message's new expiry: required.
fn hold_until(request: &ParticipantRequest) -> Result<u64, ParticipantError> {
    request
        .hold_until
        .ok_or_else(|| Invalid::new(ErrorCode::InvalidRequest, "holdUntil: a hold message needs it (epoch ms)").into())
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

/// What judging a prepare's items by the service's rules and own operations came to.
enum Judged {
    Refused(ParticipantResponse),
    /// Another transaction's lock on the item of this operation (as the item was read).
    Locked(usize, Option<Item>),
    /// The work to lock (custom operations with what they computed), and what each item was seen at, for
    /// the lock write's condition (empty: no condition).
    Ready(Vec<(Operation, Item)>, Vec<Seen>),
}

/// An item's committed data (as JSON) and version, for a rule or an operation to look at.
fn item_view(item: Option<&Item>) -> (Option<serde_json::Map<String, Value>>, Option<u64>) {
    let data = item.and_then(|i| crate::store::get_m(i, a::DATA)).map(crate::attr::item_to_json);
    let version = item.and_then(|i| crate::store::get_n(i, a::VERSION)).and_then(|v| v.parse().ok());
    (data, version)
}

/// Where a transaction stands in wait-die's order, from its prepare message.
#[derive(Debug, Clone, Copy, Default)]
pub struct Order {
    pub started_at: Option<u64>,
    pub deadline: Option<u64>,
    /// The transaction holds no lock anywhere ([`crate::model::ParticipantRequest::holds_no_locks`]): it may
    /// wait for any lock, whatever its age.
    pub holds_no_locks: bool,
}

impl Order {
    /// The time wait-die orders by: the start, or for a message from a coordinator that sends none, the
    /// deadline (as before start times were sent).
    fn priority(&self) -> Option<u64> {
        self.started_at.or(self.deadline)
    }
}

/// How a wait for a lock ended.
enum Waited {
    Released,
    /// Its owner's record settled it: the answer (`None`: try again).
    Settled(Option<ParticipantResponse>),
    /// The budget ran out waiting for `owner`'s lock.
    OutOfTime {
        owner: String,
    },
}

/// A waiter reads the lock's owner's record after this many polls with the lock still there (a lock
/// usually goes sooner: the read is spared).
const OWNER_CHECK_AFTER_POLLS: u32 = 4;

/// Wait-die between transactions that want the same item. All transactions are ordered by (startedAt,
/// id), the same order everywhere; one that meets the lock of a transaction later in that order (a
/// younger one) waits a little for it to finish, one that meets an older one's lock refuses at once.
/// Waits therefore only ever go from older to younger and can never form a cycle, and a transfer on a
/// hot item usually waits milliseconds instead of aborting. Ordering by start rather than by deadline
/// means a longer timeout never makes a transaction the one that yields.
struct Waiting<'a> {
    tx: &'a str,
    started_at: Option<u64>,
    holds_no_locks: bool,
    /// No wait may end after this.
    until: u64,
    cutoff: Cutoff,
    /// Rounds begun, and how many of them ended in a wait that saw the lock released.
    rounds: std::sync::atomic::AtomicU32,
    waits: std::sync::atomic::AtomicU32,
}

impl<'a> Waiting<'a> {
    fn new(tx: &'a str, order: Order, now_ms: u64, max_wait_ms: u64) -> Waiting<'a> {
        let budget = order.deadline.map_or(0, |d| (d.saturating_sub(now_ms) / 2).min(max_wait_ms));
        Waiting {
            tx,
            started_at: order.priority(),
            holds_no_locks: order.holds_no_locks,
            until: now_ms + budget,
            cutoff: Cutoff::of(order),
            rounds: std::sync::atomic::AtomicU32::new(0),
            waits: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// The number of the next attempt at the items, `None` once [`LOCK_ATTEMPTS`] are spent. A round that
    /// ended waiting for a lock (and saw it released) is not an attempt: the wait is bounded by its budget,
    /// and an older transaction is never refused for being outrun.
    fn next_attempt(&self) -> Option<u32> {
        use std::sync::atomic::Ordering::Relaxed;
        let round = self.rounds.fetch_add(1, Relaxed);
        let attempt = round - self.waits.load(Relaxed);
        (attempt < LOCK_ATTEMPTS).then_some(attempt)
    }

    /// Whether this transaction may wait for `owner`'s lock: it comes before `owner` in wait-die's order (a
    /// message without an order comes after everyone), or it holds no lock anywhere (no wait of it can
    /// close a cycle).
    fn may_wait_for(&self, owner: &str, owner_started_at: u64) -> bool {
        self.holds_no_locks
            || self.started_at.is_some_and(|started_at| (started_at, self.tx) < (owner_started_at, owner))
    }

    /// The pause before looking at a lock again, `None` once it would end past the wait budget. A waiter
    /// that holds locks elsewhere looks often (2–12 ms): everyone waiting for those locks waits for it too.
    /// One that holds nothing costs only itself by looking later (16–48 ms), and every look is a request
    /// the endpoint serves instead of a lock write.
    fn pause(&self, polls: u32, now_ms: u64) -> Option<Duration> {
        let base = if self.holds_no_locks { 16u64 << polls.min(1) } else { 2u64 << polls.min(2) };
        let jitter = uuid::Uuid::new_v4().as_u128() as u64 % (base / 2);
        let pause = base + jitter;
        (now_ms + pause <= self.until).then(|| Duration::from_millis(pause))
    }
}

fn fate_name(fate: &OwnerFate) -> &'static str {
    match fate {
        OwnerFate::Commit(_) => "roll forward",
        OwnerFate::Committed => "release (owner finished)",
        OwnerFate::Abort => "release (owner aborted)",
        OwnerFate::Undecided => "conflict (owner deciding)",
        OwnerFate::Held(_) => "conflict (owner held; its lock moved to holdUntil)",
        OwnerFate::Expired => "refused (owner expired undecided or unrecorded: the coordinator or the sweeper decides)",
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

/// The last moment a participant may write for a transaction: its deadline and the clock margin
/// ([`crate::clock::lock_cutoff`]); none for a message that names no deadline.
#[derive(Debug, Clone, Copy)]
struct Cutoff(Option<u64>);

impl Cutoff {
    fn of(order: Order) -> Cutoff {
        Cutoff(order.deadline.map(crate::clock::lock_cutoff))
    }

    /// The TIMEOUT refusal to answer if `now_ms` is past the cutoff; `what` says what came too late.
    fn passed(self, now_ms: u64, what: &str) -> Option<ParticipantResponse> {
        let cutoff = self.0?;
        (now_ms > cutoff).then(|| {
            refused(
                RefusalCode::Timeout,
                format!(
                    "{what} the deadline: {} ms past it, beyond the clock margin",
                    now_ms - cutoff + CLOCK_MARGIN_MS
                ),
            )
        })
    }

    /// How long a write started at `now_ms` may take before the cutoff.
    fn left(self, now_ms: u64) -> Option<Duration> {
        self.0.map(|cutoff| Duration::from_millis(cutoff.saturating_sub(now_ms).max(1)))
    }
}

impl Participant {
    /// The pause before the next attempt, never past the cutoff: a pause that would end after it is cut
    /// short, and the next attempt's check refuses.
    async fn backoff(&self, attempt: u32, cutoff: Cutoff) {
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

/// Why a lock could not be taken, decided from the item as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockFailure {
    /// The item already carries a lock of this very transaction: an earlier delivery of the same prepare
    /// (or this write's own earlier attempt, whose reply was lost) took it, with this token.
    Ours {
        token: Option<String>,
    },
    Refused {
        code: RefusalCode,
        reason: String,
    },
    /// Held by another transaction past its expiry and twice the clock margin
    /// ([`crate::clock::resolvable_after`]): the owner must be resolved before the item is taken.
    Expired {
        owner: String,
    },
    /// Held by another transaction that is not resolvable yet.
    Held {
        owner: String,
        started_at: u64,
        /// The item's key as text: the reason is [`locked_by`] it and the owner.
        entity: String,
    },
    /// The item no longer shows why the write failed (it changed since): try again.
    Unexplained,
}

/// Why an item cannot be locked now: `owner`'s lock on `entity` (every refusal and wait names the holder).
fn locked_by(entity: &str, owner: &str) -> String {
    format!("entity {entity} is locked by transaction {owner}")
}

/// Explains a failed lock from the item as it was (`None`: no such item). Which lock is in the way,
/// and which guard failed, with the numbers.
pub fn classify_lock_failure(tx: &str, op: &Operation, item: Option<&Item>, now_ms: u64) -> LockFailure {
    let key = op.key_text();
    let refuse = |code, reason: String| LockFailure::Refused { code, reason };
    if let Some(lock) = item.and_then(Lock::of) {
        if lock.transaction_id == tx {
            return LockFailure::Ours { token: lock.token };
        }
        // Only past its expiry and twice the clock margin: a resolver whose clock runs ahead never
        // takes a live transaction's lock for expired.
        if now_ms > crate::clock::resolvable_after(lock.expires_at) {
            return LockFailure::Expired { owner: lock.transaction_id };
        }
        return LockFailure::Held { entity: key, owner: lock.transaction_id, started_at: lock.started_at };
    }
    if let Some(item) = item
        && get_s(item, a::LAST_TX) == Some(tx)
    {
        return refuse(RefusalCode::Conflict, format!("transaction {tx} has already committed entity {key}"));
    }
    match operations::guard_refusal(op, item) {
        Some((code, reason)) => refuse(code, reason),
        None => LockFailure::Unexplained,
    }
}

/// Evaluates a read-only `check` against the item as read: the same guards as its lock condition.
/// Another transaction's lock counts against the check (classified first, as for a lock): a value under
/// it may be about to change, and reading past it could order this transaction inconsistently with
/// the lock holder.
pub fn check_holds(tx: &str, op: &Operation, item: Option<&Item>, now_ms: u64) -> Result<(), LockFailure> {
    match classify_lock_failure(tx, op, item, now_ms) {
        LockFailure::Unexplained | LockFailure::Ours { .. } => Ok(()),
        failure => Err(failure),
    }
}
