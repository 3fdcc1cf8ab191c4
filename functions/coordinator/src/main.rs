use lambda_http::{Error, Request, service_fn};
use twopc::config;

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_tracing();
    let metrics = twopc::telemetry::install_emf(&config::or_default(
        config::METRICS_NAMESPACE,
        config::DEFAULT_METRICS_NAMESPACE,
    ));
    let coordinator = coordinator::from_env().await?;
    let coordinator = &coordinator;
    lambda_http::run(service_fn(move |request: Request| async move {
        let response = coordinator::handle(coordinator, request).await;
        twopc::telemetry::flush(metrics);
        Ok::<_, Error>(response)
    }))
    .await
}
