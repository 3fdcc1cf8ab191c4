//! The whole system on one machine, with no AWS account.
//!
//! [`Stack::start`] brings up, in this order: DynamoDB Local (unless an endpoint is given) and every
//! table, created from [`twopc::tables`] so local and deployed tables cannot drift; a
//! Firehose-compatible endpoint that writes the lake as NDJSON files (S3-like keys
//! `YYYY/MM/DD/HH/...`); the WebSocket API's `@connections` management endpoint; the functions
//! (in-process, or as their real binaries under `cargo lambda watch`); the WebSocket API; stream
//! polling that feeds the stream processor as Lambda's event source mapping does; the sweeper on a
//! timer; and last the REST API. [`Stack::stop`] (or dropping the stack) stops everything it started.
//!
//! Every edge speaks the wire format of the service it stands in for: the REST API hands the
//! coordinator an API Gateway REST proxy event, the WebSocket API hands the connections function API
//! Gateway WebSocket proxy events, the stream processor gets the Lambda DynamoDB event and its real
//! Firehose and `@connections` clients talk to local endpoints.

pub mod admin_cli;
pub mod events;
mod functions;
mod invoke_guard;
pub mod issuer;
mod page;
mod ports;
mod rest;
mod same_origin;
pub use rest::{OPENAPI, served_openapi};
mod streams;
pub mod trace;
mod watch;
mod websocket;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use local_services::apigw::ManagementApi;
use local_services::eventbridge::EventBridge;
use local_services::firehose::{Firehose, LakeSink};
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub use functions::{Functions, service_operations};
pub use watch::cargo_lambda_installed;

/// The delivery stream name the stream processor writes to (the lake's file names start with it).
pub const LAKE_STREAM: &str = "twopc-lake";
pub const DEFAULT_DYNAMODB_PORT: u16 = 8000;
pub const DEFAULT_API_PORT: u16 = 3000;
pub const DEFAULT_WEBSOCKET_PORT: u16 = 3001;
/// The services of the default stack: two that run the generic participant, the example inventory,
/// which runs its own (`functions/inventory`, with its `reserve` and `release`), and the example
/// payments, a resource participant (`functions/payments`) against the stand-in payment API.
pub const DEFAULT_SERVICES: [&str; 4] = ["service-a", "service-b", "inventory", "payments"];
/// The stack's access policy unless one is given (`--access-policy`): the templates' default, which
/// names the example wallets' balances as the fields non-admins may credit (infra/template.yaml
/// `AccessPolicy`).
pub const DEFAULT_ACCESS_POLICY: &str = r#"{"allowCredits": {"service-a": ["balance"], "service-b": ["balance"]}}"#;

/// [`DEFAULT_ACCESS_POLICY`], parsed.
pub fn default_access_policy() -> twopc::access::Policy {
    twopc::access::Policy::parse(Some(DEFAULT_ACCESS_POLICY)).expect("the default access policy parses")
}

/// The access policy the stack's functions get: without `--auth` every caller may do everything, the
/// operators' API included; with `--auth jwt` the development issuer's operator group
/// ([`issuer::OPERATOR_GROUP`], in the tokens of `twopc-local token --operator` and of the page's
/// "operator" sign-in) is among its `operatorGroups`, beside any the policy names.
pub fn local_policy(access: &twopc::access::Policy, auth: Auth) -> twopc::access::Policy {
    let mut policy = twopc::access::Policy { unauthenticated_operator: auth == Auth::None, ..access.clone() };
    if auth == Auth::Jwt && !policy.operator_groups.iter().any(|g| g == issuer::OPERATOR_GROUP) {
        policy.operator_groups.push(issuer::OPERATOR_GROUP.to_owned());
    }
    policy
}

/// Region and credentials every local client uses (DynamoDB Local accepts any).
pub const REGION: &str = "us-east-1";

/// How the functions run.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Every function's core in this process (the participants behind `InProcessInvoker`): starts in
    /// a second, and a debugger sees everything.
    InProcess,
    /// Every function as its real binary under `cargo lambda watch`, invoked through the Lambda
    /// Invoke API with `aws-sdk-lambda`: the deployed code path, with reload on change.
    Lambda(LambdaOptions),
}

#[derive(Debug, Clone)]
pub struct LambdaOptions {
    /// The workspace whose binaries `cargo lambda watch` runs.
    pub workspace: PathBuf,
    /// Rebuild and restart a function when its code changes (`cargo lambda watch`'s inner loop);
    /// off in tests, where other edits must not restart the functions mid-test.
    pub reload: bool,
    /// Copy the functions' output (and `cargo lambda`'s) to stderr, each line prefixed by its
    /// deployment; when off, the last lines are kept for error messages only.
    pub echo_output: bool,
    /// The Invoke API of the deployment running coordinator, connections, stream-processor and
    /// sweeper; each participant deployment takes the next port, in service order. 0: free ports.
    pub invoke_port: u16,
}

