//! The HTTP front end: routing, request handling, fault injection, and the streaming response
//! body that turns engine emissions into vLLM-shaped SSE chunks.

mod answer;

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::net::TcpListener;
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

use crate::engine::{Emit, Engine};
use crate::from_trace::{TraceMock, REQUEST_ID_HEADER};
use crate::metrics::{FinishReason, Metrics};
use crate::openai::{self, ApiError, Formatter, GenRequest, Kind};
use crate::slots::Slots;
use crate::tokens::{combine, content_hash, mix, output_len};
use crate::{Faults, SimConfig, SimError, Timing};

/// Largest request body accepted.
const MAX_BODY: usize = 64 << 20;
/// Stall length when `Faults::stall` is zero (and the longest a `--from-trace` hold lasts).
pub(crate) const DEFAULT_STALL: Duration = Duration::from_secs(3600);
/// Content chunks a `reset` fault sends before dropping the connection.
const RESET_AFTER_CHUNKS: u32 = 2;
/// Pause before a `reset` fault drops the connection, so the chunks before it are flushed.
const RESET_FLUSH: Duration = Duration::from_millis(20);
/// How long shutdown waits for in-flight responses before dropping them.
const DRAIN_DEADLINE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Error,
    RateLimit,
    Reset,
    Stall,
}

enum Backend {
    Engine { engine: Engine, max_model_len: u32 },
    Fixed { ttft: Duration, itl: Duration },
    Slots(Arc<Slots>),
    Trace(Arc<TraceMock>),
}

pub(crate) struct AppState {
    pub(crate) model: String,
    pub(crate) seed: u64,
    tokens_per_chunk: u32,
    faults: Faults,
    reasoning: crate::Reasoning,
    backend: Backend,
    metrics: Arc<Metrics>,
    rng: Mutex<ChaCha8Rng>,
    pub(crate) next_id: AtomicU64,
}

pub(crate) fn validate(cfg: &SimConfig) -> Result<(), SimError> {
    if cfg.tokens_per_chunk == 0 {
        return Err(SimError::Config("tokens_per_chunk must be >= 1".into()));
    }
    let f = &cfg.faults;
    for (name, r) in [
        ("error_rate", f.error_rate),
        ("rate_limit_rate", f.rate_limit_rate),
        ("reset_rate", f.reset_rate),
        ("stall_rate", f.stall_rate),
    ] {
        if !(0.0..=1.0).contains(&r) {
            return Err(SimError::Config(format!(
                "{name} must be in [0, 1], got {r}"
            )));
        }
    }
    for (name, v) in [
        ("reasoning share", cfg.reasoning.share),
        ("reasoning fraction", cfg.reasoning.fraction),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err(SimError::Config(format!(
                "{name} must be in [0, 1], got {v}"
            )));
        }
    }
    if f.error_rate + f.rate_limit_rate + f.reset_rate + f.stall_rate > 1.0 + 1e-9 {
        return Err(SimError::Config("fault rates must sum to at most 1".into()));
    }
    match &cfg.timing {
        Timing::Engine(p) => p.validate().map_err(SimError::Config)?,
        Timing::Slots { slots, service } if *slots == 0 || service.is_zero() => {
            return Err(SimError::Config(format!(
                "slot timing needs at least one slot and a service time above zero, got {slots} slots of {service:?}"
            )));
        }
        _ => {}
    }
    Ok(())
}

