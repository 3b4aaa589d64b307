//! The listener, the request handler and the admin endpoint.
//!
//! One accept loop serves HTTP/1.1 and HTTP/2 (hyper-util's auto builder; h2 by ALPN with
//! TLS or by prior knowledge without). Each request goes to the one configured upstream
//! through a pooled keep-alive client (generation requests to a plain-http HTTP/1.1 upstream
//! through [`crate::upstream`], read in the serving task; everything else through hyper-util's
//! client); the request's own authority is never used for routing,
//! and CONNECT or absolute-form requests for other hosts are refused, so this is not an open
//! proxy. Generation requests (POST `…/completions`) are read whole (they are small), may get
//! `stream_options` injected, and are recorded; everything else streams through untouched.
//!
//! Shutdown is two-stage: stop accepting and ask every connection to finish (HTTP/1.1: no more
//! keep-alive; h2: GOAWAY) for up to the drain timeout, then drop what is left (recorded as
//! `client_cancelled`, error "cut by the proxy's shutdown"), then close the writer.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use trace_format::{FileMeta, Outcome, Producer, TraceRecord, WriterConfig};

use crate::config::{ProxyConfig, RecordBodies};
use crate::error::{ProxyError, Result};
use crate::limits::{BodyTimeout, ConnPhase, Guarded, GuardedIo, TimedBody};
use crate::metrics::Metrics;
use crate::prompts::PromptQueue;
use crate::record::{BoxError, ObservedBody, Recording, UpstreamBody};
use crate::request::{inject_usage, RequestInfo};
use crate::sink::{self, Sink, WriterThread};
use crate::tls;
use crate::upstream::LeanUpstream;

type UpBody = Either<Full<Bytes>, TimedBody<Incoming>>;
type UpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, UpBody>;

/// Header values that are credentials: never recorded, logged or used as a label.
pub const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "api-key",
    "x-api-key",
    "cookie",
    "set-cookie",
];

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The parsed upstream base URL.
#[derive(Debug)]
struct Upstream {
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    base_path: String,
}

impl Upstream {
    fn parse(url: &str) -> Result<Upstream> {
        let bad = |why: &str| ProxyError::Config(format!("--upstream {url:?}: {why}"));
        let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| bad("needs http:// or https://"))?;
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err(bad("only http and https are supported"));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| bad("needs a host"))?;
        if authority.as_str().contains('@') {
            return Err(bad("credentials in the URL are not supported"));
        }
        if uri.query().is_some() {
            return Err(bad("a query string is not supported"));
        }
        let base_path = uri.path().trim_end_matches('/').to_string();
        Ok(Upstream {
            scheme,
            authority,
            base_path,
        })
    }

    fn uri(&self, path_and_query: &str) -> Option<Uri> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{path_and_query}", self.base_path))
            .build()
            .ok()
    }
}

/// State shared by every connection.
pub(crate) struct Shared {
    cfg: ProxyConfig,
    upstream: Upstream,
    client: UpClient,
    /// Generation requests to a plain-http HTTP/1.1 upstream go this way (see
    /// [`crate::upstream`]); everything else through `client`.
    lean: Option<Arc<LeanUpstream>>,
    /// Prompts waiting to be tokenized.
    prompts: Arc<PromptQueue>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) sink: Sink,
    next_id: AtomicU64,
    id_prefix: String,
    local_authorities: Vec<String>,
    session_header: Option<HeaderName>,
    /// Set when the drain timeout passed and connections are being cut.
    pub(crate) hard_stop: AtomicBool,
    draining: AtomicBool,
    /// When the proxy listener last failed an accept (µs since the epoch; 0: never):
    /// `/healthz` answers 503 for 2 s after one.
    accept_failed_us: std::sync::atomic::AtomicI64,
    /// Notified when the last recorded request in flight finishes.
    pub(crate) idle: Notify,
}

