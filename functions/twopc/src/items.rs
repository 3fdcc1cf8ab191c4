//! A participant data table: the item model (`data`, `version`, `lastTx`, `lock`) and the writes that
//! prepare, commit and abort one item. The participant and lock resolution both use these, so an
//! item is rolled forward by exactly the code that commits it.

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update};
use bigdecimal::BigDecimal;
use serde_json::Value;

use crate::attr;
use crate::expr::{Expr, n, s};
use crate::model::{Key, Operation, RefusalCode};
use crate::store::{Item, StoreError, get_m, get_n, get_s, shard_of};
use crate::tables::item_attr as a;

/// The lock an item carries while prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    pub transaction_id: String,
    pub expires_at: u64,
}

impl Lock {
    pub fn of(item: &Item) -> Option<Lock> {
        let lock = get_m(item, a::LOCK)?;
        Some(Lock {
            transaction_id: get_s(lock, "transactionId")?.to_owned(),
            expires_at: get_n(lock, "expiresAt").and_then(|t| t.parse().ok()).unwrap_or(0),
        })
    }
}

/// Why a lock could not be taken, decided from the item as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockFailure {
    Refused {
        code: RefusalCode,
        reason: String,
    },
    /// Held by another transaction past its expiry: the owner must be resolved before the item is taken.
    Expired {
        owner: String,
    },
    /// Held by another transaction that is still within its deadline.
    Held {
        owner: String,
        expires_at: u64,
        reason: String,
    },
    /// The item no longer shows why the write failed (it changed since): try again.
    Unexplained,
}

/// What a commit of one item found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    Applied,
    /// `lastTx` names the transaction: a re-delivered commit.
    AlreadyCommitted,
    /// Neither a lock of the transaction nor `lastTx` on the item.
    NotPrepared {
        detail: String,
    },
}

#[derive(Debug, Clone)]
pub struct DataTable {
    client: Client,
    name: String,
}

const PREPARED: &str = "PREPARED";

impl DataTable {
    pub fn new(client: Client, name: impl Into<String>) -> DataTable {
        DataTable { client, name: name.into() }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The operation's key as the table's key, or why it does not fit the table.
    pub fn key(&self, key: &Key) -> Result<Item, String> {
        match key.get(a::KEY) {
            Some(Value::String(_)) if key.len() == 1 => Ok(attr::to_item(key)),
            _ => Err(format!(
                "key {} does not fit table {}: its key is one string attribute \"{}\"",
                Value::Object(key.clone()),
                self.name,
                a::KEY
            )),
        }
    }

    pub async fn get(&self, key: &Item) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.name)
            .set_key(Some(key.clone()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::new("GetItem", &self.name, e))?;
        Ok(out.item)
    }

    /// The write that locks one item for `tx` if the operation's precondition holds. Re-delivery of the
    /// same prepare passes (the lock is already ours); a prepare after this transaction committed the
    /// item does not (`lastTx`).
    fn lock_update(&self, tx: &str, op: &Operation, key: Item, expires_at: u64) -> Update {
        let mut e = Expr::new();
        let lock = e.name(a::LOCK);
        let lock_tx = e.path(&[a::LOCK, "transactionId"]);
        let last_tx = e.name(a::LAST_TX);
        let lock_value = e.value(AttributeValue::M(HashMap::from([
            ("transactionId".to_owned(), s(tx)),
            ("status".to_owned(), s(PREPARED)),
            ("expiresAt".to_owned(), n(expires_at)),
        ])));
        let shard = e.name(a::LOCK_SHARD);
        let shard_value = e.value(s(shard_of(tx, "lock")));
        let expiry = e.name(a::LOCK_EXPIRES_AT);
        let expiry_value = e.value(n(expires_at));
        let tx_value = e.value(s(tx));
        let update = format!("SET {lock} = {lock_value}, {shard} = {shard_value}, {expiry} = {expiry_value}");
        let mut condition = format!(
            "(attribute_not_exists({lock}) OR {lock_tx} = {tx_value}) AND (attribute_not_exists({last_tx}) OR {last_tx} <> {tx_value})"
        );
        condition += &guard(&mut e, op);
        Update::builder()
            .table_name(&self.name)
            .set_key(Some(key))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(e.names())
            .set_expression_attribute_values(e.values())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("table, key and expression are set")
    }

