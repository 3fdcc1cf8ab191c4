//! Faults at the DynamoDB client: the real `aws-sdk-dynamodb` client, configured as the functions are
//! deployed (standard retry mode, 3 attempts), over an HTTP client that wraps the SDK's own and can,
//! for the requests a [`Rule`] picks, lose DynamoDB's reply after the write took effect, drop the
//! connection, throttle without forwarding, or answer late.
//!
//! The SDK's retries go through the same HTTP client, so a rule sees each attempt: a reply lost once
//! is followed by the SDK's retry of the very same request, whose condition then meets the first
//! attempt's write, exactly as against the real service.
//!
//! ```ignore
//! let faults = DynamoFaults::new(seed);
//! let env = TestEnv::with_dynamo_faults(&["service-a", "service-b"], faults.clone()).await;
//! faults.add(Rule::new(DynamoFault::LoseReply).operation("PutItem").table(env.transactions.table()).nth(1));
//! // ... drive a transfer; then:
//! assert_eq!(faults.fired(), 1);
//! ```

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::{RetryConfig, RetryPartition};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;

/// What happens to a request a rule picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DynamoFault {
    /// Forwarded (the write takes effect), then answered 500 InternalServerError: the reply is lost.
    LoseReply,
    /// Forwarded (the write takes effect), then the connection fails: the SDK sees an IO error.
    DropConnection,
    /// Answered 400 ThrottlingException without forwarding: DynamoDB refused it, certainly not applied.
    Throttle,
    /// Forwarded, and DynamoDB's real answer returned only after this delay.
    Late(Duration),
    /// Answered 400 ValidationException (an item over 400 KB) without forwarding: refused as invalid, as a
    /// write that would make its item too large is, every time it is sent.
    Invalid,
    /// Answered 400 without forwarding, as DynamoDB answers a write that met another transaction on its
    /// items: `TransactionCanceledException` with every reason `TransactionConflict` for a
    /// `TransactWriteItems`, `TransactionConflictException` for a write of one item.
    Conflict,
}

impl DynamoFault {
    /// Whether the request reaches DynamoDB under this fault.
    pub fn forwards(self) -> bool {
        !matches!(self, DynamoFault::Throttle | DynamoFault::Invalid | DynamoFault::Conflict)
    }

    /// A short name for reports: `lose-reply`, `drop-connection`, `throttle`, `late`.
    pub fn name(self) -> &'static str {
        match self {
            DynamoFault::LoseReply => "lose-reply",
            DynamoFault::DropConnection => "drop-connection",
            DynamoFault::Throttle => "throttle",
            DynamoFault::Late(_) => "late",
            DynamoFault::Invalid => "invalid",
            DynamoFault::Conflict => "conflict",
        }
    }
}

/// The message of every injected answer, so a test can tell it from DynamoDB's own words.
pub const INJECTED_THROTTLING_MESSAGE: &str = "Rate of requests exceeds the allowed throughput (injected)";
pub const INJECTED_INTERNAL_MESSAGE: &str = "The server encountered an internal error (injected)";
pub const INJECTED_RESET_MESSAGE: &str = "connection reset after the request was sent (injected)";
pub const INJECTED_INVALID_MESSAGE: &str = "Item size has exceeded the maximum allowed size (injected)";
pub const INJECTED_CONFLICT_MESSAGE: &str = "Transaction is ongoing for the item (injected)";

/// Which requests get a fault. Every filter set must match; then `skip`, `times` and the chance decide.
#[derive(Debug, Clone)]
pub struct Rule {
    fault: DynamoFault,
    operation: Option<String>,
    table: Option<String>,
    body_contains: Option<String>,
    skip: u64,
    times: Option<u64>,
    per_mille: Option<u64>,
    sticky: bool,
    matched: u64,
    fired: u64,
    struck: HashSet<u64>,
}

