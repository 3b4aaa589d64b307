//! Records into Parquet: the one mapping of record fields to Arrow columns
//! ([`records_to_batch`], where every text column goes through redaction), the Parquet
//! properties of a trace file, and the durable write: a file is written under a temporary
//! name (`<name>.tmp`) in its final directory, fsync'd, then renamed, so a `.parquet` file
//! appears under its final name only when it is complete. Files are created with mode 0600 on
//! unix: traces may hold request bodies.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Int32Builder, Int64Builder, ListBuilder, StringBuilder,
    TimestampMicrosecondBuilder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};
use crate::file_meta::FileMeta;
use crate::order::OrderMeter;
use crate::redact;
use crate::schema::{self, TraceRecord};

/// Rows per Arrow batch handed to the Parquet writer (bounds the extra memory of a write).
pub(crate) const BATCH_ROWS: usize = 8 * 1024;
/// Rows per Parquet row group.
const ROW_GROUP_ROWS: usize = 64 * 1024;
/// Bytes per Parquet row group (whichever limit is reached first).
const ROW_GROUP_BYTES: usize = 128 * 1024 * 1024;
/// Suffix appended to a file name while it is being written.
pub(crate) const TMP_SUFFIX: &str = ".tmp";

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
    let mut parent_request_id = str_builder(|r| r.parent_request_id.as_deref());
    let mut think_time = Int64Builder::with_capacity(n);
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
    let mut captured_status = Int32Builder::with_capacity(n);
    let mut captured_outcome = StringBuilder::with_capacity(n, n * 8);
    let mut synthesized_body = BooleanBuilder::with_capacity(n);
    let mut trace_id = str_builder(|r| r.trace_id.as_deref());
    let mut span_id = str_builder(|r| r.span_id.as_deref());
    let mut ttfat = Int64Builder::with_capacity(n);
    let mut reasoning_tokens = Int64Builder::with_capacity(n);
    let mut reasoning_src = StringBuilder::with_capacity(n, n * 8);
    let mut tools_offered = Int32Builder::with_capacity(n);
    let mut tool_names = names_builder(records, |r| r.tool_names.as_deref());
    let mut tool_calls = Int32Builder::with_capacity(n);
    let mut tool_call_names = names_builder(records, |r| r.tool_call_names.as_deref());
    let mut parent_link = StringBuilder::with_capacity(n, n * 8);
    let mut pair_request_id = str_builder(|r| r.pair_request_id.as_deref());
    let mut cached_tokens = Int64Builder::with_capacity(n);
    let mut images = Int32Builder::with_capacity(n);
    let mut image_bytes = Int64Builder::with_capacity(n);
    let mut image_dims = names_builder(records, |r| r.image_dims.as_deref());
    let mut audio_inputs = Int32Builder::with_capacity(n);
    let mut audio_bytes = Int64Builder::with_capacity(n);
    let mut parent_wait = Int64Builder::with_capacity(n);
    let mut capture_id = str_builder(|r| r.capture_id.as_deref());
    let mut capture_started = TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC");
    let keys = |f: fn(&TraceRecord) -> Option<&[u64]>| {
        let values = records.iter().filter_map(f).map(<[u64]>::len).sum();
        ListBuilder::with_capacity(UInt64Builder::with_capacity(values), n)
    };
    let mut chat_keys = keys(|r| r.link_keys.chat.as_deref());
    let mut call_keys = keys(|r| r.link_keys.calls.as_deref());
    let mut arg_keys = keys(|r| r.link_keys.args.as_deref());
    let mut one_keys: [UInt64Builder; 6] = std::array::from_fn(|_| UInt64Builder::with_capacity(n));

    for r in records {
        request_id.append_value(&r.request_id);
        session_id.append_option(r.session_id.as_deref());
        parent_request_id.append_option(r.parent_request_id.as_deref());
        think_time.append_option(r.think_time_us);
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
        captured_status.append_option(r.captured_status.map(i32::from));
        captured_outcome.append_option(r.captured_outcome.map(|o| o.as_str()));
        synthesized_body.append_option(r.synthesized_body);
        trace_id.append_option(r.trace_id.as_deref());
        span_id.append_option(r.span_id.as_deref());
        ttfat.append_option(r.ttfat_us);
        reasoning_tokens.append_option(r.reasoning_tokens);
        reasoning_src.append_option(r.reasoning_tokens_source.map(|s| s.as_str()));
        tools_offered.append_option(r.tools_offered);
        append_names(&mut tool_names, r.tool_names.as_deref());
        tool_calls.append_option(r.tool_calls);
        append_names(&mut tool_call_names, r.tool_call_names.as_deref());
        parent_link.append_option(r.parent_link.map(|l| l.as_str()));
        pair_request_id.append_option(r.pair_request_id.as_deref());
        cached_tokens.append_option(r.cached_tokens);
        images.append_option(r.images);
        image_bytes.append_option(r.image_bytes);
        append_names(&mut image_dims, r.image_dims.as_deref());
        audio_inputs.append_option(r.audio_inputs);
        audio_bytes.append_option(r.audio_bytes);
        parent_wait.append_option(r.parent_wait_us);
        capture_id.append_option(r.capture_id.as_deref());
        capture_started.append_option(r.capture_started_us);
        let k = &r.link_keys;
        append_keys(&mut chat_keys, k.chat.as_deref());
        append_keys(&mut call_keys, k.calls.as_deref());
        append_keys(&mut arg_keys, k.args.as_deref());
        let ones = [
            k.answer,
            k.result,
            k.opening,
            k.client,
            k.response,
            k.previous_response,
        ];
        for (b, v) in one_keys.iter_mut().zip(ones) {
            b.append_option(v);
        }
    }
    let [mut answer_key, mut result_key, mut opening_key, mut client_key, mut response_key, mut previous_key] =
        one_keys;

    // Same order as `schema::schema()`; `RecordBatch::try_new` checks types and nullability.
    let columns: Vec<ArrayRef> = vec![
        Arc::new(request_id.finish()),
        Arc::new(session_id.finish()),
        Arc::new(parent_request_id.finish()),
        Arc::new(think_time.finish()),
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
        Arc::new(captured_status.finish()),
        Arc::new(captured_outcome.finish()),
        Arc::new(synthesized_body.finish()),
        Arc::new(trace_id.finish()),
        Arc::new(span_id.finish()),
        Arc::new(ttfat.finish()),
        Arc::new(reasoning_tokens.finish()),
        Arc::new(reasoning_src.finish()),
        Arc::new(tools_offered.finish()),
        Arc::new(tool_names.finish()),
        Arc::new(tool_calls.finish()),
        Arc::new(tool_call_names.finish()),
        Arc::new(parent_link.finish()),
        Arc::new(pair_request_id.finish()),
        Arc::new(cached_tokens.finish()),
        Arc::new(images.finish()),
        Arc::new(image_bytes.finish()),
        Arc::new(image_dims.finish()),
        Arc::new(audio_inputs.finish()),
        Arc::new(audio_bytes.finish()),
        Arc::new(parent_wait.finish()),
        Arc::new(capture_id.finish()),
        Arc::new(capture_started.finish()),
        Arc::new(chat_keys.finish()),
        Arc::new(answer_key.finish()),
        Arc::new(call_keys.finish()),
        Arc::new(arg_keys.finish()),
        Arc::new(result_key.finish()),
        Arc::new(opening_key.finish()),
        Arc::new(client_key.finish()),
        Arc::new(response_key.finish()),
        Arc::new(previous_key.finish()),
    ];
    RecordBatch::try_new(Arc::new(schema::schema()), columns)
        .map_err(|e| Error::Invalid(format!("building a trace batch: {e}")))
}

