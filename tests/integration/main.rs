//! The end-to-end tests of the `llmreplay` binary and its crates, in one test binary (the
//! layout ripgrep uses): one link of the workspace instead of one per file, and one copy of
//! `support`, so a helper no test uses is a dead-code warning instead of an
//! `allow(dead_code)`.
//!
//! Run them all with `cargo test --release --test integration`; one file's tests with
//! `cargo test --release --test integration capture_faults::` (the module is the old test
//! binary's name); one test with `cargo test --release --test integration
//! cli::bad_input_gives_clear_errors_not_panics`.
//!
//! # Adding tests
//!
//! A new file of tests is a module here: put it in `tests/integration/NAME.rs`, add
//! `mod NAME;` below (in order), and start it with `use crate::support;` where it needs the
//! helpers (`support::env::{free_addr, tmpdir, serial}`, `support::capture::CaptureProc`, ...).
//! Do not add `tests/NAME.rs` at the top: every file there is a test binary of its own, linked
//! on its own (~200 MB each).
//!
//! `tests/real_engine.rs` is a test binary of its own (its first lines say why): Cargo runs
//! test binaries one after another, so nothing else runs beside it.
//!
//! # Sharing one process
//!
//! The modules' tests run in one process, in parallel (the default `--test-threads`, one per
//! core), so:
//! - nothing here changes process-wide state: no `std::env::set_var`, no signal handler, no
//!   `setrlimit` on this process (a child's limits are set in its `pre_exec`), no
//!   `set_current_dir`; pass values to what runs explicitly (arguments, a child's `env`);
//! - every path is unique to the process and the call (`support::env::{tmpdir, fresh_path}`)
//!   and every port comes from `support::env::free_addr` or a `bind` to port 0, never a fixed
//!   one;
//! - a test whose assertions involve time on a 2-core machine takes `support::env::serial()`
//!   on its first line and then runs alone, as it did when each file was a binary of its own:
//!   it waits for the tests running to end, and every other test waits for it in its first
//!   `tmpdir`, `fresh_path` or `free_addr` (a shared hold, kept to the test's end).

mod support;

mod agents;
mod apis;
mod apis_replay;
mod capture;
mod capture_disk;
mod capture_faults;
mod cli;
mod completions_sessions;
mod conn;
mod exits;
mod fidelity;
mod first_send;
mod fleet;
mod from_trace;
mod importers;
mod interrupt;
mod keepalive;
mod limits;
mod mixed_traffic;
mod otel;
mod outputs;
mod polish;
mod privacy;
mod reasoning;
mod recorder;
mod secrets;
mod sessions;
mod shadow;
mod shard;
mod tokens;
mod validity;
mod verdict;
