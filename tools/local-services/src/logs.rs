//! A CloudWatch Logs endpoint over the outcome events a local bus kept (NDJSON files under a folder, as
//! [`crate::eventbridge`] writes them through a `LakeSink`): AWS JSON 1.1,
//! `X-Amz-Target: Logs_20140328.FilterLogEvents`, as `aws-sdk-cloudwatchlogs` speaks it. It stands in
//! for the log group a rule on the deployed bus writes every event to: each event is a log event whose
//! message is the event's JSON and whose timestamp is its `time`.
//!
//! Filter patterns: the JSON patterns that compare selectors with strings, joined by `||`
//! (`{ ($.detail.status = "COMMITTED") || ($.detail.status = "ABORTED") }`); any other pattern is refused
//! 400 `InvalidParameterException`, so a pattern this endpoint cannot judge is never answered wrongly.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Server;
use crate::firehose::LakeSink;

const TARGET: &str = "Logs_20140328.FilterLogEvents";

/// A running endpoint on 127.0.0.1 serving the events under its folder. Stops when dropped.
pub struct Logs {
    server: Server,
}

struct Shared {
    dir: PathBuf,
    group: String,
}

impl Logs {
    /// Serves the events under `dir` as the log group `group`.
    pub async fn start(dir: impl Into<PathBuf>, group: &str) -> std::io::Result<Logs> {
        let shared = Arc::new(Shared { dir: dir.into(), group: group.to_owned() });
        let app = Router::new().route("/", axum::routing::post(handle)).with_state(shared);
        Ok(Logs { server: Server::start("127.0.0.1:0", app).await? })
    }

    pub fn url(&self) -> &str {
        self.server.url()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FilterLogEventsInput {
    log_group_name: Option<String>,
    start_time: Option<i64>,
    end_time: Option<i64>,
    filter_pattern: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
}

/// `(selector path, wanted string)` terms, any of which passes.
type Pattern = Vec<(Vec<String>, String)>;

fn parse_pattern(text: &str) -> Result<Pattern, String> {
    let inner = text.trim().strip_prefix('{').and_then(|t| t.strip_suffix('}')).ok_or("not a JSON filter pattern")?;
    inner
        .split("||")
        .map(|term| {
            let term = term.trim().trim_start_matches('(').trim_end_matches(')').trim();
            let (selector, value) = term.split_once('=').ok_or_else(|| format!("{term:?} is not a comparison"))?;
            let path = selector.trim().strip_prefix("$.").ok_or_else(|| format!("{selector:?} is not a selector"))?;
            let value = value.trim().strip_prefix('"').and_then(|v| v.strip_suffix('"'));
            let value = value.ok_or_else(|| format!("{term:?} does not compare with a string"))?;
            Ok((path.split('.').map(str::to_owned).collect(), value.to_owned()))
        })
        .collect()
}

fn matches(pattern: &Pattern, event: &Value) -> bool {
    pattern.iter().any(|(path, wanted)| {
        path.iter().try_fold(event, |at, key| at.get(key)).and_then(Value::as_str) == Some(wanted.as_str())
    })
}

fn answer(status: StatusCode, body: Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-amz-json-1.1"));
    response
}

fn error(error_type: &str, message: &str) -> Response {
    let mut response = answer(StatusCode::BAD_REQUEST, json!({"__type": error_type, "message": message}));
    if let Ok(value) = HeaderValue::from_str(error_type) {
        response.headers_mut().insert("x-amzn-ErrorType", value);
    }
    response
}

async fn handle(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let target = headers.get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or_default();
    if target != TARGET {
        return error("UnknownOperationException", &format!("{target:?} is not served here"));
    }
    let input = match serde_json::from_slice::<FilterLogEventsInput>(&body) {
        Ok(input) => input,
        Err(e) => return error("SerializationException", &e.to_string()),
    };
    if input.log_group_name.as_deref() != Some(shared.group.as_str()) {
        return error("ResourceNotFoundException", "The specified log group does not exist.");
    }
    let pattern = match input.filter_pattern.as_deref().map(parse_pattern).transpose() {
        Ok(pattern) => pattern,
        Err(message) => return error("InvalidParameterException", &format!("filterPattern: {message}")),
    };
    let limit = input.limit.unwrap_or(10_000).clamp(1, 10_000);
    // CloudWatch Logs refuses a token it did not answer (or one expired) as an invalid parameter.
    let skip: usize = match input.next_token.as_deref().map(str::parse) {
        None => 0,
        Some(Ok(skip)) => skip,
        Some(Err(_)) => return error("InvalidParameterException", "The specified nextToken is invalid."),
    };
    let timestamp = |event: &Value| {
        event["time"].as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()).map(|t| t.timestamp_millis())
    };
    let mut found: Vec<(i64, Value)> = LakeSink::read_lines(&shared.dir, None)
        .into_iter()
        .filter_map(|(_, line)| serde_json::from_str::<Value>(&line).ok())
        .filter_map(|event| Some((timestamp(&event)?, event)))
        .filter(|(at, _)| input.start_time.is_none_or(|from| *at >= from))
        .filter(|(at, _)| input.end_time.is_none_or(|to| *at <= to))
        .filter(|(_, event)| pattern.as_ref().is_none_or(|p| matches(p, event)))
        .collect();
    found.sort_by_key(|(at, _)| *at);
    let page: Vec<Value> = found
        .iter()
        .skip(skip)
        .take(limit)
        .enumerate()
        .map(|(i, (at, event))| {
            json!({"logStreamName": "outcomes", "timestamp": at, "ingestionTime": at, "message": event.to_string(),
                   "eventId": format!("{:056}", skip + i)})
        })
        .collect();
    let next = (skip + page.len() < found.len()).then(|| (skip + page.len()).to_string());
    answer(StatusCode::OK, json!({"events": page, "nextToken": next, "searchedLogStreams": []}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_outcomes_pattern_is_read_and_others_refused() {
        let pattern = parse_pattern(r#"{ ($.detail.status = "COMMITTED") || ($.detail.status = "ABORTED") }"#).unwrap();
        assert!(matches(&pattern, &json!({"detail": {"status": "ABORTED"}})));
        assert!(!matches(&pattern, &json!({"detail": {"status": "PREPARED"}})));
        assert!(parse_pattern("ERROR").is_err());
        assert!(parse_pattern(r#"{ $.detail.ageMs > 5 }"#).is_err());
    }
}
