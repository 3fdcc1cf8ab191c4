//! The coordinator function: API Gateway REST proxy events in, the core's answers out.

pub mod outcome_log;

use std::sync::Arc;

use lambda_http::{Body, Request, RequestExt, Response};
use twopc::access::{Caller, Policy};
use twopc::clock;
use twopc::config::{self, ConfigError};
use twopc::coordinator::{AdminRequest, Coordinator, Reply};
use twopc::invoke::LambdaInvoker;
use twopc::model::ErrorCode;
use twopc::record::TransactionStore;

/// Builds the coordinator from the environment: the transactions table and the service registry.
pub async fn from_env() -> Result<Coordinator, ConfigError> {
    let registry = config::string_map(twopc::invoke::PARTICIPANTS)?;
    let table = config::or_default(twopc::record::TRANSACTIONS_TABLE_NAME, twopc::record::DEFAULT_TRANSACTIONS_TABLE);
    let aws = config::aws().await;
    let transactions = TransactionStore::new(aws_sdk_dynamodb::Client::new(&aws), table);
    let services: Vec<String> = registry.keys().cloned().collect();
    let invoker = LambdaInvoker::from_registry(&aws, registry);
    let keys = twopc::auth::keys_from_env(&aws, twopc::auth::PARTICIPANT_KEYS)?;
    let age_keys = twopc::age::keys_from_env(&aws)?;
    let operations = twopc::custom::catalogs_from_env()?;
    let holds = twopc::hold::policy_from_env()?;
    // A schema for a service outside the registry is a deployment that lost a participant or misnames one.
    if let Some((unknown, _)) = operations.iter().find(|(service, _)| !services.contains(service)) {
        return Err(ConfigError::Invalid {
            name: twopc::custom::SERVICE_OPERATIONS,
            message: format!("\"{unknown}\" has operations but is not in {}", twopc::invoke::PARTICIPANTS),
        });
    }
    let coordinator = Coordinator::new(transactions, Arc::new(invoker), services, clock::system());
    let coordinator = match config::required(outcome_log::OUTCOME_LOG_GROUP).ok().filter(|g| !g.is_empty()) {
        Some(group) => {
            coordinator.with_outcome_history(Arc::new(outcome_log::LogGroupHistory::from_config(&aws, group)))
        }
        None => coordinator,
    };
    Ok(coordinator
        .with_keys(keys)
        .with_signature(twopc::auth::signature_from_env()?)
        .with_age_keys(age_keys)
        .with_operations(operations)
        .with_hold_policy(holds)
        .with_access(twopc::access::Policy::from_env()?)
        .with_data_tables(data_tables(&aws_sdk_dynamodb::Client::new(&aws))?))
}

/// The participants' tables the operators' views read (`PARTICIPANT_TABLES`, service → table); none when
/// unset: the admin API then shows no locks.
fn data_tables(
    dynamodb: &aws_sdk_dynamodb::Client,
) -> Result<std::collections::BTreeMap<String, twopc::participant::DataTable>, ConfigError> {
    if std::env::var(twopc::tables::PARTICIPANT_TABLES).is_err() {
        return Ok(Default::default());
    }
    let tables = config::string_map(twopc::tables::PARTICIPANT_TABLES)?;
    Ok(tables
        .into_iter()
        .map(|(service, table)| (service, twopc::participant::DataTable::new(dynamodb.clone(), table)))
        .collect())
}

/// The caller, from API Gateway's request context: the JWT principal the authorizer established
/// (`requestContext.authorizer`, which only API Gateway writes), else the IAM-signed caller's ARN
/// (`twopc::principal`), else a request without identity (no authorization ran: the local stack
/// without `--auth`).
pub fn caller(access: &Policy, request: &Request) -> Caller {
    match request.request_context_ref() {
        Some(lambda_http::request::RequestContext::ApiGatewayV1(context)) => {
            twopc::jwt::caller_of_request(access, &context.authorizer.fields, context.identity.user_arn.as_deref())
        }
        // Not the REST API's proxy event: nothing says who called.
        Some(_) => Caller::nobody(),
        None => access.iam(None),
    }
}

