//! OpenTelemetry flags shared by `replay` and `capture` (`--otlp-endpoint`, `--otlp-header`,
//! `--no-traceparent`), and the wiring of the exporter as one more of replay's row sinks.

use std::sync::Arc;

use anyhow::Result;
use telemetry::span::{Server, SpanId};
use telemetry::{Exporter, OtlpConfig, Role};

/// OpenTelemetry: trace context and OTLP export.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OtelArgs {
    /// Export every request as an OTLP span (GenAI semantic conventions; its trace id is the
    /// row's `trace_id`) and the run's latency and token histograms as OTLP metrics, over
    /// HTTP/protobuf to URL/v1/traces and URL/v1/metrics (e.g. http://127.0.0.1:4318, an
    /// OpenTelemetry Collector or Jaeger). Off by default. Bounded: spans the receiver cannot
    /// take in time are dropped and counted, never slowing the requests.
    #[arg(long, value_name = "URL", help_heading = "OpenTelemetry")]
    pub otlp_endpoint: Option<String>,
    /// Extra header `K=V` on every OTLP export (repeatable; e.g. a backend's API key).
    #[arg(
        long,
        value_name = "K=V",
        requires = "otlp_endpoint",
        help_heading = "OpenTelemetry"
    )]
    pub otlp_header: Vec<String>,
    /// Send no W3C `traceparent` header. By default replay sends one with every request, and
    /// capture forwards a client's unchanged or starts one when the client sent none; its ids
    /// go to the row's `trace_id` and `span_id`, so the server's own spans (vLLM's
    /// --otlp-traces-endpoint) join the row by trace id.
    #[arg(long, help_heading = "OpenTelemetry")]
    pub no_traceparent: bool,
}

impl OtelArgs {
    /// The exporter's settings, when `--otlp-endpoint` is given.
    pub fn config(&self, role: Role) -> Result<Option<OtlpConfig>> {
        let Some(url) = &self.otlp_endpoint else {
            return Ok(None);
        };
        let mut c = OtlpConfig::new(url, role)?;
        for h in &self.otlp_header {
            c.header(h)?;
        }
        Ok(Some(c))
    }
}

/// Replay's rows to the exporter: one more [`replay::RowSink`] of the run's fan-out. It
/// never fails and never waits (the exporter's queue drops, counted, when full).
pub struct OtlpRows {
    exporter: Exporter,
    server: Option<Arc<Server>>,
}

impl OtlpRows {
    /// Starts the exporter.
    pub fn start(cfg: OtlpConfig) -> Result<OtlpRows> {
        Ok(OtlpRows {
            exporter: Exporter::start(cfg)?,
            server: None,
        })
    }

    /// Exports what is queued and the metrics; the line for the end of the run.
    pub fn close(self) -> String {
        self.exporter.close().to_string()
    }
}

impl replay::RowSink for OtlpRows {
    fn start(
        &mut self,
        target: &replay::config::Target,
        _run: &str,
    ) -> Result<(), replay::ReplayError> {
        self.server = Server::from_url(&target.url).map(Arc::new);
        Ok(())
    }

    fn row(&mut self, rec: &trace_format::TraceRecord) -> Result<(), replay::ReplayError> {
        self.exporter.send(rec, SpanId::Own, self.server.as_ref());
        Ok(())
    }
}
