//! The phase engine: prepare every participant, decide by one conditional write, drive the second phase.
//! Every command runs its transactions through it: a request's attempts, a held transaction's decision, a
//! key's replay and the sweeper's recovery.
//!
//! It decides nothing by a key, an age, a hold or the access policy (it only carries the record's own
//! fields, `held` and `startedAt`, onto the wire). A command tells it the order to prepare in
//! ([`PrepareOrder`]), whether the record exists before the decision ([`Recording`]), and what an abort
//! records of its own making ([`ContentionAbort`], passed through to the write unread).
//!
//! Presumed abort: a transaction recorded only at its decision creates its record then, conditionally
//! (COMMITTING, or ABORTED); lock resolution that finds a lock whose owner has no record creates it ABORTED
//! the same way, so exactly one of the two exists. A decision write that fails is never taken to mean "not
//! decided": the abort is written conditionally over it (a fence), and only the record that results says
//! whether the locks may be released.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::Value;
use tracing::{error, info, warn};

use super::ballot::cast;
use super::reply::{DriveError, Reply};
use crate::attempts::{ContentionAbort, Created};
use crate::auth::{KeySource, SignatureVersion};
use crate::clock::SharedClock;
use crate::faults::{CoordinatorCrash, Crashed, Faults};
use crate::invoke::{InvokeError, ParticipantInvoker};
use crate::model::message::{Abort, Commit, Prepare};
use crate::model::{
    Action, ErrorCode, Message, ParticipantResponse, STATUS_ABORTED, STATUS_COMMITTED, STATUS_NOT_PREPARED, Status,
    Vote,
};
use crate::record::{ParticipantEntry, TransactionRecord, TransactionStore, Transition};
use crate::store::{StoreError, WriteOutcome};
use crate::telemetry;

/// One commit or abort message gets this long before it is counted as failed and tried again.
pub(super) const SECOND_PHASE_TIMEOUT: Duration = Duration::from_secs(5);
const SECOND_PHASE_ATTEMPTS: u32 = 3;
/// What a caller is told when the decision could not be recorded and the locks were released.
const UNRECORDED_DECISION: &str = "the decision could not be recorded, so the transaction was aborted";
/// Expired owners resolved for one prepare (or one-phase commit) before its refusal stands: one per item
/// it meets locked, at most a few in practice.
const MAX_RESOLUTIONS_PER_MESSAGE: u32 = 4;

/// What the phase engine works with: the record store, the participants and their keys, the clock, and
/// the crash points the recovery tests inject. Nothing of a request's key, age, hold or policy.
#[derive(Clone)]
pub struct PhaseEngine {
    pub(super) transactions: TransactionStore,
    pub(super) invoker: Arc<dyn ParticipantInvoker>,
    /// The participants' keys: every message is signed with its service's ([`crate::auth`]).
    pub(super) keys: Arc<dyn KeySource>,
    /// How messages are signed: v1 until every participant verifies v2 (infra/DEPLOY.md).
    pub(super) signature: SignatureVersion,
    pub(super) clock: SharedClock,
    pub(super) faults: Faults,
}

/// Which participants are asked to prepare, in what order, and whether one at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareOrder {
    /// Indices into the record's participants.
    pub order: Vec<usize>,
    /// One at a time, stopping at the first that does not prepare. The first asked then holds no lock
    /// anywhere, so it may wait for any transaction's lock instead of being refused by an older one (no
    /// wait can close a cycle through a transaction that holds nothing), and a refused attempt locked little.
    pub one_at_a_time: bool,
    /// The attempt's record was written, open, before any prepare is sent (and it is not held): its
    /// participants leave its locks out of the locks index (`recorded`), since the record finds them.
    pub recorded: bool,
}

impl PrepareOrder {
    /// Everyone at once, in the request's order.
    pub fn all_at_once(participants: usize) -> PrepareOrder {
        PrepareOrder { order: (0..participants).collect(), one_at_a_time: false, recorded: false }
    }

    /// One at a time, `first` first (when it names a participant), then in the request's order.
    pub fn one_at_a_time(participants: usize, first: Option<usize>) -> PrepareOrder {
        let order = match first.filter(|&f| f < participants) {
            Some(f) => std::iter::once(f).chain((0..participants).filter(|&i| i != f)).collect(),
            None => (0..participants).collect(),
        };
        PrepareOrder { order, one_at_a_time: true, recorded: false }
    }
}