/// `cargo lambda`'s default invoke port: `cargo lambda invoke` reaches the coordinator there unflagged.
pub const DEFAULT_INVOKE_PORT: u16 = 9000;

/// What to start, where. Every port 0 means a free port.
#[derive(Debug, Clone)]
pub struct Config {
    /// Use this DynamoDB endpoint instead of starting DynamoDB Local.
    pub dynamodb_endpoint: Option<String>,
    /// The port of the DynamoDB Local this stack starts.
    pub dynamodb_port: u16,
    /// Keep DynamoDB Local's data in this folder; None keeps it in memory.
    pub dynamodb_data: Option<PathBuf>,
    pub api_port: u16,
    pub websocket_port: u16,
    /// The `@connections` management endpoint (`http://127.0.0.1:PORT/{stage}`).
    pub connections_port: u16,
    /// The Firehose endpoint.
    pub firehose_port: u16,
    /// The stand-in payment API the payments service charges cards at (started when the stack has it).
    pub payment_api_port: u16,
    pub lake_dir: PathBuf,
    /// Where the outcome events go (the EventBridge bus's stand-in writes NDJSON files here).
    pub events_dir: PathBuf,
    /// Prepended to every table name (tests share one DynamoDB Local).
    pub table_prefix: String,
    /// Participant services; each owns the table `{prefix}{service}-data`.
    pub services: Vec<String>,
    pub sweep_interval: Duration,
    /// The wait before polling a stream shard again after a poll that found nothing; each further
    /// empty poll doubles it, up to 500 ms (`streams::IDLE_CAP`), and records put it back to this
    /// (Lambda polls an idle shard about four times a second).
    pub poll_interval: Duration,
    /// Where each stream's reading position is kept, so that a restart resumes where the last run
    /// stopped; used only when the tables outlive the stack (kept data, or `dynamodb_endpoint`).
    pub checkpoint_dir: Option<PathBuf>,
    /// Where the stream polling writes what it gives up on (Lambda's on-failure records, one JSON
    /// file each), and where [`Stack::replay_dead_letters`] reads them back.
    pub dead_letter_dir: PathBuf,
    /// The API stage (in the `@connections` path and the REST events' request context).
    pub stage: String,
    /// The origin the REST API allows cross-origin callers, as the deployed API's `CorsAllowOrigin`
    /// (`twopc::cors`); None (the default): no CORS. Deployed, `*` is safe because every request
    /// must be signed; the local API checks no signature, so allowing any origin would let any web
    /// page open in a browser on this machine make transfers here.
    pub cors_allow_origin: Option<String>,
    pub mode: Mode,
    /// Put [`example_items`] in the tables (once: a kept stack that has them, or any of them, is left as
    /// it is) before the REST API answers, so that the live page has items from its first load.
    pub example_items: bool,
    /// `--auth jwt`: a development issuer, and both APIs behind the authorizer; `None`: no authorization
    /// (every caller is one without identity, as before).
    pub auth: Auth,
    /// Who may do what (`ACCESS_POLICY`; [`DEFAULT_ACCESS_POLICY`] unless given).
    pub access: twopc::access::Policy,
    /// Open WebSocket connections per principal (`MAX_CONNECTIONS_PER_PRINCIPAL`).
    pub max_connections_per_principal: usize,
    /// Where the development issuer keeps its key (`twopc-local token` reads it there).
    pub auth_dir: PathBuf,
}

/// How the local APIs authorize their callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Auth {
    /// No authorizer: as the stack always was.
    #[default]
    None,
    /// JWTs of a development issuer the stack runs (`twopc-local token` prints one).
    Jwt,
}

impl Default for Config {
    /// The contract's defaults: DynamoDB Local on 8000 (in memory), the REST API on 3000, WebSocket
    /// on 3001, the lake under `.local/lake/` of the workspace, [`DEFAULT_SERVICES`].
    fn default() -> Self {
        Config {
            dynamodb_endpoint: None,
            dynamodb_port: DEFAULT_DYNAMODB_PORT,
            dynamodb_data: None,
            api_port: DEFAULT_API_PORT,
            websocket_port: DEFAULT_WEBSOCKET_PORT,
            connections_port: 0,
            firehose_port: 0,
            payment_api_port: 0,
            lake_dir: local_dir().join("lake"),
            events_dir: local_dir().join("events"),
            table_prefix: String::new(),
            services: DEFAULT_SERVICES.iter().map(|s| s.to_string()).collect(),
            sweep_interval: Duration::from_secs(5),
            poll_interval: Duration::from_millis(100),
            checkpoint_dir: Some(local_dir().join("checkpoints")),
            dead_letter_dir: local_dir().join("dead-letters"),
            stage: "local".to_owned(),
            cors_allow_origin: None,
            mode: Mode::InProcess,
            example_items: false,
            auth: Auth::None,
            access: default_access_policy(),
            max_connections_per_principal: twopc_fanout::connections::DEFAULT_MAX_CONNECTIONS_PER_PRINCIPAL,
            auth_dir: local_dir().join("auth"),
        }
    }
}

