//! `llmreplay synth` (a synthetic trace) and `llmreplay inspect` (a trace's summary).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use replay::config::EndpointKind;
use trace_format::{FileMeta, Producer};

use crate::flags::{command_line, parse_count, parse_fraction, parse_positive, parse_rate};

#[derive(Args, Debug)]
pub(crate) struct SynthArgs {
    /// Output trace file.
    #[arg(short, long)]
    output: PathBuf,
    /// Number of requests.
    #[arg(long, default_value_t = 1000, value_parser = parse_count)]
    num_prompts: usize,
    /// Prompt length, tokens.
    #[arg(long, default_value_t = 1024)]
    input_len: u32,
    /// Output length, tokens.
    #[arg(long, default_value_t = 128)]
    output_len: u32,
    /// Lengths uniform in [len*(1-F), len*(1+F)].
    #[arg(long, default_value_t = 0.0)]
    range_ratio: f64,
    /// Arrival rate, req/s (inf = all at t=0).
    #[arg(long, value_parser = parse_rate, default_value = "inf")]
    request_rate: f64,
    /// Gamma shape of inter-arrivals (1 = Poisson).
    #[arg(long, default_value_t = 1.0, value_parser = parse_positive)]
    burstiness: f64,
    /// Endpoint recorded on every row: completions, chat, responses or messages (replay
    /// sends each row to it, in its API's shape).
    #[arg(long, default_value = "completions")]
    endpoint: EndpointKind,
    /// Fraction of requests that stream.
    #[arg(long, default_value_t = 1.0, value_parser = parse_fraction)]
    stream_ratio: f64,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args, Debug)]
pub(crate) struct InspectArgs {
    /// Trace files, directories, globs or object-store prefixes (Hive partitions included):
    /// several captures are one trace, each capture's rows and span shown.
    #[arg(required = true)]
    traces: Vec<String>,
    #[command(flatten)]
    window: crate::flags::WindowFlags,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Also give the prefix-cache hit rate of LRU caches of these sizes, in blocks of the
    /// trace's block size (the unbounded cache is always given).
    #[arg(long, value_delimiter = ',')]
    cache_blocks: Vec<u64>,
}

pub(crate) fn run_synth(a: SynthArgs) -> Result<()> {
    let spec = replay::synth::SynthSpec {
        num_prompts: a.num_prompts,
        input_len: a.input_len,
        output_len: a.output_len,
        range_ratio: a.range_ratio,
        request_rate: a.request_rate,
        burstiness: a.burstiness,
        seed: a.seed,
        endpoint: a.endpoint,
        start_us: wire::clock::epoch_us(),
        stream_ratio: a.stream_ratio,
    };
    replay::synth::validate(&spec).map_err(crate::exit::refused)?;
    let meta = FileMeta::new(Producer::Synth, command_line());
    // Rows are written as they are made: any --num-prompts in bounded memory.
    let mut progress = crate::traces::RowProgress::new(&a.output);
    let written = store::write_trace_streaming(&a.output, |w| {
        replay::synth::synth_each(&spec, |r| {
            progress.row();
            Ok(w.push(r)?)
        })
        .map_err(|e| match e {
            replay::error::ReplayError::Trace(e) => e,
            e => trace_format::Error::Invalid(e.to_string()),
        })?;
        Ok(((), meta))
    });
    let rows = progress.rows();
    progress.finish();
    let ((), at) = written.with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!("{rows} synthetic requests written to {at}");
    Ok(())
}

pub(crate) fn run_inspect(a: InspectArgs) -> Result<()> {
    use std::io::Write;
    let stream =
        crate::traces::open_stream_in(&a.traces, &a.window).context("reading the trace")?;
    let summary = trace_format::inspect::summarize_stream(&stream, &a.cache_blocks)
        .context("reading the trace")?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&summary)?)?;
    } else {
        writeln!(out, "{summary}")?;
    }
    Ok(())
}
