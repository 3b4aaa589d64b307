//! WEKA's agent traces (the coding-agent sessions WEKA published for its augmented-memory
//! work, e.g. `semianalysisai/cc-traces-weka-*`): JSON lines, one session per line:
//! `{"id", "models", "block_size": 64, "hash_id_scope": "local", "requests": [{"t", "model",
//! "in", "out", "hash_ids", "api_time", "think_time", "type"}]}`.
//!
//! **No published field description was found**: the fields are those the dataset viewer
//! shows (`t` seconds from the session start, `in`/`out` tokens, `hash_ids` of
//! `block_size`-token blocks, `api_time` seconds the call took); `think_time` (seconds before
//! the request, after the previous one ended) is read when present.
//!
//! Every request is one chat request, id `<prefix>:<line>.<n>` (the n-th of the session, from
//! 1), session `id`, arriving at `t` from the Unix epoch (every session starts at 0: the
//! format records no session start), with `api_time` as its end-to-end latency. A session's
//! requests chain in arrival order ([`crate::link`]); the think time is `think_time` when
//! given, else the gap after the previous request's end. Hash ids with `hash_id_scope`
//! `local` number the blocks of one session only, so they are made session-unique (FNV-1a of
//! the session id and the id) before they become `prefix_hashes`; any other scope keeps them.
//! The block size is the file's `block_size` (one per file).
//!
//! Not mapped (no column): `models`, `type` (main agent or subagent), `hash_id_scope` itself.

use std::path::Path;

use trace_format::fnv::{fnv1a, OFFSET};
use trace_format::{Result, TokenSource, TraceRecord};

use crate::link::{link, Chain};
use crate::rows::{jsonl_rows, Fields};

/// Endpoint of imported rows.
pub const ENDPOINT: &str = "/v1/chat/completions";

/// Reads a WEKA agent trace; returns the rows and the block size of their hash ids.
pub fn import(path: &Path, id_prefix: &str) -> Result<(Vec<TraceRecord>, Option<u32>)> {
    let mut chains = Vec::new();
    let mut block: Option<(u32, usize)> = None;
    let mut records = jsonl_rows(path, |row, out| {
        let s = Fields::of(row);
        let session = s.str("id")?;
        let size = s.count("block_size")?;
        let size = u32::try_from(size)
            .ok()
            .filter(|b| *b > 0)
            .ok_or_else(|| s.bad("block_size", format!("{size} is out of range")))?;
        match block {
            Some((b, line)) if b != size => {
                return Err(s.bad(
                    "block_size",
                    format!("{size} differs from {b} on line {line} (one block size per file)"),
                ))
            }
            _ => block = Some((size, row.at.line)),
        }
        let local = s.opt_str("hash_id_scope")?.is_none_or(|x| x == "local");
        for (i, q) in s.array("requests")?.iter().enumerate() {
            let q = s.element("requests", i, q)?;
            let at = q
                .opt_duration_us("t", 1e6)?
                .ok_or_else(|| q.bad("t", "missing"))?;
            let mut r = TraceRecord::new(
                format!("{id_prefix}:{}.{}", row.at.line, i + 1),
                at,
                ENDPOINT,
            );
            r.stream = true;
            r.session_id = Some(session.clone());
            r.model = q.opt_str("model")?;
            r.prompt_tokens = Some(q.count("in")?);
            r.output_tokens = Some(q.count("out")?);
            r.prompt_tokens_source = Some(TokenSource::Recorded);
            r.output_tokens_source = Some(TokenSource::Recorded);
            r.e2el_us = q.opt_duration_us("api_time", 1e6)?;
            r.think_time_us = q.opt_duration_us("think_time", 1e6)?;
            r.prefix_hashes = q.opt_hashes("hash_ids")?.map(|ids| {
                if local {
                    let base = fnv1a(OFFSET, session.as_bytes());
                    ids.iter().map(|h| fnv1a(base, &h.to_le_bytes())).collect()
                } else {
                    ids
                }
            });
            out.push(r);
            chains.push(Chain {
                key: Some(session.clone()),
                spawned_from: None,
            });
        }
        Ok(())
    })?;
    link(&mut records, &chains);
    Ok((records, block.map(|(b, _)| b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S1: &str = r#"{"id": "a1", "models": ["m"], "block_size": 64, "hash_id_scope": "local", "requests": [{"t": 0.0, "model": "m", "in": 418, "out": 20, "hash_ids": [0, 1, 2, 3, 4, 5, 6], "api_time": 2.303, "type": "main"}, {"t": 5.5, "model": "m", "in": 500, "out": 30, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7], "api_time": 1.0, "think_time": 3.0, "type": "main"}, {"t": 9.0, "model": "m", "in": 64, "out": 1, "hash_ids": [0], "api_time": 0.5}]}"#;
    const S2: &str = r#"{"id": "b2", "models": ["m"], "block_size": 64, "hash_id_scope": "local", "requests": [{"t": 0.25, "model": "m", "in": 64, "out": 2, "hash_ids": [0], "api_time": 0.1}]}"#;

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
        ] {
            std::fs::write(&p, format!("{S1}\n{bad}\n")).unwrap();
            let e = import(&p, "w").unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
