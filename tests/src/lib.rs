//! Test support: one DynamoDB Local per test binary, fresh tables per test, participants in-process
//! behind an invoker that can inject the faults a network and a crash produce (late copies of any
//! message included), the protocol's DynamoDB client behind faults of its own ([`dynamo_faults`]),
//! and API Gateway events built the way API Gateway sends them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use twopc::auth::{Envelope, SignatureVersion};
use twopc::clock::{SharedClock, ShiftedClock};
use twopc::coordinator::Coordinator;
use twopc::invoke::{InProcessInvoker, InvokeError, ParticipantInvoker};
use twopc::model::{Action, ParticipantRequest, ParticipantResponse};
use twopc::participant::DataTable;
use twopc::participant::Participant;
use twopc::record::TransactionStore;
use twopc::tables;
use twopc_client::{Decimal, Transaction, op};

pub mod contention;
pub mod dynamo_faults;
pub mod outcomes;
pub mod streams;
pub use dynamo_faults::{DynamoFault, DynamoFaults, Rule};

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
    /// The message is delivered twice, back to back; the second answer is returned.
    Duplicate,
    /// The participant does its work at once; only its ANSWER comes after this delay (past the
    /// deadline, when long enough). The message itself is never late: see [`EdgeFault::LateCopy`].
    DelayReply(Duration),
    /// The message is delivered normally (its answer is returned), AND a copy of the very same message
    /// is delivered again after this delay, in a task of its own: the copy can land after its
    /// transaction ended and after other transactions touched the same items, as a re-sent Invoke
    /// does. [`FaultyInvoker::settle`] waits for every copy still in flight.
    LateCopy(Duration),
    /// The participant fails before doing anything.
    Fail,
    /// The caller gets no answer (an invoke that failed in transit), and the message itself is delivered
    /// after this delay, in a task of its own: a request the network held back. Unlike
    /// [`EdgeFault::LateCopy`], the only delivery is the late one, so the sender never saw a vote.
    LateDelivery(Duration),
    /// As [`EdgeFault::LateCopy`], even of a prepare the coordinator sends once (`recorded`): a copy made
    /// by something between the two that retries on its own (a proxy), which this system never does.
    ProxyCopy(Duration),
    /// Lambda refuses the invoke before running the function (throttled): it never ran.
    Throttled,
}

impl EdgeFault {
    /// The former name of [`EdgeFault::DelayReply`]: it delays the answer, not the message.
    #[allow(non_snake_case)]
    pub fn Delay(delay: Duration) -> EdgeFault {
        EdgeFault::DelayReply(delay)
    }
}

/// One participant call: which service, which message, when it started and when it ended.
#[derive(Debug, Clone)]
pub struct Call {
    pub service: String,
    pub action: Action,
    pub transaction_id: String,
    /// A commit that carried `onePhaseRecord`.
    pub one_phase: bool,
    /// The late copy of a message ([`EdgeFault::LateCopy`]), not the coordinator's own delivery.
    pub late_copy: bool,
    /// Sent sealed in a v2 envelope, not signed in v1.
    pub sealed: bool,
    /// The participant's answer in short: `PREPARED`, `REFUSED:CONFLICT`, `COMMITTED`, `error: ...`.
    pub answer: String,
    pub started: std::time::Instant,
    pub ended: std::time::Instant,
}

/// Late copies still to be delivered, shared by every invoker of one test world so that one
/// [`LateCopies::settle`] waits for them all.
#[derive(Clone, Default)]
pub struct LateCopies {
    pending: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl LateCopies {
    /// Waits until every late copy sent so far (and any sent meanwhile) has been delivered.
    pub async fn settle(&self) {
        loop {
            let pending = std::mem::take(&mut *self.pending.lock().unwrap());
            if pending.is_empty() {
                return;
            }
            for copy in pending {
                copy.await.expect("a late copy's delivery panicked");
            }
        }
    }

    /// How many copies are still in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.lock().unwrap().iter().filter(|c| !c.is_finished()).count()
    }
}

