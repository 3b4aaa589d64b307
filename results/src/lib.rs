//! The result contract: what a replay run leaves behind, apart from the reports that read it
//! (`reporting`). Depends on the engine (`replay`), the trace format and `store`, never on
//! `reporting`.
//!
//! - [`doc`]: the JSON result document (one serde type: the key contract of
//!   `--save-result`, sweeps and `merge`; `result.schema.json` beside this crate).
//!   [`sweep_doc`]: the sweep document. [`figures`]: the engine's typed figures in it
//!   (metric coverage, server histograms, slices and drift). [`settings`]: the settings a
//!   run was made with (what `merge` reads back from `--results` files).
//! - [`build`]: a run's document built from its configuration, run and metrics (the typed
//!   values the engine returns), the trace's identity, the dispatch-lag verdict.
//! - [`level`] and [`verdict`]: the rule a level or a run is judged by, and a run's PASS or
//!   FAIL and why (one rule, over `trace_format::cause`).
//! - [`validity`]: a run's validity stamp, its own timing error against the figures it
//!   reports.
//! - [`outputs`]: what a plain replay writes (its JSON results, the metadata of its
//!   `--results` rows); [`sink`]: those rows as they finish.
//! - [`merge`]: the shards of one run into one result (and a killed run's journal, first).
#![deny(missing_docs)]

pub mod build;
pub mod doc;
pub mod figures;
pub mod level;
pub mod merge;
pub mod outputs;
pub mod parquet_sink;
pub mod pct;
pub mod run_verdict;
pub mod settings;
pub mod sweep_doc;
pub mod validity;

pub use doc::{is_result_key, ResultDoc};
