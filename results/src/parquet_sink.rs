//! `replay --results` written as the run goes: a [`RowSink`] that hands every finished row to
//! a one-file [`TraceWriter`] (the writer capture uses, in its
//! [`WriterConfig::one_file`] mode) on its own thread, so the rows of a run of any length
//! need memory for a bounded queue only, and writing never runs on the engine's threads.
//!
//! The rows of every target go into one file, as they always did: its journal
//! ([`trace_format::journal::journal_path`], `run.parquet` → `run.journal`) holds every row
//! within [`FLUSH_EVERY`] of its request's end, and becomes the Parquet file (today's name,
//! schema and metadata) when the replay ends, with the metadata only known then (each
//! target's models and version, `interrupted` when a run was stopped). A `kill -9` leaves
//! the journal: `llmreplay merge` finishes it ([`recover`]), every row once, marked partial.
//! For an object URL the journal and the file are spooled in the temporary directory and the
//! file is uploaded when finished.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use trace_format::writer::CloseReport;
use trace_format::{FileMeta, TraceRecord, TraceWriter, WriterConfig};

use replay::error::ReplayError;
use replay::run::RunOutput;
use replay::RowSink;

use crate::outputs::{written, INTERRUPTED_KEY, TRACE_HASH_KEY};

/// Longest a finished row waits before it is handed to the OS: with the requests in flight,
/// what a `kill -9` of the replay loses.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// Rows queued for the writer thread at most; a full queue makes the run wait (a results
/// file never drops a row).
const QUEUE_ROWS: usize = 16 * 1024;

/// The `interrupted` value of a results file finished from its journal after a kill.
pub const KILLED: &str = "killed: recovered from journal";

enum Msg {
    Row(Box<TraceRecord>),
    Close(Box<FileMeta>),
}

/// The results file of a replay, written as rows finish. Call [`ResultsSink::close`] when
/// the replay has ended; dropped without it (an error), the journal is kept for recovery.
pub struct ResultsSink {
    dest: PathBuf,
    local: PathBuf,
    journal: PathBuf,
    tx: Option<SyncSender<Msg>>,
    thread: Option<JoinHandle<Option<CloseReport>>>,
    error: Arc<Mutex<Option<String>>>,
    meta: FileMeta,
    rows: u64,
}

/// What [`ResultsSink::close`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultsWritten {
    /// Where the file went (a path or an object URL).
    pub at: String,
    /// Its rows.
    pub rows: u64,
}

impl ResultsSink {
    /// Opens the journal of the results file `dest` (a path or an object URL) that will be
    /// written with `meta` (what is known before the run: see
    /// [`crate::outputs::results_meta`]). An error when a journal of an earlier run is there.
    pub fn create(dest: &Path, meta: FileMeta) -> Result<ResultsSink, ReplayError> {
        let local = match dest.to_str().filter(|s| store::is_url(s)) {
            Some(url) => {
                let name = url.rsplit('/').next().filter(|n| !n.is_empty());
                std::env::temp_dir().join(format!(
                    "llmreplay-results-{}-{}",
                    std::process::id(),
                    name.unwrap_or("results.parquet")
                ))
            }
            None => dest.to_path_buf(),
        };
        let journal = trace_format::journal::journal_path(&local);
        let mut cfg = WriterConfig::one_file(&local, meta.clone());
        cfg.flush_interval = FLUSH_EVERY;
        let (writer, _) = TraceWriter::open(cfg).map_err(|e| written(dest, e))?;
        let (tx, rx) = mpsc::sync_channel::<Msg>(QUEUE_ROWS);
        let error = Arc::new(Mutex::new(None));
        let err = error.clone();
        let thread = std::thread::Builder::new()
            .name("results-writer".into())
            .spawn(move || write_rows(writer, rx, &err))
            .map_err(|e| ReplayError::Io {
                path: journal.display().to_string(),
                cause: e,
            })?;
        Ok(ResultsSink {
            dest: dest.to_path_buf(),
            local,
            journal,
            tx: Some(tx),
            thread: Some(thread),
            error,
            meta,
            rows: 0,
        })
    }

    /// Records the replayed trace's content hash (known once the run has read the trace) in
    /// the file's metadata, as `trace_content_hash`, when it is finished.
    pub fn set_trace_hash(&mut self, hash: &str) {
        self.meta
            .extra
            .insert(TRACE_HASH_KEY.to_string(), hash.to_string());
    }

    /// The journal the rows go to until the file is finished (what to recover after a kill).
    pub fn journal(&self) -> &Path {
        &self.journal
    }

