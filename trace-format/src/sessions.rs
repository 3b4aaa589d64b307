//! The sessions of a trace, for `inspect`: how many conversations, how many turns each, how
//! long users think between turns, and how much of the traffic is multi-turn.
//!
//! [`SessionStats`] takes rows one at a time, in any order ([`SessionStats::add`]), and
//! [`SessionStats::finish`] gives the [`SessionSummary`], or None when no row has a session
//! id. It holds a 64-bit hash and a counter per distinct session (grows with the sessions,
//! not the rows) and the think times (`think_time_us`, recorded by capture's session linking)
//! in a [`Quantiles`] (bounded: exact up to its cap, then estimated); nothing else of a row.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use serde::Serialize;

use crate::quantiles::Quantiles;
use crate::schema::TraceRecord;
use crate::stats::percentile;

/// The sessions of a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionSummary {
    /// Distinct session ids.
    pub sessions: usize,
    /// Sessions with more than one request.
    pub multi_turn_sessions: usize,
    /// Requests per session (over every session).
    pub turns: Spread,
    /// Requests in a multi-turn session / all requests (rows without a session count as
    /// single requests).
    pub multi_turn_share: f64,
    /// Rows that name the request they continue (`parent_request_id`).
    pub linked: usize,
    /// Think time between turns, ms (None when no row has one).
    pub think_time_ms: Option<ThinkTime>,
}

/// Median, 99th percentile and largest value of a count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    /// Median (linear interpolation, as numpy).
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: u64,
}

/// The think times of the linked turns, ms.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThinkTime {
    /// Turns with a think time.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// Accumulates [`SessionSummary`] over rows given in any order.
#[derive(Debug, Default)]
pub struct SessionStats {
    rows: usize,
    per_session: HashMap<u64, u64>,
    linked: usize,
    think_ms: Quantiles,
}

impl SessionStats {
    /// An empty accumulator.
    pub fn new() -> SessionStats {
        SessionStats::default()
    }

    /// Counts one row.
    pub fn add(&mut self, r: &TraceRecord) {
        self.rows += 1;
        if let Some(s) = &r.session_id {
            let mut h = std::hash::DefaultHasher::new();
            s.hash(&mut h);
            *self.per_session.entry(h.finish()).or_insert(0) += 1;
        }
        self.linked += usize::from(r.parent_request_id.is_some());
        if let Some(t) = r.think_time_us {
            self.think_ms.add(t as f64 / 1e3);
        }
    }

    /// The summary; None when no row had a session id.
    pub fn finish(self) -> Option<SessionSummary> {
        if self.per_session.is_empty() {
            return None;
        }
        let mut turns: Vec<u64> = self.per_session.into_values().collect();
        turns.sort_unstable();
        let multi: Vec<u64> = turns.iter().copied().filter(|&n| n > 1).collect();
        let in_multi: u64 = multi.iter().sum();
        let sorted: Vec<f64> = turns.iter().map(|&n| n as f64).collect();
        let think = self.think_ms;
        Some(SessionSummary {
            sessions: turns.len(),
            multi_turn_sessions: multi.len(),
            turns: Spread {
                p50: percentile(&sorted, 50.0),
                p99: percentile(&sorted, 99.0),
                max: turns.last().copied().unwrap_or(0),
            },
            multi_turn_share: in_multi as f64 / self.rows.max(1) as f64,
            linked: self.linked,
            think_time_ms: (!think.is_empty()).then(|| ThinkTime {
                count: think.len(),
                p50: think.quantile(50.0),
                p99: think.quantile(99.0),
            }),
        })
    }
}