/// Serves until `shutdown` completes; see [`crate::serve`].
pub(crate) async fn serve(
    listener: TcpListener,
    cfg: SimConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), SimError> {
    validate(&cfg)?;
    let metrics = Arc::new(Metrics::new(&cfg.model_name));
    let (backend, engine_task) = match cfg.timing {
        Timing::Engine(p) => {
            let max_model_len = p.max_model_len;
            let (engine, task) = Engine::spawn(p, cfg.tokens_per_chunk, Arc::clone(&metrics));
            (
                Backend::Engine {
                    engine,
                    max_model_len,
                },
                Some(task),
            )
        }
        Timing::Fixed { ttft, itl } => (Backend::Fixed { ttft, itl }, None),
        Timing::Slots { slots, service } => (
            Backend::Slots(Arc::new(Slots::new(slots, service, Instant::now()))),
            None,
        ),
        Timing::Trace(mock) => (Backend::Trace(mock), None),
    };
    let state = Arc::new(AppState {
        model: cfg.model_name,
        seed: cfg.seed,
        tokens_per_chunk: cfg.tokens_per_chunk,
        faults: cfg.faults,
        reasoning: cfg.reasoning,
        backend,
        metrics,
        rng: Mutex::new(ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x6661_756c_7473)),
        next_id: AtomicU64::new(0),
    });

    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        // Transient (e.g. out of file descriptors): back off, keep serving.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let st = Arc::clone(&state);
                let svc = hyper::service::service_fn(move |req| {
                    let st = Arc::clone(&st);
                    async move {
                        let r = handle(st, req).await;
                        if r.extensions().get::<DropConnection>().is_some() {
                            // A service error: hyper closes the connection, answering nothing.
                            return Err(io::Error::new(
                                io::ErrorKind::ConnectionAborted,
                                "connection dropped without an answer",
                            ));
                        }
                        Ok(r)
                    }
                });
                let conn = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
                let conn = graceful.watch(conn);
                conns.spawn(async move {
                    let _ = conn.await;
                });
            }
        }
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN_DEADLINE) => {}
    }
    conns.shutdown().await;
    if let Some(t) = engine_task {
        t.abort();
    }
    Ok(())
}

/// Marks a response that is not sent: the connection is closed instead (a recorded
/// connection failure, `--from-trace`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DropConnection;

/// A response that is not sent: the connection is dropped.
pub(crate) fn drop_connection() -> Response<SimBody> {
    let mut r = Response::new(SimBody::Full(None));
    r.extensions_mut().insert(DropConnection);
    r
}

