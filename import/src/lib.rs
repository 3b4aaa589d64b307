//! Importers of public trace formats, and export to Mooncake JSONL.
//!
//! | format | file | time | lengths | prefix structure |
//! |---|---|---|---|---|
//! | [`azure`] | Azure LLM inference 2023/2024 CSV; 2025 multimodal (`NumImages`) | `TIMESTAMP` absolute, UTC | `ContextTokens`, `GeneratedTokens` | none |
//! | [`baseten`] | Baseten Parquet (AIPerf's loader's columns) | `timestamp_start_unix_ms`, `duration_ttft_ms`, `duration_e2e_ms`, `request_canceled` | `input_tokens`, `output_tokens`, the `prompt` | sessions; `total_hashes` of `block_size` |
//! | [`copilot`] | GitHub Copilot coding-agent JSONL (2026) | ISO `timestamp` (the call's end), `duration_ms` | `tokens.prompt`, `tokens.completion` | sessions of LLM calls, `UserCancel` |
//! | [`dynamo`] | NVIDIA Dynamo `dynamo.request.trace.v1` / `dynamo.agent.trace.v1` JSONL | `request_received_ms`, `ttft_ms`, `total_time_ms` | `input_tokens` (else `replay.input_length`), `output_tokens` | sessions, trajectories, sub-agents and joins; sequence hashes |
//! | [`burstgpt`] | BurstGPT CSV | `Timestamp` s from day start | `Request tokens`, `Response tokens` (0 = failed) | v3 `Session ID` |
//! | [`mooncake`] | Mooncake JSONL (and AIPerf's `mooncake_trace`) | `timestamp` ms from trace start | `input_length`, `output_length` | `hash_ids`, 512-token blocks; AIPerf's `session_id`, `delay` |
//! | [`otel`] | OpenTelemetry GenAI spans, OTLP/JSON lines (a collector's file exporter; llmreplay's `--otlp-endpoint`) | `startTimeUnixNano`, `endTimeUnixNano`, `gen_ai.response.time_to_first_chunk` | `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens` | none |
//! | [`qwen`] | Qwen Bailian JSONL | `timestamp` s (float) | `input_length`, `output_length` | `hash_ids`, 16-token blocks; `chat_id`/`parent_chat_id` |
//! | [`sharegpt`] | ShareGPT JSON | none: gamma arrivals | text, counted by a tokenizer | none |
//! | [`swissai`] | SwissAI serving trace JSONL (OSDI '26) | `created_at`, `finished_at` ISO | `reported_token_input`, `reported_token_output` (-1 = unknown) | `bucket_ids`, 16-token blocks (chained) |
//! | [`weka`] | WEKA / SemiAnalysis agent traces | `t` s from session start (a sub-agent's from its spawn), `api_time`, `ttft` | `in`, `out` | sessions, sub-agents and joins; `hash_ids`, 64-token blocks |
//!
//! Every row of the source becomes one row of the trace, so row counts and token sums equal
//! the source's; a row that cannot be read is an error naming the file and its 1-based line
//! ([`Error::BadRow`]), and nothing is skipped silently or guessed. A row the publisher left
//! incomplete (a count, a duration, a session missing) is imported with what it has, the rest
//! unknown and counted per field ([`SourceStats::unknown`]). (ShareGPT conversations
//! without a first human→gpt exchange are the one exception: they hold no request; they are
//! counted in [`SourceStats::skipped`] and reported.)
//!
//! Rows go on as they are read ([`import_to`]): a row at a time for the CSV and Parquet
//! formats, SwissAI's JSON lines and OTLP/JSON lines, a session line at a time for WEKA and Copilot; Dynamo, Qwen, Mooncake and ShareGPT
//! files are read whole first (their rows are linked across the file).
//!
//! Times relative to a trace start (BurstGPT, Mooncake, Qwen) are placed at the Unix epoch
//! (1970-01-01T00:00:00Z) plus the offset, so offsets survive exactly; Azure's absolute times
//! are kept. Sources record neither streaming nor endpoint: imported rows are marked
//! `stream = true` (so a replay measures TTFT) with endpoint `/v1/completions`, or
//! `/v1/chat/completions` for chat sources (BurstGPT conversation logs, Qwen, ShareGPT).
//! Token counts carry `prompt_tokens_source = output_tokens_source = recorded` (ShareGPT:
//! `tokenizer`).
//!
//! The line-based importers share one per-row skeleton (`rows`): read a line, decode it
//! (a CSV record under its header, or a JSON object), map the format's fields, build the
//! record; a row that cannot be read is an error naming its file and line.
#![deny(missing_docs)]

