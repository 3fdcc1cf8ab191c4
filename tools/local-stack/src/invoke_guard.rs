//! The guard in front of each `cargo lambda watch` Invoke API under `up --lambda`.
//!
//! `cargo lambda watch` invokes a function for any `POST /2015-03-31/functions/{name}/invocations` it
//! gets, from anyone: a web page open in a browser on this machine could send one (a "simple" no-cors
//! POST needs no preflight, and its `Host` is genuinely `127.0.0.1:PORT`) and so invoke the coordinator
//! with an API Gateway event that names any caller, admin included, or a participant with a message
//! signed with the public development keys. The stack therefore runs each watch on a port of its own
//! and hands out the guard's port instead, which forwards only what no page can send:
//!
//! - only the Invoke API's route (`POST /2015-03-31/functions/{name}/invocations`); not the watch's
//!   function URLs (`/lambda-url/...`, which a page's plain GET could reach) nor its runtime API;
//! - `Host` is the guard itself (`127.0.0.1:PORT` or `localhost:PORT`), not a DNS-rebound name;
//! - no `Origin` and no `Sec-Fetch-*` header: a browser sends `Origin` on every POST and `Sec-Fetch-*`
//!   on every request; the AWS SDK and `cargo lambda invoke` send neither;
//! - no CORS-safelisted `Content-Type` (`text/plain`, `application/x-www-form-urlencoded`,
//!   `multipart/form-data`): the only ones a page may send without a preflight. The SDK sends
//!   `application/octet-stream`; `cargo lambda invoke` sends none (a browser's bodies of other kinds
//!   carry an `Origin`, see above).
//!
//! The watches themselves listen on ports that browsers refuse to fetch from at all (the Fetch
//! standard's "bad ports"), where such a port is free, so that a page cannot go round the guard by
//! finding the watch's own port.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;
use tracing::{error, warn};

use crate::Error;

/// The Invoke API's route: `POST /2015-03-31/functions/{name}/invocations`.
const INVOKE_PREFIX: &str = "/2015-03-31/functions/";
const INVOKE_SUFFIX: &str = "/invocations";

/// Lambda's synchronous payload limit is 6 MB; a little more, so that the watch says it is too large.
const MAX_PAYLOAD: usize = 8 * 1024 * 1024;

/// The content types a page may send cross-origin without a CORS preflight (the Fetch standard's
/// CORS-safelisted request-header `Content-Type`).
const SAFELISTED_CONTENT_TYPES: [&str; 3] = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"];

/// Ports ≥ 1024 every browser refuses to fetch from (the Fetch standard's "bad port" list), less those
/// of services a developer's machine is likely to run (X11's 6000, NFS's 2049).
const BROWSER_BLOCKED_PORTS: [u16; 15] =
    [6665, 6666, 6667, 6668, 6669, 6679, 6697, 10080, 4190, 3659, 4045, 1719, 1720, 1723, 6566];

/// The blocked ports this process has handed to a watch that is still running (two stacks in one
/// process, as in a test binary, must not pick the same one between the check and the watch's bind).
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A port for a watch's own Invoke API: a free one of [`BROWSER_BLOCKED_PORTS`] when there is one,
/// else any free port (with a warning: a page could then find it and go round the guard).
pub(crate) fn watch_port() -> Result<WatchPort, Error> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for port in BROWSER_BLOCKED_PORTS {
        if !handed_out.contains(&port) && crate::ports::check(port, "a cargo lambda watch", "--invoke-port").is_ok() {
            handed_out.insert(port);
            return Ok(WatchPort { port, blocked: true });
        }
    }
    let port = crate::ports::free_port()?;
    warn!(
        port,
        "no port that browsers refuse is free for a cargo lambda watch: its own Invoke API on 127.0.0.1:{port} is \
         unguarded (the stack hands out the guarded port)"
    );
    Ok(WatchPort { port, blocked: false })
}

/// The port a watch listens on, handed back when dropped.
#[derive(Debug)]
pub(crate) struct WatchPort {
    pub(crate) port: u16,
    blocked: bool,
}

impl Drop for WatchPort {
    fn drop(&mut self) {
        if self.blocked {
            HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.port);
        }
    }
}

