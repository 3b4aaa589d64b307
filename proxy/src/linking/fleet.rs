//! The fleet pass (issue 56): the rows of several captures linked as one capture would have
//! linked them, from the link keys each row carries ([`trace_format::fleet::LinkKeys`]).
//!
//! A conversation a load balancer spreads over three capture pods comes out of each as
//! fragments: a turn whose parent another pod saw is unlinked, or linked by chat prefix to
//! an older turn of its own pod (the latest turn it saw of that conversation). The pass runs
//! the linkers capture runs ([`Links`]: chat chains, tool-call parents, sub-agents,
//! Responses' `previous_response_id`) over the union of the captures' rows, fed the keys the
//! rows carry instead of the hashes the writer thread had in memory: the same code on the
//! same values, in the same order (the order the requests finished: rows are taken in
//! arrival order and held until no later row can have finished before them, so the memory
//! held is the requests in flight at once), so it finds what one capture of all the traffic
//! would have found.
//!
//! A row its capture linked keeps its link where the pass finds the same, or no parent at
//! all (counted as a conflict: the captured link kept). Where the pass finds another parent
//! it writes that one: it saw every row its capture saw and the rest. A chat-prefix link to
//! an older turn is the expected case (`relinked`: its capture did not see the later turn);
//! another rule's is counted as a conflict and said (a tool call id reused by another
//! client's response that its capture saw, where the request's own was seen by another
//! capture). Think times are recomputed from the parent found, as the writer thread does;
//! sessions follow the parents (a row's header session stays: one that is neither its own
//! request id nor its captured parent's session).
//!
//! What the pass cannot link: rows without keys (captured under `perf`, or before schema
//! 1.6), and completions turns (`/v1/completions`: linked by their prompt's text, which no
//! column keeps; they keep their capture's links). Memory: the linkers' bounds
//! ([`crate::linking::bounded`]), and the session each of the last
//! [`crate::linking::sessions::DEFAULT_MAX_KEYS`] rows was written with.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;

use serde::Serialize;
use trace_format::captures::{CaptureCounter, CaptureSummary};
use trace_format::file_meta::{carried, one_key};
use trace_format::{
    FileMeta, ParentLink, Producer, Result, TraceFileWriter, TraceRecord, TraceStream,
};

use crate::linking::agents::Links;
use crate::linking::bounded::Recent;
use crate::linking::sessions::DEFAULT_MAX_KEYS;
use crate::prefix::{fnv, FNV_OFFSET};

/// Conflicts described in [`FleetCounts::examples`].
const EXAMPLES: usize = 8;

/// What the pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FleetCounts {
    /// Rows read.
    pub rows: u64,
    /// Rows without link keys (under `perf`, before schema 1.6, completions, or not chat-
    /// shaped): left as their capture wrote them.
    pub without_keys: u64,
    /// Rows their capture had linked as the pass does.
    pub agreed: u64,
    /// Rows their capture left unlinked that the pass linked (their parent in another
    /// capture).
    pub linked: u64,
    /// Chat-prefix links to an older turn of their own capture, relinked to the later turn
    /// another capture saw.
    pub relinked: u64,
    /// Rows their capture linked otherwise than the pass: to another parent by an exact
    /// rule (the pass's written), or to a parent the pass did not find (the captured one
    /// kept).
    pub conflicts: u64,
    /// The first few conflicts, described.
    pub examples: Vec<String>,
    /// Most rows held at once for their turn (requests in flight).
    pub peak_held: usize,
}

/// A row waiting for every row that finished before it.
struct Held {
    end_us: i64,
    seq: u64,
    rec: TraceRecord,
}

impl PartialEq for Held {
    fn eq(&self, o: &Held) -> bool {
        (self.end_us, self.seq) == (o.end_us, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Held) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Held) -> std::cmp::Ordering {
        (self.end_us, self.seq).cmp(&(o.end_us, o.seq))
    }
}

