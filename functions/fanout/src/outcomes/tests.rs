//! Which stream records are outcomes, and the event each becomes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use aws_lambda_events::event::dynamodb::{Event, EventRecord};
use serde_json::{Value, json};
use twopc::record::TransactionRecord;

use super::*;

fn config() -> FanoutConfig {
    FanoutConfig::new(&BTreeMap::new(), "transactions").unwrap()
}

fn stored(id: &str, status: &str, extra: Value) -> TransactionRecord {
    let mut record = json!({
        "transactionId": id, "status": status, "createdAt": 1000, "updatedAt": 2000, "deadline": 9000,
        "participants": [
            {"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": -10}], "vote": "PREPARED"},
            {"service": "service-b", "operations": [{"op": "add", "key": {"entityId": "B"}, "field": "balance", "delta": 10}], "vote": "REFUSED", "code": "CONFLICT"},
        ],
    });
    if let (Value::Object(record), Value::Object(extra)) = (&mut record, extra) {
        record.extend(extra);
    }
    serde_json::from_value(record).unwrap()
}

fn image(record: Option<&TransactionRecord>) -> serde_dynamo::Item {
    let map: HashMap<String, serde_dynamo::AttributeValue> = record
        .map(|r| r.to_item().into_iter().map(|(k, v)| (k, serde_dynamo::AttributeValue::from(v))).collect())
        .unwrap_or_default();
    serde_dynamo::Item::from(map)
}

fn change(sequence: u64, old: Option<&TransactionRecord>, new: &TransactionRecord) -> EventRecord {
    let mut record = EventRecord::default();
    record.event_id = format!("e{sequence}");
    record.event_name = if old.is_some() { "MODIFY" } else { "INSERT" }.to_owned();
    record.event_source_arn =
        Some("arn:aws:dynamodb:us-east-1:123456789012:table/transactions/stream/2024-01-01T00:00:00.000".to_owned());
    record.change.keys = image(Some(&stored(&new.transaction_id, "ABORTED", json!({}))))
        .into_inner()
        .into_iter()
        .filter(|(k, _)| k == "transactionId")
        .collect::<HashMap<_, _>>()
        .into();
    record.change.old_image = image(old);
    record.change.new_image = image(Some(new));
    record.change.sequence_number = Some(sequence.to_string());
    record
}

fn outcome(old: Option<&TransactionRecord>, new: &TransactionRecord) -> Option<OutcomeEvent> {
    outcome_of(&config(), &change(1, old, new)).unwrap()
}

#[test]
fn a_commit_an_abort_and_a_hold_are_outcomes_named_by_the_attempt_with_its_first() {
    let committing = stored("T1", "COMMITTING", json!({}));
    let committed = stored("T1", "COMMITTED", json!({}));
    let event = outcome(Some(&committing), &committed).expect("a commit");
    assert_eq!(event.kind.detail_type(), "Transaction Committed");
    assert_eq!(event.detail["outcomeId"], "T1:COMMITTED");
    assert_eq!(event.detail["firstTransactionId"], "T1");
    assert_eq!(event.detail["participants"][1], json!({"service": "service-b", "vote": "REFUSED", "code": "CONFLICT"}));

    let second =
        stored("T2-2", "ABORTED", json!({"reason": "refused by service-b", "attempt": 2, "firstTransactionId": "T2"}));
    let event = outcome(Some(&stored("T2-2", "ABORTING", json!({"attempt": 2, "firstTransactionId": "T2"}))), &second)
        .expect("an abort");
    assert_eq!(
        (
            event.detail["outcomeId"].as_str(),
            event.detail["firstTransactionId"].as_str(),
            event.detail["reason"].as_str()
        ),
        (Some("T2-2:ABORTED"), Some("T2"), Some("refused by service-b"))
    );

    let held = stored("T3", "PREPARED", json!({"holdMs": 60000, "holdUntil": 70000}));
    let event = outcome(Some(&stored("T3", "PREPARING", json!({"holdMs": 60000}))), &held).expect("a hold");
    assert_eq!((event.kind, event.detail["holdUntil"].as_u64()), (OutcomeKind::Held, Some(70000)));
}

