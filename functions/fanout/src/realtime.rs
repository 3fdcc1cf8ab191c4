//! Best-effort push of messages to WebSocket subscribers.
//!
//! The subscribers of each topic are looked up once per batch; each connection then receives its
//! messages in stream order (one post after the other), and connections are served concurrently
//! with a bound. A connection that answers Gone is deleted with all its subscriptions; any other
//! failure is logged and counted. Nothing here can fail the batch.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;

use futures::StreamExt;
use tracing::{Instrument, Span, debug, warn};
use twopc::access::{Caller, Policy};

use super::topic::Topic;

/// Stream processor: the WebSocket API's management endpoint (named in [`twopc::environment`]).
pub use twopc::environment::WEBSOCKET_ENDPOINT;

/// Why a post did not reach its connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// 410: the connection is closed; it will never come back.
    #[error("connection is gone")]
    Gone,
    /// 413: the message is over API Gateway's limit ([`MAX_MESSAGE_BYTES`]).
    #[error("the message is too large for a WebSocket connection")]
    TooLarge,
    #[error("{0}")]
    Failed(String),
}

/// Sends one message to one WebSocket connection (`POST @connections/{id}`).
pub trait ConnectionPoster: Send + Sync {
    fn post(&self, connection_id: &str, payload: &[u8]) -> impl Future<Output = Result<(), PostError>> + Send;
}

/// A failure of the subscription store: the core's DynamoDB failure.
pub use twopc::store::StoreError;

/// Who follows what.
pub trait Subscriptions: Send + Sync {
    /// Connection ids subscribed to `topic`.
    fn subscribers(&self, topic: &Topic) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;
    /// Forgets a connection and all its subscriptions; answers how many items went.
    fn remove_connection(&self, connection_id: &str) -> impl Future<Output = Result<usize, StoreError>> + Send;
    /// Who each connection's caller is, as its `$connect` recorded it (a connection without a record of
    /// its own is not in the map: it is gone, and receives nothing).
    fn callers(
        &self,
        connection_ids: &[String],
    ) -> impl Future<Output = Result<HashMap<String, Caller>, StoreError>> + Send;
}

/// API Gateway's limit on one WebSocket message (PostToConnection answers 413 over it): 128 KiB.
pub const MAX_MESSAGE_BYTES: usize = 128 * 1024;

/// One message for the subscribers of one topic, and the record it comes from (the lines it logs
/// carry its event and transaction ids, in a span made only when there is something to log).
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: Topic,
    pub payload: Vec<u8>,
    pub event_id: String,
    pub transaction_id: String,
    /// `payload` is a commit without its images (`"imagesOmitted": true`).
    pub images_omitted: bool,
    /// For a commit sent whole: the same commit without its images, posted instead when the
    /// connection refuses `payload` as too large (413).
    pub without_images: Option<Vec<u8>>,
    /// A transaction's outcome: the principal that created it (who, besides admins, may receive it).
    pub owner: Option<String>,
}

impl Message {
    /// A message that is the same for every reader and has no smaller form (a transaction's outcome).
    pub fn new(topic: Topic, payload: Vec<u8>, event_id: String, transaction_id: String) -> Self {
        Message { topic, payload, event_id, transaction_id, images_omitted: false, without_images: None, owner: None }
    }

    /// The same message, for its owner (and admins) only.
    pub fn owned_by(self, owner: Option<String>) -> Self {
        Message { owner, ..self }
    }

    /// Whether `caller` may receive it: an item's commit if it may read the item, a transaction's
    /// outcome if it may see the transaction.
    pub fn may_reach(&self, access: &Policy, caller: &Caller) -> bool {
        match &self.topic {
            Topic::Entity { table, entity_id } => access.may_read(caller, table, entity_id),
            Topic::Transaction(_) => access.may_see(caller, self.owner.as_deref()),
        }
    }

    /// A commit: the full message when it fits in [`MAX_MESSAGE_BYTES`] (keeping the small one for a
    /// 413), else the small one. Never nothing: a subscriber always learns of the change.
    pub fn commit(
        topic: Topic,
        full: Vec<u8>,
        without_images: Vec<u8>,
        event_id: String,
        transaction_id: String,
    ) -> Self {
        if full.len() <= MAX_MESSAGE_BYTES {
            Message {
                topic,
                payload: full,
                event_id,
                transaction_id,
                images_omitted: false,
                without_images: Some(without_images),
                owner: None,
            }
        } else {
            Message {
                topic,
                payload: without_images,
                event_id,
                transaction_id,
                images_omitted: true,
                without_images: None,
                owner: None,
            }
        }
    }

