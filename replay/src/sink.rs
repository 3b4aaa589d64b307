//! Where a run's finished rows go while it runs. Rows are handed over as requests finish, so
//! a run of any length needs memory for the requests in flight only, and an interrupted or
//! killed run keeps every row that finished (a sink that journals them makes them
//! recoverable after kill -9).

use trace_format::TraceRecord;

use crate::config::Target;
use crate::error::ReplayError;
use crate::output::RunOutput;

/// Receives rows as requests finish. An error stops the run as a first stop request would
/// (drain), and is returned by the run once it has ended.
pub trait RowSink {
    /// A run against `target` starts; its rows follow.
    fn start(&mut self, _target: &Target, _run_id: &str) -> Result<(), ReplayError> {
        Ok(())
    }
    /// One finished request's row (completion order, after burst attribution).
    fn row(&mut self, rec: &TraceRecord) -> Result<(), ReplayError>;
    /// The run against the target has ended: every row was given.
    fn finish(&mut self, _run: &RunOutput) -> Result<(), ReplayError> {
        Ok(())
    }
}

/// A sink that drops every row (the metrics are computed apart from the sink).
pub struct NoSink;

impl RowSink for NoSink {
    fn row(&mut self, _rec: &TraceRecord) -> Result<(), ReplayError> {
        Ok(())
    }
}

/// A sink that keeps every row, in the order given (tests; callers that want the rows).
impl RowSink for Vec<TraceRecord> {
    fn row(&mut self, rec: &TraceRecord) -> Result<(), ReplayError> {
        self.push(rec.clone());
        Ok(())
    }
}

/// Hands every row to each of its sinks in turn: how a run writes to any number of outputs
/// (`--results`, an OTLP exporter, ...). An output that must never slow the run (an
/// exporter) takes rows through its own bounded queue and drops, counted, when it is full.
///
/// Every sink gets every call, even after another one failed; the first error is returned
/// (and stops the run, as any sink's error does).
#[derive(Default)]
pub struct Fanout<'a> {
    sinks: Vec<&'a mut dyn RowSink>,
}

impl<'a> Fanout<'a> {
    /// No sink yet (rows are dropped, as by [`NoSink`]).
    pub fn new() -> Self {
        Fanout { sinks: Vec::new() }
    }

    /// Adds a sink; rows go to the sinks in the order they were added.
    pub fn push(&mut self, sink: &'a mut dyn RowSink) {
        self.sinks.push(sink);
    }

    /// How many sinks rows go to.
    pub fn len(&self) -> usize {
        self.sinks.len()
    }

    /// Whether rows go nowhere.
    pub fn is_empty(&self) -> bool {
        self.sinks.is_empty()
    }

    fn each(
        &mut self,
        mut f: impl FnMut(&mut dyn RowSink) -> Result<(), ReplayError>,
    ) -> Result<(), ReplayError> {
        let mut first = Ok(());
        for s in &mut self.sinks {
            let r = f(&mut **s);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl RowSink for Fanout<'_> {
    fn start(&mut self, target: &Target, run_id: &str) -> Result<(), ReplayError> {
        self.each(|s| s.start(target, run_id))
    }
    fn row(&mut self, rec: &TraceRecord) -> Result<(), ReplayError> {
        self.each(|s| s.row(rec))
    }
    fn finish(&mut self, run: &RunOutput) -> Result<(), ReplayError> {
        self.each(|s| s.finish(run))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps what it is given; fails every row when told to.
    #[derive(Default)]
    struct Probe {
        started: Vec<String>,
        rows: Vec<String>,
        fail: bool,
    }

    impl RowSink for Probe {
        fn start(&mut self, _t: &Target, run_id: &str) -> Result<(), ReplayError> {
            self.started.push(run_id.into());
            Ok(())
        }
        fn row(&mut self, rec: &TraceRecord) -> Result<(), ReplayError> {
            self.rows.push(rec.request_id.clone());
            if self.fail {
                return Err(ReplayError::Config(format!(
                    "no room for {}",
                    rec.request_id
                )));
            }
            Ok(())
        }
    }

    /// Every sink gets every row, in order, even when one before it failed; the first error
    /// is the one returned.
    #[test]
    fn every_sink_gets_every_row_and_the_first_error_is_returned() {
        let (mut a, mut b, mut c) = (
            Probe::default(),
            Probe {
                fail: true,
                ..Probe::default()
            },
            Probe::default(),
        );
        {
            let mut f = Fanout::new();
            f.push(&mut a);
            f.push(&mut b);
            f.push(&mut c);
            assert_eq!(f.len(), 3);
            let target = Target {
                name: "t".into(),
                url: "http://127.0.0.1:1".into(),
            };
            f.start(&target, "run-1").unwrap();
            let e = f.row(&TraceRecord::new("r1", 0, "/v1/completions"));
            assert!(e.unwrap_err().to_string().contains("no room for r1"));
            f.row(&TraceRecord::new("r2", 1, "/v1/completions"))
                .unwrap_err();
        }
        for p in [&a, &b, &c] {
            assert_eq!(p.started, ["run-1"]);
            assert_eq!(p.rows, ["r1", "r2"]);
        }
    }
}
