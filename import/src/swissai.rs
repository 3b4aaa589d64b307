//! The SwissAI serving trace (OSDI '26, OpenTela; `eth-easl/swissai-serving-trace` on Hugging
//! Face): JSON lines, one request each, as its dataset card describes `trace.jsonl` (16,329,237
//! requests): `id`, `status`, `created_at` and `finished_at` (ISO-8601 UTC, `2025-08-21T14:34:25.590Z`;
//! older files of the layout write `2024-07-17 13:56:49.399`), `model`, `model_parameters`,
//! `reported_token_input`, `reported_token_output` (-1 where the platform did not report a
//! count). The `*-buckets.jsonl` files add `token_count` and `bucket_ids`: the prompt cut into
//! 16-token buckets (Qwen3-32B's tokenizer, the last one right-padded).
//!
//! Each line is one chat request, id `<prefix>:<line>`, arriving at `created_at`, its end-to-end
//! latency `finished_at − created_at`, with the model and the reported token counts. `status`
//! `DEFAULT` is `ok`; any other (`ERROR`) is imported as `upstream_error` with the status as its
//! error. `bucket_ids` become `prefix_hashes` of 16-token blocks, each chained to the ones
//! before it (block *k*'s hash stands for buckets 1..=*k*), so equal hashes mean an equal prefix
//! whether the published ids hash a bucket alone or its prefix.
//!
//! Incomplete rows import with what they have, the rest counted as unknown: a count of -1 (a
//! third of the requests in the published head) or absent, no `finished_at`, no `status`. A
//! malformed value (a time that is not one, a count below -1, an end before the start) is an
//! error naming the file, line and field. The trace has no sessions (`id` is opaque), no TTFT.
//!
//! Not mapped (no column): `id`, `model_parameters` (`temperature`, `max_tokens`, `top_p`,
//! `seed`, penalties), `token_count`, and the `*-bucket-reuse.jsonl` files' reuse statistics.

use std::path::Path;

use trace_format::fnv::{fnv1a, OFFSET};
use trace_format::{Outcome, Result, TokenSource, TraceRecord};

use crate::azure::parse_timestamp;
use crate::out::Out;
use crate::rows::{jsonl_records, Fields};

/// Endpoint of imported rows (the platform serves chat completions).
pub const ENDPOINT: &str = "/v1/chat/completions";
/// Tokens per bucket of `bucket_ids`.
pub const BLOCK_SIZE: u32 = 16;
/// The fields whose presence on a JSON line says it is this trace.
pub(crate) const KEYS: [&str; 3] = ["created_at", "finished_at", "reported_token_input"];

/// Reads a SwissAI serving trace (JSONL, or gzip-compressed JSONL named `*.gz`).
pub(crate) fn import(path: &Path, id_prefix: &str, out: &mut Out<'_>) -> Result<()> {
    let mut unknown: Vec<&'static str> = Vec::new();
    jsonl_records(path, out, |row| {
        let f = Fields::of(row);
        let time = |field: &str| -> Result<Option<i64>> {
            f.opt_str(field)?
                .map(|s| parse_timestamp(&s).map_err(|e| f.bad(field, format!("{s:?}: {e}"))))
                .transpose()
        };
        let arrival = time("created_at")?.ok_or_else(|| f.bad("created_at", "missing"))?;
        let mut r = TraceRecord::new(format!("{id_prefix}:{}", row.at.line), arrival, ENDPOINT);
        r.stream = true;
        r.e2el_us = match time("finished_at")? {
            Some(end) if end < arrival => {
                return Err(f.bad("finished_at", "is before created_at"));
            }
            Some(end) => Some(end - arrival),
            None => {
                unknown.push("finished_at");
                None
            }
        };
        r.model = f.opt_str("model")?;
        r.prompt_tokens = reported(&f, "reported_token_input", &mut unknown)?;
        r.output_tokens = reported(&f, "reported_token_output", &mut unknown)?;
        r.prompt_tokens_source = r.prompt_tokens.map(|_| TokenSource::Recorded);
        r.output_tokens_source = r.output_tokens.map(|_| TokenSource::Recorded);
        match f.opt_str("status")?.as_deref() {
            None => unknown.push("status"),
            Some("DEFAULT") => {}
            Some(other) => {
                r.outcome = Outcome::UpstreamError;
                r.error = Some(format!("recorded status {other}"));
            }
        }
        r.prefix_hashes = f.opt_hashes("bucket_ids")?.map(|ids| {
            let mut h = OFFSET;
            ids.iter()
                .map(|id| {
                    h = fnv1a(h, &id.to_le_bytes());
                    h
                })
                .collect()
        });
        Ok(r)
    })?;
    for field in unknown {
        out.unknown(field);
    }
    Ok(())
}

