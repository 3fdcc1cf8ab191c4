//! A request's attempts (issue 41): what links them, written only where the protocol lets it be.
//!
//! The coordinator retries its own refusal for contention as the next attempt, named (`retriedAs`) in the
//! same conditional write as the refused attempt's abort, which also creates the next attempt's record
//! ([`ContentionAbort`], [`TransactionStore::decide_abort`], [`TransactionStore::create_with_successor`]):
//! a link never names an attempt without a record (issue 47), so a coordinator that stops after it leaves
//! an attempt the sweeper aborts like any other. A caller's retry with an age token is a request of its
//! own, whose claim of the refused attempt's age and whose record are one write
//! ([`TransactionStore::claim_age`]). A link to an attempt without a record (written by an older
//! coordinator, in two writes) is recorded ABORTED on its request's behalf ([`TransactionStore::fence_attempt`]).

use aws_sdk_dynamodb::types::AttributeValue;

use crate::expr::{Expr, s};
use crate::model::Status;
use crate::record::{
    ParticipantEntry, TransactionRecord, TransactionStore, Transition, absent_owner_record, transition_update,
};
use crate::store::StoreError;
use crate::store::write::{Decided, Sending, Write, conditional};
use crate::tables::tx_attr as a;

/// What an attempt's abort records of its own making (issue 41): only this execution's own abort, written
/// in the same conditional write, can say that it was a refusal for contention and name the next attempt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContentionAbort {
    /// Refused for contention only: an age token may carry the request's age on (`refusedForContention`).
    pub refused: bool,
    /// The coordinator retries it as this attempt (`retriedAs`), whose record (PREPARING, open) the same
    /// write creates.
    pub next: Option<Box<TransactionRecord>>,
}

impl ContentionAbort {
    /// The id of the attempt it is retried as.
    pub fn successor(&self) -> Option<&str> {
        self.next.as_deref().map(|next| next.transaction_id.as_str())
    }

    /// `record` with these attributes, for an abort that creates its record.
    pub fn applied_to(&self, mut record: TransactionRecord) -> TransactionRecord {
        record.refused_for_contention = self.refused;
        record.retried_as = self.successor().map(str::to_owned);
        record
    }

    /// The abort without its retry: what is written when the next attempt's record cannot be (its id
    /// taken by a record of an older coordinator's, or the write too large).
    fn without_retry(&self) -> ContentionAbort {
        ContentionAbort { refused: self.refused, next: None }
    }
}

/// What the creation of a refused attempt's ABORTED record with its next attempt's did
/// ([`TransactionStore::create_with_successor`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// Both records written: the link names a record.
    Linked,
    /// The refused attempt's record written without the link (the next attempt's id was taken, or the
    /// write too large): no retry follows it.
    Unlinked,
    /// A record was there already under the refused attempt's id.
    Exists(Box<TransactionRecord>),
}

/// What a write with the next attempt's record did ([`TransactionStore::decide_abort`],
/// [`TransactionStore::create_with_successor`]).
enum Linked {
    /// Both written.
    Written,
    /// The refused attempt's own write was refused: the record under its id as it is (None: not returned).
    Refused(Option<Box<TransactionRecord>>),
    /// The next attempt's id has a record of another's: the abort is written without its retry.
    SuccessorTaken,
}

/// What a caller's retry with an age token found when it claimed the refused attempt's age and created its
/// own record in one write ([`TransactionStore::claim_age`]).
#[derive(Debug, Clone, PartialEq)]
pub enum AgeClaim {
    /// Both written (by this write, or by an earlier one of the same execution whose reply was lost).
    Claimed,
    /// The retry's record exists already, written by another execution: here it is.
    Exists(Box<TransactionRecord>),
    /// The refused attempt does not give its age (not its coordinator's refusal for contention, retried by
    /// its coordinator, its age taken by another retry, or not the retry's caller's or body's): here it is
    /// as it is (None: no record).
    Refused(Option<Box<TransactionRecord>>),
}

