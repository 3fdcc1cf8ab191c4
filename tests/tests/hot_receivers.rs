//! Issue 48, credits that never wait (hot receivers): a recorded prepare's credit (a positive `add` with no
//! guard) takes a pending entry beside the item's lock instead of the lock, so many transactions credit one
//! item at once. Against DynamoDB Local: entries prepared together and each applied once; a put that waits
//! for them to drain and holds new ones back; a debit whose guard counts only committed value; a commit
//! delivered twice, a late copy's entry, a write whose reply was lost, a coordinator that stops; and the
//! pairs with unkeyed, held and one-phase requests, rules, and a participant that takes no entries.

use std::time::Duration;

use serde_json::{Value, json};
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::{Action, ParticipantRequest, ParticipantResponse, RefusalCode, Status, Vote};
use twopc::participant::Participant;
use twopc::participant::credits::{Credit, pending};
use twopc_tests::contention::{assert_no_locks, message};
use twopc_tests::{DynamoFault, DynamoFaults, EdgeFault, Rule, TestEnv};

/// A payment of `amount` from payer `from` (service-a, guarded by min 0) to the merchant `to` (service-b).
fn payment(from: &str, to: &str, amount: &str) -> Value {
    let mut body = TestEnv::transfer(("service-a", from), ("service-b", to), amount);
    body["timeoutMs"] = json!(3_000);
    body
}

async fn raw_item(
    env: &TestEnv,
    service: &str,
    id: &str,
) -> std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue> {
    let key = std::collections::HashMap::from([(
        "entityId".to_owned(),
        aws_sdk_dynamodb::types::AttributeValue::S(id.to_owned()),
    )]);
    env.participants[service].table().get(&key).await.unwrap().expect("the item exists")
}

/// The transactions with a credit pending on the item.
async fn entries(env: &TestEnv, service: &str, id: &str) -> Vec<String> {
    Credit::all(&raw_item(env, service, id).await).into_iter().map(|c| c.transaction_id).collect()
}

/// A message to service-b about the merchant item `M`, as its coordinator would sign it.
fn to_b(env: &TestEnv, value: Value) -> ParticipantRequest {
    env.signed("service-b", message(value))
}

/// The prepare of a credit of `amount` to `M` by `tx`, recorded (its record written first) or not.
fn credit_prepare(env: &TestEnv, tx: &str, amount: i64, started_at: u64, recorded: bool) -> ParticipantRequest {
    let deadline = env.clock_now() + 20_000;
    to_b(
        env,
        json!({"action": "prepare", "transactionId": tx, "deadline": deadline, "startedAt": started_at,
            "recorded": recorded,
            "operations": [{"op": "add", "key": {"entityId": "M"}, "field": "balance", "delta": amount}]}),
    )
}

fn operations_of(request: &ParticipantRequest) -> Value {
    serde_json::to_value(&request.operations).unwrap()
}

fn commit(env: &TestEnv, prepare: &ParticipantRequest, token: &str) -> ParticipantRequest {
    to_b(
        env,
        json!({"action": "commit", "transactionId": prepare.transaction_id, "lockToken": token,
            "operations": operations_of(prepare)}),
    )
}

fn abort(env: &TestEnv, prepare: &ParticipantRequest) -> ParticipantRequest {
    to_b(env, json!({"action": "abort", "transactionId": prepare.transaction_id, "operations": operations_of(prepare)}))
}

async fn handle(env: &TestEnv, request: &ParticipantRequest) -> ParticipantResponse {
    env.participants["service-b"].handle(request).await.expect("the participant answers")
}

/// A PREPARED vote's token.
fn voted(answer: &ParticipantResponse) -> String {
    assert_eq!(answer.vote, Some(Vote::Prepared), "{answer:?}");
    answer.lock_token.clone().expect("a token")
}

