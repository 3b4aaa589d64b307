//! A/A fidelity: does a replay reproduce the traffic it was made from, and where does it drift?
//!
//! The captured trace and the replay's result rows share `request_id`, so every request can be
//! laid beside its replay. [`assess`] compares, per request and per class of request (endpoint,
//! streamed or not):
//! - the **schedule**: the replayed send offset (scheduled offset + queue + client lag + connect,
//!   the instant the request's bytes left) minus the captured arrival offset (scaled by the
//!   replay's speed-up), both measured from the first request they share, and whether each
//!   session's turns were sent in their captured order;
//! - the **load**: requests, prompt and output tokens per class, and outcomes, side by side;
//! - the **latencies**: TTFT, TPOT, ITL and E2EL quantiles, replayed / captured, and the
//!   Kolmogorov–Smirnov distance between the two distributions (the largest gap between their
//!   CDFs: 0 = identical, 1 = disjoint), which marks a drift only beyond chance at the sample
//!   sizes and with a decile moved by more than 5% ([`shape_drifts`]).
//!
//! Then a plain verdict says which part drifts: the schedule (the client did not send when it
//! should), the load (different requests, tokens or outcomes), or the server's state (same
//! requests at the same times, different latencies — e.g. a prefix cache warm in production
//! and cold in the replay).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Serialize;
use trace_format::stats::percentile;
use trace_format::{Outcome, TraceRecord};

use replay::metrics::{itl_gaps_ms, tpot_ms, ttft_ms};

/// The schedule error the verdict tolerates at p99, ms, at least: a send this close to its
/// captured instant cannot change what the server sees (sub-millisecond gaps are below the
/// resolution of a capture's arrival stamps and of a loopback round trip).
pub const SCHEDULE_FLOOR_MS: f64 = 5.0;
/// …or this share of the captured mean gap between requests, when that is larger.
pub const SCHEDULE_GAP_SHARE: f64 = 0.1;
/// A latency quantile reproduces when replayed / captured is within [1/RATIO_TOL, RATIO_TOL].
pub const RATIO_TOL: f64 = 1.25;
/// …and the two distributions are no further apart than this KS distance, or, when they
/// are, the gap is one sampling alone gives (see [`shape_drifts`]) or moves no decile by more
/// than [`SHAPE_TOL`].
pub const KS_TOL: f64 = 0.25;
/// The two-sample KS test's coefficient at α = 0.01: a distance below
/// `KS_ALPHA_01 × √((n+m)/(n·m))` is what two samples of one distribution show one time in a
/// hundred or more.
pub const KS_ALPHA_01: f64 = 1.628;
/// A KS distance is a drift only when some decile moves by more than this ratio: a server
/// whose TPOT holds within 0.5 ms gives KS 0.3 for a shift of 1%, which is no drift.
pub const SHAPE_TOL: f64 = 1.05;
/// The quantiles compared.
pub const QUANTILES: [f64; 3] = [50.0, 90.0, 99.0];

/// Options of an assessment.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The replay's `--speedup` (captured offsets are divided by it).
    pub speedup: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options { speedup: 1.0 }
    }
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Fidelity {
    /// Captured rows.
    pub captured: usize,
    /// Replayed rows.
    pub replayed: usize,
    /// Rows present in both (by `request_id`).
    pub matched: usize,
    /// Captured rows without a replayed row.
    pub only_captured: usize,
    /// Replayed rows without a captured row.
    pub only_replayed: usize,
    /// Send-time error.
    pub schedule: Schedule,
    /// Per class, captured and replayed side by side.
    pub classes: Vec<ClassFidelity>,
    /// Outcomes over all rows: outcome → (captured, replayed).
    pub outcomes: BTreeMap<String, (usize, usize)>,
    /// Matched requests whose outcome changed: `"captured → replayed"` → requests.
    pub outcome_changes: BTreeMap<String, usize>,
    /// Which part drifts, in one sentence per finding; the first says whether the replay
    /// reproduces the capture.
    pub verdict: Vec<String>,
    /// Whether the load reproduces (requests, tokens and outcomes): a part the replay controls.
    pub load_reproduced: bool,
    /// Whether the schedule reproduces (error within its bound, sessions in order).
    pub schedule_reproduced: bool,
    /// Whether every latency quantile and distance is within tolerance.
    pub latencies_reproduced: bool,
}

/// Send-time error of the matched requests.
#[derive(Debug, Clone, Serialize)]
pub struct Schedule {
    /// Requests with both a captured arrival and a replayed send.
    pub requests: usize,
    /// |replayed send offset − captured arrival offset / speedup|, median, ms.
    pub abs_error_p50_ms: f64,
    /// …its 99th percentile, ms.
    pub abs_error_p99_ms: f64,
    /// …its largest value, ms.
    pub abs_error_max_ms: f64,
    /// Signed median (positive: the replay sent late), ms.
    pub error_median_ms: f64,
    /// The p99 bound the verdict applies, ms (see [`SCHEDULE_FLOOR_MS`]).
    pub bound_ms: f64,
    /// Sessions (captured `session_id`) with more than one matched turn.
    pub sessions: usize,
    /// …of which had their turns sent in their captured order.
    pub sessions_in_order: usize,
}

