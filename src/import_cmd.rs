//! `llmreplay import` (public trace formats → our Parquet trace) and `llmreplay export` (our
//! trace → Mooncake JSONL for NVIDIA AIPerf and SGLang's bench_serving): flags and wiring; the
//! work is in the `import` crate.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use import::{self, Format, ImportOptions};
use tokenize::Tokenizer;

use crate::flags::parse_rate;

/// `llmreplay import`.
#[derive(Args, Debug)]
pub struct ImportArgs {
    /// Source files (one format each; several are concatenated into one trace).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output trace file (Parquet).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Source format: azure, burstgpt, mooncake, qwen, sharegpt, or auto (detected from the content).
    #[arg(long, default_value = "auto")]
    pub format: Format,
    /// Tokenizer that counts ShareGPT text: cl100k_base, o200k_base, words, or a tokenizer.json path.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// ShareGPT (no timestamps): gamma arrivals at this rate, req/s (inf = all at once).
    #[arg(long, value_parser = parse_rate, default_value = "inf")]
    pub request_rate: f64,
    /// ShareGPT: gamma shape of inter-arrivals (1 = Poisson).
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// ShareGPT: seed of the arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Model name written on every row (default: the source's, where it has one).
    #[arg(long)]
    pub model: Option<String>,
    /// Keep only the first N rows of each input (for samples); the file metadata says so.
    #[arg(long, value_name = "N")]
    pub head: Option<usize>,
}

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// Mooncake JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.
    Mooncake,
}

impl std::str::FromStr for ExportFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mooncake" => Ok(ExportFormat::Mooncake),
            _ => Err(format!("unknown export format {s:?} (expected mooncake)")),
        }
    }
}

/// `llmreplay export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Trace files, directories or globs.
    #[arg(required = true)]
    pub traces: Vec<String>,
    /// Output file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Output format (mooncake: what AIPerf's --custom-dataset-type mooncake_trace and SGLang's bench_serving read).
    #[arg(long, default_value = "mooncake")]
    pub format: ExportFormat,
}

/// Runs `llmreplay import`; `command` is the command line, kept in the file's metadata.
pub fn run_import(a: ImportArgs, command: &str) -> Result<()> {
    let tokenizer = match &a.tokenizer {
        Some(spec) => Some(Arc::new(
            Tokenizer::load(spec).with_context(|| format!("loading tokenizer {spec}"))?,
        )),
        None => None,
    };
    trace_format::arrivals::validate(a.request_rate, a.burstiness)?;
    if a.head == Some(0) {
        bail!("--head must be at least 1");
    }
    let opts = ImportOptions {
        format: a.format,
        tokenizer,
        request_rate: a.request_rate,
        burstiness: a.burstiness,
        seed: a.seed,
        model: a.model.clone(),
    };
    let mut imported = if let Some(n) = a.head {
        // Per input: import, keep the first n rows, then write them together.
        let mut all: Option<import::Imported> = None;
        for p in &a.inputs {
            let mut one = import::import(std::slice::from_ref(p), &opts, command)?;
            one.records.truncate(n);
            let s = &mut one.sources[0];
            let kept = one.records.len();
            if kept < s.rows {
                eprintln!(
                    "{}: keeping the first {kept} of {} rows (--head)",
                    p.display(),
                    s.rows
                );
            }
            s.rows = kept;
            s.prompt_tokens = one.records.iter().filter_map(|r| r.prompt_tokens).sum();
            s.output_tokens = one.records.iter().filter_map(|r| r.output_tokens).sum();
            s.first_arrival_us = one.records.iter().map(|r| r.arrival_time_us).min();
            s.last_arrival_us = one.records.iter().map(|r| r.arrival_time_us).max();
            match &mut all {
                None => all = Some(one),
                Some(acc) => {
                    if acc.meta.block_size.is_some()
                        && one.meta.block_size.is_some()
                        && acc.meta.block_size != one.meta.block_size
                    {
                        bail!(
                            "{}: hash ids of another block size; import it separately",
                            p.display()
                        );
                    }
                    acc.meta.block_size = acc.meta.block_size.or(one.meta.block_size);
                    acc.meta.source = Some(format!(
                        "{},{}",
                        acc.meta.source.clone().unwrap_or_default(),
                        one.meta.source.clone().unwrap_or_default()
                    ));
                    acc.records.extend(one.records);
                    acc.sources.extend(one.sources);
                }
            }
        }
        let mut all = all.context("no input")?;
        all.meta.extra.insert("head".into(), n.to_string());
        all
    } else {
        import::import(&a.inputs, &opts, command)?
    };
    // Request ids must stay unique when --head imported inputs one by one with equal stems.
    let mut seen = std::collections::HashSet::new();
    if !imported
        .records
        .iter()
        .all(|r| seen.insert(r.request_id.as_str()))
    {
        bail!("two inputs produce the same request ids (same file name?); rename one");
    }
    for s in &imported.sources {
        eprintln!("{s}");
        for why in s.skipped.iter().take(5) {
            eprintln!("  skipped: {why}");
        }
        if s.skipped.len() > 5 {
            eprintln!("  ... and {} more skipped", s.skipped.len() - 5);
        }
    }
    let rows = imported.records.len();
    let at = store::write_trace(&a.output, &imported.records, &imported.meta)
        .with_context(|| format!("writing {}", a.output.display()))?;
    imported.records.clear();
    eprintln!(
        "{rows} requests written to {at}{}",
        imported
            .meta
            .block_size
            .map(|b| format!(" (prefix hashes of {b}-token blocks)"))
            .unwrap_or_default()
    );
    Ok(())
}