pub(crate) fn json_response(status: StatusCode, body: Bytes) -> Response<SimBody> {
    let mut r = Response::new(SimBody::Full(Some(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub(crate) fn error_response(e: &ApiError) -> Response<SimBody> {
    json_response(e.status, e.body())
}

fn not_found(path: &str) -> Response<SimBody> {
    error_response(&ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("Not Found: {path}"),
        kind: "not_found_error",
        code: None,
    })
}

fn method_not_allowed(allow: &'static str) -> Response<SimBody> {
    let mut r = error_response(&ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("Method Not Allowed (allowed: {allow})"),
        kind: "invalid_request_error",
        code: None,
    });
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

pub(crate) fn unix_now() -> u64 {
    (wire::clock::epoch_us() / 1_000_000) as u64
}

async fn handle(st: Arc<AppState>, req: Request<Incoming>) -> Response<SimBody> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let get = method == Method::GET || method == Method::HEAD;
    match path.as_str() {
        "/health" if get => Response::new(SimBody::Full(None)),
        "/version" if get => json_response(
            StatusCode::OK,
            Bytes::from(
                serde_json::json!({
                    "version": format!("llmreplay-sim {}", env!("CARGO_PKG_VERSION"))
                })
                .to_string(),
            ),
        ),
        "/v1/models" if get => {
            let max_model_len = match &st.backend {
                Backend::Engine { max_model_len, .. } => Some(*max_model_len),
                Backend::Fixed { .. } | Backend::Slots(_) | Backend::Trace(_) => None,
            };
            let body = serde_json::json!({
                "object": "list",
                "data": [{
                    "id": st.model,
                    "object": "model",
                    "created": unix_now(),
                    "owned_by": "llmreplay-sim",
                    "root": st.model,
                    "parent": null,
                    "max_model_len": max_model_len,
                }]
            });
            json_response(StatusCode::OK, Bytes::from(body.to_string()))
        }
        "/metrics" if get => {
            let mut text = st.metrics.render();
            if let Backend::Trace(mock) = &st.backend {
                text.push_str(&mock.render_metrics());
            }
            let mut r = Response::new(SimBody::Full(Some(Bytes::from(text))));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/health" | "/version" | "/v1/models" | "/metrics" => method_not_allowed("GET"),
        "/v1/completions" if method == Method::POST => generate(st, Kind::Completion, req).await,
        "/v1/chat/completions" if method == Method::POST => generate(st, Kind::Chat, req).await,
        "/v1/completions" | "/v1/chat/completions" => method_not_allowed("POST"),
        _ => not_found(&path),
    }
}

impl AppState {
    fn roll_fault(&self) -> Option<Fault> {
        let f = &self.faults;
        let total = f.error_rate + f.rate_limit_rate + f.reset_rate + f.stall_rate;
        if total <= 0.0 {
            return None;
        }
        let r: f64 = self
            .rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .gen::<f64>();
        let mut acc = 0.0;
        for (rate, fault) in [
            (f.error_rate, Fault::Error),
            (f.rate_limit_rate, Fault::RateLimit),
            (f.reset_rate, Fault::Reset),
            (f.stall_rate, Fault::Stall),
        ] {
            acc += rate;
            if r < acc {
                return Some(fault);
            }
        }
        None
    }
}

fn header_fault(req: &Request<Incoming>) -> Result<Option<Fault>, ApiError> {
    let Some(v) = req.headers().get("x-sim-fault") else {
        return Ok(None);
    };
    match v.to_str().map(str::trim) {
        Ok("error") => Ok(Some(Fault::Error)),
        Ok("rate-limit") => Ok(Some(Fault::RateLimit)),
        Ok("reset") => Ok(Some(Fault::Reset)),
        Ok("stall") => Ok(Some(Fault::Stall)),
        Ok("" | "none") => Ok(None),
        _ => Err(ApiError::bad_request(
            "x-sim-fault must be one of error, rate-limit, reset, stall",
        )),
    }
}

/// The answer of a request whose fault is an error status (500, or 429 with its
/// `retry-after`); `None` for no fault, or one that acts on the stream.
fn fault_response(st: &AppState, fault: Option<Fault>) -> Option<Response<SimBody>> {
    match fault {
        Some(Fault::Error) => Some(error_response(&ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "The server had an error while processing your request (simulated fault)."
                .into(),
            kind: "server_error",
            code: None,
        })),
        Some(Fault::RateLimit) => {
            let mut r = error_response(&ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                message: "Rate limit reached (simulated fault).".into(),
                kind: "rate_limit_error",
                code: Some("rate_limit_exceeded"),
            });
            let secs = st.faults.retry_after_secs.max(1);
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            Some(r)
        }
        _ => None,
    }
}

async fn generate(st: Arc<AppState>, kind: Kind, req: Request<Incoming>) -> Response<SimBody> {
    // t0 of a recorded answer: the request's headers read, as capture's t0.
    let t0 = Instant::now();
    let request_id = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let forced = match header_fault(&req) {
        Ok(f) => f,
        Err(e) => return error_response(&e),
    };
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error_response(&ApiError::bad_request(format!(
                "could not read the request body: {e}"
            )))
        }
    };
    let mut g: GenRequest = match openai::parse(kind, &body) {
        Ok(g) => g,
        Err(e) => return error_response(&e),
    };
    if let Backend::Trace(mock) = &st.backend {
        let ask = answer::Asked {
            kind,
            req: &g,
            request_id: request_id.as_deref(),
            prompt_key: crate::from_trace::prompt_key(&body),
            t0,
        };
        return answer::respond(&st, mock, ask).await;
    }
    let prompt_tokens = u32::try_from(g.prompt.len()).unwrap_or(u32::MAX);
    if let Backend::Engine { max_model_len, .. } = &st.backend {
        let prompt_eff = prompt_tokens.max(1);
        if !g.max_tokens_given && prompt_eff < *max_model_len {
            g.max_tokens = g.max_tokens.min(*max_model_len - prompt_eff);
        }
        let total = u64::from(prompt_eff) + u64::from(g.max_tokens);
        if total > u64::from(*max_model_len) {
            return error_response(&ApiError::bad_request(format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
                max_model_len, total, prompt_tokens, g.max_tokens
            )));
        }
    }

    let fault = forced.or_else(|| st.roll_fault());
    if let Some(r) = fault_response(&st, fault) {
        return r;
    }

    let content = content_hash(&g.prompt);
    let content = combine(content, u64::from(g.max_tokens));
    let target = if g.ignore_eos {
        g.max_tokens
    } else {
        output_len(st.seed, content, g.max_tokens)
    };
    let finish = if target >= g.max_tokens {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };
    let n = st.next_id.fetch_add(1, Ordering::Relaxed);
    let id = format!("{:016x}{:016x}", mix(st.seed ^ n), mix(n));
    let fmt = Formatter::new(
        kind,
        &id,
        unix_now(),
        &st.model,
        prompt_tokens,
        combine(st.seed, content),
        g.continuous_usage,
    );
    let fmt = match kind {
        Kind::Chat => fmt.with_reasoning(
            st.reasoning.tokens(st.seed, content, target),
            st.reasoning.details,
        ),
        Kind::Completion => fmt,
    };

    let k = st.tokens_per_chunk;
    let start: StartFn = match &st.backend {
        Backend::Engine { engine, .. } => {
            let engine = engine.clone();
            let prompt = std::mem::take(&mut g.prompt);
            Box::new(move || engine.submit(&prompt, target, finish))
        }
        Backend::Fixed { ttft, itl } => {
            let (ttft, itl) = (*ttft, *itl);
            let metrics = Arc::clone(&st.metrics);
            Box::new(move || {
                let t0 = Instant::now();
                let t = StreamTimes {
                    t0,
                    first: far(t0, ttft),
                    itl,
                };
                fixed_stream(t, k, prompt_tokens, target, finish, metrics)
            })
        }
        // Answered from the trace above; never reached.
        Backend::Trace(_) => {
            return error_response(&ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: "no recorded answer".into(),
                kind: "server_error",
                code: None,
            })
        }
        Backend::Slots(slots) => {
            let slots = Arc::clone(slots);
            let metrics = Arc::clone(&st.metrics);
            Box::new(move || {
                // Booked when the response starts, in turn; chunks spread over the service.
                let t0 = Instant::now();
                let start = slots.book(t0);
                let itl = slots.service() / target.div_ceil(k.max(1)).max(1);
                let t = StreamTimes {
                    t0,
                    first: start + itl,
                    itl,
                };
                fixed_stream(t, k, prompt_tokens, target, finish, metrics)
            })
        }
    };
    let stall = (fault == Some(Fault::Stall)).then(|| {
        let d = if st.faults.stall.is_zero() {
            DEFAULT_STALL
        } else {
            st.faults.stall
        };
        Box::pin(tokio::time::sleep(d))
    });
    let reset_after =
        (fault == Some(Fault::Reset)).then_some(if g.stream { RESET_AFTER_CHUNKS } else { 0 });
    gen_response(GenSpec {
        stream: g.stream,
        chat: kind == Kind::Chat,
        include_usage: g.include_usage,
        fmt,
        start,
        stall,
        reset_after,
        target,
        finish,
    })
}

