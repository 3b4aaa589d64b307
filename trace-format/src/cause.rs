//! The outcome taxonomy: who caused what became of a request. Written once, here, and used by
//! every verdict (replay's metrics, the console, the JSON result, sweeps, capacity, compare,
//! report, fidelity), so an error budget, an SLO attainment or a goodput never counts against
//! the server what the client or the replay did. `docs/metrics.md` ("Outcome taxonomy")
//! states the same rules for people.
//!
//! - [`Cause::Server`]: what the server caused: 5xx, 429, resets and truncated streams
//!   (`upstream_error`), timeouts, and a 4xx where the capture succeeded.
//! - [`Cause::Client`]: what the client did, as captured: a recorded cancellation replayed at
//!   its point; a 4xx where the captured row was a 4xx too and its body was sent as captured.
//! - [`Cause::Replay`]: what the replay changed: a 4xx or a success where the captured row
//!   was a 4xx but its body was synthesized (the capture had none), so the request sent was
//!   not the one the client sent. Rows the replay skipped never become a request; they are
//!   counted apart (`skipped_rows`), with why.
//! - [`Cause::Served`]: the server served it (outcome `ok`).
//!
//! Error budget, SLO attainment and goodput are over the requests the server was asked to
//! serve: [`CauseCounts::asked`] = served + server-caused failures. The client's and the
//! replay's are counted and shown beside them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::schema::{Outcome, TraceRecord};

/// Who caused a request's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The server served it.
    Served,
    /// The server failed it.
    Server,
    /// The client did it, as captured.
    Client,
    /// The replay changed it.
    Replay,
}

