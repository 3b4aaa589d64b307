//! The route to the one upstream: its parsed base URL, the pooled clients (the lean
//! HTTP/1.1 path of [`crate::upstream::lean`], plain or TLS, for recorded requests and for
//! pass-through requests whose body has a known length; hyper-util's client for h2c
//! upstreams and for pass-through requests that stream a body of unknown length, HEAD or an
//! upgrade), the rewrite of a client's request into the upstream's (the request's own
//! authority is never used for routing), and sending it with the header timeout.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use trace_format::Outcome;

use crate::capture_metrics::Metrics;
use crate::config::validated::Upstream;
use crate::config::{ForwardedHeaders, ProxyConfig};
use crate::phases::Phases;
use crate::upstream::lean::{LeanUpstream, SendError};
use crate::upstream::reach::Reach;
use crate::upstream::{BoxError, UpstreamBody};

/// The body of a request to the upstream: a generation request's, read whole, or a
/// pass-through request's, streamed (under the client's body timeout, which the serving side
/// sets).
pub(crate) type UpBody =
    Either<Full<Bytes>, http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>>;
type UpClient = Client<hyper_rustls::HttpsConnector<HttpConnector<UpstreamDns>>, UpBody>;

/// The names hyper-util's connector asks for (it opens the connections of pass-through
/// requests, and of everything to `https://` and h2c upstreams): the upstream's host through
/// its one [`wire::Resolver`], looked up at most once per [`wire::RESOLVED_FOR`]
/// instead of a blocking `getaddrinfo` for every new connection (hyper-util's
/// `GaiResolver`). The connector does not say when connecting failed, so its addresses are
/// kept for the whole interval. Any other name (none: every request goes to the upstream)
/// is looked up as it comes.
#[derive(Clone, Debug)]
pub(crate) struct UpstreamDns(Arc<wire::Resolver>);

impl tower_service::Service<Name> for UpstreamDns {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let r = self.0.clone();
        Box::pin(async move {
            if name.as_str() == r.host() {
                return Ok(r.addrs().await?.to_vec().into_iter());
            }
            Ok(tokio::net::lookup_host((name.as_str(), 0))
                .await?
                .collect::<Vec<_>>()
                .into_iter())
        })
    }
}

/// Why a request got no response head from the upstream: the row's outcome, the status to
/// answer the client with, and the error text.
pub(crate) type Failure = (Outcome, StatusCode, String);

/// The address of the client a request came from, in the request's extensions (put there
/// by the server that read it) for `X-Forwarded-For`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientAddr(pub(crate) IpAddr);

impl ClientAddr {
    /// The client at `peer` (an IPv4 client of a dual-stack listener as IPv4).
    pub(crate) fn of(peer: SocketAddr) -> ClientAddr {
        ClientAddr(peer.ip().to_canonical())
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

impl Upstream {
    fn uri(&self, path_and_query: &str) -> Option<Uri> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{path_and_query}", self.base_path))
            .build()
            .ok()
    }
}

/// The upstream and the clients that reach it.
pub(crate) struct Forward {
    upstream: Upstream,
    client: UpClient,
    /// Requests to an HTTP/1.1 upstream (`http://` or `https://`, not `--upstream-h2`) go
    /// this way when their body is read whole (see [`crate::upstream::lean`]); the rest
    /// through `client`.
    lean: Option<Arc<LeanUpstream>>,
    /// How long to wait for the upstream's response head.
    timeout: Duration,
    /// Whether the upstream can be reached (woken when a request could not connect).
    reach: Arc<Reach>,
    /// What to tell the upstream about the client.
    forwarded: ForwardedHeaders,
    /// The listener's scheme, for `X-Forwarded-Proto`.
    proto: HeaderValue,
}

impl Forward {
    /// The clients for `upstream` with the timeouts, CA and protocol of `cfg`; its
    /// reachability shows in `metrics` once checked ([`Forward::reach`]).
    pub(crate) fn new(
        upstream: Upstream,
        tls: rustls::ClientConfig,
        cfg: &ProxyConfig,
        metrics: Arc<Metrics>,
    ) -> Forward {
        let port = upstream.authority.port_u16().unwrap_or(
            if upstream.scheme == http::uri::Scheme::HTTPS {
                443
            } else {
                80
            },
        );
        let resolver = Arc::new(wire::Resolver::new(upstream.authority.host(), port));
        let reach = Arc::new(Reach::new(
            &cfg.upstream,
            resolver.clone(),
            cfg.upstream_connect_timeout,
            metrics,
        ));
        let lean = (!cfg.upstream_h2)
            .then(|| LeanUpstream::new(&upstream, &tls, cfg))
            .flatten()
            .map(Arc::new);
        let client = build_client(cfg, tls, UpstreamDns(resolver));
        Forward {
            upstream,
            client,
            lean,
            timeout: cfg.upstream_timeout,
            reach,
            forwarded: cfg.forwarded,
            proto: HeaderValue::from_static(if cfg.tls.is_some() { "https" } else { "http" }),
        }
    }

