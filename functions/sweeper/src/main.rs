#![recursion_limit = "256"]

//! The sweeper function: the Lambda runtime around `sweeper::handle`, run on a schedule; its metrics are
//! flushed only after a sweep that found out what they say.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use twopc::{config, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_tracing();
    let metrics = telemetry::install_emf_from_env(telemetry::Zeros::Written);
    let (sweeper, bus) = sweeper::from_env().await?;
    let (sweeper, bus) = (&sweeper, bus.as_ref());
    // The scheduled event carries nothing the sweep needs: it runs on what the indexes hold.
    lambda_runtime::run(service_fn(move |_: LambdaEvent<serde_json::Value>| async move {
        let report = sweeper::handle(sweeper, bus).await;
        // A failed run found nothing out: its zeros would tell the stuck-transactions alarm it did.
        if report.is_ok() {
            telemetry::flush(metrics);
        }
        report.map_err(Error::from)
    }))
    .await
}
