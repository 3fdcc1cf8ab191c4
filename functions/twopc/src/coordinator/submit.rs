//! The submit command, `POST /transactions`: a request is parsed, authorized and checked against the hold
//! policy before anything is written; then routed by what it carries. A key (or an age token) that ran
//! already is replayed; an age token's retry claims the refused attempt's age in the same write as its own
//! record; a sole writing participant commits in one phase under its service's id; everything else runs
//! as attempts over the phase engine. The answer is shown as the caller may see it.

use std::time::Instant;

use serde_json::Value;
use tracing::{Instrument, error, info, info_span};

use super::engine::retrying;
use super::one_phase::{one_phase_id, one_phase_service};
use super::replay::caller_idempotent_id;
use super::reply::{Answering, Reply, drive_error_reply, unavailable};
use super::{ABANDON_AFTER_BUDGET, Coordinator};
use crate::access::{Caller, entity_ids};
use crate::attempts::AgeClaim;
use crate::custom::Catalogs;
use crate::model::{ErrorCode, Invalid, TransactionRequest};
use crate::record::TransactionRecord;

pub(super) async fn answer(
    c: &Coordinator,
    body: &[u8],
    idempotency_key: Option<&str>,
    age_token: Option<&str>,
    caller: &Caller,
    on_decision: bool,
) -> Reply {
    let request = match parse_request_with(body, |s| c.services.contains(s), &c.catalogs) {
        Ok(request) => request,
        Err(invalid) => return Reply::invalid(invalid),
    };
    // Before anything is written or locked: what this caller may not do, and a hold longer than a
    // service (or the deployment) accepts.
    if let Err(refused) = c.access.check_request(caller, &request) {
        info!(principal = caller.principal.as_deref().unwrap_or("-"), code = %refused.code, reason = %refused.message, "request refused by the access policy");
        return Reply::invalid(refused);
    }
    if let Err(invalid) = c.holds.check(&request) {
        return Reply::invalid(invalid);
    }
    // An admin's answer is shown whole: the items are read out only for the others'.
    let items: Vec<Vec<String>> = match caller.admin {
        true => Vec::new(),
        false => request.participants.iter().map(|p| entity_ids(&p.operations)).collect(),
    };
    let mut reply = answer_authorized(c, request, idempotency_key, age_token, caller, on_decision).await;
    c.access.redact_answer(caller, &mut reply.body, &items);
    super::seen::hide_others_transactions(c, caller, &mut reply.body).await;
    reply
}

