//! What the stream targets assert, shared by the byte-level and the structured target.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;

use aws_lambda_events::event::dynamodb::Event;
use bigdecimal::BigDecimal;
use serde_dynamo::AttributeValue;
use serde_json::{Number, Value};
use twopc::decimal::Decimal;
use twopc_fanout::convert::{self, ConvertError};
use twopc_fanout::{FanoutConfig, prepare};

/// The tables the seed events name: two participant tables and the transactions table.
pub fn fanout_config() -> FanoutConfig {
    let tables = BTreeMap::from([
        ("service-a".to_owned(), "service-a-data".to_owned()),
        ("service-b".to_owned(), "service-b-data".to_owned()),
    ]);
    FanoutConfig::new(&tables, "transactions").expect("a valid registry")
}

/// Whether the converter is expected to take this `N`: a JSON number as written, or a number
/// DynamoDB can hold in a form JSON does not allow (`+5`, `.5`), which it normalises.
fn convertible(text: &str) -> bool {
    Number::from_str(text).is_ok() || Decimal::from_str(text).is_ok()
}

fn all_convertible(value: &AttributeValue) -> bool {
    match value {
        AttributeValue::N(text) => convertible(text),
        AttributeValue::Ns(texts) => texts.iter().all(|t| convertible(t)),
        AttributeValue::M(map) => map.values().all(all_convertible),
        AttributeValue::L(items) => items.iter().all(all_convertible),
        _ => true,
    }
}

fn assert_same_number(text: &str, number: &Number) {
    let out = number.to_string();
    match (BigDecimal::from_str(text.trim()), BigDecimal::from_str(&out)) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "N {text:?} came out as {out}"),
        // Zero digits are zero under any exponent, even one past i64 (which an exact decimal cannot
        // parse): the converter writes it as zero.
        (Err(_), Ok(b)) if zero_digits(text) => assert_eq!(b, BigDecimal::from(0), "N {text:?} came out as {out}"),
        // Beyond what an exact decimal can parse (an exponent past i64): serde_json copies the
        // digits and writes the exponent its own way (`e+`).
        _ => {
            let exponent_form = |s: &str| s.to_ascii_lowercase().replace("e+", "e");
            assert_eq!(exponent_form(text), exponent_form(&out), "N {text:?} came out as {out}");
        }
    }
}

/// Whether a number's digits (before its exponent) are all zeros.
fn zero_digits(text: &str) -> bool {
    let mantissa = text.trim().split(['e', 'E']).next().unwrap_or_default();
    mantissa.chars().filter(char::is_ascii_digit).all(|d| d == '0')
}

/// `json` is what `attribute_to_json` made of `value`: every scalar is carried exactly (numbers by
/// value, binaries through base64) and maps come out with their keys sorted.
pub fn assert_converted(value: &AttributeValue, json: &Value) {
    let base64 = |bytes: &[u8], json: &Value| {
        let text = json.as_str().unwrap_or_else(|| panic!("B came out as {json}"));
        assert_eq!(aws_smithy_types::base64::decode(text).ok().as_deref(), Some(bytes), "B came out as {text:?}");
    };
    match (value, json) {
        (AttributeValue::S(s), Value::String(out)) => assert_eq!(s, out),
        (AttributeValue::N(text), Value::Number(number)) => assert_same_number(text, number),
        (AttributeValue::B(bytes), json) => base64(bytes, json),
        (AttributeValue::Bool(b), Value::Bool(out)) => assert_eq!(b, out),
        (AttributeValue::Null(_), Value::Null) => {}
        (AttributeValue::M(map), Value::Object(out)) => {
            assert_eq!(map.len(), out.len(), "M has {} entries, its JSON {}", map.len(), out.len());
            assert!(out.keys().is_sorted(), "M's keys are not sorted: {:?}", out.keys().collect::<Vec<_>>());
            for (name, value) in map {
                assert_converted(value, out.get(name).unwrap_or_else(|| panic!("M lost {name:?}")));
            }
        }
        (AttributeValue::L(items), Value::Array(out)) => {
            assert_eq!(items.len(), out.len());
            items.iter().zip(out).for_each(|(value, json)| assert_converted(value, json));
        }
        (AttributeValue::Ss(items), Value::Array(out)) => {
            assert_eq!(items.iter().map(|s| Value::String(s.clone())).collect::<Vec<_>>(), *out);
        }
        (AttributeValue::Ns(items), Value::Array(out)) => {
            assert_eq!(items.len(), out.len());
            for (text, json) in items.iter().zip(out) {
                let Value::Number(number) = json else { panic!("NS member {text:?} came out as {json}") };
                assert_same_number(text, number);
            }
        }
        (AttributeValue::Bs(items), Value::Array(out)) => {
            assert_eq!(items.len(), out.len());
            items.iter().zip(out).for_each(|(bytes, json)| base64(bytes, json));
        }
        (value, json) => panic!("{value:?} came out as {json}"),
    }
}