    /// The upstream's reachability.
    pub(crate) fn reach(&self) -> &Arc<Reach> {
        &self.reach
    }

    /// The upstream's authority (host and port).
    pub(crate) fn authority(&self) -> &http::uri::Authority {
        &self.upstream.authority
    }

    /// The request for the upstream: the client's method, path and query under the
    /// upstream's base path, HTTP/1.1, its headers minus hop-by-hop ones and `Host`, and
    /// `content-length` when the body was read whole. `None` for a path that makes no URI.
    pub(crate) fn request(
        &self,
        parts: &http::request::Parts,
        body: UpBody,
        body_len: Option<usize>,
    ) -> Option<Request<UpBody>> {
        let pq = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let uri = self.upstream.uri(&pq)?;
        let mut req = Request::new(body);
        *req.method_mut() = parts.method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = Version::HTTP_11;
        let h = req.headers_mut();
        *h = parts.headers.clone();
        strip_hop_by_hop(h);
        h.remove(header::HOST);
        if let Some(n) = body_len {
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        if let Some([xff, xfp]) = self.forwarded(parts) {
            h.insert(X_FORWARDED_FOR, xff);
            h.insert(X_FORWARDED_PROTO, xfp);
        }
        Some(req)
    }

    /// The `X-Forwarded-For` and `X-Forwarded-Proto` values the upstream gets in place of the
    /// client's (see [`ForwardedHeaders`]), or `None` to pass the client's on unchanged.
    fn forwarded(&self, parts: &http::request::Parts) -> Option<[HeaderValue; 2]> {
        if self.forwarded == ForwardedHeaders::Off {
            return None;
        }
        let client = parts.extensions.get::<ClientAddr>()?;
        let trust = self.forwarded == ForwardedHeaders::Trust;
        let mut xff = String::new();
        if trust {
            for v in parts.headers.get_all(&X_FORWARDED_FOR) {
                let v = v.to_str().unwrap_or("").trim().trim_end_matches(',');
                if !v.is_empty() {
                    xff.push_str(v);
                    xff.push_str(", ");
                }
            }
        }
        xff.push_str(&client.0.to_string());
        let proto = match parts.headers.get(&X_FORWARDED_PROTO) {
            Some(p) if trust => p.clone(),
            _ => self.proto.clone(),
        };
        Some([HeaderValue::from_str(&xff).ok()?, proto])
    }

    fn header_timeout(&self) -> Failure {
        (
            Outcome::Timeout,
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "no response headers from the upstream within {:?}",
                self.timeout
            ),
        )
    }

