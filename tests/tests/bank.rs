//! The bank test: concurrent random transfers among 10 accounts on two services, with faults drawn at
//! random under one seed, a sweeper running alongside, then faults stop, late copies land, sweeps run
//! until quiet, and every invariant is checked against the records.
//!
//! Faults drawn:
//! - at the coordinator: a crash at every step;
//! - at the participant edge: lost replies, failures, duplicate deliveries, late answers, and late
//!   COPIES of any message (prepare, commit, abort, one-phase commit), delivered from before the
//!   transaction's deadline to well after it ended, when other transfers have touched the same items;
//! - at the DynamoDB client (the SDK as deployed, standard retries): replies lost after the write took
//!   effect, dropped connections, throttling, late answers, on any table and operation, some of them on
//!   every retry of the request they struck.
//!
//! One transfer in four is keyed, and most keyed ones are REPLAYED with the same key and body: at once,
//! later, or concurrently with the first execution, each replay under faults of its own. Among the
//! transfers are writes that approach DynamoDB's limits on an account's other fields, next to its
//! balance: a `set` of up to 400 fields, strings of up to 190 KB, nested lists that make the
//! transaction record near its bound (either side of it), values nested at the limit or one level over.
//! Among them too are orders: the example inventory (a participant of its own) reserves or releases
//! units of a SKU with its own operations, and the buyer pays with a transfer, in one transaction; half
//! of them also charge a card at the payments service (a resource participant: authorize, capture, void
//! at the stand-in payment API, which fails, answers late and receives requests late, at random).
//! Some transfers and orders are HELD (`holdMs`, 1 to 3 s, so that many expire during the run): once the
//! POST answers (202 PREPARED with `holdUntil`, or only an id, or a refusal), a task of the client's
//! approves (`POST /transactions/{id}/commit`), rejects (`/abort`), approves twice, approves and rejects
//! at once, or does nothing; now, later within the hold, or after `holdUntil` (where a commit aborts
//! it, or finds it expired). Their hold messages and decisions meet the same faults as every call
//! (crashes in the decision's second phase, lost, failed, duplicated and late messages, DynamoDB faults),
//! and the sweeper aborts the expired ones alongside, as prepares meeting their locks do. Some held ones
//! (keyed, so that the client knows the id its key gives: the request's first attempt) are ABORTED WHILE
//! THEIR POST IS IN FLIGHT: `/abort` is sent to that id as soon as its record exists, once the coordinator
//! retried that attempt for contention (the abort then goes to an earlier attempt and follows `retriedAs`),
//! or a drawn while later; once the POST answered naming a later attempt, it aborts that one too (which
//! answers 200 ABORTED whoever aborted it); the client never commits them, nor replays their key at once.
//! A final 409 refused for contention carries an `ageToken`: some clients RETRY WITH THE TOKEN at once (a
//! request of its own, under a fresh `Idempotency-Key` or none; its answer may carry a token again), some
//! send that retry twice, and some replay the refused request's own key after it.
//!
//! Checked once everything ended: every record terminal and no lock left; balances, versions and
//! `lastTx` are exactly what the committed records make (each applied once, nothing of an aborted
//! transaction), and so is every other field; the total is conserved; each SKU's stock and reserved
//! units are what its committed orders computed, never below zero, their sum conserved; at the payment
//! API nothing is held, each committed charge is captured once for its amount and nothing else is; every answer agrees with its final
//! record as the call itself saw it (a crash before the decision ends aborted, one after it ends as the
//! record said right after the crash); a 409 says ABORTED; a 5xx quotes no table, DynamoDB operation
//! or DynamoDB error; a key is prepared by one execution at most, and its replays name one request; a
//! key's first final answer (200 COMMITTED or 409 ABORTED) is its answer for ever: every final answer of
//! a call sent after it says the same status and names the same attempt (a token retry's key, or its
//! token without a key, alike). Age links agree: a token retry's record names the attempt whose age it
//! claimed (`ageOf`), which names it back (`ageClaimedBy`) and was its coordinator's own refusal for
//! contention, not retried.
//! A held transaction's decisions agree with its record as well (a commit's 200 or 202 COMMITTING:
//! committed; its 409: the decided body, ABORTED; an abort's 200: aborted; its 409: committed); it ends
//! committed only if a commit was sent by its `holdUntil` (by the clock every coordinator here shares),
//! and aborted for the expiry, or for its client's reject (sent to any attempt of its request) if it sent
//! one; one aborted while its POST was in flight ends with no attempt committed; recovery runs past the
//! last `holdUntil`, so none is left PREPARED.
//!
//! `BANK_SEED` replays a run's draws (the interleaving, and so which request a DynamoDB fault strikes,
//! varies); `BANK_TRANSFERS`, `BANK_CLIENTS` size it; `BANK_SOAK_SECS` turns it into a soak that keeps
//! transferring for that long; `BANK_FAULT_PERCENT` is the chance of a coordinator or edge fault per
//! call, `BANK_DYNAMO_PERMILLE` the chance of each DynamoDB fault kind per request, `BANK_LIMIT_PERCENT`
//! the share of writes near DynamoDB's limits, `BANK_ORDER_PERCENT` the share of orders, `BANK_PAYMENT_PERMILLE` the chance of each payment API fault, `BANK_LATE_PERCENT` the chance that a call also has a late
//! copy of one of its messages, `BANK_HOLD_PERCENT` the share of transfers and orders that are held,
//! `BANK_ABORT_IN_FLIGHT_PERCENT` the share of held ones aborted while their POST is in flight,
//! `BANK_TOKEN_RETRY_PERCENT` the chance that a client retries with an answer's `ageToken`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bigdecimal::BigDecimal;
use serde_json::{Value, json};
use twopc::clock::CLOCK_MARGIN_MS;
use twopc::faults::{CoordinatorCrash, Faults};
use twopc::model::Action;
use twopc_client::{Transaction, op};
use twopc_tests::dynamo_faults::{INJECTED_INTERNAL_MESSAGE, INJECTED_RESET_MESSAGE, INJECTED_THROTTLING_MESSAGE};
use twopc_tests::{DynamoFault, DynamoFaults, EdgeFault, FaultyInvoker, Rule, TestEnv, call_coordinator, rest_event};

/// SplitMix64: a seeded generator, so a printed seed replays the same draws.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    Crash(CoordinatorCrash),
    Edge(EdgeFault, Action),
}

impl Fault {
    fn kind(&self) -> String {
        match self {
            Fault::None => "none".into(),
            Fault::Crash(c) => format!("crash:{c:?}").replace("(", "").replace(")", ""),
            Fault::Edge(EdgeFault::DelayReply(_), a) => format!("late-reply:{}", a.as_str()),
            Fault::Edge(EdgeFault::LateCopy(_), a) => format!("late-copy:{}", a.as_str()),
            Fault::Edge(EdgeFault::LateDelivery(_), a) => format!("late-delivery:{}", a.as_str()),
            Fault::Edge(e, a) => format!("{}:{}", format!("{e:?}").to_lowercase(), a.as_str()),
        }
    }

    /// A crash before the decision is written: the transaction can only end aborted (or, without a
    /// key, with no record at all: presumed abort).
    fn crashes_before_decision(&self) -> Option<bool> {
        match self {
            Fault::Crash(CoordinatorCrash::AfterCreate | CoordinatorCrash::AfterPrepares(_)) => Some(true),
            Fault::Crash(_) => Some(false),
            _ => None,
        }
    }
}

fn draw_fault(rng: &mut Rng, rate_percent: u64, timeout: Duration, held: bool) -> Fault {
    if rng.below(100) >= rate_percent {
        return Fault::None;
    }
    let crashes = [
        CoordinatorCrash::AfterCreate,
        CoordinatorCrash::AfterPrepares(1),
        CoordinatorCrash::AfterPrepares(2),
        CoordinatorCrash::AfterDecision,
        CoordinatorCrash::AfterCommits(1),
        CoordinatorCrash::BeforeTerminal,
        // Met only by a request refused for contention and retried: stopped once the refused attempt's
        // abort names the next one (whose record the same write creates), before beginning it.
        CoordinatorCrash::AfterClaim,
    ];
    // A held transaction's hold messages (the locks' new expiry) meet the same faults as the others.
    let actions: &[Action] = match held {
        true => &[Action::Prepare, Action::Commit, Action::Abort, Action::Hold],
        false => &[Action::Prepare, Action::Commit, Action::Abort],
    };
    let action = |rng: &mut Rng| actions[rng.below(actions.len() as u64) as usize];
    match rng.below(6) {
        0 | 1 => Fault::Crash(crashes[rng.below(crashes.len() as u64) as usize]),
        2 => {
            let edges = [EdgeFault::LoseReply, EdgeFault::Duplicate, EdgeFault::Fail];
            let edge = edges[rng.below(3) as usize];
            Fault::Edge(edge, action(rng))
        }
        3 if rng.below(2) == 0 => {
            Fault::Edge(EdgeFault::DelayReply(timeout + Duration::from_millis(300)), Action::Prepare)
        }
        // Issue 48: a prepare held back by the network, its answer never seen: its lock may land after the
        // abort's releases (out of the locks index for a recorded attempt; the sweeper releases it again).
        3 => {
            let delay = rng.between(10, timeout.as_millis() as u64);
            Fault::Edge(EdgeFault::LateDelivery(Duration::from_millis(delay)), Action::Prepare)
        }
        _ => {
            let action = action(rng);
            Fault::Edge(late_copy(rng, timeout), action)
        }
    }
}

/// The fault of a held transaction's decision (`POST /transactions/{id}/commit` or `/abort`): a crash
/// in its second phase (the only crash points it passes), or a lost, failed, duplicated or late copy of
/// its commit or abort messages.
fn draw_decision_fault(rng: &mut Rng, rate_percent: u64, timeout: Duration) -> Fault {
    if rng.below(100) >= rate_percent {
        return Fault::None;
    }
    let crashes =
        [CoordinatorCrash::AfterCommits(1), CoordinatorCrash::AfterCommits(2), CoordinatorCrash::BeforeTerminal];
    let action = [Action::Commit, Action::Abort][rng.below(2) as usize];
    match rng.below(4) {
        0 => Fault::Crash(crashes[rng.below(crashes.len() as u64) as usize]),
        1 | 2 => {
            let edges = [EdgeFault::LoseReply, EdgeFault::Duplicate, EdgeFault::Fail];
            Fault::Edge(edges[rng.below(3) as usize], action)
        }
        _ => Fault::Edge(late_copy(rng, timeout), action),
    }
}

/// A late copy of a message: most land before the deadline (a prepare's copy can then still lock),
/// the others up to long after the transaction ended.
fn late_copy(rng: &mut Rng, timeout: Duration) -> EdgeFault {
    let timeout_ms = timeout.as_millis() as u64;
    let delay = if rng.below(10) < 6 { rng.between(10, timeout_ms) } else { rng.between(timeout_ms, 3 * timeout_ms) };
    EdgeFault::LateCopy(Duration::from_millis(delay))
}

