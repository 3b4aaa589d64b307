//! A small SVG line-chart writer for the HTML report: axes with readable ticks (linear or
//! log), several series, horizontal reference lines (SLOs) and vertical markers (the knee).
//! The output is plain inline SVG — no scripts, no fonts, nothing fetched — so the report
//! opens from disk anywhere.

use std::fmt::Write as _;

/// Colours of successive series (colour-blind-safe Okabe–Ito order).
pub const PALETTE: &[&str] = &[
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
];

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Line {
    /// Legend text.
    pub name: String,
    /// (x, y) points, drawn in order.
    pub points: Vec<(f64, f64)>,
    /// Stroke colour.
    pub color: String,
    /// Dashed stroke.
    pub dashed: bool,
    /// Draw a dot at every point.
    pub markers: bool,
}

/// A horizontal (y = value) or vertical (x = value) reference line.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Where.
    pub at: f64,
    /// Label drawn beside it.
    pub label: String,
    /// Colour.
    pub color: String,
}

/// A chart.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Lines.
    pub lines: Vec<Line>,
    /// Horizontal rules (SLO limits).
    pub hrules: Vec<Rule>,
    /// Vertical rules (knees).
    pub vrules: Vec<Rule>,
    /// Log-scale x.
    pub log_x: bool,
    /// Log-scale y.
    pub log_y: bool,
    /// Start y at zero (linear y).
    pub y_from_zero: bool,
}

const W: f64 = 640.0;
const H: f64 = 360.0;
const ML: f64 = 64.0;
const MR: f64 = 16.0;
const MT: f64 = 36.0;
const MB: f64 = 78.0;

/// Escapes text for SVG/HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn nice_step(span: f64, target: usize) -> f64 {
    let raw = span / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let n = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    n * mag
}

struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    a: f64,
    b: f64,
}

