//! Faults at the DynamoDB client (the SDK as deployed: standard retry mode, 3 attempts), and what the
//! protocol must make of them.
//!
//! - The SDK really retries through each injected fault (forwarded requests are counted).
//! - Defect 8 of issue 19: a conditional write that took effect but whose reply was lost is retried by
//!   the SDK, and the retry's condition meets the first attempt's own write. Every conditional write of
//!   the coordinator and the participants must recognise itself: the transfer ends as it would have
//!   without the fault, nothing applied twice, no lock left.
//! - Defect 10: a decision write DynamoDB refused (throttled on every attempt) certainly did not happen:
//!   the locks are released before the answer, and the answer says what failed in the system's words.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use twopc_client::{Transaction, op};
use twopc_tests::dynamo_faults::{INJECTED_INTERNAL_MESSAGE, INJECTED_RESET_MESSAGE, INJECTED_THROTTLING_MESSAGE};
use twopc_tests::{DynamoFault, Rule, TestEnv};

use aws_sdk_dynamodb::types::AttributeValue;

const REPLY_LOST: [DynamoFault; 2] = [DynamoFault::LoseReply, DynamoFault::DropConnection];

fn transfer(debits: &[(&str, i64)], credit: (&str, i64), timeout_ms: u64) -> Value {
    let debits = debits.iter().map(|(id, amount)| op::add(*id, "balance", -amount).min(0));
    Transaction::new()
        .participant("service-a", debits)
        .participant("service-b", [op::add(credit.0, "balance", credit.1)])
        .timeout_ms(timeout_ms)
        .to_json()
}

/// A world with A = 100 (service-a) and B = 0 (service-b).
async fn world() -> TestEnv {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    env
}

/// What a transfer of 30 from A to B must have left once it committed exactly once.
async fn committed_once(env: &TestEnv, answer: &Value, what: &str) -> Vec<String> {
    let mut problems = vec![];
    let id = answer["transactionId"].as_str().unwrap_or_default();
    let record = env.records().await.into_iter().find(|r| r["transactionId"] == id);
    if record.as_ref().map(|r| r["status"].clone()) != Some(json!("COMMITTED")) {
        problems.push(format!("{what}: the record is {record:?}, not COMMITTED"));
    }
    for (service, account, balance) in [("service-a", "A", "70"), ("service-b", "B", "30")] {
        let item = env.item(service, account).await.unwrap();
        if env.balance(service, account).await != balance || item["version"] != json!(1) {
            problems.push(format!("{what}: {service}/{account} should hold {balance} at version 1: {item}"));
        }
    }
    for (service, item) in env.locked_items().await {
        problems.push(format!("{what}: a lock is left on {service}: {item}"));
    }
    problems
}

/// The words of a DynamoDB failure that must not reach a caller: table names, operation names, the
/// service's own error text.
fn leaks(env: &TestEnv, body: &Value) -> Vec<String> {
    let text = body.to_string();
    let prefix = env.transactions.table().trim_end_matches("-transactions").to_owned();
    let mut words: Vec<String> = vec![prefix];
    words.extend(
        [
            "DynamoDB",
            "PutItem",
            "UpdateItem",
            "GetItem",
            "DeleteItem",
            "TransactWriteItems",
            "ThrottlingException",
            "InternalServerError",
            "ConditionalCheckFailed",
            INJECTED_THROTTLING_MESSAGE,
            INJECTED_INTERNAL_MESSAGE,
            INJECTED_RESET_MESSAGE,
        ]
        .map(str::to_owned),
    );
    words
        .into_iter()
        .filter(|w| text.contains(w.as_str()))
        .map(|w| format!("the answer quotes {w:?}: {body}"))
        .collect()
}

// ---------------------------------------------------------------------------------------------------
// The SDK retries through every fault.

async fn conditional_put(env: &TestEnv, id: &str) -> Result<(), String> {
    env.store_client
        .put_item()
        .table_name(env.transactions.table())
        .item("transactionId", AttributeValue::S(id.to_owned()))
        .condition_expression("attribute_not_exists(transactionId)")
        .send()
        .await
        .map(|_| ())
        .map_err(|e| aws_sdk_dynamodb::error::DisplayErrorContext(e).to_string())
}

