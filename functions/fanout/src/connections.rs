//! The WebSocket connections table: `$connect` records a connection, `subscribe`/`unsubscribe` add
//! and remove (connection, topic) items, `$disconnect` (or a Gone push) deletes them all. The
//! `by-topic` index finds a topic's subscribers.
//!
//! Every item carries `expireAt` (TTL): API Gateway closes a WebSocket connection after two hours at
//! most, so an item a lost `$disconnect` left behind goes within a day.
//!
//! Its parts: `connections/topics.rs` keeps a connection's topics under its cap (`subscribe` and
//! `unsubscribe`, with a counter written in the same transaction as the topics: why, there), and
//! `connections/routes.rs` reads the WebSocket API's routes and serves them from the store.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, WriteRequest};
use futures::StreamExt;
use serde::Serialize;
use tracing::{info, warn};
use twopc::access::{Caller, CallerKind, Policy};
use twopc::expr::{Expr, n};
use twopc::record::TransactionStore;
use twopc::store::write::{Sending, Write, conditional};
use twopc::tables::{TOPIC_INDEX, connection_attr};

use super::lake::RetryPolicy;
use super::realtime::{StoreError, Subscriptions};
use super::topic::Topic;

mod routes;
mod topics;

pub use routes::{
    BadRequest, ConnectionRequest, ConnectionResponse, MAX_TOPICS_PER_MESSAGE, message_body, parse_request, serve,
    serve_as,
};

/// The variables the connections function reads (and the stream processor, the table's), named in
/// [`twopc::environment`], which lists every function's.
pub use twopc::environment::{
    CONNECTIONS_TABLE_NAME, DEFAULT_CONNECTIONS_TABLE, MAX_CONNECTIONS_PER_PRINCIPAL, MAX_TOPICS_PER_CONNECTION,
    WEBSOCKET_API_ID,
};

/// How long connection and subscription items live without a `$disconnect`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Topics one connection may follow unless configured otherwise (`MAX_TOPICS_PER_CONNECTION`).
pub const DEFAULT_MAX_TOPICS_PER_CONNECTION: usize = 50;
/// Open connections one principal may have unless configured otherwise (`MAX_CONNECTIONS_PER_PRINCIPAL`).
pub const DEFAULT_MAX_CONNECTIONS_PER_PRINCIPAL: usize = 10;
/// How long a connection counts against its principal's cap without a `$disconnect`: API Gateway
/// closes every WebSocket connection after two hours, so a lost `$disconnect` frees its place then.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(2 * 60 * 60 + 5 * 60);
/// BatchGetItem takes 100 keys per call.
const BATCH_GET_LIMIT: usize = 100;
/// BatchWriteItem takes 25 requests per call.
const BATCH_WRITE_LIMIT: usize = 25;
/// `BatchWriteItem` calls of one `$disconnect` in flight at once.
const WRITE_CONCURRENCY: usize = 10;
/// Tries of a topic change that keeps meeting other writes of the same connection (its other
/// messages, its `$disconnect`): about five seconds of backing off at most, inside the connections
/// function's 10 s.
const CONFLICT_TRIES: u32 = 10;

/// The connections table's retries of unprocessed batch writes: six tries, 50 ms doubling to 1 s
/// (under 2 s of waiting), with the batches of one call sent side by side, so that `$disconnect`
/// of the largest allowed set finishes well inside the function's 10 s even when throttled.
fn connection_retry() -> RetryPolicy {
    RetryPolicy { max_attempts: 6, base_delay: Duration::from_millis(50), max_delay: Duration::from_secs(1) }
}

/// The connections table on DynamoDB.
#[derive(Debug, Clone)]
pub struct ConnectionStore {
    client: Client,
    table: String,
    ttl: Duration,
    retry: RetryPolicy,
    max_topics: usize,
    max_connections_per_principal: usize,
    access: Policy,
    /// Where a `tx:` topic's owner is looked up at subscribe (None: authorized only when pushed).
    transactions: Option<TransactionStore>,
}

/// What `$connect` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connected {
    Open,
    /// The principal has this many open connections already, the cap.
    OverCap(usize),
}

/// A topic a subscribe did not take, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refused {
    pub topic: String,
    pub reason: String,
}

/// What a subscribe did: the topics the connection now follows (those it followed already
/// included), and those refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscribeOutcome {
    pub subscribed: Vec<String>,
    pub refused: Vec<Refused>,
}

