//! Importers of public trace formats, and export to Mooncake JSONL.
//!
//! | format | file | time | lengths | prefix structure |
//! |---|---|---|---|---|
//! | [`azure`] | Azure LLM inference 2023/2024 CSV | `TIMESTAMP` absolute, UTC | `ContextTokens`, `GeneratedTokens` | none |
//! | [`burstgpt`] | BurstGPT CSV | `Timestamp` s from day start | `Request tokens`, `Response tokens` (0 = failed) | v3 `Session ID` |
//! | [`mooncake`] | Mooncake JSONL | `timestamp` ms from trace start | `input_length`, `output_length` | `hash_ids`, 512-token blocks |
//! | [`qwen`] | Qwen Bailian JSONL | `timestamp` s (float) | `input_length`, `output_length` | `hash_ids`, 16-token blocks; `chat_id`/`parent_chat_id` |
//! | [`sharegpt`] | ShareGPT JSON | none: gamma arrivals | text, counted by a tokenizer | none |
//!
//! Every row of the source becomes one row of the trace, so row counts and token sums equal
//! the source's; a row that cannot be read is an error naming the file and its 1-based line
//! ([`Error::BadRow`]), and nothing is skipped silently or guessed. (ShareGPT conversations
//! without a first human→gpt exchange are the one exception: they hold no request; they are
//! counted in [`SourceStats::skipped`] and reported.)
//!
//! Times relative to a trace start (BurstGPT, Mooncake, Qwen) are placed at the Unix epoch
//! (1970-01-01T00:00:00Z) plus the offset, so offsets survive exactly; Azure's absolute times
//! are kept. Sources record neither streaming nor endpoint: imported rows are marked
//! `stream = true` (so a replay measures TTFT) with endpoint `/v1/completions`, or
//! `/v1/chat/completions` for chat sources (BurstGPT conversation logs, Qwen, ShareGPT).
//! Token counts carry `prompt_tokens_source = output_tokens_source = recorded` (ShareGPT:
//! `tokenizer`).

pub mod azure;
pub mod burstgpt;
pub mod mooncake;
pub mod qwen;
pub mod sharegpt;

use std::collections::HashSet;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::schema::{Producer, TokenSource, TraceRecord};
use crate::tokenize::Tokenizer;
use crate::writer::FileMeta;

