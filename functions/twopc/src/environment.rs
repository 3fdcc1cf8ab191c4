//! The environment each function reads: every variable, named by the module that reads it, listed per
//! function. A test holds `infra/template.yaml` (and the CDK app) to this list.
//!
//! The variables read outside this crate are named here instead: the payments example's, and the
//! fan-out's (the `twopc-fanout` crate, functions/fanout). That crate depends on this one, so this list
//! could not name them where they are read; each fan-out module that reads one re-exports its name
//! (`twopc_fanout::connections::CONNECTIONS_TABLE_NAME` is this `CONNECTIONS_TABLE_NAME`).

use crate::access::ACCESS_POLICY;
use crate::age::AGE_TOKEN_KEY;
use crate::auth::{PARTICIPANT_KEY, PARTICIPANT_KEYS, PARTICIPANT_SIGNATURE};
use crate::cors::CORS_ALLOW_ORIGIN;
use crate::custom::SERVICE_OPERATIONS;
use crate::hold::{HOLD_POLICY, MAX_HOLD_MS};
use crate::invoke::PARTICIPANTS;
use crate::jwt::{JWKS_URL, JWT_AUDIENCE, JWT_ISSUER};
use crate::participant::{DATA_TABLE_NAME, PENDING_CREDITS, SERVICE_NAME};
use crate::record::TRANSACTIONS_TABLE_NAME;
use crate::tables::PARTICIPANT_TABLES;
use crate::telemetry::METRICS_NAMESPACE;

/// The payments example (a resource participant): its payment API's base URL.
pub const PAYMENT_API_URL: &str = "PAYMENT_API_URL";

/// Connections and stream processor: the connections table (default [`DEFAULT_CONNECTIONS_TABLE`];
/// `twopc_fanout::connections`).
pub const CONNECTIONS_TABLE_NAME: &str = "CONNECTIONS_TABLE_NAME";
pub const DEFAULT_CONNECTIONS_TABLE: &str = "connections";
/// Connections: the id of the WebSocket API it serves; an event whose `requestContext.apiId` is another
/// is refused before anything is read or written (`twopc_fanout::connections`).
pub const WEBSOCKET_API_ID: &str = "WEBSOCKET_API_ID";
/// Connections: how many topics one WebSocket connection may follow at once (default
/// `twopc_fanout::connections::DEFAULT_MAX_TOPICS_PER_CONNECTION`); topics over it are refused, each
/// with the reason.
pub const MAX_TOPICS_PER_CONNECTION: &str = "MAX_TOPICS_PER_CONNECTION";
/// Connections: open WebSocket connections one principal may have (a whole number, at least 1; default
/// `twopc_fanout::connections::DEFAULT_MAX_CONNECTIONS_PER_PRINCIPAL`).
pub const MAX_CONNECTIONS_PER_PRINCIPAL: &str = "MAX_CONNECTIONS_PER_PRINCIPAL";
/// Stream processor: the Firehose stream the lake's records go to (`twopc_fanout::lake`).
pub const FIREHOSE_STREAM_NAME: &str = "FIREHOSE_STREAM_NAME";
/// Stream processor: the WebSocket API's management endpoint, `https://{api}.execute-api.{region}.amazonaws.com/{stage}`
/// (`twopc_fanout::realtime`).
pub const WEBSOCKET_ENDPOINT: &str = "WEBSOCKET_ENDPOINT";
/// Stream processor: the queue its event source mappings send what they give up on (Lambda's
/// on-failure records: shard and sequence ranges), which its `replay-dead-letters` action reads back
/// (`twopc_fanout::replay`).
pub const DEAD_LETTER_QUEUE_URL: &str = "DEAD_LETTER_QUEUE_URL";
/// Outcomes and sweeper: the EventBridge bus outcome events and the sweeper's age alerts go to
/// (`twopc_fanout::outcomes`).
pub const EVENT_BUS_NAME: &str = "EVENT_BUS_NAME";
/// Sweeper: a transaction still open this many milliseconds past its deadline (a hold: past its
/// `holdUntil`) is announced on the bus each run (default `twopc_fanout::outcomes::DEFAULT_OPEN_ALERT_AFTER_MS`).
pub const OPEN_ALERT_AFTER_MS: &str = "OPEN_ALERT_AFTER_MS";

/// Coordinator: the CloudWatch Logs group a rule on the outcomes bus writes every event to, which
/// `GET /admin/outcomes` reads back (`coordinator::outcome_log`); unset, that route answers 503.
pub const OUTCOME_LOG_GROUP: &str = "OUTCOME_LOG_GROUP";

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
            PARTICIPANT_TABLES,
            OUTCOME_LOG_GROUP,
        ],
    ),
    ("participant", &[SERVICE_NAME, DATA_TABLE_NAME, TRANSACTIONS_TABLE_NAME, PARTICIPANT_KEY, PENDING_CREDITS]),
    // The example service's own participant: the participant library, so the participant's settings.
    ("inventory", &[SERVICE_NAME, DATA_TABLE_NAME, TRANSACTIONS_TABLE_NAME, PARTICIPANT_KEY, PENDING_CREDITS]),
    // The example resource participant: the participant library's settings, and its payment API.
    (
        "payments",
        &[SERVICE_NAME, DATA_TABLE_NAME, TRANSACTIONS_TABLE_NAME, PARTICIPANT_KEY, PENDING_CREDITS, PAYMENT_API_URL],
    ),
    (
        "sweeper",
        &[
            TRANSACTIONS_TABLE_NAME,
            PARTICIPANTS,
            PARTICIPANT_TABLES,
            METRICS_NAMESPACE,
            PARTICIPANT_KEYS,
            PARTICIPANT_SIGNATURE,
            EVENT_BUS_NAME,
            OPEN_ALERT_AFTER_MS,
        ],
    ),
    // The transactions table's second stream reader: request outcomes to the bus.
    ("outcomes", &[TRANSACTIONS_TABLE_NAME, EVENT_BUS_NAME]),
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
            // Which operations are a resource's: they make no lake line (a transaction line counts them so).
            SERVICE_OPERATIONS,
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
