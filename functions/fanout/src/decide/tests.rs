//! What [`super::decide`] makes of each kind of record (commits, ended transactions, skips, records it
//! cannot judge) and the lake lines and messages a decision becomes: in a file of their own, longer
//! than the rules they check.

use super::*;
use serde_json::json;

fn config() -> FanoutConfig {
    let mut tables = BTreeMap::new();
    tables.insert("service-a".to_owned(), "service-a-data".to_owned());
    FanoutConfig::new(&tables, "transactions").unwrap()
}

fn record(event_name: &str, table: &str, keys: Value, old: Value, new: Value) -> EventRecord {
    let mut dynamodb = json!({
        "ApproximateCreationDateTime": 1714564800,
        "Keys": keys,
        "SequenceNumber": "100",
        "SizeBytes": 10,
        "StreamViewType": "NEW_AND_OLD_IMAGES"
    });
    if !old.is_null() {
        dynamodb["OldImage"] = old;
    }
    if !new.is_null() {
        dynamodb["NewImage"] = new;
    }
    serde_json::from_value(json!({
        "eventID": "e1",
        "eventName": event_name,
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "eventSourceARN": format!("arn:aws:dynamodb:us-east-1:123456789012:table/{table}/stream/2024-01-01T00:00:00.000"),
        "dynamodb": dynamodb
    }))
    .unwrap()
}

fn key() -> Value {
    json!({"entityId": {"S": "A"}})
}

fn lock(tx: &str) -> Value {
    json!({"M": {"transactionId": {"S": tx}, "status": {"S": "PREPARED"}, "expiresAt": {"N": "1714564900000"}}})
}

fn committed(tx: &str, version: &str, balance: &str) -> Value {
    json!({"entityId": {"S": "A"}, "data": {"M": {"balance": {"N": balance}}}, "version": {"N": version}, "lastTx": {"S": tx}})
}

fn with_lock(mut image: Value, tx: &str) -> Value {
    image["lock"] = lock(tx);
    image["lockShard"] = json!({"S": "1"});
    image["lockExpiresAt"] = json!({"N": "1714564900000"});
    image
}

fn placeholder(tx: &str) -> Value {
    with_lock(json!({"entityId": {"S": "A"}}), tx)
}

fn commit(decision: Decision) -> ChangeRecord {
    match decision {
        Decision::Commit(change) => *change,
        other => panic!("expected a commit, got {other:?}"),
    }
}

#[test]
fn commit_of_an_update_is_a_modify() {
    let old = with_lock(committed("T1", "1", "100"), "T2");
    let new = committed("T2", "2", "12345678901234567890123456789012345678.5");
    let change = commit(decide(&config(), &record("MODIFY", "service-a-data", key(), old, new)));
    assert_eq!(
        String::from_utf8(change.to_ndjson()).unwrap(),
        "{\"eventId\":\"e1\",\"transactionId\":\"T2\",\"service\":\"service-a\",\"table\":\"service-a-data\",\
         \"key\":{\"entityId\":\"A\"},\"change\":\"MODIFY\",\"version\":2,\"committedAt\":\"2024-05-01T12:00:00Z\",\
         \"data\":{\"balance\":12345678901234567890123456789012345678.5},\"previous\":{\"balance\":100}}\n"
    );
    assert_eq!(change.topic(), Some(Topic::entity("service-a-data", "A")));
    let message: Value = serde_json::from_slice(&change.to_message()).unwrap();
    assert_eq!(message["type"], "commit");
    assert_eq!(message["transactionId"], "T2");
    assert_eq!(message.as_object().unwrap().keys().next().unwrap(), "type");
    assert_eq!(
        String::from_utf8(change.to_message_without_images()).unwrap(),
        "{\"type\":\"commit\",\"eventId\":\"e1\",\"transactionId\":\"T2\",\"service\":\"service-a\",\
         \"table\":\"service-a-data\",\"key\":{\"entityId\":\"A\"},\"change\":\"MODIFY\",\"version\":2,\
         \"committedAt\":\"2024-05-01T12:00:00Z\",\"imagesOmitted\":true}"
    );
}

#[test]
fn commit_of_a_put_on_a_placeholder_is_an_insert() {
    let change = commit(decide(
        &config(),
        &record("MODIFY", "service-a-data", key(), placeholder("T1"), committed("T1", "1", "5")),
    ));
    assert_eq!(change.change, ChangeKind::Insert);
    assert_eq!(change.previous, Value::Null);
    assert_eq!(change.version.to_string(), "1");
}

