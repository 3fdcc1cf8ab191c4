//! The local stack end to end: started on free ports (its tables under a fresh prefix in this test
//! binary's DynamoDB Local, its lake in a folder of its own), driven by a real HTTP client and a real
//! WebSocket client, as a user would. Synchronisation is by polling what the user can see (messages,
//! lake files), never by sleeping in place of a condition.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use local_stack::{Config, LambdaOptions, Mode, Stack};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

const WAIT: Duration = Duration::from_secs(30);

fn lake_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("lake-{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]))
}

/// Every lake line under `dir` (NDJSON files under YYYY/MM/DD/HH/).
fn lake_lines(dir: &Path) -> Vec<(PathBuf, Value)> {
    local_services::firehose::LakeSink::read_lines(dir, None)
        .into_iter()
        .map(|(file, line)| (file, serde_json::from_str(&line).expect("a lake line is JSON")))
        .collect()
}

fn transfer(from: &str, to: &str, amount: i64) -> Value {
    json!({"participants": [
        {"service": "service-a", "operations": [{"op": "add", "key": {"entityId": from}, "field": "balance", "delta": -amount, "min": 0}]},
        {"service": "service-b", "operations": [{"op": "add", "key": {"entityId": to}, "field": "balance", "delta": amount}]}
    ]})
}

async fn post(http: &reqwest::Client, api: &str, body: &Value) -> (u16, Value) {
    let response = http.post(format!("{api}/transactions")).json(body).send().await.expect("the REST API answers");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON answer"))
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next JSON message matching `wanted`, skipping others; panics after `WAIT`.
async fn next_matching(socket: &mut Socket, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let message = tokio::time::timeout_at(deadline, socket.next())
            .await
            .unwrap_or_else(|_| panic!("no WebSocket message {what} within {WAIT:?}"))
            .expect("the connection stays open")
            .expect("a WebSocket message");
        if let Message::Text(text) = message {
            let value: Value = serde_json::from_str(text.as_str()).expect("messages are JSON");
            if wanted(&value) {
                return value;
            }
        }
    }
}