impl Config {
    /// Everything on free ports against an existing DynamoDB (tests: `dynamodb_local::shared()`),
    /// tables under a unique prefix, the lake in `lake_dir`.
    /// Its dead letters go next to the lake, in `<lake_dir>.dead-letters`.
    pub fn isolated(dynamodb_endpoint: &str, lake_dir: impl Into<PathBuf>) -> Config {
        let lake_dir: PathBuf = lake_dir.into();
        Config {
            dynamodb_endpoint: Some(dynamodb_endpoint.to_owned()),
            api_port: 0,
            websocket_port: 0,
            dead_letter_dir: lake_dir.with_extension("dead-letters"),
            events_dir: lake_dir.with_extension("events"),
            auth_dir: lake_dir.with_extension("auth"),
            lake_dir,
            table_prefix: format!("s{}-", &uuid::Uuid::new_v4().simple().to_string()[..10]),
            poll_interval: Duration::from_millis(50),
            checkpoint_dir: None,
            sweep_interval: Duration::from_secs(2),
            ..Config::default()
        }
    }

    /// The table names this configuration uses.
    pub fn tables(&self) -> Tables {
        let p = &self.table_prefix;
        Tables {
            transactions: format!("{p}{}", twopc::record::DEFAULT_TRANSACTIONS_TABLE),
            connections: format!("{p}{}", twopc_fanout::connections::DEFAULT_CONNECTIONS_TABLE),
            participants: self.services.iter().map(|s| (s.clone(), format!("{p}{s}-data"))).collect(),
        }
    }
}

/// The workspace the stack runs in (where `cargo lambda watch` runs the functions), found at run
/// time from the current folder; the current folder outside any workspace.
pub fn workspace_dir() -> PathBuf {
    dynamodb_local::workspace_root().unwrap_or_else(|| PathBuf::from("."))
}

/// Where the stack keeps its data, lakes, checkpoints, dead letters and the issuer's key: `$TWOPC_LOCAL_DIR`
/// when set, else `<workspace>/.local` (git-ignored), found at run time, or `./.local` outside any
/// workspace. DynamoDB Local's own install stays in `<workspace>/.local` ([`dynamodb_local::local_dir`]).
pub fn local_dir() -> PathBuf {
    match std::env::var_os(LOCAL_DIR_ENV).filter(|dir| !dir.is_empty()) {
        Some(dir) => std::path::absolute(PathBuf::from(&dir)).unwrap_or_else(|_| PathBuf::from(dir)),
        None => dynamodb_local::local_dir(),
    }
}

/// Names the folder [`local_dir`] answers, for a stack kept apart from the checkout's own.
pub const LOCAL_DIR_ENV: &str = "TWOPC_LOCAL_DIR";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    pub transactions: String,
    pub connections: String,
    /// service → its data table.
    pub participants: BTreeMap<String, String>,
}

/// Where everything answers, once started.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub dynamodb: String,
    /// `http://127.0.0.1:PORT`: `POST /transactions`, `GET /transactions/{id}`.
    pub api: String,
    /// `ws://127.0.0.1:PORT`.
    pub websocket: String,
    /// The `@connections` management endpoint, `http://127.0.0.1:PORT/{stage}`.
    pub connections: String,
    pub firehose: String,
    /// The stand-in payment API, `http://127.0.0.1:PORT` (when the stack has the payments service).
    pub payment_api: Option<String>,
    pub lake_dir: PathBuf,
    /// The outcome events (NDJSON files, EventBridge's envelope), `.local/events/` by default.
    pub events_dir: PathBuf,
    /// The EventBridge endpoint the outcomes function and the sweeper send them to.
    pub events: String,
    /// The folder of dead letters (on-failure records of what the stream polling gave up on).
    pub dead_letter_dir: PathBuf,
    pub tables: Tables,
    /// Lambda mode: each `cargo lambda watch` (deployment name, Invoke API URL, its functions).
    pub lambda: Vec<(String, String, Vec<String>)>,
    /// `--auth jwt`: the development issuer's URL (its JWKS under `/.well-known/jwks.json`).
    pub issuer: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "port {port} on 127.0.0.1 is already in use, wanted for {what}: stop what holds it (another `twopc-local`?) or choose another port with {flag}"
    )]
    PortInUse { port: u16, what: &'static str, flag: &'static str },
    #[error(transparent)]
    DynamoDbLocal(#[from] dynamodb_local::Error),
    #[error("DynamoDB at {endpoint}: {message}")]
    DynamoDb { endpoint: String, message: String },
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("{0}")]
    Lambda(String),
    #[error(transparent)]
    DeadLetters(#[from] twopc_fanout::replay::SourceError),
    #[error(
        "the data folder {} is in use by another twopc-local{}: stop it first, or give this one another folder (--db-path, or --in-memory)",
        dir.display(), pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    DataInUse { dir: PathBuf, pid: Option<u32> },
    #[error("the sweep failed: {0}")]
    Sweep(String),
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// `<dir>/twopc-local.lock` (the folder created), opened and `flock`ed in `mode` without waiting: the
/// file and whether the lock was taken. Released when the process ends however it ends (no stale lock
/// after a crash).
fn lock_file(dir: &std::path::Path, mode: libc::c_int) -> Result<(std::fs::File, bool), Error> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(dir).map_err(io_error(format!("creating {}", dir.display())))?;
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_error(format!("opening {}", path.display())))?;
    // SAFETY: flock on a descriptor this function owns; no memory is involved.
    let taken = unsafe { libc::flock(file.as_raw_fd(), mode | libc::LOCK_NB) } == 0;
    Ok((file, taken))
}

