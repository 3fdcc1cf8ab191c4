//! What an operation does to an item: the guard its vote stands on, what its commit applies, what its
//! prepare reserves beside the lock, and why a guard does not hold, in words. The item store builds its
//! writes from these, and a participant's refusals quote them.

use aws_sdk_dynamodb::types::AttributeValue;
use bigdecimal::BigDecimal;

use crate::attr;
use crate::expr::{Expr, n, s};
use crate::model::{Operation, RefusalCode};
use crate::store::{Item, get_m, get_n};
use crate::tables::item_attr as a;

/// The precondition an operation's vote stands on, as a condition expression (starting with " AND ").
pub(crate) fn guard(e: &mut Expr, op: &Operation) -> String {
    // Names are registered only where the expression uses them: DynamoDB refuses unused ones.
    match op {
        Operation::Put { if_not_exists: true, .. } => format!(" AND attribute_not_exists({})", e.name(a::DATA)),
        Operation::Put { .. } => String::new(),
        Operation::Set { .. } | Operation::Delete { .. } => format!(" AND attribute_exists({})", e.name(a::DATA)),
        Operation::Add { field, delta, min, max, .. } => {
            let data = e.name(a::DATA);
            let path = e.path(&[a::DATA, field]);
            let number_type = e.value(s("N"));
            let mut condition = format!(" AND attribute_exists({data}) AND attribute_type({path}, {number_type})");
            if let Some(min) = min {
                let lowest = e.value(n(plain(&(min.value() - delta.value()))));
                condition += &format!(" AND {path} >= {lowest}");
            }
            if let Some(max) = max {
                let highest = e.value(n(plain(&(max.value() - delta.value()))));
                condition += &format!(" AND {path} <= {highest}");
            }
            condition
        }
        Operation::Check { version, exists, .. } => {
            let mut condition = String::new();
            if let Some(version) = version {
                let version_name = e.name(a::VERSION);
                let expected = e.value(n(version));
                condition += &format!(" AND {version_name} = {expected}");
            }
            match exists {
                Some(true) => condition += &format!(" AND attribute_exists({})", e.name(a::DATA)),
                Some(false) => condition += &format!(" AND attribute_not_exists({})", e.name(a::DATA)),
                None => {}
            }
            condition
        }
        // Computed from the item as read: the lock write is conditioned on the item's version instead.
        Operation::Custom { .. } => String::new(),
    }
}

/// What the prepare reserves in `pending` for the commit: at least as many bytes as the commit adds, so
/// the locked item is never smaller than the committed one will be (DynamoDB's 400 KB limit is met at
/// prepare). An `add`'s result is a number of at most 38 digits: the largest such number covers it.
pub(crate) fn reservation(e: &mut Expr, op: &Operation) -> Option<String> {
    match op {
        Operation::Put { data, .. } => Some(e.value(AttributeValue::M(attr::to_item(data)))),
        Operation::Set { set, .. } => Some(e.value(AttributeValue::M(attr::to_item(set)))),
        Operation::Add { .. } => Some(e.value(n(LARGEST_NUMBER))),
        Operation::Delete { .. } | Operation::Check { .. } => None,
        // What the commit applies, exactly: the item's new data as the prepare computed it.
        Operation::Custom { computed, .. } => {
            Some(e.value(AttributeValue::M(attr::to_item(computed.as_ref().expect("computed at prepare")))))
        }
    }
}

/// The number DynamoDB stores in the most bytes: 38 significant digits.
const LARGEST_NUMBER: &str = "-9.9999999999999999999999999999999999999E+125";

/// What every commit of `tx` sets besides the data: the next `version`, and `lastTx`.
fn committed_by(e: &mut Expr, tx: &str) -> Vec<String> {
    let version = e.name(a::VERSION);
    let last_tx = e.name(a::LAST_TX);
    let zero = e.value(n(0));
    let one = e.value(n(1));
    let tx_value = e.value(s(tx));
    vec![format!("{version} = if_not_exists({version}, {zero}) + {one}"), format!("{last_tx} = {tx_value}")]
}

