//! `llmreplay import` (public trace formats → our Parquet trace) and `llmreplay export` (our
//! trace → Mooncake JSONL for NVIDIA AIPerf and SGLang's bench_serving, or AIPerf's sessions):
//! flags and wiring; the work is in the `import` crate.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use import::{self, Format, ImportOptions};
use tokenize::Tokenizer;

use crate::flags::parse_rate;

/// What each import format maps and what it cannot (printed by `llmreplay import --help`).
pub const IMPORT_HELP: &str = "\
Formats (what becomes which column; what has no column and is not mapped):
  azure     Azure LLM inference 2023/2024 CSV: TIMESTAMP, ContextTokens, GeneratedTokens.
  burstgpt  BurstGPT CSV: Timestamp, Request/Response tokens (0 = failed), v3 Session ID.
            Not mapped: Model, Log Type (the endpoint is chat for conversation logs).
  mooncake  Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token
            blocks); AIPerf's session_id and delay (ms after the previous turn) link sessions.
            Not mapped: text_input, messages.
  qwen      Qwen Bailian JSONL (usage, coder and thinking traces): chat_id/parent_chat_id
            (sessions and parents), timestamp (s), input_length, output_length, hash_ids
            (16-token blocks). Not mapped: type, turn.
  sharegpt  ShareGPT JSON: the first human->gpt exchange, counted by --tokenizer; arrivals drawn.
  dynamo    NVIDIA Dynamo agent trace JSONL (dynamo.agent.trace.v1): request_end events are
            requests (session_id, trajectory_id chained turn after turn, parent_trajectory_id for
            subagents; request_received_ms, ttft_ms, total_time_ms, input/output_tokens, model,
            replay.input_sequence_hashes with their trace_block_size). Tool spans (tool_start,
            tool_end, tool_error) are not requests: their time is in the next turn's think time.
            Not mapped: cached_tokens, session_type_id, trajectory_final, request_id,
            x_request_id, prefill_wait_time_ms, prefill_time_ms, avg_itl_ms, kv_hit_rate,
            kv_transfer_estimated_latency_ms, queue_depth, worker, finish_reason_metadata, the
            tool spans' fields. A dropped stream is not marked, so none imports as cancelled.
  baseten   Baseten Parquet (no published column list was found; columns assumed): timestamp,
            input_tokens, output_tokens, ttft_ms, duration_ms, cancelled (replayed as a cancel
            at duration_ms), model, session_id. Not mapped: any other column (listed on import).
  weka      WEKA agent-trace JSONL, a session per line (no published description was found;
            fields from the dataset viewer): id (session), block_size, hash_id_scope, requests
            [t (s from the session start), in, out, hash_ids, api_time (s), think_time (s)].
            Sessions all start at 0; local hash ids are made session-unique.
            Not mapped: models, type.
  copilot   GitHub Copilot coding-agent JSONL or .jsonl.gz (AzurePublicDataset 2026), a session
            per line: every LLM call (timestamp, duration_ms, model, tokens.prompt,
            tokens.completion; result UserCancel = cancelled at duration_ms) chained in its session.
            Not mapped: tokens.cached, tokens.cached_pct, tokens.total, message_metadata,
            initiator_type, message_id, turn_id, status_code, date, tool_batches (their time is
            in the think time).";

/// `llmreplay import`.
#[derive(Args, Debug)]
pub struct ImportArgs {
    /// Source files (one format each; several are concatenated into one trace).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output trace file (Parquet).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Source format: azure, baseten, burstgpt, copilot, dynamo, mooncake, qwen, sharegpt, weka, or auto (detected from the content).
    #[arg(long, default_value = "auto")]
    pub format: Format,
    /// Tokenizer that counts ShareGPT text: cl100k_base, o200k_base, words, or a tokenizer.json path.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// ShareGPT (no timestamps): gamma arrivals at this rate, req/s (inf = all at once).
    #[arg(long, value_parser = parse_rate, default_value = "inf")]
    pub request_rate: f64,
    /// ShareGPT: gamma shape of inter-arrivals (1 = Poisson).
    #[arg(long, default_value_t = 1.0, value_parser = crate::flags::parse_positive)]
    pub burstiness: f64,
    /// ShareGPT: seed of the arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Model name written on every row (default: the source's, where it has one).
    #[arg(long)]
    pub model: Option<String>,
    /// Keep only the first N rows of each input (for samples); the file metadata says so.
    #[arg(long, value_name = "N", value_parser = crate::flags::parse_count)]
    pub head: Option<usize>,
}

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// Mooncake JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.
    Mooncake,
    /// AIPerf's `mooncake_trace` with sessions: Mooncake's fields plus `session_id` and `delay`.
    Aiperf,
}

impl std::str::FromStr for ExportFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mooncake" => Ok(ExportFormat::Mooncake),
            "aiperf" => Ok(ExportFormat::Aiperf),
            _ => Err(format!(
                "unknown export format {s:?} (expected mooncake or aiperf)"
            )),
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
    /// Output format: mooncake (what AIPerf's --custom-dataset-type mooncake_trace and SGLang's bench_serving read), or aiperf (the same with AIPerf's session_id and delay, ms after the previous turn, so agent sessions move both ways).
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
        crate::exit::refuse!("--head must be at least 1");
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
        for note in &s.notes {
            eprintln!("  note: {note}");
        }
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
    let (flavor, name) = match a.format {
        ExportFormat::Mooncake => (import::Flavor::Mooncake, "mooncake JSONL"),
        ExportFormat::Aiperf => (
            import::Flavor::AiperfSessions,
            "AIPerf mooncake_trace JSONL",
        ),
    };
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
    let e = import::export_stream(stream.records(), &a.output, flavor)
        .with_context(|| format!("exporting to {}", a.output.display()))?;
    eprintln!(
        "{} requests written to {} ({name})",
        e.written,
        a.output.display()
    );
    if flavor == import::Flavor::AiperfSessions {
        eprintln!(
            "{} of them in sessions (session_id, delay = think time)",
            e.with_sessions
        );
    }
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
