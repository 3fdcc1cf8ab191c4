//! The participant messages as the protocol means them: one enum, a struct per action holding only what
//! its action reads, operations typed. [`ParticipantRequest`] is their JSON form, what is signed and sent:
//! [`Message::to_wire`] writes it, [`Message::read`] reads it back, and the golden examples of
//! `docs/participant-protocol.md` check that both leave the JSON as it was.

use serde_json::Value;

use super::wire::{Action, ParticipantRequest};
use crate::custom::Catalog;
use crate::errors::{ErrorCode, Invalid};
use crate::model::Operation;

/// A message to a participant.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Prepare(Prepare),
    /// A sole participant's commit without a prepare: the operations under their guards and the
    /// transaction's record, in one atomic write.
    OnePhase(OnePhase),
    Commit(Commit),
    Hold(Hold),
    Abort(Abort),
}

/// Lock the operations' items and vote.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepare {
    pub transaction_id: String,
    pub operations: Vec<Operation>,
    /// The transaction's deadline (epoch ms): no lock wait goes past it.
    pub deadline: Option<u64>,
    /// When the transaction started: wait-die orders transactions by (startedAt, transactionId).
    pub started_at: Option<u64>,
    /// Who asked (canonical), for the service's rules.
    pub principal: Option<String>,
    /// A held transaction: `check`s lock their items too.
    pub held: bool,
    /// The transaction holds no lock anywhere while this prepare runs: it may wait for any lock.
    pub holds_no_locks: bool,
    /// Its record, open, was written before this prepare: the locks stay out of the locks index.
    pub recorded: bool,
}

/// Apply the operations and create `record` (COMMITTED) in the same write.
#[derive(Debug, Clone, PartialEq)]
pub struct OnePhase {
    pub transaction_id: String,
    pub operations: Vec<Operation>,
    pub deadline: Option<u64>,
    pub started_at: Option<u64>,
    pub principal: Option<String>,
    /// The transaction record as it is to be created, in the record's JSON.
    pub record: Value,
}

/// Apply what the prepare locked with `lock_token`, and release.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    pub transaction_id: String,
    pub operations: Vec<Operation>,
    /// The token the PREPARED vote reported (none from a sender that does not know it).
    pub lock_token: Option<String>,
}

/// The locks with `lock_token` now expire at `hold_until`.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    pub transaction_id: String,
    pub operations: Vec<Operation>,
    pub lock_token: Option<String>,
    /// Epoch ms.
    pub hold_until: u64,
}

/// Release whatever the transaction holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Abort {
    pub transaction_id: String,
    pub operations: Vec<Operation>,
}

impl Message {
    pub fn action(&self) -> Action {
        match self {
            Message::Prepare(_) => Action::Prepare,
            Message::OnePhase(_) | Message::Commit(_) => Action::Commit,
            Message::Hold(_) => Action::Hold,
            Message::Abort(_) => Action::Abort,
        }
    }

    pub fn transaction_id(&self) -> &str {
        match self {
            Message::Prepare(m) => &m.transaction_id,
            Message::OnePhase(m) => &m.transaction_id,
            Message::Commit(m) => &m.transaction_id,
            Message::Hold(m) => &m.transaction_id,
            Message::Abort(m) => &m.transaction_id,
        }
    }

    pub fn operations(&self) -> &[Operation] {
        match self {
            Message::Prepare(m) => &m.operations,
            Message::OnePhase(m) => &m.operations,
            Message::Commit(m) => &m.operations,
            Message::Hold(m) => &m.operations,
            Message::Abort(m) => &m.operations,
        }
    }

    /// The message a participant received, its operations parsed against `catalog` (a service's own kinds)
    /// where the action judges them, against any kind where it only finishes them.
    pub fn read(request: &ParticipantRequest, catalog: &Catalog) -> Result<Message, Invalid> {
        // A prepare or a one-phase commit is judged against the service's own kinds; a commit, a hold or
        // an abort finishes what a prepare judged, whatever kinds this deployment knows now.
        let judged = match request.action {
            Action::Prepare => true,
            Action::Commit => request.one_phase_record.is_some(),
            Action::Hold | Action::Abort => false,
        };
        let any = Catalog::any();
        let catalog = if judged { catalog } else { &any };
        let operations =
            Operation::parse_list_for(Some(&Value::Array(request.operations.clone())), "operations", catalog)?;
        let transaction_id = request.transaction_id.clone();
        Ok(match (request.action, &request.one_phase_record) {
            (Action::Prepare, _) => Message::Prepare(Prepare {
                transaction_id,
                operations,
                deadline: request.deadline,
                started_at: request.started_at,
                principal: request.principal.clone(),
                held: request.held,
                holds_no_locks: request.holds_no_locks,
                recorded: request.recorded,
            }),
            (Action::Commit, Some(record)) => Message::OnePhase(OnePhase {
                transaction_id,
                operations,
                deadline: request.deadline,
                started_at: request.started_at,
                principal: request.principal.clone(),
                record: record.clone(),
            }),
            (Action::Commit, None) => {
                Message::Commit(Commit { transaction_id, operations, lock_token: request.lock_token.clone() })
            }
            (Action::Hold, _) => Message::Hold(Hold {
                transaction_id,
                operations,
                lock_token: request.lock_token.clone(),
                hold_until: request.hold_until.ok_or_else(|| {
                    Invalid::new(ErrorCode::InvalidRequest, "holdUntil: a hold message needs it (epoch ms)")
                })?,
            }),
            (Action::Abort, _) => Message::Abort(Abort { transaction_id, operations }),
        })
    }

    /// The message's JSON form, unsigned.
    pub fn to_wire(&self) -> ParticipantRequest {
        let operations = self.operations().iter().map(Operation::to_json).collect();
        let base = ParticipantRequest { operations, ..ParticipantRequest::new(self.action(), self.transaction_id()) };
        match self {
            Message::Prepare(m) => ParticipantRequest {
                deadline: m.deadline,
                started_at: m.started_at,
                principal: m.principal.clone(),
                held: m.held,
                holds_no_locks: m.holds_no_locks,
                recorded: m.recorded,
                ..base
            },
            Message::OnePhase(m) => ParticipantRequest {
                deadline: m.deadline,
                started_at: m.started_at,
                principal: m.principal.clone(),
                one_phase_record: Some(m.record.clone()),
                ..base
            },
            Message::Commit(m) => ParticipantRequest { lock_token: m.lock_token.clone(), ..base },
            Message::Hold(m) => {
                ParticipantRequest { lock_token: m.lock_token.clone(), hold_until: Some(m.hold_until), ..base }
            }
            Message::Abort(_) => base,
        }
    }
}
