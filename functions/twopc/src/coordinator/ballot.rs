//! The participants' votes as the decision reads them. A record keeps each participant's answer in flat
//! fields (`vote`, `code`, `blockedBy`...); [`Ballot`] is what they mean, so that every rule the phase
//! engine and the attempts apply (commit or abort, is it contention, may it be retried) is a match on one
//! type. (Named apart from the participant library's `Prepared` and `Refusal`, which a participant
//! answers with.)

use tracing::warn;

use crate::invoke::InvokeError;
use crate::model::{ParticipantResponse, RefusalCode, Vote};
use crate::record::ParticipantEntry;

/// One participant's answer to a prepare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ballot<'a> {
    /// Prepared: its locks are held until the decision (none where it only reads).
    Yes,
    /// Refused because another transaction's lock is in the way: that transaction, when the participant
    /// named it, and `expired_owner` when the lock's owner is past its deadline and this coordinator left
    /// it unresolved (no record: the sweeper's; or its resolution failed): no retry can wait it out.
    Conflict { blocker: Option<&'a str>, expired_owner: Option<&'a str> },
    /// Refused for any other reason, or no answer (TIMEOUT, UNAVAILABLE): its code, none when a
    /// participant refused without one.
    No(Option<RefusalCode>),
    /// Not asked: a retry's one-at-a-time prepares stop at the first refusal.
    Unasked,
}

impl<'a> Ballot<'a> {
    pub fn of(entry: &'a ParticipantEntry) -> Ballot<'a> {
        match (entry.vote, entry.code) {
            (Some(Vote::Prepared), _) => Ballot::Yes,
            (_, Some(RefusalCode::Conflict)) => Ballot::Conflict {
                blocker: entry.blocked_by.as_deref(),
                expired_owner: entry.unresolved_owner.as_deref(),
            },
            (None, None) => Ballot::Unasked,
            (_, code) => Ballot::No(code),
        }
    }

    /// Not in a retry's way: prepared, refused for contention, or not asked.
    fn leaves_room_for_a_retry(self) -> bool {
        matches!(self, Ballot::Yes | Ballot::Conflict { .. } | Ballot::Unasked)
    }
}

fn ballots(votes: &[ParticipantEntry]) -> impl Iterator<Item = Ballot<'_>> {
    votes.iter().map(Ballot::of)
}

/// What the votes decide, when the deadline allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Commit,
    /// With the reason the record keeps.
    Abort(String),
}

/// The rules over a transaction's votes (its participants, as prepare left them).
pub trait Votes {
    /// Commit when every participant prepared in time; else abort, saying why.
    fn verdict(&self, in_time: bool) -> Verdict;
    /// Where a lock refused the attempt, and whose lock it was: the first conflict that named its blocker.
    fn blocked(&self) -> Option<(usize, &str)>;
    /// Refused for contention and nothing else, so a later attempt that keeps the request's age may
    /// prepare: at least one conflict, every other participant prepared or not asked, and no lock whose
    /// owner only the sweeper can resolve (the refusal is then the answer, not a burst of attempts until
    /// its next run).
    fn retryable(&self) -> bool;
    /// Refused for contention only: conflicts, or TIMEOUT (an older transaction that waited for a younger
    /// one's lock as long as its deadline allowed), or the deadline passed while every participant
    /// prepared. An age token carries such a request's age to the caller's retry.
    fn refused_for_contention(&self) -> bool;
    /// The abort's reason: each participant that did not prepare, with its own.
    fn abort_reason(&self) -> String;
}

impl Votes for [ParticipantEntry] {
    fn verdict(&self, in_time: bool) -> Verdict {
        match (ballots(self).all(|b| b == Ballot::Yes), in_time) {
            (true, true) => Verdict::Commit,
            (true, false) => Verdict::Abort("the deadline passed before every participant prepared".to_owned()),
            (false, _) => Verdict::Abort(self.abort_reason()),
        }
    }

    fn blocked(&self) -> Option<(usize, &str)> {
        ballots(self).enumerate().find_map(|(at, ballot)| match ballot {
            Ballot::Conflict { blocker: Some(blocker), .. } => Some((at, blocker)),
            _ => None,
        })
    }

    fn retryable(&self) -> bool {
        ballots(self).any(|b| matches!(b, Ballot::Conflict { .. }))
            && ballots(self).all(Ballot::leaves_room_for_a_retry)
            && !ballots(self).any(|b| matches!(b, Ballot::Conflict { expired_owner: Some(_), .. }))
    }

    fn refused_for_contention(&self) -> bool {
        !self.is_empty()
            && ballots(self).all(|b| b.leaves_room_for_a_retry() || b == Ballot::No(Some(RefusalCode::Timeout)))
    }

    fn abort_reason(&self) -> String {
        let reasons = self
            .iter()
            .filter(|p| Ballot::of(p) != Ballot::Yes)
            .map(|p| format!("{}: {}", p.service, p.reason.as_deref().unwrap_or("did not prepare")))
            .collect::<Vec<_>>()
            .join("; ");
        crate::record::cut(&reasons, crate::record::MAX_REASON_BYTES)
    }
}

/// Writes onto `entry` what its prepare (or one-phase commit) came to: its answer, the invoke's failure,
/// or no answer before the deadline (`Err(Elapsed)`).
pub fn cast(
    entry: &mut ParticipantEntry,
    answer: Result<Result<ParticipantResponse, InvokeError>, tokio::time::error::Elapsed>,
) {
    match answer {
        Ok(Ok(response)) => record_vote(entry, response),
        Ok(Err(e)) => {
            warn!(service = %entry.service, error = %e, "the participant failed to answer");
            entry.code = Some(RefusalCode::Unavailable);
            entry.reason = Some(e.public_reason());
            entry.never_ran = e.never_ran();
            entry.ended_without_vote = e.execution_ended();
        }
        Err(_) => {
            warn!(service = %entry.service, "no answer before the deadline");
            entry.code = Some(RefusalCode::Timeout);
            entry.reason = Some("no answer before the transaction's deadline".to_owned());
        }
    }
}

fn record_vote(entry: &mut ParticipantEntry, response: ParticipantResponse) {
    match response.vote {
        Some(Vote::Prepared) => {
            entry.vote = Some(Vote::Prepared);
            entry.read_only = response.read_only;
            entry.lock_token = response.lock_token;
        }
        Some(Vote::Refused) => {
            let conflict = response.code == Some(RefusalCode::Conflict);
            entry.vote = Some(Vote::Refused);
            entry.code = response.code;
            entry.blocked_by = response.blocked_by.filter(|_| conflict);
            entry.unresolved_owner = response.unresolved_owner.filter(|_| conflict);
            entry.service_code =
                response.service_code.map(|c| crate::record::cut(&c, crate::model::MAX_SERVICE_CODE_BYTES));
            // As the record keeps it: the answer and GET then say the same.
            entry.reason = response.reason.map(|r| crate::record::cut(&r, crate::record::MAX_REASON_BYTES));
        }
        None => {
            entry.code = Some(RefusalCode::Unavailable);
            entry.reason = Some(format!("prepare answered without a vote: {response:?}"));
        }
    }
}

#[cfg(test)]
#[path = "ballot_tests.rs"]
mod tests;
