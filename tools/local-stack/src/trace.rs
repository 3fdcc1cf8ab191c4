//! A tracing layer that records, per transaction, each participant call (action, service, how long,
//! the answer) and the coordinator's own timings, from the spans and events the core emits. The demo
//! prints a transaction's phases from it; it sees only functions running in this process.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// One participant invocation.
#[derive(Debug, Clone)]
pub struct ParticipantCall {
    pub service: String,
    /// `prepare`, `commit` or `abort`.
    pub action: String,
    pub started: Instant,
    pub duration: Duration,
    /// `PREPARED` / `REFUSED` for a prepare.
    pub vote: Option<String>,
    /// `COMMITTED` / `ABORTED` / ... for a commit or abort.
    pub status: Option<String>,
}

/// What was recorded about one transaction.
#[derive(Debug, Clone, Default)]
pub struct TransactionTrace {
    pub calls: Vec<ParticipantCall>,
    /// The coordinator's prepare phase and whole run, as it logged them.
    pub prepare_ms: Option<u64>,
    pub total_ms: Option<u64>,
    pub status: Option<String>,
}

impl TransactionTrace {
    /// The calls of one action, in start order.
    pub fn phase(&self, action: &str) -> Vec<&ParticipantCall> {
        let mut calls: Vec<&ParticipantCall> = self.calls.iter().filter(|c| c.action == action).collect();
        calls.sort_by_key(|c| c.started);
        calls
    }

    /// From the first call of an action starting to the last one ending.
    pub fn phase_duration(&self, action: &str) -> Option<Duration> {
        let calls = self.phase(action);
        let start = calls.iter().map(|c| c.started).min()?;
        let end = calls.iter().map(|c| c.started + c.duration).max()?;
        Some(end - start)
    }
}

/// Records transactions as the core traces them. Clones share the records.
#[derive(Debug, Clone, Default)]
pub struct TraceRecorder {
    transactions: Arc<Mutex<HashMap<String, TransactionTrace>>>,
}

impl TraceRecorder {
    pub fn get(&self, transaction_id: &str) -> Option<TransactionTrace> {
        self.transactions.lock().expect("not poisoned").get(transaction_id).cloned()
    }
}

#[derive(Default)]
struct Fields(HashMap<&'static str, String>);

/// `Some("COMMITTED")` / `Some(Prepared)` / `None` as the value inside, upper case for enums.
fn plain(debug: &str) -> Option<String> {
    let inner = debug.strip_prefix("Some(").and_then(|s| s.strip_suffix(')')).unwrap_or(debug);
    match inner {
        "None" | "" => None,
        quoted if quoted.starts_with('"') => Some(quoted.trim_matches('"').to_owned()),
        other => Some(other.to_uppercase()),
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name(), value.to_string());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name(), value.to_string());
    }
}

/// Kept in a `participant` span's extensions.
struct Call {
    tx: String,
    service: String,
    action: String,
    started: Instant,
    vote: Option<String>,
    status: Option<String>,
}

/// Kept in a `transaction` span's extensions.
struct Transaction(String);

impl<S> Layer<S> for TraceRecorder
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let mut get = |name: &str| fields.0.remove(name).unwrap_or_default();
        match attrs.metadata().name() {
            "participant" => span.extensions_mut().insert(Call {
                tx: get("tx"),
                service: get("service"),
                action: get("action"),
                started: Instant::now(),
                vote: None,
                status: None,
            }),
            "transaction" => span.extensions_mut().insert(Transaction(get("tx"))),
            _ => {}
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.event_span(event) else { return };
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let Some(call) = span.extensions_mut().get_mut::<Call>()
            && fields.0.get("message").map(String::as_str) == Some("answered")
        {
            call.vote = fields.0.get("vote").and_then(|v| plain(v));
            call.status = fields.0.get("status").and_then(|v| plain(v));
            return;
        }
        if fields.0.contains_key("total_ms") {
            let tx = span.scope().find_map(|s| s.extensions().get::<Transaction>().map(|t| t.0.clone()));
            if let Some(tx) = tx {
                let mut all = self.transactions.lock().expect("not poisoned");
                let trace = all.entry(tx).or_default();
                trace.prepare_ms = fields.0.get("prepare_ms").and_then(|v| v.parse().ok());
                trace.total_ms = fields.0.get("total_ms").and_then(|v| v.parse().ok());
                trace.status = fields.0.get("status").cloned();
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(call) = span.extensions_mut().remove::<Call>() else { return };
        let record = ParticipantCall {
            service: call.service,
            action: call.action,
            started: call.started,
            duration: call.started.elapsed(),
            vote: call.vote,
            status: call.status,
        };
        self.transactions.lock().expect("not poisoned").entry(call.tx).or_default().calls.push(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_values_read_plainly() {
        assert_eq!(plain("Some(Prepared)").as_deref(), Some("PREPARED"));
        assert_eq!(plain("Some(\"COMMITTED\")").as_deref(), Some("COMMITTED"));
        assert_eq!(plain("None"), None);
    }
}
