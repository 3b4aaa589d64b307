//! The journal of a [`TraceWriter`](crate::TraceWriter) and its recovery: reading a journal
//! (every intact record, also after damage) and finishing what a previous writer left in a
//! directory ([`recover_dir`]), so a crash loses no record older than the writer's
//! `flush_interval`. The journal format is one JSON line per record, `request_id` first; the
//! journal of a one-file writer ([`crate::WriterConfig::one_file`]) starts with a header line
//! naming its file and metadata ([`JournalHeader`]), so [`recover_one_file`] finishes it as
//! the writer would have.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use parquet::arrow::ArrowWriter;

use crate::encode::{
    create_private, props, records_to_batch, sync_dir, sync_parent, tmp_path, write_trace_file,
    BATCH_ROWS, TMP_SUFFIX,
};
use crate::error::{Error, Result};
use crate::file_meta::FileMeta;
use crate::order::OrderMeter;
use crate::schema::{self, TraceRecord};

/// Extension of journal files.
pub(crate) const JOURNAL_EXT: &str = "journal";

/// The journal of the Parquet file `path` of a one-file writer: `run.parquet` →
/// `run.journal`, any other name gets `.journal` appended (`run.pq` → `run.pq.journal`).
pub fn journal_path(path: &Path) -> PathBuf {
    if path.extension().is_some_and(|e| e == "parquet") {
        return path.with_extension(JOURNAL_EXT);
    }
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{JOURNAL_EXT}"));
    PathBuf::from(name)
}

/// The first line of a one-file writer's journal: the Parquet file it becomes (a name in the
/// journal's directory) and that file's metadata as the writer was opened with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalHeader {
    /// The Parquet file's name, in the journal's directory.
    pub file: String,
    /// Its metadata.
    pub meta: FileMeta,
}

/// How a header line starts (a record line starts with [`RECORD_START`]).
const HEADER_START: &[u8] = br#"{"llmreplay_journal":"#;

