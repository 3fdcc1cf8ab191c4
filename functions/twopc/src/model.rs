//! The contract's data: operations, the REST request, participant messages and votes, statuses.
//!
//! Requests are parsed by hand from JSON values rather than derived, so that every refusal names the
//! exact place and problem (`participants[1].operations[0].delta: ...`).

use std::collections::BTreeSet;
use std::fmt;

use bigdecimal::BigDecimal;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::decimal::Decimal;

/// The REST API's error codes (`{"error": {"code", "message"}}`), each with the HTTP status it is
/// answered with. One list, so that `openapi.yaml` is checked against it (tests/tests/openapi.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// A field is missing, has the wrong type or value, or is not one the operation takes.
    InvalidRequest,
    MalformedJson,
    BodyTooLarge,
    NoParticipants,
    NoOperations,
    UnknownService,
    DuplicateService,
    UnknownOperation,
    DuplicateItem,
    /// A value DynamoDB could not store or express (key size, nesting, number range, expression size).
    LimitExceeded,
    InvalidIdempotencyKey,
    NotFound,
    MethodNotAllowed,
    IdempotencyKeyReused,
    /// A fault injected for tests stopped the coordinator; never answered in production.
    Crashed,
    Unavailable,
    /// `POST /transactions/{id}/commit` or `/abort` on a transaction that was not held.
    NotHeld,
    /// The access policy does not let this caller write an item of the request (403).
    Forbidden,
    /// A guard (`min`, `max`, `check`) on an item the caller may not read (400).
    GuardNotAllowed,
    /// A non-admin's held request (`holdMs`) that credits an item its caller does not own: it would hold
    /// the owner's item for the whole hold (403).
    HeldCreditNotAllowed,
    /// An `Age-Token` header that is not one the coordinator issued for this caller and this body, or has
    /// expired (400).
    InvalidAgeToken,
    /// An `Age-Token` whose retry already ran under another transaction id (409).
    AgeTokenUsed,
    /// The local stack only: a POST without `Content-Type: application/json` (415), which a page of
    /// another origin could send without a CORS preflight.
    UnsupportedMediaType,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 23] = [
        ErrorCode::InvalidRequest,
        ErrorCode::MalformedJson,
        ErrorCode::BodyTooLarge,
        ErrorCode::NoParticipants,
        ErrorCode::NoOperations,
        ErrorCode::UnknownService,
        ErrorCode::DuplicateService,
        ErrorCode::UnknownOperation,
        ErrorCode::DuplicateItem,
        ErrorCode::LimitExceeded,
        ErrorCode::InvalidIdempotencyKey,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::IdempotencyKeyReused,
        ErrorCode::Crashed,
        ErrorCode::Unavailable,
        ErrorCode::NotHeld,
        ErrorCode::Forbidden,
        ErrorCode::GuardNotAllowed,
        ErrorCode::HeldCreditNotAllowed,
        ErrorCode::InvalidAgeToken,
        ErrorCode::AgeTokenUsed,
        ErrorCode::UnsupportedMediaType,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::MalformedJson => "MALFORMED_JSON",
            ErrorCode::BodyTooLarge => "BODY_TOO_LARGE",
            ErrorCode::NoParticipants => "NO_PARTICIPANTS",
            ErrorCode::NoOperations => "NO_OPERATIONS",
            ErrorCode::UnknownService => "UNKNOWN_SERVICE",
            ErrorCode::DuplicateService => "DUPLICATE_SERVICE",
            ErrorCode::UnknownOperation => "UNKNOWN_OPERATION",
            ErrorCode::DuplicateItem => "DUPLICATE_ITEM",
            ErrorCode::LimitExceeded => "LIMIT_EXCEEDED",
            ErrorCode::InvalidIdempotencyKey => "INVALID_IDEMPOTENCY_KEY",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            ErrorCode::IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED",
            ErrorCode::Crashed => "CRASHED",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::NotHeld => "NOT_HELD",
            ErrorCode::Forbidden => "FORBIDDEN",
            ErrorCode::GuardNotAllowed => "GUARD_NOT_ALLOWED",
            ErrorCode::HeldCreditNotAllowed => "HELD_CREDIT_NOT_ALLOWED",
            ErrorCode::InvalidAgeToken => "INVALID_AGE_TOKEN",
            ErrorCode::AgeTokenUsed => "AGE_TOKEN_USED",
            ErrorCode::UnsupportedMediaType => "UNSUPPORTED_MEDIA_TYPE",
        }
    }

    /// The HTTP status an answer with this code has.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::IdempotencyKeyReused => 422,
            ErrorCode::Crashed => 500,
            ErrorCode::Unavailable => 503,
            ErrorCode::NotHeld => 409,
            ErrorCode::AgeTokenUsed => 409,
            ErrorCode::Forbidden | ErrorCode::HeldCreditNotAllowed => 403,
            ErrorCode::UnsupportedMediaType => 415,
            _ => 400,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A request that cannot be carried out as written; becomes a 400 with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    pub code: ErrorCode,
    pub message: String,
}