/// How a transaction's decision is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recording {
    /// Its record was written before the prepares (PREPARING): the decision is a conditional status change.
    RecordFirst,
    /// Presumed abort: no record before the decision, which creates it.
    AtDecision,
}

/// What a decision came to.
#[derive(Debug)]
pub enum Decided {
    /// Decided and recorded; the second phase is still to drive (or, for a hold, the caller's decision).
    Open(TransactionRecord),
    /// Ended already, the participants released (an abort recorded at its decision, or a commit that lost to
    /// one): the answer, and the attempt's ABORTED record when it was recorded (this abort's own, or lock
    /// resolution's found first, shown with the votes), for the attempts command to judge.
    Ended { reply: Reply, aborted: Option<TransactionRecord> },
}

/// What driving a decided transaction came to.
#[derive(Debug, Clone)]
pub struct Driven {
    /// The record as it then is.
    pub record: TransactionRecord,
    /// Whether this call wrote its terminal status.
    pub finished_here: bool,
    /// The participants that did not acknowledge, each with why (empty once all did).
    pub unacknowledged: Vec<String>,
}

impl PhaseEngine {
    /// Sends prepare to the participants `order` names, each bounded by the deadline from when it is sent,
    /// and returns the record's participants with their votes (one not asked has none).
    pub(super) async fn prepare(
        &self,
        record: &TransactionRecord,
        order: &PrepareOrder,
    ) -> Result<Vec<ParticipantEntry>, Crashed> {
        let sole = record.participants.len() == 1;
        let prepares: Vec<_> = order
            .order
            .iter()
            .enumerate()
            .map(|(position, &index)| {
                let entry = &record.participants[index];
                let request = Message::Prepare(Prepare {
                    transaction_id: record.transaction_id.clone(),
                    operations: entry.operations.clone(),
                    deadline: Some(record.deadline),
                    started_at: Some(record.age()),
                    principal: record.principal.clone(),
                    held: record.is_held(),
                    holds_no_locks: sole || (order.one_at_a_time && position == 0),
                    recorded: order.recorded,
                });
                async move {
                    let sent = self.clock.now_ms();
                    let budget = Duration::from_millis(record.deadline.saturating_sub(sent));
                    let result = tokio::time::timeout(budget, self.call_resolving(&entry.service, &request)).await;
                    if let Ok(Ok(ParticipantResponse { received_at: Some(at), answered_at: Some(answered), .. })) =
                        &result
                    {
                        telemetry::clock_skew(&entry.service, sent, self.clock.now_ms(), *at, *answered);
                    }
                    (index, result)
                }
            })
            .collect();
        let width = if order.one_at_a_time { 1 } else { record.participants.len().max(1) };
        let mut pending = futures::stream::iter(prepares).buffer_unordered(width);
        let mut votes = record.participants.clone();
        let mut answered = 0;
        while let Some((index, result)) = pending.next().await {
            cast(&mut votes[index], result);
            answered += 1;
            self.faults.check(CoordinatorCrash::AfterPrepares(answered))?;
            if order.one_at_a_time && votes[index].vote != Some(Vote::Prepared) {
                // The attempt aborts: the participants after it are not asked (abort releases nothing there).
                break;
            }
        }
        Ok(votes)
    }

    /// The commit decision, with the votes. Recorded first: PREPARING → COMMITTING on the record. At the
    /// decision: the record is created COMMITTING; [`Decided::Ended`] when the transaction ended aborted
    /// instead (lock resolution recorded it ABORTED first, or the decision could not be written and the
    /// abort written over it won).
    pub(super) async fn commit(
        &self,
        mut record: TransactionRecord,
        votes: Vec<ParticipantEntry>,
        recording: Recording,
    ) -> Result<Decided, DriveError> {
        if recording == Recording::RecordFirst {
            let id = &record.transaction_id;
            let written =
                self.transition_retrying(id, Status::Preparing, Status::Committing, true, Some(&votes), None).await;
            let none_of_its_own = ContentionAbort::default();
            let decided = self.settle(&record, Status::Committing, written, votes, &none_of_its_own).await?;
            return Ok(Decided::Open(decided));
        }
        record.participants = votes;
        record.reason = None;
        record.updated_at = self.clock.now_ms();
        self.create_commit(record).await
    }

