//! A Firehose endpoint: AWS JSON 1.1, `X-Amz-Target: Firehose_20150804.PutRecordBatch` and
//! `Firehose_20150804.PutRecord`, as `aws-sdk-firehose` speaks it. Accepted records go to a
//! [`RecordSink`]; tests can make chosen entries or whole calls fail.

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Server;

/// Firehose's limits, enforced as the service does (400 `InvalidArgumentException`).
pub const MAX_RECORDS_PER_CALL: usize = 500;
pub const MAX_BYTES_PER_CALL: usize = 4 * 1024 * 1024;
pub const MAX_RECORD_BYTES: usize = 1000 * 1024;

const TARGET_PREFIX: &str = "Firehose_20150804.";

/// Where accepted records go. Called once per call with every accepted record, before the call is
/// answered: a record is acknowledged only once the sink has it. Must not block for long.
pub trait RecordSink: Send + Sync + 'static {
    fn accept(&self, stream: &str, records: &[Vec<u8>]) -> io::Result<()>;
}

/// (delivery stream, record data).
type Kept = Vec<(String, Vec<u8>)>;

/// Keeps records in memory, in arrival order. Clones share the same records.
#[derive(Debug, Clone, Default)]
pub struct MemorySink {
    records: Arc<Mutex<Kept>>,
}

impl MemorySink {
    /// (stream, record) in arrival order.
    pub fn records(&self) -> Vec<(String, Vec<u8>)> {
        self.records.lock().expect("not poisoned").clone()
    }

    /// Every record as a JSON value (records are NDJSON lines).
    pub fn json(&self) -> Vec<Value> {
        self.records().iter().map(|(_, data)| serde_json::from_slice(data).expect("a record is JSON")).collect()
    }

    pub fn len(&self) -> usize {
        self.records.lock().expect("not poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RecordSink for MemorySink {
    fn accept(&self, stream: &str, records: &[Vec<u8>]) -> io::Result<()> {
        let mut kept = self.records.lock().expect("not poisoned");
        kept.extend(records.iter().map(|r| (stream.to_owned(), r.clone())));
        Ok(())
    }
}

/// Writes each call's accepted records as one object under `dir`, the way Firehose writes S3:
/// `YYYY/MM/DD/HH/<stream>-<n>.ndjson` (UTC), records concatenated as sent (each record is a line).
/// `n` is a zero-padded number that only grows, so listing a folder lists objects in write order. A
/// file appears whole (written aside, then renamed).
#[derive(Debug)]
pub struct LakeSink {
    dir: PathBuf,
    next: AtomicU64,
}

impl LakeSink {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        // Starting from the clock keeps numbers growing across restarts of the local stack.
        let start = chrono::Utc::now().timestamp_micros().max(0) as u64;
        LakeSink { dir: dir.into(), next: AtomicU64::new(start) }
    }

    /// Every object under `dir` (written since `since`, if given), in write order: their keys sort so.
    pub fn files(dir: &Path, since: Option<std::time::SystemTime>) -> Vec<PathBuf> {
        let mut files = Vec::new();
        let mut folders = vec![dir.to_path_buf()];
        while let Some(folder) = folders.pop() {
            let Ok(entries) = fs::read_dir(&folder) else { continue };
            for entry in entries.flatten() {
                let path = entry.path();
                let recent = || since.is_none_or(|s| entry.metadata().and_then(|m| m.modified()).is_ok_and(|m| m >= s));
                if path.is_dir() {
                    folders.push(path);
                } else if path.extension().is_some_and(|e| e == "ndjson") && recent() {
                    files.push(path);
                }
            }
        }
        files.sort();
        files
    }

    /// Every line of every object under `dir` (written since `since`, if given), with its file, in write
    /// order: how a reader of the lake sees what this sink wrote.
    pub fn read_lines(dir: &Path, since: Option<std::time::SystemTime>) -> Vec<(PathBuf, String)> {
        let mut lines = Vec::new();
        for file in Self::files(dir, since) {
            let Ok(text) = fs::read_to_string(&file) else { continue };
            lines.extend(text.lines().map(|line| (file.clone(), line.to_owned())));
        }
        lines
    }

    /// The key an object written now would get.
    fn key(&self, stream: &str) -> PathBuf {
        let now = chrono::Utc::now();
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let safe: String = stream
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
            .collect();
        PathBuf::from(now.format("%Y/%m/%d/%H").to_string()).join(format!("{safe}-{n:020}.ndjson"))
    }
}

impl RecordSink for LakeSink {
    fn accept(&self, stream: &str, records: &[Vec<u8>]) -> io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let path = self.dir.join(self.key(stream));
        let folder = path.parent().expect("a key has folders");
        fs::create_dir_all(folder)?;
        let partial = path.with_extension("partial");
        fs::write(&partial, records.concat())?;
        fs::rename(&partial, &path)
    }
}

