//! Stream processor: DynamoDB Streams of the participant tables and the transactions table, with
//! `ReportBatchItemFailures`. Commits go to Firehose and to WebSocket subscribers; the logic is in
//! `twopc_fanout`.
//!
//! Invoked with `{"action": "replay-dead-letters", "maxMessages": N}` (default 10) it replays what the
//! event source mappings gave up on, from the queue `DEAD_LETTER_QUEUE_URL`, through the same fan-out
//! (`twopc_fanout::replay`), and answers `{"messages", "records", "failed", "remaining"}`.

use std::sync::Arc;

use aws_lambda_events::event::dynamodb::Event;
use aws_lambda_events::event::streams::DynamoDbEventResponse;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::Value;
use twopc::{config, telemetry};
use twopc_fanout::replay::{self, DirectoryDeadLetters, Invocation, SqsDeadLetters};
use twopc_fanout::{ApiGatewayPoster, ConnectionStore, FanoutConfig, FirehoseSink, StreamProcessor};

type Processor = StreamProcessor<FirehoseSink, ApiGatewayPoster, ConnectionStore>;

/// The dead-letter queue: SQS deployed; a folder (`file://...`) under the local stack's `--lambda` mode.
enum Queue {
    Sqs(Arc<SqsDeadLetters>),
    Directory(Arc<DirectoryDeadLetters>),
}

struct Function {
    processor: Processor,
    streams: aws_sdk_dynamodbstreams::Client,
    /// None when `DEAD_LETTER_QUEUE_URL` is not set: a replay then fails, saying so, and a record given
    /// up on is reported for retry.
    dead_letters: Option<Queue>,
}

async fn handle(function: &Function, event: LambdaEvent<Value>) -> Result<Value, Error> {
    match Invocation::parse(event.payload)? {
        Invocation::Stream(batch) => Ok(serde_json::to_value(stream(&function.processor, &batch).await)?),
        Invocation::Replay { max_messages } => {
            let (processor, streams) = (&function.processor, &function.streams);
            let report = match &function.dead_letters {
                Some(Queue::Sqs(queue)) => replay::replay(queue.as_ref(), streams, processor, max_messages).await?,
                Some(Queue::Directory(dir)) => replay::replay(dir.as_ref(), streams, processor, max_messages).await?,
                None => return Err(config::ConfigError::Missing(twopc_fanout::replay::DEAD_LETTER_QUEUE_URL).into()),
            };
            Ok(serde_json::to_value(report.answer)?)
        }
    }
}

