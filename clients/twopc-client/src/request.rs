//! The body of `POST /transactions`, built without HTTP: the same value serves the REST API and an
//! in-process coordinator.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

/// An exact decimal, written as a JSON number with exactly its digits. Made from an integer, or
/// parsed from decimal text (`"0.1".parse()`), never from a float: `0.1` added ten times is 1.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Decimal(serde_json::Number);

/// Text that is not a JSON number (`"1,5"`, `"ten"`, `" 1"`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a decimal number (JSON number syntax, like -12.50 or 1e3)")]
pub struct NotADecimal(pub String);

impl Decimal {
    /// The decimal text as written on the wire.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl FromStr for Decimal {
    type Err = NotADecimal;
    fn from_str(text: &str) -> Result<Decimal, NotADecimal> {
        // serde_json would accept surrounding whitespace; a decimal is the number alone.
        if text.trim() != text {
            return Err(NotADecimal(text.to_owned()));
        }
        serde_json::from_str(text).map(Decimal).map_err(|_| NotADecimal(text.to_owned()))
    }
}

impl TryFrom<&str> for Decimal {
    type Error = NotADecimal;
    fn try_from(text: &str) -> Result<Decimal, NotADecimal> {
        text.parse()
    }
}

macro_rules! decimal_from_integers {
    ($($t:ty),*) => {$(
        impl From<$t> for Decimal {
            fn from(n: $t) -> Decimal {
                Decimal(serde_json::Number::from(n))
            }
        }
    )*};
}
decimal_from_integers!(i8, i16, i32, i64, isize, u8, u16, u32, u64, usize);

impl std::ops::Neg for Decimal {
    type Output = Decimal;
    /// The same digits with the other sign: exact, whatever their number.
    fn neg(self) -> Decimal {
        let text = self.as_str();
        let negated = text.strip_prefix('-').map_or_else(|| format!("-{text}"), str::to_owned);
        negated.parse().expect("a number with its sign flipped is a number")
    }
}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Decimal> for Value {
    fn from(d: Decimal) -> Value {
        Value::Number(d.0)
    }
}

/// The key of the item an operation targets: the table's key attributes. The seed tables are keyed
/// by `entityId`, so a string is that key: `Key::from("A")` is `{"entityId": "A"}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Key(Map<String, Value>);

impl Key {
    /// `{"entityId": id}`.
    pub fn entity(id: impl Into<String>) -> Key {
        Key::attribute("entityId", id.into())
    }

    /// A key of one attribute with any name.
    pub fn attribute(name: impl Into<String>, value: impl Into<Value>) -> Key {
        Key(Map::from_iter([(name.into(), value.into())]))
    }

    /// Another attribute (a sort key, for a table that has one).
    pub fn and(mut self, name: impl Into<String>, value: impl Into<Value>) -> Key {
        self.0.insert(name.into(), value.into());
        self
    }

    pub fn attributes(&self) -> &Map<String, Value> {
        &self.0
    }
}

impl From<&str> for Key {
    fn from(id: &str) -> Key {
        Key::entity(id)
    }
}

impl From<String> for Key {
    fn from(id: String) -> Key {
        Key::entity(id)
    }
}

impl From<&String> for Key {
    fn from(id: &String) -> Key {
        Key::entity(id.as_str())
    }
}

/// One operation of a participant, as the contract writes it (`{"op": "add", "key": ..., ...}`).
/// Made with the builders of [`op`](crate::op): the five built-in kinds, and a service's own kinds
/// ([`op::custom`], or a typed builder such as [`op::inventory`]). A later version may add variants (a
/// match needs a wildcard arm).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
#[non_exhaustive]
pub enum Operation {
    Put(op::Put),
    Set(op::Set),
    Add(op::Add),
    Delete(op::Delete),
    Check(op::Check),
    /// A service's own kind: written as it is, its `op` included.
    #[serde(untagged)]
    Custom(op::Custom),
}

impl Operation {
    pub fn key(&self) -> &Key {
        match self {
            Operation::Put(o) => &o.key,
            Operation::Set(o) => &o.key,
            Operation::Add(o) => &o.key,
            Operation::Delete(o) => &o.key,
            Operation::Check(o) => &o.key,
            Operation::Custom(o) => &o.key,
        }
    }
}

/// Builders of the five operations. Each converts into an [`Operation`].
pub mod op {
    use super::*;

    /// `put`: replaces the item's `data` (creates the item).
    pub fn put(key: impl Into<Key>, data: Value) -> Put {
        Put { key: key.into(), data, if_not_exists: None }
    }

