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
use trace_format::tracectx::{self, TraceContext};
use trace_format::Outcome;
use wire::api::Api;
use wire::response_verdict::{self, judge_stream, judge_whole, End, Rules, StreamTally, Verdict};
use wire::sse::SseParser;
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
    /// First chunk carrying answer output (not reasoning only) − t0, µs.
    pub ttfat_us: Option<i64>,
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
    /// The prompt's part the server read from its cache, when its usage says.
    pub cached_tokens: Option<i64>,
    /// The generated text, when the client was asked to keep it (a tokenizer is configured)
    /// and the server sent no `usage.completion_tokens`: what the tokenizer counts.
    pub output_text: Option<String>,
    /// `usage.completion_tokens_details.reasoning_tokens`.
    pub reasoning_tokens: Option<i64>,
    /// The response's id (what a later Responses turn names as `previous_response_id`).
    pub response_id: Option<String>,
    /// What was seen of the reasoning when the server reported no count: how many
    /// reasoning-only chunks, and their text when the client keeps text (a tokenizer will
    /// count it); for a whole body, its reasoning text (its length estimates the count
    /// without a tokenizer). None: nothing observed (an error, a cut before any output).
    pub reasoning_seen: Option<(usize, Option<String>)>,
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
    /// Requests carry a `traceparent` ([`RequestOptions::traceparent`], and no `--header`
    /// of that name).
    traceparent: bool,
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
        let traceparent =
            opts.traceparent && !lines.iter().any(|(n, _)| n == tracectx::TRACEPARENT);
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
            traceparent,
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

    /// Whether requests carry a `traceparent` (the context [`Client::execute`] is given).
    pub fn sends_traceparent(&self) -> bool {
        self.traceparent
    }

    /// The request bytes: request line, the shared header lines, `x-request-id`,
    /// `traceparent`, the length and the body, in one buffer (one write).
    fn request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        request_id: Option<&str>,
        trace: Option<&TraceContext>,
    ) -> Vec<u8> {
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
        // Written in place: this is every request's send path (formatting the traceparent
        // through `format!` cost ~2,500 instructions and four allocations a request).
        if let Some(t) = trace.filter(|_| self.traceparent) {
            r.extend_from_slice(tracectx::TRACEPARENT.as_bytes());
            r.extend_from_slice(b": ");
            r.extend_from_slice(&t.value());
            r.extend_from_slice(b"\r\n");
        }
        if method != "GET" || !body.is_empty() {
            use std::io::Write;
            // Writing into a Vec cannot fail.
            let _ = write!(r, "content-length: {}\r\n", body.len());
        }
        r.extend_from_slice(b"\r\n");
        r.extend_from_slice(body);
        r
    }

    /// A simple GET returning status and body (for discovery: `/v1/models`, `/version`,
    /// `/metrics`).
    pub async fn get(&self, path: &str) -> Result<(u16, Bytes), String> {
        let fut = async {
            let req = self.request("GET", path, &[], None, None);
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
    pub async fn execute(
        &self,
        req: &BuiltRequest,
        request_id: Option<&str>,
        trace: Option<&TraceContext>,
    ) -> Exchange {
        let bytes = self.request("POST", &req.endpoint, &req.body, request_id, trace);
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
            None if by_cancel => {
                let mut ex = failed(Outcome::ClientCancelled, ends.cancelled(t0));
                ex.e2el_us = ex.outcome.e2el_us(None, us_since(t0, ex.end));
                return ex;
            }
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
            (req.api, req.stream),
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
    /// Takes the response verdict's outcome, error, usage and tokens per chunk.
    fn set_verdict(&mut self, v: Verdict) {
        self.outcome = v.outcome.into();
        self.error = v.error;
        self.prompt_tokens = v.prompt_tokens;
        self.completion_tokens = v.completion_tokens;
        self.cached_tokens = v.cached_tokens;
        self.chunk_tokens = v.chunk_tokens;
        self.reasoning_tokens = v.reasoning_tokens;
        self.response_id = v.response_id;
    }

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
            ttfat_us: None,
            e2el_us: None,
            chunk_times_us: Vec::new(),
            chunk_tokens: None,
            prompt_tokens: None,
            completion_tokens: None,
            cached_tokens: None,
            output_text: None,
            reasoning_tokens: None,
            response_id: None,
            reasoning_seen: None,
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
    (api, stream): (Api, bool),
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
        let (how, reusable) = match read {
            None if ends.by_cancel => (End::Cancelled(ends.cancelled(t0)), false),
            None => (
                End::TimedOut("response not complete within the timeout".into()),
                false,
            ),
            Some(Err(e)) => (End::Broken(format!("response body: {e}")), false),
            Some(Ok(r)) => (End::Complete, r),
        };
        let v = judge_whole(api, status, &buf, stream, how, Rules::REPLAY);
        // Read whole: E2EL only (there is no first token to time), by the rule capture
        // records it with.
        ex.e2el_us = Outcome::from(v.outcome).e2el_us(None, us_since(t0, end));
        if v.outcome == response_verdict::Outcome::Ok {
            // Without usage the text is counted (with a tokenizer) or its bytes estimate the
            // count (trace_format::tokens): read only then.
            let text_wanted = api.generates() && v.completion_tokens.is_none();
            // Reasoning is read only when the body names it at all (one SIMD search).
            let reasoning_named = v.reasoning_tokens.is_none()
                && memchr::memmem::find(&buf, api.reasoning_marker()).is_some();
            let whole = (text_wanted || reasoning_named)
                .then(|| wire::sse::read_whole(api, &buf))
                .flatten();
            if text_wanted {
                ex.output_text = whole.as_ref().map(|w| w.output.clone());
            }
            if v.reasoning_tokens.is_none() {
                let text = whole.map(|w| w.reasoning).filter(|t| !t.is_empty());
                ex.reasoning_seen = Some((usize::from(text.is_some()), text));
            }
        }
        // Asked for a stream, got something else: the connection is not reused.
        let reusable = reusable && !(ok_status && stream);
        ex.set_verdict(v);
        return (ex, reusable);
    }

    let mut parser = SseParser::new();
    // Chunks that carried generated output (TTFT, ITL), and the last chunk of any kind
    // (E2EL): a role-only or empty chunk is not a token.
    let mut tally = StreamTally::with_capacity(128);
    let mut bytes = 0i64;
    let mut text = want_text.then(String::new);
    let mut reasoning = want_text.then(String::new);
    // Each event's text, read in the parse that classifies it (a buffer reused per event).
    let mut text_buf = want_text.then(wire::sse::ChunkText::default);
    let read = with_deadline(
        timer,
        conn.read_body_while(head.framing, t_head, |data, at| {
            let t = us_since(t0, at);
            bytes += data.len() as i64;
            parser.feed(data, |ev| {
                if tally.note(t, wire::sse::read_event_of(api, ev, text_buf.as_mut())) {
                    if let (Some(text), Some(r), Some(b)) =
                        (text.as_mut(), reasoning.as_mut(), &text_buf)
                    {
                        text.push_str(&b.output);
                        r.push_str(&b.reasoning);
                    }
                }
            });
            // The recorded client cancelled after this many output chunks: so does this one.
            ends.after_chunks
                .is_none_or(|n| tally.chunk_times_us.len() < n)
        }),
    )
    .await;
    let n = tally.chunk_times_us.len();
    let (how, reusable) = match read {
        None if ends.by_cancel => (End::Cancelled(ends.cancelled(t0)), false),
        Some(Ok(None)) => (
            End::Cancelled(format!("cancelled as recorded, after {n} chunks")),
            false,
        ),
        None => (
            End::TimedOut(format!(
                "stream not complete within the timeout after {n} chunks"
            )),
            false,
        ),
        Some(Err(e)) => (
            End::Broken(format!("stream broken after {n} chunks: {e}")),
            false,
        ),
        Some(Ok(Some(r))) => (End::Complete, r),
    };
    ex.end = Instant::now();
    ex.response_bytes = bytes;
    let v = judge_stream(status, &tally, how);
    ex.ttft_us = tally.chunk_times_us.first().copied();
    ex.ttfat_us = tally.first_answer_us;
    if v.reasoning_tokens.is_none() && !tally.chunk_times_us.is_empty() {
        ex.reasoning_seen = Some((tally.reasoning_chunks, reasoning));
    }
    ex.e2el_us = Outcome::from(v.outcome).e2el_us(tally.last_chunk_us, us_since(t0, ex.end));
    if v.completion_tokens.is_none() {
        ex.output_text = text;
    }
    ex.set_verdict(v);
    ex.chunk_times_us = tally.chunk_times_us;
    (ex, reusable)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves one scripted response to one request on 127.0.0.1, then stops.
    fn one_response(response: Vec<u8>) -> (String, std::thread::JoinHandle<()>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            // The request: its head, then content-length bytes.
            loop {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "the request ended early");
                req.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&req);
                if let Some(head_end) = text.find("\r\n\r\n") {
                    let len = text[..head_end]
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                    if req.len() >= head_end + 4 + len {
                        break;
                    }
                }
            }
            s.write_all(&response).unwrap();
        });
        (url, server)
    }

    /// The exchange of one request (`stream` or not) answered with `response`.
    fn exchange_with(response: &[u8], stream: bool) -> Exchange {
        let (url, server) = one_response(response.to_vec());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ex = rt.block_on(async {
            let opts = crate::config::ReplayConfig::new(Vec::new()).request;
            let client = Client::new(
                &crate::config::Endpoint::parse(&url).unwrap(),
                &opts,
                Duration::from_secs(10),
            )
            .unwrap();
            let req = BuiltRequest {
                endpoint: "/v1/completions".into(),
                api: Api::Completions,
                parent_id_at: None,
                stream,
                body: Bytes::from_static(b"{}"),
                max_tokens: None,
                cancel: None,
                captured: crate::request::Captured {
                    status: None,
                    outcome: Outcome::Ok,
                    synthesized_body: false,
                },
            };
            client.execute(&req, None, None).await
        });
        server.join().unwrap();
        ex
    }

    /// Responses judged by the rule capture records them with: a 2xx that is not what was
    /// asked for is the server's failure, with no E2EL (it did not end as a response);
    /// an HTTP error read whole has the E2EL of its end (replay left it empty, capture set it).
    #[test]
    fn outcomes_and_e2el_by_the_rule_capture_records() {
        let html = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 6\r\n\r\n<html>";
        let ex = exchange_with(html, false);
        assert_eq!(
            (ex.outcome, ex.error.as_deref(), ex.e2el_us),
            (Outcome::UpstreamError, Some("response is not JSON"), None)
        );
        // A whole JSON response with this status line.
        let answer = |status: &str, json: &[u8]| {
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                json.len()
            );
            [head.as_bytes(), json].concat()
        };
        let whole = answer("200 OK", br#"{"choices":[{"text":"x"}]}"#);
        let ex = exchange_with(&whole, true);
        assert_eq!(ex.outcome, Outcome::UpstreamError);
        assert_eq!(
            ex.error.as_deref(),
            Some("streamed request answered without text/event-stream")
        );
        assert_eq!(ex.e2el_us, None);
        let ex = exchange_with(&whole, false);
        assert_eq!(ex.outcome, Outcome::Ok);
        assert!(ex.e2el_us.is_some_and(|e| e >= 0), "{:?}", ex.e2el_us);
        // The cached part of the prompt, when the usage says (the row's `cached_tokens`).
        let cached = answer(
            "200 OK",
            br#"{"choices":[{"text":"x"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":8}}}"#,
        );
        let ex = exchange_with(&cached, false);
        assert_eq!((ex.prompt_tokens, ex.cached_tokens), (Some(9), Some(8)));
        let err = answer(
            "503 Service Unavailable",
            br#"{"error":{"message":"busy"}}"#,
        );
        let ex = exchange_with(&err, true);
        assert_eq!((ex.outcome, ex.status), (Outcome::HttpError, Some(503)));
        assert!(ex.e2el_us.is_some_and(|e| e >= 0), "{:?}", ex.e2el_us);
    }

    /// A stream whose last usage event has no `completion_tokens`: the count stands at the
    /// last output chunk's cumulative count, as capture records it (before the shared
    /// verdict, replay left it empty).
    #[test]
    fn a_last_usage_without_completion_tokens_keeps_the_chunks_count() {
        const BODY: &str =
            "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"completion_tokens\":1}}\n\n\
data: {\"choices\":[{\"text\":\"b\"}],\"usage\":{\"completion_tokens\":2}}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n\n";
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{BODY}",
            BODY.len()
        )
        .into_bytes();
        let ex = exchange_with(&response, true);
        assert_eq!(ex.outcome, Outcome::Ok, "{:?}", ex.error);
        assert_eq!(ex.chunk_times_us.len(), 2);
        assert_eq!((ex.prompt_tokens, ex.completion_tokens), (Some(3), Some(2)));
        assert_eq!(ex.chunk_tokens, Some(vec![1, 1]));
        assert_eq!(ex.output_text, None);
    }

    /// Requests carry the context they are given as a `traceparent`, unless traceparents are
    /// off (`--no-traceparent`) or a `--header traceparent` is sent instead.
    #[tokio::test]
    async fn requests_carry_their_traceparent_unless_told_not_to() {
        let ctx = TraceContext::derive("run", "r1");
        let want = format!("traceparent: {ctx}\r\n");
        let head = |opts: &RequestOptions| {
            let c = Client::new(
                &crate::config::Endpoint::parse("http://127.0.0.1:9").unwrap(),
                opts,
                Duration::from_secs(1),
            )
            .unwrap();
            let r = c.request("POST", "/v1/completions", b"{}", Some("r1"), Some(&ctx));
            (c.sends_traceparent(), String::from_utf8(r).unwrap())
        };
        let mut opts = crate::config::ReplayConfig::new(vec![]).request;
        let (on, text) = head(&opts);
        assert!(on && text.contains(&want), "{text}");
        assert!(text.contains("\r\ncontent-length: 2\r\n\r\n{}"), "{text}");
        assert_eq!(text.matches("traceparent").count(), 1);
        opts.traceparent = false;
        let (on, text) = head(&opts);
        assert!(!on && !text.contains("traceparent"), "{text}");
        opts.traceparent = true;
        opts.headers = vec![("traceparent".into(), "00-mine".into())];
        let (on, text) = head(&opts);
        assert!(!on, "a --header traceparent is sent instead");
        assert_eq!(text.matches("traceparent").count(), 1, "{text}");
        assert!(text.contains("traceparent: 00-mine\r\n"));
    }
}
