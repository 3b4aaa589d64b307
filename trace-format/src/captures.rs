//! What each capture contributed to a trace (issue 56): rows, span and clock offset per
//! capture run ([`CaptureCounter`], printed by `inspect` and `llmreplay link`), from the rows'
//! `capture_id` and `capture_started` and the files' [`crate::fleet::CaptureInfo`].

use std::collections::BTreeMap;

use serde::Serialize;

use crate::fleet::{CaptureInfo, Clock};
use crate::reader::TraceFile;
use crate::schema::TraceRecord;
use crate::utc::rfc3339;

/// What one capture run (a `capture_id` and its `capture_started`) contributed to a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaptureShare {
    /// Its `capture_id`.
    pub id: String,
    /// Its start, RFC 3339 (None: the rows do not say).
    pub started: Option<String>,
    /// Its rows.
    pub rows: usize,
    /// Its first and last arrival, RFC 3339.
    pub first_arrival: String,
    /// See `first_arrival`.
    pub last_arrival: String,
    /// Last − first arrival, seconds.
    pub span_s: f64,
    /// Its clock against the reference, as its files' metadata says (None: no file says).
    pub clock: Option<Clock>,
}

/// The captures a trace's rows came from, and how far their clocks are apart.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaptureSummary {
    /// Each capture run, by id then start.
    pub captures: Vec<CaptureShare>,
    /// Largest minus smallest known clock offset, µs (None: fewer than one known).
    pub offset_spread_us: Option<i64>,
    /// Captures whose offset is unknown.
    pub offsets_unknown: usize,
    /// Rows that name no capture (not a capture's, or one before 1.6).
    pub rows_without_capture: usize,
}

/// One capture run's start, rows, first and last arrival.
type Run = (Option<i64>, usize, i64, i64);

/// Counts the rows of each capture run as they go by (memory: one entry per capture run; a
/// row costs a lookup by its id, no allocation once its run is known).
#[derive(Debug, Default, Clone)]
pub struct CaptureCounter {
    /// Per `capture_id`: each of its runs.
    runs: BTreeMap<String, Vec<Run>>,
    without: usize,
    clocks: Vec<CaptureInfo>,
}

impl CaptureCounter {
    /// A counter that takes the captures' clocks from `files`' metadata.
    pub fn new(files: &[TraceFile]) -> CaptureCounter {
        CaptureCounter {
            clocks: files
                .iter()
                .flat_map(|f| f.meta.captures.iter().cloned())
                .collect(),
            ..CaptureCounter::default()
        }
    }

    /// One row.
    pub fn add(&mut self, r: &TraceRecord) {
        self.add_row(
            r.capture_id.as_deref(),
            r.capture_started_us,
            r.arrival_time_us,
        );
    }

    /// One row, by its `capture_id`, `capture_started` and arrival.
    pub fn add_row(&mut self, id: Option<&str>, started: Option<i64>, at: i64) {
        let Some(id) = id else {
            self.without += 1;
            return;
        };
        let runs = match self.runs.get_mut(id) {
            Some(runs) => runs,
            None => self.runs.entry(id.to_string()).or_default(),
        };
        match runs.iter_mut().find(|r| r.0 == started) {
            Some(e) => {
                e.1 += 1;
                e.2 = e.2.min(at);
                e.3 = e.3.max(at);
            }
            None => runs.push((started, 1, at, at)),
        }
    }

    /// The summary (None when no row names a capture).
    pub fn finish(self) -> Option<CaptureSummary> {
        if self.runs.is_empty() {
            return None;
        }
        let captures: Vec<CaptureShare> = self
            .runs
            .into_iter()
            .flat_map(|(id, mut runs)| {
                runs.sort_by_key(|r| r.0);
                runs.into_iter().map(move |r| (id.clone(), r))
            })
            .map(|(id, (started, rows, first, last))| {
                let clock = self
                    .clocks
                    .iter()
                    .find(|c| c.id == id && Some(c.started_us) == started)
                    .map(|c| c.clock.clone());
                CaptureShare {
                    started: started.map(rfc3339),
                    rows,
                    first_arrival: rfc3339(first),
                    last_arrival: rfc3339(last),
                    span_s: (last - first) as f64 / 1e6,
                    clock,
                    id,
                }
            })
            .collect();
        let known: Vec<i64> = captures
            .iter()
            .filter_map(|c| c.clock.as_ref()?.offset_us)
            .collect();
        Some(CaptureSummary {
            offset_spread_us: known
                .iter()
                .max()
                .zip(known.iter().min())
                .map(|(a, b)| a - b),
            offsets_unknown: captures.len() - known.len(),
            rows_without_capture: self.without,
            captures,
        })
    }
}

impl CaptureSummary {
    /// Lines for a human (`inspect`).
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .captures
            .iter()
            .map(|c| {
                format!(
                    "{}{}: {} rows, {} → {} ({:.3} s), clock {}",
                    c.id,
                    c.started
                        .as_deref()
                        .map_or(String::new(), |s| format!(" (started {s})")),
                    c.rows,
                    c.first_arrival,
                    c.last_arrival,
                    c.span_s,
                    c.clock
                        .as_ref()
                        .map_or("unknown (no file says)".into(), Clock::describe)
                )
            })
            .collect();
        out.push(match self.offset_spread_us {
            Some(s) => format!(
                "clock offsets: spread {s} µs over {} capture(s) that measured theirs; {} unknown",
                self.captures.len() - self.offsets_unknown,
                self.offsets_unknown
            ),
            None => format!(
                "clock offsets: unknown for all {} capture(s): their arrival times compare only \
                 as well as their clocks agree",
                self.captures.len()
            ),
        });
        if self.rows_without_capture > 0 {
            out.push(format!(
                "{} rows name no capture",
                self.rows_without_capture
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_spans_are_counted_per_capture_with_the_offset_spread() {
        let mut c = CaptureCounter::default();
        let clock = |id: &str, off: Option<i64>| CaptureInfo {
            id: id.into(),
            started_us: 5,
            clock: Clock {
                offset_us: off,
                ..Clock::unknown("x")
            },
        };
        c.clocks = vec![
            clock("a", Some(-40)),
            clock("b", Some(160)),
            clock("c", None),
        ];
        for (id, at) in [
            ("a", 1_000_000),
            ("b", 1_500_000),
            ("a", 3_000_000),
            ("c", 2_000_000),
        ] {
            let mut r = TraceRecord::new("r", at, "/v1/chat/completions");
            (r.capture_id, r.capture_started_us) = (Some(id.into()), Some(5));
            c.add(&r);
        }
        c.add(&TraceRecord::new("x", 0, "/v1/completions"));
        let s = c.finish().unwrap();
        let got: Vec<_> = s
            .captures
            .iter()
            .map(|c| (c.id.as_str(), c.rows, c.span_s))
            .collect();
        assert_eq!(got, [("a", 2, 2.0), ("b", 1, 0.0), ("c", 1, 0.0)]);
        assert_eq!(
            (
                s.offset_spread_us,
                s.offsets_unknown,
                s.rows_without_capture
            ),
            (Some(200), 1, 1)
        );
        let text = s.lines().join("\n");
        assert!(
            text.contains("a (started 1970-01-01T00:00:00.000005Z): 2 rows"),
            "{text}"
        );
        assert!(text.contains("spread 200 µs over 2 capture(s)"), "{text}");
        assert!(CaptureCounter::default().finish().is_none());
    }
}
