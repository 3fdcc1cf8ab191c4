//! Delivery of lake lines to Firehose: chunks within the `PutRecordBatch` limits, retry of only the
//! entries that failed, with backoff, a bounded number of times. A line counts as delivered only
//! once Firehose answered it with a `RecordId`; whatever is still failing is handed back by index so
//! the handler reports it as a batch item failure and Lambda retries it.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use tracing::{info, warn};

/// Stream processor: the Firehose stream the lake's records go to (named in [`twopc::environment`]).
pub use twopc::environment::FIREHOSE_STREAM_NAME;

/// `PutRecordBatch` limits: records per call, bytes per call, bytes per record (before base64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_records_per_call: usize,
    pub max_bytes_per_call: usize,
    pub max_record_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_records_per_call: 500, max_bytes_per_call: 4 * 1024 * 1024, max_record_bytes: 1000 * 1024 }
    }
}

/// Bounded retries with exponential backoff and jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries per record, the first included.
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// Five tries, 100 ms doubling to 1.6 s: at most about three seconds of waiting per batch,
    /// well inside a stream processor's timeout.
    fn default() -> Self {
        RetryPolicy { max_attempts: 5, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(2) }
    }
}

impl RetryPolicy {
    /// The wait before try `attempt + 1` (attempt counts from 1): half fixed, half random, so that
    /// concurrent shards that failed together do not retry together.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = self.base_delay.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let capped = exp.min(self.max_delay);
        let half = capped / 2;
        half + half.mul_f64(jitter())
    }
}

/// A number in [0, 1) without a random number crate: std's hasher keys are random per instance.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new().build_hasher().finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Firehose's answer for one entry of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryResult {
    Accepted,
    Failed { code: String, message: String },
}

/// A call that failed as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// Throttling, a 5xx, a timeout, a connection error: worth another try.
    #[error("retryable: {0}")]
    Retryable(String),
    /// The stream does not exist, access is denied, the request is invalid: retrying cannot help.
    #[error("not retryable: {0}")]
    Fatal(String),
}

/// Where committed changes go: one `PutRecordBatch`-like call.
pub trait ChangeSink: Send + Sync {
    /// Sends `records` (within [`Limits`]) in one call and answers one result per record, in order.
    fn put_batch(&self, records: &[&[u8]]) -> impl Future<Output = Result<Vec<EntryResult>, SinkError>> + Send;
}

/// Why a line was not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undelivered {
    /// Larger than a Firehose record may be; never sent.
    Oversized { bytes: usize, limit: usize },
    /// Still failing after the last try (the last error code and message).
    Failed { attempts: u32, error: String },
}

impl std::fmt::Display for Undelivered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Undelivered::Oversized { bytes, limit } => {
                write!(f, "record of {bytes} bytes exceeds Firehose's {limit}-byte record limit")
            }
            Undelivered::Failed { attempts, error } => write!(f, "still failing after {attempts} tries: {error}"),
        }
    }
}

/// What [`deliver`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryReport {
    pub delivered: usize,
    /// Indexes into the lines given, with why.
    pub undelivered: Vec<(usize, Undelivered)>,
    pub calls: usize,
    /// Entries sent again after a failure.
    pub retried: usize,
}

