//! The WebSocket API: follow entities and transactions, receive their commits and outcomes as typed
//! pushes.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::{SinkExt, Stream};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::Error;
use crate::answer::{ApiError, Status};

/// Topic names.
pub mod topic {
    /// `entity:<table>:<entityId>`: every commit that changes the item.
    pub fn entity(table: &str, entity_id: &str) -> String {
        format!("entity:{table}:{entity_id}")
    }
    /// `tx:<transactionId>`: the transaction's outcome when it ends (and, for a held one, first its
    /// `PREPARED` with `holdUntil`).
    pub fn transaction(transaction_id: &str) -> String {
        format!("tx:{transaction_id}")
    }
}

crate::answer::code_enum! {
    /// What a commit did to the item.
    Change {
        Insert = "INSERT",
        Modify = "MODIFY",
        Remove = "REMOVE",
    }
}

/// A committed change (`{"type": "commit", ...}`), with the fields of its lake record.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Commit {
    /// Delivery is at least once: the same change may come twice, with the same `event_id`.
    pub event_id: String,
    pub transaction_id: String,
    pub service: String,
    pub table: String,
    pub key: Map<String, Value>,
    pub change: Change,
    /// The item's version after the commit.
    pub version: u64,
    /// RFC 3339.
    pub committed_at: String,
    /// The item's data after the commit; null for a removal, and when [`images_omitted`](Self::images_omitted).
    #[serde(default)]
    pub data: Value,
    /// The data before; null for an insert, and when [`images_omitted`](Self::images_omitted).
    #[serde(default)]
    pub previous: Value,
    /// True when the change was too large for a WebSocket message (128 KiB) and came without `data`
    /// and `previous`: read the item (at least at `version`) for its data.
    #[serde(default)]
    pub images_omitted: bool,
}

/// A topic a subscribe did not take (`{"topic", "reason"}` in the answer's `refused`), for example
/// over the per-connection cap.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RefusedTopic {
    pub topic: String,
    pub reason: String,
}

/// A message of the WebSocket API. A later version may add variants (a match needs a wildcard arm).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Push {
    /// A commit that changed a followed entity (boxed: it is much the largest message).
    Commit(Box<Commit>),
    /// A followed transaction ended (`COMMITTED` or `ABORTED`), or, before its end, was held
    /// (`PREPARED`, with `hold_until`: it waits for its caller's commit or abort until then).
    ///
    /// A request the coordinator retried (refused for contention) runs as several attempts; `tx:<id>` of
    /// its first attempt hears each later attempt's push too, with `first_transaction_id`. An attempt that
    /// was retried carries `retried_as`: its end is not the request's ([`Push::ends_request`]).
    /// A later version may add fields (a pattern needs `..`).
    #[non_exhaustive]
    Transaction {
        transaction_id: String,
        status: Status,
        /// A held transaction's deadline (epoch milliseconds), in its `PREPARED` push.
        hold_until: Option<u64>,
        /// An attempt after the first: its request's first attempt's id (the `tx:` topic it was heard on).
        first_transaction_id: Option<String>,
        /// An attempt its coordinator retried: the next attempt's id.
        retried_as: Option<String>,
    },
    /// Acknowledges a subscription: the connections function's answer, which the `subscribe` route
    /// sends back (its route response), locally and deployed.
    Subscribed(Vec<String>),
    /// Topics a subscribe refused, each with the reason (more than the connection may follow). It
    /// comes right after the [`Push::Subscribed`] of the same answer (which lists the topics taken),
    /// and only when something was refused; see [`Push::parse_all`].
    Refused(Vec<RefusedTopic>),
    Unsubscribed(Vec<String>),
    /// A message the API refused (a malformed topic, for example); local stack only, as above.
    Error(ApiError),
    /// A message this version of the client does not know.
    Other(Value),
}

