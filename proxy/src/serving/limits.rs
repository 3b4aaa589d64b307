//! Time limits on what clients send, for every listener (proxy and admin).
//!
//! A connection is in one of three client-side phases, and each has its deadline:
//! - waiting for the first byte of a request: [`ClientLimits::first_byte`] from the accept
//!   (or the TLS handshake), [`ClientLimits::keepalive`] from the end of the previous
//!   response;
//! - reading a request head: [`ClientLimits::header`] from its first byte;
//! - serving a request (from its head to the end of its response): no read deadline here.
//!   Its body is bounded by [`TimedBody`] (gaps and a minimum rate), and its response by the
//!   upstream's own timeouts: nothing here ever cuts a response that is streaming.
//!
//! [`GuardedIo`] wraps the connection's socket and enforces the first two: when a read would
//! wait past the deadline of the phase it fails with `TimedOut`, and hyper closes the
//! connection (nothing was forwarded, nothing is recorded). It learns the third phase from
//! [`Active`] guards, one per request, created when the service is called and dropped with
//! the response body.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::capture_metrics::Metrics;
use crate::config::ClientLimits;

/// What a connection's requests tell its socket wrapper.
#[derive(Debug)]
pub(crate) struct ConnPhase {
    epoch: Instant,
    /// Requests being served (h2: streams).
    active: AtomicUsize,
    /// Bumped whenever a request starts or the last one ends: a head in progress belongs
    /// to one idle phase.
    generation: AtomicU64,
    /// µs after `epoch` when the current idle phase began.
    idle_since_us: AtomicU64,
    /// A request has been served: waiting now is keep-alive, not the first byte.
    served: AtomicBool,
    /// The socket's reader, parked without a deadline while requests were served.
    reader: Mutex<Option<Waker>>,
}

impl ConnPhase {
    pub(crate) fn new() -> Arc<ConnPhase> {
        Arc::new(ConnPhase {
            epoch: Instant::now(),
            active: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            idle_since_us: AtomicU64::new(0),
            served: AtomicBool::new(false),
            reader: Mutex::new(None),
        })
    }

    /// A request's head was read: the connection serves it until the guard is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> Active {
        self.active.fetch_add(1, Relaxed);
        self.generation.fetch_add(1, Relaxed);
        self.served.store(true, Relaxed);
        Active(self.clone())
    }
}

/// One request being served; dropping it (with its response body) may start an idle phase.
#[derive(Debug)]
pub(crate) struct Active(Arc<ConnPhase>);

impl Drop for Active {
    fn drop(&mut self) {
        let p = &self.0;
        let now = p.epoch.elapsed().as_micros() as u64;
        p.idle_since_us.store(now, Relaxed);
        p.generation.fetch_add(1, Relaxed);
        if p.active.fetch_sub(1, Relaxed) == 1 {
            // The reader may be parked without a deadline (h2: in another task): wake it to
            // arm the keep-alive one.
            if let Some(w) = p.reader.lock().unwrap_or_else(|e| e.into_inner()).take() {
                w.wake();
            }
        }
    }
}

/// Which client-side deadline closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    FirstByte,
    Header,
    KeepAlive,
}

/// A first read asking for less than this is served from one read of this size:
/// hyper-util's auto builder reads 24 bytes (the length of the HTTP/2 preface) to tell the
/// protocol before hyper reads the rest of the head, two `recv` calls for every new
/// connection's first request instead of one.
const READ_AHEAD: usize = 4096;

/// A client connection's socket with the deadlines of its idle and head phases.
pub(crate) struct GuardedIo<I> {
    io: I,
    phase: Arc<ConnPhase>,
    limits: ClientLimits,
    metrics: Arc<Metrics>,
    /// (generation, when) of the first byte of the head in progress.
    head_start: Option<(u64, Instant)>,
    timer: Option<Pin<Box<Sleep>>>,
    /// What the first read got beyond what its caller asked for, not yet given out.
    ahead: Bytes,
    /// Whether the first read (the only one read ahead, see [`READ_AHEAD`]) is done.
    first_read: bool,
}

impl<I> GuardedIo<I> {
    pub(crate) fn new(
        io: I,
        phase: Arc<ConnPhase>,
        limits: ClientLimits,
        metrics: Arc<Metrics>,
    ) -> Self {
        GuardedIo {
            io,
            phase,
            limits,
            metrics,
            head_start: None,
            timer: None,
            ahead: Bytes::new(),
            first_read: false,
        }
    }

