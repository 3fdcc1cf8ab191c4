//! The authorizer: one Lambda REQUEST authorizer for both APIs, the REST API's methods and the
//! WebSocket API's `$connect`. The verification is `twopc::jwt`'s; this reads the token out of API
//! Gateway's event and answers an Allow policy with the caller in its context, or the error API
//! Gateway turns into 401 (`Unauthorized`). A failure to fetch the issuer's keys is not the caller's
//! fault: it is answered as a function error (API Gateway's 500), never as a wrong 401 or an Allow.

use std::collections::HashMap;

use aws_lambda_events::apigw::ApiGatewayCustomAuthorizerRequestTypeRequest;
use serde_json::Value;
use tracing::info;
use twopc::access::Policy;
use twopc::config::ConfigError;
use twopc::jwt::{JwtSettings, Rejected, Verifier};

/// What API Gateway needs as the error message to answer 401.
pub const UNAUTHORIZED: &str = "Unauthorized";

/// `JWT_ISSUER`, `JWT_AUDIENCE`, `JWKS_URL` and `ACCESS_POLICY`.
pub fn from_env() -> Result<Verifier, ConfigError> {
    Ok(Verifier::new(JwtSettings::from_env()?, Policy::from_env()?))
}

/// Why the authorizer did not answer Allow.
#[derive(Debug, thiserror::Error)]
pub enum Denied {
    /// No token, or one that does not verify: 401.
    #[error("Unauthorized")]
    Unauthorized,
    /// The issuer's keys could not be fetched: a function error (500), so the caller may retry.
    #[error("the issuer's keys could not be fetched")]
    Unavailable,
    #[error("not an API Gateway REQUEST authorizer event: {0}")]
    BadEvent(String),
}

/// One authorizer call.
pub async fn handle(verifier: &Verifier, event: Value) -> Result<Value, Denied> {
    let request: ApiGatewayCustomAuthorizerRequestTypeRequest =
        serde_json::from_value(event).map_err(|e| Denied::BadEvent(e.to_string()))?;
    let method_arn = request.method_arn.clone().unwrap_or_default();
    // The WebSocket `$connect` (`.../<api>/<stage>/$connect`, not a REST path that ends so): a browser
    // cannot set headers on a WebSocket, so the query may carry it.
    let resource: Vec<&str> = method_arn.rsplit(':').next().unwrap_or_default().split('/').collect();
    let websocket = resource.len() == 3 && resource[2] == "$connect";
    let headers: HashMap<String, String> = request
        .headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned())))
        .collect();
    let query: HashMap<String, String> =
        request.query_string_parameters.iter().map(|(name, value)| (name.to_owned(), value.to_owned())).collect();
    let Some(token) = twopc::jwt::token_of(&headers, &query, websocket) else {
        info!(method_arn, "refused: no token");
        return Err(Denied::Unauthorized);
    };
    match verifier.verify(token).await {
        Ok(caller) => {
            info!(method_arn, principal = caller.principal.as_deref().unwrap_or("-"), admin = caller.admin, "allowed");
            Ok(twopc::jwt::allow(&caller, &method_arn))
        }
        Err(Rejected::KeysUnavailable(_)) => Err(Denied::Unavailable),
        Err(rejected) => {
            info!(method_arn, reason = %rejected, "refused");
            Err(Denied::Unauthorized)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use twopc::jwt::JwtSettings;

    fn event(name: &str) -> Value {
        let text = std::fs::read(format!("{}/../../events/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        serde_json::from_slice(&text).unwrap()
    }

    /// A verifier whose issuer cannot be reached: a call that gets as far as fetching keys says so.
    fn verifier() -> Verifier {
        Verifier::new(JwtSettings::new("http://127.0.0.1:9/issuer", "app", None), Policy::default())
    }

    #[tokio::test]
    async fn sample_events_without_a_valid_token_are_unauthorized() {
        // The samples' tokens name a key nobody has and carry no real signature.
        for name in ["authorizer-rest.json", "authorizer-connect.json"] {
            let denied = handle(&verifier(), event(name)).await.unwrap_err();
            assert!(matches!(denied, Denied::Unauthorized | Denied::Unavailable), "{name}: {denied:?}");
        }
        let mut no_token = event("authorizer-rest.json");
        no_token["headers"] = serde_json::json!({});
        assert!(matches!(handle(&verifier(), no_token).await, Err(Denied::Unauthorized)));
        assert_eq!(Denied::Unauthorized.to_string(), UNAUTHORIZED);
    }

    #[tokio::test]
    async fn a_rest_method_takes_no_token_from_the_query() {
        // The query is for browsers' WebSockets only: a URL with a token ends up in logs and histories.
        let mut rest = event("authorizer-rest.json");
        rest["headers"] = serde_json::json!({});
        // A token with a key id: taken, it would reach the (unreachable) issuer and be Unavailable.
        let token = event("authorizer-connect.json")["queryStringParameters"]["token"].clone();
        let mut connect = event("authorizer-connect.json");
        connect["headers"] = serde_json::json!({});
        assert!(
            matches!(handle(&verifier(), connect).await, Err(Denied::Unavailable)),
            "the query is read at $connect"
        );
        rest["queryStringParameters"] = serde_json::json!({ "token": token });
        assert!(matches!(handle(&verifier(), rest.clone()).await, Err(Denied::Unauthorized)));
        rest["methodArn"] =
            serde_json::json!("arn:aws:execute-api:us-east-1:123456789012:a1b2c3d4e5/prod/GET/transactions/$connect");
        assert!(matches!(handle(&verifier(), rest).await, Err(Denied::Unauthorized)));
        assert!(matches!(handle(&verifier(), serde_json::json!({"methodArn": 5})).await, Err(Denied::BadEvent(_))));
    }
}
