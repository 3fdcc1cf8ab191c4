//! `twopc-local`: the whole system on one machine.
//!
//! - `twopc-local up`: start it and keep it running until Ctrl-C.
//! - `twopc-local demo`: start it, run a few transfers, orders and held orders with a WebSocket client
//!   watching, show what happened (phases, votes, outcomes, pushes, lake lines), stop.
//! - `twopc-local replay`: start it on the kept data as `up` does, replay the dead letters (what the
//!   stream polling gave up on, under .local/dead-letters/) through the stream processor's core, print
//!   the answer, stop.
//! - `twopc-local reset`: delete what `up` and `demo` kept (DynamoDB Local's data, the lakes, the
//!   stream checkpoints).
//! - `twopc-local sign FILE`: print a participant message signed now with the local development key,
//!   for `cargo lambda invoke` (a participant acts only on a message the coordinator or the sweeper
//!   signed, and only for a while after it was signed).
//! - `twopc-local token --sub alice [--admin] [--operator]`: print a token of the development issuer the running
//!   stack started with `--auth jwt` runs (`Authorization: Bearer <token>`, or `?token=` on the
//!   WebSocket); refused when no such stack runs, since the next one makes a new key pair.
//! - `twopc-local subscribe TOPIC...`: follow topics on the WebSocket API and print each message.
//! - `twopc-local admin list|show|stuck|retry|abort`: the operators' API, on the local stack or (with
//!   `--api URL`) a deployed one.

mod demo;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use local_stack::{Config, Endpoints, LambdaOptions, Mode, Stack};

#[derive(Parser)]
#[command(name = "twopc-local", version, about = "The two-phase-commit system on one machine: no AWS account needed")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the stack and keep it running; Ctrl-C stops everything it started.
    Up(StackArgs),
    /// Start the stack, run a committed, a refused and two conflicting transfers, orders, and held orders
    /// (one approved, one rejected, one that expires), show what happened, stop.
    Demo(StackArgs),
    /// Start the stack on the kept data (as `up`), replay the dead letters of .local/dead-letters/
    /// (ranges of the streams the polling gave up on) through the stream processor, print the answer, stop.
    Replay(StackArgs),
    /// Delete what the stack keeps under .local/: DynamoDB Local's data, the lakes and the outcome events
    /// (`up`'s and the demo's), the stream checkpoints, the dead letters, the development issuer's key (auth/).
    /// Refused while a stack uses the data: stop it first.
    Reset,
    /// Print the participant message in FILE (JSON, as `events/participant-*.json`) signed now with the
    /// local development key of SERVICE, as the coordinator signs what it sends; its signature, if it has
    /// one, is replaced.
    Sign {
        /// A participant message (`-` reads standard input).
        file: PathBuf,
        /// The participant service it is for.
        #[arg(long, default_value = "service-a")]
        service: String,
    },
    /// Print a token of the development issuer of the stack running with `--auth jwt` (its key is
    /// under .local/auth/): `Authorization: Bearer <token>` on the REST API, `?token=<token>` (or the
    /// same header) on the WebSocket. Refused when no such stack runs: each `up --auth jwt` makes a
    /// new key pair, which refuses the tokens of the one before.
    Token {
        /// The user: the token's `sub`, which owns the items whose entityId is it or starts with `<sub>#`.
        #[arg(long)]
        sub: String,
        /// An admin (in the `admins` group): may do everything but the operators' API.
        #[arg(long)]
        admin: bool,
        /// An operator (in the `operators` group, which the stack's policy names under --auth jwt): may
        /// use the operators' API (`/admin`, `twopc-local admin`). Not an admin unless --admin too.
        #[arg(long)]
        operator: bool,
        /// How long the token is valid.
        #[arg(long, default_value_t = 3600)]
        ttl_secs: u64,
    },
    /// The operators' API (`/admin`): list open transactions, show one, the stuck view, retry a decided
    /// one, abort an undecided one. Against the running local stack, or a deployed API with `--api URL`
    /// (SigV4 from the default AWS credentials, or `--token`).
    Admin(local_stack::admin_cli::AdminArgs),
    /// Follow TOPICs on the WebSocket API (`entity:<table>:<entityId>`, `tx:<transactionId>`) and print
    /// each message it sends, one JSON line each, until Ctrl-C: the subscribe answer, then every
    /// commit and transaction push.
    Subscribe {
        /// The topics to follow.
        #[arg(required = true, value_name = "TOPIC")]
        topics: Vec<String>,
        /// Port of the WebSocket API (`up --ws-port`).
        #[arg(long = "ws-port", default_value_t = local_stack::DEFAULT_WEBSOCKET_PORT)]
        websocket_port: u16,
        /// A token for a stack started with `--auth jwt` (`twopc-local token --sub alice`).
        #[arg(long)]
        token: Option<String>,
    },
}

