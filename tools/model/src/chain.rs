//! Issue 41: retry chains with holds and age tokens together. A request refused for contention is retried by
//! its coordinator as attempts `<first id>-<n>` linked by `retriedAs`; a final refusal for contention
//! carries an age token, and a caller's retry with it, under a key of its own, claims the refused attempt
//! and runs as a new transaction keeping the age; a held request (`holdMs`) is decided later by its caller's
//! commit or abort. A model of its own, next to [`crate::age`]: what issue 41 is about is which record
//! writes link attempts, who decided an abort, and which links a key's replay and the caller's routes
//! follow, not wait-die, so it keeps no locks (a vote is PREPARED or CONFLICT, left to chance) and keeps of
//! each record what those writes read and write.
//!
//! What is modelled (DETAILS.md, "Retry chains with holds and age tokens", says what is left out):
//!
//! | step | mirrors |
//! |---|---|
//! | start | `answer_authorized` → `run` → `run_two_phase`: the key's record created PREPARING (`create_own`, conditional); found there already → `replay` (another body: 422 `IDEMPOTENCY_KEY_REUSED`) |
//! | decide | `run_two_phase` → `held::hold` or `PhaseEngine::commit` / `abort` (a failed write settled by `PhaseEngine::settle`): the votes are in, all PREPARED or a refusal for contention. PREPARED: a held request writes PREPARING → PREPARED (202 PREPARED with its id), another PREPARING → COMMITTING (driven to COMMITTED, 200; the model folds the second phase). CONFLICT: with [`ChainSwitches::own_refusal_only`] the coordinator decides whether to retry first (attempts left, time left: a choice) and writes PREPARING → ABORTING with `refusedForContention` and, retrying, `retriedAs` = the next attempt, in that one conditional write; the write lost (the caller's abort, a resolver decided first) → it follows the record found: 409, no retry, no age token |
//! | claim (before the fix) | `next_attempt` → `claim_successor` after the abort write, whether that write won or lost (`SET retriedAs = :next IF status IN (ABORTING, ABORTED) AND (attribute_not_exists(retriedAs) OR retriedAs = :next)`), and the age token minted from the attempt's own votes |
//! | next attempt | `TransactionRecord::next_attempt`: created PREPARING (conditional); found there (fenced) → followed: 409, it stops. A crash may come between the link and the create |
//! | token retry | the caller's retry with the age token of the key's final 409, under another key, same body: its id is its key's; a record there → `replay` (another body's: 422). Else the claim of the refused attempt (`ageClaimedBy`, conditional on `refusedForContention`, no `retriedAs`, no other claim) and the retry's record (`ageOf`, the refused attempt's `startedAt`, attempt number + 1) in one `TransactWriteItems` ([`ChainSwitches::atomic_token_claim`]); its write may fail (503, nothing written) |
//! | other body | another request under the token retry's key, with another body and no token: a keyed POST like any other |
//! | replay | a key sent again (`replay`), up to twice, at any moment: from the key's record (another body's: 422), follows `retriedAs` a read at a time ([`ChainSwitches::token_links_apart`]: coordinator links only), a link to no record fenced (`attempt_named` → `fence_attempt`, ABORTED) and answered 409; PREPARING → it waits; PREPARED → 202; COMMITTED → 200; aborted, no link → 409 (before rule A, at an attempt its coordinator refused with attempts left, `may_be_retried`: it waits for the link, its budget may run out first, and it fences the next attempt's id, as the age model checks) |
//! | commit, abort | `POST /transactions/{id}/commit` / `abort` (`decide_held`) for the held request, addressed to the key's first id or the id its POST answered; ([`ChainSwitches::routes_follow_chain`]) it follows `retriedAs` as a replay does (`live_attempt`), then writes its decision conditionally on the status read (`write_held_decision`): abort of PREPARING or PREPARED → ABORTING (200 ABORTED), commit of PREPARED → COMMITTING (200); a commit of a PREPARING attempt answers 503 and writes nothing (not a step: nothing changes). An abort's read of a PREPARING attempt and its write are two steps (the route's state between them: the attempt read and its status); a write conditional on PREPARED is taken with its read (nothing that moves a PREPARED record names a next attempt). A lost write ([`ChainSwitches::route_refollows_after_lost_write`]) follows the chain again from the record found and writes again on the attempt that lives, up to [`ROUTE_RETRIES`] times (then a non-final answer: the caller may send it again) |
//! | operator's abort | issue 47, `POST /admin/transactions/{id}/abort` (`coordinator/admin.rs`, `abort` → `held::decide_on_chain`) for K1's request, held or not, sent to any attempt its coordinator created, once, at any moment: as the caller's abort (`decide_held`) without the hold, it follows `retriedAs` ([`ChainSwitches::operator_follows_chain`]; `live_attempt`, a named attempt without a record fenced), then writes status read → ABORTING ("aborted by an operator": no `refusedForContention`, no `retriedAs`, so no attempt follows it) conditionally on the status read ([`ChainSwitches::operator_writes_conditionally`]); its read of a PREPARING attempt and its write are two steps; lost → followed again from the record found, up to [`OPERATOR_RETRIES`] more writes; COMMITTED → 409 (the committed body), aborted → 200 |
//! | expiry | a held PREPARED record past `holdUntil` aborted by a resolver (the sweeper, lock resolution, a route's `abort_expired`) at any moment; a PREPARING record past its deadline aborted by a resolver racing its slow coordinator (a budget) |
//! | link with record | issue 47 ([`ChainSwitches::link_with_record`]): the decide step's retrying abort creates the next attempt PREPARING in the same write; the next step begins it (or, found decided by a route, a resolver or an operator, follows it: 409); a crash after the write leaves it PREPARING, which the sweeper aborts (an expiry without budget: its coordinator stopped) |
//!
//! The model folds the second phase into the decision (COMMITTING and COMMITTED, ABORTING and ABORTED are
//! one status each: every answer and every condition here reads them alike), and a route's hops along the
//! chain into its read (links are written once and never change; its write, a step of its own, is
//! conditional on the status it read, as the code's loop of conditional writes is).

use stateright::{Model, Property};

pub use crate::report::check;
use crate::report::{Run, Traced};
use crate::state::Status;

/// The fixes of issue 41 the model can switch back, one at a time. `ChainSwitches::default()` is the fixed
/// protocol (the design of issue 41).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChainSwitches {
    /// Rule A (defect 1). On: only an attempt whose recorded abort is its own coordinator's refusal for
    /// contention gets a successor: `refusedForContention` and `retriedAs` are written in the coordinator's
    /// own conditional abort (PREPARING → ABORTING), decided before it; its write lost, it follows the record
    /// found, retries nothing and mints no age token; a token claim is conditional on `refusedForContention`.
    /// Off (before the fix): the coordinator writes its abort, folds its own CONFLICT votes into whatever
    /// record it found, and claims a successor of any ABORTING/ABORTED record (`claim_successor`); its final
    /// answer carries an age token whoever aborted the attempt.
    pub own_refusal_only: bool,
    /// Defect 1's second part. On: the caller's commit and abort follow `retriedAs` to the attempt that
    /// lives (fencing a successor without a record, as a replay does). Off: they act on the id they are sent
    /// to, and answer ABORTED for an attempt that was retried while its successor lives.
    pub routes_follow_chain: bool,
    /// A correction of the design's words (the routes "follow the coordinator chain"), not a defect of the
    /// code. On: a route that meets a link to no record fences it first (`attempt_named`, as a replay does),
    /// so that the coordinator's create of that attempt loses to it. Off: it stops at the last attempt with a
    /// record, aborted, and answers from it (abort 200, commit 409) while the linked attempt may still be
    /// created, held and committed.
    pub routes_fence_successor: bool,
    /// The review of the fix of defect 1 (a held abort that loses its write). A route's read and its
    /// conditional write are two requests: between them the coordinator's own abort (PREPARING → ABORTING
    /// naming the next attempt) may land, and the route's write loses. On: after every lost write the route
    /// follows the chain again from the record found (`live_attempt`, fencing a named attempt without a
    /// record for an abort) and writes its decision on the attempt that lives, up to [`ROUTE_RETRIES`] more
    /// times. Off (before the fix): it goes on from the record found at the attempt it read, and answers from
    /// it once decided: 200 ABORTED for an attempt its coordinator retried while the next one lives.
    pub route_refollows_after_lost_write: bool,
    /// Rule B (defect 2). On: a token retry's claim of the refused attempt and its own record are one
    /// `TransactWriteItems`. Off (before the fix): the claim is written first, then the record; the record's
    /// write may fail, or another body under the same key may come first, and the claim names a transaction
    /// that runs another body.
    pub atomic_token_claim: bool,
    /// Rule C (defect 3). On: a token claim is its own kind of link (`ageClaimedBy` on the refused attempt,
    /// `ageOf` on the retry), which a key's replay and the routes do not follow: a token retry is a new
    /// request under its own key. Off (before the fix): the claim writes `retriedAs`, and the refused key's
    /// replay follows it into the token retry's outcome.
    pub token_links_apart: bool,
    /// Issue 47, the operator's abort (`POST /admin/transactions/{id}/abort`). On: it follows `retriedAs`
    /// from the id it is sent to, as the held abort does (`live_attempt`, fencing a named attempt without a
    /// record), and again from the record found after each lost write. Off: it acts on the id it is sent to
    /// (and, its write lost, on the record found there): 200 ABORTED for an attempt its coordinator retried
    /// while the next attempt goes on.
    pub operator_follows_chain: bool,
    /// Issue 47: the operator's write is conditional on the status it read (PREPARING or PREPARED →
    /// ABORTING). Off: it writes ABORTING whatever the record says by then, over its coordinator's commit too.
    pub operator_writes_conditionally: bool,
    /// Issue 47, one outcome per request. On: the coordinator's contention abort that retries writes the
    /// link (`retriedAs`) and creates the next attempt's record (PREPARING, in the open index) in one
    /// `TransactWriteItems` (`TransactionStore::decide_abort`, `create_with_successor`), so a link never
    /// names an attempt without a record: a coordinator that stops after it leaves a PREPARING attempt,
    /// which the sweeper aborts past its deadline like any other, and the request ends unread. Off (before):
    /// the link, then the create, a step later; a coordinator that stops between them leaves a link to no
    /// record, which only a replay, a route or an operator's abort ever fences: unread, the request never
    /// ends, and no outcome event is ever sent for it.
    pub link_with_record: bool,
}