    /// Locks every item of `ops` for `tx`, all or none. `Err(index, item)` names the item whose
    /// condition failed, with the item as it was when the endpoint returns it.
    pub async fn lock_all(
        &self,
        tx: &str,
        ops: &[(Operation, Item)],
        expires_at: u64,
    ) -> Result<LockAttempt, StoreError> {
        if let [(op, key)] = ops {
            let u = self.lock_update(tx, op, key.clone(), expires_at);
            let result = self
                .client
                .update_item()
                .table_name(u.table_name())
                .set_key(Some(u.key().clone()))
                .update_expression(u.update_expression())
                .set_condition_expression(u.condition_expression().map(str::to_owned))
                .set_expression_attribute_names(u.expression_attribute_names().cloned())
                .set_expression_attribute_values(u.expression_attribute_values().cloned())
                .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew)
                .send()
                .await;
            return match result {
                Ok(out) => Ok(LockAttempt::Locked(out.attributes.into_iter().collect())),
                Err(err) => match err.as_service_error() {
                    Some(e) if e.is_conditional_check_failed_exception() => {
                        let item = match e {
                            aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) => {
                                c.item().cloned()
                            }
                            _ => None,
                        };
                        Ok(LockAttempt::ConditionFailed { index: 0, item })
                    }
                    Some(e) if e.is_transaction_conflict_exception() => Ok(LockAttempt::Contention),
                    _ => Err(StoreError::new("UpdateItem", &self.name, err)),
                },
            };
        }
        let items: Vec<TransactWriteItem> = ops
            .iter()
            .map(|(op, key)| {
                TransactWriteItem::builder().update(self.lock_update(tx, op, key.clone(), expires_at)).build()
            })
            .collect();
        let result = self.client.transact_write_items().set_transact_items(Some(items)).send().await;
        match result {
            Ok(_) => Ok(LockAttempt::Locked(vec![])),
            Err(err) => match err.as_service_error() {
                Some(aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(c)) => {
                    match Cancellation::of(c.cancellation_reasons()) {
                        Cancellation::ConditionFailed { index, item } => Ok(LockAttempt::ConditionFailed { index, item }),
                        Cancellation::Conflict => Ok(LockAttempt::Contention),
                        Cancellation::Invalid(_) | Cancellation::Other => {
                            Err(StoreError::new("TransactWriteItems", &self.name, err))
                        }
                    }
                }
                Some(e) if e.is_transaction_in_progress_exception() => Ok(LockAttempt::Contention),
                _ => Err(StoreError::new("TransactWriteItems", &self.name, err)),
            },
        }
    }

    /// Keys of items whose lock expired before `now_ms`, through the sparse locks index (no scan): at most
    /// `limit` from each shard.
    pub async fn expired_locks(&self, now_ms: u64, limit: i32) -> Result<Vec<Item>, StoreError> {
        let entries = crate::store::page_shards(limit, |shard, limit, start| {
            let mut e = Expr::new();
            let condition = format!(
                "{} = {} AND {} < {}",
                e.name(a::LOCK_SHARD),
                e.value(s(format!("lock#{shard}"))),
                e.name(a::LOCK_EXPIRES_AT),
                e.value(n(now_ms))
            );
            let query = self
                .client
                .query()
                .table_name(&self.name)
                .index_name(crate::tables::LOCKS_INDEX)
                .key_condition_expression(condition)
                .set_expression_attribute_names(e.names())
                .set_expression_attribute_values(e.values())
                .limit(limit)
                .set_exclusive_start_key(start);
            async move {
                let out = query.send().await.map_err(|err| StoreError::new("Query", &self.name, err))?;
                Ok((out.items.unwrap_or_default(), out.last_evaluated_key))
            }
        })
        .await?;
        Ok(entries
            .iter()
            .filter_map(|item| item.get(a::KEY).map(|k| Item::from([(a::KEY.to_owned(), k.clone())])))
            .collect())
    }

    /// Reads several items consistently in one request.
    pub async fn get_many(&self, keys: &[Item]) -> Result<Vec<Item>, StoreError> {
        let mut found = Vec::with_capacity(keys.len());
        let mut pending = Some(
            aws_sdk_dynamodb::types::KeysAndAttributes::builder()
                .set_keys(Some(keys.to_vec()))
                .consistent_read(true)
                .build()
                .expect("keys are set"),
        );
        while let Some(request) = pending.take() {
            let out = self
                .client
                .batch_get_item()
                .request_items(&self.name, request)
                .send()
                .await
                .map_err(|e| StoreError::new("BatchGetItem", &self.name, e))?;
            if let Some(items) = out.responses.and_then(|mut r| r.remove(&self.name)) {
                found.extend(items);
            }
            pending = out.unprocessed_keys.and_then(|mut u| u.remove(&self.name)).filter(|k| !k.keys().is_empty());
        }
        Ok(found)
    }

    /// The one-phase commit of a transaction with a single writing participant: every operation applied
    /// under its guard, and the transaction record created as COMMITTED, in one TransactWriteItems. It
    /// all happens or none of it does, so there is never a lock to resolve nor an open record to sweep;
    /// and a record written first by anyone else (an abort after a lost reply, a duplicate) cancels it.
    pub async fn apply_one_phase(
        &self,
        tx: &str,
        ops: &[(Operation, Item)],
        record_table: &str,
        record: Item,
    ) -> Result<OnePhase, StoreError> {
        let mut items = Vec::with_capacity(ops.len() + 1);
        for (op, key) in ops {
            let mut e = Expr::new();
            let lock = e.name(a::LOCK);
            let condition = format!("attribute_not_exists({lock}){}", guard(&mut e, op));
            let item = match op {
                Operation::Delete { .. } => TransactWriteItem::builder().delete(
                    aws_sdk_dynamodb::types::Delete::builder()
                        .table_name(&self.name)
                        .set_key(Some(key.clone()))
                        .condition_expression(condition)
                        .set_expression_attribute_names(e.names())
                        .set_expression_attribute_values(e.values())
                        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                        .build()
                        .expect("table, key and condition are set"),
                ),
                Operation::Check { .. } => TransactWriteItem::builder().condition_check(
                    aws_sdk_dynamodb::types::ConditionCheck::builder()
                        .table_name(&self.name)
                        .set_key(Some(key.clone()))
                        .condition_expression(condition)
                        .set_expression_attribute_names(e.names())
                        .set_expression_attribute_values(e.values())
                        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                        .build()
                        .expect("table, key and condition are set"),
                ),
                _ => {
                    let sets = apply(&mut e, op, tx);
                    TransactWriteItem::builder().update(
                        Update::builder()
                            .table_name(&self.name)
                            .set_key(Some(key.clone()))
                            .update_expression(format!("SET {sets}"))
                            .condition_expression(condition)
                            .set_expression_attribute_names(e.names())
                            .set_expression_attribute_values(e.values())
                            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                            .build()
                            .expect("table, key and expression are set"),
                    )
                }
            };
            items.push(item.build());
        }
        let mut e = Expr::new();
        let id = e.name(crate::tables::tx_attr::ID);
        items.push(
            TransactWriteItem::builder()
                .put(
                    aws_sdk_dynamodb::types::Put::builder()
                        .table_name(record_table)
                        .set_item(Some(record))
                        .condition_expression(format!("attribute_not_exists({id})"))
                        .set_expression_attribute_names(e.names())
                        .build()
                        .expect("table and item are set"),
                )
                .build(),
        );
        let result = self.client.transact_write_items().set_transact_items(Some(items)).send().await;
        match result {
            Ok(_) => Ok(OnePhase::Committed),
            Err(err) => match err.as_service_error() {
                Some(aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(c)) => {
                    match Cancellation::of(c.cancellation_reasons()) {
                        Cancellation::ConditionFailed { index, .. } if index == ops.len() => Ok(OnePhase::RecordExists),
                        Cancellation::ConditionFailed { index, item } => Ok(OnePhase::ConditionFailed { index, item }),
                        // A result DynamoDB cannot store shows as a validation failure of that item.
                        Cancellation::Invalid(message) => Ok(OnePhase::Unstorable(message)),
                        Cancellation::Conflict => Ok(OnePhase::Contention),
                        Cancellation::Other => Err(StoreError::new("TransactWriteItems", &self.name, err)),
                    }
                }
                Some(e) if e.is_transaction_in_progress_exception() => Ok(OnePhase::Contention),
                Some(e) if aws_sdk_dynamodb::error::ProvideErrorMetadata::code(e) == Some("ValidationException") => {
                    let message = aws_sdk_dynamodb::error::ProvideErrorMetadata::message(e).unwrap_or("invalid value");
                    Ok(OnePhase::Unstorable(message.to_owned()))
                }
                _ => Err(StoreError::new("TransactWriteItems", &self.name, err)),
            },
        }
    }

    /// Applies a prepared operation and releases the lock in one conditional write.
    pub async fn commit_item(&self, tx: &str, op: &Operation, key: &Item) -> Result<CommitOutcome, StoreError> {
        let mut e = Expr::new();
        let lock_tx = e.path(&[a::LOCK, "transactionId"]);
        let tx_value = e.value(s(tx));
        let last_tx = e.name(a::LAST_TX);
        // A lock of this transaction on an item this transaction already committed can only come from a
        // late duplicate prepare: applying the operation again would apply it twice.
        let lock_held =
            format!("{lock_tx} = {tx_value} AND (attribute_not_exists({last_tx}) OR {last_tx} <> {tx_value})");
        let result: Result<(), Option<Item>> = match op {
            Operation::Delete { .. } => {
                let out = self
                    .client
                    .delete_item()
                    .table_name(&self.name)
                    .set_key(Some(key.clone()))
                    .condition_expression(lock_held)
                    .set_expression_attribute_names(e.names())
                    .set_expression_attribute_values(e.values())
                    .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                    .send()
                    .await;
                match out {
                    Ok(_) => return Ok(CommitOutcome::Applied),
                    Err(err) => match err.as_service_error() {
                        Some(
                            aws_sdk_dynamodb::operation::delete_item::DeleteItemError::ConditionalCheckFailedException(
                                c,
                            ),
                        ) => Err(c.item().cloned()),
                        _ => return Err(StoreError::new("DeleteItem", &self.name, err)),
                    },
                }
            }
            Operation::Check { .. } => return self.release(tx, key, "commit").await.map(|_| CommitOutcome::Applied),
            _ => {
                let release =
                    format!("REMOVE {}, {}, {}", e.name(a::LOCK), e.name(a::LOCK_SHARD), e.name(a::LOCK_EXPIRES_AT));
                let sets = apply(&mut e, op, tx);
                let out = self
                    .client
                    .update_item()
                    .table_name(&self.name)
                    .set_key(Some(key.clone()))
                    .update_expression(format!("SET {sets} {release}"))
                    .condition_expression(lock_held)
                    .set_expression_attribute_names(e.names())
                    .set_expression_attribute_values(e.values())
                    .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                    .send()
                    .await;
                match out {
                    Ok(_) => return Ok(CommitOutcome::Applied),
                    Err(err) => match err.as_service_error() {
                        Some(
                            aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(
                                c,
                            ),
                        ) => Err(c.item().cloned()),
                        _ => return Err(StoreError::new("UpdateItem", &self.name, err)),
                    },
                }
            }
        };
        let Err(returned) = result else { unreachable!("successes returned above") };
        // The endpoint may not return the item (DynamoDB Local before 2.x did not): read it.
        let item = match returned {
            Some(item) => Some(item),
            None => self.get(key).await?,
        };
        Ok(commit_outcome(tx, item.as_ref()))
    }

    /// Releases `tx`'s lock on the item, if it holds one: a placeholder made by the prepare goes away
    /// with it. Returns whether a lock was released.
    pub async fn release(&self, tx: &str, key: &Item, why: &'static str) -> Result<bool, StoreError> {
        let mut e = Expr::new();
        let lock_tx = e.path(&[a::LOCK, "transactionId"]);
        let tx_value = e.value(s(tx));
        let version = e.name(a::VERSION);
        let data = e.name(a::DATA);
        let release = format!("REMOVE {}, {}, {}", e.name(a::LOCK), e.name(a::LOCK_SHARD), e.name(a::LOCK_EXPIRES_AT));
        let out = self
            .client
            .update_item()
            .table_name(&self.name)
            .set_key(Some(key.clone()))
            .update_expression(release)
            .condition_expression(format!(
                "{lock_tx} = {tx_value} AND (attribute_exists({version}) OR attribute_exists({data}))"
            ))
            .set_expression_attribute_names(e.names())
            .set_expression_attribute_values(e.values())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let returned = match out {
            Ok(_) => return Ok(true),
            Err(err) => match err.as_service_error() {
                Some(aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c)) => {
                    c.item().cloned()
                }
                _ => return Err(StoreError::new("UpdateItem", &self.name, err)),
            },
        };
        let item = match returned {
            Some(item) => Some(item),
            None => self.get(key).await?,
        };
        let Some(item) = item else { return Ok(false) };
        if Lock::of(&item).is_none_or(|l| l.transaction_id != tx) {
            return Ok(false);
        }
        // Our lock on a placeholder: the key did not exist before this transaction, so neither does it after.
        let mut e = Expr::new();
        let lock_tx = e.path(&[a::LOCK, "transactionId"]);
        let tx_value = e.value(s(tx));
        let data = e.name(a::DATA);
        let out = self
            .client
            .delete_item()
            .table_name(&self.name)
            .set_key(Some(key.clone()))
            .condition_expression(format!("{lock_tx} = {tx_value} AND attribute_not_exists({data})"))
            .set_expression_attribute_names(e.names())
            .set_expression_attribute_values(e.values())
            .send()
            .await;
        match out {
            Ok(_) => Ok(true),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) => {
                tracing::debug!(why, "placeholder changed while releasing; nothing left to release");
                Ok(false)
            }
            Err(err) => Err(StoreError::new("DeleteItem", &self.name, err)),
        }
    }
}

