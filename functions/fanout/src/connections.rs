//! The WebSocket connections table: `$connect` records a connection, `subscribe`/`unsubscribe` add
//! and remove (connection, topic) items, `$disconnect` (or a Gone push) deletes them all. The
//! `by-topic` index finds a topic's subscribers.
//!
//! Every item carries `expireAt` (TTL): API Gateway closes a WebSocket connection after two hours at
//! most, so an item a lost `$disconnect` left behind goes within a day.
//!
//! One connection follows at most `max_topics` topics (`MAX_TOPICS_PER_CONNECTION`, default 50), so
//! that `$disconnect` always has a small, bounded set to delete. The guard is a counter on the
//! connection's own item (`topicCount`), written in the same `TransactWriteItems` as the topic items
//! it counts: `ADD n` with `topicCount <= max - n` and each topic `attribute_not_exists` for a
//! subscribe, `ADD -n` and each topic `attribute_exists` for an unsubscribe. So while the connection
//! lives the counter is always the number of topic items (`$disconnect` deletes them all, counter
//! included, without a transaction):
//! - two messages handled at once cannot together pass the cap (one counter item; a transaction
//!   that meets another is cancelled and tried again);
//! - a write whose reply was lost and that the SDK sends again is answered as the first attempt
//!   (same `ClientRequestToken`), and even a copy with another token is cancelled by the topics'
//!   own conditions instead of counting twice;
//! - a message that dies half-way has written all of a transaction or none of it.
//!
//! Counting the items and then writing would let two messages both see room; a counter written
//! apart from the items would drift with every lost reply (a retried topic write taken for somebody
//! else's gives room back, a retried deletion taken for a topic not followed never does).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, WriteRequest};
use futures::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};
use tracing::{info, warn};
use twopc::access::{Caller, CallerKind, Policy};
use twopc::expr::{Expr, n};
use twopc::record::TransactionStore;
use twopc::store::write::{Sending, Write, Written, conditional};
use twopc::tables::{TOPIC_INDEX, connection_attr};

use super::lake::RetryPolicy;
use super::realtime::{StoreError, Subscriptions};
use super::topic::Topic;

/// The variables the connections function reads (and the stream processor, the table's), named in
/// [`twopc::environment`], which lists every function's.
pub use twopc::environment::{
    CONNECTIONS_TABLE_NAME, DEFAULT_CONNECTIONS_TABLE, MAX_CONNECTIONS_PER_PRINCIPAL, MAX_TOPICS_PER_CONNECTION,
    WEBSOCKET_API_ID,
};

/// Topics one subscribe or unsubscribe message may name.
pub const MAX_TOPICS_PER_MESSAGE: usize = 100;
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
/// Topics one `TransactWriteItems` changes: its 100 actions, less the connection's counter.
const TOPICS_PER_TRANSACTION: usize = 99;
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

/// Which way a topic change goes (an added topic expires a TTL after `now`).
#[derive(Debug, Clone, Copy)]
enum Change {
    Add { now: SystemTime },
    Remove,
}

/// What became of one `TransactWriteItems` of topics and their counter.
#[derive(Debug)]
enum Changed {
    Done,
    /// Nothing was written: the counter's condition failed (`counter`), or these topics' (there
    /// already for an add, gone already for a remove), or both.
    Cancelled {
        counter: Option<Counter>,
        topics: Vec<String>,
    },
    /// Another write to the same items was under way: nothing was written; worth trying again.
    Busy,
}

