//! Prints the contract the deployment template must satisfy, as JSON: every table the code creates
//! (from `twopc::tables`, with the default names), the environment each function reads (from
//! `twopc::environment::FUNCTION_ENVIRONMENT`), the longest transaction timeout the coordinator
//! accepts, the metrics the code writes and the attributes of a transaction record each narrower
//! writer writes (from `twopc::record`). `infra/tests` compares `infra/template.yaml` with it, so the
//! template cannot drift from the code.
//!
//! `cargo run -q -p twopc --example contract`

use serde_json::{Value, json};
use twopc::environment::{DEFAULT_CONNECTIONS_TABLE, FUNCTION_ENVIRONMENT};
use twopc::model::MAX_TIMEOUT_MS;
use twopc::record::DEFAULT_TRANSACTIONS_TABLE;
use twopc::tables::{TableSpec, connections_table, participant_table, transactions_table};

/// The participant tables of the default registry (`service-a`, `service-b`).
const DEFAULT_PARTICIPANT_TABLES: [&str; 2] = ["service-a-data", "service-b-data"];

fn key(key: &(&str, aws_sdk_dynamodb::types::ScalarAttributeType)) -> Value {
    json!([key.0, key.1.as_str()])
}

fn table(spec: &TableSpec) -> Value {
    json!({
        "name": spec.name,
        "hashKey": key(&spec.hash_key),
        "rangeKey": spec.range_key.as_ref().map(key),
        "indexes": spec.indexes.iter().map(|index| json!({
            "name": index.name,
            "hashKey": key(&index.hash_key),
            "rangeKey": index.range_key.as_ref().map(key),
            "projection": index.projection.as_str(),
        })).collect::<Vec<_>>(),
        "stream": spec.stream,
        "ttlAttribute": spec.ttl_attribute,
    })
}

fn main() {
    let mut tables = vec![transactions_table(DEFAULT_TRANSACTIONS_TABLE)];
    tables.extend(DEFAULT_PARTICIPANT_TABLES.iter().map(|name| participant_table(name)));
    tables.push(connections_table(DEFAULT_CONNECTIONS_TABLE));

    let environment: serde_json::Map<String, Value> =
        FUNCTION_ENVIRONMENT.iter().map(|(function, variables)| ((*function).to_owned(), json!(variables))).collect();

    let contract = json!({
        "tables": tables.iter().map(table).collect::<Vec<_>>(),
        // Which of the tables are participant data tables: a deployment may add more services, each
        // with a table of the same shape under its own name.
        "participantTables": DEFAULT_PARTICIPANT_TABLES,
        "functionEnvironment": environment,
        // The longest `timeoutMs` the coordinator accepts: its Lambda timeout must be longer.
        "maxTransactionTimeoutMs": MAX_TIMEOUT_MS,
        // How long a POST may take to answer, and how long its second phase may run after an answer on
        // its decision (`Prefer: respond-async`) in the same invocation: the Lambda timeout must be longer
        // than both together.
        "answerBudgetMs": twopc::coordinator::ANSWER_BUDGET.as_millis() as u64,
        "afterAnswerBudgetMs": twopc::coordinator::AFTER_ANSWER_BUDGET.as_millis() as u64,
        // The metrics the code writes (embedded metric format, namespace from METRICS_NAMESPACE):
        // the only names an alarm or the dashboard may watch.
        "metrics": {
            "namespaceVariable": twopc::telemetry::METRICS_NAMESPACE,
            "coordinatorCounts": twopc::telemetry::COORDINATOR_COUNTS,
            "coordinatorLatencies": twopc::telemetry::COORDINATOR_LATENCIES,
            "abortedDimension": twopc::telemetry::REASON,
            "sweeperCounts": twopc::telemetry::SWEEPER_COUNTS,
            "sweeperGauges": twopc::telemetry::SWEEPER_GAUGES,
            "streamProcessorCounts": twopc::telemetry::STREAM_PROCESSOR_COUNTS,
        },
        // The top-level attributes of a transaction record, and those each narrower writer writes (the
        // key among them): the sweeper's recovery, and a participant's one UpdateItem (its abort of an
        // expired owner). The templates' IAM conditions on `dynamodb:Attributes` must refuse neither
        // writer what it writes (DynamoDB Local enforces no IAM: only AWS would refuse the write).
        "transactionRecordWrites": {
            "attributes": twopc::record::RECORD_ATTRIBUTES,
            "recovery": twopc::record::RECOVERY_WRITES,
            "ownerAbort": twopc::record::OWNER_ABORT_WRITES,
        },
    });
    println!("{}", serde_json::to_string_pretty(&contract).expect("JSON values serialize"));
}
