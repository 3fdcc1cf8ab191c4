#![recursion_limit = "256"]

//! The generic participant function: the Lambda runtime around `participant::handle` (one participant
//! message, signed, answered by the participant library).

use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    twopc::config::init_tracing();
    let participant = participant::from_env().await?;
    let participant = &participant;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        participant::handle(participant, event.payload).await.map_err(Error::from)
    }))
    .await
}
