//! The functions, behind one interface: their cores in this process, or their real binaries under
//! `cargo lambda watch`, invoked with the events AWS would send.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::apigw::ApiGatewayWebsocketProxyRequest;
use aws_lambda_events::event::dynamodb::Event;
use aws_sdk_lambda::primitives::Blob;
use serde_json::{Value, json};
use tracing::info;
use twopc::clock;
use twopc::coordinator::Coordinator;
use twopc::invoke::{InProcessInvoker, ParticipantInvoker};
use twopc::participant::DataTable;
use twopc::participant::Participant;
use twopc::record::TransactionStore;
use twopc::sweeper::{SweepLimits, Sweeper};
use twopc_fanout::connections::ConnectionStore;
use twopc_fanout::outcomes::EventBridgeBus;
use twopc_fanout::{ApiGatewayPoster, FanoutConfig, FirehoseSink, StreamProcessor};

use crate::events::{self, HttpRequest, ProxyResponse, WebSocketConnection, WebSocketEvent};
use crate::invoke_guard::{GuardTask, WatchPort};
use crate::watch::Watch;
use crate::{Error, LambdaOptions, REGION, Tables};

/// How the functions reach the rest of the stack.
#[derive(Debug, Clone)]
pub(crate) struct Wiring {
    pub sdk: aws_config::SdkConfig,
    pub dynamodb_endpoint: String,
    pub tables: Tables,
    pub firehose_url: String,
    /// The EventBridge endpoint of the outcomes bus.
    pub events_url: String,
    /// The CloudWatch Logs endpoint serving the bus's events as its log group ([`EVENT_BUS`]).
    pub logs_url: String,
    pub stream_name: String,
    pub management_endpoint: String,
    /// The origin the REST API allows (`twopc::cors`); None: no CORS header.
    pub cors_allow_origin: Option<String>,
    /// The payments service's payment API (the stand-in's URL), when the stack has that service.
    pub payment_api_url: Option<String>,
    /// The dead-letter queue, a folder: the stream processor's own dead letters (records it gives up on,
    /// with their content) go there beside the pollers' on-failure records.
    pub dead_letter_dir: std::path::PathBuf,
    /// Who may do what (`ACCESS_POLICY`).
    pub access: twopc::access::Policy,
    /// `--auth jwt`: the issuer and audience the authorizer accepts; None: no authorizer runs.
    pub jwt: Option<twopc::jwt::JwtSettings>,
    /// `MAX_CONNECTIONS_PER_PRINCIPAL`.
    pub max_connections_per_principal: usize,
}

/// What the authorizer answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Authorized {
    /// Allowed: the fields API Gateway puts in `requestContext.authorizer` (`principalId` and the context).
    Allow(Value),
    /// No valid token: API Gateway answers 401.
    Unauthorized,
    /// A policy that does not allow the method: 403.
    Deny,
}

pub(crate) type Processor = StreamProcessor<FirehoseSink, ApiGatewayPoster, ConnectionStore>;

/// The stream processor's core wired to the stack, with the function's own constructors: the
/// Firehose client with the SDK's retries off, so that delivery's retry of the failed entries is the
/// only retry layer, as deployed.
pub(crate) fn stream_processor(wiring: &Wiring, dynamodb: aws_sdk_dynamodb::Client) -> Processor {
    let tables = &wiring.tables;
    // The services' own operations, as deployed (SERVICE_OPERATIONS): a resource's make no lake line.
    let fanout = FanoutConfig::new(&tables.participants, &tables.transactions)
        .expect("participant tables are distinct from the transactions table")
        .with_service_operations(&service_operations(tables.participants.keys()));
    let firehose = wiring.sdk.to_builder().endpoint_url(&wiring.firehose_url).build();
    StreamProcessor::new(
        fanout,
        FirehoseSink::from_config(&firehose, &wiring.stream_name),
        ApiGatewayPoster::from_config(&wiring.sdk, &wiring.management_endpoint),
        ConnectionStore::new(dynamodb, &tables.connections).with_access(wiring.access.clone(), None),
    )
    .with_dead_letters(std::sync::Arc::new(twopc_fanout::replay::DirectoryDeadLetters::new(
        wiring.dead_letter_dir.clone(),
    )))
    .with_access(wiring.access.clone())
}

