//! A lean HTTP/1.1 path to a plain-`http://` upstream for generation requests: the task
//! that serves the client's connection owns the upstream socket, writes the request in one
//! call, and decodes the response body (`content-length`, chunked or close-delimited)
//! straight from its read buffer, one frame per read.
//!
//! Why not hyper's client here: a hyper client connection is a driver task plus a body
//! channel that holds one frame at a time, so every SSE event of every stream costs a
//! channel hand-over, waker round trips between two tasks (often on two threads), and its
//! own write to the client even when one read from the upstream delivered several events.
//! Here what one `read(2)` delivered reaches the observer and the client's connection as
//! one frame, in the same task, like nginx's `proxy_buffering off`.
//!
//! Behaviour follows hyper-util's legacy client, which serves everything else (pass-through
//! requests, `https://` and h2c upstreams): the same request line and headers (plus `Host`
//! from the upstream URL), 1xx responses skipped, the body framing of RFC 9112 §6.3 (204 and
//! 304 empty, chunked when `transfer-encoding` ends in `chunked`, else close-delimited,
//! else `content-length`), a non-canonical reason phrase kept for the client, trailers
//! forwarded as a trailers frame, and connections kept alive unless the response says
//! otherwise. Idle connections wait in a small LIFO pool for up to 90 s; one is checked
//! (a non-blocking read) before reuse, and a request whose reused connection closes before
//! any byte of a response is retried once on a new connection, as hyper-util retries a
//! request its pooled connection could not send.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use trace_format::http1::{response_framing, ChunkedDecoder, Framing, ResponseFraming};

/// Idle connections kept at most.
const MAX_IDLE: usize = 4096;
/// How long an idle connection may wait for reuse (hyper-util's pool default).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest TCP connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response head accepted (hyper's default read buffer limit).
const MAX_HEAD: usize = 400 * 1024;
/// Most response header fields accepted (hyper's default).
const MAX_HEADERS: usize = 100;
/// Free room kept in the read buffer before each read.
const READ_ROOM: usize = 8 * 1024;

/// Why a request to the upstream failed before its response head was read.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No connection could be made.
    Connect(io::Error),
    /// The connection failed while sending the request or reading the head.
    Send(String),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The wording of hyper-util's client errors, so rows read the same either way.
        match self {
            SendError::Connect(e) => write!(f, "client error (Connect): tcp connect error: {e}"),
            SendError::Send(m) => write!(f, "client error (SendRequest): {m}"),
        }
    }
}

/// One upstream connection and its read buffer (bytes read and not yet consumed).
struct Conn {
    tcp: TcpStream,
    buf: BytesMut,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// The one upstream (host and port of an `http://` URL) and its keep-alive pool.
pub(crate) struct LeanUpstream {
    /// `host:port` to connect to.
    addr: String,
    /// The `Host` header hyper's client would send.
    host: HeaderValue,
    idle: Mutex<Vec<Idle>>,
}

impl std::fmt::Debug for LeanUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeanUpstream")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl LeanUpstream {
    /// The upstream at `authority` of an `http://` URL.
    pub(crate) fn new(authority: &http::uri::Authority) -> Option<LeanUpstream> {
        let host = authority.host();
        let port = authority.port_u16().unwrap_or(80);
        let host_header = match authority.port_u16() {
            Some(p) if p != 80 => format!("{host}:{p}"),
            _ => host.to_string(),
        };
        // `[::1]` keeps its brackets in an authority; TcpStream::connect wants them too.
        Some(LeanUpstream {
            addr: format!("{host}:{port}"),
            host: HeaderValue::from_str(&host_header).ok()?,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Idle connections in the pool.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle.lock().unwrap().len()
    }

    /// The most recently used idle connection that is still open and quiet.
    fn checkout(&self) -> Option<Conn> {
        loop {
            let Idle { conn, since } = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
            if since.elapsed() >= IDLE_TIMEOUT {
                continue;
            }
            // An open, quiet keep-alive connection has nothing to read: EOF (the upstream
            // closed it) or stray bytes make it unusable.
            let mut probe = [0u8; 1];
            match conn.tcp.try_read(&mut probe) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(conn),
                _ => continue,
            }
        }
    }

    fn checkin(&self, conn: Conn) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        // The oldest are at the front: drop the expired ones.
        let stale = idle
            .iter()
            .take_while(|i| now.duration_since(i.since) >= IDLE_TIMEOUT)
            .count();
        idle.drain(..stale);
        if idle.len() < MAX_IDLE {
            idle.push(Idle { conn, since: now });
        }
    }

