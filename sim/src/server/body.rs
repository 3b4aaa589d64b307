//! A generation's response: its headers, and the body that turns the backend's emissions
//! into the API's events (or one whole answer), with the stall and reset faults.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response};
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::time::{Instant, Sleep};

use super::RESET_FLUSH;
use crate::engine::Emit;
use crate::engine_metrics::{FinishReason, Metrics};
use crate::writer::Writer;

/// What a generation's response is made of (see [`GenBody`]).
pub(crate) struct GenSpec {
    pub(crate) stream: bool,
    /// Writes the answer in its API's shape.
    pub(crate) out: Writer,
    /// Starts the emissions when the body is first polled.
    pub(crate) start: StartFn,
    pub(crate) stall: Option<Pin<Box<Sleep>>>,
    /// Content chunks before the connection is reset (0: at once).
    pub(crate) reset_after: Option<u32>,
    /// Output tokens at which the response is complete.
    pub(crate) target: u32,
    pub(crate) finish: FinishReason,
}

/// The response of a generation: its headers, and a body streaming its emissions.
pub(crate) fn gen_response(s: GenSpec) -> Response<SimBody> {
    let stream = s.stream;
    let body = GenBody {
        stream: s.stream,
        out: s.out,
        start: Some(s.start),
        stall: s.stall,
        rx: None,
        done: 0,
        target: s.target,
        finish: s.finish,
        pending: VecDeque::new(),
        reset_after: s.reset_after,
        reset_wait: None,
        chunks: 0,
        phase: Phase::Active,
    };
    let mut r = Response::new(SimBody::Gen(Box::new(body)));
    let ct = if stream {
        "text/event-stream; charset=utf-8"
    } else {
        "application/json"
    };
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    if stream {
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    r
}

pub(crate) fn far(t0: Instant, d: Duration) -> Instant {
    t0.checked_add(d)
        .unwrap_or_else(|| t0 + Duration::from_secs(365 * 86_400))
}

/// When a scripted stream's chunks are due: chunk `i` at `first + i × itl`.
pub(super) struct StreamTimes {
    /// The request was handled.
    pub(super) t0: Instant,
    /// The first chunk is due.
    pub(super) first: Instant,
    /// Between chunks.
    pub(super) itl: Duration,
}

/// Scripted timing (ground truth, slots): chunk `i` at `first + i × itl`, on absolute
/// deadlines.
pub(super) fn fixed_stream(
    times: StreamTimes,
    k: u32,
    prompt_tokens: u32,
    target: u32,
    finish: FinishReason,
    metrics: Arc<Metrics>,
) -> UnboundedReceiver<Emit> {
    let (tx, rx) = mpsc::unbounded_channel();
    let StreamTimes { t0, first, itl } = times;
    tokio::spawn(async move {
        metrics.update().add_running(1);
        let chunks = target.div_ceil(k.max(1));
        let mut sent = 0u32;
        let mut complete = true;
        for i in 0..chunks {
            let deadline = far(first, itl.saturating_mul(i));
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                () = tx.closed() => { complete = false; break; }
            }
            let n = k.min(target - sent);
            sent += n;
            if tx
                .send(Emit {
                    tokens: n,
                    last: sent >= target,
                })
                .is_err()
            {
                complete = false;
                break;
            }
        }
        let mut m = metrics.update();
        m.add_running(-1);
        if complete {
            m.prompt_tokens(prompt_tokens);
            m.generation_tokens(target);
            m.ttft(first.saturating_duration_since(t0));
            for _ in 1..chunks {
                m.itl(itl);
            }
            m.e2e(Instant::now().saturating_duration_since(t0));
            m.success(finish);
        }
    });
    rx
}

pub(crate) type StartFn = Box<dyn FnOnce() -> UnboundedReceiver<Emit> + Send>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Active,
    Reset,
    Done,
}

/// Streams one generation: optional stall, then engine emissions as SSE chunks (or one JSON
/// body), then `[DONE]`; or an abrupt error for the `reset` fault.
pub(crate) struct GenBody {
    stream: bool,
    out: Writer,
    start: Option<StartFn>,
    stall: Option<Pin<Box<Sleep>>>,
    rx: Option<UnboundedReceiver<Emit>>,
    /// Output tokens sent so far.
    done: u32,
    target: u32,
    finish: FinishReason,
    pending: VecDeque<Bytes>,
    reset_after: Option<u32>,
    reset_wait: Option<Pin<Box<Sleep>>>,
    chunks: u32,
    phase: Phase,
}

impl GenBody {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, io::Error>>> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(b)));
            }
            match self.phase {
                Phase::Done => return Poll::Ready(None),
                Phase::Reset => {
                    // Let hyper flush the chunks already written, then fail the body: hyper
                    // closes the connection without the terminating chunk.
                    let wait = self
                        .reset_wait
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(RESET_FLUSH)));
                    ready!(wait.as_mut().poll(cx));
                    self.phase = Phase::Done;
                    return Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "simulated connection reset",
                    ))));
                }
                Phase::Active => {}
            }
            if let Some(sleep) = self.stall.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.stall = None;
            }
            if let Some(start) = self.start.take() {
                self.rx = Some(start());
                if self.stream {
                    self.out.start(&mut self.pending);
                }
                if self.reset_after == Some(0) {
                    self.phase = Phase::Reset;
                }
                continue;
            }
            let Some(rx) = self.rx.as_mut() else {
                self.phase = Phase::Done;
                continue;
            };
            let Some(emit) = ready!(rx.poll_recv(cx)) else {
                // The engine ended the request without finishing it.
                self.phase = Phase::Reset;
                continue;
            };
            let from = self.done;
            self.done = self.done.saturating_add(emit.tokens).min(self.target);
            let last = emit.last || self.done >= self.target;
            if self.stream {
                let fin = last.then_some(self.finish);
                let first = self.chunks == 0;
                self.out.tokens(
                    &mut self.pending,
                    (from, self.done),
                    (first, fin),
                    self.target,
                );
                self.chunks += 1;
                if self.reset_after.is_some_and(|n| self.chunks >= n) {
                    self.phase = Phase::Reset;
                } else if last {
                    self.out.end(&mut self.pending, self.done, self.finish);
                    self.phase = Phase::Done;
                }
            } else if last {
                let body = self.out.whole(self.done, self.finish);
                self.pending.push_back(body);
                self.phase = Phase::Done;
            }
        }
    }
}

/// Response body of every route: a fixed body or a generation.
pub(crate) enum SimBody {
    Full(Option<Bytes>),
    Gen(Box<GenBody>),
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            SimBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Gen(g) => g.poll_next(cx).map(|o| o.map(|r| r.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            SimBody::Full(b) => b.is_none(),
            SimBody::Gen(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            SimBody::Full(None) => SizeHint::with_exact(0),
            SimBody::Gen(_) => SizeHint::default(),
        }
    }
}
