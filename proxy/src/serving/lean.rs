//! The lean HTTP/1.1 server path: a plain-http client connection's generation requests are
//! read, handed to [`handler::generation`] and their responses written here, without
//! hyper's server.
//!
//! In a connection burst capture's added TTFT follows its CPU per request, and hyper's
//! server side (its protocol sniff, dispatcher, header map round trips and the boxed
//! futures between them) was the largest part of what capture spends beyond nginx in user
//! space. This path reads the head into one buffer, parses it with httparse, and writes the
//! response head and each body frame with one `writev` (the head together with the first
//! frame when that is ready).
//!
//! Only requests that leave nothing to interpret are served here: a complete head that
//! httparse parses (strict: no obs-fold, no space before a colon, at most [`MAX_FIELDS`]
//! fields, at most [`MAX_HEAD`] bytes), `POST` to a `…/completions` path in origin form,
//! HTTP/1.1, exactly one `content-length` of digits within `--max-request-body`, and no
//! `transfer-encoding`, `expect`, `upgrade` or `te`. At the first request that is anything
//! else (the h2 preface, a pass-through request, a malformed, ambiguous or oversize head),
//! the connection goes to hyper with every byte read and not yet served
//! ([`GuardedIo::unread`]), and hyper serves it to its end: its answers to bad requests
//! stay the proxy's answers.
//!
//! What hyper did that this keeps: the client's deadlines ([`GuardedIo`], [`ConnPhase`]);
//! `connection: close` honoured both ways; keep-alive and pipelined requests; a `date`
//! header when the upstream sent none; `content-length` when the body's length is known,
//! chunked otherwise; a client that closes mid-response ends it (the row says the client
//! cancelled); a body error cuts the connection without the chunked terminator, so the
//! client sees a truncated body, not a complete one.

use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::serving::handler::{self, ProxyBody};
use crate::serving::limits::{ConnPhase, GuardedIo};
use crate::serving::state::Shared;

/// Header fields a lean request may have (more: hyper's, whose limit is 100).
pub(crate) const MAX_FIELDS: usize = 64;
/// The longest head the lean path reads before it leaves the request to hyper (whose limit
/// answers 431).
pub(crate) const MAX_HEAD: usize = 16 * 1024;
/// What a read of the socket asks for.
const READ_SIZE: usize = 8 * 1024;
/// Bytes of pipelined requests read while a response is written; past this the socket is
/// not read until the response ends (the client waits, as with hyper's read buffer).
const MAX_PIPELINED: usize = 64 * 1024;

/// A connection the lean path stopped serving: the bytes it read and did not serve, for
/// hyper, and the accept instant when no request was served yet.
pub(crate) struct Handoff {
    pub(crate) unread: Bytes,
    pub(crate) accepted: Option<Instant>,
}

