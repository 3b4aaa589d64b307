//! Reading a trace of any size in arrival order with bounded memory: [`TraceStream`].
//!
//! [`TraceStream::open`] takes the inputs [`read_traces`](crate::read_traces) takes (files,
//! directories, globs; object-store URLs through [`TraceStream::open_with`]), with the same
//! expansion, deduplication and errors, and reads each file's footer — not its rows, so
//! opening takes the same time for any number of rows: its rows, first and last arrival, and
//! its **disorder** — how far (in µs) a row arrived before the latest arrival above it in
//! the file ([`FileOrder`]). A file `synth` or `import` wrote is sorted (disorder 0); capture
//! appends a row when its request ends, so its rows are out of arrival order by at most the
//! longest request in flight beside them. Every llmreplay writer records the order in the
//! footer ([`crate::order`]); for a file without it (an older llmreplay, another tool) the
//! extent comes from the row groups' `arrival_time` statistics and the disorder from a pass
//! that decodes only that column, made when the merge first reaches the file (so a month of
//! such files is measured one file at a time, as it is read); a file without statistics
//! either is measured when it is opened.
//!
//! [`TraceStream::records`] (callable again, for soak passes) then yields every record in
//! exactly the order [`read_traces`](crate::read_traces) sorts to — by arrival, stable, file
//! order breaking ties — holding, per file open at that moment:
//! - one row group's decoder and at most [`STREAM_BATCH_ROWS`] decoded rows, and
//! - a reorder buffer of the rows that arrived within the file's disorder of its latest
//!   arrival read so far (a row is released once no later row of the file can arrive before
//!   it; with disorder 0 the buffer holds one row).
//!
//! A file is opened when the merge reaches its first arrival and closed after its last row,
//! so a month of hourly captures holds one or two files at a time, and files that overlap in
//! time (replicas of a proxy) are merged k-way. A file of an object store is fetched whole
//! when it is opened (`RemoteFile::fetch`) and dropped when it is done: its bytes count
//! towards the bound while it is open.
//!
//! Every check of the whole-file reader applies (page validation before each row group,
//! the panic guard around each decoder call, strict values): the stream reads through the
//! same code ([`crate::reader`]'s file module). A file that changed after it was opened, or
//! whose footer misstates its rows (a row outside the recorded extent or out of the recorded
//! order, a different row count), is an error naming it.
//!
//! The [content hash](TraceStream::content_hash) and [each capture's share](TraceStream::captures)
//! are taken as the records go by: after one full pass of [`TraceStream::records`] (a replay
//! that reads the whole trace) they are known without another read.
//!
//! [`TraceStream::open_in`] reads only the rows of a time [`Window`] (`--since/--until`): the
//! files are placed against it by their footers' extent, those outside it dropped unread, those
//! across an edge counted by their arrival column and read only as far as the window goes.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use arrow_array::RecordBatch;

use crate::captures::{CaptureCounter, CaptureSummary};
use crate::error::{Error, Result};
use crate::order::{non_null_from_statistics, Claim, OrderMeter};
use crate::reader::file::{Batches, Columns, OpenFile, Source};
use crate::reader::{
    arrivals, convert, row_keys, sources, ContentHash, LocalOnly, RemoteFiles, RowKey, TraceFile,
};
use crate::schema::{col, TraceRecord};
use crate::window::{Overlap, Window};

pub use crate::order::FileOrder;

/// Rows decoded at a time from one file by a stream (the whole-file reader decodes 8,192).
pub const STREAM_BATCH_ROWS: usize = 1024;

/// One file of the stream: where it is read from, its extent (from the footer), and its
/// disorder once known (from the footer, else measured when first needed, then kept).
struct Input {
    source: Source,
    first_arrival_us: Option<i64>,
    last_arrival_us: Option<i64>,
    disorder_us: OnceLock<i64>,
    /// Its rows (the footer's count; [`TraceFile::rows`] counts those in the window).
    total_rows: usize,
    /// The rows read: the stream's window.
    window: Window,
    /// The first and last arrival in the window (the whole extent without one).
    kept_first_us: Option<i64>,
    kept_last_us: Option<i64>,
    /// Rows with a recorded body, from the footer's statistics (None: not there).
    bodies: Option<usize>,
    /// Shadow rows (with `pair_request_id`), from the footer's statistics (None: not there).
    shadow: Option<usize>,
}

