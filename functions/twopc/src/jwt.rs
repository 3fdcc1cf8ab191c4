//! JWT callers: the verifier both APIs' authorizer shares (REST methods and the WebSocket `$connect`).
//!
//! A token is accepted when its signature verifies against the issuer's JWKS (fetched over HTTP and
//! cached: [`KEYS_TTL`], and fetched again, at most every [`REFETCH_INTERVAL`], when a token names a
//! key the cached set does not have, so a key rotation is picked up at once), its algorithm is an
//! asymmetric one the key is for (never `none`, never HMAC: a public key is no secret), and its `exp`,
//! `iss` (exactly `JWT_ISSUER`), `aud` (`JWT_AUDIENCE`) and `sub` are there and right. Whether its holder
//! is an admin is the access policy's to say ([`crate::access::Policy::is_admin_claims`]).
//!
//! The authorizer answers API Gateway with an Allow policy and the caller in its context
//! (`principal`, `sub`, `admin`), which API Gateway passes to the coordinator and the connections
//! function as `requestContext.authorizer`; a request without a valid token gets 401 from API
//! Gateway itself and never reaches them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::access::{Caller, Policy};
use crate::config::ConfigError;

/// The issuer the tokens must name (`iss`), exactly.
pub const JWT_ISSUER: &str = "JWT_ISSUER";
/// The audience the tokens must be for (`aud`).
pub const JWT_AUDIENCE: &str = "JWT_AUDIENCE";
/// Where the issuer's keys are; default `<JWT_ISSUER>/.well-known/jwks.json` (Cognito's, and most issuers').
pub const JWKS_URL: &str = "JWKS_URL";
/// How long a fetched key set is used before it is fetched again.
pub const KEYS_TTL: Duration = Duration::from_secs(600);
/// A token naming an unknown key fetches the set again, but not more often than this.
pub const REFETCH_INTERVAL: Duration = Duration::from_secs(30);
/// Clock skew allowed on `exp` and `nbf`.
pub const LEEWAY_SECS: u64 = 30;
/// A JWKS fetch that takes longer is a failure (the authorizer has 10 s).
const FETCH_TIMEOUT: Duration = Duration::from_secs(4);
const ASYMMETRIC: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// The issuer and audience a deployment accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSettings {
    pub issuer: String,
    pub audience: String,
    pub jwks_url: String,
}

impl JwtSettings {
    pub fn new(issuer: &str, audience: &str, jwks_url: Option<&str>) -> JwtSettings {
        let issuer = issuer.trim().to_owned();
        let jwks_url = match jwks_url.map(str::trim) {
            Some(url) if !url.is_empty() => url.to_owned(),
            _ => format!("{}/.well-known/jwks.json", issuer.trim_end_matches('/')),
        };
        JwtSettings { issuer, audience: audience.trim().to_owned(), jwks_url }
    }

    /// `JWT_ISSUER`, `JWT_AUDIENCE` (both required, not blank) and `JWKS_URL`.
    pub fn from_env() -> Result<JwtSettings, ConfigError> {
        let required = |name: &'static str| match std::env::var(name) {
            Ok(value) if !value.trim().is_empty() => Ok(value),
            Ok(_) => Err(ConfigError::Invalid { name, message: "is empty".into() }),
            Err(_) => Err(ConfigError::Missing(name)),
        };
        let issuer = required(JWT_ISSUER)?;
        let audience = required(JWT_AUDIENCE)?;
        Ok(JwtSettings::new(&issuer, &audience, std::env::var(JWKS_URL).ok().as_deref()))
    }
}

/// Why a token was not accepted (the caller gets 401; the log gets this).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("no token: expected Authorization: Bearer <token>")]
    Missing,
    #[error("the token is not valid: {0}")]
    Invalid(String),
    /// The issuer's keys could not be fetched: not the caller's fault, but nothing can be verified.
    #[error("the issuer's keys could not be fetched: {0}")]
    KeysUnavailable(String),
}

struct CachedKeys {
    keys: JwkSet,
    fetched: Instant,
}

/// Verifies tokens of one issuer; shared by every request of a process (the key set is cached).
pub struct Verifier {
    settings: JwtSettings,
    policy: Policy,
    http: reqwest::Client,
    cache: Mutex<Option<CachedKeys>>,
}

impl Verifier {
    pub fn new(settings: JwtSettings, policy: Policy) -> Verifier {
        let http = crate::https::client_builder().timeout(FETCH_TIMEOUT).build().expect("an HTTP client builds");
        Verifier { settings, policy, http, cache: Mutex::new(None) }
    }

