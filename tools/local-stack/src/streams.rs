//! Stream polling, as Lambda's DynamoDB event source mapping does it (the template's settings):
//! every shard of a table's stream is read in order (a child shard only once its parent is read to
//! its end), in batches of at most [`BATCH_SIZE`] records converted to the Lambda event; with
//! `ReportBatchItemFailures` a batch is retried from its first failed record, a function error
//! retries the batch split in half (`BisectBatchOnFunctionError`), and after [`MAX_RETRIES`] retries
//! the records are skipped and, as the deployed mapping sends its on-failure destination, Lambda's
//! on-failure record (shard and sequence range) is written as a file in the dead-letter folder
//! (`.local/dead-letters/`), where `twopc-local replay` reads it back (`twopc_fanout::replay`).
//!
//! A shard read to its end is never read again, though DescribeStream lists a closed shard for 24 h.
//! Where the tables outlive the stack (kept data, or a DynamoDB endpoint of the user's), each
//! stream's position is kept in a [`Checkpoint`] file, written after every delivered batch: a restart
//! resumes after the last record delivered, and a clean stop first drains what the stream holds.
//!
//! **Polling backs off when it finds nothing.** A shard is polled again at once while it yields
//! records. A pass that finds nothing waits the stack's poll interval (`Config::poll_interval`),
//! and every further empty pass doubles the wait, up to [`IDLE_CAP`] (never below the interval
//! itself); the first records read put it back to the interval at once. The stream is described
//! (to find new shards) after [`DESCRIBE_EVERY`], then half as often each time nothing changed,
//! down to once per [`DESCRIBE_CAP`], and at once when a shard is read to its end (its children
//! are to be found). So an idle stack costs DynamoDB Local two GetRecords per shard a second
//! (ten at the default 100 ms interval without the backoff) and a DescribeStream per table every
//! 32 s (one every 2 s), while a stream that is written to is polled as before; the price is that
//! the first write after a quiet spell is read up to [`IDLE_CAP`] after it instead of the interval.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lambda_events::event::dynamodb::EventRecord;
use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use local_services::streams::{lambda_event, lambda_record};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};
use twopc_fanout::replay::{BatchInfo, DirectoryDeadLetters, OnFailureRecord, RequestContext};

use crate::Functions;

pub(crate) const BATCH_SIZE: usize = 100;
pub(crate) const MAX_RETRIES: u32 = 5;
/// How often the stream is described to find new shards, at first and after a change.
const DESCRIBE_EVERY: Duration = Duration::from_secs(2);
/// The longest wait between two descriptions of a stream whose shards do not change.
const DESCRIBE_CAP: Duration = Duration::from_secs(32);
/// The longest wait between two polls of a stream that keeps yielding nothing (the stack's poll
/// interval if it is longer). A write to an idle stream is read at most this long after it (Lambda
/// polls an idle shard about every 250 ms).
pub(crate) const IDLE_CAP: Duration = Duration::from_millis(500);
/// How long a clean stop may spend delivering what the stream still holds.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Where reading a table's stream starts when the stack starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartAt {
    /// A table made now: every shard from its start.
    Beginning,
    /// A kept table with no checkpoint of its stream: from now on (what came before was processed
    /// by whatever ran then, or by no one).
    Latest,
    /// A kept table: after the checkpoint's positions; shards it does not know appeared since, and
    /// are read from their start. [`Poller::new`] turns a kept table's start into this when its
    /// checkpoint file is there.
    Checkpoint,
}

/// A stream's reading position, kept in a file (`<dir>/<table>-<stream hash>.json`): per shard, the
/// last record delivered and whether the shard was read to its end.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub stream_arn: String,
    pub shards: BTreeMap<String, ShardCheckpoint>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardCheckpoint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sequence_number: Option<String>,
    #[serde(default)]
    pub finished: bool,
    /// Opened at LATEST (a kept table first read with no checkpoint) and nothing delivered since:
    /// resumed at LATEST too, never from the shard's start, which was never meant to be read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_latest: bool,
}

impl Checkpoint {
    /// The file of a stream's checkpoint: named by table and stream, so that a table made again (a
    /// new stream) never resumes from the old one's positions.
    pub fn path(dir: &Path, table: &str, stream_arn: &str) -> PathBuf {
        use sha2::{Digest, Sha256};
        let stream = &hex::encode(Sha256::digest(stream_arn.as_bytes()))[..12];
        dir.join(format!("{table}-{stream}.json"))
    }

    /// The checkpoint in `path`, if there is one for this stream.
    pub fn load(path: &Path, stream_arn: &str) -> Option<Checkpoint> {
        let text = std::fs::read(path).ok()?;
        match serde_json::from_slice::<Checkpoint>(&text) {
            Ok(checkpoint) if checkpoint.stream_arn == stream_arn => Some(checkpoint),
            Ok(_) => None,
            Err(e) => {
                warn!(path = %path.display(), error = %e, "a stream checkpoint that is not JSON is ignored");
                None
            }
        }
    }

