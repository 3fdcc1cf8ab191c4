//! The protocol's metrics, through the `metrics` facade. In Lambda, [`install_emf`] makes them
//! CloudWatch embedded metric format: JSON lines on stdout that CloudWatch turns into metrics, with no
//! API call and no IAM permission. The names are a contract with the templates' alarms and dashboard.

use std::time::Duration;

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, histogram};
use serde_json::Value;

use crate::config;

/// Coordinator and sweeper: the CloudWatch namespace of their embedded-metric-format metrics.
pub const METRICS_NAMESPACE: &str = "METRICS_NAMESPACE";
pub const DEFAULT_METRICS_NAMESPACE: &str = "TwoPhaseCommit";

/// Coordinator: transactions answered COMMITTED.
pub const COMMITTED: &str = "Committed";
/// Coordinator: transactions answered ABORTED (409), with the dimension [`REASON`].
pub const ABORTED: &str = "Aborted";
/// Coordinator: transactions answered 202 COMMITTING: the answer budget ran out (the sweeper finishes
/// them), or the caller preferred the answer on the commit decision (`Prefer: respond-async`, issue 48).
pub const ACCEPTED: &str = "Accepted";
/// Coordinator: 503 answers (a store could not be reached, or refused a decision).
pub const UNAVAILABLE: &str = "Unavailable";
/// Coordinator: requests refused before anything was written (400).
pub const REJECTED: &str = "Rejected";
pub const PREPARE_LATENCY: &str = "PrepareLatency";
pub const DECISION_LATENCY: &str = "DecisionLatency";
pub const COMMIT_LATENCY: &str = "CommitLatency";
pub const TRANSACTION_LATENCY: &str = "TransactionLatency";
/// Coordinator: for each participant's answer to a prepare, how far its clock is from the coordinator's
/// (milliseconds, either way), estimated from the answer's time and the middle of the call. The protocol
/// tolerates up to `crate::clock::CLOCK_MARGIN_MS`; the templates alarm well below it.
pub const CLOCK_SKEW: &str = "ClockSkew";
/// Stream processor: records it gave up on (unprocessable, or too large for Firehose), dead-lettered with
/// their content or, when that fails, reported for retry.
pub const UNPROCESSABLE_RECORDS: &str = "UnprocessableRecords";
/// Sweeper.
pub const STUCK_TRANSACTIONS: &str = "StuckTransactions";
pub const RECOVERED_TRANSACTIONS: &str = "RecoveredTransactions";
pub const RESOLVED_LOCKS: &str = "ResolvedLocks";
pub const SWEEP_ERRORS: &str = "SweepErrors";
/// Sweeper, after each run: the open transactions by status (dimension [`STATUS`]), the age of the oldest
/// (milliseconds since its request started), and the operators' stuck view's count (`/admin/stuck`).
pub const OPEN_TRANSACTIONS: &str = "OpenTransactions";
pub const OLDEST_OPEN_TRANSACTION_AGE: &str = "OldestOpenTransactionAge";
pub const STUCK_VIEW_COUNT: &str = "StuckViewCount";
/// The dimension of [`OPEN_TRANSACTIONS`]: PREPARING, PREPARED, COMMITTING or ABORTING.
pub const STATUS: &str = "Status";

/// The dimension of [`ABORTED`]: the first refusing participant's code (`CONFLICT`, `GUARD_FAILED`,
/// ...), `NO_ANSWER` when a participant did not answer, `DEADLINE` when all prepared too late.
pub const REASON: &str = "Reason";

/// The coordinator's counts (no dimension but [`ABORTED`]'s [`REASON`]) and phase latencies, and the
/// sweeper's counts: what the templates' alarms and dashboard may name (`examples/contract.rs`).
pub const COORDINATOR_COUNTS: &[&str] = &[COMMITTED, ABORTED, ACCEPTED, UNAVAILABLE, REJECTED];
pub const COORDINATOR_LATENCIES: &[&str] =
    &[PREPARE_LATENCY, DECISION_LATENCY, COMMIT_LATENCY, TRANSACTION_LATENCY, CLOCK_SKEW];
pub const SWEEPER_COUNTS: &[&str] = &[STUCK_TRANSACTIONS, RECOVERED_TRANSACTIONS, RESOLVED_LOCKS, SWEEP_ERRORS];
/// The sweeper's gauges, set after each run from what is open then.
pub const SWEEPER_GAUGES: &[&str] = &[OPEN_TRANSACTIONS, OLDEST_OPEN_TRANSACTION_AGE, STUCK_VIEW_COUNT];
/// The stream processor's counts.
pub const STREAM_PROCESSOR_COUNTS: &[&str] = &[UNPROCESSABLE_RECORDS];

/// Units of every metric, so that CloudWatch shows milliseconds as milliseconds.
pub fn describe() {
    for &name in COORDINATOR_COUNTS {
        describe_counter!(name, Unit::Count, "coordinator answers");
    }
    for &name in SWEEPER_COUNTS {
        describe_counter!(name, Unit::Count, "sweeper");
    }
    describe_gauge!(OPEN_TRANSACTIONS, Unit::Count, "open transactions by status, after a sweep");
    describe_gauge!(OLDEST_OPEN_TRANSACTION_AGE, Unit::Milliseconds, "the oldest open transaction's age");
    describe_gauge!(STUCK_VIEW_COUNT, Unit::Count, "what the operators' stuck view lists, after a sweep");
    for &name in STREAM_PROCESSOR_COUNTS {
        describe_counter!(name, Unit::Count, "stream processor");
    }
    for &name in COORDINATOR_LATENCIES {
        describe_histogram!(name, Unit::Milliseconds, "coordinator phases");
    }
}

