//! What keeps a page of another origin, open in the same browser, from driving the local stack: its
//! servers listen on 127.0.0.1 without authentication (by default), so any site could otherwise send
//! them requests through the browser (cross-site requests, and DNS rebinding: a name of the site's that
//! resolves to 127.0.0.1).
//!
//! - `Host` must name the server itself (`127.0.0.1:PORT` or `localhost:PORT`): a rebound name is not.
//! - `Origin`, when one is sent (browsers always send it on a WebSocket handshake; other clients send
//!   none), must be one of the stack's own pages or `--cors-allow-origin`.
//! - A POST must say `Content-Type: application/json`: a cross-origin page can send a "simple" request
//!   (a form, or `text/plain`) without asking first, but not a JSON one, for which the browser sends a
//!   CORS preflight that only `--cors-allow-origin` passes.
//! - The stack's own routes (`/local/...`: `/local/token`, which signs anyone in as anyone, admin
//!   included, and what the page reads) answer the stack's own page only: an `Origin` other than the
//!   REST API's own (not even `--cors-allow-origin`'s) or a `Sec-Fetch-Site` other than `same-origin`
//!   (or `none`, a request the user typed) is refused.

use std::net::SocketAddr;

use axum::http::{HeaderMap, Method, header};

/// The local stack's own addresses, and the origin `--cors-allow-origin` allows.
#[derive(Debug, Clone)]
pub(crate) struct SameOrigin {
    /// `127.0.0.1:PORT` and `localhost:PORT` of the REST API (which serves the page) and of the WebSocket API.
    api_port: u16,
    websocket_port: u16,
    /// `--cors-allow-origin`: `*` (any) or one origin.
    cors_allow_origin: Option<String>,
}

/// Why a request was refused: the status and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) status: u16,
    pub(crate) message: String,
}

use local_services::{LOCAL_NAMES, is_local_host};

impl SameOrigin {
    pub(crate) fn new(api: SocketAddr, websocket: SocketAddr, cors_allow_origin: Option<String>) -> SameOrigin {
        SameOrigin {
            api_port: api.port(),
            websocket_port: websocket.port(),
            cors_allow_origin: cors_allow_origin.filter(|origin| !origin.is_empty()),
        }
    }

    fn is_allowed_origin(&self, origin: &str) -> bool {
        let own = [self.api_port, self.websocket_port]
            .iter()
            .any(|port| LOCAL_NAMES.iter().any(|name| origin.eq_ignore_ascii_case(&format!("http://{name}:{port}"))));
        own || self.cors_allow_origin.as_deref().is_some_and(|allowed| allowed == "*" || allowed == origin)
    }

    /// `Host`: this server's own address.
    fn check_host(&self, headers: &HeaderMap, port: u16) -> Result<(), Refused> {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
        if is_local_host(host, port) {
            return Ok(());
        }
        Err(Refused {
            status: 403,
            message: format!(
                "Host {host:?} is not this server (127.0.0.1:{port} or localhost:{port}): the local stack answers only requests addressed to it"
            ),
        })
    }

    /// `Origin`, when sent: one of the stack's own pages, or `--cors-allow-origin`.
    fn check_origin(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        let origin = origin.to_str().unwrap_or_default();
        if self.is_allowed_origin(origin) {
            return Ok(());
        }
        Err(Refused {
            status: 403,
            message: format!(
                "Origin {origin:?} is not the local stack's own page (http://127.0.0.1:{}) nor --cors-allow-origin",
                self.api_port
            ),
        })
    }

    /// A request to one of the stack's own routes (`/local/...`): sent by the stack's own page, or by a
    /// client that is no browser (no `Origin`, no `Sec-Fetch-Site`).
    pub(crate) fn check_own_page(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let port = self.api_port;
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = String::from_utf8_lossy(origin.as_bytes());
            if !LOCAL_NAMES.iter().any(|name| origin.eq_ignore_ascii_case(&format!("http://{name}:{port}"))) {
                return Err(Refused {
                    status: 403,
                    message: format!(
                        "Origin {origin:?}: the local stack's own routes answer only its own page (http://127.0.0.1:{port} or http://localhost:{port})"
                    ),
                });
            }
        }
        if let Some(site) = headers.get("sec-fetch-site") {
            let site = String::from_utf8_lossy(site.as_bytes());
            if !["same-origin", "none"].contains(&site.as_ref()) {
                return Err(Refused {
                    status: 403,
                    message: format!(
                        "Sec-Fetch-Site {site:?}: the local stack's own routes answer only its own page (http://127.0.0.1:{port})"
                    ),
                });
            }
        }
        Ok(())
    }

    /// A WebSocket handshake: `Host` is the WebSocket API, and `Origin`, when sent, is allowed.
    pub(crate) fn check_upgrade(&self, headers: &HeaderMap) -> Result<(), Refused> {
        self.check_host(headers, self.websocket_port)?;
        self.check_origin(headers)
    }

    /// A REST request: `Host` is the REST API; a POST says `Content-Type: application/json` (415
    /// otherwise, as `openapi.yaml` says).
    pub(crate) fn check_rest(&self, method: &Method, headers: &HeaderMap) -> Result<(), Refused> {
        self.check_host(headers, self.api_port)?;
        if method == Method::POST && !is_json(headers) {
            let sent = headers.get(header::CONTENT_TYPE).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            return Err(Refused {
                status: 415,
                message: match sent {
                    Some(sent) => format!("Content-Type {sent:?}: a POST must be Content-Type: application/json"),
                    None => "no Content-Type: a POST must be Content-Type: application/json".to_owned(),
                },
            });
        }
        Ok(())
    }
}

