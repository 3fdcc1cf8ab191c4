//! Runs [DynamoDB Local] for tests: installed from Maven Central on first use, started on a
//! free port of 127.0.0.1, killed when dropped or when the process exits.
//!
//! ```no_run
//! # async fn demo() -> Result<(), dynamodb_local::Error> {
//! // One instance per test, with its own database:
//! let db = dynamodb_local::DynamoDbLocal::start(dynamodb_local::Options::default()).await?;
//! println!("DynamoDB Local answers on {}", db.endpoint());
//! db.stop().await;
//!
//! // Or one instance for a whole test binary (in memory; use unique table names per test):
//! let endpoint = dynamodb_local::shared().endpoint();
//! # Ok(()) }
//! ```
//!
//! # Installation
//!
//! The first start downloads DynamoDB Local [`DYNAMODB_LOCAL_VERSION`] and the jars it runs with
//! (`artifacts.txt`: each file's path and SHA-256, about 50 MB) from Maven Central, or from the mirror
//! in `$DYNAMODB_LOCAL_MAVEN_REPOSITORY`, refusing any file whose checksum differs; a file already in
//! `~/.m2/repository` with the pinned checksum is copied instead. It then compiles a small launcher
//! with `javac`, into `<workspace>/.local/dynamodb-local/` (or `$DYNAMODB_LOCAL_DIR`). Later starts
//! reuse it. The install goes into a temporary folder that is renamed into place once complete,
//! under a file lock, so concurrent processes install once and an interrupted install is redone.
//! Needs a JDK 17+ (its `javac` on first use, its `java` always: `$JAVA_HOME/bin` or `PATH`); no Maven.
//!
//! # Only this machine's own clients
//!
//! DynamoDB Local checks no signature: whoever reaches it reads and writes every table. It has no
//! option for the listen address and binds every interface, and it answers any `Host`. The launcher
//! (`java/LoopbackServerRunner.java`) builds the server through DynamoDB Local's own `ServerRunner`,
//! restricts its Jetty connector to 127.0.0.1, and puts a handler in front of DynamoDB Local's that
//! answers `403` to a request whose `Host` is not `127.0.0.1:PORT` or `localhost:PORT` (a web page
//! that rebinds a name of its own to 127.0.0.1 sends its own name) or that carries an `Origin` (a
//! browser page; SDK clients send none). So every user of this crate (the tests, the benchmark, the
//! local stack) gets a DynamoDB Local that only this machine's SDK clients can use. Telemetry is
//! always off.
//!
//! [DynamoDB Local]: https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/DynamoDBLocal.html

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

mod fetch;
pub use fetch::{CENTRAL, REPOSITORY_ENV};

/// The DynamoDB Local release installed (`software.amazon.dynamodb:DynamoDBLocal`, pinned with its
/// dependencies in `artifacts.txt`).
pub const DYNAMODB_LOCAL_VERSION: &str = "3.1.0";

/// Environment variable overriding the install folder.
pub const DIR_ENV: &str = "DYNAMODB_LOCAL_DIR";

/// Writes a line to stderr directly: unlike `eprintln!`, not captured by the test harness.
macro_rules! progress {
    ($($arg:tt)*) => {{
        let _ = writeln!(io::stderr(), $($arg)*);
    }};
}

const LAUNCHER_SOURCE: &str = include_str!("../java/LoopbackServerRunner.java");
const LAUNCHER_CLASS: &str = "LoopbackServerRunner";
/// The one origin DynamoDB Local allows (`-cors`): none a browser page can have.
const NO_BROWSER_ORIGIN: &str = "https://no-browser.invalid";
/// Written into an install folder once everything else is in place.
const MARKER: &str = ".complete";
/// How long a started process may take to answer HTTP.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How much of the process's output is kept for error messages.
const OUTPUT_TAIL_BYTES: usize = 32 * 1024;

/// How to start DynamoDB Local. `Options::default()`: a free port, in memory.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The port on 127.0.0.1; `None` picks a free one.
    pub port: Option<u16>,
    /// Keep the database in this folder (created if missing; `-dbPath`); `None` keeps it in
    /// memory (`-inMemory`). Either way a single database serves every region and credential
    /// (`-sharedDb`).
    pub db_path: Option<PathBuf>,
}

