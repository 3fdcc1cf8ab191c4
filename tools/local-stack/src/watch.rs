//! `cargo lambda watch` processes: each emulates the Lambda runtime and Invoke API for the
//! workspace's function binaries, with its own environment (one per participant deployment).

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

use crate::{Error, LambdaOptions};

/// Lines of output kept per process for error messages.
const TAIL_LINES: usize = 60;

/// Whether `cargo lambda` is installed (`pip install cargo-lambda ziglang`, or see cargo-lambda.info).
pub fn cargo_lambda_installed() -> bool {
    std::process::Command::new("cargo")
        .args(["lambda", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub(crate) struct Watch {
    name: String,
    port: u16,
    pid: Option<u32>,
    child: tokio::sync::Mutex<Child>,
    output: Arc<Mutex<VecDeque<String>>>,
}

impl Watch {
    /// Starts `cargo lambda watch` on 127.0.0.1:`port` in the workspace, with `env` added to this
    /// process's environment (the functions inherit it).
    pub(crate) fn spawn(
        name: &str,
        port: u16,
        env: &[(&str, String)],
        options: &LambdaOptions,
    ) -> Result<Watch, Error> {
        let mut command = Command::new("cargo");
        command
            // --locked: the watch builds what Cargo.lock says (the `cargo run` or `cargo test` that started
            // this stack has just brought the lock up to date), never a newer release it resolves itself.
            .args(["lambda", "watch", "--locked", "--invoke-address", "127.0.0.1", "--invoke-port", &port.to_string()])
            // Its default CORS answer would let any page read what it invokes; the stack's clients are no pages.
            .arg("--disable-cors")
            .current_dir(&options.workspace)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !options.reload {
            command.arg("--ignore-changes");
        }
        // What cargo set for this process when it ran it (`cargo run`, `cargo test`) describes this
        // crate, not the build the watch starts: a build script that reads one of them (ring's reads
        // CARGO_MANIFEST_DIR) would record it, and the next build from a plain shell would find it
        // changed and rebuild everything above that crate, twice over.
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(set_by_cargo_for_a_crate) {
                command.env_remove(&key);
            }
        }
        // Values such as the service registry are JSON with commas, which `--env-var` would split:
        // they go in the environment, which the functions inherit.
        for (key, value) in env {
            command.env(key, value);
        }
        #[cfg(target_os = "linux")]
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            // If this process dies without stopping it, the watch (and with it its functions) ends too.
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(|e| {
            Error::Lambda(format!(
                "could not run `cargo lambda watch` ({e}); install it with `pip install cargo-lambda ziglang`"
            ))
        })?;
        let output = Arc::new(Mutex::new(VecDeque::new()));
        let echo = options.echo_output;
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(forward(stdout, name.to_owned(), output.clone(), echo));
        }
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(forward(stderr, name.to_owned(), output.clone(), echo));
        }
        Ok(Watch { name: name.to_owned(), port, pid: child.id(), child: tokio::sync::Mutex::new(child), output })
    }

    /// Polls until the Invoke API accepts connections; fails if the process exits first.
    pub(crate) async fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        let started = Instant::now();
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_ok() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.lock().await.try_wait() {
                return Err(Error::Lambda(format!(
                    "`cargo lambda watch` for {} exited ({status}) before answering on port {}:\n{}",
                    self.name,
                    self.port,
                    self.output_tail()
                )));
            }
            if started.elapsed() > timeout {
                return Err(Error::Lambda(format!(
                    "`cargo lambda watch` for {} did not answer on port {} within {timeout:?}:\n{}",
                    self.name,
                    self.port,
                    self.output_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last lines the process printed, for error messages.
    pub(crate) fn output_tail(&self) -> String {
        let lines = self.output.lock().expect("not poisoned");
        let skip = lines.len().saturating_sub(20);
        lines.iter().skip(skip).map(|l| format!("[{}] {l}", self.name)).collect::<Vec<_>>().join("\n")
    }

    fn signal(&self, signal: i32) {
        if let Some(pid) = self.pid.and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill has no memory effects; the pid is our child's (not yet reaped, or gone).
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// SIGTERM (the watch stops its functions and exits), then SIGKILL after a grace period.
    pub(crate) async fn stop(&self) {
        let mut child = self.child.lock().await;
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        self.signal(libc::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
            let _ = child.kill().await;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(mut child) = self.child.try_lock()
            && matches!(child.try_wait(), Ok(None))
        {
            self.signal(libc::SIGTERM);
        }
    }
}

async fn forward(stream: impl AsyncRead + Unpin, name: String, tail: Arc<Mutex<VecDeque<String>>>, echo: bool) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        // The sweeper's metric line (Embedded Metric Format) every few seconds is noise here.
        if echo && !line.contains("\"_aws\":") {
            eprintln!("[{name}] {line}");
        }
        let mut kept = tail.lock().expect("not poisoned");
        if kept.len() == TAIL_LINES {
            kept.pop_front();
        }
        kept.push_back(line);
    }
}

/// The variables cargo sets for the crate it runs or tests (its manifest, package, binaries, scratch
/// folders), as opposed to the ones a user sets to configure cargo (`CARGO_HOME`, `CARGO_TARGET_DIR`,
/// `CARGO_BUILD_*`, ...), which the watch keeps.
fn set_by_cargo_for_a_crate(name: &str) -> bool {
    matches!(
        name,
        "CARGO_MANIFEST_DIR"
            | "CARGO_MANIFEST_PATH"
            | "CARGO_MANIFEST_LINKS"
            | "CARGO_CRATE_NAME"
            | "CARGO_BIN_NAME"
            | "CARGO_PRIMARY_PACKAGE"
            | "CARGO_TARGET_TMPDIR"
            | "CARGO_RUSTC_CURRENT_DIR"
            | "OUT_DIR"
    ) || name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_EXE_")
}

#[cfg(test)]
mod tests {
    use super::set_by_cargo_for_a_crate;

    #[test]
    fn a_crates_own_variables_are_not_passed_on_and_cargos_configuration_is() {
        for name in
            ["CARGO_MANIFEST_DIR", "CARGO_PKG_NAME", "CARGO_PKG_VERSION", "CARGO_BIN_EXE_twopc-local", "OUT_DIR"]
        {
            assert!(set_by_cargo_for_a_crate(name), "{name}");
        }
        for name in ["CARGO", "CARGO_HOME", "CARGO_TARGET_DIR", "CARGO_BUILD_JOBS", "CARGO_INCREMENTAL", "PATH"] {
            assert!(!set_by_cargo_for_a_crate(name), "{name}");
        }
    }
}
