//! The HTTP/SSE client: a keep-alive connection pool of our own over hyper's HTTP/1.1
//! connections (plain or rustls), so each request knows whether its connection was new and
//! how long connecting took, and t0 is taken when the request is handed to its connection,
//! after any connecting.
//!
//! The per-chunk path takes one clock reading per body frame, feeds the shared SSE parser,
//! and pushes an integer; no lock, no allocation beyond the growth of the request's own
//! vectors, no tokenizer.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use trace_format::sse::{classify, response_usage, SseParser, StreamEvent};
use trace_format::Outcome;

use crate::config::RequestOptions;
use crate::error::ReplayError;
use crate::prompt::BuiltRequest;

type Sender = SendRequest<Full<Bytes>>;
type ConnDriver = std::pin::Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

/// One pooled HTTP/1.1 connection: the request handle and the connection's I/O future.
///
/// The request task that holds a connection polls its I/O future itself (no separate
/// connection task), so bytes are read and timestamped in the same poll, with no hop
/// between tasks; an idle pooled connection is simply not polled.
struct Conn {
    sender: Sender,
    driver: ConnDriver,
}

impl Conn {
    /// Polls the connection until it can take another request (the previous response fully
    /// processed). False when it closed or did not get there within a short time.
    async fn settle(&mut self) -> bool {
        let wait = async {
            tokio::select! {
                biased;
                r = std::future::poll_fn(|cx| self.sender.poll_ready(cx)) => r.is_ok(),
                _ = &mut self.driver => false,
            }
        };
        tokio::time::timeout(Duration::from_millis(50), wait)
            .await
            .unwrap_or(false)
    }

    /// Runs `work` while driving the connection's I/O in this task.
    async fn drive<T>(driver: &mut ConnDriver, work: impl Future<Output = T>) -> T {
        tokio::pin!(work);
        let mut closed = false;
        loop {
            tokio::select! {
                biased;
                r = &mut work => return r,
                _ = &mut *driver, if !closed => closed = true,
            }
        }
    }
}

/// Where a target lives, parsed from its URL.
#[derive(Debug, Clone)]
struct Endpoint {
    https: bool,
    host: String,
    port: u16,
    authority: String,
    base_path: String,
}

fn parse_url(url: &str) -> Result<Endpoint, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(format!("{url}: scheme must be http or https")),
    };
    let auth = uri.authority().ok_or_else(|| format!("{url}: no host"))?;
    let host = auth
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = auth.port_u16().unwrap_or(if https { 443 } else { 80 });
    Ok(Endpoint {
        https,
        host,
        port,
        authority: auth.as_str().to_string(),
        base_path: uri.path().trim_end_matches('/').to_string(),
    })
}

/// What one exchange produced, ready to become a trace row.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// When the request was handed to its connection.
    pub t0: Instant,
    /// Whether a new connection was opened for it.
    pub new_connection: bool,
    /// Time spent connecting (zero for a pooled connection).
    pub connect: Duration,
    /// HTTP status, when a response arrived.
    pub status: Option<u16>,
    /// What became of it.
    pub outcome: Outcome,
    /// Error text.
    pub error: Option<String>,
    /// First chunk − t0, µs.
    pub ttft_us: Option<i64>,
    /// Last chunk (or full response) − t0, µs.
    pub e2el_us: Option<i64>,
    /// Every chunk's offset from t0, µs.
    pub chunk_times_us: Vec<i64>,
    /// Tokens per chunk, when the server sent cumulative usage with each chunk.
    pub chunk_tokens: Option<Vec<i32>>,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<i64>,
    /// `usage.completion_tokens`.
    pub completion_tokens: Option<i64>,
    /// Response body bytes.
    pub response_bytes: i64,
    /// Instant the exchange ended.
    pub end: Instant,
}

/// A keep-alive HTTP/1.1 client for one target.
pub struct Client {
    ep: Endpoint,
    tls: Option<tokio_rustls::TlsConnector>,
    idle: Mutex<Vec<Conn>>,
    headers: HeaderMap,
    timeout: Duration,
}

