//! Exact decimal numbers as DynamoDB holds them: up to 38 significant digits, never through f64.

use std::fmt;
use std::str::FromStr;

/// For a service's rules to compare amounts exactly (`delta.value() < &BigDecimal::from(0)`).
pub use bigdecimal::BigDecimal;
use bigdecimal::Zero;
use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::errors::{ErrorCode, Invalid};

/// A number DynamoDB can store, with its original decimal text kept for the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decimal {
    text: String,
    value: BigDecimal,
}

const MAX_DIGITS: u64 = 38;

impl Decimal {
    pub fn value(&self) -> &BigDecimal {
        &self.value
    }

    pub fn from_big(value: BigDecimal) -> Result<Decimal, String> {
        check_range(&value)?;
        let value = value.normalized();
        Ok(Decimal { text: plain_text(&value), value })
    }

    /// A JSON number (or a string holding one, as some clients send money) as an exact decimal.
    pub fn parse_json(value: Option<&Value>, path: &str) -> Result<Option<Decimal>, Invalid> {
        let text = match value {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(Invalid::new(ErrorCode::InvalidRequest, format!("{path}: must be a number"))),
        };
        text.parse::<Decimal>().map(Some).map_err(|e| Invalid::new(ErrorCode::InvalidRequest, format!("{path}: {e}")))
    }
}

/// Takes the value as written, not normalised: normalising `100e9223372036854775807` moves its
/// exponent past i64, so the range is checked first, on the exponent of the leading digit (which
/// trailing zeros do not move), in i128.
fn check_range(value: &BigDecimal) -> Result<(), String> {
    if value.is_zero() {
        return Ok(());
    }
    // DynamoDB's range: 1E-130 <= |n| < 1E126.
    let exponent = i128::from(value.digits()) - i128::from(value.fractional_digit_count()) - 1;
    if !(-130..=125).contains(&exponent) {
        return Err("is outside DynamoDB's range of 1E-130 to 9.9E125".to_owned());
    }
    let digits = value.normalized().digits();
    if digits > MAX_DIGITS {
        return Err(format!("has {digits} significant digits; DynamoDB numbers hold at most {MAX_DIGITS}"));
    }
    Ok(())
}

/// For a decimal written with an exponent that does not fit i64: whether its digits are all zero.
/// None for any other text.
fn beyond_any_exponent(text: &str) -> Option<bool> {
    let (mantissa, exponent) = text.split_once(['e', 'E'])?;
    let exponent_digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    let fits = exponent.parse::<i64>().is_ok();
    if fits || exponent_digits.is_empty() || !exponent_digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if mantissa.contains(['e', 'E', 'x', 'X', '_']) {
        return None;
    }
    let mantissa = BigDecimal::from_str(mantissa).ok()?;
    Some(mantissa.is_zero())
}

/// Decimal text without an exponent when it is short enough, which DynamoDB and people both read.
fn plain_text(value: &BigDecimal) -> String {
    let text = value.to_plain_string();
    if text.len() <= 64 { text } else { value.to_scientific_notation() }
}