#[derive(serde::Serialize, serde::Deserialize)]
struct HeaderLine {
    llmreplay_journal: HeaderBody,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct HeaderBody {
    file: String,
    meta: std::collections::BTreeMap<String, String>,
}

/// The header line (newline-terminated) of a journal that becomes `file` with `meta`.
pub(crate) fn journal_header(file: &str, meta: &FileMeta) -> Vec<u8> {
    let line = HeaderLine {
        llmreplay_journal: HeaderBody {
            file: file.to_string(),
            meta: meta
                .to_kv()
                .into_iter()
                .map(|kv| (kv.key, kv.value.unwrap_or_default()))
                .collect(),
        },
    };
    let mut out = serde_json::to_vec(&line).expect("strings always serialize");
    out.push(b'\n');
    out
}

/// Whether a journal line is a header line.
pub(crate) fn is_header(line: &[u8]) -> bool {
    line.starts_with(HEADER_START)
}

fn parse_header(line: &[u8], journal: &Path) -> Result<JournalHeader> {
    let h: HeaderLine = serde_json::from_slice(line).map_err(|e| Error::format(journal, e))?;
    let kv: Vec<parquet::file::metadata::KeyValue> = h
        .llmreplay_journal
        .meta
        .into_iter()
        .map(|(k, v)| parquet::file::metadata::KeyValue::new(k, v))
        .collect();
    let file = h.llmreplay_journal.file;
    if file.is_empty() || file.contains(['/', '\\']) {
        return Err(Error::Invalid(format!(
            "{}: the header names {file:?}, not a file name",
            journal.display()
        )));
    }
    Ok(JournalHeader {
        meta: FileMeta::from_kv(&kv, journal)?,
        file,
    })
}

/// The header of a journal (None for a journal without one, such as capture's).
pub fn read_header(journal: &Path) -> Result<Option<JournalHeader>> {
    use std::io::BufRead;
    let f = fs::File::open(journal).map_err(|e| Error::io(journal, e))?;
    let mut line = Vec::new();
    io::BufReader::new(f)
        .read_until(b'\n', &mut line)
        .map_err(|e| Error::io(journal, e))?;
    if !is_header(&line) {
        return Ok(None);
    }
    parse_header(line.trim_ascii_end(), journal).map(Some)
}

/// Finishes the journal a one-file writer left (a `kill -9` of `replay --results`): its
/// records go into the Parquet file its header names, beside it, with the header's metadata
/// plus `recovered=journal` and `extra`; then the journal is deleted (set aside as
/// `<name>.damaged-<utc>` when it had damaged lines, as [`recover_dir`] does). Returns the
/// file (written, empty, also when no record had been journalled) and what recovery found.
/// An error when the journal has no header.
pub fn recover_one_file(
    journal: &Path,
    extra: &[(&str, &str)],
) -> Result<(PathBuf, RecoveryReport)> {
    let Some(header) = read_header(journal)? else {
        return Err(Error::Invalid(format!(
            "{} is not the journal of a results file (it has no header line)",
            journal.display()
        )));
    };
    let mut meta = recovered_meta(&header.meta);
    for (k, v) in extra {
        meta.extra.insert(k.to_string(), v.to_string());
    }
    let mut report = RecoveryReport::default();
    recover_journal(journal, &meta, &mut report);
    if let Some(d) = report.deferred.first() {
        return Err(Error::Invalid(format!(
            "{}: {}",
            d.journal.display(),
            d.reason
        )));
    }
    let file = journal.with_file_name(&header.file);
    if report.records == 0 && !file.exists() {
        // Killed before any row finished: the (empty) file says so all the same.
        write_trace_file(&file, &[], &meta)?;
    }
    Ok((file, report))
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
    /// Lines that were neither a record nor a torn final line (damage: a write cut short in
    /// the middle of a journal, bad bytes), as (journal, 1-based line). A record glued to
    /// the damaged part of its line is still recovered.
    pub damaged_lines: Vec<(PathBuf, usize)>,
    /// Journals with damaged lines, renamed aside to `<name>.damaged-<utc>` (kept byte for
    /// byte, never deleted) after their intact records were finished: their new paths.
    pub set_aside: Vec<PathBuf>,
    /// Journals that could not be finished (the directory is full, the file unreadable):
    /// kept under their names. A [`TraceWriter`] retries them while it runs.
    pub deferred: Vec<DeferredJournal>,
    /// Other files that could not be cleaned up (stale temp files, finished journals).
    pub errors: Vec<String>,
}

/// A journal whose Parquet file could not be written yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeferredJournal {
    /// The journal, kept under its name.
    pub journal: PathBuf,
    /// Records in it, if it could be read.
    pub records: usize,
    /// Why it is not finished.
    pub reason: String,
}

/// `meta` plus `recovered=journal`: the metadata of a file finished from its journal.
pub(crate) fn recovered_meta(meta: &FileMeta) -> FileMeta {
    let mut meta = meta.clone();
    meta.extra
        .insert("recovered".to_string(), "journal".to_string());
    meta
}

/// Finishes what a previous [`TraceWriter`] left in `dir` (a crash, or a directory that
/// could not take the Parquet file): every `*.journal` becomes its `.parquet` (written with
/// `meta` plus the extra key `recovered=journal`) and is deleted, and stale `*.parquet.tmp`
/// files are removed.
///
/// Nothing found there is an error (only a directory that cannot be listed is), and nothing
/// is deleted that was not finished:
/// - a torn final line (no newline, not valid JSON: the record being written when the
///   process died) is dropped and counted in [`RecoveryReport::torn_lines`];
/// - any other bad line is damage: the intact records (also those after it, and a record
///   glued to the damaged part of its line) are finished, and the journal is renamed aside,
///   byte for byte, to `<name>.damaged-<utc>` ([`RecoveryReport::damaged_lines`],
///   [`RecoveryReport::set_aside`]);
/// - a journal that cannot be read or whose Parquet file cannot be written (a full disk)
///   is kept under its name and reported in [`RecoveryReport::deferred`].
///
/// A journal whose `.parquet` already exists (the crash came between the rename and the
/// deletion) is simply deleted; its file is still reported.
pub fn recover_dir(dir: &Path, meta: &FileMeta) -> Result<RecoveryReport> {
    let mut report = RecoveryReport::default();
    let mut journals = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = match entry {
            Ok(e) => e.path(),
            Err(e) => {
                report.errors.push(format!("{}: {e}", dir.display()));
                continue;
            }
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.ends_with(&format!(".parquet{TMP_SUFFIX}")) {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => report.errors.push(format!("{}: {e}", path.display())),
            }
        } else if path.extension().is_some_and(|e| e == JOURNAL_EXT) && path.is_file() {
            journals.push(path);
        }
    }
    journals.sort();

    let meta = recovered_meta(meta);
    for journal in journals {
        recover_journal(&journal, &meta, &mut report);
    }
    if let Err(e) = sync_dir(dir) {
        report.errors.push(e.to_string());
    }
    Ok(report)
}

