//! The run's validity stamp (issue 53): the client's own timing error as the run measured
//! it ([`replay::probe`], the dispatch lag), judged against the figures the run reports.
//!
//! The rule (docs/metrics.md, "The validity stamp"): the client's timing error is the larger
//! of the reader lateness p99 (how long a task on the client runtime waited to be polled
//! after its wake-up: what a stream reader adds to every TTFT and chunk gap it times) and,
//! over a run of at least [`PACER_MIN_SENDS`] requests, the dispatch lag p99 (how late the
//! pacer's sends left). The run is VALID when that error is at most [`ERROR_FRACTION`] of
//! every reference: each SLO being judged (`--goodput`) and the measured TTFT p50 (the E2EL
//! p50 when no streamed request completed); else INVALID, naming each reference it is over.
//! CPU steal over [`STEAL_WARNING`] and a CPU frequency governor that follows the load are
//! warnings: they are causes, and what they did shows in the lateness measured.

use replay::config::ReplayConfig;
use replay::metrics::Metrics;
use replay::run::RunOutput;
use serde::{Deserialize, Serialize};

/// The share of each reference the client's own timing error may reach for a VALID run.
pub const ERROR_FRACTION: f64 = 0.1;
/// Requests below which the dispatch lag p99 is not judged (its p99 would be the run's one
/// worst send); the reader lateness, sampled every 2 ms, is judged whatever the run's size.
pub const PACER_MIN_SENDS: usize = 100;
/// CPU steal (share of the host's CPU time over the run) above which the stamp warns.
pub const STEAL_WARNING: f64 = 0.05;
/// Governors that change the CPU frequency with the load (a client's timings drift with it).
const LOAD_GOVERNORS: [&str; 3] = ["powersave", "ondemand", "conservative"];

/// `llmreplay.client.validity`: the stamp, its error budget, and what it was judged from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Validity {
    /// VALID (true) or INVALID.
    pub valid: bool,
    /// The client's own timing error judged, ms (see the module's rule).
    pub error_ms: f64,
    /// What the error is: `reader lateness p99` or `dispatch lag p99`.
    pub error_of: String,
    /// The error budget, ms: [`ERROR_FRACTION`] of the smallest reference; null when there
    /// is nothing to judge against (no SLO and no completed request).
    pub budget_ms: Option<f64>,
    /// [`ERROR_FRACTION`].
    pub fraction: f64,
    /// The references judged, smallest first.
    pub references: Vec<Reference>,
    /// Reader lateness p50, p99 and max, ms, and how many probes measured it.
    pub reader_lateness_p50_ms: f64,
    /// See `reader_lateness_p50_ms`.
    pub reader_lateness_p99_ms: f64,
    /// See `reader_lateness_p50_ms`.
    pub reader_lateness_max_ms: f64,
    /// See `reader_lateness_p50_ms`.
    pub probes: u64,
    /// How late the client's own thread woke against its deadlines, p99, ms.
    pub thread_lateness_p99_ms: f64,
    /// Dispatch lag p99, ms (the pacer's side; judged from [`PACER_MIN_SENDS`] requests).
    pub dispatch_lag_p99_ms: f64,
    /// CPU steal over the run (0–1); null where not measured.
    pub cpu_steal: Option<f64>,
    /// The CPU frequency governors; empty where not readable.
    pub cpu_governors: Vec<String>,
    /// Why the run is INVALID (empty when VALID).
    pub reasons: Vec<String>,
    /// What may have spoiled the timing without the error showing it over budget.
    pub warnings: Vec<String>,
    /// One line for people: the stamp, the error against its budget.
    pub message: String,
}

impl Validity {
    /// The host's side, `CPU steal / governors` (`0.2% / performance`), `none` for what was
    /// not measured.
    pub fn host_text(&self, none: &str) -> String {
        format!(
            "{} / {}",
            self.cpu_steal
                .map_or(none.to_string(), |s| format!("{:.1}%", s * 100.0)),
            match self.cpu_governors.is_empty() {
                true => none.to_string(),
                false => self.cpu_governors.join(", "),
            }
        )
    }
}

/// A figure the client's timing error is judged against.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Reference {
    /// What it is: `the measured TTFT p50`, `the ttft SLO`.
    pub what: String,
    /// Its value, ms.
    pub ms: f64,
}

