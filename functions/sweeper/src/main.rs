#![recursion_limit = "256"]

use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    twopc::config::init_tracing();
    let sweeper = sweeper::from_env().await?;
    let sweeper = &sweeper;
    // The scheduled event carries nothing the sweep needs: it runs on what the indexes hold.
    lambda_runtime::run(service_fn(move |_: LambdaEvent<serde_json::Value>| async move {
        sweeper::handle(sweeper).await.map_err(Error::from)
    }))
    .await
}
