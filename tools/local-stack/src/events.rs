//! The events the functions get in AWS, built from what the local servers receive: an API Gateway
//! REST proxy event for the coordinator, API Gateway WebSocket proxy events for the connections
//! function, an EventBridge scheduled event for the sweeper.

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::{Map, Value, json};

pub const ACCOUNT_ID: &str = "123456789012";
pub const API_ID: &str = "local";

/// `01/May/2024:12:00:00 +0000`, API Gateway's `requestTime`.
fn request_time(now: chrono::DateTime<chrono::Utc>) -> String {
    now.format("%d/%b/%Y:%H:%M:%S +0000").to_string()
}

/// An HTTP request as the REST API received it.
#[derive(Debug, Clone)]
pub struct HttpRequest<'a> {
    pub method: &'a str,
    /// The path without the query string.
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// (name, value) in arrival order; a name may repeat.
    pub headers: Vec<(String, String)>,
    pub body: &'a [u8],
    pub source_ip: String,
}

/// The REST API's resources, as the template declares them: the resource template and its path
/// parameters, or None when API Gateway would not route the request to the coordinator.
pub fn rest_resource(method: &str, path: &str) -> Option<(&'static str, Option<Value>)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, segments.as_slice()) {
        ("POST", ["transactions"]) => Some(("/transactions", None)),
        ("GET", ["transactions", id]) if !id.is_empty() => {
            Some(("/transactions/{id}", Some(json!({"id": percent_decode(id)}))))
        }
        ("POST", ["transactions", id, "commit"]) if !id.is_empty() => {
            Some(("/transactions/{id}/commit", Some(json!({"id": percent_decode(id)}))))
        }
        ("POST", ["transactions", id, "abort"]) if !id.is_empty() => {
            Some(("/transactions/{id}/abort", Some(json!({"id": percent_decode(id)}))))
        }
        ("GET", ["admin", "transactions"]) => Some(("/admin/transactions", None)),
        ("GET", ["admin", "stuck"]) => Some(("/admin/stuck", None)),
        ("GET", ["admin", "outcomes"]) => Some(("/admin/outcomes", None)),
        ("GET", ["admin", "transactions", id]) if !id.is_empty() => {
            Some(("/admin/transactions/{id}", Some(json!({"id": percent_decode(id)}))))
        }
        ("POST", ["admin", "transactions", id, action @ ("retry" | "abort")]) if !id.is_empty() => {
            let resource =
                if *action == "retry" { "/admin/transactions/{id}/retry" } else { "/admin/transactions/{id}/abort" };
            Some((resource, Some(json!({"id": percent_decode(id)}))))
        }
        _ => None,
    }
}

fn percent_decode(text: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(high), Some(low)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(high << 4 | low);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_parameters(query: Option<&str>) -> (Value, Value) {
    let Some(query) = query.filter(|q| !q.is_empty()) else { return (Value::Null, Value::Null) };
    let mut single = Map::new();
    let mut multi: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (name, value) = (percent_decode(&name.replace('+', " ")), percent_decode(&value.replace('+', " ")));
        single.insert(name.clone(), Value::String(value.clone()));
        multi.entry(name).or_default().push(Value::String(value));
    }
    let multi: Map<String, Value> = multi.into_iter().map(|(k, v)| (k, Value::Array(v))).collect();
    (Value::Object(single), Value::Object(multi))
}