impl Rule {
    /// A rule that gives `fault` to every request (narrow it with the other methods).
    pub fn new(fault: DynamoFault) -> Rule {
        Rule {
            fault,
            operation: None,
            table: None,
            body_contains: None,
            skip: 0,
            times: None,
            per_mille: None,
            sticky: false,
            matched: 0,
            fired: 0,
            struck: HashSet::new(),
        }
    }

    /// Only this DynamoDB operation: `PutItem`, `UpdateItem`, `TransactWriteItems`, `GetItem`, ...
    /// (the `x-amz-target` header, `DynamoDB_20120810.PutItem`, with or without its prefix).
    pub fn operation(mut self, operation: &str) -> Rule {
        self.operation = Some(operation.rsplit('.').next().unwrap_or(operation).to_owned());
        self
    }

    /// Only requests that name this table (`TableName`, in any item of a `TransactWriteItems`, or as a
    /// key of `RequestItems`).
    pub fn table(mut self, table: &str) -> Rule {
        self.table = Some(table.to_owned());
        self
    }

    /// Only requests whose JSON body contains this text (a status value such as `"COMMITTING"`).
    pub fn body_contains(mut self, text: &str) -> Rule {
        self.body_contains = Some(text.to_owned());
        self
    }

    /// Only the `n`th matching request (1-based), once: `skip(n - 1).times(1)`.
    pub fn nth(self, n: u64) -> Rule {
        assert!(n >= 1, "nth counts from 1");
        self.skip(n - 1).times(1)
    }

    /// Let the first `n` matching requests through.
    pub fn skip(mut self, n: u64) -> Rule {
        self.skip = n;
        self
    }

    /// Fire at most `n` times in all.
    pub fn times(mut self, n: u64) -> Rule {
        self.times = Some(n);
        self
    }

    /// Fire on a matching request with this chance in a thousand, drawn from the faults' seed.
    pub fn per_mille(mut self, chance: u64) -> Rule {
        self.per_mille = Some(chance);
        self
    }

    /// Once fired on a request, fire on every later request with the same body too: the SDK's retries of
    /// it, and a caller's own retries of the same write (regardless of `times` and the chance).
    pub fn sticky(mut self) -> Rule {
        self.sticky = true;
        self
    }

    fn matches(&self, request: &Seen, body: &str) -> bool {
        self.operation.as_ref().is_none_or(|op| *op == request.operation)
            && self.table.as_ref().is_none_or(|t| request.tables.contains(t))
            && self.body_contains.as_ref().is_none_or(|text| body.contains(text.as_str()))
    }
}

/// One request the client sent (each SDK attempt is one), and what was done to it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub operation: String,
    pub tables: Vec<String>,
    /// The fault given to it (None: passed through untouched).
    pub fault: Option<DynamoFault>,
}

impl Seen {
    /// Whether DynamoDB received it.
    pub fn forwarded(&self) -> bool {
        self.fault.is_none_or(DynamoFault::forwards)
    }
}

#[derive(Debug, Default)]
struct State {
    rules: Vec<Rule>,
    rng: u64,
    seen: Vec<Seen>,
}

/// The rules of one faulty client (cheap to clone: every clone is the same set).
#[derive(Debug, Clone, Default)]
pub struct DynamoFaults {
    state: Arc<Mutex<State>>,
}

impl DynamoFaults {
    /// No rules yet; `seed` drives every [`Rule::per_mille`] draw.
    pub fn new(seed: u64) -> DynamoFaults {
        DynamoFaults { state: Arc::new(Mutex::new(State { rng: seed, ..State::default() })) }
    }

    /// Adds a rule; rules are tried in the order they were added, and the first that fires wins.
    pub fn add(&self, rule: Rule) {
        self.state.lock().unwrap().rules.push(rule);
    }

    /// Removes every rule: from now on every request passes untouched ("faults stop").
    pub fn clear(&self) {
        self.state.lock().unwrap().rules.clear();
    }

