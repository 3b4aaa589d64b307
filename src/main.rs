//! `llmreplay`: the command line. Argument parsing and wiring only; the work lives in the
//! library crates (`trace-format`, `replay`, `sim`, `proxy`).

mod capture_cmd;
mod cli;
mod demo_cmd;
mod fidelity_cmd;
mod flags;
mod import_cmd;
mod merge_cmd;
mod otel;
mod replay_cmd;
mod report_cmd;
mod sim_cmd;
mod trace_cmd;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // Servers (capture, sim) and a replay of thousands of streams need more descriptors than
    // a soft limit of 1,024.
    let _ = wire::listen::raise_fd_limit();
    // …and a descriptor table that holds them from the start, while this is the process's
    // one thread: growing it later stalls every thread's accept for an RCU grace period.
    let _ = wire::listen::reserve_fd_table(wire::listen::FD_TABLE_RESERVE);
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed pipe (`llmreplay inspect x | head`) is not an error.
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            // A capture that served and stopped cleanly but could not finish its trace.
            if e.downcast_ref::<capture_cmd::IncompleteTrace>().is_some() {
                return ExitCode::from(capture_cmd::EXIT_TRACE_INCOMPLETE);
            }
            ExitCode::FAILURE
        }
    }
}
