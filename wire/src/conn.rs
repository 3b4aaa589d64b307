//! One HTTP/1.1 client connection: one task owns the socket, writes the request in one call,
//! and decodes the response (head, then a `content-length`, chunked or close-delimited
//! body) straight from its read buffer.
//!
//! Why not hyper: a hyper connection is a driver future plus a body channel, so every body
//! frame costs a channel hand-over and waker round trips between the two; at 100k SSE
//! events/s that bookkeeping, not the SSE parsing, was most of the client's CPU (bench/).
//! Here a body byte goes from `read(2)` to its consumer with no copy and no hop:
//! - replay reads with [`Conn::read_body`], a callback per read with the *kernel's* receive
//!   time of the bytes (`SO_TIMESTAMPNS` on Linux, read with `recvmsg`), so a client that
//!   falls behind in a burst still records when each chunk arrived;
//! - capture reads with [`Conn::poll_body`], one frame per read split off the read buffer
//!   without a copy, like nginx's `proxy_buffering off`.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::framing::{response_framing, ChunkedDecoder, Framing};
use crate::habit::{self, Habit, Kind};

/// Free room kept in the read buffer before each read.
const READ_ROOM: usize = 8 * 1024;
/// Most response header fields accepted (hyper's default).
const MAX_HEADERS: usize = 100;

/// A TCP stream that counts the bytes the kernel accepted from it and, when stamping, keeps
/// the kernel's receive time of the bytes of its last read.
pub struct Stamped {
    tcp: TcpStream,
    stamping: bool,
    /// CLOCK_REALTIME ns of the last read's data (0: none).
    stamp_ns: i64,
    /// Bytes the kernel accepted for sending, ever.
    written: u64,
    /// Read with a direct non-blocking `recv`, whatever the reactor last saw (the liveness
    /// check of a TLS connection).
    direct: bool,
    /// Writes go straight to the socket until one would block ([`crate::direct`]): the
    /// request on a new connection goes out without waiting for a reactor turn.
    writes: crate::direct::Writes,
}

impl Stamped {
    /// `tcp`, with the kernel stamping every read when `stamping` (Linux).
    pub fn new(tcp: TcpStream, stamping: bool) -> Stamped {
        #[cfg(unix)]
        if stamping {
            use std::os::fd::AsRawFd;
            crate::rxstamp::enable(tcp.as_raw_fd());
        }
        Stamped {
            tcp,
            stamping,
            stamp_ns: 0,
            written: 0,
            direct: false,
            writes: crate::direct::Writes::NEW,
        }
    }

    /// When the bytes of the last read arrived, as an `Instant`; `read_at` without a stamp
    /// (or with one that is not plausible: from the future, or over 10 s old).
    fn arrival(&self, read_at: Instant) -> Instant {
        if self.stamp_ns == 0 {
            return read_at;
        }
        let (now, now_rt) = cached_clock_pair(read_at);
        let age = now_rt - self.stamp_ns;
        if !(0..10_000_000_000).contains(&age) {
            return read_at;
        }
        now.checked_sub(std::time::Duration::from_nanos(age as u64))
            .unwrap_or(read_at)
            .min(read_at)
    }