    /// A generation request's bytes for the lean path `lean`: the client's method, path and
    /// query under the upstream's base path, its headers minus hop-by-hop ones, `Host` and
    /// `content-length`, then the upstream's `Host`, the body's `content-length` and `body`.
    /// The same request as [`Forward::request`] gives, written straight from the client's
    /// head (no header map copied, no URI built).
    fn lean_request(
        &self,
        lean: &LeanUpstream,
        parts: &http::request::Parts,
        body: &[u8],
    ) -> Vec<u8> {
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let h = &parts.headers;
        let named = connection_named(h);
        let forwarded = self.forwarded(parts);
        let mut out = Vec::with_capacity(
            64 + self.upstream.base_path.len() + pq.len() + h.len() * 48 + body.len(),
        );
        out.extend_from_slice(parts.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.upstream.base_path.as_bytes());
        out.extend_from_slice(pq.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        for (name, value) in h {
            let n = name.as_str();
            if HOP_BY_HOP.contains(&n)
                || name == header::HOST
                || name == header::CONTENT_LENGTH
                || named.contains(name)
                || (forwarded.is_some() && (name == X_FORWARDED_FOR || name == X_FORWARDED_PROTO))
            {
                continue;
            }
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if let Some([xff, xfp]) = forwarded {
            for (n, v) in [(X_FORWARDED_FOR, xff), (X_FORWARDED_PROTO, xfp)] {
                out.extend_from_slice(n.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(v.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
        }
        // A request without content that did not say `content-length` (a GET) is sent
        // without one, as the client sent it.
        let length = !body.is_empty()
            || h.contains_key(header::CONTENT_LENGTH)
            || matches!(
                parts.method,
                http::Method::POST | http::Method::PUT | http::Method::PATCH
            );
        lean.encode_tail(&mut out, body, length);
        out
    }

    /// Whether requests can go by the lean path ([`Forward::send_lean`]).
    pub(crate) fn has_lean(&self) -> bool {
        self.lean.is_some()
    }

    /// Sends a request whose body was read whole (the client's head `parts`, the body to
    /// forward `body`) by the lean path with the header timeout; `None` when there is no
    /// lean path (then [`Forward::send_generation`]).
    pub(crate) async fn send_lean(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
        phases: &mut Phases,
    ) -> Option<std::result::Result<(http::response::Parts, UpstreamBody), Failure>> {
        let lean = self.lean.as_ref()?;
        let bytes = self.lean_request(lean, parts, body);
        Some(
            match tokio::time::timeout(self.timeout, lean.send(&bytes, phases)).await {
                Ok(Ok((parts, body))) => Ok((parts, UpstreamBody::Lean(body))),
                Ok(Err(e)) => {
                    if matches!(e, SendError::Connect(_)) {
                        self.reach.connect_failed();
                    }
                    Err((
                        Outcome::UpstreamError,
                        StatusCode::BAD_GATEWAY,
                        e.to_string(),
                    ))
                }
                Err(_) => Err(self.header_timeout()),
            },
        )
    }

    /// Sends a generation request to an upstream with no lean path (h2c) through
    /// hyper-util's client, with the header timeout.
    pub(crate) async fn send_generation(
        &self,
        req: Request<UpBody>,
    ) -> std::result::Result<(http::response::Parts, UpstreamBody), Failure> {
        let (parts, body) = self.send(req).await?.into_parts();
        Ok((parts, UpstreamBody::Hyper(body)))
    }

    /// Sends to the upstream through hyper-util's client with the header timeout.
    pub(crate) async fn send(
        &self,
        req: Request<UpBody>,
    ) -> std::result::Result<Response<Incoming>, Failure> {
        match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                if e.is_connect() {
                    self.reach.connect_failed();
                }
                let mut msg = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg.push_str(": ");
                    msg.push_str(&s.to_string());
                    src = s.source();
                }
                Err((Outcome::UpstreamError, StatusCode::BAD_GATEWAY, msg))
            }
            Err(_) => Err(self.header_timeout()),
        }
    }
}

fn build_client(cfg: &ProxyConfig, tls: rustls::ClientConfig, dns: UpstreamDns) -> UpClient {
    let mut http = HttpConnector::new_with_resolver(dns);
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(cfg.upstream_connect_timeout));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    let mut b = Client::builder(TokioExecutor::new());
    b.pool_idle_timeout(cfg.upstream_pool_idle_timeout)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .http2_only(cfg.upstream_h2);
    if !cfg.upstream_h2 {
        // Beside the lean path this client carries only what the lean path cannot (a body
        // of unknown length, HEAD, an upgrade): each on a connection of its own, so none is
        // ever written to a kept connection the upstream is closing (it has no liveness
        // check or learned habits), which would be a 502 of capture's own.
        b.pool_max_idle_per_host(0);
    }
    b.build(connector)
}

/// The headers a message's `Connection` names (hop-by-hop for this message).
fn connection_named(h: &HeaderMap) -> Vec<HeaderName> {
    h.get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect()
}

/// Removes hop-by-hop headers, including those named by `Connection`.
pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap) {
    // Most messages have none (a streamed response has `transfer-encoding`): one pass over
    // the names finds out, cheaper than nine lookups.
    if !h.keys().any(|k| HOP_BY_HOP.contains(&k.as_str())) {
        return;
    }
    let named = connection_named(h);
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(*n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_service::Service;

    /// The lean path's request bytes carry what [`Forward::request`] gives hyper's client:
    /// the same request line under the base path, the same headers (hop-by-hop, those the
    /// client's `Connection` names, its `Host` and its `content-length` gone), the upstream's
    /// `Host` and the body's length.
    #[tokio::test]
    async fn the_lean_request_is_the_forwarded_request() {
        let cfg = ProxyConfig::new(
            "127.0.0.1:0".parse().unwrap(),
            "http://127.0.0.1:9/base/",
            "/tmp/unused",
        );
        let p = cfg.validate().unwrap().into_parts();
        let f = Forward::new(
            p.upstream,
            p.upstream_tls,
            &p.cfg,
            Arc::new(Metrics::default()),
        );
        let req = Request::builder()
            .method("POST")
            .uri("/v1/completions?x=1")
            .header("host", "proxy.example:8080")
            .header("content-type", "application/json")
            .header("connection", "keep-alive, x-private")
            .header("x-private", "1")
            .header("te", "trailers")
            .header("content-length", "999")
            .header("x-multi", "a")
            .header("x-multi", "b")
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        let body = br#"{"model":"m"}"#;
        let lean = f.lean.as_ref().expect("a lean path to http://");
        let bytes = f.lean_request(lean, &parts, body);
        let text = String::from_utf8(bytes).unwrap();
        let (head, got_body) = text.split_once("\r\n\r\n").unwrap();
        assert_eq!(got_body.as_bytes(), body);
        let mut lines = head.split("\r\n");
        assert_eq!(lines.next(), Some("POST /base/v1/completions?x=1 HTTP/1.1"));
        let mut got: Vec<String> = lines.map(str::to_string).collect();
        got.sort();
        let up = f
            .request(
                &parts,
                Either::Left(Full::new(Bytes::new())),
                Some(body.len()),
            )
            .unwrap();
        assert_eq!(
            up.uri().path_and_query().unwrap().as_str(),
            "/base/v1/completions?x=1"
        );
        let mut want: Vec<String> = up
            .headers()
            .iter()
            .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap()))
            .chain(["host: 127.0.0.1:9".to_string()])
            .collect();
        want.sort();
        assert_eq!(got, want);
        assert!(got.contains(&"content-length: 13".to_string()));
        assert!(!got
            .iter()
            .any(|l| l.starts_with("x-private") || l.starts_with("te:")));
    }

