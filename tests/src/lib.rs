//! Test support: one DynamoDB Local per test binary, fresh tables per test, participants in-process
//! behind an invoker that can inject the faults a network and a crash produce, and API Gateway
//! events built the way API Gateway sends them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use twopc::clock::{SharedClock, ShiftedClock};
use twopc::coordinator::Coordinator;
use twopc::invoke::{InProcessInvoker, InvokeError, ParticipantInvoker};
use twopc::items::DataTable;
use twopc::model::{Action, ParticipantRequest, ParticipantResponse};
use twopc::participant::Participant;
use twopc::record::TransactionStore;
use twopc::tables;

/// A DynamoDB client for the test binary's DynamoDB Local.
pub async fn dynamodb() -> Client {
    let endpoint = dynamodb_local::shared().endpoint().to_owned();
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new("local", "local", None, None, "tests"))
        .endpoint_url(endpoint)
        .build();
    Client::from_conf(config)
}

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

/// A fault at the participant edge, as the coordinator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeFault {
    /// The participant does its work, and the answer is lost.
    LoseReply,
    /// The message is delivered twice; the second answer is returned.
    Duplicate,
    /// The participant answers only after this delay (past the deadline, when long enough).
    Delay(Duration),
    /// The participant fails before doing anything.
    Fail,
}

/// One participant call: which service, which message, when it started and when it ended.
#[derive(Debug, Clone)]
pub struct Call {
    pub service: String,
    pub action: Action,
    pub started: std::time::Instant,
    pub ended: std::time::Instant,
}

/// Calls in-process participants through faults set per (service, action).
#[derive(Clone)]
pub struct FaultyInvoker {
    inner: InProcessInvoker,
    faults: Arc<Mutex<HashMap<(String, Action), EdgeFault>>>,
    log: Arc<Mutex<Vec<Call>>>,
}

impl FaultyInvoker {
    pub fn new(inner: InProcessInvoker) -> FaultyInvoker {
        FaultyInvoker { inner, faults: Default::default(), log: Default::default() }
    }
    pub fn set(&self, service: &str, action: Action, fault: EdgeFault) {
        self.faults.lock().unwrap().insert((service.to_owned(), action), fault);
    }
    pub fn clear(&self) {
        self.faults.lock().unwrap().clear();
    }
    /// Every call made.
    pub fn calls(&self) -> Vec<Call> {
        self.log.lock().unwrap().clone()
    }
}

impl ParticipantInvoker for FaultyInvoker {
    fn invoke<'a>(
        &'a self,
        service: &'a str,
        request: &'a ParticipantRequest,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>> {
        Box::pin(async move {
            let started = std::time::Instant::now();
            let fault = self.faults.lock().unwrap().get(&(service.to_owned(), request.action)).copied();
            let result = match fault {
                None => self.inner.invoke(service, request).await,
                Some(EdgeFault::LoseReply) => {
                    let _ = self.inner.invoke(service, request).await;
                    Err(InvokeError::Transport { service: service.to_owned(), message: "reply lost (injected)".into() })
                }
                Some(EdgeFault::Duplicate) => {
                    let _ = self.inner.invoke(service, request).await;
                    self.inner.invoke(service, request).await
                }
                Some(EdgeFault::Delay(delay)) => {
                    let result = self.inner.invoke(service, request).await;
                    tokio::time::sleep(delay).await;
                    result
                }
                Some(EdgeFault::Fail) => Err(InvokeError::FunctionError {
                    service: service.to_owned(),
                    message: "participant failed (injected)".into(),
                }),
            };
            self.log.lock().unwrap().push(Call {
                service: service.to_owned(),
                action: request.action,
                started,
                ended: std::time::Instant::now(),
            });
            result
        })
    }
}

/// One test's world: its own tables, participants, a clock it can move, and a coordinator.
pub struct TestEnv {
    pub client: Client,
    pub transactions: TransactionStore,
    /// service → its participant (and table).
    pub participants: BTreeMap<String, Participant>,
    pub clock: Arc<ShiftedClock>,
    pub invoker: FaultyInvoker,
    pub coordinator: Coordinator,
}

impl TestEnv {
    /// Two services, `service-a` and `service-b`, as in the contract.
    pub async fn new() -> TestEnv {
        TestEnv::with_services(&["service-a", "service-b"]).await
    }

