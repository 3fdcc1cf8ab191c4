//! The stream processor's input as Lambda hands it over: bytes decoded into a DynamoDB stream event,
//! every image converted to JSON and the batch decided (`twopc_fanout::prepare`). Most random bytes
//! are not event JSON; the seeds (the sample events) and the dictionary keep it close, and
//! `stream_attribute` builds records directly.

#![no_main]

use aws_lambda_events::event::dynamodb::Event;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(event) = serde_json::from_slice::<Event>(data) {
        twopc_fuzz::check_event(&event);
    }
});
