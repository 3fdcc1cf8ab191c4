//! The live page at `/`: the items of each service with their live values, a transfer form and a raw
//! transaction form, held transactions ("decide later") with their `holdUntil` counting down and Approve /
//! Reject buttons, the transactions as they happen, the latest lake files, and, to the operators the
//! access policy names only, the operators' API (`/admin`: open and stuck transactions, a transaction's
//! detail, Retry and Abort). Its assets are built
//! into the binary (no network, no CDN). Every value it shows comes from the REST API and the
//! WebSocket API, as any client's would; the routes under `/local/` tell it where they are, list the
//! lake, which in AWS is a bucket, not an API, and read the services' items as they are now (in AWS,
//! each service reads its own table), so that an item shows its value before any commit reaches it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

const INDEX: &str = include_str!("../page/index.html");
const SCRIPT: &str = include_str!("../page/app.js");
const STYLE: &str = include_str!("../page/app.css");

/// How many items of each service `/local/items` lists (a page of a scan, in key-hash order).
pub(crate) const ITEMS_PER_SERVICE: i32 = 100;

/// How many lake files `/local/lake` lists, newest first, unless asked for fewer.
const LAKE_FILES: usize = 20;
/// How many outcome events `/local/events` lists, newest first.
const EVENTS_SHOWN: usize = 30;
/// How many of a file's records it shows (the last ones).
const LAKE_RECORDS_PER_FILE: usize = 20;

pub(crate) struct Page {
    /// The WebSocket API, `ws://127.0.0.1:PORT`.
    pub websocket: String,
    /// service → its data table (the entity topics name the table).
    pub tables: BTreeMap<String, String>,
    pub lake_dir: PathBuf,
    /// The outcome events the stand-in EventBridge bus keeps.
    pub events_dir: PathBuf,
    /// The services' tables, read by `/local/items`.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// The stand-in payment API, whose authorizations `/local/payments` lists.
    pub payment_api: Option<String>,
    /// Reads the payment API: made once, not per request.
    pub http: reqwest::Client,
    /// `--auth jwt`: the page signs in as a local user (`/local/token`).
    pub jwt: bool,
}

impl Page {
    /// The answer to `GET path`, or None when the path is not the page's.
    pub(crate) fn get(&self, path: &str, query: Option<&str>) -> Option<Response> {
        let asset = |content_type: &'static str, body: &'static str| {
            Some(([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response())
        };
        match path {
            "/" | "/index.html" => asset("text/html; charset=utf-8", INDEX),
            "/app.js" => asset("text/javascript; charset=utf-8", SCRIPT),
            "/app.css" => asset("text/css; charset=utf-8", STYLE),
            "/local/stack.json" => Some(no_store(json!({
                "websocket": self.websocket,
                "services": self.tables,
                // Services whose participant drives a resource: their table holds no items to show.
                "resources": self.tables.keys().filter(|s| crate::functions::participant_function(s) == "payments").collect::<Vec<_>>(),
                "auth": if self.jwt { Some("jwt") } else { None },
            }))),
            "/local/lake" => {
                let limit = query
                    .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("files=")))
                    .and_then(|n| n.parse::<usize>().ok())
                    .map_or(LAKE_FILES, |n| n.min(LAKE_FILES));
                Some(no_store(latest_lake_files(&self.lake_dir, limit)))
            }
            "/local/events" => Some(no_store(latest_events(&self.events_dir, EVENTS_SHOWN))),
            _ => None,
        }
    }
}

impl Page {
    /// `GET /local/payments`: the stand-in payment API's authorizations (what the payments service has
    /// authorized, captured and voided); in AWS, the payment provider's dashboard.
    pub(crate) async fn payments(&self) -> Response {
        let Some(api) = &self.payment_api else {
            return no_store(json!({"authorizations": []}));
        };
        let listed = async {
            let response = self.http.get(format!("{api}/v1/authorizations")).send().await.ok()?;
            response.json::<Value>().await.ok()
        };
        no_store(listed.await.unwrap_or_else(|| json!({"error": "the payment API did not answer"})))
    }