/// Why a request may not reach the watch: the status and what to say.
pub(crate) fn refusal(method: &Method, path: &str, headers: &HeaderMap, port: u16) -> Option<(StatusCode, String)> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    if !local_services::is_local_host(host, port) {
        return Some((
            StatusCode::FORBIDDEN,
            format!("Host {host:?} is not this Invoke API (127.0.0.1:{port} or localhost:{port})"),
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        return Some((
            StatusCode::FORBIDDEN,
            format!(
                "a request with Origin {origin:?} comes from a browser page: the Invoke API answers only local clients"
            ),
        ));
    }
    if let Some(name) = headers.keys().find(|name| name.as_str().starts_with("sec-fetch-")) {
        return Some((
            StatusCode::FORBIDDEN,
            format!("a request with {name} comes from a browser: the Invoke API answers only local clients"),
        ));
    }
    if let Some(content_type) = headers.get(header::CONTENT_TYPE) {
        let text = String::from_utf8_lossy(content_type.as_bytes());
        let essence = text.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        if SAFELISTED_CONTENT_TYPES.contains(&essence.as_str()) {
            return Some((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "Content-Type {text:?} is what a browser page may send without asking: the Invoke API takes \
                     application/octet-stream, application/json or none"
                ),
            ));
        }
    }
    let is_invoke = path
        .strip_prefix(INVOKE_PREFIX)
        .and_then(|rest| rest.strip_suffix(INVOKE_SUFFIX))
        .is_some_and(|name| !name.is_empty() && !name.contains('/'));
    if method != Method::POST || !is_invoke {
        return Some((
            StatusCode::NOT_FOUND,
            format!(
                "{method} {path}: the guarded Invoke API forwards only POST {INVOKE_PREFIX}{{name}}{INVOKE_SUFFIX}"
            ),
        ));
    }
    None
}

struct Guard {
    port: u16,
    upstream: String,
    client: reqwest::Client,
}

/// Serves the guard on `listener`, forwarding what it lets through to the watch on 127.0.0.1:`upstream`.
/// Runs until the returned task is aborted.
pub(crate) fn serve(listener: TcpListener, upstream: u16) -> Result<GuardTask, Error> {
    let address: SocketAddr =
        listener.local_addr().map_err(|source| Error::Io { what: "the invoke guard's address".into(), source })?;
    let client = twopc::https::client_builder()
        .no_proxy()
        .build()
        .map_err(|e| Error::Lambda(format!("the invoke guard's HTTP client: {e}")))?;
    let guard = Guard { port: address.port(), upstream: format!("http://127.0.0.1:{upstream}"), client };
    let app = Router::new().fallback(forward).with_state(Arc::new(guard));
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            error!(error = %e, "an invoke guard stopped");
        }
    });
    Ok(GuardTask { task })
}

/// A running guard, stopped when dropped.
pub(crate) struct GuardTask {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GuardTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Headers that belong to one connection, not to the request or answer.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host" | "connection" | "keep-alive" | "transfer-encoding" | "te" | "upgrade" | "content-length"
    ) || name.as_str().starts_with("proxy-")
}

