//! A trace file's provenance: the key-value metadata every writer puts in a file and the
//! reader checks (schema version first), and the check that files hashed under different keys
//! are never combined ([`one_key`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use parquet::file::metadata::KeyValue;

use crate::error::{Error, Result};
use crate::fleet::CaptureInfo;
use crate::privacy::Manifest;
use crate::redact;
use crate::schema::{self, meta, Producer, SCHEMA_MAJOR};

/// Provenance written into a file's key-value metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    /// Which program wrote the file.
    pub producer: Producer,
    /// The producing command line.
    pub command: String,
    /// For imports: the source file(s) and format.
    pub source: Option<String>,
    /// Block size of `prefix_hashes`, in tokens.
    pub block_size: Option<u32>,
    /// Free-form provenance (`--metadata K=V`, target info), stored under
    /// [`meta::EXTRA_PREFIX`].
    pub extra: BTreeMap<String, String>,
    /// A capture's privacy manifest (grade, key id, content-derived columns), stored under
    /// [`meta::PRIVACY`]; a replay's results carry their trace's.
    pub privacy: Option<Manifest>,
    /// The capture(s) whose rows the file holds (id, start, clock): the capture that wrote
    /// it, or each capture a `link` pass joined; stored under [`meta::CAPTURES`].
    pub captures: Vec<CaptureInfo>,
}

impl FileMeta {
    /// Metadata with the given producer and command, and nothing else.
    pub fn new(producer: Producer, command: impl Into<String>) -> Self {
        FileMeta {
            producer,
            command: command.into(),
            source: None,
            block_size: None,
            extra: BTreeMap::new(),
            privacy: None,
            captures: Vec::new(),
        }
    }

    /// The Parquet key-value pairs: schema and tool versions, producer, command, source,
    /// block size and the extra keys, each value through [`redact::redact_text`].
    pub fn to_kv(&self) -> Vec<KeyValue> {
        let kv =
            |k: &str, v: String| KeyValue::new(k.to_string(), redact::redact_text(&v).into_owned());
        let mut out = vec![
            kv(meta::SCHEMA_VERSION, schema::SCHEMA_VERSION.to_string()),
            kv(meta::PRODUCER, self.producer.as_str().to_string()),
            kv(meta::TOOL_VERSION, env!("CARGO_PKG_VERSION").to_string()),
            kv(meta::COMMAND, self.command.clone()),
        ];
        if let Some(s) = &self.source {
            out.push(kv(meta::SOURCE, s.clone()));
        }
        if let Some(b) = self.block_size {
            out.push(kv(meta::BLOCK_SIZE, b.to_string()));
        }
        for (k, v) in &self.extra {
            out.push(kv(&format!("{}{k}", meta::EXTRA_PREFIX), v.clone()));
        }
        if let Some(m) = &self.privacy {
            out.push(KeyValue::new(meta::PRIVACY.to_string(), m.to_json()));
        }
        if !self.captures.is_empty() {
            let json = serde_json::to_string(&self.captures).unwrap_or_default();
            out.push(KeyValue::new(meta::CAPTURES.to_string(), json));
        }
        out
    }

    /// Reads the metadata back from a file's key-value pairs, checking the schema version:
    /// no version key → [`Error::NotATrace`], another major version →
    /// [`Error::UnsupportedVersion`]. Unknown `llmreplay.*` keys are ignored.
    pub fn from_kv(kv: &[KeyValue], path: &Path) -> Result<FileMeta> {
        let get = |key: &str| {
            kv.iter()
                .find(|e| e.key == key)
                .and_then(|e| e.value.as_deref())
        };
        let version = get(meta::SCHEMA_VERSION).ok_or_else(|| Error::NotATrace {
            path: path.to_path_buf(),
            reason: format!("no {} in the file metadata", meta::SCHEMA_VERSION),
        })?;
        check_version(version, path)?;
        let producer = get(meta::PRODUCER)
            .ok_or_else(|| Error::NotATrace {
                path: path.to_path_buf(),
                reason: format!("no {} in the file metadata", meta::PRODUCER),
            })?
            .parse::<Producer>()
            .map_err(|e| Error::format(path, format!("{}: {e}", meta::PRODUCER)))?;
        let block_size = get(meta::BLOCK_SIZE)
            .map(|s| {
                s.parse::<u32>()
                    .map_err(|e| Error::format(path, format!("{} {s:?}: {e}", meta::BLOCK_SIZE)))
            })
            .transpose()?;
        let extra = kv
            .iter()
            .filter_map(|e| {
                let k = e.key.strip_prefix(meta::EXTRA_PREFIX)?;
                Some((k.to_string(), e.value.clone().unwrap_or_default()))
            })
            .collect();
        Ok(FileMeta {
            producer,
            command: get(meta::COMMAND).unwrap_or_default().to_string(),
            source: get(meta::SOURCE).map(str::to_string),
            block_size,
            extra,
            privacy: get(meta::PRIVACY)
                .map(|s| Manifest::from_json(s, path))
                .transpose()?,
            captures: get(meta::CAPTURES)
                .map(|s| {
                    serde_json::from_str(s)
                        .map_err(|e| Error::format(path, format!("{}: {e}", meta::CAPTURES)))
                })
                .transpose()?
                .unwrap_or_default(),
        })
    }
}

