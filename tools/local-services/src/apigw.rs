//! The API Gateway management API of a WebSocket API, as `aws-sdk-apigatewaymanagement` speaks it:
//! `POST /{stage}/@connections/{connectionId}` (PostToConnection), `GET` (GetConnection) and
//! `DELETE` (DeleteConnection), answering 410 `GoneException` for a connection that is not open.
//! Connections live in a [`ConnectionRegistry`]: in memory for tests, real WebSocket connections in
//! the local stack.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::Notify;

use crate::Server;

/// A connection that is not open (never was, or closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("connection is gone")]
pub struct Gone;

/// What GetConnection tells about a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    pub connected_at: chrono::DateTime<chrono::Utc>,
    pub last_active_at: chrono::DateTime<chrono::Utc>,
    pub source_ip: String,
    pub user_agent: String,
}

/// Open WebSocket connections. Calls must not block (queue the message and return).
pub trait ConnectionRegistry: Send + Sync + 'static {
    /// Sends `data` to the connection as one message.
    fn post(&self, connection_id: &str, data: Bytes) -> Result<(), Gone>;
    fn info(&self, connection_id: &str) -> Option<ConnectionInfo>;
    /// Closes the connection.
    fn close(&self, connection_id: &str) -> Result<(), Gone>;
}

#[derive(Debug)]
struct MemoryConnection {
    info: ConnectionInfo,
    messages: Vec<Bytes>,
}

/// Connections in memory: open one with [`MemoryRegistry::connect`], read what it received with
/// [`MemoryRegistry::messages`]. Clones share the same connections.
#[derive(Debug, Clone, Default)]
pub struct MemoryRegistry {
    connections: Arc<Mutex<HashMap<String, MemoryConnection>>>,
    /// Every message received, ever, per connection id (kept after a close).
    received: Arc<Mutex<HashMap<String, Vec<Bytes>>>>,
    changed: Arc<Notify>,
}

impl MemoryRegistry {
    pub fn connect(&self, connection_id: &str) {
        let now = chrono::Utc::now();
        let info = ConnectionInfo {
            connected_at: now,
            last_active_at: now,
            source_ip: "127.0.0.1".into(),
            user_agent: "local-services".into(),
        };
        self.connections
            .lock()
            .expect("not poisoned")
            .insert(connection_id.to_owned(), MemoryConnection { info, messages: Vec::new() });
    }

    pub fn is_open(&self, connection_id: &str) -> bool {
        self.connections.lock().expect("not poisoned").contains_key(connection_id)
    }

    /// Messages the connection received, in order (also after it closed).
    pub fn messages(&self, connection_id: &str) -> Vec<Bytes> {
        self.received.lock().expect("not poisoned").get(connection_id).cloned().unwrap_or_default()
    }

    /// The messages parsed as JSON.
    pub fn json(&self, connection_id: &str) -> Vec<serde_json::Value> {
        self.messages(connection_id).iter().map(|m| serde_json::from_slice(m).expect("a message is JSON")).collect()
    }

    /// Waits until `connection_id` has received at least `count` messages; false on timeout.
    pub async fn wait_for_messages(&self, connection_id: &str, count: usize, timeout: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.changed.notified();
                if self.messages(connection_id).len() >= count {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}

impl ConnectionRegistry for MemoryRegistry {
    fn post(&self, connection_id: &str, data: Bytes) -> Result<(), Gone> {
        let mut connections = self.connections.lock().expect("not poisoned");
        let connection = connections.get_mut(connection_id).ok_or(Gone)?;
        connection.info.last_active_at = chrono::Utc::now();
        connection.messages.push(data.clone());
        self.received.lock().expect("not poisoned").entry(connection_id.to_owned()).or_default().push(data);
        drop(connections);
        self.changed.notify_waiters();
        Ok(())
    }

    fn info(&self, connection_id: &str) -> Option<ConnectionInfo> {
        self.connections.lock().expect("not poisoned").get(connection_id).map(|c| c.info.clone())
    }

    fn close(&self, connection_id: &str) -> Result<(), Gone> {
        let removed = self.connections.lock().expect("not poisoned").remove(connection_id);
        self.changed.notify_waiters();
        removed.map(|_| ()).ok_or(Gone)
    }
}

/// A running management endpoint on 127.0.0.1. Stops when dropped.
pub struct ManagementApi {
    server: Server,
    endpoint: String,
}

struct Shared {
    stage: String,
    registry: Arc<dyn ConnectionRegistry>,
}

impl ManagementApi {
    /// Binds a free port of 127.0.0.1; `stage` is the path prefix (`local`, `prod`, ...).
    pub async fn start(registry: impl ConnectionRegistry, stage: &str) -> io::Result<Self> {
        Self::start_on(registry, stage, "127.0.0.1:0").await
    }

    pub async fn start_on(registry: impl ConnectionRegistry, stage: &str, addr: &str) -> io::Result<Self> {
        let shared = Arc::new(Shared { stage: stage.to_owned(), registry: Arc::new(registry) });
        let app = Router::new()
            .route(
                "/{stage}/@connections/{connection_id}",
                axum::routing::post(post_to_connection).get(get_connection).delete(delete_connection),
            )
            .with_state(shared);
        let server = Server::start(addr, app).await?;
        let endpoint = format!("{}/{stage}", server.url());
        Ok(ManagementApi { server, endpoint })
    }

    /// `http://127.0.0.1:PORT/{stage}`: the `WEBSOCKET_ENDPOINT` / `endpoint_url` of the management client.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn url(&self) -> &str {
        self.server.url()
    }
}

fn error(status: StatusCode, error_type: &str, message: &str) -> Response {
    let mut response = (status, json!({"__type": error_type, "message": message}).to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(value) = HeaderValue::from_str(error_type) {
        headers.insert("x-amzn-ErrorType", value);
    }
    response
}

fn gone() -> Response {
    error(StatusCode::GONE, "GoneException", "the connection is not open")
}

fn wrong_stage(shared: &Shared, stage: &str) -> Option<Response> {
    (stage != shared.stage).then(|| error(StatusCode::FORBIDDEN, "ForbiddenException", &format!("no stage {stage:?}")))
}

async fn post_to_connection(
    State(shared): State<Arc<Shared>>,
    Path((stage, connection_id)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    if let Some(response) = wrong_stage(&shared, &stage) {
        return response;
    }
    if body.len() > 128 * 1024 {
        return error(StatusCode::PAYLOAD_TOO_LARGE, "PayloadTooLargeException", "a message is at most 128 KiB");
    }
    match shared.registry.post(&connection_id, body) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(Gone) => gone(),
    }
}

async fn get_connection(
    State(shared): State<Arc<Shared>>,
    Path((stage, connection_id)): Path<(String, String)>,
) -> Response {
    if let Some(response) = wrong_stage(&shared, &stage) {
        return response;
    }
    match shared.registry.info(&connection_id) {
        Some(info) => {
            let at = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let body = json!({
                "connectedAt": at(info.connected_at),
                "lastActiveAt": at(info.last_active_at),
                "identity": {"sourceIp": info.source_ip, "userAgent": info.user_agent},
            });
            let mut response = (StatusCode::OK, body.to_string()).into_response();
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        None => gone(),
    }
}

async fn delete_connection(
    State(shared): State<Arc<Shared>>,
    Path((stage, connection_id)): Path<(String, String)>,
) -> Response {
    if let Some(response) = wrong_stage(&shared, &stage) {
        return response;
    }
    match shared.registry.close(&connection_id) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(Gone) => gone(),
    }
}
