//! Writing trace files: one-shot ([`write_trace_file`]) and the rotating, crash-safe
//! [`TraceWriter`] that a long-running capture proxy feeds from its own thread.
//!
//! Every file is written under a temporary name (`<name>.tmp`) in its final directory,
//! fsync'd, then renamed, so a `.parquet` file appears under its final name only when it is
//! complete. Files are created with mode 0600 on unix: traces may hold request bodies.
//!
//! # Crash safety of [`TraceWriter`]
//!
//! Each record is appended, as one JSON line, to a journal `<prefix>-<utc>-<seq>.journal`
//! through a buffer, and kept in memory. The buffer is handed to the OS (a `write` syscall,
//! no fsync) when more than `flush_interval` has passed since the previous hand-over (checked
//! on [`TraceWriter::append`]) and on every [`TraceWriter::tick`] that finds it non-empty.
//! When the file is rotated (estimated size ≥ `max_file_bytes`, age ≥ `max_file_age`, or
//! [`TraceWriter::close`]) the records are written to `<same stem>.parquet` and the journal is
//! deleted.
//!
//! **Loss window:** if the process is killed (`kill -9`, a panic with `abort`, OOM kill), the
//! records appended since the last hand-over are lost: at most `flush_interval` of traffic,
//! provided the owner calls `tick` at least every `flush_interval`. The next
//! [`TraceWriter::open`] (or [`recover_dir`]) turns every journal left behind into its
//! `.parquet` file. A power loss can lose more (journals are not fsync'd; finished Parquet
//! files are). A directory must be owned by one writer at a time: recovery takes over every
//! journal it finds there.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::builder::{
    BooleanBuilder, Int32Builder, Int64Builder, ListBuilder, StringBuilder,
    TimestampMicrosecondBuilder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};
use crate::redact;
use crate::schema::{self, meta, Producer, TraceRecord, SCHEMA_MAJOR};

/// Rows per Arrow batch handed to the Parquet writer (bounds the extra memory of a write).
const BATCH_ROWS: usize = 8 * 1024;
/// Rows per Parquet row group.
const ROW_GROUP_ROWS: usize = 64 * 1024;
/// Bytes per Parquet row group (whichever limit is reached first).
const ROW_GROUP_BYTES: usize = 128 * 1024 * 1024;
/// Extension of journal files.
const JOURNAL_EXT: &str = "journal";
/// Suffix appended to a file name while it is being written.
const TMP_SUFFIX: &str = ".tmp";

/// Provenance written into a file's key-value metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    /// Which program wrote the file.
    pub producer: Producer,
    /// The producing command line.
    pub command: String,
    /// For imports: the source file(s) and format.
    pub source: Option<String>,
    /// Block size of `prefix_hashes`, in tokens.
    pub block_size: Option<u32>,
    /// Free-form provenance (`--metadata K=V`, target info), stored under
    /// [`meta::EXTRA_PREFIX`].
    pub extra: BTreeMap<String, String>,
}

impl FileMeta {
    /// Metadata with the given producer and command, and nothing else.
    pub fn new(producer: Producer, command: impl Into<String>) -> Self {
        FileMeta {
            producer,
            command: command.into(),
            source: None,
            block_size: None,
            extra: BTreeMap::new(),
        }
    }

    /// The Parquet key-value pairs: schema and tool versions, producer, command, source,
    /// block size and the extra keys, each value through [`redact::redact_text`].
    pub fn to_kv(&self) -> Vec<KeyValue> {
        let kv =
            |k: &str, v: String| KeyValue::new(k.to_string(), redact::redact_text(&v).into_owned());
        let mut out = vec![
            kv(meta::SCHEMA_VERSION, schema::SCHEMA_VERSION.to_string()),
            kv(meta::PRODUCER, self.producer.as_str().to_string()),
            kv(meta::TOOL_VERSION, env!("CARGO_PKG_VERSION").to_string()),
            kv(meta::COMMAND, self.command.clone()),
        ];
        if let Some(s) = &self.source {
            out.push(kv(meta::SOURCE, s.clone()));
        }
        if let Some(b) = self.block_size {
            out.push(kv(meta::BLOCK_SIZE, b.to_string()));
        }
        for (k, v) in &self.extra {
            out.push(kv(&format!("{}{k}", meta::EXTRA_PREFIX), v.clone()));
        }
        out
    }