impl Client {
    /// A client for `url` with the headers, API key and CA bundle of `opts`, and `timeout`
    /// per request.
    pub fn new(
        url: &str,
        opts: &RequestOptions,
        timeout: Duration,
    ) -> Result<Arc<Client>, ReplayError> {
        let ep = parse_url(url).map_err(ReplayError::Config)?;
        let mut map = HeaderMap::new();
        let hv = |v: &str| {
            HeaderValue::from_str(v)
                .map_err(|_| ReplayError::Config(format!("header value {v:?} is not valid")))
        };
        map.insert(HOST, hv(&ep.authority)?);
        map.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(k) = &opts.api_key {
            map.insert(AUTHORIZATION, hv(&format!("Bearer {k}"))?);
        }
        for (k, v) in &opts.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| ReplayError::Config(format!("header name {k:?} is not valid")))?;
            map.insert(name, hv(v)?);
        }
        let tls = if ep.https {
            Some(tls_connector(opts.ca_cert.as_deref())?)
        } else {
            None
        };
        Ok(Arc::new(Client {
            ep,
            tls,
            idle: Mutex::new(Vec::new()),
            headers: map,
            timeout,
        }))
    }

    /// Opens a new connection.
    async fn connect(&self) -> Result<Conn, String> {
        let tcp = TcpStream::connect((self.ep.host.as_str(), self.ep.port))
            .await
            .map_err(|e| format!("connect {}: {e}", self.ep.authority))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => handshake(tcp).await,
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(self.ep.host.clone())
                    .map_err(|e| format!("server name {}: {e}", self.ep.host))?;
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS {}: {e}", self.ep.authority))?;
                handshake(stream).await
            }
        }
    }

    /// Opens `n` connections into the idle pool (before the clock starts).
    pub async fn preconnect(self: &Arc<Self>, n: usize) -> Result<usize, String> {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..n {
            let me = self.clone();
            set.spawn(async move { me.connect().await });
        }
        let mut opened = 0;
        let mut first_err = None;
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(s)) => {
                    self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(s);
                    opened += 1;
                }
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(e) => {
                    first_err.get_or_insert(e.to_string());
                }
            }
        }
        match (opened, first_err) {
            (0, Some(e)) if n > 0 => Err(e),
            _ => Ok(opened),
        }
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(c) = idle.pop() {
            if !c.sender.is_closed() {
                return Some(c);
            }
        }
        None
    }

    async fn put_idle(&self, mut c: Conn) {
        if c.settle().await {
            self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        }
    }

    /// Number of idle pooled connections.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn request(&self, path: &str, method: Method, body: Bytes) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = method;
        let full = format!("{}{}", self.ep.base_path, path);
        *req.uri_mut() = full.parse().unwrap_or_else(|_| http::Uri::from_static("/"));
        *req.headers_mut() = self.headers.clone();
        req
    }

    /// A simple GET returning status and body (for discovery: `/v1/models`, `/version`).
    pub async fn get(&self, path: &str) -> Result<(u16, Bytes), String> {
        let fut = async {
            let mut c = match self.take_idle() {
                Some(c) => c,
                None => self.connect().await?,
            };
            let req = self.request(path, Method::GET, Bytes::new());
            let sender = &mut c.sender;
            let r = Conn::drive(&mut c.driver, async move {
                let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
                let status = resp.status().as_u16();
                let body = resp
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?
                    .to_bytes();
                Ok::<_, String>((status, body))
            })
            .await?;
            self.put_idle(c).await;
            Ok(r)
        };
        match tokio::time::timeout(Duration::from_secs(10), fut).await {
            Ok(r) => r,
            Err(_) => Err(format!("GET {path}: no answer within 10 s")),
        }
    }

    /// Sends one request and reads its response to the end, recording every chunk's time.
    /// `request_id` goes out as `x-request-id` (vLLM takes it as its own request id), so
    /// server-side logs join the results.
    pub async fn execute(&self, req: &BuiltRequest, request_id: Option<&str>) -> Exchange {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (sender, new_connection, connect) = match self.take_idle() {
                Some(s) => (Ok(s), false, Duration::ZERO),
                None => {
                    let c0 = Instant::now();
                    let s = tokio::time::timeout(self.timeout, self.connect())
                        .await
                        .unwrap_or_else(|_| {
                            Err(format!("connect {}: timed out", self.ep.authority))
                        });
                    (s, true, c0.elapsed())
                }
            };
            let mut conn = match sender {
                Ok(c) => c,
                Err(e) => {
                    let now = Instant::now();
                    return Exchange::failed(now, true, connect, Outcome::UpstreamError, e);
                }
            };
            let mut http_req = self.request(&req.endpoint, Method::POST, req.body.clone());
            if let Some(v) = request_id.and_then(|id| HeaderValue::from_str(id).ok()) {
                http_req
                    .headers_mut()
                    .insert(HeaderName::from_static("x-request-id"), v);
            }
            let sender = &mut conn.sender;
            let stream = req.stream;
            let timeout = self.timeout;
            // t0 is taken in the same task that writes the request: the connection's I/O is
            // polled right after this future first returns Pending.
            let result = Conn::drive(&mut conn.driver, async move {
                let t0 = Instant::now();
                let deadline = tokio::time::Instant::from_std(t0 + timeout);
                match tokio::time::timeout_at(deadline, sender.send_request(http_req)).await {
                    Err(_) => Ok(Exchange::failed(
                        t0,
                        false,
                        Duration::ZERO,
                        Outcome::Timeout,
                        "no response headers within the timeout".into(),
                    )),
                    Ok(Err(e)) => Err((t0, e)),
                    Ok(Ok(resp)) => Ok(read_response(resp, t0, deadline, stream).await),
                }
            })
            .await;
            let mut ex = match result {
                Ok(ex) => ex,
                Err((t0, e)) => {
                    // A pooled connection the server closed meanwhile: retry once on a new one.
                    if !new_connection
                        && attempt == 1
                        && (e.is_canceled() || e.is_closed() || e.is_incomplete_message())
                    {
                        continue;
                    }
                    return Exchange::failed(
                        t0,
                        new_connection,
                        connect,
                        Outcome::UpstreamError,
                        format!("request failed: {e}"),
                    );
                }
            };
            ex.new_connection = new_connection;
            ex.connect = connect;
            if ex.outcome == Outcome::Ok || ex.outcome == Outcome::HttpError {
                self.put_idle(conn).await;
            }
            return ex;
        }
    }
}

