//! The HTML report: one self-contained file (inline CSS and inline SVG, no scripts, nothing
//! loaded from the network) with the capacity answer and plan, the plots — the trace's arrival
//! rate, latency against load with the SLO lines and the knee marked, goodput against
//! throughput, TTFT/TPOT/ITL distributions per target — and the tables of the Markdown report.

use std::fmt::Write as _;

use trace_format::stats::percentile_label;

use crate::capacity::{self, fmt_num};
use crate::document::{level_rows, levels_why, ReportData};
use crate::svg::{esc, Chart, Line, Rule, PALETTE};
use replay::soak::Slice;
use results::doc::SlicesDoc;

/// The report's style sheet (also used by `llmreplay fidelity --html`).
pub const CSS: &str = "body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1320px;color:#222;padding:0 16px}\
h1{font-size:24px}h2{font-size:19px;margin-top:32px;border-bottom:1px solid #ddd}h3{font-size:16px}\
table{border-collapse:collapse;font-size:12px;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}\
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.answer{font-size:15px;background:#f6f9ff;border-left:4px solid #0072B2;padding:8px 12px;margin:6px 0}\
.pass{color:#0a7a2f;font-weight:bold}.fail{color:#b00020;font-weight:bold}pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}\
.plots{display:flex;flex-wrap:wrap;gap:12px}.chart{border:1px solid #ddd}.note{color:#555;font-size:13px}";

fn color(i: usize) -> String {
    PALETTE[i % PALETTE.len()].to_string()
}

/// The plots of a report, as (caption, svg).
pub fn plots(d: &ReportData) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = arrival_plot(d).into_iter().collect();
    if d.series.is_empty() {
        return out;
    }
    let multi_level = d.series.iter().any(|s| s.points.len() > 1);
    if multi_level {
        let log_x = d.series.iter().all(|s| {
            let lv: Vec<f64> = s
                .points
                .iter()
                .map(|p| p.level)
                .filter(|l| l.is_finite())
                .collect();
            lv.len() > 2
                && lv.iter().all(|l| *l > 0.0)
                && lv.last().copied().unwrap_or(1.0) / lv[0] >= 8.0
        });
        out.extend(load_plots(d, log_x));
    }
    out.extend(timeline_plots(d));
    out.extend(distribution_plots(d, multi_level));
    out
}

/// The captured trace's arrival rate over time, when the report has the trace.
fn arrival_plot(d: &ReportData) -> Option<(String, String)> {
    let a = d.arrivals.as_ref()?;
    // One second of arrivals is no curve.
    if a.counts.len() < 2 {
        return None;
    }
    let name = a.trace_name();
    let c = Chart {
        title: format!("{name}: arrival rate over time"),
        x_label: "time since first arrival (s)".into(),
        y_label: "requests / s".into(),
        lines: vec![Line {
            name: format!("arrivals per {} s", fmt_num(a.bucket_s)),
            points: a
                .counts
                .iter()
                .enumerate()
                .map(|(i, c)| (i as f64 * a.bucket_s, f64::from(*c) / a.bucket_s))
                .collect(),
            color: color(0),
            dashed: false,
            markers: a.counts.len() < 30,
        }],
        hrules: vec![Rule {
            at: a.mean_per_s,
            label: format!("mean {:.2}/s", a.mean_per_s),
            color: "#666".into(),
        }],
        y_from_zero: true,
        ..Default::default()
    };
    Some((
        format!(
            "The arrival rate of {name} ({})",
            crate::document::trace_rate_role(d)
        ),
        c.render(),
    ))
}

