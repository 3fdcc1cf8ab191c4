//! The operators' API (`/admin`), through the coordinator function's handler against DynamoDB Local: who
//! may call it, the views (which only read) and the actions (retry, abort), each audited on the record.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use twopc::access::Policy;
use twopc::coordinator::{Coordinator, caller_idempotent_id};
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::{Action, Status};
use twopc_client::{Transaction, op};
use twopc_fanout::outcomes::EventBridgeBus;
use twopc_tests::contention::{a_held_by_an_older_transaction, abort_holder, assert_no_locks, refused_once};
use twopc_tests::{DynamoFault, DynamoFaults, EdgeFault, FaultyInvoker, Rule, TestEnv, call_coordinator, rest_event};

/// The operator the policy names (a role), and an IAM admin that is not one.
const OPERATOR: &str = "arn:aws:iam::123456789012:role/ops";
const IAM_ADMIN: &str = "arn:aws:iam::123456789012:role/orders";

fn policy() -> Policy {
    Policy::parse(Some(r#"{"operators": ["ops"]}"#)).unwrap()
}

/// A coordinator of this world calling `invoker`, with the operators' policy and the world's tables.
fn coordinator(env: &TestEnv, invoker: &FaultyInvoker, faults: Faults) -> Coordinator {
    let tables: BTreeMap<_, _> = env.participants.iter().map(|(s, p)| (s.clone(), p.table().clone())).collect();
    env.coordinator_with(invoker, faults).with_access(policy()).with_data_tables(tables)
}

fn transfer(from: &str, to: &str, amount: i64) -> Value {
    Transaction::new()
        .participant("service-a", [op::add(from, "balance", -amount).min(0)])
        .participant("service-b", [op::add(to, "balance", amount)])
        .to_json()
}

/// An admin route's event from the IAM principal `arn` (API Gateway's path parameter and query as it
/// passes them).
fn admin_event(method: &str, path: &str, query: Option<Value>, arn: &str) -> Value {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (resource, parameters) = match segments.as_slice() {
        ["admin", "transactions", id] => ("/admin/transactions/{id}".to_owned(), Some(json!({"id": id}))),
        ["admin", "transactions", id, action] => {
            (format!("/admin/transactions/{{id}}/{action}"), Some(json!({"id": id})))
        }
        _ => (path.to_owned(), None),
    };
    let mut event = rest_event(method, path, &resource, parameters, json!({}), None);
    event["requestContext"]["identity"]["userArn"] = json!(arn);
    if let Some(query) = query {
        event["queryStringParameters"] = query.clone();
        event["multiValueQueryStringParameters"] = json!(
            query.as_object().unwrap().iter().map(|(k, v)| (k.clone(), json!([v]))).collect::<serde_json::Map<_, _>>()
        );
    }
    event
}

async fn admin(c: &Coordinator, method: &str, path: &str, query: Option<Value>) -> (u16, Value) {
    call_coordinator(c, &admin_event(method, path, query, OPERATOR)).await
}

/// POSTs `body` from the operator's own coordinator's world as an IAM caller (the transaction's creator).
async fn post(c: &Coordinator, body: &Value, key: Option<&str>) -> (u16, Value) {
    let headers = key.map_or(json!({}), |key| json!({"Idempotency-Key": key}));
    let mut event = rest_event("POST", "/transactions", "/transactions", None, headers, Some(&body.to_string()));
    event["requestContext"]["identity"]["userArn"] = json!(IAM_ADMIN);
    call_coordinator(c, &event).await
}

/// Accounts `from` (100) and `to` (0), then a transfer of `amount` between them held for `hold_ms`: its
/// id, PREPARED.
async fn held_transfer(env: &TestEnv, c: &Coordinator, from: &str, to: &str, amount: i64, hold_ms: u64) -> String {
    env.put_account("service-a", from, "100").await;
    env.put_account("service-b", to, "0").await;
    let mut held = transfer(from, to, amount);
    held["holdMs"] = json!(hold_ms);
    let (status, answer) = post(c, &held, None).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("PREPARED")), "{answer}");
    answer["transactionId"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_committing_transaction_whose_participant_was_down_is_finished_by_an_operators_retry() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    let invoker = env.fresh_invoker();
    invoker.set("service-b", Action::Commit, EdgeFault::Fail);
    let c = coordinator(&env, &invoker, Faults::default()).with_answer_budget(Duration::from_millis(1_500));
    let (status, answer) = post(&c, &transfer("A", "B", 30), None).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("COMMITTING")), "{answer}");
    let id = answer["transactionId"].as_str().unwrap().to_owned();

    // Still down: the retry drives it, answers it COMMITTING, and says so in the audit.
    let (status, shown) = admin(&c, "POST", &format!("/admin/transactions/{id}/retry"), None).await;
    assert_eq!((status, shown["status"].as_str()), (200, Some("COMMITTING")), "{shown}");
    invoker.clear();
    let (status, shown) = admin(&c, "POST", &format!("/admin/transactions/{id}/retry"), None).await;
    assert_eq!((status, shown["status"].as_str()), (200, Some("COMMITTED")), "{shown}");
    assert_eq!(env.balance("service-b", "B").await, "30");
    assert!(env.locked_items().await.is_empty());
    let audit = env.transactions.get(&id).await.unwrap().unwrap().audit;
    let seen: Vec<(&str, &str, &str)> =
        audit.iter().map(|e| (e.by.as_str(), e.action.as_str(), e.result.as_str())).collect();
    assert_eq!(seen, [(OPERATOR, "retry", "COMMITTING"), (OPERATOR, "retry", "COMMITTED")]);
    assert_eq!(shown["audit"].as_array().unwrap().len(), 2, "the answer shows the audit: {shown}");
    // Ended: repeated, it changes nothing but the audit.
    let (status, again) = admin(&c, "POST", &format!("/admin/transactions/{id}/retry"), None).await;
    assert_eq!((status, again["status"].as_str()), (200, Some("COMMITTED")));
}

