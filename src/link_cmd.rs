//! `llmreplay link`: the flags, and the wiring of the fleet pass (`proxy::linking::fleet`):
//! several captures' files read as one trace in arrival order, linked as one capture would
//! have linked them, written to one file.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

/// `llmreplay link` flags.
#[derive(Args, Debug)]
pub struct LinkArgs {
    /// The captures' traces: directories, files, globs or object-store prefixes (Hive
    /// partitions included), of any number of capture processes, hashed under one
    /// --hash-key-file.
    #[arg(required = true)]
    traces: Vec<String>,
    /// The linked trace (one Parquet file).
    #[arg(long)]
    out: PathBuf,
    /// Print what the pass did as JSON instead of lines.
    #[arg(long)]
    json: bool,
}

/// Runs `llmreplay link`.
pub fn run_link(a: LinkArgs, command: &str) -> Result<()> {
    let stream = crate::traces::open_stream(&a.traces).context("reading the captures")?;
    let report = proxy::linking::fleet::link_stream(&stream, &a.out, command)
        .with_context(|| format!("linking into {}", a.out.display()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for line in report.lines() {
            println!("{line}");
        }
        println!("wrote {}", a.out.display());
    }
    Ok(())
}
