//! Pending credits on hot receivers (issue 48, item 3), after O'Neil's escrow method. A credit (an `add`
//! with a positive delta and no guard) commutes with every other credit, so many transactions may have one
//! prepared on the same item at once: instead of the item's exclusive lock, its prepare writes an entry of
//! its own beside it (`credit#<transaction>`: token, field, delta, expiry, start) and counts it in
//! `pendingCredits`. The commit applies the entry's own field and delta and removes it, on condition that
//! the entry carries the voted token; an abort removes it.
//!
//! Only a *recorded* prepare (its record written first, open in the open-transactions index) that is not
//! held takes an entry: the sweeper finds an entry through its owner's record, as it finds an unindexed lock
//! (issue 48, item 2), and a held credit would sit in the bounded map for the whole hold. Every other credit
//! takes the exclusive lock as before.
//!
//! What the design keeps:
//! - `lastTx` no longer proves a credit applied (other credits' commits overwrite it): the entry's absence
//!   does. Only the commit of its token, or a resolver that read its owner's COMMITTING record with that
//!   token, removes an entry of a transaction decided to commit, so a commit that finds none was applied.
//! - A guard never counts pending value: a debit guarded by `min` takes the exclusive lock on the committed
//!   value only (credits can only raise it), and its commit adds its delta, which commutes with theirs.
//! - Put, set, delete, check, custom operations, an `add` with a `max`, and every operation of a participant
//!   with rules take the lock only once no credit is pending (`pendingCredits = 0`): each reads or replaces
//!   what a pending credit would move. One that waits leaves a marker (`drain`) that holds back new credits
//!   while it waits, so a stream of credits cannot starve it.
//! - An entry past its owner's deadline is resolved like a lock, from its owner's record: applied only with
//!   the voted token, removed otherwise.
//! - The entries are capped ([`MAX_PENDING_CREDITS`]); a prepare checks that the committed value and every
//!   pending credit to the field still make a number DynamoDB stores. An entry's write is refused like a
//!   lock's when the item would pass 400 KB (DynamoDB's own check), and a commit never makes the item
//!   larger than its entry did.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use bigdecimal::BigDecimal;

use super::operations::guard;
use crate::expr::{Expr, n, s};
use crate::model::Operation;
use crate::store::{Item, get_m, get_n, get_s};
use crate::tables::item_attr as a;

/// At most this many credits pending on one item: each makes every write of the item bigger.
pub const MAX_PENDING_CREDITS: u64 = 32;

/// A vote token that names pending credits: the commit and a resolver apply an entry, not a lock, for
/// every credit of the vote.
const TOKEN_PREFIX: &str = "credit-";

/// A credit as the access policy defines it: an `add` with a positive delta and no guard.
pub fn is_credit(op: &Operation) -> bool {
    matches!(op, Operation::Add { delta, min: None, max: None, .. } if delta.value() > &BigDecimal::from(0))
}

/// Whether `op`'s exclusive lock waits for the pending credits to drain: every operation but an `add`
/// without a `max` (whose guard, on committed value, credits cannot break), and every operation that a
/// service's rules judge (they read the item's `version`, which each credit's commit moves).
pub(super) fn drains(op: &Operation, rules: bool) -> bool {
    rules || !matches!(op, Operation::Add { max: None, .. })
}

/// A new vote token: one that names pending credits when the prepare takes any.
pub(super) fn new_token(credits: bool) -> String {
    let token = uuid::Uuid::new_v4().simple().to_string();
    if credits { format!("{TOKEN_PREFIX}{token}") } else { token }
}

/// Whether the vote `token` holds `op`'s item as a pending credit (not as a lock).
pub(super) fn is_entry(op: &Operation, token: Option<&str>) -> bool {
    token.is_some_and(|t| t.starts_with(TOKEN_PREFIX)) && is_credit(op)
}

/// The attribute of `tx`'s entry.
pub(super) fn entry_name(tx: &str) -> String {
    format!("{}{tx}", a::CREDIT_PREFIX)
}

/// One pending credit, as its entry keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credit {
    pub transaction_id: String,
    pub token: String,
    pub field: String,
    /// Its canonical text, as the entry keeps it.
    pub delta: String,
    pub expires_at: u64,
    pub started_at: u64,
}

