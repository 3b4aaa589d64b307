//! `llmreplay shadow`: a capture with `--shadow` candidates, each mirrored request beside its
//! production request (`reporting::shadow`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use replay::config::Slo;

#[derive(Args, Debug)]
pub struct ShadowArgs {
    /// The capture (files, directories or globs): production's rows and the shadow rows
    /// `capture --shadow NAME=URL` wrote beside them.
    #[arg(required = true, num_args = 1..)]
    pub trace: Vec<String>,
    /// Latency SLOs the candidates are judged by, `KEY:MS` with keys ttft, tpot, e2el.
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<Slo>,
    /// The percentile the SLOs are judged at.
    #[arg(long, default_value_t = 95.0, value_parser = crate::flags::parse_percentile)]
    pub slo_percentile: f64,
    /// Also write the assessment as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write an HTML page with production's and each candidate's distributions over the
    /// same requests, and of their per-request differences.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Exit with status 6 (after writing every output) when a candidate's verdict is FAIL.
    #[arg(long)]
    pub fail_on_slo: bool,
}

/// Runs the assessment; Ok(true) when --fail-on-slo applies (a candidate failed).
pub fn run_shadow(a: ShadowArgs) -> Result<bool> {
    let trace = crate::traces::read_traces(&a.trace).context("reading the capture")?;
    let rep = reporting::shadow::assess(&trace.records, &a.goodput, a.slo_percentile)?;
    print!("{rep}");
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&rep)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.html {
        std::fs::write(
            p,
            rep.render_html(
                &trace.records,
                "llmreplay shadow: candidates against production",
            ),
        )
        .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(a.fail_on_slo && !rep.all_pass())
}
