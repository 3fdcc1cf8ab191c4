//! The demo: the Rust client (`twopc-client`: real HTTP and a real WebSocket) against the local stack. Opens two
//! accounts and a SKU of the example inventory, makes a transfer that commits, one that is refused, two
//! that conflict, an order (the inventory's own `reserve` and a payment, together) and one the
//! inventory refuses, then three held orders ("decide later": 202 `PREPARED` with `holdUntil`), one
//! approved (`POST /transactions/{id}/commit`), one rejected (`/abort`) and one left to expire (the
//! sweeper aborts it), and shows for each the phases and their timings, the votes and the outcome, what
//! the WebSocket client received and what reached the lake.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use local_stack::trace::{TraceRecorder, TransactionTrace};
use local_stack::{Config, Mode, Stack};
use serde_json::{Value, json};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use twopc_client::{
    Client, Outcome, ParticipantState, Push, RefusalCode, Status, Subscription, Transaction, op, topic,
};

const WAIT: Duration = Duration::from_secs(15);

pub async fn run(config: Config) -> Result<(), String> {
    let recorder = TraceRecorder::default();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_target(false).with_filter(filter))
        .with(
            recorder
                .clone()
                .with_filter(tracing_subscriber::filter::Targets::new().with_target("twopc", tracing::Level::INFO)),
        )
        .try_init();

    let began = Instant::now();
    println!("Starting the local stack...");
    let stack = tokio::select! {
        stack = Stack::start(config.clone()) => stack.map_err(|e| e.to_string())?,
        _ = tokio::signal::ctrl_c() => return Err("interrupted".into()),
    };
    let cold_start = began.elapsed();
    println!(
        "Ready in {:.1} s{}:",
        cold_start.as_secs_f64(),
        if stack.owns_dynamodb() { " (DynamoDB Local started and tables created)" } else { "" }
    );
    crate::print_endpoints(&stack, &config);

    let demo_started = Instant::now();
    let result = tokio::select! {
        result = scenario(&stack, &recorder, matches!(config.mode, Mode::Lambda(_)), config.sweep_interval) => result,
        _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
    };
    let demo_took = demo_started.elapsed();
    stack.stop().await;
    result?;
    println!(
        "\nCold start {:.1} s, demo {:.1} s. Everything the demo started is stopped.",
        cold_start.as_secs_f64(),
        demo_took.as_secs_f64()
    );
    println!(
        "To do this yourself in a browser: `cargo run -p local-stack -- up`, then open http://127.0.0.1:{}/ (the live page).",
        local_stack::DEFAULT_API_PORT
    );
    Ok(())
}

/// The transaction id the coordinator gives a request with this `Idempotency-Key` (so the client can
/// follow `tx:<id>` before sending it). Mirrors `twopc::coordinator`; checked against every answer.
fn transaction_id_for_key(key: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("tx-{}", &hex::encode(Sha256::digest(key.as_bytes()))[..32])
}

