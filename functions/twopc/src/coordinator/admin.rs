//! The operators' commands (`/admin`): list the open transactions, show one with its chain and its
//! locks, the stuck view, and two actions over the phase engine, `retry` (drive a decided transaction now,
//! as the sweeper would) and `abort` (an undecided one, as a held one's caller aborts it). Only the
//! operators the access policy names may call them (`operators`, `operatorGroups`): anyone else gets a 403
//! before anything is read or written.
//!
//! The views only read: the stuck view never resolves a lock (lock resolution's `owner_fate` would write
//! ABORTED for an owner without a record). The actions are conditional writes that race the coordinator
//! and the sweeper safely: `abort` moves PREPARING or PREPARED to ABORTING only from the status it read,
//! so exactly one of it and the coordinator's decision wins, and it records no `retriedAs` and no
//! `refusedForContention`, so no attempt of the request follows it. Neither can commit an undecided
//! transaction or release a lock against its owner's record. Each action is idempotent, appends who,
//! when and what to the record's audit, and answers the record as it then is.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde_json::{Value, json};
use tracing::{info, warn};

use super::Coordinator;
use super::held::{HeldDecision, decide_on_chain};
use super::replay::{MAX_CHAIN_HOPS, own_attempt};
use super::reply::{DriveError, Reply, unavailable};
use crate::access::Caller;
use crate::model::{ErrorCode, Status};
use crate::participant::credits::Credit;
use crate::participant::store::{DataTable, Lock};
use crate::record::{AuditEntry, TransactionRecord};
use crate::store::{Item, StoreError};

/// The reason an operator's abort records.
pub const OPERATOR_ABORT_REASON: &str = "aborted by an operator";
/// A page of the open transactions holds at most this many (and this many by default).
pub const MAX_PAGE: usize = 100;
/// The stuck view's locks: those whose expiry passed at least this long ago, by default.
pub const DEFAULT_LOCK_AGE_MS: u64 = 60_000;
/// The stuck view reads at most this many expired locks from each shard of each table's locks index.
const STUCK_LOCKS_PER_SHARD: i32 = 25;

/// An operator's request, as the admin routes carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminRequest {
    /// `GET /admin/transactions`: open transactions in the order of `sweepAt`.
    List(ListQuery),
    /// `GET /admin/transactions/{id}`.
    Show(String),
    /// `GET /admin/stuck`.
    Stuck { lock_age_ms: u64 },
    /// `POST /admin/transactions/{id}/retry`.
    Retry(String),
    /// `POST /admin/transactions/{id}/abort`.
    Abort(String),
    /// `GET /admin/outcomes`: the request outcomes of late, read back from the outcome events.
    Outcomes(OutcomesQuery),
}

/// `GET /admin/outcomes`'s query: outcomes announced in the last `sinceMs` (default
/// [`DEFAULT_OUTCOMES_SINCE_MS`]), at most `limit` a page (default and most [`MAX_PAGE`]), `next` the token
/// the page before answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutcomesQuery {
    pub since_ms: u64,
    pub limit: usize,
    pub next: Option<String>,
}

/// `GET /admin/outcomes` looks this far back by default: an hour.
pub const DEFAULT_OUTCOMES_SINCE_MS: u64 = 60 * 60 * 1000;

/// A page of outcome events, oldest first: each `{outcomeId, type, time, transactionId,
/// firstTransactionId, status, reason?, participants}`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutcomePage {
    pub outcomes: Vec<Value>,
    pub next: Option<String>,
}

/// Where the outcome events can be read back: deployed, the CloudWatch Logs group a rule on the outcomes
/// bus writes the terminal events to (the coordinator function's `OUTCOME_LOG_GROUP`); the local stack, the same
/// API over `.local/events/`. Not a table: an outcome costs no DynamoDB write to be listed.
pub trait OutcomeHistory: Send + Sync {
    /// The terminal outcomes (COMMITTED, ABORTED) announced from `from_ms` on, at most `limit`, after
    /// the page `next` names.
    fn terminal_outcomes<'a>(
        &'a self,
        from_ms: u64,
        limit: usize,
        next: Option<&'a str>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<OutcomePage, HistoryError>> + Send + 'a>>;
}