/// Besides its fault, a call may have a late copy of one of its messages (a prepare half the time):
/// (service index, action, copy).
fn draw_late(
    rng: &mut Rng,
    late_percent: u64,
    timeout: Duration,
    actions: &[Action],
) -> Option<(u64, Action, EdgeFault)> {
    if rng.below(100) >= late_percent {
        return None;
    }
    Some((rng.below(2), actions[rng.below(actions.len() as u64) as usize], late_copy(rng, timeout)))
}

/// The messages a call's late copy may be of: a POST's (a held one's hold messages too), a decision's.
const LATE_POST: &[Action] = &[Action::Prepare, Action::Prepare, Action::Commit, Action::Abort];
const LATE_HELD_POST: &[Action] = &[Action::Prepare, Action::Prepare, Action::Commit, Action::Abort, Action::Hold];
const LATE_DECISION: &[Action] = &[Action::Commit, Action::Abort];

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

const ACCOUNTS: [(&str, &str); 10] = [
    ("service-a", "a0"),
    ("service-a", "a1"),
    ("service-a", "a2"),
    ("service-a", "a3"),
    ("service-a", "a4"),
    ("service-b", "b0"),
    ("service-b", "b1"),
    ("service-b", "b2"),
    ("service-b", "b3"),
    ("service-b", "b4"),
];
const OPENING_BALANCE: u64 = 100;
/// The example inventory's SKUs, each with this stock and none reserved: orders reserve and release
/// them with the inventory's own operations.
const SKUS: [&str; 3] = ["sku0", "sku1", "sku2"];
const OPENING_STOCK: u64 = 40;
/// The transfers' `timeoutMs`, drawn evenly.
const TIMEOUTS: [Duration; 4] = [
    Duration::from_millis(800),
    Duration::from_millis(800),
    Duration::from_millis(1_500),
    Duration::from_millis(3_000),
];

fn transfer_body(from: (&str, &str), to: (&str, &str), amount: u64, timeout_ms: u64) -> Value {
    let debit = op::add(from.1, "balance", -(amount as i64)).min(0);
    let credit = op::add(to.1, "balance", amount);
    let transfer = if from.0 == to.0 {
        Transaction::new().participant(from.0, [debit, credit])
    } else {
        Transaction::new().participant(from.0, [debit]).participant(to.0, [credit])
    };
    transfer.timeout_ms(timeout_ms).to_json()
}

/// An order: the inventory reserves (or, one time in four, releases) units of a SKU with its own
/// operation, and the buyer pays for them with a transfer (a debit with `min: 0`, a credit), all in one
/// transaction. The inventory refuses a reserve beyond the stock and a release beyond what is reserved.
fn order_body(rng: &mut Rng, timeout_ms: u64, reference: &str) -> (Value, Vec<String>) {
    let from = ACCOUNTS[rng.below(10) as usize];
    let mut to = ACCOUNTS[rng.below(10) as usize];
    while to == from {
        to = ACCOUNTS[rng.below(10) as usize];
    }
    let sku = SKUS[rng.below(SKUS.len() as u64) as usize];
    let quantity = 1 + rng.below(6);
    let stock =
        if rng.below(4) == 0 { op::inventory::release(sku, quantity) } else { op::inventory::reserve(sku, quantity) };
    let mut body = transfer_body(from, to, quantity * 5, timeout_ms);
    let operation = serde_json::to_value(twopc_client::Operation::from(stock)).unwrap();
    body["participants"]
        .as_array_mut()
        .unwrap()
        .push(json!({"service": op::inventory::SERVICE, "operations": [operation]}));
    let mut services = vec![from.0.to_owned(), to.0.to_owned(), op::inventory::SERVICE.to_owned()];
    // Half the orders are paid by card as well (one in ten declined): the payments resource.
    if rng.below(2) == 0 {
        let card = if rng.below(10) == 0 { local_services::payments::DECLINED_CARD } else { "4242424242424242" };
        let charge = payments::charge(reference, card, 100 + rng.below(5_000));
        body["participants"]
            .as_array_mut()
            .unwrap()
            .push(json!({"service": payments::SERVICE, "operations": [charge]}));
        services.push(payments::SERVICE.to_owned());
    }
    services.dedup();
    (body, services)
}

/// Transient faults at the payment API, each at `per_mille` per call of every endpoint: a 500 before or
/// after the effect, an answer later than the client waits, a request late in the network.
fn payment_faults(api: &local_services::payments::PaymentApi, per_mille: u64, seed: u64) {
    use local_services::payments::{Endpoint, PaymentFault};
    for endpoint in [Endpoint::Authorize, Endpoint::Capture, Endpoint::Void] {
        for (i, fault) in [
            PaymentFault::Fail,
            PaymentFault::FailAfter,
            PaymentFault::SlowReply(payments::REQUEST_TIMEOUT + Duration::from_millis(300)),
            PaymentFault::Late(Duration::from_millis(1_200)),
        ]
        .into_iter()
        .enumerate()
        {
            api.inject_random(endpoint, fault, per_mille / (1 + i as u64 / 2), seed ^ (i as u64 + 1));
        }
    }
}

/// Which of DynamoDB's limits a near-limit `set` approaches.
#[derive(Clone, Copy)]
enum Near {
    /// Hundreds of fields: the commit's expression nears, and may pass, 4 KB.
    Fields,
    /// A string of up to 190 KB: three such notes on one item near, and may pass, 400 KB.
    String,
    /// Nested lists that DynamoDB counts at almost twice their JSON: the transaction record nears, and
    /// may pass, its bound (`MAX_RECORD_BYTES`).
    Record,
    /// A value nested as deep as the record stores (26 levels under a field), or one level more.
    Nesting,
}

/// A `set` near one of DynamoDB's limits, on an account's other fields (never its balance).
fn near_limit_set(rng: &mut Rng, account: &str, near: Near) -> op::Set {
    let field = format!("note{}", rng.below(3));
    match near {
        Near::Fields => {
            let fields = rng.between(40, 400);
            let base = rng.below(1000);
            (0..fields).fold(op::set(account), |set, i| set.field(format!("f{i}"), base + i))
        }
        Near::String => {
            let size = rng.between(40_000, 190_000) as usize;
            let letter = (b'a' + rng.below(26) as u8) as char;
            let mut note = format!("{letter}{}", rng.next());
            note.extend(std::iter::repeat_n(letter, size - note.len()));
            op::set(account).field(field, note)
        }
        Near::Record => {
            // 20 lists deep: 80 bytes of record each (1 for the element, 3 + 1 per level), 41 of JSON.
            let element = (0..19).fold(json!([]), |inner, _| json!([inner]));
            let target = twopc::record::MAX_RECORD_BYTES as u64 + rng.between(0, 6_000) - 3_000;
            op::set(account).field(field, Value::Array(vec![element; (target / 80) as usize]))
        }
        Near::Nesting => {
            let levels = rng.between(25, 28);
            op::set(account).field(field, (0..levels).fold(json!(rng.below(100)), |inner, _| json!({"d": inner})))
        }
    }
}

/// One or two `set`s near DynamoDB's limits: on one service (one phase) or two (two phases), at most
/// one large value per request (the API takes 256 KiB).
fn near_limit_body(rng: &mut Rng, timeout_ms: u64) -> Value {
    let a = ACCOUNTS[rng.below(5) as usize];
    let b = ACCOUNTS[5 + rng.below(5) as usize];
    let large = [Near::String, Near::Record, Near::Nesting][rng.below(3) as usize];
    let request = if rng.below(2) == 0 {
        let (service, account) = if rng.below(2) == 0 { a } else { b };
        let near = if rng.below(2) == 0 { Near::Fields } else { large };
        Transaction::new().participant(service, [near_limit_set(rng, account, near)])
    } else {
        let (first, second) = if rng.below(2) == 0 { (large, Near::Fields) } else { (Near::Fields, large) };
        let first = near_limit_set(rng, a.1, first);
        let second = near_limit_set(rng, b.1, second);
        Transaction::new().participant(a.0, [first]).participant(b.0, [second])
    };
    request.timeout_ms(timeout_ms).to_json()
}

/// The DynamoDB faults of a run: every kind, on any table and operation, each at `per_mille` per request;
/// some strike every retry of the request they hit (a refusal or an unknown outcome reaches the protocol).
fn dynamo_rules(faults: &DynamoFaults, per_mille: u64, timeout: Duration) {
    let half = per_mille.div_ceil(2);
    for rule in [
        Rule::new(DynamoFault::LoseReply).per_mille(per_mille),
        Rule::new(DynamoFault::DropConnection).per_mille(per_mille),
        Rule::new(DynamoFault::Throttle).per_mille(per_mille),
        Rule::new(DynamoFault::Late(Duration::from_millis(150))).per_mille(per_mille),
        Rule::new(DynamoFault::Late(timeout + Duration::from_millis(400))).per_mille(half),
        Rule::new(DynamoFault::Throttle).per_mille(half).sticky(),
        Rule::new(DynamoFault::LoseReply).per_mille(half).sticky(),
    ] {
        faults.add(rule);
    }
}

/// One transfer as the client sends it (every call of a keyed one sends the same).
#[derive(Debug, Clone)]
struct Transfer {
    index: usize,
    body: String,
    key: Option<String>,
    services: Vec<String>,
    near_limit: bool,
    timeout: Duration,
    /// A held transfer's `holdMs`.
    hold_ms: Option<u64>,
    /// A retry with the age token of an earlier answer (`Age-Token`): a request of its own.
    age_token: Option<AgeToken>,
}

/// An age token as its client keeps it: the refused attempt it was issued for, and what it says.
#[derive(Debug, Clone)]
struct AgeToken {
    token: String,
    /// The refused attempt (its answer's `transactionId`): the retry's record names it `ageOf`.
    refused: String,
    /// The token is refused after this (and the coordinators' clock margin).
    expires_at: u64,
    /// The id the retry takes without a key: `<first id>-r<attempt>`.
    unkeyed_id: String,
}

impl AgeToken {
    /// The token of a final 409 refused for contention, read as its client may (the payload is hex JSON).
    fn of(outcome: &Outcome) -> Option<AgeToken> {
        let token = outcome.answer["ageToken"].as_str().filter(|_| outcome.route == Route::Post)?;
        let payload = hex::decode(token.split('.').next()?).ok()?;
        let age: Value = serde_json::from_slice(&payload).ok()?;
        Some(AgeToken {
            token: token.to_owned(),
            refused: outcome.answer["transactionId"].as_str().unwrap_or_default().to_owned(),
            expires_at: age["expiresAt"].as_u64()?,
            unkeyed_id: format!("{}-r{}", age["firstTransactionId"].as_str()?, age["attempt"].as_u64()?),
        })
    }

    /// The id the retry takes: its key's, or without a key the token's.
    fn retry_id(&self, key: Option<&str>) -> String {
        key.map_or_else(|| self.unkeyed_id.clone(), twopc::coordinator::idempotent_id)
    }
}

/// A token's retry is sent only this long before it expires at the latest (the coordinator checks it
/// first thing, within the clock margin past its expiry).
const TOKEN_SLACK_MS: u64 = 100;