const LOCK_FILE: &str = "twopc-local.lock";

/// A data folder held by one process: an exclusive lock on `<dir>/twopc-local.lock`, which names the
/// process holding it.
pub struct DataLock {
    _file: std::fs::File,
}

impl DataLock {
    pub const FILE: &str = LOCK_FILE;

    /// Takes the folder (creating it), or says which process holds it.
    pub fn acquire(dir: &std::path::Path) -> Result<DataLock, Error> {
        use std::io::{Read, Seek, Write};
        let (mut file, taken) = lock_file(dir, libc::LOCK_EX)?;
        if !taken {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(Error::DataInUse { dir: dir.to_path_buf(), pid: holder.trim().parse().ok() });
        }
        let _ = file.set_len(0).and_then(|_| file.rewind()).and_then(|_| write!(file, "{}", std::process::id()));
        Ok(DataLock { _file: file })
    }
}

/// Held by every `twopc-local up`, `demo` and `replay` of a checkout while it runs (shared: several may
/// run at once, on other data folders and ports), and by `reset` (exclusive), so that `reset` never
/// deletes the lake, the checkpoints or the issuer's key under a running stack, its data in memory
/// or not.
pub struct CheckoutLock {
    _file: std::fs::File,
}

impl CheckoutLock {
    /// A running stack's share of `local` (`.local/`), taken at its start.
    pub fn shared(local: &std::path::Path) -> Result<CheckoutLock, Error> {
        match lock_file(local, libc::LOCK_SH)? {
            (file, true) => Ok(CheckoutLock { _file: file }),
            (_, false) => Err(Error::Io {
                what: format!("locking {}", local.join(LOCK_FILE).display()),
                source: std::io::Error::other("a reset of this checkout is running"),
            }),
        }
    }

    /// `reset`'s: `None` while any stack of this checkout runs.
    pub fn exclusive(local: &std::path::Path) -> Result<Option<CheckoutLock>, Error> {
        let (file, taken) = lock_file(local, libc::LOCK_EX)?;
        Ok(taken.then_some(CheckoutLock { _file: file }))
    }
}

/// A running stack. Stops everything it started on [`Stack::stop`] or drop.
pub struct Stack {
    endpoints: Endpoints,
    dynamodb: Option<dynamodb_local::DynamoDbLocal>,
    functions: Arc<Functions>,
    tasks: Tasks,
    pollers: Option<Pollers>,
    registry: websocket::Registry,
    /// What the replay of dead letters reads and runs: the folder, the Streams client, the fan-out.
    replay: Replay,
    firehose: Firehose,
    _event_bridge: EventBridge,
    _outcome_log: local_services::logs::Logs,
    payment_api: Option<Arc<local_services::payments::PaymentApi>>,
    issuer: Option<issuer::DevIssuer>,
    _management: ManagementApi,
    started_in: Duration,
    // Held for the stack's life: a second stack on the same data folder is refused.
    _data_lock: Option<DataLock>,
}

/// Static credentials and region for every local client (each sets its own endpoint).
pub fn local_sdk_config() -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(REGION))
        .credentials_provider(aws_sdk_dynamodb::config::SharedCredentialsProvider::new(
            aws_sdk_dynamodb::config::Credentials::new("local", "local", None, None, "twopc-local"),
        ))
        .build()
}

