//! Counts the DynamoDB requests the process sends, at the client: an SDK interceptor registered on
//! the one DynamoDB client that the coordinator, the in-process participants and the baseline share.
//!
//! Every attempt is counted (a retry is a second request, and is billed as one), keyed by the
//! operation name (`Metadata` in the config bag) and the table(s) the request names. The time of
//! each attempt (transmit to response) is summed under the same key.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::operation;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeSerializationInterceptorContextRef, BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef,
    Input,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};

/// (operation, table) → requests sent.
pub type Counts = BTreeMap<(String, String), u64>;

/// (operation, table) → total time of the attempts.
pub type Times = BTreeMap<(String, String), Duration>;

#[derive(Debug, Clone, Default)]
pub struct RequestCounter {
    attempts: Arc<Mutex<Counts>>,
    times: Arc<Mutex<Times>>,
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

impl RequestCounter {
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
        _context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(started) = cfg.load::<AttemptStart>().map(|s| s.0) else { return Ok(()) };
        let operation = cfg.load::<Metadata>().map_or_else(|| "Unknown".to_owned(), |m| m.name().to_owned());
        let table = cfg.load::<Target>().map_or_else(String::new, |t| t.0.clone());
        *self.times.lock().expect("counter lock").entry((operation, table)).or_default() += started.elapsed();
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
