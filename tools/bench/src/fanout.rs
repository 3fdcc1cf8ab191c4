//! Scenario 6, the fan-out: the whole local stack (the stream processor fed from DynamoDB Streams as
//! Lambda's event source mapping feeds it, the Firehose endpoint writing the lake, the `@connections`
//! endpoint pushing over real WebSockets) on a DynamoDB Local of its own, started for it (see
//! `main.rs`): DynamoDB Local keeps every stream record of every table in one SQLite table, and each
//! request on a table with a stream (its description includes the stream's), each write and each
//! `GetRecords` looks up the stream's first record by a walk over every older record of the other
//! streams, on the one thread that runs all requests. On the DynamoDB Local of scenarios 1–5 this
//! scenario's requests (its streams the newest) walked every record 1–5 had written, so it measured
//! something else in the full run than alone, and a transfer could miss its deadline.
//!
//! Subscribers follow every account; clients commit transfers between disjoint pairs as fast as they
//! can. Measured: commits per second into the lake and to every subscriber, the delay from the
//! coordinator's answer to each push, and each transfer's own latency.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_smithy_types::error::display::DisplayErrorContext;

use futures::StreamExt;
use local_stack::{Config, Stack};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use twopc_client::{Client, Push, Transaction, op, topic};

use crate::stats::{Summary, round};

/// The figures of one part of the run: transfers at a paced rate, or as fast as they are answered.
#[derive(Debug, Clone)]
pub struct Part {
    pub commits: usize,
    /// The rate the clients were held to (commits per second, all clients); None: as fast as answered.
    pub offered: Option<f64>,
    /// From the first transfer sent to the last one answered.
    pub sent: Duration,
    /// From the first transfer sent to the last of their changes in the lake.
    pub to_lake: Duration,
    /// From the first transfer sent to the last push reaching the last subscriber.
    pub to_subscribers: Duration,
    /// Pushes received of those a subscriber should get (2 per commit per subscriber).
    pub pushes_received: usize,
    pub pushes_expected: usize,
    /// From the coordinator's answer (COMMITTED) to each push's arrival.
    pub delay: Summary,
    /// Each transfer, from sending it to its COMMITTED answer (the client's view).
    pub transfer: Summary,
}

impl Part {
    pub fn committed_per_second(&self) -> f64 {
        self.commits as f64 / self.sent.as_secs_f64().max(1e-9)
    }

    pub fn lake_per_second(&self) -> f64 {
        self.commits as f64 / self.to_lake.as_secs_f64().max(1e-9)
    }

    pub fn subscribers_per_second(&self) -> f64 {
        self.commits as f64 / self.to_subscribers.as_secs_f64().max(1e-9)
    }

    pub fn json(&self) -> Value {
        json!({
            "commits": self.commits,
            "offeredCommitsPerSecond": self.offered,
            "sentSeconds": round(self.sent.as_secs_f64(), 3),
            "committedPerSecond": round(self.committed_per_second(), 1),
            "toLakeSeconds": round(self.to_lake.as_secs_f64(), 3),
            "lakeCommitsPerSecond": round(self.lake_per_second(), 1),
            "toSubscribersSeconds": round(self.to_subscribers.as_secs_f64(), 3),
            "subscriberCommitsPerSecond": round(self.subscribers_per_second(), 1),
            "pushesReceived": self.pushes_received,
            "pushesExpected": self.pushes_expected,
            "commitToPush": self.delay.json(),
            "transferLatency": self.transfer.json(),
        })
    }
}

/// The figures of one run.
#[derive(Debug, Clone)]
pub struct FanOut {
    pub subscribers: usize,
    pub topics_per_subscriber: usize,
    /// Transfers at a rate the fan-out keeps up with: the delay is the path's own.
    pub paced: Part,
    /// Transfers as fast as they are answered: the fan-out's capacity; the delay includes the queue.
    pub flat_out: Part,
    /// The deadline every transfer carries (`timeoutMs`).
    pub timeout_ms: u64,
    /// Transfers made before measuring, on a DynamoDB Local just started, and how long they took
    /// until their last change was in the lake.
    pub warmup_commits: usize,
    pub warmup: Duration,
}

impl FanOut {
    pub fn json(&self) -> Value {
        json!({
            "subscribers": self.subscribers,
            "topicsPerSubscriber": self.topics_per_subscriber,
            "paced": self.paced.json(),
            "flatOut": self.flat_out.json(),
            "timeoutMs": self.timeout_ms,
            "warmupCommits": self.warmup_commits,
            "warmupSeconds": round(self.warmup.as_secs_f64(), 3),
            "dynamodbLocal": "its own, started for this scenario",
        })
    }
}

