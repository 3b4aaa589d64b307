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
//! # Rooms
//! Each folder's `mod.rs` says what it owns and what it may call; calls go one way
//! (`scripts/module-cycles.py` checks it at every level):
//! - `lifecycle`: [`start`], the listeners, the two-stage shutdown;
//! - `admin`: `/metrics`, `/healthz`, `/readyz`, shadow on/off;
//! - `serving/`: the client side, from a connection's accept to its response's last byte;
//! - `shadow`: recorded requests mirrored to candidates, on a thread of their own;
//! - [`recording`]: a request's row from its arrival to the trace file;
//! - [`linking`]: which earlier row a request continues, from hashes, on the writer thread;
//! - `upstream/`: everything that reaches the one upstream;
//! - [`config`], [`prefix`], [`metrics`], [`error`], `phases`, `runtime/`: shared by all.
//!
//! Validate a [`ProxyConfig`] once ([`ProxyConfig::validate`]), start the proxy on it with
//! [`start`] and stop it with [`ProxyHandle::shutdown`].
#![deny(missing_docs)]

mod admin;
pub mod capture_metrics;
pub mod config;
pub mod error;
mod lifecycle;
pub mod linking;
mod origin;
mod phases;
pub mod prefix;
pub mod recording;
mod runtime;
mod serving;
mod shadow;
mod upstream;

pub use capture_metrics::Metrics;
pub use config::validated::{ValidatedProxyConfig, SECRET_HEADERS};
pub use config::{
    ClientLimits, ForwardedHeaders, Privacy, ProxyConfig, ShadowConfig, ShadowSampleBy,
    ShadowTarget, TlsFiles, UsageMode,
};
pub use error::{ConfigError, ProxyError, Result, Setting};
pub use lifecycle::{start, ProxyHandle, ShutdownReport};
pub use recording::observe::{StreamObserver, Strip};
pub use tokenize::Tokenizer;

/// The runtime to run [`start`] on: the caller's thread serves too, as one of the proxy's
/// serving threads, so it is built as theirs are.
pub fn serving_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    runtime::threads::runtime()
}
