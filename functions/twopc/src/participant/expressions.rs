//! The expressions of an item's writes: the lock a prepare takes (with the guard of its operation and
//! what the service's rules saw), the commit of a vote, the release of a lock; and whether an operation's
//! writes fit DynamoDB's expression limit, which the coordinator asks before it accepts a request.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::credits;
use super::operations::{Voted, apply, apply_voted, guard, reservation};
use crate::expr::{Expr, n, s};
use crate::model::Operation;
use crate::store::{Item, get_n, shard_of};
use crate::tables::item_attr as a;

/// What a prepare writes besides the lock: who locks, with which token, until when.
#[derive(Debug, Clone, Copy)]
pub struct LockSpec<'a> {
    pub tx: &'a str,
    pub token: &'a str,
    pub expires_at: u64,
    pub started_at: u64,
    /// The lock enters the locks index (`lockShard`, `lockExpiresAt`), where the sweeper finds it: all
    /// but the locks of a transaction whose open record names them (issue 48: 2 index writes fewer each).
    pub indexed: bool,
    /// Its credits take pending entries, not the lock ([`super::credits`]): a recorded prepare, not held,
    /// of a participant that takes them.
    pub credits: bool,
    /// The service's rules judge the items: every exclusive lock waits for the pending credits to drain.
    pub rules: bool,
    /// The participant's clock when the write is sent (a drain marker past it holds nothing back).
    pub now: u64,
}

/// The lock's status while its transaction is prepared.
const PREPARED: &str = "PREPARED";

/// DynamoDB refuses any expression string longer than this.
const MAX_EXPRESSION_BYTES: usize = 4096;

/// The lock write of one item: update and condition expressions, with their placeholders.
pub(super) fn lock_expressions(spec: LockSpec<'_>, op: &Operation, seen: Seen) -> (String, String, Expr) {
    let mut e = Expr::new();
    if spec.credits && credits::is_credit(op) {
        let entry = credits::EntrySpec {
            tx: spec.tx,
            token: spec.token,
            expires_at: spec.expires_at,
            started_at: spec.started_at,
            now: spec.now,
        };
        let (update, mut condition) = credits::entry_expressions(entry, op, &mut e);
        condition += &seen.condition(&mut e);
        return (update, condition, e);
    }
    let lock = e.name(a::LOCK);
    let last_tx = e.name(a::LAST_TX);
    let lock_value = e.value(AttributeValue::M(HashMap::from([
        ("transactionId".to_owned(), s(spec.tx)),
        ("status".to_owned(), s(PREPARED)),
        ("expiresAt".to_owned(), n(spec.expires_at)),
        ("startedAt".to_owned(), n(spec.started_at)),
        ("token".to_owned(), s(spec.token)),
        (a::LOCK_VOTED.to_owned(), s(Voted::of(op).text())),
    ])));
    let tx_value = e.value(s(spec.tx));
    let mut update = format!("SET {lock} = {lock_value}");
    if spec.indexed {
        let shard = e.name(a::LOCK_SHARD);
        let shard_value = e.value(s(shard_of(spec.tx, "lock")));
        let expiry = e.name(a::LOCK_EXPIRES_AT);
        let expiry_value = e.value(n(spec.expires_at));
        update += &format!(", {shard} = {shard_value}, {expiry} = {expiry_value}");
    }
    if let Some(reservation) = reservation(&mut e, op) {
        update += &format!(", {} = {reservation}", e.name(a::PENDING));
    }
    // No lock at all, not even one of this transaction: a re-delivered prepare keeps the lock (and token)
    // the first delivery took, and answers with it.
    let mut condition =
        format!("attribute_not_exists({lock}) AND (attribute_not_exists({last_tx}) OR {last_tx} <> {tx_value})");
    condition += &guard(&mut e, op);
    condition += &seen.condition(&mut e);
    if credits::drains(op, spec.rules) {
        condition += &credits::drained_condition(&mut e);
        update += &format!(" REMOVE {}", e.name(a::DRAIN));
    }
    (update, condition, e)
}

/// What a service's rules saw of an item before it is locked: the lock write is conditioned on it, so
/// that nothing can come between what a rule judged and the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// No rule looked: no condition.
    Anything,
    /// The item at this `version` (every commit moves it), or, with `None`, an item without one (absent).
    Version(Option<u64>),
}

impl Seen {
    /// The item's `version` as stored, if it has one.
    pub fn of(item: Option<&Item>) -> Seen {
        Seen::Version(item.and_then(|i| get_n(i, a::VERSION)).and_then(|v| v.parse().ok()))
    }

    /// The condition (starting with " AND ") that the item is still as seen.
    pub(super) fn condition(self, e: &mut Expr) -> String {
        match self {
            Seen::Anything => String::new(),
            Seen::Version(Some(version)) => format!(" AND {} = {}", e.name(a::VERSION), e.value(n(version))),
            Seen::Version(None) => format!(" AND attribute_not_exists({})", e.name(a::VERSION)),
        }
    }
}

/// The commit write of one item: the update (None for a delete, which deletes the item) and the
/// condition that the lock named by `token` is there.
pub(super) fn commit_expressions(tx: &str, token: Option<&str>, op: &Operation) -> (Option<String>, String, Expr) {
    let mut e = Expr::new();
    let condition = match token {
        Some(_) => lock_held_condition(&mut e, tx, token),
        None => {
            let held = lock_held_condition(&mut e, tx, None);
            let last_tx = e.name(a::LAST_TX);
            let tx_value = e.value(s(tx));
            format!("{held} AND (attribute_not_exists({last_tx}) OR {last_tx} <> {tx_value})")
        }
    };
    // A service's own operation applies what its prepare kept beside the lock: it must be there.
    let condition = match op {
        Operation::Custom { .. } => format!("{condition} AND attribute_exists({})", e.name(a::PENDING)),
        _ => condition,
    };
    let update = match op {
        Operation::Delete { .. } | Operation::Check { .. } => None,
        _ => {
            let release = release_names(&mut e);
            let sets = apply(&mut e, op, tx);
            Some(format!("SET {sets} REMOVE {release}"))
        }
    };
    (update, condition, e)
}