pub use mooncake::{export_mooncake, export_mooncake_lines, MooncakeExport};

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
            Format::Auto => "auto",
        }
    }

    /// Block size of the source's hash ids, in tokens.
    pub fn block_size(self) -> Option<u32> {
        match self {
            Format::Mooncake => Some(mooncake::BLOCK_SIZE),
            Format::Qwen => Some(qwen::BLOCK_SIZE),
            _ => None,
        }
    }
}

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
            "auto" => Ok(Format::Auto),
            _ => Err(format!(
                "unknown import format {s:?} (expected azure, burstgpt, mooncake, qwen, sharegpt or auto)"
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
    /// Σ prompt tokens.
    pub prompt_tokens: i64,
    /// Σ output tokens.
    pub output_tokens: i64,
    /// Rows imported as failures (BurstGPT: 0 response tokens).
    pub failures: usize,
    /// Earliest arrival, µs since the epoch.
    pub first_arrival_us: Option<i64>,
    /// Latest arrival, µs since the epoch.
    pub last_arrival_us: Option<i64>,
    /// Source entries that hold no request, with why (ShareGPT only).
    pub skipped: Vec<String>,
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
            first_arrival_us: None,
            last_arrival_us: None,
            skipped: Vec::new(),
        }
    }

    /// Span from the first to the last arrival, µs.
    pub fn span_us(&self) -> i64 {
        match (self.first_arrival_us, self.last_arrival_us) {
            (Some(a), Some(b)) => b - a,
            _ => 0,
        }
    }

    fn account(&mut self, records: &[TraceRecord]) {
        self.rows = records.len();
        self.prompt_tokens = records.iter().filter_map(|r| r.prompt_tokens).sum();
        self.output_tokens = records.iter().filter_map(|r| r.output_tokens).sum();
        self.failures = records
            .iter()
            .filter(|r| r.outcome != crate::Outcome::Ok)
            .count();
        self.first_arrival_us = records.iter().map(|r| r.arrival_time_us).min();
        self.last_arrival_us = records.iter().map(|r| r.arrival_time_us).max();
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

/// The result of an import: rows (in source order, file after file), the file metadata to
/// write with them, and per-source statistics.
#[derive(Debug, Clone)]
pub struct Imported {
    /// One row per source request.
    pub records: Vec<TraceRecord>,
    /// Producer `import`, the source files and formats, the block size of `prefix_hashes`.
    pub meta: FileMeta,
    /// Per source file.
    pub sources: Vec<SourceStats>,
}

/// Detects the format of `path` from its content: a CSV header with `ContextTokens` (Azure)
/// or `Request tokens` (BurstGPT); a JSON line with `chat_id` (Qwen) or `hash_ids` /
/// `input_length` (Mooncake); a JSON array (ShareGPT).
pub fn detect(path: &Path) -> Result<Format> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut head = Vec::new();
    file.take(64 * 1024)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, e))?;
    let text = String::from_utf8_lossy(&head);
    let text = text.trim_start_matches('\u{feff}').trim_start();
    let first_line = text.lines().next().unwrap_or("");
    let unknown = |why: &str| {
        Error::Invalid(format!(
        "{}: cannot detect the format ({why}); give --format azure|burstgpt|mooncake|qwen|sharegpt",
        path.display()
    ))
    };
    if text.starts_with('[') {
        return Ok(Format::ShareGpt);
    }
    if first_line.starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(first_line)
            .map_err(|_| unknown("the first line is not a JSON object"))?;
        return if v.get("chat_id").is_some() {
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

/// Imports one file (format detected when `opts.format` is `Auto`). `id_prefix` starts each
/// request id (`<id_prefix>:<line>`).
pub fn import_file(
    path: &Path,
    opts: &ImportOptions,
    id_prefix: &str,
) -> Result<(Vec<TraceRecord>, SourceStats)> {
    let format = match opts.format {
        Format::Auto => detect(path)?,
        f => f,
    };
    let mut records = match format {
        Format::Azure => azure::import(path, id_prefix)?,
        Format::BurstGpt => burstgpt::import(path, id_prefix)?,
        Format::Mooncake => mooncake::import(path, id_prefix)?,
        Format::Qwen => qwen::import(path, id_prefix)?,
        Format::ShareGpt => {
            let (records, skipped) = sharegpt::import(path, id_prefix, opts)?;
            let mut stats = SourceStats::new(path, format);
            stats.account(&records);
            stats.skipped = skipped;
            return Ok((with_model(records, opts), stats));
        }
        Format::Auto => unreachable!("resolved above"),
    };
    records = with_model(records, opts);
    let mut stats = SourceStats::new(path, format);
    stats.account(&records);
    Ok((records, stats))
}

fn with_model(mut records: Vec<TraceRecord>, opts: &ImportOptions) -> Vec<TraceRecord> {
    if let Some(m) = &opts.model {
        for r in &mut records {
            r.model = Some(m.clone());
        }
    }
    records
}

/// Imports one object named by URL (`s3://`, `gs://`, `az://`, `https://`, … as
/// [`crate::store`] reads them): streamed into a private temporary file under its own name,
/// imported from there, and removed; the source is recorded as the URL.
fn import_url(
    url: &str,
    opts: &ImportOptions,
    id_prefix: &str,
) -> Result<(Vec<TraceRecord>, SourceStats)> {
    /// Removes the temporary directory however the import ends.
    struct TempDir(PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let loc = crate::store::ObjectLocation::parse(url)?;
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
    let (rows, mut stats) = import_file(&local, opts, id_prefix).map_err(|e| {
        // Messages name the URL, not the temporary copy.
        Error::Invalid(e.to_string().replace(&local.display().to_string(), url))
    })?;
    stats.path = PathBuf::from(url);
    Ok((rows, stats))
}

/// Imports every file of `paths` into one trace. Request ids are `<file stem>:<line>` (with
/// the input's index in front when two inputs share a stem), unique across the import.
/// Sources with hash ids of different block sizes cannot share a trace (one block size per
/// file): that is an error.
pub fn import(paths: &[PathBuf], opts: &ImportOptions, command: &str) -> Result<Imported> {
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
    let mut records = Vec::new();
    let mut sources = Vec::new();
    let mut block_size: Option<(u32, PathBuf)> = None;
    for (i, path) in paths.iter().enumerate() {
        let prefix = if clash {
            format!("{i}-{}", stems[i])
        } else {
            stems[i].clone()
        };
        let (rows, stats) = match path.to_str().filter(|s| crate::store::is_url(s)) {
            Some(url) => import_url(url, opts, &prefix)?,
            None => import_file(path, opts, &prefix)?,
        };
        if rows.iter().any(|r| r.prefix_hashes.is_some()) {
            if let Some(b) = stats.format.block_size() {
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
        records.extend(rows);
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
    Ok(Imported {
        records,
        meta,
        sources,
    })
}

// ---- helpers shared by the importers ----

/// A new imported row: id `<prefix>:<line>`, recorded token counts, `stream = true`.
pub(crate) fn row(
    prefix: &str,
    line: usize,
    arrival_us: i64,
    endpoint: &str,
    prompt: i64,
    output: i64,
) -> TraceRecord {
    let mut r = TraceRecord::new(format!("{prefix}:{line}"), arrival_us, endpoint);
    r.stream = true;
    r.prompt_tokens = Some(prompt);
    r.output_tokens = Some(output);
    r.prompt_tokens_source = Some(TokenSource::Recorded);
    r.output_tokens_source = Some(TokenSource::Recorded);
    r
}

/// Calls `f(line_no, line)` for every non-blank line of `path` (1-based numbers; a UTF-8
/// BOM and a trailing `\r` are removed).
pub(crate) fn for_each_line(
    path: &Path,
    mut f: impl FnMut(usize, &str) -> Result<()>,
) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut buf = String::new();
    let mut line_no = 0;
    loop {
        buf.clear();
        let n = reader.read_line(&mut buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                bad(path, line_no + 1, "not UTF-8 text")
            } else {
                Error::io(path, e)
            }
        })?;
        if n == 0 {
            return Ok(());
        }
        line_no += 1;
        let mut line = buf.trim_end_matches(['\n', '\r']);
        if line_no == 1 {
            line = line.trim_start_matches('\u{feff}');
        }
        if line.trim().is_empty() {
            continue;
        }
        f(line_no, line)?;
    }
}

/// [`Error::BadRow`] for `path:line`.
/// A non-negative integer field of a JSON-lines row (`input_length`, `output_length`).
pub(crate) fn json_count(
    obj: &serde_json::Map<String, serde_json::Value>,
    name: &str,
    path: &Path,
    line: usize,
) -> Result<i64> {
    obj.get(name)
        .and_then(serde_json::Value::as_i64)
        .filter(|n| *n >= 0)
        .ok_or_else(|| {
            bad(
                path,
                line,
                format!("{name} missing or not a non-negative integer"),
            )
        })
}

/// The `hash_ids` of a JSON-lines row (Mooncake, Qwen Bailian): absent or null is None.
pub(crate) fn json_hash_ids(
    obj: &serde_json::Map<String, serde_json::Value>,
    path: &Path,
    line: usize,
) -> Result<Option<Vec<u64>>> {
    match obj.get("hash_ids") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Array(ids)) => ids
            .iter()
            .map(|h| {
                h.as_u64().ok_or_else(|| {
                    bad(
                        path,
                        line,
                        format!("hash id {h} is not a non-negative integer"),
                    )
                })
            })
            .collect::<Result<Vec<u64>>>()
            .map(Some),
        Some(other) => Err(bad(path, line, format!("hash_ids {other} is not an array"))),
    }
}

