//! The coordinator function: the Lambda runtime around `coordinator::handle` (the REST API), with the
//! CORS origin on every answer and the request's metrics flushed after it. An internal extension runs
//! what a request left for after its answer (`Prefer: respond-async`: the second phase of a transaction
//! answered on its commit decision): Lambda returns the runtime's response to the caller as soon as it is
//! posted, and ends the invocation only once the extension is done with it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lambda_http::{Error, Request, service_fn};
use lambda_runtime::tower::{Layer, Service};
use lambda_runtime::{LambdaInvocation, layers::TracingLayer};
use tokio::sync::{Mutex, mpsc};
use tracing::warn;
use twopc::after_answer::Deferred;
use twopc::{config, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    config::init_tracing();
    let metrics = telemetry::install_emf_from_env(telemetry::Zeros::Omitted);
    let coordinator = coordinator::from_env().await?;
    let deferred = Arc::new(Deferred::default());
    let (answered, answers) = mpsc::unbounded_channel::<()>();
    let answers = Arc::new(Mutex::new(answers));
    let after_answer = {
        let (deferred, answers) = (deferred.clone(), answers.clone());
        lambda_extension::Extension::new()
            .with_events(&["INVOKE"])
            .with_extension_name("coordinator-after-answer")
            .with_events_processor(lambda_extension::service_fn(move |event: lambda_extension::LambdaEvent| {
                let (deferred, answers) = (deferred.clone(), answers.clone());
                async move {
                    // The invocation's response is posted first (the runtime's layer below says so, however
                    // the invocation ended); then its second phase, if it left one. Never past the
                    // invocation's deadline: a response that never came leaves nothing to run.
                    let wait = match event.next {
                        lambda_extension::NextEvent::Invoke(invoke) => until(invoke.deadline_ms),
                        lambda_extension::NextEvent::Shutdown(_) => Duration::ZERO,
                    };
                    if tokio::time::timeout(wait, async { answers.lock().await.recv().await }).await.is_ok() {
                        deferred.run().await;
                        telemetry::flush(metrics);
                    }
                    Ok::<(), Error>(())
                }
            }))
            .register()
            .await
    };
    let (coordinator, after_answer) = match after_answer {
        Ok(extension) => (coordinator.with_after_answer(deferred), Some(extension)),
        // No extensions API (an emulator without one): `Prefer: respond-async` is not applied.
        Err(e) => {
            warn!(error = %e, "no internal extension: requests are answered at their end");
            (coordinator, None)
        }
    };
    // For the process's life: the runtime's service is 'static.
    let coordinator: &'static twopc::coordinator::Coordinator = Box::leak(Box::new(coordinator));
    let allow_origin: &'static Option<String> = Box::leak(Box::new(twopc::cors::allow_origin_from_env()));
    let handler = service_fn(move |request: Request| async move {
        let response =
            coordinator::allow_origin(coordinator::handle(coordinator, request).await, allow_origin.as_deref());
        telemetry::flush(metrics);
        Ok::<_, Error>(response)
    });
    let runtime = lambda_http::runtime(handler).layer(TracingLayer::new());
    match after_answer {
        Some(extension) => {
            let runtime = runtime.layer(SignalAnswered { answered });
            tokio::try_join!(runtime.run(), extension.run())?;
        }
        None => runtime.run().await?,
    }
    Ok(())
}

/// How long until `deadline_ms` (milliseconds since the epoch).
fn until(deadline_ms: u64) -> Duration {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    Duration::from_millis(deadline_ms).saturating_sub(now)
}

/// Tells the extension that an invocation's response was posted, whatever it was (an answer, an error,
/// an event that could not be read).
#[derive(Clone)]
struct SignalAnswered {
    answered: mpsc::UnboundedSender<()>,
}

impl<S> Layer<S> for SignalAnswered {
    type Service = Signalled<S>;

    fn layer(&self, inner: S) -> Signalled<S> {
        Signalled { inner, answered: self.answered.clone() }
    }
}

struct Signalled<S> {
    inner: S,
    answered: mpsc::UnboundedSender<()>,
}

impl<S> Service<LambdaInvocation> for Signalled<S>
where
    S: Service<LambdaInvocation, Response = (), Error = Error>,
    S::Future: 'static,
{
    type Response = ();
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<(), Error>>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, invocation: LambdaInvocation) -> Self::Future {
        let posted = self.inner.call(invocation);
        let answered = self.answered.clone();
        Box::pin(async move {
            let result = posted.await;
            let _ = answered.send(());
            result
        })
    }
}