/// Calls in-process participants through faults set per (service, action). A fault on
/// [`Action::Commit`] applies to one-phase commits (a commit with `onePhaseRecord`) too.
#[derive(Clone)]
pub struct FaultyInvoker {
    inner: InProcessInvoker,
    faults: Arc<Mutex<HashMap<(String, Action), EdgeFault>>>,
    log: Arc<Mutex<Vec<Call>>>,
    late: LateCopies,
}

impl FaultyInvoker {
    pub fn new(inner: InProcessInvoker) -> FaultyInvoker {
        FaultyInvoker::with_late_copies(inner, LateCopies::default())
    }
    /// An invoker whose late copies join `late` (so the world's settle waits for them).
    pub fn with_late_copies(inner: InProcessInvoker, late: LateCopies) -> FaultyInvoker {
        FaultyInvoker { inner, faults: Default::default(), log: Default::default(), late }
    }
    pub fn set(&self, service: &str, action: Action, fault: EdgeFault) {
        self.faults.lock().unwrap().insert((service.to_owned(), action), fault);
    }
    pub fn clear(&self) {
        self.faults.lock().unwrap().clear();
    }
    /// Every call made (late copies included, once delivered).
    pub fn calls(&self) -> Vec<Call> {
        self.log.lock().unwrap().clone()
    }
    /// Waits until every late copy in flight (this invoker's, and every other invoker's sharing its
    /// [`LateCopies`]) has been delivered.
    pub async fn settle(&self) {
        self.late.settle().await
    }

    fn note(
        &self,
        service: &str,
        message: &Message,
        answer: &Result<ParticipantResponse, InvokeError>,
        late_copy: bool,
        started: std::time::Instant,
    ) {
        let request = message.request();
        let answer = match answer {
            Ok(ParticipantResponse { vote: Some(vote), code, .. }) => {
                let vote = serde_json::to_value(vote).unwrap().as_str().unwrap_or_default().to_owned();
                match code {
                    Some(code) => {
                        format!("{vote}:{}", serde_json::to_value(code).unwrap().as_str().unwrap_or_default())
                    }
                    None => vote,
                }
            }
            Ok(response) => response.status.clone().unwrap_or_else(|| format!("{response:?}")),
            Err(e) => format!("error: {e}"),
        };
        self.log.lock().unwrap().push(Call {
            service: service.to_owned(),
            action: request.action,
            transaction_id: request.transaction_id.clone(),
            one_phase: request.one_phase_record.is_some(),
            late_copy,
            sealed: matches!(message, Message::Sealed(_)),
            answer,
            started,
            ended: std::time::Instant::now(),
        });
    }

    /// Delivers a copy of `message` to `service` after `delay`, in a task of its own.
    fn send_late_copy(&self, service: &str, message: &Message, delay: Duration) {
        let (this, service, message) = (self.clone(), service.to_owned(), message.clone());
        let copy = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let started = std::time::Instant::now();
            let answer = message.deliver(&this.inner, &service).await;
            let request = message.request();
            tracing::info!(service, action = request.action.as_str(), tx = %request.transaction_id, ?answer, "late copy delivered");
            this.note(&service, &message, &answer, true, started);
        });
        self.late.pending.lock().unwrap().push(copy);
    }

    /// `message` to `service` through the fault set for its action.
    async fn run(&self, service: &str, message: Message) -> Result<ParticipantResponse, InvokeError> {
        let started = std::time::Instant::now();
        let request = message.request();
        let mut fault = self.faults.lock().unwrap().get(&(service.to_owned(), request.action)).copied();
        // A prepare of an attempt recorded first is sent once (issue 48: no SDK retry of its invoke), so no
        // copy of it exists to be duplicated or delivered again; only a proxy's could (`ProxyCopy`).
        if request.action == Action::Prepare
            && request.recorded
            && matches!(fault, Some(EdgeFault::Duplicate | EdgeFault::LateCopy(_)))
        {
            tracing::info!(service, tx = %request.transaction_id, "a recorded prepare is sent once: no copy of it");
            fault = None;
        }
        let result = match fault {
            None => message.deliver(&self.inner, service).await,
            Some(EdgeFault::LoseReply) => {
                let _ = message.deliver(&self.inner, service).await;
                Err(InvokeError::Transport { service: service.to_owned(), message: "reply lost (injected)".into() })
            }
            Some(EdgeFault::Duplicate) => {
                let _ = message.deliver(&self.inner, service).await;
                message.deliver(&self.inner, service).await
            }
            Some(EdgeFault::DelayReply(delay)) => {
                let result = message.deliver(&self.inner, service).await;
                tokio::time::sleep(delay).await;
                result
            }
            Some(EdgeFault::LateCopy(delay) | EdgeFault::ProxyCopy(delay)) => {
                let result = message.deliver(&self.inner, service).await;
                self.send_late_copy(service, &message, delay);
                result
            }
            Some(EdgeFault::LateDelivery(delay)) => {
                self.send_late_copy(service, &message, delay);
                Err(InvokeError::Transport { service: service.to_owned(), message: "no answer (injected)".into() })
            }
            Some(EdgeFault::Throttled) => {
                Err(InvokeError::Throttled { service: service.to_owned(), message: "throttled (injected)".into() })
            }
            Some(EdgeFault::Fail) => Err(InvokeError::FunctionError {
                service: service.to_owned(),
                message: "participant failed (injected)".into(),
            }),
        };
        self.note(service, &message, &result, false, started);
        result
    }
}

