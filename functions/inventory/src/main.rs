#![recursion_limit = "256"]

//! The inventory's participant function: the participant library with the inventory's operations.

use inventory::Inventory;
use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    twopc::config::init_tracing();
    let participant = participant::from_env().await?.with_operations(Inventory);
    let participant = &participant;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        participant::handle(participant, event.payload).await.map_err(Error::from)
    }))
    .await
}
