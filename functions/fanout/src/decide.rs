//! Which stream records are commits, and the record each commit becomes.
//!
//! Participant tables: a commit is an INSERT/MODIFY whose NewImage `lastTx` exists and differs from
//! the OldImage's (or there is no OldImage), or a REMOVE whose OldImage holds a lock and `data` (a
//! committed delete). Prepares and aborts leave `lastTx` alone, and an aborted placeholder has no
//! `data`, so neither is ever emitted. Transactions table: a status that becomes COMMITTED or
//! ABORTED ends a transaction; one that becomes COMMITTED also gives the transaction's own lake line
//! ([`transaction_line`]): its participants and how many per-item lines each one's commit makes.

use std::collections::{BTreeMap, HashMap, HashSet};

use aws_lambda_events::event::dynamodb::EventRecord;
use serde::Serialize;
use serde_dynamo::AttributeValue;
use serde_json::{Number, Value};
use twopc::config::{self, ConfigError};
use twopc::custom::Catalogs;
use twopc::record::{DEFAULT_TRANSACTIONS_TABLE, TRANSACTIONS_TABLE_NAME, attempt_id};
use twopc::tables::PARTICIPANT_TABLES;
use twopc::tables::{item_attr, tx_attr};

use super::convert::{self, ConvertError};
use super::topic::Topic;

/// What the stream processor needs to know about the tables it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanoutConfig {
    /// Participant data table name → the service that owns it.
    pub services_by_table: HashMap<String, String>,
    pub transactions_table: String,
    /// (service, op) of every operation of a resource beyond DynamoDB (`SERVICE_OPERATIONS`, schemas with
    /// `"resource": true`): its commit confirms at the resource and writes no item of the service's table,
    /// so it makes no per-item lake line, and a transaction line counts it as no change.
    pub resource_operations: HashSet<(String, String)>,
}

impl FanoutConfig {
    /// From the service registry `{"service": "table"}` (the `PARTICIPANT_TABLES` shape).
    pub fn new(participant_tables: &BTreeMap<String, String>, transactions_table: &str) -> Result<Self, ConfigError> {
        let mut services_by_table = HashMap::new();
        for (service, table) in participant_tables {
            if let Some(other) = services_by_table.insert(table.clone(), service.clone()) {
                return Err(ConfigError::Invalid {
                    name: PARTICIPANT_TABLES,
                    message: format!("table {table} belongs to both {other} and {service}"),
                });
            }
            if *table == transactions_table {
                return Err(ConfigError::Invalid {
                    name: PARTICIPANT_TABLES,
                    message: format!("{table} is the transactions table"),
                });
            }
        }
        Ok(FanoutConfig {
            services_by_table,
            transactions_table: transactions_table.to_owned(),
            resource_operations: HashSet::new(),
        })
    }

    /// The same configuration, knowing which of the services' own operations are a resource's (the
    /// coordinator's `SERVICE_OPERATIONS`), so that transaction lines count only what reaches a table.
    pub fn with_service_operations(mut self, catalogs: &Catalogs) -> Self {
        self.resource_operations = catalogs
            .iter()
            .flat_map(|(service, catalog)| {
                catalog.schemas().filter(|schema| schema.resource).map(|schema| (service.clone(), schema.op.clone()))
            })
            .collect();
        self
    }

    /// `PARTICIPANT_TABLES`, `TRANSACTIONS_TABLE_NAME` and `SERVICE_OPERATIONS` (none when unset).
    pub fn from_env() -> Result<Self, ConfigError> {
        let tables = config::string_map(PARTICIPANT_TABLES)?;
        let transactions = config::or_default(TRANSACTIONS_TABLE_NAME, DEFAULT_TRANSACTIONS_TABLE);
        Ok(Self::new(&tables, &transactions)?.with_service_operations(&twopc::custom::catalogs_from_env()?))
    }