    /// Written aside, then renamed: a crash leaves the old checkpoint or the new one, never half.
    fn save(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let partial = path.with_extension("partial");
        std::fs::write(&partial, serde_json::to_vec_pretty(self).expect("a checkpoint serializes"))?;
        std::fs::rename(&partial, path)
    }
}

/// A service error's code and message; the whole chain for anything else.
fn describe_error<E: std::error::Error + Send + Sync + 'static>(
    e: aws_sdk_dynamodbstreams::error::SdkError<E>,
) -> String {
    match e {
        aws_sdk_dynamodbstreams::error::SdkError::ServiceError(service) => service.into_err().to_string(),
        other => aws_smithy_types::error::display::DisplayErrorContext(&other).to_string(),
    }
}

#[derive(Debug, Default)]
struct Shard {
    parent: Option<String>,
    /// None until the shard is started, and again once it is closed and read to its end.
    iterator: Option<String>,
    started: bool,
    /// Read to its end (closed shard).
    finished: bool,
    /// Where to resume if the iterator is lost.
    last_sequence: Option<String>,
    /// Records read and not yet delivered, oldest first.
    pending: VecDeque<EventRecord>,
    /// Retries of the batch at the head of `pending`.
    retries: u32,
    /// Batch size after function errors (bisection).
    limit: usize,
    not_before: Option<Instant>,
}

/// Where a poller's batches go: the stream processor (Lambda's event in, the batch item failures' sequence
/// numbers out).
pub(crate) trait BatchTarget: Send + Sync + 'static {
    fn deliver(
        &self,
        event: &aws_lambda_events::event::dynamodb::Event,
    ) -> impl std::future::Future<Output = Result<Vec<String>, String>> + Send;
}

impl BatchTarget for Functions {
    async fn deliver(&self, event: &aws_lambda_events::event::dynamodb::Event) -> Result<Vec<String>, String> {
        self.stream_processor(event).await
    }
}

/// The transactions table's second reader: the outcomes function (outcome events to the bus), as the
/// deployed stack's second event source mapping on that stream.
pub(crate) struct Outcomes(pub Arc<Functions>);

impl BatchTarget for Outcomes {
    async fn deliver(&self, event: &aws_lambda_events::event::dynamodb::Event) -> Result<Vec<String>, String> {
        self.0.outcomes(event).await
    }
}

pub(crate) struct Poller<T: BatchTarget = Functions> {
    client: Client,
    table: String,
    stream_arn: String,
    start_at: StartAt,
    target: Arc<T>,
    /// The wait after a pass that found nothing; doubled by each further empty pass up to `idle_cap`.
    idle: Duration,
    idle_cap: Duration,
    /// The wait between descriptions: `describe_every` at first and after a change, doubled each
    /// time nothing changed up to `describe_cap`.
    describe_every: Duration,
    describe_cap: Duration,
    describe_interval: Duration,
    /// Describe at the next pass whatever the interval (a shard was read to its end).
    describe_now: bool,
    shards: BTreeMap<String, Shard>,
    /// Shards read to their end: never read again, though DescribeStream keeps listing them.
    finished: BTreeSet<String>,
    checkpoint: Checkpoint,
    /// Where the checkpoint is kept; None: nowhere (the tables end with the stack).
    checkpoint_path: Option<PathBuf>,
    described_at: Option<Instant>,
    /// Where records given up on are recorded (None: only logged).
    dead_letters: Option<Arc<DirectoryDeadLetters>>,
}

/// The function the local stack stands in for, in the on-failure records it writes.
const FUNCTION_ARN: &str = "arn:aws:lambda:us-east-1:000000000000:function:stream-processor";

/// Lambda's on-failure record for `records` (in order, of one shard), given up on after `invocations`.
pub(crate) fn on_failure_record(
    stream_arn: &str,
    shard_id: &str,
    records: &[EventRecord],
    invocations: u32,
) -> Option<OnFailureRecord> {
    let first = records.first()?;
    let last = records.last()?;
    let arrival =
        |r: &EventRecord| r.change.approximate_creation_date_time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    Some(OnFailureRecord {
        request_context: RequestContext {
            request_id: uuid::Uuid::new_v4().to_string(),
            function_arn: FUNCTION_ARN.to_owned(),
            condition: "RetryAttemptsExhausted".to_owned(),
            approximate_invoke_count: u64::from(invocations),
        },
        response_context: Some(serde_json::json!({"statusCode": 200, "executedVersion": "$LATEST"})),
        version: "1.0".to_owned(),
        timestamp: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        batch: BatchInfo {
            shard_id: shard_id.to_owned(),
            start_sequence_number: first.change.sequence_number.clone()?,
            end_sequence_number: last.change.sequence_number.clone()?,
            approximate_arrival_of_first_record: arrival(first),
            approximate_arrival_of_last_record: arrival(last),
            batch_size: records.len() as u64,
            stream_arn: stream_arn.to_owned(),
        },
    })
}

