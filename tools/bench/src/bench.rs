//! The benchmark's world: one DynamoDB client (with the request counter), the transactions table,
//! eight participant services on their own tables, in-process participants, the coordinator (and
//! its sequential-prepare twin), and the `TransactWriteItems` baseline.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use aws_smithy_types::error::display::DisplayErrorContext;
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use serde_json::{Value, json};
use twopc::coordinator::{Coordinator, Reply};
use twopc::invoke::{InProcessInvoker, InvokeError, ParticipantInvoker};
use twopc::model::{ParticipantRequest, ParticipantResponse};
use twopc::participant::DataTable;
use twopc::participant::Participant;
use twopc::record::TransactionStore;
use twopc_client as client;

use crate::counter::RequestCounter;
use crate::projection::{ModelledHttpClient, Sampler};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Participant services `service-1` … `service-8`, each with its table.
pub const SERVICES: usize = 8;
pub const TRANSACTIONS_TABLE: &str = "transactions";
/// Every account starts with this balance: no `min: 0` guard is ever hit by accident.
pub const START_BALANCE: i64 = 1_000_000_000;

pub fn service(k: usize) -> String {
    format!("service-{k}")
}

pub fn table(k: usize) -> String {
    format!("service-{k}-data")
}

/// An account: (service number, entityId).
pub type Account = (usize, String);

/// How one transfer ended, as the client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 200 / TransactWriteItems succeeded.
    Committed,
    /// 409 (with the first refusal code), or TransactionCanceled (with its reason codes).
    Refused(String),
    /// 202: decided commit, not finished yet (left for the sweeper).
    Pending,
    /// Anything else: an error of the system or of the benchmark.
    Failed(String),
}

/// The request header that carries a refused request's age token on its retry (issue 35):
/// `twopc::age::AGE_TOKEN_HEADER`, stated here so the bench builds against a coordinator from before
/// (compare.sh).
pub const AGE_TOKEN_HEADER: &str = "Age-Token";

/// The request header of a keyed request: the coordinator records the request under it before the
/// prepares, as the typed client sends every request (a fresh key per retry with an age token).
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// A coordinator's answer as a client reads it: the outcome, and what issue 35's coordinator adds to
/// it. An answer without those fields (a coordinator from before) reads as one attempt and no token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub outcome: Outcome,
    /// `attempts`: the number of the attempt that answered, counting the attempts of earlier requests
    /// of the same transfer whose age token was sent back; 1 when the answer does not say.
    pub attempts: u32,
    /// Whether the answer carried `attempts`.
    pub reports_attempts: bool,
    /// `transactionId`: the last attempt's.
    pub transaction_id: Option<String>,
    /// `ageToken` of a final 409 refused for contention: sent back in [`AGE_TOKEN_HEADER`] by a retry
    /// that keeps the transfer's age. None: retry without one.
    pub age_token: Option<String>,
}

impl Answer {
    pub fn from_reply(status: u16, body: &Value) -> Answer {
        let reported = body.get("attempts").and_then(Value::as_u64).filter(|n| *n >= 1);
        Answer {
            outcome: outcome_of(status, body),
            attempts: reported.map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            reports_attempts: reported.is_some(),
            transaction_id: body.get("transactionId").and_then(Value::as_str).map(str::to_owned),
            age_token: body.get("ageToken").and_then(Value::as_str).filter(|t| !t.is_empty()).map(str::to_owned),
        }
    }
}

/// The outcome a client reads from an answer's status.
fn outcome_of(status: u16, body: &Value) -> Outcome {
    match status {
        200 => Outcome::Committed,
        202 => Outcome::Pending,
        409 => Outcome::Refused(refusal_code(body)),
        status => Outcome::Failed(format!("HTTP {status}: {body}")),
    }
}

