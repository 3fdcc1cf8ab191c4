//! DynamoDB attribute values (as the Lambda stream event carries them) to plain JSON, exactly.
//!
//! Why not `serde_dynamo::from_item::<_, serde_json::Value>`: serde_dynamo 4 deserialises a number
//! by trying `i64`, then `u64`, then `f64` (`de/deserializer_number.rs`), so a 38-digit amount comes
//! out rounded through `f64` even with serde_json's `arbitrary_precision` (the test
//! `serde_dynamo_rounds_big_numbers` pins that down), and `B` becomes an array of byte numbers
//! instead of base64 text. This converter copies the decimal text of `N` into a JSON number
//! untouched, and encodes binaries as base64 strings, the way DynamoDB JSON shows them. Map keys come
//! out sorted, so the same item always gives the same bytes.

use std::collections::HashMap;
use std::str::FromStr;

use serde_dynamo::AttributeValue;
use serde_json::{Map, Number, Value};
use twopc::decimal::Decimal;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    #[error("attribute {path}: {text:?} is not a decimal number DynamoDB can hold")]
    Number { path: String, text: String },
}

/// An item (a `HashMap` of attribute values) as a JSON object with sorted keys.
pub fn item_to_json(item: &HashMap<String, AttributeValue>) -> Result<Value, ConvertError> {
    map_to_json(item)
}

/// One attribute value as JSON: `S` string, `N` number (exact decimal text), `B` base64 string,
/// `BOOL`, `NULL` null, `M` object, `L` array, `SS`/`NS`/`BS` arrays.
pub fn attribute_to_json(value: &AttributeValue) -> Result<Value, ConvertError> {
    to_json(value)
}

/// One step of a path: a map key or a list index.
enum Segment<'a> {
    Name(&'a str),
    Index(usize),
}

/// The path of a failure is built while the error travels up, so success allocates none.
fn within(segment: Segment<'_>) -> impl FnOnce(ConvertError) -> ConvertError + '_ {
    move |ConvertError::Number { path, text }| {
        let head = match segment {
            Segment::Name(name) => name.to_owned(),
            Segment::Index(i) => format!("[{i}]"),
        };
        let path =
            if path.is_empty() || path.starts_with('[') { format!("{head}{path}") } else { format!("{head}.{path}") };
        ConvertError::Number { path, text }
    }
}

fn map_to_json(map: &HashMap<String, AttributeValue>) -> Result<Value, ConvertError> {
    let mut names: Vec<&String> = map.keys().collect();
    names.sort_unstable();
    let mut out = Map::with_capacity(map.len());
    for name in names {
        let value = to_json(&map[name]).map_err(within(Segment::Name(name)))?;
        out.insert(name.clone(), value);
    }
    Ok(Value::Object(out))
}

fn to_json(value: &AttributeValue) -> Result<Value, ConvertError> {
    Ok(match value {
        AttributeValue::S(s) => Value::String(s.clone()),
        AttributeValue::N(n) => Value::Number(number(n, "")?),
        AttributeValue::B(b) => Value::String(aws_smithy_types::base64::encode(b)),
        AttributeValue::Bool(b) => Value::Bool(*b),
        AttributeValue::Null(_) => Value::Null,
        AttributeValue::M(m) => map_to_json(m)?,
        AttributeValue::L(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| to_json(v).map_err(within(Segment::Index(i))))
                .collect::<Result<_, _>>()?,
        ),
        AttributeValue::Ss(items) => Value::Array(items.iter().cloned().map(Value::String).collect()),
        AttributeValue::Ns(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, n)| number(n, "").map(Value::Number).map_err(within(Segment::Index(i))))
                .collect::<Result<_, _>>()?,
        ),
        AttributeValue::Bs(items) => {
            Value::Array(items.iter().map(|b| Value::String(aws_smithy_types::base64::encode(b))).collect())
        }
    })
}

