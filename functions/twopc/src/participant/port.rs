//! The participant's one port: what a branch does with a message the guard admitted ([`super::guard`]).
//! Two adapters implement it, each around the library's unchanged traits: [`Items`] (the service's
//! table: the item store, its [`super::Rules`] and [`super::Operations`]) and [`Resources`] (the
//! service's [`super::Resource`] behind the barrier: try, confirm, cancel). Both answer in
//! [`super::answers`]' words. An item participant's prepare is [`super::prepare`]'s; its second phase
//! (commit, hold, abort) is here.

use futures::future::try_join_all;
use tracing::warn;

use super::answers::{refused, status};
use super::credits;
use super::locks::Order;
use super::protocol::{Participant, ParticipantError};
use super::resource::{Driver, ResourceFailedOr};
use super::store::{CommitOutcome, Lock};
use crate::model::message::{Abort, Commit, Hold, OnePhase, Prepare};
use crate::model::{
    ErrorCode, Invalid, Message, Operation, ParticipantResponse, RefusalCode, STATUS_ABORTED, STATUS_COMMITTED,
    STATUS_FAILED, STATUS_HELD, STATUS_NOT_PREPARED,
};
use crate::store::Item;

type Answer = Result<ParticipantResponse, ParticipantError>;

/// What a participant does with each message, once admitted.
pub(super) trait Branch {
    async fn prepare(&self, message: Prepare) -> Answer;
    async fn one_phase(&self, message: OnePhase) -> Answer;
    async fn commit(&self, message: Commit) -> Answer;
    async fn hold(&self, message: Hold) -> Answer;
    async fn abort(&self, message: Abort) -> Answer;
}

/// The message to its action on `branch`.
pub(super) async fn dispatch(branch: &impl Branch, message: Message) -> Answer {
    match message {
        Message::Prepare(m) => branch.prepare(m).await,
        Message::OnePhase(m) => branch.one_phase(m).await,
        Message::Commit(m) => branch.commit(m).await,
        Message::Hold(m) => branch.hold(m).await,
        Message::Abort(m) => branch.abort(m).await,
    }
}

/// The items of the service's table.
pub(super) struct Items<'a>(pub(super) &'a Participant);

impl Branch for Items<'_> {
    async fn prepare(&self, m: Prepare) -> Answer {
        let order = order_of_prepare(&m);
        self.0.prepare(&m.transaction_id, order, m.principal.as_deref(), &m.operations, m.held).await
    }

    async fn one_phase(&self, m: OnePhase) -> Answer {
        let order = order_of_one_phase(&m);
        self.0.commit_one_phase(&m.transaction_id, order, m.principal.as_deref(), &m.operations, &m.record).await
    }

    async fn commit(&self, m: Commit) -> Answer {
        self.0.commit(&m.transaction_id, &m.operations, m.lock_token.as_deref()).await
    }

    async fn hold(&self, m: Hold) -> Answer {
        self.0.hold(&m.transaction_id, &m.operations, m.lock_token.as_deref(), m.hold_until).await
    }

    async fn abort(&self, m: Abort) -> Answer {
        self.0.abort(&m.transaction_id, &m.operations).await
    }
}

impl Items<'_> {
    /// What the items cannot take at all, answered before the cutoff is looked at (as before the guard):
    /// a key that does not fit the table (INVALID), a one-phase record that is not this transaction's.
    pub(super) fn refuses(&self, message: &Message) -> Result<Option<ParticipantResponse>, ParticipantError> {
        if let Message::Prepare(_) | Message::OnePhase(_) = message
            && let Err(reason) = self.0.keys(message.operations())
        {
            return Ok(Some(refused(RefusalCode::Invalid, reason)));
        }
        if let Message::OnePhase(m) = message {
            super::prepare::one_phase_record(&m.transaction_id, &m.record)?;
        }
        Ok(None)
    }
}

/// The service's resource, behind the barrier in its table.
pub(super) struct Resources<'a> {
    pub(super) participant: &'a Participant,
    pub(super) driver: &'a Driver,
}

impl Resources<'_> {
    fn now(&self) -> u64 {
        self.participant.clock.now_ms()
    }

    /// What a resource cannot take at all, answered before the cutoff is looked at: a built-in operation
    /// (it speaks only its own), and a one-phase commit (a resource cannot commit atomically with the
    /// record: the coordinator commits it in two phases, its schemas marked `resource`).
    pub(super) fn refuses(service: &str, message: &Message) -> Option<ParticipantResponse> {
        match message {
            Message::Prepare(m) => {
                m.operations.iter().find(|op| !matches!(op, Operation::Custom { .. })).map(|other| {
                    refused(
                        RefusalCode::Invalid,
                        format!("{service} speaks only its own operations, not \"{}\"", other.kind()),
                    )
                })
            }
            Message::OnePhase(_) => {
                Some(refused(RefusalCode::Invalid, format!("{service} is a resource: it commits in two phases")))
            }
            Message::Commit(_) | Message::Hold(_) | Message::Abort(_) => None,
        }
    }
}

