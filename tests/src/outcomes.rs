//! The outcome events of a run, checked against its records: the transactions table's stream read from
//! its start and delivered as Lambda delivers it (batches of random size, a batch sent again from its
//! first reported failure, some batches sent again whole as after a timeout) through the outcomes
//! function's core to the EventBridge endpoint (the real SDK client), whose answers fail some entries and
//! some whole calls. Then every request outcome has exactly one id among the events, none is lost, none
//! is made up, every hold is announced, and copies of an event carry the same id and the same detail.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_lambda_events::event::dynamodb::EventRecord;
use aws_sdk_dynamodb::types::AttributeValue;
use local_services::eventbridge::EventBridge;
use local_services::firehose::MemorySink;
use local_services::streams::lambda_event;
use serde_json::Value;
use twopc::record::TransactionRecord;
use twopc_fanout::FanoutConfig;
use twopc_fanout::outcomes::{self, EventBridgeBus};

use crate::TestEnv;
use crate::streams::{is_marker, read_stream};

/// An EventBridge client for the endpoint at `url` (the SDK's standard retries, as deployed).
pub fn event_bridge_client(url: &str) -> aws_sdk_eventbridge::Client {
    let config = aws_sdk_eventbridge::Config::builder()
        .behavior_version(aws_sdk_eventbridge::config::BehaviorVersion::latest())
        .region(aws_sdk_eventbridge::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_eventbridge::config::Credentials::new("local", "local", None, None, "tests"))
        .endpoint_url(url)
        .build();
    aws_sdk_eventbridge::Client::from_conf(config)
}

/// Every record of the transactions table's stream, from its start (the marker [`read_stream`] writes is
/// deleted after; neither write is an outcome, and neither is returned).
pub async fn transactions_stream(env: &TestEnv) -> Vec<EventRecord> {
    let client = crate::dynamodb().await;
    let (table, key) = (env.transactions.table(), twopc::tables::tx_attr::ID);
    let mut records = read_stream(&client, table, key).await;
    let markers: Vec<String> = records.iter().filter_map(|r| is_marker(r, key)).map(str::to_owned).collect();
    for marker in markers {
        client
            .delete_item()
            .table_name(table)
            .key(key, AttributeValue::S(marker))
            .send()
            .await
            .expect("marker deleted");
    }
    records.retain(|r| is_marker(r, key).is_none());
    records
}

/// What the check counted.
#[derive(Debug, Default)]
pub struct OutcomeCheck {
    pub records: usize,
    pub events: usize,
    pub distinct: usize,
    pub by_kind: BTreeMap<String, usize>,
    pub failed_entries: usize,
    pub failed_calls: usize,
    pub redelivered_batches: usize,
    /// Each distinct event's detail, by its outcome id.
    pub details: BTreeMap<String, Value>,
}

impl std::fmt::Display for OutcomeCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "outcome events: {} stream records, {} events ({} distinct: {:?}), {} duplicates; faults: {} entries \
             refused, {} calls failed, {} batches delivered twice",
            self.records,
            self.events,
            self.distinct,
            self.by_kind,
            self.events - self.distinct,
            self.failed_entries,
            self.failed_calls,
            self.redelivered_batches
        )
    }
}

