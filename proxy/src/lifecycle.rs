//! The listeners and the proxy's life: [`start`] builds the shared state and opens the trace
//! writer, one accept loop serves HTTP/1.1 and HTTP/2 (hyper-util's auto builder; h2 by ALPN
//! with TLS or by prior knowledge without) and hands each request to [`crate::serving::handler`],
//! another serves the admin endpoints ([`crate::admin`]), and [`ProxyHandle::shutdown`]
//! stops them.
//!
//! Shutdown is two-stage: stop accepting and ask every connection to finish (HTTP/1.1: no more
//! keep-alive; h2: GOAWAY) for up to the drain timeout, then drop what is left (recorded as
//! `client_cancelled`, error "cut by the proxy's shutdown"), then close the writer.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use trace_format::{FileMeta, Producer, WriterConfig};

use crate::admin::admin_response;
use crate::capture_metrics::Metrics;
use crate::config::validated::{Parts, ValidatedProxyConfig};
use crate::error::{ProxyError, Result};
use crate::phases::PhaseLog;
use crate::recording::prompts::PromptQueue;
use crate::recording::row::Recorder;
use crate::recording::writer::{self, WriterThread};
use crate::serving::accept::{fd_exhausted, spare_fd, AcceptBackoff, AcceptTurns};
use crate::serving::handler::handle;
use crate::serving::limits::{ConnPhase, Guarded, GuardedIo};
use crate::serving::state::Shared;
use crate::upstream::route::{ClientAddr, Forward};
use trace_format::privacy::Manifest;

/// How long shadow requests still in flight when production has drained may take to finish.
const SHADOW_GRACE: Duration = Duration::from_secs(5);

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
/// damaged journals are set aside, neither stops the start), and serves on the current tokio
/// runtime (ideally one built by [`crate::serving_runtime`], as the proxy's other serving
/// threads' are) until [`ProxyHandle::shutdown`]. The configuration was checked once, by
/// [`ProxyConfig::validate`](crate::ProxyConfig::validate).
pub async fn start(cfg: ValidatedProxyConfig) -> Result<ProxyHandle> {
    let Parts {
        cfg,
        upstream,
        session_header,
        tls,
        upstream_tls,
        shadow,
    } = cfg.into_parts();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let metrics = Arc::new(Metrics::default());
    let upstream_tls_for_shadow = upstream_tls.clone();
    let forward = Forward::new(upstream, upstream_tls, &cfg, metrics.clone());

    let bind_err = |cause| ProxyError::Bind {
        addr: cfg.listen,
        cause,
    };
    let warm_heap = cfg.warm_heap;
    let mut listeners = wire::listen::bind_group(cfg.listen, cfg.threads).map_err(bind_err)?;
    let listener = listeners.remove(0);
    let addr = listener.local_addr()?;
    // The other threads' listeners, to be registered with their own runtimes.
    let others = listeners
        .into_iter()
        .map(|l| l.into_std())
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(bind_err)?;
    let admin = match cfg.admin {
        Some(a) => {
            Some(wire::listen::bind(a).map_err(|cause| ProxyError::Bind { addr: a, cause })?)
        }
        None => None,
    };
    let admin_addr = admin.as_ref().map(|l| l.local_addr()).transpose()?;

    let (sink, writer, recovered) = start_recorder(&cfg, &metrics, addr).await?;

    let mut local_authorities = vec![addr.to_string(), forward.authority().to_string()];
    if addr.ip().is_loopback() {
        local_authorities.push(format!("localhost:{}", addr.port()));
    }
    let start_us = wire::clock::epoch_us();
    let prompts = PromptQueue::new(
        cfg.tokenizer.clone(),
        cfg.block_size,
        cfg.recorder_shed_after,
    );
    let id_prefix = format!("{start_us:x}-{:x}", std::process::id());
    let shadow = match &cfg.shadow {
        Some(sc) if !shadow.is_empty() => Some(Arc::new(crate::shadow::Shadow::start(
            shadow,
            sc,
            &cfg,
            &upstream_tls_for_shadow,
            sink.clone(),
            &id_prefix,
        )?)),
        _ => None,
    };
    let recorder = Arc::new(Recorder {
        metrics: metrics.clone(),
        sink,
        hard_stop: AtomicBool::new(false),
        idle: Notify::new(),
        phases: cfg.phase_log.as_deref().map(PhaseLog::new),
    });
    let shared = Arc::new(Shared {
        forward,
        prompts,
        metrics: metrics.clone(),
        recorder,
        next_id: AtomicU64::new(0),
        id_prefix,
        local_authorities,
        session_header,
        draining: AtomicBool::new(false),
        accept_failed_us: AtomicI64::new(0),
        admin_rescue: Default::default(),
        cut: crate::serving::cut::Cut::new(cfg.threads),
        shadow,
        cfg,
    });
    let (stop_tx, stop_rx) = oneshot::channel();
    let (conn_guard, conns_done) = mpsc::channel::<()>(1);
    let (graceful_tx, graceful) = watch::channel(false);
    let (hard_tx, hard) = watch::channel(false);
    let (accepting_tx, accepting) = watch::channel(true);
    let serving = Serving {
        acceptor,
        shared: shared.clone(),
        builder: conn_builder(),
        graceful,
        hard,
        guard: conn_guard,
    };
    if let Some(every) = shared.cfg.upstream_check_interval {
        let reach = shared.forward.reach().clone();
        tokio::spawn(reach.run(every, serving.hard.clone()));
    }
    let threads = match spawn_serving(others, &serving, &accepting, warm_heap) {
        Ok(t) => t,
        Err(e) => {
            let _ = hard_tx.send(true);
            if let Some(s) = &shared.shadow {
                s.stop().await;
            }
            return Err(ProxyError::Io(e));
        }
    };
    let stages = Stages {
        stop: stop_rx,
        accepting: accepting_tx,
        graceful: graceful_tx,
        hard: hard_tx,
        conns_done,
        threads,
    };
    // This thread serves too (thread 0, the caller's runtime).
    if warm_heap > 0 {
        crate::runtime::heap::warm(warm_heap);
    }
    let task = tokio::spawn(run(listener, admin, serving, writer, stages));
    Ok(ProxyHandle {
        addr,
        admin_addr,
        metrics,
        recovered,
        stop: stop_tx,
        task,
    })
}

