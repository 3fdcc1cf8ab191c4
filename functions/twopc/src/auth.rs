//! Participant messages are authenticated: only the coordinator and the sweeper can send one.
//!
//! Each participant service has a key (a set of keys, to rotate without downtime) that only the
//! coordinator, the sweeper and that service's participant can read. A sender signs the whole message
//! with HMAC-SHA-256 under the service's current key ([`sign`]); the participant verifies it before it
//! does anything ([`verify`], from `Participant::handle`, the one entry every caller goes through: the
//! Lambda handler, the local stack, the tests). An unsigned message, a wrong signature, a message signed
//! for another service or another transaction, or a stale one is refused and changes nothing.
//!
//! **Stale.** A message's signature says when it was signed. A copy of it may still arrive later: the
//! SDK re-sends an Invoke whose answer did not come (three attempts, each up to the participant's
//! 10 s timeout, with backoff in between), and the protocol is built for such late copies (lock tokens,
//! `lastTx`). [`MAX_MESSAGE_AGE_MS`] covers that re-sending; a message older than it plus the clock margin
//! is refused, and so is one signed that far in the future.
//!
//! **Keys.** A [`KeySet`] holds one or more keys, each with the moment signers may start using it
//! (`notBefore`). Signers use the newest key already valid; verifiers accept any key of the set. To
//! rotate: add the new key with `notBefore` at least one cache TTL ([`KEY_CACHE_TTL`]) ahead, so that
//! every verifier has it before anyone signs with it; remove the old one once every signer has moved on
//! (two TTLs later).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Sha256;

use crate::clock::CLOCK_MARGIN_MS;
use crate::config::{self, ConfigError};
use crate::model::wire::ParticipantRequest;
pub use crate::model::wire::{ENVELOPE_V2, Envelope, MessageSignature};

/// Coordinator and sweeper: where each participant service's message key is, JSON `{"service": "secret
/// ARN"}` (Secrets Manager), or `local-development-keys` ([`crate::auth::LOCAL_KEYS`], the local stack).
pub const PARTICIPANT_KEYS: &str = "PARTICIPANT_KEYS";
/// Participant: its own service's message key, a secret ARN, or `local-development-keys`.
pub const PARTICIPANT_KEY: &str = "PARTICIPANT_KEY";
/// Coordinator and sweeper: how participant messages are signed, `v1` (the default) or `v2` (an
/// envelope whose MAC covers the message's bytes as sent). Switch to `v2` only once every participant
/// verifies it (infra/DEPLOY.md); every participant verifies both.
pub const PARTICIPANT_SIGNATURE: &str = "PARTICIPANT_SIGNATURE";

/// How long after it was signed a copy of a message may still arrive: the SDK's three attempts at an
/// Invoke, each up to the participant function's 10 s, the backoff between them, and room to spare.
pub const MAX_MESSAGE_AGE_MS: u64 = 45_000;
/// How long a key set read from its store is used before it is read again.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(60);
/// What a MAC is computed over starts with this, so it can never be taken for another kind of signature.
const DOMAIN: &str = "twopc/participant-message/v1";

/// How a sender signs: v1 (the signature inside the message, over a canonical form of it) or v2 (an
/// [`Envelope`]: the message's bytes as sent, the signature over exactly those bytes beside them). A
/// participant verifies both; senders move to v2 once every participant does (infra/DEPLOY.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SignatureVersion {
    #[default]
    V1,
    V2,
}

impl SignatureVersion {
    /// `PARTICIPANT_SIGNATURE`: `v1` (or unset) or `v2`.
    pub fn parse(text: Option<&str>) -> Result<SignatureVersion, String> {
        match text.map(str::trim) {
            None | Some("") | Some("v1") => Ok(SignatureVersion::V1),
            Some("v2") => Ok(SignatureVersion::V2),
            Some(other) => Err(format!("{other:?} is not a signature version: v1 or v2")),
        }
    }
}

/// One key of a service.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Key {
    pub id: String,
    /// The secret, as stored (its UTF-8 bytes are the HMAC key).
    pub secret: String,
    /// Signers may use it from this moment (ms since the epoch); 0: at once.
    #[serde(default)]
    pub not_before: u64,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("id", &self.id).field("not_before", &self.not_before).finish_non_exhaustive()
    }
}

