//! What a trace lets out of the building: the privacy grade a capture writes under
//! ([`Grade`]), which columns hold content-derived values ([`content_column`], the one list),
//! the manifest every capture file carries in its metadata ([`Manifest`], under
//! [`crate::schema::meta::PRIVACY`]); the check that traces hashed under different keys
//! are never combined is [`crate::file_meta::one_key`].

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::keyed::KeyId;
use crate::schema::col;

/// How much of the content a capture writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grade {
    /// Timings, counts, outcomes, sessions and links only: no content-derived value at all.
    Perf,
    /// No text; content only as keyed hashes (prefix blocks, tool names). The default.
    #[default]
    Hashes,
    /// The request JSON and tool names as sent, and the keyed hashes.
    Full,
}

impl Grade {
    /// The grade's name (`--privacy`).
    pub fn as_str(self) -> &'static str {
        match self {
            Grade::Perf => "perf",
            Grade::Hashes => "hashes",
            Grade::Full => "full",
        }
    }

    /// Whether prompts are hashed (and the file needs a key).
    pub fn hashes(self) -> bool {
        self != Grade::Perf
    }

    /// What each content-derived column holds under this grade (none under `perf`).
    pub fn content_columns(self) -> Vec<(&'static str, Held)> {
        CONTENT_COLUMNS
            .iter()
            .filter_map(|&(c, perf, hashes, full)| {
                let h = match self {
                    Grade::Perf => perf,
                    Grade::Hashes => hashes,
                    Grade::Full => full,
                };
                (h != Held::Null).then_some((c, h))
            })
            .collect()
    }
}

impl fmt::Display for Grade {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Grade {
    type Err = String;
    fn from_str(s: &str) -> Result<Grade, String> {
        match s {
            "perf" => Ok(Grade::Perf),
            "hashes" => Ok(Grade::Hashes),
            "full" => Ok(Grade::Full),
            o => Err(format!(
                "unknown privacy grade {o:?} (expected perf, hashes or full)"
            )),
        }
    }
}

/// What a content-derived column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Held {
    /// Always null.
    Null,
    /// Values of the keyed hash ([`crate::keyed`]).
    Keyed,
    /// The content itself.
    Text,
}

/// The content-derived columns, once: (column, under perf, hashes, full).
const CONTENT_COLUMNS: &[(&str, Held, Held, Held)] = &[
    (col::BODY, Held::Null, Held::Null, Held::Text),
    (col::PREFIX_HASHES, Held::Null, Held::Keyed, Held::Keyed),
    (col::TOOL_NAMES, Held::Null, Held::Keyed, Held::Text),
    (col::TOOL_CALL_NAMES, Held::Null, Held::Keyed, Held::Text),
    // The link keys: keyed under every grade that hashes (hashes of content, call ids and
    // of who sent a request), none under `perf` (so `perf` traces link within one capture
    // only).
    (col::LINK_CHAT_KEYS, Held::Null, Held::Keyed, Held::Keyed),
    (col::LINK_ANSWER_KEY, Held::Null, Held::Keyed, Held::Keyed),
    (col::LINK_CALL_KEYS, Held::Null, Held::Keyed, Held::Keyed),
    (col::LINK_ARG_KEYS, Held::Null, Held::Keyed, Held::Keyed),
    (col::LINK_RESULT_KEY, Held::Null, Held::Keyed, Held::Keyed),
    (col::LINK_OPENING_KEY, Held::Null, Held::Keyed, Held::Keyed),
    (col::LINK_CLIENT_KEY, Held::Null, Held::Keyed, Held::Keyed),
    (col::LINK_RESPONSE_KEY, Held::Null, Held::Keyed, Held::Keyed),
    (
        col::LINK_PREVIOUS_RESPONSE_KEY,
        Held::Null,
        Held::Keyed,
        Held::Keyed,
    ),
];

/// Whether a column of the schema holds values derived from request or response content
/// (text, or hashes of it), as opposed to timings, counts, outcomes, sizes, ids and links;
/// None for a name that is no column of the schema (so a new column must be classified).
pub fn content_column(name: &str) -> Option<bool> {
    if CONTENT_COLUMNS.iter().any(|c| c.0 == name) {
        return Some(true);
    }
    crate::schema::schema()
        .field_with_name(name)
        .ok()
        .map(|_| false)
}

/// What the `error` column keeps of an error's text under `grade`: under `perf`, its kind
/// only — the words before the first colon (`HTTP 400`, `response failed`, `stream error`),
/// never the message after it, which is the upstream's and may quote the prompt; else all.
pub fn error_text(grade: Grade, text: String) -> String {
    match (grade, text.split_once(':')) {
        (Grade::Perf, Some((kind, _))) => kind.trim_end().to_string(),
        _ => text,
    }
}