/// Why DynamoDB Local could not be installed or started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The requested port is taken on 127.0.0.1.
    #[error("port {port} on 127.0.0.1 is already in use (leave Options::port as None for a free port)")]
    PortInUse { port: u16 },
    /// Downloading DynamoDB Local (or compiling its launcher) failed.
    #[error("installing DynamoDB Local {DYNAMODB_LOCAL_VERSION} into {} failed: {message}", dir.display())]
    Install { dir: PathBuf, message: String },
    /// No Java runtime to run DynamoDB Local.
    #[error("`{}` not found: DynamoDB Local needs a JDK 17+ (its `java`, and `javac` once) on PATH or in JAVA_HOME", command.display())]
    JavaNotFound { command: PathBuf },
    /// The Java process could not be spawned, exited, or did not answer in time.
    #[error("DynamoDB Local on 127.0.0.1:{port} did not start: {message}{}", output_section(output))]
    Start {
        port: u16,
        message: String,
        /// The last lines the process printed (stdout and stderr).
        output: String,
    },
}

fn output_section(output: &str) -> String {
    if output.trim().is_empty() {
        String::new()
    } else {
        format!("\n--- DynamoDB Local output ---\n{}", output.trim_end())
    }
}

/// A running DynamoDB Local process, killed on [`stop`](Self::stop) or drop.
#[derive(Debug)]
pub struct DynamoDbLocal {
    child: Option<Child>,
    port: u16,
    endpoint: String,
}

impl DynamoDbLocal {
    /// Installs DynamoDB Local if needed, starts it and waits until it answers `ListTables`.
    ///
    /// Fails with [`Error::PortInUse`] if `options.port` is taken, and with [`Error::Start`]
    /// (including the process's output) if it exits or does not answer within two minutes.
    pub async fn start(options: Options) -> Result<DynamoDbLocal, Error> {
        match tokio::task::spawn_blocking(move || start_blocking(&options)).await {
            Ok(result) => result,
            Err(join_error) => std::panic::resume_unwind(join_error.into_panic()),
        }
    }

    /// The endpoint URL for AWS SDK clients, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the process and waits for it to exit.
    pub async fn stop(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = tokio::task::spawn_blocking(move || child.wait()).await;
        }
    }
}

impl Drop for DynamoDbLocal {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

static SHARED: OnceLock<Result<DynamoDbLocal, Error>> = OnceLock::new();

/// One in-memory instance per process, for test binaries: started by the first call (which
/// blocks for the few seconds that takes; concurrent callers wait for it), then returned to
/// every caller. It is never dropped; the process is killed when this process exits for any
/// reason, on Linux even without destructors (it is spawned with `PR_SET_PDEATHSIG` from a
/// thread that lives as long as the process). Works from any thread or tokio runtime, e.g. many
/// `#[tokio::test]`s in one binary. Tests share its database, so they should use unique table
/// names.
///
/// # Panics
///
/// If it cannot be started (on every call); see [`try_shared`].
pub fn shared() -> &'static DynamoDbLocal {
    match try_shared() {
        Ok(instance) => instance,
        Err(error) => panic!("{error}"),
    }
}

/// [`shared`], returning the (remembered) error instead of panicking.
pub fn try_shared() -> Result<&'static DynamoDbLocal, &'static Error> {
    SHARED.get_or_init(|| start_blocking(&Options::default())).as_ref()
}

// ---------------------------------------------------------------------------------------------
// Starting

fn start_blocking(options: &Options) -> Result<DynamoDbLocal, Error> {
    let installation = installation()?;
    // A free port can be taken by someone else between probing it and Java binding it: retry.
    let attempts = if options.port.is_some() { 1 } else { 3 };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let port = match options.port {
            Some(port) => {
                ensure_port_free(port)?;
                port
            }
            None => free_port()?,
        };
        match launch(&installation, port, options) {
            Err(Error::PortInUse { .. }) if attempt < attempts => {
                tracing::debug!(port, "port taken before DynamoDB Local could bind it; retrying");
            }
            result => return result,
        }
    }
}

