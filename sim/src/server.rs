//! The HTTP front end: routing, request handling, fault injection, and the streaming response
//! body that turns engine emissions into vLLM-shaped SSE chunks.

mod answer;
mod body;

pub(crate) use body::{far, gen_response, GenSpec, SimBody, StartFn};
use body::{fixed_stream, StreamTimes};

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::engine::Engine;
use crate::engine_metrics::{FinishReason, Metrics};
use crate::from_trace::{TraceMock, REQUEST_ID_HEADER};
use crate::openai::{ApiError, Formatter, GenRequest};
use crate::output::Gen;
use crate::slots::Slots;
use crate::store::Store;
use crate::tokens::{combine, content_hash, mix, output_len};
use crate::typed::{Keep, Typed};
use crate::writer::Writer;
use crate::{Faults, SimConfig, SimError, Timing};
use wire::api::Api;

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
    /// The only model names requests may name (`--served-model-name`); empty: any.
    served: Vec<String>,
    pub(crate) seed: u64,
    /// Mixed into response ids, so two sims (or runs) never issue the same id.
    pub(crate) nonce: u64,
    tool_calls: f64,
    /// Responses kept for `previous_response_id`.
    pub(crate) store: Arc<Store>,
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
        ("tool call share", cfg.tool_calls),
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
        served: cfg.served_models,
        seed: cfg.seed,
        nonce: mix(wire::clock::epoch_us() as u64 ^ u64::from(std::process::id())),
        tool_calls: cfg.tool_calls,
        store: Arc::new(Store::new(
            crate::store::MAX_RESPONSES,
            crate::store::MAX_TOKENS,
        )),
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

/// An error in `api`'s shape (Anthropic's for Messages).
pub(crate) fn error_response_for(api: Api, e: &ApiError) -> Response<SimBody> {
    json_response(e.status, e.body_for(api))
}

/// The API served at `path`: each API's `/v1/…` path, and vLLM's other paths of rerank
/// (`/rerank`, `/v2/rerank`) and score (`/score`).
fn served_api(path: &str) -> Option<Api> {
    match path {
        "/rerank" | "/v2/rerank" => Some(Api::Rerank),
        "/score" => Some(Api::Score),
        _ => Api::ALL.into_iter().find(|a| a.default_path() == path),
    }
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
            let names = if st.served.is_empty() {
                std::slice::from_ref(&st.model)
            } else {
                &st.served[..]
            };
            let data: Vec<serde_json::Value> = names
                .iter()
                .map(|name| {
                    serde_json::json!({
                        "id": name,
                        "object": "model",
                        "created": unix_now(),
                        "owned_by": "llmreplay-sim",
                        "root": st.model,
                        "parent": null,
                        "max_model_len": max_model_len,
                    })
                })
                .collect();
            let body = serde_json::json!({"object": "list", "data": data});
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
        p => match served_api(p) {
            Some(api) if method == Method::POST => generate(st, api, req).await,
            Some(_) => method_not_allowed("POST"),
            None => not_found(&path),
        },
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

/// The answer of a request of `api` whose fault is an error status (500, or 429 with its
/// `retry-after`); `None` for no fault, or one that acts on the stream.
fn fault_response(st: &AppState, api: Api, fault: Option<Fault>) -> Option<Response<SimBody>> {
    match fault {
        Some(Fault::Error) => Some(error_response_for(
            api,
            &ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: "The server had an error while processing your request (simulated fault)."
                    .into(),
                kind: "server_error",
                code: None,
            },
        )),
        Some(Fault::RateLimit) => {
            let mut r = error_response_for(
                api,
                &ApiError {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    message: "Rate limit reached (simulated fault).".into(),
                    kind: "rate_limit_error",
                    code: Some("rate_limit_exceeded"),
                },
            );
            let secs = st.faults.retry_after_secs.max(1);
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            Some(r)
        }
        _ => None,
    }
}

