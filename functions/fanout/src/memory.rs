//! In-memory edges for unit tests, examples and event checks: a sink that keeps what it accepts,
//! a poster that records posts (and answers Gone for ids it is told are gone), subscriptions in a map.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use twopc::access::{Caller, Policy};

use super::lake::{ChangeSink, EntryResult, SinkError};
use super::realtime::{ConnectionPoster, PostError, StoreError, Subscriptions};
use super::topic::Topic;

/// Accepts every record and keeps it.
#[derive(Debug, Default)]
pub struct MemorySink {
    records: Mutex<Vec<Vec<u8>>>,
}

impl MemorySink {
    pub fn records(&self) -> Vec<Vec<u8>> {
        self.records.lock().expect("not poisoned").clone()
    }

    /// Every record parsed as JSON.
    pub fn json(&self) -> Vec<serde_json::Value> {
        self.records().iter().map(|r| serde_json::from_slice(r).expect("records are JSON")).collect()
    }
}

impl ChangeSink for MemorySink {
    async fn put_batch(&self, records: &[&[u8]]) -> Result<Vec<EntryResult>, SinkError> {
        let mut kept = self.records.lock().expect("not poisoned");
        kept.extend(records.iter().map(|r| r.to_vec()));
        Ok(vec![EntryResult::Accepted; records.len()])
    }
}

/// Records posts by connection; ids in `gone` answer Gone.
#[derive(Debug, Default)]
pub struct MemoryPoster {
    posts: Mutex<BTreeMap<String, Vec<Vec<u8>>>>,
    gone: Mutex<BTreeSet<String>>,
}

impl MemoryPoster {
    pub fn set_gone(&self, connection_id: &str) {
        self.gone.lock().expect("not poisoned").insert(connection_id.to_owned());
    }

    pub fn posts(&self, connection_id: &str) -> Vec<Vec<u8>> {
        self.posts.lock().expect("not poisoned").get(connection_id).cloned().unwrap_or_default()
    }
}

impl ConnectionPoster for MemoryPoster {
    async fn post(&self, connection_id: &str, payload: &[u8]) -> Result<(), PostError> {
        if self.gone.lock().expect("not poisoned").contains(connection_id) {
            return Err(PostError::Gone);
        }
        let mut posts = self.posts.lock().expect("not poisoned");
        posts.entry(connection_id.to_owned()).or_default().push(payload.to_vec());
        Ok(())
    }
}

/// (topic, connection) pairs.
#[derive(Debug, Default)]
pub struct MemorySubscriptions {
    pairs: Mutex<BTreeSet<(String, String)>>,
    callers: Mutex<HashMap<String, Caller>>,
}

impl MemorySubscriptions {
    /// The caller of `connection_id` from now on.
    pub fn connect_as(&self, connection_id: &str, caller: Caller) {
        self.callers.lock().expect("not poisoned").insert(connection_id.to_owned(), caller);
    }

    pub fn subscribe(&self, connection_id: &str, topic: &Topic) {
        self.pairs.lock().expect("not poisoned").insert((topic.to_string(), connection_id.to_owned()));
    }

    pub fn connections(&self) -> BTreeSet<String> {
        self.pairs.lock().expect("not poisoned").iter().map(|(_, c)| c.clone()).collect()
    }
}

impl Subscriptions for MemorySubscriptions {
    async fn subscribers(&self, topic: &Topic) -> Result<Vec<String>, StoreError> {
        let topic = topic.to_string();
        Ok(self
            .pairs
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|(t, _)| *t == topic)
            .map(|(_, c)| c.clone())
            .collect())
    }

    async fn remove_connection(&self, connection_id: &str) -> Result<usize, StoreError> {
        let mut pairs = self.pairs.lock().expect("not poisoned");
        let before = pairs.len();
        pairs.retain(|(_, c)| c != connection_id);
        Ok(before - pairs.len())
    }

    /// Every connection it knows, as a caller with no identity (an admin under the default policy),
    /// unless [`MemorySubscriptions::connect_as`] named another.
    async fn callers(&self, connection_ids: &[String]) -> Result<HashMap<String, Caller>, StoreError> {
        let known = self.connections();
        let named = self.callers.lock().expect("not poisoned");
        Ok(connection_ids
            .iter()
            .filter(|id| known.contains(*id))
            .map(|id| (id.clone(), named.get(id).cloned().unwrap_or_else(|| Policy::default().iam(None))))
            .collect())
    }
}
