//! The core two-phase commit against DynamoDB Local, through the coordinator and participant handlers.

use std::time::Duration;

use serde_json::{Value, json};
use twopc::model::{Action, ParticipantRequest};
use twopc_client::{Operation, Transaction, op};
use twopc_tests::{EdgeFault, TestEnv};

fn a(id: &str) -> (&'static str, &str) {
    ("service-a", id)
}
fn b(id: &str) -> (&'static str, &str) {
    ("service-b", id)
}

async fn assert_no_locks(env: &TestEnv) {
    let locked = env.locked_items().await;
    assert!(locked.is_empty(), "locks left: {locked:#?}");
}

#[tokio::test]
async fn a_transfer_commits_and_moves_the_balances() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "500").await;
    env.put_account("service-b", "B", "100").await;

    let (status, body) = env.post(&TestEnv::transfer(a("A"), b("B"), "100"), None).await;

    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "COMMITTED");
    let id = body["transactionId"].as_str().unwrap();
    assert_eq!(body["participants"][0]["vote"], "PREPARED");
    assert_eq!(body["participants"][1]["vote"], "PREPARED");
    let item_a = env.item("service-a", "A").await.unwrap();
    let item_b = env.item("service-b", "B").await.unwrap();
    assert_eq!(item_a["data"]["balance"], json!(400));
    assert_eq!(item_b["data"]["balance"], json!(200));
    for item in [&item_a, &item_b] {
        assert_eq!(item["version"], json!(1));
        assert_eq!(item["lastTx"], id);
        assert!(item.get("lock").is_none() && item.get("lockShard").is_none(), "{item}");
    }
    let (status, record) = env.get(id).await;
    assert_eq!(status, 200);
    assert_eq!(record["status"], "COMMITTED");
    assert_eq!(record["transactionId"], id);
    assert!(record["createdAt"].as_u64().unwrap() <= record["updatedAt"].as_u64().unwrap());
}

#[tokio::test]
async fn insufficient_funds_abort_with_a_readable_reason_and_change_nothing() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "50").await;
    env.put_account("service-b", "B", "0").await;

    let (status, body) = env.post(&TestEnv::transfer(a("A"), b("B"), "100"), None).await;

    assert_eq!(status, 409, "{body}");
    assert_eq!(body["status"], "ABORTED");
    let refusing = &body["participants"][0];
    assert_eq!(refusing["service"], "service-a");
    assert_eq!(refusing["vote"], "REFUSED");
    assert_eq!(refusing["code"], "CONDITION_FAILED");
    let reason = refusing["reason"].as_str().unwrap();
    assert!(reason.contains("balance 50 + -100 = -50") && reason.contains("minimum 0"), "{reason}");
    assert_eq!(env.balance("service-a", "A").await, "50");
    assert_eq!(env.balance("service-b", "B").await, "0");
    assert_eq!(env.item("service-b", "B").await.unwrap()["version"], json!(0));
    assert_no_locks(&env).await;
    let (_, record) = env.get(body["transactionId"].as_str().unwrap()).await;
    assert_eq!(record["status"], "ABORTED");
}

#[tokio::test]
async fn missing_items_are_not_found_and_if_not_exists_refuses_an_existing_item() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "10").await;
    let cases: [(Operation, &str); 4] = [
        (op::set("ghost").field("name", "x").into(), "NOT_FOUND"),
        (op::add("ghost", "balance", 1).into(), "NOT_FOUND"),
        (op::delete("ghost").into(), "NOT_FOUND"),
        (op::put("A", json!({"balance": 0})).if_not_exists().into(), "CONDITION_FAILED"),
    ];
    for (op, code) in cases {
        let (status, body) = env.post(&Transaction::new().participant("service-a", [op]).to_json(), None).await;
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["participants"][0]["code"], code, "{body}");
    }
    assert!(env.item("service-a", "ghost").await.is_none(), "a refused prepare leaves no placeholder");
    assert_eq!(env.balance("service-a", "A").await, "10");
    assert_no_locks(&env).await;

    // put creates, set changes, delete removes: each a commit with its version.
    let on_a = |op: Operation| Transaction::new().participant("service-a", [op]).to_json();
    let body = on_a(op::put("N", json!({"name": "new", "tags": ["x"]})).if_not_exists().into());
    assert_eq!(env.post(&body, None).await.0, 200);
    let body = on_a(op::set("N").field("name", "renamed").into());
    assert_eq!(env.post(&body, None).await.0, 200);
    let item = env.item("service-a", "N").await.unwrap();
    assert_eq!(item["data"], json!({"name": "renamed", "tags": ["x"]}));
    assert_eq!(item["version"], json!(2));
    assert_eq!(env.post(&on_a(op::delete("N").into()), None).await.0, 200);
    assert!(env.item("service-a", "N").await.is_none());
}

