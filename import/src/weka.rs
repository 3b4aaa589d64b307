//! WEKA's agent traces (Claude Code sessions captured by a proxy, published in
//! `callanjfox/kv-cache-tester`'s `traces/` and by SemiAnalysis as `semianalysisai/cc-traces-weka-*`,
//! one release per date). Field description: kv-cache-tester's `docs/trace_replay_tester.md`
//! ("Trace Format"); NVIDIA AIPerf's reader of the same files
//! (`aiperf/dataset/graph/adapters/weka/trace_models.py`) fixes the sub-agent entries.
//!
//! One session per JSON object: a file holds one (`trace_0297.json`, a single line) or one per
//! line (JSON lines): `{"id", "models", "block_size", "hash_id_scope": "local"|"global",
//! "tool_tokens", "system_tokens", "requests": [...], "totals"}`. Each entry of `requests` is
//! - a call: `{"t"` (s from the session start), `"type"`: `"s"` streamed or `"n"` not,
//!   `"model", "in", "out", "hash_ids"` (`block_size`-token blocks), `"api_time"` (s the call
//!   took), `"ttft"` (s, streamed calls), `"think_time"` (s the client waited after the
//!   previous call ended), `"input_types", "output_types", "stop"}`;
//! - or a sub-agent: `{"type": "subagent", "t"` (s from the session start: its spawn),
//!   `"agent_id", "subagent_type", "status", "duration_ms", "requests": [...]}`, whose own
//!   entries count `t` from the spawn and may spawn sub-agents in turn.
//!
//! Every call is one chat request, id `<prefix>:<line>.<n>` (the n-th call of the line, depth
//! first, from 1), session `id` (a sub-agent's calls too), arriving at `t` (plus its
//! sub-agents' spawn times) from the Unix epoch (the format records no session start), streamed
//! as `type` says, with `api_time` as its end-to-end latency and `ttft` its TTFT. The calls of
//! the session and of each sub-agent chain in arrival order ([`crate::link`]); a sub-agent's
//! first call continues the parent's latest call that had ended when it arrived, and a parent call
//! made after a sub-agent finished (later than the parent's previous call ended) waits on that
//! sub-agent's last call (a join; none for a sub-agent `async_launched`). The think time is
//! `think_time` where the parent is the previous call of the same agent, else the gap after
//! the parent's end. Hash ids with `hash_id_scope` `local` number the blocks of one session
//! (its sub-agents included) only, so they are made session-unique (FNV-1a of the session id
//! and the id) before they become `prefix_hashes`; `global` keeps them. The block size is the
//! file's `block_size` (one per file).
//!
//! A call without `in` or `out` imports with that count unknown (counted); a call without
//! `type` is taken as streamed (counted).
//!
//! Not mapped (no column): `models`, `tool_tokens`, `system_tokens`, `totals`,
//! `input_types`, `output_types`, `stop`, and a sub-agent's `agent_id`, `subagent_type`,
//! `duration_ms`, `total_tokens`, `tool_use_count`.

use std::path::Path;

use trace_format::fnv::{fnv1a, OFFSET};
use trace_format::{Result, TokenSource, TraceRecord};

use crate::link::{link, Chain, Links};
use crate::out::Out;
use crate::rows::{jsonl_rows, Fields};

/// Endpoint of imported rows.
pub const ENDPOINT: &str = "/v1/chat/completions";

/// How deep sub-agents may nest (a malformed file must not recurse without end).
const MAX_DEPTH: usize = 16;

/// One session being read: where its calls go and how they link.
struct Session<'s> {
    id: String,
    id_prefix: &'s str,
    line: usize,
    local_hashes: bool,
    records: Vec<TraceRecord>,
    chains: Vec<Chain>,
    unknown: Vec<&'static str>,
}