    /// What the socket holds right now, asked of the kernel (not of the reactor's last
    /// readiness event, which may not have seen a FIN that just arrived).
    fn peek(&self) -> Peek {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            let mut b = [0u8; 1];
            loop {
                // SAFETY: recv into a live 1-byte buffer.
                let n = unsafe {
                    libc::recv(
                        self.tcp.as_raw_fd(),
                        b.as_mut_ptr().cast(),
                        1,
                        libc::MSG_PEEK | libc::MSG_DONTWAIT,
                    )
                };
                return match n {
                    0 => Peek::Closed,
                    n if n > 0 => Peek::Data,
                    _ => match io::Error::last_os_error().kind() {
                        io::ErrorKind::WouldBlock => Peek::Quiet,
                        io::ErrorKind::Interrupted => continue,
                        _ => Peek::Closed,
                    },
                };
            }
        }
        #[cfg(not(unix))]
        Peek::Quiet
    }

    #[cfg(target_os = "linux")]
    fn poll_recv(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        use std::os::fd::AsRawFd;
        use tokio::io::Interest;
        let fd = self.tcp.as_raw_fd();
        loop {
            if !self.direct {
                ready!(self.tcp.poll_read_ready(cx))?;
            }
            // SAFETY: rxstamp::recv only writes into the unfilled part, and `n` bytes of it
            // are initialized when it returns Ok(n).
            let unfilled = unsafe { buf.unfilled_mut() };
            let room = unfilled.len();
            if self.direct {
                return match crate::rxstamp::recv(fd, unfilled, libc::MSG_DONTWAIT) {
                    Ok((n, stamp)) => {
                        // SAFETY: recvmsg initialized the first n bytes of `unfilled`.
                        unsafe { buf.assume_init(n) };
                        buf.advance(n);
                        self.stamp_ns = stamp;
                        Poll::Ready(Ok(()))
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
                    Err(e) => Poll::Ready(Err(e)),
                };
            }
            let mut got = None;
            // A short read drained the socket: report WouldBlock to try_io as well, so it
            // clears the readiness it observed before the read (a newer readiness event
            // survives), as tokio's own TcpStream does, and the next read waits for data
            // instead of paying a recvmsg that returns EAGAIN.
            let r = self.tcp.try_io(Interest::READABLE, || {
                let (n, stamp) = crate::rxstamp::recv(fd, unfilled, libc::MSG_DONTWAIT)?;
                got = Some((n, stamp));
                if n > 0 && n < room {
                    Err(io::ErrorKind::WouldBlock.into())
                } else {
                    Ok(())
                }
            });
            match (got, r) {
                (Some((n, stamp)), _) => {
                    // SAFETY: recvmsg initialized the first n bytes of `unfilled`.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    self.stamp_ns = stamp;
                    return Poll::Ready(Ok(()));
                }
                (None, Err(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
                (None, Err(e)) => return Poll::Ready(Err(e)),
                (None, Ok(())) => continue,
            }
        }
    }
}

/// What a connection's socket holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peek {
    /// Nothing to read: open and quiet.
    Quiet,
    /// The peer closed it (or it failed).
    Closed,
    /// Bytes wait to be read.
    Data,
}

/// [`crate::rxstamp::clock_pair`] read at most once per millisecond per thread and carried
/// forward to `now` on the monotonic clock: converting a stamp then costs no clock read
/// beyond the caller's `now`. Over 1 ms the two clocks drift apart by at most NTP's 500 ppm
/// slew limit, 0.5 µs.
fn cached_clock_pair(now: Instant) -> (Instant, i64) {
    use std::cell::Cell;
    thread_local! {
        static PAIR: Cell<Option<(Instant, i64)>> = const { Cell::new(None) };
    }
    PAIR.with(|p| {
        let (mono, rt) = match p.get() {
            Some((m, r)) if now >= m && now - m < std::time::Duration::from_millis(1) => (m, r),
            _ => {
                let fresh = crate::rxstamp::clock_pair();
                p.set(Some(fresh));
                fresh
            }
        };
        if now >= mono {
            (now, rt + (now - mono).as_nanos() as i64)
        } else {
            (mono, rt)
        }
    })
}

impl AsyncRead for Stamped {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        #[cfg(target_os = "linux")]
        if me.stamping || me.direct {
            return me.poll_recv(cx, buf);
        }
        Pin::new(&mut me.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stamped {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        #[cfg(target_os = "linux")]
        let direct = {
            use std::os::fd::AsRawFd;
            me.writes.write(me.tcp.as_raw_fd(), b)
        };
        #[cfg(not(target_os = "linux"))]
        let direct = None;
        let n = match direct {
            Some(r) => r?,
            None => ready!(Pin::new(&mut me.tcp).poll_write(cx, b))?,
        };
        me.written += n as u64;
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// Plain TCP or TLS.
pub enum Io {
    /// Plain TCP.
    Plain(Stamped),
    /// rustls over TCP.
    Tls(Box<tokio_rustls::client::TlsStream<Stamped>>),
}

impl Io {
    fn tcp(&self) -> &Stamped {
        match self {
            Io::Plain(s) => s,
            Io::Tls(s) => s.get_ref().0,
        }
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }

    async fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Io::Plain(s) => s.write_all(b).await,
            Io::Tls(s) => {
                s.write_all(b).await?;
                s.flush().await
            }
        }
    }
}

/// A parsed final response head.
#[derive(Debug, Clone)]
pub struct Head<T> {
    /// The status code.
    pub status: u16,
    /// The response is HTTP/1.0.
    pub http10: bool,
    /// How its body is delimited.
    pub framing: Framing,
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
    /// What the caller's interpreter took from the head.
    pub extra: T,
}

/// Why reading a response failed.
#[derive(Debug)]
pub enum ReadError {
    /// The connection closed before any byte of a response. The request was written, so
    /// the server may have read it: it is never sent again.
    ClosedBeforeResponse,
    /// The connection closed in the middle of the response (the part named).
    Truncated(&'static str),
    /// A socket error.
    Io(io::Error),
    /// The response is not valid HTTP/1.1.
    Protocol(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::ClosedBeforeResponse => f.write_str("connection closed before a response"),
            ReadError::Truncated(what) => write!(f, "connection closed in the {what}"),
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Protocol(m) => write!(f, "bad HTTP response: {m}"),
        }
    }
}

impl std::error::Error for ReadError {}

/// Why writing a request failed: whether any of it reached the connection decides whether it
/// may be sent again (the retry rule, [`crate::Pool::send`]).
#[derive(Debug)]
pub enum WriteError {
    /// Not one byte was accepted by the kernel: the server cannot have seen any of it.
    NothingSent(io::Error),
    /// Part of the request went out before the failure.
    Partial(io::Error),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::NothingSent(e) => write!(f, "{e}"),
            WriteError::Partial(e) => write!(f, "{e} (after part of the request was sent)"),
        }
    }
}

