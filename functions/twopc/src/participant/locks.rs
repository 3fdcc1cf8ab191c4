//! Wait-die between transactions on one item: the order of two transactions, how long an older one
//! waits for a younger one's lock, and why a lock could not be taken, decided from the item as it was.

use std::time::Duration;

use super::answers::refused;
use super::credits;
use super::operations;
use super::store::Lock;
use crate::clock::CLOCK_MARGIN_MS;
use crate::model::{Operation, ParticipantResponse, RefusalCode};
use crate::store::{Item, get_s};
use crate::tables::item_attr as a;

/// Attempts at taking the locks when something changes underneath (an expired lock resolved, contention,
/// a wait for a younger transaction's lock).
pub(super) const LOCK_ATTEMPTS: u32 = 12;

/// The last moment a participant may write for a transaction: its deadline and the clock margin
/// ([`crate::clock::lock_cutoff`]); none for a message that names no deadline.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cutoff(pub(super) Option<u64>);

impl Cutoff {
    pub(super) fn of(order: Order) -> Cutoff {
        Cutoff::of_deadline(order.deadline)
    }

    /// A message's cutoff: its deadline and the clock margin (none without a deadline).
    pub(super) fn of_deadline(deadline: Option<u64>) -> Cutoff {
        Cutoff(deadline.map(crate::clock::lock_cutoff))
    }

    /// The TIMEOUT refusal to answer if `now_ms` is past the cutoff; `what` says what came too late.
    pub(super) fn passed(self, now_ms: u64, what: &str) -> Option<ParticipantResponse> {
        let cutoff = self.0?;
        (now_ms > cutoff).then(|| {
            refused(
                RefusalCode::Timeout,
                format!(
                    "{what} the deadline: {} ms past it, beyond the clock margin",
                    now_ms - cutoff + CLOCK_MARGIN_MS
                ),
            )
        })
    }

    /// How long a write started at `now_ms` may take before the cutoff.
    pub(super) fn left(self, now_ms: u64) -> Option<Duration> {
        self.0.map(|cutoff| Duration::from_millis(cutoff.saturating_sub(now_ms).max(1)))
    }
}

/// Where a transaction stands in wait-die's order, from its prepare message.
#[derive(Debug, Clone, Copy, Default)]
pub struct Order {
    pub started_at: Option<u64>,
    pub deadline: Option<u64>,
    /// The transaction holds no lock anywhere ([`crate::model::ParticipantRequest::holds_no_locks`]): it may
    /// wait for any lock, whatever its age.
    pub holds_no_locks: bool,
    /// The transaction's record was written before the prepare ([`crate::model::ParticipantRequest::recorded`]):
    /// its locks stay out of the locks index.
    pub recorded: bool,
}

impl Order {
    /// The time wait-die orders by: the start, or for a message from a coordinator that sends none, the
    /// deadline (as before start times were sent).
    pub(super) fn priority(&self) -> Option<u64> {
        self.started_at.or(self.deadline)
    }
}

/// How a wait for a lock ended.
pub(super) enum Waited {
    Released,
    /// Its owner's record settled it: the answer (`None`: try again).
    Settled(Option<ParticipantResponse>),
    /// The budget ran out waiting for `owner`'s lock.
    OutOfTime {
        owner: String,
    },
}

/// A waiter reads the lock's owner's record after this many polls with the lock still there (a lock
/// usually goes sooner: the read is spared).
pub(super) const OWNER_CHECK_AFTER_POLLS: u32 = 4;

/// Wait-die between transactions that want the same item. All transactions are ordered by (startedAt,
/// id), the same order everywhere; one that meets the lock of a transaction later in that order (a
/// younger one) waits a little for it to finish, one that meets an older one's lock refuses at once.
/// Waits therefore only ever go from older to younger and can never form a cycle, and a transfer on a
/// hot item usually waits milliseconds instead of aborting. Ordering by start rather than by deadline
/// means a longer timeout never makes a transaction the one that yields.
pub(super) struct Waiting<'a> {
    pub(super) tx: &'a str,
    pub(super) started_at: Option<u64>,
    pub(super) holds_no_locks: bool,
    /// No wait may end after this.
    pub(super) until: u64,
    pub(super) cutoff: Cutoff,
    /// Rounds begun, and how many of them ended in a wait that saw the lock released.
    pub(super) rounds: std::sync::atomic::AtomicU32,
    pub(super) waits: std::sync::atomic::AtomicU32,
    /// Its credits take pending entries ([`super::credits`]).
    pub(super) credits: bool,
    /// The service's rules judge its items: every exclusive lock waits for the credits to drain.
    pub(super) rules: bool,
    /// The items on which this prepare left its drain marker: removed if it ends without the lock.
    pub(super) marked: std::sync::Mutex<Vec<Item>>,
}