#[tokio::test]
async fn two_concurrent_transfers_from_one_account_each_commit_or_abort_whole() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B1", "0").await;
    env.put_account("service-b", "B2", "0").await;
    let first = TestEnv::transfer(a("A"), b("B1"), "60");
    let second = TestEnv::transfer(a("A"), b("B2"), "60");

    let ((s1, r1), (s2, r2)) = futures::join!(env.post(&first, None), env.post(&second, None));

    // Only one of them can hold A's lock at a time, and nothing stops the one that holds it: exactly one
    // commits. The other meets its lock (CONFLICT, at once or after waiting for it) or, having waited,
    // finds 40 left (CONDITION_FAILED).
    let ((winner, won), (loser, lost)) = match (s1, s2) {
        (200, 409) => ((&first, &r1), (&second, &r2)),
        (409, 200) => ((&second, &r2), (&first, &r1)),
        _ => panic!("exactly one transfer commits and the other is refused: {s1} {r1} / {s2} {r2}"),
    };
    assert_eq!(won["status"], "COMMITTED", "{won}");
    assert_eq!(lost["status"], "ABORTED", "{lost}");
    let refusal = &lost["participants"][0];
    assert_eq!(refusal["vote"], "REFUSED", "{lost}");
    assert!(refusal["code"] == "CONFLICT" || refusal["code"] == "CONDITION_FAILED", "{lost}");
    let credited = |transfer: &Value| transfer["participants"][1]["operations"][0]["key"]["entityId"].clone();
    let (to_winner, to_loser) = (credited(winner), credited(loser));
    assert_eq!(env.balance("service-b", to_winner.as_str().unwrap()).await, "60");
    assert_eq!(env.balance("service-b", to_loser.as_str().unwrap()).await, "0");
    assert_eq!(env.balance("service-a", "A").await, "40");
    assert_no_locks(&env).await;
}

#[tokio::test]
async fn twenty_concurrent_transfers_among_five_accounts_conserve_the_total() {
    let env = TestEnv::new().await;
    // Accounts on both services, so some transfers are one participant with two items.
    let accounts = [a("0"), b("1"), a("2"), b("3"), a("4")];
    for (service, id) in accounts {
        env.put_account(service, id, "100").await;
    }
    let transfers: Vec<Value> = (0..20)
        .map(|i| {
            let from = accounts[i % 5];
            let to = accounts[(i * 3 + 1) % 5];
            let to = if to == from { accounts[(i + 1) % 5] } else { to };
            let amount = 10 + (i * 7) % 50;
            let debit = op::add(from.1, "balance", -(amount as i64)).min(0);
            let credit = op::add(to.1, "balance", amount);
            if from.0 == to.0 {
                Transaction::new().participant(from.0, [debit, credit]).to_json()
            } else {
                Transaction::new().participant(from.0, [debit]).participant(to.0, [credit]).to_json()
            }
        })
        .collect();

    // Clients retry a refusal for a conflict (another transfer holds a lock), as a real client would.
    let env = &env;
    let results = futures::future::join_all(transfers.iter().enumerate().map(|(i, t)| async move {
        for attempt in 0..30u64 {
            let (status, body) = env.post(t, None).await;
            let conflict =
                status == 409 && body["participants"].as_array().unwrap().iter().any(|p| p["code"] == "CONFLICT");
            if !conflict {
                return (status, body);
            }
            tokio::time::sleep(std::time::Duration::from_millis(5 + (i as u64 * 7 + attempt * 13) % 40)).await;
        }
        panic!("transfer {i} kept conflicting");
    }))
    .await;

    let mut total = 0i64;
    for (service, id) in accounts {
        let balance: i64 = env.balance(service, id).await.parse().unwrap();
        assert!(balance >= 0);
        total += balance;
    }
    assert_eq!(total, 500);
    assert!(results.iter().all(|(s, _)| *s == 200 || *s == 409), "{results:?}");
    assert!(results.iter().any(|(s, _)| *s == 200), "some commit");
    assert_no_locks(env).await;
    for record in env.records().await {
        assert!(record["status"] == "COMMITTED" || record["status"] == "ABORTED", "{record}");
        assert!(record.get("openShard").is_none(), "a terminal record leaves the open index: {record}");
    }
}

