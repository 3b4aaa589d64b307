//! A lean HTTP/1.1 client connection for the measuring path: one task owns the socket,
//! writes the request in one call, and decodes the response (head, then a
//! `content-length`, chunked or close-delimited body) straight from its read buffer into a
//! callback, stamped with the time of the read that delivered the bytes.
//!
//! Why not hyper: a hyper connection is a driver future plus a body channel, so every body
//! frame costs a channel hand-over and waker round trips between the two; at 100k SSE
//! events/s that bookkeeping, not the SSE parsing, was most of the client's CPU (bench/).
//! Here a body byte goes from `read(2)` to the SSE parser with no copy and no hop.
//!
//! Times are the kernel's receive times of the bytes (`SO_TIMESTAMPNS` on Linux, read
//! with `recvmsg`), not when this task got to read them: a client that falls behind in a
//! burst (1,000 first chunks due at once on 2 cores) still records when each chunk
//! arrived, so its own scheduling delay does not read as server latency. Where the kernel
//! gives no stamp, the time of the read is used.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::TcpStream;
pub(crate) use trace_format::http1::Framing;
use trace_format::http1::{response_framing, ChunkedDecoder};
use trace_format::rxstamp;

/// A TCP stream whose reads keep the kernel's receive timestamp of the bytes read.
pub(crate) struct Stamped {
    tcp: TcpStream,
    /// CLOCK_REALTIME ns of the last read's data (0: none).
    stamp_ns: i64,
}

impl Stamped {
    pub(crate) fn new(tcp: TcpStream) -> Stamped {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            trace_format::rxstamp::enable(tcp.as_raw_fd());
        }
        Stamped { tcp, stamp_ns: 0 }
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
}

