//! Where dead letters are kept: the deployed SQS queue, and a folder of JSON files in the local stack.
//! Each is both what the processor dead-letters a record to ([`RecordDeadLetters`]) and what
//! [`super::replay`] reads back and deletes from ([`DeadLetters`]), so the processor and the replay run
//! the same code on either.

use std::collections::BTreeSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::MAX_RECEIVE;
use super::letters::{DeadLetterBody, OnFailureRecord};

/// Where the processor dead-letters a record it gives up on (see [`UnprocessableRecord`]).
pub trait RecordDeadLetters: Send + Sync {
    fn put<'a>(&'a self, body: &'a str) -> futures::future::BoxFuture<'a, Result<(), SourceError>>;
}

/// One message of a dead-letter source: a handle to delete it by, and its body (an [`OnFailureRecord`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub handle: String,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("dead-letter source: {0}")]
pub struct SourceError(pub String);

/// Where dead letters are read from.
pub trait DeadLetters: Send + Sync {
    /// At most `max` messages not handed out before in this run (a message received and kept is not
    /// received again by the same run: SQS hides it for its visibility timeout).
    fn receive(&self, max: usize) -> impl Future<Output = Result<Vec<DeadLetter>, SourceError>> + Send;
    /// Removes a message for good (it was replayed).
    fn delete(&self, handle: &str) -> impl Future<Output = Result<(), SourceError>> + Send;
    /// How many messages the source still holds (SQS: `ApproximateNumberOfMessages`).
    fn remaining(&self) -> impl Future<Output = Result<u64, SourceError>> + Send;
}

/// The deployed dead-letter queue.
#[derive(Debug, Clone)]
pub struct SqsDeadLetters {
    client: aws_sdk_sqs::Client,
    queue_url: String,
}

impl SqsDeadLetters {
    pub fn new(client: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        SqsDeadLetters { client, queue_url: queue_url.into() }
    }

    /// A client on the shared AWS configuration (`AWS_ENDPOINT_URL_SQS` points it elsewhere).
    pub fn from_config(sdk: &aws_config::SdkConfig, queue_url: impl Into<String>) -> Self {
        Self::new(aws_sdk_sqs::Client::new(sdk), queue_url)
    }
}

fn sdk_error<E: std::error::Error + Send + Sync + 'static, R: std::fmt::Debug>(
    what: &str,
    e: aws_smithy_runtime_api::client::result::SdkError<E, R>,
) -> SourceError {
    SourceError(format!("{what}: {}", aws_smithy_types::error::display::DisplayErrorContext(&e)))
}

impl RecordDeadLetters for SqsDeadLetters {
    fn put<'a>(&'a self, body: &'a str) -> futures::future::BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            self.client
                .send_message()
                .queue_url(&self.queue_url)
                .message_body(body)
                .send()
                .await
                .map_err(|e| sdk_error("SendMessage", e))?;
            Ok(())
        })
    }
}

impl DeadLetters for SqsDeadLetters {
    async fn receive(&self, max: usize) -> Result<Vec<DeadLetter>, SourceError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(max.clamp(1, MAX_RECEIVE) as i32)
            // A short long poll: an empty answer then means the queue has nothing visible, not that
            // the servers sampled happened to hold nothing.
            .wait_time_seconds(1)
            .send()
            .await
            .map_err(|e| sdk_error("ReceiveMessage", e))?;
        Ok(out
            .messages
            .unwrap_or_default()
            .into_iter()
            .map(|m| DeadLetter { handle: m.receipt_handle.unwrap_or_default(), body: m.body.unwrap_or_default() })
            .collect())
    }

    async fn delete(&self, handle: &str) -> Result<(), SourceError> {
        self.client
            .delete_message()
            .queue_url(&self.queue_url)
            .receipt_handle(handle)
            .send()
            .await
            .map_err(|e| sdk_error("DeleteMessage", e))?;
        Ok(())
    }

    async fn remaining(&self) -> Result<u64, SourceError> {
        use aws_sdk_sqs::types::QueueAttributeName;
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .map_err(|e| sdk_error("GetQueueAttributes", e))?;
        let text = out
            .attributes
            .as_ref()
            .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages))
            .ok_or_else(|| SourceError("GetQueueAttributes answered no ApproximateNumberOfMessages".into()))?;
        text.parse().map_err(|_| SourceError(format!("ApproximateNumberOfMessages {text:?} is not a number")))
    }
}

