//! Operations, the contract's `{"op": ...}`: the built-in kinds and a service's own, each parsed by
//! hand from JSON so that every refusal names the exact place and problem
//! (`participants[1].operations[0].delta: ...`), and checked against what DynamoDB can store.

use std::collections::BTreeSet;

use bigdecimal::BigDecimal;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::custom::Catalog;
use crate::decimal::Decimal;
use crate::errors::{ErrorCode, Invalid};

/// The item an operation targets: the table's key attributes as JSON scalars.
pub type Key = Map<String, Value>;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Operation {
    Put {
        key: Key,
        data: Map<String, Value>,
        #[serde(rename = "ifNotExists", skip_serializing_if = "std::ops::Not::not")]
        if_not_exists: bool,
    },
    Set {
        key: Key,
        set: Map<String, Value>,
    },
    Add {
        key: Key,
        field: String,
        delta: Decimal,
        #[serde(skip_serializing_if = "Option::is_none")]
        min: Option<Decimal>,
        #[serde(skip_serializing_if = "Option::is_none")]
        max: Option<Decimal>,
    },
    Delete {
        key: Key,
    },
    Check {
        key: Key,
        #[serde(skip_serializing_if = "Option::is_none")]
        version: Option<Decimal>,
        #[serde(skip_serializing_if = "Option::is_none")]
        exists: Option<bool>,
    },
    /// A service's own kind ([`crate::custom`]): its fields as the service's schema declares them. What it
    /// makes of the item the service's participant computes at prepare, and its commit applies that.
    #[serde(skip_serializing)]
    Custom {
        kind: String,
        key: Key,
        fields: Map<String, Value>,
        /// At prepare, what the service's participant computed of the item: its new `data` (never sent,
        /// never in a record; kept beside the lock as `pending`, and what the commit applies).
        computed: Option<Map<String, Value>>,
    },
}