    fn span(&self) -> Span {
        super::record_span(&self.event_id, Some(&self.transaction_id))
    }
}

/// What [`push`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RealtimeReport {
    pub messages: usize,
    pub posted: usize,
    /// Connections found Gone (and deleted, unless the delete failed too).
    pub gone: usize,
    pub failed: usize,
    /// Commits posted without their images (the full message was over the limit), counted in `posted`.
    pub images_omitted: usize,
    /// Topics whose subscribers could not be looked up (their messages were not sent).
    pub lookup_failed: usize,
    /// Deletes of gone connections that failed (the connection item expires by TTL anyway).
    pub remove_failed: usize,
}

/// The API Gateway management API (`aws-sdk-apigatewaymanagement`). Its endpoint is the WebSocket
/// API's `https://{api}.execute-api.{region}.amazonaws.com/{stage}` (`WEBSOCKET_ENDPOINT`).
#[derive(Debug, Clone)]
pub struct ApiGatewayPoster {
    client: aws_sdk_apigatewaymanagement::Client,
}

impl ApiGatewayPoster {
    pub fn new(client: aws_sdk_apigatewaymanagement::Client) -> Self {
        ApiGatewayPoster { client }
    }

    /// A client for `endpoint` built on the shared AWS configuration.
    pub fn from_config(sdk: &aws_config::SdkConfig, endpoint: &str) -> Self {
        let config = aws_sdk_apigatewaymanagement::config::Builder::from(sdk).endpoint_url(endpoint).build();
        Self::new(aws_sdk_apigatewaymanagement::Client::from_conf(config))
    }
}

impl ConnectionPoster for ApiGatewayPoster {
    async fn post(&self, connection_id: &str, payload: &[u8]) -> Result<(), PostError> {
        let result = self
            .client
            .post_to_connection()
            .connection_id(connection_id)
            .data(aws_sdk_apigatewaymanagement::primitives::Blob::new(payload.to_vec()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_gone_exception()) => Err(PostError::Gone),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_payload_too_large_exception()) => {
                Err(PostError::TooLarge)
            }
            Err(err) => Err(PostError::Failed(aws_smithy_types::error::display::DisplayErrorContext(&err).to_string())),
        }
    }
}

