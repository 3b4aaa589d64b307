//! Baseten's production traces (Parquet): one row per request, the one public trace with a
//! time to first token and a cancel flag per request.
//!
//! **No published column list was found**: the columns read are those the traces are
//! described with (arrival, token counts, TTFT, duration, cancel flag), under these names
//! (case-insensitive, first present wins): arrival `timestamp` | `arrival_time` |
//! `request_time` (a Parquet timestamp of any unit, or a number of seconds since the epoch);
//! `input_tokens` | `prompt_tokens`; `output_tokens` | `completion_tokens`; `ttft_ms` |
//! `time_to_first_token_ms` (optional); `duration_ms` | `e2e_latency_ms` | `latency_ms`;
//! `cancelled` | `canceled` | `is_cancelled` | `is_canceled` (boolean, or 0/1; optional);
//! `model` and `session_id` (optional strings).
//!
//! Each row becomes one chat request, id `<prefix>:<row>` (1-based), with the captured TTFT
//! and end-to-end latency. A cancelled row is a cancellation by the client at its duration
//! (after its first token when the TTFT is earlier): `outcome = client_cancelled` with
//! `e2el_us` the cancel point, which `llmreplay replay` repeats at that point. Rows are read
//! a record batch at a time. A bad value is an error naming the file and its row.
//!
//! Not mapped: every other column (listed on the console when the file has any).

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
use trace_format::{Error, Outcome, Result, TokenSource, TraceRecord};

use crate::rows::bad;

/// Endpoint of imported rows.
pub const ENDPOINT: &str = "/v1/chat/completions";

/// The columns read, each with the names it may have.
const ARRIVAL: &[&str] = &["timestamp", "arrival_time", "request_time"];
const INPUT: &[&str] = &["input_tokens", "prompt_tokens"];
const OUTPUT: &[&str] = &["output_tokens", "completion_tokens"];
const TTFT: &[&str] = &["ttft_ms", "time_to_first_token_ms"];
const DURATION: &[&str] = &["duration_ms", "e2e_latency_ms", "latency_ms"];
const CANCELLED: &[&str] = &["cancelled", "canceled", "is_cancelled", "is_canceled"];
const MODEL: &[&str] = &["model"];
const SESSION: &[&str] = &["session_id"];
const ALL: [&[&str]; 8] = [
    ARRIVAL, INPUT, OUTPUT, TTFT, DURATION, CANCELLED, MODEL, SESSION,
];

/// What a Baseten trace held.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BasetenImport {
    /// One row per request.
    pub records: Vec<TraceRecord>,
    /// Columns of the file this importer does not read.
    pub unmapped: Vec<String>,
}

/// One value of a row, read from a column of any numeric, boolean, string or timestamp type.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Num(f64),
    /// µs since the epoch.
    Time(i64),
    Bool(bool),
    Str(String),
}

fn cell(a: &dyn Array, i: usize) -> Option<Cell> {
    if a.is_null(i) {
        return Some(Cell::Null);
    }
    macro_rules! num {
        ($t:ty) => {
            Cell::Num(a.as_primitive::<$t>().value(i) as f64)
        };
    }
    Some(match a.data_type() {
        DataType::Int8 => num!(Int8Type),
        DataType::Int16 => num!(Int16Type),
        DataType::Int32 => num!(Int32Type),
        DataType::Int64 => num!(Int64Type),
        DataType::UInt8 => num!(UInt8Type),
        DataType::UInt16 => num!(UInt16Type),
        DataType::UInt32 => num!(UInt32Type),
        DataType::UInt64 => num!(UInt64Type),
        DataType::Float32 => num!(Float32Type),
        DataType::Float64 => num!(Float64Type),
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
        _ => return None,
    })
}

/// One row of a batch, for typed reads with errors naming the file and the row.
struct Row<'a> {
    path: &'a Path,
    /// 1-based row of the file.
    row: usize,
    /// Index in the batch.
    i: usize,
    batch: &'a RecordBatch,
    cols: &'a [Option<usize>; 8],
}

