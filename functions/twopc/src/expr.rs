//! Building DynamoDB expressions with every name and value as a placeholder, so user-chosen field
//! names can never collide with reserved words or inject syntax.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

#[derive(Debug, Default)]
pub struct Expr {
    pub names: HashMap<String, String>,
    pub values: HashMap<String, AttributeValue>,
}

impl Expr {
    pub fn new() -> Expr {
        Expr::default()
    }

    /// A placeholder for an attribute name (`#n0`), reused when the same name comes again.
    pub fn name(&mut self, name: &str) -> String {
        if let Some((placeholder, _)) = self.names.iter().find(|(_, n)| n.as_str() == name) {
            return placeholder.clone();
        }
        let placeholder = format!("#n{}", self.names.len());
        self.names.insert(placeholder.clone(), name.to_owned());
        placeholder
    }

    /// A dotted path of names, each a placeholder: `#n0.#n1`.
    pub fn path(&mut self, parts: &[&str]) -> String {
        parts.iter().map(|p| self.name(p)).collect::<Vec<_>>().join(".")
    }

    pub fn value(&mut self, value: AttributeValue) -> String {
        let placeholder = format!(":v{}", self.values.len());
        self.values.insert(placeholder.clone(), value);
        placeholder
    }

    pub fn names(&self) -> Option<HashMap<String, String>> {
        (!self.names.is_empty()).then(|| self.names.clone())
    }

    pub fn values(&self) -> Option<HashMap<String, AttributeValue>> {
        (!self.values.is_empty()).then(|| self.values.clone())
    }
}

pub fn s(text: impl Into<String>) -> AttributeValue {
    AttributeValue::S(text.into())
}

pub fn n(number: impl ToString) -> AttributeValue {
    AttributeValue::N(number.to_string())
}