/// What a finished proxy did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Trace files finished by the writer, in order.
    pub files: Vec<PathBuf>,
    /// Records written (handed to the OS in a journal; see `journals_left` for those that
    /// could not be finished into Parquet).
    pub records_written: u64,
    /// Records that never reach a file: the writer's queue was full, or the trace
    /// directory could not take them.
    pub records_dropped: u64,
    /// The part of `records_dropped` whose writer queue was full.
    pub records_dropped_queue_full: u64,
    /// Failed writes to the trace directory.
    pub record_errors: u64,
    /// Journals whose Parquet files could not be written (a full disk): kept for the next
    /// start, which finishes them.
    pub journals_left: Vec<trace_format::writer::DeferredJournal>,
    /// Whether every connection finished within the drain timeout.
    pub drained: bool,
}

/// A running capture proxy (from [`start`]).
#[derive(Debug)]
pub struct ProxyHandle {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    metrics: Arc<Metrics>,
    recovered: trace_format::writer::RecoveryReport,
    stop: oneshot::Sender<Duration>,
    task: tokio::task::JoinHandle<Result<ShutdownReport>>,
}

impl ProxyHandle {
    /// The proxy's bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin listener's bound address.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The proxy's base URL (`http://` or `https://`).
    pub fn url(&self, tls: bool) -> String {
        format!("{}://{}", if tls { "https" } else { "http" }, self.addr)
    }

    /// The live metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// What opening the writer recovered from a previous crash.
    pub fn recovered(&self) -> &trace_format::writer::RecoveryReport {
        &self.recovered
    }

    /// Stops accepting, lets in-flight requests finish for up to `drain`, cuts the rest,
    /// and closes the writer (finished Parquet files).
    pub async fn shutdown(self, drain: Duration) -> Result<ShutdownReport> {
        let _ = self.stop.send(drain);
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(ProxyError::WriterThread(format!("proxy task: {e}"))),
        }
    }
}

/// Binds the listener (and the admin listener), opens the trace writer (recovering journals a
/// crash left in `cfg.out`: what cannot be finished on a full disk is kept and retried,
/// damaged journals are set aside, neither stops the start), and serves on the current tokio runtime until
/// [`ProxyHandle::shutdown`].
pub async fn start(cfg: ProxyConfig) -> Result<ProxyHandle> {
    let upstream = Upstream::parse(&cfg.upstream)?;
    if !(cfg.sample_rate > 0.0 && cfg.sample_rate <= 1.0) {
        return Err(ProxyError::Config(format!(
            "sample rate {} must be in (0, 1]",
            cfg.sample_rate
        )));
    }
    if cfg.block_size == 0 {
        return Err(ProxyError::Config("block size must be > 0".into()));
    }
    let session_header = match &cfg.session_header {
        None => None,
        Some(h) => {
            let name = HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| ProxyError::Config(format!("{h:?} is not a header name")))?;
            if SECRET_HEADERS.contains(&name.as_str()) {
                return Err(ProxyError::Config(format!(
                    "{h:?} holds credentials and cannot be recorded as the session id"
                )));
            }
            Some(name)
        }
    };
    let acceptor = match &cfg.tls {
        Some(files) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(
            tls::server_config(files)?,
        ))),
        None => None,
    };
    let client = build_client(&cfg)?;

    let listener = wire::listen::bind(cfg.listen).map_err(|cause| ProxyError::Bind {
        addr: cfg.listen,
        cause,
    })?;
    let addr = listener.local_addr()?;
    let admin = match cfg.admin {
        Some(a) => {
            Some(wire::listen::bind(a).map_err(|cause| ProxyError::Bind { addr: a, cause })?)
        }
        None => None,
    };
    let admin_addr = admin.as_ref().map(|l| l.local_addr()).transpose()?;

    let metrics = Arc::new(Metrics::default());
    let mut meta = FileMeta::new(Producer::Capture, cfg.command.clone());
    meta.block_size = (cfg.record_bodies != RecordBodies::None).then_some(cfg.block_size);
    meta.extra
        .insert("tokenizer".into(), cfg.tokenizer.name().to_string());
    meta.extra.insert(
        "record_bodies".into(),
        match cfg.record_bodies {
            RecordBodies::None => "none",
            RecordBodies::Hashes => "hashes",
            RecordBodies::Full => "full",
        }
        .into(),
    );
    meta.extra
        .insert("sample_rate".into(), cfg.sample_rate.to_string());
    let mut wcfg = WriterConfig::new(&cfg.out, cfg.file_prefix.clone(), meta);
    wcfg.max_file_bytes = cfg.max_file_bytes;
    wcfg.max_file_age = cfg.max_file_age;
    wcfg.rotate_on_hour = cfg.rotate_on_hour;
    wcfg.flush_interval = cfg.flush_interval;
    let out = cfg.out.clone();
    let capacity = cfg.queue_capacity;
    let m2 = metrics.clone();
    let keep_hashes = cfg.record_bodies != RecordBodies::None;
    let tok = cfg.tokenizer.clone();
    let (sink, writer, recovered) =
        tokio::task::spawn_blocking(move || sink::start(wcfg, capacity, keep_hashes, tok, m2))
            .await
            .map_err(|e| ProxyError::WriterThread(e.to_string()))??;
    let _ = out;

    let mut local_authorities = vec![addr.to_string(), upstream.authority.to_string()];
    if addr.ip().is_loopback() {
        local_authorities.push(format!("localhost:{}", addr.port()));
    }
    let start_us = wire::clock::epoch_us();
    let lean = (upstream.scheme == http::uri::Scheme::HTTP && !cfg.upstream_h2)
        .then(|| LeanUpstream::new(&upstream.authority, &cfg))
        .flatten()
        .map(Arc::new);
    let prompts = PromptQueue::new(cfg.tokenizer.clone(), cfg.block_size);
    let shared = Arc::new(Shared {
        upstream,
        client,
        lean,
        prompts,
        metrics: metrics.clone(),
        sink,
        next_id: AtomicU64::new(0),
        id_prefix: format!("{start_us:x}-{:x}", std::process::id()),
        local_authorities,
        session_header,
        hard_stop: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        accept_failed_us: std::sync::atomic::AtomicI64::new(0),
        idle: Notify::new(),
        cfg,
    });
    let (stop_tx, stop_rx) = oneshot::channel();
    let task = tokio::spawn(run(listener, acceptor, admin, shared, writer, stop_rx));
    Ok(ProxyHandle {
        addr,
        admin_addr,
        metrics,
        recovered,
        stop: stop_tx,
        task,
    })
}