impl Input {
    /// The file's disorder: recorded, or measured now by a pass over its arrival column
    /// (which must find the extent and rows the footer gave).
    fn disorder(&self, info: &TraceFile) -> Result<i64> {
        if let Some(&d) = self.disorder_us.get() {
            return Ok(d);
        }
        let Measured { rows, order, .. } = measure(&OpenFile::open(&self.source)?, Window::ALL)?;
        if rows != self.total_rows
            || (order.first_arrival_us, order.last_arrival_us)
                != (self.first_arrival_us, self.last_arrival_us)
        {
            return Err(Error::format(
                &info.path,
                format!(
                    "the file changed while it was read, or its statistics misstate its rows \
                     ({rows} rows from {:?} to {:?}; the footer says {} from {:?} to {:?})",
                    order.first_arrival_us,
                    order.last_arrival_us,
                    self.total_rows,
                    self.first_arrival_us,
                    self.last_arrival_us
                ),
            ));
        }
        let _ = self.disorder_us.set(order.disorder_us);
        Ok(order.disorder_us)
    }

    /// Narrows the file to `window`: false when none of its rows is in it; else its rows in
    /// the window counted in `info` (a file across an edge is measured now, by a pass over
    /// its arrival column, which also measures a disorder not recorded) and its footer's
    /// counts of bodies and shadow rows forgotten when they count rows outside.
    fn narrow(&mut self, info: &mut TraceFile, window: Window) -> Result<bool> {
        self.window = window;
        let (Some(first), Some(last)) = (self.first_arrival_us, self.last_arrival_us) else {
            return Ok(false);
        };
        match window.overlap(first, last) {
            Overlap::Inside => return Ok(true),
            Overlap::Outside => return Ok(false),
            Overlap::Across => {}
        }
        let m = measure(&OpenFile::open(&self.source)?, window)?;
        if m.rows != self.total_rows {
            return Err(Error::format(
                &info.path,
                format!(
                    "the file changed while it was read ({} rows; {} when it was opened)",
                    m.rows, self.total_rows
                ),
            ));
        }
        let _ = self.disorder_us.set(m.order.disorder_us);
        info.rows = m.kept;
        (self.kept_first_us, self.kept_last_us) = (m.kept_first_us, m.kept_last_us);
        (self.bodies, self.shadow) = (None, None);
        Ok(m.kept > 0)
    }
}

/// Trace files opened for reading in arrival order (see the [module](self) documentation).
pub struct TraceStream {
    files: Vec<TraceFile>,
    inputs: Vec<Input>,
    window: Window,
    hash: OnceLock<String>,
    captures: OnceLock<Option<CaptureSummary>>,
}

