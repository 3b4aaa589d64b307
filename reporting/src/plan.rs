//! The capacity plan: replicas and cost to carry a target load within the SLO, from a
//! capacity answer ([`CapacityAnswer::capacity_rps`]). Its own module, used by `sweep`, `results` and the reports.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{json, Value};

use crate::capacity::CapacityAnswer;

/// Hours in a month for the cost estimate (365 × 24 / 12).
pub const HOURS_PER_MONTH: f64 = 730.0;

/// Where the target load of a capacity plan comes from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadSource {
    /// `--target-qps`.
    TargetQps,
    /// The captured trace's peak 1-second arrival rate.
    TracePeak,
}

/// Replicas and cost to serve a target load within the SLO.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapacityPlan {
    /// Which configuration.
    pub name: String,
    /// Requests/s one replica serves within the SLO: [`CapacityAnswer::capacity_rps`].
    pub per_replica_rps: f64,
    /// The load to serve, req/s.
    pub target_qps: f64,
    /// Where it came from.
    pub target_source: LoadSource,
    /// Replicas that carry the load: ceil(target / per replica).
    pub replicas_for_load: u64,
    /// Independent failure domains, each able to carry the whole load (`--redundancy`).
    pub redundancy: u32,
    /// replicas_for_load × redundancy.
    pub replicas: u64,
    /// Fraction of the fleet's SLO capacity the target uses.
    pub utilization: f64,
    /// `--cost-per-hour` of one replica.
    pub cost_per_hour: Option<f64>,
    /// replicas × cost_per_hour × 730.
    pub monthly_cost: Option<f64>,
    /// Whether the per-replica capacity is only a lower bound: no tested level broke the
    /// SLO, so a replica may carry more and `replicas` is at most what is needed ("at most
    /// N replicas"), not the answer.
    pub upper_bound: bool,
    /// With [`CapacityPlan::upper_bound`]: the sweep that would find a level that breaks the
    /// SLO and make the plan exact (`--sweep speedup=1,2,4,8`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact_with: Option<String>,
    /// The plan in one sentence.
    pub sentence: String,
    /// The plan over the trace's own demand curve, window by window ([`demand_plan`]), when
    /// the plan has the trace's arrivals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demand: Option<DemandPlan>,
}

/// How the plan over the demand curve is made, printed with it.
pub const DEMAND_RULE: &str = "Per window: replicas = ceil(the window's peak 1-second arrival rate of production's rows / a replica's capacity at the SLO), at least 1, x redundancy; replica-hours = Σ replicas x window hours, scaled to 24 h; cost per million output tokens = the span's cost / its output tokens.";

/// One window of a [`DemandPlan`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DemandWindow {
    /// Its start, s from the trace's first arrival.
    pub start_s: f64,
    /// Its peak 1-second arrival rate, req/s (production's rows).
    pub peak_rps: f64,
    /// Replicas it needs: ceil(peak / per replica), at least 1, × redundancy.
    pub replicas: u64,
}

/// Replicas across the trace's own day: per window, what its peak 1-second arrival rate
/// needs at the SLO (the sizing rule of [`plan`], window by window), so a fleet that follows
/// the demand can be costed against one sized for the day's peak.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DemandPlan {
    /// Window width, s (`--plan-window`).
    pub window_s: f64,
    /// Every window, in order (the last may be shorter: it ends with the trace).
    pub windows: Vec<DemandWindow>,
    /// The most replicas any window needs.
    pub peak_replicas: u64,
    /// Replicas needed, mean over the trace's span (windows weighted by their length).
    pub mean_replicas: f64,
    /// Σ replicas × window hours over the trace's span.
    pub replica_hours: f64,
    /// Span of the trace, hours.
    pub span_hours: f64,
    /// Replica-hours per 24 hours of this demand (`replica_hours` × 24 / `span_hours`).
    pub replica_hours_per_day: f64,
    /// `replica_hours_per_day` × `--cost-per-hour`.
    pub cost_per_day: Option<f64>,
    /// Output tokens of the trace's production rows.
    pub output_tokens: u64,
    /// Cost of the span / its output tokens × 1,000,000 (None without a cost or tokens).
    pub cost_per_million_output_tokens: Option<f64>,
    /// As [`CapacityPlan::upper_bound`]: every count is at most.
    pub upper_bound: bool,
    /// The demand plan in one sentence.
    pub sentence: String,
}