/// Converts an item and checks the result: exact when every number is a decimal, an error naming a
/// number that is not otherwise, and the same bytes whatever order the map was built in.
pub fn check_item(item: &HashMap<String, AttributeValue>) {
    let expected_ok = item.values().all(all_convertible);
    match convert::item_to_json(item) {
        Ok(json) => {
            assert!(expected_ok, "an item with a number that is not a decimal converted: {json}");
            assert_converted(&AttributeValue::M(item.clone()), &json);
            // A new map has its own hasher, so another iteration order.
            let rebuilt: HashMap<String, AttributeValue> = item.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let again = convert::item_to_json(&rebuilt).expect("the same item converts again");
            assert_eq!(serde_json::to_string(&json).unwrap(), serde_json::to_string(&again).unwrap());
        }
        Err(ConvertError::Number { path, text }) => {
            assert!(!expected_ok, "a convertible item was refused at {path}: {text:?}");
            assert!(!convertible(&text), "the error at {path} names a number that converts: {text:?}");
        }
    }
}

/// Decides a batch and checks what it comes to: every record is counted once, every lake line is
/// one JSON object on one line, and every message is the JSON its subscribers parse.
pub fn check_event(event: &Event) {
    for record in &event.records {
        for image in [&record.change.keys, &record.change.new_image, &record.change.old_image] {
            check_item(image.inner());
        }
    }
    let batch = prepare(&fanout_config(), event);
    assert_eq!(
        batch.commits + batch.outcomes + batch.skipped + batch.foreign + batch.unprocessable.len(),
        event.records.len(),
        "records counted other than once"
    );
    // A line per commit, and one per committed transaction (its own, `"kind": "transaction"`).
    assert_eq!(batch.lines.len(), batch.commits + batch.transaction_lines);
    assert!(batch.transaction_lines <= batch.outcomes);
    assert_eq!(batch.line_records.len(), batch.lines.len());
    for (line, &index) in batch.lines.iter().zip(&batch.line_records) {
        let (last, body) = line.split_last().expect("a lake line is not empty");
        assert_eq!(*last, b'\n', "a lake line ends with a newline");
        assert!(!body.contains(&b'\n'), "a lake line holds a newline: Firehose would split it");
        let json: Value = serde_json::from_slice(body).expect("a lake line is JSON");
        let record = &event.records[index];
        assert_eq!(json["eventId"], record.event_id.as_str());
        if json["kind"] == "transaction" {
            assert!(json["participants"].is_array(), "a transaction line names its participants: {json}");
            continue;
        }
        let keys = convert::item_to_json(record.change.keys.inner()).expect("a commit's keys convert");
        assert_eq!(json["key"], keys, "the lake line's key is not the record's Keys");
    }
    for message in &batch.messages {
        let json: Value = serde_json::from_slice(&message.payload).expect("a WebSocket message is JSON");
        assert!(matches!(json["type"].as_str(), Some("commit" | "transaction")), "message {json}");
    }
}