/// A participant's reason, cut to a line.
fn clip(text: &str) -> String {
    const MAX: usize = 120;
    match text.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

fn short(id: &str) -> String {
    format!("{}…", &id[..id.len().min(11)])
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A `holdUntil` (epoch ms) as a time of day.
fn clock_time(epoch_ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(epoch_ms as i64)
        .map_or_else(|| epoch_ms.to_string(), |t| t.format("%H:%M:%S%.3f UTC").to_string())
}

/// How long from now until `epoch_ms`, in seconds.
fn from_now(epoch_ms: u64) -> String {
    format!("{:.1} s", (epoch_ms as f64 - now_ms() as f64) / 1000.0)
}

/// Whether a transaction has ended (a held one is `PREPARED` before it ends).
fn ended(status: &Status) -> bool {
    matches!(status, Status::Committed | Status::Aborted)
}

/// A WebSocket client: pushes are kept until taken.
struct WsClient {
    pushes: Subscription,
    buffer: Vec<Push>,
    received: usize,
}

impl WsClient {
    async fn connect(url: &str) -> Result<WsClient, String> {
        let pushes = Subscription::connect(url).await.map_err(|e| format!("WebSocket connect to {url}: {e}"))?;
        Ok(WsClient { pushes, buffer: Vec::new(), received: 0 })
    }

    /// Waits until the buffered pushes satisfy `done`; false on timeout.
    async fn wait_for(&mut self, done: impl Fn(&[Push]) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !done(&self.buffer) {
            match tokio::time::timeout_at(deadline, self.pushes.next()).await {
                Ok(Some(Ok(push))) => {
                    self.received += 1;
                    self.buffer.push(push);
                }
                // A message that is not JSON says nothing the demo waits for.
                Ok(Some(Err(twopc_client::Error::Push { .. }))) => {}
                _ => return false,
            }
        }
        true
    }

    /// Subscribes and waits for the acknowledgement (the local stack sends the function's answer back).
    async fn subscribe(&mut self, topics: &[String]) -> Result<(), String> {
        self.pushes.subscribe(topics.iter().cloned()).await.map_err(|e| e.to_string())?;
        let acked = |m: &Push| matches!(m, Push::Subscribed(t) if t.len() == topics.len());
        if !self.wait_for(|buffer| buffer.iter().any(acked)).await {
            return Err(format!("no answer to the subscription to {topics:?}"));
        }
        self.buffer.retain(|m| !acked(m));
        Ok(())
    }

    fn take(&mut self, keep: impl Fn(&Push) -> bool) -> Vec<Push> {
        let (taken, rest) = std::mem::take(&mut self.buffer).into_iter().partition(|m| keep(m));
        self.buffer = rest;
        taken
    }
}

/// Every lake line in files written since `since`, with its file (lines that are not JSON skipped).
fn lake_lines(dir: &Path, since: SystemTime) -> Vec<(PathBuf, Value)> {
    local_services::firehose::LakeSink::read_lines(dir, Some(since))
        .into_iter()
        .filter_map(|(file, line)| serde_json::from_str(&line).ok().map(|value| (file, value)))
        .collect()
}

struct Submitted {
    label: &'static str,
    id: String,
    outcome: Outcome,
    elapsed: Duration,
    /// Entity topics the transaction writes.
    entities: Vec<String>,
}

impl Submitted {
    fn outcome(&self) -> &str {
        self.outcome.state().status.as_str()
    }
    fn committed(&self) -> bool {
        self.outcome.is_committed()
    }
}

struct Demo<'a> {
    api: Client,
    ws: WsClient,
    recorder: &'a TraceRecorder,
    lambda: bool,
    /// How often the stack's sweeper runs.
    sweep_every: Duration,
    run: String,
    count: u32,
    tables: BTreeMap<String, String>,
    lake_dir: PathBuf,
    events_dir: PathBuf,
    since: SystemTime,
    committed: Vec<String>,
    aborted: Vec<String>,
    alice: String,
    bob: String,
    lamp: String,
}

fn transfer(from: &str, to: &str, amount: u64) -> Transaction {
    Transaction::new()
        .participant("service-a", [op::add(from, "balance", -(amount as i64)).min(0)])
        .participant("service-b", [op::add(to, "balance", amount)])
}

impl Demo<'_> {
    fn entity_topics(&self, request: &Transaction) -> Vec<String> {
        let mut topics = Vec::new();
        for part in &request.participants {
            // A resource's changes are at the resource (the payment API), not in its table.
            if part.service == payments::SERVICE {
                continue;
            }
            let table = self.tables.get(&part.service).cloned().unwrap_or_default();
            for op in &part.operations {
                if let Some(id) = op.key().attributes().get("entityId").and_then(Value::as_str) {
                    topics.push(topic::entity(&table, id));
                }
            }
        }
        topics
    }

    /// Follows `tx:<id>` (the id its Idempotency-Key gives); the key and the entities it writes.
    async fn submit(&mut self, request: &Transaction) -> Result<(String, Vec<String>), String> {
        self.count += 1;
        let key = format!("demo-{}-{}", self.run, self.count);
        self.ws.subscribe(&[topic::transaction(&transaction_id_for_key(&key))]).await?;
        Ok((key, self.entity_topics(request)))
    }

    async fn post(api: &Client, key: &str, request: &Transaction) -> Result<(Outcome, Duration), String> {
        let started = Instant::now();
        let outcome = api.submit_with_key(request, key).await.map_err(|e| format!("POST /transactions: {e}"))?;
        Ok((outcome, started.elapsed()))
    }

    async fn one(&mut self, label: &'static str, request: Transaction) -> Result<Submitted, String> {
        let (key, entities) = self.submit(&request).await?;
        let (outcome, elapsed) = Self::post(&self.api, &key, &request).await?;
        Ok(self.finish(label, &key, outcome, elapsed, entities))
    }

    async fn two_at_once(&mut self, a: Transaction, b: Transaction) -> Result<(Submitted, Submitted), String> {
        let (key_a, entities_a) = self.submit(&a).await?;
        let (key_b, entities_b) = self.submit(&b).await?;
        let (ra, rb) = futures::join!(Self::post(&self.api, &key_a, &a), Self::post(&self.api, &key_b, &b));
        let (oa, ea) = ra?;
        let (ob, eb) = rb?;
        Ok((self.finish("A", &key_a, oa, ea, entities_a), self.finish("B", &key_b, ob, eb, entities_b)))
    }

    fn finish(
        &mut self,
        label: &'static str,
        key: &str,
        outcome: Outcome,
        elapsed: Duration,
        entities: Vec<String>,
    ) -> Submitted {
        let id = outcome.transaction_id().to_owned();
        // A request the coordinator retried answers with its last attempt's id (`<first id>-<n>`).
        let first = outcome.state().first_transaction_id.clone().unwrap_or_else(|| id.clone());
        if first != transaction_id_for_key(key) {
            eprintln!("note: the coordinator no longer derives ids from Idempotency-Key as this demo expects");
        }
        let submitted = Submitted { label, id, outcome, elapsed, entities };
        // A held transaction is counted once it is decided (`decide`, `await_expiry`).
        if submitted.committed() {
            self.committed.push(submitted.id.clone());
        } else if !submitted.outcome.is_held() {
            self.aborted.push(submitted.id.clone());
        }
        submitted
    }

    /// A held transaction's decision: `POST /transactions/{id}/commit` (approve) or `/abort` (reject), the
    /// answer and the phase it ran. The outcome replaces the held one.
    async fn decide(&mut self, s: &mut Submitted, approve: bool, indent: &str) -> Result<(), String> {
        let (route, verb) = if approve { ("commit", "Approved") } else { ("abort", "Rejected") };
        let started = Instant::now();
        let outcome = if approve { self.api.commit(&s.id).await } else { self.api.abort(&s.id).await }
            .map_err(|e| format!("POST /transactions/{}/{route}: {e}", s.id))?;
        let elapsed = started.elapsed();
        println!(
            "{indent}{verb}: POST /transactions/{}/{route} → {} {} in {} ms",
            short(&s.id),
            decision_http_status(approve, &outcome),
            outcome.state().status,
            elapsed.as_millis()
        );
        s.outcome = outcome;
        self.print_phases(s, indent, &[route], false);
        self.decided(s);
        Ok(())
    }

    /// Counts a held transaction once it is decided.
    fn decided(&mut self, s: &Submitted) {
        if s.committed() {
            self.committed.push(s.id.clone());
        } else if s.outcome.is_aborted() {
            self.aborted.push(s.id.clone());
        }
    }

    /// Waits for the `PREPARED` push of a held transaction on `tx:<id>` and prints it.
    async fn expect_held_push(&mut self, s: &Submitted, indent: &str) -> Result<(), String> {
        let id = s.id.clone();
        let is_held = move |m: &Push| matches!(m, Push::Transaction { transaction_id, status: Status::Prepared, .. } if *transaction_id == id);
        if !self.ws.wait_for(|buffer| buffer.iter().any(&is_held)).await {
            return Err(format!("the WebSocket client got no PREPARED message of {} within {WAIT:?}", s.id));
        }
        for m in self.ws.take(is_held) {
            if let Push::Transaction { hold_until, .. } = m {
                let until = hold_until.map_or("no holdUntil".to_owned(), |t| format!("holdUntil {}", clock_time(t)));
                println!("{indent}{:<10}transaction PREPARED, {until}", "WebSocket");
            }
        }
        Ok(())
    }

    /// A hold nobody decides: `GET /transactions/{id}` until it has ended. The stack's sweeper aborts it at
    /// its first run after `holdUntil` and twice the clock margin; the demo runs that sweep itself as soon as
    /// it is due (then at most once a second), rather than waiting up to a sweeper period for the timer.
    async fn await_expiry(&mut self, stack: &Stack, s: &mut Submitted, indent: &str) -> Result<(), String> {
        let hold_until =
            s.outcome.hold_until().ok_or_else(|| format!("a held answer without holdUntil: {:?}", s.outcome))?;
        let due = hold_until + 2 * twopc::clock::CLOCK_MARGIN_MS;
        println!(
            "{indent}Nobody decides. The sweeper aborts a hold at its first run after holdUntil + {} ms (twice the clock margin): it runs every {} s here (every minute deployed), and the demo runs one itself as soon as it is due, polling GET /transactions/{{id}} meanwhile",
            2 * twopc::clock::CLOCK_MARGIN_MS,
            self.sweep_every.as_secs()
        );
        let posted = Instant::now() - s.elapsed;
        let deadline = Instant::now() + Duration::from_millis(due.saturating_sub(now_ms())) + self.sweep_every + WAIT;
        let mut last_sweep: Option<Instant> = None;
        let mut aborted_by_demo = false;
        let mut seen_held = false;
        let got = loop {
            let got = self.api.get(&s.id).await.map_err(|e| format!("GET /transactions/{}: {e}", s.id))?;
            if got.is_held() && !seen_held {
                seen_held = true;
                println!(
                    "{indent}GET /transactions/{} → 200 PREPARED (holdUntil in {})",
                    short(&s.id),
                    from_now(hold_until)
                );
            }
            if ended(&got.state().status) {
                if !aborted_by_demo {
                    println!("{indent}sweep     the stack's own sweeper (its timer) ended it");
                }
                break got;
            }
            if Instant::now() > deadline {
                return Err(format!("the expired hold {} did not end by the sweeper's second run: {got:?}", s.id));
            }
            if now_ms() > due && last_sweep.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                last_sweep = Some(Instant::now());
                let report = stack.sweep().await.map_err(|e| e.to_string())?;
                if report["aborted"].as_u64().unwrap_or(0) > 0 {
                    aborted_by_demo = true;
                    println!(
                        "{indent}sweep     run by the demo {:.1} s after holdUntil: aborted {}",
                        (now_ms().saturating_sub(hold_until)) as f64 / 1000.0,
                        report["aborted"]
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        println!(
            // A read that finds the transaction answers 200 whatever its state (`Client::get` is Ok).
            "{indent}GET /transactions/{} → 200 {} {:.1} s after the POST: {}",
            short(&s.id),
            got.state().status,
            posted.elapsed().as_secs_f64(),
            got.state().reason.as_deref().map_or("(no reason)".to_owned(), clip)
        );
        s.outcome = got;
        self.print_phases(s, indent, &["abort"], false);
        self.decided(s);
        // Too late to approve: the commit finds it aborted.
        let late = self.api.commit(&s.id).await.map_err(|e| format!("POST /transactions/{}/commit: {e}", s.id))?;
        println!(
            "{indent}Too late: POST /transactions/{}/commit → {} {}",
            short(&s.id),
            decision_http_status(true, &late),
            late.state().status
        );
        if !late.is_aborted() {
            return Err(format!("a commit after holdUntil did not find the transaction aborted: {late:?}"));
        }
        Ok(())
    }

    /// The answer, the phases with their timings and votes.
    fn print_trace(&self, s: &Submitted, indent: &str) {
        let held = match s.outcome.hold_until() {
            Some(until) if s.outcome.is_held() => {
                format!("   holdUntil {} (in {})", clock_time(until), from_now(until))
            }
            _ => String::new(),
        };
        println!(
            "{indent}POST /transactions → {} {} in {} ms   {}{held}",
            s.outcome.http_status(),
            s.outcome(),
            s.elapsed.as_millis(),
            short(&s.id)
        );
        self.print_phases(s, indent, &["prepare", "hold", "commit", "abort"], true);
    }

    /// The phases `actions` of a transaction with their timings and answers (a prepare's: the vote), and the
    /// coordinator's own timings when `coordinator`.
    fn print_phases(&self, s: &Submitted, indent: &str, actions: &[&str], coordinator: bool) {
        let votes: BTreeMap<String, &ParticipantState> =
            s.outcome.state().participants.iter().map(|p| (p.service.clone(), p)).collect();
        let vote_text = |service: &str| {
            let Some(p) = votes.get(service) else { return "?".to_owned() };
            let vote = p.vote.as_ref().map_or("no vote", |v| v.as_str());
            match (p.code.as_ref().map(RefusalCode::as_str), p.reason.as_deref()) {
                (Some(code), Some(reason)) => format!("{vote} {code} ({})", clip(reason)),
                (Some(code), None) => format!("{vote} {code}"),
                _ => vote.to_owned(),
            }
        };
        let trace: Option<TransactionTrace> = self.recorder.get(&s.id);
        match trace {
            Some(trace) if !trace.calls.is_empty() => {
                for &action in actions {
                    let calls = trace.phase(action);
                    if calls.is_empty() {
                        continue;
                    }
                    let phase = trace.phase_duration(action).unwrap_or_default();
                    let parts: Vec<String> = calls
                        .iter()
                        .map(|c| {
                            let answer = if action == "prepare" {
                                vote_text(&c.service)
                            } else {
                                c.status.clone().unwrap_or_else(|| "?".into())
                            };
                            format!("{} {answer} {} ms", c.service, c.duration.as_millis())
                        })
                        .collect();
                    println!("{indent}  {action:<8}{:>4} ms  {}", phase.as_millis(), parts.join(" · "));
                }
                if coordinator && let (Some(prepare), Some(total)) = (trace.prepare_ms, trace.total_ms) {
                    println!("{indent}  coordinator: votes in {prepare} ms, answered after {total} ms");
                }
            }
            _ if !coordinator => {}
            _ => {
                let services: Vec<String> = votes.keys().map(|s| format!("{s} {}", vote_text(s))).collect();
                println!("{indent}  votes    {}", services.join(" · "));
                if self.lambda {
                    println!("{indent}  (phase timings are traced in-process only; the functions log theirs)");
                }
            }
        }
    }

    /// Waits for what the WebSocket client and the lake should get, and prints it.
    async fn expect_fanout(&mut self, transactions: &[&Submitted], indent: &str) -> Result<(), String> {
        let expected: Vec<(String, bool, Vec<String>)> =
            transactions.iter().map(|s| (s.id.clone(), s.committed(), s.entities.clone())).collect();
        let arrived =
            self.ws
                .wait_for(|buffer| {
                    expected.iter().all(|(id, committed, entities)| {
                        let of_tx = |m: &&Push| m.transaction_id() == Some(id.as_str());
                        let finished = buffer.iter().filter(of_tx).any(|m| {
                            m.ends_request() && matches!(m, Push::Transaction { status, .. } if ended(status))
                        });
                        let commits = buffer.iter().filter(of_tx).filter(|m| matches!(m, Push::Commit(_))).count();
                        finished && (!committed || commits >= entities.len())
                    })
                })
                .await;
        if !arrived {
            return Err(format!("the WebSocket client did not get every expected message within {WAIT:?}"));
        }
        let ids: Vec<String> = expected.iter().map(|(id, ..)| id.clone()).collect();
        let labels: BTreeMap<String, &str> = transactions.iter().map(|s| (s.id.clone(), s.label)).collect();
        // A retried attempt's push is its request's: labelled as the attempt it was retried as.
        let label_of = |m: &Push| match m {
            Push::Transaction { retried_as: Some(next), .. } => labels.get(next).copied(),
            _ => labels.get(m.transaction_id().unwrap_or_default()).copied(),
        };
        let multiple = transactions.len() > 1;
        // With an attempt that was retried (its push names the next attempt), heard on the same `tx:` topic.
        let retried = |m: &Push| matches!(m, Push::Transaction { retried_as: Some(next), .. } if ids.contains(next));
        let messages = self.ws.take(|m| m.transaction_id().is_some_and(|id| ids.iter().any(|i| i == id)) || retried(m));
        for (i, m) in messages.iter().enumerate() {
            let head = if i == 0 { "WebSocket" } else { "" };
            let who = if multiple { format!("{} ", label_of(m).unwrap_or("?")) } else { String::new() };
            let text = match m {
                Push::Commit(c) => {
                    let id = c.key.get("entityId").and_then(Value::as_str).unwrap_or("?");
                    // An account shows its balance, a SKU its stock.
                    let field = if c.data.get("stock").is_some() { "stock" } else { "balance" };
                    format!(
                        "commit {}/{id} v{}  {field} {} → {}",
                        c.table,
                        c.version,
                        c.previous[field].as_number().map_or("—".to_owned(), ToString::to_string),
                        c.data[field]
                    )
                }
                Push::Transaction { status, retried_as: Some(next), .. } => {
                    format!("transaction {status}, retried as {}", short(next))
                }
                Push::Transaction { status, .. } => format!("transaction {status}"),
                other => format!("{other:?}"),
            };
            println!("{indent}{head:<10}{who}{text}");
        }

        // The lake: a line per committed change; nothing for an abort.
        let wanted: usize = expected.iter().filter(|(_, c, _)| *c).map(|(_, _, e)| e.len()).sum();
        let deadline = Instant::now() + WAIT;
        let lines = loop {
            // The per-item lines; a committed transaction's own line (`kind`) is counted in the summary.
            let lines: Vec<(PathBuf, Value)> = lake_lines(&self.lake_dir, self.since)
                .into_iter()
                .filter(|(_, l)| l.get("kind").is_none())
                .filter(|(_, l)| l["transactionId"].as_str().is_some_and(|id| ids.iter().any(|i| i == id)))
                .collect();
            let distinct: std::collections::BTreeSet<&str> =
                lines.iter().filter_map(|(_, l)| l["eventId"].as_str()).collect();
            if distinct.len() >= wanted || Instant::now() > deadline {
                break lines;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if lines.len() < wanted {
            return Err(format!("the lake got {} of the {wanted} expected lines within {WAIT:?}", lines.len()));
        }
        if lines.is_empty() {
            let why = if transactions.iter().all(|s| s.outcome.hold_until().is_some()) {
                "a held transaction that aborts changes nothing"
            } else {
                "a refused transaction changes nothing"
            };
            println!("{indent}lake      nothing: {why}, so nothing is emitted");
        }
        for (i, (file, line)) in lines.iter().enumerate() {
            let head = if i == 0 { "lake" } else { "" };
            let file = file.strip_prefix(&self.lake_dir).unwrap_or(file).display().to_string();
            let who = if multiple {
                format!("{} ", labels.get(line["transactionId"].as_str().unwrap_or_default()).copied().unwrap_or("?"))
            } else {
                String::new()
            };
            println!(
                "{indent}{head:<10}{who}{}/{} v{} {}  → {file}",
                line["table"].as_str().unwrap_or("?"),
                line["key"]["entityId"].as_str().unwrap_or("?"),
                line["version"],
                line["change"].as_str().unwrap_or("?"),
            );
        }
        Ok(())
    }
}

/// The HTTP status a held transaction's `commit` (`approve`) or `abort` answers `outcome` with: 200 (or 202
/// `COMMITTING`) for the decision that won, 409 with the decided body for the other.
fn decision_http_status(approve: bool, outcome: &Outcome) -> u16 {
    match (approve, outcome) {
        (true, Outcome::Committed(_)) | (false, Outcome::Aborted(_)) => 200,
        (true, Outcome::Pending(_)) => 202,
        _ => 409,
    }
}

async fn scenario(stack: &Stack, recorder: &TraceRecorder, lambda: bool, sweep_every: Duration) -> Result<(), String> {
    let endpoints = stack.endpoints();
    let tables = endpoints.tables.participants.clone();
    let (a, b) = (tables["service-a"].clone(), tables["service-b"].clone());
    let api = Client::new(&endpoints.api).map_err(|e| e.to_string())?;
    let since = SystemTime::now() - Duration::from_secs(1);
    let mut ws = WsClient::connect(&endpoints.websocket).await?;
    let accounts = [topic::entity(&a, "alice"), topic::entity(&b, "bob")];

    ws.subscribe(&accounts).await?;
    println!("\nA WebSocket client is connected to {} and follows {}.", endpoints.websocket, accounts.join(", "));
    println!("Before each request it also follows tx:<id> (the id its Idempotency-Key gives).");

    let mut demo = Demo {
        api,
        ws,
        recorder,
        lambda,
        sweep_every,
        run: uuid::Uuid::new_v4().simple().to_string()[..8].to_owned(),
        count: 0,
        tables,
        lake_dir: endpoints.lake_dir.clone(),
        events_dir: endpoints.events_dir.clone(),
        since,
        committed: vec![],
        aborted: vec![],
        alice: "alice".into(),
        bob: "bob".into(),
        lamp: "lamp".into(),
    };

    let inventory = demo.tables.get(op::inventory::SERVICE).cloned();
    match &inventory {
        Some(_) => println!(
            "\n1. Open two accounts, alice with 100 at service-a and bob with 20 at service-b, and put a SKU in the inventory: 5 lamps (`put`s, ifNotExists)"
        ),
        None => println!(
            "\n1. Open two accounts: alice with 100 at service-a, bob with 20 at service-b (`put`s, ifNotExists)"
        ),
    }
    let open = |suffix: &str| {
        let mut open = Transaction::new()
            .participant(
                "service-a",
                [op::put(format!("alice{suffix}"), json!({"owner": "Alice", "balance": 100})).if_not_exists()],
            )
            .participant(
                "service-b",
                [op::put(format!("bob{suffix}"), json!({"owner": "Bob", "balance": 20})).if_not_exists()],
            );
        if inventory.is_some() {
            let lamp = json!({"name": "Lamp", "stock": 5, "reserved": 0, "active": true});
            open = open.participant(op::inventory::SERVICE, [op::put(format!("lamp{suffix}"), lamp).if_not_exists()]);
        }
        open
    };
    if let Some(table) = &inventory {
        demo.ws.subscribe(&[topic::entity(table, "lamp")]).await?;
    }
    let mut s = demo.one("open", open("")).await?;
    if !s.committed() && s.outcome.state().refused_with(&RefusalCode::ConditionFailed) {
        // Kept data from an earlier run: open fresh accounts beside the old ones.
        demo.print_trace(&s, "   ");
        let suffix = format!("-{}", &demo.run[..4]);
        println!(
            "   alice and bob exist from an earlier run (kept data): opening alice{suffix} and bob{suffix} instead"
        );
        let mut topics = vec![topic::entity(&a, &format!("alice{suffix}")), topic::entity(&b, &format!("bob{suffix}"))];
        if let Some(table) = &inventory {
            topics.push(topic::entity(table, &format!("lamp{suffix}")));
        }
        demo.ws.subscribe(&topics).await?;
        demo.lamp = format!("lamp{suffix}");
        demo.alice = format!("alice{suffix}");
        demo.bob = format!("bob{suffix}");
        s = demo.one("open", open(&suffix)).await?;
    }
    demo.print_trace(&s, "   ");
    if !s.committed() {
        return Err(format!("opening the accounts did not commit: {:?}", s.outcome));
    }
    demo.expect_fanout(&[&s], "   ").await?;
    let (alice, bob) = (demo.alice.clone(), demo.bob.clone());

    println!("\n2. alice sends 30 to bob");
    let s = demo.one("transfer", transfer(&alice, &bob, 30)).await?;
    demo.print_trace(&s, "   ");
    if !s.committed() {
        return Err(format!("the transfer did not commit: {:?}", s.outcome));
    }
    demo.expect_fanout(&[&s], "   ").await?;

    println!("\n3. alice sends 500 to bob: more than she has (the guard is min 0)");
    let refused = demo.one("refused", transfer(&alice, &bob, 500)).await?;
    demo.print_trace(&refused, "   ");
    if !refused.outcome.is_aborted() {
        return Err(format!("the overdraft was not refused: {:?}", refused.outcome));
    }
    demo.expect_fanout(&[&refused], "   ").await?;

    println!("\n4. alice sends 10 (A) and 20 (B) to bob at the same moment");
    let (x, y) = demo.two_at_once(transfer(&alice, &bob, 10), transfer(&alice, &bob, 20)).await?;
    demo.print_trace(&x, "   A ");
    demo.print_trace(&y, "   B ");
    let conflict = [&x, &y].iter().any(|s| s.outcome.state().refused_with(&RefusalCode::Conflict));
    match (x.committed(), y.committed()) {
        (true, false) | (false, true) if conflict => println!(
            "   The first to lock the accounts won; the other's prepare found the lock of an undecided transaction and voted CONFLICT, so nothing of it was applied."
        ),
        (true, true) => match [&x, &y].iter().find(|s| s.outcome.state().attempts.is_some()) {
            Some(retried) => println!(
                "   Both committed: {}'s first attempt met the other's lock and voted CONFLICT; the coordinator retried it as {} with its age, which waited for that lock and committed after it.",
                retried.label,
                short(&retried.id)
            ),
            None => {
                println!("   Both committed: the first had finished before the second prepared (no overlap this time).")
            }
        },
        (false, false) if conflict => println!(
            "   Each locked one account first and found the other's lock on the second: both voted CONFLICT somewhere, both aborted, nothing was applied. Only an older transaction ever waits for a younger one's lock, so waits never deadlock; a retry goes through."
        ),
        _ => println!("   Outcomes: A {}, B {}.", x.outcome(), y.outcome()),
    }
    demo.expect_fanout(&[&x, &y], "   ").await?;
    if !x.committed() && !y.committed() {
        println!("\n   A again, alone:");
        let again = demo.one("A", transfer(&alice, &bob, 10)).await?;
        demo.print_trace(&again, "   ");
        demo.expect_fanout(&[&again], "   ").await?;
    }

    let lamp = demo.lamp.clone();
    let card_payments = inventory.is_some() && demo.tables.contains_key(payments::SERVICE);
    let run = demo.run.clone();
    // An order: the inventory's `reserve`, alice's payment, bob's receipt and, with a card, its charge
    // (`tag` tells apart charges that would otherwise have the same reference).
    let order = |quantity: u64, price: u64, card: Option<(&str, u64)>, tag: &str| {
        let mut order = Transaction::new()
            .participant(op::inventory::SERVICE, [op::inventory::reserve(&lamp, quantity)])
            .participant("service-a", [op::add(&alice, "balance", -(price as i64)).min(0)])
            .participant("service-b", [op::add(&bob, "balance", price)]);
        if let Some((card, cents)) = card.filter(|_| card_payments) {
            let charge = op::custom("charge", format!("order-{run}-{quantity}-{card}{tag}"))
                .field("card", card)
                .field("amount", cents);
            order = order.participant(payments::SERVICE, [charge]);
        }
        order
    };
    if inventory.is_some() {
        println!(
            "\n5. alice buys 2 lamps from bob's shop for 15, and 9.00 EUR of delivery on her card: the inventory's own `reserve` (its rules: only an active SKU, never below zero), her payment, bob's receipt and the card charge (the payments resource: authorized at prepare, captured at commit), in one transaction"
        );
        let bought = demo.one("order", order(2, 15, Some(("4242424242424242", 900)), "")).await?;
        demo.print_trace(&bought, "   ");
        if !bought.committed() {
            return Err(format!("the order did not commit: {:?}", bought.outcome));
        }
        demo.expect_fanout(&[&bought], "   ").await?;

        println!(
            "\n6. alice orders 10 more lamps: 3 are left, and the inventory refuses with the numbers; she pays nothing"
        );
        let refused = demo.one("refused", order(10, 20, None, "")).await?;
        demo.print_trace(&refused, "   ");
        if !refused.outcome.state().refused_with(&RefusalCode::ConditionFailed) {
            return Err(format!("the order beyond the stock was not refused: {:?}", refused.outcome));
        }
        demo.expect_fanout(&[&refused], "   ").await?;

        if card_payments {
            println!(
                "\n7. alice buys 1 lamp with a card that is declined: the payments resource refuses, and nothing of the order is applied"
            );
            let declined = demo.one("refused", order(1, 5, Some(("4000000000000002", 900)), "")).await?;
            demo.print_trace(&declined, "   ");
            if !declined.outcome.state().refused_with(&RefusalCode::Rule) {
                return Err(format!("the declined card did not refuse the order: {:?}", declined.outcome));
            }
            demo.expect_fanout(&[&declined], "   ").await?;
            if let Some(api) = stack.payment_api() {
                let shown: Vec<String> =
                    api.authorizations().iter().map(|a| format!("{} {} cents {}", a.id, a.amount, a.status)).collect();
                println!("   payment API  {}; nothing left authorized", shown.join(", "));
                if !api.held().is_empty() {
                    return Err("the payment API holds money for an order that did not commit".into());
                }
            }
        }
    }

    // Decide later: held transactions (an order, or a transfer without the inventory), one approved, one
    // rejected, one left to expire.
    let mut step = match (inventory.is_some(), card_payments) {
        (true, true) => 8,
        (true, false) => 7,
        _ => 5,
    };
    let held = |hold_ms: u64, tag: &str| {
        let request = match inventory {
            Some(_) => order(1, 5, Some(("4242424242424242", 900)), tag),
            None => transfer(&alice, &bob, 5),
        };
        request.hold_ms(hold_ms)
    };
    let (what, card) = match (inventory.is_some(), card_payments) {
        (true, true) => ("orders 1 lamp for 5 and 9.00 EUR of delivery on her card", ", the card is authorized"),
        (true, false) => ("orders 1 lamp for 5", ""),
        _ => ("sends 5 to bob", ""),
    };
    println!(
        "\n{step}. Decide later: alice {what}, held for an approval (\"holdMs\": 60000). Every participant prepares and keeps its locks{card}; the answer is 202 PREPARED with holdUntil. Then it is approved: POST /transactions/{{id}}/commit"
    );
    let mut approved = demo.one("held", held(60_000, "-approved")).await?;
    demo.print_trace(&approved, "   ");
    if !approved.outcome.is_held() {
        return Err(format!("the held request was not held: {:?}", approved.outcome));
    }
    demo.expect_held_push(&approved, "   ").await?;
    demo.decide(&mut approved, true, "   ").await?;
    if !approved.committed() {
        return Err(format!("the approved transaction did not commit: {:?}", approved.outcome));
    }
    demo.expect_fanout(&[&approved], "   ").await?;

    step += 1;
    println!(
        "\n{step}. alice {what} again, held the same way, and it is rejected: POST /transactions/{{id}}/abort releases every lock{}; nothing is applied",
        if card_payments { " and voids the card's authorization" } else { "" }
    );
    let mut rejected = demo.one("held", held(60_000, "-rejected")).await?;
    demo.print_trace(&rejected, "   ");
    if !rejected.outcome.is_held() {
        return Err(format!("the held request was not held: {:?}", rejected.outcome));
    }
    demo.expect_held_push(&rejected, "   ").await?;
    demo.decide(&mut rejected, false, "   ").await?;
    if !rejected.outcome.is_aborted() {
        return Err(format!("the rejected transaction did not abort: {:?}", rejected.outcome));
    }
    demo.expect_fanout(&[&rejected], "   ").await?;

    step += 1;
    println!(
        "\n{step}. alice {what} once more, held for 1.5 s (\"holdMs\": 1500), and nobody decides: past holdUntil it aborts, and its locks are released"
    );
    let mut expired = demo.one("held", held(1_500, "-expired")).await?;
    demo.print_trace(&expired, "   ");
    if !expired.outcome.is_held() {
        return Err(format!("the held request was not held: {:?}", expired.outcome));
    }
    demo.expect_held_push(&expired, "   ").await?;
    demo.await_expiry(stack, &mut expired, "   ").await?;
    if !expired.outcome.is_aborted() {
        return Err(format!("the expired hold did not abort: {:?}", expired.outcome));
    }
    demo.expect_fanout(&[&expired], "   ").await?;
    if card_payments && let Some(api) = stack.payment_api() {
        let shown: Vec<String> = api
            .authorizations()
            .iter()
            .filter(|a| {
                a.reference.ends_with("-approved")
                    || a.reference.ends_with("-rejected")
                    || a.reference.ends_with("-expired")
            })
            .map(|a| format!("{} {} cents {}", a.id, a.amount, a.status))
            .collect();
        println!("   payment API  held orders: {}; nothing left authorized", shown.join(", "));
        if !api.held().is_empty() {
            return Err("the payment API holds money for an order that did not commit".into());
        }
    }

    // Everything committed is in; nothing else may be.
    let lines = lake_lines(&demo.lake_dir, demo.since);
    let of = |ids: &[String]| {
        lines.iter().filter(|(_, l)| l["transactionId"].as_str().is_some_and(|id| ids.iter().any(|i| i == id))).count()
    };
    let (committed_lines, aborted_lines) = (of(&demo.committed), of(&demo.aborted));
    let transaction_lines = lines.iter().filter(|(_, l)| l["kind"] == "transaction").count();
    let mut balances: BTreeMap<String, (u64, Value)> = BTreeMap::new();
    for (_, line) in lines
        .iter()
        .filter(|(_, l)| l["transactionId"].as_str().is_some_and(|id| demo.committed.iter().any(|i| i == id)))
        .filter(|(_, l)| l["data"].get("balance").is_some())
    {
        let who = line["key"]["entityId"].as_str().unwrap_or("?").to_owned();
        let version = line["version"].as_u64().unwrap_or(0);
        if balances.get(&who).is_none_or(|(v, _)| version > *v) {
            balances.insert(who, (version, line["data"]["balance"].clone()));
        }
    }
    println!("\nSummary");
    let total: Option<i64> = balances.values().map(|(_, b)| b.as_i64()).sum();
    let shown: Vec<String> = balances.iter().map(|(who, (_, b))| format!("{who} {b}")).collect();
    println!(
        "   balances  {}{}",
        shown.join(", "),
        total.map_or(String::new(), |t| format!("; total {t}, as opened (100 + 20)"))
    );
    println!(
        "   lake      {committed_lines} lines, all from the {} committed transactions ({transaction_lines} of them a transaction's own line so far); {aborted_lines} from the {} refused, rejected or expired",
        demo.committed.len(),
        demo.aborted.len()
    );
    println!("   WebSocket {} messages received", demo.ws.received);
    // The outcome events the bus received (the outcomes function reads the stream on its own: some may
    // still be on their way).
    let events = lake_lines(&demo.events_dir, demo.since);
    let heard = |suffix: &str, ids: &[String]| {
        ids.iter()
            .filter(|id| events.iter().any(|(_, e)| e["detail"]["outcomeId"] == format!("{id}:{suffix}").as_str()))
            .count()
    };
    println!(
        "   events    {} outcome events so far in {}/: {} of the {} commits, {} of the {} aborts",
        events.len(),
        demo.events_dir.display(),
        heard("COMMITTED", &demo.committed),
        demo.committed.len(),
        heard("ABORTED", &demo.aborted),
        demo.aborted.len()
    );
    if aborted_lines > 0 {
        return Err("a refused transaction reached the lake".into());
    }
    if total.is_some_and(|t| t != 120) {
        return Err("the balances do not add up to what was opened".into());
    }
    Ok(())
}
