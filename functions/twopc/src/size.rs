//! How many bytes DynamoDB counts for an item, against its 400 KB limit.
//!
//! DynamoDB sizes an item differently from its JSON: every attribute costs its name's bytes and its
//! value's; a list or map costs 3 bytes and 1 more per element; a number is stored as base-100
//! digit pairs. The rules below are DynamoDB's documented ones, made exact for numbers, and
//! `tests/tests/limits.rs` holds them to DynamoDB Local byte for byte: an item this module sizes at
//! 409,600 bytes is stored, one of 409,601 is refused.

use aws_sdk_dynamodb::types::AttributeValue;

use crate::store::Item;

/// DynamoDB's limit on an item: 400 KB of 1,024 bytes.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// The bytes DynamoDB counts for an item: each attribute's name and value.
pub fn item_size(item: &Item) -> usize {
    item.iter().map(|(name, value)| name.len() + value_size(value)).sum()
}

/// The bytes DynamoDB counts for one value (without the name of the attribute that holds it).
pub fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(text) => text.len(),
        AttributeValue::N(number) => number_size(number),
        AttributeValue::B(blob) => blob.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::L(items) => 3 + items.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        AttributeValue::M(map) => 3 + map.iter().map(|(name, v)| 1 + name.len() + value_size(v)).sum::<usize>(),
        AttributeValue::Ss(items) => items.iter().map(String::len).sum(),
        AttributeValue::Ns(items) => items.iter().map(|n| number_size(n)).sum(),
        AttributeValue::Bs(blobs) => blobs.iter().map(|b| b.as_ref().len()).sum(),
        // A type this SDK does not know: count it as the largest scalar, so no bound is ever too low.
        _ => MAX_NUMBER_BYTES,
    }
}

/// The most bytes a number takes: 38 significant digits spread over 20 base-100 pairs, and one byte of
/// exponent.
pub const MAX_NUMBER_BYTES: usize = 21;

/// A number's size: one byte of exponent, one per base-100 digit pair (the digits aligned so that the
/// exponent is even, leading and trailing zero pairs dropped), and for a negative number one byte that
/// ends it unless all 20 pairs are used. Zero is one byte. Text that is not a number (DynamoDB refuses
/// it anyway) is counted as the largest number.
pub fn number_size(text: &str) -> usize {
    let Some((negative, digits, exponent)) = decompose(text) else { return MAX_NUMBER_BYTES };
    if digits.is_empty() {
        return 1;
    }
    // value = 0.digits × 10^exponent; with an odd exponent the first pair holds one digit.
    let aligned = digits.len() + usize::from(exponent.rem_euclid(2) == 1);
    let pairs = aligned.div_ceil(2);
    (1 + pairs + usize::from(negative && pairs < 20)).min(MAX_NUMBER_BYTES)
}

/// A decimal's sign, significant digits (no leading or trailing zeros) and exponent `e` such that the
/// value is `0.digits × 10^e`.
fn decompose(text: &str) -> Option<(bool, Vec<u8>, i64)> {
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], rest[at + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if whole.is_empty() && fraction.is_empty() || !whole.bytes().chain(fraction.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let all: Vec<u8> = whole.bytes().chain(fraction.bytes()).collect();
    let leading = all.iter().take_while(|&&d| d == b'0').count();
    let significant: Vec<u8> = all[leading..].to_vec();
    let trailing = significant.iter().rev().take_while(|&&d| d == b'0').count();
    let digits = significant[..significant.len() - trailing].to_vec();
    // The point sits after `whole`: 0.digits × 10^(whole.len() - leading + exp).
    let exponent = whole.len() as i64 - leading as i64 + exp;
    Some((negative && !digits.is_empty(), digits, exponent))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes read off DynamoDB Local 3.1 (the largest string that still fits beside each value).
    #[test]
    fn numbers_take_the_bytes_dynamodb_counts() {
        for (number, bytes) in [
            ("0", 1),
            ("-0.00", 1),
            ("1", 2),
            ("12", 2),
            ("123", 3),
            ("1234", 3),
            ("100", 2),
            ("0.1", 2),
            ("1.5", 3),
            ("-1", 3),
            ("1E-130", 2),
            ("1234567890123", 8),
            ("99999999999999999999999999999999999999", 20),
            ("-99999999999999999999999999999999999999", 21),
            ("-9.9999999999999999999999999999999999999E+125", 21),
            ("-9.9999999999999999999999999999999999999E+124", 21),
            ("1.2345678901234567890123456789012345678", 21),
            ("-1.2345678901234567890123456789012345678", 21),
        ] {
            assert_eq!(number_size(number), bytes, "{number}");
        }
    }

    #[test]
    fn lists_and_maps_cost_three_bytes_and_one_per_element() {
        let n1 = || AttributeValue::N("1".into());
        assert_eq!(value_size(&AttributeValue::L(vec![])), 3);
        assert_eq!(value_size(&AttributeValue::L(vec![AttributeValue::L(vec![])])), 7);
        assert_eq!(value_size(&AttributeValue::L(vec![n1(), n1()])), 9);
        assert_eq!(value_size(&AttributeValue::M([("ab".to_owned(), AttributeValue::S("xyz".into()))].into())), 9);
        assert_eq!(value_size(&AttributeValue::L(vec![AttributeValue::Null(true); 10])), 23);
        assert_eq!(value_size(&AttributeValue::S("é".into())), 2);
        let item = Item::from([("id".to_owned(), AttributeValue::S("a".into())), ("e".to_owned(), n1())]);
        assert_eq!(item_size(&item), 2 + 1 + 1 + 2);
    }
}