    /// The data table of `service`, when it has one here.
    pub fn table_of(&self, service: &str) -> Option<&str> {
        self.services_by_table.iter().find(|(_, s)| *s == service).map(|(table, _)| table.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ChangeKind {
    /// A new business entity (the old image had no `data`, a placeholder included).
    Insert,
    Modify,
    Remove,
}

/// One committed change: a line of the lake (contract field order) and, with `"type": "commit"`,
/// the WebSocket message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeRecord {
    pub event_id: String,
    pub transaction_id: String,
    pub service: String,
    pub table: String,
    pub key: Value,
    pub change: ChangeKind,
    pub version: Number,
    pub committed_at: String,
    pub data: Value,
    pub previous: Value,
}

#[derive(Serialize)]
struct Tagged<'a, T: Serialize> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

impl ChangeRecord {
    /// The lake line: the record as JSON and a newline (Firehose concatenates records as they come).
    pub fn to_ndjson(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).expect("a ChangeRecord always serialises");
        line.push(b'\n');
        line
    }

    /// `{"type": "commit", ...the lake record}`.
    pub fn to_message(&self) -> Vec<u8> {
        commit_message(&self.to_ndjson())
    }

    /// The commit message without the images, for when the full one is too large for a WebSocket
    /// message: `{"type": "commit", "eventId", "transactionId", "service", "table", "key", "change",
    /// "version", "committedAt", "imagesOmitted": true}`. A subscriber still learns that the entity
    /// changed, by which transaction and to which version, and reads the item for its data.
    pub fn to_message_without_images(&self) -> Vec<u8> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct WithoutImages<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            event_id: &'a str,
            transaction_id: &'a str,
            service: &'a str,
            table: &'a str,
            key: &'a Value,
            change: ChangeKind,
            version: &'a Number,
            committed_at: &'a str,
            images_omitted: bool,
        }
        serde_json::to_vec(&WithoutImages {
            kind: "commit",
            event_id: &self.event_id,
            transaction_id: &self.transaction_id,
            service: &self.service,
            table: &self.table,
            key: &self.key,
            change: self.change,
            version: &self.version,
            committed_at: &self.committed_at,
            images_omitted: true,
        })
        .expect("always serialises")
    }

    /// `entity:<table>:<entityId>`, when the key has a string `entityId`.
    pub fn topic(&self) -> Option<Topic> {
        self.key.get(item_attr::KEY).and_then(Value::as_str).map(|id| Topic::entity(&self.table, id))
    }
}

/// The WebSocket message of a lake line, without serialising the record again: `{"type":"commit",`
/// followed by the line's fields.
pub fn commit_message(line: &[u8]) -> Vec<u8> {
    const HEAD: &[u8] = br#"{"type":"commit","#;
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    let body = body.strip_prefix(b"{").unwrap_or(body);
    let mut message = Vec::with_capacity(HEAD.len() + body.len());
    message.extend_from_slice(HEAD);
    message.extend_from_slice(body);
    message
}

/// A transaction that ended, `{"type": "transaction", "transactionId", "status"}`, or that is held for its
/// caller's decision, `{"type": "transaction", "transactionId", "status": "PREPARED", "holdUntil"}`: to
/// `tx:<id>`. An attempt after the first of a request its coordinator retried (issue 41) carries
/// `firstTransactionId` and goes to `tx:<first id>` as well, so that a subscriber of the id a request's key
/// gives hears the request's outcome; an attempt that was retried carries `retriedAs` (its end is not the
/// request's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionEnded {
    pub transaction_id: String,
    pub status: String,
    /// PREPARED: until when its caller may commit it (epoch ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<u64>,
    /// An attempt after the first: its request's first attempt's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_transaction_id: Option<String>,
    /// An attempt its coordinator retried: the next attempt's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retried_as: Option<String>,
    /// Who created it: who may follow it ([`twopc::access::Policy::may_see`]); never in the message.
    #[serde(skip)]
    pub principal: Option<String>,
}

impl TransactionEnded {
    pub fn to_message(&self) -> Vec<u8> {
        serde_json::to_vec(&Tagged { kind: "transaction", body: self }).expect("always serialises")
    }

    /// `tx:<id>`, and `tx:<first id>` for an attempt after the first.
    pub fn topics(&self) -> Vec<Topic> {
        let mut topics = vec![Topic::transaction(&self.transaction_id)];
        topics.extend(self.first_transaction_id.as_deref().map(Topic::transaction));
        topics
    }
}

/// A committed transaction's line in the lake, beside its per-item lines ([`ChangeRecord`]):
/// `{"kind": "transaction", "eventId", "transactionId", "firstTransactionId"?, "committedAt",
/// "participants": [{"service", "table"?, "changes"}], "changes"}`. `changes` is the number of per-item
/// lines the commit makes (for each participant, and in all), so a reader that has that many distinct
/// `eventId`s of the transaction has all of it. Only a transaction line has `kind`: a per-item line
/// keeps its contract fields and nothing more. One per COMMITTED record: delivery is at least once, so a
/// reader dedupes by `eventId` (or `transactionId`, which a transaction has one line of).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionLine {
    /// Always `"transaction"`.
    pub kind: &'static str,
    /// The transactions table's stream record that made the transaction COMMITTED.
    pub event_id: String,
    pub transaction_id: String,
    /// An attempt after the first of a request its coordinator retried: the first attempt's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_transaction_id: Option<String>,
    /// When the record became COMMITTED (the stream record's time), RFC 3339: at or after its items'.
    pub committed_at: String,
    pub participants: Vec<ParticipantChanges>,
    /// The sum of the participants' changes; null when one of them is not known.
    pub changes: Option<u64>,
}