async fn exists(env: &TestEnv, id: &str) -> bool {
    env.raw_record(id).await.is_some()
}

#[tokio::test]
async fn the_sdk_retries_through_every_injected_fault() {
    let env = TestEnv::new().await;
    let faults = &env.dynamo_faults;
    let table = env.transactions.table().to_owned();
    for fault in REPLY_LOST {
        faults.forget();
        faults.add(Rule::new(fault).operation("PutItem").table(&table).nth(1));
        let id = format!("probe-{}", fault.name());

        let result = conditional_put(&env, &id).await;

        // The first attempt took effect; its reply was lost; the retry met the first attempt's write.
        assert_eq!(faults.fired(), 1, "{fault:?}");
        assert_eq!(faults.forwarded("PutItem"), 2, "{fault:?}: the SDK retried the write");
        assert!(exists(&env, &id).await, "{fault:?}: the write took effect");
        let error = result.expect_err("the retry's condition fails on the first attempt's own write");
        assert!(error.contains("ConditionalCheckFailed"), "{fault:?}: {error}");
        faults.clear();
    }

    faults.forget();
    faults.add(Rule::new(DynamoFault::Throttle).operation("PutItem").table(&table).nth(1));
    conditional_put(&env, "probe-throttle").await.expect("the retry after a throttle succeeds");
    assert_eq!((faults.sent("PutItem"), faults.forwarded("PutItem")), (2, 1), "throttled once, not forwarded");
    assert!(exists(&env, "probe-throttle").await);
    faults.clear();

    faults.forget();
    faults.add(Rule::new(DynamoFault::Late(Duration::from_millis(400))).operation("PutItem").table(&table).nth(1));
    let started = Instant::now();
    conditional_put(&env, "probe-late").await.expect("a late answer is still an answer");
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!((faults.sent("PutItem"), faults.forwarded("PutItem")), (1, 1), "no retry for a late answer");
    faults.clear();

    // Standard mode makes 3 attempts in all: a write throttled on every attempt fails after the third.
    faults.forget();
    faults.add(Rule::new(DynamoFault::Throttle).operation("PutItem").table(&table));
    let error = conditional_put(&env, "probe-refused").await.expect_err("throttled on every attempt");
    assert!(error.contains("ThrottlingException"), "{error}");
    assert_eq!((faults.sent("PutItem"), faults.forwarded("PutItem")), (3, 0));
    assert!(!exists(&env, "probe-refused").await);
    faults.clear();

    // Sticky: a rule that struck a request strikes the SDK's retries of it, and nothing else.
    faults.forget();
    faults.add(Rule::new(DynamoFault::LoseReply).operation("PutItem").table(&table).nth(1).sticky());
    let error = conditional_put(&env, "probe-sticky").await.expect_err("every reply lost");
    assert!(error.contains("InternalServerError") || error.contains("500"), "{error}");
    assert_eq!((faults.fired(), faults.forwarded("PutItem")), (3, 3));
    conditional_put(&env, "probe-other").await.expect("another request passes");
    faults.clear();
}

// ---------------------------------------------------------------------------------------------------
// Defect 8: every conditional write recognises its own earlier attempt.

/// Runs a transfer of 30 from A to B with `rule` (built for the fresh world) on the protocol's client,
/// once for each way of losing a reply; returns every problem found.
async fn with_lost_reply(what: &str, key: Option<&str>, rule: impl Fn(&TestEnv, DynamoFault) -> Rule) -> Vec<String> {
    let mut problems = vec![];
    for fault in REPLY_LOST {
        let env = world().await;
        env.dynamo_faults.add(rule(&env, fault));
        let started = Instant::now();
        let key = key.map(|k| format!("{k}-{}", fault.name()));
        // 5 s: the SDK's retry after a lost reply waits its backoff (up to a second) before the
        // transaction's own work starts, and a loaded machine must not make that a timeout.
        let (status, answer) = env.post(&transfer(&[("A", 30)], ("B", 30), 5_000), key.as_deref()).await;
        let took = started.elapsed();
        let what = format!("{what} ({})", fault.name());
        println!("{what}: {status} after {} ms: {answer}", took.as_millis());
        if env.dynamo_faults.fired() != 1 {
            problems.push(format!("{what}: the fault fired {} times, not once", env.dynamo_faults.fired()));
        }
        env.dynamo_faults.clear();
        if status != 200 {
            problems.push(format!("{what}: answered {status} after {} ms, not 200: {answer}", took.as_millis()));
        }
        problems.extend(committed_once(&env, &answer, &what).await);
    }
    problems
}