    pub async fn with_services(services: &[&str]) -> TestEnv {
        init_logs();
        let client = dynamodb().await;
        let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        let transactions_table = format!("{prefix}-transactions");
        let mut specs = vec![tables::transactions_table(&transactions_table)];
        specs.extend(services.iter().map(|s| tables::participant_table(&format!("{prefix}-{s}-data"))));
        futures::future::try_join_all(specs.iter().map(|spec| spec.create_if_missing(&client)))
            .await
            .expect("tables are created");
        let clock = ShiftedClock::new();
        let shared: SharedClock = clock.clone();
        let transactions = TransactionStore::new(client.clone(), &transactions_table);
        let participants: BTreeMap<String, Participant> = services
            .iter()
            .map(|s| {
                let table = DataTable::new(client.clone(), format!("{prefix}-{s}-data"));
                (s.to_string(), Participant::new(*s, table, transactions.clone(), shared.clone()))
            })
            .collect();
        let invoker = FaultyInvoker::new(InProcessInvoker::new(participants.values().cloned()));
        let coordinator = Coordinator::new(
            transactions.clone(),
            Arc::new(invoker.clone()),
            services.iter().map(|s| s.to_string()),
            shared,
        );
        TestEnv { client, transactions, participants, clock, invoker, coordinator }
    }

    /// A coordinator of its own, with its own edge faults and crash point: concurrent clients of a
    /// fault test each get one, so one client's faults never touch another's transactions.
    pub fn coordinator_with(&self, invoker: &FaultyInvoker, faults: twopc::faults::Faults) -> Coordinator {
        Coordinator::new(
            self.transactions.clone(),
            Arc::new(invoker.clone()),
            self.participants.keys().cloned(),
            self.clock.clone(),
        )
        .with_faults(faults)
    }

    /// A fault-free invoker over the same in-process participants.
    pub fn fresh_invoker(&self) -> FaultyInvoker {
        FaultyInvoker::new(InProcessInvoker::new(self.participants.values().cloned()))
    }

    /// A sweeper over this world's tables, on the given clock (the world's own by default).
    pub fn sweeper(&self, clock: Option<SharedClock>) -> twopc::sweeper::Sweeper {
        self.sweeper_with(clock, twopc::sweeper::SweepLimits::default())
    }

    pub fn sweeper_with(
        &self,
        clock: Option<SharedClock>,
        limits: twopc::sweeper::SweepLimits,
    ) -> twopc::sweeper::Sweeper {
        let clock = clock.unwrap_or_else(|| self.clock.clone());
        let coordinator = Coordinator::new(
            self.transactions.clone(),
            Arc::new(self.fresh_invoker()),
            self.participants.keys().cloned(),
            clock,
        );
        let tables = self.participants.iter().map(|(s, p)| (s.clone(), p.table().clone())).collect();
        twopc::sweeper::Sweeper::new(coordinator, tables, limits)
    }

    /// Sweeps until a run finds nothing to do (bounded), returning the runs' reports.
    pub async fn sweep_until_quiet(&self) -> Vec<twopc::sweeper::SweepReport> {
        let sweeper = self.sweeper(None);
        let mut reports = vec![];
        for _ in 0..20 {
            let report = sweeper.sweep().await.expect("sweep");
            let quiet = report.is_quiet();
            reports.push(report);
            if quiet {
                return reports;
            }
        }
        panic!("sweeps did not become quiet: {reports:#?}");
    }

    pub fn clock_now(&self) -> u64 {
        use twopc::clock::Clock;
        self.clock.now_ms()
    }

    pub fn table(&self, service: &str) -> &str {
        self.participants[service].table().name()
    }

    /// Writes an account as committed data (version 0, never touched by a transaction).
    pub async fn put_account(&self, service: &str, id: &str, balance: &str) {
        let item = HashMap::from([
            ("entityId".to_owned(), AttributeValue::S(id.to_owned())),
            (
                "data".to_owned(),
                AttributeValue::M(HashMap::from([("balance".to_owned(), AttributeValue::N(balance.to_owned()))])),
            ),
            ("version".to_owned(), AttributeValue::N("0".to_owned())),
        ]);
        self.client.put_item().table_name(self.table(service)).set_item(Some(item)).send().await.expect("put");
    }