    /// `set`: sets fields of the item's `data`; add them with [`Set::field`].
    pub fn set(key: impl Into<Key>) -> Set {
        Set { key: key.into(), set: Map::new() }
    }

    /// `add`: `data.field += delta`; bound the result with [`Add::min`] and [`Add::max`].
    pub fn add(key: impl Into<Key>, field: impl Into<String>, delta: impl Into<Decimal>) -> Add {
        Add { key: key.into(), field: field.into(), delta: delta.into(), min: None, max: None }
    }

    /// `delete`: removes the item.
    pub fn delete(key: impl Into<Key>) -> Delete {
        Delete { key: key.into() }
    }

    /// `check`: a read-only vote; state what must hold with [`Check::version`] and [`Check::exists`].
    pub fn check(key: impl Into<Key>) -> Check {
        Check { key: key.into(), version: None, exists: None }
    }

    /// A service's own operation kind (`{"op": kind, "key": ..., field: value, ...}`), as the service
    /// declares it; add its fields with [`Custom::field`]. The coordinator checks them against the
    /// service's schema (a 400 naming the field), the service's participant judges the rest.
    ///
    /// ```
    /// use twopc_client::op;
    ///
    /// let reserve = op::custom("reserve", "SKU-1").field("quantity", 3);
    /// assert_eq!(
    ///     serde_json::to_string(&twopc_client::Operation::from(reserve)).unwrap(),
    ///     r#"{"op":"reserve","key":{"entityId":"SKU-1"},"quantity":3}"#
    /// );
    /// ```
    pub fn custom(kind: impl Into<String>, key: impl Into<Key>) -> Custom {
        Custom { op: kind.into(), key: key.into(), fields: Map::new() }
    }

    #[derive(Debug, Clone, PartialEq, Serialize)]
    pub struct Custom {
        pub op: String,
        pub key: Key,
        #[serde(flatten)]
        pub fields: Map<String, Value>,
    }

    impl Custom {
        /// Sets one of the operation's fields. A number that must stay exact goes in as a [`Decimal`].
        pub fn field(mut self, name: impl Into<String>, value: impl Into<Value>) -> Custom {
            self.fields.insert(name.into(), value.into());
            self
        }
    }

    /// The example inventory service's operations (`functions/inventory`), typed: its SKUs are keyed
    /// by `entityId`, quantities are whole units, at least 1.
    pub mod inventory {
        use super::Custom;

        /// The service's name in the example deployment's registry.
        pub const SERVICE: &str = "inventory";

        /// `reserve`: `stock` down by `quantity`, `reserved` up by it. Refused unless the SKU is active
        /// (`RULE`, service code `INACTIVE`) and has the stock (`CONDITION_FAILED`, with the numbers).
        pub fn reserve(sku: impl Into<String>, quantity: u64) -> Custom {
            super::custom("reserve", sku.into()).field("quantity", quantity)
        }

        /// `release`: the reverse of a reservation; never more than is reserved.
        pub fn release(sku: impl Into<String>, quantity: u64) -> Custom {
            super::custom("release", sku.into()).field("quantity", quantity)
        }
    }

    #[derive(Debug, Clone, PartialEq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Put {
        pub key: Key,
        pub data: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub if_not_exists: Option<bool>,
    }

    impl Put {
        /// Refused (`CONDITION_FAILED`) when the item exists.
        pub fn if_not_exists(mut self) -> Put {
            self.if_not_exists = Some(true);
            self
        }
    }

    #[derive(Debug, Clone, PartialEq, Serialize)]
    pub struct Set {
        pub key: Key,
        pub set: Map<String, Value>,
    }

    impl Set {
        /// Sets `data.name`. A number that must stay exact goes in as a [`Decimal`].
        pub fn field(mut self, name: impl Into<String>, value: impl Into<Value>) -> Set {
            self.set.insert(name.into(), value.into());
            self
        }
    }

    #[derive(Debug, Clone, PartialEq, Serialize)]
    pub struct Add {
        pub key: Key,
        pub field: String,
        pub delta: Decimal,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub min: Option<Decimal>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max: Option<Decimal>,
    }

    impl Add {
        /// Refused when the result would be below `min`.
        pub fn min(mut self, min: impl Into<Decimal>) -> Add {
            self.min = Some(min.into());
            self
        }
        /// Refused when the result would be above `max`.
        pub fn max(mut self, max: impl Into<Decimal>) -> Add {
            self.max = Some(max.into());
            self
        }
    }

    #[derive(Debug, Clone, PartialEq, Serialize)]
    pub struct Delete {
        pub key: Key,
    }

    #[derive(Debug, Clone, PartialEq, Serialize)]
    pub struct Check {
        pub key: Key,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub version: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub exists: Option<bool>,
    }

    impl Check {
        /// Holds when the item's `version` is this one.
        pub fn version(mut self, version: u64) -> Check {
            self.version = Some(version);
            self
        }
        /// Holds when the item exists (`true`) or does not (`false`).
        pub fn exists(mut self, exists: bool) -> Check {
            self.exists = Some(exists);
            self
        }
    }

    macro_rules! into_operation {
        ($($t:ident),*) => {$(
            impl From<$t> for Operation {
                fn from(o: $t) -> Operation {
                    Operation::$t(o)
                }
            }
        )*};
    }
    into_operation!(Put, Set, Add, Delete, Check, Custom);
}