    /// Reads the metadata back from a file's key-value pairs, checking the schema version:
    /// no version key → [`Error::NotATrace`], another major version →
    /// [`Error::UnsupportedVersion`]. Unknown `llmreplay.*` keys are ignored.
    pub fn from_kv(kv: &[KeyValue], path: &Path) -> Result<FileMeta> {
        let get = |key: &str| {
            kv.iter()
                .find(|e| e.key == key)
                .and_then(|e| e.value.as_deref())
        };
        let version = get(meta::SCHEMA_VERSION).ok_or_else(|| Error::NotATrace {
            path: path.to_path_buf(),
            reason: format!("no {} in the file metadata", meta::SCHEMA_VERSION),
        })?;
        check_version(version, path)?;
        let producer = get(meta::PRODUCER)
            .ok_or_else(|| Error::NotATrace {
                path: path.to_path_buf(),
                reason: format!("no {} in the file metadata", meta::PRODUCER),
            })?
            .parse::<Producer>()
            .map_err(|e| Error::format(path, format!("{}: {e}", meta::PRODUCER)))?;
        let block_size = get(meta::BLOCK_SIZE)
            .map(|s| {
                s.parse::<u32>()
                    .map_err(|e| Error::format(path, format!("{} {s:?}: {e}", meta::BLOCK_SIZE)))
            })
            .transpose()?;
        let extra = kv
            .iter()
            .filter_map(|e| {
                let k = e.key.strip_prefix(meta::EXTRA_PREFIX)?;
                Some((k.to_string(), e.value.clone().unwrap_or_default()))
            })
            .collect();
        Ok(FileMeta {
            producer,
            command: get(meta::COMMAND).unwrap_or_default().to_string(),
            source: get(meta::SOURCE).map(str::to_string),
            block_size,
            extra,
        })
    }
}

/// Checks that `version` (e.g. `1.0`) has the major version this build reads.
pub(crate) fn check_version(version: &str, path: &Path) -> Result<()> {
    let major = version.split('.').next().unwrap_or_default().trim();
    match major.parse::<u32>() {
        Ok(m) if m == SCHEMA_MAJOR => Ok(()),
        _ => Err(Error::UnsupportedVersion {
            path: path.to_path_buf(),
            found: version.to_string(),
            supported: SCHEMA_MAJOR,
        }),
    }
}

/// Builds one Arrow batch of [`schema::schema()`] from records: the one place that maps
/// record fields to columns, and so where every Parquet file's text columns go through the
/// redaction pass ([`redact::redact_record`]'s rules; borrowed when nothing is redacted).
pub fn records_to_batch(records: &[TraceRecord]) -> Result<RecordBatch> {
    let n = records.len();
    let str_bytes =
        |f: fn(&TraceRecord) -> Option<&str>| records.iter().filter_map(f).map(str::len).sum();
    let str_builder =
        |f: fn(&TraceRecord) -> Option<&str>| StringBuilder::with_capacity(n, str_bytes(f));
    let mut request_id = str_builder(|r| Some(&r.request_id));
    let mut session_id = str_builder(|r| r.session_id.as_deref());
    let mut arrival = TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut endpoint = str_builder(|r| Some(&r.endpoint));
    let mut model = str_builder(|r| r.model.as_deref());
    let mut stream = BooleanBuilder::with_capacity(n);
    let mut prompt_tokens = Int64Builder::with_capacity(n);
    let mut output_tokens = Int64Builder::with_capacity(n);
    let mut max_tokens = Int64Builder::with_capacity(n);
    let mut prompt_src = StringBuilder::with_capacity(n, n * 8);
    let mut output_src = StringBuilder::with_capacity(n, n * 8);
    let mut status = Int32Builder::with_capacity(n);
    let mut outcome = StringBuilder::with_capacity(n, n * 8);
    let mut error = str_builder(|r| r.error.as_deref());
    let mut ttft = Int64Builder::with_capacity(n);
    let mut e2el = Int64Builder::with_capacity(n);
    let chunk_values: usize = records.iter().map(|r| r.chunk_times_us.len()).sum();
    let mut chunk_times = ListBuilder::with_capacity(Int64Builder::with_capacity(chunk_values), n);
    let token_values: usize = records
        .iter()
        .map(|r| r.chunk_tokens.as_ref().map_or(0, Vec::len))
        .sum();
    let mut chunk_tokens = ListBuilder::with_capacity(Int32Builder::with_capacity(token_values), n);
    let mut body = str_builder(|r| r.body.as_deref());
    let hash_values: usize = records
        .iter()
        .map(|r| r.prefix_hashes.as_ref().map_or(0, Vec::len))
        .sum();
    let mut prefix_hashes =
        ListBuilder::with_capacity(UInt64Builder::with_capacity(hash_values), n);
    let mut request_bytes = Int64Builder::with_capacity(n);
    let mut response_bytes = Int64Builder::with_capacity(n);
    let mut scheduled = Int64Builder::with_capacity(n);
    let mut dispatch_lag = Int64Builder::with_capacity(n);
    let mut queue = Int64Builder::with_capacity(n);
    let mut new_connection = BooleanBuilder::with_capacity(n);
    let mut connect = Int64Builder::with_capacity(n);
    let mut target = str_builder(|r| r.target.as_deref());
    let mut run_id = str_builder(|r| r.run_id.as_deref());

    for r in records {
        request_id.append_value(&r.request_id);
        session_id.append_option(r.session_id.as_deref());
        arrival.append_value(r.arrival_time_us);
        endpoint.append_value(redact::redact_text(&r.endpoint));
        model.append_option(r.model.as_deref());
        stream.append_value(r.stream);
        prompt_tokens.append_option(r.prompt_tokens);
        output_tokens.append_option(r.output_tokens);
        max_tokens.append_option(r.max_tokens);
        prompt_src.append_option(r.prompt_tokens_source.map(|s| s.as_str()));
        output_src.append_option(r.output_tokens_source.map(|s| s.as_str()));
        status.append_option(r.status.map(i32::from));
        outcome.append_value(r.outcome.as_str());
        error.append_option(r.error.as_deref().map(redact::redact_text));
        ttft.append_option(r.ttft_us);
        e2el.append_option(r.e2el_us);
        chunk_times.values().append_slice(&r.chunk_times_us);
        chunk_times.append(true);
        match &r.chunk_tokens {
            Some(v) => {
                chunk_tokens.values().append_slice(v);
                chunk_tokens.append(true);
            }
            None => chunk_tokens.append_null(),
        }
        body.append_option(r.body.as_deref().map(redact::redact_json));
        match &r.prefix_hashes {
            Some(v) => {
                prefix_hashes.values().append_slice(v);
                prefix_hashes.append(true);
            }
            None => prefix_hashes.append_null(),
        }
        request_bytes.append_value(r.request_bytes);
        response_bytes.append_value(r.response_bytes);
        scheduled.append_option(r.scheduled_offset_us);
        dispatch_lag.append_option(r.dispatch_lag_us);
        queue.append_option(r.queue_us);
        new_connection.append_option(r.new_connection);
        connect.append_option(r.connect_us);
        target.append_option(r.target.as_deref().map(redact::redact_text));
        run_id.append_option(r.run_id.as_deref());
    }

    // Same order as `schema::schema()`; `RecordBatch::try_new` checks types and nullability.
    let columns: Vec<ArrayRef> = vec![
        Arc::new(request_id.finish()),
        Arc::new(session_id.finish()),
        Arc::new(arrival.finish()),
        Arc::new(endpoint.finish()),
        Arc::new(model.finish()),
        Arc::new(stream.finish()),
        Arc::new(prompt_tokens.finish()),
        Arc::new(output_tokens.finish()),
        Arc::new(max_tokens.finish()),
        Arc::new(prompt_src.finish()),
        Arc::new(output_src.finish()),
        Arc::new(status.finish()),
        Arc::new(outcome.finish()),
        Arc::new(error.finish()),
        Arc::new(ttft.finish()),
        Arc::new(e2el.finish()),
        Arc::new(chunk_times.finish()),
        Arc::new(chunk_tokens.finish()),
        Arc::new(body.finish()),
        Arc::new(prefix_hashes.finish()),
        Arc::new(request_bytes.finish()),
        Arc::new(response_bytes.finish()),
        Arc::new(scheduled.finish()),
        Arc::new(dispatch_lag.finish()),
        Arc::new(queue.finish()),
        Arc::new(new_connection.finish()),
        Arc::new(connect.finish()),
        Arc::new(target.finish()),
        Arc::new(run_id.finish()),
    ];
    RecordBatch::try_new(Arc::new(schema::schema()), columns)
        .map_err(|e| Error::Invalid(format!("building a trace batch: {e}")))
}

