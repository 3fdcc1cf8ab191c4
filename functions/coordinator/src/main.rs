use lambda_http::{Error, Request, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    twopc::config::init_tracing();
    let coordinator = coordinator::from_env().await?;
    let coordinator = &coordinator;
    lambda_http::run(service_fn(move |request: Request| async move {
        Ok::<_, Error>(coordinator::handle(coordinator, request).await)
    }))
    .await
}
