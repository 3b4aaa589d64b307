//! NVIDIA Dynamo agent traces (`dynamo.agent.trace.v1`, ai-dynamo/dynamo
//! `lib/llm/src/agents`): JSON lines, one event each, as Dynamo's `DYN_AGENT_TRACE_JSONL`
//! sink writes them (a line may also wrap its event as `{"event": {...}}`).
//!
//! `request_end` events are requests: `agent_context` {`session_id`, `trajectory_id`,
//! `parent_trajectory_id`} (the first releases' names `workflow_id`, `program_id`,
//! `parent_program_id` are read too) and `request` {`model`, `input_tokens`,
//! `output_tokens`, `request_received_ms` (ms since the epoch), `ttft_ms`, `total_time_ms`,
//! `replay` {`trace_block_size`, `input_sequence_hashes`}}. Each becomes one chat request,
//! id `<prefix>:<line>`, arriving at `request_received_ms` (else the event time minus
//! `total_time_ms`), with the captured TTFT and end-to-end latency. `session_id` is the
//! session; the requests of a trajectory chain turn after turn, and a subagent
//! trajectory's first request continues the latest earlier request of its parent
//! trajectory ([`crate::link`]); the think time is the gap after that request's end, which
//! holds the tool spans between them. The sequence hashes become `prefix_hashes`, with the
//! file's `trace_block_size` as the block size (one per file).
//!
//! `tool_start`, `tool_end` and `tool_error` events (tool spans) are not requests: they are
//! counted, and their time is inside the think time of the request after them.
//!
//! Not mapped (no column): `cached_tokens`, `session_type_id`, `trajectory_final`, Dynamo's
//! own `request_id` and `x_request_id`, `prefill_wait_time_ms`, `prefill_time_ms`,
//! `avg_itl_ms`, `kv_hit_rate`, `kv_transfer_estimated_latency_ms`, `queue_depth`, `worker`,
//! `finish_reason_metadata`, and every field of the tool spans (class, status, duration,
//! output size). A dropped stream is not marked in the record, so no row is imported as
//! cancelled.

use std::path::Path;

use serde_json::Value;
use trace_format::{Result, TraceRecord};

use crate::link::{link, Chain};
use crate::rows::{jsonl_rows, Fields, JsonRow};

/// The schema this importer reads.
pub const SCHEMA: &str = "dynamo.agent.trace.v1";
/// Endpoint of imported rows (Dynamo emits agent traces for chat completions).
pub const ENDPOINT: &str = "/v1/chat/completions";

/// What a Dynamo agent trace held.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DynamoImport {
    /// One row per `request_end`.
    pub records: Vec<TraceRecord>,
    /// Block size of the sequence hashes (`trace_block_size`), when any row has them.
    pub block_size: Option<u32>,
    /// Tool events (`tool_start`, `tool_end`, `tool_error`) read.
    pub tool_events: usize,
}

/// The event of a line: the line's object, or the object in its `event` field.
fn event<'a>(row: &JsonRow<'a>) -> Result<Fields<'a>> {
    let f = Fields::of(row);
    match row.obj.get("event") {
        Some(Value::Object(_)) if !row.obj.contains_key("schema") => f.object("event"),
        _ => Ok(f),
    }
}