/// A service's keys.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeySet {
    pub keys: Vec<Key>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum KeyError {
    #[error("no key for service {0}")]
    NoService(String),
    #[error("the keys of service {service} could not be read: {message}")]
    Unavailable { service: String, message: String },
    #[error("the keys of service {service} are malformed: {message}")]
    Malformed { service: String, message: String },
    #[error("service {service} has no key valid yet")]
    NoValidKey { service: String },
}

impl KeySet {
    /// A stored key set: `{"keys": [{"id", "secret", "notBefore"?}, ...]}`, or one key on its own
    /// (`{"id", "secret"}`, as the templates generate it).
    pub fn parse(service: &str, text: &str) -> Result<KeySet, KeyError> {
        let malformed = |message: String| KeyError::Malformed { service: service.to_owned(), message };
        let value: Value = serde_json::from_str(text).map_err(|e| malformed(e.to_string()))?;
        let keys: Vec<Key> = match value.get("keys") {
            Some(list) => serde_json::from_value(list.clone()).map_err(|e| malformed(e.to_string()))?,
            None => vec![serde_json::from_value(value).map_err(|e| malformed(e.to_string()))?],
        };
        if keys.is_empty() || keys.iter().any(|k| k.id.is_empty() || k.secret.len() < 16) {
            return Err(malformed("every key needs an id and a secret of at least 16 bytes".into()));
        }
        Ok(KeySet { keys })
    }

    pub fn single(id: &str, secret: &str) -> KeySet {
        KeySet { keys: vec![Key { id: id.to_owned(), secret: secret.to_owned(), not_before: 0 }] }
    }

    /// The key to sign with at `now_ms`: the newest one already valid.
    pub fn signing_key(&self, now_ms: u64) -> Option<&Key> {
        self.keys.iter().filter(|k| k.not_before <= now_ms).max_by_key(|k| k.not_before)
    }

    /// The key of the set named `id`.
    pub(crate) fn key(&self, id: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.id == id)
    }
}

/// Where a service's keys come from.
pub trait KeySource: Send + Sync + std::fmt::Debug {
    fn keys<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Arc<KeySet>, KeyError>>;
}

/// The development keys of the local stack and the tests: one per service, derived from a fixed text,
/// the same in every checkout (the sample events in `events/` are signed with them). Never deployed: the
/// templates give every function keys of its own from Secrets Manager.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalKeys;

/// What a function's key variable says to use [`LocalKeys`] (the local stack's `--lambda` mode).
pub const LOCAL_KEYS: &str = "local-development-keys";

impl LocalKeys {
    pub fn key_set(service: &str) -> KeySet {
        let secret = hex::encode(hmac_sha256(b"twopc local development key (never deployed)", service.as_bytes()));
        KeySet::single("local", &secret)
    }
}

impl KeySource for LocalKeys {
    fn keys<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Arc<KeySet>, KeyError>> {
        Box::pin(async move { Ok(Arc::new(LocalKeys::key_set(service))) })
    }
}

/// Keys held in memory, changed at will: a store of key sets for the tests (rotation).
#[derive(Debug, Default)]
pub struct MemoryKeys {
    sets: Mutex<HashMap<String, Arc<KeySet>>>,
}

impl MemoryKeys {
    pub fn new() -> Arc<MemoryKeys> {
        Arc::new(MemoryKeys::default())
    }

    pub fn set(&self, service: &str, keys: KeySet) {
        self.sets.lock().expect("not poisoned").insert(service.to_owned(), Arc::new(keys));
    }
}

impl KeySource for MemoryKeys {
    fn keys<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Arc<KeySet>, KeyError>> {
        let found = self.sets.lock().expect("not poisoned").get(service).cloned();
        Box::pin(async move { found.ok_or_else(|| KeyError::NoService(service.to_owned())) })
    }
}

/// Another source's key sets, each read at most once per `ttl`: a message costs no request to the store.
#[derive(Debug)]
pub struct CachedKeys {
    inner: Arc<dyn KeySource>,
    ttl: Duration,
    cache: Mutex<HashMap<String, (Instant, Arc<KeySet>)>>,
}

