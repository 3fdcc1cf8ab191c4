//! The decision's rules over typed votes: what commits, what is contention, what a retry may wait out.

use super::*;
use crate::model::{ParticipantResponse, RefusalCode, Vote};
use crate::record::ParticipantEntry;

fn entry(service: &str) -> ParticipantEntry {
    ParticipantEntry::new(service.to_owned(), vec![])
}

fn answered(service: &str, response: ParticipantResponse) -> ParticipantEntry {
    let mut entry = entry(service);
    cast(&mut entry, Ok(Ok(response)));
    entry
}

fn prepared(service: &str) -> ParticipantEntry {
    answered(service, ParticipantResponse { vote: Some(Vote::Prepared), ..Default::default() })
}

fn refused(service: &str, code: RefusalCode, blocker: Option<&str>) -> ParticipantEntry {
    answered(
        service,
        ParticipantResponse {
            vote: Some(Vote::Refused),
            code: Some(code),
            reason: Some(format!("{code:?}")),
            blocked_by: blocker.map(str::to_owned),
            ..Default::default()
        },
    )
}

fn timed_out(service: &str) -> ParticipantEntry {
    let mut entry = entry(service);
    let elapsed = tokio_test_elapsed();
    cast(&mut entry, Err(elapsed));
    entry
}

/// An `Elapsed`, which tokio makes only by timing out.
fn tokio_test_elapsed() -> tokio::time::error::Elapsed {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    runtime
        .block_on(async { tokio::time::timeout(std::time::Duration::ZERO, std::future::pending::<()>()).await })
        .unwrap_err()
}

#[test]
fn every_participant_prepared_in_time_commits() {
    let votes = [prepared("a"), prepared("b")];
    assert_eq!(votes.verdict(true), Verdict::Commit);
    let Verdict::Abort(reason) = votes.verdict(false) else { panic!("late votes commit") };
    assert!(reason.contains("deadline passed"), "{reason}");
}

#[test]
fn one_refusal_aborts_with_its_participants_reason() {
    let votes = [prepared("a"), refused("b", RefusalCode::ConditionFailed, None), entry("c")];
    let Verdict::Abort(reason) = votes.verdict(true) else { panic!("a refusal commits") };
    assert_eq!(reason, "b: ConditionFailed; c: did not prepare");
}

#[test]
fn a_conflict_carries_its_blocker_and_nothing_else_does() {
    let conflict = refused("a", RefusalCode::Conflict, Some("tx-old"));
    assert_eq!(Ballot::of(&conflict), Ballot::Conflict { blocker: Some("tx-old"), expired_owner: None });
    // A blocker named by another refusal is no contention: not kept.
    let guard = refused("b", RefusalCode::ConditionFailed, Some("tx-old"));
    assert_eq!(Ballot::of(&guard), Ballot::No(Some(RefusalCode::ConditionFailed)));
    assert_eq!([prepared("x"), guard, conflict].blocked(), Some((2, "tx-old")));
}

#[test]
fn contention_alone_is_retried_and_keeps_its_age() {
    let votes = [prepared("a"), refused("b", RefusalCode::Conflict, Some("tx-old")), entry("c")];
    assert!(votes.retryable());
    assert!(votes.refused_for_contention());
}

#[test]
fn a_timeout_keeps_the_age_but_is_not_retried_by_the_coordinator() {
    let votes = [prepared("a"), timed_out("b")];
    assert_eq!(Ballot::of(&votes[1]), Ballot::No(Some(RefusalCode::Timeout)));
    assert!(!votes.retryable());
    assert!(votes.refused_for_contention());
}

#[test]
fn any_other_refusal_is_the_answer() {
    let votes = [refused("a", RefusalCode::Conflict, Some("tx-old")), refused("b", RefusalCode::NotFound, None)];
    assert!(!votes.retryable());
    assert!(!votes.refused_for_contention());
    assert!(!Vec::<ParticipantEntry>::new().refused_for_contention());
}

#[test]
fn a_lock_only_the_sweeper_can_resolve_is_not_waited_out() {
    let expired = answered(
        "a",
        ParticipantResponse {
            vote: Some(Vote::Refused),
            code: Some(RefusalCode::Conflict),
            unresolved_owner: Some("tx-gone".to_owned()),
            ..Default::default()
        },
    );
    assert_eq!(Ballot::of(&expired), Ballot::Conflict { blocker: None, expired_owner: Some("tx-gone") });
    let votes = [expired];
    assert!(!votes.retryable());
    assert!(votes.refused_for_contention());
}

#[test]
fn an_answer_without_a_vote_is_a_failure_not_a_vote() {
    let silent = answered("a", ParticipantResponse::default());
    assert_eq!(Ballot::of(&silent), Ballot::No(Some(RefusalCode::Unavailable)));
    assert!(silent.reason.unwrap().contains("without a vote"));
}
