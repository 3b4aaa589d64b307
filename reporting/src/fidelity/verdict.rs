//! The verdict: which part drifts, in plain sentences, each put on the side that did it.

use std::collections::{BTreeMap, HashSet};

use trace_format::TraceRecord;

use super::{
    class_name, shape_drifts, signed_pct, within_tol, ClassFidelity, OutcomeChanges, ReplayRun,
    Schedule, Status, RATIO_TOL,
};

/// What the verdict is drawn from.
pub(super) struct Facts<'a> {
    pub schedule: &'a Schedule,
    pub classes: &'a [ClassFidelity],
    pub outcomes: &'a BTreeMap<String, (usize, usize)>,
    /// Outcome changes of the pairs the replay sent as captured.
    pub changes: &'a OutcomeChanges,
    /// Requests the replay changed (see `replay_changed`).
    pub replay_changed: &'a [String],
    pub matched: usize,
    pub captured: &'a [TraceRecord],
    pub replayed_ids: &'a HashSet<&'a str>,
    pub replay_run: Option<&'a ReplayRun>,
    /// Whether a noise run was given.
    pub noise: bool,
}

/// Why captured requests have no replayed row: what the replay's result document says
/// (rows it could not build, with its own reasons; rows its selection left out), never a
/// guess presented as the reason.
fn not_replayed(f: &Facts<'_>) -> Option<String> {
    let captured = f.captured.len();
    let missing: Vec<&str> = f
        .captured
        .iter()
        .map(|r| r.request_id.as_str())
        .filter(|id| !f.replayed_ids.contains(id))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let n = missing.len();
    let Some(run) = f.replay_run else {
        return Some(format!(
            "The load differs: {n} of {captured} captured requests were not replayed (e.g. \
             {}); the replay printed why, and its result document (replay --save-result, given \
             here with --replay-result) says it: rows it could not build, a window, a sample or \
             --max-requests, or a run that stopped early.",
            missing[0]
        ));
    };
    let mut why = Vec::new();
    let known: Vec<String> = run
        .skipped
        .iter()
        .filter(|(id, _)| missing.contains(&id.as_str()))
        .map(|(id, w)| format!("{id}: {w}"))
        .collect();
    let skipped = (run.skipped_rows as usize).min(n);
    if skipped > 0 {
        why.push(format!(
            "{skipped} the replay could not build and skipped{}",
            if known.is_empty() {
                String::new()
            } else {
                format!(" ({})", known.join("; "))
            }
        ));
    }
    let unselected = (run.rows.saturating_sub(run.selected_rows) as usize).min(n - skipped);
    if unselected > 0 {
        why.push(format!(
            "{unselected} not selected (a window, a sample or --max-requests)"
        ));
    }
    let rest = n - skipped - unselected;
    if rest > 0 {
        why.push(format!(
            "{rest} selected and built but without a result row (the run stopped early)"
        ));
    }
    Some(format!(
        "The load differs: {n} of {captured} captured requests were not replayed: {}.",
        why.join("; ")
    ))
}

