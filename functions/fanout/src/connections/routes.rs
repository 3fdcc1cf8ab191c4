//! The WebSocket API's routes (`$connect`, `$disconnect`, `subscribe`, `unsubscribe`, and `$default`
//! with the action in the body): a message read and checked ([`parse_request`]) before the table is
//! touched, served from the [`ConnectionStore`] ([`serve_as`]) and answered as API Gateway expects
//! ([`ConnectionResponse`]). Apart from the store because this is the untrusted edge (the fuzz target
//! `request_parser` runs it), and the connections function only maps the proxy event onto it.

use std::time::SystemTime;

use serde_json::{Value, json};
use tracing::{info, warn};
use twopc::access::Caller;

use super::{Connected, ConnectionStore, SubscribeOutcome};
use crate::realtime::StoreError;
use crate::topic::Topic;

/// Topics one subscribe or unsubscribe message may name.
pub const MAX_TOPICS_PER_MESSAGE: usize = 100;

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
