//! The REST API over HTTP: `POST /transactions` with an `Idempotency-Key` and retries that reuse it,
//! `GET /transactions/{id}`, a held transaction's `POST /transactions/{id}/commit` and `/abort`,
//! SigV4-signed when the API is IAM-authorized.

use std::time::{Duration, SystemTime};

use aws_credential_types::provider::ProvideCredentials;
use reqwest::{Method, Url};
use serde_json::Value;

use crate::sign::{Signer, sign_headers};
use crate::{Error, Outcome, Transaction};

/// Answers worth another attempt: the request did not run, or it ran under a key the server dedupes.
const RETRIED_STATUSES: [u16; 4] = [429, 502, 503, 504];

/// API Gateway stops an integration at 29 s; an attempt that has not answered a little after that
/// never will.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// How often and how patiently a call is tried again after a transport error, a timeout, or a 429,
/// 502, 503 or 504. Never after any other answer: a 400, 409 or 422 is the same however often asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts in all, the first included (1: no retry).
    pub attempts: u32,
    /// The wait before the second attempt; it doubles for each next one, up to `max_delay`. Each wait
    /// is drawn between half of it and all of it, so clients that failed together do not retry together.
    pub first_delay: Duration,
    pub max_delay: Duration,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry { attempts: 4, first_delay: Duration::from_millis(100), max_delay: Duration::from_secs(2) }
    }
}

impl Retry {
    /// One attempt only.
    pub fn none() -> Retry {
        Retry { attempts: 1, ..Retry::default() }
    }

    /// The wait after attempt `attempt` (1-based) failed.
    fn delay(&self, attempt: u32) -> Duration {
        let full = self.first_delay.saturating_mul(1 << (attempt - 1).min(16)).min(self.max_delay);
        let jitter = uuid::Uuid::new_v4().as_u128() as u64 % 1_000;
        full / 2 + full / 2 * jitter as u32 / 1_000
    }
}

/// A client of the REST API. Cheap to clone (the connection pool is shared).
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    signer: Option<Signer>,
    bearer: Option<String>,
    retry: Retry,
    respond_async: bool,
}

