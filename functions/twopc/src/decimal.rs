//! Exact decimal numbers as DynamoDB holds them: up to 38 significant digits, never through f64.

use std::fmt;
use std::str::FromStr;

use bigdecimal::{BigDecimal, Zero};
use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::model::{ErrorCode, Invalid};

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
        let value = value.normalized();
        check_range(&value)?;
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

fn check_range(value: &BigDecimal) -> Result<(), String> {
    let digits = value.digits();
    if digits > MAX_DIGITS {
        return Err(format!("has {digits} significant digits; DynamoDB numbers hold at most {MAX_DIGITS}"));
    }
    if value.is_zero() {
        return Ok(());
    }
    // DynamoDB's range: 1E-130 <= |n| < 1E126.
    let exponent = digits as i64 - value.fractional_digit_count() - 1;
    if !(-130..=125).contains(&exponent) {
        return Err("is outside DynamoDB's range of 1E-130 to 9.9E125".to_owned());
    }
    Ok(())
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
        let value = BigDecimal::from_str(trimmed).map_err(|_| format!("\"{text}\" is not a number"))?;
        if trimmed.is_empty() || trimmed.contains(['x', 'X', '_']) {
            return Err(format!("\"{text}\" is not a number"));
        }
        check_range(&value.normalized())?;
        Ok(Decimal { text: trimmed.to_owned(), value })
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

    #[test]
    fn bounds_are_exact() {
        let min: Decimal = "0".parse().unwrap();
        let delta: Decimal = "-0.1".parse().unwrap();
        let bound = Decimal::from_big(min.value() - delta.value()).unwrap();
        assert_eq!(bound.to_string(), "0.1");
    }
}