    /// Finishes the file (every row given, the metadata of every finished target) and
    /// uploads it when `dest` is an object URL.
    pub fn close(mut self) -> Result<ResultsWritten, ReplayError> {
        let meta = self.meta.clone();
        let tx = self.tx.take();
        if let Some(tx) = &tx {
            let _ = tx.send(Msg::Close(Box::new(meta)));
        }
        drop(tx);
        let report = self.thread.take().and_then(|t| t.join().ok()).flatten();
        let Some(report) = report else {
            return Err(self.failure("the results writer stopped"));
        };
        if let Some(e) = self.error.lock().ok().and_then(|e| e.clone()) {
            return Err(self.failure(&e));
        }
        if report.stats.dropped > 0 || !report.journals_left.is_empty() {
            return Err(self.failure(&format!(
                "{} rows could not be written{}",
                report.stats.dropped,
                report
                    .stats
                    .last_error
                    .map_or(String::new(), |e| format!(" ({e})"))
            )));
        }
        let at = match self.dest.to_str().filter(|s| store::is_url(s)) {
            Some(url) if report.files.is_empty() => {
                // No row: an empty file, as a replay always wrote one.
                store::write_trace(Path::new(url), &[], &self.meta)
                    .map_err(|e| written(&self.dest, e))?
            }
            Some(url) => {
                let r = store::upload_file(url, &self.local);
                if r.is_ok() {
                    let _ = std::fs::remove_file(&self.local);
                }
                r.map_err(|e| written(&self.dest, e))?
            }
            None if report.files.is_empty() => {
                trace_format::write_trace_file(&self.local, &[], &self.meta)
                    .map_err(|e| written(&self.dest, e))?;
                self.local.display().to_string()
            }
            None => self.local.display().to_string(),
        };
        Ok(ResultsWritten {
            at,
            rows: self.rows,
        })
    }

    fn failure(&self, why: &str) -> ReplayError {
        ReplayError::Write {
            path: self.dest.display().to_string(),
            source: trace_format::Error::Incomplete(format!(
                "{why}; the rows written so far are in {}",
                self.journal.display()
            )),
        }
    }
}

impl RowSink for ResultsSink {
    fn row(&mut self, rec: &TraceRecord) -> Result<(), ReplayError> {
        if let Some(e) = self.error.lock().ok().and_then(|e| e.clone()) {
            return Err(self.failure(&e));
        }
        let sent = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.send(Msg::Row(Box::new(rec.clone()))).is_ok());
        if !sent {
            return Err(self.failure("the results writer stopped"));
        }
        self.rows += 1;
        Ok(())
    }

    fn finish(&mut self, run: &RunOutput) -> Result<(), ReplayError> {
        crate::outputs::add_target_meta(&mut self.meta, run);
        Ok(())
    }
}

impl Drop for ResultsSink {
    /// Not closed: the writer thread hands what it has to the OS and keeps the journal.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The writer thread: appends rows as they come, hands them to the OS at least every
/// [`FLUSH_EVERY`], and finishes the file on `Close` (returns None when the sink went away
/// without closing: the journal stays).
fn write_rows(
    mut writer: TraceWriter,
    rx: mpsc::Receiver<Msg>,
    error: &Mutex<Option<String>>,
) -> Option<CloseReport> {
    let fail = |e: trace_format::Error| {
        if let Ok(mut slot) = error.lock() {
            slot.get_or_insert(e.to_string());
        }
    };
    loop {
        match rx.recv_timeout(FLUSH_EVERY / 2) {
            Ok(Msg::Row(rec)) => {
                if let Err(e) = writer.append(*rec) {
                    fail(e);
                }
            }
            Ok(Msg::Close(meta)) => {
                writer.set_meta(*meta);
                return Some(writer.finish());
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Err(e) = writer.tick() {
                    fail(e);
                }
            }
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// Finishes the journal a killed replay left for the results file it names (`run.journal`,
/// or the results path `run.parquet` whose journal is there): every row once, into that
/// file, marked `interrupted` = [`KILLED`]. Returns the file and its rows.
pub fn recover(path: &Path) -> Result<(PathBuf, usize), ReplayError> {
    let journal = if path.extension().is_some_and(|e| e == "journal") {
        path.to_path_buf()
    } else {
        trace_format::journal::journal_path(path)
    };
    let (file, report) =
        trace_format::journal::recover_one_file(&journal, &[(INTERRUPTED_KEY, KILLED)])
            .map_err(|e| written(&journal, e))?;
    Ok((file, report.records))
}

/// Whether `input` (a `merge`/`report` input) names a journal to recover first: a
/// `.journal` file, or a results file that is not there but whose journal is.
pub fn needs_recovery(input: &str) -> bool {
    let p = Path::new(input);
    if store::is_url(input) {
        return false;
    }
    (p.extension().is_some_and(|e| e == "journal") && p.is_file())
        || (!p.exists() && trace_format::journal::journal_path(p).is_file())
}