/// Latency (p50, the SLO percentile, p99), goodput and throughput against load, over the
/// levels of every series.
fn load_plots(d: &ReportData, log_x: bool) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let first = &d.series[0];
    let axis = first.axis;
    let pct = first.slo_percentile;
    let offered = on_offered_load(d);
    for (metric, name) in [("ttft", "TTFT"), ("tpot", "TPOT")] {
        let mut lines = Vec::new();
        for (i, s) in d.series.iter().enumerate() {
            for (p, dashed) in [(50.0, true), (pct, false), (99.0, false)] {
                if p == 99.0 && pct == 99.0 {
                    continue;
                }
                let key = if p == 50.0 {
                    format!("median_{metric}_ms")
                } else {
                    capacity::pct_key(p, metric)
                };
                let pts: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .filter_map(|lp| Some((load_x(lp, offered), lp.mean(&key)?)))
                    .collect();
                if pts.is_empty() {
                    continue;
                }
                lines.push(Line {
                    name: format!("{} p{}", s.name, percentile_label(p)),
                    points: pts,
                    color: if p == 99.0 && pct != 99.0 {
                        color(i + 4)
                    } else {
                        color(i)
                    },
                    dashed,
                    markers: true,
                });
            }
        }
        let hrules = first
            .slos
            .iter()
            .filter(|s| s.metric.key() == metric)
            .map(|s| Rule {
                at: s.limit_ms,
                label: format!("SLO p{} {} ms", percentile_label(pct), fmt_num(s.limit_ms)),
                color: "#b00020".into(),
            })
            .collect();
        let c = Chart {
            title: format!(
                "{name} against load (p50 dashed, p{} and p99 solid)",
                percentile_label(pct)
            ),
            x_label: if offered {
                "offered load (req/s)".into()
            } else {
                axis.short().into()
            },
            y_label: format!("{name} (ms)"),
            lines,
            hrules,
            vrules: knee_rules(d, offered),
            log_x,
            log_y: true,
            ..Default::default()
        };
        out.push((
            format!("{name} against load, with the SLO line and the knee marked"),
            c.render(),
        ));
    }
    // Goodput against throughput.
    let mut lines: Vec<Line> = d
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| Line {
            name: s.name.clone(),
            points: s
                .points
                .iter()
                .filter_map(|p| Some((p.mean("request_throughput")?, p.mean("request_goodput")?)))
                .collect(),
            color: color(i),
            dashed: false,
            markers: true,
        })
        .collect();
    let maxt = d
        .series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|p| p.mean("request_throughput")))
        .fold(0.0, f64::max);
    lines.push(Line {
        name: "goodput = throughput".into(),
        points: vec![(0.0, 0.0), (maxt, maxt)],
        color: "#999".into(),
        dashed: true,
        markers: false,
    });
    let c = Chart {
        title: "Goodput against request throughput".into(),
        x_label: "request throughput (req/s)".into(),
        y_label: "goodput (req/s within SLO)".into(),
        lines,
        y_from_zero: true,
        ..Default::default()
    };
    out.push(("Goodput against throughput: where the curve leaves the diagonal, requests still finish but too slowly".into(), c.render()));
    // Throughput against load.
    let c = Chart {
        title: "Request throughput against load".into(),
        x_label: if offered {
            "offered load (req/s)".into()
        } else {
            axis.short().into()
        },
        y_label: "req/s".into(),
        lines: d
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| Line {
                name: s.name.clone(),
                points: s
                    .points
                    .iter()
                    .filter_map(|p| Some((load_x(p, offered), p.mean("request_throughput")?)))
                    .collect(),
                color: color(i),
                dashed: false,
                markers: true,
            })
            .collect(),
        vrules: knee_rules(d, offered),
        log_x,
        y_from_zero: true,
        ..Default::default()
    };
    out.push(("Request throughput against load".into(), c.render()));
    out
}