/// Records the skew of a participant's clock against the coordinator's, as NTP estimates it: the
/// coordinator sent at `sent_ms` and had the answer at `back_ms`; the participant had the message at
/// `received_ms` and answered at `answered_ms` by its clock. Off by at most half the time the call spent
/// on the network (not in the participant). Returns the skew (positive: the participant runs ahead).
pub fn clock_skew(service: &str, sent_ms: u64, back_ms: u64, received_ms: u64, answered_ms: u64) -> i64 {
    let skew = ((received_ms as i64 - sent_ms as i64) + (answered_ms as i64 - back_ms as i64)) / 2;
    histogram!(CLOCK_SKEW).record(skew.unsigned_abs() as f64);
    if skew.unsigned_abs() > crate::clock::CLOCK_MARGIN_MS / 5 {
        tracing::warn!(
            service,
            skew_ms = skew,
            call_ms = back_ms.saturating_sub(sent_ms),
            "participant's clock is off"
        );
    }
    skew
}

/// What a flush writes of a count that did not move since the last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zeros {
    /// Nothing: the coordinator counts events, and an invocation without one has nothing to say.
    Omitted,
    /// A zero: the sweeper's counts describe each run, and the stuck-transactions alarm ("stuck in
    /// every run for 5 minutes", a `Minimum`) must see the runs that found nothing.
    Written,
}

/// Installs the embedded-metric-format recorder for this process (once; later calls are ignored) and
/// returns the collector to flush after each invocation.
pub fn install_emf(namespace: &str, zeros: Zeros) -> Option<&'static metrics_cloudwatch_embedded::Collector> {
    let collector = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(namespace.to_owned())
        .emit_zeros(zeros == Zeros::Written)
        .init()
        .ok()?;
    describe();
    Some(collector)
}

/// [`install_emf`] in the namespace a function's `METRICS_NAMESPACE` names.
pub fn install_emf_from_env(zeros: Zeros) -> Option<&'static metrics_cloudwatch_embedded::Collector> {
    install_emf(&config::or_default(METRICS_NAMESPACE, DEFAULT_METRICS_NAMESPACE), zeros)
}

/// Writes what the invocation recorded as one EMF document on stdout.
pub fn flush(collector: Option<&'static metrics_cloudwatch_embedded::Collector>) {
    if let Some(collector) = collector
        && let Err(e) = collector.flush(std::io::stdout())
    {
        tracing::warn!(error = %e, "could not write the metrics");
    }
}

pub(crate) fn phase(name: &'static str, elapsed: Duration) {
    histogram!(name).record(elapsed.as_secs_f64() * 1e3);
}

/// Counts one answer of `POST /transactions` by what it told the caller.
pub(crate) fn answered(status: u16, body: &Value, elapsed: Duration) {
    match status {
        200 => counter!(COMMITTED).increment(1),
        202 => counter!(ACCEPTED).increment(1),
        409 => counter!(ABORTED, REASON => abort_reason(body)).increment(1),
        503 => counter!(UNAVAILABLE).increment(1),
        400..=499 => {
            counter!(REJECTED).increment(1);
            return;
        }
        _ => return,
    }
    phase(TRANSACTION_LATENCY, elapsed);
}

/// The [`REASON`] of an ABORTED answer, from its participants.
pub fn abort_reason(body: &Value) -> String {
    let participants = body["participants"].as_array().map(Vec::as_slice).unwrap_or_default();
    if let Some(refusing) = participants.iter().find(|p| p["vote"] == "REFUSED") {
        return refusing["code"].as_str().unwrap_or("REFUSED").to_owned();
    }
    if participants.iter().any(|p| p.get("vote").is_none()) {
        return "NO_ANSWER".to_owned();
    }
    "DEADLINE".to_owned()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_abort_reason_is_the_first_refusal_then_silence_then_the_deadline() {
        let refused = json!({"participants": [
            {"service": "a", "vote": "PREPARED"},
            {"service": "b", "vote": "REFUSED", "code": "GUARD_FAILED"},
            {"service": "c"},
        ]});
        assert_eq!(abort_reason(&refused), "GUARD_FAILED");
        let silent = json!({"participants": [{"service": "a", "vote": "PREPARED"}, {"service": "c"}]});
        assert_eq!(abort_reason(&silent), "NO_ANSWER");
        let late = json!({"participants": [{"service": "a", "vote": "PREPARED"}]});
        assert_eq!(abort_reason(&late), "DEADLINE");
    }

    #[test]
    fn a_sweep_that_found_nothing_writes_zeros_when_zeros_are_written() {
        let collector = install_emf("TwoPhaseCommit/unit", Zeros::Written).expect("the only recorder of this process");
        crate::sweeper::SweepReport::default().record_metrics();
        let mut out = Vec::new();
        collector.flush(&mut out).unwrap();
        let document: Value = serde_json::from_str(String::from_utf8(out).unwrap().trim()).unwrap();
        for name in SWEEPER_COUNTS {
            assert_eq!(document[name], json!(0), "{document}");
        }
    }
}