/// The SET clauses (without "SET") that apply a writing operation as a commit of `tx`.
pub(crate) fn apply(e: &mut Expr, op: &Operation, tx: &str) -> String {
    let mut sets = committed_by(e, tx);
    let data = e.name(a::DATA);
    match op {
        Operation::Put { data: value, .. } => {
            let value = e.value(AttributeValue::M(attr::to_item(value)));
            sets.push(format!("{data} = {value}"));
        }
        Operation::Set { set, .. } => {
            for (field, value) in set {
                let path = e.path(&[a::DATA, field]);
                let value = e.value(attr::to_attribute(value));
                sets.push(format!("{path} = {value}"));
            }
        }
        Operation::Add { field, delta, .. } => {
            let path = e.path(&[a::DATA, field]);
            let delta = e.value(n(delta));
            sets.push(format!("{path} = {path} + {delta}"));
        }
        Operation::Delete { .. } | Operation::Check { .. } => unreachable!("delete and check do not update"),
        // In one phase, the data computed now; in two, the data its prepare computed and kept beside the
        // lock (never computed again: a participant redeployed in between still commits what it voted for).
        Operation::Custom { computed: Some(value), .. } => {
            let value = e.value(AttributeValue::M(attr::to_item(value)));
            sets.push(format!("{data} = {value}"));
        }
        Operation::Custom { computed: None, .. } => sets.push(format!("{data} = {}", e.name(a::PENDING))),
    }
    sets.join(", ")
}

/// What a prepare voted to apply to one item, kept in its lock (`lock.op`, JSON): what the commit, and any
/// roll-forward, applies — never what a later message or record says (issue 42: a record rewritten after
/// the vote, or a forged message, cannot change what commits). The values a commit writes are the ones
/// the prepare reserved in `pending`; only an `add`'s delta is kept here.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", deny_unknown_fields)]
pub enum Voted {
    /// `data` becomes `pending`.
    Put,
    /// Each field becomes its value in `pending`.
    Set {
        fields: Vec<String>,
    },
    /// The field moves by the delta (its canonical text).
    Add {
        field: String,
        delta: String,
    },
    Delete,
    /// Nothing changes: the commit releases the lock.
    Check,
    /// `data` becomes `pending`, as the service's own code computed it at prepare.
    Custom,
}

impl Voted {
    pub fn of(op: &Operation) -> Voted {
        match op {
            Operation::Put { .. } => Voted::Put,
            // Sorted: a record read back from DynamoDB (whose maps keep no order) names the same vote.
            Operation::Set { set, .. } => {
                let mut fields: Vec<String> = set.keys().cloned().collect();
                fields.sort();
                Voted::Set { fields }
            }
            Operation::Add { field, delta, .. } => Voted::Add { field: field.clone(), delta: plain(delta.value()) },
            Operation::Delete { .. } => Voted::Delete,
            Operation::Check { .. } => Voted::Check,
            Operation::Custom { .. } => Voted::Custom,
        }
    }

    /// As kept in `lock.op`: the same text for the same vote (a `Set`'s fields sorted).
    pub fn text(&self) -> String {
        serde_json::to_string(self).expect("a vote serializes")
    }

    /// The vote a lock keeps, with its text as stored (a commit is conditioned on that very text); None
    /// for a lock without one (taken before issue 42); an error for one this code cannot read (then the
    /// commit refuses to guess: see `DataTable::commit_item`).
    pub fn of_lock(item: &Item) -> Option<Result<(Voted, String), String>> {
        let kept = get_m(item, a::LOCK)?.get(a::LOCK_VOTED)?;
        let Ok(text) = kept.as_s() else {
            return Some(Err(format!("lock.{} is not a string: {kept:?}", a::LOCK_VOTED)));
        };
        Some(
            serde_json::from_str(text)
                .map(|voted| (voted, text.clone()))
                .map_err(|e| format!("lock.{}: {e}", a::LOCK_VOTED)),
        )
    }
}

