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
//! attempt's number, and an expiry (the answer's time plus the request's timeout), under **the
//! coordinator's own key** (issue 42: `AGE_TOKEN_KEY`, a secret only the coordinator's role may read; a
//! [`KeySet`], so it rotates as the message keys do). Not a participant service's message key: that
//! service's participant, and so its operator, can read it. So no caller and no participant can claim
//! more age than it has, move an age to another body or another caller, or use one past its expiry; and
//! the retry claims the refused attempt's age in the same write that creates its own record
//! ([`crate::record::TransactionStore::claim_age`]), so a token runs one retry at most, and only of an
//! attempt whose recorded abort is its coordinator's own refusal for contention, of the token's caller and
//! body. The retry is a request of its own (issue 41): its first attempt is itself, linked to the refused
//! one by `ageOf`. A token signed before issue 42 (`twopc/age-token/v1`, under a participant's key) is
//! refused: its caller retries without it.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::auth::{CachedKeys, KEY_CACHE_TTL, KeyError, KeySet, KeySource, MemoryKeys, SecretsManagerKeys};
use crate::clock::CLOCK_MARGIN_MS;
use crate::config::{self, ConfigError};

/// Coordinator: its own key, which signs and verifies age tokens (issue 42): the ARN of a secret only its
/// role may read, or a key set written out (the local stack's, made at each start); never a participant's
/// key ([`crate::age::keys_from_setting`]).
pub const AGE_TOKEN_KEY: &str = "AGE_TOKEN_KEY";

/// What a MAC is computed over starts with this, so it can never be taken for another kind of signature.
/// `v2`: under the coordinator's own key (issue 42); `v1` tokens were signed with a participant's.
const DOMAIN: &str = "twopc/age-token/v2";
/// The name the coordinator's age-token keys go by in their [`KeySource`] (never a service's: a service's
/// keys are its participant's too).
pub const AGE_TOKEN_KEYS: &str = "coordinator-age-tokens";
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
    /// Which key of the coordinator's set signed it.
    pub key_id: String,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgeTokenError {
    #[error("the Age-Token is not a token this coordinator issued (malformed)")]
    Malformed,
    #[error(
        "the Age-Token was issued before the coordinator signed tokens with a key of its own, and is no longer \
         accepted: send the request again without it"
    )]
    Superseded,
    #[error("the Age-Token's signature does not verify")]
    BadSignature,
    #[error("the Age-Token was issued to another caller")]
    OtherCaller,
    #[error("the Age-Token was issued for another request body")]
    OtherBody,
    #[error("the Age-Token expired {0} ms ago")]
    Expired(u64),
    #[error("the Age-Token cannot be checked: {0}")]
    Keys(String),
}

/// Signs `age` (its `key_id` is set to the signing key's) under the coordinator's current key.
pub async fn issue(keys: &dyn KeySource, mut age: Age, now_ms: u64) -> Result<String, KeyError> {
    let set = keys.keys(AGE_TOKEN_KEYS).await?;
    let key = set.signing_key(now_ms).ok_or_else(|| KeyError::NoValidKey { service: AGE_TOKEN_KEYS.to_owned() })?;
    age.key_id = key.id.clone();
    let payload = serde_json::to_vec(&age).expect("ages serialize");
    let mac = crate::auth::hmac_sha256(key.secret.as_bytes(), &signed_bytes(&payload));
    Ok(format!("{}.{}", hex::encode(&payload), hex::encode(mac)))
}

