//! Reading configuration from environment variables. Each module names the variables it reads, beside
//! the code that uses them; [`crate::environment`] lists which each function reads, and a test holds
//! `infra/template.yaml` to that list.

use std::collections::BTreeMap;

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

/// What `parse` made of variable `name`'s value, or why the value is not valid.
pub fn parsed<T>(name: &'static str, parse: Result<T, String>) -> Result<T, ConfigError> {
    parse.map_err(|message| ConfigError::Invalid { name, message })
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