impl Stack {
    /// Starts everything and returns once every endpoint answers. Checks every fixed port first, so
    /// a port in use fails fast with [`Error::PortInUse`] naming it, before anything is started.
    pub async fn start(config: Config) -> Result<Stack, Error> {
        let started = Instant::now();
        let tables = config.tables();

        // 1. Ports: our own servers' listeners are bound now and kept; the ports of processes we
        //    start (DynamoDB Local, cargo lambda watch) are probed and released.
        if config.dynamodb_endpoint.is_none() && config.dynamodb_port != 0 {
            ports::check(config.dynamodb_port, "DynamoDB Local", "--dynamodb-port (or --dynamodb-endpoint)")?;
        }
        let api = ports::bind(config.api_port, "the REST API", "--api-port").await?;
        let websocket = ports::bind(config.websocket_port, "the WebSocket API", "--ws-port").await?;
        if config.connections_port != 0 {
            ports::check(config.connections_port, "the @connections endpoint", "--connections-port")?;
        }
        if let Mode::Lambda(options) = &config.mode
            && options.invoke_port != 0
        {
            for i in 0..=config.services.len() as u16 {
                ports::check(options.invoke_port + i, "a cargo lambda watch Invoke API", "--invoke-port")?;
            }
        }
        if config.payment_api_port != 0 {
            ports::check(config.payment_api_port, "the payment API", "--payment-api-port")?;
        }
        if config.firehose_port != 0 {
            ports::check(config.firehose_port, "the Firehose endpoint", "--firehose-port")?;
        }

        // 2. DynamoDB and the tables: kept data belongs to one stack at a time (two DynamoDB Local
        //    processes on one data file corrupt it).
        let data_lock = match (&config.dynamodb_endpoint, &config.dynamodb_data) {
            (None, Some(dir)) => Some(DataLock::acquire(dir)?),
            _ => None,
        };
        let mut dynamodb = None;
        let dynamodb_endpoint = match &config.dynamodb_endpoint {
            Some(endpoint) => endpoint.clone(),
            None => {
                let local = dynamodb_local::DynamoDbLocal::start(dynamodb_local::Options {
                    port: Some(config.dynamodb_port).filter(|p| *p != 0),
                    db_path: config.dynamodb_data.clone(),
                })
                .await
                .map_err(|e| match e {
                    dynamodb_local::Error::PortInUse { port } => Error::PortInUse {
                        port,
                        what: "DynamoDB Local",
                        flag: "--dynamodb-port (or --dynamodb-endpoint)",
                    },
                    other => other.into(),
                })?;
                let endpoint = local.endpoint().to_owned();
                info!(endpoint = %endpoint, after_ms = started.elapsed().as_millis() as u64, "DynamoDB Local is up");
                dynamodb = Some(local);
                endpoint
            }
        };
        let sdk = local_sdk_config();
        let ddb = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&sdk).endpoint_url(&dynamodb_endpoint).build(),
        );
        let created = create_tables(&ddb, &tables, &dynamodb_endpoint).await?;

        // 3. The fan-out's edges: Firehose writing the lake, and @connections over live WebSockets.
        std::fs::create_dir_all(&config.lake_dir)
            .map_err(io_error(format!("creating the lake folder {}", config.lake_dir.display())))?;
        let firehose =
            Firehose::start_on(LakeSink::new(&config.lake_dir), &format!("127.0.0.1:{}", config.firehose_port))
                .await
                .map_err(|e| port_error(e, config.firehose_port, "the Firehose endpoint", "--firehose-port"))?;
        // The outcomes bus: each event a line of a file under `events_dir`, as the lake's records are.
        std::fs::create_dir_all(&config.events_dir)
            .map_err(io_error(format!("creating the events folder {}", config.events_dir.display())))?;
        let event_bridge = EventBridge::start(LakeSink::new(&config.events_dir))
            .await
            .map_err(io_error("starting the EventBridge endpoint".to_owned()))?;
        let outcome_log = local_services::logs::Logs::start(&config.events_dir, functions::EVENT_BUS)
            .await
            .map_err(io_error("starting the CloudWatch Logs endpoint".to_owned()))?;
        let registry = websocket::Registry::default();
        let management =
            ManagementApi::start_on(registry.clone(), &config.stage, &format!("127.0.0.1:{}", config.connections_port))
                .await
                .map_err(|e| {
                    port_error(e, config.connections_port, "the @connections endpoint", "--connections-port")
                })?;

        // The payments service's payment API: a stand-in over HTTP, as an external API would be.
        let payment_api = match tables.participants.contains_key(payments::SERVICE) {
            true => Some(Arc::new(
                local_services::payments::PaymentApi::start_on(&format!("127.0.0.1:{}", config.payment_api_port))
                    .await
                    .map_err(|e| port_error(e, config.payment_api_port, "the payment API", "--payment-api-port"))?,
            )),
            false => None,
        };

        // 4. The functions, and with `--auth jwt` the development issuer their authorizer trusts (named
        //    by the REST API's own address, which serves its JWKS).
        let api_addr = local_addr(&api)?;
        let issuer = match config.auth {
            Auth::None => None,
            Auth::Jwt => Some(
                issuer::DevIssuer::create(&config.auth_dir, &format!("http://{api_addr}{}", issuer::ISSUER_PATH))
                    .map_err(|message| Error::Io { what: message, source: std::io::Error::other("issuer") })?,
            ),
        };
        let wiring = functions::Wiring {
            access: local_policy(&config.access, config.auth),
            jwt: issuer.as_ref().map(|i| twopc::jwt::JwtSettings::new(&i.issuer, &i.audience, None)),
            max_connections_per_principal: config.max_connections_per_principal,
            payment_api_url: payment_api.as_ref().map(|api| api.url().to_owned()),
            sdk: sdk.clone(),
            dynamodb_endpoint: dynamodb_endpoint.clone(),
            tables: tables.clone(),
            firehose_url: firehose.url().to_owned(),
            events_url: event_bridge.url().to_owned(),
            logs_url: outcome_log.url().to_owned(),
            stream_name: LAKE_STREAM.to_owned(),
            management_endpoint: management.endpoint().to_owned(),
            cors_allow_origin: config.cors_allow_origin.clone(),
            dead_letter_dir: config.dead_letter_dir.clone(),
        };
        let (functions, lambda) = match &config.mode {
            Mode::InProcess => (Functions::in_process(&wiring, ddb.clone()), vec![]),
            Mode::Lambda(options) => {
                let (functions, lambda) = Functions::lambda(&wiring, options).await?;
                (functions, lambda)
            }
        };
        let functions = Arc::new(functions);

        // 5. Stream polling (as the event source mappings of the participant tables and the
        //    transactions table), the WebSocket API, the sweeper, then the REST API.
        let streams = aws_sdk_dynamodbstreams::Client::from_conf(
            aws_sdk_dynamodbstreams::config::Builder::from(&sdk).endpoint_url(&dynamodb_endpoint).build(),
        );
        let mut streamed: Vec<&String> = tables.participants.values().collect();
        streamed.push(&tables.transactions);
        let mut pollers = Vec::new();
        let dead_letters = Arc::new(twopc_fanout::replay::DirectoryDeadLetters::new(config.dead_letter_dir.clone()));
        let mut outcome_pollers = Vec::new();
        for table in streamed {
            let arn = ddb
                .describe_table()
                .table_name(table)
                .send()
                .await
                .ok()
                .and_then(|t| t.table.and_then(|t| t.latest_stream_arn))
                .ok_or_else(|| Error::DynamoDb {
                    endpoint: dynamodb_endpoint.clone(),
                    message: format!("table {table} has no stream"),
                })?;
            // A table made now is read from its start; a kept one from its checkpoint, or from now
            // on when it has none.
            let kept_tables = config.dynamodb_endpoint.is_some() || config.dynamodb_data.is_some();
            let checkpoint_path = config
                .checkpoint_dir
                .as_ref()
                .filter(|_| kept_tables)
                .map(|dir| streams::Checkpoint::path(dir, table, &arn));
            let start_at = if created.contains(table) { streams::StartAt::Beginning } else { streams::StartAt::Latest };
            pollers.push(
                streams::Poller::new(
                    streams.clone(),
                    table.clone(),
                    arn.clone(),
                    start_at.clone(),
                    checkpoint_path.clone(),
                    functions.clone(),
                    config.poll_interval,
                )
                .with_dead_letters(dead_letters.clone()),
            );
            if *table == tables.transactions {
                // Its own checkpoint: the two readers move on the stream each at its own pace. What it gives
                // up on is logged (deployed: its own queue; `twopc-local replay` replays the fan-out's only).
                let checkpoint_path = checkpoint_path.map(|path| path.with_extension("outcomes.json"));
                outcome_pollers.push(streams::Poller::new(
                    streams.clone(),
                    table.clone(),
                    arn,
                    start_at,
                    checkpoint_path,
                    Arc::new(streams::Outcomes(functions.clone())),
                    config.poll_interval,
                ));
            }
        }
        if config.example_items {
            put_example_items(&functions, &tables, &config.stage).await;
        }
        let websocket_addr = local_addr(&websocket)?;
        let same_origin = same_origin::SameOrigin::new(api_addr, websocket_addr, config.cors_allow_origin.clone());
        let pollers = Pollers::start(pollers, outcome_pollers)?;
        let mut tasks = Tasks::default();
        tasks.0.push(tokio::spawn(websocket::serve(
            websocket,
            registry.clone(),
            functions.clone(),
            config.stage.clone(),
            issuer.is_some(),
            same_origin.clone(),
        )));
        tasks.0.push(tokio::spawn(sweep_loop(functions.clone(), config.sweep_interval)));
        let page = page::Page {
            websocket: format!("ws://{websocket_addr}"),
            tables: tables.participants.clone(),
            lake_dir: config.lake_dir.clone(),
            events_dir: config.events_dir.clone(),
            dynamodb: ddb.clone(),
            payment_api: payment_api.as_ref().map(|api| api.url().to_owned()),
            http: twopc::https::client_builder().no_proxy().build().map_err(|e| Error::Io {
                what: "making the page's HTTP client".into(),
                source: std::io::Error::other(e),
            })?,
            jwt: issuer.is_some(),
        };
        let operations = service_operations(tables.participants.keys());
        let rest = rest::Api::new(
            functions.clone(),
            config.stage.clone(),
            config.cors_allow_origin.clone(),
            page,
            &operations,
        )
        .with_issuer(issuer.clone())
        .with_same_origin(same_origin);
        tasks.0.push(tokio::spawn(rest::serve(api, rest)));

        let endpoints = Endpoints {
            dynamodb: dynamodb_endpoint,
            api: format!("http://{api_addr}"),
            websocket: format!("ws://{websocket_addr}"),
            connections: management.endpoint().to_owned(),
            firehose: firehose.url().to_owned(),
            payment_api: payment_api.as_ref().map(|api| api.url().to_owned()),
            lake_dir: config.lake_dir.clone(),
            events_dir: config.events_dir.clone(),
            events: event_bridge.url().to_owned(),
            dead_letter_dir: config.dead_letter_dir.clone(),
            tables,
            lambda,
            issuer: issuer.as_ref().map(|i| i.issuer.clone()),
        };
        let replay = Replay {
            dir: config.dead_letter_dir.clone(),
            streams,
            processor: functions::stream_processor(&wiring, ddb.clone()),
        };
        Ok(Stack {
            endpoints,
            dynamodb,
            functions,
            tasks,
            pollers: Some(pollers),
            registry,
            replay,
            firehose,
            _event_bridge: event_bridge,
            _outcome_log: outcome_log,
            payment_api,
            issuer,
            _management: management,
            started_in: started.elapsed(),
            _data_lock: data_lock,
        })
    }

    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// `--auth jwt`: the development issuer (tokens for any user, and bad ones for tests).
    pub fn issuer(&self) -> Option<&issuer::DevIssuer> {
        self.issuer.as_ref()
    }

    /// How long [`Stack::start`] took.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The local Firehose endpoint the lake is written through (tests inject its faults).
    pub fn firehose(&self) -> &Firehose {
        &self.firehose
    }

    /// The stand-in payment API (tests inject its faults and read its authorizations).
    pub fn payment_api(&self) -> Option<&local_services::payments::PaymentApi> {
        self.payment_api.as_deref()
    }

    /// Replays every dead letter in the dead-letter folder (what the stream polling gave up on)
    /// through the stream processor's core, as the deployed function's `replay-dead-letters` does from
    /// its queue: each message's range is read back from the table's stream and run through the same
    /// fan-out; a message whose records all went through is deleted, the others stay.
    pub async fn replay_dead_letters(&self) -> Result<twopc_fanout::replay::ReplayReport, Error> {
        let source = twopc_fanout::replay::DirectoryDeadLetters::new(&self.replay.dir);
        let max = source.files().map_err(io_error(format!("listing {}", self.replay.dir.display())))?.len();
        Ok(twopc_fanout::replay::replay(&source, &self.replay.streams, &self.replay.processor, max.max(1)).await?)
    }

    /// Runs one sweep now, as the sweeper's timer (the deployed EventBridge schedule) would, and returns
    /// its report (`{"committed", "aborted", "stuck", "locksReleased", ...}`): the demo ends an expired
    /// hold without waiting for the next tick.
    pub async fn sweep(&self) -> Result<serde_json::Value, Error> {
        self.functions.sweep().await.map_err(Error::Sweep)
    }

    /// Whether this stack started DynamoDB Local itself.
    pub fn owns_dynamodb(&self) -> bool {
        self.dynamodb.is_some()
    }

    /// Stops the servers, the pollers and the sweeper, the `cargo lambda watch` processes (and their
    /// functions) and DynamoDB Local, waiting for the processes to exit.
    pub async fn stop(mut self) {
        // Close the WebSocket connections first, so that their `$disconnect` still reaches the
        // connections function.
        self.registry.close_all();
        self.registry.wait_idle(Duration::from_secs(3)).await;
        std::mem::take(&mut self.tasks);
        if let Some(pollers) = self.pollers.take() {
            pollers.stop().await;
        }
        self.functions.stop().await;
        if let Some(dynamodb) = self.dynamodb.take() {
            dynamodb.stop().await;
        }
    }
}

