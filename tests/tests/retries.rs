//! Retries that keep every contract (issue 41): where the coordinator's retries of a contention refusal
//! meet holds, keys, age tokens, GET and the `tx:` topics. Against DynamoDB Local.

use std::time::Duration;

use serde_json::{Value, json};
use twopc::coordinator::{Coordinator, caller_idempotent_id};
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::Action;
use twopc_tests::contention::*;
use twopc_tests::{DynamoFault, DynamoFaults, EdgeFault, Rule, TestEnv};

const ALICE: &str = "arn:aws:iam::123456789012:user/alice";

/// A transfer of `amount` from A to B with its own `timeoutMs`, held `hold_ms` when given.
fn a_to_b(amount: &str, timeout_ms: u64, hold_ms: Option<u64>) -> Value {
    let mut body =
        json!({"participants": TestEnv::transfer(a("A"), b("B"), amount)["participants"], "timeoutMs": timeout_ms});
    if let Some(hold_ms) = hold_ms {
        body["holdMs"] = json!(hold_ms);
    }
    body
}

async fn post_as(
    coordinator: &Coordinator,
    body: &Value,
    key: Option<&str>,
    token: Option<&str>,
    principal: Option<&str>,
) -> (u16, Value) {
    let caller = coordinator.access().iam(principal);
    let reply = coordinator.submit_retry_by(body.to_string().as_bytes(), key, token, &caller).await;
    (reply.status, reply.body)
}

async fn post(coordinator: &Coordinator, body: &Value, key: Option<&str>, token: Option<&str>) -> (u16, Value) {
    post_as(coordinator, body, key, token, None).await
}

/// Defect 1: the caller aborts a held request while its first attempt is still preparing (its prepare at
/// A refused for contention, the answer late). The caller's abort decides: the coordinator's own retry
/// must not bring the request back as a second attempt that holds, and could commit, what the caller
/// rejected.
#[tokio::test]
async fn a_callers_abort_of_a_held_request_is_not_overridden_by_a_retry() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let invoker = env.fresh_invoker();
    // The refusal reaches the coordinator late: the caller's abort lands while the attempt is preparing.
    invoker.set("service-a", Action::Prepare, EdgeFault::DelayReply(Duration::from_millis(400)));
    let coordinator = env.coordinator_with(&invoker, Faults::default());
    let first = caller_idempotent_id(Some(ALICE), "held-then-aborted");
    let client = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            let body = a_to_b("10", 3_000, Some(5_000));
            post_as(&coordinator, &body, Some("held-then-aborted"), None, Some(ALICE)).await
        })
    };
    while env.transactions.get(&first).await.unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let caller = coordinator.access().iam(Some(ALICE));
    let aborted = coordinator.abort_held_by(&first, &caller).await;
    assert_eq!((aborted.status, aborted.body["status"].as_str()), (200, Some("ABORTED")), "{}", aborted.body);
    // The holder goes: a retry, were there one, would now prepare and hold.
    refused_once(&invoker).await;
    abort_holder(&env, "tx-older", "A").await;
    let (status, answer) = client.await.unwrap();

    assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{answer}");
    assert_eq!(answer["transactionId"], first.as_str(), "{answer}");
    assert!(answer.get("ageToken").is_none(), "no token for an abort that was not a contention refusal: {answer}");
    assert!(env.transactions.get(&format!("{first}-2")).await.unwrap().is_none(), "no second attempt");
    let record = env.transactions.get(&first).await.unwrap().unwrap();
    assert_eq!(record.retried_as, None, "{record:?}");
    env.sweep_until_quiet().await;
    assert_eq!(env.balance("service-a", "A").await, "100");
    assert_no_locks(&env).await;
}

/// Defect 1, the other half: a held request retried once (the first attempt refused for contention)
/// is held as its second attempt; a commit sent to the first attempt's id, the one its caller knows,
/// commits the attempt that lives.
#[tokio::test]
async fn a_held_requests_commit_sent_to_its_first_attempt_commits_the_attempt_that_lives() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let invoker = env.fresh_invoker();
    let coordinator = env.coordinator_with(&invoker, Faults::default());
    let client = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            let body = a_to_b("10", 3_000, Some(5_000));
            post_as(&coordinator, &body, Some("held-retried"), None, Some(ALICE)).await
        })
    };
    refused_once(&invoker).await;
    abort_holder(&env, "tx-older", "A").await;
    let (status, held) = client.await.unwrap();
    assert_eq!((status, held["status"].as_str()), (202, Some("PREPARED")), "{held}");
    let first = caller_idempotent_id(Some(ALICE), "held-retried");
    assert_eq!(held["transactionId"], format!("{first}-2"), "{held}");

    let caller = coordinator.access().iam(Some(ALICE));
    let committed = coordinator.commit_held_by(&first, &caller).await;

    assert_eq!((committed.status, committed.body["status"].as_str()), (200, Some("COMMITTED")), "{}", committed.body);
    assert_eq!(committed.body["transactionId"], format!("{first}-2"));
    assert_eq!(env.balance("service-a", "A").await, "90");
    assert_eq!(env.balance("service-b", "B").await, "10");
    assert_no_locks(&env).await;
}

