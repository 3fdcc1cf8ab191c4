//! Who may do what: two users (alice and bob) and an admin against the local stack started with
//! `--auth jwt` (its development issuer, its authorizer fetching the JWKS over HTTP, the default access
//! policy), through the typed client (bearer tokens, real HTTP and a real WebSocket); and the
//! idempotency keys of callers from before keys were scoped, against the coordinator's core.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use local_stack::{Auth, Config, Stack};
use serde_json::{Value, json};
use twopc::access::{Caller, HIDDEN_REASON};
use twopc::coordinator::{caller_idempotent_id, idempotent_id, one_phase_id};
use twopc_client::{Client, Error, ErrorCode, Outcome, Push, RefusalCode, Subscription, Transaction, op, topic};
use twopc_tests::TestEnv;

const WAIT: Duration = Duration::from_secs(30);

fn lake_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("lake-access-{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]))
}

async fn stack(name: &str, max_connections: usize) -> Stack {
    let mut config = Config::isolated(dynamodb_local::shared().endpoint(), lake_dir(name));
    config.auth = Auth::Jwt;
    config.max_connections_per_principal = max_connections;
    Stack::start(config).await.expect("the stack starts with --auth jwt")
}

struct Users {
    alice: Client,
    bob: Client,
    admin: Client,
    tokens: [String; 3],
}

fn users(stack: &Stack) -> Users {
    let issuer = stack.issuer().expect("--auth jwt runs an issuer");
    let ttl = Duration::from_secs(600);
    let tokens = [issuer.token("alice", false, ttl), issuer.token("bob", false, ttl), issuer.token("root", true, ttl)];
    let client = |token: &str| Client::new(&stack.endpoints().api).expect("the API's URL").with_bearer(token);
    Users { alice: client(&tokens[0]), bob: client(&tokens[1]), admin: client(&tokens[2]), tokens }
}

/// The admin opens alice's and bob's accounts on both services.
async fn open_accounts(users: &Users) {
    let open = Transaction::new()
        .participant("service-a", [op::put("alice", json!({"balance": 100})), op::put("bob", json!({"balance": 70}))])
        .participant("service-b", [op::put("alice", json!({"balance": 0})), op::put("bob", json!({"balance": 0}))]);
    let opened = users.admin.submit(&open).await.expect("the admin may write anything");
    assert!(opened.is_committed(), "{opened:?}");
}

fn credit(service: &str, to: &str, amount: i64) -> Transaction {
    Transaction::new().participant(service, [op::add(to, "balance", amount)])
}

#[tokio::test]
async fn users_write_only_their_items_and_guard_nothing_they_cannot_read() {
    let stack = stack("writes", 10).await;
    let users = users(&stack);
    open_accounts(&users).await;

    // Her own debit (guarded) and a credit to bob: allowed.
    let pay = Transaction::new()
        .participant("service-a", [op::add("alice", "balance", -10).min(0)])
        .participant("service-b", [op::add("bob", "balance", 10)]);
    assert!(users.alice.submit(&pay).await.expect("allowed").is_committed());

    // Bob's items: no debit, no put, no guard (a guard is a read: its refusal would tell his balance).
    let debit = Transaction::new().participant("service-a", [op::add("bob", "balance", -5)]);
    let refused = users.alice.submit(&debit).await.expect_err("a debit of bob's account is refused");
    assert!(matches!(&refused, Error::Forbidden(e) if e.code == ErrorCode::Forbidden), "{refused:?}");
    let put = Transaction::new().participant("service-a", [op::put("bob", json!({"balance": 1_000_000}))]);
    assert!(matches!(users.alice.submit(&put).await, Err(Error::Forbidden(_))));
    for probe in [
        Transaction::new().participant("service-a", [op::add("bob", "balance", 0).max(50)]),
        Transaction::new().participant("service-a", [op::add("bob", "balance", 1).min(75)]),
        Transaction::new().participant("service-a", [op::check("bob").exists(true)]),
    ] {
        let refused = users.alice.submit(&probe).await.expect_err("a guard on bob's item is refused");
        assert!(matches!(&refused, Error::Invalid(e) if e.code == ErrorCode::GuardNotAllowed), "{refused:?}");
    }
    // Nothing of those was written: bob's balance is what the admin and alice's credit made it.
    let mine = Transaction::new().participant("service-a", [op::add("bob", "balance", 0).min(70).max(70)]);
    assert!(users.bob.submit(&mine).await.expect("bob may guard his own").is_committed());

    // The admin may do all of it.
    assert!(users.admin.submit(&debit).await.expect("the admin debits bob").is_committed());
    stack.stop().await;
}

