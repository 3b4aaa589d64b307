//! Traces opened for a command: through `store` (local files, directories, globs and
//! object-store locations), with what the reader had to assume about a file said once, on
//! stderr (a Parquet file another tool wrote from llmreplay's columns without its metadata:
//! its schema version inferred from the columns).

use store::Result;
use trace_format::{Trace, TraceFile, TraceStream};

/// [`store::open_stream`], saying what was assumed about each file.
pub fn open_stream<S: AsRef<str>>(inputs: &[S]) -> Result<TraceStream> {
    let stream = store::open_stream(inputs)?;
    say_assumed(stream.files());
    Ok(stream)
}

/// [`store::read_traces`], saying what was assumed about each file.
pub fn read_traces<S: AsRef<str>>(inputs: &[S]) -> Result<Trace> {
    let trace = store::read_traces(inputs)?;
    say_assumed(&trace.files);
    Ok(trace)
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
