//! The one conditional write (`twopc::store::write::conditional`), every answer its callers tell apart,
//! against DynamoDB Local: applied, refused by a condition with the item as it was, unstorable, and what
//! a write whose reply was lost answers, retried by the SDK or sent once.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use twopc::expr::{Expr, n, s};
use twopc::store::write::{Sending, Write, Written, conditional};
use twopc::store::{Item, WriteOutcome};
use twopc_tests::TestEnv;
use twopc_tests::dynamo_faults::{DynamoFault, DynamoFaults, Rule};

fn key(id: &str) -> Item {
    HashMap::from([("entityId".to_owned(), s(id))])
}

fn item(id: &str, version: u64) -> Item {
    let mut item = key(id);
    item.insert("version".to_owned(), n(version));
    item
}

/// Puts `id` unless it exists.
fn put_new(table: &str, item: Item) -> Write {
    let mut e = Expr::new();
    let id = e.name("entityId");
    Write::put(table, item, format!("attribute_not_exists({id})"), e)
}

/// Sets `version` to `to` if it is `from`.
fn bump(table: &str, id: &str, from: u64, to: u64) -> Write {
    let mut e = Expr::new();
    let version = e.name("version");
    let (from, to) = (e.value(n(from)), e.value(n(to)));
    Write::update(table, key(id), format!("SET {version} = {to}"), format!("{version} = {from}"), e)
}

fn version(item: &Item) -> Option<&str> {
    item.get("version").and_then(|v| v.as_n().ok()).map(String::as_str)
}

#[tokio::test]
async fn a_write_answers_applied_or_refused_with_the_item_as_it_was() {
    let env = TestEnv::new().await;
    let (client, table) = (&env.store_client, env.table("service-a"));

    let written = conditional(client, vec![put_new(table, item("A", 1))], Sending::default()).await.unwrap();
    assert!(matches!(written, Written::Applied(None)), "{written:?}");
    let again = conditional(client, vec![put_new(table, item("A", 7))], Sending::default()).await.unwrap();
    let Written::Refused(refused) = again else { panic!("a second put of A is refused: {again:?}") };
    assert_eq!((refused.len(), refused[0].index), (1, 0));
    assert_eq!(refused[0].item.as_ref().and_then(version), Some("1"), "the item as it was, not as sent");

    let sending = Sending::default().returning_new();
    let bumped = conditional(client, vec![bump(table, "A", 1, 2)], sending.clone()).await.unwrap();
    let Written::Applied(Some(new)) = bumped else { panic!("applied, with the item as written: {bumped:?}") };
    assert_eq!(version(&new), Some("2"));
    let stale = conditional(client, vec![bump(table, "A", 1, 3)], sending).await.unwrap();
    let Written::Refused(refused) = stale else { panic!("a stale update is refused: {stale:?}") };
    assert_eq!(refused[0].item.as_ref().and_then(version), Some("2"));

    // An update of a key that is not there: refused, and no item (not an empty one).
    let missing = conditional(client, vec![bump(table, "nobody", 1, 2)], Sending::default()).await.unwrap();
    let Written::Refused(refused) = missing else { panic!("{missing:?}") };
    assert!(refused[0].item.is_none(), "{refused:?}");

    let mut e = Expr::new();
    let condition = format!("{} = {}", e.name("version"), e.value(n(1)));
    let delete = Write::delete(table, key("A"), condition, e);
    let kept = conditional(client, vec![delete], Sending::default()).await.unwrap();
    assert!(matches!(&kept, Written::Refused(r) if r[0].item.as_ref().and_then(version) == Some("2")), "{kept:?}");
    assert!(env.client.get_item().table_name(table).set_key(Some(key("A"))).send().await.unwrap().item.is_some());
}

/// Several writes are one TransactWriteItems: all applied or none, and a refusal names every write whose
/// condition failed, by its place in the list, with its item as it was.
#[tokio::test]
async fn several_writes_are_all_or_none_and_a_refusal_names_each_refused_write() {
    let env = TestEnv::new().await;
    let (client, a, b) = (&env.store_client, env.table("service-a"), env.table("service-b"));
    let existing = vec![put_new(a, item("A", 1)), put_new(a, item("C", 5))];
    assert!(matches!(conditional(client, existing, Sending::default()).await.unwrap(), Written::Applied(None)));

    let writes = vec![bump(a, "A", 1, 2), put_new(b, item("B", 1)), put_new(a, item("C", 9))];
    let written = conditional(client, writes, Sending::default()).await.unwrap();
    let Written::Refused(refused) = written else { panic!("the third write's condition fails: {written:?}") };
    assert_eq!(refused.iter().map(|r| r.index).collect::<Vec<_>>(), vec![2]);
    assert_eq!(refused[0].item.as_ref().and_then(version), Some("5"));
    let a_item = env.client.get_item().table_name(a).set_key(Some(key("A"))).send().await.unwrap().item;
    assert_eq!(a_item.as_ref().and_then(version), Some("1"), "none applied");
    let b_item = env.client.get_item().table_name(b).set_key(Some(key("B"))).send().await.unwrap().item;
    assert!(b_item.is_none(), "none applied");

    let mut e = Expr::new();
    let exists = format!("attribute_exists({})", e.name("entityId"));
    let checked = vec![Write::check(a, key("A"), exists, e), put_new(b, item("B", 1))];
    let written = conditional(client, checked, Sending::default().idempotent()).await.unwrap();
    assert!(matches!(written, Written::Applied(None)), "{written:?}");
}

