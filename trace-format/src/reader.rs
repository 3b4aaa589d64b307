//! Reading trace files: files, directories and glob patterns into one [`Trace`], sorted by
//! arrival.
//!
//! The reader checks the schema version in each file's metadata, requires only the identity
//! columns (`request_id`, `arrival_time`, `endpoint`, `stream`, `outcome`) and reads every
//! other missing column as null or empty, so files from older and newer 1.x writers load. A
//! file with those columns and no llmreplay metadata (a trace filtered in pandas, Polars,
//! DuckDB or Spark and written back) is read too, its version inferred from its columns and
//! what was assumed in [`TraceFile::assumed`]; its Arrow variations are read as ours
//! (`foreign`).
//! It is tolerant of physical types (any integer width, any timestamp unit, large and view
//! strings) and strict about values: an unknown outcome or token source is an error naming
//! the file and row.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::file_meta::FileMeta;
use crate::schema::TraceRecord;

mod columns;
pub(crate) mod file;
mod foreign;
mod guard;
mod pages;

pub use columns::batch_to_records;
pub(crate) use columns::{arrivals, convert, row_keys, RowKey};
pub use file::guarded;
use file::{Columns, OpenFile, Source};

/// One file of a [`Trace`].
#[derive(Debug, Clone, PartialEq)]
pub struct TraceFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its provenance metadata.
    pub meta: FileMeta,
    /// Its number of rows.
    pub rows: usize,
    /// The schema version written in it, e.g. `1.0`.
    pub schema_version: String,
    /// The version of the tool that wrote it, when recorded.
    pub tool_version: Option<String>,
    /// What the reader assumed reading it, when it had to: a file another tool wrote from
    /// llmreplay's columns without llmreplay's metadata (pandas, Polars, DuckDB, Spark) has its
    /// schema version inferred from its columns. A command says it once per file.
    pub assumed: Option<String>,
}

/// Records of one or more trace files, sorted by arrival time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// Every record, sorted by `arrival_time_us` (stable: file order breaks ties).
    pub records: Vec<TraceRecord>,
    /// The files read, in reading order.
    pub files: Vec<TraceFile>,
}

impl Trace {
    /// The trace's content hash: [`content_hash`] of its records in order.
    pub fn content_hash(&self) -> String {
        content_hash(
            self.records
                .iter()
                .map(|r| (r.request_id.as_str(), r.arrival_time_us)),
        )
    }
}

/// A stable hash (FNV-1a, 64 bits, hex) of the (request id, arrival time) of every row, in
/// the order given (arrival order, as [`Trace::records`] and
/// [`TraceStream::records`](crate::stream::TraceStream::records) yield them): what a result
/// names its trace by.
pub fn content_hash<'a>(rows: impl IntoIterator<Item = (&'a str, i64)>) -> String {
    let mut h = ContentHash::default();
    for (id, at) in rows {
        h.add(id, at);
    }
    h.finish()
}

/// [`content_hash`], one row at a time (for rows that are streamed rather than held).
#[derive(Debug, Clone, Copy)]
pub struct ContentHash(u64);

impl Default for ContentHash {
    fn default() -> Self {
        ContentHash(crate::fnv::OFFSET)
    }
}

impl ContentHash {
    /// Adds the next row: its request id and arrival time.
    pub fn add(&mut self, id: &str, arrival_us: i64) {
        self.0 = crate::fnv::fnv1a(self.0, id.as_bytes());
        self.0 = crate::fnv::fnv1a(self.0, &arrival_us.to_le_bytes());
    }

    /// The hash, hex.
    pub fn finish(&self) -> String {
        format!("{:016x}", self.0)
    }
}

/// Reads traces from local inputs that are files, directories (every `*.parquet` below them,
/// recursively, sorted by path) or glob patterns. A file named twice is read once. (The
/// `store` crate's `read_traces` also reads object-store URLs, through [`read_traces_with`].)
///
/// Errors: an input matching nothing → [`Error::NoFiles`]; a file of another major schema
/// version → [`Error::UnsupportedVersion`]; a Parquet file without llmreplay metadata or
/// without a required column → [`Error::NotATrace`]; an unreadable or corrupt file →
/// [`Error::Format`] naming it; files hashed under different keys →
/// [`Error::KeysDiffer`] ([`crate::file_meta::one_key`]).
pub fn read_traces<S: AsRef<str>>(inputs: &[S]) -> Result<Trace> {
    read_traces_with(inputs, &LocalOnly)
}

