//! The one-phase command: a request with one writing participant has no vote to collect from anyone else,
//! so that participant applies its operations and creates the record COMMITTED in the same atomic write
//! (two requests to DynamoDB instead of five). Its id is scoped to the service (`1p~service~id`): a
//! participant's role may put records only under such ids of its own (issue 42).

use std::time::{Duration, Instant};

use tracing::info;

use super::Coordinator;
use super::ballot::{Votes, cast};
use super::reply::{Attempted, DriveError, Refused, Reply};
use crate::attempts::Created;
use crate::custom::{Catalog, Catalogs};
use crate::model::message::OnePhase;
use crate::model::{Message, Operation, STATUS_COMMITTED, STATUS_RECORD_EXISTS, Status, Vote};
use crate::record::TransactionRecord;
use crate::store::StoreError;

/// One writing participant: no vote to collect from anyone else, so it applies its operations and the
/// record is created COMMITTED in the same atomic write (two requests to DynamoDB instead of five).
/// Whatever goes wrong on the way, the record decides: if the participant's reply is lost, the
/// coordinator creates the record as ABORTED, conditionally, and exactly one of the two writes exists.
pub(super) async fn run_one_phase(
    c: &Coordinator,
    record: TransactionRecord,
    answer_by: Instant,
) -> Result<Attempted, DriveError> {
    let started = Instant::now();
    let now = c.engine.clock.now_ms();
    let mut committed = record.clone().ended(Status::Committed, now);
    committed.participants[0].vote = Some(Vote::Prepared);
    let entry = &record.participants[0];
    let request = Message::OnePhase(OnePhase {
        transaction_id: record.transaction_id.clone(),
        operations: entry.operations.clone(),
        deadline: Some(record.deadline),
        started_at: Some(record.age()),
        principal: record.principal.clone(),
        record: serde_json::to_value(&committed).expect("records serialize"),
    });
    let budget = Duration::from_millis(record.deadline.saturating_sub(now));
    let answer = tokio::time::timeout(budget, c.engine.call_resolving(&entry.service, &request)).await;
    let existing = match answer {
        Ok(Ok(response)) if response.status.as_deref() == Some(STATUS_COMMITTED) => {
            info!(total_ms = started.elapsed().as_millis() as u64, "committed in one phase");
            return Ok(Reply::for_record(&committed).into());
        }
        Ok(Ok(response)) if response.status.as_deref() == Some(STATUS_RECORD_EXISTS) => {
            match c.engine.transactions.get(&record.transaction_id).await? {
                Some(existing) => existing,
                None => {
                    let table = c.engine.transactions.table();
                    let missing = format!("record {} reported but not found", record.transaction_id);
                    return Err(StoreError::internal("GetItem", table, missing).into());
                }
            }
        }
        refused => {
            let mut aborted = record.clone().ended(Status::Aborted, now);
            cast(&mut aborted.participants[0], refused);
            aborted.reason = Some(aborted.participants.abort_reason());
            aborted.updated_at = c.engine.clock.now_ms();
            let blocked_by = aborted.participants[0].blocked_by.clone();
            let own = c.contention_abort(&record, &aborted.participants, blocked_by.as_deref(), answer_by).await;
            let aborted = own.applied_to(aborted);
            // Conditional: if the participant's write landed after all (a lost reply), its COMMITTED record
            // wins. Retried: with the next attempt's record, in the same write.
            let next = own.next.map(|n| *n);
            match c.engine.create_own_linked(&aborted, next.as_ref()).await? {
                Created::Exists(existing) => *existing,
                created => {
                    let record = match created {
                        Created::Linked => aborted,
                        _ => TransactionRecord { retried_as: None, ..aborted },
                    };
                    let blocked_at = blocked_by.as_ref().map(|_| 0);
                    let reply = Reply::for_record(&record);
                    return Ok(Attempted { reply, refused: Some(Refused { record, blocked_at, next }) });
                }
            }
        }
    };
    // A record written by another execution (the participant's, its reply lost, or a concurrent one of the
    // same key): terminal, since one phase writes only COMMITTED or ABORTED, so replay answers it at once,
    // or 422 for a keyed request whose key was used with another body.
    Ok(super::replay::replay(c, existing, record.request_hash.as_deref(), answer_by).await?.into())
}

/// The service of a request that commits in one phase: a sole participant, not held, whose operations
/// [`takes_one_phase`].
pub(super) fn one_phase_service(record: &TransactionRecord, catalogs: &Catalogs) -> Option<String> {
    match record.participants.as_slice() {
        // (A name with `~` could pass for another's prefix: such a service commits in two phases.)
        [sole]
            if !record.is_held()
                && !sole.service.contains('~')
                && takes_one_phase(&sole.operations, catalogs.of(&sole.service)) =>
        {
            Some(sole.service.clone())
        }
        _ => None,
    }
}

/// Whether `record` runs in one phase: it would ([`one_phase_service`]), and runs under its service's
/// one-phase id (a token's retry, recorded before it runs, does not).
pub(super) fn takes_one_phase_as(record: &TransactionRecord, catalogs: &Catalogs) -> bool {
    one_phase_service(record, catalogs).is_some_and(|service| is_one_phase_id(&record.transaction_id, &service))
}

/// What a one-phase transaction's id starts with: its sole participant's service between `1p~` and `~`.
/// Its participant's role may put records only under ids of this form for its own service (the
/// templates' `dynamodb:LeadingKeys`), so it can write the record of its own one-phase commits and no
/// other (issue 42). A service whose name has `~` never commits in one phase.
pub fn one_phase_prefix(service: &str) -> String {
    format!("1p~{service}~")
}

/// `id` as the id of a one-phase transaction of `service`.
pub fn one_phase_id(service: &str, id: &str) -> String {
    format!("{}{id}", one_phase_prefix(service))
}

/// Whether `id` is the id of a one-phase transaction of `service` (its attempts' ids too: they extend it).
pub fn is_one_phase_id(id: &str, service: &str) -> bool {
    id.starts_with(&one_phase_prefix(service))
}

/// A sole participant commits in one phase when it writes something and deletes nothing, and its
/// operations leave room for the record in one `TransactWriteItems` (100 items at most). A delete
/// stays two-phase: the stream tells a delete by a commit from any other delete only by the lock of
/// the transaction the removed item carried. So does a resource's operation (`catalog` marks it): a
/// resource beyond DynamoDB cannot commit in the same write as the record.
fn takes_one_phase(operations: &[Operation], catalog: &Catalog) -> bool {
    let resource = |op: &Operation| catalog.schema(op.kind()).is_some_and(|schema| schema.resource);
    operations.len() < crate::model::MAX_OPERATIONS_PER_PARTICIPANT
        && operations.iter().any(|op| !op.is_read_only())
        && !operations.iter().any(|op| matches!(op, Operation::Delete { .. }) || resource(op))
}
