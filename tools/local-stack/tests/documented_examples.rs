//! Every shell example of README.md and docs/LOCAL.md, run as written against the stacks it says to
//! start, and checked against what its comments say it answers (`# → 200 COMMITTED`: the status `curl
//! -w` prints and the body's `status` or `error.code`; `# → {"vote": "PREPARED"}`: fields of the JSON
//! printed).
//!
//! "As written" with these changes only, each the effect of a flag or a variable the docs name: the
//! ports are free ones (`--api-port`, `--ws-port`, `--dynamodb-port`, `--invoke-port`, and 9100 for a
//! watch of one's own), `.local/` and `/tmp/` are folders of the test's own (`$TWOPC_LOCAL_DIR`), and
//! `cargo run -p local-stack --` is the `twopc-local` binary cargo built for the test. A block that
//! starts a stack (`up`, `up --auth jwt`, `up --lambda`) runs against one this test started with that
//! command; a block says which by what it runs. Every block is claimed by a [`Phase`], or skipped with
//! its reason: a new block that none claims fails `every_block_is_run_or_skipped_with_a_reason`.
//!
//! Needs `bash`, `curl` and `jq`. The `aws` CLI and `cargo lambda` are skipped (said on stderr) when
//! missing, unless `TWOPC_DOCS_REQUIRE_TOOLS` is set, as CI sets it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const DOCS: [&str; 2] = ["README.md", "docs/LOCAL.md"];
const INVOCATION: &str = "cargo run -p local-stack --";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the workspace")
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_twopc-local")
}

/// A fenced `sh` block.
#[derive(Debug, Clone)]
struct Block {
    doc: &'static str,
    line: usize,
    text: String,
}

impl std::fmt::Display for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.doc, self.line)
    }
}

fn blocks() -> Vec<Block> {
    let mut found = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(root().join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
        let mut current: Option<Block> = None;
        for (n, line) in text.lines().enumerate() {
            match &mut current {
                None if line.trim() == "```sh" => {
                    current = Some(Block { doc, line: n + 2, text: String::new() });
                }
                Some(_) if line.trim() == "```" => found.push(current.take().expect("a block")),
                Some(block) => {
                    block.text.push_str(line);
                    block.text.push('\n');
                }
                None => {}
            }
        }
    }
    found
}

/// One command of a block, its continuation lines included, and the answer its comment promises.
#[derive(Debug, Clone, PartialEq)]
struct Example {
    code: String,
    comment: String,
}

impl Example {
    /// What follows `→` in its comment.
    fn expected(&self) -> Option<&str> {
        self.comment.split_once('→').map(|(_, e)| e.trim())
    }
}

/// The commands of a block: a command starts on a line that is not indented, not a comment and not
/// inside a quote; an indented line, a line after a `\`, or one inside a quote continues it. Its
/// comments (on its lines, or on comment lines after it) are kept.
fn examples(block: &str) -> Vec<Example> {
    let mut found: Vec<Example> = Vec::new();
    let mut quote: Option<char> = None;
    let mut continued = false;
    for line in block.lines() {
        let starts_fresh = quote.is_none() && !continued;
        let trimmed = line.trim_start();
        if starts_fresh && (trimmed.is_empty() || trimmed.starts_with('#')) {
            if let Some(last) = found.last_mut().filter(|_| trimmed.starts_with('#')) {
                last.comment.push_str(trimmed.trim_start_matches('#'));
                last.comment.push(' ');
            }
            continue;
        }
        let (code, comment) = split_comment(line, &mut quote);
        if starts_fresh && !line.starts_with(char::is_whitespace) {
            found.push(Example { code: String::new(), comment: String::new() });
        }
        let example = found.last_mut().expect("a continuation line follows a command");
        example.code.push_str(code.trim_end());
        example.code.push('\n');
        if let Some(comment) = comment {
            example.comment.push_str(comment);
            example.comment.push(' ');
        }
        continued = quote.is_none() && code.trim_end().ends_with('\\');
    }
    found
}

