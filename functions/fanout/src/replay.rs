//! Replay of dead letters: what the event source mapping gave up on, read back from the stream and run
//! through the same fan-out.
//!
//! When a batch still fails after the mapping's retries (or its records grow older than its maximum
//! age), Lambda sends its on-failure destination (the dead-letter queue) an [`OnFailureRecord`]: not
//! the records, only where they are (`DDBStreamBatchInfo`: stream, shard, first and last sequence
//! numbers). [`replay`] reads each such message from a [`DeadLetters`] source (the SQS queue deployed,
//! a folder of JSON files in the local stack), fetches the range from DynamoDB Streams with the real
//! `aws-sdk-dynamodbstreams` client ([`fetch_range`]: `GetShardIterator` `AT_SEQUENCE_NUMBER`, then
//! `GetRecords` until past the range's end or the shard's end), converts each record to the Lambda
//! event ([`super::records::lambda_record`]) and hands them to [`StreamProcessor::process`], the very
//! code the function runs on the stream. Commits are re-sent to the lake with their `eventId`, so
//! replaying a range twice (or one that partly went through) is harmless: `eventId` dedupes.
//!
//! A message whose records all went through is deleted. One that did not (the lake still failing, the
//! stream unreadable, a range already trimmed from the stream) stays, is counted in `failed` and is
//! logged with why; a range the stream no longer holds (streams keep 24 hours) is logged as lost,
//! as an error, never skipped silently, and its message is kept for an operator to see.
//!
//! The messages' formats are in `replay/letters.rs`, the queue and the folder that keep them in
//! `replay/sources.rs`, the reading of a range back from the stream in `replay/stream.rs`; this file is
//! the replay itself and what the stream processor is invoked with.

use std::collections::BTreeSet;

use aws_lambda_events::event::dynamodb::Event;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{Instrument, error, info, info_span, warn};

use super::lake::ChangeSink;
use super::realtime::{ConnectionPoster, Subscriptions};
use super::records::lambda_event;
use super::{StreamProcessor, record_span};

mod letters;
mod sources;
mod stream;

pub use letters::{BatchInfo, DeadLetterBody, OnFailureRecord, RequestContext, UnprocessableRecord};
pub use sources::{DeadLetter, DeadLetters, DirectoryDeadLetters, RecordDeadLetters, SourceError, SqsDeadLetters};
pub use stream::{FetchError, Fetched, compare_sequence_numbers, fetch_range};

/// Stream processor: the queue of what its event source mappings give up on, which its
/// `replay-dead-letters` action reads back (named in [`twopc::environment`]).
pub use twopc::environment::DEAD_LETTER_QUEUE_URL;

/// The `action` of the stream processor's replay invocation.
pub const ACTION: &str = "replay-dead-letters";
/// Messages replayed by one invocation unless `maxMessages` says otherwise.
pub const DEFAULT_MAX_MESSAGES: usize = 10;
/// SQS hands out at most 10 messages per `ReceiveMessage`.
pub const MAX_RECEIVE: usize = 10;
/// Records per call of the fan-out, as the event source mapping's batch size (the template's).
pub const REPLAY_BATCH: usize = 100;

/// The largest dead-letter message: SQS's default maximum message size (256 KiB). A record whose
/// message would be larger is reported as a batch item failure instead, as before (retried, then handed
/// to the dead-letter queue by the event source mapping as a pointer into the stream).
pub const MAX_DEAD_LETTER_BYTES: usize = 256 * 1024;

/// The replay's answer (the stream processor's answer to `{"action": "replay-dead-letters"}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayAnswer {
    /// Dead-letter messages read.
    pub messages: u64,
    /// Stream records read back and run through the fan-out.
    pub records: u64,
    /// Messages kept because not all of their records went through (or are lost).
    pub failed: u64,
    /// Messages the source still holds after the run.
    pub remaining: u64,
}

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageOutcome {
    pub handle: String,
    /// None when the body is not an on-failure record.
    pub batch: Option<BatchInfo>,
    pub records: usize,
    pub deleted: bool,
    /// Why it was kept.
    pub error: Option<String>,
    pub lost: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    pub answer: ReplayAnswer,
    pub messages: Vec<MessageOutcome>,
}

