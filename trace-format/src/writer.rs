//! The rotating, crash-safe [`TraceWriter`] that a long-running capture proxy feeds from its
//! own thread. (A one-shot file is [`write_trace_file`]; both write Parquet through
//! [`crate::encode`], durable and mode 0600; the journal and its recovery are
//! [`crate::journal`].)
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
//!
//! # A directory that cannot take writes (full disk)
//!
//! The writer never fails its owner for its directory: every error is counted in
//! [`WriterStats`] and writing resumes by itself when the directory takes writes again.
//! - A journal hand-over that fails part way keeps the whole lines that made it and cuts the
//!   file back to them, so a journal never holds a torn line before good ones; the records
//!   of the other lines are dropped, counted exactly in [`WriterStats::dropped`]. While
//!   the directory fails, the hand-over is tried once per `flush_interval`.
//! - A Parquet file that cannot be written leaves its journal (no record is lost): it is
//!   retried by [`TraceWriter::tick`] (after 1 s, doubling up to 30 s, and at once when a
//!   journal write succeeds again), and otherwise finished by the next `open`.
//! - Recovery never refuses to open: journals it cannot finish are kept and retried, and
//!   damaged journals are set aside (see [`recover_dir`]).

use std::fs::{self, File};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::encode::{create_private, tmp_path};
use crate::error::{Error, Result};
use crate::file_meta::FileMeta;
use crate::journal::write_trace_file_from_journal;
use crate::journal::{
    journal_header, journal_path, recover_dir, recover_journal, recovered_meta, JOURNAL_EXT,
};
/// The reports of [`TraceWriter::open`] and [`TraceWriter::finish`] (the journal's, see
/// [`crate::journal`]).
pub use crate::journal::{DeferredJournal, RecoveryReport};
use crate::redact;
use crate::schema::TraceRecord;

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
    /// One file, never rotated: `prefix` is the Parquet file's whole name in `dir`, its
    /// journal (created by `open`) is [`journal_path`]`(dir/prefix)`, a header line holding the
    /// file's name and `meta` first (so a journal left by a crash is finished under its name and
    /// metadata by [`crate::journal::recover_one_file`]). Opening recovers nothing and
    /// refuses when that journal exists (an earlier run's rows, to recover first). For
    /// results written as a run goes (`replay --results`). See [`WriterConfig::one_file`].
    pub one_file: bool,
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
            one_file: false,
        }
    }

    /// One Parquet file at `path` (see [`WriterConfig::one_file`](#structfield.one_file)),
    /// journalled beside it, every record handed to the OS within `flush_interval`.
    pub fn one_file(path: &Path, meta: FileMeta) -> Self {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        WriterConfig {
            max_file_bytes: u64::MAX,
            max_file_age: Duration::MAX,
            one_file: true,
            ..WriterConfig::new(dir, name, meta)
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

/// What a [`TraceWriter`] did to its directory so far: the counters a capture proxy exports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Records handed to the OS in a journal. They reach a Parquet file at rotation, or (after
    /// a crash, or when the directory could not take the Parquet file) by recovery.
    pub written: u64,
    /// Records that will never reach a file: the directory could not take their journal
    /// line (full disk, I/O error). Exact: every record given to
    /// [`append`](TraceWriter::append) ends up in `written` or here.
    pub dropped: u64,
    /// Failed writes to the directory (journal lines, new journals, Parquet files, retries).
    pub errors: u64,
    /// The last of those errors.
    pub last_error: Option<String>,
    /// Whether the last write of records (a journal line, a new journal or a Parquet file)
    /// failed; cleared by the next one that succeeds.
    pub failing: bool,
    /// Journals waiting to be finished into Parquet (retried, see [`TraceWriter::tick`]).
    pub journals_pending: usize,
    /// Records those journals hold.
    pub records_pending: usize,
    /// Records finished from journals by recovery (at open and by later retries).
    pub recovered_records: u64,
    /// Damaged journal lines found by recovery.
    pub damaged_lines: u64,
    /// Journals set aside (renamed `<name>.damaged-<utc>`) by recovery.
    pub set_aside: u64,
    /// Torn final journal lines dropped by recovery (the crash window).
    pub torn_lines: u64,
}

/// What [`TraceWriter::finish`] left.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloseReport {
    /// Every file this writer finished, in order.
    pub files: Vec<PathBuf>,
    /// Journals kept for the next [`TraceWriter::open`] to finish (the directory could not
    /// take their Parquet files), with the records they hold.
    pub journals_left: Vec<DeferredJournal>,
    /// The final counters.
    pub stats: WriterStats,
    /// Messages about journals finished or set aside by the last try (for the log).
    pub notices: Vec<String>,
}