/// Why the outcome history gave no page.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    /// The history refused the page token it was given (CloudWatch Logs' tokens expire after a day): the
    /// caller's to mend, a 400.
    #[error("the page token was refused: {0}")]
    PageRefused(String),
    /// The history could not be read: a 503, the request may be repeated.
    #[error("{0}")]
    Unavailable(String),
}

/// An outcome event (EventBridge's envelope) as `GET /admin/outcomes` lists it; None for another event.
pub fn listed_outcome(event: &Value) -> Option<Value> {
    let detail = event.get("detail")?;
    let status = detail.get("status")?.as_str()?;
    if !matches!(status, "COMMITTED" | "ABORTED") {
        return None;
    }
    let mut listed = json!({
        "outcomeId": detail.get("outcomeId")?,
        "type": event.get("detail-type")?,
        "time": event.get("time")?,
        "transactionId": detail.get("transactionId")?,
        "firstTransactionId": detail.get("firstTransactionId")?,
        "status": status,
        "participants": detail.get("participants").cloned().unwrap_or(json!([])),
    });
    if let Some(reason) = detail.get("reason").filter(|r| !r.is_null()) {
        listed["reason"] = reason.clone();
    }
    Some(listed)
}

/// `GET /admin/transactions`'s query: `status`, `minAgeMs`, `limit` and `next` (the page token the page
/// before answered).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    pub status: Option<Status>,
    pub min_age_ms: Option<u64>,
    pub limit: Option<usize>,
    pub next: Option<String>,
}

impl AdminRequest {
    /// The request a route and its query string make; `Err` says what is wrong with the query (400).
    pub fn parse(
        method: &str,
        segments: &[&str],
        query: &BTreeMap<String, String>,
    ) -> Option<Result<AdminRequest, String>> {
        let request = match (method, segments) {
            ("GET", ["admin", "transactions"]) => parse_list(query).map(AdminRequest::List),
            ("GET", ["admin", "transactions", id]) => Ok(AdminRequest::Show((*id).to_owned())),
            ("GET", ["admin", "stuck"]) => only(query, &["lockAgeMs"])
                .and_then(|()| number(query, "lockAgeMs"))
                .map(|age| AdminRequest::Stuck { lock_age_ms: age.unwrap_or(DEFAULT_LOCK_AGE_MS) }),
            ("POST", ["admin", "transactions", id, "retry"]) => Ok(AdminRequest::Retry((*id).to_owned())),
            ("POST", ["admin", "transactions", id, "abort"]) => Ok(AdminRequest::Abort((*id).to_owned())),
            ("GET", ["admin", "outcomes"]) => parse_outcomes(query).map(AdminRequest::Outcomes),
            _ => return None,
        };
        Some(request)
    }
}

/// The largest number a query takes: JSON's (and JavaScript's) largest exact integer, as openapi.yaml says.
const MAX_QUERY_NUMBER: u64 = (1 << 53) - 1;

fn number(query: &BTreeMap<String, String>, name: &str) -> Result<Option<u64>, String> {
    let Some(text) = query.get(name) else { return Ok(None) };
    match text.parse::<u64>() {
        Ok(value) if value <= MAX_QUERY_NUMBER => Ok(Some(value)),
        _ => Err(format!("{name} must be a whole number from 0 to {MAX_QUERY_NUMBER}, not {text:?}")),
    }
}

/// A query that names only `allowed` parameters; `Err` names the first other one.
fn only(query: &BTreeMap<String, String>, allowed: &[&str]) -> Result<(), String> {
    match query.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(unknown) => Err(format!("unknown query parameter {unknown}: this route takes {}", allowed.join(", "))),
        None => Ok(()),
    }
}

fn parse_outcomes(query: &BTreeMap<String, String>) -> Result<OutcomesQuery, String> {
    only(query, &["sinceMs", "limit", "next"])?;
    let limit = match number(query, "limit")? {
        Some(limit) if !(1..=MAX_PAGE as u64).contains(&limit) => {
            return Err(format!("limit must be 1 to {MAX_PAGE}, not {limit}"));
        }
        limit => limit.map_or(MAX_PAGE, |l| l as usize),
    };
    Ok(OutcomesQuery {
        since_ms: number(query, "sinceMs")?.unwrap_or(DEFAULT_OUTCOMES_SINCE_MS),
        limit,
        next: query.get("next").cloned(),
    })
}