/// A line's code and its comment (a `#` after a blank, outside quotes), carrying the quote a line
/// leaves open to the next.
fn split_comment<'a>(line: &'a str, quote: &mut Option<char>) -> (&'a str, Option<&'a str>) {
    let mut previous = ' ';
    for (at, c) in line.char_indices() {
        match *quote {
            Some(open) if c == open => *quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => *quote = Some(c),
            None if c == '#' && previous.is_whitespace() => return (&line[..at], Some(line[at + 1..].trim())),
            None => {}
        }
        previous = c;
    }
    (line, None)
}

/// What a block needs to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// `demo`, on free ports.
    Demo,
    /// Against `up` (its data under the test's own `$TWOPC_LOCAL_DIR`).
    Stack,
    /// After that stack stopped: `replay`, `reset`.
    Stopped,
    /// Against `up --auth jwt`.
    Auth,
    /// Against `up --lambda`, with `cargo lambda`.
    Lambda,
    Skipped(&'static str),
}

fn phase(block: &Block) -> Phase {
    let text = &block.text;
    if text.contains("<your-") {
        Phase::Skipped("its placeholders name your own crate and binary")
    } else if text.contains("-- demo") {
        Phase::Demo
    } else if text.contains("--auth jwt") {
        Phase::Auth
    } else if text.contains("cargo lambda") || text.contains("--lambda") {
        Phase::Lambda
    } else if text.contains("-- replay") || text.contains("-- reset") {
        Phase::Stopped
    } else {
        Phase::Stack
    }
}

/// Why a command of a claimed block is not run, if it is not.
fn skipped(code: &str) -> Option<&'static str> {
    if code.starts_with("cargo test") {
        Some("the tests' own command: this test runs inside it")
    } else if code.starts_with("pip install") {
        Some("installs cargo-lambda: CI installs the pinned versions of infra/build-requirements.txt")
    } else {
        None
    }
}

#[test]
fn every_block_is_run_or_skipped_with_a_reason() {
    let blocks = blocks();
    assert!(blocks.len() >= 10, "the docs' sh blocks: {blocks:?}");
    for wanted in [Phase::Demo, Phase::Stack, Phase::Stopped, Phase::Auth, Phase::Lambda] {
        assert!(blocks.iter().any(|b| phase(b) == wanted), "no block runs in {wanted:?}");
    }
    let mut up_commands = Vec::new();
    for block in &blocks {
        for example in examples(&block.text) {
            assert!(!example.code.trim().is_empty(), "{block}: an empty command in {:?}", block.text);
            if let Some(args) = example.code.trim().strip_prefix(INVOCATION).map(str::trim)
                && args.starts_with("up")
            {
                up_commands.push((block.to_string(), args.to_owned(), phase(block)));
            }
        }
    }
    // Each `up` a runnable block shows is one of the stacks the test starts for its phase.
    for (block, args, phase) in up_commands {
        let started = match phase {
            Phase::Stack => "up",
            Phase::Auth => "up --auth jwt",
            Phase::Lambda => "up --lambda",
            Phase::Skipped(_) => continue,
            other => panic!("{block}: `{args}` in a block of {other:?}"),
        };
        assert_eq!(args, started, "{block}: the stack the block needs");
    }
}

#[test]
fn a_command_is_split_from_its_comments_and_continuations() {
    let block = "API=http://x   # the API\n# Open.\ncurl -s $API -d '{\"a\": [\n  1]}'\n# → 200 COMMITTED\n\
                 ls a \\\n    b   # → {\"x\": 1}\n  # an indented comment\necho '#not a comment'\n";
    let found = examples(block);
    let codes: Vec<&str> = found.iter().map(|e| e.code.trim_end()).collect();
    assert_eq!(
        codes,
        ["API=http://x", "curl -s $API -d '{\"a\": [\n  1]}'", "ls a \\\n    b", "echo '#not a comment'"]
    );
    assert_eq!(found[1].expected(), Some("200 COMMITTED"));
    assert!(found[2].expected().is_some_and(|e| e.starts_with("{\"x\": 1}")), "{:?}", found[2]);
    assert_eq!(found[3].expected(), None);
}