/// [`rxstamp::clock_pair`] read at most once per millisecond per thread and carried forward to
/// `now` on the monotonic clock: converting a stamp then costs no clock read beyond the
/// caller's `now`. Over 1 ms the two clocks drift apart by at most NTP's 500 ppm slew
/// limit, 0.5 µs.
fn cached_clock_pair(now: Instant) -> (Instant, i64) {
    use std::cell::Cell;
    thread_local! {
        static PAIR: Cell<Option<(Instant, i64)>> = const { Cell::new(None) };
    }
    PAIR.with(|p| {
        let (mono, rt) = match p.get() {
            Some((m, r)) if now >= m && now - m < std::time::Duration::from_millis(1) => (m, r),
            _ => {
                let fresh = rxstamp::clock_pair();
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
        {
            use std::os::fd::AsRawFd;
            let fd = me.tcp.as_raw_fd();
            loop {
                ready!(me.tcp.poll_read_ready(cx))?;
                // SAFETY: rxstamp::recv only writes into the unfilled part, and `n` bytes
                // of it are initialized when it returns Ok(n).
                let unfilled = unsafe { buf.unfilled_mut() };
                let room = unfilled.len();
                let mut got = None;
                // A short read drained the socket: report WouldBlock to try_io as well, so
                // it clears the readiness it observed before the read (a newer readiness
                // event survives), as tokio's own TcpStream does, and the next read waits
                // for data instead of paying a recvmsg that returns EAGAIN.
                let r = me.tcp.try_io(Interest::READABLE, || {
                    let (n, stamp) = rxstamp::recv(fd, unfilled, libc::MSG_DONTWAIT)?;
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
                        me.stamp_ns = stamp;
                        return Poll::Ready(Ok(()));
                    }
                    (None, Err(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    (None, Err(e)) => return Poll::Ready(Err(e)),
                    (None, Ok(())) => continue,
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = ready!(Pin::new(&mut me.tcp).poll_read(cx, buf));
            Poll::Ready(Ok(()))
        }
    }
}

impl AsyncWrite for Stamped {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, b)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// Plain TCP or TLS.
pub(crate) enum Io {
    Plain(Stamped),
    Tls(Box<tokio_rustls::client::TlsStream<Stamped>>),
}

impl Io {
    /// When the bytes of the last read arrived (see [`Stamped::arrival`]).
    fn arrival(&self, read_at: Instant) -> Instant {
        match self {
            Io::Plain(s) => s.arrival(read_at),
            Io::Tls(s) => s.get_ref().0.arrival(read_at),
        }
    }

    async fn read_into(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        match self {
            Io::Plain(s) => s.read_buf(buf).await,
            Io::Tls(s) => s.read_buf(buf).await,
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

/// A parsed response head.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub status: u16,
    /// `content-type` starts with `text/event-stream`.
    pub sse: bool,
    pub framing: Framing,
    /// The connection cannot be reused (`connection: close`, HTTP/1.0, close-delimited).
    pub close: bool,
}

/// Why reading a response failed.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The connection closed before any byte of the response: on a reused connection the
    /// server had closed it meanwhile, so the request may be retried on a new one.
    ClosedBeforeResponse,
    /// The connection closed in the middle of the response.
    Truncated(&'static str),
    Io(io::Error),
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

/// One HTTP/1.1 connection with its read buffer.
pub(crate) struct Conn {
    io: Io,
    /// Bytes read and not yet consumed.
    buf: Vec<u8>,
}

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;

impl Conn {
    pub(crate) fn new(io: Io) -> Conn {
        Conn {
            io,
            buf: Vec::with_capacity(16 * 1024),
        }
    }

    /// Writes a whole request (head and body in one buffer).
    pub(crate) async fn send(&mut self, request: &[u8]) -> io::Result<()> {
        self.buf.clear();
        self.io.write_all(request).await
    }

    /// Reads the response head (skipping `1xx` interim responses). Body bytes read with it
    /// stay in the buffer for [`Conn::read_body`]; `first_byte` is when the head's first
    /// bytes arrived.
    pub(crate) async fn read_head(&mut self) -> Result<(Head, Instant), ReadError> {
        let mut first_byte = None;
        loop {
            // Parse what is there first: a previous interim response may have left a head.
            if !self.buf.is_empty() {
                let mut headers = [httparse::EMPTY_HEADER; 64];
                let mut resp = httparse::Response::new(&mut headers);
                match resp.parse(&self.buf) {
                    Ok(httparse::Status::Complete(n)) => {
                        let head = interpret(&resp)?;
                        self.buf.drain(..n);
                        match head {
                            Some(h) => {
                                return Ok((h, first_byte.unwrap_or_else(Instant::now)));
                            }
                            None => continue, // 1xx
                        }
                    }
                    Ok(httparse::Status::Partial) if self.buf.len() > MAX_HEAD => {
                        return Err(ReadError::Protocol("response head over 64 KiB".into()))
                    }
                    Ok(httparse::Status::Partial) => {}
                    Err(e) => return Err(ReadError::Protocol(e.to_string())),
                }
            }
            let n = self
                .io
                .read_into(&mut self.buf)
                .await
                .map_err(ReadError::Io)?;
            if n == 0 {
                return Err(if self.buf.is_empty() && first_byte.is_none() {
                    ReadError::ClosedBeforeResponse
                } else {
                    ReadError::Truncated("response head")
                });
            }
            if first_byte.is_none() {
                first_byte = Some(self.io.arrival(Instant::now()));
            }
        }
    }

    /// Reads the body to its end, handing each decoded span to `on_data` with the time of
    /// the read that delivered it. Returns whether the connection can take another
    /// request (the body ended exactly where its framing said).
    pub(crate) async fn read_body(
        &mut self,
        framing: Framing,
        start: Instant,
        mut on_data: impl FnMut(&[u8], Instant),
    ) -> Result<bool, ReadError> {
        let mut t = start;
        match framing {
            Framing::Length(mut left) => loop {
                if !self.buf.is_empty() {
                    let n = (self.buf.len() as u64).min(left) as usize;
                    on_data(&self.buf[..n], t);
                    left -= n as u64;
                    let extra = self.buf.len() > n;
                    self.buf.clear();
                    if left == 0 {
                        return Ok(!extra);
                    }
                }
                if left == 0 {
                    return Ok(true);
                }
                if self.fill().await? == 0 {
                    return Err(ReadError::Truncated("response body"));
                }
                t = self.io.arrival(Instant::now());
            },
            Framing::Eof => loop {
                if !self.buf.is_empty() {
                    on_data(&self.buf, t);
                    self.buf.clear();
                }
                if self.fill().await? == 0 {
                    return Ok(false);
                }
                t = self.io.arrival(Instant::now());
            },
            Framing::Chunked => {
                let mut dec = ChunkedDecoder::default();
                loop {
                    if !self.buf.is_empty() {
                        let (data, used) =
                            dec.decode(&mut self.buf).map_err(ReadError::Protocol)?;
                        if data > 0 {
                            on_data(&self.buf[..data], t);
                        }
                        let extra = self.buf.len() > used;
                        self.buf.clear();
                        if dec.done() {
                            return Ok(!extra);
                        }
                    }
                    if self.fill().await? == 0 {
                        return Err(ReadError::Truncated("chunked response body"));
                    }
                    t = self.io.arrival(Instant::now());
                }
            }
        }
    }

    async fn fill(&mut self) -> Result<usize, ReadError> {
        self.io
            .read_into(&mut self.buf)
            .await
            .map_err(ReadError::Io)
    }
}

/// The head of a final response, or `None` for an interim (`1xx`) one.
fn interpret(resp: &httparse::Response<'_, '_>) -> Result<Option<Head>, ReadError> {
    let status = resp.code.unwrap_or(0);
    if (100..200).contains(&status) && status != 101 {
        return Ok(None);
    }
    let sse = resp.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("content-type")
            && h.value
                .trim_ascii_start()
                .get(..17)
                .is_some_and(|p| p.eq_ignore_ascii_case(b"text/event-stream"))
    });
    let f = response_framing(status, resp.version == Some(0), resp.headers)
        .map_err(ReadError::Protocol)?;
    Ok(Some(Head {
        status,
        sse,
        framing: f.framing,
        close: !f.keep_alive,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Option<Head> {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut r = httparse::Response::new(&mut headers);
        let _ = r.parse(raw.as_bytes());
        interpret(&r).unwrap()
    }

    #[test]
    fn framing_and_reuse_follow_the_head() {
        let h = head("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n").unwrap();
        assert!(h.sse && !h.close && h.framing == Framing::Chunked);
        let h = head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\n").unwrap();
        assert!(!h.sse && h.close && h.framing == Framing::Length(12));
        let h = head("HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n").unwrap();
        assert!(h.close && h.framing == Framing::Eof);
        let h = head("HTTP/1.1 204 No Content\r\n\r\n").unwrap();
        assert_eq!(h.framing, Framing::Length(0));
        assert!(head("HTTP/1.1 100 Continue\r\n\r\n").is_none());
    }

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

    #[tokio::test]
    async fn reads_an_interim_then_a_chunked_response_on_a_real_socket() {
        let addr = serve_once(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n3\r\nx\n\n\r\n0\r\n\r\n",
        )
        .await;
        let mut c = Conn::new(Io::Plain(Stamped::new(
            TcpStream::connect(addr).await.unwrap(),
        )));
        c.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        let (h, t) = c.read_head().await.unwrap();
        assert_eq!((h.status, h.sse), (200, true));
        let mut body = Vec::new();
        let reusable = c
            .read_body(h.framing, t, |d, _| body.extend_from_slice(d))
            .await
            .unwrap();
        assert_eq!(body, b"data: x\n\n");
        assert!(reusable);
    }

    #[test]
    fn the_cached_clock_pair_follows_the_wall_clock() {
        // Within its millisecond the cached pair is carried forward on the monotonic clock;
        // after it, it is read again. Either way it names the wall-clock time of `now`.
        for pause in [0u64, 300, 1_500] {
            let _ = cached_clock_pair(Instant::now());
            std::thread::sleep(std::time::Duration::from_micros(pause));
            let before = rxstamp::realtime_ns();
            let (mono, rt) = cached_clock_pair(Instant::now());
            let after = rxstamp::realtime_ns();
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
        let addr = serve_once(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        let mut c = Conn::new(Io::Plain(Stamped::new(
            TcpStream::connect(addr).await.unwrap(),
        )));
        c.send(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        // The whole response arrives meanwhile; this task reads it 200 ms later.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let read_at = Instant::now();
        let (h, arrived) = c.read_head().await.unwrap();
        assert_eq!(h.status, 200);
        let waited = read_at.duration_since(arrived);
        assert!(
            waited >= std::time::Duration::from_millis(150),
            "stamped {waited:?} before the read"
        );
    }

    #[tokio::test]
    async fn a_closed_connection_is_told_apart_from_a_truncated_response() {
        let addr = serve_once(b"").await;
        let mut c = Conn::new(Io::Plain(Stamped::new(
            TcpStream::connect(addr).await.unwrap(),
        )));
        c.send(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert!(matches!(
            c.read_head().await,
            Err(ReadError::ClosedBeforeResponse)
        ));
        let addr = serve_once(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc").await;
        let mut c = Conn::new(Io::Plain(Stamped::new(
            TcpStream::connect(addr).await.unwrap(),
        )));
        c.send(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let (h, t) = c.read_head().await.unwrap();
        let r = c.read_body(h.framing, t, |_, _| {}).await;
        assert!(matches!(r, Err(ReadError::Truncated(_))), "{r:?}");
    }
}
