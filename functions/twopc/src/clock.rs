//! Time as the protocol sees it. Tests substitute a clock they move, to make locks expire.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

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
