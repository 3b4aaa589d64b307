//! The validity stamps of a report's runs (`results::validity`): per run, VALID or INVALID,
//! the client's own timing error against its budget, and what it was measured from.

use crate::capacity::fmt_num;
use results::doc::Extension;

/// The validity table of a report's runs (`(configuration, level, result)`, the report's
/// `verdicts`): head and one row per run with a stamp (runs that predate it, and merged
/// shards, have none).
pub fn validity_rows(runs: &[(String, f64, Extension)]) -> (Vec<String>, Vec<Vec<String>>) {
    let head: Vec<String> = [
        "configuration",
        "level",
        "stamp",
        "client timing error ms",
        "budget ms",
        "reader lateness p50 / p99 ms",
        "CPU steal / governor",
        "why",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut rows = Vec::new();
    for (name, level, e) in runs {
        let Some(v) = &e.client.validity else {
            continue;
        };
        let budget = match (v.budget_ms, v.references.first()) {
            (Some(b), Some(r)) => format!(
                "{b:.2} ({:.0}% of {}, {:.2})",
                v.fraction * 100.0,
                r.what,
                r.ms
            ),
            _ => "– (nothing to judge against)".into(),
        };
        rows.push(vec![
            name.clone(),
            fmt_num(*level),
            if v.valid { "VALID" } else { "INVALID" }.into(),
            format!("{:.3} ({})", v.error_ms, v.error_of),
            budget,
            format!(
                "{:.3} / {:.3}",
                v.reader_lateness_p50_ms, v.reader_lateness_p99_ms
            ),
            v.host_text("–"),
            match v.reasons.is_empty() && v.warnings.is_empty() {
                true => "–".into(),
                false => v
                    .reasons
                    .iter()
                    .chain(&v.warnings)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; "),
            },
        ]);
    }
    (head, rows)
}
