//! A record's bound and cuts, and its updates, sized in memory as DynamoDB sizes them.

use serde_json::Value;

use super::data::*;
use super::update::*;
use crate::model::MAX_PARTICIPANTS;
use crate::model::{ErrorCode, RefusalCode, Status, Vote};
use crate::size::MAX_ITEM_BYTES;
use crate::size::item_size;
use crate::tables::tx_attr as a;

fn put(operation: Value) -> crate::model::Operation {
    crate::model::Operation::parse(&operation, "operation").unwrap()
}

/// A record whose first write is exactly [`MAX_RECORD_BYTES`], with the most participants, each with
/// one operation; the first operation's data is padded to the bound.
fn record_at_the_bound(keyed: bool) -> TransactionRecord {
    let entry = |i: usize, data: &str| ParticipantEntry {
        service: format!("service-{i:02}"),
        operations: vec![put(serde_json::json!({"op": "put", "key": {"entityId": "A"}, "data": {"x": data}}))],
        vote: None,
        code: None,
        reason: None,
        read_only: false,
        lock_token: None,
        service_code: None,
        blocked_by: None,
        unresolved_owner: None,
        never_ran: false,
        ended_without_vote: false,
    };
    let mut record = TransactionRecord {
        transaction_id: "tx-00000000000000000000000000000000".into(),
        status: Status::Preparing,
        participants: (0..MAX_PARTICIPANTS).map(|i| entry(i, "")).collect(),
        created_at: 1_764_000_000_000,
        updated_at: 1_764_000_000_000,
        deadline: 1_764_000_025_000,
        reason: None,
        request_hash: keyed.then(|| "0".repeat(64)),
        expire_at: None,
        open_shard: None,
        sweep_at: None,
        sweep_attempts: None,
        sweep_error: None,
        execution_id: Some("0".repeat(32)),
        principal: Some(format!("arn:aws:sts::123456789012:assumed-role/{}", "r".repeat(64))),
        hold_ms: Some(crate::model::DEFAULT_MAX_HOLD_MS),
        hold_until: None,
        // A later attempt's: what an attempt adds to its record is inside the headroom too.
        started_at: Some(1_764_000_000_000),
        attempt: Some(u32::MAX),
        first_transaction_id: Some("tx-00000000000000000000000000000000".into()),
        retried_as: None,
        refused_for_contention: false,
        age_claimed_by: None,
        // A caller's retry with an age token names the attempt whose age it keeps.
        age_of: Some(format!("tx-{}-{}", "0".repeat(32), u32::MAX)),
        body_hash: Some("0".repeat(64)),
        audit: Vec::new(),
    }
    .opened();
    let short = item_size(&record.to_item());
    record.participants[0] = entry(0, &"d".repeat(MAX_RECORD_BYTES - short));
    assert_eq!(item_size(&record.to_item()), MAX_RECORD_BYTES);
    assert!(record.check_first_write().is_ok());
    record
}

/// The largest vote a participant can leave in a record: every field at once, at its longest.
fn worst_votes(record: &TransactionRecord) -> Vec<ParticipantEntry> {
    let longest_code =
        RefusalCode::ALL.into_iter().max_by_key(|c| serde_json::to_value(c).unwrap().as_str().unwrap().len()).unwrap();
    record
        .participants
        .iter()
        .cloned()
        .map(|p| ParticipantEntry {
            vote: Some(Vote::Prepared),
            code: Some(longest_code),
            reason: Some("é".repeat(MAX_REASON_BYTES)),
            read_only: true,
            lock_token: Some("f".repeat(32)),
            service_code: Some("c".repeat(crate::model::MAX_SERVICE_CODE_BYTES)),
            ..p
        })
        .collect()
}

const LATEST: u64 = u64::MAX;

