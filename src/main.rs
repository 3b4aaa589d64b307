//! `llmreplay`: the command line. Argument parsing and wiring only; the work lives in the
//! library crates (`trace-format`, `replay`, `sim`, `proxy`).

mod capture_cmd;
mod cli;
mod demo_cmd;
mod exit;
mod fidelity_cmd;
mod flags;
mod import_cmd;
mod link_cmd;
mod merge_cmd;
mod otel;
mod rekey_cmd;
mod replay_cmd;
mod report_cmd;
mod shadow_cmd;
mod signals;
mod sim_cmd;
mod trace_cmd;
mod traces;

use std::io::Write;
use std::process::ExitCode;

use exit::ExitStatus;

/// The one place the process's exit status is decided (a last signal aside: see
/// `signals`): the command's [`ExitStatus`], or the one its error maps to.
fn main() -> ExitCode {
    let args = match cli::parse() {
        Ok(a) => a,
        Err(e) => {
            // --help and --version come this way too, with status 0.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1));
        }
    };
    if args.prints_only() {
        // Rust ignores SIGPIPE, so a closed stdout panicked in `println!`; the default
        // action ends the process as `head` expects (shells report 141).
        // SAFETY: one thread so far; restoring a signal's default action touches no Rust state.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // Servers (capture, sim) and a replay of thousands of streams need more descriptors than
    // a soft limit of 1,024.
    let _ = wire::listen::raise_fd_limit();
    // …and a descriptor table that holds them from the start, while this is the process's
    // one thread: growing it later stalls every thread's accept for an RCU grace period.
    let _ = wire::listen::reserve_fd_table(wire::listen::FD_TABLE_RESERVE);
    match cli::run(args) {
        Ok(status) => status.into(),
        Err(e) => {
            let status = ExitStatus::of_error(&e);
            if status != ExitStatus::Success {
                let _ = writeln!(std::io::stderr(), "error: {e:#}");
            }
            status.into()
        }
    }
}
