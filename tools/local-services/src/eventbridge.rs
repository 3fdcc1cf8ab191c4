//! An EventBridge endpoint: AWS JSON 1.1, `X-Amz-Target: AWSEvents.PutEvents`, as `aws-sdk-eventbridge`
//! speaks it. Each accepted entry becomes one NDJSON line, EventBridge's envelope (`version`, `id`,
//! `detail-type`, `source`, `time`, `resources`, `detail`), given to a [`RecordSink`] with the bus's name
//! (the local stack keeps them in `.local/events/`); tests can make chosen entries or whole calls fail.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Server;
use crate::firehose::RecordSink;

/// EventBridge's limits, enforced as the service does (400 `ValidationException`).
pub const MAX_ENTRIES_PER_CALL: usize = 10;
pub const MAX_BYTES_PER_CALL: usize = 256 * 1024;

const TARGET: &str = "AWSEvents.PutEvents";

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    source: Option<String>,
    detail_type: Option<String>,
    detail: Option<String>,
    event_bus_name: Option<String>,
    #[serde(default)]
    resources: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct PutEventsInput {
    entries: Vec<Entry>,
}

#[derive(Default)]
struct Faults {
    /// Calls still to fail with HTTP 500 `InternalException`.
    calls: usize,
    /// (text an entry's detail contains, failures left): answered `InternalFailure` within a 200.
    entries: Vec<(String, usize)>,
}

struct Shared {
    sink: Arc<dyn RecordSink>,
    faults: Mutex<Faults>,
    next_id: AtomicU64,
    calls: AtomicU64,
}

/// A running EventBridge endpoint on 127.0.0.1. Stops when dropped.
pub struct EventBridge {
    server: Server,
    shared: Arc<Shared>,
}

impl EventBridge {
    /// Binds a free port of 127.0.0.1 and serves until dropped. Call inside a Tokio runtime.
    pub async fn start(sink: impl RecordSink) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            sink: Arc::new(sink),
            faults: Mutex::new(Faults::default()),
            next_id: AtomicU64::new(1),
            calls: AtomicU64::new(0),
        });
        let app = Router::new().route("/", axum::routing::post(handle)).with_state(shared.clone());
        let server = Server::start("127.0.0.1:0", app).await?;
        Ok(EventBridge { server, shared })
    }

    /// `http://127.0.0.1:PORT`, for `endpoint_url`.
    pub fn url(&self) -> &str {
        self.server.url()
    }

    /// The next `n` calls answer HTTP 500 `InternalException` and accept nothing.
    pub fn fail_next_calls(&self, n: usize) {
        self.shared.faults.lock().expect("not poisoned").calls += n;
    }

    /// Entries whose detail contains `needle` are answered `InternalFailure` (within a 200 whose
    /// `FailedEntryCount` counts them), `times` times.
    pub fn fail_entries_containing(&self, needle: &str, times: usize) {
        self.shared.faults.lock().expect("not poisoned").entries.push((needle.to_owned(), times));
    }

    /// Calls answered so far.
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(Ordering::Relaxed)
    }
}

fn answer(status: StatusCode, body: Value) -> Response {
    let error_type = body.get("__type").and_then(Value::as_str).map(str::to_owned);
    let mut response = (status, body.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-amz-json-1.1"));
    if let Some(value) = error_type.and_then(|t| HeaderValue::from_str(&t).ok()) {
        headers.insert("x-amzn-ErrorType", value);
    }
    response
}

fn error(status: StatusCode, error_type: &str, message: &str) -> Response {
    answer(status, json!({"__type": error_type, "message": message}))
}

async fn handle(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    shared.calls.fetch_add(1, Ordering::Relaxed);
    let target = headers.get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or_default();
    if target != TARGET {
        return error(StatusCode::BAD_REQUEST, "UnknownOperationException", &format!("{target:?} is not served here"));
    }
    let input = match serde_json::from_slice::<PutEventsInput>(&body) {
        Ok(input) => input,
        Err(e) => return error(StatusCode::BAD_REQUEST, "SerializationException", &e.to_string()),
    };
    if input.entries.is_empty() || input.entries.len() > MAX_ENTRIES_PER_CALL {
        let message = format!("{} entries; a call takes 1 to {MAX_ENTRIES_PER_CALL}", input.entries.len());
        return error(StatusCode::BAD_REQUEST, "ValidationException", &message);
    }
    if body.len() > MAX_BYTES_PER_CALL {
        let message = format!("{} bytes; a call takes at most {MAX_BYTES_PER_CALL}", body.len());
        return error(StatusCode::BAD_REQUEST, "ValidationException", &message);
    }
    let mut faults = shared.faults.lock().expect("not poisoned");
    if faults.calls > 0 {
        faults.calls -= 1;
        return error(StatusCode::INTERNAL_SERVER_ERROR, "InternalException", "injected: try again");
    }
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut answered = Vec::with_capacity(input.entries.len());
    // bus → its accepted lines, in order
    let mut accepted: Vec<(String, Vec<u8>)> = Vec::new();
    for entry in &input.entries {
        let (Some(source), Some(detail_type), Some(detail)) = (&entry.source, &entry.detail_type, &entry.detail) else {
            answered.push(
                json!({"ErrorCode": "InvalidArgument", "ErrorMessage": "Source, DetailType and Detail are required"}),
            );
            continue;
        };
        let detail = match serde_json::from_str::<Value>(detail) {
            Ok(detail) if detail.is_object() => detail,
            _ => {
                answered.push(json!({"ErrorCode": "MalformedDetail", "ErrorMessage": "Detail is not a JSON object"}));
                continue;
            }
        };
        let text = detail.to_string();
        if let Some(fault) =
            faults.entries.iter_mut().find(|(needle, left)| *left > 0 && text.contains(needle.as_str()))
        {
            fault.1 -= 1;
            answered.push(json!({"ErrorCode": "InternalFailure", "ErrorMessage": "injected: try again"}));
            continue;
        }
        let id = format!("{:08x}-local-{:012}", std::process::id(), shared.next_id.fetch_add(1, Ordering::Relaxed));
        let bus = entry.event_bus_name.clone().unwrap_or_else(|| "default".to_owned());
        let envelope = json!({
            "version": "0", "id": id, "detail-type": detail_type, "source": source,
            "account": "000000000000", "time": now, "region": "us-east-1",
            "resources": entry.resources, "detail": detail,
        });
        let mut line = envelope.to_string().into_bytes();
        line.push(b'\n');
        accepted.push((bus, line));
        answered.push(json!({"EventId": id}));
    }
    drop(faults);
    let buses: std::collections::BTreeSet<&str> = accepted.iter().map(|(bus, _)| bus.as_str()).collect();
    for bus in buses {
        let lines: Vec<Vec<u8>> = accepted.iter().filter(|(b, _)| b == bus).map(|(_, line)| line.clone()).collect();
        if let Err(e) = shared.sink.accept(bus, &lines) {
            return error(StatusCode::INTERNAL_SERVER_ERROR, "InternalException", &format!("sink: {e}"));
        }
    }
    let failed = answered.iter().filter(|e| e.get("ErrorCode").is_some()).count();
    answer(StatusCode::OK, json!({"FailedEntryCount": failed, "Entries": answered}))
}