/// The fleet pass: rows in ([`FleetPass::push`], in arrival order), linked rows out, in the
/// order their requests finished.
pub struct FleetPass {
    links: Links,
    /// By request id (hashed): the session the row was written with, and the one the pass
    /// gave it.
    sessions: Recent<u64, (Option<String>, Option<String>)>,
    held: BinaryHeap<Reverse<Held>>,
    seq: u64,
    counts: FleetCounts,
}

impl Default for FleetPass {
    fn default() -> FleetPass {
        FleetPass::new(Links::default(), DEFAULT_MAX_KEYS)
    }
}

fn id_key(id: &str) -> u64 {
    fnv(FNV_OFFSET, id.as_bytes())
}

impl FleetPass {
    /// A pass linking with `links`, remembering the sessions of the last `max_rows` rows.
    pub fn new(links: Links, max_rows: usize) -> FleetPass {
        FleetPass {
            links,
            sessions: Recent::new(max_rows),
            held: BinaryHeap::new(),
            seq: 0,
            counts: FleetCounts::default(),
        }
    }

    /// One row, in arrival order; returns the rows whose turn has come (every row that
    /// finished by this one's arrival), linked, in the order they finished.
    pub fn push(&mut self, rec: TraceRecord) -> Vec<TraceRecord> {
        let at = rec.arrival_time_us;
        self.seq += 1;
        let end_us = at.saturating_add(rec.e2el_us.unwrap_or(0).max(0));
        self.held.push(Reverse(Held {
            end_us,
            seq: self.seq,
            rec,
        }));
        self.counts.peak_held = self.counts.peak_held.max(self.held.len());
        let mut out = Vec::new();
        while self.held.peek().is_some_and(|h| h.0.end_us <= at) {
            if let Some(Reverse(mut h)) = self.held.pop() {
                self.link(&mut h.rec);
                out.push(h.rec);
            }
        }
        out
    }

    /// The rows still held, linked; and what the pass did.
    pub fn finish(mut self) -> (Vec<TraceRecord>, FleetCounts) {
        let mut out = Vec::with_capacity(self.held.len());
        while let Some(Reverse(mut h)) = self.held.pop() {
            self.link(&mut h.rec);
            out.push(h.rec);
        }
        (out, self.counts)
    }

    /// The session `rec`'s request header named (see the module), from what it was
    /// written with.
    fn header_session(&self, rec: &TraceRecord) -> Option<String> {
        let written = rec.session_id.as_deref()?;
        if written == rec.request_id {
            return None;
        }
        let inherited = rec
            .parent_request_id
            .as_deref()
            .and_then(|p| self.sessions.get(&id_key(p)))
            .is_some_and(|(w, _)| w.as_deref() == Some(written));
        (!inherited).then(|| written.to_string())
    }

    /// Links one row (its turn: every row that finished before it has been linked).
    fn link(&mut self, rec: &mut TraceRecord) {
        self.counts.rows += 1;
        if !rec.link_keys.any() {
            self.counts.without_keys += 1;
            return;
        }
        let keys = std::mem::take(&mut rec.link_keys);
        let written_session = rec.session_id.clone();
        let header = self.header_session(rec);
        let captured = (
            rec.parent_request_id.take(),
            rec.parent_link.take(),
            rec.think_time_us.take(),
        );
        rec.session_id = header;
        self.links.link(rec, &keys);
        rec.link_keys = keys;
        match (&captured.0, &rec.parent_request_id) {
            (None, None) => {}
            (None, Some(_)) => self.counts.linked += 1,
            (Some(c), Some(p)) if c == p => self.counts.agreed += 1,
            (Some(_), Some(_)) if captured.1 == Some(ParentLink::ChatPrefix) => {
                self.counts.relinked += 1;
            }
            (Some(c), found) => {
                self.counts.conflicts += 1;
                if self.counts.examples.len() < EXAMPLES {
                    self.counts.examples.push(format!(
                        "{}: captured parent {c} ({}), the pass found {}{}",
                        rec.request_id,
                        captured.1.map_or("?", ParentLink::as_str),
                        found.as_deref().unwrap_or("none"),
                        if found.is_some() {
                            " (written)"
                        } else {
                            " (the captured one kept)"
                        }
                    ));
                }
                if found.is_none() {
                    rec.session_id = written_session.clone();
                    (rec.parent_request_id, rec.parent_link, rec.think_time_us) = captured;
                }
            }
        }
        self.sessions.insert(
            id_key(&rec.request_id),
            (written_session, rec.session_id.clone()),
        );
    }
}

