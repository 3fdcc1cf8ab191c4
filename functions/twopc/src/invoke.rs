//! Calling a participant: AWS Lambda Invoke in production (and against `cargo lambda watch`), a direct
//! call in-process for tests and the local stack. This trait is the only difference between them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use aws_sdk_lambda::operation::invoke::InvokeError as InvokeApiError;
use aws_sdk_lambda::primitives::Blob;
use futures::future::BoxFuture;

use crate::auth::Envelope;
use crate::model::{Action, ParticipantRequest, ParticipantResponse};
use crate::participant::{Participant, ParticipantError};

/// Coordinator and sweeper: the service registry, JSON `{"service": "function name or ARN"}`.
pub const PARTICIPANTS: &str = "PARTICIPANTS";

#[derive(Debug, Clone, thiserror::Error)]
pub enum InvokeError {
    #[error("service {0} is not registered")]
    UnknownService(String),
    #[error("participant {service} failed: {message}")]
    FunctionError { service: String, message: String },
    #[error("could not reach participant {service}: {message}")]
    Transport { service: String, message: String },
    #[error("participant {service} answered something that is not a participant response: {message}")]
    BadResponse { service: String, message: String },
    #[error("the message to participant {service} could not be signed: {message}")]
    Unsigned { service: String, message: String },
    /// Lambda refused the invoke before running the function (`TooManyRequestsException`), every time.
    #[error("participant {service} is throttled: {message}")]
    Throttled { service: String, message: String },
}

impl InvokeError {
    /// The message certainly never ran at the participant: never sent (no such service, not signed), or
    /// refused by Lambda before the function ran. Anything else may have run, and may still.
    pub fn never_ran(&self) -> bool {
        matches!(self, InvokeError::UnknownService(_) | InvokeError::Unsigned { .. } | InvokeError::Throttled { .. })
    }

    /// The message ran at the participant and its execution is over (the function failed, or answered
    /// something that is not a participant response): nothing of it is still to come but writes it gave
    /// up on, which land within the clock margin. A transport failure proves neither: the invoke may
    /// still be on its way.
    pub fn execution_ended(&self) -> bool {
        matches!(self, InvokeError::FunctionError { .. } | InvokeError::BadResponse { .. })
    }

    /// What the caller of the REST API is told: which participant and what kind of failure, in this
    /// system's own words. The error itself (a function's error text, the SDK's) goes to the log only.
    pub fn public_reason(&self) -> String {
        match self {
            InvokeError::Throttled { service, .. } => format!("participant {service} is throttled"),
            InvokeError::UnknownService(service) => format!("service {service} is not registered"),
            InvokeError::FunctionError { service, .. } => format!("participant {service} failed"),
            InvokeError::Transport { service, .. } => format!("could not reach participant {service}"),
            InvokeError::BadResponse { service, .. } => {
                format!("participant {service} answered something that is not a participant response")
            }
            InvokeError::Unsigned { service, .. } => {
                format!("the message to participant {service} could not be signed")
            }
        }
    }
}

pub trait ParticipantInvoker: Send + Sync {
    /// A message signed in v1 (its `signature` inside it).
    fn invoke<'a>(
        &'a self,
        service: &'a str,
        request: &'a ParticipantRequest,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>>;

    /// A message sealed in v2 ([`Envelope`]): sent as the envelope itself. An invoker that carries only
    /// v1 (a test's recording one) refuses it.
    fn invoke_sealed<'a>(
        &'a self,
        service: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>> {
        let _ = envelope;
        Box::pin(async move {
            Err(InvokeError::Transport {
                service: service.to_owned(),
                message: "this invoker carries v1 messages only".into(),
            })
        })
    }
}

/// Invokes the registered Lambda function of each service, synchronously.
#[derive(Debug, Clone)]
pub struct LambdaInvoker {
    /// service → the client to call it with, and its function name or ARN.
    targets: BTreeMap<String, Target>,
}

impl LambdaInvoker {
    pub fn new(client: aws_sdk_lambda::Client, functions: BTreeMap<String, String>) -> LambdaInvoker {
        let target = |function| Target { client: client.clone(), function, local: false };
        LambdaInvoker { targets: functions.into_iter().map(|(s, f)| (s, target(f))).collect() }
    }

    /// From the registry (`PARTICIPANTS`). A value is a function name or ARN; for local development it
    /// may also be `http://host:port/function`, an Invoke API of its own (one `cargo lambda watch` per
    /// participant deployment, each with its own table).
    pub fn from_registry(config: &aws_config::SdkConfig, registry: BTreeMap<String, String>) -> LambdaInvoker {
        let shared = aws_sdk_lambda::Client::new(config);
        let targets = registry
            .into_iter()
            .map(|(service, target)| {
                let local = target.strip_prefix("http://").and_then(|rest| rest.split_once('/'));
                let entry = match local {
                    Some((authority, function)) => {
                        let config = aws_sdk_lambda::config::Builder::from(config)
                            .endpoint_url(format!("http://{authority}"))
                            .build();
                        let client = aws_sdk_lambda::Client::from_conf(config);
                        Target { client, function: function.to_owned(), local: true }
                    }
                    None => Target { client: shared.clone(), function: target, local: false },
                };
                (service, entry)
            })
            .collect();
        LambdaInvoker { targets }
    }

