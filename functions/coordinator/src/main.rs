//! The coordinator function: the Lambda runtime around `coordinator::handle` (the REST API), with the
//! CORS origin on every answer and the request's metrics flushed after it. An internal extension runs
//! what a request left for after its answer (`Prefer: respond-async`: the second phase of a transaction
//! answered on its commit decision): Lambda sends the handler's response to the caller at once and keeps
//! the environment until the extension is done with the invocation.

use std::sync::Arc;

use lambda_http::{Error, Request, service_fn};
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
            .with_events_processor(lambda_extension::service_fn(move |_event: lambda_extension::LambdaEvent| {
                let (deferred, answers) = (deferred.clone(), answers.clone());
                async move {
                    // This invocation's answer is posted first; then its second phase, if it left one.
                    answers.lock().await.recv().await;
                    deferred.run().await;
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
    let coordinator = &coordinator;
    let allow_origin = &twopc::cors::allow_origin_from_env();
    let answered = &answered;
    let runtime = lambda_http::run(service_fn(move |request: Request| async move {
        // Sent however the handler ends, so the extension never waits for an answer that never comes.
        let _answered = Answered(answered);
        let response =
            coordinator::allow_origin(coordinator::handle(coordinator, request).await, allow_origin.as_deref());
        telemetry::flush(metrics);
        Ok::<_, Error>(response)
    }));
    match after_answer {
        Some(extension) => {
            tokio::try_join!(runtime, extension.run())?;
        }
        None => runtime.await?,
    }
    Ok(())
}

/// Tells the extension the handler has answered, when dropped.
struct Answered<'a>(&'a mpsc::UnboundedSender<()>);

impl Drop for Answered<'_> {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}
