//! A service's own operation kinds: `{"op": "reserve", "key": {"entityId": "SKU-1"}, "quantity": 3}`.
//!
//! A service declares each kind it speaks with its fields (an [`OperationSchema`]) in its participant
//! crate (`twopc::participant::Operations`); the coordinator learns the schemas from its configuration
//! (`SERVICE_OPERATIONS`, JSON `{"service": [schema, ...]}`), so that adding a service or an operation
//! changes no code of the coordinator. The coordinator refuses an operation its service does not declare,
//! or whose fields do not match the schema, with a 400 naming the field, before anything is written; what
//! only the participant can judge (the item's state) it judges at prepare.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value, json};

use crate::config::{self, ConfigError};
use crate::errors::{ErrorCode, Invalid};

/// Coordinator: each service's own operation kinds, JSON `{"service": [operation schema, ...]}`
/// ([`crate::custom`]); `{}` when no service has any.
pub const SERVICE_OPERATIONS: &str = "SERVICE_OPERATIONS";

/// The kinds every participant speaks, each with the fields it takes (`Operation::FIELDS`): a service's
/// own kind may not take one of their names.
pub const BUILT_IN_KINDS: [(&str, &[&str]); 5] = [
    ("put", &["op", "key", "data", "ifNotExists"]),
    ("set", &["op", "key", "set"]),
    ("add", &["op", "key", "field", "delta", "min", "max"]),
    ("delete", &["op", "key"]),
    ("check", &["op", "key", "version", "exists"]),
];

/// One kind of operation a service speaks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationSchema {
    /// Its `op`: not one of the built-in kinds.
    pub op: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Its fields besides `op` and `key`.
    #[serde(default)]
    pub fields: BTreeMap<String, FieldSchema>,
    /// An operation of a resource beyond DynamoDB (try, confirm, cancel: `participant::resource`): it
    /// cannot commit atomically with the record, so a transaction with one is never committed in one phase.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resource: bool,
}

impl OperationSchema {
    /// This kind as a JSON Schema (draft 2020-12, as `openapi.yaml`'s), its `key` and object fields
    /// referring to that document's `Key` and `StoredValue`: what the parser accepts, never more.
    pub fn json_schema(&self) -> Value {
        let mut properties = Map::new();
        properties.insert("op".into(), json!({"const": self.op}));
        properties.insert("key".into(), json!({"$ref": "#/components/schemas/Key"}));
        let mut required = vec![json!("op"), json!("key")];
        for (name, field) in &self.fields {
            properties.insert(name.clone(), field.json_schema());
            if field.required {
                required.push(json!(name));
            }
        }
        let mut schema = json!({
            "type": "object",
            "additionalProperties": false,
            "required": required,
            "properties": properties,
        });
        if !self.description.is_empty() {
            schema["description"] = json!(self.description);
        }
        schema
    }
}

/// One field of a service's operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FieldSchema {
    #[serde(rename = "type")]
    pub kind: FieldType,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
    /// Numbers: the smallest and largest accepted (exact decimals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum: Option<Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum: Option<Number>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldType {
    String,
    /// A whole number (any size DynamoDB stores).
    Integer,
    /// An exact decimal.
    Number,
    Boolean,
    /// A JSON object (stored as a map).
    Object,
}

/// The custom operation kinds of one service.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Catalog {
    kinds: BTreeMap<String, OperationSchema>,
    /// Every kind accepted, its fields unchecked: a commit or an abort, whose prepare was judged already
    /// (a participant redeployed since must still finish what it voted for).
    any: bool,
}

impl Catalog {
    /// A service's kinds; refuses one named like a built-in kind, an empty name, twice the same kind, or a
    /// field named `op` or `key`.
    pub fn new(schemas: Vec<OperationSchema>) -> Result<Catalog, String> {
        let mut kinds = BTreeMap::new();
        for schema in schemas {
            if schema.op.is_empty() || BUILT_IN_KINDS.iter().any(|(name, _)| *name == schema.op) {
                return Err(format!("operation kind {:?} is empty or a built-in kind", schema.op));
            }
            if let Some(field) = schema.fields.keys().find(|f| *f == "op" || *f == "key" || f.is_empty()) {
                return Err(format!(
                    "operation {:?} names a field {field:?}: op and key are the operation's own",
                    schema.op
                ));
            }
            let op = schema.op.clone();
            if kinds.insert(op.clone(), schema).is_some() {
                return Err(format!("operation kind {op:?} is declared twice"));
            }
        }
        Ok(Catalog { kinds, any: false })
    }

