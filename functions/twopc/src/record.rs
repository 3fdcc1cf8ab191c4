//! The transactions table: the record of each transaction and its status, every change of status a
//! conditional write on the status before it, so status only moves forward and exactly one decision wins.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::warn;

use crate::attr;
use crate::expr::{Expr, n, s};
use crate::model::{ErrorCode, Invalid, Operation, RefusalCode, Status, TransactionRequest, Vote};
use crate::size::{MAX_ITEM_BYTES, item_size};
use crate::store::write::{Decided, Sending, Write, conditional};
use crate::store::{Item, StoreError, shard_of};
use crate::tables::tx_attr as a;

/// Every function but the authorizer: the transactions table (default [`DEFAULT_TRANSACTIONS_TABLE`]).
pub const TRANSACTIONS_TABLE_NAME: &str = "TRANSACTIONS_TABLE_NAME";
pub const DEFAULT_TRANSACTIONS_TABLE: &str = "transactions";

/// The id the coordinator gives attempt `attempt` of the request first tried as `first_id`: the one rule
/// by which a `retriedAs` is told to be the coordinator's link (a token retry recorded before issue 41,
/// `<first id>-r<n>`, is not).
pub fn attempt_id(first_id: &str, attempt: u32) -> String {
    format!("{first_id}-{attempt}")
}

/// Terminal records of requests without an `Idempotency-Key` stay readable (`GET /transactions/{id}`) this
/// long, then TTL removes them. A keyed record is kept: it is what stops its key from ever running again.
pub const RETENTION_SECONDS: u64 = 7 * 24 * 3600;

/// What a record may grow by after its first write: every later write (votes with their lock tokens,
/// codes and reasons, the record's reason, the sweeper's fields, the terminal fields) in its worst
/// case, for [`crate::model::MAX_PARTICIPANTS`] participants, plus [`RESERVED_PER_PARTICIPANT_BYTES`] and
/// [`RESERVED_PER_RECORD_BYTES`] kept for fields later versions add. The unit test
/// `every_later_write_fits_the_headroom` applies each write to a record of [`MAX_RECORD_BYTES`].
pub const RECORD_HEADROOM_BYTES: usize = 32 * 1024;
/// The largest first write of a record: a request whose record would be larger is refused (400
/// `LIMIT_EXCEEDED`) before anything is written, so that every later write of its record fits
/// DynamoDB's 400 KB.
pub const MAX_RECORD_BYTES: usize = MAX_ITEM_BYTES - RECORD_HEADROOM_BYTES;
/// Free text a record keeps is cut to this many bytes (UTF-8, at a character boundary, ending in "…"):
/// each participant's `reason`, the record's `reason`.
pub const MAX_REASON_BYTES: usize = 512;
/// The sweeper's `sweepError` is cut the same way, to this many bytes.
pub const MAX_SWEEP_ERROR_BYTES: usize = 512;
/// Part of the headroom no write uses today: room per participant entry and per record for fields the
/// next versions add to the writes after the first (a rule's own code, a hold's fields, ...).
pub const RESERVED_PER_PARTICIPANT_BYTES: usize = 128;
pub const RESERVED_PER_RECORD_BYTES: usize = 4096;

/// The reason an aborted transaction's answer gives when its record keeps none: a record written
/// shortened, because the full write would have passed 400 KB.
pub const SHORTENED_REASON: &str = "aborted; the record was shortened to fit DynamoDB's 400 KB and keeps no reason";

/// Every top-level attribute a transaction record can have (the item [`TransactionRecord::to_item`] writes
/// with every field present). The unit test `record_attributes_are_every_field_of_the_record` holds it to
/// the record.
pub const RECORD_ATTRIBUTES: &[&str] = &[
    a::ID,
    a::STATUS,
    a::PARTICIPANTS,
    a::CREATED_AT,
    a::UPDATED_AT,
    a::DEADLINE,
    a::REASON,
    a::REQUEST_HASH,
    a::EXPIRE_AT,
    a::OPEN_SHARD,
    a::SWEEP_AT,
    a::SWEEP_ATTEMPTS,
    a::SWEEP_ERROR,
    a::EXECUTION_ID,
    a::PRINCIPAL,
    a::HOLD_MS,
    a::HOLD_UNTIL,
    a::STARTED_AT,
    a::ATTEMPT,
    a::FIRST_TRANSACTION_ID,
    a::RETRIED_AS,
    a::REFUSED_FOR_CONTENTION,
    a::AGE_CLAIMED_BY,
    a::AGE_OF,
    a::BODY_HASH,
];

/// The top-level attributes recovery may write to a record, as IAM's `dynamodb:Attributes` counts them
/// (with the key, which every request names, and those its conditions name): the sweeper's writes, which
/// run [`crate::coordinator::Coordinator::recover`] (an expired transaction's abort, the end of a decided
/// one, full or shortened), [`TransactionStore::postpone`] (full or shortened) and
/// [`crate::recovery::owner_fate`] (the ABORTED record of an owner that never wrote one,
/// [`TransactionStore::abort_if_absent`], and the abort of an expired one). The deployment refuses the
/// sweeper every other attribute (an IAM condition on `dynamodb:Attributes`): a write of one more fails in
/// AWS only, so the unit test `recovery_writes_only_what_recovery_writes_may_write` builds every such
/// write and fails until the attribute is added here (and then to the deployment's condition).
pub const RECOVERY_WRITES: &[&str] = &[
    a::ID,
    a::STATUS,
    a::PARTICIPANTS,
    a::CREATED_AT,
    a::UPDATED_AT,
    a::DEADLINE,
    a::REASON,
    a::EXPIRE_AT,
    a::OPEN_SHARD,
    a::SWEEP_AT,
    a::SWEEP_ATTEMPTS,
    a::SWEEP_ERROR,
];

/// The top-level attributes a lock resolver's abort of an expired owner writes (with the key and its
/// condition's status): the UpdateItem [`crate::recovery::owner_fate`] issues (PREPARING or PREPARED →
/// ABORTING with its reason, or its shortened form), the only one a participant makes to a record (its
/// one-phase commit puts a whole record). The deployment refuses a participant's UpdateItem every other
/// attribute; the unit test `an_owner_abort_writes_only_what_an_owner_abort_may_write` holds the writes to it.
pub const OWNER_ABORT_WRITES: &[&str] = &[a::ID, a::STATUS, a::UPDATED_AT, a::REASON, a::SWEEP_ERROR];

/// `text`, cut to at most `max` bytes at a character boundary, "…" marking the cut.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    const MARK: &str = "…";
    let mut end = max.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionRecord {
    pub transaction_id: String,
    pub status: Status,
    pub participants: Vec<ParticipantEntry>,
    pub created_at: u64,
    pub updated_at: u64,
    pub deadline: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_shard: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    /// Who asked for the transaction (the caller's principal, canonical: [`crate::principal`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// A held transaction: its request's `holdMs` (the prepares are held for the caller's commit or abort).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ms: Option<u64>,
    /// A held transaction recorded PREPARED: the caller may commit it until then (epoch ms, the
    /// coordinator's clock); past it and twice the clock margin, resolvers abort it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<u64>,
    /// An attempt after the first of a request refused for contention (issue 35): the request's age,
    /// its first attempt's start, which wait-die orders it by (absent: `createdAt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    /// This attempt's number in its request (absent: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The id of the request's first attempt (absent: this record's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_transaction_id: Option<String>,
    /// An aborted attempt that its coordinator retried: the next attempt's id, written in the same
    /// conditional write as this attempt's abort (records from before issue 41: claimed after it, by a
    /// conditional update of its own). Only [`TransactionRecord::successor`] is followed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried_as: Option<String>,
    /// The recorded abort is this attempt's own coordinator's refusal for contention: written only with
    /// that abort, so an abort by anyone else (the caller, an expiry, the sweeper, lock resolution) never
    /// gets a successor or an age token.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused_for_contention: bool,
    /// A caller's retry with this attempt's age token took its age: the retry's id (a request of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_claimed_by: Option<String>,
    /// A caller's retry with an age token: the refused attempt whose age it keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_of: Option<String>,
    /// The canonical hash of the request's body (issue 42), on every attempt the coordinator records:
    /// what a step along a chain compares ([`TransactionRecord::same_request`]). Absent on records written
    /// before it, and on those a resolver writes for an owner without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_hash: Option<String>,
}

