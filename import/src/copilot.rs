//! The GitHub Copilot coding-agent traces (Azure/AzurePublicDataset,
//! `GitHubCopilotCodingAgentDataset2026.md`, schema in
//! `analysis/GitHubCopilotCodingAgents/schema.json`, loader `trace_loader.py`): JSON lines (the
//! release's `shard-*.jsonl.gz` are read as they are, gzip and all), one agentic session per
//! line: `{"session_id", "date", "turns": [{"turn_id", "llm_calls": [...], "tool_batches":
//! [...]}]}`.
//!
//! Every LLM call is one chat request, id `<prefix>:<line>.<n>` (the n-th call of the
//! session, from 1). **`timestamp` marks the end of the call**, so the arrival is `timestamp`
//! minus `duration_ms` (ISO-8601, UTC unless it names a zone), `duration_ms` the end-to-end
//! latency. The publisher's loader reads `timestamp` as the start; the data says otherwise: a
//! call's tool batch (`request_id` = the call's `message_id`) starts after the call's
//! `timestamp` but before `timestamp + duration_ms` — inside the call, were `timestamp` its
//! start — and consecutive calls of one sequential session would overlap. Each import counts
//! this evidence anew (a note: tool batches starting inside the call under the start reading,
//! and before the call's `timestamp`, which would contradict the end reading). `tokens.prompt`
//! and `tokens.completion` are the token counts, `model` the (anonymized) model. `result`
//! `Success` is `ok`; `UserCancel` (any result naming a cancel) is a cancellation by the client
//! at `duration_ms`, which a replay repeats at that point; any other result is imported as
//! `upstream_error` with the result as its error. The session is `session_id`; its calls chain
//! in arrival order, each continuing the one before ([`crate::link`]), so the think time after
//! a call's end holds the tool batches and the user's turn.
//!
//! Incomplete calls import with what they have, the rest counted as unknown: a call without
//! `tokens` or `tokens.prompt` (cancelled and failed calls in the release) has its counts
//! unknown; one without `duration_ms` arrives at its `timestamp` (its end: the start is
//! unknown) with no latency; a turn with `llm_calls: null` has no calls.
//!
//! Not mapped (no column): `tokens.cached` and `tokens.cached_pct`, `tokens.total`,
//! `message_metadata` (prompt segments), `initiator_type`, `message_id`, `turn_id`,
//! `status_code`, `date`, and the tool batches (their time is in the think time).

use std::collections::HashMap;
use std::path::Path;

use trace_format::{Outcome, Result, TokenSource, TraceRecord};

use crate::azure::parse_timestamp;
use crate::link::{link, Chain, Links};
use crate::out::Out;
use crate::rows::{jsonl_rows, Fields};

/// Endpoint of imported rows.
pub const ENDPOINT: &str = "/v1/chat/completions";

/// Where tool batches start relative to the call they follow: the evidence for which end of
/// a call `timestamp` marks.
#[derive(Debug, Default)]
struct Evidence {
    /// Batches naming a call of their session.
    batches: usize,
    /// Starting at or after the call's `timestamp` and before `timestamp + duration_ms`.
    inside_if_start: usize,
    /// Starting before the call's `timestamp`.
    before_timestamp: usize,
}

/// Reads a Copilot coding-agent trace (JSONL, or gzip-compressed JSONL named `*.gz`).
pub(crate) fn import(path: &Path, id_prefix: &str, out: &mut Out<'_>) -> Result<()> {
    let mut unknown: Vec<&'static str> = Vec::new();
    let mut evidence = Evidence::default();
    jsonl_rows(path, out, |row, rows| {
        let s = Fields::of(row);
        let session = s.str("session_id")?;
        let mut ends: HashMap<String, (i64, i64)> = HashMap::new();
        let mut batches: Vec<i64> = Vec::new();
        let mut batch_calls: Vec<String> = Vec::new();
        let turns: &[serde_json::Value] = match s.get("turns") {
            None => &[],
            Some(_) => s.array("turns")?,
        };
        for (t, turn) in turns.iter().enumerate() {
            let turn = s.element("turns", t, turn)?;
            let calls: &[serde_json::Value] = match turn.get("llm_calls") {
                None => {
                    unknown.push("turns[].llm_calls");
                    &[]
                }
                Some(_) => turn.array("llm_calls")?,
            };
            for (c, call) in calls.iter().enumerate() {
                let call = turn.element("llm_calls", c, call)?;
                let id = format!("{id_prefix}:{}.{}", row.at.line, rows.len() + 1);
                let (r, ts) = llm_call(&call, &id, &mut unknown)?;
                if let (Some(m), Some(d)) = (call.opt_str("message_id")?, r.e2el_us) {
                    ends.insert(m, (ts, d));
                }
                let mut r = r;
                r.session_id = Some(session.clone());
                rows.push(r);
            }
            if turn.get("tool_batches").is_some() {
                for (b, batch) in turn.array("tool_batches")?.iter().enumerate() {
                    let batch = turn.element("tool_batches", b, batch)?;
                    let (Some(req), Some(ts)) =
                        (batch.opt_str("request_id")?, batch.opt_str("timestamp")?)
                    else {
                        continue;
                    };
                    let at = parse_timestamp(&ts)
                        .map_err(|e| batch.bad("timestamp", format!("{ts:?}: {e}")))?;
                    batches.push(at);
                    batch_calls.push(req);
                }
            }
        }
        for (at, call) in batches.iter().zip(&batch_calls) {
            if let Some(&(ts, d)) = ends.get(call) {
                evidence.batches += 1;
                if *at < ts {
                    evidence.before_timestamp += 1;
                } else if *at < ts.saturating_add(d) {
                    evidence.inside_if_start += 1;
                }
            }
        }
        let chains: Vec<Chain> = rows
            .iter()
            .map(|_| Chain {
                key: Some(session.clone()),
                ..Chain::default()
            })
            .collect();
        link(rows, &chains, Links::default());
        Ok(())
    })?;
    for field in unknown {
        out.unknown(field);
    }
    if evidence.batches > 0 {
        out.stats.notes.push(format!(
            "timestamp read as the end of each call: of {} tool batches naming their call, {} start inside the call were timestamp its start, {} before the call's timestamp",
            evidence.batches, evidence.inside_if_start, evidence.before_timestamp
        ));
    }
    Ok(())
}

