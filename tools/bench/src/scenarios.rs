//! The six scenarios. Each returns its figures; an `Err` is a scenario that could not run (a
//! transaction that should have committed did not, an SDK error, ...).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use twopc::coordinator::Coordinator;

use crate::bench::{
    AGE_TOKEN_HEADER, Account, Answer, Bench, IDEMPOTENCY_KEY_HEADER, Outcome, body, check_exists, fan_body,
    is_transaction_conflict, participant, set_note, transfer_body,
};
use crate::capacity::{self, Capacity, Units};
use crate::counter::{Counts, RequestCounter, Times};
use crate::stats::{Rng, Summary, Tally};

/// Participant counts of the scaling and request-count scenarios.
pub const FAN_OUT: [usize; 4] = [1, 2, 4, 8];
/// A refused contended transfer is retried at most this many times in all: the client's requests per
/// transfer (2PC), or `TransactWriteItems` per transfer (4b).
pub const MAX_ATTEMPTS: u32 = 12;
/// The bound on attempts per committed contended transfer: the coordinator's own limit on the attempts
/// of one request (`MAX_ATTEMPTS` of issue 35's coordinator). Stated here, not read from `twopc`, so the
/// figure means the same against a coordinator that does not retry.
pub const COORDINATOR_ATTEMPT_BOUND: u32 = 16;
/// Full-jitter exponential backoff: attempt k sleeps uniformly in 0..min(cap, base·2^k) ms.
pub const BACKOFF_BASE_MS: u64 = 8;
pub const BACKOFF_CAP_MS: u64 = 256;
/// Size of the string field that the `set` case of scenario 5 rewrites (and that the documents hold).
pub const NOTE_BYTES: usize = 500;

/// Iteration counts and durations.
#[derive(Debug, Clone)]
pub struct Plan {
    pub quick: bool,
    pub global_warmup: usize,
    pub latency_warmup: usize,
    pub latency_iterations: usize,
    pub scaling_warmup: usize,
    pub scaling_iterations: usize,
    /// Simulated Lambda Invoke round trip per participant call (2b.); zero skips 2b.
    pub invoke_delay: Duration,
    pub delayed_warmup: usize,
    pub delayed_iterations: usize,
    pub throughput_clients: usize,
    pub contention_clients: usize,
    pub hot_accounts: usize,
    pub load_warmup: Duration,
    pub load_window: Duration,
    pub cost_warmup: usize,
    pub cost_transactions: usize,
    /// Scenario 7, per model: transfers (and as many `TransactWriteItems`) measured after the warm-up.
    pub projection_warmup: usize,
    pub projection_iterations: usize,
    /// Scenario 8: clients paying one hot merchant (and, in 8u, one merchant each).
    pub hot_receiver_clients: usize,
}

impl Plan {
    pub fn full() -> Plan {
        Plan {
            quick: false,
            global_warmup: 200,
            latency_warmup: 50,
            latency_iterations: 400,
            scaling_warmup: 10,
            scaling_iterations: 100,
            invoke_delay: Duration::from_millis(10),
            delayed_warmup: 3,
            delayed_iterations: 40,
            throughput_clients: 32,
            contention_clients: 16,
            hot_accounts: 4,
            load_warmup: Duration::from_secs(2),
            load_window: Duration::from_secs(10),
            cost_warmup: 3,
            cost_transactions: 20,
            projection_warmup: 10,
            projection_iterations: 300,
            hot_receiver_clients: 32,
        }
    }

    pub fn quick() -> Plan {
        Plan {
            quick: true,
            global_warmup: 10,
            latency_warmup: 3,
            latency_iterations: 20,
            scaling_warmup: 1,
            scaling_iterations: 6,
            delayed_warmup: 1,
            delayed_iterations: 2,
            load_warmup: Duration::from_millis(300),
            load_window: Duration::from_millis(1500),
            cost_warmup: 1,
            cost_transactions: 3,
            projection_warmup: 1,
            projection_iterations: 8,
            ..Plan::full()
        }
    }
}

/// Progress bars on stderr for long runs; hidden in quick mode.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub enabled: bool,
}