/// The recorder's writer thread (recovering what journals a crash left) with its further
/// outputs beside the trace files (the OTLP tap).
async fn start_recorder(
    cfg: &crate::ProxyConfig,
    metrics: &Arc<Metrics>,
    listen: std::net::SocketAddr,
) -> Result<(
    writer::Sink,
    WriterThread,
    trace_format::writer::RecoveryReport,
)> {
    let flag = cfg.capture_id.clone();
    let origin =
        tokio::task::spawn_blocking(move || crate::origin::capture_info(flag.as_deref(), listen))
            .await
            .map_err(|e| ProxyError::WriterThread(e.to_string()))?;
    let wcfg = writer_config(cfg, &origin);
    let capacity = cfg.queue_capacity;
    let m2 = metrics.clone();
    let keep = writer::Keep {
        time_bucket_us: cfg
            .time_bucket
            .map_or(0, |b| i64::try_from(b.as_micros()).unwrap_or(i64::MAX)),
        grade: cfg.privacy,
        key: cfg.hash_key.clone(),
        blobs: (cfg.privacy == crate::Privacy::Full && cfg.blobs)
            .then(|| trace_format::blobs::dir_of(&cfg.out)),
        capture: Some((origin.id, origin.started_us)),
    };
    let shed_after = cfg.recorder_shed_after;
    let tok = cfg.tokenizer.clone();
    let mut taps: Vec<Box<dyn writer::Tap>> = Vec::new();
    if let Some(o) = &cfg.otlp {
        taps.push(Box::new(crate::recording::otlp::OtlpTap::start(
            o.clone(),
            &cfg.upstream,
            metrics,
        )?));
    }
    tokio::task::spawn_blocking(move || {
        writer::start(wcfg, capacity, keep, shed_after, tok, m2, taps)
    })
    .await
    .map_err(|e| ProxyError::WriterThread(e.to_string()))?
}

