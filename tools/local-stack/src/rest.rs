//! The REST API: each HTTP request becomes the API Gateway REST proxy event the coordinator gets in
//! AWS, and the coordinator's `{statusCode, headers, body}` becomes the HTTP answer. What API Gateway
//! answers itself is answered here as it would: the CORS preflight (`OPTIONS`) and its own errors,
//! with the allowed origin (`twopc::cors`). Beside the API: the live page (`crate::page`) and
//! `/openapi.yaml`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tracing::{error, info, warn};

use crate::Functions;
use crate::events::{self, HttpRequest};
use crate::functions::Authorized;
use crate::issuer::{DevIssuer, ISSUER_PATH};
use crate::page::Page;
use crate::same_origin::{Refused, SameOrigin};
use twopc::custom::Catalogs;
use twopc::model::ErrorCode;

/// The REST API's specification, served at `/openapi.yaml` so that tools can read it from the running stack.
pub const OPENAPI: &str = include_str!("../../../openapi.yaml");

/// API Gateway's payload limit.
const MAX_BODY: usize = 10 * 1024 * 1024;

pub(crate) struct Api {
    functions: Arc<Functions>,
    stage: String,
    cors_allow_origin: Option<HeaderValue>,
    page: Page,
    /// `/openapi.yaml` as served: with the configured services' own operations.
    openapi: String,
    /// `--auth jwt`: the development issuer (its JWKS served here, its tokens minted for the live
    /// page), and every API request goes through the authorizer first.
    issuer: Option<DevIssuer>,
    /// `Host` and, on a POST, `Content-Type` (see [`SameOrigin`]).
    same_origin: Option<SameOrigin>,
}

impl Api {
    pub(crate) fn new(
        functions: Arc<Functions>,
        stage: String,
        cors_allow_origin: Option<String>,
        page: Page,
        operations: &Catalogs,
    ) -> Api {
        let cors_allow_origin = cors_allow_origin.and_then(|origin| HeaderValue::try_from(origin).ok());
        Api {
            functions,
            stage,
            cors_allow_origin,
            page,
            openapi: served_openapi(operations),
            issuer: None,
            same_origin: None,
        }
    }

    /// Requests only addressed to the stack itself, POSTs only of JSON.
    pub(crate) fn with_same_origin(self, same_origin: SameOrigin) -> Api {
        Api { same_origin: Some(same_origin), ..self }
    }

    pub(crate) fn with_issuer(self, issuer: Option<DevIssuer>) -> Api {
        Api { issuer, ..self }
    }
}

/// `openapi.yaml` as a stack with these services serves it: each service's own operation kinds are
/// schemas of their own (`<service>.<op>`, marked `x-service`), and `CustomOperation` is any of them in
/// place of the generic schema (none declared: no custom operation at all).
pub fn served_openapi(operations: &Catalogs) -> String {
    let mut spec: Value = yaml_serde::from_str(OPENAPI).expect("openapi.yaml is YAML");
    let schemas = spec.pointer_mut("/components/schemas").and_then(Value::as_object_mut).expect("the spec has schemas");
    let mut declared = Vec::new();
    for (service, catalog) in operations.iter() {
        for operation in catalog.schemas() {
            let name: String = format!("{service}.{}", operation.op)
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
                .collect();
            let mut schema = operation.json_schema();
            schema["x-service"] = json!(service);
            let described = schema["description"].as_str().map(|d| format!(": {d}")).unwrap_or_default();
            schema["description"] = json!(format!("`{service}`'s own operation `{}`{described}", operation.op));
            schemas.insert(name.clone(), schema);
            declared.push(json!({"$ref": format!("#/components/schemas/{name}")}));
        }
    }
    let generic = schemas["CustomOperation"]["description"].clone();
    if declared.is_empty() {
        schemas.remove("CustomOperation");
        let kinds = spec.pointer_mut("/components/schemas/Operation/oneOf").and_then(Value::as_array_mut);
        kinds.expect("Operation is a oneOf").retain(|kind| kind["$ref"] != "#/components/schemas/CustomOperation");
    } else {
        schemas["CustomOperation"] = json!({"description": generic, "anyOf": declared});
    }
    yaml_serde::to_string(&to_yaml(&spec)).expect("a spec serializes")
}

