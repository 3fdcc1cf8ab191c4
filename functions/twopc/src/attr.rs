//! Exact conversion between JSON values and DynamoDB attribute values.
//!
//! serde_dynamo cannot be used for business data here: with serde_json's `arbitrary_precision`
//! (which keeps amounts out of f64) it serializes a JSON number as a map with a private key, and it
//! deserializes `N` through i64/f64, so a 38-digit amount would not survive. This converter passes
//! the decimal text through untouched in both directions.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{Map, Number, Value};

/// JSON into an attribute value. Numbers keep their decimal text; objects become maps, arrays lists.
pub fn to_attribute(value: &Value) -> AttributeValue {
    match value {
        Value::Null => AttributeValue::Null(true),
        Value::Bool(b) => AttributeValue::Bool(*b),
        Value::Number(n) => AttributeValue::N(n.to_string()),
        Value::String(s) => AttributeValue::S(s.clone()),
        Value::Array(items) => AttributeValue::L(items.iter().map(to_attribute).collect()),
        Value::Object(map) => AttributeValue::M(to_item(map)),
    }
}

pub fn to_item(map: &Map<String, Value>) -> HashMap<String, AttributeValue> {
    map.iter().map(|(k, v)| (k.clone(), to_attribute(v))).collect()
}

/// An attribute value as JSON: sets become arrays, binary becomes base64 text, numbers stay exact.
pub fn to_json(value: &AttributeValue) -> Value {
    match value {
        AttributeValue::S(s) => Value::String(s.clone()),
        AttributeValue::N(n) => number(n),
        AttributeValue::Bool(b) => Value::Bool(*b),
        AttributeValue::Null(_) => Value::Null,
        AttributeValue::M(map) => Value::Object(item_to_json(map)),
        AttributeValue::L(items) => Value::Array(items.iter().map(to_json).collect()),
        AttributeValue::Ss(items) => Value::Array(items.iter().cloned().map(Value::String).collect()),
        AttributeValue::Ns(items) => Value::Array(items.iter().map(|n| number(n)).collect()),
        AttributeValue::B(blob) => Value::String(base64(blob)),
        AttributeValue::Bs(blobs) => Value::Array(blobs.iter().map(|b| Value::String(base64(b))).collect()),
        // A type added to DynamoDB after this SDK version: keep its debug form rather than fail.
        other => Value::String(format!("{other:?}")),
    }
}

/// Sorted by name so that the output is stable (hash maps have no order).
pub fn item_to_json(item: &HashMap<String, AttributeValue>) -> Map<String, Value> {
    let mut names: Vec<&String> = item.keys().collect();
    names.sort();
    names.into_iter().map(|k| (k.clone(), to_json(&item[k]))).collect()
}

fn number(text: &str) -> Value {
    // DynamoDB only returns valid numbers; with arbitrary_precision the text is kept as it is.
    text.parse::<Number>().map(Value::Number).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn base64(blob: &Blob) -> String {
    aws_smithy_types::base64::encode(blob.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_survive_exactly_both_ways() {
        let value: Value = serde_json::from_str(
            r#"{"big": 12345678901234567890123456789012345678, "tenth": 0.1, "neg": -1E-130, "nested": [1.50, {"x": 3}]}"#,
        )
        .unwrap();
        let attribute = to_attribute(&value);
        let AttributeValue::M(map) = &attribute else { panic!("expected a map") };
        assert_eq!(map["big"], AttributeValue::N("12345678901234567890123456789012345678".into()));
        assert_eq!(map["tenth"], AttributeValue::N("0.1".into()));
        assert_eq!(to_json(&attribute), value);
        assert_eq!(serde_json::to_string(&to_json(&map["big"])).unwrap(), "12345678901234567890123456789012345678");
    }

    #[test]
    fn sets_and_binary_become_arrays_and_base64() {
        let set = AttributeValue::Ns(vec!["1".into(), "2.5".into()]);
        assert_eq!(to_json(&set), json!([1, 2.5]));
        let blob = AttributeValue::B(Blob::new(b"hi".to_vec()));
        assert_eq!(to_json(&blob), json!("aGk="));
    }
}