/// The CDF of TTFT, TPOT and ITL per series, at most six levels each (spread over the range).
fn distribution_plots(d: &ReportData, multi_level: bool) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for s in &d.series {
        let levels: Vec<&(String, f64, crate::series::Samples)> =
            d.samples.iter().filter(|(n, _, _)| *n == s.name).collect();
        if levels.is_empty() {
            continue;
        }
        // At most 6 levels, spread over the range.
        let pick: Vec<&&(String, f64, crate::series::Samples)> = if levels.len() <= 6 {
            levels.iter().collect()
        } else {
            (0..6)
                .map(|i| &levels[i * (levels.len() - 1) / 5])
                .collect()
        };
        for (metric, name) in [("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL")] {
            let lines: Vec<Line> = pick
                .iter()
                .enumerate()
                .map(|(i, (_, l, smp))| {
                    let v = smp.of(metric);
                    Line {
                        name: if multi_level {
                            s.axis.level_label(*l)
                        } else {
                            s.name.clone()
                        },
                        points: crate::svg::cdf_of(v, 400),
                        color: color(i),
                        dashed: false,
                        markers: false,
                    }
                })
                .collect();
            let spread = lines
                .iter()
                .flat_map(|l| l.points.iter().map(|p| p.0))
                .filter(|v| *v > 0.0)
                .fold((f64::INFINITY, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
            let hrules = Vec::new();
            let vrules = s
                .slos
                .iter()
                .filter(|x| x.metric.key() == metric)
                .map(|x| Rule {
                    at: x.limit_ms,
                    label: format!("SLO {} ms", fmt_num(x.limit_ms)),
                    color: "#b00020".into(),
                })
                .collect();
            // A sample past the exact cap is drawn from its histogram: the plot says so.
            let estimated = pick.iter().any(|(_, _, smp)| !smp.of(metric).is_exact());
            let c = Chart {
                title: format!(
                    "{name} distribution — {}{}",
                    s.name,
                    if estimated {
                        format!(
                            " (estimated: over {} values, within {}%)",
                            trace_format::quantiles::EXACT_CAP,
                            trace_format::quantiles::RELATIVE_ERROR * 100.0
                        )
                    } else {
                        String::new()
                    }
                ),
                x_label: format!("{name} (ms)"),
                y_label: "fraction of requests ≤ x".into(),
                lines,
                hrules,
                vrules,
                log_x: spread.1 / spread.0.max(1e-9) > 30.0,
                y_from_zero: true,
                ..Default::default()
            };
            out.push((
                format!("{name} distribution (CDF) per level, {}", s.name),
                c.render(),
            ));
        }
    }
    out
}

/// The timeline of the sliced runs (`replay --slice`), per configuration: p50/p95 TTFT and
/// p95 TPOT per slice (with the SLO lines), and the completion rate with its goodput share.
/// With several levels, at most four (spread over the range) are drawn.
fn timeline_plots(d: &ReportData) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for s in &d.series {
        let runs: Vec<&(String, f64, SlicesDoc)> =
            d.slices.iter().filter(|(n, _, _)| *n == s.name).collect();
        if runs.is_empty() {
            continue;
        }
        let pick: Vec<&&(String, f64, SlicesDoc)> = if runs.len() <= 4 {
            runs.iter().collect()
        } else {
            (0..4).map(|i| &runs[i * (runs.len() - 1) / 3]).collect()
        };
        let many = pick.len() > 1;
        let series_of = |v: &SlicesDoc, f: &dyn Fn(&Slice) -> Option<f64>| {
            v.slices
                .iter()
                .filter_map(|x| Some(((x.start_s + x.end_s) / 2.0, f(x)?)))
                .collect::<Vec<_>>()
        };
        let name = |l: f64, what: &str| {
            if many {
                format!("{} {what}", s.axis.level_label(l))
            } else {
                what.to_string()
            }
        };
        let width = pick.first().map_or(0.0, |(_, _, v)| v.slice_s);
        let mut lat = Vec::new();
        let mut thr = Vec::new();
        for (i, (_, l, v)) in pick.iter().enumerate() {
            type Pick = fn(&Slice) -> Option<f64>;
            let lines: [(Pick, &str, bool, usize); 3] = [
                (|x| Some(x.ttft_ms?.p95), "TTFT p95", false, i),
                (|x| Some(x.ttft_ms?.p50), "TTFT p50", true, i),
                (|x| Some(x.tpot_ms?.p95), "TPOT p95", false, i + 4),
            ];
            for (p, what, dashed, c) in lines {
                let pts = series_of(v, &p);
                if !pts.is_empty() {
                    lat.push(Line {
                        name: name(*l, what),
                        points: pts,
                        color: color(c),
                        dashed,
                        markers: false,
                    });
                }
            }
            thr.push(Line {
                name: name(*l, "completed/s"),
                points: series_of(v, &|x| Some(x.completed_per_s)),
                color: color(i),
                dashed: false,
                markers: false,
            });
            let good = series_of(v, &|x| Some(x.slo_attainment? * x.sent_per_s));
            if !good.is_empty() {
                thr.push(Line {
                    name: name(*l, "sent/s within SLO"),
                    points: good,
                    color: color(i),
                    dashed: true,
                    markers: false,
                });
            }
        }
        let hrules = s
            .slos
            .iter()
            .filter(|x| matches!(x.metric.key(), "ttft" | "tpot"))
            .map(|x| Rule {
                at: x.limit_ms,
                label: format!(
                    "SLO {} {} ms",
                    x.metric.key().to_uppercase(),
                    fmt_num(x.limit_ms)
                ),
                color: "#b00020".into(),
            })
            .collect();
        let c = Chart {
            title: format!(
                "Latency over the run ({} s slices) — {}",
                fmt_num(width),
                s.name
            ),
            x_label: "time since the run's start (s)".into(),
            y_label: "ms".into(),
            lines: lat,
            hrules,
            log_y: true,
            ..Default::default()
        };
        out.push((
            format!("Timeline: latency per time slice, {} (a rising trend is degradation: memory growth, KV fragmentation, throttling)", s.name),
            c.render(),
        ));
        let c = Chart {
            title: format!(
                "Throughput over the run ({} s slices) — {}",
                fmt_num(width),
                s.name
            ),
            x_label: "time since the run's start (s)".into(),
            y_label: "requests / s".into(),
            lines: thr,
            y_from_zero: true,
            ..Default::default()
        };
        out.push((
            format!(
                "Timeline: completions per second and the share sent within the SLO, {}",
                s.name
            ),
            c.render(),
        ));
    }
    out
}