/// Splits `pending` (indexes into `lines`) into calls within the limits, in order.
pub fn chunks(lines: &[Vec<u8>], pending: &[usize], limits: &Limits) -> Vec<Vec<usize>> {
    let mut calls = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0;
    for &i in pending {
        let len = lines[i].len();
        if !current.is_empty()
            && (current.len() == limits.max_records_per_call || bytes + len > limits.max_bytes_per_call)
        {
            calls.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.push(i);
        bytes += len;
    }
    if !current.is_empty() {
        calls.push(current);
    }
    calls
}

/// Calls in flight at once. Firehose takes thousands of calls per second per stream; a Lambda
/// batch (at most 10,000 records) is at most 20 full calls, so a few at a time keeps latency low
/// without bursting into the per-stream throttle.
const CALL_CONCURRENCY: usize = 4;

/// The lines of one call (indexes) and what Firehose answered.
type CallResult = (Vec<usize>, Result<Vec<EntryResult>, SinkError>);

/// Delivers `lines` through `sink`, retrying failed entries (and failed calls) up to the policy's
/// bound. Returns which lines are still undelivered.
pub async fn deliver<S: ChangeSink>(
    sink: &S,
    lines: &[Vec<u8>],
    limits: &Limits,
    retry: &RetryPolicy,
) -> DeliveryReport {
    let mut report = DeliveryReport::default();
    let mut pending = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.len() > limits.max_record_bytes {
            report.undelivered.push((i, Undelivered::Oversized { bytes: line.len(), limit: limits.max_record_bytes }));
        } else {
            pending.push(i);
        }
    }
    let mut last_error: Vec<Option<String>> = vec![None; lines.len()];
    let mut attempt = 0;
    let mut stop = false;
    while !pending.is_empty() && attempt < retry.max_attempts.max(1) && !stop {
        attempt += 1;
        if attempt > 1 {
            report.retried += pending.len();
            let wait = retry.delay(attempt - 1);
            info!(
                records = pending.len(),
                attempt,
                wait_ms = wait.as_millis() as u64,
                "retrying failed Firehose entries"
            );
            tokio::time::sleep(wait).await;
        }
        let calls = chunks(lines, &pending, limits);
        report.calls += calls.len();
        let results: Vec<CallResult> = futures::stream::iter(calls)
            .map(|call| async move {
                let records: Vec<&[u8]> = call.iter().map(|&i| lines[i].as_slice()).collect();
                let result = sink.put_batch(&records).await;
                (call, result)
            })
            .buffer_unordered(CALL_CONCURRENCY)
            .collect()
            .await;
        let mut failed = Vec::new();
        for (call, result) in results {
            match result {
                Ok(entries) if entries.len() == call.len() => {
                    for (i, entry) in call.into_iter().zip(entries) {
                        match entry {
                            EntryResult::Accepted => report.delivered += 1,
                            EntryResult::Failed { code, message } => {
                                last_error[i] = Some(format!("{code}: {message}"));
                                failed.push(i);
                            }
                        }
                    }
                }
                Ok(entries) => {
                    let error = format!("{} answers for {} records", entries.len(), call.len());
                    warn!(%error, "Firehose answered a call with the wrong number of entries; none counted delivered");
                    for &i in &call {
                        last_error[i] = Some(error.clone());
                    }
                    failed.extend(call);
                }
                Err(err) => {
                    warn!(records = call.len(), error = %err, "Firehose call failed");
                    stop |= matches!(err, SinkError::Fatal(_));
                    for &i in &call {
                        last_error[i] = Some(err.to_string());
                    }
                    failed.extend(call);
                }
            }
        }
        failed.sort_unstable();
        pending = failed;
    }
    for i in pending {
        let error = last_error[i].take().unwrap_or_else(|| "not sent".to_owned());
        report.undelivered.push((i, Undelivered::Failed { attempts: attempt, error }));
    }
    report.undelivered.sort_by_key(|(i, _)| *i);
    report
}

/// The real Firehose: `PutRecordBatch` on one delivery stream.
#[derive(Debug, Clone)]
pub struct FirehoseSink {
    client: aws_sdk_firehose::Client,
    stream_name: String,
}

impl FirehoseSink {
    pub fn new(client: aws_sdk_firehose::Client, stream_name: impl Into<String>) -> Self {
        FirehoseSink { client, stream_name: stream_name.into() }
    }

    /// A client built on the shared AWS configuration (`AWS_ENDPOINT_URL_FIREHOSE` points it elsewhere),
    /// with the SDK's own retries off: [`deliver`] is the one retry layer (it must see partial
    /// failures anyway), so the number of calls and the time spent waiting stay those of its policy.
    pub fn from_config(sdk: &aws_config::SdkConfig, stream_name: impl Into<String>) -> Self {
        let config = aws_sdk_firehose::config::Builder::from(sdk)
            .retry_config(aws_sdk_firehose::config::retry::RetryConfig::disabled())
            .build();
        Self::new(aws_sdk_firehose::Client::from_conf(config), stream_name)
    }
}