/// Trace files somewhere other than the local file system (an object store): the inputs
/// it claims are listed and fetched through it instead of read from disk.
pub trait RemoteFiles {
    /// Whether `input` names a location of this source rather than a local path.
    fn claims(&self, input: &str) -> bool;
    /// The trace files `input` names, sorted, each with its name (a URL, unique per file).
    fn list(&self, input: &str) -> Result<Vec<RemoteFile>>;
}

/// One trace file of a [`RemoteFiles`] source.
pub struct RemoteFile {
    /// What errors and [`TraceFile::path`] call it (its URL).
    pub name: String,
    /// Fetches its whole content; called once per read of the file (a
    /// [`TraceStream`](crate::stream::TraceStream) reads a file more than once).
    pub fetch: Box<dyn Fn() -> Result<bytes::Bytes> + Send + Sync>,
}

/// No source besides the local file system.
pub(crate) struct LocalOnly;

impl RemoteFiles for LocalOnly {
    fn claims(&self, _input: &str) -> bool {
        false
    }
    fn list(&self, _input: &str) -> Result<Vec<RemoteFile>> {
        Ok(Vec::new())
    }
}

/// [`read_traces`], with the inputs `remote` claims listed and fetched through it.
pub fn read_traces_with<S: AsRef<str>>(inputs: &[S], remote: &dyn RemoteFiles) -> Result<Trace> {
    let mut trace = Trace::default();
    for source in sources(inputs, remote)? {
        let (file, records) = read_source(&source)?;
        trace.files.push(file);
        trace.records.extend(records);
    }
    crate::file_meta::one_key(trace.files.iter().map(|f| (f.path.as_path(), &f.meta)))?;
    trace.records.sort_by_key(|r| r.arrival_time_us);
    Ok(trace)
}

/// The files the inputs name, in reading order, each once: the expansion, deduplication and
/// errors of [`read_traces_with`].
pub(crate) fn sources<S: AsRef<str>>(
    inputs: &[S],
    remote: &dyn RemoteFiles,
) -> Result<Vec<Source>> {
    let mut seen = HashSet::new();
    let mut sources = Vec::new();
    for input in inputs {
        let input = input.as_ref();
        if remote.claims(input) {
            let found = remote.list(input)?;
            if found.is_empty() {
                return Err(Error::NoFiles(input.to_string()));
            }
            for file in found {
                if seen.insert(PathBuf::from(&file.name)) {
                    sources.push(Source::Remote(file));
                }
            }
            continue;
        }
        let found = expand_input(input)?;
        if found.is_empty() {
            return Err(Error::NoFiles(input.to_string()));
        }
        for p in found {
            let key = fs::canonicalize(&p).unwrap_or_else(|_| p.clone());
            if seen.insert(key) {
                sources.push(Source::Local(p));
            }
        }
    }
    if sources.is_empty() {
        return Err(Error::NoFiles(String::new()));
    }
    Ok(sources)
}

/// The files an input names: itself, the `*.parquet` files below a directory, or the
/// matches of a glob pattern.
fn expand_input(input: &str) -> Result<Vec<PathBuf>> {
    let path = Path::new(input);
    if path.is_dir() {
        let mut out = Vec::new();
        walk_dir(path, &mut out)?;
        out.sort();
        return Ok(out);
    }
    if path.exists() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !input.contains(['*', '?', '[']) {
        return Ok(Vec::new());
    }
    let entries = glob::glob(input)
        .map_err(|e| Error::Invalid(format!("{input}: invalid glob pattern: {e}")))?;
    let mut out = Vec::new();
    for entry in entries {
        let p = entry.map_err(|e| {
            let path = e.path().to_path_buf();
            Error::io(path, std::io::Error::from(e))
        })?;
        if p.is_dir() {
            let mut inner = Vec::new();
            walk_dir(&p, &mut inner)?;
            inner.sort();
            out.extend(inner);
        } else {
            out.push(p);
        }
    }
    Ok(out)
}

fn walk_dir(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path();
        let ty = entry.file_type().map_err(|e| Error::io(&path, e))?;
        if ty.is_dir() || (ty.is_symlink() && path.is_dir()) {
            walk_dir(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "parquet") {
            out.push(path);
        }
    }
    Ok(())
}

/// Reads one trace file held in memory (`name` is what errors and [`TraceFile::path`] call
/// it): its metadata and its records in file order, with every check [`read_traces`] makes.
/// Damaged bytes are an error naming `name`, never a panic.
pub fn read_trace_bytes(data: bytes::Bytes, name: &Path) -> Result<(TraceFile, Vec<TraceRecord>)> {
    read_parquet(&OpenFile::of_bytes(data, name)?)
}

