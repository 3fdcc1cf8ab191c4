//! Issue 31: resources beyond DynamoDB, through the example payments service (a resource participant:
//! try authorizes, confirm captures, cancel voids) against the stand-in payment API over HTTP, with its
//! faults: a try that times out and is answered later, an authorization that lands after its void, a
//! cancel before the try, a try after the cancel or after the end, a repeated confirm, a capture that
//! fails for good; and an order across three services that commits everywhere or nowhere.

use std::time::Duration;

use local_services::payments::{DECLINED_CARD, Endpoint, PaymentFault};
use serde_json::{Value, json};
use twopc::model::{Action, ParticipantRequest, Vote};
use twopc_tests::TestEnv;

const CARD: &str = "4242424242424242";

async fn world() -> TestEnv {
    let env = TestEnv::with_services(&["service-a", "inventory", "payments"]).await;
    env.put_account("service-a", "W", "100").await;
    env.put_data("inventory", "lamp", &inventory::sku("Lamp", 10, true)).await;
    env
}

/// An order: two lamps reserved, `amount` cents charged on `card`, 20 debited from wallet W.
fn order(reference: &str, card: &str, amount: u64, timeout_ms: u64) -> Value {
    json!({"participants": [
        {"service": "inventory", "operations": [inventory::reserve("lamp", 2)]},
        {"service": "payments", "operations": [payments::charge(reference, card, amount)]},
        {"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "W"}, "field": "balance", "delta": -20, "min": 0}]}
    ], "timeoutMs": timeout_ms})
}

fn charge_only(reference: &str, amount: u64, timeout_ms: u64) -> Value {
    json!({"participants": [{"service": "payments", "operations": [payments::charge(reference, CARD, amount)]}], "timeoutMs": timeout_ms})
}

fn api(env: &TestEnv) -> &local_services::payments::PaymentApi {
    env.payment_api.as_deref().expect("the payments service's API")
}

async fn state(env: &TestEnv) -> (String, String, String) {
    let lamp = env.item("inventory", "lamp").await.unwrap();
    let wallet = env.item("service-a", "W").await.unwrap();
    (lamp["data"]["stock"].to_string(), lamp["data"]["reserved"].to_string(), wallet["data"]["balance"].to_string())
}

fn statuses(env: &TestEnv) -> Vec<String> {
    api(env).authorizations().into_iter().map(|a| a.status).collect()
}

/// The order commits at all three: stock reserved, the card charged (authorized, then captured), the
/// wallet debited; with a declined card nothing of it is applied and nothing is held.
#[tokio::test]
async fn an_order_across_three_services_commits_everywhere_or_nowhere() {
    let env = world().await;
    let (status, answer) = env.post(&order("order-1", CARD, 1500, 5000), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_eq!(state(&env).await, ("8".into(), "2".into(), "80".into()));
    assert_eq!(statuses(&env), ["captured"]);
    let authorization = &api(&env).authorizations()[0];
    assert_eq!((authorization.amount, authorization.reference.as_str()), (1500, "order-1"));

    let (status, answer) = env.post(&order("order-2", DECLINED_CARD, 1500, 5000), None).await;
    assert_eq!(status, 409, "{answer}");
    let vote = answer["participants"].as_array().unwrap().iter().find(|p| p["service"] == "payments").unwrap();
    assert_eq!(
        (vote["code"].as_str(), vote["serviceCode"].as_str()),
        (Some("RULE"), Some("CARD_DECLINED")),
        "{answer}"
    );
    assert_eq!(state(&env).await, ("8".into(), "2".into(), "80".into()), "nothing of the declined order");
    assert_eq!(statuses(&env), ["captured"], "nothing held for the declined card");
    env.sweep_until_quiet().await;
    assert!(api(&env).held().is_empty());
}

/// A resource's only operation never commits in one phase: it cannot share a write with the record.
#[tokio::test]
async fn a_charge_alone_commits_in_two_phases() {
    let env = world().await;
    let (status, answer) = env.post(&charge_only("solo", 700, 5000), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_eq!(statuses(&env), ["captured"]);
    let actions: Vec<Action> = env.invoker.calls().iter().map(|c| c.action).collect();
    assert_eq!(actions, [Action::Prepare, Action::Commit], "prepare (try), then commit (confirm)");
}

/// The try's answer is late (the API authorized at once, its answer comes after the client gave up):
/// the try is sent again with the same key and gets the stored answer, so the card is authorized once,
/// and captured.
#[tokio::test]
async fn a_try_that_times_out_and_is_answered_later_authorizes_once() {
    let env = world().await;
    api(&env).inject(Endpoint::Authorize, PaymentFault::SlowReply(Duration::from_millis(2_500)), "", Some(1));
    let (status, answer) = env.post(&order("order-slow", CARD, 900, 8000), None).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("COMMITTED")), "{answer}");
    assert_eq!(statuses(&env), ["captured"], "one authorization");
    let authorizes: Vec<_> = api(&env).calls().into_iter().filter(|c| c.endpoint == Endpoint::Authorize).collect();
    assert_eq!(authorizes.len(), 2, "{authorizes:?}");
    assert!(authorizes[1].replayed && authorizes[0].key == authorizes[1].key, "the repeat was answered from the key");
}

/// Every authorize request of the order is late in the network, past the transaction's deadline: the
/// order aborts and its cancel finds nothing to void. The requests land afterwards and hold money; the
/// cancel's repeat, once every try request has landed, recovers the authorization (its request again,
/// under its key) and voids it.
#[tokio::test]
async fn an_authorization_that_lands_after_its_void_is_voided_by_the_repeated_cancel() {
    let env = world().await;
    let key = "late-authorization";
    let tx = twopc::coordinator::idempotent_id(key);
    api(&env).inject(Endpoint::Authorize, PaymentFault::Late(Duration::from_millis(2_500)), &tx, None);
    let (status, answer) = env.post(&order("order-late", CARD, 1200, 1000), Some(key)).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(state(&env).await, ("10".into(), "0".into(), "100".into()), "nothing applied");
    // The late requests land: the money is held now, although the order was cancelled.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while api(&env).held().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the late authorization never landed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    api(&env).heal();
    // Before the repeat is due, the sweeper leaves it.
    env.sweep_until_quiet().await;
    assert_eq!(api(&env).held().len(), 1, "held until the repeat");
    env.clock.advance(twopc::participant::resource::TRY_IN_FLIGHT_MS + 5_000);
    env.sweep_until_quiet().await;
    assert!(api(&env).held().is_empty(), "the repeated cancel voided it: {:?}", api(&env).authorizations());
    assert_eq!(statuses(&env), ["voided"]);
    let voids: Vec<String> =
        api(&env).calls().into_iter().filter(|c| c.endpoint == Endpoint::Void).map(|c| c.key).collect();
    assert_eq!(voids, [format!("{tx}:payments:recheck:0")], "one void, under the repeat's own key");
    assert_eq!(env.locked_items().await.len(), 0, "nothing left for the sweeper");
}

fn message(env: &TestEnv, action: Action, tx: &str, operations: Vec<Value>) -> ParticipantRequest {
    let deadline = env.clock_now() + 5_000;
    env.signed(
        "payments",
        ParticipantRequest {
            operations,
            deadline: Some(deadline),
            started_at: Some(env.clock_now()),
            ..ParticipantRequest::new(action, tx)
        },
    )
}

/// A cancel that arrives before its try writes the barrier and calls nothing (an empty rollback); the try
/// that arrives after it does nothing either.
#[tokio::test]
async fn a_cancel_before_the_try_is_an_empty_rollback_and_the_late_try_does_nothing() {
    let env = world().await;
    let participant = &env.participants["payments"];
    let charge = payments::charge("early", CARD, 100);
    let abort =
        participant.handle(&message(&env, Action::Abort, "tx-early-cancel", vec![charge.clone()])).await.unwrap();
    assert_eq!(abort.status.as_deref(), Some("ABORTED"));
    let prepare = participant.handle(&message(&env, Action::Prepare, "tx-early-cancel", vec![charge])).await.unwrap();
    assert_eq!(prepare.vote, Some(Vote::Refused), "{prepare:?}");
    assert!(api(&env).calls().is_empty(), "the payment API was never called: {:?}", api(&env).calls());
}

/// A copy of a prepare that arrives after its transaction committed, and a commit delivered twice,
/// change nothing: one authorization, captured once.
#[tokio::test]
async fn a_try_after_the_end_and_a_repeated_confirm_do_nothing_more() {
    let env = world().await;
    let (status, answer) = env.post(&charge_only("again", 300, 5000), None).await;
    assert_eq!(status, 200, "{answer}");
    let tx = answer["transactionId"].as_str().unwrap();
    let participant = &env.participants["payments"];
    let late = participant
        .handle(&message(&env, Action::Prepare, tx, vec![payments::charge("again", CARD, 300)]))
        .await
        .unwrap();
    assert_eq!(late.vote, Some(Vote::Refused), "{late:?}");
    let token = answer["participants"][0]["lockToken"].as_str().map(str::to_owned);
    let commit = ParticipantRequest {
        lock_token: token,
        ..message(&env, Action::Commit, tx, vec![payments::charge("again", CARD, 300)])
    };
    let again = participant.handle(&env.signed("payments", commit)).await.unwrap();
    assert_eq!(again.status.as_deref(), Some("COMMITTED"));
    let effects = |endpoint| api(&env).calls().into_iter().filter(|c| c.endpoint == endpoint && !c.replayed).count();
    assert_eq!((effects(Endpoint::Authorize), effects(Endpoint::Capture)), (1, 1));
    assert_eq!(statuses(&env), ["captured"]);
}

/// After the commit decision a capture that fails, for good, is never turned into an abort: the
/// transaction stays COMMITTING, the sweeper retries and reports it stuck with why, the money stays
/// authorized; once the API captures again, the transaction ends COMMITTED.
#[tokio::test]
async fn a_capture_that_keeps_failing_stays_committing_and_is_retried() {
    let env = world().await;
    api(&env).inject(Endpoint::Capture, PaymentFault::Fail, "", None);
    let (status, answer) = env.post(&order("order-stuck", CARD, 500, 5000), None).await;
    assert_eq!((status, answer["status"].as_str()), (202, Some("COMMITTING")), "{answer}");
    let tx = answer["transactionId"].as_str().unwrap().to_owned();
    assert_eq!(state(&env).await, ("8".into(), "2".into(), "80".into()), "the others committed");
    let sweeper = env.sweeper(None);
    for _ in 0..3 {
        env.clock.advance(60_000);
        let report = sweeper.sweep().await.unwrap();
        assert!(report.stuck >= 1, "{report:?}");
    }
    let (_, record) = env.get(&tx).await;
    assert_eq!(record["status"], "COMMITTING", "{record}");
    let stored = env.records().await.into_iter().find(|r| r["transactionId"] == tx.as_str()).unwrap();
    assert!(stored["sweepError"].as_str().unwrap_or_default().contains("capture"), "{stored}");
    assert_eq!(statuses(&env), ["authorized"], "held, never voided after the commit decision");

    api(&env).heal();
    env.clock.advance(60 * 60_000);
    env.sweep_until_quiet().await;
    let (_, record) = env.get(&tx).await;
    assert_eq!(record["status"], "COMMITTED", "{record}");
    assert_eq!(statuses(&env), ["captured"]);
}

/// Issue 41: an order whose card was authorized aborts (the wallet cannot pay): the cancel voids the
/// authorization. The cancel's repeat, once due, recovers the try (its stored answer: that same
/// authorization) and must not void it again: a payment API refuses a second void (400, as Stripe refuses
/// to cancel a canceled PaymentIntent), and a repeat that kept asking would fail at every sweep, its
/// entry locked for ever. The sweeper's recovery ends, the entry's lock is released, one void was made.
#[tokio::test]
async fn the_repeated_cancel_does_not_void_an_authorization_again() {
    let env = world().await;
    env.put_account("service-a", "W", "5").await;
    let (status, answer) = env.post(&order("order-poor", CARD, 800, 5000), None).await;
    assert_eq!(status, 409, "the wallet refuses: {answer}");
    assert_eq!(statuses(&env), ["voided"], "the abort voided the authorization");
    // Past the repeat's time: the deadline (at most 5 s away), the clock margins, the time in flight.
    env.clock.advance(twopc::participant::resource::TRY_IN_FLIGHT_MS + 10_000);
    let (reports, quiet) = env.try_sweep_until_quiet(5).await;
    assert!(quiet, "the sweeper's recovery ends: {reports:#?}");
    assert!(reports.iter().all(|r| r.as_ref().is_ok_and(|r| r.errors == 0)), "no sweep error: {reports:#?}");
    let locked = env.locked_items().await;
    assert!(locked.is_empty(), "the barrier entry's lock is released: {locked:?}");
    let voids: Vec<_> = api(&env).calls().into_iter().filter(|c| c.endpoint == Endpoint::Void).collect();
    assert_eq!(voids.len(), 1, "one void, the cancel's: {voids:?}");
    assert_eq!(statuses(&env), ["voided"]);
}

/// The payments table's item for `tx`'s barrier entry, as JSON (None: no entry).
async fn barrier_entry(env: &TestEnv, tx: &str) -> Option<Value> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let out = env
        .client
        .get_item()
        .table_name(env.table("payments"))
        .key("entityId", AttributeValue::S(format!("barrier#{tx}")))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem");
    out.item.map(|item| Value::Object(twopc::attr::item_to_json(&item)))
}