pub struct Bench {
    pub client: Client,
    pub counter: RequestCounter,
    pub coordinator: Coordinator,
    pub sequential: Coordinator,
    /// The same, with every participant call delayed as a Lambda Invoke would be.
    pub delayed: Coordinator,
    pub delayed_sequential: Coordinator,
    /// Issue 48: `coordinator` applying `Prefer: respond-async`, its second phases left in `after_answer`
    /// until [`Bench::finish_after_answers`], as the deployed function's extension runs them after the
    /// answer, before the instance takes its next request.
    pub on_decision: Coordinator,
    pub after_answer: Arc<twopc::after_answer::Deferred>,
}

/// Calls in-process participants after a delay: the round trip of a warm Lambda Invoke, which
/// in-process calls do not have (the participant's own DynamoDB requests are modelled, if at all, by
/// the HTTP client).
pub struct DelayedInvoker {
    inner: InProcessInvoker,
    delay: InvokeDelay,
}

/// How long an Invoke's round trip takes: always the same, or drawn from a model (scenario 7).
enum InvokeDelay {
    Fixed(Duration),
    Drawn(Arc<Sampler>),
}

impl ParticipantInvoker for DelayedInvoker {
    fn invoke<'a>(
        &'a self,
        service: &'a str,
        request: &'a ParticipantRequest,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>> {
        Box::pin(async move {
            let delay = match &self.delay {
                InvokeDelay::Fixed(delay) => *delay,
                InvokeDelay::Drawn(sampler) => sampler.invoke_latency(),
            };
            tokio::time::sleep(delay).await;
            self.inner.invoke(service, request).await
        })
    }
}

impl Bench {
    pub async fn new(endpoint: &str, invoke_delay: Duration) -> Result<Bench, BoxError> {
        Bench::build(endpoint, invoke_delay, None).await
    }

    /// Scenario 7's world: every DynamoDB request and participant Invoke of `coordinator` takes a
    /// latency drawn by `sampler`.
    pub async fn projected(endpoint: &str, sampler: Arc<Sampler>) -> Result<Bench, BoxError> {
        Bench::build(endpoint, Duration::ZERO, Some(sampler)).await
    }

