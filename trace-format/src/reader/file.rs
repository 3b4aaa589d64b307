//! One trace file opened for reading, a row group at a time: its footer and metadata checked
//! once ([`OpenFile::open`]), then its batches decoded row group by row group
//! ([`OpenFile::batches`]), over all columns or a projection of them, each row group's pages
//! checked before it is decoded and every decoded batch validated in full. Every call into
//! the decoder runs under the panic guard ([`guarded`]), so damaged bytes are an error
//! naming the file wherever they are met. [`read_traces`](super::read_traces) and
//! [`TraceStream`](crate::stream::TraceStream) both read through it.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use bytes::Bytes;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::file::reader::{ChunkReader, Length, SerializedFileReader};

use super::columns::check_required;
use super::pages::{check_row_group_pages, validate};
use super::{guard, RemoteFile, TraceFile};
use crate::error::{Error, Result};
use crate::file_meta::FileMeta;
use crate::schema::{self, meta, Producer};

/// Where one trace file is read from.
pub(crate) enum Source {
    /// A local file.
    Local(PathBuf),
    /// A file of a [`RemoteFiles`](super::RemoteFiles) source, fetched whole when opened.
    Remote(RemoteFile),
}

/// The bytes of a file: on disk (read as needed) or in memory (a fetched object).
#[derive(Clone)]
enum Chunks {
    File(Arc<File>),
    Bytes(Bytes),
}

/// A reader of [`Chunks`].
enum ChunkRead {
    File(<File as ChunkReader>::T),
    Bytes(<Bytes as ChunkReader>::T),
}

impl Read for ChunkRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            ChunkRead::File(r) => r.read(buf),
            ChunkRead::Bytes(r) => r.read(buf),
        }
    }
}

impl Length for Chunks {
    fn len(&self) -> u64 {
        match self {
            Chunks::File(f) => Length::len(f.as_ref()),
            Chunks::Bytes(b) => Length::len(b),
        }
    }
}

impl ChunkReader for Chunks {
    type T = ChunkRead;

    fn get_read(&self, start: u64) -> parquet::errors::Result<ChunkRead> {
        Ok(match self {
            Chunks::File(f) => ChunkRead::File(f.as_ref().get_read(start)?),
            Chunks::Bytes(b) => ChunkRead::Bytes(b.get_read(start)?),
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        match self {
            Chunks::File(f) => f.as_ref().get_bytes(start, length),
            Chunks::Bytes(b) => b.get_bytes(start, length),
        }
    }
}

/// Runs one step of decoding `path` under the panic guard: a panic inside the `parquet`
/// crate's decoders becomes [`Error::Format`] naming the file (see
/// [`read_parquet`](super::read_parquet) for why that is sound). Public for the other readers
/// of Parquet the project has (the Baseten importer), so that every Parquet decode is guarded
/// the one way; `f` must own what it decodes, as it does here.
pub fn guarded<T>(path: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    guard::install_quiet_hook();
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| guard::quietly(f)));
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

/// What a file that failed to open as Parquet is, when its first bytes say it is something
/// else: a JSON document (a replay's result, which `report` and `compare` read), JSON lines
/// (a journal, which `merge` recovers), or anything not starting with Parquet's magic. None
/// for a file that starts as Parquet does (then it is a damaged one).
fn not_parquet(chunks: &Chunks) -> Option<String> {
    let n = chunks.len().min(4096) as usize;
    let head = chunks.get_bytes(0, n).ok()?;
    if head.starts_with(b"PAR1") {
        return None;
    }
    let text = head.trim_ascii_start();
    let mut lines = text.split(|&b| b == b'\n');
    let first_line = lines.next().unwrap_or(text);
    let json_lines = lines.next().is_some()
        && serde_json::from_slice::<serde_json::Value>(first_line).is_ok_and(|v| v.is_object());
    Some(if text.is_empty() {
        "the file is empty".into()
    } else if json_lines {
        "this is JSON lines (a journal? `llmreplay merge FILE -o OUT.parquet` recovers a \
         replay's --results journal); traces are Parquet files"
            .into()
    } else if text.starts_with(b"{") || text.starts_with(b"[") {
        "this is a JSON document (a result JSON? `llmreplay report` and `llmreplay compare` \
         read those); traces are Parquet files (`llmreplay import` converts public traces)"
            .into()
    } else {
        "not a Parquet file (it does not start with Parquet's magic bytes); `llmreplay \
         import` converts public traces"
            .into()
    })
}

/// A Parquet file without llmreplay's metadata: a trace when it has our required columns
/// (a capture filtered in pandas, Polars, DuckDB or Spark and written back), its schema version
/// inferred from its columns ([`schema::version_of_columns`]); else not a trace. Returns its
/// metadata (producer [`Producer::External`], the writing tool as the source), its version,
/// and what was assumed, for the one line a command says about it.
fn foreign_file(
    meta: &ArrowReaderMetadata,
    path: &Path,
) -> Result<(FileMeta, String, Option<String>)> {
    let no_version = format!(
        "no {} in the file metadata",
        crate::schema::meta::SCHEMA_VERSION
    );
    check_required(meta.schema(), path).map_err(|e| match e {
        Error::NotATrace { path, reason } => Error::NotATrace {
            path,
            reason: format!("{no_version}, and not llmreplay's columns ({reason})"),
        },
        e => e,
    })?;
    let names: Vec<&str> = meta
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    let version = schema::version_of_columns(names.iter().copied());
    let writer = meta
        .metadata()
        .file_metadata()
        .created_by()
        .map(str::to_string)
        .unwrap_or_else(|| "an unnamed writer".into());
    let mut file_meta = FileMeta::new(Producer::External, "");
    file_meta.source = Some(writer.clone());
    let assumed = format!(
        "{no_version} (written by {writer}): read as trace schema {version}, inferred from its columns"
    );
    Ok((file_meta, version.to_string(), Some(assumed)))
}

/// The columns a read decodes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Columns {
    /// Every column.
    All,
    /// Only these top-level columns (with every leaf below them).
    Only(&'static [&'static str]),
}

