//! `llmreplay import` (public trace formats → our Parquet trace) and `llmreplay export` (our
//! trace → Mooncake JSONL for NVIDIA AIPerf and SGLang's bench_serving, or AIPerf's sessions):
//! flags and wiring; the work is in the `import` crate.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use import::{self, Format, ImportOptions};
use tokenize::Tokenizer;

use crate::flags::{parse_duration, parse_rate};

/// What each import format maps and what it cannot (printed by `llmreplay import --help`).
pub const IMPORT_HELP: &str = "\
Formats (what becomes which column; what has no column and is not mapped):
  azure     Azure LLM inference 2023/2024 CSV: TIMESTAMP, ContextTokens, GeneratedTokens; the
            2025 multimodal trace's NumImages too (chat rows with their image count; a replay
            sends the text tokens, images are not synthesized).
  burstgpt  BurstGPT CSV: Timestamp, Request/Response tokens (0 = failed), v3 Session ID.
            Not mapped: Model, Log Type (the endpoint is chat for conversation logs).
  mooncake  Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token
            blocks); AIPerf's session_id and delay (ms after the previous turn) link sessions.
            Not mapped: text_input, messages.
  qwen      Qwen Bailian JSONL (usage, coder and thinking traces): chat_id/parent_chat_id
            (sessions and parents), timestamp (s), input_length, output_length, hash_ids
            (16-token blocks). Not mapped: type, turn.
  sharegpt  ShareGPT JSON: the first human->gpt exchange, counted by --tokenizer; arrivals drawn.
  dynamo    NVIDIA Dynamo request traces (dynamo.request.trace.v1, and the first releases'
            dynamo.agent.trace.v1), JSONL or .jsonl.gz, bare or in the sink's envelope:
            request_end events are requests (trajectory_id, else session_id, chained turn after
            turn; a subagent (parent_trajectory_id, else parent_session_id) linked to the parent
            request that had ended, and the parent's next request waiting on a finished
            subagent's last request to end; request_received_ms, ttft_ms, total_time_ms (else
            the event time minus request_received_ms), input_tokens (else
            replay.input_length), output_tokens, model, replay.input_sequence_hashes with their
            trace_block_size); a complete request_payload gives its request's body. Tool spans
            (tool_start, tool_end, tool_error) are not requests: their time is in the next
            turn's think time. Not mapped: cached_tokens, session_type_id, session_final,
            trajectory_final, request_id, x_request_id, prefill_wait_time_ms,
            prefill_time_ms, avg_itl_ms, kv_hit_rate, kv_transfer_estimated_latency_ms,
            queue_depth, worker, kv_hints, finish_reason_metadata, payload responses and
            headers, the tool spans' fields. A dropped stream is not marked, so none imports as
            cancelled.
  baseten   Baseten trace Parquet, the columns AIPerf's Baseten loader reads:
            timestamp_start_unix_ms, prompt (a /v1/completions body, replayed as recorded),
            input_tokens, output_tokens, duration_ttft_ms, duration_e2e_ms, request_canceled
            (replayed as a cancel at duration_e2e_ms), model_name, total_hashes with block_size,
            provided_session_id or poor_man_session_id (chosen as AIPerf does), each session's
            rows chained with the think time AIPerf replays. Not mapped:
            cached_tokens_reference, org_id, features, speculation_ratio, output_text,
            __version__, total_hashes_len, any other column (listed on import).
  weka      WEKA / SemiAnalysis agent traces (kv-cache-tester's docs/trace_replay_tester.md), a
            session per JSON line or file: id (session), block_size, hash_id_scope, requests
            [t (s from the session start), type (s streamed, n not), in, out, hash_ids,
            api_time (s), ttft (s), think_time (s)], and subagent entries with their own
            requests (t from the spawn; nested): a subagent's first call linked to the parent
            call that had ended, the parent's next call waiting on a finished subagent (none
            for async_launched). Sessions all start at 0; local hash ids are made
            session-unique. Not mapped: models, tool_tokens, system_tokens, input_types,
            output_types, stop, totals, a subagent's subagent_type, duration_ms, counts.
  copilot   GitHub Copilot coding-agent JSONL or .jsonl.gz (AzurePublicDataset 2026), a session
            per line: every LLM call (timestamp = the call's end, so arrival = timestamp -
            duration_ms; model, tokens.prompt, tokens.completion; result UserCancel = cancelled
            at duration_ms) chained in its session. Not mapped: tokens.cached,
            tokens.cached_pct, tokens.total, message_metadata, initiator_type, message_id,
            turn_id, status_code, date, tool_batches (their time is in the think time).
  otel      OpenTelemetry GenAI spans, OTLP/JSON lines (a collector's file exporter; what
            --otlp-endpoint exports imports back to the same rows): spans with an inference
            gen_ai.operation.name are requests (start and end times, gen_ai.request.model,
            max_tokens, usage tokens, time_to_first_chunk, http.response.status_code, status
            and error.type, trace and span ids; llmreplay's own request_id, endpoint, outcome,
            stream, run_id, target, dispatch lag and chunk events). Other spans are counted.
            Not mapped: resource and scope attributes, server.address/port, links.
  swissai   SwissAI serving trace JSONL (eth-easl/swissai-serving-trace, OSDI '26; trace.jsonl
            and the *-buckets.jsonl files): created_at (arrival), finished_at (end), model,
            reported_token_input and reported_token_output (-1 = unknown), status (DEFAULT ok,
            else a recorded failure), bucket_ids as chained 16-token prefix hashes. Not mapped:
            id, model_parameters, token_count.