fn build_client(cfg: &ProxyConfig) -> Result<UpClient> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(cfg.upstream_connect_timeout));
    let tls = tls::client_config(cfg.upstream_ca.as_deref())?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(cfg.upstream_pool_idle_timeout)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .http2_only(cfg.upstream_h2)
        .build(connector))
}

async fn run(
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    admin: Option<TcpListener>,
    shared: Arc<Shared>,
    writer: WriterThread,
    mut stop: oneshot::Receiver<Duration>,
) -> Result<ShutdownReport> {
    let (graceful_tx, graceful_rx) = watch::channel(false);
    let (hard_tx, hard_rx) = watch::channel(false);
    let (conn_guard, mut conns_done) = mpsc::channel::<()>(1);
    let admin_task = admin.map(|l| tokio::spawn(serve_admin(l, shared.clone(), hard_rx.clone())));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's own header timeout (30 s from when it starts waiting for a head, keep-alive
    // idle included) would override --client-keepalive-timeout and
    // --client-header-timeout: crate::limits enforces those.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    builder.http2().timer(TokioTimer::new());

    let mut backoff = AcceptBackoff::new("proxy");
    let drain = loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((sock, _)) => {
                    backoff.ok();
                    let _ = sock.set_nodelay(true);
                    let (b, s, g, h, guard) = (
                        builder.clone(),
                        shared.clone(),
                        graceful_rx.clone(),
                        hard_rx.clone(),
                        conn_guard.clone(),
                    );
                    match &acceptor {
                        None => {
                            tokio::spawn(serve_conn(sock, b, s, g, h, guard));
                        }
                        Some(acc) => {
                            let acc = acc.clone();
                            tokio::spawn(async move {
                                let hs = tokio::time::timeout(Duration::from_secs(10), acc.accept(sock)).await;
                                if let Ok(Ok(tls)) = hs {
                                    serve_conn(tls, b, s, g, h, guard).await;
                                }
                            });
                        }
                    }
                }
                Err(e) => {
                    shared.accept_failed_us.store(wire::clock::epoch_us(), Relaxed);
                    backoff.failed(&e, &shared.metrics).await
                }
            },
            d = &mut stop => break d.unwrap_or(Duration::ZERO),
        }
    };
    drop(listener);
    drop(conn_guard);
    shared.draining.store(true, Relaxed);
    let _ = graceful_tx.send(true);
    let drained = tokio::time::timeout(drain, conns_done.recv()).await.is_ok();
    if !drained {
        shared.hard_stop.store(true, Relaxed);
        let _ = hard_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), conns_done.recv()).await;
    }
    // Bodies of h2 streams live in their own tasks: wait for their records too.
    let deadline = Instant::now() + Duration::from_secs(5);
    while shared.metrics.in_flight.load(Relaxed) > 0 && Instant::now() < deadline {
        let notified = shared.idle.notified();
        if shared.metrics.in_flight.load(Relaxed) == 0 {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
    }
    let _ = hard_tx.send(true);
    if let Some(t) = admin_task {
        let _ = t.await;
    }
    let closed = tokio::task::spawn_blocking(move || writer.close())
        .await
        .map_err(|e| ProxyError::WriterThread(e.to_string()))??;
    let m = &shared.metrics;
    Ok(ShutdownReport {
        files: closed.files,
        records_written: m.records_written.load(Relaxed),
        records_dropped: m.records_dropped.load(Relaxed),
        records_dropped_queue_full: m.records_dropped_queue_full.load(Relaxed),
        record_errors: m.record_errors.load(Relaxed),
        journals_left: closed.journals_left,
        drained,
    })
}

