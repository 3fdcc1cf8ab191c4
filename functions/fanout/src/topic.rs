//! WebSocket topics: `entity:<table>:<entityId>` (commits of one item) and `tx:<transactionId>`
//! (the outcome of one transaction).

use std::fmt;
use std::str::FromStr;

/// Longest topic accepted: the connections table's sort key is `topic`, and DynamoDB caps a sort
/// key at 1024 bytes.
pub const MAX_TOPIC_BYTES: usize = 1024;
const MAX_TRANSACTION_ID_BYTES: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Topic {
    /// Commits of the item `entity_id` of `table`.
    Entity { table: String, entity_id: String },
    /// The end (COMMITTED or ABORTED) of one transaction.
    Transaction(String),
}

impl Topic {
    pub fn entity(table: &str, entity_id: &str) -> Self {
        Topic::Entity { table: table.to_owned(), entity_id: entity_id.to_owned() }
    }

    pub fn transaction(id: &str) -> Self {
        Topic::Transaction(id.to_owned())
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Topic::Entity { table, entity_id } => write!(f, "entity:{table}:{entity_id}"),
            Topic::Transaction(id) => write!(f, "tx:{id}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TopicError(String);

/// DynamoDB table names: 3 to 255 of `a-z A-Z 0-9 _ - .`.
fn valid_table_name(name: &str) -> bool {
    (3..=255).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn no_control_characters(s: &str) -> bool {
    !s.chars().any(char::is_control)
}

impl FromStr for Topic {
    type Err = TopicError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() > MAX_TOPIC_BYTES {
            return Err(TopicError(format!("is longer than {MAX_TOPIC_BYTES} bytes")));
        }
        if let Some(rest) = text.strip_prefix("entity:") {
            let Some((table, entity_id)) = rest.split_once(':') else {
                return Err(TopicError("expected entity:<table>:<entityId>".into()));
            };
            if !valid_table_name(table) {
                return Err(TopicError(format!("{table:?} is not a table name (3 to 255 of a-z, A-Z, 0-9, _, -, .)")));
            }
            if entity_id.is_empty() || !no_control_characters(entity_id) {
                return Err(TopicError("the entityId is empty or has control characters".into()));
            }
            return Ok(Topic::entity(table, entity_id));
        }
        if let Some(id) = text.strip_prefix("tx:") {
            if id.is_empty() || id.len() > MAX_TRANSACTION_ID_BYTES {
                return Err(TopicError(format!("the transactionId must be 1 to {MAX_TRANSACTION_ID_BYTES} bytes")));
            }
            if id.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return Err(TopicError("the transactionId has whitespace or control characters".into()));
            }
            return Ok(Topic::transaction(id));
        }
        Err(TopicError("expected entity:<table>:<entityId> or tx:<transactionId>".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for text in ["entity:service-a-data:A", "entity:t.1_x:id:with:colons", "tx:6f1c-42"] {
            assert_eq!(text.parse::<Topic>().unwrap().to_string(), text);
        }
        assert_eq!("entity:service-a-data:A".parse::<Topic>().unwrap(), Topic::entity("service-a-data", "A"));
    }

    #[test]
    fn rejects_malformed() {
        for text in [
            "",
            "entity:",
            "entity:service-a-data",
            "entity:service-a-data:",
            "entity:a b:A",
            "entity:ab:A",
            "tx:",
            "tx:a b",
            "$connection",
            "account:A",
        ] {
            assert!(text.parse::<Topic>().is_err(), "{text:?} accepted");
        }
        assert!(format!("tx:{}", "x".repeat(2000)).parse::<Topic>().is_err());
    }
}
