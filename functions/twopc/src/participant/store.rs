//! The item store: a participant's data table, its item model (`data`, `version`, `lastTx`, `lock`,
//! `pending`) and the writes that lock, commit and release one item (built from what an operation does,
//! `super::operations`). The protocol and lock resolution both use these, so an item is rolled forward
//! by exactly the code that commits it.

use aws_sdk_dynamodb::Client;
use serde_json::Value;

use super::credits::{self, Credit};
use super::expressions::{
    LockSpec, Seen, commit_expressions, lock_expressions, lock_held_condition, release_names, voted_commit_expressions,
    voted_condition,
};
use super::operations::{Voted, apply, guard};
use crate::attr;
use crate::expr::{Expr, n};
use crate::model::{Key, Operation};
use crate::store::write::{Decided, Sending, Write, Written, conditional};
use crate::store::{Item, StoreError, get_m, get_n, get_s};
use crate::tables::item_attr as a;

/// Locks live this long when a prepare names no deadline.
pub const DEFAULT_LOCK_MS: u64 = 30_000;

/// The lock an item carries while prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    pub transaction_id: String,
    pub expires_at: u64,
    /// When the owner started, for wait-die (locks written before it existed order by expiry).
    pub started_at: u64,
    /// Names the prepare execution that took the lock: a commit applies only the lock its vote reported.
    pub token: Option<String>,
}

impl Lock {
    pub fn of(item: &Item) -> Option<Lock> {
        let lock = get_m(item, a::LOCK)?;
        let expires_at = get_n(lock, "expiresAt").and_then(|t| t.parse().ok()).unwrap_or(0);
        Some(Lock {
            transaction_id: get_s(lock, "transactionId")?.to_owned(),
            expires_at,
            started_at: get_n(lock, "startedAt").and_then(|t| t.parse().ok()).unwrap_or(expires_at),
            token: get_s(lock, "token").map(str::to_owned),
        })
    }
}

/// What a commit of one item found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    Applied,
    /// `lastTx` names the transaction: a re-delivered commit.
    AlreadyCommitted,
    /// Neither the voted lock of the transaction nor `lastTx` on the item. A lock of the transaction with
    /// another token (a late duplicate prepare's) was released on the way.
    NotPrepared {
        detail: String,
    },
}

#[derive(Debug, Clone)]
pub struct DataTable {
    client: Client,
    name: String,
}

impl DataTable {
    pub fn new(client: Client, name: impl Into<String>) -> DataTable {
        DataTable { client, name: name.into() }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The operation's key as the table's key, or why it does not fit the table.
    pub fn key(&self, key: &Key) -> Result<Item, String> {
        match key.get(a::KEY) {
            Some(Value::String(_)) if key.len() == 1 => Ok(attr::to_item(key)),
            _ => Err(format!(
                "key {} does not fit table {}: its key is one string attribute \"{}\"",
                Value::Object(key.clone()),
                self.name,
                a::KEY
            )),
        }
    }

    pub async fn get(&self, key: &Item) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.name)
            .set_key(Some(key.clone()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::new("GetItem", &self.name, e))?;
        Ok(out.item)
    }

    /// The write that locks one item, if the operation's precondition holds and no lock is there, and
    /// reserves what the commit will write (`pending`), so that an item the commit would push past
    /// DynamoDB's limits is refused now rather than failing at commit.
    fn lock_write(&self, spec: LockSpec<'_>, op: &Operation, key: Item, seen: Seen) -> Write {
        let (update, condition, e) = lock_expressions(spec, op, seen);
        Write::update(&self.name, key, update, condition, e)
    }

