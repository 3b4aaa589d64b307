//! The exit statuses (part of the CLI contract, defined once): what each number means.
//! Every command's run returns an [`ExitStatus`] or an error; `main` turns either into the
//! process's status ([`ExitStatus::of_error`] for an error). The one other way out is a
//! last signal, which ends the process at once ([`ExitStatus::exit_now`], from
//! `crate::signals`).

use std::process::ExitCode;

/// How `llmreplay` ended: one number per meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExitStatus {
    /// 0: done.
    Success,
    /// 1: the command could not run, or failed (the error says why).
    Error,
    /// 2: the flags or arguments were refused (clap's usage error).
    Usage,
    /// 3: `compare --fail-on-regression` found a regression beyond noise.
    Regression,
    /// 4: `replay`: a target failed more than `--max-failed` of the requests it was asked
    /// to serve (every output written first).
    FailedRequests,
    /// 5: `fidelity --fail-on-drift`: the replay does not reproduce the captured load or
    /// schedule.
    Drift,
    /// 6: `replay --fail-on-slo`: a target's verdict is FAIL; `shadow --fail-on-slo`: a candidate's.
    SloFail,
    /// 7: `capture` stopped, but its trace is incomplete (rows dropped, or journals kept
    /// for the next start; the summary says which). It was 3 before, which `compare` keeps.
    TraceIncomplete,
    /// 8: `replay --fail-on-invalid`: a run's validity stamp is INVALID, its own timing error over its budget
    /// (`results::validity`; every output written first).
    Invalid,
    /// 130 (128 + 2): SIGINT stopped the command before its work was done.
    Interrupted,
    /// 143 (128 + 15): SIGTERM stopped the command before its work was done.
    Terminated,
}

impl ExitStatus {
    /// Every status, in the order of their numbers.
    pub(crate) const ALL: [ExitStatus; 11] = [
        ExitStatus::Success,
        ExitStatus::Error,
        ExitStatus::Usage,
        ExitStatus::Regression,
        ExitStatus::FailedRequests,
        ExitStatus::Drift,
        ExitStatus::SloFail,
        ExitStatus::TraceIncomplete,
        ExitStatus::Invalid,
        ExitStatus::Interrupted,
        ExitStatus::Terminated,
    ];

    /// The process's exit status.
    pub(crate) const fn code(self) -> u8 {
        match self {
            ExitStatus::Success => 0,
            ExitStatus::Error => 1,
            ExitStatus::Usage => 2,
            ExitStatus::Regression => 3,
            ExitStatus::FailedRequests => 4,
            ExitStatus::Drift => 5,
            ExitStatus::SloFail => 6,
            ExitStatus::TraceIncomplete => 7,
            ExitStatus::Invalid => 8,
            ExitStatus::Interrupted => 130,
            ExitStatus::Terminated => 143,
        }
    }

    /// What the status means, one line (the `--help` table; README's "Exit status" says
    /// the same).
    pub(crate) const fn meaning(self) -> &'static str {
        match self {
            ExitStatus::Success => "done (capture and sim: stopped by a signal, everything written)",
            ExitStatus::Error => "could not run, or failed (the error says why)",
            ExitStatus::Usage => {
                "flags or arguments refused (an unknown flag, a value out of its range, flags that do not go together)"
            }
            ExitStatus::Regression => "compare --fail-on-regression: a regression beyond noise",
            ExitStatus::FailedRequests => {
                "replay: a target failed more than --max-failed of its requests (outputs written)"
            }
            ExitStatus::Drift => {
                "fidelity --fail-on-drift: the replay does not reproduce the captured load or schedule"
            }
            ExitStatus::SloFail => "replay --fail-on-slo: a target's verdict is FAIL (shadow --fail-on-slo: a candidate's)",
            ExitStatus::TraceIncomplete => {
                "capture: stopped, but the trace is incomplete (rows dropped or journals kept; see the summary)"
            }
            ExitStatus::Invalid => {
                "replay --fail-on-invalid: a run is INVALID, the client's own timing error over its budget (outputs written)"
            }
            ExitStatus::Interrupted => {
                "stopped by SIGINT before the work was done (replay: what ran is written, marked partial)"
            }
            ExitStatus::Terminated => {
                "stopped by SIGTERM before the work was done (replay: what ran is written, marked partial)"
            }
        }
    }

    /// The table under `llmreplay --help`.
    pub(crate) fn help() -> String {
        let mut s = String::from("Exit status:\n");
        for st in ExitStatus::ALL {
            s.push_str(&format!("  {:>3}  {}\n", st.code(), st.meaning()));
        }
        s.push_str(
            "  A first SIGINT/SIGTERM stops a command gracefully (replay: a second cancels the\n  \
             requests in flight); one more exits at once with the first signal's status.",
        );
        s
    }

    /// The status of a command that failed with `e`: the status it carries ([`Failure`]),
    /// else [`ExitStatus::Usage`] for a value a library refused as configuration (the sim's
    /// and capture's typed configuration errors), else [`ExitStatus::Error`]; a closed pipe
    /// (`llmreplay inspect x | head`) is no failure.
    pub(crate) fn of_error(e: &anyhow::Error) -> ExitStatus {
        if e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        }) {
            return ExitStatus::Success;
        }
        if let Some(f) = e.chain().find_map(|c| c.downcast_ref::<Failure>()) {
            return f.status;
        }
        let refused = e.chain().any(|c| {
            matches!(
                c.downcast_ref::<sim::SimError>(),
                Some(sim::SimError::Config(_))
            ) || matches!(
                c.downcast_ref::<proxy::ProxyError>(),
                Some(proxy::ProxyError::Config(_))
            )
        });
        if refused {
            ExitStatus::Usage
        } else {
            ExitStatus::Error
        }
    }

    /// Ends the process now with this status, without returning to `main`: only for a last
    /// signal, when the main thread is busy with what the signal cuts short.
    pub(crate) fn exit_now(self) -> ! {
        std::process::exit(i32::from(self.code()))
    }
}