#[derive(Debug)]
pub enum OnePhase {
    Committed,
    /// The transaction's record exists already: a duplicate request, or an abort written after a lost reply.
    RecordExists,
    ConditionFailed {
        index: usize,
        item: Option<Item>,
    },
    Contention,
    /// DynamoDB refused a value (an `add` whose result has more than 38 digits).
    Unstorable(String),
}

#[derive(Debug)]
pub enum LockAttempt {
    /// Locked; with the items as locked when the write returned them (a single item).
    Locked(Vec<Item>),
    ConditionFailed {
        index: usize,
        item: Option<Item>,
    },
    Contention,
}

fn commit_outcome(tx: &str, item: Option<&Item>) -> CommitOutcome {
    let Some(item) = item else {
        return CommitOutcome::NotPrepared { detail: "the item does not exist".to_owned() };
    };
    if get_s(item, a::LAST_TX) == Some(tx) {
        return CommitOutcome::AlreadyCommitted;
    }
    let holder = Lock::of(item).map(|l| l.transaction_id);
    CommitOutcome::NotPrepared {
        detail: format!(
            "the item holds {} and its lastTx is {}",
            holder.map_or("no lock".to_owned(), |t| format!("a lock of {t}")),
            get_s(item, a::LAST_TX).unwrap_or("unset")
        ),
    }
}