    /// Every kind, its fields unchecked.
    pub fn any() -> Catalog {
        Catalog { kinds: BTreeMap::new(), any: true }
    }

    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty() && !self.any
    }

    pub fn schema(&self, kind: &str) -> Option<&OperationSchema> {
        self.kinds.get(kind)
    }

    pub fn schemas(&self) -> impl Iterator<Item = &OperationSchema> {
        self.kinds.values()
    }

    /// The fields of `object` (an operation of kind `kind`, `op` and `key` aside), checked against the
    /// kind's schema: every field declared, the required ones present, each of its type and range.
    pub(crate) fn fields(
        &self,
        kind: &str,
        object: &Map<String, Value>,
        path: &str,
    ) -> Result<Map<String, Value>, Invalid> {
        let own: Map<String, Value> = object
            .iter()
            .filter(|(name, _)| *name != "op" && *name != "key")
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        if self.any {
            return Ok(own);
        }
        let Some(schema) = self.kinds.get(kind) else {
            let known: Vec<&str> = self.kinds.keys().map(String::as_str).collect();
            return Err(Invalid::new(
                ErrorCode::UnknownOperation,
                format!(
                    "{path}.op: unknown operation \"{kind}\" for this service; expected put, set, add, delete or check{}",
                    if known.is_empty() { String::new() } else { format!(", or one of its own: {}", known.join(", ")) }
                ),
            ));
        };
        if let Some(extra) = own.keys().find(|f| !schema.fields.contains_key(*f)) {
            return Err(invalid(path, format!("unexpected field \"{extra}\" for op \"{kind}\"")));
        }
        for (name, field) in &schema.fields {
            let at = format!("{path}.{name}");
            match own.get(name) {
                None | Some(Value::Null) if field.required => {
                    return Err(invalid(path, format!("missing \"{name}\" (op \"{kind}\" requires it)")));
                }
                None | Some(Value::Null) => {}
                Some(value) => field.check(value, &at)?,
            }
        }
        Ok(own)
    }
}

impl FieldSchema {
    fn json_schema(&self) -> Value {
        let mut schema = match self.kind {
            FieldType::String => json!({"type": "string"}),
            FieldType::Integer => json!({"type": "integer"}),
            FieldType::Number => json!({"type": "number"}),
            FieldType::Boolean => json!({"type": "boolean"}),
            FieldType::Object => json!({
                "type": "object",
                "propertyNames": {"minLength": 1},
                "additionalProperties": {"$ref": "#/components/schemas/StoredValue"},
            }),
        };
        if let Some(minimum) = &self.minimum {
            schema["minimum"] = Value::Number(minimum.clone());
        }
        if let Some(maximum) = &self.maximum {
            schema["maximum"] = Value::Number(maximum.clone());
        }
        if !self.description.is_empty() {
            schema["description"] = json!(self.description);
        }
        schema
    }

    fn check(&self, value: &Value, at: &str) -> Result<(), Invalid> {
        let ok = match self.kind {
            FieldType::String => value.is_string(),
            FieldType::Boolean => value.is_boolean(),
            FieldType::Object => value.is_object(),
            FieldType::Integer | FieldType::Number => value.is_number(),
        };
        if !ok {
            let expected = match self.kind {
                FieldType::String => "a string",
                FieldType::Boolean => "true or false",
                FieldType::Object => "an object",
                FieldType::Integer => "a whole number",
                FieldType::Number => "a number",
            };
            return Err(invalid(at, format!("must be {expected}")));
        }
        if let Value::Number(number) = value {
            let decimal: crate::decimal::Decimal = number.to_string().parse().map_err(|e| invalid(at, e))?;
            if self.kind == FieldType::Integer && !decimal.value().is_integer() {
                return Err(invalid(at, "must be a whole number"));
            }
            let bound = |b: &Number| b.to_string().parse::<crate::decimal::Decimal>().ok();
            if let Some(min) = self.minimum.as_ref().and_then(bound)
                && decimal.value() < min.value()
            {
                return Err(invalid(at, format!("must be at least {min}")));
            }
            if let Some(max) = self.maximum.as_ref().and_then(bound)
                && decimal.value() > max.value()
            {
                return Err(invalid(at, format!("must be at most {max}")));
            }
        }
        Ok(())
    }
}

fn invalid(path: &str, message: impl std::fmt::Display) -> Invalid {
    Invalid::new(ErrorCode::InvalidRequest, format!("{path}: {message}"))
}

/// Every service's custom operations, as the coordinator's `SERVICE_OPERATIONS` gives them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Catalogs {
    services: BTreeMap<String, Catalog>,
}

impl Catalogs {
    /// `{"service": [schema, ...], ...}`.
    pub fn parse(text: &str) -> Result<Catalogs, String> {
        let declared: BTreeMap<String, Vec<OperationSchema>> =
            serde_json::from_str(text).map_err(|e| format!("expected {{\"service\": [operation schemas]}}: {e}"))?;
        let mut services = BTreeMap::new();
        for (service, schemas) in declared {
            services.insert(service.clone(), Catalog::new(schemas).map_err(|e| format!("{service}: {e}"))?);
        }
        Ok(Catalogs { services })
    }

    pub fn insert(&mut self, service: impl Into<String>, catalog: Catalog) {
        self.services.insert(service.into(), catalog);
    }

    /// A service's catalog (an empty one for a service that declares none).
    pub fn of(&self, service: &str) -> &Catalog {
        static EMPTY: std::sync::OnceLock<Catalog> = std::sync::OnceLock::new();
        self.services.get(service).unwrap_or_else(|| EMPTY.get_or_init(Catalog::default))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Catalog)> {
        self.services.iter()
    }

    /// The configuration's form: what `SERVICE_OPERATIONS` takes.
    pub fn to_json(&self) -> Value {
        Value::Object(
            self.services
                .iter()
                .map(|(s, c)| {
                    (s.clone(), serde_json::to_value(c.schemas().collect::<Vec<_>>()).expect("schemas serialize"))
                })
                .collect(),
        )
    }
}

/// The services' own operation kinds (`SERVICE_OPERATIONS`; none when unset or empty).
pub fn catalogs_from_env() -> Result<Catalogs, ConfigError> {
    match std::env::var(SERVICE_OPERATIONS) {
        Ok(text) if !text.trim().is_empty() => config::parsed(SERVICE_OPERATIONS, Catalogs::parse(&text)),
        _ => Ok(Catalogs::default()),
    }
}