    async fn connect(&self) -> Result<Conn, SendError> {
        let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.addr)).await
        {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return Err(SendError::Connect(e)),
            Err(_) => {
                return Err(SendError::Connect(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connect timeout",
                )))
            }
        };
        let _ = tcp.set_nodelay(true);
        Ok(Conn {
            tcp,
            buf: BytesMut::with_capacity(READ_ROOM * 2),
        })
    }

    /// The request bytes: request line, `headers` (hop-by-hop already removed, with
    /// `content-length`), `Host`, and the body.
    pub(crate) fn encode_request(
        &self,
        method: &http::Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + headers.len() * 48 + body.len());
        out.extend_from_slice(method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(path_and_query.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        for (name, value) in headers {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if !headers.contains_key(header::HOST) {
            out.extend_from_slice(b"host: ");
            out.extend_from_slice(self.host.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body);
        out
    }

    /// Sends `request` (from [`LeanUpstream::encode_request`]) and reads the response head.
    pub(crate) async fn send(
        self: &Arc<Self>,
        request: &[u8],
    ) -> Result<(http::response::Parts, LeanBody), SendError> {
        let mut retried = false;
        loop {
            let (mut conn, reused) = match self.checkout() {
                Some(c) => (c, true),
                None => (self.connect().await?, false),
            };
            conn.buf.clear();
            let attempt = async {
                conn.tcp.write_all(request).await.map_err(Failure::Io)?;
                read_head(&mut conn).await
            };
            match attempt.await {
                Ok(head) => return Ok(LeanBody::start(self.clone(), conn, head)),
                Err(Failure::ClosedEarly | Failure::Io(_)) if reused && !retried => {
                    retried = true;
                }
                Err(f) => return Err(SendError::Send(f.to_string())),
            }
        }
    }
}

/// A failure reading the response head.
#[derive(Debug)]
enum Failure {
    /// EOF before any byte of a response.
    ClosedEarly,
    Io(io::Error),
    Parse(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::ClosedEarly => f.write_str("connection closed before message completed"),
            Failure::Io(e) => write!(f, "connection error: {e}"),
            Failure::Parse(m) => write!(f, "invalid HTTP response: {m}"),
        }
    }
}

/// A parsed response head.
struct Head {
    parts: http::response::Parts,
    framing: Framing,
    keep_alive: bool,
}

async fn read_head(conn: &mut Conn) -> Result<Head, Failure> {
    loop {
        if !conn.buf.is_empty() {
            if let Some((head, used)) = parse_head(&conn.buf)? {
                conn.buf.advance(used);
                match head {
                    Some(h) => return Ok(h),
                    None => continue, // 1xx
                }
            }
            if conn.buf.len() > MAX_HEAD {
                return Err(Failure::Parse("message head is too large".into()));
            }
        }
        conn.buf.reserve(READ_ROOM);
        let n = conn
            .tcp
            .read_buf(&mut conn.buf)
            .await
            .map_err(Failure::Io)?;
        if n == 0 {
            return Err(if conn.buf.is_empty() {
                Failure::ClosedEarly
            } else {
                Failure::Parse("connection closed in the message head".into())
            });
        }
    }
}

/// Parses a response head at the start of `buf`: `None` when incomplete, else the head
/// (`None` for an interim 1xx response to skip) and its length.
#[allow(clippy::type_complexity)]
fn parse_head(buf: &[u8]) -> Result<Option<(Option<Head>, usize)>, Failure> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let used = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(Failure::Parse(e.to_string())),
    };
    let code = resp.code.unwrap_or(0);
    if (100..200).contains(&code) && code != 101 {
        return Ok(Some((None, used)));
    }
    let status = StatusCode::from_u16(code).map_err(|e| Failure::Parse(e.to_string()))?;
    let version = if resp.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let mut map = HeaderMap::with_capacity(resp.headers.len());
    for h in resp.headers.iter() {
        let name =
            HeaderName::from_bytes(h.name.as_bytes()).map_err(|e| Failure::Parse(e.to_string()))?;
        let value = HeaderValue::from_bytes(h.value).map_err(|e| Failure::Parse(e.to_string()))?;
        map.append(name, value);
    }
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = version;
    if let Some(reason) = resp.reason {
        if Some(reason) != status.canonical_reason() {
            if let Ok(r) = hyper::ext::ReasonPhrase::try_from(reason.as_bytes()) {
                parts.extensions.insert(r);
            }
        }
    }
    let ResponseFraming {
        framing,
        keep_alive,
    } = response_framing(code, version == Version::HTTP_10, resp.headers)
        .map_err(Failure::Parse)?;
    parts.headers = map;
    Ok(Some((
        Some(Head {
            parts,
            framing,
            keep_alive,
        }),
        used,
    )))
}

