//! The inventory service: a participant of its own, speaking its own operations.
//!
//! Its items are SKUs: `{"entityId": "SKU-1", "data": {"name": "Lamp", "stock": 10, "reserved": 0,
//! "active": true}}`. It reserves stock, and releases what was reserved:
//!
//! - `{"op": "reserve", "key": {"entityId": "SKU-1"}, "quantity": 3}`: `stock` down by 3, `reserved` up
//!   by 3. Only an active SKU can be reserved (`RULE`, service code `INACTIVE`), and stock never goes
//!   below zero (`CONDITION_FAILED`, with the numbers).
//! - `{"op": "release", "key": {"entityId": "SKU-1"}, "quantity": 3}`: the reverse; never more than is
//!   reserved.
//!
//! An item that is not a SKU (no numeric `stock` and `reserved`) is refused as `INVALID`.

use serde_json::{Map, Value, json};
use twopc::decimal::{BigDecimal, Decimal};
use twopc::model::Operation;
use twopc::participant::{FieldSchema, FieldType, OperationRefusal, OperationSchema, Operations, Prepared, Refusal};

/// The service's name in the coordinator's registry, and its table's.
pub const SERVICE: &str = "inventory";
pub const TABLE: &str = "inventory-data";

/// The inventory's operations.
#[derive(Debug, Clone, Copy, Default)]
pub struct Inventory;

impl Operations for Inventory {
    fn schemas(&self) -> Vec<OperationSchema> {
        let quantity = || {
            (
                "quantity".to_owned(),
                FieldSchema {
                    kind: FieldType::Integer,
                    required: true,
                    minimum: Some(1.into()),
                    maximum: None,
                    description: "how many units".into(),
                },
            )
        };
        vec![
            OperationSchema {
                op: "reserve".into(),
                description: "reserve units of an active SKU: stock down, reserved up; never below zero".into(),
                fields: [quantity()].into(),
                resource: false,
            },
            OperationSchema {
                op: "release".into(),
                description: "release reserved units: reserved down, stock up; never more than reserved".into(),
                fields: [quantity()].into(),
                resource: false,
            },
        ]
    }

    fn prepare(&self, prepared: &Prepared<'_>) -> Result<Map<String, Value>, OperationRefusal> {
        let Operation::Custom { kind, fields, .. } = prepared.operation else {
            return Err(OperationRefusal::Invalid("not an inventory operation".into()));
        };
        let sku = prepared.operation.key_text();
        let data =
            prepared.data.ok_or_else(|| OperationRefusal::ConditionFailed(format!("SKU {sku} does not exist")))?;
        let number = |name: &str| -> Result<BigDecimal, OperationRefusal> {
            data.get(name)
                .and_then(|v| v.as_number())
                .and_then(|n| n.to_string().parse::<Decimal>().ok())
                .map(|d| d.value().clone())
                .ok_or_else(|| OperationRefusal::Invalid(format!("{sku} is not a SKU: it has no number \"{name}\"")))
        };
        let (stock, reserved) = (number("stock")?, number("reserved")?);
        let quantity: BigDecimal =
            fields["quantity"].to_string().parse::<Decimal>().map_err(OperationRefusal::Invalid)?.value().clone();
        let (stock, reserved) = match kind.as_str() {
            "reserve" => {
                if data.get("active").and_then(Value::as_bool) != Some(true) {
                    return Err(OperationRefusal::Rule(Refusal::new("INACTIVE", format!("SKU {sku} is not active"))));
                }
                let left = &stock - &quantity;
                if left < 0 {
                    return Err(OperationRefusal::ConditionFailed(format!(
                        "stock {} - {} = {} is below zero on SKU {sku}",
                        plain(&stock),
                        plain(&quantity),
                        plain(&left)
                    )));
                }
                (left, &reserved + &quantity)
            }
            "release" => {
                let left = &reserved - &quantity;
                if left < 0 {
                    return Err(OperationRefusal::ConditionFailed(format!(
                        "reserved {} - {} = {} is below zero on SKU {sku}",
                        plain(&reserved),
                        plain(&quantity),
                        plain(&left)
                    )));
                }
                (&stock + &quantity, left)
            }
            other => return Err(OperationRefusal::Invalid(format!("the inventory has no operation \"{other}\""))),
        };
        let mut next = data.clone();
        next.insert("stock".into(), number_value(&stock));
        next.insert("reserved".into(), number_value(&reserved));
        Ok(next)
    }
}

fn plain(value: &BigDecimal) -> String {
    value.normalized().to_plain_string()
}

fn number_value(value: &BigDecimal) -> Value {
    plain(value).parse::<serde_json::Number>().map(Value::Number).unwrap_or(Value::Null)
}

/// A SKU's data as the service keeps it.
pub fn sku(name: &str, stock: u64, active: bool) -> Value {
    json!({"name": name, "stock": stock, "reserved": 0, "active": active})
}

/// `{"op": "reserve", ...}` of `quantity` units of `sku`.
pub fn reserve(sku: &str, quantity: u64) -> Value {
    json!({"op": "reserve", "key": {"entityId": sku}, "quantity": quantity})
}

/// `{"op": "release", ...}`.
pub fn release(sku: &str, quantity: u64) -> Value {
    json!({"op": "release", "key": {"entityId": sku}, "quantity": quantity})
}

/// What the coordinator's `SERVICE_OPERATIONS` holds for a deployment with this service
/// (`infra/service-operations.json`, which a test holds to this).
pub fn catalogs() -> twopc::custom::Catalogs {
    let mut catalogs = twopc::custom::Catalogs::default();
    let catalog = twopc::custom::Catalog::new(Inventory.schemas()).expect("the inventory's schemas are valid");
    catalogs.insert(SERVICE, catalog);
    catalogs
}
