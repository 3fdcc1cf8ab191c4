//! `twopc-cold-start`: each Lambda function's zip size and init time, its binary started as the Lambda
//! runtime starts a `provided.al2023` function: the `bootstrap` executable with the runtime's
//! environment (`AWS_LAMBDA_RUNTIME_API` and the rest) and the function's own, timed from the spawn to
//! its first `GET /2018-06-01/runtime/invocation/next` on a Runtime API this tool serves on 127.0.0.1.
//! That is Lambda's Init phase as the function spends it (configuration, SDK clients, tracing), without
//! the sandbox's own start and the zip's download, which no local run can show.
//!
//! ```text
//! cargo build --release -p coordinator -p participant ...   # the size-tuned release profile
//! cargo run --release -p twopc-bench --bin twopc-cold-start -- --binaries target/release
//! ```
//!
//! `--binaries` is a folder with `<function>` executables (cargo's layout) or `<function>/bootstrap`
//! (cargo-lambda's, with its `bootstrap.zip` used for the size when present). A function whose init
//! fails (`POST /runtime/init/error`, or an exit) fails the run, with what it reported.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// The functions of the workspace, as `infra/build.sh` and the templates name them.
const FUNCTIONS: [&str; 9] = [
    "coordinator",
    "participant",
    "inventory",
    "payments",
    "sweeper",
    "stream-processor",
    "outcomes",
    "connections",
    "authorizer",
];