/// Delivers `env`'s transactions stream to a fresh EventBridge endpoint under faults drawn from `seed`,
/// then checks the events against the records (module docs). `Err` lists every violation.
pub async fn check_outcome_events(env: &TestEnv, seed: u64) -> Result<OutcomeCheck, Vec<String>> {
    let records = transactions_stream(env).await;
    let sink = MemorySink::default();
    let bridge = EventBridge::start(sink.clone()).await.expect("the EventBridge endpoint starts");
    let bus = EventBridgeBus::new(event_bridge_client(bridge.url()), "outcomes");
    let config = FanoutConfig::new(&BTreeMap::new(), env.transactions.table()).expect("config");
    let mut check = OutcomeCheck { records: records.len(), ..OutcomeCheck::default() };
    let mut rng = seed | 1;
    let mut draw = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut position = 0;
    let mut deliveries = 0;
    while position < records.len() {
        deliveries += 1;
        assert!(deliveries < 20 * records.len() + 100, "the stream never got through");
        let batch = &records[position..records.len().min(position + 1 + draw(25) as usize)];
        match draw(6) {
            // One record's event refused once (if it has one).
            0 | 1 => {
                let pick = &batch[draw(batch.len() as u64) as usize];
                if let Ok(Some(event)) = outcomes::outcome_of(&config, pick) {
                    bridge.fail_entries_containing(&format!("\"outcomeId\":\"{}\"", event.outcome_id()), 1);
                    check.failed_entries += 1;
                }
            }
            // A whole call fails past the SDK's retries (three attempts).
            2 => {
                bridge.fail_next_calls(3);
                check.failed_calls += 1;
            }
            _ => {}
        }
        let report = outcomes::publish(&bus, &config, &lambda_event(batch.to_vec())).await;
        match report.retry_from {
            Some(sequence) => {
                let at = batch.iter().position(|r| r.change.sequence_number.as_deref() == Some(sequence.as_str()));
                position += at.expect("the failure names a record of the batch");
            }
            // Sent whole, then as if the function timed out: Lambda sends the batch again.
            None if draw(8) == 0 => check.redelivered_batches += 1,
            None => position += batch.len(),
        }
    }
    let events = sink.json();
    check.events = events.len();
    let mut problems = Vec::new();
    let mut details: HashMap<String, Value> = HashMap::new();
    for event in &events {
        let id = event["detail"]["outcomeId"].as_str().unwrap_or_default().to_owned();
        match details.get(&id) {
            Some(earlier) if *earlier != event["detail"] => {
                problems.push(format!("two events with the id {id} differ: {earlier} and {}", event["detail"]))
            }
            Some(_) => {}
            None => {
                *check.by_kind.entry(event["detail-type"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
                details.insert(id, event["detail"].clone());
            }
        }
    }
    check.distinct = details.len();
    check.details = details.iter().map(|(id, detail)| (id.clone(), detail.clone())).collect();

    let stored: Vec<TransactionRecord> = env
        .scan(env.transactions.table())
        .await
        .iter()
        .map(|item| TransactionRecord::from_item(item).expect("a transaction record"))
        .collect();
    let mut expected = BTreeSet::new();
    let mut per_request: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for record in &stored {
        if record.status.is_terminal() && record.successor().is_none() {
            let id = format!("{}:{}", record.transaction_id, record.status.as_str());
            per_request.entry(record.first_id().to_owned()).or_default().push(id.clone());
            expected.insert(id);
        }
        if record.hold_until.is_some() {
            expected.insert(format!("{}:HELD", record.transaction_id));
        }
    }
    let sent: BTreeSet<String> = details.keys().cloned().collect();
    for lost in expected.difference(&sent) {
        problems.push(format!("no event for the outcome {lost}"));
    }
    for extra in sent.difference(&expected) {
        problems.push(format!("an event {extra} that no record's outcome makes"));
    }
    for (first, ends) in per_request.iter().filter(|(_, ends)| ends.len() > 1) {
        problems.push(format!("the request {first} has several outcomes: {ends:?}"));
    }
    // A request whose attempts have all ended has an outcome: not one whose last attempt names a
    // successor that was never recorded (its coordinator stopped first, and nobody fenced it).
    let mut ended: BTreeMap<&str, bool> = BTreeMap::new();
    for record in &stored {
        *ended.entry(record.first_id()).or_insert(true) &= record.status.is_terminal();
    }
    for (first, _) in ended.iter().filter(|(first, all)| **all && !per_request.contains_key(**first)) {
        problems.push(format!("the request {first} has ended attempts and no outcome"));
    }
    if problems.is_empty() { Ok(check) } else { Err(problems) }
}