/// A refusal that persists until the request's attempts and time are spent: a final 409 with an age
/// token, under `key`.
async fn refused_with_token(env: &TestEnv, body: &Value, key: &str) -> (Value, String) {
    let (status, refused) = post(&env.coordinator, body, Some(key), None).await;
    assert_eq!(status, 409, "{refused}");
    let token = refused["ageToken"].as_str().expect("a refusal for contention carries an age token").to_owned();
    (refused, token)
}

/// Defect 3: a key answered 409 ABORTED (final) keeps that answer after a caller's token retry under
/// another key commits: the token retry is a new request, answered under its own key, linked to the
/// request whose age it keeps by `ageOf` and never by `retriedAs`.
#[tokio::test]
async fn a_keys_final_answer_stays_after_a_token_retry_under_another_key_commits() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let body = a_to_b("10", 2_500, None);
    let (refused, token) = refused_with_token(&env, &body, "first-key").await;
    let (status, again) = post(&env.coordinator, &body, Some("first-key"), None).await;
    assert_eq!((status, &again["transactionId"]), (409, &refused["transactionId"]), "{again}");

    abort_holder(&env, "tx-older", "A").await;
    let (status, retried) = post(&env.coordinator, &body, Some("second-key"), Some(&token)).await;
    assert_eq!((status, retried["status"].as_str()), (200, Some("COMMITTED")), "{retried}");

    let (status, after) = post(&env.coordinator, &body, Some("first-key"), None).await;
    assert_eq!((status, after["status"].as_str()), (409, Some("ABORTED")), "{after}");
    assert_eq!(after["transactionId"], refused["transactionId"]);
    assert_eq!(retried["ageOf"], refused["transactionId"], "{retried}");
    assert_eq!(
        retried["firstTransactionId"].as_str().unwrap_or(retried["transactionId"].as_str().unwrap()),
        retried["transactionId"].as_str().unwrap(),
        "a token retry is a request of its own: {retried}"
    );
    let (_, refused_record) = env.get(refused["transactionId"].as_str().unwrap()).await;
    assert!(refused_record.get("retriedAs").is_none(), "{refused_record}");
    assert_eq!(refused_record["ageClaimedBy"], retried["transactionId"], "{refused_record}");
    assert_eq!(env.balance("service-a", "A").await, "90");
}

/// Defect 2: a token retry whose record could not be written (DynamoDB refused the write, 503) claimed
/// nothing: the refused request's key keeps its own answer and the token keeps its place; the same
/// caller's other body under the retry's key is a request of its own that the first key never answers.
#[tokio::test]
async fn a_token_retry_whose_record_was_not_written_claims_nothing() {
    let faults = DynamoFaults::new(41);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    a_held_by_an_older_transaction(&env).await;
    // A token lasts the request's timeout after its answer. The throttled writes' retries take up to about
    // nine seconds (three coordinator attempts of three SDK attempts, with jittered backoff).
    let body = a_to_b("10", 12_000, None);
    let (refused, token) = refused_with_token(&env, &body, "original").await;
    let retry_id = caller_idempotent_id(None, "retry-key");
    // Every write that creates the retry's record is refused (throttled): certainly not applied.
    for operation in ["PutItem", "TransactWriteItems"] {
        let rule = Rule::new(DynamoFault::Throttle).operation(operation).table(env.transactions.table());
        faults.add(rule.body_contains(&retry_id).sticky());
    }
    abort_holder(&env, "tx-older", "A").await;
    let (status, failed) = post(&env.coordinator, &body, Some("retry-key"), Some(&token)).await;
    assert_eq!(status, 503, "{failed}");
    faults.clear();
    let refused_id = refused["transactionId"].as_str().unwrap();
    let (_, record) = env.get(refused_id).await;
    assert!(record.get("retriedAs").is_none() && record.get("ageClaimedBy").is_none(), "{record}");

    // The token keeps its place for a retry under a fresh key (first: the token's time is running).
    let (status, retried) = post(&env.coordinator, &body, Some("fresh-key"), Some(&token)).await;
    assert_eq!((status, retried["status"].as_str()), (200, Some("COMMITTED")), "{retried}");
    // Another body under the retry's key commits as a request of its own.
    let other = a_to_b("7", 2_500, None);
    let (status, other_answer) = post(&env.coordinator, &other, Some("retry-key"), None).await;
    assert_eq!((status, other_answer["status"].as_str()), (200, Some("COMMITTED")), "{other_answer}");
    let (status, original) = post(&env.coordinator, &body, Some("original"), None).await;
    assert_eq!((status, &original["transactionId"]), (409, &refused["transactionId"]), "{original}");
    assert_eq!(env.balance("service-a", "A").await, "83");
}

