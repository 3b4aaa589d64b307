//! Completions (`/v1/completions`) turns linked at capture, from hashes only.
//!
//! A client that holds a conversation over the completions API sends, as each next prompt,
//! the previous prompt, the answer it got, and the new text: `prompt₂ = prompt₁ + answer₁ +
//! "\nUser: …"`. There are no message boundaries to hash at, so a finished completion leaves
//! a key at its prompt's *length*: the hash of its prompt with every whitespace character left
//! out (clients trim, or add a space or newline at the join), that length (in bytes of
//! non-whitespace text) and the [`TextHash`] of its answer. A later prompt is hashed the same
//! way once, and looked up at each length a key was left at (the set of registered lengths,
//! walked in order as the hash goes, so one pass over the prompt whatever their number); a key
//! found there names a candidate parent when the text right after that point, hashed as
//! [`TextHash`] hashes an answer (surrounding whitespace trimmed), passes through that
//! candidate's answer hash. The longest such prefix wins: a conversation's earlier turns are
//! all prefixes of its latest prompt, and the latest is the parent. Identical prompts answered
//! identically are told apart as chat's are ([`crate::linking::sessions::Linker`]): the most recently
//! finished candidate not yet continued, then the most recent.
//!
//! Runs on the writer thread, which sees rows in the order their requests finished (a parent
//! before its child); the prompt's text comes from the prompt runner with the row and is
//! dropped once hashed: no text is kept, so it works under `--record-bodies hashes`. Cost: one
//! pass over the prompt's bytes and over the registered lengths up to the prompt's (at most
//! `max_keys` of them), plus, for each matching key (usually one: the parent), a pass over at
//! most its answer's length.
//!
//! Memory: the keys of the last `max_keys` finished completions ([`DEFAULT_MAX_KEYS`], ~150
//! bytes each), at most [`MAX_CANDIDATES`] per key.

use std::collections::BTreeMap;

use trace_format::{Outcome, ParentLink, TraceRecord};

use crate::linking::bounded::Candidates;
use crate::linking::sessions::{pick, Link, TextHash};
use crate::prefix::{fnv, FNV_OFFSET};

/// Completion keys kept by default (as the chat linker's).
pub const DEFAULT_MAX_KEYS: usize = 200_000;

/// Requests remembered per key (identical prompts, as the chat linker's).
pub const MAX_CANDIDATES: usize = 32;

/// Bytes of a child's prompt scanned for a candidate's answer per generated token (a token is
/// rarely over 16 bytes), plus [`SCAN_SLACK`].
const SCAN_PER_TOKEN: usize = 64;
const SCAN_SLACK: usize = 1024;

#[derive(Debug, Clone)]
struct Candidate {
    request_id: String,
    session_id: String,
    end_us: i64,
    answer: u64,
    /// Longest stretch of a child's prompt its answer can take (bytes; usize::MAX: unknown).
    scan: usize,
    continued: bool,
}

/// A prompt's key: its length without whitespace (bytes) and the hash of that text.
type Key = (u64, u64);

/// Links completions into conversations. Requests are given in the order they finished.
#[derive(Debug)]
pub struct CompletionLinker {
    /// Completions by their prompt's key, the last `max_keys` (at most [`MAX_CANDIDATES`] a
    /// key).
    index: Candidates<Key, Candidate>,
    /// How many remembered candidates have a key at each length.
    lengths: BTreeMap<u64, u32>,
}

/// The key of a prompt, and the (length, hash, byte offset in `prompt` just past that
/// length's last character) at each of `lengths` it reaches.
fn walk<'a>(
    prompt: &str,
    mut lengths: impl Iterator<Item = &'a u64>,
) -> (Key, Vec<(u64, u64, usize)>) {
    let mut hits = Vec::new();
    let mut next = lengths.next().copied();
    let (mut n, mut h) = (0u64, FNV_OFFSET);
    for (i, c) in prompt.char_indices() {
        if c.is_whitespace() {
            continue;
        }
        let mut buf = [0u8; 4];
        let b = c.encode_utf8(&mut buf).as_bytes();
        h = fnv(h, b);
        n += b.len() as u64;
        while let Some(l) = next.filter(|&l| l <= n) {
            if l == n {
                hits.push((n, h, i + b.len()));
            }
            next = lengths.next().copied();
        }
    }
    ((n, h), hits)
}

/// Whether `text`, hashed as an answer (from its start, surrounding whitespace trimmed),
/// passes through `answer` within `scan` bytes: after some word, the hash is the answer's.
fn carries(text: &str, answer: u64, scan: usize) -> bool {
    let mut h = TextHash::default();
    let mut seen = 0usize;
    let mut rest = text;
    while !rest.is_empty() && seen <= scan {
        // One run of whitespace and the word after it at a time.
        let ws = rest.len() - rest.trim_start().len();
        let word = rest[ws..]
            .find(char::is_whitespace)
            .map_or(rest.len(), |e| ws + e);
        h.push(&rest[..word]);
        seen += word;
        if h.finish() == answer {
            return true;
        }
        rest = &rest[word..];
    }
    false
}