/// One class of request.
#[derive(Debug, Clone, Serialize)]
pub struct ClassFidelity {
    /// Request path.
    pub endpoint: String,
    /// Streamed or not.
    pub stream: bool,
    /// (captured, replayed) requests, over all rows of the class.
    pub requests: (usize, usize),
    /// (captured, replayed) Σ prompt tokens, over all rows of the class.
    pub prompt_tokens: (i64, i64),
    /// Output tokens of the requests that succeeded on both sides (matched), so a failure on
    /// one side does not count as a token difference.
    pub output_tokens: (i64, i64),
    /// Matched requests that succeeded on both sides.
    pub both_ok: usize,
    /// Latencies of the requests that succeeded on both sides (TTFT, TPOT and ITL apply to
    /// streamed classes only).
    pub latencies: Vec<LatencyFidelity>,
}

/// One latency metric of one class.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyFidelity {
    /// `ttft`, `tpot`, `itl` or `e2el`.
    pub metric: &'static str,
    /// Values on each side.
    pub samples: (usize, usize),
    /// (quantile, captured ms, replayed ms, replayed / captured).
    pub quantiles: Vec<(f64, f64, f64, f64)>,
    /// Kolmogorov–Smirnov distance between the two samples.
    pub ks: f64,
    /// Quantiles within [`RATIO_TOL`], and no drift of shape ([`shape_drifts`]).
    pub reproduced: bool,
    /// The captured values, ms, ascending (for the HTML overlay; not serialized).
    #[serde(skip)]
    pub captured_ms: Vec<f64>,
    /// The replayed values, ms, ascending.
    #[serde(skip)]
    pub replayed_ms: Vec<f64>,
}

/// The instant a replayed request's bytes left, µs from the replay's schedule zero.
fn send_offset_us(r: &TraceRecord) -> Option<i64> {
    let sched = r.scheduled_offset_us?;
    Some(
        sched
            + r.queue_us.unwrap_or(0)
            + r.dispatch_lag_us.unwrap_or(0)
            + r.connect_us.unwrap_or(0),
    )
}

/// Kolmogorov–Smirnov distance of two samples (sorted in place); 0 when either is empty.
pub fn ks_distance(a: &mut [f64], b: &mut [f64]) -> f64 {
    if a.is_empty() || b.is_empty() {
        return 0.0;
    }
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let (mut i, mut j, mut d) = (0usize, 0usize, 0f64);
    while i < a.len() && j < b.len() {
        let x = a[i].min(b[j]);
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        d = d.max((i as f64 / na - j as f64 / nb).abs());
    }
    d
}

/// A quantile ratio within [1/RATIO_TOL, RATIO_TOL] (NaN: no captured value to compare).
fn within_tol(r: f64) -> bool {
    r.is_nan() || (1.0 / RATIO_TOL..=RATIO_TOL).contains(&r)
}

/// Whether two samples (sorted ascending) at KS distance `ks` differ in shape: the distance
/// is over [`KS_TOL`], over what sampling alone gives at their sizes (α = 0.01: with 10
/// requests a side, distances up to 0.73 are chance), and some decile moved by more than
/// [`SHAPE_TOL`]. The p50/p90/p99 ratios are judged on their own.
pub fn shape_drifts(ks: f64, cap: &[f64], rep: &[f64]) -> bool {
    if cap.is_empty() || rep.is_empty() {
        return false;
    }
    let (n, m) = (cap.len() as f64, rep.len() as f64);
    let chance = KS_ALPHA_01 * ((n + m) / (n * m)).sqrt();
    let moved = (1..10).any(|d| {
        let q = f64::from(d) * 10.0;
        let (c, r) = (percentile(cap, q), percentile(rep, q));
        if c > 0.0 {
            !(1.0 / SHAPE_TOL..=SHAPE_TOL).contains(&(r / c))
        } else {
            r != c
        }
    });
    ks > KS_TOL && ks > chance && moved
}

fn latency(metric: &'static str, mut cap: Vec<f64>, mut rep: Vec<f64>) -> LatencyFidelity {
    let ks = ks_distance(&mut cap, &mut rep);
    let quantiles: Vec<(f64, f64, f64, f64)> = if cap.is_empty() || rep.is_empty() {
        Vec::new()
    } else {
        QUANTILES
            .iter()
            .map(|&q| {
                let (c, r) = (percentile(&cap, q), percentile(&rep, q));
                (q, c, r, if c > 0.0 { r / c } else { f64::NAN })
            })
            .collect()
    };
    let reproduced = !shape_drifts(ks, &cap, &rep) && quantiles.iter().all(|q| within_tol(q.3));
    LatencyFidelity {
        metric,
        samples: (cap.len(), rep.len()),
        quantiles,
        ks,
        reproduced,
        captured_ms: cap,
        replayed_ms: rep,
    }
}

/// Compares a captured trace with the result rows of its replay.
pub fn assess(captured: &[TraceRecord], replayed: &[TraceRecord], opts: Options) -> Fidelity {
    let speedup = if opts.speedup > 0.0 {
        opts.speedup
    } else {
        1.0
    };
    let rep_by_id: HashMap<&str, &TraceRecord> = replayed
        .iter()
        .map(|r| (r.request_id.as_str(), r))
        .collect();
    let cap_ids: std::collections::HashSet<&str> =
        captured.iter().map(|r| r.request_id.as_str()).collect();
    let mut pairs: Vec<(&TraceRecord, &TraceRecord)> = captured
        .iter()
        .filter_map(|c| rep_by_id.get(c.request_id.as_str()).map(|r| (c, *r)))
        .collect();
    pairs.sort_by_key(|(c, _)| c.arrival_time_us);
    let only_replayed = replayed
        .iter()
        .filter(|r| !cap_ids.contains(r.request_id.as_str()))
        .count();

    let schedule = schedule(&pairs, speedup);

    let mut outcomes: BTreeMap<String, (usize, usize)> = Outcome::ALL
        .iter()
        .map(|o| (o.to_string(), (0, 0)))
        .collect();
    for r in captured {
        outcomes.entry(r.outcome.to_string()).or_default().0 += 1;
    }
    for r in replayed {
        outcomes.entry(r.outcome.to_string()).or_default().1 += 1;
    }

    let changes = OutcomeChanges::of(&pairs);

    let classes = classes(captured, replayed, &pairs);
    let verdict_parts = verdict(
        &schedule,
        &classes,
        &outcomes,
        &changes,
        pairs.len(),
        captured.len(),
    );
    Fidelity {
        captured: captured.len(),
        replayed: replayed.len(),
        matched: pairs.len(),
        only_captured: captured.len() - pairs.len(),
        only_replayed,
        schedule,
        classes,
        outcomes,
        outcome_changes: changes.by_kind.clone(),
        verdict: verdict_parts.0,
        load_reproduced: verdict_parts.1,
        schedule_reproduced: verdict_parts.2,
        latencies_reproduced: verdict_parts.3,
    }
}