/// Serves `io`'s requests while they are lean ones (see the module); `Some` hands the
/// connection to hyper, `None` means it is done (closed by either side, timed out, or
/// finished for a graceful shutdown).
pub(crate) async fn serve(
    io: &mut GuardedIo<TcpStream>,
    phase: &Arc<ConnPhase>,
    shared: &Arc<Shared>,
    (peer, mut accepted): (crate::upstream::route::ClientAddr, Option<Instant>),
    graceful: &mut watch::Receiver<bool>,
) -> Option<Handoff> {
    let mut buf = BytesMut::new();
    let mut asked = *graceful.borrow();
    loop {
        let head = loop {
            if !buf.is_empty() {
                match parse(&buf, shared.cfg.max_request_body) {
                    Parsed::Lean(h) => break h,
                    Parsed::Partial if buf.len() < MAX_HEAD => {}
                    Parsed::Partial | Parsed::Other => {
                        return Some(Handoff {
                            unread: buf.freeze(),
                            accepted,
                        })
                    }
                }
            } else if asked {
                return None;
            }
            buf.reserve(READ_SIZE);
            tokio::select! {
                biased;
                r = io.read_buf(&mut buf) => match r {
                    // Ended, or a client deadline (as with hyper: closed, nothing recorded).
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                },
                _ = graceful.changed(), if !asked => asked = true,
            }
        };
        let t0 = Instant::now();
        let arrival = wire::clock::epoch_us();
        let active = phase.start();
        let LeanHead {
            len,
            content_length,
            close,
            mut parts,
        } = head;
        parts.extensions.insert(peer);
        let _ = buf.split_to(len);
        let mut left = content_length;
        let body = SocketBody {
            io: &mut *io,
            buf: &mut buf,
            left: &mut left,
        };
        let read =
            handler::read_generation(shared, parts, body, (t0, accepted.take()), arrival).await;
        let resp = match read {
            Err(refused) => refused,
            Ok(g) => {
                let forward = handler::forward_generation(shared.clone(), g);
                match until_client_leaves(forward, io.get_mut(), &mut buf).await {
                    Some(resp) => resp,
                    // As hyper does: the request is dropped (its row says the client
                    // disconnected before the response headers), and so is its upstream
                    // connection, which ends the generation there.
                    None => return None,
                }
            }
        };
        // A body not read to its end (the handler's 408 and 400 answers) leaves the
        // connection's framing unknown.
        let keep_alive = !close && left == 0 && !*graceful.borrow();
        let written = respond(io, &mut buf, resp, keep_alive).await;
        drop(active);
        if written.is_err() || !keep_alive {
            let _ = io.get_mut().shutdown().await;
            return None;
        }
        asked = *graceful.borrow();
    }
}

