//! The command line: the commands (the CLI contract, defined once: each command's flags are
//! in its `*_cmd` module, the shared value parsers in `flags`) and the dispatch to them.

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::exit::ExitStatus;
use crate::flags::command_line;

/// Capture production LLM traffic and replay it against candidate endpoints.
#[derive(Parser, Debug)]
#[command(name = "llmreplay", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

// Parsed once per process; boxing the larger argument structs would buy nothing. Every
// command takes `-2` as a value (`--speedup -2`), refused by the flag's range with status 2,
// not read as an unknown flag.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run a transparent streaming proxy in front of one upstream and record its traffic as a trace.
    ///
    /// Recorded: POST to …/completions, …/chat/completions, …/responses (OpenAI Responses),
    /// …/messages (Anthropic Messages), …/embeddings, …/rerank and …/score, streamed or not.
    /// Everything else is forwarded untouched and not recorded (said once per method and
    /// path on stderr; docs/apis.md).
    ///
    /// Exit status after SIGTERM/SIGINT: 0 when every recorded row is in a finished file; 7
    /// when the trace is incomplete (rows dropped, or journals kept for the next start: a
    /// full disk, see the summary); 130 / 143 on a second signal during the drain (the first
    /// was SIGINT / SIGTERM); 1 when it could not start. Nothing left in --out keeps it from
    /// starting.
    #[command(allow_negative_numbers = true)]
    Capture(crate::capture_cmd::CaptureArgs),
    /// Convert public traces (Azure, BurstGPT, Mooncake, Qwen Bailian, ShareGPT, Dynamo agent, Baseten, WEKA, Copilot coding agent) into a trace.
    #[command(after_long_help = crate::import_cmd::IMPORT_HELP)]
    #[command(allow_negative_numbers = true)]
    Import(crate::import_cmd::ImportArgs),
    /// Write a trace as Mooncake JSONL (NVIDIA AIPerf, SGLang bench_serving) or AIPerf's sessions.
    #[command(allow_negative_numbers = true)]
    Export(crate::import_cmd::ExportArgs),
    /// Run a simulated OpenAI-compatible engine (no GPU).
    #[command(allow_negative_numbers = true)]
    Sim(crate::sim_cmd::SimArgs),
    /// Replay a trace's arrival shape against one or more targets (default: an in-process sim).
    #[command(allow_negative_numbers = true)]
    Replay(crate::replay_cmd::ReplayArgs),
    /// Write a synthetic trace (vLLM's random dataset as a trace).
    #[command(allow_negative_numbers = true)]
    Synth(crate::trace_cmd::SynthArgs),
    /// Summarise traces: rows, span, arrival rate, requests in flight, tokens, outcomes.
    #[command(allow_negative_numbers = true)]
    Inspect(crate::trace_cmd::InspectArgs),
    /// Start a sim, drive synthetic load at rising rates, and show where latency leaves its flat region.
    #[command(allow_negative_numbers = true)]
    Demo(crate::demo_cmd::DemoArgs),
    /// Configurations side by side: differences, SLO pass/fail, and whether each exceeds run-to-run noise.
    #[command(allow_negative_numbers = true)]
    Compare(crate::report_cmd::CompareArgs),
    /// Write the capacity report of result files: one self-contained HTML file with plots, or Markdown.
    #[command(allow_negative_numbers = true)]
    Report(crate::report_cmd::ReportArgs),
    /// Link the traces of several capture processes (a fleet of pods) into one trace, as one capture of all the traffic would have linked it.
    #[command(allow_negative_numbers = true)]
    Link(crate::link_cmd::LinkArgs),
    /// Merge the --results of shard runs (replay --shard K/N) into one Parquet file and one JSON result.
    #[command(allow_negative_numbers = true)]
    Merge(crate::merge_cmd::MergeArgs),
    /// A/A fidelity: a capture beside its replay against the same upstream — schedule, load, outcomes and latencies, and which part drifts.
    #[command(allow_negative_numbers = true)]
    Fidelity(crate::fidelity_cmd::FidelityArgs),
    /// A trace's content hashes under another key (to share it, or to compare captures made under different keys): by the holder of its key, or from a --privacy full trace's bodies.
    #[command(allow_negative_numbers = true)]
    Rekey(crate::rekey_cmd::RekeyArgs),
    /// Shadow traffic: each candidate of `capture --shadow` beside production, request by request — paired differences with confidence intervals, outcomes that differed, the candidate's SLO verdict.
    #[command(allow_negative_numbers = true)]
    Shadow(crate::shadow_cmd::ShadowArgs),
}