#[tokio::test]
async fn refusals_tell_a_user_only_about_items_it_may_read() {
    let stack = stack("refusals", 10).await;
    let users = users(&stack);
    open_accounts(&users).await;

    // Her own overdraft: she may read her account, so she is told why, numbers included.
    let overdraft = Transaction::new().participant("service-a", [op::add("alice", "balance", -500).min(0)]);
    let Outcome::Aborted(own) = users.alice.submit(&overdraft).await.expect("answered") else {
        panic!("the overdraft is refused")
    };
    assert_eq!(own.participants[0].code, Some(RefusalCode::ConditionFailed));
    let reason = own.participants[0].reason.as_deref().unwrap_or_default();
    assert!(reason != HIDDEN_REASON && reason.chars().any(|c| c.is_ascii_digit()), "{own:?}");

    // Bob holds a transaction on his account: alice's credit meets his lock. She is told the code (the
    // item is busy), never the reason, which names bob's transaction.
    let held = Transaction::new().participant("service-a", [op::add("bob", "balance", -1).min(0)]).hold_ms(60_000);
    let held = users.bob.submit(&held).await.expect("bob holds");
    let held_id = held.transaction_id().to_owned();
    let Outcome::Aborted(busy) = users.alice.submit(&credit("service-a", "bob", 5)).await.expect("answered") else {
        panic!("the credit meets bob's lock")
    };
    assert_eq!(busy.participants[0].code, Some(RefusalCode::Conflict), "{busy:?}");
    assert_eq!(busy.participants[0].reason.as_deref(), Some(HIDDEN_REASON), "{busy:?}");
    let shown = serde_json::to_string(&busy.reason).unwrap();
    assert!(!shown.contains(&held_id), "{shown}");
    // The admin reads the whole answer.
    let Outcome::Aborted(whole) = users.admin.get(&busy.transaction_id).await.expect("the admin sees it") else {
        panic!("aborted")
    };
    assert_ne!(whole.participants[0].reason.as_deref(), Some(HIDDEN_REASON), "{whole:?}");

    // Bob's transaction: nobody else may see, commit or abort it (answered as unknown); bob and the admin may.
    assert!(matches!(users.alice.get(&held_id).await, Err(Error::NotFound(_))));
    assert!(matches!(users.alice.commit(&held_id).await, Err(Error::NotFound(_))));
    assert!(matches!(users.alice.abort(&held_id).await, Err(Error::NotFound(_))));
    assert!(users.admin.get(&held_id).await.is_ok());
    assert!(users.bob.commit(&held_id).await.expect("bob commits his own").is_committed());
    stack.stop().await;
}

/// Issue 42: a held credit to another's item would hold the owner's item (its debits refused CONFLICT)
/// for the whole hold, and its abort would cost nothing. Refused before anything is written, alone (a
/// request that would otherwise commit in one phase) or beside the caller's own debit, under a key too.
#[tokio::test]
async fn a_held_request_may_not_credit_an_item_its_caller_does_not_own() {
    let stack = stack("held-credits", 10).await;
    let users = users(&stack);
    open_accounts(&users).await;
    let is_held_credit = |refused: &Result<Outcome, Error>| matches!(refused, Err(Error::Forbidden(e)) if e.code == ErrorCode::HeldCreditNotAllowed);

    let pay = Transaction::new()
        .participant("service-a", [op::add("alice", "balance", -10).min(0)])
        .participant("service-b", [op::add("bob", "balance", 10)]);
    let held_pay = pay.clone().hold_ms(60_000);
    let refused = users.alice.submit(&held_pay).await;
    assert!(is_held_credit(&refused), "{refused:?}");
    let Err(Error::Forbidden(e)) = &refused else { unreachable!() };
    assert!(e.message.starts_with("participants[1].operations[0]: "), "{e:?}");
    // Alone, the credit would be one participant's (one phase without the hold): refused as well.
    let refused = users.alice.submit(&credit("service-b", "bob", 1).hold_ms(60_000)).await;
    assert!(is_held_credit(&refused), "{refused:?}");
    // Under a key: nothing recorded, so the key then runs the request without the hold.
    let refused = users.alice.submit_with_key(&held_pay, "held-1").await;
    assert!(is_held_credit(&refused), "{refused:?}");

    // Nothing was written or locked: bob debits his own account at once, and it is as it was.
    let bobs = Transaction::new().participant("service-b", [op::add("bob", "balance", -1).min(0)]);
    let Outcome::Aborted(untouched) = users.bob.submit(&bobs).await.expect("answered") else {
        panic!("bob's balance is 0: his guard refuses")
    };
    assert_eq!(untouched.participants[0].code, Some(RefusalCode::ConditionFailed), "not locked: {untouched:?}");
    assert!(users.alice.submit_with_key(&pay, "held-1").await.expect("the key is free").is_committed());
    let check = Transaction::new().participant("service-b", [op::add("bob", "balance", 0).min(10).max(10)]);
    assert!(users.bob.submit(&check).await.expect("bob reads his own").is_committed());

    // A held request on her own items, crediting her own account elsewhere: allowed.
    let own = Transaction::new()
        .participant("service-a", [op::add("alice", "balance", -5).min(0)])
        .participant("service-b", [op::add("alice", "balance", 5)])
        .hold_ms(60_000);
    let held = users.alice.submit(&own).await.expect("her own items");
    assert!(matches!(held, Outcome::Held(_)), "{held:?}");
    assert!(users.alice.commit(held.transaction_id()).await.expect("committed").is_committed());
    // An admin may hold a credit to anyone.
    let admins = users.admin.submit(&credit("service-b", "bob", 1).hold_ms(60_000)).await.expect("an admin's");
    assert!(matches!(admins, Outcome::Held(_)), "{admins:?}");
    users.admin.abort(admins.transaction_id()).await.expect("aborted");
    stack.stop().await;
}