impl std::fmt::Debug for TraceStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceStream")
            .field("files", &self.files)
            .field(
                "extent",
                &self
                    .inputs
                    .iter()
                    .map(|i| (i.first_arrival_us, i.last_arrival_us, i.disorder_us.get()))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl TraceStream {
    /// Opens local inputs (files, directories, globs), as [`read_traces`](crate::read_traces)
    /// reads them, with the same errors, reading each file's footer (see the
    /// [module](self) documentation for the files it also measures).
    pub fn open<S: AsRef<str>>(inputs: &[S]) -> Result<TraceStream> {
        TraceStream::open_with(inputs, &LocalOnly)
    }

    /// [`TraceStream::open`], with the inputs `remote` claims listed and fetched through it.
    pub fn open_with<S: AsRef<str>>(inputs: &[S], remote: &dyn RemoteFiles) -> Result<TraceStream> {
        TraceStream::open_in(inputs, remote, Window::ALL)
    }

    /// [`TraceStream::open_with`], reading only the rows arriving in `window`: the files with
    /// none in it are left out (of [`TraceStream::files`] too) and never decoded, a file across
    /// an edge is measured when opened (its arrival column) and its rows outside the window
    /// are dropped as they are decoded, its reading stopped once no later row can be in it.
    /// The files kept must share one key; a window that keeps no row is an error.
    pub fn open_in<S: AsRef<str>>(
        inputs: &[S],
        remote: &dyn RemoteFiles,
        window: Window,
    ) -> Result<TraceStream> {
        let mut files = Vec::new();
        let mut opened = Vec::new();
        let (mut seen, mut extent) = (0usize, None::<(i64, i64)>);
        for source in sources(inputs, remote)? {
            let (mut info, mut input) = open_file(source)?;
            seen += 1;
            if let (Some(a), Some(b)) = (input.first_arrival_us, input.last_arrival_us) {
                extent = Some(extent.map_or((a, b), |(x, y)| (x.min(a), y.max(b))));
            }
            if window.is_all() || input.narrow(&mut info, window)? {
                files.push(info);
                opened.push(input);
            }
        }
        if files.is_empty() {
            let span = extent.map_or("no rows".to_string(), |(a, b)| {
                format!(
                    "rows from {} to {}",
                    crate::utc::rfc3339(a),
                    crate::utc::rfc3339(b)
                )
            });
            return Err(Error::Invalid(format!(
                "no row arrives in the window {window}: the {seen} file(s) hold {span}"
            )));
        }
        crate::file_meta::one_key(files.iter().map(|f| (f.path.as_path(), &f.meta)))?;
        Ok(TraceStream {
            files,
            inputs: opened,
            window,
            hash: OnceLock::new(),
            captures: OnceLock::new(),
        })
    }

    /// The window its rows are read in ([`Window::ALL`] unless opened with one).
    pub fn window(&self) -> Window {
        self.window
    }

    /// The files, in reading order (as [`Trace::files`](crate::Trace::files)).
    pub fn files(&self) -> &[TraceFile] {
        &self.files
    }

    /// How each file's rows are ordered, in the order of [`TraceStream::files`]: as its
    /// footer records it, else measured now (a pass over the arrival column of each file
    /// not measured yet; an error when one cannot be read).
    pub fn order(&self) -> Result<Vec<FileOrder>> {
        self.inputs
            .iter()
            .zip(&self.files)
            .map(|(i, f)| {
                Ok(FileOrder {
                    first_arrival_us: i.first_arrival_us,
                    last_arrival_us: i.last_arrival_us,
                    disorder_us: i.disorder(f)?,
                })
            })
            .collect()
    }

    /// Rows over every file (in the window).
    pub fn rows(&self) -> usize {
        self.files.iter().map(|f| f.rows).sum()
    }

    /// The earliest arrival over every file, µs since the epoch (None: no rows).
    pub fn first_arrival_us(&self) -> Option<i64> {
        self.inputs.iter().filter_map(|i| i.kept_first_us).min()
    }

    /// Rows with a recorded body over every file, from the footers' statistics, without
    /// reading a row (None when a file's footer does not say).
    pub fn rows_with_body(&self) -> Option<usize> {
        self.inputs.iter().map(|i| i.bodies).sum()
    }

    /// Shadow rows (a `capture --shadow` candidate's, with `pair_request_id`) over every
    /// file, from the footers' statistics (None when a file's footer does not say).
    pub fn shadow_rows(&self) -> Option<usize> {
        self.inputs.iter().map(|i| i.shadow).sum()
    }

    /// The latest arrival over every file.
    pub fn last_arrival_us(&self) -> Option<i64> {
        self.inputs.iter().filter_map(|i| i.kept_last_us).max()
    }

    /// The trace's content hash ([`crate::reader::content_hash`] of its rows in arrival
    /// order, equal to [`Trace::content_hash`](crate::Trace::content_hash) of the same
    /// inputs): kept from the first full pass of [`TraceStream::records`], else from a merge
    /// over the `request_id`, `arrival_time` and capture columns only, made on this call and
    /// kept (with [`TraceStream::captures`]).
    pub fn content_hash(&self) -> Result<String> {
        if self.hash.get().is_none() {
            self.key_pass()?;
        }
        Ok(self.hash.get().cloned().unwrap_or_default())
    }

    /// What each capture contributed to the rows read (in the window): rows, span and clock
    /// per capture run, None when no row names a capture. Kept from the first full pass of
    /// [`TraceStream::records`], else from the pass [`TraceStream::content_hash`] makes.
    pub fn captures(&self) -> Result<Option<CaptureSummary>> {
        if self.captures.get().is_none() {
            self.key_pass()?;
        }
        Ok(self.captures.get().cloned().flatten())
    }

    /// One merge over the key columns: the content hash and the captures, kept.
    fn key_pass(&self) -> Result<()> {
        let mut h = ContentHash::default();
        let mut counter = CaptureCounter::new(&self.files);
        for key in Merge::<RowKey>::new(&self.inputs, &self.files) {
            let k = key?;
            h.add(&k.request_id, k.arrival_us);
            counter.add_row(k.capture_id.as_deref(), k.capture_started_us, k.arrival_us);
        }
        let _ = self.hash.set(h.finish());
        let _ = self.captures.set(counter.finish());
        Ok(())
    }

    /// Every record in arrival order (stable: file order breaks ties), exactly as
    /// [`read_traces`](crate::read_traces) sorts them, read as they are yielded. An error
    /// (a damaged file, a bad value) is yielded once, and then nothing more.
    pub fn records(&self) -> Records<'_> {
        Records {
            merge: Merge::new(&self.inputs, &self.files),
            hash: ContentHash::default(),
            counter: CaptureCounter::new(&self.files),
            stream: self,
            failed: false,
        }
    }
}

