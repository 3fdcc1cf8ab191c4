//! Stream polling, as Lambda's DynamoDB event source mapping does it (the template's settings):
//! every shard of a table's stream is read in order (a child shard only once its parent is read to
//! its end), in batches of at most [`BATCH_SIZE`] records converted to the Lambda event; with
//! `ReportBatchItemFailures` a batch is retried from its first failed record, a function error
//! retries the batch split in half (`BisectBatchOnFunctionError`), and after [`MAX_RETRIES`] retries
//! the records are dropped with an error in the log (where the deployed mapping sends them to its
//! on-failure destination).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lambda_events::event::dynamodb::EventRecord;
use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use local_services::streams::{lambda_event, lambda_record};
use tracing::{debug, error, warn};

use crate::Functions;

pub(crate) const BATCH_SIZE: usize = 100;
pub(crate) const MAX_RETRIES: u32 = 5;
/// How often the stream is described to find new shards.
const DESCRIBE_EVERY: Duration = Duration::from_secs(2);

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

pub(crate) struct Poller {
    client: Client,
    table: String,
    stream_arn: String,
    /// Read shards that exist at the first look from their start (else from now on).
    from_start: bool,
    functions: Arc<Functions>,
    idle: Duration,
    shards: BTreeMap<String, Shard>,
    described_at: Option<Instant>,
}

impl Poller {
    pub(crate) fn new(
        client: Client,
        table: String,
        stream_arn: String,
        from_start: bool,
        functions: Arc<Functions>,
        idle: Duration,
    ) -> Poller {
        Poller { client, table, stream_arn, from_start, functions, idle, shards: BTreeMap::new(), described_at: None }
    }

    pub(crate) async fn run(mut self) {
        loop {
            let busy = match self.round().await {
                Ok(busy) => busy,
                Err(e) => {
                    warn!(table = %self.table, error = %e, "reading the stream failed; trying again");
                    false
                }
            };
            if !busy {
                tokio::time::sleep(self.idle).await;
            }
        }
    }

    async fn describe(&mut self) -> Result<(), String> {
        let first_look = self.described_at.is_none();
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
                // Shards there at the first look start at LATEST unless read from the start (below);
                // shards that appear later are always read from their start.
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
        if first_look && !self.from_start {
            let ids: Vec<String> = self.shards.keys().cloned().collect();
            for id in ids {
                let iterator = self.iterator(&id, ShardIteratorType::Latest, None).await?;
                let shard = self.shards.get_mut(&id).expect("just listed");
                shard.iterator = iterator;
                shard.started = true;
                shard.finished = shard.iterator.is_none();
            }
        }
        self.described_at = Some(Instant::now());
        Ok(())
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
        if self.described_at.is_none_or(|at| at.elapsed() >= DESCRIBE_EVERY) {
            self.describe().await?;
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
                !shard.finished && parent_done
            };
            if ready {
                busy |= self.poll_shard(&id).await?;
            }
        }
        // Forget shards read to their end once a child has started.
        let parents: Vec<String> =
            self.shards.values().filter(|s| s.started).filter_map(|s| s.parent.clone()).collect();
        self.shards.retain(|id, s| !(s.finished && s.pending.is_empty() && parents.contains(id)));
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
        let result = self.functions.stream_processor(&event).await;
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
            let sequence = shard.pending.front().and_then(|r| r.change.sequence_number.clone());
            error!(
                table = %self.table,
                shard = id,
                records = dropped,
                first_sequence_number = ?sequence,
                "records still failing after {MAX_RETRIES} retries are skipped (deployed, they go to the on-failure destination)"
            );
            if let Some(last) =
                shard.pending.get(dropped.wrapping_sub(1)).and_then(|r| r.change.sequence_number.clone())
            {
                shard.last_sequence = Some(last);
            }
            shard.pending.drain(..dropped);
            shard.retries = 0;
            shard.limit = BATCH_SIZE;
            shard.not_before = None;
            return true;
        }
        let backoff = Duration::from_millis(100 * (1 << shard.retries.min(5)));
        shard.not_before = Some(Instant::now() + backoff);
        delivered > 0
    }
}
