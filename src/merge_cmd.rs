//! `llmreplay merge`: the flags, and the wiring that streams the shards' `--results` and
//! writes the merged Parquet file (as the rows stream, through the one-file writer of
//! `replay --results`) and JSON result. The merge itself (checks, metrics over all rows, the
//! shards' settings) is `results::merge`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

/// `llmreplay merge` flags.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// Result Parquet files of the shard runs (`replay --results`), directories or globs. The
    /// journal a killed replay left (`run.journal`, or its `run.parquet` when only the journal
    /// is there) is first finished into that file, every finished row once, marked partial.
    #[arg(required = true)]
    inputs: Vec<String>,
    /// Output path without extension: writes PATH.parquet (every row) and PATH.json (vLLM's keys).
    #[arg(short, long)]
    output: PathBuf,
    #[command(flatten)]
    metrics: crate::flags::MetricFlags,
}

/// Runs `llmreplay merge`.
pub fn run_merge(a: MergeArgs, command: &str) -> Result<()> {
    let mut inputs = Vec::with_capacity(a.inputs.len());
    for input in &a.inputs {
        if !results::parquet_sink::needs_recovery(input) {
            inputs.push(input.clone());
            continue;
        }
        let (file, rows) = results::parquet_sink::recover(std::path::Path::new(input))
            .with_context(|| format!("recovering {input}"))?;
        eprintln!(
            "recovered {rows} rows of a replay that did not finish into {} (marked partial)",
            file.display()
        );
        inputs.push(file.display().to_string());
    }
    // Two passes over the inputs in arrival order (checks, then rows and metrics): memory
    // does not grow with the rows (`results::merge`).
    let stream = store::open_stream(&inputs).context("reading the shard results")?;
    let checked = results::merge::check(&stream, command)?;
    let (pq, js) = results::merge::output_paths(&a.output);
    let mut sink = results::parquet_sink::ResultsSink::create(&pq, checked.meta().clone())?;
    let merged = results::merge::merge(
        &stream,
        checked,
        &results::merge::MergeOptions {
            goodput: a.metrics.goodput,
            percentile_metrics: a.metrics.percentile_metrics,
            metric_percentiles: a.metrics.metric_percentiles,
        },
        &mut sink,
    );
    let m = match merged {
        Ok(m) => m,
        Err(e) => {
            // Nothing half-written stays behind: the journal of the rows so far goes.
            let journal = sink.journal().to_path_buf();
            drop(sink);
            let _ = std::fs::remove_file(&journal);
            return Err(e.into());
        }
    };
    for note in &m.notes {
        eprintln!("note: {note}");
    }
    let pq_at = sink
        .close()
        .with_context(|| format!("writing {}", pq.display()))?
        .at;
    let js_at = store::write_bytes(&js, m.doc.to_bytes())
        .with_context(|| format!("writing {}", js.display()))?;
    println!(
        "merged {} rows of {} runs: p99 TTFT {:.3} ms, dispatch lag {}",
        m.rows,
        m.runs,
        m.p99_ttft_ms.unwrap_or(f64::NAN),
        if m.worst_lag_too_high {
            "TOO HIGH in at least one shard: latencies include a client backlog"
        } else {
            "OK in every shard"
        }
    );
    eprintln!("written {pq_at} and {js_at}");
    Ok(())
}