impl Invalid {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Invalid { code, message: message.into() }
    }
    fn at(path: &str, message: impl fmt::Display) -> Self {
        Invalid::new(ErrorCode::InvalidRequest, format!("{path}: {message}"))
    }
}

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
    /// Each operation kind and the fields it takes: what the parser accepts, and what openapi.yaml lists.
    pub const FIELDS: [(&'static str, &'static [&'static str]); 5] = [
        ("put", &["op", "key", "data", "ifNotExists"]),
        ("set", &["op", "key", "set"]),
        ("add", &["op", "key", "field", "delta", "min", "max"]),
        ("delete", &["op", "key"]),
        ("check", &["op", "key", "version", "exists"]),
    ];

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
    /// can express it is the participant library's to say ([`crate::participant::store::check_expressible`]):
    /// the coordinator asks it with [`crate::coordinator::parse_request`], a participant when it parses a
    /// message.
    pub fn parse(value: &Value, path: &str) -> Result<Operation, Invalid> {
        Operation::parse_for(value, path, &crate::custom::Catalog::default())
    }

    /// [`Operation::parse`], taking also the kinds of `catalog`, a service's own.
    pub fn parse_for(value: &Value, path: &str, catalog: &crate::custom::Catalog) -> Result<Operation, Invalid> {
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
        Operation::parse_list_for(value, path, &crate::custom::Catalog::default())
    }

    /// [`Operation::parse_list`], taking also the kinds of `catalog`, a service's own.
    pub fn parse_list_for(
        value: Option<&Value>,
        path: &str,
        catalog: &crate::custom::Catalog,
    ) -> Result<Vec<Operation>, Invalid> {
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
const FIELD_LEVEL: usize = 7;
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

/// One service's part of a transaction, as the client sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParticipantPart {
    pub service: String,
    pub operations: Vec<Operation>,
}

/// `POST /transactions`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TransactionRequest {
    pub participants: Vec<ParticipantPart>,
    pub timeout_ms: u64,
    /// Hold the prepares this long for a caller's commit or abort (`POST /transactions/{id}/commit`,
    /// `/abort`) instead of deciding at once; None: decide at once.
    pub hold_ms: Option<u64>,
}

/// The shortest hold a request may ask for.
pub const MIN_HOLD_MS: u64 = 1_000;
/// The longest hold any deployment accepts (the coordinator's `MAX_HOLD_MS` may lower it).
pub const DEFAULT_MAX_HOLD_MS: u64 = 24 * 60 * 60 * 1_000;
/// The longest hold a service accepts unless its configuration says otherwise (`HOLD_POLICY`).
pub const DEFAULT_SERVICE_MAX_HOLD_MS: u64 = 15 * 60 * 1_000;

pub const DEFAULT_TIMEOUT_MS: u64 = 3_000;
pub const MIN_TIMEOUT_MS: u64 = 100;
/// Below API Gateway's 29-second integration timeout, so a client always gets the answer.
pub const MAX_TIMEOUT_MS: u64 = 25_000;
pub const MAX_BODY_BYTES: usize = 256 * 1024;

impl ParticipantPart {
    pub const FIELDS: [&'static str; 2] = ["service", "operations"];
}

impl TransactionRequest {
    pub const FIELDS: [&'static str; 3] = ["participants", "timeoutMs", "holdMs"];

    /// Validates a request body against the registry of services. Nothing is written before this passes.
    pub fn parse(body: &[u8], is_registered: impl Fn(&str) -> bool) -> Result<TransactionRequest, Invalid> {
        TransactionRequest::parse_with(body, is_registered, &crate::custom::Catalogs::default())
    }

    /// [`TransactionRequest::parse`], each service's operations taking also its own kinds (`catalogs`).
    pub fn parse_with(
        body: &[u8],
        is_registered: impl Fn(&str) -> bool,
        catalogs: &crate::custom::Catalogs,
    ) -> Result<TransactionRequest, Invalid> {
        if body.len() > MAX_BODY_BYTES {
            return Err(Invalid::new(
                ErrorCode::BodyTooLarge,
                format!("request body is {} bytes; the limit is {MAX_BODY_BYTES} bytes (256 KiB)", body.len()),
            ));
        }
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| Invalid::new(ErrorCode::MalformedJson, format!("request body is not valid JSON: {e}")))?;
        let object = value.as_object().ok_or_else(|| Invalid::at("body", "must be a JSON object"))?;
        if let Some(extra) = object.keys().find(|k| !TransactionRequest::FIELDS.contains(&k.as_str())) {
            return Err(Invalid::at("body", format!("unexpected field \"{extra}\"")));
        }
        let list = object
            .get("participants")
            .ok_or_else(|| Invalid::new(ErrorCode::NoParticipants, "participants: missing"))?
            .as_array()
            .ok_or_else(|| Invalid::at("participants", "must be an array"))?;
        if list.is_empty() {
            return Err(Invalid::new(ErrorCode::NoParticipants, "participants: must contain at least one participant"));
        }
        if list.len() > MAX_PARTICIPANTS {
            return Err(Invalid::new(
                ErrorCode::LimitExceeded,
                format!("participants: {} services; one transaction takes at most {MAX_PARTICIPANTS}", list.len()),
            ));
        }
        let mut services = BTreeSet::new();
        let mut participants = Vec::with_capacity(list.len());
        for (i, part) in list.iter().enumerate() {
            let path = format!("participants[{i}]");
            let part = part.as_object().ok_or_else(|| Invalid::at(&path, "must be an object"))?;
            if let Some(extra) = part.keys().find(|k| !ParticipantPart::FIELDS.contains(&k.as_str())) {
                return Err(Invalid::at(&path, format!("unexpected field \"{extra}\"")));
            }
            let service = part
                .get("service")
                .ok_or_else(|| Invalid::at(&path, "missing \"service\""))?
                .as_str()
                .ok_or_else(|| Invalid::at(&format!("{path}.service"), "must be a string"))?;
            if !is_registered(service) {
                return Err(Invalid::new(
                    ErrorCode::UnknownService,
                    format!("{path}.service: unknown service \"{service}\"; it is not in the coordinator's registry"),
                ));
            }
            if !services.insert(service.to_owned()) {
                return Err(Invalid::new(
                    ErrorCode::DuplicateService,
                    format!("{path}.service: \"{service}\" appears twice; put all its operations in one entry"),
                ));
            }
            let operations =
                Operation::parse_list_for(part.get("operations"), &format!("{path}.operations"), catalogs.of(service))?;
            participants.push(ParticipantPart { service: service.to_owned(), operations });
        }
        let timeout_ms = match object.get("timeoutMs") {
            None | Some(Value::Null) => DEFAULT_TIMEOUT_MS,
            // As a float: a whole number written with a fraction (`3000.0`, as some JSON encoders write every
            // number) is still a whole number, as JSON Schema's `integer` (openapi.yaml) says, and every whole
            // number in range is exact in an f64.
            Some(v) => v
                .as_f64()
                .filter(|t| t.fract() == 0.0 && (MIN_TIMEOUT_MS as f64..=MAX_TIMEOUT_MS as f64).contains(t))
                .map(|t| t as u64)
                .ok_or_else(|| {
                    Invalid::at(
                        "timeoutMs",
                        format!("must be a whole number of milliseconds from {MIN_TIMEOUT_MS} to {MAX_TIMEOUT_MS}"),
                    )
                })?,
        };
        let hold_ms = match object.get("holdMs") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_f64()
                    .filter(|h| h.fract() == 0.0 && (MIN_HOLD_MS as f64..=DEFAULT_MAX_HOLD_MS as f64).contains(h))
                    .map(|h| h as u64)
                    .ok_or_else(|| {
                        Invalid::at(
                            "holdMs",
                            format!(
                                "must be a whole number of milliseconds from {MIN_HOLD_MS} to {DEFAULT_MAX_HOLD_MS}"
                            ),
                        )
                    })?,
            ),
        };
        Ok(TransactionRequest { participants, timeout_ms, hold_ms })
    }

    /// A canonical form of the request, hashed for `Idempotency-Key` comparisons: the same request
    /// written with other whitespace or key order hashes the same.
    pub fn canonical_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(canonical_json(&self.to_json()).as_bytes()))
    }

    /// The request in the contract's JSON as accepted (every field written out, `timeoutMs` included):
    /// what the hash covers, and what parses back to this request.
    pub fn to_json(&self) -> Value {
        let participants: Vec<Value> = self
            .participants
            .iter()
            .map(|p| {
                serde_json::json!({
                    "service": p.service,
                    "operations": p.operations.iter().map(Operation::to_json).collect::<Vec<_>>(),
                })
            })
            .collect();
        let mut request = serde_json::json!({"participants": participants, "timeoutMs": self.timeout_ms});
        if let Some(hold_ms) = self.hold_ms {
            request["holdMs"] = hold_ms.into();
        }
        request
    }
}