impl Push {
    /// Every push one message holds, in order: one, except for a subscribe answer that refused
    /// topics, which gives [`Push::Subscribed`] (the topics taken) and then [`Push::Refused`].
    /// [`Subscription`] yields them all.
    pub fn parse_all(text: &str) -> Result<Vec<Push>, Error> {
        let first = Push::parse(text)?;
        if !matches!(first, Push::Subscribed(_)) {
            return Ok(vec![first]);
        }
        let value: Value = serde_json::from_str(text).expect("parsed above");
        let refused = match value.get("refused") {
            None | Some(Value::Null) => Vec::new(),
            Some(refused) => serde_json::from_value::<Vec<RefusedTopic>>(refused.clone())
                .map_err(|e| Error::Push { message: format!("refused: {e}"), text: text.to_owned() })?,
        };
        Ok(if refused.is_empty() { vec![first] } else { vec![first, Push::Refused(refused)] })
    }

    /// The first push of a message (see [`Push::parse_all`] for a subscribe answer that refused
    /// topics: this gives only its [`Push::Subscribed`]).
    pub fn parse(text: &str) -> Result<Push, Error> {
        let invalid = |e: serde_json::Error| Error::Push { message: e.to_string(), text: text.to_owned() };
        let value: Value = serde_json::from_str(text).map_err(invalid)?;
        let strings = |v: &Value| serde_json::from_value::<Vec<String>>(v.clone()).ok();
        let push = match value["type"].as_str() {
            Some("commit") => Push::Commit(Box::new(serde_json::from_value(value).map_err(invalid)?)),
            Some("transaction") => match (value["transactionId"].as_str(), value["status"].as_str()) {
                (Some(id), Some(status)) => Push::Transaction {
                    transaction_id: id.to_owned(),
                    status: status.into(),
                    hold_until: value["holdUntil"].as_u64(),
                    first_transaction_id: value["firstTransactionId"].as_str().map(str::to_owned),
                    retried_as: value["retriedAs"].as_str().map(str::to_owned),
                },
                _ => Push::Other(value),
            },
            _ => {
                if let Some(topics) = value.get("subscribed").and_then(strings) {
                    Push::Subscribed(topics)
                } else if let Some(topics) = value.get("unsubscribed").and_then(strings) {
                    Push::Unsubscribed(topics)
                } else if let Some(error) = ApiError::from_value(&value) {
                    Push::Error(error)
                } else {
                    Push::Other(value)
                }
            }
        };
        Ok(push)
    }

    /// The outcome of the request whose first attempt is `request` (the id its `Idempotency-Key` gives,
    /// whose `tx:` topic the push came on): its final status (`COMMITTED` or `ABORTED`, or `PREPARED` for a
    /// held one) and the id of the attempt that reached it. `None` for anything else, an earlier attempt's
    /// end that was retried included.
    pub fn request_outcome(&self, request: &str) -> Option<(&str, &Status)> {
        match self {
            Push::Transaction { transaction_id, status, first_transaction_id, retried_as: None, .. }
                if transaction_id == request || first_transaction_id.as_deref() == Some(request) =>
            {
                Some((transaction_id, status))
            }
            _ => None,
        }
    }

    /// Whether this is a transaction's push that ends its request (or holds it): not an attempt that
    /// its coordinator retried.
    pub fn ends_request(&self) -> bool {
        matches!(self, Push::Transaction { retried_as: None, .. })
    }

    /// A transaction's push, built (the variant cannot be written out of this crate).
    pub fn transaction(transaction_id: impl Into<String>, status: Status, hold_until: Option<u64>) -> Push {
        Push::Transaction {
            transaction_id: transaction_id.into(),
            status,
            hold_until,
            first_transaction_id: None,
            retried_as: None,
        }
    }

    /// The transaction a commit or an outcome belongs to.
    pub fn transaction_id(&self) -> Option<&str> {
        match self {
            Push::Commit(c) => Some(&c.transaction_id),
            Push::Transaction { transaction_id, .. } => Some(transaction_id),
            _ => None,
        }
    }
}

