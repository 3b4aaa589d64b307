//! The Prometheus text exposition format (version 0.0.4), written and read in one place:
//! capture's and the sim's `/metrics` write it, replay reads a target's (its scheduler
//! gauges, vLLM's histograms) and the alert rules name its `le` labels. One spelling for all:
//! a bound's `le` and a float sample as Python's `prometheus_client` (the library vLLM
//! exports with) writes them (`0.005`, `1.0`, `+Inf`), and `le` after a series' other labels.
//! A reader takes any label order and either spelling of a number.

use std::fmt::Write as _;

/// A label value with `\`, `"` and line feeds escaped.
pub fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A float as the Python client writes it: `1.0`, `0.005`, `+Inf`, `-Inf`, `NaN`.
pub fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v:?}")
    }
}

/// The `le` label of a bucket bound (`1.0`, `0.25`, `+Inf`).
pub fn le(bound: f64) -> String {
    float(bound)
}

/// The `# HELP` and `# TYPE` lines of a metric family (`kind`: `counter`, `gauge`,
/// `histogram`).
pub fn head(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One sample: `name{labels} value`; `labels` are `k="v"` pairs joined by commas (values
/// escaped with [`escape_label`]), empty for none.
pub fn sample(out: &mut String, name: &str, labels: &str, value: impl std::fmt::Display) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {value}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

/// A family of one series: its [`head`] and its one [`sample`].
pub fn single(
    out: &mut String,
    name: &str,
    help: &str,
    kind: &str,
    labels: &str,
    value: impl std::fmt::Display,
) {
    head(out, name, help, kind);
    sample(out, name, labels, value);
}

/// A histogram's samples (its head is [`head`]'s): the cumulative `_bucket` of each bound
/// and `+Inf`, then `_sum` and `_count`. `counts` are per bucket (not cumulative), one per
/// bound; observations above the last bound are `count` minus their sum.
pub fn histogram(
    out: &mut String,
    name: &str,
    labels: &str,
    bounds: &[f64],
    counts: impl IntoIterator<Item = u64>,
    sum: f64,
    count: u64,
) {
    let sep = if labels.is_empty() { "" } else { "," };
    let mut cum = 0u64;
    for (b, c) in bounds.iter().zip(counts) {
        cum += c;
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{}\"}} {cum}", le(*b));
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
    sample(out, &format!("{name}_sum"), labels, float(sum));
    sample(out, &format!("{name}_count"), labels, count);
}

/// The labels and value of a sample line of series `name` (not a longer name it prefixes).
fn series_value<'a>(line: &'a str, name: &str) -> Option<(&'a str, f64)> {
    let rest = line.strip_prefix(name)?;
    let (labels, value) = match rest.as_bytes().first() {
        Some(b'{') => {
            let i = rest.find('}')?;
            (&rest[1..i], &rest[i + 1..])
        }
        Some(b' ') => ("", rest),
        _ => return None,
    };
    Some((labels, number(value.split_whitespace().next()?)?))
}

/// A sample value: a float in either spelling, `+Inf`, `-Inf`, `NaN`.
fn number(s: &str) -> Option<f64> {
    match s {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

/// The samples' lines of a text exposition (comments and blank lines left out).
fn sample_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim_start)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// Every sample of series `name` summed over its label sets (None when absent).
pub fn sum(text: &str, name: &str) -> Option<f64> {
    sample_lines(text)
        .filter_map(|l| series_value(l, name))
        .map(|(_, v)| v)
        .reduce(|a, b| a + b)
}

/// The sample of series `name` whose labels include every `k="v"` of `want` (the first
/// such), None when absent.
pub fn labelled(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    sample_lines(text)
        .filter_map(|l| series_value(l, name))
        .find(|(labels, _)| {
            want.iter()
                .all(|(k, v)| label(labels, k).as_deref() == Some(&escape_label(v)))
        })
        .map(|(_, v)| v)
}

/// The (still escaped) value of label `key` in a series' label text.
fn label(labels: &str, key: &str) -> Option<String> {
    let mut rest = labels;
    while !rest.is_empty() {
        let (k, after) = rest.split_once('=')?;
        let after = after.trim_start().strip_prefix('"')?;
        // The value ends at the first quote not escaped.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let end = end?;
        if k.trim().trim_start_matches(',').trim() == key {
            return Some(after[..end].to_string());
        }
        rest = after[end + 1..].trim_start().trim_start_matches(',');
    }
    None
}

/// A histogram read from a text exposition: cumulative counts per upper bound (all label
/// sets summed), sum and count.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// (le, cumulative count), ascending, `+Inf` last.
    pub buckets: Vec<(f64, f64)>,
    /// `_sum`.
    pub sum: f64,
    /// `_count`.
    pub count: f64,
}

impl Histogram {
    /// Reads histogram `name` (None when absent).
    pub fn read(text: &str, name: &str) -> Option<Histogram> {
        let (b, s, c) = (
            format!("{name}_bucket"),
            format!("{name}_sum"),
            format!("{name}_count"),
        );
        let mut h = Histogram::default();
        let mut seen = false;
        for line in sample_lines(text) {
            if let Some((labels, v)) = series_value(line, &b) {
                let Some(le) = label(labels, "le").and_then(|l| number(&l)) else {
                    continue;
                };
                match h.buckets.iter_mut().find(|(x, _)| *x == le) {
                    Some((_, n)) => *n += v,
                    None => h.buckets.push((le, v)),
                }
                seen = true;
            } else if let Some((_, v)) = series_value(line, &s) {
                h.sum += v;
                seen = true;
            } else if let Some((_, v)) = series_value(line, &c) {
                h.count += v;
                seen = true;
            }
        }
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        seen.then_some(h)
    }

    /// `self − before`: what was observed between two scrapes.
    pub fn since(&self, before: &Histogram) -> Histogram {
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, n)| {
                    let b = before
                        .buckets
                        .iter()
                        .find(|(x, _)| x == le)
                        .map_or(0.0, |x| x.1);
                    (*le, (n - b).max(0.0))
                })
                .collect(),
            sum: (self.sum - before.sum).max(0.0),
            count: (self.count - before.count).max(0.0),
        }
    }

    /// Prometheus' `histogram_quantile`: linear interpolation within the bucket holding rank
    /// q × count (the lowest bucket from 0; a rank in `+Inf` gives the highest finite bound).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut prev = (0.0, 0.0);
        for &(le, n) in &self.buckets {
            if n >= rank {
                if le.is_infinite() {
                    return Some(prev.0);
                }
                let width = n - prev.1;
                let frac = if width > 0.0 {
                    (rank - prev.1) / width
                } else {
                    1.0
                };
                return Some(prev.0 + (le - prev.0) * frac);
            }
            prev = (le, n);
        }
        Some(prev.0)
    }

    /// The bucket [`Histogram::quantile`] interpolates in for `q`: (lower, upper) bound in
    /// the histogram's unit, upper infinite for `+Inf`.
    pub fn bucket_of(&self, q: f64) -> Option<(f64, f64)> {
        let total = self.buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut lower = 0.0;
        for &(le, n) in &self.buckets {
            if n >= rank {
                return Some((lower, le));
            }
            lower = le;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the writer writes, the reader reads back: labels with quotes, commas and `=` in
    /// their values, `le` last, the Python client's floats.
    #[test]
    fn a_written_histogram_reads_back() {
        let mut out = String::new();
        head(&mut out, "h", "A histogram.", "histogram");
        let labels = format!("model_name=\"{}\"", escape_label("a\"b,c=d\\e"));
        histogram(&mut out, "h", &labels, &[0.005, 1.0], [2, 3], 1.5, 7);
        assert!(out.contains("# TYPE h histogram\n"), "{out}");
        assert!(out.contains(",le=\"1.0\"} 5\n"), "{out}");
        assert!(out.contains(",le=\"+Inf\"} 7\n"), "{out}");
        assert!(
            out.contains("h_sum{model_name=\"a\\\"b,c=d\\\\e\"} 1.5\n"),
            "{out}"
        );
        let h = Histogram::read(&out, "h").unwrap();
        assert_eq!(h.buckets, [(0.005, 2.0), (1.0, 5.0), (f64::INFINITY, 7.0)]);
        assert_eq!((h.sum, h.count), (1.5, 7.0));
        assert_eq!(
            labelled(&out, "h_count", &[("model_name", "a\"b,c=d\\e")]),
            Some(7.0)
        );
        assert_eq!(labelled(&out, "h_count", &[("model_name", "a")]), None);
        // Without labels too.
        let mut bare = String::new();
        histogram(&mut bare, "g", "", &[1.0], [1], 0.0, 1);
        assert_eq!(
            bare,
            "g_bucket{le=\"1.0\"} 1\ng_bucket{le=\"+Inf\"} 1\ng_sum 0.0\ng_count 1\n"
        );
    }

    /// Other writers put `le` first and spell numbers their way; the reader takes them.
    #[test]
    fn reads_any_label_order_and_number_spelling() {
        let text = "x_bucket{le=\"1\",m=\"a\"} 3\nx_bucket{m=\"b\",le=\"1e0\"} 1\n\
                    x_bucket{le=\"+Inf\",m=\"a\"} 4\nx_sum{m=\"a\"} 2\nx_count 4\n";
        let h = Histogram::read(text, "x").unwrap();
        assert_eq!(h.buckets, [(1.0, 4.0), (f64::INFINITY, 4.0)]);
        assert_eq!(Histogram::read(text, "y"), None);
        // A longer name with the same prefix is another series.
        assert_eq!(sum("a_total 1\na 2\na{k=\"v\"} 3\n", "a"), Some(5.0));
        assert_eq!(sum("a_total 1\n", "a"), None);
    }

    #[test]
    fn floats_as_the_python_client_writes_them() {
        for (v, s) in [
            (1.0, "1.0"),
            (0.005, "0.005"),
            (2560.0, "2560.0"),
            (f64::INFINITY, "+Inf"),
        ] {
            assert_eq!(float(v), s);
            assert_eq!(number(s), Some(v));
        }
        assert_eq!(float(f64::NAN), "NaN");
        assert!(number("NaN").is_some_and(f64::is_nan));
    }
}
