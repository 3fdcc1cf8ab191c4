//! The sweeper function: an EventBridge schedule runs one bounded sweep and reports what it recovered.

use std::collections::BTreeMap;
use std::sync::Arc;

use twopc::clock;
use twopc::config::{self, ConfigError};
use twopc::coordinator::Coordinator;
use twopc::invoke::LambdaInvoker;
use twopc::participant::DataTable;
use twopc::record::TransactionStore;
use twopc::sweeper::{SweepLimits, SweepReport, Sweeper};

pub async fn from_env() -> Result<Sweeper, ConfigError> {
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
    Ok(Sweeper::new(coordinator, tables, SweepLimits::default()))
}

/// One sweep, counted in the metrics the function's `main` writes after it, then what is open after it
/// (its gauges: open transactions by status, the oldest one's age, the stuck view's count). A census that
/// fails fails the run: its gauges would otherwise keep the last run's values.
pub async fn handle(sweeper: &Sweeper) -> Result<SweepReport, twopc::store::StoreError> {
    let report = sweeper.sweep().await?;
    report.record_metrics();
    let census = sweeper.census().await?;
    tracing::info!(?census, "open after the sweep");
    census.record_metrics();
    Ok(report)
}