    /// Both paths tell the upstream who the client is the same way: by default its address
    /// (an IPv4-mapped one as IPv4) and the listener's scheme in place of the client's
    /// claims; trusted, the claims kept and the address appended; off, the claims unchanged.
    #[tokio::test]
    async fn forwarded_headers_name_the_client_on_both_paths() {
        for (mode, want_for, want_proto) in [
            (ForwardedHeaders::Set, "192.0.2.1", "http"),
            (
                ForwardedHeaders::Trust,
                "203.0.113.7, 10.0.0.1, 192.0.2.1",
                "https",
            ),
            (ForwardedHeaders::Off, "203.0.113.7, 10.0.0.1", "https"),
        ] {
            let mut cfg = ProxyConfig::new(
                "127.0.0.1:0".parse().unwrap(),
                "http://127.0.0.1:9",
                "/tmp/unused",
            );
            cfg.forwarded = mode;
            let p = cfg.validate().unwrap().into_parts();
            let f = Forward::new(
                p.upstream,
                p.upstream_tls,
                &p.cfg,
                Arc::new(Metrics::default()),
            );
            let (mut parts, ()) = Request::builder()
                .method("POST")
                .uri("/v1/completions")
                .header("x-forwarded-for", "203.0.113.7")
                .header("x-forwarded-for", "10.0.0.1")
                .header("x-forwarded-proto", "https")
                .body(())
                .unwrap()
                .into_parts();
            parts
                .extensions
                .insert(ClientAddr::of("[::ffff:192.0.2.1]:5555".parse().unwrap()));
            let lean = f.lean.as_ref().unwrap();
            let text = String::from_utf8(f.lean_request(lean, &parts, b"{}")).unwrap();
            let lines = |name: &str| -> Vec<String> {
                text.split("\r\n")
                    .filter_map(|l| l.strip_prefix(&format!("{name}: ")))
                    .map(str::to_string)
                    .collect()
            };
            let up = f
                .request(&parts, Either::Left(Full::new(Bytes::new())), Some(2))
                .unwrap();
            let values = |name: &str| -> Vec<String> {
                up.headers()
                    .get_all(name)
                    .iter()
                    .map(|v| v.to_str().unwrap().to_string())
                    .collect()
            };
            if mode == ForwardedHeaders::Off {
                assert_eq!(lines("x-forwarded-for"), ["203.0.113.7", "10.0.0.1"]);
                assert_eq!(values("x-forwarded-for"), ["203.0.113.7", "10.0.0.1"]);
            } else {
                assert_eq!(lines("x-forwarded-for"), [want_for], "{mode:?}");
                assert_eq!(values("x-forwarded-for"), [want_for], "{mode:?}");
            }
            assert_eq!(lines("x-forwarded-proto"), [want_proto], "{mode:?}");
            assert_eq!(values("x-forwarded-proto"), [want_proto], "{mode:?}");
        }
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("content-type", "application/json"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("x-request-id", "abc"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["content-type", "x-request-id"]);
        // Only transfer-encoding (a streamed response): removed, the rest kept.
        let mut h = HeaderMap::new();
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::CONTENT_TYPE));
    }

    /// A burst of new connections through hyper-util's client asks for the upstream's name
    /// once, not once per connection (its `GaiResolver` made a blocking `getaddrinfo` each
    /// time); the addresses carry the upstream's port.
    #[tokio::test]
    async fn the_upstream_name_is_looked_up_once_for_a_burst_of_connections() {
        let r = Arc::new(wire::Resolver::new("localhost", 8443));
        let dns = UpstreamDns(r.clone());
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..40 {
            let mut d = dns.clone();
            set.spawn(async move { d.call("localhost".parse().unwrap()).await });
        }
        while let Some(got) = set.join_next().await {
            let addrs: Vec<SocketAddr> = got.unwrap().unwrap().collect();
            assert!(!addrs.is_empty());
            assert!(addrs
                .iter()
                .all(|a| a.port() == 8443 && a.ip().is_loopback()));
        }
        assert_eq!(r.lookups(), 1);
    }
}