/// A participant message, built from JSON (as the participant reads it): fields added to the message
/// later never break these tests.
fn message(value: Value) -> ParticipantRequest {
    serde_json::from_value(value).expect("a participant message")
}

/// The lock token a PREPARED vote reports, when the participant reports one.
fn lock_token(vote: &twopc::model::ParticipantResponse) -> Option<Value> {
    serde_json::to_value(vote).unwrap().get("lockToken").cloned()
}

#[tokio::test]
async fn duplicate_deliveries_of_prepare_commit_and_abort_change_nothing() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    let participant = &env.participants["service-a"];
    let started = env.clock_now();
    let deadline = started + 10_000;
    let message_of = |action: &str, tx: &str, delta: i64, token: &Option<Value>| {
        let mut m = json!({"action": action, "transactionId": tx, "deadline": deadline, "startedAt": started,
            "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": delta, "min": 0}]});
        if let Some(token) = token {
            m["lockToken"] = token.clone();
        }
        env.signed("service-a", message(m))
    };
    // The token the vote reports (once participants report one) goes with every commit of tx-dup.
    let mut token = None;
    for _ in 0..2 {
        let vote = participant.handle(&message_of("prepare", "tx-dup", -30, &None)).await.unwrap();
        assert_eq!(vote.vote, Some(twopc::model::Vote::Prepared));
        token = token.or(lock_token(&vote));
    }
    let message = |action: Action, tx: &str| message_of(action.as_str(), tx, -30, &token);
    for _ in 0..2 {
        let answer = participant.handle(&message(Action::Commit, "tx-dup")).await.unwrap();
        assert_eq!(answer.status.as_deref(), Some("COMMITTED"));
    }
    let item = env.item("service-a", "A").await.unwrap();
    assert_eq!(item["data"]["balance"], json!(70));
    assert_eq!(item["version"], json!(1));
    // A prepare delivered again after the commit must not lock the item a second time.
    let late = participant.handle(&message(Action::Prepare, "tx-dup")).await.unwrap();
    assert_eq!(late.vote, Some(twopc::model::Vote::Refused));
    assert_no_locks(&env).await;
    // And should such a stray lock exist anyway, a commit delivered again does not apply twice.
    env.client
        .update_item()
        .table_name(env.table("service-a"))
        .key("entityId", aws_sdk_dynamodb::types::AttributeValue::S("A".into()))
        .update_expression("SET #l = :l")
        .expression_attribute_names("#l", "lock")
        .expression_attribute_values(
            ":l",
            twopc::attr::to_attribute(&json!({"transactionId": "tx-dup", "status": "PREPARED", "expiresAt": 1})),
        )
        .send()
        .await
        .unwrap();
    let again = participant.handle(&message(Action::Commit, "tx-dup")).await.unwrap();
    assert_eq!(again.status.as_deref(), Some("COMMITTED"), "lastTx proves the earlier commit");
    assert_eq!(env.item("service-a", "A").await.unwrap()["data"]["balance"], json!(70));
    participant.handle(&message(Action::Abort, "tx-dup")).await.unwrap();
    assert_no_locks(&env).await;

    // Another transaction commits A since: lastTx no longer names tx-dup, so it no longer turns away a late
    // prepare of tx-dup. Whatever that late prepare answers, tx-dup's commit delivered again (as the
    // sweeper re-drives a transaction left COMMITTING) must not apply its debit a second time.
    let other = participant.handle(&message_of("prepare", "tx-other", -5, &None)).await.unwrap();
    assert_eq!(other.vote, Some(twopc::model::Vote::Prepared));
    let answer = participant.handle(&message_of("commit", "tx-other", -5, &lock_token(&other))).await.unwrap();
    assert_eq!(answer.status.as_deref(), Some("COMMITTED"));
    participant.handle(&message(Action::Prepare, "tx-dup")).await.unwrap();
    let again = participant.handle(&message(Action::Commit, "tx-dup")).await.unwrap();
    assert!(matches!(again.status.as_deref(), Some("COMMITTED" | "NOT_PREPARED")), "{again:?}");
    let item = env.item("service-a", "A").await.unwrap();
    assert_eq!(
        (&item["data"]["balance"], &item["version"], &item["lastTx"]),
        (&json!(65), &json!(2), &json!("tx-other")),
        "tx-dup's debit applied once, and tx-other's commit is the last: {item}"
    );
    participant.handle(&message(Action::Abort, "tx-dup")).await.unwrap();
    assert_no_locks(&env).await;

    for _ in 0..2 {
        assert_eq!(
            participant.handle(&message(Action::Prepare, "tx-ab")).await.unwrap().vote,
            Some(twopc::model::Vote::Prepared)
        );
    }
    for _ in 0..2 {
        let answer = participant.handle(&message(Action::Abort, "tx-ab")).await.unwrap();
        assert_eq!(answer.status.as_deref(), Some("ABORTED"));
    }
    // Abort of a transaction that never prepared here succeeds and changes nothing.
    let answer = participant.handle(&message(Action::Abort, "tx-never")).await.unwrap();
    assert_eq!(answer.status.as_deref(), Some("ABORTED"));
    let item = env.item("service-a", "A").await.unwrap();
    assert_eq!(item["data"]["balance"], json!(65));
    assert_eq!(item["version"], json!(2));
    assert_no_locks(&env).await;

    // Through the coordinator: every message delivered twice.
    env.put_account("service-b", "B", "0").await;
    for action in [Action::Prepare, Action::Commit] {
        env.invoker.set("service-a", action, EdgeFault::Duplicate);
        env.invoker.set("service-b", action, EdgeFault::Duplicate);
    }
    let (status, body) = env.post(&TestEnv::transfer(a("A"), b("B"), "20"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(env.balance("service-a", "A").await, "45");
    assert_eq!(env.balance("service-b", "B").await, "20");
    assert_no_locks(&env).await;
}

#[tokio::test]
async fn the_same_idempotency_key_runs_once_and_another_body_is_refused() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    let transfer = TestEnv::transfer(a("A"), b("B"), "10");

    let first = env.post(&transfer, Some("order-42")).await;
    let again = env.post(&transfer, Some("order-42")).await;
    // The same request, written differently, is the same request.
    let reordered: Value = serde_json::from_str(&serde_json::to_string_pretty(&transfer).unwrap()).unwrap();
    let third = env.post(&reordered, Some("order-42")).await;

    assert_eq!(first.0, 200, "{}", first.1);
    assert_eq!(first, again);
    assert_eq!(first, third);
    assert_eq!(env.balance("service-a", "A").await, "90");
    assert_eq!(env.records().await.len(), 1);

    let other = TestEnv::transfer(a("A"), b("B"), "11");
    let (status, body) = env.post(&other, Some("order-42")).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("different request body"));
    assert_eq!(env.balance("service-a", "A").await, "90");

    // Concurrent retries of one keyed request also run it once.
    let transfer = TestEnv::transfer(a("A"), b("B"), "5");
    let answers = futures::future::join_all((0..4).map(|_| env.post(&transfer, Some("order-43")))).await;
    assert!(answers.iter().all(|a| a.0 == 200 && a.1["transactionId"] == answers[0].1["transactionId"]), "{answers:?}");
    assert_eq!(env.balance("service-a", "A").await, "85");
}