fn knee_rules(d: &ReportData, offered: bool) -> Vec<Rule> {
    d.answers
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let k = a.knee.as_ref()?;
            let (at, text) = match (offered, k.offered_rps) {
                (true, Some(o)) => (o, format!("{o:.2} req/s")),
                _ => (k.level, fmt_num(k.level)),
            };
            Some(Rule {
                at,
                label: format!("knee {text} ({})", a.name),
                color: color(i),
            })
        })
        .collect()
}

/// Whether the plots against load are drawn on offered load (req/s), the axis the capacity
/// answer is stated on: when every series sets its load (rate or speed-up) and every level
/// recorded what it offered; else on the levels' settings.
fn on_offered_load(d: &ReportData) -> bool {
    d.series
        .iter()
        .all(|s| s.axis.offers_load() && s.points.iter().all(|p| p.offered_rps().is_some()))
}

/// A level's place on the x axis of the plots against load.
fn load_x(p: &capacity::LevelPoint, offered: bool) -> f64 {
    match (offered, p.offered_rps()) {
        (true, Some(o)) => o,
        _ => p.level,
    }
}

fn table(o: &mut String, head: &[String], rows: &[Vec<String>]) {
    o.push_str("<table><tr>");
    for h in head {
        let _ = write!(o, "<th>{}</th>", esc(h));
    }
    o.push_str("</tr>");
    for r in rows {
        o.push_str("<tr>");
        for c in r {
            let cls = match c.as_str() {
                "PASS" => " class=\"pass\"",
                "FAIL" => " class=\"fail\"",
                _ => "",
            };
            let _ = write!(o, "<td{cls}>{}</td>", esc(c));
        }
        o.push_str("</tr>");
    }
    o.push_str("</table>");
}

/// Minimal Markdown-table-to-HTML for the definitions table.
fn md_table(o: &mut String, md: &str) {
    let rows: Vec<Vec<String>> = md
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().replace('`', ""))
                .collect()
        })
        .collect();
    if let Some((h, r)) = rows.split_first() {
        table(o, h, r);
    }
}

