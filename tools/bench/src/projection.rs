//! Scenario 7, a projection of a deployed run: every DynamoDB request and every participant Invoke
//! takes a latency drawn from a published (or stated) distribution, instead of DynamoDB Local's and
//! an in-process call's. The protocol runs for real on DynamoDB Local; only the time each request
//! takes is the model's.
//!
//! A request whose DynamoDB Local answer came sooner than its drawn latency waits out the rest before
//! its answer is handed back, so each request takes max(drawn, local) ≈ drawn: DynamoDB Local's own
//! time is not added on top of the model's.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use serde_json::Value;

use crate::stats::Rng;

/// A latency distribution given by its median and 99th percentile, drawn as a log-normal (the shape
/// of service latencies: a floor, a body, a long right tail) through those two points.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Distribution {
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// The standard normal's 99th percentile.
const Z99: f64 = 2.326_347_874;

impl Distribution {
    pub const fn new(p50_ms: f64, p99_ms: f64) -> Distribution {
        Distribution { p50_ms, p99_ms }
    }

    pub fn scaled(self, factor: f64) -> Distribution {
        Distribution { p50_ms: self.p50_ms * factor, p99_ms: self.p99_ms * factor }
    }

    /// One draw: exp(μ + σ·z), μ = ln p50, σ = ln(p99 / p50) / z₉₉, z standard normal (Box–Muller).
    pub fn sample(self, rng: &mut Rng) -> Duration {
        let uniform = |rng: &mut Rng| ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let (u1, u2) = (uniform(rng), uniform(rng));
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let sigma = (self.p99_ms / self.p50_ms).ln() / Z99;
        Duration::from_secs_f64(self.p50_ms * (sigma * z).exp() / 1000.0)
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p50 {} / p99 {} ms", crate::stats::trim(self.p50_ms), crate::stats::trim(self.p99_ms))
    }
}

/// Alex DeBrie, "DynamoDB Transactions Performance Testing" (alexdebrie.com, from Lambda in
/// us-east-1): PutItem of one item.
pub const PUT_ITEM: Distribution = Distribution::new(7.55, 16.2);
/// The same source: `TransactWriteItems` of 5 items.
pub const TRANSACT_5: Distribution = Distribution::new(25.3, 92.5);
/// An assumption, not a measurement: a warm synchronous (RequestResponse) Lambda Invoke within a
/// region, the call's round trip without the function's own work.
pub const WARM_INVOKE: Distribution = Distribution::new(10.0, 25.0);

/// The latency of each kind of request.
#[derive(Debug, Clone, Copy)]
pub struct LatencyModel {
    /// Every single-item request (GetItem, PutItem, UpdateItem, DeleteItem, Query of one key):
    /// PutItem's figures, conditional or not (stated in BENCHMARKS.md).
    pub single: Distribution,
    /// `TransactWriteItems` of 5 items; of n items, interpolated from `single` (n = 1) to this (n = 5)
    /// in both percentiles, and extrapolated beyond.
    pub transact_5: Distribution,
    pub invoke: Distribution,
}

impl LatencyModel {
    pub fn published() -> LatencyModel {
        LatencyModel { single: PUT_ITEM, transact_5: TRANSACT_5, invoke: WARM_INVOKE }
    }

    pub fn with_invoke_scaled(self, factor: f64) -> LatencyModel {
        LatencyModel { invoke: self.invoke.scaled(factor), ..self }
    }

    /// `TransactWriteItems` (or `TransactGetItems`) of `items` items.
    pub fn transact(&self, items: usize) -> Distribution {
        let share = (items.max(1) - 1) as f64 / 4.0;
        let between = |one: f64, five: f64| one + (five - one) * share;
        Distribution::new(
            between(self.single.p50_ms, self.transact_5.p50_ms),
            between(self.single.p99_ms, self.transact_5.p99_ms),
        )
    }

    /// The distribution of one DynamoDB request, from its `X-Amz-Target` and body.
    fn of_request(&self, request: &HttpRequest) -> Distribution {
        let target = request.headers().get("x-amz-target").unwrap_or_default();
        let operation = target.rsplit('.').next().unwrap_or_default();
        if operation.starts_with("Transact") {
            // The SDK sends every Transact request with its body in memory: one that cannot be read is a
            // change of the SDK's, which would make every figure of the projection wrong, so it stops the run.
            let items = request
                .body()
                .bytes()
                .and_then(|body| serde_json::from_slice::<Value>(body).ok())
                .and_then(|body| body.get("TransactItems").and_then(Value::as_array).map(Vec::len))
                .unwrap_or_else(|| panic!("a {operation} request without a readable TransactItems body"));
            self.transact(items)
        } else {
            self.single
        }
    }
}

/// Draws from a model, for any number of concurrent requests.
#[derive(Debug)]
pub struct Sampler {
    model: LatencyModel,
    rng: Mutex<Rng>,
}

impl Sampler {
    pub fn new(model: LatencyModel, seed: u64) -> Arc<Sampler> {
        Arc::new(Sampler { model, rng: Mutex::new(Rng::new(seed)) })
    }

    /// The round trip of one participant Invoke.
    pub(crate) fn invoke_latency(&self) -> Duration {
        self.draw(self.model.invoke)
    }