/// The privacy manifest of a capture file (JSON under [`crate::schema::meta::PRIVACY`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The grade the capture wrote under.
    pub grade: Grade,
    /// The key the hashes were made under (none under `perf`).
    pub key_id: Option<String>,
    /// Tokens per `prefix_hashes` block (none under `perf`).
    pub block_size: Option<u32>,
    /// The tokenizer that counted the blocks.
    pub tokenizer: String,
    /// Each content-derived column the file may hold and what it holds (`keyed`, `text`);
    /// every other content-derived column is null.
    pub content_columns: Vec<(String, Held)>,
    /// The capturing llmreplay's version.
    pub capture_version: String,
    /// A warning the grade calls for (`full`: the file holds prompts).
    pub note: Option<String>,
    /// What the capture knew it had lost when it closed this file (None: not a capture's
    /// running count, e.g. a file a later start finished from a journal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<Loss>,
    /// Arrival times were rounded down to a multiple of this many milliseconds
    /// (`capture --time-bucket`): the trace's time resolution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_bucket_ms: Option<u64>,
}

/// What a capture knows it lost: counted since the capture started, as of the moment the
/// file carrying it was closed (so a later file's counts include an earlier's of the same
/// capture; [`Loss::combine`] sums captures, each by its latest counts).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Loss {
    /// The capture these counts are of (random, one per start).
    pub capture: String,
    /// Rows dropped because the recorder's queue was full.
    pub queue_full: u64,
    /// Rows dropped because the trace directory could not take them (full disk, I/O error).
    pub write_failed: u64,
    /// Rows written without their `prefix_hashes` (the tokenizing was shed under overload).
    pub shed_prefix_hashes: u64,
    /// Rows whose prompt token count is an estimate (shed).
    pub shed_prompt_tokens: u64,
    /// Rows whose output token count is an estimate (shed).
    pub shed_output_tokens: u64,
    /// Requests forwarded without a record (not a recorded API).
    pub unrecorded: u64,
    /// Those requests by method and path (the first 32 pairs; the rest count in `unrecorded`
    /// only).
    pub unrecorded_paths: Vec<(String, String, u64)>,
    /// Rows a `kill -9` can lose, uncounted: those of requests that ended within this many
    /// milliseconds before it (the journal's flush interval), and the requests in flight.
    pub crash_window_ms: u64,
    /// Files whose loss is not known, when several are combined (finished from a journal a
    /// previous start left).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unknown_files: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Loss {
    /// A fresh capture id (random, 16 hex digits) for [`Loss::capture`].
    pub fn new_capture_id() -> String {
        format!("{:016x}", rand::random::<u64>())
    }

    /// The rows lost outright (dropped, never in any file).
    pub fn rows_dropped(&self) -> u64 {
        self.queue_full + self.write_failed
    }

    /// The losses of several files together: each capture's latest counts (the largest,
    /// they only grow), summed over captures; a file without counts (`None`) is counted in
    /// `unknown_files`. None when no file has counts.
    pub fn combine<'a>(losses: impl IntoIterator<Item = Option<&'a Loss>>) -> Option<Loss> {
        let mut latest: Vec<Loss> = Vec::new();
        let mut unknown = 0;
        for l in losses {
            let Some(l) = l else {
                unknown += 1;
                continue;
            };
            unknown += l.unknown_files;
            match latest.iter_mut().find(|x| x.capture == l.capture) {
                // The counts only grow: the largest of each is the latest.
                Some(x) => x.absorb(l, u64::max),
                None => latest.push(l.clone()),
            }
        }
        let mut it = latest.into_iter();
        let mut sum = it.next()?;
        for l in it {
            sum.capture = format!("{}+{}", sum.capture, l.capture);
            sum.absorb(&l, |a, b| a + b);
        }
        sum.unknown_files = unknown;
        Some(sum)
    }

    /// Folds `l`'s counts into these by `f` (max: the same capture's later counts; sum:
    /// another capture's).
    fn absorb(&mut self, l: &Loss, f: fn(u64, u64) -> u64) {
        self.queue_full = f(self.queue_full, l.queue_full);
        self.write_failed = f(self.write_failed, l.write_failed);
        self.shed_prefix_hashes = f(self.shed_prefix_hashes, l.shed_prefix_hashes);
        self.shed_prompt_tokens = f(self.shed_prompt_tokens, l.shed_prompt_tokens);
        self.shed_output_tokens = f(self.shed_output_tokens, l.shed_output_tokens);
        self.unrecorded = f(self.unrecorded, l.unrecorded);
        for (m, p, n) in &l.unrecorded_paths {
            match self
                .unrecorded_paths
                .iter_mut()
                .find(|e| e.0 == *m && e.1 == *p)
            {
                Some(e) => e.2 = f(e.2, *n),
                None => self.unrecorded_paths.push((m.clone(), p.clone(), *n)),
            }
        }
        self.crash_window_ms = self.crash_window_ms.max(l.crash_window_ms);
    }

    /// Lines for a human (under the manifest's in `inspect`).
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![
            format!(
                "lost: {} rows dropped ({} recorder queue full, {} trace directory could not \
                 take them)",
                self.rows_dropped(),
                self.queue_full,
                self.write_failed
            ),
            format!(
                "shed: {} rows without prefix hashes, {} prompt and {} output token counts \
                 estimated",
                self.shed_prefix_hashes, self.shed_prompt_tokens, self.shed_output_tokens
            ),
        ];
        let paths = self
            .unrecorded_paths
            .iter()
            .map(|(m, p, n)| format!("{m} {p} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        out.push(if paths.is_empty() {
            format!("not recorded: {} requests", self.unrecorded)
        } else {
            format!("not recorded: {} requests ({paths})", self.unrecorded)
        });
        out.push(format!(
            "crash window: a kill -9 loses, uncounted, the requests in flight and those ended \
             in its last {} ms",
            self.crash_window_ms
        ));
        if self.unknown_files > 0 {
            out.push(format!(
                "{} file(s) finished from an earlier start's journal: their losses are unknown",
                self.unknown_files
            ));
        }
        out
    }
}