/// The SET clauses (without "SET") that apply a vote as a commit of `tx`: every value from the item itself
/// (`pending`, or the kept delta), none from the message.
pub(crate) fn apply_voted(e: &mut Expr, voted: &Voted, tx: &str) -> String {
    let mut sets = committed_by(e, tx);
    let data = e.name(a::DATA);
    match voted {
        Voted::Put | Voted::Custom => sets.push(format!("{data} = {}", e.name(a::PENDING))),
        Voted::Set { fields } => {
            for field in fields {
                let path = e.path(&[a::DATA, field]);
                let value = e.path(&[a::PENDING, field]);
                sets.push(format!("{path} = {value}"));
            }
        }
        Voted::Add { field, delta } => {
            let path = e.path(&[a::DATA, field]);
            let delta = e.value(n(delta));
            sets.push(format!("{path} = {path} + {delta}"));
        }
        Voted::Delete | Voted::Check => unreachable!("delete and check do not update"),
    }
    sets.join(", ")
}

/// Why an operation's guard does not hold on the item as it is (`None`: no such item), in words with
/// the numbers (`balance 50 + -100 = -50 is below the minimum 0 on entity ...`); `None` if it holds.
pub fn guard_refusal(op: &Operation, item: Option<&Item>) -> Option<(RefusalCode, String)> {
    let key = op.key_text();
    let some = |code, reason: String| Some((code, reason));
    let data = item.and_then(|i| get_m(i, a::DATA));
    match op {
        Operation::Put { if_not_exists: true, .. } if data.is_some() => {
            some(RefusalCode::ConditionFailed, format!("entity {key} already exists (ifNotExists)"))
        }
        Operation::Set { .. } | Operation::Delete { .. } | Operation::Add { .. } if data.is_none() => {
            some(RefusalCode::NotFound, format!("entity {key} does not exist"))
        }
        Operation::Add { field, delta, min, max, .. } => {
            let Some(value) = data.and_then(|d| d.get(field.as_str())) else {
                return some(RefusalCode::ConditionFailed, format!("entity {key} has no field \"{field}\" to add to"));
            };
            let Some(current) = value.as_n().ok().and_then(|t| t.parse::<BigDecimal>().ok()) else {
                return some(
                    RefusalCode::ConditionFailed,
                    format!("field \"{field}\" of entity {key} is not a number"),
                );
            };
            let result = &current + delta.value();
            let shown = format!("{field} {} + {delta} = {}", plain(&current), plain(&result));
            if let Some(min) = min
                && &result < min.value()
            {
                return some(
                    RefusalCode::ConditionFailed,
                    format!("{shown} is below the minimum {min} on entity {key}"),
                );
            }
            if let Some(max) = max
                && &result > max.value()
            {
                return some(
                    RefusalCode::ConditionFailed,
                    format!("{shown} is above the maximum {max} on entity {key}"),
                );
            }
            None
        }
        Operation::Check { version, exists, .. } => {
            if *exists == Some(true) && data.is_none() {
                return some(RefusalCode::NotFound, format!("entity {key} does not exist"));
            }
            if *exists == Some(false) && data.is_some() {
                return some(RefusalCode::ConditionFailed, format!("entity {key} exists"));
            }
            if let Some(expected) = version {
                let actual = item.and_then(|i| get_n(i, a::VERSION)).unwrap_or("none");
                if actual.parse::<BigDecimal>().ok().as_ref() != Some(expected.value()) {
                    return some(
                        RefusalCode::ConditionFailed,
                        format!("entity {key} is at version {actual}, expected {expected}"),
                    );
                }
            }
            None
        }
        _ => None,
    }
}

pub(crate) fn plain(value: &BigDecimal) -> String {
    value.normalized().to_plain_string()
}

/// Why an `add` that passed its guards still cannot be committed: its result is not a number DynamoDB
/// can store (more than 38 significant digits, or out of range). Checked at prepare, so that commit,
/// which cannot refuse, never meets it.
pub fn unrepresentable_result(op: &Operation, locked: &Item) -> Option<String> {
    let Operation::Add { field, delta, .. } = op else { return None };
    let current = get_m(locked, a::DATA)?.get(field.as_str())?.as_n().ok()?.parse::<BigDecimal>().ok()?;
    let result = &current + delta.value();
    crate::decimal::Decimal::from_big(result.clone())
        .err()
        .map(|why| format!("{field} {} + {delta} = {} {why}", plain(&current), plain(&result)))
}