    async fn build(endpoint: &str, invoke_delay: Duration, sampler: Option<Arc<Sampler>>) -> Result<Bench, BoxError> {
        let counter = RequestCounter::default();
        let mut config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("local", "local", None, None, "bench"))
            .endpoint_url(endpoint)
            .interceptor(counter.clone());
        if let Some(sampler) = &sampler {
            config = config.http_client(ModelledHttpClient::new(Arc::clone(sampler)));
        }
        let config = config.build();
        let client = Client::from_conf(config);
        let mut specs = vec![twopc::tables::transactions_table(TRANSACTIONS_TABLE)];
        specs.extend((1..=SERVICES).map(|k| twopc::tables::participant_table(&table(k))));
        for spec in &specs {
            spec.create_if_missing(&client).await?;
        }
        let transactions = TransactionStore::new(client.clone(), TRANSACTIONS_TABLE);
        let participants: Vec<Participant> = (1..=SERVICES)
            .map(|k| {
                Participant::new(
                    service(k),
                    DataTable::new(client.clone(), table(k)),
                    transactions.clone(),
                    twopc::clock::system(),
                )
            })
            .collect();
        let invoker = InProcessInvoker::new(participants);
        let delayed_invoker = DelayedInvoker { inner: invoker.clone(), delay: InvokeDelay::Fixed(invoke_delay) };
        let direct: Arc<dyn ParticipantInvoker> = match sampler {
            Some(sampler) => Arc::new(DelayedInvoker { inner: invoker, delay: InvokeDelay::Drawn(sampler) }),
            None => Arc::new(invoker),
        };
        let coordinator =
            Coordinator::new(transactions.clone(), direct, (1..=SERVICES).map(service), twopc::clock::system());
        let sequential = coordinator.with_sequential_prepares();
        let delayed = Coordinator::new(
            transactions,
            Arc::new(delayed_invoker),
            (1..=SERVICES).map(service),
            twopc::clock::system(),
        );
        let delayed_sequential = delayed.with_sequential_prepares();
        let after_answer = Arc::new(twopc::after_answer::Deferred::default());
        let on_decision = coordinator.clone().with_after_answer(after_answer.clone());
        Ok(Bench { client, counter, coordinator, sequential, delayed, delayed_sequential, on_decision, after_answer })
    }

    /// Writes accounts as committed data (version 0, balance [`START_BALANCE`]), 16 at a time.
    pub async fn seed(&self, accounts: &[Account]) -> Result<(), BoxError> {
        futures::stream::iter(accounts.iter().map(|(k, id)| {
            let item = HashMap::from([
                ("entityId".to_owned(), AttributeValue::S(id.clone())),
                (
                    "data".to_owned(),
                    AttributeValue::M(HashMap::from([(
                        "balance".to_owned(),
                        AttributeValue::N(START_BALANCE.to_string()),
                    )])),
                ),
                ("version".to_owned(), AttributeValue::N("0".to_owned())),
            ]);
            self.client.put_item().table_name(table(*k)).set_item(Some(item)).send()
        }))
        .buffer_unordered(16)
        .map_err(|e| -> BoxError { DisplayErrorContext(&e).to_string().into() })
        .try_for_each(|_| async { Ok(()) })
        .await
    }

    /// Writes documents as committed data (version 0, `data.note` a string of `bytes` characters).
    pub async fn seed_documents(&self, documents: &[Account], bytes: usize) -> Result<(), BoxError> {
        for (k, id) in documents {
            let item = HashMap::from([
                ("entityId".to_owned(), AttributeValue::S(id.clone())),
                (
                    "data".to_owned(),
                    AttributeValue::M(HashMap::from([("note".to_owned(), AttributeValue::S("a".repeat(bytes)))])),
                ),
                ("version".to_owned(), AttributeValue::N("0".to_owned())),
            ]);
            self.client
                .put_item()
                .table_name(table(*k))
                .set_item(Some(item))
                .send()
                .await
                .map_err(|e| DisplayErrorContext(&e).to_string())?;
        }
        Ok(())
    }

    /// An account's item, read consistently.
    async fn item(&self, (k, id): &Account) -> Result<Option<HashMap<String, AttributeValue>>, BoxError> {
        let out = self
            .client
            .get_item()
            .table_name(table(*k))
            .key("entityId", AttributeValue::S(id.clone()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| DisplayErrorContext(&e).to_string())?;
        Ok(out.item)
    }

    /// An account's balance, read consistently.
    pub async fn balance(&self, account: &Account) -> Result<i128, BoxError> {
        let item = self.item(account).await?;
        let balance = item
            .as_ref()
            .and_then(|i| i.get("data"))
            .and_then(|d| d.as_m().ok())
            .and_then(|d| d.get("balance"))
            .and_then(|b| b.as_n().ok())
            .ok_or_else(|| format!("{}/{} has no balance", table(account.0), account.1))?;
        Ok(balance.parse()?)
    }

    /// Sends a request body with `Prefer: respond-async` through [`Bench::on_decision`]: a commit answers
    /// [`Outcome::Pending`] (202 COMMITTING) on its decision.
    pub async fn submit_on_decision(&self, body: &[u8]) -> Outcome {
        let caller = self.on_decision.access().iam(None);
        let reply = self.on_decision.submit_preferring(body, None, None, &caller, true).await;
        outcome_of(reply.status, &reply.body)
    }

    /// Runs the second phases left after answers on the decision, to their end.
    pub async fn finish_after_answers(&self) {
        self.after_answer.run().await;
    }

    /// Sends a request body through the coordinator (participants in-process).
    pub async fn submit(&self, coordinator: &Coordinator, body: &[u8]) -> Outcome {
        self.submit_keyed(coordinator, body, None).await
    }

    pub async fn submit_keyed(&self, coordinator: &Coordinator, body: &[u8], idempotency_key: Option<&str>) -> Outcome {
        let reply = coordinator.submit(body, idempotency_key).await;
        outcome_of(reply.status, &reply.body)
    }

    /// Sends a request body with request headers and reads the whole answer ([`Answer`]). Without
    /// headers it is [`Bench::submit`]'s call; with some, the request goes through the coordinator
    /// function's handler (`coordinator::handle`, what API Gateway's proxy integration calls), which
    /// reads the headers as a deployed coordinator does, without a principal like `submit`.
    pub async fn submit_with_headers(
        &self,
        coordinator: &Coordinator,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> Answer {
        let reply = match headers {
            [] => coordinator.submit(body, None).await,
            headers => through_function(coordinator, body, headers).await,
        };
        Answer::from_reply(reply.status, &reply.body)
    }

    /// The baseline: the same two conditional updates in one `TransactWriteItems`.
    pub async fn transact_transfer(&self, from: &Account, to: &Account, amount: i64) -> Outcome {
        let debit = balance_update(&table(from.0), &from.1, -amount, Some(0));
        let credit = balance_update(&table(to.0), &to.1, amount, None);
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(debit).build())
            .transact_items(TransactWriteItem::builder().update(credit).build())
            .send()
            .await;
        match result {
            Ok(_) => Outcome::Committed,
            Err(err) => match err.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(c)) => {
                    Outcome::Refused(cancellation_codes(c.cancellation_reasons().iter().map(|r| r.code())))
                }
                _ => Outcome::Failed(DisplayErrorContext(&err).to_string()),
            },
        }
    }

    /// N conditional `SET data.balance = data.balance + 1` at once, on `id` in tables 1..=N.
    pub async fn parallel_updates(&self, n: usize, id: &str) -> Outcome {
        let updates = (1..=n).map(|k| {
            let u = balance_update(&table(k), id, 1, None);
            self.client
                .update_item()
                .table_name(u.table_name())
                .set_key(Some(u.key().clone()))
                .update_expression(u.update_expression())
                .set_condition_expression(u.condition_expression().map(str::to_owned))
                .set_expression_attribute_names(u.expression_attribute_names().cloned())
                .set_expression_attribute_values(u.expression_attribute_values().cloned())
                .send()
        });
        match futures::future::try_join_all(updates).await {
            Ok(_) => Outcome::Committed,
            Err(err) => Outcome::Failed(DisplayErrorContext(&err).to_string()),
        }
    }

    /// Every item of every participant table that still carries a lock, as `table/entityId`.
    pub async fn locked_items(&self) -> Result<Vec<String>, BoxError> {
        let mut locked = Vec::new();
        for k in 1..=SERVICES {
            let mut items =
                self.client.scan().table_name(table(k)).consistent_read(true).into_paginator().items().send();
            while let Some(item) = items.next().await {
                let item = item.map_err(|e| DisplayErrorContext(&e).to_string())?;
                if item.contains_key("lock") || item.contains_key("lockShard") {
                    let id = item.get("entityId").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
                    locked.push(format!("{}/{id}", table(k)));
                }
            }
        }
        Ok(locked)
    }

    /// The pending credits (`credit#<transaction>` entries, `pendingCredits`) left on the given items, as
    /// `table/entityId (n)`: an item without either has none.
    pub async fn pending_credits(&self, accounts: &[Account]) -> Result<Vec<String>, BoxError> {
        let mut pending = Vec::new();
        for account in accounts {
            let (k, id) = account;
            let entries = self.item(account).await?.as_ref().map_or(0, pending_credits_of);
            if entries > 0 {
                pending.push(format!("{}/{id} ({entries})", table(*k)));
            }
        }
        Ok(pending)
    }

    /// Transaction records by status.
    pub async fn records_by_status(&self) -> Result<BTreeMap<String, u64>, BoxError> {
        let mut counts = BTreeMap::new();
        let mut items = self
            .client
            .scan()
            .table_name(TRANSACTIONS_TABLE)
            .projection_expression("#s")
            .expression_attribute_names("#s", "status")
            .into_paginator()
            .items()
            .send();
        while let Some(item) = items.next().await {
            let item = item.map_err(|e| DisplayErrorContext(&e).to_string())?;
            let status = item.get("status").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
            *counts.entry(status).or_default() += 1;
        }
        Ok(counts)
    }
}