/// Writes `records` to a Parquet trace file at `path` (Snappy, row groups of at most 64 Ki
/// rows), under a temporary name in the same directory that is fsync'd and then renamed.
/// The file is created with mode 0600 on unix. An existing file at `path` is replaced.
pub fn write_trace_file(path: &Path, records: &[TraceRecord], meta: &FileMeta) -> Result<()> {
    let tmp = tmp_path(path);
    let result = write_tmp_then_rename(&tmp, path, records, meta);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn write_tmp_then_rename(
    tmp: &Path,
    path: &Path,
    records: &[TraceRecord],
    meta: &FileMeta,
) -> Result<()> {
    let file = create_private(tmp, false)?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
        .set_key_value_metadata(Some(meta.to_kv()))
        .build();
    let mut writer = ArrowWriter::try_new(file, Arc::new(schema::schema()), Some(props))
        .map_err(|e| Error::format(path, e))?;
    for chunk in records.chunks(BATCH_ROWS) {
        let batch = records_to_batch(chunk)?;
        writer.write(&batch).map_err(|e| Error::format(path, e))?;
    }
    let file = writer.into_inner().map_err(|e| Error::format(path, e))?;
    file.sync_all().map_err(|e| Error::io(tmp, e))?;
    drop(file);
    fs::rename(tmp, path).map_err(|e| Error::io(path, e))?;
    sync_parent(path)
}

/// `<path>.tmp`: the name a file has while it is being written.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(TMP_SUFFIX);
    path.with_file_name(name)
}

/// Creates a new file with mode 0600 (unix). With `exclusive`, fails if it exists; otherwise a
/// leftover file is removed first so the mode always applies.
fn create_private(path: &Path, exclusive: bool) -> Result<File> {
    if !exclusive {
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(path, e)),
        }
    }
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts.open(path).map_err(|e| Error::io(path, e))
}

/// Makes a rename or removal in `path`'s directory durable.
fn sync_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => sync_dir(p),
        _ => sync_dir(Path::new(".")),
    }
}