/// The least a finished entry's expiry (epoch seconds) may be, docs/participants.md, "Barrier entries expire": past the
/// last moment a late try of its transaction could find the entry, i.e. the try cutoff (deadline + M),
/// the time a request is in flight, and the clock margin again (the table's clock against the
/// participant's). An entry that knows no deadline takes the latest one its transaction can have.
fn least_expiry(deadline: u64) -> u64 {
    use twopc::clock::CLOCK_MARGIN_MS;
    (deadline + CLOCK_MARGIN_MS + twopc::participant::resource::TRY_IN_FLIGHT_MS + CLOCK_MARGIN_MS).div_ceil(1000)
}

fn expiry_of(entry: &Value) -> Option<u64> {
    entry.get("expireAt").map(|e| e.as_u64().expect("expireAt is a number of seconds"))
}

/// An expiry at least `least` (seconds), and not absurdly far: within the retention of a finished record.
fn assert_expires(entry: &Value, least: u64, what: &str) {
    let expiry = expiry_of(entry).unwrap_or_else(|| panic!("{what}: a finished entry carries expireAt: {entry}"));
    assert!(expiry >= least, "{what}: expireAt {expiry} is before the bound {least}: {entry}");
    let latest = least + twopc::record::RETENTION_SECONDS + 3_600;
    assert!(expiry <= latest, "{what}: expireAt {expiry} is past {latest}: {entry}");
    assert!(entry.get("lock").is_none(), "{what}: no lock: {entry}");
}