#[tokio::test]
async fn an_undecided_transaction_is_not_retried_and_a_committed_one_is_not_aborted() {
    let env = TestEnv::new().await;
    let c = coordinator(&env, &env.fresh_invoker(), Faults::default());
    let id = held_transfer(&env, &c, "A", "B", 10, 60_000).await;
    let (status, refused) = admin(&c, "POST", &format!("/admin/transactions/{id}/retry"), None).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (409, Some("NOT_DECIDED")), "{refused}");
    assert_eq!(env.transactions.get(&id).await.unwrap().unwrap().status, Status::Prepared);

    env.put_account("service-a", "C", "100").await;
    env.put_account("service-b", "D", "0").await;
    let (status, committed) = post(&c, &transfer("C", "D", 5), None).await;
    assert_eq!(status, 200, "{committed}");
    let done = committed["transactionId"].as_str().unwrap().to_owned();
    let (status, answer) = admin(&c, "POST", &format!("/admin/transactions/{done}/abort"), None).await;
    assert_eq!((status, answer["status"].as_str()), (409, Some("COMMITTED")), "{answer}");
    let (status, _) = admin(&c, "POST", "/admin/transactions/tx-none/abort", None).await;
    assert_eq!(status, 404);
}

/// A held transaction aborted by an operator: its locks released, its caller's commit refused after it,
/// the action idempotent.
#[tokio::test]
async fn an_operator_aborts_a_held_transaction_once_and_its_caller_can_no_longer_commit_it() {
    let env = TestEnv::new().await;
    let c = coordinator(&env, &env.fresh_invoker(), Faults::default());
    let id = held_transfer(&env, &c, "A", "B", 10, 60_000).await;

    let (status, shown) = admin(&c, "GET", &format!("/admin/transactions/{id}"), None).await;
    assert_eq!((status, shown["status"].as_str()), (200, Some("PREPARED")), "{shown}");
    let held_by_it: Vec<&Value> = shown["locks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["items"].as_array().unwrap())
        .filter(|item| item["lockedByIt"] == true)
        .collect();
    assert_eq!(held_by_it.len(), 2, "the show lists the locks the record's keys hold: {shown}");
    assert_eq!(shown["chain"], json!([id]));

    for _ in 0..2 {
        let (status, aborted) = admin(&c, "POST", &format!("/admin/transactions/{id}/abort"), None).await;
        assert_eq!((status, aborted["status"].as_str()), (200, Some("ABORTED")), "{aborted}");
        assert_eq!(aborted["reason"], twopc::coordinator::OPERATOR_ABORT_REASON);
    }
    assert!(env.locked_items().await.is_empty());
    let mut commit = rest_event(
        "POST",
        &format!("/transactions/{id}/commit"),
        "/transactions/{id}/commit",
        Some(json!({"id": id})),
        json!({}),
        None,
    );
    commit["requestContext"]["identity"]["userArn"] = json!(IAM_ADMIN);
    let (status, answer) = call_coordinator(&c, &commit).await;
    assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{answer}");
    let record = env.transactions.get(&id).await.unwrap().unwrap();
    assert_eq!(record.audit.iter().map(|e| e.action.as_str()).collect::<Vec<_>>(), ["abort", "abort"]);
    assert!(record.retried_as.is_none() && !record.refused_for_contention, "no attempt follows an operator's abort");
    assert_eq!(env.balance("service-a", "A").await, "100");
    // Its outcome is announced once, with the operator's reason: the audit entries written after the abort
    // change no status, so they announce nothing.
    let check = twopc_tests::outcomes::check_outcome_events(&env, 47).await.unwrap_or_else(|p| panic!("{p:?}"));
    assert_eq!(
        check.by_kind,
        BTreeMap::from([("Transaction Aborted".to_owned(), 1), ("Transaction Held".to_owned(), 1)]),
        "{check}"
    );
    let aborted = &check.details[&format!("{id}:ABORTED")];
    assert_eq!(aborted["reason"], twopc::coordinator::OPERATOR_ABORT_REASON, "{aborted}");
}

/// An operator's abort racing the coordinator's commit: exactly one wins, the answers agree with it, and
/// the request ends (no attempt follows). The abort lands while service-b's vote is on its way, so the
/// coordinator's commit write, conditional on PREPARING, loses; then the other order.
#[tokio::test]
async fn an_operators_abort_racing_the_coordinators_commit_leaves_exactly_one_decision() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "1000").await;
    env.put_account("service-b", "B", "0").await;
    let mut outcomes = BTreeMap::new();
    for (round, delay_ms) in [0u64, 5, 20, 60, 150, 300].into_iter().enumerate() {
        let invoker = env.fresh_invoker();
        invoker.set("service-b", Action::Prepare, EdgeFault::DelayReply(Duration::from_millis(delay_ms)));
        let c = coordinator(&env, &invoker, Faults::default());
        let key = format!("race-{round}");
        let poster = {
            let c = c.clone();
            let key = key.clone();
            tokio::spawn(async move { post(&c, &transfer("A", "B", 1), Some(&key)).await })
        };
        // A keyed request is recorded PREPARING before it prepares: its id is the key's.
        let id = twopc::coordinator::caller_idempotent_id(Some(IAM_ADMIN), &key);
        let mut recorded = false;
        for _ in 0..400 {
            if env.transactions.get(&id).await.unwrap().is_some() {
                recorded = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(recorded, "the keyed request's record appears");
        let (abort_status, aborted) = admin(&c, "POST", &format!("/admin/transactions/{id}/abort"), None).await;
        let (post_status, posted) = poster.await.unwrap();
        env.settle().await;
        let record = env.transactions.get(&id).await.unwrap().unwrap();
        match record.status {
            Status::Committed => {
                assert_eq!((post_status, abort_status), (200, 409), "{posted} {aborted}");
                assert_eq!(aborted["status"], "COMMITTED");
            }
            Status::Aborted => {
                assert_eq!((post_status, abort_status), (409, 200), "{posted} {aborted}");
                assert_eq!(posted["reason"], twopc::coordinator::OPERATOR_ABORT_REASON, "{posted}");
                assert!(record.retried_as.is_none(), "no attempt follows an operator's abort");
            }
            other => panic!("round {round}: the record ended {other}: {posted} {aborted}"),
        }
        *outcomes.entry(record.status.to_string()).or_insert(0) += 1;
        assert!(env.locked_items().await.is_empty(), "round {round}");
    }
    let committed = outcomes.get("COMMITTED").copied().unwrap_or(0);
    assert_eq!(env.balance("service-b", "B").await, committed.to_string(), "{outcomes:?}");
    assert!(outcomes.contains_key("ABORTED"), "the abort won at least once: {outcomes:?}");
}

#[tokio::test]
async fn a_caller_the_policy_does_not_name_as_an_operator_is_refused_everywhere_and_nothing_is_written() {
    let env = TestEnv::new().await;
    let c = coordinator(&env, &env.fresh_invoker(), Faults::default());
    let id = held_transfer(&env, &c, "A", "B", 10, 60_000).await;
    let before = env.transactions.get(&id).await.unwrap().unwrap();
    // The IAM admin (iamAdmins' default is every IAM caller) is no operator; nor is a caller without an
    // identity, nor an admin JWT.
    let routes = [
        ("GET", "/admin/transactions".to_owned()),
        ("GET", format!("/admin/transactions/{id}")),
        ("GET", "/admin/stuck".to_owned()),
        ("GET", "/admin/outcomes".to_owned()),
        ("POST", format!("/admin/transactions/{id}/retry")),
        ("POST", format!("/admin/transactions/{id}/abort")),
    ];
    for (method, path) in &routes {
        let (status, answer) = call_coordinator(&c, &admin_event(method, path, None, IAM_ADMIN)).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("FORBIDDEN")), "{method} {path}: {answer}");
        let mut anonymous = admin_event(method, path, None, IAM_ADMIN);
        anonymous["requestContext"]["identity"] = json!({"sourceIp": "127.0.0.1"});
        assert_eq!(call_coordinator(&c, &anonymous).await.0, 403, "{method} {path} without identity");
        let mut admin_jwt = admin_event(method, path, None, IAM_ADMIN);
        admin_jwt["requestContext"]["authorizer"] =
            twopc::jwt::authorizer_context(&twopc::access::Caller::jwt("https://issuer", "root", true));
        assert_eq!(call_coordinator(&c, &admin_jwt).await.0, 403, "{method} {path} by an admin JWT");
    }
    assert_eq!(env.transactions.get(&id).await.unwrap().unwrap(), before, "nothing written");
    // A JWT in operatorGroups is one.
    let c = c.with_access(Policy::parse(Some(r#"{"operatorGroups": ["ops"]}"#)).unwrap());
    let mut operator_jwt = admin_event("GET", "/admin/transactions", None, IAM_ADMIN);
    operator_jwt["requestContext"]["authorizer"] =
        twopc::jwt::authorizer_context(&twopc::access::Caller::jwt("https://issuer", "oncall", false).operating(true));
    assert_eq!(call_coordinator(&c, &operator_jwt).await.0, 200);
    // Without the bus's log group (OUTCOME_LOG_GROUP) the recent outcomes cannot be read: 503, saying so.
    let mut recent = admin_event("GET", "/admin/outcomes", None, IAM_ADMIN);
    recent["requestContext"]["authorizer"] = operator_jwt["requestContext"]["authorizer"].clone();
    let (status, answer) = call_coordinator(&c, &recent).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (503, Some("UNAVAILABLE")), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("OUTCOME_LOG_GROUP"), "{answer}");
}

/// The stuck view finds a lock whose owner never wrote a record (its coordinator stopped after the
/// prepares; the sweeper, which would clear it, is not running), and looking writes nothing.
#[tokio::test]
async fn the_stuck_view_finds_a_lock_whose_owner_has_no_record_and_writes_nothing() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    let crashing = coordinator(&env, &env.fresh_invoker(), Faults::crash_at(CoordinatorCrash::AfterPrepares(2)));
    let (status, answer) = post(&crashing, &transfer("A", "B", 30), None).await;
    assert_eq!(status, 500, "{answer}");
    let owner = answer["transactionId"].as_str().unwrap().to_owned();
    assert!(env.transactions.get(&owner).await.unwrap().is_none(), "an unkeyed request records at its decision");
    let c = coordinator(&env, &env.fresh_invoker(), Faults::default());

    let (status, early) = admin(&c, "GET", "/admin/stuck", None).await;
    assert_eq!(status, 200, "{early}");
    assert_eq!(early["locks"], json!([]), "locks within their deadline are not stuck: {early}");
    env.clock.advance(120_000);
    let (status, stuck) = admin(&c, "GET", "/admin/stuck", Some(json!({"lockAgeMs": "30000"}))).await;
    assert_eq!(status, 200, "{stuck}");
    let locks = stuck["locks"].as_array().unwrap();
    assert_eq!(locks.len(), 2, "{stuck}");
    for lock in locks {
        assert_eq!(lock["lock"]["transactionId"], owner.as_str());
        assert_eq!(lock["why"], "its owner has no record");
        assert_eq!(lock["ownerStatus"], Value::Null);
    }
    assert_eq!(stuck["count"], 2);
    assert!(env.transactions.get(&owner).await.unwrap().is_none(), "looking wrote no record for the owner");
    assert_eq!(env.locked_items().await.len(), 2, "looking released nothing");
}