impl Manifest {
    /// The manifest of a capture under `grade`, its hashes under key `key_id`.
    pub fn new(grade: Grade, key_id: Option<&KeyId>, block_size: u32, tokenizer: &str) -> Self {
        Manifest {
            grade,
            key_id: key_id.filter(|_| grade.hashes()).map(|k| k.0.clone()),
            block_size: grade.hashes().then_some(block_size),
            tokenizer: tokenizer.to_string(),
            content_columns: grade
                .content_columns()
                .into_iter()
                .map(|(c, h)| (c.to_string(), h))
                .collect(),
            capture_version: env!("CARGO_PKG_VERSION").to_string(),
            note: (grade == Grade::Full).then(|| {
                "FULL: this file holds the request bodies (prompts) and tool names as sent; \
                 it is as sensitive as the traffic itself"
                    .to_string()
            }),
            loss: None,
            time_bucket_ms: None,
        }
    }

    /// The manifest without its loss counts: what files of one capture share.
    pub fn without_loss(&self) -> Manifest {
        Manifest {
            loss: None,
            ..self.clone()
        }
    }

    /// The manifests of several files, each distinct one once (their loss counts aside),
    /// with the loss of the files sharing it combined ([`Loss::combine`]).
    pub fn distinct<'a>(all: impl IntoIterator<Item = &'a Manifest>) -> Vec<Manifest> {
        let mut out: Vec<(Manifest, Vec<Option<&'a Loss>>)> = Vec::new();
        for m in all {
            let bare = m.without_loss();
            match out.iter_mut().find(|(b, _)| *b == bare) {
                Some((_, l)) => l.push(m.loss.as_ref()),
                None => out.push((bare, vec![m.loss.as_ref()])),
            }
        }
        out.into_iter()
            .map(|(mut m, l)| {
                // Files without counts matter only beside files with them (a capture).
                m.loss = Loss::combine(l);
                m
            })
            .collect()
    }

    /// The JSON stored in the file.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The manifest from its stored JSON.
    pub fn from_json(s: &str, path: &Path) -> Result<Manifest> {
        serde_json::from_str(s)
            .map_err(|e| Error::format(path, format!("{}: {e}", crate::schema::meta::PRIVACY)))
    }

    /// Lines for a human (`inspect` prints them first).
    pub fn lines(&self) -> Vec<String> {
        let held = |h: Held| match h {
            Held::Keyed => "keyed hashes",
            Held::Text => "TEXT",
            Held::Null => "null",
        };
        let cols = if self.content_columns.is_empty() {
            "none (no content-derived value)".to_string()
        } else {
            self.content_columns
                .iter()
                .map(|(c, h)| format!("{c} ({})", held(*h)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut out = vec![
            format!("grade: {}", self.grade),
            format!("key id: {}", self.key_id.as_deref().unwrap_or("none")),
            format!(
                "blocks: {} tokens, tokenizer {}",
                self.block_size
                    .map_or("none".to_string(), |b| b.to_string()),
                self.tokenizer
            ),
            format!("content-derived columns: {cols}"),
            format!("captured by llmreplay {}", self.capture_version),
        ];
        if let Some(n) = &self.note {
            out.push(format!("NOTE: {n}"));
        }
        if let Some(b) = self.time_bucket_ms {
            out.push(format!(
                "arrival times rounded down to {b} ms buckets (the trace's time resolution)"
            ));
        }
        if let Some(l) = &self.loss {
            out.extend(l.lines());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under perf an error keeps its kind, not the upstream's message quoting the prompt.
    #[test]
    fn a_perf_error_keeps_its_kind_not_its_message() {
        let quoted = "HTTP 400: prompt 'my account is 12345' is too long".to_string();
        assert_eq!(error_text(Grade::Perf, quoted.clone()), "HTTP 400");
        assert_eq!(error_text(Grade::Hashes, quoted.clone()), quoted);
        let ours = "cancelled by the client".to_string();
        assert_eq!(error_text(Grade::Perf, ours.clone()), ours);
    }

    /// Every column of the schema is classified, and the content-derived ones are exactly
    /// the list; perf keeps none of them, full keeps text.
    #[test]
    fn every_column_is_classified() {
        let schema = crate::schema::schema();
        let content: Vec<&str> = schema
            .fields()
            .iter()
            .filter(|f| content_column(f.name()).expect("classified"))
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(
            content,
            [
                col::BODY,
                col::PREFIX_HASHES,
                col::TOOL_NAMES,
                col::TOOL_CALL_NAMES,
                col::LINK_CHAT_KEYS,
                col::LINK_ANSWER_KEY,
                col::LINK_CALL_KEYS,
                col::LINK_ARG_KEYS,
                col::LINK_RESULT_KEY,
                col::LINK_OPENING_KEY,
                col::LINK_CLIENT_KEY,
                col::LINK_RESPONSE_KEY,
                col::LINK_PREVIOUS_RESPONSE_KEY,
            ]
        );
        assert_eq!(content_column("no_such_column"), None);
        assert!(Grade::Perf.content_columns().is_empty());
        let m = Manifest::new(Grade::Full, Some(&KeyId("ab".into())), 16, "words");
        assert!(m.note.is_some() && m.key_id.as_deref() == Some("ab"));
        let back = Manifest::from_json(&m.to_json(), Path::new("x")).unwrap();
        assert_eq!(back, m);
        let p = Manifest::new(Grade::Perf, Some(&KeyId("ab".into())), 16, "words");
        assert_eq!((p.key_id, p.block_size), (None, None));
    }

    /// Files of one capture combine by their latest counts (each file's are as of its
    /// close), captures add up, files without counts are said to be unknown, and manifests
    /// differing only in their counts are printed once.
    #[test]
    fn losses_combine_per_capture_then_add_up() {
        let loss = |capture: &str, queue_full, unrecorded| Loss {
            capture: capture.into(),
            queue_full,
            unrecorded,
            unrecorded_paths: vec![("GET".into(), "/v1/models".into(), unrecorded)],
            crash_window_ms: 200,
            ..Loss::default()
        };
        let (a1, a2, b) = (loss("a", 1, 2), loss("a", 5, 3), loss("b", 7, 1));
        let one = Loss::combine([Some(&a2), Some(&a1)]).unwrap();
        assert_eq!(one, a2);
        let all = Loss::combine([Some(&a1), None, Some(&b), Some(&a2)]).unwrap();
        assert_eq!(
            (all.queue_full, all.unrecorded, all.unknown_files),
            (12, 4, 1)
        );
        assert_eq!(all.unrecorded_paths[0].2, 4);
        assert_eq!(Loss::combine([None]), None);
        let text = all.lines().join("\n");
        assert!(
            text.contains("12 rows dropped (12 recorder queue full"),
            "{text}"
        );
        assert!(
            text.contains("1 file(s) finished from an earlier start"),
            "{text}"
        );

        let m = Manifest::new(Grade::Hashes, Some(&KeyId("ab".into())), 16, "words");
        let with = |l: &Loss| Manifest {
            loss: Some(l.clone()),
            ..m.clone()
        };
        let d = Manifest::distinct([&with(&a1), &with(&a2), &with(&b)]);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].loss.as_ref().unwrap().queue_full, 12);
        let back = Manifest::from_json(&with(&a1).to_json(), Path::new("x")).unwrap();
        assert_eq!(back, with(&a1));
        // A manifest from before loss counts reads as none.
        let old = m.to_json();
        assert!(!old.contains("loss"));
        assert_eq!(
            Manifest::from_json(&old, Path::new("x")).unwrap().loss,
            None
        );
    }
}
