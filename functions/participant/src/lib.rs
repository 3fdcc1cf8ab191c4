//! The participant function: a participant invocation event in, its answer out. Deployed once per
//! service, each with its own table.

use twopc::auth::Envelope;
use twopc::clock;
use twopc::config::{self, ConfigError};
use twopc::model::{ParticipantRequest, ParticipantResponse};
use twopc::participant::DataTable;
use twopc::participant::{Participant, ParticipantError};
use twopc::record::TransactionStore;

pub async fn from_env() -> Result<Participant, ConfigError> {
    let service = config::required(twopc::participant::SERVICE_NAME)?;
    let table = config::required(twopc::participant::DATA_TABLE_NAME)?;
    let transactions =
        config::or_default(twopc::record::TRANSACTIONS_TABLE_NAME, twopc::record::DEFAULT_TRANSACTIONS_TABLE);
    let aws = config::aws().await;
    let keys = twopc::auth::of_service(&aws, &service, &config::required(twopc::auth::PARTICIPANT_KEY)?);
    let client = aws_sdk_dynamodb::Client::new(&aws);
    let pending_credits = config::parsed(
        twopc::participant::PENDING_CREDITS,
        twopc::participant::pending_credits_setting(std::env::var(twopc::participant::PENDING_CREDITS).ok().as_deref()),
    )?;
    tracing::info!(
        pending_credits,
        "a keyed request's credits take pending entries: {pending_credits} (PENDING_CREDITS)"
    );
    Ok(Participant::new(
        service,
        DataTable::new(client.clone(), table),
        TransactionStore::new(client, transactions),
        clock::system(),
    )
    .with_keys(keys)
    .with_pending_credits(pending_credits))
}

#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("event is not a participant invocation: {0}")]
    BadEvent(serde_json::Error),
    #[error(transparent)]
    Participant(#[from] ParticipantError),
}

/// Handles one invocation: a message signed in v1 (its `signature` inside it) or sealed in v2 (an
/// envelope: `{"envelope", "keyId", "signedAt", "mac", "message"}`), whichever the sender uses
/// (docs/participant-protocol.md). An infrastructure failure is an error (the invoker sees a function
/// error), never a vote: a participant that could not ask DynamoDB has not prepared anything.
pub async fn handle(participant: &Participant, event: serde_json::Value) -> Result<ParticipantResponse, HandlerError> {
    let started = std::time::SystemTime::now();
    let (response, request) = if event.get("envelope").is_some() {
        let envelope: Envelope = serde_json::from_value(event).map_err(HandlerError::BadEvent)?;
        // For the trace only: what the envelope says it carries (acted on only once opened).
        let carried = serde_json::from_str::<ParticipantRequest>(&envelope.message).ok();
        (participant.handle_sealed(&envelope).await, carried)
    } else {
        let request: ParticipantRequest = serde_json::from_value(event).map_err(HandlerError::BadEvent)?;
        (participant.handle(&request).await, Some(request))
    };
    let outcome = response.as_ref().map_or("ERROR", ParticipantResponse::outcome);
    if let Some(request) = request {
        twopc::xray::record(
            &format!("participant {}", request.action.as_str()),
            &request.transaction_id,
            outcome,
            started,
        );
    }
    Ok(response?)
}