#[tokio::test]
async fn bad_input_is_a_400_that_names_the_problem_and_writes_nothing() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    let op = |extra: Value| {
        let mut o = json!({"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": 1});
        o.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        o
    };
    let one = |ops: Value| json!({"participants": [{"service": "service-a", "operations": ops}]}).to_string();
    let cases: Vec<(String, &str)> = vec![
        ("{\"participants\": [".to_owned(), "not valid JSON"),
        (json!({"participants": []}).to_string(), "at least one participant"),
        (json!({}).to_string(), "participants: missing"),
        (one(json!([])), "at least one operation"),
        (
            json!({"participants": [{"service": "billing", "operations": [op(json!({}))]}]}).to_string(),
            "unknown service \"billing\"",
        ),
        (one(json!([{"op": "transfer", "key": {"entityId": "A"}}])), "unknown operation \"transfer\""),
        (one(json!([op(json!({})), op(json!({"delta": 2}))])), "appears twice"),
        (one(json!([op(json!({"delta": "lots"}))])), "operations[0].delta"),
        (format!("{{\"participants\": [], \"padding\": \"{}\"}}", "x".repeat(256 * 1024)), "256 KiB"),
    ];
    for (body, expected) in cases {
        let (status, answer) = env.post_raw(&body, None).await;
        assert_eq!(status, 400, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "expected {expected:?} in {message:?}");
        assert!(answer["error"]["code"].is_string());
    }
    assert!(env.records().await.is_empty(), "no record written");
    assert_no_locks(&env).await;
    assert_eq!(env.item("service-a", "A").await.unwrap()["version"], json!(0));
}

