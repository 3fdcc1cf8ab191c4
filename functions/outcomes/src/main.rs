//! Outcome events: the transactions table's stream, read by an event source mapping of its own (beside
//! the stream processor's, so neither can stall the other), with `ReportBatchItemFailures`; each request
//! outcome becomes one event on the bus `EVENT_BUS_NAME`. The logic is `twopc_fanout::outcomes`.

use aws_lambda_events::event::dynamodb::Event;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use twopc::config;
use twopc_fanout::FanoutConfig;
use twopc_fanout::outcomes::{self, EventBridgeBus};

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_tracing();
    // Required, not defaulted: a wrong name would make every record another stream's (each reported, so
    // it shows, but nothing announced until the name is right).
    let transactions = config::required(twopc::record::TRANSACTIONS_TABLE_NAME)?;
    // Only the transactions table: a record of any other stream is not this function's.
    let tables = FanoutConfig::new(&Default::default(), &transactions)?;
    let bus = EventBridgeBus::from_config(&config::aws().await, config::required(outcomes::EVENT_BUS_NAME)?);
    let (bus, tables) = (&bus, &tables);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Event>| async move {
        Ok::<_, Error>(outcomes::publish(bus, tables, &event.payload).await.response())
    }))
    .await
}