/// What a user does: subscribe, open two accounts, make a transfer that is refused and one that
/// commits; the push arrives, the committed change reaches the lake and the refused one never does.
async fn drive(stack: &Stack) {
    let e = stack.endpoints();
    let (a, b) = (&e.tables.participants["service-a"], &e.tables.participants["service-b"]);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();

    let (mut socket, _) = tokio_tungstenite::connect_async(e.websocket.as_str()).await.expect("WebSocket connects");
    let topics = [format!("entity:{a}:A"), format!("entity:{b}:B")];
    let subscribe = json!({"action": "subscribe", "topics": topics});
    socket.send(Message::Text(subscribe.to_string().into())).await.unwrap();
    let ack = next_matching(&mut socket, "acknowledging the subscription", |m| m.get("subscribed").is_some()).await;
    assert_eq!(ack["subscribed"].as_array().map(Vec::len), Some(2), "{ack}");

    let open = json!({"participants": [
        {"service": "service-a", "operations": [{"op": "put", "key": {"entityId": "A"}, "data": {"balance": 100}, "ifNotExists": true}]},
        {"service": "service-b", "operations": [{"op": "put", "key": {"entityId": "B"}, "data": {"balance": 0}, "ifNotExists": true}]}
    ]});
    let (status, answer) = post(&http, &e.api, &open).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");

    let (status, refused) = post(&http, &e.api, &transfer("A", "B", 500)).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["participants"][0]["code"], "CONDITION_FAILED", "{refused}");
    let refused_id = refused["transactionId"].as_str().expect("an id").to_owned();

    let (status, committed) = post(&http, &e.api, &transfer("A", "B", 30)).await;
    assert_eq!((status, committed["status"].as_str()), (200, Some("COMMITTED")), "{committed}");
    let id = committed["transactionId"].as_str().expect("an id").to_owned();

    // GET /transactions/{id} through the same API.
    let got: Value = http.get(format!("{}/transactions/{id}", e.api)).send().await.unwrap().json().await.unwrap();
    assert_eq!(got["status"], "COMMITTED", "{got}");

    // The push: A's commit of this transaction, as the contract's record.
    let push = next_matching(&mut socket, "for the transfer's commit of A", |m| {
        m["type"] == "commit" && m["transactionId"] == id.as_str() && m["key"]["entityId"] == "A"
    })
    .await;
    assert_eq!(push["table"], a.as_str(), "{push}");
    assert_eq!(push["data"]["balance"], json!(70), "{push}");
    assert_eq!(push["previous"]["balance"], json!(100), "{push}");

    // The lake: both committed changes of the transfer, one line each.
    let deadline = Instant::now() + WAIT;
    let lines = loop {
        let lines: Vec<Value> = lake_lines(&e.lake_dir)
            .into_iter()
            .map(|(_, line)| line)
            .filter(|line| line["transactionId"] == id.as_str())
            .collect();
        if lines.len() >= 2 {
            break lines;
        }
        assert!(Instant::now() < deadline, "the transfer did not reach the lake in {}", e.lake_dir.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut tables: Vec<&str> = lines.iter().filter_map(|l| l["table"].as_str()).collect();
    tables.sort();
    assert_eq!(tables, vec![a.as_str(), b.as_str()]);
    assert!(lines.iter().all(|l| l["change"] == "MODIFY" && l["service"].is_string() && l["eventId"].is_string()));

    // The refused transfer's stream records came before the transfer's on the same shards, so they
    // have been processed by now: none of them may be in the lake.
    let all = lake_lines(&e.lake_dir);
    assert!(
        !all.iter().any(|(_, l)| l["transactionId"] == refused_id.as_str()),
        "a refused transaction reached the lake: {all:?}"
    );
    for (file, _) in &all {
        let key = file.strip_prefix(&e.lake_dir).unwrap();
        assert_eq!(key.components().count(), 5, "S3-like key YYYY/MM/DD/HH/<object>: {}", key.display());
    }
    socket.close(None).await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_commits_pushes_and_writes_the_lake() {
    twopc_tests::init_logs();
    let lake = lake_dir("in-process");
    let stack =
        Stack::start(Config::isolated(dynamodb_local::shared().endpoint(), &lake)).await.expect("the stack starts");
    drive(&stack).await;
    stack.stop().await;
    let _ = std::fs::remove_dir_all(&lake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_is_named() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut config = Config::isolated(dynamodb_local::shared().endpoint(), lake_dir("port"));
    config.websocket_port = port;
    let error = Stack::start(config).await.err().expect("the stack refuses to start");
    let message = error.to_string();
    assert!(message.contains(&format!("port {port}")) && message.contains("--ws-port"), "{message}");
}

/// Every function as its real binary under `cargo lambda watch`, invoked through the Lambda Invoke
/// API: slow the first time (it builds the function binaries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cargo_lambda_watch_runs_the_real_functions() {
    if !local_stack::cargo_lambda_installed() {
        // Straight to stderr, past the test harness's capture, so the skip is seen.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED cargo_lambda_watch_runs_the_real_functions: `cargo lambda` is not installed (pip install cargo-lambda ziglang)"
        );
        return;
    }
    twopc_tests::init_logs();
    let lake = lake_dir("lambda");
    let mut config = Config::isolated(dynamodb_local::shared().endpoint(), &lake);
    config.mode = Mode::Lambda(LambdaOptions {
        workspace: local_stack::workspace_dir(),
        reload: false,
        echo_output: std::env::var_os("TWOPC_LOCAL_ECHO").is_some(),
        invoke_port: 0,
    });
    let stack = Stack::start(config).await.expect("the stack starts with every function under cargo lambda watch");
    assert_eq!(stack.endpoints().lambda.len(), 3, "two participant deployments and the other functions");
    drive(&stack).await;
    stack.stop().await;
    let _ = std::fs::remove_dir_all(&lake);
}
