//! The WebSocket API: `$connect`, `$disconnect` and each message (routed by its `action`) go to the
//! connections function as API Gateway WebSocket proxy events; the `@connections` management
//! endpoint (`local_services::apigw`) pushes to the live connections kept in [`Registry`], and
//! answers 410 Gone for any other.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, rejection::WebSocketUpgradeRejection};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures::{SinkExt, StreamExt};
use local_services::apigw::{ConnectionInfo, ConnectionRegistry, Gone};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tracing::{debug, error, info, warn};

use crate::Functions;
use crate::events::{self, WebSocketConnection, WebSocketEvent};
use crate::functions::Authorized;
use crate::same_origin::SameOrigin;

/// The routes the WebSocket API declares besides `$connect` and `$disconnect`.
const ROUTES: [&str; 2] = ["subscribe", "unsubscribe"];

enum Outbound {
    Message(Bytes),
    Close,
}

struct Entry {
    sender: mpsc::UnboundedSender<Outbound>,
    info: ConnectionInfo,
}

/// The open WebSocket connections, by connection id.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    connections: Arc<Mutex<HashMap<String, Entry>>>,
    /// Sessions not yet finished (their `$disconnect` included).
    sessions: Arc<(AtomicUsize, Notify)>,
}

impl Registry {
    /// Closes every connection (as API Gateway does when the API goes away); each session then
    /// runs its `$disconnect`.
    pub(crate) fn close_all(&self) {
        for (_, entry) in self.connections.lock().expect("not poisoned").drain() {
            let _ = entry.sender.send(Outbound::Close);
        }
    }

    /// Waits until every session has finished, at most `timeout`.
    pub(crate) async fn wait_idle(&self, timeout: Duration) {
        let (count, changed) = &*self.sessions;
        let idle = async {
            loop {
                let notified = changed.notified();
                if count.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(timeout, idle).await;
    }

    fn insert(&self, id: &str, sender: mpsc::UnboundedSender<Outbound>, info: ConnectionInfo) {
        self.connections.lock().expect("not poisoned").insert(id.to_owned(), Entry { sender, info });
    }

    fn remove(&self, id: &str) {
        self.connections.lock().expect("not poisoned").remove(id);
    }
}

impl ConnectionRegistry for Registry {
    fn post(&self, connection_id: &str, data: Bytes) -> Result<(), Gone> {
        let mut connections = self.connections.lock().expect("not poisoned");
        let entry = connections.get_mut(connection_id).ok_or(Gone)?;
        entry.sender.send(Outbound::Message(data)).map_err(|_| Gone)?;
        entry.info.last_active_at = chrono::Utc::now();
        Ok(())
    }

    fn info(&self, connection_id: &str) -> Option<ConnectionInfo> {
        self.connections.lock().expect("not poisoned").get(connection_id).map(|e| e.info.clone())
    }

    fn close(&self, connection_id: &str) -> Result<(), Gone> {
        let entry = self.connections.lock().expect("not poisoned").remove(connection_id).ok_or(Gone)?;
        let _ = entry.sender.send(Outbound::Close);
        Ok(())
    }
}

struct Api {
    registry: Registry,
    functions: Arc<Functions>,
    stage: String,
    /// `--auth jwt`: `$connect` goes through the authorizer first.
    authorized: bool,
    same_origin: SameOrigin,
}

pub(crate) async fn serve(
    listener: TcpListener,
    registry: Registry,
    functions: Arc<Functions>,
    stage: String,
    authorized: bool,
    same_origin: SameOrigin,
) {
    let api = Api { registry, functions, stage, authorized, same_origin };
    let app = Router::new().fallback(upgrade).with_state(Arc::new(api));
    if let Err(e) = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await {
        error!(error = %e, "the WebSocket API stopped");
    }
}

/// An id shaped like API Gateway's (`L0SM9cOFvHcCIhw=`), URL-safe.
fn connection_id() -> String {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    format!("{}=", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes[..11]))
}

async fn upgrade(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    if let Err(refused) = api.same_origin.check_upgrade(&headers) {
        warn!(peer = %peer, "WebSocket handshake refused: {}", refused.message);
        let status = StatusCode::from_u16(refused.status).unwrap_or(StatusCode::FORBIDDEN);
        return (status, refused.message).into_response();
    }
    let ws = match ws {
        Ok(ws) => ws,
        Err(_) => {
            return (
                StatusCode::UPGRADE_REQUIRED,
                "This is the WebSocket API: connect with a WebSocket client (e.g. `websocat ws://127.0.0.1:3001`) and send {\"action\": \"subscribe\", \"topics\": [\"entity:service-a-data:A\", \"tx:<id>\"]}\n",
            )
                .into_response();
        }
    };
    let text = |name| headers.get(name).and_then(|v: &axum::http::HeaderValue| v.to_str().ok()).map(str::to_owned);
    let connect_headers: Vec<(String, String)> =
        headers.iter().map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect();
    // As API Gateway does: the `$connect` authorizer first (the token in the `token` query parameter or
    // the Authorization header); what it gives reaches every event of the connection.
    let authorizer = if api.authorized {
        let arn = events::method_arn(&api.stage, "$connect", "");
        let event = events::authorizer_event(&arn, &connect_headers, uri.query());
        match api.functions.authorize(&event).await {
            Ok(Authorized::Allow(fields)) => Some(fields),
            Ok(Authorized::Unauthorized) => return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response(),
            Ok(Authorized::Deny) => return (StatusCode::FORBIDDEN, "Forbidden").into_response(),
            Err(e) => {
                error!(error = %e, "the $connect authorizer failed");
                return (StatusCode::INTERNAL_SERVER_ERROR, "Internal server error").into_response();
            }
        }
    } else {
        None
    };
    let now = chrono::Utc::now();
    let connection = WebSocketConnection {
        connection_id: connection_id(),
        connected_at: now.timestamp_millis(),
        source_ip: peer.ip().to_string(),
        user_agent: text(header::USER_AGENT),
        domain: text(header::HOST).unwrap_or_else(|| "127.0.0.1".into()),
        stage: api.stage.clone(),
        authorizer,
    };
    let event = events::websocket_event(&connection, &WebSocketEvent::Connect { headers: connect_headers });
    // As API Gateway does: a $connect the function does not accept refuses the handshake.
    match api.functions.connections(&event).await {
        Ok(answer) if (200..300).contains(&answer.status) => {}
        Ok(answer) => {
            warn!(status = answer.status, "$connect refused");
            let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::FORBIDDEN);
            return (status, answer.body).into_response();
        }
        Err(e) => {
            error!(error = %e, "$connect failed");
            return (StatusCode::INTERNAL_SERVER_ERROR, "Internal server error").into_response();
        }
    }
    let info = ConnectionInfo {
        connected_at: now,
        last_active_at: now,
        source_ip: connection.source_ip.clone(),
        user_agent: connection.user_agent.clone().unwrap_or_default(),
    };
    ws.on_upgrade(move |socket| session(api, connection, info, socket))
}