    /// Locks every item of `ops`, all or none. Sent once: the caller retries with a new token (see
    /// `Participant::prepare`), because an SDK retry re-sends the same token, and a copy landing late with
    /// the voted token could lock the item again after it was committed and changed. A failed condition names every item whose
    /// condition failed, with the item as it was when the endpoint returns it. With a `timeout`, no answer
    /// by then is a failure (the write may still have taken effect: the caller's next attempt finds out).
    pub async fn lock_all(
        &self,
        spec: LockSpec<'_>,
        ops: &[(Operation, Item)],
        timeout: Option<std::time::Duration>,
        seen: &[Seen],
    ) -> Result<LockAttempt, StoreError> {
        let seen_at = |i: usize| seen.get(i).copied().unwrap_or(Seen::Anything);
        let writes =
            ops.iter().enumerate().map(|(i, (op, key))| self.lock_write(spec, op, key.clone(), seen_at(i))).collect();
        let sending = Sending::default().once(timeout).returning_new();
        Ok(match conditional(&self.client, writes, sending).await? {
            Written::Applied(locked) => LockAttempt::Locked(locked.into_iter().collect()),
            Written::Refused(refused) => {
                LockAttempt::ConditionFailed(refused.into_iter().map(|r| (r.index, r.item)).collect())
            }
            Written::Contention(_) => LockAttempt::Contention,
            Written::Unstorable { reason, .. } => LockAttempt::Unstorable(unstorable(&reason)),
        })
    }

    /// Keys of items whose lock expired before `now_ms`, through the sparse locks index (no scan): at most
    /// `limit` from each shard.
    pub async fn expired_locks(&self, now_ms: u64, limit: i32) -> Result<Vec<Item>, StoreError> {
        let locks = crate::store::ShardedIndex {
            table: &self.name,
            index: crate::tables::LOCKS_INDEX,
            shard_attr: a::LOCK_SHARD,
            prefix: "lock",
            sort_attr: a::LOCK_EXPIRES_AT,
        };
        let entries = locks.due_before(&self.client, now_ms, limit).await?;
        Ok(entries
            .iter()
            .filter_map(|item| item.get(a::KEY).map(|k| Item::from([(a::KEY.to_owned(), k.clone())])))
            .collect())
    }

    /// Reads several items consistently ([`crate::store::batch_get`]).
    pub async fn get_many(&self, keys: &[Item]) -> Result<Vec<Item>, StoreError> {
        crate::store::batch_get(&self.client, &self.name, keys, true).await
    }

    /// The one-phase commit of a transaction with a single writing participant: every operation applied
    /// under its guard, and the transaction record created as COMMITTED, in one TransactWriteItems. It
    /// all happens or none of it does, so there is never a lock to resolve nor an open record to sweep;
    /// and a record written first by anyone else (an abort after a lost reply, a duplicate) cancels it.
    pub async fn apply_one_phase(
        &self,
        tx: &str,
        ops: &[(Operation, Item)],
        record_table: &str,
        record: Item,
        seen: &[Seen],
        rules: bool,
    ) -> Result<OnePhase, StoreError> {
        let mut writes = Vec::with_capacity(ops.len() + 1);
        for (i, (op, key)) in ops.iter().enumerate() {
            let mut e = Expr::new();
            let lock = e.name(a::LOCK);
            let unchanged = seen.get(i).copied().unwrap_or(Seen::Anything).condition(&mut e);
            let mut condition = format!("attribute_not_exists({lock}){}{unchanged}", guard(&mut e, op));
            // As its lock would: what reads or replaces the item waits for the pending credits (the marker
            // it left while it waited is removed after, its own only).
            if credits::drains(op, rules) {
                condition += &credits::drained_condition(&mut e);
            }
            let key = key.clone();
            writes.push(match op {
                Operation::Delete { .. } => Write::delete(&self.name, key, condition, e),
                Operation::Check { .. } => Write::check(&self.name, key, condition, e),
                _ => {
                    let sets = apply(&mut e, op, tx);
                    Write::update(&self.name, key, format!("SET {sets}"), condition, e)
                }
            });
        }
        let mut e = Expr::new();
        let id = e.name(crate::tables::tx_attr::ID);
        writes.push(Write::put(record_table, record, format!("attribute_not_exists({id})"), e));
        Ok(match conditional(&self.client, writes, Sending::default()).await? {
            Written::Applied(_) => OnePhase::Committed,
            Written::Refused(refused) if refused.iter().any(|r| r.index == ops.len()) => OnePhase::RecordExists,
            Written::Refused(mut refused) => {
                let first = refused.swap_remove(0);
                OnePhase::ConditionFailed { index: first.index, item: first.item }
            }
            // A result DynamoDB cannot store shows as a validation failure of that item: no item was prepared,
            // so DynamoDB's own words say it.
            Written::Unstorable { reason, .. } => OnePhase::Unstorable(reason),
            Written::Contention(_) => OnePhase::Contention,
        })
    }