fn deadline_of(entry: &Value) -> u64 {
    entry["barrier"]["deadline"].as_u64().expect("the entry's deadline")
}

/// Issue 41: barrier entries are deleted by the table's TTL once nothing can need them. Every finished
/// entry (confirmed, refused, cancelled with its repeat done, a cancel before any try) carries `expireAt`
/// no earlier than the bound; an entry still waiting for something (tried, cancelled until its repeat)
/// holds a lock and carries none; and the table's TTL reads `expireAt`.
#[tokio::test]
async fn finished_barrier_entries_expire_and_waiting_ones_do_not() {
    let env = world().await;
    // Confirmed.
    let (status, answer) = env.post(&charge_only("kept", 400, 5000), None).await;
    assert_eq!(status, 200, "{answer}");
    let entry = barrier_entry(&env, answer["transactionId"].as_str().unwrap()).await.unwrap();
    assert_eq!(entry["barrier"]["state"], "CONFIRMED", "{entry}");
    assert_expires(&entry, least_expiry(deadline_of(&entry)), "confirmed");

    // Refused (a declined card).
    let declined = json!({"participants": [{"service": "payments", "operations": [payments::charge("no", DECLINED_CARD, 400)]}], "timeoutMs": 5000});
    let (status, answer) = env.post(&declined, None).await;
    assert_eq!(status, 409, "{answer}");
    let entry = barrier_entry(&env, answer["transactionId"].as_str().unwrap()).await.unwrap();
    assert_eq!(entry["barrier"]["state"], "REFUSED", "{entry}");
    assert_expires(&entry, least_expiry(deadline_of(&entry)), "refused");

    // Tried, waiting for the decision: locked, no expiry.
    let participant = &env.participants["payments"];
    let prepare = participant
        .handle(&message(&env, Action::Prepare, "tx-waiting", vec![payments::charge("wait", CARD, 100)]))
        .await
        .unwrap();
    assert_eq!(prepare.vote, Some(Vote::Prepared), "{prepare:?}");
    let entry = barrier_entry(&env, "tx-waiting").await.unwrap();
    assert_eq!((entry["barrier"]["state"].as_str(), expiry_of(&entry)), (Some("TRIED"), None), "{entry}");
    assert!(entry.get("lock").is_some(), "{entry}");

    // A cancel before any try: it knows no deadline, so it counts from the longest a transaction lasts.
    let before = env.clock_now();
    let abort = participant
        .handle(&message(&env, Action::Abort, "tx-empty", vec![payments::charge("e", CARD, 100)]))
        .await
        .unwrap();
    assert_eq!(abort.status.as_deref(), Some("ABORTED"));
    let entry = barrier_entry(&env, "tx-empty").await.unwrap();
    let latest_deadline = before + twopc::clock::CLOCK_MARGIN_MS + twopc::model::MAX_TIMEOUT_MS;
    assert_expires(&entry, least_expiry(latest_deadline), "a cancel before any try");

    // Cancelled after its try (the wallet refuses): locked until the cancel's repeat, then expiring.
    env.put_account("service-a", "W", "5").await;
    let (status, answer) = env.post(&order("order-poor", CARD, 800, 5000), None).await;
    assert_eq!(status, 409, "{answer}");
    let tx = answer["transactionId"].as_str().unwrap().to_owned();
    let entry = barrier_entry(&env, &tx).await.unwrap();
    assert_eq!((entry["barrier"]["state"].as_str(), expiry_of(&entry)), (Some("CANCELLED"), None), "{entry}");
    assert!(entry.get("lock").is_some(), "{entry}");
    env.clock.advance(twopc::participant::resource::TRY_IN_FLIGHT_MS + 10_000);
    env.sweep_until_quiet().await;
    let entry = barrier_entry(&env, &tx).await.unwrap();
    assert!(entry["barrier"].get("rechecked").is_some(), "{entry}");
    assert_expires(&entry, least_expiry(deadline_of(&entry)), "cancelled, repeated");

    // DynamoDB deletes them: the table's TTL reads expireAt.
    let ttl = env.client.describe_time_to_live().table_name(env.table("payments")).send().await.expect("TTL");
    let ttl = ttl.time_to_live_description().expect("a TTL description");
    assert_eq!(
        (ttl.attribute_name(), ttl.time_to_live_status().map(|s| s.as_str())),
        (Some("expireAt"), Some("ENABLED")),
        "the participant table's TTL"
    );
}