fn parse_list(query: &BTreeMap<String, String>) -> Result<ListQuery, String> {
    only(query, &["status", "minAgeMs", "limit", "next"])?;
    let status = match query.get("status") {
        None => None,
        Some(text) => match Status::parse(text) {
            Some(status) if !status.is_terminal() => Some(status),
            _ => {
                return Err(format!(
                    "status must be one of PREPARING, PREPARED, COMMITTING, ABORTING (an open one), not {text:?}"
                ));
            }
        },
    };
    let limit = number(query, "limit")?.map(|l| l as usize);
    if limit.is_some_and(|l| l == 0 || l > MAX_PAGE) {
        return Err(format!("limit must be from 1 to {MAX_PAGE}"));
    }
    if let Some(next) = query.get("next")
        && decode_cursor(next).is_none()
    {
        return Err("next is not a page token this API answered".to_owned());
    }
    Ok(ListQuery { status, min_age_ms: number(query, "minAgeMs")?, limit, next: query.get("next").cloned() })
}

/// A page token: the last entry of the page, `<sweepAt>.<id>`.
fn encode_cursor(sweep_at: u64, id: &str) -> String {
    format!("{sweep_at}.{id}")
}

fn decode_cursor(token: &str) -> Option<(u64, &str)> {
    let (time, id) = token.split_once('.')?;
    let time = time.parse().ok()?;
    (!id.is_empty()).then_some((time, id))
}

/// Runs an operator's request: 403 for a caller the policy does not name as an operator, before
/// anything is read or written.
pub(super) async fn answer(c: &Coordinator, request: AdminRequest, caller: &Caller) -> Reply {
    if !caller.operator {
        return Reply::error(
            ErrorCode::Forbidden,
            "the admin API is for the operators the access policy names (operators: IAM role names or ARNs; \
             operatorGroups: JWT groups); being an admin does not make one",
        );
    }
    let done = match request {
        AdminRequest::List(query) => list(c, query).await,
        AdminRequest::Show(id) => show(c, &id).await,
        AdminRequest::Stuck { lock_age_ms } => stuck_view(c, lock_age_ms).await,
        AdminRequest::Retry(id) => retry(c, &id, caller).await,
        AdminRequest::Abort(id) => abort(c, &id, caller).await,
        AdminRequest::Outcomes(query) => return outcomes(c, query).await,
    };
    done.unwrap_or_else(|e| match e {
        DriveError::Store(e) | DriveError::Unrecorded { error: e, .. } => unavailable(&e, None),
        DriveError::Crashed(crash) => Reply::error(ErrorCode::Crashed, crash.to_string()),
    })
}

/// What an operator sees of a record: the answer's body, and what the sweeper and operators did to it.
pub fn admin_view(record: &TransactionRecord, now_ms: u64) -> Value {
    let mut body = Reply::for_record(record).body;
    // The status as recorded beside the answer's (which says ABORTED for ABORTING): an operator wants what
    // is left to do.
    body["recordedStatus"] = json!(record.status.as_str());
    body["ageMs"] = json!(now_ms.saturating_sub(record.age()));
    body["deadline"] = json!(record.deadline);
    if let Some(principal) = &record.principal {
        body["principal"] = json!(principal);
    }
    if let Some(sweep_at) = record.sweep_at {
        body["sweepAt"] = json!(sweep_at);
    }
    body["sweepAttempts"] = json!(record.sweep_attempts.unwrap_or(0));
    if let Some(error) = &record.sweep_error {
        body["lastError"] = json!(error);
    }
    body["attempt"] = json!(record.attempt_number());
    body["firstTransactionId"] = json!(record.first_id());
    if let Some(participants) = body["participants"].as_array_mut() {
        for (shown, entry) in participants.iter_mut().zip(&record.participants) {
            shown["operations"] = json!(entry.operations.len());
            shown["readOnly"] = json!(entry.read_only);
        }
    }
    body["audit"] = serde_json::to_value(&record.audit).expect("audit entries serialize");
    body
}