/// A message as its sender signed it: v1 (the signature inside) or v2 (sealed in an envelope). Copies
/// of it (duplicates, late copies) are the same bytes, as the SDK re-sends them.
#[derive(Clone)]
enum Message {
    Signed(ParticipantRequest),
    Sealed(Envelope),
}

impl Message {
    /// What it carries, for the faults (set per action) and the log.
    fn request(&self) -> ParticipantRequest {
        match self {
            Message::Signed(request) => request.clone(),
            Message::Sealed(envelope) => serde_json::from_str(&envelope.message).expect("a sealed participant message"),
        }
    }

    async fn deliver(&self, inner: &InProcessInvoker, service: &str) -> Result<ParticipantResponse, InvokeError> {
        match self {
            Message::Signed(request) => inner.invoke(service, request).await,
            Message::Sealed(envelope) => inner.invoke_sealed(service, envelope).await,
        }
    }
}

impl ParticipantInvoker for FaultyInvoker {
    fn invoke<'a>(
        &'a self,
        service: &'a str,
        request: &'a ParticipantRequest,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>> {
        Box::pin(self.run(service, Message::Signed(request.clone())))
    }

    fn invoke_sealed<'a>(
        &'a self,
        service: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>> {
        Box::pin(self.run(service, Message::Sealed(envelope.clone())))
    }
}

/// One test's world: its own tables, participants, a clock it can move, and a coordinator.
///
/// The protocol (coordinator, participants, sweeper: every store) talks to DynamoDB through
/// `store_client`, the deployed configuration over [`DynamoFaults`]; with no rule added it passes every
/// request untouched. The test's own reads and writes (`item`, `records`, `put_account`, ...) go
/// through `client`, which no fault touches.
pub struct TestEnv {
    /// A plain client, for the test's own look at the tables.
    pub client: Client,
    /// The client every store of the protocol uses (through `dynamo_faults`).
    pub store_client: Client,
    /// The rules of `store_client`: add one to inject a DynamoDB-level fault, `clear()` to stop.
    pub dynamo_faults: DynamoFaults,
    /// Late copies of participant messages still in flight, from every invoker of this world.
    pub late_copies: LateCopies,
    pub transactions: TransactionStore,
    /// service → its participant (and table).
    pub participants: BTreeMap<String, Participant>,
    pub clock: Arc<ShiftedClock>,
    pub invoker: FaultyInvoker,
    pub coordinator: Coordinator,
    /// The stand-in payment API of the `payments` service (a resource participant), when it has one.
    pub payment_api: Option<Arc<local_services::payments::PaymentApi>>,
}

impl TestEnv {
    /// Two services, `service-a` and `service-b`, as in the contract.
    pub async fn new() -> TestEnv {
        TestEnv::with_services(&["service-a", "service-b"]).await
    }

