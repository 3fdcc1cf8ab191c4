//! The barrier of a resource participant: one entry per transaction in the service's own table, which
//! records where its try, confirm and cancel stand, so that every message is acted on once whatever
//! arrives twice, late or out of order (as DTM's barrier does). Its writes are conditional on the
//! entry's state, and the entry carries the transaction's lock while a try may still be in flight.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;

use crate::attr;
use crate::expr::{Expr, n, s};
use crate::model::Operation;
use crate::store::write::{Decided, Sending, Write, conditional};
use crate::store::{Item, StoreError, get_m, get_n, get_s, shard_of};
use crate::tables::item_attr as a;

/// Where a transaction's barrier entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Written before the first try request; the try's outcome is not recorded yet.
    Trying,
    /// The resource reserved; `tried` says what.
    Tried,
    /// The resource refused the try: nothing held.
    Refused,
    Confirmed,
    Cancelled,
}

impl State {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            State::Trying => "TRYING",
            State::Tried => "TRIED",
            State::Refused => "REFUSED",
            State::Confirmed => "CONFIRMED",
            State::Cancelled => "CANCELLED",
        }
    }

    pub(super) fn parse(text: &str) -> Option<State> {
        [State::Trying, State::Tried, State::Refused, State::Confirmed, State::Cancelled]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

/// A barrier entry as read.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) state: State,
    /// The token of the prepare that wrote it (the vote reports it; a commit must name it).
    pub(super) token: Option<String>,
    /// The transaction's deadline, as the prepare knew it.
    pub(super) deadline: Option<u64>,
    pub(super) tried: Option<Value>,
    /// The try's operations, as it sent them: a repeat of the try sends the same.
    pub(super) operations: Vec<Operation>,
    pub(super) refusal: Option<(String, String)>,
    /// CANCELLED: whether the cancel call for `tried` went through.
    pub(super) cancelled_call: bool,
    /// CANCELLED: when the cancel is repeated; done once `rechecked`.
    pub(super) recheck_at: Option<u64>,
    pub(super) rechecked: bool,
    /// Whether the item carries a lock (the entry waits for something).
    pub(super) locked: bool,
    /// The entry's TTL (epoch seconds), once it is finished; None on entries written before they expired.
    pub(super) expire_at: Option<u64>,
}

pub(super) const BARRIER: &str = "barrier";

impl Entry {
    pub(super) fn of(item: &Item) -> Option<Entry> {
        let barrier = get_m(item, BARRIER)?;
        let state = State::parse(get_s(barrier, "state")?)?;
        let lock = get_m(item, a::LOCK);
        let number = |name: &str| get_n(barrier, name).and_then(|v| v.parse::<u64>().ok());
        Some(Entry {
            state,
            token: get_s(barrier, "token").map(str::to_owned),
            deadline: number("deadline"),
            tried: barrier.get("tried").map(attr::to_json),
            operations: barrier
                .get("operations")
                .map(attr::to_json)
                .and_then(|list| {
                    Operation::parse_list_for(Some(&list), "operations", &crate::custom::Catalog::any()).ok()
                })
                .unwrap_or_default(),
            refusal: get_s(barrier, "refusalCode")
                .map(|c| (c.to_owned(), get_s(barrier, "reason").unwrap_or("").to_owned())),
            cancelled_call: barrier.get("cancelledCall").is_some(),
            recheck_at: number("recheckAt").or_else(|| {
                lock.and_then(|l| get_n(l, "expiresAt"))
                    .and_then(|v| v.parse().ok())
                    .filter(|_| state == State::Cancelled)
            }),
            rechecked: barrier.get("rechecked").is_some(),
            locked: lock.is_some(),
            expire_at: get_n(item, a::EXPIRE_AT).and_then(|v| v.parse().ok()),
        })
    }

    /// Finished (nothing will lock it again), with no expiry yet: an entry of an older version.
    pub(super) fn lacks_expiry(&self) -> bool {
        let finished = match self.state {
            State::Refused | State::Confirmed => true,
            State::Cancelled => self.rechecked,
            State::Trying | State::Tried => false,
        };
        finished && !self.locked && self.expire_at.is_none()
    }
}

/// The barrier's entries, in the service's own table.
#[derive(Debug, Clone)]
pub(crate) struct Barrier {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

/// What writing the first entry found.
pub(super) enum Begun {
    Written,
    Existing(Box<Entry>),
}

impl Barrier {
    pub(crate) fn new(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Barrier {
        Barrier { client, table: table.into() }
    }

    pub(super) fn key(tx: &str) -> Item {
        HashMap::from([(a::KEY.to_owned(), s(format!("barrier#{tx}")))])
    }

    pub(super) async fn get(&self, tx: &str) -> Result<Option<Entry>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(tx)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::new("GetItem", &self.table, e))?;
        Ok(out.item.as_ref().and_then(Entry::of))
    }