    /// Applies what the prepare voted for the item and releases the lock, in one conditional write, if the
    /// item holds the lock `token` names (the one the participant's vote reported). Without a token (a
    /// message from before tokens existed) any lock of `tx` on an item it has not committed yet will do.
    ///
    /// `op` is what the message (or the record, for a roll-forward) says; what is applied is the vote kept
    /// in the lock ([`Voted`]). When they agree, one write; when they differ (a record rewritten after the
    /// vote, a forged message), the refused write returns the item and the vote is applied from it. A lock
    /// taken before votes were kept commits `op`, as it did then (such locks last at most a hold, 24 h).
    pub async fn commit_item(
        &self,
        tx: &str,
        op: &Operation,
        key: &Item,
        token: Option<&str>,
    ) -> Result<CommitOutcome, StoreError> {
        // What commits is what the item holds for the vote, entry or lock, whatever the message says: the
        // message's operation only picks which write is tried first.
        if let (true, Some(token), Operation::Add { field, delta, .. }) = (credits::is_entry(op, token), token, op) {
            // None: a lock of this vote instead; the lock's path below applies it.
            if let Some(outcome) = self.commit_credit(tx, key, token, Some((field, &delta.to_string()))).await? {
                return Ok(outcome);
            }
        }
        let said = Voted::of(op);
        let item = match self.commit_voted(tx, &said, &said.text(), key, token).await? {
            None => return Ok(CommitOutcome::Applied),
            Some(item) => item,
        };
        let ours = item
            .as_ref()
            .and_then(Lock::of)
            .is_some_and(|l| l.transaction_id == tx && (token.is_none() || l.token.as_deref() == token));
        let last = match item.as_ref().filter(|_| ours).map(Voted::of_lock) {
            Some(Some(Ok((voted, kept)))) => {
                if voted != said {
                    tracing::warn!(said = %said.text(), voted = %kept, "commit names another operation than the vote: applying the vote");
                }
                let refused = self.commit_voted(tx, &voted, &kept, key, token).await?;
                if refused.as_ref().is_some_and(|item| self.holds_vote(tx, token, item.as_ref(), &kept)) {
                    // Our lock, its vote as read, and still refused: never release it as a stray, nor
                    // answer as if nothing were prepared (the transaction would end with its vote unapplied).
                    return Err(self.unappliable(tx, "the write of the lock's own vote was refused"));
                }
                refused
            }
            // Applying the message instead would be applying what nobody voted for; answering NOT_PREPARED
            // would end the transaction with this item unapplied. An error leaves it COMMITTING, visible.
            Some(Some(Err(unreadable))) => return Err(self.unappliable(tx, &unreadable)),
            Some(None) => self.commit_legacy(tx, op, key, token).await?,
            None => Some(item),
        };
        let item = match last {
            None => return Ok(CommitOutcome::Applied),
            Some(item) => item,
        };
        let outcome = commit_outcome(tx, token, item.as_ref());
        // The vote was a pending credit (the message names another operation): its entry, with this token.
        // Without a token (a record that keeps no votes) an entry is never applied: only its token tells the
        // voted entry from a late copy's, and `lastTx` proves nothing for credits.
        if let (CommitOutcome::NotPrepared { .. }, Some(entry)) =
            (&outcome, item.as_ref().and_then(|item| Credit::of(item, tx)))
        {
            return match token {
                Some(token) if entry.token == token => {
                    Ok(self.commit_credit(tx, key, token, None).await?.unwrap_or(CommitOutcome::AlreadyCommitted))
                }
                // A late copy's entry: removed, never applied.
                Some(_) => {
                    self.drop_credit(tx, key, Some(&entry.token)).await?;
                    Ok(outcome)
                }
                None => Err(self.unappliable(tx, "a commit without a token cannot tell its pending credit's vote")),
            };
        }
        if let (CommitOutcome::NotPrepared { .. }, Some(stray)) = (&outcome, item.as_ref().and_then(Lock::of))
            && stray.transaction_id == tx
            && token.is_some()
            && stray.token.as_deref() != token
        {
            // The voted lock is gone, so it was committed (only a commit removes the lock of a transaction
            // decided to commit); this one was taken afterwards by a late duplicate prepare.
            self.release(tx, key, stray.token.as_deref(), "stray lock of a late prepare").await?;
        }
        Ok(outcome)
    }

