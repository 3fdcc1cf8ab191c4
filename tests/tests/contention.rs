//! Hot items (issue 35): a request refused for contention is retried by the coordinator keeping its age,
//! a caller's retry keeps it with the coordinator's age token, and no transfer is refused for ever.

use std::time::Duration;

use serde_json::{Value, json};
use twopc::coordinator::{Coordinator, MAX_ATTEMPTS};
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::Vote;
use twopc_tests::contention::*;
use twopc_tests::{DynamoFault, DynamoFaults, EdgeFault, Rule, TestEnv};

/// A transfer of `amount` from A to B with its own `timeoutMs`.
fn a_to_b(amount: &str, timeout_ms: u64) -> Value {
    json!({"participants": TestEnv::transfer(a("A"), b("B"), amount)["participants"], "timeoutMs": timeout_ms})
}

async fn post(coordinator: &Coordinator, body: &Value, key: Option<&str>, token: Option<&str>) -> (u16, Value) {
    let caller = coordinator.access().iam(None);
    let reply = coordinator.submit_retry_by(body.to_string().as_bytes(), key, token, &caller).await;
    (reply.status, reply.body)
}

#[tokio::test]
async fn a_transfer_refused_by_an_older_lock_is_retried_with_its_age_once_the_holder_is_decided() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let invoker = env.fresh_invoker();
    let coordinator = env.coordinator_with(&invoker, Faults::default());

    let client = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move { post(&coordinator, &TestEnv::transfer(a("A"), b("B"), "10"), None, None).await })
    };
    // Refused once (a younger transaction yields at once); the retry waits for the holder's decision.
    refused_once(&invoker).await;
    abort_holder(&env, "tx-older", "A").await;
    let (status, body) = client.await.unwrap();

    assert_eq!(status, 200, "{body}");
    assert_eq!(body["attempts"], 2, "{body}");
    let first = body["firstTransactionId"].as_str().unwrap().to_owned();
    assert_eq!(body["transactionId"], format!("{first}-2"));
    // The first attempt is an aborted transaction of its own that names its successor; the second
    // carries its age.
    let (status, earlier) = env.get(&first).await;
    assert_eq!((status, earlier["status"].as_str()), (200, Some("ABORTED")), "{earlier}");
    assert_eq!(earlier["retriedAs"], body["transactionId"]);
    assert_eq!(body["startedAt"], earlier["createdAt"], "the retry keeps the first attempt's start");
    let prepares: Vec<_> = invoker.calls().into_iter().filter(|c| c.service == "service-a").collect();
    assert_eq!(prepares[0].answer, "REFUSED:CONFLICT");
    assert_eq!(env.balance("service-a", "A").await, "90");
    assert_eq!(env.balance("service-b", "B").await, "10");
    assert_no_locks(&env).await;
}

/// The retry under faults: the refused attempt's abort, which names its successor, takes effect but
/// DynamoDB's reply is lost (the SDK's retry meets it and recognises it as its own), the refused
/// attempt's prepare and abort are delivered again late (after the retry committed), and a prepare's
/// answer comes late.
#[tokio::test]
async fn retries_survive_a_lost_abort_reply_and_late_duplicated_messages() {
    let faults = DynamoFaults::new(35);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    faults.add(
        // The refused attempt's ABORTED record, created naming its successor (issue 41: in the abort itself)
        // with the successor's record (issue 47: one TransactWriteItems).
        Rule::new(DynamoFault::LoseReply)
            .operation("TransactWriteItems")
            .table(env.transactions.table())
            .body_contains("retriedAs")
            .nth(1),
    );
    a_held_by_an_older_transaction(&env).await;
    let invoker = env.fresh_invoker();
    invoker.set("service-b", twopc::model::Action::Prepare, EdgeFault::LateCopy(Duration::from_millis(300)));
    invoker.set("service-a", twopc::model::Action::Abort, EdgeFault::LateCopy(Duration::from_millis(200)));
    invoker.set("service-b", twopc::model::Action::Commit, EdgeFault::DelayReply(Duration::from_millis(50)));
    let coordinator = env.coordinator_with(&invoker, Faults::default());

    let client = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move { post(&coordinator, &TestEnv::transfer(a("A"), b("B"), "10"), None, None).await })
    };
    refused_once(&invoker).await;
    abort_holder(&env, "tx-older", "A").await;
    let (status, body) = client.await.unwrap();
    env.settle().await;
    env.sweep_until_quiet().await;

    assert_eq!(status, 200, "{body}");
    assert_eq!(body["attempts"], 2, "{body}");
    assert_eq!(faults.fired(), 1, "the reply of the abort that names the successor was lost once");
    assert!(invoker.calls().iter().any(|c| c.late_copy), "late copies were delivered");
    assert_eq!(env.balance("service-a", "A").await, "90", "applied exactly once");
    assert_eq!(env.balance("service-b", "B").await, "10", "applied exactly once");
    assert_no_locks(&env).await;
}