impl<'a> Waiting<'a> {
    pub(super) fn new(tx: &'a str, order: Order, now_ms: u64, max_wait_ms: u64) -> Waiting<'a> {
        let budget = order.deadline.map_or(0, |d| (d.saturating_sub(now_ms) / 2).min(max_wait_ms));
        Waiting {
            tx,
            started_at: order.priority(),
            holds_no_locks: order.holds_no_locks,
            until: now_ms + budget,
            cutoff: Cutoff::of(order),
            rounds: std::sync::atomic::AtomicU32::new(0),
            waits: std::sync::atomic::AtomicU32::new(0),
            credits: false,
            rules: false,
            marked: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The same wait, for a prepare whose credits take entries (`credits`) and whose items the service's
    /// `rules` judge.
    pub(super) fn claiming(self, credits: bool, rules: bool) -> Waiting<'a> {
        Waiting { credits, rules, ..self }
    }

    /// What this prepare's write takes on `op`'s item.
    pub(super) fn claim(&self, op: &Operation) -> Claim {
        if self.credits && credits::is_credit(op) {
            Claim::Entry
        } else {
            Claim::Lock { drains: credits::drains(op, self.rules) }
        }
    }

    /// The number of the next attempt at the items, `None` once [`LOCK_ATTEMPTS`] are spent. A round that
    /// ended waiting for a lock (and saw it released) is not an attempt: the wait is bounded by its budget,
    /// and an older transaction is never refused for being outrun.
    pub(super) fn next_attempt(&self) -> Option<u32> {
        use std::sync::atomic::Ordering::Relaxed;
        let round = self.rounds.fetch_add(1, Relaxed);
        let attempt = round - self.waits.load(Relaxed);
        (attempt < LOCK_ATTEMPTS).then_some(attempt)
    }

    /// Whether this transaction may wait for `owner`'s lock: it comes before `owner` in wait-die's order (a
    /// message without an order comes after everyone), or it holds no lock anywhere (no wait of it can
    /// close a cycle).
    pub(super) fn may_wait_for(&self, owner: &str, owner_started_at: u64) -> bool {
        self.holds_no_locks
            || self.started_at.is_some_and(|started_at| (started_at, self.tx) < (owner_started_at, owner))
    }

    /// The pause before looking at a lock again, `None` once it would end past the wait budget. A waiter
    /// that holds locks elsewhere looks often (2–12 ms): everyone waiting for those locks waits for it too.
    /// One that holds nothing costs only itself by looking later (16–48 ms), and every look is a request
    /// the endpoint serves instead of a lock write.
    pub(super) fn pause(&self, polls: u32, now_ms: u64) -> Option<Duration> {
        let base = if self.holds_no_locks { 16u64 << polls.min(1) } else { 2u64 << polls.min(2) };
        let jitter = uuid::Uuid::new_v4().as_u128() as u64 % (base / 2);
        let pause = base + jitter;
        (now_ms + pause <= self.until).then(|| Duration::from_millis(pause))
    }
}

/// Why a lock could not be taken, decided from the item as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockFailure {
    /// The item already carries a lock of this very transaction: an earlier delivery of the same prepare
    /// (or this write's own earlier attempt, whose reply was lost) took it, with this token.
    Ours {
        token: Option<String>,
    },
    Refused {
        code: RefusalCode,
        reason: String,
    },
    /// Held by another transaction past its expiry and twice the clock margin
    /// ([`crate::clock::resolvable_after`]): the owner must be resolved before the item is taken.
    Expired {
        owner: String,
    },
    /// Held by another transaction that is not resolvable yet.
    Held {
        owner: String,
        started_at: u64,
        /// The item's key as text: the reason is [`locked_by`] it and the owner.
        entity: String,
    },
    /// A pending credit of `owner` past its expiry and twice the clock margin, with its `token`: resolved from
    /// its owner's record before the item is taken.
    ExpiredCredit {
        owner: String,
        token: String,
    },
    /// Pending credits (or, for a credit, a waiting exclusive lock's marker) are in the way: the owners that
    /// wait-die orders against, and what to wait for.
    Credits {
        entity: String,
        owners: Vec<(String, u64)>,
        claim: Claim,
        /// A credit held back by another transaction's marker (the owner named): it does not wait.
        behind_marker: bool,
    },
    /// The item no longer shows why the write failed (it changed since): try again.
    Unexplained,
}

/// What a prepare's write takes on an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The exclusive lock; `drains`: only once no credit is pending ([`super::credits::drains`]).
    Lock { drains: bool },
    /// A pending credit's entry ([`super::credits`]).
    Entry,
    /// A read-only check of the item's `version`: it reads past no pending credit (one that committed
    /// after it, with another item of its transaction already committed, would order the two
    /// inconsistently); its marker, while it waits, is removed when it answers.
    Read,
}