struct Replay {
    dir: PathBuf,
    streams: aws_sdk_dynamodbstreams::Client,
    processor: functions::Processor,
}

/// Tasks aborted when dropped (a stack that fails to start half-way leaves nothing running).
#[derive(Default)]
struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

fn port_error(e: std::io::Error, port: u16, what: &'static str, flag: &'static str) -> Error {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        Error::PortInUse { port, what, flag }
    } else {
        Error::Io { what: format!("starting {what} on port {port}"), source: e }
    }
}

fn local_addr(listener: &tokio::net::TcpListener) -> Result<SocketAddr, Error> {
    listener.local_addr().map_err(io_error("reading a listener's address"))
}

/// Creates every table that is missing, from the specs in `twopc::tables`. Returns the ones it created.
async fn create_tables(
    client: &aws_sdk_dynamodb::Client,
    tables: &Tables,
    endpoint: &str,
) -> Result<Vec<String>, Error> {
    use twopc::tables;
    let mut specs =
        vec![tables::transactions_table(&tables.transactions), tables::connections_table(&tables.connections)];
    specs.extend(tables.participants.values().map(|t| tables::participant_table(t)));
    let failed = |e: &dyn std::fmt::Display| Error::DynamoDb { endpoint: endpoint.to_owned(), message: e.to_string() };
    let existing = client
        .list_tables()
        .into_paginator()
        .items()
        .send()
        .collect::<Result<Vec<String>, _>>()
        .await
        .map_err(|e| failed(&aws_smithy_types::error::display::DisplayErrorContext(&e)))?;
    let mut created = Vec::new();
    for spec in &specs {
        spec.create_if_missing(client).await.map_err(|e| failed(&e))?;
        if !existing.contains(&spec.name) {
            created.push(spec.name.clone());
        }
    }
    Ok(created)
}