/// Every write after the first, applied in turn to a record at the bound in the order that grows it
/// most (a postponement, the decision with the largest votes and reason, another postponement, the
/// end), stays under DynamoDB's 400 KB with the reserved room left over; so do the records created
/// with votes (an unkeyed decision, an abort without a record, a one-phase commit).
#[test]
fn every_later_write_fits_the_headroom() {
    let reserved = RESERVED_PER_RECORD_BYTES + MAX_PARTICIPANTS * RESERVED_PER_PARTICIPANT_BYTES;
    let limit = MAX_ITEM_BYTES - reserved;
    let long_text = "x".repeat(100_000);
    let mut largest = 0;
    for keyed in [true, false] {
        let base = record_at_the_bound(keyed);
        let votes = worst_votes(&base);
        // Decided at once (the decision carries the votes), or held first (the hold carries them, then
        // the caller's or the expiry's decision).
        for (held, decision) in [false, true].into_iter().flat_map(|h| [(h, Status::Committing), (h, Status::Aborting)])
        {
            let terminal = if decision == Status::Committing { Status::Committed } else { Status::Aborted };
            let mut writes = vec![("postpone", postpone_update(LATEST, u32::MAX, &long_text))];
            if held {
                let hold = transition_update(Status::Prepared, keyed, LATEST, Some(&votes), None);
                writes.push(("hold", hold_update(hold, LATEST)));
            }
            let decision_votes = if held { None } else { Some(&votes[..]) };
            writes.extend([
                ("decision", transition_update(decision, keyed, LATEST, decision_votes, Some(&long_text))),
                ("postpone again", postpone_update(LATEST, u32::MAX, &long_text)),
                ("end", transition_update(terminal, keyed, LATEST, None, None)),
            ]);
            let mut item = base.to_item();
            for (name, write) in writes {
                item = write.applied_to(&item);
                let bytes = item_size(&item);
                largest = largest.max(bytes);
                assert!(bytes <= limit, "{name} to {decision} (keyed {keyed}, held {held}): {bytes} bytes > {limit}");
            }
        }
        // Lock resolution's abort of a PREPARING record, with its reason.
        let resolved = transition_update(Status::Aborting, keyed, LATEST, None, Some(&long_text));
        assert!(item_size(&resolved.applied_to(&base.to_item())) <= limit);
    }
    // Created with votes: an unkeyed commit decision, an abort of a record never written (with the
    // reason), a one-phase commit's record; each then postponed and ended.
    let base = record_at_the_bound(false);
    let votes = worst_votes(&base);
    for (status, reason) in [(Status::Committing, None), (Status::Aborted, Some(long_text.clone()))] {
        let mut created = TransactionRecord { status, participants: votes.clone(), reason, ..base.clone() };
        if status.is_terminal() {
            created = created.ended(status, LATEST);
        }
        let mut item = created.bounded().to_item();
        assert!(item_size(&item) <= limit, "created {status}: {}", item_size(&item));
        item = postpone_update(LATEST, u32::MAX, &long_text).applied_to(&item);
        item = transition_update(Status::Committed, false, LATEST, None, None).applied_to(&item);
        assert!(item_size(&item) <= limit, "created {status}, ended: {}", item_size(&item));
        largest = largest.max(item_size(&item));
    }
    println!("the largest record a later write makes: {} bytes of {MAX_ITEM_BYTES}", largest);
}