/// Defect 4: an attempt fenced on a caller's behalf (claimed by its stopped coordinator, never begun) is
/// that caller's: its GET answers it, as the key's answer named it.
#[tokio::test]
async fn an_attempt_fenced_on_a_callers_behalf_is_shown_to_that_caller() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let body = a_to_b("10", 1_000, None);
    let invoker = env.fresh_invoker();
    let crashing = env.coordinator_with(&invoker, Faults::crash_at(CoordinatorCrash::AfterClaim));
    let releaser = {
        let (env_transactions, clock, invoker) = (env.transactions.clone(), env.clock.clone(), invoker.clone());
        tokio::spawn(async move {
            refused_once(&invoker).await;
            use twopc::clock::Clock;
            env_transactions.abort_if_absent("tx-older", clock.now_ms(), "aborted by the test").await.unwrap();
        })
    };
    let (status, crashed) = post_as(&crashing, &body, Some("fenced"), None, Some(ALICE)).await;
    releaser.await.unwrap();
    assert_eq!(status, 500, "the injected crash: {crashed}");
    let first = caller_idempotent_id(Some(ALICE), "fenced");

    let (status, answer) = post_as(&env.coordinator, &body, Some("fenced"), None, Some(ALICE)).await;
    assert_eq!((status, answer["transactionId"].clone()), (409, json!(format!("{first}-2"))), "{answer}");

    let caller = env.coordinator.access().iam(Some(ALICE));
    let seen = env.coordinator.get_by(&format!("{first}-2"), &caller).await;
    assert_eq!((seen.status, seen.body["status"].as_str()), (200, Some("ABORTED")), "{}", seen.body);
    let record = env.transactions.get(&format!("{first}-2")).await.unwrap().unwrap();
    assert_eq!(record.principal.as_deref(), Some(ALICE));
}

/// A token retry whose one write (the claim of the refused attempt's age and its own record) took effect
/// but whose reply was lost: the SDK's retry meets its own write and the retry runs once; late and
/// duplicated copies of its prepares change nothing.
#[tokio::test]
async fn a_token_retry_survives_a_lost_reply_of_its_claim() {
    let faults = DynamoFaults::new(4102);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    a_held_by_an_older_transaction(&env).await;
    let body = a_to_b("10", 6_000, None);
    let (refused, token) = refused_with_token(&env, &body, "original").await;
    faults
        .add(Rule::new(DynamoFault::LoseReply).operation("TransactWriteItems").table(env.transactions.table()).nth(1));
    abort_holder(&env, "tx-older", "A").await;
    let invoker = env.fresh_invoker();
    invoker.set("service-a", Action::Prepare, EdgeFault::LateCopy(Duration::from_millis(200)));
    let coordinator = env.coordinator_with(&invoker, Faults::default());

    let (status, retried) = post(&coordinator, &body, Some("retry"), Some(&token)).await;
    env.settle().await;
    env.sweep_until_quiet().await;

    assert_eq!((status, retried["status"].as_str()), (200, Some("COMMITTED")), "{retried}");
    assert_eq!(faults.fired(), 1, "the claim's reply was lost once");
    let (_, refused_record) = env.get(refused["transactionId"].as_str().unwrap()).await;
    assert_eq!(refused_record["ageClaimedBy"], retried["transactionId"], "{refused_record}");
    assert_eq!(env.balance("service-a", "A").await, "90", "applied once");
    assert_eq!(env.balance("service-b", "B").await, "10", "applied once");
    assert_no_locks(&env).await;
}

/// A held request whose caller aborts it while its coordinator's retry is named but not begun: the
/// abort fences the next attempt, which is its request's as any attempt is (held, its caller's, its
/// key's). Found by the bank test: a decision sent to that attempt's id, which the POST's answer names,
/// was answered 409 NOT_HELD. Now the abort sent there answers 200 ABORTED and a commit 409 ABORTED.
#[tokio::test]
async fn a_fenced_attempt_of_a_held_request_answers_its_callers_decisions() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let invoker = env.fresh_invoker();
    // The coordinator stops once the refused attempt names its successor: the caller's abort fences it.
    let crashing = env.coordinator_with(&invoker, Faults::crash_at(CoordinatorCrash::AfterClaim));
    let body = a_to_b("10", 3_000, Some(5_000));
    let (status, crashed) = post_as(&crashing, &body, Some("held-fenced"), None, Some(ALICE)).await;
    assert_eq!(status, 500, "the injected crash: {crashed}");
    let first = caller_idempotent_id(Some(ALICE), "held-fenced");
    let caller = env.coordinator.access().iam(Some(ALICE));
    let aborted = env.coordinator.abort_held_by(&first, &caller).await;
    assert_eq!((aborted.status, aborted.body["status"].as_str()), (200, Some("ABORTED")), "{}", aborted.body);
    let next = format!("{first}-2");
    assert_eq!(aborted.body["transactionId"], next.as_str(), "{}", aborted.body);

    let again = env.coordinator.abort_held_by(&next, &caller).await;
    assert_eq!((again.status, again.body["status"].as_str()), (200, Some("ABORTED")), "{}", again.body);
    let commit = env.coordinator.commit_held_by(&next, &caller).await;
    assert_eq!((commit.status, commit.body["status"].as_str()), (409, Some("ABORTED")), "{}", commit.body);
    let seen = env.coordinator.get_by(&next, &caller).await;
    assert_eq!((seen.body["attempts"].clone(), seen.body["firstTransactionId"].clone()), (json!(2), json!(first)));
    abort_holder(&env, "tx-older", "A").await;
    env.sweep_until_quiet().await;
    assert_eq!(env.balance("service-a", "A").await, "100");
    assert_no_locks(&env).await;
}

