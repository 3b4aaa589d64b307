//! The llmreplay capture proxy: a transparent streaming reverse proxy in front of one
//! OpenAI-compatible upstream that records every generation request as a row of the trace
//! schema (see `trace_format::TraceRecord`) into rotating, crash-safe Parquet files.
//!
//! - Transparent: status, headers (minus hop-by-hop) and body bytes reach the client as the
//!   upstream sent them; each frame is forwarded the moment it arrives, observed on the way
//!   (one `Instant::now()` per frame, the shared SSE parser, no lock).
//! - Token counts: a streaming request that did not ask for usage gets
//!   `stream_options.include_usage` (and vLLM's `continuous_usage_stats` with
//!   [`UsageMode::Vllm`]); what that adds to the stream is removed byte-exactly before the
//!   client sees it (see [`observe`]).
//! - Timing: t0 is when the request headers were read; TTFT, E2EL and chunk times are µs
//!   offsets from it, as in ../shared/docs/metrics.md.
//! - Records go through a bounded queue to the trace writer's own thread; a full queue drops
//!   and counts, never delays a request.
//!
//! Validate a [`ProxyConfig`] once ([`ProxyConfig::validate`]), start the proxy on it with
//! [`start`] and stop it with [`ProxyHandle::shutdown`].
#![deny(missing_docs)]

mod accept;
mod admin;
pub mod agents;
pub mod completions;
pub mod config;
mod cut;
pub mod error;
mod forward;
mod handler;
mod heap;
mod http1;
pub mod jsonscan;
mod limits;
pub mod metrics;
pub mod observe;
mod otlp;
mod phases;
pub mod prefix;
mod prompts;
mod reach;
mod record;
pub mod request;
mod server;
mod serving;
pub mod sessions;
mod shadow;
mod sink;
mod state;
mod tls;
mod upstream;
mod validated;

pub use config::{
    ClientLimits, ForwardedHeaders, ProxyConfig, RecordBodies, ShadowConfig, ShadowSampleBy,
    ShadowTarget, TlsFiles, UsageMode,
};
pub use error::{ConfigError, ProxyError, Result, Setting};
pub use metrics::Metrics;
pub use observe::{StreamObserver, Strip};
pub use server::{start, ProxyHandle, ShutdownReport};
pub use tokenize::Tokenizer;
pub use validated::{ValidatedProxyConfig, SECRET_HEADERS};

/// The runtime to run [`start`] on: the caller's thread serves too, as one of the proxy's
/// serving threads, so it is built as theirs are.
pub fn serving_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    serving::runtime()
}