/// JSON text with object keys sorted at every level.
pub fn canonical_json(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> =
                keys.into_iter().map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&map[k]))).collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(canonical_json).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Preparing,
    /// Every participant prepared, and the decision is held (`holdMs`) for a caller to commit or abort.
    Prepared,
    Committing,
    Committed,
    Aborting,
    Aborted,
}

impl Status {
    pub const ALL: [Status; 6] =
        [Status::Preparing, Status::Prepared, Status::Committing, Status::Committed, Status::Aborting, Status::Aborted];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Preparing => "PREPARING",
            Status::Prepared => "PREPARED",
            Status::Committing => "COMMITTING",
            Status::Committed => "COMMITTED",
            Status::Aborting => "ABORTING",
            Status::Aborted => "ABORTED",
        }
    }
    pub fn parse(text: &str) -> Option<Status> {
        Some(match text {
            "PREPARING" => Status::Preparing,
            "PREPARED" => Status::Prepared,
            "COMMITTING" => Status::Committing,
            "COMMITTED" => Status::Committed,
            "ABORTING" => Status::Aborting,
            "ABORTED" => Status::Aborted,
            _ => return None,
        })
    }
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Committed | Status::Aborted)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a participant refused to prepare (the contract's codes, plus the two the system adds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RefusalCode {
    /// Another live transaction holds a lock on the item.
    Conflict,
    /// A guard does not hold: `min`/`max`, `ifNotExists`, a `check`, a non-numeric field.
    ConditionFailed,
    /// The item does not exist.
    NotFound,
    /// No answer before the transaction's deadline, or the participant failed.
    Timeout,
    /// The participant failed or could not be reached.
    Unavailable,
    /// The operation does not fit the participant's table (for example, the wrong key attributes).
    Invalid,
    /// One of the service's own rules refused (its own code in `serviceCode`, its reason in `reason`).
    Rule,
}