    /// The abort decision, with the votes and its reason, and what it records of its own making (`own`).
    /// Recorded first: PREPARING → ABORTING on the record. At the decision: the ABORTED record is created
    /// while the participants release, and the transaction has ended ([`Decided::Ended`]).
    pub(super) async fn abort(
        &self,
        mut record: TransactionRecord,
        votes: Vec<ParticipantEntry>,
        reason: String,
        own: &ContentionAbort,
        recording: Recording,
    ) -> Result<Decided, DriveError> {
        if recording == Recording::RecordFirst {
            let written = self.abort_retrying(&record.transaction_id, &votes, Some(&reason), own).await;
            return Ok(Decided::Open(self.settle(&record, Status::Aborting, written, votes, own).await?));
        }
        record.participants = votes;
        record.reason = Some(reason);
        record.updated_at = self.clock.now_ms();
        let (reply, aborted) = self.create_abort(own.applied_to(record), own.next.as_deref()).await?;
        Ok(Decided::Ended { reply, aborted })
    }

    /// What a decision written to an existing record (`written`, wanting `to`) came to. A write that failed
    /// is settled by writing the abort over it, conditionally: the record then says which one happened (an
    /// abort's fence is the same decision, with what it says of itself). Whatever the record then says is
    /// the decision: lock resolution may have aborted it first, and a status found as this execution wanted
    /// it is its own write whose reply was lost (only this execution ever writes its commit; an ABORTING
    /// found is the abort either way, but only this execution's own carries `own`, which alone leads to a
    /// retry).
    pub(super) async fn settle(
        &self,
        record: &TransactionRecord,
        to: Status,
        written: Result<Transition, StoreError>,
        votes: Vec<ParticipantEntry>,
        own: &ContentionAbort,
    ) -> Result<TransactionRecord, DriveError> {
        let id = &record.transaction_id;
        let transition = match written {
            Ok(transition) => transition,
            Err(e) => {
                warn!(error = %e, "decision write failed; fencing it with an abort");
                match self.abort_retrying(id, &votes, Some(UNRECORDED_DECISION), own).await {
                    Ok(transition) => transition,
                    Err(_) => return Err(self.unrecorded_decision(record, e).await),
                }
            }
        };
        match transition {
            // A decision written shortened (the record would have passed 400 KB) may lack the votes: shown.
            Transition::Done(record) => Ok(with_votes(record, votes)),
            Transition::Lost(Some(current)) => {
                if current.status != to {
                    warn!(status = %current.status, "the record was decided otherwise first; following it");
                }
                Ok(with_votes(current, votes))
            }
            Transition::Lost(None) => {
                Err(StoreError::internal("UpdateItem", self.transactions.table(), format!("record {id} disappeared"))
                    .into())
            }
        }
    }

    /// The commit decision of a transaction without a record: the record is created COMMITTING.
    async fn create_commit(&self, record: TransactionRecord) -> Result<Decided, DriveError> {
        let committing = TransactionRecord { status: Status::Committing, ..record.clone() }.opened();
        let existing = match self.create_own(&committing).await {
            Ok(None) => return Ok(Decided::Open(committing)),
            Ok(Some(existing)) => existing,
            Err(e) => {
                // Unknown whether the COMMITTING record exists: an ABORTED one created conditionally decides.
                warn!(error = %e, "decision write failed; fencing it with an abort");
                let mut aborted = record.clone().ended(Status::Aborted, self.clock.now_ms());
                aborted.reason = Some(UNRECORDED_DECISION.to_owned());
                // Whatever made DynamoDB refuse the decision, it cannot be in the fence: an aborted record
                // needs no operations, nothing is ever finished from it.
                aborted.participants.iter_mut().for_each(|p| p.operations.clear());
                let fenced = match self.create_own(&aborted).await {
                    Ok(fenced) => fenced,
                    Err(_) => return Err(self.unrecorded_decision(&record, e).await),
                };
                match fenced {
                    None => {
                        self.abort_participants(&record).await?;
                        return Ok(Decided::Ended { reply: Reply::for_record(&aborted), aborted: None });
                    }
                    Some(existing) if existing.execution_id == committing.execution_id => {
                        return Ok(Decided::Open(with_votes(existing, committing.participants)));
                    }
                    Some(existing) => existing,
                }
            }
        };
        // Lock resolution found a lock of this transaction expired and recorded it aborted first. It released
        // only the locks it found expired: release the rest.
        warn!(status = %existing.status, "lock resolution decided first");
        self.abort_participants(&record).await?;
        let reply = Reply::for_record(&with_votes(existing, record.participants));
        Ok(Decided::Ended { reply, aborted: None })
    }