#[test]
fn insert_with_last_tx_is_a_commit() {
    let change =
        commit(decide(&config(), &record("INSERT", "service-a-data", key(), Value::Null, committed("T1", "1", "5"))));
    assert_eq!(change.change, ChangeKind::Insert);
}

#[test]
fn prepares_and_aborts_are_skipped() {
    let c = config();
    let prepare = record(
        "MODIFY",
        "service-a-data",
        key(),
        committed("T1", "1", "5"),
        with_lock(committed("T1", "1", "5"), "T2"),
    );
    assert_eq!(decide(&c, &prepare), Decision::Skip(Skip::LastTxUnchanged));
    let abort = record(
        "MODIFY",
        "service-a-data",
        key(),
        with_lock(committed("T1", "1", "5"), "T2"),
        committed("T1", "1", "5"),
    );
    assert_eq!(decide(&c, &abort), Decision::Skip(Skip::LastTxUnchanged));
    let placeholder_insert = record("INSERT", "service-a-data", key(), Value::Null, placeholder("T3"));
    assert_eq!(decide(&c, &placeholder_insert), Decision::Skip(Skip::NoLastTx));
    let placeholder_abort = record("REMOVE", "service-a-data", key(), placeholder("T3"), Value::Null);
    assert_eq!(decide(&c, &placeholder_abort), Decision::Skip(Skip::PlaceholderReleased));
    let manual = record("REMOVE", "service-a-data", key(), committed("T1", "1", "5"), Value::Null);
    assert_eq!(decide(&c, &manual), Decision::Skip(Skip::UnlockedRemove));
}

/// `image` with a pending credit of `tx` beside whatever it holds (issue 48's escrow entries).
fn with_credit(mut image: Value, tx: &str, pending: &str) -> Value {
    image[format!("credit#{tx}")] = json!({"M": {"token": {"S": "credit-1"}, "field": {"S": "balance"},
        "delta": {"N": "3"}, "expiresAt": {"N": "1714564900000"}, "startedAt": {"N": "1714564800000"}}});
    image["pendingCredits"] = json!({"N": pending});
    image
}

/// A credit's entry written, or removed by an abort, leaves `lastTx` alone: skipped, whatever other credits
/// are pending. Its commit moves `lastTx` (and removes the entry): one change, with the item's data and
/// nothing of the entries. Two credits' commits in a row are two changes.
#[test]
fn pending_credits_are_skipped_and_each_credits_commit_is_a_change() {
    let c = config();
    let prepared = with_credit(with_credit(committed("T1", "1", "5"), "T2", "1"), "T3", "2");
    let entry =
        record("MODIFY", "service-a-data", key(), with_credit(committed("T1", "1", "5"), "T2", "1"), prepared.clone());
    assert_eq!(decide(&c, &entry), Decision::Skip(Skip::LastTxUnchanged));
    let abort =
        record("MODIFY", "service-a-data", key(), prepared.clone(), with_credit(committed("T1", "1", "5"), "T2", "1"));
    assert_eq!(decide(&c, &abort), Decision::Skip(Skip::LastTxUnchanged));

    let first = with_credit(committed("T3", "2", "8"), "T2", "1");
    let change = commit(decide(&c, &record("MODIFY", "service-a-data", key(), prepared, first.clone())));
    assert_eq!((change.transaction_id.as_str(), change.version.as_u64()), ("T3", Some(2)));
    let line = String::from_utf8(change.to_ndjson()).unwrap();
    assert!(line.contains("\"data\":{\"balance\":8}") && !line.contains("credit"), "{line}");
    let second = committed("T2", "3", "11");
    let change = commit(decide(&c, &record("MODIFY", "service-a-data", key(), first, second)));
    assert_eq!((change.transaction_id.as_str(), change.version.as_u64()), ("T2", Some(3)));
}

#[test]
fn committed_delete_is_a_remove() {
    let old = with_lock(committed("T1", "7", "5"), "T9");
    let change = commit(decide(&config(), &record("REMOVE", "service-a-data", key(), old, Value::Null)));
    assert_eq!(change.change, ChangeKind::Remove);
    assert_eq!(change.transaction_id, "T9");
    assert_eq!(change.version.to_string(), "8");
    assert_eq!(change.data, Value::Null);
    assert_eq!(change.previous, json!({"balance": 5}));
}