/// The commit write of a vote: the update (None for a delete) and the condition that the lock named by
/// `token` is there and keeps this vote.
pub(super) fn voted_commit_expressions(
    tx: &str,
    token: Option<&str>,
    voted: &Voted,
    kept: &str,
) -> (Option<String>, String, Expr) {
    let mut e = Expr::new();
    let mut condition = lock_held_condition(&mut e, tx, token);
    if token.is_none() {
        let last_tx = e.name(a::LAST_TX);
        let tx_value = e.value(s(tx));
        condition += &format!(" AND (attribute_not_exists({last_tx}) OR {last_tx} <> {tx_value})");
    }
    condition += &voted_condition(&mut e, kept);
    let update = match voted {
        Voted::Delete | Voted::Check => None,
        _ => {
            let release = release_names(&mut e);
            let sets = apply_voted(&mut e, voted, tx);
            Some(format!("SET {sets} REMOVE {release}"))
        }
    };
    (update, condition, e)
}

/// ` AND lock.op = <the vote's text>`.
pub(super) fn voted_condition(e: &mut Expr, kept: &str) -> String {
    let path = e.path(&[a::LOCK, a::LOCK_VOTED]);
    format!(" AND {path} = {}", e.value(s(kept)))
}

/// `lock.transactionId = tx` (and `lock.token = token` when given).
pub(super) fn lock_held_condition(e: &mut Expr, tx: &str, token: Option<&str>) -> String {
    let lock_tx = e.path(&[a::LOCK, "transactionId"]);
    let tx_value = e.value(s(tx));
    let mut condition = format!("{lock_tx} = {tx_value}");
    if let Some(token) = token {
        let lock_token = e.path(&[a::LOCK, "token"]);
        condition += &format!(" AND {lock_token} = {}", e.value(s(token)));
    }
    condition
}

/// Everything a lock adds to an item, for a REMOVE clause.
pub(super) fn release_names(e: &mut Expr) -> String {
    [a::LOCK, a::LOCK_SHARD, a::LOCK_EXPIRES_AT, a::PENDING]
        .iter()
        .map(|name| e.name(name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every operation of `operations` (named `path[i]`) as [`check_expressible`] judges it.
pub fn check_list(operations: &[Operation], path: &str) -> Result<(), crate::model::Invalid> {
    for (i, op) in operations.iter().enumerate() {
        check_expressible(op).map_err(|why| {
            crate::model::Invalid::new(crate::model::ErrorCode::LimitExceeded, format!("{path}[{i}]: {why}"))
        })?;
    }
    Ok(())
}

/// Whether the operation's prepare and commit writes fit DynamoDB's expression limit; checked when a
/// request is validated, because a commit that DynamoDB refuses could never be finished.
pub fn check_expressible(op: &Operation) -> Result<(), String> {
    // Placeholders do not depend on the values, only on how many there are: any id of the usual length will do.
    let tx = "tx-00000000000000000000000000000000";
    let spec = LockSpec {
        tx,
        token: tx,
        expires_at: u64::MAX,
        started_at: u64::MAX,
        indexed: true,
        credits: false,
        rules: true,
        now: u64::MAX,
    };
    // A service's own operation locks with the data its prepare computes: one value, whatever its size.
    let computed;
    let locked = match op {
        Operation::Custom { kind, key, fields, .. } => {
            computed = Operation::Custom {
                kind: kind.clone(),
                key: key.clone(),
                fields: fields.clone(),
                computed: Some(Default::default()),
            };
            &computed
        }
        op => op,
    };
    let (lock_update, lock_condition, _) = lock_expressions(spec, locked, Seen::Version(Some(u64::MAX)));
    let (commit_update, commit_condition, _) = commit_expressions(tx, Some(tx), op);
    // What commits is the vote (each `set` field from `pending`, longer than from a value), with or
    // without a token.
    let voted = Voted::of(op);
    let (voted_update, voted_condition, _) = voted_commit_expressions(tx, Some(tx), &voted, &voted.text());
    let (untokened_update, untokened_condition, _) = voted_commit_expressions(tx, None, &voted, &voted.text());
    // A credit may instead take a pending entry, committed from it.
    let entry_writes = match op {
        Operation::Add { field, delta, .. } if credits::is_credit(op) => {
            let credit = LockSpec { credits: true, ..spec };
            let (update, condition, _) = lock_expressions(credit, op, Seen::Version(Some(u64::MAX)));
            let (commit_update, commit_condition, _) =
                credits::entry_commit_expressions(tx, tx, field, &delta.to_string());
            vec![update, condition, commit_update, commit_condition]
        }
        _ => vec![],
    };
    let longest = [
        Some(lock_update),
        Some(lock_condition),
        commit_update,
        Some(commit_condition),
        voted_update,
        Some(voted_condition),
        untokened_update,
        Some(untokened_condition),
    ]
    .into_iter()
    .flatten()
    .chain(entry_writes)
    .map(|expression| expression.len())
    .max()
    .unwrap_or(0);
    if longest > MAX_EXPRESSION_BYTES {
        return Err(format!(
            "its commit needs an expression of {longest} bytes; DynamoDB's limit is {MAX_EXPRESSION_BYTES} bytes \
             (write fewer fields in one operation)"
        ));
    }
    Ok(())
}