impl std::fmt::Display for SessionSummary {
    /// One console line: `200 (150 multi-turn), turns p50 5 p99 10 max 10; 83.1% of requests in
    /// multi-turn sessions; think time p50 1200.0 ms p99 9000.0 ms (800 linked turns)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} multi-turn), turns per session p50 {} p99 {} max {}; {:.1}% of requests in \
             multi-turn sessions",
            self.sessions,
            self.multi_turn_sessions,
            tidy(self.turns.p50),
            tidy(self.turns.p99),
            self.turns.max,
            self.multi_turn_share * 100.0
        )?;
        if let Some(t) = &self.think_time_ms {
            write!(
                f,
                "; think time p50 {:.1} ms p99 {:.1} ms ({} linked turns)",
                t.p50, t.p99, t.count
            )?;
        }
        Ok(())
    }
}

/// An interpolated count as a reader wants it: at most two decimals, no trailing zeros
/// (`2.38`, not `2.3800000000000026`; `2`, not `2.00`).
fn tidy(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39, polish: `inspect` printed "turns per session p50 1 p99 2.3800000000000026".
    #[test]
    fn interpolated_turns_print_with_two_decimals_at_most() {
        let s = SessionSummary {
            sessions: 120,
            multi_turn_sessions: 3,
            turns: Spread {
                p50: 1.0,
                p99: 2.3800000000000026,
                max: 4,
            },
            multi_turn_share: 0.05,
            linked: 0,
            think_time_ms: None,
        };
        let line = s.to_string();
        assert!(line.contains("p50 1 p99 2.38 max 4;"), "{line}");
    }

    fn row(
        id: &str,
        session: Option<&str>,
        parent: Option<&str>,
        think_us: Option<i64>,
    ) -> TraceRecord {
        let mut r = TraceRecord::new(id, 0, "/v1/chat/completions");
        r.session_id = session.map(str::to_string);
        r.parent_request_id = parent.map(str::to_string);
        r.think_time_us = think_us;
        r
    }

    /// Sessions a (3 turns), b (1), c (2) and one row without a session, in scrambled order.
    #[test]
    fn hand_computed_summary() {
        let rows = [
            row("c2", Some("c"), Some("c1"), Some(4_000)),
            row("a1", Some("a"), None, None),
            row("x", None, None, None),
            row("a3", Some("a"), Some("a2"), Some(3_000)),
            row("b1", Some("b"), None, None),
            row("c1", Some("c"), None, None),
            row("a2", Some("a"), Some("a1"), Some(1_000)),
        ];
        let mut st = SessionStats::new();
        for r in &rows {
            st.add(r);
        }
        let s = st.finish().expect("sessions");
        assert_eq!((s.sessions, s.multi_turn_sessions, s.linked), (3, 2, 3));
        // Turns 1, 2, 3: median 2, p99 = 2 + 0.98 × 1.
        assert_eq!((s.turns.p50, s.turns.max), (2.0, 3));
        assert!((s.turns.p99 - 2.98).abs() < 1e-9, "{:?}", s.turns);
        // a's 3 and c's 2 of 7 requests.
        assert!((s.multi_turn_share - 5.0 / 7.0).abs() < 1e-12);
        let t = s.think_time_ms.as_ref().unwrap();
        assert_eq!((t.count, t.p50), (3, 3.0));
        assert!((t.p99 - 3.98).abs() < 1e-9, "{t:?}");
        let line = s.to_string();
        assert!(line.starts_with("3 (2 multi-turn)"), "{line}");
        assert!(line.contains("71.4% of requests"), "{line}");
        assert!(line.contains("think time p50 3.0 ms"), "{line}");
    }

    #[test]
    fn no_session_ids_no_summary() {
        let mut st = SessionStats::new();
        st.add(&row("x", None, None, None));
        assert_eq!(st.finish(), None);
        assert_eq!(SessionStats::new().finish(), None);
        // Sessions without linking (a header, an import): no think time.
        let mut st = SessionStats::new();
        st.add(&row("x", Some("s"), None, None));
        let s = st.finish().unwrap();
        assert_eq!(
            (s.sessions, s.multi_turn_share, s.think_time_ms.clone()),
            (1, 0.0, None)
        );
        assert!(!s.to_string().contains("think"), "{s}");
    }
}