/// A fault for a whole call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallFault {
    /// HTTP 500 `ServiceUnavailableException`.
    ServiceUnavailable,
    /// Any status and error type, e.g. 400 `ResourceNotFoundException`.
    Error { status: u16, error_type: String, message: String },
}

type Matcher = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

struct EntryFault {
    matcher: Matcher,
    /// Failures left; None = every time.
    remaining: Option<usize>,
}

/// One call as the endpoint saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    pub operation: String,
    pub stream: String,
    pub records: usize,
    pub bytes: usize,
    /// HTTP status answered.
    pub status: u16,
    /// Entries answered with an error (within a 200).
    pub failed_entries: usize,
}

#[derive(Default)]
struct Faults {
    /// Every call fails (`ServiceUnavailableException`) until [`Firehose::heal`].
    outage: bool,
    calls: VecDeque<CallFault>,
    entries: Vec<EntryFault>,
}

struct Shared {
    sink: Arc<dyn RecordSink>,
    faults: Mutex<Faults>,
    log: Mutex<Vec<CallRecord>>,
    next_record_id: AtomicU64,
}

/// A running Firehose endpoint on 127.0.0.1. Stops when dropped.
pub struct Firehose {
    server: Server,
    shared: Arc<Shared>,
}

impl Firehose {
    /// Binds a free port of 127.0.0.1 and serves until dropped. Call inside a Tokio runtime.
    pub async fn start(sink: impl RecordSink) -> io::Result<Self> {
        Self::start_on(sink, "127.0.0.1:0").await
    }