/// A DynamoDB number as a JSON number with the same decimal text. serde_json's `arbitrary_precision`
/// keeps the text of a valid JSON number as is. DynamoDB stores numbers normalised, so they are JSON
/// numbers already; a form JSON does not allow (`+5`, `.5`, `5.`) is normalised through an exact
/// decimal rather than refused, if it is a number DynamoDB can hold: written out in full, one that
/// cannot (`+1e999999999`) would be gigabytes of digits.
pub fn number(text: &str, path: &str) -> Result<Number, ConvertError> {
    if let Ok(n) = Number::from_str(text) {
        return Ok(n);
    }
    let invalid = || ConvertError::Number { path: path.to_owned(), text: text.to_owned() };
    let decimal = Decimal::from_str(text).map_err(|_| invalid())?;
    Number::from_str(&decimal.to_string()).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> AttributeValue {
        AttributeValue::N(s.to_owned())
    }

    #[test]
    fn every_type_converts() {
        let mut inner = HashMap::new();
        inner.insert("z".to_owned(), n("1"));
        inner.insert("a".to_owned(), AttributeValue::S("x".into()));
        let mut item = HashMap::new();
        item.insert("s".to_owned(), AttributeValue::S("hello".into()));
        item.insert("n".to_owned(), n("-12.50"));
        item.insert("b".to_owned(), AttributeValue::B(b"this text is base64-encoded".to_vec()));
        item.insert("t".to_owned(), AttributeValue::Bool(true));
        item.insert("null".to_owned(), AttributeValue::Null(true));
        item.insert("m".to_owned(), AttributeValue::M(inner));
        item.insert("l".to_owned(), AttributeValue::L(vec![n("3"), AttributeValue::S("y".into())]));
        item.insert("ss".to_owned(), AttributeValue::Ss(vec!["a".into(), "b".into()]));
        item.insert("ns".to_owned(), AttributeValue::Ns(vec!["1".into(), "0.1".into()]));
        item.insert("bs".to_owned(), AttributeValue::Bs(vec![vec![0, 1, 2]]));
        let json = item_to_json(&item).unwrap();
        assert_eq!(
            serde_json::to_string(&json).unwrap(),
            r#"{"b":"dGhpcyB0ZXh0IGlzIGJhc2U2NC1lbmNvZGVk","bs":["AAEC"],"l":[3,"y"],"m":{"a":"x","z":1},"n":-12.50,"ns":[1,0.1],"null":null,"s":"hello","ss":["a","b"],"t":true}"#
        );
    }

    #[test]
    fn thirty_eight_digits_survive() {
        for (text, out) in [
            ("12345678901234567890123456789012345678", "12345678901234567890123456789012345678"),
            ("-0.0000000000000000000000000000000000001", "-0.0000000000000000000000000000000000001"),
            // serde_json writes the exponent marker in lower case; every digit is kept.
            ("9.9999999999999999999999999999999999999E+125", "9.9999999999999999999999999999999999999e+125"),
            ("0.1", "0.1"),
        ] {
            let json = attribute_to_json(&n(text)).unwrap();
            assert_eq!(serde_json::to_string(&json).unwrap(), out);
        }
    }

    #[test]
    fn forms_json_does_not_allow_are_normalised_exactly() {
        assert_eq!(number("+5", "").unwrap().to_string(), "5");
        assert_eq!(number(".50", "").unwrap().to_string(), "0.5");
        assert!(matches!(number("abc", "data.x"), Err(ConvertError::Number { path, .. }) if path == "data.x"));
    }

    /// Found by fuzz/stream_attribute: `" 733.000E7629172"` (not JSON, so normalised) came out
    /// as a plain number of 7.6 million digits; with a larger exponent, gigabytes. A number
    /// DynamoDB cannot hold never comes from a stream: it is refused, and what is taken stays short.
    #[test]
    fn forms_json_does_not_allow_are_refused_out_of_range() {
        for text in [" 733.000E7629172", "+1e999999999", ".1e-999999999", "+100e9223372036854775807"] {
            assert!(
                matches!(number(text, "data.x"), Err(ConvertError::Number { path, .. }) if path == "data.x"),
                "{text}"
            );
        }
        assert_eq!(number("+9.9e125", "").unwrap().to_string(), "9.9e+125");
    }

    #[test]
    fn bad_numbers_name_their_path() {
        let mut inner = HashMap::new();
        inner.insert("balance".to_owned(), n("NaN"));
        let mut item = HashMap::new();
        item.insert("data".to_owned(), AttributeValue::M(inner));
        let err = item_to_json(&item).unwrap_err();
        assert_eq!(err, ConvertError::Number { path: "data.balance".into(), text: "NaN".into() });
        let mut item = HashMap::new();
        item.insert("l".to_owned(), AttributeValue::L(vec![n("1"), AttributeValue::Ns(vec!["2".into(), "x".into()])]));
        let err = item_to_json(&item).unwrap_err();
        assert_eq!(err, ConvertError::Number { path: "l[1][1]".into(), text: "x".into() });
    }

    /// The reason this module exists: serde_dynamo turns numbers into i64/u64/f64 first.
    #[test]
    fn serde_dynamo_rounds_big_numbers() {
        let mut item = HashMap::new();
        item.insert("x".to_owned(), n("12345678901234567890123456789012345678"));
        let item = serde_dynamo::Item::from(item);
        let via_serde_dynamo: Value = serde_dynamo::from_item(item).unwrap();
        assert_ne!(via_serde_dynamo["x"].to_string(), "12345678901234567890123456789012345678");
    }
}
