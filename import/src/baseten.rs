//! Baseten's production traces (Parquet): one row per completion request, the one public
//! trace with a time to first token and a cancel flag per request. Columns as NVIDIA AIPerf's
//! Baseten loader (co-written by Baseten) reads them (`aiperf/dataset/loader/baseten_trace.py`,
//! `baseten_trace_models.py`): `timestamp_start_unix_ms` (the request's start, ms since the
//! epoch), `prompt` (the literal completion prompt), `input_tokens`, `output_tokens`,
//! `total_hashes` (KV-cache block hashes of `block_size` tokens), `provided_session_id` and
//! `poor_man_session_id`, `duration_e2e_ms`, `duration_ttft_ms`, `request_canceled` (0/1),
//! `model_name`.
//!
//! Each row becomes one `/v1/completions` request, id `<prefix>:<row>` (1-based), arriving at
//! `timestamp_start_unix_ms`, its body the recorded prompt (`{"model", "prompt", "max_tokens"
//! and "min_tokens": output_tokens, "ignore_eos": true, "stream": true}`: replayed as
//! recorded, the output length held as AIPerf and llmreplay's built requests hold it), with
//! the captured TTFT and end-to-end latency. The session is
//! chosen as AIPerf chooses it, for the whole file: `provided_session_id` when some value of it
//! repeats, else `poor_man_session_id` when one of its values does, else whichever is present.
//! A session's rows chain in file order, each continuing the one before with the think time
//! after its end (the gap AIPerf replays as each continuation's delay: start-to-start minus the
//! previous row's `duration_e2e_ms`; unknown, not the raw gap, when that is null); a row
//! arriving before the previous of its session is left unlinked and counted.
//! `total_hashes` become `prefix_hashes`, `block_size` the file's block size (one per file). A
//! canceled row is a cancellation by the client at its duration (after its first token when
//! the TTFT is earlier): `outcome = client_cancelled` with `e2el_us` the cancel point, which
//! `llmreplay replay` repeats at that point.
//!
//! Rows are read a record batch at a time and written as read (a first pass reads only the
//! session columns). Incomplete rows import with what they have, the rest counted: a null
//! token count, duration or TTFT is unknown; a canceled row without a duration has no known
//! cancel point (replayed whole). A bad value is an error naming the file and its row.
//!
//! Not mapped: `cached_tokens_reference`, `org_id`, `features`, `speculation_ratio`,
//! `output_text`, `__version__`, `total_hashes_len` and any other column (listed on import).

use std::collections::HashMap;
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use serde_json::json;
use trace_format::fnv::{fnv1a, OFFSET};
use trace_format::{Error, Outcome, Result, TokenSource, TraceRecord};

use crate::link::Sessions;
use crate::out::{Out, Sink};
use crate::rows::bad;
use crate::Format;

/// Endpoint of imported rows (the traces hold completion prompts).
pub const ENDPOINT: &str = "/v1/completions";

/// The columns read.
const ARRIVAL: &str = "timestamp_start_unix_ms";
const PROMPT: &str = "prompt";
const INPUT: &str = "input_tokens";
const OUTPUT: &str = "output_tokens";
const HASHES: &str = "total_hashes";
const BLOCK: &str = "block_size";
const SESSION: &str = "provided_session_id";
const POOR_SESSION: &str = "poor_man_session_id";
const E2E: &str = "duration_e2e_ms";
const TTFT: &str = "duration_ttft_ms";
const CANCELED: &str = "request_canceled";
const MODEL: &str = "model_name";
const ALL: [&str; 12] = [
    ARRIVAL,
    PROMPT,
    INPUT,
    OUTPUT,
    HASHES,
    BLOCK,
    SESSION,
    POOR_SESSION,
    E2E,
    TTFT,
    CANCELED,
    MODEL,
];
/// The columns llmreplay's own traces must have: a Parquet file with them is a trace already.
const TRACE_COLUMNS: [&str; 5] = [
    "request_id",
    "arrival_time",
    "endpoint",
    "stream",
    "outcome",
];

