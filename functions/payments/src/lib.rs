//! The payments service: a resource participant. Its operation charges a card through an HTTP payment
//! API that authorizes, captures and voids with idempotency keys (the local stack runs a stand-in,
//! `local_services::payments`; deployed, the API's URL is the `PAYMENT_API_URL` setting):
//!
//! - `{"op": "charge", "key": {"entityId": "order-7"}, "card": "4242424242424242", "amount": 1500}`
//!   (`amount` in cents, `currency` optional, EUR by default): the try authorizes the amount, the
//!   confirm captures it, the cancel voids it. A declined card refuses the transaction (`RULE`, service
//!   code `CARD_DECLINED`), nothing held.
//!
//! The participant library keeps the barrier and the keys: each request carries the idempotency key of
//! its transaction and phase (one per charge: `<key>:<index>`), so a request whose answer was lost is
//! sent again and the API answers it with its stored first answer.

use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use twopc::model::Operation;
use twopc::participant::{
    FieldSchema, FieldType, OperationRefusal, OperationSchema, Refusal, Resource, ResourceCall, ResourceError,
};

pub const SERVICE: &str = "payments";
pub const TABLE: &str = "payments-data";

/// How long one request to the payment API may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Card payments through the payment API at `api`.
#[derive(Debug, Clone)]
pub struct Payments {
    api: String,
    http: reqwest::Client,
}

/// What one request came to.
enum Answer {
    Ok(Value),
    /// The API said no, for good (4xx other than a key in progress): the code and message.
    No(u16, String, String),
}

impl Payments {
    pub fn new(api: &str) -> Payments {
        let http = twopc::https::client_builder().timeout(REQUEST_TIMEOUT).build().expect("an HTTP client builds");
        Payments { api: api.trim_end_matches('/').to_owned(), http }
    }

    /// One POST under `key`: its JSON answer, a definite no, or `Failed` (no answer, a 5xx, a key still
    /// in progress: the same request may be sent again).
    async fn post(
        &self,
        path: &str,
        key: &str,
        body: &Value,
        time_left: Option<Duration>,
    ) -> Result<Answer, ResourceError> {
        let mut request = self.http.post(format!("{}{path}", self.api)).header("idempotency-key", key).json(body);
        if let Some(left) = time_left {
            request = request.timeout(REQUEST_TIMEOUT.min(left));
        }
        let response = request.send().await.map_err(|e| ResourceError::Failed(format!("POST {path}: {e}")))?;
        let status = response.status().as_u16();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        let code = answer.pointer("/error/code").and_then(Value::as_str).unwrap_or("").to_owned();
        let message = answer.pointer("/error/message").and_then(Value::as_str).unwrap_or("").to_owned();
        match status {
            200..=299 => Ok(Answer::Ok(answer)),
            409 if code == "idempotency_in_progress" => Err(ResourceError::Failed(format!("POST {path}: {message}"))),
            400..=499 => Ok(Answer::No(status, code, message)),
            _ => Err(ResourceError::Failed(format!("POST {path}: HTTP {status} {code} {message}"))),
        }
    }

    /// The authorization ids a try's answer holds.
    fn authorizations(tried: &Value) -> Vec<String> {
        tried["authorizations"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
    }

    /// Voids each of `ids` (`key` with the index), for a try that must hold nothing.
    async fn void_all(&self, ids: &[String], key: &str) -> Result<(), ResourceError> {
        for (i, id) in ids.iter().enumerate() {
            match self.post(&format!("/v1/authorizations/{id}/void"), &format!("{key}:{i}"), &json!({}), None).await? {
                Answer::Ok(_) => {}
                Answer::No(status, code, message) => {
                    return Err(ResourceError::Failed(format!("void {id}: HTTP {status} {code} {message}")));
                }
            }
        }
        Ok(())
    }
}

fn charge_schema() -> OperationSchema {
    let field = |kind, required, minimum: Option<i64>, description: &str| FieldSchema {
        kind,
        required,
        minimum: minimum.map(Into::into),
        maximum: None,
        description: description.into(),
    };
    OperationSchema {
        op: "charge".into(),
        description: "charge a card: authorized at prepare, captured at commit, voided at abort".into(),
        fields: [
            ("card".to_owned(), field(FieldType::String, true, None, "the card number")),
            ("amount".to_owned(), field(FieldType::Integer, true, Some(1), "in cents")),
            ("currency".to_owned(), field(FieldType::String, false, None, "ISO 4217, EUR by default")),
        ]
        .into(),
        resource: true,
    }
}

impl Resource for Payments {
    fn schemas(&self) -> Vec<OperationSchema> {
        vec![charge_schema()]
    }

