//! Which held transactions (`holdMs`) the coordinator accepts: a hold is a lock a caller chooses to keep,
//! so each service says whether it accepts one and for how long at most, and the deployment sets a
//! ceiling for all.
//!
//! Configuration (the coordinator's environment):
//! - `HOLD_POLICY`: JSON, per service: `{"service-a": {"maxHoldMs": 600000}, "service-b": {"accepts":
//!   false}}`. A service not named, or named without `maxHoldMs`, accepts holds of up to
//!   [`DEFAULT_SERVICE_MAX_HOLD_MS`] (15 minutes); `"accepts": false` refuses every hold.
//! - `MAX_HOLD_MS`: the longest hold of any transaction, from [`MIN_HOLD_MS`] to [`DEFAULT_MAX_HOLD_MS`]
//!   (24 hours, the default).
//!
//! A request whose `holdMs` is over the smaller of the two for any of its services is refused with a 400
//! naming the service and its maximum, before anything is written or locked.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::{self, ConfigError};
use crate::model::{
    DEFAULT_MAX_HOLD_MS, DEFAULT_SERVICE_MAX_HOLD_MS, ErrorCode, Invalid, MIN_HOLD_MS, TransactionRequest,
};

/// Coordinator: which services accept held transactions (`holdMs`) and for how long at most, JSON
/// `{"service": {"accepts"?: bool, "maxHoldMs"?: milliseconds}}` ([`crate::hold`]); a service not named
/// accepts holds of up to 15 minutes.
pub const HOLD_POLICY: &str = "HOLD_POLICY";
/// Coordinator: the longest hold of any transaction, in milliseconds (default and ceiling 24 hours).
pub const MAX_HOLD_MS: &str = "MAX_HOLD_MS";

/// One service's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceHold {
    /// Whether the service takes part in held transactions at all.
    #[serde(default = "accepts_by_default")]
    pub accepts: bool,
    /// The longest hold it accepts, in milliseconds.
    #[serde(default = "service_max_by_default")]
    pub max_hold_ms: u64,
}

fn accepts_by_default() -> bool {
    true
}

fn service_max_by_default() -> u64 {
    DEFAULT_SERVICE_MAX_HOLD_MS
}

impl Default for ServiceHold {
    fn default() -> Self {
        ServiceHold { accepts: true, max_hold_ms: DEFAULT_SERVICE_MAX_HOLD_MS }
    }
}

/// The coordinator's hold policy: a ceiling for every transaction and each service's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldPolicy {
    /// The longest hold of any transaction (`MAX_HOLD_MS`).
    pub max_hold_ms: u64,
    /// Each service's policy (`HOLD_POLICY`); a service not named has [`ServiceHold::default`].
    pub services: BTreeMap<String, ServiceHold>,
}

impl Default for HoldPolicy {
    fn default() -> Self {
        HoldPolicy { max_hold_ms: DEFAULT_MAX_HOLD_MS, services: BTreeMap::new() }
    }
}

impl HoldPolicy {
    /// The policy from `HOLD_POLICY`'s JSON (None or empty: every service by default) and `MAX_HOLD_MS`'s
    /// value (None: 24 hours). `Err` says what is wrong, for the configuration error.
    pub fn parse(services: Option<&str>, max_hold_ms: Option<&str>) -> Result<HoldPolicy, String> {
        let max_hold_ms = match max_hold_ms.map(str::trim).filter(|t| !t.is_empty()) {
            None => DEFAULT_MAX_HOLD_MS,
            Some(text) => {
                text.parse::<u64>().ok().filter(|ms| (MIN_HOLD_MS..=DEFAULT_MAX_HOLD_MS).contains(ms)).ok_or_else(
                    || format!("expected milliseconds from {MIN_HOLD_MS} to {DEFAULT_MAX_HOLD_MS}, got {text:?}"),
                )?
            }
        };
        let services: BTreeMap<String, ServiceHold> = match services.map(str::trim).filter(|t| !t.is_empty()) {
            None => BTreeMap::new(),
            Some(text) => serde_json::from_str(text).map_err(|e| {
                format!("expected {{\"service\": {{\"accepts\"?: bool, \"maxHoldMs\"?: milliseconds}}}}: {e}")
            })?,
        };
        if let Some((service, _)) = services.iter().find(|(_, p)| p.accepts && p.max_hold_ms < MIN_HOLD_MS) {
            return Err(format!("{service}: maxHoldMs must be at least {MIN_HOLD_MS} (or \"accepts\": false)"));
        }
        Ok(HoldPolicy { max_hold_ms, services })
    }

    /// The policy of `service`.
    pub fn of(&self, service: &str) -> ServiceHold {
        self.services.get(service).copied().unwrap_or_default()
    }

