//! DynamoDB error handling shared by every store: what a failure means for the protocol.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::AttributeValue;

pub mod write;

pub type Item = HashMap<String, AttributeValue>;

/// An infrastructure failure: DynamoDB could not be asked or did not answer. Never a business answer.
#[derive(Debug, thiserror::Error)]
#[error("DynamoDB {operation} on {table} failed: {message}")]
pub struct StoreError {
    pub operation: &'static str,
    pub table: String,
    pub message: String,
    /// Whether a write that failed so may still have taken effect.
    pub outcome: WriteOutcome,
    /// DynamoDB refused the request as invalid (a `ValidationException`: an item over 400 KB, nesting too
    /// deep, an empty name): sent again as it is, it is refused again.
    pub invalid: bool,
}

/// What a failed request says about its write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// DynamoDB answered that it refused the request (a 4xx: validation, throttling, access): not applied.
    NotApplied,
    /// No answer, or a server error: the write may have taken effect.
    Unknown,
}

impl StoreError {
    /// A failure of this system's own making (a record that does not decode, a write found missing): no
    /// write of it took effect.
    pub fn internal(operation: &'static str, table: &str, message: impl Into<String>) -> StoreError {
        StoreError {
            operation,
            table: table.to_owned(),
            message: message.into(),
            outcome: WriteOutcome::NotApplied,
            invalid: false,
        }
    }

    pub fn new<E>(
        operation: &'static str,
        table: &str,
        err: SdkError<E, aws_smithy_runtime_api::http::Response>,
    ) -> StoreError
    where
        E: std::error::Error + aws_sdk_dynamodb::error::ProvideErrorMetadata + 'static,
    {
        let invalid = err.as_service_error().and_then(|e| e.code()) == Some("ValidationException");
        let outcome = match &err {
            SdkError::ConstructionFailure(_) => WriteOutcome::NotApplied,
            SdkError::ServiceError(service) if service.raw().status().is_client_error() => WriteOutcome::NotApplied,
            _ => WriteOutcome::Unknown,
        };
        // One line a person can act on: the service's code and message, or why no answer came.
        let message = match &err {
            SdkError::ServiceError(service) => {
                let e = service.err();
                format!("{}: {}", e.code().unwrap_or("error"), e.message().unwrap_or("no message"))
            }
            SdkError::TimeoutError(_) => "no answer in time".to_owned(),
            SdkError::DispatchFailure(failure) if failure.is_io() => "could not connect".to_owned(),
            other => aws_smithy_types::error::display::DisplayErrorContext(other).to_string(),
        };
        StoreError { operation, table: table.to_owned(), message, outcome, invalid }
    }
}

/// Watches every attempt of one request (the SDK retries transient failures on its own), so that a
/// failure can tell whether any attempt may have taken effect: only an attempt DynamoDB answered with a
/// 4xx certainly did not. Register it with `.customize().interceptor(watch.clone())`.
#[derive(Debug, Clone, Default)]
pub struct AttemptWatch(Arc<AtomicBool>);

impl AttemptWatch {
    /// The error of the watched request, unknown if any of its attempts went unanswered or failed on the
    /// server side, whatever the last attempt said.
    pub fn error<E>(
        &self,
        operation: &'static str,
        table: &str,
        err: SdkError<E, aws_smithy_runtime_api::http::Response>,
    ) -> StoreError
    where
        E: std::error::Error + aws_sdk_dynamodb::error::ProvideErrorMetadata + 'static,
    {
        let mut error = StoreError::new(operation, table, err);
        if self.0.load(Ordering::Relaxed) {
            error.outcome = WriteOutcome::Unknown;
        }
        error
    }
}

impl aws_smithy_runtime_api::client::interceptors::Intercept for AttemptWatch {
    fn name(&self) -> &'static str {
        "AttemptWatch"
    }

    fn read_after_attempt(
        &self,
        context: &aws_smithy_runtime_api::client::interceptors::context::FinalizerInterceptorContextRef<'_>,
        _components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        _cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let answered = context.response().is_some_and(|r| r.status().is_success() || r.status().is_client_error());
        if !answered {
            self.0.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
}

pub fn get_s<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name).and_then(|v| v.as_s().ok()).map(String::as_str)
}

