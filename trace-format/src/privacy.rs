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
        }
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
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                col::TOOL_CALL_NAMES
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
}
