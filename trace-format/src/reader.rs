//! Reading trace files: files, directories and glob patterns into one [`Trace`], sorted by
//! arrival.
//!
//! The reader checks the schema version in each file's metadata, requires only the identity
//! columns (`request_id`, `arrival_time`, `endpoint`, `stream`, `outcome`) and reads every
//! other missing column as null or empty, so files from older and newer 1.x writers load.
//! It is tolerant of physical types (any integer width, any timestamp unit, large and view
//! strings) and strict about values: an unknown outcome or token source is an error naming
//! the file and row.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{
    Array, BooleanArray, GenericListArray, LargeStringArray, PrimitiveArray, RecordBatch,
    StringArray, StringViewArray,
};
use arrow_schema::{DataType, Schema, TimeUnit};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::error::{Error, Result};
use crate::schema::{col, meta, Outcome, TokenSource, TraceRecord};
use crate::writer::FileMeta;

/// Columns a file must have to be a trace.
const REQUIRED: [&str; 5] = [
    col::REQUEST_ID,
    col::ARRIVAL_TIME,
    col::ENDPOINT,
    col::STREAM,
    col::OUTCOME,
];

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
}

/// Records of one or more trace files, sorted by arrival time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// Every record, sorted by `arrival_time_us` (stable: file order breaks ties).
    pub records: Vec<TraceRecord>,
    /// The files read, in reading order.
    pub files: Vec<TraceFile>,
}

/// Reads traces from local inputs that are files, directories (every `*.parquet` below them,
/// recursively, sorted by path) or glob patterns. A file named twice is read once. (The
/// `store` crate's `read_traces` also reads object-store URLs, through [`read_traces_with`].)
///
/// Errors: an input matching nothing → [`Error::NoFiles`]; a file of another major schema
/// version → [`Error::UnsupportedVersion`]; a Parquet file without llmreplay metadata or
/// without a required column → [`Error::NotATrace`]; an unreadable or corrupt file →
/// [`Error::Format`] naming it.
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
    /// Fetches its whole content.
    pub fetch: Box<dyn FnOnce() -> Result<bytes::Bytes>>,
}

/// No source besides the local file system.
struct LocalOnly;

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
    let mut trace = Trace::default();
    for source in sources {
        let (file, records) = match source {
            Source::Local(path) => {
                // Read whole: the page check below and the decoder both read it.
                let data = fs::read(&path).map_err(|e| Error::io(&path, e))?;
                read_parquet(bytes::Bytes::from(data), &path)?
            }
            Source::Remote(file) => {
                let bytes = (file.fetch)()?;
                read_parquet(bytes, Path::new(&file.name))?
            }
        };
        trace.files.push(file);
        trace.records.extend(records);
    }
    trace.records.sort_by_key(|r| r.arrival_time_us);
    Ok(trace)
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

/// Where one trace file is read from.
enum Source {
    Local(PathBuf),
    Remote(RemoteFile),
}

/// Reads one trace file held in memory (`name` is what errors and [`TraceFile::path`] call
/// it): its metadata and its records in file order, with every check [`read_traces`] makes.
/// Damaged bytes are an error naming `name`, never a panic.
pub fn read_trace_bytes(data: bytes::Bytes, name: &Path) -> Result<(TraceFile, Vec<TraceRecord>)> {
    read_parquet(data, name)
}

