//! SigV4 for an IAM-authorized API (service `execute-api`), through `aws-sigv4`: headers for the REST
//! API, a presigned URL for the WebSocket API's `$connect` (a browser-style client cannot add headers
//! to the upgrade, so API Gateway reads the signature from the query string).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;

use crate::Error;

/// The SigV4 service name of API Gateway's invoke endpoints (REST and WebSocket).
pub const SERVICE: &str = "execute-api";

/// Credentials are fetched again this long before they expire, so a signature never carries
/// credentials that expire in flight.
const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(300);

/// Signs requests for one region with credentials from a provider (for example the default chain:
/// `aws_config::load_defaults(..).await.credentials_provider()`). The credentials are cached until
/// shortly before they expire: providers such as IMDS, ECS or SSO make a network call per fetch.
#[derive(Clone, Debug)]
pub struct Signer {
    region: String,
    provider: SharedCredentialsProvider,
    cached: Arc<tokio::sync::Mutex<Option<Credentials>>>,
}

impl Signer {
    pub fn new(region: impl Into<String>, provider: impl ProvideCredentials + 'static) -> Signer {
        Signer { region: region.into(), provider: SharedCredentialsProvider::new(provider), cached: Default::default() }
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    /// Current credentials: the cached ones while they are good, else fresh ones from the provider.
    pub async fn credentials(&self) -> Result<Credentials, Error> {
        let mut cached = self.cached.lock().await;
        let fresh = |c: &Credentials| c.expiry().is_none_or(|at| SystemTime::now() + REFRESH_BEFORE_EXPIRY < at);
        if let Some(credentials) = cached.as_ref().filter(|c| fresh(c)) {
            return Ok(credentials.clone());
        }
        let credentials = self.provider.provide_credentials().await.map_err(Error::Credentials)?;
        *cached = Some(credentials.clone());
        Ok(credentials)
    }
}

fn params<'a>(
    identity: &'a Identity,
    region: &'a str,
    time: SystemTime,
    settings: SigningSettings,
) -> Result<aws_sigv4::http_request::SigningParams<'a>, Error> {
    let params = v4::SigningParams::builder()
        .identity(identity)
        .region(region)
        .name(SERVICE)
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| Error::Signing(e.to_string()))?;
    Ok(params.into())
}

/// The headers SigV4 adds to a request (`authorization`, `x-amz-date`, and `x-amz-security-token`
/// for temporary credentials), signed at `time`. `headers` are the request's own headers, all of
/// them signed (the host is taken from `url`); `body` is hashed into the signature, so a request
/// whose body was changed on the way is refused.
pub fn sign_headers(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    region: &str,
    credentials: &Credentials,
    time: SystemTime,
) -> Result<Vec<(String, String)>, Error> {
    let identity = credentials.clone().into();
    let params = params(&identity, region, time, SigningSettings::default())?;
    let request = SignableRequest::new(method, url, headers.iter().copied(), SignableBody::Bytes(body))
        .map_err(|e| Error::Url { url: url.to_owned(), message: e.to_string() })?;
    let (instructions, _signature) = sign(request, &params).map_err(|e| Error::Signing(e.to_string()))?.into_parts();
    Ok(instructions.headers().map(|(name, value)| (name.to_owned(), value.to_owned())).collect())
}

/// A `wss://` URL of an IAM-authorized WebSocket API with the SigV4 signature of its `$connect` in the
/// query string, valid for `expires_in` (at most 7 days) from now.
pub fn presign_websocket_url(
    url: &str,
    region: &str,
    credentials: &Credentials,
    expires_in: Duration,
) -> Result<String, Error> {
    presign_websocket_url_at(url, region, credentials, expires_in, SystemTime::now())
}

/// [`presign_websocket_url`] signed at `time`.
pub fn presign_websocket_url_at(
    url: &str,
    region: &str,
    credentials: &Credentials,
    expires_in: Duration,
    time: SystemTime,
) -> Result<String, Error> {
    let invalid = |message: String| Error::Url { url: url.to_owned(), message };
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(expires_in);
    let identity = credentials.clone().into();
    let params = params(&identity, region, time, settings)?;
    // The upgrade is a GET without a body; the host comes from the URL.
    let request = SignableRequest::new("GET", url, std::iter::empty(), SignableBody::Bytes(&[]))
        .map_err(|e| invalid(e.to_string()))?;
    let (instructions, _signature) = sign(request, &params).map_err(|e| Error::Signing(e.to_string()))?.into_parts();
    let mut request = http::Request::get(url).body(()).map_err(|e| invalid(e.to_string()))?;
    instructions.apply_to_request_http1x(&mut request);
    Ok(request.uri().to_string())
}
