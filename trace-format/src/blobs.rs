//! Inline binary stored once (`--privacy full`): an agent re-sends the same screenshots with
//! every turn, so a `full` trace that kept each request's body as sent held each image once
//! per turn. Capture instead writes each large base64 string of a body — a `data:…;base64,`
//! URL (chat's `image_url`, Responses' `input_image`, `input_audio`) or the `"data"` of a
//! base64 source (Anthropic's `image` and `document` blocks) — once, to `blobs/<id>` beside
//! the trace files, and the body holds `llmreplay-blob:<id>` in its place ([`store`]). Every
//! reader of a local trace puts them back ([`restore`], in the reader and the stream), so
//! `replay` sends, `inspect` and pandas-free readers see, the bodies exactly as sent.
//!
//! The id is a 128-bit keyed hash of the string under the capture's key
//! ([`crate::keyed::HashKey::blob_id`]): equal content, one file; and a client cannot craft
//! two images with one id (it would need the key). Nothing is held in memory: a file that
//! exists is not written again. Everything else in the body stays byte for byte.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::keyed::HashKey;

/// What a body holds in place of a stored string.
pub const REF_PREFIX: &str = "llmreplay-blob:";
/// The directory of the blobs, beside the trace files.
pub const DIR: &str = "blobs";
/// Strings shorter than this stay in the body.
pub const MIN_BYTES: usize = 1024;

/// The blob directory of the trace files in `dir`.
pub fn dir_of(trace_dir: &Path) -> PathBuf {
    trace_dir.join(DIR)
}

/// The JSON string literals of `body`: each one's content as byte offsets (between its quotes).
fn literals(body: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(q) = memchr::memchr(b'"', &body[i..]) {
        let start = i + q + 1;
        let mut j = start;
        loop {
            match memchr::memchr2(b'"', b'\\', &body[j..]) {
                Some(k) if body[j + k] == b'\\' => j += k + 2,
                Some(k) => {
                    out.push((start, j + k));
                    i = j + k + 1;
                    break;
                }
                None => return out,
            }
            if j >= body.len() {
                return out;
            }
        }
    }
    out
}

/// Whether the literal at `start..end` is a large base64 string a body carries as binary: a
/// `data:` URL in base64, or the value of a `"data"` member that is all base64.
fn is_binary(body: &[u8], start: usize, end: usize) -> bool {
    let s = &body[start..end];
    if s.len() < MIN_BYTES {
        return false;
    }
    if s.starts_with(b"data:") {
        return s[..s.len().min(128)].windows(8).any(|w| w == b";base64,");
    }
    // `"data"` `:` before it (whitespace allowed).
    let before = body[..start - 1].trim_ascii_end();
    let Some(before) = before.strip_suffix(b":") else {
        return false;
    };
    before.trim_ascii_end().ends_with(b"\"data\"")
        && s.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=' | b'\\'))
}

/// `body` with each large base64 string stored in `dir` (created when missing) and replaced
/// by its reference; None when it holds none. An I/O error leaves the caller to keep the body
/// as it was.
pub fn store(body: &str, dir: &Path, key: &HashKey) -> std::io::Result<Option<String>> {
    if !body.contains("base64") && !body.contains("\"data\"") {
        return Ok(None);
    }
    let b = body.as_bytes();
    let found: Vec<(usize, usize)> = literals(b)
        .into_iter()
        .filter(|&(s, e)| is_binary(b, s, e))
        .collect();
    if found.is_empty() {
        return Ok(None);
    }
    std::fs::create_dir_all(dir)?;
    let mut out = String::with_capacity(body.len() / 4);
    let mut at = 0;
    for (s, e) in found {
        let id = key.blob_id(&b[s..e]);
        let path = dir.join(&id);
        if !path.exists() {
            write_once(&path, &b[s..e])?;
        }
        out.push_str(&body[at..s]);
        out.push_str(REF_PREFIX);
        out.push_str(&id);
        at = e;
    }
    out.push_str(&body[at..]);
    Ok(Some(out))
}

/// Writes `bytes` to `path` whole or not at all (a temporary file renamed; mode 0600).
fn write_once(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let r = o
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// `body` with every reference put back from `dir`; an error names the file of the row and
/// the blob that is missing.
pub fn restore(body: &str, dir: &Path, file: &Path) -> Result<String> {
    let b = body.as_bytes();
    let mut out = String::with_capacity(body.len());
    let mut at = 0;
    for (s, e) in literals(b) {
        let Some(id) = body[s..e].strip_prefix(REF_PREFIX) else {
            continue;
        };
        let path = dir.join(id);
        let text = std::fs::read(&path)
            .ok()
            .and_then(|v| String::from_utf8(v).ok())
            .ok_or_else(|| {
                Error::format(
                    file,
                    format!(
                        "a body refers to {REF_PREFIX}{id}, which is not in {} (copy a \
                         `--privacy full` trace with its blobs directory)",
                        dir.display()
                    ),
                )
            })?;
        out.push_str(&body[at..s]);
        out.push_str(&text);
        at = e;
    }
    out.push_str(&body[at..]);
    Ok(out)
}

/// Puts back the stored strings of the rows read from `file` (its blobs beside it).
pub fn restore_rows(rows: &mut [crate::TraceRecord], file: &Path) -> Result<()> {
    let dir = dir_of(file.parent().unwrap_or(Path::new(".")));
    for r in rows {
        if let Some(b) = &r.body {
            if b.contains(REF_PREFIX) {
                r.body = Some(restore(b, &dir, file)?);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Large base64 strings go once to the directory; the body keeps the rest byte for byte
    /// and reads back exactly; text, short strings and `"data"` that is not base64 stay.
    #[test]
    fn images_are_stored_once_and_read_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let key = HashKey::random();
        let png = format!("data:image/png;base64,{}", "iVBORw0KGgo".repeat(200));
        let raw = "QUJD\\/".repeat(300);
        let text = "word ".repeat(400);
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":[{{"type":"text","text":"{text}"}},{{"type":"image_url","image_url":{{"url":"{png}"}}}},{{"type":"image","source":{{"type":"base64","data" : "{raw}"}}}}]}}],"note":"data:x","x":{{"data":"not base64 at all {text}"}}}}"#
        );
        let again = body.replace("\"note\"", "\"other\"");
        let s1 = store(&body, dir.path(), &key).unwrap().expect("stored");
        let s2 = store(&again, dir.path(), &key).unwrap().expect("stored");
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(
            files.len(),
            2,
            "two distinct strings, stored once for two bodies"
        );
        assert!(!s1.contains("iVBOR") && !s1.contains("QUJD"), "{s1}");
        assert!(s1.contains(&text) && s1.contains("not base64"));
        assert_eq!(s1.matches(REF_PREFIX).count(), 2);
        assert!(
            s1.len() + png.len() + raw.len() < body.len() + 2 * 60,
            "{}",
            s1.len()
        );
        let trace = dir.path().join("t.parquet");
        assert_eq!(restore(&s1, dir.path(), &trace).unwrap(), body);
        assert_eq!(restore(&s2, dir.path(), &trace).unwrap(), again);
        assert!(store(r#"{"a":"b"}"#, dir.path(), &key).unwrap().is_none());
        // A missing blob is an error naming it.
        let lost = s1.replacen(REF_PREFIX, &format!("{REF_PREFIX}0000"), 1);
        let e = restore(&lost, dir.path(), &trace).unwrap_err().to_string();
        assert!(e.contains("t.parquet") && e.contains("0000"), "{e}");
    }
}
