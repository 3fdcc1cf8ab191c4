//! Counts the DynamoDB requests the process sends, at the client: an SDK interceptor registered on
//! the one DynamoDB client that the coordinator, the in-process participants and the baseline share.
//!
//! Every attempt is counted (a retry is a second request, and is billed as one), keyed by the
//! operation name (`Metadata` in the config bag) and the table(s) the request names. The time of
//! each attempt (transmit to response) is summed under the same key.
//!
//! It also asks for `ReturnConsumedCapacity = INDEXES` on every request and adds up the capacity units
//! each answer reports, under the same key; a write whose condition failed, for which no capacity is
//! reported, is priced from the item the error returns (see [`crate::capacity`]). Setting that field
//! changes nothing else in the request, and the callers ignore the answer's extra field.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::operation;
use aws_sdk_dynamodb::types::{ReturnConsumedCapacity, ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeSerializationInterceptorContextMut, BeforeSerializationInterceptorContextRef,
    BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef, Input, Output,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};

use crate::capacity::{self, Capacity, Units};

/// (operation, table) → requests sent.
pub type Counts = BTreeMap<(String, String), u64>;

/// (operation, table) → total time of the attempts.
pub type Times = BTreeMap<(String, String), Duration>;

#[derive(Debug, Clone, Default)]
pub struct RequestCounter {
    attempts: Arc<Mutex<Counts>>,
    times: Arc<Mutex<Times>>,
    capacity: Arc<Mutex<Capacity>>,
    executions: Arc<AtomicU64>,
}

/// When the current attempt started.
#[derive(Debug, Clone)]
struct AttemptStart(Instant);

impl Storable for AttemptStart {
    type Storer = StoreReplace<Self>;
}

/// The table(s) of the request being executed, noted before serialization (the input is gone by the
/// time an attempt is transmitted).
#[derive(Debug, Clone)]
struct Target(String);

impl Storable for Target {
    type Storer = StoreReplace<Self>;
}

/// What the capacity accounting needs to know of the request once its input is gone.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// A failed condition returns the item (`ALL_OLD`).
    returns_old_on_failure: bool,
    /// The answer of a successful `UpdateItem` holds the item after the write (`ALL_NEW`).
    returns_new: bool,
    /// The size of the item a `PutItem` writes.
    put_bytes: Option<u64>,
}

impl Storable for Shape {
    type Storer = StoreReplace<Self>;
}

impl RequestCounter {
    /// Capacity units consumed so far, by (operation, table).
    pub fn capacity(&self) -> Capacity {
        self.capacity.lock().expect("counter lock").clone()
    }

    /// Requests sent so far, by (operation, table).
    pub fn snapshot(&self) -> Counts {
        self.attempts.lock().expect("counter lock").clone()
    }

    /// Time spent in requests so far, by (operation, table).
    pub fn times(&self) -> Times {
        self.times.lock().expect("counter lock").clone()
    }

    /// Operations executed so far (one execution may send several attempts when the SDK retries).
    pub fn executions(&self) -> u64 {
        self.executions.load(Ordering::Relaxed)
    }

    pub fn total(counts: &Counts) -> u64 {
        counts.values().sum()
    }

    /// `after - before`, dropping keys that did not change.
    pub fn diff(before: &Counts, after: &Counts) -> Counts {
        after
            .iter()
            .filter_map(|(key, &n)| {
                let delta = n - before.get(key).copied().unwrap_or(0);
                (delta > 0).then(|| (key.clone(), delta))
            })
            .collect()
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "RequestCounter"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.executions.fetch_add(1, Ordering::Relaxed);
        cfg.interceptor_state().store_put(Target(tables_of(context.input())));
        Ok(())
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let shape = ask_for_capacity(context.input_mut());
        cfg.interceptor_state().store_put(shape);
        Ok(())
    }

