//! A request's age, kept across its retries (issue 35).
//!
//! Wait-die orders transactions by their start: an older one waits for a younger one's lock, a younger
//! one is refused (CONFLICT) by an older one's. That order is starvation-free only if a refused
//! transaction comes back as old as it was. The coordinator's own retries keep the age in the record
//! (each attempt is its own transaction, carrying its request's first `startedAt`). A caller's retry keeps
//! it with an **age token**: the final 409 of a request refused for contention carries `ageToken`, and
//! the retried POST sends it back in the `Age-Token` header.
//!
//! The token is the coordinator's word, not the caller's: HMAC-SHA-256 over the age, the caller's
//! principal, the request body's hash, the first attempt's id, the attempt it was refused at and the next
//! attempt's number, and an expiry (the answer's time plus the request's timeout), under the signing key
//! of the request's first participant service (the coordinator holds it; the key set's rotation applies).
//! So no caller can claim more age than it has, move an age to another body or another caller, or use one
//! past its expiry; and the retry claims the refused attempt's age in the same write that creates its own
//! record ([`crate::record::TransactionStore::claim_age`]), so a token runs one retry at most, and only of
//! an attempt whose recorded abort is its coordinator's own refusal for contention. The retry is a request
//! of its own (issue 41): its first attempt is itself, linked to the refused one by `ageOf`.

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::auth::{KeyError, KeySource};
use crate::clock::CLOCK_MARGIN_MS;

/// What a MAC is computed over starts with this, so it can never be taken for another kind of signature.
const DOMAIN: &str = "twopc/age-token/v1";
/// The request header a retry carries its token in.
pub const AGE_TOKEN_HEADER: &str = "Age-Token";
/// A token is at most this long (what API Gateway and the coordinator will read of the header).
pub const MAX_AGE_TOKEN_BYTES: usize = 2_048;

/// What a token says: the request's age and which attempt its retry is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Age {
    /// The first attempt's start (ms since the epoch, the coordinator's clock): the age wait-die orders by.
    pub started_at: u64,
    /// The caller the request was the caller's (canonical principal; none without an authorizer).
    pub principal: Option<String>,
    /// The request body's canonical hash ([`crate::model::TransactionRequest::canonical_hash`]).
    pub body_hash: String,
    pub first_transaction_id: String,
    /// The attempt that was refused: the retry is claimed as its successor.
    pub retry_of: String,
    /// The retry's attempt number.
    pub attempt: u32,
    /// The token is refused after this (ms since the epoch).
    pub expires_at: u64,
    /// Which key of the service's set signed it.
    pub key_id: String,
    /// The service whose key signed it: the request's first participant.
    pub service: String,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgeTokenError {
    #[error("the Age-Token is not a token this coordinator issued (malformed)")]
    Malformed,
    #[error("the Age-Token's signature does not verify")]
    BadSignature,
    #[error("the Age-Token was issued for a request to another service")]
    OtherService,
    #[error("the Age-Token was issued to another caller")]
    OtherCaller,
    #[error("the Age-Token was issued for another request body")]
    OtherBody,
    #[error("the Age-Token expired {0} ms ago")]
    Expired(u64),
    #[error("the Age-Token cannot be checked: {0}")]
    Keys(String),
}

/// Signs `age` (its `key_id` is set to the signing key's) under `service`'s current key.
pub async fn issue(keys: &dyn KeySource, mut age: Age, now_ms: u64) -> Result<String, KeyError> {
    let set = keys.keys(&age.service).await?;
    let key = set.signing_key(now_ms).ok_or_else(|| KeyError::NoValidKey { service: age.service.clone() })?;
    age.key_id = key.id.clone();
    let payload = serde_json::to_vec(&age).expect("ages serialize");
    let mac = crate::auth::hmac_sha256(key.secret.as_bytes(), &signed_bytes(&payload));
    Ok(format!("{}.{}", hex::encode(&payload), hex::encode(mac)))
}

/// The age `token` proves for this caller (`principal`), this body (`body_hash`) sent to `service` first,
/// at `now_ms`.
pub async fn verify(
    keys: &dyn KeySource,
    token: &str,
    service: &str,
    principal: Option<&str>,
    body_hash: &str,
    now_ms: u64,
) -> Result<Age, AgeTokenError> {
    if token.len() > MAX_AGE_TOKEN_BYTES {
        return Err(AgeTokenError::Malformed);
    }
    let (payload, given) = token.split_once('.').ok_or(AgeTokenError::Malformed)?;
    let payload = hex::decode(payload).map_err(|_| AgeTokenError::Malformed)?;
    let given = hex::decode(given).map_err(|_| AgeTokenError::Malformed)?;
    let age: Age = serde_json::from_slice(&payload).map_err(|_| AgeTokenError::Malformed)?;
    if age.service != service {
        return Err(AgeTokenError::OtherService);
    }
    let set = keys.keys(service).await.map_err(|e| AgeTokenError::Keys(e.to_string()))?;
    let key = set.key(&age.key_id).ok_or(AgeTokenError::BadSignature)?;
    let mut expected = Hmac::<Sha256>::new_from_slice(key.secret.as_bytes()).expect("HMAC takes any key length");
    expected.update(&signed_bytes(&payload));
    expected.verify_slice(&given).map_err(|_| AgeTokenError::BadSignature)?;
    // Checked only once the signature holds: what a forged token says is not worth an answer.
    if age.principal.as_deref() != principal {
        return Err(AgeTokenError::OtherCaller);
    }
    if age.body_hash != body_hash {
        return Err(AgeTokenError::OtherBody);
    }
    if now_ms > age.expires_at + CLOCK_MARGIN_MS {
        return Err(AgeTokenError::Expired(now_ms - age.expires_at));
    }
    Ok(age)
}