pub mod azure;
pub mod baseten;
pub mod burstgpt;
pub mod copilot;
pub mod dynamo;
mod link;
pub mod mooncake;
pub mod otel;
mod out;
pub mod qwen;
mod rows;
pub mod sharegpt;
pub mod swissai;
pub mod weka;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use tokenize::Tokenizer;
use trace_format::{Error, FileMeta, Producer, Result, TraceRecord};

use crate::out::{Out, Selecting};
use crate::rows::split_csv_line;

pub use out::Select;

pub use mooncake::{
    export_mooncake, export_mooncake_lines, export_mooncake_stream, export_stream, Flavor,
    MooncakeExport, SKIPPED_KEPT,
};

/// A source format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Azure LLM inference trace CSV (2023 and 2024).
    Azure,
    /// BurstGPT CSV (v1 and v3 with sessions).
    BurstGpt,
    /// Mooncake JSONL.
    Mooncake,
    /// Qwen Bailian JSONL.
    Qwen,
    /// ShareGPT JSON.
    ShareGpt,
    /// NVIDIA Dynamo agent trace JSONL (`dynamo.agent.trace.v1`).
    Dynamo,
    /// Baseten Parquet traces.
    Baseten,
    /// WEKA agent-trace JSONL.
    Weka,
    /// GitHub Copilot coding-agent JSONL (AzurePublicDataset 2026).
    Copilot,
    /// SwissAI serving trace JSONL (OSDI '26).
    SwissAi,
    /// OpenTelemetry GenAI spans, OTLP/JSON lines.
    Otel,
    /// Detect from the content ([`detect`]).
    Auto,
}

impl Format {
    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Azure => "azure",
            Format::BurstGpt => "burstgpt",
            Format::Mooncake => "mooncake",
            Format::Qwen => "qwen",
            Format::ShareGpt => "sharegpt",
            Format::Dynamo => "dynamo",
            Format::Baseten => "baseten",
            Format::Weka => "weka",
            Format::Copilot => "copilot",
            Format::SwissAi => "swissai",
            Format::Otel => "otel",
            Format::Auto => "auto",
        }
    }

    /// Block size of the source's hash ids, in tokens, when the format fixes it (Dynamo and
    /// WEKA files say theirs: [`SourceStats::block_size`]).
    pub fn block_size(self) -> Option<u32> {
        match self {
            Format::Mooncake => Some(mooncake::BLOCK_SIZE),
            Format::Qwen => Some(qwen::BLOCK_SIZE),
            Format::SwissAi => Some(swissai::BLOCK_SIZE),
            _ => None,
        }
    }
}

/// The import formats, as the command line names them.
pub const FORMATS: &str =
    "azure, baseten, burstgpt, copilot, dynamo, mooncake, otel, qwen, sharegpt, swissai, weka";

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "azure" => Ok(Format::Azure),
            "burstgpt" => Ok(Format::BurstGpt),
            "mooncake" => Ok(Format::Mooncake),
            "qwen" | "bailian" => Ok(Format::Qwen),
            "sharegpt" => Ok(Format::ShareGpt),
            "dynamo" => Ok(Format::Dynamo),
            "baseten" => Ok(Format::Baseten),
            "weka" => Ok(Format::Weka),
            "copilot" => Ok(Format::Copilot),
            "swissai" => Ok(Format::SwissAi),
            "otel" | "otlp" => Ok(Format::Otel),
            "auto" => Ok(Format::Auto),
            _ => Err(format!(
                "unknown import format {s:?} (expected {} or auto)",
                FORMATS
            )),
        }
    }
}