fn ensure_port_free(port: u16) -> Result<(), Error> {
    match TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::AddrInUse => Err(Error::PortInUse { port }),
        Err(error) => {
            Err(Error::Start { port, message: format!("cannot bind 127.0.0.1:{port}: {error}"), output: String::new() })
        }
    }
}

fn free_port() -> Result<u16, Error> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|error| Error::Start {
            port: 0,
            message: format!("cannot find a free port on 127.0.0.1: {error}"),
            output: String::new(),
        })
}

fn launch(installation: &Installation, port: u16, options: &Options) -> Result<DynamoDbLocal, Error> {
    let start_error = |message: String, output: String| Error::Start { port, message, output };
    let java = java_tool("java");
    let mut command = Command::new(&java);
    // The serial collector starts a little faster and uses fewer threads and less memory,
    // which suits many small test instances on few cores.
    command.arg("-XX:+UseSerialGC");
    // sqlite4java's native library (`libsqlite4java-linux-amd64-<version>.so`) is in lib/.
    command.arg(jvm_arg("-Djava.library.path=", &installation.lib_dir));
    let class_path = [installation.launcher_dir.clone(), installation.lib_dir.join("*")];
    let class_path = std::env::join_paths(class_path)
        .map_err(|error| start_error(format!("bad class path: {error}"), String::new()))?;
    command.arg("-cp").arg(class_path);
    command.arg(LAUNCHER_CLASS);
    // CORS for no origin: DynamoDB Local checks no signature, so a page open in the same browser that it
    // let in could read and write every table. Its documented default is `*` (3.1.0 answers a preflight
    // without Access-Control-Allow-Origin either way); this keeps a later version from opening it.
    command.args(["-port", &port.to_string(), "-sharedDb", "-disableTelemetry", "-cors", NO_BROWSER_ORIGIN]);
    match &options.db_path {
        None => {
            command.arg("-inMemory");
        }
        Some(db_path) => {
            let db_path = std::path::absolute(db_path).unwrap_or_else(|_| db_path.clone());
            fs::create_dir_all(&db_path)
                .map_err(|error| start_error(format!("cannot create {}: {error}", db_path.display()), String::new()))?;
            command.arg("-dbPath").arg(db_path);
        }
    }
    // Stray files (if any) go to the install folder, not to the caller's working directory.
    command.current_dir(&installation.dir).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    tracing::debug!(?command, "starting DynamoDB Local");

    let mut child = spawn_from_long_lived_thread(command).map_err(|error| {
        if error.kind() == io::ErrorKind::NotFound {
            Error::JavaNotFound { command: java }
        } else {
            start_error(format!("cannot run {}: {error}", java.display()), String::new())
        }
    })?;
    let output = OutputTail::capture(&mut child);
    let mut instance = DynamoDbLocal { child: Some(child), port, endpoint: format!("http://127.0.0.1:{port}") };
    match wait_until_ready(&mut instance, port) {
        Ok(()) => Ok(instance),
        Err(message) => {
            drop(instance); // kills and reaps it, closing its output so the tail is complete
            let output = output.wait_and_take(Duration::from_secs(2));
            if output.contains("Address already in use") || output.contains("Failed to bind") {
                Err(Error::PortInUse { port })
            } else {
                Err(start_error(message, output))
            }
        }
    }
}

/// Polls with a `ListTables` request until it succeeds; `Err` says why it gave up.
fn wait_until_ready(instance: &mut DynamoDbLocal, port: u16) -> Result<(), String> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        let child = instance.child.as_mut().expect("child present while starting");
        match child.try_wait() {
            Ok(Some(status)) => {
                return Err(format!("java exited ({}) before answering", describe(status)));
            }
            Ok(None) => {}
            Err(error) => return Err(format!("cannot check the java process: {error}")),
        }
        let failure = match list_tables(port) {
            Ok(200) => {
                tracing::debug!(port, elapsed = ?started.elapsed(), "DynamoDB Local is ready");
                return Ok(());
            }
            Ok(status) => format!("ListTables answered HTTP {status}"),
            Err(error) => format!("ListTables failed: {error}"),
        };
        if started.elapsed() > START_TIMEOUT {
            return Err(format!("no successful answer within {START_TIMEOUT:?} (last: {failure})"));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("killed by signal {signal}");
        }
    }
    status.to_string()
}