/// Runs `work` (a request forwarded, its response head awaited) unless the client closes
/// its connection first (`None`). What the client sends meanwhile (a pipelined request) is
/// kept in `buf`, up to [`MAX_PIPELINED`].
async fn until_client_leaves<F: Future>(
    work: F,
    sock: &mut TcpStream,
    buf: &mut BytesMut,
) -> Option<F::Output> {
    let mut work = std::pin::pin!(work);
    poll_fn(|cx| {
        if let Poll::Ready(out) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        if client_gone(sock, buf, cx) {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

/// Reads what the client sent while its request is served into `buf` (up to
/// [`MAX_PIPELINED`]; past that the socket is left alone) until a read would block, which
/// registers `cx` for the next bytes: true when the client has closed (or reset) its
/// connection.
fn client_gone(sock: &mut TcpStream, buf: &mut BytesMut, cx: &mut Context<'_>) -> bool {
    while buf.len() < MAX_PIPELINED && sock.poll_read_ready(cx).is_ready() {
        buf.reserve(READ_SIZE);
        match sock.try_read_buf(buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return true,
        }
    }
    false
}

/// A lean request's head.
struct LeanHead {
    /// Its length in bytes.
    len: usize,
    content_length: usize,
    /// The client sent `connection: close`.
    close: bool,
    parts: http::request::Parts,
}

// A return value, moved once: boxing the head would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
enum Parsed {
    Lean(LeanHead),
    /// Not a whole head yet.
    Partial,
    /// A head this path leaves to hyper (see the module).
    Other,
}

/// The head at the start of `buf`, if it is one the lean path serves.
fn parse(buf: &[u8], max_body: usize) -> Parsed {
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut fields);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Other,
    };
    match lean_head(&req, len, max_body) {
        Some(h) => Parsed::Lean(h),
        None => Parsed::Other,
    }
}

fn lean_head(req: &httparse::Request<'_, '_>, len: usize, max_body: usize) -> Option<LeanHead> {
    if req.method != Some("POST") || req.version != Some(1) {
        return None;
    }
    let target = req.path?;
    if !target.starts_with('/') {
        return None;
    }
    let path = target.split('?').next().unwrap_or(target);
    handler::recorded_api(&Method::POST, path)?;
    let mut content_length = None;
    let mut close = false;
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    for f in req.headers.iter() {
        let name = HeaderName::from_bytes(f.name.as_bytes()).ok()?;
        if name == header::CONTENT_LENGTH {
            let v = f.value;
            if content_length.is_some()
                || v.is_empty()
                || v.len() > 19
                || !v.iter().all(u8::is_ascii_digit)
            {
                return None;
            }
            content_length = Some(std::str::from_utf8(v).ok()?.parse::<usize>().ok()?);
        } else if name == header::TRANSFER_ENCODING
            || name == header::EXPECT
            || name == header::UPGRADE
            || name == header::TE
        {
            return None;
        } else if name == header::CONNECTION {
            for token in f.value.split(|&b| b == b',') {
                let t = token.trim_ascii();
                if t.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if t.eq_ignore_ascii_case(b"upgrade") {
                    return None;
                }
            }
        }
        headers.append(name, HeaderValue::from_bytes(f.value).ok()?);
    }
    let content_length = content_length.filter(|&n| n <= max_body)?;
    let mut parts = Request::new(()).into_parts().0;
    parts.method = Method::POST;
    parts.uri = Uri::try_from(target).ok()?;
    parts.version = Version::HTTP_11;
    parts.headers = headers;
    Some(LeanHead {
        len,
        content_length,
        close,
        parts,
    })
}

/// A lean request's body: what the head's buffer already holds, then reads of the socket
/// (the bytes after it stay in the buffer for the next request).
struct SocketBody<'a> {
    io: &'a mut GuardedIo<TcpStream>,
    buf: &'a mut BytesMut,
    left: &'a mut usize,
}

impl Body for SocketBody<'_> {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let me = self.get_mut();
        if *me.left == 0 {
            return Poll::Ready(None);
        }
        if me.buf.is_empty() {
            me.buf.reserve((*me.left).clamp(READ_SIZE, 64 * 1024));
            let n = ready!(poll_read_buf(me.io, cx, me.buf))?;
            if n == 0 {
                return Poll::Ready(Some(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the client closed the connection before the body ended",
                ))));
            }
        }
        let n = me.buf.len().min(*me.left);
        *me.left -= n;
        Poll::Ready(Some(Ok(Frame::data(me.buf.split_to(n).freeze()))))
    }

    fn is_end_stream(&self) -> bool {
        *self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(*self.left as u64)
    }
}

/// One read of `io` into `buf`'s spare capacity; the bytes read.
fn poll_read_buf<R: AsyncRead + Unpin>(
    io: &mut R,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    let dst = buf.spare_capacity_mut();
    let mut rb = ReadBuf::uninit(dst);
    ready!(Pin::new(io).poll_read(cx, &mut rb))?;
    let n = rb.filled().len();
    // SAFETY: the read initialised the first `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Poll::Ready(Ok(n))
}

/// How a response body is framed on the wire.
#[derive(Clone, Copy)]
enum Framing {
    /// No body (1xx, 204, 304).
    None,
    /// `content-length`: the bytes still to write.
    Length(u64),
    Chunked,
}

/// What a response waits for next.
enum Event {
    /// Body data ready (with whatever else was ready at once), and how the body stands
    /// after it.
    Data(After),
    /// Nothing to write with the head yet: send it alone.
    Head,
    /// The client closed its connection.
    ClientGone,
}

/// How a response body stands after the data taken in one turn.
enum After {
    More,
    Ended,
    Failed(crate::upstream::BoxError),
}

/// At most this many body frames are taken for one write.
const MAX_BATCH: usize = 32;