/// (sentences, load reproduced, schedule reproduced, latencies reproduced).
pub(super) fn verdict(f: &Facts<'_>) -> (Vec<String>, bool, bool, bool) {
    let (s, classes, outcomes, changes) = (f.schedule, f.classes, f.outcomes, f.changes);
    let mut findings = Vec::new();
    let mut load_ok = f.matched == f.captured.len();
    findings.extend(not_replayed(f));
    if !f.replay_changed.is_empty() {
        load_ok = false;
        findings.push(format!(
            "The replay changed {} request(s) ({}): captured without a body and refused by \
             the server as a client error (4xx), they were replayed with a synthesized prompt \
             of the recorded length, a valid request; their different outcome is the \
             replay's doing, not the server's (record bodies with --record-bodies full to \
             replay them as sent).",
            f.replay_changed.len(),
            f.replay_changed
                .iter()
                .take(3)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
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
             as captured (recorded bodies, or prompts of the recorded lengths), so this is the \
             server's doing (its errors, limits or health), not the traffic's.",
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
    let (lat_ok, lat_findings) = latency_findings(classes, load_ok && schedule_ok, f.noise);
    findings.extend(lat_findings);
    let noise_said = classes
        .iter()
        .flat_map(|c| &c.latencies)
        .any(|l| l.status == Status::WithinNoise);
    let too_few = classes
        .iter()
        .flat_map(|c| &c.latencies)
        .any(|l| l.status == Status::TooFew);
    let head = if load_ok && schedule_ok && lat_ok && !changes.by_server() {
        format!(
            "The replay reproduces the capture: same requests, tokens and outcomes, sent within \
             the schedule bound, with latencies {}.",
            if noise_said {
                "within the engine's own noise (measured by the noise run)"
            } else if too_few {
                "within tolerance, or too few requests to tell (below)"
            } else {
                "within tolerance"
            }
        )
    } else if load_ok && schedule_ok && changes.by_server() {
        "The replay reproduces the captured traffic (requests, tokens, cancellations and \
         schedule), but the server answered it differently."
            .to_string()
    } else if load_ok && schedule_ok {
        "The replay reproduces the captured traffic (requests, tokens, outcomes and schedule), \
         but not its latencies: the server differs."
            .to_string()
    } else {
        "The replay does not reproduce the captured traffic.".to_string()
    };
    let mut v = vec![head];
    v.extend(findings);
    (v, load_ok, schedule_ok, lat_ok)
}

/// A noise bound past this ratio says the noise run was not a second run of the same server.
const NOISE_SUSPECT: f64 = 3.0;

/// "slower", "faster" or "slower and faster" for the p50 ratios of a list.
fn direction(ratios: &[f64]) -> &'static str {
    let slower = ratios.iter().any(|r| *r > 1.0);
    let faster = ratios.iter().any(|r| *r < 1.0);
    match (slower, faster) {
        (true, false) => "slower",
        (false, true) => "faster",
        _ => "slower for some and faster for others",
    }
}

/// How one metric moved, for the verdict: `… ×1.30 at p50 (paired ×1.28 [1.20, 1.37], KS …)`.
fn moved(c: &ClassFidelity, l: &super::LatencyFidelity) -> String {
    let p50 = l.quantiles.first().map_or(f64::NAN, |q| q.3);
    let paired = l.paired.map_or(String::new(), |p| {
        format!(
            "paired ×{:.2} [{:.2}, {:.2}] over {}, ",
            p.ratio, p.ci.0, p.ci.1, p.n
        )
    });
    let noise = l.noise.as_ref().map_or(String::new(), |n| {
        format!(
            "; two replays ×{:.2} apart at p50, bound ×{:.2}",
            n.quantiles.first().map_or(f64::NAN, |q| q.1),
            n.bound
        )
    });
    format!(
        "{} {} ×{p50:.2} at p50 ({paired}KS {:.2}{noise})",
        class_name(c),
        l.metric.to_uppercase(),
        l.ks
    )
}

/// A finding when the noise run is too far from the replay to be the engine's own spread.
fn noise_suspect(classes: &[ClassFidelity]) -> Option<String> {
    let widest = classes
        .iter()
        .flat_map(|c| &c.latencies)
        .filter_map(|l| l.noise.as_ref().map(|n| n.bound))
        .fold(0f64, f64::max);
    (widest > NOISE_SUSPECT).then(|| {
        format!(
            "The noise run is far from the replay (a bound of ×{widest:.2}): two warm runs \
             against one server are not that far apart; check that it replayed the same \
             capture against the same server — against another one, every difference reads \
             as noise."
        )
    })
}

/// (latencies reproduced, findings): what is within the engine's noise, the stalls, and the
/// drifts, with an explanation that follows their direction.
fn latency_findings(
    classes: &[ClassFidelity],
    traffic_ok: bool,
    noise: bool,
) -> (bool, Vec<String>) {
    let mut findings = Vec::new();
    let mut lat_ok = true;
    let mut within_noise = Vec::new();
    let mut too_few = Vec::new();
    let (mut prefill, mut decode, mut stalls) = (Vec::new(), Vec::new(), Vec::new());
    let (mut prefill_r, mut all_r) = (Vec::new(), Vec::new());
    for c in classes {
        for l in &c.latencies {
            match l.status {
                Status::Reproduced => continue,
                Status::TooFew => {
                    // Past the tolerance, but no further than sampling gives at these sizes.
                    if let Some(&(q, _, _, r)) = l.quantiles.iter().find(|q| !within_tol(q.3)) {
                        too_few.push(format!(
                            "{} {} ×{r:.2} at p{q:.0} ({} requests a side)",
                            class_name(c),
                            l.metric.to_uppercase(),
                            l.samples.0.min(l.samples.1)
                        ));
                    }
                    continue;
                }
                Status::WithinNoise => {
                    within_noise.push(moved(c, l));
                    continue;
                }
                Status::Drifts => lat_ok = false,
            }
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
            let r = l.paired.map_or(p50, |p| p.ratio);
            all_r.push(r);
            if l.metric == "ttft" {
                prefill.push(moved(c, l));
                prefill_r.push(r);
            } else {
                decode.push((l.metric, moved(c, l)));
            }
        }
    }
    findings.extend(noise_suspect(classes));
    if !too_few.is_empty() {
        findings.push(format!(
            "Too few requests to tell: {}: past the tolerance, but no further than sampling \
             alone gives with so few (the quantiles' 95% intervals reach within it, and no \
             paired interval excludes it); replay more requests to judge these.",
            too_few.join(", ")
        ));
    }
    if !within_noise.is_empty() {
        findings.push(format!(
            "Within the engine's own noise: {}: two replays of the same requests against the \
             same server moved as far apart, so the server's run-to-run spread explains it, not \
             the replay.",
            within_noise.join(", ")
        ));
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
    let beyond = if noise {
        ", beyond the engine's own noise"
    } else {
        " (no noise run measured the engine's own spread: give one with --noise)"
    };
    if !prefill.is_empty() && decode.iter().all(|d| d.0 == "e2el") && stream_held {
        let why = match direction(&prefill_r) {
            "slower" => {
                "prefill took longer or started later, e.g. a prefix cache warm in production \
                 and cold in the replay (a salted replay shares prefixes only within the run), \
                 requests queued before prefill (fewer slots, a busier server), or a heavier \
                 batch mix"
            }
            "faster" => {
                "prefill work shrank, e.g. a prefix cache warm in the replay (earlier runs or \
                 prefixes shared within it) and cold in production, or a lighter batch mix than \
                 production's"
            }
            _ => "prefill work differs per class: a different batch mix or cache state",
        };
        let e2el: Vec<String> = decode.into_iter().map(|d| d.1).collect();
        let with = if e2el.is_empty() {
            String::new()
        } else {
            format!(" (and with it {})", e2el.join(", "))
        };
        findings.push(format!(
            "The server's state drifts: prefill is {} in the replay{beyond}: {}{with} while \
             decoding (ITL/TPOT) holds — {why}.",
            direction(&prefill_r),
            prefill.join(", ")
        ));
    } else if !prefill.is_empty() || !decode.is_empty() {
        let all: Vec<String> = prefill
            .into_iter()
            .chain(decode.into_iter().map(|d| d.1))
            .collect();
        let cause = if traffic_ok {
            "with the same requests sent at the same times, the server itself differs (its \
             load from other clients, its configuration, or its state)"
        } else {
            "read it with the load and schedule findings above: the replay did not send the \
             same traffic"
        };
        findings.push(format!(
            "The latencies drift, {} in the replay{beyond}: {}: {cause}.",
            direction(&all_r),
            all.join(", ")
        ));
    }
    (lat_ok, findings)
}
