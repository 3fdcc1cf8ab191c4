//! The one way this workspace builds an HTTP client: TLS on the crypto provider the AWS SDK already
//! links (aws-lc-rs) and the system's root certificates.
//!
//! reqwest's `rustls-tls-*` features bring `ring`: a second crypto stack compiled into every
//! function. reqwest is built without a provider (`rustls-tls-no-provider`) and given this
//! configuration instead; a plain `reqwest::Client::new()` panics ("No provider set") in a build
//! where nothing else turns one of reqwest's providers on.

use std::sync::{Arc, OnceLock};

/// A reqwest builder whose TLS uses aws-lc-rs and the system's root certificates (Lambda's and
/// containers' CA bundle). On a system without any root certificate, `https://` requests fail with
/// an unknown-issuer error (and a warning is logged once); `http://` works regardless.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().use_preconfigured_tls((*tls_config()).clone())
}

/// Built once per process: loading the system's roots reads every file of its CA bundle.
fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                tracing::warn!(errors = ?found.errors, "no root certificates found on this system: HTTPS requests will fail");
            }
            let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("aws-lc-rs supports rustls's default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

#[cfg(test)]
mod tests {
    #[test]
    fn builds_a_client_on_the_systems_roots() {
        // Without a provider of reqwest's own, a builder not given this configuration panics here.
        assert!(super::client_builder().build().is_ok());
    }
}