impl CachedKeys {
    pub fn new(inner: Arc<dyn KeySource>, ttl: Duration) -> CachedKeys {
        CachedKeys { inner, ttl, cache: Mutex::new(HashMap::new()) }
    }
}

impl KeySource for CachedKeys {
    fn keys<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Arc<KeySet>, KeyError>> {
        Box::pin(async move {
            let cached = self.cache.lock().expect("not poisoned").get(service).cloned();
            if let Some((read, keys)) = cached
                && read.elapsed() < self.ttl
            {
                return Ok(keys);
            }
            let keys = self.inner.keys(service).await?;
            self.cache.lock().expect("not poisoned").insert(service.to_owned(), (Instant::now(), keys.clone()));
            Ok(keys)
        })
    }
}

/// Keys kept in AWS Secrets Manager, one secret per service (its ARN or name), read with
/// `GetSecretValue`. Wrap it in [`CachedKeys`].
#[derive(Debug, Clone)]
pub struct SecretsManagerKeys {
    client: aws_sdk_secretsmanager::Client,
    secrets: BTreeMap<String, String>,
}

impl SecretsManagerKeys {
    pub fn new(client: aws_sdk_secretsmanager::Client, secrets: BTreeMap<String, String>) -> SecretsManagerKeys {
        SecretsManagerKeys { client, secrets }
    }
}

impl KeySource for SecretsManagerKeys {
    fn keys<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Arc<KeySet>, KeyError>> {
        Box::pin(async move {
            let secret = self.secrets.get(service).ok_or_else(|| KeyError::NoService(service.to_owned()))?;
            let out =
                self.client.get_secret_value().secret_id(secret).send().await.map_err(|e| KeyError::Unavailable {
                    service: service.to_owned(),
                    message: aws_smithy_types::error::display::DisplayErrorContext(&e).to_string(),
                })?;
            let text = out.secret_string().ok_or_else(|| KeyError::Malformed {
                service: service.to_owned(),
                message: "the secret holds no string".into(),
            })?;
            Ok(Arc::new(KeySet::parse(service, text)?))
        })
    }
}

/// The key source a function's environment names: [`LOCAL_KEYS`] for the local development keys, else
/// the secrets (a JSON object `{"service": "secret ARN"}`), cached for [`KEY_CACHE_TTL`].
pub fn from_setting(sdk: &aws_config::SdkConfig, setting: &str) -> Result<Arc<dyn KeySource>, String> {
    if setting == LOCAL_KEYS {
        return Ok(Arc::new(LocalKeys));
    }
    let secrets: BTreeMap<String, String> =
        serde_json::from_str(setting).map_err(|e| format!("expected a JSON object of secret ARNs: {e}"))?;
    Ok(secrets_manager(sdk, secrets))
}

/// One service's key source from its secret (the participant's `PARTICIPANT_KEY`), or the local keys.
pub fn of_service(sdk: &aws_config::SdkConfig, service: &str, setting: &str) -> Arc<dyn KeySource> {
    if setting == LOCAL_KEYS {
        return Arc::new(LocalKeys);
    }
    secrets_manager(sdk, BTreeMap::from([(service.to_owned(), setting.to_owned())]))
}

fn secrets_manager(sdk: &aws_config::SdkConfig, secrets: BTreeMap<String, String>) -> Arc<dyn KeySource> {
    let store = SecretsManagerKeys::new(aws_sdk_secretsmanager::Client::new(sdk), secrets);
    Arc::new(CachedKeys::new(Arc::new(store), KEY_CACHE_TTL))
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    #[error("the message is not signed")]
    Unsigned,
    #[error("the message is signed with key {0}, which service {1} does not have")]
    UnknownKey(String, String),
    #[error("the message's signature does not match it")]
    BadSignature,
    #[error("the message was signed {age_ms} ms ago; copies are accepted for {limit_ms} ms")]
    Stale { age_ms: u64, limit_ms: u64 },
    #[error("the message was signed {ahead_ms} ms ahead of this participant's clock")]
    FromTheFuture { ahead_ms: u64 },
    #[error("{0}")]
    Keys(String),
    #[error("the envelope is {0:?}, not {ENVELOPE_V2}")]
    UnknownEnvelope(String),
    #[error("the signed message is not a participant message: {0}")]
    NotAMessage(String),
}

