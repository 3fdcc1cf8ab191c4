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