    /// Same, on a given address (the local stack's fixed port).
    pub async fn start_on(sink: impl RecordSink, addr: &str) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            sink: Arc::new(sink),
            faults: Mutex::new(Faults::default()),
            log: Mutex::new(Vec::new()),
            next_record_id: AtomicU64::new(1),
        });
        let app = Router::new().route("/", axum::routing::post(handle)).with_state(shared.clone());
        let server = Server::start(addr, app).await?;
        Ok(Firehose { server, shared })
    }

    /// `http://127.0.0.1:PORT`, for `endpoint_url`.
    pub fn url(&self) -> &str {
        self.server.url()
    }

    /// The next `n` calls answer HTTP 500 `ServiceUnavailableException` and accept nothing.
    pub fn fail_next_calls(&self, n: usize) {
        self.fail_next_calls_with(n, CallFault::ServiceUnavailable);
    }

    pub fn fail_next_calls_with(&self, n: usize, fault: CallFault) {
        let mut faults = self.shared.faults.lock().expect("not poisoned");
        faults.calls.extend(std::iter::repeat_n(fault, n));
    }

    /// From now on every call answers HTTP 500 `ServiceUnavailableException` and accepts nothing,
    /// until [`Firehose::heal`]: an outage of unknown length.
    pub fn start_outage(&self) {
        self.shared.faults.lock().expect("not poisoned").outage = true;
    }

    /// Ends an outage and drops every pending fault: calls are answered normally again.
    pub fn heal(&self) {
        let mut faults = self.shared.faults.lock().expect("not poisoned");
        *faults = Faults::default();
    }

    /// Entries whose data contains `needle` answer `ServiceUnavailableException` (within a 200
    /// answer, `FailedPutCount` counting them): `times` times, or always when None.
    pub fn fail_entries_containing(&self, needle: impl AsRef<[u8]>, times: Option<usize>) {
        let needle = needle.as_ref().to_vec();
        self.fail_entries(move |data| data.windows(needle.len().max(1)).any(|w| w == needle.as_slice()), times);
    }

    /// Entries for which `matcher` holds fail, `times` times or always.
    pub fn fail_entries(&self, matcher: impl Fn(&[u8]) -> bool + Send + Sync + 'static, times: Option<usize>) {
        let mut faults = self.shared.faults.lock().expect("not poisoned");
        faults.entries.push(EntryFault { matcher: Arc::new(matcher), remaining: times });
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.shared.log.lock().expect("not poisoned").clone()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireRecord {
    data: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct PutRecordBatchInput {
    delivery_stream_name: String,
    records: Vec<WireRecord>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct PutRecordInput {
    delivery_stream_name: String,
    record: WireRecord,
}

fn error(status: StatusCode, error_type: &str, message: &str) -> Response {
    let body = json!({"__type": error_type, "message": message}).to_string();
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-amz-json-1.1"));
    if let Ok(value) = HeaderValue::from_str(error_type) {
        headers.insert("x-amzn-ErrorType", value);
    }
    response
}

fn ok(body: Value) -> Response {
    let mut response = (StatusCode::OK, body.to_string()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-amz-json-1.1"));
    response
}

fn invalid(message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, "InvalidArgumentException", message)
}

fn decode(records: &[WireRecord]) -> Result<Vec<Vec<u8>>, String> {
    records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            base64::engine::general_purpose::STANDARD
                .decode(&r.data)
                .map_err(|e| format!("Records[{i}].Data is not base64: {e}"))
        })
        .collect()
}

async fn handle(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let target = headers.get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let Some(operation) = target.strip_prefix(TARGET_PREFIX) else {
        return error(StatusCode::BAD_REQUEST, "UnknownOperationException", &format!("unknown target {target:?}"));
    };
    let (stream, data) = match operation {
        "PutRecordBatch" => match serde_json::from_slice::<PutRecordBatchInput>(&body) {
            Ok(input) => match decode(&input.records) {
                Ok(data) => (input.delivery_stream_name, data),
                Err(message) => return invalid(&message),
            },
            Err(e) => return error(StatusCode::BAD_REQUEST, "SerializationException", &e.to_string()),
        },
        "PutRecord" => match serde_json::from_slice::<PutRecordInput>(&body) {
            Ok(input) => match decode(std::slice::from_ref(&input.record)) {
                Ok(data) => (input.delivery_stream_name, data),
                Err(message) => return invalid(&message),
            },
            Err(e) => return error(StatusCode::BAD_REQUEST, "SerializationException", &e.to_string()),
        },
        other => {
            return error(StatusCode::BAD_REQUEST, "UnknownOperationException", &format!("{other} is not served here"));
        }
    };
    let bytes: usize = data.iter().map(Vec::len).sum();
    let mut call = CallRecord {
        operation: operation.to_owned(),
        stream: stream.clone(),
        records: data.len(),
        bytes,
        status: 200,
        failed_entries: 0,
    };
    let response = answer(&shared, operation, &stream, data, &mut call);
    call.status = response.status().as_u16();
    shared.log.lock().expect("not poisoned").push(call);
    response
}

fn answer(shared: &Shared, operation: &str, stream: &str, data: Vec<Vec<u8>>, call: &mut CallRecord) -> Response {
    if data.is_empty() || data.len() > MAX_RECORDS_PER_CALL {
        return invalid(&format!("{} records; a call takes 1 to {MAX_RECORDS_PER_CALL}", data.len()));
    }
    if call.bytes > MAX_BYTES_PER_CALL {
        return invalid(&format!("{} bytes; a call takes at most {MAX_BYTES_PER_CALL}", call.bytes));
    }
    if let Some(i) = data.iter().position(|d| d.len() > MAX_RECORD_BYTES) {
        return invalid(&format!("record {i} has {} bytes; at most {MAX_RECORD_BYTES}", data[i].len()));
    }
    // Decide every entry's fate first, then store the accepted ones, then answer.
    let mut accepted = Vec::with_capacity(data.len());
    let mut failed = vec![false; data.len()];
    {
        let mut faults = shared.faults.lock().expect("not poisoned");
        if faults.outage {
            return error(StatusCode::INTERNAL_SERVER_ERROR, "ServiceUnavailableException", "injected: outage");
        }
        if let Some(fault) = faults.calls.pop_front() {
            return match fault {
                CallFault::ServiceUnavailable => {
                    error(StatusCode::INTERNAL_SERVER_ERROR, "ServiceUnavailableException", "injected: try again")
                }
                CallFault::Error { status, error_type, message } => error(
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    &error_type,
                    &message,
                ),
            };
        }
        for (i, record) in data.iter().enumerate() {
            let hit = faults.entries.iter_mut().find(|f| f.remaining != Some(0) && (f.matcher)(record));
            match hit {
                Some(fault) => {
                    if let Some(left) = fault.remaining.as_mut() {
                        *left -= 1;
                    }
                    failed[i] = true;
                }
                None => accepted.push(record.clone()),
            }
        }
    }
    if let Err(e) = shared.sink.accept(stream, &accepted) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "ServiceUnavailableException", &format!("sink: {e}"));
    }
    call.failed_entries = failed.iter().filter(|f| **f).count();
    let mut responses = Vec::with_capacity(data.len());
    for is_failed in failed {
        if is_failed {
            responses.push(json!({"ErrorCode": "ServiceUnavailableException", "ErrorMessage": "injected: slow down"}));
        } else {
            let n = shared.next_record_id.fetch_add(1, Ordering::Relaxed);
            responses.push(json!({"RecordId": format!("{n:056}")}));
        }
    }
    if operation == "PutRecord" {
        return match responses.pop() {
            Some(entry) if entry.get("RecordId").is_some() => {
                ok(json!({"RecordId": entry["RecordId"], "Encrypted": false}))
            }
            _ => error(StatusCode::INTERNAL_SERVER_ERROR, "ServiceUnavailableException", "injected: slow down"),
        };
    }
    ok(json!({"FailedPutCount": call.failed_entries, "Encrypted": false, "RequestResponses": responses}))
}