impl Default for ChainSwitches {
    fn default() -> Self {
        ChainSwitches {
            own_refusal_only: true,
            routes_follow_chain: true,
            routes_fence_successor: true,
            route_refollows_after_lost_write: true,
            atomic_token_claim: true,
            token_links_apart: true,
            operator_follows_chain: true,
            operator_writes_conditionally: true,
            link_with_record: true,
        }
    }
}

/// Faults and resolvers left (each is consumed when it happens).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ChainBudget {
    /// A coordinator crashes between the link to its next attempt and that attempt's create.
    pub crash: u8,
    /// The token retry's write (the claim and record, or the record alone before the fix) fails: 503.
    pub write_fails: u8,
    /// A resolver (lock resolution, the sweeper) aborts a PREPARING attempt past its deadline while its
    /// coordinator, slower than the deadline, is still at work.
    pub resolver: u8,
}

/// The requests, by index: each is a POST under a key, run by its own coordinator execution.
pub type Ex = u8;
/// K1's POST: body X; held if [`ChainConfig::held`].
pub const FIRST: Ex = 0;
/// The caller's retry with the age token of K1's final refusal, under key K2, body X.
pub const TOKEN_RETRY: Ex = 1;
/// Another request under key K2, body Y, no token.
pub const OTHER_BODY: Ex = 2;

/// The keys: K1 (the first request's), K2 (the token retry's, and the other body's).
pub const KEYS: [&str; 2] = ["K1", "K2"];

/// A request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Body {
    X,
    Y,
}

/// A transaction id: `<key's id>` for n = 1, `<key's id>-<n>` after (`ns`: the key whose id it starts with).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id {
    pub ns: u8,
    pub n: u8,
}

/// Who wrote a record's abort (a ghost, for the properties).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decider {
    /// The attempt's own coordinator, for its refusal for contention.
    Own,
    /// The caller's abort route.
    Caller,
    /// A resolver: the hold's expiry, or a PREPARING attempt past its deadline.
    Resolver,
    /// A replay's or a route's fence of a successor without a record.
    Fence,
    /// Issue 47: an operator's abort (`POST /admin/transactions/{id}/abort`), of an attempt held or not.
    Operator,
}

/// A transaction record: what the retry writes and reads of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CRecord {
    /// PREPARING, PREPARED, COMMITTED (decided commit), ABORTED (decided abort).
    pub status: Status,
    /// Its request's body (`requestHash`).
    pub body: Body,
    pub held: bool,
    /// Its attempt number, and the key whose id its chain's ids start with (`firstTransactionId`): its
    /// coordinator's successor is `<first>-<attempt + 1>`.
    pub attempt: u8,
    pub first: u8,
    pub retried_as: Option<Id>,
    pub age_claimed_by: Option<Id>,
    pub age_of: Option<Id>,
    pub refused_for_contention: bool,
    /// Ghosts: who decided its abort, the request (coordinator execution) that created it (none: a fence),
    /// and the attempt it was created to follow (a coordinator's successor, or a token retry).
    pub by: Option<Decider>,
    pub ex: Option<Ex>,
    pub pred: Option<Id>,
}

impl CRecord {
    fn fenced(&self) -> bool {
        self.by == Some(Decider::Fence) && self.ex.is_none()
    }
}

/// What a request, a replay or a route answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CAnswer {
    /// 200 COMMITTED (a POST, a replay, the commit route).
    Committed,
    /// 202 PREPARED: held, the caller decides (not an outcome).
    Prepared,
    /// 409 ABORTED (a POST, a replay, the commit route).
    Aborted,
    /// The abort route's 200 ABORTED.
    AbortedOk,
    /// The abort route's 409 with the committed body.
    WasCommitted,
    /// 422 IDEMPOTENCY_KEY_REUSED: the key ran another body.
    KeyReused,
    /// 409 AGE_TOKEN_USED: the refused attempt was claimed already (nothing written).
    TokenUsed,
    /// 409 NOT_HELD (a route to a transaction that was not held).
    NotHeld,
    /// 503: the token retry's write failed; the outcome says nothing.
    Unavailable,
}

impl CAnswer {
    /// The outcome an answer states: `Some(true)` commit, `Some(false)` abort, `None` none.
    pub fn outcome(self) -> Option<bool> {
        match self {
            CAnswer::Committed | CAnswer::WasCommitted => Some(true),
            CAnswer::Aborted | CAnswer::AbortedOk => Some(false),
            _ => None,
        }
    }
}

/// An answer and the record it was read from (a ghost: whose outcome it tells).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Said {
    pub answer: CAnswer,
    pub from: Option<Id>,
}

/// The votes of an attempt, left to chance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Votes {
    /// Every participant PREPARED.
    Prepared,
    /// Refused for contention (CONFLICT), and the coordinator would retry (attempts and time left).
    Conflict,
    /// Refused for contention, and no time is left for another attempt (the deadline, the answer budget):
    /// the refusal is the answer, with an age token.
    ConflictNoTime,
}

/// Where a request's coordinator is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CPc {
    /// Not sent yet.
    Idle,
    /// The token retry, before the fix: its claim written, its record to create.
    Create,
    /// The attempt's prepares are out: its votes are the next step.
    Collect,
    /// Before the fix: its abort written (or lost), the claim of its successor to write.
    Claim,
    /// Linked: the next attempt is created next.
    Next,
    Done,
    Crashed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CCoord {
    pub pc: CPc,
    /// The attempt at work.
    pub cur: Option<Id>,
    pub said: Option<Said>,
    /// Its final refusal's age token: the attempt it lets a retry claim.
    pub token: Option<Id>,
}

/// A replay of a key: not sent, following the chain at an id, or answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RPc {
    Idle,
    At(Id),
    Answered(Said),
}

impl RPc {
    pub fn said(&self) -> Option<Said> {
        match self {
            RPc::Answered(s) => Some(*s),
            _ => None,
        }
    }
}

/// The caller's commit or abort of the held request: where it is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// The key's first id (the caller knows it from the start).
    First,
    /// The id the POST's 202 PREPARED named.
    Answered,
}

/// How many more writes a caller's commit or abort makes after its first one lost (the code's loop makes
/// up to four in all; two more are enough for the chain's lost writes the model has: the coordinator's
/// PREPARED, its abort naming the next attempt, a resolver's, the other route's).
pub const ROUTE_RETRIES: u8 = 2;

/// A caller's commit or abort between its read and its write: the attempt it read, the status its write is
/// conditional on, and how many of its writes lost so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RouteRead {
    pub at: Id,
    pub status: Status,
    pub lost: u8,
}

/// Things that happened, for the `sometimes` checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainEvent {
    /// The coordinator's abort lost to the caller's abort.
    OwnAbortLostToCaller,
    /// The coordinator's abort lost to a resolver's.
    OwnAbortLostToResolver,
    ReplayFollowed,
    RouteFollowed,
    Fenced,
    /// A coordinator's create of its next attempt found it fenced: it stops (409).
    LateCoordinatorStopped,
    /// The token retry found its key's record another body's (422), or the other body the token retry's.
    KeyTaken,
    WriteFailed,
    HoldExpired,
    /// A route met a link to no record and fenced it.
    RouteFenced,
    /// A route's conditional write lost: the record moved on since its read.
    RouteWriteLost,
    /// A route whose write lost followed the chain again to another attempt.
    RouteRefollowed,
    /// Issue 47: the coordinator's contention abort lost to an operator's abort.
    OwnAbortLostToOperator,
    /// Issue 47: the coordinator's decision write (PREPARING → COMMITTING, or PREPARED for a hold) lost to an
    /// operator's abort.
    CommitLostToOperator,
    /// Issue 47: the operator's conditional write lost: the record moved on since its read.
    OperatorWriteLost,
    /// Issue 47: the operator's write lost, and it followed the chain again to another attempt.
    OperatorRefollowed,
    /// Issue 47: the operator met a link to no record and fenced it.
    OperatorFenced,
    /// Issue 47: the operator aborted a held PREPARED attempt.
    OperatorAbortedHeld,
    /// Issue 47: the operator's abort followed `retriedAs` (on its read or after a lost write).
    OperatorFollowed,
    /// Issue 47: the sweeper aborted an attempt whose coordinator stopped (its record PREPARING, abandoned).
    AbandonedAborted,
}

/// Ghost facts, for the `always` properties of issue 47.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ghost {
    /// A record decided commit was then written aborted, or one decided abort written committed.
    TwoDecisions,
    /// An attempt of K1's request was created after an operator's abort of it was answered 200 ABORTED.
    BegunAfterOperator,
}