impl Credit {
    /// Every entry on the item.
    pub fn all(item: &Item) -> Vec<Credit> {
        item.iter()
            .filter_map(|(name, value)| {
                let tx = name.strip_prefix(a::CREDIT_PREFIX)?;
                let entry = value.as_m().ok()?;
                let expires_at = get_n(entry, "expiresAt").and_then(|t| t.parse().ok()).unwrap_or(0);
                Some(Credit {
                    transaction_id: tx.to_owned(),
                    token: get_s(entry, "token")?.to_owned(),
                    field: get_s(entry, "field")?.to_owned(),
                    delta: get_n(entry, "delta")?.to_owned(),
                    expires_at,
                    started_at: get_n(entry, "startedAt").and_then(|t| t.parse().ok()).unwrap_or(expires_at),
                })
            })
            .collect()
    }

    /// `tx`'s entry on the item.
    pub fn of(item: &Item, tx: &str) -> Option<Credit> {
        Credit::all(item).into_iter().find(|c| c.transaction_id == tx)
    }
}

/// How many credits are pending on the item.
pub fn pending(item: &Item) -> u64 {
    get_n(item, a::PENDING_CREDITS).and_then(|t| t.parse().ok()).unwrap_or(0)
}

/// The marker of an exclusive lock waiting for the credits to drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drain {
    pub transaction_id: String,
    pub started_at: u64,
    pub until: u64,
}

impl Drain {
    pub fn of(item: &Item) -> Option<Drain> {
        let marker = get_m(item, a::DRAIN)?;
        Some(Drain {
            transaction_id: get_s(marker, "transactionId")?.to_owned(),
            started_at: get_n(marker, "startedAt").and_then(|t| t.parse().ok()).unwrap_or(0),
            until: get_n(marker, "until").and_then(|t| t.parse().ok()).unwrap_or(0),
        })
    }

    /// Whether it still holds back another transaction's credits at `now_ms`.
    pub fn holds_back(&self, tx: &str, now_ms: u64) -> bool {
        self.transaction_id != tx && now_ms <= self.until
    }
}

/// What a credit's prepare writes: who, with which token, until when, and the clock that judges a marker.
#[derive(Debug, Clone, Copy)]
pub(super) struct EntrySpec<'a> {
    pub tx: &'a str,
    pub token: &'a str,
    pub expires_at: u64,
    pub started_at: u64,
    pub now: u64,
}

/// The prepare of a credit: its entry, if no lock is there, no other transaction's marker holds credits
/// back, the map has room, the transaction has no entry yet and has not committed the item, and the item
/// has the field as a number. Returns the update, the condition and their placeholders.
pub(super) fn entry_expressions(spec: EntrySpec<'_>, op: &Operation, e: &mut Expr) -> (String, String) {
    let Operation::Add { field, delta, .. } = op else { unreachable!("only a credit takes an entry") };
    let entry = e.name(&entry_name(spec.tx));
    let count = e.name(a::PENDING_CREDITS);
    let lock = e.name(a::LOCK);
    let last_tx = e.name(a::LAST_TX);
    let marker_tx = e.path(&[a::DRAIN, "transactionId"]);
    let marker_until = e.path(&[a::DRAIN, "until"]);
    let marker = e.name(a::DRAIN);
    let value = e.value(AttributeValue::M(HashMap::from([
        ("token".to_owned(), s(spec.token)),
        ("field".to_owned(), s(field.as_str())),
        ("delta".to_owned(), n(delta)),
        ("expiresAt".to_owned(), n(spec.expires_at)),
        ("startedAt".to_owned(), n(spec.started_at)),
    ])));
    let one = e.value(n(1));
    let tx_value = e.value(s(spec.tx));
    let cap = e.value(n(MAX_PENDING_CREDITS));
    let now = e.value(n(spec.now));
    let update = format!("SET {entry} = {value} ADD {count} {one}");
    let mut condition = format!(
        "attribute_not_exists({lock}) AND attribute_not_exists({entry}) \
         AND (attribute_not_exists({last_tx}) OR {last_tx} <> {tx_value}) \
         AND (attribute_not_exists({count}) OR {count} < {cap}) \
         AND (attribute_not_exists({marker}) OR {marker_tx} = {tx_value} OR {marker_until} < {now})"
    );
    condition += &guard(e, op);
    (update, condition)
}

/// ` AND` no credit pending: an exclusive lock that [`drains`].
pub(super) fn drained_condition(e: &mut Expr) -> String {
    let count = e.name(a::PENDING_CREDITS);
    let zero = e.value(n(0));
    format!(" AND (attribute_not_exists({count}) OR {count} = {zero})")
}