/// Issue 19, defect 3: an item written outside the protocol has `data` and no `version`; a committed
/// `delete` of it is a REMOVE whose old image holds the lock and that data, and must reach the lake and
/// WebSocket (as version 1: a commit counts a missing version as 0). A released placeholder (a lock and
/// no data) is still not a change.
#[test]
fn committed_delete_of_an_item_without_a_version_is_a_remove() {
    let mut unversioned = with_lock(committed("T1", "7", "5"), "T9");
    let image = unversioned.as_object_mut().unwrap();
    image.remove("version");
    image.remove("lastTx");
    let decision = decide(&config(), &record("REMOVE", "service-a-data", key(), unversioned, Value::Null));
    let Decision::Commit(change) = decision else {
        panic!("a committed delete of an unversioned item must be emitted, got {decision:?}")
    };
    assert_eq!(change.change, ChangeKind::Remove);
    assert_eq!(change.transaction_id, "T9");
    assert_eq!(change.version.to_string(), "1");
    assert_eq!(change.data, Value::Null);
    assert_eq!(change.previous, json!({"balance": 5}));

    let released = record("REMOVE", "service-a-data", key(), placeholder("T3"), Value::Null);
    assert_eq!(decide(&config(), &released), Decision::Skip(Skip::PlaceholderReleased));
}

#[test]
fn ttl_remove_is_skipped() {
    let mut r = record("REMOVE", "service-a-data", key(), with_lock(committed("T1", "7", "5"), "T9"), Value::Null);
    r.user_identity =
        serde_json::from_value(json!({"type": "Service", "principalId": "dynamodb.amazonaws.com"})).unwrap();
    assert_eq!(decide(&config(), &r), Decision::Skip(Skip::TimeToLive));
}

#[test]
fn malformed_records_are_unprocessable() {
    let c = config();
    let keys_only = record("MODIFY", "service-a-data", key(), Value::Null, Value::Null);
    assert!(matches!(decide(&c, &keys_only), Decision::Unprocessable(_)));
    let bad_tx = record("MODIFY", "service-a-data", key(), committed("T1", "1", "5"), json!({"lastTx": {"N": "3"}}));
    assert!(matches!(decide(&c, &bad_tx), Decision::Unprocessable(_)));
    let no_version =
        record("MODIFY", "service-a-data", key(), committed("T1", "1", "5"), json!({"lastTx": {"S": "T2"}}));
    assert!(matches!(decide(&c, &no_version), Decision::Unprocessable(_)));
}

#[test]
fn records_of_other_streams_are_foreign() {
    let c = config();
    let change = || record("MODIFY", "service-a-data", key(), committed("T1", "1", "5"), committed("T2", "2", "5"));
    assert!(matches!(decide(&c, &change()), Decision::Commit(_)));
    let unknown = record("MODIFY", "other-table", key(), committed("T1", "1", "5"), committed("T2", "2", "5"));
    assert!(matches!(decide(&c, &unknown), Decision::Foreign(m) if m.contains("other-table")));
    // No ARN, with the table named only in `tableName` (anyone can write that field): foreign.
    let mut no_arn = change();
    no_arn.event_source_arn = None;
    no_arn.table_name = Some("service-a-data".into());
    assert!(matches!(decide(&c, &no_arn), Decision::Foreign(_)));
    for arn in [
        // The table's ARN, not one of its streams; another service; not an ARN.
        "arn:aws:dynamodb:us-east-1:123456789012:table/service-a-data",
        "arn:aws:kinesis:us-east-1:123456789012:table/service-a-data/stream/2024",
        "service-a-data",
        "arn:aws:dynamodb:us-east-1:123456789012:table/service-a-data/stream/",
        "arn:aws:dynamodb:us-east-1:123456789012:table/service-a-data/index/by-x/stream/2024",
    ] {
        let mut forged = change();
        forged.event_source_arn = Some(arn.into());
        assert!(matches!(decide(&c, &forged), Decision::Foreign(_)), "{arn}");
    }
}