/// Appends one row's keys to a list-of-uint64 column (null when None).
fn append_keys(b: &mut ListBuilder<UInt64Builder>, v: Option<&[u64]>) {
    match v {
        Some(v) => {
            b.values().append_slice(v);
            b.append(true);
        }
        None => b.append_null(),
    }
}

/// A builder for a list-of-strings column (tool names), sized for `records`.
fn names_builder(
    records: &[TraceRecord],
    f: fn(&TraceRecord) -> Option<&[String]>,
) -> ListBuilder<StringBuilder> {
    let (items, bytes) = records
        .iter()
        .filter_map(f)
        .flatten()
        .fold((0, 0), |(n, b), s| (n + 1, b + s.len()));
    ListBuilder::with_capacity(StringBuilder::with_capacity(items, bytes), records.len())
}

/// Appends one row of a list-of-strings column: its names (redacted as text), or null.
fn append_names(b: &mut ListBuilder<StringBuilder>, names: Option<&[String]>) {
    match names {
        Some(v) => {
            for s in v {
                b.values().append_value(redact::redact_text(s));
            }
            b.append(true);
        }
        None => b.append_null(),
    }
}

/// Writes `records` to a Parquet trace file at `path` (Snappy, row groups of at most 64 Ki
/// rows, their [`FileOrder`](crate::order::FileOrder) in the footer), under a temporary name in the same directory that is fsync'd and then renamed.
/// The file is created with mode 0600 on unix. An existing file at `path` is replaced.
pub fn write_trace_file(path: &Path, records: &[TraceRecord], meta: &FileMeta) -> Result<()> {
    let mut w = TraceFileWriter::create(path)?;
    for chunk in records.chunks(BATCH_ROWS) {
        w.write_batch(chunk)?;
    }
    w.finish(meta)
}