/// The forms written when DynamoDB refuses the full one never make the record larger (but a commit
/// decision's, which adds the lock tokens): DynamoDB, which stored the record, stores them too.
#[test]
fn shortened_writes_never_grow_the_record() {
    let long_text = "x".repeat(100_000);
    // Records with and without the sweeper's fields, written over with later times.
    for (keyed, swept) in [(true, true), (false, true), (true, false), (false, false)] {
        let mut current = record_at_the_bound(keyed);
        current.updated_at = 1_000_000_000_000;
        current.sweep_at = Some(1_764_000_025_123);
        if swept {
            current.reason = Some(cut(&long_text, MAX_REASON_BYTES));
            current.sweep_error = Some(cut(&long_text, MAX_SWEEP_ERROR_BYTES));
            current.sweep_attempts = Some(3);
        }
        let now = 2_999_999_999_999;
        let item = current.to_item();
        for (from, to) in [
            (Status::Preparing, Status::Aborting),
            (Status::Committing, Status::Committed),
            (Status::Aborting, Status::Aborted),
        ] {
            let current = TransactionRecord { status: from, participants: worst_votes(&current), ..current.clone() };
            let item = current.to_item();
            let shortened = shortened_transition_update(&current, to, keyed, now, None);
            let after = shortened.applied_to(&item);
            assert!(item_size(&after) <= item_size(&item), "{from} → {to} (keyed {keyed})");
            let ended = TransactionRecord::from_item(&after).unwrap();
            assert_eq!(ended.status, to);
            assert_eq!(ended.request_hash, current.request_hash);
            assert_eq!(ended.execution_id, current.execution_id);
            for (kept, was) in ended.participants.iter().zip(&current.participants) {
                assert_eq!((&kept.service, &kept.lock_token), (&was.service, &was.lock_token));
                // An open record keeps the operations still to apply or to release.
                assert_eq!(kept.operations.is_empty(), to.is_terminal(), "{from} → {to}");
            }
        }
        let postponed = shortened_postpone_update(now).applied_to(&item);
        assert!(item_size(&postponed) <= item_size(&item), "postponed (swept {swept})");
        assert!(TransactionRecord::from_item(&postponed).unwrap().sweep_at >= Some(now));
        let ended = current.clone().ended(Status::Aborted, current.updated_at);
        assert!(item_size(&ended.shortened().to_item()) <= item_size(&ended.to_item()));
    }
}

#[test]
fn a_record_one_byte_over_the_bound_is_refused_naming_the_limit() {
    let mut record = record_at_the_bound(true);
    let crate::model::Operation::Put { data, .. } = &mut record.participants[0].operations[0] else { panic!("a put") };
    let Some(Value::String(data)) = data.get_mut("x") else { panic!("padded") };
    data.push('d');
    let refused = record.check_first_write().unwrap_err();
    assert_eq!(refused.code, ErrorCode::LimitExceeded);
    assert!(refused.message.contains(&format!("the limit is {MAX_RECORD_BYTES} bytes")), "{refused}");
}

#[test]
fn text_is_cut_at_a_character_boundary() {
    assert_eq!(cut("short", 10), "short");
    let cut_text = cut(&"é".repeat(100), 11);
    assert!(cut_text.len() <= 11 && cut_text.ends_with('…'), "{cut_text}");
}

// --- what each writer may write (the deployment's IAM conditions on `dynamodb:Attributes`) ---------

/// The names outside `allowed`.
fn outside<'a>(allowed: &[&str], names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    names.into_iter().filter(|name| !allowed.contains(name)).collect()
}

/// A record with every field present. Listed field by field: a new field fails to compile here, and
/// then `record_attributes_are_every_field_of_the_record` until [`RECORD_ATTRIBUTES`] names it.
fn record_with_every_field(status: Status) -> TransactionRecord {
    TransactionRecord {
        transaction_id: "tx-1".into(),
        status,
        participants: vec![ParticipantEntry {
            service: "service-a".into(),
            operations: vec![put(serde_json::json!({"op": "put", "key": {"entityId": "A"}, "data": {}}))],
            vote: Some(Vote::Prepared),
            code: Some(RefusalCode::ALL[0]),
            reason: Some("why".into()),
            read_only: false,
            lock_token: Some("f".repeat(32)),
            service_code: Some("code".into()),
            blocked_by: None,
            unresolved_owner: None,
            never_ran: false,
            ended_without_vote: false,
        }],
        created_at: 1_764_000_000_000,
        updated_at: 1_764_000_000_001,
        deadline: 1_764_000_025_000,
        reason: Some("why".into()),
        request_hash: Some("0".repeat(64)),
        expire_at: Some(1_764_000_000),
        open_shard: Some(open_shard("tx-1")),
        sweep_at: Some(1_764_000_025_000),
        sweep_attempts: Some(2),
        sweep_error: Some("unreachable".into()),
        execution_id: Some("0".repeat(32)),
        principal: Some("arn:aws:iam::123456789012:role/caller".into()),
        hold_ms: Some(1_000),
        hold_until: Some(1_764_000_001_000),
        started_at: Some(1_763_999_999_000),
        attempt: Some(2),
        first_transaction_id: Some("tx-0".into()),
        retried_as: Some("tx-0-3".into()),
        refused_for_contention: true,
        age_claimed_by: Some("tx-9".into()),
        age_of: Some("tx-8-2".into()),
        body_hash: Some("1".repeat(64)),
        audit: vec![AuditEntry::new(1_764_000_000_002, "arn:aws:iam::123456789012:role/ops", "abort", "ABORTED")],
    }
}