/// The connection's counter, as a failed condition found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counter {
    /// This many topics counted.
    Holds(usize),
    /// No counter: the connection's own item is gone (its `$disconnect`, at the same time).
    Missing,
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

    /// One item per (connection, topic), up to the connection's cap; subscribing twice is harmless
    /// (a topic followed already is answered as subscribed and takes no more room). Topics over the
    /// cap are refused, in the message's order, each with the reason.
    pub async fn subscribe(
        &self,
        connection_id: &str,
        topics: &[Topic],
        now: SystemTime,
    ) -> Result<SubscribeOutcome, StoreError> {
        let requested = distinct_in_order(topics);
        let held: HashSet<String> = self.topics_of(connection_id).await?.into_iter().collect();
        let mut pending: Vec<String> = requested.iter().filter(|t| !held.contains(*t)).cloned().collect();
        // What the connection follows already leaves this much room: none, and the rest is refused
        // without a write; some, and the counter's condition decides.
        let mut count = held.iter().filter(|t| *t != connection_attr::CONNECTION_TOPIC).count();
        let mut asking = self.max_topics.saturating_sub(count).min(TOPICS_PER_TRANSACTION);
        let mut busy = 0;
        while !pending.is_empty() && asking > 0 {
            let batch: Vec<String> = pending.iter().take(asking).cloned().collect();
            match self.change_topics(connection_id, &batch, Change::Add { now }).await? {
                Changed::Done => {
                    pending.drain(..batch.len());
                    count += batch.len();
                    asking = asking.min(self.max_topics.saturating_sub(count));
                }
                Changed::Cancelled { counter, topics } => {
                    // Topics there already (a subscribe of the same topic at the same time) are followed.
                    pending.retain(|t| !topics.contains(t));
                    // Not that much room: ask for what is left (none: the rest is refused). The
                    // condition fails only on a counter that is there, so `Missing` does not come.
                    if let Some(Counter::Holds(held_count)) = counter {
                        count = held_count;
                        let room = self.max_topics.saturating_sub(held_count);
                        if room >= batch.len() {
                            // Not by DynamoDB's rules (the item returned is the one the condition
                            // read); tried again all the same, but not for ever.
                            busy += 1;
                            self.wait_out_conflict(busy, "TransactWriteItems").await?;
                        }
                        asking = asking.min(room);
                    }
                }
                Changed::Busy => {
                    busy += 1;
                    self.wait_out_conflict(busy, "TransactWriteItems").await?;
                }
            }
        }

        let refused: HashSet<&String> = pending.iter().collect();
        let mut outcome = SubscribeOutcome::default();
        for topic in &requested {
            if !refused.contains(topic) {
                outcome.subscribed.push(topic.clone());
            } else {
                outcome.refused.push(Refused {
                    topic: topic.clone(),
                    reason: format!(
                        "this connection follows {count} topics, at most {max} per connection \
                         (MAX_TOPICS_PER_CONNECTION); unsubscribe from some first",
                        max = self.max_topics
                    ),
                });
            }
        }
        if !outcome.refused.is_empty() {
            info!(
                connection_id,
                refused = outcome.refused.len(),
                max_topics = self.max_topics,
                "subscribe over the per-connection cap: topics refused"
            );
        }
        Ok(outcome)
    }

    /// Deletes the topics' items and gives back their room; topics not followed are no-ops.
    pub async fn unsubscribe(&self, connection_id: &str, topics: &[Topic]) -> Result<(), StoreError> {
        let held: HashSet<String> = self.topics_of(connection_id).await?.into_iter().collect();
        let mut pending: Vec<String> = distinct(topics).into_iter().filter(|t| held.contains(t)).collect();
        let mut busy = 0;
        while !pending.is_empty() {
            let batch: Vec<String> = pending.iter().take(TOPICS_PER_TRANSACTION).cloned().collect();
            match self.change_topics(connection_id, &batch, Change::Remove).await? {
                Changed::Done => {
                    pending.drain(..batch.len());
                }
                Changed::Cancelled { topics, .. } if !topics.is_empty() => {
                    // Gone already (an unsubscribe of the same topic at the same time): the rest again,
                    // whatever the counter's condition said (it counted those too).
                    pending.retain(|t| !topics.contains(t));
                }
                Changed::Cancelled { counter, .. } => {
                    // Every topic is there but the counter is gone, or counts fewer: the connection's own
                    // item went or is going (its `$disconnect`), and its topics go without a count.
                    if counter != Some(Counter::Missing) {
                        warn!(
                            connection_id,
                            ?counter,
                            topics = batch.len(),
                            "a connection's topic counter counts fewer than its topics"
                        );
                    }
                    let requests = batch.iter().map(|topic| delete_request(connection_id, topic)).collect();
                    self.batch_write(requests).await?;
                    pending.drain(..batch.len());
                }
                Changed::Busy => {
                    busy += 1;
                    self.wait_out_conflict(busy, "TransactWriteItems").await?;
                }
            }
        }
        Ok(())
    }

    /// Writes topic items and the connection's counter in one `TransactWriteItems`, so that the
    /// counter is always the number of topic items, whatever runs at once and whatever reply is
    /// lost: each topic's condition (not there yet / there) makes a second copy of the write cancel
    /// instead of counting twice. A retry after a lost reply carries the same `ClientRequestToken`,
    /// and DynamoDB answers it as the first attempt, without applying it again.
    async fn change_topics(
        &self,
        connection_id: &str,
        topics: &[String],
        change: Change,
    ) -> Result<Changed, StoreError> {
        let count = topics.len();
        let key = Self::key(connection_id, connection_attr::CONNECTION_TOPIC);
        let mut e = Expr::new();
        let topic_count = e.name(connection_attr::TOPIC_COUNT);
        let counter = match change {
            Change::Add { now } => {
                let update = format!(
                    "ADD {topic_count} {count} SET {expire} = if_not_exists({expire}, {at})",
                    count = e.value(n(count)),
                    expire = e.name(connection_attr::EXPIRE_AT),
                    at = e.value(self.expire_at(now)),
                );
                let room = format!(
                    "attribute_not_exists({topic_count}) OR {topic_count} <= {}",
                    e.value(n(self.max_topics - count))
                );
                Write::update(&self.table, key, update, room, e)
            }
            Change::Remove => {
                let update = format!("ADD {topic_count} {}", e.value(AttributeValue::N(format!("-{count}"))));
                let enough = format!("{topic_count} >= {}", e.value(n(count)));
                Write::update(&self.table, key, update, enough, e)
            }
        };
        let mut writes = vec![counter];
        for topic in topics {
            let mut e = Expr::new();
            let topic_name = e.name(connection_attr::TOPIC);
            writes.push(match change {
                Change::Add { now } => {
                    let mut item = Self::key(connection_id, topic);
                    item.insert(connection_attr::EXPIRE_AT.to_owned(), self.expire_at(now));
                    Write::put(&self.table, item, format!("attribute_not_exists({topic_name})"), e)
                }
                Change::Remove => {
                    let key = Self::key(connection_id, topic);
                    Write::delete(&self.table, key, format!("attribute_exists({topic_name})"), e)
                }
            });
        }
        let refused = match conditional(&self.client, writes, Sending::default().idempotent()).await? {
            Written::Applied(_) => return Ok(Changed::Done),
            Written::Contention(_) => return Ok(Changed::Busy),
            Written::Unstorable { error, .. } => return Err(error),
            Written::Refused(refused) => refused,
        };
        let counter = refused.iter().find(|r| r.index == 0).map(|r| {
            match r.item.as_ref().and_then(|item| number(item.get(connection_attr::TOPIC_COUNT))) {
                Some(count) => Counter::Holds(count),
                None => Counter::Missing,
            }
        });
        let refused_topics: Vec<String> =
            refused.iter().filter_map(|r| r.index.checked_sub(1).and_then(|i| topics.get(i)).cloned()).collect();
        if counter.is_none() && refused_topics.is_empty() {
            return Err(StoreError::internal(
                "TransactWriteItems",
                &self.table,
                format!("cancelled with reasons that name none of its items: {refused:?}"),
            ));
        }
        Ok(Changed::Cancelled { counter, topics: refused_topics })
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
        let mut topics = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("#c = :c")
                .expression_attribute_names("#c", connection_attr::CONNECTION_ID)
                .expression_attribute_values(":c", AttributeValue::S(connection_id.to_owned()))
                .projection_expression("#c, #t")
                .expression_attribute_names("#t", connection_attr::TOPIC)
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| StoreError::new("Query", &self.table, e))?;
            for item in page.items() {
                if let Some(AttributeValue::S(topic)) = item.get(connection_attr::TOPIC) {
                    topics.push(topic.clone());
                }
            }
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => break,
            }
        }
        Ok(topics)
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
        let mut ids = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(TOPIC_INDEX)
                .key_condition_expression("#t = :t")
                .expression_attribute_names("#t", connection_attr::TOPIC)
                .expression_attribute_values(":t", AttributeValue::S(topic.to_owned()))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| StoreError::new("Query", &self.table, e))?;
            for item in page.items() {
                if let Some(AttributeValue::S(id)) = item.get(connection_attr::CONNECTION_ID) {
                    ids.push(id.clone());
                }
            }
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => break,
            }
        }
        Ok(ids)
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