async fn list(c: &Coordinator, query: ListQuery) -> Result<Reply, DriveError> {
    let limit = query.limit.unwrap_or(MAX_PAGE);
    let now = c.engine.clock.now_ms();
    let after = query.next.as_deref().and_then(decode_cursor);
    let (entries, more) = c.engine.transactions.open_page(after, limit).await?;
    let ids: Vec<String> = entries.iter().map(|(_, id)| id.clone()).collect();
    let mut records: BTreeMap<String, TransactionRecord> =
        c.engine.transactions.get_many(&ids).await?.into_iter().map(|r| (r.transaction_id.clone(), r)).collect();
    // In the index's order; a record that ended since the index was read is no longer open.
    let transactions: Vec<Value> = ids
        .iter()
        .filter_map(|id| records.remove(id))
        .filter(|r| !r.status.is_terminal())
        .filter(|r| query.status.is_none_or(|s| r.status == s))
        .filter(|r| query.min_age_ms.is_none_or(|age| now.saturating_sub(r.age()) >= age))
        .map(|r| admin_view(&r, now))
        .collect();
    let next = entries.last().filter(|_| more).map(|(at, id)| encode_cursor(*at, id));
    Ok(Reply::ok(json!({"transactions": transactions, "next": next})))
}

async fn outcomes(c: &Coordinator, query: OutcomesQuery) -> Reply {
    let Some(history) = &c.outcome_history else {
        return Reply::error(
            ErrorCode::Unavailable,
            "no outcome history is configured: the coordinator reads the outcome events from the log group \
             OUTCOME_LOG_GROUP names",
        );
    };
    // A page token carries the window's start, so every page of a listing reads the same window (the
    // log's own token is for the query that made it).
    let (from, next) = match query.next.as_deref().map(|token| token.split_once('.')) {
        None => (c.engine.clock.now_ms().saturating_sub(query.since_ms), None),
        Some(Some((from, next))) if from.parse::<u64>().is_ok() && !next.is_empty() => {
            (from.parse::<u64>().expect("checked"), Some(next))
        }
        Some(_) => {
            return Reply::error(ErrorCode::InvalidRequest, "next: not a page token this route answered");
        }
    };
    match history.terminal_outcomes(from, query.limit, next).await {
        Ok(page) => {
            let next = page.next.map(|token| format!("{from}.{token}"));
            Reply::ok(json!({"outcomes": page.outcomes, "next": next, "fromMs": from}))
        }
        Err(HistoryError::PageRefused(message)) => Reply::error(
            ErrorCode::InvalidRequest,
            format!("next: the outcome history refused this page token ({message}); list again without it"),
        ),
        Err(HistoryError::Unavailable(message)) => {
            warn!(%message, "the outcome history could not be read");
            Reply::error(ErrorCode::Unavailable, format!("the outcome history could not be read: {message}"))
        }
    }
}

async fn show(c: &Coordinator, id: &str) -> Result<Reply, DriveError> {
    let Some(record) = c.engine.transactions.get(id).await? else {
        return Ok(Reply::error(ErrorCode::NotFound, format!("no transaction {id}")));
    };
    let now = c.engine.clock.now_ms();
    let mut body = admin_view(&record, now);
    body["chain"] = json!(chain(c, &record).await?);
    body["locks"] = json!(locks_of(c, &record).await?);
    Ok(Reply::ok(body))
}

/// The ids of the attempts of `record`'s request, first to last: from its first attempt, each successor
/// its coordinator named and that is the same request's.
async fn chain(c: &Coordinator, record: &TransactionRecord) -> Result<Vec<String>, StoreError> {
    let first = match record.first_id() {
        first if first == record.transaction_id => record.clone(),
        first => match c.engine.transactions.get(first).await? {
            Some(first) => first,
            None => record.clone(),
        },
    };
    let mut ids = vec![first.transaction_id.clone()];
    let mut at = first;
    while let Some(next) = at.successor().map(str::to_owned).filter(|_| ids.len() <= MAX_CHAIN_HOPS) {
        match c.engine.transactions.get(&next).await?.and_then(|attempt| own_attempt(&at, attempt)) {
            Some(attempt) => {
                ids.push(attempt.transaction_id.clone());
                at = attempt;
            }
            None => {
                ids.push(next);
                break;
            }
        }
    }
    Ok(ids)
}