/// Sends a raw HTTP `ListTables` request; returns the HTTP status.
fn list_tables(port: u16) -> io::Result<u16> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    let body = "{}";
    write!(
        stream,
        "POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: DynamoDB_20120810.ListTables\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=fake/20240101/us-east-1/dynamodb/aws4_request, \
         SignedHeaders=host, Signature=x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response);
    response
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| response.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an HTTP response"))
}

/// The last lines a child printed on stdout and stderr, collected by two threads.
struct OutputTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl OutputTail {
    fn capture(child: &mut Child) -> OutputTail {
        let lines = Arc::new(Mutex::new(VecDeque::new()));
        let mut readers = Vec::new();
        let streams: [Option<Box<dyn Read + Send>>; 2] = [
            child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
            child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
        ];
        for stream in streams.into_iter().flatten() {
            let lines = Arc::clone(&lines);
            let reader = std::thread::Builder::new().name("dynamodb-local-output".into()).spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut line = Vec::new();
                while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                    let mut lines = lines.lock().unwrap_or_else(|e| e.into_inner());
                    lines.push_back(String::from_utf8_lossy(&line).into_owned());
                    let mut total: usize = lines.iter().map(String::len).sum();
                    while total > OUTPUT_TAIL_BYTES && lines.len() > 1 {
                        total -= lines.pop_front().map_or(0, |l| l.len());
                    }
                    line.clear();
                }
            });
            if let Ok(reader) = reader {
                readers.push(reader);
            }
        }
        OutputTail { lines, readers }
    }

    /// Waits (up to `timeout`) for the child's output to close, then returns what was kept.
    fn wait_and_take(self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline && self.readers.iter().any(|r| !r.is_finished()) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        lines.iter().map(String::as_str).collect()
    }
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `command` from a thread that never exits, with (on Linux) `PR_SET_PDEATHSIG`.
///
/// The kernel sends the parent-death signal when the *thread* that forked the child exits, not
/// the process; test harnesses run each test, and tokio each blocking task, on threads that come
/// and go. Spawning from one permanent thread ties the child's life to the process's.
fn spawn_from_long_lived_thread(mut command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    kill_with_parent(&mut command);
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, receiver) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("dynamodb-local-spawner".into())
            .spawn(move || {
                // The sender lives in a static, so this loop (and thread) never ends.
                for (mut command, reply) in receiver {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("cannot start the dynamodb-local spawner thread");
        requests
    });
    let (reply, response) = mpsc::channel();
    spawner.send((command, reply)).map_err(|_| io::Error::other("the dynamodb-local spawner thread is gone"))?;
    response.recv().map_err(|_| io::Error::other("the dynamodb-local spawner thread is gone"))?
}

#[cfg(target_os = "linux")]
fn kill_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid is async-signal-safe; the closure only calls prctl and getppid, which are
    // async-signal-safe too, and does not allocate.
    let parent = unsafe { libc::getpid() };
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl: then nobody would ever kill us.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn kill_with_parent(_command: &mut Command) {}

/// `$JAVA_HOME/bin/<tool>` if that exists, else `<tool>` (looked up on PATH).
fn java_tool(tool: &str) -> PathBuf {
    if let Some(home) = std::env::var_os("JAVA_HOME").filter(|home| !home.is_empty()) {
        let candidate = Path::new(&home).join("bin").join(tool);
        if candidate.is_file() {
            return candidate;
        }
    }
    PathBuf::from(tool)
}

fn jvm_arg(prefix: &str, path: &Path) -> OsString {
    let mut arg = OsString::from(prefix);
    arg.push(path);
    arg
}

// ---------------------------------------------------------------------------------------------
// Installing

#[derive(Debug, Clone)]
struct Installation {
    dir: PathBuf,
    lib_dir: PathBuf,
    /// Holds the compiled launcher (loopback only, its own `Host` only).
    launcher_dir: PathBuf,
}