/// `application/json`, with parameters or not (`; charset=utf-8`), in any case.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(cors: Option<&str>) -> SameOrigin {
        SameOrigin::new("127.0.0.1:3000".parse().unwrap(), "127.0.0.1:3001".parse().unwrap(), cors.map(str::to_owned))
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_websocket_handshake_needs_its_own_host_and_an_allowed_origin_when_one_is_sent() {
        let s = stack(None);
        assert_eq!(s.check_upgrade(&headers(&[("host", "127.0.0.1:3001")])), Ok(()), "a client that is not a browser");
        assert_eq!(
            s.check_upgrade(&headers(&[("host", "localhost:3001"), ("origin", "http://localhost:3000")])),
            Ok(())
        );
        assert_eq!(
            s.check_upgrade(&headers(&[("host", "127.0.0.1:3001"), ("origin", "http://127.0.0.1:3000")])),
            Ok(())
        );
        for refused in [
            headers(&[("host", "127.0.0.1:3001"), ("origin", "https://evil.example")]),
            headers(&[("host", "127.0.0.1:3001"), ("origin", "null")]),
            headers(&[("host", "127.0.0.1:3001"), ("origin", "http://127.0.0.1:3002")]),
            headers(&[("host", "rebound.evil.example:3001")]),
            headers(&[("host", "127.0.0.1:3000")]),
            headers(&[]),
        ] {
            assert_eq!(s.check_upgrade(&refused).map_err(|r| r.status), Err(403), "{refused:?}");
        }
        let allowed = stack(Some("https://app.example.com"));
        let from_app = headers(&[("host", "127.0.0.1:3001"), ("origin", "https://app.example.com")]);
        assert_eq!(allowed.check_upgrade(&from_app), Ok(()));
        assert_eq!(stack(Some("*")).check_upgrade(&from_app), Ok(()));
        assert!(stack(None).check_upgrade(&from_app).is_err());
    }

    #[test]
    fn the_stacks_own_routes_answer_its_own_page_and_clients_that_are_no_browser() {
        let s = stack(Some("*"));
        for allowed in [
            headers(&[]),
            headers(&[("origin", "http://127.0.0.1:3000"), ("sec-fetch-site", "same-origin")]),
            headers(&[("origin", "http://LOCALHOST:3000")]),
            headers(&[("sec-fetch-site", "none")]),
        ] {
            assert_eq!(s.check_own_page(&allowed), Ok(()), "{allowed:?}");
        }
        for refused in [
            headers(&[("origin", "https://evil.example")]),
            headers(&[("origin", "null")]),
            headers(&[("origin", "http://127.0.0.1:3001")]),
            headers(&[("origin", "http://127.0.0.1:3000"), ("sec-fetch-site", "cross-site")]),
            headers(&[("sec-fetch-site", "same-site")]),
        ] {
            assert_eq!(s.check_own_page(&refused).map_err(|r| r.status), Err(403), "{refused:?}");
        }
    }

    #[test]
    fn a_post_must_be_json_and_every_request_addressed_to_the_stack() {
        let s = stack(None);
        let json = headers(&[("host", "127.0.0.1:3000"), ("content-type", "Application/JSON; charset=utf-8")]);
        assert_eq!(s.check_rest(&Method::POST, &json), Ok(()));
        assert_eq!(s.check_rest(&Method::GET, &headers(&[("host", "localhost:3000")])), Ok(()));
        for (content_type, status) in [(Some("text/plain"), 415), (Some("application/jsonp"), 415), (None, 415)] {
            let mut h = headers(&[("host", "127.0.0.1:3000")]);
            if let Some(value) = content_type {
                h.insert(header::CONTENT_TYPE, value.parse().unwrap());
            }
            let refused = s.check_rest(&Method::POST, &h).unwrap_err();
            assert_eq!(refused.status, status, "{content_type:?}");
            assert!(refused.message.contains("application/json"), "{}", refused.message);
        }
        let rebound = headers(&[("host", "rebound.evil.example:3000"), ("content-type", "application/json")]);
        assert_eq!(s.check_rest(&Method::POST, &rebound).map_err(|r| r.status), Err(403));
        assert_eq!(s.check_rest(&Method::GET, &rebound).map_err(|r| r.status), Err(403));
    }
}