/// Only the coordinator's link is followed: the next attempt of the same request. A token retry that a
/// record written before issue 41 names in `retriedAs` (`<first>-r<n>`) is a request of its own.
#[test]
fn a_successor_is_the_coordinators_next_attempt_only() {
    let mut record = record_with_every_field(Status::Aborted);
    assert_eq!(record.successor(), Some("tx-0-3"));
    record.retried_as = Some("tx-0-r3".into());
    assert_eq!(record.successor(), None);
    assert_eq!(record.to_response()["ageClaimedBy"], "tx-9");
    record.age_claimed_by = None;
    assert_eq!(record.to_response()["ageClaimedBy"], "tx-0-r3", "a legacy token link is shown as one");
    assert!(record.to_response().get("retriedAs").is_none());
    let mut first = record_with_every_field(Status::Aborted);
    (first.attempt, first.first_transaction_id, first.transaction_id) = (None, None, "tx-0".into());
    first.retried_as = Some("tx-0-2".into());
    assert_eq!(first.successor(), Some("tx-0-2"));
}

/// A chain's step follows an attempt of the same caller and body only (issue 42); a record from before
/// `bodyHash` by its `requestHash`, and one with neither never.
#[test]
fn an_attempt_is_the_same_requests_by_its_caller_and_body_hash() {
    let first = record_with_every_field(Status::Aborted);
    let next = first.next_attempt("tx-0-3".into(), 3, 1);
    assert!(first.same_request(&next));
    let mut other_caller = next.clone();
    other_caller.principal = Some("arn:aws:iam::123456789012:user/mallory".into());
    assert!(!first.same_request(&other_caller));
    let mut other_body = next.clone();
    other_body.body_hash = Some("f".repeat(64));
    assert!(!first.same_request(&other_body));
    // Written before bodyHash: its requestHash (a keyed request's is its body's hash) stands in.
    let (mut old_first, mut old_next) = (first.clone(), next.clone());
    (old_first.body_hash, old_next.body_hash) = (None, None);
    old_first.request_hash = first.body_hash.clone();
    old_next.request_hash = first.body_hash.clone();
    assert!(old_first.same_request(&old_next) && first.same_request(&old_next));
    old_next.request_hash = None;
    assert!(!old_first.same_request(&old_next), "neither hash: not followed");
    let resolved = absent_owner_record("tx-0-3", 1, "no record");
    assert!(!first.same_request(&resolved), "a resolver's record names no caller and no body");
}

#[test]
fn record_attributes_are_every_field_of_the_record() {
    let record = record_with_every_field(Status::Prepared);
    let item = record.to_item();
    let mut written: Vec<&str> = item.keys().map(String::as_str).collect();
    written.sort_unstable();
    let mut named = RECORD_ATTRIBUTES.to_vec();
    named.sort_unstable();
    assert_eq!(written, named, "RECORD_ATTRIBUTES is not the attributes of a record with every field");
    assert_eq!(TransactionRecord::from_item(&item).unwrap(), record);
    // Each writer's list is a list of the record's attributes, each once; an owner's abort is a write
    // recovery makes too (the sweeper resolves locks as participants do).
    for (list, of) in [(RECOVERY_WRITES, RECORD_ATTRIBUTES), (OWNER_ABORT_WRITES, RECOVERY_WRITES)] {
        assert_eq!(outside(of, list.iter().copied()), Vec::<&str>::new());
        let mut once = list.to_vec();
        once.sort_unstable();
        once.dedup();
        assert_eq!(once.len(), list.len(), "{list:?} names an attribute twice");
    }
    assert!(RECOVERY_WRITES.contains(&a::ID) && OWNER_ABORT_WRITES.contains(&a::ID), "every request names the key");
    // `dynamodb:Attributes` counts a condition expression's names too: a status change's (`update_status`:
    // the status), a postponement's (`update_open`: openShard), a new record's (`put_new`: the key).
    for name in [a::STATUS, a::OPEN_SHARD, a::ID] {
        assert!(RECOVERY_WRITES.contains(&name), "recovery's conditions name {name}");
    }
    assert!(OWNER_ABORT_WRITES.contains(&a::STATUS), "an owner's abort is conditioned on the status");
}