    /// Applies `tx`'s pending credit with the voted `token` and removes it, in one conditional write. `said`
    /// is the field and delta the message names (None: a resolver's roll-forward, which reads the entry);
    /// what is applied is the entry's own (its vote). No entry of `tx` means it was applied already: only
    /// its commit removes the entry of a transaction decided to commit (`lastTx`, which other credits'
    /// commits overwrite, proves nothing here). An entry with another token is a late prepare's: removed.
    ///
    /// None: no entry of `tx`, but a lock of `tx` with this token (the vote was the lock's): commit that.
    pub async fn commit_credit(
        &self,
        tx: &str,
        key: &Item,
        token: &str,
        said: Option<(&str, &str)>,
    ) -> Result<Option<CommitOutcome>, StoreError> {
        let mut item = None;
        if let Some((field, delta)) = said {
            let (update, condition, e) = credits::entry_commit_expressions(tx, token, field, delta);
            item = match self.update_or_delete(key, Some(update), condition, e).await? {
                None => return Ok(Some(CommitOutcome::Applied)),
                Some(returned) => returned,
            };
        }
        let item = match item {
            Some(item) => Some(item),
            None => self.get(key).await?,
        };
        let Some(entry) = item.as_ref().and_then(|item| Credit::of(item, tx)) else {
            let lock = item.as_ref().and_then(Lock::of);
            if lock.is_some_and(|l| l.transaction_id == tx && l.token.as_deref() == Some(token)) {
                return Ok(None);
            }
            return Ok(Some(CommitOutcome::AlreadyCommitted));
        };
        if entry.token != token {
            self.drop_credit(tx, key, Some(&entry.token)).await?;
            return Ok(Some(CommitOutcome::AlreadyCommitted));
        }
        if said.is_some() {
            tracing::warn!(field = %entry.field, delta = %entry.delta, "commit names another credit than the vote: applying the vote");
        }
        let (update, condition, e) = credits::entry_commit_expressions(tx, token, &entry.field, &entry.delta);
        match self.update_or_delete(key, Some(update), condition, e).await? {
            None => Ok(Some(CommitOutcome::Applied)),
            Some(returned) => {
                let item = match returned {
                    Some(item) => Some(item),
                    None => self.get(key).await?,
                };
                match item.as_ref().and_then(|item| Credit::of(item, tx)) {
                    // Gone in between: another delivery of the commit applied it.
                    None => Ok(Some(CommitOutcome::AlreadyCommitted)),
                    Some(_) => Err(self.unappliable(tx, "the write of the credit's own entry was refused")),
                }
            }
        }
    }

    /// Removes `tx`'s pending credit (the one `token` names, when given) unapplied. None: removed; Some:
    /// no such entry, with the item as it was when the endpoint returns it.
    pub async fn drop_credit(
        &self,
        tx: &str,
        key: &Item,
        token: Option<&str>,
    ) -> Result<Option<Option<Item>>, StoreError> {
        let (update, condition, e) = credits::entry_drop_expressions(tx, token);
        self.update_or_delete(key, Some(update), condition, e).await
    }

    /// Leaves `tx`'s marker on the item: new credits wait until the pending ones drained, or `until`.
    /// Returns whether it was written (not if a lock is there, or another transaction's marker holds).
    pub async fn mark_drain(
        &self,
        tx: &str,
        key: &Item,
        started_at: u64,
        until: u64,
        now: u64,
    ) -> Result<bool, StoreError> {
        let (update, condition, e) = credits::drain_expressions(tx, started_at, until, now);
        Ok(self.update_or_delete(key, Some(update), condition, e).await?.is_none())
    }