/// The caller's abort of a held request reads the attempt still PREPARING, and the coordinator's own
/// abort naming the next attempt lands before the caller's write (which then loses): the abort must
/// follow the chain to the next attempt, not answer 200 ABORTED for the attempt it read while the
/// request goes on as the next one, held and committable. Found in review of issue 41.
#[tokio::test]
async fn a_held_abort_that_loses_to_the_coordinators_retry_follows_it() {
    let faults = DynamoFaults::new(4103);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    a_held_by_an_older_transaction(&env).await;
    let invoker = env.fresh_invoker();
    // The refusal reaches the coordinator late, so the attempt stays PREPARING a while.
    invoker.set("service-a", Action::Prepare, EdgeFault::DelayReply(Duration::from_millis(300)));
    let coordinator = env.coordinator_with(&invoker, Faults::default());
    let first = caller_idempotent_id(Some(ALICE), "held-raced");
    let client = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            let body = a_to_b("10", 3_000, Some(5_000));
            post_as(&coordinator, &body, Some("held-raced"), None, Some(ALICE)).await
        })
    };
    while env.transactions.get(&first).await.unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The abort route's read of the attempt is answered late: it reads PREPARING, and the coordinator's
    // abort (with retriedAs) lands before the route writes its own.
    faults.add(
        Rule::new(DynamoFault::Late(Duration::from_millis(900)))
            .operation("GetItem")
            .table(env.transactions.table())
            .body_contains(&first)
            .nth(1),
    );
    let caller = coordinator.access().iam(Some(ALICE));
    let abort = {
        let (coordinator, first, caller) = (coordinator.clone(), first.clone(), caller.clone());
        tokio::spawn(async move { coordinator.abort_held_by(&first, &caller).await })
    };
    refused_once(&invoker).await;
    abort_holder(&env, "tx-older", "A").await;
    let aborted = abort.await.unwrap();
    let (status, answer) = client.await.unwrap();
    assert_eq!(faults.fired(), 1, "the route's read was answered late");

    assert_eq!((aborted.status, aborted.body["status"].as_str()), (200, Some("ABORTED")), "{}", aborted.body);
    // The POST answered before or after the abort took effect: refused, or held as the attempt the abort
    // then reached; either way that attempt is aborted now, and so is the request.
    match (status, answer["status"].as_str()) {
        (409, Some("ABORTED")) => {}
        (202, Some("PREPARED")) => {
            let held = answer["transactionId"].as_str().unwrap();
            assert_eq!(aborted.body["transactionId"], held, "the abort reached the held attempt: {}", aborted.body);
            let (_, now) = env.get(held).await;
            assert_eq!(now["status"], "ABORTED", "{now}");
        }
        _ => panic!("{status} {answer}"),
    }
    let commit = coordinator.commit_held_by(&first, &caller).await;
    assert_eq!((commit.status, commit.body["status"].as_str()), (409, Some("ABORTED")), "{}", commit.body);
    env.sweep_until_quiet().await;
    assert_eq!(env.balance("service-a", "A").await, "100");
    assert_no_locks(&env).await;
}

/// The refused attempt's abort takes the time the next attempt needed (a participant slow to release):
/// the next attempt, named already, is recorded ABORTED without beginning (no prepare of it is sent), and
/// its abort is the answer. A request starts no attempt with less than 100 ms before its deadline.
#[tokio::test]
async fn a_named_attempt_left_no_time_by_its_predecessors_abort_never_begins() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let invoker = env.fresh_invoker();
    invoker.set("service-b", Action::Abort, EdgeFault::DelayReply(Duration::from_millis(900)));
    let coordinator = env.coordinator_with(&invoker, Faults::default());

    let (status, answer) = post(&coordinator, &a_to_b("10", 1_000, None), Some("slow-release"), None).await;

    let first = caller_idempotent_id(None, "slow-release");
    let next = format!("{first}-2");
    assert_eq!((status, answer["transactionId"].as_str()), (409, Some(next.as_str())), "{answer}");
    let record = env.transactions.get(&next).await.unwrap().expect("the named attempt is recorded");
    assert_eq!(record.reason.as_deref(), Some("too little time was left before the deadline to begin this attempt"));
    assert!(invoker.calls().iter().all(|c| c.transaction_id != next), "the named attempt sent nothing");
    abort_holder(&env, "tx-older", "A").await;
    env.sweep_until_quiet().await;
    assert_eq!(env.balance("service-a", "A").await, "100");
    assert_no_locks(&env).await;
}

// --- Issue 42: age tokens only the coordinator can mint; a chain is its first attempt's caller's and body's.

const MALLORY: &str = "arn:aws:iam::123456789012:user/mallory";