impl Cause {
    /// The name used in documents and on the console.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Served => "served",
            Cause::Server => "server",
            Cause::Client => "client",
            Cause::Replay => "replay",
        }
    }

    /// Whether the server was asked to serve it: it counts in the error budget, the SLO
    /// attainment and the goodput.
    pub fn asked(self) -> bool {
        matches!(self, Cause::Served | Cause::Server)
    }

    /// The cause of a replayed row's outcome, from its own outcome and status and what its
    /// captured row was (`captured_status`, `captured_outcome`, `synthesized_body`; schema
    /// 1.2). A row that does not say what was captured (a synthetic trace, an older result)
    /// counts every failure as the server's.
    pub fn of(r: &TraceRecord) -> Cause {
        let captured_4xx = r.captured_status.is_some_and(is_client_status);
        let synthesized = r.synthesized_body == Some(true);
        match r.outcome {
            Outcome::Ok if captured_4xx && synthesized => Cause::Replay,
            Outcome::Ok => Cause::Served,
            Outcome::ClientCancelled if r.captured_outcome == Some(Outcome::ClientCancelled) => {
                Cause::Client
            }
            Outcome::HttpError if r.status.is_some_and(is_client_status) && captured_4xx => {
                if synthesized {
                    Cause::Replay
                } else {
                    Cause::Client
                }
            }
            _ => Cause::Server,
        }
    }

    /// The cause of a captured row's outcome (a capture, not a replay): its client
    /// cancelling, or a 4xx other than 429, is the client's; any other failure the server's.
    pub fn of_captured(r: &TraceRecord) -> Cause {
        match r.outcome {
            Outcome::Ok => Cause::Served,
            Outcome::ClientCancelled => Cause::Client,
            Outcome::HttpError if r.status.is_some_and(is_client_status) => Cause::Client,
            _ => Cause::Server,
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A 4xx that says the request was wrong (400–499 apart from 429, which says the server is
/// overloaded).
pub fn is_client_status(status: u16) -> bool {
    (400..500).contains(&status) && status != 429
}

/// Requests per [`Cause`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CauseCounts {
    /// Served by the server.
    pub served: u64,
    /// Failed by the server.
    pub server: u64,
    /// The client's, as captured (replayed cancellations, captured 4xx).
    pub client: u64,
    /// The replay's (a synthesized body where the capture had a 4xx).
    pub replay: u64,
}

impl CauseCounts {
    /// Counts one request.
    pub fn add(&mut self, c: Cause) {
        *match c {
            Cause::Served => &mut self.served,
            Cause::Server => &mut self.server,
            Cause::Client => &mut self.client,
            Cause::Replay => &mut self.replay,
        } += 1;
    }

    /// Adds another run's counts.
    pub fn merge(&mut self, o: &CauseCounts) {
        self.served += o.served;
        self.server += o.server;
        self.client += o.client;
        self.replay += o.replay;
    }

    /// Requests the server was asked to serve: served + server-caused failures.
    pub fn asked(&self) -> u64 {
        self.served + self.server
    }

    /// Requests left out of the verdict: the client's and the replay's.
    pub fn excluded(&self) -> u64 {
        self.client + self.replay
    }

    /// Every request.
    pub fn total(&self) -> u64 {
        self.asked() + self.excluded()
    }

    /// Server-caused failures / requests the server was asked to serve (0 when none was).
    pub fn server_failed_fraction(&self) -> f64 {
        match self.asked() {
            0 => 0.0,
            n => self.server as f64 / n as f64,
        }
    }

    /// What was left out, as people read it: `2 client (cancelled or 4xx as captured), 1
    /// replay (synthesized body)`; empty when nothing was.
    pub fn excluded_text(&self) -> String {
        let mut parts = Vec::new();
        if self.client > 0 {
            parts.push(format!(
                "{} the client's (cancelled or 4xx as captured)",
                self.client
            ));
        }
        if self.replay > 0 {
            parts.push(format!(
                "{} the replay's (synthesized body where the capture had a 4xx)",
                self.replay
            ));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(outcome: Outcome, status: Option<u16>) -> TraceRecord {
        let mut r = TraceRecord::new("r", 0, "/v1/chat/completions");
        r.outcome = outcome;
        r.status = status;
        r
    }

    fn replayed(
        outcome: Outcome,
        status: Option<u16>,
        captured: (Outcome, Option<u16>),
        synthesized: bool,
    ) -> TraceRecord {
        let mut r = row(outcome, status);
        r.captured_outcome = Some(captured.0);
        r.captured_status = captured.1;
        r.synthesized_body = Some(synthesized);
        r
    }

    #[test]
    fn each_outcome_has_the_cause_the_taxonomy_gives_it() {
        use Outcome::*;
        let ok = (Ok, Some(200));
        let bad = (HttpError, Some(400));
        let cancelled = (ClientCancelled, Some(200));
        let cases = [
            // The server's.
            (replayed(HttpError, Some(500), ok, false), Cause::Server),
            (replayed(HttpError, Some(429), ok, false), Cause::Server),
            (replayed(HttpError, Some(429), bad, false), Cause::Server),
            (replayed(UpstreamError, None, ok, false), Cause::Server),
            (replayed(Timeout, None, ok, false), Cause::Server),
            (replayed(HttpError, Some(400), ok, false), Cause::Server),
            (replayed(HttpError, Some(500), bad, false), Cause::Server),
            (replayed(ClientCancelled, None, ok, false), Cause::Server),
            // The client's, as captured.
            (
                replayed(ClientCancelled, Some(200), cancelled, false),
                Cause::Client,
            ),
            (
                replayed(ClientCancelled, Some(200), cancelled, true),
                Cause::Client,
            ),
            (replayed(HttpError, Some(400), bad, false), Cause::Client),
            (replayed(HttpError, Some(422), bad, false), Cause::Client),
            // The replay's.
            (replayed(HttpError, Some(400), bad, true), Cause::Replay),
            (replayed(Ok, Some(200), bad, true), Cause::Replay),
            // Served.
            (replayed(Ok, Some(200), ok, true), Cause::Served),
            (replayed(Ok, Some(200), bad, false), Cause::Served),
            (replayed(Ok, Some(200), cancelled, false), Cause::Served),
            // Nothing known of the capture: every failure is the server's.
            (row(HttpError, Some(400)), Cause::Server),
            (row(ClientCancelled, None), Cause::Server),
            (row(Ok, Some(200)), Cause::Served),
        ];
        for (i, (r, want)) in cases.iter().enumerate() {
            assert_eq!(Cause::of(r), *want, "case {i}: {r:?}");
        }
    }

    #[test]
    fn captured_rows_are_judged_on_their_own() {
        assert_eq!(
            Cause::of_captured(&row(Outcome::ClientCancelled, None)),
            Cause::Client
        );
        assert_eq!(
            Cause::of_captured(&row(Outcome::HttpError, Some(404))),
            Cause::Client
        );
        assert_eq!(
            Cause::of_captured(&row(Outcome::HttpError, Some(429))),
            Cause::Server
        );
        assert_eq!(
            Cause::of_captured(&row(Outcome::Timeout, None)),
            Cause::Server
        );
    }

    #[test]
    fn the_error_budget_is_over_the_requests_the_server_was_asked_to_serve() {
        let mut c = CauseCounts::default();
        for cause in [Cause::Served; 96] {
            c.add(cause);
        }
        c.add(Cause::Server);
        c.add(Cause::Client);
        c.add(Cause::Client);
        c.add(Cause::Replay);
        assert_eq!((c.asked(), c.excluded(), c.total()), (97, 3, 100));
        assert!((c.server_failed_fraction() - 1.0 / 97.0).abs() < 1e-12);
        assert!(c.excluded_text().starts_with("2 the client's"));
        assert_eq!(CauseCounts::default().server_failed_fraction(), 0.0);
    }
}