async fn session(api: Arc<Api>, connection: WebSocketConnection, info: ConnectionInfo, socket: WebSocket) {
    api.registry.sessions.0.fetch_add(1, Ordering::SeqCst);
    run_session(&api, connection, info, socket).await;
    let (count, changed) = &*api.registry.sessions;
    count.fetch_sub(1, Ordering::SeqCst);
    changed.notify_waiters();
}

async fn run_session(api: &Api, connection: WebSocketConnection, info: ConnectionInfo, socket: WebSocket) {
    let id = connection.connection_id.clone();
    info!(connection_id = %id, "WebSocket connected");
    let (sender, mut outbound) = mpsc::unbounded_channel();
    api.registry.insert(&id, sender.clone(), info);
    let (mut sink, mut stream) = socket.split();
    let writer = tokio::spawn(async move {
        while let Some(out) = outbound.recv().await {
            let message = match out {
                Outbound::Message(data) => match String::from_utf8(data.to_vec()) {
                    Ok(text) => Message::Text(text.into()),
                    Err(_) => Message::Binary(data),
                },
                Outbound::Close => {
                    let _ = sink.send(Message::Close(Some(CloseFrame { code: 1000, reason: "".into() }))).await;
                    break;
                }
            };
            if sink.send(message).await.is_err() {
                break;
            }
        }
    });
    let mut closed = (1006u16, "Connection closed abnormally".to_owned());
    while let Some(message) = stream.next().await {
        let (body, base64) = match message {
            Ok(Message::Text(text)) => (text.to_string(), false),
            Ok(Message::Binary(data)) => (base64::engine::general_purpose::STANDARD.encode(&data), true),
            Ok(Message::Close(frame)) => {
                closed = frame.map_or((1005, String::new()), |f| (f.code, f.reason.to_string()));
                break;
            }
            Ok(_) => continue,
            Err(e) => {
                debug!(connection_id = %id, error = %e, "WebSocket read failed");
                break;
            }
        };
        let plain = if base64 { String::new() } else { body.clone() };
        let route_key = events::route_for_message(&plain, &ROUTES);
        let event = events::websocket_event(&connection, &WebSocketEvent::Message { route_key, body: &body, base64 });
        match api.functions.connections(&event).await {
            Ok(answer) => {
                info!(connection_id = %id, route_key, status = answer.status, "WebSocket message");
                // The function's answer goes back, as the deployed `subscribe` and `unsubscribe`
                // route responses send it: the subscription in place, the topics refused, or what
                // is wrong with the message. (Deployed, `$default` has no route response: the error
                // for an unknown action is heard only here.)
                if !answer.body.is_empty() {
                    let _ = sender.send(Outbound::Message(Bytes::from(answer.body)));
                }
            }
            Err(e) => {
                error!(connection_id = %id, route_key, error = %e, "the connections function failed");
                let reply = serde_json::json!({"message": "Internal server error", "connectionId": id});
                let _ = sender.send(Outbound::Message(Bytes::from(reply.to_string())));
            }
        }
    }
    api.registry.remove(&id);
    writer.abort();
    let event =
        events::websocket_event(&connection, &WebSocketEvent::Disconnect { status_code: closed.0, reason: &closed.1 });
    match api.functions.connections(&event).await {
        Ok(_) => info!(connection_id = %id, "WebSocket disconnected"),
        Err(e) => error!(connection_id = %id, error = %e, "$disconnect failed"),
    }
}