impl Branch for Resources<'_> {
    /// (Its operations are the resource's own: [`Resources::refuses`] answered any other.)
    async fn prepare(&self, m: Prepare) -> Answer {
        let service = &self.participant.service;
        let order = order_of_prepare(&m);
        let prepare = super::resource::Prepare {
            service,
            tx: &m.transaction_id,
            principal: m.principal.as_deref(),
            operations: &m.operations,
            deadline: order.deadline,
            started_at: order.priority(),
        };
        Ok(self.driver.prepare(prepare, || self.now()).await?)
    }

    /// Refused unapplied, as [`Resources::refuses`] says.
    async fn one_phase(&self, m: OnePhase) -> Answer {
        let service = &self.participant.service;
        Ok(Resources::refuses(service, &Message::OnePhase(m)).expect("a resource refuses every one-phase commit"))
    }

    async fn commit(&self, m: Commit) -> Answer {
        let service = &self.participant.service;
        failed_resource(self.driver.commit(service, &m.transaction_id, m.lock_token.as_deref(), || self.now()).await)
    }

    async fn hold(&self, m: Hold) -> Answer {
        Ok(self.driver.hold(&m.transaction_id, m.lock_token.as_deref(), m.hold_until).await?)
    }

    async fn abort(&self, m: Abort) -> Answer {
        failed_resource(self.driver.abort(&self.participant.service, &m.transaction_id, || self.now()).await)
    }
}

impl Participant {
    pub(super) async fn commit(
        &self,
        tx: &str,
        operations: &[Operation],
        token: Option<&str>,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let keys = self.keys(operations).map_err(|m| Invalid::new(ErrorCode::InvalidRequest, m))?;
        let outcomes =
            try_join_all(operations.iter().zip(&keys).map(|(op, key)| self.table.commit_item(tx, op, key, token)))
                .await?;
        let unproven: Vec<String> = outcomes
            .iter()
            .zip(operations)
            .filter_map(|(outcome, op)| match outcome {
                CommitOutcome::NotPrepared { detail } => Some(format!("entity {}: {detail}", op.key_text())),
                _ => None,
            })
            .collect();
        if unproven.is_empty() {
            return Ok(status(STATUS_COMMITTED, None));
        }
        warn!(?unproven, "commit found no lock of this transaction and no lastTx to prove it");
        Ok(status(STATUS_NOT_PREPARED, Some(unproven.join("; "))))
    }

    /// A held transaction's locks with the voted `token` now expire at `until` (a lock that is gone, or
    /// carries another token, is left alone): answered HELD either way, the coordinator only logs it.
    pub(super) async fn hold(
        &self,
        tx: &str,
        operations: &[Operation],
        token: Option<&str>,
        until: u64,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let keys: Vec<Item> = operations.iter().filter_map(|op| self.table.key(op.key()).ok()).collect();
        let extended = try_join_all(keys.iter().map(|key| self.table.extend_lock(tx, key, token, until))).await?;
        let missing = extended.iter().filter(|done| !**done).count();
        if missing > 0 {
            warn!(missing, "hold: some locks of the voted token are not there (already finished, or never taken)");
        }
        Ok(status(STATUS_HELD, None))
    }

    /// Releases whatever the transaction holds. A key that does not fit this table (its prepare was
    /// refused as invalid) can hold nothing, so it is skipped rather than failing the abort: an abort that
    /// could never succeed would leave its transaction ABORTING for ever.
    pub(super) async fn abort(
        &self,
        tx: &str,
        operations: &[Operation],
    ) -> Result<ParticipantResponse, ParticipantError> {
        let held: Vec<(&Operation, Item)> =
            operations.iter().filter_map(|op| self.table.key(op.key()).ok().map(|key| (op, key))).collect();
        try_join_all(held.iter().map(|(op, key)| async move {
            // A credit holds an entry or the lock (the abort does not say which): the entry first, and the
            // lock only if the item, as the refused removal found it, holds one of this transaction.
            if credits::is_credit(op) {
                match self.table.drop_credit(tx, key, None).await? {
                    None => return Ok(true),
                    Some(Some(item)) if Lock::of(&item).is_none_or(|l| l.transaction_id != tx) => return Ok(false),
                    Some(_) => {}
                }
            }
            self.table.release_any(tx, key, "abort").await
        }))
        .await?;
        Ok(status(STATUS_ABORTED, None))
    }
}

/// Wait-die's place of a prepare.
fn order_of_prepare(m: &Prepare) -> Order {
    Order { started_at: m.started_at, deadline: m.deadline, holds_no_locks: m.holds_no_locks, recorded: m.recorded }
}

/// A one-phase commit is its transaction's only write: it holds nothing anywhere while it waits.
fn order_of_one_phase(m: &OnePhase) -> Order {
    Order { started_at: m.started_at, deadline: m.deadline, holds_no_locks: true, recorded: false }
}

/// A resource that did not confirm or cancel is answered FAILED with why (the resource's own words,
/// kept in the record's `sweepError`), not acknowledged: the coordinator and the sweeper send it again.
fn failed_resource(
    outcome: Result<ParticipantResponse, ResourceFailedOr>,
) -> Result<ParticipantResponse, ParticipantError> {
    match outcome {
        Ok(response) => Ok(response),
        Err(ResourceFailedOr::Store(e)) => Err(e.into()),
        Err(ResourceFailedOr::Resource(e)) => {
            warn!(error = %e, "the resource failed; the message is to be sent again");
            Ok(status(STATUS_FAILED, Some(crate::record::cut(&e.to_string(), 400))))
        }
    }
}