/// The trace writer's configuration: where, rotation, and the file metadata of a capture.
fn writer_config(
    cfg: &crate::ProxyConfig,
    origin: &trace_format::fleet::CaptureInfo,
) -> WriterConfig {
    let mut meta = FileMeta::new(Producer::Capture, cfg.command.clone());
    meta.captures = vec![origin.clone()];
    meta.block_size = cfg.privacy.hashes().then_some(cfg.block_size);
    meta.extra
        .insert("tokenizer".into(), cfg.tokenizer.name().to_string());
    meta.privacy = Some(Manifest {
        time_bucket_ms: cfg.time_bucket.map(|b| b.as_millis() as u64),
        ..Manifest::new(
            cfg.privacy,
            Some(&cfg.hash_key.id()),
            cfg.block_size,
            cfg.tokenizer.name(),
        )
    });
    meta.extra
        .insert("sample_rate".into(), cfg.sample_rate.to_string());
    let mut wcfg = WriterConfig::new(&cfg.out, cfg.file_prefix.clone(), meta);
    wcfg.max_file_bytes = cfg.max_file_bytes;
    wcfg.max_file_age = cfg.max_file_age;
    wcfg.rotate_on_hour = cfg.rotate_on_hour;
    wcfg.flush_interval = cfg.flush_interval;
    wcfg
}

/// Starts the serving threads after the first (thread `i + 1` accepts from `others[i]`, on
/// its own runtime) until accepting stops; each keeps its connections until the hard stop.
fn spawn_serving(
    others: Vec<std::net::TcpListener>,
    serving: &Serving,
    accepting: &watch::Receiver<bool>,
    warm_heap: usize,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    let mut threads = Vec::with_capacity(others.len());
    for (i, l) in others.into_iter().enumerate() {
        let (s, mut accepting) = (serving.clone(), accepting.clone());
        threads.push(crate::runtime::threads::spawn(
            i + 1,
            warm_heap,
            move || async move {
                let mut hard = s.hard.clone();
                match TcpListener::from_std(l) {
                    Ok(l) => {
                        tokio::select! {
                            _ = accept_loop(l, s) => {}
                            _ = accepting.wait_for(|a| !*a) => {}
                        }
                    }
                    // Dropping it closes it: the kernel sends its connections to the others.
                    Err(e) => {
                        eprintln!("llmreplay capture: serving thread {}: {e}", i + 1);
                        drop(s);
                    }
                }
                // Its connections drain on this runtime; dropped when the proxy is done.
                let _ = hard.wait_for(|h| *h).await;
            },
        )?);
    }
    Ok(threads)
}

/// What every accept loop needs, cloned into each serving thread.
#[derive(Clone)]
struct Serving {
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
    builder: auto::Builder<TokioExecutor>,
    /// Set when connections are asked to finish (no more keep-alive; h2 GOAWAY).
    graceful: watch::Receiver<bool>,
    /// Set when what is left is cut (and, at the very end, when the proxy is done).
    hard: watch::Receiver<bool>,
    /// Held by every connection: all dropped when every connection is done.
    guard: mpsc::Sender<()>,
}

/// The shutdown's senders and what it waits for.
struct Stages {
    stop: oneshot::Receiver<Duration>,
    /// Set to false to stop every serving thread's accept loop.
    accepting: watch::Sender<bool>,
    graceful: watch::Sender<bool>,
    hard: watch::Sender<bool>,
    conns_done: mpsc::Receiver<()>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

fn conn_builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's own header timeout (30 s from when it starts waiting for a head, keep-alive
    // idle included) would override --client-keepalive-timeout and
    // --client-header-timeout: crate::serving::limits enforces those.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    builder.http2().timer(TokioTimer::new());
    builder
}