/// Reads one file (named `path` in errors and in [`TraceFile::path`]; an object's URL for
/// an object): its metadata (version checked) and its records in file order.
///
/// Damaged bytes are [`Error::Format`] naming the file, never a panic. The `parquet` crate
/// panics on some damaged pages inside its own decoders (a definition-level run longer than
/// the page, a dictionary index into an empty dictionary, a truncated delta-encoded string;
/// the files under `tests/fuzz-regressions/parquet/` are such pages), before any array
/// reaches us, so no check of ours can come first. The decode of one file therefore runs
/// under [`std::panic::catch_unwind`] as the last line of defense, and a panic in it becomes
/// an error naming the file (the panic's message is kept in it, and kept off stderr by
/// [`guard::install_quiet_hook`]). That is sound here: the decode owns everything it touches
/// (the reader, the buffers it allocates, the records it builds), all dropped on the unwind,
/// so nothing half-updated is observed afterwards. Arrays the decoder does return are
/// validated in full (`ArrayData::validate_full`: offsets, lengths, bitmaps, UTF-8) before
/// any value is read from them. This relies on unwinding: a build with `panic = "abort"`
/// would lose the conversion.
fn read_parquet(file: bytes::Bytes, path: &Path) -> Result<(TraceFile, Vec<TraceRecord>)> {
    guard::install_quiet_hook();
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        guard::quietly(|| decode_parquet(file, path))
    }));
    match decoded {
        Ok(r) => r,
        Err(payload) => {
            let why = guard::take_message().unwrap_or_else(|| guard::payload_message(&payload));
            Err(Error::format(
                path,
                format!("damaged Parquet file: the decoder failed ({why})"),
            ))
        }
    }
}

/// [`read_parquet`] without the panic guard.
fn decode_parquet(file: bytes::Bytes, path: &Path) -> Result<(TraceFile, Vec<TraceRecord>)> {
    check_delta_pages(&file, path)?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| Error::format(path, format!("not a readable Parquet file: {e}")))?;
    let kv = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let file_meta = FileMeta::from_kv(kv, path)?;
    let get = |key: &str| {
        kv.iter()
            .find(|e| e.key == key)
            .and_then(|e| e.value.clone())
    };
    let schema_version = get(meta::SCHEMA_VERSION).unwrap_or_default();
    let tool_version = get(meta::TOOL_VERSION);
    check_required(builder.schema(), path)?;
    let reader = builder
        .with_batch_size(8 * 1024)
        .build()
        .map_err(|e| Error::format(path, e))?;
    let mut records = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| Error::format(path, e))?;
        validate(&batch, path)?;
        let first_row = records.len();
        records.extend(convert(&batch, path, first_row)?);
    }
    let file = TraceFile {
        path: path.to_path_buf(),
        meta: file_meta,
        rows: records.len(),
        schema_version,
        tool_version,
    };
    Ok((file, records))
}