/// The stream pollers, one task per table stream. [`Pollers::stop`] drains the streams first;
/// dropping this stops them at once (a crash, as far as the streams can tell).
struct Pollers {
    task: tokio::task::JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Pollers {
    fn start(
        pollers: Vec<streams::Poller>,
        outcomes: Vec<streams::Poller<streams::Outcomes>>,
    ) -> Result<Pollers, Error> {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let fan_out = futures::future::join_all(pollers.into_iter().map(|poller| poller.run(stopped.clone())));
            let outcomes = futures::future::join_all(outcomes.into_iter().map(|poller| poller.run(stopped.clone())));
            futures::future::join(fan_out, outcomes).await;
        });
        Ok(Pollers { task, stop })
    }

    /// Delivers what the streams hold and keeps their checkpoints, then stops.
    async fn stop(mut self) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(streams::DRAIN_TIMEOUT + Duration::from_secs(5), &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

impl Drop for Pollers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The items `up` starts a new stack with, for the services it has: SKUs of the example inventory
/// (`lamp` and `chair` active, `desk` not) and a wallet at each of the other two services.
pub fn example_items() -> Vec<(&'static str, &'static str, serde_json::Value)> {
    use serde_json::json;
    vec![
        (inventory::SERVICE, "lamp", inventory::sku("Lamp", 10, true)),
        (inventory::SERVICE, "chair", inventory::sku("Chair", 4, true)),
        (inventory::SERVICE, "desk", inventory::sku("Desk", 2, false)),
        ("service-a", "alice", json!({"owner": "Alice", "balance": 100})),
        ("service-b", "bob", json!({"owner": "Bob", "balance": 20})),
    ]
}

/// The Idempotency-Key of the transaction that puts the example items: a restart on kept data finds it
/// done and writes nothing.
const EXAMPLES_KEY: &str = "twopc-local-example-items";

/// Puts [`example_items`] with one transaction through the coordinator (`put` with `ifNotExists`, so
/// that nothing someone wrote is replaced: if any exists, none is put). A failure is logged, not fatal.
async fn put_example_items(functions: &Functions, tables: &Tables, stage: &str) {
    use serde_json::json;
    let mut participants: BTreeMap<&str, Vec<serde_json::Value>> = BTreeMap::new();
    for (service, id, data) in example_items() {
        if tables.participants.contains_key(service) {
            participants.entry(service).or_default().push(json!({
                "op": "put", "key": {"entityId": id}, "data": data, "ifNotExists": true,
            }));
        }
    }
    if participants.is_empty() {
        return;
    }
    let parts: Vec<serde_json::Value> = participants
        .into_iter()
        .map(|(service, operations)| json!({"service": service, "operations": operations}))
        .collect();
    let body = json!({"participants": parts}).to_string();
    let request = events::HttpRequest {
        method: "POST",
        path: "/transactions",
        query: None,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("idempotency-key".into(), EXAMPLES_KEY.into()),
        ],
        body: body.as_bytes(),
        source_ip: "127.0.0.1".into(),
    };
    let event = events::rest_proxy_event(&request, "/transactions", None, stage, "127.0.0.1");
    match functions.coordinator(&event).await {
        Ok(answer) if answer.status == 200 => info!("the example items are in (lamp, chair and desk, alice, bob)"),
        Ok(answer) if answer.status == 409 => {
            info!("the example items were not put: some of them exist already (kept data)")
        }
        Ok(answer) => {
            warn!(status = answer.status, body = %String::from_utf8_lossy(&answer.body), "putting the example items failed")
        }
        Err(e) => warn!(error = %e, "putting the example items failed"),
    }
}

/// The sweeper on a timer, as the EventBridge schedule runs it.
async fn sweep_loop(functions: Arc<Functions>, every: Duration) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        match functions.sweep().await {
            Ok(report) => {
                let quiet = report.as_object().is_some_and(|o| o.values().all(|v| v.as_u64() == Some(0)));
                if !quiet {
                    info!(%report, "the sweeper recovered something");
                }
            }
            Err(e) => warn!(error = %e, "sweep failed"),
        }
    }
}