/// How the local APIs authorize their callers.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AuthArg {
    /// No authorization: every caller may do everything.
    None,
    /// JWTs of a development issuer the stack runs (`twopc-local token` prints one); the access policy applies.
    Jwt,
}

#[derive(Args, Clone)]
struct StackArgs {
    /// Use this DynamoDB endpoint instead of starting DynamoDB Local.
    #[arg(long, value_name = "URL")]
    dynamodb_endpoint: Option<String>,
    /// Port of the DynamoDB Local the stack starts.
    #[arg(long, default_value_t = local_stack::DEFAULT_DYNAMODB_PORT)]
    dynamodb_port: u16,
    /// Keep DynamoDB Local's data in this folder [`up`: .local/dynamodb-data; `demo`: in memory].
    #[arg(long, value_name = "DIR", conflicts_with = "in_memory")]
    db_path: Option<PathBuf>,
    /// Keep DynamoDB Local's data in memory only.
    #[arg(long)]
    in_memory: bool,
    /// Port of the REST API.
    #[arg(long, default_value_t = local_stack::DEFAULT_API_PORT)]
    api_port: u16,
    /// Answer cross-origin callers from ORIGIN as the deployed API does (`*`: any, its default). Off
    /// unless given: the local API checks no signature, so any origin could make transfers here.
    #[arg(long, value_name = "ORIGIN", default_value = "")]
    cors_allow_origin: String,
    /// Port of the WebSocket API.
    #[arg(long = "ws-port", default_value_t = local_stack::DEFAULT_WEBSOCKET_PORT)]
    websocket_port: u16,
    /// Port of the `@connections` management endpoint [default: a free port].
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    connections_port: u16,
    /// Port of the Firehose endpoint [default: a free port].
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    firehose_port: u16,
    /// Port of the stand-in payment API the payments service charges at [default: a free port].
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    payment_api_port: u16,
    /// Folder of the lake (NDJSON files under YYYY/MM/DD/HH/) [default: `up`: .local/lake of the
    /// workspace; `demo`: .local/demo-lake].
    #[arg(long, value_name = "DIR")]
    lake_dir: Option<PathBuf>,
    /// Seconds between sweeps.
    #[arg(long, default_value_t = 5)]
    sweep_secs: u64,
    /// Prefix for every table name.
    #[arg(long, default_value = "")]
    table_prefix: String,
    /// Run every function as its real binary under `cargo lambda watch` (rebuilt when its code changes).
    #[arg(long)]
    lambda: bool,
    /// Authorize the callers of both APIs: `jwt` runs a development issuer and checks its tokens
    /// (`twopc-local token --sub alice` prints one) and the access policy, as a JwtIssuer deployment does.
    #[arg(long, value_enum, default_value = "none")]
    auth: AuthArg,
    /// The access policy (ACCESS_POLICY's JSON) [default: the templates' default, which lets non-admins
    /// credit the balance of service-a's and service-b's items].
    #[arg(long, value_name = "JSON", value_parser = |text: &str| twopc::access::Policy::parse(Some(text)))]
    access_policy: Option<twopc::access::Policy>,
    /// With --lambda: do not rebuild and restart functions when their code changes (without
    /// --lambda nothing is rebuilt: it changes nothing).
    #[arg(long)]
    no_reload: bool,
    /// With --lambda: the Invoke API of coordinator, connections, stream-processor and sweeper; the
    /// participants of service-a, service-b, inventory and payments take the next four ports (0: free
    /// ports). Without --lambda no Invoke API runs, and it changes nothing.
    #[arg(long, default_value_t = local_stack::DEFAULT_INVOKE_PORT)]
    invoke_port: u16,
}