/// Replays up to `max_messages` dead letters from `source` through `processor`. Fails only when the
/// source itself cannot be read (nothing then is deleted that was not replayed).
pub async fn replay<D, S, P, L>(
    source: &D,
    streams: &aws_sdk_dynamodbstreams::Client,
    processor: &StreamProcessor<S, P, L>,
    max_messages: usize,
) -> Result<ReplayReport, SourceError>
where
    D: DeadLetters,
    S: ChangeSink,
    P: ConnectionPoster,
    L: Subscriptions,
{
    let mut report = ReplayReport::default();
    let mut seen = BTreeSet::new();
    while report.messages.len() < max_messages {
        let want = (max_messages - report.messages.len()).min(MAX_RECEIVE);
        let letters = source.receive(want).await?;
        let fresh: Vec<DeadLetter> = letters.into_iter().filter(|l| seen.insert(l.handle.clone())).collect();
        if fresh.is_empty() {
            break;
        }
        for letter in fresh {
            let outcome = replay_one(source, streams, processor, letter).await;
            report.answer.messages += 1;
            report.answer.records += outcome.records as u64;
            if !outcome.deleted {
                report.answer.failed += 1;
            }
            report.messages.push(outcome);
        }
    }
    report.answer.remaining = source.remaining().await?;
    info!(
        messages = report.answer.messages,
        records = report.answer.records,
        failed = report.answer.failed,
        remaining = report.answer.remaining,
        "dead letters replayed"
    );
    Ok(report)
}

async fn replay_one<D, S, P, L>(
    source: &D,
    streams: &aws_sdk_dynamodbstreams::Client,
    processor: &StreamProcessor<S, P, L>,
    letter: DeadLetter,
) -> MessageOutcome
where
    D: DeadLetters,
    S: ChangeSink,
    P: ConnectionPoster,
    L: Subscriptions,
{
    let mut outcome = MessageOutcome {
        handle: letter.handle.clone(),
        batch: None,
        records: 0,
        deleted: false,
        error: None,
        lost: None,
    };
    let body = match DeadLetterBody::parse(&letter.body) {
        Ok(body) => body,
        Err(e) => {
            error!(handle = %letter.handle, error = %e, "a dead letter of neither kind is kept");
            outcome.error = Some(e);
            return outcome;
        }
    };
    let (span, pointer) = match &body {
        DeadLetterBody::OnFailure(record) => {
            let batch = record.batch.clone();
            outcome.batch = Some(batch.clone());
            let span = info_span!(
                "dead_letter",
                shard = %batch.shard_id,
                start = %batch.start_sequence_number,
                end = %batch.end_sequence_number,
                condition = %record.request_context.condition,
                request_id = %record.request_context.request_id,
            );
            (span, Some(batch))
        }
        DeadLetterBody::Unprocessable(unprocessable) => {
            let span = info_span!(
                "dead_letter",
                event_id = %unprocessable.record.event_id,
                dead_lettered_at = %unprocessable.dead_lettered_at,
                reason = %unprocessable.reason,
            );
            (span, None)
        }
    };
    async {
        let fetched = match (pointer, body) {
            (Some(batch), _) => match fetch_range(streams, &batch).await {
                Ok(fetched) => fetched,
                Err(e) => {
                    warn!(error = %e, "the dead letter's records could not be read; kept for the next replay");
                    outcome.error = Some(e.to_string());
                    return;
                }
            },
            // The record itself: nothing to fetch.
            (None, DeadLetterBody::Unprocessable(unprocessable)) => {
                Fetched { records: vec![unprocessable.record], lost: None }
            }
            (None, DeadLetterBody::OnFailure(_)) => unreachable!("an on-failure record is a pointer"),
        };
        if let Some(lost) = &fetched.lost {
            error!(records_still_held = fetched.records.len(), "records given up on are LOST from the lake: {lost}");
            outcome.lost = Some(lost.clone());
        }
        for chunk in fetched.records.chunks(REPLAY_BATCH) {
            let event: Event = lambda_event(chunk.to_vec());
            // Never dead-lettered again: a record that still cannot be delivered keeps its message.
            let result = processor.process_replayed(&event).await;
            outcome.records += chunk.len();
            if !result.response.batch_item_failures.is_empty() {
                for failure in &result.response.batch_item_failures {
                    if let Some(record) = chunk.iter().find(|r| r.change.sequence_number == failure.item_identifier) {
                        record_span(&record.event_id, super::decide::transaction_id_hint(record)).in_scope(|| {
                            warn!(sequence_number = ?record.change.sequence_number, "a replayed record still fails")
                        });
                    }
                }
                outcome.error = Some(format!(
                    "{} of {} records still fail in the fan-out",
                    result.response.batch_item_failures.len(),
                    chunk.len()
                ));
                warn!("the dead letter's records did not all go through; kept for the next replay");
                return;
            }
        }
        if outcome.lost.is_some() {
            outcome.error = Some("part of the range is lost (see lost)".to_owned());
            return;
        }
        match source.delete(&letter.handle).await {
            Ok(()) => {
                outcome.deleted = true;
                info!(records = outcome.records, "dead letter replayed and deleted");
            }
            Err(e) => {
                warn!(error = %e, "replayed, but the dead letter could not be deleted (a next replay repeats it; eventId dedupes)");
                outcome.error = Some(e.to_string());
            }
        }
    }
    .instrument(span)
    .await;
    outcome
}

