//! What the coordinator accepts as `POST /transactions` ([`super::parse_request`]): a request's parse
//! and its refusals, each naming the place and the limit.

use serde_json::{Map, Value};

use super::parse_request;
use crate::model::operation::FIELD_LEVEL;
use crate::model::*;

fn parse(body: &str) -> Result<TransactionRequest, Invalid> {
    parse_request(body.as_bytes(), |s| s.starts_with("service-"))
}

#[test]
fn a_transfer_parses_with_exact_amounts() {
    let request = parse(
        r#"{"participants": [
            {"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": -0.1, "min": 0}]},
            {"service": "service-b", "operations": [{"op": "add", "key": {"entityId": "B"}, "field": "balance", "delta": 0.1}]}
        ], "timeoutMs": 2000}"#,
    )
    .unwrap();
    assert_eq!(request.timeout_ms, 2000);
    let Operation::Add { delta, min, .. } = &request.participants[0].operations[0] else { panic!() };
    assert_eq!(delta.to_string(), "-0.1");
    assert_eq!(min.as_ref().unwrap().to_string(), "0");
}

#[test]
fn refusals_name_the_problem() {
    let cases = [
        ("{", "not valid JSON"),
        (r#"{"participants": []}"#, "at least one participant"),
        (r#"{"participants": [{"service": "service-a", "operations": []}]}"#, "at least one operation"),
        (
            r#"{"participants": [{"service": "other", "operations": [{"op": "delete", "key": {"entityId": "A"}}]}]}"#,
            "unknown service \"other\"",
        ),
        (
            r#"{"participants": [{"service": "service-a", "operations": [{"op": "move", "key": {"entityId": "A"}}]}]}"#,
            "unknown operation \"move\"",
        ),
        (
            r#"{"participants": [{"service": "service-a", "operations": [{"op": "delete", "key": {"entityId": "A"}}, {"op": "delete", "key": {"entityId": "A"}}]}]}"#,
            "appears twice",
        ),
        (
            r#"{"participants": [{"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "b", "delta": "ten"}]}]}"#,
            "operations[0].delta",
        ),
        (
            r#"{"participants": [{"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "b", "delta": 1, "min": 5, "max": 1}]}]}"#,
            "greater than max",
        ),
    ];
    for (body, expected) in cases {
        let err = parse(body).unwrap_err();
        assert!(err.message.contains(expected), "{body}: {err}");
    }
    let big = format!(r#"{{"participants": [], "pad": "{}"}}"#, "x".repeat(MAX_BODY_BYTES));
    assert_eq!(parse(&big).unwrap_err().code, "BODY_TOO_LARGE");
}

#[test]
fn values_dynamodb_cannot_store_are_refused_with_the_limit_named() {
    let op = |operation: serde_json::Value| {
        let body = serde_json::json!({"participants": [{"service": "service-a", "operations": [operation]}]});
        parse(&body.to_string())
    };
    let put = |data: serde_json::Value| op(serde_json::json!({"op": "put", "key": {"entityId": "A"}, "data": data}));
    let huge: Value = serde_json::from_str("1e400").unwrap();
    assert!(put(serde_json::json!({"x": huge})).unwrap_err().message.contains("data.x"));
    assert!(put(serde_json::json!({"x": {"": 1}})).unwrap_err().message.contains("names must not be empty"));
    let mut deep = serde_json::json!(1);
    for _ in 0..MAX_NESTING - FIELD_LEVEL + 2 {
        deep = serde_json::json!({"d": deep});
    }
    let err = put(serde_json::json!({"x": deep})).unwrap_err();
    assert_eq!((err.code, err.message.contains("limit is 32 levels")), (ErrorCode::LimitExceeded, true), "{err}");
    assert!(put(serde_json::json!({"x": deep["d"].clone()})).is_ok(), "one level less fits");
    let long_key = "k".repeat(MAX_KEY_BYTES + 1);
    let err = op(serde_json::json!({"op": "delete", "key": {"entityId": long_key}})).unwrap_err();
    assert_eq!((err.code, err.message.contains("2048 bytes")), (ErrorCode::LimitExceeded, true), "{err}");
    assert!(op(serde_json::json!({"op": "delete", "key": {"entityId": "k".repeat(MAX_KEY_BYTES)}})).is_ok());
    // Key attribute names are attribute names too: found by the API fuzzing run, where `{"": "A"}`
    // passed validation and the transaction record's write failed (a 503 instead of a 400).
    let err = op(serde_json::json!({"op": "delete", "key": {"": "A"}})).unwrap_err();
    assert_eq!(
        (err.code, err.message.contains("key: attribute names must not be empty")),
        (ErrorCode::InvalidRequest, true),
        "{err}"
    );
    let err = op(serde_json::json!({"op": "delete", "key": {"k".repeat(MAX_KEY_NAME_BYTES + 1): "A"}})).unwrap_err();
    assert_eq!((err.code, err.message.contains("255 bytes")), (ErrorCode::LimitExceeded, true), "{err}");
    let fields: Map<String, Value> = (0..400).map(|i| (format!("f{i}"), Value::from(i))).collect();
    let err = op(serde_json::json!({"op": "set", "key": {"entityId": "A"}, "set": fields})).unwrap_err();
    assert_eq!((err.code, err.message.contains("4096 bytes")), (ErrorCode::LimitExceeded, true), "{err}");
    let fields: Map<String, Value> = (0..100).map(|i| (format!("f{i}"), Value::from(i))).collect();
    assert!(op(serde_json::json!({"op": "set", "key": {"entityId": "A"}, "set": fields})).is_ok());
}

/// fuzz/request_parser's first crash, shortened: a string amount in a form JSON has no number
/// for was accepted, and hashing the request (or sending it to the participant) panicked.
#[test]
fn an_amount_written_in_any_decimal_form_is_hashed_and_sent_as_a_json_number() {
    for (written, wire) in [("-02.10", "-2.1"), ("+5", "5"), (".5", "0.5"), ("5.", "5")] {
        let body = format!(
            r#"{{"participants": [{{"service": "service-a", "operations": [{{"op": "add", "key": {{"entityId": "A"}}, "field": "b", "delta": "{written}", "min": "{written}", "max": "{written}"}}]}}]}}"#
        );
        let request = parse(&body).unwrap();
        let sent = request.participants[0].operations[0].to_json();
        for field in ["delta", "min", "max"] {
            assert_eq!(sent[field].to_string(), wire, "{written:?}");
        }
        let again = parse(&format!(r#"{{"participants": [{{"service": "service-a", "operations": [{sent}]}}]}}"#));
        assert_eq!(again.unwrap().canonical_hash(), request.canonical_hash(), "{written:?}");
    }
}

/// Found with the one above: exponents past i64's range of exponents are refused with the
/// limit named, never a panic.
#[test]
fn amounts_with_exponents_past_any_range_are_refused() {
    for delta in ["1e9223372036854775807", "100e9223372036854775807", "\"+100e9223372036854775807\""] {
        let body = format!(
            r#"{{"participants": [{{"service": "service-a", "operations": [{{"op": "add", "key": {{"entityId": "A"}}, "field": "b", "delta": {delta}}}]}}]}}"#
        );
        let err = parse(&body).unwrap_err();
        assert!(err.message.contains("delta: is outside DynamoDB's range"), "{delta}: {err}");
    }
}

#[test]
fn a_whole_timeout_written_with_a_fraction_is_accepted() {
    // Found by the API fuzzing run: `524.0` is an integer to JSON Schema, and was refused here.
    let body = |t: &str| {
        format!(
            r#"{{"participants": [{{"service": "service-a", "operations": [{{"op": "delete", "key": {{"entityId": "A"}}}}]}}], "timeoutMs": {t}}}"#
        )
    };
    assert_eq!(parse(&body("524.0")).unwrap().timeout_ms, 524);
    assert_eq!(parse(&body("1e3")).unwrap().timeout_ms, 1000);
    for refused in ["524.5", "99", "25001", "-100", "\"500\""] {
        assert!(parse(&body(refused)).unwrap_err().message.starts_with("timeoutMs:"), "{refused}");
    }
}

#[test]
fn the_hash_ignores_layout_but_not_content() {
    let a = parse(r#"{"participants": [{"service": "service-a", "operations": [{"op": "set", "key": {"entityId": "A"}, "set": {"x": 1, "y": 2}}]}]}"#).unwrap();
    let b = parse(r#"{ "participants":[{"operations":[{"set":{"y":2,"x":1},"key":{"entityId":"A"},"op":"set"}],"service":"service-a"}]}"#).unwrap();
    let c = parse(r#"{"participants": [{"service": "service-a", "operations": [{"op": "set", "key": {"entityId": "A"}, "set": {"x": 1, "y": 3}}]}]}"#).unwrap();
    assert_eq!(a.canonical_hash(), b.canonical_hash());
    assert_ne!(a.canonical_hash(), c.canonical_hash());
}