impl StackArgs {
    /// `up` keeps its data and its lake; the demo runs in memory and keeps its lake apart, so that
    /// it never mixes its lines into `up`'s.
    fn config(&self, keep_data_by_default: bool, echo_function_output: bool) -> Config {
        let dynamodb_data = match (&self.db_path, self.in_memory) {
            (Some(path), _) => Some(path.clone()),
            (None, true) => None,
            (None, false) if keep_data_by_default => Some(local_stack::local_dir().join(DATA)),
            (None, false) => None,
        };
        let defaults = Config::default();
        Config {
            dynamodb_endpoint: self.dynamodb_endpoint.clone(),
            dynamodb_port: self.dynamodb_port,
            dynamodb_data,
            api_port: self.api_port,
            websocket_port: self.websocket_port,
            connections_port: self.connections_port,
            firehose_port: self.firehose_port,
            payment_api_port: self.payment_api_port,
            lake_dir: self.lake_dir.clone().unwrap_or_else(|| {
                if keep_data_by_default { defaults.lake_dir.clone() } else { local_stack::local_dir().join(DEMO_LAKE) }
            }),
            events_dir: if keep_data_by_default {
                defaults.events_dir.clone()
            } else {
                local_stack::local_dir().join(DEMO_EVENTS)
            },
            table_prefix: self.table_prefix.clone(),
            cors_allow_origin: Some(self.cors_allow_origin.clone()).filter(|origin| !origin.is_empty()),
            sweep_interval: Duration::from_secs(self.sweep_secs.max(1)),
            // `up` starts with items to show and order; the demo makes its own.
            example_items: keep_data_by_default,
            access: self.access_policy.clone().unwrap_or_else(local_stack::default_access_policy),
            auth: match self.auth {
                AuthArg::None => local_stack::Auth::None,
                AuthArg::Jwt => local_stack::Auth::Jwt,
            },
            mode: if self.lambda {
                Mode::Lambda(LambdaOptions {
                    workspace: local_stack::workspace_dir(),
                    reload: !self.no_reload,
                    echo_output: echo_function_output,
                    invoke_port: self.invoke_port,
                })
            } else {
                Mode::InProcess
            },
            ..defaults
        }
    }
}

