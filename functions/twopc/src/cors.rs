//! Cross-origin access to the REST API, as the deployed API answers it: API Gateway answers the
//! preflight (an `OPTIONS` mock on each resource, no authorization) and its own errors (gateway
//! responses); the coordinator's answers carry the allowed origin themselves, as every Lambda proxy
//! integration's must. The SAM and CDK templates are held to these values by the infra checks, and
//! the local stack answers with them.

/// Coordinator: the origin its answers allow cross-origin callers (`*`, or one origin such as
/// `https://app.example.com`); unset or empty, no CORS header (see [`crate::cors`]).
pub const CORS_ALLOW_ORIGIN: &str = "CORS_ALLOW_ORIGIN";

/// What the templates' `CorsAllowOrigin` parameter defaults to. Any origin: every request must be
/// SigV4-signed anyway, and no cookie is ever sent, so the origin protects nothing a signature does not.
pub const DEFAULT_ALLOW_ORIGIN: &str = "*";
pub const ALLOW_METHODS: &str = "GET,POST,OPTIONS";
/// What a browser client sends: the body's type, the idempotency key, the age token, its preference to be
/// answered on the commit decision (`Prefer: respond-async`) and SigV4's headers.
pub const ALLOW_HEADERS: &str =
    "Age-Token,Authorization,Content-Type,Idempotency-Key,Prefer,X-Amz-Content-Sha256,X-Amz-Date,X-Amz-Security-Token";
/// How long a browser may keep a preflight's answer.
pub const MAX_AGE_SECONDS: u32 = 600;

/// The origin the coordinator's answers allow, from [`CORS_ALLOW_ORIGIN`].
pub fn allow_origin_from_env() -> Option<String> {
    std::env::var(CORS_ALLOW_ORIGIN).ok().filter(|origin| !origin.is_empty())
}

/// The headers of a preflight's answer (`OPTIONS`) for `origin`.
pub fn preflight_headers(origin: &str) -> [(&'static str, String); 4] {
    [
        ("access-control-allow-origin", origin.to_owned()),
        ("access-control-allow-methods", ALLOW_METHODS.to_owned()),
        ("access-control-allow-headers", ALLOW_HEADERS.to_owned()),
        ("access-control-max-age", MAX_AGE_SECONDS.to_string()),
    ]
}