/// The open transactions, paged by the token each page answers, each once; filtered by status and age.
#[tokio::test]
async fn open_transactions_are_listed_page_by_page_each_once() {
    let env = TestEnv::new().await;
    let c = coordinator(&env, &env.fresh_invoker(), Faults::default());
    let mut ids = Vec::new();
    for i in 0..7 {
        ids.push(held_transfer(&env, &c, &format!("A{i}"), &format!("B{i}"), 1, 60_000 + i * 1_000).await);
    }
    let mut listed = Vec::new();
    let mut next: Option<String> = None;
    for _ in 0..10 {
        let mut query = json!({"limit": "3"});
        if let Some(token) = &next {
            query["next"] = json!(token);
        }
        let (status, page) = admin(&c, "GET", "/admin/transactions", Some(query)).await;
        assert_eq!(status, 200, "{page}");
        let found = page["transactions"].as_array().unwrap();
        assert!(found.len() <= 3);
        listed.extend(found.iter().map(|t| t["transactionId"].as_str().unwrap().to_owned()));
        next = page["next"].as_str().map(str::to_owned);
        if next.is_none() {
            break;
        }
    }
    // In the order of sweepAt, which for a held transaction is its holdUntil: the order they were made.
    assert_eq!(listed, ids, "every open transaction once, in order");
    let (_, committing) = admin(&c, "GET", "/admin/transactions", Some(json!({"status": "COMMITTING"}))).await;
    assert_eq!(committing["transactions"], json!([]));
    let (_, old) = admin(&c, "GET", "/admin/transactions", Some(json!({"minAgeMs": "3600000"}))).await;
    assert_eq!(old["transactions"], json!([]));
    let (status, bad) = admin(&c, "GET", "/admin/transactions", Some(json!({"status": "DONE"}))).await;
    assert_eq!((status, bad["error"]["code"].as_str()), (400, Some("INVALID_REQUEST")), "{bad}");
}