    fn draw(&self, distribution: Distribution) -> Duration {
        distribution.sample(&mut self.rng.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The SDK's own HTTP client, each request held until its drawn latency has passed.
#[derive(Debug, Clone)]
pub struct ModelledHttpClient {
    inner: SharedHttpClient,
    sampler: Arc<Sampler>,
}

impl ModelledHttpClient {
    pub fn new(sampler: Arc<Sampler>) -> ModelledHttpClient {
        ModelledHttpClient { inner: aws_smithy_http_client::Builder::new().build_http(), sampler }
    }
}

impl HttpClient for ModelledHttpClient {
    fn http_connector(&self, settings: &HttpConnectorSettings, components: &RuntimeComponents) -> SharedHttpConnector {
        let inner = self.inner.http_connector(settings, components);
        SharedHttpConnector::new(ModelledConnector { inner, sampler: Arc::clone(&self.sampler) })
    }
}

#[derive(Debug)]
struct ModelledConnector {
    inner: SharedHttpConnector,
    sampler: Arc<Sampler>,
}

impl HttpConnector for ModelledConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let latency = self.sampler.draw(self.sampler.model.of_request(&request));
        let started = Instant::now();
        let answer = self.inner.call(request);
        HttpConnectorFuture::new(async move {
            let answer = answer.await;
            if let Some(rest) = latency.checked_sub(started.elapsed()) {
                tokio::time::sleep(rest).await;
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_have_the_stated_median_and_99th_percentile() {
        let mut rng = Rng::new(7);
        let mut draws: Vec<f64> = (0..200_000).map(|_| TRANSACT_5.sample(&mut rng).as_secs_f64() * 1000.0).collect();
        draws.sort_by(f64::total_cmp);
        let p50 = crate::stats::percentile(&draws, 50.0);
        let p99 = crate::stats::percentile(&draws, 99.0);
        assert!((p50 - 25.3).abs() < 0.5, "p50 {p50}");
        assert!((p99 - 92.5).abs() < 3.0, "p99 {p99}");
    }

    #[test]
    fn a_transaction_of_n_items_lies_between_one_item_and_five() {
        let model = LatencyModel::published();
        assert_eq!(model.transact(1), PUT_ITEM);
        assert_eq!(model.transact(5), TRANSACT_5);
        let two = model.transact(2);
        assert!(two.p50_ms > PUT_ITEM.p50_ms && two.p50_ms < TRANSACT_5.p50_ms, "{two}");
        assert_eq!(model.with_invoke_scaled(2.0).invoke, Distribution::new(20.0, 50.0));
    }
}

/// One model's figures: a 2-service transfer through the coordinator, the same answered on its commit
/// decision (issue 48: `Prefer: respond-async`, its second phase run after the answer and before the next
/// transfer), and `TransactWriteItems` of the same two updates.
#[derive(Debug, Clone)]
pub struct ProjectionRow {
    pub label: &'static str,
    pub model: LatencyModel,
    pub twopc: crate::stats::Summary,
    pub on_decision: crate::stats::Summary,
    pub transact: crate::stats::Summary,
}

/// The published model, then the same with every Invoke twice as slow.
pub async fn run(
    endpoint: &str,
    plan: &crate::scenarios::Plan,
    progress: crate::scenarios::Progress,
) -> Result<Vec<ProjectionRow>, String> {
    let variants = [
        ("published figures, Invoke as assumed", LatencyModel::published()),
        ("Invoke twice as slow", LatencyModel::published().with_invoke_scaled(2.0)),
    ];
    let (from, to) = ((1, "projection-a".to_owned()), (2, "projection-b".to_owned()));
    let mut rows = Vec::new();
    for (index, (label, model)) in variants.into_iter().enumerate() {
        let bench = crate::bench::Bench::projected(endpoint, Sampler::new(model, 43 + index as u64))
            .await
            .map_err(|e| e.to_string())?;
        if index == 0 {
            bench.seed(&[from.clone(), to.clone()]).await.map_err(|e| e.to_string())?;
        }
        let request = crate::bench::transfer_body(&from, &to, 1);
        let (mut twopc, mut on_decision, mut transact) = (Vec::new(), Vec::new(), Vec::new());
        let total = plan.projection_warmup + plan.projection_iterations;
        let bar = progress.bar(total as u64, &format!("7. projection ({})", index + 1));
        for i in 0..total {
            let started = Instant::now();
            crate::scenarios::committed(bench.submit(&bench.coordinator, &request).await, "2PC transfer")?;
            let t2pc = started.elapsed();
            let started = Instant::now();
            crate::scenarios::committed(bench.transact_transfer(&from, &to, 1).await, "TransactWriteItems transfer")?;
            let ttransact = started.elapsed();
            let started = Instant::now();
            let early = bench.submit_on_decision(&request).await;
            let tearly = started.elapsed();
            if early != crate::bench::Outcome::Pending {
                return Err(format!("2PC transfer answered on its decision: {early:?}, not 202 COMMITTING"));
            }
            bench.finish_after_answers().await;
            if i >= plan.projection_warmup {
                twopc.push(t2pc);
                on_decision.push(tearly);
                transact.push(ttransact);
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        rows.push(ProjectionRow {
            label,
            model,
            twopc: crate::stats::Summary::of(&twopc),
            on_decision: crate::stats::Summary::of(&on_decision),
            transact: crate::stats::Summary::of(&transact),
        });
    }
    Ok(rows)
}