/// serde_json's exact numbers serialize as JSON only: YAML gets them as YAML numbers.
fn to_yaml(value: &Value) -> yaml_serde::Value {
    match value {
        Value::Null => yaml_serde::Value::Null,
        Value::Bool(b) => yaml_serde::Value::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => yaml_serde::Value::Number(u.into()),
            (None, Some(i)) => yaml_serde::Value::Number(i.into()),
            _ => yaml_serde::Value::Number(n.as_f64().unwrap_or_default().into()),
        },
        Value::String(s) => yaml_serde::Value::String(s.clone()),
        Value::Array(items) => yaml_serde::Value::Sequence(items.iter().map(to_yaml).collect()),
        Value::Object(map) => yaml_serde::Value::Mapping(
            map.iter().map(|(k, v)| (yaml_serde::Value::String(k.clone()), to_yaml(v))).collect(),
        ),
    }
}

pub(crate) async fn serve(listener: TcpListener, api: Api) {
    let app = Router::new().fallback(handle).with_state(Arc::new(api));
    if let Err(e) = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await {
        error!(error = %e, "the REST API stopped");
    }
}

/// An answer of API Gateway's own (`{"message"}`), where the deployed API answers one: the authorizer's
/// 401 and 403, 413, 502.
fn message(status: StatusCode, text: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], json!({"message": text}).to_string()).into_response()
}

/// An answer of the local stack's own checks, in the API's error shape (`{"error": {"code", "message"}}`)
/// so that a client reads it as it reads the coordinator's.
fn local_error(code: ErrorCode, text: String) -> Response {
    let reply = twopc::coordinator::Reply::error(code, text);
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_REQUEST);
    (status, [(header::CONTENT_TYPE, "application/json")], reply.body.to_string()).into_response()
}

/// A same-origin refusal: 415 for a POST that is not JSON, 403 for a foreign `Host` or `Origin`.
fn refusal(refused: Refused) -> Response {
    let code = if refused.status == 415 { ErrorCode::UnsupportedMediaType } else { ErrorCode::Forbidden };
    local_error(code, refused.message)
}

/// Marks an answer that is the coordinator's own: passed on as it is, its CORS header included.
#[derive(Clone, Copy)]
struct FromCoordinator;

/// Marks an answer of the local stack's own routes (the page, `/local/*`, the spec): same-origin,
/// never shared with other origins.
#[derive(Clone, Copy)]
struct LocalOnly;

async fn handle(State(api): State<Arc<Api>>, ConnectInfo(peer): ConnectInfo<SocketAddr>, request: Request) -> Response {
    let mut response = answer(&api, peer, request).await;
    // What API Gateway answers itself carries the origin as its gateway responses are configured to.
    if response.extensions().get::<FromCoordinator>().is_none()
        && response.extensions().get::<LocalOnly>().is_none()
        && let Some(origin) = &api.cors_allow_origin
    {
        response.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    }
    response
}

