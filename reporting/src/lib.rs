//! Reporting: what replay runs say. Depends on the engine (`replay`) and the trace format,
//! never the other way round.
//!
//! - [`result_doc`]: the JSON result document (one serde type: the key contract of
//!   `--save-result`, sweeps and `merge`), and the sweep document.
//! - [`report`]: a run's result built from its configuration, run and metrics; the
//!   dispatch-lag verdict. [`sweep_doc`]: the sweep document. [`console`]: the console report.
//! - [`results`]: reading result files back into series (one configuration across levels).
//! - [`sweep`]: load levels, each a fresh run, and the sweep's document and summary.
//! - [`merge`]: the shards of one run into one result (and a killed run's journal, first).
//! - [`outputs`]: what a plain replay writes; [`sink`]: its `--results` rows as they finish.
//! - [`definitions`]: the definitions printed above results, from `docs/metrics.md`.
//! - [`verdict`]: a run's PASS or FAIL and why (one rule, over `trace_format::cause`).
//! - [`capacity`]: knee and capacity answer; [`plan`]: the capacity plan (replicas, cost).
//!   [`compare`]: configurations side by side.
//! - [`document`] (Markdown), [`html`] and [`svg`]: `llmreplay report`. [`alerts`]:
//!   Prometheus rules for the SLOs.
#![deny(missing_docs)]

pub mod alerts;
pub mod capacity;
pub mod compare;
pub mod console;
pub mod definitions;
pub mod document;
pub mod fidelity;
pub mod html;
pub mod merge;
pub mod outputs;
pub mod plan;
pub mod report;
pub mod result_doc;
pub mod results;
pub mod sink;
pub mod svg;
pub mod sweep;
pub mod sweep_doc;
pub mod verdict;

pub use result_doc::{is_result_key, ResultDoc};