/// A keyed request whose coordinator stops between naming the next attempt (created with the link,
/// PREPARING) and beginning it: a retry of the key follows the chain to that attempt, waits for it while
/// its coordinator may still begin it, aborts it once past its deadline (so it can never begin), and
/// answers the abort; the late coordinator's attempt then finds it decided and stops.
#[tokio::test]
async fn a_retried_key_fences_an_attempt_its_stopped_coordinator_claimed_but_never_began() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let body = a_to_b("10", 1_000);
    let invoker = env.fresh_invoker();
    let crashing = env.coordinator_with(&invoker, Faults::crash_at(CoordinatorCrash::AfterClaim));
    // The holder is decided once the first attempt was refused: the retry then claims its successor.
    let releaser = {
        let (transactions, clock, invoker) = (env.transactions.clone(), env.clock.clone(), invoker.clone());
        tokio::spawn(async move {
            refused_once(&invoker).await;
            use twopc::clock::Clock;
            transactions.abort_if_absent("tx-older", clock.now_ms(), "aborted by the test").await.unwrap();
        })
    };
    let (status, crashed) = post(&crashing, &body, Some("fenced"), None).await;
    releaser.await.unwrap();
    assert_eq!(status, 500, "the injected crash: {crashed}");
    let first = twopc::coordinator::caller_idempotent_id(None, "fenced");
    let claimed = env.get(&first).await.1;
    assert_eq!(claimed["retriedAs"], format!("{first}-2"), "{claimed}");

    let (status, answer) = post(&env.coordinator, &body, Some("fenced"), None).await;

    assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{answer}");
    assert_eq!(answer["transactionId"], format!("{first}-2"), "the answer is the chain's last attempt");
    // The stopped coordinator's attempt, were it to begin now, finds its record and answers the same.
    let (status, again) = post(&env.coordinator, &body, Some("fenced"), None).await;
    assert_eq!((status, &again["transactionId"]), (409, &answer["transactionId"]));
    abort_holder(&env, "tx-older", "A").await;
    assert_eq!(env.balance("service-a", "A").await, "100", "nothing applied");
    assert_no_locks(&env).await;
}