/// The note for rows export left out: how many of how many, per reason, and an example.
fn skipped_note(e: &import::MooncakeExport, rows: usize) -> String {
    let by: Vec<String> = e
        .skipped_by
        .iter()
        .map(|(r, n)| format!("{n}: {r}"))
        .collect();
    format!(
        "note: {} of {rows} rows skipped ({}); first: request {}",
        e.skipped_rows(),
        by.join("; "),
        e.skipped.first().map_or("?", |s| s.0.as_str())
    )
}

/// Runs `llmreplay export`: rows are read in arrival order and written as read.
pub fn run_export(a: ExportArgs) -> Result<()> {
    let stream = store::open_stream(&a.traces).context("reading the trace")?;
    match a.format {
        ExportFormat::Mooncake => {
            let sizes: std::collections::BTreeSet<u32> = stream
                .files()
                .iter()
                .filter_map(|f| f.meta.block_size)
                .collect();
            if sizes.len() > 1 {
                bail!(
                    "the trace files have prefix hashes of different block sizes ({sizes:?}); export them separately"
                );
            }
            let e = import::export_mooncake_stream(stream.records(), &a.output)
                .with_context(|| format!("exporting to {}", a.output.display()))?;
            eprintln!(
                "{} requests written to {} (mooncake JSONL)",
                e.written,
                a.output.display()
            );
            if e.skipped_rows() > 0 {
                eprintln!("{}", skipped_note(&e, stream.rows()));
            }
            let with_hashes = e.with_hashes;
            if with_hashes > 0 {
                match sizes.iter().next() {
                    Some(512) => {}
                    Some(b) => eprintln!(
                        "note: hash_ids name {b}-token blocks; Mooncake consumers assume 512 unless told (set their block size to {b})"
                    ),
                    None => eprintln!(
                        "note: the trace does not record its prefix-hash block size; tell the consumer yours"
                    ),
                }
            }
            if with_hashes < e.written {
                eprintln!(
                    "note: {} of {} requests have no hash_ids (no prefix information)",
                    e.written - with_hashes,
                    e.written
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_skipped_note_counts_rows_per_reason() {
        let s = |id: &str, why: &str| (id.to_string(), why.to_string());
        let e = import::MooncakeExport {
            skipped: vec![s("a", "no prompt_tokens"), s("b", "no output_tokens")],
            skipped_by: vec![
                ("no prompt_tokens".into(), 2),
                ("no output_tokens".into(), 1),
            ],
            ..Default::default()
        };
        let note = skipped_note(&e, 10);
        assert_eq!(
            note,
            "note: 3 of 10 rows skipped (2: no prompt_tokens; 1: no output_tokens); first: request a"
        );
    }
}
