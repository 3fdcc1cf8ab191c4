#![recursion_limit = "256"]

//! The payments participant function: the participant library driving the payment API as a resource.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use payments::Payments;

#[tokio::main]
async fn main() -> Result<(), Error> {
    twopc::config::init_tracing();
    let api = twopc::config::required(twopc::environment::PAYMENT_API_URL)?;
    let participant = participant::from_env().await?.with_resource(Payments::new(&api));
    let participant = &participant;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        participant::handle(participant, event.payload).await.map_err(Error::from)
    }))
    .await
}