/// The sweeper's gauges after a run: the open transactions by status, the oldest one's age, and the
/// stuck view's count (a lock whose owner never wrote a record, past the view's lock age).
#[tokio::test]
async fn the_sweepers_census_counts_what_is_open_and_what_is_stuck() {
    let env = TestEnv::new().await;
    let c = coordinator(&env, &env.fresh_invoker(), Faults::default());
    for i in 0..2 {
        held_transfer(&env, &c, &format!("A{i}"), &format!("B{i}"), 1, 600_000).await;
    }
    env.clock.advance(5_000);
    let sweeper = env.sweeper(None).with_open_alerts_after(5_000);
    let census = sweeper.census().await.unwrap();
    assert_eq!(census.by_status, BTreeMap::from([("PREPARED".to_owned(), 2)]), "{census:?}");
    assert!(census.complete && census.oldest_age_ms >= 5_000, "{census:?}");
    assert_eq!(census.stuck, 0, "held within holdUntil, no stale lock: {census:?}");
    assert!(census.open_too_long.is_empty(), "a hold is open by design until its holdUntil: {census:?}");

    // A coordinator that stopped after its prepares leaves locks whose owner has no record.
    env.put_account("service-a", "C", "100").await;
    env.put_account("service-b", "D", "0").await;
    let crashing = coordinator(&env, &env.fresh_invoker(), Faults::crash_at(CoordinatorCrash::AfterPrepares(2)));
    assert_eq!(post(&crashing, &transfer("C", "D", 1), None).await.0, 500);
    env.clock.advance(twopc::coordinator::DEFAULT_LOCK_AGE_MS + 60_000);
    let census = sweeper.census().await.unwrap();
    assert_eq!(census.stuck, 2, "the two locks of the owner without a record: {census:?}");

    // Past their holdUntil by 5 s and more (no sweep ran): the age alerts, one event each on the bus (the
    // real SDK client, a local endpoint); an alert age of an hour finds none.
    env.clock.advance(600_000);
    let census = sweeper.census().await.unwrap();
    let events = local_services::firehose::MemorySink::default();
    let bridge = local_services::eventbridge::EventBridge::start(events.clone()).await.unwrap();
    let bus = EventBridgeBus::new(twopc_tests::outcomes::event_bridge_client(bridge.url()), "outcomes");
    assert_eq!(sweeper::send_age_alerts(&bus, &census).await, 2);
    let alerts = events.json();
    assert!(
        alerts.iter().all(|e| e["detail-type"] == "Transaction Open Too Long"
            && e["detail"]["ageMs"].as_u64() >= Some(605_000)
            && e["detail"]["holdUntil"].is_u64()),
        "{alerts:?}"
    );
    let later = env.sweeper(None).with_open_alerts_after(3_600_000).census().await.unwrap();
    assert!(later.open_too_long.is_empty(), "none an hour past its expiry: {later:?}");
}