/// Explains a failed lock from the item as it was (`None`: no such item). Which lock is in the way,
/// and which guard failed, with the numbers.
pub fn classify_lock_failure(tx: &str, op: &Operation, item: Option<&Item>, now_ms: u64) -> LockFailure {
    let key = op.key_text();
    let refuse = |code, reason: String| LockFailure::Refused { code, reason };
    if let Some(item) = item
        && let Some(lock) = Lock::of(item)
        && lock.transaction_id != tx
    {
        if lock.expires_at <= now_ms {
            return LockFailure::Expired { owner: lock.transaction_id };
        }
        return LockFailure::Held {
            reason: format!("entity {key} is locked by transaction {}", lock.transaction_id),
            owner: lock.transaction_id,
            expires_at: lock.expires_at,
        };
    }
    if let Some(item) = item
        && get_s(item, a::LAST_TX) == Some(tx)
    {
        return refuse(RefusalCode::Conflict, format!("transaction {tx} has already committed entity {key}"));
    }
    let data = item.and_then(|i| get_m(i, a::DATA));
    match op {
        Operation::Put { if_not_exists: true, .. } if data.is_some() => {
            refuse(RefusalCode::ConditionFailed, format!("entity {key} already exists (ifNotExists)"))
        }
        Operation::Set { .. } | Operation::Delete { .. } | Operation::Add { .. } if data.is_none() => {
            refuse(RefusalCode::NotFound, format!("entity {key} does not exist"))
        }
        Operation::Add { field, delta, min, max, .. } => {
            let Some(value) = data.and_then(|d| d.get(field.as_str())) else {
                return refuse(
                    RefusalCode::ConditionFailed,
                    format!("entity {key} has no field \"{field}\" to add to"),
                );
            };
            let Some(current) = value.as_n().ok().and_then(|t| t.parse::<BigDecimal>().ok()) else {
                return refuse(
                    RefusalCode::ConditionFailed,
                    format!("field \"{field}\" of entity {key} is not a number"),
                );
            };
            let result = &current + delta.value();
            let shown = format!("{field} {} + {delta} = {}", plain(&current), plain(&result));
            if let Some(min) = min
                && &result < min.value()
            {
                return refuse(
                    RefusalCode::ConditionFailed,
                    format!("{shown} is below the minimum {min} on entity {key}"),
                );
            }
            if let Some(max) = max
                && &result > max.value()
            {
                return refuse(
                    RefusalCode::ConditionFailed,
                    format!("{shown} is above the maximum {max} on entity {key}"),
                );
            }
            LockFailure::Unexplained
        }
        Operation::Check { version, exists, .. } => {
            if *exists == Some(true) && data.is_none() {
                return refuse(RefusalCode::NotFound, format!("entity {key} does not exist"));
            }
            if *exists == Some(false) && data.is_some() {
                return refuse(RefusalCode::ConditionFailed, format!("entity {key} exists"));
            }
            if let Some(expected) = version {
                let actual = item.and_then(|i| get_n(i, a::VERSION)).unwrap_or("none");
                if actual.parse::<BigDecimal>().ok().as_ref() != Some(expected.value()) {
                    return refuse(
                        RefusalCode::ConditionFailed,
                        format!("entity {key} is at version {actual}, expected {expected}"),
                    );
                }
            }
            LockFailure::Unexplained
        }
        _ => LockFailure::Unexplained,
    }
}