#[test]
fn transaction_outcomes() {
    let c = config();
    let keys = json!({"transactionId": {"S": "T1"}});
    let committing = json!({"transactionId": {"S": "T1"}, "status": {"S": "COMMITTING"}});
    let committed = json!({"transactionId": {"S": "T1"}, "status": {"S": "COMMITTED"}});
    let aborted = json!({"transactionId": {"S": "T1"}, "status": {"S": "ABORTED"}});
    assert_eq!(
        decide(&c, &record("MODIFY", "transactions", keys.clone(), committing.clone(), committed.clone())),
        Decision::Ended(TransactionEnded {
            transaction_id: "T1".into(),
            status: "COMMITTED".into(),
            hold_until: None,
            first_transaction_id: None,
            retried_as: None,
            principal: None,
        })
    );
    assert_eq!(
        decide(&c, &record("INSERT", "transactions", keys.clone(), Value::Null, aborted.clone())),
        Decision::Ended(TransactionEnded {
            transaction_id: "T1".into(),
            status: "ABORTED".into(),
            hold_until: None,
            first_transaction_id: None,
            retried_as: None,
            principal: None,
        })
    );
    assert_eq!(
        decide(&c, &record("MODIFY", "transactions", keys.clone(), committed.clone(), committed.clone())),
        Decision::Skip(Skip::NotAnOutcome)
    );
    assert_eq!(
        decide(&c, &record("MODIFY", "transactions", keys.clone(), Value::Null, committing)),
        Decision::Skip(Skip::NotAnOutcome)
    );
    let ended = TransactionEnded {
        transaction_id: "T1".into(),
        status: "ABORTED".into(),
        hold_until: None,
        first_transaction_id: None,
        retried_as: None,
        principal: None,
    };
    assert_eq!(
        String::from_utf8(ended.to_message()).unwrap(),
        r#"{"type":"transaction","transactionId":"T1","status":"ABORTED"}"#
    );
    // A held transaction: PREPARED with its holdUntil, once (not again when something else of it changes).
    let preparing = json!({"transactionId": {"S": "T1"}, "status": {"S": "PREPARING"}});
    let prepared =
        json!({"transactionId": {"S": "T1"}, "status": {"S": "PREPARED"}, "holdUntil": {"N": "1714564900000"}});
    let held = TransactionEnded {
        transaction_id: "T1".into(),
        status: "PREPARED".into(),
        hold_until: Some(1_714_564_900_000),
        first_transaction_id: None,
        retried_as: None,
        principal: None,
    };
    assert_eq!(
        decide(&c, &record("MODIFY", "transactions", keys.clone(), preparing, prepared.clone())),
        Decision::Ended(held.clone())
    );
    assert_eq!(
        decide(&c, &record("MODIFY", "transactions", keys.clone(), prepared.clone(), prepared)),
        Decision::Skip(Skip::NotAnOutcome)
    );
    assert_eq!(
        String::from_utf8(held.to_message()).unwrap(),
        r#"{"type":"transaction","transactionId":"T1","status":"PREPARED","holdUntil":1714564900000}"#
    );
    let no_hold = json!({"transactionId": {"S": "T1"}, "status": {"S": "PREPARED"}});
    assert!(matches!(
        decide(&c, &record("MODIFY", "transactions", keys, Value::Null, no_hold)),
        Decision::Unprocessable(_)
    ));
}

/// Issue 41: an attempt after the first is heard on its request's first attempt's topic too, with
/// `firstTransactionId`; an attempt its coordinator retried carries `retriedAs`; a token retry recorded
/// before issue 41 (`<first>-r<n>`) is a request of its own, and its `retriedAs` no coordinator's link.
#[test]
fn attempts_of_a_retried_request() {
    let c = config();
    let ended = |id: &str, image: Value| {
        let old = json!({"transactionId": {"S": id}, "status": {"S": "ABORTING"}});
        match decide(&c, &record("MODIFY", "transactions", json!({"transactionId": {"S": id}}), old, image)) {
            Decision::Ended(ended) => ended,
            other => panic!("{other:?}"),
        }
    };
    let first =
        ended("T1", json!({"transactionId": {"S": "T1"}, "status": {"S": "ABORTED"}, "retriedAs": {"S": "T1-2"}}));
    assert_eq!((first.first_transaction_id.as_deref(), first.retried_as.as_deref()), (None, Some("T1-2")));
    assert_eq!(first.topics(), vec![Topic::transaction("T1")]);
    assert_eq!(
        String::from_utf8(first.to_message()).unwrap(),
        r#"{"type":"transaction","transactionId":"T1","status":"ABORTED","retriedAs":"T1-2"}"#
    );
    let second = ended(
        "T1-2",
        json!({"transactionId": {"S": "T1-2"}, "status": {"S": "COMMITTED"}, "attempt": {"N": "2"},
            "firstTransactionId": {"S": "T1"}}),
    );
    assert_eq!(second.topics(), vec![Topic::transaction("T1-2"), Topic::transaction("T1")]);
    assert_eq!(
        String::from_utf8(second.to_message()).unwrap(),
        r#"{"type":"transaction","transactionId":"T1-2","status":"COMMITTED","firstTransactionId":"T1"}"#
    );
    // Recorded before issue 41: the refused attempt names a caller's token retry, which ran as `T1-r2`.
    let claimed =
        ended("T1", json!({"transactionId": {"S": "T1"}, "status": {"S": "ABORTED"}, "retriedAs": {"S": "T1-r2"}}));
    assert_eq!(claimed.retried_as, None);
    let token_retry = ended(
        "T1-r2",
        json!({"transactionId": {"S": "T1-r2"}, "status": {"S": "COMMITTED"}, "attempt": {"N": "2"},
            "firstTransactionId": {"S": "T1"}}),
    );
    assert_eq!(token_retry.topics(), vec![Topic::transaction("T1-r2")]);
}