impl Row<'_> {
    fn bad(&self, message: impl Into<String>) -> Error {
        bad(
            self.path,
            self.row,
            format!("row {}: {}", self.row, message.into()),
        )
    }

    /// The value of column group `g` (None when the file has no such column).
    fn get(&self, g: usize) -> Result<Option<(String, Cell)>> {
        let Some(c) = self.cols[g] else {
            return Ok(None);
        };
        let a = self.batch.column(c);
        let name = self.batch.schema().field(c).name().clone();
        let v = cell(a.as_ref(), self.i).ok_or_else(|| {
            self.bad(format!("{name}: unsupported column type {}", a.data_type()))
        })?;
        Ok(Some((name, v)))
    }

    fn num(&self, g: usize) -> Result<Option<f64>> {
        match self.get(g)? {
            None | Some((_, Cell::Null)) => Ok(None),
            Some((_, Cell::Num(x))) if x.is_finite() && x >= 0.0 => Ok(Some(x)),
            Some((n, v)) => Err(self.bad(format!("{n} {v:?} is not a non-negative number"))),
        }
    }

    fn count(&self, g: usize) -> Result<i64> {
        match self.num(g)? {
            Some(x) if x.fract() == 0.0 && x < 9.0e15 => Ok(x as i64),
            Some(x) => Err(self.bad(format!("{} {x} is not an integer", ALL[g][0]))),
            None => Err(self.bad(format!("{} is null", ALL[g][0]))),
        }
    }

    fn ms_to_us(&self, g: usize) -> Result<Option<i64>> {
        Ok(self.num(g)?.map(|ms| (ms * 1000.0).round() as i64))
    }

    fn text(&self, g: usize) -> Result<Option<String>> {
        match self.get(g)? {
            None | Some((_, Cell::Null)) => Ok(None),
            Some((_, Cell::Str(s))) => Ok(Some(s).filter(|s| !s.is_empty())),
            Some((_, Cell::Num(x))) => Ok(Some(x.to_string())),
            Some((n, v)) => Err(self.bad(format!("{n} {v:?} is not a string"))),
        }
    }

    fn cancelled(&self) -> Result<bool> {
        match self.get(5)? {
            None | Some((_, Cell::Null)) => Ok(false),
            Some((_, Cell::Bool(b))) => Ok(b),
            Some((_, Cell::Num(x))) if x == 0.0 || x == 1.0 => Ok(x == 1.0),
            Some((n, v)) => Err(self.bad(format!("{n} {v:?} is not a boolean"))),
        }
    }

    fn arrival(&self) -> Result<i64> {
        match self.get(0)? {
            Some((_, Cell::Time(us))) => Ok(us),
            Some((_, Cell::Num(s))) if (0.0..9.0e12).contains(&s) => Ok((s * 1e6).round() as i64),
            Some((n, v)) => Err(self.bad(format!(
                "{n} {v:?} is not a timestamp or a non-negative number of seconds"
            ))),
            None => unreachable!("the arrival column is required"),
        }
    }

    fn record(&self, id_prefix: &str) -> Result<TraceRecord> {
        let mut r = TraceRecord::new(
            format!("{id_prefix}:{}", self.row),
            self.arrival()?,
            ENDPOINT,
        );
        r.stream = true;
        r.prompt_tokens = Some(self.count(1)?);
        r.output_tokens = Some(self.count(2)?);
        r.prompt_tokens_source = Some(TokenSource::Recorded);
        r.output_tokens_source = Some(TokenSource::Recorded);
        r.ttft_us = self.ms_to_us(3)?;
        r.e2el_us = self.ms_to_us(4)?;
        r.model = self.text(6)?;
        r.session_id = self.text(7)?;
        if self.cancelled()? {
            if r.e2el_us.is_none() {
                return Err(self.bad("cancelled without a duration: the cancel point is unknown"));
            }
            r.outcome = Outcome::ClientCancelled;
            r.error = Some("cancelled by the client (recorded)".into());
        }
        Ok(r)
    }
}