impl ChangeSink for FirehoseSink {
    async fn put_batch(&self, records: &[&[u8]]) -> Result<Vec<EntryResult>, SinkError> {
        use aws_sdk_firehose::primitives::Blob;
        use aws_sdk_firehose::types::Record;
        let batch = records
            .iter()
            .map(|data| Record::builder().data(Blob::new(data.to_vec())).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SinkError::Fatal(e.to_string()))?;
        let output = self
            .client
            .put_record_batch()
            .delivery_stream_name(&self.stream_name)
            .set_records(Some(batch))
            .send()
            .await
            .map_err(|err| {
                let fatal = err.as_service_error().is_some_and(|e| {
                    e.is_resource_not_found_exception()
                        || e.is_invalid_argument_exception()
                        || e.is_invalid_kms_resource_exception()
                });
                let message = aws_smithy_types::error::display::DisplayErrorContext(&err).to_string();
                if fatal { SinkError::Fatal(message) } else { SinkError::Retryable(message) }
            })?;
        Ok(output
            .request_responses()
            .iter()
            .map(|entry| match (entry.error_code(), entry.record_id()) {
                (None, Some(_)) => EntryResult::Accepted,
                (code, _) => EntryResult::Failed {
                    code: code.unwrap_or("NoRecordId").to_owned(),
                    message: entry.error_message().unwrap_or_default().to_owned(),
                },
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A sink that fails entries by content, a given number of times each, and can fail whole calls.
    #[derive(Default)]
    struct Scripted {
        /// (content that fails, remaining failures; u32::MAX = always)
        entry_failures: Mutex<Vec<(Vec<u8>, u32)>>,
        call_failures: Mutex<Vec<SinkError>>,
        accepted: Mutex<Vec<Vec<u8>>>,
        call_sizes: Mutex<Vec<usize>>,
    }

    impl ChangeSink for Scripted {
        async fn put_batch(&self, records: &[&[u8]]) -> Result<Vec<EntryResult>, SinkError> {
            self.call_sizes.lock().unwrap().push(records.len());
            if let Some(err) = self.call_failures.lock().unwrap().pop() {
                return Err(err);
            }
            let mut failures = self.entry_failures.lock().unwrap();
            Ok(records
                .iter()
                .map(|r| {
                    if let Some((_, left)) = failures.iter_mut().find(|(needle, left)| *left > 0 && r == needle) {
                        *left = left.saturating_sub(if *left == u32::MAX { 0 } else { 1 });
                        EntryResult::Failed { code: "ServiceUnavailableException".into(), message: "slow down".into() }
                    } else {
                        self.accepted.lock().unwrap().push(r.to_vec());
                        EntryResult::Accepted
                    }
                })
                .collect())
        }
    }

    fn fast() -> RetryPolicy {
        RetryPolicy { max_attempts: 3, base_delay: Duration::from_millis(1), max_delay: Duration::from_millis(2) }
    }

    fn lines(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("{{\"n\":{i}}}\n").into_bytes()).collect()
    }

    #[test]
    fn chunks_respect_count_and_bytes() {
        let limits = Limits { max_records_per_call: 3, max_bytes_per_call: 25, max_record_bytes: 20 };
        let lines: Vec<Vec<u8>> =
            vec![vec![0; 10], vec![0; 10], vec![0; 10], vec![0; 1], vec![0; 1], vec![0; 1], vec![0; 1]];
        let all: Vec<usize> = (0..lines.len()).collect();
        assert_eq!(chunks(&lines, &all, &limits), vec![vec![0, 1], vec![2, 3, 4], vec![5, 6]]);
        let default = Limits::default();
        let many = self::lines(1201);
        let all: Vec<usize> = (0..many.len()).collect();
        let calls = chunks(&many, &all, &default);
        assert_eq!(calls.iter().map(Vec::len).collect::<Vec<_>>(), vec![500, 500, 201]);
    }

    #[tokio::test]
    async fn only_failed_entries_are_retried() {
        let lines = lines(5);
        let sink = Scripted::default();
        sink.entry_failures.lock().unwrap().push((lines[1].clone(), 1));
        sink.entry_failures.lock().unwrap().push((lines[3].clone(), u32::MAX));
        let report = deliver(&sink, &lines, &Limits::default(), &fast()).await;
        assert_eq!(report.delivered, 4);
        assert_eq!(report.undelivered.len(), 1);
        assert_eq!(report.undelivered[0].0, 3);
        assert!(
            matches!(&report.undelivered[0].1, Undelivered::Failed { attempts: 3, error } if error.contains("ServiceUnavailableException"))
        );
        assert_eq!(*sink.call_sizes.lock().unwrap(), vec![5, 2, 1]);
        let mut accepted = sink.accepted.lock().unwrap().clone();
        accepted.sort();
        let mut expected = vec![lines[0].clone(), lines[1].clone(), lines[2].clone(), lines[4].clone()];
        expected.sort();
        assert_eq!(accepted, expected);
    }

    #[tokio::test]
    async fn failed_calls_are_retried_then_reported() {
        let lines = lines(3);
        let sink = Scripted::default();
        sink.call_failures.lock().unwrap().push(SinkError::Retryable("500".into()));
        let report = deliver(&sink, &lines, &Limits::default(), &fast()).await;
        assert_eq!(report.delivered, 3);
        assert!(report.undelivered.is_empty());

        let sink = Scripted::default();
        for _ in 0..3 {
            sink.call_failures.lock().unwrap().push(SinkError::Retryable("500".into()));
        }
        let report = deliver(&sink, &lines, &Limits::default(), &fast()).await;
        assert_eq!(report.delivered, 0);
        assert_eq!(report.undelivered.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!(sink.accepted.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn fatal_errors_are_not_retried() {
        let sink = Scripted::default();
        sink.call_failures.lock().unwrap().push(SinkError::Fatal("no such stream".into()));
        let report = deliver(&sink, &lines(2), &Limits::default(), &fast()).await;
        assert_eq!(report.calls, 1);
        assert_eq!(report.undelivered.len(), 2);
    }

    #[tokio::test]
    async fn oversized_records_are_reported_not_sent() {
        let limits = Limits { max_record_bytes: 8, ..Limits::default() };
        let lines = vec![b"short\n".to_vec(), b"much too long\n".to_vec()];
        let sink = Scripted::default();
        let report = deliver(&sink, &lines, &limits, &fast()).await;
        assert_eq!(report.delivered, 1);
        assert_eq!(report.undelivered, vec![(1, Undelivered::Oversized { bytes: 14, limit: 8 })]);
        assert_eq!(*sink.call_sizes.lock().unwrap(), vec![1]);
    }

    #[test]
    fn delays_grow_and_stay_bounded() {
        let policy = RetryPolicy::default();
        for attempt in 1..20 {
            let d = policy.delay(attempt);
            assert!(d <= policy.max_delay, "{d:?}");
            assert!(d >= policy.base_delay.min(policy.max_delay) / 2);
        }
    }
}