#[tokio::test]
async fn a_failing_or_silent_participant_aborts_and_the_others_are_released() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;

    env.invoker.set("service-b", Action::Prepare, EdgeFault::Fail);
    let (status, body) = env.post(&TestEnv::transfer(a("A"), b("B"), "10"), None).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["status"], "ABORTED");
    assert_eq!(body["participants"][1]["code"], "UNAVAILABLE");
    assert_no_locks(&env).await;

    // Prepares, then stays silent past the deadline.
    env.invoker.set("service-b", Action::Prepare, EdgeFault::Delay(Duration::from_secs(5)));
    let mut transfer = TestEnv::transfer(a("A"), b("B"), "10");
    transfer["timeoutMs"] = json!(300);
    let started = std::time::Instant::now();
    let (status, body) = env.post(&transfer, None).await;
    assert!(started.elapsed() < Duration::from_secs(4), "the coordinator waits only until the deadline");
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["participants"][1]["code"], "TIMEOUT");
    assert_eq!(env.balance("service-a", "A").await, "100");
    assert_eq!(env.balance("service-b", "B").await, "0");
    assert_no_locks(&env).await;
}

#[tokio::test]
async fn eight_participants_commit_and_their_prepares_overlap() {
    let services: Vec<String> = (1..=8).map(|i| format!("service-{i}")).collect();
    let names: Vec<&str> = services.iter().map(String::as_str).collect();
    let env = TestEnv::with_services(&names).await;
    for service in &names {
        env.put_account(service, "X", "10").await;
        // Each prepare takes at least 100 ms: one after another they could not overlap.
        env.invoker.set(service, Action::Prepare, EdgeFault::Delay(Duration::from_millis(100)));
    }
    let transaction = names.iter().fold(Transaction::new(), |t, s| t.participant(*s, [op::add("X", "balance", 1)]));

    let (status, body) = env.post(&transaction.to_json(), None).await;

    assert_eq!(status, 200, "{body}");
    let prepares: Vec<_> = env.invoker.calls().into_iter().filter(|c| c.action == Action::Prepare).collect();
    assert_eq!(prepares.len(), 8);
    let last_start = prepares.iter().map(|c| c.started).max().unwrap();
    let first_end = prepares.iter().map(|c| c.ended).min().unwrap();
    println!(
        "8 prepares: the last started {:?} before the first ended",
        first_end.saturating_duration_since(last_start)
    );
    assert!(last_start < first_end, "every prepare was in flight at once");
    for service in &names {
        assert_eq!(env.balance(service, "X").await, "11");
    }
}

