//! Outcome events: one EventBridge event per request outcome, read from the transactions table's stream
//! by a reader of its own (the `outcomes` function, a second event source mapping beside the stream
//! processor's, so that neither can stall the other), and the sweeper's alerts of transactions open too
//! long. Each kind has one source.
//!
//! An outcome is a status change of a record to COMMITTED, to ABORTED (with its reason and the votes),
//! or to PREPARED with `holdUntil` (a hold). An attempt whose end names a successor its coordinator made
//! (`retriedAs`) is not an outcome: its request goes on as that attempt. The aborts that a 503 answer, lock
//! resolution or an abort marker decided are records too (inserted ABORTED, perhaps without participants),
//! so they are outcomes like any other. A write that changes no status (an operator's audit entry, the
//! sweeper's bookkeeping) is none.
//!
//! Delivery is at least once: a batch whose events were not all accepted is reported from its first
//! failed record on (`ReportBatchItemFailures`), and the records after it are sent again. Each event
//! carries `detail.outcomeId` (`<transactionId>:<STATUS>`) to deduplicate on: never the stream's event id,
//! since one outcome can be read from several stream records.
//!
//! The bus is operators-only (infra/DEPLOY.md): an abort's reason may name another principal's
//! transaction, which the REST API redacts and an event does not.

use std::future::Future;

use aws_lambda_events::event::dynamodb::{Event, EventRecord};
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use serde_json::{Value, json};
use tracing::{error, info, warn};
use twopc::record::TransactionRecord;

use twopc::tables::tx_attr;

use crate::decide::{self, Decision, FanoutConfig};

pub use twopc::environment::{EVENT_BUS_NAME, OPEN_ALERT_AFTER_MS};
/// The sweeper announces a transaction still open this long past its deadline (a hold: past its
/// `holdUntil`) by default.
pub const DEFAULT_OPEN_ALERT_AFTER_MS: u64 = 15 * 60 * 1000;
/// Every event's `source`.
pub const SOURCE: &str = "twopc";
/// EventBridge takes at most this many entries per `PutEvents` call.
pub const MAX_ENTRIES_PER_CALL: usize = 10;

/// What an event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    Committed,
    Aborted,
    Held,
    OpenTooLong,
}

impl OutcomeKind {
    /// The event's `detail-type`.
    pub fn detail_type(self) -> &'static str {
        match self {
            OutcomeKind::Committed => "Transaction Committed",
            OutcomeKind::Aborted => "Transaction Aborted",
            OutcomeKind::Held => "Transaction Held",
            OutcomeKind::OpenTooLong => "Transaction Open Too Long",
        }
    }

    /// The part of `outcomeId` after the transaction id.
    fn suffix(self) -> &'static str {
        match self {
            OutcomeKind::Committed => "COMMITTED",
            OutcomeKind::Aborted => "ABORTED",
            OutcomeKind::Held => "HELD",
            OutcomeKind::OpenTooLong => "OPEN_TOO_LONG",
        }
    }
}

/// One event, before it is sent.
#[derive(Debug, Clone, PartialEq)]
pub struct OutcomeEvent {
    pub kind: OutcomeKind,
    pub transaction_id: String,
    /// `detail`: what the record says (it carries `outcomeId`).
    pub detail: Value,
}

impl OutcomeEvent {
    /// The id to deduplicate on: the transaction and what happened to it.
    pub fn outcome_id(&self) -> String {
        format!("{}:{}", self.transaction_id, self.kind.suffix())
    }

    /// The detail as sent (JSON text).
    pub fn detail_text(&self) -> String {
        self.detail.to_string()
    }