    /// Neither the decision nor the abort written over it could be recorded. Only this execution can ever
    /// write its transaction's commit decision, so if DynamoDB refused every attempt at it, it certainly
    /// did not happen: the transaction is aborted and its locks released before the 503. If any attempt
    /// may have taken effect, the record may say COMMITTING: nothing is released, and lock resolution
    /// settles the locks from the record once they expire.
    async fn unrecorded_decision(&self, record: &TransactionRecord, error: StoreError) -> DriveError {
        let released = error.outcome == WriteOutcome::NotApplied;
        if released {
            match self.abort_participants(record).await {
                Ok(_) => warn!("decision refused by the transaction store; locks released"),
                Err(crashed) => return crashed.into(),
            }
        }
        DriveError::Unrecorded { error, released }
    }

    /// Aborts a transaction that has no record yet: presumed abort, so nothing had to be written before
    /// the decision. The ABORTED record is created (conditionally: lock resolution may have written it
    /// first) while every participant releases what it may hold; the answer comes once they have. No one
    /// else can ever decide commit for it, so the releases need not wait for the record. The record comes
    /// back with the answer when it was recorded. An attempt retried as `next` is created with `next`'s record
    /// in the same write ([`PhaseEngine::create_own_linked`]).
    async fn create_abort(
        &self,
        record: TransactionRecord,
        next: Option<&TransactionRecord>,
    ) -> Result<(Reply, Option<TransactionRecord>), DriveError> {
        let record = record.ended(Status::Aborted, self.clock.now_ms());
        let (created, released) =
            futures::join!(self.create_own_linked(&record, next), self.abort_participants(&record));
        released?;
        let record = match created {
            Ok(Created::Linked) => record,
            Ok(Created::Unlinked) => TransactionRecord { retried_as: None, ..record },
            Ok(Created::Exists(existing)) => with_votes(*existing, record.participants),
            Err(e) => {
                error!(error = %e, "could not record the abort");
                let mut reply = Reply::error(
                    ErrorCode::Unavailable,
                    "the transaction was aborted and nothing was applied, but its record could not be written: \
                     GET may not find it",
                );
                reply.body["transactionId"] = Value::String(record.transaction_id);
                return Ok((reply, None));
            }
        };
        Ok((Reply::for_record(&record), Some(record)))
    }