    fn read_before_attempt(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let operation = cfg.load::<Metadata>().map_or_else(|| "Unknown".to_owned(), |m| m.name().to_owned());
        let table = cfg.load::<Target>().map_or_else(String::new, |t| t.0.clone());
        *self.attempts.lock().expect("counter lock").entry((operation, table)).or_default() += 1;
        cfg.interceptor_state().store_put(AttemptStart(Instant::now()));
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(started) = cfg.load::<AttemptStart>().map(|s| s.0) else { return Ok(()) };
        let operation = cfg.load::<Metadata>().map_or_else(|| "Unknown".to_owned(), |m| m.name().to_owned());
        let table = cfg.load::<Target>().map_or_else(String::new, |t| t.0.clone());
        let key = (operation.clone(), table);
        *self.times.lock().expect("counter lock").entry(key.clone()).or_default() += started.elapsed();
        let shape = cfg.load::<Shape>().copied();
        let units = match context.output_or_error() {
            Some(Ok(output)) => output_units(&operation, output, shape),
            Some(Err(error)) => error
                .as_operation_error()
                .and_then(|e| failure_units(e, shape))
                .unwrap_or(Units { unpriced_errors: 1, ..Units::default() }),
            None => Units::default(),
        };
        *self.capacity.lock().expect("counter lock").entry(key).or_default() += &units;
        Ok(())
    }
}

/// The table a request names; several joined by `+` (transactions, batches).
fn tables_of(input: &Input) -> String {
    macro_rules! single {
        ($($module:ident :: $ty:ident),* $(,)?) => {
            $(if let Some(i) = input.downcast_ref::<operation::$module::$ty>() {
                return i.table_name().unwrap_or_default().to_owned();
            })*
        };
    }
    single!(
        get_item::GetItemInput,
        put_item::PutItemInput,
        update_item::UpdateItemInput,
        delete_item::DeleteItemInput,
        query::QueryInput,
        scan::ScanInput,
        create_table::CreateTableInput,
        describe_table::DescribeTableInput,
    );
    let mut tables: Vec<String> = Vec::new();
    if let Some(i) = input.downcast_ref::<operation::transact_write_items::TransactWriteItemsInput>() {
        for item in i.transact_items() {
            let name = item
                .update()
                .map(|u| u.table_name())
                .or_else(|| item.put().map(|p| p.table_name()))
                .or_else(|| item.delete().map(|d| d.table_name()))
                .or_else(|| item.condition_check().map(|c| c.table_name()));
            if let Some(name) = name {
                tables.push(name.to_owned());
            }
        }
    } else if let Some(i) = input.downcast_ref::<operation::transact_get_items::TransactGetItemsInput>() {
        tables.extend(i.transact_items().iter().filter_map(|t| t.get()).map(|g| g.table_name().to_owned()));
    } else if let Some(i) = input.downcast_ref::<operation::batch_get_item::BatchGetItemInput>() {
        tables.extend(i.request_items().into_iter().flat_map(|m| m.keys().cloned()));
    } else if let Some(i) = input.downcast_ref::<operation::batch_write_item::BatchWriteItemInput>() {
        tables.extend(i.request_items().into_iter().flat_map(|m| m.keys().cloned()));
    }
    tables.sort();
    tables.dedup();
    tables.join("+")
}

/// Sets `ReturnConsumedCapacity = INDEXES` on the request (unless the caller set it) and notes what the
/// capacity accounting needs to know of it.
fn ask_for_capacity(input: &mut Input) -> Shape {
    let mut shape = Shape { returns_old_on_failure: false, returns_new: false, put_bytes: None };
    let indexes = || Some(ReturnConsumedCapacity::Indexes);
    macro_rules! ask {
        ($($module:ident :: $ty:ident),* $(,)?) => {
            $(if let Some(i) = input.downcast_mut::<operation::$module::$ty>() {
                i.return_consumed_capacity = i.return_consumed_capacity.take().or_else(indexes);
                return shape;
            })*
        };
    }
    let all_old = Some(ReturnValuesOnConditionCheckFailure::AllOld);
    if let Some(i) = input.downcast_mut::<operation::put_item::PutItemInput>() {
        i.return_consumed_capacity = i.return_consumed_capacity.take().or_else(indexes);
        shape.returns_old_on_failure = i.return_values_on_condition_check_failure == all_old;
        shape.put_bytes = i.item.as_ref().map(capacity::item_size);
        return shape;
    }
    if let Some(i) = input.downcast_mut::<operation::update_item::UpdateItemInput>() {
        i.return_consumed_capacity = i.return_consumed_capacity.take().or_else(indexes);
        shape.returns_old_on_failure = i.return_values_on_condition_check_failure == all_old;
        shape.returns_new = i.return_values == Some(ReturnValue::AllNew);
        return shape;
    }
    if let Some(i) = input.downcast_mut::<operation::delete_item::DeleteItemInput>() {
        i.return_consumed_capacity = i.return_consumed_capacity.take().or_else(indexes);
        shape.returns_old_on_failure = i.return_values_on_condition_check_failure == all_old;
        return shape;
    }
    ask!(
        get_item::GetItemInput,
        query::QueryInput,
        scan::ScanInput,
        batch_get_item::BatchGetItemInput,
        batch_write_item::BatchWriteItemInput,
        transact_write_items::TransactWriteItemsInput,
        transact_get_items::TransactGetItemsInput,
    );
    shape
}

