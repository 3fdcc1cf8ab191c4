//! A connection's topics: `subscribe` adds (connection, topic) items and `unsubscribe` deletes them,
//! under the connection's cap.
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

use std::collections::HashSet;
use std::time::SystemTime;

use aws_sdk_dynamodb::types::AttributeValue;
use tracing::{info, warn};
use twopc::expr::{Expr, n};
use twopc::store::write::{Sending, Write, Written, conditional};
use twopc::tables::connection_attr;

use super::{ConnectionStore, Refused, SubscribeOutcome, delete_request, number};
use crate::realtime::StoreError;
use crate::topic::Topic;

/// Topics one `TransactWriteItems` changes: its 100 actions, less the connection's counter.
const TOPICS_PER_TRANSACTION: usize = 99;

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

impl ConnectionStore {
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
