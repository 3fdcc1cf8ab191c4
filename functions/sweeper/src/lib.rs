//! The sweeper function: an EventBridge schedule runs one bounded sweep and reports what it recovered,
//! then what is open after it: its gauges, and an event on the outcomes bus for each transaction open
//! longer than `OPEN_ALERT_AFTER_MS` (sent again each run while it stays open: `outcomeId` is the same).

use std::collections::BTreeMap;
use std::sync::Arc;

use twopc::clock;
use twopc::config::{self, ConfigError};
use twopc::coordinator::Coordinator;
use twopc::invoke::LambdaInvoker;
use twopc::participant::DataTable;
use twopc::record::TransactionStore;
use twopc::sweeper::{OpenCensus, SweepLimits, SweepReport, Sweeper};
use twopc_fanout::outcomes::{self, EventBridgeBus, OutcomeBus, OutcomeEvent};

/// The sweeper and the bus its age alerts go to (none without `EVENT_BUS_NAME`).
pub async fn from_env() -> Result<(Sweeper, Option<EventBridgeBus>), ConfigError> {
    let registry = config::string_map(twopc::invoke::PARTICIPANTS)?;
    let tables = config::string_map(twopc::tables::PARTICIPANT_TABLES)?;
    let transactions =
        config::or_default(twopc::record::TRANSACTIONS_TABLE_NAME, twopc::record::DEFAULT_TRANSACTIONS_TABLE);
    let aws = config::aws().await;
    let dynamodb = aws_sdk_dynamodb::Client::new(&aws);
    let services: Vec<String> = registry.keys().cloned().collect();
    let invoker = Arc::new(LambdaInvoker::from_registry(&aws, registry));
    let transactions = TransactionStore::new(dynamodb.clone(), transactions);
    let keys = twopc::auth::keys_from_env(&aws, twopc::auth::PARTICIPANT_KEYS)?;
    let tables: BTreeMap<String, DataTable> =
        tables.into_iter().map(|(service, table)| (service, DataTable::new(dynamodb.clone(), table))).collect();
    // Its data tables also for the stuck view's count (`StuckViewCount`).
    let coordinator = Coordinator::new(transactions, invoker, services, clock::system())
        .with_keys(keys)
        .with_signature(twopc::auth::signature_from_env()?)
        .with_data_tables(tables.clone());
    let alert_after =
        config::positive_or_default(outcomes::OPEN_ALERT_AFTER_MS, outcomes::DEFAULT_OPEN_ALERT_AFTER_MS as usize)?
            as u64;
    let bus = config::required(outcomes::EVENT_BUS_NAME).ok().filter(|b| !b.is_empty());
    let bus = bus.map(|name| EventBridgeBus::from_config(&aws, name));
    let sweeper = Sweeper::new(coordinator, tables, SweepLimits::default()).with_open_alerts_after(alert_after);
    Ok((sweeper, bus))
}

/// One sweep, counted in the metrics the function's `main` writes after it, then what is open after it
/// (its gauges: open transactions by status, the oldest one's age, the stuck view's count). A census that
/// fails fails the run: its gauges would otherwise keep the last run's values.
pub async fn handle<B: OutcomeBus>(
    sweeper: &Sweeper,
    bus: Option<&B>,
) -> Result<SweepReport, twopc::store::StoreError> {
    let report = sweeper.sweep().await?;
    report.record_metrics();
    let census = sweeper.census().await?;
    tracing::info!(by_status = ?census.by_status, oldest_age_ms = census.oldest_age_ms, stuck = census.stuck, "open after the sweep");
    census.record_metrics();
    if let Some(bus) = bus {
        send_age_alerts(bus, &census).await;
    }
    Ok(report)
}

/// One event per transaction the census found open too long. A refused one counts as a sweep error
/// (`SweepErrors`, whose alarm says the run met trouble) and is logged; the next run sends it again while
/// the transaction stays open.
pub async fn send_age_alerts<B: OutcomeBus>(bus: &B, census: &OpenCensus) -> usize {
    let alerts: Vec<OutcomeEvent> =
        census.open_too_long.iter().map(|(record, age)| OutcomeEvent::open_too_long(record, *age)).collect();
    let mut sent = 0;
    for (alert, result) in alerts.iter().zip(outcomes::send(bus, &alerts).await) {
        match result {
            Ok(()) => sent += 1,
            Err(message) => {
                metrics::counter!(twopc::telemetry::SWEEP_ERRORS).increment(1);
                tracing::error!(tx = %alert.transaction_id, %message, "age alert not accepted");
            }
        }
    }
    sent
}