async fn stream(processor: &Processor, event: &Event) -> DynamoDbEventResponse {
    processor.process(event).await.response
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_tracing();
    let fanout = FanoutConfig::from_env()?;
    let stream = config::required(twopc_fanout::lake::FIREHOSE_STREAM_NAME)?;
    let websocket = config::required(twopc_fanout::realtime::WEBSOCKET_ENDPOINT)?;
    let connections = config::or_default(
        twopc_fanout::connections::CONNECTIONS_TABLE_NAME,
        twopc_fanout::connections::DEFAULT_CONNECTIONS_TABLE,
    );
    let sdk = config::aws().await;
    let access = twopc::access::Policy::from_env()?;
    let processor = StreamProcessor::new(
        fanout,
        FirehoseSink::from_config(&sdk, stream),
        ApiGatewayPoster::from_config(&sdk, &websocket),
        ConnectionStore::from_config(&sdk, connections).with_access(access.clone(), None),
    )
    .with_access(access);
    let dead_letters = config::required(twopc_fanout::replay::DEAD_LETTER_QUEUE_URL)
        .ok()
        .filter(|url| !url.is_empty())
        .map(|url| match url.strip_prefix("file://") {
            Some(dir) => Queue::Directory(Arc::new(DirectoryDeadLetters::new(dir))),
            None => Queue::Sqs(Arc::new(SqsDeadLetters::from_config(&sdk, url))),
        });
    let processor = match &dead_letters {
        Some(Queue::Sqs(queue)) => processor.with_dead_letters(queue.clone()),
        Some(Queue::Directory(dir)) => processor.with_dead_letters(dir.clone()),
        None => processor,
    };
    let metrics = telemetry::install_emf_from_env(telemetry::Zeros::Omitted);
    let function = Function { processor, streams: aws_sdk_dynamodbstreams::Client::new(&sdk), dead_letters };
    let function = &function;
    lambda_runtime::run(service_fn(move |event| async move {
        let answer = handle(function, event).await;
        telemetry::flush(metrics);
        answer
    }))
    .await
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use twopc_fanout::memory::{MemoryPoster, MemorySink, MemorySubscriptions};
    use twopc_fanout::{Topic, prepare};

    fn config() -> FanoutConfig {
        let tables = BTreeMap::from([
            ("service-a".to_owned(), "service-a-data".to_owned()),
            ("service-b".to_owned(), "service-b-data".to_owned()),
        ]);
        FanoutConfig::new(&tables, "transactions").unwrap()
    }

    /// What the runtime does with the payload: JSON into the event type.
    fn parse(path: &str) -> Event {
        let text = std::fs::read(format!("{}/../../events/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        serde_json::from_slice(&text).unwrap()
    }

    #[tokio::test]
    async fn commit_event_gives_exactly_its_commit() {
        let event = parse("stream-processor-commit.json");
        let batch = prepare(&config(), &event);
        assert_eq!((batch.commits, batch.skipped, batch.unprocessable.len()), (1, 1, 0));

        let subscriptions = MemorySubscriptions::default();
        subscriptions.subscribe("c", &Topic::entity("service-a-data", "A"));
        let processor = StreamProcessor::new(config(), MemorySink::default(), MemoryPoster::default(), subscriptions);
        let outcome = processor.process(&event).await;
        assert!(outcome.response.batch_item_failures.is_empty());
        let lake = processor.sink.json();
        assert_eq!(lake.len(), 1);
        assert_eq!(lake[0]["transactionId"], "5d2f8e3a-1c7b-4e9a-8f60-2a4b9c1d0e77");
        assert_eq!(lake[0]["change"], "MODIFY");
        assert_eq!(lake[0]["version"], 4);
        assert_eq!(lake[0]["committedAt"], "2024-05-01T12:00:01Z");
        assert_eq!(lake[0]["previous"]["balance"], 400);
        assert_eq!(processor.poster.posts("c").len(), 1);
    }

    #[tokio::test]
    async fn transaction_event_tells_its_followers() {
        let event = parse("stream-processor-transaction.json");
        let batch = prepare(&config(), &event);
        assert_eq!((batch.commits, batch.outcomes, batch.unprocessable.len(), batch.lines.len()), (0, 1, 0, 1));
        let subscriptions = MemorySubscriptions::default();
        subscriptions.subscribe("c", &Topic::transaction("5d2f8e3a-1c7b-4e9a-8f60-2a4b9c1d0e77"));
        let processor = StreamProcessor::new(config(), MemorySink::default(), MemoryPoster::default(), subscriptions);
        let outcome = processor.process(&event).await;
        assert!(outcome.response.batch_item_failures.is_empty());
        // Its lake line: the participants and the item each commit wrote (issue 47).
        let lake = processor.sink.json();
        assert_eq!(lake.len(), 1);
        assert_eq!(
            (&lake[0]["kind"], &lake[0]["transactionId"], &lake[0]["changes"]),
            (
                &serde_json::json!("transaction"),
                &serde_json::json!("5d2f8e3a-1c7b-4e9a-8f60-2a4b9c1d0e77"),
                &serde_json::json!(2)
            )
        );
        assert_eq!(
            lake[0]["participants"],
            serde_json::json!([
                {"service": "service-a", "table": "service-a-data", "changes": 1},
                {"service": "service-b", "table": "service-b-data", "changes": 1}
            ])
        );
        let posts = processor.poster.posts("c");
        let message: serde_json::Value = serde_json::from_slice(&posts[0]).unwrap();
        assert_eq!(
            message,
            serde_json::json!({"type": "transaction", "transactionId": "5d2f8e3a-1c7b-4e9a-8f60-2a4b9c1d0e77", "status": "COMMITTED"})
        );
    }

    /// The replay sample is the replay invocation, with its maxMessages.
    #[test]
    fn replay_event_is_a_replay() {
        let text =
            std::fs::read(format!("{}/../../events/stream-processor-replay.json", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let invocation = Invocation::parse(serde_json::from_slice(&text).unwrap()).unwrap();
        assert_eq!(invocation, Invocation::Replay { max_messages: 10 });
    }

    /// The response is what Lambda expects with ReportBatchItemFailures.
    #[test]
    fn response_shape() {
        let response = DynamoDbEventResponse::default();
        assert_eq!(serde_json::to_string(&response).unwrap(), r#"{"batchItemFailures":[]}"#);
    }
}