    /// The item as JSON, or None.
    pub async fn item(&self, service: &str, id: &str) -> Option<Value> {
        let out = self
            .client
            .get_item()
            .table_name(self.table(service))
            .key("entityId", AttributeValue::S(id.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .expect("get");
        out.item.map(|i| Value::Object(twopc::attr::item_to_json(&i)))
    }

    /// The exact decimal text of an account's balance.
    pub async fn balance(&self, service: &str, id: &str) -> String {
        let item = self.item(service, id).await.unwrap_or_else(|| panic!("{service}/{id} exists"));
        normalized(&item["data"]["balance"].to_string())
    }

    /// Every item of every participant table that still carries a lock, as (service, item).
    pub async fn locked_items(&self) -> Vec<(String, Value)> {
        let mut locked = vec![];
        for (service, participant) in &self.participants {
            let out = self
                .client
                .scan()
                .table_name(participant.table().name())
                .consistent_read(true)
                .send()
                .await
                .expect("scan");
            for item in out.items() {
                if item.contains_key("lock") || item.contains_key("lockShard") {
                    locked.push((service.clone(), Value::Object(twopc::attr::item_to_json(item))));
                }
            }
        }
        locked
    }

    /// Every transaction record as JSON.
    pub async fn records(&self) -> Vec<Value> {
        let out =
            self.client.scan().table_name(self.transactions.table()).consistent_read(true).send().await.expect("scan");
        out.items().iter().map(|i| Value::Object(twopc::attr::item_to_json(i))).collect()
    }

    /// POST /transactions through the coordinator function's handler, as an API Gateway REST event.
    pub async fn post(&self, body: &Value, idempotency_key: Option<&str>) -> (u16, Value) {
        self.post_raw(&body.to_string(), idempotency_key).await
    }

    pub async fn post_raw(&self, body: &str, idempotency_key: Option<&str>) -> (u16, Value) {
        let mut headers = json!({"content-type": "application/json"});
        if let Some(key) = idempotency_key {
            headers["Idempotency-Key"] = json!(key);
        }
        self.call(&rest_event("POST", "/transactions", "/transactions", None, headers, Some(body))).await
    }

    pub async fn get(&self, id: &str) -> (u16, Value) {
        let event = rest_event(
            "GET",
            &format!("/transactions/{id}"),
            "/transactions/{id}",
            Some(json!({"id": id})),
            json!({}),
            None,
        );
        self.call(&event).await
    }

    pub async fn call(&self, event: &Value) -> (u16, Value) {
        call_coordinator(&self.coordinator, event).await
    }

    /// A transfer of `amount` from service-a's `from` to service-b's `to`, guarded by min 0.
    pub fn transfer(from: (&str, &str), to: (&str, &str), amount: &str) -> Value {
        let negative = format!("-{amount}");
        json!({"participants": [
            {"service": from.0, "operations": [{"op": "add", "key": {"entityId": from.1}, "field": "balance",
                "delta": serde_json::from_str::<Value>(&negative).unwrap(), "min": 0}]},
            {"service": to.0, "operations": [{"op": "add", "key": {"entityId": to.1}, "field": "balance",
                "delta": serde_json::from_str::<Value>(amount).unwrap()}]}
        ]})
    }
}

/// A decimal in its shortest exact form ("0.0" and "0" are the same amount; DynamoDB Local keeps scale).
pub fn normalized(number: &str) -> String {
    let value: bigdecimal::BigDecimal = number.parse().unwrap_or_else(|_| panic!("{number} is a number"));
    value.normalized().to_plain_string()
}

/// Feeds an API Gateway REST proxy event (JSON, as API Gateway sends it) to the coordinator handler.
pub async fn call_coordinator(coordinator: &Coordinator, event: &Value) -> (u16, Value) {
    let request = lambda_http::request::from_str(&event.to_string()).expect("a valid API Gateway event");
    let response = coordinator::handle(coordinator, request).await;
    let status = response.status().as_u16();
    let body: Value = serde_json::from_slice(response.body().as_ref()).expect("JSON body");
    (status, body)
}

/// An API Gateway REST API proxy event.
pub fn rest_event(
    method: &str,
    path: &str,
    resource: &str,
    path_parameters: Option<Value>,
    headers: Value,
    body: Option<&str>,
) -> Value {
    let multi: serde_json::Map<String, Value> =
        headers.as_object().unwrap().iter().map(|(k, v)| (k.clone(), json!([v]))).collect();
    json!({
        "resource": resource,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": multi,
        "queryStringParameters": null,
        "multiValueQueryStringParameters": null,
        "pathParameters": path_parameters,
        "stageVariables": null,
        "requestContext": {
            "accountId": "123456789012",
            "resourceId": "abc123",
            "stage": "prod",
            "requestId": uuid::Uuid::new_v4().to_string(),
            "identity": {"sourceIp": "127.0.0.1", "userAgent": "twopc-tests"},
            "resourcePath": resource,
            "httpMethod": method,
            "apiId": "1234567890",
            "path": format!("/prod{path}"),
            "requestTimeEpoch": 0
        },
        "body": body,
        "isBase64Encoded": false
    })
}
