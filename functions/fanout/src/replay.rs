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

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use aws_lambda_events::event::dynamodb::{Event, EventRecord};
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{Instrument, error, info, info_span, warn};

use super::lake::ChangeSink;
use super::realtime::{ConnectionPoster, Subscriptions};
use super::records::{lambda_event, lambda_record};
use super::{StreamProcessor, record_span};

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
/// `GetRecords` answers in a row that bring nothing before the range's end, on an open shard, after
/// which the range is reported as not read (the message stays, for the next replay).
const MAX_EMPTY_READS: usize = 20;

/// Lambda's on-failure record for a DynamoDB stream event source (the body of a dead-letter message).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OnFailureRecord {
    pub request_context: RequestContext,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_context: Option<Value>,
    pub version: String,
    pub timestamp: String,
    #[serde(rename = "DDBStreamBatchInfo")]
    pub batch: BatchInfo,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestContext {
    pub request_id: String,
    pub function_arn: String,
    /// `RetryAttemptsExhausted`, `RecordAgeExceeded`, ...
    pub condition: String,
    pub approximate_invoke_count: u64,
}

/// Where the records given up on are: one shard, first to last sequence number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchInfo {
    pub shard_id: String,
    pub start_sequence_number: String,
    pub end_sequence_number: String,
    pub approximate_arrival_of_first_record: String,
    pub approximate_arrival_of_last_record: String,
    pub batch_size: u64,
    pub stream_arn: String,
}

impl OnFailureRecord {
    pub fn parse(body: &str) -> Result<OnFailureRecord, serde_json::Error> {
        serde_json::from_str(body)
    }
}

/// A stream record the processor itself gave up on, with its content: one it cannot judge (a `status`
/// that is not a string, an unknown event name...) or whose lake line is larger than Firehose takes. Sent
/// to the dead-letter queue by the processor rather than reported as a batch item failure, so that the
/// records behind it on its shard flow instead of waiting 22 hours of retries; and with the record
/// itself, since the stream keeps it 24 hours only. [`replay`] runs it through the fan-out again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnprocessableRecord {
    /// Why the processor could not deliver it.
    pub reason: String,
    /// When it gave up (RFC 3339, UTC).
    pub dead_lettered_at: String,
    /// The stream record as Lambda delivered it.
    pub record: EventRecord,
}

/// The largest dead-letter message: SQS's default maximum message size (256 KiB). A record whose
/// message would be larger is reported as a batch item failure instead, as before (retried, then handed
/// to the dead-letter queue by the event source mapping as a pointer into the stream).
pub const MAX_DEAD_LETTER_BYTES: usize = 256 * 1024;

/// A dead-letter message of either kind: Lambda's pointer into the stream, or a record the processor
/// dead-lettered itself (`{"unprocessableRecord": {...}}`).
#[derive(Debug, Clone, PartialEq)]
pub enum DeadLetterBody {
    OnFailure(Box<OnFailureRecord>),
    Unprocessable(Box<UnprocessableRecord>),
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UnprocessableMessage {
    unprocessable_record: UnprocessableRecord,
}

impl DeadLetterBody {
    pub fn parse(body: &str) -> Result<DeadLetterBody, String> {
        let value: Value = serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
        if value.get("unprocessableRecord").is_some() {
            let message: UnprocessableMessage =
                serde_json::from_value(value).map_err(|e| format!("not an unprocessable record: {e}"))?;
            return Ok(DeadLetterBody::Unprocessable(Box::new(message.unprocessable_record)));
        }
        serde_json::from_value(value)
            .map(|r| DeadLetterBody::OnFailure(Box::new(r)))
            .map_err(|e| format!("not a DynamoDB stream on-failure record: {e}"))
    }
}

impl UnprocessableRecord {
    pub fn new(record: &EventRecord, reason: impl Into<String>) -> UnprocessableRecord {
        UnprocessableRecord {
            reason: reason.into(),
            dead_lettered_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            record: record.clone(),
        }
    }