/// Evaluates a read-only `check` against the item as read: the same guards as its lock condition.
/// Another transaction's lock counts against the check (classified first, as for a lock): a value under
/// it may be about to change, and reading past it could order this transaction inconsistently with
/// the lock holder.
pub fn check_holds(tx: &str, op: &Operation, item: Option<&Item>, now_ms: u64) -> Result<(), LockFailure> {
    match classify_lock_failure(tx, op, item, now_ms) {
        LockFailure::Unexplained => Ok(()),
        failure => Err(failure),
    }
}

fn plain(value: &BigDecimal) -> String {
    value.normalized().to_plain_string()
}

/// Why an `add` that passed its guards still cannot be committed: its result is not a number DynamoDB
/// can store (more than 38 significant digits, or out of range). Checked at prepare, so that commit,
/// which cannot refuse, never meets it.
pub fn unrepresentable_result(op: &Operation, locked: &Item) -> Option<String> {
    let Operation::Add { field, delta, .. } = op else { return None };
    let current = get_m(locked, a::DATA)?.get(field.as_str())?.as_n().ok()?.parse::<BigDecimal>().ok()?;
    let result = &current + delta.value();
    crate::decimal::Decimal::from_big(result.clone())
        .err()
        .map(|why| format!("{field} {} + {delta} = {} {why}", plain(&current), plain(&result)))
}