/// One value of a row, read from a column of any numeric, boolean, string, timestamp or list
/// type.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Num(f64),
    /// An integer, exactly.
    Int(i128),
    /// µs since the epoch.
    Time(i64),
    Bool(bool),
    Str(String),
    List(Vec<Cell>),
}

fn cell(a: &dyn Array, i: usize) -> Option<Cell> {
    if a.is_null(i) {
        return Some(Cell::Null);
    }
    macro_rules! int {
        ($t:ty) => {
            Cell::Int(i128::from(a.as_primitive::<$t>().value(i)))
        };
    }
    Some(match a.data_type() {
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        DataType::Float32 => Cell::Num(f64::from(a.as_primitive::<Float32Type>().value(i))),
        DataType::Float64 => Cell::Num(a.as_primitive::<Float64Type>().value(i)),
        DataType::Boolean => Cell::Bool(a.as_boolean().value(i)),
        DataType::Utf8 => Cell::Str(a.as_string::<i32>().value(i).to_string()),
        DataType::LargeUtf8 => Cell::Str(a.as_string::<i64>().value(i).to_string()),
        DataType::Utf8View => Cell::Str(a.as_string_view().value(i).to_string()),
        DataType::Timestamp(unit, _) => Cell::Time(match unit {
            TimeUnit::Second => a
                .as_primitive::<TimestampSecondType>()
                .value(i)
                .checked_mul(1_000_000)?,
            TimeUnit::Millisecond => a
                .as_primitive::<TimestampMillisecondType>()
                .value(i)
                .checked_mul(1000)?,
            TimeUnit::Microsecond => a.as_primitive::<TimestampMicrosecondType>().value(i),
            TimeUnit::Nanosecond => a.as_primitive::<TimestampNanosecondType>().value(i) / 1000,
        }),
        DataType::List(_) => list(a.as_list::<i32>().value(i).as_ref())?,
        DataType::LargeList(_) => list(a.as_list::<i64>().value(i).as_ref())?,
        _ => return None,
    })
}

fn list(values: &dyn Array) -> Option<Cell> {
    (0..values.len())
        .map(|j| cell(values, j))
        .collect::<Option<Vec<_>>>()
        .map(Cell::List)
}

/// The indices of the columns read, by name (None: the file has no such column).
struct Cols(HashMap<&'static str, usize>);

impl Cols {
    fn of(names: &[String]) -> Cols {
        Cols(
            ALL.iter()
                .filter_map(|&c| names.iter().position(|n| n == c).map(|i| (c, i)))
                .collect(),
        )
    }
}

/// One row of a batch, for typed reads with errors naming the file and the row.
struct Row<'a> {
    path: &'a Path,
    /// 1-based row of the file.
    row: usize,
    /// Index in the batch.
    i: usize,
    batch: &'a RecordBatch,
    cols: &'a Cols,
}

