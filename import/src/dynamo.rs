//! NVIDIA Dynamo's request traces: JSON lines (or `.jsonl.gz` segments), one event each, as
//! Dynamo's file sinks write them — wrapped as `{"timestamp", "event": {...}}`, or bare. Two
//! schemas, both read:
//! - `dynamo.request.trace.v1`, the current one (ai-dynamo/dynamo
//!   `lib/llm/src/request_trace/types.rs`; NVIDIA AIPerf's reader
//!   `dataset/graph/adapters/dynamo/trace_reader.py`): `agent_context` {`session_id`,
//!   `parent_session_id`, and in real captures `trajectory_id`, `parent_trajectory_id`} is
//!   optional (absent on replay-only records), as is `request.model`; `request_payload`
//!   events carry a request's body;
//! - `dynamo.agent.trace.v1`, the first releases' (`lib/llm/src/agents`): `agent_context`
//!   {`session_id`, `trajectory_id`, `parent_trajectory_id`; first spelled `workflow_id`,
//!   `program_id`, `parent_program_id`}.
//!
//! `request_end` events are requests: `request` {`request_id`, `model`, `input_tokens`,
//! `output_tokens`, `request_received_ms` (ms since the epoch), `ttft_ms`, `total_time_ms`,
//! `replay` {`trace_block_size`, `input_length`, `input_sequence_hashes`}}. Each becomes one
//! chat request, id `<prefix>:<line>`, arriving at `request_received_ms` (else the event time
//! minus `total_time_ms`), with the captured TTFT and end-to-end latency; the prompt length is
//! `input_tokens`, else `replay.input_length`. A trajectory (`trajectory_id`, else
//! `session_id`) is a chain of turns; a sub-agent's (`parent_trajectory_id`, else
//! `parent_session_id`) first request continues the latest request of its parent that had
//! ended when it arrived, and a parent request made after a sub-agent finished (later than the
//! parent's previous request ended) waits on the sub-agent's last request: Dynamo's own
//! replay links and joins them so ([`crate::link`]). The session is the root trajectory's
//! `session_id`. The think time is the gap after the parent's end, which holds the tool spans.
//! The sequence hashes become `prefix_hashes`, with the file's `trace_block_size` as the block
//! size (one per file). A `request_payload` whose payload is complete gives its request's
//! body (`payload.request`, replayed as recorded) to the `request_end` of the same
//! `request_id`.
//!
//! Incomplete records import with what they have, the rest counted: no `agent_context` (the
//! row is in no session), no token counts. `tool_start`, `tool_end` and `tool_error` events
//! (tool spans) are not requests: they are counted, and their time is inside the think time of
//! the request after them. Lines without a `schema` (an uploader's marker lines) are counted
//! and passed over. The whole file is read before its rows go on (they are linked across it).
//!
//! Not mapped (no column): `cached_tokens`, `session_type_id`, `session_final`,
//! `trajectory_final`, Dynamo's own `request_id` and `x_request_id`, `prefill_wait_time_ms`,
//! `prefill_time_ms`, `avg_itl_ms`, `kv_hit_rate`, `kv_transfer_estimated_latency_ms`,
//! `queue_depth`, `worker`, `kv_hints`, `finish_reason_metadata`, a payload's `response` and
//! headers, and every field of the tool spans (class, status, duration, output size). A
//! dropped stream is not marked in the record, so no row is imported as cancelled.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;
use trace_format::{Result, TokenSource, TraceRecord};

use crate::link::{link, Chain, Links};
use crate::out::{Out, Sink};
use crate::rows::{jsonl_rows, Fields, JsonRow};

/// The first releases' schema.
pub const AGENT_SCHEMA: &str = "dynamo.agent.trace.v1";
/// The current schema.
pub const REQUEST_SCHEMA: &str = "dynamo.request.trace.v1";
/// The schemas this importer reads.
pub const SCHEMAS: [&str; 2] = [REQUEST_SCHEMA, AGENT_SCHEMA];
/// Endpoint of imported rows (Dynamo traces chat completions).
pub const ENDPOINT: &str = "/v1/chat/completions";