/// Opens one file: its metadata and rows from the footer, its order as the footer records it
/// (or its extent from the statistics, the disorder left to measure when needed, or, without
/// statistics, measured now).
fn open_file(source: Source) -> Result<(TraceFile, Input)> {
    let file = OpenFile::open(&source)?;
    let info = file.info.clone();
    let footer = file.footer();
    let bodies = non_null_from_statistics(footer, col::BODY);
    let shadow = non_null_from_statistics(footer, col::PAIR_REQUEST_ID);
    let total_rows = info.rows;
    let input = |first, last, disorder: Option<i64>| Input {
        source,
        first_arrival_us: first,
        last_arrival_us: last,
        disorder_us: disorder.map(OnceLock::from).unwrap_or_default(),
        total_rows,
        window: Window::ALL,
        kept_first_us: first,
        kept_last_us: last,
        bodies,
        shadow,
    };
    match Claim::of(footer, info.rows, &info.path)? {
        Claim::Recorded(o) => {
            let i = input(o.first_arrival_us, o.last_arrival_us, Some(o.disorder_us));
            return Ok((info, i));
        }
        Claim::Extent(first, last) => return Ok((info, input(first, last, None))),
        Claim::Nothing => {}
    }
    let Measured { rows, order: o, .. } = measure(&file, Window::ALL)?;
    if rows != info.rows {
        return Err(Error::format(
            &info.path,
            format!(
                "damaged Parquet file: {rows} rows where the footer says {}",
                info.rows
            ),
        ));
    }
    let i = input(o.first_arrival_us, o.last_arrival_us, Some(o.disorder_us));
    Ok((info, i))
}

/// What a pass over one file's arrival column found.
struct Measured {
    rows: usize,
    order: FileOrder,
    /// Rows in the window, and their first and last arrival.
    kept: usize,
    kept_first_us: Option<i64>,
    kept_last_us: Option<i64>,
}

/// A pass over one file's arrival column: its rows and order, and its rows in `window`.
fn measure(file: &OpenFile, window: Window) -> Result<Measured> {
    let mut meter = OrderMeter::default();
    let mut kept = OrderMeter::default();
    for batch in file.batches(Columns::Only(&[col::ARRIVAL_TIME]), 64 * 1024)? {
        let (first_row, batch) = batch?;
        for at in arrivals(&batch, file.name(), first_row)? {
            meter.add(at);
            if window.contains(at) {
                kept.add(at);
            }
        }
    }
    let k = kept.order();
    Ok(Measured {
        rows: meter.rows(),
        order: meter.order(),
        kept: kept.rows(),
        kept_first_us: k.first_arrival_us,
        kept_last_us: k.last_arrival_us,
    })
}

/// What a merge reads of each row.
trait Row: Sized + Send {
    /// The columns it decodes.
    const COLUMNS: Columns;
    /// The rows of one batch.
    fn decode(batch: &RecordBatch, path: &Path, first_row: usize) -> Result<Vec<Self>>;
    /// Its arrival, µs since the epoch.
    fn arrival_us(&self) -> i64;
}

impl Row for TraceRecord {
    const COLUMNS: Columns = Columns::All;
    fn decode(batch: &RecordBatch, path: &Path, first_row: usize) -> Result<Vec<Self>> {
        convert(batch, path, first_row)
    }
    fn arrival_us(&self) -> i64 {
        self.arrival_time_us
    }
}

/// A row's request id, arrival and capture: what the content hash and the captures read.
impl Row for RowKey {
    const COLUMNS: Columns = Columns::Only(&[
        col::REQUEST_ID,
        col::ARRIVAL_TIME,
        col::CAPTURE_ID,
        col::CAPTURE_STARTED,
    ]);
    fn decode(batch: &RecordBatch, path: &Path, first_row: usize) -> Result<Vec<Self>> {
        row_keys(batch, path, first_row)
    }
    fn arrival_us(&self) -> i64 {
        self.arrival_us
    }
}

/// A row waiting in a file's reorder buffer, ordered by (arrival, position in the file).
struct Pending<T> {
    at: i64,
    seq: u64,
    row: T,
}

