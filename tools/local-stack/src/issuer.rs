//! The development issuer of `twopc-local up --auth jwt`: a key pair made when the stack starts and
//! kept under `.local/auth/` (so that `twopc-local token` can sign with it from another process), its
//! JWKS served by the stack at `<issuer>/.well-known/jwks.json`, and tokens for any `sub`. The stack's
//! authorizer verifies them as the deployed one verifies a Cognito user pool's: it fetches the JWKS
//! over HTTP.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use base64::Engine;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The audience of the development issuer's tokens.
pub const AUDIENCE: &str = "twopc-local";
/// The path (on the REST API's origin) the issuer is named by.
pub const ISSUER_PATH: &str = "/local/issuer";
/// The group the development issuer puts in an operator's token (`twopc-local token --operator`, the
/// page's "operator" sign-in); the stack's policy names it among its `operatorGroups` under `--auth jwt`.
pub const OPERATOR_GROUP: &str = "operators";
/// The group of an admin's token: the default policy's `adminGroups`.
pub const ADMIN_GROUP: &str = "admins";
/// How long a token is valid unless asked otherwise.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(60 * 60);
/// The file under the auth folder.
const FILE: &str = "issuer.json";

/// The development issuer: its name, audience and signing key.
#[derive(Clone, Serialize, Deserialize)]
pub struct DevIssuer {
    pub issuer: String,
    pub audience: String,
    pub kid: String,
    /// The private key, PKCS#8 DER, base64.
    key: String,
}

impl std::fmt::Debug for DevIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevIssuer").field("issuer", &self.issuer).field("kid", &self.kid).finish_non_exhaustive()
    }
}

impl DevIssuer {
    /// A new key pair for `issuer` (an URL), written to `dir` (readable by the user only).
    pub fn create(dir: &Path, issuer: &str) -> Result<DevIssuer, String> {
        let document = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
            .map_err(|e| format!("generating a key pair: {e}"))?;
        let made = DevIssuer {
            issuer: issuer.to_owned(),
            audience: AUDIENCE.to_owned(),
            kid: format!("local-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            key: base64::engine::general_purpose::STANDARD.encode(document.as_ref()),
        };
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let path = Self::path(dir);
        let text = serde_json::to_string_pretty(&made).expect("serializes");
        write_private(&path, text.as_bytes()).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(made)
    }

    /// The issuer a running (or the last) `up --auth jwt` made.
    pub fn load(dir: &Path) -> Result<DevIssuer, String> {
        let path = Self::path(dir);
        let text = std::fs::read(&path).map_err(|e| {
            format!("reading {}: {e} (start the stack with `twopc-local up --auth jwt` first)", path.display())
        })?;
        serde_json::from_slice(&text).map_err(|e| format!("{} is not the issuer's file: {e}", path.display()))
    }

    pub fn path(dir: &Path) -> PathBuf {
        dir.join(FILE)
    }

    fn encoding_key(&self) -> EncodingKey {
        let der = base64::engine::general_purpose::STANDARD.decode(&self.key).expect("the key is base64");
        EncodingKey::from_ec_der(&der)
    }

    /// The public key set, as served at `<issuer>/.well-known/jwks.json`.
    pub fn jwks(&self) -> Value {
        let mut jwk = Jwk::from_encoding_key(&self.encoding_key(), Algorithm::ES256).expect("an EC key has a JWK");
        jwk.common.key_id = Some(self.kid.clone());
        jwk.common.public_key_use = Some(jsonwebtoken::jwk::PublicKeyUse::Signature);
        serde_json::to_value(JwkSet { keys: vec![jwk] }).expect("serializes")
    }

    /// A token for `sub`, valid for `ttl` (an admin's carries the `admins` group, as a Cognito user
    /// pool's `cognito:groups` does).
    pub fn token(&self, sub: &str, admin: bool, ttl: Duration) -> String {
        self.token_for(sub, Roles { admin, operator: false }, ttl)
    }

    /// A token for `sub` with these roles, valid for `ttl`: an admin's carries the `admins` group, an
    /// operator's the `operators` group ([`OPERATOR_GROUP`]), in `cognito:groups` as a Cognito user pool
    /// puts them. Either is given alone: an admin is not an operator, nor an operator an admin.
    pub fn token_for(&self, sub: &str, roles: Roles, ttl: Duration) -> String {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let mut claims = json!({
            "iss": self.issuer, "aud": self.audience, "sub": sub,
            "iat": now, "exp": now + ttl.as_secs(), "token_use": "id",
        });
        let groups: Vec<&str> = [(roles.admin, ADMIN_GROUP), (roles.operator, OPERATOR_GROUP)]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, g)| *g)
            .collect();
        if !groups.is_empty() {
            claims["cognito:groups"] = json!(groups);
        }
        self.sign(&claims)
    }

    /// Any claims, signed with the issuer's key (tests make bad tokens with it).
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding_key()).expect("an ES256 key signs")
    }
}