/// The event of a line: the line's object, or the object in its `event` field (the sink's
/// envelope).
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

/// What the events of a file add up to besides its requests.
#[derive(Default)]
struct Tally {
    block: Option<(u32, usize)>,
    tool_events: usize,
    markers: usize,
    /// Request bodies of complete `request_payload` events, by Dynamo's request id.
    payloads: HashMap<String, String>,
    /// Dynamo's request id of each request row.
    request_ids: Vec<Option<String>>,
    /// The session of each row's trajectory.
    sessions: Vec<Option<String>>,
    unknown: Vec<&'static str>,
}

/// Reads a Dynamo request or agent trace into `out`; the file's block size and what is not
/// a request go to its statistics.
pub(crate) fn import(path: &Path, id_prefix: &str, out: &mut Out<'_>) -> Result<()> {
    let mut chains = Vec::new();
    let mut t = Tally::default();
    let mut records = Vec::new();
    jsonl_rows(path, &mut records, |row, rows| {
        let ev = event(row)?;
        let Some(schema) = ev.opt_str("schema")? else {
            t.markers += 1;
            return Ok(());
        };
        if !SCHEMAS.contains(&schema.as_str()) {
            return Err(ev.bad(
                "schema",
                format!("{schema:?} is not {REQUEST_SCHEMA:?} or {AGENT_SCHEMA:?}"),
            ));
        }
        match ev.str("event_type")?.as_str() {
            "request_end" => {}
            "tool_start" | "tool_end" | "tool_error" => {
                t.tool_events += 1;
                return Ok(());
            }
            "request_payload" => return payload(&ev, &mut t),
            other => {
                return Err(ev.bad(
                    "event_type",
                    format!("{other:?} is not request_end, request_payload, tool_start, tool_end or tool_error"),
                ))
            }
        }
        let (r, chain) = request_end(&ev, format!("{id_prefix}:{}", row.at.line), &mut t)?;
        rows.push(r);
        chains.push(chain);
        Ok(())
    })?;
    let roots = roots(&chains, &t.sessions);
    for ((r, root), id) in records.iter_mut().zip(roots).zip(&t.request_ids) {
        r.session_id = root;
        if let Some(body) = id.as_ref().and_then(|id| t.payloads.get(id)) {
            r.body = Some(body.clone());
        }
    }
    let how = Links {
        subagent_from_ended: true,
        join_children: true,
    };
    link(&mut records, &chains, how);
    let bodies = records.iter().filter(|r| r.body.is_some()).count();
    out.push_all(records)?;
    for field in t.unknown {
        out.unknown(field);
    }
    out.stats.block_size = t.block.map(|(b, _)| b);
    let notes = &mut out.stats.notes;
    if t.tool_events > 0 {
        notes.push(format!(
            "{} tool events (tool spans) are not requests: their time is in the think time of the request after them",
            t.tool_events
        ));
    }
    if !t.payloads.is_empty() {
        notes.push(format!(
            "{} complete request payloads, {bodies} of them bodies of requests here (replayed as recorded)",
            t.payloads.len()
        ));
    }
    if t.markers > 0 {
        notes.push(format!(
            "{} lines without a schema (markers) passed over",
            t.markers
        ));
    }
    Ok(())
}

/// A `request_payload` event: its request body kept when the payload is complete.
fn payload(ev: &Fields<'_>, t: &mut Tally) -> Result<()> {
    let p = ev.object("payload")?;
    let id = p.str("request_id")?;
    let complete = matches!(p.get("payload_complete"), Some(Value::Bool(true)));
    if let (true, Some(request)) = (complete, p.get("request")) {
        t.payloads.insert(id, request.to_string());
    }
    Ok(())
}

