//! A lean HTTP/1.1 path to an `http://` or `https://` upstream (TLS with ALPN `http/1.1`)
//! for recorded requests and for pass-through requests whose body has a known length, over
//! [`wire`]'s connection layer: the task that serves the client's connection owns the
//! upstream socket, writes the request in one call, and reads the response body straight
//! from its read buffer, one frame per read.
//!
//! Why not hyper's client here: a hyper client connection is a driver task plus a body
//! channel that holds one frame at a time, so every SSE event of every stream costs a
//! channel hand-over, waker round trips between two tasks (often on two threads), and its
//! own write to the client even when one read from the upstream delivered several events.
//! Here what one `read(2)` delivered reaches the observer and the client's connection as
//! one frame, in the same task, like nginx's `proxy_buffering off`.
//!
//! Behaviour follows hyper-util's legacy client, which serves what is left (h2c upstreams,
//! pass-through requests streaming a body of unknown length, HEAD, upgrades): the same
//! request line and headers (plus `Host` from the upstream URL), 1xx responses skipped, the body framing of RFC 9112 §6.3
//! ([`wire::framing`]), a non-canonical reason phrase kept for the client, trailers
//! forwarded as a trailers frame, and connections kept alive unless the response says
//! otherwise. Connections come from a [`wire::Pool`]: checked with the kernel before reuse,
//! kept idle at most `--pool-idle-timeout`, not reused after a kind of response the upstream
//! has been seen to close them after ([`wire::habit`]; the serving threads' pools share what
//! they learn), and a request is sent again only when not one
//! byte of it reached a connection (the retry rule, [`wire::Pool::send`]). Once it has, the
//! upstream may have started a generation: a connection that closes without an answer is a
//! 502 for the client and an `upstream_error` row, never a second generation.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::config::validated::Upstream;
use crate::phases::Phases;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use wire::{BodyReader, Conn, Pool, PoolConfig, ReadError, SendError as WireSendError};

/// Largest response head accepted (hyper's default read buffer limit).
const MAX_HEAD: usize = 400 * 1024;

/// Why a request to the upstream failed before its response head was read.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No connection could be made.
    Connect(String),
    /// The connection failed while sending the request or reading the head.
    Send(String),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The wording of hyper-util's client errors, so rows read the same either way.
        match self {
            SendError::Connect(e) => write!(f, "client error (Connect): {e}"),
            SendError::Send(m) => write!(f, "client error (SendRequest): {m}"),
        }
    }
}

/// The one upstream (host and port of an `http://` URL) and its keep-alive pools, one per
/// serving thread ([`crate::runtime::threads`]): a connection is registered with the runtime of the
/// thread that opened it, and only that thread uses it again.
pub(crate) struct LeanUpstream {
    pools: Vec<Arc<Pool>>,
    /// The `Host` header hyper's client would send.
    host: HeaderValue,
}

impl std::fmt::Debug for LeanUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeanUpstream")
            .field("pools", &self.pools)
            .finish_non_exhaustive()
    }
}

impl LeanUpstream {
    /// The upstream of an `http://` or `https://` URL (TLS verified with `tls`, HTTP/1.1 by
    /// ALPN), with the connect and idle timeouts of `cfg` and a pool per serving thread;
    /// None when its host is no TLS server name or makes no `Host` header.
    pub(crate) fn new(
        upstream: &Upstream,
        tls: &rustls::ClientConfig,
        cfg: &crate::ProxyConfig,
    ) -> Option<LeanUpstream> {
        let https = upstream.scheme == http::uri::Scheme::HTTPS;
        let tls = https.then(|| {
            let mut c = tls.clone();
            c.alpn_protocols = vec![b"http/1.1".to_vec()];
            tokio_rustls::TlsConnector::from(Arc::new(c))
        });
        Self::with_pool_config(
            &upstream.authority,
            tls,
            PoolConfig {
                connect_timeout: cfg.upstream_connect_timeout,
                idle_timeout: cfg.upstream_pool_idle_timeout,
                ..PoolConfig::default()
            },
            cfg.threads,
        )
    }