/// Takes the body's data frames that are ready now into `batch` (at most [`MAX_BATCH`]),
/// skipping trailers (hyper sends them only to a client that asked with `te`, and such a
/// request is hyper's) and empty frames. `Pending` when nothing at all was ready.
fn poll_batch(body: &mut ProxyBody, cx: &mut Context<'_>, batch: &mut Vec<Bytes>) -> Poll<After> {
    while batch.len() < MAX_BATCH {
        if body.is_end_stream() {
            return Poll::Ready(After::Ended);
        }
        match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(d) = frame.into_data() {
                    if !d.is_empty() {
                        batch.push(d);
                    }
                }
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(After::Failed(e)),
            Poll::Ready(None) => return Poll::Ready(After::Ended),
            Poll::Pending if batch.is_empty() => return Poll::Pending,
            Poll::Pending => break,
        }
    }
    Poll::Ready(After::More)
}

/// Writes `resp` to the client, the body's frames as they come (those ready at once in one
/// `writev`, and the head with the first); `keep_alive` false adds `connection: close`. An
/// error means the connection is not reusable (the client went away, or the body failed
/// midway and the client has a truncated one).
async fn respond(
    io: &mut GuardedIo<TcpStream>,
    buf: &mut BytesMut,
    resp: Response<ProxyBody>,
    keep_alive: bool,
) -> io::Result<()> {
    let (parts, mut body) = resp.into_parts();
    let (head, mut framing) = encode_head(&parts, &body, keep_alive);
    drop(parts);
    let sock = io.get_mut();
    let mut head_pending = true;
    let mut batch: Vec<Bytes> = Vec::with_capacity(4);
    loop {
        // A body whose length is met is done (hyper drops it unpolled then too).
        let done = match framing {
            Framing::Length(0) => true,
            Framing::None => body.is_end_stream(),
            _ => false,
        };
        if done {
            if head_pending {
                sock.write_all(&head).await?;
            }
            return Ok(());
        }
        let ev = poll_fn(|cx| {
            if let Poll::Ready(after) = poll_batch(&mut body, cx, &mut batch) {
                return Poll::Ready(Event::Data(after));
            }
            if head_pending {
                return Poll::Ready(Event::Head);
            }
            if client_gone(sock, buf, cx) {
                return Poll::Ready(Event::ClientGone);
            }
            Poll::Pending
        })
        .await;
        let after = match ev {
            Event::Head => {
                sock.write_all(&head).await?;
                head_pending = false;
                continue;
            }
            Event::ClientGone => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the client closed the connection mid-response",
                ))
            }
            Event::Data(after) => after,
        };
        let head_part: &[u8] = if head_pending { &head } else { &[] };
        head_pending = false;
        let ended = matches!(after, After::Ended);
        let mut size_line = [0u8; 18];
        // Head, size line, up to MAX_BATCH frames, their end and the terminator.
        let mut out = Slices::new();
        out.push(head_part);
        let mut too_long = false;
        match &mut framing {
            Framing::None => {}
            Framing::Length(left) => {
                for d in &batch {
                    let n = (d.len() as u64).min(*left) as usize;
                    *left -= n as u64;
                    too_long |= n < d.len();
                    out.push(&d[..n]);
                }
                if ended && *left > 0 {
                    write_all(sock, out.as_mut()).await?;
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "response body shorter than its content-length",
                    ));
                }
            }
            Framing::Chunked => {
                // What was ready at once goes as one chunk (chunk boundaries carry no
                // meaning, and hyper re-chunks too).
                let total: usize = batch.iter().map(Bytes::len).sum();
                if total > 0 {
                    out.push(chunk_size_line(total, &mut size_line));
                    for d in &batch {
                        out.push(d);
                    }
                    out.push(b"\r\n");
                }
                if ended {
                    out.push(b"0\r\n\r\n");
                }
            }
        }
        write_all(sock, out.as_mut()).await?;
        batch.clear();
        if too_long {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "response body longer than its content-length",
            ));
        }
        match after {
            After::More => {}
            // The body failed midway (the upstream's error, recorded by the body): the
            // client's connection is cut, without a terminator.
            After::Failed(e) => return Err(io::Error::other(e)),
            After::Ended => return Ok(()),
        }
    }
}