impl<T: BatchTarget> Poller<T> {
    pub(crate) fn new(
        client: Client,
        table: String,
        stream_arn: String,
        start_at: StartAt,
        checkpoint_path: Option<PathBuf>,
        target: Arc<T>,
        idle: Duration,
    ) -> Poller<T> {
        // Loaded once, here: a kept table resumes from its checkpoint when there is one.
        let loaded = match (&start_at, &checkpoint_path) {
            (StartAt::Latest | StartAt::Checkpoint, Some(path)) => Checkpoint::load(path, &stream_arn),
            _ => None,
        };
        let start_at = match (start_at, &loaded) {
            (StartAt::Beginning, _) => StartAt::Beginning,
            (_, Some(_)) => StartAt::Checkpoint,
            (_, None) => StartAt::Latest,
        };
        let checkpoint = loaded.unwrap_or_default();
        let finished = checkpoint.shards.iter().filter(|(_, s)| s.finished).map(|(id, _)| id.clone()).collect();
        Poller {
            client,
            table,
            checkpoint: Checkpoint { stream_arn: stream_arn.clone(), ..checkpoint },
            stream_arn,
            start_at,
            target,
            idle,
            idle_cap: IDLE_CAP.max(idle),
            describe_every: DESCRIBE_EVERY,
            describe_cap: DESCRIBE_CAP,
            describe_interval: DESCRIBE_EVERY,
            describe_now: false,
            shards: BTreeMap::new(),
            finished,
            checkpoint_path,
            described_at: None,
            dead_letters: None,
        }
    }

    /// Records given up on are written as on-failure records into `dead_letters`.
    pub(crate) fn with_dead_letters(mut self, dead_letters: Arc<DirectoryDeadLetters>) -> Self {
        self.dead_letters = Some(dead_letters);
        self
    }

    /// Describes the stream every `every` at first, at most `cap` apart when nothing changes.
    #[cfg(test)]
    fn describing_every(mut self, every: Duration, cap: Duration) -> Self {
        self.describe_every = every;
        self.describe_interval = every;
        self.describe_cap = cap.max(every);
        self
    }

    /// Idle polls at most `cap` apart.
    #[cfg(test)]
    fn idle_cap(mut self, cap: Duration) -> Self {
        self.idle_cap = cap.max(self.idle);
        self
    }