fn schedule(pairs: &[(&TraceRecord, &TraceRecord)], speedup: f64) -> Schedule {
    let sent: Vec<(&TraceRecord, i64)> = pairs
        .iter()
        .filter_map(|(c, r)| send_offset_us(r).map(|s| (*c, s)))
        .collect();
    let mut errors: Vec<f64> = Vec::new();
    if let Some((c0, s0)) = sent.first() {
        for (c, s) in &sent {
            let cap = (c.arrival_time_us - c0.arrival_time_us) as f64 / speedup;
            errors.push((s - s0) as f64 - cap);
        }
    }
    let mut abs: Vec<f64> = errors.iter().map(|e| e.abs() / 1000.0).collect();
    abs.sort_by(f64::total_cmp);
    errors.sort_by(f64::total_cmp);
    let gap_ms = match (sent.first(), sent.last()) {
        (Some(a), Some(b)) if sent.len() > 1 => {
            (b.0.arrival_time_us - a.0.arrival_time_us) as f64
                / 1000.0
                / speedup
                / (sent.len() - 1) as f64
        }
        _ => 0.0,
    };
    let bound_ms = (SCHEDULE_GAP_SHARE * gap_ms).max(SCHEDULE_FLOOR_MS);

    // Sessions: captured order (by arrival) against replayed send order.
    let mut by_session: BTreeMap<&str, Vec<(i64, Option<i64>)>> = BTreeMap::new();
    for (c, r) in pairs {
        if let Some(s) = &c.session_id {
            by_session
                .entry(s.as_str())
                .or_default()
                .push((c.arrival_time_us, send_offset_us(r)));
        }
    }
    let multi: Vec<&Vec<(i64, Option<i64>)>> =
        by_session.values().filter(|v| v.len() > 1).collect();
    let in_order = multi
        .iter()
        .filter(|v| {
            let mut v: Vec<(i64, Option<i64>)> = v.to_vec();
            v.sort_by_key(|x| x.0);
            v.windows(2).all(|w| match (w[0].1, w[1].1) {
                (Some(a), Some(b)) => a <= b,
                _ => true,
            })
        })
        .count();
    let pick = |p: f64| {
        if abs.is_empty() {
            0.0
        } else {
            percentile(&abs, p)
        }
    };
    Schedule {
        requests: sent.len(),
        abs_error_p50_ms: pick(50.0),
        abs_error_p99_ms: pick(99.0),
        abs_error_max_ms: abs.last().copied().unwrap_or(0.0),
        error_median_ms: if errors.is_empty() {
            0.0
        } else {
            percentile(&errors, 50.0) / 1000.0
        },
        bound_ms,
        sessions: multi.len(),
        sessions_in_order: in_order,
    }
}

/// Matched requests whose outcome changed, by who changed it: the client's cancellations are
/// the replay's to reproduce, every other outcome is the server's answer.
#[derive(Debug, Default)]
struct OutcomeChanges {
    /// `"captured → replayed"` → requests.
    by_kind: BTreeMap<String, usize>,
    /// Cancelled in the capture and not in the replay; the other way round.
    not_cancelled: usize,
    cancelled: usize,
    /// Succeeded in the capture and failed in the replay; the other way; failed differently.
    now_failed: usize,
    now_ok: usize,
    other_failure: usize,
}

impl OutcomeChanges {
    fn of(pairs: &[(&TraceRecord, &TraceRecord)]) -> OutcomeChanges {
        let mut ch = OutcomeChanges::default();
        for (c, r) in pairs {
            if c.outcome != r.outcome {
                let kind = format!("{} → {}", c.outcome, r.outcome);
                *ch.by_kind.entry(kind).or_default() += 1;
            }
            match (c.outcome, r.outcome) {
                (a, b) if a == b => {}
                (Outcome::ClientCancelled, _) => ch.not_cancelled += 1,
                (_, Outcome::ClientCancelled) => ch.cancelled += 1,
                (Outcome::Ok, _) => ch.now_failed += 1,
                (_, Outcome::Ok) => ch.now_ok += 1,
                _ => ch.other_failure += 1,
            }
        }
        ch
    }

    fn by_client(&self) -> bool {
        self.not_cancelled + self.cancelled > 0
    }

    fn by_server(&self) -> bool {
        self.now_failed + self.now_ok + self.other_failure > 0
    }
}

type ClassKey = (String, bool);