pub(super) async fn answer_authorized(
    c: &Coordinator,
    request: TransactionRequest,
    idempotency_key: Option<&str>,
    age_token: Option<&str>,
    caller: &Caller,
    on_decision: bool,
) -> Reply {
    let answer_by = Instant::now() + c.answer_budget;
    let body_hash = request.canonical_hash();
    // Checked before anything is read or written: a token this caller cannot use is a 400.
    let age = match age_token {
        None => None,
        Some(token) => {
            let principal = caller.principal.as_deref();
            let now = c.engine.clock.now_ms();
            match crate::age::verify(c.age_keys.as_ref(), token, principal, &body_hash, now).await {
                Ok(age) => Some(age),
                Err(crate::age::AgeTokenError::Keys(message)) => {
                    error!(error = %message, "the age token's key could not be read");
                    return Reply::error(
                        ErrorCode::Unavailable,
                        "the Age-Token could not be checked (its key could not be read); nothing was written",
                    );
                }
                Err(refused) => return Reply::error(ErrorCode::InvalidAgeToken, refused.to_string()),
            }
        }
    };
    let (mut id, request_hash) = match idempotency_key {
        // A retry with an age token is idempotent by its token: its id is the token's next attempt's, and
        // its record is written first, so the same token sent again finds it. (`-r`: not the id the
        // coordinator's own retry would have had, which a retried key's replay may have fenced.)
        None => match &age {
            Some(age) => (format!("{}-r{}", age.first_transaction_id, age.attempt), Some(body_hash.clone())),
            None => (format!("tx-{}", uuid::Uuid::new_v4().simple()), None),
        },
        Some(key) if key.is_empty() || key.len() > 255 => {
            return Reply::invalid(Invalid::new(
                ErrorCode::InvalidIdempotencyKey,
                "Idempotency-Key must be 1 to 255 characters",
            ));
        }
        Some(key) => {
            let hash = body_hash.clone();
            match super::replay::first_execution_before_scoping(c, key, caller).await {
                Ok(Some(existing)) => {
                    let id = existing.transaction_id.clone();
                    return match super::replay::replay(c, existing, Some(&hash), answer_by).await {
                        Ok(reply) => reply,
                        Err(e) => drive_error_reply(e, &id),
                    };
                }
                Ok(None) => {}
                Err(e) => return unavailable(&e, None),
            }
            (caller_idempotent_id(caller.principal.as_deref(), key), Some(hash))
        }
    };
    let now = c.engine.clock.now_ms();
    let mut record = TransactionRecord::preparing(id.clone(), &request, request_hash.clone(), now);
    // One phase: the sole participant writes the record in the same write as its items, under an id only
    // its own service's role may put (issue 42: no participant role may write another's record). Not
    // for a token's retry, whose record is written before it runs.
    if age.is_none()
        && let Some(service) = one_phase_service(&record, &c.catalogs)
    {
        // A keyed request that ran in one phase before ids were scoped ran under the key's plain id; one
        // since, under the scoped id: an unread plain id names neither.
        if idempotency_key.is_some()
            && let Some(reply) =
                super::replay::answer_if_recorded(c, &id, record.request_hash.as_deref(), answer_by, None).await
        {
            return reply;
        }
        let scoped = one_phase_id(&service, &id);
        record = TransactionRecord::preparing(scoped.clone(), &request, request_hash, now);
        id = scoped;
    }
    record.principal = caller.principal.clone();
    if let Err(invalid) = record.check_first_write() {
        return Reply::invalid(invalid);
    }
    let mut created = false;
    if let Some(age) = &age {
        // A key (or the same token) that ran already is answered from its record: nothing is claimed for
        // it, so that no chain ever links to a transaction of another body, or to one of its own. Read
        // first, not left to the claim's write: the key may name the refused attempt itself, and one
        // TransactWriteItems cannot touch one item twice.
        if let Some(reply) =
            super::replay::answer_if_recorded(c, &id, record.request_hash.as_deref(), answer_by, Some(&id)).await
        {
            return reply;
        }
        // A request of its own (its first attempt, its own key) that keeps the refused request's age.
        record.started_at = Some(age.started_at);
        record.age_of = Some(age.retry_of.clone());
        // The claim of the refused attempt's age and this retry's record, in one write: a token runs one
        // retry at most, and a claim never names a record that does not exist or runs another body.
        let opened = record.clone().opened();
        match retrying("age claim", |_| c.engine.transactions.claim_age(&age.retry_of, &opened)).await {
            Ok(AgeClaim::Claimed) => created = true,
            Ok(AgeClaim::Exists(existing)) => {
                return match super::replay::replay(c, *existing, record.request_hash.as_deref(), answer_by).await {
                    Ok(reply) => reply,
                    Err(e) => drive_error_reply(e, &id),
                };
            }
            // Signed by this coordinator for this caller and body, yet naming an attempt of another
            // caller or body (a record changed behind it): not this request's age (issue 42).
            Ok(AgeClaim::Refused(Some(current))) if !record.same_request(&current) => {
                error!(refused = %age.retry_of, "an age token names an attempt of another caller or body");
                return Reply::error(
                    ErrorCode::InvalidAgeToken,
                    format!(
                        "the Age-Token's transaction {} is not this caller's request with this body; nothing \
                         was written",
                        age.retry_of
                    ),
                );
            }
            Ok(AgeClaim::Refused(current)) => {
                let why = match current.as_deref() {
                    Some(refused) if refused.age_claimed_by.is_some() => {
                        format!("already ran as {}", refused.age_claimed_by.as_deref().unwrap_or_default())
                    }
                    Some(refused) if refused.retried_as.is_some() => {
                        format!("was retried as {}", refused.retried_as.as_deref().unwrap_or_default())
                    }
                    _ => "cannot be retried with a token (its abort was not its refusal for contention)".to_owned(),
                };
                return Reply::error(
                    ErrorCode::AgeTokenUsed,
                    format!(
                        "the Age-Token's retry of transaction {} {why}: a token keeps its age for one retry; \
                         this one wrote nothing",
                        age.retry_of
                    ),
                );
            }
            Err(e) => return unavailable(&e, None),
        }
    }
    let span = info_span!("transaction", tx = %id);
    let abandon_at = tokio::time::Instant::from_std(answer_by + ABANDON_AFTER_BUDGET);
    // The attempt now running: what a 503 or a crash names (an earlier attempt's GET says ABORTED).
    let current = std::sync::Mutex::new(id.clone());
    // Boxed: the attempts' state machine is large, and a caller's stack need not hold it.
    let run = Box::pin(
        super::attempts::run(
            c,
            record,
            created,
            Answering { by: answer_by, on_decision },
            &body_hash,
            request.timeout_ms,
            &current,
        )
        .instrument(span),
    );
    let ran = tokio::time::timeout_at(abandon_at, run).await;
    let id = current.lock().expect("the attempt's id is never poisoned").clone();
    let ran = match ran {
        Ok(ran) => ran,
        Err(_) => {
            error!(tx = %id, "the answer budget ran out in a step that did not return; abandoned like a crash");
            let mut reply = Reply::error(
                ErrorCode::Unavailable,
                format!(
                    "the transaction store did not answer in time; the outcome is not known yet: \
                     GET /transactions/{id} tells it once recovery has run"
                ),
            );
            reply.body["transactionId"] = Value::String(id);
            return reply;
        }
    };
    match ran {
        Ok(reply) => reply,
        Err(e) => drive_error_reply(e, &id),
    }
}
/// Validates a request body (`TransactionRequest::parse`) and that every operation can be written by the
/// participants' writes (DynamoDB's expression limit): what the coordinator accepts, before anything is
/// written.
pub fn parse_request(body: &[u8], is_registered: impl Fn(&str) -> bool) -> Result<TransactionRequest, Invalid> {
    parse_request_with(body, is_registered, &Catalogs::default())
}

/// [`parse_request`], each service's operations taking also its own kinds (`catalogs`).
pub fn parse_request_with(
    body: &[u8],
    is_registered: impl Fn(&str) -> bool,
    catalogs: &Catalogs,
) -> Result<TransactionRequest, Invalid> {
    let request = TransactionRequest::parse_with(body, is_registered, catalogs)?;
    for (i, part) in request.participants.iter().enumerate() {
        crate::participant::expressions::check_list(&part.operations, &format!("participants[{i}].operations"))?;
    }
    Ok(request)
}
