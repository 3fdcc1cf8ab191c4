//! What a dead-letter message says: Lambda's on-failure record for a stream event source (where the
//! records it gave up on are: a shard and a sequence range) or a record the processor dead-lettered
//! itself, with its content. Their JSON is a contract with Lambda and with the messages already in a
//! queue, so it is written down here once, as the types both the writers and [`super::replay`] read.

use aws_lambda_events::event::dynamodb::EventRecord;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
