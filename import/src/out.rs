//! Where an importer's rows go as they are read ([`Sink`]): to the output file, through an
//! [`Out`] that keeps only the rows the import selects (`--limit`, `--head`, a time window),
//! sets `--model`, and counts what it writes (rows, tokens, outcomes, extent) and what the
//! source left out of its rows ([`Out::unknown`]); or, for an importer that links its rows
//! across a whole file before any can go (Dynamo, Qwen, Mooncake with sessions), into a
//! `Vec` first.

use trace_format::{Outcome, Result, TraceRecord};

use crate::SourceStats;

/// Takes rows one at a time.
pub(crate) trait Sink {
    /// Takes one row; `false` when no more are wanted (stop reading).
    fn push(&mut self, r: TraceRecord) -> Result<bool>;

    /// Takes rows in order; `false` when no more are wanted.
    fn push_all(&mut self, rows: Vec<TraceRecord>) -> Result<bool> {
        for r in rows {
            if !self.push(r)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Rows held, to be linked across a file before they go on.
impl Sink for Vec<TraceRecord> {
    fn push(&mut self, r: TraceRecord) -> Result<bool> {
        Vec::push(self, r);
        Ok(true)
    }
}

/// Which rows an import keeps (whole import; `per_file_limit` per input).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Select {
    /// At most this many rows in all (`--limit`).
    pub limit: Option<u64>,
    /// At most this many rows of each input (`--head`).
    pub per_file_limit: Option<u64>,
    /// Skip the rows arriving earlier than this after the first row read, µs
    /// (`--start-offset`).
    pub start_offset_us: i64,
    /// Keep only rows arriving within this long after the start offset, µs (`--duration`).
    pub duration_us: Option<i64>,
}

/// The state of a [`Select`] over an import: rows taken, and the first arrival the window
/// counts from.
#[derive(Debug, Default)]
pub(crate) struct Selecting {
    pub(crate) select: Select,
    taken: u64,
    first_us: Option<i64>,
}

impl Selecting {
    pub(crate) fn new(select: Select) -> Selecting {
        Selecting {
            select,
            taken: 0,
            first_us: None,
        }
    }

    /// Whether the row arriving at `at_us` is in the window (the first row read opens it).
    /// Without a window every row is in it, also one arriving before the first row read (a
    /// file not sorted by arrival).
    fn in_window(&mut self, at_us: i64) -> bool {
        if self.select.start_offset_us == 0 && self.select.duration_us.is_none() {
            return true;
        }
        let first = *self.first_us.get_or_insert(at_us);
        let from = first.saturating_add(self.select.start_offset_us);
        at_us >= from
            && self
                .select
                .duration_us
                .is_none_or(|d| at_us < from.saturating_add(d))
    }

    /// Whether the whole import has all the rows it wants.
    pub(crate) fn full(&self) -> bool {
        self.select.limit.is_some_and(|l| self.taken >= l)
    }
}

/// One source file's rows on their way to the output: selected, `--model` set, counted in its
/// [`SourceStats`], passed to `write`.
pub(crate) struct Out<'a> {
    pub(crate) stats: &'a mut SourceStats,
    selecting: &'a mut Selecting,
    model: Option<&'a str>,
    write: &'a mut dyn FnMut(TraceRecord) -> Result<()>,
}

impl<'a> Out<'a> {
    pub(crate) fn new(
        stats: &'a mut SourceStats,
        selecting: &'a mut Selecting,
        model: Option<&'a str>,
        write: &'a mut dyn FnMut(TraceRecord) -> Result<()>,
    ) -> Out<'a> {
        Out {
            stats,
            selecting,
            model,
            write,
        }
    }

    /// Counts a row the source left without `field` (imported without it, the value
    /// unknown).
    pub(crate) fn unknown(&mut self, field: &str) {
        *self.stats.unknown.entry(field.to_string()).or_insert(0) += 1;
    }

    /// Whether this file has given all the rows wanted of it.
    fn file_full(&self) -> bool {
        self.selecting.full()
            || self
                .selecting
                .select
                .per_file_limit
                .is_some_and(|l| self.stats.rows as u64 >= l)
    }
}

impl Sink for Out<'_> {
    fn push(&mut self, mut r: TraceRecord) -> Result<bool> {
        if self.file_full() {
            return Ok(false);
        }
        if !self.selecting.in_window(r.arrival_time_us) {
            self.stats.outside_window += 1;
            return Ok(true);
        }
        if let Some(m) = self.model {
            r.model = Some(m.to_string());
        }
        let s = &mut *self.stats;
        s.rows += 1;
        s.prompt_tokens += r.prompt_tokens.unwrap_or(0);
        s.output_tokens += r.output_tokens.unwrap_or(0);
        match r.outcome {
            Outcome::Ok => {}
            Outcome::ClientCancelled => s.cancelled += 1,
            _ => s.failures += 1,
        }
        let at = r.arrival_time_us;
        s.first_arrival_us = Some(s.first_arrival_us.map_or(at, |f| f.min(at)));
        s.last_arrival_us = Some(s.last_arrival_us.map_or(at, |l| l.max(at)));
        (self.write)(r)?;
        self.selecting.taken += 1;
        Ok(!self.file_full())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No window: a row arriving before the first one read is kept, not counted outside a
    /// window nobody asked for; with a window, the first row read opens it.
    #[test]
    fn rows_out_of_arrival_order_stay_without_a_window() {
        let mut s = Selecting::new(Select::default());
        assert!(s.in_window(1_000) && s.in_window(10) && s.in_window(5_000));
        let mut s = Selecting::new(Select {
            duration_us: Some(100),
            ..Select::default()
        });
        assert!(s.in_window(1_000) && s.in_window(1_099));
        assert!(!s.in_window(10) && !s.in_window(1_100));
    }
}