/// The function a service's participant runs: its own crate's for the repository's example service
/// (the inventory, with its own operations), the generic participant's for any other.
pub(crate) fn participant_function(service: &str) -> &'static str {
    match service {
        inventory::SERVICE => "inventory",
        payments::SERVICE => "payments",
        _ => "participant",
    }
}

/// The configured services' own operation kinds, as the coordinator's `SERVICE_OPERATIONS` gives them.
pub fn service_operations(services: impl IntoIterator<Item = impl AsRef<str>>) -> twopc::custom::Catalogs {
    let mut catalogs = twopc::custom::Catalogs::default();
    for service in services {
        match participant_function(service.as_ref()) {
            "inventory" => catalogs.insert(service.as_ref(), inventory::catalogs().of(inventory::SERVICE).clone()),
            "payments" => catalogs.insert(service.as_ref(), payments::catalog()),
            _ => {}
        }
    }
    catalogs
}

/// The system's functions, in-process or under `cargo lambda watch`.
pub enum Functions {
    InProcess(Box<InProcess>),
    Lambda(Lambda),
}

pub struct InProcess {
    authorizer: Option<twopc::jwt::Verifier>,
    coordinator: Coordinator,
    cors_allow_origin: Option<String>,
    connections: ::connections::Connections,
    processor: Processor,
    sweeper: Sweeper,
    /// The outcomes function's bus, and the transactions table it reads the stream of.
    bus: EventBridgeBus,
    outcome_tables: FanoutConfig,
}

pub struct Lambda {
    /// The Invoke API of the deployment that runs coordinator, connections, stream-processor and sweeper.
    client: aws_sdk_lambda::Client,
    watches: Vec<Watch>,
    /// The guards in front of the watches' Invoke APIs (`crate::invoke_guard`), and the watches' own ports.
    _guards: Vec<(GuardTask, WatchPort)>,
}

/// How long the first invocations may take: they build the function binaries.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The deployment running every function but the participants.
const SYSTEM: &str = "functions";
const SYSTEM_FUNCTIONS: [&str; 6] =
    ["coordinator", "connections", "stream-processor", "outcomes", "sweeper", "authorizer"];
/// The outcomes bus's name, and the log group's its events are read back from.
pub(crate) const EVENT_BUS: &str = "twopc-local-outcomes";

impl Functions {
    pub(crate) fn in_process(wiring: &Wiring, dynamodb: aws_sdk_dynamodb::Client) -> Functions {
        let tables = &wiring.tables;
        let transactions = TransactionStore::new(dynamodb.clone(), &tables.transactions);
        let participants: Vec<Participant> = tables
            .participants
            .iter()
            .map(|(service, table)| {
                let participant = Participant::new(
                    service.clone(),
                    DataTable::new(dynamodb.clone(), table),
                    transactions.clone(),
                    clock::system(),
                );
                match (participant_function(service), &wiring.payment_api_url) {
                    ("inventory", _) => participant.with_operations(inventory::Inventory),
                    ("payments", Some(api)) => participant.with_resource(payments::Payments::new(api)),
                    _ => participant,
                }
            })
            .collect();
        let invoker: Arc<dyn ParticipantInvoker> = Arc::new(InProcessInvoker::new(participants));
        let services: Vec<String> = tables.participants.keys().cloned().collect();
        // Sealed in v2, as a deployment that moved to it signs (docs/participant-protocol.md); its
        // participants take v1 too (`twopc-local sign`'s messages).
        let coordinator = Coordinator::new(transactions.clone(), invoker, services.clone(), clock::system())
            .with_signature(twopc::auth::SignatureVersion::V2)
            .with_operations(service_operations(&services))
            .with_access(wiring.access.clone());
        let data_tables: BTreeMap<String, DataTable> = tables
            .participants
            .iter()
            .map(|(service, table)| (service.clone(), DataTable::new(dynamodb.clone(), table)))
            .collect();
        let logs = wiring.sdk.to_builder().endpoint_url(&wiring.logs_url).build();
        let coordinator = coordinator
            .with_data_tables(data_tables.clone())
            .with_outcome_history(Arc::new(::coordinator::outcome_log::LogGroupHistory::from_config(&logs, EVENT_BUS)))
            // `Prefer: respond-async`: this process keeps running after an answer, so a task of its own
            // finishes the second phase (deployed, the coordinator function's internal extension).
            .with_after_answer(Arc::new(twopc::after_answer::Spawned));
        let sweeper = Sweeper::new(coordinator.clone(), data_tables, SweepLimits::default())
            .with_open_alerts_after(twopc_fanout::outcomes::DEFAULT_OPEN_ALERT_AFTER_MS);
        let bus =
            EventBridgeBus::from_config(&wiring.sdk.to_builder().endpoint_url(&wiring.events_url).build(), EVENT_BUS);
        let outcome_tables = FanoutConfig::new(&BTreeMap::new(), &tables.transactions).expect("one table");
        let connections = ::connections::Connections::new(
            ConnectionStore::new(dynamodb.clone(), &tables.connections)
                .with_access(wiring.access.clone(), Some(transactions))
                .with_max_connections_per_principal(wiring.max_connections_per_principal),
            crate::events::API_ID,
        );
        let processor = stream_processor(wiring, dynamodb);
        let authorizer = wiring.jwt.clone().map(|settings| twopc::jwt::Verifier::new(settings, wiring.access.clone()));
        Functions::InProcess(Box::new(InProcess {
            authorizer,
            coordinator,
            cors_allow_origin: wiring.cors_allow_origin.clone(),
            connections,
            processor,
            sweeper,
            bus,
            outcome_tables,
        }))
    }