/// A holder that never lets go (a refusal that persists): the request ends within its timeout, after a
/// bounded number of attempts, with an age token; once the holder is gone, the caller's retry with the
/// token keeps the first attempt's age and continues its attempt count; the same token again answers
/// the same; another body, another caller, a forged age, another key or an expired token are refused
/// and write nothing.
#[tokio::test]
async fn a_callers_retry_keeps_its_age_with_the_token_once_and_only_for_its_own_request() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let transfer = |amount: &str| a_to_b(amount, 600);

    let started = std::time::Instant::now();
    let (status, refused) = post(&env.coordinator, &transfer("10"), None, None).await;
    assert_eq!(status, 409, "{refused}");
    assert!(started.elapsed() < Duration::from_millis(2_000), "within the timeout: {:?}", started.elapsed());
    let attempts = refused["attempts"].as_u64().unwrap_or(1);
    assert!(attempts <= u64::from(MAX_ATTEMPTS), "{refused}");
    // Its retry waited for the holder at A (holding nothing) as long as its deadline allowed.
    assert_eq!(refused["participants"][0]["code"], "TIMEOUT", "{refused}");
    let token = refused["ageToken"].as_str().expect("a refusal for contention carries an age token").to_owned();
    let first = refused["firstTransactionId"].as_str().or(refused["transactionId"].as_str()).unwrap().to_owned();
    let (_, first_record) = env.get(&first).await;
    let records_before = env.records().await.len();

    // Refused, nothing written: another body, another caller, a token that claims more age.
    let (status, other_body) = post(&env.coordinator, &transfer("11"), None, Some(&token)).await;
    assert_eq!((status, other_body["error"]["code"].as_str()), (400, Some("INVALID_AGE_TOKEN")), "{other_body}");
    let someone = env.coordinator.access().iam(Some("arn:aws:iam::123456789012:role/someone-else"));
    let reply =
        env.coordinator.submit_retry_by(transfer("10").to_string().as_bytes(), None, Some(&token), &someone).await;
    assert_eq!((reply.status, reply.body["error"]["code"].as_str()), (400, Some("INVALID_AGE_TOKEN")));
    let (payload, mac) = token.split_once('.').unwrap();
    let mut claimed: Value = serde_json::from_slice(&hex::decode(payload).unwrap()).unwrap();
    claimed["startedAt"] = json!(1);
    let forged = format!("{}.{mac}", hex::encode(serde_json::to_vec(&claimed).unwrap()));
    let (status, forged) = post(&env.coordinator, &transfer("10"), None, Some(&forged)).await;
    assert_eq!((status, forged["error"]["code"].as_str()), (400, Some("INVALID_AGE_TOKEN")), "{forged}");
    assert_eq!(env.records().await.len(), records_before, "a refused token writes nothing");

    // The holder goes; the retry with the token commits, as old as the first attempt: a request of its own
    // (issue 41) that keeps the refused one's age, linked to it by `ageOf`.
    abort_holder(&env, "tx-older", "A").await;
    let (status, retried) = post(&env.coordinator, &transfer("10"), None, Some(&token)).await;
    assert_eq!(status, 200, "{retried}");
    assert_eq!(retried["transactionId"], format!("{first}-r{}", attempts + 1));
    assert_eq!(retried["ageOf"], refused["transactionId"], "{retried}");
    assert!(retried.get("attempts").is_none() && retried.get("firstTransactionId").is_none(), "{retried}");
    assert_eq!(retried["startedAt"], first_record["createdAt"]);
    // The same token again: the same answer, nothing applied twice; under another key: refused.
    let (status, again) = post(&env.coordinator, &transfer("10"), None, Some(&token)).await;
    assert_eq!((status, &again["transactionId"]), (200, &retried["transactionId"]));
    let (status, reused) = post(&env.coordinator, &transfer("10"), Some("another-key"), Some(&token)).await;
    assert_eq!((status, reused["error"]["code"].as_str()), (409, Some("AGE_TOKEN_USED")), "{reused}");
    assert_eq!(env.balance("service-a", "A").await, "90", "applied once");

    // A token past its expiry (the request's timeout after its answer, and the clock margin).
    older_holder(&env, "tx-older-2", "A").await;
    let (status, refused) = post(&env.coordinator, &transfer("5"), None, None).await;
    assert_eq!(status, 409, "{refused}");
    let token = refused["ageToken"].as_str().unwrap().to_owned();
    env.clock.advance(600 + twopc::clock::CLOCK_MARGIN_MS + 1_000);
    let (status, expired) = post(&env.coordinator, &transfer("5"), None, Some(&token)).await;
    assert_eq!((status, expired["error"]["code"].as_str()), (400, Some("INVALID_AGE_TOKEN")), "{expired}");
    abort_holder(&env, "tx-older-2", "A").await;
    env.sweep_until_quiet().await;
    assert_eq!(env.balance("service-a", "A").await, "90");
    assert_no_locks(&env).await;
}

