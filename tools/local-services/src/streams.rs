//! DynamoDB Streams, read the way Lambda's event source mapping reads them, turned into the Lambda
//! DynamoDB event the stream processor takes.
//!
//! The Streams API (`aws-sdk-dynamodbstreams`) and the Lambda event carry the same record with small
//! differences: the SDK has typed fields (`OperationType`, `DateTime`, its own `AttributeValue`) where
//! the event has JSON (`eventName` text, `ApproximateCreationDateTime` as epoch seconds, DynamoDB
//! JSON images), and only the event has `eventSourceARN` (the stream ARN, from which the processor
//! reads the table name). [`lambda_record`] (from `twopc_fanout::records`, shared with the
//! dead-letter replay) does that conversion; [`StreamReader`] polls every shard.

use std::collections::BTreeMap;

use aws_lambda_events::event::dynamodb::EventRecord;
use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
pub use twopc_fanout::records::{attribute, lambda_event, lambda_record};

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StreamError(String);

fn stream_error<E>(err: aws_sdk_dynamodbstreams::error::SdkError<E>) -> StreamError
where
    E: std::error::Error + Send + Sync + 'static,
{
    StreamError(aws_smithy_types::error::display::DisplayErrorContext(&err).to_string())
}

/// Where a reader starts in shards that exist when it is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest record kept (24 hours).
    TrimHorizon,
    /// Only records written from now on.
    Latest,
}

/// Reads every shard of one stream, oldest first, as Lambda's event source mapping does. Shards
/// that appear later (splits) are read from their start.
pub struct StreamReader {
    client: Client,
    stream_arn: String,
    /// Shard id → next iterator; None once a closed shard is read to its end.
    shards: BTreeMap<String, Option<String>>,
    start: StartAt,
    started: bool,
}

impl StreamReader {
    pub fn new(client: Client, stream_arn: impl Into<String>, start: StartAt) -> Self {
        StreamReader { client, stream_arn: stream_arn.into(), shards: BTreeMap::new(), start, started: false }
    }

    async fn discover(&mut self) -> Result<(), StreamError> {
        let mut exclusive_start: Option<String> = None;
        let mut found = Vec::new();
        loop {
            let out = self
                .client
                .describe_stream()
                .stream_arn(&self.stream_arn)
                .set_exclusive_start_shard_id(exclusive_start.take())
                .send()
                .await
                .map_err(stream_error)?;
            let Some(description) = out.stream_description else { break };
            for shard in description.shards.unwrap_or_default() {
                if let Some(id) = shard.shard_id {
                    found.push(id);
                }
            }
            match description.last_evaluated_shard_id {
                Some(last) => exclusive_start = Some(last),
                None => break,
            }
        }
        let first_look = !self.started;
        self.started = true;
        for shard_id in found {
            if self.shards.contains_key(&shard_id) {
                continue;
            }
            let kind = if first_look && self.start == StartAt::Latest {
                ShardIteratorType::Latest
            } else {
                ShardIteratorType::TrimHorizon
            };
            let iterator = self
                .client
                .get_shard_iterator()
                .stream_arn(&self.stream_arn)
                .shard_id(&shard_id)
                .shard_iterator_type(kind)
                .send()
                .await
                .map_err(stream_error)?
                .shard_iterator;
            self.shards.insert(shard_id, iterator);
        }
        Ok(())
    }

    /// One GetRecords per open shard (after looking for new shards): the records that came since the
    /// last poll, as Lambda event records, in shard order. A poll that fails moves no shard forward, so
    /// the next one returns everything again (at least once, as Lambda delivers).
    pub async fn poll(&mut self) -> Result<Vec<EventRecord>, StreamError> {
        self.discover().await?;
        let mut records = Vec::new();
        let mut advanced = Vec::new();
        for (shard_id, iterator) in &self.shards {
            let Some(current) = iterator.clone() else { continue };
            let out = self.client.get_records().shard_iterator(current).send().await.map_err(stream_error)?;
            advanced.push((shard_id.clone(), out.next_shard_iterator));
            records.extend(out.records.unwrap_or_default().into_iter().map(|r| lambda_record(r, &self.stream_arn)));
        }
        self.shards.extend(advanced);
        Ok(records)
    }
}