#[tokio::test]
async fn decimals_are_exact_end_to_end() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "1").await;
    env.put_account("service-b", "B", "0").await;
    for _ in 0..10 {
        let (status, body) = env.post(&TestEnv::transfer(a("A"), b("B"), "0.1"), None).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(env.balance("service-a", "A").await, "0");
    assert_eq!(env.balance("service-b", "B").await, "1");
    let (status, body) = env.post(&TestEnv::transfer(a("A"), b("B"), "0.1"), None).await;
    assert_eq!(status, 409, "the guard is exact: {body}");

    let big = "12345678901234567890123456789012345678";
    env.put_account("service-a", "R", big).await;
    let (status, body) =
        env.post(&TestEnv::transfer(a("R"), b("B"), "0.000000000000000000000000000000000001"), None).await;
    assert_eq!(status, 409, "a result of more than 38 digits is refused at prepare: {body}");
    let reason = body["participants"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("DynamoDB numbers hold at most 38"), "{reason}");
    assert_no_locks(&env).await;
    let (status, body) =
        env.post(&TestEnv::transfer(a("R"), b("B"), "12345678901234567890123456789012345677"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(env.balance("service-a", "R").await, "1");
    assert_eq!(env.balance("service-b", "B").await, "12345678901234567890123456789012345678");
}

#[tokio::test]
async fn a_sole_participant_commits_in_one_phase_and_a_lost_reply_still_gets_the_true_answer() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-a", "B", "0").await;
    let transfer = Transaction::new()
        .participant("service-a", [op::add("A", "balance", -10).min(0), op::add("B", "balance", 10)])
        .to_json();

    let (status, body) = env.post(&transfer, None).await;
    assert_eq!(status, 200, "{body}");
    let commits = env.invoker.calls().iter().filter(|c| c.action == Action::Commit).count();
    let prepares = env.invoker.calls().iter().filter(|c| c.action == Action::Prepare).count();
    assert_eq!((prepares, commits), (0, 1), "one message, no prepare");

    // The participant commits and its answer is lost: the record it wrote says what happened.
    env.invoker.set("service-a", Action::Commit, EdgeFault::LoseReply);
    let (status, body) = env.post(&transfer, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "COMMITTED");
    assert_eq!(env.balance("service-a", "A").await, "80");
    assert_eq!(env.balance("service-a", "B").await, "20");

    // It fails before doing anything: the coordinator's ABORTED record is the outcome.
    env.invoker.set("service-a", Action::Commit, EdgeFault::Fail);
    let (status, body) = env.post(&transfer, None).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(env.balance("service-a", "A").await, "80");
    let id = body["transactionId"].as_str().unwrap();
    assert_eq!(env.get(id).await.1["status"], "ABORTED");
    assert_no_locks(&env).await;
}

#[tokio::test]
async fn every_operation_form_prepares_and_commits_in_both_phases() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "10").await;
    env.put_account("service-b", "B", "10").await;
    // Each form alone on service-a (one phase, or two for delete) and beside a write on service-b (two phases).
    let forms: [Operation; 10] = [
        op::put("P", json!({"n": 1})).into(),
        op::put("P", json!({"n": 2})).into(),
        op::put("Q", json!({"n": 1})).if_not_exists().into(),
        op::set("P").field("n", 3).field("m", "x").into(),
        op::add("A", "balance", 1).into(),
        op::add("A", "balance", -1).min(0).max(100).into(),
        op::check("A").into(),
        op::check("A").exists(true).into(),
        op::check("missing").exists(false).into(),
        op::delete("Q").into(),
    ];
    for (i, form) in forms.into_iter().enumerate() {
        let alone = Transaction::new().participant("service-a", [form.clone()]);
        let (status, body) = env.post(&alone.to_json(), None).await;
        assert_eq!(status, 200, "form {i} alone: {body}");
        if matches!(&form, Operation::Delete(_) | Operation::Put(op::Put { if_not_exists: Some(true), .. })) {
            continue;
        }
        let beside = alone.participant("service-b", [op::add("B", "balance", 1)]).to_json();
        let (status, body) = env.post(&beside, None).await;
        assert_eq!(status, 200, "form {i} beside another participant: {body}");
    }
    assert_eq!(env.item("service-a", "P").await.unwrap()["data"], json!({"n": 3, "m": "x"}));
    assert!(env.item("service-a", "Q").await.is_none());
    assert!(env.item("service-a", "missing").await.is_none(), "checking an absence leaves nothing behind");
    assert_eq!(env.balance("service-a", "A").await, "10");
    assert_no_locks(&env).await;
}

