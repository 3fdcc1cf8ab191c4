//! The coordinator's metrics as CloudWatch reads them: embedded-metric-format documents with the names,
//! units and dimensions the templates' alarms and dashboard use. One test: the recorder is global.

use serde_json::{Value, json};
use twopc::telemetry;
use twopc_tests::TestEnv;

#[tokio::test]
async fn answers_and_phases_are_written_as_embedded_metrics() {
    let collector = telemetry::install_emf("TwoPhaseCommit/test", telemetry::Zeros::Omitted)
        .expect("the only recorder in this process");
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "500").await;
    env.put_account("service-b", "B", "0").await;

    let (committed, body) = env.post(&TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "100"), None).await;
    assert_eq!(committed, 200, "{body}");
    let (refused, body) = env.post(&TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "1000"), None).await;
    assert_eq!(refused, 409, "{body}");
    let (invalid, body) = env.post_raw("{}", None).await;
    assert_eq!(invalid, 400, "{body}");

    let mut out = Vec::new();
    collector.flush(&mut out).unwrap();
    let documents: Vec<Value> =
        String::from_utf8(out).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let metric = |name: &str| -> (&Value, &Value) {
        let document =
            documents.iter().find(|d| d.get(name).is_some()).unwrap_or_else(|| panic!("no {name} in {documents:#?}"));
        let definition = &document["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(definition["Namespace"], "TwoPhaseCommit/test");
        let declared = definition["Metrics"].as_array().unwrap().iter().find(|m| m["Name"] == name).unwrap();
        (document, declared)
    };

    let (document, declared) = metric(telemetry::COMMITTED);
    assert_eq!(document[telemetry::COMMITTED], json!(1));
    assert_eq!(declared["Unit"], "Count");
    let (document, _) = metric(telemetry::ABORTED);
    assert_eq!(document[telemetry::ABORTED], json!(1));
    assert_eq!(document[telemetry::REASON], "CONDITION_FAILED");
    assert_eq!(document["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([[telemetry::REASON]]));
    let (document, _) = metric(telemetry::REJECTED);
    assert_eq!(document[telemetry::REJECTED], json!(1));
    for latency in [telemetry::PREPARE_LATENCY, telemetry::DECISION_LATENCY, telemetry::COMMIT_LATENCY] {
        let (_, declared) = metric(latency);
        assert_eq!(declared["Unit"], "Milliseconds", "{latency}");
    }
    // A histogram is the list of its values: one per answered transaction (the 400 is none), one
    // prepare per transaction that prepared.
    for (latency, values) in
        [(telemetry::TRANSACTION_LATENCY, 2), (telemetry::PREPARE_LATENCY, 2), (telemetry::COMMIT_LATENCY, 1)]
    {
        let (document, _) = metric(latency);
        assert_eq!(document[latency].as_array().map(Vec::len), Some(values), "{document}");
    }

    // Every answered prepare (two transactions, two participants each) measured the participant's clock
    // against the coordinator's: one clock here, so no skew but the call's own noise.
    let (document, declared) = metric(telemetry::CLOCK_SKEW);
    assert_eq!(declared["Unit"], "Milliseconds");
    let skews = document[telemetry::CLOCK_SKEW]
        .as_array()
        .cloned()
        .unwrap_or_else(|| vec![document[telemetry::CLOCK_SKEW].clone()]);
    assert!(!skews.is_empty() && skews.iter().all(|v| v.as_f64().is_some_and(|ms| ms < 50.0)), "{document}");

    // The sweeper's run, counted under the names the stuck-transactions alarm reads.
    let report =
        twopc::sweeper::SweepReport { committed: 2, aborted: 1, stuck: 1, locks_released: 4, ..Default::default() };
    report.record_metrics();
    let mut out = Vec::new();
    collector.flush(&mut out).unwrap();
    let document: Value = serde_json::from_str(String::from_utf8(out).unwrap().trim()).unwrap();
    assert_eq!(document[telemetry::STUCK_TRANSACTIONS], json!(1), "{document}");
    assert_eq!(document[telemetry::RECOVERED_TRANSACTIONS], json!(3), "{document}");
    assert_eq!(document[telemetry::RESOLVED_LOCKS], json!(4), "{document}");
    assert!(document.get(telemetry::COMMITTED).is_none(), "a flush starts from zero: {document}");

    // The stream processor's record given up on, under the name its alarm reads.
    let processor = twopc_fanout::StreamProcessor::new(
        twopc_fanout::FanoutConfig::new(&Default::default(), "transactions").unwrap(),
        twopc_fanout::memory::MemorySink::default(),
        twopc_fanout::memory::MemoryPoster::default(),
        twopc_fanout::memory::MemorySubscriptions::default(),
    );
    // A transaction record whose status is not a string.
    let unprocessable: aws_lambda_events::event::dynamodb::Event = serde_json::from_value(json!({"Records": [{
        "eventID": "ev-1", "eventName": "MODIFY", "eventSource": "aws:dynamodb", "awsRegion": "us-east-1",
        "eventSourceARN": "arn:aws:dynamodb:us-east-1:123456789012:table/transactions/stream/2024-05-01T00:00:00.000",
        "dynamodb": {"Keys": {"transactionId": {"S": "T1"}}, "SequenceNumber": "1", "SizeBytes": 10,
            "StreamViewType": "NEW_AND_OLD_IMAGES",
            "OldImage": {"transactionId": {"S": "T1"}, "status": {"S": "COMMITTING"}},
            "NewImage": {"transactionId": {"S": "T1"}, "status": {"N": "7"}}}
    }]}))
    .unwrap();
    processor.process(&unprocessable).await;
    let mut out = Vec::new();
    collector.flush(&mut out).unwrap();
    let document: Value = serde_json::from_str(String::from_utf8(out).unwrap().trim()).unwrap();
    assert_eq!(document[telemetry::UNPROCESSABLE_RECORDS], json!(1), "{document}");
}