pub fn get_n<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name).and_then(|v| v.as_n().ok()).map(String::as_str)
}

pub fn get_m<'a>(item: &'a Item, name: &str) -> Option<&'a Item> {
    item.get(name).and_then(|v| v.as_m().ok())
}

/// Reads `keys` of `table` in BatchGetItem calls of at most 100 keys, consistently or not; keys DynamoDB
/// leaves unprocessed (throttling) are asked again after a wait that doubles from 50 ms, five tries in
/// all, then it is an error. The items found, in no particular order; keys without an item are left out.
pub async fn batch_get(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    keys: &[Item],
    consistent: bool,
) -> Result<Vec<Item>, StoreError> {
    const TRIES: u32 = 5;
    let mut found = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(100) {
        let mut pending = chunk.to_vec();
        let mut tries = 0;
        while !pending.is_empty() {
            if tries == TRIES {
                let message = format!("{} keys still unprocessed after {TRIES} tries", pending.len());
                return Err(StoreError::internal("BatchGetItem", table, message));
            }
            if tries > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(50 << (tries - 1))).await;
            }
            tries += 1;
            let request = aws_sdk_dynamodb::types::KeysAndAttributes::builder()
                .set_keys(Some(std::mem::take(&mut pending)))
                .consistent_read(consistent)
                .build()
                .expect("keys are set");
            let out = client
                .batch_get_item()
                .request_items(table, request)
                .send()
                .await
                .map_err(|e| StoreError::new("BatchGetItem", table, e))?;
            found.extend(out.responses.and_then(|mut r| r.remove(table)).unwrap_or_default());
            pending = out.unprocessed_keys.and_then(|mut u| u.remove(table)).map(|k| k.keys).unwrap_or_default();
        }
    }
    Ok(found)
}

/// Spreads sparse-index writes over [`crate::tables::INDEX_SHARDS`] partition values.
pub fn shard_of(id: &str, prefix: &str) -> String {
    let hash = id.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
    format!("{prefix}#{}", hash % crate::tables::INDEX_SHARDS)
}

/// A sparse index spread over [`crate::tables::INDEX_SHARDS`] partitions (`<prefix>#<n>` in
/// `shard_attr`), sorted by a time in `sort_attr`: the records open for the sweeper, the locks.
pub struct ShardedIndex<'a> {
    pub table: &'a str,
    pub index: &'a str,
    pub shard_attr: &'a str,
    pub prefix: &'a str,
    pub sort_attr: &'a str,
}

impl ShardedIndex<'_> {
    /// The entries due before `before_ms`, oldest first in every shard, following `LastEvaluatedKey`
    /// until each shard's budget of `per_shard` entries is spent: bounded work per call.
    pub async fn due_before(
        &self,
        client: &aws_sdk_dynamodb::Client,
        before_ms: u64,
        per_shard: i32,
    ) -> Result<Vec<Item>, StoreError> {
        use crate::expr::{Expr, n, s};
        let mut items = Vec::new();
        for shard in 0..crate::tables::INDEX_SHARDS {
            let (mut found, mut start) = (0, None);
            loop {
                let mut e = Expr::new();
                let condition = format!(
                    "{} = {} AND {} < {}",
                    e.name(self.shard_attr),
                    e.value(s(format!("{}#{shard}", self.prefix))),
                    e.name(self.sort_attr),
                    e.value(n(before_ms))
                );
                let out = client
                    .query()
                    .table_name(self.table)
                    .index_name(self.index)
                    .key_condition_expression(condition)
                    .set_expression_attribute_names(e.names())
                    .set_expression_attribute_values(e.values())
                    .limit(per_shard - found)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|err| StoreError::new("Query", self.table, err))?;
                let page = out.items.unwrap_or_default();
                found += page.len() as i32;
                items.extend(page);
                start = out.last_evaluated_key;
                if start.is_none() || found >= per_shard {
                    break;
                }
            }
        }
        Ok(items)
    }
}