/// fsyncs a directory (no-op where unsupported).
fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Configuration of a [`TraceWriter`].
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Directory of the trace files (created, mode 0700 on unix, if missing).
    pub dir: PathBuf,
    /// File name prefix: files are `<prefix>-<utc timestamp>-<seq>.parquet`.
    pub prefix: String,
    /// Rotate when the estimated size of the records reaches this many bytes.
    pub max_file_bytes: u64,
    /// Rotate when the current file is this old.
    pub max_file_age: Duration,
    /// Longest time a record stays in the process's buffer before it is handed to the OS:
    /// the loss window of a crash (default 200 ms).
    pub flush_interval: Duration,
    /// Provenance written into every file.
    pub meta: FileMeta,
    /// Also rotate when the UTC hour changes, so every file holds the records of one hour
    /// only (the file name's stamp names that hour): for Hive partitions by date and hour.
    pub rotate_on_hour: bool,
}

impl WriterConfig {
    /// A configuration with defaults: 256 MiB files, rotated hourly, flushed every 200 ms.
    pub fn new(dir: impl Into<PathBuf>, prefix: impl Into<String>, meta: FileMeta) -> Self {
        WriterConfig {
            dir: dir.into(),
            prefix: prefix.into(),
            max_file_bytes: 256 * 1024 * 1024,
            max_file_age: Duration::from_secs(3600),
            flush_interval: Duration::from_millis(200),
            meta,
            rotate_on_hour: false,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.prefix.is_empty() || self.prefix.contains(['/', '\\']) {
            return Err(Error::Invalid(format!(
                "trace file prefix {:?} must be a non-empty file name",
                self.prefix
            )));
        }
        if self.max_file_bytes == 0 {
            return Err(Error::Invalid("max_file_bytes must be > 0".into()));
        }
        if self.max_file_age.is_zero() {
            return Err(Error::Invalid("max_file_age must be > 0".into()));
        }
        Ok(())
    }
}

/// What [`recover_dir`] found and finished.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The Parquet files finished from journals left behind.
    pub files: Vec<PathBuf>,
    /// Records recovered into them.
    pub records: usize,
    /// Torn final lines (a record cut short by the crash) that were dropped.
    pub torn_lines: usize,
}

/// The file currently being written: its journal and the records kept in memory.
struct Segment {
    journal_path: PathBuf,
    parquet_path: PathBuf,
    journal: BufWriter<File>,
    records: Vec<TraceRecord>,
    bytes: u64,
    opened: Instant,
    /// UTC hours since the epoch when the segment was started (its name's stamp).
    hour: i64,
    last_flush: Instant,
    dirty: bool,
}

impl Segment {
    fn flush(&mut self) -> Result<()> {
        if self.dirty {
            self.journal
                .flush()
                .map_err(|e| Error::io(&self.journal_path, e))?;
            self.dirty = false;
        }
        self.last_flush = Instant::now();
        Ok(())
    }
}

/// A rotating, crash-safe trace writer (synchronous; give it its own thread). See the
/// module documentation for the journal and the loss window.
///
/// Dropping it without [`close`](TraceWriter::close) hands buffered records to the OS and
/// leaves the journal for the next [`open`](TraceWriter::open) to recover.
pub struct TraceWriter {
    cfg: WriterConfig,
    current: Option<Segment>,
    finished: Vec<PathBuf>,
    seq: u64,
    line: Vec<u8>,
}

impl std::fmt::Debug for TraceWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("dir", &self.cfg.dir)
            .field("prefix", &self.cfg.prefix)
            .field("current", &self.current.as_ref().map(|s| &s.journal_path))
            .field("finished", &self.finished)
            .finish()
    }
}

impl TraceWriter {
    /// Creates `cfg.dir` if needed, recovers journals left there by a previous crash (see
    /// [`recover_dir`]), and returns a writer with no file open yet.
    pub fn open(cfg: WriterConfig) -> Result<(TraceWriter, RecoveryReport)> {
        cfg.validate()?;
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        builder
            .create(&cfg.dir)
            .map_err(|e| Error::io(&cfg.dir, e))?;
        let report = recover_dir(&cfg.dir, &cfg.meta)?;
        let writer = TraceWriter {
            cfg,
            current: None,
            finished: Vec::new(),
            seq: 0,
            line: Vec::with_capacity(4096),
        };
        Ok((writer, report))
    }

