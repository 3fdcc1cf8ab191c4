//! Scenario 6, the fan-out: the whole local stack (the stream processor fed from DynamoDB Streams as
//! Lambda's event source mapping feeds it, the Firehose endpoint writing the lake, the `@connections`
//! endpoint pushing over real WebSockets) on the bench's DynamoDB Local. Subscribers follow every
//! account; clients commit transfers between disjoint pairs as fast as they can. Measured: commits per
//! second into the lake and to every subscriber, and the delay from the coordinator's answer to each
//! push.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use local_stack::{Config, Stack};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use twopc_client::{Client, Push, Transaction, op, topic};

use crate::stats::{Summary, round};

/// The figures of one run.
#[derive(Debug, Clone)]
pub struct FanOut {
    pub commits: usize,
    pub subscribers: usize,
    pub topics_per_subscriber: usize,
    /// From the first transfer sent to the last of their changes in the lake.
    pub to_lake: Duration,
    /// From the first transfer sent to the last push reaching the last subscriber.
    pub to_subscribers: Duration,
    /// Pushes received of those a subscriber should get (2 per commit per subscriber).
    pub pushes_received: usize,
    pub pushes_expected: usize,
    /// From the coordinator's answer (COMMITTED) to each push's arrival.
    pub delay: Summary,
}

impl FanOut {
    pub fn lake_per_second(&self) -> f64 {
        self.commits as f64 / self.to_lake.as_secs_f64().max(1e-9)
    }

    pub fn subscribers_per_second(&self) -> f64 {
        self.commits as f64 / self.to_subscribers.as_secs_f64().max(1e-9)
    }

    pub fn json(&self) -> Value {
        json!({
            "commits": self.commits,
            "subscribers": self.subscribers,
            "topicsPerSubscriber": self.topics_per_subscriber,
            "toLakeSeconds": round(self.to_lake.as_secs_f64(), 3),
            "lakeCommitsPerSecond": round(self.lake_per_second(), 1),
            "toSubscribersSeconds": round(self.to_subscribers.as_secs_f64(), 3),
            "subscriberCommitsPerSecond": round(self.subscribers_per_second(), 1),
            "pushesReceived": self.pushes_received,
            "pushesExpected": self.pushes_expected,
            "commitToPush": self.delay.json(),
        })
    }
}

/// What a run does: how many commits, from how many clients, to how many subscribers.
#[derive(Debug, Clone, Copy)]
pub struct FanOutPlan {
    pub commits: usize,
    pub clients: usize,
    pub subscribers: usize,
}

const WAIT: Duration = Duration::from_secs(120);

pub async fn fanout(dynamodb_endpoint: &str, plan: FanOutPlan) -> Result<FanOut, String> {
    let lake_dir: PathBuf = std::env::temp_dir().join(format!("twopc-bench-lake-{}", uuid::Uuid::new_v4().simple()));
    let mut config = Config::isolated(dynamodb_endpoint, &lake_dir);
    // The local stack's default, 100 ms (Lambda polls a shard about four times a second, so a
    // deployed push waits up to about 150 ms longer).
    config.poll_interval = Config::default().poll_interval;
    let stack = Stack::start(config).await.map_err(|e| format!("the local stack: {e}"))?;
    let result = run(&stack, plan).await;
    stack.stop().await;
    let _ = std::fs::remove_dir_all(&lake_dir);
    result
}

async fn run(stack: &Stack, plan: FanOutPlan) -> Result<FanOut, String> {
    let e = stack.endpoints();
    let (table_a, table_b) = (&e.tables.participants["service-a"], &e.tables.participants["service-b"]);
    let api = Client::new(&e.api).map_err(|e| e.to_string())?;
    let pairs: Vec<(String, String)> = (0..plan.clients).map(|c| (format!("a{c}"), format!("b{c}"))).collect();
    for (a, b) in &pairs {
        let opening = Transaction::new()
            .participant("service-a", [op::put(a.as_str(), json!({"balance": 1_000_000}))])
            .participant("service-b", [op::put(b.as_str(), json!({"balance": 0}))]);
        let answer = api.submit(&opening).await.map_err(|e| format!("opening {a}, {b}: {e}"))?;
        if !answer.is_committed() {
            return Err(format!("opening {a}, {b}: {answer:?}"));
        }
    }
    let topics: Vec<String> =
        pairs.iter().flat_map(|(a, b)| [topic::entity(table_a, a), topic::entity(table_b, b)]).collect();

    // The subscribers, each following every account; each counts what it receives, with the time.
    let received: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
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
                    received.lock().await.push((commit.transaction_id, Instant::now()));
                }
            }
        }));
    }

    // The commits: each client its own pair (no conflicts), as fast as it can.
    let per_client = plan.commits.div_ceil(plan.clients);
    let started = Instant::now();
    let answered: Vec<Result<Vec<(String, Instant)>, String>> =
        futures::future::join_all(pairs.iter().map(|(a, b)| {
            let api = api.clone();
            async move {
                let mut done = Vec::new();
                for _ in 0..per_client {
                    let transfer = Transaction::new()
                        .participant("service-a", [op::add(a.as_str(), "balance", -1).min(0)])
                        .participant("service-b", [op::add(b.as_str(), "balance", 1)]);
                    let answer = api.submit(&transfer).await.map_err(|e| e.to_string())?;
                    if !answer.is_committed() {
                        return Err(format!("a transfer between disjoint accounts did not commit: {answer:?}"));
                    }
                    done.push((answer.transaction_id().to_owned(), Instant::now()));
                }
                Ok(done)
            }
        }))
        .await;
    let mut committed_at: HashMap<String, Instant> = HashMap::new();
    for client in answered {
        committed_at.extend(client?);
    }
    let commits = committed_at.len();

    // Into the lake: both changes of every transfer.
    let to_lake = loop {
        let lines = local_services::firehose::LakeSink::read_lines(&e.lake_dir, None);
        let in_lake = lines
            .iter()
            .filter_map(|(_, line)| serde_json::from_str::<Value>(line).ok())
            .filter(|l| l["transactionId"].as_str().is_some_and(|id| committed_at.contains_key(id)))
            .count();
        if in_lake >= 2 * commits {
            break started.elapsed();
        }
        if started.elapsed() > WAIT {
            return Err(format!("{in_lake} of {} changes reached the lake within {WAIT:?}", 2 * commits));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    // To every subscriber: both changes of every transfer, or as many as arrive while they keep coming.
    let expected = 2 * commits * plan.subscribers;
    let mut last_count = 0;
    let mut quiet_since = Instant::now();
    loop {
        let count = received.lock().await.iter().filter(|(id, _)| committed_at.contains_key(id)).count();
        if count >= expected || quiet_since.elapsed() > Duration::from_secs(5) || started.elapsed() > WAIT {
            break;
        }
        if count != last_count {
            last_count = count;
            quiet_since = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for subscriber in &subscribers {
        subscriber.abort();
    }
    let received = received.lock().await;
    let ours: Vec<&(String, Instant)> = received.iter().filter(|(id, _)| committed_at.contains_key(id)).collect();
    let last_push = ours.iter().map(|(_, at)| *at).max().unwrap_or(started);
    let delays: Vec<Duration> =
        ours.iter().map(|(id, at)| at.saturating_duration_since(committed_at[id.as_str()])).collect();
    Ok(FanOut {
        commits,
        subscribers: plan.subscribers,
        topics_per_subscriber: topics.len(),
        to_lake,
        to_subscribers: last_push.saturating_duration_since(started),
        pushes_received: ours.len(),
        pushes_expected: expected,
        delay: Summary::of(&delays),
    })
}