    /// The socket itself (its writes, and a look at its readiness while a request is
    /// served, go around the deadlines: they only bound waits for a request).
    pub(crate) fn get_mut(&mut self) -> &mut I {
        &mut self.io
    }

    /// Puts `prefix` back in front of what is still to be read: the next reads give it out
    /// first (the lean path hands a connection it does not serve to hyper this way, with
    /// the bytes it has read).
    pub(crate) fn unread(&mut self, prefix: Bytes) {
        self.first_read = true;
        if self.ahead.is_empty() {
            self.ahead = prefix;
        } else {
            let mut v = prefix.to_vec();
            v.extend_from_slice(&self.ahead);
            self.ahead = v.into();
        }
    }

    /// The deadline of the current phase (`None` while a request is being served).
    fn deadline(&self) -> Option<(Instant, Phase)> {
        let p = &self.phase;
        if p.active.load(Relaxed) > 0 {
            return None;
        }
        let generation = p.generation.load(Relaxed);
        match self.head_start {
            Some((g, t)) if g == generation => Some((t + self.limits.header, Phase::Header)),
            _ => {
                let since = p.epoch + Duration::from_micros(p.idle_since_us.load(Relaxed));
                if p.served.load(Relaxed) {
                    Some((since + self.limits.keepalive, Phase::KeepAlive))
                } else {
                    Some((since + self.limits.first_byte, Phase::FirstByte))
                }
            }
        }
    }
}

impl<I: AsyncRead + Unpin> GuardedIo<I> {
    /// A read of the socket, the first one read ahead ([`READ_AHEAD`]) and what it got
    /// beyond `buf` given out before the socket is read again.
    fn poll_io_read(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.ahead.is_empty() {
            let n = buf.remaining().min(self.ahead.len());
            buf.put_slice(&self.ahead.split_to(n));
            return Poll::Ready(Ok(()));
        }
        if self.first_read || buf.remaining() >= READ_AHEAD || buf.remaining() == 0 {
            self.first_read = true;
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let mut room = [std::mem::MaybeUninit::<u8>::uninit(); READ_AHEAD];
        let mut rb = ReadBuf::uninit(&mut room);
        ready!(Pin::new(&mut self.io).poll_read(cx, &mut rb))?;
        self.first_read = true;
        let got = rb.filled();
        let n = buf.remaining().min(got.len());
        buf.put_slice(&got[..n]);
        self.ahead = Bytes::copy_from_slice(&got[n..]);
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for GuardedIo<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        match me.poll_io_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before && me.phase.active.load(Relaxed) == 0 {
                    let generation = me.phase.generation.load(Relaxed);
                    if me.head_start.is_none_or(|(g, _)| g != generation) {
                        me.head_start = Some((generation, Instant::now()));
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let Some((deadline, phase)) = me.deadline() else {
                    let mut r = me.phase.reader.lock().unwrap_or_else(|e| e.into_inner());
                    if !r.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        *r = Some(cx.waker().clone());
                    }
                    drop(r);
                    // The last request may have ended meanwhile.
                    if me.phase.active.load(Relaxed) == 0 {
                        cx.waker().wake_by_ref();
                    }
                    return Poll::Pending;
                };
                let at = tokio::time::Instant::from_std(deadline);
                let timer = me
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                if timer.deadline() != at {
                    timer.as_mut().reset(at);
                }
                if Instant::now() < deadline && timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let (counter, what) = match phase {
                    Phase::FirstByte => (&me.metrics.client_first_byte_timeouts, "no request"),
                    Phase::Header => (&me.metrics.client_header_timeouts, "request head"),
                    Phase::KeepAlive => (&me.metrics.client_keepalive_timeouts, "keep-alive"),
                };
                counter.fetch_add(1, Relaxed);
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("client timeout ({what})"),
                )))
            }
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for GuardedIo<I> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, b)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A response body that keeps its request's [`Active`] guard until it is done.
pub(crate) struct Guarded<B> {
    inner: B,
    _active: Option<Active>,
}

impl<B> Guarded<B> {
    pub(crate) fn new(inner: B, active: Option<Active>) -> Self {
        Guarded {
            inner,
            _active: active,
        }
    }
}

impl<B: Body + Unpin> Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body read too slowly (see [`TimedBody`]).
#[derive(Debug)]
pub(crate) struct BodyTimeout(pub(crate) String);

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BodyTimeout {}