/// What a generation's response is made of (see [`GenBody`]).
pub(crate) struct GenSpec {
    pub(crate) stream: bool,
    pub(crate) chat: bool,
    pub(crate) include_usage: bool,
    pub(crate) fmt: Formatter,
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
        chat: s.chat,
        include_usage: s.include_usage,
        fmt: s.fmt,
        start: Some(s.start),
        stall: s.stall,
        rx: None,
        out: 0,
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
struct StreamTimes {
    /// The request was handled.
    t0: Instant,
    /// The first chunk is due.
    first: Instant,
    /// Between chunks.
    itl: Duration,
}

/// Scripted timing (ground truth, slots): chunk `i` at `first + i × itl`, on absolute
/// deadlines.
fn fixed_stream(
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
    chat: bool,
    include_usage: bool,
    fmt: Formatter,
    start: Option<StartFn>,
    stall: Option<Pin<Box<Sleep>>>,
    rx: Option<UnboundedReceiver<Emit>>,
    out: u32,
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
            let from = self.out;
            self.out = self.out.saturating_add(emit.tokens).min(self.target);
            let last = emit.last || self.out >= self.target;
            if self.stream {
                // The role-only chunk goes out with the first token, as vLLM sends it (after
                // queueing and prefill), never before.
                if self.chat && self.chunks == 0 {
                    self.pending.push_back(self.fmt.role_chunk());
                }
                let fin = last.then_some(self.finish);
                self.pending
                    .push_back(self.fmt.content_chunk(from, self.out, fin));
                self.chunks += 1;
                if self.reset_after.is_some_and(|n| self.chunks >= n) {
                    self.phase = Phase::Reset;
                } else if last {
                    if self.include_usage {
                        self.pending.push_back(self.fmt.usage_chunk(self.out));
                    }
                    self.pending.push_back(Formatter::done());
                    self.phase = Phase::Done;
                }
            } else if last {
                self.pending
                    .push_back(self.fmt.full_response(self.out, self.finish));
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