/// The first present of `names` in `f` (a current name, then its older spelling).
fn id_field(f: &Fields<'_>, names: &[&str]) -> Result<Option<String>> {
    for n in names {
        if let Some(v) = f.opt_str(n)? {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// Reads a Dynamo agent trace.
pub fn import(path: &Path, id_prefix: &str) -> Result<DynamoImport> {
    let mut chains = Vec::new();
    let mut block: Option<(u32, usize)> = None;
    let mut tool_events = 0;
    let mut records = jsonl_rows(path, |row, out| {
        let ev = event(row)?;
        let schema = ev.str("schema")?;
        if schema != SCHEMA {
            return Err(ev.bad("schema", format!("{schema:?} is not {SCHEMA:?}")));
        }
        match ev.str("event_type")?.as_str() {
            "request_end" => {}
            "tool_start" | "tool_end" | "tool_error" => {
                tool_events += 1;
                return Ok(());
            }
            other => {
                return Err(ev.bad(
                    "event_type",
                    format!("{other:?} is not request_end, tool_start, tool_end or tool_error"),
                ))
            }
        }
        let ctx = ev.object("agent_context")?;
        let session = id_field(&ctx, &["session_id", "workflow_id"])?
            .ok_or_else(|| ctx.bad("session_id", "missing"))?;
        let trajectory = id_field(&ctx, &["trajectory_id", "program_id"])?
            .ok_or_else(|| ctx.bad("trajectory_id", "missing"))?;
        let parent = id_field(&ctx, &["parent_trajectory_id", "parent_program_id"])?;
        let req = ev.object("request")?;
        let total = req.opt_duration_us("total_time_ms", 1e3)?;
        let arrival = match req.opt_count("request_received_ms")? {
            Some(ms) => ms.checked_mul(1000),
            None => {
                let end = ev.count("event_time_unix_ms")?;
                let total = total.ok_or_else(|| {
                    req.bad(
                        "request_received_ms",
                        "missing, and no total_time_ms to place the request before its end",
                    )
                })?;
                end.checked_mul(1000).map(|e| (e - total).max(0))
            }
        }
        .ok_or_else(|| req.bad("request_received_ms", "is out of range"))?;
        let mut r = TraceRecord::new(format!("{id_prefix}:{}", row.at.line), arrival, ENDPOINT);
        r.stream = true;
        r.model = req.opt_str("model")?;
        r.prompt_tokens = req.opt_count("input_tokens")?;
        r.output_tokens = req.opt_count("output_tokens")?;
        r.prompt_tokens_source = r.prompt_tokens.map(|_| trace_format::TokenSource::Recorded);
        r.output_tokens_source = r.output_tokens.map(|_| trace_format::TokenSource::Recorded);
        r.ttft_us = req.opt_duration_us("ttft_ms", 1e3)?;
        r.e2el_us = total;
        if req.get("replay").is_some() {
            let replay = req.object("replay")?;
            let size = replay.count("trace_block_size")?;
            let size = u32::try_from(size)
                .ok()
                .filter(|s| *s > 0)
                .ok_or_else(|| replay.bad("trace_block_size", format!("{size} is out of range")))?;
            match block {
                Some((b, line)) if b != size => {
                    return Err(replay.bad(
                        "trace_block_size",
                        format!("{size} differs from {b} on line {line} (one block size per file)"),
                    ))
                }
                _ => block = Some((size, row.at.line)),
            }
            r.prefix_hashes = replay.opt_hashes("input_sequence_hashes")?;
        }
        r.session_id = Some(session.clone());
        chains.push(Chain {
            key: Some(format!("{session}/{trajectory}")),
            spawned_from: parent.map(|p| format!("{session}/{p}")),
        });
        out.push(r);
        Ok(())
    })?;
    link(&mut records, &chains);
    Ok(DynamoImport {
        records,
        block_size: block.map(|(b, _)| b),
        tool_events,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req_end(session: &str, traj: &str, parent: Option<&str>, at_ms: u64, total: f64) -> String {
        let parent = parent
            .map(|p| format!(", \"parent_trajectory_id\": \"{p}\""))
            .unwrap_or_default();
        format!(
            "{{\"schema\": \"dynamo.agent.trace.v1\", \"event_type\": \"request_end\", \"event_time_unix_ms\": {end}, \"event_source\": \"dynamo\", \"agent_context\": {{\"session_type_id\": \"coding\", \"session_id\": \"{session}\", \"trajectory_id\": \"{traj}\"{parent}}}, \"request\": {{\"request_id\": \"r\", \"model\": \"m\", \"input_tokens\": 100, \"output_tokens\": 10, \"cached_tokens\": 64, \"request_received_ms\": {at_ms}, \"ttft_ms\": 12.5, \"total_time_ms\": {total}, \"replay\": {{\"trace_block_size\": 64, \"input_length\": 100, \"input_sequence_hashes\": [1, 2]}}}}}}",
            end = at_ms + total as u64
        )
    }

    #[test]
    fn requests_link_by_trajectory_and_tools_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.jsonl");
        let tool = "{\"schema\": \"dynamo.agent.trace.v1\", \"event_type\": \"tool_end\", \"event_time_unix_ms\": 1000300, \"event_source\": \"harness\", \"agent_context\": {\"session_type_id\": \"coding\", \"session_id\": \"s\", \"trajectory_id\": \"main\"}, \"tool\": {\"tool_call_id\": \"c\", \"tool_class\": \"bash\", \"status\": \"succeeded\", \"duration_ms\": 100.0}}";
        let lines = [
            req_end("s", "main", None, 1_000_000, 200.0),
            tool.to_string(),
            req_end("s", "main", None, 1_000_500, 100.0),
            req_end("s", "sub", Some("main"), 1_000_250, 50.0),
            format!(
                "{{\"event\": {}}}",
                req_end("t", "main", None, 1_000_000, 1.0)
            ),
        ];
        std::fs::write(&p, lines.join("\n")).unwrap();
        let d = import(&p, "d").unwrap();
        assert_eq!(
            (d.records.len(), d.tool_events, d.block_size),
            (4, 1, Some(64))
        );
        let r = &d.records;
        assert_eq!(r[0].arrival_time_us, 1_000_000_000);
        assert_eq!((r[0].ttft_us, r[0].e2el_us), (Some(12_500), Some(200_000)));
        assert_eq!(r[1].request_id, "d:3");
        assert_eq!(r[1].parent_request_id.as_deref(), Some("d:1"));
        assert_eq!(r[1].think_time_us, Some(300_000));
        // The subagent's first request continues the main trajectory's latest request.
        assert_eq!(r[2].parent_request_id.as_deref(), Some("d:1"));
        assert_eq!(r[2].think_time_us, Some(50_000));
        assert_eq!(r[3].session_id.as_deref(), Some("t"));
        assert_eq!(r[3].parent_request_id, None);
        assert_eq!(r[0].prefix_hashes, Some(vec![1, 2]));
    }

    #[test]
    fn bad_events_name_the_file_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.jsonl");
        let good = req_end("s", "main", None, 1_000, 1.0);
        for (line2, want) in [
            ("{oops".to_string(), "bad.jsonl:2: not JSON"),
            (
                good.replace("dynamo.agent.trace.v1", "dynamo.agent.trace.v9"),
                "bad.jsonl:2: schema",
            ),
            (
                good.replace("\"trajectory_id\": \"main\"", "\"x\": 1"),
                "bad.jsonl:2: agent_context.trajectory_id missing",
            ),
            (
                good.replace("\"input_tokens\": 100", "\"input_tokens\": \"many\""),
                "bad.jsonl:2: request.input_tokens",
            ),
            (
                good.replace("\"ttft_ms\": 12.5", "\"ttft_ms\": -1"),
                "request.ttft_ms",
            ),
            (
                good.replace("\"trace_block_size\": 64", "\"trace_block_size\": 16"),
                "request.replay.trace_block_size 16 differs from 64 on line 1",
            ),
            (good.replace("request_end", "request_start"), "event_type"),
            (
                good.replace("\"request_received_ms\": 1000, ", ""),
                "bad.jsonl:2: request.request_received_ms",
            ),
        ] {
            let content = format!("{good}\n{line2}\n");
            let content = if want.contains("request_received_ms") {
                format!(
                    "{good}\n{}\n",
                    line2.replace("\"total_time_ms\": 1", "\"x\": 1")
                )
            } else {
                content
            };
            std::fs::write(&p, content).unwrap();
            let e = import(&p, "d").unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