fn classes(
    captured: &[TraceRecord],
    replayed: &[TraceRecord],
    pairs: &[(&TraceRecord, &TraceRecord)],
) -> Vec<ClassFidelity> {
    let mut out: BTreeMap<ClassKey, ClassFidelity> = BTreeMap::new();
    fn entry<'a>(
        out: &'a mut BTreeMap<ClassKey, ClassFidelity>,
        r: &TraceRecord,
    ) -> &'a mut ClassFidelity {
        out.entry((r.endpoint.clone(), r.stream))
            .or_insert_with(|| ClassFidelity {
                endpoint: r.endpoint.clone(),
                stream: r.stream,
                requests: (0, 0),
                prompt_tokens: (0, 0),
                output_tokens: (0, 0),
                both_ok: 0,
                latencies: Vec::new(),
            })
    }
    for r in captured {
        let c = entry(&mut out, r);
        c.requests.0 += 1;
        c.prompt_tokens.0 += r.prompt_tokens.unwrap_or(0);
    }
    for r in replayed {
        let c = entry(&mut out, r);
        c.requests.1 += 1;
        c.prompt_tokens.1 += r.prompt_tokens.unwrap_or(0);
    }
    // Latencies and output tokens over the pairs that succeeded on both sides, classed by
    // the captured row.
    let mut ok: BTreeMap<ClassKey, Vec<(&TraceRecord, &TraceRecord)>> = BTreeMap::new();
    for (c, r) in pairs {
        if c.outcome == Outcome::Ok && r.outcome == Outcome::Ok {
            ok.entry((c.endpoint.clone(), c.stream))
                .or_default()
                .push((c, r));
        }
    }
    for (key, v) in ok {
        let Some(class) = out.get_mut(&key) else {
            continue;
        };
        class.both_ok = v.len();
        class.output_tokens = (
            v.iter().filter_map(|(c, _)| c.output_tokens).sum(),
            v.iter().filter_map(|(_, r)| r.output_tokens).sum(),
        );
        let side = |f: &dyn Fn(&TraceRecord) -> Vec<f64>| -> (Vec<f64>, Vec<f64>) {
            (
                v.iter().flat_map(|(c, _)| f(c)).collect(),
                v.iter().flat_map(|(_, r)| f(r)).collect(),
            )
        };
        if key.1 {
            let (a, b) = side(&|r| ttft_ms(r).into_iter().collect());
            class.latencies.push(latency("ttft", a, b));
            let (a, b) = side(&|r| tpot_ms(r).into_iter().collect());
            class.latencies.push(latency("tpot", a, b));
            let (a, b) = side(&|r| itl_gaps_ms(r).collect());
            class.latencies.push(latency("itl", a, b));
        }
        let (a, b) = side(&|r| r.e2el_us.map(|e| e as f64 / 1000.0).into_iter().collect());
        class.latencies.push(latency("e2el", a, b));
    }
    out.into_values().collect()
}

