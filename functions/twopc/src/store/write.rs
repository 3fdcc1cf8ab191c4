//! The one conditional write. Every write that carries a condition, on any table (transaction records,
//! data items and their locks, barrier entries, connections and their topics), is sent by [`conditional`],
//! which answers what its callers tell apart: applied; refused by a condition, with the item as it was
//! (`ALL_OLD`); contention with another transactional write; an item DynamoDB cannot store. Anything else
//! is a [`StoreError`] that knows whether the write may have taken effect (every attempt is watched).

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, Put, ReturnValue, ReturnValuesOnConditionCheckFailure as OnFailure,
    TransactWriteItem, Update,
};

use super::{AttemptWatch, Item, StoreError};
use crate::expr::Expr;

/// One write of one item on a condition, as `TransactWriteItems` lists them.
#[derive(Debug, Clone)]
pub struct Write {
    table: String,
    action: Action,
    condition: String,
    names: Option<HashMap<String, String>>,
    values: Option<HashMap<String, AttributeValue>>,
}

#[derive(Debug, Clone)]
enum Action {
    Put(Item),
    Update { key: Item, expression: String },
    Delete(Item),
    Check(Item),
}

impl Write {
    /// Writes `item` whole. `e` holds the condition's names and values.
    pub fn put(table: &str, item: Item, condition: impl Into<String>, e: Expr) -> Write {
        Write::new(table, Action::Put(item), condition.into(), e)
    }

    /// Changes the item at `key` by `expression`. `e` holds both expressions' names and values.
    pub fn update(
        table: &str,
        key: Item,
        expression: impl Into<String>,
        condition: impl Into<String>,
        e: Expr,
    ) -> Write {
        Write::new(table, Action::Update { key, expression: expression.into() }, condition.into(), e)
    }

    pub fn delete(table: &str, key: Item, condition: impl Into<String>, e: Expr) -> Write {
        Write::new(table, Action::Delete(key), condition.into(), e)
    }

    /// Writes nothing: a condition the other writes of a transaction are applied under.
    pub fn check(table: &str, key: Item, condition: impl Into<String>, e: Expr) -> Write {
        Write::new(table, Action::Check(key), condition.into(), e)
    }

    fn new(table: &str, action: Action, condition: String, e: Expr) -> Write {
        let names = (!e.names.is_empty()).then_some(e.names);
        let values = (!e.values.is_empty()).then_some(e.values);
        Write { table: table.to_owned(), action, condition, names, values }
    }

    fn into_transact(self) -> TransactWriteItem {
        let Write { table, action, condition, names, values } = self;
        // Every kind of write takes the same table, condition and placeholders.
        macro_rules! built {
            ($builder:expr) => {
                $builder
                    .table_name(table)
                    .condition_expression(condition)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .return_values_on_condition_check_failure(OnFailure::AllOld)
                    .build()
                    .expect("table, key or item, and expressions are set")
            };
        }
        let item = TransactWriteItem::builder();
        match action {
            Action::Put(put) => item.put(built!(Put::builder().set_item(Some(put)))),
            Action::Update { key, expression } => {
                item.update(built!(Update::builder().set_key(Some(key)).update_expression(expression)))
            }
            Action::Delete(key) => item.delete(built!(Delete::builder().set_key(Some(key)))),
            Action::Check(key) => item.condition_check(built!(ConditionCheck::builder().set_key(Some(key)))),
        }
        .build()
    }
}

/// How a write is sent. By default as the SDK sends any request (its retries on), returning nothing
/// when applied.
#[derive(Debug, Clone, Default)]
pub struct Sending {
    returning_new: bool,
    once: bool,
    timeout: Option<Duration>,
    request_token: Option<String>,
}

impl Sending {
    /// The item as written comes back (`ALL_NEW`; one update sent alone).
    pub fn returning_new(mut self) -> Sending {
        self.returning_new = true;
        self
    }

    /// Sent once, with the SDK's retries off: a lock write sent again after a lost reply could lock an
    /// item again after it was committed and changed. With a `timeout`, no answer by then is a failure
    /// (the write may still have taken effect).
    pub fn once(mut self, timeout: Option<Duration>) -> Sending {
        self.once = true;
        self.timeout = timeout;
        self
    }