/// The hashing a file's `prefix_hashes` were made with, for comparing files: under a key
/// (its id), unkeyed (a capture before keyed hashing, with prefix hashes), or none to compare.
fn key_of(meta: &FileMeta) -> Option<String> {
    match &meta.privacy {
        Some(m) => m.key_id.clone(),
        None if meta.producer == Producer::Capture && meta.block_size.is_some() => {
            Some("unkeyed".to_string())
        }
        None => None,
    }
}

/// The one key the files' hashes were made under (None when no file has keyed hashes), or
/// an error naming two files and their key ids when they differ: hashes under different keys
/// never compare, so combining them would silently lose every shared prefix and link.
pub fn one_key<'a>(
    files: impl IntoIterator<Item = (&'a Path, &'a FileMeta)>,
) -> Result<Option<String>> {
    let mut first: Option<(PathBuf, String)> = None;
    for (path, meta) in files {
        let Some(k) = key_of(meta) else { continue };
        match &first {
            None => first = Some((path.to_path_buf(), k)),
            Some((p0, k0)) if *k0 != k => {
                return Err(Error::KeysDiffer {
                    a: p0.clone(),
                    a_key: k0.clone(),
                    b: path.to_path_buf(),
                    b_key: k,
                })
            }
            Some(_) => {}
        }
    }
    Ok(first.map(|(_, k)| k).filter(|k| k != "unkeyed"))
}

/// The manifest a file made from these files carries (a replay's results, a merge): the
/// first naming a key (the files share it, [`one_key`]), else the first, with the loss
/// counts of the files sharing it combined ([`Manifest::distinct`]).
pub fn carried<'a>(metas: impl IntoIterator<Item = &'a FileMeta>) -> Option<Manifest> {
    let all = Manifest::distinct(metas.into_iter().filter_map(|m| m.privacy.as_ref()));
    let i = all.iter().position(|m| m.key_id.is_some()).unwrap_or(0);
    all.into_iter().nth(i)
}

/// Checks that `version` (e.g. `1.0`) has the major version this build reads.
pub(crate) fn check_version(version: &str, path: &Path) -> Result<()> {
    let major = version.split('.').next().unwrap_or_default().trim();
    match major.parse::<u32>() {
        Ok(m) if m == SCHEMA_MAJOR => Ok(()),
        _ => Err(Error::UnsupportedVersion {
            path: path.to_path_buf(),
            found: version.to_string(),
            supported: SCHEMA_MAJOR,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::KeyId;
    use crate::privacy::Grade;

    /// Files under one key combine; under two keys (or keyed with unkeyed) they are refused
    /// with both ids named; files without hashes combine with anything.
    #[test]
    fn keys_never_mix() {
        let meta = |key: Option<&str>| {
            let mut m = FileMeta::new(Producer::Capture, "c");
            m.block_size = Some(16);
            m.privacy =
                key.map(|k| Manifest::new(Grade::Hashes, Some(&KeyId(k.into())), 16, "words"));
            m
        };
        let (a, b, old) = (meta(Some("aaaa")), meta(Some("bbbb")), meta(None));
        let perf = {
            let mut m = FileMeta::new(Producer::Capture, "c");
            m.privacy = Some(Manifest::new(Grade::Perf, None, 16, "words"));
            m
        };
        let p = Path::new;
        let ok = one_key([(p("1"), &a), (p("2"), &a), (p("3"), &perf)]).unwrap();
        assert_eq!(ok.as_deref(), Some("aaaa"));
        let e = one_key([(p("1"), &a), (p("2"), &perf), (p("3"), &b)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("aaaa") && e.contains("bbbb") && e.contains('3'),
            "{e}"
        );
        let e = one_key([(p("1"), &old), (p("2"), &a)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unkeyed") && e.contains("aaaa"), "{e}");
        assert_eq!(one_key([(p("1"), &old), (p("2"), &old)]).unwrap(), None);
    }
}