/// The faults of one call: a crash or an edge fault, and maybe a late copy of one of its messages.
#[derive(Debug, Clone)]
struct Plan {
    fault: Fault,
    edge_service: String,
    late: Option<(String, Action, EdgeFault)>,
}

impl Plan {
    fn draw(rng: &mut Rng, transfer: &Transfer, fault_rate: u64, late_percent: u64) -> Plan {
        let held = transfer.hold_ms.is_some();
        let fault = draw_fault(rng, fault_rate, transfer.timeout, held);
        Plan::around(rng, transfer, fault, late_percent, if held { LATE_HELD_POST } else { LATE_POST })
    }

    /// The faults of a held transaction's decision call.
    fn draw_decision(rng: &mut Rng, transfer: &Transfer, fault_rate: u64, late_percent: u64) -> Plan {
        let fault = draw_decision_fault(rng, fault_rate, transfer.timeout);
        Plan::around(rng, transfer, fault, late_percent, LATE_DECISION)
    }

    fn around(rng: &mut Rng, transfer: &Transfer, fault: Fault, late_percent: u64, late_actions: &[Action]) -> Plan {
        let timeout = transfer.timeout;
        let services = &transfer.services;
        let edge_service = services[rng.below(services.len() as u64) as usize].clone();
        let late = draw_late(rng, late_percent, timeout, late_actions)
            .map(|(service, action, copy)| (services[(service % services.len() as u64) as usize].clone(), action, copy))
            // One fault per (service, action): the edge fault drawn first keeps its place.
            .filter(
                |(service, action, _)| !matches!(fault, Fault::Edge(_, a) if a == *action && *service == edge_service),
            );
        Plan { fault, edge_service, late }
    }

    fn kind(&self) -> String {
        match &self.late {
            None => self.fault.kind(),
            Some((_, action, _)) => format!("{}+late-copy:{}", self.fault.kind(), action.as_str()),
        }
    }
}

/// Which route a call took: the transfer's POST, or a held transaction's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Post,
    Commit,
    Abort,
}

impl Route {
    fn as_str(&self) -> &'static str {
        match self {
            Route::Post => "post",
            Route::Commit => "commit",
            Route::Abort => "abort",
        }
    }
}

/// One answer of the coordinator to one call.
#[derive(Clone)]
struct Outcome {
    /// Which transfer (the same for a keyed transfer's replays and a held one's decisions).
    transfer: usize,
    route: Route,
    /// The transfer was sent with `holdMs`.
    held: bool,
    /// A decision's path ("approve:late", ...); empty for a POST.
    path: String,
    /// The world's clock (every coordinator's) when the call was sent, and when its answer came.
    sent_at: u64,
    answered_at: u64,
    plan: Plan,
    keyed: bool,
    key: Option<String>,
    /// A POST sent with an `Age-Token`: a retry of the request that token was issued for.
    token: Option<AgeToken>,
    replay: &'static str,
    near_limit: bool,
    status: u16,
    answer: Value,
    id: String,
    /// The record right after a crash (500), read apart from the protocol.
    at_crash: Option<Option<String>>,
    /// What this call's coordinator sent for the transaction (late copies aside).
    sent_prepare: bool,
    sent_commit: bool,
    sent_abort: bool,
    /// The call's invoker: its late copies are logged there once they land.
    invoker: FaultyInvoker,
}

/// One call to the coordinator function, through a coordinator and invoker of its own with its faults.
async fn call(env: &TestEnv, transfer: &Transfer, plan: Plan, replay: &'static str) -> Outcome {
    let mut headers = transfer.key.as_ref().map_or(json!({}), |key| json!({"Idempotency-Key": key}));
    if let Some(token) = &transfer.age_token {
        headers[twopc::age::AGE_TOKEN_HEADER] = json!(token.token);
    }
    let event = rest_event("POST", "/transactions", "/transactions", None, headers, Some(&transfer.body));
    Outcome { replay, ..send(env, transfer, plan, &event, Route::Post, "", None).await }
}

/// A held transaction's decision, `POST /transactions/{id}/commit` or `/abort`, under its own faults.
async fn decide(env: &TestEnv, transfer: &Transfer, plan: Plan, id: &str, route: Route, path: &str) -> Outcome {
    let event = twopc_tests::decision_event(id, route.as_str());
    send(env, transfer, plan, &event, route, path, Some(id)).await
}

async fn send(
    env: &TestEnv,
    transfer: &Transfer,
    plan: Plan,
    event: &Value,
    route: Route,
    path: &str,
    id: Option<&str>,
) -> Outcome {
    let invoker = env.fresh_invoker();
    let crash = match plan.fault {
        Fault::Crash(c) => Faults::crash_at(c),
        Fault::Edge(edge, action) => {
            invoker.set(&plan.edge_service, action, edge);
            Faults::default()
        }
        Fault::None => Faults::default(),
    };
    if let Some((service, action, copy)) = &plan.late {
        invoker.set(service, *action, *copy);
    }
    let coordinator = env.coordinator_with(&invoker, crash);
    let sent_at = env.clock_now();
    // Boxed: a coordinator's future is large, and the clients' tasks nest several calls at once.
    let (status, answer) = Box::pin(call_coordinator(&coordinator, event)).await;
    let answered_at = env.clock_now();
    let post = route == Route::Post;
    let named = answer["transactionId"].as_str().filter(|id| !id.is_empty());
    let id = match (id, named) {
        // A decision's answer names the attempt it decided (one sent to an earlier attempt follows
        // `retriedAs` to the one that lives), but a crash names the id it was sent to: the attempt that
        // lives is read from the records. An answer that names none (a 404) is about the id it was sent to.
        (Some(sent), _) if status == 500 => live_attempt(env, sent).await,
        (Some(sent), named) => named.unwrap_or(sent).to_owned(),
        (None, Some(named)) => named.to_owned(),
        // A token retry's 503 before its record was written ("the outcome is unchanged") names none: it is
        // about the id its key, or its token, gives.
        (None, None) if status == 503 => {
            transfer.age_token.as_ref().map(|t| t.retry_id(transfer.key.as_deref())).unwrap_or_default()
        }
        (None, None) => String::new(),
    };
    let at_crash = if status == 500 { Some(record_status(env, &id).await) } else { None };
    let calls: Vec<_> = invoker.calls().into_iter().filter(|c| c.transaction_id == id && !c.late_copy).collect();
    Outcome {
        transfer: transfer.index,
        route,
        held: transfer.hold_ms.is_some(),
        path: path.to_owned(),
        sent_at,
        answered_at,
        plan,
        keyed: post && transfer.key.is_some(),
        key: transfer.key.clone().filter(|_| post),
        token: transfer.age_token.clone().filter(|_| post),
        replay: "",
        near_limit: transfer.near_limit,
        status,
        answer,
        sent_prepare: calls.iter().any(|c| c.action == Action::Prepare),
        sent_commit: calls.iter().any(|c| c.action == Action::Commit && !c.one_phase),
        sent_abort: calls.iter().any(|c| c.action == Action::Abort),
        id,
        at_crash,
        invoker,
    }
}

/// What a held transfer's client does about it once its POST answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Approve,
    Reject,
    ApproveTwice,
    /// Approve and reject at once: exactly one decision wins.
    ApproveAndReject,
    /// Nothing: the hold expires, and the sweeper (or a prepare meeting a held lock) aborts it.
    Nothing,
}

impl Path {
    fn draw(rng: &mut Rng) -> Path {
        match rng.below(20) {
            0..5 => Path::Approve,
            5..9 => Path::Reject,
            9..12 => Path::ApproveTwice,
            12..16 => Path::ApproveAndReject,
            _ => Path::Nothing,
        }
    }

    fn as_str(&self) -> &'static str {
        match self {
            Path::Approve => "approve",
            Path::Reject => "reject",
            Path::ApproveTwice => "approve-twice",
            Path::ApproveAndReject => "approve+reject",
            Path::Nothing => "nothing",
        }
    }
}

/// What a held transfer's POST told its client: the transaction, and its `holdUntil` if it was held
/// (202 PREPARED). A client told only the id (a crash, a 503) or a refusal decides all the same, blind.
fn held_answer(calls: &[Outcome]) -> Option<(String, Option<u64>)> {
    let prepared = calls.iter().find(|o| o.status == 202 && o.answer["status"] == "PREPARED");
    match prepared {
        Some(o) => Some((o.id.clone(), Some(o.answer["holdUntil"].as_u64().unwrap_or(0)))),
        None => calls.iter().find(|o| !o.id.is_empty()).map(|o| (o.id.clone(), None)),
    }
}

/// A held transfer's decision, in a task of its own while its client goes on with other transfers: the
/// client approves, rejects, approves twice, approves and rejects at once, or does nothing; now, later
/// within the hold, or after `holdUntil` (within twice the clock margin, where its own commit aborts it,
/// or after, where expiry may have come first). Returns its path and the answers.
async fn decide_later(
    env: Arc<TestEnv>,
    transfer: Transfer,
    (id, hold_until): (String, Option<u64>),
    mut rng: Rng,
    fault_rate: u64,
    late_percent: u64,
) -> (String, Vec<Outcome>) {
    let path = Path::draw(&mut rng);
    let timing = match hold_until {
        None => "blind",
        Some(_) => ["now", "now", "in-time", "late"][rng.below(4) as usize],
    };
    if path == Path::Nothing {
        return (if timing == "blind" { "nothing:blind" } else { "nothing" }.to_owned(), vec![]);
    }
    let label = format!("{}:{timing}", path.as_str());
    let wait_until = match (timing, hold_until) {
        ("in-time", Some(until)) => env.clock_now() + rng.below(until.saturating_sub(env.clock_now() + 300) + 1),
        ("late", Some(until)) => until + rng.between(1, 4 * CLOCK_MARGIN_MS),
        _ => 0,
    };
    // The world's clock is the system's (nothing moves it until the clients are done): wait until it
    // reads `wait_until`.
    while env.clock_now() < wait_until {
        tokio::time::sleep(Duration::from_millis(wait_until - env.clock_now())).await;
    }
    let mut plan = || Plan::draw_decision(&mut rng, &transfer, fault_rate, late_percent);
    let env = &env;
    let answers = match path {
        Path::Approve => vec![decide(env, &transfer, plan(), &id, Route::Commit, &label).await],
        Path::Reject => vec![decide(env, &transfer, plan(), &id, Route::Abort, &label).await],
        Path::ApproveTwice => {
            let first = decide(env, &transfer, plan(), &id, Route::Commit, &label).await;
            vec![first, decide(env, &transfer, plan(), &id, Route::Commit, &label).await]
        }
        Path::ApproveAndReject => {
            let (commit, abort) = (plan(), plan());
            let (commit, abort) = futures::join!(
                decide(env, &transfer, commit, &id, Route::Commit, &label),
                decide(env, &transfer, abort, &id, Route::Abort, &label)
            );
            vec![commit, abort]
        }
        Path::Nothing => vec![],
    };
    (label, answers)
}

/// When a held transfer's client aborts while its POST is in flight: as soon as the request's first record
/// exists, once the coordinator retried that attempt for contention (the abort goes to an earlier
/// attempt), or a drawn while after the record exists.
const IN_FLIGHT: [&str; 4] = ["created", "created", "retried", "during"];