/// (sentences, load reproduced, schedule reproduced, latencies reproduced).
fn verdict(
    s: &Schedule,
    classes: &[ClassFidelity],
    outcomes: &BTreeMap<String, (usize, usize)>,
    changes: &OutcomeChanges,
    matched: usize,
    captured: usize,
) -> (Vec<String>, bool, bool, bool) {
    let mut findings = Vec::new();
    let mut load_ok = matched == captured;
    if matched < captured {
        findings.push(format!(
            "The load differs: {} of {captured} captured requests were not replayed (a window, \
             a sample or --max-requests selects fewer; or the run stopped early).",
            captured - matched
        ));
    }
    for c in classes {
        let name = class_name(c);
        if c.requests.0 != c.requests.1 {
            load_ok = false;
            findings.push(format!(
                "The load differs: {name} has {} captured and {} replayed requests.",
                c.requests.0, c.requests.1
            ));
        }
        if c.prompt_tokens.0 != c.prompt_tokens.1 {
            load_ok = false;
            findings.push(format!(
                "The load differs: {name} prompt tokens {} captured, {} replayed ({}): the \
                 replayed prompts are not the captured ones (synthesized text counts \
                 differently; record bodies, or give the tokenizer the capture used).",
                c.prompt_tokens.0,
                c.prompt_tokens.1,
                signed_pct(c.prompt_tokens.1 as f64, c.prompt_tokens.0 as f64)
            ));
        }
        if c.output_tokens.0 != c.output_tokens.1 {
            load_ok = false;
            findings.push(format!(
                "The load differs: {name} output tokens {} captured, {} replayed ({}) over the \
                 {} requests that succeeded on both sides: the server generated different \
                 lengths (sampling, or max_tokens not replayed).",
                c.output_tokens.0,
                c.output_tokens.1,
                signed_pct(c.output_tokens.1 as f64, c.output_tokens.0 as f64),
                c.both_ok
            ));
        }
    }
    let diff: Vec<String> = outcomes
        .iter()
        .filter(|(_, (a, b))| a != b)
        .map(|(o, (a, b))| format!("{o} {a} → {b}"))
        .collect();
    if !diff.is_empty() {
        findings.push(format!(
            "The outcomes differ (captured → replayed): {}.",
            diff.join(", ")
        ));
    }
    if changes.by_client() {
        // What the server was asked to do differs: a request cut short, or not.
        load_ok = false;
        findings.push(format!(
            "The client differs: {} request(s) cancelled in the capture were not cancelled in \
             the replay, {} cancelled in the replay only (the replay cancels at the recorded \
             point: after as many chunks, or as long, as the captured client waited).",
            changes.not_cancelled, changes.cancelled
        ));
    }
    if changes.by_server() {
        findings.push(format!(
            "The server answered differently: {} requests that succeeded in the capture failed \
             in the replay, {} that failed succeeded, {} failed otherwise; the replay sent them \
             as captured, so this is the server's doing (its errors, limits or health), not the \
             traffic's.",
            changes.now_failed, changes.now_ok, changes.other_failure
        ));
    }
    let schedule_ok = s.abs_error_p99_ms <= s.bound_ms && s.sessions_in_order == s.sessions;
    if s.abs_error_p99_ms > s.bound_ms {
        findings.push(format!(
            "The schedule drifts: sends were off their captured instants by {:.1} ms at p99 \
             (bound {:.1} ms; median {:+.1} ms): the client did not send when the capture \
             says (see the replay's client verdict and dispatch lag).",
            s.abs_error_p99_ms, s.bound_ms, s.error_median_ms
        ));
    }
    if s.sessions_in_order < s.sessions {
        findings.push(format!(
            "The schedule drifts: {} of {} sessions had their turns sent out of captured order.",
            s.sessions - s.sessions_in_order,
            s.sessions
        ));
    }
    let mut lat_ok = true;
    let mut prefill_drift = Vec::new();
    let mut decode_drift = Vec::new();
    let mut stalls = Vec::new();
    for c in classes {
        for l in &c.latencies {
            if l.reproduced {
                continue;
            }
            lat_ok = false;
            let p50 = l.quantiles.first().map_or(f64::NAN, |q| q.3);
            // The median and the distribution hold, and a tail quantile is far out (beyond
            // the tolerance squared: a jump, not a nudge): a few requests waited, the rest did
            // not move.
            let far = |r: f64| {
                !r.is_nan() && (r > RATIO_TOL * RATIO_TOL || r * RATIO_TOL * RATIO_TOL < 1.0)
            };
            if within_tol(p50) && !shape_drifts(l.ks, &l.captured_ms, &l.replayed_ms) {
                if let Some(&(q, _, _, r)) = l.quantiles.iter().rev().find(|q| far(q.3)) {
                    stalls.push(format!(
                        "{} {} ×{r:.2} at p{q:.0} (×{p50:.2} at p50, KS {:.2})",
                        class_name(c),
                        l.metric.to_uppercase(),
                        l.ks
                    ));
                    continue;
                }
            }
            let text = format!(
                "{} {} ×{:.2} at p50 (KS {:.2})",
                class_name(c),
                l.metric.to_uppercase(),
                p50,
                l.ks
            );
            if l.metric == "ttft" {
                prefill_drift.push(text);
            } else {
                decode_drift.push(text);
            }
        }
    }
    if !stalls.is_empty() {
        findings.push(format!(
            "The server stalled: {}: the median holds and only the tail drifts — a few requests \
             waited (a stall, a queueing burst, a pause of the server), not a shift of the \
             whole distribution.",
            stalls.join(", ")
        ));
    }
    let stream_held = classes.iter().any(|c| {
        c.latencies
            .iter()
            .any(|l| (l.metric == "itl" || l.metric == "tpot") && l.reproduced)
    });
    if !prefill_drift.is_empty() && decode_drift.iter().all(|d| d.contains("E2EL")) && stream_held {
        findings.push(format!(
            "The server's state drifts: {} while decoding (ITL/TPOT) holds — prefill work \
             differs, e.g. a prefix cache warm in production and cold in the replay (a salted \
             replay shares prefixes only within the run), or a different batch mix.",
            prefill_drift.join(", ")
        ));
    } else if !prefill_drift.is_empty() || !decode_drift.is_empty() {
        let all: Vec<String> = prefill_drift.into_iter().chain(decode_drift).collect();
        let cause = if load_ok && schedule_ok {
            "with the same requests sent at the same times, the server itself differs (its \
             load from other clients, its configuration, or its state)"
        } else {
            "read it with the load and schedule findings above: the replay did not send the \
             same traffic"
        };
        findings.push(format!("The latencies drift: {}: {cause}.", all.join(", ")));
    }
    let head = if load_ok && schedule_ok && lat_ok && !changes.by_server() {
        "The replay reproduces the capture: same requests, tokens and outcomes, sent within the \
         schedule bound, with latencies within tolerance."
            .to_string()
    } else if load_ok && schedule_ok && changes.by_server() {
        "The replay reproduces the captured traffic (requests, tokens, cancellations and \
         schedule), but the server answered it differently."
            .to_string()
    } else if load_ok && schedule_ok {
        "The replay reproduces the captured traffic (requests, tokens, outcomes and schedule), \
         but not its latencies."
            .to_string()
    } else {
        "The replay does not reproduce the captured traffic.".to_string()
    };
    let mut v = vec![head];
    v.extend(findings);
    (v, load_ok, schedule_ok, lat_ok)
}

fn class_name(c: &ClassFidelity) -> String {
    format!(
        "{} ({})",
        c.endpoint,
        if c.stream { "streamed" } else { "not streamed" }
    )
}

fn signed_pct(new: f64, old: f64) -> String {
    if old == 0.0 {
        return "n/a".into();
    }
    format!("{:+.1}%", (new / old - 1.0) * 100.0)
}

