//! Qwen Bailian usage traces (alibaba-edu/qwen-bailian-usagetraces-anon): JSON lines
//! `{"chat_id", "parent_chat_id", "timestamp" (s, float), "input_length", "output_length",
//! "type", "turn", "hash_ids"}`.
//!
//! Each line is one request, id `<prefix>:<line>`. `chat_id`/`parent_chat_id` link the turns
//! of a conversation: a turn whose parent is absent, negative or not in the file starts a
//! session, and every later turn joins its parent's session, whose id is the first turn's
//! `chat_id`; a turn's `parent_request_id` is its parent's row (no think time: the traces
//! record no durations). Hash ids name 16-token blocks (block size 16 in the metadata). Each row already
//! carries its turn's whole context in `input_length`/`hash_ids`. The model stays empty (the
//! traces do not name one); `type` and `turn` are not mapped. Rows become chat requests.
//!
//! The newer coder and thinking traces (`qwen_coder_blksz_16.jsonl`,
//! `qwen_thinking_blksz_16.jsonl`) have the same fields, with more values of `type` (`api`,
//! `thinking`, `coder`) and long outputs; they import as they are (checked against their field
//! list: `type` is not read, so no value of it is refused). Their FAQ's two quirks need nothing
//! here: `<think>` tokens stripped before the next turn only make a turn's context shorter than
//! its parent's prompt plus answer, and a last block whose hash changed only ends a shared
//! prefix one block early.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use trace_format::Result;

use crate::out::{Out, Sink};
use crate::rows::{jsonl_records, seconds_to_us};

/// Tokens per hash id.
pub const BLOCK_SIZE: u32 = 16;
/// Endpoint of imported rows.
pub const ENDPOINT: &str = "/v1/chat/completions";

/// An id field that may be written as a number or a string.
fn id_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// Reads a Qwen Bailian JSONL trace.
pub(crate) fn import(path: &Path, id_prefix: &str, sink: &mut Out<'_>) -> Result<()> {
    let mut parents: Vec<(Option<String>, Option<String>)> = Vec::new();
    let mut out = Vec::new();
    jsonl_records(path, &mut out, |row| {
        let ts = row.timestamp()?;
        let arrival = seconds_to_us(&ts.to_string()).ok_or_else(|| {
            row.at.bad(format!(
                "timestamp {ts} is not a non-negative number of seconds"
            ))
        })?;
        let r = row.record(id_prefix, arrival, ENDPOINT)?;
        let chat = id_of(row.obj.get("chat_id")).ok_or_else(|| row.at.bad("chat_id missing"))?;
        let parent = id_of(row.obj.get("parent_chat_id")).filter(|p| !p.starts_with('-'));
        parents.push((Some(chat), parent));
        Ok(r)
    })?;
    // Sessions: follow parent links to the first turn (iteratively; cycles stop).
    let index: HashMap<&str, usize> = parents
        .iter()
        .enumerate()
        .filter_map(|(i, (c, _))| c.as_deref().map(|c| (c, i)))
        .collect();
    let mut root_of: Vec<Option<String>> = vec![None; parents.len()];
    for i in 0..parents.len() {
        let mut cur = i;
        let mut steps = 0;
        while let Some(p) = parents[cur].1.as_deref() {
            match index.get(p) {
                Some(&j) if j != cur && steps < parents.len() => {
                    if let Some(r) = &root_of[j] {
                        root_of[i] = Some(r.clone());
                        break;
                    }
                    cur = j;
                    steps += 1;
                }
                _ => break,
            }
        }
        if root_of[i].is_none() {
            root_of[i] = parents[cur].0.clone();
        }
    }
    // Parents: the row of `parent_chat_id`, when it is in the file (no think time: the
    // traces record no durations, so the parent's end is unknown).
    let parent_row: Vec<Option<usize>> = parents
        .iter()
        .enumerate()
        .map(|(i, (_, p))| {
            p.as_deref()
                .and_then(|p| index.get(p).copied())
                .filter(|&j| j != i)
        })
        .collect();
    let ids: Vec<String> = out.iter().map(|r| r.request_id.clone()).collect();
    for ((r, s), p) in out.iter_mut().zip(root_of).zip(parent_row) {
        r.session_id = s;
        r.parent_request_id = p.map(|j| ids[j].clone());
    }
    sink.push_all(out).map(drop)
}

#[cfg(test)]
mod tests {