/// The commit of `tx`'s entry with the voted `token`, applying `field` and `delta` (the message's, or the
/// entry's own after a refusal): conditioned on the entry keeping exactly those.
pub(super) fn entry_commit_expressions(tx: &str, token: &str, field: &str, delta: &str) -> (String, String, Expr) {
    let mut e = Expr::new();
    let entry = e.name(&entry_name(tx));
    let count = e.name(a::PENDING_CREDITS);
    let entry_token = e.path(&[&entry_name(tx), "token"]);
    let entry_field = e.path(&[&entry_name(tx), "field"]);
    let entry_delta = e.path(&[&entry_name(tx), "delta"]);
    let version = e.name(a::VERSION);
    let last_tx = e.name(a::LAST_TX);
    let path = e.path(&[a::DATA, field]);
    let token_value = e.value(s(token));
    let field_value = e.value(s(field));
    let delta_value = e.value(AttributeValue::N(delta.to_owned()));
    let zero = e.value(n(0));
    let one = e.value(n(1));
    let minus_one = e.value(n(-1));
    let tx_value = e.value(s(tx));
    let update = format!(
        "SET {path} = {path} + {delta_value}, {version} = if_not_exists({version}, {zero}) + {one}, \
         {last_tx} = {tx_value} REMOVE {entry} ADD {count} {minus_one}"
    );
    let condition =
        format!("{entry_token} = {token_value} AND {entry_field} = {field_value} AND {entry_delta} = {delta_value}");
    (update, condition, e)
}

/// The removal of `tx`'s entry (with `token`, when given), unapplied: an abort, or a stray entry.
pub(super) fn entry_drop_expressions(tx: &str, token: Option<&str>) -> (String, String, Expr) {
    let mut e = Expr::new();
    let entry = e.name(&entry_name(tx));
    let count = e.name(a::PENDING_CREDITS);
    let minus_one = e.value(n(-1));
    let update = format!("REMOVE {entry} ADD {count} {minus_one}");
    let condition = match token {
        Some(token) => {
            let entry_token = e.path(&[&entry_name(tx), "token"]);
            format!("{entry_token} = {}", e.value(s(token)))
        }
        None => format!("attribute_exists({entry})"),
    };
    (update, condition, e)
}

/// The marker of `tx`, waiting for the credits to drain until `until`: written unless a lock is there or
/// another transaction's marker still holds.
pub(super) fn drain_expressions(tx: &str, started_at: u64, until: u64, now: u64) -> (String, String, Expr) {
    let mut e = Expr::new();
    let marker = e.name(a::DRAIN);
    let lock = e.name(a::LOCK);
    let marker_tx = e.path(&[a::DRAIN, "transactionId"]);
    let marker_until = e.path(&[a::DRAIN, "until"]);
    let tx_value = e.value(s(tx));
    let value = e.value(AttributeValue::M(HashMap::from([
        ("transactionId".to_owned(), s(tx)),
        ("startedAt".to_owned(), n(started_at)),
        ("until".to_owned(), n(until)),
    ])));
    let now = e.value(n(now));
    let update = format!("SET {marker} = {value}");
    let condition = format!(
        "attribute_not_exists({lock}) AND (attribute_not_exists({marker}) OR {marker_tx} = {tx_value} OR {marker_until} < {now})"
    );
    (update, condition, e)
}

/// The committed value of `field` on the item and every credit pending on it.
pub(super) fn pending_on(item: &Item, field: &str) -> Option<(BigDecimal, Vec<BigDecimal>)> {
    let current = get_m(item, a::DATA)?.get(field)?.as_n().ok()?.parse::<BigDecimal>().ok()?;
    let pending = Credit::all(item)
        .iter()
        .filter(|c| c.field == field)
        .filter_map(|c| c.delta.parse::<BigDecimal>().ok())
        .collect();
    Some((current, pending))
}