/// What the stream processor function is invoked with.
#[derive(Debug, Clone, PartialEq)]
pub enum Invocation {
    /// A batch of the DynamoDB stream (the event source mapping).
    Stream(Box<Event>),
    /// `{"action": "replay-dead-letters", "maxMessages": N}`.
    Replay { max_messages: usize },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvocationError {
    #[error("unknown action {0:?}: the stream processor takes a DynamoDB stream event or {{\"action\": \"{ACTION}\"}}")]
    UnknownAction(String),
    #[error("maxMessages must be a whole number of at least 1, got {0}")]
    MaxMessages(String),
    #[error("not a DynamoDB stream event: {0}")]
    NotAnEvent(String),
}

impl Invocation {
    pub fn parse(payload: Value) -> Result<Invocation, InvocationError> {
        if let Some(action) = payload.get("action") {
            if action.as_str() != Some(ACTION) {
                return Err(InvocationError::UnknownAction(action.to_string()));
            }
            let max_messages = match payload.get("maxMessages") {
                None | Some(Value::Null) => DEFAULT_MAX_MESSAGES,
                Some(n) => match n.as_u64() {
                    Some(n) if n >= 1 => n as usize,
                    _ => return Err(InvocationError::MaxMessages(n.to_string())),
                },
            };
            return Ok(Invocation::Replay { max_messages });
        }
        serde_json::from_value(payload)
            .map(|event| Invocation::Stream(Box::new(event)))
            .map_err(|e| InvocationError::NotAnEvent(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use super::*;
    use serde_json::json;

    /// Lambda's on-failure record for a DynamoDB stream, as AWS documents it.
    pub(crate) const AWS_SAMPLE: &str = r#"{
        "requestContext": {
            "requestId": "316aa6d0-8154-xmpl-9af7-85d5f4a6bc81",
            "functionArn": "arn:aws:lambda:us-east-2:123456789012:function:myfunction",
            "condition": "RetryAttemptsExhausted",
            "approximateInvokeCount": 1
        },
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
        "version": "1.0",
        "timestamp": "2019-11-14T00:13:49.717Z",
        "DDBStreamBatchInfo": {
            "shardId": "shardId-00000001573689847184-864758bb",
            "startSequenceNumber": "800000000003126276362",
            "endSequenceNumber": "800000000003126276362",
            "approximateArrivalOfFirstRecord": "2019-11-14T00:13:19Z",
            "approximateArrivalOfLastRecord": "2019-11-14T00:13:19Z",
            "batchSize": 1,
            "streamArn": "arn:aws:dynamodb:us-east-2:123456789012:table/mytable/stream/2019-11-14T00:04:06.388"
        }
    }"#;

    #[test]
    fn lambdas_on_failure_record_parses_and_writes_back_the_same() {
        let record = OnFailureRecord::parse(AWS_SAMPLE).unwrap();
        assert_eq!(record.request_context.condition, "RetryAttemptsExhausted");
        assert_eq!(record.batch.shard_id, "shardId-00000001573689847184-864758bb");
        assert_eq!(record.batch.batch_size, 1);
        let written = serde_json::to_value(&record).unwrap();
        assert_eq!(written, serde_json::from_str::<Value>(AWS_SAMPLE).unwrap());
        // Without a response context (the function could not be invoked): still a record.
        let mut bare: Value = serde_json::from_str(AWS_SAMPLE).unwrap();
        bare.as_object_mut().unwrap().remove("responseContext");
        assert!(OnFailureRecord::parse(&bare.to_string()).unwrap().response_context.is_none());
        assert!(OnFailureRecord::parse(r#"{"Records": []}"#).is_err());
    }

    #[test]
    fn sequence_numbers_compare_as_numbers() {
        assert_eq!(compare_sequence_numbers("000000000000000000012", "9"), Ordering::Greater);
        assert_eq!(compare_sequence_numbers("100", "0100"), Ordering::Equal);
        assert_eq!(compare_sequence_numbers("800000000003126276362", "800000000003126276363"), Ordering::Less);
    }

    #[test]
    fn invocations_are_told_apart() {
        assert_eq!(
            Invocation::parse(json!({"action": ACTION})).unwrap(),
            Invocation::Replay { max_messages: DEFAULT_MAX_MESSAGES }
        );
        assert_eq!(
            Invocation::parse(json!({"action": ACTION, "maxMessages": 25})).unwrap(),
            Invocation::Replay { max_messages: 25 }
        );
        assert!(
            matches!(Invocation::parse(json!({"Records": []})).unwrap(), Invocation::Stream(e) if e.records.is_empty())
        );
        for bad in [
            json!({"action": "replay"}),
            json!({"action": ACTION, "maxMessages": 0}),
            json!({"action": ACTION, "maxMessages": "x"}),
        ] {
            let err = Invocation::parse(bad.clone()).unwrap_err().to_string();
            assert!(err.contains("action") || err.contains("maxMessages"), "{bad}: {err}");
        }
        assert!(Invocation::parse(json!({"Records": "no"})).is_err());
    }

    #[tokio::test]
    async fn a_directory_hands_each_message_out_once_and_deletes_replayed_ones() {
        let dir = std::env::temp_dir().join(format!("dead-letters-{}", uuid::Uuid::new_v4().simple()));
        let source = DirectoryDeadLetters::new(&dir);
        assert_eq!(source.remaining().await.unwrap(), 0, "a folder not made yet holds nothing");
        let mut record = OnFailureRecord::parse(AWS_SAMPLE).unwrap();
        let first = source.put(&record).unwrap();
        record.batch.start_sequence_number = "900".into();
        source.put(&record).unwrap();
        assert_eq!(source.remaining().await.unwrap(), 2);
        let got = source.receive(1).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].handle, first.display().to_string());
        assert_eq!(OnFailureRecord::parse(&got[0].body).unwrap().batch.start_sequence_number, "800000000003126276362");
        let rest = source.receive(10).await.unwrap();
        assert_eq!(rest.len(), 1, "the first is not handed out again");
        assert!(source.receive(10).await.unwrap().is_empty());
        source.delete(&got[0].handle).await.unwrap();
        assert_eq!(source.remaining().await.unwrap(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }
}