/// The API Gateway REST API proxy event (Lambda proxy integration) for a request to `resource`.
pub fn rest_proxy_event(
    request: &HttpRequest<'_>,
    resource: &str,
    path_parameters: Option<Value>,
    stage: &str,
    domain: &str,
) -> Value {
    let now = chrono::Utc::now();
    let mut headers = Map::new();
    let mut multi: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (name, value) in &request.headers {
        headers.insert(name.clone(), Value::String(value.clone()));
        multi.entry(name.clone()).or_default().push(Value::String(value.clone()));
    }
    let user_agent = headers.get("user-agent").cloned().unwrap_or(Value::Null);
    let multi: Map<String, Value> = multi.into_iter().map(|(k, v)| (k, Value::Array(v))).collect();
    let (query, multi_query) = query_parameters(request.query);
    let (body, base64) = match std::str::from_utf8(request.body) {
        _ if request.body.is_empty() => (Value::Null, false),
        Ok(text) => (Value::String(text.to_owned()), false),
        Err(_) => (Value::String(base64::engine::general_purpose::STANDARD.encode(request.body)), true),
    };
    let request_id = uuid::Uuid::new_v4().to_string();
    json!({
        "resource": resource,
        "path": request.path,
        "httpMethod": request.method,
        "headers": headers,
        "multiValueHeaders": multi,
        "queryStringParameters": query,
        "multiValueQueryStringParameters": multi_query,
        "pathParameters": path_parameters,
        "stageVariables": null,
        "requestContext": {
            "accountId": ACCOUNT_ID,
            "apiId": API_ID,
            "resourceId": "local",
            "resourcePath": resource,
            "httpMethod": request.method,
            "stage": stage,
            "path": format!("/{stage}{}", request.path),
            "protocol": "HTTP/1.1",
            "domainName": domain,
            "requestId": request_id,
            "extendedRequestId": request_id,
            "requestTime": request_time(now),
            "requestTimeEpoch": now.timestamp_millis(),
            "identity": {"sourceIp": request.source_ip, "userAgent": user_agent},
        },
        "body": body,
        "isBase64Encoded": base64,
    })
}

/// The ARN API Gateway gives a method in an authorizer's event: `.../<stage>/<METHOD>/<path>`, or
/// `.../<stage>/$connect` for the WebSocket's.
pub fn method_arn(stage: &str, method: &str, path: &str) -> String {
    let resource = if method == "$connect" { "$connect".to_owned() } else { format!("{method}{path}") };
    format!("arn:aws:execute-api:{}:{ACCOUNT_ID}:{API_ID}/{stage}/{resource}", crate::REGION)
}

/// The REQUEST authorizer's event for a method (or the WebSocket `$connect`): its headers and query.
pub fn authorizer_event(method_arn: &str, headers: &[(String, String)], query: Option<&str>) -> Value {
    let (query, multi_query) = query_parameters(query);
    let single: Map<String, Value> = headers.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
    json!({
        "type": "REQUEST",
        "methodArn": method_arn,
        "headers": single,
        "queryStringParameters": query,
        "multiValueQueryStringParameters": multi_query,
        "requestContext": {"accountId": ACCOUNT_ID, "apiId": API_ID},
    })
}

/// What a WebSocket event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebSocketEvent<'a> {
    Connect { headers: Vec<(String, String)> },
    Message { route_key: &'a str, body: &'a str, base64: bool },
    Disconnect { status_code: u16, reason: &'a str },
}

/// One connection's identity, as API Gateway keeps it.
#[derive(Debug, Clone)]
pub struct WebSocketConnection {
    pub connection_id: String,
    /// Epoch milliseconds.
    pub connected_at: i64,
    pub source_ip: String,
    pub user_agent: Option<String>,
    pub domain: String,
    pub stage: String,
    /// What the authorizer gave `$connect` (`principalId` and its context): API Gateway passes it in
    /// the request context of every event of the connection.
    pub authorizer: Option<Value>,
}

