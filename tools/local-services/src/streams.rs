//! DynamoDB Streams, read the way Lambda's event source mapping reads them, turned into the Lambda
//! DynamoDB event the stream processor takes.
//!
//! The Streams API (`aws-sdk-dynamodbstreams`) and the Lambda event carry the same record with small
//! differences: the SDK has typed fields (`OperationType`, `DateTime`, its own `AttributeValue`) where
//! the event has JSON (`eventName` text, `ApproximateCreationDateTime` as epoch seconds, DynamoDB
//! JSON images), and only the event has `eventSourceARN` (the stream ARN, from which the processor
//! reads the table name). [`lambda_record`] does that conversion; [`StreamReader`] polls every shard.
//!
//! This lives here rather than in `twopc::fanout` because the core crate does not depend on the
//! Streams SDK (only the local stack and the tests read streams themselves; Lambda does it in AWS).

use std::collections::{BTreeMap, HashMap};

use aws_lambda_events::event::dynamodb::{Event, EventRecord, StreamRecord, StreamViewType, UserIdentity};
use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::{self as sdk, ShardIteratorType};
use serde_dynamo::AttributeValue;

/// A Streams SDK attribute value as the Lambda event's (serde_dynamo) one. Numbers stay text.
pub fn attribute(value: sdk::AttributeValue) -> AttributeValue {
    match value {
        sdk::AttributeValue::S(s) => AttributeValue::S(s),
        sdk::AttributeValue::N(n) => AttributeValue::N(n),
        sdk::AttributeValue::B(b) => AttributeValue::B(b.into_inner()),
        sdk::AttributeValue::Bool(b) => AttributeValue::Bool(b),
        sdk::AttributeValue::Null(n) => AttributeValue::Null(n),
        sdk::AttributeValue::M(m) => AttributeValue::M(m.into_iter().map(|(k, v)| (k, attribute(v))).collect()),
        sdk::AttributeValue::L(l) => AttributeValue::L(l.into_iter().map(attribute).collect()),
        sdk::AttributeValue::Ss(s) => AttributeValue::Ss(s),
        sdk::AttributeValue::Ns(n) => AttributeValue::Ns(n),
        sdk::AttributeValue::Bs(b) => AttributeValue::Bs(b.into_iter().map(|b| b.into_inner()).collect()),
        other => {
            tracing::warn!(?other, "attribute type unknown to this SDK version; read as NULL");
            AttributeValue::Null(true)
        }
    }
}

fn item(image: Option<HashMap<String, sdk::AttributeValue>>) -> serde_dynamo::Item {
    let map: HashMap<String, AttributeValue> =
        image.unwrap_or_default().into_iter().map(|(k, v)| (k, attribute(v))).collect();
    serde_dynamo::Item::from(map)
}

/// One Streams API record as the Lambda event record for the stream `stream_arn`.
pub fn lambda_record(record: sdk::Record, stream_arn: &str) -> EventRecord {
    let mut out = EventRecord::default();
    out.aws_region = record.aws_region.unwrap_or_default();
    out.event_id = record.event_id.unwrap_or_default();
    out.event_name = record.event_name.map(|n| n.as_str().to_owned()).unwrap_or_default();
    out.event_source = record.event_source.or_else(|| Some("aws:dynamodb".to_owned()));
    out.event_version = record.event_version;
    out.event_source_arn = Some(stream_arn.to_owned());
    out.user_identity = record.user_identity.map(|identity| {
        let mut user = UserIdentity::default();
        user.type_ = identity.r#type.unwrap_or_default();
        user.principal_id = identity.principal_id.unwrap_or_default();
        user
    });
    if let Some(stream) = record.dynamodb {
        let mut change = StreamRecord::default();
        if let Some(time) = stream
            .approximate_creation_date_time
            .and_then(|at| chrono::DateTime::from_timestamp(at.secs(), at.subsec_nanos()))
        {
            change.approximate_creation_date_time = time;
        }
        change.keys = item(stream.keys);
        change.new_image = item(stream.new_image);
        change.old_image = item(stream.old_image);
        change.sequence_number = stream.sequence_number;
        change.size_bytes = stream.size_bytes.unwrap_or_default();
        change.stream_view_type = stream.stream_view_type.and_then(|v| match v {
            sdk::StreamViewType::KeysOnly => Some(StreamViewType::KeysOnly),
            sdk::StreamViewType::NewImage => Some(StreamViewType::NewImage),
            sdk::StreamViewType::OldImage => Some(StreamViewType::OldImage),
            sdk::StreamViewType::NewAndOldImages => Some(StreamViewType::NewAndOldImages),
            _ => None,
        });
        out.change = change;
    }
    out
}

/// Records as the event Lambda would deliver.
pub fn lambda_event(records: Vec<EventRecord>) -> Event {
    let mut event = Event::default();
    event.records = records;
    event
}

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