/// Polls until `condition` holds of the item, or panics after 5 s.
async fn until_item(env: &TestEnv, service: &str, id: &str, what: &str, condition: impl Fn(&Value) -> bool) {
    let start = std::time::Instant::now();
    loop {
        let item = env.item(service, id).await.unwrap();
        if condition(&item) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "never {what}: {item}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sixteen keyed payments to one merchant at once, their payers' votes held back a little: the merchant carries
/// several pending credits at the same time (an exclusive lock would have let one in at a time), and every
/// payment is applied exactly once.
#[tokio::test]
async fn credits_to_one_item_are_prepared_together_and_each_applied_once() {
    let env = TestEnv::new().await;
    env.put_account("service-b", "M", "0").await;
    for i in 0..16 {
        env.put_account("service-a", &format!("P{i}"), "10").await;
    }
    // Each payer's vote comes 300 ms late: every payment's credit to the merchant is prepared meanwhile.
    env.invoker.set("service-a", Action::Prepare, EdgeFault::DelayReply(Duration::from_millis(300)));
    let payments = (0..16).map(|i| {
        let env = &env;
        async move { env.post(&payment(&format!("P{i}"), "M", "1"), Some(&format!("pay-{i}"))).await }
    });
    let watching = async {
        let mut most = 0;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(3) && most < 4 {
            most = most.max(pending(&raw_item(&env, "service-b", "M").await));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        most
    };
    let (answers, most) = tokio::join!(futures::future::join_all(payments), watching);
    for (status, answer) in &answers {
        assert_eq!((*status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    }
    assert!(most >= 4, "at most {most} credits were pending at once");
    env.settle().await;
    assert_eq!(env.balance("service-b", "M").await, "16");
    assert_no_locks(&env).await;
    // The typed client's replay of one key answers its outcome; the credit is not applied again.
    let (status, replay) = env.post(&payment("P0", "M", "1"), Some("pay-0")).await;
    assert_eq!((status, replay["status"].as_str()), (200, Some("COMMITTED")), "{replay}");
    assert_eq!(env.balance("service-b", "M").await, "16");
}

/// A put on the merchant waits while a credit is pending, and while it waits new credits queue behind it
/// (a younger one is refused, naming the put); once the credit commits, the put locks, and commits.
#[tokio::test]
async fn a_put_waits_for_pending_credits_and_holds_new_ones_back() {
    let env = TestEnv::new().await;
    env.put_account("service-b", "M", "0").await;
    let now = env.clock_now();
    let first = credit_prepare(&env, "tx-credit-1", 5, now - 1_000, true);
    let token = voted(&handle(&env, &first).await);
    assert!(token.starts_with("credit-"), "{token}");
    assert_eq!(entries(&env, "service-b", "M").await, vec!["tx-credit-1".to_owned()]);
    assert!(env.item("service-b", "M").await.unwrap().get("lock").is_none(), "a credit takes no lock");

    let put = to_b(
        &env,
        json!({"action": "prepare", "transactionId": "tx-put", "deadline": now + 20_000, "startedAt": now - 60_000,
            "operations": [{"op": "put", "key": {"entityId": "M"}, "data": {"balance": 7}}]}),
    );
    let putting = tokio::spawn({
        let participant: Participant = env.participants["service-b"].clone();
        let put = put.clone();
        async move { participant.handle(&put).await.unwrap() }
    });
    until_item(&env, "service-b", "M", "marked", |item| item.get("drain").is_some()).await;

    let second = credit_prepare(&env, "tx-credit-2", 3, now, true);
    let refused = handle(&env, &second).await;
    assert_eq!(refused.vote, Some(Vote::Refused), "{refused:?}");
    assert_eq!(refused.code, Some(RefusalCode::Conflict), "{refused:?}");
    assert_eq!(refused.blocked_by.as_deref(), Some("tx-put"), "{refused:?}");
    assert!(!putting.is_finished(), "the put waits while the credit is pending");

    assert_eq!(handle(&env, &commit(&env, &first, &token)).await.status.as_deref(), Some("COMMITTED"));
    let put_token = voted(&putting.await.unwrap());
    let item = env.item("service-b", "M").await.unwrap();
    assert_eq!(item["data"]["balance"], json!(5), "{item}");
    assert!(item.get("drain").is_none(), "the lock removed its marker: {item}");
    assert_eq!(handle(&env, &commit(&env, &put, &put_token)).await.status.as_deref(), Some("COMMITTED"));
    assert_eq!(env.balance("service-b", "M").await, "7");
    assert_no_locks(&env).await;
}

/// A debit guarded by `min` counts only committed value and does not wait for pending credits: refused
/// while the only money is a pending credit (which may still abort), prepared at once beside one once the
/// committed balance covers it; both then commit, in either order.
#[tokio::test]
async fn a_debit_counts_only_committed_value_and_does_not_wait_for_credits() {
    let env = TestEnv::new().await;
    env.put_account("service-b", "M", "0").await;
    let now = env.clock_now();
    let debit = |tx: &str, amount: i64| {
        to_b(
            &env,
            json!({"action": "prepare", "transactionId": tx, "deadline": now + 20_000, "startedAt": now,
                "operations": [{"op": "add", "key": {"entityId": "M"}, "field": "balance", "delta": -amount, "min": 0}]}),
        )
    };
    let credit = credit_prepare(&env, "tx-credit", 10, now - 1_000, true);
    let credit_token = voted(&handle(&env, &credit).await);
    let refused = handle(&env, &debit("tx-debit-1", 5)).await;
    assert_eq!((refused.vote, refused.code), (Some(Vote::Refused), Some(RefusalCode::ConditionFailed)), "{refused:?}");
    // The credit aborts: had the debit counted it, the balance would now be -5.
    assert_eq!(handle(&env, &abort(&env, &credit)).await.status.as_deref(), Some("ABORTED"));
    assert_eq!(env.balance("service-b", "M").await, "0");

    env.put_account("service-b", "M", "10").await;
    let credit = credit_prepare(&env, "tx-credit-2", 4, now - 1_000, true);
    let credit_token_2 = voted(&handle(&env, &credit).await);
    let started = std::time::Instant::now();
    let debit_2 = debit("tx-debit-2", 3);
    let debit_token = voted(&handle(&env, &debit_2).await);
    assert!(started.elapsed() < Duration::from_millis(500), "the debit did not wait for the credit");
    let item = env.item("service-b", "M").await.unwrap();
    assert!(item.get("lock").is_some() && item.get("credit#tx-credit-2").is_some(), "{item}");
    assert_eq!(handle(&env, &commit(&env, &debit_2, &debit_token)).await.status.as_deref(), Some("COMMITTED"));
    assert_eq!(handle(&env, &commit(&env, &credit, &credit_token_2)).await.status.as_deref(), Some("COMMITTED"));
    assert_eq!(env.balance("service-b", "M").await, "11");
    assert_no_locks(&env).await;
    let _ = credit_token;
}

/// A commit delivered twice applies the credit once, although another credit's commit moved `lastTx` in
/// between (which therefore proves nothing); a late copy of the prepare landing after the commit writes an
/// entry with a token no vote reported, which the repeated commit removes without applying.
#[tokio::test]
async fn a_repeated_commit_applies_once_and_a_late_copys_entry_is_removed_unapplied() {
    let env = TestEnv::new().await;
    env.put_account("service-b", "M", "0").await;
    let now = env.clock_now();
    let first = credit_prepare(&env, "tx-first", 5, now, true);
    let token = voted(&handle(&env, &first).await);
    assert_eq!(handle(&env, &commit(&env, &first, &token)).await.status.as_deref(), Some("COMMITTED"));
    let other = credit_prepare(&env, "tx-other", 2, now, true);
    let other_token = voted(&handle(&env, &other).await);
    assert_eq!(handle(&env, &commit(&env, &other, &other_token)).await.status.as_deref(), Some("COMMITTED"));
    assert_eq!(env.item("service-b", "M").await.unwrap()["lastTx"], "tx-other");

    assert_eq!(handle(&env, &commit(&env, &first, &token)).await.status.as_deref(), Some("COMMITTED"));
    assert_eq!(env.balance("service-b", "M").await, "7", "applied once");

    let late = handle(&env, &first).await;
    assert_ne!(late.lock_token.as_deref(), Some(token.as_str()), "a late copy's entry has a token of its own");
    assert_eq!(entries(&env, "service-b", "M").await, vec!["tx-first".to_owned()]);
    assert_eq!(handle(&env, &commit(&env, &first, &token)).await.status.as_deref(), Some("COMMITTED"));
    assert_eq!(env.balance("service-b", "M").await, "7", "the stray entry was not applied");
    assert_no_locks(&env).await;
}

/// The entry's write took effect but its reply was lost: the participant does not write again (the outcome
/// is unknown and the prepare is sent once), the coordinator aborts and removes the entry. The commit's
/// write whose reply was lost is sent again and finds the entry gone: applied once.
#[tokio::test]
async fn writes_whose_reply_was_lost_leave_no_entry_and_apply_no_credit_twice() {
    let faults = DynamoFaults::new(0);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    env.put_account("service-a", "P", "100").await;
    env.put_account("service-b", "M", "0").await;
    let table = env.table("service-b").to_owned();
    faults.add(Rule::new(DynamoFault::LoseReply).operation("UpdateItem").table(&table).body_contains("ADD").nth(1));
    let (status, answer) = env.post(&payment("P", "M", "10"), Some("lost-prepare")).await;
    assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{answer}");
    env.settle().await;
    assert_no_locks(&env).await;
    assert_eq!(env.balance("service-b", "M").await, "0");

    faults.add(Rule::new(DynamoFault::LoseReply).operation("UpdateItem").table(&table).body_contains("REMOVE").nth(1));
    let (status, answer) = env.post(&payment("P", "M", "10"), Some("lost-commit")).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    env.settle().await;
    assert_no_locks(&env).await;
    assert_eq!((env.balance("service-a", "P").await, env.balance("service-b", "M").await), ("90".into(), "10".into()));
}

/// A keyed payment's coordinator stops after the prepares: the merchant carries an entry no index lists;
/// the sweeper finds it through the open record and aborts it. The same with the coordinator stopping after
/// the commit decision: the sweeper applies it, once. A prepare the network held back past the abort writes
/// its entry late: the abort stays open and the sweeper removes it.
#[tokio::test]
async fn the_sweeper_finishes_pending_credits_through_their_records() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "P", "100").await;
    env.put_account("service-b", "M", "0").await;
    let caller = env.coordinator.access().iam(None);
    let past_deadline = |env: &TestEnv| env.clock.advance(3_000 + twopc::sweeper::SweepLimits::default().grace_ms + 1);

    let crashing = env.coordinator_with(&env.invoker, Faults::crash_at(CoordinatorCrash::AfterPrepares(2)));
    let stopped = crashing.submit_by(payment("P", "M", "10").to_string().as_bytes(), Some("stops"), &caller).await;
    assert_eq!(stopped.status, 500, "{}", stopped.body);
    assert_eq!(entries(&env, "service-b", "M").await.len(), 1);
    past_deadline(&env);
    let reports = env.sweep_until_quiet().await;
    assert_eq!(reports.iter().map(|r| r.aborted).sum::<u32>(), 1, "{reports:?}");
    assert_no_locks(&env).await;
    assert_eq!(env.balance("service-b", "M").await, "0");

    let deciding = env.coordinator_with(&env.invoker, Faults::crash_at(CoordinatorCrash::AfterDecision));
    let stopped = deciding.submit_by(payment("P", "M", "10").to_string().as_bytes(), Some("decided"), &caller).await;
    assert_eq!(stopped.status, 500, "{}", stopped.body);
    past_deadline(&env);
    env.sweep_until_quiet().await;
    assert_no_locks(&env).await;
    assert_eq!((env.balance("service-a", "P").await, env.balance("service-b", "M").await), ("90".into(), "10".into()));

    env.invoker.set("service-b", Action::Prepare, EdgeFault::LateDelivery(Duration::from_millis(300)));
    let (status, answer) = env.post(&payment("P", "M", "10"), Some("held-back")).await;
    assert_eq!((status, answer["status"].as_str()), (409, Some("ABORTED")), "{answer}");
    env.settle().await;
    env.invoker.clear();
    assert_eq!(entries(&env, "service-b", "M").await.len(), 1, "the late prepare wrote its entry");
    let id = answer["transactionId"].as_str().unwrap();
    assert_eq!(env.transactions.get(id).await.unwrap().unwrap().status, Status::Aborting);
    past_deadline(&env);
    env.sweep_until_quiet().await;
    assert_no_locks(&env).await;
    assert_eq!(env.balance("service-b", "M").await, "10");
}

/// A proxy's copy of a prepare writes a stray entry after the payment committed. The next exclusive lock on
/// the item meets it once its owner's deadline passed, finds the owner's record ended, and removes it
/// unapplied.
#[tokio::test]
async fn a_stray_entry_is_resolved_from_its_owners_record_by_the_next_exclusive_lock() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "P", "100").await;
    env.put_account("service-b", "M", "0").await;
    env.invoker.set("service-b", Action::Prepare, EdgeFault::ProxyCopy(Duration::from_millis(300)));
    let (status, first) = env.post(&payment("P", "M", "10"), Some("copied")).await;
    assert_eq!((status, first["status"].as_str()), (200, Some("COMMITTED")), "{first}");
    env.invoker.clear();
    let (status, between) = env.post(&payment("P", "M", "1"), Some("between")).await;
    assert_eq!((status, between["status"].as_str()), (200, Some("COMMITTED")), "{between}");
    env.settle().await;
    assert_eq!(entries(&env, "service-b", "M").await, vec![first["transactionId"].as_str().unwrap().to_owned()]);

    env.clock.advance(3_000 + 2 * twopc::clock::CLOCK_MARGIN_MS + 1);
    let mut put = TestEnv::transfer(("service-a", "P"), ("service-b", "M"), "0");
    put["participants"] = json!([
        {"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "P"}, "field": "balance", "delta": -1, "min": 0}]},
        {"service": "service-b", "operations": [{"op": "set", "key": {"entityId": "M"}, "set": {"owner": "shop"}}]}
    ]);
    let (status, answer) = env.post(&put, Some("set")).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_no_locks(&env).await;
    assert_eq!(env.balance("service-b", "M").await, "11", "the stray entry was removed, not applied");
}

/// The pairs. An unkeyed payment, a held one and a participant that takes no entries (the first deploy of
/// an upgrade) take the lock as before; the last still commits an entry another participant wrote. A
/// one-phase credit applies at once. A participant with rules takes the lock for its credits.
#[tokio::test]
async fn unkeyed_held_and_old_style_credits_take_the_lock_and_every_kind_commits() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "P", "100").await;
    env.put_account("service-b", "M", "0").await;
    let caller = env.coordinator.access().iam(None);
    let crashing = env.coordinator_with(&env.invoker, Faults::crash_at(CoordinatorCrash::AfterPrepares(2)));
    let unkeyed = crashing.submit_by(payment("P", "M", "1").to_string().as_bytes(), None, &caller).await;
    assert_eq!(unkeyed.status, 500, "{}", unkeyed.body);
    let item = env.item("service-b", "M").await.unwrap();
    assert!(item.get("lock").is_some() && entries(&env, "service-b", "M").await.is_empty(), "{item}");
    env.clock.advance(3_000 + twopc::sweeper::SweepLimits::default().grace_ms + 1);
    env.sweep_until_quiet().await;
    assert_no_locks(&env).await;

    let mut held = payment("P", "M", "1");
    held["holdMs"] = json!(60_000);
    let (status, answer) = env.post(&held, Some("held")).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("PREPARED")), "{answer}");
    assert!(env.item("service-b", "M").await.unwrap().get("lock").is_some(), "a held credit takes the lock");
    let committed = env.coordinator.commit_held_by(answer["transactionId"].as_str().unwrap(), &caller).await;
    assert_eq!(committed.body["status"], "COMMITTED", "{}", committed.body);

    let mut sole = payment("P", "M", "1");
    sole["participants"] = json!([{"service": "service-b", "operations": [
        {"op": "add", "key": {"entityId": "M"}, "field": "balance", "delta": 1}]}]);
    let (status, answer) = env.post(&sole, Some("sole")).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_no_locks(&env).await;
    assert_eq!(env.balance("service-b", "M").await, "2");

    // A participant of the first deploy (PENDING_CREDITS=off) locks a recorded credit, and commits an
    // entry the other wrote.
    let old_style = env.participants["service-b"].clone().with_pending_credits(false);
    let now = env.clock_now();
    let locked = credit_prepare(&env, "tx-old-style", 1, now, true);
    let token = voted(&old_style.handle(&locked).await.unwrap());
    assert!(!token.starts_with("credit-") && env.item("service-b", "M").await.unwrap().get("lock").is_some());
    assert_eq!(old_style.handle(&commit(&env, &locked, &token)).await.unwrap().status.as_deref(), Some("COMMITTED"));
    let entry = credit_prepare(&env, "tx-entry", 1, now, true);
    let token = voted(&handle(&env, &entry).await);
    assert_eq!(old_style.handle(&commit(&env, &entry, &token)).await.unwrap().status.as_deref(), Some("COMMITTED"));
    assert_eq!(env.balance("service-b", "M").await, "4");

    #[derive(Clone)]
    struct Anything;
    impl twopc::participant::Rules for Anything {
        fn check(&self, _: &twopc::participant::Prepared<'_>) -> Result<(), twopc::participant::Refusal> {
            Ok(())
        }
    }
    // Rules judge the item as it will be locked: a rule's credit takes the lock, not an entry (a rule would
    // otherwise pass on a value that leaves out the credits already pending).
    let judged = env.participants["service-b"].clone().with_rules(Anything);
    let locked = credit_prepare(&env, "tx-judged", 1, now, true);
    let token = voted(&judged.handle(&locked).await.unwrap());
    assert!(!token.starts_with("credit-") && entries(&env, "service-b", "M").await.is_empty(), "{token}");
    assert_eq!(judged.handle(&commit(&env, &locked, &token)).await.unwrap().status.as_deref(), Some("COMMITTED"));
    assert_eq!(env.balance("service-b", "M").await, "5");
    assert_no_locks(&env).await;
}