    fn import(
        p: &std::path::Path,
        prefix: &str,
    ) -> trace_format::Result<Vec<trace_format::TraceRecord>> {
        crate::read_as(crate::Format::Qwen, p, prefix)
    }
    use crate::{import as import_all, ImportOptions};

    #[test]
    fn sessions_follow_parent_links_and_times_are_exact() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("q.jsonl");
        std::fs::write(
            &p,
            "{\"chat_id\": 10, \"parent_chat_id\": -1, \"timestamp\": 0.5, \"input_length\": 40, \"output_length\": 5, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [1, 2, 3]}\n\
             {\"chat_id\": 11, \"parent_chat_id\": -1, \"timestamp\": 1.25, \"input_length\": 8, \"output_length\": 0, \"type\": \"text\", \"turn\": 1, \"hash_ids\": [9]}\n\
             {\"chat_id\": 12, \"parent_chat_id\": 10, \"timestamp\": 3.000001, \"input_length\": 60, \"output_length\": 7, \"type\": \"text\", \"turn\": 2, \"hash_ids\": [1, 2, 3, 4]}\n\
             {\"chat_id\": 13, \"parent_chat_id\": 12, \"timestamp\": 4, \"input_length\": 90, \"output_length\": 1, \"type\": \"text\", \"turn\": 3, \"hash_ids\": [1, 2, 3, 4, 5, 6]}\n",
        )
        .unwrap();
        let t = import_all(std::slice::from_ref(&p), &ImportOptions::default(), "t").unwrap();
        assert_eq!(t.meta.block_size, Some(16));
        let r = &t.records;
        assert_eq!(
            r.iter().map(|r| r.arrival_time_us).collect::<Vec<_>>(),
            vec![500_000, 1_250_000, 3_000_001, 4_000_000]
        );
        let s: Vec<_> = r.iter().map(|r| r.session_id.as_deref().unwrap()).collect();
        assert_eq!(s, vec!["10", "11", "10", "10"]);
        assert_eq!(r[3].prefix_hashes.as_ref().unwrap().len(), 6);
        assert_eq!(t.sources[0].prompt_tokens, 198);
        assert_eq!(r[0].endpoint, "/v1/chat/completions");
        std::fs::write(&p, "{\"parent_chat_id\": -1, \"timestamp\": 0.5, \"input_length\": 40, \"output_length\": 5}\n").unwrap();
        assert!(import(&p, "q")
            .unwrap_err()
            .to_string()
            .contains("q.jsonl:1: chat_id"));
    }

    /// The coder and thinking traces' rows (types `api`, `thinking`, `coder`, long outputs, a
    /// thinking turn whose context is shorter than its parent's prompt and answer) import
    /// with their sessions.
    #[test]
    fn coder_and_thinking_rows_import_with_their_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("qwen_thinking_blksz_16.jsonl");
        std::fs::write(
            &p,
            "{\"chat_id\": 1, \"parent_chat_id\": -1, \"timestamp\": 0.0, \"input_length\": 48, \"output_length\": 6000, \"type\": \"thinking\", \"turn\": 1, \"hash_ids\": [1, 2, 3]}\n\
             {\"chat_id\": 2, \"parent_chat_id\": 1, \"timestamp\": 95.5, \"input_length\": 80, \"output_length\": 4000, \"type\": \"thinking\", \"turn\": 2, \"hash_ids\": [1, 2, 4, 5, 6]}\n\
             {\"chat_id\": 3, \"parent_chat_id\": -1, \"timestamp\": 96.0, \"input_length\": 20000, \"output_length\": 300, \"type\": \"coder\", \"turn\": 1, \"hash_ids\": [7]}\n\
             {\"chat_id\": 4, \"parent_chat_id\": -1, \"timestamp\": 96.25, \"input_length\": 16, \"output_length\": 1, \"type\": \"api\", \"turn\": 1, \"hash_ids\": [8]}\n",
        )
        .unwrap();
        let r = import(&p, "q").unwrap();
        let s: Vec<_> = r.iter().map(|r| r.session_id.as_deref().unwrap()).collect();
        assert_eq!(s, vec!["1", "1", "3", "4"]);
        // The parent link is kept, not only the session.
        let p: Vec<_> = r.iter().map(|r| r.parent_request_id.as_deref()).collect();
        assert_eq!(p, vec![None, Some("q:1"), None, None]);
        assert!(r.iter().all(|r| r.think_time_us.is_none()));
        assert_eq!(r[0].output_tokens, Some(6000));
        assert_eq!(r[3].arrival_time_us, 96_250_000);
    }
}