/// Refuses a data page whose `DELTA_*` header claims more values than the page holds.
///
/// The parquet crate allocates what that header claims before decoding (found by
/// `tests/fuzz_parquet.rs`: one damaged byte asked for 137 GB), and a failed allocation
/// aborts the process: no panic, so the guard of [`read_parquet`] cannot catch it. Every page
/// is read (and decompressed) once more for this; only `DELTA_*` pages are looked into. The
/// first header of a page is checked (the lengths of `DELTA_LENGTH_BYTE_ARRAY`, the prefix
/// lengths of `DELTA_BYTE_ARRAY`); the suffix header of `DELTA_BYTE_ARRAY` comes after a
/// whole encoded block and is not.
fn check_delta_pages(data: &bytes::Bytes, path: &Path) -> Result<()> {
    use parquet::basic::Encoding;
    use parquet::column::page::Page;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let damaged = |why: String| Error::format(path, format!("damaged Parquet file: {why}"));
    let reader = SerializedFileReader::new(data.clone())
        .map_err(|e| Error::format(path, format!("not a readable Parquet file: {e}")))?;
    for g in 0..reader.num_row_groups() {
        let rg = reader
            .get_row_group(g)
            .map_err(|e| Error::format(path, e))?;
        for c in 0..rg.num_columns() {
            let descr = rg.metadata().column(c).column_descr_ptr();
            let mut pages = rg
                .get_column_page_reader(c)
                .map_err(|e| Error::format(path, e))?;
            while let Some(page) = pages.get_next_page().map_err(|e| Error::format(path, e))? {
                let (buf, num_values, encoding, values_at) = match &page {
                    Page::DataPage {
                        buf,
                        num_values,
                        encoding,
                        def_level_encoding,
                        rep_level_encoding,
                        ..
                    } => {
                        // Levels of a v1 page: each RLE run set prefixed by its 4-byte length.
                        let mut at = 0usize;
                        for (max, enc) in [
                            (descr.max_rep_level(), rep_level_encoding),
                            (descr.max_def_level(), def_level_encoding),
                        ] {
                            if max > 0 {
                                if *enc != Encoding::RLE {
                                    at = usize::MAX;
                                    break;
                                }
                                let len = buf
                                    .get(at..at + 4)
                                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                                    .ok_or_else(|| damaged("truncated levels".into()))?;
                                at = at.saturating_add(4).saturating_add(len as usize);
                            }
                        }
                        (buf, *num_values, *encoding, at)
                    }
                    Page::DataPageV2 {
                        buf,
                        num_values,
                        encoding,
                        def_levels_byte_len,
                        rep_levels_byte_len,
                        ..
                    } => (
                        buf,
                        *num_values,
                        *encoding,
                        (*def_levels_byte_len as usize)
                            .saturating_add(*rep_levels_byte_len as usize),
                    ),
                    _ => continue,
                };
                if !matches!(
                    encoding,
                    Encoding::DELTA_BINARY_PACKED
                        | Encoding::DELTA_LENGTH_BYTE_ARRAY
                        | Encoding::DELTA_BYTE_ARRAY
                ) || values_at == usize::MAX
                {
                    continue;
                }
                let values = buf
                    .get(values_at..)
                    .ok_or_else(|| damaged("levels longer than the page".into()))?;
                // Header: block size, miniblocks per block, total value count, first value.
                let mut at = 0;
                let mut varint = || -> Option<u64> {
                    let mut v = 0u64;
                    for shift in (0..64).step_by(7) {
                        let b = *values.get(at)?;
                        at += 1;
                        v |= u64::from(b & 0x7f) << shift;
                        if b & 0x80 == 0 {
                            return Some(v);
                        }
                    }
                    None
                };
                let count = varint()
                    .and(varint())
                    .and(varint())
                    .ok_or_else(|| damaged("truncated delta header".into()))?;
                if count > u64::from(num_values) {
                    return Err(damaged(format!(
                        "a {encoding} page of {num_values} values claims {count}"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Checks every array of a decoded batch in full (buffer lengths, offsets, validity bitmaps,
/// UTF-8) so that reading a value from a damaged one is an error here, not a panic or an
/// out-of-bounds read later.
fn validate(batch: &RecordBatch, path: &Path) -> Result<()> {
    for (field, column) in batch.schema_ref().fields().iter().zip(batch.columns()) {
        if column.len() != batch.num_rows() {
            return Err(Error::format(
                path,
                format!(
                    "damaged Parquet file: column {} has {} values for {} rows",
                    field.name(),
                    column.len(),
                    batch.num_rows()
                ),
            ));
        }
        column.to_data().validate_full().map_err(|e| {
            Error::format(
                path,
                format!("damaged Parquet file: column {}: {e}", field.name()),
            )
        })?;
    }
    Ok(())
}

/// The panic guard of [`read_parquet`]: a process-wide panic hook, installed once, that keeps
/// panics raised inside [`quietly`] on this thread off stderr and keeps their message for the
/// error; every other panic goes to the hook that was installed before.
mod guard {
    use std::any::Any;
    use std::cell::{Cell, RefCell};
    use std::sync::Once;

    thread_local! {
        static QUIET: Cell<bool> = const { Cell::new(false) };
        static MESSAGE: RefCell<Option<String>> = const { RefCell::new(None) };
    }

    pub(super) fn install_quiet_hook() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if QUIET.with(Cell::get) {
                    let at = info
                        .location()
                        .map(|l| format!(" at {}:{}", l.file(), l.line()))
                        .unwrap_or_default();
                    let msg = format!("{}{at}", payload_message(info.payload()));
                    MESSAGE.with(|m| *m.borrow_mut() = Some(msg));
                } else {
                    previous(info);
                }
            }));
        });
    }

    /// Runs `f` with this thread's panics kept quiet (restored on return and on unwind).
    pub(super) fn quietly<T>(f: impl FnOnce() -> T) -> T {
        struct Reset(bool);
        impl Drop for Reset {
            fn drop(&mut self) {
                QUIET.with(|q| q.set(self.0));
            }
        }
        let _reset = Reset(QUIET.with(|q| q.replace(true)));
        MESSAGE.with(|m| m.borrow_mut().take());
        f()
    }

    /// The message of the last quiet panic on this thread.
    pub(super) fn take_message() -> Option<String> {
        MESSAGE.with(|m| m.borrow_mut().take())
    }

    pub(super) fn payload_message(p: &(dyn Any + Send)) -> String {
        p.downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into())
    }
}

fn check_required(schema: &Schema, path: &Path) -> Result<()> {
    for name in REQUIRED {
        if schema.field_with_name(name).is_err() {
            return Err(Error::NotATrace {
                path: path.to_path_buf(),
                reason: format!("required column {name} is missing"),
            });
        }
    }
    Ok(())
}

/// Converts one Arrow batch of a trace file to records. Columns are found by name; missing
/// optional columns read as null (lists as empty, byte counts as 0).
pub fn batch_to_records(batch: &RecordBatch, path: &Path) -> Result<Vec<TraceRecord>> {
    convert(batch, path, 0)
}

fn convert(batch: &RecordBatch, path: &Path, first_row: usize) -> Result<Vec<TraceRecord>> {
    let cx = Cx {
        batch,
        path,
        first_row,
    };
    check_required(batch.schema_ref(), path)?;
    let request_id = cx.strs(col::REQUEST_ID)?;
    let session_id = cx.strs(col::SESSION_ID)?;
    let arrival = cx.times(col::ARRIVAL_TIME)?;
    let endpoint = cx.strs(col::ENDPOINT)?;
    let model = cx.strs(col::MODEL)?;
    let stream = cx.bools(col::STREAM)?;
    let prompt_tokens = cx.ints(col::PROMPT_TOKENS)?;
    let output_tokens = cx.ints(col::OUTPUT_TOKENS)?;
    let max_tokens = cx.ints(col::MAX_TOKENS)?;
    let prompt_src = cx.strs(col::PROMPT_TOKENS_SOURCE)?;
    let output_src = cx.strs(col::OUTPUT_TOKENS_SOURCE)?;
    let status = cx.ints(col::STATUS)?;
    let outcome = cx.strs(col::OUTCOME)?;
    let error = cx.strs(col::ERROR)?;
    let ttft = cx.ints(col::TTFT_US)?;
    let e2el = cx.ints(col::E2EL_US)?;
    let chunk_times = cx.lists(col::CHUNK_TIMES_US)?;
    let chunk_tokens = cx.lists(col::CHUNK_TOKENS)?;
    let body = cx.strs(col::BODY)?;
    let prefix_hashes = cx.lists(col::PREFIX_HASHES)?;
    let request_bytes = cx.ints(col::REQUEST_BYTES)?;
    let response_bytes = cx.ints(col::RESPONSE_BYTES)?;
    let scheduled = cx.ints(col::SCHEDULED_OFFSET_US)?;
    let dispatch_lag = cx.ints(col::DISPATCH_LAG_US)?;
    let queue = cx.ints(col::QUEUE_US)?;
    let new_connection = cx.bools(col::NEW_CONNECTION)?;
    let connect = cx.ints(col::CONNECT_US)?;
    let target = cx.strs(col::TARGET)?;
    let run_id = cx.strs(col::RUN_ID)?;

    let mut out = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        let s = |c: &Strs<'_>| c.get(i).map(str::to_string);
        let required_str = |c: &Strs<'_>, name: &str| {
            c.get(i)
                .map(str::to_string)
                .ok_or_else(|| cx.bad(i, name, "null in a required column"))
        };
        let i64_of = |c: &Ints<'_>, name: &str| -> Result<Option<i64>> {
            c.get(i)
                .map(|v| i64::try_from(v).map_err(|_| cx.bad(i, name, "value out of range")))
                .transpose()
        };
        let source = |c: &Strs<'_>, name: &str| -> Result<Option<TokenSource>> {
            c.get(i)
                .map(|v| v.parse::<TokenSource>().map_err(|e| cx.bad(i, name, &e)))
                .transpose()
        };
        let outcome_str = outcome
            .get(i)
            .ok_or_else(|| cx.bad(i, col::OUTCOME, "null in a required column"))?;
        let rec = TraceRecord {
            request_id: required_str(&request_id, col::REQUEST_ID)?,
            session_id: s(&session_id),
            arrival_time_us: arrival
                .get(i)
                .ok_or_else(|| cx.bad(i, col::ARRIVAL_TIME, "null in a required column"))?,
            endpoint: required_str(&endpoint, col::ENDPOINT)?,
            model: s(&model),
            stream: bool_at(stream, i)
                .ok_or_else(|| cx.bad(i, col::STREAM, "null in a required column"))?,
            prompt_tokens: i64_of(&prompt_tokens, col::PROMPT_TOKENS)?,
            output_tokens: i64_of(&output_tokens, col::OUTPUT_TOKENS)?,
            max_tokens: i64_of(&max_tokens, col::MAX_TOKENS)?,
            prompt_tokens_source: source(&prompt_src, col::PROMPT_TOKENS_SOURCE)?,
            output_tokens_source: source(&output_src, col::OUTPUT_TOKENS_SOURCE)?,
            status: status
                .get(i)
                .map(|v| u16::try_from(v).map_err(|_| cx.bad(i, col::STATUS, "not an HTTP status")))
                .transpose()?,
            outcome: outcome_str
                .parse::<Outcome>()
                .map_err(|e| cx.bad(i, col::OUTCOME, &e))?,
            error: s(&error),
            ttft_us: i64_of(&ttft, col::TTFT_US)?,
            e2el_us: i64_of(&e2el, col::E2EL_US)?,
            chunk_times_us: chunk_times
                .get::<i64>(i, &cx, col::CHUNK_TIMES_US)?
                .unwrap_or_default(),
            chunk_tokens: chunk_tokens.get::<i32>(i, &cx, col::CHUNK_TOKENS)?,
            body: s(&body),
            prefix_hashes: prefix_hashes.get::<u64>(i, &cx, col::PREFIX_HASHES)?,
            request_bytes: i64_of(&request_bytes, col::REQUEST_BYTES)?.unwrap_or(0),
            response_bytes: i64_of(&response_bytes, col::RESPONSE_BYTES)?.unwrap_or(0),
            scheduled_offset_us: i64_of(&scheduled, col::SCHEDULED_OFFSET_US)?,
            dispatch_lag_us: i64_of(&dispatch_lag, col::DISPATCH_LAG_US)?,
            queue_us: i64_of(&queue, col::QUEUE_US)?,
            new_connection: bool_at(new_connection, i),
            connect_us: i64_of(&connect, col::CONNECT_US)?,
            target: s(&target),
            run_id: s(&run_id),
        };
        out.push(rec);
    }
    Ok(out)
}

