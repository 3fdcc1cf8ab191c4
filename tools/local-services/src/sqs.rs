//! An SQS queue endpoint: the AWS JSON 1.0 protocol `aws-sdk-sqs` speaks (`X-Amz-Target:
//! AmazonSQS.<Operation>`), for the operations the dead-letter replay uses: `SendMessage`,
//! `ReceiveMessage` (a received message is invisible until deleted, for the rest of the endpoint's
//! life: a visibility timeout longer than any test), `DeleteMessage` and `GetQueueAttributes`
//! (`ApproximateNumberOfMessages`: the visible ones). One queue, whatever `QueueUrl` names.
//! `WaitTimeSeconds` is not waited: an empty queue answers at once.

use std::io;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::Server;

const TARGET_PREFIX: &str = "AmazonSQS.";

#[derive(Debug, Clone)]
struct Message {
    id: String,
    body: String,
    /// The receipt handle of its last receive; None while visible.
    received: Option<String>,
}

#[derive(Default)]
struct Queue {
    messages: Vec<Message>,
    next: u64,
}

/// A running SQS endpoint on 127.0.0.1. Stops when dropped.
pub struct Sqs {
    server: Server,
    queue: Arc<Mutex<Queue>>,
}

impl Sqs {
    pub async fn start() -> io::Result<Self> {
        let queue = Arc::new(Mutex::new(Queue::default()));
        let app = Router::new().route("/", axum::routing::post(handle)).with_state(queue.clone());
        let server = Server::start("127.0.0.1:0", app).await?;
        Ok(Sqs { server, queue })
    }

    /// `http://127.0.0.1:PORT`, for `endpoint_url`.
    pub fn url(&self) -> &str {
        self.server.url()
    }

    /// A queue URL the endpoint answers for.
    pub fn queue_url(&self) -> String {
        format!("{}/000000000000/dead-letters", self.url())
    }

    /// Enqueues a message, as Lambda's on-failure destination does.
    pub fn send(&self, body: &str) -> String {
        send(&mut self.queue.lock().expect("not poisoned"), body)
    }

    /// Bodies of the messages not deleted (received or not).
    pub fn bodies(&self) -> Vec<String> {
        self.queue.lock().expect("not poisoned").messages.iter().map(|m| m.body.clone()).collect()
    }

    /// Makes every received message visible again (its visibility timeout ran out).
    pub fn expire_visibility(&self) {
        for message in &mut self.queue.lock().expect("not poisoned").messages {
            message.received = None;
        }
    }
}

fn send(queue: &mut Queue, body: &str) -> String {
    queue.next += 1;
    let id = format!("00000000-0000-4000-8000-{:012}", queue.next);
    queue.messages.push(Message { id: id.clone(), body: body.to_owned(), received: None });
    id
}

fn answer(status: StatusCode, body: Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-amz-json-1.0"));
    response
}

fn error(status: StatusCode, error_type: &str, message: &str) -> Response {
    let mut response = answer(status, json!({"__type": format!("com.amazonaws.sqs#{error_type}"), "message": message}));
    if let Ok(value) = HeaderValue::from_str(error_type) {
        response.headers_mut().insert("x-amzn-query-error", value);
    }
    response
}

async fn handle(State(queue): State<Arc<Mutex<Queue>>>, headers: HeaderMap, body: Bytes) -> Response {
    let target = headers.get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let Some(operation) = target.strip_prefix(TARGET_PREFIX) else {
        return error(StatusCode::BAD_REQUEST, "UnsupportedOperation", &format!("unknown target {target:?}"));
    };
    let Ok(input) = serde_json::from_slice::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "InvalidParameterValue", "the body is not JSON");
    };
    let mut queue = queue.lock().expect("not poisoned");
    match operation {
        "SendMessage" => {
            let Some(body) = input["MessageBody"].as_str() else {
                return error(StatusCode::BAD_REQUEST, "MissingParameter", "MessageBody is required");
            };
            let id = send(&mut queue, body);
            answer(StatusCode::OK, json!({"MessageId": id}))
        }
        "ReceiveMessage" => {
            let max = input["MaxNumberOfMessages"].as_u64().unwrap_or(1);
            if !(1..=10).contains(&max) {
                return error(StatusCode::BAD_REQUEST, "InvalidParameterValue", "MaxNumberOfMessages is 1 to 10");
            }
            queue.next += 1;
            let round = queue.next;
            let mut out = Vec::new();
            for (i, message) in
                queue.messages.iter_mut().filter(|m| m.received.is_none()).take(max as usize).enumerate()
            {
                let handle = format!("{}#{round}-{i}", message.id);
                message.received = Some(handle.clone());
                out.push(json!({"MessageId": message.id, "ReceiptHandle": handle, "Body": message.body}));
            }
            answer(StatusCode::OK, if out.is_empty() { json!({}) } else { json!({"Messages": out}) })
        }
        "DeleteMessage" => {
            let handle = input["ReceiptHandle"].as_str().unwrap_or_default();
            let before = queue.messages.len();
            queue.messages.retain(|m| m.received.as_deref() != Some(handle));
            if queue.messages.len() == before {
                return error(StatusCode::BAD_REQUEST, "ReceiptHandleIsInvalid", "no message has this receipt handle");
            }
            answer(StatusCode::OK, json!({}))
        }
        "GetQueueAttributes" => {
            let visible = queue.messages.iter().filter(|m| m.received.is_none()).count();
            let in_flight = queue.messages.len() - visible;
            answer(
                StatusCode::OK,
                json!({"Attributes": {
                    "ApproximateNumberOfMessages": visible.to_string(),
                    "ApproximateNumberOfMessagesNotVisible": in_flight.to_string(),
                }}),
            )
        }
        other => error(StatusCode::BAD_REQUEST, "UnsupportedOperation", &format!("{other} is not served here")),
    }
}
