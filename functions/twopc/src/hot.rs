//! Hot items, as one coordinator saw them: items whose lock refused a transaction for contention lately.
//!
//! A request that touches one prepares one participant at a time from its first attempt, starting with
//! that participant, as a retry does ([`crate::coordinator`]): holding nothing there, it waits its turn for
//! the item instead of locking its other items in parallel and being refused by an older holder. Only a
//! choice of order: any attempt may prepare in parallel or one at a time, so a stale or missing entry
//! costs a little latency or an avoidable refusal, never correctness. Kept in the coordinator's memory
//! (each Lambda instance learns its own), a few seconds per item, bounded in size.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::access::entity_ids;
use crate::record::ParticipantEntry;

/// An item stays hot this long after its last refusal for contention.
const HOT_FOR: Duration = Duration::from_secs(2);
/// At most this many items are remembered; past it the oldest entries are dropped.
const MAX_HOT_ITEMS: usize = 4_096;

#[derive(Debug, Default)]
pub struct HotItems {
    /// Service → `entityId` → when it last refused: looked up by `&str`, without building a key.
    seen: Mutex<HashMap<String, HashMap<String, Instant>>>,
}

impl HotItems {
    /// The items of `entry` (a participant whose prepare was refused for contention) are hot from now.
    pub fn mark(&self, entry: &ParticipantEntry) {
        let now = Instant::now();
        let mut seen = self.seen.lock().expect("the hot items' lock is never poisoned");
        if seen.values().map(HashMap::len).sum::<usize>() >= MAX_HOT_ITEMS {
            for items in seen.values_mut() {
                items.retain(|_, at| now.duration_since(*at) < HOT_FOR);
            }
            seen.retain(|_, items| !items.is_empty());
            if seen.values().map(HashMap::len).sum::<usize>() >= MAX_HOT_ITEMS {
                seen.clear();
            }
        }
        let items = seen.entry(entry.service.clone()).or_default();
        for id in entity_ids(&entry.operations) {
            items.insert(id, now);
        }
    }

    /// The participant of `participants` to prepare first because it has a hot item, if any: of several,
    /// the first by service and entity ids, an order every coordinator shares. Requests on the same hot
    /// items then take them in the same order, so whoever holds the item a request meets second has
    /// already taken its first and is finishing, instead of waiting for an item the request holds.
    pub fn first_hot(&self, participants: &[ParticipantEntry]) -> Option<usize> {
        let now = Instant::now();
        let seen = self.seen.lock().expect("the hot items' lock is never poisoned");
        if seen.is_empty() {
            return None;
        }
        participants
            .iter()
            .enumerate()
            .filter_map(|(index, entry)| {
                let items = seen.get(&entry.service)?;
                let ids = entity_ids(&entry.operations);
                let hot = ids.iter().any(|id| items.get(id).is_some_and(|at| now.duration_since(*at) < HOT_FOR));
                hot.then_some(((entry.service.as_str(), ids), index))
            })
            .min()
            .map(|(_, index)| index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(service: &str, id: &str) -> ParticipantEntry {
        let operation = serde_json::json!({"op": "add", "key": {"entityId": id}, "field": "n", "delta": 1});
        ParticipantEntry::new(service.to_owned(), vec![crate::model::Operation::parse(&operation, "op").unwrap()])
    }

    #[test]
    fn a_refused_participants_items_make_a_request_start_there() {
        let hot = HotItems::default();
        let request = [entry("service-a", "A"), entry("service-b", "B")];
        assert_eq!(hot.first_hot(&request), None);
        hot.mark(&entry("service-b", "B"));
        assert_eq!(hot.first_hot(&request), Some(1));
        assert_eq!(hot.first_hot(&[entry("service-a", "B"), entry("service-b", "C")]), None, "per service and item");
    }

    #[test]
    fn of_several_hot_participants_every_request_starts_with_the_same_one() {
        let hot = HotItems::default();
        hot.mark(&entry("service-b", "B"));
        hot.mark(&entry("service-a", "A"));
        assert_eq!(hot.first_hot(&[entry("service-a", "A"), entry("service-b", "B")]), Some(0));
        assert_eq!(hot.first_hot(&[entry("service-b", "B"), entry("service-a", "A")]), Some(1), "whatever the order");
        hot.mark(&entry("service-a", "C"));
        assert_eq!(hot.first_hot(&[entry("service-a", "C"), entry("service-a", "A")]), Some(1), "then by entity");
    }
}