/// Conversion context: the batch, its file, and the file row of its first row.
struct Cx<'a> {
    batch: &'a RecordBatch,
    path: &'a Path,
    first_row: usize,
}

impl<'a> Cx<'a> {
    fn column(&self, name: &str) -> Option<&'a dyn Array> {
        let idx = self.batch.schema_ref().index_of(name).ok()?;
        Some(self.batch.column(idx).as_ref())
    }

    fn wrong_type(&self, name: &str, found: &DataType, expected: &str) -> Error {
        Error::NotATrace {
            path: self.path.to_path_buf(),
            reason: format!("column {name} has type {found}, expected {expected}"),
        }
    }

    fn bad(&self, row: usize, name: &str, message: &str) -> Error {
        Error::Format {
            path: self.path.to_path_buf(),
            message: format!("row {}, column {name}: {message}", self.first_row + row),
        }
    }

    fn strs(&self, name: &str) -> Result<Strs<'a>> {
        let Some(a) = self.column(name) else {
            return Ok(Strs::Missing);
        };
        match a.data_type() {
            DataType::Utf8 => Ok(Strs::Utf8(a.as_string::<i32>())),
            DataType::LargeUtf8 => Ok(Strs::Large(a.as_string::<i64>())),
            DataType::Utf8View => Ok(Strs::View(a.as_string_view())),
            dt => Err(self.wrong_type(name, dt, "a string")),
        }
    }

    fn bools(&self, name: &str) -> Result<Option<&'a BooleanArray>> {
        let Some(a) = self.column(name) else {
            return Ok(None);
        };
        a.as_boolean_opt()
            .map(Some)
            .ok_or_else(|| self.wrong_type(name, a.data_type(), "a boolean"))
    }

    fn ints(&self, name: &str) -> Result<Ints<'a>> {
        let Some(a) = self.column(name) else {
            return Ok(Ints::Missing);
        };
        Ints::of(a).ok_or_else(|| self.wrong_type(name, a.data_type(), "an integer"))
    }

    fn times(&self, name: &str) -> Result<Times<'a>> {
        let Some(a) = self.column(name) else {
            return Ok(Times::Missing);
        };
        Ok(match a.data_type() {
            DataType::Timestamp(TimeUnit::Second, _) => {
                Times::Second(a.as_primitive::<TimestampSecondType>())
            }
            DataType::Timestamp(TimeUnit::Millisecond, _) => {
                Times::Milli(a.as_primitive::<TimestampMillisecondType>())
            }
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                Times::Micro(a.as_primitive::<TimestampMicrosecondType>())
            }
            DataType::Timestamp(TimeUnit::Nanosecond, _) => {
                Times::Nano(a.as_primitive::<TimestampNanosecondType>())
            }
            dt => return Err(self.wrong_type(name, dt, "a timestamp")),
        })
    }

    fn lists(&self, name: &str) -> Result<Lists<'a>> {
        let Some(a) = self.column(name) else {
            return Ok(Lists::Missing);
        };
        let expected = "a list of integers";
        match a.data_type() {
            DataType::List(_) => {
                let list = a.as_list::<i32>();
                let values = Ints::of(list.values().as_ref())
                    .ok_or_else(|| self.wrong_type(name, a.data_type(), expected))?;
                Ok(Lists::List(list, values))
            }
            DataType::LargeList(_) => {
                let list = a.as_list::<i64>();
                let values = Ints::of(list.values().as_ref())
                    .ok_or_else(|| self.wrong_type(name, a.data_type(), expected))?;
                Ok(Lists::Large(list, values))
            }
            dt => Err(self.wrong_type(name, dt, expected)),
        }
    }
}