/// Pushes `messages` to their topics' subscribers; `concurrency` bounds lookups, connections served
/// at once and deletes.
///
/// `turn` says where in the (sorted) lists of topics and connections this call starts: the caller
/// gives a different one to each batch (see [`Rotation`]). Whatever the caller's budget cuts off is
/// then a different part of the lists each time, so no connection is the one always left out
/// (served in id order, the same connections missed every push of a busy topic).
pub async fn push<P, L>(
    poster: &P,
    subscriptions: &L,
    messages: &[Message],
    access: &Policy,
    concurrency: usize,
    turn: usize,
) -> RealtimeReport
where
    P: ConnectionPoster,
    L: Subscriptions,
{
    let concurrency = concurrency.max(1);
    let mut report = RealtimeReport { messages: messages.len(), ..RealtimeReport::default() };
    if messages.is_empty() {
        return report;
    }

    // Each topic once. The stream closures below take owned values (not references) so that the
    // whole future is `Send` (closures over borrowed arguments trip the compiler's higher-ranked
    // lifetime check), and the local stack can spawn it.
    let mut topics: Vec<Topic> = messages.iter().map(|m| m.topic.clone()).collect();
    topics.sort();
    topics.dedup();
    rotate(&mut topics, turn);
    let lookups: Vec<(Topic, Result<Vec<String>, StoreError>)> = futures::stream::iter(topics)
        .map(|topic: Topic| async move {
            let result = subscriptions.subscribers(&topic).await;
            (topic, result)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut subscribers: HashMap<Topic, Vec<String>> = HashMap::new();
    for (topic, result) in lookups {
        match result {
            Ok(ids) => {
                subscribers.insert(topic, ids);
            }
            Err(err) => {
                report.lookup_failed += 1;
                warn!(%topic, error = %err, "subscriber lookup failed; the topic's messages are not pushed");
            }
        }
    }

    // Per connection, its messages (indexes) in stream order.
    let mut per_connection: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (index, message) in messages.iter().enumerate() {
        for id in subscribers.get(&message.topic).into_iter().flatten() {
            per_connection.entry(id.clone()).or_default().push(index);
        }
    }

    // Authorized when sent, not only when subscribed: a `tx:` topic may be followed before its record
    // (and so its owner) exists. A connection whose caller cannot be looked up receives nothing.
    let ids: Vec<String> = per_connection.keys().cloned().collect();
    let callers = if ids.is_empty() { Ok(HashMap::new()) } else { subscriptions.callers(&ids).await };
    let callers = match callers {
        Ok(callers) => callers,
        Err(err) => {
            report.lookup_failed += 1;
            warn!(connections = ids.len(), error = %err, "subscribers' callers could not be looked up; nothing pushed");
            HashMap::new()
        }
    };
    per_connection.retain(|id, queue| match callers.get(id) {
        Some(caller) => {
            queue.retain(|&index| messages[index].may_reach(access, caller));
            !queue.is_empty()
        }
        None => false,
    });
    let mut per_connection: Vec<(String, Vec<usize>)> = per_connection.into_iter().collect();
    rotate(&mut per_connection, turn);
    let outcomes: Vec<(String, Served)> = futures::stream::iter(per_connection)
        .map(|(id, queue): (String, Vec<usize>)| async move {
            let mut served = Served::default();
            for index in queue {
                let message = &messages[index];
                // The SDK's own (debug) lines get the record's span too, when they are on at all.
                let span = || if tracing::enabled!(tracing::Level::DEBUG) { message.span() } else { Span::none() };
                let mut result = poster.post(&id, &message.payload).instrument(span()).await;
                let mut images_omitted = message.images_omitted;
                if let (Err(PostError::TooLarge), Some(smaller)) = (&result, &message.without_images) {
                    // Over the limit after all (API Gateway counts the frame, not just our bytes):
                    // the change still reaches the subscriber, without its images.
                    message.span().in_scope(|| {
                        debug!(connection_id = %id, bytes = message.payload.len(), "message refused as too large; sent without its images")
                    });
                    result = poster.post(&id, smaller).instrument(span()).await;
                    images_omitted = true;
                }
                match result {
                    Ok(()) => {
                        served.posted += 1;
                        served.images_omitted += usize::from(images_omitted);
                    }
                    Err(PostError::Gone) => {
                        message.span().in_scope(|| debug!(connection_id = %id, "connection gone"));
                        served.gone = true;
                        return (id, served);
                    }
                    Err(error) => {
                        served.failed += 1;
                        message.span().in_scope(
                            || warn!(connection_id = %id, %error, topic = %message.topic, bytes = message.payload.len(), "WebSocket push failed"),
                        );
                    }
                }
            }
            (id, served)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;

    let mut gone = Vec::new();
    for (id, served) in outcomes {
        report.posted += served.posted;
        report.failed += served.failed;
        report.images_omitted += served.images_omitted;
        if served.gone {
            gone.push(id);
        }
    }
    report.gone = gone.len();
    let removals: Vec<(String, Result<usize, StoreError>)> = futures::stream::iter(gone)
        .map(|id: String| async move {
            let result = subscriptions.remove_connection(&id).await;
            (id, result)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    for (id, result) in removals {
        match result {
            Ok(items) => debug!(connection_id = %id, items, "removed gone connection"),
            Err(err) => {
                report.remove_failed += 1;
                warn!(connection_id = %id, error = %err, "could not remove a gone connection");
            }
        }
    }
    report
}

/// What one connection's queue came to.
#[derive(Debug, Default)]
struct Served {
    posted: usize,
    failed: usize,
    images_omitted: usize,
    gone: bool,
}

/// Starts `items` at `turn` (modulo its length), keeping their order otherwise.
fn rotate<T>(items: &mut [T], turn: usize) {
    if !items.is_empty() {
        let len = items.len();
        items.rotate_left(turn % len);
    }
}

/// Where each batch starts serving ([`push`]'s `turn`): one step further each batch, from a random
/// start per process (so that Lambda's concurrent instances do not all favour the same connections).
/// Over `n` batches with the same `n` subscribers, each connection is first in line once, and among
/// the first `k` (what the budget allows) `k` times: everyone is served in turn.
#[derive(Debug)]
pub struct Rotation(std::sync::atomic::AtomicUsize);

impl Default for Rotation {
    fn default() -> Self {
        let seed = uuid::Uuid::new_v4().as_u128() as usize;
        Rotation(std::sync::atomic::AtomicUsize::new(seed))
    }
}

impl Rotation {
    /// This batch's turn; the next call answers the one after.
    pub fn next(&self) -> usize {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_starts_each_turn_one_further() {
        let mut items = vec![1, 2, 3, 4];
        rotate(&mut items, 5);
        assert_eq!(items, vec![2, 3, 4, 1]);
        let mut empty: Vec<u8> = Vec::new();
        rotate(&mut empty, 3);
        let rotation = Rotation::default();
        let first = rotation.next();
        assert_eq!(rotation.next(), first.wrapping_add(1));
    }
}
