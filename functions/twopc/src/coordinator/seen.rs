//! What a non-admin is told of the transactions an answer's reasons name (issue 42): a lock's owner is
//! named by id only when the caller may see that transaction ([`Policy::may_see`]: its own); any other
//! is "another caller's transaction". Redacted when answering, POST and GET alike: the record keeps the
//! participants' reasons whole (the coordinator's retry, admins and the log use them), and admins see
//! the ids.

use super::*;

impl Coordinator {
    /// Hides from `body`'s reasons every transaction `caller` may not see. A named transaction whose
    /// record cannot be read, or does not exist, is hidden too.
    pub(super) async fn hide_others_transactions(&self, caller: &Caller, body: &mut Value) {
        if caller.admin {
            return;
        }
        let mut hidden = std::collections::BTreeSet::new();
        for id in crate::access::transactions_named(body) {
            let visible = match self.transactions.get(&id).await {
                Ok(Some(record)) => self.access.may_see(caller, record.principal.as_deref()),
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
}
