//! Connections: the WebSocket API's `$connect`, `$disconnect`, `subscribe` and `unsubscribe` routes
//! (Lambda proxy integration), kept in the connections table. The logic is in
//! `twopc_fanout::connections`; this maps the proxy event onto it and its answer back.

use std::time::SystemTime;

use aws_lambda_events::apigw::{ApiGatewayProxyResponse, ApiGatewayWebsocketProxyRequest};
use aws_lambda_events::encodings::Body;
use twopc::access::{Caller, Policy};
use twopc::config;
use twopc::record::TransactionStore;
use twopc_fanout::connections::{self, ConnectionRequest, ConnectionResponse, ConnectionStore};

/// The connections function: its table, and the one WebSocket API whose events it serves.
pub struct Connections {
    pub store: ConnectionStore,
    api_id: String,
}

impl Connections {
    pub fn new(store: ConnectionStore, api_id: impl Into<String>) -> Self {
        Connections { store, api_id: api_id.into() }
    }
}

/// `WEBSOCKET_API_ID` (required: the function serves one API), `CONNECTIONS_TABLE_NAME`,
/// `MAX_TOPICS_PER_CONNECTION` (default 50) and
/// `MAX_CONNECTIONS_PER_PRINCIPAL` (default 10; anything but a whole number of at least 1 is a
/// configuration error, so the function does not start), `ACCESS_POLICY`, and the transactions table
/// (`TRANSACTIONS_TABLE_NAME`), where a `tx:` topic's owner is read.
pub async fn from_env() -> Result<Connections, config::ConfigError> {
    let api_id = config::required(twopc_fanout::connections::WEBSOCKET_API_ID)?;
    if api_id.is_empty() {
        return Err(config::ConfigError::Missing(twopc_fanout::connections::WEBSOCKET_API_ID));
    }
    let table = config::or_default(
        twopc_fanout::connections::CONNECTIONS_TABLE_NAME,
        twopc_fanout::connections::DEFAULT_CONNECTIONS_TABLE,
    );
    let max_topics = config::positive_or_default(
        twopc_fanout::connections::MAX_TOPICS_PER_CONNECTION,
        twopc_fanout::connections::DEFAULT_MAX_TOPICS_PER_CONNECTION,
    )?;
    let max_connections = config::positive_or_default(
        twopc_fanout::connections::MAX_CONNECTIONS_PER_PRINCIPAL,
        twopc_fanout::connections::DEFAULT_MAX_CONNECTIONS_PER_PRINCIPAL,
    )?;
    let aws = config::aws().await;
    let transactions = TransactionStore::new(
        aws_sdk_dynamodb::Client::new(&aws),
        config::or_default(twopc::record::TRANSACTIONS_TABLE_NAME, twopc::record::DEFAULT_TRANSACTIONS_TABLE),
    );
    let store = ConnectionStore::from_config(&aws, table)
        .with_max_topics(max_topics)
        .with_max_connections_per_principal(max_connections)
        .with_access(Policy::from_env()?, Some(transactions));
    Ok(Connections::new(store, api_id))
}

/// The caller of a `$connect`: the JWT principal the authorizer established, else the IAM-signed
/// caller's ARN, else none (no authorization ran).
pub fn caller(store: &ConnectionStore, request: &ApiGatewayWebsocketProxyRequest) -> Caller {
    let context = &request.request_context;
    twopc::jwt::caller_of_request(store.access(), &context.authorizer.fields, context.identity.user_arn.as_deref())
}

/// The route and its message, from the proxy event.
pub fn parse(request: &ApiGatewayWebsocketProxyRequest) -> Result<ConnectionRequest, connections::BadRequest> {
    let route = request.request_context.route_key.as_deref().unwrap_or("$default");
    let body = connections::message_body(request.body.as_deref(), request.is_base64_encoded)?;
    connections::parse_request(route, body.as_deref())
}