/// How to import.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// The source format (or [`Format::Auto`]).
    pub format: Format,
    /// ShareGPT: the tokenizer that counts prompt and output tokens (required there).
    pub tokenizer: Option<Arc<Tokenizer>>,
    /// ShareGPT: requests per second of the gamma arrival process (infinite = all at once).
    pub request_rate: f64,
    /// ShareGPT: gamma shape (1 = Poisson).
    pub burstiness: f64,
    /// ShareGPT: seed of the arrival process.
    pub seed: u64,
    /// Model name written on every row (default: the source's, where it has one).
    pub model: Option<String>,
    /// Which rows to keep: `--limit`, `--head`, a time window.
    pub select: Select,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            format: Format::Auto,
            tokenizer: None,
            request_rate: 1.0,
            burstiness: 1.0,
            seed: 0,
            model: None,
            select: Select::default(),
        }
    }
}

/// What one source file held.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceStats {
    /// The file.
    pub path: PathBuf,
    /// Its format (never `Auto`).
    pub format: Format,
    /// Rows (requests) imported.
    pub rows: usize,
    /// Σ prompt tokens (of the rows that have them).
    pub prompt_tokens: i64,
    /// Σ output tokens (of the rows that have them).
    pub output_tokens: i64,
    /// Rows imported as failures (BurstGPT: 0 response tokens).
    pub failures: usize,
    /// Rows imported as cancelled by their client (Baseten, Copilot), replayed as cancels.
    pub cancelled: usize,
    /// Earliest arrival, µs since the epoch.
    pub first_arrival_us: Option<i64>,
    /// Latest arrival, µs since the epoch.
    pub last_arrival_us: Option<i64>,
    /// Source entries that hold no request, with why (ShareGPT only).
    pub skipped: Vec<String>,
    /// Block size of the rows' `prefix_hashes`, in tokens (the format's, or the file's own).
    pub block_size: Option<u32>,
    /// What the source held that did not become rows or columns (tool spans, unread
    /// columns), one line each.
    pub notes: Vec<String>,
    /// Fields the source left out of rows that were imported without them (their values
    /// unknown, null in the trace): field → rows.
    pub unknown: BTreeMap<String, usize>,
    /// Rows read but outside the time window (`--start-offset`, `--duration`).
    pub outside_window: usize,
}

impl SourceStats {
    fn new(path: &Path, format: Format) -> Self {
        SourceStats {
            path: path.to_path_buf(),
            format,
            rows: 0,
            prompt_tokens: 0,
            output_tokens: 0,
            failures: 0,
            cancelled: 0,
            first_arrival_us: None,
            last_arrival_us: None,
            skipped: Vec::new(),
            block_size: format.block_size(),
            notes: Vec::new(),
            unknown: BTreeMap::new(),
            outside_window: 0,
        }
    }

    /// Span from the first to the last arrival, µs.
    pub fn span_us(&self) -> i64 {
        match (self.first_arrival_us, self.last_arrival_us) {
            (Some(a), Some(b)) => b - a,
            _ => 0,
        }
    }

    /// The lines to say after [`Display`](fmt::Display)'s: notes, fields left unknown, rows
    /// outside the window.
    pub fn details(&self) -> Vec<String> {
        let mut out: Vec<String> = self.notes.iter().map(|n| format!("note: {n}")).collect();
        for (field, n) in &self.unknown {
            out.push(format!(
                "note: {n} rows without {field}: imported with it unknown (null)"
            ));
        }
        if self.outside_window > 0 {
            out.push(format!(
                "note: {} rows outside the time window left out",
                self.outside_window
            ));
        }
        out
    }
}

impl fmt::Display for SourceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {} rows, {} prompt + {} output tokens, span {:.3} s",
            self.path.display(),
            self.format,
            self.rows,
            self.prompt_tokens,
            self.output_tokens,
            self.span_us() as f64 / 1e6
        )?;
        if self.failures > 0 {
            write!(f, ", {} failed", self.failures)?;
        }
        if self.cancelled > 0 {
            write!(f, ", {} cancelled by the client", self.cancelled)?;
        }
        if !self.skipped.is_empty() {
            write!(
                f,
                ", {} entries without a request skipped",
                self.skipped.len()
            )?;
        }
        Ok(())
    }
}