impl Claim {
    /// Whether `item` no longer keeps this claim out for the credits' sake: drained for a lock that waits for
    /// them; for an entry, room in the map and no other transaction's marker holding credits back.
    pub(super) fn clear_of_credits(self, tx: &str, item: &Item, now_ms: u64) -> bool {
        match self {
            Claim::Lock { drains } => !drains || credits::pending(item) == 0,
            Claim::Read => credits::pending(item) == 0,
            Claim::Entry => {
                credits::pending(item) < credits::MAX_PENDING_CREDITS
                    && !credits::Drain::of(item).is_some_and(|d| d.holds_back(tx, now_ms))
            }
        }
    }
}

/// Why an item cannot be locked now: `owner`'s lock on `entity` (every refusal and wait names the holder).
pub(super) fn locked_by(entity: &str, owner: &str) -> String {
    format!("entity {entity} is locked by transaction {owner}")
}

/// Explains a failed lock from the item as it was (`None`: no such item). Which lock is in the way,
/// and which guard failed, with the numbers.
pub fn classify_lock_failure(tx: &str, op: &Operation, item: Option<&Item>, now_ms: u64, claim: Claim) -> LockFailure {
    let key = op.key_text();
    let refuse = |code, reason: String| LockFailure::Refused { code, reason };
    if let Some(lock) = item.and_then(Lock::of) {
        if lock.transaction_id == tx {
            return LockFailure::Ours { token: lock.token };
        }
        // Only past its expiry and twice the clock margin: a resolver whose clock runs ahead never
        // takes a live transaction's lock for expired.
        if now_ms > crate::clock::resolvable_after(lock.expires_at) {
            return LockFailure::Expired { owner: lock.transaction_id };
        }
        return LockFailure::Held { entity: key, owner: lock.transaction_id, started_at: lock.started_at };
    }
    if claim == Claim::Entry
        && let Some(entry) = item.and_then(|item| credits::Credit::of(item, tx))
    {
        return LockFailure::Ours { token: Some(entry.token) };
    }
    if let Some(item) = item
        && get_s(item, a::LAST_TX) == Some(tx)
    {
        return refuse(RefusalCode::Conflict, format!("transaction {tx} has already committed entity {key}"));
    }
    if let Some((code, reason)) = operations::guard_refusal(op, item) {
        return refuse(code, reason);
    }
    match item {
        Some(item) if !claim.clear_of_credits(tx, item, now_ms) => credits_in_the_way(tx, key, item, now_ms, claim),
        _ => LockFailure::Unexplained,
    }
}

/// The pending credits (and marker) that keep `claim` off the item: one to resolve first, or the owners to
/// wait for.
fn credits_in_the_way(tx: &str, entity: String, item: &Item, now_ms: u64, claim: Claim) -> LockFailure {
    let entries = credits::Credit::all(item);
    if let Some(expired) = entries.iter().find(|c| now_ms > crate::clock::resolvable_after(c.expires_at)) {
        return LockFailure::ExpiredCredit { owner: expired.transaction_id.clone(), token: expired.token.clone() };
    }
    let marker = credits::Drain::of(item).filter(|d| d.holds_back(tx, now_ms));
    let (owners, behind_marker) = match (claim, marker) {
        (Claim::Entry, Some(marker)) => (vec![(marker.transaction_id, marker.started_at)], true),
        _ => (entries.into_iter().map(|c| (c.transaction_id, c.started_at)).collect(), false),
    };
    LockFailure::Credits { entity, owners, claim, behind_marker }
}

/// Evaluates a read-only `check` against the item as read: the same guards as its lock condition.
/// Another transaction's lock counts against the check (classified first, as for a lock): a value under
/// it may be about to change, and reading past it could order this transaction inconsistently with
/// the lock holder.
///
/// Pending credits count against a check of the item's `version` (each credit's commit moves it), not
/// against one of whether it `exists` (which a credit never changes).
pub fn check_holds(tx: &str, op: &Operation, item: Option<&Item>, now_ms: u64) -> Result<(), LockFailure> {
    let claim = match op {
        Operation::Check { version: Some(_), .. } => Claim::Read,
        _ => Claim::Lock { drains: false },
    };
    match classify_lock_failure(tx, op, item, now_ms, claim) {
        LockFailure::Unexplained | LockFailure::Ours { .. } => Ok(()),
        failure => Err(failure),
    }
}