impl Operation {
    /// Each built-in kind and the fields it takes: what the parser accepts, and what openapi.yaml lists.
    pub const FIELDS: [(&'static str, &'static [&'static str]); 5] = crate::custom::BUILT_IN_KINDS;

    pub fn key(&self) -> &Key {
        match self {
            Operation::Put { key, .. }
            | Operation::Set { key, .. }
            | Operation::Add { key, .. }
            | Operation::Delete { key }
            | Operation::Check { key, .. }
            | Operation::Custom { key, .. } => key,
        }
    }

    /// The `op` of the operation.
    pub fn kind(&self) -> &str {
        match self {
            Operation::Put { .. } => "put",
            Operation::Set { .. } => "set",
            Operation::Add { .. } => "add",
            Operation::Delete { .. } => "delete",
            Operation::Check { .. } => "check",
            Operation::Custom { kind, .. } => kind,
        }
    }

    pub fn is_read_only(&self) -> bool {
        matches!(self, Operation::Check { .. })
    }

    /// The key as text, for messages and for telling items apart.
    pub fn key_text(&self) -> String {
        key_text(self.key())
    }

    pub fn to_json(&self) -> Value {
        match self {
            Operation::Custom { kind, key, fields, .. } => {
                let mut object = Map::new();
                object.insert("op".into(), Value::String(kind.clone()));
                object.insert("key".into(), Value::Object(key.clone()));
                object.extend(fields.clone());
                Value::Object(object)
            }
            _ => serde_json::to_value(self).expect("operations serialize"),
        }
    }

    /// Parses and validates one operation; `path` names it in messages. Whether the participant's writes
    /// can express it is the participant library's to say ([`crate::participant::expressions::check_expressible`]):
    /// the coordinator asks it with [`crate::coordinator::parse_request`], a participant when it parses a
    /// message.
    pub fn parse(value: &Value, path: &str) -> Result<Operation, Invalid> {
        Operation::parse_for(value, path, &Catalog::default())
    }

    /// [`Operation::parse`], taking also the kinds of `catalog`, a service's own.
    pub fn parse_for(value: &Value, path: &str, catalog: &Catalog) -> Result<Operation, Invalid> {
        let object = value.as_object().ok_or_else(|| Invalid::at(path, "must be an object"))?;
        let op = object
            .get("op")
            .ok_or_else(|| Invalid::at(path, "missing \"op\""))?
            .as_str()
            .ok_or_else(|| Invalid::at(&format!("{path}.op"), "must be a string"))?;
        let Some((_, allowed)) = Operation::FIELDS.iter().find(|(name, _)| *name == op) else {
            let fields = catalog.fields(op, object, path)?;
            let key = parse_key(object.get("key"), &format!("{path}.key"))?;
            for (name, value) in &fields {
                // The record stores them one level above an operation's data: operation → field.
                check_storable(name, value, path, FIELD_LEVEL - 1)?;
            }
            return Ok(Operation::Custom { kind: op.to_owned(), key, fields, computed: None });
        };
        if let Some(extra) = object.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(Invalid::at(path, format!("unexpected field \"{extra}\" for op \"{op}\"")));
        }
        let key = parse_key(object.get("key"), &format!("{path}.key"))?;
        let operation = match op {
            "put" => {
                let data = required_object(object, "data", path)?;
                for (name, value) in &data {
                    check_storable(name, value, &format!("{path}.data"), FIELD_LEVEL)?;
                }
                Operation::Put {
                    key,
                    data,
                    if_not_exists: optional_bool(object, "ifNotExists", path)?.unwrap_or(false),
                }
            }
            "set" => {
                let set = required_object(object, "set", path)?;
                if set.is_empty() {
                    return Err(Invalid::at(&format!("{path}.set"), "must name at least one field"));
                }
                for (name, value) in &set {
                    check_field_name(name, &format!("{path}.set"))?;
                    check_storable(name, value, &format!("{path}.set"), FIELD_LEVEL)?;
                }
                Operation::Set { key, set }
            }
            "add" => {
                let field = object
                    .get("field")
                    .ok_or_else(|| Invalid::at(path, "missing \"field\""))?
                    .as_str()
                    .ok_or_else(|| Invalid::at(&format!("{path}.field"), "must be a string"))?
                    .to_owned();
                check_field_name(&field, &format!("{path}.field"))?;
                let delta = Decimal::parse_json(object.get("delta"), &format!("{path}.delta"))?
                    .ok_or_else(|| Invalid::at(path, "missing \"delta\""))?;
                let min = Decimal::parse_json(object.get("min"), &format!("{path}.min"))?;
                let max = Decimal::parse_json(object.get("max"), &format!("{path}.max"))?;
                if let (Some(lo), Some(hi)) = (&min, &max)
                    && lo.value() > hi.value()
                {
                    return Err(Invalid::at(path, format!("min {lo} is greater than max {hi}")));
                }
                // The guard becomes `value >= min - delta` in a condition expression: both bounds must be
                // numbers DynamoDB can hold.
                for (bound, name) in [(&min, "min"), (&max, "max")] {
                    if let Some(bound) = bound {
                        Decimal::from_big(bound.value() - delta.value())
                            .map_err(|e| Invalid::at(&format!("{path}.{name}"), format!("{name} - delta {e}")))?;
                    }
                }
                Operation::Add { key, field, delta, min, max }
            }
            "delete" => Operation::Delete { key },
            _ => {
                let version = Decimal::parse_json(object.get("version"), &format!("{path}.version"))?;
                if let Some(v) = &version
                    && (v.value() < &BigDecimal::from(0) || !v.value().is_integer())
                {
                    return Err(Invalid::at(&format!("{path}.version"), "must be a whole number >= 0"));
                }
                let exists = optional_bool(object, "exists", path)?;
                if version.is_some() && exists == Some(false) {
                    return Err(Invalid::at(path, "\"version\" and \"exists\": false contradict each other"));
                }
                Operation::Check { key, version, exists }
            }
        };
        Ok(operation)
    }

    /// Parses a list of operations: at least one, and no item twice.
    pub fn parse_list(value: Option<&Value>, path: &str) -> Result<Vec<Operation>, Invalid> {
        Operation::parse_list_for(value, path, &Catalog::default())
    }

    /// [`Operation::parse_list`], taking also the kinds of `catalog`, a service's own.
    pub fn parse_list_for(value: Option<&Value>, path: &str, catalog: &Catalog) -> Result<Vec<Operation>, Invalid> {
        let list = value
            .ok_or_else(|| Invalid::at(path, "missing"))?
            .as_array()
            .ok_or_else(|| Invalid::at(path, "must be an array"))?;
        if list.is_empty() {
            return Err(Invalid::new(ErrorCode::NoOperations, format!("{path}: must contain at least one operation")));
        }
        if list.len() > MAX_OPERATIONS_PER_PARTICIPANT {
            return Err(Invalid::at(
                path,
                format!(
                    "at most {MAX_OPERATIONS_PER_PARTICIPANT} operations per participant (DynamoDB's transaction limit)"
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        let mut operations = Vec::with_capacity(list.len());
        for (i, value) in list.iter().enumerate() {
            let operation = Operation::parse_for(value, &format!("{path}[{i}]"), catalog)?;
            if !seen.insert(operation.key_text()) {
                return Err(Invalid::new(
                    ErrorCode::DuplicateItem,
                    format!(
                        "{path}[{i}]: item {} appears twice; combine its operations into one",
                        operation.key_text()
                    ),
                ));
            }
            operations.push(operation);
        }
        Ok(operations)
    }
}

/// TransactWriteItems takes at most 100 items; a participant prepares its items in one of them.
pub const MAX_OPERATIONS_PER_PARTICIPANT: usize = 100;
/// Services in one transaction: the transaction record keeps a vote for each, and its headroom
/// ([`crate::record::RECORD_HEADROOM_BYTES`]) is sized for this many.
pub const MAX_PARTICIPANTS: usize = 32;

pub fn key_text(key: &Key) -> String {
    Value::Object(key.clone()).to_string()
}

fn parse_key(value: Option<&Value>, path: &str) -> Result<Key, Invalid> {
    let key = value
        .ok_or_else(|| Invalid::at(path, "missing"))?
        .as_object()
        .ok_or_else(|| Invalid::at(path, "must be an object such as {\"entityId\": \"A\"}"))?;
    if key.is_empty() {
        return Err(Invalid::at(path, "must name the item's key attributes"));
    }
    for (name, value) in key {
        check_name(name, path, MAX_KEY_NAME_BYTES)?;
        let at = format!("{path}.{name}");
        match value {
            Value::String(s) if s.len() > MAX_KEY_BYTES => {
                return Err(Invalid::new(
                    ErrorCode::LimitExceeded,
                    format!("{at}: is {} bytes; DynamoDB keys hold at most {MAX_KEY_BYTES} bytes", s.len()),
                ));
            }
            Value::String(s) if !s.is_empty() => {}
            Value::Number(number) => {
                number.to_string().parse::<Decimal>().map_err(|e| Invalid::at(&at, e))?;
            }
            _ => return Err(Invalid::at(&at, "must be a non-empty string or a number")),
        }
    }
    Ok(key.clone())
}

/// DynamoDB's limit on the name of a key attribute.
pub const MAX_KEY_NAME_BYTES: usize = 255;
/// DynamoDB's limit on a partition key value.
pub const MAX_KEY_BYTES: usize = 2048;
/// DynamoDB's limit on how deep maps and lists nest in an item: 32 levels, the item itself being the
/// first, so a top-level attribute's map or list is at level 2 and no map or list may sit deeper than
/// level 32 (DynamoDB Local refuses a 32nd map nested under a top-level attribute, `tests/tests/limits.rs`).
pub const MAX_NESTING: usize = 32;
/// The nesting level a field of an operation's data has at its deepest: in the transaction record, which
/// stores it as item (1) → participants (2) → entry (3) → operations (4) → operation (5) → data or set
/// (6) → field (7). The item keeps it shallower (item → data → field), and so does the lock's `pending`.
pub(crate) const FIELD_LEVEL: usize = 7;
/// DynamoDB's limit on an attribute name (a map key at any depth).
const MAX_NAME_BYTES: usize = 65_535;

/// Refuses a value DynamoDB would refuse to store, so that no write of the transaction (the record, the
/// prepare, the commit) can fail on it later: numbers out of range or over 38 digits, empty or
/// oversized names, nesting deeper than DynamoDB allows. `level` is the nesting level a map or list
/// value would have in the deepest item that stores it (see [`FIELD_LEVEL`]).
fn check_storable(name: &str, value: &Value, path: &str, level: usize) -> Result<(), Invalid> {
    check_name(name, path, MAX_NAME_BYTES)?;
    check_value(value, &format!("{path}.{name}"), level)
}

/// DynamoDB's rules for an attribute name (a map key at any depth, or a key attribute's name): not
/// empty, and at most `max_bytes` long.
fn check_name(name: &str, path: &str, max_bytes: usize) -> Result<(), Invalid> {
    if name.is_empty() {
        return Err(Invalid::at(path, "attribute names must not be empty"));
    }
    if name.len() > max_bytes {
        return Err(Invalid::new(
            ErrorCode::LimitExceeded,
            format!("{path}: a name is {} bytes; DynamoDB allows at most {max_bytes} bytes here", name.len()),
        ));
    }
    Ok(())
}

fn check_value(value: &Value, at: &str, level: usize) -> Result<(), Invalid> {
    let nested = matches!(value, Value::Object(_) | Value::Array(_));
    if nested && level > MAX_NESTING {
        return Err(Invalid::new(
            ErrorCode::LimitExceeded,
            format!(
                "{at}: nests too deep: the transaction record stores it {} levels deep, and DynamoDB's limit is \
                 {MAX_NESTING} levels",
                level
            ),
        ));
    }
    match value {
        Value::Number(number) => number.to_string().parse::<Decimal>().map(|_| ()).map_err(|e| Invalid::at(at, e)),
        Value::Object(map) => map.iter().try_for_each(|(name, v)| check_storable(name, v, at, level + 1)),
        Value::Array(items) => {
            items.iter().enumerate().try_for_each(|(i, v)| check_value(v, &format!("{at}[{i}]"), level + 1))
        }
        _ => Ok(()),
    }
}

fn required_object(object: &Map<String, Value>, name: &str, path: &str) -> Result<Map<String, Value>, Invalid> {
    object
        .get(name)
        .ok_or_else(|| Invalid::at(path, format!("missing \"{name}\"")))?
        .as_object()
        .cloned()
        .ok_or_else(|| Invalid::at(&format!("{path}.{name}"), "must be an object"))
}

fn optional_bool(object: &Map<String, Value>, name: &str, path: &str) -> Result<Option<bool>, Invalid> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(Invalid::at(&format!("{path}.{name}"), "must be true or false")),
    }
}

fn check_field_name(name: &str, path: &str) -> Result<(), Invalid> {
    if name.is_empty() || name.len() > 255 {
        return Err(Invalid::at(path, "field names must be 1 to 255 characters"));
    }
    Ok(())
}

/// A list of operations kept in their contract JSON (a transaction record's `operations`): written with
/// [`Operation::to_json`], read back with any kind accepted, as a commit or an abort reads them (the
/// coordinator judged them against the service's kinds before it recorded them). An empty list is a
/// finished transaction's.
pub mod as_json {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    use super::Operation;
    use crate::custom::Catalog;

    pub fn serialize<S: Serializer>(operations: &[Operation], serializer: S) -> Result<S::Ok, S::Error> {
        let values: Vec<Value> = operations.iter().map(Operation::to_json).collect();
        values.serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Operation>, D::Error> {
        let any = Catalog::any();
        Vec::<Value>::deserialize(deserializer)?
            .iter()
            .enumerate()
            .map(|(i, value)| {
                Operation::parse_for(value, &format!("operations[{i}]"), &any).map_err(serde::de::Error::custom)
            })
            .collect()
    }
}
