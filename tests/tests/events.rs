//! Every sample in `events/` (the files `cargo lambda invoke --data-file` takes) is accepted by its
//! function's handler: parsed the way the runtime parses it, then run, against DynamoDB Local where
//! the function writes. A file whose name matches no function fails the test, so every new sample
//! is checked too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aws_lambda_events::apigw::ApiGatewayWebsocketProxyRequest;
use aws_lambda_events::event::dynamodb::Event;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use serde_json::Value;
use twopc::model::ParticipantRequest;
use twopc_fanout::FanoutConfig;
use twopc_fanout::connections::ConnectionStore;
use twopc_tests::TestEnv;

fn events_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../events")
}

/// The samples whose names start with `prefix`, as (file name, JSON text).
fn samples(prefix: &str) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = std::fs::read_dir(events_dir())
        .expect("events/ exists")
        .map(|entry| entry.expect("readable").path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_owned();
            name.starts_with(prefix).then(|| (name, std::fs::read_to_string(&path).expect("readable")))
        })
        .collect();
    found.sort();
    found
}

const FUNCTIONS: [&str; 7] =
    ["coordinator-", "participant-", "sweeper-", "stream-processor-", "outcomes-", "connections-", "authorizer-"];

/// Authorizer: REQUEST authorizer events (REST method, WebSocket `$connect`) parse and are judged; their
/// tokens are placeholders (a key nobody has), so the answer is the 401 or, with the issuer out of
/// reach, the function error, never an Allow.
#[tokio::test]
async fn authorizer_samples_are_served() {
    let files = samples("authorizer-");
    assert!(files.len() >= 2, "a REST and a $connect sample");
    let settings = twopc::jwt::JwtSettings::new("http://127.0.0.1:9/issuer", "app", None);
    let verifier = twopc::jwt::Verifier::new(settings, twopc::access::Policy::default());
    for (name, text) in files {
        let event: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: not JSON: {e}"));
        let denied = authorizer::handle(&verifier, event).await.expect_err("a placeholder token is never allowed");
        assert!(
            matches!(denied, authorizer::Denied::Unauthorized | authorizer::Denied::Unavailable),
            "{name}: {denied:?}"
        );
    }
}

#[test]
fn every_sample_belongs_to_a_function() {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(events_dir()).expect("events/ exists") {
        let name = entry.expect("readable").file_name().to_string_lossy().into_owned();
        assert!(
            name.ends_with(".json") && FUNCTIONS.iter().any(|f| name.starts_with(f)),
            "events/{name}: name a sample <function>-<case>.json for one of {FUNCTIONS:?}, so that a test feeds it to its handler"
        );
        names.push(name);
    }
    for function in FUNCTIONS {
        assert!(names.iter().any(|n| n.starts_with(function)), "no sample event for {function}*");
    }
}

/// Coordinator: API Gateway REST proxy events through `lambda_http` into the handler. POSTs run
/// first (the GET sample reads the transaction the POST sample's Idempotency-Key creates).
#[tokio::test]
async fn coordinator_samples_are_served() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "500").await;
    env.put_account("service-b", "B", "0").await;
    let mut files = samples("coordinator-");
    files.sort_by_key(|(_, text)| !text.contains("\"httpMethod\": \"POST\""));
    assert!(!files.is_empty());
    let mut created = Vec::new();
    for (name, text) in files {
        let event: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: not JSON: {e}"));
        lambda_http::request::from_str(&text).unwrap_or_else(|e| panic!("{name}: not an API Gateway event: {e}"));
        let method = event["httpMethod"].as_str().unwrap_or_default().to_owned();
        let (status, body) = env.call(&event).await;
        match method.as_str() {
            "POST" => {
                assert_eq!(status, 200, "{name}: {body}");
                assert_eq!(body["status"], "COMMITTED", "{name}: {body}");
                created.push(body["transactionId"].as_str().expect("an id").to_owned());
            }
            "GET" => {
                assert_eq!(status, 200, "{name} should find the transaction the POST sample made: {body}");
                assert!(created.iter().any(|id| body["transactionId"] == id.as_str()), "{name}: {body}");
            }
            other => panic!("{name}: the API has no {other} route"),
        }
    }
    assert_eq!(env.balance("service-a", "A").await, "400");
    assert_eq!(env.balance("service-b", "B").await, "100");
}