/// Trailer fields from the raw lines the chunked decoder kept, if the body had any.
fn trailer_map(raw: Vec<u8>) -> Result<Option<HeaderMap>, String> {
    if raw.is_empty() {
        return Ok(None);
    }
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut with_end = raw;
    with_end.extend_from_slice(b"\r\n");
    match httparse::parse_headers(&with_end, &mut fields) {
        Ok(httparse::Status::Complete((_, parsed))) => {
            let mut map = HeaderMap::with_capacity(parsed.len());
            for f in parsed {
                let (Ok(n), Ok(v)) = (
                    HeaderName::from_bytes(f.name.as_bytes()),
                    HeaderValue::from_bytes(f.value),
                ) else {
                    return Err("invalid trailer field".into());
                };
                map.append(n, v);
            }
            Ok(Some(map))
        }
        _ => Err("invalid trailer fields".into()),
    }
}

/// The response body from the upstream, read by whichever task polls it (the client
/// connection's own): one data frame per read, then trailers if any.
pub(crate) struct LeanBody {
    pool: Arc<LeanUpstream>,
    /// The connection while the body is being read.
    conn: Option<Conn>,
    framing: Framing,
    /// Bytes left of a `content-length` body.
    left: u64,
    chunked: ChunkedDecoder,
    keep_alive: bool,
    trailers: Option<HeaderMap>,
    done: bool,
}

impl LeanBody {
    fn start(pool: Arc<LeanUpstream>, conn: Conn, head: Head) -> (http::response::Parts, LeanBody) {
        let Head {
            parts,
            framing,
            keep_alive,
        } = head;
        let mut body = LeanBody {
            pool,
            conn: Some(conn),
            framing,
            left: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            chunked: ChunkedDecoder::default(),
            keep_alive,
            trailers: None,
            done: false,
        };
        if framing == Framing::Length(0) {
            body.end();
        }
        (parts, body)
    }