    /// The event of `record` (its item as JSON: a stream image, or a record serialized), whose request's
    /// first attempt is `first_id`. Only the fields an event carries are read: an operation of a shape this
    /// version does not know (a newer coordinator's) cannot make a record unreadable here.
    fn new(kind: OutcomeKind, record: &Value, first_id: &str, extra: Value) -> OutcomeEvent {
        let transaction_id = record[tx_attr::ID].as_str().unwrap_or_default().to_owned();
        let participants: Vec<Value> = record[tx_attr::PARTICIPANTS]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let mut entry = json!({"service": p["service"]});
                for field in ["vote", "code"] {
                    if let Some(value) = p.get(field).filter(|v| !v.is_null()) {
                        entry[field] = value.clone();
                    }
                }
                entry
            })
            .collect();
        let mut detail = json!({
            "transactionId": transaction_id,
            "firstTransactionId": first_id,
            "status": record[tx_attr::STATUS],
            "createdAt": record[tx_attr::CREATED_AT],
            "updatedAt": record[tx_attr::UPDATED_AT],
            "participants": participants,
        });
        if let Some(principal) = record.get(tx_attr::PRINCIPAL).filter(|p| p.is_string()) {
            detail["principal"] = principal.clone();
        }
        if let (Value::Object(detail), Value::Object(extra)) = (&mut detail, extra) {
            detail.extend(extra);
        }
        let mut event = OutcomeEvent { kind, transaction_id, detail };
        event.detail["outcomeId"] = json!(event.outcome_id());
        event
    }

    /// The sweeper's alert for `record`, open `age_ms`.
    pub fn open_too_long(record: &TransactionRecord, age_ms: u64) -> OutcomeEvent {
        let mut extra = json!({"ageMs": age_ms, "deadline": record.deadline});
        if let Some(hold_until) = record.hold_until {
            extra["holdUntil"] = json!(hold_until);
        }
        let json = serde_json::to_value(record).expect("records serialize");
        OutcomeEvent::new(OutcomeKind::OpenTooLong, &json, record.first_id(), extra)
    }
}

/// The outcome a transactions-table stream record announces, if any. `Err` for a record that cannot be
/// read (it may be an outcome: it is reported, never dropped), and for a record of another stream (this
/// function reads the transactions table's alone: another is a deployment's mistake, to be seen).
pub fn outcome_of(config: &FanoutConfig, record: &EventRecord) -> Result<Option<OutcomeEvent>, String> {
    let ended = match decide::decide(config, record) {
        Decision::Ended(ended) => ended,
        Decision::Unprocessable(message) => return Err(message),
        Decision::Foreign(message) => return Err(format!("not the transactions table's stream: {message}")),
        Decision::Commit(_) | Decision::Skip(_) => return Ok(None),
    };
    // Its request goes on as the attempt it names: that attempt's end is the outcome.
    if ended.retried_as.is_some() {
        return Ok(None);
    }
    let image = crate::convert::item_to_json(record.change.new_image.inner()).map_err(|e| e.to_string())?;
    let first_id = ended.first_transaction_id.as_deref().unwrap_or(&ended.transaction_id);
    let (kind, extra) = match ended.status.as_str() {
        "COMMITTED" => (OutcomeKind::Committed, json!({})),
        "ABORTED" => {
            (OutcomeKind::Aborted, json!({"reason": image.get(tx_attr::REASON).cloned().unwrap_or(Value::Null)}))
        }
        "PREPARED" => (OutcomeKind::Held, json!({"holdUntil": ended.hold_until})),
        _ => return Ok(None),
    };
    Ok(Some(OutcomeEvent::new(kind, &image, first_id, extra)))
}

/// One entry's fate in a `PutEvents` call.
pub type EntryResult = Result<(), String>;

/// Where events go: one `PutEvents`-like call of at most [`MAX_ENTRIES_PER_CALL`] events, answered one
/// result per event, in order; `Err` when the whole call failed.
pub trait OutcomeBus: Send + Sync {
    fn put(&self, events: &[OutcomeEvent]) -> impl Future<Output = Result<Vec<EntryResult>, String>> + Send;
}

/// EventBridge (`AWS_ENDPOINT_URL_EVENTBRIDGE` points it elsewhere: the local stack's endpoint).
#[derive(Debug, Clone)]
pub struct EventBridgeBus {
    client: aws_sdk_eventbridge::Client,
    bus: String,
}

impl EventBridgeBus {
    pub fn new(client: aws_sdk_eventbridge::Client, bus: impl Into<String>) -> Self {
        EventBridgeBus { client, bus: bus.into() }
    }

    pub fn from_config(sdk: &aws_config::SdkConfig, bus: impl Into<String>) -> Self {
        Self::new(aws_sdk_eventbridge::Client::new(sdk), bus)
    }
}