impl RefusalCode {
    pub const ALL: [RefusalCode; 7] = [
        RefusalCode::Conflict,
        RefusalCode::ConditionFailed,
        RefusalCode::NotFound,
        RefusalCode::Timeout,
        RefusalCode::Unavailable,
        RefusalCode::Invalid,
        RefusalCode::Rule,
    ];
}

/// A message to a participant (the contract's participant invocation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParticipantRequest {
    pub action: Action,
    pub transaction_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<u64>,
    pub operations: Vec<Value>,
    /// A commit with this field is a one-phase commit: apply the operations under their guards and create
    /// this transaction record (as COMMITTED) in the same atomic write. Sent only to a sole participant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_phase_record: Option<Value>,
    /// Prepare and one-phase commit: when the transaction started. Wait-die orders transactions by
    /// (startedAt, transactionId), so a longer timeout never lowers a transaction's priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    /// Commit: the token of the locks this participant's PREPARED vote reported. Only locks with this
    /// token are applied; a lock of the transaction with another token was taken by a late duplicate
    /// prepare after the voted one was committed, and is released without applying anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_token: Option<String>,
    /// Prepare and one-phase commit: who asked for the transaction (the caller's principal, in its
    /// canonical form), for the service's rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// Prepare of a held transaction (`holdMs`): `check`s lock their items too (a check means nothing
    /// over a long hold otherwise), so the participant takes part in the second phase.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// Hold: the new expiry (epoch ms) of the locks this transaction holds with `lockToken`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<u64>,
    /// Prepare: the transaction holds no lock anywhere while this prepare runs (a sole participant, or the
    /// first of a retry's one-at-a-time prepares): it may wait for any transaction's lock, older or younger,
    /// since a wait by a transaction that holds nothing can never close a cycle.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holds_no_locks: bool,
    /// The sender's signature over the whole message ([`crate::auth`]): a participant acts only on a
    /// message the coordinator or the sweeper signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<crate::auth::MessageSignature>,
}