/// Finishes one journal into its Parquet file (see [`recover_dir`]); whatever it cannot do
/// goes into `report`.
pub(crate) fn recover_journal(journal: &Path, meta: &FileMeta, report: &mut RecoveryReport) {
    let contents = match read_journal(journal) {
        Ok(c) => c,
        Err(e) => {
            report.deferred.push(DeferredJournal {
                journal: journal.to_path_buf(),
                records: 0,
                reason: e.to_string(),
            });
            return;
        }
    };
    let parquet = match &contents.header {
        Some(h) => journal.with_file_name(&h.file),
        None => journal.with_extension("parquet"),
    };
    if !contents.records.is_empty() {
        if !parquet.exists() {
            if let Err(e) = write_trace_file(&parquet, &contents.records, meta) {
                report.deferred.push(DeferredJournal {
                    journal: journal.to_path_buf(),
                    records: contents.records.len(),
                    reason: e.to_string(),
                });
                return;
            }
        }
        report.records += contents.records.len();
        report.files.push(parquet);
    }
    report.torn_lines += contents.torn_lines;
    if contents.damaged_lines.is_empty() {
        match fs::remove_file(journal) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => report.errors.push(format!("{}: {e}", journal.display())),
        }
        return;
    }
    report.damaged_lines.extend(
        contents
            .damaged_lines
            .iter()
            .map(|&l| (journal.to_path_buf(), l)),
    );
    match set_aside(journal) {
        Ok(p) => report.set_aside.push(p),
        // Left under its name: the next recovery finds the Parquet file and tries again.
        Err(e) => report.errors.push(format!(
            "{}: could not be set aside: {e}",
            journal.display()
        )),
    }
}

/// Renames `path` to `<name>.damaged-<utc>` (plus `-N` if taken); returns the new path.
fn set_aside(path: &Path) -> io::Result<PathBuf> {
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    for n in 0..1000 {
        let suffix = if n == 0 {
            String::new()
        } else {
            format!("-{n}")
        };
        let to = path.with_file_name(format!("{name}.damaged-{stamp}{suffix}"));
        if to.exists() {
            continue;
        }
        fs::rename(path, &to)?;
        return Ok(to);
    }
    Err(io::Error::from(io::ErrorKind::AlreadyExists))
}

/// What a journal holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JournalContents {
    /// Every record that could be read, in order.
    pub records: Vec<TraceRecord>,
    /// Torn final lines (0 or 1).
    pub torn_lines: usize,
    /// 1-based numbers of the damaged lines.
    pub damaged_lines: Vec<usize>,
    /// The header line of a one-file writer's journal.
    pub header: Option<JournalHeader>,
}

/// The start of every journal line: `request_id` is the record's first field.
const RECORD_START: &[u8] = br#"{"request_id":"#;