/// The operators' actions meet a one-phase commit (a sole writing participant: committed with its
/// record in one write, never open): nothing to abort (409 with the committed body), retry answers it.
#[tokio::test]
async fn a_one_phase_commit_is_answered_as_committed_by_every_action() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    let c = coordinator(&env, &env.fresh_invoker(), Faults::default());
    let debit = Transaction::new().participant("service-a", [op::add("A", "balance", -1).min(0)]).to_json();
    let (status, answer) = post(&c, &debit, None).await;
    assert_eq!(status, 200, "{answer}");
    let id = answer["transactionId"].as_str().unwrap().to_owned();
    assert!(id.starts_with(&twopc::coordinator::one_phase_prefix("service-a")), "{id}");
    let (status, aborted) = admin(&c, "POST", &format!("/admin/transactions/{id}/abort"), None).await;
    assert_eq!((status, aborted["status"].as_str()), (409, Some("COMMITTED")), "{aborted}");
    let (status, retried) = admin(&c, "POST", &format!("/admin/transactions/{id}/retry"), None).await;
    assert_eq!((status, retried["status"].as_str()), (200, Some("COMMITTED")), "{retried}");
    let (status, shown) = admin(&c, "GET", &format!("/admin/transactions/{id}"), None).await;
    assert_eq!((status, shown["chain"].clone()), (200, json!([id])), "{shown}");
    assert_eq!(env.balance("service-a", "A").await, "99");
}