    /// Removes `tx`'s drain marker from the item, if it is still there.
    pub async fn clear_drain(&self, tx: &str, key: &Item) -> Result<(), StoreError> {
        let mut e = Expr::new();
        let marker = e.name(a::DRAIN);
        let owner = e.path(&[a::DRAIN, "transactionId"]);
        let condition = format!("{owner} = {}", e.value(crate::expr::s(tx)));
        self.update_or_delete(key, Some(format!("REMOVE {marker}")), condition, e).await?;
        Ok(())
    }

    /// Whether `item` still holds `tx`'s lock (the one `token` names) keeping the vote `kept`.
    fn holds_vote(&self, tx: &str, token: Option<&str>, item: Option<&Item>, kept: &str) -> bool {
        item.is_some_and(|item| {
            Lock::of(item).is_some_and(|l| l.transaction_id == tx && (token.is_none() || l.token.as_deref() == token))
                && matches!(Voted::of_lock(item), Some(Ok((_, text))) if text == kept)
        })
    }

    fn unappliable(&self, tx: &str, why: &str) -> StoreError {
        StoreError::internal("UpdateItem", &self.name, format!("the vote of {tx}'s lock cannot be applied: {why}"))
    }

    /// Applies the vote the item's own lock keeps (a roll-forward of an item its owner's record does not
    /// list: the record may have been changed after the vote; the lock was not). None: no lock of `tx` with
    /// a readable vote is there.
    pub async fn commit_as_voted(
        &self,
        tx: &str,
        key: &Item,
        token: Option<&str>,
    ) -> Result<Option<CommitOutcome>, StoreError> {
        let Some(item) = self.get(key).await? else { return Ok(None) };
        let Some(lock) = Lock::of(&item).filter(|l| l.transaction_id == tx) else { return Ok(None) };
        let Some(Ok((voted, kept))) = Voted::of_lock(&item) else { return Ok(None) };
        let token = token.or(lock.token.as_deref());
        Ok(Some(match self.commit_voted(tx, &voted, &kept, key, token).await? {
            None => CommitOutcome::Applied,
            Some(item) => commit_outcome(tx, token, item.as_ref()),
        }))
    }

    /// The commit write of `voted`, conditioned on the lock keeping that very vote (`kept`: its text as the
    /// lock holds it). None: written; Some: the
    /// condition failed, with the item as it was (read if the endpoint did not return it).
    async fn commit_voted(
        &self,
        tx: &str,
        voted: &Voted,
        kept: &str,
        key: &Item,
        token: Option<&str>,
    ) -> Result<Option<Option<Item>>, StoreError> {
        let (update, condition, e) = voted_commit_expressions(tx, token, voted, kept);
        let returned = match voted {
            // A check changes nothing: releasing the lock (and a placeholder the prepare made) is its commit.
            Voted::Check => {
                return match self.release_if(tx, key, token, "commit", Some(kept), false).await? {
                    true => Ok(None),
                    false => Ok(Some(self.get(key).await?)),
                };
            }
            _ => match self.update_or_delete(key, update, condition, e).await? {
                None => return Ok(None),
                Some(returned) => returned,
            },
        };
        // The endpoint may not return the item (DynamoDB Local before 2.x did not): read it.
        Ok(Some(match returned {
            Some(item) => Some(item),
            None => self.get(key).await?,
        }))
    }

    /// The commit of a lock taken before votes were kept: `op` as the message says, on a lock without one.
    async fn commit_legacy(
        &self,
        tx: &str,
        op: &Operation,
        key: &Item,
        token: Option<&str>,
    ) -> Result<Option<Option<Item>>, StoreError> {
        if let Operation::Check { .. } = op {
            return match self.release(tx, key, token, "commit").await? {
                true => Ok(None),
                false => Ok(Some(self.get(key).await?)),
            };
        }
        let (update, condition, mut e) = commit_expressions(tx, token, op);
        let no_vote = format!("{condition} AND attribute_not_exists({})", e.path(&[a::LOCK, a::LOCK_VOTED]));
        Ok(match self.update_or_delete(key, update, no_vote, e).await? {
            None => None,
            Some(Some(item)) => Some(Some(item)),
            Some(None) => Some(self.get(key).await?),
        })
    }