/// The item of `key` among `items`.
pub fn find<'a>(items: &'a [Item], key: &Item) -> Option<&'a Item> {
    items.iter().find(|item| key.iter().all(|(name, value)| item.get(name) == Some(value)))
}

/// The precondition an operation's vote stands on, as a condition expression (starting with " AND ").
fn guard(e: &mut Expr, op: &Operation) -> String {
    // Names are registered only where the expression uses them: DynamoDB refuses unused ones.
    match op {
        Operation::Put { if_not_exists: true, .. } => format!(" AND attribute_not_exists({})", e.name(a::DATA)),
        Operation::Put { .. } => String::new(),
        Operation::Set { .. } | Operation::Delete { .. } => format!(" AND attribute_exists({})", e.name(a::DATA)),
        Operation::Add { field, delta, min, max, .. } => {
            let data = e.name(a::DATA);
            let path = e.path(&[a::DATA, field]);
            let number_type = e.value(s("N"));
            let mut condition = format!(" AND attribute_exists({data}) AND attribute_type({path}, {number_type})");
            if let Some(min) = min {
                let lowest = e.value(n(plain(&(min.value() - delta.value()))));
                condition += &format!(" AND {path} >= {lowest}");
            }
            if let Some(max) = max {
                let highest = e.value(n(plain(&(max.value() - delta.value()))));
                condition += &format!(" AND {path} <= {highest}");
            }
            condition
        }
        Operation::Check { version, exists, .. } => {
            let mut condition = String::new();
            if let Some(version) = version {
                let version_name = e.name(a::VERSION);
                let expected = e.value(n(version));
                condition += &format!(" AND {version_name} = {expected}");
            }
            match exists {
                Some(true) => condition += &format!(" AND attribute_exists({})", e.name(a::DATA)),
                Some(false) => condition += &format!(" AND attribute_not_exists({})", e.name(a::DATA)),
                None => {}
            }
            condition
        }
    }
}