/// What `llmreplay link` did: the pass's counts and each capture's share of the rows.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    /// Rows written.
    pub rows: u64,
    /// What the pass did.
    pub counts: FleetCounts,
    /// The captures the rows came from (None: no row names one).
    pub captures: Option<CaptureSummary>,
}

impl FleetReport {
    /// Lines for a human.
    pub fn lines(&self) -> Vec<String> {
        let c = &self.counts;
        let mut out = vec![
            format!(
                "{} rows: {} linked across captures, {} chat-prefix links relinked to a later \
                 turn another capture saw, {} as their capture linked them, {} conflicts, \
                 {} without link keys (left as they are)",
                self.rows, c.linked, c.relinked, c.agreed, c.conflicts, c.without_keys
            ),
            format!("held at most {} rows in flight at once", c.peak_held),
        ];
        out.extend(c.examples.iter().map(|e| format!("conflict: {e}")));
        if c.without_keys == c.rows && c.rows > 0 {
            out.push(
                "no row carries link keys: captures under --privacy perf, or before schema \
                 1.6, link within their own capture only"
                    .into(),
            );
        }
        if let Some(s) = &self.captures {
            out.extend(s.lines());
        }
        out
    }
}

/// The fleet pass over `stream` (the captures' files, in arrival order), written to one
/// trace file at `out` (its metadata: producer capture, `command`, the files' shared
/// manifest and block size, every capture's id, start and clock). Refuses files whose
/// hashes were made under different keys: their link keys never compare.
pub fn link_stream(stream: &TraceStream, out: &Path, command: &str) -> Result<FleetReport> {
    let files = stream.files();
    one_key(files.iter().map(|f| (f.path.as_path(), &f.meta)))?;
    let mut meta = FileMeta::new(Producer::Capture, command);
    meta.privacy = carried(files.iter().map(|f| &f.meta));
    let mut blocks = files.iter().map(|f| f.meta.block_size);
    meta.block_size = blocks
        .next()
        .flatten()
        .filter(|&b| blocks.all(|o| o == Some(b)));
    for c in files.iter().flat_map(|f| &f.meta.captures) {
        if !meta.captures.contains(c) {
            meta.captures.push(c.clone());
        }
    }
    let mut captures = CaptureCounter::new(files);
    let mut writer = TraceFileWriter::create(out)?;
    let mut pass = FleetPass::default();
    for r in stream.records() {
        let r = r?;
        captures.add(&r);
        for linked in pass.push(r) {
            writer.push(linked)?;
        }
    }
    let (rest, counts) = pass.finish();
    for linked in rest {
        writer.push(linked)?;
    }
    let rows = writer.rows();
    writer.finish(&meta)?;
    Ok(FleetReport {
        rows,
        counts,
        captures: captures.finish(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_format::fleet::LinkKeys;

    /// A chat row of capture `cap` at `at` ms lasting `ms`, looking up `lookups` and leaving
    /// `answer`, linked as its capture linked it.
    fn row(id: &str, at: i64, ms: i64, lookups: &[u64], answer: u64) -> TraceRecord {
        let mut r = TraceRecord::new(id, at * 1000, "/v1/chat/completions");
        r.e2el_us = Some(ms * 1000);
        r.link_keys = LinkKeys {
            chat: Some(lookups.to_vec()),
            answer: Some(answer),
            client: Some(1),
            ..LinkKeys::default()
        };
        r
    }

    fn captured(r: &mut TraceRecord, parent: Option<(&str, &str)>) {
        r.session_id = Some(parent.map_or(r.request_id.clone(), |p| p.1.to_string()));
        r.parent_request_id = parent.map(|p| p.0.to_string());
        r.parent_link = parent.map(|_| ParentLink::ChatPrefix);
        r.think_time_us = parent.map(|_| 1);
    }

    fn run(rows: Vec<TraceRecord>) -> (Vec<TraceRecord>, FleetCounts) {
        let mut pass = FleetPass::default();
        let mut out = Vec::new();
        for r in rows {
            out.extend(pass.push(r));
        }
        let (rest, counts) = pass.finish();
        out.extend(rest);
        (out, counts)
    }

    /// Four turns of one conversation over two captures: B saw t2 and t3 (t2 unlinked, so
    /// its session is its own; t3 linked to t2, in t2's session), A saw t1 and t4 (t4
    /// linked to t1, the latest it saw). The pass links t2 to t1 and t4 to t3, all in t1's
    /// session (t3's captured session was inherited, not a header's), think times from the
    /// parents' ends.
    #[test]
    fn turns_spread_over_captures_link_as_one_conversation() {
        let mut t1 = row("t1", 0, 10, &[], 100);
        captured(&mut t1, None);
        let mut t2 = row("t2", 30, 10, &[100], 200);
        captured(&mut t2, None);
        let mut t3 = row("t3", 50, 10, &[100, 200], 300);
        captured(&mut t3, Some(("t2", "t2")));
        let mut t4 = row("t4", 70, 10, &[100, 200, 300], 400);
        captured(&mut t4, Some(("t1", "t1")));
        // A header session, on a row its capture left unlinked: kept.
        let mut h = row("h", 75, 10, &[999], 500);
        h.session_id = Some("H".into());
        let (out, counts) = run(vec![t1, t2, t3, t4, h]);
        let by: Vec<_> = out
            .iter()
            .map(|r| {
                (
                    r.request_id.as_str(),
                    r.parent_request_id.as_deref(),
                    r.session_id.as_deref(),
                    r.think_time_us,
                )
            })
            .collect();
        assert_eq!(
            by,
            [
                ("t1", None, Some("t1"), None),
                ("t2", Some("t1"), Some("t1"), Some(20_000)),
                ("t3", Some("t2"), Some("t1"), Some(10_000)),
                ("t4", Some("t3"), Some("t1"), Some(10_000)),
                ("h", None, Some("H"), None),
            ]
        );
        assert_eq!(
            (
                counts.linked,
                counts.relinked,
                counts.agreed,
                counts.conflicts
            ),
            (1, 1, 1, 0)
        );
    }

    /// Rows come out in the order they finished (a long request before a short one that
    /// arrived later comes out after it), held no longer than that; an exact link the pass
    /// does not find is kept and counted; a row without keys is left as it is.
    #[test]
    fn rows_finish_in_order_and_conflicts_are_kept_and_counted() {
        let long = row("long", 0, 100, &[], 1);
        let short = row("short", 10, 5, &[], 2);
        let mut tool = row("tool", 50, 5, &[], 3);
        tool.session_id = Some("long".into());
        tool.parent_request_id = Some("long".into());
        tool.parent_link = Some(ParentLink::ToolCall);
        tool.think_time_us = Some(7);
        let mut plain = TraceRecord::new("perf", 60_000, "/v1/chat/completions");
        plain.session_id = Some("perf".into());
        let (out, counts) = run(vec![long, short, tool, plain]);
        let order: Vec<_> = out.iter().map(|r| r.request_id.as_str()).collect();
        assert_eq!(order, ["short", "tool", "perf", "long"]);
        let tool = &out[1];
        assert_eq!(
            (tool.parent_request_id.as_deref(), tool.think_time_us),
            (Some("long"), Some(7))
        );
        assert_eq!((counts.conflicts, counts.without_keys), (1, 1));
        assert!(counts.examples[0].contains("captured parent long (tool_call)"));
        assert_eq!(counts.peak_held, 3);
    }
}
