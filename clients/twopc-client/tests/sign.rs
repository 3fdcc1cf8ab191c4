//! SigV4 with a fixed clock and fixed credentials, checked against an independent implementation
//! (tests/common), itself checked against the AWS signing test suite.

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use twopc_client::{Credentials, presign_websocket_url_at, sign_headers};

/// 2015-08-30T12:36:00Z, the time of the AWS test suite.
fn at() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_440_938_160)
}

fn credentials(token: Option<&str>) -> Credentials {
    Credentials::new(ACCESS_KEY, SECRET_KEY, token.map(str::to_owned), None, "test")
}

const URL: &str = "https://abc123.execute-api.eu-west-1.amazonaws.com/prod/transactions";
const BODY: &[u8] =
    br#"{"participants":[{"service":"service-a","operations":[{"op":"delete","key":{"entityId":"A"}}]}]}"#;

fn sign(body: &[u8], token: Option<&str>) -> Vec<(String, String)> {
    let headers = [("content-type", "application/json"), ("idempotency-key", "key-1")];
    sign_headers("POST", URL, &headers, body, "eu-west-1", &credentials(token), at()).unwrap()
}

fn header<'a>(signed: &'a [(String, String)], name: &str) -> &'a str {
    signed
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn this_sigv4_reproduces_the_aws_signing_test_suite() {
    // aws-signing-test-suite/v4/post-vanilla: header-signature.txt.
    let headers = [
        ("host".to_owned(), "example.amazonaws.com".to_owned()),
        ("x-amz-date".to_owned(), "20150830T123600Z".to_owned()),
    ];
    let request = canonical_request("POST", "/", "", &headers, b"");
    assert_eq!(
        signature(SECRET_KEY, "20150830T123600Z", "us-east-1", "service", &request),
        "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
    );
}

#[test]
fn a_post_is_signed_for_execute_api_over_its_headers_and_body() {
    let signed = sign(BODY, Some("session-token"));
    assert_eq!(header(&signed, "x-amz-date"), "20150830T123600Z");
    assert_eq!(header(&signed, "x-amz-security-token"), "session-token");
    let (credential, names, given) = authorization_parts(header(&signed, "authorization"));
    assert_eq!(credential, "AKIDEXAMPLE/20150830/eu-west-1/execute-api/aws4_request");
    assert_eq!(names, ["content-type", "host", "idempotency-key", "x-amz-date", "x-amz-security-token"]);

    let headers: Vec<(String, String)> = vec![
        ("content-type".into(), "application/json".into()),
        ("host".into(), "abc123.execute-api.eu-west-1.amazonaws.com".into()),
        ("idempotency-key".into(), "key-1".into()),
        ("x-amz-date".into(), "20150830T123600Z".into()),
        ("x-amz-security-token".into(), "session-token".into()),
    ];
    let request = canonical_request("POST", "/prod/transactions", "", &headers, BODY);
    assert_eq!(given, signature(SECRET_KEY, "20150830T123600Z", "eu-west-1", "execute-api", &request));
}

#[test]
fn another_body_or_key_gets_another_signature() {
    let signature = |signed: Vec<(String, String)>| authorization_parts(header(&signed, "authorization")).2;
    let base = signature(sign(BODY, None));
    assert_eq!(base, signature(sign(BODY, None)), "deterministic for the same request and time");
    assert_ne!(base, signature(sign(b"{}", None)));
    let other_key = sign_headers(
        "POST",
        URL,
        &[("content-type", "application/json"), ("idempotency-key", "key-2")],
        BODY,
        "eu-west-1",
        &credentials(None),
        at(),
    )
    .unwrap();
    assert_ne!(base, signature(other_key));
}

#[test]
fn a_websocket_url_is_presigned_in_its_query() {
    let url = presign_websocket_url_at(
        "wss://ws123.execute-api.eu-west-1.amazonaws.com/prod",
        "eu-west-1",
        &credentials(Some("tok/en+=")),
        Duration::from_secs(300),
        at(),
    )
    .unwrap();
    let (base, query) = url.split_once('?').expect("a query");
    assert_eq!(base, "wss://ws123.execute-api.eu-west-1.amazonaws.com/prod");
    let mut params: Vec<(String, String)> = query
        .split('&')
        .map(|p| p.split_once('=').unwrap())
        .map(|(n, v)| (percent_decode(n), percent_decode(v)))
        .collect();
    let given = params.iter().find(|(n, _)| n == "X-Amz-Signature").expect("a signature").1.clone();
    params.retain(|(n, _)| n != "X-Amz-Signature");
    params.sort();
    let get = |name: &str| params.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    assert_eq!(get("X-Amz-Algorithm"), Some("AWS4-HMAC-SHA256"));
    assert_eq!(get("X-Amz-Credential"), Some("AKIDEXAMPLE/20150830/eu-west-1/execute-api/aws4_request"));
    assert_eq!(get("X-Amz-Date"), Some("20150830T123600Z"));
    assert_eq!(get("X-Amz-Expires"), Some("300"));
    assert_eq!(get("X-Amz-SignedHeaders"), Some("host"));
    assert_eq!(get("X-Amz-Security-Token"), Some("tok/en+="));

    let canonical_query: Vec<String> =
        params.iter().map(|(n, v)| format!("{}={}", uri_encode(n), uri_encode(v))).collect();
    let host = [("host".to_owned(), "ws123.execute-api.eu-west-1.amazonaws.com".to_owned())];
    let request = canonical_request("GET", "/prod", &canonical_query.join("&"), &host, b"");
    assert_eq!(given, signature(SECRET_KEY, "20150830T123600Z", "eu-west-1", "execute-api", &request));
}