/// The route a message takes, by the API's route selection expression `$request.body.action`:
/// the action when a route has that key, `$default` otherwise. (The deployed API has no `$default`
/// route and answers such messages with a generic error; locally the connections function gets them,
/// so the client learns what is wrong.)
pub fn route_for_message(body: &str, routes: &[&'static str]) -> &'static str {
    let action = serde_json::from_str::<Value>(body).ok().and_then(|v| v.get("action")?.as_str().map(str::to_owned));
    routes.iter().find(|r| Some(**r) == action.as_deref()).copied().unwrap_or("$default")
}

/// The API Gateway WebSocket proxy event for the connections function.
pub fn websocket_event(connection: &WebSocketConnection, event: &WebSocketEvent<'_>) -> Value {
    let now = chrono::Utc::now();
    let request_id = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
    let (route_key, event_type) = match event {
        WebSocketEvent::Connect { .. } => ("$connect", "CONNECT"),
        WebSocketEvent::Message { route_key, .. } => (*route_key, "MESSAGE"),
        WebSocketEvent::Disconnect { .. } => ("$disconnect", "DISCONNECT"),
    };
    let mut context = json!({
        "routeKey": route_key,
        "eventType": event_type,
        "extendedRequestId": request_id,
        "requestTime": request_time(now),
        "messageDirection": "IN",
        "stage": connection.stage,
        "connectedAt": connection.connected_at,
        "requestTimeEpoch": now.timestamp_millis(),
        "identity": {"sourceIp": connection.source_ip, "userAgent": connection.user_agent},
        "requestId": request_id,
        "domainName": connection.domain,
        "connectionId": connection.connection_id,
        "apiId": API_ID,
    });
    let mut out = json!({"requestContext": {}, "isBase64Encoded": false});
    match event {
        WebSocketEvent::Connect { headers } => {
            let single: Map<String, Value> =
                headers.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
            let mut multi: BTreeMap<String, Vec<Value>> = BTreeMap::new();
            for (k, v) in headers {
                multi.entry(k.clone()).or_default().push(Value::String(v.clone()));
            }
            out["headers"] = Value::Object(single);
            out["multiValueHeaders"] = json!(multi);
        }
        WebSocketEvent::Message { body, base64, .. } => {
            context["messageId"] = json!(uuid::Uuid::new_v4().simple().to_string()[..16]);
            out["body"] = json!(body);
            out["isBase64Encoded"] = json!(base64);
        }
        WebSocketEvent::Disconnect { status_code, reason } => {
            context["disconnectStatusCode"] = json!(status_code);
            context["disconnectReason"] = json!(reason);
        }
    }
    if let Some(authorizer) = &connection.authorizer {
        context["authorizer"] = authorizer.clone();
    }
    out["requestContext"] = context;
    out
}

/// The EventBridge scheduled event the sweeper's schedule sends.
pub fn scheduled_event() -> Value {
    let now = chrono::Utc::now();
    json!({
        "version": "0",
        "id": uuid::Uuid::new_v4().to_string(),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT_ID,
        "time": now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "region": crate::REGION,
        "resources": [format!("arn:aws:events:{}:{ACCOUNT_ID}:rule/twopc-local-sweeper", crate::REGION)],
        "detail": {}
    })
}

/// An API Gateway proxy integration's answer (`{statusCode, headers, multiValueHeaders, body, isBase64Encoded}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl ProxyResponse {
    /// Reads the JSON a Lambda proxy integration returns.
    pub fn from_json(value: &Value) -> Result<ProxyResponse, String> {
        let status = value
            .get("statusCode")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok())
            .ok_or_else(|| format!("no statusCode in the function's answer: {value}"))?;
        let mut headers = Vec::new();
        if let Some(multi) = value.get("multiValueHeaders").and_then(Value::as_object) {
            for (name, values) in multi {
                for v in values.as_array().into_iter().flatten().filter_map(Value::as_str) {
                    headers.push((name.clone(), v.to_owned()));
                }
            }
        }
        if let Some(single) = value.get("headers").and_then(Value::as_object) {
            for (name, v) in single {
                if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
                    && let Some(v) = v.as_str()
                {
                    headers.push((name.clone(), v.to_owned()));
                }
            }
        }
        let body = match value.get("body").and_then(Value::as_str) {
            None => Vec::new(),
            Some(text) if value.get("isBase64Encoded").and_then(Value::as_bool) == Some(true) => {
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| format!("the function's body is not base64: {e}"))?
            }
            Some(text) => text.as_bytes().to_vec(),
        };
        Ok(ProxyResponse { status, headers, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_follow_the_template() {
        assert_eq!(rest_resource("POST", "/transactions"), Some(("/transactions", None)));
        assert_eq!(
            rest_resource("GET", "/transactions/tx%2D1"),
            Some(("/transactions/{id}", Some(json!({"id": "tx-1"}))))
        );
        assert_eq!(rest_resource("GET", "/transactions"), None);
        assert_eq!(
            rest_resource("POST", "/transactions/tx-1/commit"),
            Some(("/transactions/{id}/commit", Some(json!({"id": "tx-1"}))))
        );
        assert_eq!(
            rest_resource("POST", "/transactions/tx-1/abort"),
            Some(("/transactions/{id}/abort", Some(json!({"id": "tx-1"}))))
        );
        assert_eq!(rest_resource("GET", "/transactions/tx-1/commit"), None);
        assert_eq!(rest_resource("DELETE", "/transactions/x"), None);
        assert_eq!(rest_resource("GET", "/other"), None);
    }

    #[test]
    fn rest_events_parse_as_api_gateway_requests() {
        let request = HttpRequest {
            method: "POST",
            path: "/transactions",
            query: Some("a=1&a=2&b=x+y"),
            headers: vec![("content-type".into(), "application/json".into()), ("idempotency-key".into(), "k".into())],
            body: br#"{"participants": []}"#,
            source_ip: "127.0.0.1".into(),
        };
        let event = rest_proxy_event(&request, "/transactions", None, "local", "127.0.0.1:3000");
        assert_eq!(event["multiValueQueryStringParameters"]["a"], json!(["1", "2"]));
        assert_eq!(event["queryStringParameters"]["b"], "x y");
        let parsed = lambda_http::request::from_str(&event.to_string()).expect("lambda_http reads it");
        assert_eq!(parsed.method(), "POST");
        assert_eq!(parsed.headers()["idempotency-key"], "k");
        assert_eq!(parsed.body().as_ref(), br#"{"participants": []}"#);
    }

    #[test]
    fn websocket_events_parse_as_the_lambda_event() {
        use aws_lambda_events::apigw::ApiGatewayWebsocketProxyRequest;
        let connection = WebSocketConnection {
            connection_id: "abc=".into(),
            connected_at: 1,
            source_ip: "127.0.0.1".into(),
            user_agent: None,
            domain: "127.0.0.1:3001".into(),
            stage: "local".into(),
            authorizer: None,
        };
        let body = r#"{"action": "subscribe", "topics": ["tx:1"]}"#;
        let route = route_for_message(body, &["subscribe", "unsubscribe"]);
        assert_eq!(route, "subscribe");
        assert_eq!(route_for_message("nope", &["subscribe"]), "$default");
        for event in [
            WebSocketEvent::Connect { headers: vec![("host".into(), "x".into())] },
            WebSocketEvent::Message { route_key: route, body, base64: false },
            WebSocketEvent::Disconnect { status_code: 1000, reason: "bye" },
        ] {
            let json = websocket_event(&connection, &event);
            let parsed: ApiGatewayWebsocketProxyRequest = serde_json::from_value(json).expect("parses");
            assert_eq!(parsed.request_context.connection_id.as_deref(), Some("abc="));
        }
    }

    #[test]
    fn proxy_responses_read_back() {
        let r = ProxyResponse::from_json(&json!({"statusCode": 409, "headers": {"content-type": "application/json"}, "multiValueHeaders": {}, "body": "{}", "isBase64Encoded": false})).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (409, b"{}".as_slice()));
        assert_eq!(r.headers, vec![("content-type".to_owned(), "application/json".to_owned())]);
    }
}