impl Fidelity {
    /// A self-contained HTML page: the console text, and per class and metric the captured
    /// and replayed distributions overlaid (CDFs: captured solid, replayed dashed).
    pub fn render_html(&self, title: &str) -> String {
        use crate::svg::{cdf, esc, Chart, Line, PALETTE};
        let mut body = String::new();
        for (i, c) in self.classes.iter().enumerate() {
            for l in &c.latencies {
                if l.captured_ms.is_empty() && l.replayed_ms.is_empty() {
                    continue;
                }
                let color = PALETTE[i % PALETTE.len()].to_string();
                let line = |name: &str, v: &[f64], dashed: bool| Line {
                    name: format!("{name} ({} values)", v.len()),
                    points: cdf(v, 400),
                    color: color.clone(),
                    dashed,
                    markers: false,
                };
                let all = l
                    .captured_ms
                    .iter()
                    .chain(&l.replayed_ms)
                    .filter(|v| **v > 0.0);
                let (lo, hi) = all.fold((f64::INFINITY, 0f64), |(a, b), v| (a.min(*v), b.max(*v)));
                let chart = Chart {
                    title: format!(
                        "{} — {}: KS {:.2}{}",
                        class_name(c),
                        l.metric.to_uppercase(),
                        l.ks,
                        if l.reproduced { "" } else { " (drifts)" }
                    ),
                    x_label: format!("{} (ms)", l.metric.to_uppercase()),
                    y_label: "fraction of requests ≤ x".into(),
                    lines: vec![
                        line("captured", &l.captured_ms, false),
                        line("replayed", &l.replayed_ms, true),
                    ],
                    log_x: hi / lo.max(1e-9) > 30.0,
                    y_from_zero: true,
                    ..Default::default()
                };
                body.push_str(&format!("<div class=\"chart\">{}</div>", chart.render()));
            }
        }
        format!(
            "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
             <style>{css}</style></head><body><h1>{t}</h1><pre style=\"white-space:pre-wrap\">{text}</pre><div class=\"plots\">{body}</div></body></html>\n",
            t = esc(title),
            css = crate::html::CSS,
            text = esc(&self.to_string()),
        )
    }
}