impl std::error::Error for WriteError {}

/// How far a response body has been read (its framing, what is left of it).
#[derive(Debug)]
pub struct BodyReader {
    framing: Framing,
    /// Bytes left of a `content-length` body.
    left: u64,
    chunked: ChunkedDecoder,
    done: bool,
}

impl BodyReader {
    /// The body of a response framed as `framing`.
    pub fn new(framing: Framing) -> BodyReader {
        BodyReader {
            framing,
            left: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            chunked: ChunkedDecoder::default(),
            done: framing == Framing::Length(0),
        }
    }

    /// The body has ended (where its framing said, or at EOF for a close-delimited one).
    pub fn done(&self) -> bool {
        self.done
    }

    /// Bytes left of a `content-length` body.
    pub fn remaining(&self) -> Option<u64> {
        matches!(self.framing, Framing::Length(_)).then_some(self.left)
    }

    /// The raw trailer lines of a chunked body (each ending in CRLF), once.
    pub fn take_trailers(&mut self) -> Vec<u8> {
        self.chunked.take_trailers()
    }

    /// Decodes what `buf` holds in place: `(data, used)`, the body data now in
    /// `buf[..data]` and the bytes of `buf` consumed.
    fn decode(&mut self, buf: &mut [u8]) -> Result<(usize, usize), ReadError> {
        let (data, used) = match self.framing {
            Framing::Eof => (buf.len(), buf.len()),
            Framing::Length(_) => {
                let n = (buf.len() as u64).min(self.left) as usize;
                self.left -= n as u64;
                self.done = self.left == 0;
                (n, n)
            }
            Framing::Chunked => {
                let r = self
                    .chunked
                    .decode(buf)
                    .map_err(|m| ReadError::Protocol(format!("invalid chunked body: {m}")))?;
                self.done = self.chunked.done();
                r
            }
        };
        Ok((data, used))
    }

    /// The connection ended: the end of a close-delimited body, else a truncation.
    fn eof(&mut self) -> Result<(), ReadError> {
        match self.framing {
            Framing::Eof => {
                self.done = true;
                Ok(())
            }
            Framing::Length(_) => Err(ReadError::Truncated("response body")),
            Framing::Chunked => Err(ReadError::Truncated("chunked response body")),
        }
    }
}

/// One HTTP/1.1 connection with its read buffer.
pub struct Conn {
    io: Io,
    /// Bytes read and not yet consumed.
    buf: BytesMut,
    /// What this connection tells its origin's habit (set by the pool).
    track: Track,
}