/// The HTML report.
pub fn render(d: &ReportData) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>{CSS}</style></head><body><h1>{t}</h1>",
        t = esc(&d.title)
    );
    for p in crate::document::partial_lines(d) {
        let _ = write!(o, "<p class=\"answer\">{}</p>", esc(&p));
    }
    o.push_str("<h2>The answer</h2><ul>");
    for l in crate::document::answer_lines(d) {
        let _ = write!(o, "<li class=\"answer\">{}</li>", esc(&l));
    }
    o.push_str("</ul><h2>The capacity answer</h2>");
    for a in &d.answers {
        let _ = write!(o, "<p class=\"answer\">{}</p>", esc(&a.sentence));
    }
    if let Some(a) = d.answers.first() {
        let _ = write!(
            o,
            "<p class=\"note\">{}</p>",
            esc(&capacity::rules_text(a.slo_percentile))
        );
    }
    plan_section(&mut o, d);
    o.push_str("<h2>Plots</h2><div class=\"plots\">");
    for (cap, svg) in plots(d) {
        let _ = write!(
            o,
            "<figure>{svg}<figcaption class=\"note\">{}</figcaption></figure>",
            esc(&cap)
        );
    }
    o.push_str("</div><h2>Definitions</h2>");
    md_table(&mut o, crate::document::definitions_md());
    measured_section(&mut o, d);
    o.push_str("</ul><h2>Results per level</h2>");
    for s in &d.series {
        let _ = write!(o, "<h3>{}</h3>", esc(&s.name));
        let (h, r) = level_rows(s);
        table(&mut o, &h, &r);
    }
    let (h, r) = crate::validity::validity_rows(&d.verdicts);
    if !r.is_empty() {
        o.push_str("<h2>Validity</h2><p class=\"note\">VALID when the client's own timing error (reader lateness p99; dispatch lag p99 from 100 requests) is at most 10% of every SLO judged and of the measured TTFT p50 (docs/metrics.md).</p>");
        table(&mut o, &h, &r);
    }
    let (h, r) = crate::document::verdict_rows(d);
    if !r.is_empty() {
        o.push_str("<h2>Verdicts</h2><p class=\"note\">Runs whose target did not serve the offered load, whose client could not keep up, or that hold requests not streamed (TTFT, TPOT and ITL cover streamed requests only).</p>");
        table(&mut o, &h, &r);
    }
    let (h, r) = crate::document::class_rows(d);
    if !r.is_empty() {
        o.push_str("<h2>Latency by class of request</h2><p class=\"note\">n/a: TTFT, TPOT and ITL do not apply to requests that are not streamed.</p>");
        table(&mut o, &h, &r);
    }
    let (h, r) = crate::document::reasoning_rows(d);
    if !r.is_empty() {
        o.push_str("<h2>Reasoning</h2><p class=\"note\">Time to first answer token: the first output that is not reasoning, where some request of the run reasoned first (TTFT counts the reasoning's first token).</p>");
        table(&mut o, &h, &r);
    }
    server_section(&mut o, d);
    if !d.slices.is_empty() {
        o.push_str("<h2>Drift over the run</h2>");
        let (head, rows) = crate::document::drift_rows(d);
        table(&mut o, &head, &rows);
    }
    if let Some(c) = &d.comparison {
        let _ = write!(o, "<h2>Comparison</h2><pre>{}</pre>", esc(c));
    }
    o.push_str("<h2>Source files</h2><ul>");
    for f in &d.files {
        let _ = write!(o, "<li><code>{}</code></li>", esc(f));
    }
    o.push_str("</ul>");
    if !d.command.is_empty() {
        let _ = write!(
            o,
            "<p class=\"note\">Report written by <code>{}</code></p>",
            esc(&d.command)
        );
    }
    o.push_str("</body></html>\n");
    o
}