impl OutcomeBus for EventBridgeBus {
    async fn put(&self, events: &[OutcomeEvent]) -> Result<Vec<EntryResult>, String> {
        use aws_sdk_eventbridge::types::PutEventsRequestEntry;
        let entries: Vec<PutEventsRequestEntry> = events
            .iter()
            .map(|event| {
                PutEventsRequestEntry::builder()
                    .event_bus_name(&self.bus)
                    .source(SOURCE)
                    .detail_type(event.kind.detail_type())
                    .detail(event.detail_text())
                    .build()
            })
            .collect();
        let output = self
            .client
            .put_events()
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| aws_smithy_types::error::display::DisplayErrorContext(&e).to_string())?;
        let answered = output.entries();
        if answered.len() != events.len() {
            return Err(format!("PutEvents answered {} entries for {} events", answered.len(), events.len()));
        }
        Ok(answered
            .iter()
            .map(|entry| match (entry.event_id(), entry.error_code()) {
                (Some(_), None) => Ok(()),
                (_, code) => {
                    Err(format!("{}: {}", code.unwrap_or("NoEventId"), entry.error_message().unwrap_or_default()))
                }
            })
            .collect())
    }
}

/// Sends `events` in calls of at most [`MAX_ENTRIES_PER_CALL`]: each event's result, in order.
pub async fn send<B: OutcomeBus>(bus: &B, events: &[OutcomeEvent]) -> Vec<EntryResult> {
    let mut results = Vec::with_capacity(events.len());
    for chunk in events.chunks(MAX_ENTRIES_PER_CALL) {
        let answered = match bus.put(chunk).await {
            Ok(answered) if answered.len() == chunk.len() => answered,
            Ok(answered) => {
                let message = format!("the bus answered {} results for {} events", answered.len(), chunk.len());
                chunk.iter().map(|_| Err(message.clone())).collect()
            }
            Err(message) => chunk.iter().map(|_| Err(message.clone())).collect(),
        };
        let failed = answered.iter().any(Result::is_err);
        results.extend(answered);
        // What follows is sent again with the batch's retry anyway: not now, into a bus that is failing.
        if failed {
            results.resize(events.len(), Err("not sent: an earlier call of the batch failed".to_owned()));
            break;
        }
    }
    results
}

/// What [`publish`] did with a batch of stream records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PublishReport {
    /// Events accepted by the bus.
    pub sent: usize,
    /// The sequence number the batch is to be retried from (its first record that failed), if any.
    pub retry_from: Option<String>,
}

impl PublishReport {
    pub fn response(&self) -> DynamoDbEventResponse {
        let mut response = DynamoDbEventResponse::default();
        if let Some(sequence) = &self.retry_from {
            let mut failure = DynamoDbBatchItemFailure::default();
            failure.item_identifier = Some(sequence.clone());
            response.batch_item_failures.push(failure);
        }
        response
    }
}

/// The outcomes of a batch of the transactions table's stream records, sent to `bus`. A record that
/// cannot be read, or whose event the bus did not accept, is reported as the batch's first failure:
/// Lambda sends it and every record after it again (their events again too: the same `outcomeId`).
pub async fn publish<B: OutcomeBus>(bus: &B, config: &FanoutConfig, event: &Event) -> PublishReport {
    // Each event with the index of its record, to report the first that failed.
    let mut indices = Vec::new();
    let mut outcomes = Vec::new();
    let mut first_failed: Option<usize> = None;
    for (index, record) in event.records.iter().enumerate() {
        match outcome_of(config, record) {
            Ok(Some(outcome)) => {
                indices.push(index);
                outcomes.push(outcome);
            }
            Ok(None) => {}
            Err(message) => {
                // The ones after it are sent all the same (a retry sends them again, under the same ids):
                // one record that cannot be read holds back no other outcome.
                error!(event_id = %record.event_id, %message, "a transactions-table record that cannot be read");
                first_failed = Some(first_failed.map_or(index, |f| f.min(index)));
            }
        }
    }
    let results = send(bus, &outcomes).await;
    let mut report = PublishReport::default();
    for ((index, outcome), result) in indices.iter().zip(&outcomes).zip(results) {
        match result {
            Ok(()) => {
                report.sent += 1;
                info!(tx = %outcome.transaction_id, outcome = outcome.kind.detail_type(), "outcome event sent");
            }
            Err(message) => {
                warn!(tx = %outcome.transaction_id, outcome = outcome.kind.detail_type(), %message, "outcome event not accepted");
                first_failed = Some(first_failed.map_or(*index, |f: usize| f.min(*index)));
            }
        }
    }
    report.retry_from =
        first_failed.map(|index| event.records[index].change.sequence_number.clone().unwrap_or_default());
    report
}

#[cfg(test)]
mod tests;