/// What the stamp is judged from: the measured lateness, the host, the references.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StampInputs {
    /// Reader lateness p50, p99, max (ms) and the probes.
    pub reader: (f64, f64, f64, u64),
    /// Thread wake lateness p99, ms.
    pub thread_p99_ms: f64,
    /// Dispatch lag p99 (ms) and the requests it covers.
    pub dispatch: (f64, usize),
    /// CPU steal share.
    pub steal: Option<f64>,
    /// The governors.
    pub governors: Vec<String>,
    /// The references: (what, ms).
    pub references: Vec<(String, f64)>,
}

/// The stamp of a run measured as `i` says (the rule of this module).
pub fn stamp(i: &StampInputs) -> Validity {
    let (lag_p99, sends) = i.dispatch;
    let (error_ms, error_of) = if sends >= PACER_MIN_SENDS && lag_p99 > i.reader.1 {
        (lag_p99, "dispatch lag p99")
    } else {
        (i.reader.1, "reader lateness p99")
    };
    let mut refs: Vec<(String, f64)> = i
        .references
        .iter()
        .filter(|(_, v)| v.is_finite() && *v > 0.0)
        .cloned()
        .collect();
    refs.sort_by(|a, b| a.1.total_cmp(&b.1));
    let budget_ms = refs.first().map(|(_, v)| v * ERROR_FRACTION);
    let reasons: Vec<String> = refs
        .iter()
        .filter(|(_, v)| error_ms > v * ERROR_FRACTION)
        .map(|(what, v)| {
            format!(
                "the client's timing error ({error_of} {error_ms:.2} ms) is over {:.0}% of {what} ({v:.2} ms)",
                ERROR_FRACTION * 100.0
            )
        })
        .collect();
    let mut warnings = Vec::new();
    if let Some(s) = i.steal.filter(|s| *s > STEAL_WARNING) {
        warnings.push(format!(
            "CPU steal {:.1}% over the run: the hypervisor took CPU time from this host",
            s * 100.0
        ));
    }
    for g in i
        .governors
        .iter()
        .filter(|g| LOAD_GOVERNORS.contains(&g.as_str()))
    {
        warnings.push(format!(
            "CPU frequency governor {g}: the clock speed follows the load, so the client's \
             timing drifts with it (the performance governor holds it)"
        ));
    }
    let valid = reasons.is_empty();
    let message = match (&budget_ms, valid) {
        (None, _) => format!(
            "VALID: client timing error {error_ms:.2} ms ({error_of}); nothing to judge it \
             against (no SLO, no completed request)"
        ),
        (Some(b), true) => format!(
            "VALID: client timing error {error_ms:.2} ms ({error_of}) within its budget of \
             {b:.2} ms ({:.0}% of {} {:.2} ms)",
            ERROR_FRACTION * 100.0,
            refs[0].0,
            refs[0].1
        ),
        (Some(b), false) => format!(
            "INVALID: client timing error {error_ms:.2} ms ({error_of}) over its budget of \
             {b:.2} ms ({:.0}% of {} {:.2} ms): the client, not the server, may have made \
             these latencies; run it on a quieter or dedicated CPU (taskset), with fewer \
             requests per process, or shard across processes",
            ERROR_FRACTION * 100.0,
            refs[0].0,
            refs[0].1
        ),
    };
    Validity {
        valid,
        error_ms,
        error_of: error_of.into(),
        budget_ms,
        fraction: ERROR_FRACTION,
        references: refs
            .into_iter()
            .map(|(what, ms)| Reference { what, ms })
            .collect(),
        reader_lateness_p50_ms: i.reader.0,
        reader_lateness_p99_ms: i.reader.1,
        reader_lateness_max_ms: i.reader.2,
        probes: i.reader.3,
        thread_lateness_p99_ms: i.thread_p99_ms,
        dispatch_lag_p99_ms: lag_p99,
        cpu_steal: i.steal,
        cpu_governors: i.governors.clone(),
        reasons,
        warnings,
        message,
    }
}

