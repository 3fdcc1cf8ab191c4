//! Issue 29: participants accept only the coordinator's and the sweeper's messages. Against DynamoDB
//! Local, through `Participant::handle` (the one entry the Lambda handler, the local stack and the tests
//! all use): unsigned, wrongly signed, replayed-from-another-transaction and stale messages of every
//! action change nothing; the attacks an account's other principals could make before change nothing;
//! keys rotate without a refused message.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use twopc::auth::{CachedKeys, Key, KeySet, KeySource, LocalKeys, MemoryKeys};
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::{ParticipantRequest, ParticipantResponse};
use twopc::participant::{Participant, ParticipantError};
use twopc_tests::{TestEnv, call_coordinator, rest_event};

fn message(value: Value) -> ParticipantRequest {
    serde_json::from_value(value).expect("a participant message")
}

async fn post_via(coordinator: &twopc::coordinator::Coordinator, body: &Value) -> (u16, Value) {
    let event = rest_event("POST", "/transactions", "/transactions", None, json!({}), Some(&body.to_string()));
    call_coordinator(coordinator, &event).await
}

/// Everything a participant's table holds, to tell that a refused message changed nothing.
async fn tables(env: &TestEnv) -> Vec<Value> {
    let mut all = vec![];
    for participant in env.participants.values() {
        let mut items: Vec<Value> = env
            .scan(participant.table().name())
            .await
            .iter()
            .map(|i| Value::Object(twopc::attr::item_to_json(i)))
            .collect();
        items.sort_by_key(|i| i["entityId"].to_string());
        all.extend(items);
    }
    all.extend(env.records().await);
    all
}

fn refused(answer: &Result<ParticipantResponse, ParticipantError>) -> bool {
    matches!(answer, Err(ParticipantError::Unauthenticated(_)))
}