    /// Drives a decided transaction until `answer_by` at most: the record as it then is (terminal, or still
    /// decided, the sweeper finishing it).
    pub(super) async fn drive_within(
        &self,
        decided: TransactionRecord,
        answer_by: Instant,
        prepares_answered: bool,
    ) -> Result<TransactionRecord, DriveError> {
        let remaining = answer_by.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, self.drive_answered(decided.clone(), prepares_answered)).await {
            Ok(driven) => Ok(driven?.record),
            Err(_) => {
                warn!(status = %decided.status, "answer budget spent before the second phase ended; the sweeper finishes it");
                Ok(decided)
            }
        }
    }

    /// Drives a decided transaction to its end: commits (or aborts) at every participant that holds locks,
    /// then the terminal status. A participant that cannot be reached leaves it open for the sweeper, and
    /// the record says so. Also tells whether this call wrote the terminal status, and which participants
    /// did not acknowledge and why.
    pub(super) async fn drive(&self, record: TransactionRecord) -> Result<Driven, DriveError> {
        self.drive_answered(record, false).await
    }

    /// [`PhaseEngine::drive`], by a driver that knows whether every prepare of the attempt was answered
    /// (`prepares_answered`: its own coordinator). Issue 48: the locks of an attempt recorded before its
    /// prepares stay out of the locks index, so a lock write of a prepare still in flight, landing after
    /// the releases, would be found by nobody once the record ended. An abort is therefore ended at once
    /// only when every prepare answered (or the transaction is held: its locks are indexed). Otherwise,
    /// until its deadline and the clock margins pass (after every participant's lock cutoff,
    /// [`crate::clock::lock_cutoff`]), the releases are sent and the record left ABORTING: the sweeper,
    /// which drives it only past them, releases again and ends it.
    pub(super) async fn drive_answered(
        &self,
        record: TransactionRecord,
        prepares_answered: bool,
    ) -> Result<Driven, DriveError> {
        let (action, terminal) = match record.status {
            Status::Committing => (Action::Commit, Status::Committed),
            Status::Aborting => (Action::Abort, Status::Aborted),
            _ => return Ok(Driven { record, finished_here: false, unacknowledged: vec![] }),
        };
        let unacknowledged = self.second_phase(&record, action).await?;
        if !unacknowledged.is_empty() {
            return Ok(Driven { record, finished_here: false, unacknowledged });
        }
        let late_lock_possible = action == Action::Abort
            && !prepares_answered
            && !record.is_held()
            && self.clock.now_ms() <= crate::clock::resolvable_after(record.deadline);
        if late_lock_possible {
            info!("released; a prepare may still lock out of the locks index, so the sweeper ends the abort");
            let why = "a prepare's lock may still land: the sweeper releases again past the lock cutoff".to_owned();
            return Ok(Driven { record, finished_here: false, unacknowledged: vec![why] });
        }
        self.faults.check(CoordinatorCrash::BeforeTerminal)?;
        let keyed = record.is_keyed();
        let (record, finished_here) =
            match self.transition_retrying(&record.transaction_id, record.status, terminal, keyed, None, None).await? {
                Transition::Done(done) => (done, true),
                // A sweeper finished it at the same time: the outcome is the same.
                Transition::Lost(Some(current)) => (current, false),
                Transition::Lost(None) => (record, false),
            };
        Ok(Driven { record, finished_here, unacknowledged: vec![] })
    }

    /// Everyone who may hold a lock releases it: all but those whose PREPARED vote said they only read. A
    /// refusal or no answer proves nothing: an earlier delivery of the same prepare may have taken the lock
    /// (and an abort where nothing was locked is an empty rollback).
    pub(super) async fn abort_participants(&self, record: &TransactionRecord) -> Result<Vec<String>, Crashed> {
        self.second_phase(record, Action::Abort).await
    }

    /// Sends `action` to every participant that may hold a lock, at once, each retried until acknowledged:
    /// those that never did, each with why.
    async fn second_phase(&self, record: &TransactionRecord, action: Action) -> Result<Vec<String>, Crashed> {
        let mut pending: FuturesUnordered<_> = record
            .participants
            .iter()
            .filter(|p| !p.read_only)
            .map(|entry| {
                let transaction_id = record.transaction_id.clone();
                let operations = entry.operations.clone();
                let request = match action {
                    Action::Commit => {
                        Message::Commit(Commit { transaction_id, operations, lock_token: entry.lock_token.clone() })
                    }
                    _ => Message::Abort(Abort { transaction_id, operations }),
                };
                async move { (entry.service.as_str(), self.deliver(&entry.service, &request).await) }
            })
            .collect();
        let mut unacknowledged = vec![];
        let mut answered = 0;
        while let Some((service, delivered)) = pending.next().await {
            if let Err(why) = delivered {
                error!(service, action = action.as_str(), why, "participant did not acknowledge; left for the sweeper");
                unacknowledged.push(format!("{service} did not acknowledge the {}: {why}", action.as_str()));
            }
            answered += 1;
            self.faults.check(CoordinatorCrash::AfterCommits(answered))?;
        }
        Ok(unacknowledged)
    }
}

/// A record another writer decided, shown with the votes this coordinator collected when it has none.
pub(super) fn with_votes(mut record: TransactionRecord, votes: Vec<ParticipantEntry>) -> TransactionRecord {
    if record.participants.iter().all(|p| p.vote.is_none()) {
        record.participants = votes;
    }
    record
}