impl TransactionStore {
    /// A caller's retry with an age token: claims the age of the refused attempt `refused` for `retry` and
    /// creates `retry`'s record, in one `TransactWriteItems`, so that a claim never names a record that does
    /// not exist, nor one that runs another body. The claim holds only on an attempt whose recorded abort is
    /// its own coordinator's refusal for contention, that its coordinator did not retry, whose age no other
    /// retry took, and that is the retry's caller's and runs its body (issue 42: `principal`, `bodyHash`).
    pub async fn claim_age(&self, refused: &str, retry: &TransactionRecord) -> Result<AgeClaim, StoreError> {
        let retry = retry.clone().bounded();
        let id = &retry.transaction_id;
        let mut e = Expr::new();
        let set = format!("SET {} = {}", e.name(a::AGE_CLAIMED_BY), e.value(s(id)));
        // The refused attempt is this retry's caller's and runs this body (issue 42): a record written
        // before `bodyHash` by its `requestHash`; one with neither gives no age.
        let body = retry.body_hash.as_deref().ok_or_else(|| {
            StoreError::internal("TransactWriteItems", &self.table, format!("retry {id} has no body hash"))
        })?;
        let same_body = format!(
            "({hash} = {body} OR (attribute_not_exists({hash}) AND {request} = {body}))",
            hash = e.name(a::BODY_HASH),
            request = e.name(a::REQUEST_HASH),
            body = e.value(s(body)),
        );
        let same_caller = match &retry.principal {
            Some(principal) => format!("{} = {}", e.name(a::PRINCIPAL), e.value(s(principal))),
            None => format!("attribute_not_exists({})", e.name(a::PRINCIPAL)),
        };
        let condition = format!(
            "{contention} = {yes} AND attribute_not_exists({retried}) AND (attribute_not_exists({claimed}) OR {claimed} = {id}) AND {same_body} AND {same_caller}",
            contention = e.name(a::REFUSED_FOR_CONTENTION),
            yes = e.value(AttributeValue::Bool(true)),
            retried = e.name(a::RETRIED_AS),
            claimed = e.name(a::AGE_CLAIMED_BY),
            id = e.value(s(id)),
        );
        let claim = Write::update(&self.table, Self::key(refused), set, condition, e);
        let mut p = Expr::new();
        let not_there = format!("attribute_not_exists({})", p.name(a::ID));
        let create = Write::put(&self.table, retry.to_item(), not_there, p);
        let refusals = match conditional(&self.client, vec![claim, create], Sending::default()).await?.decided()? {
            Decided::Applied(_) => return Ok(AgeClaim::Claimed),
            Decided::Refused(refusals) => refusals,
        };
        // The retry's record first: found with this execution's id, it is this claim's own write whose reply
        // was lost (the claim then names it too); found with another's, it is that execution's request.
        if refusals.iter().any(|r| r.index == 1) {
            return match self.get(id).await? {
                Some(existing) if existing.execution_id == retry.execution_id => Ok(AgeClaim::Claimed),
                Some(existing) => Ok(AgeClaim::Exists(Box::new(existing))),
                None => Err(StoreError::internal(
                    "TransactWriteItems",
                    &self.table,
                    format!("record {id} reported but not found"),
                )),
            };
        }
        let current = match refusals.into_iter().next().and_then(|r| r.item) {
            Some(item) => Some(TransactionRecord::from_item(&item)?),
            None => self.get(refused).await?,
        };
        Ok(AgeClaim::Refused(current.map(Box::new)))
    }

    /// The abort decision of an attempt, PREPARING → ABORTING with its votes and reason, as
    /// [`TransactionStore::transition`] writes it, and in the same conditional write what only this abort
    /// may say of it: that it is this execution's refusal for contention, and the attempt it is retried as.
    #[allow(clippy::too_many_arguments)]
    pub async fn decide_abort(
        &self,
        id: &str,
        keyed: bool,
        now_ms: u64,
        participants: &[ParticipantEntry],
        reason: Option<&str>,
        contention: &ContentionAbort,
    ) -> Result<Transition, StoreError> {
        let mut extra = Vec::new();
        if contention.refused {
            extra.push((a::REFUSED_FOR_CONTENTION, AttributeValue::Bool(true)));
        }
        let Some(next) = contention.next.as_deref() else {
            return self
                .transition_with(
                    id,
                    Status::Preparing,
                    Status::Aborting,
                    keyed,
                    now_ms,
                    Some(participants),
                    reason,
                    &extra,
                )
                .await;
        };
        extra.push((a::RETRIED_AS, s(&next.transaction_id)));
        let mut update = transition_update(Status::Aborting, keyed, now_ms, Some(participants), reason);
        for (name, value) in extra {
            update = update.set(name, value);
        }
        let mut e = Expr::new();
        let expression = update.expression(&mut e);
        let condition = format!("{} = {}", e.name(a::STATUS), e.value(s(Status::Preparing.as_str())));
        let abort = Write::update(&self.table, Self::key(id), expression, condition, e);
        match self.with_successor(abort, next).await {
            // Read back: what the write made (the answer and the second phase need the whole record).
            Ok(Linked::Written) => match self.get(id).await? {
                Some(record)
                    if record.status == Status::Aborting && record.successor() == Some(&next.transaction_id) =>
                {
                    Ok(Transition::Done(record))
                }
                current => Ok(Transition::Lost(current)),
            },
            Ok(Linked::Refused(Some(current))) => Ok(Transition::Lost(Some(*current))),
            Ok(Linked::Refused(None)) => Ok(Transition::Lost(self.get(id).await?)),
            Ok(Linked::SuccessorTaken) | Err(StoreError { invalid: true, .. }) => {
                let unlinked = contention.without_retry();
                Box::pin(self.decide_abort(id, keyed, now_ms, participants, reason, &unlinked)).await
            }
            Err(e) => Err(e),
        }
    }

