//! A stand-in for an HTTP payment API that authorizes, captures and voids, with idempotency keys kept
//! as real payment APIs keep them: the first request under a key is done and its answer stored; a
//! repeat with the same request gets the stored answer (header `Idempotent-Replayed: true`), a repeat
//! while the first is still being done gets 409 `idempotency_in_progress` (try again), a repeat with
//! another request 422 `idempotency_key_reused`.
//!
//! - `POST /v1/authorizations` `{"amount": <cents>, "currency", "card", "reference"}` → 201
//!   `{"id", "status": "authorized", ...}`, or 402 `card_declined` (the card [`DECLINED_CARD`], or an
//!   amount over [`CARD_LIMIT`]).
//! - `POST /v1/authorizations/{id}/capture` → 200 `{"status": "captured"}`; 409 `authorization_voided`.
//! - `POST /v1/authorizations/{id}/void` → 200 `{"status": "voided"}`; 409 `authorization_captured`;
//!   400 `authorization_already_voided` for a second void of one authorization (under another key: a
//!   repeat under the same key gets the first answer), as Stripe refuses to cancel a canceled PaymentIntent.
//! - `GET /v1/authorizations` → `{"authorizations": [...]}`, `GET /v1/authorizations/{id}`.
//!
//! Every POST needs an `Idempotency-Key` header. Faults are injected per endpoint ([`PaymentApi::inject`]):
//! a 500 before or after the effect, a request held before the API sees it (late in the network), an
//! answer held after the effect (a client that gives up first).

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};

use crate::Server;

/// The card that is always declined.
pub const DECLINED_CARD: &str = "4000000000000002";
/// Amounts (in cents) above this are declined.
pub const CARD_LIMIT: u64 = 1_000_000;

/// Which call a fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    Authorize,
    Capture,
    Void,
}

/// What a fault does to the call it strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentFault {
    /// 500, nothing done (the key stays free).
    Fail,
    /// Done (and stored under its key), then 500: the client does not learn it.
    FailAfter,
    /// Held this long before the API sees it: a request late in the network.
    Late(Duration),
    /// Done at once, answered this long after: a client with a shorter timeout gives up.
    SlowReply(Duration),
}

/// An authorization as the API keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Authorization {
    pub id: String,
    pub status: String,
    pub amount: u64,
    pub currency: String,
    pub card: String,
    pub reference: String,
}

#[derive(Debug, Clone)]
struct Rule {
    endpoint: Endpoint,
    fault: PaymentFault,
    /// Only requests whose idempotency key starts with this.
    key_prefix: Option<String>,
    /// Strikes this many more times (None: always, or by `per_mille`).
    remaining: Option<usize>,
    per_mille: Option<u64>,
}

/// One request the API answered or dropped, for tests.
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    pub endpoint: Endpoint,
    pub key: String,
    pub status: u16,
    pub replayed: bool,
}

enum Stored {
    InProgress { fingerprint: String },
    Done { fingerprint: String, status: u16, body: Value },
}

#[derive(Default)]
struct Inner {
    authorizations: BTreeMap<String, Authorization>,
    keys: BTreeMap<String, Stored>,
    rules: Vec<Rule>,
    calls: Vec<Call>,
    draws: u64,
    seed: u64,
    /// Requests being carried out (late ones included).
    in_flight: usize,
}

type Shared = Arc<Mutex<Inner>>;

/// The running API on 127.0.0.1. Stops when dropped.
pub struct PaymentApi {
    server: Server,
    shared: Shared,
}

impl PaymentApi {
    pub async fn start() -> io::Result<PaymentApi> {
        PaymentApi::start_on("127.0.0.1:0").await
    }

    pub async fn start_on(addr: &str) -> io::Result<PaymentApi> {
        let shared: Shared = Arc::default();
        let app = Router::new()
            .route("/v1/authorizations", axum::routing::post(authorize).get(list))
            .route("/v1/authorizations/{id}", axum::routing::get(one))
            .route("/v1/authorizations/{id}/capture", axum::routing::post(capture))
            .route("/v1/authorizations/{id}/void", axum::routing::post(void))
            .with_state(shared.clone());
        Ok(PaymentApi { server: Server::start(addr, app).await?, shared })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        self.server.url()
    }

    /// The next `times` calls of `endpoint` whose key starts with `key_prefix` (any key: "") get `fault`;
    /// `times` None: every one of them until [`PaymentApi::heal`].
    pub fn inject(&self, endpoint: Endpoint, fault: PaymentFault, key_prefix: &str, times: Option<usize>) {
        let key_prefix = Some(key_prefix.to_owned()).filter(|p| !p.is_empty());
        self.inner().rules.push(Rule { endpoint, fault, key_prefix, remaining: times, per_mille: None });
    }