/// An age token as the coordinator signed them before issue 42 (`twopc/age-token/v1`, under the request's
/// first participant service's message key), made by whoever holds that key: that service's participant,
/// and so its operator. Any age, any attempt to claim.
fn forged_with_participant_key(body: &Value, principal: &str, retry_of: &str, now: u64) -> String {
    let request =
        twopc::model::TransactionRequest::parse(body.to_string().as_bytes(), |_| true).expect("a valid request");
    let key = twopc::auth::LocalKeys::key_set("service-a").keys[0].clone();
    let age = json!({
        "startedAt": 1, "principal": principal, "bodyHash": request.canonical_hash(),
        "firstTransactionId": "tx-forged", "retryOf": retry_of, "attempt": 2,
        "expiresAt": now + 600_000, "keyId": key.id, "service": "service-a",
    });
    let payload = serde_json::to_vec(&age).unwrap();
    let mut signed = b"twopc/age-token/v1\n".to_vec();
    signed.extend_from_slice(&payload);
    let mac = twopc::auth::hmac_sha256(key.secret.as_bytes(), &signed);
    format!("{}.{}", hex::encode(&payload), hex::encode(mac))
}

/// Issue 42, item 2: another service's operator holds its participant's message key. A token it signs
/// with that key (any age, `retryOf` another principal's refused transaction) is refused 400
/// INVALID_AGE_TOKEN and writes nothing: the other transaction gets no link, its owner's key still answers
/// its own outcome, and its owner's own token still keeps its place.
#[tokio::test]
async fn an_age_token_signed_with_a_participants_key_is_refused() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let body = a_to_b("10", 2_500, None);
    let (status, refused) = post_as(&env.coordinator, &body, Some("alice-key"), None, Some(ALICE)).await;
    assert_eq!((status, refused["status"].as_str()), (409, Some("ABORTED")), "{refused}");
    let alices_token = refused["ageToken"].as_str().expect("a refusal for contention carries a token").to_owned();
    let victim = refused["transactionId"].as_str().unwrap().to_owned();
    let before = env.records().await.len();

    let theirs = a_to_b("1", 2_500, None);
    let forged = forged_with_participant_key(&theirs, MALLORY, &victim, env.clock_now());
    let (status, answer) = post_as(&env.coordinator, &theirs, None, Some(&forged), Some(MALLORY)).await;

    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("INVALID_AGE_TOKEN")), "{answer}");
    assert_eq!(env.records().await.len(), before, "nothing written");
    assert!(env.transactions.get("tx-forged-r2").await.unwrap().is_none());
    let record = env.transactions.get(&victim).await.unwrap().unwrap();
    assert_eq!((record.retried_as, record.age_claimed_by), (None, None), "no link on the victim's transaction");
    let (status, again) = post_as(&env.coordinator, &body, Some("alice-key"), None, Some(ALICE)).await;
    assert_eq!((status, again["transactionId"].as_str()), (409, Some(victim.as_str())), "{again}");
    // The owner's own token keeps its place.
    abort_holder(&env, "tx-older", "A").await;
    let (status, retried) = post_as(&env.coordinator, &body, None, Some(&alices_token), Some(ALICE)).await;
    assert_eq!((status, retried["status"].as_str()), (200, Some("COMMITTED")), "{retried}");
    assert_eq!(env.balance("service-a", "A").await, "90");
}

/// How a chain's next attempt is not its request's: written by someone else under the id the
/// coordinator named (its caller, or its body, another).
#[derive(Clone, Copy, Debug)]
enum Foreign {
    Principal,
    Body,
}

/// A record at `id`, the attempt `earlier`'s `retriedAs` names, that is not `earlier`'s request's: as a
/// writer with the participants' unconditional PutItem on the transactions table could put it.
async fn put_foreign_attempt(env: &TestEnv, earlier: &str, id: &str, status: &str, foreign: Foreign) {
    let mut item = env.raw_record(earlier).await.expect("the earlier attempt is recorded");
    use aws_sdk_dynamodb::types::AttributeValue as Av;
    for name in ["retriedAs", "refusedForContention", "ageClaimedBy", "reason", "expireAt", "openShard", "sweepAt"] {
        item.remove(name);
    }
    item.insert("transactionId".into(), Av::S(id.to_owned()));
    item.insert("status".into(), Av::S(status.to_owned()));
    item.insert("attempt".into(), Av::N("2".into()));
    item.insert("firstTransactionId".into(), Av::S(earlier.to_owned()));
    item.insert("executionId".into(), Av::S("f".repeat(32)));
    if status == "PREPARED" {
        item.insert("holdUntil".into(), Av::N((env.clock_now() + 60_000).to_string()));
    }
    match foreign {
        Foreign::Principal => {
            item.insert("principal".into(), Av::S(MALLORY.to_owned()));
        }
        Foreign::Body => {
            for name in ["requestHash", "bodyHash"] {
                item.insert(name.into(), Av::S("f".repeat(64)));
            }
        }
    }
    env.client.put_item().table_name(env.transactions.table()).set_item(Some(item)).send().await.expect("put");
}