/// What an import wrote: the file metadata to close the output with, and per-source
/// statistics.
#[derive(Debug, Clone)]
pub struct ImportSummary {
    /// Producer `import`, the source files and formats, the block size of `prefix_hashes`.
    pub meta: FileMeta,
    /// Per source file.
    pub sources: Vec<SourceStats>,
}

/// An import held in memory ([`import`]): its rows, in source order, file after file, and
/// what [`import_to`] says of it.
#[derive(Debug, Clone)]
pub struct Imported {
    /// One row per source request.
    pub records: Vec<TraceRecord>,
    /// Producer `import`, the source files and formats, the block size of `prefix_hashes`.
    pub meta: FileMeta,
    /// Per source file.
    pub sources: Vec<SourceStats>,
}

/// [`import_to`] into memory, for tests and samples (a whole trace's rows are held).
pub fn import(paths: &[PathBuf], opts: &ImportOptions, command: &str) -> Result<Imported> {
    let mut records = Vec::new();
    let s = import_to(paths, opts, command, &mut |r| {
        records.push(r);
        Ok(())
    })?;
    Ok(Imported {
        records,
        meta: s.meta,
        sources: s.sources,
    })
}

/// Detects the format of `path` from its content: Parquet by its columns (Baseten's;
/// llmreplay's own are refused: such a file is already a trace); a CSV header with
/// `ContextTokens` (Azure) or `Request tokens` (BurstGPT); a JSON line with a Dynamo schema,
/// a WEKA session (`requests` and `block_size`), a Copilot session (`turns`, `llm_calls`), a
/// SwissAI request (`created_at`, `finished_at`, `reported_token_input`), OTLP/JSON spans
/// (`resourceSpans`),
/// `chat_id` (Qwen) or `hash_ids` / `input_length` (Mooncake); a JSON array (ShareGPT).
pub fn detect(path: &Path) -> Result<Format> {
    let mut magic = Vec::new();
    std::fs::File::open(path)
        .map_err(|e| Error::io(path, e))?
        .take(4)
        .read_to_end(&mut magic)
        .map_err(|e| Error::io(path, e))?;
    if magic == b"PAR1" {
        return baseten::detect(path);
    }
    let mut head = Vec::new();
    rows::open_text(path)?
        .take(64 * 1024)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, e))?;
    let text = String::from_utf8_lossy(&head);
    let text = text.trim_start_matches('\u{feff}').trim_start();
    let first_line = text.lines().next().unwrap_or("");
    let unknown = |why: &str| {
        Error::Invalid(format!(
            "{}: cannot detect the format ({why}); give --format ({FORMATS})",
            path.display()
        ))
    };
    if text.starts_with('[') {
        return Ok(Format::ShareGpt);
    }
    if first_line.starts_with('{') {
        if dynamo::SCHEMAS.iter().any(|s| first_line.contains(s)) {
            return Ok(Format::Dynamo);
        }
        if first_line.contains("\"resourceSpans\"") {
            return Ok(Format::Otel);
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(first_line) else {
            // A session per line can outgrow the head read: known keys decide.
            return if first_line.contains("\"llm_calls\"") {
                Ok(Format::Copilot)
            } else if first_line.contains("\"requests\"") && first_line.contains("\"block_size\"") {
                Ok(Format::Weka)
            } else {
                Err(unknown("the first line is not a JSON object"))
            };
        };
        return if v.get("turns").is_some() && v.get("session_id").is_some() {
            Ok(Format::Copilot)
        } else if v.get("requests").is_some() && v.get("block_size").is_some() {
            Ok(Format::Weka)
        } else if swissai::KEYS.iter().all(|k| v.get(k).is_some()) {
            Ok(Format::SwissAi)
        } else if v.get("chat_id").is_some() {
            Ok(Format::Qwen)
        } else if v.get("input_length").is_some() || v.get("hash_ids").is_some() {
            Ok(Format::Mooncake)
        } else if v.get("conversations").is_some() {
            Ok(Format::ShareGpt)
        } else {
            Err(unknown(
                "a JSON line without input_length, hash_ids or chat_id",
            ))
        };
    }
    let header: Vec<String> = split_csv_line(first_line)
        .unwrap_or_default()
        .iter()
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    if header.iter().any(|h| h == "contexttokens") {
        Ok(Format::Azure)
    } else if header.iter().any(|h| h == "request tokens") {
        Ok(Format::BurstGpt)
    } else {
        Err(unknown("neither a known CSV header nor JSON"))
    }
}