impl PhaseEngine {
    /// Sends one message to a participant, signed with its service's current key.
    pub async fn call(&self, service: &str, message: &Message) -> Result<ParticipantResponse, InvokeError> {
        let request = &message.to_wire();
        let unsigned =
            |e: crate::auth::KeyError| InvokeError::Unsigned { service: service.to_owned(), message: e.to_string() };
        match self.signature {
            SignatureVersion::V1 => {
                let signed = crate::auth::sign(self.keys.as_ref(), service, request, self.clock.now_ms())
                    .await
                    .map_err(unsigned)?;
                self.invoker.invoke(service, &signed).await
            }
            SignatureVersion::V2 => {
                let sealed = crate::auth::seal(self.keys.as_ref(), service, request, self.clock.now_ms())
                    .await
                    .map_err(unsigned)?;
                self.invoker.invoke_sealed(service, &sealed).await
            }
        }
    }

    /// [`PhaseEngine::call`] for a prepare or a one-phase commit: a refusal that names an expired lock's
    /// owner the participant may not decide ([`ParticipantResponse::unresolved_owner`]) is resolved here,
    /// with this role's rights and from that owner's own record only (past its expiry it is aborted by the
    /// same conditional write every resolver races its coordinator with), and the message sent again.
    /// An owner with no record is left to the sweeper, which reads the lock itself: a participant's word
    /// alone never makes this coordinator write a decision.
    pub(super) async fn call_resolving(
        &self,
        service: &str,
        message: &Message,
    ) -> Result<ParticipantResponse, InvokeError> {
        let mut resolved = 0;
        loop {
            let response = self.call(service, message).await?;
            let Some(owner) = response.unresolved_owner.as_deref() else { return Ok(response) };
            if resolved == MAX_RESOLUTIONS_PER_MESSAGE || owner == message.transaction_id() {
                return Ok(response);
            }
            resolved += 1;
            match crate::recovery::resolve_recorded(&self.transactions, owner, self.clock.now_ms()).await {
                Ok(true) => info!(service, owner, "resolved an expired lock's owner for a participant; asking again"),
                Ok(false) => return Ok(response),
                Err(e) => {
                    warn!(service, owner, error = %e, "could not resolve an expired lock's owner");
                    return Ok(response);
                }
            }
        }
    }

    /// One commit or abort, retried until the participant acknowledges it; or why it did not, in words
    /// fit for the record (the participant's own reason, or the invoke's public one).
    pub(super) async fn deliver(&self, service: &str, request: &Message) -> Result<(), String> {
        let mut why = String::new();
        for attempt in 0..SECOND_PHASE_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
            match tokio::time::timeout(SECOND_PHASE_TIMEOUT, self.call(service, request)).await {
                Ok(Ok(response)) if acknowledged(request.action(), &response) => return Ok(()),
                Ok(Ok(response)) => {
                    warn!(service, ?response, "unexpected second-phase answer");
                    why = match (&response.status, &response.reason) {
                        (Some(status), Some(reason)) => format!("{status}: {reason}"),
                        (status, _) => format!("answered {}", status.as_deref().unwrap_or("no status")),
                    };
                }
                Ok(Err(e)) => {
                    warn!(service, error = %e, attempt, "second-phase delivery failed");
                    why = e.public_reason();
                }
                Err(_) => {
                    warn!(service, attempt, "second-phase delivery timed out");
                    why = format!("no answer within {SECOND_PHASE_TIMEOUT:?}");
                }
            }
        }
        Err(why)
    }
}

/// Whether an answer completes the second phase for that participant.
///
/// A commit answered NOT_PREPARED counts as applied, and that is sound: commit is only ever sent for a
/// transaction decided COMMITTING, for which every participant voted PREPARED, so each of its items
/// held a lock of this transaction. That lock goes away only by committing the item (here, or by lock
/// resolution rolling it forward), never by an abort: aborts and releases happen only for transactions
/// decided ABORTING, and a status never moves backwards. So a lock that is gone was applied, even when
/// a later commit by another transaction has since replaced `lastTx`.
fn acknowledged(action: Action, response: &ParticipantResponse) -> bool {
    matches!(
        (action, response.status.as_deref()),
        (Action::Commit, Some(STATUS_COMMITTED | STATUS_NOT_PREPARED)) | (Action::Abort, Some(STATUS_ABORTED))
    )
}