/// A service and the operations it applies.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Participant {
    pub service: String,
    pub operations: Vec<Operation>,
}

impl Participant {
    pub fn new(service: impl Into<String>) -> Participant {
        Participant { service: service.into(), operations: Vec::new() }
    }

    /// One more operation (of any kind).
    pub fn op(mut self, operation: impl Into<Operation>) -> Participant {
        self.operations.push(operation.into());
        self
    }
}

/// A transaction request: the body of `POST /transactions`.
///
/// ```
/// use twopc_client::{Transaction, op};
///
/// let transfer = Transaction::new()
///     .participant("service-a", [op::add("A", "balance", -100).min(0)])
///     .participant("service-b", [op::add("B", "balance", 100)])
///     .timeout_ms(3000);
/// assert_eq!(
///     transfer.to_json().to_string(),
///     r#"{"participants":[{"service":"service-a","operations":[{"op":"add","key":{"entityId":"A"},"field":"balance","delta":-100,"min":0}]},{"service":"service-b","operations":[{"op":"add","key":{"entityId":"B"},"field":"balance","delta":100}]}],"timeoutMs":3000}"#
/// );
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Transaction {
    pub participants: Vec<Participant>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Hold the prepares this long for a later commit or abort (see [`Transaction::hold`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_ms: Option<u64>,
}

impl Transaction {
    pub fn new() -> Transaction {
        Transaction::default()
    }

    /// A participant and its operations (all of one kind here; mix kinds with [`Transaction::with`]).
    pub fn participant<O: Into<Operation>>(
        self,
        service: impl Into<String>,
        operations: impl IntoIterator<Item = O>,
    ) -> Transaction {
        let participant =
            Participant { service: service.into(), operations: operations.into_iter().map(Into::into).collect() };
        self.with(participant)
    }

    pub fn with(mut self, participant: Participant) -> Transaction {
        self.participants.push(participant);
        self
    }

    /// How long the participants have to prepare (the server's default when not set; at most 25 000).
    pub fn timeout_ms(mut self, timeout_ms: u64) -> Transaction {
        self.timeout_ms = Some(timeout_ms);
        self
    }

    /// Decide later: hold the prepares for `hold` instead of deciding at once. When every participant
    /// prepared, the answer is [`Outcome::Held`](crate::Outcome::Held) (202 `PREPARED`, with `holdUntil`),
    /// and the locks stay until [`Client::commit`](crate::Client::commit) or
    /// [`Client::abort`](crate::Client::abort) (the caller that submitted it only), or until `holdUntil`,
    /// after which it aborts. A refusal aborts at once, as ever. From 1 s to 24 h, and at most what each
    /// service in the transaction accepts (15 minutes unless it says otherwise): a longer hold is refused
    /// ([`Error::Invalid`](crate::Error::Invalid), naming the service and its maximum) before anything
    /// is locked. Sent as `holdMs`, in whole milliseconds.
    ///
    /// ```
    /// use std::time::Duration;
    /// use twopc_client::{Transaction, op};
    ///
    /// let order = Transaction::new()
    ///     .participant("inventory", [op::inventory::reserve("lamp", 2)])
    ///     .hold(Duration::from_secs(600));
    /// assert_eq!(order.to_json()["holdMs"], 600_000);
    /// ```
    pub fn hold(self, hold: Duration) -> Transaction {
        self.hold_ms(u64::try_from(hold.as_millis()).unwrap_or(u64::MAX))
    }

    /// [`Transaction::hold`], in milliseconds (`holdMs`).
    pub fn hold_ms(mut self, hold_ms: u64) -> Transaction {
        self.hold_ms = Some(hold_ms);
        self
    }

    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("a transaction request always serialises")
    }

    pub fn body_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a transaction request always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_operation_is_written_as_the_contract_writes_it() {
        let tx = Transaction::new()
            .with(
                Participant::new("service-a")
                    .op(op::put("A", json!({"balance": 500})).if_not_exists())
                    .op(op::set("B").field("owner", "Bob").field("limit", "12.50".parse::<Decimal>().unwrap()))
                    .op(op::add(Key::attribute("pk", "C").and("sk", 2), "balance", -5).min(0).max(1000))
                    .op(op::delete("D"))
                    .op(op::check("E").version(3).exists(true)),
            )
            .timeout_ms(3000);
        // Parsed from text: json!'s 12.50 would go through f64 and lose its trailing zero.
        let expected: Value = serde_json::from_str(
            r#"{"participants": [{"service": "service-a", "operations": [
                {"op": "put", "key": {"entityId": "A"}, "data": {"balance": 500}, "ifNotExists": true},
                {"op": "set", "key": {"entityId": "B"}, "set": {"owner": "Bob", "limit": 12.50}},
                {"op": "add", "key": {"pk": "C", "sk": 2}, "field": "balance", "delta": -5, "min": 0, "max": 1000},
                {"op": "delete", "key": {"entityId": "D"}},
                {"op": "check", "key": {"entityId": "E"}, "version": 3, "exists": true}
            ]}], "timeoutMs": 3000}"#,
        )
        .unwrap();
        assert_eq!(tx.to_json(), expected);
        assert_eq!(serde_json::from_slice::<Value>(&tx.body_bytes()).unwrap(), tx.to_json());
    }

    #[test]
    fn custom_operations_are_written_with_their_own_kind_and_fields() {
        let tx = Transaction::new().with(Participant::new("inventory").op(op::inventory::reserve("SKU-1", 3)).op(
            op::custom("label", Key::attribute("pk", "L")).field("text", "fragile").field("weight", Decimal::from(2)),
        ));
        let expected: Value = serde_json::from_str(
            r#"{"participants": [{"service": "inventory", "operations": [
                {"op": "reserve", "key": {"entityId": "SKU-1"}, "quantity": 3},
                {"op": "label", "key": {"pk": "L"}, "text": "fragile", "weight": 2}
            ]}]}"#,
        )
        .unwrap();
        assert_eq!(tx.to_json(), expected);
        assert_eq!(tx.participants[0].operations[0].key(), &Key::entity("SKU-1"));
    }

    #[test]
    fn optional_fields_are_left_out() {
        let tx = Transaction::new().participant("s", [op::check("E")]);
        assert_eq!(
            tx.to_json().to_string(),
            r#"{"participants":[{"service":"s","operations":[{"op":"check","key":{"entityId":"E"}}]}]}"#
        );
    }

    #[test]
    fn a_hold_is_written_in_whole_milliseconds() {
        let tx = Transaction::new().participant("s", [op::check("E")]).timeout_ms(3000).hold(Duration::from_secs(90));
        assert_eq!(
            tx.to_json().to_string(),
            r#"{"participants":[{"service":"s","operations":[{"op":"check","key":{"entityId":"E"}}]}],"timeoutMs":3000,"holdMs":90000}"#
        );
        assert_eq!(Transaction::new().hold_ms(1_000).hold_ms, Some(1_000));
        // Sub-millisecond parts are dropped, never rounded up past what was asked.
        assert_eq!(Transaction::new().hold(Duration::from_micros(1_500_999)).hold_ms, Some(1_500));
    }

    #[test]
    fn decimals_keep_their_digits() {
        let big: Decimal = "12345678901234567890123456789012345678".parse().unwrap();
        let tenth: Decimal = "0.1".parse().unwrap();
        let body = Transaction::new().participant("s", [op::add("A", "b", -tenth).max(big)]).body_bytes();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"participants":[{"service":"s","operations":[{"op":"add","key":{"entityId":"A"},"field":"b","delta":-0.1,"max":12345678901234567890123456789012345678}]}]}"#
        );
        assert_eq!((-Decimal::from(-30)).as_str(), "30");
        for bad in ["ten", "1,5", " 1", "1 ", "", "0x10", "NaN"] {
            assert_eq!(bad.parse::<Decimal>(), Err(NotADecimal(bad.to_owned())), "{bad:?}");
        }
    }
}