impl<T> PartialEq for Pending<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<T> Eq for Pending<T> {}
impl<T> PartialOrd for Pending<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Pending<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// One open file's rows in arrival order (stable), through a reorder buffer bounded by its
/// measured disorder.
struct FileRows<T: Row> {
    name: PathBuf,
    batches: Batches,
    batch: std::vec::IntoIter<T>,
    buffer: BinaryHeap<Reverse<Pending<T>>>,
    seq: u64,
    latest: i64,
    disorder: i64,
    /// The extent the footer gave: a row outside it is an error.
    first: i64,
    last: i64,
    expected_rows: usize,
    exhausted: bool,
    /// The rows yielded; reading stops once no later row can be in it.
    window: Window,
    /// Whether reading stopped there (the rows after it are not counted).
    cut: bool,
}

impl<T: Row> FileRows<T> {
    fn open(input: &Input, info: &TraceFile) -> Result<FileRows<T>> {
        let disorder = input.disorder(info)?;
        let file = OpenFile::open(&input.source)?;
        Ok(FileRows {
            name: file.name().to_path_buf(),
            batches: file.batches(T::COLUMNS, STREAM_BATCH_ROWS)?,
            batch: Vec::new().into_iter(),
            buffer: BinaryHeap::new(),
            seq: 0,
            latest: i64::MIN,
            disorder,
            first: input.first_arrival_us.unwrap_or(i64::MAX),
            last: input.last_arrival_us.unwrap_or(i64::MIN),
            expected_rows: input.total_rows,
            exhausted: false,
            window: input.window,
            cut: false,
        })
    }

    /// Rows decoded and not yet yielded.
    fn held(&self) -> usize {
        self.buffer.len() + self.batch.len()
    }

    fn changed(&self, what: &str) -> Error {
        Error::format(
            &self.name,
            format!(
                "the file changed while it was read, or its footer misstates its rows ({what})"
            ),
        )
    }

    fn next(&mut self) -> Option<Result<T>> {
        loop {
            if let Some(Reverse(top)) = self.buffer.peek() {
                if self.exhausted || top.at <= self.latest.saturating_sub(self.disorder) {
                    return self.buffer.pop().map(|Reverse(p)| Ok(p.row));
                }
            } else if self.exhausted {
                return None;
            }
            if let Some(row) = self.batch.next() {
                let at = row.arrival_us();
                if at < self.latest.saturating_sub(self.disorder) {
                    return Some(Err(self.changed("a row out of the order first measured")));
                }
                if at < self.first || at > self.last {
                    return Some(Err(self.changed("a row outside the extent first measured")));
                }
                self.latest = self.latest.max(at);
                self.seq += 1;
                if !self.window.contains(at) {
                    // No later row arrives before `latest - disorder`: past the window's end
                    // the rest of the file is not read.
                    if self
                        .window
                        .ended_by(self.latest.saturating_sub(self.disorder))
                    {
                        (self.exhausted, self.cut) = (true, true);
                    }
                    continue;
                }
                self.buffer.push(Reverse(Pending {
                    at,
                    seq: self.seq,
                    row,
                }));
                continue;
            }
            match self.batches.next() {
                Some(Ok((first_row, batch))) => match T::decode(&batch, &self.name, first_row) {
                    Ok(rows) => self.batch = rows.into_iter(),
                    Err(e) => return Some(Err(e)),
                },
                Some(Err(e)) => return Some(Err(e)),
                None => {
                    self.exhausted = true;
                    if !self.cut && self.seq as usize != self.expected_rows {
                        return Some(Err(self.changed(&format!(
                            "{} rows, {} when it was opened",
                            self.seq, self.expected_rows
                        ))));
                    }
                }
            }
        }
    }
}

/// The k-way merge of the files' ordered rows, each file opened when the merge reaches its
/// first arrival.
struct Merge<'a, T: Row> {
    inputs: &'a [Input],
    files: &'a [TraceFile],
    /// Files with rows, by (first arrival, file index); those before `next_unopened` are open
    /// or done.
    unopened: Vec<usize>,
    next_unopened: usize,
    open: Vec<Option<FileRows<T>>>,
    /// Each open file's next row, and the (arrival, file) heap over them.
    head_rows: Vec<Option<T>>,
    heads: BinaryHeap<Reverse<(i64, usize)>>,
    held: usize,
    peak_held: usize,
    open_files: usize,
    peak_open_files: usize,
    failed: Option<Error>,
    done: bool,
}