impl Session<'_> {
    /// Reads the entries of `requests` of `f` (the session or a sub-agent), the chain `key`,
    /// whose times count from `base_us`.
    fn entries(
        &mut self,
        f: &Fields<'_>,
        key: &str,
        spawned_from: Option<&str>,
        detached: bool,
        base_us: i64,
        depth: usize,
    ) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(f.bad(
                "requests",
                format!("sub-agents nested more than {MAX_DEPTH} deep"),
            ));
        }
        let mut first = true;
        for (i, e) in f.array("requests")?.iter().enumerate() {
            let e = f.element("requests", i, e)?;
            let t = e
                .opt_duration_us("t", 1e6)?
                .ok_or_else(|| e.bad("t", "missing"))?;
            let at = base_us.saturating_add(t);
            let kind = e.opt_str("type")?;
            if kind.as_deref() == Some("subagent") {
                let agent = e.str("agent_id")?;
                let sub_key = format!("{key}/{agent}");
                let background = e.opt_str("status")?.as_deref() == Some("async_launched");
                self.entries(&e, &sub_key, Some(key), background, at, depth + 1)?;
                continue;
            }
            let stream = match kind.as_deref() {
                Some("s") => true,
                Some("n") => false,
                None => {
                    self.unknown.push("type");
                    true
                }
                Some(other) => {
                    return Err(e.bad(
                        "type",
                        format!("{other:?} is not \"s\", \"n\" or \"subagent\""),
                    ))
                }
            };
            let n = self.records.len() + 1;
            let mut r = TraceRecord::new(
                format!("{}:{}.{n}", self.id_prefix, self.line),
                at,
                ENDPOINT,
            );
            r.stream = stream;
            r.session_id = Some(self.id.clone());
            r.model = e.opt_str("model")?;
            r.prompt_tokens = e.opt_count("in")?;
            r.output_tokens = e.opt_count("out")?;
            for (v, name) in [(r.prompt_tokens, "in"), (r.output_tokens, "out")] {
                if v.is_none() {
                    self.unknown.push(name);
                }
            }
            r.prompt_tokens_source = r.prompt_tokens.map(|_| TokenSource::Recorded);
            r.output_tokens_source = r.output_tokens.map(|_| TokenSource::Recorded);
            r.e2el_us = e.opt_duration_us("api_time", 1e6)?;
            r.ttft_us = e.opt_duration_us("ttft", 1e6)?;
            r.think_time_us = e.opt_duration_us("think_time", 1e6)?;
            r.prefix_hashes = e.opt_hashes("hash_ids")?.map(|ids| {
                if self.local_hashes {
                    let base = fnv1a(OFFSET, self.id.as_bytes());
                    ids.iter().map(|h| fnv1a(base, &h.to_le_bytes())).collect()
                } else {
                    ids
                }
            });
            self.records.push(r);
            self.chains.push(Chain {
                key: Some(key.to_string()),
                spawned_from: first.then(|| spawned_from.map(str::to_string)).flatten(),
                detached,
            });
            first = false;
        }
        Ok(())
    }
}

