//! A prepare: the service's rules and own operations judge the items, then one conditional write locks
//! them all (or a read-only prepare reads them), and a failed lock is classified from the item as it
//! was: this transaction's own earlier lock, a guard that does not hold, an owner to wait for or to
//! resolve ([`super::locks`]).

use futures::future::try_join_all;
use serde_json::Value;
use tracing::warn;

use super::Prepared;
use super::answers::{blocked, operation_refused, prepared, refused, rule_refused, status};
use super::expressions::{LockSpec, Seen};
use super::operations::unrepresentable_result;
use super::store::{DEFAULT_LOCK_MS, Lock, LockAttempt, OnePhase, find};
use crate::model::{
    ErrorCode, Invalid, Operation, ParticipantResponse, RefusalCode, STATUS_COMMITTED, STATUS_RECORD_EXISTS, Status,
    Vote,
};
use crate::recovery::{OwnerFate, read_owner_fate};
use crate::store::{Item, StoreError, WriteOutcome};
use crate::tables::item_attr as a;

use super::credits::{self, Credit};
use super::locks::{
    Claim, Cutoff, LOCK_ATTEMPTS, LockFailure, OWNER_CHECK_AFTER_POLLS, Order, Waited, Waiting, check_holds,
    classify_lock_failure, locked_by,
};
use super::protocol::{Participant, ParticipantError};
/// A one-phase commit's record as the item it creates: only this transaction's.
pub(super) fn one_phase_record(tx: &str, record: &Value) -> Result<Item, Invalid> {
    match record {
        Value::Object(map) if map.get("transactionId").and_then(Value::as_str) == Some(tx) => {
            Ok(crate::attr::to_item(map))
        }
        _ => Err(Invalid::new(ErrorCode::InvalidRequest, "onePhaseRecord must be this transaction's record")),
    }
}

impl Participant {
    /// Prepare and commit in one atomic write, for a transaction with no other writing participant.
    pub(super) async fn commit_one_phase(
        &self,
        tx: &str,
        order: Order,
        principal: Option<&str>,
        operations: &[Operation],
        record: &Value,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let keys = match self.keys(operations) {
            Ok(keys) => keys,
            Err(reason) => return Ok(refused(RefusalCode::Invalid, reason)),
        };
        let record = one_phase_record(tx, record)?;
        let cutoff = Cutoff::of(order);
        let work: Vec<(Operation, Item)> = operations.iter().cloned().zip(keys).collect();
        let waiting =
            Waiting::new(tx, order, self.clock.now_ms(), self.max_lock_wait_ms).claiming(false, self.rules.is_some());
        let answer: Result<ParticipantResponse, ParticipantError> = async {
            while let Some(attempt) = waiting.next_attempt() {
                // As for a lock write: no attempt once the deadline and the clock margin passed (one that arrived
                // past it was answered by the guard).
                if let Some(late) = cutoff.passed(self.clock.now_ms(), "the items could not be committed before") {
                    return Ok(late);
                }
                let (ready, seen) = match self.judge_attempt(tx, principal, &work, &waiting, attempt).await? {
                    Attempt::Answered(answer) => return Ok(answer),
                    Attempt::Again => continue,
                    Attempt::Ready(ready, seen) => (ready, seen),
                };
                match self
                    .table
                    .apply_one_phase(tx, &ready, self.transactions.table(), record.clone(), &seen, self.rules.is_some())
                    .await?
                {
                    OnePhase::Committed => return Ok(status(STATUS_COMMITTED, None)),
                    OnePhase::RecordExists => return Ok(status(STATUS_RECORD_EXISTS, None)),
                    OnePhase::Unstorable(message) => return Ok(refused(RefusalCode::ConditionFailed, message)),
                    OnePhase::Contention => self.backoff(attempt, cutoff).await,
                    OnePhase::ConditionFailed { index, item } => {
                        let failed = vec![(index, item)];
                        if let Some(refusal) = self.after_lock_failure(tx, &work, failed, &waiting, attempt).await? {
                            return Ok(refusal);
                        }
                    }
                }
            }
            Ok(refused(
                RefusalCode::Conflict,
                format!("could not commit after {LOCK_ATTEMPTS} attempts: the items kept changing"),
            ))
        }
        .await;
        // A one-phase write does not remove the marker: removed here, whatever the answer.
        self.clear_markers(tx, &waiting, false).await;
        answer
    }