/// The slices of one write: the head, a chunk's size line, up to [`MAX_BATCH`] frames,
/// their end and the terminator, without an allocation per write.
struct Slices<'a> {
    s: [IoSlice<'a>; MAX_BATCH + 4],
    k: usize,
}

impl<'a> Slices<'a> {
    fn new() -> Self {
        Slices {
            s: [IoSlice::new(&[]); MAX_BATCH + 4],
            k: 0,
        }
    }

    fn push(&mut self, b: &'a [u8]) {
        self.s[self.k] = IoSlice::new(b);
        self.k += 1;
    }

    fn as_mut(&mut self) -> &mut [IoSlice<'a>] {
        &mut self.s[..self.k]
    }
}

/// A chunk's size line (`<hex>\r\n`) in `out`, without an allocation per chunk.
fn chunk_size_line(n: usize, out: &mut [u8; 18]) -> &[u8] {
    let digits = (usize::BITS - n.leading_zeros()).div_ceil(4).max(1) as usize;
    for i in 0..digits {
        out[digits - 1 - i] = b"0123456789abcdef"[(n >> (4 * i)) & 0xf];
    }
    out[digits] = b'\r';
    out[digits + 1] = b'\n';
    &out[..digits + 2]
}

/// Writes every byte of `bufs`, in as few `writev` calls as the socket takes.
async fn write_all(sock: &mut TcpStream, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !bufs.is_empty() {
        let n = sock.write_vectored(bufs).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// The response head as hyper's server writes it, and the body's framing.
fn encode_head(
    parts: &http::response::Parts,
    body: &ProxyBody,
    keep_alive: bool,
) -> (Vec<u8>, Framing) {
    let status = parts.status;
    let mut out = Vec::with_capacity(128 + parts.headers.len() * 48);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    match parts.extensions.get::<hyper::ext::ReasonPhrase>() {
        Some(r) => out.extend_from_slice(r.as_bytes()),
        None => out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes()),
    }
    out.extend_from_slice(b"\r\n");
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let framing = if bodiless {
        Framing::None
    } else if let Some(n) = declared {
        Framing::Length(n)
    } else if body.is_end_stream() {
        Framing::Length(0)
    } else if let Some(n) = body.size_hint().exact() {
        Framing::Length(n)
    } else {
        Framing::Chunked
    };
    let mut dated = false;
    for (name, value) in &parts.headers {
        if name == header::CONTENT_LENGTH && (bodiless || declared.is_none()) {
            continue;
        }
        dated |= name == header::DATE;
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        Framing::Length(n) if declared.is_none() => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(n.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        _ => {}
    }
    if !keep_alive && !parts.headers.contains_key(header::CONNECTION) {
        out.extend_from_slice(b"connection: close\r\n");
    }
    if !dated {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(&date());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    (out, framing)
}

/// The `date` header's value now, formatted once per second per thread.
fn date() -> [u8; 29] {
    use std::cell::Cell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: Cell<(u64, [u8; 29])> = const { Cell::new((u64::MAX, [0; 29])) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let (at, v) = c.get();
        if at == secs {
            return v;
        }
        let mut v = [b' '; 29];
        let s = httpdate::fmt_http_date(now);
        let n = s.len().min(29);
        v[..n].copy_from_slice(&s.as_bytes()[..n]);
        c.set((secs, v));
        v
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lean(raw: &str) -> Option<LeanHead> {
        match parse(raw.as_bytes(), 1 << 20) {
            Parsed::Lean(h) => Some(h),
            _ => None,
        }
    }

    #[test]
    fn a_plain_generation_request_is_lean() {
        let raw = "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nX-A: 1\r\nx-a: 2\r\n\r\n{}";
        let h = lean(raw).expect("lean");
        assert_eq!(h.len, raw.len() - 2);
        assert_eq!(h.content_length, 2);
        assert!(!h.close);
        assert_eq!(h.parts.uri.path(), "/v1/chat/completions");
        assert_eq!(h.parts.uri.query(), Some("x=1"));
        assert_eq!(h.parts.headers.get_all("x-a").iter().count(), 2);
        let h = lean("POST /v1/completions HTTP/1.1\r\nconnection: keep-alive, Close\r\ncontent-length: 0\r\n\r\n")
            .expect("lean");
        assert!(h.close);
        assert!(matches!(
            parse(b"POST /v1/completions HTTP/1.1\r\ncontent-le", 10),
            Parsed::Partial
        ));
    }

    /// Everything with a second reading, or that hyper answers (400, 413, 431), is hyper's.
    #[test]
    fn anything_to_interpret_is_left_to_hyper() {
        let cases = [
            "GET /v1/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/models HTTP/1.1\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/completions HTTP/1.0\r\ncontent-length: 2\r\n\r\n",
            "POST http://a/v1/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: +2\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2, 2\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2000000\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\nte: trailers\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\nx-folded: a\r\n b\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length : 2\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ];
        for c in cases {
            assert!(
                matches!(parse(c.as_bytes(), 1 << 20), Parsed::Other),
                "{c:?}"
            );
        }
        let many: String = (0..MAX_FIELDS + 1)
            .map(|i| format!("x-{i}: 1\r\n"))
            .collect();
        let raw = format!("POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\n{many}\r\n");
        assert!(matches!(parse(raw.as_bytes(), 1 << 20), Parsed::Other));
    }

    /// Differential fuzzing of the lean head parser against hyper's server, which serves
    /// every head the lean path leaves alone. Heads are built from the pieces smuggling and
    /// framing attacks are made of (duplicate, signed, listed and padded lengths,
    /// `transfer-encoding`, obs-fold, bare LF, absolute form, other methods and versions,
    /// random fields), with a body and a pipelined request behind them and now and then a
    /// byte overwritten; most are near misses of a lean head. Whenever the lean path takes a
    /// head as its own, hyper must read the same bytes as the same request: method, target,
    /// version, every header in order, and the same body when the bytes hold it. A head
    /// hyper refuses, or reads with another body (another framing), is one the lean path
    /// would serve differently from the rest of capture: a desync. Bounded in CI;
    /// `LLMREPLAY_FUZZ_CASES=N` runs `N` cases (`bench/fuzz.sh lean`).
    mod differential {
        use super::*;
        use http_body_util::BodyExt;
        use proptest::prelude::*;

        const MAX_BODY: usize = 64;

        fn line() -> impl Strategy<Value = String> {
            let method = prop_oneof![
                16 => Just("POST"),
                1 => Just("GET"),
                1 => Just("post"),
                1 => Just("PUT"),
                1 => Just("POST "),
            ];
            let target = prop_oneof![
                6 => Just("/v1/completions"),
                4 => Just("/v1/chat/completions?stream=1"),
                1 => Just("http://a/v1/completions"),
                1 => Just("/v1/completions#x"),
                1 => Just("/v1/models"),
                1 => Just("//v1/completions"),
                1 => Just("/v1/completions?a b"),
                1 => Just("*"),
                1 => Just("/v1/chat/completions/"),
            ];
            let version = prop_oneof![
                16 => Just("HTTP/1.1"),
                1 => Just("HTTP/1.0"),
                1 => Just("HTTP/2.0"),
                1 => Just("http/1.1"),
                1 => Just("HTTP/1.1 "),
            ];
            (method, target, version).prop_map(|(m, t, v)| format!("{m} {t} {v}"))
        }

        /// The field that says the body's length, or one of its near misses.
        fn length(len: usize) -> impl Strategy<Value = String> {
            prop_oneof![
                12 => Just(format!("Content-Length: {len}")),
                4 => Just(format!("content-length:{len}")),
                1 => Just(format!("content-length: 0{len}")),
                1 => Just(format!("content-length: {len} ")),
                1 => Just(format!("content-length:\t{len}\t")),
                1 => Just(format!("content-length: +{len}")),
                1 => Just(format!("content-length: -{len}")),
                1 => Just(format!("content-length: {len}, {len}")),
                1 => Just(format!("content-length : {len}")),
                1 => Just(format!("content-length: {len}x")),
                1 => Just(format!("content-length: {}", len + 1)),
                1 => Just("content-length: 18446744073709551616".to_string()),
                1 => Just("content-length: 9999999999999999999".to_string()),
                1 => Just("content-length: ".to_string()),
                1 => Just("Transfer-Encoding: chunked".to_string()),
            ]
        }

        fn field(len: usize) -> impl Strategy<Value = String> {
            prop_oneof![
                6 => Just("Host: a".to_string()),
                4 => Just("x-request-id: 7".to_string()),
                2 => Just("authorization: Bearer sk-1".to_string()),
                2 => Just("Connection: close".to_string()),
                2 => Just("connection: keep-alive".to_string()),
                2 => length(len),
                1 => Just("transfer-encoding: identity".to_string()),
                1 => Just("Transfer-Encoding: chunked".to_string()),
                1 => Just("connection: keep-alive, Upgrade".to_string()),
                1 => Just("upgrade: h2c".to_string()),
                1 => Just("Expect: 100-continue".to_string()),
                1 => Just("TE: trailers".to_string()),
                1 => Just("x-folded: a\r\n b".to_string()),
                1 => Just(" x-leading: space".to_string()),
                1 => Just("x-empty:".to_string()),
                1 => Just("x-nul: a\0b".to_string()),
                1 => Just("x-cr: a\rb".to_string()),
                2 => "[ -~\t]{0,12}:[ -~\t\u{80}-\u{ff}]{0,12}",
            ]
        }

        /// A request's bytes.
        fn request() -> impl Strategy<Value = Vec<u8>> {
            (0..=MAX_BODY + 8).prop_flat_map(|len| {
                (
                    line(),
                    length(len),
                    prop::collection::vec(field(len), 0..5),
                    any::<prop::sample::Index>(),
                    prop_oneof![6 => Just("\r\n"), 1 => Just("\n")],
                    prop::collection::vec(any::<u8>(), len..=len + 8),
                    any::<bool>(),
                    prop::option::weighted(0.2, (any::<prop::sample::Index>(), any::<u8>())),
                )
                    .prop_map(
                        |(line, length, mut fields, at, eol, body, pipelined, poke)| {
                            fields.insert(at.index(fields.len() + 1), length);
                            let mut head = line;
                            for f in fields {
                                head.push_str(eol);
                                head.push_str(&f);
                            }
                            head.push_str(eol);
                            head.push_str(eol);
                            let mut bytes = head.into_bytes();
                            bytes.extend_from_slice(&body);
                            if pipelined {
                                bytes.extend_from_slice(
                                    b"POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}",
                                );
                            }
                            if let Some((at, b)) = poke {
                                let i = at.index(bytes.len());
                                bytes[i] = b;
                            }
                            bytes
                        },
                    )
            })
        }

        /// What hyper's server reads from `bytes`: the first request's head, and its whole
        /// body unless hyper waits for more bytes (or fails reading it).
        type Read = (http::request::Parts, Option<Bytes>);

        fn hyper_reads(bytes: &[u8]) -> Result<Read, String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let (mut client, server) = tokio::io::duplex(1 << 16);
                client.write_all(bytes).await.unwrap();
                let (head_tx, mut head_rx) = tokio::sync::mpsc::unbounded_channel();
                let (body_tx, mut body_rx) = tokio::sync::mpsc::unbounded_channel();
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (head_tx, body_tx) = (head_tx.clone(), body_tx.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        let _ = head_tx.send(parts);
                        if let Ok(b) = body.collect().await {
                            let _ = body_tx.send(b.to_bytes());
                        }
                        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Empty::<
                            Bytes,
                        >::new(
                        )))
                    }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(server), svc);
                let ended = tokio::select! {
                    r = conn => format!("{r:?}"),
                    // The paused clock gets here only once nothing else can run: hyper is
                    // waiting for bytes that will not come.
                    _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {
                        "waiting for more".into()
                    }
                };
                // The first request is kept whatever hyper did after it (refused a
                // pipelined request it cannot parse, waited for a body's last bytes).
                let parts = head_rx
                    .try_recv()
                    .map_err(|_| format!("no request read; the connection: {ended}"))?;
                Ok((parts, body_rx.try_recv().ok()))
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(wire::testing::fuzz_cases(1024)))]

            #[test]
            fn a_lean_head_is_the_request_hyper_reads(bytes in request()) {
                let Parsed::Lean(h) = parse(&bytes, MAX_BODY) else {
                    return Ok(());
                };
                let shown = String::from_utf8_lossy(&bytes).into_owned();
                let (parts, body) = hyper_reads(&bytes).map_err(|e| {
                    TestCaseError::fail(format!("lean took a head hyper refuses ({e}): {shown:?}"))
                })?;
                prop_assert_eq!(&parts.method, &h.parts.method, "{:?}", shown);
                prop_assert_eq!(&parts.uri, &h.parts.uri, "{:?}", shown);
                prop_assert_eq!(parts.version, h.parts.version, "{:?}", shown);
                prop_assert_eq!(&parts.headers, &h.parts.headers, "{:?}", shown);
                let want = bytes.get(h.len..h.len + h.content_length);
                prop_assert_eq!(body.as_deref(), want, "{:?}", shown);
            }

            /// Any bytes at all: a verdict, never a panic, and a lean head inside them.
            #[test]
            fn any_bytes_are_a_verdict(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
                if let Parsed::Lean(h) = parse(&bytes, MAX_BODY) {
                    prop_assert!(h.len <= bytes.len() && h.content_length <= MAX_BODY);
                }
            }
        }
    }

    #[test]
    fn chunk_size_lines_are_hex() {
        for n in [0usize, 1, 15, 16, 255, 4096, 123_456_789, usize::MAX] {
            let mut b = [0u8; 18];
            assert_eq!(chunk_size_line(n, &mut b), format!("{n:x}\r\n").as_bytes());
        }
    }

    fn head_of(resp: Response<ProxyBody>, keep_alive: bool) -> (String, &'static str) {
        let (parts, body) = resp.into_parts();
        let (h, f) = encode_head(&parts, &body, keep_alive);
        let f = match f {
            Framing::None => "none",
            Framing::Length(_) => "length",
            Framing::Chunked => "chunked",
        };
        (String::from_utf8(h).unwrap(), f)
    }

    #[test]
    fn the_head_says_how_the_body_is_framed() {
        let full = |s: &'static str| ProxyBody::Full(http_body_util::Full::new(Bytes::from(s)));
        let mut r = Response::new(full("{}"));
        r.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        let (h, f) = head_of(r, true);
        assert_eq!(f, "length");
        assert!(
            h.starts_with(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\ndate: "
            ),
            "{h}"
        );
        assert!(h.ends_with(" GMT\r\n\r\n"), "{h}");
        let mut r = Response::new(full(""));
        *r.status_mut() = StatusCode::NO_CONTENT;
        r.headers_mut().insert(
            "date",
            HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"),
        );
        let (h, f) = head_of(r, false);
        assert_eq!(f, "none");
        assert_eq!(
            h,
            "HTTP/1.1 204 No Content\r\ndate: Thu, 01 Jan 1970 00:00:00 GMT\r\nconnection: close\r\n\r\n"
        );
        let mut r = Response::new(full("x"));
        r.extensions_mut()
            .insert(hyper::ext::ReasonPhrase::try_from(&b"Fine"[..]).unwrap());
        assert!(head_of(r, true).0.starts_with("HTTP/1.1 200 Fine\r\n"));
    }
}
