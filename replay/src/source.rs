//! Where a replay reads its rows from: a [`RecordSource`] gives the trace's rows in arrival
//! order, again on every call (soak passes re-read it), so a run holds only the rows it is
//! about to send, never the whole trace. Implemented for an in-memory trace (`[TraceRecord]`,
//! `Vec<TraceRecord>`: sweeps, tests) and for a streamed one (`trace_format::stream`).

use trace_format::TraceRecord;

use crate::error::ReplayError;

/// The rows a source yields, in arrival order (file order breaks ties).
pub type Records<'a> = Box<dyn Iterator<Item = trace_format::Result<TraceRecord>> + Send + 'a>;

/// The arrival extent of a source: its first and last arrival (µs since the epoch) and its
/// number of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrivalSpan {
    /// The earliest arrival.
    pub first_us: i64,
    /// The latest arrival.
    pub last_us: i64,
    /// Rows.
    pub rows: usize,
}

/// A trace a run reads row by row, in arrival order.
pub trait RecordSource: Sync {
    /// The rows, in arrival order, from the first; callable again (each call starts over).
    fn records(&self) -> Result<Records<'_>, ReplayError>;

    /// The number of rows, when known without reading them.
    fn rows_hint(&self) -> Option<usize> {
        None
    }

    /// First and last arrival and the number of rows (None: no rows). By default one pass
    /// over [`records`](Self::records); a source that knows them cheaply says so.
    fn arrival_span(&self) -> Result<Option<ArrivalSpan>, ReplayError> {
        let mut span: Option<ArrivalSpan> = None;
        for r in self.records()? {
            let t = r?.arrival_time_us;
            span = Some(match span {
                None => ArrivalSpan {
                    first_us: t,
                    last_us: t,
                    rows: 1,
                },
                Some(s) => ArrivalSpan {
                    first_us: s.first_us.min(t),
                    last_us: s.last_us.max(t),
                    rows: s.rows + 1,
                },
            });
        }
        Ok(span)
    }
}

impl RecordSource for [TraceRecord] {
    fn records(&self) -> Result<Records<'_>, ReplayError> {
        Ok(Box::new(self.iter().cloned().map(Ok)))
    }

    fn rows_hint(&self) -> Option<usize> {
        Some(self.len())
    }

    fn arrival_span(&self) -> Result<Option<ArrivalSpan>, ReplayError> {
        let mut it = self.iter().map(|r| r.arrival_time_us);
        let Some(t0) = it.next() else {
            return Ok(None);
        };
        let (first_us, last_us) = it.fold((t0, t0), |(lo, hi), t| (lo.min(t), hi.max(t)));
        Ok(Some(ArrivalSpan {
            first_us,
            last_us,
            rows: self.len(),
        }))
    }
}

impl RecordSource for trace_format::TraceStream {
    fn records(&self) -> Result<Records<'_>, ReplayError> {
        Ok(Box::new(trace_format::TraceStream::records(self)))
    }

    fn rows_hint(&self) -> Option<usize> {
        Some(self.rows())
    }

    /// Known from the stream's first pass over the arrival column: no second read.
    fn arrival_span(&self) -> Result<Option<ArrivalSpan>, ReplayError> {
        Ok(match (self.first_arrival_us(), self.last_arrival_us()) {
            (Some(first_us), Some(last_us)) => Some(ArrivalSpan {
                first_us,
                last_us,
                rows: self.rows(),
            }),
            _ => None,
        })
    }
}

impl RecordSource for Vec<TraceRecord> {
    fn records(&self) -> Result<Records<'_>, ReplayError> {
        self.as_slice().records()
    }

    fn rows_hint(&self) -> Option<usize> {
        Some(self.len())
    }

    fn arrival_span(&self) -> Result<Option<ArrivalSpan>, ReplayError> {
        self.as_slice().arrival_span()
    }
}

impl<T: RecordSource + ?Sized> RecordSource for &T {
    fn records(&self) -> Result<Records<'_>, ReplayError> {
        (**self).records()
    }

    fn rows_hint(&self) -> Option<usize> {
        (**self).rows_hint()
    }

    fn arrival_span(&self) -> Result<Option<ArrivalSpan>, ReplayError> {
        (**self).arrival_span()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that knows nothing cheaply: the default span is one pass.
    struct Plain(Vec<TraceRecord>);

    impl RecordSource for Plain {
        fn records(&self) -> Result<Records<'_>, ReplayError> {
            Ok(Box::new(self.0.iter().cloned().map(Ok)))
        }
    }

    #[test]
    fn spans_agree_and_every_call_starts_over() {
        let rs: Vec<TraceRecord> = [30, 10, 50]
            .iter()
            .map(|&t| TraceRecord::new(format!("r{t}"), t, "/v1/completions"))
            .collect();
        let want = Some(ArrivalSpan {
            first_us: 10,
            last_us: 50,
            rows: 3,
        });
        assert_eq!(rs.arrival_span().unwrap(), want);
        let p = Plain(rs.clone());
        assert_eq!(p.arrival_span().unwrap(), want);
        assert_eq!(p.rows_hint(), None);
        assert_eq!(Plain(vec![]).arrival_span().unwrap(), None);
        let ids = |s: &dyn RecordSource| -> Vec<String> {
            s.records()
                .unwrap()
                .map(|r| r.unwrap().request_id)
                .collect()
        };
        assert_eq!(ids(&rs), ids(&rs));
        assert_eq!(ids(&&rs[..]), vec!["r30", "r10", "r50"]);
    }
}
