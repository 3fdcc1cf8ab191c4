//! Issue 30: a service's own operations, through the example inventory service, against DynamoDB Local.
//! The coordinator validates them from the services' schemas (400, nothing written); what only the
//! participant can judge aborts with its code; a reserve and a wallet debit commit together or not at all;
//! the commit applies what the prepare computed, even from a participant redeployed in between.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::Operation;
use twopc::participant::{OperationRefusal, OperationSchema, Operations, Participant, Prepared};
use twopc_tests::{TestEnv, call_coordinator, rest_event};

async fn world() -> TestEnv {
    let env = TestEnv::with_services(&["service-a", "inventory"]).await;
    env.put_data("inventory", "SKU-1", &inventory::sku("Lamp", 10, true)).await;
    env.put_data("inventory", "SKU-OLD", &inventory::sku("Old lamp", 10, false)).await;
    env.put_data("inventory", "NOT-A-SKU", &json!({"name": "a note"})).await;
    env.put_account("service-a", "W", "100").await;
    env
}

/// An order: `operation` at the inventory, and a debit of `amount` from wallet W (min 0).
fn order(operation: Value, amount: i64) -> Value {
    json!({"participants": [
        {"service": "inventory", "operations": [operation]},
        {"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "W"}, "field": "balance", "delta": -amount, "min": 0}]}
    ]})
}

async fn stock(env: &TestEnv, sku: &str) -> (String, String) {
    let item = env.item("inventory", sku).await.unwrap();
    (item["data"]["stock"].to_string(), item["data"]["reserved"].to_string())
}

/// The coordinator refuses, before anything is written and naming the field: a missing field, a wrong
/// type, a value out of the schema's range or not whole, a field the operation does not declare, a kind
/// the service does not speak, and one service's kind sent to another.
#[tokio::test]
async fn operations_the_schema_refuses_are_a_400_naming_the_field_and_write_nothing() {
    let env = world().await;
    let reserve = |fields: Value| {
        let mut op = json!({"op": "reserve", "key": {"entityId": "SKU-1"}});
        op.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        order(op, 1)
    };
    let cases = [
        (reserve(json!({})), "INVALID_REQUEST", "participants[0].operations[0]: missing \"quantity\""),
        (
            reserve(json!({"quantity": "three"})),
            "INVALID_REQUEST",
            "participants[0].operations[0].quantity: must be a whole number",
        ),
        (
            reserve(json!({"quantity": 0})),
            "INVALID_REQUEST",
            "participants[0].operations[0].quantity: must be at least 1",
        ),
        (
            reserve(json!({"quantity": 1.5})),
            "INVALID_REQUEST",
            "participants[0].operations[0].quantity: must be a whole number",
        ),
        (
            reserve(json!({"quantity": 1, "colour": "red"})),
            "INVALID_REQUEST",
            "unexpected field \"colour\" for op \"reserve\"",
        ),
        (
            order(json!({"op": "restock", "key": {"entityId": "SKU-1"}, "quantity": 1}), 1),
            "UNKNOWN_OPERATION",
            "one of its own: release, reserve",
        ),
        (
            json!({"participants": [{"service": "service-a", "operations": [inventory::reserve("W", 1)]}]}),
            "UNKNOWN_OPERATION",
            "participants[0].operations[0].op: unknown operation \"reserve\"",
        ),
    ];
    for (body, code, message) in cases {
        let (status, answer) = env.post(&body, None).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (400, Some(code)), "{body}: {answer}");
        let text = answer["error"]["message"].as_str().unwrap();
        assert!(text.contains(message), "{text} should say {message}");
    }
    assert!(env.records().await.is_empty(), "nothing written");
    assert_eq!(stock(&env, "SKU-1").await, ("10".into(), "0".into()));
}

/// What only the participant can judge, on the item as it is: an inactive SKU (RULE, INACTIVE), more than
/// the stock (CONDITION_FAILED, with the numbers), an item that is not a SKU (INVALID). Each aborts the
/// order: the wallet is not debited.
#[tokio::test]
async fn what_only_the_participant_can_judge_aborts_with_its_code() {
    let env = world().await;
    let cases = [
        (inventory::reserve("SKU-OLD", 1), "RULE", Some("INACTIVE"), "SKU {\"entityId\":\"SKU-OLD\"} is not active"),
        (inventory::reserve("SKU-1", 11), "CONDITION_FAILED", None, "stock 10 - 11 = -1 is below zero"),
        (inventory::reserve("NOT-A-SKU", 1), "INVALID", None, "is not a SKU"),
        (inventory::release("SKU-1", 1), "CONDITION_FAILED", None, "reserved 0 - 1 = -1 is below zero"),
    ];
    for (operation, code, service_code, reason) in cases {
        let (status, answer) = env.post(&order(operation.clone(), 10), None).await;
        assert_eq!(status, 409, "{operation}: {answer}");
        let vote = &answer["participants"][0];
        assert_eq!(vote["code"], code, "{answer}");
        assert_eq!(vote["serviceCode"].as_str(), service_code, "{answer}");
        assert!(vote["reason"].as_str().unwrap().contains(reason), "{answer}");
    }
    assert_eq!(env.balance("service-a", "W").await, "100");
    assert_eq!(stock(&env, "SKU-1").await, ("10".into(), "0".into()));
    assert!(env.locked_items().await.is_empty());
}