async fn serve_conn<I>(
    io: I,
    builder: auto::Builder<TokioExecutor>,
    shared: Arc<Shared>,
    mut graceful: watch::Receiver<bool>,
    mut hard: watch::Receiver<bool>,
    _guard: mpsc::Sender<()>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let phase = ConnPhase::new();
    let io = GuardedIo::new(io, phase.clone(), shared.cfg.client, shared.metrics.clone());
    let svc = service_fn(move |req| {
        // The head is read: the connection serves this request until its response body is
        // done (no client-side read deadline meanwhile; see crate::limits).
        let active = phase.start();
        let shared = shared.clone();
        async move {
            let r = handle(shared, req).await?;
            Ok::<_, Infallible>(r.map(|b| Guarded::new(b, Some(active))))
        }
    });
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let mut asked = *graceful.borrow();
    if asked {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            r = graceful.changed(), if !asked => {
                if r.is_ok() && *graceful.borrow() {
                    conn.as_mut().graceful_shutdown();
                }
                asked = true;
            }
            r = hard.changed() => {
                if r.is_err() || *hard.borrow() {
                    return;
                }
            }
        }
    }
}

/// The response body type of the proxy.
pub(crate) enum ProxyBody {
    Observed(Box<ObservedBody>),
    Stream(Incoming),
    Full(Full<Bytes>),
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Observed(b) => Pin::new(b.as_mut()).poll_frame(cx),
            ProxyBody::Stream(b) => Pin::new(b).poll_frame(cx).map_err(|e| e.into()),
            ProxyBody::Full(b) => Pin::new(b).poll_frame(cx).map_err(|e| match e {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Observed(b) => b.is_end_stream(),
            ProxyBody::Stream(b) => b.is_end_stream(),
            ProxyBody::Full(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Observed(b) => b.size_hint(),
            ProxyBody::Stream(b) => b.size_hint(),
            ProxyBody::Full(b) => b.size_hint(),
        }
    }
}

/// 408 for a request body that came too slowly; the connection is not kept (the rest of
/// the body was never read).
fn body_timeout_response(message: &str) -> Response<ProxyBody> {
    let mut r = error_response(
        StatusCode::REQUEST_TIMEOUT,
        "invalid_request_error",
        message,
    );
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Backs off failed accepts (EMFILE and ENFILE above all: retrying at once spins while the
/// descriptors stay gone), counts every one, and logs at most one line per 5 s.
struct AcceptBackoff {
    listener: &'static str,
    delay: Duration,
    unreported: u64,
    last_report: Option<Instant>,
}

impl AcceptBackoff {
    fn new(listener: &'static str) -> Self {
        AcceptBackoff {
            listener,
            delay: Duration::ZERO,
            unreported: 0,
            last_report: None,
        }
    }

    fn ok(&mut self) {
        self.delay = Duration::ZERO;
    }

    async fn failed(&mut self, e: &std::io::Error, metrics: &Metrics) {
        metrics.accept_errors.fetch_add(1, Relaxed);
        self.unreported += 1;
        let now = Instant::now();
        if self
            .last_report
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(5))
        {
            eprintln!(
                "llmreplay capture: accept failed on the {} listener: {e} ({} failure(s) since \
                 the last report; backing off; all counted in llmreplay_capture_accept_errors_total)",
                self.listener, self.unreported
            );
            self.unreported = 0;
            self.last_report = Some(now);
        }
        self.delay = (self.delay * 2).clamp(Duration::from_millis(5), Duration::from_millis(100));
        tokio::time::sleep(self.delay).await;
    }
}

fn error_response(status: StatusCode, kind: &str, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "error": {"message": message, "type": kind, "code": status.as_u16()}
    })
    .to_string();
    let mut r = Response::new(ProxyBody::Full(Full::new(Bytes::from(body))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Removes hop-by-hop headers, including those named by `Connection`.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(*n);
    }
}

/// Whether reading a request body failed because it ended early (the client went away), as
/// opposed to bytes that break its framing (hyper's decoder reports those as `InvalidInput`
/// or `InvalidData`).
fn body_cut_short(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut src = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return !matches!(
                io.kind(),
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData
            );
        }
        src = s.source();
    }
    true
}

