//! Reading a dead letter's range back from DynamoDB Streams, with the real `aws-sdk-dynamodbstreams`
//! client: `GetShardIterator` `AT_SEQUENCE_NUMBER`, then `GetRecords` until past the range's end or the
//! shard's end. Apart from the replay because what the stream still holds is its own question: a range
//! partly or wholly trimmed (streams keep 24 hours), a shard or stream gone, an open shard that brings
//! nothing yet.

use std::cmp::Ordering;

use aws_lambda_events::event::dynamodb::EventRecord;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use tracing::warn;

use super::letters::BatchInfo;
use crate::records::lambda_record;

/// `GetRecords` answers in a row that bring nothing before the range's end, on an open shard, after
/// which the range is reported as not read (the message stays, for the next replay).
const MAX_EMPTY_READS: usize = 20;

/// Compares two stream sequence numbers: decimal digits of any length (DynamoDB Local pads them with
/// zeros, DynamoDB does not), compared as numbers.
pub fn compare_sequence_numbers(a: &str, b: &str) -> Ordering {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// What reading a range from the stream came to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fetched {
    /// The records of the range the stream still holds, in order.
    pub records: Vec<EventRecord>,
    /// Why part or all of the range cannot be read any more (trimmed, the shard or stream gone).
    pub lost: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("reading the range from the stream: {0}")]
pub struct FetchError(pub String);

fn streams_error<E: std::error::Error + Send + Sync + 'static>(
    e: &aws_sdk_dynamodbstreams::error::SdkError<E>,
) -> String {
    aws_smithy_types::error::display::DisplayErrorContext(e).to_string()
}

/// Reads the records from `startSequenceNumber` to `endSequenceNumber` of one shard: `GetShardIterator`
/// `AT_SEQUENCE_NUMBER`, then `GetRecords` until a record past the end, or the shard's end. A start
/// already trimmed from the stream reads what is left of the range from the shard's trim horizon and
/// says the rest is lost; a shard or stream that no longer exists is lost whole.
pub async fn fetch_range(client: &aws_sdk_dynamodbstreams::Client, batch: &BatchInfo) -> Result<Fetched, FetchError> {
    let (start, end) = (batch.start_sequence_number.as_str(), batch.end_sequence_number.as_str());
    let mut fetched = Fetched::default();
    let iterator = client
        .get_shard_iterator()
        .stream_arn(&batch.stream_arn)
        .shard_id(&batch.shard_id)
        .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
        .sequence_number(start)
        .send()
        .await;
    let mut iterator = match iterator {
        Ok(out) => out.shard_iterator,
        Err(e) if e.as_service_error().is_some_and(|s| s.is_trimmed_data_access_exception()) => {
            fetched.lost = Some(format!(
                "the stream no longer holds sequence number {start} of shard {} (trimmed): records from it are lost",
                batch.shard_id
            ));
            client
                .get_shard_iterator()
                .stream_arn(&batch.stream_arn)
                .shard_id(&batch.shard_id)
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await
                .map_err(|e| FetchError(streams_error(&e)))?
                .shard_iterator
        }
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => {
            fetched.lost = Some(format!(
                "shard {} of {} no longer exists: the range {start}..={end} is lost ({})",
                batch.shard_id,
                batch.stream_arn,
                streams_error(&e)
            ));
            return Ok(fetched);
        }
        Err(e) => return Err(FetchError(streams_error(&e))),
    };
    let mut empty_reads = 0;
    let mut reached_end = false;
    while let Some(current) = iterator.take() {
        let out = match client.get_records().shard_iterator(current).send().await {
            Ok(out) => out,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_trimmed_data_access_exception()) => {
                fetched.lost = Some(format!(
                    "the stream trimmed shard {} while the range {start}..={end} was read: the rest is lost",
                    batch.shard_id
                ));
                break;
            }
            Err(e) => return Err(FetchError(streams_error(&e))),
        };
        let records = out.records.unwrap_or_default();
        if records.is_empty() {
            empty_reads += 1;
        } else {
            empty_reads = 0;
        }
        for record in records {
            let sequence = record.dynamodb.as_ref().and_then(|d| d.sequence_number.clone()).unwrap_or_default();
            if compare_sequence_numbers(&sequence, end) == Ordering::Greater {
                reached_end = true;
                break;
            }
            if compare_sequence_numbers(&sequence, start) != Ordering::Less {
                fetched.records.push(lambda_record(record, &batch.stream_arn));
            }
            if compare_sequence_numbers(&sequence, end) == Ordering::Equal {
                reached_end = true;
                break;
            }
        }
        if reached_end {
            break;
        }
        if empty_reads >= MAX_EMPTY_READS {
            return Err(FetchError(format!(
                "{MAX_EMPTY_READS} reads of shard {} in a row brought nothing before sequence number {end}",
                batch.shard_id
            )));
        }
        iterator = out.next_shard_iterator;
    }
    if !reached_end && fetched.lost.is_none() {
        fetched.lost = Some(format!(
            "shard {} ends before sequence number {end}: the records after {} are lost",
            batch.shard_id,
            fetched.records.last().and_then(|r| r.change.sequence_number.clone()).unwrap_or_else(|| start.to_owned())
        ));
    }
    if fetched.records.len() as u64 != batch.batch_size && fetched.lost.is_none() {
        warn!(
            shard = %batch.shard_id,
            found = fetched.records.len(),
            batch_size = batch.batch_size,
            "the range holds another number of records than the dead letter says"
        );
    }
    Ok(fetched)
}