/// One service's part, stored with its operations so that recovery can finish the transaction from
/// the record alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParticipantEntry {
    pub service: String,
    pub operations: Vec<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vote: Option<Vote>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<RefusalCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Locked nothing at prepare: takes no part in commit or abort.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// The token of the locks its PREPARED vote reported: commit and roll-forward apply only those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_token: Option<String>,
    /// A `RULE` refusal: the service's own code (cut to `MAX_SERVICE_CODE_BYTES`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_code: Option<String>,
    /// A `CONFLICT` refusal: the older transaction whose lock refused it, which the coordinator's retry
    /// waits for. Not recorded: it is only the next attempt's business.
    #[serde(skip)]
    pub blocked_by: Option<String>,
    /// A `CONFLICT` refusal at a lock whose owner is past its deadline and the coordinator could not
    /// resolve (it has no record: the sweeper's): no retry can wait it out. Not recorded.
    #[serde(skip)]
    pub unresolved_owner: Option<String>,
}

impl ParticipantEntry {
    /// A service's part before its prepare answered.
    pub fn new(service: String, operations: Vec<Value>) -> ParticipantEntry {
        ParticipantEntry {
            service,
            operations,
            vote: None,
            code: None,
            reason: None,
            read_only: false,
            lock_token: None,
            service_code: None,
            blocked_by: None,
            unresolved_owner: None,
        }
    }
}

impl TransactionRecord {
    /// The record with its free text cut to what it may keep ([`MAX_REASON_BYTES`], [`MAX_SWEEP_ERROR_BYTES`]).
    pub fn bounded(mut self) -> TransactionRecord {
        self.reason = self.reason.map(|r| cut(&r, MAX_REASON_BYTES));
        self.sweep_error = self.sweep_error.map(|e| cut(&e, MAX_SWEEP_ERROR_BYTES));
        for entry in &mut self.participants {
            entry.reason = entry.reason.take().map(|r| cut(&r, MAX_REASON_BYTES));
            entry.service_code = entry.service_code.take().map(|c| cut(&c, crate::model::MAX_SERVICE_CODE_BYTES));
        }
        self
    }

    /// A new transaction's record, PREPARING, with each participant's operations as the coordinator
    /// sends them and an execution id of its own; open from `now_ms` until the request's deadline.
    pub fn preparing(
        transaction_id: String,
        request: &TransactionRequest,
        request_hash: Option<String>,
        now_ms: u64,
    ) -> TransactionRecord {
        TransactionRecord {
            transaction_id,
            status: Status::Preparing,
            participants: request
                .participants
                .iter()
                .map(|p| {
                    ParticipantEntry::new(p.service.clone(), p.operations.iter().map(Operation::to_json).collect())
                })
                .collect(),
            created_at: now_ms,
            updated_at: now_ms,
            deadline: now_ms + request.timeout_ms,
            reason: None,
            request_hash,
            expire_at: None,
            open_shard: None,
            sweep_at: None,
            sweep_attempts: None,
            sweep_error: None,
            execution_id: Some(uuid::Uuid::new_v4().simple().to_string()),
            principal: None,
            hold_ms: request.hold_ms,
            hold_until: None,
            started_at: None,
            attempt: None,
            first_transaction_id: None,
            retried_as: None,
            refused_for_contention: false,
            age_claimed_by: None,
            age_of: None,
            body_hash: Some(request.canonical_hash()),
        }
    }

    /// The time wait-die orders this transaction by: its request's first attempt's start.
    pub fn age(&self) -> u64 {
        self.started_at.unwrap_or(self.created_at)
    }

    /// This attempt's number in its request.
    pub fn attempt_number(&self) -> u32 {
        self.attempt.unwrap_or(1)
    }

    /// The id of the request's first attempt.
    pub fn first_id(&self) -> &str {
        self.first_transaction_id.as_deref().unwrap_or(&self.transaction_id)
    }

    /// The attempt its coordinator retried this one as: `retriedAs` when it is the coordinator's link, the
    /// next attempt of the same request (`<first id>-<attempt + 1>`). A record written before issue 41 may
    /// name a caller's token retry there (`<first id>-r<n>`): a request of its own, never followed.
    pub fn successor(&self) -> Option<&str> {
        let next = self.retried_as.as_deref()?;
        let expected = attempt_id(self.first_id(), self.attempt_number() + 1);
        (next == expected).then_some(next)
    }

    /// Whether `attempt`, reached from this record along its request's chain (a token's claim, a key's
    /// replay, a held decision), is an attempt of this record's request: the same caller and the same body
    /// (issue 42). A record written before `bodyHash` is compared by its `requestHash` (a keyed or token
    /// request's, the same hash); one with neither (unkeyed from before, or written by a resolver for an
    /// owner without a record) cannot be told to be the request's, and is not.
    pub fn same_request(&self, attempt: &TransactionRecord) -> bool {
        fn hash(record: &TransactionRecord) -> Option<&str> {
            record.body_hash.as_deref().or(record.request_hash.as_deref())
        }
        match (hash(self), hash(attempt)) {
            (Some(ours), Some(theirs)) => ours == theirs && self.principal == attempt.principal,
            _ => false,
        }
    }

    /// This record as attempt `attempt` of the request first tried as `first_transaction_id` at
    /// `started_at` (its age).
    pub fn as_attempt(mut self, started_at: u64, attempt: u32, first_transaction_id: String) -> TransactionRecord {
        self.started_at = Some(started_at);
        self.attempt = Some(attempt);
        self.first_transaction_id = Some(first_transaction_id);
        self
    }

    /// The next attempt of this one's request: its own id and number, the same age, request, caller and
    /// deadline (the request's timeout covers every attempt), a new execution.
    pub fn next_attempt(&self, transaction_id: String, attempt: u32, now_ms: u64) -> TransactionRecord {
        let participants =
            self.participants.iter().map(|p| ParticipantEntry::new(p.service.clone(), p.operations.clone()));
        TransactionRecord {
            transaction_id,
            status: Status::Preparing,
            participants: participants.collect(),
            created_at: now_ms,
            updated_at: now_ms,
            deadline: self.deadline,
            reason: None,
            request_hash: self.request_hash.clone(),
            expire_at: None,
            open_shard: None,
            sweep_at: None,
            sweep_attempts: None,
            sweep_error: None,
            execution_id: Some(uuid::Uuid::new_v4().simple().to_string()),
            principal: self.principal.clone(),
            hold_ms: self.hold_ms,
            hold_until: None,
            started_at: None,
            attempt: None,
            first_transaction_id: None,
            retried_as: None,
            refused_for_contention: false,
            age_claimed_by: None,
            age_of: None,
            body_hash: self.body_hash.clone(),
        }
        .as_attempt(self.age(), attempt, self.first_id().to_owned())
    }