fn is_generation(method: &Method, path: &str) -> bool {
    method == Method::POST && path.trim_end_matches('/').ends_with("/completions")
}

/// splitmix64: a cheap deterministic sampling draw per request number.
fn sampled(n: u64, rate: f64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z as f64 / u64::MAX as f64) < rate
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> std::result::Result<Response<ProxyBody>, Infallible> {
    let t0 = Instant::now();
    let arrival = wire::clock::epoch_us();
    if req.method() == Method::CONNECT {
        return Ok(error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "CONNECT is not supported: this is a reverse proxy to one upstream",
        ));
    }
    if req.version() != Version::HTTP_2 {
        if let Some(a) = req.uri().authority() {
            if !shared
                .local_authorities
                .iter()
                .any(|l| l.eq_ignore_ascii_case(a.as_str()))
            {
                return Ok(error_response(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "absolute-form request for another host: this is not an open proxy",
                ));
            }
        }
    }
    let path = req.uri().path().to_string();
    if is_generation(req.method(), &path) {
        Ok(handle_generation(shared, req, t0, arrival, path).await)
    } else {
        Ok(passthrough(shared, req).await)
    }
}

fn upstream_request(
    shared: &Shared,
    parts: &http::request::Parts,
    body: UpBody,
    body_len: Option<usize>,
) -> Option<Request<UpBody>> {
    let pq = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let uri = shared.upstream.uri(&pq)?;
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    let h = req.headers_mut();
    *h = parts.headers.clone();
    strip_hop_by_hop(h);
    h.remove(header::HOST);
    if let Some(n) = body_len {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    Some(req)
}

fn header_timeout(shared: &Shared) -> (Outcome, StatusCode, String) {
    (
        Outcome::Timeout,
        StatusCode::GATEWAY_TIMEOUT,
        format!(
            "no response headers from the upstream within {:?}",
            shared.cfg.upstream_timeout
        ),
    )
}

/// Sends a generation request (`req`, whose body is `body`) to the upstream with the header
/// timeout, by the lean path when there is one; `Err` as for [`send_upstream`].
async fn send_generation(
    shared: &Shared,
    req: Request<UpBody>,
    body: &[u8],
) -> std::result::Result<(http::response::Parts, UpstreamBody), (Outcome, StatusCode, String)> {
    let Some(lean) = &shared.lean else {
        let resp = send_upstream(shared, req).await?;
        let (parts, body) = resp.into_parts();
        return Ok((parts, UpstreamBody::Hyper(body)));
    };
    let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let bytes = lean.encode_request(req.method(), pq, req.headers(), body);
    match tokio::time::timeout(shared.cfg.upstream_timeout, lean.send(&bytes)).await {
        Ok(Ok((parts, body))) => Ok((parts, UpstreamBody::Lean(body))),
        Ok(Err(e)) => Err((
            Outcome::UpstreamError,
            StatusCode::BAD_GATEWAY,
            e.to_string(),
        )),
        Err(_) => Err(header_timeout(shared)),
    }
}

/// Sends to the upstream with the header timeout; `Err` is (outcome, status to answer, text).
async fn send_upstream(
    shared: &Shared,
    req: Request<UpBody>,
) -> std::result::Result<Response<Incoming>, (Outcome, StatusCode, String)> {
    match tokio::time::timeout(shared.cfg.upstream_timeout, shared.client.request(req)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(": ");
                msg.push_str(&s.to_string());
                src = s.source();
            }
            Err((Outcome::UpstreamError, StatusCode::BAD_GATEWAY, msg))
        }
        Err(_) => Err(header_timeout(shared)),
    }
}