    fn with_pool_config(
        authority: &http::uri::Authority,
        tls: Option<tokio_rustls::TlsConnector>,
        pool: PoolConfig,
        threads: usize,
    ) -> Option<LeanUpstream> {
        let host = authority.host();
        let default_port = if tls.is_some() { 443 } else { 80 };
        let port = authority.port_u16().unwrap_or(default_port);
        let host_header = match authority.port_u16() {
            Some(p) if p != default_port => format!("{host}:{p}"),
            _ => host.to_string(),
        };
        let target = match tls {
            Some(c) => wire::Target::tls(host, port, authority.as_str(), c).ok()?,
            None => wire::Target::plain(host, port, authority.as_str()),
        };
        // One origin: what one thread's pool learns of its habits, all of them use.
        let habit = Arc::new(wire::Habit::new());
        Some(LeanUpstream {
            pools: (0..threads.max(1))
                .map(|_| Arc::new(Pool::with_habit(target.clone(), pool, habit.clone())))
                .collect(),
            host: HeaderValue::from_str(&host_header).ok()?,
        })
    }

    /// The pool of the serving thread this runs on.
    fn pool(&self) -> &Arc<Pool> {
        &self.pools[crate::runtime::threads::index().min(self.pools.len() - 1)]
    }

    /// Idle connections in the pool.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.pool().idle_count()
    }

    /// The end of a request whose request line and headers (without `Host` and
    /// `content-length`) are in `out`: the upstream's `Host`, the body's `content-length`
    /// (when `length`), the blank line and `body`.
    pub(crate) fn encode_tail(&self, out: &mut Vec<u8>, body: &[u8], length: bool) {
        out.extend_from_slice(b"host: ");
        out.extend_from_slice(self.host.as_bytes());
        if length {
            out.extend_from_slice(b"\r\ncontent-length: ");
            out.extend_from_slice(body.len().to_string().as_bytes());
        }
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(body);
    }

    /// Sends `request` (encoded by [`crate::upstream::route::Forward::send_lean`]) under the wire's retry rule
    /// and reads the response head, stamping `phases`. The caller bounds the whole with its
    /// header timeout.
    pub(crate) async fn send(
        self: &Arc<Self>,
        request: &[u8],
        phases: &mut Phases,
    ) -> Result<(http::response::Parts, LeanBody), SendError> {
        let pool = self.pool();
        let mut sent = match pool.send(request, Duration::MAX).await {
            Ok(s) => s,
            Err(WireSendError::Connect { error, .. }) => {
                return Err(SendError::Connect(error.to_string()))
            }
            Err(e) => return Err(SendError::Send(e.to_string())),
        };
        phases.leased = Some(sent.t0);
        phases.reused = sent.reused;
        phases.written = Some(Instant::now());
        match sent.conn.read_head(MAX_HEAD, parts_of).await {
            Ok((head, _)) => {
                phases.response_head = Some(Instant::now());
                let wire::Head {
                    framing,
                    keep_alive,
                    extra: parts,
                    ..
                } = head;
                let mut body = LeanBody {
                    pool: pool.clone(),
                    conn: Some(sent.conn),
                    body: BodyReader::new(framing),
                    keep_alive,
                    trailers: None,
                    done: false,
                };
                if body.body.done() {
                    body.end();
                }
                Ok((parts, body))
            }
            Err(ReadError::ClosedBeforeResponse) => Err(SendError::Send(
                "connection closed before message completed".into(),
            )),
            Err(ReadError::Protocol(m)) => {
                Err(SendError::Send(format!("invalid HTTP response: {m}")))
            }
            Err(e) => Err(SendError::Send(format!("connection error: {e}"))),
        }
    }
}

/// The `http` parts of a final response head (status, version, headers, a non-canonical
/// reason phrase).
fn parts_of(resp: &httparse::Response<'_, '_>) -> Result<http::response::Parts, String> {
    let code = resp.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|e| e.to_string())?;
    let map = header_map(resp.headers)?;
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = if resp.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    if let Some(reason) = resp.reason {
        if Some(reason) != status.canonical_reason() {
            if let Ok(r) = hyper::ext::ReasonPhrase::try_from(reason.as_bytes()) {
                parts.extensions.insert(r);
            }
        }
    }
    parts.headers = map;
    Ok(parts)
}

