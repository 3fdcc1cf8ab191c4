//! Messages to participants: each signed with its service's current key, a prepare's refusal that names an
//! expired lock's owner resolved and asked again, a commit or an abort retried until acknowledged.

use std::time::Duration;

use tracing::{info, warn};

use super::{Coordinator, MAX_RESOLUTIONS_PER_MESSAGE, SECOND_PHASE_ATTEMPTS, SECOND_PHASE_TIMEOUT};
use crate::auth::SignatureVersion;
use crate::invoke::InvokeError;
use crate::model::{Action, Message, ParticipantResponse, STATUS_ABORTED, STATUS_COMMITTED, STATUS_NOT_PREPARED};

impl Coordinator {
    /// Sends one message to a participant, signed with its service's current key.
    pub async fn call(&self, service: &str, message: &Message) -> Result<ParticipantResponse, InvokeError> {
        let request = &message.to_wire();
        let unsigned =
            |e: crate::auth::KeyError| InvokeError::Unsigned { service: service.to_owned(), message: e.to_string() };
        match self.signature {
            SignatureVersion::V1 => {
                let signed = crate::auth::sign(self.keys.as_ref(), service, request, self.clock.now_ms())
                    .await
                    .map_err(unsigned)?;
                self.invoker.invoke(service, &signed).await
            }
            SignatureVersion::V2 => {
                let sealed = crate::auth::seal(self.keys.as_ref(), service, request, self.clock.now_ms())
                    .await
                    .map_err(unsigned)?;
                self.invoker.invoke_sealed(service, &sealed).await
            }
        }
    }

    /// [`Coordinator::call`] for a prepare or a one-phase commit: a refusal that names an expired lock's
    /// owner the participant may not decide ([`ParticipantResponse::unresolved_owner`]) is resolved here,
    /// with this role's rights and from that owner's own record only (past its expiry it is aborted by the
    /// same conditional write every resolver races its coordinator with), and the message sent again.
    /// An owner with no record is left to the sweeper, which reads the lock itself: a participant's word
    /// alone never makes this coordinator write a decision.
    pub(super) async fn call_resolving(
        &self,
        service: &str,
        message: &Message,
    ) -> Result<ParticipantResponse, InvokeError> {
        let mut resolved = 0;
        loop {
            let response = self.call(service, message).await?;
            let Some(owner) = response.unresolved_owner.as_deref() else { return Ok(response) };
            if resolved == MAX_RESOLUTIONS_PER_MESSAGE || owner == message.transaction_id() {
                return Ok(response);
            }
            resolved += 1;
            match crate::recovery::resolve_recorded(&self.transactions, owner, self.clock.now_ms()).await {
                Ok(true) => info!(service, owner, "resolved an expired lock's owner for a participant; asking again"),
                Ok(false) => return Ok(response),
                Err(e) => {
                    warn!(service, owner, error = %e, "could not resolve an expired lock's owner");
                    return Ok(response);
                }
            }
        }
    }

    /// One commit or abort, retried until the participant acknowledges it; or why it did not, in words
    /// fit for the record (the participant's own reason, or the invoke's public one).
    pub(super) async fn deliver(&self, service: &str, request: &Message) -> Result<(), String> {
        let mut why = String::new();
        for attempt in 0..SECOND_PHASE_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
            match tokio::time::timeout(SECOND_PHASE_TIMEOUT, self.call(service, request)).await {
                Ok(Ok(response)) if acknowledged(request.action(), &response) => return Ok(()),
                Ok(Ok(response)) => {
                    warn!(service, ?response, "unexpected second-phase answer");
                    why = match (&response.status, &response.reason) {
                        (Some(status), Some(reason)) => format!("{status}: {reason}"),
                        (status, _) => format!("answered {}", status.as_deref().unwrap_or("no status")),
                    };
                }
                Ok(Err(e)) => {
                    warn!(service, error = %e, attempt, "second-phase delivery failed");
                    why = e.public_reason();
                }
                Err(_) => {
                    warn!(service, attempt, "second-phase delivery timed out");
                    why = format!("no answer within {SECOND_PHASE_TIMEOUT:?}");
                }
            }
        }
        Err(why)
    }
}

/// Whether an answer completes the second phase for that participant.
///
/// A commit answered NOT_PREPARED counts as applied, and that is sound: commit is only ever sent for a
/// transaction decided COMMITTING, for which every participant voted PREPARED, so each of its items
/// held a lock of this transaction. That lock goes away only by committing the item (here, or by lock
/// resolution rolling it forward), never by an abort: aborts and releases happen only for transactions
/// decided ABORTING, and a status never moves backwards. So a lock that is gone was applied, even when
/// a later commit by another transaction has since replaced `lastTx`.
fn acknowledged(action: Action, response: &ParticipantResponse) -> bool {
    matches!(
        (action, response.status.as_deref()),
        (Action::Commit, Some(STATUS_COMMITTED | STATUS_NOT_PREPARED)) | (Action::Abort, Some(STATUS_ABORTED))
    )
}