/// The items the record's operations name, read from each participant's table, with the lock each
/// holds now (its owner may be another transaction); services whose table this deployment does not name
/// (`PARTICIPANT_TABLES`) are listed with no items.
async fn locks_of(c: &Coordinator, record: &TransactionRecord) -> Result<Vec<Value>, StoreError> {
    let mut shown = Vec::new();
    for entry in &record.participants {
        let Some(table) = c.data_tables.get(&entry.service) else {
            shown.push(json!({"service": entry.service, "table": null, "items": []}));
            continue;
        };
        let keys: Vec<Item> = entry.operations.iter().filter_map(|op| table.key(op.key()).ok()).collect();
        let items = if keys.is_empty() { Vec::new() } else { table.get_many(&keys).await? };
        let items: Vec<Value> = items
            .iter()
            .map(|item| {
                let key = crate::attr::item_to_json(&key_of(item));
                let lock = Lock::of(item);
                let locked_by_it = lock.as_ref().is_some_and(|l| l.transaction_id == record.transaction_id);
                // Issue 48: a credit of a keyed request is a pending entry beside the lock, not the lock.
                let credit = Credit::of(item, &record.transaction_id);
                let pending = crate::participant::credits::pending(item);
                json!({"key": key, "lock": lock.map(lock_json), "lockedByIt": locked_by_it,
                    "pendingCredit": credit.map(|c| json!({"delta": c.delta, "field": c.field, "expiresAt": c.expires_at})),
                    "pendingCredits": pending})
            })
            .collect();
        shown.push(json!({"service": entry.service, "table": table.name(), "vote": entry.vote, "items": items}));
    }
    Ok(shown)
}