#[test]
fn an_attempt_retried_as_another_is_no_outcome_and_its_successor_is() {
    let refused = stored("T1", "ABORTED", json!({"retriedAs": "T1-2", "refusedForContention": true}));
    assert_eq!(outcome(Some(&stored("T1", "PREPARING", json!({}))), &refused), None);
    // The successor named but given no time: inserted ABORTED, the request's outcome.
    let named =
        stored("T1-2", "ABORTED", json!({"attempt": 2, "firstTransactionId": "T1", "reason": "too little time"}));
    assert_eq!(outcome(None, &named).map(|e| e.outcome_id()), Some("T1-2:ABORTED".to_owned()));
}

#[test]
fn an_abort_written_for_an_owner_without_a_record_is_an_outcome() {
    let mut resolved = stored("T9", "ABORTED", json!({"reason": "aborted by lock resolution"}));
    resolved.participants.clear();
    let event = outcome(None, &resolved).expect("lock resolution's abort is the request's outcome");
    assert_eq!(
        (event.detail["outcomeId"].as_str(), event.detail["participants"].clone()),
        (Some("T9:ABORTED"), json!([]))
    );
}

#[test]
fn writes_that_change_no_status_and_open_states_are_no_outcomes() {
    let committed = stored("T1", "COMMITTED", json!({}));
    let mut audited = committed.clone();
    audited.audit.push(twopc::record::AuditEntry::new(3000, "ops", "retry", "COMMITTED"));
    assert_eq!(outcome(Some(&committed), &audited), None, "an operator's audit entry");
    assert_eq!(outcome(None, &stored("T2", "PREPARING", json!({}))), None);
    assert_eq!(outcome(Some(&stored("T2", "PREPARING", json!({}))), &stored("T2", "COMMITTING", json!({}))), None);
}

/// A bus that accepts or refuses each event by its outcome id, and can fail whole calls.
#[derive(Default)]
struct Scripted {
    refuse: Vec<String>,
    fail_calls: Mutex<u32>,
    calls: Mutex<Vec<Vec<String>>>,
}

impl OutcomeBus for Scripted {
    async fn put(&self, events: &[OutcomeEvent]) -> Result<Vec<EntryResult>, String> {
        self.calls.lock().unwrap().push(events.iter().map(OutcomeEvent::outcome_id).collect());
        let mut fail = self.fail_calls.lock().unwrap();
        if *fail > 0 {
            *fail -= 1;
            return Err("ServiceUnavailable".into());
        }
        Ok(events
            .iter()
            .map(|e| if self.refuse.contains(&e.outcome_id()) { Err("InternalFailure: x".into()) } else { Ok(()) })
            .collect())
    }
}

fn batch(n: u64) -> Event {
    let mut event = Event::default();
    for i in 1..=n {
        let id = format!("T{i}");
        event.records.push(change(
            i,
            Some(&stored(&id, "COMMITTING", json!({}))),
            &stored(&id, "COMMITTED", json!({})),
        ));
    }
    event
}

#[tokio::test]
async fn a_batch_is_sent_ten_events_a_call_and_retried_from_its_first_refused_record() {
    let bus = Scripted { refuse: vec!["T12:COMMITTED".into()], ..Scripted::default() };
    let report = publish(&bus, &config(), &batch(14)).await;
    assert_eq!(bus.calls.lock().unwrap().iter().map(Vec::len).collect::<Vec<_>>(), [10, 4]);
    assert_eq!((report.sent, report.retry_from.as_deref()), (13, Some("12")));

    // A call with a refusal ends the batch's sending: what follows goes with the retry.
    let bus = Scripted { refuse: vec!["T7:COMMITTED".into(), "T12:COMMITTED".into()], ..Scripted::default() };
    let report = publish(&bus, &config(), &batch(14)).await;
    assert_eq!(bus.calls.lock().unwrap().iter().map(Vec::len).collect::<Vec<_>>(), [10]);
    assert_eq!((report.sent, report.retry_from.as_deref()), (9, Some("7")));
    let response = report.response();
    assert_eq!(response.batch_item_failures.len(), 1);
    assert_eq!(response.batch_item_failures[0].item_identifier.as_deref(), Some("7"));

    let down = Scripted { fail_calls: Mutex::new(1), ..Scripted::default() };
    let report = publish(&down, &config(), &batch(3)).await;
    assert_eq!((report.sent, report.retry_from.as_deref()), (0, Some("1")), "a failed call fails its events");
    let report = publish(&down, &config(), &batch(3)).await;
    assert_eq!((report.sent, report.retry_from), (3, None));
}