/// Every write recovery can make (the sweeper: [`crate::coordinator::Coordinator::recover`],
/// [`TransactionStore::postpone`], [`crate::recovery::owner_fate`]), over-approximated (every status
/// change to every status from every status, keyed or not, with and without votes and a reason, full
/// and shortened), names only [`RECOVERY_WRITES`]: an attribute it starts writing fails here until the
/// list (and the sweeper's IAM condition in the templates) is updated.
#[test]
fn recovery_writes_only_what_recovery_writes_may_write() {
    let now = 1_764_000_030_000;
    let votes = worst_votes(&record_with_every_field(Status::Preparing));
    let mut writes: Vec<(String, Vec<String>)> = vec![];
    for to in Status::ALL {
        for keyed in [true, false] {
            for participants in [None, Some(&votes[..])] {
                for reason in [None, Some("why")] {
                    let update = transition_update(to, keyed, now, participants, reason);
                    let what = format!("→ {to} (keyed {keyed}, votes {}, reason {reason:?})", participants.is_some());
                    writes.push((what, update.names().map(str::to_owned).collect()));
                }
                for from in Status::ALL {
                    let current = record_with_every_field(from);
                    let update = shortened_transition_update(&current, to, keyed, now, participants);
                    let what = format!("{from} → {to} shortened (keyed {keyed}, votes {})", participants.is_some());
                    writes.push((what, update.names().map(str::to_owned).collect()));
                }
            }
        }
    }
    writes.push(("postponement".into(), postpone_update(now, 3, "unreachable").names().map(str::to_owned).collect()));
    writes.push(("shortened postponement".into(), shortened_postpone_update(now).names().map(str::to_owned).collect()));
    // The PutItem of an absent owner's ABORTED record, as `create` writes it (bounded), and shortened.
    let absent = absent_owner_record("tx-1", now, &"x".repeat(10_000)).bounded();
    for (what, record) in
        [("absent owner's record", absent.clone()), ("absent owner's record shortened", absent.shortened())]
    {
        writes.push((what.into(), record.to_item().into_keys().collect()));
    }
    for (what, names) in &writes {
        let refused = outside(RECOVERY_WRITES, names.iter().map(String::as_str));
        assert!(refused.is_empty(), "recovery's {what} writes {refused:?}, not in RECOVERY_WRITES");
    }
    // The hold is the coordinator's alone: were recovery to write it, this test would say so.
    let hold = hold_update(transition_update(Status::Prepared, true, now, Some(&votes), None), now);
    assert_eq!(outside(RECOVERY_WRITES, hold.names()), vec![a::HOLD_UNTIL]);
}