impl ParticipantRequest {
    /// The same message with another action.
    pub fn with_action(self, action: Action) -> ParticipantRequest {
        ParticipantRequest { action, ..self }
    }

    /// A message with only its action and transaction; the optional fields are set with struct update.
    pub fn new(action: Action, transaction_id: impl Into<String>) -> ParticipantRequest {
        ParticipantRequest {
            action,
            transaction_id: transaction_id.into(),
            deadline: None,
            operations: vec![],
            one_phase_record: None,
            started_at: None,
            lock_token: None,
            principal: None,
            held: false,
            hold_until: None,
            holds_no_locks: false,
            signature: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Prepare,
    Commit,
    Abort,
    /// A held transaction was recorded PREPARED: the locks with the voted `lockToken` now expire at
    /// `holdUntil` (answered `HELD`; a lock that is gone or carries another token is left alone).
    Hold,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Prepare => "prepare",
            Action::Commit => "commit",
            Action::Abort => "abort",
            Action::Hold => "hold",
        }
    }
}

/// A participant's answer. Prepare answers with `vote`; commit and abort with `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ParticipantResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vote: Option<Vote>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<RefusalCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Prepare of a participant whose operations only read: nothing is locked, so it takes no part
    /// in the second phase.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// A PREPARED vote that locked items: the token those locks carry (see [`ParticipantRequest::lock_token`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_token: Option<String>,
    /// A `RULE` refusal: the service's own code (at most [`MAX_SERVICE_CODE_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_code: Option<String>,
    /// The participant's clock when the message arrived and when it answered (ms since the epoch): the
    /// coordinator compares them with its own to report the skew between the clocks (`ClockSkew`), which
    /// the protocol tolerates up to [`crate::clock::CLOCK_MARGIN_MS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_at: Option<u64>,
    /// A `CONFLICT` refusal: the (older) transaction whose lock refused this one. The coordinator's retry
    /// waits until that transaction is decided, so one attempt of it refuses a younger one at most once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    /// A refusal because a lock's owner is past its deadline (or has no record) and a participant may not
    /// decide another transaction (issue 42): the transaction it names. The coordinator, whose role may,
    /// resolves it from that transaction's own record and asks again; one with no record is the sweeper's
    /// (it reads the lock itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unresolved_owner: Option<String>,
}