async fn passthrough(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ProxyBody> {
    shared.metrics.passthrough.fetch_add(1, Relaxed);
    let (parts, body) = req.into_parts();
    let body = TimedBody::new(body, shared.cfg.client, shared.metrics.clone());
    let too_slow = body.fired();
    let Some(up) = upstream_request(&shared, &parts, Either::Right(body), None) else {
        return error_response(StatusCode::BAD_REQUEST, "invalid_request_error", "bad path");
    };
    let sent = send_upstream(&shared, up).await;
    if too_slow.load(Relaxed) {
        return body_timeout_response("request body too slow");
    }
    match sent {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            parts.version = Version::HTTP_11;
            Response::from_parts(parts, ProxyBody::Stream(body))
        }
        Err((_, status, msg)) => error_response(status, "upstream_error", &msg),
    }
}

async fn handle_generation(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    t0: Instant,
    arrival: i64,
    path: String,
) -> Response<ProxyBody> {
    let n = shared.next_id.fetch_add(1, Relaxed);
    let mut rec = TraceRecord::new(format!("{}-{n:08x}", shared.id_prefix), arrival, path);
    if let Some(h) = &shared.session_header {
        rec.session_id = req
            .headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
    }
    let mut recording = Recording::new(shared.clone(), t0, rec, sampled(n, shared.cfg.sample_rate));
    let (parts, body) = req.into_parts();
    let body = TimedBody::new(body, shared.cfg.client, shared.metrics.clone());
    let body = match Limited::new(body, shared.cfg.max_request_body)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            if let Some(t) = e.downcast_ref::<BodyTimeout>() {
                // Nothing was forwarded: the client hears 408, the row says the proxy's
                // client timeout ended it.
                let msg = t.to_string();
                recording.rec.status = Some(408);
                recording.finish(Outcome::Timeout, Some(msg.clone()), Instant::now());
                return body_timeout_response(&msg);
            }
            let too_large = e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            if too_large {
                let msg = format!("request body over {} bytes", shared.cfg.max_request_body);
                recording.rec.status = Some(413);
                recording.finish(Outcome::HttpError, Some(msg.clone()), Instant::now());
                return error_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    &msg,
                );
            }
            if body_cut_short(&*e) {
                recording.finish(
                    Outcome::ClientCancelled,
                    Some(format!("reading the request body: {e}")),
                    Instant::now(),
                );
            } else {
                // A body that breaks its own framing (a bad chunk): the client's error,
                // answered 400, and recorded as what the client got.
                let mut msg = format!("malformed request body: {e}");
                let mut src = e.source();
                while let Some(s) = src {
                    msg.push_str(&format!(": {s}"));
                    src = s.source();
                }
                recording.rec.status = Some(400);
                recording.finish(Outcome::HttpError, Some(msg), Instant::now());
            }
            return error_response(StatusCode::BAD_REQUEST, "invalid_request_error", "bad body");
        }
    };
    let mut info = RequestInfo::parse(&body);
    {
        let r = &mut recording.rec;
        r.request_bytes = body.len() as i64;
        r.model = info.model.clone();
        r.stream = info.stream;
        r.max_tokens = info.max_tokens;
        if shared.cfg.record_bodies == RecordBodies::Full {
            r.body = Some(String::from_utf8_lossy(&body).into_owned());
        }
    }
    let (up_body, strip) = match inject_usage(&body, &info, shared.cfg.usage) {
        Some((b, s)) => (Bytes::from(b), s),
        None => (body, Default::default()),
    };
    // Tokenizing the prompt (prefix hashes, and prompt_tokens when the upstream reports no
    // usage) can take milliseconds: it runs on the blocking pool (batched, see
    // [`crate::prompts`]) while the request is forwarded, and the writer thread joins it
    // before writing the row.
    if recording.sampled() {
        if let Some(obj) = info.json.take() {
            recording.prompt = Some(shared.prompts.submit(obj));
        }
    }
    drop(info);
    let len = up_body.len();
    let Some(up) = upstream_request(
        &shared,
        &parts,
        Either::Left(Full::new(up_body.clone())),
        Some(len),
    ) else {
        recording.finish(Outcome::HttpError, Some("bad path".into()), Instant::now());
        return error_response(StatusCode::BAD_REQUEST, "invalid_request_error", "bad path");
    };
    match send_generation(&shared, up, &up_body).await {
        Ok((mut parts, body)) => {
            recording.rec.status = Some(parts.status.as_u16());
            strip_hop_by_hop(&mut parts.headers);
            parts.version = Version::HTTP_11;
            let sse = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
            if sse && strip.any() {
                parts.headers.remove(header::CONTENT_LENGTH);
            }
            let observed = ObservedBody::new(
                body,
                sse,
                strip,
                recording,
                shared.cfg.idle_timeout,
                shared.cfg.max_sse_event,
            );
            Response::from_parts(parts, ProxyBody::Observed(Box::new(observed)))
        }
        Err((outcome, status, msg)) => {
            recording.finish(outcome, Some(msg.clone()), Instant::now());
            error_response(status, "upstream_error", &msg)
        }
    }
}