    /// Refuses a request whose `holdMs` one of its services does not accept (naming the service and its
    /// maximum), or that is over the deployment's maximum. A request without `holdMs` always passes.
    pub fn check(&self, request: &TransactionRequest) -> Result<(), Invalid> {
        let Some(hold_ms) = request.hold_ms else { return Ok(()) };
        if hold_ms > self.max_hold_ms {
            return Err(Invalid::new(
                ErrorCode::LimitExceeded,
                format!("holdMs: {hold_ms} is over this deployment's maximum hold of {} ms", self.max_hold_ms),
            ));
        }
        for (i, part) in request.participants.iter().enumerate() {
            let policy = self.of(&part.service);
            if !policy.accepts {
                return Err(Invalid::new(
                    ErrorCode::InvalidRequest,
                    format!("holdMs: service {} (participants[{i}]) does not accept held transactions", part.service),
                ));
            }
            if hold_ms > policy.max_hold_ms {
                return Err(Invalid::new(
                    ErrorCode::LimitExceeded,
                    format!(
                        "holdMs: {hold_ms} is over the maximum hold of service {} (participants[{i}]): {} ms",
                        part.service, policy.max_hold_ms
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The coordinator's hold policy (`HOLD_POLICY`, `MAX_HOLD_MS`; the defaults when unset or empty).
pub fn policy_from_env() -> Result<HoldPolicy, ConfigError> {
    let max = std::env::var(MAX_HOLD_MS).ok();
    let services = std::env::var(HOLD_POLICY).ok();
    config::parsed(MAX_HOLD_MS, HoldPolicy::parse(None, max.as_deref()))?;
    config::parsed(HOLD_POLICY, HoldPolicy::parse(services.as_deref(), max.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(hold_ms: Option<u64>) -> TransactionRequest {
        let mut body = serde_json::json!({"participants": [
            {"service": "service-a", "operations": [{"op": "delete", "key": {"entityId": "A"}}]},
            {"service": "service-b", "operations": [{"op": "delete", "key": {"entityId": "B"}}]}
        ]});
        if let Some(hold_ms) = hold_ms {
            body["holdMs"] = hold_ms.into();
        }
        TransactionRequest::parse(body.to_string().as_bytes(), |_| true).unwrap()
    }

    #[test]
    fn services_accept_fifteen_minutes_by_default() {
        let policy = HoldPolicy::default();
        assert!(policy.check(&request(None)).is_ok());
        assert!(policy.check(&request(Some(DEFAULT_SERVICE_MAX_HOLD_MS))).is_ok());
        let refused = policy.check(&request(Some(DEFAULT_SERVICE_MAX_HOLD_MS + 1))).unwrap_err();
        assert_eq!(refused.code, ErrorCode::LimitExceeded);
        assert!(refused.message.contains("service-a") && refused.message.contains("900000 ms"), "{refused}");
    }

    #[test]
    fn each_service_says_its_own_maximum_and_the_deployment_caps_all() {
        let policy = HoldPolicy::parse(
            Some(r#"{"service-a": {"maxHoldMs": 3600000}, "service-b": {"maxHoldMs": 60000}}"#),
            Some("1800000"),
        )
        .unwrap();
        assert!(policy.check(&request(Some(60_000))).is_ok());
        let refused = policy.check(&request(Some(60_001))).unwrap_err();
        assert!(refused.message.contains("service-b") && refused.message.contains("60000 ms"), "{refused}");
        let refused = policy.check(&request(Some(1_800_001))).unwrap_err();
        assert!(refused.message.contains("maximum hold of 1800000 ms"), "{refused}");
    }

    #[test]
    fn a_service_may_refuse_every_hold() {
        let policy = HoldPolicy::parse(Some(r#"{"service-b": {"accepts": false}}"#), None).unwrap();
        let refused = policy.check(&request(Some(MIN_HOLD_MS))).unwrap_err();
        assert_eq!(refused.code, ErrorCode::InvalidRequest);
        assert!(refused.message.contains("service-b") && refused.message.contains("does not accept"), "{refused}");
        assert!(policy.check(&request(None)).is_ok());
    }

    #[test]
    fn bad_configuration_says_what_is_wrong() {
        for (services, max) in [
            (Some("[]"), None),
            (Some(r#"{"a": {"maxHold": 5}}"#), None),
            (Some(r#"{"a": {"maxHoldMs": 10}}"#), None),
            (None, Some("0")),
            (None, Some("86400001")),
            (None, Some("ten")),
        ] {
            assert!(HoldPolicy::parse(services, max).is_err(), "{services:?} {max:?}");
        }
        assert_eq!(HoldPolicy::parse(Some(" "), Some("")).unwrap(), HoldPolicy::default());
    }
}