/// Bytes of journal lines kept before they are handed to the OS regardless of the interval.
const JOURNAL_BUF: usize = 64 * 1024;
/// First wait before a journal that could not be finished is tried again (doubling).
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest wait between two tries of a journal that could not be finished.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The file currently being written: its journal and the records kept in memory.
struct Segment {
    journal_path: PathBuf,
    parquet_path: PathBuf,
    file: File,
    /// Length of the whole lines handed to the OS: the journal's valid length.
    committed_len: u64,
    /// Whether bytes past `committed_len` may be in the file (a truncation failed).
    tail_dirty: bool,
    /// Lines not handed to the OS yet: `buf_records` records, of these approximate sizes.
    buf: Vec<u8>,
    buf_records: usize,
    buf_sizes: Vec<u64>,
    /// Records in the segment (in the journal, or in `buf`). Their rows are not kept in
    /// memory: the Parquet file is written from the journal when the segment ends, so
    /// memory stays bounded whatever the file's size or age.
    records: usize,
    bytes: u64,
    opened: Instant,
    /// UTC hours since the epoch when the segment was started (its name's stamp).
    hour: i64,
    last_flush: Instant,
}

impl Segment {
    /// Hands the buffered lines to the OS, at the journal's valid length. When the write
    /// fails part way (ENOSPC), the whole lines that made it are kept, the rest of the file
    /// is cut off (so a journal never holds a torn line before a good one) and the records
    /// of the lines that did not make it are dropped: counted in `stats.dropped`.
    fn flush(&mut self, stats: &mut WriterStats) -> Result<()> {
        self.last_flush = Instant::now();
        if self.buf.is_empty() {
            return Ok(());
        }
        let mut written = 0;
        let mut failure = self.file.seek(SeekFrom::Start(self.committed_len)).err();
        while failure.is_none() && written < self.buf.len() {
            match self.file.write(&self.buf[written..]) {
                Ok(0) => failure = Some(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => failure = Some(e),
            }
        }
        let (keep, kept_records) = match failure {
            None => (self.buf.len(), self.buf_records),
            Some(_) => {
                let keep = memchr::memrchr(b'\n', &self.buf[..written]).map_or(0, |i| i + 1);
                (keep, memchr::memchr_iter(b'\n', &self.buf[..keep]).count())
            }
        };
        self.committed_len += keep as u64;
        if failure.is_some() || self.tail_dirty {
            self.tail_dirty = self.file.set_len(self.committed_len).is_err();
        }
        let lost = self.buf_records - kept_records;
        let lost_bytes: u64 = self.buf_sizes[kept_records..].iter().sum();
        self.records -= lost;
        self.buf_sizes.clear();
        self.bytes = self.bytes.saturating_sub(lost_bytes);
        stats.written += kept_records as u64;
        stats.dropped += lost as u64;
        self.buf.clear();
        self.buf_records = 0;
        match failure {
            None => Ok(()),
            Some(e) => Err(Error::io(&self.journal_path, e)),
        }
    }
}

/// A rotating, crash-safe trace writer (synchronous; give it its own thread). See the
/// module documentation for the journal, the loss window and a directory that cannot take
/// writes.
///
/// Dropping it without [`close`](TraceWriter::close) hands buffered records to the OS and
/// leaves the journal for the next [`open`](TraceWriter::open) to recover.
pub struct TraceWriter {
    cfg: WriterConfig,
    current: Option<Segment>,
    finished: Vec<PathBuf>,
    seq: u64,
    line: Vec<u8>,
    stats: WriterStats,
    /// Journals not finished yet (recovery or a rotation could not write their Parquet).
    deferred: Vec<DeferredJournal>,
    retry_at: Instant,
    retry_wait: Duration,
    notices: Vec<String>,
}

impl std::fmt::Debug for TraceWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("dir", &self.cfg.dir)
            .field("prefix", &self.cfg.prefix)
            .field("current", &self.current.as_ref().map(|s| &s.journal_path))
            .field("finished", &self.finished)
            .field("stats", &self.stats)
            .finish()
    }
}