    /// Polls until `stop` turns true, then delivers what the stream still holds (at most
    /// [`DRAIN_TIMEOUT`]) and keeps the checkpoint.
    pub(crate) async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut wait = self.idle;
        while !*stop.borrow() {
            if self.round_or_warn().await {
                // Records read or delivered: poll again at once, and from the shortest wait after.
                wait = self.idle;
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => {}
            }
            // A batch waiting out its retry backoff is no idle stream (and costs no request).
            let retrying = self.shards.values().any(|s| !s.pending.is_empty());
            wait = if retrying { self.idle } else { (wait * 2).min(self.idle_cap) };
        }
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            // Until two rounds in a row read and deliver nothing: the stream is caught up. (One is
            // not enough: a round that finds its iterator lost takes a new one and reads nothing.)
            let mut quiet_rounds = 0;
            while quiet_rounds < 2 {
                let delivered = self.round_or_warn().await;
                let waiting = self.shards.values().any(|s| !s.pending.is_empty());
                if waiting && !delivered {
                    // A batch waiting out its retry backoff.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                quiet_rounds = if delivered || waiting { 0 } else { quiet_rounds + 1 };
            }
        })
        .await;
        if drained.is_err() {
            warn!(table = %self.table, "the stream was not drained within {DRAIN_TIMEOUT:?}; the next start resumes from the checkpoint");
        }
        self.save_checkpoint();
    }

    async fn round_or_warn(&mut self) -> bool {
        match self.round().await {
            Ok(busy) => busy,
            Err(e) => {
                warn!(table = %self.table, error = %e, "reading the stream failed; trying again");
                false
            }
        }
    }

    fn save_checkpoint(&self) {
        if let Some(path) = &self.checkpoint_path
            && let Err(e) = self.checkpoint.save(path)
        {
            warn!(table = %self.table, path = %path.display(), error = %e, "the stream checkpoint could not be written");
        }
    }

    /// Marks a shard read to its end, in memory and in the checkpoint.
    fn finish(&mut self, id: &str) {
        if let Some(shard) = self.shards.get_mut(id) {
            shard.finished = true;
        }
        if self.finished.insert(id.to_owned()) {
            self.checkpoint.shards.entry(id.to_owned()).or_default().finished = true;
            self.save_checkpoint();
        }
    }

    /// Lists the stream's shards; true when it found shards not known before.
    async fn describe(&mut self) -> Result<bool, String> {
        let first_look = self.described_at.is_none();
        let known = self.shards.len();
        let mut start: Option<String> = None;
        loop {
            let out = self
                .client
                .describe_stream()
                .stream_arn(&self.stream_arn)
                .set_exclusive_start_shard_id(start.take())
                .send()
                .await
                .map_err(describe_error)?;
            let Some(description) = out.stream_description else { break };
            for shard in description.shards.unwrap_or_default() {
                let Some(id) = shard.shard_id else { continue };
                if self.finished.contains(&id) {
                    continue;
                }
                // Shards there at the first look start as `start_at` says (below); shards that
                // appear later are always read from their start.
                self.shards.entry(id).or_insert_with(|| Shard {
                    parent: shard.parent_shard_id,
                    limit: BATCH_SIZE,
                    ..Shard::default()
                });
            }
            match description.last_evaluated_shard_id {
                Some(last) => start = Some(last),
                None => break,
            }
        }
        if first_look && self.start_at != StartAt::Beginning {
            let ids: Vec<String> = self.shards.keys().cloned().collect();
            for id in ids {
                let resume_after = self.checkpoint.shards.get(&id).and_then(|s| s.last_sequence_number.clone());
                let from_latest = self.checkpoint.shards.get(&id).is_some_and(|s| s.from_latest);
                let iterator = match (&self.start_at, resume_after) {
                    (StartAt::Checkpoint, Some(after)) => {
                        info!(table = %self.table, shard = %id, after = %after, "resuming the stream from its checkpoint");
                        self.shards.get_mut(&id).expect("just listed").last_sequence = Some(after.clone());
                        match self.iterator(&id, ShardIteratorType::AfterSequenceNumber, Some(&after)).await {
                            Ok(iterator) => iterator,
                            Err(e) => {
                                // Trimmed while the stack was down (over 24 h): what came between
                                // is gone from the stream; read what is left rather than nothing.
                                error!(table = %self.table, shard = %id, after = %after, error = %e, "the checkpoint's position is no longer in the stream; records after it and before the oldest kept are lost to the fan-out; reading from the oldest kept");
                                self.iterator(&id, ShardIteratorType::TrimHorizon, None).await?
                            }
                        }
                    }
                    (StartAt::Checkpoint, None) if !from_latest => continue,
                    // A shard the checkpoint does not know, or where nothing was delivered yet, is
                    // read from its start when it is first polled (above); one first opened at
                    // LATEST, from LATEST again.
                    _ => {
                        self.checkpoint.shards.entry(id.clone()).or_default().from_latest = true;
                        self.iterator(&id, ShardIteratorType::Latest, None).await?
                    }
                };
                let shard = self.shards.get_mut(&id).expect("just listed");
                shard.started = true;
                shard.finished = iterator.is_none();
                shard.iterator = iterator;
            }
        }
        self.described_at = Some(Instant::now());
        Ok(self.shards.len() > known)
    }

    async fn iterator(
        &self,
        shard_id: &str,
        kind: ShardIteratorType,
        after: Option<&str>,
    ) -> Result<Option<String>, String> {
        let out = self
            .client
            .get_shard_iterator()
            .stream_arn(&self.stream_arn)
            .shard_id(shard_id)
            .shard_iterator_type(kind)
            .set_sequence_number(after.map(str::to_owned))
            .send()
            .await
            .map_err(describe_error)?;
        Ok(out.shard_iterator)
    }

    /// One pass over the shards. True when it delivered or read anything (poll again at once).
    async fn round(&mut self) -> Result<bool, String> {
        if self.describe_now || self.described_at.is_none_or(|at| at.elapsed() >= self.describe_interval) {
            let changed = self.describe().await?;
            self.describe_now = false;
            self.describe_interval =
                if changed { self.describe_every } else { (self.describe_interval * 2).min(self.describe_cap) };
        }
        let mut busy = false;
        let ids: Vec<String> = self.shards.keys().cloned().collect();
        for id in ids {
            let ready = {
                let shard = &self.shards[&id];
                let parent_done = shard
                    .parent
                    .as_ref()
                    .and_then(|p| self.shards.get(p))
                    .is_none_or(|p| p.finished && p.pending.is_empty());
                // (A parent no longer listed, or remembered as finished, is done.)
                !shard.finished && parent_done
            };
            if ready {
                busy |= self.poll_shard(&id).await?;
            }
        }
        // Shards read to their end and delivered are done for good.
        let done: Vec<String> =
            self.shards.iter().filter(|(_, s)| s.finished && s.pending.is_empty()).map(|(id, _)| id.clone()).collect();
        for id in done {
            self.finish(&id);
            self.shards.remove(&id);
            // Its children are listed now: look for them at once, and often again for a while.
            self.describe_now = true;
            self.describe_interval = self.describe_every;
        }
        Ok(busy)
    }

    async fn poll_shard(&mut self, id: &str) -> Result<bool, String> {
        if !self.shards[id].started {
            let iterator = self.iterator(id, ShardIteratorType::TrimHorizon, None).await?;
            let shard = self.shards.get_mut(id).expect("known");
            shard.iterator = iterator;
            shard.started = true;
        }
        let mut busy = false;
        if self.shards[id].pending.is_empty() {
            let Some(iterator) = self.shards[id].iterator.clone() else {
                self.shards.get_mut(id).expect("known").finished = true;
                return Ok(false);
            };
            match self.client.get_records().shard_iterator(iterator).limit(BATCH_SIZE as i32).send().await {
                Ok(out) => {
                    let shard = self.shards.get_mut(id).expect("known");
                    shard.iterator = out.next_shard_iterator;
                    let records = out.records.unwrap_or_default();
                    busy = !records.is_empty();
                    shard.pending.extend(records.into_iter().map(|r| lambda_record(r, &self.stream_arn)));
                    if shard.iterator.is_none() && shard.pending.is_empty() {
                        shard.finished = true;
                    }
                }
                Err(e) => {
                    // An expired or trimmed iterator (DynamoDB Local trims the TRIM_HORIZON iterator
                    // of a shard that was empty when it was taken): resume after the last record
                    // delivered.
                    let expected = e
                        .as_service_error()
                        .is_some_and(|e| e.is_trimmed_data_access_exception() || e.is_expired_iterator_exception());
                    if expected {
                        debug!(table = %self.table, shard = id, error = %describe_error(e), "iterator lost; resuming");
                    } else {
                        warn!(table = %self.table, shard = id, error = %describe_error(e), "GetRecords failed; resuming");
                    }
                    let last = self.shards[id].last_sequence.clone();
                    let (kind, after) = match &last {
                        Some(seq) => (ShardIteratorType::AfterSequenceNumber, Some(seq.as_str())),
                        None => (ShardIteratorType::TrimHorizon, None),
                    };
                    let iterator = self.iterator(id, kind, after).await?;
                    self.shards.get_mut(id).expect("known").iterator = iterator;
                    return Ok(false);
                }
            }
        }
        if !self.shards[id].pending.is_empty() {
            busy |= self.deliver(id).await;
        }
        Ok(busy)
    }

    /// Delivers the batch at the head of a shard's pending records. True when something was delivered.
    async fn deliver(&mut self, id: &str) -> bool {
        let shard = self.shards.get_mut(id).expect("known");
        if shard.not_before.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        let size = shard.limit.min(shard.pending.len());
        let batch: Vec<EventRecord> = shard.pending.iter().take(size).cloned().collect();
        let event = lambda_event(batch);
        let result = self.target.deliver(&event).await;
        let shard = self.shards.get_mut(id).expect("known");
        let delivered = match result {
            Ok(failures) if failures.is_empty() => size,
            Ok(failures) => {
                // Lambda retries from the lowest failed sequence number: everything before it is done.
                let first = event
                    .records
                    .iter()
                    .position(|r| r.change.sequence_number.as_ref().is_some_and(|s| failures.contains(s)))
                    .unwrap_or(0);
                warn!(
                    table = %self.table,
                    failed = failures.len(),
                    batch = size,
                    retry = shard.retries + 1,
                    "the stream processor reported batch item failures; retrying from the first"
                );
                first
            }
            Err(e) => {
                warn!(table = %self.table, batch = size, retry = shard.retries + 1, error = %e, "the stream processor failed; retrying the batch split in half");
                shard.limit = (size / 2).max(1);
                0
            }
        };
        if let Some(last) = event.records.get(delivered.wrapping_sub(1)).and_then(|r| r.change.sequence_number.clone())
        {
            shard.last_sequence = Some(last);
        }
        shard.pending.drain(..delivered);
        let last_sequence = shard.last_sequence.clone();
        if delivered > 0 {
            let kept = self.checkpoint.shards.entry(id.to_owned()).or_default();
            kept.last_sequence_number = last_sequence;
            kept.from_latest = false;
            self.save_checkpoint();
        }
        let shard = self.shards.get_mut(id).expect("known");
        if delivered == size {
            shard.retries = 0;
            shard.not_before = None;
            if shard.limit < BATCH_SIZE && shard.pending.is_empty() {
                shard.limit = BATCH_SIZE;
            }
            debug!(table = %self.table, records = size, "batch delivered");
            return true;
        }
        shard.retries += 1;
        if shard.retries > MAX_RETRIES {
            let dropped = (size - delivered).min(shard.pending.len());
            let given_up: Vec<EventRecord> = shard.pending.iter().take(dropped).cloned().collect();
            let sequence = shard.pending.front().and_then(|r| r.change.sequence_number.clone());
            let record = on_failure_record(&self.stream_arn, id, &given_up, MAX_RETRIES + 1);
            match (&self.dead_letters, record) {
                (Some(dead_letters), Some(record)) => match dead_letters.put(&record) {
                    Ok(path) => error!(
                        table = %self.table,
                        shard = id,
                        records = dropped,
                        first_sequence_number = ?sequence,
                        dead_letter = %path.display(),
                        "records still failing after {MAX_RETRIES} retries are skipped; their range is in the dead-letter folder (`twopc-local replay`)"
                    ),
                    Err(e) => error!(
                        table = %self.table,
                        shard = id,
                        records = dropped,
                        first_sequence_number = ?sequence,
                        end_sequence_number = %record.batch.end_sequence_number,
                        error = %e,
                        "records still failing after {MAX_RETRIES} retries are skipped, and their dead letter could NOT be written: they are lost from the lake"
                    ),
                },
                _ => error!(
                    table = %self.table,
                    shard = id,
                    records = dropped,
                    first_sequence_number = ?sequence,
                    "records still failing after {MAX_RETRIES} retries are skipped, with no dead-letter folder: they are lost from the lake"
                ),
            }
            let shard = self.shards.get_mut(id).expect("known");
            if let Some(last) =
                shard.pending.get(dropped.wrapping_sub(1)).and_then(|r| r.change.sequence_number.clone())
            {
                shard.last_sequence = Some(last);
            }
            shard.pending.drain(..dropped);
            shard.retries = 0;
            shard.limit = BATCH_SIZE;
            shard.not_before = None;
            let last_sequence = shard.last_sequence.clone();
            self.checkpoint.shards.entry(id.to_owned()).or_default().last_sequence_number = last_sequence;
            self.save_checkpoint();
            return true;
        }
        let backoff = Duration::from_millis(100 * (1 << shard.retries.min(5)));
        shard.not_before = Some(Instant::now() + backoff);
        delivered > 0
    }
}

