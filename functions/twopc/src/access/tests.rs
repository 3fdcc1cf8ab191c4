//! Who may do what, judged on requests and answers: the policy's parse, ownership, credits, guards,
//! held requests and the hiding of other callers' transactions.

use super::*;
use serde_json::json;

fn op(value: Value) -> Operation {
    Operation::parse(&value, "op").unwrap()
}

fn alice() -> Caller {
    Caller::jwt("https://issuer", "alice", false)
}

#[test]
fn owners_are_the_sub_and_its_hash_prefixed_ids() {
    let alice = alice();
    assert!(alice.owns("alice") && alice.owns("alice#savings"));
    assert!(!alice.owns("alicex") && !alice.owns("bob") && !alice.owns("") && !alice.owns("#alice"));
    assert_eq!(alice.principal.as_deref(), Some("jwt:https://issuer#alice"));
    assert_eq!(Caller::from_context("jwt:https://issuer#alice", Some("alice"), Some("false"), None), Some(alice));
    assert_eq!(Caller::from_context("jwt:https://issuer#alice", Some("bob"), None, None), None);
    let odd = Caller::jwt("https://issuer/#x", "alice", false);
    let context = Caller::from_context(odd.principal.as_deref().unwrap(), Some("alice"), Some("false"), None);
    assert_eq!(context, Some(odd));
    assert_eq!(Caller::from_context("arn:aws:iam::1:role/x", None, None, None), None);
}

/// The templates' default: the example wallets' balances may be credited.
const WALLETS: &str = r#"{"allowCredits": {"service-a": ["balance"], "service-b": ["balance"]}}"#;