/// One participant of a committed transaction and how many per-item lines its commit makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParticipantChanges {
    pub service: String,
    /// Its data table (`PARTICIPANT_TABLES`), when the stream processor knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// Every operation that writes its item (`put`, `set`, `add`, `delete`, a service's own kind) makes
    /// one line; a `check`, a read-only participant and a resource's operation make none. Null only when
    /// neither image of the record holds its operations (an ended record shortened to fit DynamoDB,
    /// created COMMITTED at once).
    pub changes: Option<u64>,
}

impl TransactionLine {
    /// The lake line: JSON and a newline.
    pub fn to_ndjson(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).expect("a TransactionLine always serialises");
        line.push(b'\n');
        line
    }
}

/// The lake line of a transaction `ended` says became COMMITTED (`record` is its transactions-table stream
/// record). The participants come from the NewImage; a participant's operations from the NewImage, or the
/// OldImage (COMMITTING) when the COMMITTED record was shortened without them.
pub fn transaction_line(
    config: &FanoutConfig,
    record: &EventRecord,
    ended: &TransactionEnded,
) -> Result<TransactionLine, String> {
    let new = record.change.new_image.inner();
    let old = record.change.old_image.inner();
    let entries = |image: &Image| -> Result<Vec<(String, bool, Vec<String>)>, String> {
        match image.get(tx_attr::PARTICIPANTS) {
            None => Ok(vec![]),
            Some(AttributeValue::L(entries)) => entries.iter().map(participant_entry).collect(),
            Some(other) => Err(format!("participants is not a list: {other:?}")),
        }
    };
    let now = entries(new)?;
    let before = entries(old).unwrap_or_default();
    if now.is_empty() {
        return Err("a COMMITTED record without participants".into());
    }
    let participants: Vec<ParticipantChanges> = now
        .into_iter()
        .map(|(service, read_only, operations)| {
            let operations = if operations.is_empty() {
                before.iter().find(|(s, _, _)| *s == service).map(|(_, _, ops)| ops.clone()).unwrap_or_default()
            } else {
                operations
            };
            let changes = if read_only {
                Some(0)
            } else if operations.is_empty() {
                None
            } else {
                let writes = operations.iter().filter(|op| {
                    op.as_str() != "check" && !config.resource_operations.contains(&(service.clone(), (*op).clone()))
                });
                Some(writes.count() as u64)
            };
            ParticipantChanges { table: config.table_of(&service).map(str::to_owned), service, changes }
        })
        .collect();
    let at = &record.change.approximate_creation_date_time;
    Ok(TransactionLine {
        kind: "transaction",
        event_id: record.event_id.clone(),
        transaction_id: ended.transaction_id.clone(),
        first_transaction_id: ended.first_transaction_id.clone(),
        committed_at: rfc3339(at.timestamp(), at.timestamp_subsec_nanos()),
        changes: participants.iter().map(|p| p.changes).sum(),
        participants,
    })
}

/// (service, read only, the `op` of each operation) of one stored participant entry.
fn participant_entry(entry: &AttributeValue) -> Result<(String, bool, Vec<String>), String> {
    let AttributeValue::M(entry) = entry else {
        return Err(format!("a participant entry is not a map: {entry:?}"));
    };
    let Some(service) = optional_string(entry, "service", "participant")? else {
        return Err("a participant entry without a service".into());
    };
    let read_only = matches!(entry.get("readOnly"), Some(AttributeValue::Bool(true)));
    let operations = match entry.get("operations") {
        None => vec![],
        Some(AttributeValue::L(operations)) => operations
            .iter()
            .map(|op| match op {
                AttributeValue::M(op) => match optional_string(op, "op", "operation")? {
                    Some(kind) => Ok(kind.to_owned()),
                    None => Err(format!("{service}: an operation without op")),
                },
                other => Err(format!("{service}: an operation is not a map: {other:?}")),
            })
            .collect::<Result<_, String>>()?,
        Some(other) => return Err(format!("{service}: operations is not a list: {other:?}")),
    };
    Ok((service.to_owned(), read_only, operations))
}

