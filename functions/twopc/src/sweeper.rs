//! The sweeper: finds what a crash left behind and finishes it, through the sparse indexes (never a
//! scan), with bounded work per run. Open transactions past their deadline are driven by the
//! coordinator's own recovery rule; expired locks are resolved by their owner's record, and the
//! participant that owns the item is asked to commit or release it, so the sweeper itself never
//! writes a participant's table. Everything it does is a conditional write or an idempotent message,
//! so two sweepers at once are safe.

use std::collections::BTreeMap;

use futures::StreamExt;
use serde::Serialize;
use tracing::{Instrument, error, info, info_span, warn};

use crate::coordinator::Coordinator;
use crate::model::message::{Abort, Commit, Hold};
use crate::model::{Message, Operation, STATUS_ABORTED, STATUS_COMMITTED, STATUS_NOT_PREPARED, Status};
use crate::participant::store::{DataTable, Lock};
use crate::record::TransactionRecord;
use crate::recovery::{OwnerFate, owner_fate};
use crate::store::{Item, StoreError};

#[derive(Debug, Clone, Copy)]
pub struct SweepLimits {
    /// Open transactions are left to their coordinator until this long after their deadline (by default
    /// twice the clock margin, as every resolver: `crate::clock::resolvable_after`).
    pub grace_ms: u64,
    /// At most this many open transactions, and this many expired locks per table, from each index shard.
    pub per_shard: i32,
    /// Transactions and locks handled at once.
    pub concurrency: usize,
    /// A transaction this sweep could not finish is looked at again after this long, doubled for each
    /// further failure (at most 64 times): the entries behind it are reached meanwhile.
    pub retry_ms: u64,
}

impl Default for SweepLimits {
    fn default() -> Self {
        SweepLimits { grace_ms: crate::clock::resolvable_after(0), per_shard: 25, concurrency: 8, retry_ms: 5_000 }
    }
}

/// What one run recovered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepReport {
    pub committed: u32,
    pub aborted: u32,
    /// Open transactions past their deadline that this run could not finish.
    pub stuck: u32,
    pub locks_rolled_forward: u32,
    pub locks_released: u32,
    /// Expired locks whose owner is still deciding (it will be aborted once past its deadline).
    pub locks_waiting: u32,
    pub errors: u32,
}

impl SweepReport {
    /// Whether the run found anything to do.
    pub fn is_quiet(&self) -> bool {
        *self == SweepReport::default()
    }

    /// Counts what the run did (see [`crate::telemetry`]; the sweeper function writes them as
    /// CloudWatch embedded metric format after each run).
    pub fn record_metrics(&self) {
        use crate::telemetry::{RECOVERED_TRANSACTIONS, RESOLVED_LOCKS, STUCK_TRANSACTIONS, SWEEP_ERRORS};
        metrics::counter!(STUCK_TRANSACTIONS).increment(u64::from(self.stuck));
        metrics::counter!(RECOVERED_TRANSACTIONS).increment(u64::from(self.committed + self.aborted));
        metrics::counter!(RESOLVED_LOCKS).increment(u64::from(self.locks_rolled_forward + self.locks_released));
        metrics::counter!(SWEEP_ERRORS).increment(u64::from(self.errors));
    }
}

/// What is open after a run, for the sweeper's gauges: the open transactions by status, the age of the
/// oldest, and the operators' stuck view's count (`/admin/stuck`, with its default lock age). Read from
/// the first [`CENSUS_LIMIT`] entries of the open index (in `sweepAt` order): `complete` says whether that
/// was all of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenCensus {
    pub by_status: BTreeMap<String, u32>,
    pub oldest_age_ms: u64,
    pub complete: bool,
    pub stuck: u32,
    /// The open transactions past their expiry (deadline, or a held one's `holdUntil`) by the sweeper's
    /// alert age (`OPEN_ALERT_AFTER_MS`) or more, with their age since they started, oldest first, at most
    /// [`OPEN_ALERTS_PER_RUN`]: the age alerts the sweeper sends. Their operations are left out (an alert
    /// does not carry them), so a run keeps little of each.
    #[serde(skip)]
    pub open_too_long: Vec<(TransactionRecord, u64)>,
}

