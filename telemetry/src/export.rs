//! The exporter: a bounded queue of rows to its own thread, which batches them into spans
//! and POSTs them, aggregates the metrics and POSTs those every [`OtlpConfig::metrics_every`]
//! and at the end.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    any_value::Value, AnyValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::metrics::v1::{ResourceMetrics, ScopeMetrics};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use trace_format::TraceRecord;

use crate::otlp_metrics::Aggregate;
use crate::post::{post, Endpoint};
use crate::span::{row_span, Server, SpanId};
use crate::TelemetryError;

/// Which program exports (the resource's `service.name`, and whose a row's span id is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `llmreplay replay`: every row's span id is the replay's own client span.
    Replay,
    /// `llmreplay capture`: a row's span id is the client's, unless capture started the trace.
    Capture,
}

/// The exporter's settings (`--otlp-endpoint`, `--otlp-header`).
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    /// The receiver.
    pub endpoint: Endpoint,
    /// Extra headers on every POST (e.g. an API key of a hosted backend).
    pub headers: Vec<(String, String)>,
    /// Rows the queue holds; a row arriving when it is full is dropped and counted.
    pub queue: usize,
    /// Most spans per POST.
    pub batch: usize,
    /// Longest a span waits for its batch to fill.
    pub flush_every: Duration,
    /// Metrics are sent this often (and at the end).
    pub metrics_every: Duration,
    /// Longest one POST may take (connecting, sending, the answer's status line).
    pub timeout: Duration,
    /// Most per-chunk events per span (the rest are counted as dropped events).
    pub max_chunk_events: usize,
    /// Which program exports.
    pub role: Role,
}

impl OtlpConfig {
    /// The defaults for `endpoint` (a URL, see [`Endpoint::parse`]).
    pub fn new(endpoint: &str, role: Role) -> Result<OtlpConfig, TelemetryError> {
        Ok(OtlpConfig {
            endpoint: Endpoint::parse(endpoint)?,
            headers: Vec::new(),
            queue: 8192,
            batch: 512,
            flush_every: Duration::from_secs(1),
            metrics_every: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            max_chunk_events: 64,
            role,
        })
    }

    /// Adds a `K=V` header, checked.
    pub fn header(&mut self, kv: &str) -> Result<(), TelemetryError> {
        let (k, v) = kv.split_once('=').ok_or_else(|| {
            TelemetryError::Config(format!("--otlp-header {kv:?}: expected KEY=VALUE"))
        })?;
        let k = k.trim();
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if k.is_empty() || !k.chars().all(token) || v.contains(['\r', '\n']) {
            return Err(TelemetryError::Config(format!(
                "--otlp-header {kv:?}: not a valid header"
            )));
        }
        self.headers.push((k.to_string(), v.trim().to_string()));
        Ok(())
    }
}

/// What the exporter did so far; shared with whoever shows it (capture's `/metrics`).
#[derive(Debug, Default)]
pub struct ExportStats {
    /// Spans the receiver accepted.
    pub spans_exported: AtomicU64,
    /// Rows dropped because the queue was full (the receiver was slow or unreachable).
    pub spans_dropped: AtomicU64,
    /// Spans lost in POSTs that failed.
    pub spans_failed: AtomicU64,
    /// Metric POSTs that failed.
    pub metric_exports_failed: AtomicU64,
    /// The last failure, for the end-of-run line.
    pub last_error: Mutex<Option<String>>,
}

/// What the exporter did, at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportReport {
    /// Spans the receiver accepted.
    pub exported: u64,
    /// Rows dropped at the queue (full).
    pub dropped: u64,
    /// Spans lost in failed POSTs.
    pub failed: u64,
    /// Metric POSTs that failed.
    pub metric_failures: u64,
    /// The last failure.
    pub last_error: Option<String>,
}