impl fmt::Display for Fidelity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:=^78}", " A/A fidelity ")?;
        writeln!(
            f,
            "Requests: {} captured, {} replayed, {} in both ({} only captured, {} only replayed)",
            self.captured, self.replayed, self.matched, self.only_captured, self.only_replayed
        )?;
        let s = &self.schedule;
        writeln!(
            f,
            "Schedule: send − captured arrival over {} requests: |error| p50 {:.2} ms, p99 {:.2} \
             ms, max {:.2} ms (bound {:.1} ms at p99); median {:+.2} ms",
            s.requests,
            s.abs_error_p50_ms,
            s.abs_error_p99_ms,
            s.abs_error_max_ms,
            s.bound_ms,
            s.error_median_ms
        )?;
        if s.sessions > 0 {
            writeln!(
                f,
                "Sessions: {} of {} multi-turn sessions sent in captured turn order",
                s.sessions_in_order, s.sessions
            )?;
        }
        let outs: Vec<String> = self
            .outcomes
            .iter()
            .filter(|(_, (a, b))| *a + *b > 0)
            .map(|(o, (a, b))| format!("{o} {a}/{b}"))
            .collect();
        writeln!(f, "Outcomes (captured/replayed): {}", outs.join(", "))?;
        if !self.outcome_changes.is_empty() {
            let ch: Vec<String> = self
                .outcome_changes
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            writeln!(f, "Outcome changes per request: {}", ch.join(", "))?;
        }
        writeln!(f, "{:-^78}", " load and latencies by class ")?;
        for c in &self.classes {
            writeln!(
                f,
                "{}: requests {}/{}, prompt tokens {}/{}, output tokens {}/{} ({} ok on both sides)",
                class_name(c),
                c.requests.0,
                c.requests.1,
                c.prompt_tokens.0,
                c.prompt_tokens.1,
                c.output_tokens.0,
                c.output_tokens.1,
                c.both_ok
            )?;
            for l in &c.latencies {
                let q: Vec<String> = l
                    .quantiles
                    .iter()
                    .map(|(p, a, b, r)| format!("p{p:.0} {a:.1}→{b:.1} ms (×{r:.2})"))
                    .collect();
                writeln!(
                    f,
                    "  {:<5} {}  KS {:.2}{}",
                    l.metric.to_uppercase(),
                    if q.is_empty() {
                        "no samples on one side".to_string()
                    } else {
                        q.join(", ")
                    },
                    l.ks,
                    if l.reproduced { "" } else { "  [drifts]" }
                )?;
            }
        }
        writeln!(f, "{:-^78}", " verdict ")?;
        for v in &self.verdict {
            writeln!(f, "{v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_700_000_000_000_000;

    fn cap(id: &str, at_ms: i64, ttft_ms: i64, itl_ms: i64, out: i64) -> TraceRecord {
        let mut r = TraceRecord::new(id, T0 + at_ms * 1000, "/v1/chat/completions");
        r.stream = true;
        r.prompt_tokens = Some(100);
        r.output_tokens = Some(out);
        r.ttft_us = Some(ttft_ms * 1000);
        r.chunk_times_us = (0..out).map(|i| (ttft_ms + i * itl_ms) * 1000).collect();
        r.e2el_us = Some((ttft_ms + (out - 1) * itl_ms) * 1000);
        r
    }

    fn rep(c: &TraceRecord, late_ms: i64, ttft_scale: i64) -> TraceRecord {
        let mut r = c.clone();
        let off = c.arrival_time_us - T0;
        r.arrival_time_us = T0 + 7_000_000 + off + late_ms * 1000;
        r.scheduled_offset_us = Some(off);
        r.dispatch_lag_us = Some(late_ms * 1000);
        r.queue_us = Some(0);
        let shift = c.ttft_us.map_or(0, |t| t * (ttft_scale - 1));
        r.ttft_us = c.ttft_us.map(|t| t + shift);
        r.chunk_times_us = c.chunk_times_us.iter().map(|t| t + shift).collect();
        r.e2el_us = c.e2el_us.map(|e| e + shift);
        r
    }

    fn trace() -> Vec<TraceRecord> {
        (0..40)
            .map(|i| cap(&format!("r{i}"), i * 100, 50 + i % 7, 10, 20))
            .collect()
    }

    #[test]
    fn an_exact_replay_reproduces_everything() {
        let c = trace();
        let r: Vec<_> = c.iter().map(|x| rep(x, 0, 1)).collect();
        let f = assess(&c, &r, Options::default());
        assert_eq!((f.matched, f.only_captured, f.only_replayed), (40, 0, 0));
        assert!(f.load_reproduced && f.schedule_reproduced && f.latencies_reproduced);
        assert_eq!(f.schedule.abs_error_max_ms, 0.0);
        assert!(
            f.verdict[0].starts_with("The replay reproduces the capture"),
            "{f}"
        );
        assert_eq!(f.verdict.len(), 1);
        let ttft = &f.classes[0].latencies[0];
        assert_eq!((ttft.metric, ttft.ks), ("ttft", 0.0));
        assert!(ttft.quantiles.iter().all(|q| (q.3 - 1.0).abs() < 1e-12));
        let html = f.render_html("A/A <test>");
        assert!(html.contains("<title>A/A &lt;test&gt;</title>"));
        assert_eq!(html.matches("<svg").count(), 4, "TTFT, TPOT, ITL, E2EL");
        assert!(html.contains("captured (40 values)") && html.contains("replayed (40 values)"));
    }

    #[test]
    fn late_sends_are_a_schedule_drift_and_slow_prefill_is_the_servers_state() {
        let c = trace();
        // Every 4th request 30 ms late; TTFT tripled, ITL unchanged.
        let r: Vec<_> = c
            .iter()
            .enumerate()
            .map(|(i, x)| rep(x, if i % 4 == 3 { 30 } else { 0 }, 3))
            .collect();
        let f = assess(&c, &r, Options::default());
        assert!(f.load_reproduced);
        assert!(!f.schedule_reproduced);
        assert!((f.schedule.abs_error_p99_ms - 30.0).abs() < 1e-9);
        assert_eq!(f.schedule.bound_ms, 10.0); // 10% of the 100 ms gap
        assert!(!f.latencies_reproduced);
        let text = f.verdict.join("\n");
        assert!(text.contains("The schedule drifts"), "{text}");
        assert!(text.contains("The server's state drifts"), "{text}");
        assert!(text.contains("TTFT ×3.00"), "{text}");
    }

    #[test]
    fn token_and_outcome_differences_are_load_drift() {
        let c = trace();
        let mut r: Vec<_> = c.iter().map(|x| rep(x, 0, 1)).collect();
        r[0].output_tokens = Some(25);
        r[1].outcome = Outcome::HttpError;
        r.pop();
        let f = assess(&c, &r, Options::default());
        assert!(!f.load_reproduced);
        assert_eq!(f.only_captured, 1);
        assert_eq!(f.outcomes["ok"], (40, 38));
        assert_eq!(f.outcomes["http_error"], (0, 1));
        let text = f.verdict.join("\n");
        assert!(
            text.contains("1 of 40 captured requests were not replayed"),
            "{text}"
        );
        assert!(text.contains("output tokens"), "{text}");
        assert!(text.contains("http_error 0 → 1"), "{text}");
    }

    #[test]
    fn speedup_scales_the_captured_offsets_and_session_order_is_checked() {
        let mut c = trace();
        for (i, x) in c.iter_mut().enumerate() {
            x.session_id = Some(format!("s{}", i % 5));
        }
        let mut r: Vec<_> = c
            .iter()
            .map(|x| {
                let mut y = rep(x, 0, 1);
                y.scheduled_offset_us = y.scheduled_offset_us.map(|o| o / 2);
                y
            })
            .collect();
        let f = assess(&c, &r, Options { speedup: 2.0 });
        assert_eq!(f.schedule.abs_error_max_ms, 0.0);
        assert_eq!((f.schedule.sessions, f.schedule.sessions_in_order), (5, 5));
        // Swap two turns of session s0 (r0 and r5).
        let (a, b) = (r[0].scheduled_offset_us, r[5].scheduled_offset_us);
        r[0].scheduled_offset_us = b;
        r[5].scheduled_offset_us = a;
        let f = assess(&c, &r, Options { speedup: 2.0 });
        assert_eq!(f.schedule.sessions_in_order, 4);
        assert!(!f.schedule_reproduced);
    }

    fn fail(r: &mut TraceRecord, outcome: Outcome, status: Option<u16>) {
        r.outcome = outcome;
        r.status = status;
        r.error = Some(format!("{outcome}"));
        r.ttft_us = None;
        r.chunk_times_us.clear();
        r.e2el_us = Some(3_000);
    }

    /// Captured and replayed both hold cancelled and failed rows; the replayed server fails
    /// four requests production served and stalls three more for two seconds. The verdict
    /// must say the server did it — outcomes side by side, the per-request changes, the tail
    /// that stalled — and not blame the traffic, which the replay reproduced.
    #[test]
    fn a_misbehaving_server_is_blamed_for_its_errors_and_stalls_not_the_replay() {
        let mut c = trace();
        for i in [5, 6] {
            c[i].outcome = Outcome::ClientCancelled;
            c[i].chunk_times_us.truncate(3);
            c[i].e2el_us = c[i].chunk_times_us.last().copied();
        }
        fail(&mut c[7], Outcome::HttpError, Some(429));
        let mut r: Vec<_> = c.iter().map(|x| rep(x, 0, 1)).collect();
        for i in [10, 11, 12] {
            fail(&mut r[i], Outcome::HttpError, Some(500));
        }
        fail(&mut r[13], Outcome::UpstreamError, None);
        for i in [20, 21, 22] {
            let x = &mut r[i];
            x.ttft_us = x.ttft_us.map(|t| t + 2_000_000);
            x.chunk_times_us.iter_mut().for_each(|t| *t += 2_000_000);
            x.e2el_us = x.e2el_us.map(|t| t + 2_000_000);
        }
        let f = assess(&c, &r, Options::default());
        eprintln!("{f}");
        let text = f.verdict.join("\n");
        // Side by side, and per request.
        assert_eq!(f.outcomes["ok"], (37, 33), "{f}");
        assert_eq!(f.outcomes["client_cancelled"], (2, 2));
        assert_eq!(f.outcomes["http_error"], (1, 4));
        assert_eq!(f.outcomes["upstream_error"], (0, 1));
        assert_eq!(
            f.outcome_changes,
            BTreeMap::from([
                ("ok → http_error".to_string(), 3),
                ("ok → upstream_error".to_string(), 1)
            ])
        );
        assert!(f.to_string().contains("ok → http_error 3"), "{f}");
        // The traffic was the capture's: same requests, tokens, cancellations and times.
        assert!(f.load_reproduced && f.schedule_reproduced, "{text}");
        assert!(!f.latencies_reproduced);
        assert!(
            text.contains("The server answered differently")
                && text.contains("4 requests that succeeded in the capture failed"),
            "{text}"
        );
        assert!(text.contains("The server stalled"), "{text}");
        assert!(text.contains("TTFT ×"), "{text}");
        assert!(text.contains("at p99"), "{text}");
        assert!(!text.contains("did not send the same traffic"), "{text}");
        assert!(
            !text.contains("prefix cache"),
            "a stall is not a cold cache: {text}"
        );
        assert!(!text.contains("The client"), "{text}");

        // A replay that did not cancel what the capture's client cancelled: the client's
        // doing, and the load (what the server was asked to do) differs.
        let mut r: Vec<_> = c.iter().map(|x| rep(x, 0, 1)).collect();
        r[5] = rep(&cap("r5", 500, 55, 10, 20), 0, 1);
        let f = assess(&c, &r, Options::default());
        let text = f.verdict.join("\n");
        assert_eq!(
            f.outcome_changes,
            BTreeMap::from([("client_cancelled → ok".to_string(), 1)])
        );
        assert!(!f.load_reproduced, "{text}");
        assert!(
            text.contains("The client differs: 1 request(s) cancelled in the capture were not"),
            "{text}"
        );
        assert!(!text.contains("The server answered differently"), "{text}");
    }

    /// A server whose TPOT holds within a millisecond, replayed 1% slower with 40 requests a
    /// side: KS 0.3 from the shift alone, but every decile within 1%: reproduced (the verdict
    /// read "TPOT ×1.01 at p50 … drifts" before). Ten requests a side: KS 0.5 is chance.
    /// A third of the requests 20% slower over 200 a side is a drift of shape, though p50, p90
    /// and p99 each stay within the ratio tolerance.
    #[test]
    fn ks_marks_a_drift_only_beyond_chance_and_with_a_decile_moved() {
        let tight: Vec<f64> = (0..40).map(|i| 21.0 + f64::from(i % 8) * 0.1).collect();
        let shifted: Vec<f64> = tight.iter().map(|v| v * 1.01).collect();
        let l = latency("tpot", tight.clone(), shifted);
        assert!(l.ks > KS_TOL, "{}", l.ks);
        assert!(l.reproduced, "KS {} over every decile within 1%", l.ks);
        let few: Vec<f64> = (0..10).map(f64::from).collect();
        let later: Vec<f64> = (5..15).map(f64::from).collect();
        let l = latency(
            "e2el",
            few.iter().map(|v| v + 100.0).collect(),
            later.iter().map(|v| v + 100.0).collect(),
        );
        assert!((l.ks - 0.5).abs() < 1e-9 && l.reproduced, "{}", l.ks);
        let cap: Vec<f64> = (0..200).map(|i| 100.0 + f64::from(i) / 20.0).collect();
        let rep: Vec<f64> = cap
            .iter()
            .enumerate()
            .map(|(i, v)| if (40..110).contains(&i) { v * 1.2 } else { *v })
            .collect();
        let l = latency("ttft", cap, rep);
        assert!(
            l.quantiles.iter().all(|q| within_tol(q.3)),
            "{:?}",
            l.quantiles
        );
        assert!(
            !l.reproduced,
            "KS {}: a third of the requests 20% slower",
            l.ks
        );
    }

    #[test]
    fn ks_distance_of_known_samples() {
        assert_eq!(ks_distance(&mut [1.0, 2.0], &mut [1.0, 2.0]), 0.0);
        assert_eq!(ks_distance(&mut [1.0, 2.0], &mut [3.0, 4.0]), 1.0);
        // CDFs at 2: a 2/4, b 0/2 → 0.5; at 3: a 3/4, b 1/2 → 0.25.
        assert_eq!(ks_distance(&mut [1.0, 2.0, 3.0, 4.0], &mut [3.0, 5.0]), 0.5);
        assert_eq!(ks_distance(&mut [], &mut [1.0]), 0.0);
    }
}