/// A run announces at most this many transactions open too long (the oldest).
pub const OPEN_ALERTS_PER_RUN: usize = 100;

fn keep_oldest(open: &mut Vec<(TransactionRecord, u64)>) {
    open.sort_by_key(|(_, age)| std::cmp::Reverse(*age));
    open.truncate(OPEN_ALERTS_PER_RUN);
}

/// A census reads at most this many open transactions (and their records) per run.
pub const CENSUS_LIMIT: usize = 500;

impl OpenCensus {
    /// Sets the sweeper's gauges ([`crate::telemetry::SWEEPER_GAUGES`]): every open status, zero included,
    /// so that an alarm reads a value in every run.
    pub fn record_metrics(&self) {
        use crate::telemetry::{OLDEST_OPEN_TRANSACTION_AGE, OPEN_TRANSACTIONS, STATUS, STUCK_VIEW_COUNT};
        for status in [Status::Preparing, Status::Prepared, Status::Committing, Status::Aborting] {
            let count = self.by_status.get(status.as_str()).copied().unwrap_or(0);
            metrics::gauge!(OPEN_TRANSACTIONS, STATUS => status.as_str()).set(f64::from(count));
        }
        metrics::gauge!(OLDEST_OPEN_TRANSACTION_AGE).set(self.oldest_age_ms as f64);
        metrics::gauge!(STUCK_VIEW_COUNT).set(f64::from(self.stuck));
    }
}

pub struct Sweeper {
    /// Also the sweeper's store, invoker and clock, so that they can never disagree with it.
    coordinator: Coordinator,
    /// service → its table, for the locks index.
    tables: BTreeMap<String, DataTable>,
    limits: SweepLimits,
    /// A census lists the open transactions older than this (ms) in `open_too_long`; None: none.
    open_alert_after_ms: Option<u64>,
}

enum TxOutcome {
    Committed,
    Aborted,
    Stuck,
    Skipped,
}

enum LockOutcome {
    RolledForward,
    Released,
    Waiting,
    Gone,
}

impl Sweeper {
    /// A sweeper that drives transactions with `coordinator` (its store, its invoker, its clock) and finds
    /// expired locks in `tables` (service → its table).
    pub fn new(coordinator: Coordinator, tables: BTreeMap<String, DataTable>, limits: SweepLimits) -> Sweeper {
        Sweeper { coordinator, tables, limits, open_alert_after_ms: None }
    }

    /// Its census lists the open transactions older than `ms` (the age alerts).
    pub fn with_open_alerts_after(mut self, ms: u64) -> Sweeper {
        self.open_alert_after_ms = Some(ms);
        self
    }

    pub async fn sweep(&self) -> Result<SweepReport, StoreError> {
        let mut report = SweepReport::default();
        let now = self.coordinator.clock().now_ms();
        let open = self
            .coordinator
            .transactions()
            .open_before(now.saturating_sub(self.limits.grace_ms), self.limits.per_shard)
            .await?;
        // Futures collected before streaming them: a lazy map's closure would keep this future from being Send.
        let recoveries: Vec<_> = open
            .into_iter()
            .map(|id| async move {
                let span = info_span!("sweep", tx = %id);
                let outcome = self.recover_transaction(&id).instrument(span).await;
                (id, outcome)
            })
            .collect();
        let outcomes: Vec<(String, Result<TxOutcome, String>)> =
            futures::stream::iter(recoveries).buffer_unordered(self.limits.concurrency).collect().await;
        for (id, outcome) in outcomes {
            match outcome {
                Ok(TxOutcome::Committed) => report.committed += 1,
                Ok(TxOutcome::Aborted) => report.aborted += 1,
                Ok(TxOutcome::Stuck) => report.stuck += 1,
                Ok(TxOutcome::Skipped) => {}
                Err(e) => {
                    error!(tx = %id, error = %e, "could not recover a transaction");
                    report.stuck += 1;
                    report.errors += 1;
                }
            }
        }
        for (service, table) in &self.tables {
            // One table that cannot be queried must not keep the others' locks from being resolved.
            // Locks that expired before `now - 2M`: the ones a resolver may act on now.
            let expired_before = self.coordinator.clock().now_ms().saturating_sub(crate::clock::resolvable_after(0));
            let keys = match table.expired_locks(expired_before, self.limits.per_shard).await {
                Ok(keys) => keys,
                Err(e) => {
                    error!(service, error = %e, "could not list expired locks");
                    report.errors += 1;
                    continue;
                }
            };
            let resolutions: Vec<_> =
                keys.into_iter().map(|key| async move { self.resolve_lock(service, table, &key).await }).collect();
            let outcomes: Vec<Result<LockOutcome, String>> =
                futures::stream::iter(resolutions).buffer_unordered(self.limits.concurrency).collect().await;
            for outcome in outcomes {
                match outcome {
                    Ok(LockOutcome::RolledForward) => report.locks_rolled_forward += 1,
                    Ok(LockOutcome::Released) => report.locks_released += 1,
                    Ok(LockOutcome::Waiting) => report.locks_waiting += 1,
                    Ok(LockOutcome::Gone) => {}
                    Err(e) => {
                        error!(service, error = %e, "could not resolve an expired lock");
                        report.errors += 1;
                    }
                }
            }
        }
        info!(?report, "sweep finished");
        Ok(report)
    }

