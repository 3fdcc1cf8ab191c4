//! `POST /transactions`: the request as the coordinator accepts it, its bounds, and the hash that
//! tells one request from another under an `Idempotency-Key`.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::custom::Catalogs;
use crate::errors::{ErrorCode, Invalid};
use crate::model::operation::{MAX_PARTICIPANTS, Operation};
use crate::model::wire::canonical_json;

/// One service's part of a transaction, as the client sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParticipantPart {
    pub service: String,
    pub operations: Vec<Operation>,
}

/// `POST /transactions`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TransactionRequest {
    pub participants: Vec<ParticipantPart>,
    pub timeout_ms: u64,
    /// Hold the prepares this long for a caller's commit or abort (`POST /transactions/{id}/commit`,
    /// `/abort`) instead of deciding at once; None: decide at once.
    pub hold_ms: Option<u64>,
}

/// The shortest hold a request may ask for.
pub const MIN_HOLD_MS: u64 = 1_000;
/// The longest hold any deployment accepts (the coordinator's `MAX_HOLD_MS` may lower it).
pub const DEFAULT_MAX_HOLD_MS: u64 = 24 * 60 * 60 * 1_000;
/// The longest hold a service accepts unless its configuration says otherwise (`HOLD_POLICY`).
pub const DEFAULT_SERVICE_MAX_HOLD_MS: u64 = 15 * 60 * 1_000;

pub const DEFAULT_TIMEOUT_MS: u64 = 3_000;
pub const MIN_TIMEOUT_MS: u64 = 100;
/// Below API Gateway's 29-second integration timeout, so a client always gets the answer.
pub const MAX_TIMEOUT_MS: u64 = 25_000;
pub const MAX_BODY_BYTES: usize = 256 * 1024;

impl ParticipantPart {
    pub const FIELDS: [&'static str; 2] = ["service", "operations"];
}

impl TransactionRequest {
    pub const FIELDS: [&'static str; 3] = ["participants", "timeoutMs", "holdMs"];

    /// Validates a request body against the registry of services. Nothing is written before this passes.
    pub fn parse(body: &[u8], is_registered: impl Fn(&str) -> bool) -> Result<TransactionRequest, Invalid> {
        TransactionRequest::parse_with(body, is_registered, &Catalogs::default())
    }

    /// [`TransactionRequest::parse`], each service's operations taking also its own kinds (`catalogs`).
    pub fn parse_with(
        body: &[u8],
        is_registered: impl Fn(&str) -> bool,
        catalogs: &Catalogs,
    ) -> Result<TransactionRequest, Invalid> {
        if body.len() > MAX_BODY_BYTES {
            return Err(Invalid::new(
                ErrorCode::BodyTooLarge,
                format!("request body is {} bytes; the limit is {MAX_BODY_BYTES} bytes (256 KiB)", body.len()),
            ));
        }
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| Invalid::new(ErrorCode::MalformedJson, format!("request body is not valid JSON: {e}")))?;
        let object = value.as_object().ok_or_else(|| Invalid::at("body", "must be a JSON object"))?;
        if let Some(extra) = object.keys().find(|k| !TransactionRequest::FIELDS.contains(&k.as_str())) {
            return Err(Invalid::at("body", format!("unexpected field \"{extra}\"")));
        }
        let list = object
            .get("participants")
            .ok_or_else(|| Invalid::new(ErrorCode::NoParticipants, "participants: missing"))?
            .as_array()
            .ok_or_else(|| Invalid::at("participants", "must be an array"))?;
        if list.is_empty() {
            return Err(Invalid::new(ErrorCode::NoParticipants, "participants: must contain at least one participant"));
        }
        if list.len() > MAX_PARTICIPANTS {
            return Err(Invalid::new(
                ErrorCode::LimitExceeded,
                format!("participants: {} services; one transaction takes at most {MAX_PARTICIPANTS}", list.len()),
            ));
        }
        let mut services = BTreeSet::new();
        let mut participants = Vec::with_capacity(list.len());
        for (i, part) in list.iter().enumerate() {
            let path = format!("participants[{i}]");
            let part = part.as_object().ok_or_else(|| Invalid::at(&path, "must be an object"))?;
            if let Some(extra) = part.keys().find(|k| !ParticipantPart::FIELDS.contains(&k.as_str())) {
                return Err(Invalid::at(&path, format!("unexpected field \"{extra}\"")));
            }
            let service = part
                .get("service")
                .ok_or_else(|| Invalid::at(&path, "missing \"service\""))?
                .as_str()
                .ok_or_else(|| Invalid::at(&format!("{path}.service"), "must be a string"))?;
            if !is_registered(service) {
                return Err(Invalid::new(
                    ErrorCode::UnknownService,
                    format!("{path}.service: unknown service \"{service}\"; it is not in the coordinator's registry"),
                ));
            }
            if !services.insert(service.to_owned()) {
                return Err(Invalid::new(
                    ErrorCode::DuplicateService,
                    format!("{path}.service: \"{service}\" appears twice; put all its operations in one entry"),
                ));
            }
            let operations =
                Operation::parse_list_for(part.get("operations"), &format!("{path}.operations"), catalogs.of(service))?;
            participants.push(ParticipantPart { service: service.to_owned(), operations });
        }
        let timeout_ms = match object.get("timeoutMs") {
            None | Some(Value::Null) => DEFAULT_TIMEOUT_MS,
            // As a float: a whole number written with a fraction (`3000.0`, as some JSON encoders write every
            // number) is still a whole number, as JSON Schema's `integer` (openapi.yaml) says, and every whole
            // number in range is exact in an f64.
            Some(v) => v
                .as_f64()
                .filter(|t| t.fract() == 0.0 && (MIN_TIMEOUT_MS as f64..=MAX_TIMEOUT_MS as f64).contains(t))
                .map(|t| t as u64)
                .ok_or_else(|| {
                    Invalid::at(
                        "timeoutMs",
                        format!("must be a whole number of milliseconds from {MIN_TIMEOUT_MS} to {MAX_TIMEOUT_MS}"),
                    )
                })?,
        };
        let hold_ms = match object.get("holdMs") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_f64()
                    .filter(|h| h.fract() == 0.0 && (MIN_HOLD_MS as f64..=DEFAULT_MAX_HOLD_MS as f64).contains(h))
                    .map(|h| h as u64)
                    .ok_or_else(|| {
                        Invalid::at(
                            "holdMs",
                            format!(
                                "must be a whole number of milliseconds from {MIN_HOLD_MS} to {DEFAULT_MAX_HOLD_MS}"
                            ),
                        )
                    })?,
            ),
        };
        Ok(TransactionRequest { participants, timeout_ms, hold_ms })
    }

    /// A canonical form of the request, hashed for `Idempotency-Key` comparisons: the same request
    /// written with other whitespace or key order hashes the same.
    pub fn canonical_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(canonical_json(&self.to_json()).as_bytes()))
    }

    /// The request in the contract's JSON as accepted (every field written out, `timeoutMs` included):
    /// what the hash covers, and what parses back to this request.
    pub fn to_json(&self) -> Value {
        let participants: Vec<Value> = self
            .participants
            .iter()
            .map(|p| {
                serde_json::json!({
                    "service": p.service,
                    "operations": p.operations.iter().map(Operation::to_json).collect::<Vec<_>>(),
                })
            })
            .collect();
        let mut request = serde_json::json!({"participants": participants, "timeoutMs": self.timeout_ms});
        if let Some(hold_ms) = self.hold_ms {
            request["holdMs"] = hold_ms.into();
        }
        request
    }
}