/// Accepts connections on `listener` and serves each in a task of the current runtime, until
/// dropped.
async fn accept_loop(listener: TcpListener, s: Serving) {
    let mut backoff = AcceptBackoff::new("proxy");
    let mut turns = AcceptTurns::default();
    loop {
        // None while the admin listener is using the spare descriptor (an accept here could
        // take it).
        let Some(accepted) = s.shared.admin_rescue.accept(&listener).await else {
            continue;
        };
        match accepted {
            Ok((sock, peer)) => {
                let accepted = Instant::now();
                let peer = ClientAddr::of(peer);
                backoff.ok();
                let _ = sock.set_nodelay(true);
                let c = s.clone();
                match &s.acceptor {
                    None => {
                        tokio::spawn(serve_plain(sock, peer, accepted, c));
                    }
                    Some(acc) => {
                        let acc = acc.clone();
                        tokio::spawn(async move {
                            let hs =
                                tokio::time::timeout(Duration::from_secs(10), acc.accept(sock))
                                    .await;
                            if let Ok(Ok(tls)) = hs {
                                serve_conn(tls, peer, accepted, c).await;
                            }
                        });
                    }
                }
                turns.accepted().await;
            }
            Err(e) => {
                s.shared
                    .accept_failed_us
                    .store(wire::clock::epoch_us(), Relaxed);
                backoff.failed(&e, &s.shared.metrics).await
            }
        }
    }
}