    /// The dead-letter message's body.
    pub fn to_body(&self) -> String {
        serde_json::to_string(&UnprocessableMessage { unprocessable_record: self.clone() })
            .expect("a stream record serializes")
    }
}

/// Where the processor dead-letters a record it gives up on (see [`UnprocessableRecord`]).
pub trait RecordDeadLetters: Send + Sync {
    fn put<'a>(&'a self, body: &'a str) -> futures::future::BoxFuture<'a, Result<(), SourceError>>;
}

/// Compares two stream sequence numbers: decimal digits of any length (DynamoDB Local pads them with
/// zeros, DynamoDB does not), compared as numbers.
pub fn compare_sequence_numbers(a: &str, b: &str) -> Ordering {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// One message of a dead-letter source: a handle to delete it by, and its body (an [`OnFailureRecord`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub handle: String,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("dead-letter source: {0}")]
pub struct SourceError(pub String);

/// Where dead letters are read from.
pub trait DeadLetters: Send + Sync {
    /// At most `max` messages not handed out before in this run (a message received and kept is not
    /// received again by the same run: SQS hides it for its visibility timeout).
    fn receive(&self, max: usize) -> impl Future<Output = Result<Vec<DeadLetter>, SourceError>> + Send;
    /// Removes a message for good (it was replayed).
    fn delete(&self, handle: &str) -> impl Future<Output = Result<(), SourceError>> + Send;
    /// How many messages the source still holds (SQS: `ApproximateNumberOfMessages`).
    fn remaining(&self) -> impl Future<Output = Result<u64, SourceError>> + Send;
}

/// The deployed dead-letter queue.
#[derive(Debug, Clone)]
pub struct SqsDeadLetters {
    client: aws_sdk_sqs::Client,
    queue_url: String,
}

impl SqsDeadLetters {
    pub fn new(client: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        SqsDeadLetters { client, queue_url: queue_url.into() }
    }

    /// A client on the shared AWS configuration (`AWS_ENDPOINT_URL_SQS` points it elsewhere).
    pub fn from_config(sdk: &aws_config::SdkConfig, queue_url: impl Into<String>) -> Self {
        Self::new(aws_sdk_sqs::Client::new(sdk), queue_url)
    }
}

fn sdk_error<E: std::error::Error + Send + Sync + 'static, R: std::fmt::Debug>(
    what: &str,
    e: aws_smithy_runtime_api::client::result::SdkError<E, R>,
) -> SourceError {
    SourceError(format!("{what}: {}", aws_smithy_types::error::display::DisplayErrorContext(&e)))
}

impl RecordDeadLetters for SqsDeadLetters {
    fn put<'a>(&'a self, body: &'a str) -> futures::future::BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            self.client
                .send_message()
                .queue_url(&self.queue_url)
                .message_body(body)
                .send()
                .await
                .map_err(|e| sdk_error("SendMessage", e))?;
            Ok(())
        })
    }
}

impl DeadLetters for SqsDeadLetters {
    async fn receive(&self, max: usize) -> Result<Vec<DeadLetter>, SourceError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(max.clamp(1, MAX_RECEIVE) as i32)
            // A short long poll: an empty answer then means the queue has nothing visible, not that
            // the servers sampled happened to hold nothing.
            .wait_time_seconds(1)
            .send()
            .await
            .map_err(|e| sdk_error("ReceiveMessage", e))?;
        Ok(out
            .messages
            .unwrap_or_default()
            .into_iter()
            .map(|m| DeadLetter { handle: m.receipt_handle.unwrap_or_default(), body: m.body.unwrap_or_default() })
            .collect())
    }

    async fn delete(&self, handle: &str) -> Result<(), SourceError> {
        self.client
            .delete_message()
            .queue_url(&self.queue_url)
            .receipt_handle(handle)
            .send()
            .await
            .map_err(|e| sdk_error("DeleteMessage", e))?;
        Ok(())
    }

    async fn remaining(&self) -> Result<u64, SourceError> {
        use aws_sdk_sqs::types::QueueAttributeName;
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .map_err(|e| sdk_error("GetQueueAttributes", e))?;
        let text = out
            .attributes
            .as_ref()
            .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages))
            .ok_or_else(|| SourceError("GetQueueAttributes answered no ApproximateNumberOfMessages".into()))?;
        text.parse().map_err(|_| SourceError(format!("ApproximateNumberOfMessages {text:?} is not a number")))
    }
}