    /// The lock an entry carries while the sweeper must come back to it: owned by `tx`, due at `due`.
    pub(super) fn lock(tx: &str, token: &str, due: u64, started_at: u64) -> Vec<(&'static str, AttributeValue)> {
        vec![
            (
                a::LOCK,
                AttributeValue::M(HashMap::from([
                    ("transactionId".to_owned(), s(tx)),
                    ("status".to_owned(), s("PREPARED")),
                    ("expiresAt".to_owned(), n(due)),
                    ("startedAt".to_owned(), n(started_at)),
                    ("token".to_owned(), s(token)),
                ])),
            ),
            (a::LOCK_SHARD, s(shard_of(tx, "lock"))),
            (a::LOCK_EXPIRES_AT, n(due)),
        ]
    }

    /// TRYING, if there is no entry yet: the only way a try can start.
    pub(super) async fn begin(
        &self,
        tx: &str,
        token: &str,
        operations: &[Operation],
        (deadline, started_at, now): (u64, u64, u64),
    ) -> Result<Begun, StoreError> {
        let mut item = Self::key(tx);
        let operations = Value::Array(operations.iter().map(Operation::to_json).collect());
        let barrier = HashMap::from([
            ("state".to_owned(), s(State::Trying.as_str())),
            ("operations".to_owned(), attr::to_attribute(&operations)),
            ("token".to_owned(), s(token)),
            ("deadline".to_owned(), n(deadline)),
            ("trySentAt".to_owned(), n(now)),
        ]);
        item.insert(BARRIER.to_owned(), AttributeValue::M(barrier));
        item.extend(Self::lock(tx, token, deadline, started_at).into_iter().map(|(k, v)| (k.to_owned(), v)));
        self.put_new(item).await
    }

    pub(super) async fn put_new(&self, item: Item) -> Result<Begun, StoreError> {
        let mut e = Expr::new();
        let key = e.name(a::KEY);
        let write = Write::put(&self.table, item, format!("attribute_not_exists({key})"), e);
        match conditional(&self.client, vec![write], Sending::default()).await?.decided()? {
            Decided::Applied(_) => Ok(Begun::Written),
            refused => match refused.refused_item().as_ref().and_then(Entry::of) {
                Some(entry) => Ok(Begun::Existing(Box::new(entry))),
                None => Err(StoreError::internal("PutItem", &self.table, "an entry that is not a barrier entry")),
            },
        }
    }

    /// Moves the entry from one of `from` to its next state with `update` (names in `e`); false if the
    /// entry was not in one of them (or not with `token`, when given).
    pub(super) async fn transition(
        &self,
        tx: &str,
        from: &[State],
        token: Option<&str>,
        mut e: Expr,
        update: String,
    ) -> Result<bool, StoreError> {
        let barrier = e.name(BARRIER);
        let state = e.name("state");
        let states: Vec<String> = from.iter().map(|st| e.value(s(st.as_str()))).collect();
        let mut condition = format!("{barrier}.{state} IN ({})", states.join(", "));
        if let Some(token) = token {
            let token_name = e.name("token");
            let token_value = e.value(s(token));
            condition += &format!(" AND {barrier}.{token_name} = {token_value}");
        }
        self.update_if(tx, e, update, condition).await
    }

    /// One conditional UpdateItem of the entry of `tx` (names and values in `e`): false if the condition failed.
    pub(super) async fn update_if(
        &self,
        tx: &str,
        e: Expr,
        update: String,
        condition: String,
    ) -> Result<bool, StoreError> {
        let write = Write::update(&self.table, Self::key(tx), update, condition, e);
        Ok(conditional(&self.client, vec![write], Sending::default()).await?.decided()?.applied())
    }

    pub(super) fn release(e: &mut Expr) -> String {
        format!("REMOVE {}, {}, {}", e.name(a::LOCK), e.name(a::LOCK_SHARD), e.name(a::LOCK_EXPIRES_AT))
    }

    /// `expireAt = <expire_at>`, for the SET clause of an update that finishes the entry (and releases it).
    pub(super) fn expiry(e: &mut Expr, expire_at: u64) -> String {
        format!("{} = {}", e.name(a::EXPIRE_AT), e.value(n(expire_at)))
    }

    pub(super) async fn tried(&self, tx: &str, token: &str, tried: &Value) -> Result<bool, StoreError> {
        let mut e = Expr::new();
        let (barrier, state, field) = (e.name(BARRIER), e.name("state"), e.name("tried"));
        let (next, value) = (e.value(s(State::Tried.as_str())), e.value(attr::to_attribute(tried)));
        let update = format!("SET {barrier}.{state} = {next}, {barrier}.{field} = {value}");
        self.transition(tx, &[State::Trying], Some(token), e, update).await
    }