impl ParticipantResponse {
    /// The answer in one word, as its JSON says it: the status of a commit or abort, the vote of a
    /// prepare.
    pub fn outcome(&self) -> &str {
        match (&self.status, self.vote) {
            (Some(status), _) => status,
            (None, Some(Vote::Prepared)) => "PREPARED",
            (None, Some(Vote::Refused)) => "REFUSED",
            (None, None) => "",
        }
    }
}

/// A service's own refusal code (`serviceCode`) is cut to this many bytes (it is kept in the transaction
/// record).
pub const MAX_SERVICE_CODE_BYTES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Vote {
    Prepared,
    Refused,
}

impl Vote {
    pub const ALL: [Vote; 2] = [Vote::Prepared, Vote::Refused];
}

/// Answer of a commit when the item holds no lock of the transaction and `lastTx` does not prove
/// the commit either (a later transaction committed the item since). See the coordinator for why a
/// caller that knows the decision was commit may count it as applied.
pub const STATUS_NOT_PREPARED: &str = "NOT_PREPARED";
pub const STATUS_COMMITTED: &str = "COMMITTED";
pub const STATUS_ABORTED: &str = "ABORTED";
/// A hold's answer: the locks of the voted token that are still there expire at `holdUntil` now.
pub const STATUS_HELD: &str = "HELD";
/// A resource participant's answer to a commit or an abort its resource did not carry out yet (`reason`
/// says why): not an acknowledgement; the message is sent again.
pub const STATUS_FAILED: &str = "FAILED";
/// Answer of a one-phase commit whose transaction record already exists: nothing was applied.
pub const STATUS_RECORD_EXISTS: &str = "RECORD_EXISTS";

#[cfg(test)]
mod tests {
    #[test]
    fn a_participant_answer_in_one_word_is_what_its_json_says() {
        for vote in [Vote::Prepared, Vote::Refused] {
            let answer = ParticipantResponse { vote: Some(vote), ..Default::default() };
            assert_eq!(serde_json::to_value(vote).unwrap(), answer.outcome());
        }
        let committed = ParticipantResponse { status: Some("COMMITTED".into()), ..Default::default() };
        assert_eq!(committed.outcome(), "COMMITTED");
    }

    use super::*;

    fn parse(body: &str) -> Result<TransactionRequest, Invalid> {
        crate::coordinator::parse_request(body.as_bytes(), |s| s.starts_with("service-"))
    }