/// `POST /transactions` with `headers` through the coordinator function's handler, as a plain HTTP
/// request (no API Gateway context: a caller without a principal).
async fn through_function(coordinator: &Coordinator, body: &[u8], headers: &[(&str, &str)]) -> Reply {
    let mut request = lambda_http::http::Request::builder()
        .method("POST")
        .uri("/transactions")
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = match request.body(lambda_http::Body::Text(String::from_utf8_lossy(body).into_owned())) {
        Ok(request) => request,
        Err(e) => {
            let body = json!({"error": format!("the bench could not build the request: {e}")});
            return Reply { status: 0, body, answered_on_decision: false };
        }
    };
    let response = coordinator::handle(coordinator, request).await;
    let status = response.status().as_u16();
    let body = serde_json::from_slice(response.body())
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(response.body()).into_owned()));
    Reply { status, body, answered_on_decision: false }
}

/// The credits pending on an item (issue 48, item 3): its `credit#<transaction>` entries, or what its
/// `pendingCredits` counts if that says more (the two must agree once everything ended: both are 0).
fn pending_credits_of(item: &HashMap<String, AttributeValue>) -> usize {
    let entries = twopc::participant::credits::Credit::all(item).len();
    entries.max(twopc::participant::credits::pending(item) as usize)
}