/// A held transfer (keyed) whose client aborts while its POST is still in flight: `POST
/// /transactions/{id}/abort` to the id its key gives (the request's first attempt), when `when` says
/// ([`IN_FLIGHT`]) or at the latest once the POST answered; and once the POST answered (409 or 202) naming a
/// later attempt (the coordinator retried it), to that one as well (it answers 200 ABORTED whoever aborted it). The
/// client never commits it. Returns the POST's answer, the aborts', and the path (`:after-post` when the POST
/// had answered before the abort was sent).
async fn abort_in_flight(
    env: &TestEnv,
    transfer: &Transfer,
    (post, abort, again): (Plan, Plan, Plan),
    when: &str,
    delay: Duration,
) -> (Vec<Outcome>, String) {
    let first = twopc::coordinator::idempotent_id(transfer.key.as_deref().expect("aborted in flight: keyed"));
    let answered = AtomicBool::new(false);
    let posting = async {
        let outcome = call(env, transfer, post, "").await;
        answered.store(true, Ordering::SeqCst);
        outcome
    };
    let aborting = async {
        let mut created: Option<Instant> = None;
        // The request's records are read with the test's own client (no fault touches it).
        while !answered.load(Ordering::SeqCst) {
            if let Some(record) = env.raw_record(&first).await {
                let created = *created.get_or_insert_with(Instant::now);
                let ready = match when {
                    "retried" => record.contains_key("retriedAs"),
                    "during" => created.elapsed() >= delay,
                    _ => true,
                };
                if ready {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let after = if answered.load(Ordering::SeqCst) { ":after-post" } else { "" };
        let path = format!("abort-in-flight:{when}{after}");
        (decide(env, transfer, abort, &first, Route::Abort, &path).await, path)
    };
    let (post, (abort, path)) = futures::join!(Box::pin(posting), Box::pin(aborting));
    // Told which attempt ended or holds it (a 409 or a 202, not a crash's or a 503's guess).
    let named = post.id.clone();
    let told = matches!(post.status, 202 | 409);
    let mut outcomes = vec![post, abort];
    if told && !named.is_empty() && named != first {
        outcomes.push(decide(env, transfer, again, &named, Route::Abort, &format!("{path}:again")).await);
    }
    (outcomes, path)
}

/// The attempt of `id`'s request that lives now: `id`, or the one its `retriedAs` chain leads to, as
/// recorded now (read with the test's own client).
async fn live_attempt(env: &TestEnv, id: &str) -> String {
    let mut id = id.to_owned();
    for _ in 0..twopc::coordinator::MAX_ATTEMPTS {
        let next = env.raw_record(&id).await.and_then(|r| r.get("retriedAs").and_then(|s| s.as_s().ok().cloned()));
        match next {
            Some(next) => id = next,
            None => break,
        }
    }
    id
}

/// Every answer of the run, as the clients record them.
type Outcomes = Arc<Mutex<Vec<Outcome>>>;
/// Each held transaction's decision path, by transaction.
type HeldPaths = Arc<Mutex<Vec<(String, String)>>>;

/// A held transfer's decision in a task of its own ([`decide_later`]), its answers recorded with the others.
fn spawn_decision(
    (env, outcomes, held_paths): (&Arc<TestEnv>, &Outcomes, &HeldPaths),
    transfer: Transfer,
    answer: (String, Option<u64>),
    rng: Rng,
    (fault_rate, late_percent): (u64, u64),
) -> tokio::task::JoinHandle<()> {
    let (env, outcomes, held_paths) = (env.clone(), outcomes.clone(), held_paths.clone());
    tokio::spawn(async move {
        let id = answer.0.clone();
        let (path, answers) = decide_later(env, transfer, answer, rng, fault_rate, late_percent).await;
        held_paths.lock().unwrap().push((id, path));
        outcomes.lock().unwrap().extend(answers);
    })
}

/// A transaction's status as recorded now, read with the test's own client (no fault touches it).
async fn record_status(env: &TestEnv, id: &str) -> Option<String> {
    if id.is_empty() {
        return None;
    }
    env.raw_record(id).await.and_then(|i| i.get("status").and_then(|s| s.as_s().ok().cloned()))
}

/// What the final record of a call's transaction may be, derived from what the call itself saw; or
/// why the call's answer is wrong whatever the record.
fn expected_records(outcome: &Outcome) -> Result<&'static [Option<&'static str>], String> {
    const COMMITTED: &[Option<&str>] = &[Some("COMMITTED")];
    const ABORTED: &[Option<&str>] = &[Some("ABORTED")];
    const ABORTED_OR_NONE: &[Option<&str>] = &[Some("ABORTED"), None];
    const TERMINAL_OR_NONE: &[Option<&str>] = &[Some("COMMITTED"), Some("ABORTED"), None];
    const TERMINAL: &[Option<&str>] = &[Some("COMMITTED"), Some("ABORTED")];
    const NONE: &[Option<&str>] = &[None];
    let answer = &outcome.answer;
    let said = answer["status"].as_str();
    // A held transaction's decision: the call that won answers its decision, the other one 409 with the
    // decided body (an expired hold's: ABORTED); a 404 means there is no such transaction (its POST never
    // wrote the record); a crash in its second phase leaves the record decided.
    match (outcome.route, outcome.status, said) {
        (Route::Post, ..) => {}
        (Route::Commit, 200, Some("COMMITTED")) | (Route::Commit, 202, Some("COMMITTING")) => return Ok(COMMITTED),
        (Route::Commit, 409, Some("ABORTED")) | (Route::Abort, 200, Some("ABORTED")) => return Ok(ABORTED),
        (Route::Abort, 409, Some("COMMITTED" | "COMMITTING")) => return Ok(COMMITTED),
        // Not decided yet (its writes kept losing to others'): the transaction is told as a retried POST's.
        (_, 202, Some("PREPARED")) => return Ok(TERMINAL),
        (_, 404, _) => return Ok(NONE),
        (_, 503, _) => return Ok(TERMINAL_OR_NONE),
        (_, 500, _) if answer["error"]["code"] == "CRASHED" => {}
        (route, status, said) => {
            return Err(format!("a {} answered {status} {said:?}, which the contract does not allow", route.as_str()));
        }
    }
    match outcome.status {
        // A held transaction: decided later, by its client or by expiry.
        202 if said == Some("PREPARED") && outcome.held => Ok(TERMINAL),
        202 if said == Some("PREPARED") => Err("a transaction sent without holdMs answered PREPARED".to_owned()),
        200 => Ok(COMMITTED),
        202 if answer["status"] == "COMMITTING" => Ok(COMMITTED),
        202 if answer["status"] == "PREPARING" => Ok(TERMINAL_OR_NONE),
        409 if answer["status"] == "ABORTED" => Ok(ABORTED),
        409 => Err(format!("a 409 must say ABORTED, not {}", answer["status"])),
        // Validation refuses a write past one of DynamoDB's limits before anything is written.
        400 if outcome.near_limit => Ok(NONE),
        // The outcome is not known to the caller: whatever it is, it must end.
        503 => Ok(TERMINAL_OR_NONE),
        500 if answer["error"]["code"] == "CRASHED" => {
            let at_crash = outcome.at_crash.clone().flatten();
            match outcome.plan.fault.crashes_before_decision() {
                Some(true) => match at_crash.as_deref() {
                    Some("COMMITTING" | "COMMITTED") => {
                        Err(format!("it crashed before its decision, yet its record said {at_crash:?}"))
                    }
                    _ => Ok(ABORTED_OR_NONE),
                },
                Some(false) => {
                    let committed = match at_crash.as_deref() {
                        Some("COMMITTING" | "COMMITTED") => true,
                        Some("ABORTING" | "ABORTED") => false,
                        // A held one crashed after recording PREPARED: its client or expiry decides.
                        Some("PREPARED") if outcome.held && outcome.route == Route::Post => return Ok(TERMINAL),
                        // Stopped once its refused attempt named the next one (created with the link),
                        // before beginning it: the sweeper aborts that attempt past the deadline.
                        Some("PREPARING")
                            if matches!(outcome.plan.fault, Fault::Crash(CoordinatorCrash::AfterClaim)) =>
                        {
                            false
                        }
                        other => {
                            return Err(format!("it crashed after its decision, yet its record then was {other:?}"));
                        }
                    };
                    if (committed && outcome.sent_abort) || (!committed && outcome.sent_commit) {
                        return Err(format!(
                            "its record said {at_crash:?} but it sent commit: {}, abort: {}",
                            outcome.sent_commit, outcome.sent_abort
                        ));
                    }
                    Ok(if committed { COMMITTED } else { ABORTED })
                }
                None => Err("a crash that was not injected".to_owned()),
            }
        }
        other => Err(format!("unexpected answer {other}")),
    }
}

/// The words of a DynamoDB failure that must not reach a caller.
fn leaked_words(env: &TestEnv, answer: &Value) -> Vec<String> {
    let text = answer.to_string();
    let prefix = env.transactions.table().trim_end_matches("-transactions").to_owned();
    [prefix.as_str(), "DynamoDB", "PutItem", "UpdateItem", "GetItem", "DeleteItem", "TransactWriteItems", "Query"]
        .iter()
        .chain(["ThrottlingException", "InternalServerError", "ValidationException", "ConditionalCheckFailed"].iter())
        .chain([INJECTED_THROTTLING_MESSAGE, INJECTED_INTERNAL_MESSAGE, INJECTED_RESET_MESSAGE].iter())
        .filter(|w| text.contains(**w))
        .map(|w| w.to_string())
        .collect()
}

fn value_digest(value: &Value) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    hasher.finish()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bank_stays_balanced_under_random_faults() {
    let seed = env_number(
        "BANK_SEED",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    );
    let transfers = env_number("BANK_TRANSFERS", 240);
    let clients = env_number("BANK_CLIENTS", 8);
    let soak = Duration::from_secs(env_number("BANK_SOAK_SECS", 0));
    let fault_rate = env_number("BANK_FAULT_PERCENT", 50);
    let dynamo_per_mille = env_number("BANK_DYNAMO_PERMILLE", 4);
    let limit_percent = env_number("BANK_LIMIT_PERCENT", 6);
    let late_percent = env_number("BANK_LATE_PERCENT", 80);
    let order_percent = env_number("BANK_ORDER_PERCENT", 30);
    let hold_percent = env_number("BANK_HOLD_PERCENT", 20);
    let abort_in_flight_percent = env_number("BANK_ABORT_IN_FLIGHT_PERCENT", 25);
    let token_retry_percent = env_number("BANK_TOKEN_RETRY_PERCENT", 30);
    let payment_per_mille = env_number("BANK_PAYMENT_PERMILLE", 40);
    println!("bank: seed={seed} (replay with BANK_SEED={seed})");
    let run_started = Instant::now();

    let dynamo_faults = DynamoFaults::new(seed ^ 0xD1B5_4A32_D192_ED03);
    let env = Arc::new(
        TestEnv::with_dynamo_faults(&["service-a", "service-b", "inventory", "payments"], dynamo_faults.clone()).await,
    );
    let payment_api = env.payment_api.clone().expect("the payments service's API");
    payment_faults(&payment_api, payment_per_mille, seed);
    for (service, id) in ACCOUNTS {
        env.put_account(service, id, &OPENING_BALANCE.to_string()).await;
    }
    for sku in SKUS {
        env.put_data(inventory::SERVICE, sku, &inventory::sku(sku, OPENING_STOCK, true)).await;
    }
    dynamo_rules(&dynamo_faults, dynamo_per_mille, TIMEOUTS[0]);
    // A sweeper runs alongside the clients, as the schedule would, racing live coordinators.
    let stop = Arc::new(AtomicBool::new(false));
    let background_errors = Arc::new(AtomicU32::new(0));
    let background = {
        let (env, stop, errors) = (env.clone(), stop.clone(), background_errors.clone());
        tokio::spawn(async move {
            let sweeper = env.sweeper(None);
            let mut runs = 0u32;
            while !stop.load(Ordering::SeqCst) {
                // A run that meets a DynamoDB fault fails; the next one tries again.
                if sweeper.sweep().await.is_err() {
                    errors.fetch_add(1, Ordering::SeqCst);
                }
                runs += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            runs
        })
    };

    let outcomes: Outcomes = Arc::default();
    let held_paths: HeldPaths = Arc::default();
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|client| {
            let (env, outcomes, held_paths) = (env.clone(), outcomes.clone(), held_paths.clone());
            tokio::spawn(async move {
                let mut rng = Rng(seed ^ (client + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
                let mut deferred: Vec<Transfer> = vec![];
                // Held transfers' decisions, each in a task of its own (some wait past holdUntil).
                let mut deciding = vec![];
                let mut done = 0;
                let record = |outcome: Outcome| outcomes.lock().unwrap().push(outcome);
                let plan = |rng: &mut Rng, transfer: &Transfer| Plan::draw(rng, transfer, fault_rate, late_percent);
                while done < transfers / clients || started.elapsed() < soak {
                    done += 1;
                    // Mostly short deadlines; some longer ones (wait-die must not punish them, and a late
                    // copy has more room to land before the deadline after others touched the items).
                    let timeout = TIMEOUTS[rng.below(TIMEOUTS.len() as u64) as usize];
                    let timeout_ms = timeout.as_millis() as u64;
                    let near_limit = rng.below(100) < limit_percent;
                    let order = !near_limit && rng.below(100) < order_percent;
                    let (mut body, services) = if order {
                        order_body(&mut rng, timeout_ms, &format!("pay-{client}-{done}"))
                    } else if near_limit {
                        let body = near_limit_body(&mut rng, timeout_ms);
                        let services: Vec<String> = body["participants"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|p| p["service"].as_str().unwrap().to_owned())
                            .collect();
                        (body, services)
                    } else {
                        let from = ACCOUNTS[rng.below(10) as usize];
                        let mut to = ACCOUNTS[rng.below(10) as usize];
                        while to == from {
                            to = ACCOUNTS[rng.below(10) as usize];
                        }
                        // Up to 120 out of accounts near 100: the min guard refuses some.
                        let amount = 1 + rng.below(120);
                        (transfer_body(from, to, amount, timeout_ms), vec![from.0.to_owned(), to.0.to_owned()])
                    };
                    // Some transfers and orders are held for a decision their client makes later; the holds
                    // are short, so that some expire during the run (every service accepts holds of up to 15
                    // minutes by default).
                    let hold_ms = (!near_limit && rng.below(100) < hold_percent).then(|| rng.between(1_000, 3_000));
                    if let Some(hold_ms) = hold_ms {
                        body["holdMs"] = json!(hold_ms);
                    }
                    // Some held ones are aborted by their client while their POST is in flight: keyed, so that the
                    // client knows the id its key gives.
                    // One transfer in four is keyed: its record is written before the prepares (PREPARING),
                    // the others' only at the decision (presumed abort), but a held one's first too. Most
                    // keyed ones are replayed.
                    let in_flight = hold_ms.is_some() && rng.below(100) < abort_in_flight_percent;
                    let keyed = rng.below(4) == 0 || in_flight;
                    let transfer = Transfer {
                        index: (client * 1_000_000 + done) as usize,
                        body: body.to_string(),
                        key: keyed.then(|| format!("bank-{seed}-{client}-{done}")),
                        services,
                        near_limit,
                        timeout,
                        hold_ms,
                        age_token: None,
                    };
                    let first = plan(&mut rng, &transfer);
                    let replay = if keyed { rng.below(4) } else { 0 };
                    let calls = match replay {
                        _ if in_flight => {
                            let when = IN_FLIGHT[rng.below(IN_FLIGHT.len() as u64) as usize];
                            let delay = Duration::from_millis(rng.below(timeout_ms / 2));
                            let mut decision = || Plan::draw_decision(&mut rng, &transfer, fault_rate, late_percent);
                            let plans = (first, decision(), decision());
                            let (calls, path) = abort_in_flight(&env, &transfer, plans, when, delay).await;
                            let first_id =
                                twopc::coordinator::idempotent_id(transfer.key.as_deref().unwrap_or_default());
                            held_paths.lock().unwrap().push((first_id, path));
                            // Its key replayed later (an abort that found no record leaves none to replay).
                            if replay == 3 && calls[1].status != 404 {
                                deferred.push(transfer.clone());
                            }
                            calls
                        }
                        0 => vec![call(&env, &transfer, first, "").await],
                        1 => {
                            let first = call(&env, &transfer, first, "").await;
                            let again = plan(&mut rng, &transfer);
                            vec![first, call(&env, &transfer, again, "at once").await]
                        }
                        2 => {
                            let again = plan(&mut rng, &transfer);
                            let (first, again) = futures::join!(
                                call(&env, &transfer, first, ""),
                                call(&env, &transfer, again, "concurrent")
                            );
                            vec![first, again]
                        }
                        _ => {
                            deferred.push(transfer.clone());
                            vec![call(&env, &transfer, first, "").await]
                        }
                    };
                    let shared = (&env, &outcomes, &held_paths);
                    if transfer.hold_ms.is_some()
                        && !in_flight
                        && let Some(answer) = held_answer(&calls)
                    {
                        let rng = Rng(rng.next());
                        let rates = (fault_rate, late_percent);
                        deciding.push(spawn_decision(shared, transfer.clone(), answer, rng, rates));
                    }
                    // A final 409 refused for contention carries an age token: the client may retry with it at
                    // once, as a request of its own (under a fresh key, or none), and the retry's own refusal
                    // again; it may send that retry twice (the same token again answers what the retry
                    // answered), and replay the refused request's key after it (its answer stays).
                    let mut refused = calls.iter().find_map(AgeToken::of).filter(|_| !in_flight);
                    for outcome in calls {
                        record(outcome);
                    }
                    let mut retried = false;
                    for depth in 1..=2 {
                        let Some(token) = refused.take() else { break };
                        let (retry, fresh_key, twice) =
                            (rng.below(100) < token_retry_percent, rng.below(3) > 0, rng.below(4) == 0);
                        // A token is good for the request's timeoutMs after its answer: one the client can no
                        // longer send in time is dropped.
                        if !retry || env.clock_now() + TOKEN_SLACK_MS > token.expires_at {
                            break;
                        }
                        let expires_at = token.expires_at;
                        let retry = Transfer {
                            index: transfer.index + depth * 1_000_000_000,
                            key: fresh_key.then(|| format!("bank-{seed}-{client}-{done}-token{depth}")),
                            near_limit: false,
                            age_token: Some(token),
                            ..transfer.clone()
                        };
                        let mut calls = vec![call(&env, &retry, plan(&mut rng, &retry), "").await];
                        if twice && env.clock_now() + TOKEN_SLACK_MS <= expires_at {
                            calls.push(call(&env, &retry, plan(&mut rng, &retry), "token again").await);
                        }
                        if retry.hold_ms.is_some()
                            && let Some(answer) = held_answer(&calls)
                        {
                            let rng = Rng(rng.next());
                            let rates = (fault_rate, late_percent);
                            deciding.push(spawn_decision(shared, retry.clone(), answer, rng, rates));
                        }
                        refused = calls.iter().find_map(AgeToken::of);
                        for outcome in calls {
                            record(outcome);
                        }
                        retried = true;
                    }
                    if retried && transfer.key.is_some() && rng.below(2) == 0 {
                        let again = plan(&mut rng, &transfer);
                        record(call(&env, &transfer, again, "after its token's retry").await);
                    }
                    // A replay "later": after a few other transfers touched the accounts.
                    if deferred.len() > 2 {
                        let transfer = deferred.remove(0);
                        let again = plan(&mut rng, &transfer);
                        record(call(&env, &transfer, again, "later").await);
                    }
                }
                for transfer in deferred {
                    let again = plan(&mut rng, &transfer);
                    record(call(&env, &transfer, again, "later").await);
                }
                for decision in deciding {
                    decision.await.expect("a held transfer's decision");
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("client");
    }
    let clients_ms = run_started.elapsed().as_millis();
    stop.store(true, Ordering::SeqCst);
    let background_runs = background.await.unwrap();

    // Faults stop; every late copy lands; every deadline and lock expiry passes, and sweeps bring
    // everything to an end.
    let dynamo_seen = dynamo_faults.seen();
    dynamo_faults.clear();
    let payment_calls = payment_api.calls().len();
    payment_api.heal();
    let settle_started = Instant::now();
    env.settle().await;
    payment_api.settle().await;
    let settle_ms = settle_started.elapsed().as_millis();
    // Every hold ends too: the final recovery runs past the last holdUntil and twice the clock margin (the
    // clients, and their decisions, are done: nothing writes a holdUntil any more).
    let last_hold_until = env.records().await.iter().filter_map(|r| r["holdUntil"].as_u64()).max().unwrap_or(0);
    env.clock.advance(10 * 60_000);
    env.clock.advance((last_hold_until + 2 * CLOCK_MARGIN_MS + 1).saturating_sub(env.clock_now()));
    let (mut sweeps, mut quiet) = env.try_sweep_until_quiet(20).await;
    // A resource participant cancelling during these sweeps (an expired hold's order aborted only now)
    // repeats its cancel once every try request has landed (`TRY_IN_FLIGHT_MS` later): its entry keeps a
    // lock due then, which the sweeper leaves until it is due. Recovery runs on past every such lock's
    // expiry (polled from the tables); a lock that was already due is not waited for, and is reported.
    for _ in 0..3 {
        let now = env.clock_now();
        let due = env
            .locked_items()
            .await
            .iter()
            .filter_map(|(_, item)| item["lock"]["expiresAt"].as_u64())
            .filter(|expires| *expires + 2 * CLOCK_MARGIN_MS >= now)
            .max();
        let Some(due) = due else { break };
        env.clock.advance(due + 2 * CLOCK_MARGIN_MS + 1 - now);
        let (more, settled) = env.try_sweep_until_quiet(20).await;
        sweeps.extend(more);
        quiet = settled;
    }

    let mut violations: Vec<(&'static str, String)> = vec![];
    if !quiet {
        violations.push((
            "sweeps",
            format!("sweeps did not become quiet: the last ones {:?}", &sweeps[sweeps.len().saturating_sub(2)..]),
        ));
    }
    let records = env.records().await;
    let mut expected: HashMap<(String, String), BigDecimal> =
        ACCOUNTS.iter().map(|(s, id)| ((s.to_string(), id.to_string()), BigDecimal::from(OPENING_BALANCE))).collect();
    let mut touches: HashMap<(String, String), u64> = HashMap::new();
    // (account, field) → every value a committed transaction set it to.
    let mut written: HashMap<(String, String, String), HashSet<u64>> = HashMap::new();
    // SKU → (stock, reserved, committed writes) as the committed orders make them.
    let mut skus: HashMap<String, (i64, i64, u64)> =
        SKUS.iter().map(|sku| (sku.to_string(), (OPENING_STOCK as i64, 0, 0))).collect();
    // Payment reference → amount, for every committed charge.
    let mut charged: HashMap<String, u64> = HashMap::new();
    let mut committed_ids = HashSet::new();
    let (mut committed, mut aborted) = (0, 0);
    for record in &records {
        match record["status"].as_str() {
            Some("COMMITTED") => committed += 1,
            Some("ABORTED") => {
                aborted += 1;
                continue;
            }
            other => {
                violations.push((
                    "not terminal",
                    format!(
                        "transaction {} is not terminal: {other:?}; {}",
                        record["transactionId"],
                        summary_of(record)
                    ),
                ));
                continue;
            }
        }
        committed_ids.insert(record["transactionId"].as_str().unwrap().to_owned());
        for participant in record["participants"].as_array().unwrap() {
            let service = participant["service"].as_str().unwrap();
            for op in participant["operations"].as_array().unwrap() {
                let account = op["key"]["entityId"].as_str().unwrap().to_owned();
                if service == payments::SERVICE {
                    charged.insert(account, op["amount"].as_u64().expect("a charge's amount"));
                    continue;
                }
                if service == inventory::SERVICE {
                    let quantity = op["quantity"].as_i64().expect("an order's quantity");
                    let sku = skus.get_mut(&account).expect("a known SKU");
                    match op["op"].as_str() {
                        Some("reserve") => (sku.0, sku.1) = (sku.0 - quantity, sku.1 + quantity),
                        Some("release") => (sku.0, sku.1) = (sku.0 + quantity, sku.1 - quantity),
                        other => panic!("the bank orders no {other:?}"),
                    }
                    sku.2 += 1;
                    continue;
                }
                let key = (service.to_owned(), account.clone());
                match op["op"].as_str() {
                    Some("add") => {
                        let delta: BigDecimal = op["delta"].to_string().parse().unwrap();
                        *expected.get_mut(&key).expect("a known account") += delta;
                    }
                    Some("set") => {
                        for (field, value) in op["set"].as_object().unwrap() {
                            written
                                .entry((service.to_owned(), account.clone(), field.clone()))
                                .or_default()
                                .insert(value_digest(value));
                        }
                    }
                    other => panic!("the bank writes no {other:?}"),
                }
                *touches.entry(key).or_default() += 1;
            }
        }
    }
    let mut total = BigDecimal::from(0);
    for (service, id) in ACCOUNTS {
        let item = env.item(service, id).await.expect("account exists");
        let balance: BigDecimal = item["data"]["balance"].to_string().parse().unwrap();
        total += &balance;
        let key = (service.to_owned(), id.to_owned());
        if balance < 0 {
            violations.push(("guard", format!("{service}/{id} is below its guard: {balance}")));
        }
        if balance != expected[&key] {
            violations.push((
                "balance",
                format!(
                    "{service}/{id} holds {balance} but its committed transactions make {}: an aborted transaction left an effect or a commit applied twice",
                    expected[&key]
                ),
            ));
        }
        let version = item["version"].as_u64().unwrap();
        let applied = touches.get(&key).copied().unwrap_or(0);
        if version != applied {
            violations
                .push(("version", format!("{service}/{id} is at version {version} after {applied} committed writes")));
        }
        if let Some(last) = item.get("lastTx").and_then(Value::as_str)
            && !committed_ids.contains(last)
        {
            violations.push(("lastTx", format!("{service}/{id} was last written by {last}, which did not commit")));
        }
        for (field, value) in item["data"].as_object().unwrap() {
            if field != "balance"
                && !written
                    .get(&(service.to_owned(), id.to_owned(), field.clone()))
                    .is_some_and(|values| values.contains(&value_digest(value)))
            {
                violations.push((
                    "field",
                    format!(
                        "{service}/{id}.{field} holds a value no committed transaction set (an aborted write's effect)"
                    ),
                ));
            }
        }
    }
    // The inventory: each SKU holds what its committed orders computed, never below zero, and the units
    // are conserved (stock + reserved is what it opened with).
    for sku in SKUS {
        let item = env.item(inventory::SERVICE, sku).await.expect("the SKU exists");
        let number = |field: &str| item["data"][field].as_i64().unwrap_or(i64::MIN);
        let (stock, reserved, version) = (number("stock"), number("reserved"), item["version"].as_u64().unwrap());
        let (want_stock, want_reserved, writes) = skus[sku];
        if (stock, reserved) != (want_stock, want_reserved) {
            violations.push((
                "inventory",
                format!(
                    "{sku} holds stock {stock}, reserved {reserved}, but its committed orders make {want_stock}, {want_reserved}: an aborted order left an effect or a commit applied twice"
                ),
            ));
        }
        if stock < 0 || reserved < 0 || stock + reserved != OPENING_STOCK as i64 {
            violations.push((
                "inventory",
                format!("{sku}: stock {stock} and reserved {reserved} break the inventory's rules"),
            ));
        }
        if version != writes {
            violations.push(("version", format!("{sku} is at version {version} after {writes} committed orders")));
        }
    }
    // The payment API: nothing held once faults stopped and recovery ran; every committed charge captured
    // once, for its amount; nothing captured for an order that did not commit.
    let authorizations = payment_api.authorizations();
    for authorization in &authorizations {
        let committed_amount = charged.get(&authorization.reference);
        let fine = match authorization.status.as_str() {
            "captured" => committed_amount == Some(&authorization.amount),
            // Voided for an order that committed: a reservation of one of its attempts that was refused for
            // contention and retried (issue 35); the attempt that committed captured its own, checked below.
            "voided" => true,
            _ => false,
        };
        if !fine {
            violations.push((
                "payments",
                format!(
                    "{} for {} ({} cents) is {}, its order {}",
                    authorization.id,
                    authorization.reference,
                    authorization.amount,
                    authorization.status,
                    if committed_amount.is_some() { "committed" } else { "did not commit" }
                ),
            ));
        }
    }
    for (reference, amount) in &charged {
        let captured = authorizations.iter().filter(|a| &a.reference == reference && a.status == "captured").count();
        if captured != 1 {
            violations.push((
                "payments",
                format!("the committed charge {reference} ({amount} cents) was captured {captured} times"),
            ));
        }
    }
    let orders = records
        .iter()
        .filter(|r| r["participants"].as_array().unwrap().iter().any(|p| p["service"] == inventory::SERVICE))
        .count();
    if total != OPENING_BALANCE * ACCOUNTS.len() as u64 {
        violations.push(("total", format!("the total is {total}, not {}", OPENING_BALANCE * ACCOUNTS.len() as u64)));
    }
    for (service, item) in env.locked_items().await {
        let mut item = item;
        item["data"] = json!("...");
        violations.push(("lock left", format!("a lock is left on {service}: {item}")));
    }

    // Issue 47: one event per request outcome, from the transactions table's stream as the outcomes
    // function reads it, delivered under faults of its own (the bus refusing entries and calls, batches sent
    // again): none lost, none made up, copies carrying the same id.
    match twopc_tests::outcomes::check_outcome_events(&env, seed).await {
        Ok(check) => println!("bank {check}"),
        Err(problems) => violations.extend(problems.into_iter().map(|p| ("outcome events", p))),
    }
    let outcomes = outcomes.lock().unwrap();
    let statuses: HashMap<&str, &str> = records
        .iter()
        .map(|r| (r["transactionId"].as_str().unwrap(), r["status"].as_str().unwrap_or_default()))
        .collect();
    // Every answer names its transaction and agrees with its final record, as the call itself saw it.
    for outcome in outcomes.iter() {
        let recorded = statuses.get(outcome.id.as_str()).copied();
        let what = format!(
            "{} answer {} ({}{}{}{}) for {:?}",
            outcome.route.as_str(),
            outcome.status,
            outcome.plan.kind(),
            if outcome.keyed { ", keyed" } else { "" },
            if outcome.replay.is_empty() { String::new() } else { format!(", replay {}", outcome.replay) },
            match (outcome.held, outcome.path.as_str()) {
                (false, _) => String::new(),
                (true, "") => ", held".to_owned(),
                (true, path) => format!(", held, {path} sent at {}", outcome.sent_at),
            },
            outcome.id
        );
        // A write refused at validation (near DynamoDB's limits) has no transaction; a keyed one's id is
        // known, and nothing may be recorded under it.
        let recorded = match (outcome.status, &outcome.key) {
            (400, Some(key)) if outcome.near_limit => {
                statuses.get(twopc::coordinator::idempotent_id(key).as_str()).copied()
            }
            (400, None) if outcome.near_limit => None,
            // A keyed call whose first read of its key failed wrote nothing and cannot tell which request
            // its key names (one run in one phase is under another id): it names none, and says so.
            (503, Some(_))
                if outcome.id.is_empty()
                    && outcome.answer["error"]["message"]
                        .as_str()
                        .is_some_and(|m| m.ends_with("the outcome is unchanged")) =>
            {
                continue;
            }
            _ if outcome.id.is_empty() => {
                violations.push(("answer", format!("{what} names no transaction: {}", outcome.answer)));
                continue;
            }
            _ => recorded,
        };
        match expected_records(outcome) {
            Ok(allowed) if allowed.contains(&recorded) => {}
            Ok(allowed) => violations.push((
                "answer vs record",
                format!(
                    "{what}: its record ends {recorded:?}, expected one of {allowed:?}; answered {}",
                    outcome.answer
                ),
            )),
            Err(why) => violations.push(("answer", format!("{what}: {why}; answered {}", outcome.answer))),
        }
        if outcome.status >= 500 && outcome.answer["error"]["code"] != "CRASHED" {
            let leaked = leaked_words(&env, &outcome.answer);
            if !leaked.is_empty() {
                violations.push(("answer leaks", format!("{what} quotes {leaked:?}: {}", outcome.answer)));
            }
        }
    }
    // Held transactions. The coordinator commits one only while its clock is at or before holdUntil (and
    // every coordinator here shares the world's clock): a committed one had a commit sent by then. One
    // that was held and ended aborted was aborted by its client or by expiry, by expiry alone if its
    // client never rejected it.
    let records_by_id: HashMap<&str, &Value> =
        records.iter().map(|r| (r["transactionId"].as_str().unwrap_or_default(), r)).collect();
    let mut decisions: BTreeMap<&str, Vec<&Outcome>> = BTreeMap::new();
    for outcome in outcomes.iter().filter(|o| o.held && !o.id.is_empty()) {
        decisions.entry(outcome.id.as_str()).or_default().push(outcome);
    }
    // A decision is its request's, whichever attempt it was sent to or names (one that crashed, or answered
    // 503, names the id it was sent to).
    let mut commits_of: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut rejected_requests: HashSet<&str> = HashSet::new();
    for outcome in outcomes.iter().filter(|o| o.held && !o.id.is_empty()) {
        match outcome.route {
            Route::Commit => commits_of.entry(request_id(&outcome.id)).or_default().push(outcome.sent_at),
            Route::Abort => _ = rejected_requests.insert(request_id(&outcome.id)),
            Route::Post => {}
        }
    }
    for id in decisions.keys() {
        let Some(record) = records_by_id.get(id) else { continue };
        let (status, hold_until) = (record["status"].as_str(), record["holdUntil"].as_u64());
        let commits = commits_of.get(request_id(id)).cloned().unwrap_or_default();
        let rejected = rejected_requests.contains(request_id(id));
        match (status, hold_until) {
            (Some("COMMITTED"), None) => {
                violations.push(("held", format!("held transaction {id} committed without being held (no holdUntil)")))
            }
            (Some("COMMITTED"), Some(until)) if !commits.iter().any(|sent| *sent <= until) => violations.push((
                "held",
                format!(
                    "held transaction {id} committed, yet no commit was sent by its holdUntil {until}: {commits:?}"
                ),
            )),
            (Some("ABORTED"), Some(until)) => {
                let reason = record["reason"].as_str().unwrap_or_default();
                let by_client = rejected && reason == twopc::coordinator::HELD_ABORT_REASON;
                if reason != twopc::recovery::HOLD_EXPIRED_REASON && !by_client {
                    violations.push((
                        "held",
                        format!(
                            "held transaction {id} (until {until}) ended aborted for {reason:?}; its client {}",
                            if rejected { "rejected it" } else { "never rejected it" }
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    // A held transfer its client aborted while its POST was in flight: no attempt of its request commits
    // (its client never sent a commit), whatever the abort answered; the abort's answer agrees with the
    // record of the attempt it names (checked above: a 200 means aborted).
    let aborted_in_flight: BTreeMap<&str, &Outcome> = outcomes
        .iter()
        .filter(|o| o.route == Route::Abort && o.path.starts_with("abort-in-flight") && !o.path.ends_with(":again"))
        .map(|o| (request_id(&o.id), o))
        .collect();
    for record in &records {
        let id = record["transactionId"].as_str().unwrap_or_default();
        if let Some(abort) = aborted_in_flight.get(request_id(id))
            && record["status"] == "COMMITTED"
        {
            violations.push((
                "aborted in flight",
                format!(
                    "attempt {id} of a held request its client aborted while its POST was in flight ended {}; the \
                     abort ({}, sent at {}) answered {} {}; {}",
                    record["status"],
                    abort.path,
                    abort.sent_at,
                    abort.status,
                    abort.answer,
                    summary_of(record)
                ),
            ));
        }
    }
    // Age links (issue 41): a token retry's first record names the attempt whose age it claimed (`ageOf`),
    // which names it back (`ageClaimedBy`), was refused for contention by its own coordinator and not
    // retried: a claim never names a record that does not exist or another retry.
    for record in &records {
        let id = record["transactionId"].as_str().unwrap_or_default();
        if let Some(of) = record["ageOf"].as_str() {
            let claimed = records_by_id.get(of).map(|r| &r["ageClaimedBy"]);
            if request_id(id) != id || claimed.and_then(Value::as_str) != Some(id) {
                violations.push((
                    "age link",
                    format!("{id} claims the age of {of} (ageOf), whose ageClaimedBy is {claimed:?}"),
                ));
            }
        }
        if let Some(by) = record["ageClaimedBy"].as_str() {
            let back = records_by_id.get(by).map(|r| &r["ageOf"]);
            let refused = record["refusedForContention"] == true && record.get("retriedAs").is_none();
            if back.and_then(Value::as_str) != Some(id) || !refused {
                violations.push((
                    "age link",
                    format!(
                        "{id} names {by} as its age's claimer (ageClaimedBy), whose ageOf is {back:?}; it was refused \
                         for contention: {}, retried as {}",
                        record["refusedForContention"], record["retriedAs"]
                    ),
                ));
            }
        }
    }
    for outcome in outcomes.iter().filter(|o| !o.id.is_empty()) {
        if let Some(token) = &outcome.token
            && let Some(first) = records_by_id.get(request_id(&outcome.id))
            && first["ageOf"].as_str() != Some(token.refused.as_str())
        {
            violations.push((
                "age link",
                format!(
                    "a retry with the token of {} answered {} {}, yet its request's record {} names ageOf {}",
                    token.refused, outcome.status, outcome.answer, first["transactionId"], first["ageOf"]
                ),
            ));
        }
    }
    // A key never executes twice: one call at most prepares its transaction (a token's retry without a key
    // is idempotent by its token).
    let mut preparers: BTreeMap<&str, u32> = BTreeMap::new();
    for outcome in outcomes.iter().filter(|o| (o.keyed || o.token.is_some()) && o.sent_prepare) {
        *preparers.entry(outcome.id.as_str()).or_default() += 1;
    }
    for (id, count) in preparers.iter().filter(|(_, count)| **count > 1) {
        violations.push(("key ran twice", format!("keyed transaction {id} was prepared by {count} executions")));
    }
    // Replays of a key agree with each other (each agrees with the record, checked above).
    let mut by_transfer: BTreeMap<usize, Vec<&Outcome>> = BTreeMap::new();
    for outcome in outcomes.iter().filter(|o| o.route == Route::Post && (o.keyed || o.token.is_some())) {
        by_transfer.entry(outcome.transfer).or_default().push(outcome);
    }
    for calls in by_transfer.values().filter(|calls| calls.len() > 1) {
        // One request: its answers may name different attempts of it (issue 35: `<first id>-<n>`, the attempt
        // that was running or that ended it), never another request; and never both outcomes.
        let ids: HashSet<&str> = calls.iter().map(|o| o.id.as_str()).filter(|id| !id.is_empty()).collect();
        let requests: HashSet<&str> = ids.iter().map(|id| request_id(id)).collect();
        if requests.len() > 1 {
            violations.push(("replay", format!("one key named several requests: {ids:?}")));
        }
        let said = |status: u16, outcome: &str| {
            calls.iter().any(|o| !o.held && o.status == status && o.answer["status"].as_str() == Some(outcome))
        };
        if said(200, "COMMITTED") && said(409, "ABORTED") {
            violations.push(("replay", format!("one key was answered both COMMITTED and ABORTED: {ids:?}")));
        }
        if calls.iter().any(|o| o.status == 422) {
            violations.push((
                "replay",
                format!(
                    "a replay with the same body was refused 422: {:?}",
                    calls.iter().map(|o| o.status).collect::<Vec<_>>()
                ),
            ));
        }
    }
    // A key's first final answer is its answer for ever (issue 41): every call of the key sent after that
    // answer came answers, when it answers finally, the same status naming the same attempt, and never goes
    // back to a 202. A token's retry without a key is answered by its token alike.
    let mut by_request: BTreeMap<String, Vec<&Outcome>> = BTreeMap::new();
    for outcome in outcomes.iter().filter(|o| o.route == Route::Post) {
        let identity = match (&outcome.key, &outcome.token) {
            (Some(key), _) => format!("key {key}"),
            (None, Some(token)) => format!("token of {}", token.refused),
            (None, None) => continue,
        };
        by_request.entry(identity).or_default().push(outcome);
    }
    let final_answer = |o: &Outcome| match (o.status, o.answer["status"].as_str()) {
        (200, Some("COMMITTED")) | (409, Some("ABORTED")) => Some((o.status, o.answer["transactionId"].clone())),
        _ => None,
    };
    for (identity, calls) in &by_request {
        let Some(first) = calls.iter().filter(|o| final_answer(o).is_some()).min_by_key(|o| o.answered_at) else {
            continue;
        };
        for later in calls.iter().filter(|o| o.sent_at > first.answered_at) {
            let changed = match final_answer(later) {
                Some(answer) => final_answer(first) != Some(answer),
                None => later.status == 202,
            };
            if changed {
                violations.push((
                    "final answer changed",
                    format!(
                        "{identity}: answered {} {} at {} ({}), then a call sent at {} ({}) answered {} {}",
                        first.status,
                        first.answer,
                        first.answered_at,
                        if first.replay.is_empty() { "first call" } else { first.replay },
                        later.sent_at,
                        if later.replay.is_empty() { "first call" } else { later.replay },
                        later.status,
                        later.answer
                    ),
                ));
            }
        }
    }

    let mut faults: BTreeMap<String, u32> = BTreeMap::new();
    for outcome in outcomes.iter() {
        if !matches!(outcome.plan.fault, Fault::None) {
            *faults.entry(outcome.plan.fault.kind()).or_default() += 1;
        }
        if let Some((_, action, _)) = &outcome.plan.late {
            *faults.entry(format!("late-copy:{}", action.as_str())).or_default() += 1;
        }
    }
    let mut dynamo: BTreeMap<String, u32> = BTreeMap::new();
    for seen in dynamo_seen.iter() {
        if let Some(fault) = seen.fault {
            *dynamo.entry(format!("{}:{}", fault.name(), seen.operation)).or_default() += 1;
        }
    }
    // What the late copies met when they landed.
    let mut late: BTreeMap<String, u32> = BTreeMap::new();
    for call in outcomes.iter().flat_map(|o| o.invoker.calls()).filter(|c| c.late_copy) {
        let answer = call.answer.split(' ').next().unwrap_or_default().to_owned();
        *late.entry(format!("{}:{answer}", call.action.as_str())).or_default() += 1;
    }
    let mut answers: BTreeMap<u16, u32> = BTreeMap::new();
    for outcome in outcomes.iter() {
        *answers.entry(outcome.status).or_default() += 1;
    }
    let replays = outcomes.iter().filter(|o| !o.replay.is_empty()).count();
    let near_limit = outcomes.iter().filter(|o| o.near_limit).count();
    println!(
        "bank: seed={seed} calls={} replays={replays} near_limit={near_limit} orders={orders} charges_committed={} authorizations={} payment_calls={payment_calls} answers={answers:?} committed={committed} aborted={aborted} \
         faults={} {faults:?} late_copies={late:?} dynamo_requests={} dynamo_faults={} {dynamo:?} background_sweeps={background_runs} (failed {}) \
         final_sweeps={} clients_ms={clients_ms} settle_ms={settle_ms} total_ms={} violations={}",
        outcomes.len(),
        charged.len(),
        authorizations.len(),
        faults.values().sum::<u32>(),
        dynamo_seen.len(),
        dynamo.values().sum::<u32>(),
        background_errors.load(Ordering::SeqCst),
        sweeps.len(),
        run_started.elapsed().as_millis(),
        violations.len()
    );
    // What the held transfers did: their paths, how each ended, and the decisions' answers.
    let held_transfers = outcomes.iter().filter(|o| o.held).map(|o| o.transfer).collect::<HashSet<_>>().len();
    let prepared = decisions
        .values()
        .filter(|calls| {
            calls.iter().any(|o| o.route == Route::Post && o.status == 202 && o.answer["status"] == "PREPARED")
        })
        .count();
    let mut held_ends: BTreeMap<String, u32> = BTreeMap::new();
    for (id, path) in held_paths.lock().unwrap().iter() {
        let end = statuses.get(id.as_str()).copied().unwrap_or("none");
        *held_ends.entry(format!("{path}:{end}")).or_default() += 1;
    }
    let mut decision_answers: BTreeMap<String, u32> = BTreeMap::new();
    for outcome in outcomes.iter().filter(|o| o.route != Route::Post) {
        let said = outcome.answer["status"].as_str().or(outcome.answer["error"]["code"].as_str()).unwrap_or_default();
        *decision_answers.entry(format!("{} {} {said}", outcome.route.as_str(), outcome.status)).or_default() += 1;
    }
    let expired = records.iter().filter(|r| r["reason"] == twopc::recovery::HOLD_EXPIRED_REASON).count();
    let held_committed = decisions.keys().filter(|id| statuses.get(*id) == Some(&"COMMITTED")).count();
    println!(
        "bank holds: held_transfers={held_transfers} prepared={prepared} committed={held_committed} expired={expired} \
         ends={held_ends:?} decision_answers={decision_answers:?}"
    );
    // The held requests aborted while their POST was in flight: when the abort was sent, how many of them
    // the coordinator retried (the abort then sent to an earlier attempt), whom the abort's answer names.
    let mut in_flight_paths: BTreeMap<String, u32> = BTreeMap::new();
    let mut in_flight_answers: BTreeMap<String, u32> = BTreeMap::new();
    let (mut retried_in_flight, mut followed) = (0, 0);
    for (request, abort) in &aborted_in_flight {
        *in_flight_paths.entry(abort.path.clone()).or_default() += 1;
        let said = abort.answer["status"].as_str().or(abort.answer["error"]["code"].as_str()).unwrap_or_default();
        *in_flight_answers.entry(format!("{} {said}", abort.status)).or_default() += 1;
        retried_in_flight += usize::from(attempts_of(&records, request) > 1);
        followed += usize::from(abort.id != *request);
    }
    let mut again_answers: BTreeMap<String, u32> = BTreeMap::new();
    for again in outcomes.iter().filter(|o| o.route == Route::Abort && o.path.ends_with(":again")) {
        let said = again.answer["status"].as_str().or(again.answer["error"]["code"].as_str()).unwrap_or_default();
        *again_answers.entry(format!("{} {said}", again.status)).or_default() += 1;
    }
    let in_flight_posts: BTreeMap<String, u32> = outcomes
        .iter()
        .filter(|o| o.route == Route::Post && aborted_in_flight.contains_key(request_id(&o.id)))
        .fold(BTreeMap::new(), |mut posts, o| {
            *posts.entry(format!("{} {}", o.status, o.answer["status"].as_str().unwrap_or("-"))).or_default() += 1;
            posts
        });
    println!(
        "bank aborts in flight: requests={} retried={retried_in_flight} abort_named_a_later_attempt={followed} \
         paths={in_flight_paths:?} abort_answers={in_flight_answers:?} post_answers={in_flight_posts:?} \
         aborts_to_the_attempt_the_post_named={again_answers:?}",
        aborted_in_flight.len()
    );
    // The age tokens: the refusals that carried one, the retries sent with one (a request of their own), what
    // they answered, and the claims recorded.
    let with_token = outcomes.iter().filter(|o| o.route == Route::Post && o.answer["ageToken"].is_string()).count();
    let token_calls: Vec<&Outcome> = outcomes.iter().filter(|o| o.token.is_some()).collect();
    let token_keyed = token_calls.iter().filter(|o| o.replay.is_empty() && o.keyed).count();
    let token_unkeyed = token_calls.iter().filter(|o| o.replay.is_empty() && !o.keyed).count();
    let mut token_answers: BTreeMap<String, u32> = BTreeMap::new();
    for outcome in &token_calls {
        let said = outcome.answer["status"].as_str().or(outcome.answer["error"]["code"].as_str()).unwrap_or_default();
        *token_answers.entry(format!("{} {said}", outcome.status)).or_default() += 1;
    }
    let claims: Vec<&str> =
        records.iter().filter_map(|r| r["ageOf"].as_str().and(r["transactionId"].as_str())).collect();
    let claims_committed = claims
        .iter()
        .filter(|claim| {
            records
                .iter()
                .any(|r| r["status"] == "COMMITTED" && r["transactionId"].as_str().map(request_id) == Some(**claim))
        })
        .count();
    let retried_attempts = records.iter().filter(|r| r["retriedAs"].is_string()).count();
    println!(
        "bank tokens: retried_attempts={retried_attempts} refusals_with_token={with_token} retries={} (keyed {token_keyed}, unkeyed {token_unkeyed}) sent_again={} \
         key_replayed_after={} answers={token_answers:?} claims={} claims_committed={claims_committed}",
        token_keyed + token_unkeyed,
        token_calls.iter().filter(|o| o.replay == "token again").count(),
        outcomes.iter().filter(|o| o.replay == "after its token's retry").count(),
        claims.len()
    );
    let mut by_kind: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
    for (kind, message) in &violations {
        by_kind.entry(kind).or_default().push(message);
    }
    let summary: Vec<String> = by_kind
        .iter()
        .map(|(kind, messages)| {
            let shown: Vec<String> = messages.iter().take(4).map(|m| format!("    {}", truncate(m, 700))).collect();
            format!("{kind}: {}\n{}", messages.len(), shown.join("\n"))
        })
        .collect();
    // The requests the violations shown name, traced: their records and every call about them.
    let mut traced: Vec<&str> = vec![];
    for message in by_kind.values().flat_map(|messages| messages.iter().take(4)) {
        for (at, _) in message.match_indices("tx-") {
            let id = &message[at..message.len().min(at + 35)];
            if id.len() == 35 && id[3..].bytes().all(|b| b.is_ascii_hexdigit()) && !traced.contains(&id) {
                traced.push(id);
            }
        }
    }
    let traces: Vec<String> = traced.iter().take(6).map(|id| trace(id, &records, &outcomes)).collect();
    assert!(
        violations.is_empty(),
        "seed {seed}: {} violations\n{}\ntraces:\n{}",
        violations.len(),
        summary.join("\n"),
        traces.join("\n")
    );
    let transfers_run: HashSet<usize> = outcomes.iter().map(|o| o.transfer).collect();
    // Each attempt of a transfer refused for contention and retried (issue 35) has a record of its own,
    // `<first id>-<n>`: one first attempt per transfer at most, and attempts within the bound.
    let mut attempts: HashMap<&str, usize> = HashMap::new();
    for record in &records {
        let id = record["transactionId"].as_str().expect("a record's id");
        *attempts.entry(request_id(id)).or_default() += 1;
    }
    assert!(attempts.len() <= transfers_run.len(), "a first attempt for every transfer at most");
    let most = attempts.values().copied().max().unwrap_or(0);
    assert!(most <= twopc::coordinator::MAX_ATTEMPTS as usize, "attempts of one transfer: {most}");
    assert!(committed > 0 && aborted > 0, "the run exercised both outcomes");
}

/// The trace of the request first tried as `first` (`tx-` and 32 hex digits): the records of its attempts and
/// of the token retries that took its age, and every call of its transfers (its decisions, its token
/// retries), in the order they were sent.
fn trace(first: &str, records: &[Value], outcomes: &[Outcome]) -> String {
    let ours = |id: &str| id.starts_with(first);
    let mut lines = vec![format!("  {first}:")];
    for record in records
        .iter()
        .filter(|r| r["transactionId"].as_str().is_some_and(ours) || r["ageOf"].as_str().is_some_and(ours))
    {
        let fields = [
            "transactionId",
            "status",
            "reason",
            "attempt",
            "firstTransactionId",
            "retriedAs",
            "refusedForContention",
            "ageOf",
            "ageClaimedBy",
            "holdMs",
            "holdUntil",
            "startedAt",
            "createdAt",
            "updatedAt",
            "deadline",
        ];
        let shown: serde_json::Map<String, Value> =
            fields.iter().filter(|f| !record[**f].is_null()).map(|f| (f.to_string(), record[*f].clone())).collect();
        lines.push(format!("    record {}", Value::Object(shown)));
    }
    let transfers: HashSet<usize> =
        outcomes.iter().filter(|o| ours(&o.id)).map(|o| o.transfer % 1_000_000_000).collect();
    let mut calls: Vec<&Outcome> =
        outcomes.iter().filter(|o| ours(&o.id) || transfers.contains(&(o.transfer % 1_000_000_000))).collect();
    calls.sort_by_key(|o| o.sent_at);
    for o in calls {
        lines.push(format!(
            "    call {}..{} transfer {} {}{}{} plan {}{}{} -> {} {} (id {})",
            o.sent_at,
            o.answered_at,
            o.transfer,
            o.route.as_str(),
            if o.replay.is_empty() { String::new() } else { format!(" replay {}", o.replay) },
            if o.path.is_empty() { String::new() } else { format!(" path {}", o.path) },
            o.plan.kind(),
            o.key.as_ref().map_or(String::new(), |k| format!(" key {k}")),
            o.token.as_ref().map_or(String::new(), |t| format!(" token of {}", t.refused)),
            o.status,
            truncate(&o.answer.to_string(), 400),
            o.id
        ));
    }
    lines.join("\n")
}

/// How many attempts of `request` are recorded.
fn attempts_of(records: &[Value], request: &str) -> usize {
    records.iter().filter(|r| r["transactionId"].as_str().map(request_id) == Some(request)).count()
}

/// What a record's transaction writes, in short (a `set` by its field count and largest value).
fn summary_of(record: &Value) -> String {
    let parts: Vec<String> = record["participants"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let ops: Vec<String> = p["operations"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|op| match op["op"].as_str() {
                            Some("set") => {
                                let set = op["set"].as_object().unwrap();
                                let largest = set.values().map(|v| v.to_string().len()).max().unwrap_or(0);
                                format!("set {} ({} fields, largest {largest} bytes)", op["key"]["entityId"], set.len())
                            }
                            _ => format!("{} {} {}", op["op"], op["key"]["entityId"], op["delta"]),
                        })
                        .collect();
                    format!("{} [{}] vote {}", p["service"], ops.join(", "), p["vote"])
                })
                .collect()
        })
        .unwrap_or_default();
    format!("{}; reason {}", parts.join("; "), record["reason"])
}

fn truncate(text: &str, at: usize) -> String {
    match text.char_indices().nth(at) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// The id of an attempt's request (its first attempt): a later attempt of the coordinator's is `<first
/// id>-<n>` (issue 35); a token's retry without a key, `<refused request's first id>-r<n>`, is a request of
/// its own (issue 41), and its attempts `<its id>-<n>`. A first id is `tx-` and 32 hex digits.
fn request_id(id: &str) -> &str {
    match id.rsplit_once('-') {
        Some((request, n)) if request != "tx" && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => request,
        _ => id,
    }
}