/// Reads a WEKA agent trace (one session per JSON line) into `out`; the file's block size
/// goes to its statistics.
pub(crate) fn import(path: &Path, id_prefix: &str, out: &mut Out<'_>) -> Result<()> {
    let mut block: Option<(u32, usize)> = None;
    let mut unknown = Vec::new();
    jsonl_rows(path, out, |row, rows| {
        let s = Fields::of(row);
        let id = s.str("id")?;
        s.block_size("block_size", &mut block)?;
        let local_hashes = match s.opt_str("hash_id_scope")?.as_deref() {
            None | Some("local") => true,
            Some("global") => false,
            Some(other) => {
                return Err(s.bad(
                    "hash_id_scope",
                    format!("{other:?} is not \"local\" or \"global\""),
                ))
            }
        };
        let mut session = Session {
            id: id.clone(),
            id_prefix,
            line: row.at.line,
            local_hashes,
            records: Vec::new(),
            chains: Vec::new(),
            unknown: Vec::new(),
        };
        session.entries(&s, &id, None, false, 0, 0)?;
        let how = Links {
            subagent_from_ended: true,
            join_children: true,
        };
        link(&mut session.records, &session.chains, how);
        unknown.extend(session.unknown);
        rows.extend(session.records);
        Ok(())
    })?;
    for field in unknown {
        out.unknown(&format!("requests[].{field}"));
    }
    out.stats.block_size = block.map(|(b, _)| b);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Format;

    fn import(p: &Path, prefix: &str) -> Result<(Vec<TraceRecord>, Option<u32>)> {
        let opts = crate::ImportOptions {
            format: Format::Weka,
            ..Default::default()
        };
        crate::import_file(p, &opts, prefix).map(|(r, s)| (r, s.block_size))
    }

    const S1: &str = r#"{"id": "a1", "models": ["m"], "block_size": 64, "hash_id_scope": "local", "requests": [{"t": 0.0, "type": "s", "model": "m", "in": 418, "out": 20, "hash_ids": [0, 1, 2, 3, 4, 5, 6], "api_time": 2.303, "ttft": 0.5}, {"t": 5.5, "type": "n", "model": "m", "in": 500, "out": 30, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7], "api_time": 1.0, "think_time": 3.0}, {"t": 9.0, "type": "n", "model": "m", "in": 64, "out": 1, "hash_ids": [0], "api_time": 0.5}]}"#;
    const S2: &str = r#"{"id": "b2", "models": ["m"], "block_size": 64, "hash_id_scope": "local", "requests": [{"t": 0.25, "type": "s", "model": "m", "in": 64, "out": 2, "hash_ids": [0], "api_time": 0.1}]}"#;

    #[test]
    fn sessions_chain_and_local_hashes_stay_in_their_session() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.jsonl");
        std::fs::write(&p, format!("{S1}\n{S2}\n")).unwrap();
        let (r, block) = import(&p, "w").unwrap();
        assert_eq!((r.len(), block), (4, Some(64)));
        assert_eq!(r[1].request_id, "w:1.2");
        assert_eq!(r[1].arrival_time_us, 5_500_000);
        assert_eq!(r[1].e2el_us, Some(1_000_000));
        assert_eq!(r[1].parent_request_id.as_deref(), Some("w:1.1"));
        // Streamed as `type` says; TTFT kept.
        assert_eq!((r[0].stream, r[1].stream), (true, false));
        assert_eq!((r[0].ttft_us, r[1].ttft_us), (Some(500_000), None));
        // Given think time kept; else the gap after the parent's end (9.0 - 6.5).
        assert_eq!(r[1].think_time_us, Some(3_000_000));
        assert_eq!(r[2].think_time_us, Some(2_500_000));
        assert_eq!(r[3].parent_request_id, None);
        // Block 0 of a1 shares with a1's other requests, not with b2's block 0.
        let h = |i: usize| r[i].prefix_hashes.clone().unwrap();
        assert_eq!(h(0)[..7], h(1)[..7]);
        assert_ne!(h(2)[0], h(3)[0]);
    }

    #[test]
    fn bad_sessions_name_the_file_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.jsonl");
        for (bad, want) in [
            ("[1, 2]".to_string(), "bad.jsonl:2: not a JSON object"),
            (
                S2.replace("\"id\": \"b2\", ", ""),
                "bad.jsonl:2: id missing",
            ),
            (
                S2.replace("\"in\": 64", "\"in\": 6.5"),
                "bad.jsonl:2: requests[0].in 6.5 is not a non-negative integer",
            ),
            (
                S2.replace("\"block_size\": 64", "\"block_size\": 16"),
                "block_size 16 differs from 64 on line 1",
            ),
            (
                S2.replace("\"t\": 0.25", "\"t\": \"soon\""),
                "requests[0].t",
            ),
            (
                S2.replace("\"hash_ids\": [0]", "\"hash_ids\": [-3]"),
                "requests[0].hash_ids hash id -3",
            ),
            (
                S2.replace("\"type\": \"s\"", "\"type\": \"x\""),
                "requests[0].type \"x\"",
            ),
        ] {
            std::fs::write(&p, format!("{S1}\n{bad}\n")).unwrap();
            let e = import(&p, "w").unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    /// A call the publisher left without its token counts imports with them unknown, and
    /// the import counts it.
    #[test]
    fn calls_without_counts_import_and_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.jsonl");
        std::fs::write(&p, S2.replace("\"in\": 64, ", "")).unwrap();
        let opts = crate::ImportOptions {
            format: Format::Weka,
            ..Default::default()
        };
        let (r, stats) = crate::import_file(&p, &opts, "w").unwrap();
        assert_eq!((r[0].prompt_tokens, r[0].output_tokens), (None, Some(2)));
        assert_eq!(stats.unknown.get("requests[].in"), Some(&1));
    }

    /// The real sessions (`../shared/data/real-formats/weka/`): every call of the session and
    /// of its sub-agents (nested, times from the spawn) is a row with the file's times, counts,
    /// streaming flag, TTFT and session; each agent's calls chain; a sub-agent's first call
    /// continues the parent's call that had ended at the spawn; and a parent call made after a
    /// sub-agent finished, later than the parent's previous call ended, waits on it. The
    /// expectations are computed here from the JSON, not by the importer's code.
    #[test]
    fn the_real_sessions_import_as_published() {
        use serde_json::Value;
        struct Call {
            agent: String,
            spawned_by: Option<(String, i64)>,
            at: i64,
            end: i64,
            v: Value,
        }
        let us = |s: f64| (s * 1e6).round() as i64;
        fn walk(
            reqs: &[Value],
            agent: &str,
            parent: Option<(String, i64)>,
            base: i64,
            out: &mut Vec<Call>,
        ) {
            let us = |s: f64| (s * 1e6).round() as i64;
            for e in reqs {
                let t = base + us(e["t"].as_f64().unwrap());
                if e["type"] == "subagent" {
                    let sub = format!("{agent}/{}", e["agent_id"].as_str().unwrap());
                    walk(
                        e["requests"].as_array().unwrap(),
                        &sub,
                        Some((agent.to_string(), t)),
                        t,
                        out,
                    );
                } else {
                    let api = us(e["api_time"].as_f64().unwrap());
                    let first = !out.iter().any(|c| c.agent == agent);
                    out.push(Call {
                        agent: agent.to_string(),
                        spawned_by: parent.clone().filter(|_| first),
                        at: t,
                        end: t + api,
                        v: e.clone(),
                    });
                }
            }
        }
        let mut seen = 0;
        for f in ["trace_0297.json", "trace_0274.json"] {
            let Some(p) = crate::test_shared_data(&format!("real-formats/weka/{f}")) else {
                continue;
            };
            seen += 1;
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            let id = v["id"].as_str().unwrap();
            let mut calls = Vec::new();
            walk(v["requests"].as_array().unwrap(), id, None, 0, &mut calls);
            let (rows, block) = import(&p, "w").unwrap();
            assert_eq!((rows.len(), block), (calls.len(), Some(64)), "{f}");
            let index = |rid: &str| rows.iter().position(|r| r.request_id == rid).unwrap();
            for (r, c) in rows.iter().zip(&calls) {
                let e = &c.v;
                assert_eq!(r.arrival_time_us, c.at, "{f} {}", r.request_id);
                assert_eq!(r.prompt_tokens, e["in"].as_i64(), "{f}");
                assert_eq!(r.output_tokens, e["out"].as_i64(), "{f}");
                assert_eq!(r.stream, e["type"] == "s", "{f}");
                assert_eq!(r.ttft_us, e["ttft"].as_f64().map(us), "{f}");
                assert_eq!(r.e2el_us, Some(c.end - c.at), "{f}");
                assert_eq!(r.session_id.as_deref(), Some(id));
                assert_eq!(
                    r.prefix_hashes.as_ref().map(Vec::len),
                    Some(e["hash_ids"].as_array().unwrap().len())
                );
            }
            let sub_ends: Vec<(String, String, i64)> = calls
                .iter()
                .filter(|c| c.agent != id)
                .map(|c| {
                    (
                        c.agent.clone(),
                        calls
                            .iter()
                            .rfind(|d| d.agent == c.agent)
                            .map(|d| d.end)
                            .unwrap(),
                    )
                })
                .map(|(a, e)| (a.rsplit_once('/').unwrap().0.to_string(), a, e))
                .collect();
            let mut joined = std::collections::HashSet::new();
            for (k, c) in calls.iter().enumerate() {
                let r = &rows[k];
                let prev = calls[..k].iter().rposition(|d| d.agent == c.agent);
                let want = match (prev, &c.spawned_by) {
                    (None, None) => None,
                    (None, Some((parent, _spawn))) => calls
                        .iter()
                        .enumerate()
                        .filter(|(_, d)| &d.agent == parent && d.end <= c.at)
                        .max_by_key(|(_, d)| d.end)
                        .map(|(j, _)| j),
                    (Some(p), _) => {
                        // The sub-agent (of this agent) that ended last before this call,
                        // after the previous call ended, and joined nothing yet.
                        let child = sub_ends
                            .iter()
                            .filter(|(pa, a, e)| {
                                pa == &c.agent
                                    && !joined.contains(a)
                                    && *e <= c.at
                                    && *e > calls[p].end
                            })
                            .max_by_key(|(_, _, e)| *e);
                        match child {
                            Some((_, a, _)) => {
                                joined.insert(a.clone());
                                calls.iter().rposition(|d| &d.agent == a)
                            }
                            None => Some(p),
                        }
                    }
                };
                let got = r.parent_request_id.as_deref().map(index);
                assert_eq!(got, want, "{f} {}", r.request_id);
                if let Some(j) = want {
                    let given = c.v["think_time"].as_f64().filter(|_| Some(j) == prev);
                    let think = given
                        .map(us)
                        .unwrap_or_else(|| (c.at - calls[j].end).max(0));
                    assert_eq!(r.think_time_us, Some(think), "{f} {}", r.request_id);
                }
            }
            if f == "trace_0274.json" {
                // The three sub-agents' calls are there, and two of them are waited on.
                assert_eq!(calls.iter().filter(|c| c.agent != id).count(), 48);
                assert_eq!(joined.len(), 2);
            }
        }
        if seen == 0 {
            eprintln!("SKIPPED: no real WEKA sessions");
        }
    }
}