    /// Invokes `service` with `payload`. A prepare of a recorded attempt is sent `once` (issue 48): no retry
    /// may run it a second time unseen, since its vote (or its failure) is what tells the coordinator
    /// whether a late lock write out of the locks index may still come (an abort with no vote from a
    /// participant is ended only after the participants' lock cutoff). The SDK's retries are off for it,
    /// and only a throttled invoke, which Lambda refused before running the function, is sent again.
    async fn call(&self, service: &str, payload: Vec<u8>, once: bool) -> Result<ParticipantResponse, InvokeError> {
        let Target { client, function, local } =
            self.targets.get(service).ok_or_else(|| InvokeError::UnknownService(service.to_owned()))?;
        let send = || {
            let invoke = client.invoke().function_name(function).payload(Blob::new(payload.clone()));
            match once {
                true => invoke
                    .customize()
                    .config_override(
                        aws_sdk_lambda::config::Builder::default()
                            .retry_config(aws_sdk_lambda::config::retry::RetryConfig::disabled()),
                    )
                    .send(),
                false => invoke.customize().send(),
            }
        };
        let throttled = |result: &Result<_, aws_sdk_lambda::error::SdkError<InvokeApiError, _>>| {
            result.as_ref().err().and_then(|e| e.as_service_error()).is_some_and(|e| e.is_too_many_requests_exception())
        };
        let mut result = send().await;
        for pause_ms in THROTTLED_PREPARE_PAUSES_MS {
            if !once || !throttled(&result) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
            result = send().await;
        }
        if once && throttled(&result) {
            let message = result.err().map(|e| aws_smithy_types::error::display::DisplayErrorContext(&e).to_string());
            return Err(InvokeError::Throttled { service: service.to_owned(), message: message.unwrap_or_default() });
        }
        let out = match result {
            Ok(out) => out,
            Err(err) => {
                // `cargo lambda watch` answers a handler error with HTTP 500 and the error as the body,
                // where the service answers 200 with X-Amz-Function-Error: both mean the function failed.
                // Only from a local endpoint: the service's own 500 (ServiceException) proves nothing about
                // the function, which may still run.
                if *local
                    && let Some(raw) = err.raw_response()
                    && raw.status().as_u16() == 500
                {
                    let body = raw.body().bytes().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
                    return Err(InvokeError::FunctionError { service: service.to_owned(), message: body });
                }
                let message = aws_smithy_types::error::display::DisplayErrorContext(&err).to_string();
                return Err(InvokeError::Transport { service: service.to_owned(), message });
            }
        };
        let body = out.payload().map(|b| b.as_ref().to_vec()).unwrap_or_default();
        if let Some(kind) = out.function_error() {
            return Err(InvokeError::FunctionError {
                service: service.to_owned(),
                message: format!("{kind}: {}", String::from_utf8_lossy(&body)),
            });
        }
        serde_json::from_slice(&body).map_err(|e| InvokeError::BadResponse {
            service: service.to_owned(),
            message: format!("{e}: {}", String::from_utf8_lossy(&body)),
        })
    }
}

impl ParticipantInvoker for LambdaInvoker {
    fn invoke<'a>(
        &'a self,
        service: &'a str,
        request: &'a ParticipantRequest,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>> {
        let once = request.action == Action::Prepare && request.recorded;
        Box::pin(self.call(service, serde_json::to_vec(request).expect("requests serialize"), once))
    }

    fn invoke_sealed<'a>(
        &'a self,
        service: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>> {
        let once = sent_once(envelope);
        Box::pin(self.call(service, serde_json::to_vec(envelope).expect("envelopes serialize"), once))
    }
}

/// A participant's function: the client to invoke it with, its name or ARN, and whether it is a local
/// Invoke API (`cargo lambda watch`) rather than the Lambda service.
#[derive(Debug, Clone)]
struct Target {
    client: aws_sdk_lambda::Client,
    function: String,
    local: bool,
}

/// The pauses before a throttled prepare is sent again (the SDK's own retries are off for prepares).
const THROTTLED_PREPARE_PAUSES_MS: [u64; 2] = [20, 80];

/// Whether a sealed message is a prepare the coordinator sends once (`recorded`), read from its text.
fn sent_once(envelope: &Envelope) -> bool {
    #[derive(serde::Deserialize)]
    struct Only {
        action: Action,
        #[serde(default)]
        recorded: bool,
    }
    serde_json::from_str::<Only>(&envelope.message).is_ok_and(|m| m.action == Action::Prepare && m.recorded)
}

/// Calls participants in this process: the same core code the participant function runs.
#[derive(Debug, Clone, Default)]
pub struct InProcessInvoker {
    participants: HashMap<String, Arc<Participant>>,
}

impl InProcessInvoker {
    pub fn new(participants: impl IntoIterator<Item = Participant>) -> InProcessInvoker {
        InProcessInvoker {
            participants: participants.into_iter().map(|p| (p.service().to_owned(), Arc::new(p))).collect(),
        }
    }

    fn participant(&self, service: &str) -> Result<&Participant, InvokeError> {
        self.participants.get(service).map(Arc::as_ref).ok_or_else(|| InvokeError::UnknownService(service.to_owned()))
    }
}

/// A participant's error, as the Invoke API reports a function error.
fn function_error(service: &str) -> impl FnOnce(ParticipantError) -> InvokeError + '_ {
    move |e| InvokeError::FunctionError { service: service.to_owned(), message: e.to_string() }
}

impl ParticipantInvoker for InProcessInvoker {
    fn invoke<'a>(
        &'a self,
        service: &'a str,
        request: &'a ParticipantRequest,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>> {
        Box::pin(async move { self.participant(service)?.handle(request).await.map_err(function_error(service)) })
    }

    fn invoke_sealed<'a>(
        &'a self,
        service: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<ParticipantResponse, InvokeError>> {
        Box::pin(
            async move { self.participant(service)?.handle_sealed(envelope).await.map_err(function_error(service)) },
        )
    }
}