pub(crate) fn bad(path: &Path, line: usize, message: impl Into<String>) -> Error {
    Error::BadRow {
        path: path.to_path_buf(),
        line,
        message: message.into(),
    }
}

/// Splits one CSV line (RFC 4180 quoting: `"a,b"`, `""` for a quote; no line breaks inside
/// fields). `None` for an unterminated quote.
pub(crate) fn split_csv_line(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut at_start = true;
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    field.push('"');
                    chars.next();
                } else {
                    quoted = false;
                }
            } else {
                field.push(c);
            }
        } else if c == '"' && at_start {
            quoted = true;
            at_start = false;
        } else if c == ',' {
            out.push(std::mem::take(&mut field));
            at_start = true;
        } else {
            field.push(c);
            at_start = false;
        }
    }
    if quoted {
        return None;
    }
    out.push(field);
    Some(out)
}

/// A CSV file's header: column index by (trimmed, case-insensitive) name.
pub(crate) struct CsvHeader {
    names: Vec<String>,
}

impl CsvHeader {
    pub(crate) fn parse(path: &Path, line: &str) -> Result<CsvHeader> {
        let names = split_csv_line(line)
            .ok_or_else(|| bad(path, 1, "unterminated quote in the header"))?
            .into_iter()
            .map(|n| n.trim().to_ascii_lowercase())
            .collect();
        Ok(CsvHeader { names })
    }

