//! The coordinator function: the Lambda runtime around `coordinator::handle` (the REST API), with the
//! CORS origin on every answer and the request's metrics flushed after it.

use lambda_http::{Error, Request, service_fn};
use twopc::{config, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_tracing();
    let metrics = telemetry::install_emf_from_env(telemetry::Zeros::Omitted);
    let coordinator = coordinator::from_env().await?;
    let coordinator = &coordinator;
    let allow_origin = &twopc::cors::allow_origin_from_env();
    lambda_http::run(service_fn(move |request: Request| async move {
        let response =
            coordinator::allow_origin(coordinator::handle(coordinator, request).await, allow_origin.as_deref());
        telemetry::flush(metrics);
        Ok::<_, Error>(response)
    }))
    .await
}
