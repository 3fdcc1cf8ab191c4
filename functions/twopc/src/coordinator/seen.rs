//! `GET /transactions/{id}`, and what a non-admin is told of the transactions an answer's reasons name (issue 42): a lock's owner is
//! named by id only when the caller may see that transaction ([`Policy::may_see`](crate::access::Policy::may_see): its own); any other
//! is "another caller's transaction". Redacted when answering, POST and GET alike: the record keeps the
//! participants' reasons whole (the coordinator's retry, admins and the log use them), and admins see
//! the ids.

use serde_json::Value;
use tracing::warn;

use super::Coordinator;
use super::reply::{Reply, unavailable};
use crate::access::{Caller, entity_ids};
use crate::model::ErrorCode;
use crate::record::TransactionRecord;

/// `GET /transactions/{id}` from `caller`: a transaction it may not see is answered as an unknown one.
pub(super) async fn read(c: &Coordinator, id: &str, caller: &Caller) -> Reply {
    match c.engine.transactions.get(id).await {
        Ok(Some(record)) if c.access.may_see(caller, record.principal.as_deref()) => {
            as_seen_by(c, caller, Reply::reading(&record), &record).await
        }
        Ok(_) => Reply::error(ErrorCode::NotFound, format!("no transaction {id}")),
        Err(e) => unavailable(&e, None),
    }
}

/// A record's answer as `caller` may see it (`Policy::redact_answer`, and others' transactions unnamed:
/// [`hide_others_transactions`]).
pub(super) async fn as_seen_by(
    c: &Coordinator,
    caller: &Caller,
    mut reply: Reply,
    record: &TransactionRecord,
) -> Reply {
    if caller.admin {
        return reply;
    }
    let items: Vec<Vec<String>> = record.participants.iter().map(|p| entity_ids(&p.operations)).collect();
    c.access.redact_answer(caller, &mut reply.body, &items);
    hide_others_transactions(c, caller, &mut reply.body).await;
    reply
}

/// Hides from `body`'s reasons every transaction `caller` may not see. A named transaction whose
/// record cannot be read, or does not exist, is hidden too.
pub(super) async fn hide_others_transactions(c: &Coordinator, caller: &Caller, body: &mut Value) {
    if caller.admin {
        return;
    }
    let mut hidden = std::collections::BTreeSet::new();
    for id in crate::access::transactions_named(body) {
        let visible = match c.engine.transactions.get(&id).await {
            Ok(Some(record)) => c.access.may_see(caller, record.principal.as_deref()),
            Ok(None) => false,
            Err(e) => {
                warn!(error = %e, tx = %id, "could not read a transaction a reason names; hiding its id");
                false
            }
        };
        if !visible {
            hidden.insert(id);
        }
    }
    crate::access::hide_transactions(body, &hidden);
}