    fn try_reserve<'a>(&'a self, call: &'a ResourceCall<'a>) -> BoxFuture<'a, Result<Value, ResourceError>> {
        Box::pin(async move {
            let mut held = Vec::new();
            for (i, operation) in call.operations.iter().enumerate() {
                let Operation::Custom { kind, fields, .. } = operation else {
                    return Err(ResourceError::Refused(OperationRefusal::Invalid("payments only charges".into())));
                };
                if kind != "charge" {
                    return Err(ResourceError::Refused(OperationRefusal::Invalid(format!(
                        "payments has no \"{kind}\""
                    ))));
                }
                let reference = operation.key().get("entityId").and_then(Value::as_str).unwrap_or_default();
                let body = json!({
                    "amount": fields["amount"],
                    "currency": fields.get("currency").cloned().unwrap_or(json!("EUR")),
                    "card": fields["card"],
                    "reference": reference,
                });
                let key = format!("{}:{i}", call.idempotency_key);
                match self.post("/v1/authorizations", &key, &body, call.time_left).await? {
                    Answer::Ok(authorization) => {
                        held.push(authorization["id"].as_str().unwrap_or_default().to_owned());
                    }
                    Answer::No(status, code, message) => {
                        // A refusal holds nothing: what this try authorized before is voided first.
                        self.void_all(&held, &format!("{}:undo", call.idempotency_key)).await?;
                        let refusal = if status == 402 {
                            OperationRefusal::Rule(Refusal::new(
                                "CARD_DECLINED",
                                format!("charge {reference}: {message}"),
                            ))
                        } else {
                            OperationRefusal::Invalid(format!("charge {reference}: HTTP {status} {code} {message}"))
                        };
                        return Err(ResourceError::Refused(refusal));
                    }
                }
            }
            Ok(json!({"authorizations": held}))
        })
    }

    fn confirm<'a>(&'a self, call: &'a ResourceCall<'a>, tried: &'a Value) -> BoxFuture<'a, Result<(), ResourceError>> {
        Box::pin(async move {
            for (i, id) in Self::authorizations(tried).iter().enumerate() {
                let key = format!("{}:{i}", call.idempotency_key);
                match self.post(&format!("/v1/authorizations/{id}/capture"), &key, &json!({}), None).await? {
                    Answer::Ok(_) => {}
                    Answer::No(status, code, message) => {
                        return Err(ResourceError::Failed(format!("capture {id}: HTTP {status} {code} {message}")));
                    }
                }
            }
            Ok(())
        })
    }

    fn cancel<'a>(&'a self, call: &'a ResourceCall<'a>, tried: &'a Value) -> BoxFuture<'a, Result<(), ResourceError>> {
        Box::pin(async move { self.void_all(&Self::authorizations(tried), &call.idempotency_key).await })
    }
}

/// `{"op": "charge", ...}` of `amount` cents on `card`, for the payment `reference`.
pub fn charge(reference: &str, card: &str, amount: u64) -> Value {
    json!({"op": "charge", "key": {"entityId": reference}, "card": card, "amount": amount})
}

/// What the coordinator's `SERVICE_OPERATIONS` holds for this service.
pub fn catalog() -> twopc::custom::Catalog {
    twopc::custom::Catalog::new(vec![charge_schema()]).expect("the payments' schemas are valid")
}
