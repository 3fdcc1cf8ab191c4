//! Stream records built from structure rather than bytes: attribute value trees of every type, with
//! numbers written in the forms a decimal can take (signs, leading or trailing points, exponents of
//! any size), and the attribute names the decider looks at, so that commits, skips and unprocessable
//! records are all reached. Random bytes seldom make event JSON that gets past the decoder; this
//! target starts where it ends.

#![no_main]

use std::collections::HashMap;

use aws_lambda_events::event::dynamodb::{Event, EventRecord, UserIdentity};
use chrono::{TimeZone, Utc};
use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_dynamo::{AttributeValue, Item};

/// Deeper than a Lambda event can carry (serde_json stops at 128 levels of JSON, two per attribute
/// level), so depth alone is no finding.
const MAX_DEPTH: usize = 64;

/// A number's text, mostly shaped like a decimal.
#[derive(Debug)]
struct NumberText(String);

impl<'a> Arbitrary<'a> for NumberText {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        if u.ratio(1, 8)? {
            return Ok(NumberText(String::arbitrary(u)?));
        }
        let mut text = String::new();
        text.push_str(u.choose(&["", "", "-", "+", " "])?);
        let digits = |u: &mut Unstructured<'a>, max: usize| -> arbitrary::Result<String> {
            let len = u.int_in_range(0..=max)?;
            (0..len).map(|_| Ok(char::from(b'0' + u.int_in_range(0..=9)?))).collect()
        };
        text.push_str(&digits(u, 45)?);
        if bool::arbitrary(u)? {
            text.push('.');
            text.push_str(&digits(u, 45)?);
        }
        if bool::arbitrary(u)? {
            text.push_str(u.choose(&["e", "E", "e+", "E-", "e-"])?);
            let exponent: u64 = match u.int_in_range(0..=3)? {
                0 => u.int_in_range(0..=200)?,
                1 => u.int_in_range(0..=100_000)?,
                _ => u64::arbitrary(u)?,
            };
            text.push_str(&exponent.to_string());
        }
        Ok(NumberText(text))
    }
}

/// The attribute names the decider reads, and any other.
#[derive(Debug, Arbitrary)]
enum Name {
    EntityId,
    Data,
    Version,
    LastTx,
    Lock,
    TransactionId,
    Status,
    Other(String),
}

impl Name {
    fn text(&self) -> String {
        match self {
            Name::EntityId => "entityId".into(),
            Name::Data => "data".into(),
            Name::Version => "version".into(),
            Name::LastTx => "lastTx".into(),
            Name::Lock => "lock".into(),
            Name::TransactionId => "transactionId".into(),
            Name::Status => "status".into(),
            Name::Other(name) => name.clone(),
        }
    }
}

/// A string attribute: one of the values the decider compares, or any other.
#[derive(Debug, Arbitrary)]
enum Text {
    Committed,
    Aborted,
    Committing,
    TxA,
    TxB,
    Other(String),
}

impl Text {
    fn text(&self) -> String {
        match self {
            Text::Committed => "COMMITTED".into(),
            Text::Aborted => "ABORTED".into(),
            Text::Committing => "COMMITTING".into(),
            Text::TxA => "tx-a".into(),
            Text::TxB => "tx-b".into(),
            Text::Other(text) => text.clone(),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Attr {
    S(Text),
    N(NumberText),
    B(Vec<u8>),
    Bool(bool),
    Null,
    M(Vec<(Name, Attr)>),
    L(Vec<Attr>),
    Ss(Vec<String>),
    Ns(Vec<NumberText>),
    Bs(Vec<Vec<u8>>),
}

impl Attr {
    /// `None` past [`MAX_DEPTH`].
    fn build(&self, depth: usize) -> Option<AttributeValue> {
        if depth > MAX_DEPTH {
            return None;
        }
        Some(match self {
            Attr::S(text) => AttributeValue::S(text.text()),
            Attr::N(number) => AttributeValue::N(number.0.clone()),
            Attr::B(bytes) => AttributeValue::B(bytes.clone()),
            Attr::Bool(b) => AttributeValue::Bool(*b),
            Attr::Null => AttributeValue::Null(true),
            Attr::M(entries) => AttributeValue::M(map(entries, depth + 1)?),
            Attr::L(items) => AttributeValue::L(items.iter().map(|a| a.build(depth + 1)).collect::<Option<Vec<_>>>()?),
            Attr::Ss(items) => AttributeValue::Ss(items.clone()),
            Attr::Ns(items) => AttributeValue::Ns(items.iter().map(|n| n.0.clone()).collect()),
            Attr::Bs(items) => AttributeValue::Bs(items.clone()),
        })
    }
}

fn map(entries: &[(Name, Attr)], depth: usize) -> Option<HashMap<String, AttributeValue>> {
    entries.iter().map(|(name, value)| Some((name.text(), value.build(depth)?))).collect()
}

#[derive(Debug, Arbitrary)]
enum Table {
    ServiceA,
    ServiceB,
    Transactions,
    Unknown,
    NoArn,
    Arn(String),
}

#[derive(Debug, Arbitrary)]
enum EventName {
    Insert,
    Modify,
    Remove,
    Other(String),
}

#[derive(Debug, Arbitrary)]
struct Record {
    event_name: EventName,
    table: Table,
    table_name: Option<String>,
    keys: Vec<(Name, Attr)>,
    old: Vec<(Name, Attr)>,
    new: Vec<(Name, Attr)>,
    removed_by_ttl: bool,
    seconds: i64,
    nanos: u32,
    sequence_number: Option<String>,
}

impl Record {
    fn build(&self, index: usize) -> Option<EventRecord> {
        let mut record = EventRecord::default();
        record.event_id = format!("e{index}");
        record.event_name = match &self.event_name {
            EventName::Insert => "INSERT".into(),
            EventName::Modify => "MODIFY".into(),
            EventName::Remove => "REMOVE".into(),
            EventName::Other(name) => name.clone(),
        };
        let arn = |table: &str| format!("arn:aws:dynamodb:us-east-1:123456789012:table/{table}/stream/2024-05-01");
        record.event_source_arn = match &self.table {
            Table::ServiceA => Some(arn("service-a-data")),
            Table::ServiceB => Some(arn("service-b-data")),
            Table::Transactions => Some(arn("transactions")),
            Table::Unknown => Some(arn("unknown-table")),
            Table::NoArn => None,
            Table::Arn(text) => Some(text.clone()),
        };
        record.table_name = self.table_name.clone();
        if self.removed_by_ttl {
            let mut identity = UserIdentity::default();
            identity.type_ = "Service".into();
            identity.principal_id = "dynamodb.amazonaws.com".into();
            record.user_identity = Some(identity);
        }
        record.change.keys = Item::from(map(&self.keys, 1)?);
        record.change.old_image = Item::from(map(&self.old, 1)?);
        record.change.new_image = Item::from(map(&self.new, 1)?);
        record.change.sequence_number = self.sequence_number.clone();
        // Any instant chrono can hold, leap seconds included (a nanosecond count past one second).
        record.change.approximate_creation_date_time = Utc.timestamp_opt(self.seconds, self.nanos).single()?;
        Some(record)
    }
}

fuzz_target!(|records: Vec<Record>| {
    let Some(records) = records.iter().take(16).enumerate().map(|(i, r)| r.build(i)).collect::<Option<Vec<_>>>() else {
        return;
    };
    let mut event = Event::default();
    event.records = records;
    twopc_fuzz::check_event(&event);
});