/// Reads a journal: every intact record, also after damage. A line that is not a record is
/// damaged, unless it is the unterminated last one (torn); a record glued to the damaged
/// part of its line (a write cut short, then the next record) is still read.
pub fn read_journal(path: &Path) -> Result<JournalContents> {
    let data = fs::read(path).map_err(|e| Error::io(path, e))?;
    let mut out = JournalContents::default();
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
        if line_no == 1 && is_header(line) {
            match parse_header(line, path) {
                Ok(h) => out.header = Some(h),
                Err(_) => out.damaged_lines.push(line_no),
            }
            continue;
        }
        if let Ok(r) = serde_json::from_slice::<TraceRecord>(line) {
            out.records.push(r);
            continue;
        }
        let glued = memchr::memmem::find_iter(line, RECORD_START)
            .filter(|&i| i > 0)
            .find_map(|i| serde_json::from_slice::<TraceRecord>(&line[i..]).ok());
        match glued {
            Some(r) => {
                out.records.push(r);
                out.damaged_lines.push(line_no);
            }
            None if !terminated => out.torn_lines += 1,
            None => out.damaged_lines.push(line_no),
        }
    }
    Ok(out)
}

/// Writes the Parquet trace file at `path` from the live `journal` of a segment (every line
/// whole: the writer cuts a failed write back to its last whole line), `BATCH_ROWS` rows at a
/// time, so only one batch is in memory; `expected` records must be there. Same temporary
/// name, fsync and rename as [`write_trace_file`].
pub(crate) fn write_trace_file_from_journal(
    path: &Path,
    journal: &Path,
    expected: usize,
    meta: &FileMeta,
) -> Result<()> {
    use std::io::BufRead;
    let tmp = tmp_path(path);
    let result = (|| {
        let file = create_private(&tmp, false)?;
        let mut writer = ArrowWriter::try_new(file, Arc::new(schema::schema()), Some(props(meta)))
            .map_err(|e| Error::format(path, e))?;
        let mut lines =
            io::BufReader::new(fs::File::open(journal).map_err(|e| Error::io(journal, e))?);
        let (mut batch, mut line, mut seen) = (Vec::with_capacity(BATCH_ROWS), Vec::new(), 0);
        let mut order = OrderMeter::default();
        loop {
            line.clear();
            let n = lines
                .read_until(b'\n', &mut line)
                .map_err(|e| Error::io(journal, e))?;
            let header = seen == 0 && is_header(&line);
            if n > 0 && !header && !line.iter().all(u8::is_ascii_whitespace) {
                let rec: TraceRecord = serde_json::from_slice(&line)
                    .map_err(|e| Error::format(journal, format!("line {}: {e}", seen + 1)))?;
                order.add(rec.arrival_time_us);
                batch.push(rec);
                seen += 1;
            }
            if batch.len() == BATCH_ROWS || (n == 0 && !batch.is_empty()) {
                writer
                    .write(&records_to_batch(&batch)?)
                    .map_err(|e| Error::format(path, e))?;
                batch.clear();
            }
            if n == 0 {
                break;
            }
        }
        if seen != expected {
            return Err(Error::Invalid(format!(
                "{}: {seen} records where {expected} were written",
                journal.display()
            )));
        }
        writer.append_key_value_metadata(order.order().to_kv());
        let file = writer.into_inner().map_err(|e| Error::format(path, e))?;
        file.sync_all().map_err(|e| Error::io(&tmp, e))?;
        drop(file);
        fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
        sync_parent(path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::read_traces;
    use crate::test_records::{file_names as names, full_record, test_meta};
    use crate::{TraceWriter, WriterConfig};
    use std::time::Duration;

    #[test]
    fn journal_names_of_one_file() {
        assert_eq!(
            journal_path(Path::new("d/run.parquet")),
            PathBuf::from("d/run.journal")
        );
        assert_eq!(
            journal_path(Path::new("run.pq")),
            PathBuf::from("run.pq.journal")
        );
        assert_eq!(journal_path(Path::new("out")), PathBuf::from("out.journal"));
    }

    /// A one-file writer finishes its file under the given name, with the metadata set last
    /// (what a run only knows at its end), and leaves no journal.
    #[test]
    fn one_file_is_finished_under_its_name_with_the_last_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.parquet");
        let (mut w, _) = TraceWriter::open(WriterConfig::one_file(&path, test_meta())).unwrap();
        let records: Vec<_> = (0..5).map(full_record).collect();
        for r in &records {
            w.append(r.clone()).unwrap();
        }
        assert_eq!(names(dir.path()), vec!["run.journal"]);
        let mut end = test_meta();
        end.extra.insert("known_at_the_end".into(), "yes".into());
        w.set_meta(end.clone());
        assert_eq!(w.close().unwrap(), vec![path.clone()]);
        assert_eq!(names(dir.path()), vec!["run.parquet"]);
        let t = read_traces(&[path.to_str().unwrap()]).unwrap();
        assert_eq!(t.records, records);
        assert_eq!(t.files[0].meta, end);
    }

    /// Killed before it finished: the journal (header first) holds every record handed to
    /// the OS; opening again refuses to overwrite it; recovery writes each record once under
    /// the file's name, with the opening metadata plus `recovered` and the given keys.
    #[test]
    fn a_killed_one_file_writer_is_recovered_once_under_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.parquet");
        let mut cfg = WriterConfig::one_file(&path, test_meta());
        cfg.flush_interval = Duration::ZERO;
        let (mut w, _) = TraceWriter::open(cfg.clone()).unwrap();
        let records: Vec<_> = (0..7).map(full_record).collect();
        for r in &records {
            w.append(r.clone()).unwrap();
        }
        // What kill -9 leaves: the file as the OS has it, no Parquet file, no drop.
        let journal = dir.path().join("run.journal");
        let left = fs::read(&journal).unwrap();
        std::mem::forget(w);
        let err = TraceWriter::open(cfg).unwrap_err().to_string();
        assert!(
            err.contains("earlier run") && err.contains("run.journal"),
            "{err}"
        );
        assert_eq!(fs::read(&journal).unwrap(), left);
        let header = read_header(&journal).unwrap().unwrap();
        assert_eq!(header.file, "run.parquet");
        assert_eq!(header.meta, test_meta());

        let (file, report) = recover_one_file(&journal, &[("interrupted", "killed")]).unwrap();
        assert_eq!((file.clone(), report.records), (path.clone(), 7));
        assert_eq!(names(dir.path()), vec!["run.parquet"]);
        let t = read_traces(&[path.to_str().unwrap()]).unwrap();
        assert_eq!(t.records, records);
        let mut want = test_meta();
        want.extra.insert("recovered".into(), "journal".into());
        want.extra.insert("interrupted".into(), "killed".into());
        assert_eq!(t.files[0].meta, want);
        // Nothing left to recover twice.
        assert!(recover_one_file(&journal, &[]).is_err());
    }

    /// Killed before the first record: the journal is there from the start, and recovery
    /// gives the empty file.
    #[test]
    fn a_one_file_writer_killed_before_any_record_recovers_an_empty_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.parquet");
        let (w, _) = TraceWriter::open(WriterConfig::one_file(&path, test_meta())).unwrap();
        std::mem::forget(w);
        let journal = dir.path().join("run.journal");
        assert!(journal.exists());
        let (file, report) = recover_one_file(&journal, &[]).unwrap();
        assert_eq!((file.as_path(), report.records), (path.as_path(), 0));
        let t = read_traces(&[path.to_str().unwrap()]).unwrap();
        assert!(t.records.is_empty());
        assert_eq!(t.files[0].meta.extra["recovered"], "journal");
    }

    #[test]
    fn a_journal_without_header_is_not_a_results_journal() {
        let dir = tempfile::tempdir().unwrap();
        let j = dir.path().join("cap-x.journal");
        let mut line = serde_json::to_vec(&full_record(0)).unwrap();
        line.push(b'\n');
        fs::write(&j, &line).unwrap();
        let err = recover_one_file(&j, &[]).unwrap_err().to_string();
        assert!(err.contains("no header"), "{err}");
        assert!(j.exists());
        // read_journal reads the records of both kinds alike.
        assert_eq!(read_journal(&j).unwrap().records.len(), 1);
    }
}