/// Routes `POST /transactions`, `GET /transactions/{id}`, a held transaction's decision
/// (`POST /transactions/{id}/commit` and `POST /transactions/{id}/abort`), and the operators' routes under
/// `/admin` (`twopc::coordinator::AdminRequest`).
pub async fn handle(coordinator: &Coordinator, request: Request) -> Response<Body> {
    let started = std::time::SystemTime::now();
    // The path without the stage prefix API Gateway adds; a plain HTTP request (the local stack) has none.
    let path = match request.raw_http_path() {
        "" => request.uri().path().to_owned(),
        raw => raw.to_owned(),
    };
    let segments: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let method = request.method().as_str();
    let caller = caller(coordinator.access(), &request);
    // `Prefer: respond-async` (RFC 7240): answered on the commit decision when the coordinator applies it.
    // A client may send several `Prefer` fields: each is read.
    let respond_async = request
        .headers()
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(twopc::after_answer::prefers_respond_async);
    let reply = match (method, segments.as_slice()) {
        (_, ["admin", ..]) => {
            let query: std::collections::BTreeMap<String, String> = request
                .query_string_parameters_ref()
                .map(|q| q.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect())
                .unwrap_or_default();
            let mut segments = segments.clone();
            // API Gateway passes the id as a path parameter (decoded); fall back to the path.
            if let Some(id) = request.path_parameters_ref().and_then(|p| p.first("id"))
                && segments.len() > 2
            {
                segments[2] = id;
            }
            match AdminRequest::parse(method, &segments, &query) {
                Some(Ok(admin)) => coordinator.admin(admin, &caller).await,
                Some(Err(message)) => Reply::error(ErrorCode::InvalidRequest, message),
                None => match segments.as_slice() {
                    ["admin", "transactions" | "stuck" | "outcomes"] | ["admin", "transactions", _] => {
                        return method_not_allowed(method, &path, "GET");
                    }
                    ["admin", "transactions", _, "retry" | "abort"] => {
                        return method_not_allowed(method, &path, "POST");
                    }
                    _ => Reply::error(ErrorCode::NotFound, format!("no route for {method} {path}")),
                },
            }
        }
        ("POST", ["transactions"]) => {
            let header = |name: &str| request.headers().get(name).map(|v| v.to_str().map(str::to_owned));
            match (header("idempotency-key"), header(twopc::age::AGE_TOKEN_HEADER)) {
                (Some(Err(_)), _) => {
                    Reply::error(ErrorCode::InvalidIdempotencyKey, "Idempotency-Key must be visible ASCII")
                }
                (_, Some(Err(_))) => Reply::error(ErrorCode::InvalidAgeToken, "Age-Token must be visible ASCII"),
                (key, token) => {
                    let (key, token) = (key.and_then(Result::ok), token.and_then(Result::ok));
                    let body = request.body().as_ref();
                    coordinator.submit_preferring(body, key.as_deref(), token.as_deref(), &caller, respond_async).await
                }
            }
        }
        ("GET", ["transactions", _]) => {
            // API Gateway passes the id as a path parameter; fall back to the path for other front ends.
            let id = request
                .path_parameters_ref()
                .and_then(|p| p.first("id").map(str::to_owned))
                .unwrap_or_else(|| segments[1].to_owned());
            coordinator.get_by(&id, &caller).await
        }
        ("POST", ["transactions", _, decision @ ("commit" | "abort")]) => {
            let id = request
                .path_parameters_ref()
                .and_then(|p| p.first("id").map(str::to_owned))
                .unwrap_or_else(|| segments[1].to_owned());
            match *decision {
                "commit" => coordinator.commit_held_by(&id, &caller).await,
                _ => coordinator.abort_held_by(&id, &caller).await,
            }
        }
        (_, ["transactions", _, "commit" | "abort"]) => return method_not_allowed(method, &path, "POST"),
        (_, ["transactions"]) => return method_not_allowed(method, &path, "POST"),
        (_, ["transactions", _]) => return method_not_allowed(method, &path, "GET"),
        _ => Reply::error(ErrorCode::NotFound, format!("no route for {method} {path}")),
    };
    if let Some(id) = reply.body["transactionId"].as_str() {
        let outcome = reply.body["status"].as_str().or(reply.body["code"].as_str()).unwrap_or("");
        twopc::xray::record("coordinator", id, outcome, started);
    }
    let applied = reply.answered_on_decision;
    let mut response = to_response(reply);
    if applied {
        let value = lambda_http::http::HeaderValue::from_static("respond-async");
        response.headers_mut().insert(twopc::after_answer::PREFERENCE_APPLIED, value);
    }
    response
}

/// A 405 names the methods the resource has, as HTTP asks.
fn method_not_allowed(method: &str, path: &str, allowed: &'static str) -> Response<Body> {
    let mut response = to_response(Reply::error(
        ErrorCode::MethodNotAllowed,
        format!("{method} is not allowed on {path}; use {allowed}"),
    ));
    response.headers_mut().insert("allow", lambda_http::http::HeaderValue::from_static(allowed));
    response
}

/// The answer with `Access-Control-Allow-Origin: origin` when an origin is allowed (`twopc::cors`):
/// a Lambda proxy integration's answers carry their CORS header themselves.
pub fn allow_origin(mut response: Response<Body>, origin: Option<&str>) -> Response<Body> {
    if let Some(value) = origin.and_then(|o| lambda_http::http::HeaderValue::from_str(o).ok()) {
        response.headers_mut().insert("access-control-allow-origin", value);
        // A page may read whether its `Prefer: respond-async` was applied.
        let exposed = lambda_http::http::HeaderValue::from_static(twopc::after_answer::PREFERENCE_APPLIED);
        response.headers_mut().insert("access-control-expose-headers", exposed);
    }
    response
}

pub fn to_response(reply: Reply) -> Response<Body> {
    Response::builder()
        .status(reply.status)
        .header("content-type", "application/json")
        .body(Body::Text(reply.body.to_string()))
        .expect("status and header are valid")
}