/// Issue 41: an entry written before barrier entries expired (no `expireAt`) gets its expiry when a
/// message of its transaction next finds it finished; one that still waits gets it when it finishes.
#[tokio::test]
async fn an_entry_written_before_the_upgrade_gets_its_expiry_when_next_touched() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let env = world().await;
    let participant = &env.participants["payments"];
    let abort = message(&env, Action::Abort, "tx-old", vec![payments::charge("old", CARD, 100)]);
    assert_eq!(participant.handle(&abort).await.unwrap().status.as_deref(), Some("ABORTED"));
    // As the version before wrote it: no expiry.
    env.client
        .update_item()
        .table_name(env.table("payments"))
        .key("entityId", AttributeValue::S("barrier#tx-old".into()))
        .update_expression("REMOVE expireAt")
        .send()
        .await
        .expect("UpdateItem");
    assert_eq!(expiry_of(&barrier_entry(&env, "tx-old").await.unwrap()), None);
    let before = env.clock_now();
    // A late abort of the same transaction (the sweeper's, a copy of the coordinator's).
    let again = message(&env, Action::Abort, "tx-old", vec![payments::charge("old", CARD, 100)]);
    assert_eq!(participant.handle(&again).await.unwrap().status.as_deref(), Some("ABORTED"));
    let entry = barrier_entry(&env, "tx-old").await.unwrap();
    let latest_deadline = before + twopc::clock::CLOCK_MARGIN_MS + twopc::model::MAX_TIMEOUT_MS;
    assert_expires(&entry, least_expiry(latest_deadline), "an old entry touched again");
}