/// Why a record is not emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// INSERT/MODIFY without `lastTx`: a placeholder a prepare created, or data written outside the protocol.
    NoLastTx,
    /// `lastTx` unchanged: a lock added (prepare) or removed (abort).
    LastTxUnchanged,
    /// REMOVE of a placeholder (locked, never committed): an aborted put.
    PlaceholderReleased,
    /// REMOVE of an item without a lock: outside the protocol (manual delete). Logged as a warning.
    UnlockedRemove,
    /// REMOVE by DynamoDB's TTL process.
    TimeToLive,
    /// Transactions table: not a change to COMMITTED or ABORTED.
    NotAnOutcome,
}

impl Skip {
    pub fn describe(self) -> &'static str {
        match self {
            Skip::NoLastTx => "no lastTx: a placeholder or a write outside the protocol",
            Skip::LastTxUnchanged => "lastTx unchanged: a prepare or an abort",
            Skip::PlaceholderReleased => "placeholder removed: an aborted put",
            Skip::UnlockedRemove => "REMOVE of an unlocked item: not a commit (outside the protocol)",
            Skip::TimeToLive => "REMOVE by TTL",
            Skip::NotAnOutcome => "transaction record change that is not an outcome",
        }
    }
}

/// What to do with one stream record.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Commit(Box<ChangeRecord>),
    Ended(TransactionEnded),
    Skip(Skip),
    /// A record that cannot be judged (missing image, wrong attribute type). It may be a commit, so it
    /// is reported as a batch item failure, never dropped.
    Unprocessable(String),
    /// A record of a stream this function was not configured for (its `eventSourceARN` is not a stream
    /// of `TRANSACTIONS_TABLE_NAME` or of a `PARTICIPANT_TABLES` table), or with no stream ARN at all:
    /// not this deployment's change, so it is dropped (and logged), never fanned out or retried. Who may
    /// invoke the function (its resource policy) is what keeps such events out; this is the second line.
    Foreign(String),
}

type Image = HashMap<String, AttributeValue>;

/// The table of a DynamoDB stream ARN, `arn:PARTITION:dynamodb:REGION:ACCOUNT:table/NAME/stream/LABEL`;
/// None for anything else (a table ARN without its stream included).
fn table_of_stream_arn(arn: &str) -> Option<&str> {
    let fields: Vec<&str> = arn.splitn(6, ':').collect();
    let [arn_prefix, _partition, service, _region, _account, resource] = fields[..] else {
        return None;
    };
    if arn_prefix != "arn" || service != "dynamodb" {
        return None;
    }
    let parts: Vec<&str> = resource.split('/').collect();
    match parts[..] {
        ["table", name, "stream", label] if !name.is_empty() && !label.is_empty() => Some(name),
        _ => None,
    }
}

/// The table a record comes from: the table of its `eventSourceARN` when that is a DynamoDB stream ARN.
/// (The optional `tableName` field is not trusted: Lambda's DynamoDB event source always sends the ARN.)
pub fn table_name(record: &EventRecord) -> Option<&str> {
    record.event_source_arn.as_deref().and_then(table_of_stream_arn)
}

/// The transaction id a record is about, for the log span, when it can be told.
pub fn transaction_id_hint(record: &EventRecord) -> Option<&str> {
    let new = record.change.new_image.inner();
    let old = record.change.old_image.inner();
    string(new, item_attr::LAST_TX)
        .or_else(|| lock_transaction(new))
        .or_else(|| lock_transaction(old))
        .or_else(|| string(record.change.keys.inner(), tx_attr::ID))
}

fn string<'a>(image: &'a Image, name: &str) -> Option<&'a str> {
    match image.get(name) {
        Some(AttributeValue::S(s)) => Some(s),
        _ => None,
    }
}

fn lock_transaction(image: &Image) -> Option<&str> {
    match image.get(item_attr::LOCK) {
        Some(AttributeValue::M(lock)) => string(lock, "transactionId"),
        _ => None,
    }
}

/// `Ok(None)` when absent, an error when present with another type.
fn optional_string<'a>(image: &'a Image, name: &str, which: &str) -> Result<Option<&'a str>, String> {
    match image.get(name) {
        None => Ok(None),
        Some(AttributeValue::S(s)) => Ok(Some(s)),
        Some(other) => Err(format!("{which} {name} is not a string: {other:?}")),
    }
}

