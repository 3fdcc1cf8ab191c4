//! Local stand-ins for the remote edges of the fan-out, speaking the real wire protocols so the
//! real AWS SDK clients talk to them unchanged (only `endpoint_url` differs):
//!
//! - [`firehose::Firehose`]: Firehose's `PutRecordBatch`/`PutRecord` (AWS JSON 1.1); records go to a
//!   [`firehose::RecordSink`] (memory for tests, NDJSON files under a lake folder for the local stack);
//!   chosen entries or whole calls can be made to fail.
//! - [`eventbridge::EventBridge`]: EventBridge's `PutEvents` (AWS JSON 1.1), the outcomes bus; each event is
//!   an NDJSON line given to a [`firehose::RecordSink`] (the local stack's `.local/events/`).
//! - [`logs::Logs`]: CloudWatch Logs' `FilterLogEvents` over those events, the log group the coordinator reads
//!   recent outcomes from.
//! - [`apigw::ManagementApi`]: the WebSocket API's `@connections` management API; posts go to a
//!   [`apigw::ConnectionRegistry`]; unknown connections answer 410 `GoneException`.
//! - [`sqs::Sqs`]: an SQS queue (AWS JSON 1.0: `SendMessage`, `ReceiveMessage`, `DeleteMessage`,
//!   `GetQueueAttributes`), the dead-letter queue the stream processor's replay reads.
//! - [`streams`]: DynamoDB Streams records read through the Streams API, as the Lambda event.
//! - [`payments::PaymentApi`]: an HTTP payment API (authorize, capture, void) with idempotency keys as
//!   real payment APIs keep them, and injectable failures, late requests and late answers.
//!
//! Servers bind 127.0.0.1 (port 0 unless told otherwise) and stop when dropped.

pub mod apigw;
pub mod eventbridge;
pub mod firehose;
pub mod logs;
pub mod payments;
pub mod sqs;
pub mod streams;

use std::io;
use std::net::SocketAddr;

use tokio::task::JoinHandle;

/// An axum app served on a loopback port until dropped.
struct Server {
    url: String,
    task: JoinHandle<()>,
}

impl Server {
    async fn start(addr: &str, app: axum::Router) -> io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local: SocketAddr = listener.local_addr()?;
        let port = local.port();
        let app = app.layer(axum::middleware::from_fn(move |request, next| only_local_callers(port, request, next)));
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "local service stopped");
            }
        });
        Ok(Server { url: format!("http://{local}"), task })
    }

    fn url(&self) -> &str {
        &self.url
    }
}

/// The names a loopback server is reached by (it binds 127.0.0.1).
pub const LOCAL_NAMES: [&str; 2] = ["127.0.0.1", "localhost"];

/// Whether a `Host` header names the loopback server on `port` itself (`127.0.0.1:PORT` or
/// `localhost:PORT`), not a DNS-rebound name a page of another site made resolve to it.
pub fn is_local_host(host: &str, port: u16) -> bool {
    LOCAL_NAMES.iter().any(|name| host.eq_ignore_ascii_case(&format!("{name}:{port}")))
}

/// The stand-ins take unsigned requests, so a page open in the same browser could otherwise post to a
/// WebSocket client, write the lake, read the dead letters or capture a payment: refused are a request
/// with an `Origin` (a browser sends one on every cross-origin or POST request; the SDK clients and the
/// services that call these send none) and one whose `Host` is not this server's own address (a
/// DNS-rebound name).
async fn only_local_callers(
    port: u16,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    if !is_local_host(host, port) || headers.contains_key(header::ORIGIN) {
        tracing::warn!(host, origin = ?headers.get(header::ORIGIN), "refused a request a browser page could have sent");
        let message =
            format!("a local stand-in: only local clients (Host 127.0.0.1:{port} or localhost:{port}, no Origin)");
        return (StatusCode::FORBIDDEN, message).into_response();
    }
    next.run(request).await
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}