impl Client {
    /// A client of the API at `base_url`: `http://127.0.0.1:3000` (the local stack) or
    /// `https://{api-id}.execute-api.{region}.amazonaws.com/{stage}`.
    pub fn new(base_url: &str) -> Result<Client, Error> {
        let base = Url::parse(base_url).map_err(|e| Error::Url { url: base_url.to_owned(), message: e.to_string() })?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(Error::Url { url: base_url.to_owned(), message: "not an http(s) base URL".into() });
        }
        let mut http = reqwest::Client::builder().timeout(ATTEMPT_TIMEOUT);
        // A proxy from the environment cannot reach this machine's loopback.
        let loopback = match base.host_str() {
            Some("localhost") => true,
            Some(host) => host.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()),
            None => false,
        };
        if loopback {
            http = http.no_proxy();
        }
        let tls = if base.scheme() == "https" { crate::tls::config()? } else { crate::tls::config_or_none_trusted() };
        http = http.use_preconfigured_tls((*tls).clone());
        let http = http.build().map_err(Error::Transport)?;
        Ok(Client { http, base, signer: None, bearer: None, retry: Retry::default(), respond_async: false })
    }

    /// Signs every request with SigV4 for an IAM-authorized API in `region`, with credentials from
    /// `credentials` (a provider, or fixed `Credentials`).
    pub fn with_iam(self, region: impl Into<String>, credentials: impl ProvideCredentials + 'static) -> Client {
        self.with_signer(Signer::new(region, credentials))
    }

    /// Sends `Authorization: Bearer <token>` with every request, for an API deployed with a JWT issuer
    /// (`JwtIssuer`), or the local stack with `--auth jwt` (`twopc-local token --sub alice`).
    pub fn with_bearer(mut self, token: impl Into<String>) -> Client {
        self.bearer = Some(format!("Bearer {}", token.into()));
        self
    }

    pub fn with_signer(mut self, signer: Signer) -> Client {
        self.signer = Some(signer);
        self
    }

    /// Sends `Prefer: respond-async` with every `POST /transactions`: a commit is answered as soon as its
    /// decision is durable ([`Outcome::Pending`](crate::Outcome::Pending) with status `COMMITTING`, HTTP 202), its second phase after the
    /// answer. The outcome is final; the participants' items may not show it yet (docs/api.md).
    pub fn answering_on_decision(mut self) -> Client {
        self.respond_async = true;
        self
    }

    pub fn with_retry(mut self, retry: Retry) -> Client {
        self.retry = retry;
        self
    }

    /// Uses this HTTP client (its own timeouts, proxies, TLS settings); start from
    /// [`http_client_builder`](crate::http_client_builder) for this crate's TLS.
    pub fn with_http_client(mut self, http: reqwest::Client) -> Client {
        self.http = http;
        self
    }

    pub fn base_url(&self) -> &str {
        self.base.as_str()
    }

    /// `POST /transactions` under a fresh `Idempotency-Key`, retried under the same key: however many
    /// attempts reach the server, the transaction runs once.
    pub async fn submit(&self, transaction: &Transaction) -> Result<Outcome, Error> {
        self.submit_with_key(transaction, &uuid::Uuid::new_v4().to_string()).await
    }

    /// `POST /transactions` under the caller's `Idempotency-Key` (1 to 255 characters), for a caller
    /// that retries the same business operation across restarts: the same key and body always get the
    /// first execution's outcome. The same key with another body is [`Error::IdempotencyKeyReused`].
    pub async fn submit_with_key(&self, transaction: &Transaction, key: &str) -> Result<Outcome, Error> {
        let body = transaction.body_bytes();
        let (status, answer) =
            self.call(Method::POST, self.url(&["transactions"]), Some(&body), Some(key), None, self.retry).await?;
        Outcome::from_response(status, &answer)
    }

    /// `POST /transactions` again after a refusal for contention, under a fresh `Idempotency-Key`, with
    /// that answer's `ageToken` ([`TransactionState::age_token`](crate::TransactionState::age_token)): the
    /// retry keeps the first request's age, so it is never refused by a transaction younger than it. The
    /// same transaction and caller only, within its `timeoutMs` of the refusal, once: otherwise
    /// [`ErrorCode::InvalidAgeToken`](crate::ErrorCode::InvalidAgeToken) or `AgeTokenUsed`, nothing written.
    pub async fn submit_with_age(&self, transaction: &Transaction, age_token: &str) -> Result<Outcome, Error> {
        let body = transaction.body_bytes();
        let key = uuid::Uuid::new_v4().to_string();
        let url = self.url(&["transactions"]);
        let (status, answer) =
            self.call(Method::POST, url, Some(&body), Some(&key), Some(age_token), self.retry).await?;
        Outcome::from_response(status, &answer)
    }

    /// `POST /transactions` without a key, one attempt: the server's fastest path (no record before the
    /// decision), but a lost answer cannot be asked again, so nothing is retried.
    pub async fn submit_unkeyed(&self, transaction: &Transaction) -> Result<Outcome, Error> {
        let body = transaction.body_bytes();
        let (status, answer) =
            self.call(Method::POST, self.url(&["transactions"]), Some(&body), None, None, Retry::none()).await?;
        Outcome::from_response(status, &answer)
    }

    /// `GET /transactions/{id}`: the outcome so far; [`Error::NotFound`] for an unknown id.
    pub async fn get(&self, transaction_id: &str) -> Result<Outcome, Error> {
        let (status, answer) =
            self.call(Method::GET, self.url(&["transactions", transaction_id]), None, None, None, self.retry).await?;
        Outcome::from_response(status, &answer)
    }

    /// `POST /transactions/{id}/commit`: commits a held transaction ([`Transaction::hold`]) if its
    /// `holdUntil` has not passed. [`Outcome::Committed`], or [`Outcome::Pending`] (`COMMITTING`) while
    /// a participant has not acknowledged (the sweeper applies the rest); [`Outcome::Aborted`] when it
    /// was aborted first (by [`Client::abort`], or because its hold expired: then its `reason` says so).
    /// Idempotent, so retried like `submit`: a commit that won answers the same again.
    ///
    /// Errors: [`Error::NotFound`] for an unknown id or another principal's transaction,
    /// [`Error::NotHeld`] for a transaction that was not held, [`Error::Unavailable`] while it is still
    /// preparing (after the retries).
    pub async fn commit(&self, transaction_id: &str) -> Result<Outcome, Error> {
        self.decide(transaction_id, "commit").await
    }

    /// `POST /transactions/{id}/abort`: aborts a held transaction, releasing its locks; nothing is
    /// applied. [`Outcome::Aborted`] (also when it was aborted already, by an earlier abort or its
    /// hold's expiry), or [`Outcome::Committed`] or [`Outcome::Pending`] when a commit won first.
    /// Idempotent, so retried like `submit`. Errors as [`Client::commit`]'s (an abort before the hold is
    /// recorded aborts it).
    pub async fn abort(&self, transaction_id: &str) -> Result<Outcome, Error> {
        self.decide(transaction_id, "abort").await
    }

    async fn decide(&self, transaction_id: &str, decision: &str) -> Result<Outcome, Error> {
        let url = self.url(&["transactions", transaction_id, decision]);
        let (status, answer) = self.call(Method::POST, url, None, None, None, self.retry).await?;
        Outcome::from_response(status, &answer)
    }

    /// `GET /admin/transactions` (operators only): a page of open transactions, oldest due first, as the
    /// operator's view of each record (`{"transactions": [...], "next": <token or null>}`); pass the
    /// page's `next` back in `query.next` for the next.
    pub async fn admin_list(&self, query: &AdminQuery) -> Result<Value, Error> {
        let mut url = self.url(&["admin", "transactions"]);
        {
            let mut pairs = url.query_pairs_mut();
            if let Some(status) = &query.status {
                pairs.append_pair("status", status);
            }
            if let Some(age) = query.min_age_ms {
                pairs.append_pair("minAgeMs", &age.to_string());
            }
            if let Some(limit) = query.limit {
                pairs.append_pair("limit", &limit.to_string());
            }
            if let Some(next) = &query.next {
                pairs.append_pair("next", next);
            }
        }
        self.admin_call(Method::GET, url).await
    }

    /// `GET /admin/transactions/{id}` (operators only): the record with its chain, sweep count, last
    /// error, audit and the locks its keys hold.
    pub async fn admin_show(&self, transaction_id: &str) -> Result<Value, Error> {
        self.admin_call(Method::GET, self.url(&["admin", "transactions", transaction_id])).await
    }

    /// `GET /admin/stuck` (operators only): open transactions past their due time, and locks expired at
    /// least `lock_age_ms` ago (the server's default when None) whose owner has no record or ended.
    pub async fn admin_stuck(&self, lock_age_ms: Option<u64>) -> Result<Value, Error> {
        let mut url = self.url(&["admin", "stuck"]);
        if let Some(age) = lock_age_ms {
            url.query_pairs_mut().append_pair("lockAgeMs", &age.to_string());
        }
        self.admin_call(Method::GET, url).await
    }

    /// `GET /admin/outcomes` (operators only): the terminal outcomes announced in the last `since_ms`
    /// (the server's default, an hour, when None), oldest first, a page of at most `limit`
    /// (`{"outcomes": [...], "next": <token or null>, "fromMs"}`); pass the page's `next` back for the next.
    pub async fn admin_outcomes(
        &self,
        since_ms: Option<u64>,
        limit: Option<u32>,
        next: Option<&str>,
    ) -> Result<Value, Error> {
        let mut url = self.url(&["admin", "outcomes"]);
        {
            let mut pairs = url.query_pairs_mut();
            if let Some(since) = since_ms {
                pairs.append_pair("sinceMs", &since.to_string());
            }
            if let Some(limit) = limit {
                pairs.append_pair("limit", &limit.to_string());
            }
            if let Some(next) = next {
                pairs.append_pair("next", next);
            }
        }
        self.admin_call(Method::GET, url).await
    }

    /// `POST /admin/transactions/{id}/retry` (operators only): drives a decided transaction now; the
    /// record as it then is. An undecided one: [`Error::Status`] 409 `NOT_DECIDED`.
    pub async fn admin_retry(&self, transaction_id: &str) -> Result<Value, Error> {
        self.admin_call(Method::POST, self.url(&["admin", "transactions", transaction_id, "retry"])).await
    }

    /// `POST /admin/transactions/{id}/abort` (operators only): aborts an undecided transaction; the
    /// record as it then is, `ABORTED`, or `COMMITTING`/`COMMITTED` when its commit was decided first.
    pub async fn admin_abort(&self, transaction_id: &str) -> Result<Value, Error> {
        self.admin_call(Method::POST, self.url(&["admin", "transactions", transaction_id, "abort"])).await
    }

    /// An admin route's answer: a 200's body, or a 409's that is a record (an abort that lost to the
    /// commit); any other answer is the error it says. Retried as every call is (each action is idempotent).
    async fn admin_call(&self, method: Method, url: Url) -> Result<Value, Error> {
        let (status, body) = self.call(method, url, None, None, None, self.retry).await?;
        let value: Option<Value> = serde_json::from_slice(&body).ok();
        match value {
            Some(value) if status == 200 || (status == 409 && value.get("error").is_none()) => Ok(value),
            _ => Err(Error::from_status(status, &body)),
        }
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut().expect("checked to be a base in new").pop_if_empty().extend(segments);
        url
    }

    async fn call(
        &self,
        method: Method,
        url: Url,
        body: Option<&[u8]>,
        key: Option<&str>,
        age_token: Option<&str>,
        retry: Retry,
    ) -> Result<(u16, Vec<u8>), Error> {
        let mut attempt = 1;
        loop {
            let result = self.attempt(&method, &url, body, key, age_token).await;
            let again = match &result {
                Ok((status, _)) => RETRIED_STATUSES.contains(status),
                Err(Error::Transport(_)) => true,
                Err(_) => false,
            };
            if !again || attempt >= retry.attempts {
                return result;
            }
            tokio::time::sleep(retry.delay(attempt)).await;
            attempt += 1;
        }
    }

    async fn attempt(
        &self,
        method: &Method,
        url: &Url,
        body: Option<&[u8]>,
        key: Option<&str>,
        age_token: Option<&str>,
    ) -> Result<(u16, Vec<u8>), Error> {
        let mut headers: Vec<(&str, &str)> = Vec::new();
        // Every POST says JSON, a bodiless commit or abort included: the local stack refuses a POST of
        // any other type (415), so that a page of another origin cannot send one without a preflight.
        if body.is_some() || *method == Method::POST {
            headers.push(("content-type", "application/json"));
        }
        if let Some(key) = key {
            headers.push(("idempotency-key", key));
        }
        if let Some(token) = age_token {
            headers.push(("age-token", token));
        }
        if self.respond_async && *method == Method::POST && url.path().ends_with("/transactions") {
            headers.push(("prefer", "respond-async"));
        }
        if let Some(bearer) = &self.bearer {
            headers.push(("authorization", bearer));
        }
        let mut request = self.http.request(method.clone(), url.clone());
        for (name, value) in &headers {
            request = request.header(*name, *value);
        }
        // Signed per attempt: each carries its own time.
        if let Some(signer) = &self.signer {
            let credentials = signer.credentials().await?;
            let signed = sign_headers(
                method.as_str(),
                url.as_str(),
                &headers,
                body.unwrap_or_default(),
                signer.region(),
                &credentials,
                SystemTime::now(),
            )?;
            for (name, value) in signed {
                request = request.header(name, value);
            }
        }
        if let Some(body) = body {
            request = request.body(body.to_vec());
        }
        let response = request.send().await.map_err(Error::Transport)?;
        let status = response.status().as_u16();
        let answer = response.bytes().await.map_err(Error::Transport)?;
        Ok((status, answer.to_vec()))
    }
}

