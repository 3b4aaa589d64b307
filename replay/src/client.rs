//! The HTTP/SSE client: [`wire`]'s connection pool and lean HTTP/1.1 connections (plain or
//! rustls), so each request knows whether its connection was new and how long connecting
//! took, and t0 is taken when the request is written, after any connecting. Requests follow
//! the wire's retry rule ([`wire::Pool::send`]): one is sent again only when not one byte of
//! it reached a connection, so the target sees every trace row exactly once, and a pooled
//! connection the target closed is found and replaced before any byte goes out.
//!
//! The per-chunk path takes one clock reading per socket read, feeds the shared SSE parser
//! straight from the read buffer, and pushes an integer; no lock, no channel, no allocation
//! beyond the growth of the request's own vectors, no tokenizer.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use trace_format::Outcome;
use wire::sse::{response_usage, SseParser, StreamEvent};
use wire::{Conn, Head, Pool, PoolConfig, PoolStats, SendError, Sent};

use crate::config::{Endpoint, RequestOptions};
use crate::error::ReplayError;
use crate::request::BuiltRequest;

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Bytes of an error body (or of a non-SSE answer to a streamed request) kept for the
/// error text; the rest is read and discarded as it arrives, so a huge error body costs no
/// memory and the connection stays reusable.
const ERROR_TEXT_KEPT: usize = 1024;

/// A head's `content-type` starts with `text/event-stream`.
fn is_sse(r: &httparse::Response<'_, '_>) -> Result<bool, String> {
    Ok(r.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("content-type")
            && h.value
                .trim_ascii_start()
                .get(..17)
                .is_some_and(|p| p.eq_ignore_ascii_case(b"text/event-stream"))
    }))
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
    /// The generated text, when the client was asked to keep it (a tokenizer is configured)
    /// and the server sent no `usage.completion_tokens`: what the tokenizer counts.
    pub output_text: Option<String>,
    /// Response body bytes.
    pub response_bytes: i64,
    /// Instant the exchange ended.
    pub end: Instant,
}

/// A keep-alive HTTP/1.1 client for one target.
pub struct Client {
    ep: Endpoint,
    pool: Arc<Pool>,
    /// The header lines every request carries (host, content type, key, --header),
    /// rendered once.
    headers: Vec<u8>,
    timeout: Duration,
    /// Keep the generated text of responses without usage (a tokenizer will count it).
    want_text: bool,
}

impl Client {
    /// A client for the target at `ep` (parsed by [`crate::ReplayConfig::validate`]) with
    /// the headers, API key, CA bundle and connection settings of `opts`, and `timeout` per
    /// request (from its write; connecting has its own timeout).
    pub fn new(
        ep: &Endpoint,
        opts: &RequestOptions,
        timeout: Duration,
    ) -> Result<Arc<Client>, ReplayError> {
        let ep = ep.clone();
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
        let target = if ep.https {
            wire::Target::tls(
                &ep.host,
                ep.port,
                &ep.authority,
                tls_connector(opts.ca_cert.as_deref())?,
            )
            .map_err(ReplayError::Config)?
        } else {
            wire::Target::plain(&ep.host, ep.port, &ep.authority)
        };
        let pool = Pool::new(
            target,
            PoolConfig {
                connect_timeout: opts.connect_timeout,
                idle_timeout: opts.pool_idle_timeout,
                stamp_reads: true,
                ..PoolConfig::default()
            },
        );
        Ok(Arc::new(Client {
            ep,
            pool: Arc::new(pool),
            headers: map,
            timeout,
            want_text: opts.tokenizer.is_some(),
        }))
    }

    /// Makes the idle pool hold `n` usable connections right before the clock starts:
    /// drops those the target closed or that idled too long meanwhile (a `--start-at` wait,
    /// warm-ups), opens the rest. Returns (kept, opened).
    pub async fn refresh(&self, n: usize) -> Result<(usize, usize), String> {
        self.pool.refresh(n).await.map_err(|e| e.to_string())
    }

