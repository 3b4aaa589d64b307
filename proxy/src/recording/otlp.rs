//! The OTLP exporter as a recorder [`Tap`]: every recorded row becomes a span (and counts in
//! the exported metrics), through the exporter's own bounded queue; its counters show on
//! `/metrics` (`llmreplay_capture_otlp_spans_total`).

use std::sync::Arc;

use telemetry::span::{Server, SpanId};
use telemetry::{Exporter, OtlpConfig};
use trace_format::TraceRecord;

use crate::capture_metrics::Metrics;
use crate::error::{ConfigError, ProxyError, Result};
use crate::recording::writer::Tap;

/// The exporter, and the upstream its spans name (`server.address`).
pub(crate) struct OtlpTap {
    exporter: Exporter,
    server: Option<Arc<Server>>,
}

impl OtlpTap {
    /// Starts the exporter; its counters go to `metrics`.
    pub(crate) fn start(cfg: OtlpConfig, upstream: &str, metrics: &Metrics) -> Result<OtlpTap> {
        let exporter = Exporter::start(cfg)
            .map_err(|e| ProxyError::Config(ConfigError::Otlp(e.to_string())))?;
        let _ = metrics.otlp.set(exporter.stats());
        Ok(OtlpTap {
            exporter,
            server: Server::from_url(upstream).map(Arc::new),
        })
    }
}

impl Tap for OtlpTap {
    fn row(&mut self, rec: &TraceRecord, trace_started: bool) {
        let whose = if trace_started {
            SpanId::Own
        } else {
            SpanId::Parent
        };
        self.exporter.send(rec, whose, self.server.as_ref());
    }

    fn close(self: Box<Self>) -> Option<String> {
        Some(self.exporter.close().to_string())
    }
}