    /// `GET /local/items`: every service's items as they are now, each `{key, data, version}` (as the
    /// `entity:` pushes give them) and `lockedBy` while a transaction holds it; `more` when the table
    /// has more than `?limit=` (at most and by default [`ITEMS_PER_SERVICE`]). A service whose table cannot be read says why, alone.
    pub(crate) async fn items(&self, query: Option<&str>) -> Response {
        let limit = query
            .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("limit=")))
            .and_then(|n| n.parse::<i32>().ok())
            .map_or(ITEMS_PER_SERVICE, |n| n.clamp(1, ITEMS_PER_SERVICE));
        let reads = self.tables.iter().map(|(service, table)| async move {
            let read = self.dynamodb.scan().table_name(table).consistent_read(true).limit(limit).send().await;
            let listed = match read {
                Ok(page) => {
                    // A resource participant's barrier entries are the library's, not the service's items.
                    let items: Vec<Value> =
                        page.items().iter().filter(|item| !item.contains_key("barrier")).map(shown_item).collect();
                    json!({"table": table, "items": items, "more": page.last_evaluated_key().is_some()})
                }
                Err(e) => json!({
                    "table": table,
                    "error": aws_smithy_types::error::display::DisplayErrorContext(&e).to_string(),
                }),
            };
            (service.clone(), listed)
        });
        let services: serde_json::Map<String, Value> = futures::future::join_all(reads).await.into_iter().collect();
        no_store(json!({"services": services}))
    }
}

/// An item as the page shows it: its key, data and version, and the transaction that holds its lock.
fn shown_item(item: &std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>) -> Value {
    use twopc::tables::item_attr as a;
    let json = twopc::attr::item_to_json(item);
    let mut shown = json!({
        "key": {a::KEY: json.get(a::KEY).cloned().unwrap_or(Value::Null)},
        "data": json.get(a::DATA).cloned().unwrap_or(Value::Null),
        "version": json.get(a::VERSION).cloned().unwrap_or(json!(0)),
    });
    if let Some(holder) = json.get(a::LOCK).and_then(|lock| lock.get("transactionId")) {
        shown["lockedBy"] = holder.clone();
    }
    shown
}

fn no_store(body: Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")], body.to_string())
        .into_response()
}

/// The newest `limit` outcome events, newest first (each as EventBridge delivers it), and how many there are.
fn latest_events(dir: &Path, limit: usize) -> Value {
    let lines = local_services::firehose::LakeSink::read_lines(dir, None);
    let events: Vec<Value> =
        lines.iter().rev().take(limit).filter_map(|(_, line)| serde_json::from_str(line).ok()).collect();
    json!({"events": events, "total": lines.len()})
}

/// The newest `limit` files of the lake, newest first: each key (relative to the lake, as in the
/// bucket), size, line count and its last records.
fn latest_lake_files(dir: &Path, limit: usize) -> Value {
    let files = local_services::firehose::LakeSink::files(dir, None);
    let newest = files.iter().rev().take(limit).filter_map(|file| {
        let text = std::fs::read_to_string(file).ok()?;
        let lines: Vec<&str> = text.lines().collect();
        let records: Vec<Value> = lines
            .iter()
            .skip(lines.len().saturating_sub(LAKE_RECORDS_PER_FILE))
            .map(|line| serde_json::from_str(line).unwrap_or_else(|_| Value::String((*line).to_owned())))
            .collect();
        let key = file.strip_prefix(dir).unwrap_or(file).to_string_lossy().replace('\\', "/");
        Some(json!({"key": key, "bytes": text.len(), "lines": lines.len(), "records": records}))
    });
    json!({"files": newest.collect::<Vec<_>>(), "total": files.len()})
}