/// Many clients, two hot items, every transfer through the coordinator at once: none is refused for
/// good, each is applied once, and the attempts stay within the bound.
#[tokio::test]
async fn concurrent_transfers_on_hot_items_all_commit_within_the_attempt_bound() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "hot-a", "1000").await;
    env.put_account("service-b", "hot-b", "1000").await;
    const CLIENTS: usize = 8;
    const TRANSFERS: usize = 4;
    let clients = (0..CLIENTS).map(|c| {
        let coordinator = env.coordinator.clone();
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for t in 0..TRANSFERS {
                let forth = (c + t) % 2 == 0;
                let transfer = match forth {
                    true => TestEnv::transfer(a("hot-a"), b("hot-b"), "1"),
                    false => TestEnv::transfer(b("hot-b"), a("hot-a"), "1"),
                };
                let body = json!({"participants": transfer["participants"], "timeoutMs": 10_000});
                answers.push((forth, post(&coordinator, &body, None, None).await));
            }
            answers
        })
    });
    let answers: Vec<_> = futures::future::join_all(clients).await.into_iter().flat_map(Result::unwrap).collect();

    let mut net = 0i64;
    let mut most = 1;
    for (forth, (status, body)) in &answers {
        assert_eq!(*status, 200, "no transfer is refused for good: {body}");
        most = most.max(body["attempts"].as_u64().unwrap_or(1));
        net += if *forth { 1 } else { -1 };
    }
    assert!(most <= u64::from(MAX_ATTEMPTS), "attempts within the bound: {most}");
    assert_eq!(env.balance("service-a", "hot-a").await, (1000 - net).to_string());
    assert_eq!(env.balance("service-b", "hot-b").await, (1000 + net).to_string());
    assert_no_locks(&env).await;
}

/// An older transaction meeting a younger one's lock that stays (a refusal that persists) waits as long as
/// its deadline allows and then refuses TIMEOUT: never CONFLICT, which only an older holder can cause.
#[tokio::test]
async fn an_older_prepare_outwaited_by_a_younger_lock_refuses_timeout_not_conflict() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    let now = env.clock_now();
    let prepare = |tx: &str, deadline: u64, started_at: u64| raw_prepare(&env, tx, "A", deadline, started_at);
    let participant = &env.participants["service-a"];
    let young = participant.handle(&prepare("tx-young", now + 20_000, now)).await.unwrap();
    assert_eq!(young.vote, Some(Vote::Prepared));

    let started = std::time::Instant::now();
    let old = participant.handle(&prepare("tx-old", now + 400, now - 1_000)).await.unwrap();

    assert_eq!(old.vote, Some(Vote::Refused), "{old:?}");
    assert_eq!(old.code, Some(twopc::model::RefusalCode::Timeout), "{old:?}");
    assert!(started.elapsed() >= Duration::from_millis(150), "it waited: {:?}", started.elapsed());
    // A transaction younger than the holder refuses at once, naming it.
    let younger = participant.handle(&prepare("tx-younger", now + 20_000, now + 1_000)).await.unwrap();
    assert_eq!(younger.code, Some(twopc::model::RefusalCode::Conflict), "{younger:?}");
    assert_eq!(younger.blocked_by.as_deref(), Some("tx-young"));
}