/// The plan of `p` over the demand curve of `arrivals` in windows of `window_s` seconds
/// (None when the arrivals are empty or the window is not positive).
pub fn demand_plan(
    p: &CapacityPlan,
    arrivals: &results::sweep_doc::ArrivalProfile,
    window_s: f64,
) -> Option<DemandPlan> {
    let per = p.per_replica_rps;
    // NaN is not positive either.
    let positive = |x: f64| x > 0.0;
    if arrivals.counts.is_empty() || !positive(window_s) || !positive(per) {
        return None;
    }
    let bucket = arrivals.bucket_s.max(1e-9);
    let per_window = ((window_s / bucket).round() as usize).max(1);
    let span_s = arrivals.counts.len() as f64 * bucket;
    let mut windows = Vec::new();
    let mut replica_hours = 0.0;
    for (i, chunk) in arrivals.counts.chunks(per_window).enumerate() {
        let peak = f64::from(chunk.iter().copied().max().unwrap_or(0)) / bucket;
        let replicas = (peak / per).ceil().max(1.0) as u64 * u64::from(p.redundancy);
        replica_hours += replicas as f64 * chunk.len() as f64 * bucket / 3600.0;
        windows.push(DemandWindow {
            start_s: i as f64 * per_window as f64 * bucket,
            peak_rps: peak,
            replicas,
        });
    }
    let span_hours = span_s / 3600.0;
    let per_day = replica_hours * 24.0 / span_hours;
    let cost_per_day = p.cost_per_hour.map(|c| c * per_day);
    let tokens = arrivals.output_tokens;
    let per_million = p
        .cost_per_hour
        .filter(|_| tokens > 0)
        .map(|c| c * replica_hours / (tokens as f64 / 1e6));
    let peak_replicas = windows.iter().map(|w| w.replicas).max().unwrap_or(0);
    let mean_replicas = replica_hours / span_hours;
    let at_most = if p.upper_bound { "at most " } else { "" };
    let mut sentence = format!(
        "{}: over the trace's own demand ({} windows of {}), {at_most}{peak_replicas} replicas at the busiest, {at_most}{mean_replicas:.2} on average: {at_most}{per_day:.1} replica-hours per day",
        p.name,
        windows.len(),
        window_text(window_s),
    );
    if let Some(c) = cost_per_day {
        let _ = write!(sentence, ", {at_most}{c:.2}/day");
    }
    if let Some(m) = per_million {
        let _ = write!(sentence, ", {at_most}{m:.4} per million output tokens");
    }
    let _ = write!(
        sentence,
        " (against {} replicas all day for the peak).",
        p.replicas
    );
    Some(DemandPlan {
        window_s,
        windows,
        peak_replicas,
        mean_replicas,
        replica_hours,
        span_hours,
        replica_hours_per_day: per_day,
        cost_per_day,
        output_tokens: tokens,
        cost_per_million_output_tokens: per_million,
        upper_bound: p.upper_bound,
        sentence,
    })
}

impl DemandPlan {
    /// The table of demand plans, one row per configuration (Markdown and HTML).
    pub fn table(plans: &[CapacityPlan]) -> (Vec<String>, Vec<Vec<String>>) {
        let head = [
            "configuration",
            "window",
            "replicas at the busiest",
            "mean replicas",
            "replica-hours per day",
            "cost per day",
            "per million output tokens",
            "replicas by window (from the first arrival)",
        ]
        .map(String::from)
        .to_vec();
        let rows = plans
            .iter()
            .filter_map(|p| Some((p, p.demand.as_ref()?)))
            .map(|(p, d)| {
                let m = if d.upper_bound { "≤ " } else { "" };
                vec![
                    p.name.clone(),
                    window_text(d.window_s),
                    format!("{m}{}", d.peak_replicas),
                    format!("{m}{:.2}", d.mean_replicas),
                    format!("{m}{:.1}", d.replica_hours_per_day),
                    d.cost_per_day.map_or("–".into(), |c| format!("{m}{c:.2}")),
                    d.cost_per_million_output_tokens
                        .map_or("–".into(), |c| format!("{m}{c:.4}")),
                    d.runs(),
                ]
            })
            .collect();
        (head, rows)
    }

