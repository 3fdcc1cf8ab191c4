//! The transactions table: the record of each transaction and its status, every change of status a
//! conditional write on the status before it, so status only moves forward and exactly one decision wins.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::attr;
use crate::expr::{Expr, n, s};
use crate::model::{RefusalCode, Status, Vote};
use crate::store::{AttemptWatch, Item, StoreError, shard_of};
use crate::tables::tx_attr as a;

/// Terminal records of requests without an `Idempotency-Key` stay readable (`GET /transactions/{id}`) this
/// long, then TTL removes them. A keyed record is kept: it is what stops its key from ever running again.
pub const RETENTION_SECONDS: u64 = 7 * 24 * 3600;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionRecord {
    pub transaction_id: String,
    pub status: Status,
    pub participants: Vec<ParticipantEntry>,
    pub created_at: u64,
    pub updated_at: u64,
    pub deadline: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_shard: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
}

/// One service's part, stored with its operations so that recovery can finish the transaction from
/// the record alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParticipantEntry {
    pub service: String,
    pub operations: Vec<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vote: Option<Vote>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<RefusalCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Locked nothing at prepare: takes no part in commit or abort.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// The token of the locks its PREPARED vote reported: commit and roll-forward apply only those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_token: Option<String>,
}

impl TransactionRecord {
    /// This record as a terminal one created at `now_ms`: out of the open-transactions index, with its
    /// retention clock started (what [`TransactionStore::transition`] writes for a terminal status).
    pub fn ended(mut self, status: Status, now_ms: u64) -> TransactionRecord {
        debug_assert!(status.is_terminal());
        self.status = status;
        self.updated_at = now_ms;
        self.open_shard = None;
        self.sweep_at = None;
        self.expire_at = (!self.is_keyed()).then_some(now_ms / 1000 + RETENTION_SECONDS);
        self
    }

    /// Whether an `Idempotency-Key` named this transaction (its record is then kept for ever).
    pub fn is_keyed(&self) -> bool {
        self.request_hash.is_some()
    }

    /// This record as open: in the open-transactions index, first due for the sweeper at its deadline.
    pub fn opened(mut self) -> TransactionRecord {
        self.open_shard = Some(open_shard(&self.transaction_id));
        self.sweep_at = Some(self.deadline);
        self
    }

    pub fn to_item(&self) -> Item {
        let Value::Object(map) = serde_json::to_value(self).expect("records serialize") else {
            unreachable!("a struct serializes to an object")
        };
        attr::to_item(&map)
    }

    pub fn from_item(item: &Item) -> Result<TransactionRecord, StoreError> {
        serde_json::from_value(Value::Object(attr::item_to_json(item)))
            .map_err(|e| StoreError::internal("decode", "", format!("transaction record is malformed: {e}")))
    }

    /// The contract's answer body.
    pub fn to_response(&self) -> Value {
        let participants: Vec<Value> = self
            .participants
            .iter()
            .map(|p| {
                let mut entry = serde_json::Map::new();
                entry.insert("service".into(), Value::String(p.service.clone()));
                if let Some(vote) = p.vote {
                    entry.insert("vote".into(), serde_json::to_value(vote).expect("votes serialize"));
                }
                if let Some(reason) = &p.reason {
                    entry.insert("reason".into(), Value::String(reason.clone()));
                }
                if let Some(code) = p.code {
                    entry.insert("code".into(), serde_json::to_value(code).expect("codes serialize"));
                }
                Value::Object(entry)
            })
            .collect();
        let mut body = serde_json::Map::new();
        body.insert("transactionId".into(), Value::String(self.transaction_id.clone()));
        body.insert("status".into(), Value::String(self.status.as_str().into()));
        if let Some(reason) = &self.reason {
            body.insert("reason".into(), Value::String(reason.clone()));
        }
        body.insert("participants".into(), Value::Array(participants));
        body.insert("createdAt".into(), Value::from(self.created_at));
        body.insert("updatedAt".into(), Value::from(self.updated_at));
        Value::Object(body)
    }
}

/// What a conditional status change found.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// This write made the change.
    Done(TransactionRecord),
    /// The record was not in the expected status: here it is as it is (None: there is no record).
    Lost(Option<TransactionRecord>),
}