impl Row<'_> {
    fn bad(&self, message: impl Into<String>) -> Error {
        bad(
            self.path,
            self.row,
            format!("row {}: {}", self.row, message.into()),
        )
    }

    /// The value of column `name` (Null when the file has no such column).
    fn get(&self, name: &str) -> Result<Cell> {
        let Some(&c) = self.cols.0.get(name) else {
            return Ok(Cell::Null);
        };
        let a = self.batch.column(c);
        cell(a.as_ref(), self.i)
            .ok_or_else(|| self.bad(format!("{name}: unsupported column type {}", a.data_type())))
    }

    fn num(&self, name: &str) -> Result<Option<f64>> {
        match self.get(name)? {
            Cell::Null => Ok(None),
            Cell::Int(x) if x >= 0 => Ok(Some(x as f64)),
            Cell::Num(x) if x.is_finite() && x >= 0.0 => Ok(Some(x)),
            v => Err(self.bad(format!("{name} {v:?} is not a non-negative number"))),
        }
    }

    fn count(&self, name: &str) -> Result<Option<i64>> {
        match self.get(name)? {
            Cell::Int(x) => i64::try_from(x)
                .ok()
                .filter(|x| *x >= 0)
                .map(Some)
                .ok_or_else(|| self.bad(format!("{name} {x} is not a non-negative integer"))),
            _ => match self.num(name)? {
                Some(x) if x.fract() == 0.0 && x < 9.0e15 => Ok(Some(x as i64)),
                Some(x) => Err(self.bad(format!("{name} {x} is not an integer"))),
                None => Ok(None),
            },
        }
    }

    fn ms_to_us(&self, name: &str) -> Result<Option<i64>> {
        Ok(self.num(name)?.map(|ms| (ms * 1000.0).round() as i64))
    }

    /// A string or integer identifier (sessions are either).
    fn text(&self, name: &str) -> Result<Option<String>> {
        match self.get(name)? {
            Cell::Null => Ok(None),
            Cell::Str(s) => Ok(Some(s).filter(|s| !s.is_empty())),
            Cell::Int(x) => Ok(Some(x.to_string())),
            v => Err(self.bad(format!("{name} {v:?} is not a string or an integer"))),
        }
    }

    fn canceled(&self) -> Result<bool> {
        match self.get(CANCELED)? {
            Cell::Null => Ok(false),
            Cell::Bool(b) => Ok(b),
            Cell::Int(x) if x == 0 || x == 1 => Ok(x == 1),
            v => Err(self.bad(format!("{CANCELED} {v:?} is not 0 or 1"))),
        }
    }

    fn arrival(&self) -> Result<i64> {
        match self.get(ARRIVAL)? {
            Cell::Time(us) => Ok(us),
            Cell::Int(ms) if (0..9_000_000_000_000_000).contains(&ms) => Ok(ms as i64 * 1000),
            Cell::Num(ms) if (0.0..9.0e15).contains(&ms) => Ok((ms * 1000.0).round() as i64),
            v => Err(self.bad(format!(
                "{ARRIVAL} {v:?} is not a timestamp or a non-negative number of ms"
            ))),
        }
    }

    fn hashes(&self) -> Result<Option<Vec<u64>>> {
        match self.get(HASHES)? {
            Cell::Null => Ok(None),
            Cell::List(items) => items
                .into_iter()
                .map(|h| match h {
                    Cell::Int(x) => u64::try_from(x).ok(),
                    _ => None,
                })
                .collect::<Option<Vec<u64>>>()
                .map(Some)
                .ok_or_else(|| {
                    self.bad(format!("{HASHES}: an item is not a non-negative integer"))
                }),
            v => Err(self.bad(format!("{HASHES} {v:?} is not a list"))),
        }
    }

    /// The row's record; `session` is the session column the file uses.
    fn record(
        &self,
        id_prefix: &str,
        session: Option<&str>,
        out: &mut Out<'_>,
    ) -> Result<TraceRecord> {
        let mut r = TraceRecord::new(
            format!("{id_prefix}:{}", self.row),
            self.arrival()?,
            ENDPOINT,
        );
        r.stream = true;
        r.prompt_tokens = self.count(INPUT)?;
        r.output_tokens = self.count(OUTPUT)?;
        r.prompt_tokens_source = r.prompt_tokens.map(|_| TokenSource::Recorded);
        r.output_tokens_source = r.output_tokens.map(|_| TokenSource::Recorded);
        r.ttft_us = self.ms_to_us(TTFT)?;
        r.e2el_us = self.ms_to_us(E2E)?;
        r.model = self.text(MODEL)?;
        r.session_id = match session {
            Some(c) => self.text(c)?,
            None => None,
        };
        r.prefix_hashes = self.hashes()?;
        if let Cell::Str(prompt) = self.get(PROMPT)? {
            let mut body = json!({"prompt": prompt, "stream": true});
            if let Some(m) = &r.model {
                body["model"] = json!(m);
            }
            if let Some(n) = r.output_tokens {
                // The recorded length held, as AIPerf holds it (min_tokens) and as llmreplay's
                // built requests do (ignore_eos).
                body["max_tokens"] = json!(n.max(1));
                body["min_tokens"] = json!(n);
                body["ignore_eos"] = json!(true);
            }
            r.body = Some(body.to_string());
        }
        for (known, name) in [
            (r.prompt_tokens.is_some(), INPUT),
            (r.output_tokens.is_some(), OUTPUT),
            (r.e2el_us.is_some(), E2E),
        ] {
            if !known && self.cols.0.contains_key(name) {
                out.unknown(name);
            }
        }
        if self.canceled()? {
            r.outcome = Outcome::ClientCancelled;
            r.error = Some("cancelled by the client (recorded)".into());
            if r.e2el_us.is_none() {
                out.unknown("duration_e2e_ms of a canceled row (its cancel point)");
            }
        }
        Ok(r)
    }
}

