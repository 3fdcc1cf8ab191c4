//! Configuration from environment variables. Every variable a function reads is named here, once;
//! a test holds `infra/template.yaml` to this list.

use std::collections::BTreeMap;

pub const TRANSACTIONS_TABLE_NAME: &str = "TRANSACTIONS_TABLE_NAME";
/// Coordinator and sweeper: the service registry, JSON `{"service": "function name or ARN"}`.
pub const PARTICIPANTS: &str = "PARTICIPANTS";
/// Sweeper and stream processor: JSON `{"service": "data table name"}`.
pub const PARTICIPANT_TABLES: &str = "PARTICIPANT_TABLES";
/// Participant: the service it serves and the table it owns.
pub const SERVICE_NAME: &str = "SERVICE_NAME";
pub const DATA_TABLE_NAME: &str = "DATA_TABLE_NAME";
pub const CONNECTIONS_TABLE_NAME: &str = "CONNECTIONS_TABLE_NAME";
pub const FIREHOSE_STREAM_NAME: &str = "FIREHOSE_STREAM_NAME";
/// Stream processor: the WebSocket API's management endpoint, `https://{api}.execute-api.{region}.amazonaws.com/{stage}`.
pub const WEBSOCKET_ENDPOINT: &str = "WEBSOCKET_ENDPOINT";
/// Connections: the id of the WebSocket API it serves; an event whose `requestContext.apiId` is another
/// is refused before anything is read or written.
pub const WEBSOCKET_API_ID: &str = "WEBSOCKET_API_ID";
/// Coordinator and sweeper: the CloudWatch namespace of their embedded-metric-format metrics.
pub const METRICS_NAMESPACE: &str = "METRICS_NAMESPACE";
/// Coordinator: the origin its answers allow cross-origin callers (`*`, or one origin such as
/// `https://app.example.com`); unset or empty, no CORS header (see [`crate::cors`]).
pub const CORS_ALLOW_ORIGIN: &str = "CORS_ALLOW_ORIGIN";
/// Connections: how many topics one WebSocket connection may follow at once (default
/// [`DEFAULT_MAX_TOPICS_PER_CONNECTION`]); topics over it are refused, each with the reason.
pub const MAX_TOPICS_PER_CONNECTION: &str = "MAX_TOPICS_PER_CONNECTION";
pub const DEFAULT_MAX_TOPICS_PER_CONNECTION: usize = 50;
/// Connections: open WebSocket connections one principal may have (a whole number, at least 1).
pub const MAX_CONNECTIONS_PER_PRINCIPAL: &str = "MAX_CONNECTIONS_PER_PRINCIPAL";
pub const DEFAULT_MAX_CONNECTIONS_PER_PRINCIPAL: usize = 10;
/// Stream processor: the queue its event source mappings send what they give up on (Lambda's
/// on-failure records: shard and sequence ranges), which its `replay-dead-letters` action reads back.
pub const DEAD_LETTER_QUEUE_URL: &str = "DEAD_LETTER_QUEUE_URL";
pub const DEFAULT_METRICS_NAMESPACE: &str = "TwoPhaseCommit";
/// Coordinator and sweeper: where each participant service's message key is, JSON `{"service": "secret
/// ARN"}` (Secrets Manager), or `local-development-keys` ([`crate::auth::LOCAL_KEYS`], the local stack).
pub const PARTICIPANT_KEYS: &str = "PARTICIPANT_KEYS";
/// Coordinator: its own key, which signs and verifies age tokens (issue 42): the ARN of a secret only its
/// role may read, or a key set written out (the local stack's, made at each start); never a participant's
/// key ([`crate::age::keys_from_setting`]).
pub const AGE_TOKEN_KEY: &str = "AGE_TOKEN_KEY";
/// Participant: its own service's message key, a secret ARN, or `local-development-keys`.
pub const PARTICIPANT_KEY: &str = "PARTICIPANT_KEY";
/// Coordinator and sweeper: how participant messages are signed, `v1` (the default) or `v2` (an
/// envelope whose MAC covers the message's bytes as sent). Switch to `v2` only once every participant
/// verifies it (infra/DEPLOY.md); every participant verifies both.
pub const PARTICIPANT_SIGNATURE: &str = "PARTICIPANT_SIGNATURE";
/// The payments example (a resource participant): its payment API's base URL.
pub const PAYMENT_API_URL: &str = "PAYMENT_API_URL";
/// Coordinator: each service's own operation kinds, JSON `{"service": [operation schema, ...]}`
/// ([`crate::custom`]); `{}` when no service has any.
pub const SERVICE_OPERATIONS: &str = "SERVICE_OPERATIONS";