/// What the model leaves out, sizes: at most 32 credits are pending on an item (the 33rd, younger than all
/// of them, is refused `CONFLICT` naming one, and its retry keeps its age); an entry that would take the
/// item past 400 KB is refused `CONDITION_FAILED` with DynamoDB's reason and writes nothing; a credit
/// whose result, with every credit pending on the field, would not fit a DynamoDB number is refused and
/// its entry removed.
#[tokio::test]
async fn entries_are_capped_sized_and_counted_in_the_number_check() {
    let env = TestEnv::new().await;
    env.put_account("service-b", "M", "0").await;
    let now = env.clock_now();
    let mut prepared = Vec::new();
    for i in 0..twopc::participant::credits::MAX_PENDING_CREDITS {
        let prepare = credit_prepare(&env, &format!("tx-cap-{i:02}"), 1, now - 10_000 + i, true);
        let token = voted(&handle(&env, &prepare).await);
        prepared.push((prepare, token));
    }
    let over = handle(&env, &credit_prepare(&env, "tx-cap-over", 1, now, true)).await;
    assert_eq!((over.vote, over.code), (Some(Vote::Refused), Some(RefusalCode::Conflict)), "{over:?}");
    assert!(over.blocked_by.as_deref().is_some_and(|owner| owner.starts_with("tx-cap-")), "{over:?}");
    for (prepare, token) in &prepared {
        assert_eq!(handle(&env, &commit(&env, prepare, token)).await.status.as_deref(), Some("COMMITTED"));
    }
    assert_eq!(env.balance("service-b", "M").await, "32");
    assert_no_locks(&env).await;

    // An item 60 bytes under 400 KB: its entry (more than 60 bytes) would pass the limit.
    let sized = |note: usize| {
        let item = json!({"entityId": "BIG", "data": {"balance": 0, "note": "x".repeat(note)}, "version": 0});
        twopc::size::item_size(&twopc::attr::to_item(item.as_object().unwrap()))
    };
    let note = twopc::size::MAX_ITEM_BYTES - 60 - sized(0);
    assert_eq!(sized(note), twopc::size::MAX_ITEM_BYTES - 60);
    env.put_data("service-b", "BIG", &json!({"balance": 0, "note": "x".repeat(note)})).await;
    let big = to_b(
        &env,
        json!({"action": "prepare", "transactionId": "tx-big", "deadline": now + 20_000, "startedAt": now,
            "recorded": true,
            "operations": [{"op": "add", "key": {"entityId": "BIG"}, "field": "balance", "delta": 1}]}),
    );
    let refused = handle(&env, &big).await;
    assert_eq!((refused.vote, refused.code), (Some(Vote::Refused), Some(RefusalCode::ConditionFailed)), "{refused:?}");
    assert!(refused.reason.as_deref().is_some_and(|r| r.contains("400 KB")), "{refused:?}");
    assert!(entries(&env, "service-b", "BIG").await.is_empty());

    // Pending with the balance of 32: a credit that makes it 38 nines, the most digits DynamoDB keeps; one
    // more of 2 (10^38 + 1, 39 digits) could never be applied.
    let large = to_b(
        &env,
        json!({"action": "prepare", "transactionId": "tx-nines", "deadline": now + 20_000, "startedAt": now,
            "recorded": true,
            "operations": [{"op": "add", "key": {"entityId": "M"}, "field": "balance",
                "delta": format!("{}67", "9".repeat(36))}]}),
    );
    voted(&handle(&env, &large).await);
    let one_more = handle(&env, &credit_prepare(&env, "tx-one-more", 2, now, true)).await;
    assert_eq!(
        (one_more.vote, one_more.code),
        (Some(Vote::Refused), Some(RefusalCode::ConditionFailed)),
        "{one_more:?}"
    );
    assert!(one_more.reason.as_deref().is_some_and(|r| r.contains("pending")), "{one_more:?}");
    assert_eq!(
        entries(&env, "service-b", "M").await,
        vec!["tx-nines".to_owned()],
        "the refused credit's entry is removed"
    );
    assert_eq!(handle(&env, &abort(&env, &large)).await.status.as_deref(), Some("ABORTED"));
    assert_no_locks(&env).await;
}