    pub async fn with_services(services: &[&str]) -> TestEnv {
        TestEnv::with_dynamo_faults(services, DynamoFaults::new(0)).await
    }

    /// A world whose protocol reaches DynamoDB through `faults` (add rules before or after).
    pub async fn with_dynamo_faults(services: &[&str], faults: DynamoFaults) -> TestEnv {
        init_logs();
        let client = dynamodb().await;
        let store_client = dynamo_faults::faulty_client(&faults);
        let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        let transactions_table = format!("{prefix}-transactions");
        let mut specs = vec![tables::transactions_table(&transactions_table)];
        specs.extend(services.iter().map(|s| tables::participant_table(&format!("{prefix}-{s}-data"))));
        futures::future::try_join_all(specs.iter().map(|spec| spec.create_if_missing(&client)))
            .await
            .expect("tables are created");
        let clock = ShiftedClock::new();
        let shared: SharedClock = clock.clone();
        let transactions = TransactionStore::new(store_client.clone(), &transactions_table);
        let payment_api = match services.contains(&payments::SERVICE) {
            true => {
                Some(Arc::new(local_services::payments::PaymentApi::start().await.expect("the payment API starts")))
            }
            false => None,
        };
        let participants: BTreeMap<String, Participant> = services
            .iter()
            .map(|s| {
                let table = DataTable::new(store_client.clone(), format!("{prefix}-{s}-data"));
                let participant = Participant::new(*s, table, transactions.clone(), shared.clone());
                // The example service speaks its own operations, as it is deployed.
                let participant = match (*s, &payment_api) {
                    (inventory::SERVICE, _) => participant.with_operations(inventory::Inventory),
                    // The resource participant, against the stand-in payment API.
                    (payments::SERVICE, Some(api)) => participant.with_resource(payments::Payments::new(api.url())),
                    _ => participant,
                };
                (s.to_string(), participant)
            })
            .collect();
        let catalogs = catalogs_of(&participants);
        let late_copies = LateCopies::default();
        let invoker =
            FaultyInvoker::with_late_copies(InProcessInvoker::new(participants.values().cloned()), late_copies.clone());
        // Signed as a deployment that moved to v2 signs (every fault test sends envelopes); the
        // coordinators of `coordinator_of`, over invokers of a test's own, sign v1.
        let coordinator = Coordinator::new(
            transactions.clone(),
            Arc::new(invoker.clone()),
            services.iter().map(|s| s.to_string()),
            shared,
        )
        .with_operations(catalogs)
        .with_signature(SignatureVersion::V2);
        TestEnv {
            client,
            store_client,
            dynamo_faults: faults,
            late_copies,
            transactions,
            participants,
            clock,
            invoker,
            coordinator,
            payment_api,
        }
    }

    /// `request` signed for `service` now, as the coordinator signs what it sends (with the local
    /// development keys every participant of this world verifies): for tests that deliver a message of
    /// their own to a participant.
    pub fn signed(&self, service: &str, request: ParticipantRequest) -> ParticipantRequest {
        twopc::auth::sign_with(&twopc::auth::LocalKeys::key_set(service), service, &request, self.clock_now())
            .expect("the local key is valid")
    }

    /// Waits until every late copy of a participant message sent in this world has been delivered.
    pub async fn settle(&self) {
        self.late_copies.settle().await
    }

    /// A coordinator of its own, with its own edge faults and crash point: concurrent clients of a
    /// fault test each get one, so one client's faults never touch another's transactions.
    pub fn coordinator_with(&self, invoker: &FaultyInvoker, faults: twopc::faults::Faults) -> Coordinator {
        self.coordinator_of(invoker).with_faults(faults).with_signature(SignatureVersion::V2)
    }