#[test]
fn the_default_policy_lets_a_user_write_its_own_items_and_credit_others() {
    let policy = Policy::parse(Some(WALLETS)).unwrap();
    let alice = alice();
    let own = op(json!({"op": "add", "key": {"entityId": "alice"}, "field": "balance", "delta": -5, "min": 0}));
    assert!(policy.check_operation(&alice, "service-a", &own, "p").is_ok());
    let credit = op(json!({"op": "add", "key": {"entityId": "bob"}, "field": "balance", "delta": 5}));
    assert!(policy.check_operation(&alice, "service-a", &credit, "p").is_ok());
    let debit = op(json!({"op": "add", "key": {"entityId": "bob"}, "field": "balance", "delta": -5}));
    assert_eq!(policy.check_operation(&alice, "service-a", &debit, "p").unwrap_err().code, ErrorCode::Forbidden);
    let zero = op(json!({"op": "add", "key": {"entityId": "bob"}, "field": "balance", "delta": 0}));
    assert_eq!(policy.check_operation(&alice, "service-a", &zero, "p").unwrap_err().code, ErrorCode::Forbidden);
    // Credits DynamoDB might refuse as out of range or precision would read the balance's magnitude.
    for probe in ["99999999999999999999999999999999999990", "1e20", "0.0000001"] {
        let delta: Value = serde_json::from_str(probe).unwrap();
        let huge = op(json!({"op": "add", "key": {"entityId": "bob"}, "field": "balance", "delta": delta}));
        let refused = policy.check_operation(&alice, "service-a", &huge, "p").unwrap_err();
        assert_eq!(refused.code, ErrorCode::Forbidden, "{probe}");
    }
    for fine in ["0.000001", "99999999999999999999.5", "12.25"] {
        let delta: Value = serde_json::from_str(fine).unwrap();
        let credit = op(json!({"op": "add", "key": {"entityId": "bob"}, "field": "balance", "delta": delta}));
        assert!(policy.check_operation(&alice, "service-a", &credit, "p").is_ok(), "{fine}");
    }
    // A service's own operation is a write like the others, unless the service authorizes callers itself.
    let reserve = Operation::Custom {
        kind: "reserve".into(),
        key: serde_json::from_value(json!({"entityId": "lamp"})).unwrap(),
        fields: serde_json::Map::new(),
        computed: None,
    };
    assert_eq!(policy.check_operation(&alice, "inventory", &reserve, "p").unwrap_err().code, ErrorCode::Forbidden);
    let trusting = Policy::parse(Some(r#"{"selfAuthorizingServices": ["inventory"]}"#)).unwrap();
    assert!(trusting.check_operation(&alice, "inventory", &reserve, "p").is_ok());
    let put = op(json!({"op": "put", "key": {"entityId": "bob"}, "data": {"x": 1}}));
    assert_eq!(policy.check_operation(&alice, "service-a", &put, "p").unwrap_err().code, ErrorCode::Forbidden);
    for guard in [
        json!({"op": "add", "key": {"entityId": "bob"}, "field": "balance", "delta": 0, "max": 100}),
        json!({"op": "add", "key": {"entityId": "bob"}, "field": "balance", "delta": 1, "min": 0}),
        json!({"op": "check", "key": {"entityId": "bob"}, "exists": true}),
    ] {
        let refused = policy.check_operation(&alice, "service-a", &op(guard), "p").unwrap_err();
        assert_eq!(refused.code, ErrorCode::GuardNotAllowed, "{refused}");
    }
    let admin = Caller::jwt("https://issuer", "root", true);
    assert!(policy.check_operation(&admin, "service-a", &debit, "p").is_ok());
}

#[test]
fn credits_are_the_fields_the_policy_names() {
    let alice = alice();
    let wallets = Policy::parse(Some(WALLETS)).unwrap();
    let add = |field: &str| op(json!({"op": "add", "key": {"entityId": "bob"}, "field": field, "delta": 5}));
    assert_eq!(wallets.check_operation(&alice, "service-b", &add("balance"), "p"), Ok(Allowed::Credit));
    for (service, field) in [("inventory", "stock"), ("service-a", "points"), ("unknown", "balance")] {
        let refused = wallets.check_operation(&alice, service, &add(field), "p").unwrap_err();
        assert_eq!(refused.code, ErrorCode::Forbidden, "{service}.{field}");
        assert!(refused.message.contains("service-a: balance; service-b: balance"), "{refused}");
    }
    // Her own items are hers whatever the credits.
    let own = op(json!({"op": "add", "key": {"entityId": "alice"}, "field": "stock", "delta": 5}));
    assert_eq!(wallets.check_operation(&alice, "inventory", &own, "p"), Ok(Allowed::Owned));

    // None by default: a deployment names what may be credited.
    let refused = Policy::default().check_operation(&alice, "service-a", &add("balance"), "p").unwrap_err();
    assert_eq!(refused.code, ErrorCode::Forbidden);
    assert!(!refused.message.contains("credit"), "{refused}");

    // The old boolean: true is any field of the services in writeServices (every one when null).
    let any = Policy::parse(Some(r#"{"allowCredits": true}"#)).unwrap();
    assert_eq!(any.allow_credits, Credits::Any(true));
    assert_eq!(any.check_operation(&alice, "inventory", &add("stock"), "p"), Ok(Allowed::Credit));
    let narrowed = Policy::parse(Some(r#"{"allowCredits": true, "writeServices": ["service-a"]}"#)).unwrap();
    assert_eq!(narrowed.check_operation(&alice, "service-a", &add("points"), "p"), Ok(Allowed::Credit));
    let refused = narrowed.check_operation(&alice, "inventory", &add("stock"), "p").unwrap_err();
    assert!(refused.message.contains("of the services service-a"), "{refused}");
    let none = Policy::parse(Some(r#"{"allowCredits": false}"#)).unwrap();
    assert!(none.check_operation(&alice, "service-a", &add("balance"), "p").is_err());

    // Anything else is refused at parse, saying what is expected.
    for bad in [r#"{"allowCredits": ["balance"]}"#, r#"{"allowCredits": {"service-a": "balance"}}"#] {
        let refused = Policy::parse(Some(bad)).unwrap_err();
        assert!(refused.contains(r#"{"service-a": ["balance"]}"#), "{bad}: {refused}");
    }
}

/// What `parse` logs for a policy (the warnings a reader gives at its start).
fn logged_parsing(text: &str) -> String {
    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    tracing::subscriber::with_default(subscriber, || Policy::parse(Some(text)).unwrap());
    String::from_utf8(lines.0.lock().unwrap().clone()).unwrap()
}

#[test]
fn the_old_boolean_is_parsed_with_a_warning() {
    for old in [r#"{"allowCredits": true}"#, r#"{"allowCredits": false}"#] {
        let logged = logged_parsing(old);
        assert!(
            logged.contains("WARN") && logged.contains("allowCredits is a boolean, which is deprecated"),
            "{logged}"
        );
    }
    assert_eq!(logged_parsing(WALLETS), "");
    assert_eq!(logged_parsing("{}"), "");
}

#[test]
fn a_held_request_credits_only_the_callers_own_items() {
    let wallets = Policy::parse(Some(WALLETS)).unwrap();
    let alice = alice();
    let request = |hold: &str, to: &str| {
        let body = format!(
            r#"{{"participants": [
                {{"service": "service-a", "operations": [{{"op": "add", "key": {{"entityId": "alice"}}, "field": "balance", "delta": -5, "min": 0}}]}},
                {{"service": "service-b", "operations": [{{"op": "add", "key": {{"entityId": "{to}"}}, "field": "balance", "delta": 5}}]}}
            ]{hold}}}"#
        );
        TransactionRequest::parse(body.as_bytes(), |_| true).unwrap()
    };
    assert!(wallets.check_request(&alice, &request("", "bob")).is_ok());
    assert!(wallets.check_request(&alice, &request(r#", "holdMs": 60000"#, "alice#2")).is_ok());
    let refused = wallets.check_request(&alice, &request(r#", "holdMs": 60000"#, "bob")).unwrap_err();
    assert_eq!(refused.code, ErrorCode::HeldCreditNotAllowed, "{refused}");
    assert_eq!(refused.code.http_status(), 403);
    assert!(refused.message.starts_with("participants[1].operations[0]: "), "{refused}");
    let admin = Caller::jwt("https://issuer", "root", true);
    assert!(wallets.check_request(&admin, &request(r#", "holdMs": 60000"#, "bob")).is_ok());
}

#[test]
fn narrowed_policies_refuse_credits_services_and_tables() {
    let policy = Policy::parse(Some(
        r#"{"allowCredits": false, "writeServices": ["service-a"], "readTables": ["service-a-data"]}"#,
    ))
    .unwrap();
    let alice = alice();
    let credit = op(json!({"op": "add", "key": {"entityId": "bob"}, "field": "balance", "delta": 5}));
    assert_eq!(policy.check_operation(&alice, "service-a", &credit, "p").unwrap_err().code, ErrorCode::Forbidden);
    let own = op(json!({"op": "put", "key": {"entityId": "alice"}, "data": {}}));
    assert!(policy.check_operation(&alice, "service-a", &own, "p").is_ok());
    assert!(policy.check_operation(&alice, "service-b", &own, "p").is_err());
    assert!(policy.may_read(&alice, "service-a-data", "alice#1"));
    assert!(!policy.may_read(&alice, "service-b-data", "alice"));
    assert!(Policy::parse(Some(r#"{"adminGroup": []}"#)).unwrap_err().contains("adminGroup"));
}

#[test]
fn iam_principals_are_admins_unless_the_policy_lists_them() {
    let arn = "arn:aws:sts::123456789012:assumed-role/Orders";
    assert!(Policy::default().iam(Some(arn)).admin);
    assert!(Policy::default().iam(None).admin);
    let narrowed = Policy::parse(Some(r#"{"iamAdmins": ["Orders"]}"#)).unwrap();
    assert!(narrowed.iam(Some(arn)).admin);
    assert!(narrowed.iam(Some("arn:aws:iam::123456789012:role/ops/Orders")).admin);
    let other = narrowed.iam(Some("arn:aws:sts::123456789012:assumed-role/Billing"));
    assert!(!other.admin && !narrowed.iam(None).admin);
    assert!(narrowed.may_see(&other, Some("arn:aws:sts::123456789012:assumed-role/Billing")));
    assert!(!narrowed.may_see(&other, Some(arn)) && !narrowed.may_see(&other, None));
}

#[test]
fn refusals_show_their_reasons_only_to_who_may_read_the_items() {
    let policy = Policy::default();
    let answer = json!({
        "status": "ABORTED",
        "reason": "service-a: balance 40 is below min 50; service-b: rule says 7",
        "participants": [
            {"service": "service-a", "vote": "REFUSED", "code": "CONDITION_FAILED", "reason": "balance 40 is below min 50"},
            {"service": "service-b", "vote": "REFUSED", "code": "RULE", "reason": "rule says 7"},
        ],
    });
    let items = [vec!["bob".to_owned()], vec!["alice#1".to_owned()]];
    let mut seen = answer.clone();
    policy.redact_answer(&alice(), &mut seen, &items);
    assert_eq!(seen["participants"][0]["reason"], HIDDEN_REASON);
    assert_eq!(seen["participants"][0]["code"], "CONDITION_FAILED");
    assert_eq!(seen["participants"][1]["reason"], "rule says 7");
    assert!(!seen.to_string().contains("40"), "{seen}");
    let mut admin_view = answer.clone();
    policy.redact_answer(&Caller::jwt("https://issuer", "root", true), &mut admin_view, &items);
    assert_eq!(admin_view, answer);
}

#[test]
fn another_callers_blocker_is_named_without_its_id() {
    // Each way a participant names a lock's owner (protocol.rs: wait-die, TIMEOUT, still deciding, held).
    let answer = json!({
        "transactionId": "tx-mine",
        "status": "ABORTED",
        "reason": "service-a: entity d/alice is locked by transaction tx-other-2, held for its caller's decision; \
                   service-b: entity d/alice#2 is locked by transaction tx-own; waited 80 ms for it, as long as the deadline allows",
        "participants": [
            {"service": "service-a", "code": "CONFLICT",
             "reason": "entity d/alice is locked by transaction tx-other-2, held for its caller's decision"},
            {"service": "service-b", "code": "TIMEOUT",
             "reason": "entity d/alice#2 is locked by transaction tx-own; waited 80 ms for it, as long as the deadline allows"},
            {"service": "inventory", "code": "CONFLICT",
             "reason": "entity is locked by transaction tx-third, which is still deciding"},
            {"service": "payments", "code": "CONFLICT",
             "reason": "transaction tx-mine holds only some of its items here: it is already being finished"},
            // An expired owner a participant may not decide (issue 42), and a one-phase id (`~`).
            {"service": "s5", "code": "CONFLICT",
             "reason": "entity is locked by transaction tx-expired, past its deadline and undecided; \
                        it is aborted by the coordinator or the sweeper, not by a participant"},
            {"service": "s6", "code": "CONFLICT", "reason": "retry of transaction 1p~s6~tx-one-2 ran"},
        ],
    });
    let named = transactions_named(&answer);
    let expected: std::collections::BTreeSet<String> =
        ["tx-other-2", "tx-own", "tx-third", "tx-expired", "1p~s6~tx-one-2"].iter().map(|s| s.to_string()).collect();
    assert_eq!(named, expected);
    let mut seen = answer.clone();
    let hidden = ["tx-other-2", "tx-third", "tx-expired", "1p~s6~tx-one-2"].iter().map(|s| s.to_string()).collect();
    hide_transactions(&mut seen, &hidden);
    let text = seen.to_string();
    assert!(!text.contains("tx-other") && !text.contains("tx-third"), "{text}");
    assert!(!text.contains("tx-expired") && !text.contains("tx-one"), "{text}");
    assert_eq!(
        seen["participants"][0]["reason"],
        "entity d/alice is locked by another caller's transaction, held for its caller's decision"
    );
    assert_eq!(
        seen["participants"][2]["reason"],
        "entity is locked by another caller's transaction, which is still deciding"
    );
    assert_eq!(seen["participants"][1], answer["participants"][1], "the caller's own is named");
    assert_eq!(seen["participants"][3], answer["participants"][3]);
    assert!(seen["reason"].as_str().unwrap().starts_with("service-a: entity d/alice is locked by another caller's"));
    assert!(seen["reason"].as_str().unwrap().contains("transaction tx-own;"));
}

#[test]
fn admin_claims_are_groups_or_a_flag() {
    let policy = Policy::default();
    assert!(policy.is_admin_claims(&json!({"cognito:groups": ["users", "admins"]})));
    assert!(policy.is_admin_claims(&json!({"groups": "admins"})));
    assert!(policy.is_admin_claims(&json!({"twopc:admin": true})));
    assert!(!policy.is_admin_claims(&json!({"twopc:admin": false, "groups": ["users"]})));
    assert!(!policy.is_admin_claims(&json!({})));
}