/// Reads one local file (format detected when `opts.format` is `Auto`) into `out`.
/// `id_prefix` starts each request id (`<id_prefix>:<line>`).
fn import_source(path: &Path, opts: &ImportOptions, id_prefix: &str, out: &mut Out) -> Result<()> {
    match out.stats.format {
        Format::Azure => azure::import(path, id_prefix, out),
        Format::BurstGpt => burstgpt::import(path, id_prefix, out),
        Format::Mooncake => mooncake::import(path, id_prefix, out),
        Format::Qwen => qwen::import(path, id_prefix, out),
        Format::Copilot => copilot::import(path, id_prefix, out),
        Format::Dynamo => dynamo::import(path, id_prefix, out),
        Format::Weka => weka::import(path, id_prefix, out),
        Format::Baseten => baseten::import(path, id_prefix, out),
        Format::SwissAi => swissai::import(path, id_prefix, out),
        Format::Otel => otel::import(path, id_prefix, out),
        Format::ShareGpt => sharegpt::import(path, id_prefix, opts, out),
        Format::Auto => unreachable!("resolved before"),
    }
}

/// Imports one file (format detected when `opts.format` is `Auto`) into memory: its rows and
/// statistics. `id_prefix` starts each request id (`<id_prefix>:<line>`). For samples and
/// tests; [`import_to`] writes as it reads.
pub fn import_file(
    path: &Path,
    opts: &ImportOptions,
    id_prefix: &str,
) -> Result<(Vec<TraceRecord>, SourceStats)> {
    let mut rows = Vec::new();
    let mut selecting = Selecting::new(opts.select.clone());
    let stats = import_one(path, opts, id_prefix, &mut selecting, &mut |r| {
        rows.push(r);
        Ok(())
    })?;
    Ok((rows, stats))
}

/// The rows of `path` read as `format` (for the importers' tests).
#[cfg(test)]
pub(crate) fn read_as(format: Format, path: &Path, prefix: &str) -> Result<Vec<TraceRecord>> {
    let opts = ImportOptions {
        format,
        ..Default::default()
    };
    import_file(path, &opts, prefix).map(|(r, _)| r)
}

/// One input: detected, read (an object named by URL downloaded first) and its rows passed to
/// `write` as they are read.
fn import_one(
    path: &Path,
    opts: &ImportOptions,
    id_prefix: &str,
    selecting: &mut Selecting,
    write: &mut dyn FnMut(TraceRecord) -> Result<()>,
) -> Result<SourceStats> {
    if let Some(url) = path.to_str().filter(|s| store::is_url(s)) {
        return import_url(url, opts, id_prefix, selecting, write);
    }
    let format = match opts.format {
        Format::Auto => detect(path)?,
        f => f,
    };
    let mut stats = SourceStats::new(path, format);
    let mut out = Out::new(&mut stats, selecting, opts.model.as_deref(), write);
    import_source(path, opts, id_prefix, &mut out)?;
    Ok(stats)
}

