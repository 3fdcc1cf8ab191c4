//! The client against a real HTTP and WebSocket server on 127.0.0.1 that answers from a script: the
//! retries, the keys they carry, the typed answers, the signature as the server recomputes it, the
//! pushes.

mod common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocketUpgrade};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::json;
use twopc_client::*;

/// What the server does with one request.
#[derive(Clone)]
enum Reply {
    Answer(u16, String),
    /// Never answers: the client's attempt times out.
    Hang,
}

#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

#[derive(Clone, Default)]
struct Script {
    replies: Arc<Mutex<VecDeque<Reply>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Script {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn handle(State(script): State<Script>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    script.seen.lock().unwrap().push(Seen { method, path: uri.path().to_owned(), headers, body });
    let reply = script.replies.lock().unwrap().pop_front().expect("the script has a reply for every request");
    match reply {
        Reply::Answer(status, body) => (StatusCode::from_u16(status).unwrap(), body).into_response(),
        Reply::Hang => std::future::pending().await,
    }
}

/// A server answering `replies` in order; its base URL.
async fn server(replies: Vec<Reply>) -> (String, Script) {
    let script = Script { replies: Arc::new(Mutex::new(replies.into())), ..Script::default() };
    let app = Router::new().fallback(handle).with_state(script.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, script)
}

fn fast_retry() -> Retry {
    Retry { attempts: 4, first_delay: Duration::from_millis(1), max_delay: Duration::from_millis(5) }
}

fn client(url: &str) -> Client {
    Client::new(url).unwrap().with_retry(fast_retry())
}

fn transfer() -> Transaction {
    Transaction::new()
        .participant("service-a", [op::add("A", "balance", -100).min(0)])
        .participant("service-b", [op::add("B", "balance", 100)])
        .timeout_ms(3000)
}

fn state(status: &str) -> String {
    json!({"transactionId": "tx-1", "status": status, "participants": [
        {"service": "service-a", "vote": "PREPARED"},
        {"service": "service-b", "vote": "REFUSED", "code": "CONDITION_FAILED", "reason": "balance 0 + -100 is below the minimum 0"}
    ], "createdAt": 1, "updatedAt": 2})
    .to_string()
}

fn error(code: &str, message: &str) -> String {
    json!({"error": {"code": code, "message": message}}).to_string()
}

fn key_of(seen: &Seen) -> Option<&str> {
    seen.headers.get("idempotency-key").map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn retries_reuse_the_idempotency_key_and_the_body() {
    let (url, script) = server(vec![
        Reply::Answer(503, error("UNAVAILABLE", "store down")),
        Reply::Answer(502, String::new()),
        Reply::Answer(429, "{\"message\":\"Too Many Requests\"}".into()),
        Reply::Answer(200, state("COMMITTED")),
    ])
    .await;
    let outcome = client(&url).submit(&transfer()).await.unwrap();
    assert!(outcome.is_committed(), "{outcome:?}");

    let seen = script.seen();
    assert_eq!(seen.len(), 4);
    let key = key_of(&seen[0]).expect("a key is sent by default");
    assert!(!key.is_empty());
    for attempt in &seen {
        assert_eq!((attempt.method.as_str(), attempt.path.as_str()), ("POST", "/transactions"));
        assert_eq!(key_of(attempt), Some(key), "every attempt carries the first attempt's key");
        assert_eq!(attempt.body, transfer().body_bytes());
        assert_eq!(attempt.headers["content-type"], "application/json");
    }

    // The next logical submit gets a key of its own.
    script.replies.lock().unwrap().push_back(Reply::Answer(200, state("COMMITTED")));
    client(&url).submit(&transfer()).await.unwrap();
    assert_ne!(key_of(&script.seen()[4]), Some(key));
}

#[tokio::test]
async fn an_attempt_that_times_out_is_retried_under_the_same_key() {
    let (url, script) = server(vec![Reply::Hang, Reply::Answer(202, state("COMMITTING"))]).await;
    let http = twopc_client::http_client_builder().unwrap().timeout(Duration::from_millis(300)).build().unwrap();
    let client = client(&url).with_http_client(http);
    let outcome = client.submit_with_key(&transfer(), "transfer-7").await.unwrap();
    assert!(matches!(&outcome, Outcome::Pending(s) if s.status == Status::Committing), "{outcome:?}");
    let seen = script.seen();
    assert_eq!(seen.iter().map(key_of).collect::<Vec<_>>(), [Some("transfer-7"); 2]);
}

#[tokio::test]
async fn answers_that_would_not_change_are_never_retried() {
    let cases: Vec<(u16, String)> = vec![
        (400, error("INVALID_REQUEST", "participants[0].operations[0].delta: \"ten\" is not a number")),
        (409, state("ABORTED")),
        (422, error("IDEMPOTENCY_KEY_REUSED", "used with another body")),
        (500, error("CRASHED", "injected")),
    ];
    for (status, body) in cases {
        let (url, script) = server(vec![Reply::Answer(status, body)]).await;
        let result = client(&url).submit(&transfer()).await;
        assert_eq!(script.seen().len(), 1, "HTTP {status} is answered at once: {result:?}");
        match (status, result) {
            (400, Err(Error::Invalid(e))) => {
                assert_eq!(e.code, ErrorCode::InvalidRequest);
                assert!(e.message.contains("delta"), "{e}");
            }
            (409, Ok(Outcome::Aborted(s))) => {
                assert_eq!(s.status, Status::Aborted);
                assert!(s.refused_with(&RefusalCode::ConditionFailed));
                let refused: Vec<&str> = s.refusals().map(|p| p.service.as_str()).collect();
                assert_eq!(refused, ["service-b"]);
            }
            (422, Err(e @ Error::IdempotencyKeyReused(_))) => {
                assert_eq!(e.code(), Some(&ErrorCode::IdempotencyKeyReused))
            }
            (500, Err(Error::Status { status: 500, body })) => assert!(body.contains("CRASHED")),
            (status, other) => panic!("HTTP {status}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn retries_stop_after_the_last_attempt_with_what_the_server_said() {
    let unavailable =
        json!({"error": {"code": "UNAVAILABLE", "message": "the outcome is not known yet"}, "transactionId": "tx-9"});
    let (url, script) = server(vec![Reply::Answer(503, unavailable.to_string()); 4]).await;
    match client(&url).submit(&transfer()).await {
        Err(Error::Unavailable { transaction_id, error }) => {
            assert_eq!(transaction_id.as_deref(), Some("tx-9"));
            assert_eq!(error.code, ErrorCode::Unavailable);
            assert_eq!(error.message, "the outcome is not known yet");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(script.seen().len(), 4);

    // A gateway's own 504 page, too.
    let (url, _) = server(vec![Reply::Answer(504, "Endpoint request timed out".into()); 4]).await;
    assert!(matches!(client(&url).submit(&transfer()).await, Err(Error::Status { status: 504, .. })));
}

#[tokio::test]
async fn an_unkeyed_submit_is_tried_once() {
    let (url, script) = server(vec![Reply::Answer(503, error("UNAVAILABLE", "down"))]).await;
    let result = client(&url).submit_unkeyed(&transfer()).await;
    assert!(matches!(result, Err(Error::Unavailable { transaction_id: None, .. })), "{result:?}");
    let seen = script.seen();
    assert_eq!((seen.len(), key_of(&seen[0])), (1, None));
}

#[tokio::test]
async fn get_reads_a_transaction_or_says_it_is_unknown() {
    let (url, script) = server(vec![
        Reply::Answer(202, state("PREPARING")),
        Reply::Answer(404, error("NOT_FOUND", "no transaction tx-2")),
    ])
    .await;
    let client = client(&url);
    let outcome = client.get("tx-1").await.unwrap();
    assert!(matches!(&outcome, Outcome::Pending(s) if s.status == Status::Preparing));
    assert_eq!((outcome.transaction_id(), outcome.state().created_at, outcome.state().updated_at), ("tx-1", 1, 2));
    assert!(matches!(client.get("tx-2").await, Err(Error::NotFound(e)) if e.code == ErrorCode::NotFound));
    let seen = script.seen();
    assert_eq!((seen[0].method.as_str(), seen[0].path.as_str()), ("GET", "/transactions/tx-1"));
    assert!(seen[0].headers.get("idempotency-key").is_none() && seen[0].body.is_empty());
}

/// A held transaction's answer body: `status`, with its `holdUntil`.
fn held_state(status: &str) -> String {
    json!({"transactionId": "tx-1", "status": status, "participants": [
        {"service": "service-a", "vote": "PREPARED"}, {"service": "service-b", "vote": "PREPARED"}
    ], "holdUntil": 1_795_440_600_000u64, "createdAt": 1, "updatedAt": 2})
    .to_string()
}

#[tokio::test]
async fn a_held_transaction_is_sent_with_its_hold_and_answered_held() {
    let (url, script) = server(vec![Reply::Answer(202, held_state("PREPARED"))]).await;
    let held = transfer().hold(Duration::from_secs(600));
    let outcome = client(&url).submit_with_key(&held, "order-9").await.unwrap();
    let Outcome::Held(state) = &outcome else { panic!("a 202 PREPARED is held: {outcome:?}") };
    assert_eq!((state.status.clone(), state.hold_until), (Status::Prepared, Some(1_795_440_600_000)));
    assert_eq!(outcome.hold_until(), Some(1_795_440_600_000));
    let seen = script.seen();
    let body: serde_json::Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!((body["holdMs"].as_u64(), body["timeoutMs"].as_u64()), (Some(600_000), Some(3000)));
}

#[tokio::test]
async fn commit_and_abort_post_to_their_routes_and_read_every_answer() {
    let not_held = json!({"transactionId": "tx-1", "error": {"code": "NOT_HELD",
        "message": "transaction tx-1 was not held (its request had no holdMs): it was decided when it was submitted, and is COMMITTED"}})
    .to_string();
    let (url, script) = server(vec![
        // commit: committed, committing, aborted first (or expired), not held, unknown.
        Reply::Answer(200, held_state("COMMITTED")),
        Reply::Answer(202, held_state("COMMITTING")),
        Reply::Answer(409, held_state("ABORTED")),
        Reply::Answer(409, not_held.clone()),
        Reply::Answer(404, error("NOT_FOUND", "no transaction tx-2")),
        // abort: aborted, a commit won (applied, or still applying), not held, unknown.
        Reply::Answer(200, held_state("ABORTED")),
        Reply::Answer(409, held_state("COMMITTED")),
        Reply::Answer(409, held_state("COMMITTING")),
        Reply::Answer(409, not_held),
        Reply::Answer(404, error("NOT_FOUND", "no transaction tx-2")),
    ])
    .await;
    let client = client(&url);

    let committed = client.commit("tx-1").await.unwrap();
    assert!(matches!(&committed, Outcome::Committed(s) if s.status == Status::Committed), "{committed:?}");
    assert_eq!(committed.hold_until(), Some(1_795_440_600_000));
    let committing = client.commit("tx-1").await.unwrap();
    assert!(matches!(&committing, Outcome::Pending(s) if s.status == Status::Committing), "{committing:?}");
    let too_late = client.commit("tx-1").await.unwrap();
    assert!(matches!(&too_late, Outcome::Aborted(s) if s.status == Status::Aborted), "{too_late:?}");
    match client.commit("tx-1").await {
        Err(e @ Error::NotHeld(_)) => assert_eq!(e.code(), Some(&ErrorCode::NotHeld)),
        other => panic!("a transaction that was not held: {other:?}"),
    }
    assert!(matches!(client.commit("tx-2").await, Err(Error::NotFound(e)) if e.code == ErrorCode::NotFound));

    let aborted = client.abort("tx-1").await.unwrap();
    assert!(matches!(&aborted, Outcome::Aborted(s) if s.status == Status::Aborted), "an abort's 200: {aborted:?}");
    let commit_won = client.abort("tx-1").await.unwrap();
    assert!(matches!(&commit_won, Outcome::Committed(_)), "an abort's 409 after a commit: {commit_won:?}");
    let commit_applying = client.abort("tx-1").await.unwrap();
    assert!(matches!(&commit_applying, Outcome::Pending(s) if s.status == Status::Committing), "{commit_applying:?}");
    assert!(matches!(client.abort("tx-1").await, Err(Error::NotHeld(_))));
    assert!(matches!(client.abort("tx-2").await, Err(Error::NotFound(_))));

    let seen = script.seen();
    let routes: Vec<(&str, &str)> = seen.iter().map(|s| (s.method.as_str(), s.path.as_str())).collect();
    let expected: Vec<(&str, &str)> = [
        [("POST", "/transactions/tx-1/commit"); 4].as_slice(),
        &[("POST", "/transactions/tx-2/commit")],
        &[("POST", "/transactions/tx-1/abort"); 4],
        &[("POST", "/transactions/tx-2/abort")],
    ]
    .concat();
    assert_eq!(routes, expected, "each answer is final: none is retried");
    for request in &seen {
        assert!(request.body.is_empty() && key_of(request).is_none(), "a decision carries no body and no key");
    }
}

#[tokio::test]
async fn a_decision_is_retried_while_the_transaction_is_still_preparing() {
    let preparing = json!({"transactionId": "tx-1", "error": {"code": "UNAVAILABLE",
        "message": "transaction tx-1 is still preparing: it can be committed once it is PREPARED"}})
    .to_string();
    let (url, script) = server(vec![
        Reply::Answer(503, preparing.clone()),
        Reply::Answer(200, held_state("COMMITTED")),
        Reply::Answer(503, preparing.clone()),
        Reply::Answer(503, preparing.clone()),
        Reply::Answer(503, preparing.clone()),
        Reply::Answer(503, preparing),
    ])
    .await;
    let client = client(&url);
    assert!(client.commit("tx-1").await.unwrap().is_committed());
    match client.commit("tx-1").await {
        Err(Error::Unavailable { transaction_id, error }) => {
            assert_eq!((transaction_id.as_deref(), &error.code), (Some("tx-1"), &ErrorCode::Unavailable));
        }
        other => panic!("still preparing after every attempt: {other:?}"),
    }
    assert_eq!(script.seen().len(), 6);
}

#[tokio::test]
async fn every_attempt_of_a_signed_client_carries_a_signature_the_server_verifies() {
    let (url, script) = server(vec![
        Reply::Answer(503, error("UNAVAILABLE", "x")),
        Reply::Answer(200, state("COMMITTED")),
        Reply::Answer(200, state("COMMITTED")),
        Reply::Answer(200, held_state("ABORTED")),
    ])
    .await;
    let url = format!("{url}/prod");
    let credentials = Credentials::new(common::ACCESS_KEY, common::SECRET_KEY, Some("token".into()), None, "test");
    let client = client(&url).with_iam("eu-west-1", credentials);
    client.submit_with_key(&transfer(), "k").await.unwrap();
    client.get("tx-1").await.unwrap();
    assert!(client.abort("tx-1").await.unwrap().is_aborted());

    let seen = script.seen();
    assert_eq!(seen.len(), 4);
    for request in &seen {
        let header = |name: &str| request.headers.get(name).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(header("x-amz-security-token").as_deref(), Some("token"));
        common::verify(request.method.as_str(), &request.path, header, &request.body, "eu-west-1")
            .unwrap_or_else(|e| panic!("{} {}: {e}", request.method, request.path));
    }
    assert_eq!(seen[2].path, "/prod/transactions/tx-1");
    assert_eq!((seen[3].method.as_str(), seen[3].path.as_str()), ("POST", "/prod/transactions/tx-1/abort"));

    // A body changed on the way no longer matches its signature.
    let tampered = &seen[0];
    let header = |name: &str| tampered.headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    assert!(common::verify("POST", &tampered.path, header, b"{\"participants\":[]}", "eu-west-1").is_err());
}

#[tokio::test]
async fn a_subscription_sends_its_topics_and_yields_typed_pushes() {
    let (received_tx, mut received) = tokio::sync::mpsc::unbounded_channel::<String>();
    let app = Router::new().fallback(move |ws: WebSocketUpgrade| {
        let received_tx = received_tx.clone();
        async move {
            ws.on_upgrade(move |mut socket| async move {
                while let Some(Ok(message)) = socket.recv().await {
                    let Message::Text(text) = message else { continue };
                    received_tx.send(text.to_string()).unwrap();
                    if text.contains("\"subscribe\"") {
                        for push in [
                            json!({"subscribed": ["entity:service-a-data:A", "tx:tx-1"],
                                   "refused": [{"topic": "tx:tx-2", "reason": "this connection follows 50 topics, at most 50 per connection"}]}),
                            json!({"type": "commit", "eventId": "e1", "transactionId": "tx-1", "service": "service-a",
                                   "table": "service-a-data", "key": {"entityId": "A"}, "change": "MODIFY", "version": 2,
                                   "committedAt": "2026-01-01T00:00:00Z", "data": {"balance": 0.3}, "previous": {"balance": 0.1}}),
                            json!({"type": "transaction", "transactionId": "tx-1", "status": "COMMITTED"}),
                        ] {
                            socket.send(Message::Text(push.to_string().into())).await.unwrap();
                        }
                    }
                }
            })
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut pushes =
        subscribe(&url, [topic::entity("service-a-data", "A"), topic::transaction("tx-1"), topic::transaction("tx-2")])
            .await
            .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&received.recv().await.unwrap()).unwrap(),
        json!({"action": "subscribe", "topics": ["entity:service-a-data:A", "tx:tx-1", "tx:tx-2"]})
    );
    assert_eq!(
        pushes.next().await.unwrap().unwrap(),
        Push::Subscribed(vec!["entity:service-a-data:A".into(), "tx:tx-1".into()])
    );
    // The same answer's refusals come next, each with its reason.
    let Push::Refused(refused) = pushes.next().await.unwrap().unwrap() else { panic!("the refused topics") };
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].topic, "tx:tx-2");
    assert!(refused[0].reason.contains("at most 50"));
    let Push::Commit(commit) = pushes.next().await.unwrap().unwrap() else { panic!("a commit") };
    assert_eq!((commit.table.as_str(), commit.version, commit.change), ("service-a-data", 2, Change::Modify));
    assert_eq!(commit.data["balance"].to_string(), "0.3", "exact decimals");
    assert_eq!(pushes.next().await.unwrap().unwrap(), Push::transaction("tx-1", Status::Committed, None));

    pushes.unsubscribe(["tx:tx-1"]).await.unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&received.recv().await.unwrap()).unwrap(),
        json!({"action": "unsubscribe", "topics": ["tx:tx-1"]})
    );
    pushes.close().await.unwrap();
}
