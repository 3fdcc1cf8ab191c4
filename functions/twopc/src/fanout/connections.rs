//! The WebSocket connections table: `$connect` records a connection, `subscribe`/`unsubscribe` add
//! and remove (connection, topic) items, `$disconnect` (or a Gone push) deletes them all. The
//! `by-topic` index finds a topic's subscribers.
//!
//! Every item carries `expireAt` (TTL): API Gateway closes a WebSocket connection after two hours at
//! most, so an item a lost `$disconnect` left behind goes within a day.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, PutRequest, WriteRequest};
use serde_json::{Value, json};
use tracing::warn;

use super::lake::RetryPolicy;
use super::realtime::{StoreError, Subscriptions};
use super::topic::Topic;
use crate::tables::{TOPIC_INDEX, connection_attr};

/// Topics one subscribe or unsubscribe message may name.
pub const MAX_TOPICS_PER_MESSAGE: usize = 100;
/// How long connection and subscription items live without a `$disconnect`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// BatchWriteItem takes 25 requests per call.
const BATCH_WRITE_LIMIT: usize = 25;

/// The connections table on DynamoDB.
#[derive(Debug, Clone)]
pub struct ConnectionStore {
    client: Client,
    table: String,
    ttl: Duration,
    retry: RetryPolicy,
}

impl ConnectionStore {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        ConnectionStore { client, table: table.into(), ttl: DEFAULT_TTL, retry: RetryPolicy::default() }
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

    /// `$connect`: the item that records the connection.
    pub async fn connect(&self, connection_id: &str, now: SystemTime) -> Result<(), StoreError> {
        let mut item = Self::key(connection_id, connection_attr::CONNECTION_TOPIC);
        let millis = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
        item.insert(connection_attr::CONNECTED_AT.to_owned(), AttributeValue::N(millis.to_string()));
        item.insert(connection_attr::EXPIRE_AT.to_owned(), self.expire_at(now));
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| StoreError::new("PutItem", &self.table, e))?;
        Ok(())
    }

    /// One item per (connection, topic); subscribing twice is harmless.
    pub async fn subscribe(&self, connection_id: &str, topics: &[Topic], now: SystemTime) -> Result<(), StoreError> {
        let requests = distinct(topics)
            .into_iter()
            .map(|topic| {
                let mut item = Self::key(connection_id, &topic);
                item.insert(connection_attr::EXPIRE_AT.to_owned(), self.expire_at(now));
                let put = PutRequest::builder().set_item(Some(item)).build().expect("item is set");
                WriteRequest::builder().put_request(put).build()
            })
            .collect();
        self.batch_write(requests).await
    }

    pub async fn unsubscribe(&self, connection_id: &str, topics: &[Topic]) -> Result<(), StoreError> {
        let requests = distinct(topics).into_iter().map(|topic| delete_request(connection_id, &topic)).collect();
        self.batch_write(requests).await
    }

    /// `$disconnect`: the connection item and every subscription. Answers how many items went.
    pub async fn disconnect(&self, connection_id: &str) -> Result<usize, StoreError> {
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

    /// BatchWriteItem in calls of 25, resending unprocessed items with backoff, a bounded number of times.
    async fn batch_write(&self, requests: Vec<WriteRequest>) -> Result<(), StoreError> {
        for chunk in requests.chunks(BATCH_WRITE_LIMIT) {
            let mut pending = chunk.to_vec();
            let mut attempt = 0;
            while !pending.is_empty() {
                attempt += 1;
                if attempt > 1 {
                    if attempt > self.retry.max_attempts.max(1) + 3 {
                        return Err(StoreError::internal(
                            "BatchWriteItem",
                            &self.table,
                            format!("{} writes still unprocessed after {} tries", pending.len(), attempt - 1),
                        ));
                    }
                    tokio::time::sleep(self.retry.delay(attempt - 1)).await;
                }
                let output = self
                    .client
                    .batch_write_item()
                    .request_items(&self.table, pending)
                    .send()
                    .await
                    .map_err(|e| StoreError::new("BatchWriteItem", &self.table, e))?;
                pending =
                    output.unprocessed_items().and_then(|items| items.get(&self.table)).cloned().unwrap_or_default();
            }
        }
        Ok(())
    }
}

fn delete_request(connection_id: &str, topic: &str) -> WriteRequest {
    let delete =
        DeleteRequest::builder().set_key(Some(ConnectionStore::key(connection_id, topic))).build().expect("key is set");
    WriteRequest::builder().delete_request(delete).build()
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
        ConnectionRequest::Connect => store.connect(connection_id, now).await.map(|()| None),
        ConnectionRequest::Disconnect => store.disconnect(connection_id).await.map(|_| None),
        ConnectionRequest::Subscribe(topics) => store
            .subscribe(connection_id, topics, now)
            .await
            .map(|()| Some(json!({"subscribed": topics.iter().map(Topic::to_string).collect::<Vec<_>>()}))),
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