    /// Whether the request asked to hold the prepares (`holdMs`) for a caller's commit or abort.
    pub fn is_held(&self) -> bool {
        self.hold_ms.is_some()
    }

    /// When an undecided transaction may be resolved by someone other than its coordinator (after this and
    /// twice the clock margin, [`crate::clock::resolvable_after`]): a PREPARED one's `holdUntil`, any
    /// other's deadline.
    pub fn expiry(&self) -> u64 {
        match (self.status, self.hold_until) {
            (Status::Prepared, Some(hold_until)) => hold_until,
            _ => self.deadline,
        }
    }

    /// The bytes DynamoDB counts for the record's first write (in its open form).
    pub fn first_write_bytes(&self) -> usize {
        item_size(&self.clone().opened().to_item())
    }

    /// An ended record shortened to what DynamoDB will always store: no free text, and the participants
    /// without their operations (see [`shortened_transition_update`]).
    pub fn shortened(&self) -> TransactionRecord {
        debug_assert!(self.status.is_terminal());
        TransactionRecord {
            participants: ended_entries(&self.participants),
            reason: None,
            sweep_error: None,
            ..self.clone()
        }
    }

    /// Refuses a record whose first write would pass [`MAX_RECORD_BYTES`]: its later writes might then
    /// not fit DynamoDB's 400 KB. Sized as DynamoDB sizes it (nested lists and maps cost more than their
    /// JSON), in its open form.
    pub fn check_first_write(&self) -> Result<(), Invalid> {
        let bytes = self.first_write_bytes();
        if bytes > MAX_RECORD_BYTES {
            return Err(Invalid::new(
                ErrorCode::LimitExceeded,
                format!(
                    "participants: the transaction record would take {bytes} bytes as DynamoDB counts them; the limit \
                     is {MAX_RECORD_BYTES} bytes (DynamoDB's 400 KB less {RECORD_HEADROOM_BYTES} bytes kept for the \
                     votes, reasons and recovery fields written later): write less data in one transaction"
                ),
            ));
        }
        Ok(())
    }

    /// This record as a terminal one created at `now_ms`: out of the open-transactions index, with its
    /// retention clock started (what [`TransactionStore::transition`] writes for a terminal status).
    pub fn ended(mut self, status: Status, now_ms: u64) -> TransactionRecord {
        debug_assert!(status.is_terminal());
        self.status = status;
        self.updated_at = now_ms;
        self.open_shard = None;
        self.sweep_at = None;
        self.expire_at = (!self.is_keyed()).then_some(now_ms / 1000 + RETENTION_SECONDS);
        self
    }

    /// Whether an `Idempotency-Key` named this transaction (its record is then kept for ever).
    pub fn is_keyed(&self) -> bool {
        self.request_hash.is_some()
    }

    /// This record as open: in the open-transactions index, first due for the sweeper at its deadline.
    pub fn opened(mut self) -> TransactionRecord {
        self.open_shard = Some(open_shard(&self.transaction_id));
        self.sweep_at = Some(self.deadline);
        self
    }

    pub fn to_item(&self) -> Item {
        let Value::Object(map) = serde_json::to_value(self).expect("records serialize") else {
            unreachable!("a struct serializes to an object")
        };
        attr::to_item(&map)
    }

    pub fn from_item(item: &Item) -> Result<TransactionRecord, StoreError> {
        serde_json::from_value(Value::Object(attr::item_to_json(item)))
            .map_err(|e| StoreError::internal("decode", "", format!("transaction record is malformed: {e}")))
    }

    /// The contract's answer body.
    pub fn to_response(&self) -> Value {
        let participants: Vec<Value> = self
            .participants
            .iter()
            .map(|p| {
                let mut entry = serde_json::Map::new();
                entry.insert("service".into(), Value::String(p.service.clone()));
                if let Some(vote) = p.vote {
                    entry.insert("vote".into(), serde_json::to_value(vote).expect("votes serialize"));
                }
                if let Some(reason) = &p.reason {
                    entry.insert("reason".into(), Value::String(reason.clone()));
                }
                if let Some(code) = p.code {
                    entry.insert("code".into(), serde_json::to_value(code).expect("codes serialize"));
                }
                if let Some(service_code) = &p.service_code {
                    entry.insert("serviceCode".into(), Value::String(service_code.clone()));
                }
                Value::Object(entry)
            })
            .collect();
        let mut body = serde_json::Map::new();
        body.insert("transactionId".into(), Value::String(self.transaction_id.clone()));
        body.insert("status".into(), Value::String(self.status.as_str().into()));
        let shortened = matches!(self.status, Status::Aborting | Status::Aborted).then_some(SHORTENED_REASON);
        if let Some(reason) = self.reason.as_deref().or(shortened) {
            body.insert("reason".into(), Value::String(reason.to_owned()));
        }
        body.insert("participants".into(), Value::Array(participants));
        if let Some(hold_until) = self.hold_until {
            body.insert("holdUntil".into(), Value::from(hold_until));
        }
        if self.attempt_number() > 1 {
            body.insert("attempts".into(), Value::from(self.attempt_number()));
            body.insert("firstTransactionId".into(), Value::String(self.first_id().to_owned()));
            body.insert("startedAt".into(), Value::from(self.age()));
        }
        if let Some(next) = self.successor() {
            body.insert("retriedAs".into(), Value::String(next.to_owned()));
        }
        if let Some(of) = &self.age_of {
            body.insert("ageOf".into(), Value::String(of.clone()));
            body.insert("startedAt".into(), Value::from(self.age()));
        }
        if let Some(by) =
            self.age_claimed_by.as_ref().or(self.retried_as.as_ref().filter(|_| self.successor().is_none()))
        {
            body.insert("ageClaimedBy".into(), Value::String(by.clone()));
        }
        body.insert("createdAt".into(), Value::from(self.created_at));
        body.insert("updatedAt".into(), Value::from(self.updated_at));
        Value::Object(body)
    }
}

/// What a conditional status change found.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// This write made the change.
    Done(TransactionRecord),
    /// The record was not in the expected status: here it is as it is (None: there is no record).
    Lost(Option<TransactionRecord>),
}

#[derive(Debug, Clone)]
pub struct TransactionStore {
    pub(crate) client: Client,
    pub(crate) table: String,
}

impl TransactionStore {
    pub fn new(client: Client, table: impl Into<String>) -> TransactionStore {
        TransactionStore { client, table: table.into() }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub(crate) fn key(id: &str) -> Item {
        Item::from([(a::ID.to_owned(), s(id))])
    }

    /// Writes a new record unless one with its id exists; returns the existing one then. Free text is cut
    /// to what a record keeps. A terminal record DynamoDB refuses as invalid (it would pass 400 KB) is
    /// written again shortened ([`TransactionRecord::shortened`]): an ended transaction's record always
    /// gets written.
    pub async fn create(&self, record: &TransactionRecord) -> Result<Option<TransactionRecord>, StoreError> {
        let record = record.clone().bounded();
        match self.put_new(&record).await {
            Err(e) if e.invalid && record.status.is_terminal() => {
                warn!(tx = %record.transaction_id, error = %e, "record refused as invalid; writing it shortened");
                self.put_new(&record.shortened()).await
            }
            other => other,
        }
    }

    async fn put_new(&self, record: &TransactionRecord) -> Result<Option<TransactionRecord>, StoreError> {
        let mut e = Expr::new();
        let id = e.name(a::ID);
        let write = Write::put(&self.table, record.to_item(), format!("attribute_not_exists({id})"), e);
        match conditional(&self.client, vec![write], Sending::default()).await?.decided()? {
            Decided::Applied(_) => Ok(None),
            refused => {
                match refused.refused_item() {
                    Some(item) => Ok(Some(TransactionRecord::from_item(&item)?)),
                    None => self.get(&record.transaction_id).await?.map(Some).ok_or_else(|| {
                        StoreError::internal("PutItem", &self.table, "record exists but cannot be read")
                    }),
                }
            }
        }
    }

    pub async fn get(&self, id: &str) -> Result<Option<TransactionRecord>, StoreError> {
        // An id DynamoDB would refuse as a key (a client's `GET /transactions/{id}`) names no record: that
        // is the answer, not the store's ValidationException, which would read as the store failing.
        if id.is_empty() || id.len() > crate::model::MAX_KEY_BYTES {
            return Ok(None);
        }
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::new("GetItem", &self.table, e))?;
        out.item.as_ref().map(TransactionRecord::from_item).transpose()
    }

