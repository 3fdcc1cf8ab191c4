//! Crash points of the coordinator, for the recovery tests. Without the `failpoints` feature this is
//! an empty type and every check compiles to nothing.

/// Where an injected crash stops the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinatorCrash {
    /// After the PREPARING record of a keyed request is written. (An unkeyed request writes no record
    /// before its decision, so it never reaches this point.)
    AfterCreate,
    /// Once this many prepare answers have arrived.
    AfterPrepares(usize),
    AfterDecision,
    /// Once this many commit (or abort) answers have arrived.
    AfterCommits(usize),
    BeforeTerminal,
    /// After an aborted attempt's successor is named (`retriedAs`, written with its abort and with the
    /// successor's record), before it begins.
    AfterClaim,
}

/// The coordinator stopped at an injected crash point: it writes nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("injected crash: {0:?}")]
pub struct Crashed(pub CoordinatorCrash);

#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    #[cfg(feature = "failpoints")]
    crash: Option<CoordinatorCrash>,
}

impl Faults {
    #[cfg(feature = "failpoints")]
    pub fn crash_at(crash: CoordinatorCrash) -> Faults {
        Faults { crash: Some(crash) }
    }

    #[inline(always)]
    pub fn check(&self, _point: CoordinatorCrash) -> Result<(), Crashed> {
        #[cfg(feature = "failpoints")]
        if self.crash == Some(_point) {
            return Err(Crashed(_point));
        }
        Ok(())
    }
}