    /// Creates `record` (an attempt's ABORTED record, which names `next` as the attempt it is retried as)
    /// and `next`'s record in one write. When `next`'s id is taken already (a fence of an older
    /// coordinator's link) or the write is too large, `record` is created without the link.
    pub async fn create_with_successor(
        &self,
        record: &TransactionRecord,
        next: &TransactionRecord,
    ) -> Result<Created, StoreError> {
        let record = record.clone().bounded();
        let mut e = Expr::new();
        let not_there = format!("attribute_not_exists({})", e.name(a::ID));
        let create = Write::put(&self.table, record.to_item(), not_there, e);
        match self.with_successor(create, next).await {
            Ok(Linked::Written) => Ok(Created::Linked),
            Ok(Linked::Refused(Some(existing))) => Ok(Created::Exists(existing)),
            Ok(Linked::Refused(None)) => match self.get(&record.transaction_id).await? {
                Some(existing) => Ok(Created::Exists(Box::new(existing))),
                None => Err(StoreError::internal(
                    "TransactWriteItems",
                    &self.table,
                    format!("record {} reported but not found", record.transaction_id),
                )),
            },
            Ok(Linked::SuccessorTaken) | Err(StoreError { invalid: true, .. }) => {
                let mut unlinked = record.clone();
                unlinked.retried_as = None;
                Ok(match self.create(&unlinked).await? {
                    None => Created::Unlinked,
                    Some(existing) => Created::Exists(Box::new(existing)),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// `write` (the refused attempt's abort, conditional) and the creation of `next`'s record, in one
    /// `TransactWriteItems`.
    async fn with_successor(&self, write: Write, next: &TransactionRecord) -> Result<Linked, StoreError> {
        let next = next.clone().bounded();
        let mut p = Expr::new();
        let not_there = format!("attribute_not_exists({})", p.name(a::ID));
        let create = Write::put(&self.table, next.to_item(), not_there, p);
        // Idempotent: the SDK's retry after a lost reply is answered as the write it repeats.
        let sending = Sending::default().idempotent();
        let refusals = match conditional(&self.client, vec![write, create], sending).await?.decided()? {
            Decided::Applied(_) => return Ok(Linked::Written),
            Decided::Refused(refusals) => refusals,
        };
        if let Some(refused) = refusals.into_iter().find(|r| r.index == 0) {
            // The refused attempt moved on (decided by another), or this execution's own earlier try whose
            // reply was lost: the record says which, and its reader knows its own write.
            let current = match refused.item {
                Some(item) => Some(Box::new(TransactionRecord::from_item(&item)?)),
                None => None,
            };
            return Ok(Linked::Refused(current));
        }
        // Only the next attempt's id is taken, so nothing was written (the two are one write): by a record
        // of someone else's (a fence of an older coordinator's link).
        Ok(Linked::SuccessorTaken)
    }

    /// Records ABORTED the attempt `id` that follows `earlier` (named by its `retriedAs`) when it has no
    /// record yet, unless one appears first, so that it can never begin afterwards. The record is its
    /// request's, as every attempt's is: its key's hash (kept as long as the request's other records, so
    /// that the chain's link can never come to name a later execution), its caller, its hold, its age and
    /// its place in the chain; so the caller's GET and held decisions find it as any attempt of theirs.
    pub async fn fence_attempt(
        &self,
        id: &str,
        now_ms: u64,
        reason: &str,
        earlier: &TransactionRecord,
    ) -> Result<TransactionRecord, StoreError> {
        let mut record = absent_owner_record(id, now_ms, reason);
        record.request_hash = earlier.request_hash.clone();
        record.body_hash = earlier.body_hash.clone();
        record.principal = earlier.principal.clone();
        record.hold_ms = earlier.hold_ms;
        record = record.as_attempt(earlier.age(), earlier.attempt_number() + 1, earlier.first_id().to_owned());
        record = record.ended(Status::Aborted, now_ms);
        Ok(self.create(&record).await?.unwrap_or(record))
    }
}