/// The operators' abort meets a resource participant (the example payments: a card authorized at
/// prepare): the held order's authorization is voided, nothing captured.
#[tokio::test]
async fn an_operators_abort_voids_a_held_orders_card_authorization() {
    let env = TestEnv::with_services(&["service-a", "payments"]).await;
    env.put_account("service-a", "W", "100").await;
    let c = coordinator(&env, &env.fresh_invoker(), Faults::default());
    let order = json!({"participants": [
        {"service": "payments", "operations": [payments::charge("order-9", "4242424242424242", 1500)]},
        {"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "W"}, "field": "balance", "delta": -20, "min": 0}]}
    ], "holdMs": 60000});
    let (status, answer) = post(&c, &order, None).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("PREPARED")), "{answer}");
    let id = answer["transactionId"].as_str().unwrap().to_owned();
    let api = env.payment_api.as_deref().unwrap();
    assert_eq!(api.held().len(), 1, "authorized at prepare");
    let (status, aborted) = admin(&c, "POST", &format!("/admin/transactions/{id}/abort"), None).await;
    assert_eq!((status, aborted["status"].as_str()), (200, Some("ABORTED")), "{aborted}");
    api.settle().await;
    let statuses: Vec<String> = api.authorizations().into_iter().map(|a| a.status).collect();
    assert_eq!(statuses, ["voided"], "the authorization is voided, never captured");
    assert_eq!(env.balance("service-a", "W").await, "100");
}