/// A `TransactionCanceledException`'s reason codes, `None` left out: "TransactionConflict",
/// "ConditionalCheckFailed,TransactionConflict".
fn cancellation_codes<'a>(codes: impl IntoIterator<Item = Option<&'a str>>) -> String {
    codes.into_iter().flatten().filter(|c| *c != "None").collect::<Vec<_>>().join(",")
}

/// A `TransactWriteItems` cancelled because another transaction held an item (a `TransactionConflict`
/// reason): the refusal a contended `TransactWriteItems` client retries.
pub fn is_transaction_conflict(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Refused(codes) if names_transaction_conflict(codes))
}

/// Whether a refusal's codes ([`cancellation_codes`]) name a `TransactionConflict`.
pub fn names_transaction_conflict(codes: &str) -> bool {
    codes.split(',').any(|c| c == "TransactionConflict")
}

/// `SET data.balance = data.balance + :d` if the item exists and, with a minimum, the result stays at
/// or above it: the condition the 2PC's `add` checks at prepare.
fn balance_update(table: &str, id: &str, delta: i64, min: Option<i64>) -> Update {
    let mut condition = "attribute_exists(#d)".to_owned();
    let mut update = Update::builder()
        .table_name(table)
        .key("entityId", AttributeValue::S(id.to_owned()))
        .update_expression("SET #d.#b = #d.#b + :delta")
        .expression_attribute_names("#d", "data")
        .expression_attribute_names("#b", "balance")
        .expression_attribute_values(":delta", AttributeValue::N(delta.to_string()));
    if let Some(min) = min {
        condition += " AND #d.#b >= :lowest";
        update = update.expression_attribute_values(":lowest", AttributeValue::N((min - delta).to_string()));
    }
    update.condition_expression(condition).build().expect("table, key and expression are set")
}

/// The first refusal code in a 409 body (`CONFLICT`, `CONDITION_FAILED`, ...), else the code of a 409
/// error answer (`{"error": {"code"}}`), else `ABORTED`.
fn refusal_code(body: &Value) -> String {
    serde_json::from_value::<client::TransactionState>(body.clone())
        .ok()
        .and_then(|state| state.participants.into_iter().find_map(|p| p.code))
        .map(|code| code.as_str().to_owned())
        .or_else(|| body.pointer("/error/code").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| "ABORTED".to_owned())
}

/// `add` on an account's balance.
pub fn add(id: &str, delta: i64, min: Option<i64>) -> client::Operation {
    let add = client::op::add(id, "balance", delta);
    match min {
        Some(min) => add.min(min).into(),
        None => add.into(),
    }
}