    /// Replicas by window as runs of equal counts: `+00:00–+09:00 2, +09:00–+10:00 8, …`.
    pub fn runs(&self) -> String {
        let hm = |s: f64| {
            let m = (s / 60.0).round() as u64;
            format!("+{:02}:{:02}", m / 60, m % 60)
        };
        let end = self.span_hours * 3600.0;
        let mut out: Vec<String> = Vec::new();
        let mut i = 0;
        while i < self.windows.len() {
            let r = self.windows[i].replicas;
            let j = (i..self.windows.len())
                .find(|&j| self.windows[j].replicas != r)
                .unwrap_or(self.windows.len());
            let to = self.windows.get(j).map_or(end, |w| w.start_s);
            out.push(format!("{}–{} {r}", hm(self.windows[i].start_s), hm(to)));
            i = j;
        }
        out.join(", ")
    }
}

/// `5 min`, `1 h`, `30 s`.
fn window_text(s: f64) -> String {
    if s >= 3600.0 && s % 3600.0 == 0.0 {
        format!("{} h", s / 3600.0)
    } else if s >= 60.0 && s % 60.0 == 0.0 {
        format!("{} min", s / 60.0)
    } else {
        format!("{} s", crate::capacity::fmt_num(s))
    }
}

impl CapacityPlan {
    /// A replica's capacity as a table cell: `≥ 2.37` when it is only a lower bound.
    pub fn per_replica_cell(&self) -> String {
        let ge = if self.upper_bound { "≥ " } else { "" };
        format!("{ge}{:.2}", self.per_replica_rps)
    }

    /// A count of replicas as a table cell: `at most 8` when the plan is an upper bound.
    pub fn replicas_cell(&self, n: u64) -> String {
        if self.upper_bound {
            format!("at most {n}")
        } else {
            n.to_string()
        }
    }
}

/// The sweep that would make a lower-bound plan exact: levels from the highest level that met
/// the SLO up to 8 times it, on the answer's axis, so one of them breaks the SLO.
pub fn sweep_to_find_the_limit(a: &CapacityAnswer) -> Option<String> {
    let l = a.max_ok_level.filter(|l| l.is_finite() && *l > 0.0)?;
    let levels = [1.0, 2.0, 4.0, 8.0]
        .iter()
        .map(|m| {
            let v = l * m;
            if a.axis == crate::capacity::Axis::MaxConcurrency {
                format!("{}", v.round().max(1.0) as u64)
            } else {
                crate::capacity::fmt_num(v)
            }
        })
        .collect::<Vec<_>>()
        .join(",");
    Some(format!("--sweep {}={levels}", a.axis.key()))
}