/// `$DYNAMODB_LOCAL_DIR`, else `.local/dynamodb-local` of [`local_dir`].
fn install_root() -> PathBuf {
    if let Some(dir) = std::env::var_os(DIR_ENV).filter(|dir| !dir.is_empty()) {
        // Absolute, because the Java process runs in a different working directory.
        return std::path::absolute(&dir).unwrap_or_else(|_| PathBuf::from(dir));
    }
    local_dir().join("dynamodb-local")
}

/// The Cargo workspace the current folder is in (the nearest folder upwards whose `Cargo.toml` has a
/// `[workspace]` table), found when the program runs: a moved or copied checkout uses its own.
pub fn workspace_root() -> Option<PathBuf> {
    workspace_root_from(&std::env::current_dir().ok()?)
}

/// The nearest folder from `start` upwards whose `Cargo.toml` has a `[workspace]` table.
pub fn workspace_root_from(start: &Path) -> Option<PathBuf> {
    start.ancestors().find_map(|dir| {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
        manifest.lines().any(|line| line.trim() == "[workspace]").then(|| dir.to_path_buf())
    })
}

/// `<workspace>/.local` (git-ignored), or `.local` of the current folder outside any workspace.
pub fn local_dir() -> PathBuf {
    let dir = workspace_root().unwrap_or_else(|| PathBuf::from(".")).join(".local");
    std::path::absolute(&dir).unwrap_or(dir)
}

/// The install folder's name: changes whenever what gets installed changes.
fn install_name() -> String {
    // FNV-1a: stable across Rust releases, unlike `DefaultHasher`.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in fetch::ARTIFACTS_TXT.bytes().chain([0]).chain(LAUNCHER_SOURCE.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("DynamoDBLocal-{DYNAMODB_LOCAL_VERSION}-{:08x}", hash as u32)
}

/// Returns the installation, installing it first if needed (once per process).
fn installation() -> Result<Installation, Error> {
    static INSTALLED: Mutex<Option<Installation>> = Mutex::new(None);
    let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(installation) = installed.as_ref() {
        return Ok(installation.clone());
    }
    let root = install_root();
    let installation = install(&root).map_err(|message| Error::Install { dir: root.clone(), message })?;
    *installed = Some(installation.clone());
    Ok(installation)
}

fn install(root: &Path) -> Result<Installation, String> {
    let dir = root.join(install_name());
    let found = |dir: PathBuf| Installation { lib_dir: dir.join("lib"), launcher_dir: dir.join("launcher"), dir };
    if dir.join(MARKER).is_file() {
        return Ok(found(dir));
    }
    fs::create_dir_all(root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let _lock = InstallLock::acquire(&root.join(".install.lock"))?;
    if dir.join(MARKER).is_file() {
        return Ok(found(dir)); // another process installed it while we waited
    }
    // Under the lock, leftovers are from interrupted installs.
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
    }
    remove_stale_temp_dirs(root);

    progress!(
        "installing DynamoDB Local {DYNAMODB_LOCAL_VERSION} from {} into {} (first use only)",
        fetch::Sources::from_environment().repository,
        dir.display()
    );
    let started = Instant::now();
    let temp = root.join(format!(".tmp-install-{}", std::process::id()));
    let result = install_into(&temp);
    let result = result.and_then(|()| {
        fs::rename(&temp, &dir).map_err(|e| format!("cannot rename {} to {}: {e}", temp.display(), dir.display()))
    });
    if let Err(message) = result {
        let _ = fs::remove_dir_all(&temp);
        return Err(message);
    }
    progress!("installed DynamoDB Local in {:.1?}", started.elapsed());
    Ok(found(dir))
}