    /// Moves the record from `from` to `to` if, and only if, it is in `from`. Votes and a reason may be
    /// written with the change. Terminal states drop the record from the open-transactions index and,
    /// unless it is `keyed`, start its retention clock.
    ///
    /// If DynamoDB refuses the change as invalid (the record would pass 400 KB: one written before
    /// records were bounded, or a size this code misjudged), it is written again in its shortened form
    /// ([`shortened_transition_update`]), which never makes the record larger than it is, so that a
    /// transaction always reaches its end.
    #[allow(clippy::too_many_arguments)]
    pub async fn transition(
        &self,
        id: &str,
        from: Status,
        to: Status,
        keyed: bool,
        now_ms: u64,
        participants: Option<&[ParticipantEntry]>,
        reason: Option<&str>,
    ) -> Result<Transition, StoreError> {
        self.transition_with(id, from, to, keyed, now_ms, participants, reason, &[]).await
    }

    /// [`TransactionStore::transition`], setting `extra` attributes too (in the shortened form as well).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn transition_with(
        &self,
        id: &str,
        from: Status,
        to: Status,
        keyed: bool,
        now_ms: u64,
        participants: Option<&[ParticipantEntry]>,
        reason: Option<&str>,
        extra: &[(&'static str, AttributeValue)],
    ) -> Result<Transition, StoreError> {
        let with_extra = |mut update: RecordUpdate| {
            for (name, value) in extra {
                update = update.set(name, value.clone());
            }
            update
        };
        let full = with_extra(transition_update(to, keyed, now_ms, participants, reason));
        match self.update_status(id, from, &full).await {
            Err(e) if e.invalid => {
                warn!(tx = id, to = %to, error = %e, "status change refused as invalid; writing it shortened");
                let Some(current) = self.get(id).await? else { return Ok(Transition::Lost(None)) };
                if current.status != from {
                    return Ok(Transition::Lost(Some(current)));
                }
                let shortened = with_extra(shortened_transition_update(&current, to, keyed, now_ms, participants));
                self.update_status(id, from, &shortened).await
            }
            other => other,
        }
    }

    /// The hold of a transaction whose participants all prepared: PREPARING → PREPARED with the votes,
    /// `holdUntil`, and its entry in the sweeper's index moved to `holdUntil` (the sweeper's grace adds
    /// twice the clock margin, as for a deadline). Conditional like every status change.
    pub async fn hold(
        &self,
        id: &str,
        now_ms: u64,
        participants: &[ParticipantEntry],
        hold_until: u64,
    ) -> Result<Transition, StoreError> {
        let extra = [(a::HOLD_UNTIL, n(hold_until)), (a::SWEEP_AT, n(hold_until))];
        self.transition_with(id, Status::Preparing, Status::Prepared, true, now_ms, Some(participants), None, &extra)
            .await
    }

    /// [`TransactionStore::transition`] of an open transaction that also moves its entry in the sweeper's
    /// index to `sweep_at`: a held transaction's decision, whose `sweepAt` was its `holdUntil`.
    #[allow(clippy::too_many_arguments)]
    pub async fn transition_due(
        &self,
        id: &str,
        from: Status,
        to: Status,
        keyed: bool,
        now_ms: u64,
        reason: Option<&str>,
        sweep_at: u64,
    ) -> Result<Transition, StoreError> {
        debug_assert!(!to.is_terminal());
        self.transition_with(id, from, to, keyed, now_ms, None, reason, &[(a::SWEEP_AT, n(sweep_at))]).await
    }

    /// One conditional status change: `update` if the record is in `from`.
    async fn update_status(&self, id: &str, from: Status, update: &RecordUpdate) -> Result<Transition, StoreError> {
        let mut e = Expr::new();
        let expression = update.expression(&mut e);
        let condition = format!("{} = {}", e.name(a::STATUS), e.value(s(from.as_str())));
        self.update_if(id, e, expression, condition).await
    }

    /// One conditional UpdateItem of record `id` (`e` holds the expressions' names and values): the record
    /// it wrote, or, when the condition failed, the record as it is (`Lost(None)`: there is none).
    async fn update_if(
        &self,
        id: &str,
        e: Expr,
        expression: String,
        condition: String,
    ) -> Result<Transition, StoreError> {
        let write = Write::update(&self.table, Self::key(id), expression, condition, e);
        match conditional(&self.client, vec![write], Sending::default().returning_new()).await?.decided()? {
            Decided::Applied(item) => Ok(Transition::Done(TransactionRecord::from_item(&item.unwrap_or_default())?)),
            // An update on a missing key fails the condition with no item: there is no record.
            refused => match refused.refused_item() {
                Some(item) => Ok(Transition::Lost(Some(TransactionRecord::from_item(&item)?))),
                None => Ok(Transition::Lost(self.get(id).await?)),
            },
        }
    }

    /// Records that a transaction with no record is aborted, unless a record appears first. Lock
    /// resolution does this before releasing a lock whose owner never wrote its record, so that owner
    /// can never commit afterwards. Returns the record as it now is.
    pub async fn abort_if_absent(&self, id: &str, now_ms: u64, reason: &str) -> Result<TransactionRecord, StoreError> {
        let record = absent_owner_record(id, now_ms, reason);
        Ok(self.create(&record).await?.unwrap_or(record))
    }

    /// Puts an open transaction the sweeper could not finish behind the others until `sweep_at`, with why
    /// (cut to [`MAX_SWEEP_ERROR_BYTES`]), so that the next runs reach what stands behind it. Only while it
    /// is open (whatever its status now: the sweeper's own recovery may have moved it on before failing),
    /// never once it ended. Refused as invalid (the record would pass 400 KB), it is postponed shortened
    /// ([`shortened_postpone_update`]), which does not make a postponed record larger: the entry still moves
    /// back in the index.
    pub async fn postpone(&self, id: &str, sweep_at: u64, attempts: u32, error: &str) -> Result<bool, StoreError> {
        match self.update_open(id, &postpone_update(sweep_at, attempts, error)).await {
            Err(e) if e.invalid => {
                warn!(tx = id, error = %e, "postponement refused as invalid; postponing without the error");
                self.update_open(id, &shortened_postpone_update(sweep_at)).await
            }
            other => other,
        }
    }

    /// `update` on a record that is still open: whether it was.
    async fn update_open(&self, id: &str, update: &RecordUpdate) -> Result<bool, StoreError> {
        let mut e = Expr::new();
        let expression = update.expression(&mut e);
        let condition = format!("attribute_exists({})", e.name(a::OPEN_SHARD));
        let write = Write::update(&self.table, Self::key(id), expression, condition, e);
        Ok(conditional(&self.client, vec![write], Sending::default()).await?.decided()?.applied())
    }

    /// Ids of open transactions due for the sweeper before `before_ms`, at most `limit` from each shard.
    pub async fn open_before(&self, before_ms: u64, limit: i32) -> Result<Vec<String>, StoreError> {
        let entries = crate::store::page_shards(limit, |shard, limit, start| {
            let mut e = Expr::new();
            let condition = format!(
                "{} = {} AND {} < {}",
                e.name(a::OPEN_SHARD),
                e.value(s(format!("open#{shard}"))),
                e.name(a::SWEEP_AT),
                e.value(n(before_ms))
            );
            let query = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(crate::tables::OPEN_TRANSACTIONS_INDEX)
                .key_condition_expression(condition)
                .set_expression_attribute_names(e.names())
                .set_expression_attribute_values(e.values())
                .limit(limit)
                .set_exclusive_start_key(start);
            async move {
                let out = query.send().await.map_err(|err| StoreError::new("Query", &self.table, err))?;
                Ok((out.items.unwrap_or_default(), out.last_evaluated_key))
            }
        })
        .await?;
        Ok(entries.iter().filter_map(|i| crate::store::get_s(i, a::ID).map(str::to_owned)).collect())
    }
}

/// The record [`TransactionStore::abort_if_absent`] writes: ABORTED, with no participants, ended at `now_ms`.
pub(crate) fn absent_owner_record(id: &str, now_ms: u64, reason: &str) -> TransactionRecord {
    TransactionRecord {
        transaction_id: id.to_owned(),
        status: Status::Aborted,
        participants: vec![],
        created_at: now_ms,
        updated_at: now_ms,
        deadline: now_ms,
        reason: Some(reason.to_owned()),
        request_hash: None,
        expire_at: None,
        open_shard: None,
        sweep_at: None,
        sweep_attempts: None,
        sweep_error: None,
        execution_id: None,
        principal: None,
        hold_ms: None,
        hold_until: None,
        started_at: None,
        attempt: None,
        first_transaction_id: None,
        retried_as: None,
        refused_for_contention: false,
        age_claimed_by: None,
        age_of: None,
        body_hash: None,
    }
    .ended(Status::Aborted, now_ms)
}

/// The open-index shard a new record is written under.
pub fn open_shard(id: &str) -> String {
    shard_of(id, "open")
}

pub fn status_of(item: &Item) -> Option<Status> {
    item.get(a::STATUS).and_then(|v| match v {
        AttributeValue::S(text) => Status::parse(text),
        _ => None,
    })
}

/// One change of a record: the attributes it sets and the ones it removes. DynamoDB applies it as an
/// update expression; the headroom test applies it in memory, so both size the same write.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordUpdate {
    pub set: Vec<(&'static str, AttributeValue)>,
    pub remove: Vec<&'static str>,
}

impl RecordUpdate {
    fn set(mut self, name: &'static str, value: AttributeValue) -> RecordUpdate {
        self.set.push((name, value));
        self
    }

