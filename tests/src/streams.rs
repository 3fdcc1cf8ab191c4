//! DynamoDB Streams in the tests: a Streams client for the test binary's DynamoDB Local, and a table's
//! stream read from its start to a marker written now.

use std::time::{Duration, Instant};

use aws_lambda_events::event::dynamodb::EventRecord;
use aws_sdk_dynamodb::types::AttributeValue;
use local_services::streams::{StartAt, StreamReader};

/// The key a marker item written by [`read_stream`] starts with.
pub const MARKER_PREFIX: &str = "zz-marker-";

/// A DynamoDB Streams client for the test binary's DynamoDB Local.
pub fn streams_client() -> aws_sdk_dynamodbstreams::Client {
    let config = aws_sdk_dynamodbstreams::Config::builder()
        .behavior_version(aws_sdk_dynamodbstreams::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodbstreams::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodbstreams::config::Credentials::new("local", "local", None, None, "tests"))
        .endpoint_url(dynamodb_local::shared().endpoint())
        .build();
    aws_sdk_dynamodbstreams::Client::from_conf(config)
}

/// Reads a table's stream from its start until the record of a marker item (key `key_attribute`,
/// [`MARKER_PREFIX`]…), written now, shows up: every record written before it is then in hand (the
/// marker's too, last or near it). Polls; never sleeps in place of a condition.
pub async fn read_stream(client: &aws_sdk_dynamodb::Client, table: &str, key_attribute: &str) -> Vec<EventRecord> {
    let marker = format!("{MARKER_PREFIX}{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    client
        .put_item()
        .table_name(table)
        .item(key_attribute, AttributeValue::S(marker.clone()))
        .send()
        .await
        .expect("marker written");
    let described = client.describe_table().table_name(table).send().await.expect("describe");
    let arn = described.table().and_then(|t| t.latest_stream_arn()).expect("the table streams").to_owned();
    let mut reader = StreamReader::new(streams_client(), arn, StartAt::TrimHorizon);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut records = Vec::new();
    loop {
        records.extend(reader.poll().await.expect("stream read"));
        if records.iter().any(|r| is_marker(r, key_attribute) == Some(marker.as_str())) {
            return records;
        }
        assert!(Instant::now() < deadline, "the marker never reached the stream of {table}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The marker's key, when `record` is of a marker [`read_stream`] wrote.
pub fn is_marker<'a>(record: &'a EventRecord, key_attribute: &str) -> Option<&'a str> {
    match record.change.keys.inner().get(key_attribute) {
        Some(serde_dynamo::AttributeValue::S(key)) if key.starts_with(MARKER_PREFIX) => Some(key),
        _ => None,
    }
}
