//! One change of a record ([`RecordUpdate`]): the attributes a status change, a hold or a postponement
//! sets and removes, built once for DynamoDB's update expression and for the in-memory size check.

use aws_sdk_dynamodb::types::AttributeValue;

use crate::attr;
use crate::expr::{Expr, n, s};
use crate::model::Status;
use crate::record::data::*;
use crate::store::Item;
use crate::tables::tx_attr as a;

/// One change of a record: the attributes it sets and the ones it removes. DynamoDB applies it as an
/// update expression; the headroom test applies it in memory, so both size the same write.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordUpdate {
    pub set: Vec<(&'static str, AttributeValue)>,
    pub remove: Vec<&'static str>,
}

impl RecordUpdate {
    pub(crate) fn set(mut self, name: &'static str, value: AttributeValue) -> RecordUpdate {
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

    pub(crate) fn expression(&self, e: &mut Expr) -> String {
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