fn install_into(temp: &Path) -> Result<(), String> {
    let _ = fs::remove_dir_all(temp);
    let lib_dir = temp.join("lib");
    let launcher_dir = temp.join("launcher");
    for dir in [&lib_dir, &launcher_dir] {
        fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let fetched = fetch::fetch_into(fetch::pinned(), &lib_dir, fetch::Sources::from_environment())?;
    progress!(
        "DynamoDB Local: {} files downloaded, {} copied from ~/.m2, {:.1} MB",
        fetched.downloaded,
        fetched.copied,
        fetched.bytes as f64 / 1e6
    );
    let jar = lib_dir.join(format!("DynamoDBLocal-{DYNAMODB_LOCAL_VERSION}.jar"));
    if !jar.is_file() {
        return Err(format!("artifacts.txt does not pin {}", jar.display()));
    }

    let source = launcher_dir.join(format!("{LAUNCHER_CLASS}.java"));
    fs::write(&source, LAUNCHER_SOURCE).map_err(|e| format!("cannot write {}: {e}", source.display()))?;
    let mut javac = Command::new(java_tool("javac"));
    javac.arg("-d").arg(&launcher_dir).arg("-cp").arg(lib_dir.join("*")).arg(&source);
    // No fallback to DynamoDB Local's own ServerRunner: it would answer every interface and any Host.
    check(
        javac.stdin(Stdio::null()).output(),
        "javac (a JDK, needed once to compile the launcher that keeps DynamoDB Local to this machine's own clients)",
    )?;

    let marker = temp.join(MARKER);
    fs::write(&marker, format!("DynamoDBLocal {DYNAMODB_LOCAL_VERSION}\n"))
        .map_err(|e| format!("cannot write {}: {e}", marker.display()))
}

/// `Err` with the command's output unless it ran and succeeded.
fn check(output: io::Result<std::process::Output>, what: &str) -> Result<(), String> {
    let output = output.map_err(|error| {
        if error.kind() == io::ErrorKind::NotFound {
            format!("{what} not found on PATH")
        } else {
            format!("cannot run {what}: {error}")
        }
    })?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    let tail: Vec<&str> = text.lines().rev().take(40).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(format!("{what} failed ({}):\n{}", describe(output.status), tail.join("\n")))
}

fn remove_stale_temp_dirs(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".tmp-install-") {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// An exclusive `flock` on a file, released when dropped (or when the process dies).
struct InstallLock {
    _file: fs::File,
}

impl InstallLock {
    fn acquire(path: &Path) -> Result<InstallLock, String> {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::io::AsRawFd;
            let fd = file.as_raw_fd();
            // SAFETY: flock on a file descriptor we own.
            if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                progress!("waiting for another process installing DynamoDB Local (lock {})", path.display());
                loop {
                    // SAFETY: as above.
                    if unsafe { libc::flock(fd, libc::LOCK_EX) } == 0 {
                        break;
                    }
                    let error = io::Error::last_os_error();
                    if error.kind() != io::ErrorKind::Interrupted {
                        return Err(format!("cannot lock {}: {error}", path.display()));
                    }
                }
            }
        }
        Ok(InstallLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_root_is_under_the_workspace() {
        if std::env::var_os(DIR_ENV).is_none() {
            let root = install_root();
            assert!(root.ends_with(".local/dynamodb-local"), "{}", root.display());
            assert!(root.parent().unwrap().parent().unwrap().join("Cargo.toml").is_file());
        }
    }

    #[test]
    fn error_messages_name_the_port_and_include_output() {
        let error = Error::PortInUse { port: 4567 };
        assert!(error.to_string().contains("4567"));
        let error = Error::Start {
            port: 1234,
            message: "java exited (exit status: 1) before answering".into(),
            output: "Exception in thread \"main\"\n".into(),
        };
        let text = error.to_string();
        assert!(text.contains("127.0.0.1:1234") && text.contains("Exception in thread"), "{text}");
    }

    #[test]
    fn the_workspace_is_found_where_the_program_runs_not_where_it_was_built() {
        let copy = std::env::temp_dir().join(format!("twopc-copy-{}", std::process::id()));
        let member = copy.join("tools").join("local-stack");
        std::fs::create_dir_all(&member).unwrap();
        std::fs::write(copy.join("Cargo.toml"), "[workspace]\nmembers = []\n").unwrap();
        std::fs::write(member.join("Cargo.toml"), "[package]\nname = \"x\"\n").unwrap();
        assert_eq!(workspace_root_from(&member), Some(copy.clone()));
        assert_eq!(workspace_root_from(Path::new("/")), None);
        std::fs::remove_dir_all(&copy).unwrap();
    }
}