/// Signs `request` for `service` with its current key, as signed at `now_ms`.
pub async fn sign(
    keys: &dyn KeySource,
    service: &str,
    request: &ParticipantRequest,
    now_ms: u64,
) -> Result<ParticipantRequest, KeyError> {
    let set = keys.keys(service).await?;
    sign_with(&set, service, request, now_ms)
}

/// Signs `request` for `service` with the newest key of `set` valid at `now_ms`.
pub fn sign_with(
    set: &KeySet,
    service: &str,
    request: &ParticipantRequest,
    now_ms: u64,
) -> Result<ParticipantRequest, KeyError> {
    let key = set.signing_key(now_ms).ok_or_else(|| KeyError::NoValidKey { service: service.to_owned() })?;
    let mut signed = request.clone();
    signed.signature = None;
    let mac = mac(key, service, &signed, now_ms);
    signed.signature = Some(MessageSignature { key_id: key.id.clone(), signed_at: now_ms, mac });
    Ok(signed)
}

/// Seals `request` for `service` (v2): its JSON text, and a MAC over those bytes under the newest key of
/// `set` valid at `now_ms`.
pub fn seal_with(set: &KeySet, service: &str, request: &ParticipantRequest, now_ms: u64) -> Result<Envelope, KeyError> {
    let key = set.signing_key(now_ms).ok_or_else(|| KeyError::NoValidKey { service: service.to_owned() })?;
    let mut unsigned = request.clone();
    unsigned.signature = None;
    let message = serde_json::to_string(&unsigned).expect("messages serialize");
    let mut mac = Hmac::<Sha256>::new_from_slice(key.secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(&signing_input_v2(service, &key.id, now_ms, message.as_bytes()));
    Ok(Envelope {
        envelope: ENVELOPE_V2.to_owned(),
        key_id: key.id.clone(),
        signed_at: now_ms,
        mac: hex::encode(mac.finalize().into_bytes()),
        message,
    })
}

/// Seals `request` for `service` with its current key (v2).
pub async fn seal(
    keys: &dyn KeySource,
    service: &str,
    request: &ParticipantRequest,
    now_ms: u64,
) -> Result<Envelope, KeyError> {
    let set = keys.keys(service).await?;
    seal_with(&set, service, request, now_ms)
}

/// The message of `envelope`, once its MAC is checked over the bytes as sent, for `service`, with one of
/// its keys, and not stale at `now_ms` (the same window as v1's). A `signature` inside the message is
/// ignored: the envelope is what was verified.
pub async fn open(
    keys: &dyn KeySource,
    service: &str,
    envelope: &Envelope,
    now_ms: u64,
) -> Result<ParticipantRequest, Unauthenticated> {
    if envelope.envelope != ENVELOPE_V2 {
        return Err(Unauthenticated::UnknownEnvelope(envelope.envelope.clone()));
    }
    let set = keys.keys(service).await.map_err(|e| Unauthenticated::Keys(e.to_string()))?;
    let key = set
        .key(&envelope.key_id)
        .ok_or_else(|| Unauthenticated::UnknownKey(envelope.key_id.clone(), service.to_owned()))?;
    let mut expected = Hmac::<Sha256>::new_from_slice(key.secret.as_bytes()).expect("HMAC takes any key length");
    expected.update(&signing_input_v2(service, &envelope.key_id, envelope.signed_at, envelope.message.as_bytes()));
    let given = hex::decode(&envelope.mac).map_err(|_| Unauthenticated::BadSignature)?;
    expected.verify_slice(&given).map_err(|_| Unauthenticated::BadSignature)?;
    within_window(envelope.signed_at, now_ms)?;
    let mut request: ParticipantRequest =
        serde_json::from_str(&envelope.message).map_err(|e| Unauthenticated::NotAMessage(e.to_string()))?;
    request.signature = None;
    Ok(request)
}

/// What a v2 MAC covers: the envelope's name, the service, the key, the time, and the message's bytes as
/// sent (`docs/participant-protocol.md` gives a test vector).
pub fn signing_input_v2(service: &str, key_id: &str, signed_at: u64, message: &[u8]) -> Vec<u8> {
    let mut input = format!("{ENVELOPE_V2}\n{service}\n{key_id}\n{signed_at}\n").into_bytes();
    input.extend_from_slice(message);
    input
}

/// A message signed at `signed_at` is acted on at `now_ms`: neither stale nor from the future, by the same
/// window either way (a sender whose clock runs ahead is as far off as one behind).
fn within_window(signed_at: u64, now_ms: u64) -> Result<(), Unauthenticated> {
    let limit = MAX_MESSAGE_AGE_MS + CLOCK_MARGIN_MS;
    if signed_at > now_ms + limit {
        return Err(Unauthenticated::FromTheFuture { ahead_ms: signed_at - now_ms });
    }
    let age = now_ms.saturating_sub(signed_at);
    if age > limit {
        return Err(Unauthenticated::Stale { age_ms: age, limit_ms: limit });
    }
    Ok(())
}

/// Checks that `request` was signed for `service` with one of its keys, and is not stale at `now_ms`.
pub async fn verify(
    keys: &dyn KeySource,
    service: &str,
    request: &ParticipantRequest,
    now_ms: u64,
) -> Result<(), Unauthenticated> {
    let signature = request.signature.as_ref().ok_or(Unauthenticated::Unsigned)?;
    let set = keys.keys(service).await.map_err(|e| Unauthenticated::Keys(e.to_string()))?;
    let key = set
        .key(&signature.key_id)
        .ok_or_else(|| Unauthenticated::UnknownKey(signature.key_id.clone(), service.to_owned()))?;
    let mut unsigned = request.clone();
    unsigned.signature = None;
    let mut expected = Hmac::<Sha256>::new_from_slice(key.secret.as_bytes()).expect("HMAC takes any key length");
    expected.update(&message_bytes(service, &signature.key_id, signature.signed_at, &unsigned));
    let given = hex::decode(&signature.mac).map_err(|_| Unauthenticated::BadSignature)?;
    expected.verify_slice(&given).map_err(|_| Unauthenticated::BadSignature)?;
    within_window(signature.signed_at, now_ms)
}

fn mac(key: &Key, service: &str, unsigned: &ParticipantRequest, signed_at: u64) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(&message_bytes(service, &key.id, signed_at, unsigned));
    hex::encode(mac.finalize().into_bytes())
}