/// `GET /admin/transactions`' filters and page token ([`Client::admin_list`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminQuery {
    /// Only this open status: `PREPARING`, `PREPARED`, `COMMITTING` or `ABORTING`.
    pub status: Option<String>,
    /// Only those started at least this long ago.
    pub min_age_ms: Option<u64>,
    /// At most this many (1 to 100).
    pub limit: Option<u32>,
    /// The `next` of the page before.
    pub next: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_with_jitter_below_each() {
        let retry = Retry { attempts: 10, first_delay: Duration::from_millis(100), max_delay: Duration::from_secs(1) };
        for (attempt, full) in [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1000), (9, 1000)] {
            let delay = retry.delay(attempt);
            let full = Duration::from_millis(full);
            assert!(delay >= full / 2 && delay <= full, "attempt {attempt}: {delay:?}");
        }
    }

    #[test]
    fn urls_keep_the_stage_and_encode_the_id() {
        let client = Client::new("https://abc.execute-api.eu-west-1.amazonaws.com/prod").unwrap();
        assert_eq!(
            client.url(&["transactions"]).as_str(),
            "https://abc.execute-api.eu-west-1.amazonaws.com/prod/transactions"
        );
        let client = Client::new("http://127.0.0.1:3000/").unwrap();
        assert_eq!(client.url(&["transactions", "a/b c"]).as_str(), "http://127.0.0.1:3000/transactions/a%2Fb%20c");
        assert!(matches!(Client::new("ftp://x"), Err(Error::Url { .. })));
    }
}