/// What a run does: from how many clients, to how many subscribers, after how many unmeasured
/// commits; how many commits at which rate, then how many as fast as they are answered.
#[derive(Debug, Clone, Copy)]
pub struct FanOutPlan {
    pub clients: usize,
    pub subscribers: usize,
    /// Transfers made (by the same clients, on the same accounts) before the subscribers connect, not
    /// measured: the DynamoDB Local of this scenario has just started, and its JVM runs its first
    /// thousands of requests slowly while it compiles them.
    pub warmup: usize,
    /// Commits at `paced_rate` commits per second (all clients together).
    pub paced: usize,
    pub paced_rate: f64,
    /// Commits as fast as they are answered.
    pub flat_out: usize,
}

const WAIT: Duration = Duration::from_secs(120);

/// The deadline of every transfer of the scenario, in milliseconds: the contract's default, 3 s.
pub const TIMEOUT_MS: u64 = twopc::model::DEFAULT_TIMEOUT_MS;

/// Runs the scenario against `dynamodb_endpoint`, which should be a DynamoDB Local of its own.
pub async fn fanout(dynamodb_endpoint: &str, plan: FanOutPlan) -> Result<FanOut, String> {
    let lake_dir: PathBuf = std::env::temp_dir().join(format!("twopc-bench-lake-{}", uuid::Uuid::new_v4().simple()));
    let mut config = Config::isolated(dynamodb_endpoint, &lake_dir);
    // The local stack's default, 100 ms, the shortest wait between two polls of a stream (longer
    // while it stays idle; Lambda polls a shard about four times a second).
    config.poll_interval = Config::default().poll_interval;
    let stack = Stack::start(config).await.map_err(|e| format!("the local stack: {e}"))?;
    let result = run(&stack, plan).await;
    stack.stop().await;
    let _ = std::fs::remove_dir_all(&lake_dir);
    result
}

/// The subscribers' pushes: each one's transaction and arrival, and how many in all (read while
/// waiting, without taking the lock the subscribers need).
#[derive(Default)]
struct Received {
    pushes: Mutex<Vec<(String, Instant)>>,
    count: AtomicUsize,
}