    /// Every request sent so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// How many requests got a fault.
    pub fn fired(&self) -> usize {
        self.state.lock().unwrap().seen.iter().filter(|s| s.fault.is_some()).count()
    }

    /// How many requests of `operation` reached DynamoDB.
    pub fn forwarded(&self, operation: &str) -> usize {
        self.state.lock().unwrap().seen.iter().filter(|s| s.operation == operation && s.forwarded()).count()
    }

    /// How many requests of `operation` were sent (forwarded or not).
    pub fn sent(&self, operation: &str) -> usize {
        self.state.lock().unwrap().seen.iter().filter(|s| s.operation == operation).count()
    }

    /// Forgets the requests seen so far (the rules stay).
    pub fn forget(&self) {
        self.state.lock().unwrap().seen.clear();
    }

    /// The fault for one request, and a note of it.
    fn decide(&self, operation: &str, body: &[u8]) -> Option<DynamoFault> {
        let body = String::from_utf8_lossy(body);
        let mut seen = Seen { operation: operation.to_owned(), tables: tables_named(&body), fault: None };
        let mut state = self.state.lock().unwrap();
        let State { rules, rng, .. } = &mut *state;
        let digest = {
            let mut hasher = DefaultHasher::new();
            operation.hash(&mut hasher);
            body.hash(&mut hasher);
            hasher.finish()
        };
        for rule in rules.iter_mut() {
            if !rule.matches(&seen, &body) {
                continue;
            }
            rule.matched += 1;
            let again = rule.sticky && rule.struck.contains(&digest);
            let fires = again
                || (rule.matched > rule.skip
                    && rule.times.is_none_or(|t| rule.fired < t)
                    && rule.per_mille.is_none_or(|chance| split_mix(rng) % 1000 < chance));
            if fires {
                rule.fired += 1;
                if rule.sticky {
                    rule.struck.insert(digest);
                }
                seen.fault = Some(rule.fault);
                break;
            }
        }
        let fault = seen.fault;
        state.seen.push(seen);
        fault
    }
}

