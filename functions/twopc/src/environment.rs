//! The environment each function reads: every variable, named by the module that reads it, listed per
//! function. A test holds `infra/template.yaml` (and the CDK app) to this list.

use crate::access::ACCESS_POLICY;
use crate::age::AGE_TOKEN_KEY;
use crate::auth::{PARTICIPANT_KEY, PARTICIPANT_KEYS, PARTICIPANT_SIGNATURE};
use crate::cors::CORS_ALLOW_ORIGIN;
use crate::custom::SERVICE_OPERATIONS;
use crate::fanout::connections::{
    CONNECTIONS_TABLE_NAME, MAX_CONNECTIONS_PER_PRINCIPAL, MAX_TOPICS_PER_CONNECTION, WEBSOCKET_API_ID,
};
use crate::fanout::lake::FIREHOSE_STREAM_NAME;
use crate::fanout::realtime::WEBSOCKET_ENDPOINT;
use crate::fanout::replay::DEAD_LETTER_QUEUE_URL;
use crate::hold::{HOLD_POLICY, MAX_HOLD_MS};
use crate::invoke::PARTICIPANTS;
use crate::jwt::{JWKS_URL, JWT_AUDIENCE, JWT_ISSUER};
use crate::participant::{DATA_TABLE_NAME, SERVICE_NAME};
use crate::record::TRANSACTIONS_TABLE_NAME;
use crate::tables::PARTICIPANT_TABLES;
use crate::telemetry::METRICS_NAMESPACE;

/// The payments example (a resource participant): its payment API's base URL.
pub const PAYMENT_API_URL: &str = "PAYMENT_API_URL";

/// The environment each function reads, for the template check in `tests/`.
pub const FUNCTION_ENVIRONMENT: &[(&str, &[&str])] = &[
    (
        "coordinator",
        &[
            TRANSACTIONS_TABLE_NAME,
            PARTICIPANTS,
            METRICS_NAMESPACE,
            CORS_ALLOW_ORIGIN,
            PARTICIPANT_KEYS,
            PARTICIPANT_SIGNATURE,
            AGE_TOKEN_KEY,
            SERVICE_OPERATIONS,
            HOLD_POLICY,
            MAX_HOLD_MS,
            ACCESS_POLICY,
        ],
    ),
    ("participant", &[SERVICE_NAME, DATA_TABLE_NAME, TRANSACTIONS_TABLE_NAME, PARTICIPANT_KEY]),
    // The example service's own participant: the participant library, so the participant's settings.
    ("inventory", &[SERVICE_NAME, DATA_TABLE_NAME, TRANSACTIONS_TABLE_NAME, PARTICIPANT_KEY]),
    // The example resource participant: the participant library's settings, and its payment API.
    ("payments", &[SERVICE_NAME, DATA_TABLE_NAME, TRANSACTIONS_TABLE_NAME, PARTICIPANT_KEY, PAYMENT_API_URL]),
    (
        "sweeper",
        &[
            TRANSACTIONS_TABLE_NAME,
            PARTICIPANTS,
            PARTICIPANT_TABLES,
            METRICS_NAMESPACE,
            PARTICIPANT_KEYS,
            PARTICIPANT_SIGNATURE,
        ],
    ),
    (
        "stream-processor",
        &[
            TRANSACTIONS_TABLE_NAME,
            PARTICIPANT_TABLES,
            CONNECTIONS_TABLE_NAME,
            FIREHOSE_STREAM_NAME,
            WEBSOCKET_ENDPOINT,
            DEAD_LETTER_QUEUE_URL,
            METRICS_NAMESPACE,
            ACCESS_POLICY,
        ],
    ),
    (
        "connections",
        &[
            CONNECTIONS_TABLE_NAME,
            MAX_TOPICS_PER_CONNECTION,
            TRANSACTIONS_TABLE_NAME,
            ACCESS_POLICY,
            MAX_CONNECTIONS_PER_PRINCIPAL,
            WEBSOCKET_API_ID,
        ],
    ),
    ("authorizer", &[JWT_ISSUER, JWT_AUDIENCE, JWKS_URL, ACCESS_POLICY]),
];
