//! The transaction id on the X-Ray trace. With active tracing, Lambda records a segment per
//! invocation and hands the function its trace header; the function adds a subsegment annotated with
//! the transaction id, sent as UDP to the X-Ray daemon Lambda runs, so that the X-Ray console finds
//! every invocation of a transaction by `annotation.transaction_id = "tx-..."`. Without active tracing
//! (no daemon address, or a header that is not sampled) nothing is sent. The AWS SDK already passes
//! the header on to the participants' invocations, which join the same trace.

use std::net::UdpSocket;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// Lambda's variable for the daemon: `169.254.79.129:2000`, or `tcp:… udp:…`.
pub const DAEMON_ADDRESS: &str = "AWS_XRAY_DAEMON_ADDRESS";
/// The invocation's trace header, `Root=1-…;Parent=…;Sampled=1`, set by the Lambda runtime.
pub const TRACE_ID: &str = "_X_AMZN_TRACE_ID";

/// The annotation X-Ray indexes for search.
pub const TRANSACTION_ANNOTATION: &str = "transaction_id";

/// Where and under which segment to record, read from the environment of the current invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceContext {
    pub root: String,
    pub parent: String,
    /// UDP address of the daemon.
    pub daemon: String,
}

impl TraceContext {
    pub fn from_env() -> Option<TraceContext> {
        let header = std::env::var(TRACE_ID).ok()?;
        let daemon = std::env::var(DAEMON_ADDRESS).ok()?;
        TraceContext::parse(&header, &daemon)
    }

    /// `None` unless the header is sampled and names its root and parent.
    pub fn parse(header: &str, daemon_address: &str) -> Option<TraceContext> {
        let mut root = None;
        let mut parent = None;
        let mut sampled = false;
        for part in header.split(';') {
            match part.trim().split_once('=') {
                Some(("Root", v)) => root = Some(v.to_owned()),
                Some(("Parent", v)) => parent = Some(v.to_owned()),
                Some(("Sampled", v)) => sampled = v == "1",
                _ => {}
            }
        }
        // `udp:host:port tcp:host:port` or plain `host:port`: segments go over UDP.
        let daemon = daemon_address
            .split_whitespace()
            .find_map(|p| p.strip_prefix("udp:"))
            .or_else(|| daemon_address.split_whitespace().find(|p| !p.contains("tcp:")))?
            .to_owned();
        sampled.then_some(TraceContext { root: root?, parent: parent?, daemon })
    }
}

/// A subsegment of the invocation's segment, named `name`, from `start` to `end`, annotated with the
/// transaction id and the outcome.
pub fn subsegment(
    context: &TraceContext,
    name: &str,
    transaction_id: &str,
    outcome: &str,
    start: SystemTime,
    end: SystemTime,
) -> Value {
    let seconds = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs_f64();
    json!({
        "type": "subsegment",
        "name": name,
        "id": &uuid::Uuid::new_v4().simple().to_string()[..16],
        "trace_id": context.root,
        "parent_id": context.parent,
        "start_time": seconds(start),
        "end_time": seconds(end),
        "annotations": {TRANSACTION_ANNOTATION: transaction_id, "outcome": outcome},
    })
}

/// Sends a segment document to the daemon. Tracing is best effort: a failure is logged, never returned.
pub fn send(context: &TraceContext, document: &Value) {
    let datagram = format!("{{\"format\": \"json\", \"version\": 1}}\n{document}");
    let sent = UdpSocket::bind("0.0.0.0:0").and_then(|socket| socket.send_to(datagram.as_bytes(), &context.daemon));
    if let Err(e) = sent {
        tracing::debug!(error = %e, daemon = %context.daemon, "could not send the trace subsegment");
    }
}

/// Records that this invocation worked on `transaction_id`, when the invocation is traced.
pub fn record(name: &str, transaction_id: &str, outcome: &str, start: SystemTime) {
    if let Some(context) = TraceContext::from_env() {
        send(&context, &subsegment(&context, name, transaction_id, outcome, start, SystemTime::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";

    #[test]
    fn only_a_sampled_header_with_a_daemon_is_traced() {
        let context = TraceContext::parse(HEADER, "169.254.79.129:2000").unwrap();
        assert_eq!(context.root, "1-5759e988-bd862e3fe1be46a994272793");
        assert_eq!(context.parent, "53995c3f42cd8ad8");
        assert_eq!(context.daemon, "169.254.79.129:2000");
        let both = TraceContext::parse(HEADER, "tcp:127.0.0.1:2000 udp:127.0.0.2:2001").unwrap();
        assert_eq!(both.daemon, "127.0.0.2:2001");
        assert!(TraceContext::parse(&HEADER.replace("Sampled=1", "Sampled=0"), "127.0.0.1:2000").is_none());
        assert!(TraceContext::parse("Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1", "127.0.0.1:2000").is_none());
    }

    #[test]
    fn the_daemon_receives_a_subsegment_annotated_with_the_transaction_id() {
        let daemon = UdpSocket::bind("127.0.0.1:0").unwrap();
        daemon.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let context = TraceContext::parse(HEADER, &daemon.local_addr().unwrap().to_string()).unwrap();
        let start = SystemTime::now();
        send(&context, &subsegment(&context, "coordinator", "tx-42", "COMMITTED", start, start));

        let mut buffer = [0u8; 4096];
        let n = daemon.recv(&mut buffer).unwrap();
        let text = std::str::from_utf8(&buffer[..n]).unwrap();
        let (header, body) = text.split_once('\n').unwrap();
        assert_eq!(serde_json::from_str::<Value>(header).unwrap(), json!({"format": "json", "version": 1}));
        let document: Value = serde_json::from_str(body).unwrap();
        assert_eq!(document["type"], "subsegment");
        assert_eq!(document["trace_id"], "1-5759e988-bd862e3fe1be46a994272793");
        assert_eq!(document["parent_id"], "53995c3f42cd8ad8");
        assert_eq!(document["annotations"]["transaction_id"], "tx-42");
        assert_eq!(document["id"].as_str().unwrap().len(), 16);
    }
}