/// Coordinator: which services accept held transactions (`holdMs`) and for how long at most, JSON
/// `{"service": {"accepts"?: bool, "maxHoldMs"?: milliseconds}}` ([`crate::hold`]); a service not named
/// accepts holds of up to 15 minutes.
pub const HOLD_POLICY: &str = "HOLD_POLICY";
/// Coordinator: the longest hold of any transaction, in milliseconds (default and ceiling 24 hours).
pub const MAX_HOLD_MS: &str = "MAX_HOLD_MS";

/// The coordinator's hold policy (`HOLD_POLICY`, `MAX_HOLD_MS`; the defaults when unset or empty).
pub fn hold_policy() -> Result<crate::hold::HoldPolicy, ConfigError> {
    let max = std::env::var(MAX_HOLD_MS).ok();
    let services = std::env::var(HOLD_POLICY).ok();
    crate::hold::HoldPolicy::parse(None, max.as_deref())
        .map_err(|message| ConfigError::Invalid { name: MAX_HOLD_MS, message })?;
    crate::hold::HoldPolicy::parse(services.as_deref(), max.as_deref())
        .map_err(|message| ConfigError::Invalid { name: HOLD_POLICY, message })
}

/// The services' own operation kinds (`SERVICE_OPERATIONS`; none when unset or empty).
pub fn service_operations() -> Result<crate::custom::Catalogs, ConfigError> {
    match std::env::var(SERVICE_OPERATIONS) {
        Ok(text) if !text.trim().is_empty() => crate::custom::Catalogs::parse(&text)
            .map_err(|message| ConfigError::Invalid { name: SERVICE_OPERATIONS, message }),
        _ => Ok(crate::custom::Catalogs::default()),
    }
}

/// The key source a setting names (see [`crate::auth::from_setting`]).
/// The coordinator's own age-token keys, from its required `AGE_TOKEN_KEY`.
pub fn age_token_keys(sdk: &aws_config::SdkConfig) -> Result<std::sync::Arc<dyn crate::auth::KeySource>, ConfigError> {
    crate::age::keys_from_setting(sdk, &required(AGE_TOKEN_KEY)?)
        .map_err(|message| ConfigError::Invalid { name: AGE_TOKEN_KEY, message })
}

pub fn keys(
    sdk: &aws_config::SdkConfig,
    name: &'static str,
    setting: &str,
) -> Result<std::sync::Arc<dyn crate::auth::KeySource>, ConfigError> {
    crate::auth::from_setting(sdk, setting).map_err(|message| ConfigError::Invalid { name, message })
}