#[tokio::test]
async fn an_older_transaction_waits_for_a_younger_lock_and_a_younger_one_refuses_at_once() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    let participant = env.participants["service-a"].clone();
    let operations = json!([{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": -1}]);
    let hold = |tx: &str, deadline: u64, started_at: u64| {
        env.signed(
            "service-a",
            message(json!({"action": "prepare", "transactionId": tx, "deadline": deadline, "startedAt": started_at,
                "operations": operations})),
        )
    };
    let release = |tx: &str| {
        env.signed("service-a", message(json!({"action": "abort", "transactionId": tx, "operations": operations})))
    };
    // Participants whose wait window (5 s) is far longer than the younger holder needs, so that a loaded
    // machine cannot make the wait lapse; a refusal that does not wait is then told by its time.
    let patient = env.participants.values().map(|p| p.clone().with_max_lock_wait(Duration::from_secs(5)));
    let invoker = twopc_tests::FaultyInvoker::new(twopc::invoke::InProcessInvoker::new(patient));
    let coordinator = env.coordinator_with(&invoker, twopc::faults::Faults::default());
    let patient_post = |body: Value| {
        let coordinator = coordinator.clone();
        async move {
            let event = twopc_tests::rest_event(
                "POST",
                "/transactions",
                "/transactions",
                None,
                json!({}),
                Some(&body.to_string()),
            );
            twopc_tests::call_coordinator(&coordinator, &event).await
        }
    };

    // A younger holder (a later deadline, and started after the transfer that starts next) that finishes
    // soon: the transfer waits for it and commits.
    let now = env.clock_now();
    let young = hold("tx-young", now + 20_000, now + 20_000);
    assert_eq!(participant.handle(&young).await.unwrap().vote, Some(twopc::model::Vote::Prepared));
    let releaser = {
        let (participant, abort) = (participant.clone(), release("tx-young"));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(40)).await;
            participant.handle(&abort).await.unwrap();
        })
    };
    let (status, body) = patient_post(TestEnv::transfer(a("A"), b("B"), "10")).await;
    releaser.await.unwrap();
    assert_eq!(status, 200, "the older transfer waited for the younger lock: {body}");

    // An older holder (an earlier deadline, started before the transfer): the transfer's prepare refuses
    // at once rather than wait; its coordinator retries (issue 35) once the holder is decided.
    let now = env.clock_now();
    let old = hold("tx-old", now + 2_000, now.saturating_sub(1_000));
    assert_eq!(participant.handle(&old).await.unwrap().vote, Some(twopc::model::Vote::Prepared));
    let client = tokio::spawn(patient_post(TestEnv::transfer(a("A"), b("B"), "10")));
    let refusal = loop {
        if let Some(call) = invoker.calls().into_iter().find(|c| c.answer == "REFUSED:CONFLICT") {
            break call;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(refusal.ended - refusal.started < Duration::from_millis(1_000), "it did not wait: {refusal:?}");
    env.transactions.abort_if_absent("tx-old", env.clock_now(), "aborted by the test").await.unwrap();
    participant.handle(&release("tx-old")).await.unwrap();
    let (status, body) = client.await.unwrap();
    assert_eq!((status, body["attempts"].as_u64()), (200, Some(2)), "{body}");
    assert_eq!(env.balance("service-a", "A").await, "80");
    assert_no_locks(&env).await;
}

#[tokio::test]
async fn a_sole_participant_with_the_most_operations_allowed_commits() {
    let env = TestEnv::new().await;
    // 100 operations fill a TransactWriteItems: no room for the record, so this one takes two phases.
    let body = Transaction::new()
        .participant("service-a", (0..100).map(|i| op::put(format!("bulk-{i}"), json!({"n": i}))))
        .to_json();

    let (status, answer) = env.post(&body, None).await;

    assert_eq!(status, 200, "{answer}");
    assert_eq!(env.item("service-a", "bulk-99").await.unwrap()["data"], json!({"n": 99}));
    assert_no_locks(&env).await;
}