/// A folder of dead letters, one JSON file per message (the local stack's `.local/dead-letters/`):
/// the handle is the file's path; a replayed message's file is deleted.
#[derive(Debug)]
pub struct DirectoryDeadLetters {
    dir: PathBuf,
    /// Handed out in this run: not handed out again (as SQS's visibility timeout).
    received: Mutex<BTreeSet<PathBuf>>,
}

impl DirectoryDeadLetters {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        DirectoryDeadLetters { dir: dir.into(), received: Mutex::new(BTreeSet::new()) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The message files, oldest first (their names start with the time they were written).
    pub fn files(&self) -> std::io::Result<Vec<PathBuf>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(e),
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        Ok(files)
    }

    /// Writes one message (written aside, then renamed: a reader never sees half of it). Its name:
    /// `<UTC time>-<shard id>-<first sequence number>.json`.
    pub fn put(&self, record: &OnFailureRecord) -> std::io::Result<PathBuf> {
        let body = serde_json::to_vec_pretty(record).expect("a record serializes");
        self.write(&format!("{}-{}", safe(&record.batch.shard_id), safe(&record.batch.start_sequence_number)), &body)
    }

    fn write(&self, what: &str, body: &[u8]) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let now = chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ");
        let path = self.dir.join(format!("{now}-{what}.json"));
        let partial = path.with_extension("partial");
        std::fs::write(&partial, body)?;
        std::fs::rename(&partial, &path)?;
        Ok(path)
    }
}

/// A file name's part from any text: letters, digits, `-`, `_` and `.` kept, the rest `_`.
fn safe(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' }).collect()
}

/// A record the processor dead-lettered: `<UTC time>-unprocessable-<eventID>.json`.
impl RecordDeadLetters for DirectoryDeadLetters {
    fn put<'a>(&'a self, body: &'a str) -> futures::future::BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let event_id = DeadLetterBody::parse(body)
                .ok()
                .and_then(|b| match b {
                    DeadLetterBody::Unprocessable(u) => Some(u.record.event_id),
                    DeadLetterBody::OnFailure(_) => None,
                })
                .unwrap_or_default();
            self.write(&format!("unprocessable-{}", safe(&event_id)), body.as_bytes())
                .map(|_| ())
                .map_err(|e| SourceError(format!("writing to {}: {e}", self.dir.display())))
        })
    }
}

impl DeadLetters for DirectoryDeadLetters {
    async fn receive(&self, max: usize) -> Result<Vec<DeadLetter>, SourceError> {
        let files = self.files().map_err(|e| SourceError(format!("listing {}: {e}", self.dir.display())))?;
        let mut received = self.received.lock().expect("not poisoned");
        let mut out = Vec::new();
        for file in files {
            if out.len() >= max {
                break;
            }
            if received.contains(&file) {
                continue;
            }
            let body =
                std::fs::read_to_string(&file).map_err(|e| SourceError(format!("reading {}: {e}", file.display())))?;
            received.insert(file.clone());
            out.push(DeadLetter { handle: file.display().to_string(), body });
        }
        Ok(out)
    }

    async fn delete(&self, handle: &str) -> Result<(), SourceError> {
        std::fs::remove_file(handle).map_err(|e| SourceError(format!("deleting {handle}: {e}")))
    }

    async fn remaining(&self) -> Result<u64, SourceError> {
        let files = self.files().map_err(|e| SourceError(format!("listing {}: {e}", self.dir.display())))?;
        Ok(files.len() as u64)
    }
}
