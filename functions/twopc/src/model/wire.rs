//! The participant messages, as they travel: what the coordinator and the sweeper send
//! ([`ParticipantRequest`], with a version-1 [`MessageSignature`] inside or a version-2 [`Envelope`]
//! around it) and what a participant answers ([`ParticipantResponse`]). `docs/participant-protocol.md`
//! is their contract; signing and verifying them is `crate::auth`'s.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A version-2 message's `envelope`, and the first line of what its MAC covers.
pub const ENVELOPE_V2: &str = "twopc/participant-message/v2";

/// A version-2 message: `message` is the message's JSON text exactly as signed, and the MAC covers its
/// bytes, so a participant that would write the message otherwise (another serializer, another version's
/// fields or number forms) verifies it all the same. A MAC cannot sit inside the bytes it covers: it sits
/// beside them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Envelope {
    /// [`ENVELOPE_V2`].
    pub envelope: String,
    pub key_id: String,
    /// When it was signed (ms since the epoch, the signer's clock).
    pub signed_at: u64,
    /// HMAC-SHA-256 of [`signing_input_v2`], hex.
    pub mac: String,
    /// The message (a [`ParticipantRequest`] without `signature`), as JSON text.
    pub message: String,
}

/// A message's signature (`signature` of a participant message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageSignature {
    pub key_id: String,
    /// When it was signed (ms since the epoch, the signer's clock).
    pub signed_at: u64,
    /// HMAC-SHA-256, hex.
    pub mac: String,
}

/// Why a participant refused to prepare (the contract's codes, plus the two the system adds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RefusalCode {
    /// Another live transaction holds a lock on the item.
    Conflict,
    /// A guard does not hold: `min`/`max`, `ifNotExists`, a `check`, a non-numeric field.
    ConditionFailed,
    /// The item does not exist.
    NotFound,
    /// No answer before the transaction's deadline, or the participant failed.
    Timeout,
    /// The participant failed or could not be reached.
    Unavailable,
    /// The operation does not fit the participant's table (for example, the wrong key attributes).
    Invalid,
    /// One of the service's own rules refused (its own code in `serviceCode`, its reason in `reason`).
    Rule,
}

impl RefusalCode {
    pub const ALL: [RefusalCode; 7] = [
        RefusalCode::Conflict,
        RefusalCode::ConditionFailed,
        RefusalCode::NotFound,
        RefusalCode::Timeout,
        RefusalCode::Unavailable,
        RefusalCode::Invalid,
        RefusalCode::Rule,
    ];
}

/// A message to a participant (the contract's participant invocation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParticipantRequest {
    pub action: Action,
    pub transaction_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<u64>,
    pub operations: Vec<Value>,
    /// A commit with this field is a one-phase commit: apply the operations under their guards and create
    /// this transaction record (as COMMITTED) in the same atomic write. Sent only to a sole participant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_phase_record: Option<Value>,
    /// Prepare and one-phase commit: when the transaction started. Wait-die orders transactions by
    /// (startedAt, transactionId), so a longer timeout never lowers a transaction's priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    /// Commit: the token of the locks this participant's PREPARED vote reported. Only locks with this
    /// token are applied; a lock of the transaction with another token was taken by a late duplicate
    /// prepare after the voted one was committed, and is released without applying anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_token: Option<String>,
    /// Prepare and one-phase commit: who asked for the transaction (the caller's principal, in its
    /// canonical form), for the service's rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// Prepare of a held transaction (`holdMs`): `check`s lock their items too (a check means nothing
    /// over a long hold otherwise), so the participant takes part in the second phase.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// Hold: the new expiry (epoch ms) of the locks this transaction holds with `lockToken`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<u64>,
    /// Prepare: the transaction holds no lock anywhere while this prepare runs (a sole participant, or the
    /// first of a retry's one-at-a-time prepares): it may wait for any transaction's lock, older or younger,
    /// since a wait by a transaction that holds nothing can never close a cycle.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holds_no_locks: bool,
    /// Prepare (issue 48): the transaction's record was written before this prepare was sent, open and
    /// naming this participant, so its locks need no entry in the locks index: whoever finishes the
    /// transaction (its coordinator, or the sweeper through the open-transactions index) finds them
    /// through the record. Never sent for a held transaction, whose locks the hold moves. A participant
    /// that does not know the field indexes its locks, as before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recorded: bool,
    /// The sender's signature over the whole message ([`crate::auth`]): a participant acts only on a
    /// message the coordinator or the sweeper signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<MessageSignature>,
}