    fn remove(mut self, name: &'static str) -> RecordUpdate {
        self.remove.push(name);
        self
    }

    /// Every top-level attribute the update names: those it sets, then those it removes.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.set.iter().map(|(name, _)| *name).chain(self.remove.iter().copied())
    }

    /// The item as DynamoDB stores it after this update.
    pub fn applied_to(&self, item: &Item) -> Item {
        let mut item = item.clone();
        for (name, value) in &self.set {
            item.insert((*name).to_owned(), value.clone());
        }
        for name in &self.remove {
            item.remove(*name);
        }
        item
    }

    fn expression(&self, e: &mut Expr) -> String {
        let sets: Vec<String> =
            self.set.iter().map(|(name, value)| format!("{} = {}", e.name(name), e.value(value.clone()))).collect();
        let mut expression = format!("SET {}", sets.join(", "));
        if !self.remove.is_empty() {
            let removes: Vec<String> = self.remove.iter().map(|name| e.name(name)).collect();
            expression += &format!(" REMOVE {}", removes.join(", "));
        }
        expression
    }
}

/// The participant entries as the record stores them, reasons cut to [`MAX_REASON_BYTES`].
fn entries_value(participants: &[ParticipantEntry]) -> AttributeValue {
    let bounded: Vec<ParticipantEntry> = participants
        .iter()
        .cloned()
        .map(|mut p| {
            p.reason = p.reason.map(|r| cut(&r, MAX_REASON_BYTES));
            p.service_code = p.service_code.map(|c| cut(&c, crate::model::MAX_SERVICE_CODE_BYTES));
            p
        })
        .collect();
    attr::to_attribute(&serde_json::to_value(bounded).expect("entries serialize"))
}

/// A status change in full: the status and its time, the votes and the reason when given (cut to
/// [`MAX_REASON_BYTES`]); a terminal status leaves the open-transactions index and, unless `keyed`,
/// starts the retention clock.
pub fn transition_update(
    to: Status,
    keyed: bool,
    now_ms: u64,
    participants: Option<&[ParticipantEntry]>,
    reason: Option<&str>,
) -> RecordUpdate {
    let mut update = RecordUpdate::default().set(a::STATUS, s(to.as_str())).set(a::UPDATED_AT, n(now_ms));
    if let Some(participants) = participants {
        update = update.set(a::PARTICIPANTS, entries_value(participants));
    }
    if let Some(reason) = reason {
        update = update.set(a::REASON, s(cut(reason, MAX_REASON_BYTES)));
    }
    terminal_fields(update, to, keyed, now_ms)
}

/// A PREPARED write's hold fields: `holdUntil`, and `sweepAt` moved to it.
pub fn hold_update(update: RecordUpdate, hold_until: u64) -> RecordUpdate {
    update.set(a::HOLD_UNTIL, n(hold_until)).set(a::SWEEP_AT, n(hold_until))
}

fn terminal_fields(mut update: RecordUpdate, to: Status, keyed: bool, now_ms: u64) -> RecordUpdate {
    if to.is_terminal() {
        if !keyed {
            update = update.set(a::EXPIRE_AT, n(now_ms / 1000 + RETENTION_SECONDS));
        }
        update = update.remove(a::OPEN_SHARD).remove(a::SWEEP_AT);
    }
    update
}

/// A status change that never makes `current` larger than it is (so DynamoDB, which stored `current`,
/// stores it too), written when the full form is refused as invalid. It drops all free text (the
/// record's reason, `sweepError`, the participants' reasons and codes) and keeps `requestHash`,
/// `executionId`, every service and lock token, and every operation not applied yet:
/// - COMMITTING: the votes (with their lock tokens) without reasons or codes: a commit decision needs the
///   tokens, and is the one change that can still be too large; the coordinator then writes the abort;
/// - ABORTING: the participants as they are (their operations name the items to release);
/// - COMMITTED and ABORTED: the participants without their operations, all applied or none ever to be.
pub fn shortened_transition_update(
    current: &TransactionRecord,
    to: Status,
    keyed: bool,
    now_ms: u64,
    participants: Option<&[ParticipantEntry]>,
) -> RecordUpdate {
    let mut update = RecordUpdate::default().set(a::STATUS, s(to.as_str())).remove(a::REASON).remove(a::SWEEP_ERROR);
    // A later time can take more bytes than the one it replaces: written only by an end, which drops far
    // more (the operations, `openShard`, `sweepAt`).
    if to.is_terminal() {
        update = update.set(a::UPDATED_AT, n(now_ms));
    }
    let entries = participants.unwrap_or(&current.participants);
    match to {
        Status::Committing | Status::Prepared => {
            let votes: Vec<ParticipantEntry> = entries
                .iter()
                .cloned()
                .map(|p| ParticipantEntry { reason: None, code: None, service_code: None, ..p })
                .collect();
            update = update.set(a::PARTICIPANTS, entries_value(&votes));
        }
        Status::Committed | Status::Aborted => {
            update = update.set(a::PARTICIPANTS, entries_value(&ended_entries(&current.participants)));
        }
        Status::Preparing | Status::Aborting => {}
    }
    terminal_fields(update, to, keyed, now_ms)
}