/// Parsed header (or trailer) fields as a `HeaderMap`, repeated names kept.
fn header_map(fields: &[httparse::Header<'_>]) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::with_capacity(fields.len());
    for f in fields {
        let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|e| e.to_string())?;
        let value = HeaderValue::from_bytes(f.value).map_err(|e| e.to_string())?;
        map.append(name, value);
    }
    Ok(map)
}

/// Trailer fields from the raw lines the chunked decoder kept, if the body had any.
fn trailer_map(raw: Vec<u8>) -> Result<Option<HeaderMap>, String> {
    if raw.is_empty() {
        return Ok(None);
    }
    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut with_end = raw;
    with_end.extend_from_slice(b"\r\n");
    match httparse::parse_headers(&with_end, &mut fields) {
        Ok(httparse::Status::Complete((_, parsed))) => header_map(parsed)
            .map(Some)
            .map_err(|e| format!("invalid trailer field: {e}")),
        _ => Err("invalid trailer fields".into()),
    }
}

/// The response body from the upstream, read by whichever task polls it (the client
/// connection's own): one data frame per read, then trailers if any.
pub(crate) struct LeanBody {
    pool: Arc<Pool>,
    /// The connection while the body is being read.
    conn: Option<Conn>,
    body: BodyReader,
    keep_alive: bool,
    trailers: Option<HeaderMap>,
    done: bool,
}

impl LeanBody {
    /// The body ended where its framing said: the connection goes back to the pool when
    /// nothing else was read from it and the response allows keep-alive.
    fn end(&mut self) {
        self.done = true;
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && conn.is_clean() {
                self.pool.checkin(conn);
            }
        }
    }

    fn fail(&mut self, e: io::Error) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.done = true;
        self.conn = None;
        Poll::Ready(Some(Err(e)))
    }
}