fn json_or_null(image: &Image, name: &str) -> Result<Value, ConvertError> {
    image.get(name).map_or(Ok(Value::Null), convert::attribute_to_json)
}

/// RFC 3339 UTC, e.g. `2024-05-01T12:00:00Z` (fractional seconds when there are any).
pub fn rfc3339(secs: i64, nanos: u32) -> String {
    aws_smithy_types::DateTime::from_secs_and_nanos(secs, nanos)
        .fmt(aws_smithy_types::date_time::Format::DateTime)
        .unwrap_or_else(|_| secs.to_string())
}

/// Decides one record.
pub fn decide(config: &FanoutConfig, record: &EventRecord) -> Decision {
    let Some(table) = table_name(record) else {
        return Decision::Foreign(format!("eventSourceARN {:?} is not a DynamoDB stream ARN", record.event_source_arn));
    };
    if table == config.transactions_table {
        return decide_transaction(record);
    }
    match config.services_by_table.get(table) {
        Some(service) => decide_participant(record, table, service),
        None => Decision::Foreign(format!(
            "a stream of table {table}, neither a participant table (PARTICIPANT_TABLES) nor the transactions table"
        )),
    }
}

fn decide_participant(record: &EventRecord, table: &str, service: &str) -> Decision {
    match participant_change(record, table, service) {
        Ok(Ok(change)) => Decision::Commit(Box::new(change)),
        Ok(Err(skip)) => Decision::Skip(skip),
        Err(message) => Decision::Unprocessable(message),
    }
}

fn participant_change(record: &EventRecord, table: &str, service: &str) -> Result<Result<ChangeRecord, Skip>, String> {
    let stream = &record.change;
    let new = stream.new_image.inner();
    let old = stream.old_image.inner();
    let (transaction_id, version, change, data) = match record.event_name.as_str() {
        name @ ("INSERT" | "MODIFY") => {
            if new.is_empty() {
                return Err(format!("{name} without NewImage: the stream must be NEW_AND_OLD_IMAGES"));
            }
            if name == "MODIFY" && old.is_empty() {
                return Err("MODIFY without OldImage: the stream must be NEW_AND_OLD_IMAGES".into());
            }
            let Some(new_tx) = optional_string(new, item_attr::LAST_TX, "NewImage")? else {
                return Ok(Err(Skip::NoLastTx));
            };
            if optional_string(old, item_attr::LAST_TX, "OldImage")? == Some(new_tx) {
                return Ok(Err(Skip::LastTxUnchanged));
            }
            let version = match new.get(item_attr::VERSION) {
                Some(AttributeValue::N(v)) => convert::number(v, item_attr::VERSION).map_err(|e| e.to_string())?,
                other => return Err(format!("a commit without a numeric version: {other:?}")),
            };
            let kind = if old.contains_key(item_attr::DATA) { ChangeKind::Modify } else { ChangeKind::Insert };
            let data = json_or_null(new, item_attr::DATA).map_err(|e| e.to_string())?;
            (new_tx.to_owned(), version, kind, data)
        }
        "REMOVE" => {
            if old.is_empty() {
                return Err("REMOVE without OldImage: the stream must be NEW_AND_OLD_IMAGES".into());
            }
            if record.user_identity.as_ref().is_some_and(|u| u.type_ == "Service") {
                return Ok(Err(Skip::TimeToLive));
            }
            let lock_tx = match old.get(item_attr::LOCK) {
                None => return Ok(Err(Skip::UnlockedRemove)),
                Some(AttributeValue::M(lock)) => optional_string(lock, "transactionId", "OldImage lock")?,
                Some(other) => return Err(format!("OldImage lock is not a map: {other:?}")),
            };
            let Some(lock_tx) = lock_tx else {
                return Err("OldImage lock without a transactionId".into());
            };
            // A placeholder (locked by a prepare, never committed) has no `data`: its removal is an aborted
            // put. A locked item with `data` is only ever removed by the commit of a delete, whether or
            // not it had a `version` (an item written outside the protocol has none: its version was 0).
            if !old.contains_key(item_attr::DATA) {
                return Ok(Err(Skip::PlaceholderReleased));
            }
            let version = match old.get(item_attr::VERSION) {
                None => next_version("0")?,
                Some(AttributeValue::N(v)) => next_version(v)?,
                Some(other) => return Err(format!("OldImage version is not a number: {other:?}")),
            };
            (lock_tx.to_owned(), version, ChangeKind::Remove, Value::Null)
        }
        other => return Err(format!("unknown eventName {other:?}")),
    };
    let keys = stream.keys.inner();
    if keys.is_empty() {
        return Err("a record without Keys".into());
    }
    let key = convert::item_to_json(keys).map_err(|e| e.to_string())?;
    let previous = json_or_null(old, item_attr::DATA).map_err(|e| e.to_string())?;
    let at = &stream.approximate_creation_date_time;
    Ok(Ok(ChangeRecord {
        event_id: record.event_id.clone(),
        transaction_id,
        service: service.to_owned(),
        table: table.to_owned(),
        key,
        change,
        version,
        committed_at: rfc3339(at.timestamp(), at.timestamp_subsec_nanos()),
        data,
        previous,
    }))
}