/// Why the field could fail to hold some value it may take, committed value `current`, credits `pending`
/// (each may commit or abort, in any order) and a lock's `own` delta: a bound every partial sum keeps (the
/// integer digits of the largest magnitude plus the most decimals among them) within the 38 significant
/// digits DynamoDB keeps, or why not.
pub(super) fn unrepresentable_in_any_order(
    current: &BigDecimal,
    pending: &[BigDecimal],
    own: &BigDecimal,
) -> Option<String> {
    let all: BigDecimal = pending.iter().sum();
    let ends = [current.clone(), current + own, current + &all, current + &all + own];
    let largest = ends.iter().map(BigDecimal::abs).max()?;
    let decimals = std::iter::once(current)
        .chain(pending)
        .chain(std::iter::once(own))
        .map(|v| v.normalized().as_bigint_and_exponent().1.max(0))
        .max()
        .unwrap_or(0) as u64;
    let integer_digits = largest.with_scale(0).abs().to_string().len() as u64;
    (integer_digits + decimals > 38).then(|| {
        format!(
            "its value with the credits pending on it may need {} significant digits (up to {} with {} decimals), \
             more than the 38 DynamoDB keeps",
            integer_digits + decimals,
            largest.with_scale(0),
            decimals
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decimal::Decimal;
    use crate::model::Key;

    fn add(delta: &str, min: Option<&str>, max: Option<&str>) -> Operation {
        let d = |t: &str| Decimal::from_big(t.parse().unwrap()).unwrap();
        Operation::Add {
            key: Key::from_iter([("entityId".to_owned(), serde_json::json!("merchant"))]),
            field: "balance".to_owned(),
            delta: d(delta),
            min: min.map(d),
            max: max.map(d),
        }
    }

    #[test]
    fn only_a_positive_add_without_a_guard_is_a_credit() {
        assert!(is_credit(&add("5", None, None)));
        assert!(!is_credit(&add("-5", None, None)));
        assert!(!is_credit(&add("0", None, None)));
        assert!(!is_credit(&add("5", Some("0"), None)));
        assert!(!is_credit(&add("5", None, Some("100"))));
    }

    #[test]
    fn a_debit_guarded_by_min_does_not_wait_for_credits_but_a_max_or_a_rule_does() {
        assert!(!drains(&add("-5", Some("0"), None), false));
        assert!(drains(&add("-5", Some("0"), None), true));
        assert!(drains(&add("5", None, Some("100")), false));
    }

    #[test]
    fn only_a_credit_under_a_credit_token_is_an_entry() {
        let token = new_token(true);
        assert!(is_entry(&add("5", None, None), Some(&token)));
        assert!(!is_entry(&add("-5", Some("0"), None), Some(&token)));
        assert!(!is_entry(&add("5", None, None), Some(&new_token(false))));
        assert!(!is_entry(&add("5", None, None), None));
    }

    #[test]
    fn every_entry_is_read_with_what_it_keeps() {
        let entry = |token: &str, delta: &str| {
            AttributeValue::M(HashMap::from([
                ("token".to_owned(), s(token)),
                ("field".to_owned(), s("balance")),
                ("delta".to_owned(), n(delta)),
                ("expiresAt".to_owned(), n(100)),
                ("startedAt".to_owned(), n(90)),
            ]))
        };
        let mut data = HashMap::new();
        data.insert("balance".to_owned(), n(10));
        let item: Item = HashMap::from([
            ("entityId".to_owned(), s("merchant")),
            ("data".to_owned(), AttributeValue::M(data)),
            (entry_name("tx-a"), entry("credit-a", "2")),
            (entry_name("tx-b"), entry("credit-b", "3")),
            (a::PENDING_CREDITS.to_owned(), n(2)),
        ]);
        assert_eq!(Credit::all(&item).len(), 2);
        assert_eq!(Credit::of(&item, "tx-b").map(|c| c.token), Some("credit-b".to_owned()));
        assert_eq!(pending(&item), 2);
        let (current, pending) = pending_on(&item, "balance").unwrap();
        assert_eq!((current, pending.iter().sum::<BigDecimal>()), (BigDecimal::from(10), BigDecimal::from(5)));
    }

    #[test]
    fn a_value_is_checked_in_every_order_its_credits_may_commit_in() {
        let n = |t: &str| t.parse::<BigDecimal>().unwrap();
        let zero = BigDecimal::from(0);
        // 37 nines and .5, with +0.5 and +1 pending: committing +1 first makes 1E37 + 0.5, 39 digits.
        let current = n(&format!("{}.5", "9".repeat(37)));
        assert!(unrepresentable_in_any_order(&current, &[n("0.5"), n("1")], &zero).is_some());
        assert!(unrepresentable_in_any_order(&n("32"), &[n(&format!("{}67", "9".repeat(36)))], &zero).is_none());
        assert!(unrepresentable_in_any_order(&n("32"), &[n(&format!("{}67", "9".repeat(36)))], &n("2")).is_some());
        assert!(unrepresentable_in_any_order(&n("100"), &[n("1"), n("2.25")], &n("-50")).is_none());
    }
}