/// Issue 42: credits are to the fields the policy names (the stack's default: the example wallets'
/// balances), checked before anything is written; no longer any numeric field of any service.
#[tokio::test]
async fn credits_are_only_to_the_fields_the_policy_names() {
    let stack = stack("named-credits", 10).await;
    let users = users(&stack);
    open_accounts(&users).await;
    let lamp = Transaction::new().participant("inventory", [op::put("lamp", json!({"stock": 5}))]);
    assert!(users.admin.submit(&lamp).await.expect("the admin stocks lamps").is_committed());

    assert!(users.alice.submit(&credit("service-a", "bob", 5)).await.expect("a wallet").is_committed());
    let stock = Transaction::new().participant("inventory", [op::add("lamp", "stock", 1_000_000)]);
    let refused = users.alice.submit(&stock).await;
    let Err(Error::Forbidden(e)) = &refused else { panic!("a credit to the lamps' stock: {refused:?}") };
    assert_eq!(e.code, ErrorCode::Forbidden);
    assert!(e.message.contains("service-a: balance; service-b: balance"), "{e:?}");
    let points = Transaction::new().participant("service-a", [op::add("bob", "points", 5)]);
    assert!(matches!(users.alice.submit(&points).await, Err(Error::Forbidden(_))), "a field not named");
    // Nothing written: still 5 lamps, and bob has no points.
    let still = Transaction::new().participant("inventory", [op::add("lamp", "stock", 0).min(5).max(5)]);
    assert!(users.admin.submit(&still).await.expect("answered").is_committed());
    let table = &stack.endpoints().tables.participants["service-a"];
    let bob = twopc_tests::dynamodb()
        .await
        .get_item()
        .table_name(table)
        .key("entityId", aws_sdk_dynamodb::types::AttributeValue::S("bob".to_owned()))
        .consistent_read(true)
        .send()
        .await
        .expect("read")
        .item
        .expect("bob's account");
    let data = bob["data"].as_m().expect("data");
    assert!(data.contains_key("balance") && !data.contains_key("points"), "{data:?}");
    stack.stop().await;
}