/// A transfer of 10 from A to B is prepared (its coordinator stopped after the prepares): both items hold
/// its locks. Before, any principal allowed to invoke a participant could then: commit A without the lock
/// token with its own operation (+1000 landed on a lock taken for -10); abort B although the record says
/// COMMITTING; commit in one phase with a record that says ABORTED. Now every such message, and every
/// other forgery, is refused before anything is done, for every action.
#[tokio::test]
async fn forged_and_stale_messages_of_every_action_change_nothing() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    let stopped = env.coordinator_with(&env.fresh_invoker(), Faults::crash_at(CoordinatorCrash::AfterPrepares(2)));
    let (status, answer) = post_via(&stopped, &TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "10")).await;
    assert_eq!(status, 500, "{answer}");
    let tx = answer["transactionId"].as_str().unwrap().to_owned();
    let before = tables(&env).await;
    let a = &env.participants["service-a"];
    let now = env.clock_now();
    let add = |delta: i64| json!([{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": delta}]);

    let commit_plus_1000 = message(json!({"action": "commit", "transactionId": tx, "operations": add(1000)}));
    let abort = message(json!({"action": "abort", "transactionId": tx, "operations": add(-10)}));
    let prepare = message(json!({"action": "prepare", "transactionId": "tx-forged", "deadline": now + 10_000,
        "startedAt": now, "operations": add(-50)}));
    let record = json!({"transactionId": "tx-one", "status": "ABORTED", "participants": [], "createdAt": now,
        "updatedAt": now, "deadline": now + 10_000});
    let one_phase = message(json!({"action": "commit", "transactionId": "tx-one", "deadline": now + 10_000,
        "startedAt": now, "operations": add(1000), "onePhaseRecord": record}));
    let another_key = KeySet::single("local", &"k".repeat(32));
    for message in [commit_plus_1000, abort, prepare, one_phase] {
        let action =
            format!("{:?}{}", message.action, if message.one_phase_record.is_some() { " (one phase)" } else { "" });
        // Unsigned.
        assert!(refused(&a.handle(&message).await), "{action}: unsigned");
        // Signed with a key that is not service-a's (another service's, or one of nobody's).
        let for_b = env.signed("service-b", message.clone());
        assert!(refused(&a.handle(&for_b).await), "{action}: signed for service-b");
        let foreign = twopc::auth::sign_with(&another_key, "service-a", &message, now).unwrap();
        assert!(refused(&a.handle(&foreign).await), "{action}: another key");
        // A genuine signature, moved to another transaction.
        let mut moved = env.signed("service-a", message.clone());
        moved.transaction_id = "tx-elsewhere".into();
        assert!(refused(&a.handle(&moved).await), "{action}: replayed for another transaction");
        // Stale: signed longer ago than a copy may arrive.
        let old = now - twopc::auth::MAX_MESSAGE_AGE_MS - twopc::clock::CLOCK_MARGIN_MS - 1_000;
        let stale = twopc::auth::sign_with(&LocalKeys::key_set("service-a"), "service-a", &message, old).unwrap();
        assert!(refused(&a.handle(&stale).await), "{action}: stale");
        assert_eq!(tables(&env).await, before, "{action}: a refused message changed nothing");
    }

    // The coordinator's own messages still go through: the sweeper finishes the transfer, once.
    env.clock.advance(60_000);
    env.sweep_until_quiet().await;
    assert_eq!(env.balance("service-a", "A").await, "100", "the unrecorded transfer was aborted");
    assert_eq!(env.get(&tx).await.1["status"], "ABORTED");
    assert!(env.locked_items().await.is_empty());
}

/// A participant with a cached copy of the keys (the deployed setting) and a coordinator with its own:
/// a new key added with `notBefore` one cache TTL ahead is in every cache before anyone signs with it,
/// and the old one is removed once every signer has moved on. Transfers run the whole time: none is
/// refused. Added to be used at once instead, the new key is refused by a participant whose cache still
/// has only the old one: that is why the wait.
#[tokio::test]
async fn keys_rotate_without_a_refused_message() {
    let env = TestEnv::new().await;
    let store = MemoryKeys::new();
    let first = Key { id: "k1".into(), secret: "first key of the test".into(), not_before: 0 };
    for service in ["service-a", "service-b"] {
        store.set(service, KeySet { keys: vec![first.clone()] });
    }
    let ttl = Duration::from_millis(400);
    let cached = || -> Arc<dyn KeySource> { Arc::new(CachedKeys::new(store.clone(), ttl)) };
    let participants: Vec<Participant> = env.participants.values().map(|p| p.clone().with_keys(cached())).collect();
    let invoker = twopc_tests::FaultyInvoker::new(twopc::invoke::InProcessInvoker::new(participants));
    let coordinator = env.coordinator_with(&invoker, Faults::default()).with_keys(cached());
    env.put_account("service-a", "A", "1000").await;
    env.put_account("service-b", "B", "0").await;
    let transfer = TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "1");
    let mut committed = 0;
    let transfer_for = |until: Instant| {
        let (coordinator, transfer) = (coordinator.clone(), transfer.clone());
        async move {
            let mut done = 0;
            while Instant::now() < until {
                let (status, answer) = post_via(&coordinator, &transfer).await;
                assert_eq!(status, 200, "every transfer commits during the rotation: {answer}");
                done += 1;
            }
            done
        }
    };
    // Warm every cache with k1 alone.
    committed += transfer_for(Instant::now() + ttl / 2).await;
    // Rotate: k2 signs from one TTL (and a margin) from now; meanwhile everyone learns it.
    let second = Key {
        id: "k2".into(),
        secret: "second key of the test".into(),
        not_before: env.clock_now() + ttl.as_millis() as u64 + 100,
    };
    for service in ["service-a", "service-b"] {
        store.set(service, KeySet { keys: vec![first.clone(), second.clone()] });
    }
    committed += transfer_for(Instant::now() + ttl * 3).await;
    // Every signer signs with k2 now: k1 goes.
    for service in ["service-a", "service-b"] {
        store.set(service, KeySet { keys: vec![second.clone()] });
    }
    committed += transfer_for(Instant::now() + ttl * 2).await;
    assert_eq!(env.balance("service-b", "B").await, committed.to_string());

    // Rotated without the wait: a participant whose cache still holds only k2 refuses k3 for up to a TTL.
    let participant = env.participants["service-a"].clone().with_keys(cached());
    let probe = message(json!({"action": "abort", "transactionId": "tx-probe",
        "operations": [{"op": "delete", "key": {"entityId": "nothing"}}]}));
    let now = env.clock_now();
    let signed = |set: &KeySet| twopc::auth::sign_with(set, "service-a", &probe, now).unwrap();
    assert!(participant.handle(&signed(&KeySet { keys: vec![second.clone()] })).await.is_ok(), "k2 is cached");
    let third = Key { id: "k3".into(), secret: "third key of the test".into(), not_before: 0 };
    store.set("service-a", KeySet { keys: vec![second.clone(), third.clone()] });
    let answer = participant.handle(&signed(&KeySet { keys: vec![third] })).await;
    assert!(refused(&answer), "a key used before the caches have it is refused: {answer:?}");
}

// ---------------------------------------------------------------------------------------------------
// A service's own rules
// ---------------------------------------------------------------------------------------------------

/// A world whose service-a participant judges by `rules`.
fn with_rules(env: &TestEnv, rules: impl twopc::participant::Rules + Clone) -> twopc::coordinator::Coordinator {
    let participants: Vec<Participant> = env
        .participants
        .iter()
        .map(|(service, p)| if service == "service-a" { p.clone().with_rules(rules.clone()) } else { p.clone() })
        .collect();
    let invoker = twopc_tests::FaultyInvoker::new(twopc::invoke::InProcessInvoker::new(participants));
    env.coordinator_with(&invoker, Faults::default())
}

/// POST /transactions as `caller` (an IAM caller's ARN in API Gateway's request context).
async fn post_as(coordinator: &twopc::coordinator::Coordinator, body: &Value, caller: &str) -> (u16, Value) {
    let mut event = rest_event("POST", "/transactions", "/transactions", None, json!({}), Some(&body.to_string()));
    event["requestContext"]["identity"]["userArn"] = json!(caller);
    call_coordinator(coordinator, &event).await
}

/// What a rule saw: the item's version and the caller's principal.
type Seen = (Option<u64>, Option<String>);
/// Another writer's change, made between a rule's read and the lock.
type Meanwhile = Option<Box<dyn FnOnce() + Send>>;

/// Only the account's owner may debit it, and a closed account takes nothing; what each call saw is kept.
#[derive(Clone, Default)]
struct Bank {
    seen: Arc<std::sync::Mutex<Vec<Seen>>>,
    /// Called on the first judgement, between the read and the lock.
    meanwhile: Arc<std::sync::Mutex<Meanwhile>>,
}

impl twopc::participant::Rules for Bank {
    fn check(&self, prepared: &twopc::participant::Prepared<'_>) -> Result<(), twopc::participant::Refusal> {
        self.seen.lock().unwrap().push((prepared.version, prepared.principal.map(str::to_owned)));
        if let Some(change) = self.meanwhile.lock().unwrap().take() {
            change();
        }
        let data = prepared.data.ok_or_else(|| twopc::participant::Refusal::new("NO_ACCOUNT", "no such account"))?;
        if data.get("status").and_then(Value::as_str) == Some("closed") {
            return Err(twopc::participant::Refusal::new("ACCOUNT_CLOSED", "the account is closed"));
        }
        if let Some(owner) = data.get("owner").and_then(Value::as_str)
            && Some(owner) != prepared.principal
        {
            return Err(twopc::participant::Refusal::new("NOT_OWNER", format!("only {owner} may debit it")));
        }
        Ok(())
    }
}

/// A rule refuses with the service's own code and reason: the vote is REFUSED with the code RULE, the
/// service's code in `serviceCode`; the answer and GET say so, and nothing is locked or applied. The
/// caller's principal reaches the rule in its canonical form (an assumed role without its session), and
/// is recorded on the transaction.
#[tokio::test]
async fn a_rule_refuses_with_its_own_code_and_the_principal_reaches_it() {
    let env = TestEnv::new().await;
    let teller = "arn:aws:sts::123456789012:assumed-role/Teller";
    env.put_data("service-a", "A", &json!({"balance": 100, "owner": teller})).await;
    env.put_account("service-b", "B", "0").await;
    let bank = Bank::default();
    let coordinator = with_rules(&env, bank.clone());
    let transfer = TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "10");

    let (status, answer) =
        post_as(&coordinator, &transfer, "arn:aws:sts::123456789012:assumed-role/Intruder/s-1").await;
    assert_eq!(status, 409, "{answer}");
    let vote = &answer["participants"][0];
    assert_eq!((vote["code"].as_str(), vote["serviceCode"].as_str()), (Some("RULE"), Some("NOT_OWNER")), "{answer}");
    assert_eq!(vote["reason"], format!("only {teller} may debit it"));
    assert_eq!(env.get(answer["transactionId"].as_str().unwrap()).await.1, answer);
    assert!(env.locked_items().await.is_empty());

    let (status, answer) = post_as(&coordinator, &transfer, &format!("{teller}/session-42")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(env.balance("service-a", "A").await, "90");
    let seen = bank.seen.lock().unwrap().clone();
    assert_eq!(seen.last().unwrap().1.as_deref(), Some(teller), "the canonical principal: {seen:?}");
    let record = env.records().await.into_iter().find(|r| r["transactionId"] == answer["transactionId"]).unwrap();
    assert_eq!(record["principal"], teller);
}

/// A rule judges the item as it will be locked: here the account is closed by another writer between
/// the rule's read and the lock write. The lock write, conditioned on the version the rule saw, fails;
/// the prepare reads again, the rule sees the closed account and refuses. (Without the condition the lock
/// was taken on an account the rule never saw closed, and the debit committed.)
#[tokio::test]
async fn a_rule_judges_the_item_as_it_is_locked() {
    let env = TestEnv::new().await;
    env.put_data("service-a", "A", &json!({"balance": 100, "status": "open"})).await;
    env.put_account("service-b", "B", "0").await;
    let bank = Bank::default();
    let table = env.table("service-a").to_owned();
    *bank.meanwhile.lock().unwrap() = Some(Box::new(move || {
        // Another writer, on a thread of its own (a rule runs inside the prepare): close the account.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let data = twopc::attr::to_attribute(&json!({"balance": 100, "status": "closed"}));
                // A client of its own: the test's is bound to the runtime this rule is blocking.
                twopc_tests::dynamodb()
                    .await
                    .update_item()
                    .table_name(table)
                    .key("entityId", aws_sdk_dynamodb::types::AttributeValue::S("A".into()))
                    .update_expression("SET #d = :d, version = version + :one")
                    .expression_attribute_names("#d", "data")
                    .expression_attribute_values(":d", data)
                    .expression_attribute_values(":one", aws_sdk_dynamodb::types::AttributeValue::N("1".into()))
                    .send()
                    .await
                    .unwrap();
            })
        })
        .join()
        .unwrap();
    }));
    let coordinator = with_rules(&env, bank.clone());

    let (status, answer) =
        post_via(&coordinator, &TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "10")).await;

    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["participants"][0]["serviceCode"], "ACCOUNT_CLOSED", "{answer}");
    let versions: Vec<Option<u64>> = bank.seen.lock().unwrap().iter().map(|(v, _)| *v).collect();
    assert_eq!(versions, vec![Some(0), Some(1)], "judged again on the item as it then was");
    assert_eq!(env.balance("service-a", "A").await, "100");
    assert!(env.locked_items().await.is_empty());
}

/// The generic participant has no rules and reads nothing more than before: a transfer's prepares are
/// their lock writes alone.
#[tokio::test]
async fn a_participant_without_rules_reads_nothing_before_it_locks() {
    let faults = twopc_tests::DynamoFaults::new(0);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "B", "0").await;
    faults.forget();
    let (status, answer) = env.post(&TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "10"), None).await;
    assert_eq!(status, 200, "{answer}");
    let reads = faults.sent("GetItem") + faults.sent("BatchGetItem");
    assert_eq!(reads, 0, "{:?}", faults.seen().iter().map(|s| s.operation.clone()).collect::<Vec<_>>());
}