fn number(value: Option<&AttributeValue>) -> Option<usize> {
    value.and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok()).map(|n| usize::try_from(n).unwrap_or(0))
}

/// Each topic once, in the message's order (the first ones are those served within the cap).
fn distinct_in_order(topics: &[Topic]) -> Vec<String> {
    let mut seen = HashSet::new();
    topics.iter().map(Topic::to_string).filter(|t| seen.insert(t.clone())).collect()
}

/// BatchWriteItem refuses two requests for one key.
fn distinct(topics: &[Topic]) -> Vec<String> {
    let mut names: Vec<String> = topics.iter().map(Topic::to_string).collect();
    names.sort();
    names.dedup();
    names
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

/// What a WebSocket route asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionRequest {
    Connect,
    Disconnect,
    Subscribe(Vec<Topic>),
    Unsubscribe(Vec<Topic>),
}

/// A message that cannot be served, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BadRequest {
    pub code: &'static str,
    pub message: String,
}

fn bad(message: impl Into<String>) -> BadRequest {
    BadRequest { code: "INVALID_REQUEST", message: message.into() }
}

/// Reads a route (`$connect`, `$disconnect`, `subscribe`, `unsubscribe`, or `$default` with the
/// action in the body) and its body `{"action": "subscribe", "topics": [...]}`.
pub fn parse_request(route_key: &str, body: Option<&str>) -> Result<ConnectionRequest, BadRequest> {
    match route_key {
        "$connect" => return Ok(ConnectionRequest::Connect),
        "$disconnect" => return Ok(ConnectionRequest::Disconnect),
        _ => {}
    }
    let body = body.filter(|b| !b.trim().is_empty()).ok_or_else(|| {
        bad(r#"the message has no body; expected {"action": "subscribe" | "unsubscribe", "topics": ["entity:<table>:<entityId>", "tx:<transactionId>"]}"#)
    })?;
    let message: Value = serde_json::from_str(body).map_err(|e| bad(format!("the message is not JSON: {e}")))?;
    let Some(object) = message.as_object() else {
        return Err(bad("the message must be a JSON object"));
    };
    let action = match object.get("action") {
        Some(Value::String(action)) => action.as_str(),
        Some(_) => return Err(bad("action must be a string")),
        None if route_key == "$default" => return Err(bad("action is missing")),
        None => route_key,
    };
    if route_key != "$default" && action != route_key {
        return Err(bad(format!("action {action:?} does not match the route {route_key:?}")));
    }
    let subscribe = match action {
        "subscribe" => true,
        "unsubscribe" => false,
        other => return Err(bad(format!("unknown action {other:?}: expected \"subscribe\" or \"unsubscribe\""))),
    };
    let topics = match object.get("topics") {
        Some(Value::Array(topics)) => topics,
        Some(_) => return Err(bad("topics must be an array of strings")),
        None => return Err(bad("topics is missing")),
    };
    if topics.is_empty() {
        return Err(bad("topics is empty"));
    }
    if topics.len() > MAX_TOPICS_PER_MESSAGE {
        return Err(bad(format!("{} topics in one message; at most {MAX_TOPICS_PER_MESSAGE}", topics.len())));
    }
    let topics = topics
        .iter()
        .enumerate()
        .map(|(i, topic)| match topic {
            Value::String(text) => text.parse::<Topic>().map_err(|e| bad(format!("topics[{i}] {text:?}: {e}"))),
            _ => Err(bad(format!("topics[{i}] is not a string"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(if subscribe { ConnectionRequest::Subscribe(topics) } else { ConnectionRequest::Unsubscribe(topics) })
}

/// The message text: API Gateway base64-encodes binary frames (`isBase64Encoded`).
pub fn message_body(body: Option<&str>, is_base64_encoded: bool) -> Result<Option<String>, BadRequest> {
    match body {
        Some(text) if is_base64_encoded => {
            let bytes =
                aws_smithy_types::base64::decode(text).map_err(|e| bad(format!("the body is not base64: {e}")))?;
            String::from_utf8(bytes).map(Some).map_err(|_| bad("the message is not UTF-8 text"))
        }
        other => Ok(other.map(str::to_owned)),
    }
}

/// The answer for API Gateway: a status code and an optional JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionResponse {
    pub status_code: u16,
    pub body: Option<String>,
}

impl ConnectionResponse {
    fn ok(body: Option<Value>) -> Self {
        ConnectionResponse { status_code: 200, body: body.map(|b| b.to_string()) }
    }

    pub fn error(status_code: u16, code: &str, message: &str) -> Self {
        ConnectionResponse { status_code, body: Some(json!({"error": {"code": code, "message": message}}).to_string()) }
    }
}

/// Serves a parsed request.
pub async fn serve(
    store: &ConnectionStore,
    connection_id: Option<&str>,
    request: &ConnectionRequest,
    now: SystemTime,
) -> ConnectionResponse {
    serve_as(store, connection_id, request, now, &store.access.iam(None)).await
}

/// One route of a connection whose `$connect` came from `caller` (the authorizer's, or the IAM
/// identity's): `$connect` records it, and every later message is judged by what it recorded.
pub async fn serve_as(
    store: &ConnectionStore,
    connection_id: Option<&str>,
    request: &ConnectionRequest,
    now: SystemTime,
    caller: &Caller,
) -> ConnectionResponse {
    let Some(connection_id) = connection_id.filter(|id| !id.is_empty()) else {
        return ConnectionResponse::error(400, "INVALID_REQUEST", "the request has no connectionId");
    };
    let route_key = match request {
        ConnectionRequest::Connect => "$connect",
        ConnectionRequest::Disconnect => "$disconnect",
        ConnectionRequest::Subscribe(_) => "subscribe",
        ConnectionRequest::Unsubscribe(_) => "unsubscribe",
    };
    let result = match request {
        ConnectionRequest::Connect => match store.connect_as(connection_id, now, caller).await {
            Ok(Connected::Open) => Ok(None),
            Ok(Connected::OverCap(open)) => {
                return ConnectionResponse::error(
                    429,
                    "TOO_MANY_CONNECTIONS",
                    &format!(
                        "this principal has {open} open connections, at most {} (MAX_CONNECTIONS_PER_PRINCIPAL); close one first",
                        store.max_connections_per_principal
                    ),
                );
            }
            Err(e) => Err(e),
        },
        ConnectionRequest::Disconnect => store.disconnect(connection_id).await.map(|_| None),
        ConnectionRequest::Subscribe(topics) => subscribe_authorized(store, connection_id, topics, now).await,
        ConnectionRequest::Unsubscribe(topics) => store
            .unsubscribe(connection_id, topics)
            .await
            .map(|()| Some(json!({"unsubscribed": topics.iter().map(Topic::to_string).collect::<Vec<_>>()}))),
    };
    match result {
        Ok(body) => ConnectionResponse::ok(body),
        Err(err) => {
            warn!(connection_id, route_key, error = %err, "connections table update failed");
            ConnectionResponse::error(500, "INTERNAL", "the subscription could not be recorded; try again")
        }
    }
}

/// A subscribe judged by the caller the connection's `$connect` recorded: the topics it may not follow are
/// refused with the reason, beside those over the cap.
async fn subscribe_authorized(
    store: &ConnectionStore,
    connection_id: &str,
    topics: &[Topic],
    now: SystemTime,
) -> Result<Option<Value>, StoreError> {
    // A connection without its own item (it never connected, or is gone) is nobody: it may follow nothing
    // the policy keeps for someone.
    let caller = store.caller_of(connection_id).await?.unwrap_or_else(Caller::nobody);
    let (allowed, mut refused) = store.authorize(&caller, topics).await?;
    if !refused.is_empty() {
        info!(
            connection_id,
            principal = caller.principal.as_deref().unwrap_or("-"),
            refused = refused.len(),
            "subscribe: topics not allowed"
        );
    }
    let mut outcome = if allowed.is_empty() {
        SubscribeOutcome::default()
    } else {
        store.subscribe(connection_id, &allowed, now).await?
    };
    outcome.refused.append(&mut refused);
    Ok(Some(json!({"subscribed": outcome.subscribed, "refused": outcome.refused})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse() {
        assert_eq!(parse_request("$connect", None), Ok(ConnectionRequest::Connect));
        assert_eq!(parse_request("$disconnect", None), Ok(ConnectionRequest::Disconnect));
        assert_eq!(
            parse_request(
                "subscribe",
                Some(r#"{"action": "subscribe", "topics": ["entity:service-a-data:A", "tx:T1"]}"#)
            ),
            Ok(ConnectionRequest::Subscribe(vec![Topic::entity("service-a-data", "A"), Topic::transaction("T1")]))
        );
        assert_eq!(
            parse_request("$default", Some(r#"{"action": "unsubscribe", "topics": ["tx:T1"]}"#)),
            Ok(ConnectionRequest::Unsubscribe(vec![Topic::transaction("T1")]))
        );
    }

    #[test]
    fn bad_messages_say_what_is_wrong() {
        let cases = [
            ("subscribe", None, "no body"),
            ("subscribe", Some("nope"), "not JSON"),
            ("subscribe", Some("[]"), "JSON object"),
            ("subscribe", Some(r#"{"action": "subscribe"}"#), "topics is missing"),
            ("subscribe", Some(r#"{"action": "subscribe", "topics": []}"#), "topics is empty"),
            ("subscribe", Some(r#"{"action": "subscribe", "topics": "tx:1"}"#), "array"),
            ("subscribe", Some(r#"{"action": "subscribe", "topics": ["tx:1", 5]}"#), "topics[1] is not a string"),
            ("subscribe", Some(r#"{"action": "subscribe", "topics": ["tx:1", "bogus"]}"#), "topics[1] \"bogus\""),
            ("subscribe", Some(r#"{"action": "unsubscribe", "topics": ["tx:1"]}"#), "does not match"),
            ("$default", Some(r#"{"action": "dance", "topics": ["tx:1"]}"#), "unknown action"),
            ("$default", Some(r#"{"topics": ["tx:1"]}"#), "action is missing"),
        ];
        for (route, body, expected) in cases {
            let err = parse_request(route, body).unwrap_err();
            assert!(err.message.contains(expected), "{route} {body:?}: {}", err.message);
        }
        let many: Vec<String> = (0..=MAX_TOPICS_PER_MESSAGE).map(|i| format!("tx:{i}")).collect();
        let body = json!({"action": "subscribe", "topics": many}).to_string();
        assert!(parse_request("subscribe", Some(&body)).unwrap_err().message.contains("at most 100"));
    }
}