/// A request body with a progress deadline: the next frame within `limits.body` of the
/// previous one, and the whole body within `limits.body` plus one second per
/// `limits.body_min_rate` bytes received, both from the head. Only a wait for the client
/// counts: a frame that is ready when polled is taken whatever the clock says (a slow
/// upstream that stops polling it is not the client's fault).
pub(crate) struct TimedBody<B> {
    inner: B,
    limits: ClientLimits,
    start: Instant,
    last: Instant,
    received: u64,
    timer: Option<Pin<Box<Sleep>>>,
    metrics: Arc<Metrics>,
    /// Set when the deadline fired (the handler answers 408).
    fired: Arc<AtomicBool>,
}

impl<B> TimedBody<B> {
    pub(crate) fn new(inner: B, limits: ClientLimits, metrics: Arc<Metrics>) -> Self {
        let now = Instant::now();
        TimedBody {
            inner,
            limits,
            start: now,
            last: now,
            received: 0,
            timer: None,
            metrics,
            fired: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether the deadline fired, readable after the body is handed on.
    pub(crate) fn fired(&self) -> Arc<AtomicBool> {
        self.fired.clone()
    }

    fn deadline(&self) -> Instant {
        let gap = self.last + self.limits.body;
        if self.limits.body_min_rate == 0 {
            return gap;
        }
        let earned =
            Duration::from_secs_f64(self.received as f64 / self.limits.body_min_rate as f64);
        gap.min(self.start + self.limits.body + earned)
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let me = self.get_mut();
        if me.fired.load(Relaxed) {
            return Poll::Ready(None);
        }
        match Pin::new(&mut me.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    me.received += d.len() as u64;
                }
                me.last = Instant::now();
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let deadline = me.deadline();
                let at = tokio::time::Instant::from_std(deadline);
                let timer = me
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                if timer.deadline() != at {
                    timer.as_mut().reset(at);
                }
                if Instant::now() < deadline && timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                me.fired.store(true, Relaxed);
                me.metrics.client_body_timeouts.fetch_add(1, Relaxed);
                let msg = if me.limits.body_min_rate > 0 {
                    format!(
                        "request body too slow: {} bytes in {:.1} s (limits: {:?} between reads, {} bytes/s after {:?})",
                        me.received,
                        me.start.elapsed().as_secs_f64(),
                        me.limits.body,
                        me.limits.body_min_rate,
                        me.limits.body
                    )
                } else {
                    format!(
                        "request body stalled: nothing for {:?} after {} bytes",
                        me.limits.body, me.received
                    )
                };
                Poll::Ready(Some(Err(Box::new(BodyTimeout(msg)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.fired.load(Relaxed) || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A client socket that counts its reads and gives what it has at each.
    struct Counted {
        data: Vec<u8>,
        reads: usize,
    }

    impl AsyncRead for Counted {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let me = self.get_mut();
            me.reads += 1;
            let n = buf.remaining().min(me.data.len());
            buf.put_slice(&me.data[..n]);
            me.data.drain(..n);
            Poll::Ready(Ok(()))
        }
    }

    /// The protocol sniff's 24-byte read and hyper's read of the rest of the head are one
    /// read of the socket; every byte comes out once and in order.
    #[tokio::test]
    async fn the_first_small_read_reads_ahead_once() {
        let head: Vec<u8> = (0..300u32).map(|i| (i % 251) as u8).collect();
        let mut more = head.clone();
        more.extend_from_slice(b"and the body");
        let io = Counted {
            data: more.clone(),
            reads: 0,
        };
        let mut g = GuardedIo::new(
            io,
            ConnPhase::new(),
            ClientLimits::default(),
            Arc::new(Metrics::default()),
        );
        let mut preface = [0u8; 24];
        let n = g.read(&mut preface).await.unwrap();
        assert_eq!((n, &preface[..]), (24, &more[..24]));
        let mut rest = vec![0u8; 100];
        let n = g.read(&mut rest).await.unwrap();
        assert_eq!(&rest[..n], &more[24..124]);
        assert_eq!(g.io.reads, 1, "the first read got everything there was");
        let mut tail = Vec::new();
        let mut chunk = [0u8; 8];
        loop {
            let n = g.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            tail.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(tail, &more[124..]);
        assert_eq!(g.io.reads, 2, "the read ahead, and the end of the stream");
        assert!(g.ahead.is_empty());
        // Later small reads go to the socket as asked: only the first is read ahead.
        g.io.data.extend_from_slice(b"next request");
        assert_eq!(g.read(&mut chunk).await.unwrap(), 8);
        assert_eq!(
            (&chunk[..], g.io.reads, g.io.data.len()),
            (&b"next req"[..], 3, 4)
        );
    }
}
