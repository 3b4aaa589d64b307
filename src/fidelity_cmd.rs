//! `llmreplay fidelity`: does a replay reproduce the capture it was made from?

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct FidelityArgs {
    /// The captured trace (files, directories, globs or object-store prefixes, like replay's
    /// input: several captures are one trace).
    #[arg(long, required = true, num_args = 1..)]
    pub captured: Vec<String>,
    /// --since/--until: the window of the captured trace read (the replay's rows are all read).
    #[command(flatten)]
    pub window: crate::flags::WindowFlags,
    /// The replay's result rows (`replay --results`), replayed against the same upstream.
    #[arg(long, required = true, num_args = 1..)]
    pub replayed: Vec<String>,
    /// Another run of the same capture against the captured configuration (a second replay's
    /// --results): its difference from the capture is the engine's own run-to-run noise, and
    /// a latency difference within it reads "within the engine's own noise", not a drift.
    #[arg(long, num_args = 1..)]
    pub noise: Vec<String>,
    /// The replay's result document (replay --save-result): why captured rows were not
    /// replayed (rows it could not build, its selection).
    #[arg(long)]
    pub replay_result: Option<PathBuf>,
    /// The replay's --speedup (captured offsets are divided by it).
    #[arg(long, default_value_t = 1.0, value_parser = crate::flags::parse_positive)]
    pub speedup: f64,
    /// Also write the assessment as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write an HTML page with the captured and replayed distributions overlaid.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Exit with status 5 when the load (requests, tokens, outcomes) or the schedule does not
    /// reproduce; latencies are reported, not enforced.
    #[arg(long)]
    pub fail_on_drift: bool,
}

/// Runs the assessment; Ok(true) when --fail-on-drift applies.
pub fn run_fidelity(a: FidelityArgs) -> Result<bool> {
    let captured = crate::traces::read_traces_in(&a.captured, &a.window)
        .context("reading the captured trace")?;
    crate::traces::say_trace_captures(&captured, a.window.window()?);
    let replayed =
        crate::traces::read_traces(&a.replayed).context("reading the replay's results")?;
    let noise = if a.noise.is_empty() {
        None
    } else {
        Some(crate::traces::read_traces(&a.noise).context("reading the noise run's results")?)
    };
    // The capture and the replay's rows are compared by their hashes too: one key.
    let files = [Some(&captured), Some(&replayed), noise.as_ref()];
    trace_format::file_meta::one_key(
        files
            .iter()
            .flatten()
            .flat_map(|t| &t.files)
            .map(|f| (f.path.as_path(), &f.meta)),
    )
    .context("comparing the capture with the replay")?;
    let replay_run = match &a.replay_result {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let doc: results::ResultDoc = serde_json::from_str(&text)
                .with_context(|| format!("{}: not a replay result document", p.display()))?;
            let ext = doc.llmreplay.with_context(|| {
                format!(
                    "{}: no llmreplay section (not an llmreplay result)",
                    p.display()
                )
            })?;
            Some(reporting::fidelity::ReplayRun::from_trace_doc(&ext.trace))
        }
        None => None,
    };
    let f = reporting::fidelity::assess(
        &captured.records,
        &replayed.records,
        reporting::fidelity::Options {
            speedup: a.speedup,
            noise: noise.as_ref().map(|n| n.records.as_slice()),
            replay_run: replay_run.as_ref(),
            // The capture's time resolution, from its manifest (`--time-bucket`).
            time_bucket_ms: trace_format::file_meta::carried(captured.files.iter().map(|f| &f.meta))
                .and_then(|m| m.time_bucket_ms)
                .unwrap_or(0) as f64,
        },
    )?;
    print!("{f}");
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&f)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.html {
        std::fs::write(p, f.render_html("llmreplay A/A fidelity"))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(a.fail_on_drift && !(f.load_reproduced && f.schedule_reproduced))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[test]
    fn speedup_must_be_positive() {
        let parse = |s: &str| {
            crate::cli::Cli::try_parse_from([
                "llmreplay",
                "fidelity",
                "--captured",
                "a",
                "--replayed",
                "b",
                "--speedup",
                s,
            ])
        };
        assert!(parse("2").is_ok());
        let e = parse("0").unwrap_err().to_string();
        assert!(e.contains("\"0\" is not a positive number"), "{e}");
        assert!(parse("-1").is_err());
    }
}