/// What a development token makes its holder, beside a user that owns its own items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Roles {
    /// In the `admins` group: may do everything but the operators' API.
    pub admin: bool,
    /// In the `operators` group: may use the operators' API (`/admin`) when the policy names the group.
    pub operator: bool,
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(bytes)
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn its_tokens_verify_against_its_jwks_and_others_do_not() {
        let dir = std::env::temp_dir().join(format!("issuer-{}", uuid::Uuid::new_v4().simple()));
        let issuer = DevIssuer::create(&dir, "http://127.0.0.1:1/local/issuer").unwrap();
        assert_eq!(DevIssuer::load(&dir).unwrap().kid, issuer.kid);
        let set: JwkSet = serde_json::from_value(issuer.jwks()).unwrap();
        let key = jsonwebtoken::DecodingKey::from_jwk(&set.keys[0]).unwrap();
        let mut validation = jsonwebtoken::Validation::new(Algorithm::ES256);
        validation.set_audience(&[AUDIENCE]);
        validation.set_issuer(&[&issuer.issuer]);
        let token = issuer.token("alice", true, DEFAULT_TOKEN_TTL);
        let claims = jsonwebtoken::decode::<Value>(&token, &key, &validation).unwrap().claims;
        assert_eq!((claims["sub"].as_str(), &claims["cognito:groups"]), (Some("alice"), &json!(["admins"])));
        let other = DevIssuer::create(&dir.join("other"), &issuer.issuer).unwrap();
        assert!(
            jsonwebtoken::decode::<Value>(other.token("alice", false, DEFAULT_TOKEN_TTL), &key, &validation).is_err()
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn an_operators_token_carries_the_operators_group_and_an_admins_does_not() {
        let dir = std::env::temp_dir().join(format!("issuer-{}", uuid::Uuid::new_v4().simple()));
        let issuer = DevIssuer::create(&dir, "http://127.0.0.1:1/local/issuer").unwrap();
        let groups = |roles: Roles| {
            let token = issuer.token_for("olga", roles, DEFAULT_TOKEN_TTL);
            let payload = token.split('.').nth(1).unwrap();
            let claims: Value =
                serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap())
                    .unwrap();
            claims["cognito:groups"].clone()
        };
        assert_eq!(groups(Roles { admin: false, operator: true }), json!(["operators"]));
        assert_eq!(groups(Roles { admin: true, operator: false }), json!(["admins"]));
        assert_eq!(groups(Roles { admin: true, operator: true }), json!(["admins", "operators"]));
        assert_eq!(groups(Roles::default()), Value::Null);
        // The stack's policy under --auth jwt names the group: its holder is an operator, an admin is not.
        let policy = crate::local_policy(&crate::default_access_policy(), crate::Auth::Jwt);
        assert!(policy.is_operator_claims(&json!({"cognito:groups": ["operators"]})));
        assert!(!policy.is_operator_claims(&json!({"cognito:groups": ["admins"]})));
        std::fs::remove_dir_all(&dir).ok();
    }
}