    /// The body ended where its framing said: the connection goes back to the pool when
    /// nothing else was read from it and the response allows keep-alive.
    fn end(&mut self) {
        self.done = true;
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && conn.buf.is_empty() {
                self.pool.checkin(conn);
            }
        }
    }

    /// Decodes what the buffer holds into one data span (possibly empty), split off the
    /// read buffer without a copy: once the client's connection has written it, the next
    /// read reuses the same allocation.
    fn decode_buffered(&mut self) -> Result<Bytes, String> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(Bytes::new());
        };
        let buf = &mut conn.buf;
        let (data, finished) = match self.framing {
            Framing::Eof => (buf.split().freeze(), false),
            Framing::Length(_) => {
                let n = (buf.len() as u64).min(self.left) as usize;
                self.left -= n as u64;
                (buf.split_to(n).freeze(), self.left == 0)
            }
            Framing::Chunked => {
                let (n, used) = self.chunked.decode(&mut buf[..])?;
                let data = buf.split_to(n).freeze();
                buf.advance(used - n);
                (data, self.chunked.done())
            }
        };
        if finished {
            if self.framing == Framing::Chunked {
                self.trailers = trailer_map(self.chunked.take_trailers())?;
            }
            self.end();
        }
        Ok(data)
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
        loop {
            if this.done {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let conn = this
                .conn
                .as_mut()
                .expect("a body in progress has its connection");
            if !conn.buf.is_empty() {
                let data = match this.decode_buffered() {
                    Ok(d) => d,
                    Err(m) => {
                        this.done = true;
                        this.conn = None;
                        return Poll::Ready(Some(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("invalid chunked body: {m}"),
                        ))));
                    }
                };
                if !data.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                continue;
            }
            conn.buf.reserve(READ_ROOM);
            let mut rb = ReadBuf::uninit(conn.buf.spare_capacity_mut());
            let r = ready!(Pin::new(&mut conn.tcp).poll_read(cx, &mut rb));
            let n = rb.filled().len();
            if let Err(e) = r {
                this.done = true;
                this.conn = None;
                return Poll::Ready(Some(Err(e)));
            }
            if n == 0 {
                if this.framing == Framing::Eof {
                    this.done = true;
                    this.conn = None;
                    continue;
                }
                this.done = true;
                this.conn = None;
                return Poll::Ready(Some(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed before message completed",
                ))));
            }
            let len = conn.buf.len() + n;
            // SAFETY: the read initialized the first `n` bytes of the spare capacity.
            unsafe { conn.buf.set_len(len) };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(_) => SizeHint::with_exact(self.left),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::net::TcpListener;

    #[test]
    fn trailers_become_header_fields() {
        let mut d = ChunkedDecoder::default();
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

    fn head(raw: &[u8]) -> Head {
        match parse_head(raw) {
            Ok(Some((Some(h), n))) => {
                assert_eq!(n, raw.len());
                h
            }
            Ok(_) => panic!("incomplete or interim"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn framing_and_keep_alive_follow_rfc_9112() {
        let h = head(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, true));
        assert!(h
            .parts
            .extensions
            .get::<hyper::ext::ReasonPhrase>()
            .is_none());
        let h = head(b"HTTP/1.1 200 Fine\r\ncontent-length: 12\r\nconnection: close\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(12), false));
        assert_eq!(
            h.parts
                .extensions
                .get::<hyper::ext::ReasonPhrase>()
                .unwrap()
                .as_bytes(),
            b"Fine"
        );
        let h = head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Eof, false));
        let h = head(b"HTTP/1.1 500 Internal Server Error\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Eof, false));
        assert_eq!(h.parts.status, 500);
        let h = head(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(2), true));
        let h = head(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n");
        assert!(!h.keep_alive);
        let h = head(b"HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(0));
        let h = head(b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(5));
        assert!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n")
                .is_err()
        );
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n").is_err());
        assert!(matches!(
            parse_head(b"HTTP/1.1 100 Continue\r\n\r\n"),
            Ok(Some((None, 25)))
        ));
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-"),
            Ok(None)
        ));
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

    fn request(up: &LeanUpstream) -> Vec<u8> {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(2));
        up.encode_request(&http::Method::POST, "/v1/completions", &h, b"{}")
    }

    #[tokio::test]
    async fn streams_a_chunked_response_and_reuses_the_connection() {
        let sse = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
f\r\ndata: {\"a\":1}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
        let json = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n{\"\"}";
        let (addr, mut reqs) = scripted(vec![sse.to_vec(), json.to_vec()], false).await;
        let up = Arc::new(LeanUpstream::new(&addr.parse().unwrap()).unwrap());
        let (parts, body) = up.send(&request(&up)).await.expect("send");
        assert_eq!(parts.status, 200);
        assert_eq!(parts.headers["content-type"], "text/event-stream");
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"data: {\"a\":1}\n\ndata: [DONE]\n\n");
        assert_eq!(up.idle_count(), 1, "connection back in the pool");
        let (conn1, req) = reqs.recv().await.unwrap();
        let port = addr.rsplit(':').next().unwrap();
        assert_eq!(
            req,
            format!("POST /v1/completions HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: 2\r\nhost: 127.0.0.1:{port}\r\n\r\n{{}}")
        );
        let (parts, body) = up.send(&request(&up)).await.expect("second send");
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
        let up = Arc::new(LeanUpstream::new(&addr.parse().unwrap()).unwrap());
        for round in 1..=2 {
            let (_, body) = up.send(&request(&up)).await.expect("send");
            assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"ok");
            let (conn, _) = reqs.recv().await.unwrap();
            assert_eq!(conn, round, "a new connection each time");
            // Let the server's close arrive before the next checkout.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn close_delimited_and_truncated_bodies() {
        let eof = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end".to_vec();
        let cut = b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nshort".to_vec();
        let (addr, _reqs) = scripted(vec![eof, cut], true).await;
        let up = Arc::new(LeanUpstream::new(&addr.parse().unwrap()).unwrap());
        let (_, body) = up.send(&request(&up)).await.expect("send");
        assert_eq!(
            &body.collect().await.unwrap().to_bytes()[..],
            b"until the end"
        );
        assert_eq!(
            up.idle_count(),
            0,
            "a close-delimited connection is not reused"
        );
        let (_, body) = up.send(&request(&up)).await.expect("send");
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
        let up =
            Arc::new(LeanUpstream::new(&format!("127.0.0.1:{port}").parse().unwrap()).unwrap());
        let e = up
            .send(b"GET / HTTP/1.1\r\n\r\n")
            .await
            .err()
            .expect("refused");
        let msg = e.to_string();
        assert!(
            msg.starts_with("client error (Connect): tcp connect error: "),
            "{msg}"
        );
    }
}