    pub fn settings(&self) -> &JwtSettings {
        &self.settings
    }

    /// The caller a token proves, or why it proves nothing.
    pub async fn verify(&self, token: &str) -> Result<Caller, Rejected> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| Rejected::Invalid(e.to_string()))?;
        if !ASYMMETRIC.contains(&header.alg) {
            return Err(Rejected::Invalid(format!("algorithm {:?} is not accepted", header.alg)));
        }
        let kid = header.kid.ok_or_else(|| Rejected::Invalid("the token names no key (kid)".into()))?;
        let jwk = self.key(&kid).await?;
        let key = DecodingKey::from_jwk(&jwk).map_err(|e| Rejected::Invalid(format!("key {kid}: {e}")))?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&[&self.settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let data =
            jsonwebtoken::decode::<Value>(token, &key, &validation).map_err(|e| Rejected::Invalid(e.to_string()))?;
        let claims = data.claims;
        let Some(sub) = claims["sub"].as_str().filter(|sub| is_valid_sub(sub)) else {
            return Err(Rejected::Invalid(format!("sub is missing or not a subject we take: {SUB_RULE}")));
        };
        Ok(Caller::jwt(&self.settings.issuer, sub, self.policy.is_admin_claims(&claims))
            .operating(self.policy.is_operator_claims(&claims)))
    }

    /// The key `kid` of the issuer's set: the cached set while fresh, else (or when it lacks `kid` and
    /// was fetched long enough ago) fetched again.
    async fn key(&self, kid: &str) -> Result<jsonwebtoken::jwk::Jwk, Rejected> {
        let stale = {
            let cache = self.cache.lock().expect("the key cache is never poisoned");
            match cache.as_ref() {
                Some(cached) if cached.fetched.elapsed() < KEYS_TTL => match cached.keys.find(kid) {
                    Some(jwk) => return Ok(jwk.clone()),
                    None => cached.fetched.elapsed() >= REFETCH_INTERVAL,
                },
                _ => true,
            }
        };
        if !stale {
            return Err(Rejected::Invalid(format!("the issuer has no key {kid}")));
        }
        let keys = match self.fetch().await {
            Ok(keys) => keys,
            // The issuer out of reach: the keys it served last still verify what they verified.
            Err(unavailable) => {
                let cache = self.cache.lock().expect("the key cache is never poisoned");
                return match cache.as_ref().and_then(|cached| cached.keys.find(kid)) {
                    Some(jwk) => {
                        warn!(kid, "using the issuer's last keys: it could not be reached");
                        Ok(jwk.clone())
                    }
                    None => Err(unavailable),
                };
            }
        };
        let found = keys.find(kid).cloned();
        *self.cache.lock().expect("the key cache is never poisoned") =
            Some(CachedKeys { keys, fetched: Instant::now() });
        found.ok_or_else(|| Rejected::Invalid(format!("the issuer has no key {kid}")))
    }

    async fn fetch(&self) -> Result<JwkSet, Rejected> {
        let url = &self.settings.jwks_url;
        let unavailable = |e: String| {
            warn!(url, error = %e, "JWKS fetch failed");
            Rejected::KeysUnavailable(e)
        };
        let response = self.http.get(url).send().await.map_err(|e| unavailable(e.to_string()))?;
        if !response.status().is_success() {
            return Err(unavailable(format!("{url} answered {}", response.status())));
        }
        let bytes = response.bytes().await.map_err(|e| unavailable(e.to_string()))?;
        let keys: JwkSet = serde_json::from_slice(&bytes).map_err(|e| unavailable(format!("not a JWKS: {e}")))?;
        info!(url, keys = keys.keys.len(), "fetched the issuer's keys");
        Ok(keys)
    }
}

/// The token of `Authorization: Bearer <token>` (the scheme in any case).
/// What [`is_valid_sub`] takes, for messages.
pub const SUB_RULE: &str = "1 to 255 bytes, without '#' (it separates the issuer in a principal and a sub's own items), '\"', '\\' or control characters (the principal is written as it is into the APIs' JSON access log lines)";

/// A token's `sub` the authorizer takes: OpenID Connect's 255 bytes at most, no `#` (a principal is
/// `jwt:<iss>#<sub>`, and `<sub>#...` are the caller's items), and nothing that would break a JSON line
/// it is written into unescaped (API Gateway's access log writes `$context.authorizer.principal` as it is).
pub fn is_valid_sub(sub: &str) -> bool {
    !sub.is_empty() && sub.len() <= 255 && !sub.chars().any(|c| c == '#' || c == '"' || c == '\\' || c.is_control())
}

pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let value = authorization?.trim();
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

/// A REQUEST authorizer's call: the token comes from the `Authorization` header, and for the
/// WebSocket `$connect` (a browser cannot set headers on a WebSocket) from the `token` query
/// parameter too.
pub fn token_of<'a>(
    headers: &'a HashMap<String, String>,
    query: &'a HashMap<String, String>,
    websocket: bool,
) -> Option<&'a str> {
    let authorization = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("authorization")).map(|(_, v)| v.as_str());
    bearer(authorization).or_else(|| websocket.then(|| query.get("token").map(String::as_str)).flatten())
}

/// The authorizer's answer for an accepted caller: Allow on `method_arn`, the caller in the context.
pub fn allow(caller: &Caller, method_arn: &str) -> Value {
    json!({
        "principalId": caller.principal,
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": "Allow", "Resource": method_arn}],
        },
        "context": authorizer_context(caller),
    })
}

/// The fields the coordinator and the connections function read back (`requestContext.authorizer`).
pub fn authorizer_context(caller: &Caller) -> Value {
    json!({
        "principal": caller.principal,
        "sub": caller.sub,
        "admin": if caller.admin { "true" } else { "false" },
        "operator": if caller.operator { "true" } else { "false" },
    })
}

/// The caller an authorizer context names (None: not one of ours).
pub fn caller_from_context(fields: &HashMap<String, Value>) -> Option<Caller> {
    let text = |name: &str| fields.get(name).and_then(Value::as_str);
    Caller::from_context(text("principal")?, text("sub"), text("admin"), text("operator"))
}

/// The caller of a request from what API Gateway says of it: the context our authorizer gave (one that
/// names a principal we cannot read makes the caller nobody, never an admin), else the IAM-signed
/// caller's ARN, else a request without identity (no authorization ran: the local stack without `--auth`).
pub fn caller_of_request(policy: &Policy, authorizer: &HashMap<String, Value>, user_arn: Option<&str>) -> Caller {
    let ran = authorizer.contains_key("principal");
    match caller_from_context(authorizer) {
        Some(caller) => caller,
        None if ran => Caller::nobody(),
        None => policy.iam(crate::principal::of_identity(user_arn).as_deref()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_that_would_break_a_principal_or_a_log_line_are_refused() {
        for good in ["alice", "9f3c2a7e-1b2d-4c5e-8f90-a1b2c3d4e5f6", "auth0|5f7c8ec7c33c6c004bbafe82", "é"] {
            assert!(is_valid_sub(good), "{good}");
        }
        let long = "a".repeat(256);
        for bad in ["", "a#b", "a\"b", "a\\b", "a\nb", "a\u{7f}b", long.as_str()] {
            assert!(!is_valid_sub(bad), "{bad:?}");
        }
        assert!(is_valid_sub(&"a".repeat(255)));
    }

    #[test]
    fn bearer_tokens_are_read_from_the_header_and_for_websockets_from_the_query() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        let headers = HashMap::from([("Authorization".to_owned(), "Bearer h".to_owned())]);
        let query = HashMap::from([("token".to_owned(), "q".to_owned())]);
        assert_eq!(token_of(&headers, &query, true), Some("h"));
        assert_eq!(token_of(&HashMap::new(), &query, true), Some("q"));
        assert_eq!(token_of(&HashMap::new(), &query, false), None);
    }

    #[test]
    fn a_context_that_is_not_ours_makes_nobody_and_iam_callers_stay_iam() {
        let policy = Policy::default();
        let garbled = HashMap::from([("principal".to_owned(), json!("jwt:no-sub-here"))]);
        assert_eq!(caller_of_request(&policy, &garbled, Some("arn:aws:iam::1:user/x")), Caller::nobody());
        let other = HashMap::from([("principalId".to_owned(), json!("someone"))]);
        let iam = caller_of_request(&policy, &other, Some("arn:aws:iam::1:user/x"));
        assert!(iam.is_iam() && iam.admin && iam.principal.as_deref() == Some("arn:aws:iam::1:user/x"));
    }

    #[test]
    fn the_context_round_trips_to_the_caller() {
        let caller = Caller::jwt("https://issuer", "alice", true);
        let context: HashMap<String, Value> = serde_json::from_value(authorizer_context(&caller)).expect("an object");
        assert_eq!(caller_from_context(&context), Some(caller));
        assert_eq!(JwtSettings::new("https://i/", "a", None).jwks_url, "https://i/.well-known/jwks.json");
    }
}