/// Reads and checks a request of `api`: its body parsed, its model served, its
/// `previous_response_id` known (the conversation it continues put before its prompt).
async fn read_request(
    st: &AppState,
    api: Api,
    req: Request<Incoming>,
) -> Result<(GenRequest, Bytes), Response<SimBody>> {
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Err(error_response_for(
                api,
                &ApiError::bad_request(format!("could not read the request body: {e}")),
            ))
        }
    };
    let mut g = crate::apis::parse(api, &body).map_err(|e| error_response_for(api, &e))?;
    if let Some(m) = g.model.as_deref() {
        if !st.served.is_empty() && !st.served.iter().any(|s| s == m) {
            return Err(error_response_for(api, &ApiError::unknown_model(m)));
        }
    }
    if let Some(prev) = g.previous_response_id.as_deref() {
        let Some(conv) = st.store.get(prev) else {
            return Err(error_response_for(api, &ApiError::unknown_response(prev)));
        };
        g.prompt.splice(0..0, conv.iter().copied());
    }
    Ok((g, body))
}

impl AppState {
    /// Whether a request offering `tool` (not after a tool's result) calls it, drawn per
    /// request content and seed: Responses and Messages only.
    fn calls(&self, api: Api, g: &GenRequest, content: u64) -> bool {
        if !api.typed_events() || g.tool.is_none() || g.after_tool_result || self.tool_calls <= 0.0
        {
            return false;
        }
        let draw = mix(self.seed ^ content ^ 0x746f_6f6c) as f64 / u64::MAX as f64;
        draw < self.tool_calls
    }

    /// A new response id's suffix.
    pub(crate) fn next_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{:016x}", mix(self.seed ^ n), mix(n ^ self.nonce))
    }

    /// The writer of `api`'s answer to `g`, described by `gen`.
    pub(crate) fn writer(&self, api: Api, g: &GenRequest, gen: Gen) -> Writer {
        match api {
            Api::Completions | Api::Chat => Writer::Chunks(
                Formatter::new(gen, g.continuous_usage, g.include_usage)
                    .with_reasoning_details(self.reasoning.details),
            ),
            Api::Responses | Api::Messages => {
                let keep = (api == Api::Responses && g.store).then(|| Keep {
                    store: Arc::clone(&self.store),
                    prompt: g.prompt.clone(),
                });
                Writer::Typed(Box::new(Typed::new(
                    gen,
                    g.max_tokens,
                    g.previous_response_id.clone(),
                    keep,
                )))
            }
            Api::Embeddings | Api::Rerank | Api::Score => Writer::Pooled {
                g: gen,
                entries: g.entries,
            },
        }
    }
}

async fn generate(st: Arc<AppState>, api: Api, req: Request<Incoming>) -> Response<SimBody> {
    // t0 of a recorded answer: the request's headers read, as capture's t0.
    let t0 = Instant::now();
    let request_id = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let forced = match header_fault(&req) {
        Ok(f) => f,
        Err(e) => return error_response_for(api, &e),
    };
    let (mut g, body) = match read_request(&st, api, req).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    if let Backend::Trace(mock) = &st.backend {
        let ask = answer::Asked {
            api,
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
            return error_response_for(api, &ApiError::bad_request(format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
                max_model_len, total, prompt_tokens, g.max_tokens
            )));
        }
    }

    let fault = forced.or_else(|| st.roll_fault());
    if let Some(r) = fault_response(&st, api, fault) {
        return r;
    }

    let content = content_hash(&g.prompt);
    let content = combine(content, u64::from(g.max_tokens));
    let target = if g.ignore_eos {
        g.max_tokens
    } else {
        output_len(st.seed, content, g.max_tokens)
    };
    let call = st.calls(api, &g, content);
    let finish = if target >= g.max_tokens && !call {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };
    let mut gen = Gen::new(
        api,
        &st.next_id(),
        unix_now(),
        &st.model,
        prompt_tokens,
        combine(st.seed, content),
    )
    .with_call(g.tool.as_deref().filter(|_| call));
    if api.generates() && api != Api::Completions {
        gen = gen.with_reasoning(st.reasoning.tokens(st.seed, content, target));
    }
    let out = st.writer(api, &g, gen);
    let start = start_fn(&st, &mut g, target, finish);
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
        out,
        start,
        stall,
        reset_after,
        target,
        finish,
    })
}

/// What starts the emissions of a request of `target` tokens on the sim's backend.
fn start_fn(st: &AppState, g: &mut GenRequest, target: u32, finish: FinishReason) -> StartFn {
    let k = st.tokens_per_chunk;
    let prompt_tokens = u32::try_from(g.prompt.len()).unwrap_or(u32::MAX);
    match &st.backend {
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
        // Answered from the trace before; never reached: a stream that ends at once.
        Backend::Trace(_) => Box::new(|| mpsc::unbounded_channel().1),
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
    }
}