#[tokio::test]
async fn an_unreadable_record_is_reported_and_holds_back_no_other_outcome() {
    let mut event = batch(3);
    event.records[1].change.new_image = {
        let mut map: HashMap<String, serde_dynamo::AttributeValue> = HashMap::new();
        map.insert("transactionId".into(), serde_dynamo::AttributeValue::S("T2".into()));
        map.insert("status".into(), serde_dynamo::AttributeValue::N("7".into()));
        map.into()
    };
    let bus = Scripted::default();
    let report = publish(&bus, &config(), &event).await;
    assert_eq!((report.sent, report.retry_from.as_deref()), (2, Some("2")));
    assert_eq!(*bus.calls.lock().unwrap(), vec![vec!["T1:COMMITTED".to_owned(), "T3:COMMITTED".to_owned()]]);
}

/// EventBridge refuses a `PutEvents` call over 256 KB: the largest event a record can make (the most
/// participants with long service names and refusals, the longest reason, a long principal) times the
/// entries of one call stays well under it.
#[test]
fn a_full_call_of_the_largest_events_fits_eventbridges_limit() {
    let mut record = stored("tx-0123456789abcdef0123456789abcdef", "ABORTED", json!({}));
    let entry = record.participants[1].clone();
    record.participants = (0..twopc::model::MAX_PARTICIPANTS)
        .map(|i| {
            let mut entry = entry.clone();
            entry.service = format!("{i:02}-{}", "s".repeat(61));
            entry
        })
        .collect();
    record.reason = Some("é".repeat(twopc::record::MAX_REASON_BYTES / 2));
    record.principal = Some(format!("arn:aws:sts::123456789012:assumed-role/{}/{}", "r".repeat(64), "s".repeat(2000)));
    let json = serde_json::to_value(&record).unwrap();
    let event =
        OutcomeEvent::new(OutcomeKind::Aborted, &json, &record.transaction_id, json!({"reason": record.reason}));
    let bytes = SOURCE.len() + event.kind.detail_type().len() + event.detail_text().len() + 256;
    assert!(bytes * MAX_ENTRIES_PER_CALL < 256 * 1024 / 2, "{bytes} bytes an event");
}

/// A record of another table's stream is this function's mistake to report (its only source is the
/// transactions table's stream), and an operation of a shape this version does not know (a newer
/// coordinator's) does not keep a record's outcome from being announced.
#[test]
fn another_stream_is_an_error_and_an_unknown_operation_is_no_obstacle() {
    let committed = stored("T1", "COMMITTED", json!({}));
    let mut elsewhere = change(1, None, &committed);
    elsewhere.event_source_arn =
        Some("arn:aws:dynamodb:us-east-1:123456789012:table/other/stream/2024-01-01T00:00:00.000".to_owned());
    assert!(outcome_of(&config(), &elsewhere).unwrap_err().contains("not the transactions table's stream"));

    let mut newer = change(2, None, &committed);
    let mut image = newer.change.new_image.clone().into_inner();
    let Some(serde_dynamo::AttributeValue::L(participants)) = image.get_mut("participants") else { panic!() };
    let serde_dynamo::AttributeValue::M(first) = &mut participants[0] else { panic!() };
    first.insert(
        "operations".into(),
        serde_dynamo::AttributeValue::L(vec![serde_dynamo::AttributeValue::M(HashMap::from([(
            "op".to_owned(),
            serde_dynamo::AttributeValue::S("teleport".into()),
        )]))]),
    );
    newer.change.new_image = image.into();
    assert_eq!(outcome_of(&config(), &newer).unwrap().map(|e| e.outcome_id()), Some("T1:COMMITTED".to_owned()));
}