impl ConnectionStore {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        ConnectionStore {
            client,
            table: table.into(),
            ttl: DEFAULT_TTL,
            retry: connection_retry(),
            max_topics: DEFAULT_MAX_TOPICS_PER_CONNECTION,
            max_connections_per_principal: DEFAULT_MAX_CONNECTIONS_PER_PRINCIPAL,
            access: Policy::default(),
            transactions: None,
        }
    }

    /// At most `max` open connections per principal (at least 1).
    pub fn with_max_connections_per_principal(mut self, max: usize) -> Self {
        self.max_connections_per_principal = max.max(1);
        self
    }

    /// Authorizes subscribes as `policy` says; `transactions` tells a `tx:` topic's owner.
    pub fn with_access(mut self, policy: Policy, transactions: Option<TransactionStore>) -> Self {
        self.access = policy;
        self.transactions = transactions;
        self
    }

    pub fn access(&self) -> &Policy {
        &self.access
    }

    /// At most `max_topics` topics per connection (at least 1).
    pub fn with_max_topics(mut self, max_topics: usize) -> Self {
        self.max_topics = max_topics.max(1);
        self
    }

    pub fn max_topics(&self) -> usize {
        self.max_topics
    }

    /// A client built on the shared AWS configuration.
    pub fn from_config(sdk: &aws_config::SdkConfig, table: impl Into<String>) -> Self {
        Self::new(Client::new(sdk), table)
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    fn expire_at(&self, now: SystemTime) -> AttributeValue {
        let secs = (now + self.ttl).duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        AttributeValue::N(secs.to_string())
    }

    fn key(connection_id: &str, topic: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([
            (connection_attr::CONNECTION_ID.to_owned(), AttributeValue::S(connection_id.to_owned())),
            (connection_attr::TOPIC.to_owned(), AttributeValue::S(topic.to_owned())),
        ])
    }

    /// `$connect` of a caller without identity (no authorizer ran).
    pub async fn connect(&self, connection_id: &str, now: SystemTime) -> Result<(), StoreError> {
        self.connect_as(connection_id, now, &self.access.iam(None)).await.map(|_| ())
    }

    /// `$connect`: the item that records the connection and its caller, once the caller's principal has
    /// room under its cap. An update (not a put) so that a late `$connect` never resets the topic counter.
    /// Admins (by default every IAM caller: backend services, whose fleets may share a role) are not
    /// capped.
    pub async fn connect_as(
        &self,
        connection_id: &str,
        now: SystemTime,
        caller: &Caller,
    ) -> Result<Connected, StoreError> {
        if !caller.admin
            && let Some(principal) = &caller.principal
            && let Connected::OverCap(open) = self.claim_place(principal, connection_id, now).await?
        {
            info!(
                connection_id,
                principal,
                open,
                max = self.max_connections_per_principal,
                "connection refused: the principal's cap"
            );
            return Ok(Connected::OverCap(open));
        }
        let millis = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
        let kind = match caller.kind {
            CallerKind::Iam => "iam",
            CallerKind::Jwt => "jwt",
        };
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(connection_id, connection_attr::CONNECTION_TOPIC)))
            .update_expression("SET #at = :at, #e = :e, #k = :k, #a = :a")
            .expression_attribute_names("#at", connection_attr::CONNECTED_AT)
            .expression_attribute_names("#e", connection_attr::EXPIRE_AT)
            .expression_attribute_names("#k", connection_attr::CALLER_KIND)
            .expression_attribute_names("#a", connection_attr::ADMIN)
            .expression_attribute_values(":at", AttributeValue::N(millis.to_string()))
            .expression_attribute_values(":e", self.expire_at(now))
            .expression_attribute_values(":k", AttributeValue::S(kind.to_owned()))
            .expression_attribute_values(":a", AttributeValue::Bool(caller.admin));
        let mut set = Vec::new();
        for (name, value, placeholder) in
            [(connection_attr::PRINCIPAL, &caller.principal, ":p"), (connection_attr::SUB, &caller.sub, ":s")]
        {
            if let Some(value) = value {
                let attribute = format!("#{}", &placeholder[1..]);
                set.push(format!("{attribute} = {placeholder}"));
                update = update
                    .expression_attribute_names(attribute, name)
                    .expression_attribute_values(placeholder, AttributeValue::S(value.clone()));
            }
        }
        if !set.is_empty() {
            update = update.update_expression(format!("SET #at = :at, #e = :e, #k = :k, #a = :a, {}", set.join(", ")));
        }
        if let Err(e) = update.send().await {
            // Refused, this connection never comes: its place goes back (API Gateway sends no `$disconnect`).
            if !caller.admin
                && let Some(principal) = &caller.principal
                && let Err(release) = self.release_place(principal, connection_id).await
            {
                warn!(connection_id, error = %release, "a refused connection's place could not be given back; it frees when it expires");
            }
            return Err(StoreError::new("UpdateItem", &self.table, e));
        }
        Ok(Connected::Open)
    }

    /// A place for `connection_id` among `principal`'s open connections, if there is room: read the
    /// principal's item, drop the places whose time is up, add this one, and write it back on condition
    /// that nobody wrote it in between (`version`). A write whose reply was lost, tried again, finds its
    /// own place taken already; a `$connect` that comes twice takes one place.
    async fn claim_place(
        &self,
        principal: &str,
        connection_id: &str,
        now: SystemTime,
    ) -> Result<Connected, StoreError> {
        let key =
            Self::key(&format!("{}{principal}", connection_attr::PRINCIPAL_PREFIX), connection_attr::PRINCIPAL_TOPIC);
        let now_secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let mut busy = 0;
        loop {
            let item = self
                .client
                .get_item()
                .table_name(&self.table)
                .set_key(Some(key.clone()))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| StoreError::new("GetItem", &self.table, e))?
                .item;
            let version = item.as_ref().and_then(|i| number(i.get(connection_attr::VERSION)));
            let mut places: HashMap<String, AttributeValue> = item
                .as_ref()
                .and_then(|i| i.get(connection_attr::CONNECTIONS))
                .and_then(|c| c.as_m().ok())
                .cloned()
                .unwrap_or_default();
            places.retain(|_, until| number(Some(until)).is_some_and(|until| until as u64 > now_secs));
            if places.contains_key(connection_id) {
                return Ok(Connected::Open);
            }
            if places.len() >= self.max_connections_per_principal {
                return Ok(Connected::OverCap(places.len()));
            }
            let until = now_secs + CONNECTION_LIFETIME.as_secs();
            places.insert(connection_id.to_owned(), AttributeValue::N(until.to_string()));
            let last = places.values().filter_map(|u| number(Some(u))).max().unwrap_or(0) as u64;
            let mut item = key.clone();
            item.insert(connection_attr::CONNECTIONS.to_owned(), AttributeValue::M(places));
            item.insert(connection_attr::VERSION.to_owned(), n(version.unwrap_or(0) + 1));
            item.insert(connection_attr::EXPIRE_AT.to_owned(), n(last.max(until)));
            let mut e = Expr::new();
            let unchanged = match version {
                Some(v) => format!("{} = {}", e.name(connection_attr::VERSION), e.value(n(v))),
                None => format!("attribute_not_exists({})", e.name(connection_attr::CONNECTION_ID)),
            };
            let put = Write::put(&self.table, item, unchanged, e);
            if conditional(&self.client, vec![put], Sending::default()).await?.decided()?.applied() {
                return Ok(Connected::Open);
            }
            busy += 1;
            self.wait_out_conflict(busy, "PutItem").await?;
        }
    }

    /// Gives back a connection's place under its principal's cap. Raises `version` too, so that a place
    /// claimed at the same time from what it read before cannot write this one back.
    async fn release_place(&self, principal: &str, connection_id: &str) -> Result<(), StoreError> {
        let key =
            Self::key(&format!("{}{principal}", connection_attr::PRINCIPAL_PREFIX), connection_attr::PRINCIPAL_TOPIC);
        let mut e = Expr::new();
        let places = e.name(connection_attr::CONNECTIONS);
        let update = format!(
            "REMOVE {places}.{place} ADD {version} {one}",
            place = e.name(connection_id),
            version = e.name(connection_attr::VERSION),
            one = e.value(n(1)),
        );
        let give_back = Write::update(&self.table, key, update, format!("attribute_exists({places})"), e);
        // Refused: no item, so the principal has no place to give back (its item expired, or no cap was kept).
        conditional(&self.client, vec![give_back], Sending::default()).await?.decided()?;
        Ok(())
    }

    /// The caller a connection's `$connect` recorded; a connection recorded without one (before callers
    /// were recorded) is a caller without identity, as it then was. None: no such connection.
    pub async fn caller_of(&self, connection_id: &str) -> Result<Option<Caller>, StoreError> {
        let item = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(connection_id, connection_attr::CONNECTION_TOPIC)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::new("GetItem", &self.table, e))?
            .item;
        Ok(item.map(|item| self.caller_in(&item)))
    }

    fn caller_in(&self, item: &HashMap<String, AttributeValue>) -> Caller {
        let text = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
        // Only `$connect` writes `connectedAt`: an item a topic counter made without it is nobody's.
        if !item.contains_key(connection_attr::CONNECTED_AT) {
            return Caller::nobody();
        }
        match text(connection_attr::CALLER_KIND).as_deref() {
            Some("jwt") => Caller {
                principal: text(connection_attr::PRINCIPAL),
                kind: CallerKind::Jwt,
                sub: text(connection_attr::SUB),
                admin: item.get(connection_attr::ADMIN).and_then(|v| v.as_bool().ok()).copied().unwrap_or(false),
                // The admin API is not served over WebSocket.
                operator: false,
            },
            // An IAM caller is judged by the policy in force now, as it is at the REST API.
            _ => self.access.iam(text(connection_attr::PRINCIPAL).as_deref()),
        }
    }

    /// The topics `caller` may follow, and the others with the reason. A `tx:` topic whose record does
    /// not exist yet is taken (a transaction may be followed before it starts); it is authorized again
    /// when its outcome is pushed.
    pub async fn authorize(&self, caller: &Caller, topics: &[Topic]) -> Result<(Vec<Topic>, Vec<Refused>), StoreError> {
        let mut allowed = Vec::new();
        let mut refused = Vec::new();
        for topic in topics {
            let denial = match topic {
                _ if caller.admin => None,
                Topic::Entity { table, entity_id } => (!self.access.may_read(caller, table, entity_id)).then(|| {
                    format!(
                        "not allowed: you may follow only items you own (entityId {}) in the tables the access policy lets you read",
                        caller.sub.as_deref().map(|s| format!("{s:?} or \"{s}#...\"")).unwrap_or_else(|| "of your own".into())
                    )
                }),
                Topic::Transaction(id) => match &self.transactions {
                    Some(transactions) => match transactions.get(id).await? {
                        Some(record) if !self.access.may_see(caller, record.principal.as_deref()) => {
                            Some("not allowed: you may follow only the transactions you created".to_owned())
                        }
                        _ => None,
                    },
                    None => None,
                },
            };
            match denial {
                None => allowed.push(topic.clone()),
                Some(reason) => refused.push(Refused { topic: topic.to_string(), reason }),
            }
        }
        Ok((allowed, refused))
    }

    /// Backs off before another try of a write that met another transaction on the same items (two
    /// messages of one connection, or its `$disconnect`); gives up after the retry policy's tries.
    async fn wait_out_conflict(&self, tries: u32, operation: &'static str) -> Result<(), StoreError> {
        if tries >= CONFLICT_TRIES {
            return Err(StoreError::internal(
                operation,
                &self.table,
                format!("still meeting other writes to this connection's items after {tries} tries"),
            ));
        }
        tokio::time::sleep(self.retry.delay(tries)).await;
        Ok(())
    }

    /// The topics a connection's items name (its own item, `$connection`, included).
    async fn topics_of(&self, connection_id: &str) -> Result<Vec<String>, StoreError> {
        let items = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("#c = :c")
            .expression_attribute_names("#c", connection_attr::CONNECTION_ID)
            .expression_attribute_values(":c", AttributeValue::S(connection_id.to_owned()))
            .projection_expression("#c, #t")
            .expression_attribute_names("#t", connection_attr::TOPIC)
            .consistent_read(true)
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| StoreError::new("Query", &self.table, e))?;
        Ok(strings(&items, connection_attr::TOPIC))
    }

    /// `$disconnect`: the connection item and every subscription (at most the cap and one), in
    /// BatchWriteItem calls of 25 sent side by side. Answers how many items went.
    pub async fn disconnect(&self, connection_id: &str) -> Result<usize, StoreError> {
        if let Some(Caller { principal: Some(principal), admin: false, .. }) = self.caller_of(connection_id).await? {
            self.release_place(&principal, connection_id).await?;
        }
        let topics = self.topics_of(connection_id).await?;
        let count = topics.len();
        let requests = topics.iter().map(|topic| delete_request(connection_id, topic)).collect();
        self.batch_write(requests).await?;
        Ok(count)
    }

    /// Connection ids subscribed to `topic` (the `by-topic` index, every page).
    pub async fn subscribers_of(&self, topic: &str) -> Result<Vec<String>, StoreError> {
        let items = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(TOPIC_INDEX)
            .key_condition_expression("#t = :t")
            .expression_attribute_names("#t", connection_attr::TOPIC)
            .expression_attribute_values(":t", AttributeValue::S(topic.to_owned()))
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| StoreError::new("Query", &self.table, e))?;
        Ok(strings(&items, connection_attr::CONNECTION_ID))
    }

    /// BatchWriteItem in calls of 25 (side by side), resending unprocessed items with backoff, a
    /// bounded number of times.
    async fn batch_write(&self, requests: Vec<WriteRequest>) -> Result<(), StoreError> {
        let chunks: Vec<Vec<WriteRequest>> = requests.chunks(BATCH_WRITE_LIMIT).map(<[_]>::to_vec).collect();
        let results: Vec<Result<(), StoreError>> = futures::stream::iter(chunks)
            .map(|chunk: Vec<WriteRequest>| self.batch_write_chunk(chunk))
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await;
        results.into_iter().find(Result::is_err).unwrap_or(Ok(()))
    }

    async fn batch_write_chunk(&self, mut pending: Vec<WriteRequest>) -> Result<(), StoreError> {
        let mut attempt = 0;
        while !pending.is_empty() {
            attempt += 1;
            if attempt > 1 {
                if attempt > self.retry.max_attempts.max(1) {
                    return Err(StoreError::internal(
                        "BatchWriteItem",
                        &self.table,
                        format!("{} writes still unprocessed after {} tries", pending.len(), attempt - 1),
                    ));
                }
                tokio::time::sleep(self.retry.delay(attempt - 1)).await;
            }
            let result = self.client.batch_write_item().request_items(&self.table, pending.clone()).send().await;
            pending = match result {
                Ok(output) => {
                    output.unprocessed_items().and_then(|items| items.get(&self.table)).cloned().unwrap_or_default()
                }
                // An item of the batch is in a subscribe's or unsubscribe's transaction under way:
                // nothing of the batch was written; deletions are safe to send again.
                Err(err) if err.as_service_error().and_then(|e| e.code()) == Some("TransactionConflictException") => {
                    pending
                }
                Err(err) => return Err(StoreError::new("BatchWriteItem", &self.table, err)),
            };
        }
        Ok(())
    }
}