/// The capacity plan: replicas and cost per configuration, and its note.
fn plan_section(o: &mut String, d: &ReportData) {
    o.push_str("<h2>Capacity plan</h2>");
    if !d.plans.is_empty() {
        let head: Vec<String> = [
            "configuration",
            "per replica within SLO (req/s)",
            "target load (req/s)",
            "source",
            "replicas for the load",
            "redundancy",
            "replicas",
            "utilisation at target",
            "monthly cost",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let rows: Vec<Vec<String>> = d
            .plans
            .iter()
            .map(|p| {
                vec![
                    p.name.clone(),
                    p.per_replica_cell(),
                    format!("{:.2}", p.target_qps),
                    match p.target_source {
                        crate::plan::LoadSource::TargetQps => "--target-qps".into(),
                        crate::plan::LoadSource::TracePeak => "capture's peak (1 s buckets)".into(),
                    },
                    p.replicas_cell(p.replicas_for_load),
                    format!("x{}", p.redundancy),
                    p.replicas_cell(p.replicas),
                    format!("{:.0}%", p.utilization * 100.0),
                    p.monthly_cost.map_or("–".into(), |m| format!("{m:.0}")),
                ]
            })
            .collect();
        table(o, &head, &rows);
        o.push_str("<p class=\"note\">Redundancy R: R independent failure domains, each able to carry the whole target load alone. Monthly cost: replicas × cost per hour × 730 h.</p>");
        for p in &d.plans {
            let _ = write!(o, "<p>{}</p>", esc(&p.sentence));
        }
        demand_section(o, d);
    }
    if let Some(n) = &d.plan_note {
        let _ = write!(o, "<p class=\"note\">{}</p>", esc(n));
    }
}

/// The plan over the trace's own demand: the table, and replicas per window over time.
fn demand_section(o: &mut String, d: &ReportData) {
    let (head, rows) = crate::plan::DemandPlan::table(&d.plans);
    if rows.is_empty() {
        return;
    }
    o.push_str("<h3>Over the trace's own demand</h3>");
    table(o, &head, &rows);
    let _ = write!(o, "<p class=\"note\">{}</p>", esc(crate::plan::DEMAND_RULE));
    let lines = d
        .plans
        .iter()
        .enumerate()
        .filter_map(|(i, p)| Some((i, p, p.demand.as_ref()?)))
        .map(|(i, p, dp)| Line {
            name: p.name.clone(),
            // Steps: each window's count from its start to the next window's.
            points: dp
                .windows
                .iter()
                .flat_map(|w| {
                    let h = w.start_s / 3600.0;
                    let end = h + dp.window_s / 3600.0;
                    [(h, w.replicas as f64), (end, w.replicas as f64)]
                })
                .collect(),
            color: color(i),
            dashed: false,
            markers: false,
        })
        .collect();
    let c = Chart {
        title: "Replicas needed at the SLO, window by window".into(),
        x_label: "hours since the first arrival".into(),
        y_label: "replicas".into(),
        lines,
        y_from_zero: true,
        ..Default::default()
    };
    let _ = write!(o, "<div class=\"chart\">{}</div>", c.render());
    for dp in d.plans.iter().filter_map(|p| p.demand.as_ref()) {
        let _ = write!(o, "<p>{}</p>", esc(&dp.sentence));
    }
}

/// How it was measured: the exact commands, why these levels and SLOs, the notes.
fn measured_section(o: &mut String, d: &ReportData) {
    o.push_str("<h2>How it was measured</h2><p>Exact commands:</p><pre>");
    for s in &d.series {
        for c in &s.commands {
            let _ = writeln!(o, "{}", esc(c));
        }
    }
    o.push_str("</pre><ul>");
    for (s, a) in d.series.iter().zip(&d.answers) {
        let _ = write!(
            o,
            "<li><b>{}</b> — {}",
            esc(&s.name),
            esc(&levels_why(s, a))
        );
        if !s.slos.is_empty() {
            let _ = write!(
                o,
                " SLOs: {}, judged at p{}.",
                esc(&s
                    .slos
                    .iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")),
                percentile_label(s.slo_percentile)
            );
        }
        o.push_str("</li>");
    }
    for n in &d.notes {
        let _ = write!(o, "<li>{}</li>", esc(n));
    }
}

/// The server's own histograms beside the client's TTFT, when scraped.
fn server_section(o: &mut String, d: &ReportData) {
    if !d.server.is_empty() {
        o.push_str("<h2>Server-side view</h2><p class=\"note\">The server's own TTFT and queue-time histograms (scraped before and after each run) beside the client's TTFT: a gap that widens with load means the client, not the server, is saturated.</p>");
        let head: Vec<String> = [
            "configuration",
            "level",
            "client TTFT mean ms",
            "server TTFT mean ms",
            "gap ms",
            "server queue time mean ms",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let rows: Vec<Vec<String>> = d
            .server
            .iter()
            .map(|(n, l, v)| {
                let mut row = vec![n.clone(), fmt_num(*l)];
                row.extend(crate::document::server_cells(v));
                row
            })
            .collect();
        table(o, &head, &rows);
    }
}

/// A page of preformatted text (a verdict's console text) above its plots: the shell of the
/// fidelity and shadow reports.
pub fn text_page(title: &str, text: &str, plots: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>{CSS}</style></head><body><h1>{t}</h1><pre style=\"white-space:pre-wrap\">{text}</pre><div class=\"plots\">{plots}</div></body></html>\n",
        t = esc(title),
        text = esc(text),
    )
}
