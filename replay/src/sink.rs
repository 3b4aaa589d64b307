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
