//! A service's own participant: the generic participant's library with the service's rules. This file
//! is the "Write your own participant" example of docs/participants.md, compiled by `cargo test`.

#![recursion_limit = "256"]

use lambda_runtime::{Error, LambdaEvent, service_fn};
use twopc::decimal::BigDecimal;
use twopc::model::Operation;
use twopc::participant::{Prepared, Refusal, Rules};

/// The accounts service's rules: a frozen account takes no debit, and a debit of more than 10,000 needs
/// the treasury's role.
struct Accounts;

const TREASURY: &str = "arn:aws:sts::123456789012:assumed-role/Treasury";

impl Rules for Accounts {
    fn check(&self, prepared: &Prepared<'_>) -> Result<(), Refusal> {
        let Operation::Add { delta, .. } = prepared.operation else { return Ok(()) };
        if delta.value() >= &BigDecimal::from(0) {
            return Ok(());
        }
        let frozen = prepared.data.and_then(|d| d.get("frozen")).and_then(|f| f.as_bool()) == Some(true);
        if frozen {
            return Err(Refusal::new("FROZEN", "the account is frozen: no debit until it is released"));
        }
        if delta.value() < &BigDecimal::from(-10_000) && prepared.principal != Some(TREASURY) {
            return Err(Refusal::new("NEEDS_TREASURY", format!("a debit of {delta} needs the treasury's role")));
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    twopc::config::init_tracing();
    let participant = participant::from_env().await?.with_rules(Accounts);
    let participant = &participant;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        participant::handle(participant, event.payload).await.map_err(Error::from)
    }))
    .await
}