impl PhaseEngine {
    /// Creates a record unless one exists, retried on infrastructure errors: `Some` is the record another
    /// write created first. A record found with this execution's id and this status is this very write
    /// (an attempt whose reply was lost, retried by the SDK or here), and counts as created: an execution
    /// never creates two records with the same status.
    pub(super) async fn create_own(&self, record: &TransactionRecord) -> Result<Option<TransactionRecord>, StoreError> {
        retrying("record write", |_| async move {
            Ok(match self.transactions.create(record).await? {
                Some(existing)
                    if existing.execution_id.is_some()
                        && existing.execution_id == record.execution_id
                        && existing.status == record.status =>
                {
                    None
                }
                found => found,
            })
        })
        .await
    }

    /// [`PhaseEngine::create_own`] of a refused attempt's ABORTED record with the record of `next`, the
    /// attempt it is retried as, in one write ([`TransactionStore::create_with_successor`]); without `next`,
    /// the record alone. A record found with this execution's id and status is its own earlier write: linked
    /// when it names `next`.
    pub(super) async fn create_own_linked(
        &self,
        record: &TransactionRecord,
        next: Option<&TransactionRecord>,
    ) -> Result<Created, StoreError> {
        retrying("record write", |_| async move {
            let created = match next {
                Some(next) => self.transactions.create_with_successor(record, next).await?,
                None => match self.transactions.create(record).await? {
                    None => Created::Unlinked,
                    Some(existing) => Created::Exists(Box::new(existing)),
                },
            };
            Ok(match created {
                Created::Exists(existing)
                    if existing.execution_id.is_some()
                        && existing.execution_id == record.execution_id
                        && existing.status == record.status =>
                {
                    let linked =
                        next.is_some_and(|n| existing.retried_as.as_deref() == Some(n.transaction_id.as_str()));
                    if linked { Created::Linked } else { Created::Unlinked }
                }
                created => created,
            })
        })
        .await
    }

    /// This execution's abort decision of its attempt `id`, recorded first ([`TransactionStore::decide_abort`]), retried
    /// on infrastructure errors: a retry that finds ABORTING with this execution's `retriedAs` or
    /// `refusedForContention` found its own earlier write; any other ABORTING is someone else's abort.
    pub(super) async fn abort_retrying(
        &self,
        id: &str,
        votes: &[ParticipantEntry],
        reason: Option<&str>,
        contention: &ContentionAbort,
    ) -> Result<Transition, StoreError> {
        retrying("abort decision", |_| {
            self.transactions.decide_abort(id, true, self.clock.now_ms(), votes, reason, contention)
        })
        .await
    }

    /// A status change, retried on infrastructure errors: its condition makes a repeat harmless, and a
    /// retry that finds the status it wanted found its own earlier write.
    pub(super) async fn transition_retrying(
        &self,
        id: &str,
        from: Status,
        to: Status,
        keyed: bool,
        participants: Option<&[ParticipantEntry]>,
        reason: Option<&str>,
    ) -> Result<Transition, StoreError> {
        retrying("status write", |_| async move {
            self.transactions.transition(id, from, to, keyed, self.clock.now_ms(), participants, reason).await
        })
        .await
    }
}

/// A conditional write to a transaction record, tried up to three times on infrastructure errors. The
/// error it ends with says the write may have taken effect if any attempt may have.
pub(super) async fn retrying<T, Fut>(what: &str, mut write: impl FnMut(u32) -> Fut) -> Result<T, StoreError>
where
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut last: Option<StoreError> = None;
    for attempt in 0..3u32 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(25 << attempt)).await;
        }
        match write(attempt).await {
            Ok(done) => return Ok(done),
            Err(mut e) => {
                warn!(error = %e, attempt, "{what} failed");
                if last.as_ref().is_some_and(|l| l.outcome == WriteOutcome::Unknown) {
                    e.outcome = WriteOutcome::Unknown;
                }
                // Refused as invalid, it would be refused again: the caller fences it.
                if e.invalid {
                    return Err(e);
                }
                last = Some(e);
            }
        }
    }
    Err(last.expect("at least one attempt"))
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