impl TraceWriter {
    /// Creates `cfg.dir` if needed, recovers journals left there by a previous run (see
    /// [`recover_dir`]), and returns a writer with no file open yet.
    ///
    /// Only a directory that cannot be created or listed is an error: what recovery cannot
    /// finish (a full disk) is in [`RecoveryReport::deferred`], kept, and retried by the
    /// writer while it runs; damaged journals are set aside.
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
        let report = if cfg.one_file {
            let journal = journal_path(&cfg.dir.join(&cfg.prefix));
            if journal.exists() {
                return Err(Error::Invalid(format!(
                    "{} holds the rows of an earlier run that did not finish: recover them \
                     first (`llmreplay merge {} -o OUT`), or remove it",
                    journal.display(),
                    journal.display()
                )));
            }
            RecoveryReport::default()
        } else {
            // A previous start's journals: this start's loss counts are not theirs.
            let mut meta = cfg.meta.clone();
            if let Some(p) = meta.privacy.as_mut() {
                p.loss = None;
            }
            recover_dir(&cfg.dir, &meta)?
        };
        let mut writer = TraceWriter {
            cfg,
            current: None,
            finished: Vec::new(),
            seq: 0,
            line: Vec::with_capacity(4096),
            stats: WriterStats::default(),
            deferred: Vec::new(),
            retry_at: Instant::now() + RETRY_FIRST,
            retry_wait: RETRY_FIRST,
            notices: Vec::new(),
        };
        writer.absorb(&report, false);
        if writer.cfg.one_file {
            // The journal exists from the start: what a kill at any moment leaves.
            writer.current = Some(writer.start_segment()?);
        }
        Ok((writer, report))
    }

    /// Appends one record (to the journal buffer and to memory), handing the buffer to the
    /// OS if `flush_interval` has passed and rotating if the size limit is reached.
    ///
    /// An error says a write to the directory failed during this call; the writer has dealt
    /// with it, so never append the record again: records whose lines could not be written
    /// are counted in [`WriterStats::dropped`], a Parquet file that could not be written
    /// stays as its journal (retried by [`tick`](TraceWriter::tick), else finished by the
    /// next `open`). Writing resumes by itself once the directory takes writes again.
    pub fn append(&mut self, mut rec: TraceRecord) -> Result<()> {
        redact::redact_record(&mut rec);
        let mut result = Ok(());
        if self.hour_changed() {
            keep_first(&mut result, self.rotate());
        }
        if self.current.is_none() {
            match self.start_segment() {
                Ok(seg) => self.current = Some(seg),
                Err(e) => {
                    self.stats.dropped += 1;
                    self.note_error(&e);
                    return Err(e);
                }
            }
        }
        let Some(seg) = self.current.as_mut() else {
            return Err(Error::Invalid("no current trace file".into()));
        };
        self.line.clear();
        if let Err(e) = serde_json::to_writer(&mut self.line, &rec) {
            self.stats.dropped += 1;
            return Err(Error::format(&seg.journal_path, e));
        }
        self.line.push(b'\n');
        seg.buf.extend_from_slice(&self.line);
        seg.buf_records += 1;
        let size = rec.approx_bytes() as u64;
        seg.bytes += size;
        seg.buf_sizes.push(size);
        seg.records += 1;
        // While the directory fails, it is tried once per interval only.
        let due = seg.last_flush.elapsed() >= self.cfg.flush_interval
            || (!self.stats.failing && seg.buf.len() >= JOURNAL_BUF);
        if due {
            keep_first(&mut result, self.flush_current());
        }
        if self
            .current
            .as_ref()
            .is_some_and(|s| s.bytes >= self.cfg.max_file_bytes)
        {
            keep_first(&mut result, self.rotate());
        }
        result
    }

    /// Hands buffered records to the OS, rotates the file if it is older than
    /// `max_file_age`, and retries journals that could not be finished (after 1 s, doubling
    /// up to 30 s; at once when the directory takes writes again). Call it at least every
    /// `flush_interval`. Errors: as for [`append`](TraceWriter::append).
    pub fn tick(&mut self) -> Result<()> {
        let mut result = Ok(());
        let hour_changed = self.hour_changed();
        if self.current.is_some() {
            keep_first(&mut result, self.flush_current());
            let old = self
                .current
                .as_ref()
                .is_some_and(|s| s.opened.elapsed() >= self.cfg.max_file_age);
            if old || hour_changed {
                keep_first(&mut result, self.rotate());
            }
        }
        self.retry_deferred(false);
        result
    }

    /// The counters so far.
    pub fn stats(&self) -> &WriterStats {
        &self.stats
    }

    /// Takes the messages about journals finished, deferred or set aside since the last
    /// call (rare events, for the owner's log).
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// With `rotate_on_hour`: whether the current file was started in an earlier UTC hour.
    fn hour_changed(&self) -> bool {
        self.cfg.rotate_on_hour
            && self
                .current
                .as_ref()
                .is_some_and(|seg| seg.hour != utc_hour(chrono::Utc::now()))
    }

    /// Replaces the metadata of the files finished from now on: what is only known at the
    /// end (a run's settings and targets) goes into the file when it is finished. The journal
    /// header of a [`WriterConfig::one_file`] writer keeps the metadata it was opened with.
    pub fn set_meta(&mut self, meta: FileMeta) {
        self.cfg.meta = meta;
    }

    /// Sets what the owner knows it lost so far, written into the manifest of the files
    /// finished from now on (when the metadata has a manifest); the writer puts its own count
    /// of rows the directory could not take ([`WriterStats::dropped`]) in `write_failed` as
    /// each file closes.
    pub fn set_loss(&mut self, loss: crate::privacy::Loss) {
        if let Some(p) = self.cfg.meta.privacy.as_mut() {
            p.loss = Some(loss);
        }
    }

    /// The metadata of a file closing now: with the loss counts as of now.
    fn meta_at_close(&self) -> FileMeta {
        let mut meta = self.cfg.meta.clone();
        if let Some(l) = meta.privacy.as_mut().and_then(|p| p.loss.as_mut()) {
            l.write_failed = self.stats.dropped;
        }
        meta
    }

    /// Files finished so far.
    pub fn finished(&self) -> &[PathBuf] {
        &self.finished
    }

    /// Finishes the current file, tries the journals not finished yet once more, and
    /// returns every file this writer finished. Any shortfall is an error
    /// ([`Error::Incomplete`]): records were dropped, or journals are left for the next
    /// `open`. [`finish`](TraceWriter::finish) reports the same without failing.
    pub fn close(self) -> Result<Vec<PathBuf>> {
        let dir = self.cfg.dir.clone();
        let r = self.finish();
        if r.stats.dropped > 0 || !r.journals_left.is_empty() {
            return Err(Error::Incomplete(format!(
                "{}: {} records dropped, {} journal(s) left for the next start{}",
                dir.display(),
                r.stats.dropped,
                r.journals_left.len(),
                r.stats
                    .last_error
                    .map_or(String::new(), |e| format!(" (last error: {e})"))
            )));
        }
        Ok(r.files)
    }

    /// Finishes the current file (records whose lines cannot be written are dropped and
    /// counted; a Parquet file that cannot be written stays as its journal), tries the
    /// journals not finished yet once more, and says what it finished and what it left.
    pub fn finish(mut self) -> CloseReport {
        let _ = self.rotate();
        // What is still unfinished is in `journals_left`: no "retried later" notice.
        self.notices.clear();
        self.retry_deferred(true);
        self.stats.journals_pending = self.deferred.len();
        CloseReport {
            files: std::mem::take(&mut self.finished),
            journals_left: std::mem::take(&mut self.deferred),
            stats: self.stats.clone(),
            notices: std::mem::take(&mut self.notices),
        }
    }

    fn note_error(&mut self, e: &Error) {
        self.stats.errors += 1;
        self.stats.last_error = Some(e.to_string());
        self.stats.failing = true;
    }

    /// A write of records succeeded: the directory takes writes again, so the journals
    /// waiting are tried at the next tick.
    fn note_ok(&mut self) {
        if self.stats.failing {
            self.stats.failing = false;
            self.retry_at = Instant::now();
        }
    }

    fn flush_current(&mut self) -> Result<()> {
        let Some(seg) = self.current.as_mut() else {
            return Ok(());
        };
        let had = !seg.buf.is_empty();
        match seg.flush(&mut self.stats) {
            Ok(()) => {
                if had {
                    self.note_ok();
                }
                Ok(())
            }
            Err(e) => {
                self.note_error(&e);
                Err(e)
            }
        }
    }

    /// Ends the current segment: writes its records to Parquet and deletes its journal. A
    /// Parquet file that cannot be written leaves the journal (deferred: retried later, or
    /// finished by the next `open`) and the next record starts a new segment, so memory
    /// stays bounded by one file's records.
    fn rotate(&mut self) -> Result<()> {
        if self.current.is_none() {
            return Ok(());
        }
        let mut result = self.flush_current();
        let Some(seg) = self.current.take() else {
            return result;
        };
        let Segment {
            journal_path,
            parquet_path,
            file,
            records,
            ..
        } = seg;
        drop(file);
        if records == 0 {
            // Nothing reached the journal: an empty file (or its removal fails and the next
            // open removes it).
            let _ = fs::remove_file(&journal_path);
            return result;
        }
        let meta = self.meta_at_close();
        match write_trace_file_from_journal(&parquet_path, &journal_path, records, &meta) {
            Ok(()) => {
                self.note_ok();
                if let Err(e) = fs::remove_file(&journal_path) {
                    // The next open finds the Parquet file and removes the journal.
                    let e = Error::io(&journal_path, e);
                    self.stats.errors += 1;
                    self.stats.last_error = Some(e.to_string());
                }
                self.finished.push(parquet_path);
            }
            Err(e) => {
                self.note_error(&e);
                self.notices.push(format!(
                    "{} could not be written ({e}); its {} records stay in {}, retried while \
                     running and by the next start",
                    parquet_path.display(),
                    records,
                    journal_path.display()
                ));
                self.deferred.push(DeferredJournal {
                    journal: journal_path,
                    records,
                    reason: e.to_string(),
                });
                self.stats.journals_pending = self.deferred.len();
                self.stats.records_pending = self.deferred.iter().map(|d| d.records).sum();
                keep_first(&mut result, Err(e));
            }
        }
        result
    }

    /// Tries the journals not finished yet: when due (backoff), or always with `force`.
    fn retry_deferred(&mut self, force: bool) {
        if self.deferred.is_empty() || (!force && Instant::now() < self.retry_at) {
            return;
        }
        let meta = recovered_meta(&self.meta_at_close());
        let mut report = RecoveryReport::default();
        for d in std::mem::take(&mut self.deferred) {
            recover_journal(&d.journal, &meta, &mut report);
        }
        let progress = !report.files.is_empty();
        self.absorb(&report, true);
        if progress || self.deferred.is_empty() {
            self.retry_wait = RETRY_FIRST;
        } else {
            self.retry_wait = (self.retry_wait * 2).min(RETRY_MAX);
        }
        self.retry_at = Instant::now() + self.retry_wait;
    }

    /// Counts what a recovery did; with `later`, also notes it for the log (at open the
    /// owner reports the [`RecoveryReport`] itself).
    fn absorb(&mut self, report: &RecoveryReport, later: bool) {
        let s = &mut self.stats;
        s.recovered_records += report.records as u64;
        s.damaged_lines += report.damaged_lines.len() as u64;
        s.set_aside += report.set_aside.len() as u64;
        s.torn_lines += report.torn_lines as u64;
        if later {
            s.errors += (report.deferred.len() + report.errors.len()) as u64;
            if let Some(d) = report.deferred.last() {
                s.last_error = Some(format!("{}: {}", d.journal.display(), d.reason));
            }
            for f in &report.files {
                self.notices
                    .push(format!("finished {} from its journal", f.display()));
            }
            for p in &report.set_aside {
                self.notices.push(format!(
                    "journal with damaged lines set aside as {} (its intact records are \
                     finished)",
                    p.display()
                ));
            }
            self.notices.extend(report.errors.iter().cloned());
            self.finished.extend(report.files.iter().cloned());
        }
        self.deferred.extend(report.deferred.iter().cloned());
        self.stats.journals_pending = self.deferred.len();
        self.stats.records_pending = self.deferred.iter().map(|d| d.records).sum();
    }

    /// Creates the next journal, with a name no file in the directory has yet (in
    /// [`WriterConfig::one_file`] mode: the file's journal, header line first).
    fn start_segment(&mut self) -> Result<Segment> {
        let wall = chrono::Utc::now();
        if self.cfg.one_file {
            if self.seq > 0 {
                return Err(Error::Invalid(format!(
                    "{}: a one-file writer writes its file once",
                    self.cfg.prefix
                )));
            }
            self.seq += 1;
            let parquet_path = self.cfg.dir.join(&self.cfg.prefix);
            let journal_path = journal_path(&parquet_path);
            let mut file = create_private(&journal_path, true)?;
            let header = journal_header(&self.cfg.prefix, &self.cfg.meta);
            file.write_all(&header)
                .map_err(|e| Error::io(&journal_path, e))?;
            let mut seg = Segment::new(journal_path, parquet_path, file, wall);
            seg.committed_len = header.len() as u64;
            return Ok(seg);
        }
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
            return Ok(Segment::new(journal_path, parquet_path, file, wall));
        }
    }
}

