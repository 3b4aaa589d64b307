//! Traces opened for a command: through `store` (local files, directories, globs and
//! object-store locations), several captures as one trace, optionally in a time window
//! (`--since`/`--until`, [`WindowFlags`]), with what the reader had to assume about a file
//! said once, on stderr (a Parquet file another tool wrote from llmreplay's columns without
//! its metadata: its schema version inferred from the columns), and what each capture
//! contributed said the same way by every command ([`say_captures`]).

use anyhow::Context as _;
use store::Result;
use trace_format::captures::{CaptureCounter, CaptureSummary};
use trace_format::{Trace, TraceFile, TraceStream, Window};

use crate::flags::WindowFlags;

/// [`store::open_stream`], saying what was assumed about each file.
pub fn open_stream<S: AsRef<str>>(inputs: &[S]) -> Result<TraceStream> {
    let stream = store::open_stream(inputs)?;
    say_assumed(stream.files());
    Ok(stream)
}

/// [`open_stream`] of the rows arriving in the window `flags` give ([`store::open_stream_in`]).
pub fn open_stream_in<S: AsRef<str>>(
    inputs: &[S],
    flags: &WindowFlags,
) -> anyhow::Result<TraceStream> {
    let stream = store::open_stream_in(inputs, flags.window()?)?;
    say_assumed(stream.files());
    Ok(stream)
}

/// [`store::read_traces`], saying what was assumed about each file.
pub fn read_traces<S: AsRef<str>>(inputs: &[S]) -> Result<Trace> {
    let trace = store::read_traces(inputs)?;
    say_assumed(&trace.files);
    Ok(trace)
}

/// [`read_traces`] of the rows arriving in the window `flags` give: read through the stream
/// (the rows outside the window are dropped as they are decoded, never held), then held.
pub fn read_traces_in<S: AsRef<str>>(inputs: &[S], flags: &WindowFlags) -> anyhow::Result<Trace> {
    let window = flags.window()?;
    if window.is_all() {
        return Ok(read_traces(inputs)?);
    }
    let stream = open_stream_in(inputs, flags)?;
    let records = stream.records().collect::<Result<Vec<_>>>()?;
    Ok(Trace {
        records,
        files: stream.files().to_vec(),
    })
}

/// [`say_captures`] of a stream's rows (kept from a full pass of its records, else read now
/// from its key columns).
pub fn say_stream_captures(stream: &TraceStream) -> anyhow::Result<()> {
    let captures = stream.captures().context("reading the trace's captures")?;
    say_captures(stream.rows(), captures.as_ref(), stream.window());
    Ok(())
}

/// [`say_captures`] of a trace held in memory.
pub fn say_trace_captures(trace: &Trace, window: Window) {
    let mut counter = CaptureCounter::new(&trace.files);
    for r in &trace.records {
        counter.add(r);
    }
    say_captures(trace.records.len(), counter.finish().as_ref(), window);
}

/// What each capture contributed to the `rows` read, on stderr — its rows, first and last
/// arrival, span and clock ([`CaptureSummary::lines`], as `inspect` shows them) — when the
/// rows come from more than one capture run or a window was given; nothing otherwise. The one
/// way every command that reads a captured trace says it.
pub fn say_captures(rows: usize, captures: Option<&CaptureSummary>, window: Window) {
    let several = captures.is_some_and(|c| c.captures.len() > 1);
    if window.is_all() && !several {
        return;
    }
    let within = if window.is_all() {
        String::new()
    } else {
        format!(" in the window {window}")
    };
    match captures {
        Some(c) => {
            eprintln!(
                "trace: {rows} rows{within} from {} capture(s):",
                c.captures.len()
            );
            for line in c.lines() {
                eprintln!("  {line}");
            }
        }
        None => eprintln!("trace: {rows} rows{within} (no row names its capture)"),
    }
}

fn say_assumed(files: &[TraceFile]) {
    for f in files {
        if let Some(what) = &f.assumed {
            eprintln!("note: {}: {what}", f.path.display());
        }
    }
}

/// Rows written so far, shown as they go (rows and rows/s) when stderr is a terminal, and
/// nowhere otherwise.
pub struct RowProgress {
    bar: indicatif::ProgressBar,
    rows: u64,
    start: std::time::Instant,
}

impl RowProgress {
    /// Progress of rows written to `to`.
    pub fn new(to: &std::path::Path) -> RowProgress {
        use std::io::IsTerminal;
        let bar = if std::io::stderr().is_terminal() {
            let b = indicatif::ProgressBar::new_spinner();
            if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg}") {
                b.set_style(style);
            }
            b.enable_steady_tick(std::time::Duration::from_millis(200));
            b
        } else {
            indicatif::ProgressBar::hidden()
        };
        bar.set_message(format!("writing {}", to.display()));
        RowProgress {
            bar,
            rows: 0,
            start: std::time::Instant::now(),
        }
    }

    /// One more row written.
    pub fn row(&mut self) {
        self.rows += 1;
        if self.rows % 16_384 == 0 && !self.bar.is_hidden() {
            let secs = self.start.elapsed().as_secs_f64().max(1e-3);
            self.bar.set_message(format!(
                "{} rows, {:.0} rows/s",
                self.rows,
                self.rows as f64 / secs
            ));
        }
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Clears the line, leaving the terminal to what comes next.
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}