/// Alice's keyed request refused once; its coordinator stops once the abort names the next attempt.
async fn alices_request_stopped_after_naming(env: &TestEnv, key: &str, hold_ms: Option<u64>) -> String {
    let invoker = env.fresh_invoker();
    let crashing = env.coordinator_with(&invoker, Faults::crash_at(CoordinatorCrash::AfterClaim));
    let (status, crashed) = post_as(&crashing, &a_to_b("10", 3_000, hold_ms), Some(key), None, Some(ALICE)).await;
    assert_eq!(status, 500, "the injected crash: {crashed}");
    let first = caller_idempotent_id(Some(ALICE), key);
    let record = env.transactions.get(&first).await.unwrap().unwrap();
    assert_eq!(record.successor(), Some(format!("{first}-2").as_str()), "{record:?}");
    first
}

/// Issue 47, one outcome per request: a request whose coordinator stopped once its refused attempt named
/// the next one ends although nobody reads it again. The link and the next attempt's record are one write:
/// the crash leaves that attempt PREPARING, its request's (its caller, its key's hash, its place in the
/// chain), in the open index; before the deadline the sweeper leaves it to its coordinator; past it, the
/// sweeper aborts it as any abandoned attempt, and its end is the one outcome the outcomes function
/// announces. Keyed and not (an unkeyed refused attempt's ABORTED record is created with the next one),
/// stopped after the refused attempt's end or before it (the sweeper ends both), with the sweeper's abort
/// reply lost (the SDK's retry finds its own write) and two sweepers at the same time.
#[tokio::test]
async fn a_request_whose_coordinator_stopped_after_naming_its_next_attempt_is_ended_by_the_sweeper() {
    let cases = [
        (Some("stopped"), CoordinatorCrash::AfterClaim),
        (None, CoordinatorCrash::AfterClaim),
        (Some("early"), CoordinatorCrash::BeforeTerminal),
    ];
    for (key, crash) in cases {
        let faults = DynamoFaults::new(4147);
        let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
        a_held_by_an_older_transaction(&env).await;
        let invoker = env.fresh_invoker();
        let crashing = env.coordinator_with(&invoker, Faults::crash_at(crash));
        let (status, crashed) = post_as(&crashing, &a_to_b("10", 3_000, None), key, None, Some(ALICE)).await;
        assert_eq!(status, 500, "the injected crash: {crashed}");
        let records = env.records().await;
        let refused = records.iter().find(|r| r["retriedAs"].is_string()).expect("the refused attempt");
        let first = refused["transactionId"].as_str().unwrap().to_owned();
        let next = refused["retriedAs"].as_str().unwrap().to_owned();

        // The link's attempt has a record from the start: its request's, open, never begun.
        let named = env.transactions.get(&next).await.unwrap().expect("the named attempt has a record");
        assert_eq!(named.status, twopc::model::Status::Preparing, "{named:?}");
        assert_eq!((named.first_id(), named.attempt_number()), (first.as_str(), 2), "its request's second attempt");
        assert_eq!(named.principal.as_deref(), Some(ALICE));
        assert!(env.raw_record(&next).await.unwrap().contains_key("openShard"), "in the open index");
        assert!(invoker.calls().iter().all(|c| c.transaction_id != next), "never begun: nothing sent for it");

        env.sweep_until_quiet().await;
        let named = env.transactions.get(&next).await.unwrap().unwrap();
        assert_eq!(named.status, twopc::model::Status::Preparing, "before its deadline it is its coordinator's");

        env.clock.advance(3_000 + twopc::sweeper::SweepLimits::default().grace_ms);
        let table = env.transactions.table();
        faults.add(Rule::new(DynamoFault::LoseReply).operation("UpdateItem").table(table).body_contains(&next).nth(1));
        let (one, two) = (env.sweeper(None), env.sweeper(None));
        let (a, b) = futures::join!(one.sweep(), two.sweep());
        a.expect("sweep");
        b.expect("sweep");
        assert_eq!(faults.fired(), 1, "the sweeper's write's reply lost once");
        faults.clear();
        env.sweep_until_quiet().await;

        for id in [&first, &next] {
            let record = env.transactions.get(id).await.unwrap().unwrap();
            assert_eq!(record.status, twopc::model::Status::Aborted, "{record:?}");
            assert!(!env.raw_record(id).await.unwrap().contains_key("openShard"), "{id} left the open index");
        }

        // The request's outcome: one event, for the attempt the sweeper aborted, under the request's first id.
        let config = twopc_fanout::FanoutConfig::new(&Default::default(), table).expect("config");
        let events: Vec<_> = twopc_tests::outcomes::transactions_stream(&env)
            .await
            .iter()
            .filter_map(|r| twopc_fanout::outcomes::outcome_of(&config, r).expect("readable"))
            .filter(|e| e.detail["firstTransactionId"] == first.as_str())
            .collect();
        let ids: std::collections::BTreeSet<String> = events.iter().map(|e| e.outcome_id()).collect();
        assert_eq!(ids, [format!("{next}:ABORTED")].into(), "{events:?}");
        if let Some(key) = key {
            let (status, answer) =
                post_as(&env.coordinator, &a_to_b("10", 3_000, None), Some(key), None, Some(ALICE)).await;
            assert_eq!((status, answer["transactionId"].as_str()), (409, Some(next.as_str())), "{answer}");
        }
        assert_eq!(env.balance("service-a", "A").await, "100");
    }
}