/// An ended transaction's entries, shortened: each service with its vote and lock token, no operations
/// and no free text.
fn ended_entries(entries: &[ParticipantEntry]) -> Vec<ParticipantEntry> {
    entries
        .iter()
        .cloned()
        .map(|p| ParticipantEntry { operations: vec![], reason: None, code: None, service_code: None, ..p })
        .collect()
}

/// The sweeper's postponement: when to look again, how many attempts, and why (cut to
/// [`MAX_SWEEP_ERROR_BYTES`]).
pub fn postpone_update(sweep_at: u64, attempts: u32, error: &str) -> RecordUpdate {
    RecordUpdate::default()
        .set(a::SWEEP_AT, n(sweep_at))
        .set(a::SWEEP_ATTEMPTS, n(attempts))
        .set(a::SWEEP_ERROR, s(cut(error, MAX_SWEEP_ERROR_BYTES)))
}

/// A postponement that does not make a postponed record larger: `sweepAt` only (its entry still moves
/// back in the index), the attempts and the error removed; the next postponement counts from one again.
/// (A record never postponed before has neither to remove: its new `sweepAt` can take a byte or more
/// than its old one when that one ended in zeros.)
pub fn shortened_postpone_update(sweep_at: u64) -> RecordUpdate {
    RecordUpdate::default().set(a::SWEEP_AT, n(sweep_at)).remove(a::SWEEP_ATTEMPTS).remove(a::SWEEP_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MAX_PARTICIPANTS;
    use crate::size::item_size;

    /// A record whose first write is exactly [`MAX_RECORD_BYTES`], with the most participants, each with
    /// one operation; the first operation's data is padded to the bound.
    fn record_at_the_bound(keyed: bool) -> TransactionRecord {
        let entry = |i: usize, data: &str| ParticipantEntry {
            service: format!("service-{i:02}"),
            operations: vec![serde_json::json!({"op": "put", "key": {"entityId": "A"}, "data": {"x": data}})],
            vote: None,
            code: None,
            reason: None,
            read_only: false,
            lock_token: None,
            service_code: None,
            blocked_by: None,
            unresolved_owner: None,
        };
        let mut record = TransactionRecord {
            transaction_id: "tx-00000000000000000000000000000000".into(),
            status: Status::Preparing,
            participants: (0..MAX_PARTICIPANTS).map(|i| entry(i, "")).collect(),
            created_at: 1_764_000_000_000,
            updated_at: 1_764_000_000_000,
            deadline: 1_764_000_025_000,
            reason: None,
            request_hash: keyed.then(|| "0".repeat(64)),
            expire_at: None,
            open_shard: None,
            sweep_at: None,
            sweep_attempts: None,
            sweep_error: None,
            execution_id: Some("0".repeat(32)),
            principal: Some(format!("arn:aws:sts::123456789012:assumed-role/{}", "r".repeat(64))),
            hold_ms: Some(crate::model::DEFAULT_MAX_HOLD_MS),
            hold_until: None,
            // A later attempt's: what an attempt adds to its record is inside the headroom too.
            started_at: Some(1_764_000_000_000),
            attempt: Some(u32::MAX),
            first_transaction_id: Some("tx-00000000000000000000000000000000".into()),
            retried_as: None,
            refused_for_contention: false,
            age_claimed_by: None,
            // A caller's retry with an age token names the attempt whose age it keeps.
            age_of: Some(format!("tx-{}-{}", "0".repeat(32), u32::MAX)),
            body_hash: Some("0".repeat(64)),
        }
        .opened();
        let short = item_size(&record.to_item());
        record.participants[0] = entry(0, &"d".repeat(MAX_RECORD_BYTES - short));
        assert_eq!(item_size(&record.to_item()), MAX_RECORD_BYTES);
        assert!(record.check_first_write().is_ok());
        record
    }

    /// The largest vote a participant can leave in a record: every field at once, at its longest.
    fn worst_votes(record: &TransactionRecord) -> Vec<ParticipantEntry> {
        let longest_code = RefusalCode::ALL
            .into_iter()
            .max_by_key(|c| serde_json::to_value(c).unwrap().as_str().unwrap().len())
            .unwrap();
        record
            .participants
            .iter()
            .cloned()
            .map(|p| ParticipantEntry {
                vote: Some(Vote::Prepared),
                code: Some(longest_code),
                reason: Some("é".repeat(MAX_REASON_BYTES)),
                read_only: true,
                lock_token: Some("f".repeat(32)),
                service_code: Some("c".repeat(crate::model::MAX_SERVICE_CODE_BYTES)),
                ..p
            })
            .collect()
    }

    const LATEST: u64 = u64::MAX;

    /// Every write after the first, applied in turn to a record at the bound in the order that grows it
    /// most (a postponement, the decision with the largest votes and reason, another postponement, the
    /// end), stays under DynamoDB's 400 KB with the reserved room left over; so do the records created
    /// with votes (an unkeyed decision, an abort without a record, a one-phase commit).
    #[test]
    fn every_later_write_fits_the_headroom() {
        let reserved = RESERVED_PER_RECORD_BYTES + MAX_PARTICIPANTS * RESERVED_PER_PARTICIPANT_BYTES;
        let limit = MAX_ITEM_BYTES - reserved;
        let long_text = "x".repeat(100_000);
        let mut largest = 0;
        for keyed in [true, false] {
            let base = record_at_the_bound(keyed);
            let votes = worst_votes(&base);
            // Decided at once (the decision carries the votes), or held first (the hold carries them, then
            // the caller's or the expiry's decision).
            for (held, decision) in
                [false, true].into_iter().flat_map(|h| [(h, Status::Committing), (h, Status::Aborting)])
            {
                let terminal = if decision == Status::Committing { Status::Committed } else { Status::Aborted };
                let mut writes = vec![("postpone", postpone_update(LATEST, u32::MAX, &long_text))];
                if held {
                    let hold = transition_update(Status::Prepared, keyed, LATEST, Some(&votes), None);
                    writes.push(("hold", hold_update(hold, LATEST)));
                }
                let decision_votes = if held { None } else { Some(&votes[..]) };
                writes.extend([
                    ("decision", transition_update(decision, keyed, LATEST, decision_votes, Some(&long_text))),
                    ("postpone again", postpone_update(LATEST, u32::MAX, &long_text)),
                    ("end", transition_update(terminal, keyed, LATEST, None, None)),
                ]);
                let mut item = base.to_item();
                for (name, write) in writes {
                    item = write.applied_to(&item);
                    let bytes = item_size(&item);
                    largest = largest.max(bytes);
                    assert!(
                        bytes <= limit,
                        "{name} to {decision} (keyed {keyed}, held {held}): {bytes} bytes > {limit}"
                    );
                }
            }
            // Lock resolution's abort of a PREPARING record, with its reason.
            let resolved = transition_update(Status::Aborting, keyed, LATEST, None, Some(&long_text));
            assert!(item_size(&resolved.applied_to(&base.to_item())) <= limit);
        }
        // Created with votes: an unkeyed commit decision, an abort of a record never written (with the
        // reason), a one-phase commit's record; each then postponed and ended.
        let base = record_at_the_bound(false);
        let votes = worst_votes(&base);
        for (status, reason) in [(Status::Committing, None), (Status::Aborted, Some(long_text.clone()))] {
            let mut created = TransactionRecord { status, participants: votes.clone(), reason, ..base.clone() };
            if status.is_terminal() {
                created = created.ended(status, LATEST);
            }
            let mut item = created.bounded().to_item();
            assert!(item_size(&item) <= limit, "created {status}: {}", item_size(&item));
            item = postpone_update(LATEST, u32::MAX, &long_text).applied_to(&item);
            item = transition_update(Status::Committed, false, LATEST, None, None).applied_to(&item);
            assert!(item_size(&item) <= limit, "created {status}, ended: {}", item_size(&item));
            largest = largest.max(item_size(&item));
        }
        println!("the largest record a later write makes: {} bytes of {MAX_ITEM_BYTES}", largest);
    }

    /// The forms written when DynamoDB refuses the full one never make the record larger (but a commit
    /// decision's, which adds the lock tokens): DynamoDB, which stored the record, stores them too.
    #[test]
    fn shortened_writes_never_grow_the_record() {
        let long_text = "x".repeat(100_000);
        // Records with and without the sweeper's fields, written over with later times.
        for (keyed, swept) in [(true, true), (false, true), (true, false), (false, false)] {
            let mut current = record_at_the_bound(keyed);
            current.updated_at = 1_000_000_000_000;
            current.sweep_at = Some(1_764_000_025_123);
            if swept {
                current.reason = Some(cut(&long_text, MAX_REASON_BYTES));
                current.sweep_error = Some(cut(&long_text, MAX_SWEEP_ERROR_BYTES));
                current.sweep_attempts = Some(3);
            }
            let now = 2_999_999_999_999;
            let item = current.to_item();
            for (from, to) in [
                (Status::Preparing, Status::Aborting),
                (Status::Committing, Status::Committed),
                (Status::Aborting, Status::Aborted),
            ] {
                let current =
                    TransactionRecord { status: from, participants: worst_votes(&current), ..current.clone() };
                let item = current.to_item();
                let shortened = shortened_transition_update(&current, to, keyed, now, None);
                let after = shortened.applied_to(&item);
                assert!(item_size(&after) <= item_size(&item), "{from} → {to} (keyed {keyed})");
                let ended = TransactionRecord::from_item(&after).unwrap();
                assert_eq!(ended.status, to);
                assert_eq!(ended.request_hash, current.request_hash);
                assert_eq!(ended.execution_id, current.execution_id);
                for (kept, was) in ended.participants.iter().zip(&current.participants) {
                    assert_eq!((&kept.service, &kept.lock_token), (&was.service, &was.lock_token));
                    // An open record keeps the operations still to apply or to release.
                    assert_eq!(kept.operations.is_empty(), to.is_terminal(), "{from} → {to}");
                }
            }
            let postponed = shortened_postpone_update(now).applied_to(&item);
            assert!(item_size(&postponed) <= item_size(&item), "postponed (swept {swept})");
            assert!(TransactionRecord::from_item(&postponed).unwrap().sweep_at >= Some(now));
            let ended = current.clone().ended(Status::Aborted, current.updated_at);
            assert!(item_size(&ended.shortened().to_item()) <= item_size(&ended.to_item()));
        }
    }

    #[test]
    fn a_record_one_byte_over_the_bound_is_refused_naming_the_limit() {
        let mut record = record_at_the_bound(true);
        let Some(Value::String(data)) = record.participants[0].operations[0].pointer_mut("/data/x") else {
            panic!("padded")
        };
        data.push('d');
        let refused = record.check_first_write().unwrap_err();
        assert_eq!(refused.code, ErrorCode::LimitExceeded);
        assert!(refused.message.contains(&format!("the limit is {MAX_RECORD_BYTES} bytes")), "{refused}");
    }

    #[test]
    fn text_is_cut_at_a_character_boundary() {
        assert_eq!(cut("short", 10), "short");
        let cut_text = cut(&"é".repeat(100), 11);
        assert!(cut_text.len() <= 11 && cut_text.ends_with('…'), "{cut_text}");
    }

    // --- what each writer may write (the deployment's IAM conditions on `dynamodb:Attributes`) ---------

    /// The names outside `allowed`.
    fn outside<'a>(allowed: &[&str], names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
        names.into_iter().filter(|name| !allowed.contains(name)).collect()
    }

    /// A record with every field present. Listed field by field: a new field fails to compile here, and
    /// then `record_attributes_are_every_field_of_the_record` until [`RECORD_ATTRIBUTES`] names it.
    fn record_with_every_field(status: Status) -> TransactionRecord {
        TransactionRecord {
            transaction_id: "tx-1".into(),
            status,
            participants: vec![ParticipantEntry {
                service: "service-a".into(),
                operations: vec![serde_json::json!({"op": "put", "key": {"entityId": "A"}, "data": {}})],
                vote: Some(Vote::Prepared),
                code: Some(RefusalCode::ALL[0]),
                reason: Some("why".into()),
                read_only: false,
                lock_token: Some("f".repeat(32)),
                service_code: Some("code".into()),
                blocked_by: None,
                unresolved_owner: None,
            }],
            created_at: 1_764_000_000_000,
            updated_at: 1_764_000_000_001,
            deadline: 1_764_000_025_000,
            reason: Some("why".into()),
            request_hash: Some("0".repeat(64)),
            expire_at: Some(1_764_000_000),
            open_shard: Some(open_shard("tx-1")),
            sweep_at: Some(1_764_000_025_000),
            sweep_attempts: Some(2),
            sweep_error: Some("unreachable".into()),
            execution_id: Some("0".repeat(32)),
            principal: Some("arn:aws:iam::123456789012:role/caller".into()),
            hold_ms: Some(1_000),
            hold_until: Some(1_764_000_001_000),
            started_at: Some(1_763_999_999_000),
            attempt: Some(2),
            first_transaction_id: Some("tx-0".into()),
            retried_as: Some("tx-0-3".into()),
            refused_for_contention: true,
            age_claimed_by: Some("tx-9".into()),
            age_of: Some("tx-8-2".into()),
            body_hash: Some("1".repeat(64)),
        }
    }

    /// Only the coordinator's link is followed: the next attempt of the same request. A token retry that a
    /// record written before issue 41 names in `retriedAs` (`<first>-r<n>`) is a request of its own.
    #[test]
    fn a_successor_is_the_coordinators_next_attempt_only() {
        let mut record = record_with_every_field(Status::Aborted);
        assert_eq!(record.successor(), Some("tx-0-3"));
        record.retried_as = Some("tx-0-r3".into());
        assert_eq!(record.successor(), None);
        assert_eq!(record.to_response()["ageClaimedBy"], "tx-9");
        record.age_claimed_by = None;
        assert_eq!(record.to_response()["ageClaimedBy"], "tx-0-r3", "a legacy token link is shown as one");
        assert!(record.to_response().get("retriedAs").is_none());
        let mut first = record_with_every_field(Status::Aborted);
        (first.attempt, first.first_transaction_id, first.transaction_id) = (None, None, "tx-0".into());
        first.retried_as = Some("tx-0-2".into());
        assert_eq!(first.successor(), Some("tx-0-2"));
    }

    /// A chain's step follows an attempt of the same caller and body only (issue 42); a record from before
    /// `bodyHash` by its `requestHash`, and one with neither never.
    #[test]
    fn an_attempt_is_the_same_requests_by_its_caller_and_body_hash() {
        let first = record_with_every_field(Status::Aborted);
        let next = first.next_attempt("tx-0-3".into(), 3, 1);
        assert!(first.same_request(&next));
        let mut other_caller = next.clone();
        other_caller.principal = Some("arn:aws:iam::123456789012:user/mallory".into());
        assert!(!first.same_request(&other_caller));
        let mut other_body = next.clone();
        other_body.body_hash = Some("f".repeat(64));
        assert!(!first.same_request(&other_body));
        // Written before bodyHash: its requestHash (a keyed request's is its body's hash) stands in.
        let (mut old_first, mut old_next) = (first.clone(), next.clone());
        (old_first.body_hash, old_next.body_hash) = (None, None);
        old_first.request_hash = first.body_hash.clone();
        old_next.request_hash = first.body_hash.clone();
        assert!(old_first.same_request(&old_next) && first.same_request(&old_next));
        old_next.request_hash = None;
        assert!(!old_first.same_request(&old_next), "neither hash: not followed");
        let resolved = absent_owner_record("tx-0-3", 1, "no record");
        assert!(!first.same_request(&resolved), "a resolver's record names no caller and no body");
    }

    #[test]
    fn record_attributes_are_every_field_of_the_record() {
        let record = record_with_every_field(Status::Prepared);
        let item = record.to_item();
        let mut written: Vec<&str> = item.keys().map(String::as_str).collect();
        written.sort_unstable();
        let mut named = RECORD_ATTRIBUTES.to_vec();
        named.sort_unstable();
        assert_eq!(written, named, "RECORD_ATTRIBUTES is not the attributes of a record with every field");
        assert_eq!(TransactionRecord::from_item(&item).unwrap(), record);
        // Each writer's list is a list of the record's attributes, each once; an owner's abort is a write
        // recovery makes too (the sweeper resolves locks as participants do).
        for (list, of) in [(RECOVERY_WRITES, RECORD_ATTRIBUTES), (OWNER_ABORT_WRITES, RECOVERY_WRITES)] {
            assert_eq!(outside(of, list.iter().copied()), Vec::<&str>::new());
            let mut once = list.to_vec();
            once.sort_unstable();
            once.dedup();
            assert_eq!(once.len(), list.len(), "{list:?} names an attribute twice");
        }
        assert!(RECOVERY_WRITES.contains(&a::ID) && OWNER_ABORT_WRITES.contains(&a::ID), "every request names the key");
        // `dynamodb:Attributes` counts a condition expression's names too: a status change's (`update_status`:
        // the status), a postponement's (`update_open`: openShard), a new record's (`put_new`: the key).
        for name in [a::STATUS, a::OPEN_SHARD, a::ID] {
            assert!(RECOVERY_WRITES.contains(&name), "recovery's conditions name {name}");
        }
        assert!(OWNER_ABORT_WRITES.contains(&a::STATUS), "an owner's abort is conditioned on the status");
    }

    /// Every write recovery can make (the sweeper: [`crate::coordinator::Coordinator::recover`],
    /// [`TransactionStore::postpone`], [`crate::recovery::owner_fate`]), over-approximated (every status
    /// change to every status from every status, keyed or not, with and without votes and a reason, full
    /// and shortened), names only [`RECOVERY_WRITES`]: an attribute it starts writing fails here until the
    /// list (and the sweeper's IAM condition in the templates) is updated.
    #[test]
    fn recovery_writes_only_what_recovery_writes_may_write() {
        let now = 1_764_000_030_000;
        let votes = worst_votes(&record_with_every_field(Status::Preparing));
        let mut writes: Vec<(String, Vec<String>)> = vec![];
        for to in Status::ALL {
            for keyed in [true, false] {
                for participants in [None, Some(&votes[..])] {
                    for reason in [None, Some("why")] {
                        let update = transition_update(to, keyed, now, participants, reason);
                        let what =
                            format!("→ {to} (keyed {keyed}, votes {}, reason {reason:?})", participants.is_some());
                        writes.push((what, update.names().map(str::to_owned).collect()));
                    }
                    for from in Status::ALL {
                        let current = record_with_every_field(from);
                        let update = shortened_transition_update(&current, to, keyed, now, participants);
                        let what = format!("{from} → {to} shortened (keyed {keyed}, votes {})", participants.is_some());
                        writes.push((what, update.names().map(str::to_owned).collect()));
                    }
                }
            }
        }
        writes
            .push(("postponement".into(), postpone_update(now, 3, "unreachable").names().map(str::to_owned).collect()));
        writes.push((
            "shortened postponement".into(),
            shortened_postpone_update(now).names().map(str::to_owned).collect(),
        ));
        // The PutItem of an absent owner's ABORTED record, as `create` writes it (bounded), and shortened.
        let absent = absent_owner_record("tx-1", now, &"x".repeat(10_000)).bounded();
        for (what, record) in
            [("absent owner's record", absent.clone()), ("absent owner's record shortened", absent.shortened())]
        {
            writes.push((what.into(), record.to_item().into_keys().collect()));
        }
        for (what, names) in &writes {
            let refused = outside(RECOVERY_WRITES, names.iter().map(String::as_str));
            assert!(refused.is_empty(), "recovery's {what} writes {refused:?}, not in RECOVERY_WRITES");
        }
        // The hold is the coordinator's alone: were recovery to write it, this test would say so.
        let hold = hold_update(transition_update(Status::Prepared, true, now, Some(&votes), None), now);
        assert_eq!(outside(RECOVERY_WRITES, hold.names()), vec![a::HOLD_UNTIL]);
    }

    /// A lock resolver's abort of an expired owner ([`crate::recovery::owner_fate`]: PREPARING or PREPARED →
    /// ABORTING, with its reason, full or shortened), the one UpdateItem a participant makes to a record,
    /// names only [`OWNER_ABORT_WRITES`]: an attribute it starts writing fails here until the list (and the
    /// participants' IAM condition in the templates) is updated.
    #[test]
    fn an_owner_abort_writes_only_what_an_owner_abort_may_write() {
        let now = 1_764_000_030_000;
        for from in [Status::Preparing, Status::Prepared] {
            for keyed in [true, false] {
                for reason in [None, Some(crate::recovery::EXPIRED_REASON), Some(crate::recovery::HOLD_EXPIRED_REASON)]
                {
                    let full = transition_update(Status::Aborting, keyed, now, None, reason);
                    let refused = outside(OWNER_ABORT_WRITES, full.names());
                    assert!(
                        refused.is_empty(),
                        "{from} → ABORTING (keyed {keyed}, reason {reason:?}) writes {refused:?}"
                    );
                }
                let current = record_with_every_field(from);
                let shortened = shortened_transition_update(&current, Status::Aborting, keyed, now, None);
                let refused = outside(OWNER_ABORT_WRITES, shortened.names());
                assert!(refused.is_empty(), "{from} → ABORTING shortened (keyed {keyed}) writes {refused:?}");
            }
        }
        // Votes with the abort would be refused a participant: were it to write them, this test would say so.
        let votes = worst_votes(&record_with_every_field(Status::Preparing));
        let with_votes = transition_update(Status::Aborting, true, now, Some(&votes), None);
        assert_eq!(outside(OWNER_ABORT_WRITES, with_votes.names()), vec![a::PARTICIPANTS]);
    }
}
