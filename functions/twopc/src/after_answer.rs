//! Work a request leaves for after its answer (issue 48, answer on decision): the second phase of a
//! transaction whose caller asked to be answered as soon as its commit decision is durable
//! (`Prefer: respond-async`). Where it runs is the deployment's: in the local stack and the tests a task
//! of its own ([`Spawned`]); on Lambda, where a response is sent when the handler returns and the
//! environment is frozen once the invocation ends, the coordinator function's internal extension runs it
//! ([`Deferred`]) after the runtime posted the answer and before the invocation ends. Whatever stops it
//! (a crash, the function's timeout) leaves a COMMITTING record the sweeper finishes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

/// One piece of work for after the answer.
pub type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs work after the answer is sent.
pub trait AfterAnswer: Send + Sync {
    fn defer(&self, work: Work);
}

/// A task of its own: for a process that keeps running after it answers (the local stack, the tests).
#[derive(Debug, Default, Clone, Copy)]
pub struct Spawned;

impl AfterAnswer for Spawned {
    fn defer(&self, work: Work) {
        tokio::spawn(work);
    }
}

/// Held until [`Deferred::run`]: on Lambda, called by the coordinator function's internal extension once
/// the handler has answered.
#[derive(Default)]
pub struct Deferred {
    work: Mutex<Vec<Work>>,
}

impl Deferred {
    /// Runs every piece of work deferred so far, all at once, until each is done.
    pub async fn run(&self) {
        let work: Vec<Work> = std::mem::take(&mut *self.work.lock().expect("the deferred work is never poisoned"));
        futures::future::join_all(work).await;
    }

    /// How many pieces wait.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.work.lock().expect("the deferred work is never poisoned").len()
    }
}

impl AfterAnswer for Deferred {
    fn defer(&self, work: Work) {
        self.work.lock().expect("the deferred work is never poisoned").push(work);
    }
}

/// Whether an HTTP `Prefer` header (RFC 7240: preferences separated by commas, each a token, an optional
/// value and parameters after `;`, tokens case-insensitive) asks for `respond-async`.
pub fn prefers_respond_async(prefer: &str) -> bool {
    preferences(prefer).any(|token| token.eq_ignore_ascii_case("respond-async"))
}

/// The tokens of a `Prefer` field's preferences. A quoted value may hold commas, semicolons and escaped
/// quotes (RFC 9110's quoted-string): they separate nothing.
fn preferences(prefer: &str) -> impl Iterator<Item = &str> {
    let mut pieces = vec![];
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (at, c) in prefer.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                pieces.push(&prefer[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    pieces.push(&prefer[start..]);
    pieces.into_iter().map(|preference| preference.split([';', '=']).next().unwrap_or_default().trim())
}

/// The response header that says a preference was applied (RFC 7240).
pub const PREFERENCE_APPLIED: &str = "preference-applied";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn respond_async_is_read_among_other_preferences() {
        assert!(prefers_respond_async("respond-async"));
        assert!(prefers_respond_async("wait=10, Respond-Async"));
        assert!(prefers_respond_async("return=minimal; foo=\"bar\", respond-async; x=1"));
        assert!(!prefers_respond_async("return=representation"));
        assert!(!prefers_respond_async("respond-asynchronously"));
        assert!(!prefers_respond_async(""));
    }

    #[test]
    fn a_quoted_value_separates_no_preference() {
        assert!(!prefers_respond_async("foo=\"a, respond-async, b\""));
        assert!(!prefers_respond_async("foo=\"a \\\", respond-async\""));
        assert!(prefers_respond_async("foo=\"a, b\", respond-async"));
        assert!(prefers_respond_async("foo=\"a \\\" b\"; x=\";\", respond-async"));
    }

    #[tokio::test]
    async fn deferred_work_runs_only_when_asked() {
        let deferred = Deferred::default();
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
        deferred.defer(Box::pin(async move { sender.send(1).unwrap() }));
        assert_eq!(deferred.waiting(), 1);
        assert!(receiver.try_recv().is_err(), "not before run");
        deferred.run().await;
        assert_eq!(receiver.try_recv().unwrap(), 1);
        assert_eq!(deferred.waiting(), 0);
    }
}