// ---- running them -----------------------------------------------------------------------------------

/// Ports for the stacks these tests start come from below the kernel's ephemeral range (Linux's
/// `ip_local_port_range`, 32768 and up by default): a port the kernel handed out as free (`bind :0`) is an
/// ephemeral one, and the source port of any outgoing connection (the tests' own HTTP clients, run in
/// parallel) may take it in the seconds before DynamoDB Local binds it ("port ... is already in use").
const PORTS_FROM: u16 = 20_000;
const PORTS_TO: u16 = 32_000;

/// A port that is free now, outside the ephemeral range.
fn free_port() -> u16 {
    for _ in 0..1_000 {
        let port = PORTS_FROM + (uuid::Uuid::new_v4().as_u128() % u128::from(PORTS_TO - PORTS_FROM)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port from {PORTS_FROM} to {PORTS_TO}");
}

/// `count` consecutive free ports, outside the ephemeral range.
fn free_ports(count: u16) -> u16 {
    for _ in 0..200 {
        let base = free_port();
        if base > u16::MAX - count {
            continue;
        }
        let held: Vec<_> = (base..base + count).map(|p| std::net::TcpListener::bind(("127.0.0.1", p))).collect();
        if held.iter().all(Result::is_ok) {
            return base;
        }
    }
    panic!("no {count} consecutive free ports");
}

fn has_tool(command: &str, args: &[&str]) -> bool {
    Command::new(command).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Whether a tool the docs use is here; when not, skipped (said on stderr), or a failure under
/// `TWOPC_DOCS_REQUIRE_TOOLS`.
fn tool_or_skip(command: &str, args: &[&str], what: &str) -> bool {
    if has_tool(command, args) {
        return true;
    }
    assert!(
        std::env::var_os("TWOPC_DOCS_REQUIRE_TOOLS").is_none(),
        "{what} needs `{command}`, which is not installed (TWOPC_DOCS_REQUIRE_TOOLS is set)"
    );
    let _ = writeln!(std::io::stderr(), "SKIPPED {what}: `{command}` is not installed");
    false
}

/// Ports and folders of one run.
struct Place {
    dir: PathBuf,
    api: u16,
    ws: u16,
    dynamodb: u16,
    invoke: u16,
    own_watch: u16,
}

impl Place {
    fn new(name: &str) -> Place {
        let dir = root().join("target/docs-examples").join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("tmp")).unwrap();
        Place {
            dir,
            api: free_port(),
            ws: free_port(),
            dynamodb: free_port(),
            invoke: free_ports(5),
            own_watch: free_port(),
        }
    }

    fn local(&self) -> PathBuf {
        self.dir.join("local")
    }

    fn port_flags(&self) -> String {
        format!("--api-port {} --ws-port {} --dynamodb-port {}", self.api, self.ws, self.dynamodb)
    }

    /// A documented command as this run runs it: the flags' and the variable's effects, nothing else.
    fn rewrite(&self, code: &str) -> String {
        let mut code = code.replace(INVOCATION, bin());
        for host in ["127.0.0.1", "localhost"] {
            code = code
                .replace(&format!("{host}:3000"), &format!("127.0.0.1:{}", self.api))
                .replace(&format!("{host}:3001"), &format!("127.0.0.1:{}", self.ws))
                .replace(&format!("{host}:8000"), &format!("127.0.0.1:{}", self.dynamodb));
        }
        for n in 0..5u16 {
            for flag in ["--invoke-port 900", "127.0.0.1:900"] {
                let to = if flag.starts_with("--") { "--invoke-port " } else { "127.0.0.1:" };
                code = code.replace(&format!("{flag}{n}"), &format!("{to}{}", self.invoke + n));
            }
        }
        code = code.replace("--invoke-port 9100", &format!("--invoke-port {}", self.own_watch));
        code = code.replace(".local/", "$TWOPC_LOCAL_DIR/").replace("/tmp/", &format!("{}/tmp/", self.dir.display()));
        let subscribe = format!("{} subscribe ", bin());
        if code.starts_with(&subscribe) && !code.contains("--ws-port") {
            code = code.replacen(&subscribe, &format!("{subscribe}--ws-port {} ", self.ws), 1);
        }
        if code.starts_with(&format!("{} demo", bin())) {
            code = format!("{} {}", code.trim_end(), self.port_flags());
        }
        code
    }

    fn bash(&self) -> Command {
        let mut bash = Command::new("bash");
        bash.current_dir(root()).env("TWOPC_LOCAL_DIR", self.local()).env("NO_COLOR", "1");
        bash
    }
}

/// A `twopc-local up` of this run, stopped (Ctrl-C) when dropped.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Running {
    fn start(place: &Place, args: &str) -> Running {
        let log = place.dir.join(format!("{}.log", args.replace(' ', "_")));
        let mut command = Command::new(bin());
        command
            .args(args.split_whitespace())
            .args(place.port_flags().split_whitespace())
            .args(["--invoke-port", &place.invoke.to_string()])
            .current_dir(root())
            .env("TWOPC_LOCAL_DIR", place.local())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("err")).unwrap());
        let child = command.spawn().expect("twopc-local starts");
        let mut running = Running { child, log };
        let deadline = Instant::now() + Duration::from_secs(900);
        loop {
            if std::fs::read_to_string(&running.log).unwrap_or_default().contains("twopc local stack is up") {
                return running;
            }
            if let Ok(Some(status)) = running.child.try_wait() {
                panic!("`twopc-local {args}` stopped ({status}) before it was up: {}", running.output());
            }
            assert!(Instant::now() < deadline, "`twopc-local {args}` not up in 15 minutes: {}", running.output());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn output(&self) -> String {
        let out = std::fs::read_to_string(&self.log).unwrap_or_default();
        let err = std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default();
        format!(
            "{out}\n{}",
            err.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }

    /// Ctrl-C, and wait for it to stop everything it started.
    fn stop(mut self) {
        self.interrupt();
    }

    fn interrupt(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        // SAFETY: a signal to a child this test spawned and has not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("twopc-local did not stop within 60 s of Ctrl-C: {}", self.output());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.interrupt();
        } else {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a command printed and how it exited.
#[derive(Debug)]
struct Ran {
    code: String,
    expected: Option<String>,
    status: i32,
    stdout: String,
}

/// Runs a block's commands in one bash, in order (its variables carry from one to the next), and
/// returns each one's output. `cargo lambda watch` runs in the background until the block ends, and the
/// next command waits for its port.
fn run_block(place: &Place, block: &Block, examples: &[Example]) -> (Vec<Ran>, String) {
    let mut script = String::from("set -m\n");
    let mut background = Vec::new();
    for (i, example) in examples.iter().enumerate() {
        let code = place.rewrite(example.code.trim_end());
        script.push_str(&format!("printf '\\n@@begin {i}\\n'\n"));
        if code.starts_with("cargo lambda watch") {
            script.push_str(&format!("{code} > {}/watch-{i}.log 2>&1 &\nwatch_{i}=$!\n", place.dir.display()));
            script.push_str(&format!(
                "for _ in $(seq 3000); do (: </dev/tcp/127.0.0.1/{}) 2>/dev/null && break; sleep 0.2; done\n",
                place.own_watch
            ));
            script.push_str(&format!("printf '\\n@@end {i} 0\\n'\n"));
            background.push(i);
        } else {
            script.push_str(&format!("{code}\nprintf '\\n@@end {i} %s\\n' \"$?\"\n"));
        }
    }
    for i in background {
        script.push_str(&format!("kill -- -$watch_{i} 2>/dev/null; wait $watch_{i} 2>/dev/null\n"));
    }
    let output = place.bash().arg("-c").arg(&script).stdin(Stdio::null()).output().expect("bash runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let mut ran = Vec::new();
    for (i, example) in examples.iter().enumerate() {
        let begin = format!("\n@@begin {i}\n");
        let Some(start) = stdout.find(&begin).map(|at| at + begin.len()) else {
            panic!("{block}: `{}` never ran:\n{stdout}\n{stderr}", example.code.trim());
        };
        let end_marker = format!("\n@@end {i} ");
        let end = stdout[start..].find(&end_marker).map(|at| start + at).unwrap_or(stdout.len());
        let status = stdout[end..]
            .strip_prefix(&end_marker)
            .and_then(|rest| rest.lines().next())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(-1);
        ran.push(Ran {
            code: example.code.trim().to_owned(),
            expected: example.expected().map(str::to_owned),
            status,
            stdout: stdout[start..end].trim().to_owned(),
        });
    }
    (ran, stderr)
}

/// Checks a command's answer against its comment's `→`.
fn check(block: &Block, ran: &Ran, stderr: &str) {
    let context = || format!("{block}: `{}`\nprinted: {}\nstderr: {}", ran.code, ran.stdout, tail(stderr));
    assert_eq!(ran.status, 0, "exit status: {}", context());
    let Some(expected) = &ran.expected else { return };
    if let Some(code) = expected.get(..3).filter(|c| c.bytes().all(|b| b.is_ascii_digit())) {
        let (body, status) = ran.stdout.rsplit_once(char::is_whitespace).unwrap_or(("", &ran.stdout));
        assert_eq!(status, code, "HTTP status: {}", context());
        let word: String =
            expected[3..].trim_start().chars().take_while(|c| c.is_ascii_uppercase() || *c == '_').collect();
        if word.len() >= 3 {
            let body: Value = serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {}", context()));
            let said = body["status"].as_str().or(body["error"]["code"].as_str());
            assert_eq!(said, Some(word.as_str()), "the body's status or error code: {}", context());
        }
    } else if expected.starts_with('{') {
        let wanted: Value = serde_json::Deserializer::from_str(expected)
            .into_iter::<Value>()
            .next()
            .and_then(Result::ok)
            .unwrap_or_else(|| panic!("the comment's JSON: {}", context()));
        let printed = ran
            .stdout
            .lines()
            .rev()
            .find_map(|line| serde_json::from_str::<Value>(line).ok().filter(Value::is_object))
            .or_else(|| serde_json::from_str(&ran.stdout).ok())
            .unwrap_or_else(|| panic!("no JSON printed: {}", context()));
        for (field, value) in wanted.as_object().expect("an object") {
            assert_eq!(&printed[field], value, "{field}: {}", context());
        }
    } else {
        panic!("a `→` this test cannot check ({expected:?}): {}", context());
    }
}

fn tail(text: &str) -> String {
    text.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// The blocks of `phase`, each with the commands this run runs (an `up` is the stack already running).
fn blocks_of(phase_wanted: Phase) -> Vec<(Block, Vec<Example>)> {
    blocks()
        .into_iter()
        .filter(|b| phase(b) == phase_wanted)
        .map(|block| {
            let examples = examples(&block.text)
                .into_iter()
                .filter(|e| skipped(e.code.trim()).is_none())
                .filter(|e| !e.code.trim().starts_with(&format!("{INVOCATION} up")))
                .collect();
            (block, examples)
        })
        .collect()
}

fn run_and_check(place: &Place, phase_wanted: Phase, mut special: impl FnMut(&Block, &Example) -> bool) {
    for (block, examples) in blocks_of(phase_wanted) {
        let plain: Vec<Example> = examples.into_iter().filter(|e| !special(&block, e)).collect();
        if plain.is_empty() {
            continue;
        }
        let (ran, stderr) = run_block(place, &block, &plain);
        for ran in &ran {
            check(&block, ran, &stderr);
        }
    }
}

/// Polls `what` until it holds, for at most `secs`.
fn wait_for(secs: u64, what: &str, mut holds: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !holds() {
        assert!(Instant::now() < deadline, "not within {secs} s: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn curl_post(place: &Place, body: &str) -> String {
    let output = place
        .bash()
        .arg("-c")
        .arg(format!(
            "curl -s http://127.0.0.1:{}/transactions -H 'content-type: application/json' -d '{body}'",
            place.api
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

const OPEN_A_AND_B: &str = r#"{"participants": [
  {"service": "service-a", "operations": [{"op": "put", "key": {"entityId": "A"}, "data": {"balance": 500}, "ifNotExists": true}]},
  {"service": "service-b", "operations": [{"op": "put", "key": {"entityId": "B"}, "data": {"balance": 0}, "ifNotExists": true}]}]}"#;

#[test]
fn the_quick_start_demo_runs_as_written() {
    let place = Place::new("demo");
    // README.md and docs/LOCAL.md give the same quick start: the demo runs once.
    let mut seen = Vec::new();
    run_and_check(&place, Phase::Demo, |_, example| {
        let again = seen.contains(&example.code);
        seen.push(example.code.clone());
        again
    });
    let _ = std::fs::remove_dir_all(&place.dir);
}

/// `up`'s examples: the curl calls, `subscribe`, the lake, the aws CLI, the dead letters; then, with
/// the stack stopped, `replay` and `reset` (and `reset` refused while it ran).
#[test]
fn the_stacks_examples_answer_as_written() {
    let place = Place::new("stack");
    let has_aws = tool_or_skip("aws", &["--version"], "the aws CLI examples of docs/LOCAL.md");
    assert!(has_tool("jq", &["--version"]), "the docs' examples use jq: install it (apt-get install jq)");
    let stack = Running::start(&place, "up");

    // A dead letter as the stream processor writes one for a record it cannot deliver, for the dead
    // letters' examples and `replay` to find.
    let sample: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("events/stream-processor-commit.json")).unwrap())
            .unwrap();
    let record = &sample["Records"][0];
    let dead_letters = place.local().join("dead-letters");
    std::fs::create_dir_all(&dead_letters).unwrap();
    let letter = serde_json::json!({"unprocessableRecord": {
        "reason": "planted by the docs' test", "deadLetteredAt": "2026-11-29T00:00:00Z", "record": record}});
    let file =
        dead_letters.join(format!("20261129T000000Z-unprocessable-{}.json", record["eventID"].as_str().unwrap()));
    std::fs::write(&file, letter.to_string()).unwrap();

    let mut subscribed = None;
    run_and_check(&place, Phase::Stack, |block, example| {
        let code = place.rewrite(example.code.trim());
        if code.starts_with(&format!("{} subscribe", bin())) {
            subscribed = Some((block.clone(), code));
            return true;
        }
        if example.code.contains("aws dynamodb") || example.code.starts_with("ddb ") {
            return !has_aws;
        }
        // Run below, once the commits have reached the lake.
        example.code.contains(".local/lake")
    });
    // The lake's lines arrive after the commits, through the stream: its example is run again until
    // they are there.
    let lake = blocks_of(Phase::Stack)
        .into_iter()
        .find_map(|(block, examples)| {
            let lake: Vec<Example> = examples.into_iter().filter(|e| e.code.contains(".local/lake")).collect();
            (!lake.is_empty()).then_some((block, lake))
        })
        .expect("the lake's example");
    wait_for(60, "the lake example prints the commits' lines", || {
        let (ran, _) = run_block(&place, &lake.0, &lake.1);
        ran.iter().any(|r| r.status == 0 && r.stdout.contains("\"transactionId\""))
    });

    let (block, code) = subscribed.expect("docs/LOCAL.md follows commits with `twopc-local subscribe`");
    let printed = place.dir.join("subscribe.out");
    let mut follower = place
        .bash()
        .arg("-c")
        .arg(format!("exec {code}"))
        .stdout(std::fs::File::create(&printed).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let read = || std::fs::read_to_string(&printed).unwrap_or_default();
    wait_for(30, &format!("{block}: `{code}` prints the subscribe answer"), || read().contains("\"subscribed\""));
    let first: Value = serde_json::from_str(read().lines().next().unwrap()).unwrap();
    assert_eq!(first["refused"], serde_json::json!([]), "{block}: {first}");
    let answer = curl_post(
        &place,
        r#"{"participants": [{"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": 1}]}]}"#,
    );
    assert!(answer.contains("COMMITTED"), "{answer}");
    wait_for(30, &format!("{block}: `{code}` prints A's commit"), || {
        read().lines().any(|line| {
            serde_json::from_str::<Value>(line)
                .is_ok_and(|push| push["type"] == "commit" && push["key"]["entityId"] == "A")
        })
    });
    // SAFETY: a signal to a child this test spawned and has not reaped.
    unsafe { libc::kill(follower.id() as libc::pid_t, libc::SIGINT) };
    assert!(follower.wait().unwrap().success(), "Ctrl-C stops `subscribe`, exit 0");

    // `reset` while a stack runs: refused, nothing deleted (issue 44: it named flags reset does not take).
    let refused = place.bash().arg("-c").arg(format!("{} reset", bin())).output().unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("stop it first") && !said.contains("--db-path"), "{said}");
    assert!(place.local().join("dynamodb-data").is_dir() && file.exists(), "nothing was deleted");

    let log = stack.log.with_extension("err");
    stack.stop();
    // Issue 44: a log redirected to a file has none of ANSI's colour codes.
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("INFO") && !logged.contains('\u{1b}'), "{}", tail(&logged));
    run_and_check(&place, Phase::Stopped, |_, _| false);
    for kept in ["dynamodb-data", "lake", "checkpoints", "dead-letters"] {
        assert!(!place.local().join(kept).exists(), "reset deletes {kept}");
    }
    let _ = std::fs::remove_dir_all(&place.dir);
}

/// `up --auth jwt`: `token` prints one the stack takes; without the stack, `token` refuses.
#[test]
fn the_token_examples_answer_as_written() {
    let place = Place::new("auth");
    let stack = Running::start(&place, "up --auth jwt");
    run_and_check(&place, Phase::Auth, |_, _| false);
    stack.stop();
    // Issue 44: with no stack running, a token would be refused by the next (a new key pair).
    let refused = place.bash().arg("-c").arg(format!("{} token --sub alice", bin())).output().unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && refused.stdout.is_empty() && said.contains("up --auth jwt"), "{said}");
    // `reset` deletes the issuer's key with the rest.
    assert!(place.local().join("auth/issuer.json").is_file());
    let reset = place.bash().arg("-c").arg(format!("{} reset", bin())).output().unwrap();
    assert!(reset.status.success(), "{}", String::from_utf8_lossy(&reset.stderr));
    assert!(!place.local().join("auth").exists(), "reset deletes auth/");
    let _ = std::fs::remove_dir_all(&place.dir);
}

/// `up --lambda` and `cargo lambda invoke` of every sample event; a participant under a `cargo lambda
/// watch` of one's own.
#[test]
fn the_cargo_lambda_examples_answer_as_written() {
    if !tool_or_skip("cargo", &["lambda", "--version"], "the cargo lambda examples of docs/LOCAL.md") {
        return;
    }
    let place = Place::new("lambda");
    let stack = Running::start(&place, "up --lambda");
    // "open the accounts A and B first (see the curl section above)"
    let answer = curl_post(&place, OPEN_A_AND_B);
    assert!(answer.contains("COMMITTED"), "{answer}");
    run_and_check(&place, Phase::Lambda, |_, _| false);
    stack.stop();
    let _ = std::fs::remove_dir_all(&place.dir);
}