    #[test]
    fn a_transfer_parses_with_exact_amounts() {
        let request = parse(
            r#"{"participants": [
                {"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": -0.1, "min": 0}]},
                {"service": "service-b", "operations": [{"op": "add", "key": {"entityId": "B"}, "field": "balance", "delta": 0.1}]}
            ], "timeoutMs": 2000}"#,
        )
        .unwrap();
        assert_eq!(request.timeout_ms, 2000);
        let Operation::Add { delta, min, .. } = &request.participants[0].operations[0] else { panic!() };
        assert_eq!(delta.to_string(), "-0.1");
        assert_eq!(min.as_ref().unwrap().to_string(), "0");
    }

    #[test]
    fn refusals_name_the_problem() {
        let cases = [
            ("{", "not valid JSON"),
            (r#"{"participants": []}"#, "at least one participant"),
            (r#"{"participants": [{"service": "service-a", "operations": []}]}"#, "at least one operation"),
            (
                r#"{"participants": [{"service": "other", "operations": [{"op": "delete", "key": {"entityId": "A"}}]}]}"#,
                "unknown service \"other\"",
            ),
            (
                r#"{"participants": [{"service": "service-a", "operations": [{"op": "move", "key": {"entityId": "A"}}]}]}"#,
                "unknown operation \"move\"",
            ),
            (
                r#"{"participants": [{"service": "service-a", "operations": [{"op": "delete", "key": {"entityId": "A"}}, {"op": "delete", "key": {"entityId": "A"}}]}]}"#,
                "appears twice",
            ),
            (
                r#"{"participants": [{"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "b", "delta": "ten"}]}]}"#,
                "operations[0].delta",
            ),
            (
                r#"{"participants": [{"service": "service-a", "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "b", "delta": 1, "min": 5, "max": 1}]}]}"#,
                "greater than max",
            ),
        ];
        for (body, expected) in cases {
            let err = parse(body).unwrap_err();
            assert!(err.message.contains(expected), "{body}: {err}");
        }
        let big = format!(r#"{{"participants": [], "pad": "{}"}}"#, "x".repeat(MAX_BODY_BYTES));
        assert_eq!(parse(&big).unwrap_err().code, "BODY_TOO_LARGE");
    }

    #[test]
    fn values_dynamodb_cannot_store_are_refused_with_the_limit_named() {
        let op = |operation: serde_json::Value| {
            let body = serde_json::json!({"participants": [{"service": "service-a", "operations": [operation]}]});
            parse(&body.to_string())
        };
        let put =
            |data: serde_json::Value| op(serde_json::json!({"op": "put", "key": {"entityId": "A"}, "data": data}));
        let huge: Value = serde_json::from_str("1e400").unwrap();
        assert!(put(serde_json::json!({"x": huge})).unwrap_err().message.contains("data.x"));
        assert!(put(serde_json::json!({"x": {"": 1}})).unwrap_err().message.contains("names must not be empty"));
        let mut deep = serde_json::json!(1);
        for _ in 0..MAX_NESTING - FIELD_LEVEL + 2 {
            deep = serde_json::json!({"d": deep});
        }
        let err = put(serde_json::json!({"x": deep})).unwrap_err();
        assert_eq!((err.code, err.message.contains("limit is 32 levels")), (ErrorCode::LimitExceeded, true), "{err}");
        assert!(put(serde_json::json!({"x": deep["d"].clone()})).is_ok(), "one level less fits");
        let long_key = "k".repeat(MAX_KEY_BYTES + 1);
        let err = op(serde_json::json!({"op": "delete", "key": {"entityId": long_key}})).unwrap_err();
        assert_eq!((err.code, err.message.contains("2048 bytes")), (ErrorCode::LimitExceeded, true), "{err}");
        assert!(op(serde_json::json!({"op": "delete", "key": {"entityId": "k".repeat(MAX_KEY_BYTES)}})).is_ok());
        // Key attribute names are attribute names too: found by the API fuzzing run, where `{"": "A"}`
        // passed validation and the transaction record's write failed (a 503 instead of a 400).
        let err = op(serde_json::json!({"op": "delete", "key": {"": "A"}})).unwrap_err();
        assert_eq!(
            (err.code, err.message.contains("key: attribute names must not be empty")),
            (ErrorCode::InvalidRequest, true),
            "{err}"
        );
        let err =
            op(serde_json::json!({"op": "delete", "key": {"k".repeat(MAX_KEY_NAME_BYTES + 1): "A"}})).unwrap_err();
        assert_eq!((err.code, err.message.contains("255 bytes")), (ErrorCode::LimitExceeded, true), "{err}");
        let fields: Map<String, Value> = (0..400).map(|i| (format!("f{i}"), Value::from(i))).collect();
        let err = op(serde_json::json!({"op": "set", "key": {"entityId": "A"}, "set": fields})).unwrap_err();
        assert_eq!((err.code, err.message.contains("4096 bytes")), (ErrorCode::LimitExceeded, true), "{err}");
        let fields: Map<String, Value> = (0..100).map(|i| (format!("f{i}"), Value::from(i))).collect();
        assert!(op(serde_json::json!({"op": "set", "key": {"entityId": "A"}, "set": fields})).is_ok());
    }

    /// fuzz/request_parser's first crash, shortened: a string amount in a form JSON has no number
    /// for was accepted, and hashing the request (or sending it to the participant) panicked.
    #[test]
    fn an_amount_written_in_any_decimal_form_is_hashed_and_sent_as_a_json_number() {
        for (written, wire) in [("-02.10", "-2.1"), ("+5", "5"), (".5", "0.5"), ("5.", "5")] {
            let body = format!(
                r#"{{"participants": [{{"service": "service-a", "operations": [{{"op": "add", "key": {{"entityId": "A"}}, "field": "b", "delta": "{written}", "min": "{written}", "max": "{written}"}}]}}]}}"#
            );
            let request = parse(&body).unwrap();
            let sent = request.participants[0].operations[0].to_json();
            for field in ["delta", "min", "max"] {
                assert_eq!(sent[field].to_string(), wire, "{written:?}");
            }
            let again = parse(&format!(r#"{{"participants": [{{"service": "service-a", "operations": [{sent}]}}]}}"#));
            assert_eq!(again.unwrap().canonical_hash(), request.canonical_hash(), "{written:?}");
        }
    }

    /// Found with the one above: exponents past i64's range of exponents are refused with the
    /// limit named, never a panic.
    #[test]
    fn amounts_with_exponents_past_any_range_are_refused() {
        for delta in ["1e9223372036854775807", "100e9223372036854775807", "\"+100e9223372036854775807\""] {
            let body = format!(
                r#"{{"participants": [{{"service": "service-a", "operations": [{{"op": "add", "key": {{"entityId": "A"}}, "field": "b", "delta": {delta}}}]}}]}}"#
            );
            let err = parse(&body).unwrap_err();
            assert!(err.message.contains("delta: is outside DynamoDB's range"), "{delta}: {err}");
        }
    }

    #[test]
    fn a_whole_timeout_written_with_a_fraction_is_accepted() {
        // Found by the API fuzzing run: `524.0` is an integer to JSON Schema, and was refused here.
        let body = |t: &str| {
            format!(
                r#"{{"participants": [{{"service": "service-a", "operations": [{{"op": "delete", "key": {{"entityId": "A"}}}}]}}], "timeoutMs": {t}}}"#
            )
        };
        assert_eq!(parse(&body("524.0")).unwrap().timeout_ms, 524);
        assert_eq!(parse(&body("1e3")).unwrap().timeout_ms, 1000);
        for refused in ["524.5", "99", "25001", "-100", "\"500\""] {
            assert!(parse(&body(refused)).unwrap_err().message.starts_with("timeoutMs:"), "{refused}");
        }
    }

    #[test]
    fn the_hash_ignores_layout_but_not_content() {
        let a = parse(r#"{"participants": [{"service": "service-a", "operations": [{"op": "set", "key": {"entityId": "A"}, "set": {"x": 1, "y": 2}}]}]}"#).unwrap();
        let b = parse(r#"{ "participants":[{"operations":[{"set":{"y":2,"x":1},"key":{"entityId":"A"},"op":"set"}],"service":"service-a"}]}"#).unwrap();
        let c = parse(r#"{"participants": [{"service": "service-a", "operations": [{"op": "set", "key": {"entityId": "A"}, "set": {"x": 1, "y": 3}}]}]}"#).unwrap();
        assert_eq!(a.canonical_hash(), b.canonical_hash());
        assert_ne!(a.canonical_hash(), c.canonical_hash());
    }
}
