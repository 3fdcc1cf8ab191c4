//! The WebSocket API's authorizer function: the Lambda runtime around `authorizer::handle` (the caller's
//! token verified, a policy for `$connect` or a denial).

use lambda_runtime::{Error, LambdaEvent, service_fn};
use twopc::config;

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_tracing();
    let verifier = authorizer::from_env()?;
    let verifier = &verifier;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        authorizer::handle(verifier, event.payload).await.map_err(|denied| Error::from(denied.to_string()))
    }))
    .await
}
