//! Two-phase commit across services on DynamoDB.
//!
//! Every piece of protocol logic lives here, free of Lambda glue, so the functions, the local stack
//! and the tests all run the same code. Remote calls sit behind small traits at the edge
//! ([`invoke::ParticipantInvoker`], the fan-out's sinks and notifiers in `twopc-fanout`,
//! [`clock::Clock`]); DynamoDB is used for real, because its condition expressions are the protocol.

pub mod access;
pub mod after_answer;
pub mod age;
pub mod attempts;
pub mod attr;
pub mod auth;
pub mod clock;
pub mod config;
pub mod coordinator;
pub mod cors;
pub mod custom;
pub mod decimal;
pub mod environment;
pub mod errors;
pub mod expr;
pub mod faults;
pub mod hold;
pub mod hot;
pub mod https;
pub mod invoke;
pub mod jwt;

pub mod model;
pub mod participant;
pub mod principal;
pub mod record;
pub mod recovery;
pub mod size;
pub mod store;
pub mod sweeper;
pub mod tables;
pub mod telemetry;
pub mod xray;