/// One `request_end`: its row (session filled in later) and its chain.
fn request_end(ev: &Fields<'_>, id: String, t: &mut Tally) -> Result<(TraceRecord, Chain)> {
    let (session, chain) = match ev.get("agent_context") {
        None => {
            t.unknown.push("agent_context");
            (None, Chain::default())
        }
        Some(_) => {
            let ctx = ev.object("agent_context")?;
            let session = id_field(&ctx, &["session_id", "workflow_id"])?
                .ok_or_else(|| ctx.bad("session_id", "missing"))?;
            let trajectory = id_field(&ctx, &["trajectory_id", "program_id"])?;
            let parent = id_field(
                &ctx,
                &[
                    "parent_trajectory_id",
                    "parent_program_id",
                    "parent_session_id",
                ],
            )?;
            let chain = Chain {
                key: Some(trajectory.unwrap_or_else(|| session.clone())),
                spawned_from: parent,
                detached: false,
            };
            (Some(session), chain)
        }
    };
    let req = ev.object("request")?;
    let received = req.opt_count("request_received_ms")?;
    // A `request_end` is written when its request ends: without `total_time_ms` the duration
    // is the event's time minus the arrival (as Dynamo's own loader reads it).
    let total = match req.opt_duration_us("total_time_ms", 1e3)? {
        Some(t) => Some(t),
        None => match (received, ev.opt_count("event_time_unix_ms")?) {
            (Some(r), Some(e)) if e >= r => (e - r).checked_mul(1000),
            _ => None,
        },
    };
    if total.is_none() {
        t.unknown.push("request.total_time_ms");
    }
    let arrival = match received {
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
    let mut r = TraceRecord::new(id, arrival, ENDPOINT);
    r.stream = true;
    r.model = req.opt_str("model")?;
    r.prompt_tokens = req.opt_count("input_tokens")?;
    r.output_tokens = req.opt_count("output_tokens")?;
    r.ttft_us = req.opt_duration_us("ttft_ms", 1e3)?;
    r.e2el_us = total;
    if req.get("replay").is_some() {
        let replay = req.object("replay")?;
        replay.block_size("trace_block_size", &mut t.block)?;
        r.prefix_hashes = replay.opt_hashes("input_sequence_hashes")?;
        if r.prompt_tokens.is_none() {
            r.prompt_tokens = replay.opt_count("input_length")?;
        }
    }
    if r.prompt_tokens.is_none() {
        t.unknown.push("request.input_tokens");
    }
    if r.output_tokens.is_none() {
        t.unknown.push("request.output_tokens");
    }
    r.prompt_tokens_source = r.prompt_tokens.map(|_| TokenSource::Recorded);
    r.output_tokens_source = r.output_tokens.map(|_| TokenSource::Recorded);
    t.request_ids.push(req.opt_str("request_id")?);
    t.sessions.push(session);
    Ok((r, chain))
}

/// The session of each row: its trajectory's root's `session_id` (parent links followed to a
/// trajectory with none, or one not in the file; cycles stop).
fn roots(chains: &[Chain], sessions: &[Option<String>]) -> Vec<Option<String>> {
    let mut parent: HashMap<&str, &str> = HashMap::new();
    let mut session_of: HashMap<&str, &str> = HashMap::new();
    for (c, s) in chains.iter().zip(sessions) {
        let Some(key) = c.key.as_deref() else {
            continue;
        };
        if let Some(p) = c.spawned_from.as_deref() {
            parent.entry(key).or_insert(p);
        }
        if let Some(s) = s.as_deref() {
            session_of.entry(key).or_insert(s);
        }
    }
    chains
        .iter()
        .zip(sessions)
        .map(|(c, s)| {
            let mut key = c.key.as_deref()?;
            for _ in 0..=parent.len() {
                match parent.get(key) {
                    Some(p) if session_of.contains_key(p) => key = p,
                    _ => break,
                }
            }
            session_of
                .get(key)
                .map(|s| s.to_string())
                .or_else(|| s.clone())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{detect as detect_format, Format, ImportOptions, SourceStats};

    fn import(p: &Path) -> Result<(Vec<TraceRecord>, SourceStats)> {
        let opts = ImportOptions {
            format: Format::Dynamo,
            ..Default::default()
        };
        crate::import_file(p, &opts, "d")
    }

    /// One `request_end` of a file as Dynamo's loader reads it (`request_trace/load.rs`).
    struct Want {
        line: usize,
        id: String,
        at_ms: i64,
        end_ms: i64,
        prompt: Option<i64>,
        output: Option<i64>,
        session: Option<String>,
        parent_session: Option<String>,
    }

    /// The rows of a Dynamo request trace and, for each, the request it waits on last and the
    /// gap after that one's end, computed here from the file's JSON by Dynamo's own rules
    /// (`request_trace/load.rs`, `agentic.rs`): the duration is `total_time_ms`, else the
    /// event time minus `request_received_ms`; a session's requests follow each other; a child
    /// session's first request waits on the parent session's latest request ended by then;
    /// the parent's first request starting after the child's last-finishing request ended
    /// waits on that one too. A row's session is its session tree's root (llmreplay's
    /// sessions are whole agent trees; Dynamo keys each child session apart).
    fn dynamo_reading(p: &Path) -> (Vec<Want>, Vec<Option<(String, i64)>>) {
        let text = std::fs::read_to_string(p).unwrap();
        let mut want = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let v: Value = serde_json::from_str(line).unwrap();
            let ev = if v.get("schema").is_none() {
                &v["event"]
            } else {
                &v
            };
            if ev["event_type"] != "request_end" {
                continue;
            }
            let req = &ev["request"];
            let at_ms = req["request_received_ms"].as_i64().unwrap();
            let total = req["total_time_ms"]
                .as_f64()
                .map(|t| t.round() as i64)
                .unwrap_or_else(|| ev["event_time_unix_ms"].as_i64().unwrap() - at_ms);
            let ctx = &ev["agent_context"];
            want.push(Want {
                line: i + 1,
                id: req["request_id"].as_str().unwrap().to_string(),
                at_ms,
                end_ms: at_ms + total,
                prompt: req["input_tokens"]
                    .as_i64()
                    .or(req["replay"]["input_length"].as_i64()),
                output: req["output_tokens"].as_i64(),
                session: ctx["session_id"].as_str().map(str::to_string),
                parent_session: ctx["parent_session_id"].as_str().map(str::to_string),
            });
        }
        let mut deps: Vec<Vec<usize>> = vec![Vec::new(); want.len()];
        // The trace's session is the agent tree's: a child session's rows take its root's id.
        let parent_of: HashMap<String, String> = want
            .iter()
            .filter_map(|w| Some((w.session.clone()?, w.parent_session.clone()?)))
            .collect();
        let root = |mut s: String| {
            while let Some(p) = parent_of.get(&s) {
                s = p.clone();
            }
            s
        };
        let roots: Vec<Option<String>> = want.iter().map(|w| w.session.clone().map(root)).collect();
        let of = |s: &str| -> Vec<usize> {
            let mut v: Vec<usize> = (0..want.len())
                .filter(|&i| want[i].session.as_deref() == Some(s))
                .collect();
            v.sort_by_key(|&i| (want[i].at_ms, want[i].end_ms));
            v
        };
        let mut sessions: Vec<&str> = want.iter().filter_map(|w| w.session.as_deref()).collect();
        sessions.sort_unstable();
        sessions.dedup();
        for s in &sessions {
            let own = of(s);
            for k in 1..own.len() {
                deps[own[k]].push(own[k - 1]);
            }
            let Some(parent) = own.iter().find_map(|&i| want[i].parent_session.clone()) else {
                continue;
            };
            let parents = of(&parent);
            let first = own[0];
            let last = *own.iter().max_by_key(|&&i| want[i].end_ms).unwrap();
            if let Some(&spawn) = parents
                .iter()
                .filter(|&&j| want[j].end_ms <= want[first].at_ms)
                .max_by_key(|&&j| want[j].end_ms)
            {
                deps[first].push(spawn);
            }
            if let Some(&join) = parents
                .iter()
                .filter(|&&j| want[j].at_ms >= want[last].end_ms)
                .min_by_key(|&&j| want[j].at_ms)
            {
                deps[join].push(last);
            }
        }
        let parents = deps
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let &p = d.iter().max_by_key(|&&j| want[j].end_ms)?;
                Some((want[p].id.clone(), (want[i].at_ms - want[p].end_ms).max(0)))
            })
            .collect();
        let want = want
            .into_iter()
            .zip(roots)
            .map(|(w, session)| Want { session, ..w })
            .collect();
        (want, parents)
    }

    /// Dynamo's own fixtures (ai-dynamo/dynamo, Apache-2.0; `tests/data/dynamo/SOURCE.md`):
    /// every `request_end` one row, arrivals, durations, tokens, sessions, parents and think
    /// times as Dynamo reads the file (computed from the file above, not from the importer).
    #[test]
    fn dynamos_own_fixtures_import_as_dynamo_reads_them() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/dynamo");
        for name in [
            "request-trace-v1.jsonl",
            "request-trace-v1-wrapped.jsonl",
            "request-trace-v1-agentic.jsonl",
            "agentic-subagent-join.jsonl",
            "agentic-join-last-finishing.jsonl",
        ] {
            let p = dir.join(name);
            assert_eq!(detect_format(&p).unwrap(), Format::Dynamo, "{name}");
            let (rows, stats) = import(&p).unwrap();
            let (want, parents) = dynamo_reading(&p);
            assert_eq!(rows.len(), want.len(), "{name}");
            assert_eq!(stats.block_size, Some(2), "{name}");
            let id_at_line = |row_id: &str| {
                let line: usize = row_id.rsplit(':').next().unwrap().parse().unwrap();
                want.iter().find(|w| w.line == line).unwrap().id.clone()
            };
            for (r, (w, parent)) in rows.iter().zip(want.iter().zip(&parents)) {
                let what = format!("{name}: {}", w.id);
                assert_eq!(r.request_id, format!("d:{}", w.line), "{what}");
                assert_eq!(r.arrival_time_us, w.at_ms * 1000, "{what}");
                assert_eq!(r.e2el_us, Some((w.end_ms - w.at_ms) * 1000), "{what}");
                assert_eq!(
                    (r.prompt_tokens, r.output_tokens),
                    (w.prompt, w.output),
                    "{what}"
                );
                assert_eq!(r.session_id, w.session, "{what}");
                let got = r
                    .parent_request_id
                    .as_deref()
                    .map(|p| (id_at_line(p), r.think_time_us.unwrap()));
                let want_parent = parent.as_ref().map(|(id, ms)| (id.clone(), ms * 1000));
                assert_eq!(got, want_parent, "{what}");
            }
        }
        // The payload's request is the body of the request_end of the same request id.
        let p = dir.join("request-trace-v1.jsonl");
        let (rows, _) = import(&p).unwrap();
        let first: Value =
            serde_json::from_str(std::fs::read_to_string(&p).unwrap().lines().next().unwrap())
                .unwrap();
        let body: Value = serde_json::from_str(rows[0].body.as_deref().unwrap()).unwrap();
        assert_eq!(body, first["payload"]["request"]);
        // The tool span is counted, not a request.
        let (_, stats) = import(&dir.join("request-trace-v1-agentic.jsonl")).unwrap();
        assert!(stats.notes.iter().any(|n| n.starts_with("1 tool events")));
    }

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
    fn requests_link_by_trajectory_the_parent_joins_its_subagent_and_tools_are_counted() {
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
                req_end("t", "main2", None, 1_000_000, 1.0)
            ),
        ];
        std::fs::write(&p, lines.join("\n")).unwrap();
        let (r, stats) = import(&p).unwrap();
        assert_eq!((r.len(), stats.block_size), (4, Some(64)));
        assert!(
            stats.notes.iter().any(|n| n.starts_with("1 tool events")),
            "{:?}",
            stats.notes
        );
        assert_eq!(r[0].arrival_time_us, 1_000_000_000);
        assert_eq!((r[0].ttft_us, r[0].e2el_us), (Some(12_500), Some(200_000)));
        // The subagent's first request continues the main trajectory's request that had
        // ended (d:1, at 1_000_200 ms) ...
        assert_eq!(r[2].parent_request_id.as_deref(), Some("d:1"));
        assert_eq!(r[2].think_time_us, Some(50_000));
        assert_eq!(r[2].session_id.as_deref(), Some("s"));
        // ... and main's next request waits on it: the subagent ended at 1_000_300 ms, after
        // d:1 ended and before d:3 arrived.
        assert_eq!(r[1].request_id, "d:3");
        assert_eq!(r[1].parent_request_id.as_deref(), Some("d:4"));
        assert_eq!(r[1].think_time_us, Some(200_000));
        assert_eq!(r[3].session_id.as_deref(), Some("t"));
        assert_eq!(r[3].parent_request_id, None);
        assert_eq!(r[0].prefix_hashes, Some(vec![1, 2]));
    }

    /// The current schema as Dynamo writes it: the sink's envelope, `parent_session_id`, no
    /// model, the prompt length only in `replay.input_length`, a record with no
    /// `agent_context`, a payload giving its request's body, and an uploader's marker line.
    #[test]
    fn request_trace_v1_records_import_with_what_they_have() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl");
        let end = |sid: &str, parent: Option<&str>, rid: &str, at: u64, total: u64, ctx: bool| {
            let parent = parent
                .map(|p| format!(", \"parent_session_id\": \"{p}\""))
                .unwrap_or_default();
            let ctx = if ctx {
                format!(", \"agent_context\": {{\"session_id\": \"{sid}\"{parent}}}")
            } else {
                String::new()
            };
            format!(
                "{{\"timestamp\": 5, \"event\": {{\"schema\": \"dynamo.request.trace.v1\", \"event_type\": \"request_end\", \"event_time_unix_ms\": {}{ctx}, \"request\": {{\"request_id\": \"{rid}\", \"output_tokens\": 4, \"request_received_ms\": {at}, \"total_time_ms\": {total}.0, \"replay\": {{\"trace_block_size\": 2, \"input_length\": 5, \"input_sequence_hashes\": [11, 22, 33]}}}}}}}}",
                at + total
            )
        };
        let payload = r#"{"timestamp": 6, "event": {"schema": "dynamo.request.trace.v1", "event_type": "request_payload", "event_time_unix_ms": 1100, "event_source": "dynamo", "payload": {"request_id": "req-1", "endpoint": "openai.chat_completion", "model": "m", "request": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}, "payload_complete": true}}}"#;
        let lines = [
            end("root", None, "req-1", 1_000, 100, true),
            payload.to_string(),
            end("child", Some("root"), "req-2", 1_150, 50, true),
            end("", None, "req-3", 2_000, 10, false),
            "{\"verification\": \"trace-s3-uploader\"}".to_string(),
        ];
        std::fs::write(&p, lines.join("\n")).unwrap();
        assert_eq!(crate::detect(&p).unwrap(), Format::Dynamo);
        let (r, stats) = import(&p).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(
            (
                r[0].prompt_tokens,
                r[0].output_tokens,
                r[0].model.as_deref()
            ),
            (Some(5), Some(4), None)
        );
        assert_eq!(r[1].parent_request_id.as_deref(), Some("d:1"));
        assert_eq!(r[1].parent_link, Some(trace_format::ParentLink::Subagent));
        assert_eq!(r[1].think_time_us, Some(50_000));
        assert_eq!(r[1].session_id.as_deref(), Some("root"));
        assert_eq!(
            (
                r[2].session_id.as_deref(),
                r[2].parent_request_id.as_deref()
            ),
            (None, None)
        );
        assert!(r[0].body.as_deref().unwrap().contains("\"hi\""));
        assert_eq!(stats.unknown.get("agent_context"), Some(&1));
        assert!(
            stats
                .notes
                .iter()
                .any(|n| n.contains("1 lines without a schema")),
            "{:?}",
            stats.notes
        );
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
                good.replace("\"session_id\": \"s\"", "\"x\": 1"),
                "bad.jsonl:2: agent_context.session_id missing",
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
                good.replace("\"request_received_ms\": 1000, ", "")
                    .replace("\"total_time_ms\": 1", "\"x\": 1"),
                "bad.jsonl:2: request.request_received_ms",
            ),
        ] {
            std::fs::write(&p, format!("{good}\n{line2}\n")).unwrap();
            let e = import(&p).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