impl Cli {
    /// Whether the command only reads files and prints (no server, no load): such a command
    /// ends quietly, as Unix tools do, when its reader goes away (`llmreplay inspect t | head`)
    /// instead of failing on the closed pipe.
    pub(crate) fn prints_only(&self) -> bool {
        matches!(
            self.command,
            Command::Inspect(_)
                | Command::Export(_)
                | Command::Compare(_)
                | Command::Report(_)
                | Command::Fidelity(_)
                | Command::Shadow(_)
        )
    }
}

/// The command line of this process, with the exit statuses under every command's `--help`.
pub fn parse() -> Result<Cli, clap::Error> {
    let mut cmd = Cli::command()
        .after_help(ExitStatus::help())
        .mut_subcommands(|s| s.after_help(ExitStatus::help()));
    let matches = cmd.try_get_matches_from_mut(std::env::args_os())?;
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))
}

/// Runs the parsed command: how it ended, or why it failed (see [`ExitStatus::of_error`]).
pub fn run(cli: Cli) -> Result<ExitStatus> {
    let done = |r: Result<()>| r.map(|()| ExitStatus::Success);
    match cli.command {
        Command::Capture(a) => crate::capture_cmd::run_capture(a),
        Command::Import(a) => done(crate::import_cmd::run_import(a, &command_line())),
        Command::Export(a) => done(crate::import_cmd::run_export(a)),
        Command::Sim(a) => done(crate::sim_cmd::run_sim(a)),
        Command::Replay(a) => crate::replay_cmd::run_replay(a),
        Command::Synth(a) => done(crate::trace_cmd::run_synth(a)),
        Command::Inspect(a) => done(crate::trace_cmd::run_inspect(a)),
        Command::Demo(a) => crate::demo_cmd::run_demo(a),
        Command::Compare(a) => Ok(if crate::report_cmd::run_compare(a)? {
            said("regression beyond noise found", ExitStatus::Regression)
        } else {
            ExitStatus::Success
        }),
        Command::Report(a) => done(crate::report_cmd::run_report(a)),
        Command::Merge(a) => done(crate::merge_cmd::run_merge(a, &command_line())),
        Command::Link(a) => done(crate::link_cmd::run_link(a, &command_line())),
        Command::Fidelity(a) => Ok(if crate::fidelity_cmd::run_fidelity(a)? {
            said(
                "the replay does not reproduce the captured load or schedule",
                ExitStatus::Drift,
            )
        } else {
            ExitStatus::Success
        }),
        Command::Rekey(a) => done(crate::rekey_cmd::run_rekey(a, &command_line())),
        Command::Shadow(a) => Ok(if crate::shadow_cmd::run_shadow(a)? {
            said("a shadow candidate's verdict is FAIL", ExitStatus::SloFail)
        } else {
            ExitStatus::Success
        }),
    }
}