/// The capacity plan of an answer, or None without a capacity (no SLO met, or no SLOs).
pub fn plan(
    a: &CapacityAnswer,
    target_qps: f64,
    source: LoadSource,
    redundancy: u32,
    cost_per_hour: Option<f64>,
) -> Option<CapacityPlan> {
    let per = a.capacity_rps().filter(|t| *t > 0.0)?;
    if !(target_qps.is_finite() && target_qps > 0.0) {
        return None;
    }
    let redundancy = redundancy.max(1);
    let for_load = (target_qps / per).ceil().max(1.0) as u64;
    let replicas = for_load * u64::from(redundancy);
    let monthly = cost_per_hour.map(|c| c * replicas as f64 * HOURS_PER_MONTH);
    // No tested level broke the SLO: the highest one tested is a floor under a replica's
    // capacity, and the replicas a ceiling.
    let upper_bound = a.first_break.is_none();
    let exact_with = upper_bound.then(|| sweep_to_find_the_limit(a)).flatten();
    let src = match source {
        LoadSource::TargetQps => "--target-qps",
        LoadSource::TracePeak => "the capture's peak 1-second arrival rate",
    };
    let s = |n: u64| if n == 1 { "" } else { "s" };
    let mut sentence = if upper_bound {
        format!(
            "{}: at most {replicas} replica{} — {:.2} req/s ({src}) / at least {:.2} req/s per replica within the SLO (no tested level broke it, so a replica may carry more) = at most {for_load}; x{redundancy} redundancy",
            a.name,
            s(replicas),
            target_qps,
            per,
        )
    } else {
        format!(
            "{}: {:.2} req/s ({src}) / {:.2} req/s per replica within the SLO = {for_load} replica{}; x{redundancy} redundancy = {replicas} replica{}",
            a.name,
            target_qps,
            per,
            s(for_load),
            s(replicas),
        )
    };
    if let (Some(c), Some(m)) = (cost_per_hour, monthly) {
        let at_most = if upper_bound { "at most " } else { "" };
        let _ = write!(sentence, ", {at_most}{m:.0}/month at {c}/hour each");
    }
    sentence.push('.');
    if upper_bound {
        let _ = write!(
            sentence,
            " To make it exact, replay with {} so that a level breaks the SLO.",
            exact_with.as_deref().unwrap_or("a sweep to higher load")
        );
    }
    Some(CapacityPlan {
        name: a.name.clone(),
        per_replica_rps: per,
        target_qps,
        target_source: source,
        replicas_for_load: for_load,
        redundancy,
        replicas,
        utilization: target_qps / (per * replicas as f64),
        cost_per_hour,
        monthly_cost: monthly,
        upper_bound,
        exact_with,
        sentence,
        demand: None,
    })
}

/// The answer first, in three lines: the capacity at the SLO, the knee, the replicas (the
/// sentences below it in every output say how each was found).
pub fn answer_lines(
    a: &CapacityAnswer,
    slos: &[replay::config::Slo],
    p: Option<&CapacityPlan>,
) -> [String; 3] {
    use crate::capacity::{load_text, slo_text};
    let capacity = if slos.is_empty() {
        "no --goodput SLO given, so no capacity".to_string()
    } else {
        let at = format!("at the SLO ({})", slo_text(slos, a.slo_percentile));
        match (a.capacity_rps(), &a.first_break) {
            (Some(c), Some(_)) => format!("{at}: {c:.2} req/s per replica"),
            (Some(c), None) => {
                format!("{at}: at least {c:.2} req/s per replica (no tested level broke it)")
            }
            (None, Some(_)) => format!("{at}: none (missed already at the lowest level tested)"),
            (None, None) => format!("{at}: no levels"),
        }
    };
    let knee = match &a.knee {
        Some(k) => format!(
            "Knee: {} ({} at {})",
            load_text(a.axis, k.level, k.offered_rps),
            k.reasons.first().map_or("", String::as_str),
            a.axis.level_label(k.bent_level)
        ),
        None => "Knee: none within the tested levels (the curves stay flat)".to_string(),
    };
    let replicas = match p {
        Some(p) => {
            let src = match p.target_source {
                LoadSource::TargetQps => "--target-qps",
                LoadSource::TracePeak => "the capture's peak",
            };
            let n = |n: u64| p.replicas_cell(n);
            format!(
                "Replicas for {:.2} req/s ({src}): {}, x{} redundancy = {}{}",
                p.target_qps,
                n(p.replicas_for_load),
                p.redundancy,
                n(p.replicas),
                p.exact_with
                    .as_deref()
                    .map_or(String::new(), |s| format!(" (exact with {s})"))
            )
        }
        None => "Replicas: no plan (no capacity at the SLO, or no load to plan for)".to_string(),
    };
    [format!("{}: capacity {capacity}", a.name), knee, replicas]
}

/// Inputs of a capacity plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanInputs {
    /// `--target-qps` (None: the trace's peak arrival rate).
    pub target_qps: Option<f64>,
    /// `--redundancy`.
    pub redundancy: u32,
    /// `--cost-per-hour`.
    pub cost_per_hour: Option<f64>,
    /// `--plan-window`: the window of the plan over the trace's demand curve, s.
    pub window_s: f64,
}

