//! The stand-ins through the real SDK clients: what the fan-out tests do not already exercise.

use std::time::Duration;

use aws_sdk_firehose::primitives::Blob;
use aws_sdk_firehose::types::Record;
use local_services::apigw::{ManagementApi, MemoryRegistry};
use local_services::firehose::{Firehose, LakeSink, MemorySink};

fn firehose_client(url: &str) -> aws_sdk_firehose::Client {
    let config = aws_sdk_firehose::Config::builder()
        .behavior_version(aws_sdk_firehose::config::BehaviorVersion::latest())
        .region(aws_sdk_firehose::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_firehose::config::Credentials::new("fake", "fake", None, None, "test"))
        .endpoint_url(url)
        .retry_config(aws_sdk_firehose::config::retry::RetryConfig::disabled())
        .build();
    aws_sdk_firehose::Client::from_conf(config)
}

fn management_client(endpoint: &str) -> aws_sdk_apigatewaymanagement::Client {
    let config = aws_sdk_apigatewaymanagement::Config::builder()
        .behavior_version(aws_sdk_apigatewaymanagement::config::BehaviorVersion::latest())
        .region(aws_sdk_apigatewaymanagement::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_apigatewaymanagement::config::Credentials::new(
            "fake", "fake", None, None, "test",
        ))
        .endpoint_url(endpoint)
        .retry_config(aws_sdk_apigatewaymanagement::config::retry::RetryConfig::disabled())
        .build();
    aws_sdk_apigatewaymanagement::Client::from_conf(config)
}

fn record(data: &str) -> Record {
    Record::builder().data(Blob::new(data.as_bytes().to_vec())).build().unwrap()
}

#[tokio::test]
async fn put_record_batch_answers_per_entry() {
    let sink = MemorySink::default();
    let firehose = Firehose::start(sink.clone()).await.unwrap();
    firehose.fail_entries_containing("bad", None);
    let client = firehose_client(firehose.url());
    let out = client
        .put_record_batch()
        .delivery_stream_name("s")
        .records(record("{\"a\":1}\n"))
        .records(record("{\"bad\":1}\n"))
        .send()
        .await
        .unwrap();
    assert_eq!(out.failed_put_count(), 1);
    assert_eq!(out.encrypted(), Some(false));
    let entries = out.request_responses();
    assert!(entries[0].record_id().is_some() && entries[0].error_code().is_none());
    assert_eq!(entries[1].error_code(), Some("ServiceUnavailableException"));
    assert!(entries[1].record_id().is_none());
    assert_eq!(sink.records(), vec![("s".to_owned(), b"{\"a\":1}\n".to_vec())]);
}

#[tokio::test]
async fn put_record_and_whole_call_faults() {
    let sink = MemorySink::default();
    let firehose = Firehose::start(sink.clone()).await.unwrap();
    let client = firehose_client(firehose.url());
    let out = client.put_record().delivery_stream_name("s").record(record("one\n")).send().await.unwrap();
    assert!(!out.record_id().is_empty());

    firehose.fail_next_calls(1);
    let err = client.put_record().delivery_stream_name("s").record(record("two\n")).send().await.unwrap_err();
    assert!(err.as_service_error().is_some_and(|e| e.is_service_unavailable_exception()), "{err:?}");
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(500));
    assert_eq!(sink.len(), 1, "a failed call accepts nothing");

    let too_many: Vec<Record> = (0..501).map(|i| record(&format!("{i}\n"))).collect();
    let err = client.put_record_batch().delivery_stream_name("s").set_records(Some(too_many)).send().await.unwrap_err();
    assert!(err.as_service_error().is_some_and(|e| e.is_invalid_argument_exception()), "{err:?}");
    let calls = firehose.calls();
    assert_eq!(calls.iter().map(|c| c.status).collect::<Vec<_>>(), vec![200, 500, 400]);
}

#[tokio::test]
async fn the_lake_sink_writes_one_object_per_call_under_hourly_keys() {
    let dir = std::env::temp_dir().join(format!("lake-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let firehose = Firehose::start(LakeSink::new(&dir)).await.unwrap();
    let client = firehose_client(firehose.url());
    for batch in [["a\n", "b\n"], ["c\n", "d\n"]] {
        let mut call = client.put_record_batch().delivery_stream_name("lake-stream");
        for line in batch {
            call = call.records(record(line));
        }
        assert_eq!(call.send().await.unwrap().failed_put_count(), 0);
    }
    let mut files = Vec::new();
    let mut stack = vec![dir.clone()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() { stack.push(path) } else { files.push(path) }
        }
    }
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    let contents: Vec<String> = files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect();
    assert_eq!(contents, vec!["a\nb\n", "c\nd\n"]);
    let key = files[0].strip_prefix(&dir).unwrap().to_string_lossy().into_owned();
    let parts: Vec<&str> = key.split('/').collect();
    assert_eq!(parts.len(), 5, "YYYY/MM/DD/HH/name: {key}");
    assert!(parts[0].len() == 4 && parts[1..4].iter().all(|p| p.len() == 2 && p.parse::<u8>().is_ok()), "{key}");
    assert!(parts[4].starts_with("lake-stream-") && parts[4].ends_with(".ndjson"), "{key}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn management_api_posts_gets_deletes_and_answers_gone() {
    let registry = MemoryRegistry::default();
    let api = ManagementApi::start(registry.clone(), "prod").await.unwrap();
    assert!(api.endpoint().ends_with("/prod"));
    let client = management_client(api.endpoint());
    registry.connect("L0SM9cOFvHcCIhw=");

    let waiting = {
        let registry = registry.clone();
        tokio::spawn(async move { registry.wait_for_messages("L0SM9cOFvHcCIhw=", 1, Duration::from_secs(10)).await })
    };
    client
        .post_to_connection()
        .connection_id("L0SM9cOFvHcCIhw=")
        .data(aws_sdk_apigatewaymanagement::primitives::Blob::new(b"{\"hello\":1}".to_vec()))
        .send()
        .await
        .unwrap();
    assert!(waiting.await.unwrap());
    assert_eq!(registry.messages("L0SM9cOFvHcCIhw="), vec![axum_bytes(b"{\"hello\":1}")]);

    let info = client.get_connection().connection_id("L0SM9cOFvHcCIhw=").send().await.unwrap();
    assert!(info.connected_at().is_some());
    assert_eq!(info.identity().and_then(|i| i.source_ip()), Some("127.0.0.1"));

    client.delete_connection().connection_id("L0SM9cOFvHcCIhw=").send().await.unwrap();
    assert!(!registry.is_open("L0SM9cOFvHcCIhw="));
    let err = client
        .post_to_connection()
        .connection_id("L0SM9cOFvHcCIhw=")
        .data(aws_sdk_apigatewaymanagement::primitives::Blob::new(b"x".to_vec()))
        .send()
        .await
        .unwrap_err();
    assert!(err.as_service_error().is_some_and(|e| e.is_gone_exception()), "{err:?}");
    let err = client.get_connection().connection_id("never").send().await.unwrap_err();
    assert!(err.as_service_error().is_some_and(|e| e.is_gone_exception()), "{err:?}");
    assert!(!registry.wait_for_messages("never", 1, Duration::from_millis(20)).await);

    let wrong_stage = management_client(&format!("{}/other", api.url()));
    let err = wrong_stage.get_connection().connection_id("x").send().await.unwrap_err();
    assert!(err.as_service_error().is_some_and(|e| e.is_forbidden_exception()), "{err:?}");
}

fn axum_bytes(data: &[u8]) -> axum::body::Bytes {
    axum::body::Bytes::copy_from_slice(data)
}