/// `set` of `data.note` to a string of `bytes` characters.
pub fn set_note(id: &str, bytes: usize) -> client::Operation {
    client::op::set(id).field("note", "b".repeat(bytes)).into()
}

/// `check` that the item exists.
pub fn check_exists(id: &str) -> client::Operation {
    client::op::check(id).exists(true).into()
}

pub fn participant(k: usize, operations: Vec<client::Operation>) -> client::Participant {
    client::Participant { service: service(k), operations }
}

pub fn body(participants: Vec<client::Participant>) -> Vec<u8> {
    client::Transaction { participants, timeout_ms: None, hold_ms: None }.body_bytes()
}

/// Moves `amount` from one account to another (two participants), guarded by `min: 0`.
pub fn transfer_body(from: &Account, to: &Account, amount: i64) -> Vec<u8> {
    body(vec![
        participant(from.0, vec![add(&from.1, -amount, Some(0))]),
        participant(to.0, vec![add(&to.1, amount, None)]),
    ])
}

/// N participants (services 1..=N), one `add` each on `id`: the first pays N-1 (1 when alone, guarded
/// by `min: 0`), every other receives 1.
pub fn fan_body(n: usize, id: &str) -> Vec<u8> {
    let debit = (n as i64 - 1).max(1);
    let mut participants = vec![participant(1, vec![add(id, -debit, Some(0))])];
    participants.extend((2..=n).map(|k| participant(k, vec![add(id, 1, None)])));
    body(participants)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(extra: Value) -> Value {
        let mut body = json!({
            "transactionId": "tx-0123456789abcdef0123456789abcdef-3",
            "status": "ABORTED",
            "participants": [
                {"service": "service-1", "vote": "PREPARED"},
                {"service": "service-2", "vote": "REFUSED", "code": "CONFLICT", "reason": "locked"},
            ],
            "createdAt": 1,
            "updatedAt": 2,
        });
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            body[k] = v;
        }
        body
    }

    #[test]
    fn an_answer_without_the_new_fields_is_one_attempt_and_no_token() {
        let answer = Answer::from_reply(409, &refused(json!({})));
        assert_eq!(answer.outcome, Outcome::Refused("CONFLICT".to_owned()));
        assert_eq!((answer.attempts, answer.reports_attempts), (1, false));
        assert_eq!(answer.age_token, None);
        assert_eq!(answer.transaction_id.as_deref(), Some("tx-0123456789abcdef0123456789abcdef-3"));
        let committed = Answer::from_reply(200, &json!({"transactionId": "tx-1", "status": "COMMITTED"}));
        assert_eq!((committed.outcome, committed.attempts, committed.reports_attempts), (Outcome::Committed, 1, false));
    }

    #[test]
    fn reads_attempts_and_the_age_token() {
        let answer = Answer::from_reply(409, &refused(json!({"attempts": 3, "ageToken": "v1.abc.def"})));
        assert_eq!((answer.attempts, answer.reports_attempts), (3, true));
        assert_eq!(answer.age_token.as_deref(), Some("v1.abc.def"));
        let committed =
            Answer::from_reply(200, &json!({"transactionId": "tx-1-4", "status": "COMMITTED", "attempts": 4}));
        assert_eq!((committed.outcome, committed.attempts), (Outcome::Committed, 4));
        // Nonsense reads as absent: an empty token, an attempt number that is not a positive integer.
        let odd = Answer::from_reply(409, &refused(json!({"attempts": 0, "ageToken": ""})));
        assert_eq!((odd.attempts, odd.reports_attempts, odd.age_token), (1, false, None));
        let odd = Answer::from_reply(409, &refused(json!({"attempts": "2"})));
        assert_eq!((odd.attempts, odd.reports_attempts), (1, false));
    }

    #[test]
    fn outcomes_by_status() {
        assert_eq!(Answer::from_reply(202, &json!({"status": "COMMITTING"})).outcome, Outcome::Pending);
        let error = json!({"error": {"code": "AGE_TOKEN_USED", "message": "used"}});
        assert_eq!(Answer::from_reply(409, &error).outcome, Outcome::Refused("AGE_TOKEN_USED".to_owned()));
        assert_eq!(Answer::from_reply(409, &json!({})).outcome, Outcome::Refused("ABORTED".to_owned()));
        let invalid = json!({"error": {"code": "INVALID_AGE_TOKEN", "message": "bad"}});
        assert!(
            matches!(Answer::from_reply(400, &invalid).outcome, Outcome::Failed(m) if m.contains("INVALID_AGE_TOKEN"))
        );
    }

    /// Headers reach the coordinator function's handler; without them the core is called as before.
    #[tokio::test]
    async fn a_request_with_headers_goes_through_the_coordinator_function() {
        let b = Bench::new(dynamodb_local::shared().endpoint(), Duration::ZERO).await.expect("tables");
        let (from, to) = ((1, "headers-a".to_owned()), (2, "headers-b".to_owned()));
        b.seed(&[from.clone(), to.clone()]).await.expect("seeded");
        let request = transfer_body(&from, &to, 1);
        let plain = b.submit_with_headers(&b.coordinator, &request, &[]).await;
        assert_eq!(plain.outcome, Outcome::Committed);
        let routed = b.submit_with_headers(&b.coordinator, &request, &[("X-Bench", "1")]).await;
        assert_eq!(routed.outcome, Outcome::Committed);
        assert!(routed.transaction_id.is_some_and(|id| id.starts_with("tx-")));
        assert_eq!(b.balance(&to).await.expect("read"), i128::from(START_BALANCE) + 2);
        // A header the handler reads and refuses (a key over 255 characters): 400, nothing applied.
        let long_key = "k".repeat(256);
        let refused = b.submit_with_headers(&b.coordinator, &request, &[("Idempotency-Key", &long_key)]).await;
        assert!(matches!(&refused.outcome, Outcome::Failed(m) if m.contains("INVALID_IDEMPOTENCY_KEY")), "{refused:?}");
        assert_eq!(b.balance(&to).await.expect("read"), i128::from(START_BALANCE) + 2);
    }

    #[test]
    fn pending_credits_are_counted_from_the_entries_and_the_count() {
        let entry = AttributeValue::M(HashMap::from([
            ("token".to_owned(), AttributeValue::S("credit-1".to_owned())),
            ("field".to_owned(), AttributeValue::S("balance".to_owned())),
            ("delta".to_owned(), AttributeValue::N("1".to_owned())),
        ]));
        let none = HashMap::from([("pendingCredits".to_owned(), AttributeValue::N("0".to_owned()))]);
        assert_eq!(pending_credits_of(&none), 0);
        let one = HashMap::from([
            ("credit#tx-1".to_owned(), entry),
            ("pendingCredits".to_owned(), AttributeValue::N("1".to_owned())),
        ]);
        assert_eq!(pending_credits_of(&one), 1);
        let counted = HashMap::from([("pendingCredits".to_owned(), AttributeValue::N("2".to_owned()))]);
        assert_eq!(pending_credits_of(&counted), 2);
    }

    #[test]
    fn transaction_conflicts_are_told_from_other_cancellations() {
        let codes = cancellation_codes([Some("None"), Some("TransactionConflict")]);
        assert_eq!(codes, "TransactionConflict");
        assert!(is_transaction_conflict(&Outcome::Refused(codes)));
        let both = cancellation_codes([Some("ConditionalCheckFailed"), Some("TransactionConflict")]);
        assert!(is_transaction_conflict(&Outcome::Refused(both)));
        let guard = cancellation_codes([Some("ConditionalCheckFailed"), None, Some("None")]);
        assert_eq!(guard, "ConditionalCheckFailed");
        assert!(!is_transaction_conflict(&Outcome::Refused(guard)));
        assert!(!is_transaction_conflict(&Outcome::Refused("TransactionConflictX".to_owned())));
        assert!(!is_transaction_conflict(&Outcome::Committed));
        assert!(!is_transaction_conflict(&Outcome::Failed("TransactionConflict".to_owned())));
    }
}