    /// Moves the expiry of `tx`'s lock on the item (the one `token` names, when given) to `until`, in the
    /// lock and in the locks index, if it is earlier: a held transaction's locks expire at its `holdUntil`.
    /// Returns whether the lock was there.
    pub async fn extend_lock(&self, tx: &str, key: &Item, token: Option<&str>, until: u64) -> Result<bool, StoreError> {
        let mut e = Expr::new();
        let held = lock_held_condition(&mut e, tx, token);
        let expires = e.path(&[a::LOCK, "expiresAt"]);
        let index = e.name(a::LOCK_EXPIRES_AT);
        let due = e.value(n(until));
        let update = format!("SET {expires} = {due}, {index} = {due}");
        let write = Write::update(&self.name, key.clone(), update, format!("{held} AND {expires} < {due}"), e);
        let refused = match conditional(&self.client, vec![write], Sending::default()).await? {
            Written::Applied(_) => return Ok(true),
            Written::Refused(refused) => refused.into_iter().next().and_then(|r| r.item),
            Written::Unstorable { .. } => return Ok(false),
            Written::Contention(error) => return Err(error),
        };
        // Classified from the item as it was: extended already (a repeated hold), or not ours.
        let item = match refused {
            Some(item) => Some(item),
            None => self.get(key).await?,
        };
        Ok(item.as_ref().and_then(Lock::of).is_some_and(|l| {
            l.transaction_id == tx && (token.is_none() || l.token.as_deref() == token) && l.expires_at >= until
        }))
    }

    /// One conditional write of an item: `update`, or a delete when there is none. None: written; Some:
    /// refused by its condition, with the item as it was when the endpoint returns it.
    async fn update_or_delete(
        &self,
        key: &Item,
        update: Option<String>,
        condition: String,
        e: Expr,
    ) -> Result<Option<Option<Item>>, StoreError> {
        let write = match update {
            Some(update) => Write::update(&self.name, key.clone(), update, condition, e),
            None => Write::delete(&self.name, key.clone(), condition, e),
        };
        Ok(match conditional(&self.client, vec![write], Sending::default()).await?.decided()? {
            Decided::Applied(_) => None,
            refused => Some(refused.refused_item()),
        })
    }

    /// Releases `tx`'s lock on the item, if it holds one (with `token`, when given): a placeholder made by
    /// the prepare goes away with it. Returns whether a lock was released. A key DynamoDB refuses (too
    /// long to ever have been stored) holds nothing.
    pub async fn release(
        &self,
        tx: &str,
        key: &Item,
        token: Option<&str>,
        why: &'static str,
    ) -> Result<bool, StoreError> {
        self.release_if(tx, key, token, why, None, false).await
    }

    /// [`DataTable::release`], or where the item holds no lock of `tx` but its pending credit (a vote the
    /// message did not name as a credit), that entry removed unapplied: an abort, and lock resolution of an
    /// owner that ended.
    pub async fn release_any(&self, tx: &str, key: &Item, why: &'static str) -> Result<bool, StoreError> {
        self.release_if(tx, key, None, why, None, true).await
    }