/// A folder of dead letters, one JSON file per message (the local stack's `.local/dead-letters/`):
/// the handle is the file's path; a replayed message's file is deleted.
#[derive(Debug)]
pub struct DirectoryDeadLetters {
    dir: PathBuf,
    /// Handed out in this run: not handed out again (as SQS's visibility timeout).
    received: Mutex<BTreeSet<PathBuf>>,
}

impl DirectoryDeadLetters {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        DirectoryDeadLetters { dir: dir.into(), received: Mutex::new(BTreeSet::new()) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The message files, oldest first (their names start with the time they were written).
    pub fn files(&self) -> std::io::Result<Vec<PathBuf>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(e),
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        Ok(files)
    }

    /// Writes one message (written aside, then renamed: a reader never sees half of it). Its name:
    /// `<UTC time>-<shard id>-<first sequence number>.json`.
    pub fn put(&self, record: &OnFailureRecord) -> std::io::Result<PathBuf> {
        let body = serde_json::to_vec_pretty(record).expect("a record serializes");
        self.write(&format!("{}-{}", safe(&record.batch.shard_id), safe(&record.batch.start_sequence_number)), &body)
    }

    fn write(&self, what: &str, body: &[u8]) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let now = chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ");
        let path = self.dir.join(format!("{now}-{what}.json"));
        let partial = path.with_extension("partial");
        std::fs::write(&partial, body)?;
        std::fs::rename(&partial, &path)?;
        Ok(path)
    }
}

/// A file name's part from any text: letters, digits, `-`, `_` and `.` kept, the rest `_`.
fn safe(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' }).collect()
}

/// A record the processor dead-lettered: `<UTC time>-unprocessable-<eventID>.json`.
impl RecordDeadLetters for DirectoryDeadLetters {
    fn put<'a>(&'a self, body: &'a str) -> futures::future::BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let event_id = DeadLetterBody::parse(body)
                .ok()
                .and_then(|b| match b {
                    DeadLetterBody::Unprocessable(u) => Some(u.record.event_id),
                    DeadLetterBody::OnFailure(_) => None,
                })
                .unwrap_or_default();
            self.write(&format!("unprocessable-{}", safe(&event_id)), body.as_bytes())
                .map(|_| ())
                .map_err(|e| SourceError(format!("writing to {}: {e}", self.dir.display())))
        })
    }
}

impl DeadLetters for DirectoryDeadLetters {
    async fn receive(&self, max: usize) -> Result<Vec<DeadLetter>, SourceError> {
        let files = self.files().map_err(|e| SourceError(format!("listing {}: {e}", self.dir.display())))?;
        let mut received = self.received.lock().expect("not poisoned");
        let mut out = Vec::new();
        for file in files {
            if out.len() >= max {
                break;
            }
            if received.contains(&file) {
                continue;
            }
            let body =
                std::fs::read_to_string(&file).map_err(|e| SourceError(format!("reading {}: {e}", file.display())))?;
            received.insert(file.clone());
            out.push(DeadLetter { handle: file.display().to_string(), body });
        }
        Ok(out)
    }

    async fn delete(&self, handle: &str) -> Result<(), SourceError> {
        std::fs::remove_file(handle).map_err(|e| SourceError(format!("deleting {handle}: {e}")))
    }

    async fn remaining(&self) -> Result<u64, SourceError> {
        let files = self.files().map_err(|e| SourceError(format!("listing {}: {e}", self.dir.display())))?;
        Ok(files.len() as u64)
    }
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