    /// What the pool did with its connections so far.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
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
            let req = self.request("GET", path, &[], None);
            let Sent { mut conn, .. } = self
                .pool
                .send(&req, Duration::from_secs(10))
                .await
                .map_err(|e| format!("GET {path}: {e}"))?;
            let (head, t) = conn
                .read_head(MAX_HEAD, |_| Ok(()))
                .await
                .map_err(|e| format!("GET {path}: {e}"))?;
            let mut body = Vec::new();
            let reusable = conn
                .read_body(head.framing, t, |d, _| body.extend_from_slice(d))
                .await
                .map_err(|e| format!("GET {path}: {e}"))?;
            if reusable && head.keep_alive {
                self.pool.checkin(conn);
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
        // t0 is taken in the task that writes the request, right before the write, after
        // any connecting; the request timeout runs from it.
        let Sent {
            mut conn,
            reused,
            connect,
            t0,
        } = match self.pool.send(&bytes, self.timeout).await {
            Ok(s) => s,
            Err(e) => {
                let (t0, new, connect, outcome) = match e {
                    SendError::Connect { spent, .. } => {
                        (Instant::now(), true, spent, Outcome::UpstreamError)
                    }
                    SendError::Write {
                        t0,
                        reused,
                        connect,
                        ..
                    } => (t0, !reused, connect, Outcome::UpstreamError),
                    SendError::WriteTimeout {
                        t0,
                        reused,
                        connect,
                    } => (t0, !reused, connect, Outcome::Timeout),
                };
                return Exchange::failed(t0, new, connect, outcome, e.to_string());
            }
        };
        let new_connection = !reused;
        let failed = |outcome, error| Exchange::failed(t0, new_connection, connect, outcome, error);
        // One timer: the request timeout, or the recorded client's cancellation when that
        // comes first.
        let limit = t0 + self.timeout;
        let cancel_at = req.cancel.and_then(|c| c.after).map(|d| t0 + d);
        let by_cancel = cancel_at.is_some_and(|c| c <= limit);
        let deadline = cancel_at.map_or(limit, |c| c.min(limit));
        let timer = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
        tokio::pin!(timer);
        let ends = Ends {
            by_cancel,
            after_chunks: req.cancel.and_then(|c| c.after_chunks),
        };
        let head = match with_deadline(&mut timer, conn.read_head(MAX_HEAD, is_sse)).await {
            None if by_cancel => return failed(Outcome::ClientCancelled, ends.cancelled(t0)),
            None => {
                return failed(
                    Outcome::Timeout,
                    "no response headers within the timeout".into(),
                )
            }
            // The request was written: whatever the server did with it, it is not sent
            // again (the retry rule), and the failure is the server's.
            Some(Err(e)) => return failed(Outcome::UpstreamError, format!("request failed: {e}")),
            Some(Ok(h)) => h,
        };
        let keep_alive = head.0.keep_alive;
        let (mut ex, reusable) = read_response(
            &mut conn,
            head,
            t0,
            &mut timer,
            req.stream,
            ends,
            self.want_text,
        )
        .await;
        ex.new_connection = new_connection;
        ex.connect = connect;
        if reusable && keep_alive && (ex.outcome == Outcome::Ok || ex.outcome == Outcome::HttpError)
        {
            self.pool.checkin(conn);
        }
        ex
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
            output_text: None,
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

/// How a request may end before its response does: its timer is the recorded client's
/// cancellation (`by_cancel`), or it is cancelled after as many output chunks as the recorded
/// client received.
#[derive(Debug, Clone, Copy)]
struct Ends {
    by_cancel: bool,
    after_chunks: Option<usize>,
}

impl Ends {
    fn cancelled(&self, t0: Instant) -> String {
        format!(
            "cancelled as recorded, {:.1} ms after send",
            t0.elapsed().as_secs_f64() * 1e3
        )
    }
}

/// Reads a response to its end, classifying what it got; also says whether the
/// connection ended the response cleanly (reusable).
async fn read_response(
    conn: &mut Conn,
    (head, t_head): (Head<bool>, Instant),
    t0: Instant,
    timer: &mut std::pin::Pin<&mut tokio::time::Sleep>,
    stream: bool,
    ends: Ends,
    want_text: bool,
) -> (Exchange, bool) {
    let status = head.status;
    let mut ex = Exchange::failed(t0, false, Duration::ZERO, Outcome::Ok, String::new());
    ex.error = None;
    ex.status = Some(status);
    let ok_status = (200..300).contains(&status);

    if !ok_status || !stream || !head.extra {
        // Read the body to its end: a JSON response whole (its usage is at the end); of an
        // error text, or a non-SSE answer to a streamed request, only the first KiB.
        let keep = if ok_status && !stream {
            usize::MAX
        } else {
            ERROR_TEXT_KEPT
        };
        let mut buf = Vec::new();
        let mut total = 0i64;
        let read = with_deadline(
            timer,
            conn.read_body(head.framing, t_head, |d, _| {
                total += d.len() as i64;
                let room = keep - buf.len();
                buf.extend_from_slice(&d[..d.len().min(room)]);
            }),
        )
        .await;
        let end = Instant::now();
        ex.end = end;
        ex.response_bytes = total;
        let reusable = match read {
            None if ends.by_cancel => {
                ex.outcome = Outcome::ClientCancelled;
                ex.error = Some(ends.cancelled(t0));
                return (ex, false);
            }
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
            let text = String::from_utf8_lossy(&buf).into_owned();
            ex.error = Some(format!("HTTP {status}: {text}"));
            return (ex, reusable);
        }
        if stream {
            // Asked for a stream; got something else.
            ex.outcome = Outcome::UpstreamError;
            ex.error = Some("streamed request answered without text/event-stream".into());
            return (ex, false);
        }
        // Not streamed: E2EL only; there is no first token to time.
        ex.e2el_us = Some(us_since(t0, end));
        match response_usage(&buf) {
            Some(u) => {
                ex.prompt_tokens = u.prompt_tokens;
                ex.completion_tokens = u.completion_tokens;
                if want_text && u.completion_tokens.is_none() {
                    ex.output_text = wire::sse::response_text(&buf);
                }
            }
            None => {
                if want_text {
                    ex.output_text = wire::sse::response_text(&buf);
                }
                if serde_json::from_slice::<serde::de::IgnoredAny>(&buf).is_err() {
                    ex.outcome = Outcome::UpstreamError;
                    ex.error = Some("response is not JSON".into());
                }
            }
        }
        return (ex, reusable);
    }

    let mut parser = SseParser::new();
    // Chunks that carried generated output (TTFT, ITL), and the last chunk of any kind
    // (E2EL): a role-only or empty chunk is not a token.
    let mut chunks: Vec<i64> = Vec::with_capacity(128);
    let mut last_chunk: Option<i64> = None;
    let mut cumulative: Vec<i64> = Vec::new();
    let mut usage = None;
    let mut done = false;
    let mut stream_error: Option<String> = None;
    let mut invalid = 0usize;
    let mut bytes = 0i64;
    let mut text = want_text.then(String::new);
    // Each event's text, read in the parse that classifies it (a buffer reused per event).
    let mut text_buf = want_text.then(wire::sse::ChunkText::default);
    let read = with_deadline(
        timer,
        conn.read_body_while(head.framing, t_head, |data, at| {
            let t = us_since(t0, at);
            bytes += data.len() as i64;
            parser.feed(data, |ev| {
                match wire::sse::read_event(ev, text_buf.as_mut()) {
                    StreamEvent::Chunk { usage: u, output } => {
                        last_chunk = Some(t);
                        if output {
                            chunks.push(t);
                            if let (Some(text), Some(b)) = (text.as_mut(), &text_buf) {
                                text.push_str(&b.output);
                            }
                        }
                        if let Some(u) = u {
                            // Tokens of a chunk without output count with the next one that
                            // has some.
                            if let (true, Some(c)) = (output, u.completion_tokens) {
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
                }
            });
            // The recorded client cancelled after this many output chunks: so does this one.
            ends.after_chunks.is_none_or(|n| chunks.len() < n)
        }),
    )
    .await;
    let mut reusable = false;
    match read {
        None if ends.by_cancel => {
            ex.outcome = Outcome::ClientCancelled;
            ex.error = Some(ends.cancelled(t0));
        }
        Some(Ok(None)) => {
            ex.outcome = Outcome::ClientCancelled;
            ex.error = Some(format!(
                "cancelled as recorded, after {} chunks",
                chunks.len()
            ));
        }
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
        Some(Ok(Some(r))) => reusable = r,
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
    ex.e2el_us = last_chunk.or_else(|| (ex.outcome == Outcome::Ok).then(|| us_since(t0, ex.end)));
    if let Some(u) = usage {
        ex.prompt_tokens = u.prompt_tokens;
        ex.completion_tokens = u.completion_tokens;
    }
    if ex.completion_tokens.is_none() {
        ex.output_text = text;
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
