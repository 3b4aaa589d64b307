//! The engine's end-to-end tests on loopback, in one test binary (one link, one place to
//! look): a module per concern, rows built by [`rows`] for all of them.
//!
//! To add a module: put `name.rs` here and a `mod name;` below.

mod accuracy;
mod backlog;
mod burst;
mod stream;
mod tls;

use std::sync::{Condvar, Mutex};

use trace_format::TraceRecord;

/// Which module's tests are running, and how many of them.
static TURN: Mutex<(Option<&'static str>, usize)> = Mutex::new((None, 0));
static TURN_FREED: Condvar = Condvar::new();

/// A test's turn: tests of one module run together, never beside another module's. Each
/// module was a test binary of its own, and the timing-sensitive ones (the feed's look-ahead
/// against the wall clock, accuracy within 1 ms at 100 streams) assume no other module's
/// streams share the CPU. Take it first: `let _turn = crate::turn(module_path!());`.
pub(crate) fn turn(module: &'static str) -> Turn {
    let mut t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    while t.0.is_some_and(|m| m != module) {
        t = TURN_FREED.wait(t).unwrap_or_else(|e| e.into_inner());
    }
    *t = (Some(module), t.1 + 1);
    Turn
}

/// Held for a test's duration ([`turn`]).
pub(crate) struct Turn;

impl Drop for Turn {
    fn drop(&mut self) {
        let mut t = TURN.lock().unwrap_or_else(|e| e.into_inner());
        t.1 -= 1;
        if t.1 == 0 {
            t.0 = None;
            TURN_FREED.notify_all();
        }
    }
}

/// `n` requests to `/v1/completions`, `gap_us` apart from one start (0: all at once), each
/// with `prompt` prompt tokens and asking for `out` output tokens, streamed or not; ids
/// `{prefix}-00000`, … (five digits).
pub(crate) fn rows(
    prefix: &str,
    n: usize,
    gap_us: i64,
    (prompt, out): (i64, i64),
    stream: bool,
) -> Vec<TraceRecord> {
    (0..n)
        .map(|i| {
            let mut r = TraceRecord::new(
                format!("{prefix}-{i:05}"),
                1_700_000_000_000_000 + i as i64 * gap_us,
                "/v1/completions",
            );
            r.stream = stream;
            r.prompt_tokens = Some(prompt);
            r.output_tokens = Some(out);
            r
        })
        .collect()
}