/// An operator's abort sent to the first attempt of a held request that a contention refusal retried
/// aborts the attempt that lives (the second), though the abort's write took effect and its reply was
/// lost; the key's replay then answers that abort, and no attempt follows it.
#[tokio::test]
async fn an_operators_abort_of_a_retried_requests_first_attempt_aborts_the_attempt_that_lives() {
    let faults = DynamoFaults::new(4701);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    a_held_by_an_older_transaction(&env).await;
    let invoker = env.fresh_invoker();
    let c = coordinator(&env, &invoker, Faults::default());
    let mut body = transfer("A", "B", 10);
    body["holdMs"] = json!(60_000);
    let client = {
        let (c, body) = (c.clone(), body.clone());
        tokio::spawn(async move { post(&c, &body, Some("held-retried")).await })
    };
    refused_once(&invoker).await;
    abort_holder(&env, "tx-older", "A").await;
    let (status, held) = client.await.unwrap();
    let first = caller_idempotent_id(Some(IAM_ADMIN), "held-retried");
    let second = format!("{first}-2");
    assert_eq!((status, held["transactionId"].as_str()), (202, Some(second.as_str())), "{held}");

    faults.add(
        Rule::new(DynamoFault::LoseReply)
            .operation("UpdateItem")
            .table(env.transactions.table())
            .body_contains(twopc::coordinator::OPERATOR_ABORT_REASON)
            .nth(1),
    );
    let (status, aborted) = admin(&c, "POST", &format!("/admin/transactions/{first}/abort"), None).await;
    assert_eq!(faults.fired(), 1, "the abort's write took effect and its reply was lost");
    assert_eq!((status, aborted["status"].as_str()), (200, Some("ABORTED")), "{aborted}");
    assert_eq!(aborted["transactionId"], second.as_str(), "{aborted}");
    assert_eq!(aborted["reason"], twopc::coordinator::OPERATOR_ABORT_REASON);

    let (status, replayed) = post(&c, &body, Some("held-retried")).await;
    assert_eq!((status, replayed["status"].as_str()), (409, Some("ABORTED")), "{replayed}");
    assert_eq!(replayed["transactionId"], second.as_str(), "{replayed}");
    assert!(env.transactions.get(&format!("{first}-3")).await.unwrap().is_none(), "no attempt follows the abort");
    let (_, shown) = admin(&c, "GET", &format!("/admin/transactions/{first}"), None).await;
    assert_eq!(shown["chain"], json!([first, second]), "{shown}");
    assert_eq!(shown["audit"], json!([]), "the first attempt's record is not the one acted on: {shown}");
    let (_, shown) = admin(&c, "GET", &format!("/admin/transactions/{second}"), None).await;
    assert_eq!(shown["audit"].as_array().unwrap().len(), 1, "{shown}");
    env.sweep_until_quiet().await;
    assert_eq!(env.balance("service-a", "A").await, "100");
    assert_no_locks(&env).await;
}
