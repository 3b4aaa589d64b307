//! `llmreplay rekey`: a trace's content hashes under another key (trace_format::rekey says who
//! can, and how).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use trace_format::keyed::HashKey;
use trace_format::rekey::{Plan, RekeyError, Source};

/// Flags of `llmreplay rekey`.
#[derive(Args, Debug)]
pub(crate) struct RekeyArgs {
    /// Trace files, directories, globs or object-store prefixes (one capture, or several made
    /// under one key).
    #[arg(required = true)]
    traces: Vec<String>,
    /// The file holding the new key (64 hex digits; created 0600 when missing). Never written
    /// into the output, which records its id.
    #[arg(long, value_name = "PATH")]
    key_file: PathBuf,
    /// The file holding the trace's own key: its holder can re-key a trace of any grade.
    /// Without it, only a `--privacy full` trace can be re-keyed (its hashes derived again
    /// from its bodies), or a capture from before keyed hashes.
    #[arg(long, value_name = "PATH")]
    old_key_file: Option<PathBuf>,
    /// The tokenizer that derives a `full` trace's hashes again from its bodies (default: the
    /// one its manifest names; it must be the capture's).
    #[arg(long)]
    tokenizer: Option<String>,
    /// The output Parquet file.
    #[arg(short, long)]
    output: PathBuf,
}

/// Runs `llmreplay rekey`.
pub(crate) fn run_rekey(a: RekeyArgs, command: &str) -> Result<()> {
    let stream = crate::traces::open_stream(&a.traces).context("reading the trace")?;
    let metas: Vec<_> = stream.files().iter().map(|f| &f.meta).collect();
    let manifest = trace_format::file_meta::carried(metas.iter().copied());
    let block_size = metas.iter().find_map(|m| m.block_size);
    if manifest.is_none() && block_size.is_none() {
        crate::exit::refuse!(
            "{}",
            RekeyError::NothingToRekey {
                grade: "none".into()
            }
        );
    }
    let old = a
        .old_key_file
        .as_deref()
        .map(HashKey::load)
        .transpose()
        .context("--old-key-file")?;
    let (to, created) = HashKey::load_or_create(&a.key_file).context("--key-file")?;
    if created {
        eprintln!(
            "llmreplay rekey: the new key (id {}) was just created in {}",
            to.id(),
            a.key_file.display()
        );
    }
    let plan = match Plan::of(manifest.as_ref(), old, to) {
        Ok(p) => p,
        Err(e) => crate::exit::refuse!("{e}"),
    };
    let tokenizer_name = a
        .tokenizer
        .clone()
        .or_else(|| manifest.as_ref().map(|m| m.tokenizer.clone()))
        .unwrap_or_else(|| "words".into());
    let bs = block_size.unwrap_or(16);
    let tokenizer = match plan.source {
        Source::Bodies => Some(
            proxy::Tokenizer::load(&tokenizer_name)
                .with_context(|| format!("loading the tokenizer {tokenizer_name}"))?,
        ),
        _ => None,
    };
    let derive = |r: &trace_format::TraceRecord| {
        let tok = tokenizer.as_ref()?;
        proxy::recording::prefix_hashes_of_body(&r.endpoint, r.body.as_deref()?, bs, tok)
    };
    let mut out = trace_format::TraceFileWriter::create(&a.output)
        .with_context(|| format!("writing {}", a.output.display()))?;
    for r in stream.records() {
        let mut r = r.context("reading the trace")?;
        if let Err(e) = plan.record(&mut r, &derive, &tokenizer_name) {
            crate::exit::refuse!("{e}");
        }
        out.push(r)
            .with_context(|| format!("writing {}", a.output.display()))?;
    }
    let rows = out.rows();
    let first = metas.first().copied();
    let mut meta = trace_format::file_meta::FileMeta::new(
        first.map_or(trace_format::Producer::Capture, |m| m.producer),
        command,
    );
    meta.source = first.and_then(|m| m.source.clone());
    meta.block_size = block_size;
    meta.extra = first.map(|m| m.extra.clone()).unwrap_or_default();
    meta.privacy = Some(plan.manifest(manifest.as_ref(), bs));
    out.finish(&meta)
        .with_context(|| format!("writing {}", a.output.display()))?;
    let how = match plan.source {
        Source::OldKey(_) => "with the trace's own key",
        Source::Unkeyed => "from the unkeyed hashes of a capture before keyed hashing",
        Source::Bodies => "derived again from the bodies",
    };
    eprintln!(
        "{rows} rows written to {} under key id {} ({how}; key ids: was {}, grade {})",
        a.output.display(),
        plan.to.id(),
        manifest
            .as_ref()
            .and_then(|m| m.key_id.as_deref())
            .unwrap_or("unkeyed"),
        plan.grade
    );
    Ok(())
}