    /// Each call of `endpoint` gets `fault` with this chance, drawn from `seed`, until [`PaymentApi::heal`].
    pub fn inject_random(&self, endpoint: Endpoint, fault: PaymentFault, per_mille: u64, seed: u64) {
        let mut inner = self.inner();
        inner.seed = seed;
        inner.rules.push(Rule { endpoint, fault, key_prefix: None, remaining: None, per_mille: Some(per_mille) });
    }

    /// No more faults (requests already held still land when their time comes).
    pub fn heal(&self) {
        self.inner().rules.clear();
    }

    pub fn authorizations(&self) -> Vec<Authorization> {
        self.inner().authorizations.values().cloned().collect()
    }

    /// Authorizations still holding money: authorized, neither captured nor voided.
    pub fn held(&self) -> Vec<Authorization> {
        self.authorizations().into_iter().filter(|a| a.status == "authorized").collect()
    }

    /// Waits until no request is being carried out (a late one lands or is answered), polling.
    pub async fn settle(&self) {
        while self.inner().in_flight > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        self.inner().calls.clone()
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.shared.lock().expect("not poisoned")
    }
}

impl Inner {
    fn fault(&mut self, endpoint: Endpoint, key: &str) -> Option<PaymentFault> {
        let mut draw = None;
        for rule in &mut self.rules {
            if rule.endpoint != endpoint || rule.key_prefix.as_deref().is_some_and(|p| !key.starts_with(p)) {
                continue;
            }
            if rule.remaining == Some(0) {
                continue;
            }
            if let Some(per_mille) = rule.per_mille {
                let value = *draw.get_or_insert_with(|| {
                    self.draws += 1;
                    let mut x = self.seed ^ self.draws.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    x ^= x >> 33;
                    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
                    x ^ (x >> 33)
                });
                if value % 1000 >= per_mille {
                    continue;
                }
            }
            if let Some(remaining) = &mut rule.remaining {
                *remaining -= 1;
            }
            return Some(rule.fault);
        }
        None
    }
}

fn error(status: StatusCode, code: &str, message: String) -> (StatusCode, Value) {
    (status, json!({"error": {"code": code, "message": message}}))
}

fn answer(status: StatusCode, body: Value, replayed: bool) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    if replayed {
        response.headers_mut().insert("idempotent-replayed", "true".parse().expect("a header value"));
    }
    response
}

/// Runs `effect` once per idempotency key, with the faults of `endpoint`, in a task of its own: a request
/// is carried out whether or not its client is still waiting (a client that gave up closes its
/// connection, which would otherwise cancel a late request).
async fn idempotent(
    shared: Shared,
    endpoint: Endpoint,
    headers: HeaderMap,
    fingerprint: String,
    effect: impl FnOnce(&mut Inner) -> (StatusCode, Value) + Send + 'static,
) -> Response {
    shared.lock().expect("not poisoned").in_flight += 1;
    let done = shared.clone();
    let carried = tokio::spawn(async move {
        let response = carry_out(shared, endpoint, headers, fingerprint, effect).await;
        done.lock().expect("not poisoned").in_flight -= 1;
        response
    });
    carried.await.unwrap_or_else(|e| {
        let (status, body) = error(StatusCode::INTERNAL_SERVER_ERROR, "api_error", format!("the request failed: {e}"));
        answer(status, body, false)
    })
}

async fn carry_out(
    shared: Shared,
    endpoint: Endpoint,
    headers: HeaderMap,
    fingerprint: String,
    effect: impl FnOnce(&mut Inner) -> (StatusCode, Value),
) -> Response {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_owned) else {
        let (status, body) =
            error(StatusCode::BAD_REQUEST, "idempotency_key_missing", "an Idempotency-Key header is required".into());
        return answer(status, body, false);
    };
    let fault = shared.lock().expect("not poisoned").fault(endpoint, &key);
    if let Some(PaymentFault::Late(delay)) = fault {
        tokio::time::sleep(delay).await;
    }
    let log = |inner: &mut Inner, status: StatusCode, replayed: bool| {
        inner.calls.push(Call { endpoint, key: key.clone(), status: status.as_u16(), replayed });
    };
    if fault == Some(PaymentFault::Fail) {
        let mut inner = shared.lock().expect("not poisoned");
        log(&mut inner, StatusCode::INTERNAL_SERVER_ERROR, false);
        let (status, body) = error(StatusCode::INTERNAL_SERVER_ERROR, "api_error", "an injected failure".into());
        return answer(status, body, false);
    }
    let (status, body, replayed) = {
        let mut inner = shared.lock().expect("not poisoned");
        let stored = match inner.keys.get(&key) {
            None => None,
            Some(Stored::Done { fingerprint: f, status, body }) => {
                Some((*f == fingerprint, Some((*status, body.clone()))))
            }
            Some(Stored::InProgress { fingerprint: f }) => Some((*f == fingerprint, None)),
        };
        match stored {
            Some((true, Some((status, body)))) => {
                let status = StatusCode::from_u16(status).expect("a stored status");
                log(&mut inner, status, true);
                (status, body, true)
            }
            Some((false, _)) => {
                let (status, body) = error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency_key_reused",
                    format!("key {key} was used for another request"),
                );
                log(&mut inner, status, false);
                (status, body, false)
            }
            Some((true, None)) => {
                let (status, body) = error(
                    StatusCode::CONFLICT,
                    "idempotency_in_progress",
                    format!("a request with key {key} is in progress"),
                );
                log(&mut inner, status, false);
                (status, body, false)
            }
            None => {
                inner.keys.insert(key.clone(), Stored::InProgress { fingerprint: fingerprint.clone() });
                let (status, body) = effect(&mut inner);
                inner
                    .keys
                    .insert(key.clone(), Stored::Done { fingerprint, status: status.as_u16(), body: body.clone() });
                log(&mut inner, status, false);
                (status, body, false)
            }
        }
    };
    match fault {
        Some(PaymentFault::FailAfter) => {
            let (status, body) =
                error(StatusCode::INTERNAL_SERVER_ERROR, "api_error", "an injected failure after the effect".into());
            answer(status, body, false)
        }
        Some(PaymentFault::SlowReply(delay)) => {
            tokio::time::sleep(delay).await;
            answer(status, body, replayed)
        }
        _ => answer(status, body, replayed),
    }
}