/// A reserve and a wallet debit commit together, or neither: a refused debit releases the reserve's lock
/// and applies nothing; then a reserve and a release, in two phases and in one.
#[tokio::test]
async fn a_reserve_and_a_wallet_debit_commit_together_or_not_at_all() {
    let env = world().await;
    let (status, answer) = env.post(&order(inventory::reserve("SKU-1", 3), 30), None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (stock(&env, "SKU-1").await, env.balance("service-a", "W").await),
        (("7".into(), "3".into()), "70".into())
    );

    let (status, answer) = env.post(&order(inventory::reserve("SKU-1", 3), 1_000), None).await;
    assert_eq!(status, 409, "the debit is refused: {answer}");
    assert_eq!(
        (stock(&env, "SKU-1").await, env.balance("service-a", "W").await),
        (("7".into(), "3".into()), "70".into())
    );

    // The inventory alone: one phase.
    let alone = json!({"participants": [{"service": "inventory", "operations": [inventory::release("SKU-1", 2)]}]});
    let (status, answer) = env.post(&alone, Some("release-once")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(stock(&env, "SKU-1").await, ("9".into(), "1".into()));
    let (status, _) = env.post(&alone, Some("release-once")).await;
    assert_eq!(status, 200);
    assert_eq!(stock(&env, "SKU-1").await, ("9".into(), "1".into()), "the same key runs once");
    assert!(env.locked_items().await.is_empty());
}

/// The inventory's reserve, as a later version might compute it: twice the quantity.
struct Changed;

impl Operations for Changed {
    fn schemas(&self) -> Vec<OperationSchema> {
        inventory::Inventory.schemas()
    }
    fn prepare(&self, prepared: &Prepared<'_>) -> Result<Map<String, Value>, OperationRefusal> {
        let Operation::Custom { kind, key, fields, computed } = prepared.operation else { unreachable!() };
        let mut doubled = fields.clone();
        doubled["quantity"] = json!(fields["quantity"].as_u64().unwrap() * 2);
        let op =
            Operation::Custom { kind: kind.clone(), key: key.clone(), fields: doubled, computed: computed.clone() };
        inventory::Inventory.prepare(&Prepared { operation: &op, ..*prepared })
    }
}

/// A participant redeployed with a changed operation between the phases still commits what its prepare
/// computed and voted for: the new data kept beside the lock, never a recomputation. Here the coordinator
/// stops after the votes are recorded; the sweeper drives the commit through the redeployed participant.
#[tokio::test]
async fn a_participant_redeployed_between_the_phases_commits_what_it_voted_for() {
    let env = world().await;
    let stopped = env.coordinator_with(&env.fresh_invoker(), Faults::crash_at(CoordinatorCrash::AfterDecision));
    let event = rest_event(
        "POST",
        "/transactions",
        "/transactions",
        None,
        json!({}),
        Some(&order(inventory::reserve("SKU-1", 3), 30).to_string()),
    );
    let (status, answer) = call_coordinator(&stopped, &event).await;
    assert_eq!(status, 500, "{answer}");
    assert_eq!(stock(&env, "SKU-1").await, ("10".into(), "0".into()), "prepared, not yet committed");

    let redeployed: Vec<Participant> = env
        .participants
        .iter()
        .map(|(service, p)| if service == "inventory" { p.clone().with_operations(Changed) } else { p.clone() })
        .collect();
    let invoker = twopc_tests::FaultyInvoker::new(twopc::invoke::InProcessInvoker::new(redeployed));
    let coordinator = twopc::coordinator::Coordinator::new(
        env.transactions.clone(),
        Arc::new(invoker),
        env.participants.keys().cloned(),
        env.clock.clone(),
    );
    let tables: BTreeMap<String, twopc::participant::DataTable> =
        env.participants.iter().map(|(s, p)| (s.clone(), p.table().clone())).collect();
    env.clock.advance(60_000);
    let sweeper = twopc::sweeper::Sweeper::new(coordinator, tables, twopc::sweeper::SweepLimits::default());
    let report = sweeper.sweep().await.unwrap();
    assert_eq!(report.committed, 1, "{report:?}");
    assert_eq!(stock(&env, "SKU-1").await, ("7".into(), "3".into()), "3 as voted, not 6");
    assert_eq!(env.balance("service-a", "W").await, "70");
    assert!(env.locked_items().await.is_empty());
}

/// The deployed coordinator learns the services' operations from `SERVICE_OPERATIONS`, which both
/// templates take from `infra/service-operations.json`: that file is what the example services declare
/// (the inventory's own operations, the payments resource's).
#[test]
fn the_templates_operations_are_the_example_services() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/service-operations.json");
    let mut declared = inventory::catalogs();
    declared.insert(payments::SERVICE, payments::catalog());
    let text = serde_json::to_string_pretty(&declared.to_json()).unwrap() + "\n";
    if std::env::var_os("TWOPC_WRITE_SERVICE_OPERATIONS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        twopc::custom::Catalogs::parse(&written).ok(),
        Some(declared),
        "infra/service-operations.json is not what the example services declare: run this test with TWOPC_WRITE_SERVICE_OPERATIONS=1 to write it"
    );
}