/// An item DynamoDB cannot store (over 400 KB) is unstorable, alone or among others, and not a refusal.
#[tokio::test]
async fn an_item_over_400_kb_is_unstorable_alone_or_among_others() {
    let env = TestEnv::new().await;
    let (client, table) = (&env.store_client, env.table("service-a"));
    let mut big = item("big", 1);
    big.insert("note".to_owned(), AttributeValue::S("x".repeat(410 * 1024)));

    let alone = conditional(client, vec![put_new(table, big.clone())], Sending::default()).await.unwrap();
    let Written::Unstorable { reason, error } = alone else { panic!("{alone:?}") };
    assert!(!reason.is_empty() && error.invalid && error.outcome == WriteOutcome::NotApplied, "{reason} {error}");

    let among = vec![put_new(table, item("small", 1)), put_new(table, big)];
    let written = conditional(client, among, Sending::default()).await.unwrap();
    assert!(matches!(&written, Written::Unstorable { error, .. } if error.invalid), "{written:?}");
    let small = env.client.get_item().table_name(table).set_key(Some(key("small"))).send().await.unwrap().item;
    assert!(small.is_none(), "none applied");
    assert!(written.decided().is_err_and(|e| e.invalid), "a failure to a caller that takes none");
}

/// A write that took effect but whose reply was lost: retried by the SDK, it meets itself and is refused
/// (the caller classifies the item); sent once, it is a failure that may have taken effect; a transaction
/// sent idempotent is answered as applied, once.
#[tokio::test]
async fn a_write_whose_reply_was_lost_is_never_answered_as_not_applied() {
    let faults = DynamoFaults::new(77);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    let (client, a, b) = (&env.store_client, env.table("service-a"), env.table("service-b"));

    faults.add(Rule::new(DynamoFault::LoseReply).operation("PutItem").nth(1));
    let retried = conditional(client, vec![put_new(a, item("A", 1))], Sending::default()).await.unwrap();
    let Written::Refused(refused) = retried else { panic!("the SDK's retry meets its own write: {retried:?}") };
    assert_eq!(refused[0].item.as_ref().and_then(version), Some("1"));
    faults.clear();

    faults.add(Rule::new(DynamoFault::LoseReply).operation("UpdateItem").nth(1));
    let once = conditional(client, vec![bump(a, "A", 1, 2)], Sending::default().once(None)).await;
    let error = once.expect_err("sent once, a lost reply is a failure");
    assert_eq!(error.outcome, WriteOutcome::Unknown, "{error}");
    let a_item = env.client.get_item().table_name(a).set_key(Some(key("A"))).send().await.unwrap().item;
    assert_eq!(a_item.as_ref().and_then(version), Some("2"), "it took effect");
    faults.clear();

    faults.add(Rule::new(DynamoFault::LoseReply).operation("TransactWriteItems").nth(1));
    let writes = vec![bump(a, "A", 2, 3), put_new(b, item("B", 1))];
    let written = conditional(client, writes, Sending::default().idempotent()).await.unwrap();
    assert!(matches!(written, Written::Applied(None)), "answered as the first attempt: {written:?}");
    assert_eq!(faults.fired(), 3, "one reply lost for each of the three writes");
    let a_item = env.client.get_item().table_name(a).set_key(Some(key("A"))).send().await.unwrap().item;
    assert_eq!(a_item.as_ref().and_then(version), Some("3"), "applied once");
}

/// A write that met another transaction on its items is contention, alone or among others: not applied,
/// worth sending again, and a failure to a caller that takes only applied or refused.
#[tokio::test]
async fn a_write_that_met_another_transaction_is_contention() {
    let faults = DynamoFaults::new(78);
    let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
    let (client, a, b) = (&env.store_client, env.table("service-a"), env.table("service-b"));
    faults.add(Rule::new(DynamoFault::Conflict).table(a));

    let alone = conditional(client, vec![put_new(a, item("A", 1))], Sending::default()).await.unwrap();
    assert!(matches!(&alone, Written::Contention(e) if e.outcome == WriteOutcome::NotApplied), "{alone:?}");
    let among = vec![put_new(b, item("B", 1)), put_new(a, item("A", 1))];
    let written = conditional(client, among, Sending::default()).await.unwrap();
    assert!(matches!(&written, Written::Contention(_)), "{written:?}");
    assert!(written.decided().is_err());
    faults.clear();
    let b_item = env.client.get_item().table_name(b).set_key(Some(key("B"))).send().await.unwrap().item;
    assert!(b_item.is_none(), "none applied");
}
