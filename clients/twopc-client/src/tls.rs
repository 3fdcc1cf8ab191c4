//! TLS for `https://` and `wss://` with an explicit crypto provider, chosen by this crate's features
//! (`ring` by default, or `aws-lc-rs`). A library that asked rustls for the process-wide provider would
//! panic in an application that links two of them, and would make every user compile the one it picked.

use std::sync::{Arc, OnceLock};

use crate::Error;

#[cfg(not(any(feature = "ring", feature = "aws-lc-rs")))]
compile_error!("twopc-client needs a TLS crypto provider: turn on its feature `ring` (the default) or `aws-lc-rs`");

/// The provider this build was given; `aws-lc-rs` when both features are on.
fn provider() -> rustls::crypto::CryptoProvider {
    #[cfg(feature = "aws-lc-rs")]
    return rustls::crypto::aws_lc_rs::default_provider();
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    return rustls::crypto::ring::default_provider();
}

/// A reqwest builder with this crate's TLS (the chosen provider, the system's roots), for
/// [`Client::with_http_client`](crate::Client::with_http_client): this crate builds reqwest without a
/// provider of its own, so a plain `reqwest::Client::builder()` only builds where the application turns
/// one of reqwest's on.
pub fn http_client_builder() -> Result<reqwest::ClientBuilder, Error> {
    Ok(reqwest::Client::builder().use_preconfigured_tls((*config()?).clone()))
}

/// For a client of an `http://` API: reqwest builds a TLS configuration for every client (a redirect may
/// lead to `https://`), so a machine without root certificates gets one that trusts nothing.
pub(crate) fn config_or_none_trusted() -> Arc<rustls::ClientConfig> {
    config().unwrap_or_else(|_| {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
            .with_safe_default_protocol_versions()
            .expect("the provider supports the default protocol versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        Arc::new(config)
    })
}

/// The system's root certificates under the chosen provider, built once per process.
pub(crate) fn config() -> Result<Arc<rustls::ClientConfig>, Error> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(format!("no root certificates found on this system: {:?}", found.errors));
            }
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
        .clone()
        .map_err(Error::Tls)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_tls_config_builds_on_the_chosen_provider() {
        super::config().unwrap();
    }
}