/// The SET clauses (without "SET") that apply a writing operation as a commit of `tx`.
fn apply(e: &mut Expr, op: &Operation, tx: &str) -> String {
    let version = e.name(a::VERSION);
    let last_tx = e.name(a::LAST_TX);
    let data = e.name(a::DATA);
    let zero = e.value(n(0));
    let one = e.value(n(1));
    let tx_value = e.value(s(tx));
    let mut sets =
        vec![format!("{version} = if_not_exists({version}, {zero}) + {one}"), format!("{last_tx} = {tx_value}")];
    match op {
        Operation::Put { data: value, .. } => {
            let value = e.value(AttributeValue::M(attr::to_item(value)));
            sets.push(format!("{data} = {value}"));
        }
        Operation::Set { set, .. } => {
            for (field, value) in set {
                let path = e.path(&[a::DATA, field]);
                let value = e.value(attr::to_attribute(value));
                sets.push(format!("{path} = {value}"));
            }
        }
        Operation::Add { field, delta, .. } => {
            let path = e.path(&[a::DATA, field]);
            let delta = e.value(n(delta));
            sets.push(format!("{path} = {path} + {delta}"));
        }
        Operation::Delete { .. } | Operation::Check { .. } => unreachable!("delete and check do not update"),
    }
    sets.join(", ")
}

/// What a canceled `TransactWriteItems` says about itself, from its per-item reasons.
enum Cancellation {
    /// The first item whose condition failed, as it was.
    ConditionFailed { index: usize, item: Option<Item> },
    /// Another transactional write touched one of the items: worth trying again.
    Conflict,
    /// An item DynamoDB refused to store.
    Invalid(String),
    /// Anything else (throttling, capacity): an infrastructure failure, never a vote.
    Other,
}

impl Cancellation {
    fn of(reasons: &[aws_sdk_dynamodb::types::CancellationReason]) -> Cancellation {
        let with = |code: &str| reasons.iter().position(|r| r.code() == Some(code));
        if let Some(index) = with("ConditionalCheckFailed") {
            Cancellation::ConditionFailed { index, item: reasons[index].item().cloned() }
        } else if let Some(index) = with("ValidationError") {
            Cancellation::Invalid(reasons[index].message().unwrap_or("invalid value").to_owned())
        } else if with("TransactionConflict").is_some() {
            Cancellation::Conflict
        } else {
            Cancellation::Other
        }
    }
}
