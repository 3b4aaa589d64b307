//! What a plain replay (one run per target, no sweep) writes once its runs are done: each
//! target's JSON result (`--save-result`; with several targets one file each, the name
//! inserted: [`save_result`]), marked partial when a run was interrupted. Every file goes
//! through `store`, so a local path and an object-store URL (`s3://`, `gs://`, `az://`) are
//! written alike. Every target's per-request rows (`--results`) are written while the runs
//! go, by [`crate::parquet_sink::ResultsSink`], with the metadata made here ([`results_meta`],
//! [`add_target_meta`]). The console report beside them is `reporting::outputs`'.
//!
//! The runs themselves are [`replay::replay`]'s; this module only reads them.

use std::path::{Path, PathBuf};

use trace_format::{FileMeta, Producer};

use replay::config::ValidatedConfig;
use replay::error::ReplayError;
use replay::metrics::Metrics;
use replay::run::RunOutput;

use crate::build::{self, ResultInputs, TraceIdentity};
use crate::settings::RunSettings;

/// Writes one run's JSON result to `path` (with `many` targets, the target's name inserted:
/// [`per_target_path`]); where it went.
pub fn save_result(path: &Path, many: bool, inputs: &ResultInputs) -> Result<String, ReplayError> {
    let p = per_target_path(path, &inputs.run.target.name, many);
    let bytes = build::result_doc(inputs).to_bytes();
    store::write_bytes(&p, bytes).map_err(|e| written(&p, e))
}

/// The metadata of a plain replay's `--results` file known before the run: provenance,
/// the replayed trace (its hash when `identity` has one: a streamed replay learns it at
/// the end, [`crate::parquet_sink::ResultsSink::set_trace_hash`]), label, shard, `--metadata`, the
/// run settings (what `merge` reports the shards ran with) and each target's URL.
/// [`add_target_meta`] adds what each run finds out.
pub fn results_meta(cfg: &ValidatedConfig, identity: &TraceIdentity, command: &str) -> FileMeta {
    let mut meta = FileMeta::new(Producer::Replay, command.to_string());
    meta.source = Some(identity.files.join(","));
    if !identity.content_hash.is_empty() {
        meta.extra
            .insert(TRACE_HASH_KEY.into(), identity.content_hash.clone());
    }
    if let Some(l) = &cfg.label {
        meta.extra.insert("label".into(), l.clone());
    }
    if let Some(sh) = cfg.selection.shard {
        meta.extra.insert("shard".into(), sh.to_string());
    }
    for (k, v) in &cfg.metadata {
        meta.extra.insert(k.clone(), v.clone());
    }
    meta.extra.insert(
        RunSettings::META_KEY.into(),
        build::run_settings(cfg).to_meta(),
    );
    for t in &cfg.targets {
        meta.extra
            .insert(format!("target.{}.url", t.name), t.url.clone());
    }
    meta
}

/// Adds what the run against a target found out to its results' metadata: the target's
/// models and version, and `interrupted` (the reason) when the run was stopped.
pub fn add_target_meta(meta: &mut FileMeta, run: &RunOutput) {
    let name = &run.target.name;
    meta.extra
        .insert(format!("target.{name}.url"), run.target.url.clone());
    meta.extra.insert(
        format!("target.{name}.models"),
        run.target_info.models.join(","),
    );
    if let Some(v) = &run.target_info.version {
        meta.extra
            .insert(format!("target.{name}.version"), v.to_string());
    }
    if let Some(i) = &run.interrupted {
        meta.extra.insert(INTERRUPTED_KEY.into(), i.reason.clone());
    }
}

/// The results-file metadata key of an interrupted run: why it stopped (absent when every
/// run completed).
pub const INTERRUPTED_KEY: &str = "interrupted";

/// The results-file metadata key of the replayed trace's content hash.
pub const TRACE_HASH_KEY: &str = "trace_content_hash";

/// A write of `path` that failed.
pub(crate) fn written(path: &Path, source: trace_format::Error) -> ReplayError {
    ReplayError::Write {
        path: path.display().to_string(),
        source,
    }
}

/// The worst target whose server-caused failures are more than `max_failed` of the requests
/// the server was asked to serve, as the message that says so: a run most of whose requests
/// failed measured a broken target, not a slow one. What the client did as captured (a
/// cancellation replayed at its point, a captured 4xx) and what the replay changed are not
/// failures of the target (`trace_format::cause`).
pub fn too_many_failed(runs: &[(RunOutput, Metrics)], max_failed: f64) -> Option<String> {
    let (run, m, _) = runs
        .iter()
        .map(|(run, m)| (run, m, m.causes.server_failed_fraction()))
        .filter(|(_, _, f)| *f > max_failed)
        .max_by(|x, y| x.2.total_cmp(&y.2))?;
    let what = m
        .top_errors
        .iter()
        .find(|e| e.cause == trace_format::Cause::Server)
        .map(|e| format!("; most often ({}×) {}: {}", e.requests, e.outcome, e.text))
        .unwrap_or_default();
    Some(format!(
        "{} of {} requests the server was asked to serve at {} failed, over --max-failed {max_failed}{what}",
        m.causes.server,
        m.causes.asked(),
        run.target.name
    ))
}

/// The targets whose verdict ([`crate::run_verdict`]) is FAIL, as the message that says so
/// (`--fail-on-slo`); None when every target passed.
pub fn failed_verdicts(cfg: &ValidatedConfig, runs: &[(RunOutput, Metrics)]) -> Option<String> {
    let failed: Vec<String> = runs
        .iter()
        .filter_map(|(run, m)| {
            let v = build::run_verdict(cfg, m);
            (!v.pass).then(|| format!("{}: {}", run.target.name, v.reason))
        })
        .collect();
    (!failed.is_empty()).then(|| format!("verdict FAIL ({})", failed.join(" | ")))
}

/// With `many` targets, inserts the target name before the extension: `out.json` →
/// `out-NAME.json` (characters other than letters, digits, `-` and `_` as `_`).
pub fn per_target_path(path: &Path, name: &str, many: bool) -> PathBuf {
    if !many {
        return path.to_path_buf();
    }
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // On the string, so an object URL (`s3://b/run.json`) keeps its `//`.
    let full = path.to_string_lossy();
    let (dir, file) = match full.rsplit_once('/') {
        Some((d, f)) => (format!("{d}/"), f),
        None => (String::new(), full.as_ref()),
    };
    let (stem, ext) = match file.rsplit_once('.') {
        Some((st, e)) if !st.is_empty() => (st, format!(".{e}")),
        _ => (file, String::new()),
    };
    PathBuf::from(format!("{dir}{stem}-{safe}{ext}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_target_names() {
        assert_eq!(
            per_target_path(Path::new("r/out.json"), "a:b", true),
            PathBuf::from("r/out-a_b.json")
        );
        assert_eq!(
            per_target_path(Path::new("out.json"), "x", false),
            PathBuf::from("out.json")
        );
        assert_eq!(
            per_target_path(Path::new("s3://b/runs/out.json"), "vllm", true).to_str(),
            Some("s3://b/runs/out-vllm.json")
        );
        assert_eq!(
            per_target_path(Path::new("out"), "x", true).to_str(),
            Some("out-x")
        );
    }
}