impl std::fmt::Display for ExportReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "OTLP: {} spans exported, {} dropped (queue full), {} lost in failed exports",
            self.exported, self.dropped, self.failed
        )?;
        if self.metric_failures > 0 {
            write!(f, ", {} metric exports failed", self.metric_failures)?;
        }
        if let Some(e) = &self.last_error {
            write!(f, " (last error: {e})")?;
        }
        Ok(())
    }
}

enum Msg {
    Row(Box<TraceRecord>, SpanId, Option<Arc<Server>>),
    Close,
}

/// The sending side and the thread.
pub struct Exporter {
    tx: SyncSender<Msg>,
    stats: Arc<ExportStats>,
    handle: Option<JoinHandle<()>>,
}

impl Exporter {
    /// Starts the exporter's thread.
    pub fn start(cfg: OtlpConfig) -> Result<Exporter, TelemetryError> {
        let (tx, rx) = mpsc::sync_channel(cfg.queue.max(1));
        let stats = Arc::new(ExportStats::default());
        let st = stats.clone();
        let handle = std::thread::Builder::new()
            .name("llmreplay-otlp".into())
            .spawn(move || Worker::new(cfg, st).run(rx))?;
        Ok(Exporter {
            tx,
            stats,
            handle: Some(handle),
        })
    }

    /// Queues a finished row for export, never waiting: when the queue is full the row is
    /// dropped and counted. `whose`: whether its span id is ours; `server`: where it went.
    pub fn send(&self, rec: &TraceRecord, whose: SpanId, server: Option<&Arc<Server>>) {
        // The queue holds rows without their body and prefix hashes (no span carries them):
        // its memory stays bounded by the row count, whatever the prompts' size.
        let mut row = rec.clone();
        (row.body, row.prefix_hashes) = (None, None);
        let msg = Msg::Row(Box::new(row), whose, server.cloned());
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(msg) {
            self.stats.spans_dropped.fetch_add(1, Relaxed);
        }
    }

    /// The counters, live.
    pub fn stats(&self) -> Arc<ExportStats> {
        self.stats.clone()
    }

    /// Exports what is queued and the final metrics (each POST bounded by the timeout; after
    /// a failed one nothing more is tried), and says what was done.
    pub fn close(mut self) -> ExportReport {
        // The queue may be full: the close waits for room, which the thread makes.
        let _ = self.tx.send(Msg::Close);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        report(&self.stats)
    }
}

fn report(s: &ExportStats) -> ExportReport {
    ExportReport {
        exported: s.spans_exported.load(Relaxed),
        dropped: s.spans_dropped.load(Relaxed),
        failed: s.spans_failed.load(Relaxed),
        metric_failures: s.metric_exports_failed.load(Relaxed),
        last_error: s.last_error.lock().ok().and_then(|e| e.clone()),
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if self.handle.is_some() {
            let _ = self.tx.try_send(Msg::Close);
        }
    }
}

struct Worker {
    cfg: OtlpConfig,
    stats: Arc<ExportStats>,
    resource: Resource,
    scope: InstrumentationScope,
    batch: Vec<Span>,
    agg: Aggregate,
    server: Option<Arc<Server>>,
}