async fn authorize(State(shared): State<Shared>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(Value::Object(request)) => Value::Object(request),
        _ => {
            let (status, body) =
                error(StatusCode::BAD_REQUEST, "invalid_request", "the body is not a JSON object".into());
            return answer(status, body, false);
        }
    };
    let fingerprint = format!("authorize {request}");
    idempotent(shared, Endpoint::Authorize, headers, fingerprint, move |inner| {
        let amount = request["amount"].as_u64().filter(|a| *a > 0);
        let card = request["card"].as_str().filter(|c| !c.is_empty());
        let (Some(amount), Some(card)) = (amount, card) else {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "amount (cents, > 0) and card are required".into(),
            );
        };
        if card == DECLINED_CARD || amount > CARD_LIMIT {
            return error(
                StatusCode::PAYMENT_REQUIRED,
                "card_declined",
                format!("the card ending {} was declined", &card[card.len().saturating_sub(4)..]),
            );
        }
        let id = format!("auth_{}", inner.authorizations.len() + 1);
        let authorization = Authorization {
            id: id.clone(),
            status: "authorized".into(),
            amount,
            currency: request["currency"].as_str().unwrap_or("EUR").to_owned(),
            card: card.to_owned(),
            reference: request["reference"].as_str().unwrap_or_default().to_owned(),
        };
        inner.authorizations.insert(id, authorization.clone());
        (StatusCode::CREATED, serde_json::to_value(authorization).expect("serializes"))
    })
    .await
}

async fn settle(shared: Shared, endpoint: Endpoint, id: String, headers: HeaderMap) -> Response {
    let fingerprint = format!("{endpoint:?} {id}");
    idempotent(shared, endpoint, headers, fingerprint, move |inner| {
        let Some(authorization) = inner.authorizations.get_mut(&id) else {
            return error(StatusCode::NOT_FOUND, "not_found", format!("no authorization {id}"));
        };
        let (wanted, other) = match endpoint {
            Endpoint::Capture => ("captured", "voided"),
            _ => ("voided", "captured"),
        };
        if authorization.status == other {
            return error(StatusCode::CONFLICT, &format!("authorization_{other}"), format!("{id} is {other}"));
        }
        // A void is done once: a second one (under another key) is refused, as real payment APIs refuse
        // to cancel what is canceled already (Stripe: 400). A repeat under the same key is answered above.
        if endpoint == Endpoint::Void && authorization.status == "voided" {
            return error(StatusCode::BAD_REQUEST, "authorization_already_voided", format!("{id} is voided already"));
        }
        authorization.status = wanted.into();
        (StatusCode::OK, serde_json::to_value(&*authorization).expect("serializes"))
    })
    .await
}

async fn capture(State(shared): State<Shared>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    settle(shared, Endpoint::Capture, id, headers).await
}

async fn void(State(shared): State<Shared>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    settle(shared, Endpoint::Void, id, headers).await
}

async fn list(State(shared): State<Shared>) -> Response {
    let inner = shared.lock().expect("not poisoned");
    axum::Json(json!({"authorizations": inner.authorizations.values().collect::<Vec<_>>()})).into_response()
}

async fn one(State(shared): State<Shared>, Path(id): Path<String>) -> Response {
    let inner = shared.lock().expect("not poisoned");
    match inner.authorizations.get(&id) {
        Some(authorization) => axum::Json(authorization).into_response(),
        None => {
            let (status, body) = error(StatusCode::NOT_FOUND, "not_found", format!("no authorization {id}"));
            answer(status, body, false)
        }
    }
}