    /// What is open now ([`OpenCensus`]): read only, from the open index, the records of a page at a time,
    /// and the operators' stuck view.
    pub async fn census(&self) -> Result<OpenCensus, StoreError> {
        let now = self.coordinator.clock().now_ms();
        let transactions = self.coordinator.transactions();
        let mut census = OpenCensus { complete: true, ..OpenCensus::default() };
        let mut after: Option<(u64, String)> = None;
        let mut read = 0;
        loop {
            let (entries, more) = transactions.open_page(after.as_ref().map(|(t, id)| (*t, id.as_str())), 100).await?;
            let ids: Vec<String> = entries.iter().map(|(_, id)| id.clone()).collect();
            for record in transactions.get_many(&ids).await? {
                if !record.status.is_terminal() {
                    *census.by_status.entry(record.status.as_str().to_owned()).or_default() += 1;
                    let age = now.saturating_sub(record.age());
                    census.oldest_age_ms = census.oldest_age_ms.max(age);
                    // A hold is open by design until its holdUntil: it is overdue only past it.
                    let overdue = now.saturating_sub(record.expiry());
                    if self.open_alert_after_ms.is_some_and(|after| overdue >= after) {
                        let mut slim = record;
                        slim.participants.iter_mut().for_each(|p| p.operations.clear());
                        census.open_too_long.push((slim, age));
                        if census.open_too_long.len() >= 2 * OPEN_ALERTS_PER_RUN {
                            keep_oldest(&mut census.open_too_long);
                        }
                    }
                }
            }
            read += entries.len();
            after = entries.last().cloned();
            if !more {
                break;
            }
            if read >= CENSUS_LIMIT {
                census.complete = false;
                break;
            }
        }
        keep_oldest(&mut census.open_too_long);
        census.stuck = self.coordinator.stuck_count(crate::coordinator::DEFAULT_LOCK_AGE_MS).await?;
        Ok(census)
    }