/// The age `token` proves for this caller (`principal`) and this body (`body_hash`) at `now_ms`, under the
/// coordinator's keys (any key of its set: a rotation keeps the tokens of the old key).
pub async fn verify(
    keys: &dyn KeySource,
    token: &str,
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
    let age: Age = match serde_json::from_slice(&payload) {
        Ok(age) => age,
        // A token of the first form names the service whose (participant-readable) key signed it.
        Err(_) if serde_json::from_slice::<serde_json::Value>(&payload).is_ok_and(|v| v.get("service").is_some()) => {
            return Err(AgeTokenError::Superseded);
        }
        Err(_) => return Err(AgeTokenError::Malformed),
    };
    let set = keys.keys(AGE_TOKEN_KEYS).await.map_err(|e| AgeTokenError::Keys(e.to_string()))?;
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

/// The coordinator's age-token keys as its `AGE_TOKEN_KEY` setting names them: the ARN (or name) of a
/// Secrets Manager secret holding a key set (`{"id", "secret"}` as the templates generate it, or
/// `{"keys": [...]}` while rotating), read at most once per [`KEY_CACHE_TTL`]; or, for the local stack
/// only, a key set written out in the setting itself (`{...}`), which it makes at each start.
pub fn keys_from_setting(sdk: &aws_config::SdkConfig, setting: &str) -> Result<Arc<dyn KeySource>, String> {
    if setting == crate::auth::LOCAL_KEYS {
        return Err(format!(
            "{} are the participants' (derived from a public text): the coordinator's age-token key is its own",
            crate::auth::LOCAL_KEYS
        ));
    }
    if setting.trim_start().starts_with('{') {
        let set = KeySet::parse(AGE_TOKEN_KEYS, setting).map_err(|e| e.to_string())?;
        return Ok(in_memory(set));
    }
    let store = SecretsManagerKeys::new(
        aws_sdk_secretsmanager::Client::new(sdk),
        BTreeMap::from([(AGE_TOKEN_KEYS.to_owned(), setting.to_owned())]),
    );
    Ok(Arc::new(CachedKeys::new(Arc::new(store), KEY_CACHE_TTL)))
}

/// A key set of its own, made now from the system's random source: what the local stack passes its
/// coordinator, and the key of a coordinator not given one ([`process_keys`]).
pub fn random_key_set() -> KeySet {
    let secret = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    KeySet::single("local", &secret)
}

/// The keys of every coordinator of this process not given keys of its own (the tests, the local stack
/// in one process): one random key, made at first use, so tokens hold across the process's coordinators
/// and never across processes. Deployed, the coordinator always reads `AGE_TOKEN_KEY`.
pub fn process_keys() -> Arc<dyn KeySource> {
    static KEYS: OnceLock<Arc<dyn KeySource>> = OnceLock::new();
    KEYS.get_or_init(|| in_memory(random_key_set())).clone()
}

fn in_memory(set: KeySet) -> Arc<dyn KeySource> {
    let keys = MemoryKeys::new();
    keys.set(AGE_TOKEN_KEYS, set);
    keys
}

fn signed_bytes(payload: &[u8]) -> Vec<u8> {
    let mut bytes = format!("{DOMAIN}\n").into_bytes();
    bytes.extend_from_slice(payload);
    bytes
}

/// The coordinator's own age-token keys, from its required `AGE_TOKEN_KEY`.
pub fn keys_from_env(sdk: &aws_config::SdkConfig) -> Result<Arc<dyn KeySource>, ConfigError> {
    config::parsed(AGE_TOKEN_KEY, keys_from_setting(sdk, &config::required(AGE_TOKEN_KEY)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{KeySet, LocalKeys, MemoryKeys};

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
        }
    }

    fn keys_of(set: KeySet) -> Arc<MemoryKeys> {
        let keys = MemoryKeys::new();
        keys.set(AGE_TOKEN_KEYS, set);
        keys
    }

    fn keys() -> Arc<MemoryKeys> {
        keys_of(KeySet::single("k1", "0123456789abcdef0123"))
    }

    #[tokio::test]
    async fn a_token_proves_its_age_to_its_caller_for_its_body_until_it_expires() {
        let keys = keys();
        let token = issue(keys.as_ref(), age(), 1_000).await.unwrap();
        let hash = "b".repeat(64);
        let proven = verify(keys.as_ref(), &token, Some("user#alice"), &hash, 4_000).await.unwrap();
        assert_eq!((proven.started_at, proven.attempt, proven.key_id.as_str()), (1_000, 4, "k1"));
        let check = |principal: Option<&'static str>, body: String, now: u64| {
            let (keys, token) = (keys.clone(), token.clone());
            async move { verify(keys.as_ref(), &token, principal, &body, now).await.unwrap_err() }
        };
        assert_eq!(check(Some("user#bob"), hash.clone(), 4_000).await, AgeTokenError::OtherCaller);
        assert_eq!(check(None, hash.clone(), 4_000).await, AgeTokenError::OtherCaller);
        assert_eq!(check(Some("user#alice"), "c".repeat(64), 4_000).await, AgeTokenError::OtherBody);
        let late = 5_000 + CLOCK_MARGIN_MS + 1;
        assert_eq!(check(Some("user#alice"), hash, late).await, AgeTokenError::Expired(late - 5_000));
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
        let verdict = verify(keys.as_ref(), &forged, Some("user#alice"), &hash, 2_000).await;
        assert_eq!(verdict.unwrap_err(), AgeTokenError::BadSignature);
        // Signed with another key under the same key id.
        let other = keys_of(KeySet::single("k1", "fedcba98765432100123"));
        let foreign = issue(other.as_ref(), age(), 1_000).await.unwrap();
        let verdict = verify(keys.as_ref(), &foreign, Some("user#alice"), &hash, 2_000).await;
        assert_eq!(verdict.unwrap_err(), AgeTokenError::BadSignature);
        for junk in ["", "abc", "zz.zz", &format!("{payload}.")] {
            let verdict = verify(keys.as_ref(), junk, Some("user#alice"), &hash, 2_000).await;
            assert!(matches!(verdict, Err(AgeTokenError::Malformed | AgeTokenError::BadSignature)), "{junk}");
        }
    }

    /// Issue 42: a participant service's message key is readable by that service's participant. A token
    /// signed with it, in this form or the first one, is refused.
    #[tokio::test]
    async fn a_token_signed_with_a_participants_message_key_is_refused() {
        let keys = keys();
        let hash = "b".repeat(64);
        let participant = keys_of(LocalKeys::key_set("service-a"));
        let forged = issue(participant.as_ref(), age(), 1_000).await.unwrap();
        let verdict = verify(keys.as_ref(), &forged, Some("user#alice"), &hash, 2_000).await;
        assert_eq!(verdict.unwrap_err(), AgeTokenError::BadSignature);
        // The first form: the service named in the token, signed with its key.
        let mut first = serde_json::to_value(age()).unwrap();
        first["service"] = "service-a".into();
        first["keyId"] = "local".into();
        let payload = serde_json::to_vec(&first).unwrap();
        let key = LocalKeys::key_set("service-a").keys[0].clone();
        let mut signed = b"twopc/age-token/v1\n".to_vec();
        signed.extend_from_slice(&payload);
        let mac = crate::auth::hmac_sha256(key.secret.as_bytes(), &signed);
        let old = format!("{}.{}", hex::encode(&payload), hex::encode(mac));
        let verdict = verify(keys.as_ref(), &old, Some("user#alice"), &hash, 2_000).await;
        assert_eq!(verdict.unwrap_err(), AgeTokenError::Superseded);
    }

    /// The coordinator's keys rotate as the message keys do: signers move to the new key at its
    /// `notBefore`, and a token of the old key verifies while the set still holds it.
    #[tokio::test]
    async fn a_rotation_keeps_the_tokens_of_the_old_key() {
        let set = KeySet::parse(
            AGE_TOKEN_KEYS,
            r#"{"keys": [{"id": "k1", "secret": "0123456789abcdef0"}, {"id": "k2", "secret": "fedcba98765432100", "notBefore": 1500}]}"#,
        )
        .unwrap();
        let keys = keys_of(set);
        let hash = "b".repeat(64);
        let old = issue(keys.as_ref(), age(), 1_000).await.unwrap();
        let new = issue(keys.as_ref(), age(), 2_000).await.unwrap();
        let old_age = verify(keys.as_ref(), &old, Some("user#alice"), &hash, 2_000).await.unwrap();
        let new_age = verify(keys.as_ref(), &new, Some("user#alice"), &hash, 2_000).await.unwrap();
        assert_eq!((old_age.key_id.as_str(), new_age.key_id.as_str()), ("k1", "k2"));
    }

    #[test]
    fn the_setting_names_a_secret_or_a_key_set_never_the_participants_keys() {
        let sdk = aws_config::SdkConfig::builder().behavior_version(aws_config::BehaviorVersion::latest()).build();
        assert!(keys_from_setting(&sdk, crate::auth::LOCAL_KEYS).is_err());
        assert!(keys_from_setting(&sdk, r#"{"id": "k1", "secret": "short"}"#).is_err());
        assert!(keys_from_setting(&sdk, r#"{"id": "k1", "secret": "0123456789abcdef0"}"#).is_ok());
        assert!(keys_from_setting(&sdk, "arn:aws:secretsmanager:eu-west-1:123456789012:secret:age-AbCdEf").is_ok());
        assert_ne!(random_key_set().keys[0].secret, random_key_set().keys[0].secret);
    }
}