    /// Appends one record (to the journal buffer and to memory), flushing the buffer to the
    /// OS if `flush_interval` has passed and rotating if the size limit is reached.
    ///
    /// An error from the rotation comes after the record was kept (in memory and in the
    /// journal): do not append it again. The rotation is retried by the next `append`,
    /// `tick` or `close`, and the journal is recovered by the next `open` if it never succeeds.
    pub fn append(&mut self, mut rec: TraceRecord) -> Result<()> {
        redact::redact_record(&mut rec);
        if self.hour_changed() {
            self.rotate()?;
        }
        if self.current.is_none() {
            self.current = Some(self.start_segment()?);
        }
        let Some(seg) = self.current.as_mut() else {
            return Err(Error::Invalid("no current trace file".into()));
        };
        self.line.clear();
        serde_json::to_writer(&mut self.line, &rec)
            .map_err(|e| Error::format(&seg.journal_path, e))?;
        self.line.push(b'\n');
        seg.journal
            .write_all(&self.line)
            .map_err(|e| Error::io(&seg.journal_path, e))?;
        seg.dirty = true;
        seg.bytes += rec.approx_bytes() as u64;
        seg.records.push(rec);
        if seg.last_flush.elapsed() >= self.cfg.flush_interval {
            seg.flush()?;
        }
        if seg.bytes >= self.cfg.max_file_bytes {
            self.rotate()?;
        }
        Ok(())
    }

    /// Hands buffered records to the OS and rotates the file if it is older than
    /// `max_file_age`. Call it at least every `flush_interval`.
    pub fn tick(&mut self) -> Result<()> {
        let hour_changed = self.hour_changed();
        let Some(seg) = self.current.as_mut() else {
            return Ok(());
        };
        seg.flush()?;
        if seg.opened.elapsed() >= self.cfg.max_file_age || hour_changed {
            self.rotate()?;
        }
        Ok(())
    }

    /// With `rotate_on_hour`: whether the current file was started in an earlier UTC hour.
    fn hour_changed(&self) -> bool {
        self.cfg.rotate_on_hour
            && self
                .current
                .as_ref()
                .is_some_and(|seg| seg.hour != utc_hour(chrono::Utc::now()))
    }

    /// Files finished so far.
    pub fn finished(&self) -> &[PathBuf] {
        &self.finished
    }

    /// Finishes the current file and returns every file this writer finished, in order.
    pub fn close(mut self) -> Result<Vec<PathBuf>> {
        self.rotate()?;
        Ok(std::mem::take(&mut self.finished))
    }

    /// Writes the current segment's records to Parquet and deletes its journal. On error the
    /// segment stays current (in memory and in its journal) so nothing is lost.
    fn rotate(&mut self) -> Result<()> {
        let Some(seg) = self.current.as_mut() else {
            return Ok(());
        };
        seg.flush()?;
        write_trace_file(&seg.parquet_path, &seg.records, &self.cfg.meta)?;
        let Some(seg) = self.current.take() else {
            return Ok(());
        };
        let Segment {
            journal_path,
            parquet_path,
            journal,
            ..
        } = seg;
        drop(journal);
        fs::remove_file(&journal_path).map_err(|e| Error::io(&journal_path, e))?;
        self.finished.push(parquet_path);
        Ok(())
    }

    /// Creates the next journal, with a name no file in the directory has yet.
    fn start_segment(&mut self) -> Result<Segment> {
        let wall = chrono::Utc::now();
        let stamp = wall.format("%Y%m%dT%H%M%SZ").to_string();
        loop {
            let stem = format!("{}-{stamp}-{:06}", self.cfg.prefix, self.seq);
            self.seq += 1;
            let journal_path = self.cfg.dir.join(format!("{stem}.{JOURNAL_EXT}"));
            let parquet_path = self.cfg.dir.join(format!("{stem}.parquet"));
            if parquet_path.exists() || tmp_path(&parquet_path).exists() {
                continue;
            }
            let file = match create_private(&journal_path, true) {
                Ok(f) => f,
                Err(Error::Io { cause, .. }) if cause.kind() == io::ErrorKind::AlreadyExists => {
                    continue
                }
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            return Ok(Segment {
                journal_path,
                parquet_path,
                journal: BufWriter::with_capacity(64 * 1024, file),
                records: Vec::new(),
                bytes: 0,
                opened: now,
                hour: utc_hour(wall),
                last_flush: now,
                dirty: false,
            });
        }
    }
}

/// UTC hours since the epoch.
fn utc_hour(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp().div_euclid(3600)
}

/// Finishes what a crashed [`TraceWriter`] left in `dir`: every `*.journal` becomes its
/// `.parquet` (written with `meta` plus the extra key `recovered=journal`) and is deleted,
/// and stale `*.parquet.tmp` files are removed.
///
/// A torn final line (no newline, not valid JSON: the record being written when the process
/// died) is dropped and counted in [`RecoveryReport::torn_lines`]. Any other bad line is an
/// [`Error::BadRow`] naming the journal and line, and that journal is left in place. A
/// journal whose `.parquet` already exists (the crash came between the rename and the
/// deletion) is simply deleted; its file is still reported.
pub fn recover_dir(dir: &Path, meta: &FileMeta) -> Result<RecoveryReport> {
    let mut journals = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.ends_with(&format!(".parquet{TMP_SUFFIX}")) {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(&path, e)),
            }
        } else if path.extension().is_some_and(|e| e == JOURNAL_EXT) && path.is_file() {
            journals.push(path);
        }
    }
    journals.sort();

    let mut meta = meta.clone();
    meta.extra
        .insert("recovered".to_string(), "journal".to_string());
    let mut report = RecoveryReport::default();
    for journal in journals {
        let (records, torn) = read_journal(&journal)?;
        report.torn_lines += torn;
        let parquet = journal.with_extension("parquet");
        if !records.is_empty() {
            if !parquet.exists() {
                write_trace_file(&parquet, &records, &meta)?;
            }
            report.records += records.len();
            report.files.push(parquet);
        }
        fs::remove_file(&journal).map_err(|e| Error::io(&journal, e))?;
    }
    sync_dir(dir)?;
    Ok(report)
}

