//! The phase engine on its own: which participants a prepare asks, in what order, and what it records of
//! their answers, against a scripted participant invoker (no store is touched by a prepare that meets no
//! expired lock).

use super::*;

#[test]
fn all_at_once_asks_everyone_in_the_requests_order() {
    let order = PrepareOrder::all_at_once(3);
    assert_eq!(order.order, vec![0, 1, 2]);
    assert!(!order.one_at_a_time);
}

#[test]
fn one_at_a_time_starts_where_it_was_told() {
    assert_eq!(PrepareOrder::one_at_a_time(3, Some(2)).order, vec![2, 0, 1]);
    assert_eq!(PrepareOrder::one_at_a_time(3, None).order, vec![0, 1, 2]);
    // A place past the participants (a record that changed) is ignored, not a panic.
    assert_eq!(PrepareOrder::one_at_a_time(2, Some(5)).order, vec![0, 1]);
}

/// A participant per service that answers a prepare as scripted, a commit or an abort as acknowledged,
/// and records every message it was sent.
struct Scripted {
    prepare: std::collections::BTreeMap<&'static str, ParticipantResponse>,
    sent: std::sync::Mutex<Vec<(String, Action, bool)>>,
}

impl crate::invoke::ParticipantInvoker for Scripted {
    fn invoke<'a>(
        &'a self,
        service: &'a str,
        request: &'a crate::model::ParticipantRequest,
    ) -> futures::future::BoxFuture<'a, Result<ParticipantResponse, crate::invoke::InvokeError>> {
        self.sent.lock().unwrap().push((service.to_owned(), request.action, request.holds_no_locks));
        let answer = match request.action {
            Action::Prepare => self.prepare[service].clone(),
            Action::Commit => ParticipantResponse { status: Some("COMMITTED".into()), ..Default::default() },
            _ => ParticipantResponse { status: Some("ABORTED".into()), ..Default::default() },
        };
        Box::pin(async move { Ok(answer) })
    }
}

fn yes() -> ParticipantResponse {
    ParticipantResponse { vote: Some(Vote::Prepared), ..Default::default() }
}

fn no(code: crate::model::RefusalCode) -> ParticipantResponse {
    ParticipantResponse { vote: Some(Vote::Refused), code: Some(code), reason: Some("no".into()), ..Default::default() }
}

/// An engine over `invoker` whose store is never reached (no test here writes a record).
fn engine(invoker: std::sync::Arc<Scripted>) -> PhaseEngine {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .endpoint_url("http://127.0.0.1:9")
        .build();
    let store = crate::record::TransactionStore::new(aws_sdk_dynamodb::Client::from_conf(config), "unreached");
    PhaseEngine {
        transactions: store,
        invoker,
        keys: Arc::new(crate::auth::LocalKeys),
        signature: SignatureVersion::V1,
        clock: crate::clock::system(),
        faults: Faults::default(),
    }
}

fn transaction(services: &[&str]) -> TransactionRecord {
    let participants = services
        .iter()
        .map(|s| {
            let key = serde_json::json!({"op": "delete", "key": {"entityId": format!("{s}-item")}});
            format!(r#"{{"service": "{s}", "operations": [{key}]}}"#)
        })
        .collect::<Vec<_>>()
        .join(",");
    let body = format!(r#"{{"participants": [{participants}], "timeoutMs": 5000}}"#);
    let request = crate::coordinator::parse_request(body.as_bytes(), |_| true).unwrap();
    TransactionRecord::preparing("tx-engine".into(), &request, None, crate::clock::system().now_ms())
}

fn scripted(answers: &[(&'static str, ParticipantResponse)]) -> std::sync::Arc<Scripted> {
    std::sync::Arc::new(Scripted { prepare: answers.iter().cloned().collect(), sent: Default::default() })
}

#[tokio::test]
async fn everyone_at_once_is_asked_and_every_vote_recorded() {
    let invoker = scripted(&[("a", yes()), ("b", no(crate::model::RefusalCode::NotFound)), ("c", yes())]);
    let engine = engine(invoker.clone());
    let record = transaction(&["a", "b", "c"]);
    let votes = engine.prepare(&record, &PrepareOrder::all_at_once(3)).await.unwrap();
    let ballots: Vec<_> = votes.iter().map(crate::coordinator::ballot::Ballot::of).collect();
    use crate::coordinator::ballot::Ballot;
    assert_eq!(ballots, [Ballot::Yes, Ballot::No(Some(crate::model::RefusalCode::NotFound)), Ballot::Yes]);
    // Several participants at once: each may hold locks elsewhere, so none is told it holds none.
    let sent = invoker.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 3);
    assert!(sent.iter().all(|(_, action, holds_no_locks)| *action == Action::Prepare && !holds_no_locks));
}

#[tokio::test]
async fn one_at_a_time_stops_at_the_first_refusal_and_only_the_first_holds_nothing() {
    let invoker = scripted(&[("a", yes()), ("b", yes()), ("c", no(crate::model::RefusalCode::Conflict))]);
    let engine = engine(invoker.clone());
    let record = transaction(&["a", "b", "c"]);
    let votes = engine.prepare(&record, &PrepareOrder::one_at_a_time(3, Some(2))).await.unwrap();
    let sent = invoker.sent.lock().unwrap().clone();
    assert_eq!(sent, vec![("c".to_owned(), Action::Prepare, true)]);
    assert_eq!(votes.iter().filter(|v| v.vote.is_some()).count(), 1, "a and b are not asked: {votes:?}");
}

#[tokio::test]
async fn the_second_phase_goes_to_everyone_that_may_hold_a_lock() {
    let invoker = scripted(&[("a", yes()), ("b", yes())]);
    let engine = engine(invoker.clone());
    let mut record = transaction(&["a", "b"]);
    record.participants[1].read_only = true;
    let unacknowledged = engine.abort_participants(&record).await.unwrap();
    assert!(unacknowledged.is_empty());
    assert_eq!(invoker.sent.lock().unwrap().clone(), vec![("a".to_owned(), Action::Abort, false)]);
}
