//! A trace file's provenance: the key-value metadata every writer puts in a file and the
//! reader checks (schema version first).

use std::collections::BTreeMap;
use std::path::Path;

use parquet::file::metadata::KeyValue;

use crate::error::{Error, Result};
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
        })
    }
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
