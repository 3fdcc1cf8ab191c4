//! The parsers of untrusted requests, fed the same bytes: the coordinator's `POST /transactions`
//! body, a participant's invocation message and a WebSocket message. One target for the three
//! because they share most of their input shape (JSON objects of operations), so an input that finds
//! new code in one is a good seed for the others.
//!
//! Besides "no panic", what each accepts must survive the trip the system gives it: the coordinator
//! re-serialises an accepted request for its participants and hashes it for `Idempotency-Key`, so
//! the wire form must parse back to the same request with the same hash, and participants must
//! accept every operation the coordinator accepted.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use twopc::custom::Catalog;
use twopc::model::{MAX_BODY_BYTES, Message, Operation, ParticipantRequest};
use twopc::participant::parse_operations;
use twopc_fanout::connections::{ConnectionRequest, parse_request};
use twopc_fanout::topic::{MAX_TOPIC_BYTES, Topic};

fn is_registered(service: &str) -> bool {
    matches!(service, "service-a" | "service-b")
}

fn check_transaction_request(data: &[u8]) {
    let Ok(request) = twopc::coordinator::parse_request(data, is_registered) else {
        return;
    };
    let hash = request.canonical_hash();
    assert_eq!(hash, request.canonical_hash(), "the hash of one request changed between two calls");

    let wire = request.to_json();
    for text in [serde_json::to_vec(&wire).unwrap(), serde_json::to_vec_pretty(&wire).unwrap()] {
        // Indentation can take a deeply nested request past the body limit, which is no defect.
        if text.len() > MAX_BODY_BYTES {
            continue;
        }
        let again = twopc::coordinator::parse_request(&text, is_registered).unwrap_or_else(|e| {
            panic!("the wire form of an accepted request is refused: {e}\n{}", String::from_utf8_lossy(&text))
        });
        assert_eq!(again, request, "the wire form parses to another request");
        assert_eq!(again.canonical_hash(), hash, "the wire form hashes differently");
    }

    for part in &request.participants {
        let sent: Vec<Value> = part.operations.iter().map(Operation::to_json).collect();
        let received = parse_operations(&sent)
            .unwrap_or_else(|e| panic!("a participant refuses operations the coordinator accepted: {e}"));
        assert_eq!(received, part.operations, "a participant reads other operations than the coordinator sent");
    }
}

fn check_participant_message(data: &[u8]) {
    let Ok(request) = serde_json::from_slice::<ParticipantRequest>(data) else {
        return;
    };
    // As a participant reads it (any kind of operation: a generic participant's catalog is the built-in
    // kinds, a second phase takes any), and as a sender writes the typed message again.
    let Ok(message) = Message::read(&request, &Catalog::any()) else {
        return;
    };
    let sent = message.to_wire();
    assert_eq!(sent.action, request.action, "the typed message has another action");
    let again = Message::read(&sent, &Catalog::any()).unwrap_or_else(|e| panic!("a re-sent message is refused: {e}"));
    assert_eq!(again, message, "a re-sent message reads as another");
    if let Ok(operations) = parse_operations(&request.operations) {
        assert_eq!(operations, message.operations(), "the participant library reads other operations");
    }
}

fn check_websocket_message(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for route in ["$default", "subscribe", "unsubscribe"] {
        // A body never turns one route into another: only `$default` takes its action from the body.
        let topics = match (route, parse_request(route, Some(text))) {
            (_, Err(_)) => continue,
            ("$default" | "subscribe", Ok(ConnectionRequest::Subscribe(topics)))
            | ("$default" | "unsubscribe", Ok(ConnectionRequest::Unsubscribe(topics))) => topics,
            (_, Ok(other)) => panic!("route {route} gave {other:?}"),
        };
        for topic in topics {
            // The connections table stores the topic's text as its sort key and the stream processor
            // matches on it: the text must be within the key limit and name the same topic.
            let stored = topic.to_string();
            assert!(stored.len() <= MAX_TOPIC_BYTES, "topic {stored:?} is over the sort key limit");
            assert_eq!(stored.parse::<Topic>().as_ref(), Ok(&topic), "topic {stored:?} does not read back");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check_transaction_request(data);
    check_participant_message(data);
    check_websocket_message(data);
});