async fn forward(State(guard): State<Arc<Guard>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    if let Some((status, message)) = refusal(&parts.method, path, &parts.headers, guard.port) {
        warn!("{} {path} refused at the invoke guard on port {}: {message}", parts.method, guard.port);
        return (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], message).into_response();
    }
    let Ok(body) = axum::body::to_bytes(body, MAX_PAYLOAD).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "the payload is larger than the Invoke API takes").into_response();
    };
    let path_and_query = parts.uri.path_and_query().map_or(path, |p| p.as_str());
    let mut upstream = guard.client.post(format!("{}{path_and_query}", guard.upstream)).body(body);
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            upstream = upstream.header(name, value);
        }
    }
    let answer = match upstream.send().await {
        Ok(answer) => answer,
        Err(e) => {
            error!(error = %e, "the invoke guard on port {} could not reach its cargo lambda watch", guard.port);
            return (StatusCode::BAD_GATEWAY, format!("the cargo lambda watch behind this port did not answer: {e}"))
                .into_response();
        }
    };
    let status = answer.status();
    let headers = answer.headers().clone();
    let body = match answer.bytes().await {
        Ok(body) => body,
        Err(e) => {
            return (StatusCode::BAD_GATEWAY, format!("the cargo lambda watch's answer broke off: {e}"))
                .into_response();
        }
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    for (name, value) in &headers {
        if !hop_by_hop(name) {
            response.headers_mut().append(name, value.clone());
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_lambda::primitives::Blob;
    use std::sync::Mutex as StdMutex;

    /// A stand-in for `cargo lambda watch`: answers every invocation with the payload it got, and
    /// records what reached it.
    async fn fake_watch() -> (u16, Arc<StdMutex<Vec<String>>>) {
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let recorded = seen.clone();
        let app = Router::new().fallback(move |request: Request| {
            let recorded = recorded.clone();
            async move {
                let path = request.uri().path().to_owned();
                let body = axum::body::to_bytes(request.into_body(), MAX_PAYLOAD).await.unwrap_or_default();
                recorded.lock().unwrap().push(format!("{path} {}", String::from_utf8_lossy(&body)));
                ([(header::CONTENT_TYPE, "application/json")], body).into_response()
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (port, seen)
    }

    /// A page's no-cors POST (text/plain, a form, or a body with no type: each with the page's
    /// `Origin`), a DNS-rebound page's, and a function URL reach no function; the AWS SDK's Invoke and
    /// `cargo lambda invoke`'s request do.
    #[tokio::test]
    async fn a_browser_cannot_invoke_through_the_guard_and_the_sdk_can() {
        let (watch, seen) = fake_watch().await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let _guard = serve(listener, watch).unwrap();
        let http = twopc::https::client_builder().no_proxy().build().unwrap();
        let invoke = format!("http://127.0.0.1:{port}/2015-03-31/functions/coordinator/invocations");

        type Headers = Vec<(&'static str, &'static str)>;
        let attacks: Vec<(&str, Headers, u16)> = vec![
            ("a no-cors text/plain POST", vec![("content-type", "text/plain;charset=UTF-8")], 415),
            ("a form", vec![("content-type", "application/x-www-form-urlencoded")], 415),
            ("a multipart form", vec![("content-type", "multipart/form-data; boundary=x")], 415),
            (
                "a page's no-cors POST",
                vec![
                    ("origin", "https://evil.example"),
                    ("content-type", "text/plain"),
                    ("sec-fetch-mode", "no-cors"),
                    ("sec-fetch-site", "cross-site"),
                ],
                403,
            ),
            ("a page's POST of bytes (no Content-Type)", vec![("origin", "https://evil.example")], 403),
            ("an opaque origin", vec![("origin", "null"), ("content-type", "application/json")], 403),
            ("a browser's fetch metadata alone", vec![("sec-fetch-site", "cross-site")], 403),
            ("a DNS-rebound page", vec![("host", "rebound.evil.example:9000")], 403),
        ];
        for (what, headers, status) in attacks {
            let mut request = http.post(&invoke).body(r#"{"httpMethod":"POST"}"#);
            for (name, value) in headers {
                request = request.header(name, value);
            }
            let answer = request.send().await.unwrap();
            assert_eq!(answer.status().as_u16(), status, "{what}: {}", answer.text().await.unwrap());
        }
        let function_url = http.get(format!("http://127.0.0.1:{port}/lambda-url/coordinator/transactions/x"));
        assert_eq!(function_url.send().await.unwrap().status().as_u16(), 404);
        assert!(seen.lock().unwrap().is_empty(), "nothing reached the watch: {:?}", seen.lock().unwrap());

        // The stack's own invokes: the AWS SDK (application/octet-stream, SigV4, no Origin) ...
        let config = aws_sdk_lambda::Config::builder()
            .behavior_version(aws_sdk_lambda::config::BehaviorVersion::latest())
            .region(aws_sdk_lambda::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_lambda::config::Credentials::new("local", "local", None, None, "test"))
            .endpoint_url(format!("http://127.0.0.1:{port}"))
            .build();
        let sdk = aws_sdk_lambda::Client::from_conf(config);
        let answer = sdk
            .invoke()
            .function_name("coordinator")
            .payload(Blob::new(r#"{"from":"sdk"}"#))
            .send()
            .await
            .expect("the SDK's invoke goes through");
        assert_eq!(answer.payload().map(|p| p.as_ref()), Some(&br#"{"from":"sdk"}"#[..]));
        // ... and `cargo lambda invoke` (no Content-Type, no Origin), by localhost too.
        let answer = http
            .post(format!("http://localhost:{port}/2015-03-31/functions/participant/invocations"))
            .body(r#"{"from":"cargo lambda invoke"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 200);
        assert_eq!(
            *seen.lock().unwrap(),
            [
                r#"/2015-03-31/functions/coordinator/invocations {"from":"sdk"}"#,
                r#"/2015-03-31/functions/participant/invocations {"from":"cargo lambda invoke"}"#,
            ]
        );
    }

    #[test]
    fn a_watch_gets_a_port_browsers_refuse_while_one_is_free() {
        let first = watch_port().unwrap();
        let second = watch_port().unwrap();
        assert!(BROWSER_BLOCKED_PORTS.contains(&first.port), "{first:?}");
        assert_ne!(first.port, second.port, "a port handed out is not handed out again while in use");
        let port = first.port;
        drop(first);
        assert!(!HANDED_OUT.lock().unwrap().contains(&port));
    }
}