    /// [`DataTable::release`], and with `kept`, only a lock that keeps that vote (a check's commit).
    async fn release_if(
        &self,
        tx: &str,
        key: &Item,
        token: Option<&str>,
        why: &'static str,
        kept: Option<&str>,
        entry_too: bool,
    ) -> Result<bool, StoreError> {
        let mut e = Expr::new();
        let mut held = lock_held_condition(&mut e, tx, token);
        if let Some(kept) = kept {
            held += &voted_condition(&mut e, kept);
        }
        let version = e.name(a::VERSION);
        let data = e.name(a::DATA);
        let release = format!("REMOVE {}", release_names(&mut e));
        let condition = format!("{held} AND (attribute_exists({version}) OR attribute_exists({data}))");
        let write = Write::update(&self.name, key.clone(), release, condition, e);
        let returned = match conditional(&self.client, vec![write], Sending::default()).await? {
            Written::Applied(_) => return Ok(true),
            Written::Refused(refused) => refused.into_iter().next().and_then(|r| r.item),
            Written::Unstorable { reason, .. } => {
                tracing::warn!(why, reason = %unstorable(&reason), "key cannot be stored, so it holds no lock");
                return Ok(false);
            }
            Written::Contention(error) => return Err(error),
        };
        let item = match returned {
            Some(item) => Some(item),
            None => self.get(key).await?,
        };
        let Some(item) = item else { return Ok(false) };
        // No lock of `tx`, but its pending credit (a vote the message did not name as a credit): released the
        // same way, unapplied.
        if entry_too && Lock::of(&item).is_none_or(|l| l.transaction_id != tx) && Credit::of(&item, tx).is_some() {
            return Ok(self.drop_credit(tx, key, None).await?.is_none());
        }
        let ours =
            Lock::of(&item).is_some_and(|l| l.transaction_id == tx && (token.is_none() || l.token.as_deref() == token));
        let keeps_vote = kept.is_none_or(|kept| matches!(Voted::of_lock(&item), Some(Ok((_, text))) if text == kept));
        if !ours || !keeps_vote {
            return Ok(false);
        }
        // Our lock on a placeholder: the key did not exist before this transaction, so neither does it after.
        let mut e = Expr::new();
        let mut held = lock_held_condition(&mut e, tx, token);
        if let Some(kept) = kept {
            held += &voted_condition(&mut e, kept);
        }
        let data = e.name(a::DATA);
        let placeholder = Write::delete(&self.name, key.clone(), format!("{held} AND attribute_not_exists({data})"), e);
        let deleted = conditional(&self.client, vec![placeholder], Sending::default()).await?.decided()?.applied();
        if !deleted {
            tracing::debug!(why, "placeholder changed while releasing; nothing left to release");
        }
        Ok(deleted)
    }
}

#[derive(Debug)]
pub enum OnePhase {
    Committed,
    /// The transaction's record exists already: a duplicate request, or an abort written after a lost reply.
    RecordExists,
    ConditionFailed {
        index: usize,
        item: Option<Item>,
    },
    Contention,
    /// DynamoDB refused a value (an `add` whose result has more than 38 digits).
    Unstorable(String),
}

#[derive(Debug)]
pub enum LockAttempt {
    /// Locked; with the items as locked when the write returned them (a single item).
    Locked(Vec<Item>),
    /// Every item whose condition failed (its index in the request), as it was when the endpoint returns it.
    ConditionFailed(Vec<(usize, Option<Item>)>),
    Contention,
    /// DynamoDB refused to store the prepared item (it would pass 400 KB, or a result is out of range).
    Unstorable(String),
}

fn commit_outcome(tx: &str, token: Option<&str>, item: Option<&Item>) -> CommitOutcome {
    let Some(item) = item else {
        return CommitOutcome::NotPrepared { detail: "the item does not exist".to_owned() };
    };
    if get_s(item, a::LAST_TX) == Some(tx) {
        return CommitOutcome::AlreadyCommitted;
    }
    let holder = Lock::of(item).map(|l| match l.token {
        Some(other) if l.transaction_id == tx && token.is_some() => {
            format!("{tx} (a late prepare's, token {other}, released)")
        }
        _ => l.transaction_id,
    });
    CommitOutcome::NotPrepared {
        detail: format!(
            "the item holds {} and its lastTx is {}",
            holder.map_or("no lock".to_owned(), |t| format!("a lock of {t}")),
            get_s(item, a::LAST_TX).unwrap_or("unset")
        ),
    }
}

/// The item of `key` among `items`.
pub fn find<'a>(items: &'a [Item], key: &Item) -> Option<&'a Item> {
    items.iter().find(|item| key.iter().all(|(name, value)| item.get(name) == Some(value)))
}

/// Why DynamoDB refused the prepared item, for the vote.
fn unstorable(reason: &str) -> String {
    format!("DynamoDB refused the prepared item (at most 400 KB, counting what the commit will write): {reason}")
}