async fn serve_admin(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut backoff = AcceptBackoff::new("admin");
    // One descriptor kept in reserve: when the proxy's connections have taken all the others,
    // it is given up to accept one admin connection, so /metrics and /healthz still answer
    // (the classic spare-descriptor trick).
    let mut reserve = spare_fd();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let sock = match r {
                    Ok((sock, _)) => {
                        if reserve.is_none() {
                            reserve = spare_fd();
                        }
                        sock
                    }
                    Err(e) => {
                        let spare = if fd_exhausted(&e) { reserve.take().or_else(spare_fd) } else { None };
                        let rescued = match spare {
                            Some(f) => {
                                drop(f);
                                tokio::time::timeout(Duration::from_millis(50), listener.accept())
                                    .await
                                    .ok()
                            }
                            None => None,
                        };
                        match rescued {
                            Some(Ok((sock, _))) => sock,
                            _ => {
                                backoff.failed(&e, &shared.metrics).await;
                                continue;
                            }
                        }
                    }
                };
                backoff.ok();
                let s = shared.clone();
                let mut stop = stop.clone();
                tokio::spawn(async move {
                    let phase = ConnPhase::new();
                    let io = GuardedIo::new(sock, phase.clone(), s.cfg.client, s.metrics.clone());
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let active = phase.start();
                        let r = admin_response(&s, req.uri().path());
                        async move { Ok::<_, Infallible>(r.map(|b| Guarded::new(b, Some(active)))) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .serve_connection(TokioIo::new(io), svc);
                    // Ends with the proxy too, not only with the client.
                    tokio::select! {
                        _ = conn => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                });
            }
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    return;
                }
            }
        }
    }
}

/// A descriptor to hold in reserve (see [`serve_admin`]).
fn spare_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// The process (EMFILE) or the system (ENFILE) is out of descriptors.
fn fd_exhausted(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        // EMFILE, ENFILE (the same numbers on Linux, the BSDs and macOS).
        matches!(e.raw_os_error(), Some(24 | 23))
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

fn admin_response(shared: &Shared, path: &str) -> Response<Full<Bytes>> {
    let saturated = wire::clock::epoch_us() - shared.accept_failed_us.load(Relaxed) < 2_000_000;
    let (status, ctype, body) = match path {
        "/metrics" => (
            StatusCode::OK,
            "text/plain; version=0.0.4",
            shared.metrics.render(),
        ),
        "/healthz" if shared.draining.load(Relaxed) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "draining\n".into(),
        ),
        "/healthz" if saturated => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "saturated: the proxy listener failed to accept in the last 2 s (out of descriptors?)\n"
                .into(),
        ),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".into()),
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}