#[cfg(test)]
mod tests {
    //! The poller against a DynamoDB Streams endpoint of the tests' own (DynamoDB Local never splits
    //! a shard): the real SDK client, the real JSON protocol, shards as a table's stream has them
    //! after a split.

    use std::sync::Mutex;

    use axum::Router;
    use axum::extract::State;
    use axum::http::HeaderMap;
    use serde_json::{Value, json};

    use super::*;

    /// A stream: shards in order, each with its records' sequence numbers, closed or open.
    #[derive(Default)]
    struct FakeStream {
        shards: Vec<(String, Option<String>, Vec<u64>, bool)>,
        describes: usize,
        /// When each GetRecords came.
        gets: Vec<Instant>,
    }

    type Shared = Arc<Mutex<FakeStream>>;

    fn record(sequence: u64) -> Value {
        json!({
            "eventID": format!("e{sequence}"), "eventName": "MODIFY", "eventVersion": "1.1",
            "eventSource": "aws:dynamodb", "awsRegion": "us-east-1",
            "dynamodb": {"ApproximateCreationDateTime": 1.7e9, "Keys": {"entityId": {"S": "A"}},
                "NewImage": {"entityId": {"S": "A"}}, "SequenceNumber": sequence.to_string(),
                "SizeBytes": 10, "StreamViewType": "NEW_AND_OLD_IMAGES"}
        })
    }

