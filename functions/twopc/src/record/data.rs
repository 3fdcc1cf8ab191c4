//! A transaction's record as the transactions table keeps it: its status, its participants with their
//! operations and votes, the links between a request's attempts; what a record may hold (its bound of
//! 400 KB less headroom) and how it is cut to fit.

use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::attr;
use crate::model::{ErrorCode, Invalid, Operation, RefusalCode, Status, TransactionRequest, Vote};
use crate::size::{MAX_ITEM_BYTES, item_size};
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
    a::AUDIT,
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
    /// What operators did to it (`/admin` retry and abort), oldest first, the last [`MAX_AUDIT_ENTRIES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit: Vec<AuditEntry>,
}

/// One operator action on a record: who, when, what, and what the record then said. Each text is cut
/// ([`MAX_AUDIT_TEXT_BYTES`]) so that the whole audit fits [`MAX_AUDIT_BYTES`] of the record's headroom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// Epoch ms, the coordinator's clock.
    pub at: u64,
    /// The operator's principal (canonical: an IAM ARN or `jwt:<iss>#<sub>`).
    pub by: String,
    /// `retry` or `abort`.
    pub action: String,
    /// The record's status after the action.
    pub result: String,
}

impl AuditEntry {
    pub fn new(at: u64, by: &str, action: &str, result: &str) -> AuditEntry {
        AuditEntry {
            at,
            by: cut(by, MAX_AUDIT_TEXT_BYTES),
            action: cut(action, MAX_AUDIT_WORD_BYTES),
            result: cut(result, MAX_AUDIT_WORD_BYTES),
        }
    }
}

/// A record keeps the last this many operator actions.
pub const MAX_AUDIT_ENTRIES: usize = 20;
/// An audit entry's `by` is cut to this many bytes (an assumed role's ARN with its session can be longer;
/// its start names the role).
pub const MAX_AUDIT_TEXT_BYTES: usize = 96;
/// An audit entry's `action` and `result` (a word, a status) are cut to this many bytes.
pub const MAX_AUDIT_WORD_BYTES: usize = 16;
/// The most a record's audit takes: [`MAX_AUDIT_ENTRIES`] entries of the longest texts (the unit test
/// `a_full_audit_fits_its_share_of_the_headroom` measures it), part of [`RESERVED_PER_RECORD_BYTES`].
pub const MAX_AUDIT_BYTES: usize = 3_800;

/// One service's part, stored with its operations so that recovery can finish the transaction from
/// the record alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParticipantEntry {
    pub service: String,
    #[serde(with = "crate::model::operation::as_json")]
    pub operations: Vec<Operation>,
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
    /// No vote, and its prepare certainly never ran (never sent, or refused by Lambda before the
    /// function ran): no lock write of it can come. Not recorded.
    #[serde(skip)]
    pub never_ran: bool,
    /// No vote, and the prepare's execution ended (the function failed, or answered something else): a
    /// lock write it made lands within the clock margin of its answer, not as late as the cutoff. Not
    /// recorded.
    #[serde(skip)]
    pub ended_without_vote: bool,
}

impl ParticipantEntry {
    /// Asked to prepare, and no vote came back (no answer before the deadline, the invoke failed): a
    /// lock write of that prepare may still land.
    pub fn unanswered(&self) -> bool {
        self.vote.is_none() && self.code.is_some() && !self.never_ran
    }

    /// A service's part before its prepare answered.
    pub fn new(service: String, operations: Vec<Operation>) -> ParticipantEntry {
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
            never_ran: false,
            ended_without_vote: false,
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
                .map(|p| ParticipantEntry::new(p.service.clone(), p.operations.clone()))
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
            audit: Vec::new(),
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
            audit: Vec::new(),
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
        serde_json::from_value(Value::Object(attr::item_to_json(item))).map_err(|e| {
            let id = item.get(a::ID).and_then(|id| id.as_s().ok()).map_or("", String::as_str);
            StoreError::internal("decode", "", format!("transaction record {id} is malformed: {e}"))
        })
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
        audit: Vec::new(),
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

/// An ended transaction's entries, shortened: each service with its vote and lock token, no operations
/// and no free text.
pub(crate) fn ended_entries(entries: &[ParticipantEntry]) -> Vec<ParticipantEntry> {
    entries
        .iter()
        .cloned()
        .map(|p| ParticipantEntry { operations: vec![], reason: None, code: None, service_code: None, ..p })
        .collect()
}