impl<'a, T: Row> Merge<'a, T> {
    fn new(inputs: &'a [Input], files: &'a [TraceFile]) -> Merge<'a, T> {
        let mut unopened: Vec<usize> = (0..inputs.len())
            .filter(|&i| inputs[i].kept_first_us.is_some())
            .collect();
        unopened.sort_by_key(|&i| (inputs[i].kept_first_us, i));
        Merge {
            inputs,
            files,
            unopened,
            next_unopened: 0,
            open: (0..inputs.len()).map(|_| None).collect(),
            head_rows: (0..inputs.len()).map(|_| None).collect(),
            heads: BinaryHeap::new(),
            held: 0,
            peak_held: 0,
            open_files: 0,
            peak_open_files: 0,
            failed: None,
            done: false,
        }
    }

    fn held_by(&self, i: usize) -> usize {
        self.open[i].as_ref().map_or(0, FileRows::held) + usize::from(self.head_rows[i].is_some())
    }

    /// Moves file `i`'s next row to its head (closing the file after its last).
    fn advance(&mut self, i: usize) -> Result<()> {
        let before = self.held_by(i);
        let Some(file) = self.open[i].as_mut() else {
            return Ok(());
        };
        match file.next() {
            Some(Ok(row)) => {
                self.heads.push(Reverse((row.arrival_us(), i)));
                self.head_rows[i] = Some(row);
            }
            Some(Err(e)) => return Err(e),
            None => {
                self.open[i] = None;
                self.open_files -= 1;
            }
        }
        self.held = self.held + self.held_by(i) - before;
        self.peak_held = self.peak_held.max(self.held);
        Ok(())
    }

    /// Opens every file whose first row comes before the best head.
    fn open_due(&mut self) -> Result<()> {
        while let Some(&j) = self.unopened.get(self.next_unopened) {
            let first = self.inputs[j].kept_first_us.unwrap_or(i64::MIN);
            if self
                .heads
                .peek()
                .is_some_and(|Reverse(best)| *best < (first, j))
            {
                return Ok(());
            }
            self.next_unopened += 1;
            self.open[j] = Some(FileRows::open(&self.inputs[j], &self.files[j])?);
            self.open_files += 1;
            self.peak_open_files = self.peak_open_files.max(self.open_files);
            self.advance(j)?;
        }
        Ok(())
    }

    fn step(&mut self) -> Result<Option<T>> {
        self.open_due()?;
        let Some(Reverse((_, i))) = self.heads.pop() else {
            return Ok(None);
        };
        let row = self.head_rows[i].take();
        self.held -= 1;
        if let Err(e) = self.advance(i) {
            self.failed = Some(e);
        }
        Ok(row)
    }
}

impl<T: Row> Iterator for Merge<'_, T> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        if self.done {
            return None;
        }
        if let Some(e) = self.failed.take() {
            self.done = true;
            return Some(Err(e));
        }
        let r = self.step().transpose();
        if !matches!(r, Some(Ok(_))) {
            self.done = true;
        }
        r
    }
}

/// The records of a [`TraceStream`] in arrival order (see [`TraceStream::records`]), with
/// what they hold in memory (for tests and benches). A pass read to its end without an error
/// leaves the stream's content hash and captures behind.
pub struct Records<'a> {
    merge: Merge<'a, TraceRecord>,
    hash: ContentHash,
    counter: CaptureCounter,
    stream: &'a TraceStream,
    failed: bool,
}

impl Records<'_> {
    /// Rows decoded and not yet yielded, over every open file.
    pub fn held_rows(&self) -> usize {
        self.merge.held
    }

    /// The most rows held at once so far.
    pub fn peak_held_rows(&self) -> usize {
        self.merge.peak_held
    }

    /// The most files open at once so far (each with one row group's decoder).
    pub fn peak_open_files(&self) -> usize {
        self.merge.peak_open_files
    }
}

impl Iterator for Records<'_> {
    type Item = Result<TraceRecord>;

    fn next(&mut self) -> Option<Result<TraceRecord>> {
        let next = self.merge.next();
        match &next {
            Some(Ok(r)) => {
                self.hash.add(&r.request_id, r.arrival_time_us);
                self.counter.add(r);
            }
            Some(Err(_)) => self.failed = true,
            None if !self.failed => {
                let _ = self.stream.hash.set(self.hash.finish());
                let counter = std::mem::take(&mut self.counter);
                let _ = self.stream.captures.set(counter.finish());
            }
            None => {}
        }
        next
    }
}

#[cfg(test)]
mod tests;