/// An open connection to the WebSocket API: a [`Stream`] of pushes, and the subscriptions to change
/// what it follows.
pub struct Subscription {
    socket: WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>,
    /// Pushes of a message already read, not yet yielded (a subscribe answer's refusals).
    pending: std::collections::VecDeque<Push>,
}

/// Connects to `url` and follows `topics` (see [`topic`]).
pub async fn subscribe<T: Into<String>>(url: &str, topics: impl IntoIterator<Item = T>) -> Result<Subscription, Error> {
    let mut subscription = Subscription::connect(url).await?;
    subscription.subscribe(topics).await?;
    Ok(subscription)
}

impl Subscription {
    /// Connects to `ws://…` or `wss://…`; an IAM-authorized API needs the URL presigned
    /// ([`presign_websocket_url`](crate::presign_websocket_url)).
    pub async fn connect(url: &str) -> Result<Subscription, Error> {
        Self::connect_request(url, None).await
    }

    /// Connects with `Authorization: Bearer <token>`, for an API deployed with a JWT issuer (a browser,
    /// which cannot set the header, puts the token in the `token` query parameter instead).
    pub async fn connect_with_token(url: &str, token: &str) -> Result<Subscription, Error> {
        Self::connect_request(url, Some(token)).await
    }

    async fn connect_request(url: &str, token: Option<&str>) -> Result<Subscription, Error> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let connector = if url.starts_with("wss://") { Some(Connector::Rustls(crate::tls::config()?)) } else { None };
        let mut request = url.into_client_request().map_err(Error::WebSocket)?;
        if let Some(token) = token {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| Error::Url { url: url.to_owned(), message: "the token is not a header value".into() })?;
            request.headers_mut().insert("authorization", value);
        }
        let (socket, _) = tokio_tungstenite::connect_async_tls_with_config(request, None, false, connector)
            .await
            .map_err(Error::WebSocket)?;
        Ok(Subscription { socket, pending: Default::default() })
    }

    pub async fn subscribe<T: Into<String>>(&mut self, topics: impl IntoIterator<Item = T>) -> Result<(), Error> {
        self.send("subscribe", topics).await
    }

    pub async fn unsubscribe<T: Into<String>>(&mut self, topics: impl IntoIterator<Item = T>) -> Result<(), Error> {
        self.send("unsubscribe", topics).await
    }

    async fn send<T: Into<String>>(&mut self, action: &str, topics: impl IntoIterator<Item = T>) -> Result<(), Error> {
        let topics: Vec<String> = topics.into_iter().map(Into::into).collect();
        let message = json!({"action": action, "topics": topics});
        self.socket.send(Message::Text(message.to_string().into())).await.map_err(Error::WebSocket)
    }

    /// Closes the connection (the server then drops its subscriptions).
    pub async fn close(mut self) -> Result<(), Error> {
        self.socket.close(None).await.map_err(Error::WebSocket)
    }
}

impl Stream for Subscription {
    type Item = Result<Push, Error>;