/// Imports one object named by URL (`s3://`, `gs://`, `az://`, `https://`, … as
/// the `store` crate reads them): streamed into a private temporary file under its own name,
/// imported from there, and removed; the source is recorded as the URL.
fn import_url(
    url: &str,
    opts: &ImportOptions,
    id_prefix: &str,
    selecting: &mut Selecting,
    write: &mut dyn FnMut(TraceRecord) -> Result<()>,
) -> Result<SourceStats> {
    /// Removes the temporary directory however the import ends.
    struct TempDir(PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let loc = store::ObjectLocation::parse(url)?;
    let name = Path::new(url)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "input".into());
    let dir = TempDir(std::env::temp_dir().join(format!(
        "llmreplay-import-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )));
    std::fs::create_dir_all(&dir.0).map_err(|e| Error::io(&dir.0, e))?;
    let local = dir.0.join(&name);
    loc.download(&local)?;
    let mut stats = import_one(&local, opts, id_prefix, selecting, write).map_err(|e| {
        // Messages name the URL, not the temporary copy.
        Error::Invalid(e.to_string().replace(&local.display().to_string(), url))
    })?;
    stats.path = PathBuf::from(url);
    Ok(stats)
}

/// Imports every file of `paths` into one trace, each row passed to `write` as it is read
/// (rows in source order, file after file; memory bounded by what one row, one session line,
/// or, for the formats linked across a file, one file holds). Request ids are
/// `<file stem>:<line>` (with the input's index in front when two inputs share a stem), unique
/// across the import. Sources with hash ids of different block sizes cannot share a trace
/// (one block size per file): that is an error. Returns the metadata to close the output
/// with and per-source statistics.
pub fn import_to(
    paths: &[PathBuf],
    opts: &ImportOptions,
    command: &str,
    write: &mut dyn FnMut(TraceRecord) -> Result<()>,
) -> Result<ImportSummary> {
    if paths.is_empty() {
        return Err(Error::Invalid("import: no input files".into()));
    }
    let stems: Vec<String> = paths
        .iter()
        .map(|p| {
            p.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "input".into())
        })
        .collect();
    let mut distinct = HashSet::new();
    let clash = !stems.iter().all(|s| distinct.insert(s.clone()));
    let mut sources: Vec<SourceStats> = Vec::new();
    let mut block_size: Option<(u32, PathBuf)> = None;
    let mut selecting = Selecting::new(opts.select.clone());
    for (i, path) in paths.iter().enumerate() {
        if selecting.full() {
            break;
        }
        let prefix = if clash {
            format!("{i}-{}", stems[i])
        } else {
            stems[i].clone()
        };
        let mut hashed = false;
        let stats = import_one(path, opts, &prefix, &mut selecting, &mut |r| {
            hashed |= r.prefix_hashes.is_some();
            write(r)
        })?;
        if hashed {
            if let Some(b) = stats.block_size {
                match &block_size {
                    Some((prev, prev_path)) if *prev != b => {
                        return Err(Error::Invalid(format!(
                            "{}: hash ids of {b}-token blocks cannot share a trace with {} ({prev}-token blocks); import them separately",
                            path.display(),
                            prev_path.display()
                        )))
                    }
                    _ => block_size = Some((b, path.clone())),
                }
            }
        }
        sources.push(stats);
    }
    let mut meta = FileMeta::new(Producer::Import, command);
    meta.source = Some(
        sources
            .iter()
            .map(|s| format!("{}:{}", s.format, s.path.display()))
            .collect::<Vec<_>>()
            .join(","),
    );
    meta.block_size = block_size.map(|(b, _)| b);
    if let Some(t) = &opts.tokenizer {
        if sources.iter().any(|s| s.format == Format::ShareGpt) {
            meta.extra.insert("tokenizer".into(), t.name().to_string());
        }
    }
    let s = &opts.select;
    for (key, v) in [
        ("limit", s.limit),
        ("head", s.per_file_limit),
        (
            "start_offset_us",
            (s.start_offset_us > 0).then_some(s.start_offset_us as u64),
        ),
        ("duration_us", s.duration_us.map(|d| d as u64)),
    ] {
        if let Some(v) = v {
            meta.extra.insert(key.into(), v.to_string());
        }
    }
    Ok(ImportSummary { meta, sources })
}

/// Where tests find `../shared/data` (the public trace samples): `$LLMREPLAY_SHARED_DATA`, else
/// the first `shared/data` directory holding `file` in an ancestor of this crate. `None`
/// with a loud message when absent.
#[doc(hidden)]
pub fn test_shared_data(file: &str) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("LLMREPLAY_SHARED_DATA") {
        let p = PathBuf::from(dir).join(file);
        if p.exists() {
            return Some(p);
        }
    }
    for dir in Path::new(env!("CARGO_MANIFEST_DIR")).ancestors() {
        let p = dir.join("shared").join("data").join(file);
        if p.exists() {
            return Some(p);
        }
    }
    eprintln!(
        "\n*** SKIPPED: shared sample {file} not found (set LLMREPLAY_SHARED_DATA or check out ../shared/data) ***\n"
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_detect() {
        assert_eq!("qwen".parse::<Format>().unwrap(), Format::Qwen);
        assert!("csv".parse::<Format>().is_err());
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", Format::Azure),
            ("b.csv", "\u{feff}Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n", Format::BurstGpt),
            ("c.jsonl", "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n", Format::Mooncake),
            ("d.jsonl", "{\"chat_id\": 1, \"parent_chat_id\": -1, \"timestamp\": 0.5}\n", Format::Qwen),
            ("e.json", "  [{\"id\": \"x\", \"conversations\": []}]", Format::ShareGpt),
            ("f.jsonl", "{\"schema\": \"dynamo.agent.trace.v1\", \"event_type\": \"tool_end\"}\n", Format::Dynamo),
            ("g.jsonl", "{\"session_id\": \"s\", \"date\": \"2026-06-01\", \"turns\": []}\n", Format::Copilot),
            ("h.jsonl", "{\"id\": \"a\", \"block_size\": 64, \"hash_id_scope\": \"local\", \"requests\": []}\n", Format::Weka),
            ("l.jsonl", "{\"resourceSpans\": [{\"scopeSpans\": [{\"spans\": []}]}]}\n", Format::Otel),
            ("k.jsonl", "{\"id\": \"a\", \"status\": \"DEFAULT\", \"created_at\": \"2025-08-21T14:34:25.590Z\", \"finished_at\": \"2025-08-21T14:34:26.945Z\", \"reported_token_input\": -1}\n", Format::SwissAi),
            ("j.jsonl", "{\"timestamp\": 1, \"event\": {\"schema\": \"dynamo.request.trace.v1\", \"event_type\": \"request_end\"}}\n", Format::Dynamo),
        ];
        for (name, content, want) in cases {
            let p = dir.path().join(name);
            std::fs::write(&p, content).unwrap();
            assert_eq!(detect(&p).unwrap(), want, "{name}");
        }
        // A session per line longer than the head read is still recognised by its keys.
        let long = format!(
            "{{\"session_id\": \"s\", \"turns\": [{{\"llm_calls\": [{}]}}]}}\n",
            vec!["{\"duration_ms\": 1.0}"; 8000].join(", ")
        );
        let p = dir.path().join("long.jsonl");
        std::fs::write(&p, long).unwrap();
        assert_eq!(detect(&p).unwrap(), Format::Copilot);
        let p = dir.path().join("x.txt");
        std::fs::write(&p, "hello,world\n").unwrap();
        assert!(detect(&p).unwrap_err().to_string().contains("--format"));
        // Parquet by its columns: Baseten's; a file that is only Parquet's magic is named.
        let p = dir.path().join("i.parquet");
        baseten::tests::write_sample(&p, &[(0, Some(1), 1, None, Some(1), 0, None, 1)]);
        assert_eq!(detect(&p).unwrap(), Format::Baseten);
        std::fs::write(&p, "PAR1").unwrap();
        assert!(detect(&p).unwrap_err().to_string().contains("i.parquet"));
        // The real WEKA sessions (one JSON document per file) are recognised.
        for f in ["weka/trace_0297.json", "weka/trace_0274.json"] {
            if let Some(p) = test_shared_data(&format!("real-formats/{f}")) {
                assert_eq!(detect(&p).unwrap(), Format::Weka, "{f}");
            }
        }
    }
}