    pub(super) async fn refused(
        &self,
        tx: &str,
        token: &str,
        (code, reason): (&str, &str),
        expire_at: u64,
    ) -> Result<bool, StoreError> {
        let mut e = Expr::new();
        let (barrier, state, code_name, reason_name) =
            (e.name(BARRIER), e.name("state"), e.name("refusalCode"), e.name("reason"));
        let (next, code, reason) =
            (e.value(s(State::Refused.as_str())), e.value(s(code)), e.value(s(crate::record::cut(reason, 512))));
        let expiry = Self::expiry(&mut e, expire_at);
        let release = Self::release(&mut e);
        let update = format!(
            "SET {barrier}.{state} = {next}, {barrier}.{code_name} = {code}, {barrier}.{reason_name} = {reason}, {expiry} {release}"
        );
        self.transition(tx, &[State::Trying], Some(token), e, update).await
    }

    pub(super) async fn confirmed(&self, tx: &str, token: &str, expire_at: u64) -> Result<bool, StoreError> {
        let mut e = Expr::new();
        let (barrier, state) = (e.name(BARRIER), e.name("state"));
        let next = e.value(s(State::Confirmed.as_str()));
        let expiry = Self::expiry(&mut e, expire_at);
        let release = Self::release(&mut e);
        let update = format!("SET {barrier}.{state} = {next}, {expiry} {release}");
        self.transition(tx, &[State::Tried], Some(token), e, update).await
    }

    /// CANCELLED from TRYING or TRIED, its lock now due at `recheck_at` (when the cancel is repeated).
    pub(super) async fn cancelled(&self, tx: &str, recheck_at: u64) -> Result<bool, StoreError> {
        let mut e = Expr::new();
        let (barrier, state, recheck, lock, expires, index) = (
            e.name(BARRIER),
            e.name("state"),
            e.name("recheckAt"),
            e.name(a::LOCK),
            e.name("expiresAt"),
            e.name(a::LOCK_EXPIRES_AT),
        );
        let (next, due) = (e.value(s(State::Cancelled.as_str())), e.value(n(recheck_at)));
        let update = format!(
            "SET {barrier}.{state} = {next}, {barrier}.{recheck} = {due}, {lock}.{expires} = {due}, {index} = {due}"
        );
        self.transition(tx, &[State::Trying, State::Tried], None, e, update).await
    }

    /// A cancel before any try: CANCELLED with nothing to repeat, so that a try arriving later does nothing;
    /// finished, so expiring at `expire_at`.
    pub(super) async fn cancel_empty(&self, tx: &str, now: u64, expire_at: u64) -> Result<Begun, StoreError> {
        let mut item = Self::key(tx);
        let barrier = HashMap::from([
            ("state".to_owned(), s(State::Cancelled.as_str())),
            ("rechecked".to_owned(), n(now)),
            ("emptyRollback".to_owned(), AttributeValue::Bool(true)),
        ]);
        item.insert(BARRIER.to_owned(), AttributeValue::M(barrier));
        item.insert(a::EXPIRE_AT.to_owned(), n(expire_at));
        self.put_new(item).await
    }

    /// Sets `field` of a CANCELLED entry to `now`; `finish`: also releases its lock, the entry expiring at
    /// the time given.
    pub(super) async fn mark(&self, tx: &str, field: &str, now: u64, finish: Option<u64>) -> Result<bool, StoreError> {
        let mut e = Expr::new();
        let (barrier, name) = (e.name(BARRIER), e.name(field));
        let value = e.value(n(now));
        let mut update = format!("SET {barrier}.{name} = {value}");
        if let Some(expire_at) = finish {
            update += &format!(", {} {}", Self::expiry(&mut e, expire_at), Self::release(&mut e));
        }
        self.transition(tx, &[State::Cancelled], None, e, update).await
    }

    /// An expiry for a finished entry an older version wrote without one. False if it is not such an entry
    /// any more (it has one, or a lock).
    pub(super) async fn expire(&self, tx: &str, expire_at: u64) -> Result<bool, StoreError> {
        let mut e = Expr::new();
        let (lock, expiry_name) = (e.name(a::LOCK), e.name(a::EXPIRE_AT));
        let expiry = Self::expiry(&mut e, expire_at);
        let (barrier, state, rechecked) = (e.name(BARRIER), e.name("state"), e.name("rechecked"));
        let (refused, confirmed, cancelled) = (
            e.value(s(State::Refused.as_str())),
            e.value(s(State::Confirmed.as_str())),
            e.value(s(State::Cancelled.as_str())),
        );
        let condition = format!(
            "attribute_not_exists({lock}) AND attribute_not_exists({expiry_name}) AND ({barrier}.{state} IN ({refused}, {confirmed}) OR ({barrier}.{state} = {cancelled} AND attribute_exists({barrier}.{rechecked})))"
        );
        self.update_if(tx, e, format!("SET {expiry}"), condition).await
    }
}