/// A trace file whose footer and metadata have been read and checked.
pub(crate) struct OpenFile {
    name: PathBuf,
    chunks: Chunks,
    meta: ArrowReaderMetadata,
    /// What it is: provenance, version, rows.
    pub(crate) info: TraceFile,
}

impl OpenFile {
    /// Opens `source`: a local file is opened (read as its row groups are), a remote one
    /// fetched whole. Checks the footer, the schema version and the required columns.
    pub(crate) fn open(source: &Source) -> Result<OpenFile> {
        match source {
            Source::Local(path) => {
                let file = File::open(path).map_err(|e| Error::io(path, e))?;
                OpenFile::of(Chunks::File(Arc::new(file)), path)
            }
            Source::Remote(file) => {
                let bytes = (file.fetch)()?;
                OpenFile::of(Chunks::Bytes(bytes), Path::new(&file.name))
            }
        }
    }

    /// Opens a file held in memory, named `name`.
    pub(crate) fn of_bytes(data: Bytes, name: &Path) -> Result<OpenFile> {
        OpenFile::of(Chunks::Bytes(data), name)
    }

    fn of(chunks: Chunks, path: &Path) -> Result<OpenFile> {
        guarded(path, || {
            let meta =
                ArrowReaderMetadata::load(&chunks, ArrowReaderOptions::new()).map_err(|e| {
                    match not_parquet(&chunks) {
                        Some(what) => Error::format(path, what),
                        None => Error::format(path, format!("not a readable Parquet file: {e}")),
                    }
                })?;
            let kv = meta
                .metadata()
                .file_metadata()
                .key_value_metadata()
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let get = |key: &str| {
                kv.iter()
                    .find(|e| e.key == key)
                    .and_then(|e| e.value.clone())
            };
            let (file_meta, schema_version, assumed) = match get(meta::SCHEMA_VERSION) {
                Some(version) => (FileMeta::from_kv(kv, path)?, version, None),
                None => foreign_file(&meta, path)?,
            };
            let tool_version = get(meta::TOOL_VERSION);
            check_required(meta.schema(), path)?;
            let rows = usize::try_from(meta.metadata().file_metadata().num_rows())
                .map_err(|_| Error::format(path, "damaged Parquet file: negative row count"))?;
            let info = TraceFile {
                path: path.to_path_buf(),
                meta: file_meta,
                rows,
                schema_version,
                tool_version,
                assumed,
            };
            Ok(OpenFile {
                name: path.to_path_buf(),
                chunks,
                meta,
                info,
            })
        })
    }