impl Body for LeanBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
        }
        let conn = this
            .conn
            .as_mut()
            .expect("a body in progress has its connection");
        let data = match conn.poll_body(&mut this.body, cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(d)) => d,
            Poll::Ready(Err(ReadError::Truncated(_))) => {
                return this.fail(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed before message completed",
                ))
            }
            Poll::Ready(Err(ReadError::Io(e))) => return this.fail(e),
            Poll::Ready(Err(e)) => {
                return this.fail(io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
            }
        };
        // The frame that completes the body ends it at once, so `is_end_stream` says so
        // with the last frame (hyper stops polling a body whose length is met).
        if this.body.done() {
            match trailer_map(this.body.take_trailers()) {
                Ok(t) => this.trailers = t,
                Err(m) => {
                    return this.fail(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("invalid chunked body: {m}"),
                    ))
                }
            }
            this.end();
        }
        match data {
            Some(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
            None => Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.body.remaining() {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[test]
    fn trailers_become_header_fields() {
        let mut d = wire::framing::ChunkedDecoder::default();
        let mut input = b"3\r\nabc\r\n0\r\nx-a: 1\r\nx-b: two\r\n\r\n".to_vec();
        d.decode(&mut input).unwrap();
        let t = trailer_map(d.take_trailers()).unwrap().expect("trailers");
        assert_eq!(
            (t["x-a"].as_bytes(), t["x-b"].as_bytes()),
            (&b"1"[..], &b"two"[..])
        );
        assert!(trailer_map(d.take_trailers()).unwrap().is_none());
        assert!(trailer_map(b"bad field\r\n".to_vec()).is_err());
    }

    fn parts(raw: &[u8]) -> http::response::Parts {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut r = httparse::Response::new(&mut headers);
        assert!(r.parse(raw).unwrap().is_complete());
        parts_of(&r).unwrap()
    }

    /// Framing itself is the wire's (tested there); what capture adds is the head as the
    /// client will see it.
    #[test]
    fn the_head_keeps_version_headers_and_an_unusual_reason() {
        let p = parts(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-a: 1\r\nx-a: 2\r\n\r\n",
        );
        assert_eq!((p.status, p.version), (StatusCode::OK, Version::HTTP_11));
        assert_eq!(p.headers.get_all("x-a").iter().count(), 2);
        assert!(p.extensions.get::<hyper::ext::ReasonPhrase>().is_none());
        let p = parts(b"HTTP/1.0 200 Fine\r\n\r\n");
        assert_eq!(p.version, Version::HTTP_10);
        assert_eq!(
            p.extensions
                .get::<hyper::ext::ReasonPhrase>()
                .unwrap()
                .as_bytes(),
            b"Fine"
        );
    }

    /// A scripted upstream: answers each request on a connection with the next response of
    /// `responses` (written in `pieces`-sized writes), and reports each request it read.
    async fn scripted(
        responses: Vec<Vec<u8>>,
        close_after: bool,
    ) -> (
        String,
        tokio::sync::mpsc::UnboundedReceiver<(usize, String)>,
    ) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut conn_no = 0;
            let mut responses = responses.into_iter();
            while let Ok((mut s, _)) = l.accept().await {
                conn_no += 1;
                let mut got = Vec::new();
                loop {
                    let mut b = [0u8; 4096];
                    let n = s.read(&mut b).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&b[..n]);
                    // Requests here carry a content-length body of "{}".
                    let Some(end) = got.windows(6).position(|w| w == b"\r\n\r\n{}") else {
                        continue;
                    };
                    let req: Vec<u8> = got.drain(..end + 6).collect();
                    let _ = tx.send((conn_no, String::from_utf8_lossy(&req).into_owned()));
                    let Some(resp) = responses.next() else { return };
                    for piece in resp.chunks(7) {
                        s.write_all(piece).await.unwrap();
                        s.flush().await.unwrap();
                    }
                    if close_after {
                        break;
                    }
                }
            }
        });
        (addr, rx)
    }

    fn lean(addr: &str) -> Arc<LeanUpstream> {
        Arc::new(
            LeanUpstream::with_pool_config(&addr.parse().unwrap(), None, PoolConfig::default(), 1)
                .unwrap(),
        )
    }

    /// Until the upstream has kept a connection open after a kind of response, the pool
    /// reuses one only once it has sat idle [`wire::habit::SETTLE`] (this scripted server
    /// serves one connection at a time: a new one would wait forever).
    async fn settle() {
        tokio::time::sleep(wire::habit::SETTLE + Duration::from_millis(10)).await;
    }

    fn request(up: &LeanUpstream) -> Vec<u8> {
        let mut out =
            b"POST /v1/completions HTTP/1.1\r\ncontent-type: application/json\r\n".to_vec();
        up.encode_tail(&mut out, b"{}", true);
        out
    }

    #[tokio::test]
    async fn streams_a_chunked_response_and_reuses_the_connection() {
        let sse = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
f\r\ndata: {\"a\":1}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
        let json = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n{\"\"}";
        let (addr, mut reqs) = scripted(vec![sse.to_vec(), json.to_vec()], false).await;
        let up = lean(&addr);
        let (parts, body) = up
            .send(&request(&up), &mut Phases::new(Instant::now()))
            .await
            .expect("send");
        assert_eq!(parts.status, 200);
        assert_eq!(parts.headers["content-type"], "text/event-stream");
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"data: {\"a\":1}\n\ndata: [DONE]\n\n");
        assert_eq!(up.idle_count(), 1, "connection back in the pool");
        let (conn1, req) = reqs.recv().await.unwrap();
        let port = addr.rsplit(':').next().unwrap();
        assert_eq!(
            req,
            format!("POST /v1/completions HTTP/1.1\r\ncontent-type: application/json\r\nhost: 127.0.0.1:{port}\r\ncontent-length: 2\r\n\r\n{{}}")
        );
        settle().await;
        let (parts, body) = up
            .send(&request(&up), &mut Phases::new(Instant::now()))
            .await
            .expect("second send");
        assert_eq!(body.size_hint().exact(), Some(4));
        assert_eq!(parts.headers["content-length"], "4");
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"{\"\"}");
        let (conn2, _) = reqs.recv().await.unwrap();
        assert_eq!(
            conn1, conn2,
            "the second request reused the first connection"
        );
    }

    #[tokio::test]
    async fn a_closed_idle_connection_is_replaced() {
        let json = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec();
        let (addr, mut reqs) = scripted(vec![json.clone(), json], true).await;
        let up = lean(&addr);
        for round in 1..=2 {
            let (_, body) = up
                .send(&request(&up), &mut Phases::new(Instant::now()))
                .await
                .expect("send");
            assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"ok");
            let (conn, _) = reqs.recv().await.unwrap();
            assert_eq!(conn, round, "a new connection each time");
            // Let the server's close arrive before the next checkout.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// An upstream that reads a request on a reused connection and closes without answering
    /// may have started a generation: the request is not sent again (before the wire's retry
    /// rule it went out a second time on a new connection), and the caller gets the failure.
    #[tokio::test]
    async fn a_request_read_and_left_unanswered_is_not_sent_again() {
        let json = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec();
        // One answer, then the server reads the next request and stops (closing everything).
        let (addr, mut reqs) = scripted(vec![json], false).await;
        let up = lean(&addr);
        let (_, body) = up
            .send(&request(&up), &mut Phases::new(Instant::now()))
            .await
            .expect("send");
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"ok");
        settle().await;
        let e = up
            .send(&request(&up), &mut Phases::new(Instant::now()))
            .await
            .err()
            .expect("no answer");
        assert!(
            e.to_string().starts_with(
                "client error (SendRequest): connection closed before message completed"
            ),
            "{e}"
        );
        assert_eq!(reqs.recv().await.map(|r| r.0), Some(1));
        assert_eq!(reqs.recv().await.map(|r| r.0), Some(1));
        assert!(reqs.recv().await.is_none(), "read twice");
    }

    /// The frame that completes a body ends it: hyper stops polling a body whose
    /// content-length is met, and a body that only ended on the poll after would be dropped
    /// unfinished and recorded as cancelled by the client.
    #[tokio::test]
    async fn the_last_frame_ends_the_body() {
        let json = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n{\"\"}".to_vec();
        let sse =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n".to_vec();
        let (addr, _reqs) = scripted(vec![json, sse], false).await;
        let up = lean(&addr);
        for want in [&b"{\"\"}"[..], b"ab"] {
            let (_, mut body) = up
                .send(&request(&up), &mut Phases::new(Instant::now()))
                .await
                .expect("send");
            let mut got = Vec::new();
            while !body.is_end_stream() {
                let f = body.frame().await.expect("a frame").expect("data");
                got.extend_from_slice(&f.into_data().unwrap());
            }
            assert_eq!(got, want);
            assert_eq!(up.idle_count(), 1, "connection back in the pool");
            settle().await;
        }
    }

    #[tokio::test]
    async fn close_delimited_and_truncated_bodies() {
        let eof = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end".to_vec();
        let cut = b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nshort".to_vec();
        let (addr, _reqs) = scripted(vec![eof, cut], true).await;
        let up = lean(&addr);
        let (_, body) = up
            .send(&request(&up), &mut Phases::new(Instant::now()))
            .await
            .expect("send");
        assert_eq!(
            &body.collect().await.unwrap().to_bytes()[..],
            b"until the end"
        );
        assert_eq!(
            up.idle_count(),
            0,
            "a close-delimited connection is not reused"
        );
        let (_, body) = up
            .send(&request(&up), &mut Phases::new(Instant::now()))
            .await
            .expect("send");
        let e = body.collect().await.expect_err("truncated");
        assert!(
            e.to_string().contains("closed before message completed"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn connect_failure_reads_like_hyper() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let up = lean(&format!("127.0.0.1:{port}"));
        let e = up
            .send(b"GET / HTTP/1.1\r\n\r\n", &mut Phases::new(Instant::now()))
            .await
            .err()
            .expect("refused");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!(
                "client error (Connect): connect 127.0.0.1:{port}: "
            )),
            "{msg}"
        );
    }
}