fn key_of(item: &Item) -> Item {
    item.iter()
        .filter(|(name, _)| name.as_str() == crate::tables::item_attr::KEY)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn lock_json(lock: Lock) -> Value {
    json!({"transactionId": lock.transaction_id, "expiresAt": lock.expires_at, "startedAt": lock.started_at})
}

/// What the stuck view found: the open transactions past their due time, and the stale locks (each
/// already in its answer's shape).
pub(super) struct Stuck {
    pub transactions: Vec<TransactionRecord>,
    pub locks: Vec<Value>,
}

impl Stuck {
    /// The sweeper's gauge.
    pub fn count(&self) -> usize {
        self.transactions.len() + self.locks.len()
    }
}

/// Open transactions past their expiry (deadline, or `holdUntil`) or the sweeper's due time, and the
/// locks that expired at least `lock_age_ms` ago whose owner has no record or has ended: what the
/// sweeper has not cleared. Reads only.
pub(super) async fn stuck(c: &Coordinator, lock_age_ms: u64) -> Result<Stuck, StoreError> {
    let now = c.engine.clock.now_ms();
    let overdue = c.engine.transactions.open_before(now, STUCK_LOCKS_PER_SHARD).await?;
    let mut transactions = c.engine.transactions.get_many(&overdue).await?;
    transactions.retain(|r| !r.status.is_terminal());
    let mut locks = Vec::new();
    for (service, table) in c.data_tables.iter() {
        locks.extend(stale_locks(c, service, table, now.saturating_sub(lock_age_ms)).await?);
    }
    Ok(Stuck { transactions, locks })
}

async fn stuck_view(c: &Coordinator, lock_age_ms: u64) -> Result<Reply, DriveError> {
    let now = c.engine.clock.now_ms();
    let found = stuck(c, lock_age_ms).await?;
    let body = json!({
        "count": found.count(),
        "transactions": found.transactions.iter().map(|r| admin_view(r, now)).collect::<Vec<_>>(),
        "locks": found.locks,
        "lockAgeMs": lock_age_ms,
    });
    Ok(Reply::ok(body))
}

/// `table`'s locks that expired before `expired_before` and whose owner has no record, or an ended one.
async fn stale_locks(
    c: &Coordinator,
    service: &str,
    table: &DataTable,
    expired_before: u64,
) -> Result<Vec<Value>, StoreError> {
    let keys = table.expired_locks(expired_before, STUCK_LOCKS_PER_SHARD).await?;
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let items = table.get_many(&keys).await?;
    let locked: Vec<(Item, Lock)> = items.iter().filter_map(|item| Lock::of(item).map(|l| (key_of(item), l))).collect();
    let owners: Vec<String> =
        locked.iter().map(|(_, l)| l.transaction_id.clone()).collect::<BTreeSet<_>>().into_iter().collect();
    let records: BTreeMap<String, TransactionRecord> =
        c.engine.transactions.get_many(&owners).await?.into_iter().map(|r| (r.transaction_id.clone(), r)).collect();
    Ok(locked
        .into_iter()
        .filter_map(|(key, lock)| {
            let owner = records.get(&lock.transaction_id);
            let why = match owner.map(|r| r.status) {
                None => "its owner has no record",
                Some(status) if status.is_terminal() => "its owner ended",
                // An open owner is in the transactions' list, and its own recovery releases the lock.
                Some(_) => return None,
            };
            Some(json!({
                "service": service,
                "table": table.name(),
                "key": crate::attr::item_to_json(&key),
                "lock": lock_json(lock),
                "ownerStatus": owner.map(|r| r.status.as_str()),
                "why": why,
            }))
        })
        .collect())
}

/// Drives a decided transaction (COMMITTING, ABORTING) to its end now, as the sweeper would; one that
/// ended is answered as it is. An undecided one is not touched: 409 NOT_DECIDED.
async fn retry(c: &Coordinator, id: &str, caller: &Caller) -> Result<Reply, DriveError> {
    let Some(record) = c.engine.transactions.get(id).await? else {
        return Ok(Reply::error(ErrorCode::NotFound, format!("no transaction {id}")));
    };
    let record = match record.status {
        Status::Preparing | Status::Prepared => {
            let mut reply = Reply::error(
                ErrorCode::NotDecided,
                format!(
                    "transaction {id} is {} (not decided): only its coordinator, its caller (a held one) or an \
                     operator's abort (POST /admin/transactions/{id}/abort) decides it; retry drives a decided one",
                    record.status
                ),
            );
            reply.body["transactionId"] = json!(id);
            return Ok(reply);
        }
        Status::Committing | Status::Aborting => {
            let answer_by = Instant::now() + c.answer_budget;
            c.engine.drive_within(record, answer_by, false).await?
        }
        Status::Committed | Status::Aborted => record,
    };
    info!(tx = %id, status = %record.status, "operator retry");
    Ok(audited(c, record, caller, "retry").await)
}

/// Aborts an undecided transaction (PREPARING, or PREPARED held), on the attempt of its request that
/// lives, then drives the abort: 200 with the record. A transaction decided to commit is not undone: 409
/// with its body. Repeated: 200 again.
async fn abort(c: &Coordinator, id: &str, caller: &Caller) -> Result<Reply, DriveError> {
    let Some(record) = c.engine.transactions.get(id).await? else {
        return Ok(Reply::error(ErrorCode::NotFound, format!("no transaction {id}")));
    };
    let answer_by = Instant::now() + c.answer_budget;
    let record = match decide_on_chain(c, record, HeldDecision::Abort(OPERATOR_ABORT_REASON), answer_by).await? {
        Ok(record) => record,
        Err(reply) => return Ok(reply),
    };
    info!(tx = %record.transaction_id, status = %record.status, "operator abort");
    Ok(audited(c, record, caller, "abort").await)
}

/// The audit entry of an action on `record`, then the answer: 200 with the operator's view, or 409 when
/// the record is committed after an abort (the coordinator's decision won), or still undecided.
async fn audited(c: &Coordinator, record: TransactionRecord, caller: &Caller, action: &str) -> Reply {
    let now = c.engine.clock.now_ms();
    let by = caller.principal.as_deref().unwrap_or("(no identity)");
    let entry = AuditEntry::new(now, by, action, record.status.as_str());
    let mut shown = record.clone();
    match c.engine.transactions.append_audit(&record, entry).await {
        Ok(Some(audit)) => shown.audit = audit,
        Ok(None) => warn!(tx = %record.transaction_id, action, by, "the record was gone before its audit entry"),
        // The action is done and answered; its audit entry is what failed, and the log keeps it (the answer
        // shows the audit as stored, without it).
        Err(e) => warn!(tx = %record.transaction_id, action, by, error = %e, "the audit entry was not written"),
    }
    let status = match (action, record.status) {
        ("abort", Status::Committing | Status::Committed) => 409,
        (_, Status::Preparing | Status::Prepared) => return Reply::answering(&record),
        _ => 200,
    };
    Reply { status, body: admin_view(&shown, now), answered_on_decision: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn routes_and_queries_are_parsed_and_bad_ones_say_what_is_wrong() {
        let list =
            AdminRequest::parse("GET", &["admin", "transactions"], &query(&[("status", "PREPARED"), ("limit", "5")]));
        assert_eq!(
            list,
            Some(Ok(AdminRequest::List(ListQuery {
                status: Some(Status::Prepared),
                limit: Some(5),
                ..ListQuery::default()
            })))
        );
        let token = encode_cursor(17, "tx-a.b");
        assert_eq!(decode_cursor(&token), Some((17, "tx-a.b")));
        for (bad, says) in [
            (("status", "COMMITTED"), "status"),
            (("limit", "0"), "limit"),
            (("limit", "101"), "limit"),
            (("next", "x"), "next"),
            (("minAgeMs", "-1"), "minAgeMs"),
            (("minAgeMs", "9007199254740992"), "minAgeMs"),
            (("colour", "red"), "colour"),
        ] {
            let parsed = AdminRequest::parse("GET", &["admin", "transactions"], &query(&[bad])).unwrap();
            assert!(parsed.unwrap_err().contains(says), "{bad:?}");
        }
        assert_eq!(
            AdminRequest::parse("GET", &["admin", "stuck"], &query(&[])),
            Some(Ok(AdminRequest::Stuck { lock_age_ms: DEFAULT_LOCK_AGE_MS }))
        );
        assert_eq!(
            AdminRequest::parse("POST", &["admin", "transactions", "tx-1", "abort"], &query(&[])),
            Some(Ok(AdminRequest::Abort("tx-1".into())))
        );
        assert_eq!(AdminRequest::parse("DELETE", &["admin", "transactions", "tx-1"], &query(&[])), None);
        assert_eq!(
            AdminRequest::parse("GET", &["admin", "outcomes"], &query(&[("sinceMs", "60000")])),
            Some(Ok(AdminRequest::Outcomes(OutcomesQuery { since_ms: 60_000, limit: MAX_PAGE, next: None })))
        );
        for (bad, says) in [(("limit", "0"), "limit"), (("sinceMs", "-5"), "sinceMs"), (("status", "x"), "status")] {
            let parsed = AdminRequest::parse("GET", &["admin", "outcomes"], &query(&[bad])).unwrap();
            assert!(parsed.unwrap_err().contains(says), "{bad:?}");
        }
    }

    /// Only the terminal outcome events are listed, each with what an operator reads first.
    #[test]
    fn an_outcome_event_is_listed_only_when_terminal() {
        let event = |status: &str, reason: Value| {
            json!({"detail-type": "Transaction Aborted", "time": "2026-11-30T01:00:00Z", "detail": {
                "outcomeId": format!("tx-1:{status}"), "transactionId": "tx-1", "firstTransactionId": "tx-1",
                "status": status, "reason": reason, "participants": [{"service": "a", "vote": "REFUSED"}]}})
        };
        let listed = listed_outcome(&event("ABORTED", json!("refused by a"))).unwrap();
        assert_eq!(
            (listed["outcomeId"].as_str(), listed["reason"].as_str()),
            (Some("tx-1:ABORTED"), Some("refused by a"))
        );
        assert!(listed_outcome(&event("COMMITTED", Value::Null)).unwrap().get("reason").is_none());
        assert_eq!(listed_outcome(&event("PREPARED", Value::Null)), None, "a hold or an age alert is no outcome");
    }
}