impl ParticipantRequest {
    /// The same message with another action.
    pub fn with_action(self, action: Action) -> ParticipantRequest {
        ParticipantRequest { action, ..self }
    }

    /// A message with only its action and transaction; the optional fields are set with struct update.
    pub fn new(action: Action, transaction_id: impl Into<String>) -> ParticipantRequest {
        ParticipantRequest {
            action,
            transaction_id: transaction_id.into(),
            deadline: None,
            operations: vec![],
            one_phase_record: None,
            started_at: None,
            lock_token: None,
            principal: None,
            held: false,
            hold_until: None,
            holds_no_locks: false,
            recorded: false,
            signature: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Prepare,
    Commit,
    Abort,
    /// A held transaction was recorded PREPARED: the locks with the voted `lockToken` now expire at
    /// `holdUntil` (answered `HELD`; a lock that is gone or carries another token is left alone).
    Hold,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Prepare => "prepare",
            Action::Commit => "commit",
            Action::Abort => "abort",
            Action::Hold => "hold",
        }
    }
}

/// A participant's answer. Prepare answers with `vote`; commit and abort with `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ParticipantResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vote: Option<Vote>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<RefusalCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Prepare of a participant whose operations only read: nothing is locked, so it takes no part
    /// in the second phase.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// A PREPARED vote that locked items: the token those locks carry (see [`ParticipantRequest::lock_token`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_token: Option<String>,
    /// A `RULE` refusal: the service's own code (at most [`MAX_SERVICE_CODE_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_code: Option<String>,
    /// The participant's clock when the message arrived and when it answered (ms since the epoch): the
    /// coordinator compares them with its own to report the skew between the clocks (`ClockSkew`), which
    /// the protocol tolerates up to [`crate::clock::CLOCK_MARGIN_MS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_at: Option<u64>,
    /// A `CONFLICT` refusal: the (older) transaction whose lock refused this one. The coordinator's retry
    /// waits until that transaction is decided, so one attempt of it refuses a younger one at most once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    /// A refusal because a lock's owner is past its deadline (or has no record) and a participant may not
    /// decide another transaction (issue 42): the transaction it names. The coordinator, whose role may,
    /// resolves it from that transaction's own record and asks again; one with no record is the sweeper's
    /// (it reads the lock itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unresolved_owner: Option<String>,
}

impl ParticipantResponse {
    /// The answer in one word, as its JSON says it: the status of a commit or abort, the vote of a
    /// prepare.
    pub fn outcome(&self) -> &str {
        match (&self.status, self.vote) {
            (Some(status), _) => status,
            (None, Some(Vote::Prepared)) => "PREPARED",
            (None, Some(Vote::Refused)) => "REFUSED",
            (None, None) => "",
        }
    }
}

/// A service's own refusal code (`serviceCode`) is cut to this many bytes (it is kept in the transaction
/// record).
pub const MAX_SERVICE_CODE_BYTES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Vote {
    Prepared,
    Refused,
}

impl Vote {
    pub const ALL: [Vote; 2] = [Vote::Prepared, Vote::Refused];
}

/// Answer of a commit when the item holds no lock of the transaction and `lastTx` does not prove
/// the commit either (a later transaction committed the item since). See the coordinator for why a
/// caller that knows the decision was commit may count it as applied.
pub const STATUS_NOT_PREPARED: &str = "NOT_PREPARED";
pub const STATUS_COMMITTED: &str = "COMMITTED";
pub const STATUS_ABORTED: &str = "ABORTED";
/// A hold's answer: the locks of the voted token that are still there expire at `holdUntil` now.
pub const STATUS_HELD: &str = "HELD";
/// A resource participant's answer to a commit or an abort its resource did not carry out yet (`reason`
/// says why): not an acknowledgement; the message is sent again.
pub const STATUS_FAILED: &str = "FAILED";
/// Answer of a one-phase commit whose transaction record already exists: nothing was applied.
pub const STATUS_RECORD_EXISTS: &str = "RECORD_EXISTS";

/// JSON text with object keys sorted at every level.
pub fn canonical_json(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> =
                keys.into_iter().map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&map[k]))).collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(canonical_json).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_participant_answer_in_one_word_is_what_its_json_says() {
        for vote in [Vote::Prepared, Vote::Refused] {
            let answer = ParticipantResponse { vote: Some(vote), ..Default::default() };
            assert_eq!(serde_json::to_value(vote).unwrap(), answer.outcome());
        }
        let committed = ParticipantResponse { status: Some("COMMITTED".into()), ..Default::default() };
        assert_eq!(committed.outcome(), "COMMITTED");
    }
}