fn to_api_gateway(response: ConnectionResponse) -> ApiGatewayProxyResponse {
    let mut out = ApiGatewayProxyResponse::default();
    out.status_code = i64::from(response.status_code);
    out.body = response.body.map(Body::Text);
    out
}

/// One WebSocket event: a malformed message is answered 400 with what is wrong, and changes nothing; an
/// event of another API than the function's own (`requestContext.apiId`) is answered 403 and changes
/// nothing (its `connectionId` is not one of this API's connections). Who may invoke the function (its
/// resource policy: this API only) is what keeps such events out; this is the second line.
pub async fn handle(function: &Connections, request: &ApiGatewayWebsocketProxyRequest) -> ApiGatewayProxyResponse {
    let connection_id = request.request_context.connection_id.as_deref();
    let api_id = request.request_context.apiid.as_deref();
    if api_id != Some(function.api_id.as_str()) {
        tracing::warn!(connection_id, api_id, expected = %function.api_id, "refused an event of another WebSocket API");
        let message = format!("this function serves WebSocket API {}, not {api_id:?}", function.api_id);
        return to_api_gateway(ConnectionResponse::error(403, "FORBIDDEN", &message));
    }
    let store = &function.store;
    let response = match parse(request) {
        Ok(parsed) => {
            connections::serve_as(store, connection_id, &parsed, SystemTime::now(), &caller(store, request)).await
        }
        Err(err) => {
            tracing::info!(connection_id, error = %err, "refused a WebSocket message");
            ConnectionResponse::error(400, err.code, &err.message)
        }
    };
    to_api_gateway(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use twopc_fanout::Topic;

    fn event(name: &str) -> ApiGatewayWebsocketProxyRequest {
        let text = std::fs::read(format!("{}/../../events/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        serde_json::from_slice(&text).unwrap()
    }

    #[test]
    fn sample_events_parse() {
        let connect = event("connections-connect.json");
        assert_eq!(connect.request_context.connection_id.as_deref(), Some("L0SM9cOFvHcCIhw="));
        assert_eq!(parse(&connect), Ok(ConnectionRequest::Connect));
        assert_eq!(parse(&event("connections-disconnect.json")), Ok(ConnectionRequest::Disconnect));
        assert_eq!(
            parse(&event("connections-subscribe.json")),
            Ok(ConnectionRequest::Subscribe(vec![
                Topic::entity("service-a-data", "A"),
                Topic::transaction("5d2f8e3a-1c7b-4e9a-8f60-2a4b9c1d0e77"),
            ]))
        );
        assert_eq!(
            parse(&event("connections-unsubscribe.json")),
            Ok(ConnectionRequest::Unsubscribe(vec![Topic::entity("service-a-data", "A")]))
        );
    }

    #[test]
    fn binary_frames_are_decoded_and_bad_ones_refused() {
        let mut request = event("connections-subscribe.json");
        request.body = Some("eyJhY3Rpb24iOiAic3Vic2NyaWJlIiwgInRvcGljcyI6IFsidHg6VDEiXX0=".into());
        request.is_base64_encoded = true;
        assert_eq!(parse(&request), Ok(ConnectionRequest::Subscribe(vec![Topic::transaction("T1")])));
        request.body = Some("{\"action\": \"subscribe\", \"topics\": [\"nope\"]}".into());
        request.is_base64_encoded = false;
        let err = parse(&request).unwrap_err();
        assert!(err.message.contains("topics[0]"), "{}", err.message);
    }

    #[test]
    fn responses_are_what_api_gateway_expects() {
        let ok = serde_json::to_value(to_api_gateway(ConnectionResponse { status_code: 200, body: None })).unwrap();
        assert_eq!(ok["statusCode"], 200);
        assert!(ok.get("body").is_none());
        let bad =
            serde_json::to_value(to_api_gateway(ConnectionResponse::error(400, "INVALID_REQUEST", "topics is empty")))
                .unwrap();
        assert_eq!(bad["statusCode"], 400);
        let body: serde_json::Value = serde_json::from_str(bad["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["error"]["message"], "topics is empty");
    }
}