/// The version a committed delete would have written: the old one plus one, exactly.
fn next_version(old: &str) -> Result<Number, String> {
    let n: u64 = old.parse().map_err(|_| format!("OldImage version {old:?} is not a whole number"))?;
    let next = n.checked_add(1).ok_or_else(|| format!("OldImage version {old} overflows"))?;
    Ok(Number::from(next))
}

fn decide_transaction(record: &EventRecord) -> Decision {
    let new = record.change.new_image.inner();
    let old = record.change.old_image.inner();
    match record.event_name.as_str() {
        "INSERT" | "MODIFY" => {}
        // Terminal records expire by TTL; nothing to tell anyone.
        "REMOVE" => return Decision::Skip(Skip::NotAnOutcome),
        other => return Decision::Unprocessable(format!("unknown eventName {other:?}")),
    }
    if new.is_empty() {
        return Decision::Unprocessable("a transactions table record without NewImage".into());
    }
    let status = match optional_string(new, tx_attr::STATUS, "NewImage") {
        Ok(Some(status)) => status,
        Ok(None) => return Decision::Skip(Skip::NotAnOutcome),
        Err(message) => return Decision::Unprocessable(message),
    };
    if !matches!(status, "COMMITTED" | "ABORTED" | "PREPARED") {
        return Decision::Skip(Skip::NotAnOutcome);
    }
    let hold_until = match (status, new.get(tx_attr::HOLD_UNTIL)) {
        ("PREPARED", Some(AttributeValue::N(text))) => match text.parse::<u64>() {
            Ok(at) => Some(at),
            Err(_) => return Decision::Unprocessable(format!("NewImage holdUntil is not epoch milliseconds: {text}")),
        },
        ("PREPARED", other) => {
            return Decision::Unprocessable(format!("a PREPARED record without a numeric holdUntil: {other:?}"));
        }
        _ => None,
    };
    if string(old, tx_attr::STATUS) == Some(status) {
        return Decision::Skip(Skip::NotAnOutcome);
    }
    let id = string(record.change.keys.inner(), tx_attr::ID).or_else(|| string(new, tx_attr::ID));
    match id {
        Some(id) => {
            let principal = string(new, tx_attr::PRINCIPAL).map(str::to_owned);
            let (first_transaction_id, retried_as) = attempt_links(new, id);
            Decision::Ended(TransactionEnded {
                transaction_id: id.to_owned(),
                status: status.to_owned(),
                hold_until,
                first_transaction_id,
                retried_as,
                principal,
            })
        }
        None => Decision::Unprocessable("a transaction record without a string transactionId".into()),
    }
}

/// The links of an attempt of a request its coordinator retried: its first attempt's id (when it is not the
/// first) and the attempt it was retried as, read as [`twopc::record::TransactionRecord::successor`] reads
/// them: `retriedAs` only when it is the coordinator's link (`<first id>-<attempt + 1>`), never a caller's
/// token retry (a request of its own) that a record written before issue 41 names there.
fn attempt_links(new: &Image, id: &str) -> (Option<String>, Option<String>) {
    let first = string(new, tx_attr::FIRST_TRANSACTION_ID).filter(|first| *first != id);
    let attempt = match new.get(tx_attr::ATTEMPT) {
        Some(AttributeValue::N(n)) => n.parse::<u32>().unwrap_or(1),
        _ => 1,
    };
    let successor = attempt_id(first.unwrap_or(id), attempt.saturating_add(1));
    let retried_as = string(new, tx_attr::RETRIED_AS).filter(|next| *next == successor);
    // A token retry recorded before issue 41 (`<first>-r<n>`) carries the first id too: its request is its own.
    let first = first.filter(|first| id == attempt_id(first, attempt));
    (first.map(str::to_owned), retried_as.map(str::to_owned))
}

#[cfg(test)]
mod tests;