pub const DEFAULT_TRANSACTIONS_TABLE: &str = "transactions";
pub const DEFAULT_CONNECTIONS_TABLE: &str = "connections";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("environment variable {0} is not set")]
    Missing(&'static str),
    #[error("environment variable {name} is not valid: {message}")]
    Invalid { name: &'static str, message: String },
}

pub fn required(name: &'static str) -> Result<String, ConfigError> {
    std::env::var(name).map_err(|_| ConfigError::Missing(name))
}

pub fn or_default(name: &'static str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// A whole number of at least 1, or `default` when the variable is unset or empty.
pub fn positive_or_default(name: &'static str, default: usize) -> Result<usize, ConfigError> {
    match std::env::var(name) {
        Ok(text) if !text.trim().is_empty() => parse_positive(name, &text),
        _ => Ok(default),
    }
}

fn parse_positive(name: &'static str, text: &str) -> Result<usize, ConfigError> {
    match text.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => {
            Err(ConfigError::Invalid { name, message: format!("expected a whole number of at least 1, got {text:?}") })
        }
    }
}

/// `PARTICIPANT_SIGNATURE`: v1 when unset or empty.
pub fn participant_signature() -> Result<crate::auth::SignatureVersion, ConfigError> {
    let text = std::env::var(PARTICIPANT_SIGNATURE).ok();
    crate::auth::SignatureVersion::parse(text.as_deref())
        .map_err(|message| ConfigError::Invalid { name: PARTICIPANT_SIGNATURE, message })
}

/// A JSON object of string values, such as the service registry.
pub fn string_map(name: &'static str) -> Result<BTreeMap<String, String>, ConfigError> {
    let text = required(name)?;
    serde_json::from_str(&text)
        .map_err(|e| ConfigError::Invalid { name, message: format!("expected a JSON object of strings: {e}") })
}

/// The shared AWS configuration. `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_DYNAMODB`, ...) points the
/// clients at local endpoints; the SDK reads those itself.
pub async fn aws() -> aws_config::SdkConfig {
    aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await
}

/// Structured logs: JSON in Lambda (CloudWatch parses it), readable text in a terminal. Every span
/// field (the transaction id) is carried on every line. The level is the function's log level in
/// Lambda (`AWS_LAMBDA_LOG_LEVEL`, from its logging configuration); `RUST_LOG`, when set, filters
/// more finely and wins.
pub fn init_tracing() {
    let filter =
        log_filter(std::env::var("RUST_LOG").ok().as_deref(), std::env::var("AWS_LAMBDA_LOG_LEVEL").ok().as_deref());
    let filter =
        tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let in_lambda = std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let _ = if in_lambda {
        builder.json().with_current_span(true).with_span_list(false).without_time().try_init()
    } else {
        builder.try_init()
    };
}

/// The filter for `RUST_LOG` and Lambda's level (TRACE, DEBUG, INFO, WARN, ERROR, FATAL).
pub fn log_filter(rust_log: Option<&str>, lambda_level: Option<&str>) -> String {
    if let Some(filter) = rust_log.filter(|f| !f.trim().is_empty()) {
        return filter.to_owned();
    }
    match lambda_level.map(|l| l.trim().to_ascii_uppercase()).as_deref() {
        Some("TRACE") => "trace",
        Some("DEBUG") => "debug",
        Some("WARN") => "warn",
        Some("ERROR" | "FATAL") => "error",
        _ => "info",
    }
    .to_owned()
}

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
            crate::access::ACCESS_POLICY,
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
            crate::access::ACCESS_POLICY,
        ],
    ),
    (
        "connections",
        &[
            CONNECTIONS_TABLE_NAME,
            MAX_TOPICS_PER_CONNECTION,
            TRANSACTIONS_TABLE_NAME,
            crate::access::ACCESS_POLICY,
            MAX_CONNECTIONS_PER_PRINCIPAL,
            WEBSOCKET_API_ID,
        ],
    ),
    (
        "authorizer",
        &[crate::jwt::JWT_ISSUER, crate::jwt::JWT_AUDIENCE, crate::jwt::JWKS_URL, crate::access::ACCESS_POLICY],
    ),
];

#[cfg(test)]
mod tests {
    use super::{log_filter, parse_positive};

    #[test]
    fn positive_numbers_parse_and_others_say_why_not() {
        assert_eq!(parse_positive("X", " 50 ").unwrap(), 50);
        for bad in ["0", "-1", "many", "1.5"] {
            let err = parse_positive("X", bad).unwrap_err().to_string();
            assert!(err.contains("X") && err.contains("at least 1"), "{err}");
        }
    }

    #[test]
    fn lambda_log_level_sets_the_filter_unless_rust_log_is_given() {
        assert_eq!(log_filter(None, Some("DEBUG")), "debug");
        assert_eq!(log_filter(None, Some("warn")), "warn");
        assert_eq!(log_filter(None, Some("FATAL")), "error");
        assert_eq!(log_filter(None, None), "info");
        assert_eq!(log_filter(None, Some("LOUD")), "info");
        assert_eq!(log_filter(Some("twopc=trace"), Some("ERROR")), "twopc=trace");
        assert_eq!(log_filter(Some(" "), Some("ERROR")), "error");
    }
}