async fn run(stack: &Stack, plan: FanOutPlan) -> Result<FanOut, String> {
    let e = stack.endpoints();
    let (table_a, table_b) = (&e.tables.participants["service-a"], &e.tables.participants["service-b"]);
    let api = Client::new(&e.api).map_err(|e| e.to_string())?;
    let pairs: Vec<(String, String)> = (0..plan.clients).map(|c| (format!("a{c}"), format!("b{c}"))).collect();
    let warming = Instant::now();
    let mut unmeasured: Vec<String> = Vec::new();
    for (a, b) in &pairs {
        let opening = Transaction::new()
            .participant("service-a", [op::put(a.as_str(), json!({"balance": OPENING}))])
            .participant("service-b", [op::put(b.as_str(), json!({"balance": 0}))])
            .timeout_ms(TIMEOUT_MS);
        let answer = api.submit(&opening).await.map_err(|e| format!("opening {a}, {b}: {e}"))?;
        if !answer.is_committed() {
            return Err(format!("opening {a}, {b}: {answer:?}"));
        }
        unmeasured.push(answer.transaction_id().to_owned());
    }

    // The warm-up: the same transfers, before anyone subscribes; then until the lake has them all, so
    // that none of them is still on its way when the measured ones start.
    let warmup_per_client = plan.warmup.div_ceil(plan.clients);
    let warmup = transfers(&api, &pairs, warmup_per_client, None).await?;
    let warmup_commits = warmup.len();
    let unmeasured: HashMap<String, Instant> =
        unmeasured.into_iter().map(|id| (id, warming)).chain(warmup.into_iter().map(|(id, _, at)| (id, at))).collect();
    wait_for_lake(&e.lake_dir, &unmeasured, warming).await?;
    let warmup = warming.elapsed();

    let topics: Vec<String> =
        pairs.iter().flat_map(|(a, b)| [topic::entity(table_a, a), topic::entity(table_b, b)]).collect();

    // The subscribers, each following every account; each counts what it receives, with the time.
    let received = Arc::new(Received::default());
    let mut subscribers = Vec::new();
    for _ in 0..plan.subscribers {
        let mut pushes = twopc_client::subscribe(&e.websocket, topics.clone()).await.map_err(|e| e.to_string())?;
        loop {
            match tokio::time::timeout(WAIT, pushes.next()).await {
                Ok(Some(Ok(Push::Subscribed(_)))) => break,
                Ok(Some(Ok(_))) => {}
                other => return Err(format!("a subscriber was not acknowledged: {other:?}")),
            }
        }
        let received = received.clone();
        subscribers.push(tokio::spawn(async move {
            while let Some(Ok(push)) = pushes.next().await {
                if let Push::Commit(commit) = push {
                    received.pushes.lock().await.push((commit.transaction_id, Instant::now()));
                    received.count.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    // First at a rate the fan-out keeps up with, then as fast as the transfers are answered, each
    // client on its own pair (no conflicts).
    let paced_per_client = plan.paced.div_ceil(plan.clients);
    let every = Duration::from_secs_f64(plan.clients as f64 / plan.paced_rate.max(1e-3));
    let paced = part(e, &api, &pairs, paced_per_client, Some(every), &received, plan.subscribers).await;
    let flat_out_per_client = plan.flat_out.div_ceil(plan.clients);
    let flat_out = match paced {
        Ok(_) => part(e, &api, &pairs, flat_out_per_client, None, &received, plan.subscribers).await,
        Err(_) => Err(String::new()),
    };
    for subscriber in &subscribers {
        subscriber.abort();
    }
    let (mut paced, flat_out) = (paced?, flat_out?);
    paced.offered = Some(plan.paced_rate);

    // Whatever the figures, every transfer applied once and nothing stayed locked.
    check_accounts(e, &pairs, warmup_per_client + paced_per_client + flat_out_per_client).await?;
    Ok(FanOut {
        subscribers: plan.subscribers,
        topics_per_subscriber: topics.len(),
        paced,
        flat_out,
        timeout_ms: TIMEOUT_MS,
        warmup_commits,
        warmup,
    })
}

/// One measured part: `per_client` transfers by each client (one every `every`, or as fast as
/// answered), then until the lake has both changes of each, and the subscribers their pushes (or
/// as many as arrive while they keep coming).
async fn part(
    e: &local_stack::Endpoints,
    api: &Client,
    pairs: &[(String, String)],
    per_client: usize,
    every: Option<Duration>,
    received: &Received,
    subscribers: usize,
) -> Result<Part, String> {
    // Every push counted so far belongs to an earlier part (the warm-up's came before anyone subscribed).
    let before = received.count.load(Ordering::Relaxed);
    let started = Instant::now();
    let measured = transfers(api, pairs, per_client, every).await?;
    let sent = started.elapsed();
    let mut committed_at: HashMap<String, Instant> = HashMap::new();
    let mut latencies = Vec::new();
    for (id, sent, answered) in measured {
        latencies.push(answered - sent);
        committed_at.insert(id, answered);
    }
    let commits = committed_at.len();

    // Into the lake: both changes of every transfer.
    let to_lake = wait_for_lake(&e.lake_dir, &committed_at, started).await?;

    // To every subscriber: both changes of every transfer, or as many as arrive while they keep coming.
    let expected = 2 * commits * subscribers;
    let mut last_count = 0;
    let mut quiet_since = Instant::now();
    loop {
        let count = received.count.load(Ordering::Relaxed) - before;
        if count >= expected || quiet_since.elapsed() > Duration::from_secs(5) || started.elapsed() > WAIT {
            break;
        }
        if count != last_count {
            last_count = count;
            quiet_since = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pushes = received.pushes.lock().await;
    let ours: Vec<&(String, Instant)> = pushes.iter().filter(|(id, _)| committed_at.contains_key(id)).collect();
    let last_push = ours.iter().map(|(_, at)| *at).max().unwrap_or(started);
    let delays: Vec<Duration> =
        ours.iter().map(|(id, at)| at.saturating_duration_since(committed_at[id.as_str()])).collect();
    Ok(Part {
        commits,
        offered: None,
        sent,
        to_lake,
        to_subscribers: last_push.saturating_duration_since(started),
        pushes_received: ours.len(),
        pushes_expected: expected,
        delay: Summary::of(&delays),
        transfer: Summary::of(&latencies),
    })
}

/// What each `a` account opens with.
const OPENING: i64 = 1_000_000;

/// A committed transfer: its id, when it was sent and when its COMMITTED answer came.
type Committed = (String, Instant, Instant);

/// `per_client` transfers of 1 from `a` to `b` by each client on its own pair, all clients at once,
/// each client sending one every `every` (the clients spread over the interval) or, with None, the
/// next as soon as the last is answered: each one's id, when it was sent and when its COMMITTED
/// answer came. One that does not commit is an error: the accounts are disjoint, so nothing but a
/// failure can refuse it.
async fn transfers(
    api: &Client,
    pairs: &[(String, String)],
    per_client: usize,
    every: Option<Duration>,
) -> Result<Vec<Committed>, String> {
    let clients = pairs.len().max(1) as u32;
    let answered: Vec<Result<Vec<Committed>, String>> =
        futures::future::join_all(pairs.iter().enumerate().map(|(c, (a, b))| {
            let api = api.clone();
            async move {
                let mut ticks = every.map(|every| {
                    let first = tokio::time::Instant::now() + every * c as u32 / clients;
                    let mut ticks = tokio::time::interval_at(first, every);
                    // A transfer answered late does not make the next ones crowd in after it.
                    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    ticks
                });
                let mut done = Vec::new();
                for _ in 0..per_client {
                    if let Some(ticks) = &mut ticks {
                        ticks.tick().await;
                    }
                    let transfer = Transaction::new()
                        .participant("service-a", [op::add(a.as_str(), "balance", -1).min(0)])
                        .participant("service-b", [op::add(b.as_str(), "balance", 1)])
                        .timeout_ms(TIMEOUT_MS);
                    let sent = Instant::now();
                    let answer = api.submit(&transfer).await.map_err(|e| e.to_string())?;
                    if !answer.is_committed() {
                        return Err(format!(
                            "a transfer between disjoint accounts did not commit ({:.0} ms after it was sent): {answer:?}",
                            sent.elapsed().as_secs_f64() * 1e3
                        ));
                    }
                    done.push((answer.transaction_id().to_owned(), sent, Instant::now()));
                }
                Ok(done)
            }
        }))
        .await;
    let mut all = Vec::new();
    for client in answered {
        all.extend(client?);
    }
    Ok(all)
}

/// Waits until the lake holds both changes of every transaction in `ids`; the time since `since`.
/// Each lake object is read once (the sink writes an object whole, then never again), so waiting
/// costs next to nothing while the pushes it runs beside are being measured.
async fn wait_for_lake(
    lake_dir: &std::path::Path,
    ids: &HashMap<String, Instant>,
    since: Instant,
) -> Result<Duration, String> {
    let mut read: HashSet<PathBuf> = HashSet::new();
    let mut in_lake = 0;
    loop {
        for file in local_services::firehose::LakeSink::files(lake_dir, None) {
            if read.contains(&file) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&file) else { continue };
            in_lake += text
                .lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .filter(|l| l["transactionId"].as_str().is_some_and(|id| ids.contains_key(id)))
                .count();
            read.insert(file);
        }
        if in_lake >= 2 * ids.len() {
            return Ok(since.elapsed());
        }
        if since.elapsed() > WAIT {
            return Err(format!("{in_lake} of {} changes reached the lake within {WAIT:?}", 2 * ids.len()));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// After the run: no item of the stack's tables is locked, and each pair holds what its transfers
/// make of it (`b` received one per transfer, `a` gave as much).
async fn check_accounts(
    e: &local_stack::Endpoints,
    pairs: &[(String, String)],
    transfers: usize,
) -> Result<(), String> {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("local", "local", None, None, "bench"))
        .endpoint_url(&e.dynamodb)
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    let transfers = transfers as i64;
    let mut wrong = Vec::new();
    for (service, table) in &e.tables.participants {
        let mut items = client.scan().table_name(table).consistent_read(true).into_paginator().items().send();
        while let Some(item) = items.next().await {
            let item = item.map_err(|e| format!("scanning {table}: {}", DisplayErrorContext(&e)))?;
            let id = item.get("entityId").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
            if item.contains_key("lock") || item.contains_key("lockShard") {
                wrong.push(format!("{table}/{id} is locked"));
            }
            let balance = item
                .get("data")
                .and_then(|d| d.as_m().ok())
                .and_then(|d| d.get("balance"))
                .and_then(|b| b.as_n().ok())
                .and_then(|b| b.parse::<i64>().ok());
            let should = match service.as_str() {
                "service-a" if pairs.iter().any(|(a, _)| *a == id) => Some(OPENING - transfers),
                "service-b" if pairs.iter().any(|(_, b)| *b == id) => Some(transfers),
                _ => None,
            };
            if should.is_some() && balance != should {
                wrong.push(format!("{table}/{id} holds {balance:?}, not {should:?}"));
            }
        }
    }
    if wrong.is_empty() { Ok(()) } else { Err(format!("after the run: {}", wrong.join("; "))) }
}