async fn answer(api: &Api, peer: SocketAddr, request: Request) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    if let Some(Err(refused)) = api.same_origin.as_ref().map(|s| s.check_rest(&parts.method, &parts.headers)) {
        warn!(peer = %peer, "{} {} refused: {}", parts.method, parts.uri.path(), refused.message);
        let mut response = refusal(refused);
        response.extensions_mut().insert(LocalOnly);
        return response;
    }
    let method = parts.method.as_str();
    let path = parts.uri.path();
    if path.starts_with("/local/")
        && let Some(Err(refused)) = api.same_origin.as_ref().map(|s| s.check_own_page(&parts.headers))
    {
        // `/local/token` signs anyone in as anyone: only the stack's own page may ask for a token.
        warn!(peer = %peer, "{method} {path} refused: {}", refused.message);
        let mut response = refusal(refused);
        response.extensions_mut().insert(LocalOnly);
        return response;
    }
    if (method, path) == ("GET", "/openapi.yaml") {
        let mut response = ([(header::CONTENT_TYPE, "application/yaml")], api.openapi.clone()).into_response();
        response.extensions_mut().insert(LocalOnly);
        return response;
    }
    if let Some(issuer) = &api.issuer {
        if (method, path) == ("GET", format!("{ISSUER_PATH}/.well-known/jwks.json").as_str()) {
            let mut response = axum::Json(issuer.jwks()).into_response();
            response.extensions_mut().insert(LocalOnly);
            return response;
        }
        if (method, path) == ("POST", "/local/token") {
            // The live page signs in as a chosen local user: a development token, as the issuer's
            // sign-in would give it. Local only, same-origin only (no CORS header on it).
            let body = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
            let asked: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let mut response = match asked["sub"].as_str().filter(|sub| twopc::jwt::is_valid_sub(sub)) {
                Some(sub) => {
                    // An admin and an operator are separate roles: each is asked for on its own.
                    let roles = crate::issuer::Roles {
                        admin: asked["admin"].as_bool().unwrap_or(false),
                        operator: asked["operator"].as_bool().unwrap_or(false),
                    };
                    let token = issuer.token_for(sub, roles, crate::issuer::DEFAULT_TOKEN_TTL);
                    axum::Json(json!({"token": token, "sub": sub, "admin": roles.admin, "operator": roles.operator}))
                        .into_response()
                }
                None => local_error(
                    ErrorCode::InvalidRequest,
                    format!(
                        "expected {{\"sub\": \"<user>\", \"admin\"?: bool, \"operator\"?: bool}}; sub: {}",
                        twopc::jwt::SUB_RULE
                    ),
                ),
            };
            response.extensions_mut().insert(LocalOnly);
            return response;
        }
    }
    if (method, path) == ("GET", "/local/payments") {
        let mut response = api.page.payments().await;
        response.extensions_mut().insert(LocalOnly);
        return response;
    }
    if (method, path) == ("GET", "/local/items") {
        let mut response = api.page.items(parts.uri.query()).await;
        response.extensions_mut().insert(LocalOnly);
        return response;
    }
    if method == "GET"
        && let Some(mut response) = api.page.get(path, parts.uri.query())
    {
        response.extensions_mut().insert(LocalOnly);
        return response;
    }
    if method == "OPTIONS"
        && let Some(origin) = &api.cors_allow_origin
        && events::rest_resource("GET", path).or(events::rest_resource("POST", path)).is_some()
    {
        // The preflight: API Gateway's mock, which needs no signature (browsers never sign one).
        let origin = origin.to_str().unwrap_or_default();
        let mut response = StatusCode::NO_CONTENT.into_response();
        for (name, value) in twopc::cors::preflight_headers(origin) {
            if let Ok(value) = HeaderValue::try_from(value) {
                response.headers_mut().insert(name, value);
            }
        }
        return response;
    }
    let Some((resource, path_parameters)) = events::rest_resource(method, path) else {
        // The deployed API answers 403 "Missing Authentication Token" for a route it does not have.
        return local_error(
            ErrorCode::NotFound,
            format!(
                "no route for {method} {path}: the API has POST /transactions, GET /transactions/{{id}}, POST /transactions/{{id}}/commit, POST /transactions/{{id}}/abort and the operators' routes under /admin (deployed, API Gateway answers 403 Missing Authentication Token here)"
            ),
        );
    };
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(_) => return message(StatusCode::PAYLOAD_TOO_LARGE, "Request Too Long".into()),
    };
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(name, value)| (name.to_string(), String::from_utf8_lossy(value.as_bytes()).into_owned()))
        .collect();
    let domain = parts.headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1").to_owned();
    let http =
        HttpRequest { method, path, query: parts.uri.query(), headers, body: &body, source_ip: peer.ip().to_string() };
    let mut event = events::rest_proxy_event(&http, resource, path_parameters, &api.stage, &domain);
    if api.issuer.is_some() {
        // The REST API's Lambda authorizer, as API Gateway runs it before the integration.
        let arn = events::method_arn(&api.stage, method, path);
        let authorizer = events::authorizer_event(&arn, &http.headers, http.query);
        match api.functions.authorize(&authorizer).await {
            Ok(Authorized::Allow(fields)) => event["requestContext"]["authorizer"] = fields,
            Ok(Authorized::Unauthorized) => {
                info!("{method} {path} -> 401 (no valid token)");
                return message(StatusCode::UNAUTHORIZED, "Unauthorized".into());
            }
            Ok(Authorized::Deny) => {
                return message(StatusCode::FORBIDDEN, "User is not authorized to access this resource".into());
            }
            Err(e) => {
                error!(error = %e, "{method} {path}: the authorizer failed");
                return message(StatusCode::INTERNAL_SERVER_ERROR, "Internal server error".into());
            }
        }
    }
    match api.functions.coordinator(&event).await {
        Ok(answer) => {
            let summary = serde_json::from_slice::<Value>(&answer.body).ok().map(|b| {
                let field = |name: &str| b.get(name).and_then(Value::as_str).unwrap_or("").to_owned();
                let error = b.pointer("/error/code").and_then(Value::as_str).unwrap_or("");
                format!("{} {}{error}", field("transactionId"), field("status")).trim().to_owned()
            });
            info!(
                "{method} {path} -> {} {} ({} ms)",
                answer.status,
                summary.unwrap_or_default(),
                started.elapsed().as_millis()
            );
            let mut response = Response::new(Body::from(answer.body));
            response.extensions_mut().insert(FromCoordinator);
            *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
            for (name, value) in answer.headers {
                if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                    response.headers_mut().append(name, value);
                }
            }
            response
        }
        Err(e) => {
            // What API Gateway answers when the integration fails.
            error!(error = %e, "{method} {path}: the coordinator failed");
            message(StatusCode::BAD_GATEWAY, "Internal server error".into())
        }
    }
}
