//! Reporting: what results say. Reads the result contract (`results`: the JSON document, the
//! verdict rule) and the engine's types (`replay`), never the other way round.
//!
//! - [`console`]: the console report of one run; [`outputs`]: what a plain replay prints
//!   (its JSON results are written through `results::outputs`).
//! - [`series`]: reading result files back into series (one configuration across levels).
//! - [`sweep`]: load levels, each a fresh run, and the sweep's document and summary.
//! - [`definitions`]: the definitions printed above results, from `docs/metrics.md`.
//! - [`capacity`]: knee and capacity answer; [`plan`]: the capacity plan (replicas, cost).
//!   [`compare`]: configurations side by side.
//! - [`document`] (Markdown), [`html`] and [`svg`]: `llmreplay report`. [`alerts`]:
//!   Prometheus rules for the SLOs. [`validity`]: each run's validity stamp, in both.
//! - [`fidelity`]: A/A fidelity of a replay against its capture; [`shadow`]: a shadow
//!   candidate against production, request by request.
#![deny(missing_docs)]

pub mod alerts;
pub mod capacity;
pub mod compare;
pub mod console;
pub mod definitions;
pub mod document;
pub mod fidelity;
pub mod html;
pub mod outputs;
pub mod paired;
pub mod plan;
pub mod series;
pub mod shadow;
pub mod svg;
pub mod sweep;
pub mod validity;