/// A hot lock passes from holder to holder between two looks of an older waiter: it goes on waiting for
/// the new holder without a lock write that could only fail (every waiter of a hot item would send one
/// each time the lock changes hands), and takes the lock once that holder lets go.
#[tokio::test]
async fn an_older_waiter_waits_through_a_handoff_without_a_lock_write() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    let now = env.clock_now();
    let prepare = |tx: &str, deadline: u64, started_at: u64| raw_prepare(&env, tx, "A", deadline, started_at);
    let participant = &env.participants["service-a"];
    let first = participant.handle(&prepare("tx-young-1", now + 20_000, now)).await.unwrap();
    assert_eq!(first.vote, Some(Vote::Prepared));
    let faults = &env.dynamo_faults;
    faults.forget();

    let older = prepare("tx-old", now + 10_000, now - 1_000);
    let waiter = participant.handle(&older);
    let handoff = async {
        while faults.sent("GetItem") == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let lock_writes = faults.sent("UpdateItem");
        assert_eq!(lock_writes, 1, "the waiter's one failed lock write: {:?}", faults.seen());
        // Released by the first holder and taken by a second, younger than the waiter, between two looks.
        env.client
            .update_item()
            .table_name(env.table("service-a"))
            .key("entityId", AttributeValue::S("A".to_owned()))
            .update_expression("SET #lock.#tx = :second, #lock.#started = :started")
            .condition_expression("#lock.#tx = :first")
            .expression_attribute_names("#lock", "lock")
            .expression_attribute_names("#tx", "transactionId")
            .expression_attribute_names("#started", "startedAt")
            .expression_attribute_values(":first", AttributeValue::S("tx-young-1".to_owned()))
            .expression_attribute_values(":second", AttributeValue::S("tx-young-2".to_owned()))
            .expression_attribute_values(":started", AttributeValue::N((now + 1).to_string()))
            .send()
            .await
            .expect("the lock changes hands");
        let looks = faults.sent("GetItem");
        while faults.sent("GetItem") < looks + 3 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(faults.sent("UpdateItem"), lock_writes, "no lock write while the second holder holds it");
        let abort = env.signed(
            "service-a",
            message(json!({"action": "abort", "transactionId": "tx-young-2", "operations": debit("A")})),
        );
        participant.handle(&abort).await.unwrap();
    };
    let (vote, ()) = tokio::join!(waiter, handoff);
    let vote = vote.unwrap();
    assert_eq!(vote.vote, Some(Vote::Prepared), "{vote:?}");
    let item = env.item("service-a", "A").await.expect("A");
    assert_eq!(item["lock"]["transactionId"], "tx-old", "{item}");
}

/// A caller's retry with its token under a key that ran already (the request's own key, or one used with
/// another body) is answered from that key's record: nothing is claimed, so no chain links to itself or to
/// a transaction of another body.
#[tokio::test]
async fn a_token_under_a_key_that_ran_already_claims_nothing() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    // A token lasts the request's timeout after its answer: long enough for the steps below.
    let transfer = |amount: &str| a_to_b(amount, 2_500);
    let (status, refused) = post(&env.coordinator, &transfer("10"), Some("original"), None).await;
    assert_eq!(status, 409, "{refused}");
    let token = refused["ageToken"].as_str().expect("an age token").to_owned();
    let last = refused["transactionId"].as_str().unwrap().to_owned();
    let quick = a_to_b("99", 300);
    let (status, other) = post(&env.coordinator, &quick, Some("used-before"), None).await;
    assert_eq!(status, 409, "{other}");

    let (status, same_key) = post(&env.coordinator, &transfer("10"), Some("original"), Some(&token)).await;
    assert_eq!((status, same_key["transactionId"].as_str()), (409, Some(last.as_str())), "{same_key}");
    let (status, reused) = post(&env.coordinator, &transfer("10"), Some("used-before"), Some(&token)).await;
    assert_eq!((status, reused["error"]["code"].as_str()), (422, Some("IDEMPOTENCY_KEY_REUSED")), "{reused}");

    let (_, last_record) = env.get(&last).await;
    assert!(last_record.get("retriedAs").is_none(), "nothing was claimed: {last_record}");
    // The token still keeps its place for a retry under a fresh key.
    abort_holder(&env, "tx-older", "A").await;
    let (status, retried) = post(&env.coordinator, &transfer("10"), Some("fresh"), Some(&token)).await;
    assert_eq!(status, 200, "{retried}");
    let last_record = env.get(&last).await.1;
    assert_eq!(last_record["ageClaimedBy"], retried["transactionId"], "{last_record}");
    assert!(last_record.get("retriedAs").is_none(), "a token's link is not the coordinator's: {last_record}");
    env.sweep_until_quiet().await;
    assert_eq!(env.balance("service-a", "A").await, "90");
    assert_no_locks(&env).await;
}