impl Scale {
    fn new(mut lo: f64, mut hi: f64, log: bool, a: f64, b: f64) -> Scale {
        if log {
            lo = lo.max(1e-9).log10();
            hi = hi.max(1e-9).log10();
        }
        if hi - lo < 1e-12 {
            hi = lo + 1.0;
        }
        Scale { lo, hi, log, a, b }
    }
    fn px(&self, v: f64) -> f64 {
        let v = if self.log { v.max(1e-9).log10() } else { v };
        self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)
    }
    fn ticks(&self) -> Vec<f64> {
        if self.log && self.hi - self.lo < 1.0 {
            // Less than a decade: 1-2-5 ticks would leave one or none; use linear steps.
            let (lo, hi) = (10f64.powf(self.lo), 10f64.powf(self.hi));
            let step = nice_step(hi - lo, 5);
            let mut v = (lo / step).ceil() * step;
            let mut t = Vec::new();
            while v <= hi + step * 1e-9 && t.len() < 50 {
                if v > 0.0 {
                    t.push(v);
                }
                v += step;
            }
            return t;
        }
        if self.log {
            let mut t = Vec::new();
            let (lo, hi) = (self.lo.floor() as i32, self.hi.ceil() as i32);
            for e in lo..=hi {
                for m in [1.0, 2.0, 5.0] {
                    let v = m * 10f64.powi(e);
                    let l = v.log10();
                    if l >= self.lo - 1e-9 && l <= self.hi + 1e-9 {
                        t.push(v);
                    }
                }
            }
            t
        } else {
            let step = nice_step(self.hi - self.lo, 6);
            let mut v = (self.lo / step).ceil() * step;
            let mut t = Vec::new();
            while v <= self.hi + step * 1e-9 && t.len() < 50 {
                t.push(v);
                v += step;
            }
            t
        }
    }
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 {
        format!("{:.0}", v)
    } else if v.abs() >= 10.0 {
        format!("{}", (v * 10.0).round() / 10.0)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

impl Chart {
    /// Renders the chart as an `<svg>` element (no XML namespace needed inline in HTML).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let pts = self.lines.iter().flat_map(|l| l.points.iter());
        let xs: Vec<f64> = pts
            .clone()
            .map(|p| p.0)
            .chain(self.vrules.iter().map(|r| r.at))
            .filter(|v| finite(*v, self.log_x))
            .collect();
        let ys: Vec<f64> = pts
            .map(|p| p.1)
            .chain(self.hrules.iter().map(|r| r.at))
            .filter(|v| finite(*v, self.log_y))
            .collect();
        let _ = write!(
            out,
            "<svg class=\"chart\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" aria-label=\"{t}\">\
             <title>{t}</title><rect x=\"0\" y=\"0\" width=\"{W}\" height=\"{H}\" fill=\"#ffffff\"/>",
            t = esc(&self.title)
        );
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"20\" font-size=\"14\" font-weight=\"bold\" text-anchor=\"middle\">{}</text>",
            W / 2.0,
            esc(&self.title)
        );
        if xs.is_empty() || ys.is_empty() {
            let _ = write!(
                out,
                "<text x=\"{}\" y=\"{}\" font-size=\"13\" text-anchor=\"middle\" fill=\"#666\">no data</text></svg>",
                W / 2.0,
                H / 2.0
            );
            return out;
        }
        let (sx, sy) = self.scales(&xs, &ys);
        self.axes(&mut out, &sx, &sy);
        self.rules(&mut out, &sx, &sy);
        self.polylines(&mut out, &sx, &sy);
        self.legend(&mut out);
        out.push_str("</svg>");
        out
    }

    /// The scales of the plotted values `xs` and `ys` (padded; from zero when asked).
    fn scales(&self, xs: &[f64], ys: &[f64]) -> (Scale, Scale) {
        let (mut x0, mut x1) = (
            xs.iter().copied().fold(f64::INFINITY, f64::min),
            xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        );
        let (mut y0, mut y1) = (
            ys.iter().copied().fold(f64::INFINITY, f64::min),
            ys.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        );
        if !self.log_y {
            if self.y_from_zero {
                y0 = y0.min(0.0);
            }
            let pad = (y1 - y0).abs().max(1e-9) * 0.08;
            y1 += pad;
            if !self.y_from_zero {
                y0 -= pad;
            }
        }
        if !self.log_x && x1 - x0 < 1e-12 {
            x0 -= 1.0;
            x1 += 1.0;
        }
        (
            Scale::new(x0, x1, self.log_x, ML, W - MR),
            Scale::new(y0, y1, self.log_y, H - MB, MT),
        )
    }

    /// Grid, ticks, the plot's frame and the axis labels.
    fn axes(&self, out: &mut String, sx: &Scale, sy: &Scale) {
        for t in sx.ticks() {
            let x = sx.px(t);
            let _ = write!(
                out,
                "<line x1=\"{x:.1}\" y1=\"{MT}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>\
                 <text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{}</text>",
                H - MB,
                H - MB + 14.0,
                fmt_tick(t)
            );
        }
        for t in sy.ticks() {
            let y = sy.px(t);
            let _ = write!(
                out,
                "<line x1=\"{ML}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>",
                W - MR,
                ML - 4.0,
                y + 4.0,
                fmt_tick(t)
            );
        }
        let _ = write!(
            out,
            "<rect x=\"{ML}\" y=\"{MT}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#888\"/>",
            W - ML - MR,
            H - MT - MB
        );
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">{}</text>",
            (ML + W - MR) / 2.0,
            H - MB + 32.0,
            esc(&self.x_label)
        );
        let _ = write!(
            out,
            "<text x=\"14\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 14 {:.1})\">{}</text>",
            (MT + H - MB) / 2.0,
            (MT + H - MB) / 2.0,
            esc(&self.y_label)
        );
    }

    /// The horizontal and vertical rules (SLO lines, knees), labelled.
    fn rules(&self, out: &mut String, sx: &Scale, sy: &Scale) {
        for r in &self.hrules {
            if !finite(r.at, self.log_y) {
                continue;
            }
            let y = sy.px(r.at);
            let _ = write!(
                out,
                "<line x1=\"{ML}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{c}\" stroke-width=\"1.5\" stroke-dasharray=\"6 3\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"{c}\">{}</text>",
                W - MR,
                W - MR - 4.0,
                y - 4.0,
                esc(&r.label),
                c = esc(&r.color)
            );
        }
        for (i, r) in self.vrules.iter().enumerate() {
            if !finite(r.at, self.log_x) {
                continue;
            }
            let x = sx.px(r.at);
            // Labels near the right edge go to the left of their line.
            let (tx, anchor) = if x > W - MR - 140.0 {
                (x - 3.0, "end")
            } else {
                (x + 3.0, "start")
            };
            let _ = write!(
                out,
                "<line x1=\"{x:.1}\" y1=\"{MT}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{c}\" stroke-width=\"1.5\" stroke-dasharray=\"2 3\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"{anchor}\" fill=\"{c}\">{}</text>",
                H - MB,
                tx,
                MT + 12.0 + 13.0 * i as f64,
                esc(&r.label),
                c = esc(&r.color)
            );
        }
    }

    /// Each line, with its markers.
    fn polylines(&self, out: &mut String, sx: &Scale, sy: &Scale) {
        for l in &self.lines {
            let p: Vec<String> = l
                .points
                .iter()
                .filter(|(x, y)| finite(*x, self.log_x) && finite(*y, self.log_y))
                .map(|(x, y)| format!("{:.1},{:.1}", sx.px(*x), sy.px(*y)))
                .collect();
            if p.is_empty() {
                continue;
            }
            let _ = write!(
                out,
                "<polyline class=\"series\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{} points=\"{}\"/>",
                esc(&l.color),
                if l.dashed { " stroke-dasharray=\"5 4\"" } else { "" },
                p.join(" ")
            );
            if l.markers {
                for xy in &p {
                    let (x, y) = xy.split_once(',').unwrap_or(("0", "0"));
                    let _ = write!(
                        out,
                        "<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{}\"/>",
                        esc(&l.color)
                    );
                }
            }
        }
    }

    /// The legend, below the x label.
    fn legend(&self, out: &mut String) {
        let mut lx = ML;
        let mut ly = H - MB + 50.0;
        for l in &self.lines {
            let wdt = 28.0 + 6.5 * l.name.chars().count() as f64;
            if lx + wdt > W - MR {
                lx = ML;
                ly += 14.0;
            }
            let _ = write!(
                out,
                "<line x1=\"{lx:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{c}\" stroke-width=\"2\"{}/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{}</text>",
                ly - 4.0,
                lx + 18.0,
                ly - 4.0,
                if l.dashed { " stroke-dasharray=\"5 4\"" } else { "" },
                lx + 22.0,
                ly,
                esc(&l.name),
                c = esc(&l.color)
            );
            lx += wdt;
        }
    }
}

