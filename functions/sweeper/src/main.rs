#![recursion_limit = "256"]

use lambda_runtime::{Error, LambdaEvent, service_fn};
use twopc::config;

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_tracing();
    let metrics = twopc::telemetry::install_emf(&config::or_default(
        config::METRICS_NAMESPACE,
        config::DEFAULT_METRICS_NAMESPACE,
    ));
    let sweeper = sweeper::from_env().await?;
    let sweeper = &sweeper;
    // The scheduled event carries nothing the sweep needs: it runs on what the indexes hold.
    lambda_runtime::run(service_fn(move |_: LambdaEvent<serde_json::Value>| async move {
        let report = sweeper::handle(sweeper).await;
        twopc::telemetry::flush(metrics);
        report.map_err(Error::from)
    }))
    .await
}
