//! The HTTP/SSE client: a keep-alive connection pool of our own over lean HTTP/1.1
//! connections (plain or rustls, [`crate::http1`]), so each request knows whether its
//! connection was new and how long connecting took, and t0 is taken when the request is
//! written, after any connecting.
//!
//! The per-chunk path takes one clock reading per socket read, feeds the shared SSE parser
//! straight from the read buffer, and pushes an integer; no lock, no channel, no allocation
//! beyond the growth of the request's own vectors, no tokenizer.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::TcpStream;
use trace_format::sse::{classify, response_usage, SseParser, StreamEvent};
use trace_format::Outcome;

use crate::config::RequestOptions;
use crate::error::ReplayError;
use crate::http1::{Conn, Head, Io, ReadError, Stamped};
use crate::prompt::BuiltRequest;

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
    /// The header lines every request carries (host, content type, key, --header),
    /// rendered once.
    headers: Vec<u8>,
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
        let mut lines: Vec<(String, String)> = vec![
            ("host".into(), ep.authority.clone()),
            ("content-type".into(), "application/json".into()),
        ];
        if let Some(k) = &opts.api_key {
            lines.push(("authorization".into(), format!("Bearer {k}")));
        }
        for (k, v) in &opts.headers {
            let name = http::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| ReplayError::Config(format!("header name {k:?} is not valid")))?;
            if http::HeaderValue::from_str(v).is_err() || v.contains(['\r', '\n']) {
                return Err(ReplayError::Config(format!(
                    "header value {v:?} is not valid"
                )));
            }
            // A --header replaces a default of the same name.
            lines.retain(|(n, _)| n != name.as_str());
            lines.push((name.as_str().to_string(), v.clone()));
        }
        let mut map = Vec::new();
        for (k, v) in &lines {
            map.extend_from_slice(k.as_bytes());
            map.extend_from_slice(b": ");
            map.extend_from_slice(v.as_bytes());
            map.extend_from_slice(b"\r\n");
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
        let tcp = Stamped::new(tcp);
        match &self.tls {
            None => Ok(Conn::new(Io::Plain(tcp))),
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(self.ep.host.clone())
                    .map_err(|e| format!("server name {}: {e}", self.ep.host))?;
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS {}: {e}", self.ep.authority))?;
                Ok(Conn::new(Io::Tls(Box::new(stream))))
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
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn put_idle(&self, c: Conn) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(c);
    }

    /// Number of idle pooled connections.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The request bytes: request line, the shared header lines, `x-request-id`, the
    /// length and the body, in one buffer (one write).
    fn request(&self, method: &str, path: &str, body: &[u8], request_id: Option<&str>) -> Vec<u8> {
        let mut r = Vec::with_capacity(256 + self.headers.len() + body.len());
        r.extend_from_slice(method.as_bytes());
        r.push(b' ');
        if self.ep.base_path.is_empty() && path.is_empty() {
            r.push(b'/');
        }
        r.extend_from_slice(self.ep.base_path.as_bytes());
        r.extend_from_slice(path.as_bytes());
        r.extend_from_slice(b" HTTP/1.1\r\n");
        r.extend_from_slice(&self.headers);
        if let Some(id) = request_id.filter(|id| !id.contains(['\r', '\n'])) {
            r.extend_from_slice(b"x-request-id: ");
            r.extend_from_slice(id.as_bytes());
            r.extend_from_slice(b"\r\n");
        }
        if method != "GET" || !body.is_empty() {
            r.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
        }
        r.extend_from_slice(b"\r\n");
        r.extend_from_slice(body);
        r
    }

    /// A simple GET returning status and body (for discovery: `/v1/models`, `/version`,
    /// `/metrics`).
    pub async fn get(&self, path: &str) -> Result<(u16, Bytes), String> {
        let fut = async {
            let mut c = match self.take_idle() {
                Some(c) => c,
                None => self.connect().await?,
            };
            let req = self.request("GET", path, &[], None);
            c.send(&req).await.map_err(|e| format!("GET {path}: {e}"))?;
            let (head, t) = c
                .read_head()
                .await
                .map_err(|e| format!("GET {path}: {e}"))?;
            let mut body = Vec::new();
            let reusable = c
                .read_body(head.framing, t, |d, _| body.extend_from_slice(d))
                .await
                .map_err(|e| format!("GET {path}: {e}"))?;
            if reusable && !head.close {
                self.put_idle(c);
            }
            Ok((head.status, Bytes::from(body)))
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
        let bytes = self.request("POST", &req.endpoint, &req.body, request_id);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (conn, new_connection, connect) = match self.take_idle() {
                Some(c) => (Ok(c), false, Duration::ZERO),
                None => {
                    let c0 = Instant::now();
                    let c = tokio::time::timeout(self.timeout, self.connect())
                        .await
                        .unwrap_or_else(|_| {
                            Err(format!("connect {}: timed out", self.ep.authority))
                        });
                    (c, true, c0.elapsed())
                }
            };
            let mut conn = match conn {
                Ok(c) => c,
                Err(e) => {
                    let now = Instant::now();
                    return Exchange::failed(now, true, connect, Outcome::UpstreamError, e);
                }
            };
            // A pooled connection the server closed meanwhile fails before any response
            // byte: retry once on a new connection.
            let may_retry = !new_connection && attempt == 1;
            let failed =
                |t0, outcome, error| Exchange::failed(t0, new_connection, connect, outcome, error);
            // t0 is taken in the task that writes the request, right before the write.
            let t0 = Instant::now();
            let timer = tokio::time::sleep_until(tokio::time::Instant::from_std(t0 + self.timeout));
            tokio::pin!(timer);
            match with_deadline(&mut timer, conn.send(&bytes)).await {
                None => {
                    return failed(
                        t0,
                        Outcome::Timeout,
                        "request not sent within the timeout".into(),
                    )
                }
                Some(Err(_)) if may_retry => continue,
                Some(Err(e)) => {
                    return failed(t0, Outcome::UpstreamError, format!("request failed: {e}"))
                }
                Some(Ok(())) => {}
            }
            let head = match with_deadline(&mut timer, conn.read_head()).await {
                None => {
                    return failed(
                        t0,
                        Outcome::Timeout,
                        "no response headers within the timeout".into(),
                    )
                }
                Some(Err(ReadError::ClosedBeforeResponse | ReadError::Io(_))) if may_retry => {
                    continue
                }
                Some(Err(e)) => {
                    return failed(t0, Outcome::UpstreamError, format!("request failed: {e}"))
                }
                Some(Ok(h)) => h,
            };
            let close = head.0.close;
            let (mut ex, reusable) =
                read_response(&mut conn, head, t0, &mut timer, req.stream).await;
            ex.new_connection = new_connection;
            ex.connect = connect;
            if reusable && !close && (ex.outcome == Outcome::Ok || ex.outcome == Outcome::HttpError)
            {
                self.put_idle(conn);
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

/// Reads a response to its end, classifying what it got; also says whether the
/// connection ended the response cleanly (reusable).
async fn read_response(
    conn: &mut Conn,
    (head, t_head): (Head, Instant),
    t0: Instant,
    timer: &mut std::pin::Pin<&mut tokio::time::Sleep>,
    stream: bool,
) -> (Exchange, bool) {
    let status = head.status;
    let mut ex = Exchange::failed(t0, false, Duration::ZERO, Outcome::Ok, String::new());
    ex.error = None;
    ex.status = Some(status);
    let ok_status = (200..300).contains(&status);

    if !ok_status || !stream || !head.sse {
        // Read the whole body (an error text, a JSON response, or a non-SSE answer to a
        // streamed request).
        let mut buf = Vec::new();
        let read = with_deadline(
            timer,
            conn.read_body(head.framing, t_head, |d, _| buf.extend_from_slice(d)),
        )
        .await;
        let end = Instant::now();
        ex.end = end;
        ex.response_bytes = buf.len() as i64;
        let reusable = match read {
            None => {
                ex.outcome = Outcome::Timeout;
                ex.error = Some("response not complete within the timeout".into());
                return (ex, false);
            }
            Some(Err(e)) => {
                ex.outcome = Outcome::UpstreamError;
                ex.error = Some(format!("response body: {e}"));
                return (ex, false);
            }
            Some(Ok(r)) => r,
        };
        if !ok_status {
            ex.outcome = Outcome::HttpError;
            let text = String::from_utf8_lossy(&buf[..buf.len().min(1024)]).into_owned();
            ex.error = Some(format!("HTTP {status}: {text}"));
            return (ex, reusable);
        }
        if stream {
            // Asked for a stream; got something else.
            ex.outcome = Outcome::UpstreamError;
            ex.error = Some("streamed request answered without text/event-stream".into());
            return (ex, false);
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
        return (ex, reusable);
    }

    let mut parser = SseParser::new();
    let mut chunks: Vec<i64> = Vec::with_capacity(128);
    let mut cumulative: Vec<i64> = Vec::new();
    let mut usage = None;
    let mut done = false;
    let mut stream_error: Option<String> = None;
    let mut invalid = 0usize;
    let mut bytes = 0i64;
    let read = with_deadline(
        timer,
        conn.read_body(head.framing, t_head, |data, at| {
            let t = us_since(t0, at);
            bytes += data.len() as i64;
            parser.feed(data, |ev| match classify(ev) {
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
        }),
    )
    .await;
    let mut reusable = false;
    match read {
        None => {
            ex.outcome = Outcome::Timeout;
            ex.error = Some(format!(
                "stream not complete within the timeout after {} chunks",
                chunks.len()
            ));
        }
        Some(Err(e)) => {
            ex.outcome = Outcome::UpstreamError;
            ex.error = Some(format!("stream broken after {} chunks: {e}", chunks.len()));
        }
        Some(Ok(r)) => reusable = r,
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
    (ex, reusable)
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