impl Segment {
    /// A new, empty segment whose journal `file` was just created.
    fn new(
        journal_path: PathBuf,
        parquet_path: PathBuf,
        file: File,
        wall: chrono::DateTime<chrono::Utc>,
    ) -> Segment {
        let now = Instant::now();
        Segment {
            journal_path,
            parquet_path,
            file,
            committed_len: 0,
            tail_dirty: false,
            buf: Vec::with_capacity(JOURNAL_BUF),
            buf_records: 0,
            buf_sizes: Vec::new(),
            records: 0,
            bytes: 0,
            opened: now,
            hour: utc_hour(wall),
            last_flush: now,
        }
    }
}

impl Drop for TraceWriter {
    /// Hands buffered records to the OS; the journal stays for the next `open`.
    fn drop(&mut self) {
        if let Some(seg) = self.current.as_mut() {
            let _ = seg.flush(&mut self.stats);
        }
    }
}

/// Keeps the first error of several steps.
fn keep_first(result: &mut Result<()>, r: Result<()>) {
    if let (Ok(()), Err(e)) = (&*result, r) {
        *result = Err(e);
    }
}

/// UTC hours since the epoch.
fn utc_hour(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp().div_euclid(3600)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::encode::{records_to_batch, tmp_path, write_trace_file};
    use crate::journal::read_journal;
    use crate::reader::read_traces;
    use crate::schema::{self, meta, Outcome};
    use crate::test_records::{file_names as list, full_record, test_meta};

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

    /// A damaged line in the middle no longer stops recovery (it used to be an error that
    /// kept capture from starting): the records around it are finished, the journal is set
    /// aside under a new name and the report names the file and the line.
    #[test]
    fn corrupt_journal_line_in_the_middle_is_set_aside_naming_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("cap-x.journal");
        let mut data = serde_json::to_vec(&full_record(0)).unwrap();
        data.extend_from_slice(b"\n{not json\n");
        data.extend_from_slice(&serde_json::to_vec(&full_record(1)).unwrap());
        data.push(b'\n');
        fs::write(&journal, &data).unwrap();
        let report = recover_dir(dir.path(), &test_meta()).unwrap();
        assert_eq!(report.records, 2);
        assert_eq!(report.damaged_lines, vec![(journal.clone(), 2)]);
        assert_eq!(report.set_aside.len(), 1);
        let aside = &report.set_aside[0];
        assert!(
            aside.to_string_lossy().contains("cap-x.journal.damaged-"),
            "{aside:?}"
        );
        assert!(!journal.exists());
        assert_eq!(
            fs::read(aside).unwrap(),
            data,
            "the journal is kept for inspection"
        );
        let t = read_traces(&[dir.path().join("cap-x.parquet").to_str().unwrap()]).unwrap();
        assert_eq!(t.records, vec![full_record(0), full_record(1)]);
    }

    /// The journal the issue found: a record over 64 KiB cut by ENOSPC with the next record
    /// glued to its torn part, and a damaged line in the middle. Every intact record is
    /// recovered (also the glued one and those after the damage), the journal is set aside
    /// under a new name, byte for byte, and nothing is deleted.
    #[test]
    fn damaged_and_torn_big_lines_are_set_aside_and_every_intact_line_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("cap-20240101T000000Z-000000.journal");
        let line = |r: &TraceRecord| {
            let mut v = serde_json::to_vec(r).unwrap();
            v.push(b'\n');
            v
        };
        let mut big = full_record(10);
        big.body = Some("x".repeat(100 * 1024));
        let mut torn = serde_json::to_vec(&big).unwrap();
        assert!(torn.len() > 64 * 1024);
        torn.truncate(75_000);
        let mut data = Vec::new();
        data.extend(line(&full_record(0)));
        data.extend(line(&full_record(1)));
        data.extend_from_slice(b"{not json\n");
        data.extend(line(&full_record(2)));
        data.extend_from_slice(&torn); // cut by ENOSPC, no newline ...
        data.extend(line(&full_record(3))); // ... and the next record written after it
        data.extend(line(&full_record(4)));
        fs::write(&journal, &data).unwrap();

        let report = recover_dir(dir.path(), &test_meta()).expect("recovery never refuses");
        assert_eq!(report.records, 5);
        assert_eq!(report.torn_lines, 0);
        assert_eq!(
            report.damaged_lines,
            vec![(journal.clone(), 3), (journal.clone(), 5)]
        );
        assert_eq!(report.set_aside.len(), 1);
        assert!(report.deferred.is_empty() && report.errors.is_empty());
        let parquet = dir.path().join("cap-20240101T000000Z-000000.parquet");
        assert_eq!(report.files, vec![parquet.clone()]);
        let t = read_traces(&[parquet.to_str().unwrap()]).unwrap();
        let want: Vec<_> = (0..5).map(full_record).collect();
        assert_eq!(t.records, want);
        let names = list(dir.path());
        assert_eq!(names.len(), 2, "{names:?}");
        let aside = names
            .iter()
            .find(|n| n.starts_with("cap-20240101T000000Z-000000.journal.damaged-"))
            .unwrap_or_else(|| panic!("journal not set aside: {names:?}"));
        assert_eq!(
            fs::read(dir.path().join(aside)).unwrap(),
            data,
            "kept byte for byte"
        );
        // A second recovery finds nothing more to do and touches nothing.
        let again = recover_dir(dir.path(), &test_meta()).unwrap();
        assert_eq!(again.records, 0);
        assert_eq!(list(dir.path()), names);
    }

    /// A small tmpfs mounted on a fresh temp dir, unmounted on drop: a disk that really
    /// fills. `None` (after a loud SKIP) when not root; CI runs as root.
    pub(crate) struct Tmpfs {
        pub(crate) dir: tempfile::TempDir,
    }

    impl Tmpfs {
        pub(crate) fn mount(size: &str) -> Option<Tmpfs> {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                eprintln!("SKIP: not root, cannot mount a tmpfs to fill a disk (CI runs as root)");
                return None;
            }
            let dir = tempfile::tempdir().unwrap();
            let st = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(dir.path())
                .status()
                .expect("run mount");
            assert!(st.success(), "mount -t tmpfs failed as root: {st:?}");
            Some(Tmpfs { dir })
        }

        pub(crate) fn path(&self) -> &Path {
            self.dir.path()
        }

        /// Fills the file system with `fill` until it is full.
        pub(crate) fn fill(&self) {
            let mut f = File::create(self.path().join("fill")).unwrap();
            let block = vec![0u8; 4096];
            loop {
                match f.write(&block) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                    Err(e) => panic!("filling the tmpfs: {e}"),
                }
            }
        }

        pub(crate) fn free(&self) {
            fs::remove_file(self.path().join("fill")).unwrap();
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg(self.dir.path())
                .status();
        }
    }

    fn big_record(i: i64) -> TraceRecord {
        let mut r = full_record(i);
        r.body = Some("y".repeat(3000));
        r
    }

    /// On a full disk: every record is either in the journal or counted as dropped, the
    /// journal never holds a torn line, writing resumes once there is space, a Parquet file
    /// that cannot be written leaves its journal, and opening on the still-full disk works,
    /// keeps that journal and finishes it once there is space again.
    #[test]
    fn full_disk_drops_exactly_keeps_journals_whole_and_resumes() {
        let Some(fs_) = Tmpfs::mount("256k") else {
            return;
        };
        let out = fs_.path().join("cap");
        let mut cfg = WriterConfig::new(&out, "cap", test_meta());
        cfg.flush_interval = Duration::ZERO; // every append is handed to the OS
        let (mut w, _) = TraceWriter::open(cfg.clone()).unwrap();
        for i in 0..3 {
            w.append(big_record(i)).unwrap();
        }
        assert_eq!(w.stats().written, 3);
        fs_.fill();
        let mut failed = 0;
        for i in 3..40 {
            failed += usize::from(w.append(big_record(i)).is_err());
        }
        let st = w.stats().clone();
        assert!(st.failing && failed > 0 && st.errors > 0, "{st:?}");
        assert_eq!(st.written + st.dropped, 40, "{st:?}");
        assert!(st.dropped >= 30, "{st:?}");
        let journal = out.join(&list(&out)[0]);
        let on_disk = read_journal(&journal).unwrap();
        assert_eq!(on_disk.torn_lines, 0);
        assert!(on_disk.damaged_lines.is_empty());
        let kept: Vec<_> = on_disk
            .records
            .iter()
            .map(|r| r.request_id.clone())
            .collect();
        let want: Vec<_> = (0..st.written as i64).map(|i| format!("req-{i}")).collect();
        assert_eq!(kept, want, "the journal holds exactly the records written");

        // Space again: the next records are written.
        fs_.free();
        w.append(big_record(100)).unwrap();
        w.append(big_record(101)).unwrap();
        assert!(!w.stats().failing);
        assert_eq!(w.stats().written, st.written + 2);
        let r = w.finish();
        assert!(r.journals_left.is_empty(), "{r:?}");
        assert_eq!(r.stats.dropped, st.dropped);
        let t = read_traces(&[out.to_str().unwrap()]).unwrap();
        assert_eq!(t.records.len() as u64, st.written + 2);

        // Journal written, then the disk fills: the Parquet file cannot be written, the
        // journal stays whole and is reported; nothing is dropped.
        let (mut w, _) = TraceWriter::open(cfg.clone()).unwrap();
        for i in 200..205 {
            w.append(big_record(i)).unwrap();
        }
        fs_.fill();
        let r = w.finish();
        assert_eq!(r.stats.dropped, 0);
        assert_eq!(r.journals_left.len(), 1, "{r:?}");
        assert_eq!(r.journals_left[0].records, 5);
        let left = r.journals_left[0].journal.clone();
        assert_eq!(read_journal(&left).unwrap().records.len(), 5);

        // Opening on the still-full disk: no error, the journal is kept and deferred.
        let (mut w, report) = TraceWriter::open(cfg.clone()).expect("open on a full disk");
        assert_eq!(report.deferred.len(), 1, "{report:?}");
        assert_eq!(report.deferred[0].journal, left);
        assert!(left.exists());
        assert_eq!(w.stats().journals_pending, 1);
        w.tick().unwrap();
        assert!(left.exists(), "not retried before its backoff");
        // Space again: a tick after the backoff (1 s) finishes it, while the writer runs.
        fs_.free();
        std::thread::sleep(RETRY_FIRST + Duration::from_millis(50));
        w.tick().unwrap();
        assert!(!left.exists());
        assert_eq!(w.stats().journals_pending, 0);
        assert_eq!(w.take_notices().len(), 1);
        let r = w.finish();
        assert!(r.journals_left.is_empty(), "{r:?}");
        assert!(!left.exists());
        assert_eq!(r.stats.recovered_records, 5);
        let t = read_traces(&[out.to_str().unwrap()]).unwrap();
        assert_eq!(t.records.len() as u64, st.written + 2 + 5);
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
        let on_disk = read_journal(&journal).unwrap();
        assert_eq!((on_disk.records, on_disk.torn_lines), (records.clone(), 0));
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
        assert_eq!(read_journal(&journal).unwrap().records.len(), 2);
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
