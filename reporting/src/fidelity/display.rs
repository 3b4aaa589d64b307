//! The console text and the HTML page of an assessment.

use std::fmt;

use super::{class_name, Fidelity, Status};

impl Fidelity {
    /// A self-contained HTML page: the console text, and per class and metric the captured
    /// and replayed distributions overlaid (CDFs: captured solid, replayed dashed).
    pub fn render_html(&self, title: &str) -> String {
        use crate::svg::{cdf, Chart, Line, PALETTE};
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
        crate::html::text_page(title, &self.to_string(), &body)
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
        if !self.shadow_rows.is_empty() {
            let each: Vec<String> = self
                .shadow_rows
                .iter()
                .map(|(t, n)| format!("{t} {n}"))
                .collect();
            writeln!(
                f,
                "Shadow rows left out: {} ({}): a --shadow candidate's answers, never replayed",
                self.shadow_rows.values().sum::<usize>(),
                each.join(", ")
            )?;
        }
        if let Some(n) = self.noise_matched {
            writeln!(
                f,
                "Noise run: {n} requests in common with the replay (a second replay: the \
                 engine's own run-to-run spread)"
            )?;
        }
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
                "{}: requests {}/{}, prompt tokens {}/{}, output tokens {}/{}{} ({} ok on both \
                 sides)",
                class_name(c),
                c.requests.0,
                c.requests.1,
                c.prompt_tokens.0,
                c.prompt_tokens.1,
                c.output_tokens.0,
                c.output_tokens.1,
                c.output_tokens_paired.map_or(String::new(), |p| format!(
                    " (paired per request ×{:.2} [{:.2}, {:.2}])",
                    p.ratio, p.ci.0, p.ci.1
                )),
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
                    match l.status {
                        Status::Reproduced => "",
                        Status::WithinNoise => "  [within noise]",
                        Status::Drifts => "  [drifts]",
                        Status::TooFew => "  [too few to tell]",
                    }
                )?;
                if let Some(p) = l.paired {
                    write!(
                        f,
                        "        paired per request: ×{:.2} [{:.2}, {:.2}] (95% CI, {} requests)",
                        p.ratio, p.ci.0, p.ci.1, p.n
                    )?;
                }
                if let Some(n) = l
                    .noise
                    .as_ref()
                    .filter(|n| !n.quantiles.is_empty() || n.paired.is_some())
                {
                    let q: Vec<String> = n
                        .quantiles
                        .iter()
                        .map(|(p, r)| format!("p{p:.0} ×{r:.2}"))
                        .collect();
                    write!(
                        f,
                        "{}noise run / replay: {}{}, bound ×{:.2}",
                        if l.paired.is_some() { "; " } else { "        " },
                        q.join(", "),
                        n.paired
                            .map_or(String::new(), |p| format!(", paired ×{:.2}", p.ratio)),
                        n.bound
                    )?;
                }
                let noise_said = l
                    .noise
                    .as_ref()
                    .is_some_and(|n| !n.quantiles.is_empty() || n.paired.is_some());
                if l.paired.is_some() || noise_said {
                    writeln!(f)?;
                }
            }
        }
        writeln!(f, "{:-^78}", " verdict ")?;
        for v in &self.verdict {
            writeln!(f, "{v}")?;
        }
        Ok(())
    }
}