/// `status`, after saying `why` on stderr (below what stdout has shown).
fn said(why: &str, status: ExitStatus) -> ExitStatus {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    eprintln!("{why}");
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sim flags configure the in-process sim: with a --target they are an error, not
    /// silently ignored; the demo runs the profile it is given, `tiny` without one.
    #[test]
    fn sim_flags_are_known_as_given() {
        let replay = |extra: &[&str]| {
            let mut args = vec!["llmreplay", "replay", "t.parquet", "--target", "http://h:1"];
            args.extend_from_slice(extra);
            match Cli::try_parse_from(args).unwrap().command {
                Command::Replay(a) => a.sim.given(),
                _ => unreachable!(),
            }
        };
        assert!(replay(&[]).is_empty());
        assert_eq!(replay(&["--error-rate", "0.5"]), vec!["--error-rate"]);
        assert_eq!(
            replay(&["--profile", "llama-3.1-8b-h100", "--served-model-name", "m"]),
            vec!["--profile", "--served-model-name"]
        );
        let demo = |extra: &[&str]| {
            let mut args = vec!["llmreplay", "demo"];
            args.extend_from_slice(extra);
            match Cli::try_parse_from(args).unwrap().command {
                Command::Demo(a) => a.sim.profile_or("tiny").to_string(),
                _ => unreachable!(),
            }
        };
        assert_eq!(demo(&[]), "tiny");
        assert_eq!(
            demo(&["--profile", "llama-3.1-8b-h100"]),
            "llama-3.1-8b-h100"
        );
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// Regression: a list flag whose parser returned a Vec panicked at access time.
    #[test]
    fn every_subcommand_parses_its_defaults() {
        for args in [
            &["llmreplay", "replay", "t.parquet"][..],
            &[
                "llmreplay",
                "replay",
                "t.parquet",
                "--percentile-metrics",
                "ttft,e2el",
                "--metric-percentiles",
                "50,99.9",
            ],
            &["llmreplay", "synth", "-o", "x.parquet"],
            &["llmreplay", "inspect", "x"],
            &["llmreplay", "demo"],
            &["llmreplay", "sim"],
            &["llmreplay", "import", "x.csv", "-o", "t.parquet"],
            &["llmreplay", "export", "t.parquet", "-o", "x.jsonl"],
            &[
                "llmreplay",
                "merge",
                "a.parquet",
                "b.parquet",
                "-o",
                "merged",
            ],
            &[
                "llmreplay",
                "replay",
                "t.parquet",
                "--shard",
                "1/4",
                "--start-at",
                "+2s",
            ],
            &[
                "llmreplay",
                "replay",
                "t.parquet",
                "--sweep",
                "max-concurrency=1,8,16",
                "--num-runs",
                "3",
                "--slo-percentile",
                "99",
                "--cost-per-hour",
                "2.5",
            ],
            &["llmreplay", "compare", "a.json", "b.json"],
            &["llmreplay", "report", "a.json", "-o", "r.html"],
            &[
                "llmreplay",
                "report",
                "a.json",
                "-o",
                "r.md",
                "--format",
                "md",
                "--alerts",
                "rules.yaml",
            ],
        ] {
            Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
        for bad in [
            &["llmreplay", "replay", "t", "--sweep", "max-concurrency=1.5"][..],
            &["llmreplay", "replay", "t", "--sweep", "qps=1,2"],
            &["llmreplay", "replay", "t", "--num-runs", "0"],
            &["llmreplay", "replay", "t", "--slo-percentile", "0"],
            &["llmreplay", "replay", "t", "--redundancy", "0"],
            &["llmreplay", "compare", "only-one.json"],
        ] {
            assert!(
                Cli::try_parse_from(bad).is_err(),
                "{bad:?} must be rejected"
            );
        }
        assert!(
            Cli::try_parse_from(["llmreplay", "replay", "t", "--metric-percentiles", "101"])
                .is_err()
        );
    }

    /// A negative number is a value refused by the flag's range (clap's usage error, status
    /// 2), not an unknown flag; every range the issue listed is refused at parse time.
    #[test]
    fn negative_and_out_of_range_values_are_refused_as_values() {
        use clap::error::ErrorKind;
        for bad in [
            &["llmreplay", "replay", "t", "--speedup", "-2"][..],
            &["llmreplay", "replay", "t", "--speedup", "0"],
            &["llmreplay", "replay", "t", "--max-concurrency", "0"],
            &["llmreplay", "replay", "t", "--max-concurrency", "-1"],
            &["llmreplay", "replay", "t", "--sample-ratio", "1.5"],
            &["llmreplay", "replay", "t", "--timeout", "0s"],
            &["llmreplay", "replay", "t", "--burstiness", "0"],
            &[
                "llmreplay",
                "capture",
                "--upstream",
                "http://h:1",
                "--out",
                "d",
                "--sample-rate",
                "2",
            ],
            &["llmreplay", "synth", "-o", "x", "--num-prompts", "0"],
            &["llmreplay", "demo", "--rates", "0"],
            &["llmreplay", "demo", "--rates", "1,-2"],
            &["llmreplay", "sim", "--error-rate", "1.5"],
        ] {
            let kind = Cli::try_parse_from(bad).map(|_| ()).unwrap_err().kind();
            assert_eq!(kind, ErrorKind::ValueValidation, "{bad:?}");
        }
    }
}
