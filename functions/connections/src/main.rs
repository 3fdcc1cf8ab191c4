use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    twopc::config::init_tracing();
    let store = connections::from_env().await?;
    let store = &store;
    lambda_runtime::run(service_fn(
        move |event: LambdaEvent<aws_lambda_events::apigw::ApiGatewayWebsocketProxyRequest>| async move {
            Ok::<_, Error>(connections::handle(store, &event.payload).await)
        },
    ))
    .await
}