    async fn recover_transaction(&self, id: &str) -> Result<TxOutcome, String> {
        let Some(record) = self.coordinator.transactions().get(id).await.map_err(|e| e.to_string())? else {
            return Ok(TxOutcome::Skipped);
        };
        if record.status.is_terminal() {
            return Ok(TxOutcome::Skipped);
        }
        let before = record.status;
        let attempts = record.sweep_attempts.unwrap_or(0) + 1;
        let failure = match self.coordinator.recover(record).await {
            Ok(crate::coordinator::Driven { record: after, finished_here, unacknowledged }) => {
                info!(from = %before, to = %after.status, finished_here, "recovered");
                match after.status {
                    // Finished by someone else meanwhile (its coordinator, another sweeper): not this run's to count.
                    _ if after.status.is_terminal() && !finished_here => return Ok(TxOutcome::Skipped),
                    Status::Committed => return Ok(TxOutcome::Committed),
                    Status::Aborted => return Ok(TxOutcome::Aborted),
                    // Within its deadline: its coordinator is still at work.
                    Status::Preparing => return Ok(TxOutcome::Stuck),
                    // Held, and not past its holdUntil yet: its caller decides.
                    Status::Prepared => return Ok(TxOutcome::Skipped),
                    status => format!("still {status}: {}", unacknowledged.join("; ")),
                }
            }
            Err(e) => e.to_string(),
        };
        // Behind the others for a while, so that an entry this sweep cannot finish never hides the rest.
        let delay = self.limits.retry_ms.saturating_mul(1 << (attempts - 1).min(6));
        let sweep_at = self.coordinator.clock().now_ms() + delay;
        let postponed = self.coordinator.transactions().postpone(id, sweep_at, attempts, &failure).await;
        if let Err(e) = postponed {
            warn!(error = %e, "could not postpone the transaction");
        }
        warn!(attempts, error = %failure, retry_in_ms = delay, "could not finish the transaction");
        Err(failure)
    }

    async fn resolve_lock(&self, service: &str, table: &DataTable, key: &Item) -> Result<LockOutcome, String> {
        let item = table.get(key).await.map_err(|e| e.to_string())?;
        let now = self.coordinator.clock().now_ms();
        let Some(lock) =
            item.as_ref().and_then(Lock::of).filter(|l| now > crate::clock::resolvable_after(l.expires_at))
        else {
            return Ok(LockOutcome::Gone);
        };
        let owner = lock.transaction_id;
        let span = info_span!("resolve-lock", tx = %owner, service);
        async {
            let fate = owner_fate(self.coordinator.transactions(), &owner, now).await.map_err(|e| e.to_string())?;
            let transaction_id = owner.clone();
            let (request, outcome) = match fate {
                // (`Expired` is what a participant reads; `owner_fate` decides it.)
                OwnerFate::Undecided | OwnerFate::Expired => return Ok(LockOutcome::Waiting),
                // Its hold message was lost (or this lock is the first the sweeper meets): the hold it
                // missed, so that the lock leaves the head of the index until holdUntil.
                OwnerFate::Held(record) => {
                    let Some(entry) = record.participants.into_iter().find(|p| p.service == service) else {
                        return Err(format!("record {owner} lists no operations for {service}"));
                    };
                    let Some(hold_until) = record.hold_until else {
                        return Err(format!("record {owner} is held without holdUntil"));
                    };
                    let hold =
                        Hold { transaction_id, operations: entry.operations, lock_token: entry.lock_token, hold_until };
                    self.coordinator.call(service, &Message::Hold(hold)).await.map_err(|e| e.to_string())?;
                    return Ok(LockOutcome::Waiting);
                }
                OwnerFate::Commit(record) => {
                    let Some(entry) = record.participants.into_iter().find(|p| p.service == service) else {
                        return Err(format!("record {owner} lists no operations for {service}"));
                    };
                    // The token the vote reported: a stray lock of a late prepare is released, never applied.
                    let commit = Commit { transaction_id, operations: entry.operations, lock_token: entry.lock_token };
                    (Message::Commit(commit), LockOutcome::RolledForward)
                }
                // A lock of a finished commit came from a late duplicate prepare: release without applying.
                OwnerFate::Committed | OwnerFate::Abort => {
                    let key_only =
                        Operation::Check { key: crate::attr::item_to_json(key), version: None, exists: None };
                    (Message::Abort(Abort { transaction_id, operations: vec![key_only] }), LockOutcome::Released)
                }
            };
            let action = request.action();
            let response = self.coordinator.call(service, &request).await.map_err(|e| e.to_string())?;
            match response.status.as_deref() {
                Some(STATUS_COMMITTED | STATUS_NOT_PREPARED | STATUS_ABORTED) => {
                    warn!(action = action.as_str(), "resolved an expired lock");
                    Ok(outcome)
                }
                other => Err(format!("participant answered {other:?} to {}", action.as_str())),
            }
        }
        .instrument(span)
        .await
    }
}
