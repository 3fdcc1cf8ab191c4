//! The WebSocket connections function: the Lambda runtime around `connections::handle` (`$connect`,
//! `$disconnect` and the subscribe and unsubscribe messages).

use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    twopc::config::init_tracing();
    let function = connections::from_env().await?;
    let function = &function;
    lambda_runtime::run(service_fn(
        move |event: LambdaEvent<aws_lambda_events::apigw::ApiGatewayWebsocketProxyRequest>| async move {
            Ok::<_, Error>(connections::handle(function, &event.payload).await)
        },
    ))
    .await
}