/// Reads one source whole: its metadata and its records in file order.
fn read_source(source: &Source) -> Result<(TraceFile, Vec<TraceRecord>)> {
    read_parquet(&OpenFile::open(source)?)
}

/// Batch size of a whole-file read.
const READ_BATCH_ROWS: usize = 8 * 1024;

/// Reads one opened file (named, in errors and in [`TraceFile::path`], by its path or, for
/// an object, its URL): its records in file order.
///
/// Damaged bytes are [`Error::Format`] naming the file, never a panic. The `parquet` crate
/// panics on some damaged pages inside its own decoders (a definition-level run longer than
/// the page, a dictionary index into an empty dictionary, a truncated delta-encoded string;
/// the files under `tests/fuzz-regressions/parquet/` are such pages), before any array
/// reaches us, so no check of ours can come first. Every call into the decoder (the footer,
/// each row group's page check, each batch) therefore runs under
/// [`std::panic::catch_unwind`] as the last line of defense ([`file::guarded`]), and a panic
/// in it becomes an error naming the file (the panic's message is kept in it, and kept off
/// stderr by [`guard::install_quiet_hook`]). That is sound here: the decode owns everything
/// it touches (the reader, the buffers it allocates, the records it builds), all dropped on
/// the unwind, so nothing half-updated is observed afterwards. Arrays the decoder does
/// return are validated in full (`ArrayData::validate_full`: offsets, lengths, bitmaps,
/// UTF-8) before any value is read from them. This relies on unwinding: a build with
/// `panic = "abort"` would lose the conversion.
fn read_parquet(file: &OpenFile) -> Result<(TraceFile, Vec<TraceRecord>)> {
    let mut records = Vec::new();
    for batch in file.batches(Columns::All, READ_BATCH_ROWS)? {
        let (first_row, batch) = batch?;
        records.extend(convert(&batch, file.name(), first_row)?);
    }
    // What the stream trusts the footer for, checked here too, so both readers refuse a
    // file whose footer misstates its rows: their count (a mutated page once read as 200
    // rows of a footer's 202, and only the stream refused it), then their order.
    if records.len() != file.info.rows {
        return Err(Error::format(
            file.name(),
            format!(
                "damaged file: its footer misstates its rows ({} rows; the footer says {})",
                records.len(),
                file.info.rows
            ),
        ));
    }
    let info = file.info.clone();
    let mut meter = crate::order::OrderMeter::default();
    records.iter().for_each(|r| meter.add(r.arrival_time_us));
    crate::order::Claim::of(file.footer(), info.rows, file.name())?
        .check(meter.order(), file.name())?;
    Ok((info, records))
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::sync::Arc;

    use arrow_array::{
        BooleanArray, Int64Array, RecordBatch, StringArray, TimestampNanosecondArray,
    };
    use arrow_schema::{DataType, Field, Schema, TimeUnit};
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::KeyValue;
    use parquet::file::properties::WriterProperties;

    use super::*;
    use crate::encode::{records_to_batch, write_trace_file};
    use crate::schema::{col, meta, Outcome, Producer};
    use crate::test_records::{full_record, test_meta};

    /// Writes a Parquet file with the given batch and metadata, bypassing our writer.
    fn write_raw(path: &Path, batch: &RecordBatch, kv: Vec<KeyValue>) {
        let props = WriterProperties::builder()
            .set_key_value_metadata(Some(kv))
            .build();
        let mut w =
            ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(batch).unwrap();
        w.close().unwrap();
    }

    fn kv_version(v: &str) -> Vec<KeyValue> {
        vec![
            KeyValue::new(meta::SCHEMA_VERSION.to_string(), v.to_string()),
            KeyValue::new(meta::PRODUCER.to_string(), "import".to_string()),
        ]
    }

    #[test]
    fn write_then_read_is_equal_and_sorted_by_arrival() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.parquet");
        let b = dir.path().join("b.parquet");
        let ra: Vec<_> = [0, 2, 4].into_iter().map(full_record).collect();
        let rb: Vec<_> = [1, 3].into_iter().map(full_record).collect();
        write_trace_file(&a, &ra, &test_meta()).unwrap();
        write_trace_file(&b, &rb, &test_meta()).unwrap();
        let t = read_traces(&[a.to_str().unwrap(), b.to_str().unwrap()]).unwrap();
        let expected: Vec<_> = (0..5).map(full_record).collect();
        assert_eq!(t.records, expected);
        assert_eq!(t.files.len(), 2);
        assert_eq!(t.files[0].rows, 3);
        assert_eq!(t.files[0].schema_version, crate::SCHEMA_VERSION);
        assert_eq!(
            t.files[0].tool_version.as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn directories_are_read_recursively_and_globs_expand() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        write_trace_file(
            &dir.path().join("a.parquet"),
            &[full_record(0)],
            &test_meta(),
        )
        .unwrap();
        write_trace_file(&sub.join("b.parquet"), &[full_record(1)], &test_meta()).unwrap();
        fs::write(dir.path().join("notes.txt"), b"ignored").unwrap();

        let t = read_traces(&[dir.path().to_str().unwrap()]).unwrap();
        assert_eq!(t.records.len(), 2);
        let names: Vec<_> = t.files.iter().map(|f| f.path.clone()).collect();
        assert_eq!(
            names,
            vec![dir.path().join("a.parquet"), sub.join("b.parquet")]
        );

        let pattern = format!("{}/*.parquet", dir.path().display());
        let t = read_traces(&[pattern.as_str()]).unwrap();
        assert_eq!(t.records, vec![full_record(0)]);

        // The same file through two inputs is read once.
        let t = read_traces(&[pattern.as_str(), dir.path().to_str().unwrap()]).unwrap();
        assert_eq!(t.records.len(), 2);

        let none = format!("{}/*.nothing", dir.path().display());
        assert!(matches!(read_traces(&[none.as_str()]), Err(Error::NoFiles(p)) if p == none));
        let empty = dir.path().join("empty");
        fs::create_dir(&empty).unwrap();
        assert!(matches!(
            read_traces(&[empty.to_str().unwrap()]),
            Err(Error::NoFiles(_))
        ));
    }

    #[test]
    fn missing_file_is_no_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nope.parquet");
        let err = read_traces(&[p.to_str().unwrap()]).unwrap_err();
        assert!(
            matches!(&err, Error::NoFiles(s) if s.ends_with("nope.parquet")),
            "{err}"
        );
    }

    #[test]
    fn non_parquet_and_truncated_files_are_format_errors_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("junk.parquet");
        fs::write(&p, b"this is not parquet at all").unwrap();
        let err = read_traces(&[p.to_str().unwrap()]).unwrap_err();
        assert!(
            matches!(&err, Error::Format { path, .. } if path == &p),
            "{err}"
        );

        let good = dir.path().join("good.parquet");
        write_trace_file(&good, &[full_record(0)], &test_meta()).unwrap();
        let bytes = fs::read(&good).unwrap();
        let cut = dir.path().join("cut.parquet");
        fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let err = read_traces(&[cut.to_str().unwrap()]).unwrap_err();
        assert!(
            matches!(&err, Error::Format { path, .. } if path == &cut),
            "{err}"
        );
    }

    #[test]
    fn version_2_is_unsupported_and_no_version_is_not_a_trace() {
        let dir = tempfile::tempdir().unwrap();
        let batch = records_to_batch(&[full_record(0)]).unwrap();
        let v2 = dir.path().join("v2.parquet");
        write_raw(&v2, &batch, kv_version("2.0"));
        let err = read_traces(&[v2.to_str().unwrap()]).unwrap_err();
        assert!(
            matches!(&err, Error::UnsupportedVersion { found, supported: 1, .. } if found == "2.0"),
            "{err}"
        );

        let v1_7 = dir.path().join("v1_7.parquet");
        write_raw(&v1_7, &batch, kv_version("1.7"));
        let t = read_traces(&[v1_7.to_str().unwrap()]).unwrap();
        assert_eq!(t.files[0].meta.producer, Producer::Import);

        // Our columns without our metadata (pandas, DuckDB, ...) read, the version inferred
        // from the columns and said once in `assumed`; other columns without it do not.
        let plain = dir.path().join("plain.parquet");
        write_raw(&plain, &batch, vec![]);
        let t = read_traces(&[plain.to_str().unwrap()]).unwrap();
        assert_eq!(t.records, vec![full_record(0)]);
        let f = &t.files[0];
        assert_eq!(
            (f.meta.producer, f.schema_version.as_str()),
            (Producer::External, crate::SCHEMA_VERSION)
        );
        let said = f.assumed.as_deref().unwrap();
        assert!(
            said.contains("no llmreplay.schema_version")
                && said.contains("inferred from its columns"),
            "{said}"
        );
        let mut older = batch.clone();
        for name in crate::schema::COLUMNS_SINCE
            .iter()
            .flat_map(|(_, c)| c.iter())
        {
            older.remove_column(older.schema().index_of(name).unwrap());
        }
        write_raw(&plain, &older, vec![]);
        let t = read_traces(&[plain.to_str().unwrap()]).unwrap();
        assert_eq!(t.files[0].schema_version, "1.0");
        let other = RecordBatch::try_from_iter([(
            "x",
            Arc::new(Int64Array::from(vec![1])) as arrow_array::ArrayRef,
        )])
        .unwrap();
        write_raw(&plain, &other, vec![]);
        let err = read_traces(&[plain.to_str().unwrap()]).unwrap_err();
        assert!(
            matches!(&err, Error::NotATrace { reason, .. } if reason.contains("no llmreplay.schema_version") && reason.contains("request_id")),
            "{err}"
        );
    }

    /// Issue 39, polish: `inspect result.json` said "Invalid Parquet file. Corrupt footer";
    /// a file that is not Parquet at all is named for what it is.
    #[test]
    fn json_and_other_files_are_named_for_what_they_are() {
        let dir = tempfile::tempdir().unwrap();
        for (name, body, says) in [
            (
                "result.json",
                "{\n  \"backend\": \"openai\",\n  \"completed\": 3\n}\n",
                "JSON document (a result JSON?",
            ),
            (
                "run.journal",
                "{\"request_id\":\"a\"}\n{\"request_id\":\"b\"}\n",
                "JSON lines",
            ),
            ("empty.parquet", "", "empty"),
            ("notes.txt", "hello", "Parquet's magic bytes"),
        ] {
            let p = dir.path().join(name);
            std::fs::write(&p, body).unwrap();
            let err = read_traces(&[p.to_str().unwrap()]).unwrap_err();
            assert!(
                matches!(&err, Error::Format { message, .. } if message.contains(says)),
                "{name}: {err}"
            );
            assert!(!err.to_string().contains("Corrupt footer"), "{err}");
        }
    }

    #[test]
    fn missing_optional_columns_read_as_null_and_any_timestamp_unit_works() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Schema::new(vec![
            Field::new(col::REQUEST_ID, DataType::Utf8, false),
            Field::new(
                col::ARRIVAL_TIME,
                DataType::Timestamp(TimeUnit::Nanosecond, None),
                false,
            ),
            Field::new(col::ENDPOINT, DataType::Utf8, false),
            Field::new(col::STREAM, DataType::Boolean, false),
            Field::new(col::OUTCOME, DataType::Utf8, false),
            Field::new("a_future_column", DataType::Int64, true),
        ]);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(StringArray::from(vec!["r1", "r2"])),
                Arc::new(TimestampNanosecondArray::from(vec![2_000_999, 1_000_000])),
                Arc::new(StringArray::from(vec!["/v1/completions"; 2])),
                Arc::new(BooleanArray::from(vec![true, false])),
                Arc::new(StringArray::from(vec!["ok", "timeout"])),
                Arc::new(Int64Array::from(vec![Some(1), None])),
            ],
        )
        .unwrap();
        let p = dir.path().join("old.parquet");
        write_raw(&p, &batch, kv_version("1.0"));
        let t = read_traces(&[p.to_str().unwrap()]).unwrap();
        let mut r2 = TraceRecord::new("r2", 1_000, "/v1/completions");
        r2.outcome = Outcome::Timeout;
        let mut r1 = TraceRecord::new("r1", 2_000, "/v1/completions");
        r1.stream = true;
        assert_eq!(t.records, vec![r2, r1]);
    }

    #[test]
    fn missing_required_column_is_not_a_trace() {
        let dir = tempfile::tempdir().unwrap();
        let batch = records_to_batch(&[full_record(0)]).unwrap();
        let idx = batch.schema().index_of(col::OUTCOME).unwrap();
        let mut batch = batch;
        batch.remove_column(idx);
        let p = dir.path().join("no_outcome.parquet");
        write_raw(&p, &batch, kv_version("1.0"));
        let err = read_traces(&[p.to_str().unwrap()]).unwrap_err();
        assert!(
            matches!(&err, Error::NotATrace { reason, .. } if reason.contains("outcome")),
            "{err}"
        );
    }

    #[test]
    fn unknown_outcome_is_an_error_with_path_and_row() {
        let dir = tempfile::tempdir().unwrap();
        let batch = records_to_batch(&[full_record(0), full_record(1)]).unwrap();
        let idx = batch.schema().index_of(col::OUTCOME).unwrap();
        let mut cols = batch.columns().to_vec();
        cols[idx] = Arc::new(StringArray::from(vec!["ok", "exploded"]));
        let batch = RecordBatch::try_new(batch.schema(), cols).unwrap();
        let p = dir.path().join("bad.parquet");
        write_raw(&p, &batch, kv_version("1.0"));
        let err = read_traces(&[p.to_str().unwrap()]).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("bad.parquet") && msg.contains("row 1"),
            "{msg}"
        );
        assert!(msg.contains("exploded"), "{msg}");
    }
}