impl Ghost {
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl ChainEvent {
    pub fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChainState {
    /// `records[ns][n - 1]`.
    pub records: [Vec<Option<CRecord>>; 2],
    pub coords: [CCoord; 3],
    /// `replays[key][j]`: the j-th replay of K1 and of K2 (K2's by the token retry's caller, body X).
    pub replays: [[RPc; 2]; 2],
    /// The caller's commit and abort (`[commit, abort]`): their final answers.
    pub routes: [Option<Said>; 2],
    /// The caller's commit and abort between their read and their write.
    pub route_reads: [Option<RouteRead>; 2],
    /// Issue 47: the operator's abort of K1's request between its read and its write, and its answer.
    pub op_read: Option<RouteRead>,
    pub op_said: Option<Said>,
    /// [`Ghost`] bits: what no property may see.
    pub ghost: u8,
    pub budget: ChainBudget,
    /// [`ChainEvent`] bits.
    pub seen: u32,
}

impl ChainState {
    pub fn record(&self, id: Id) -> Option<CRecord> {
        self.records[id.ns as usize].get(id.n as usize - 1).copied().flatten()
    }

    fn record_mut(&mut self, id: Id) -> &mut Option<CRecord> {
        &mut self.records[id.ns as usize][id.n as usize - 1]
    }

    pub fn saw(&self, e: ChainEvent) -> bool {
        self.seen & e.bit() != 0
    }

    pub fn all_records(&self) -> impl Iterator<Item = (Id, CRecord)> + '_ {
        self.records.iter().enumerate().flat_map(|(ns, chain)| {
            chain.iter().enumerate().filter_map(move |(k, r)| r.map(|r| (Id { ns: ns as u8, n: k as u8 + 1 }, r)))
        })
    }

    /// Every answer given under key `key` (its POSTs', its replay's, and for K1 the routes' and the
    /// operator's: an operator's 200 ABORTED says the request is aborted as the caller's does).
    pub fn key_answers(&self, key: usize) -> Vec<Said> {
        let posts: &[Ex] = if key == 0 { &[FIRST] } else { &[TOKEN_RETRY, OTHER_BODY] };
        let mut all: Vec<Said> = posts.iter().filter_map(|&e| self.coords[e as usize].said).collect();
        all.extend(self.replays[key].iter().filter_map(RPc::said));
        if key == 0 {
            all.extend(self.routes.iter().flatten());
            all.extend(self.op_said);
        }
        all
    }

    pub fn has(&self, g: Ghost) -> bool {
        self.ghost & g.bit() != 0
    }

    /// Every answer given to request `ex` (its POST's; K1's replay and routes are K1's; K2's replay is the
    /// token retry's caller's).
    pub fn request_answers(&self, ex: Ex) -> Vec<Said> {
        let mut all: Vec<Said> = self.coords[ex as usize].said.into_iter().collect();
        let replay = match ex {
            FIRST => Some(0),
            TOKEN_RETRY => Some(1),
            _ => None,
        };
        if let Some(k) = replay {
            all.extend(self.replays[k].iter().filter_map(RPc::said));
        }
        if ex == FIRST {
            all.extend(self.routes.iter().flatten());
            all.extend(self.op_said);
        }
        all
    }

    /// The token retry committed, or, held (its body asks for a hold), is PREPARED for its caller to decide.
    pub fn token_retry_ran(&self) -> bool {
        self.all_records()
            .any(|(_, r)| r.ex == Some(TOKEN_RETRY) && (r.status.commit() || r.status == Status::Prepared))
    }

    /// Some attempt request `ex` created is decided commit.
    pub fn request_commits(&self, ex: Ex) -> bool {
        self.all_records().any(|(_, r)| r.ex == Some(ex) && r.status.commit())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChainAction {
    /// The coordinator's next step (start, the token retry's create, a claim, the next attempt).
    Coord(Ex),
    /// The current attempt's votes are in.
    Decide(Ex, Votes),
    /// The coordinator crashes between its link and the next attempt.
    Crash(Ex),
    /// The token retry's write fails (503).
    WriteFails(Ex),
    /// The j-th replay of key 0 (K1) or 1 (K2): its next read.
    Replay(u8, u8),
    /// The caller's commit (`true`) or abort of the held request: its read of the attempt it is sent to, and
    /// the chain followed from it.
    Route(bool, Target),
    /// The caller's abort (`false`): its write, conditional on PREPARING, on the attempt it read. (A write
    /// conditional on PREPARED is taken in the step of its read: see `ChainModel::route`.)
    RouteWrite(bool),
    /// A resolver aborts this attempt (a held one past `holdUntil`, or a PREPARING one past its deadline).
    Expire(Id),
    /// Issue 47: an operator's abort of K1's request sent to the attempt `K1-n` (`n` 1: the first id): its
    /// read, and the chain followed from it. A PREPARED attempt is written in this step, as the caller's.
    Operator(u8),
    /// Issue 47: the operator's write, conditional on PREPARING, on the attempt it read.
    OperatorWrite,
}

#[derive(Clone, Debug)]
pub struct ChainConfig {
    pub name: &'static str,
    /// `MAX_ATTEMPTS` of a coordinator's chain.
    pub max_attempts: u8,
    /// K1's body asks for a hold (and so does its token retry's, the same body).
    pub held: bool,
    /// The caller commits and aborts the held request (each once, at any moment, to the first id or the
    /// answered one).
    pub routes: bool,
    /// How often K1 and K2 are each sent again (K2 by the token retry's caller), at any moment: 0 to 2.
    pub replays: u8,
    /// The caller retries K1's final refusal with its age token under K2.
    pub token_retry: bool,
    /// Another body is sent under K2.
    pub other_body: bool,
    /// Issue 47: an operator aborts K1's request once, at any moment, sent to any attempt K1's coordinator
    /// created (held or not; an id without a record is a 404 that writes nothing: no step).
    pub operator: bool,
    pub budget: ChainBudget,
    pub switches: ChainSwitches,
}

impl ChainConfig {
    /// A held request with its caller's commit and abort, the key replayed, and a resolver racing a slow
    /// coordinator: defect 1.
    pub fn held(budget: ChainBudget) -> ChainConfig {
        ChainConfig {
            name: "held",
            max_attempts: 3,
            held: true,
            routes: true,
            replays: 2,
            token_retry: false,
            other_body: false,
            operator: false,
            budget,
            switches: ChainSwitches::default(),
        }
    }

    /// A request refused for contention retried with its token under another key, another body under that
    /// key, both keys replayed: defects 2 and 3.
    pub fn tokens(budget: ChainBudget) -> ChainConfig {
        ChainConfig {
            name: "tokens",
            max_attempts: 3,
            held: false,
            routes: false,
            replays: 2,
            token_retry: true,
            other_body: true,
            operator: false,
            budget,
            switches: ChainSwitches::default(),
        }
    }

    /// Everything together: a held request, its caller's commit and abort, its token retry (held too) under
    /// another key, another body under that key, both keys replayed.
    pub fn together(budget: ChainBudget) -> ChainConfig {
        ChainConfig {
            name: "holds and tokens together",
            token_retry: true,
            other_body: true,
            ..ChainConfig::held(budget)
        }
    }

    /// Issue 47: K1 not held, refused for contention and retried or committed by its coordinator, and an
    /// operator's abort of it at any moment; K1 replayed twice, its token retry under K2 (a token claim is
    /// conditional on the coordinator's own refusal, which an operator's abort never writes).
    pub fn operator(budget: ChainBudget) -> ChainConfig {
        ChainConfig {
            name: "operator",
            max_attempts: 3,
            held: false,
            routes: false,
            replays: 2,
            token_retry: true,
            other_body: false,
            operator: true,
            budget,
            switches: ChainSwitches::default(),
        }
    }

    /// Issue 47, held: [`ChainConfig::held`] (its caller's commit and abort) with an operator's abort too.
    pub fn operator_held(budget: ChainBudget) -> ChainConfig {
        ChainConfig { name: "operator, held", operator: true, ..ChainConfig::held(budget) }
    }

    pub fn with_operator(mut self, on: bool) -> ChainConfig {
        self.operator = on;
        self
    }

    pub fn switches(mut self, switches: ChainSwitches) -> ChainConfig {
        self.switches = switches;
        self
    }

    pub fn max_attempts(mut self, n: u8) -> ChainConfig {
        self.max_attempts = n;
        self
    }

    pub fn replays(mut self, n: u8) -> ChainConfig {
        self.replays = n;
        self
    }
}

/// The model: a configuration.
#[derive(Clone, Debug)]
pub struct ChainModel {
    pub cfg: ChainConfig,
}

/// The property names tests look for.
pub const KEY_ANSWERS: &str = "a key's final answers never differ";
pub const OWN_REFUSAL: &str = "no attempt follows an abort that was not this execution's contention refusal";
pub const OWN_OUTCOME: &str =
    "every answer agrees with its own request's attempts (409: none ever commits; 200: one committed)";
pub const OWN_BODY: &str = "no key is answered from a record of another body";
pub const LINKS: &str = "a link names only the attempt created to follow it, of the same body";
pub const ALL_END: &str = "every request ends at an attempt with a record, and every record is decided";
pub const DECISIONS: &str = "one decision per attempt: none is written both commit and abort";
pub const OPERATOR_ENDS: &str = "an attempt an operator aborted names no successor and none follows it; \
     no attempt of its request begins after the operator's 200";

/// Issue 47: how many more writes the operator's abort makes after its first one lost (`admin.rs`, as
/// `decide_held`: four writes in all).
pub const OPERATOR_RETRIES: u8 = 3;

impl ChainModel {
    pub fn new(cfg: ChainConfig) -> ChainModel {
        assert!((1..=4).contains(&cfg.max_attempts));
        assert!(!cfg.routes || cfg.held, "routes decide a held request");
        assert!(cfg.replays <= 2, "two replays of a key at most");
        ChainModel { cfg }
    }

    pub fn id_name(&self, id: Id) -> String {
        if id.n == 1 { KEYS[id.ns as usize].to_owned() } else { format!("{}-{}", KEYS[id.ns as usize], id.n) }
    }

    fn key_of(ex: Ex) -> u8 {
        if ex == FIRST { 0 } else { 1 }
    }

    fn body_of(ex: Ex) -> Body {
        if ex == OTHER_BODY { Body::Y } else { Body::X }
    }

    fn held_of(&self, ex: Ex) -> bool {
        self.cfg.held && ex != OTHER_BODY
    }

    fn enabled(&self, ex: Ex) -> bool {
        match ex {
            FIRST => true,
            TOKEN_RETRY => self.cfg.token_retry,
            _ => self.cfg.other_body,
        }
    }

    /// The successor a coordinator would name for `rec`: `<first>-<attempt + 1>`.
    fn next_of(rec: &CRecord) -> Id {
        Id { ns: rec.first, n: rec.attempt + 1 }
    }

    /// The link a replay or a route follows from `rec`: `retriedAs` (before the fix, a token claim wrote it).
    fn link(&self, rec: &CRecord) -> Option<Id> {
        if rec.status.abort() { rec.retried_as } else { None }
    }

    fn fence(&self, s: &mut ChainState, id: Id, body: Body) {
        *s.record_mut(id) = Some(CRecord {
            status: Status::Aborted,
            body,
            held: false,
            attempt: id.n,
            first: id.ns,
            retried_as: None,
            age_claimed_by: None,
            age_of: None,
            refused_for_contention: false,
            by: Some(Decider::Fence),
            ex: None,
            pred: None,
        });
        s.seen |= ChainEvent::Fenced.bit();
    }

    fn fresh(&self, ex: Ex, attempt: u8, first: u8, pred: Option<Id>, age_of: Option<Id>) -> CRecord {
        CRecord {
            status: Status::Preparing,
            body: Self::body_of(ex),
            held: self.held_of(ex),
            attempt,
            first,
            retried_as: None,
            age_claimed_by: None,
            age_of,
            refused_for_contention: false,
            by: None,
            ex: Some(ex),
            pred,
        }
    }

    /// The answer of `replay` for a key whose record is found there already (`body`: the request's).
    fn replayed_here(&self, rec: &CRecord, id: Id, body: Body) -> Said {
        let answer = if rec.body != body {
            CAnswer::KeyReused
        } else {
            match rec.status {
                Status::Committing | Status::Committed => CAnswer::Committed,
                Status::Prepared => CAnswer::Prepared,
                _ => CAnswer::Aborted,
            }
        };
        Said { answer, from: Some(id) }
    }

    /// One step; `None` if it is not enabled. With `log`, what it did, line by line (for traces).
    pub fn apply(&self, s: &ChainState, action: ChainAction, log: bool) -> Option<(ChainState, Vec<String>)> {
        let mut n = s.clone();
        let mut lines = vec![];
        let mut say = |line: String| {
            if log {
                lines.push(line);
            }
        };
        match action {
            ChainAction::Coord(ex) => self.coord(&mut n, ex, &mut say)?,
            ChainAction::Decide(ex, votes) => self.decide(&mut n, ex, votes, &mut say)?,
            ChainAction::Crash(ex) => {
                let c = &mut n.coords[ex as usize];
                if n.budget.crash == 0 || c.pc != CPc::Next {
                    return None;
                }
                c.pc = CPc::Crashed;
                n.budget.crash -= 1;
                say(format!(
                    "{}'s coordinator crashes after linking its next attempt, before creating it",
                    self.req_name(ex)
                ));
            }
            ChainAction::WriteFails(ex) => {
                let sw = self.cfg.switches;
                let c = n.coords[ex as usize];
                let at = if sw.atomic_token_claim { CPc::Idle } else { CPc::Create };
                if ex != TOKEN_RETRY || c.pc != at || n.budget.write_fails == 0 || !self.token_ready(s) {
                    return None;
                }
                let k2 = Id { ns: 1, n: 1 };
                if n.record(k2).is_some() {
                    return None;
                }
                n.budget.write_fails -= 1;
                n.seen |= ChainEvent::WriteFailed.bit();
                let c = &mut n.coords[ex as usize];
                c.pc = CPc::Done;
                c.said = Some(Said { answer: CAnswer::Unavailable, from: None });
                say(if sw.atomic_token_claim {
                    "the token retry's claim and record (one TransactWriteItems) fail: 503, nothing written".to_owned()
                } else {
                    "the token retry's record write fails after its claim: 503 (the claim stays)".to_owned()
                });
            }
            ChainAction::Replay(key, j) => self.replay(&mut n, key, j, &mut say)?,
            ChainAction::Route(commit, target) => self.route(&mut n, commit, target, &mut say)?,
            ChainAction::RouteWrite(commit) => self.route_write(&mut n, commit, &mut say)?,
            ChainAction::Operator(at) => self.operator(&mut n, at, &mut say)?,
            ChainAction::OperatorWrite => self.operator_write(&mut n, &mut say)?,
            ChainAction::Expire(id) => {
                let rec = n.record(id)?;
                match rec.status {
                    Status::Prepared => {
                        n.seen |= ChainEvent::HoldExpired.bit();
                        say(format!("{}'s hold expires: a resolver aborts it (PREPARED → ABORTING)", self.id_name(id)));
                    }
                    // Its coordinator stopped after creating it (with the link): the sweeper aborts it once
                    // past its deadline, with no coordinator left to race.
                    Status::Preparing
                        if self.cfg.switches.link_with_record
                            && rec.ex.is_some_and(|e| n.coords[e as usize].pc == CPc::Crashed)
                            && n.coords[rec.ex.expect("checked") as usize].cur != Some(id) =>
                    {
                        n.seen |= ChainEvent::AbandonedAborted.bit();
                        say(format!(
                            "{} is past its deadline, its coordinator stopped before beginning it: the sweeper aborts it (PREPARING → ABORTING)",
                            self.id_name(id)
                        ));
                    }
                    Status::Preparing if n.budget.resolver > 0 => {
                        n.budget.resolver -= 1;
                        say(format!(
                            "{} is past its deadline, its coordinator slow: a resolver aborts it (PREPARING → ABORTING)",
                            self.id_name(id)
                        ));
                    }
                    _ => return None,
                }
                let r = n.record_mut(id).as_mut().expect("read");
                r.status = Status::Aborted;
                r.by = Some(Decider::Resolver);
            }
        }
        Some((n, lines))
    }

    pub fn req_name(&self, ex: Ex) -> &'static str {
        match ex {
            FIRST => "K1",
            TOKEN_RETRY => "the token retry (K2)",
            _ => "the other body (K2)",
        }
    }

    /// The token retry may be sent: K1's answer carried a token.
    fn token_ready(&self, s: &ChainState) -> bool {
        s.coords[FIRST as usize].token.is_some()
    }

    fn coord(&self, s: &mut ChainState, ex: Ex, say: &mut impl FnMut(String)) -> Option<()> {
        let sw = self.cfg.switches;
        let c = s.coords[ex as usize];
        let name = self.req_name(ex);
        let body = Self::body_of(ex);
        match c.pc {
            CPc::Idle => {
                if !self.enabled(ex) || (ex == TOKEN_RETRY && !self.token_ready(s)) {
                    return None;
                }
                let key = Self::key_of(ex);
                let id = Id { ns: key, n: 1 };
                if let Some(rec) = s.record(id) {
                    // `replay` of the key's record (its first execution's, another body's, a fence).
                    let said = self.replayed_here(&rec, id, body);
                    if said.answer == CAnswer::KeyReused {
                        s.seen |= ChainEvent::KeyTaken.bit();
                    }
                    let c = &mut s.coords[ex as usize];
                    c.said = Some(said);
                    c.pc = CPc::Done;
                    say(format!(
                        "{name} finds {}'s record there already ({:?}): {:?}",
                        self.id_name(id),
                        rec.status,
                        said.answer
                    ));
                    return Some(());
                }
                if ex != TOKEN_RETRY {
                    *s.record_mut(id) = Some(self.fresh(ex, 1, key, None, None));
                    let c = &mut s.coords[ex as usize];
                    c.cur = Some(id);
                    c.pc = CPc::Collect;
                    say(format!(
                        "{name} starts: {} created PREPARING{}",
                        self.id_name(id),
                        if self.held_of(ex) { " (held)" } else { "" }
                    ));
                    return Some(());
                }
                // The token retry: the claim of the refused attempt.
                let refused = s.coords[FIRST as usize].token.expect("token");
                let r = s.record(refused).expect("the token's attempt has its record");
                let claimed = if sw.token_links_apart { r.age_claimed_by } else { r.retried_as };
                let ok = r.status.abort()
                    && (!sw.own_refusal_only || r.refused_for_contention)
                    && (claimed.is_none() || claimed == Some(id))
                    && (!sw.token_links_apart || r.retried_as.is_none());
                if !ok {
                    let c = &mut s.coords[ex as usize];
                    c.said = Some(Said { answer: CAnswer::TokenUsed, from: Some(refused) });
                    c.pc = CPc::Done;
                    say(format!("{name}'s claim of {} is refused: AGE_TOKEN_USED", self.id_name(refused)));
                    return Some(());
                }
                let rm = s.record_mut(refused).as_mut().expect("read");
                if sw.token_links_apart {
                    rm.age_claimed_by = Some(id);
                } else {
                    rm.retried_as = Some(id);
                }
                let link = if sw.token_links_apart { "ageClaimedBy" } else { "retriedAs" };
                if sw.atomic_token_claim {
                    *s.record_mut(id) = Some(self.fresh(ex, r.attempt + 1, r.first, Some(refused), Some(refused)));
                    let c = &mut s.coords[ex as usize];
                    c.cur = Some(id);
                    c.pc = CPc::Collect;
                    say(format!(
                        "{name}: one TransactWriteItems claims {} ({link} = {}) and creates {} PREPARING (ageOf {}, attempt {})",
                        self.id_name(refused),
                        self.id_name(id),
                        self.id_name(id),
                        self.id_name(refused),
                        r.attempt + 1
                    ));
                } else {
                    s.coords[ex as usize].pc = CPc::Create;
                    say(format!(
                        "{name} claims {} ({link} = {}); its record is written next",
                        self.id_name(refused),
                        self.id_name(id)
                    ));
                }
            }
            CPc::Create => {
                let id = Id { ns: 1, n: 1 };
                let refused = s.coords[FIRST as usize].token.expect("token");
                if let Some(rec) = s.record(id) {
                    let said = self.replayed_here(&rec, id, body);
                    if said.answer == CAnswer::KeyReused {
                        s.seen |= ChainEvent::KeyTaken.bit();
                    }
                    let c = &mut s.coords[ex as usize];
                    c.said = Some(said);
                    c.pc = CPc::Done;
                    say(format!(
                        "{name}'s create finds {} there already ({:?}): {:?}",
                        self.id_name(id),
                        rec.status,
                        said.answer
                    ));
                    return Some(());
                }
                let r = s.record(refused).expect("claimed");
                *s.record_mut(id) = Some(self.fresh(ex, r.attempt + 1, r.first, Some(refused), Some(refused)));
                let c = &mut s.coords[ex as usize];
                c.cur = Some(id);
                c.pc = CPc::Collect;
                say(format!("{name} creates {} PREPARING (ageOf {})", self.id_name(id), self.id_name(refused)));
            }
            CPc::Claim => {
                let cur = c.cur.expect("an attempt");
                let rec = s.record(cur).expect("decided");
                let next = Self::next_of(&rec);
                if rec.status.abort() && (rec.retried_as.is_none() || rec.retried_as == Some(next)) {
                    s.record_mut(cur).as_mut().expect("read").retried_as = Some(next);
                    s.coords[ex as usize].pc = CPc::Next;
                    say(format!(
                        "{name} claims {} (retriedAs on {}, {:?} by {:?})",
                        self.id_name(next),
                        self.id_name(cur),
                        rec.status,
                        rec.by.expect("aborted")
                    ));
                } else {
                    let c = &mut s.coords[ex as usize];
                    c.said = Some(Said { answer: CAnswer::Aborted, from: Some(cur) });
                    c.pc = CPc::Done;
                    say(format!("{name}'s claim of {} is refused: 409 without a token", self.id_name(next)));
                }
            }
            CPc::Next if sw.link_with_record && sw.own_refusal_only => {
                let cur = c.cur.expect("an attempt");
                let next = Self::next_of(&s.record(cur).expect("decided"));
                let created = s.record(next).expect("created with the link");
                let c = &mut s.coords[ex as usize];
                if created.status == Status::Preparing {
                    c.cur = Some(next);
                    c.pc = CPc::Collect;
                    say(format!("{name} begins {} (created with the link): its prepares go out", self.id_name(next)));
                } else {
                    // A route, a resolver or an operator decided it first: it never begins.
                    s.seen |= ChainEvent::LateCoordinatorStopped.bit();
                    c.said = Some(Said { answer: CAnswer::Aborted, from: Some(next) });
                    c.pc = CPc::Done;
                    say(format!(
                        "{name} finds {} {:?} before it began: 409, it stops",
                        self.id_name(next),
                        created.status
                    ));
                }
            }
            CPc::Next => {
                let cur = c.cur.expect("an attempt");
                let rec = s.record(cur).expect("decided");
                let next = Self::next_of(&rec);
                if s.record(next).is_some() {
                    s.seen |= ChainEvent::LateCoordinatorStopped.bit();
                    let c = &mut s.coords[ex as usize];
                    c.said = Some(Said { answer: CAnswer::Aborted, from: Some(next) });
                    c.pc = CPc::Done;
                    say(format!("{name}'s create of {} finds it fenced (ABORTED): 409, it stops", self.id_name(next)));
                    return Some(());
                }
                *s.record_mut(next) = Some(self.fresh(ex, rec.attempt + 1, rec.first, Some(cur), None));
                if ex == FIRST && s.op_said.is_some_and(|a| a.answer == CAnswer::AbortedOk) {
                    s.ghost |= Ghost::BegunAfterOperator.bit();
                }
                let c = &mut s.coords[ex as usize];
                c.cur = Some(next);
                c.pc = CPc::Collect;
                say(format!(
                    "{name} starts its next attempt: {} created PREPARING (attempt {})",
                    self.id_name(next),
                    rec.attempt + 1
                ));
            }
            CPc::Collect | CPc::Done | CPc::Crashed => return None,
        }
        Some(())
    }

    fn decide(&self, s: &mut ChainState, ex: Ex, votes: Votes, say: &mut impl FnMut(String)) -> Option<()> {
        let sw = self.cfg.switches;
        let c = s.coords[ex as usize];
        if c.pc != CPc::Collect {
            return None;
        }
        let cur = c.cur.expect("an attempt");
        let name = self.id_name(cur);
        let rec = s.record(cur).expect("created");
        let attempts_left = rec.attempt < self.cfg.max_attempts;
        if votes == Votes::ConflictNoTime && !attempts_left {
            // The same as `Conflict` at the last attempt.
            return None;
        }
        let open = rec.status == Status::Preparing;
        let finish = |s: &mut ChainState, answer: CAnswer, from: Id, token: Option<Id>| {
            let c = &mut s.coords[ex as usize];
            c.said = Some(Said { answer, from: Some(from) });
            c.token = token;
            c.pc = CPc::Done;
        };
        match votes {
            Votes::Prepared => {
                if !open {
                    if rec.by == Some(Decider::Operator) {
                        s.seen |= ChainEvent::CommitLostToOperator.bit();
                    }
                    finish(s, CAnswer::Aborted, cur, None);
                    say(format!(
                        "{name}: every vote PREPARED, but its decision write finds the record {:?} by {:?}: 409",
                        rec.status,
                        rec.by.expect("aborted")
                    ));
                    return Some(());
                }
                let r = s.record_mut(cur).as_mut().expect("read");
                if rec.held {
                    r.status = Status::Prepared;
                    finish(s, CAnswer::Prepared, cur, None);
                    say(format!("{name}: every vote PREPARED: held, PREPARING → PREPARED; 202 PREPARED ({name})"));
                } else {
                    r.status = Status::Committed;
                    finish(s, CAnswer::Committed, cur, None);
                    say(format!("{name}: every vote PREPARED: COMMITTING, driven to COMMITTED; 200"));
                }
            }
            Votes::Conflict | Votes::ConflictNoTime => {
                let retry = votes == Votes::Conflict && attempts_left;
                let next = Self::next_of(&rec);
                if sw.own_refusal_only {
                    if !open {
                        s.seen |= match rec.by {
                            Some(Decider::Caller) => ChainEvent::OwnAbortLostToCaller.bit(),
                            Some(Decider::Operator) => ChainEvent::OwnAbortLostToOperator.bit(),
                            _ => ChainEvent::OwnAbortLostToResolver.bit(),
                        };
                        finish(s, CAnswer::Aborted, cur, None);
                        say(format!(
                            "{name}: refused for contention; its abort (PREPARING → ABORTING{}) loses: the record was \
                             aborted by {:?} first; it follows it: 409, no retry, no age token",
                            if retry { format!(", retriedAs {}", self.id_name(next)) } else { String::new() },
                            rec.by.expect("aborted")
                        ));
                        return Some(());
                    }
                    let r = s.record_mut(cur).as_mut().expect("read");
                    r.status = Status::Aborted;
                    r.by = Some(Decider::Own);
                    r.refused_for_contention = true;
                    if retry {
                        r.retried_as = Some(next);
                        s.coords[ex as usize].pc = CPc::Next;
                        if sw.link_with_record {
                            // The link's record in the same write: it never names an attempt without one.
                            *s.record_mut(next) = Some(self.fresh(ex, rec.attempt + 1, rec.first, Some(cur), None));
                            if ex == FIRST && s.op_said.is_some_and(|a| a.answer == CAnswer::AbortedOk) {
                                s.ghost |= Ghost::BegunAfterOperator.bit();
                            }
                        }
                        say(format!(
                            "{name}: refused for contention; it will retry: PREPARING → ABORTING with \
                             refusedForContention and retriedAs {}{} in one write",
                            self.id_name(next),
                            if sw.link_with_record {
                                format!(", and {} created PREPARING", self.id_name(next))
                            } else {
                                String::new()
                            }
                        ));
                    } else {
                        finish(s, CAnswer::Aborted, cur, Some(cur));
                        say(format!(
                            "{name}: refused for contention, {}: PREPARING → ABORTING with refusedForContention; \
                             409 with an age token",
                            if attempts_left { "no time left" } else { "its last attempt" }
                        ));
                    }
                    return Some(());
                }
                // Before the fix: the abort written (or lost), its own votes folded into the record found.
                if open {
                    let r = s.record_mut(cur).as_mut().expect("read");
                    r.status = Status::Aborted;
                    r.by = Some(Decider::Own);
                } else {
                    s.seen |= match rec.by {
                        Some(Decider::Caller) => ChainEvent::OwnAbortLostToCaller.bit(),
                        Some(Decider::Operator) => ChainEvent::OwnAbortLostToOperator.bit(),
                        _ => ChainEvent::OwnAbortLostToResolver.bit(),
                    };
                }
                let what = if open {
                    "its abort written".to_owned()
                } else {
                    format!(
                        "its abort loses to {:?}'s, its own CONFLICT votes folded into the record found",
                        rec.by.expect("aborted")
                    )
                };
                if retry {
                    s.coords[ex as usize].pc = CPc::Claim;
                    say(format!("{name}: refused for contention; {what}: retryable, it claims a successor next"));
                } else {
                    finish(s, CAnswer::Aborted, cur, Some(cur));
                    say(format!("{name}: refused for contention; {what}: 409 with an age token"));
                }
            }
        }
        Some(())
    }

    fn replay(&self, s: &mut ChainState, key: u8, j: u8, say: &mut impl FnMut(String)) -> Option<()> {
        if j >= self.cfg.replays {
            return None;
        }
        // The replays of a key are alike: the second is sent once the first was (one order of the two).
        if j == 1 && s.replays[key as usize][0] == RPc::Idle {
            return None;
        }
        let j = j as usize;
        let sw = self.cfg.switches;
        let ki = key as usize;
        let first = Id { ns: key, n: 1 };
        let (id, body) = match s.replays[ki][j] {
            RPc::Idle => {
                // Sent once its request was: K1's once its record exists, K2's by the token retry's caller.
                let sent = if key == 0 {
                    s.record(first).is_some()
                } else {
                    self.cfg.token_retry && s.coords[TOKEN_RETRY as usize].pc != CPc::Idle
                };
                if !sent {
                    return None;
                }
                match s.record(first) {
                    None => return None,
                    Some(rec) if rec.body != Body::X => {
                        s.replays[ki][j] = RPc::Answered(Said { answer: CAnswer::KeyReused, from: Some(first) });
                        say(format!("the replay of {} finds another body's record: 422", KEYS[ki]));
                        return Some(());
                    }
                    Some(_) => (first, Body::X),
                }
            }
            RPc::At(id) => (id, Body::X),
            RPc::Answered(_) => return None,
        };
        let name = self.id_name(id);
        let Some(rec) = s.record(id) else {
            // `attempt_named`: a link to no record is fenced, then followed: 409.
            self.fence(s, id, body);
            s.replays[ki][j] = RPc::Answered(Said { answer: CAnswer::Aborted, from: Some(id) });
            say(format!(
                "the replay of {} finds no record of {name}, named by a link: it fences it (ABORTED) and answers 409",
                KEYS[ki]
            ));
            return Some(());
        };
        let answer = match rec.status {
            Status::Preparing => return None,
            Status::Prepared => CAnswer::Prepared,
            Status::Committing | Status::Committed => CAnswer::Committed,
            _ => {
                if let Some(next) = self.link(&rec) {
                    s.replays[ki][j] = RPc::At(next);
                    s.seen |= ChainEvent::ReplayFollowed.bit();
                    say(format!(
                        "the replay of {} finds {name} ABORTED, retriedAs {}: it follows it",
                        KEYS[ki],
                        self.id_name(next)
                    ));
                    return Some(());
                }
                // Before rule A a coordinator links its next attempt after its abort: an attempt refused for
                // contention with attempts left may still be linked (`may_be_retried`). The replay waits, and
                // its budget may run out first: the next attempt's id is fenced (the age model checks this
                // wait; here it ends at once). With rule A the link comes with the abort, so none is waited for.
                let next = Self::next_of(&rec);
                if !sw.own_refusal_only
                    && rec.by == Some(Decider::Own)
                    && rec.attempt < self.cfg.max_attempts
                    && s.record(next).is_none()
                {
                    self.fence(s, next, body);
                    say(format!(
                        "the replay of {} waited at {name} for a link; its budget runs out: it fences {}",
                        KEYS[ki],
                        self.id_name(next)
                    ));
                }
                CAnswer::Aborted
            }
        };
        let said = Said { answer, from: Some(id) };
        s.replays[ki][j] = RPc::Answered(said);
        say(format!("the replay of {} finds {name} {:?}: {answer:?}", KEYS[ki], rec.status));
        Some(())
    }

    /// The caller's commit or abort, its first step: the read of the addressed attempt and the chain followed
    /// from it (`decide_held` → `live_attempt`: a link to no record fenced). An abort's read of a PREPARING
    /// attempt is left for the route's write ([`ChainAction::RouteWrite`], conditional on PREPARING); a
    /// PREPARED one is written in this step (see below); a decided one answers at once.
    fn route(&self, s: &mut ChainState, commit: bool, target: Target, say: &mut impl FnMut(String)) -> Option<()> {
        let ri = if commit { 0 } else { 1 };
        if !self.cfg.routes || s.routes[ri].is_some() || s.route_reads[ri].is_some() {
            return None;
        }
        let what = if commit { "commit" } else { "abort" };
        let id = match target {
            Target::First => {
                let first = Id { ns: 0, n: 1 };
                s.record(first)?;
                first
            }
            Target::Answered => match s.coords[FIRST as usize].said {
                Some(Said { answer: CAnswer::Prepared, from }) => from.expect("named"),
                _ => return None,
            },
        };
        let (id, hops) = self.follow(s, id);
        let rec = s.record(id).expect("read");
        // 503 "still preparing": nothing written, no step.
        if rec.held && commit && rec.status == Status::Preparing {
            return None;
        }
        let then = self.route_settle(s, commit, id, 0);
        let write_now = s.route_reads[ri].is_some_and(|r| r.status == Status::Prepared);
        say(format!(
            "the caller's {what} of the held request, sent to {}{}: reads {} {:?}{}",
            match target {
                Target::First => "the first id",
                Target::Answered => "the id its POST answered",
            },
            hops,
            self.id_name(id),
            rec.status,
            then,
        ));
        // A write conditional on PREPARED (every commit's, an abort's of a PREPARED attempt) is taken with
        // its read, in one step: nothing that moves a PREPARED record names a next attempt (only the
        // coordinator's abort of a PREPARING one does), so such a write, lost, finds a decided record without
        // a link and answers what one step at the moment of its write answers (the links its read followed
        // are written once and never change). Only an abort's read of a PREPARING attempt is a step apart.
        if write_now {
            self.route_write(s, commit, say)?;
        }
        Some(())
    }

    /// `live_attempt`: the chain followed from `id` (with [`ChainSwitches::routes_follow_chain`]), a link to
    /// no record fenced (with [`ChainSwitches::routes_fence_successor`]); the attempt reached, and the hops
    /// for the trace.
    fn follow(&self, s: &mut ChainState, id: Id) -> (Id, String) {
        let sw = self.cfg.switches;
        let (id, hops, fenced) = self.live_attempt(s, id, sw.routes_follow_chain, sw.routes_fence_successor);
        if fenced {
            s.seen |= ChainEvent::RouteFenced.bit();
        }
        if !hops.is_empty() {
            s.seen |= ChainEvent::RouteFollowed.bit();
        }
        (id, Self::hops_said(&hops, fenced))
    }

    /// `live_attempt` for an abort: `retriedAs` followed from `id` (if `follow`), a link to no record fenced
    /// (if `fence`; else the chain stops before it); the attempt reached, the ids it hopped to, and whether
    /// it fenced one.
    fn live_attempt(&self, s: &mut ChainState, mut id: Id, follow: bool, fence: bool) -> (Id, Vec<String>, bool) {
        let mut hops = vec![];
        let mut fenced = false;
        if follow {
            while let Some(next) = s.record(id).and_then(|r| self.link(&r)) {
                if s.record(next).is_none() && !fence {
                    break;
                }
                hops.push(self.id_name(next));
                id = next;
                if s.record(id).is_none() {
                    self.fence(s, id, Body::X);
                    fenced = true;
                }
            }
        }
        (id, hops, fenced)
    }

    fn hops_said(hops: &[String], fenced: bool) -> String {
        if hops.is_empty() {
            String::new()
        } else {
            format!(", follows retriedAs to {}{}", hops.join(", "), if fenced { " (no record: fenced)" } else { "" })
        }
    }

    /// What a route does with the attempt `id` it has read (after `lost` lost writes): not held → 409
    /// NOT_HELD; PREPARED (or PREPARING, for an abort) → its write comes next, conditional on that status,
    /// while it has writes left, else (and a commit of a PREPARING one) a non-final answer (503, or 202 as a
    /// retried POST is told): the caller may send it again; decided → its final answer. The trace's words.
    fn route_settle(&self, s: &mut ChainState, commit: bool, id: Id, lost: u8) -> String {
        let ri = if commit { 0 } else { 1 };
        let rec = s.record(id).expect("read");
        s.route_reads[ri] = None;
        let answer = if !rec.held {
            CAnswer::NotHeld
        } else {
            match (rec.status, commit) {
                (Status::Preparing, true) => {
                    return ": 503, still preparing (the caller may send it again)".to_owned();
                }
                (Status::Preparing | Status::Prepared, _) if lost > ROUTE_RETRIES => {
                    return format!(
                        ": its {} writes lost, not decided yet: a non-final answer (the caller may send it again)",
                        lost
                    );
                }
                (Status::Preparing | Status::Prepared, _) => {
                    s.route_reads[ri] = Some(RouteRead { at: id, status: rec.status, lost });
                    return format!(": its write is conditional on {:?}", rec.status);
                }
                (Status::Committing | Status::Committed, true) => CAnswer::Committed,
                (Status::Committing | Status::Committed, false) => CAnswer::WasCommitted,
                (_, true) => CAnswer::Aborted,
                (_, false) => CAnswer::AbortedOk,
            }
        };
        s.routes[ri] = Some(Said { answer, from: Some(id) });
        format!(": {answer:?}")
    }

    /// The caller's commit or abort, its second step: its decision written on the attempt it read,
    /// conditionally on the status it read (`write_held_decision`): abort of PREPARING or PREPARED →
    /// ABORTING (200 ABORTED), commit of PREPARED → COMMITTING (200). Lost (the record moved on since the
    /// read: the coordinator's PREPARED or its own abort naming the next attempt, a resolver, the other
    /// route), it takes the record found; with [`ChainSwitches::route_refollows_after_lost_write`] it follows
    /// the chain from it again (`live_attempt`, fencing a named attempt without a record) and tries again on
    /// the attempt that lives; without, it goes on from the record found at the attempt it read (the code
    /// before the fix).
    fn route_write(&self, s: &mut ChainState, commit: bool, say: &mut impl FnMut(String)) -> Option<()> {
        let sw = self.cfg.switches;
        let ri = if commit { 0 } else { 1 };
        let read = s.route_reads[ri]?;
        let what = if commit { "commit" } else { "abort" };
        let name = self.id_name(read.at);
        let rec = s.record(read.at).expect("read");
        if rec.status == read.status {
            let r = s.record_mut(read.at).as_mut().expect("read");
            let answer = if commit {
                r.status = Status::Committed;
                CAnswer::Committed
            } else {
                r.status = Status::Aborted;
                r.by = Some(Decider::Caller);
                CAnswer::AbortedOk
            };
            s.route_reads[ri] = None;
            s.routes[ri] = Some(Said { answer, from: Some(read.at) });
            say(format!(
                "the caller's {what} writes {name} {:?} → {}: {answer:?}",
                read.status,
                if commit { "COMMITTING" } else { "ABORTING" }
            ));
            return Some(());
        }
        s.seen |= ChainEvent::RouteWriteLost.bit();
        let found = format!(
            "{:?}{}{}",
            rec.status,
            rec.by.map(|b| format!(" by {b:?}")).unwrap_or_default(),
            rec.retried_as.map(|l| format!(", retriedAs {}", self.id_name(l))).unwrap_or_default()
        );
        let (id, hops) = if sw.route_refollows_after_lost_write {
            let (id, hops) = self.follow(s, read.at);
            if id != read.at {
                s.seen |= ChainEvent::RouteRefollowed.bit();
            }
            (id, if hops.is_empty() { hops } else { format!(", it follows the chain again{hops}") })
        } else {
            (read.at, String::new())
        };
        let status = s.record(id).expect("read").status;
        let then = self.route_settle(s, commit, id, read.lost + 1);
        say(format!(
            "the caller's {what}'s write to {name} (expects {:?}) loses: {name} is {found}{hops}; {} is {status:?}{then}",
            read.status,
            self.id_name(id),
        ));
        // A write conditional on PREPARED: in the step of its read, as in `route`.
        if s.route_reads[ri].is_some_and(|r| r.status == Status::Prepared) {
            self.route_write(s, commit, say)?;
        }
        Some(())
    }

    /// Issue 47, the operator's abort (`admin.rs`, `abort`), its first step: the read of K1-`at` (no record:
    /// 404, nothing written, no step) and the chain followed from it (`live_attempt`, a named attempt without
    /// a record fenced), held or not. PREPARING → its write is a later step ([`ChainAction::OperatorWrite`]);
    /// PREPARED → written in this step (as the caller's: nothing that moves a PREPARED record names a next
    /// attempt); decided → answered at once (COMMITTED: 409 with the committed body; aborted: 200).
    fn operator(&self, s: &mut ChainState, at: u8, say: &mut impl FnMut(String)) -> Option<()> {
        if !self.cfg.operator || s.op_said.is_some() || s.op_read.is_some() {
            return None;
        }
        // An attempt of K1's request (the token retry's attempts are named after K1 too: another request's).
        let sent = Id { ns: 0, n: at };
        if s.record(sent)?.ex != Some(FIRST) {
            return None;
        }
        let (id, hops) = self.operator_follow(s, sent);
        let status = s.record(id).expect("read").status;
        let then = self.operator_settle(s, id, 0);
        say(format!(
            "an operator aborts K1's request, sent to {}{hops}: reads {} {status:?}{then}",
            self.id_name(sent),
            self.id_name(id)
        ));
        if s.op_read.is_some_and(|r| r.status == Status::Prepared) {
            self.operator_write(s, say)?;
        }
        Some(())
    }

    /// The operator's `live_attempt` from `id` (with [`ChainSwitches::operator_follows_chain`]).
    fn operator_follow(&self, s: &mut ChainState, id: Id) -> (Id, String) {
        let follow = self.cfg.switches.operator_follows_chain;
        let (live, hops, fenced) = self.live_attempt(s, id, follow, true);
        if fenced {
            s.seen |= ChainEvent::OperatorFenced.bit();
        }
        if !hops.is_empty() {
            s.seen |= ChainEvent::OperatorFollowed.bit();
        }
        (live, Self::hops_said(&hops, fenced))
    }

    /// What the operator's abort does with the attempt `id` it has read (after `lost` lost writes): PREPARING
    /// or PREPARED → its write next, conditional on that status, while it has writes left (else a non-final
    /// answer, 503: the operator may send it again); COMMITTED → 409 with the committed body; aborted → 200.
    fn operator_settle(&self, s: &mut ChainState, id: Id, lost: u8) -> String {
        let rec = s.record(id).expect("read");
        s.op_read = None;
        let answer = match rec.status {
            Status::Preparing | Status::Prepared if lost > OPERATOR_RETRIES => {
                s.op_said = Some(Said { answer: CAnswer::Unavailable, from: Some(id) });
                return format!(": its {lost} writes lost, not decided yet: 503 (the operator may send it again)");
            }
            Status::Preparing | Status::Prepared => {
                s.op_read = Some(RouteRead { at: id, status: rec.status, lost });
                return format!(": its write is conditional on {:?}", rec.status);
            }
            Status::Committing | Status::Committed => CAnswer::WasCommitted,
            _ => CAnswer::AbortedOk,
        };
        s.op_said = Some(Said { answer, from: Some(id) });
        format!(": {answer:?}")
    }

    /// The operator's abort, its write (`admin.rs`: `transition` status read → ABORTING, reason "aborted by
    /// an operator", no `refusedForContention`, no `retriedAs`), conditional on the status it read
    /// ([`ChainSwitches::operator_writes_conditionally`]). Won: 200 ABORTED (its second phase folded). Lost
    /// (its coordinator's commit or PREPARED, its contention abort naming the next attempt, a resolver, the
    /// caller's route): from the record found, `live_attempt` again and the write again on the attempt that
    /// lives, up to [`OPERATOR_RETRIES`] more times.
    fn operator_write(&self, s: &mut ChainState, say: &mut impl FnMut(String)) -> Option<()> {
        let sw = self.cfg.switches;
        let read = s.op_read?;
        let name = self.id_name(read.at);
        let rec = s.record(read.at).expect("read");
        if rec.status == read.status || !sw.operator_writes_conditionally {
            if rec.status.commit() {
                s.ghost |= Ghost::TwoDecisions.bit();
            }
            if rec.status == Status::Prepared {
                s.seen |= ChainEvent::OperatorAbortedHeld.bit();
            }
            let r = s.record_mut(read.at).as_mut().expect("read");
            r.status = Status::Aborted;
            r.by = Some(Decider::Operator);
            s.op_read = None;
            s.op_said = Some(Said { answer: CAnswer::AbortedOk, from: Some(read.at) });
            say(format!(
                "the operator's abort writes {name} {:?} → ABORTING{} (aborted by an operator): 200 ABORTED",
                rec.status,
                if sw.operator_writes_conditionally { "" } else { ", unconditionally" }
            ));
            return Some(());
        }
        s.seen |= ChainEvent::OperatorWriteLost.bit();
        let found = format!(
            "{:?}{}{}",
            rec.status,
            rec.by.map(|b| format!(" by {b:?}")).unwrap_or_default(),
            rec.retried_as.map(|l| format!(", retriedAs {}", self.id_name(l))).unwrap_or_default()
        );
        let (id, hops) = self.operator_follow(s, read.at);
        if id != read.at {
            s.seen |= ChainEvent::OperatorRefollowed.bit();
        }
        let status = s.record(id).expect("read").status;
        let then = self.operator_settle(s, id, read.lost + 1);
        say(format!(
            "the operator's write to {name} (expects {:?}) loses: {name} is {found}{hops}; {} is {status:?}{then}",
            read.status,
            self.id_name(id),
        ));
        if s.op_read.is_some_and(|r| r.status == Status::Prepared) {
            self.operator_write(s, say)?;
        }
        Some(())
    }

    /// `always` [`OPERATOR_ENDS`]: an attempt an operator aborted names no successor, claims no refusal for
    /// contention (no token retry may claim it), and no attempt was created to follow it; and no attempt of
    /// K1's request was created after the operator's 200 ABORTED.
    pub fn operator_ends_request(&self, s: &ChainState) -> bool {
        !s.has(Ghost::BegunAfterOperator)
            && s.all_records().filter(|(_, r)| r.by == Some(Decider::Operator)).all(|(id, r)| {
                r.retried_as.is_none() && !r.refused_for_contention && s.all_records().all(|(_, t)| t.pred != Some(id))
            })
    }

    /// Every request ended, every replay answered, every record decided.
    pub fn ended(&self, s: &ChainState) -> bool {
        (0..3).all(|e| {
            matches!(s.coords[e].pc, CPc::Done | CPc::Crashed)
                || (s.coords[e].pc == CPc::Idle && !self.could_start(s, e as Ex))
        }) && s.replays.iter().flatten().all(|r| !matches!(r, RPc::At(_)))
            && s.op_read.is_none()
            && s.all_records().all(|(_, r)| !matches!(r.status, Status::Preparing | Status::Prepared))
            // A request ends at an attempt with a record: one named but never begun leaves its request
            // without an outcome (nothing announces it, no record says it ended).
            && s.all_records().all(|(_, r)| self.link(&r).is_none_or(|next| s.record(next).is_some()))
    }

    fn could_start(&self, s: &ChainState, ex: Ex) -> bool {
        self.enabled(ex) && (ex != TOKEN_RETRY || self.token_ready(s))
    }

    /// `always` [`OWN_REFUSAL`]: every attempt created to follow another (a coordinator's next attempt, a
    /// token retry) follows an abort written by that attempt's own coordinator for its refusal.
    pub fn follows_own_refusals(&self, s: &ChainState) -> bool {
        s.all_records().all(|(_, r)| r.pred.is_none_or(|p| s.record(p).is_some_and(|p| p.by == Some(Decider::Own))))
    }

    /// `always` [`LINKS`]: a `retriedAs` or `ageClaimedBy` names an attempt not created yet, a fence, or the
    /// attempt created to follow this one, of its body.
    pub fn links_well_formed(&self, s: &ChainState) -> bool {
        s.all_records().all(|(id, r)| {
            [r.retried_as, r.age_claimed_by]
                .into_iter()
                .flatten()
                .all(|l| s.record(l).is_none_or(|t| t.fenced() || (t.pred == Some(id) && t.body == r.body)))
        })
    }
}

fn seen<const E: u32>(_: &ChainModel, s: &ChainState) -> bool {
    s.seen & (1 << E) != 0
}

impl Model for ChainModel {
    type State = ChainState;
    type Action = ChainAction;

    fn init_states(&self) -> Vec<ChainState> {
        let m = self.cfg.max_attempts as usize;
        let idle = CCoord { pc: CPc::Idle, cur: None, said: None, token: None };
        vec![ChainState {
            // K1's chain, and the token retry's successors, which are named after K1 (`<first>-<n>`, up to
            // `MAX_ATTEMPTS`, a fence one past it); K2's.
            records: [vec![None; m + 1], vec![None; m + 1]],
            coords: [idle; 3],
            replays: [[RPc::Idle; 2]; 2],
            routes: [None; 2],
            route_reads: [None; 2],
            op_read: None,
            op_said: None,
            ghost: 0,
            budget: self.cfg.budget,
            seen: 0,
        }]
    }

    fn actions(&self, s: &ChainState, out: &mut Vec<ChainAction>) {
        for ex in 0..3 {
            match s.coords[ex as usize].pc {
                CPc::Idle => {
                    out.push(ChainAction::Coord(ex));
                    out.push(ChainAction::WriteFails(ex));
                }
                CPc::Create => {
                    out.push(ChainAction::Coord(ex));
                    out.push(ChainAction::WriteFails(ex));
                }
                CPc::Collect => {
                    out.push(ChainAction::Decide(ex, Votes::Prepared));
                    out.push(ChainAction::Decide(ex, Votes::Conflict));
                    out.push(ChainAction::Decide(ex, Votes::ConflictNoTime));
                }
                CPc::Claim => out.push(ChainAction::Coord(ex)),
                CPc::Next => {
                    out.push(ChainAction::Coord(ex));
                    out.push(ChainAction::Crash(ex));
                }
                CPc::Done | CPc::Crashed => {}
            }
        }
        for key in 0..2 {
            for j in 0..self.cfg.replays.min(2) {
                out.push(ChainAction::Replay(key, j));
            }
        }
        for commit in [true, false] {
            out.push(ChainAction::Route(commit, Target::First));
            out.push(ChainAction::Route(commit, Target::Answered));
        }
        out.push(ChainAction::RouteWrite(false));
        if self.cfg.operator {
            for n in 1..=self.cfg.max_attempts {
                out.push(ChainAction::Operator(n));
            }
            out.push(ChainAction::OperatorWrite);
        }
        for (id, r) in s.all_records() {
            if matches!(r.status, Status::Preparing | Status::Prepared) {
                out.push(ChainAction::Expire(id));
            }
        }
    }

    fn next_state(&self, s: &ChainState, action: ChainAction) -> Option<ChainState> {
        self.apply(s, action, false).map(|(n, _)| n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let cfg = &self.cfg;
        let sw = cfg.switches;
        let b = cfg.budget;
        let mut p = vec![
            Property::<Self>::always(KEY_ANSWERS, |_, s| {
                (0..2).all(|k| {
                    let outcomes: Vec<bool> = s.key_answers(k).iter().filter_map(|a| a.answer.outcome()).collect();
                    outcomes.windows(2).all(|w| w[0] == w[1])
                })
            }),
            Property::<Self>::always(OWN_REFUSAL, |m, s| m.follows_own_refusals(s)),
            Property::<Self>::always(OWN_OUTCOME, |_, s| {
                (0..3).all(|e| {
                    s.request_answers(e).iter().all(|a| match a.answer.outcome() {
                        Some(true) => s.all_records().any(|(_, r)| r.ex == Some(e) && r.status == Status::Committed),
                        Some(false) => !s.request_commits(e),
                        None => true,
                    })
                })
            }),
            Property::<Self>::always(OWN_BODY, |_, s| {
                (0..3).all(|e| {
                    s.request_answers(e).iter().all(|a| {
                        a.answer.outcome().is_none()
                            || a.from.and_then(|f| s.record(f)).is_none_or(|r| r.body == ChainModel::body_of(e))
                    })
                })
            }),
            Property::<Self>::always(LINKS, |m, s| m.links_well_formed(s)),
            Property::<Self>::always("at most one attempt of a request commits", |_, s| {
                (0..3).all(|e| s.all_records().filter(|(_, r)| r.ex == Some(e) && r.status.commit()).count() <= 1)
            }),
            Property::<Self>::always(DECISIONS, |_, s| !s.has(Ghost::TwoDecisions)),
            Property::<Self>::eventually(ALL_END, |m, s| m.ended(s)),
            Property::<Self>::sometimes("sometimes an attempt after a retry commits", |_, s| {
                s.all_records().any(|(_, r)| r.pred.is_some() && r.age_of.is_none() && r.status == Status::Committed)
            }),
            Property::<Self>::sometimes("sometimes a coordinator links its next attempt in its own abort", |_, s| {
                s.all_records().any(|(_, r)| r.by == Some(Decider::Own) && r.retried_as.is_some())
            }),
        ];
        if cfg.replays > 0 {
            p.push(Property::<Self>::sometimes(
                "sometimes a replay follows retriedAs",
                seen::<{ ChainEvent::ReplayFollowed as u32 }>,
            ));
            p.push(Property::<Self>::sometimes("sometimes a replay answers a commit made after a retry", |_, s| {
                s.replays[0].iter().any(|r| {
                    matches!(r, RPc::Answered(Said { answer: CAnswer::Committed, from: Some(Id { n: 2.., .. }) }))
                })
            }));
        }
        // A link to no record exists only when the link and the record are two writes.
        let window = !(sw.link_with_record && sw.own_refusal_only);
        if cfg.replays > 0 && window {
            p.push(Property::<Self>::sometimes(
                "sometimes a link to no record is fenced",
                seen::<{ ChainEvent::Fenced as u32 }>,
            ));
        }
        if b.crash > 0 && !window {
            p.push(Property::<Self>::sometimes(
                "sometimes the sweeper aborts an attempt its stopped coordinator created with the link",
                seen::<{ ChainEvent::AbandonedAborted as u32 }>,
            ));
        }
        if !window && (b.resolver > 0 || cfg.routes || cfg.operator) {
            p.push(Property::<Self>::sometimes(
                "sometimes a coordinator finds the attempt it created decided before it began, and stops",
                seen::<{ ChainEvent::LateCoordinatorStopped as u32 }>,
            ));
        }
        if b.resolver > 0 {
            p.push(Property::<Self>::sometimes(
                "sometimes a resolver aborts an attempt first and its coordinator's abort loses",
                seen::<{ ChainEvent::OwnAbortLostToResolver as u32 }>,
            ));
        }
        if cfg.held {
            p.push(Property::<Self>::sometimes("sometimes a hold expires", seen::<{ ChainEvent::HoldExpired as u32 }>));
        }
        if cfg.routes {
            p.push(Property::<Self>::sometimes(
                "sometimes the caller's abort of an attempt still preparing wins over its coordinator's refusal",
                seen::<{ ChainEvent::OwnAbortLostToCaller as u32 }>,
            ));
            p.push(Property::<Self>::sometimes("sometimes the caller commits a held attempt after a retry", |_, s| {
                matches!(s.routes[0], Some(Said { answer: CAnswer::Committed, from: Some(Id { n: 2.., .. }) }))
            }));
            p.push(Property::<Self>::sometimes("sometimes the caller's abort is answered 409: committed", |_, s| {
                matches!(s.routes[1], Some(Said { answer: CAnswer::WasCommitted, .. }))
            }));
            if sw.routes_follow_chain {
                p.push(Property::<Self>::sometimes(
                    "sometimes the caller's commit or abort follows retriedAs",
                    seen::<{ ChainEvent::RouteFollowed as u32 }>,
                ));
            }
            if sw.routes_follow_chain && sw.routes_fence_successor && window {
                p.push(Property::<Self>::sometimes(
                    "sometimes the caller's commit or abort fences a linked attempt without a record",
                    seen::<{ ChainEvent::RouteFenced as u32 }>,
                ));
            }
            p.push(Property::<Self>::sometimes(
                "sometimes the caller's commit or abort loses its write",
                seen::<{ ChainEvent::RouteWriteLost as u32 }>,
            ));
            if sw.routes_follow_chain && sw.route_refollows_after_lost_write {
                p.push(Property::<Self>::sometimes(
                    "sometimes the caller's commit or abort loses its write and follows the chain again",
                    seen::<{ ChainEvent::RouteRefollowed as u32 }>,
                ));
            }
        }
        if cfg.operator {
            p.push(Property::<Self>::always(OPERATOR_ENDS, |m, s| m.operator_ends_request(s)));
            let won_over = if cfg.held {
                "sometimes the operator's abort wins over its coordinator's PREPARED write"
            } else {
                "sometimes the operator's abort wins over its coordinator's commit"
            };
            p.push(Property::<Self>::sometimes(won_over, seen::<{ ChainEvent::CommitLostToOperator as u32 }>));
            p.push(Property::<Self>::sometimes(
                "sometimes the operator's abort wins over its coordinator's contention abort (no retry)",
                seen::<{ ChainEvent::OwnAbortLostToOperator as u32 }>,
            ));
            p.push(Property::<Self>::sometimes(
                "sometimes the operator's write loses",
                seen::<{ ChainEvent::OperatorWriteLost as u32 }>,
            ));
            p.push(Property::<Self>::sometimes("sometimes the operator's abort is answered 409: committed", |_, s| {
                matches!(s.op_said, Some(Said { answer: CAnswer::WasCommitted, .. }))
            }));
            p.push(Property::<Self>::sometimes(
                "sometimes the operator's abort aborts an attempt after a retry",
                |_, s| s.all_records().any(|(id, r)| id.n > 1 && r.ex.is_some() && r.by == Some(Decider::Operator)),
            ));
            if sw.operator_follows_chain {
                p.push(Property::<Self>::sometimes(
                    "sometimes the operator's abort follows retriedAs",
                    seen::<{ ChainEvent::OperatorFollowed as u32 }>,
                ));
                if window {
                    p.push(Property::<Self>::sometimes(
                        "sometimes the operator's abort fences a linked attempt without a record",
                        seen::<{ ChainEvent::OperatorFenced as u32 }>,
                    ));
                }
                p.push(Property::<Self>::sometimes(
                    "sometimes the operator's write loses to the contention abort and follows the chain again",
                    seen::<{ ChainEvent::OperatorRefollowed as u32 }>,
                ));
            }
            if cfg.held {
                p.push(Property::<Self>::sometimes(
                    "sometimes the operator aborts a held PREPARED attempt",
                    seen::<{ ChainEvent::OperatorAbortedHeld as u32 }>,
                ));
            }
        }
        if cfg.token_retry {
            p.push(Property::<Self>::sometimes("sometimes a token retry commits (or, held, is PREPARED)", |_, s| {
                s.token_retry_ran()
            }));
            if cfg.replays > 0 {
                p.push(Property::<Self>::sometimes(
                    "sometimes a key's replay answers 409 while its token retry, under another key, commits (or is held)",
                    |_, s| {
                        s.replays[0].iter().any(|r| matches!(r, RPc::Answered(Said { answer: CAnswer::Aborted, .. })))
                            && s.token_retry_ran()
                    },
                ));
            }
            if b.write_fails > 0 {
                p.push(Property::<Self>::sometimes(
                    "sometimes the token retry's write fails",
                    seen::<{ ChainEvent::WriteFailed as u32 }>,
                ));
            }
        }
        if cfg.token_retry && cfg.other_body {
            p.push(Property::<Self>::sometimes(
                "sometimes a key is found taken by another body: 422",
                seen::<{ ChainEvent::KeyTaken as u32 }>,
            ));
        }
        p
    }

    fn format_action(&self, action: &ChainAction) -> String {
        format!("{action:?}")
    }
}

/// What one exhaustive check of the chain model found ([`check`]).
pub type ChainRun = Run<ChainModel>;

impl Traced for ChainModel {
    fn heading(&self) -> String {
        let cfg = &self.cfg;
        let sw = cfg.switches;
        let off = crate::report::switched_off(&[
            ("own_refusal_only", sw.own_refusal_only),
            ("routes_follow_chain", sw.routes_follow_chain),
            ("routes_fence_successor", sw.routes_fence_successor),
            ("route_refollows_after_lost_write", sw.route_refollows_after_lost_write),
            ("atomic_token_claim", sw.atomic_token_claim),
            ("token_links_apart", sw.token_links_apart),
            ("operator_follows_chain", sw.operator_follows_chain),
            ("operator_writes_conditionally", sw.operator_writes_conditionally),
            ("link_with_record", sw.link_with_record),
        ]);
        let b = cfg.budget;
        format!(
            "chain model {:?} ({}; MAX_ATTEMPTS {}; operator's abort {}; faults: crash {} token write fails {} resolver racing a slow coordinator {})",
            cfg.name,
            if off.is_empty() { "the fixed protocol".to_owned() } else { format!("OFF: {}", off.join(", ")) },
            cfg.max_attempts,
            if cfg.operator { "on" } else { "off" },
            b.crash,
            b.write_fails,
            b.resolver,
        )
    }

    fn explain(&self, s: &ChainState, action: ChainAction) -> Option<Vec<String>> {
        self.apply(s, action, true).map(|(_, lines)| lines)
    }

    /// One line: records, answers.
    fn summary(&self, s: &ChainState) -> String {
        let records: Vec<String> = s
            .all_records()
            .map(|(id, r)| {
                format!(
                    "{} {:?}{}{}{}{}{}",
                    self.id_name(id),
                    r.status,
                    r.by.map(|b| format!(" by {b:?}")).unwrap_or_default(),
                    if r.body == Body::Y { " body Y" } else { "" },
                    r.retried_as.map(|l| format!(" retriedAs→{}", self.id_name(l))).unwrap_or_default(),
                    r.age_claimed_by.map(|l| format!(" ageClaimedBy→{}", self.id_name(l))).unwrap_or_default(),
                    r.age_of.map(|l| format!(" ageOf→{}", self.id_name(l))).unwrap_or_default(),
                )
            })
            .collect();
        let said = |a: Option<Said>| a.map_or("-".to_owned(), |a| format!("{:?}", a.answer));
        let answers: Vec<String> =
            (0..3).map(|e| format!("{} {}", self.req_name(e), said(s.coords[e as usize].said))).collect();
        let replays: Vec<String> = (0..2)
            .flat_map(|k| (0..self.cfg.replays as usize).map(move |j| (k, j)))
            .map(|(k, j)| match s.replays[k][j] {
                RPc::Answered(a) => format!("replay {} {:?}", KEYS[k], a.answer),
                _ => format!("replay {} -", KEYS[k]),
            })
            .collect();
        let route = |k: usize| match (s.routes[k], s.route_reads[k]) {
            (Some(a), _) => format!("{:?}", a.answer),
            (None, Some(r)) => format!("read {} {:?}, its write next", self.id_name(r.at), r.status),
            (None, None) => "-".to_owned(),
        };
        let operator = match (s.op_said, s.op_read) {
            (Some(a), _) => format!("; operator {:?}", a.answer),
            (None, Some(r)) => format!("; operator read {} {:?}, its write next", self.id_name(r.at), r.status),
            (None, None) if self.cfg.operator => "; operator -".to_owned(),
            (None, None) => String::new(),
        };
        format!(
            "records [{}]; [{}]; [{}]; commit {}, abort {}{operator}",
            records.join(", "),
            answers.join(", "),
            replays.join(", "),
            route(0),
            route(1)
        )
    }
}