/// The Parquet writer properties of a trace file.
pub(crate) fn props(meta: &FileMeta) -> WriterProperties {
    props_builder()
        .set_key_value_metadata(Some(meta.to_kv()))
        .build()
}

fn props_builder() -> parquet::file::properties::WriterPropertiesBuilder {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
}

/// One trace file written as its rows come, in bounded memory (at most [`BATCH_ROWS`] rows
/// held, and the Parquet writer's current row group), durable as [`write_trace_file`]'s: under
/// `<name>.tmp` until [`finish`](Self::finish) fsyncs and renames it, so the file appears
/// complete or not at all (dropped unfinished, the temporary file is removed). Its metadata
/// is given at the end, when what it says (an import's block size, its sources) is known.
pub struct TraceFileWriter {
    path: PathBuf,
    tmp: PathBuf,
    writer: Option<ArrowWriter<File>>,
    pending: Vec<TraceRecord>,
    order: OrderMeter,
    rows: u64,
}

impl TraceFileWriter {
    /// Starts the file at `path` (mode 0600 on unix; an existing file is replaced at the end).
    pub fn create(path: &Path) -> Result<TraceFileWriter> {
        let tmp = tmp_path(path);
        let file = create_private(&tmp, false)?;
        let writer = ArrowWriter::try_new(
            file,
            Arc::new(schema::schema()),
            Some(props_builder().build()),
        )
        .map_err(|e| Error::format(path, e));
        let writer = match writer {
            Ok(w) => w,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        Ok(TraceFileWriter {
            path: path.to_path_buf(),
            tmp,
            writer: Some(writer),
            pending: Vec::with_capacity(BATCH_ROWS),
            order: OrderMeter::default(),
            rows: 0,
        })
    }

    /// Adds one row.
    pub fn push(&mut self, rec: TraceRecord) -> Result<()> {
        self.pending.push(rec);
        if self.pending.len() >= BATCH_ROWS {
            let rows = std::mem::take(&mut self.pending);
            self.write_batch(&rows)?;
            self.pending = rows;
            self.pending.clear();
        }
        Ok(())
    }

    /// Rows added so far.
    pub fn rows(&self) -> u64 {
        self.rows + self.pending.len() as u64
    }

    fn write_batch(&mut self, rows: &[TraceRecord]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let batch = records_to_batch(rows)?;
        let w = self.writer.as_mut().expect("open until finished");
        w.write(&batch).map_err(|e| Error::format(&self.path, e))?;
        rows.iter().for_each(|r| self.order.add(r.arrival_time_us));
        self.rows += rows.len() as u64;
        Ok(())
    }

    /// Writes what is left, the file's metadata (`meta` and the rows' order) and footer,
    /// fsyncs it and renames it into place.
    pub fn finish(mut self, meta: &FileMeta) -> Result<()> {
        let rows = std::mem::take(&mut self.pending);
        self.write_batch(&rows)?;
        let mut w = self.writer.take().expect("open until finished");
        for kv in meta.to_kv() {
            w.append_key_value_metadata(kv);
        }
        w.append_key_value_metadata(self.order.order().to_kv());
        let file = w.into_inner().map_err(|e| Error::format(&self.path, e))?;
        file.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        drop(file);
        fs::rename(&self.tmp, &self.path).map_err(|e| Error::io(&self.path, e))?;
        sync_parent(&self.path)
    }
}

impl Drop for TraceFileWriter {
    fn drop(&mut self) {
        if self.writer.is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// `<path>.tmp`: the name a file has while it is being written.
pub(crate) fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(TMP_SUFFIX);
    path.with_file_name(name)
}

/// Creates a new file with mode 0600 (unix). With `exclusive`, fails if it exists; otherwise a
/// leftover file is removed first so the mode always applies.
pub(crate) fn create_private(path: &Path, exclusive: bool) -> Result<File> {
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
pub(crate) fn sync_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => sync_dir(p),
        _ => sync_dir(Path::new(".")),
    }
}

/// fsyncs a directory (no-op where unsupported).
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}