#[derive(Debug, Parser)]
#[command(about = "Each Lambda function's zip size and init time, started as the Lambda runtime starts it")]
struct Cli {
    /// Folder of the binaries: `<function>` (cargo) or `<function>/bootstrap` (cargo-lambda).
    #[arg(long, default_value = "target/release")]
    binaries: PathBuf,
    /// Starts per function; the table gives the median and the slowest.
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Write the figures as JSON here too.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What a started function did first.
enum Init {
    /// Asked for its first event after this long.
    Ready(Duration),
    /// Reported an init error, or exited, with this text.
    Failed(String),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut rows = Vec::new();
    let mut failed = false;
    println!(
        "{:<18} {:>12} {:>12} {:>14} {:>14}",
        "function", "binary (KB)", "zip (KB)", "init p50 (ms)", "init max (ms)"
    );
    for function in FUNCTIONS {
        let Some(binary) = binary_of(&cli.binaries, function) else {
            println!("{function:<18} not built in {}", cli.binaries.display());
            failed = true;
            continue;
        };
        let binary_kb = std::fs::metadata(&binary).map(|m| m.len() / 1024).unwrap_or(0);
        let zip_kb = zip_size(&binary).await.map(|bytes| bytes / 1024);
        let mut times = Vec::new();
        for _ in 0..cli.runs.max(1) {
            match start_once(&binary, function).await {
                Init::Ready(elapsed) => times.push(elapsed.as_secs_f64() * 1000.0),
                Init::Failed(why) => {
                    println!("{function:<18} init failed: {why}");
                    failed = true;
                    break;
                }
            }
        }
        if times.is_empty() {
            continue;
        }
        times.sort_by(f64::total_cmp);
        let p50 = times[(times.len() - 1) / 2];
        let max = times[times.len() - 1];
        let zip_text = zip_kb.map_or_else(|| "-".to_owned(), |kb| kb.to_string());
        println!("{function:<18} {binary_kb:>12} {zip_text:>12} {p50:>14.1} {max:>14.1}");
        rows.push(json!({"function": function, "binaryKiB": binary_kb, "zipKiB": zip_kb, "initP50Ms": p50, "initMaxMs": max, "runs": times.len()}));
    }
    if let Some(out) = &cli.out {
        let written = out.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|()| {
            std::fs::write(
                out,
                serde_json::to_string_pretty(&json!({"binaries": cli.binaries, "functions": rows})).unwrap_or_default(),
            )
        });
        if let Err(e) = written {
            eprintln!("error: cannot write {}: {e}", out.display());
            failed = true;
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

fn binary_of(dir: &Path, function: &str) -> Option<PathBuf> {
    [dir.join(function).join("bootstrap"), dir.join(function)].into_iter().find(|path| path.is_file())
}

/// cargo-lambda's `bootstrap.zip` beside the binary, else the binary zipped as `bootstrap` by `zip -9`
/// (deflate, as cargo-lambda's); `None` without either.
async fn zip_size(binary: &Path) -> Option<u64> {
    if let Some(zip) = binary.parent().map(|dir| dir.join("bootstrap.zip")).filter(|zip| zip.is_file()) {
        return std::fs::metadata(zip).ok().map(|m| m.len());
    }
    let dir = std::env::temp_dir().join(format!("twopc-cold-start-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    std::fs::copy(binary, dir.join("bootstrap")).ok()?;
    let status = tokio::process::Command::new("zip")
        .args(["-q", "-9", "bootstrap.zip", "bootstrap"])
        .current_dir(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    let size = status
        .ok()
        .filter(|s| s.success())
        .and_then(|_| std::fs::metadata(dir.join("bootstrap.zip")).ok())
        .map(|m| m.len());
    let _ = std::fs::remove_dir_all(&dir);
    size
}

/// The environment the function's template gives it, with local values: enough for its init to run
/// as deployed (tables are names; nothing is called before the first event).
fn function_environment(function: &str) -> Vec<(&'static str, String)> {
    let keys = twopc::auth::LOCAL_KEYS.to_owned();
    let mut env = vec![(twopc::record::TRANSACTIONS_TABLE_NAME, "transactions".to_owned())];
    let participant = |service: &str, table: &str| {
        vec![
            (twopc::participant::SERVICE_NAME, service.to_owned()),
            (twopc::participant::DATA_TABLE_NAME, table.to_owned()),
            (twopc::auth::PARTICIPANT_KEY, keys.clone()),
        ]
    };
    match function {
        "participant" => env.extend(participant("service-a", "service-a-data")),
        "inventory" => env.extend(participant("inventory", "inventory-data")),
        "payments" => {
            env.extend(participant("payments", "payments-data"));
            env.push((twopc::environment::PAYMENT_API_URL, "https://payments.example.invalid".to_owned()));
        }
        // The transactions stream's second reader: the table and the outcomes bus (its name), nothing else.
        "outcomes" => env.push((twopc_fanout::outcomes::EVENT_BUS_NAME, "twopc-outcomes".to_owned())),
        // The WebSocket $connect's authorizer, deployed with a JWT issuer (the key set is fetched on the first token).
        "authorizer" => env.extend([
            (twopc::jwt::JWT_ISSUER, "https://issuer.example.invalid/".to_owned()),
            (twopc::jwt::JWT_AUDIENCE, "twopc".to_owned()),
            (twopc::jwt::JWKS_URL, "https://issuer.example.invalid/.well-known/jwks.json".to_owned()),
        ]),
        _ => env.extend([
            (
                twopc::invoke::PARTICIPANTS,
                json!({"service-a": "participant-a", "service-b": "participant-b"}).to_string(),
            ),
            (
                twopc::tables::PARTICIPANT_TABLES,
                json!({"service-a": "service-a-data", "service-b": "service-b-data"}).to_string(),
            ),
            (twopc::auth::PARTICIPANT_KEYS, keys.clone()),
            (twopc::age::AGE_TOKEN_KEY, "cold-start-age-token-key-0123456789abcdef".to_owned()),
            (twopc_fanout::connections::CONNECTIONS_TABLE_NAME, "connections".to_owned()),
            (twopc_fanout::lake::FIREHOSE_STREAM_NAME, "lake".to_owned()),
            (twopc_fanout::realtime::WEBSOCKET_ENDPOINT, "https://ws.example.invalid/prod".to_owned()),
            (twopc_fanout::connections::WEBSOCKET_API_ID, "ws".to_owned()),
            // The sweeper's age alerts: the outcomes bus and the age that gets one.
            (twopc_fanout::outcomes::EVENT_BUS_NAME, "twopc-outcomes".to_owned()),
            (
                twopc_fanout::outcomes::OPEN_ALERT_AFTER_MS,
                twopc_fanout::outcomes::DEFAULT_OPEN_ALERT_AFTER_MS.to_string(),
            ),
        ]),
    }
    env
}

/// Starts the binary once against a Runtime API of its own, and waits (up to 30 s) for its first
/// `next`, an init error, or its exit.
async fn start_once(binary: &Path, function: &str) -> Init {
    let listener = match TcpListener::bind("127.0.0.1:0").await {
        Ok(listener) => listener,
        Err(e) => return Init::Failed(format!("cannot listen on 127.0.0.1: {e}")),
    };
    let address = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let (report, mut reports) = mpsc::channel::<Result<(), String>>(4);
    let server = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let report = report.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                let mut request_line = String::new();
                if reader.read_line(&mut request_line).await.is_err() {
                    return;
                }
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).await.unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':')
                        && name.eq_ignore_ascii_case("content-length")
                    {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; length.min(64 * 1024)];
                let _ = reader.read_exact(&mut body).await;
                if request_line.contains("/runtime/invocation/next") {
                    let _ = report.send(Ok(())).await;
                    // Held open, as the Runtime API holds `next` until an event comes.
                    tokio::time::sleep(Duration::from_secs(60)).await;
                } else if request_line.contains("/runtime/init/error") {
                    let _ = report.send(Err(String::from_utf8_lossy(&body).into_owned())).await;
                    let _ = reader.get_mut().write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n").await;
                }
            });
        }
    });
    let mut command = tokio::process::Command::new(binary);
    command
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("AWS_LAMBDA_RUNTIME_API", &address)
        .env("AWS_LAMBDA_FUNCTION_NAME", function)
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{function}"))
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "cold-start")
        .env("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand")
        .env("_HANDLER", "bootstrap")
        .env("LAMBDA_TASK_ROOT", "/var/task")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "cold-start")
        .env("AWS_SECRET_ACCESS_KEY", "cold-start")
        .env("AWS_SESSION_TOKEN", "cold-start")
        .envs(function_environment(function))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            server.abort();
            return Init::Failed(format!("cannot start {}: {e}", binary.display()));
        }
    };
    let outcome = tokio::select! {
        report = reports.recv() => match report {
            Some(Ok(())) => Init::Ready(started.elapsed()),
            Some(Err(body)) => Init::Failed(format!("init error: {body}")),
            None => Init::Failed("the Runtime API stopped".into()),
        },
        status = child.wait() => {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr).await;
            }
            Init::Failed(format!("exited ({}) before asking for an event: {}", status.map(|s| s.to_string()).unwrap_or_default(), stderr.trim()))
        }
        () = tokio::time::sleep(Duration::from_secs(30)) => Init::Failed("no request for an event within 30 s".into()),
    };
    let _ = child.kill().await;
    server.abort();
    outcome
}