/// The demo's lake, under .local/.
const DEMO_LAKE: &str = "demo-lake";
/// The demo's outcome events, under .local/.
const DEMO_EVENTS: &str = "demo-events";
/// What `up` keeps under .local/ (besides DynamoDB Local's own install, which `reset` leaves).
/// DynamoDB Local's data last: its folder holds the lock that keeps a stack from starting meanwhile.
const KEPT: [&str; 8] = ["lake", DEMO_LAKE, "events", DEMO_EVENTS, "checkpoints", "dead-letters", AUTH, DATA];
const DATA: &str = "dynamodb-data";
/// The development issuer's key pair (`up --auth jwt`).
const AUTH: &str = "auth";

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a Tokio runtime");
    // Every command that runs a stack holds its share of the checkout's .local/ meanwhile (`reset` waits
    // for none: it refuses).
    let _running = match &cli.command {
        Command::Up(_) | Command::Demo(_) | Command::Replay(_) => {
            match local_stack::CheckoutLock::shared(&local_stack::local_dir()) {
                Ok(lock) => Some(lock),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        _ => None,
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Up(args) => up(args).await,
            Command::Demo(args) => demo::run(args.config(false, false)).await,
            Command::Replay(args) => replay(args).await,
            Command::Reset => reset(),
            Command::Sign { file, service } => sign(&file, &service),
            Command::Token { sub, admin, operator, ttl_secs } => {
                token(&sub, local_stack::issuer::Roles { admin, operator }, ttl_secs).await
            }
            Command::Admin(args) => local_stack::admin_cli::run(&args).await.map(|text| print!("{text}")),
            Command::Subscribe { topics, websocket_port, token } => {
                subscribe(&topics, websocket_port, token.as_deref()).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn init_logs(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only for a terminal: a log redirected to a file gets none of ANSI's escape codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Where a path shows best: relative to the current folder when inside it.
fn show(path: &std::path::Path) -> String {
    let current = std::env::current_dir().ok();
    let shown = current.as_deref().and_then(|c| path.strip_prefix(c).ok()).unwrap_or(path);
    shown.display().to_string()
}

fn print_endpoints(stack: &Stack, config: &Config) {
    let e: &Endpoints = stack.endpoints();
    let dynamodb = if stack.owns_dynamodb() {
        match &config.dynamodb_data {
            Some(path) => format!("DynamoDB Local, data in {}", show(path)),
            None => "DynamoDB Local, in memory".to_owned(),
        }
    } else {
        "given with --dynamodb-endpoint".to_owned()
    };
    let services: Vec<String> = e.tables.participants.iter().map(|(s, t)| format!("{s} → {t}")).collect();
    println!("  page          {:<28} the live page: items, transfers, transactions, the lake", format!("{}/", e.api));
    println!("  REST API      {:<28} POST /transactions, GET /transactions/{{id}}, GET /openapi.yaml", e.api);
    println!("  WebSocket     {:<28} {{\"action\": \"subscribe\", \"topics\": [...]}}", e.websocket);
    println!("  DynamoDB      {:<28} {dynamodb}", e.dynamodb);
    println!("  lake          {:<28} NDJSON, YYYY/MM/DD/HH/ keys", format!("{}/", show(&e.lake_dir)));
    println!("  Firehose      {:<28} the stream processor writes the lake here", e.firehose);
    println!(
        "  events        {:<28} outcome events (EventBridge's envelope; the bus at {})",
        format!("{}/", show(&e.events_dir)),
        e.events
    );
    println!(
        "  dead letters  {:<28} what the stream polling gave up on (`twopc-local replay`)",
        format!("{}/", show(&e.dead_letter_dir))
    );
    println!("  @connections  {:<28} the stream processor pushes here", e.connections);
    if let Some(api) = &e.payment_api {
        println!("  payment API   {:<28} the stand-in the payments service authorizes, captures and voids at", api);
    }
    println!("  services      {}", services.join(", "));
    println!(
        "  tables        {}, {}, {}",
        e.tables.transactions,
        e.tables.connections,
        e.tables.participants.values().cloned().collect::<Vec<_>>().join(", ")
    );
    if let Some(issuer) = &e.issuer {
        println!(
            "  auth          {:<28} JWT (`twopc-local token --sub alice [--admin] [--operator]`), the access policy applies",
            issuer
        );
        println!(
            "  /local/token  {:<28} signs anyone in as anyone, admin and operator included: it answers only this stack's own page",
            format!("{}/local/token", e.api)
        );
    }
    for (deployment, url, functions) in &e.lambda {
        println!("  λ {:<11} {:<28} cargo lambda watch: {}", deployment, url, functions.join(", "));
    }
}

/// `twopc-local token`: a token of the development issuer the running `up --auth jwt` made. Its key
/// file outlives the stack, and the next `up --auth jwt` makes a new key pair, so a token signed with
/// it while no stack serves its key would be refused (401) by the next: the stack is asked first.
async fn token(sub: &str, roles: local_stack::issuer::Roles, ttl_secs: u64) -> Result<(), String> {
    if !twopc::jwt::is_valid_sub(sub) {
        return Err(format!("--sub must be a user name the authorizer takes: {}", twopc::jwt::SUB_RULE));
    }
    let start = "start one with `twopc-local up --auth jwt` first (each start makes a new key pair, which refuses the tokens of the one before)";
    let issuer = local_stack::issuer::DevIssuer::load(&Config::default().auth_dir)
        .map_err(|_| format!("no stack with --auth jwt has run from this checkout: {start}"))?;
    let jwks = format!("{}/.well-known/jwks.json", issuer.issuer);
    let http = twopc::https::client_builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("an HTTP client: {e}"))?;
    let served: serde_json::Value = match http.get(&jwks).send().await {
        Ok(answer) if answer.status().is_success() => answer.json().await.unwrap_or_default(),
        Ok(answer) => {
            return Err(format!(
                "{jwks} answered {}: the stack there does not run --auth jwt; {start}",
                answer.status()
            ));
        }
        Err(_) => return Err(format!("no stack with --auth jwt answers at {jwks}: {start}")),
    };
    let keys = served["keys"].as_array().into_iter().flatten();
    if !keys.filter_map(|key| key["kid"].as_str()).any(|kid| kid == issuer.kid) {
        return Err(format!(
            "the stack at {} runs another key than {} (it was started elsewhere): {start}",
            issuer.issuer,
            show(&local_stack::issuer::DevIssuer::path(&Config::default().auth_dir))
        ));
    }
    println!("{}", issuer.token_for(sub, roles, Duration::from_secs(ttl_secs)));
    Ok(())
}

/// `twopc-local subscribe`: the WebSocket API's messages for `topics`, one JSON line each, as a
/// WebSocket client sees them.
async fn subscribe(topics: &[String], websocket_port: u16, token: Option<&str>) -> Result<(), String> {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let mut url = format!("ws://127.0.0.1:{websocket_port}");
    if let Some(token) = token {
        url = format!("{url}/?token={token}");
    }
    let shown = format!("ws://127.0.0.1:{websocket_port}");
    let (mut socket, _) = tokio_tungstenite::connect_async(url.as_str()).await.map_err(|e| {
        format!("connecting to {shown}: {e} (is `twopc-local up` running? its WebSocket port is --ws-port)")
    })?;
    let message = serde_json::json!({"action": "subscribe", "topics": topics});
    socket.send(Message::Text(message.to_string().into())).await.map_err(|e| format!("{shown}: {e}"))?;
    eprintln!("following {} on {shown} (Ctrl-C stops)", topics.join(", "));
    loop {
        let next = tokio::select! {
            next = socket.next() => next,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        match next {
            None | Some(Ok(Message::Close(_))) => return Err(format!("{shown} closed the connection")),
            Some(Err(e)) => return Err(format!("{shown}: {e}")),
            Some(Ok(Message::Text(text))) => {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{}", text.as_str()).and_then(|_| out.flush());
            }
            Some(Ok(_)) => {}
        }
    }
}

/// `twopc-local sign`: the message signed now with the local development key of `service`.
fn sign(file: &std::path::Path, service: &str) -> Result<(), String> {
    let text = if file == std::path::Path::new("-") {
        std::io::read_to_string(std::io::stdin()).map_err(|e| format!("reading standard input: {e}"))?
    } else {
        std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?
    };
    let request: twopc::model::ParticipantRequest =
        serde_json::from_str(&text).map_err(|e| format!("{}: not a participant message: {e}", file.display()))?;
    let now = twopc::clock::Clock::now_ms(&twopc::clock::SystemClock);
    let signed = twopc::auth::sign_with(&twopc::auth::LocalKeys::key_set(service), service, &request, now)
        .map_err(|e| e.to_string())?;
    println!("{}", serde_json::to_string_pretty(&signed).map_err(|e| e.to_string())?);
    Ok(())
}

fn reset() -> Result<(), String> {
    let local = local_stack::local_dir();
    let running = "stop it first (Ctrl-C where it runs), then reset; nothing was deleted";
    let _checkout = local_stack::CheckoutLock::exclusive(&local)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("a twopc-local (up, demo or replay) is running from this checkout: {running}"))?;
    let data = local.join(DATA);
    // Held while it runs: nothing is deleted under a running stack.
    let _lock = if data.is_dir() {
        Some(local_stack::DataLock::acquire(&data).map_err(|e| match e {
            local_stack::Error::DataInUse { pid, .. } => format!(
                "a twopc-local{} is using {}: {running}",
                pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
                show(&data)
            ),
            other => other.to_string(),
        })?)
    } else {
        None
    };
    let mut removed = Vec::new();
    for name in KEPT {
        let dir = local.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| format!("deleting {}: {e}", dir.display()))?;
            removed.push(show(&dir));
        }
    }
    if removed.is_empty() {
        println!("Nothing to reset under {}.", show(&local));
    } else {
        println!("Deleted {}.", removed.join(", "));
    }
    Ok(())
}

async fn up(args: StackArgs) -> Result<(), String> {
    init_logs("info,twopc_fanout=warn,twopc::sweeper=warn,aws_config=warn,aws_smithy_runtime=warn");
    let config = args.config(true, true);
    let stack = tokio::select! {
        stack = Stack::start(config.clone()) => stack.map_err(|e| e.to_string())?,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("interrupted while starting; stopped");
            return Ok(());
        }
    };
    println!("twopc local stack is up ({:.1} s)", stack.started_in().as_secs_f64());
    print_endpoints(&stack, &config);
    println!("  sweeper       every {} s", config.sweep_interval.as_secs());
    println!("Ctrl-C stops everything.");
    let _ = tokio::signal::ctrl_c().await;
    eprintln!("stopping...");
    stack.stop().await;
    eprintln!("stopped");
    Ok(())
}

/// `twopc-local replay`: the stack on the kept data, one replay of the dead-letter folder, stop.
async fn replay(args: StackArgs) -> Result<(), String> {
    init_logs("info,aws_config=warn,aws_smithy_runtime=warn");
    let config = Config { example_items: false, ..args.config(true, true) };
    let stack = Stack::start(config.clone()).await.map_err(|e| e.to_string())?;
    eprintln!("replaying the dead letters of {}/ ...", show(&config.dead_letter_dir));
    let result = stack.replay_dead_letters().await;
    stack.stop().await;
    let report = result.map_err(|e| e.to_string())?;
    for message in &report.messages {
        let range = message
            .batch
            .as_ref()
            .map(|b| format!("{} {}..={}", b.shard_id, b.start_sequence_number, b.end_sequence_number))
            .unwrap_or_else(|| "(a record dead-lettered with its content)".to_owned());
        let fate = if message.deleted {
            "replayed, deleted".to_owned()
        } else {
            format!("KEPT: {}", message.error.as_deref().unwrap_or("failed"))
        };
        eprintln!("  {}  {range}  {} records  {fate}", show(std::path::Path::new(&message.handle)), message.records);
        if let Some(lost) = &message.lost {
            eprintln!("    LOST: {lost}");
        }
    }
    println!("{}", serde_json::to_string(&report.answer).map_err(|e| e.to_string())?);
    if report.answer.failed > 0 {
        return Err(format!("{} dead letters could not be replayed and are kept", report.answer.failed));
    }
    Ok(())
}