/// rustls (ring) trusting the web PKI, or only the PEM bundle at `ca` (a private CA).
fn tls_connector(ca: Option<&std::path::Path>) -> Result<tokio_rustls::TlsConnector, ReplayError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Some(path) => {
            let bad = |e: String| ReplayError::Config(format!("--ca-cert {}: {e}", path.display()));
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| bad(e.to_string()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(e.to_string()))?;
            if certs.is_empty() {
                return Err(bad("no PEM certificate in the file".into()));
            }
            for c in certs {
                roots.add(c).map_err(|e| bad(e.to_string()))?;
            }
        }
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ReplayError::Config(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(cfg)))
}

async fn handshake<I>(io: I) -> Result<Conn, String>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    Ok(Conn {
        sender,
        driver: Box::pin(conn),
    })
}

impl Exchange {
    fn failed(
        t0: Instant,
        new_connection: bool,
        connect: Duration,
        outcome: Outcome,
        error: String,
    ) -> Exchange {
        Exchange {
            t0,
            new_connection,
            connect,
            status: None,
            outcome,
            error: Some(error),
            ttft_us: None,
            e2el_us: None,
            chunk_times_us: Vec::new(),
            chunk_tokens: None,
            prompt_tokens: None,
            completion_tokens: None,
            response_bytes: 0,
            end: Instant::now(),
        }
    }
}

fn us_since(t0: Instant, t: Instant) -> i64 {
    t.saturating_duration_since(t0).as_micros() as i64
}

/// Awaits `f` unless `deadline` (one timer per request, registered once) fires first.
async fn with_deadline<T>(
    deadline: &mut std::pin::Pin<&mut tokio::time::Sleep>,
    f: impl Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        v = f => Some(v),
        _ = deadline.as_mut() => None,
    }
}

