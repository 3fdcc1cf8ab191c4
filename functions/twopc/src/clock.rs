//! Time as the protocol sees it. Tests substitute a clock they move, to make locks expire.
//!
//! Deadlines and lock expiry are compared across the clocks of different Lambda instances, which never
//! agree exactly. [`CLOCK_MARGIN_MS`] (M) is the skew the protocol tolerates between any two of them:
//! the coordinator decides commit only while its own clock is at or before the deadline; a participant
//! takes no lock after `deadline + M` by its clock ([`lock_cutoff`]); a resolver (a prepare meeting a
//! lock, the sweeper, a retried key) acts on a lock or an undecided owner only after `expiry + 2M` by its
//! clock ([`resolvable_after`]). With skews below M, a prepare the coordinator could still count is never
//! refused as late, and a resolver never aborts a transaction its coordinator could still commit (by
//! then the coordinator's clock is past `deadline + M`).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// M: the clock skew tolerated between any two instances. Lambda's clocks follow Amazon Time Sync,
/// within a millisecond or so of UTC; 250 ms leaves two orders of magnitude of room, and the `ClockSkew`
/// alarm fires at a fifth of it (50 ms), long before a skew could cost a transaction. A larger M only
/// makes a lock outlive its deadline longer (up to `deadline + M`) and its resolution wait longer
/// (`deadline + 2M`); a skew beyond M costs aborts, never safety: every decision is a conditional write.
pub const CLOCK_MARGIN_MS: u64 = 250;

/// The last moment (by the participant's clock) a participant may write a lock for a transaction with
/// this deadline.
pub fn lock_cutoff(deadline: u64) -> u64 {
    deadline + CLOCK_MARGIN_MS
}

/// The moment (by the resolver's clock) after which a lock expiring at `expiry`, or an undecided owner
/// whose deadline is `expiry`, may be resolved.
pub fn resolvable_after(expiry: u64) -> u64 {
    expiry + 2 * CLOCK_MARGIN_MS
}

pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    }
}

/// The system clock shifted by an offset the test controls.
#[derive(Debug, Default)]
pub struct ShiftedClock {
    offset_ms: AtomicI64,
}

impl ShiftedClock {
    pub fn new() -> Arc<ShiftedClock> {
        Arc::new(ShiftedClock::default())
    }
    pub fn advance(&self, ms: u64) {
        self.offset_ms.fetch_add(ms as i64, Ordering::SeqCst);
    }
}

impl Clock for ShiftedClock {
    fn now_ms(&self) -> u64 {
        (SystemClock.now_ms() as i64 + self.offset_ms.load(Ordering::SeqCst)).max(0) as u64
    }
}

pub type SharedClock = Arc<dyn Clock>;

pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

/// Another clock, off by a fixed amount: an instance whose clock runs ahead (positive) or behind.
#[derive(Debug)]
pub struct SkewedClock {
    base: SharedClock,
    offset_ms: i64,
}

impl SkewedClock {
    pub fn new(base: SharedClock, offset_ms: i64) -> Arc<SkewedClock> {
        Arc::new(SkewedClock { base, offset_ms })
    }
}

impl Clock for SkewedClock {
    fn now_ms(&self) -> u64 {
        (self.base.now_ms() as i64 + self.offset_ms).max(0) as u64
    }
}