impl CompletionLinker {
    /// A linker that remembers the last `max_keys` finished completions.
    pub fn new(max_keys: usize) -> Self {
        CompletionLinker {
            index: Candidates::new(max_keys, MAX_CANDIDATES),
            lengths: BTreeMap::new(),
        }
    }

    /// Keys remembered now (at most `max_keys`).
    pub fn remembered(&self) -> usize {
        self.index.len()
    }

    /// Links one finished completion and remembers it for its children. `prompt`: its
    /// prompt; `answer`: the [`TextHash`] of its answer (None: failed or unknown, so nothing
    /// continues it); `output_tokens` bounds how far a child's prompt is searched for the
    /// answer; `header_session`: the session its request header named, which wins.
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        request_id: &str,
        arrival_us: i64,
        end_us: i64,
        prompt: &str,
        answer: Option<u64>,
        output_tokens: Option<i64>,
        header_session: Option<&str>,
    ) -> Link {
        let (key, hits) = walk(prompt, self.lengths.keys());
        let parent = self.parent_of(prompt, &hits, arrival_us);
        let session_id = match (header_session, &parent) {
            (Some(s), _) => s.to_string(),
            (None, Some(p)) => p.session_id.clone(),
            (None, None) => request_id.to_string(),
        };
        // An empty answer continues nothing a child could tell from a retry.
        if let Some(a) = answer.filter(|&a| a != TextHash::default().finish()) {
            let scan = output_tokens
                .and_then(|t| usize::try_from(t).ok())
                .map_or(usize::MAX, |t| {
                    t.saturating_mul(SCAN_PER_TOKEN).saturating_add(SCAN_SLACK)
                });
            let c = Candidate {
                request_id: request_id.to_string(),
                session_id: session_id.clone(),
                end_us,
                answer: a,
                scan,
                continued: false,
            };
            *self.lengths.entry(key.0).or_default() += 1;
            let lengths = &mut self.lengths;
            self.index
                .insert(key, c, |old| forget_length(lengths, old.0));
        }
        Link {
            session_id,
            think_time_us: parent
                .as_ref()
                .map(|p| arrival_us.saturating_sub(p.end_us).max(0)),
            parent_request_id: parent.map(|p| p.request_id),
        }
    }

    /// The parent: at the longest registered length whose key has a candidate whose answer
    /// the prompt carries next.
    fn parent_of(
        &mut self,
        prompt: &str,
        hits: &[(u64, u64, usize)],
        arrival_us: i64,
    ) -> Option<Candidate> {
        for &(n, h, at) in hits.iter().rev() {
            let Some(cands) = self.index.get_mut(&(n, h)) else {
                continue;
            };
            let rest = &prompt[at..];
            let ok: Vec<usize> = (0..cands.len())
                .filter(|&i| carries(rest, cands[i].1.answer, cands[i].1.scan))
                .collect();
            let best = pick(
                ok.iter().copied(),
                arrival_us,
                |i| cands[i].1.end_us,
                |i| cands[i].1.continued,
            );
            if let Some(b) = best {
                cands[b].1.continued = true;
                return Some(cands[b].1.clone());
            }
        }
        None
    }
}

/// One key fewer at length `n`.
fn forget_length(lengths: &mut BTreeMap<u64, u32>, n: u64) {
    if let Some(c) = lengths.get_mut(&n) {
        *c -= 1;
        if *c == 0 {
            lengths.remove(&n);
        }
    }
}

/// A completion request's prompt, taken out of its parsed body (no copy): a string `prompt`
/// (a batch of prompts, or token ids, is not linked).
pub(crate) fn take_prompt(body: &mut serde_json::Map<String, serde_json::Value>) -> Option<String> {
    match body.remove("prompt")? {
        serde_json::Value::String(s) => Some(s),
        _ => None,
    }
}

/// Links a completions row into its conversation on the writer thread: `session_id` (the
/// header's, else the conversation's first request id), `parent_request_id`,
/// `think_time_us`, `parent_link` = completion prefix. Only a complete answer can be
/// continued.
pub(crate) fn link(
    rec: &mut TraceRecord,
    prompt: &str,
    answer: Option<u64>,
    linker: &mut CompletionLinker,
) {
    let end_us = rec
        .arrival_time_us
        .saturating_add(rec.e2el_us.unwrap_or(0).max(0));
    let answer = answer.filter(|_| rec.outcome == Outcome::Ok);
    let l = linker.observe(
        &rec.request_id,
        rec.arrival_time_us,
        end_us,
        prompt,
        answer,
        rec.output_tokens,
        rec.session_id.as_deref(),
    );
    rec.session_id = Some(l.session_id);
    rec.parent_link = l
        .parent_request_id
        .is_some()
        .then_some(ParentLink::CompletionPrefix);
    rec.parent_request_id = l.parent_request_id;
    rec.think_time_us = l.think_time_us;
}

#[cfg(test)]
#[path = "completions_tests.rs"]
mod tests;