    async fn answer(State(stream): State<Shared>, headers: HeaderMap, body: String) -> axum::response::Response {
        use axum::response::IntoResponse;
        let target = headers.get("x-amz-target").and_then(|t| t.to_str().ok()).unwrap_or_default().to_owned();
        let request: Value = serde_json::from_str(&body).unwrap_or_default();
        let mut stream = stream.lock().unwrap();
        let body = match target.rsplit('.').next().unwrap_or_default() {
            "DescribeStream" => {
                stream.describes += 1;
                let shards: Vec<Value> = stream
                    .shards
                    .iter()
                    .map(|(id, parent, records, closed)| {
                        let first = records.first().copied().unwrap_or(0).to_string();
                        let mut range = json!({"StartingSequenceNumber": first});
                        if *closed {
                            range["EndingSequenceNumber"] = json!(records.last().copied().unwrap_or(0).to_string());
                        }
                        let mut shard = json!({"ShardId": id, "SequenceNumberRange": range});
                        if let Some(parent) = parent {
                            shard["ParentShardId"] = json!(parent);
                        }
                        shard
                    })
                    .collect();
                json!({"StreamDescription": {"StreamArn": "arn:test", "StreamStatus": "ENABLED", "Shards": shards}})
            }
            "GetShardIterator" => {
                let id = request["ShardId"].as_str().unwrap_or_default();
                let (_, _, records, _) = stream.shards.iter().find(|s| s.0 == id).expect("a known shard");
                let position = match request["ShardIteratorType"].as_str() {
                    Some("LATEST") => records.len(),
                    Some("AFTER_SEQUENCE_NUMBER") => {
                        let after: u64 = request["SequenceNumber"].as_str().unwrap().parse().unwrap();
                        records.iter().position(|s| *s > after).unwrap_or(records.len())
                    }
                    _ => 0,
                };
                json!({"ShardIterator": format!("{id}/{position}")})
            }
            "GetRecords" => {
                stream.gets.push(Instant::now());
                let iterator = request["ShardIterator"].as_str().unwrap_or_default();
                let (id, position) = iterator.split_once('/').unwrap();
                let position: usize = position.parse().unwrap();
                let (_, _, records, closed) = stream.shards.iter().find(|s| s.0 == id).expect("a known shard");
                let read: Vec<Value> = records[position..].iter().map(|s| record(*s)).collect();
                let mut answer = json!({"Records": read});
                if !*closed {
                    answer["NextShardIterator"] = json!(format!("{id}/{}", records.len()));
                }
                answer
            }
            other => panic!("an unexpected call: {other}"),
        };
        ([("content-type", "application/x-amz-json-1.0")], body.to_string()).into_response()
    }