#[test]
fn arn_parsing() {
    let stream = "arn:aws:dynamodb:us-east-1:1:table/a-b.c/stream/2024-05-01T00:00:00.000";
    assert_eq!(table_of_stream_arn(stream), Some("a-b.c"));
    assert_eq!(table_of_stream_arn("arn:aws-cn:dynamodb:cn-north-1:1:table/x/stream/2024"), Some("x"));
    assert_eq!(table_of_stream_arn("arn:aws:dynamodb:us-east-1:1:table/x"), None, "a table, not a stream");
    assert_eq!(table_of_stream_arn("arn:aws:sqs:us-east-1:1:queue"), None);
    assert_eq!(table_of_stream_arn("nonsense"), None);
}

#[test]
fn a_table_cannot_belong_to_two_services() {
    let mut tables = BTreeMap::new();
    tables.insert("a".to_owned(), "t".to_owned());
    tables.insert("b".to_owned(), "t".to_owned());
    assert!(FanoutConfig::new(&tables, "transactions").is_err());
}

/// Issue 47: a COMMITTED record's lake line counts, per participant, the operations that write an item:
/// none for a `check`, a read-only participant or a resource's operation; from the OldImage when the
/// COMMITTED record was shortened without its operations; null when neither image has them.
#[test]
fn a_committed_transaction_gives_its_line() {
    let mut tables = BTreeMap::new();
    tables.insert("service-a".to_owned(), "service-a-data".to_owned());
    tables.insert("payments".to_owned(), "payments-data".to_owned());
    let catalogs = twopc::custom::Catalogs::parse(
        r#"{"payments": [{"op": "charge", "fields": {"amount": {"type": "integer", "required": true}}, "resource": true}]}"#,
    )
    .unwrap();
    let c = FanoutConfig::new(&tables, "transactions").unwrap().with_service_operations(&catalogs);
    let op = |kind: &str| json!({"M": {"op": {"S": kind}, "key": {"M": {"entityId": {"S": "A"}}}}});
    let entry = |service: &str, ops: Vec<Value>, read_only: bool| {
        let mut entry = json!({"service": {"S": service}, "operations": {"L": ops}});
        if read_only {
            entry["readOnly"] = json!({"BOOL": true});
        }
        json!({"M": entry})
    };
    let image = |status: &str, entries: Vec<Value>| json!({"transactionId": {"S": "T1"}, "status": {"S": status}, "participants": {"L": entries}});
    let line = |old: Value, new: Value| {
        let record = record("MODIFY", "transactions", json!({"transactionId": {"S": "T1"}}), old, new);
        let Decision::Ended(ended) = decide(&c, &record) else { panic!("an end") };
        serde_json::to_value(transaction_line(&c, &record, &ended).unwrap()).unwrap()
    };
    let full = vec![
        entry("service-a", vec![op("add"), op("delete"), op("check")], false),
        entry("service-b", vec![op("check")], true),
        entry("payments", vec![op("charge")], false),
    ];
    assert_eq!(
        line(image("COMMITTING", full.clone()), image("COMMITTED", full.clone())),
        json!({"kind": "transaction", "eventId": "e1", "transactionId": "T1", "committedAt": "2024-05-01T12:00:00Z",
               "participants": [{"service": "service-a", "table": "service-a-data", "changes": 2},
                                {"service": "service-b", "changes": 0},
                                {"service": "payments", "table": "payments-data", "changes": 0}],
               "changes": 2})
    );
    // Shortened: the operations of the COMMITTING image.
    let shortened =
        vec![entry("service-a", vec![], false), entry("service-b", vec![], true), entry("payments", vec![], false)];
    assert_eq!(line(image("COMMITTING", full), image("COMMITTED", shortened.clone()))["changes"], 2);
    // Created COMMITTED without its operations: not known.
    let unknown = line(Value::Null, image("COMMITTED", shortened));
    assert_eq!((&unknown["changes"], &unknown["participants"][0]["changes"]), (&Value::Null, &Value::Null));
}
