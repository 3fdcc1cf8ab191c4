//! Issue 42, item 6: DynamoDB Local answers only this machine's own SDK clients. A web page that
//! rebinds a name of its own to 127.0.0.1 reaches the port, but its requests name its own host in
//! `Host` and carry an `Origin`: they are refused before DynamoDB Local reads them.

use dynamodb_local::{DynamoDbLocal, Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends one unsigned DynamoDB JSON request with `host` and extra headers; returns status and body.
async fn send(port: u16, host: &str, extra: &str, operation: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connects");
    let request = format!(
        "POST / HTTP/1.1\r\nHost: {host}\r\n{extra}\
         Content-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: DynamoDB_20120810.{operation}\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=fake/20240101/us-east-1/dynamodb/aws4_request, \
         SignedHeaders=host, Signature=x\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("sends");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("reads");
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    (status, body.to_string())
}

fn sdk_client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new("local", "local", None, None, "test"))
        .endpoint_url(endpoint)
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

#[tokio::test]
async fn a_rebound_host_or_a_page_is_refused_and_an_sdk_client_is_answered() {
    let db = DynamoDbLocal::start(Options::default()).await.expect("DynamoDB Local starts");
    let port = db.port();

    // The stack's own clients: the SDK (Host 127.0.0.1:PORT), and one that names localhost.
    let sdk = sdk_client(db.endpoint());
    let table = "balances";
    sdk.create_table()
        .table_name(table)
        .key_schema(
            aws_sdk_dynamodb::types::KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(aws_sdk_dynamodb::types::KeyType::Hash)
                .build()
                .unwrap(),
        )
        .attribute_definitions(
            aws_sdk_dynamodb::types::AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(aws_sdk_dynamodb::types::ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .billing_mode(aws_sdk_dynamodb::types::BillingMode::PayPerRequest)
        .send()
        .await
        .expect("the SDK client creates a table");
    sdk.put_item()
        .table_name(table)
        .item("pk", aws_sdk_dynamodb::types::AttributeValue::S("alice".into()))
        .item("balance", aws_sdk_dynamodb::types::AttributeValue::N("100".into()))
        .send()
        .await
        .expect("the SDK client writes");
    let (status, body) = send(port, &format!("localhost:{port}"), "", "ListTables", "{}").await;
    assert_eq!((status, body.as_str()), (200, r#"{"TableNames":["balances"]}"#));

    // What a DNS-rebound page sends: its own host in Host, its own origin in Origin.
    let scan = format!(r#"{{"TableName":"{table}"}}"#);
    let update = format!(
        r#"{{"TableName":"{table}","Key":{{"pk":{{"S":"alice"}}}},"UpdateExpression":"SET balance = :b","ExpressionAttributeValues":{{":b":{{"N":"0"}}}}}}"#
    );
    let rebound = format!("evil.example:{port}");
    for (host, extra, operation, body) in [
        ("evil.example", "", "Scan", scan.as_str()),
        (rebound.as_str(), "Origin: http://evil.example\r\n", "Scan", scan.as_str()),
        (rebound.as_str(), "", "UpdateItem", update.as_str()),
        // The right Host, but sent by a page of another site.
        (&format!("127.0.0.1:{port}"), "Origin: https://evil.example\r\n", "Scan", scan.as_str()),
        (&format!("127.0.0.1:{port}"), "Origin: https://evil.example\r\n", "UpdateItem", update.as_str()),
        // Another port of this machine is another server.
        (&format!("127.0.0.1:{}", port.wrapping_add(1)), "", "Scan", scan.as_str()),
    ] {
        let (status, answer) = send(port, host, extra, operation, body).await;
        assert_eq!(status, 403, "{operation} with Host {host} {extra:?}: {answer}");
        assert!(!answer.contains("alice"), "a refusal shows nothing of the table: {answer}");
        assert!(answer.contains("DynamoDB Local answers"), "the refusal says why: {answer}");
    }

    // Nothing the page sent was applied.
    let item = sdk
        .get_item()
        .table_name(table)
        .key("pk", aws_sdk_dynamodb::types::AttributeValue::S("alice".into()))
        .send()
        .await
        .expect("the SDK client reads");
    let balance = item.item().and_then(|item| item.get("balance")).and_then(|b| b.as_n().ok()).cloned();
    assert_eq!(balance.as_deref(), Some("100"));
    db.stop().await;
}