/// Reads a Baseten Parquet trace, a record batch at a time. Damaged pages (on which the
/// `parquet` crate's decoders panic) are an error naming the file, by the same guard the
/// trace reader decodes under ([`trace_format::reader::guarded`]).
pub fn import(path: &Path, id_prefix: &str) -> Result<BasetenImport> {
    trace_format::reader::guarded(path, || read(path, id_prefix))
}

fn read(path: &Path, id_prefix: &str) -> Result<BasetenImport> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let not_parquet = |e: parquet::errors::ParquetError| Error::NotATrace {
        path: path.to_path_buf(),
        reason: format!("not a readable Parquet file: {e}"),
    };
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(not_parquet)?;
    let schema = builder.schema().clone();
    let names: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| f.name().to_ascii_lowercase())
        .collect();
    let mut cols = [None; 8];
    for (g, aliases) in ALL.iter().enumerate() {
        cols[g] = aliases
            .iter()
            .find_map(|a| names.iter().position(|n| n == a));
    }
    for (g, what) in [
        (0, "arrival"),
        (1, "input tokens"),
        (2, "output tokens"),
        (4, "duration"),
    ] {
        if cols[g].is_none() {
            return Err(bad(
                path,
                1,
                format!(
                    "no {what} column ({}) among {}",
                    ALL[g].join(" | "),
                    names.join(",")
                ),
            ));
        }
    }
    let unmapped = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(i, _)| !cols.contains(&Some(*i)))
        .map(|(_, f)| f.name().clone())
        .collect();
    let reader = builder.with_batch_size(8192).build().map_err(not_parquet)?;
    let mut records = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| Error::NotATrace {
            path: path.to_path_buf(),
            reason: format!("damaged Parquet data after row {}: {e}", records.len()),
        })?;
        for i in 0..batch.num_rows() {
            let row = Row {
                path,
                row: records.len() + 1,
                i,
                batch: &batch,
                cols: &cols,
            };
            records.push(row.record(id_prefix)?);
        }
    }
    Ok(BasetenImport { records, unmapped })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow_array::{
        BooleanArray, Float64Array, Int64Array, StringArray, TimestampMillisecondArray,
    };
    use arrow_schema::{Field, Schema};

    /// Writes a Baseten-shaped Parquet file: `rows` of (arrival ms, in, out, ttft ms, duration
    /// ms, cancelled, session).
    #[allow(clippy::type_complexity)]
    pub(crate) fn write_sample(
        path: &Path,
        rows: &[(i64, i64, i64, Option<f64>, f64, bool, &str)],
    ) {
        let schema = Arc::new(Schema::new(vec![
            Field::new(
                "timestamp",
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                false,
            ),
            Field::new("model", DataType::Utf8, true),
            Field::new("input_tokens", DataType::Int64, false),
            Field::new("output_tokens", DataType::Int64, false),
            Field::new("ttft_ms", DataType::Float64, true),
            Field::new("duration_ms", DataType::Float64, false),
            Field::new("cancelled", DataType::Boolean, false),
            Field::new("session_id", DataType::Utf8, true),
            Field::new("region", DataType::Utf8, true),
        ]));
        let col = |f: &dyn Fn(&(i64, i64, i64, Option<f64>, f64, bool, &str)) -> i64| {
            Int64Array::from(rows.iter().map(f).collect::<Vec<_>>())
        };
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(
                    TimestampMillisecondArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())
                        .with_timezone("UTC"),
                ),
                Arc::new(StringArray::from(vec![Some("llama"); rows.len()])),
                Arc::new(col(&|r| r.1)),
                Arc::new(col(&|r| r.2)),
                Arc::new(Float64Array::from(
                    rows.iter().map(|r| r.3).collect::<Vec<_>>(),
                )),
                Arc::new(Float64Array::from(
                    rows.iter().map(|r| r.4).collect::<Vec<_>>(),
                )),
                Arc::new(BooleanArray::from(
                    rows.iter().map(|r| r.5).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(
                    rows.iter().map(|r| Some(r.6)).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(vec![Some("us-east"); rows.len()])),
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

    #[test]
    fn rows_ttft_and_cancels_import_and_unread_columns_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.parquet");
        write_sample(
            &p,
            &[
                (1_700_000_000_000, 100, 20, Some(35.5), 400.0, false, "s1"),
                (1_700_000_000_250, 50, 3, Some(20.0), 90.25, true, "s2"),
                (1_700_000_001_000, 10, 0, None, 5.0, true, "s2"),
            ],
        );
        let b = import(&p, "b").unwrap();
        assert_eq!(b.unmapped, vec!["region".to_string()]);
        let r = &b.records;
        assert_eq!(r[0].arrival_time_us, 1_700_000_000_000_000);
        assert_eq!((r[0].ttft_us, r[0].e2el_us), (Some(35_500), Some(400_000)));
        assert_eq!(r[0].outcome, Outcome::Ok);
        assert_eq!(r[1].outcome, Outcome::ClientCancelled);
        assert_eq!((r[1].ttft_us, r[1].e2el_us), (Some(20_000), Some(90_250)));
        assert_eq!(r[2].ttft_us, None);
        assert_eq!(r[2].request_id, "b:3");
        assert_eq!(r[1].session_id.as_deref(), Some("s2"));
        assert_eq!(r[0].model.as_deref(), Some("llama"));
    }

    /// Damaged pages panic inside the `parquet` crate's decoders (as trace files did): every
    /// byte of a Baseten file flipped in turn gives records or an error naming the file,
    /// never a panic.
    #[test]
    fn damaged_pages_are_errors_naming_the_file_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.parquet");
        let rows: Vec<_> = (0..50)
            .map(|i| {
                (
                    i * 1000,
                    i + 1,
                    i % 7,
                    Some(i as f64),
                    10.0 + i as f64,
                    i % 5 == 0,
                    "s",
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
                let got = std::panic::catch_unwind(|| import(&p, "b"));
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

    #[test]
    fn bad_files_and_values_name_the_file_and_row() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.parquet");
        std::fs::write(&p, b"PAR1 not really").unwrap();
        let e = import(&p, "b").unwrap_err().to_string();
        assert!(e.contains("bad.parquet") && e.contains("Parquet"), "{e}");
        write_sample(
            &p,
            &[
                (0, 1, 1, None, 1.0, false, "s"),
                (0, -4, 1, None, 1.0, false, "s"),
            ],
        );
        let e = import(&p, "b").unwrap_err().to_string();
        assert!(e.contains("bad.parquet:2: row 2: input_tokens"), "{e}");
        // A missing column names what it looked for.
        let schema = Arc::new(Schema::new(vec![Field::new(
            "timestamp",
            DataType::Int64,
            false,
        )]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1]))])
            .unwrap();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&p).unwrap(), schema, None)
                .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let e = import(&p, "b").unwrap_err().to_string();
        assert!(
            e.contains("no input tokens column (input_tokens | prompt_tokens)"),
            "{e}"
        );
        // A wrong type: a string where a count belongs.
        let schema = Arc::new(Schema::new(vec![
            Field::new("timestamp", DataType::Float64, false),
            Field::new("input_tokens", DataType::Utf8, false),
            Field::new("output_tokens", DataType::Int64, false),
            Field::new("duration_ms", DataType::Float64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Float64Array::from(vec![1.5])),
                Arc::new(StringArray::from(vec!["ten"])),
                Arc::new(Int64Array::from(vec![1])),
                Arc::new(Float64Array::from(vec![1.0])),
            ],
        )
        .unwrap();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&p).unwrap(), schema, None)
                .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let e = import(&p, "b").unwrap_err().to_string();
        assert!(e.contains("bad.parquet:1: row 1: input_tokens"), "{e}");
    }
}