fn string_kv(key: &str, v: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl Worker {
    fn new(cfg: OtlpConfig, stats: Arc<ExportStats>) -> Worker {
        let service = match cfg.role {
            Role::Replay => "llmreplay-replay",
            Role::Capture => "llmreplay-capture",
        };
        let version = env!("CARGO_PKG_VERSION");
        Worker {
            resource: Resource {
                attributes: vec![
                    string_kv("service.name", service),
                    string_kv("service.version", version),
                ],
                ..Default::default()
            },
            scope: InstrumentationScope {
                name: "llmreplay".into(),
                version: version.into(),
                ..Default::default()
            },
            batch: Vec::new(),
            agg: Aggregate::default(),
            server: None,
            cfg,
            stats,
        }
    }

    fn fail(&self, e: String) {
        if let Ok(mut l) = self.stats.last_error.lock() {
            *l = Some(e);
        }
    }

    fn run(mut self, rx: Receiver<Msg>) {
        let mut batch_since: Option<Instant> = None;
        let mut metrics_at = Instant::now() + self.cfg.metrics_every;
        loop {
            let wait = batch_since
                .map_or(self.cfg.flush_every, |t| {
                    self.cfg.flush_every.saturating_sub(t.elapsed())
                })
                .min(metrics_at.saturating_duration_since(Instant::now()));
            match rx.recv_timeout(wait) {
                Ok(Msg::Row(rec, whose, server)) => {
                    self.add(&rec, whose, server);
                    batch_since.get_or_insert_with(Instant::now);
                }
                Ok(Msg::Close) | Err(RecvTimeoutError::Disconnected) => {
                    // Rows queued before the close are kept.
                    while let Ok(Msg::Row(rec, whose, server)) = rx.try_recv() {
                        self.add(&rec, whose, server);
                    }
                    self.closing();
                    return;
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            let due = batch_since.is_some_and(|t| t.elapsed() >= self.cfg.flush_every);
            if self.batch.len() >= self.cfg.batch || due {
                // A failure is counted; the next batch tries again.
                while !self.batch.is_empty() && self.flush() {}
                let left = self.batch.len() as u64;
                self.stats.spans_failed.fetch_add(left, Relaxed);
                self.batch.clear();
                batch_since = None;
            }
            if Instant::now() >= metrics_at {
                self.send_metrics();
                metrics_at = Instant::now() + self.cfg.metrics_every;
            }
        }
    }

    fn add(&mut self, rec: &TraceRecord, whose: SpanId, server: Option<Arc<Server>>) {
        if server.is_some() {
            self.server = server;
        }
        self.agg.add(rec);
        // A row without a trace id (no traceparent was sent) has no span: nothing a server
        // span could join. It still counts in the metrics.
        if let Some(sp) = row_span(
            rec,
            whose,
            self.server.as_deref(),
            self.cfg.max_chunk_events,
        ) {
            self.batch.push(sp);
        }
        if self.batch.len() >= self.cfg.batch {
            self.flush();
        }
    }

    fn closing(&mut self) {
        // While closing, a failed POST ends the export: a stalled receiver costs the end of
        // the run one timeout, not one per batch.
        let mut ok = true;
        while ok && !self.batch.is_empty() {
            ok = self.flush();
        }
        let left = self.batch.len() as u64;
        self.stats.spans_failed.fetch_add(left, Relaxed);
        self.batch.clear();
        if ok {
            self.send_metrics();
        } else if !self.agg.is_empty() {
            self.stats.metric_exports_failed.fetch_add(1, Relaxed);
        }
    }

    /// POSTs the next batch; false when that failed (its spans are counted lost).
    fn flush(&mut self) -> bool {
        if self.batch.is_empty() {
            return true;
        }
        let take = self.batch.len().min(self.cfg.batch);
        let spans: Vec<Span> = self.batch.drain(..take).collect();
        let n = spans.len() as u64;
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(self.scope.clone()),
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        match post(
            &self.cfg.endpoint,
            "/v1/traces",
            &self.cfg.headers,
            &req.encode_to_vec(),
            self.cfg.timeout,
        ) {
            Ok(()) => {
                self.stats.spans_exported.fetch_add(n, Relaxed);
                true
            }
            Err(e) => {
                self.stats.spans_failed.fetch_add(n, Relaxed);
                self.fail(e);
                false
            }
        }
    }

    fn send_metrics(&mut self) {
        if self.agg.is_empty() {
            return;
        }
        let req = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(self.resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(self.scope.clone()),
                    metrics: self.agg.metrics(self.server.as_deref(), now_ns()),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        if let Err(e) = post(
            &self.cfg.endpoint,
            "/v1/metrics",
            &self.cfg.headers,
            &req.encode_to_vec(),
            self.cfg.timeout,
        ) {
            self.stats.metric_exports_failed.fetch_add(1, Relaxed);
            self.fail(e);
        }
    }
}