    /// The next push; `None` once the connection is closed. Pings are answered by the socket itself.
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(push) = self.pending.pop_front() {
            return Poll::Ready(Some(Ok(push)));
        }
        loop {
            let text = match ready!(Pin::new(&mut self.socket).poll_next(cx)) {
                None | Some(Ok(Message::Close(_))) => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(Error::WebSocket(e)))),
                Some(Ok(Message::Text(text))) => text.as_str().to_owned(),
                Some(Ok(Message::Binary(bytes))) => String::from_utf8_lossy(&bytes).into_owned(),
                Some(Ok(_)) => continue,
            };
            return Poll::Ready(Some(match Push::parse_all(&text) {
                Ok(pushes) => {
                    let mut pushes = pushes.into_iter();
                    let first = pushes.next().expect("a message gives at least one push");
                    self.pending.extend(pushes);
                    Ok(first)
                }
                Err(e) => Err(e),
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_push_is_typed() {
        let commit = r#"{"type":"commit","eventId":"e1","transactionId":"tx-1","service":"service-a","table":"service-a-data","key":{"entityId":"A"},"change":"MODIFY","version":2,"committedAt":"2026-01-01T00:00:00Z","data":{"balance":70.5},"previous":{"balance":100},"later":true}"#;
        let Push::Commit(c) = Push::parse(commit).unwrap() else { panic!() };
        assert_eq!((c.change, c.version, c.key["entityId"].as_str()), (Change::Modify, 2, Some("A")));
        assert_eq!(c.data["balance"].to_string(), "70.5");
        let removed = r#"{"type":"commit","eventId":"e2","transactionId":"tx-1","service":"s","table":"t","key":{"entityId":"A"},"change":"REMOVE","version":3,"committedAt":"x","data":null,"previous":{"a":1}}"#;
        let Push::Commit(c) = Push::parse(removed).unwrap() else { panic!() };
        assert_eq!((c.change, c.data), (Change::Remove, Value::Null));
        assert!(!c.images_omitted, "a full commit has its images");
        // A commit too large for a WebSocket message: the same fields, no images, and the flag.
        let small = r#"{"type":"commit","eventId":"e3","transactionId":"tx-2","service":"s","table":"t","key":{"entityId":"A"},"change":"MODIFY","version":4,"committedAt":"x","imagesOmitted":true}"#;
        let Push::Commit(c) = Push::parse(small).unwrap() else { panic!() };
        assert!(c.images_omitted);
        assert_eq!((c.version, c.event_id.as_str(), c.transaction_id.as_str()), (4, "e3", "tx-2"));
        assert_eq!((c.data, c.previous), (Value::Null, Value::Null));
        assert_eq!(
            Push::parse(r#"{"type":"transaction","transactionId":"tx-1","status":"ABORTED"}"#).unwrap(),
            Push::transaction("tx-1", Status::Aborted, None)
        );
        // A held transaction's push, before its end.
        assert_eq!(
            Push::parse(
                r#"{"type":"transaction","transactionId":"tx-1","status":"PREPARED","holdUntil":1795440600000}"#
            )
            .unwrap(),
            Push::transaction("tx-1", Status::Prepared, Some(1_795_440_600_000))
        );
        assert_eq!(Push::parse(r#"{"subscribed":["tx:1"]}"#).unwrap(), Push::Subscribed(vec!["tx:1".into()]));
        assert_eq!(Push::parse(r#"{"unsubscribed":[]}"#).unwrap(), Push::Unsubscribed(vec![]));
        // A subscribe answer: the topics taken, and those refused with why (over the cap).
        let answer = r#"{"subscribed":["tx:1"],"refused":[{"topic":"tx:2","reason":"this connection follows 50 topics, at most 50 per connection"}]}"#;
        assert_eq!(Push::parse(answer).unwrap(), Push::Subscribed(vec!["tx:1".into()]));
        assert_eq!(
            Push::parse_all(answer).unwrap(),
            vec![
                Push::Subscribed(vec!["tx:1".into()]),
                Push::Refused(vec![RefusedTopic {
                    topic: "tx:2".into(),
                    reason: "this connection follows 50 topics, at most 50 per connection".into()
                }])
            ]
        );
        assert_eq!(
            Push::parse_all(r#"{"subscribed":["tx:1"],"refused":[]}"#).unwrap(),
            vec![Push::Subscribed(vec!["tx:1".into()])]
        );
        assert!(matches!(Push::parse_all(r#"{"subscribed":[],"refused":[{"topic":1}]}"#), Err(Error::Push { .. })));
        let Push::Error(e) =
            Push::parse(r#"{"error":{"code":"INVALID_REQUEST","message":"topics is empty"}}"#).unwrap()
        else {
            panic!()
        };
        assert_eq!(e.message, "topics is empty");
        assert_eq!(Push::parse(r#"{"type":"gossip"}"#).unwrap(), Push::Other(json!({"type": "gossip"})));
        assert!(matches!(Push::parse("not json"), Err(Error::Push { .. })));
    }
}
