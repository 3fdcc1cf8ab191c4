//! Starts real DynamoDB Local processes (installing it on first use) and talks to them with raw
//! HTTP requests, so this crate needs no AWS SDK.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use dynamodb_local::{DynamoDbLocal, Error, Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends one DynamoDB JSON request; returns the HTTP status and body.
async fn call(port: u16, operation: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: DynamoDB_20120810.{operation}\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=fake/20240101/us-east-1/dynamodb/aws4_request, \
         SignedHeaders=host, Signature=x\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    Ok((status, body.to_string()))
}

async fn list_tables(port: u16) -> String {
    let (status, body) = call(port, "ListTables", "{}").await.expect("ListTables");
    assert_eq!(status, 200, "ListTables on port {port}: {body}");
    body
}

async fn create_table(port: u16, name: &str) {
    let body = format!(
        r#"{{"TableName":"{name}","KeySchema":[{{"AttributeName":"pk","KeyType":"HASH"}}],"AttributeDefinitions":[{{"AttributeName":"pk","AttributeType":"S"}}],"BillingMode":"PAY_PER_REQUEST"}}"#
    );
    let (status, body) = call(port, "CreateTable", &body).await.expect("CreateTable");
    assert_eq!(status, 200, "CreateTable on port {port}: {body}");
}

/// Waits until nothing accepts connections on the port any more.
async fn assert_gone(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
        assert!(Instant::now() < deadline, "port {port} still answers");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The local addresses (kernel hex notation) listening on `port`, from /proc/net/tcp{,6}.
#[cfg(target_os = "linux")]
fn listening_addresses(port: u16) -> Vec<String> {
    let suffix = format!(":{port:04X}");
    let mut addresses = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // fields: sl local_address rem_address st ...; st 0A = LISTEN
            if fields.len() > 3 && fields[3] == "0A" && fields[1].ends_with(&suffix) {
                addresses.push(fields[1].trim_end_matches(&suffix).to_string());
            }
        }
    }
    addresses
}

#[tokio::test]
async fn two_instances_on_free_ports_answer_and_stop() {
    let (a, b) = tokio::join!(DynamoDbLocal::start(Options::default()), DynamoDbLocal::start(Options::default()));
    let (a, b) = (a.expect("first instance"), b.expect("second instance"));
    assert_ne!(a.port(), b.port());
    assert_eq!(a.endpoint(), format!("http://127.0.0.1:{}", a.port()));

    assert_eq!(list_tables(a.port()).await, r#"{"TableNames":[]}"#);
    assert_eq!(list_tables(b.port()).await, r#"{"TableNames":[]}"#);
    // Separate processes, separate databases.
    create_table(a.port(), "only_in_a").await;
    assert!(list_tables(a.port()).await.contains("only_in_a"));
    assert!(!list_tables(b.port()).await.contains("only_in_a"));

    #[cfg(target_os = "linux")]
    {
        let addresses = listening_addresses(a.port());
        assert!(!addresses.is_empty(), "nothing listens on {}", a.port());
        for address in &addresses {
            assert!(
                address.chars().any(|c| c != '0'),
                "port {} listens on a wildcard address: {addresses:?}",
                a.port()
            );
        }
    }

    let (port_a, port_b) = (a.port(), b.port());
    a.stop().await;
    assert_gone(port_a).await;
    drop(b);
    assert_gone(port_b).await;
}

#[tokio::test]
async fn a_port_in_use_is_reported_with_the_port() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let error = DynamoDbLocal::start(Options { port: Some(port), db_path: None }).await.expect_err("the port is taken");
    assert!(matches!(error, Error::PortInUse { port: p } if p == port), "{error:?}");
    assert!(error.to_string().contains(&port.to_string()), "{error}");
}

#[tokio::test]
async fn a_db_path_keeps_tables_across_restarts() {
    let dir =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("dynamodb-local-db-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let options = Options { port: None, db_path: Some(dir.clone()) };

    let db = DynamoDbLocal::start(options.clone()).await.unwrap();
    create_table(db.port(), "kept_table").await;
    db.stop().await;

    let db = DynamoDbLocal::start(options).await.unwrap();
    assert!(list_tables(db.port()).await.contains("kept_table"));
    db.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each thread has its own runtime and exits; the shared process must outlive them all.
#[tokio::test]
async fn shared_serves_every_thread_and_runtime() {
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                runtime.block_on(async {
                    let port = dynamodb_local::shared().port();
                    list_tables(port).await;
                    port
                })
            })
        })
        .collect();
    let ports: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(ports.windows(2).all(|w| w[0] == w[1]), "{ports:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(dynamodb_local::shared().port(), ports[0]);
    list_tables(ports[0]).await;
}

const HELPER_ENV: &str = "DYNAMODB_LOCAL_EXIT_HELPER";

/// Run by `shared_dies_with_the_process` in a child test process: starts the shared instance
/// from a thread that then exits, checks it still answers, prints its port and exits without
/// running any destructor.
#[test]
fn exit_helper() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let port = std::thread::spawn(|| dynamodb_local::shared().port()).join().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(list_tables(port));
    println!("PORT={port}");
    std::process::exit(0);
}

#[tokio::test]
async fn shared_dies_with_the_process() {
    let output = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "exit_helper", "--nocapture", "--test-threads=1"])
        .env(HELPER_ENV, "1")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let port: u16 = stdout
        .split("PORT=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| {
            panic!("helper failed ({}):\n{stdout}\n{}", output.status, String::from_utf8_lossy(&output.stderr))
        });
    assert_gone(port).await;
}

const NO_JAVA_ENV: &str = "DYNAMODB_LOCAL_NO_JAVA_HELPER";

/// Run by `a_missing_java_is_reported` in a child test process whose PATH has no `java`.
#[tokio::test]
async fn no_java_helper() {
    if std::env::var_os(NO_JAVA_ENV).is_none() {
        return;
    }
    match DynamoDbLocal::start(Options::default()).await {
        Err(error @ Error::JavaNotFound { .. }) => println!("RESULT=JavaNotFound: {error}"),
        other => println!("RESULT=unexpected: {other:?}"),
    }
}

#[tokio::test]
async fn a_missing_java_is_reported() {
    // Installs first (if needed), so that the child process only lacks java.
    let _ = dynamodb_local::try_shared();
    let output = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "no_java_helper", "--nocapture"])
        .env(NO_JAVA_ENV, "1")
        .env("PATH", "/nonexistent")
        .env_remove("JAVA_HOME")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("RESULT=JavaNotFound: `java` not found"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