#[derive(Debug, Clone)]
pub struct TransactionStore {
    client: Client,
    table: String,
}

impl TransactionStore {
    pub fn new(client: Client, table: impl Into<String>) -> TransactionStore {
        TransactionStore { client, table: table.into() }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    fn key(id: &str) -> Item {
        Item::from([(a::ID.to_owned(), s(id))])
    }

    /// Writes a new record unless one with its id exists; returns the existing one then.
    pub async fn create(&self, record: &TransactionRecord) -> Result<Option<TransactionRecord>, StoreError> {
        let mut e = Expr::new();
        let id = e.name(a::ID);
        let watch = AttemptWatch::default();
        let out = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(record.to_item()))
            .condition_expression(format!("attribute_not_exists({id})"))
            .set_expression_attribute_names(e.names())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .customize()
            .interceptor(watch.clone())
            .send()
            .await;
        match out {
            Ok(_) => Ok(None),
            Err(err) => match err.as_service_error() {
                Some(aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c)) => {
                    match c.item() {
                        Some(item) => Ok(Some(TransactionRecord::from_item(item)?)),
                        None => self.get(&record.transaction_id).await?.map(Some).ok_or_else(|| {
                            StoreError::internal("PutItem", &self.table, "record exists but cannot be read")
                        }),
                    }
                }
                _ => Err(watch.error("PutItem", &self.table, err)),
            },
        }
    }

    pub async fn get(&self, id: &str) -> Result<Option<TransactionRecord>, StoreError> {
        // An id DynamoDB would refuse as a key (a client's `GET /transactions/{id}`) names no record: that
        // is the answer, not the store's ValidationException, which would read as the store failing.
        if id.is_empty() || id.len() > crate::model::MAX_KEY_BYTES {
            return Ok(None);
        }
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::new("GetItem", &self.table, e))?;
        out.item.as_ref().map(TransactionRecord::from_item).transpose()
    }

    /// Moves the record from `from` to `to` if, and only if, it is in `from`. Votes and a reason may be
    /// written with the change. Terminal states drop the record from the open-transactions index and,
    /// unless it is `keyed`, start its retention clock.
    #[allow(clippy::too_many_arguments)]
    pub async fn transition(
        &self,
        id: &str,
        from: Status,
        to: Status,
        keyed: bool,
        now_ms: u64,
        participants: Option<&[ParticipantEntry]>,
        reason: Option<&str>,
    ) -> Result<Transition, StoreError> {
        let mut e = Expr::new();
        let status = e.name(a::STATUS);
        let to_value = e.value(s(to.as_str()));
        let from_value = e.value(s(from.as_str()));
        let updated = e.name(a::UPDATED_AT);
        let now = e.value(n(now_ms));
        let mut sets = vec![format!("{status} = {to_value}"), format!("{updated} = {now}")];
        let mut removes = vec![];
        if let Some(participants) = participants {
            let name = e.name(a::PARTICIPANTS);
            let list = serde_json::to_value(participants).expect("entries serialize");
            let value = e.value(attr::to_attribute(&list));
            sets.push(format!("{name} = {value}"));
        }
        if let Some(reason) = reason {
            let name = e.name(a::REASON);
            let value = e.value(s(reason));
            sets.push(format!("{name} = {value}"));
        }
        if to.is_terminal() {
            if !keyed {
                let expire = e.name(a::EXPIRE_AT);
                let at = e.value(n(now_ms / 1000 + RETENTION_SECONDS));
                sets.push(format!("{expire} = {at}"));
            }
            removes.push(e.name(a::OPEN_SHARD));
            removes.push(e.name(a::SWEEP_AT));
        }
        let mut update = format!("SET {}", sets.join(", "));
        if !removes.is_empty() {
            update += &format!(" REMOVE {}", removes.join(", "));
        }
        let watch = AttemptWatch::default();
        let out = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(id)))
            .update_expression(update)
            .condition_expression(format!("{status} = {from_value}"))
            .set_expression_attribute_names(e.names())
            .set_expression_attribute_values(e.values())
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .customize()
            .interceptor(watch.clone())
            .send()
            .await;
        match out {
            Ok(out) => {
                let item = out.attributes.unwrap_or_default();
                Ok(Transition::Done(TransactionRecord::from_item(&item)?))
            }
            Err(err) => match err.as_service_error() {
                Some(aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c)) => {
                    // An update on a missing key fails the condition with no item: there is no record.
                    match c.item() {
                        Some(item) if !item.is_empty() => {
                            Ok(Transition::Lost(Some(TransactionRecord::from_item(item)?)))
                        }
                        _ => Ok(Transition::Lost(self.get(id).await?)),
                    }
                }
                _ => Err(watch.error("UpdateItem", &self.table, err)),
            },
        }
    }

    /// Records that a transaction with no record is aborted, unless a record appears first. Lock
    /// resolution does this before releasing a lock whose owner never wrote its record, so that owner
    /// can never commit afterwards. Returns the record as it now is.
    pub async fn abort_if_absent(&self, id: &str, now_ms: u64, reason: &str) -> Result<TransactionRecord, StoreError> {
        let record = TransactionRecord {
            transaction_id: id.to_owned(),
            status: Status::Aborted,
            participants: vec![],
            created_at: now_ms,
            updated_at: now_ms,
            deadline: now_ms,
            reason: Some(reason.to_owned()),
            request_hash: None,
            expire_at: None,
            open_shard: None,
            sweep_at: None,
            sweep_attempts: None,
            sweep_error: None,
            execution_id: None,
        }
        .ended(Status::Aborted, now_ms);
        Ok(self.create(&record).await?.unwrap_or(record))
    }

    /// Puts an open transaction the sweeper could not finish behind the others until `sweep_at`, with why,
    /// so that the next runs reach what stands behind it. Only while it is still `status`.
    pub async fn postpone(
        &self,
        id: &str,
        status: Status,
        sweep_at: u64,
        attempts: u32,
        error: &str,
    ) -> Result<bool, StoreError> {
        let mut e = Expr::new();
        let update = format!(
            "SET {} = {}, {} = {}, {} = {}",
            e.name(a::SWEEP_AT),
            e.value(n(sweep_at)),
            e.name(a::SWEEP_ATTEMPTS),
            e.value(n(attempts)),
            e.name(a::SWEEP_ERROR),
            e.value(s(error))
        );
        let condition = format!(
            "{} = {} AND attribute_exists({})",
            e.name(a::STATUS),
            e.value(s(status.as_str())),
            e.name(a::OPEN_SHARD)
        );
        let out = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(id)))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(e.names())
            .set_expression_attribute_values(e.values())
            .send()
            .await;
        match out {
            Ok(_) => Ok(true),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) => Ok(false),
            Err(err) => Err(StoreError::new("UpdateItem", &self.table, err)),
        }
    }

    /// Ids of open transactions due for the sweeper before `before_ms`, at most `limit` from each shard.
    pub async fn open_before(&self, before_ms: u64, limit: i32) -> Result<Vec<String>, StoreError> {
        let entries = crate::store::page_shards(limit, |shard, limit, start| {
            let mut e = Expr::new();
            let condition = format!(
                "{} = {} AND {} < {}",
                e.name(a::OPEN_SHARD),
                e.value(s(format!("open#{shard}"))),
                e.name(a::SWEEP_AT),
                e.value(n(before_ms))
            );
            let query = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(crate::tables::OPEN_TRANSACTIONS_INDEX)
                .key_condition_expression(condition)
                .set_expression_attribute_names(e.names())
                .set_expression_attribute_values(e.values())
                .limit(limit)
                .set_exclusive_start_key(start);
            async move {
                let out = query.send().await.map_err(|err| StoreError::new("Query", &self.table, err))?;
                Ok((out.items.unwrap_or_default(), out.last_evaluated_key))
            }
        })
        .await?;
        Ok(entries.iter().filter_map(|i| crate::store::get_s(i, a::ID).map(str::to_owned)).collect())
    }
}

/// The open-index shard a new record is written under.
pub fn open_shard(id: &str) -> String {
    shard_of(id, "open")
}

pub fn status_of(item: &Item) -> Option<Status> {
    item.get(a::STATUS).and_then(|v| match v {
        AttributeValue::S(text) => Status::parse(text),
        _ => None,
    })
}
