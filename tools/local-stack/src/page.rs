//! The live page at `/`: the items of each service with their live values, a transfer form and a raw
//! transaction form, the transactions as they happen, and the latest lake files. Its assets are built
//! into the binary (no network, no CDN). Every value it shows comes from the REST API and the
//! WebSocket API, as any client's would; the two routes under `/local/` tell it where they are and
//! list the lake, which in AWS is a bucket, not an API.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

const INDEX: &str = include_str!("../page/index.html");
const SCRIPT: &str = include_str!("../page/app.js");
const STYLE: &str = include_str!("../page/app.css");

/// How many lake files `/local/lake` lists, newest first, unless asked for fewer.
const LAKE_FILES: usize = 10;
/// How many of a file's records it shows (the last ones).
const LAKE_RECORDS_PER_FILE: usize = 20;

pub(crate) struct Page {
    /// The WebSocket API, `ws://127.0.0.1:PORT`.
    pub websocket: String,
    /// service → its data table (the entity topics name the table).
    pub tables: BTreeMap<String, String>,
    pub lake_dir: PathBuf,
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
            }))),
            "/local/lake" => {
                let limit = query
                    .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("files=")))
                    .and_then(|n| n.parse::<usize>().ok())
                    .map_or(LAKE_FILES, |n| n.min(LAKE_FILES));
                Some(no_store(latest_lake_files(&self.lake_dir, limit)))
            }
            _ => None,
        }
    }
}

fn no_store(body: Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")], body.to_string())
        .into_response()
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