/// Participant: the invocation event into `ParticipantRequest`, then the function's handler, in
/// protocol order (prepare, commit, abort). Each sample is signed with the local development key of
/// service-a (`twopc-local sign` made them), long enough ago to be stale: as it is, the handler refuses
/// it and changes nothing; signed again now, as `twopc-local sign` does, it is handled.
#[tokio::test]
async fn participant_samples_are_handled() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "500").await;
    let participant = &env.participants["service-a"];
    let order = |action: &str| ["prepare", "commit", "abort"].iter().position(|a| *a == action).unwrap_or(9);
    let mut files: Vec<(String, Value)> = samples("participant-")
        .into_iter()
        .map(|(name, text)| {
            let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: not JSON: {e}"));
            (name, value)
        })
        .collect();
    files.sort_by_key(|(_, v)| order(v["action"].as_str().unwrap_or_default()));
    assert!(files.len() >= 3, "a sample for prepare, commit and abort");
    let keys = twopc::auth::LocalKeys;
    for (name, value) in files {
        let request: ParticipantRequest =
            serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{name}: not a participant request: {e}"));
        let signed_at = request.signature.as_ref().unwrap_or_else(|| panic!("{name}: not signed")).signed_at;
        twopc::auth::verify(&keys, "service-a", &request, signed_at)
            .await
            .unwrap_or_else(|e| panic!("{name}: not signed with service-a's local development key: {e}"));
        // Stale as it is (unless it was signed in the last minute: a sample just made with `twopc-local sign`).
        let limit = twopc::auth::MAX_MESSAGE_AGE_MS + twopc::clock::CLOCK_MARGIN_MS;
        if env.clock_now() > signed_at + limit {
            let refused = participant::handle(participant, value).await;
            assert!(
                matches!(&refused, Err(e) if e.to_string().contains("copies are accepted for")),
                "{name}: stale as it is: {refused:?}"
            );
        }
        let fresh = serde_json::to_value(env.signed("service-a", request.clone())).unwrap();
        let response =
            participant::handle(participant, fresh).await.unwrap_or_else(|e| panic!("{name}: the handler failed: {e}"));
        let answer = serde_json::to_value(&response).unwrap();
        match request.action.as_str() {
            "prepare" => assert_eq!(answer["vote"], "PREPARED", "{name}: {answer}"),
            "commit" => assert_eq!(answer["status"], "COMMITTED", "{name}: {answer}"),
            "abort" => assert_eq!(answer["status"], "ABORTED", "{name}: {answer}"),
            other => panic!("{name}: unknown action {other}"),
        }
    }
    assert_eq!(env.balance("service-a", "A").await, "400", "prepare + commit applied the sample once");
    assert!(env.locked_items().await.is_empty(), "no lock left behind");
}

/// Sweeper: the EventBridge scheduled event parses as the runtime would; a sweep then runs.
#[tokio::test]
async fn sweeper_samples_are_scheduled_events() {
    let files = samples("sweeper-");
    assert!(!files.is_empty());
    for (name, text) in files {
        let event: EventBridgeEvent =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: not an EventBridge event: {e}"));
        assert_eq!(event.detail_type, "Scheduled Event", "{name}");
        assert_eq!(event.source, "aws.events", "{name}");
    }
    let env = TestEnv::new().await;
    let report = env.sweeper(None).sweep().await.expect("a sweep runs");
    assert!(report.is_quiet(), "{report:?}");
}

/// Stream processor: the Lambda DynamoDB event, decided by the processor's core; nothing in a
/// sample may be unprocessable, and each must produce something. A replay sample
/// (`{"action": "replay-dead-letters"}`) is read as the function reads its payload.
#[test]
fn stream_processor_samples_are_decided() {
    let tables = BTreeMap::from([
        ("service-a".to_owned(), "service-a-data".to_owned()),
        ("service-b".to_owned(), "service-b-data".to_owned()),
    ]);
    let config = FanoutConfig::new(&tables, "transactions").expect("a valid configuration");
    let files = samples("stream-processor-");
    assert!(!files.is_empty());
    let mut replays = 0;
    for (name, text) in files {
        let payload: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: not JSON: {e}"));
        let invocation = twopc_fanout::replay::Invocation::parse(payload)
            .unwrap_or_else(|e| panic!("{name}: not a stream processor invocation: {e}"));
        let event: Event = match invocation {
            twopc_fanout::replay::Invocation::Stream(event) => *event,
            twopc_fanout::replay::Invocation::Replay { max_messages } => {
                assert!(max_messages >= 1, "{name}");
                replays += 1;
                continue;
            }
        };
        let batch = twopc_fanout::prepare(&config, &event);
        assert!(batch.unprocessable.is_empty(), "{name}: {:?}", batch.unprocessable);
        assert!(batch.commits + batch.outcomes > 0, "{name}: produces nothing");
    }
    assert_eq!(replays, 1, "one sample of the replay action");
}