    /// Starts one `cargo lambda watch` per participant deployment and one for the other functions,
    /// waits for each Invoke API, then invokes every function once so that each is compiled and
    /// running before the stack reports ready.
    pub(crate) async fn lambda(
        wiring: &Wiring,
        options: &LambdaOptions,
    ) -> Result<(Functions, Vec<(String, String, Vec<String>)>), Error> {
        let common = [
            ("AWS_ACCESS_KEY_ID", "local".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "local".to_owned()),
            ("AWS_REGION", REGION.to_owned()),
            ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
            (twopc::record::TRANSACTIONS_TABLE_NAME, wiring.tables.transactions.clone()),
        ];
        // Each watch listens on a port of its own; the stack hands out (and invokes through) a guard's
        // port in front of it, which no browser page gets through (`crate::invoke_guard`).
        let mut guards = Vec::new();
        let mut guarded = async |i: usize| -> Result<(u16, u16), Error> {
            let public = match options.invoke_port {
                0 => 0,
                base => base + i as u16,
            };
            let listener = crate::ports::bind(public, "a cargo lambda watch Invoke API", "--invoke-port").await?;
            let public = listener
                .local_addr()
                .map_err(|source| Error::Io { what: "the invoke guard's address".into(), source })?
                .port();
            let watch = crate::invoke_guard::watch_port()?;
            let own = watch.port;
            guards.push((crate::invoke_guard::serve(listener, own)?, watch));
            Ok((public, own))
        };
        let mut participant_ports = BTreeMap::new();
        let mut watches = Vec::new();
        // The generic participants' deployments first (service-a on 9001, service-b on 9002, as the docs
        // say), then the services that run their own participant.
        let mut deployments: Vec<(&String, &String)> = wiring.tables.participants.iter().collect();
        deployments.sort_by_key(|(service, _)| participant_function(service) != "participant");
        for (i, (service, table)) in deployments.into_iter().enumerate() {
            let (port, watch_port) = guarded(i + 1).await?;
            let mut env: Vec<(&str, String)> = common.to_vec();
            env.extend([
                ("AWS_ENDPOINT_URL", wiring.dynamodb_endpoint.clone()),
                (twopc::participant::SERVICE_NAME, service.clone()),
                (twopc::participant::DATA_TABLE_NAME, table.clone()),
                // The local development keys, as in-process: messages are signed and checked all the same.
                (twopc::auth::PARTICIPANT_KEY, twopc::auth::LOCAL_KEYS.to_owned()),
            ]);
            if let (payments::SERVICE, Some(api)) = (service.as_str(), &wiring.payment_api_url) {
                env.push((twopc::environment::PAYMENT_API_URL, api.clone()));
            }
            let watch = Watch::spawn(&format!("participant-{service}"), watch_port, &env, options)?;
            participant_ports.insert(service.clone(), (port, participant_function(service)));
            watches.push(watch);
        }
        let registry: BTreeMap<&String, String> = participant_ports
            .iter()
            .map(|(s, (port, function))| (s, format!("http://127.0.0.1:{port}/{function}")))
            .collect();
        let (system_port, system_watch_port) = guarded(0).await?;
        let mut env: Vec<(&str, String)> = common.to_vec();
        env.extend([
            ("AWS_ENDPOINT_URL_DYNAMODB", wiring.dynamodb_endpoint.clone()),
            ("AWS_ENDPOINT_URL_FIREHOSE", wiring.firehose_url.clone()),
            ("AWS_ENDPOINT_URL_EVENTBRIDGE", wiring.events_url.clone()),
            (twopc_fanout::outcomes::EVENT_BUS_NAME, EVENT_BUS.to_owned()),
            ("AWS_ENDPOINT_URL_CLOUDWATCH_LOGS", wiring.logs_url.clone()),
            (::coordinator::outcome_log::OUTCOME_LOG_GROUP, EVENT_BUS.to_owned()),
            (twopc::invoke::PARTICIPANTS, json!(registry).to_string()),
            (twopc::auth::PARTICIPANT_KEYS, twopc::auth::LOCAL_KEYS.to_owned()),
            // Envelopes over the real wire, through each participant binary's entry.
            (twopc::auth::PARTICIPANT_SIGNATURE, "v2".to_owned()),
            // The coordinator's own age-token key, made at each start (in one process, the coordinator
            // makes its own): never a participant's key.
            (twopc::age::AGE_TOKEN_KEY, age_token_key()),
            (
                twopc::custom::SERVICE_OPERATIONS,
                service_operations(wiring.tables.participants.keys()).to_json().to_string(),
            ),
            (twopc::tables::PARTICIPANT_TABLES, json!(wiring.tables.participants).to_string()),
            (twopc_fanout::connections::CONNECTIONS_TABLE_NAME, wiring.tables.connections.clone()),
            (twopc_fanout::lake::FIREHOSE_STREAM_NAME, wiring.stream_name.clone()),
            (twopc_fanout::realtime::WEBSOCKET_ENDPOINT, wiring.management_endpoint.clone()),
            (twopc::access::ACCESS_POLICY, serde_json::to_string(&wiring.access).expect("a policy serializes")),
            (
                twopc_fanout::connections::MAX_CONNECTIONS_PER_PRINCIPAL,
                wiring.max_connections_per_principal.to_string(),
            ),
            (twopc_fanout::connections::WEBSOCKET_API_ID, crate::events::API_ID.to_owned()),
            // The folder the in-process stack uses, as a `file://` queue: the function dead-letters there.
            (twopc_fanout::replay::DEAD_LETTER_QUEUE_URL, format!("file://{}", wiring.dead_letter_dir.display())),
        ]);
        if let Some(origin) = &wiring.cors_allow_origin {
            env.push((twopc::cors::CORS_ALLOW_ORIGIN, origin.clone()));
        }
        if let Some(jwt) = &wiring.jwt {
            env.extend([
                (twopc::jwt::JWT_ISSUER, jwt.issuer.clone()),
                (twopc::jwt::JWT_AUDIENCE, jwt.audience.clone()),
                (twopc::jwt::JWKS_URL, jwt.jwks_url.clone()),
            ]);
        }
        watches.push(Watch::spawn(SYSTEM, system_watch_port, &env, options)?);
        for watch in &watches {
            watch.wait_ready(Duration::from_secs(120)).await?;
        }

        let client = |port: u16| {
            aws_sdk_lambda::Client::from_conf(
                aws_sdk_lambda::config::Builder::from(&wiring.sdk)
                    .endpoint_url(format!("http://127.0.0.1:{port}"))
                    .retry_config(aws_sdk_lambda::config::retry::RetryConfig::disabled())
                    .build(),
            )
        };
        let lambda = Lambda { client: client(system_port), watches, _guards: guards };

        // Warm-up: the first invocation of each function builds and starts it (minutes the first
        // time, seconds after); a harmless event each.
        eprintln!(
            "building and starting the functions under `cargo lambda watch` (the first build takes a few minutes)..."
        );
        let started = std::time::Instant::now();
        let warm_participants = participant_ports.iter().map(|(service, (port, function))| {
            let client = client(*port);
            async move {
                // A read-only prepare: it reads one item and locks nothing (a resource participant refuses
                // it as not its own operation). Signed as the coordinator signs: unsigned, it is refused.
                let signed_check = || -> Result<Value, String> {
                    let check = twopc::model::ParticipantRequest {
                        operations: vec![json!({"op": "check", "key": {"entityId": "warm-up"}})],
                        ..twopc::model::ParticipantRequest::new(twopc::model::Action::Prepare, "warm-up")
                    };
                    let now = twopc::clock::Clock::now_ms(&twopc::clock::SystemClock);
                    let signed =
                        twopc::auth::sign_with(&twopc::auth::LocalKeys::key_set(service), service, &check, now)
                            .map_err(|e| e.to_string())?;
                    serde_json::to_value(&signed).map_err(|e| e.to_string())
                };
                // The first call builds and starts the function, which can take longer than a signed message
                // stays fresh (a first build: minutes), so its answer may be a refusal as stale. The check is
                // the second call, signed when it is sent.
                let _ = invoke(&client, function, &signed_check()?).await;
                invoke(&client, function, &signed_check()?).await
            }
        });
        let connection = WebSocketConnection {
            connection_id: "warm-up".into(),
            connected_at: 0,
            source_ip: "127.0.0.1".into(),
            user_agent: None,
            domain: "127.0.0.1".into(),
            stage: "local".into(),
            authorizer: None,
        };
        let get = HttpRequest {
            method: "GET",
            path: "/transactions/warm-up",
            query: None,
            headers: vec![],
            body: b"",
            source_ip: "127.0.0.1".into(),
        };
        let (resource, parameters) = events::rest_resource("GET", get.path).expect("a route");
        let system_events = [
            ("coordinator", events::rest_proxy_event(&get, resource, parameters, "local", "127.0.0.1")),
            (
                "connections",
                events::websocket_event(
                    &connection,
                    &WebSocketEvent::Disconnect { status_code: 1000, reason: "warm-up" },
                ),
            ),
            ("stream-processor", json!({"Records": []})),
            ("outcomes", json!({"Records": []})),
            ("sweeper", events::scheduled_event()),
        ];
        let warm_system = system_events.iter().map(|(function, event)| invoke(&lambda.client, function, event));
        let warm_up = async {
            futures::join!(futures::future::join_all(warm_participants), futures::future::join_all(warm_system))
        };
        // A build that fails leaves its invocation waiting: bounded, with the output to say why.
        let Ok((participants, system)) = tokio::time::timeout(WARM_UP_TIMEOUT, warm_up).await else {
            return Err(Error::Lambda(format!(
                "the functions did not all answer within {WARM_UP_TIMEOUT:?} under cargo lambda watch (a build error?):\n{}",
                lambda.output_tail()
            )));
        };
        for result in participants.into_iter().chain(system) {
            if let Err(e) = result {
                return Err(Error::Lambda(format!(
                    "a function did not start under cargo lambda watch: {e}\n{}",
                    lambda.output_tail()
                )));
            }
        }
        if wiring.jwt.is_some() {
            // The authorizer, with a call that has no token: its answer is the 401 error.
            let event =
                events::authorizer_event(&events::method_arn("local", "GET", "/transactions/warm-up"), &[], None);
            let warm = tokio::time::timeout(WARM_UP_TIMEOUT, invoke(&lambda.client, "authorizer", &event)).await;
            match warm {
                Ok(Err(e)) if e.contains(r#""errorMessage":"Unauthorized""#) => {}
                Ok(other) => {
                    return Err(Error::Lambda(format!(
                        "the authorizer did not start under cargo lambda watch: {other:?}\n{}",
                        lambda.output_tail()
                    )));
                }
                Err(_) => {
                    return Err(Error::Lambda(format!("the authorizer did not answer:\n{}", lambda.output_tail())));
                }
            }
        }
        eprintln!("functions ready in {:.1} s", started.elapsed().as_secs_f64());
        info!(after_ms = started.elapsed().as_millis() as u64, "every function answered under cargo lambda watch");

        let mut described: Vec<(String, String, Vec<String>)> = participant_ports
            .iter()
            .map(|(service, (port, function))| {
                (format!("participant-{service}"), format!("http://127.0.0.1:{port}"), vec![function.to_string()])
            })
            .collect();
        described.push((
            SYSTEM.to_owned(),
            format!("http://127.0.0.1:{system_port}"),
            SYSTEM_FUNCTIONS.iter().map(|f| f.to_string()).collect(),
        ));
        Ok((Functions::Lambda(lambda), described))
    }

    /// The coordinator with an API Gateway REST proxy event.
    pub async fn coordinator(&self, event: &Value) -> Result<ProxyResponse, String> {
        match self {
            Functions::InProcess(f) => {
                let request = lambda_http::request::from_str(&event.to_string())
                    .map_err(|e| format!("not an API Gateway event: {e}"))?;
                let response = coordinator::allow_origin(
                    coordinator::handle(&f.coordinator, request).await,
                    f.cors_allow_origin.as_deref(),
                );
                let headers = response
                    .headers()
                    .iter()
                    .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                    .collect();
                Ok(ProxyResponse { status: response.status().as_u16(), headers, body: response.body().to_vec() })
            }
            Functions::Lambda(f) => ProxyResponse::from_json(&invoke(&f.client, "coordinator", event).await?),
        }
    }

    /// The authorizer with a REQUEST authorizer event (REST method or WebSocket `$connect`).
    pub async fn authorize(&self, event: &Value) -> Result<Authorized, String> {
        let answer = match self {
            Functions::InProcess(f) => {
                let Some(verifier) = &f.authorizer else {
                    return Err("no authorizer: the stack runs without --auth".into());
                };
                match ::authorizer::handle(verifier, event.clone()).await {
                    Ok(answer) => answer,
                    Err(::authorizer::Denied::Unauthorized) => return Ok(Authorized::Unauthorized),
                    Err(other) => return Err(other.to_string()),
                }
            }
            Functions::Lambda(f) => match invoke(&f.client, "authorizer", event).await {
                Ok(answer) => answer,
                // API Gateway's rule: a function error whose message is `Unauthorized` is a 401.
                Err(e) if e.contains(r#""errorMessage":"Unauthorized""#) => return Ok(Authorized::Unauthorized),
                Err(e) => return Err(e),
            },
        };
        let allowed = answer["policyDocument"]["Statement"]
            .as_array()
            .is_some_and(|statements| statements.iter().any(|s| s["Effect"] == "Allow"));
        if !allowed {
            return Ok(Authorized::Deny);
        }
        let mut fields = answer["context"].clone();
        if !fields.is_object() {
            fields = json!({});
        }
        fields["principalId"] = answer["principalId"].clone();
        Ok(Authorized::Allow(fields))
    }

    /// The connections function with an API Gateway WebSocket proxy event: its status code and body.
    pub async fn connections(&self, event: &Value) -> Result<ProxyResponse, String> {
        match self {
            Functions::InProcess(f) => {
                let request: ApiGatewayWebsocketProxyRequest = serde_json::from_value(event.clone())
                    .map_err(|e| format!("not an API Gateway WebSocket event: {e}"))?;
                let response = ::connections::handle(&f.connections, &request).await;
                Ok(ProxyResponse {
                    status: response.status_code as u16,
                    headers: vec![],
                    body: match response.body {
                        Some(aws_lambda_events::encodings::Body::Text(text)) => text.into_bytes(),
                        Some(aws_lambda_events::encodings::Body::Binary(bytes)) => bytes,
                        _ => vec![],
                    },
                })
            }
            Functions::Lambda(f) => ProxyResponse::from_json(&invoke(&f.client, "connections", event).await?),
        }
    }

    /// The stream processor with a batch: the sequence numbers it reports as failed (an empty one
    /// means the whole batch).
    pub async fn stream_processor(&self, event: &Event) -> Result<Vec<String>, String> {
        match self {
            Functions::InProcess(f) => {
                let outcome = f.processor.process(event).await;
                Ok(outcome.failed_sequence_numbers().into_iter().map(Option::unwrap_or_default).collect())
            }
            Functions::Lambda(f) => {
                let event = serde_json::to_value(event).map_err(|e| e.to_string())?;
                batch_item_failures("the stream processor", &invoke(&f.client, "stream-processor", &event).await?)
            }
        }
    }

    /// The outcomes function: a batch of the transactions table's stream records in, the batch item
    /// failures' sequence numbers out.
    pub async fn outcomes(&self, event: &Event) -> Result<Vec<String>, String> {
        match self {
            Functions::InProcess(f) => {
                let report = twopc_fanout::outcomes::publish(&f.bus, &f.outcome_tables, event).await;
                Ok(report.retry_from.into_iter().collect())
            }
            Functions::Lambda(f) => {
                let event = serde_json::to_value(event).map_err(|e| e.to_string())?;
                batch_item_failures("outcomes", &invoke(&f.client, "outcomes", &event).await?)
            }
        }
    }

    /// One sweep (its age alerts sent to the bus); its report.
    pub async fn sweep(&self) -> Result<Value, String> {
        match self {
            Functions::InProcess(f) => {
                let report = ::sweeper::handle(&f.sweeper, Some(&f.bus)).await.map_err(|e| e.to_string())?;
                serde_json::to_value(report).map_err(|e| e.to_string())
            }
            Functions::Lambda(f) => invoke(&f.client, "sweeper", &events::scheduled_event()).await,
        }
    }

    pub(crate) async fn stop(&self) {
        if let Functions::Lambda(f) = self {
            futures::future::join_all(f.watches.iter().map(Watch::stop)).await;
        }
    }
}

/// The sequence numbers of a stream function's answer (`DynamoDbEventResponse`).
fn batch_item_failures(function: &str, answer: &Value) -> Result<Vec<String>, String> {
    let failures = answer
        .get("batchItemFailures")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{function} answered {answer}, not a response with batchItemFailures"))?;
    Ok(failures
        .iter()
        .map(|f| f.get("itemIdentifier").and_then(Value::as_str).unwrap_or_default().to_owned())
        .collect())
}

impl Lambda {
    fn output_tail(&self) -> String {
        self.watches.iter().map(Watch::output_tail).collect::<Vec<_>>().join("\n")
    }
}

/// Invokes a function through the Lambda Invoke API and reads its JSON answer. `cargo lambda watch`
/// answers a function error with HTTP 500 (the service: 200 and `X-Amz-Function-Error`).
async fn invoke(client: &aws_sdk_lambda::Client, function: &str, payload: &Value) -> Result<Value, String> {
    let bytes = serde_json::to_vec(payload).map_err(|e| e.to_string())?;
    let result = client.invoke().function_name(function).payload(Blob::new(bytes)).send().await;
    let out = match result {
        Ok(out) => out,
        Err(err) => {
            if let Some(raw) = err.raw_response() {
                let body = raw.body().bytes().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
                return Err(format!("{function} failed (HTTP {}): {body}", raw.status().as_u16()));
            }
            return Err(format!(
                "could not invoke {function}: {}",
                aws_smithy_types::error::display::DisplayErrorContext(&err)
            ));
        }
    };
    let body = out.payload().map(|b| b.as_ref().to_vec()).unwrap_or_default();
    if let Some(kind) = out.function_error() {
        return Err(format!("{function} failed ({kind}): {}", String::from_utf8_lossy(&body)));
    }
    serde_json::from_slice(&body).map_err(|e| {
        format!("{function} answered something that is not JSON ({e}): {}", String::from_utf8_lossy(&body))
    })
}

/// A key set of the local stack's own making for its coordinator's age tokens, as `AGE_TOKEN_KEY` takes it.
fn age_token_key() -> String {
    let key = &twopc::age::random_key_set().keys[0];
    json!({"id": key.id, "secret": key.secret}).to_string()
}
