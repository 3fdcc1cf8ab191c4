//! DynamoDB error handling shared by every store: what a failure means for the protocol.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::AttributeValue;

pub type Item = HashMap<String, AttributeValue>;

/// An infrastructure failure: DynamoDB could not be asked or did not answer. Never a business answer.
#[derive(Debug, thiserror::Error)]
#[error("DynamoDB {operation} on {table} failed: {message}")]
pub struct StoreError {
    pub operation: &'static str,
    pub table: String,
    pub message: String,
}

impl StoreError {
    pub fn new<E, R>(operation: &'static str, table: &str, err: SdkError<E, R>) -> StoreError
    where
        E: std::error::Error + aws_sdk_dynamodb::error::ProvideErrorMetadata + 'static,
        R: std::fmt::Debug,
    {
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
        StoreError { operation, table: table.to_owned(), message }
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

/// Spreads sparse-index writes over [`crate::tables::INDEX_SHARDS`] partition values.
pub fn shard_of(id: &str, prefix: &str) -> String {
    let hash = id.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
    format!("{prefix}#{}", hash % crate::tables::INDEX_SHARDS)
}

/// Keys from every shard of a sparse index whose sort key is below `below`, oldest first, following
/// `LastEvaluatedKey` until each shard's budget of `per_shard` items is spent: bounded work per call.
pub async fn query_index_below(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    index: &str,
    (shard_attribute, shard_prefix): (&str, &str),
    sort_attribute: &str,
    below: u64,
    per_shard: i32,
) -> Result<Vec<Item>, StoreError> {
    let mut found_items = Vec::new();
    for shard in 0..crate::tables::INDEX_SHARDS {
        let mut e = crate::expr::Expr::new();
        let shard_name = e.name(shard_attribute);
        let shard_value = e.value(crate::expr::s(format!("{shard_prefix}#{shard}")));
        let sort_name = e.name(sort_attribute);
        let bound = e.value(crate::expr::n(below));
        let (mut found, mut start) = (0, None);
        loop {
            let out = client
                .query()
                .table_name(table)
                .index_name(index)
                .key_condition_expression(format!("{shard_name} = {shard_value} AND {sort_name} < {bound}"))
                .set_expression_attribute_names(e.names())
                .set_expression_attribute_values(e.values())
                .limit(per_shard - found)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|err| StoreError::new("Query", table, err))?;
            found += out.items().len() as i32;
            found_items.extend(out.items.unwrap_or_default());
            start = out.last_evaluated_key;
            if start.is_none() || found >= per_shard {
                break;
            }
        }
    }
    Ok(found_items)
}
