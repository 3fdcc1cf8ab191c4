//! The outcome history deployed: a rule on the outcomes bus writes the terminal events to a CloudWatch Logs
//! group (`OUTCOME_LOG_GROUP`), and `GET /admin/outcomes` reads it back with `FilterLogEvents`, the
//! terminal ones only. The local stack serves the same API over its `.local/events/`.

use std::future::Future;
use std::pin::Pin;

use aws_sdk_cloudwatchlogs::error::ProvideErrorMetadata;
use serde_json::Value;
use tracing::warn;
use twopc::coordinator::{HistoryError, OutcomeHistory, OutcomePage, listed_outcome};

/// The log group the outcomes bus's rule writes to; unset, `GET /admin/outcomes` answers 503.
pub use twopc::environment::OUTCOME_LOG_GROUP;

/// The terminal outcomes among the events: what CloudWatch Logs filters the log group by.
pub const TERMINAL_OUTCOMES: &str = r#"{ ($.detail.status = "COMMITTED") || ($.detail.status = "ABORTED") }"#;

#[derive(Debug, Clone)]
pub struct LogGroupHistory {
    client: aws_sdk_cloudwatchlogs::Client,
    group: String,
}

impl LogGroupHistory {
    pub fn new(client: aws_sdk_cloudwatchlogs::Client, group: impl Into<String>) -> Self {
        LogGroupHistory { client, group: group.into() }
    }

    pub fn from_config(sdk: &aws_config::SdkConfig, group: impl Into<String>) -> Self {
        Self::new(aws_sdk_cloudwatchlogs::Client::new(sdk), group)
    }

    async fn read(&self, from_ms: u64, limit: usize, next: Option<&str>) -> Result<OutcomePage, HistoryError> {
        let page = self
            .client
            .filter_log_events()
            .log_group_name(&self.group)
            .start_time(from_ms as i64)
            .filter_pattern(TERMINAL_OUTCOMES)
            .limit(limit as i32)
            .set_next_token(next.map(str::to_owned))
            .send()
            .await
            .map_err(|e| {
                // The filter is this function's own, so a refused parameter on a page after the first is
                // its token (CloudWatch Logs' tokens expire): the service's own words, for the caller.
                match e.code() {
                    Some("InvalidParameterException") if next.is_some() => {
                        HistoryError::PageRefused(e.message().unwrap_or("the token was refused").to_owned())
                    }
                    _ => {
                        HistoryError::Unavailable(aws_smithy_types::error::display::DisplayErrorContext(&e).to_string())
                    }
                }
            })?;
        let outcomes = page
            .events()
            .iter()
            .filter_map(|event| {
                let message = event.message().unwrap_or_default();
                match serde_json::from_str::<Value>(message) {
                    Ok(event) => Some(event),
                    Err(error) => {
                        // Only the bus's rule writes to the group: a line that is not an event is worth a look.
                        warn!(group = %self.group, event_id = event.event_id().unwrap_or_default(), %error,
                              "a line of the outcome log group is not an event; it is left out");
                        None
                    }
                }
            })
            .filter_map(|event| listed_outcome(&event))
            .collect();
        Ok(OutcomePage { outcomes, next: page.next_token().map(str::to_owned) })
    }
}

impl OutcomeHistory for LogGroupHistory {
    fn terminal_outcomes<'a>(
        &'a self,
        from_ms: u64,
        limit: usize,
        next: Option<&'a str>,
    ) -> Pin<Box<dyn Future<Output = Result<OutcomePage, HistoryError>> + Send + 'a>> {
        Box::pin(self.read(from_ms, limit, next))
    }
}
