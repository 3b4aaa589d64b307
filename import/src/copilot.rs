//! The GitHub Copilot coding-agent traces (Azure/AzurePublicDataset,
//! `GitHubCopilotCodingAgentDataset2026.md`, schema in
//! `analysis/GitHubCopilotCodingAgents/schema.json`): JSON lines (the release's
//! `shard-*.jsonl.gz` are read as they are, gzip and all), one agentic session per line:
//! `{"session_id", "date", "turns": [{"turn_id", "llm_calls": [...], "tool_batches": [...]}]}`.
//!
//! Every LLM call is one chat request, id `<prefix>:<line>.<n>` (the n-th call of the
//! session, from 1): `timestamp` (ISO-8601, UTC unless it names a zone) is the arrival,
//! `duration_ms` the end-to-end latency, `tokens.prompt` and `tokens.completion` the token
//! counts, `model` the (anonymized) model. `result` `Success` is `ok`; `UserCancel` (any
//! result naming a cancel) is a cancellation by the client at `duration_ms`, which a replay
//! repeats at that point; any other result is imported as `upstream_error` with the result
//! as its error. The session is `session_id`; its calls chain in arrival order, each
//! continuing the one before ([`crate::link`]), so the think time after a call's end holds
//! the tool batches and the user's turn.
//!
//! Not mapped (no column): `tokens.cached` and `tokens.cached_pct`, `tokens.total`,
//! `message_metadata` (prompt segments), `initiator_type`, `message_id`, `turn_id`,
//! `status_code`, `date`, and the tool batches (their time is in the think time).

use std::path::Path;

use trace_format::{Outcome, Result, TokenSource, TraceRecord};

use crate::azure::parse_timestamp;
use crate::link::{link, Chain};
use crate::rows::{jsonl_rows, Fields};

/// Endpoint of imported rows.
pub const ENDPOINT: &str = "/v1/chat/completions";

/// Reads a Copilot coding-agent trace (JSONL, or gzip-compressed JSONL named `*.gz`).
pub fn import(path: &Path, id_prefix: &str) -> Result<Vec<TraceRecord>> {
    let mut chains = Vec::new();
    let mut records = jsonl_rows(path, |row, out| {
        let s = Fields::of(row);
        let session = s.str("session_id")?;
        let mut n = 0;
        for (t, turn) in s.array("turns")?.iter().enumerate() {
            let turn = s.element("turns", t, turn)?;
            for (c, call) in turn.array("llm_calls")?.iter().enumerate() {
                let call = turn.element("llm_calls", c, call)?;
                n += 1;
                out.push(llm_call(
                    &call,
                    &format!("{id_prefix}:{}.{n}", row.at.line),
                )?);
                out.last_mut().expect("just pushed").session_id = Some(session.clone());
                chains.push(Chain {
                    key: Some(session.clone()),
                    spawned_from: None,
                });
            }
        }
        Ok(())
    })?;
    link(&mut records, &chains);
    Ok(records)
}

/// The record of one LLM call.
fn llm_call(call: &Fields<'_>, id: &str) -> Result<TraceRecord> {
    let ts = call.str("timestamp")?;
    let arrival =
        parse_timestamp(&ts).map_err(|e| call.bad("timestamp", format!("{ts:?}: {e}")))?;
    let mut r = TraceRecord::new(id, arrival, ENDPOINT);
    r.stream = true;
    r.model = call.opt_str("model")?;
    let tokens = call.object("tokens")?;
    r.prompt_tokens = Some(tokens.count("prompt")?);
    r.output_tokens = Some(tokens.count("completion")?);
    r.prompt_tokens_source = Some(TokenSource::Recorded);
    r.output_tokens_source = Some(TokenSource::Recorded);
    r.e2el_us = Some(
        call.opt_duration_us("duration_ms", 1e3)?
            .ok_or_else(|| call.bad("duration_ms", "missing"))?,
    );
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
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: &str = r#"{"session_id": "s1", "date": "2026-06-01", "turns": [{"turn_id": "t1", "llm_calls": [{"message_id": "m1", "timestamp": "2026-06-01T10:00:00.000Z", "duration_ms": 1500.0, "initiator_type": "user", "model": "Model A", "result": "Success", "status_code": "OK", "tokens": {"total": 1100, "prompt": 1000, "completion": 100, "cached": 0, "cached_pct": 0.0}, "message_metadata": []}, {"message_id": "m2", "timestamp": "2026-06-01T10:00:04.000Z", "duration_ms": 800.5, "initiator_type": "agent", "model": "Model A", "result": "UserCancel", "status_code": "OK", "tokens": {"total": 1250, "prompt": 1200, "completion": 50, "cached": 1000, "cached_pct": 83.3}}], "tool_batches": [{"timestamp": "2026-06-01T10:00:01.600Z", "duration_ms": 2000.0, "auto_continue": true, "result": "Success", "request_id": "m1", "function_calls": [{"name": "bash", "status": 1, "duration_ms": 1900.0}]}]}, {"turn_id": "t2", "llm_calls": [{"message_id": "m3", "timestamp": "2026-06-01T10:01:00Z", "duration_ms": 100, "initiator_type": "user", "model": "Model B", "result": "Error", "status_code": "Failed", "tokens": {"total": 10, "prompt": 9, "completion": 1, "cached": 0, "cached_pct": 0.0}}], "tool_batches": []}]}"#;

    #[test]
    fn calls_chain_in_their_session_and_a_user_cancel_is_a_cancellation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.jsonl");
        std::fs::write(&p, format!("{SESSION}\n")).unwrap();
        let r = import(&p, "c").unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[1].request_id, "c:1.2");
        assert_eq!(r[1].arrival_time_us - r[0].arrival_time_us, 4_000_000);
        assert_eq!(r[1].parent_request_id.as_deref(), Some("c:1.1"));
        assert_eq!(r[1].think_time_us, Some(2_500_000));
        assert_eq!(r[1].outcome, Outcome::ClientCancelled);
        assert_eq!(r[1].e2el_us, Some(800_500));
        assert_eq!(r[2].outcome, Outcome::UpstreamError);
        assert_eq!(r[2].model.as_deref(), Some("Model B"));
        assert_eq!(
            (r[0].prompt_tokens, r[0].output_tokens),
            (Some(1000), Some(100))
        );
        assert!(r.iter().all(|r| r.session_id.as_deref() == Some("s1")));
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
                SESSION.replace("2026-06-01T10:00:04.000Z", "yesterday"),
                "turns[0].llm_calls[1].timestamp \"yesterday\"",
            ),
            (
                SESSION.replace("\"duration_ms\": 100,", "\"duration_ms\": null,"),
                "turns[1].llm_calls[0].duration_ms missing",
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
