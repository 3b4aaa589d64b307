//! The journal of a [`TraceWriter`](crate::TraceWriter) and its recovery: reading a journal
//! (every intact record, also after damage) and finishing what a previous writer left in a
//! directory ([`recover_dir`]), so a crash loses no record older than the writer's
//! `flush_interval`. The journal format is one JSON line per record, `request_id` first.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::encode::{sync_dir, write_trace_file, TMP_SUFFIX};
use crate::error::{Error, Result};
use crate::file_meta::FileMeta;
use crate::schema::TraceRecord;

/// Extension of journal files.
pub(crate) const JOURNAL_EXT: &str = "journal";

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
    let parquet = journal.with_extension("parquet");
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