    /// The name errors give it.
    pub(crate) fn name(&self) -> &Path {
        &self.name
    }

    /// Its footer: row groups, their statistics, key-value metadata.
    pub(crate) fn footer(&self) -> &parquet::file::metadata::ParquetMetaData {
        self.meta.metadata()
    }

    /// Its batches in file order, `batch_rows` rows at most each, decoding `columns` only,
    /// one row group at a time.
    pub(crate) fn batches(&self, columns: Columns, batch_rows: usize) -> Result<Batches> {
        let schema = self.meta.metadata().file_metadata().schema_descr_ptr();
        let leaves: Option<Vec<usize>> = match columns {
            Columns::All => None,
            Columns::Only(names) => Some(
                schema
                    .columns()
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| {
                        c.path()
                            .parts()
                            .first()
                            .is_some_and(|root| names.contains(&root.as_str()))
                    })
                    .map(|(i, _)| i)
                    .collect(),
            ),
        };
        let mask = match &leaves {
            None => ProjectionMask::all(),
            Some(l) => ProjectionMask::leaves(&schema, l.iter().copied()),
        };
        let chunks = self.chunks.clone();
        let pages = guarded(&self.name, || {
            SerializedFileReader::new(chunks)
                .map_err(|e| Error::format(&self.name, format!("not a readable Parquet file: {e}")))
        })?;
        Ok(Batches {
            name: self.name.clone(),
            chunks: self.chunks.clone(),
            meta: self.meta.clone(),
            pages,
            leaves,
            mask,
            batch_rows: batch_rows.max(1),
            next_group: 0,
            current: None,
            rows_read: 0,
            done: false,
        })
    }
}

/// The batches of one file (see [`OpenFile::batches`]), each with the file row of its first
/// row. After an error it yields nothing more.
pub(crate) struct Batches {
    name: PathBuf,
    chunks: Chunks,
    meta: ArrowReaderMetadata,
    /// The same file through the page-level reader, for the page check.
    pages: SerializedFileReader<Chunks>,
    leaves: Option<Vec<usize>>,
    mask: ProjectionMask,
    batch_rows: usize,
    next_group: usize,
    current: Option<ParquetRecordBatchReader>,
    rows_read: usize,
    done: bool,
}

impl Batches {
    fn step(&mut self) -> Result<Option<(usize, RecordBatch)>> {
        loop {
            if let Some(reader) = &mut self.current {
                let name = &self.name;
                let next = guarded(name, || {
                    reader
                        .next()
                        .transpose()
                        .map_err(|e| Error::format(name, e))
                })?;
                match next {
                    Some(batch) => {
                        validate(&batch, &self.name)?;
                        let first = self.rows_read;
                        self.rows_read += batch.num_rows();
                        return Ok(Some((first, batch)));
                    }
                    None => self.current = None,
                }
            }
            let groups = self.meta.metadata().num_row_groups();
            if self.next_group >= groups {
                return Ok(None);
            }
            let g = self.next_group;
            self.next_group += 1;
            let name = &self.name;
            let (pages, leaves) = (&self.pages, self.leaves.as_deref());
            let (chunks, meta, mask) = (&self.chunks, &self.meta, &self.mask);
            let batch_rows = self.batch_rows;
            self.current = Some(guarded(name, || {
                check_row_group_pages(pages, g, leaves, name)?;
                ParquetRecordBatchReaderBuilder::new_with_metadata(chunks.clone(), meta.clone())
                    .with_row_groups(vec![g])
                    .with_projection(mask.clone())
                    .with_batch_size(batch_rows)
                    .build()
                    .map_err(|e| Error::format(name, e))
            })?);
        }
    }
}

impl Iterator for Batches {
    type Item = Result<(usize, RecordBatch)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.step().transpose();
        if !matches!(r, Some(Ok(_))) {
            self.done = true;
        }
        r
    }
}