async fn run(
    listener: TcpListener,
    admin: Option<TcpListener>,
    serving: Serving,
    writer: WriterThread,
    stages: Stages,
) -> Result<ShutdownReport> {
    let Stages {
        mut stop,
        accepting,
        graceful: graceful_tx,
        hard: hard_tx,
        mut conns_done,
        threads,
    } = stages;
    let shared = serving.shared.clone();
    let admin_task =
        admin.map(|l| tokio::spawn(serve_admin(l, shared.clone(), serving.hard.clone())));
    let drain = tokio::select! {
        _ = accept_loop(listener, serving) => Duration::ZERO,
        d = &mut stop => d.unwrap_or(Duration::ZERO),
    };
    // Every thread's listener closes; the connections they hold drain.
    let _ = accepting.send(false);
    shared.draining.store(true, Relaxed);
    let _ = graceful_tx.send(true);
    let drain_until = Instant::now() + drain;
    let drained = tokio::time::timeout(drain, conns_done.recv()).await.is_ok();
    if !drained {
        shared.recorder.hard_stop.store(true, Relaxed);
        let _ = hard_tx.send(true);
        shared.cut.cut();
        let _ = tokio::time::timeout(Duration::from_secs(5), conns_done.recv()).await;
    }
    // Bodies of h2 streams live in their own tasks: wait for their records too.
    let deadline = Instant::now() + Duration::from_secs(5);
    while shared.metrics.in_flight.load(Relaxed) > 0 && Instant::now() < deadline {
        let notified = shared.recorder.idle.notified();
        if shared.metrics.in_flight.load(Relaxed) == 0 {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
    }
    let _ = hard_tx.send(true);
    shared.cut.cut();
    if let Some(t) = admin_task {
        let _ = t.await;
    }
    // The serving threads drop what is left on their runtimes (finishing those rows) before
    // the writer closes.
    let _ = tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await;
    // Shadow requests still in flight finish within what is left of the drain, at most
    // SHADOW_GRACE (a candidate slower than production is still answering the last requests;
    // a stalled one must not hold the exit), then are cut, their rows queued before the
    // writer closes.
    if let Some(s) = &shared.shadow {
        s.mirror_off();
        let until = drain_until.min(Instant::now() + SHADOW_GRACE);
        while drained && s.in_flight() > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        s.stop().await;
    }
    if let Some(log) = &shared.recorder.phases {
        if let Err(e) = log.write() {
            eprintln!("llmreplay capture: writing the phase log: {e}");
        }
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

/// Serves one plain-http client connection, accepted at `accepted`: by the lean path
/// ([`crate::serving::lean`]) while its requests are lean ones, then by hyper.
async fn serve_plain(sock: TcpStream, peer: ClientAddr, accepted: Instant, s: Serving) {
    let (mut io, phase) = guarded(sock, &s.shared);
    let shared = &s.shared;
    let mut graceful = s.graceful.clone();
    let lean = crate::serving::lean::serve(
        &mut io,
        &phase,
        shared,
        (peer, Some(accepted)),
        &mut graceful,
    );
    if let Some(Some(h)) = shared.cut.until(lean).await {
        io.unread(h.unread);
        serve_hyper(io, phase, (peer, h.accepted), s).await;
    }
}

/// Serves one client connection (TLS), accepted at `accepted`.
async fn serve_conn<I>(io: I, peer: ClientAddr, accepted: Instant, s: Serving)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (io, phase) = guarded(io, &s.shared);
    serve_hyper(io, phase, (peer, Some(accepted)), s).await;
}

/// A client connection's socket under the client deadlines, and its phase.
fn guarded<I>(io: I, shared: &Shared) -> (GuardedIo<I>, Arc<ConnPhase>) {
    let phase = ConnPhase::new();
    let io = GuardedIo::new(io, phase.clone(), shared.cfg.client, shared.metrics.clone());
    (io, phase)
}

/// Serves a client connection from `peer` with hyper to its end (`accepted`: when its first
/// request is still to come, the accept instant).
async fn serve_hyper<I>(
    io: GuardedIo<I>,
    phase: Arc<ConnPhase>,
    (peer, accepted): (ClientAddr, Option<Instant>),
    s: Serving,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Serving {
        builder,
        shared,
        mut graceful,
        mut hard,
        guard: _guard,
        ..
    } = s;
    // The first request's phases start at the accept.
    let accepted = std::cell::Cell::new(accepted);
    let svc = service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(peer);
        // The head is read: the connection serves this request until its response body is
        // done (no client-side read deadline meanwhile; see crate::serving::limits).
        let active = phase.start();
        let (t0, arrival) = (Instant::now(), wire::clock::epoch_us());
        let shared = shared.clone();
        let accepted = accepted.take();
        async move {
            let r = handle(shared, req, t0, arrival, accepted).await?;
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

/// Spare descriptors the admin listener holds (see `serve_admin`), opened up to two; while
/// the process is out of descriptors none can be opened, and the reserve stays short.
fn top_up(reserve: &mut Vec<std::fs::File>) {
    while reserve.len() < 2 {
        match spare_fd() {
            Some(f) => reserve.push(f),
            None => break,
        }
    }
}

/// The admin listener's accept loop: HTTP/1.1 only, answered by
/// [`admin_response`](crate::admin::admin_response), ending with the proxy.
async fn serve_admin(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut backoff = AcceptBackoff::new("admin");
    // Descriptors kept in reserve: when the proxy's connections have taken all the others,
    // one is given up to accept one admin connection, so /metrics and /healthz still answer
    // (the classic spare-descriptor trick; the serving threads' accepts hold off meanwhile,
    // see accept::HoldOff). Two: another thread of the process (an upstream connect, a
    // file the writer opens) can still take the first freed one.
    let mut reserve: Vec<std::fs::File> = Vec::new();
    top_up(&mut reserve);
    loop {
        tokio::select! {
            r = listener.accept() => {
                let sock = match r {
                    Ok((sock, _)) => {
                        top_up(&mut reserve);
                        sock
                    }
                    Err(e) => {
                        let mut rescued = None;
                        if fd_exhausted(&e) {
                            top_up(&mut reserve);
                        }
                        while fd_exhausted(&e) && !matches!(rescued, Some(Ok(_))) {
                            let Some(f) = reserve.pop() else { break };
                            // The serving threads' accepts hold off, and the freed
                            // descriptor is this accept's (see accept::HoldOff).
                            let held = shared.admin_rescue.hold(Duration::from_millis(100)).await;
                            drop(f);
                            rescued = tokio::time::timeout(Duration::from_millis(50), listener.accept())
                                .await
                                .ok();
                            drop(held);
                        }
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
                    let (io, phase) = guarded(sock, &s);
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let active = phase.start();
                        let r = admin_response(&s, req.method(), req.uri().path(), wire::clock::epoch_us());
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
