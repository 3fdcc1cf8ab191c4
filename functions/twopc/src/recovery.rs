//! Lock resolution: what happens to a lock whose expiry has passed. A lock is never broken on time
//! alone; its owner's record decides, and a still-undecided owner is aborted by a conditional
//! `PREPARING` → `ABORTING` that races the coordinator's own decision write. Exactly one of those two
//! writes succeeds, and whoever loses follows the winner.

use crate::model::Status;
use crate::record::{TransactionRecord, TransactionStore, Transition};
use crate::store::StoreError;

/// The decided fate of a lock's owner.
#[derive(Debug, Clone, PartialEq)]
pub enum OwnerFate {
    /// Decided commit and not yet finished: the owner's operation must be applied (rolled forward).
    Commit(Box<TransactionRecord>),
    /// Finished commit: every participant acknowledged, so any lock it still holds was taken by a
    /// late duplicate prepare and is released without applying anything again.
    Committed,
    /// Decided abort, or never recorded (now recorded as aborted): release.
    Abort,
    /// Still preparing within its deadline: the lock stands.
    Undecided,
    /// Held (PREPARED) within its `holdUntil`: the lock stands, and its expiry belongs at `holdUntil` (the
    /// hold message that moves it there may have been lost: a resolver that meets the lock moves it, so
    /// that it stops heading the sweeper's index for the whole hold).
    Held(Box<TransactionRecord>),
    /// Past its expiry and undecided, or never recorded: only a role that may write a decision (the
    /// coordinator's, the sweeper's) resolves it ([`read_owner_fate`] never returns the others' writes).
    Expired,
}

pub const ABANDONED_REASON: &str = "no transaction record was written before the lock expired";
pub const EXPIRED_REASON: &str = "the deadline passed before a decision; aborted by recovery";
pub const HOLD_EXPIRED_REASON: &str = "the hold expired (holdUntil passed) before its caller committed it";

/// Why an undecided transaction past its expiry ([`TransactionRecord::expiry`]) is aborted: a held one's
/// hold ran out, any other's deadline passed. Every resolver (lock resolution here, the coordinator's
/// recovery) records the same reason.
pub fn expiry_reason(status: Status) -> &'static str {
    if status == Status::Prepared { HOLD_EXPIRED_REASON } else { EXPIRED_REASON }
}

/// Reads (and if need be decides) the fate of `owner`, whose lock was found expired at `now_ms`.
pub async fn owner_fate(transactions: &TransactionStore, owner: &str, now_ms: u64) -> Result<OwnerFate, StoreError> {
    let record = match transactions.get(owner).await? {
        Some(record) => record,
        // Written conditionally: a coordinator whose record write is still in flight then fails to
        // create it, and aborts.
        None => abort_absent_owner(transactions, owner, now_ms).await?,
    };
    decide(transactions, record, now_ms).await
}

/// Records ABORTED an owner without a record: only what recovery may write (the sweeper's role writes no
/// request's attributes). A later attempt of a request always has its record before its prepares (it is
/// created with the link that names it, [`TransactionStore::decide_abort`]), so an owner without one is an
/// unkeyed first attempt whose coordinator stopped before its decision (presumed abort).
async fn abort_absent_owner(
    transactions: &TransactionStore,
    owner: &str,
    now_ms: u64,
) -> Result<TransactionRecord, StoreError> {
    transactions.abort_if_absent(owner, now_ms, ABANDONED_REASON).await
}

/// Resolves `owner` from its own record, for a participant that may not write one (issue 42): decided
/// already, or aborted now if past its expiry. Returns whether it is decided now (its locks can be
/// followed); false when it has no record (the sweeper's, which reads the lock itself) or is still
/// undecided within its deadline or hold.
pub async fn resolve_recorded(transactions: &TransactionStore, owner: &str, now_ms: u64) -> Result<bool, StoreError> {
    let Some(record) = transactions.get(owner).await? else { return Ok(false) };
    Ok(!matches!(decide(transactions, record, now_ms).await?, OwnerFate::Undecided | OwnerFate::Held(_)))
}

/// The fate of `owner` as its record says, without writing anything: what a participant, which may not
/// decide another transaction, follows. Past its expiry but undecided, or with no record: `Expired`.
pub async fn read_owner_fate(
    transactions: &TransactionStore,
    owner: &str,
    now_ms: u64,
) -> Result<OwnerFate, StoreError> {
    let Some(record) = transactions.get(owner).await? else { return Ok(OwnerFate::Expired) };
    Ok(fate_of(record, now_ms))
}

/// What `record` says of its owner at `now_ms`. Resolvers act only past the deadline (a held
/// transaction's: its holdUntil) and twice the clock margin (crate::clock): then an undecided owner is
/// `Expired`, for a role that may decide to abort.
fn fate_of(record: TransactionRecord, now_ms: u64) -> OwnerFate {
    match record.status {
        Status::Committing => OwnerFate::Commit(Box::new(record)),
        Status::Committed => OwnerFate::Committed,
        Status::Aborting | Status::Aborted => OwnerFate::Abort,
        Status::Prepared if now_ms <= crate::clock::resolvable_after(record.expiry()) => {
            OwnerFate::Held(Box::new(record))
        }
        Status::Preparing if now_ms <= crate::clock::resolvable_after(record.expiry()) => OwnerFate::Undecided,
        Status::Preparing | Status::Prepared => OwnerFate::Expired,
    }
}

async fn decide(
    transactions: &TransactionStore,
    record: TransactionRecord,
    now_ms: u64,
) -> Result<OwnerFate, StoreError> {
    let (id, status, keyed) = (record.transaction_id.clone(), record.status, record.is_keyed());
    Ok(match fate_of(record, now_ms) {
        OwnerFate::Expired => {
            match transactions
                .transition(&id, status, Status::Aborting, keyed, now_ms, None, Some(expiry_reason(status)))
                .await?
            {
                Transition::Done(_) => OwnerFate::Abort,
                // The coordinator (or a held transaction's caller) decided first: follow its decision. A
                // PREPARING owner that was held meanwhile (PREPARED) is undecided until its holdUntil.
                Transition::Lost(Some(now)) => match now.status {
                    Status::Committing => OwnerFate::Commit(Box::new(now)),
                    Status::Committed => OwnerFate::Committed,
                    Status::Prepared => OwnerFate::Held(Box::new(now)),
                    Status::Preparing => OwnerFate::Undecided,
                    _ => OwnerFate::Abort,
                },
                Transition::Lost(None) => OwnerFate::Abort,
            }
        }
        fate => fate,
    })
}