/// The units a successful answer reports, and the size of the item after a write where the request
/// shows it.
fn output_units(operation: &str, output: &Output, shape: Option<Shape>) -> Units {
    let mut units = Units::default();
    let mut reported = false;
    let mut add = |cc: &aws_sdk_dynamodb::types::ConsumedCapacity| {
        units += &capacity::from_consumed(operation, cc);
        reported = true;
    };
    macro_rules! single {
        ($($module:ident :: $ty:ident),* $(,)?) => {
            $(if let Some(o) = output.downcast_ref::<operation::$module::$ty>() {
                o.consumed_capacity().into_iter().for_each(&mut add);
            })*
        };
    }
    macro_rules! several {
        ($($module:ident :: $ty:ident),* $(,)?) => {
            $(if let Some(o) = output.downcast_ref::<operation::$module::$ty>() {
                o.consumed_capacity().iter().for_each(&mut add);
            })*
        };
    }
    single!(
        get_item::GetItemOutput,
        put_item::PutItemOutput,
        update_item::UpdateItemOutput,
        delete_item::DeleteItemOutput,
        query::QueryOutput,
        scan::ScanOutput,
    );
    several!(
        batch_get_item::BatchGetItemOutput,
        batch_write_item::BatchWriteItemOutput,
        transact_write_items::TransactWriteItemsOutput,
        transact_get_items::TransactGetItemsOutput,
    );
    let tracked = matches!(
        operation,
        "GetItem"
            | "PutItem"
            | "UpdateItem"
            | "DeleteItem"
            | "Query"
            | "Scan"
            | "BatchGetItem"
            | "BatchWriteItem"
            | "TransactWriteItems"
            | "TransactGetItems"
    );
    if tracked && !reported {
        units.unreported += 1;
    }
    let image = match shape {
        Some(Shape { put_bytes: Some(bytes), .. }) => Some(bytes),
        Some(Shape { returns_new: true, .. }) => output
            .downcast_ref::<operation::update_item::UpdateItemOutput>()
            .and_then(|o| o.attributes.as_ref())
            .map(capacity::item_size),
        _ => None,
    };
    if let Some(bytes) = image {
        units.images += 1;
        units.image_bytes += bytes;
    }
    units
}

/// The units of a failed request that DynamoDB bills and does not report: a write whose condition
/// failed (on the item that is there), a cancelled transaction (each item at double, likewise).
fn failure_units(
    error: &aws_smithy_runtime_api::client::interceptors::context::Error,
    shape: Option<Shape>,
) -> Option<Units> {
    use operation::delete_item::DeleteItemError;
    use operation::put_item::PutItemError;
    use operation::transact_write_items::TransactWriteItemsError;
    use operation::update_item::UpdateItemError;
    let asked = shape.is_some_and(|s| s.returns_old_on_failure);
    if let Some(UpdateItemError::ConditionalCheckFailedException(c)) = error.downcast_ref::<UpdateItemError>() {
        return Some(capacity::failed_write(c.item(), asked, 1.0));
    }
    if let Some(PutItemError::ConditionalCheckFailedException(c)) = error.downcast_ref::<PutItemError>() {
        return Some(capacity::failed_write(c.item(), asked, 1.0));
    }
    if let Some(DeleteItemError::ConditionalCheckFailedException(c)) = error.downcast_ref::<DeleteItemError>() {
        return Some(capacity::failed_write(c.item(), asked, 1.0));
    }
    if let Some(TransactWriteItemsError::TransactionCanceledException(c)) =
        error.downcast_ref::<TransactWriteItemsError>()
    {
        let mut units = Units::default();
        for reason in c.cancellation_reasons() {
            let item = reason.item();
            units += &capacity::failed_write(item, item.is_some(), 2.0);
        }
        units.failed_writes = 1;
        return Some(units);
    }
    None
}