/// Issue 42: a deployed policy with the old boolean keeps working: `true` is any field of the services
/// in `writeServices` (no longer of every service), `false` none; and no credit inside a hold.
#[tokio::test]
async fn an_old_boolean_policy_credits_the_write_services_fields() {
    let env = TestEnv::new().await;
    env.put_data("service-a", "B", &json!({"balance": 10, "points": 0})).await;
    env.put_account("service-b", "B", "10").await;
    let alice = Caller::jwt("https://issuer.example", "A", false);
    let credit = |service: &str, field: &str, hold: bool| {
        let mut body = json!({"participants": [{"service": service, "operations": [
            {"op": "add", "key": {"entityId": "B"}, "field": field, "delta": 1}]}]});
        if hold {
            body["holdMs"] = json!(60_000);
        }
        serde_json::to_vec(&body).unwrap()
    };
    let narrowed = twopc::access::Policy::parse(Some(r#"{"allowCredits": true, "writeServices": ["service-a"]}"#));
    let coordinator = env.coordinator.clone().with_access(narrowed.expect("the old boolean parses"));
    let any_field = coordinator.submit_by(&credit("service-a", "points", false), None, &alice).await;
    assert_eq!(any_field.status, 200, "{}", any_field.body);
    let outside = coordinator.submit_by(&credit("service-b", "balance", false), None, &alice).await;
    assert_eq!((outside.status, &outside.body["error"]["code"]), (403, &json!("FORBIDDEN")), "{}", outside.body);
    let held = coordinator.submit_by(&credit("service-a", "balance", true), None, &alice).await;
    assert_eq!((held.status, &held.body["error"]["code"]), (403, &json!("HELD_CREDIT_NOT_ALLOWED")), "{}", held.body);

    let everywhere = twopc::access::Policy::parse(Some(r#"{"allowCredits": true}"#)).unwrap();
    let coordinator = env.coordinator.clone().with_access(everywhere);
    let answer = coordinator.submit_by(&credit("service-b", "balance", false), None, &alice).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let none = twopc::access::Policy::parse(Some(r#"{"allowCredits": false}"#)).unwrap();
    let answer =
        env.coordinator.clone().with_access(none).submit_by(&credit("service-a", "balance", false), None, &alice).await;
    assert_eq!(answer.status, 403, "{}", answer.body);
    assert_eq!(env.item("service-a", "B").await.unwrap()["data"]["points"], json!(1));
    assert_eq!(env.balance("service-a", "B").await, "10");
    assert_eq!(env.balance("service-b", "B").await, "11");
}

/// Issue 42: a refusal on one's own item names the transaction in the way only when it is the caller's
/// own; another caller's (here an admin's held one) is "another caller's transaction", in the answer and
/// in GET. The admin sees the ids.
#[tokio::test]
async fn refusals_name_only_the_callers_own_transactions() {
    let stack = stack("blockers", 10).await;
    let users = users(&stack);
    open_accounts(&users).await;

    let admins = Transaction::new().participant("service-a", [op::add("alice", "balance", -1).min(0)]).hold_ms(60_000);
    let admins = users.admin.submit(&admins).await.expect("the admin holds alice's account");
    let admins_id = admins.transaction_id().to_owned();
    let debit = Transaction::new().participant("service-a", [op::add("alice", "balance", -5).min(0)]);
    let Outcome::Aborted(refused) = users.alice.submit(&debit).await.expect("answered") else {
        panic!("her debit meets the admin's lock")
    };
    assert_eq!(refused.participants[0].code, Some(RefusalCode::Conflict), "{refused:?}");
    let reason = refused.participants[0].reason.clone().unwrap_or_default();
    assert!(reason.contains("another caller's transaction") && reason.contains("held"), "{reason}");
    let shown = format!("{refused:?}");
    assert!(!shown.contains(&admins_id), "{shown}");
    let Outcome::Aborted(got) = users.alice.get(&refused.transaction_id).await.expect("hers") else {
        panic!("aborted")
    };
    assert_eq!((&got.reason, &got.participants), (&refused.reason, &refused.participants));
    let Outcome::Aborted(whole) = users.admin.get(&refused.transaction_id).await.expect("the admin's view") else {
        panic!("aborted")
    };
    assert!(format!("{whole:?}").contains(&admins_id), "the admin sees the id: {whole:?}");
    users.admin.abort(&admins_id).await.expect("aborted");

    // Her own held transaction in her way: named, she may decide it.
    let own = Transaction::new().participant("service-b", [op::add("alice", "balance", 5)]).hold_ms(60_000);
    let own = users.alice.submit(&own).await.expect("her own hold");
    let again = Transaction::new().participant("service-b", [op::add("alice", "balance", 1)]);
    let Outcome::Aborted(refused) = users.alice.submit(&again).await.expect("answered") else {
        panic!("her own hold is in the way")
    };
    let reason = refused.participants[0].reason.clone().unwrap_or_default();
    assert!(reason.contains(own.transaction_id()), "{reason}");
    users.alice.abort(own.transaction_id()).await.expect("aborted");
    stack.stop().await;
}

#[tokio::test]
async fn idempotency_keys_are_each_callers_own() {
    let stack = stack("keys", 10).await;
    let users = users(&stack);
    open_accounts(&users).await;
    let alices = users.alice.submit_with_key(&credit("service-b", "bob", 1), "order-1").await.expect("answered");
    let bobs = users.bob.submit_with_key(&credit("service-b", "alice", 2), "order-1").await.expect("answered");
    assert!(alices.is_committed() && bobs.is_committed(), "{alices:?} {bobs:?}");
    assert_ne!(alices.transaction_id(), bobs.transaction_id());
    // Each key still names its caller's transaction: the same answer again, never a second run.
    let again = users.alice.submit_with_key(&credit("service-b", "bob", 1), "order-1").await.expect("answered");
    assert_eq!(again.transaction_id(), alices.transaction_id());
    let reused = users.alice.submit_with_key(&credit("service-b", "bob", 3), "order-1").await;
    assert!(matches!(reused, Err(Error::IdempotencyKeyReused(_))), "{reused:?}");
    stack.stop().await;
}

/// The next push matching `wanted`; panics after `WAIT`.
async fn next_matching(pushes: &mut Subscription, what: &str, wanted: impl Fn(&Push) -> bool) -> Push {
    twopc_tests::next_push(pushes, WAIT, what, wanted).await
}

#[tokio::test]
async fn users_follow_only_their_items_and_transactions() {
    let stack = stack("follow", 10).await;
    let e = stack.endpoints();
    let users = users(&stack);
    open_accounts(&users).await;
    let table = &e.tables.participants["service-a"];

    // Bob's next transaction, keyed: its id is known before it exists (as anyone who learnt it would).
    let issuer = &stack.endpoints().issuer.clone().expect("an issuer");
    let bob = twopc::access::jwt_principal(issuer, "bob");
    // (Each a credit at one service: one phase, so its id carries the service.)
    let bobs_future = one_phase_id("service-b", &caller_idempotent_id(Some(&bob), "bob-1"));
    let alice = twopc::access::jwt_principal(issuer, "alice");
    let alices_future = one_phase_id("service-a", &caller_idempotent_id(Some(&alice), "alice-1"));

    let mut pushes = Subscription::connect_with_token(&e.websocket, &users.tokens[0]).await.expect("alice connects");
    pushes
        .subscribe([
            topic::entity(table, "alice"),
            topic::entity(table, "bob"),
            topic::transaction(&bobs_future),
            topic::transaction(&alices_future),
        ])
        .await
        .expect("sent");
    let subscribed =
        next_matching(&mut pushes, "acknowledging the subscription", |p| matches!(p, Push::Subscribed(_))).await;
    let Push::Subscribed(topics) = subscribed else { unreachable!() };
    assert_eq!(topics.len(), 3, "{topics:?}");
    let refused = next_matching(&mut pushes, "refusing a topic", |p| matches!(p, Push::Refused(_))).await;
    let Push::Refused(refused) = refused else { unreachable!() };
    let refused: Vec<&str> = refused.iter().map(|r| r.topic.as_str()).collect();
    assert_eq!(refused, vec![topic::entity(table, "bob")], "only bob's item is refused at once");

    // Bob's keyed transaction, then alice's: hers reaches her, his never does (authorized when pushed).
    let bobs = users.bob.submit_with_key(&credit("service-b", "bob", 1), "bob-1").await.expect("answered");
    assert_eq!(bobs.transaction_id(), bobs_future);
    let alices = users.alice.submit_with_key(&credit("service-a", "alice", 1), "alice-1").await.expect("answered");
    assert_eq!(alices.transaction_id(), alices_future);
    let seen_bobs = std::cell::Cell::new(false);
    let mine = next_matching(&mut pushes, "of alice's transaction", |push| {
        seen_bobs.set(seen_bobs.get() || push.transaction_id() == Some(bobs_future.as_str()));
        matches!(push, Push::Transaction { transaction_id, .. } if *transaction_id == alices_future)
    })
    .await;
    assert!(!seen_bobs.get(), "bob's outcome reached alice: {mine:?}");

    // Now that it exists, bob's transaction is refused at subscribe too.
    pushes.subscribe([topic::transaction(bobs.transaction_id())]).await.expect("sent");
    next_matching(&mut pushes, "refusing bob's transaction", |push| {
        matches!(push, Push::Refused(refused) if refused.iter().any(|r| r.topic == topic::transaction(bobs.transaction_id())))
    })
    .await;
    pushes.close().await.ok();

    // The admin follows anything.
    let mut admin = Subscription::connect_with_token(&e.websocket, &users.tokens[2]).await.expect("admin connects");
    admin.subscribe([topic::entity(table, "bob")]).await.expect("sent");
    let ack = next_matching(&mut admin, "acknowledging", |p| matches!(p, Push::Subscribed(_))).await;
    assert_eq!(ack, Push::Subscribed(vec![topic::entity(table, "bob")]));
    stack.stop().await;
}

#[tokio::test]
async fn bad_tokens_are_refused_at_both_apis_and_connections_are_capped() {
    let stack = stack("tokens", 2).await;
    let e = stack.endpoints();
    let issuer = stack.issuer().expect("an issuer");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let claims = |changes: Value| {
        let mut claims = json!({"iss": issuer.issuer, "aud": issuer.audience, "sub": "alice", "exp": now + 600});
        claims.as_object_mut().unwrap().extend(changes.as_object().unwrap().clone());
        claims
    };
    let other = local_stack::issuer::DevIssuer::create(&lake_dir("other-issuer"), &issuer.issuer).unwrap();
    let bad = [
        ("expired", issuer.sign(&claims(json!({"exp": now - 120})))),
        ("wrong audience", issuer.sign(&claims(json!({"aud": "someone-else"})))),
        ("wrong issuer", issuer.sign(&claims(json!({"iss": "https://elsewhere.example"})))),
        ("badly signed", other.sign(&claims(json!({})))),
        // A sub the access log could not hold as JSON (the principal is written into it as it is).
        ("a quote in sub", issuer.sign(&claims(json!({"sub": "al\"ice"})))),
        ("a '#' in sub", issuer.sign(&claims(json!({"sub": "alice#2"})))),
        ("not a token", "abc.def.ghi".to_owned()),
    ];
    let http = twopc::https::client_builder().no_proxy().build().unwrap();
    for (what, token) in &bad {
        let answer =
            http.get(format!("{}/transactions/tx-1", e.api)).bearer_auth(token).send().await.expect("the API answers");
        assert_eq!(answer.status().as_u16(), 401, "{what}");
        let refused = Subscription::connect_with_token(&e.websocket, token).await.err();
        assert!(matches!(refused, Some(Error::WebSocket(_))), "{what}: connected");
    }
    // No token at all: the same.
    let answer = http.get(format!("{}/transactions/tx-1", e.api)).send().await.expect("the API answers");
    assert_eq!(answer.status().as_u16(), 401);
    assert!(Subscription::connect(&e.websocket).await.is_err());

    // A good token in the query, as a browser sends it; at most two connections per principal.
    let token = issuer.token("alice", false, Duration::from_secs(600));
    let url = format!("{}/?token={token}", e.websocket);
    let first = Subscription::connect(&url).await.expect("one");
    let _second = Subscription::connect_with_token(&e.websocket, &token).await.expect("two");
    let third = Subscription::connect(&url).await.err();
    assert!(matches!(third, Some(Error::WebSocket(_))), "a third connection is refused");
    let bob = issuer.token("bob", false, Duration::from_secs(600));
    let _bobs = Subscription::connect_with_token(&e.websocket, &bob).await.expect("another principal has room");
    // Admins (by default every IAM caller: a fleet may share a role) are not capped.
    let root = issuer.token("root", true, Duration::from_secs(600));
    let mut admins = Vec::new();
    for _ in 0..3 {
        admins.push(Subscription::connect_with_token(&e.websocket, &root).await.expect("an admin connects"));
    }
    // One closed, its place is free again (once its $disconnect has run).
    first.close().await.ok();
    let started = Instant::now();
    loop {
        match Subscription::connect(&url).await {
            Ok(_) => break,
            Err(_) if started.elapsed() < WAIT => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("no place after a close: {e}"),
        }
    }
    stack.stop().await;
}

/// Keys used before they were scoped per caller: the first execution is found by its own caller (its
/// recorded principal, or any IAM caller for a record without one), and by nobody else.
#[tokio::test]
async fn a_key_from_before_scoping_finds_its_first_execution_for_its_own_caller_only() {
    let env = TestEnv::new().await;
    env.put_account("service-a", "A", "100").await;
    env.put_account("service-b", "A", "0").await;
    // Two participants: a one-phase request's id carries its service (issue 42), a record from before
    // scoping does not.
    let body = json!({"participants": [{"service": "service-a", "operations": [
        {"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": 1}]},
        {"service": "service-b", "operations": [{"op": "check", "key": {"entityId": "A"}, "exists": true}]}]});
    let bytes = serde_json::to_vec(&body).unwrap();
    let access = env.coordinator.access().clone();
    // Before the upgrade: recorded under the key's own id.
    let first = env.coordinator.submit_by(&bytes, Some("k-old"), &access.iam(None)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let legacy = idempotent_id("k-old");
    assert_eq!(first.body["transactionId"], legacy.as_str());

    // An IAM caller finds it (a record without a principal was an IAM caller's): no second run.
    let role = "arn:aws:sts::123456789012:assumed-role/Orders";
    let again = env.coordinator.submit_as(&bytes, Some("k-old"), Some(role)).await;
    assert_eq!((again.status, &again.body["transactionId"]), (200, &json!(legacy)), "{}", again.body);
    assert_eq!(env.balance("service-a", "A").await, "101");

    // A JWT user does not: its key is its own, a transaction of its own.
    let alice = Caller::jwt("https://issuer.example", "A", false);
    let hers = env.coordinator.submit_by(&bytes, Some("k-old"), &alice).await;
    assert_eq!(hers.status, 200, "{}", hers.body);
    assert_eq!(hers.body["transactionId"], caller_idempotent_id(alice.principal.as_deref(), "k-old").as_str());
    assert_eq!(env.balance("service-a", "A").await, "102");

    // A record with a principal: found by that principal only.
    let first = env.coordinator.submit_by(&bytes, Some("k-mine"), &access.iam(None)).await;
    let id = first.body["transactionId"].as_str().unwrap().to_owned();
    env.client
        .update_item()
        .table_name(env.transactions.table())
        .key("transactionId", aws_sdk_dynamodb::types::AttributeValue::S(id.clone()))
        .update_expression("SET principal = :p")
        .expression_attribute_values(":p", aws_sdk_dynamodb::types::AttributeValue::S(role.to_owned()))
        .send()
        .await
        .unwrap();
    let same = env.coordinator.submit_as(&bytes, Some("k-mine"), Some(role)).await;
    assert_eq!(same.body["transactionId"], id.as_str(), "{}", same.body);
    let other = env.coordinator.submit_as(&bytes, Some("k-mine"), Some("arn:aws:iam::123456789012:user/ops")).await;
    assert_ne!(other.body["transactionId"], id.as_str(), "{}", other.body);
    assert_eq!(env.balance("service-a", "A").await, "104");
}

/// What the live page does with `--auth jwt`: it learns that the stack authorizes, takes a token for
/// the user chosen (`POST /local/token`) and calls the API with it.
#[tokio::test]
async fn the_live_page_signs_in_as_a_chosen_local_user() {
    let stack = stack("page", 10).await;
    let api = &stack.endpoints().api;
    let http = twopc::https::client_builder().no_proxy().build().unwrap();
    let described: Value = http.get(format!("{api}/local/stack.json")).send().await.unwrap().json().await.unwrap();
    assert_eq!(described["auth"], "jwt");
    let signed_in: Value = http
        .post(format!("{api}/local/token"))
        .json(&json!({"sub": "carol"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = signed_in["token"].as_str().expect("a token");
    let carol = Client::new(api).unwrap().with_bearer(token);
    let own = Transaction::new().participant("service-a", [op::put("carol", json!({"balance": 5}))]);
    assert!(carol.submit(&own).await.expect("carol writes her own item").is_committed());
    for sub in ["a#b", "a\"b", ""] {
        let bad = http.post(format!("{api}/local/token")).json(&json!({"sub": sub})).send().await.unwrap();
        assert_eq!(bad.status().as_u16(), 400, "{sub:?}");
    }
    stack.stop().await;
}

/// Issue 47: the live page's "operator" sign-in and `twopc-local token --operator`: a token with the
/// `operators` group, which the stack's policy names under `--auth jwt`, may use the operators' API; a
/// user's and an admin's may not (403 FORBIDDEN), and an operator is not an admin.
#[tokio::test]
async fn an_operators_token_of_the_local_issuer_opens_the_operators_api_and_an_admins_does_not() {
    let stack = stack("operator", 10).await;
    let api = &stack.endpoints().api;
    let http = twopc::https::client_builder().no_proxy().build().unwrap();
    let mut tokens = BTreeMap::new();
    for (who, asked) in [
        ("user", json!({"sub": "ursula"})),
        ("admin", json!({"sub": "root", "admin": true})),
        ("operator", json!({"sub": "olga", "operator": true})),
    ] {
        let answer: Value =
            http.post(format!("{api}/local/token")).json(&asked).send().await.unwrap().json().await.unwrap();
        assert_eq!(answer["operator"], who == "operator", "{answer}");
        tokens.insert(who, answer["token"].as_str().expect("a token").to_owned());
    }
    let client = |who: &str| Client::new(api).unwrap().with_bearer(&tokens[who]);
    for who in ["user", "admin"] {
        let refused = client(who).admin_list(&Default::default()).await.expect_err("not an operator");
        assert!(matches!(&refused, Error::Forbidden(e) if e.code == ErrorCode::Forbidden), "{who}: {refused:?}");
    }
    let listed = client("operator").admin_list(&Default::default()).await.expect("an operator lists");
    assert!(listed["transactions"].is_array(), "{listed}");
    // An operator is not an admin: it writes only its own items.
    let bobs = Transaction::new().participant("service-a", [op::put("bob", json!({"balance": 5}))]);
    let refused = client("operator").submit(&bobs).await.expect_err("not bob's");
    assert!(matches!(&refused, Error::Forbidden(_)), "{refused:?}");
    stack.stop().await;
}

/// Issue 42, item 6: `/local/token` signs anyone in as anyone, admin included, so it answers the stack's
/// own page only: a page of another site (its `Origin`, or a browser's `Sec-Fetch-Site: cross-site`) gets
/// no token even with a JSON body and the stack's own `Host`.
#[tokio::test]
async fn the_local_issuer_answers_only_the_stacks_own_page() {
    let stack = stack("own-page", 10).await;
    let api = &stack.endpoints().api;
    let http = twopc::https::client_builder().no_proxy().build().unwrap();
    let ask = |headers: &[(&'static str, &str)]| {
        let mut request = http.post(format!("{api}/local/token")).json(&json!({"sub": "mallory", "admin": true}));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send()
    };
    for refused in [
        vec![("origin", "https://evil.example")],
        vec![("origin", "null")],
        vec![("origin", "https://evil.example"), ("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "cors")],
        vec![("sec-fetch-site", "cross-site")],
    ] {
        let answer = ask(&refused).await.unwrap();
        let status = answer.status().as_u16();
        let body = answer.text().await.unwrap();
        assert_eq!(status, 403, "{refused:?}: {body}");
        assert!(!body.contains("token\""), "no token for {refused:?}: {body}");
        assert!(body.contains("own page"), "the refusal says why: {body}");
    }
    // The stack's own page (its origin, same-origin fetch metadata), and a client that is no browser.
    let own = api.clone();
    for allowed in [vec![("origin", own.as_str()), ("sec-fetch-site", "same-origin")], vec![]] {
        let answer: Value = ask(&allowed).await.unwrap().json().await.unwrap();
        assert!(answer["token"].is_string(), "{allowed:?}: {answer}");
    }
    stack.stop().await;
}

/// The per-principal cap through DynamoDB faults: a place whose write took effect but whose reply was
/// lost (the SDK's retry then fails the version condition), a `$connect` delivered twice, and a release
/// whose reply was lost are each counted once.
#[tokio::test]
async fn a_place_under_the_cap_is_counted_once_whatever_reply_is_lost() {
    use twopc_fanout::connections::{Connected, ConnectionStore};
    use twopc_tests::{DynamoFault, Rule};
    let env = TestEnv::new().await;
    let table = format!("c{}-connections", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    twopc::tables::connections_table(&table).create_if_missing(&env.client).await.expect("the table");
    let store = ConnectionStore::new(env.store_client.clone(), &table).with_max_connections_per_principal(2);
    let alice = Caller::jwt("https://issuer.example", "alice", false);
    let now = std::time::SystemTime::now();
    let faults = &env.dynamo_faults;
    for (fault, id) in [(DynamoFault::LoseReply, "c1"), (DynamoFault::DropConnection, "c2")] {
        faults.forget();
        faults.add(Rule::new(fault).operation("PutItem").table(&table).nth(1));
        assert_eq!(store.connect_as(id, now, &alice).await.expect("connects"), Connected::Open, "{fault:?}");
        assert_eq!(faults.fired(), 1, "{fault:?}");
    }
    faults.clear();
    assert_eq!(store.connect_as("c1", now, &alice).await.unwrap(), Connected::Open, "a duplicate takes no place");
    assert_eq!(store.connect_as("c3", now, &alice).await.unwrap(), Connected::OverCap(2));
    faults.forget();
    faults.add(Rule::new(DynamoFault::LoseReply).operation("UpdateItem").table(&table).body_contains("REMOVE").nth(1));
    store.disconnect("c1").await.expect("disconnects through a lost reply");
    assert_eq!(faults.fired(), 1);
    faults.clear();
    assert_eq!(store.connect_as("c3", now, &alice).await.unwrap(), Connected::Open, "c1's place is free");
    assert_eq!(store.connect_as("c4", now, &alice).await.unwrap(), Connected::OverCap(2));
    // An admin takes no place.
    let root = Caller::jwt("https://issuer.example", "root", true);
    for id in ["r1", "r2", "r3"] {
        assert_eq!(store.connect_as(id, now, &root).await.unwrap(), Connected::Open);
    }
}