/// Issue 47: the coordinator's write of its refused attempt's abort with the next attempt's record (one
/// `TransactWriteItems`) took effect and its reply was lost: the SDK's retry finds both written, the
/// coordinator knows the attempt it created by its execution, begins it and commits once the older holder
/// lets go: one commit, nothing applied twice.
#[tokio::test]
async fn the_link_and_its_records_write_survives_a_lost_reply() {
    for key in [Some("lost-link"), None] {
        let faults = DynamoFaults::new(4148);
        let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
        a_held_by_an_older_transaction(&env).await;
        let table = env.transactions.table().to_owned();
        faults.add(Rule::new(DynamoFault::LoseReply).operation("TransactWriteItems").table(&table).nth(1));
        let invoker = env.fresh_invoker();
        let coordinator = env.coordinator_with(&invoker, Faults::default());
        let release = async {
            refused_once(&invoker).await;
            abort_holder(&env, "tx-older", "A").await;
        };
        let body = a_to_b("10", 3_000, None);
        let ((status, answer), ()) = futures::join!(post_as(&coordinator, &body, key, None, Some(ALICE)), release);
        assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
        assert_eq!(faults.fired(), 1, "the link's write lost its reply");
        assert_eq!(answer["attempts"], 2, "{answer}");
        assert_eq!(env.balance("service-a", "A").await, "90", "applied once");
        assert_eq!(env.balance("service-b", "B").await, "10", "applied once");
    }
}

/// Review of the link with its record (issue 47): the caller's abort of a held request follows the chain to
/// the attempt its coordinator created with the link, before that attempt began (the refused attempt's
/// release is slow). The coordinator reads the attempt before beginning it, finds it aborted, answers 409
/// from it and never prepares it: no lock is taken that nobody would release before it expires.
#[tokio::test]
async fn an_attempt_aborted_before_it_began_is_never_begun() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let invoker = env.fresh_invoker();
    invoker.set("service-a", Action::Abort, EdgeFault::DelayReply(std::time::Duration::from_millis(400)));
    let coordinator = env.coordinator_with(&invoker, Faults::default());
    let first = caller_idempotent_id(Some(ALICE), "aborted-early");
    let next = format!("{first}-2");
    let body = a_to_b("10", 3_000, Some(5_000));
    let caller = env.coordinator.access().iam(Some(ALICE));
    let abort = async {
        while env.transactions.get(&next).await.unwrap().is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        env.coordinator.abort_held_by(&first, &caller).await
    };
    let ((status, answer), aborted) =
        futures::join!(post_as(&coordinator, &body, Some("aborted-early"), None, Some(ALICE)), abort);

    assert_eq!(
        (aborted.status, aborted.body["transactionId"].as_str()),
        (200, Some(next.as_str())),
        "{}",
        aborted.body
    );
    assert_eq!(
        (status, answer["status"].as_str(), answer["transactionId"].as_str()),
        (409, Some("ABORTED"), Some(next.as_str())),
        "{answer}"
    );
    let prepared_next = invoker.calls().iter().any(|c| c.transaction_id == next && c.action == Action::Prepare);
    assert!(!prepared_next, "the aborted attempt was never begun");
    abort_holder(&env, "tx-older", "A").await;
    assert_no_locks(&env).await;
    assert_eq!(env.balance("service-a", "A").await, "100");
}

/// Issue 42, item 2: a key's replay follows its chain only through attempts of its own request (its
/// first attempt's caller and body). An attempt named by the chain but written by someone else (another
/// caller, another body) is not followed: the key answers its own last attempt, and the other record is
/// left as it is.
#[tokio::test]
async fn a_keys_replay_does_not_follow_its_chain_into_another_request() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    for (key, foreign) in [("replay-principal", Foreign::Principal), ("replay-body", Foreign::Body)] {
        let first = alices_request_stopped_after_naming(&env, key, None).await;
        let next = format!("{first}-2");
        put_foreign_attempt(&env, &first, &next, "COMMITTED", foreign).await;

        let (status, answer) =
            post_as(&env.coordinator, &a_to_b("10", 3_000, None), Some(key), None, Some(ALICE)).await;

        assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{foreign:?}: {answer}");
        assert_eq!(answer["transactionId"], first.as_str(), "{foreign:?}: {answer}");
    }
}

/// Issue 42, item 2: a held request's commit sent to its first attempt follows the chain only through
/// attempts of its own request: a PREPARED record of another caller (or another body) under the id the
/// chain names is neither committed nor aborted by it.
#[tokio::test]
async fn a_held_commit_does_not_follow_its_chain_into_another_request() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let caller = env.coordinator.access().iam(Some(ALICE));
    for (key, foreign) in [("held-principal", Foreign::Principal), ("held-body", Foreign::Body)] {
        let first = alices_request_stopped_after_naming(&env, key, Some(5_000)).await;
        let next = format!("{first}-2");
        put_foreign_attempt(&env, &first, &next, "PREPARED", foreign).await;

        let commit = env.coordinator.commit_held_by(&first, &caller).await;

        assert_eq!(
            (commit.status, commit.body["status"].as_str(), commit.body["transactionId"].as_str()),
            (409, Some("ABORTED"), Some(first.as_str())),
            "{foreign:?}: {}",
            commit.body
        );
        let other = env.transactions.get(&next).await.unwrap().unwrap();
        assert_eq!(other.status, twopc::model::Status::Prepared, "{foreign:?}: left as it is");
        let abort = env.coordinator.abort_held_by(&first, &caller).await;
        assert_eq!(abort.body["transactionId"], first.as_str(), "{foreign:?}: {}", abort.body);
        let other = env.transactions.get(&next).await.unwrap().unwrap();
        assert_eq!(other.status, twopc::model::Status::Prepared, "{foreign:?}: left as it is");
    }
}