/// What a connection reports to its origin's [`Habit`]: whether it stayed open after a
/// response.
#[derive(Default)]
struct Track {
    habit: Option<Arc<Habit>>,
    /// Response heads read, by kind.
    served: [u32; 2],
    /// The kind of the last one.
    last: Option<Kind>,
    /// How long it sat idle before the request in flight (a reused connection).
    idled: Option<Duration>,
}

impl Conn {
    /// A connection over `io`.
    pub fn new(io: Io) -> Conn {
        Conn {
            io,
            buf: BytesMut::with_capacity(2 * READ_ROOM),
            track: Track::default(),
        }
    }

    /// Reports to `habit` what the server does with this connection after its responses.
    pub(crate) fn watch(&mut self, habit: Arc<Habit>) {
        self.track.habit = Some(habit);
    }

    /// The kind of the last response read on it.
    pub(crate) fn last_kind(&self) -> Option<Kind> {
        self.track.last
    }

    /// It is used again after sitting idle `idle` since its last response.
    pub(crate) fn reused_after(&mut self, idle: Duration) {
        self.track.idled = Some(idle);
    }

    /// Its request found it closed before anything was written: as [`Conn::closed_after`]
    /// the idle time it was reused after.
    pub(crate) fn closed_in_use(&mut self) {
        if let Some(idle) = self.track.idled.take() {
            self.closed_after(idle);
        }
    }

    /// It was found closed (or reset) `idle` after its last response: when that came
    /// [`habit::RIGHT_AFTER`] the first response of its kind on it, the server closed it
    /// after that response without saying so (a close after N requests, or when idle,
    /// does not count).
    pub(crate) fn closed_after(&self, idle: Duration) {
        let t = &self.track;
        if let (Some(h), Some(k)) = (&t.habit, t.last) {
            if t.served[k as usize] == 1 && idle < habit::RIGHT_AFTER {
                h.closed(k);
            }
        }
    }

