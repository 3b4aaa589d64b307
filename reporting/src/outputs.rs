//! What a plain replay (one run per target, no sweep) says once its runs are done: each
//! target's console report, its JSON result written through [`results::outputs`]
//! (`--save-result`), and the side-by-side table of several targets.
//!
//! The runs themselves are [`replay::replay`]'s; this module only reads them.

use std::path::Path;

use replay::config::ValidatedConfig;
use replay::error::ReplayError;
use replay::metrics::Metrics;
use replay::run::RunOutput;

use results::build::{self, ResultInputs, TraceIdentity};
use results::ResultDoc;

/// Where a plain replay writes, and the provenance it writes with.
#[derive(Debug, Clone, Copy)]
pub struct Outputs<'a> {
    /// The exact command line.
    pub command: &'a str,
    /// `--save-result`: the JSON result (per target with several).
    pub save_result: Option<&'a Path>,
    /// `--save-detailed`: vLLM's per-request arrays in the JSON result.
    pub detailed: bool,
    /// The percentile SLOs are judged at in the side-by-side table of several targets.
    pub slo_percentile: f64,
    /// `-q`: the results without the definitions block above them.
    pub quiet: bool,
}

/// Where the text of a replay goes: its reports (stdout, for the command line) and notes of
/// what was written where (stderr).
pub trait Console {
    /// A block of the report.
    fn report(&mut self, text: &str);
    /// A note.
    fn note(&mut self, text: &str);
}

/// Reports to stdout, notes to stderr.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stdio;

impl Console for Stdio {
    fn report(&mut self, text: &str) {
        println!("{text}");
    }
    fn note(&mut self, text: &str) {
        eprintln!("{text}");
    }
}

/// Prints the report of every run and writes the JSON results `out` asks for.
pub fn write(
    cfg: &ValidatedConfig,
    identity: &TraceIdentity,
    runs: &[(RunOutput, Metrics)],
    out: &Outputs,
    console: &mut dyn Console,
) -> Result<(), ReplayError> {
    if !out.quiet {
        console.report(crate::console::definitions());
    }
    let many = runs.len() > 1;
    for (run, m) in runs {
        let inputs = ResultInputs {
            cfg,
            run,
            metrics: m,
            trace: identity,
            command: out.command,
            detailed: out.detailed,
        };
        console.report(&crate::console::console_report(&inputs));
        if let Some(p) = out.save_result {
            let at = results::outputs::save_result(p, many, &inputs)?;
            console.note(&format!("result written to {at}"));
        }
    }
    if many {
        let results: Vec<ResultDoc> = runs
            .iter()
            .map(|(run, m)| {
                build::result_doc(&ResultInputs {
                    cfg,
                    run,
                    metrics: m,
                    trace: identity,
                    command: out.command,
                    detailed: false,
                })
            })
            .collect();
        let series = crate::series::series_of(&results, None, out.slo_percentile);
        let tables = crate::compare::compare(&series);
        console.report(&crate::compare::render(&series, &tables));
    }
    Ok(())
}