/// Issue 42, item 2: a token's claim takes the age only of an attempt of the token's caller and body: a
/// refused attempt whose recorded caller (or body hash) is another's is refused 400 INVALID_AGE_TOKEN,
/// nothing written, even with a token the coordinator signed.
#[tokio::test]
async fn a_tokens_claim_of_an_attempt_of_another_caller_or_body_is_refused() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let body = a_to_b("10", 2_500, None);
    for (key, foreign) in [("claim-principal", Foreign::Principal), ("claim-body", Foreign::Body)] {
        let (status, refused) = post_as(&env.coordinator, &body, Some(key), None, Some(ALICE)).await;
        assert_eq!(status, 409, "{refused}");
        let token = refused["ageToken"].as_str().expect("a token").to_owned();
        let refused_id = refused["transactionId"].as_str().unwrap().to_owned();
        use aws_sdk_dynamodb::types::AttributeValue as Av;
        let (set, values) = match foreign {
            Foreign::Principal => ("SET principal = :p", vec![(":p", Av::S(MALLORY.into()))]),
            Foreign::Body => ("SET requestHash = :h, bodyHash = :h", vec![(":h", Av::S("f".repeat(64)))]),
        };
        let mut update = env
            .client
            .update_item()
            .table_name(env.transactions.table())
            .key("transactionId", Av::S(refused_id.clone()))
            .update_expression(set);
        for (name, value) in values {
            update = update.expression_attribute_values(name, value);
        }
        update.send().await.expect("update");
        let before = env.records().await.len();

        let (status, answer) = post_as(&env.coordinator, &body, None, Some(&token), Some(ALICE)).await;

        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("INVALID_AGE_TOKEN")),
            "{foreign:?}: {answer}"
        );
        assert_eq!(env.records().await.len(), before, "{foreign:?}: nothing written");
        let record = env.transactions.get(&refused_id).await.unwrap().unwrap();
        assert_eq!(record.age_claimed_by, None, "{foreign:?}");
    }
}

/// Issue 48's answer on decision meets a caller's token retry and a held request. A token retry that
/// prefers `respond-async` is answered 202 COMMITTING on its decision, keeps the refused request's age
/// (`ageOf`) and ends COMMITTED after the answer; a held request that prefers it is answered at its hold
/// (202 PREPARED), not on a decision it does not have, and its caller's commit decides as before.
#[tokio::test]
async fn a_token_retry_and_a_held_request_meet_the_answer_on_decision() {
    let env = TestEnv::new().await;
    a_held_by_an_older_transaction(&env).await;
    let body = a_to_b("10", 2_500, None);
    let (refused, token) = refused_with_token(&env, &body, "refused-key").await;
    abort_holder(&env, "tx-older", "A").await;
    let early = env
        .coordinator_with(&env.fresh_invoker(), Faults::default())
        .with_after_answer(std::sync::Arc::new(twopc::after_answer::Spawned));
    let caller = early.access().iam(None);

    let bytes = body.to_string().into_bytes();
    let retried = early.submit_preferring(&bytes, Some("retry-key"), Some(&token), &caller, true).await;
    assert_eq!((retried.status, retried.body["status"].as_str()), (202, Some("COMMITTING")), "{}", retried.body);
    assert!(retried.answered_on_decision);
    assert_eq!(retried.body["ageOf"], refused["transactionId"], "{}", retried.body);
    let id = retried.body["transactionId"].as_str().unwrap().to_owned();
    // The second phase runs after the answer, as a task: until it ends the record, within a bound.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while env.get(&id).await.1["status"] != "COMMITTED" {
        assert!(std::time::Instant::now() < until, "the second phase after the answer never ended {id}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let held = a_to_b("5", 2_500, Some(60_000)).to_string().into_bytes();
    let answer = early.submit_preferring(&held, Some("held-key"), None, &caller, true).await;
    assert_eq!((answer.status, answer.body["status"].as_str()), (202, Some("PREPARED")), "{}", answer.body);
    assert!(!answer.answered_on_decision, "a hold is not a decision");
    let committed = early.commit_held_by(answer.body["transactionId"].as_str().unwrap(), &caller).await;
    assert_eq!((committed.status, committed.body["status"].as_str()), (200, Some("COMMITTED")), "{}", committed.body);
    assert_eq!(env.balance("service-a", "A").await, "85");
    assert_eq!(env.balance("service-b", "B").await, "15");
    assert_no_locks(&env).await;
}