    /// Whether the connection can take a request now: nothing unread in its buffer, and the
    /// kernel says the peer has neither closed it nor sent anything unasked.
    pub fn is_usable(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        match (self.io.tcp().peek(), &mut self.io) {
            (Peek::Quiet, _) => true,
            (Peek::Closed, _) | (Peek::Data, Io::Plain(_)) => false,
            // TLS: the bytes may be a session ticket (no data) or a close_notify alert.
            (Peek::Data, Io::Tls(s)) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let mut scratch = [0u8; 256];
                let mut rb = ReadBuf::new(&mut scratch);
                s.get_mut().0.direct = true;
                let r = Pin::new(&mut **s).poll_read(&mut cx, &mut rb);
                s.get_mut().0.direct = false;
                r.is_pending()
            }
        }
    }

    /// Whether writes still go straight to the socket, and the bytes the kernel accepted.
    #[cfg(test)]
    pub(crate) fn write_state(&self) -> (bool, u64) {
        let s = self.io.tcp();
        (s.writes.is_direct(), s.written)
    }

    /// Writes a whole request (head and body in one buffer). On failure, says whether any of
    /// it reached the kernel.
    pub async fn write_request(&mut self, request: &[u8]) -> Result<(), WriteError> {
        self.buf.clear();
        let before = self.io.tcp().written;
        match self.io.write_all(request).await {
            Ok(()) => Ok(()),
            Err(e) if self.io.tcp().written == before => Err(WriteError::NothingSent(e)),
            Err(e) => Err(WriteError::Partial(e)),
        }
    }

    /// When the bytes of the last read arrived: the kernel's receive time when the
    /// connection stamps reads, else `read_at`.
    fn arrival(&self, read_at: Instant) -> Instant {
        let s = self.io.tcp();
        if s.stamping {
            s.arrival(read_at)
        } else {
            read_at
        }
    }

    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.buf.reserve(READ_ROOM);
        let mut rb = ReadBuf::uninit(self.buf.spare_capacity_mut());
        ready!(self.io.poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        // SAFETY: the read initialized the first `n` bytes of the spare capacity.
        unsafe { self.buf.set_len(self.buf.len() + n) };
        Poll::Ready(Ok(n))
    }

    async fn fill(&mut self) -> Result<usize, ReadError> {
        poll_fn(|cx| self.poll_fill(cx))
            .await
            .map_err(ReadError::Io)
    }

    /// Reads the final response head (skipping `1xx` interim responses), of at most
    /// `max_head` bytes, handing the parsed head to `interpret` for what the caller keeps of
    /// it. Body bytes read with it stay in the buffer; the `Instant` is when the head's first
    /// bytes arrived.
    pub async fn read_head<T>(
        &mut self,
        max_head: usize,
        interpret: impl FnMut(&httparse::Response<'_, '_>) -> Result<T, String>,
    ) -> Result<(Head<T>, Instant), ReadError> {
        let r = self.read_head_inner(max_head, interpret).await;
        let idled = self.track.idled.take();
        match &r {
            Ok((h, _)) => {
                let t = &mut self.track;
                if let (Some(habit), Some(k)) = (&t.habit, t.last) {
                    habit.kept(k);
                }
                let k = Kind::of(h.framing);
                t.served[k as usize] = t.served[k as usize].saturating_add(1);
                t.last = Some(k);
            }
            Err(ReadError::ClosedBeforeResponse) | Err(ReadError::Io(_)) if self.buf.is_empty() => {
                if let Some(idle) = idled {
                    self.closed_after(idle);
                }
            }
            Err(_) => {}
        }
        r
    }

    async fn read_head_inner<T>(
        &mut self,
        max_head: usize,
        mut interpret: impl FnMut(&httparse::Response<'_, '_>) -> Result<T, String>,
    ) -> Result<(Head<T>, Instant), ReadError> {
        let mut first_byte = None;
        loop {
            // Parse what is there first: a previous interim response may have left a head.
            if !self.buf.is_empty() {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut resp = httparse::Response::new(&mut headers);
                match resp.parse(&self.buf) {
                    Ok(httparse::Status::Complete(n)) => {
                        let status = resp.code.unwrap_or(0);
                        if (100..200).contains(&status) && status != 101 {
                            self.buf.advance(n);
                            continue;
                        }
                        let http10 = resp.version == Some(0);
                        let f = response_framing(status, http10, resp.headers)
                            .map_err(ReadError::Protocol)?;
                        let extra = interpret(&resp).map_err(ReadError::Protocol)?;
                        self.buf.advance(n);
                        let head = Head {
                            status,
                            http10,
                            framing: f.framing,
                            keep_alive: f.keep_alive,
                            extra,
                        };
                        return Ok((head, first_byte.unwrap_or_else(Instant::now)));
                    }
                    Ok(httparse::Status::Partial) if self.buf.len() > max_head => {
                        return Err(ReadError::Protocol(format!(
                            "response head over {} KiB",
                            max_head / 1024
                        )))
                    }
                    Ok(httparse::Status::Partial) => {}
                    Err(e) => return Err(ReadError::Protocol(e.to_string())),
                }
            }
            if self.fill().await? == 0 {
                return Err(if self.buf.is_empty() && first_byte.is_none() {
                    ReadError::ClosedBeforeResponse
                } else {
                    ReadError::Truncated("response head")
                });
            }
            if first_byte.is_none() {
                first_byte = Some(self.arrival(Instant::now()));
            }
        }
    }

    /// Reads the body to its end, handing each decoded span to `on_data` with the arrival
    /// time of the read that delivered it (`start` for bytes read with the head). Returns
    /// whether the connection can take another request: the body ended exactly where its
    /// framing said, with nothing after it.
    pub async fn read_body(
        &mut self,
        framing: Framing,
        start: Instant,
        mut on_data: impl FnMut(&[u8], Instant),
    ) -> Result<bool, ReadError> {
        let r = self
            .read_body_while(framing, start, |d, t| {
                on_data(d, t);
                true
            })
            .await?;
        Ok(r.unwrap_or(false))
    }

    /// [`Conn::read_body`] for as long as `on_data` returns true: `Ok(None)` when it stopped
    /// the read (the response is not finished: the connection must be dropped, which tells
    /// the server the client went away), else whether the connection can be reused.
    pub async fn read_body_while(
        &mut self,
        framing: Framing,
        start: Instant,
        mut on_data: impl FnMut(&[u8], Instant) -> bool,
    ) -> Result<Option<bool>, ReadError> {
        let mut body = BodyReader::new(framing);
        let mut t = start;
        loop {
            if body.done() {
                return Ok(Some(framing != Framing::Eof && self.buf.is_empty()));
            }
            if !self.buf.is_empty() {
                let (data, used) = body.decode(&mut self.buf)?;
                let go_on = data == 0 || on_data(&self.buf[..data], t);
                self.buf.advance(used);
                if !go_on {
                    return Ok(None);
                }
                continue;
            }
            if self.fill().await? == 0 {
                body.eof()?;
                continue;
            }
            t = self.arrival(Instant::now());
        }
    }

    /// The next frame of `body`: what one read delivered, split off the read buffer without
    /// a copy; `None` once the body has ended. After the end, [`Conn::is_clean`] says
    /// whether anything followed it.
    pub fn poll_body(
        &mut self,
        body: &mut BodyReader,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, ReadError>> {
        loop {
            if body.done() {
                return Poll::Ready(Ok(None));
            }
            if !self.buf.is_empty() {
                let (data, used) = body.decode(&mut self.buf)?;
                let frame = self.buf.split_to(data).freeze();
                self.buf.advance(used - data);
                if !frame.is_empty() {
                    return Poll::Ready(Ok(Some(frame)));
                }
                continue;
            }
            if ready!(self.poll_fill(cx)).map_err(ReadError::Io)? == 0 {
                body.eof()?;
            }
        }
    }

    /// Nothing is left unread in the buffer (a body ended exactly at its end).
    pub fn is_clean(&self) -> bool {
        self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn serve_once(response: &'static [u8]) -> std::net::SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut req = [0u8; 1024];
            let _ = s.read(&mut req).await;
            for piece in response.chunks(7) {
                s.write_all(piece).await.unwrap();
                s.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        addr
    }

    async fn conn(addr: std::net::SocketAddr, stamping: bool) -> Conn {
        let tcp = TcpStream::connect(addr).await.unwrap();
        Conn::new(Io::Plain(Stamped::new(tcp, stamping)))
    }

    fn sse(r: &httparse::Response<'_, '_>) -> Result<bool, String> {
        Ok(r.headers.iter().any(|h| {
            h.name.eq_ignore_ascii_case("content-type") && h.value.starts_with(b"text/event-stream")
        }))
    }

    #[tokio::test]
    async fn reads_an_interim_then_a_chunked_response_on_a_real_socket() {
        let addr = serve_once(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n3\r\nx\n\n\r\n0\r\n\r\n",
        )
        .await;
        let mut c = conn(addr, true).await;
        c.write_request(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let (h, t) = c.read_head(64 * 1024, sse).await.unwrap();
        assert_eq!((h.status, h.extra, h.keep_alive), (200, true, true));
        let mut body = Vec::new();
        let reusable = c
            .read_body(h.framing, t, |d, _| body.extend_from_slice(d))
            .await
            .unwrap();
        assert_eq!(body, b"data: x\n\n");
        assert!(reusable);
    }

    #[tokio::test]
    async fn frames_follow_the_reads_and_end_with_the_body() {
        let addr = serve_once(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\nx-t: 1\r\n\r\n",
        )
        .await;
        let mut c = conn(addr, false).await;
        c.write_request(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let (h, _) = c.read_head(1024, |_| Ok(())).await.unwrap();
        let mut body = BodyReader::new(h.framing);
        let mut got = Vec::new();
        while let Some(f) = poll_fn(|cx| c.poll_body(&mut body, cx)).await.unwrap() {
            assert!(!f.is_empty());
            got.extend_from_slice(&f);
        }
        assert_eq!(got, b"abcde");
        assert!(c.is_clean());
        assert_eq!(body.take_trailers(), b"x-t: 1\r\n");
    }

    /// A reader that has what it wants stops: the rest of the body is not read.
    #[tokio::test]
    async fn a_read_can_stop_before_the_body_ends() {
        let addr = serve_once(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .await;
        let mut c = conn(addr, false).await;
        c.write_request(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let (h, t) = c.read_head(1024, |_| Ok(())).await.unwrap();
        let mut seen = Vec::new();
        let r = c
            .read_body_while(h.framing, t, |d, _| {
                seen.extend_from_slice(d);
                !seen.contains(&b'a')
            })
            .await
            .unwrap();
        assert_eq!(r, None, "stopped");
        assert!(seen.starts_with(b"a") && !seen.ends_with(b"de"), "{seen:?}");
    }

    #[test]
    fn the_cached_clock_pair_follows_the_wall_clock() {
        // Within its millisecond the cached pair is carried forward on the monotonic clock;
        // after it, it is read again. Either way it names the wall-clock time of `now`.
        for pause in [0u64, 300, 1_500] {
            let _ = cached_clock_pair(Instant::now());
            std::thread::sleep(std::time::Duration::from_micros(pause));
            let before = crate::clock::epoch_ns();
            let (mono, rt) = cached_clock_pair(Instant::now());
            let after = crate::clock::epoch_ns();
            assert!(mono <= Instant::now());
            // Loose bounds: a preempted test thread widens [before, after], never the pair.
            assert!(rt >= before - 50_000, "{rt} before {before}");
            assert!(rt <= after + 50_000, "{rt} after {after}");
        }
    }

    /// Bytes that waited in the socket are stamped with when they arrived, not when they
    /// were read (Linux: SO_TIMESTAMPNS).
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn arrival_is_the_kernel_receive_time_not_the_read_time() {
        // The server on a thread of its own: this test blocks its runtime's only thread below,
        // and a server task on that runtime would not answer until the read (it did not, now
        // and then, under load: "stamped 0ns").
        // And the kernel's stamping on before the response arrives (it was not, once in a
        // full test run: "stamped 0ns" again, the read's own time).
        let _on = crate::rxstamp::kernel_stamps_on();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (written, answered) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut s, _) = l.accept().unwrap();
            let mut req = [0u8; 1024];
            let _ = s.read(&mut req);
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .unwrap();
            let _ = written.send(());
            s
        });
        let mut c = conn(addr, true).await;
        c.write_request(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        // The whole response is in the socket once the server says it wrote it (under load the
        // server thread could be scheduled late, after a fixed sleep had begun: "stamped 40ms");
        // this task reads it 200 ms after that.
        answered.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let read_at = Instant::now();
        let (h, arrived) = c.read_head(1024, |_| Ok(())).await.unwrap();
        assert_eq!(h.status, 200);
        let waited = read_at.duration_since(arrived);
        assert!(
            waited >= std::time::Duration::from_millis(150),
            "stamped {waited:?} before the read"
        );
        drop(server.join().unwrap());
    }

    #[tokio::test]
    async fn a_closed_connection_is_told_apart_from_a_truncated_response() {
        let addr = serve_once(b"").await;
        let mut c = conn(addr, true).await;
        c.write_request(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert!(matches!(
            c.read_head(1024, |_| Ok(())).await,
            Err(ReadError::ClosedBeforeResponse)
        ));
        let addr = serve_once(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc").await;
        let mut c = conn(addr, false).await;
        c.write_request(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let (h, t) = c.read_head(1024, |_| Ok(())).await.unwrap();
        let r = c.read_body(h.framing, t, |_, _| {}).await;
        assert!(matches!(r, Err(ReadError::Truncated(_))), "{r:?}");
    }

    /// The liveness check asks the kernel: a FIN that arrived while the connection sat idle
    /// makes it unusable at once, before the reactor has seen it; stray bytes do too.
    #[tokio::test]
    async fn the_liveness_check_sees_a_close_and_stray_bytes() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut c = conn(addr, false).await;
        let (server, _) = l.accept().await.unwrap();
        assert!(c.is_usable(), "open and quiet");
        drop(server);
        // std's blocking sleep: no reactor turn between the close and the check.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!c.is_usable(), "closed by the peer");

        let mut c = conn(addr, false).await;
        let (mut server, _) = l.accept().await.unwrap();
        server
            .write_all(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
            .await
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!c.is_usable(), "unasked bytes");
    }

    /// A write to a connection the peer reset is refused before any byte leaves: the error
    /// says nothing was sent.
    #[tokio::test]
    async fn a_refused_write_says_nothing_was_sent() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut c = conn(addr, false).await;
        let (server, _) = l.accept().await.unwrap();
        drop(server);
        std::thread::sleep(std::time::Duration::from_millis(20));
        // The first write reaches a closed socket, whose kernel answers with a reset...
        let first = c.write_request(b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(first.is_ok(), "{first:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
        // ... and the next is refused without sending anything.
        match c.write_request(b"GET / HTTP/1.1\r\n\r\n").await {
            Err(WriteError::NothingSent(_)) => {}
            other => panic!("{other:?}"),
        }
    }
}