/// A one-phase `set` on the merchant (its only participant) waits for the pending credit, commits once it
/// drained, and leaves no marker behind to hold later credits back. A read-only check of the merchant's
/// `version` does not read past a pending credit (it waits for it); one of whether it exists does.
#[tokio::test]
async fn a_one_phase_set_and_a_version_check_wait_for_pending_credits_and_leave_no_marker() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "P", "100").await;
    env.put_account("service-b", "M", "0").await;
    let now = env.clock_now();
    let pending = credit_prepare(&env, "tx-pending", 5, now - 60_000, true);
    let token = voted(&handle(&env, &pending).await);

    let mut set = payment("P", "M", "0");
    set["participants"] = json!([{"service": "service-b", "operations": [
        {"op": "set", "key": {"entityId": "M"}, "set": {"owner": "shop"}}]}]);
    let setting = async { env.post(&set, Some("one-phase-set")).await };
    let checking = async {
        let version = to_b(
            &env,
            json!({"action": "prepare", "transactionId": "tx-check", "deadline": now + 20_000, "startedAt": now - 90_000,
                "operations": [{"op": "check", "key": {"entityId": "M"}, "version": 0}]}),
        );
        handle(&env, &version).await
    };
    let exists = to_b(
        &env,
        json!({"action": "prepare", "transactionId": "tx-exists", "deadline": now + 20_000, "startedAt": now,
            "operations": [{"op": "check", "key": {"entityId": "M"}, "exists": true}]}),
    );
    let read = handle(&env, &exists).await;
    assert_eq!((read.vote, read.read_only), (Some(Vote::Prepared), true), "{read:?}");
    let committing = async {
        until_item(&env, "service-b", "M", "marked", |item| item.get("drain").is_some()).await;
        handle(&env, &commit(&env, &pending, &token)).await
    };
    let ((status, answer), check, committed) = tokio::join!(setting, checking, committing);
    assert_eq!(committed.status.as_deref(), Some("COMMITTED"));
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    // The check waited for the credit, and then found the version it moved.
    assert_eq!((check.vote, check.code), (Some(Vote::Refused), Some(RefusalCode::ConditionFailed)), "{check:?}");
    let item = env.item("service-b", "M").await.unwrap();
    assert!(item.get("drain").is_none(), "no marker left: {item}");
    assert_eq!((item["data"]["owner"].as_str(), item["data"]["balance"].as_i64()), (Some("shop"), Some(5)), "{item}");
    assert_no_locks(&env).await;
}