impl Progress {
    pub fn bar(&self, len: u64, label: &str) -> ProgressBar {
        if !self.enabled {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new(len);
        bar.set_style(
            ProgressStyle::with_template("{prefix:<28} [{bar:40}] {pos}/{len} {elapsed}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(label.to_owned());
        bar
    }

    /// A bar that fills over `total` by itself (timed phases).
    pub fn timed(&self, total: Duration, label: &str) -> Ticker {
        let bar = self.bar(total.as_millis() as u64, label);
        let ticking = bar.clone();
        let started = Instant::now();
        let task = tokio::spawn(async move {
            loop {
                ticking.set_position((started.elapsed().as_millis() as u64).min(ticking.length().unwrap_or(0)));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Ticker { bar, task }
    }
}

pub struct Ticker {
    bar: ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

pub fn committed(outcome: Outcome, what: &str) -> Result<(), String> {
    match outcome {
        Outcome::Committed => Ok(()),
        other => Err(format!("{what} did not commit: {other:?}")),
    }
}

async fn timed_commit(fut: impl Future<Output = Outcome>, what: &str) -> Result<Duration, String> {
    let started = Instant::now();
    let outcome = fut.await;
    let elapsed = started.elapsed();
    committed(outcome, what)?;
    Ok(elapsed)
}

fn acct(k: usize, id: &str) -> Account {
    (k, id.to_owned())
}

/// Warms the JVM (JIT) and the connection pool with the shapes measured afterwards.
pub async fn warm_up(b: &Bench, plan: &Plan, progress: Progress) -> Result<(), String> {
    let accounts: Vec<Account> = (1..=8).map(|k| acct(k, "warm")).collect();
    b.seed(&accounts).await.map_err(|e| e.to_string())?;
    let bar = progress.bar(plan.global_warmup as u64, "warm-up");
    let pair = fan_body(2, "warm");
    let wide = fan_body(8, "warm");
    for _ in 0..plan.global_warmup {
        committed(b.submit(&b.coordinator, &pair).await, "warm-up 2PC")?;
        committed(b.submit(&b.coordinator, &wide).await, "warm-up 2PC N=8")?;
        committed(b.transact_transfer(&accounts[0], &accounts[1], 1).await, "warm-up TransactWriteItems")?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 1. Latency

#[derive(Debug, Clone)]
pub struct Latency {
    pub twopc: Summary,
    pub baseline: Summary,
    /// Issue 48: the same transfer answered on its commit decision (`Prefer: respond-async`): the time to
    /// its 202 COMMITTING (its second phase runs after, untimed, before the next request).
    pub on_decision: Summary,
}

pub async fn latency(b: &Bench, plan: &Plan, progress: Progress) -> Result<Latency, String> {
    let (from, to) = (acct(1, "lat-a"), acct(2, "lat-b"));
    b.seed(&[from.clone(), to.clone()]).await.map_err(|e| e.to_string())?;
    let request = transfer_body(&from, &to, 1);
    let (mut twopc, mut baseline, mut on_decision) = (Vec::new(), Vec::new(), Vec::new());
    let total = plan.latency_warmup + plan.latency_iterations;
    let bar = progress.bar(total as u64, "1. latency");
    for i in 0..total {
        // Alternate which goes first, so that neither always follows the other.
        let (t2pc, tbase) = if i.is_multiple_of(2) {
            let a = timed_commit(b.submit(&b.coordinator, &request), "2PC transfer").await?;
            (a, timed_commit(b.transact_transfer(&from, &to, 1), "TransactWriteItems transfer").await?)
        } else {
            let c = timed_commit(b.transact_transfer(&from, &to, 1), "TransactWriteItems transfer").await?;
            (timed_commit(b.submit(&b.coordinator, &request), "2PC transfer").await?, c)
        };
        let started = Instant::now();
        let early = b.submit_on_decision(&request).await;
        let t_early = started.elapsed();
        if early != Outcome::Pending {
            return Err(format!("2PC transfer answered on its decision: {early:?}, not 202 COMMITTING"));
        }
        b.finish_after_answers().await;
        if i >= plan.latency_warmup {
            twopc.push(t2pc);
            baseline.push(tbase);
            on_decision.push(t_early);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(Latency { twopc: Summary::of(&twopc), baseline: Summary::of(&baseline), on_decision: Summary::of(&on_decision) })
}

// ---------------------------------------------------------------------------------------------
// 2. Scaling with N

#[derive(Debug, Clone)]
pub struct ScalingPoint {
    pub n: usize,
    pub parallel: Summary,
    pub sequential: Summary,
    /// N plain conditional UpdateItems sent at once, one per table: what the endpoint itself does
    /// with N concurrent requests (the floor of one parallel round of prepares or commits).
    pub raw: Summary,
}

pub async fn scaling(b: &Bench, plan: &Plan, progress: Progress) -> Result<Vec<ScalingPoint>, String> {
    let modes = (&b.coordinator, &b.sequential);
    fan_out_latency(b, modes, "scale", plan.scaling_warmup, plan.scaling_iterations, true, progress).await
}

/// 2b: the same with every participant call delayed like a Lambda Invoke.
pub async fn scaling_delayed(b: &Bench, plan: &Plan, progress: Progress) -> Result<Vec<ScalingPoint>, String> {
    let modes = (&b.delayed, &b.delayed_sequential);
    fan_out_latency(b, modes, "scale-delayed", plan.delayed_warmup, plan.delayed_iterations, false, progress).await
}

async fn fan_out_latency(
    b: &Bench,
    (parallel, sequential): (&Coordinator, &Coordinator),
    id: &str,
    warmup: usize,
    iterations: usize,
    with_raw: bool,
    progress: Progress,
) -> Result<Vec<ScalingPoint>, String> {
    let raw_id = format!("{id}-raw");
    let accounts: Vec<Account> = (1..=8).flat_map(|k| [acct(k, id), acct(k, &raw_id)]).collect();
    b.seed(&accounts).await.map_err(|e| e.to_string())?;
    let bodies: Vec<Vec<u8>> = FAN_OUT.iter().map(|&n| fan_body(n, id)).collect();
    let mut samples = vec![(Vec::new(), Vec::new(), Vec::new()); FAN_OUT.len()];
    let total = warmup + iterations;
    let bar = progress.bar(total as u64, &format!("2. scaling ({id})"));
    for i in 0..total {
        // Every N and both modes in each round, so that drift of the endpoint affects them alike.
        for (index, request) in bodies.iter().enumerate() {
            let n = FAN_OUT[index];
            let modes: [(&Coordinator, bool); 2] = if i.is_multiple_of(2) {
                [(parallel, false), (sequential, true)]
            } else {
                [(sequential, true), (parallel, false)]
            };
            for (coordinator, is_sequential) in modes {
                let took = timed_commit(b.submit(coordinator, request), &format!("2PC N={n}")).await?;
                if i >= warmup {
                    let slot = &mut samples[index];
                    if is_sequential { slot.1.push(took) } else { slot.0.push(took) }
                }
            }
            if with_raw {
                let took = timed_commit(b.parallel_updates(n, &raw_id), &format!("{n} parallel UpdateItems")).await?;
                if i >= warmup {
                    samples[index].2.push(took);
                }
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(FAN_OUT
        .iter()
        .zip(samples)
        .map(|(&n, (par, seq, raw))| ScalingPoint {
            n,
            parallel: Summary::of(&par),
            sequential: Summary::of(&seq),
            raw: Summary::of(&raw),
        })
        .collect())
}

// ---------------------------------------------------------------------------------------------
// 3. Throughput and 4. contention: closed-loop clients

/// What a set of clients did inside the measurement window (counted by completion time).
#[derive(Debug, Clone, Default)]
pub struct Load {
    pub clients: usize,
    pub window: Duration,
    /// Requests sent (every attempt).
    pub attempts: u64,
    pub committed: u64,
    pub refused: u64,
    pub pending: u64,
    pub failed: u64,
    /// Contended transfers that were refused `MAX_ATTEMPTS` times.
    pub gave_up: u64,
    pub refusals: BTreeMap<String, u64>,
    pub first_failure: Option<String>,
    /// Over the whole phase (warm-up and ramp-down included): attempts, commits, DynamoDB requests, time.
    pub attempts_total: u64,
    pub committed_total: u64,
    pub requests: u64,
    /// The same requests by (operation, table).
    pub requests_by: Counts,
    /// Capacity units they consumed, by (operation, table).
    pub capacity: Capacity,
    pub phase: Duration,
    /// Per committed transfer (with its retries, under contention).
    pub latency: Summary,
    latencies: Vec<Duration>,
    /// How contended transfers were retried (scenario 4 and 4b only).
    pub retries: Retries,
}

/// How the contended transfers were retried: attempts and requests per committed transfer, in the
/// window (counted by the time of the answer, as [`Load`] counts), and the transfers that gave up.
#[derive(Debug, Clone, Default)]
pub struct Retries {
    attempts: Vec<u32>,
    requests: Vec<u32>,
    /// Per committed transfer: the coordinator's attempts (the committed answer's `attempts`, 1 when it
    /// does not say), or for `TransactWriteItems` its requests.
    pub attempts_per_commit: Tally,
    /// Per committed transfer: the client's requests, its refused ones included.
    pub requests_per_commit: Tally,
    /// Answers in the window, and how many carried `attempts`.
    pub answers: u64,
    pub answers_with_attempts: u64,
    /// The coordinator's attempts behind the answers in the window: each answer's attempt number less
    /// the attempts its request's age token carried over from the request before.
    pub coordinator_attempts: u64,
    /// The most attempts one request made.
    pub max_request_attempts: u32,
    /// Requests in the window that sent an `Age-Token`.
    pub age_tokens_sent: u64,
    /// Transfers still refused after [`MAX_ATTEMPTS`] requests, over the whole phase (warm-up included;
    /// [`Load::gave_up`] counts those of the window).
    pub gave_up_phase: u64,
}

impl Retries {
    /// Records a 2PC answer: `carried` is the attempt number of the refusal whose age token the request
    /// sent (0 without one), `requests` the requests made for the transfer so far.
    fn answered(&mut self, answer: &Answer, carried: u32, requests: u32, in_window: bool) {
        if !in_window {
            return;
        }
        let own = answer.attempts.saturating_sub(carried).max(1);
        self.count(own, answer.reports_attempts, carried > 0);
        if answer.outcome == Outcome::Committed {
            self.committed(answer.attempts, requests);
        }
    }

    /// Records a `TransactWriteItems` of a contended transfer: each request is one attempt.
    fn transacted(&mut self, outcome: &Outcome, requests: u32, in_window: bool) {
        if !in_window {
            return;
        }
        self.count(1, false, false);
        if *outcome == Outcome::Committed {
            self.committed(requests, requests);
        }
    }

    fn count(&mut self, own_attempts: u32, reported: bool, sent_token: bool) {
        self.answers += 1;
        self.answers_with_attempts += u64::from(reported);
        self.coordinator_attempts += u64::from(own_attempts);
        self.max_request_attempts = self.max_request_attempts.max(own_attempts);
        self.age_tokens_sent += u64::from(sent_token);
    }

    fn committed(&mut self, attempts: u32, requests: u32) {
        self.attempts.push(attempts);
        self.requests.push(requests);
    }

    /// Coordinator attempts in the window that did not commit, over all of them.
    pub fn refused_attempt_rate(&self, committed: u64) -> f64 {
        if self.coordinator_attempts == 0 {
            return 0.0;
        }
        self.coordinator_attempts.saturating_sub(committed) as f64 / self.coordinator_attempts as f64
    }

    fn merge(&mut self, other: Retries) {
        self.attempts.extend(other.attempts);
        self.requests.extend(other.requests);
        self.answers += other.answers;
        self.answers_with_attempts += other.answers_with_attempts;
        self.coordinator_attempts += other.coordinator_attempts;
        self.max_request_attempts = self.max_request_attempts.max(other.max_request_attempts);
        self.age_tokens_sent += other.age_tokens_sent;
        self.gave_up_phase += other.gave_up_phase;
    }

    fn summarize(&mut self) {
        self.attempts_per_commit = Tally::of(&self.attempts);
        self.requests_per_commit = Tally::of(&self.requests);
    }
}

impl Load {
    pub fn per_second(&self) -> f64 {
        self.committed as f64 / self.window.as_secs_f64()
    }

    /// DynamoDB requests per attempt (committed or refused), over the whole phase.
    pub fn requests_per_attempt(&self) -> f64 {
        self.requests as f64 / self.attempts_total.max(1) as f64
    }

    /// DynamoDB requests per committed transfer (its refused attempts included), over the whole phase.
    pub fn requests_per_commit(&self) -> f64 {
        self.requests as f64 / self.committed_total.max(1) as f64
    }

    /// Requests per committed transfer by operation and kind of table ("UpdateItem on data").
    pub fn per_commit_by_operation(&self) -> BTreeMap<String, f64> {
        let mut ops: BTreeMap<String, f64> = BTreeMap::new();
        for ((op, table), n) in &self.requests_by {
            *ops.entry(format!("{op} on {}", table_kind(table))).or_default() +=
                *n as f64 / self.committed_total.max(1) as f64;
        }
        ops
    }

    /// Capacity units per committed transfer (its refused attempts included), over the whole phase.
    pub fn capacity_per_commit(&self) -> Units {
        capacity::sum(self.capacity.values()).per(self.committed_total)
    }

    /// DynamoDB requests per second the endpoint served, over the whole phase.
    pub fn requests_per_second(&self) -> f64 {
        self.requests as f64 / self.phase.as_secs_f64().max(1e-9)
    }

    /// Refused attempts over all attempts.
    pub fn abort_rate(&self) -> f64 {
        if self.attempts == 0 { 0.0 } else { self.refused as f64 / self.attempts as f64 }
    }

    fn merge(&mut self, other: Load) {
        self.attempts += other.attempts;
        self.committed += other.committed;
        self.refused += other.refused;
        self.pending += other.pending;
        self.failed += other.failed;
        self.gave_up += other.gave_up;
        self.attempts_total += other.attempts_total;
        self.committed_total += other.committed_total;
        for (code, n) in other.refusals {
            *self.refusals.entry(code).or_default() += n;
        }
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
        self.latencies.extend(other.latencies);
        self.retries.merge(other.retries);
    }

    /// Records one attempt that ended at `now`, if inside the window.
    fn record(&mut self, outcome: &Outcome, now: Instant, window: (Instant, Instant), since: Instant) {
        if let Outcome::Failed(message) = outcome {
            // Failures count wherever they happen: they are errors, not figures.
            self.failed += 1;
            self.first_failure.get_or_insert_with(|| message.clone());
            return;
        }
        self.attempts_total += 1;
        if *outcome == Outcome::Committed {
            self.committed_total += 1;
        }
        if !in_window(now, window) {
            return;
        }
        self.attempts += 1;
        match outcome {
            Outcome::Committed => {
                self.committed += 1;
                self.latencies.push(now - since);
            }
            Outcome::Refused(code) => {
                self.refused += 1;
                *self.refusals.entry(code.clone()).or_default() += 1;
            }
            Outcome::Pending => self.pending += 1,
            Outcome::Failed(_) => unreachable!("handled above"),
        }
    }

    /// Records a contended transfer still refused after [`MAX_ATTEMPTS`] requests, given up now.
    fn give_up(&mut self, window: (Instant, Instant)) {
        self.retries.gave_up_phase += 1;
        if in_window(Instant::now(), window) {
            self.gave_up += 1;
        }
    }
}

/// Whether `now` is inside the measurement window.
fn in_window(now: Instant, window: (Instant, Instant)) -> bool {
    now >= window.0 && now < window.1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    TwoPc,
    Baseline,
}

async fn run_clients<F, Fut>(counter: &RequestCounter, clients: usize, plan: &Plan, client: F) -> Load
where
    F: Fn(usize, (Instant, Instant)) -> Fut,
    Fut: Future<Output = Load> + Send + 'static,
{
    let started = Instant::now();
    let before = counter.snapshot();
    let capacity_before = counter.capacity();
    let t0 = started + plan.load_warmup;
    let window = (t0, t0 + plan.load_window);
    let tasks: Vec<_> = (0..clients).map(|c| tokio::spawn(client(c, window))).collect();
    let mut load = Load { clients, window: plan.load_window, ..Load::default() };
    for task in tasks {
        match task.await {
            Ok(part) => load.merge(part),
            Err(e) => {
                load.failed += 1;
                load.first_failure.get_or_insert_with(|| format!("client task failed: {e}"));
            }
        }
    }
    load.latency = Summary::of(&load.latencies);
    load.retries.summarize();
    load.requests_by = RequestCounter::diff(&before, &counter.snapshot());
    load.requests = RequestCounter::total(&load.requests_by);
    load.capacity = capacity::diff(&capacity_before, &counter.capacity());
    load.phase = started.elapsed();
    load
}

/// Client `c` transfers 1 back and forth between its own two accounts until the window closes.
async fn disjoint_client(b: Arc<Bench>, path: Path, c: usize, window: (Instant, Instant)) -> Load {
    let prefix = match path {
        Path::TwoPc => "tp",
        Path::Baseline => "twi",
    };
    let (a, z) = (acct(1, &format!("{prefix}-{c}")), acct(2, &format!("{prefix}-{c}")));
    let forth = transfer_body(&a, &z, 1);
    let back = transfer_body(&z, &a, 1);
    let mut load = Load::default();
    let mut i = 0u64;
    while Instant::now() < window.1 {
        let started = Instant::now();
        let outcome = match (path, i.is_multiple_of(2)) {
            (Path::TwoPc, true) => b.submit(&b.coordinator, &forth).await,
            (Path::TwoPc, false) => b.submit(&b.coordinator, &back).await,
            (Path::Baseline, true) => b.transact_transfer(&a, &z, 1).await,
            (Path::Baseline, false) => b.transact_transfer(&z, &a, 1).await,
        };
        load.record(&outcome, Instant::now(), window, started);
        i += 1;
    }
    load
}

#[derive(Debug, Clone)]
pub struct Throughput {
    pub twopc: Load,
    pub baseline: Load,
}

pub async fn throughput(b: &Arc<Bench>, plan: &Plan, progress: Progress) -> Result<Throughput, String> {
    let clients = plan.throughput_clients;
    let accounts: Vec<Account> = (0..clients)
        .flat_map(|c| {
            ["tp", "twi"].into_iter().flat_map(move |p| [acct(1, &format!("{p}-{c}")), acct(2, &format!("{p}-{c}"))])
        })
        .collect();
    b.seed(&accounts).await.map_err(|e| e.to_string())?;
    let phase = plan.load_warmup + plan.load_window;
    let baseline = {
        let _ticker = progress.timed(phase, "3. throughput TWI");
        run_clients(&b.counter, clients, plan, |c, w| disjoint_client(b.clone(), Path::Baseline, c, w)).await
    };
    let twopc = {
        let _ticker = progress.timed(phase, "3. throughput 2PC");
        run_clients(&b.counter, clients, plan, |c, w| disjoint_client(b.clone(), Path::TwoPc, c, w)).await
    };
    Ok(Throughput { twopc, baseline })
}

#[derive(Debug, Clone)]
pub struct Contention {
    pub load: Load,
    pub locks_left: Vec<String>,
    pub balance_before: i128,
    pub balance_after: i128,
}

/// 4b: the same clients on the same hot accounts, each transfer one `TransactWriteItems`.
#[derive(Debug, Clone)]
pub struct ContentionPeer {
    pub load: Load,
    pub balance_before: i128,
    pub balance_after: i128,
}

/// The hot accounts: half on service-1, half on service-2; every transfer goes between the two.
fn hot_accounts(plan: &Plan) -> (Vec<Account>, Vec<Account>) {
    let half = (plan.hot_accounts / 2).max(1);
    (
        (0..half).map(|i| acct(1, &format!("hot-{i}"))).collect(),
        (0..half).map(|i| acct(2, &format!("hot-{i}"))).collect(),
    )
}

/// Waits before retry `request` (1 for the first retry): full jitter, uniform in
/// 0..min(cap, base·2^(request-1)) ms.
async fn back_off(rng: &mut Rng, request: u32) {
    let ceiling = (BACKOFF_BASE_MS << (request - 1)).min(BACKOFF_CAP_MS);
    tokio::time::sleep(Duration::from_micros(rng.below(ceiling * 1000 + 1))).await;
}

/// The next transfer of a contended client: one hot account of each service, direction random.
fn hot_transfer<'a>(rng: &mut Rng, left: &'a [Account], right: &'a [Account]) -> (&'a Account, &'a Account) {
    let l = &left[rng.below(left.len() as u64) as usize];
    let r = &right[rng.below(right.len() as u64) as usize];
    if rng.below(2) == 0 { (l, r) } else { (r, l) }
}

/// Client `c` of 4: 2PC transfers between hot accounts; a refused one (409) is sent again after a
/// backoff, with the `Age-Token` of the refusal when it has one (the retry keeps the transfer's age),
/// at most [`MAX_ATTEMPTS`] requests per transfer.
async fn contended_client(b: Arc<Bench>, plan: Plan, c: usize, window: (Instant, Instant)) -> Load {
    let (left, right) = hot_accounts(&plan);
    let mut rng = Rng::new(0xC0FFEE + c as u64);
    let mut load = Load::default();
    while Instant::now() < window.1 {
        let (from, to) = hot_transfer(&mut rng, &left, &right);
        let request = transfer_body(from, to, 1);
        if !transfer_with_retries(&b, &mut rng, &mut load, window, &request, false).await {
            break;
        }
    }
    load
}

/// Sends one 2PC transfer, and sends it again after each refusal (409) with the refusal's `Age-Token`
/// when it has one, after a full-jitter backoff, at most [`MAX_ATTEMPTS`] requests; `keyed`: every
/// request under a fresh `Idempotency-Key`, as the typed client sends a retry with an age token
/// (`submit_with_age`). False when the window closed on a refusal (the client stops there).
async fn transfer_with_retries(
    b: &Bench,
    rng: &mut Rng,
    load: &mut Load,
    window: (Instant, Instant),
    request: &[u8],
    keyed: bool,
) -> bool {
    let first = Instant::now();
    // The last refusal's age token and its attempt number, sent back by the next request.
    let mut carried: Option<(String, u32)> = None;
    for requests in 1..=MAX_ATTEMPTS {
        let key = keyed.then(|| uuid::Uuid::new_v4().to_string());
        let mut headers = Vec::with_capacity(2);
        if let Some(key) = &key {
            headers.push((IDEMPOTENCY_KEY_HEADER, key.as_str()));
        }
        if let Some((token, _)) = &carried {
            headers.push((AGE_TOKEN_HEADER, token.as_str()));
        }
        let answer = b.submit_with_headers(&b.coordinator, request, &headers).await;
        let now = Instant::now();
        load.record(&answer.outcome, now, window, first);
        let carried_attempts = carried.as_ref().map_or(0, |(_, n)| *n);
        load.retries.answered(&answer, carried_attempts, requests, in_window(now, window));
        if !matches!(answer.outcome, Outcome::Refused(_)) {
            return true;
        }
        if now >= window.1 {
            return false;
        }
        carried = answer.age_token.map(|token| (token, answer.attempts));
        back_off(rng, requests).await;
    }
    load.give_up(window);
    true
}

/// Client `c` of 4b: the same transfers, each one `TransactWriteItems` (the debit guarded by
/// `min: 0`, as the 2PC's); one cancelled for a `TransactionConflict` is sent again after the same
/// backoff, at most [`MAX_ATTEMPTS`] times. Any other refusal ends the transfer.
async fn contended_transact_client(b: Arc<Bench>, plan: Plan, c: usize, window: (Instant, Instant)) -> Load {
    let (left, right) = hot_accounts(&plan);
    let mut rng = Rng::new(0xC0FFEE + c as u64);
    let mut load = Load::default();
    while Instant::now() < window.1 {
        let (from, to) = hot_transfer(&mut rng, &left, &right);
        if !transact_with_retries(&b, &mut rng, &mut load, window, from, to).await {
            break;
        }
    }
    load
}

/// One transfer as `TransactWriteItems`, sent again after a `TransactionConflict` (backoff as
/// [`transfer_with_retries`], at most [`MAX_ATTEMPTS`] requests). False when the window closed on a
/// conflict.
async fn transact_with_retries(
    b: &Bench,
    rng: &mut Rng,
    load: &mut Load,
    window: (Instant, Instant),
    from: &Account,
    to: &Account,
) -> bool {
    let first = Instant::now();
    for requests in 1..=MAX_ATTEMPTS {
        let outcome = b.transact_transfer(from, to, 1).await;
        let now = Instant::now();
        load.record(&outcome, now, window, first);
        load.retries.transacted(&outcome, requests, in_window(now, window));
        if !is_transaction_conflict(&outcome) {
            return true;
        }
        if now >= window.1 {
            return false;
        }
        back_off(rng, requests).await;
    }
    load.give_up(window);
    true
}

/// The sum of the hot accounts' balances.
async fn hot_sum(b: &Bench, hot: &[Account]) -> Result<i128, String> {
    let mut total = 0i128;
    for account in hot {
        total += b.balance(account).await.map_err(|e| e.to_string())?;
    }
    Ok(total)
}

/// A contended phase (4. or 4b.): the hot accounts seeded, `client`s run on them, their balances summed
/// before and after.
async fn contended_phase<F, Fut>(
    b: &Arc<Bench>,
    plan: &Plan,
    progress: Progress,
    label: &str,
    client: F,
) -> Result<(Load, i128, i128), String>
where
    F: Fn(usize, (Instant, Instant)) -> Fut,
    Fut: Future<Output = Load> + Send + 'static,
{
    let (left, right) = hot_accounts(plan);
    let hot: Vec<Account> = left.into_iter().chain(right).collect();
    b.seed(&hot).await.map_err(|e| e.to_string())?;
    let balance_before = hot_sum(b, &hot).await?;
    let load = {
        let _ticker = progress.timed(plan.load_warmup + plan.load_window, label);
        run_clients(&b.counter, plan.contention_clients, plan, client).await
    };
    let balance_after = hot_sum(b, &hot).await?;
    Ok((load, balance_before, balance_after))
}

pub async fn contention(b: &Arc<Bench>, plan: &Plan, progress: Progress) -> Result<Contention, String> {
    let (load, balance_before, balance_after) =
        contended_phase(b, plan, progress, "4. contention", |c, w| contended_client(b.clone(), plan.clone(), c, w))
            .await?;
    let locks_left = b.locked_items().await.map_err(|e| e.to_string())?;
    Ok(Contention { load, locks_left, balance_before, balance_after })
}

/// 4b: the peer of 4, `TransactWriteItems` on the same hot accounts (seeded again, so it runs alone too).
pub async fn contention_transact(b: &Arc<Bench>, plan: &Plan, progress: Progress) -> Result<ContentionPeer, String> {
    let (load, balance_before, balance_after) = contended_phase(b, plan, progress, "4b. contention TWI", |c, w| {
        contended_transact_client(b.clone(), plan.clone(), c, w)
    })
    .await?;
    Ok(ContentionPeer { load, balance_before, balance_after })
}

// ---------------------------------------------------------------------------------------------
// 8. Hot receiver: many payers, one merchant (issue 48, item 3: credits that never wait)

/// Scenario 8a's goodput before issue 48's item 3 (credits that never wait), committed payments/s:
/// the median of three runs of `twopc-bench --only 8 --no-progress` (release build, full mode: 2 s
/// warm-up, 10 s window per phase) of this bench on commit cfaff13 (the coordinator and participants
/// before pending credits), alternated with three runs of the code with them, DynamoDB Local 3.1.0 in
/// memory, 2 cores otherwise idle, measured 2026-11-30: 90.0, 79.9 and 94.8/s (8u 235.4, 236.8, 259.0/s;
/// 8t 453.2, 416.2, 466.0/s). The hot-receiver target is [`HOT_RECEIVER_TARGET_FACTOR`] times this.
pub const HOT_RECEIVER_GOODPUT_BEFORE: f64 = 90.0;
/// The same runs' 8a in the projection (scenario 7's published latencies): 16.9, 16.5 and 16.9/s (p50
/// 1.2–1.6 s: the merchant's lock is held for deployed round trips, and 32 clients queue for it).
pub const HOT_RECEIVER_PROJECTED_BEFORE: f64 = 16.9;
/// The hot-receiver target: 8a's goodput at least this many times [`HOT_RECEIVER_GOODPUT_BEFORE`].
pub const HOT_RECEIVER_TARGET_FACTOR: f64 = 3.0;

/// Scenario 8's figures: its three phases, and the state the payments left.
#[derive(Debug, Clone)]
pub struct HotReceiver {
    /// 8a: every client pays the one hot merchant, 2PC (keyed requests, refusals sent again with their
    /// `Age-Token`).
    pub hot: Load,
    /// 8u: the same clients, each paying a merchant of its own (the same requests, no shared item).
    pub uncontended: Load,
    /// 8t: the same clients paying the hot merchant, each payment one `TransactWriteItems`.
    pub transact: Load,
    /// What the hot merchant's balance gained during 8a (against 8a's committed answers over its phase).
    pub merchant_gain: i128,
    /// The payers' and the merchants' balances summed, before the three phases and after them.
    pub balance_before: i128,
    pub balance_after: i128,
    /// Items of any participant table still locked after the phases.
    pub locks_left: Vec<String>,
    /// Merchants with pending credit entries left (`table/entityId (n)`).
    pub pending_credits: Vec<String>,
    /// 8a and 8t again in the projection (scenario 7's published latencies for every DynamoDB request and
    /// Invoke): how they compare where a lock is held for a deployed round trip, not DynamoDB Local's.
    pub projected_hot: Load,
    pub projected_transact: Load,
}

fn payer(c: usize) -> Account {
    acct(1, &format!("hr-payer-{c}"))
}

fn hot_merchant() -> Account {
    acct(2, "hr-merchant")
}

fn own_merchant(c: usize) -> Account {
    acct(2, &format!("hr-merchant-{c}"))
}

/// Client `c` of 8a or 8u: pays 1 from its own payer to `merchant` (a debit guarded by `min: 0`, a
/// credit: a positive `add` without a guard), each request keyed as the typed client's; a refused
/// payment is sent again with the refusal's `Age-Token`, as in 4.
async fn paying_client(b: Arc<Bench>, merchant: Account, c: usize, window: (Instant, Instant)) -> Load {
    let request = transfer_body(&payer(c), &merchant, 1);
    let mut rng = Rng::new(0x8A00 + c as u64);
    let mut load = Load::default();
    while Instant::now() < window.1 {
        if !transfer_with_retries(&b, &mut rng, &mut load, window, &request, true).await {
            break;
        }
    }
    load
}

/// Client `c` of 8t: the same payments to the hot merchant, each one `TransactWriteItems`, a
/// `TransactionConflict` sent again as in 4b.
async fn paying_transact_client(b: Arc<Bench>, c: usize, window: (Instant, Instant)) -> Load {
    let (from, to) = (payer(c), hot_merchant());
    let mut rng = Rng::new(0x8B00 + c as u64);
    let mut load = Load::default();
    while Instant::now() < window.1 {
        if !transact_with_retries(&b, &mut rng, &mut load, window, &from, &to).await {
            break;
        }
    }
    load
}

pub async fn hot_receiver(
    b: &Arc<Bench>,
    endpoint: &str,
    plan: &Plan,
    progress: Progress,
) -> Result<HotReceiver, String> {
    let clients = plan.hot_receiver_clients;
    let payers: Vec<Account> = (0..clients).map(payer).collect();
    let mut merchants = vec![hot_merchant()];
    merchants.extend((0..clients).map(own_merchant));
    let accounts: Vec<Account> = payers.iter().chain(&merchants).cloned().collect();
    b.seed(&accounts).await.map_err(|e| e.to_string())?;
    let balance_before = hot_sum(b, &accounts).await?;
    let phase = plan.load_warmup + plan.load_window;
    let merchant_before = b.balance(&hot_merchant()).await.map_err(|e| e.to_string())?;
    let hot = {
        let _ticker = progress.timed(phase, "8a. hot receiver 2PC");
        run_clients(&b.counter, clients, plan, |c, w| paying_client(b.clone(), hot_merchant(), c, w)).await
    };
    let merchant_gain = b.balance(&hot_merchant()).await.map_err(|e| e.to_string())? - merchant_before;
    let uncontended = {
        let _ticker = progress.timed(phase, "8u. own merchants 2PC");
        run_clients(&b.counter, clients, plan, |c, w| paying_client(b.clone(), own_merchant(c), c, w)).await
    };
    let transact = {
        let _ticker = progress.timed(phase, "8t. hot receiver TWI");
        run_clients(&b.counter, clients, plan, |c, w| paying_transact_client(b.clone(), c, w)).await
    };
    // The projection: the same clients on the same tables, each request taking a deployed latency.
    let projected = Arc::new(
        Bench::projected(endpoint, crate::projection::Sampler::new(crate::projection::LatencyModel::published(), 48))
            .await
            .map_err(|e| e.to_string())?,
    );
    let projected_hot = {
        let _ticker = progress.timed(phase, "8a, projected");
        run_clients(&projected.counter, clients, plan, |c, w| paying_client(projected.clone(), hot_merchant(), c, w))
            .await
    };
    let projected_transact = {
        let _ticker = progress.timed(phase, "8t, projected");
        run_clients(&projected.counter, clients, plan, |c, w| paying_transact_client(projected.clone(), c, w)).await
    };
    let balance_after = hot_sum(b, &accounts).await?;
    let locks_left = b.locked_items().await.map_err(|e| e.to_string())?;
    let pending_credits = b.pending_credits(&merchants).await.map_err(|e| e.to_string())?;
    Ok(HotReceiver {
        projected_hot,
        projected_transact,
        hot,
        uncontended,
        transact,
        merchant_gain,
        balance_before,
        balance_after,
        locks_left,
        pending_credits,
    })
}

// ---------------------------------------------------------------------------------------------
// 5. DynamoDB requests per committed transaction

#[derive(Debug, Clone)]
pub struct CostCase {
    pub name: String,
    /// Items the transaction touches (the N of the 2N+3 bound).
    pub items: usize,
    /// None for the baseline.
    pub bound: Option<u64>,
    pub transactions: u64,
    pub requests: Counts,
    /// Time spent in those requests.
    pub times: Times,
    /// Capacity units those requests consumed.
    pub capacity: Capacity,
    /// Requests to the table of the `check`-only participant (the add+check case).
    pub check_table: Option<String>,
}

impl CostCase {
    pub fn per_transaction(&self) -> f64 {
        RequestCounter::total(&self.requests) as f64 / self.transactions.max(1) as f64
    }

    /// "PutItem 1, UpdateItem 4" per transaction.
    pub fn by_operation(&self) -> BTreeMap<String, f64> {
        let mut ops: BTreeMap<String, f64> = BTreeMap::new();
        for ((op, _), n) in &self.requests {
            *ops.entry(op.clone()).or_default() += *n as f64 / self.transactions.max(1) as f64;
        }
        ops
    }

    /// Per (operation, kind of table): requests per transaction and mean ms per request.
    pub fn timing(&self) -> BTreeMap<(String, &'static str), (f64, f64)> {
        let mut grouped: BTreeMap<(String, &'static str), (u64, Duration)> = BTreeMap::new();
        for ((op, table), n) in &self.requests {
            let slot = grouped.entry((op.clone(), table_kind(table))).or_default();
            slot.0 += n;
            slot.1 += self.times.get(&(op.clone(), table.clone())).copied().unwrap_or_default();
        }
        grouped
            .into_iter()
            .map(|(key, (n, t))| {
                let per_tx = n as f64 / self.transactions.max(1) as f64;
                (key, (per_tx, t.as_secs_f64() * 1e3 / n.max(1) as f64))
            })
            .collect()
    }

    /// Capacity units per transaction, in all.
    pub fn capacity_per_transaction(&self) -> Units {
        capacity::sum(self.capacity.values()).per(self.transactions)
    }

    /// Per request kind (operation, kind of table): requests and capacity units per transaction.
    pub fn capacity_by_kind(&self) -> BTreeMap<(String, &'static str), (f64, Units)> {
        let mut grouped: BTreeMap<(String, &'static str), (u64, Units)> = BTreeMap::new();
        for ((op, table), n) in &self.requests {
            grouped.entry((op.clone(), table_kind(table))).or_default().0 += n;
        }
        for ((op, table), units) in &self.capacity {
            grouped.entry((op.clone(), table_kind(table))).or_default().1 += units;
        }
        grouped
            .into_iter()
            .map(|(key, (n, units))| (key, (n as f64 / self.transactions.max(1) as f64, units.per(self.transactions))))
            .collect()
    }

    /// Requests per transaction to one table, by operation.
    pub fn on_table(&self, table: &str) -> BTreeMap<String, f64> {
        let mut ops: BTreeMap<String, f64> = BTreeMap::new();
        for ((op, t), n) in &self.requests {
            if t.split('+').any(|t| t == table) {
                *ops.entry(op.clone()).or_default() += *n as f64 / self.transactions.max(1) as f64;
            }
        }
        ops
    }
}

/// `transactions`, `data` (one participant table) or `data+transactions` (several, joined by `+`).
pub fn table_kind(table: &str) -> &'static str {
    let tx = table.split('+').any(|t| t == crate::bench::TRANSACTIONS_TABLE);
    let data = table.split('+').any(|t| t != crate::bench::TRANSACTIONS_TABLE);
    match (tx, data) {
        (true, true) => "data+transactions",
        (true, false) => "transactions",
        _ => "data",
    }
}

struct CostSpec {
    name: String,
    /// The transaction is refused by design (the abort path); otherwise it must commit.
    refused: bool,
    items: usize,
    bound: Option<u64>,
    request: CostRequest,
    check_table: Option<String>,
}

enum CostRequest {
    TwoPc(Vec<u8>),
    /// Sent with a fresh `Idempotency-Key` each time: the record is written before the prepares.
    TwoPcKeyed(Vec<u8>),
    Baseline,
}

async fn cost_once(b: &Bench, request: &CostRequest, accounts: &[Account]) -> Outcome {
    match request {
        CostRequest::TwoPc(body) => b.submit(&b.coordinator, body).await,
        CostRequest::TwoPcKeyed(body) => {
            let key = uuid::Uuid::new_v4().to_string();
            b.submit_keyed(&b.coordinator, body, Some(&key)).await
        }
        CostRequest::Baseline => b.transact_transfer(&accounts[0], &accounts[1], 1).await,
    }
}

pub async fn requests(b: &Bench, plan: &Plan, progress: Progress) -> Result<(Vec<CostCase>, u64), String> {
    let accounts: Vec<Account> = (1..=8).map(|k| acct(k, "cost")).collect();
    b.seed(&accounts).await.map_err(|e| e.to_string())?;
    b.seed_documents(&[acct(1, "doc"), acct(2, "doc")], NOTE_BYTES).await.map_err(|e| e.to_string())?;
    let mut cases: Vec<CostSpec> = FAN_OUT
        .iter()
        .map(|&n| CostSpec {
            refused: false,
            name: format!("2PC, {n} participant{}", if n == 1 { "" } else { "s" }),
            items: n,
            bound: Some(2 * n as u64 + 3),
            request: CostRequest::TwoPc(fan_body(n, "cost")),
            check_table: None,
        })
        .collect();
    cases.push(CostSpec {
        refused: false,
        name: "2PC, 2 participants, Idempotency-Key".to_owned(),
        items: 2,
        bound: Some(7),
        request: CostRequest::TwoPcKeyed(fan_body(2, "cost")),
        check_table: None,
    });
    cases.push(CostSpec {
        refused: false,
        name: format!("2PC, 2 participants, set of {NOTE_BYTES} B"),
        items: 2,
        bound: Some(7),
        request: CostRequest::TwoPc(body(vec![
            participant(1, vec![set_note("doc", NOTE_BYTES)]),
            participant(2, vec![set_note("doc", NOTE_BYTES)]),
        ])),
        check_table: None,
    });
    cases.push(CostSpec {
        refused: false,
        name: "2PC, add + check-only".to_owned(),
        items: 2,
        bound: Some(7),
        request: CostRequest::TwoPc(body(vec![
            participant(1, vec![crate::bench::add("cost", -1, Some(0))]),
            participant(2, vec![check_exists("cost")]),
        ])),
        check_table: Some(crate::bench::table(2)),
    });
    cases.push(CostSpec {
        refused: true,
        name: "2PC, 2 participants, one refuses (abort)".to_owned(),
        items: 2,
        bound: None,
        request: CostRequest::TwoPc(body(vec![
            participant(1, vec![crate::bench::add("cost", -10 * crate::bench::START_BALANCE, Some(0))]),
            participant(2, vec![crate::bench::add("cost", 1, None)]),
        ])),
        check_table: None,
    });
    cases.push(CostSpec {
        refused: false,
        name: "TransactWriteItems, 2 items".to_owned(),
        items: 2,
        bound: None,
        request: CostRequest::Baseline,
        check_table: None,
    });
    let bar = progress.bar(cases.len() as u64, "5. requests per tx");
    let executions_before = b.counter.executions();
    let attempts_before = RequestCounter::total(&b.counter.snapshot());
    let mut figures = Vec::new();
    for CostSpec { name, refused, items, bound, request, check_table } in cases {
        let expect = |outcome: Outcome| match (refused, outcome) {
            (false, outcome) => committed(outcome, &name),
            (true, Outcome::Refused(_)) => Ok(()),
            (true, other) => Err(format!("{name} was not refused: {other:?}")),
        };
        for _ in 0..plan.cost_warmup {
            expect(cost_once(b, &request, &accounts).await)?;
        }
        let before = b.counter.snapshot();
        let times_before = b.counter.times();
        let capacity_before = b.counter.capacity();
        for _ in 0..plan.cost_transactions {
            expect(cost_once(b, &request, &accounts).await)?;
        }
        let after = b.counter.snapshot();
        let times_after = b.counter.times();
        let capacity_after = b.counter.capacity();
        figures.push(CostCase {
            name,
            items,
            bound,
            transactions: plan.cost_transactions as u64,
            requests: RequestCounter::diff(&before, &after),
            times: times_after
                .iter()
                .filter_map(|(key, t)| {
                    let delta = t.saturating_sub(times_before.get(key).copied().unwrap_or_default());
                    (!delta.is_zero()).then(|| (key.clone(), delta))
                })
                .collect(),
            capacity: capacity::diff(&capacity_before, &capacity_after),
            check_table,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    // Attempts beyond executions are SDK retries (each a request of its own).
    let retries = (RequestCounter::total(&b.counter.snapshot()) - attempts_before)
        .saturating_sub(b.counter.executions() - executions_before);
    Ok((figures, retries))
}

// ---------------------------------------------------------------------------------------------
// 6. Memory

/// A `Vm*` line of a /proc status file, in KiB.
pub fn vm_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The process id of the DynamoDB Local JVM listening on `port`.
pub fn jvm_pid(port: u16) -> Option<String> {
    let needle = format!("\0-port\0{port}\0");
    std::fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline);
        (cmdline.contains(&needle) && cmdline.contains("java")).then_some(name)
    })
}

/// Peak RSS (VmHWM) of a process (`"self"` or a pid), in KiB.
pub fn peak_rss_kib(pid: &str) -> Option<u64> {
    vm_kib(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?, "VmHWM")
}

/// CPU time (user + system) a process (`"self"` or a pid) has used, in seconds.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; in clock ticks,
    // which are 100 per second on Linux.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_fields() {
        let status = "Name:\ttwopc-bench\nVmPeak:\t  100 kB\nVmHWM:\t   2048 kB\nVmRSS:\t 1024 kB\n";
        assert_eq!(vm_kib(status, "VmHWM"), Some(2048));
        assert_eq!(vm_kib(status, "VmRSS"), Some(1024));
        assert_eq!(vm_kib(status, "VmSwap"), None);
    }

    #[test]
    fn reads_own_cpu_and_memory() {
        assert!(cpu_seconds("self").is_some());
        assert!(peak_rss_kib("self").is_some_and(|k| k > 0));
    }

    fn answer(outcome: Outcome, attempts: Option<u32>, token: Option<&str>) -> Answer {
        Answer {
            outcome,
            attempts: attempts.unwrap_or(1),
            reports_attempts: attempts.is_some(),
            transaction_id: None,
            age_token: token.map(str::to_owned),
        }
    }

    #[test]
    fn retries_count_attempts_per_commit_and_per_request() {
        let conflict = || Outcome::Refused("CONFLICT".to_owned());
        let mut r = Retries::default();
        // Committed at once after 3 attempts inside the coordinator.
        r.answered(&answer(Outcome::Committed, Some(3), None), 0, 1, true);
        // Refused after 16 attempts, retried with its token: committed on attempt 18 (2 more).
        r.answered(&answer(conflict(), Some(16), Some("t")), 0, 1, true);
        r.answered(&answer(Outcome::Committed, Some(18), None), 16, 2, true);
        // A coordinator that does not report attempts: refused twice, then committed.
        r.answered(&answer(conflict(), None, None), 0, 1, true);
        r.answered(&answer(conflict(), None, None), 0, 2, true);
        r.answered(&answer(Outcome::Committed, None, None), 0, 3, true);
        // Outside the window: not counted.
        r.answered(&answer(Outcome::Committed, Some(9), None), 0, 1, false);
        r.summarize();
        assert_eq!((r.answers, r.answers_with_attempts, r.age_tokens_sent), (6, 3, 1));
        assert_eq!(r.coordinator_attempts, 3 + 16 + 2 + 3);
        assert_eq!(r.max_request_attempts, 16);
        assert_eq!((r.attempts_per_commit.count, r.attempts_per_commit.max), (3, 18));
        assert_eq!(r.requests_per_commit.max, 3);
        assert!((r.refused_attempt_rate(3) - 21.0 / 24.0).abs() < 1e-9);

        let mut merged = Retries::default();
        merged.merge(r.clone());
        merged.merge(r);
        merged.summarize();
        assert_eq!((merged.answers, merged.attempts_per_commit.count, merged.max_request_attempts), (12, 6, 16));
    }

    #[test]
    fn transact_write_items_attempts_are_its_requests() {
        let mut r = Retries::default();
        r.transacted(&Outcome::Refused("TransactionConflict".to_owned()), 1, true);
        r.transacted(&Outcome::Committed, 2, true);
        r.transacted(&Outcome::Committed, 1, true);
        r.summarize();
        assert_eq!((r.coordinator_attempts, r.max_request_attempts, r.age_tokens_sent), (3, 1, 0));
        assert_eq!((r.attempts_per_commit.max, r.requests_per_commit.max), (2, 2));
        assert_eq!(Retries::default().refused_attempt_rate(0), 0.0);
    }

    #[test]
    fn quick_plan_is_small() {
        let quick = Plan::quick();
        assert!(quick.load_warmup + quick.load_window < Duration::from_secs(3));
        assert!(quick.latency_iterations <= 50);
    }
}