/// Parses a journal; returns its records and the number of torn final lines (0 or 1).
fn read_journal(path: &Path) -> Result<(Vec<TraceRecord>, usize)> {
    let data = fs::read(path).map_err(|e| Error::io(path, e))?;
    let mut records = Vec::new();
    let mut torn = 0;
    let mut start = 0;
    let mut line_no = 0;
    while start < data.len() {
        line_no += 1;
        let (line, terminated, next) = match memchr::memchr(b'\n', &data[start..]) {
            Some(i) => (&data[start..start + i], true, start + i + 1),
            None => (&data[start..], false, data.len()),
        };
        start = next;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<TraceRecord>(line) {
            Ok(r) => records.push(r),
            Err(_) if !terminated => torn += 1,
            Err(e) => {
                return Err(Error::BadRow {
                    path: path.to_path_buf(),
                    line: line_no,
                    message: format!("corrupt journal line: {e}"),
                })
            }
        }
    }
    Ok((records, torn))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::reader::read_traces;
    use crate::schema::{Outcome, TokenSource};

    /// A record with every optional field set.
    pub(crate) fn full_record(i: i64) -> TraceRecord {
        TraceRecord {
            request_id: format!("req-{i}"),
            session_id: Some(format!("sess-{}", i % 3)),
            arrival_time_us: 1_700_000_000_000_000 + i * 1_000,
            endpoint: "/v1/chat/completions".into(),
            model: Some("llama-3-8b".into()),
            stream: i % 2 == 0,
            prompt_tokens: Some(100 + i),
            output_tokens: Some(20 + i),
            max_tokens: Some(256),
            prompt_tokens_source: Some(TokenSource::Usage),
            output_tokens_source: Some(TokenSource::Estimate),
            status: Some(200),
            outcome: Outcome::HttpError,
            error: Some("boom \"quoted\" ☃".into()),
            ttft_us: Some(12_345),
            e2el_us: Some(456_789),
            chunk_times_us: vec![12_345, 20_000, 456_789],
            chunk_tokens: Some(vec![1, 2, 3]),
            body: Some(r#"{"messages":[]}"#.into()),
            prefix_hashes: Some(vec![u64::MAX, 0, 42]),
            request_bytes: 1234,
            response_bytes: 5678,
            scheduled_offset_us: Some(1_000),
            dispatch_lag_us: Some(-5),
            queue_us: Some(7),
            new_connection: Some(true),
            connect_us: Some(900),
            target: Some("candidate".into()),
            run_id: Some("run-1".into()),
        }
    }

    pub(crate) fn test_meta() -> FileMeta {
        let mut m = FileMeta::new(Producer::Capture, "llmreplay capture --test");
        m.source = Some("unit test".into());
        m.block_size = Some(16);
        m.extra.insert("site".into(), "eu-1".into());
        m
    }

    fn list(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn file_meta_round_trips_through_key_values() {
        let m = test_meta();
        let kv = m.to_kv();
        assert!(kv.iter().any(|e| e.key == meta::TOOL_VERSION));
        assert!(kv.iter().any(|e| e.key == "llmreplay.meta.site"));
        assert_eq!(FileMeta::from_kv(&kv, Path::new("x")).unwrap(), m);
    }

    #[test]
    fn round_trip_every_field_set_and_every_optional_null() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let mut bare = TraceRecord::new("bare", 1_700_000_000_000_000, "/v1/completions");
        bare.outcome = Outcome::ClientCancelled;
        let records = vec![full_record(1), bare, full_record(2)];
        write_trace_file(&path, &records, &test_meta()).unwrap();
        assert_eq!(list(dir.path()), vec!["t.parquet"]);
        let trace = read_traces(&[path.to_str().unwrap()]).unwrap();
        // Sorted by arrival: `bare` first.
        let expected = vec![records[1].clone(), records[0].clone(), records[2].clone()];
        assert_eq!(trace.records, expected);
        assert_eq!(trace.files.len(), 1);
        assert_eq!(trace.files[0].rows, 3);
        assert_eq!(trace.files[0].meta, test_meta());
    }

    #[test]
    fn batch_matches_the_schema_exactly() {
        let batch = records_to_batch(&[full_record(0)]).unwrap();
        assert_eq!(batch.schema().as_ref(), &schema::schema());
        let empty = records_to_batch(&[]).unwrap();
        assert_eq!(empty.num_rows(), 0);
    }

    #[cfg(unix)]
    #[test]
    fn files_are_created_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        write_trace_file(&path, &[full_record(0)], &test_meta()).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        let cfg = WriterConfig::new(dir.path().join("cap"), "cap", test_meta());
        let (mut w, _) = TraceWriter::open(cfg).unwrap();
        w.append(full_record(1)).unwrap();
        let journal = dir
            .path()
            .join("cap")
            .join(&list(&dir.path().join("cap"))[0]);
        assert!(journal.to_string_lossy().ends_with(".journal"));
        let mode = fs::metadata(&journal).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let files = w.close().unwrap();
        let mode = fs::metadata(&files[0]).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn rotation_by_size_produces_several_complete_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = WriterConfig::new(dir.path(), "cap", test_meta());
        let per = full_record(0).approx_bytes() as u64;
        cfg.max_file_bytes = per * 10; // ten records per file
        let (mut w, report) = TraceWriter::open(cfg).unwrap();
        assert_eq!(report, RecoveryReport::default());
        let records: Vec<_> = (0..35).map(full_record).collect();
        for r in &records {
            w.append(r.clone()).unwrap();
        }
        assert_eq!(w.finished().len(), 3);
        let files = w.close().unwrap();
        assert_eq!(files.len(), 4);
        // Only finished Parquet files remain: no journal, no temp file.
        let names = list(dir.path());
        assert_eq!(names.len(), 4);
        assert!(names
            .iter()
            .all(|n| n.starts_with("cap-") && n.ends_with(".parquet")));
        let mut total = 0;
        for f in &files {
            let t = read_traces(&[f.to_str().unwrap()]).unwrap();
            assert!(t.records.len() <= 10);
            total += t.records.len();
        }
        assert_eq!(total, 35);
        let all = read_traces(&[dir.path().to_str().unwrap()]).unwrap();
        assert_eq!(all.records, records);
    }

    #[test]
    fn nothing_recorded_creates_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = WriterConfig::new(dir.path(), "cap", test_meta());
        let (mut w, _) = TraceWriter::open(cfg).unwrap();
        w.tick().unwrap();
        assert!(w.close().unwrap().is_empty());
        assert!(list(dir.path()).is_empty());
    }

    #[test]
    fn rotation_by_age_on_tick() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = WriterConfig::new(dir.path(), "cap", test_meta());
        cfg.max_file_age = Duration::from_millis(100);
        let (mut w, _) = TraceWriter::open(cfg).unwrap();
        w.append(full_record(0)).unwrap();
        w.tick().unwrap();
        assert!(w.finished().is_empty());
        std::thread::sleep(Duration::from_millis(120));
        w.tick().unwrap();
        assert_eq!(w.finished().len(), 1);
        w.append(full_record(1)).unwrap();
        assert_eq!(w.close().unwrap().len(), 2);
    }

    /// Backdates the current segment to the previous UTC hour, as if the clock had just
    /// crossed an hour boundary.
    fn cross_hour(w: &mut TraceWriter) {
        if let Some(seg) = w.current.as_mut() {
            seg.hour -= 1;
        }
    }

    #[test]
    fn rotation_on_hour_keeps_each_file_within_one_hour() {
        for rotate_on_hour in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = WriterConfig::new(dir.path(), "cap", test_meta());
            cfg.rotate_on_hour = rotate_on_hour;
            let (mut w, _) = TraceWriter::open(cfg).unwrap();
            w.append(full_record(0)).unwrap();
            cross_hour(&mut w);
            // The record that arrives after the boundary starts a new file ...
            w.append(full_record(1)).unwrap();
            assert_eq!(w.finished().len(), usize::from(rotate_on_hour));
            cross_hour(&mut w);
            // ... and so does a tick after the boundary.
            w.tick().unwrap();
            let expect = if rotate_on_hour { 2 } else { 0 };
            assert_eq!(w.finished().len(), expect);
            let files = w.close().unwrap();
            assert_eq!(files.len(), if rotate_on_hour { 2 } else { 1 });
            let trace = read_traces(&[dir.path().to_str().unwrap()]).unwrap();
            assert_eq!(trace.records.len(), 2);
        }
    }

    #[test]
    fn parquet_is_not_visible_under_its_final_name_before_completion() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        // A leftover temp file from a crash: it is replaced, and the final name appears only
        // after the rename.
        fs::write(tmp_path(&path), b"partial").unwrap();
        assert_eq!(tmp_path(&path), dir.path().join("t.parquet.tmp"));
        assert!(!path.exists());
        write_trace_file(&path, &[full_record(0)], &test_meta()).unwrap();
        assert_eq!(list(dir.path()), vec!["t.parquet"]);

        // A failing write (the temp path is a directory) never produces the final name.
        let path2 = dir.path().join("u.parquet");
        fs::create_dir(tmp_path(&path2)).unwrap();
        assert!(write_trace_file(&path2, &[full_record(0)], &test_meta()).is_err());
        assert!(!path2.exists());

        // Recovery removes stale temp files.
        fs::remove_dir(tmp_path(&path2)).unwrap();
        fs::write(tmp_path(&path2), b"partial").unwrap();
        let report = recover_dir(dir.path(), &test_meta()).unwrap();
        assert_eq!(report, RecoveryReport::default());
        assert_eq!(list(dir.path()), vec!["t.parquet"]);
    }

    #[test]
    fn journal_with_torn_last_line_is_recovered_with_the_rest_intact() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("cap-20240101T000000Z-000000.journal");
        let records: Vec<_> = (0..3).map(full_record).collect();
        let mut data = Vec::new();
        for r in &records {
            serde_json::to_writer(&mut data, r).unwrap();
            data.push(b'\n');
        }
        let mut torn = serde_json::to_vec(&full_record(3)).unwrap();
        torn.truncate(torn.len() / 2);
        data.extend_from_slice(&torn);
        fs::write(&journal, &data).unwrap();

        let cfg = WriterConfig::new(dir.path(), "cap", test_meta());
        let (w, report) = TraceWriter::open(cfg).unwrap();
        assert_eq!(report.records, 3);
        assert_eq!(report.torn_lines, 1);
        let parquet = dir.path().join("cap-20240101T000000Z-000000.parquet");
        assert_eq!(report.files, vec![parquet.clone()]);
        assert!(!journal.exists());
        let t = read_traces(&[parquet.to_str().unwrap()]).unwrap();
        assert_eq!(t.records, records);
        assert_eq!(
            t.files[0].meta.extra.get("recovered").map(String::as_str),
            Some("journal")
        );
        assert!(w.close().unwrap().is_empty());
    }

    #[test]
    fn corrupt_journal_line_in_the_middle_is_an_error_naming_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("cap-x.journal");
        let mut data = serde_json::to_vec(&full_record(0)).unwrap();
        data.extend_from_slice(b"\n{not json\n");
        data.extend_from_slice(&serde_json::to_vec(&full_record(1)).unwrap());
        data.push(b'\n');
        fs::write(&journal, &data).unwrap();
        let err = recover_dir(dir.path(), &test_meta()).unwrap_err();
        assert!(
            matches!(&err, Error::BadRow { path, line: 2, .. } if path == &journal),
            "{err}"
        );
        assert!(journal.exists(), "the journal is kept for inspection");
    }

    #[test]
    fn killed_writer_loses_nothing_older_than_flush_interval() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = WriterConfig::new(dir.path(), "cap", test_meta());
        cfg.flush_interval = Duration::from_millis(20);
        let (mut w, _) = TraceWriter::open(cfg).unwrap();
        let records: Vec<_> = (0..5).map(full_record).collect();
        for r in &records {
            w.append(r.clone()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(30));
        w.tick().unwrap();
        // The journal on disk already holds every record, before any close.
        let journal = dir.path().join(&list(dir.path())[0]);
        let (on_disk, torn) = read_journal(&journal).unwrap();
        assert_eq!((on_disk, torn), (records.clone(), 0));
        // kill -9: no destructor, no close.
        std::mem::forget(w);
        let report = recover_dir(dir.path(), &test_meta()).unwrap();
        assert_eq!(report.records, 5);
        assert_eq!(report.torn_lines, 0);
        let t = read_traces(&[dir.path().to_str().unwrap()]).unwrap();
        assert_eq!(t.records, records);
    }

    #[test]
    fn append_flushes_once_flush_interval_has_passed() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = WriterConfig::new(dir.path(), "cap", test_meta());
        cfg.flush_interval = Duration::from_millis(100);
        let (mut w, _) = TraceWriter::open(cfg).unwrap();
        w.append(full_record(0)).unwrap();
        let journal = dir.path().join(&list(dir.path())[0]);
        assert_eq!(fs::metadata(&journal).unwrap().len(), 0, "still buffered");
        std::thread::sleep(Duration::from_millis(120));
        w.append(full_record(1)).unwrap();
        assert_eq!(read_journal(&journal).unwrap().0.len(), 2);
        std::mem::forget(w);
    }

    #[test]
    fn journal_already_finished_is_deleted_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let parquet = dir.path().join("cap-a.parquet");
        write_trace_file(&parquet, &[full_record(0)], &test_meta()).unwrap();
        let mut data = serde_json::to_vec(&full_record(0)).unwrap();
        data.push(b'\n');
        fs::write(dir.path().join("cap-a.journal"), &data).unwrap();
        let report = recover_dir(dir.path(), &test_meta()).unwrap();
        assert_eq!(report.files, vec![parquet]);
        assert_eq!(list(dir.path()), vec!["cap-a.parquet"]);
        let t = read_traces(&[dir.path().to_str().unwrap()]).unwrap();
        assert_eq!(t.records.len(), 1);
    }

    #[test]
    fn invalid_config_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = WriterConfig::new(dir.path(), "a/b", test_meta());
        assert!(matches!(
            TraceWriter::open(cfg.clone()),
            Err(Error::Invalid(_))
        ));
        cfg.prefix = "ok".into();
        cfg.max_file_bytes = 0;
        assert!(matches!(TraceWriter::open(cfg), Err(Error::Invalid(_))));
    }
}