/// A lock resolver's abort of an expired owner ([`crate::recovery::owner_fate`]: PREPARING or PREPARED →
/// ABORTING, with its reason, full or shortened), the one UpdateItem a participant makes to a record,
/// names only [`OWNER_ABORT_WRITES`]: an attribute it starts writing fails here until the list (and the
/// participants' IAM condition in the templates) is updated.
#[test]
fn an_owner_abort_writes_only_what_an_owner_abort_may_write() {
    let now = 1_764_000_030_000;
    for from in [Status::Preparing, Status::Prepared] {
        for keyed in [true, false] {
            for reason in [None, Some(crate::recovery::EXPIRED_REASON), Some(crate::recovery::HOLD_EXPIRED_REASON)] {
                let full = transition_update(Status::Aborting, keyed, now, None, reason);
                let refused = outside(OWNER_ABORT_WRITES, full.names());
                assert!(refused.is_empty(), "{from} → ABORTING (keyed {keyed}, reason {reason:?}) writes {refused:?}");
            }
            let current = record_with_every_field(from);
            let shortened = shortened_transition_update(&current, Status::Aborting, keyed, now, None);
            let refused = outside(OWNER_ABORT_WRITES, shortened.names());
            assert!(refused.is_empty(), "{from} → ABORTING shortened (keyed {keyed}) writes {refused:?}");
        }
    }
    // Votes with the abort would be refused a participant: were it to write them, this test would say so.
    let votes = worst_votes(&record_with_every_field(Status::Preparing));
    let with_votes = transition_update(Status::Aborting, true, now, Some(&votes), None);
    assert_eq!(outside(OWNER_ABORT_WRITES, with_votes.names()), vec![a::PARTICIPANTS]);
}

/// Operations are typed in the record, and kept in the table as the contract's JSON: what the coordinator
/// recorded is, read back, the same operations and the same JSON (number forms, a service's own kind and
/// its fields, an empty list of a finished transaction).
#[test]
fn a_records_operations_read_back_as_they_were_written() {
    let written = [
        serde_json::json!({"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": -1.5, "min": 0}),
        serde_json::json!({"op": "put", "key": {"entityId": "B", "n": 7}, "data": {"x": [1, {"y": null}]}, "ifNotExists": true}),
        serde_json::json!({"op": "set", "key": {"entityId": "C"}, "set": {"n": 1e3}}),
        serde_json::json!({"op": "check", "key": {"entityId": "D"}, "version": 4, "exists": true}),
        serde_json::json!({"op": "delete", "key": {"entityId": "E"}}),
        serde_json::json!({"op": "reserve", "key": {"entityId": "F"}, "quantity": 3, "note": "two words"}),
    ];
    let any = crate::custom::Catalog::any();
    let operations: Vec<_> =
        written.iter().map(|op| crate::model::Operation::parse_for(op, "operation", &any).unwrap()).collect();
    let mut record = record_at_the_bound(false);
    record.participants.truncate(2);
    record.participants[0].operations = operations.clone();
    record.participants[1].operations.clear();
    let item = record.to_item();
    let stored: Value = serde_dynamo::from_item(item.clone()).unwrap();
    assert_eq!(stored["participants"][0]["operations"], Value::Array(written.to_vec()));
    assert_eq!(stored["participants"][1]["operations"], serde_json::json!([]));
    let read = TransactionRecord::from_item(&item).unwrap();
    assert_eq!(read.participants[0].operations, operations);
    assert!(read.participants[1].operations.is_empty());
    assert_eq!(read, record);
}

/// The operators' audit (`/admin`): at most [`MAX_AUDIT_ENTRIES`] entries of cut texts, which take at most
/// [`MAX_AUDIT_BYTES`], inside the part of the headroom kept for fields added later.
#[test]
fn a_full_audit_fits_its_share_of_the_headroom() {
    let long = "é".repeat(1_000);
    let entry = AuditEntry::new(u64::MAX, &long, &long, &long);
    assert!(entry.by.len() <= MAX_AUDIT_TEXT_BYTES && entry.by.ends_with('…'), "{}", entry.by);
    let mut record = record_with_every_field(Status::Aborted);
    record.audit = Vec::new();
    let without = item_size(&record.to_item());
    record.audit = vec![entry; MAX_AUDIT_ENTRIES];
    let audit_bytes = item_size(&record.to_item()) - without;
    println!("a full audit: {audit_bytes} bytes (bound {MAX_AUDIT_BYTES})");
    assert!(audit_bytes <= MAX_AUDIT_BYTES, "{audit_bytes} > {MAX_AUDIT_BYTES}");
    const { assert!(MAX_AUDIT_BYTES < RESERVED_PER_RECORD_BYTES) };
}