/// A reported token count: -1 (the platform's "not reported") or absent is unknown.
fn reported(
    f: &Fields<'_>,
    field: &'static str,
    unknown: &mut Vec<&'static str>,
) -> Result<Option<i64>> {
    if f.get(field).is_none_or(|v| v.as_i64() == Some(-1)) {
        unknown.push(field);
        return Ok(None);
    }
    f.opt_count(field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{detect, import_file, Format, ImportOptions};
    use serde_json::Value;

    /// Rows built from the layout the dataset card and a profile of the published file's head
    /// show (`created_at` with a `Z`, -1 counts, `ERROR` rows, `model_parameters` objects,
    /// `bucket_ids`; the older space-separated times): each row's arrival, latency, counts,
    /// outcome and chained bucket hashes as the line says, computed here from the JSON.
    #[test]
    fn rows_import_with_what_they_have_and_unknowns_counted() {
        let lines = [
            r#"{"id": "479450f74355ad63:1225ef89:clyp", "status": "ERROR", "created_at": "2025-08-21T14:34:25.590Z", "finished_at": "2025-08-21T14:34:26.945Z", "model": "Qwen/Qwen3-32B", "model_parameters": {"top_p": 1, "seed": 42, "max_tokens": null, "temperature": 0.7, "presence_penalty": 0, "frequency_penalty": 0}, "reported_token_input": -1, "reported_token_output": -1}"#,
            r#"{"id": "479869c90e8f0280:ff9095fb:clyp", "status": "DEFAULT", "created_at": "2025-08-21T19:19:22.469Z", "finished_at": "2025-08-21T19:19:27.249Z", "model": "Qwen/Qwen3-32B", "model_parameters": {"temperature": 0.7}, "reported_token_input": 111, "reported_token_output": 184, "token_count": 108, "bucket_ids": [44122773, 36225474, 7, 8, 9, 10, 11]}"#,
            r#"{"id": "a-1234", "status": "DEFAULT", "created_at": "2024-07-17 13:56:49.399", "finished_at": "2024-07-17 13:56:50.527", "model": "meta-llama/Meta-Llama-3-8B-Instruct", "model_parameters": {"top_p": 1, "max_tokens": 256}, "reported_token_input": 23, "reported_token_output": 38}"#,
            r#"{"id": "b", "created_at": "2025-08-21T19:19:30.000Z", "model": "swiss-ai/Apertus-70B", "reported_token_input": 5}"#,
        ];
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("trace.jsonl");
        std::fs::write(&p, lines.join("\n")).unwrap();
        assert_eq!(detect(&p).unwrap(), Format::SwissAi);
        let (rows, stats) = import_file(&p, &ImportOptions::default(), "s").unwrap();
        assert_eq!(rows.len(), lines.len());
        let us = |v: &Value| parse_timestamp(v.as_str().unwrap()).unwrap();
        let count = |v: &Value| v.as_i64().filter(|n| *n >= 0);
        for (r, line) in rows.iter().zip(lines) {
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(r.arrival_time_us, us(&v["created_at"]));
            let e2el = v.get("finished_at").map(|f| us(f) - us(&v["created_at"]));
            assert_eq!(r.e2el_us, e2el);
            assert_eq!(r.prompt_tokens, count(&v["reported_token_input"]));
            assert_eq!(r.output_tokens, count(&v["reported_token_output"]));
            assert_eq!(r.model.as_deref(), v["model"].as_str());
            let failed = v["status"].as_str().is_some_and(|s| s != "DEFAULT");
            assert_eq!(r.outcome == Outcome::UpstreamError, failed);
            let buckets: Option<Vec<u64>> = v["bucket_ids"]
                .as_array()
                .map(|a| a.iter().map(|x| x.as_u64().unwrap()).collect());
            assert_eq!(
                r.prefix_hashes.as_ref().map(Vec::len),
                buckets.as_ref().map(Vec::len)
            );
        }
        // Chained: a bucket's hash covers the buckets before it.
        let h = rows[1].prefix_hashes.as_ref().unwrap();
        assert_eq!(h[0], fnv1a(OFFSET, &44122773u64.to_le_bytes()));
        assert_eq!(h[1], fnv1a(h[0], &36225474u64.to_le_bytes()));
        assert_eq!(rows[0].error.as_deref(), Some("recorded status ERROR"));
        let unknown = |f: &str| stats.unknown.get(f).copied();
        assert_eq!(unknown("reported_token_input"), Some(1));
        assert_eq!(unknown("reported_token_output"), Some(2));
        assert_eq!(
            (unknown("finished_at"), unknown("status")),
            (Some(1), Some(1))
        );
        assert_eq!((stats.failures, stats.block_size), (1, Some(BLOCK_SIZE)));
    }

    /// A malformed row names its file, line and field; the file is not half-imported silently.
    #[test]
    fn malformed_rows_name_file_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let good = r#"{"status": "DEFAULT", "created_at": "2025-08-21T14:34:25.590Z", "finished_at": "2025-08-21T14:34:26.945Z", "reported_token_input": 1, "reported_token_output": 1}"#;
        for (bad, field) in [
            (
                r#"{"created_at": "yesterday", "reported_token_input": 1}"#,
                "created_at",
            ),
            (
                r#"{"created_at": "2025-08-21T14:34:25Z", "finished_at": "2025-08-21T14:34:24Z", "reported_token_input": 1}"#,
                "finished_at",
            ),
            (
                r#"{"created_at": "2025-08-21T14:34:25Z", "reported_token_input": -7}"#,
                "reported_token_input",
            ),
            (
                r#"{"finished_at": "2025-08-21T14:34:25Z", "reported_token_input": 1}"#,
                "created_at",
            ),
        ] {
            let p = dir.path().join("t.jsonl");
            std::fs::write(&p, format!("{good}\n{bad}\n")).unwrap();
            let opts = ImportOptions {
                format: Format::SwissAi,
                ..Default::default()
            };
            let e = import_file(&p, &opts, "s").unwrap_err().to_string();
            assert!(e.contains("t.jsonl:2: ") && e.contains(field), "{e}");
        }
    }
}
