//! OpenTelemetry out of llmreplay: every finished row as one OTLP span with the GenAI
//! semantic conventions, and the run's latency and token histograms as OTLP metrics, POSTed
//! as HTTP/protobuf to `<endpoint>/v1/traces` and `<endpoint>/v1/metrics`.
//!
//! The exporter is the first user of the row fan-out (replay's `sink::Fanout`, capture's
//! recorder taps): rows reach it through a bounded queue that never waits ([`Exporter::send`]
//! drops and counts when it is full), and everything else — building spans, aggregating
//! histograms, encoding, the HTTP exchange — runs on its own thread. A slow or unreachable
//! receiver costs spans (counted in [`ExportStats`]), never the measuring path or the
//! trace writer their pace.
//!
//! Conventions followed: OpenTelemetry semantic conventions for GenAI, v1.41 (development):
//! span `{gen_ai.operation.name} {gen_ai.request.model}`, kind CLIENT; attributes
//! `gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.request.max_tokens`,
//! `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`,
//! `gen_ai.response.time_to_first_chunk`, `server.address`, `server.port`,
//! `http.response.status_code`, `error.type`; metrics `gen_ai.client.operation.duration`,
//! `gen_ai.client.operation.time_to_first_chunk`,
//! `gen_ai.client.operation.time_per_output_chunk`, `gen_ai.client.token.usage`.
#![deny(missing_docs)]

mod export;
pub mod otlp_metrics;
mod post;
pub mod span;
pub mod testing;

/// The OTLP message types (`opentelemetry-proto`), for receivers and tests.
pub use opentelemetry_proto as proto;

pub use export::{ExportReport, ExportStats, Exporter, OtlpConfig, Role};
pub use post::Endpoint;

/// What can go wrong starting the exporter (exporting itself never fails a run: its
/// failures are counted).
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The endpoint or a header is not usable.
    #[error("{0}")]
    Config(String),
    /// The exporter's thread could not be started.
    #[error("starting the OTLP exporter: {0}")]
    Io(#[from] std::io::Error),
}