    /// A coordinator over this world's store, clock and services' own operations, calling `invoker`.
    pub fn coordinator_of(&self, invoker: &(impl ParticipantInvoker + Clone + 'static)) -> Coordinator {
        Coordinator::new(
            self.transactions.clone(),
            Arc::new(invoker.clone()),
            self.participants.keys().cloned(),
            self.clock.clone(),
        )
        .with_operations(catalogs_of(&self.participants))
    }

    /// A fault-free invoker over the same in-process participants (its late copies are the world's:
    /// [`TestEnv::settle`] waits for them).
    pub fn fresh_invoker(&self) -> FaultyInvoker {
        FaultyInvoker::with_late_copies(
            InProcessInvoker::new(self.participants.values().cloned()),
            self.late_copies.clone(),
        )
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
        let tables: BTreeMap<String, DataTable> =
            self.participants.iter().map(|(s, p)| (s.clone(), p.table().clone())).collect();
        // As the sweeper function builds it: its tables also for the stuck view's count.
        let coordinator = coordinator.with_data_tables(tables.clone());
        twopc::sweeper::Sweeper::new(coordinator, tables, limits)
    }

    /// Sweeps until a run finds nothing to do (bounded), returning the runs' reports.
    pub async fn sweep_until_quiet(&self) -> Vec<twopc::sweeper::SweepReport> {
        let sweeper = self.sweeper(None);
        let mut reports = vec![];
        for _ in 0..20 {
            let report = sweeper.sweep().await.expect("sweep");
            let quiet = report.is_quiet();
            self.pass_postponement(&report);
            reports.push(report);
            if quiet {
                return reports;
            }
        }
        panic!("sweeps did not become quiet: {reports:#?}");
    }

    /// Sweeps until a run finds nothing to do or `runs` runs have gone by, never panicking: the
    /// reports, and whether the last run was quiet. A run that fails counts as not quiet.
    pub async fn try_sweep_until_quiet(&self, runs: usize) -> (Vec<Result<twopc::sweeper::SweepReport, String>>, bool) {
        let sweeper = self.sweeper(None);
        let mut reports = vec![];
        for _ in 0..runs {
            let report = sweeper.sweep().await.map_err(|e| e.to_string());
            let quiet = report.as_ref().is_ok_and(|r| r.is_quiet());
            if let Ok(report) = &report {
                self.pass_postponement(report);
            }
            reports.push(report);
            if quiet {
                return (reports, true);
            }
        }
        (reports, false)
    }

    /// A transaction the sweeper could not finish is postponed (its `sweepAt` pushed back): once a run
    /// reports such errors, time moves past the longest postponement, so the next run looks again.
    fn pass_postponement(&self, report: &twopc::sweeper::SweepReport) {
        if report.errors > 0 {
            self.clock.advance(twopc::sweeper::SweepLimits::default().retry_ms << 7);
        }
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

    /// Puts an item with this `data` at version 0, outside the protocol (a service's own set-up).
    pub async fn put_data(&self, service: &str, id: &str, data: &Value) {
        let mut item = serde_json::Map::new();
        item.insert("entityId".into(), Value::String(id.to_owned()));
        item.insert("data".into(), data.clone());
        item.insert("version".into(), Value::from(0));
        let item = twopc::attr::to_item(&item);
        self.client.put_item().table_name(self.table(service)).set_item(Some(item)).send().await.expect("put");
    }

    /// A transaction's record as stored now (a consistent read with the test's own client, which no fault
    /// touches), or None.
    pub async fn raw_record(&self, id: &str) -> Option<HashMap<String, AttributeValue>> {
        self.client
            .get_item()
            .table_name(self.transactions.table())
            .key("transactionId", AttributeValue::S(id.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .expect("get")
            .item
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

    /// Every item of every participant table that still carries a lock or a pending credit (or counts one),
    /// as (service, item).
    pub async fn locked_items(&self) -> Vec<(String, Value)> {
        let mut locked = vec![];
        for (service, participant) in &self.participants {
            for item in self.scan(participant.table().name()).await {
                let credits = item.keys().any(|name| name.starts_with(twopc::tables::item_attr::CREDIT_PREFIX))
                    || twopc::participant::credits::pending(&item) != 0;
                if item.contains_key("lock") || item.contains_key("lockShard") || credits {
                    locked.push((service.clone(), Value::Object(twopc::attr::item_to_json(&item))));
                }
            }
        }
        locked
    }

    /// Every transaction record as JSON.
    pub async fn records(&self) -> Vec<Value> {
        let items = self.scan(self.transactions.table()).await;
        items.iter().map(|i| Value::Object(twopc::attr::item_to_json(i))).collect()
    }

    /// Every item of a table, through every page (a page holds at most 1 MB).
    pub async fn scan(&self, table: &str) -> Vec<HashMap<String, AttributeValue>> {
        let mut items = vec![];
        let mut start = None;
        loop {
            let out = self
                .client
                .scan()
                .table_name(table)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .expect("scan");
            items.extend(out.items.unwrap_or_default());
            start = out.last_evaluated_key;
            if start.is_none() {
                return items;
            }
        }
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

    /// A transfer of `amount` (exact decimal text) from `from` to `to`, guarded by min 0, as JSON
    /// (tests that change it or send it in-process take the body).
    pub fn transfer(from: (&str, &str), to: (&str, &str), amount: &str) -> Value {
        let amount: Decimal = amount.parse().expect("a decimal amount");
        Transaction::new()
            .participant(from.0, [op::add(from.1, "balance", -amount.clone()).min(0)])
            .participant(to.0, [op::add(to.1, "balance", amount)])
            .to_json()
    }
}

/// Each participant's own operation kinds, as a coordinator's `SERVICE_OPERATIONS` would give them.
pub fn catalogs_of(participants: &BTreeMap<String, Participant>) -> twopc::custom::Catalogs {
    let mut catalogs = twopc::custom::Catalogs::default();
    for (service, participant) in participants {
        if !participant.catalog().is_empty() {
            catalogs.insert(service.clone(), participant.catalog().clone());
        }
    }
    catalogs
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

/// `POST /transactions/{id}/commit` or `/abort` (`decision`) as API Gateway sends it, unsigned.
pub fn decision_event(id: &str, decision: &str) -> Value {
    rest_event(
        "POST",
        &format!("/transactions/{id}/{decision}"),
        &format!("/transactions/{{id}}/{decision}"),
        Some(json!({"id": id})),
        json!({}),
        None,
    )
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

/// The next push of `pushes` matching `wanted`, skipping others; panics after `wait` or when the
/// connection closes.
pub async fn next_push(
    pushes: &mut twopc_client::Subscription,
    wait: Duration,
    what: &str,
    wanted: impl Fn(&twopc_client::Push) -> bool,
) -> twopc_client::Push {
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let push = tokio::time::timeout_at(deadline, pushes.next())
            .await
            .unwrap_or_else(|_| panic!("no WebSocket message {what} within {wait:?}"))
            .expect("the connection stays open")
            .expect("a message in the contract's shape");
        if wanted(&push) {
            return push;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A late copy is delivered after its transaction ended, in a task of its own, and `settle` waits
    /// for it.
    #[tokio::test]
    async fn a_late_copy_lands_after_its_transaction_ended() {
        let env = TestEnv::new().await;
        env.put_account("service-a", "A", "100").await;
        env.put_account("service-b", "B", "0").await;
        let delay = Duration::from_millis(1_000);
        for action in [Action::Prepare, Action::Commit] {
            env.invoker.set("service-a", action, EdgeFault::LateCopy(delay));
        }

        let (status, answer) = env.post(&TestEnv::transfer(("service-a", "A"), ("service-b", "B"), "10"), None).await;
        let answered = std::time::Instant::now();

        assert_eq!(status, 200, "{answer}");
        let id = answer["transactionId"].as_str().unwrap();
        assert!(env.invoker.calls().iter().all(|c| !c.late_copy), "no copy has landed yet");
        assert_eq!(env.late_copies.in_flight(), 2);
        env.settle().await;
        assert_eq!(env.late_copies.in_flight(), 0);
        let copies: Vec<Call> = env.invoker.calls().into_iter().filter(|c| c.late_copy).collect();
        assert_eq!(copies.len(), 2, "{copies:?}");
        for copy in copies {
            assert_eq!((copy.service.as_str(), copy.transaction_id.as_str()), ("service-a", id));
            assert!(copy.started >= answered, "the copy of {:?} landed after the answer", copy.action);
        }
    }
}