/// The stamp of a run: None where its timing was not measured (a run assembled elsewhere,
/// merged shards) or the probe never woke.
pub fn of_run(cfg: &ReplayConfig, m: &Metrics, run: &RunOutput) -> Option<Validity> {
    let t = run.client_timing.as_ref()?;
    let r = &t.reader_lateness;
    if r.count == 0 {
        return None;
    }
    let mut references: Vec<(String, f64)> = cfg
        .goodput
        .iter()
        .map(|s| (format!("the {} SLO", s.metric.key()), s.limit_ms))
        .collect();
    if m.ttft.count > 0 {
        references.push(("the measured TTFT p50".into(), m.ttft.median));
    } else if m.e2el.count > 0 {
        references.push(("the measured E2EL p50".into(), m.e2el.median));
    }
    Some(stamp(&StampInputs {
        reader: (
            r.median,
            r.get(99.0).unwrap_or(r.max),
            r.max,
            r.count as u64,
        ),
        thread_p99_ms: t.thread_lateness.get(99.0).unwrap_or(0.0),
        dispatch: (
            m.dispatch_lag.get(99.0).unwrap_or(0.0),
            m.dispatch_lag.count,
        ),
        steal: t.steal,
        governors: t.governors.clone(),
        references,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(reader_p99: f64, refs: &[(&str, f64)]) -> StampInputs {
        StampInputs {
            reader: (reader_p99 / 4.0, reader_p99, reader_p99 * 2.0, 5000),
            thread_p99_ms: 0.05,
            dispatch: (0.02, 300),
            steal: Some(0.0),
            governors: vec!["performance".into()],
            references: refs.iter().map(|(w, v)| (w.to_string(), *v)).collect(),
        }
    }

    #[test]
    fn within_a_tenth_of_every_reference_is_valid() {
        let v = stamp(&inputs(
            0.4,
            &[("the ttft SLO", 250.0), ("the measured TTFT p50", 50.0)],
        ));
        assert!(v.valid, "{v:?}");
        assert_eq!(v.budget_ms, Some(5.0));
        assert_eq!(v.error_of, "reader lateness p99");
        assert!(v.reasons.is_empty() && v.warnings.is_empty());
        assert!(
            v.message.starts_with(
                "VALID: client timing error 0.40 ms (reader lateness p99) within its budget of \
                 5.00 ms (10% of the measured TTFT p50 50.00 ms)"
            ),
            "{}",
            v.message
        );
        // Exactly at the budget is still within it.
        assert!(stamp(&inputs(5.0, &[("the measured TTFT p50", 50.0)])).valid);
    }

    #[test]
    fn over_a_tenth_of_any_reference_is_invalid_naming_each() {
        let v = stamp(&inputs(
            12.0,
            &[
                ("the e2el SLO", 2000.0),
                ("the ttft SLO", 100.0),
                ("the measured TTFT p50", 50.0),
            ],
        ));
        assert!(!v.valid);
        assert_eq!(v.budget_ms, Some(5.0));
        assert_eq!(v.reasons.len(), 2, "{:?}", v.reasons);
        assert!(v.reasons[0].contains("over 10% of the measured TTFT p50 (50.00 ms)"));
        assert!(v.reasons[1].contains("over 10% of the ttft SLO (100.00 ms)"));
        assert!(v
            .message
            .starts_with("INVALID: client timing error 12.00 ms"));
    }

    /// The pacer's lateness counts from [`PACER_MIN_SENDS`] requests, not from one late send
    /// of a small run.
    #[test]
    fn the_dispatch_lag_is_judged_over_enough_sends() {
        let mut i = inputs(0.2, &[("the measured TTFT p50", 20.0)]);
        i.dispatch = (8.0, 300);
        let v = stamp(&i);
        assert!(!v.valid);
        assert_eq!((v.error_ms, v.error_of.as_str()), (8.0, "dispatch lag p99"));
        i.dispatch = (8.0, PACER_MIN_SENDS - 1);
        assert!(stamp(&i).valid);
    }

    #[test]
    fn steal_and_a_load_governor_warn_without_invalidating() {
        let mut i = inputs(0.2, &[("the measured TTFT p50", 20.0)]);
        i.steal = Some(0.12);
        i.governors = vec!["performance".into(), "powersave".into()];
        let v = stamp(&i);
        assert!(v.valid);
        assert_eq!(v.warnings.len(), 2, "{:?}", v.warnings);
        assert!(v.warnings[0].starts_with("CPU steal 12.0%"));
        assert!(v.warnings[1].starts_with("CPU frequency governor powersave"));
    }

    #[test]
    fn nothing_to_judge_against_is_said() {
        let v = stamp(&inputs(3.0, &[("the measured TTFT p50", 0.0)]));
        assert!(v.valid);
        assert_eq!(v.budget_ms, None);
        assert!(v.message.contains("nothing to judge it against"));
    }
}