impl From<ExitStatus> for ExitCode {
    fn from(s: ExitStatus) -> ExitCode {
        ExitCode::from(s.code())
    }
}

/// A failure that ends the command with a status of its own (printed as any error is).
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: ExitStatus,
    pub(crate) message: String,
}

impl Failure {
    /// The error that ends the command with `status`, saying `message`.
    pub(crate) fn error(status: ExitStatus, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Failure {
            status,
            message: message.into(),
        })
    }
}

/// A flag or value refused (status 2, [`ExitStatus::Usage`]): `bail!` for what the flags
/// cannot be, and `.map_err(refused)` on a library's validation of them (the replay
/// configuration's, synth's, a sweep's), so a CI wrapper can tell a usage error from a run
/// that failed.
pub(crate) fn refused(e: impl std::fmt::Display) -> anyhow::Error {
    Failure::error(ExitStatus::Usage, format!("{e:#}"))
}

/// `bail!`, refused: returns [`refused`] of the formatted message.
macro_rules! refuse {
    ($($t:tt)*) => {
        return Err($crate::exit::refused(format!($($t)*)))
    };
}
pub(crate) use refuse;

/// The exit status of runs whose validity stamps are read (a replay's targets, a sweep's
/// levels: `(configuration, run, metrics)`), once every output is written:
/// [`ExitStatus::Invalid`] when one is INVALID (the error names each and why), unless
/// `allow` (without `--fail-on-invalid`).
pub(crate) fn invalid<'a>(
    runs: impl Iterator<
        Item = (
            &'a replay::ReplayConfig,
            &'a replay::RunOutput,
            &'a replay::Metrics,
        ),
    >,
    allow: bool,
) -> anyhow::Result<ExitStatus> {
    let invalid: Vec<String> = runs
        .filter_map(|(cfg, run, m)| {
            let v = results::validity::of_run(cfg, m, run).filter(|v| !v.valid)?;
            Some(format!("{}: {}", run.target.name, v.reasons.join("; ")))
        })
        .collect();
    if invalid.is_empty() || allow {
        return Ok(ExitStatus::Success);
    }
    Err(Failure::error(
        ExitStatus::Invalid,
        format!("INVALID ({})", invalid.join(" | ")),
    ))
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_number_has_one_meaning() {
        let mut codes: Vec<u8> = ExitStatus::ALL.iter().map(|s| s.code()).collect();
        assert!(codes.windows(2).all(|w| w[0] < w[1]), "{codes:?}");
        codes.dedup();
        assert_eq!(codes.len(), ExitStatus::ALL.len());
        // Clap's own usage status is the one listed.
        assert_eq!(
            i32::from(ExitStatus::Usage.code()),
            clap::error::Error::<clap::error::DefaultFormatter>::new(
                clap::error::ErrorKind::InvalidValue
            )
            .exit_code()
        );
    }

    /// README's "Exit status" table lists every status with its number.
    #[test]
    fn readme_lists_every_status() {
        let readme = include_str!("../README.md");
        let table = readme
            .split("### Exit status")
            .nth(1)
            .expect("README has an \"### Exit status\" section");
        let rows: Vec<&str> = table
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .collect();
        let listed: Vec<u8> = rows
            .iter()
            .map(|r| r.trim_matches('|').split('|').next().unwrap().trim())
            .map(|c| c.trim_matches('`').parse().expect("a number"))
            .collect();
        let codes: Vec<u8> = ExitStatus::ALL.iter().map(|s| s.code()).collect();
        assert_eq!(listed, codes, "README's exit status table");
    }

    #[test]
    fn help_lists_every_status() {
        let help = ExitStatus::help();
        for s in ExitStatus::ALL {
            assert!(
                help.contains(&format!("{:>3}  {}", s.code(), s.meaning())),
                "{help}"
            );
        }
    }

    #[test]
    fn an_error_carries_its_status() {
        let e = Failure::error(ExitStatus::FailedRequests, "too many failed");
        assert_eq!(ExitStatus::of_error(&e), ExitStatus::FailedRequests);
        assert_eq!(e.to_string(), "too many failed");
        let e = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("writing");
        assert_eq!(ExitStatus::of_error(&e), ExitStatus::Success);
        assert_eq!(
            ExitStatus::of_error(&anyhow::anyhow!("no such file")),
            ExitStatus::Error
        );
        // A refused value is a usage error, however deep in the chain.
        let e = refused("--speedup 0: must be a positive number");
        assert_eq!(ExitStatus::of_error(&e), ExitStatus::Usage);
        assert_eq!(e.to_string(), "--speedup 0: must be a positive number");
        let e = anyhow::Error::from(sim::SimError::Config("error_rate 1.5".into()))
            .context("starting the sim");
        assert_eq!(ExitStatus::of_error(&e), ExitStatus::Usage);
    }
}