/// The default `--plan-window`: 5 minutes.
pub const DEFAULT_WINDOW_S: f64 = 300.0;

impl Default for PlanInputs {
    fn default() -> Self {
        PlanInputs {
            target_qps: None,
            redundancy: 2,
            cost_per_hour: None,
            window_s: DEFAULT_WINDOW_S,
        }
    }
}

/// JSON of an answer (for the sweep file and reports).
pub fn answer_json(a: &CapacityAnswer, plan: Option<&CapacityPlan>) -> Value {
    let mut v = json!(a);
    if let (Some(p), Some(o)) = (plan, v.as_object_mut()) {
        o.insert("plan".into(), json!(p));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::{answer, Axis, LevelPoint};
    use results::ResultDoc;

    /// A speed-up level that offered `offered` req/s with p95 TTFT `ttft` ms.
    fn speedup_level(level: f64, offered: f64, ttft: f64) -> LevelPoint {
        let v = serde_json::json!({
            "num_prompts": 50, "failed": 0,
            "request_throughput": offered, "request_goodput": offered,
            "median_ttft_ms": ttft, "p95_ttft_ms": ttft,
            "llmreplay": {"served": {"offered_rps": offered}},
        });
        LevelPoint::from_results(level, &[&ResultDoc::from_value(&v).unwrap()])
    }

    /// Issue 53: a single 1x replay that met the SLO printed `8.00 / 2.37 req/s per replica =
    /// 4 replicas; x2 redundancy = 8 replicas` as the answer; 2.37 is only a floor under a
    /// replica's capacity, so 8 is a ceiling: "at most", with the sweep that makes it exact.
    #[test]
    fn a_plan_from_a_capacity_no_level_broke_says_at_most_and_which_sweep_makes_it_exact() {
        let slos = vec!["ttft:500".parse().unwrap()];
        let a = answer(
            "cand",
            Axis::Speedup,
            &[speedup_level(1.0, 2.37, 80.0)],
            &slos,
            95.0,
        );
        assert!(a.first_break.is_none());
        let p = plan(&a, 8.0, LoadSource::TracePeak, 2, Some(3.0)).unwrap();
        assert!(p.upper_bound);
        assert_eq!((p.replicas_for_load, p.replicas), (4, 8));
        assert!(
            p.sentence.starts_with("cand: at most 8 replicas"),
            "{}",
            p.sentence
        );
        assert!(
            p.sentence.contains("at least 2.37 req/s per replica"),
            "{}",
            p.sentence
        );
        assert!(p.sentence.contains("at most 17520/month"), "{}", p.sentence);
        assert_eq!(p.exact_with.as_deref(), Some("--sweep speedup=1,2,4,8"));
        assert!(
            p.sentence.contains("replay with --sweep speedup=1,2,4,8"),
            "{}",
            p.sentence
        );
        assert_eq!(p.replicas_cell(p.replicas), "at most 8");
        assert_eq!(p.per_replica_cell(), "≥ 2.37");
        let lines = answer_lines(&a, &slos, Some(&p));
        assert!(
            lines[0].contains("at least 2.37 req/s per replica"),
            "{lines:?}"
        );
        assert!(
            lines[2].contains("at most 4, x2 redundancy = at most 8"),
            "{lines:?}"
        );
        // A level that broke the SLO makes the capacity, and the plan, exact.
        let pts = [
            speedup_level(1.0, 2.37, 80.0),
            speedup_level(2.0, 4.7, 900.0),
        ];
        let a = answer("cand", Axis::Speedup, &pts, &slos, 95.0);
        let p = plan(&a, 8.0, LoadSource::TracePeak, 2, None).unwrap();
        assert!(!p.upper_bound && p.exact_with.is_none());
        assert!(!p.sentence.contains("at most"), "{}", p.sentence);
        assert!(p.sentence.ends_with("= 8 replicas."), "{}", p.sentence);
        assert_eq!(p.replicas_cell(p.replicas), "8");
        let lines = answer_lines(&a, &slos, Some(&p));
        assert!(lines[0].contains(": 2.37 req/s per replica"), "{lines:?}");
        assert_eq!(lines.len(), 3);
    }

    /// Issue 53: the plan over the capture's own demand curve. A two-peak synthetic day: 1
    /// req/s all day, 10 req/s from 09:00 to 10:00 and 6 req/s from 19:00 to 20:00, 100
    /// output tokens each; a replica carries 2.5 req/s at the SLO, redundancy 2, 2/hour.
    /// By hand, per hour: ceil(1 / 2.5) = 1, ceil(10 / 2.5) = 4, ceil(6 / 2.5) = 3 replicas,
    /// x2 = 2, 8, 6; replica-hours 22 x 2 + 8 + 6 = 58 per day (mean 58 / 24 = 2.4167,
    /// busiest 8), 116/day at 2/hour; output tokens (79,200 + 36,000 + 21,600) x 100 =
    /// 13,680,000, so 116 / 13.68 = 8.4795 per million. The peak plan runs 8 all day.
    #[test]
    fn the_plan_over_a_two_peak_day_needs_the_replicas_computed_by_hand() {
        let mut counts = vec![1u32; 86_400];
        counts[9 * 3600..10 * 3600].iter_mut().for_each(|c| *c = 10);
        counts[19 * 3600..20 * 3600].iter_mut().for_each(|c| *c = 6);
        let requests: u64 = counts.iter().map(|c| u64::from(*c)).sum();
        assert_eq!(requests, 136_800);
        let day = results::sweep_doc::ArrivalProfile {
            bucket_s: 1.0,
            mean_per_s: requests as f64 / 86_400.0,
            peak_per_s: 10.0,
            counts,
            producer: Some("capture".into()),
            output_tokens: requests * 100,
        };
        let slos = vec!["ttft:500".parse().unwrap()];
        let pts = [
            speedup_level(1.0, 2.5, 80.0),
            speedup_level(2.0, 5.0, 900.0),
        ];
        let a = answer("cand", Axis::Speedup, &pts, &slos, 95.0);
        let inputs = PlanInputs {
            target_qps: None,
            redundancy: 2,
            cost_per_hour: Some(2.0),
            window_s: 3600.0,
        };
        let p = crate::series::plan_for(&a, &day, inputs).unwrap();
        assert_eq!(p.replicas, 8, "the day's peak: ceil(10 / 2.5) x 2");
        let d = p.demand.as_ref().unwrap();
        let per_hour: Vec<u64> = d.windows.iter().map(|w| w.replicas).collect();
        let mut want = vec![2u64; 24];
        (want[9], want[19]) = (8, 6);
        assert_eq!(per_hour, want);
        assert_eq!(d.peak_replicas, 8);
        assert!((d.replica_hours - 58.0).abs() < 1e-9, "{}", d.replica_hours);
        assert!((d.replica_hours_per_day - 58.0).abs() < 1e-9);
        assert!((d.mean_replicas - 58.0 / 24.0).abs() < 1e-9);
        assert!((d.cost_per_day.unwrap() - 116.0).abs() < 1e-9);
        let per_m = d.cost_per_million_output_tokens.unwrap();
        assert!((per_m - 116.0 / 13.68).abs() < 1e-9, "{per_m}");
        assert_eq!(
            d.runs(),
            "+00:00–+09:00 2, +09:00–+10:00 8, +10:00–+19:00 2, +19:00–+20:00 6, +20:00–+24:00 2"
        );
        assert!(d.sentence.contains("8 replicas at the busiest, 2.42 on average: 58.0 replica-hours per day, 116.00/day, 8.4795 per million output tokens (against 8 replicas all day"), "{}", d.sentence);
        // 5-minute windows (the default): the peaks are hour-aligned, the same hours.
        let p5 = crate::series::plan_for(
            &a,
            &day,
            PlanInputs {
                window_s: 300.0,
                ..inputs
            },
        )
        .unwrap();
        let d5 = p5.demand.unwrap();
        assert_eq!(d5.windows.len(), 288);
        assert!((d5.replica_hours - 58.0).abs() < 1e-9);
        let (head, rows) = DemandPlan::table(&[p]);
        assert_eq!(
            (head.len(), rows[0][2].as_str(), rows[0][5].as_str()),
            (8, "8", "116.00")
        );
    }
}