fn signed_bytes(payload: &[u8]) -> Vec<u8> {
    let mut bytes = format!("{DOMAIN}\n").into_bytes();
    bytes.extend_from_slice(payload);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{KeySet, MemoryKeys};

    fn age() -> Age {
        Age {
            started_at: 1_000,
            principal: Some("user#alice".into()),
            body_hash: "b".repeat(64),
            first_transaction_id: "tx-1".into(),
            retry_of: "tx-1-3".into(),
            attempt: 4,
            expires_at: 5_000,
            key_id: String::new(),
            service: "service-a".into(),
        }
    }

    fn keys() -> std::sync::Arc<MemoryKeys> {
        let keys = MemoryKeys::new();
        keys.set("service-a", KeySet::single("k1", "0123456789abcdef0123"));
        keys.set("service-b", KeySet::single("k1", "fedcba98765432100123"));
        keys
    }

    #[tokio::test]
    async fn a_token_proves_its_age_to_its_caller_for_its_body_until_it_expires() {
        let keys = keys();
        let token = issue(keys.as_ref(), age(), 1_000).await.unwrap();
        let hash = "b".repeat(64);
        let proven = verify(keys.as_ref(), &token, "service-a", Some("user#alice"), &hash, 4_000).await.unwrap();
        assert_eq!((proven.started_at, proven.attempt, proven.key_id.as_str()), (1_000, 4, "k1"));
        let check = |service: &'static str, principal: Option<&'static str>, body: String, now: u64| {
            let (keys, token) = (keys.clone(), token.clone());
            async move { verify(keys.as_ref(), &token, service, principal, &body, now).await.unwrap_err() }
        };
        assert_eq!(check("service-a", Some("user#bob"), hash.clone(), 4_000).await, AgeTokenError::OtherCaller);
        assert_eq!(check("service-a", None, hash.clone(), 4_000).await, AgeTokenError::OtherCaller);
        assert_eq!(check("service-a", Some("user#alice"), "c".repeat(64), 4_000).await, AgeTokenError::OtherBody);
        assert_eq!(check("service-b", Some("user#alice"), hash.clone(), 4_000).await, AgeTokenError::OtherService);
        let late = 5_000 + CLOCK_MARGIN_MS + 1;
        assert_eq!(check("service-a", Some("user#alice"), hash, late).await, AgeTokenError::Expired(late - 5_000));
    }

    #[tokio::test]
    async fn a_token_claiming_more_age_or_signed_with_another_key_is_refused() {
        let keys = keys();
        let token = issue(keys.as_ref(), age(), 1_000).await.unwrap();
        let (payload, mac) = token.split_once('.').unwrap();
        let mut claimed: Age = serde_json::from_slice(&hex::decode(payload).unwrap()).unwrap();
        claimed.started_at = 1;
        let forged = format!("{}.{mac}", hex::encode(serde_json::to_vec(&claimed).unwrap()));
        let hash = "b".repeat(64);
        let verdict = verify(keys.as_ref(), &forged, "service-a", Some("user#alice"), &hash, 2_000).await;
        assert_eq!(verdict.unwrap_err(), AgeTokenError::BadSignature);
        // Signed by another service's key under this service's name.
        let other = MemoryKeys::new();
        other.set("service-a", KeySet::single("k1", "fedcba98765432100123"));
        let foreign = issue(other.as_ref(), age(), 1_000).await.unwrap();
        let verdict = verify(keys.as_ref(), &foreign, "service-a", Some("user#alice"), &hash, 2_000).await;
        assert_eq!(verdict.unwrap_err(), AgeTokenError::BadSignature);
        for junk in ["", "abc", "zz.zz", &format!("{payload}.")] {
            let verdict = verify(keys.as_ref(), junk, "service-a", Some("user#alice"), &hash, 2_000).await;
            assert!(matches!(verdict, Err(AgeTokenError::Malformed | AgeTokenError::BadSignature)), "{junk}");
        }
    }
}