/// What a Parquet file is to `import --format auto`: Baseten's trace, or an error saying what
/// it is (llmreplay's own columns: a trace already; or columns of no known format).
pub(crate) fn detect(path: &Path) -> Result<Format> {
    let names = trace_format::reader::guarded(path, || column_names(path))?;
    let has = |c: &str| names.iter().any(|n| n == c);
    if TRACE_COLUMNS.iter().all(|c| has(c)) {
        return Err(Error::Invalid(format!(
            "{}: this is already an llmreplay trace (it has llmreplay's columns): `llmreplay inspect`, `replay`, `fidelity` and `report` read it as it is",
            path.display()
        )));
    }
    if has(ARRIVAL) && has(INPUT) {
        return Ok(Format::Baseten);
    }
    Err(Error::Invalid(format!(
        "{}: cannot detect the format (Parquet with columns {}); give --format ({})",
        path.display(),
        names.join(","),
        crate::FORMATS
    )))
}

fn not_parquet(path: &Path) -> impl Fn(parquet::errors::ParquetError) -> Error + '_ {
    move |e| Error::NotATrace {
        path: path.to_path_buf(),
        reason: format!("not a readable Parquet file: {e}"),
    }
}

fn column_names(path: &Path) -> Result<Vec<String>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(not_parquet(path))?;
    Ok(builder
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect())
}

/// Reads a Baseten Parquet trace into `out`, a record batch at a time. Damaged pages (on
/// which the `parquet` crate's decoders panic) are an error naming the file, by the same guard
/// the trace reader decodes under ([`trace_format::reader::guarded`]).
pub(crate) fn import(path: &Path, id_prefix: &str, out: &mut Out<'_>) -> Result<()> {
    trace_format::reader::guarded(path, || read(path, id_prefix, out))
}

/// The session column the file uses, as AIPerf chooses it (see the module's doc).
fn session_column(path: &Path, names: &[String]) -> Result<Option<&'static str>> {
    let present: Vec<&'static str> = [SESSION, POOR_SESSION]
        .into_iter()
        .filter(|c| names.iter().any(|n| n == c))
        .collect();
    if present.is_empty() {
        return Ok(None);
    }
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(not_parquet(path))?;
    let roots: Vec<usize> = present
        .iter()
        .map(|c| names.iter().position(|n| n == c).expect("present"))
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(8192)
        .build()
        .map_err(not_parquet(path))?;
    // Per column: the hashes of the values seen, and whether one repeated.
    let mut seen: Vec<(HashMap<u64, ()>, bool)> = vec![(HashMap::new(), false); present.len()];
    for batch in reader {
        let batch = batch.map_err(|e| Error::format(path, e))?;
        for (k, (values, repeats)) in seen.iter_mut().enumerate() {
            let a = batch.column(k);
            for i in 0..batch.num_rows() {
                let key = match cell(a.as_ref(), i) {
                    Some(Cell::Str(s)) => fnv1a(OFFSET, s.as_bytes()),
                    Some(Cell::Int(x)) => fnv1a(OFFSET, &x.to_le_bytes()),
                    _ => continue,
                };
                *repeats |= values.insert(key, ()).is_some();
            }
        }
    }
    let repeating = present
        .iter()
        .zip(&seen)
        .find(|(_, (_, r))| *r)
        .map(|(c, _)| *c);
    let any = present
        .iter()
        .zip(&seen)
        .find(|(_, (v, _))| !v.is_empty())
        .map(|(c, _)| *c);
    Ok(repeating.or(any))
}