/// Outcomes: the Lambda DynamoDB event of the transactions table's stream; each sample announces at least
/// one outcome, and no record of it is unreadable.
#[test]
fn outcomes_samples_are_announced() {
    let config = FanoutConfig::new(&BTreeMap::new(), "transactions").expect("a valid configuration");
    let files = samples("outcomes-");
    assert!(!files.is_empty());
    for (name, text) in files {
        let event: Event = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: not a DynamoDB event: {e}"));
        let outcomes: Vec<_> = event
            .records
            .iter()
            .map(|r| twopc_fanout::outcomes::outcome_of(&config, r).unwrap_or_else(|e| panic!("{name}: {e}")))
            .collect();
        assert!(outcomes.iter().flatten().count() > 0, "{name}: announces nothing");
    }
}

/// Issue 34: the stream samples with their stream ARNs forged (another table's stream, a table ARN, no
/// ARN and the table named in `tableName`) produce nothing: every record is dropped as foreign, none is
/// fanned out, reported for retry or dead-lettered.
#[test]
fn forged_stream_events_are_dropped() {
    let tables = BTreeMap::from([("service-a".to_owned(), "service-a-data".to_owned())]);
    let config = FanoutConfig::new(&tables, "transactions").expect("a valid configuration");
    for (name, text) in samples("stream-processor-") {
        let payload: Value = serde_json::from_str(&text).unwrap();
        let Ok(twopc_fanout::replay::Invocation::Stream(event)) = twopc_fanout::replay::Invocation::parse(payload)
        else {
            continue;
        };
        assert!(twopc_fanout::prepare(&config, &event).foreign == 0, "{name}: the sample itself is served");
        let forgeries: [(Option<&str>, Option<&str>); 3] = [
            (Some("arn:aws:dynamodb:us-east-1:123456789012:table/elsewhere/stream/2024-05-01T00:00:00.000"), None),
            (Some("arn:aws:dynamodb:us-east-1:123456789012:table/service-a-data"), None),
            (None, Some("service-a-data")),
        ];
        for (arn, table) in forgeries {
            let mut forged = (*event).clone();
            for record in &mut forged.records {
                record.event_source_arn = arn.map(str::to_owned);
                record.table_name = table.map(str::to_owned);
            }
            let batch = twopc_fanout::prepare(&config, &forged);
            assert_eq!(batch.foreign, forged.records.len(), "{name} from {arn:?}");
            assert!(batch.lines.is_empty() && batch.messages.is_empty() && batch.unprocessable.is_empty(), "{name}");
        }
    }
}

/// Connections: the WebSocket proxy events, routed and served against a connections table, in the
/// order a connection lives ($connect, messages, $disconnect).
#[tokio::test]
async fn connections_samples_are_served() {
    let client = twopc_tests::dynamodb().await;
    let table = format!("connections-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    twopc::tables::connections_table(&table).create_if_missing(&client).await.expect("table");
    let store = ::connections::Connections::new(ConnectionStore::new(client, table), "a1b2c3d4e5");
    let order = |route: &str| match route {
        "$connect" => 0,
        "$disconnect" => 2,
        _ => 1,
    };
    let mut files: Vec<(String, ApiGatewayWebsocketProxyRequest)> = samples("connections-")
        .into_iter()
        .map(|(name, text)| {
            let event = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{name}: not an API Gateway WebSocket event: {e}"));
            (name, event)
        })
        .collect();
    files.sort_by_key(|(_, e)| order(e.request_context.route_key.as_deref().unwrap_or_default()));
    assert!(!files.is_empty());
    for (name, event) in files {
        ::connections::parse(&event).unwrap_or_else(|e| panic!("{name}: refused: {e}"));
        let response = ::connections::handle(&store, &event).await;
        assert_eq!(response.status_code, 200, "{name}: {:?}", response.body);
    }
}