fn delete_request(connection_id: &str, topic: &str) -> WriteRequest {
    let delete =
        DeleteRequest::builder().set_key(Some(ConnectionStore::key(connection_id, topic))).build().expect("key is set");
    WriteRequest::builder().delete_request(delete).build()
}

/// The string attribute `name` of each item that has one.
fn strings(items: &[HashMap<String, AttributeValue>], name: &str) -> Vec<String> {
    items
        .iter()
        .filter_map(|item| match item.get(name) {
            Some(AttributeValue::S(value)) => Some(value.clone()),
            _ => None,
        })
        .collect()
}

fn number(value: Option<&AttributeValue>) -> Option<usize> {
    value.and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok()).map(|n| usize::try_from(n).unwrap_or(0))
}

impl Subscriptions for ConnectionStore {
    async fn subscribers(&self, topic: &Topic) -> Result<Vec<String>, StoreError> {
        self.subscribers_of(&topic.to_string()).await
    }

    async fn remove_connection(&self, connection_id: &str) -> Result<usize, StoreError> {
        self.disconnect(connection_id).await
    }

    async fn callers(&self, connection_ids: &[String]) -> Result<HashMap<String, Caller>, StoreError> {
        let mut callers = HashMap::new();
        for chunk in connection_ids.chunks(BATCH_GET_LIMIT) {
            let mut keys: Vec<HashMap<String, AttributeValue>> =
                chunk.iter().map(|id| Self::key(id, connection_attr::CONNECTION_TOPIC)).collect();
            let mut attempt = 0;
            while !keys.is_empty() {
                attempt += 1;
                if attempt > 1 {
                    if attempt > self.retry.max_attempts.max(1) {
                        return Err(StoreError::internal(
                            "BatchGetItem",
                            &self.table,
                            format!("{} keys still unprocessed after {} tries", keys.len(), attempt - 1),
                        ));
                    }
                    tokio::time::sleep(self.retry.delay(attempt - 1)).await;
                }
                let request = aws_sdk_dynamodb::types::KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut keys)))
                    .build()
                    .expect("keys are set");
                let output = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, request)
                    .send()
                    .await
                    .map_err(|e| StoreError::new("BatchGetItem", &self.table, e))?;
                for item in output.responses().and_then(|r| r.get(&self.table)).into_iter().flatten() {
                    if let Some(AttributeValue::S(id)) = item.get(connection_attr::CONNECTION_ID) {
                        callers.insert(id.clone(), self.caller_in(item));
                    }
                }
                keys = output
                    .unprocessed_keys()
                    .and_then(|u| u.get(&self.table))
                    .map(|k| k.keys().to_vec())
                    .unwrap_or_default();
            }
        }
        Ok(callers)
    }
}