fn read(path: &Path, id_prefix: &str, out: &mut Out<'_>) -> Result<()> {
    let names = column_names(path)?;
    let cols = Cols::of(&names);
    for needed in [ARRIVAL] {
        if !cols.0.contains_key(needed) {
            return Err(bad(
                path,
                1,
                format!("no {needed} column among {}", names.join(",")),
            ));
        }
    }
    let session = session_column(path, &names)?;
    let unmapped: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| !ALL.contains(n))
        .collect();
    if !unmapped.is_empty() {
        out.stats
            .notes
            .push(format!("columns not mapped: {}", unmapped.join(", ")));
    }
    if let Some(s) = session {
        out.stats.notes.push(format!("sessions from {s}"));
    }
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(not_parquet(path))?
        .with_batch_size(8192)
        .build()
        .map_err(not_parquet(path))?;
    let mut rows = 0;
    let mut block: Option<(u32, usize)> = None;
    let mut sessions = Sessions::default();
    let finish = |out: &mut Out<'_>, block: Option<(u32, usize)>, sessions: &Sessions| {
        out.stats.block_size = block.map(|(b, _)| b);
        out.stats.notes.extend(sessions.note());
    };
    for batch in reader {
        let batch = batch.map_err(|e| Error::NotATrace {
            path: path.to_path_buf(),
            reason: format!("damaged Parquet data after row {rows}: {e}"),
        })?;
        for i in 0..batch.num_rows() {
            rows += 1;
            let row = Row {
                path,
                row: rows,
                i,
                batch: &batch,
                cols: &cols,
            };
            let mut r = row.record(id_prefix, session, out)?;
            sessions.link(&mut r);
            if r.prefix_hashes.is_some() {
                if let Some(b) = row.count(BLOCK)? {
                    let b = u32::try_from(b)
                        .ok()
                        .filter(|b| *b > 0)
                        .ok_or_else(|| row.bad(format!("{BLOCK} {b} is out of range")))?;
                    match block {
                        Some((prev, at)) if prev != b => {
                            return Err(row.bad(format!(
                            "{BLOCK} {b} differs from {prev} on row {at} (one block size per file)"
                        )))
                        }
                        _ => block = Some((b, rows)),
                    }
                }
            }
            if !out.push(r)? {
                finish(out, block, &sessions);
                return Ok(());
            }
        }
    }
    finish(out, block, &sessions);
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow_array::types::Int64Type as I64;
    use arrow_array::{Int64Array, ListArray, StringArray, UInt8Array};
    use arrow_schema::{Field, Schema};

    use crate::{ImportOptions, SourceStats};

    /// One Baseten row: (start ms, input, output, ttft ms, e2e ms, canceled, provided
    /// session, poor man's session).
    pub(crate) type Sample<'a> = (
        i64,
        Option<i64>,
        i64,
        Option<i64>,
        Option<i64>,
        u8,
        Option<&'a str>,
        i64,
    );

    /// Writes a Baseten trace with the columns AIPerf's loader reads (and one it does not).
    pub(crate) fn write_sample(path: &Path, rows: &[Sample<'_>]) {
        let schema = Arc::new(Schema::new(vec![
            Field::new(ARRIVAL, DataType::Int64, false),
            Field::new(PROMPT, DataType::Utf8, false),
            Field::new(INPUT, DataType::Int64, true),
            Field::new(OUTPUT, DataType::Int64, false),
            Field::new(
                HASHES,
                DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
                true,
            ),
            Field::new(BLOCK, DataType::Int64, true),
            Field::new(SESSION, DataType::Utf8, true),
            Field::new(POOR_SESSION, DataType::Int64, true),
            Field::new(E2E, DataType::Int64, true),
            Field::new(TTFT, DataType::Int64, true),
            Field::new(CANCELED, DataType::UInt8, true),
            Field::new(MODEL, DataType::Utf8, true),
            Field::new("org_id", DataType::Utf8, true),
        ]));
        let n = rows.len();
        let ints = |f: &dyn Fn(&Sample<'_>) -> Option<i64>| {
            Arc::new(Int64Array::from(rows.iter().map(f).collect::<Vec<_>>())) as _
        };
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                ints(&|r| Some(r.0)),
                Arc::new(StringArray::from(
                    rows.iter()
                        .map(|r| format!("prompt of {}", r.0))
                        .collect::<Vec<_>>(),
                )),
                ints(&|r| r.1),
                ints(&|r| Some(r.2)),
                Arc::new(ListArray::from_iter_primitive::<I64, _, _>(
                    rows.iter().map(|r| Some(vec![Some(7), Some(r.0 % 5)])),
                )),
                ints(&|_| Some(16)),
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.6).collect::<Vec<_>>(),
                )),
                ints(&|r| Some(r.7)),
                ints(&|r| r.4),
                ints(&|r| r.3),
                Arc::new(UInt8Array::from(
                    rows.iter().map(|r| r.5).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(vec![Some("llama"); n])),
                Arc::new(StringArray::from(vec![Some("org-1"); n])),
            ],
        )
        .unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(path).unwrap(),
            schema,
            None,
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    fn import(p: &Path) -> Result<(Vec<TraceRecord>, SourceStats)> {
        let opts = ImportOptions {
            format: Format::Baseten,
            ..Default::default()
        };
        crate::import_file(p, &opts, "b")
    }

    #[test]
    fn rows_ttft_cancels_prompts_and_hashes_import_as_aiperf_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.parquet");
        write_sample(
            &p,
            &[
                (
                    1_700_000_000_000,
                    Some(100),
                    20,
                    Some(35),
                    Some(400),
                    0,
                    Some("s1"),
                    1,
                ),
                (
                    1_700_000_000_250,
                    Some(50),
                    3,
                    Some(20),
                    Some(90),
                    1,
                    Some("s2"),
                    2,
                ),
                (1_700_000_001_000, None, 0, None, None, 1, Some("s2"), 3),
            ],
        );
        assert_eq!(crate::detect(&p).unwrap(), Format::Baseten);
        let (r, stats) = import(&p).unwrap();
        assert!(
            stats
                .notes
                .contains(&"columns not mapped: org_id".to_string()),
            "{:?}",
            stats.notes
        );
        // provided_session_id repeats (s2): it is the session column.
        assert!(stats
            .notes
            .contains(&"sessions from provided_session_id".to_string()));
        assert_eq!(r[0].arrival_time_us, 1_700_000_000_000_000);
        assert_eq!(r[0].endpoint, "/v1/completions");
        assert_eq!((r[0].ttft_us, r[0].e2el_us), (Some(35_000), Some(400_000)));
        assert_eq!(r[0].outcome, Outcome::Ok);
        let body: serde_json::Value = serde_json::from_str(r[0].body.as_deref().unwrap()).unwrap();
        assert_eq!(body["prompt"], "prompt of 1700000000000");
        assert_eq!(
            (body["max_tokens"].as_i64(), body["min_tokens"].as_i64()),
            (Some(20), Some(20))
        );
        assert_eq!(r[0].prefix_hashes, Some(vec![7, 0]));
        assert_eq!(stats.block_size, Some(16));
        assert_eq!(r[1].outcome, Outcome::ClientCancelled);
        assert_eq!((r[1].ttft_us, r[1].e2el_us), (Some(20_000), Some(90_000)));
        assert_eq!(r[1].session_id.as_deref(), Some("s2"));
        // An incomplete row imports with what it has.
        assert_eq!(
            (r[2].prompt_tokens, r[2].e2el_us, r[2].request_id.as_str()),
            (None, None, "b:3")
        );
        assert_eq!(stats.unknown.get(INPUT), Some(&1));
        assert_eq!(
            stats
                .unknown
                .get("duration_e2e_ms of a canceled row (its cancel point)"),
            Some(&1)
        );
        assert_eq!(r[0].model.as_deref(), Some("llama"));
    }

    /// Baseten's own fixture rows for AIPerf's loader (`tests/data/baseten/SOURCE.md`),
    /// written by pyarrow: every row one request with its arrival, tokens, TTFT, duration,
    /// cancel and session, and each continuation's think time the delay AIPerf replays
    /// (start-to-start minus the previous row's duration), all read here from the file with
    /// the parquet crate's row reader, not the importer's Arrow path.
    #[test]
    fn basetens_own_fixtures_import_as_aiperf_reads_them() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        use parquet::record::Field as P;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/baseten");
        for name in [
            "aiperf-offline-suite.parquet",
            "aiperf-null-durations.parquet",
        ] {
            let p = dir.join(name);
            assert_eq!(crate::detect(&p).unwrap(), Format::Baseten);
            let (rows, stats) = import(&p).unwrap();
            let reader = SerializedFileReader::new(std::fs::File::open(&p).unwrap()).unwrap();
            let file: Vec<HashMap<String, P>> = reader
                .get_row_iter(None)
                .unwrap()
                .map(|r| {
                    r.unwrap()
                        .get_column_iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .collect();
            assert_eq!(rows.len(), file.len(), "{name}");
            assert_eq!(stats.block_size, Some(64));
            let long = |f: &HashMap<String, P>, c: &str| match &f[c] {
                P::Long(v) => Some(*v),
                P::Null => None,
                v => panic!("{c}: {v:?}"),
            };
            let text = |f: &HashMap<String, P>, c: &str| match &f[c] {
                P::Str(v) => v.clone(),
                v => panic!("{c}: {v:?}"),
            };
            // AIPerf's delays: per session, in arrival order, the start-to-start gap minus the
            // previous row's duration (unknown without one).
            let mut last: HashMap<String, (usize, i64, Option<i64>)> = HashMap::new();
            let mut order: Vec<usize> = (0..file.len()).collect();
            order.sort_by_key(|&i| long(&file[i], ARRIVAL));
            let mut want_parent = vec![None; file.len()];
            for i in order {
                let f = &file[i];
                let (at, e2e) = (long(f, ARRIVAL).unwrap(), long(f, E2E));
                if let Some((j, prev_at, prev_e2e)) = last.get(&text(f, SESSION)) {
                    want_parent[i] = Some((*j, prev_e2e.map(|d| (at - prev_at - d).max(0) * 1000)));
                }
                last.insert(text(f, SESSION), (i, at, e2e));
            }
            for (i, (r, f)) in rows.iter().zip(&file).enumerate() {
                let what = format!("{name} row {}", i + 1);
                assert_eq!(
                    r.arrival_time_us,
                    long(f, ARRIVAL).unwrap() * 1000,
                    "{what}"
                );
                assert_eq!(r.prompt_tokens, long(f, INPUT), "{what}");
                assert_eq!(r.output_tokens, long(f, OUTPUT), "{what}");
                assert_eq!(r.ttft_us, long(f, TTFT).map(|v| v * 1000), "{what}");
                assert_eq!(r.e2el_us, long(f, E2E).map(|v| v * 1000), "{what}");
                assert_eq!(r.session_id, Some(text(f, SESSION)), "{what}");
                let canceled = long(f, CANCELED) == Some(1);
                assert_eq!(r.outcome == Outcome::ClientCancelled, canceled, "{what}");
                let hashes = match &f[HASHES] {
                    P::ListInternal(l) => l
                        .elements()
                        .iter()
                        .map(|e| match e {
                            P::Long(v) => *v as u64,
                            v => panic!("{v:?}"),
                        })
                        .collect::<Vec<u64>>(),
                    v => panic!("{v:?}"),
                };
                assert_eq!(r.prefix_hashes.as_ref(), Some(&hashes), "{what}");
                let body: serde_json::Value =
                    serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
                assert_eq!(body["prompt"], text(f, PROMPT), "{what}");
                let got = r
                    .parent_request_id
                    .as_ref()
                    .map(|p| (p.clone(), r.think_time_us));
                let want = want_parent[i].map(|(j, t)| (format!("b:{}", j + 1), t));
                assert_eq!(got, want, "{what}");
            }
        }
    }

    /// No provided session repeats, the poor man's one does: sessions come from it.
    #[test]
    fn the_session_column_is_chosen_as_aiperf_chooses_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.parquet");
        write_sample(
            &p,
            &[
                (0, Some(1), 1, None, Some(1), 0, Some("a"), 9),
                (1, Some(1), 1, None, Some(1), 0, Some("b"), 9),
                (2, Some(1), 1, None, Some(1), 0, None, 8),
            ],
        );
        let (r, _) = import(&p).unwrap();
        let s: Vec<_> = r.iter().map(|r| r.session_id.as_deref()).collect();
        assert_eq!(s, vec![Some("9"), Some("9"), Some("8")]);
    }

    /// Damaged pages panic inside the `parquet` crate's decoders (as trace files did): every
    /// byte of a Baseten file flipped in turn gives records or an error naming the file,
    /// never a panic.
    #[test]
    fn damaged_pages_are_errors_naming_the_file_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.parquet");
        let rows: Vec<Sample<'_>> = (0..50)
            .map(|i| {
                (
                    i * 1000,
                    Some(i + 1),
                    i % 7,
                    Some(i),
                    Some(10 + i),
                    (i % 5 == 0) as u8,
                    Some("s"),
                    i,
                )
            })
            .collect();
        write_sample(&good, &rows);
        let bytes = std::fs::read(&good).unwrap();
        let p = dir.path().join("damaged.parquet");
        let mut panics = Vec::new();
        for at in (4..bytes.len() - 8).step_by(2) {
            for flip in [0xFFu8, 0x01] {
                let mut b = bytes.clone();
                b[at] ^= flip;
                std::fs::write(&p, &b).unwrap();
                let got = std::panic::catch_unwind(|| import(&p));
                match got {
                    Err(_) => panics.push((at, flip)),
                    Ok(Err(e)) => assert!(e.to_string().contains("damaged.parquet"), "{e}"),
                    Ok(Ok(_)) => {}
                }
            }
        }
        assert!(
            panics.is_empty(),
            "{} panics, first at {:?}",
            panics.len(),
            panics.first()
        );
    }

    fn write_batch(p: &Path, batch: &RecordBatch) {
        let file = std::fs::File::create(p).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        w.write(batch).unwrap();
        w.close().unwrap();
    }

    #[test]
    fn bad_files_and_values_name_the_file_and_row() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.parquet");
        std::fs::write(&p, b"PAR1 not really").unwrap();
        let e = import(&p).unwrap_err().to_string();
        assert!(e.contains("bad.parquet") && e.contains("Parquet"), "{e}");
        // A negative count names its row and column.
        let schema = Arc::new(Schema::new(vec![
            Field::new(ARRIVAL, DataType::Int64, false),
            Field::new(INPUT, DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(Int64Array::from(vec![1, -4])),
            ],
        )
        .unwrap();
        write_batch(&p, &batch);
        let e = import(&p).unwrap_err().to_string();
        assert!(e.contains("bad.parquet:2: row 2: input_tokens -4"), "{e}");
        // A missing arrival column names what it looked for.
        let schema = Arc::new(Schema::new(vec![Field::new(INPUT, DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1]))]).unwrap();
        write_batch(&p, &batch);
        let e = import(&p).unwrap_err().to_string();
        assert!(e.contains("no timestamp_start_unix_ms column"), "{e}");
    }

    /// A Parquet file with llmreplay's columns is a trace already: `import` says so.
    #[test]
    fn an_llmreplay_trace_is_not_imported_again() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.parquet");
        trace_format::write_trace_file(
            &p,
            &[TraceRecord::new("a", 1, "/v1/completions")],
            &trace_format::FileMeta::new(trace_format::Producer::Synth, "t"),
        )
        .unwrap();
        let e = crate::detect(&p).unwrap_err().to_string();
        assert!(e.contains("already an llmreplay trace"), "{e}");
    }
}
