//! The guard every message passes first, whichever branch then acts on it: the sender's signature (v1
//! inside the message, v2 around it), the message read once into its typed form
//! ([`crate::model::Message`]) with operations this library can write, what the branch cannot take at
//! all refused (keys that do not fit the table, an operation a resource does not speak), and a prepare
//! or a one-phase commit that arrives past its cutoff (the deadline and the clock margin) answered
//! TIMEOUT before anything is read or written. What only a branch can decide it decides behind [`super::port`]:
//! idempotency (an item's lock token and `lastTx`, a resource's barrier entry) and the other late
//! messages (an abort before any prepare, a prepare after its abort, a commit that finds no lock).

use tracing::{info, warn};

use super::expressions::check_list;
use super::locks::Cutoff;
use super::port::{Items, Resources, dispatch};
use super::protocol::{Participant, ParticipantError};
use crate::auth::{Envelope, Unauthenticated};
use crate::model::{Message, ParticipantRequest, ParticipantResponse};

/// What the guard made of a message.
pub(super) enum Admission {
    /// Signed, readable, in time: a branch acts on it.
    Admitted(Message),
    /// Answered by the guard itself (a late prepare's TIMEOUT vote), nothing read or written.
    Answered(ParticipantResponse),
}

impl Participant {
    /// A v1 message (its `signature` inside it) through the guard.
    pub(super) async fn admit(
        &self,
        request: &ParticipantRequest,
        received_at: u64,
    ) -> Result<Admission, ParticipantError> {
        let checked = crate::auth::verify(self.keys.as_ref(), &self.service, request, received_at).await;
        if let Err(refused) = checked {
            warn!(error = %refused, "message refused: not signed by the coordinator or the sweeper");
            return Err(refused.into());
        }
        self.admit_verified(request)
    }

    /// A v2 message (an [`Envelope`]) through the guard: its MAC checked over the bytes as sent, then
    /// the message they hold.
    pub(super) async fn admit_sealed(
        &self,
        envelope: &Envelope,
        received_at: u64,
    ) -> Result<(ParticipantRequest, Admission), ParticipantError> {
        let opened: Result<ParticipantRequest, Unauthenticated> =
            crate::auth::open(self.keys.as_ref(), &self.service, envelope, received_at).await;
        match opened {
            Ok(request) => {
                let admission = self.admit_verified(&request)?;
                Ok((request, admission))
            }
            Err(refused) => {
                warn!(service = %self.service, error = %refused, "message refused: not sealed by the coordinator or the sweeper");
                Err(refused.into())
            }
        }
    }

    fn admit_verified(&self, request: &ParticipantRequest) -> Result<Admission, ParticipantError> {
        let message = Message::read(request, &self.catalog)?;
        check_list(message.operations(), "operations")?;
        // What the branch cannot take at all (operations that do not fit its table or its resource) is
        // refused as such, late or not.
        let refused = match &self.resource {
            Some(_) => Resources::refuses(&self.service, &message),
            None => Items(self).refuses(&message)?,
        };
        if let Some(refused) = refused {
            return Ok(Admission::Answered(refused));
        }
        let arrival = match &message {
            Message::Prepare(m) => Some((m.deadline, "the prepare arrived after")),
            Message::OnePhase(m) => Some((m.deadline, "the one-phase commit arrived after")),
            Message::Commit(_) | Message::Hold(_) | Message::Abort(_) => None,
        };
        if let Some((deadline, what)) = arrival {
            // A lock taken now would only hold the item for a transaction that can no longer commit, and
            // a try would reserve what no commit can confirm.
            // The clock as the branch would read it: after the signature's check, which may have fetched
            // a key.
            if let Some(late) = Cutoff::of_deadline(deadline).passed(self.clock.now_ms(), what) {
                return Ok(Admission::Answered(late));
            }
        }
        Ok(Admission::Admitted(message))
    }

    /// The guard's answer, or the branch's to what it admitted; each timed as received and answered.
    pub(super) async fn answer(
        &self,
        admission: Admission,
        received_at: u64,
    ) -> Result<ParticipantResponse, ParticipantError> {
        let response = match admission {
            Admission::Answered(response) => response,
            Admission::Admitted(message) => match &self.resource {
                Some(driver) => dispatch(&Resources { participant: self, driver }, message).await?,
                None => dispatch(&Items(self), message).await?,
            },
        };
        info!(vote = ?response.vote, status = ?response.status, reason = ?response.reason, "answered");
        let answered_at = Some(self.clock.now_ms());
        Ok(ParticipantResponse { received_at: Some(received_at), answered_at, ..response })
    }
}