/// Reads a response to its end, classifying what it got.
async fn read_response(
    resp: hyper::Response<hyper::body::Incoming>,
    t0: Instant,
    deadline: tokio::time::Instant,
    stream: bool,
) -> Exchange {
    let status = resp.status().as_u16();
    let is_sse = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut body = resp.into_body();
    let timer = tokio::time::sleep_until(deadline);
    tokio::pin!(timer);
    let mut ex = Exchange::failed(t0, false, Duration::ZERO, Outcome::Ok, String::new());
    ex.error = None;
    ex.status = Some(status);
    let ok_status = (200..300).contains(&status);

    if !ok_status || !stream || !is_sse {
        // Read the whole body (an error text, a JSON response, or a non-SSE answer to a
        // streamed request).
        let mut buf = Vec::new();
        let mut first: Option<Instant> = None;
        let mut failed = None;
        loop {
            match with_deadline(&mut timer, body.frame()).await {
                None => {
                    failed = Some((
                        Outcome::Timeout,
                        "response not complete within the timeout".to_string(),
                    ));
                    break;
                }
                Some(None) => break,
                Some(Some(Err(e))) => {
                    failed = Some((Outcome::UpstreamError, format!("response body: {e}")));
                    break;
                }
                Some(Some(Ok(f))) => {
                    if let Ok(d) = f.into_data() {
                        first.get_or_insert_with(Instant::now);
                        buf.extend_from_slice(&d);
                    }
                }
            }
        }
        let end = Instant::now();
        ex.end = end;
        ex.response_bytes = buf.len() as i64;
        if let Some((o, e)) = failed {
            ex.outcome = o;
            ex.error = Some(e);
            return ex;
        }
        if !ok_status {
            ex.outcome = Outcome::HttpError;
            let text = String::from_utf8_lossy(&buf[..buf.len().min(1024)]).into_owned();
            ex.error = Some(format!("HTTP {status}: {text}"));
            return ex;
        }
        if stream {
            // Asked for a stream; got something else.
            ex.outcome = Outcome::UpstreamError;
            ex.error = Some("streamed request answered without text/event-stream".into());
            return ex;
        }
        let e2el = us_since(t0, end);
        ex.e2el_us = Some(e2el);
        ex.ttft_us = Some(e2el);
        match response_usage(&buf) {
            Some(u) => {
                ex.prompt_tokens = u.prompt_tokens;
                ex.completion_tokens = u.completion_tokens;
            }
            None => {
                if serde_json::from_slice::<serde::de::IgnoredAny>(&buf).is_err() {
                    ex.outcome = Outcome::UpstreamError;
                    ex.error = Some("response is not JSON".into());
                }
            }
        }
        return ex;
    }

    let mut parser = SseParser::new();
    let mut chunks: Vec<i64> = Vec::with_capacity(128);
    let mut cumulative: Vec<i64> = Vec::new();
    let mut usage = None;
    let mut done = false;
    let mut stream_error: Option<String> = None;
    let mut invalid = 0usize;
    let mut bytes = 0i64;
    loop {
        match with_deadline(&mut timer, body.frame()).await {
            None => {
                ex.outcome = Outcome::Timeout;
                ex.error = Some(format!(
                    "stream not complete within the timeout after {} chunks",
                    chunks.len()
                ));
                break;
            }
            Some(None) => break,
            Some(Some(Err(e))) => {
                ex.outcome = Outcome::UpstreamError;
                ex.error = Some(format!("stream broken after {} chunks: {e}", chunks.len()));
                break;
            }
            Some(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let t = us_since(t0, Instant::now());
                bytes += data.len() as i64;
                parser.feed(&data, |ev| match classify(ev) {
                    StreamEvent::Chunk { usage: u } => {
                        chunks.push(t);
                        if let Some(u) = u {
                            if let Some(c) = u.completion_tokens {
                                cumulative.push(c);
                            }
                            usage = Some(u);
                        }
                    }
                    StreamEvent::Usage(u) => usage = Some(u),
                    StreamEvent::Done => done = true,
                    StreamEvent::Error(m) => {
                        stream_error.get_or_insert(m);
                    }
                    StreamEvent::Other => {}
                    StreamEvent::Invalid => invalid += 1,
                });
            }
        }
    }
    ex.end = Instant::now();
    ex.response_bytes = bytes;
    if ex.outcome == Outcome::Ok {
        if let Some(m) = stream_error {
            ex.outcome = Outcome::UpstreamError;
            ex.error = Some(format!("error event in stream: {m}"));
        } else if !done {
            ex.outcome = Outcome::UpstreamError;
            ex.error = Some(format!(
                "stream ended without [DONE] after {} chunks",
                chunks.len()
            ));
        } else if invalid > 0 && chunks.is_empty() {
            ex.outcome = Outcome::UpstreamError;
            ex.error = Some(format!("{invalid} events were not JSON"));
        }
    }
    ex.ttft_us = chunks.first().copied();
    ex.e2el_us = chunks
        .last()
        .copied()
        .or_else(|| (ex.outcome == Outcome::Ok).then(|| us_since(t0, ex.end)));
    if let Some(u) = usage {
        ex.prompt_tokens = u.prompt_tokens;
        ex.completion_tokens = u.completion_tokens;
    }
    if !cumulative.is_empty() && cumulative.len() == chunks.len() {
        let mut prev = 0;
        ex.chunk_tokens = Some(
            cumulative
                .iter()
                .map(|&c| {
                    let d = (c - prev).clamp(0, i64::from(i32::MAX)) as i32;
                    prev = c;
                    d
                })
                .collect(),
        );
    }
    ex.chunk_times_us = chunks;
    ex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let e = parse_url("http://127.0.0.1:8000").unwrap();
        assert_eq!(
            (e.https, e.host.as_str(), e.port, e.base_path.as_str()),
            (false, "127.0.0.1", 8000, "")
        );
        let e = parse_url("https://api.example.com/proxy/").unwrap();
        assert_eq!(
            (e.https, e.port, e.base_path.as_str()),
            (true, 443, "/proxy")
        );
        let e = parse_url("http://[::1]:9").unwrap();
        assert_eq!(e.host, "::1");
        assert!(parse_url("ftp://x").is_err());
    }
}