/// The record of one LLM call, and its `timestamp` (its end), µs.
fn llm_call(
    call: &Fields<'_>,
    id: &str,
    unknown: &mut Vec<&'static str>,
) -> Result<(TraceRecord, i64)> {
    let ts = call.str("timestamp")?;
    let end = parse_timestamp(&ts).map_err(|e| call.bad("timestamp", format!("{ts:?}: {e}")))?;
    let duration = call.opt_duration_us("duration_ms", 1e3)?;
    if duration.is_none() {
        unknown.push("llm_calls[].duration_ms");
    }
    let mut r = TraceRecord::new(id, end.saturating_sub(duration.unwrap_or(0)), ENDPOINT);
    r.stream = true;
    r.model = call.opt_str("model")?;
    match call.get("tokens") {
        None => unknown.push("llm_calls[].tokens"),
        Some(_) => {
            let tokens = call.object("tokens")?;
            r.prompt_tokens = tokens.opt_count("prompt")?;
            r.output_tokens = tokens.opt_count("completion")?;
            if r.prompt_tokens.is_none() {
                unknown.push("llm_calls[].tokens.prompt");
            }
            if r.output_tokens.is_none() {
                unknown.push("llm_calls[].tokens.completion");
            }
        }
    }
    r.prompt_tokens_source = r.prompt_tokens.map(|_| TokenSource::Recorded);
    r.output_tokens_source = r.output_tokens.map(|_| TokenSource::Recorded);
    r.e2el_us = duration;
    let result = call.opt_str("result")?;
    match result.as_deref() {
        None | Some("Success") => {}
        Some(x) if x.to_ascii_lowercase().contains("cancel") => {
            r.outcome = Outcome::ClientCancelled;
            r.error = Some(format!("recorded result {x}"));
        }
        Some(x) => {
            r.outcome = Outcome::UpstreamError;
            r.error = Some(format!("recorded result {x}"));
        }
    }
    Ok((r, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Format, ImportOptions, SourceStats};

    fn import_stats(p: &Path) -> Result<(Vec<TraceRecord>, SourceStats)> {
        let opts = ImportOptions {
            format: Format::Copilot,
            ..Default::default()
        };
        crate::import_file(p, &opts, "c")
    }

    fn import(p: &Path, _prefix: &str) -> Result<Vec<TraceRecord>> {
        import_stats(p).map(|(r, _)| r)
    }

    /// A session as the release has them: each call's `timestamp` is its end; m1's tool batch
    /// starts 0.1 s after m1's timestamp (inside m1, were the timestamp its start) and ends
    /// before m2 starts.
    const SESSION: &str = r#"{"session_id": "s1", "date": "2026-06-01", "turns": [{"turn_id": "t1", "llm_calls": [{"message_id": "m1", "timestamp": "2026-06-01T10:00:01.500Z", "duration_ms": 1500.0, "initiator_type": "user", "model": "Model A", "result": "Success", "status_code": "OK", "tokens": {"total": 1100, "prompt": 1000, "completion": 100, "cached": 0, "cached_pct": 0.0}, "message_metadata": []}, {"message_id": "m2", "timestamp": "2026-06-01T10:00:04.800Z", "duration_ms": 800.5, "initiator_type": "agent", "model": "Model A", "result": "UserCancel", "status_code": "OK", "tokens": {"total": 1250, "prompt": 1200, "completion": 50, "cached": 1000, "cached_pct": 83.3}}], "tool_batches": [{"timestamp": "2026-06-01T10:00:01.600Z", "duration_ms": 2000.0, "auto_continue": true, "result": "Success", "request_id": "m1", "function_calls": [{"name": "bash", "status": 1, "duration_ms": 1900.0}]}]}, {"turn_id": "t2", "llm_calls": [{"message_id": "m3", "timestamp": "2026-06-01T10:01:00Z", "duration_ms": 100, "initiator_type": "user", "model": "Model B", "result": "Error", "status_code": "Failed", "tokens": {"total": 10, "prompt": 9, "completion": 1, "cached": 0, "cached_pct": 0.0}}], "tool_batches": []}]}"#;

    #[test]
    fn calls_end_at_their_timestamp_chain_in_their_session_and_a_user_cancel_is_a_cancellation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.jsonl");
        std::fs::write(&p, format!("{SESSION}\n")).unwrap();
        let (r, stats) = import_stats(&p).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[1].request_id, "c:1.2");
        // Arrivals: the timestamp minus the duration.
        let at = |s: &str| parse_timestamp(s).unwrap();
        assert_eq!(r[0].arrival_time_us, at("2026-06-01T10:00:00Z"));
        assert_eq!(
            r[1].arrival_time_us,
            at("2026-06-01T10:00:04.800Z") - 800_500
        );
        assert_eq!(r[1].parent_request_id.as_deref(), Some("c:1.1"));
        // The gap after m1's end (its timestamp) holds the tool batch: 4.8 - 0.8005 - 1.5 s.
        assert_eq!(r[1].think_time_us, Some(2_499_500));
        assert_eq!(r[1].outcome, Outcome::ClientCancelled);
        assert_eq!(r[1].e2el_us, Some(800_500));
        assert_eq!(r[2].outcome, Outcome::UpstreamError);
        assert_eq!(r[2].model.as_deref(), Some("Model B"));
        assert_eq!(
            (r[0].prompt_tokens, r[0].output_tokens),
            (Some(1000), Some(100))
        );
        assert!(r.iter().all(|r| r.session_id.as_deref() == Some("s1")));
        assert!(
            stats.notes.iter().any(|n| n.contains("of 1 tool batches naming their call, 1 start inside the call were timestamp its start, 0 before")),
            "{:?}",
            stats.notes
        );
    }

    /// Cancelled and failed calls as the release has them (no `tokens.prompt`, no tokens at
    /// all, `llm_calls: null`) import with what they have; the unknowns are counted.
    #[test]
    fn incomplete_calls_import_with_what_they_have() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.jsonl");
        let s = SESSION
            .replace("\"total\": 1250, \"prompt\": 1200, ", "\"total\": 50, ")
            .replace(", \"tokens\": {\"total\": 10, \"prompt\": 9, \"completion\": 1, \"cached\": 0, \"cached_pct\": 0.0}", "");
        let empty = r#"{"session_id": "s2", "date": "2026-06-01", "turns": [{"turn_id": "t", "llm_calls": null, "tool_batches": []}]}"#;
        std::fs::write(&p, format!("{s}\n{empty}\n")).unwrap();
        let (r, stats) = import_stats(&p).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!((r[1].prompt_tokens, r[1].output_tokens), (None, Some(50)));
        assert_eq!((r[2].prompt_tokens, r[2].output_tokens), (None, None));
        assert_eq!(stats.unknown.get("llm_calls[].tokens.prompt"), Some(&1));
        assert_eq!(stats.unknown.get("llm_calls[].tokens"), Some(&1));
        assert_eq!(stats.unknown.get("turns[].llm_calls"), Some(&1));
        assert_eq!(stats.prompt_tokens, 1000);
    }

    #[test]
    fn gzip_shards_read_as_published() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("shard-0000.jsonl.gz");
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&p).unwrap(),
            flate2::Compression::fast(),
        );
        writeln!(gz, "{SESSION}").unwrap();
        gz.finish().unwrap();
        assert_eq!(import(&p, "c").unwrap().len(), 3);
    }

    #[test]
    fn bad_sessions_name_the_file_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.jsonl");
        for (bad, want) in [
            (
                "{\"session_id\": \"s\"".to_string(),
                "bad.jsonl:2: not JSON",
            ),
            (
                SESSION.replace("\"session_id\": \"s1\", ", ""),
                "bad.jsonl:2: session_id missing",
            ),
            (
                SESSION.replace("\"prompt\": 1200", "\"prompt\": \"x\""),
                "bad.jsonl:2: turns[0].llm_calls[1].tokens.prompt",
            ),
            (
                SESSION.replace("2026-06-01T10:00:04.800Z", "yesterday"),
                "turns[0].llm_calls[1].timestamp \"yesterday\"",
            ),
            (
                SESSION.replace("\"turns\": [", "\"turns\": 5, \"x\": ["),
                "bad.jsonl:2: turns 5 is not an array",
            ),
        ] {
            std::fs::write(&p, format!("{SESSION}\n{bad}\n")).unwrap();
            let e = import(&p, "c").unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