    /// Locks the items of `operations` for `tx` (a participant whose operations only `check` reads them and
    /// locks nothing, unless the transaction is `held`: a check means nothing over a long hold otherwise).
    pub(super) async fn prepare(
        &self,
        tx: &str,
        order: Order,
        principal: Option<&str>,
        operations: &[Operation],
        held: bool,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let keys = match self.keys(operations) {
            Ok(keys) => keys,
            Err(reason) => return Ok(refused(RefusalCode::Invalid, reason)),
        };
        // (A prepare that arrived past its cutoff was answered by the guard.)
        let now = self.clock.now_ms();
        let cutoff = Cutoff::of(order);
        if !held && operations.iter().all(Operation::is_read_only) {
            return self.prepare_read_only(tx, order, principal, operations, &keys).await;
        }
        let work: Vec<(Operation, Item)> = operations.iter().cloned().zip(keys).collect();
        // A recorded prepare's credits take pending entries, not the lock (issue 48): its record finds them.
        // Not where the service's rules judge the items: a rule would pass on a value that leaves out the
        // credits already pending (those credits take the lock, and wait for the entries to drain).
        let credits = self.pending_credits && order.recorded && !held && self.rules.is_none();
        let waiting = Waiting::new(tx, order, now, self.max_lock_wait_ms).claiming(credits, self.rules.is_some());
        let entries = credits && work.iter().any(|(op, _)| credits::is_credit(op));
        let answer: Result<ParticipantResponse, ParticipantError> = async {
            let expires_at = order.deadline.unwrap_or(now + DEFAULT_LOCK_MS);
            let started_at = order.priority().unwrap_or(now);
            while let Some(attempt) = waiting.next_attempt() {
                // Every attempt checks the cutoff first: no lock is written for a transaction whose deadline
                // (and the clock margin) passed, however long the attempts before took.
                if let Some(late) = cutoff.passed(self.clock.now_ms(), "the items could not be locked before") {
                    return Ok(late);
                }
                // Every attempt at the lock write carries a token no other request ever carried (the write is
                // sent once, without SDK retries): the vote reports the token of the lock it saw taken, and a
                // request of this prepare that lands late — after the item was committed and changed again —
                // can only take a lock whose token no vote reported, which commit releases without applying.
                // With rules or own operations: judged on the items as they are, locked only if they still are.
                let (ready, seen) = match self.judge_attempt(tx, principal, &work, &waiting, attempt).await? {
                    Attempt::Answered(answer) => return Ok(answer),
                    Attempt::Again => continue,
                    Attempt::Ready(ready, seen) => (ready, seen),
                };
                // Again just before the write: judging may have read the items for long (a rule's reads are
                // retried), and a lock written past the cutoff could land after the sweeper's last release.
                if let Some(late) = cutoff.passed(self.clock.now_ms(), "the items could not be locked before") {
                    return Ok(late);
                }
                let token = credits::new_token(entries);
                // A held transaction's locks stay in the index whatever its message says: its hold moves them.
                let indexed = held || !order.recorded;
                let spec = LockSpec {
                    tx,
                    token: &token,
                    expires_at,
                    started_at,
                    indexed,
                    credits,
                    rules: self.rules.is_some(),
                    now: self.clock.now_ms(),
                };
                let timeout = cutoff.left(self.clock.now_ms());
                let locked = match self.table.lock_all(spec, &ready, timeout, &seen).await {
                    Ok(locked) => locked,
                    // Whether it took effect or not, the next attempt finds out: a lock of this transaction is
                    // then its own, and its token is the vote's. For a lock out of the index (or a pending
                    // credit), only after a write DynamoDB refused (not applied): one whose outcome is unknown (no
                    // answer, a server error) might still land after that next attempt's lock was committed and
                    // the item changed again, a stray no index finds. The error, not a vote, tells the
                    // coordinator that this execution is over: it ends the abort once the write can have landed
                    // (within the clock margin), or leaves it to the sweeper.
                    Err(e) if attempt + 1 < LOCK_ATTEMPTS && (indexed || e.outcome == WriteOutcome::NotApplied) => {
                        warn!(error = %e, attempt, "lock write failed; trying again with a new token");
                        self.backoff(attempt, cutoff).await;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                };
                match locked {
                    LockAttempt::Locked(returned) => return self.verify_locked(tx, &token, &work, returned).await,
                    LockAttempt::Contention => self.backoff(attempt, cutoff).await,
                    LockAttempt::Unstorable(reason) => return Ok(refused(RefusalCode::ConditionFailed, reason)),
                    LockAttempt::ConditionFailed(failed) => {
                        if let Some(answer) = self.after_lock_failure(tx, &work, failed, &waiting, attempt).await? {
                            return Ok(answer);
                        }
                    }
                }
            }
            Ok(refused(
                RefusalCode::Conflict,
                format!("could not lock the items after {LOCK_ATTEMPTS} attempts: they kept changing"),
            ))
        }
        .await;
        let locked = matches!(&answer, Ok(a) if a.vote == Some(Vote::Prepared));
        self.clear_markers(tx, &waiting, locked).await;
        answer
    }

    /// The drain markers this prepare left, removed unless it took the locks (`locked`: their write removed
    /// them): a marker left after its owner ended would hold new credits back until it runs out.
    async fn clear_markers(&self, tx: &str, waiting: &Waiting<'_>, locked: bool) {
        let marked = std::mem::take(&mut *waiting.marked.lock().unwrap_or_else(|e| e.into_inner()));
        if locked || marked.is_empty() {
            return;
        }
        for key in marked {
            if let Err(e) = self.table.clear_drain(tx, &key).await {
                warn!(error = %e, "could not remove this prepare's drain marker; it runs out by itself");
            }
        }
    }

    /// The guards held when the locks were taken; one thing they cannot express remains: that an `add`'s
    /// result fits in a DynamoDB number, with every credit pending on its field committed or not. Checked
    /// here on the locked values, and the locks (and entries) released if not.
    async fn verify_locked(
        &self,
        tx: &str,
        token: &str,
        work: &[(Operation, Item)],
        returned: Vec<Item>,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let adds: Vec<&(Operation, Item)> = work.iter().filter(|(op, _)| matches!(op, Operation::Add { .. })).collect();
        if adds.is_empty() {
            return Ok(prepared(Some(token.to_owned())));
        }
        let items = if returned.is_empty() {
            let keys: Vec<Item> = adds.iter().map(|(_, key)| key.clone()).collect();
            self.table.get_many(&keys).await?
        } else {
            returned
        };
        let problem = adds.iter().find_map(|(op, key)| {
            let item = find(&items, key)?;
            unrepresentable_result(op, item).or_else(|| unrepresentable_with_credits(tx, op, item, token))
        });
        let Some(problem) = problem else { return Ok(prepared(Some(token.to_owned()))) };
        try_join_all(work.iter().map(|(op, key)| async move {
            if credits::is_entry(op, Some(token)) {
                self.table.drop_credit(tx, key, Some(token)).await.map(|dropped| dropped.is_none())
            } else {
                self.table.release(tx, key, Some(token), "unrepresentable result").await
            }
        }))
        .await?;
        Ok(refused(RefusalCode::ConditionFailed, problem))
    }

    /// Classifies a failed lock write from the items as they were: the answer to give (`Some`), or `None`
    /// once the way is clear to try again (an expired lock resolved, or a pause when an item changed).
    async fn after_lock_failure(
        &self,
        tx: &str,
        work: &[(Operation, Item)],
        failed: Vec<(usize, Option<Item>)>,
        waiting: &Waiting<'_>,
        attempt: u32,
    ) -> Result<Option<ParticipantResponse>, ParticipantError> {
        let now = self.clock.now_ms();
        let mut failures = Vec::with_capacity(failed.len());
        for (index, returned) in failed {
            let (op, key) = &work[index];
            let item = match returned {
                Some(item) => Some(item),
                // Not every endpoint returns the item with the failure: read it.
                None => self.table.get(key).await?,
            };
            failures.push((key, classify_lock_failure(tx, op, item.as_ref(), now, waiting.claim(op))));
        }
        let ours: Vec<&Option<String>> = failures
            .iter()
            .filter_map(|(_, f)| match f {
                LockFailure::Ours { token } => Some(token),
                _ => None,
            })
            .collect();
        if let Some(first) = ours.first() {
            // An earlier delivery of this prepare (or this write's own attempt whose reply was lost) locked
            // the items: its vote stands, with its token. Locks on only some of them mean the transaction is
            // already being finished here, so nothing more may be locked for it.
            if ours.len() == work.len() && ours.iter().all(|token| token == first) {
                return Ok(Some(prepared((*first).clone())));
            }
            return Ok(Some(refused(
                RefusalCode::Conflict,
                format!("transaction {tx} holds only some of its items here: it is already being finished"),
            )));
        }
        let (key, failure) = failures.swap_remove(0);
        self.settle(failure, key, waiting, attempt).await
    }

    /// What a lock failure means for this attempt: a refusal to answer (`Some`), or `None` to try again.
    async fn settle(
        &self,
        failure: LockFailure,
        key: &Item,
        waiting: &Waiting<'_>,
        attempt: u32,
    ) -> Result<Option<ParticipantResponse>, ParticipantError> {
        match failure {
            LockFailure::Refused { code, reason } => Ok(Some(refused(code, reason))),
            LockFailure::Expired { owner } => self.resolve(&owner, key, Holding::Lock).await,
            LockFailure::ExpiredCredit { owner, token } => self.resolve(&owner, key, Holding::Credit(&token)).await,
            LockFailure::Credits { entity, owners, claim, behind_marker } => {
                // A credit never waits behind another transaction's marker: that transaction waits for
                // entries, and a credit's transaction may hold a lock it needs elsewhere. Otherwise wait-die
                // as for a lock: a wait only ever goes from older to younger.
                let yields =
                    |(owner, started_at): &&(String, u64)| behind_marker || !waiting.may_wait_for(owner, *started_at);
                if let Some((owner, _)) = owners.iter().find(yields) {
                    return Ok(Some(blocked(owner, credits_block(&entity, owner, claim, behind_marker))));
                }
                let began = self.clock.now_ms();
                match self.wait_for_credits(key, claim, waiting).await? {
                    Waited::Settled(answer) => Ok(answer),
                    Waited::OutOfTime { .. } => Ok(Some(refused(
                        RefusalCode::Timeout,
                        format!(
                            "entity {entity} kept pending credits in the way; waited {} ms for them, as long as the \
                             deadline allows",
                            self.clock.now_ms().saturating_sub(began)
                        ),
                    ))),
                    _ => Ok(None),
                }
            }
            LockFailure::Held { owner, started_at, entity } => {
                if !waiting.may_wait_for(&owner, started_at) {
                    // Wait-die: the younger one yields at once, and says to whom (its retry starts there), unless
                    // the owner is decided or held (read first, below).
                    if let Some(settled) = self.settle_owner(&owner, key, &entity).await? {
                        return Ok(settled);
                    }
                    return Ok(Some(blocked(&owner, locked_by(&entity, &owner))));
                }
                let began = self.clock.now_ms();
                let last_owner = match self.wait_for_release(key, &entity, owner, waiting).await? {
                    Waited::Released => return Ok(None),
                    Waited::Settled(answer) => return Ok(answer),
                    Waited::OutOfTime { owner } => owner,
                };
                Ok(Some(refused(
                    RefusalCode::Timeout,
                    format!(
                        "{}; waited {} ms for it, as long as the deadline allows",
                        locked_by(&entity, &last_owner),
                        self.clock.now_ms().saturating_sub(began)
                    ),
                )))
            }
            LockFailure::Ours { .. } | LockFailure::Unexplained => {
                self.backoff(attempt, waiting.cutoff).await;
                Ok(None)
            }
        }
    }

    /// What a live lock's owner's record says, read only. Decided already (a late prepare's stray lock, or
    /// one whose second phase is in flight): settled now, as lock resolution would after its expiry (its
    /// owner can never need it again, and it would refuse every younger transaction until then); the
    /// answer is `Some(None)`, try again. Held for its caller's decision (outside the bound): refused
    /// CONFLICT at once whatever the age. Undecided or without a record: `None`, left alone.
    async fn settle_owner(
        &self,
        owner: &str,
        key: &Item,
        entity: &str,
    ) -> Result<Option<Option<ParticipantResponse>>, ParticipantError> {
        match self.transactions.get(owner).await?.map(|r| r.status) {
            None | Some(Status::Preparing) => Ok(None),
            Some(Status::Prepared) => {
                Ok(Some(Some(blocked(owner, format!("{}, held for its caller's decision", locked_by(entity, owner))))))
            }
            Some(_) => Ok(Some(self.resolve(owner, key, Holding::Lock).await?)),
        }
    }

    /// A transaction that may wait for `owner`'s lock on `key` (older, or holding nothing): polls the item
    /// until the lock is no longer `owner`'s (released, or expired and resolvable: the next attempt resolves
    /// it). A lock that passed to another live holder this transaction may wait for is waited for in turn,
    /// without a lock write that could only fail: when a hot lock is released every waiter's poll sees it,
    /// and all but the first to write would lose the race. After a few polls with the same holder its record
    /// is read once ([`Participant::settle_owner`]): a decided or held owner is not waited for. `OutOfTime`
    /// once the wait budget is spent, with the holder it waited for last.
    async fn wait_for_release(
        &self,
        key: &Item,
        entity: &str,
        mut owner: String,
        waiting: &Waiting<'_>,
    ) -> Result<Waited, ParticipantError> {
        let mut polls = 0;
        let mut polls_of_owner = 0;
        while let Some(pause) = waiting.pause(polls, self.clock.now_ms()) {
            tokio::time::sleep(pause).await;
            polls += 1;
            polls_of_owner += 1;
            if polls_of_owner == OWNER_CHECK_AFTER_POLLS
                && let Some(answer) = self.settle_owner(&owner, key, entity).await?
            {
                return Ok(Waited::Settled(answer));
            }
            let item = self.table.get(key).await?;
            let now = self.clock.now_ms();
            match item.as_ref().and_then(Lock::of) {
                Some(lock)
                    if now <= crate::clock::resolvable_after(lock.expires_at) && lock.transaction_id == owner => {}
                Some(lock)
                    if now <= crate::clock::resolvable_after(lock.expires_at)
                        && lock.transaction_id != waiting.tx
                        && waiting.may_wait_for(&lock.transaction_id, lock.started_at) =>
                {
                    owner = lock.transaction_id;
                    polls_of_owner = 0;
                }
                _ => {
                    waiting.waits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Ok(Waited::Released);
                }
            }
        }
        Ok(Waited::OutOfTime { owner })
    }

    /// Waits until the pending credits no longer keep `claim` off the item ([`Claim::clear_of_credits`]), or a
    /// lock or an expired entry there asks for the next attempt to classify it. An exclusive lock that waits
    /// leaves its marker first: new credits queue behind it, so that a stream of them cannot starve it.
    async fn wait_for_credits(
        &self,
        key: &Item,
        claim: Claim,
        waiting: &Waiting<'_>,
    ) -> Result<Waited, ParticipantError> {
        self.mark(key, claim, waiting).await?;
        let mut polls = 0;
        while let Some(pause) = waiting.pause(polls, self.clock.now_ms()) {
            tokio::time::sleep(pause).await;
            polls += 1;
            let Some(item) = self.table.get(key).await? else { return Ok(Waited::Released) };
            let now = self.clock.now_ms();
            let entries = Credit::all(&item);
            let clear = Lock::of(&item).is_some()
                || claim.clear_of_credits(waiting.tx, &item, now)
                || entries.iter().any(|c| now > crate::clock::resolvable_after(c.expires_at));
            if clear {
                waiting.waits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Ok(Waited::Released);
            }
            // Its marker may have been removed (another's lock or one-phase write took the item meanwhile):
            // left again, so that new credits keep queueing behind this wait.
            if credits::Drain::of(&item)
                .is_none_or(|d| d.transaction_id != waiting.tx && !d.holds_back(waiting.tx, now))
            {
                self.mark(key, claim, waiting).await?;
            }
            // An entry (or a marker) written since the wait began may belong to one it may not wait for: the
            // order is checked again at every look, as the first one was.
            let entity = Value::Object(crate::attr::item_to_json(key)).to_string();
            let marker = credits::Drain::of(&item).filter(|d| d.holds_back(waiting.tx, now));
            if let (Claim::Entry, Some(marker)) = (claim, marker) {
                let why = credits_block(&entity, &marker.transaction_id, claim, true);
                return Ok(Waited::Settled(Some(blocked(&marker.transaction_id, why))));
            }
            if let Some(entry) = entries.iter().find(|c| !waiting.may_wait_for(&c.transaction_id, c.started_at)) {
                let why = credits_block(&entity, &entry.transaction_id, claim, false);
                return Ok(Waited::Settled(Some(blocked(&entry.transaction_id, why))));
            }
        }
        Ok(Waited::OutOfTime { owner: String::new() })
    }

    /// Leaves this wait's drain marker on the item, for a claim that waits for the credits to drain (new
    /// credits queue behind it). The key is kept first: a write whose reply was lost may have landed.
    async fn mark(&self, key: &Item, claim: Claim, waiting: &Waiting<'_>) -> Result<(), ParticipantError> {
        if !matches!(claim, Claim::Lock { drains: true } | Claim::Read) {
            return Ok(());
        }
        {
            let mut marked = waiting.marked.lock().unwrap_or_else(|e| e.into_inner());
            if !marked.contains(key) {
                marked.push(key.clone());
            }
        }
        let started_at = waiting.started_at.unwrap_or(0);
        self.table.mark_drain(waiting.tx, key, started_at, waiting.until, self.clock.now_ms()).await?;
        Ok(())
    }

    /// A participant that only checks locks nothing: it votes on what it reads now and takes no part
    /// in the second phase. Its guarantee is that the checks held at the moment of prepare.
    async fn prepare_read_only(
        &self,
        tx: &str,
        order: Order,
        principal: Option<&str>,
        operations: &[Operation],
        keys: &[Item],
    ) -> Result<ParticipantResponse, ParticipantError> {
        let waiting = Waiting::new(tx, order, self.clock.now_ms(), self.max_lock_wait_ms);
        let answer: Result<ParticipantResponse, ParticipantError> = async {
            while let Some(attempt) = waiting.next_attempt() {
                if let Some(late) =
                    waiting.cutoff.passed(self.clock.now_ms(), "the checked items could not be read before")
                {
                    return Ok(late);
                }
                let items = try_join_all(keys.iter().map(|key| self.table.get(key))).await?;
                let now = self.clock.now_ms();
                let failure = operations
                    .iter()
                    .zip(&items)
                    .zip(keys)
                    .find_map(|((op, item), key)| check_holds(tx, op, item.as_ref(), now).err().map(|f| (f, key)));
                let Some((failure, key)) = failure else {
                    // The service's rules judge what was read (nothing is locked: a check holds when it is read).
                    for (op, item) in operations.iter().zip(&items) {
                        if let Some(refusal) = self.rule_refusal(tx, principal, op, item.as_ref()) {
                            return Ok(refusal);
                        }
                    }
                    return Ok(ParticipantResponse {
                        vote: Some(Vote::Prepared),
                        read_only: true,
                        ..Default::default()
                    });
                };
                if let Some(refusal) = self.settle(failure, key, &waiting, attempt).await? {
                    return Ok(refusal);
                }
            }
            Ok(refused(RefusalCode::Conflict, "the checked items kept changing".to_owned()))
        }
        .await;
        // A check locks nothing: a marker its wait left is removed whatever it answers.
        self.clear_markers(tx, &waiting, false).await;
        answer
    }

    /// The service's rules and own operations on the items as they are now: a refusal, or the work to lock
    /// (each custom operation with the data it computed) and what each item was seen at (the lock write's
    /// condition). Without rules or custom operations nothing is read and nothing is conditioned. An item
    /// another transaction holds is not judged: that lock is resolved or waited for as always, and the next
    /// attempt judges again.
    /// One attempt's judgement: answered (a refusal, or what a lock met on the way decided), to be tried
    /// again (the lock it met is to be waited for), or ready to write.
    async fn judge_attempt(
        &self,
        tx: &str,
        principal: Option<&str>,
        work: &[(Operation, Item)],
        waiting: &Waiting<'_>,
        attempt: u32,
    ) -> Result<Attempt, ParticipantError> {
        Ok(match self.judge(tx, principal, work).await? {
            Judged::Refused(refusal) => Attempt::Answered(refusal),
            Judged::Locked(index, item) => {
                match self.after_lock_failure(tx, work, vec![(index, item)], waiting, attempt).await? {
                    Some(answer) => Attempt::Answered(answer),
                    None => Attempt::Again,
                }
            }
            Judged::Ready(ready, seen) => Attempt::Ready(ready, seen),
        })
    }

    async fn judge(&self, tx: &str, principal: Option<&str>, work: &[(Operation, Item)]) -> Result<Judged, StoreError> {
        let custom = work.iter().any(|(op, _)| matches!(op, Operation::Custom { .. }));
        if self.rules.is_none() && !custom {
            return Ok(Judged::Ready(work.to_vec(), vec![]));
        }
        let keys: Vec<Item> = work.iter().map(|(_, key)| key.clone()).collect();
        let items = match keys.as_slice() {
            [key] => self.table.get(key).await?.into_iter().collect(),
            _ => self.table.get_many(&keys).await?,
        };
        let mut seen = Vec::with_capacity(work.len());
        let mut ready = Vec::with_capacity(work.len());
        for (index, (op, key)) in work.iter().enumerate() {
            let item = find(&items, key);
            if item.and_then(Lock::of).is_some_and(|l| l.transaction_id != tx) {
                return Ok(Judged::Locked(index, item.cloned()));
            }
            if let Some(refusal) = self.rule_refusal(tx, principal, op, item) {
                return Ok(Judged::Refused(refusal));
            }
            let op = match op {
                Operation::Custom { kind, key: op_key, fields, .. } => {
                    let computed = match self.compute(tx, principal, op, item) {
                        Ok(computed) => computed,
                        Err(refusal) => return Ok(Judged::Refused(*refusal)),
                    };
                    Operation::Custom {
                        kind: kind.clone(),
                        key: op_key.clone(),
                        fields: fields.clone(),
                        computed: Some(computed),
                    }
                }
                op => op.clone(),
            };
            // Only what a rule or the operation itself judged is conditioned on the version it saw: on a hot
            // item, every credit's commit moves it.
            let judged = self.rules.is_some() || matches!(op, Operation::Custom { .. });
            seen.push(if judged { Seen::of(item) } else { Seen::Anything });
            ready.push((op, key.clone()));
        }
        Ok(Judged::Ready(ready, seen))
    }

    /// What one of the service's own operations makes of the item: its new data, or the refusal to vote.
    fn compute(
        &self,
        tx: &str,
        principal: Option<&str>,
        op: &Operation,
        item: Option<&Item>,
    ) -> Result<serde_json::Map<String, Value>, Box<ParticipantResponse>> {
        let Some(operations) = &self.operations else {
            return Err(Box::new(refused(
                RefusalCode::Invalid,
                format!("service {} has no operation \"{}\"", self.service, op.kind()),
            )));
        };
        let (data, version) = item_view(item);
        let prepared = Prepared {
            service: &self.service,
            transaction_id: tx,
            principal,
            operation: op,
            data: data.as_ref(),
            version,
        };
        operations.prepare(&prepared).map_err(|refusal| Box::new(operation_refused(refusal)))
    }

    /// The REFUSED vote of the first rule that refuses `op` on `item`, if any.
    fn rule_refusal(
        &self,
        tx: &str,
        principal: Option<&str>,
        op: &Operation,
        item: Option<&Item>,
    ) -> Option<ParticipantResponse> {
        let rules = self.rules.as_ref()?;
        let (data, version) = item_view(item);
        let prepared = Prepared {
            service: &self.service,
            transaction_id: tx,
            principal,
            operation: op,
            data: data.as_ref(),
            version,
        };
        rules.check(&prepared).err().map(rule_refused)
    }

    /// Resolves an expired lock (or pending credit) of `owner` on one item. `Some` is the refusal to give
    /// when the owner is still deciding; `None` means the item is free to try again.
    async fn resolve(
        &self,
        owner: &str,
        key: &Item,
        holding: Holding<'_>,
    ) -> Result<Option<ParticipantResponse>, ParticipantError> {
        let now = self.clock.now_ms();
        // Read only: a participant may not write another transaction's decision (issue 42).
        let fate = read_owner_fate(&self.transactions, owner, now).await?;
        warn!(owner, ?key, fate = fate_name(&fate), "resolving a lock (expired, or its owner decided)");
        match fate {
            OwnerFate::Expired => {
                return Ok(Some(ParticipantResponse {
                    unresolved_owner: Some(owner.to_owned()),
                    ..blocked(
                        owner,
                        format!(
                            "entity is locked by transaction {owner}, past its deadline and undecided; \
                             it is aborted by the coordinator or the sweeper, not by a participant"
                        ),
                    )
                }));
            }
            OwnerFate::Undecided => {
                return Ok(Some(blocked(
                    owner,
                    format!("entity is locked by transaction {owner}, which is still deciding"),
                )));
            }
            OwnerFate::Held(_) if matches!(holding, Holding::Credit(_)) => {
                return Ok(Some(blocked(
                    owner,
                    format!(
                        "entity has a pending credit of transaction {owner}, which is held for its caller's decision"
                    ),
                )));
            }
            OwnerFate::Held(record) => {
                // Its hold message may have been lost: the lock belongs at holdUntil, with the voted token.
                let token =
                    record.participants.iter().find(|p| p.service == self.service).and_then(|p| p.lock_token.clone());
                if let (Some(until), Some(token)) = (record.hold_until, token) {
                    self.table.extend_lock(owner, key, Some(&token), until).await?;
                }
                return Ok(Some(blocked(
                    owner,
                    format!("entity is locked by transaction {owner}, which is held for its caller's decision"),
                )));
            }
            OwnerFate::Abort | OwnerFate::Committed => match holding {
                Holding::Lock => {
                    self.table.release_any(owner, key, "lock resolution").await?;
                }
                Holding::Credit(token) => {
                    self.table.drop_credit(owner, key, Some(token)).await?;
                }
            },
            OwnerFate::Commit(record) if matches!(holding, Holding::Credit(_)) => {
                let Holding::Credit(token) = holding else { unreachable!() };
                // Applied only with the token its owner's record lists: a late prepare's entry is removed.
                let voted = record
                    .participants
                    .iter()
                    .find(|p| p.service == self.service)
                    .and_then(|p| p.lock_token.as_deref());
                match voted {
                    Some(voted) if voted == token => {
                        if self.table.commit_credit(owner, key, token, None).await?.is_none() {
                            self.table.commit_as_voted(owner, key, Some(token)).await?;
                        }
                    }
                    Some(_) => {
                        self.table.drop_credit(owner, key, Some(token)).await?;
                    }
                    // Only the voted token tells the entry from a late copy's: a record without it cannot.
                    None => {
                        return Err(ParticipantError::Unresolvable {
                            owner: owner.to_owned(),
                            detail: "its record keeps no token for a pending credit".to_owned(),
                        });
                    }
                }
            }
            OwnerFate::Commit(record) => {
                let entry = record.participants.iter().find(|p| p.service == self.service);
                let op = entry
                    .into_iter()
                    .flat_map(|p| p.operations.iter())
                    .find(|op| self.table.key(op.key()).as_ref() == Ok(key));
                // With the token the owner's record lists: a stray lock of a late prepare is released, not applied.
                let token = entry.and_then(|p| p.lock_token.as_deref());
                match op {
                    Some(op) => {
                        self.table.commit_item(owner, op, key, token).await?;
                    }
                    // What commits is the vote the lock keeps, not the record's list (which may have been
                    // changed after the vote): an item the record no longer lists is still rolled forward.
                    None => {
                        if self.table.commit_as_voted(owner, key, token).await?.is_none() {
                            return Err(ParticipantError::Unresolvable {
                                owner: owner.to_owned(),
                                detail: "its record does not list this item, and its lock keeps no vote".to_owned(),
                            });
                        }
                    }
                }
            }
        }
        Ok(None)
    }
}

/// Why pending credits (or a marker) keep a claim off `entity`, naming `owner`.
fn credits_block(entity: &str, owner: &str, claim: Claim, behind_marker: bool) -> String {
    match (claim, behind_marker) {
        (_, true) => format!("entity {entity} holds new credits back for transaction {owner}, which waits for them"),
        (Claim::Entry, false) => {
            format!("entity {entity} has as many pending credits as it takes, one of transaction {owner}")
        }
        _ => format!("entity {entity} has a pending credit of transaction {owner}"),
    }
}

/// What an expired owner holds on the item being resolved.
#[derive(Debug, Clone, Copy)]
enum Holding<'a> {
    Lock,
    /// A pending credit, with its token.
    Credit(&'a str),
}

/// What judging a prepare's items by the service's rules and own operations came to.
enum Attempt {
    Answered(ParticipantResponse),
    Again,
    Ready(Vec<(Operation, Item)>, Vec<Seen>),
}

enum Judged {
    Refused(ParticipantResponse),
    /// Another transaction's lock on the item of this operation (as the item was read).
    Locked(usize, Option<Item>),
    /// The work to lock (custom operations with what they computed), and what each item was seen at, for
    /// the lock write's condition (empty: no condition).
    Ready(Vec<(Operation, Item)>, Vec<Seen>),
}

/// Why `op`'s field could not hold its committed value with every pending credit to it (this prepare's own
/// entry is one of them; a lock's delta is not) applied, if it could not.
fn unrepresentable_with_credits(tx: &str, op: &Operation, item: &Item, token: &str) -> Option<String> {
    let Operation::Add { field, delta, .. } = op else { return None };
    let (current, pending) = credits::pending_on(item, field)?;
    if pending.is_empty() {
        return None;
    }
    let own = if credits::is_entry(op, Some(token)) { bigdecimal::BigDecimal::from(0) } else { delta.value().clone() };
    credits::unrepresentable_in_any_order(&current, &pending, &own)
        .map(|why| format!("{field} {current}, with {tx}'s {delta} and the credits pending on it: {why}"))
}

/// An item's committed data (as JSON) and version, for a rule or an operation to look at.
fn item_view(item: Option<&Item>) -> (Option<serde_json::Map<String, Value>>, Option<u64>) {
    let data = item.and_then(|i| crate::store::get_m(i, a::DATA)).map(crate::attr::item_to_json);
    let version = item.and_then(|i| crate::store::get_n(i, a::VERSION)).and_then(|v| v.parse().ok());
    (data, version)
}

fn fate_name(fate: &OwnerFate) -> &'static str {
    match fate {
        OwnerFate::Commit(_) => "roll forward",
        OwnerFate::Committed => "release (owner finished)",
        OwnerFate::Abort => "release (owner aborted)",
        OwnerFate::Undecided => "conflict (owner deciding)",
        OwnerFate::Held(_) => "conflict (owner held; its lock moved to holdUntil)",
        OwnerFate::Expired => "refused (owner expired undecided or unrecorded: the coordinator or the sweeper decides)",
    }
}
