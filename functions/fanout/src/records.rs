//! DynamoDB Streams API records (`aws-sdk-dynamodbstreams`) as the Lambda DynamoDB event records the
//! stream processor takes.
//!
//! The Streams API and the Lambda event carry the same record with small differences: the SDK has
//! typed fields (`OperationType`, `DateTime`, its own `AttributeValue`) where the event has JSON
//! (`eventName` text, `ApproximateCreationDateTime` as epoch seconds, DynamoDB JSON images), and only
//! the event has `eventSourceARN` (the stream ARN, from which the processor reads the table name).
//! [`lambda_record`] does that conversion. It lives in the core because the dead-letter replay
//! ([`super::replay`]) reads records back from the stream itself, as the local stack's poller and the
//! tests do (`local_services::streams` re-exports it).

use std::collections::HashMap;

use aws_lambda_events::event::dynamodb::{Event, EventRecord, StreamRecord, StreamViewType, UserIdentity};
use aws_sdk_dynamodbstreams::types as sdk;
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