    pub(crate) fn find(&self, name: &str) -> Option<usize> {
        self.names
            .iter()
            .position(|n| n == &name.to_ascii_lowercase())
    }

    pub(crate) fn require(&self, path: &Path, name: &str) -> Result<usize> {
        self.find(name).ok_or_else(|| {
            bad(
                path,
                1,
                format!(
                    "no column {name:?} in the header ({})",
                    self.names.join(",")
                ),
            )
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }
}

/// Parses a non-negative integer field.
pub(crate) fn parse_count(path: &Path, line: usize, name: &str, v: &str) -> Result<i64> {
    let t = v.trim();
    // Some exports write integral counts as floats ("12.0").
    let t = t.strip_suffix(".0").unwrap_or(t);
    t.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
        bad(
            path,
            line,
            format!("{name} {v:?} is not a non-negative integer"),
        )
    })
}

/// Parses a decimal number of seconds (`12`, `12.5`, `1.25e2`) into µs, exactly for up to
/// six fractional digits (more are rounded to the nearest µs).
pub(crate) fn seconds_to_us(v: &str) -> Option<i64> {
    let t = v.trim();
    if t.is_empty() || t.contains(['e', 'E']) || t.starts_with('-') {
        let x: f64 = t.parse().ok()?;
        return (x.is_finite() && x >= 0.0).then(|| (x * 1e6).round() as i64);
    }
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: i64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut us: i64 = 0;
    let digits = frac.as_bytes();
    for i in 0..6 {
        us = us * 10 + digits.get(i).map_or(0, |d| i64::from(d - b'0'));
    }
    if digits.len() > 6 && digits[6] >= b'5' {
        us += 1;
    }
    secs.checked_mul(1_000_000)?.checked_add(us)
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
    fn csv_lines_split_with_quotes() {
        assert_eq!(split_csv_line("a,b,,c").unwrap(), vec!["a", "b", "", "c"]);
        assert_eq!(
            split_csv_line(r#""x,y",2,"say ""hi""""#).unwrap(),
            vec!["x,y", "2", r#"say "hi""#]
        );
        assert!(split_csv_line(r#""open,1"#).is_none());
    }

    #[test]
    fn seconds_parse_exactly() {
        assert_eq!(seconds_to_us("12"), Some(12_000_000));
        assert_eq!(seconds_to_us("0.000001"), Some(1));
        assert_eq!(seconds_to_us("5.25"), Some(5_250_000));
        assert_eq!(seconds_to_us("1.0000005"), Some(1_000_001));
        assert_eq!(seconds_to_us("1.5e1"), Some(15_000_000));
        assert_eq!(seconds_to_us("x"), None);
        assert_eq!(seconds_to_us("-1"), None);
        assert_eq!(seconds_to_us(""), None);
    }

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
        ];
        for (name, content, want) in cases {
            let p = dir.path().join(name);
            std::fs::write(&p, content).unwrap();
            assert_eq!(detect(&p).unwrap(), want, "{name}");
        }
        let p = dir.path().join("x.txt");
        std::fs::write(&p, "hello,world\n").unwrap();
        assert!(detect(&p).unwrap_err().to_string().contains("--format"));
    }
}