#[tokio::test]
async fn a_keyed_transfer_whose_preparing_record_reply_is_lost_commits() {
    let problems = with_lost_reply("keyed PREPARING create", Some("lost-preparing"), |env, fault| {
        Rule::new(fault).operation("PutItem").table(env.transactions.table()).body_contains("PREPARING").nth(1)
    })
    .await;
    assert!(problems.is_empty(), "{problems:#?}");
}

#[tokio::test]
async fn an_unkeyed_transfer_whose_committing_record_reply_is_lost_commits() {
    let problems = with_lost_reply("unkeyed COMMITTING create", None, |env, fault| {
        Rule::new(fault).operation("PutItem").table(env.transactions.table()).body_contains("COMMITTING").nth(1)
    })
    .await;
    assert!(problems.is_empty(), "{problems:#?}");
}

#[tokio::test]
async fn a_keyed_transfer_whose_commit_decision_reply_is_lost_commits() {
    let problems = with_lost_reply("keyed PREPARING→COMMITTING", Some("lost-decision"), |env, fault| {
        Rule::new(fault).operation("UpdateItem").table(env.transactions.table()).body_contains("COMMITTING").nth(1)
    })
    .await;
    assert!(problems.is_empty(), "{problems:#?}");
}

#[tokio::test]
async fn a_lost_reply_of_a_single_item_lock_still_prepares() {
    // The first UpdateItem on service-a's table is A's lock.
    let problems = with_lost_reply("single-item lock", None, |env, fault| {
        Rule::new(fault).operation("UpdateItem").table(env.table("service-a")).nth(1)
    })
    .await;
    assert!(problems.is_empty(), "{problems:#?}");
}

#[tokio::test]
async fn a_lost_reply_of_a_commit_applies_it_once() {
    // On service-b's table: the first UpdateItem is B's lock, the second B's commit.
    let problems = with_lost_reply("commit", None, |env, fault| {
        Rule::new(fault).operation("UpdateItem").table(env.table("service-b")).nth(2)
    })
    .await;
    assert!(problems.is_empty(), "{problems:#?}");
}