impl FromStr for Decimal {
    type Err = String;
    fn from_str(text: &str) -> Result<Decimal, String> {
        let trimmed = text.trim();
        let value = match BigDecimal::from_str(trimmed) {
            Ok(value) => value,
            // An exponent past i64 (which BigDecimal cannot read) on a well-formed decimal: zero, or far
            // outside DynamoDB's range, which is what the caller must be told.
            Err(_) => match beyond_any_exponent(trimmed) {
                Some(true) => return "0".parse(),
                Some(false) => return Err("is outside DynamoDB's range of 1E-130 to 9.9E125".to_owned()),
                None => return Err(format!("\"{text}\" is not a number")),
            },
        };
        if trimmed.is_empty() || trimmed.contains(['x', 'X', '_']) {
            return Err(format!("\"{text}\" is not a number"));
        }
        check_range(&value)?;
        // Normalised, the scale is bounded by the range (a zero's is 0): the scale of `0e-999999999`
        // as written would make every sum or comparison with it work on a billion digits.
        let value = value.normalized();
        // The text goes out as a JSON number (to participants, into the request hash), so it is kept
        // as serde_json writes it (`1E+5` as `1e+5`), to read back the same; a form JSON has no
        // number for (`+5`, `.5`, `5.`, `02`) is written as the exact decimal it stands for.
        let text = match serde_json::Number::from_str(trimmed) {
            Ok(number) => number.to_string(),
            Err(_) => plain_text(&value),
        };
        Ok(Decimal { text, value })
    }
}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for Decimal {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let number: serde_json::Number = self.text.parse().map_err(serde::ser::Error::custom)?;
        number.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_dynamodbs() {
        assert!("12345678901234567890123456789012345678".parse::<Decimal>().is_ok());
        assert!("123456789012345678901234567890123456789".parse::<Decimal>().unwrap_err().contains("38"));
        assert!("1e200".parse::<Decimal>().is_err());
        assert!("ten".parse::<Decimal>().is_err());
        assert_eq!("-0.10".parse::<Decimal>().unwrap().to_string(), "-0.10");
    }

    /// Found by fuzz/request_parser: `"delta": "-02.10"` was accepted, then writing the operation
    /// out (the participants' messages, the `Idempotency-Key` hash) panicked, because the kept text
    /// was no JSON number. Every form the parser accepts must go out as one, with the same value.
    #[test]
    fn every_accepted_form_is_written_as_a_json_number() {
        for (written, wire) in [
            ("-02.10", "-2.1"),
            ("+5", "5"),
            (".5", "0.5"),
            ("-.5e-3", "-0.0005"),
            ("5.", "5"),
            ("+1e5", "100000"),
            ("+0e-999999999", "0"),
            (" 1.50 ", "1.50"),
            ("1E+5", "1e+5"),
        ] {
            let decimal: Decimal = written.parse().unwrap_or_else(|e| panic!("{written:?}: {e}"));
            assert_eq!(decimal.to_string(), wire, "{written:?}");
            assert_eq!(decimal.value(), &BigDecimal::from_str(written.trim()).unwrap(), "{written:?}");
            let json = serde_json::to_string(&decimal).unwrap();
            assert_eq!(
                json.parse::<Decimal>().unwrap(),
                wire.parse::<Decimal>().unwrap(),
                "{written:?} went out as {json}"
            );
        }
    }

    /// The same class as the one above (input the parser takes but cannot carry through), found
    /// while fixing it: an exponent near i64's limit overflowed where the range is worked out, and
    /// in bigdecimal's `normalized` (a panic where overflow is checked, wrapped where it is not).
    #[test]
    fn exponents_at_the_limits_of_i64_are_out_of_range() {
        for text in
            ["1e9223372036854775807", "100e9223372036854775807", "-12e9223372036854775806", "1000e-9223372036854775807"]
        {
            let err = text.parse::<Decimal>().unwrap_err();
            assert!(err.contains("outside DynamoDB's range"), "{text}: {err}");
        }
        assert_eq!("0e9223372036854775807".parse::<Decimal>().unwrap().value(), &BigDecimal::zero());
    }

    /// An exponent past i64, which the spec's pattern allows: out of range (or zero), never "not a number".
    #[test]
    fn an_exponent_past_i64_is_out_of_range() {
        for text in ["88980910.8208570e33264317469094994473571", "1e-99999999999999999999", "-5E+99999999999999999999"]
        {
            let err = text.parse::<Decimal>().unwrap_err();
            assert!(err.contains("outside DynamoDB's range"), "{text}: {err}");
        }
        assert_eq!("0.0e99999999999999999999".parse::<Decimal>().unwrap().to_string(), "0");
        for text in ["1e", "1e+", "1ee99999999999999999999", "x1e99999999999999999999"] {
            assert!(text.parse::<Decimal>().unwrap_err().contains("is not a number"), "{text}");
        }
    }

    /// Same class again: a zero is in range whatever its exponent, and `0e-999999999` kept its scale,
    /// so `min - delta` or `version.is_integer()` worked with a billion-digit number (2 s for an
    /// exponent of 10^7; minutes, or out of memory, for 10^9). The value kept is normalised.
    #[test]
    fn values_are_kept_with_a_scale_their_range_bounds() {
        let one_with_zeros = format!("1.{}e5", "0".repeat(10_000));
        for text in
            ["0e-999999999", "-0.0e999999999", one_with_zeros.as_str(), "12345678901234567890123456789012345678e-167"]
        {
            let decimal: Decimal = text.parse().unwrap();
            let scale = decimal.value().fractional_digit_count();
            assert!((-125..=130 + 37).contains(&scale), "{text}: scale {scale}");
        }
    }

    #[test]
    fn bounds_are_exact() {
        let min: Decimal = "0".parse().unwrap();
        let delta: Decimal = "-0.1".parse().unwrap();
        let bound = Decimal::from_big(min.value() - delta.value()).unwrap();
        assert_eq!(bound.to_string(), "0.1");
    }
}