/// SplitMix64: one step of the seeded generator.
fn split_mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Every table a DynamoDB JSON request names: `"TableName":"..."` anywhere (single-item operations and
/// each item of a transaction), and the keys of `RequestItems` (batch operations).
fn tables_named(body: &str) -> Vec<String> {
    let mut tables: Vec<String> = vec![];
    let mut rest = body;
    while let Some(at) = rest.find("\"TableName\":\"") {
        rest = &rest[at + "\"TableName\":\"".len()..];
        let end = rest.find('"').unwrap_or(rest.len());
        if !tables.iter().any(|t| t == &rest[..end]) {
            tables.push(rest[..end].to_owned());
        }
    }
    if body.contains("\"RequestItems\"")
        && let Ok(serde_json::Value::Object(json)) = serde_json::from_str::<serde_json::Value>(body)
        && let Some(serde_json::Value::Object(items)) = json.get("RequestItems")
    {
        tables.extend(items.keys().filter(|k| !tables.contains(k)).cloned().collect::<Vec<_>>());
    }
    tables
}

/// The SDK's HTTP client, wrapped: each connector it hands out consults the rules.
#[derive(Debug)]
struct FaultyHttpClient {
    inner: SharedHttpClient,
    faults: DynamoFaults,
}

impl HttpClient for FaultyHttpClient {
    fn http_connector(&self, settings: &HttpConnectorSettings, components: &RuntimeComponents) -> SharedHttpConnector {
        SharedHttpConnector::new(FaultyConnector {
            inner: self.inner.http_connector(settings, components),
            faults: self.faults.clone(),
        })
    }
}

#[derive(Debug)]
struct FaultyConnector {
    inner: SharedHttpConnector,
    faults: DynamoFaults,
}

impl HttpConnector for FaultyConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let target = request.headers().get("x-amz-target").unwrap_or_default();
        let operation = target.rsplit('.').next().unwrap_or_default().to_owned();
        let body = request.body().bytes().unwrap_or_default();
        let fault = self.faults.decide(&operation, body);
        let writes = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|b| b["TransactItems"].as_array().map(Vec::len));
        let inner = self.inner.clone();
        HttpConnectorFuture::new(async move {
            match fault {
                None => inner.call(request).await,
                Some(DynamoFault::Throttle) => Ok(error_response(
                    400,
                    "com.amazonaws.dynamodb.v20120810#ThrottlingException",
                    INJECTED_THROTTLING_MESSAGE,
                )),
                Some(DynamoFault::LoseReply) => {
                    // The write is done once DynamoDB answers; only its answer is replaced.
                    let _ = inner.call(request).await?;
                    Ok(error_response(
                        500,
                        "com.amazonaws.dynamodb.v20120810#InternalServerError",
                        INJECTED_INTERNAL_MESSAGE,
                    ))
                }
                Some(DynamoFault::DropConnection) => {
                    let _ = inner.call(request).await?;
                    let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, INJECTED_RESET_MESSAGE);
                    Err(ConnectorError::io(Box::new(reset)))
                }
                Some(DynamoFault::Invalid) => {
                    Ok(error_response(400, "com.amazon.coral.validate#ValidationException", INJECTED_INVALID_MESSAGE))
                }
                Some(DynamoFault::Conflict) => Ok(match writes {
                    Some(writes) => {
                        let reason =
                            serde_json::json!({"Code": "TransactionConflict", "Message": INJECTED_CONFLICT_MESSAGE});
                        let body = serde_json::json!({
                            "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
                            "message": format!("Transaction cancelled, please refer cancellation reasons for specific reasons [{}]", vec!["TransactionConflict"; writes].join(", ")),
                            "CancellationReasons": vec![reason; writes],
                        });
                        json_response(400, body)
                    }
                    None => error_response(
                        400,
                        "com.amazonaws.dynamodb.v20120810#TransactionConflictException",
                        INJECTED_CONFLICT_MESSAGE,
                    ),
                }),
                Some(DynamoFault::Late(delay)) => {
                    let answer = inner.call(request).await;
                    tokio::time::sleep(delay).await;
                    answer
                }
            }
        })
    }
}

/// A DynamoDB JSON error answer, as the service sends it.
fn error_response(status: u16, error_type: &str, message: &str) -> HttpResponse {
    json_response(status, serde_json::json!({"__type": error_type, "message": message}))
}

fn json_response(status: u16, body: serde_json::Value) -> HttpResponse {
    let body = body.to_string();
    let mut response = HttpResponse::new(StatusCode::try_from(status).expect("a valid status"), SdkBody::from(body));
    response.headers_mut().insert("content-type", "application/x-amz-json-1.0");
    response.headers_mut().insert("x-amzn-requestid", uuid::Uuid::new_v4().to_string());
    response
}

/// A DynamoDB client for the test binary's DynamoDB Local, configured as the functions are deployed
/// (`aws_config::load_defaults` gives standard retry mode with 3 attempts), whose requests go through
/// `faults`. Each client gets a retry partition of its own, as each Lambda process has: one test's
/// injected errors never drain another's retry quota.
pub fn faulty_client(faults: &DynamoFaults) -> Client {
    static CLIENTS: AtomicU64 = AtomicU64::new(0);
    let endpoint = dynamodb_local::shared().endpoint().to_owned();
    let http = FaultyHttpClient { inner: aws_smithy_http_client::Builder::new().build_http(), faults: faults.clone() };
    let partition = format!("dynamodb-faults-{}", CLIENTS.fetch_add(1, Ordering::SeqCst));
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new("local", "local", None, None, "tests"))
        .endpoint_url(endpoint)
        .retry_config(RetryConfig::standard())
        .retry_partition(RetryPartition::new(partition))
        .http_client(http)
        .build();
    Client::from_conf(config)
}