fn bool_at(a: Option<&BooleanArray>, i: usize) -> Option<bool> {
    a.filter(|a| a.is_valid(i)).map(|a| a.value(i))
}

/// A string column of any Arrow string type, or a missing one (all null).
enum Strs<'a> {
    Missing,
    Utf8(&'a StringArray),
    Large(&'a LargeStringArray),
    View(&'a StringViewArray),
}

impl<'a> Strs<'a> {
    fn get(&self, i: usize) -> Option<&'a str> {
        match self {
            Strs::Missing => None,
            Strs::Utf8(a) => a.is_valid(i).then(|| a.value(i)),
            Strs::Large(a) => a.is_valid(i).then(|| a.value(i)),
            Strs::View(a) => a.is_valid(i).then(|| a.value(i)),
        }
    }
}

/// A timestamp column of any unit, read as µs since the epoch.
enum Times<'a> {
    Missing,
    Second(&'a PrimitiveArray<TimestampSecondType>),
    Milli(&'a PrimitiveArray<TimestampMillisecondType>),
    Micro(&'a PrimitiveArray<TimestampMicrosecondType>),
    Nano(&'a PrimitiveArray<TimestampNanosecondType>),
}

impl Times<'_> {
    fn get(&self, i: usize) -> Option<i64> {
        match self {
            Times::Missing => None,
            Times::Second(a) => a.is_valid(i).then(|| a.value(i).saturating_mul(1_000_000)),
            Times::Milli(a) => a.is_valid(i).then(|| a.value(i).saturating_mul(1_000)),
            Times::Micro(a) => a.is_valid(i).then(|| a.value(i)),
            Times::Nano(a) => a.is_valid(i).then(|| a.value(i).div_euclid(1_000)),
        }
    }
}

macro_rules! ints_enum {
    ($($v:ident($t:ty)),* $(,)?) => {
        /// An integer column of any width and signedness, or a missing one (all null).
        enum Ints<'a> {
            Missing,
            $($v(&'a PrimitiveArray<$t>),)*
        }

        impl<'a> Ints<'a> {
            fn of(a: &'a dyn Array) -> Option<Self> {
                $(if let Some(p) = a.as_primitive_opt::<$t>() {
                    return Some(Ints::$v(p));
                })*
                None
            }

            /// The value at `i` (null → None), widened so every integer type fits.
            fn get(&self, i: usize) -> Option<i128> {
                match self {
                    Ints::Missing => None,
                    $(Ints::$v(a) => a.is_valid(i).then(|| i128::from(a.value(i))),)*
                }
            }
        }
    };
}

ints_enum!(
    I8(Int8Type),
    I16(Int16Type),
    I32(Int32Type),
    I64(Int64Type),
    U8(UInt8Type),
    U16(UInt16Type),
    U32(UInt32Type),
    U64(UInt64Type),
);

/// A list-of-integers column, or a missing one (all null).
enum Lists<'a> {
    Missing,
    List(&'a GenericListArray<i32>, Ints<'a>),
    Large(&'a GenericListArray<i64>, Ints<'a>),
}

impl Lists<'_> {
    /// The list at row `i` converted to `T` (null → None); a null or out-of-range item is
    /// an error.
    fn get<T: TryFrom<i128>>(&self, i: usize, cx: &Cx<'_>, name: &str) -> Result<Option<Vec<T>>> {
        let (range, values) = match self {
            Lists::Missing => return Ok(None),
            Lists::List(l, v) => {
                if l.is_null(i) {
                    return Ok(None);
                }
                let o = l.value_offsets();
                (o[i] as usize..o[i + 1] as usize, v)
            }
            Lists::Large(l, v) => {
                if l.is_null(i) {
                    return Ok(None);
                }
                let o = l.value_offsets();
                (o[i] as usize..o[i + 1] as usize, v)
            }
        };
        range
            .map(|j| {
                let v = values
                    .get(j)
                    .ok_or_else(|| cx.bad(i, name, "null list item"))?;
                T::try_from(v).map_err(|_| cx.bad(i, name, &format!("list item {v} out of range")))
            })
            .collect::<Result<Vec<T>>>()
            .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::sync::Arc;

    use arrow_array::{Int64Array, TimestampNanosecondArray};
    use arrow_schema::Field;
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::KeyValue;
    use parquet::file::properties::WriterProperties;

    use super::*;
    use crate::schema::Producer;
    use crate::writer::tests::{full_record, test_meta};
    use crate::writer::{records_to_batch, write_trace_file};

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

        let plain = dir.path().join("plain.parquet");
        write_raw(&plain, &batch, vec![]);
        let err = read_traces(&[plain.to_str().unwrap()]).unwrap_err();
        assert!(matches!(&err, Error::NotATrace { .. }), "{err}");
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