/// Whether `v` can be drawn on a linear axis, or a log one (`log`: positive too).
fn finite(v: f64, log: bool) -> bool {
    v.is_finite() && (!log || v > 0.0)
}

/// The empirical CDF of `values` as (value, fraction ≤ value), thinned to ≤ `max_points`.
pub fn cdf(values: &[f64], max_points: usize) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return Vec::new();
    }
    let step = (n / max_points.max(2)).max(1);
    let mut out: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (v[i], (i + 1) as f64 / n as f64))
        .collect();
    if out.last().map(|p| p.1) != Some(1.0) {
        out.push((v[n - 1], 1.0));
    }
    out
}

/// The CDF of a [`Quantiles`] sample as [`cdf`] draws it: from every value while the sample
/// is exact (the same points), else from the histogram's value at each drawn rank (within
/// its relative error, 0.1%).
pub fn cdf_of(q: &trace_format::quantiles::Quantiles, max_points: usize) -> Vec<(f64, f64)> {
    if let Some(v) = q.exact_values() {
        return cdf(v, max_points);
    }
    let n = q.len();
    if n == 0 {
        return Vec::new();
    }
    let at = |i: usize| q.quantile(100.0 * i as f64 / (n - 1).max(1) as f64);
    let step = (n / max_points.max(2)).max(1);
    let mut out: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (at(i), (i + 1) as f64 / n as f64))
        .collect();
    if out.last().map(|p| p.1) != Some(1.0) {
        out.push((at(n - 1), 1.0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_lines_rules_and_escapes_text() {
        let c = Chart {
            title: "TTFT <p99>".into(),
            x_label: "x".into(),
            y_label: "ms".into(),
            lines: vec![Line {
                name: "a&b".into(),
                points: vec![(1.0, 10.0), (8.0, 20.0), (16.0, 400.0)],
                color: PALETTE[0].into(),
                dashed: false,
                markers: true,
            }],
            hrules: vec![Rule {
                at: 300.0,
                label: "SLO".into(),
                color: "red".into(),
            }],
            vrules: vec![Rule {
                at: 8.0,
                label: "knee".into(),
                color: "gray".into(),
            }],
            log_x: true,
            ..Default::default()
        };
        let s = c.render();
        assert!(s.starts_with("<svg") && s.ends_with("</svg>"));
        assert!(s.contains("TTFT &lt;p99&gt;") && s.contains("a&amp;b"));
        assert_eq!(s.matches("<polyline").count(), 1);
        assert_eq!(s.matches("<circle").count(), 3);
        assert!(s.contains(">knee<") && s.contains(">SLO<"));
        assert!(!s.contains("NaN") && !s.contains("inf"));
    }

    #[test]
    fn empty_chart_says_no_data_and_cdf_ends_at_one() {
        assert!(Chart::default().render().contains("no data"));
        let c = cdf(&[3.0, 1.0, 2.0], 100);
        assert_eq!(c, vec![(1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (3.0, 1.0)]);
    }

    /// While exact, the sample's CDF is the values' own; past the cap it is drawn from the
    /// histogram, every point within its relative error of the true CDF's.
    #[test]
    fn a_sample_cdf_is_exact_then_within_the_histograms_error() {
        use trace_format::quantiles::{Quantiles, EXACT_CAP, RELATIVE_ERROR};
        let values: Vec<f64> = (0..5_000)
            .map(|i| 1.0 + ((i * 7_919) % 5_000) as f64)
            .collect();
        let mut q = Quantiles::new();
        values.iter().for_each(|v| q.add(*v));
        assert_eq!(cdf_of(&q, 400), cdf(&values, 400));
        let n = EXACT_CAP + 10_000;
        let value = |i: usize| 1.0 + ((i * 7_919) % n) as f64 / 100.0;
        let mut big = Quantiles::new();
        (0..n).for_each(|i| big.add(value(i)));
        assert!(!big.is_exact());
        let mut sorted: Vec<f64> = (0..n).map(value).collect();
        sorted.sort_by(f64::total_cmp);
        let got = cdf_of(&big, 400);
        assert!(got.len() <= 402 && got.len() > 300, "{}", got.len());
        assert_eq!(got.last().map(|p| p.1), Some(1.0));
        for (x, f) in got {
            let i = ((f * n as f64).round() as usize).clamp(1, n) - 1;
            let want = sorted[i];
            assert!(
                (x - want).abs() <= want * RELATIVE_ERROR * 1.01,
                "{x} vs {want} at {f}"
            );
        }
    }
}