    /// Several writes carry a `ClientRequestToken`: DynamoDB answers the SDK's retry after a lost reply as
    /// it answered the first attempt, without applying it again.
    pub fn idempotent(mut self) -> Sending {
        self.request_token = Some(uuid::Uuid::new_v4().to_string());
        self
    }

    fn config(&self) -> Option<aws_sdk_dynamodb::config::Builder> {
        use aws_sdk_dynamodb::config::{retry::RetryConfig, timeout::TimeoutConfig};
        if !self.once {
            return None;
        }
        let config = aws_sdk_dynamodb::config::Builder::default().retry_config(RetryConfig::disabled());
        Some(match self.timeout {
            Some(timeout) => config.timeout_config(TimeoutConfig::builder().operation_timeout(timeout).build()),
            None => config,
        })
    }
}

/// What a conditional write did.
#[derive(Debug)]
pub enum Written {
    /// Applied, with the item as written when asked for ([`Sending::returning_new`]).
    Applied(Option<Item>),
    /// Refused by conditions (several writes: none applied): every refused write by its place in the list.
    Refused(Vec<Refused>),
    /// Another transactional write on one of the items: not applied, worth sending again.
    Contention(StoreError),
    /// DynamoDB cannot store what the write would make (over 400 KB, nested too deep, a number of more
    /// than 38 digits): not applied, and sent again it is refused again. `reason`: DynamoDB's words.
    Unstorable { reason: String, error: StoreError },
}

/// A write refused by its condition, with the item as it was (None: there is none, or the endpoint did
/// not return it).
#[derive(Debug)]
pub struct Refused {
    pub index: usize,
    pub item: Option<Item>,
}

/// What a conditional write did, for a caller to whom contention and an unstorable item are failures like
/// any other.
#[derive(Debug)]
pub enum Decided {
    Applied(Option<Item>),
    Refused(Vec<Refused>),
}

impl Written {
    pub fn decided(self) -> Result<Decided, StoreError> {
        match self {
            Written::Applied(item) => Ok(Decided::Applied(item)),
            Written::Refused(refused) => Ok(Decided::Refused(refused)),
            Written::Contention(error) | Written::Unstorable { error, .. } => Err(error),
        }
    }
}

impl Decided {
    /// Whether the write was applied.
    pub fn applied(&self) -> bool {
        matches!(self, Decided::Applied(_))
    }

    /// The item as the first refused write found it; None when applied, or when there is no item.
    pub fn refused_item(self) -> Option<Item> {
        match self {
            Decided::Applied(_) => None,
            Decided::Refused(refused) => refused.into_iter().next().and_then(|r| r.item),
        }
    }
}

/// Sends `writes`: one alone as its own request (`PutItem`, `UpdateItem`, `DeleteItem`), several as one
/// `TransactWriteItems`, all applied or none.
pub async fn conditional(client: &Client, mut writes: Vec<Write>, sending: Sending) -> Result<Written, StoreError> {
    let watch = AttemptWatch::default();
    if let [write] = writes.as_slice()
        && !matches!(write.action, Action::Check(_))
    {
        let write = writes.pop().expect("one write");
        return one(client, write, &sending, &watch).await;
    }
    let table = writes.first().map(|w| w.table.clone()).unwrap_or_default();
    let items = writes.into_iter().map(Write::into_transact).collect();
    let mut request = client.transact_write_items().set_transact_items(Some(items));
    if let Some(token) = &sending.request_token {
        request = request.client_request_token(token);
    }
    let mut request = request.customize().interceptor(watch.clone());
    if let Some(config) = sending.config() {
        request = request.config_override(config);
    }
    let err = match request.send().await {
        Ok(_) => return Ok(Written::Applied(None)),
        Err(err) => err,
    };
    const OPERATION: &str = "TransactWriteItems";
    let Some(service) = err.as_service_error() else { return Err(watch.error(OPERATION, &table, err)) };
    if let TransactWriteItemsError::TransactionCanceledException(cancelled) = service {
        let reasons = cancelled.cancellation_reasons();
        let refused: Vec<Refused> = reasons
            .iter()
            .enumerate()
            .filter(|(_, r)| r.code() == Some("ConditionalCheckFailed"))
            .map(|(index, r)| Refused { index, item: r.item().filter(|i| !i.is_empty()).cloned() })
            .collect();
        if !refused.is_empty() {
            return Ok(Written::Refused(refused));
        }
        if let Some(invalid) = reasons.iter().find(|r| r.code() == Some("ValidationError")) {
            let reason = invalid.message().unwrap_or("invalid value").to_owned();
            let mut error = watch.error(OPERATION, &table, err);
            error.invalid = true;
            return Ok(Written::Unstorable { reason, error });
        }
        if reasons.iter().any(|r| r.code() == Some("TransactionConflict")) {
            return Ok(Written::Contention(watch.error(OPERATION, &table, err)));
        }
        return Err(watch.error(OPERATION, &table, err));
    }
    classified(err, OPERATION, &table, &watch, |_| None)
}