Rows the source left incomplete (a count, a duration, a session missing) import with what
they have, the unknowns counted per field; a malformed value is an error naming the file,
line (row for Parquet) and field. A Parquet file with llmreplay's own columns is a trace
already: inspect and replay read it as it is.";

/// `llmreplay import`.
#[derive(Args, Debug)]
pub struct ImportArgs {
    /// Source files (one format each; several are concatenated into one trace).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output trace file (Parquet).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Source format: azure, baseten, burstgpt, copilot, dynamo, mooncake, otel, qwen, sharegpt, swissai, weka, or auto (detected from the content).
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
    /// Keep only the first N rows of the whole import (read stops there).
    #[arg(long, value_name = "N", value_parser = crate::flags::parse_count)]
    pub limit: Option<usize>,
    /// Skip the rows arriving earlier than this after the first row read (e.g. 10m).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub start_offset: std::time::Duration,
    /// Keep only the rows arriving within this long after the start offset (e.g. 1h).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<std::time::Duration>,
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
    /// Trace files, directories, globs or object-store prefixes: several captures are one
    /// trace.
    #[arg(required = true)]
    pub traces: Vec<String>,
    #[command(flatten)]
    pub window: crate::flags::WindowFlags,
    /// Output file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Output format: mooncake (what AIPerf's --custom-dataset-type mooncake_trace and SGLang's bench_serving read), or aiperf (the same with AIPerf's session_id and delay, ms after the previous turn, so agent sessions move both ways).
    #[arg(long, default_value = "mooncake")]
    pub format: ExportFormat,
    /// Export a trace captured with `--privacy full` all the same (its lines hold no text,
    /// but Mooncake and AIPerf JSONL have no field to say where they came from; the sidecar
    /// `<output>.privacy.json` does).
    #[arg(long)]
    pub allow_full_export: bool,
}

/// The manifest sidecar of an export: `<output>.privacy.json`, beside the output.
fn sidecar_path(output: &std::path::Path) -> PathBuf {
    let mut name = output.file_name().unwrap_or_default().to_os_string();
    name.push(".privacy.json");
    output.with_file_name(name)
}

/// Runs `llmreplay import`; `command` is the command line, kept in the file's metadata. Rows
/// are written as they are read (memory bounded by one row, one session line, or one file
/// of the formats linked across a file), with progress on a terminal.
pub fn run_import(a: ImportArgs, command: &str) -> Result<()> {
    let tokenizer = match &a.tokenizer {
        Some(spec) => Some(Arc::new(
            Tokenizer::load(spec).with_context(|| format!("loading tokenizer {spec}"))?,
        )),
        None => None,
    };
    trace_format::arrivals::validate(a.request_rate, a.burstiness)?;
    let us = |d: std::time::Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    let opts = ImportOptions {
        format: a.format,
        tokenizer,
        request_rate: a.request_rate,
        burstiness: a.burstiness,
        seed: a.seed,
        model: a.model.clone(),
        select: import::Select {
            limit: a.limit.map(|n| n as u64),
            per_file_limit: a.head.map(|n| n as u64),
            start_offset_us: us(a.start_offset),
            duration_us: a.duration.map(us),
        },
    };
    let mut progress = crate::traces::RowProgress::new(&a.output);
    let written = store::write_trace_streaming(&a.output, |w| {
        let summary = import::import_to(&a.inputs, &opts, command, &mut |r| {
            progress.row();
            w.push(r)
        })?;
        let meta = summary.meta.clone();
        Ok((summary, meta))
    });
    let rows = progress.rows();
    progress.finish();
    let (summary, at) =
        written.with_context(|| format!("importing into {}", a.output.display()))?;
    for s in &summary.sources {
        eprintln!("{s}");
        for line in s.details() {
            eprintln!("  {line}");
        }
        for why in s.skipped.iter().take(5) {
            eprintln!("  skipped: {why}");
        }
        if s.skipped.len() > 5 {
            eprintln!("  ... and {} more skipped", s.skipped.len() - 5);
        }
    }
    eprintln!(
        "{rows} requests written to {at}{}",
        summary
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
    let stream =
        crate::traces::open_stream_in(&a.traces, &a.window).context("reading the trace")?;
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
    // The manifest the trace's files carry (one key: the stream refused several).
    let manifest = trace_format::file_meta::carried(stream.files().iter().map(|f| &f.meta));
    if manifest
        .as_ref()
        .is_some_and(|m| m.grade == trace_format::privacy::Grade::Full)
        && !a.allow_full_export
    {
        crate::exit::refuse!(
            "the trace was captured with --privacy full (it holds the prompts); {name} has no \
             field to say so, so it is not exported unless told: --allow-full-export (the \
             lines hold lengths and keyed hash_ids, no text; {} records the trace's manifest)",
            sidecar_path(&a.output).display()
        );
    }
    let e = import::export_stream(stream.records(), &a.output, flavor)
        .with_context(|| format!("exporting to {}", a.output.display()))?;
    if let Some(m) = &manifest {
        let side = sidecar_path(&a.output);
        let doc = serde_json::json!({
            "exported_to": a.output.file_name().map(|n| n.to_string_lossy().into_owned()),
            "format": name,
            "hash_ids": "the trace's prefix_hashes: keyed hashes under key_id",
            "manifest": m,
        });
        std::fs::write(&side, format!("{doc:#}\n"))
            .with_context(|| format!("writing {}", side.display()))?;
        eprintln!(
            "the trace's privacy manifest (grade {}, key id {}) is in {}",
            m.grade,
            m.key_id.as_deref().unwrap_or("none"),
            side.display()
        );
    }
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
    crate::traces::say_stream_captures(&stream)?;
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