#[tokio::test]
async fn a_lost_reply_of_a_multi_item_lock_still_prepares() {
    let mut problems = vec![];
    for fault in REPLY_LOST {
        let env = TestEnv::new().await;
        env.put_account("service-a", "A1", "100").await;
        env.put_account("service-a", "A2", "100").await;
        env.put_account("service-b", "B", "0").await;
        // Two items of one service lock in one TransactWriteItems.
        env.dynamo_faults.add(Rule::new(fault).operation("TransactWriteItems").table(env.table("service-a")).nth(1));

        let (status, answer) = env.post(&transfer(&[("A1", 10), ("A2", 20)], ("B", 30), 2_000), None).await;

        let what = format!("two-item lock ({})", fault.name());
        println!("{what}: {status}: {answer}");
        if env.dynamo_faults.fired() != 1 {
            problems.push(format!("{what}: the fault fired {} times, not once", env.dynamo_faults.fired()));
        }
        env.dynamo_faults.clear();
        if status != 200 {
            problems.push(format!("{what}: answered {status}, not 200: {answer}"));
        }
        for (service, account, balance) in
            [("service-a", "A1", "90"), ("service-a", "A2", "80"), ("service-b", "B", "30")]
        {
            let item = env.item(service, account).await.unwrap();
            if env.balance(service, account).await != balance || item["version"] != json!(1) {
                problems.push(format!("{what}: {service}/{account} should hold {balance} at version 1: {item}"));
            }
        }
        for (service, item) in env.locked_items().await {
            problems.push(format!("{what}: a lock is left on {service}: {item}"));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[tokio::test]
async fn a_lost_reply_of_an_abort_still_releases() {
    let mut problems = vec![];
    for fault in REPLY_LOST {
        let env = world().await;
        // service-b refuses (B would exceed its maximum), so A's lock is released by an abort: on
        // service-a's table the first UpdateItem is the lock, the second the release.
        env.dynamo_faults.add(Rule::new(fault).operation("UpdateItem").table(env.table("service-a")).nth(2));
        let body = Transaction::new()
            .participant("service-a", [op::add("A", "balance", -30).min(0)])
            .participant("service-b", [op::add("B", "balance", 30).max(10)])
            .timeout_ms(2_000)
            .to_json();

        let (status, answer) = env.post(&body, None).await;

        let what = format!("abort ({})", fault.name());
        println!("{what}: {status}: {answer}");
        if env.dynamo_faults.fired() != 1 {
            problems.push(format!("{what}: the fault fired {} times, not once", env.dynamo_faults.fired()));
        }
        env.dynamo_faults.clear();
        if (status, answer["status"].as_str()) != (409, Some("ABORTED")) {
            problems.push(format!("{what}: answered {status}, not 409 ABORTED: {answer}"));
        }
        let id = answer["transactionId"].as_str().unwrap_or_default();
        let (got, record) = env.get(id).await;
        // A read answers 200 whatever the outcome (issue 44); the body says ABORTED.
        if (got, record["status"].as_str()) != (200, Some("ABORTED")) {
            problems.push(format!("{what}: GET answers {got} {record}"));
        }
        for (service, account, balance) in [("service-a", "A", "100"), ("service-b", "B", "0")] {
            let item = env.item(service, account).await.unwrap();
            if env.balance(service, account).await != balance || item["version"] != json!(0) {
                problems.push(format!("{what}: {service}/{account} should be untouched: {item}"));
            }
        }
        for (service, item) in env.locked_items().await {
            problems.push(format!("{what}: a lock is left on {service}: {item}"));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

// ---------------------------------------------------------------------------------------------------
// Defect 10: a refused decision write releases the locks before the answer.

/// A transfer whose commit decision DynamoDB refuses on every attempt (throttled: certainly not
/// applied): once it answered, nothing may stay locked, and a plain transfer on the same items
/// commits at once. `decision` picks the decision write (a PutItem for an unkeyed transfer, the
/// PREPARING→COMMITTING UpdateItem for a keyed one).
async fn refused_decision(key: Option<&str>, decision: &str) -> Vec<String> {
    let env = world().await;
    // Long enough that the locks would still stand when the test looks (they expire at the deadline).
    let timeout_ms = 20_000;
    env.dynamo_faults.add(
        Rule::new(DynamoFault::Throttle)
            .operation(decision)
            .table(env.transactions.table())
            .body_contains("COMMITTING"),
    );
    let started = Instant::now();

    let (status, answer) = env.post(&transfer(&[("A", 30)], ("B", 30), timeout_ms), key).await;

    let took = started.elapsed();
    let locked = env.locked_items().await;
    let throttled = env.dynamo_faults.fired();
    env.dynamo_faults.clear();
    let what = format!("refused decision ({})", if key.is_some() { "keyed" } else { "unkeyed" });
    println!("{what}: {status} after {} ms ({throttled} attempts throttled): {answer}", took.as_millis());
    let mut problems = vec![];
    if throttled == 0 {
        problems.push(format!("{what}: the decision write was never throttled"));
    }
    if ![503, 409].contains(&status) {
        problems.push(format!("{what}: answered {status}: {answer}"));
    }
    if status == 409 && answer["status"] != "ABORTED" {
        problems.push(format!("{what}: a 409 must say ABORTED: {answer}"));
    }
    problems.extend(leaks(&env, &answer).into_iter().map(|p| format!("{what}: {p}")));
    for (service, item) in &locked {
        problems.push(format!("{what}: right after the answer {service} still holds a lock: {item}"));
    }
    // A plain transfer on the same items, at once.
    let (plain, plain_answer) = env.post(&transfer(&[("A", 30)], ("B", 30), 2_000), None).await;
    if plain != 200 {
        problems.push(format!("{what}: a plain transfer on the same items answered {plain}: {plain_answer}"));
    }
    // The refused transfer never commits, whatever recovery does later.
    env.clock.advance(10 * 60_000);
    let (_, quiet) = env.try_sweep_until_quiet(10).await;
    if !quiet {
        problems.push(format!("{what}: sweeps did not become quiet"));
    }
    let id = answer["transactionId"].as_str().unwrap_or_default();
    if let Some(record) = env.records().await.into_iter().find(|r| r["transactionId"] == id)
        && record["status"] != "ABORTED"
    {
        problems.push(format!("{what}: its record ends {}", record["status"]));
    }
    let expected = if plain == 200 { ("70", "30") } else { ("100", "0") };
    let balances = (env.balance("service-a", "A").await, env.balance("service-b", "B").await);
    if (balances.0.as_str(), balances.1.as_str()) != expected {
        problems.push(format!("{what}: balances are {balances:?}, expected {expected:?}"));
    }
    problems
}

#[tokio::test]
async fn a_refused_commit_decision_releases_the_locks_before_answering() {
    let problems = refused_decision(None, "PutItem").await;
    assert!(problems.is_empty(), "{problems:#?}");
}

#[tokio::test]
async fn a_refused_keyed_commit_decision_releases_the_locks_before_answering() {
    let problems = refused_decision(Some("refused-decision"), "UpdateItem").await;
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The other half of defect 10's rule: a decision write whose outcome is unknown (it took effect, and
/// every reply was lost) is found out, never released against: the transfer commits, now or by the
/// sweeper, and is never reported aborted.
#[tokio::test]
async fn an_unknown_commit_decision_is_never_released_against() {
    let env = world().await;
    env.dynamo_faults.add(
        Rule::new(DynamoFault::LoseReply)
            .operation("PutItem")
            .table(env.transactions.table())
            .body_contains("COMMITTING"),
    );

    let (status, answer) = env.post(&transfer(&[("A", 30)], ("B", 30), 2_000), None).await;

    let fired = env.dynamo_faults.fired();
    env.dynamo_faults.clear();
    println!("unknown decision: {status} ({fired} replies lost): {answer}");
    let mut problems = vec![];
    if fired == 0 {
        problems.push("the decision write's reply was never lost".to_owned());
    }
    match status {
        200 => {}
        503 => {
            problems.extend(leaks(&env, &answer));
            // Nothing may be released against a record that says COMMITTING: recovery commits it.
            env.clock.advance(10 * 60_000);
            env.sweep_until_quiet().await;
        }
        _ => problems.push(format!("answered {status}, neither 200 nor 503: {answer}")),
    }
    problems.extend(committed_once(&env, &answer, "unknown decision").await);
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A key answers for one request only, even when the store cannot be read. A keyed request that commits
/// in one phase runs under its scoped id (`1p~<service>~<id>`); sent again, the coordinator first looks
/// for a record under the key's plain id (where such a request ran before ids were scoped). When that
/// read fails, whether and where the key ran is unknown: the 503 names no transaction, never the plain
/// id of a request that did not run (found by the bank test: "one key named several requests").
#[tokio::test]
async fn a_keyed_one_phase_replay_whose_read_fails_names_no_other_transaction() {
    let env = world().await;
    let debit = Transaction::new().participant("service-a", [op::add("A", "balance", -10).min(0)]).to_json();
    let (status, first) = env.post(&debit, Some("one-phase-key")).await;
    assert_eq!((status, first["status"].as_str()), (200, Some("COMMITTED")), "{first}");
    let scoped = first["transactionId"].as_str().unwrap().to_owned();
    let plain = scoped.strip_prefix("1p~service-a~").expect("a one-phase id").to_owned();
    env.dynamo_faults.add(
        Rule::new(DynamoFault::Throttle)
            .operation("GetItem")
            .table(env.transactions.table())
            .body_contains(&format!("\"S\":\"{plain}\"")),
    );

    let (status, again) = env.post(&debit, Some("one-phase-key")).await;

    assert!(env.dynamo_faults.fired() > 0, "the plain id's read was refused");
    assert_eq!(status, 503, "{again}");
    assert!(
        again["transactionId"].is_null() || again["transactionId"] == json!(scoped),
        "the key named another transaction than its own: {again}"
    );
    assert!(!again.to_string().contains(&format!("\"{plain}\"")), "{again}");
    assert_eq!(env.balance("service-a", "A").await, "90", "applied once");
}