/// One write sent alone.
async fn one(client: &Client, write: Write, sending: &Sending, watch: &AttemptWatch) -> Result<Written, StoreError> {
    let Write { table, action, condition, names, values } = write;
    let config = sending.config();
    macro_rules! send {
        ($request:expr) => {{
            let mut request = $request
                .table_name(&table)
                .condition_expression(condition)
                .set_expression_attribute_names(names)
                .set_expression_attribute_values(values)
                .return_values_on_condition_check_failure(OnFailure::AllOld)
                .customize()
                .interceptor(watch.clone());
            if let Some(config) = config {
                request = request.config_override(config);
            }
            request.send().await
        }};
    }
    match action {
        Action::Put(item) => match send!(client.put_item().set_item(Some(item))) {
            Ok(_) => Ok(Written::Applied(None)),
            Err(err) => classified(err, "PutItem", &table, watch, |e| match e {
                aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c) => {
                    Some(c.item().cloned())
                }
                _ => None,
            }),
        },
        Action::Update { key, expression } => {
            let returned = if sending.returning_new { ReturnValue::AllNew } else { ReturnValue::None };
            let request = client.update_item().set_key(Some(key)).update_expression(expression).return_values(returned);
            match send!(request) {
                Ok(out) => Ok(Written::Applied(out.attributes.filter(|_| sending.returning_new))),
                Err(err) => classified(err, "UpdateItem", &table, watch, |e| match e {
                    aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) => {
                        Some(c.item().cloned())
                    }
                    _ => None,
                }),
            }
        }
        Action::Delete(key) => match send!(client.delete_item().set_key(Some(key))) {
            Ok(_) => Ok(Written::Applied(None)),
            Err(err) => classified(err, "DeleteItem", &table, watch, |e| match e {
                aws_sdk_dynamodb::operation::delete_item::DeleteItemError::ConditionalCheckFailedException(c) => {
                    Some(c.item().cloned())
                }
                _ => None,
            }),
        },
        Action::Check(_) => unreachable!("a check alone is sent as a transaction"),
    }
}

/// A failed write's answer: `refused_item` is the item a refusal by the condition returned (Some(None):
/// refused, no item returned).
fn classified<E>(
    err: SdkError<E, aws_smithy_runtime_api::http::Response>,
    operation: &'static str,
    table: &str,
    watch: &AttemptWatch,
    refused_item: impl Fn(&E) -> Option<Option<Item>>,
) -> Result<Written, StoreError>
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
{
    let Some(service) = err.as_service_error() else { return Err(watch.error(operation, table, err)) };
    if let Some(item) = refused_item(service) {
        // An update of a missing key is refused with an empty item: there is none.
        return Ok(Written::Refused(vec![Refused { index: 0, item: item.filter(|i| !i.is_empty()) }]));
    }
    match service.code() {
        Some("ValidationException") => {
            let reason = service.message().unwrap_or("invalid value").to_owned();
            Ok(Written::Unstorable { reason, error: watch.error(operation, table, err) })
        }
        Some("TransactionConflictException" | "TransactionInProgressException") => {
            Ok(Written::Contention(watch.error(operation, table, err)))
        }
        _ => Err(watch.error(operation, table, err)),
    }
}