/// What a MAC covers: the domain, the service, the key, the time, and the whole message in a canonical
/// JSON form (keys sorted at every level, numbers as their decimal text); `docs/participant-protocol.md`
/// gives it byte for byte, with test vectors.
pub fn signing_input(service: &str, key_id: &str, signed_at: u64, unsigned: &ParticipantRequest) -> Vec<u8> {
    message_bytes(service, key_id, signed_at, unsigned)
}

fn message_bytes(service: &str, key_id: &str, signed_at: u64, unsigned: &ParticipantRequest) -> Vec<u8> {
    let message = serde_json::to_value(unsigned).expect("messages serialize");
    format!("{DOMAIN}\n{service}\n{key_id}\n{signed_at}\n{}", crate::model::wire::canonical_json(&message)).into_bytes()
}

/// HMAC-SHA-256 of `data` under `key` (the tests forge signatures with it).
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// The key source the variable `name` names (see [`from_setting`]).
pub fn keys_from_env(sdk: &aws_config::SdkConfig, name: &'static str) -> Result<Arc<dyn KeySource>, ConfigError> {
    config::parsed(name, from_setting(sdk, &config::required(name)?))
}

/// `PARTICIPANT_SIGNATURE`: v1 when unset or empty.
pub fn signature_from_env() -> Result<SignatureVersion, ConfigError> {
    config::parsed(PARTICIPANT_SIGNATURE, SignatureVersion::parse(std::env::var(PARTICIPANT_SIGNATURE).ok().as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Action;

    fn message() -> ParticipantRequest {
        serde_json::from_value(serde_json::json!({
            "action": "prepare", "transactionId": "tx-1", "deadline": 2000, "startedAt": 1000,
            "operations": [{"op": "add", "key": {"entityId": "A"}, "field": "balance", "delta": -1.50, "min": 0}]
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_signed_message_verifies_and_every_change_to_it_does_not() {
        let keys = LocalKeys;
        let signed = sign(&keys, "service-a", &message(), 1_000).await.unwrap();
        assert_eq!(verify(&keys, "service-a", &signed, 1_100).await, Ok(()));
        // Through JSON, as a participant receives it.
        let received: ParticipantRequest = serde_json::from_str(&serde_json::to_string(&signed).unwrap()).unwrap();
        assert_eq!(verify(&keys, "service-a", &received, 1_100).await, Ok(()));

        let mut other_tx = signed.clone();
        other_tx.transaction_id = "tx-2".into();
        let mut other_action = signed.clone();
        other_action.action = Action::Commit;
        let mut other_amount = signed.clone();
        other_amount.operations[0]["delta"] = serde_json::json!(-1000);
        let mut later = signed.clone();
        later.signature.as_mut().unwrap().signed_at += 1;
        for forged in [other_tx, other_action, other_amount, later] {
            assert_eq!(verify(&keys, "service-a", &forged, 1_100).await, Err(Unauthenticated::BadSignature));
        }
        assert_eq!(verify(&keys, "service-b", &signed, 1_100).await, Err(Unauthenticated::BadSignature));
        assert_eq!(verify(&keys, "service-a", &message(), 1_100).await, Err(Unauthenticated::Unsigned));
        let stale = 1_000 + MAX_MESSAGE_AGE_MS + CLOCK_MARGIN_MS + 1;
        assert!(matches!(verify(&keys, "service-a", &signed, stale).await, Err(Unauthenticated::Stale { .. })));
        assert!(verify(&keys, "service-a", &signed, stale - 1).await.is_ok(), "a late copy within the window");
        let signed_late = sign(&keys, "service-a", &message(), stale).await.unwrap();
        assert!(matches!(
            verify(&keys, "service-a", &signed_late, 1_000).await,
            Err(Unauthenticated::FromTheFuture { .. })
        ));
    }

    #[tokio::test]
    async fn a_sealed_message_opens_and_every_change_to_its_bytes_does_not() {
        let keys = LocalKeys;
        let sealed = seal(&keys, "service-a", &message(), 1_000).await.unwrap();
        assert_eq!(open(&keys, "service-a", &sealed, 1_100).await, Ok(message()));
        // Through JSON, as a participant receives it: the envelope's `message` string keeps its bytes.
        let received: Envelope = serde_json::from_str(&serde_json::to_string(&sealed).unwrap()).unwrap();
        assert_eq!(open(&keys, "service-a", &received, 1_100).await, Ok(message()));

        let mut other_bytes = sealed.clone();
        other_bytes.message = other_bytes.message.replace("tx-1", "tx-2");
        let mut spaced = sealed.clone();
        spaced.message = format!(" {}", sealed.message);
        let mut later = sealed.clone();
        later.signed_at += 1;
        for forged in [other_bytes, spaced, later] {
            assert_eq!(open(&keys, "service-a", &forged, 1_100).await, Err(Unauthenticated::BadSignature));
        }
        assert_eq!(open(&keys, "service-b", &sealed, 1_100).await, Err(Unauthenticated::BadSignature));
        let mut v3 = sealed.clone();
        v3.envelope = "twopc/participant-message/v3".into();
        assert!(matches!(open(&keys, "service-a", &v3, 1_100).await, Err(Unauthenticated::UnknownEnvelope(_))));
        let stale = 1_000 + MAX_MESSAGE_AGE_MS + CLOCK_MARGIN_MS + 1;
        assert!(matches!(open(&keys, "service-a", &sealed, stale).await, Err(Unauthenticated::Stale { .. })));
        assert!(open(&keys, "service-a", &sealed, stale - 1).await.is_ok(), "a late copy within the window");
        let sealed_late = seal(&keys, "service-a", &message(), stale).await.unwrap();
        assert!(matches!(
            open(&keys, "service-a", &sealed_late, 1_000).await,
            Err(Unauthenticated::FromTheFuture { .. })
        ));
    }

    /// The point of v2: a sender that writes the message otherwise than this code would (whitespace, key
    /// order, `1.5E0` for `1.50`, a field this version does not know) is verified over what it sent, where
    /// v1 would verify over this code's re-serialization and refuse it.
    #[tokio::test]
    async fn a_message_written_by_another_serializer_verifies_in_v2() {
        let set = LocalKeys::key_set("service-a");
        let key = set.signing_key(1_000).unwrap();
        let text = r#"{ "transactionId": "tx-1", "action": "prepare", "startedAt": 1000, "deadline": 2e3,
            "operations": [{"key": {"entityId": "A"}, "op": "add", "field": "balance", "delta": -1.5E0, "min": 0}],
            "fromALaterVersion": {"x": 1} }"#;
        let mac = hex::encode(hmac_sha256(
            key.secret.as_bytes(),
            &signing_input_v2("service-a", "local", 1_000, text.as_bytes()),
        ));
        let envelope = Envelope {
            envelope: ENVELOPE_V2.into(),
            key_id: "local".into(),
            signed_at: 1_000,
            mac: mac.clone(),
            message: text.into(),
        };
        let opened = open(&LocalKeys, "service-a", &envelope, 1_100).await;
        assert!(matches!(&opened, Err(Unauthenticated::NotAMessage(_))), "2e3 is no integer deadline: {opened:?}");
        let text = text.replace("2e3", "2000");
        let mac = hex::encode(hmac_sha256(
            key.secret.as_bytes(),
            &signing_input_v2("service-a", "local", 1_000, text.as_bytes()),
        ));
        let envelope = Envelope { message: text.clone(), mac, ..envelope };
        let opened = open(&LocalKeys, "service-a", &envelope, 1_100).await.expect("verified over the bytes sent");
        // The participant reads the value as its parser does; what was verified is what was sent.
        assert_eq!(opened.operations[0]["delta"].to_string(), "-1.5e+0");
        // v1 of the same message, signed over the sender's own canonical form, is refused here.
        let mut v1: ParticipantRequest = serde_json::from_str(&text).unwrap();
        let canonical_of_sender = text.replace(' ', "");
        let v1_mac = hex::encode(hmac_sha256(
            key.secret.as_bytes(),
            format!("{DOMAIN}\nservice-a\nlocal\n1000\n{canonical_of_sender}").as_bytes(),
        ));
        v1.signature = Some(MessageSignature { key_id: "local".into(), signed_at: 1_000, mac: v1_mac });
        assert_eq!(verify(&LocalKeys, "service-a", &v1, 1_100).await, Err(Unauthenticated::BadSignature));
    }

    #[test]
    fn the_signature_version_is_v1_unless_v2_is_asked() {
        assert_eq!(SignatureVersion::parse(None), Ok(SignatureVersion::V1));
        assert_eq!(SignatureVersion::parse(Some("v1")), Ok(SignatureVersion::V1));
        assert_eq!(SignatureVersion::parse(Some("v2")), Ok(SignatureVersion::V2));
        assert!(SignatureVersion::parse(Some("2")).is_err());
    }

    #[test]
    fn signers_use_the_newest_key_already_valid() {
        let set = KeySet::parse(
            "s",
            r#"{"keys": [{"id": "k1", "secret": "0123456789abcdef0"}, {"id": "k2", "secret": "fedcba98765432100", "notBefore": 5000}]}"#,
        )
        .unwrap();
        assert_eq!(set.signing_key(4_999).unwrap().id, "k1");
        assert_eq!(set.signing_key(5_000).unwrap().id, "k2");
        let single = KeySet::parse("s", r#"{"id": "k1", "secret": "0123456789abcdef0"}"#).unwrap();
        assert_eq!(single.keys.len(), 1);
        assert!(KeySet::parse("s", r#"{"id": "k1", "secret": "short"}"#).is_err());
        assert!(!format!("{:?}", set).contains("0123456789"), "a key's Debug never shows its secret");
    }
}
