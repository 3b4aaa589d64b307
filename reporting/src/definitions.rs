//! The metric definitions people read above every result, from one source: the repository's
//! `docs/metrics.md`, built into the binary. Its marked blocks (`<!-- NAME:begin -->` …
//! `<!-- NAME:end -->`) are what the console (`console`) and `llmreplay report` (`report`)
//! print, so the documentation and the reports cannot say different things.

/// `docs/metrics.md`, as built.
pub const METRICS_MD: &str = include_str!("../../docs/metrics.md");

/// The block `name` of [`METRICS_MD`], without its markers and without a code fence around
/// it; empty when the file has no such block (a test checks every block the code asks for).
pub fn section(name: &str) -> &'static str {
    let begin = format!("<!-- {name}:begin -->\n");
    let end = format!("<!-- {name}:end -->");
    let Some(start) = METRICS_MD.find(&begin).map(|i| i + begin.len()) else {
        return "";
    };
    let Some(len) = METRICS_MD[start..].find(&end) else {
        return "";
    };
    let block = &METRICS_MD[start..start + len];
    match block.strip_prefix("```text\n") {
        Some(inner) => inner.strip_suffix("```\n").unwrap_or(inner),
        None => block,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_and_the_report_print_the_blocks_of_docs_metrics_md() {
        let console = section("console");
        assert!(console.starts_with("Metric definitions"), "{console}");
        assert!(!console.contains("```"));
        assert!(console.contains("VERDICT"));
        assert_eq!(crate::console::definitions(), console);
        let report = section("report");
        assert!(report.starts_with("| metric |"), "{report}");
        assert!(report.contains("outcome causes"));
        assert_eq!(crate::document::definitions_md(), report);
        assert_eq!(section("nothing"), "");
    }
}