    async fn start(stream: Shared) -> Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = Router::new().fallback(answer).with_state(stream);
        tokio::spawn(async move { axum::serve(listener, app).await });
        let sdk = crate::local_sdk_config();
        Client::from_conf(aws_sdk_dynamodbstreams::config::Builder::from(&sdk).endpoint_url(url).build())
    }

    /// Every batch's sequence numbers, in delivery order.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<u64>>);

    impl BatchTarget for Recorder {
        async fn deliver(&self, event: &aws_lambda_events::event::dynamodb::Event) -> Result<Vec<String>, String> {
            let mut seen = self.0.lock().unwrap();
            seen.extend(
                event.records.iter().map(|r| r.change.sequence_number.as_deref().unwrap().parse::<u64>().unwrap()),
            );
            Ok(vec![])
        }
    }

    fn split_stream() -> Shared {
        Arc::new(Mutex::new(FakeStream {
            shards: vec![
                ("parent".into(), None, vec![100, 101, 102], true),
                ("child".into(), Some("parent".into()), vec![200, 201], false),
            ],
            ..FakeStream::default()
        }))
    }

    /// A poller of the test stream, quick to poll and to describe, delivering to `recorder`.
    fn test_poller(
        client: Client,
        start_at: StartAt,
        checkpoint: Option<PathBuf>,
        recorder: &Arc<Recorder>,
    ) -> Poller<Recorder> {
        Poller::new(
            client,
            "t".into(),
            "arn:test".into(),
            start_at,
            checkpoint,
            recorder.clone(),
            Duration::from_millis(5),
        )
        .describing_every(Duration::from_millis(20), Duration::from_millis(40))
    }

    /// Runs a poller until `until` holds and the stream has been described `describes` more times.
    async fn poll(poller: Poller<Recorder>, stream: &Shared, recorder: &Recorder, until: impl Fn(&[u64]) -> bool) {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(poller.run(stopped));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !until(&recorder.0.lock().unwrap()) {
            assert!(Instant::now() < deadline, "delivered {:?}", recorder.0.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Several more looks at the stream, each listing the closed parent again.
        let seen = stream.lock().unwrap().describes;
        while stream.lock().unwrap().describes < seen + 5 {
            assert!(Instant::now() < deadline, "the poller stopped describing the stream");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.send(true).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_closed_parent_shard_is_read_once_then_its_child() {
        let stream = split_stream();
        let client = start(stream.clone()).await;
        let recorder = Arc::new(Recorder::default());
        poll(test_poller(client, StartAt::Beginning, None, &recorder), &stream, &recorder, |seen| seen.len() >= 5)
            .await;
        assert_eq!(*recorder.0.lock().unwrap(), vec![100, 101, 102, 200, 201], "each record once, the parent's first");
    }

    #[tokio::test]
    async fn a_restart_resumes_after_the_checkpoint() {
        let stream = split_stream();
        let client = start(stream.clone()).await;
        let dir = std::env::temp_dir().join(format!("checkpoint-{}", uuid::Uuid::new_v4().simple()));
        let path = Checkpoint::path(&dir, "t", "arn:test");
        let first = Arc::new(Recorder::default());
        poll(test_poller(client.clone(), StartAt::Beginning, Some(path.clone()), &first), &stream, &first, |seen| {
            seen.len() >= 5
        })
        .await;
        let kept = Checkpoint::load(&path, "arn:test").expect("a checkpoint is kept");
        assert!(kept.shards["parent"].finished, "{kept:?}");
        assert_eq!(kept.shards["child"].last_sequence_number.as_deref(), Some("201"), "{kept:?}");

        // Written while the stack was down: read after a restart, and nothing before it again.
        stream.lock().unwrap().shards[1].2.push(202);
        let second = Arc::new(Recorder::default());
        poll(test_poller(client, StartAt::Checkpoint, Some(path), &second), &stream, &second, |seen| !seen.is_empty())
            .await;
        assert_eq!(*second.0.lock().unwrap(), vec![202]);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A kept table first read from LATEST (no checkpoint yet), then restarted: its quiet shards are
    /// not read from their start, which would fan out everything the stream still holds again.
    #[tokio::test]
    async fn a_restart_after_a_start_at_latest_reads_nothing_old() {
        let stream = split_stream();
        let client = start(stream.clone()).await;
        let dir = std::env::temp_dir().join(format!("checkpoint-{}", uuid::Uuid::new_v4().simple()));
        let path = Checkpoint::path(&dir, "t", "arn:test");
        let first = Arc::new(Recorder::default());
        poll(test_poller(client.clone(), StartAt::Latest, Some(path.clone()), &first), &stream, &first, |_| true).await;
        assert!(first.0.lock().unwrap().is_empty(), "LATEST reads nothing old: {:?}", first.0.lock().unwrap());

        stream.lock().unwrap().shards[1].2.push(202);
        let second = Arc::new(Recorder::default());
        poll(test_poller(client, StartAt::Checkpoint, Some(path), &second), &stream, &second, |_| true).await;
        assert!(!second.0.lock().unwrap().contains(&200), "old records again: {:?}", second.0.lock().unwrap());
        let _ = std::fs::remove_dir_all(dir);
    }

    /// An idle stream is polled less and less often, up to the cap, and described less often too; a
    /// write is still read within the cap, and records put the polling back to its shortest wait at
    /// once.
    #[tokio::test]
    async fn an_idle_stream_is_polled_less_often_and_a_write_is_still_read_within_the_cap() {
        const BASE: Duration = Duration::from_millis(10);
        const CAP: Duration = Duration::from_millis(320);
        let stream: Shared = Arc::new(Mutex::new(FakeStream {
            shards: vec![("open".into(), None, vec![], false)],
            ..FakeStream::default()
        }));
        let client = start(stream.clone()).await;
        let recorder = Arc::new(Recorder::default());
        let poller =
            Poller::new(client, "t".into(), "arn:test".into(), StartAt::Beginning, None, recorder.clone(), BASE)
                .describing_every(Duration::from_millis(20), Duration::from_millis(160))
                .idle_cap(CAP);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(poller.run(stopped));

        // Idle for 3 s: the polls grow apart (10, 20, 40, ... ms) up to the cap, and stay there.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (gets, describes) = {
            let s = stream.lock().unwrap();
            (s.gets.clone(), s.describes)
        };
        let gaps: Vec<Duration> = gets.windows(2).map(|w| w[1] - w[0]).collect();
        // Every 10 ms, 3 s would be ~300 polls; backing off to 320 ms, 5 to reach the cap and ~8 at it.
        assert!(gets.len() <= 20, "{} polls of an idle stream in 3 s, the first apart: {:?}", gets.len(), &gaps[..12]);
        assert!(gaps.len() >= 8, "the stream is still polled: {gaps:?}");
        // A poll may wake a little late (the timer, a loaded machine): its gap is longer and the next one
        // shorter by as much. A shrink within 60 ms is that; a reset of the backoff would drop to 10 ms.
        const JITTER: Duration = Duration::from_millis(60);
        assert!(gaps.windows(2).all(|w| w[1] + JITTER >= w[0]), "the gaps never shrink while idle: {gaps:?}");
        for gap in &gaps[gaps.len() - 3..] {
            assert!(*gap >= CAP - BASE && *gap <= CAP + Duration::from_millis(150), "at the cap: {gaps:?}");
        }
        // Described every 20 ms at first, 160 ms apart once nothing changed: ~23, not 150.
        assert!(describes <= 30, "{describes} descriptions of an unchanging stream in 3 s");

        // A write to the idle stream is read within the cap (plus a scheduling margin) ...
        let written = Instant::now();
        stream.lock().unwrap().shards[0].2.push(300);
        while recorder.0.lock().unwrap().is_empty() {
            assert!(written.elapsed() < CAP + Duration::from_millis(250), "not read within the cap");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let read_after = written.elapsed();
        // ... and the polls after it come at the shortest wait again, not at the cap.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let after: Vec<Instant> = stream.lock().unwrap().gets.iter().copied().filter(|at| *at > written).collect();
        stop.send(true).unwrap();
        task.await.unwrap();
        assert_eq!(*recorder.0.lock().unwrap(), vec![300]);
        assert!(after.len() >= 4, "read after {read_after:?}; polls since the write: {:?}", after.len());
        let gaps: Vec<Duration> = after.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().take(3).all(|gap| *gap < CAP / 2), "the backoff was reset: {gaps:?}");
    }
}
