//! Where capture's rows come from (issue 56): the capture's id and start, on every row, and
//! its clock against a reference, in each file's metadata ([`trace_format::fleet`]).
//!
//! The clock is read once at start from `chronyc tracking` (the NTP daemon most Linux
//! distributions and cloud images run); without chrony, or when it is not synchronised,
//! the offset is recorded as unknown, with why, never guessed.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use trace_format::fleet::{capture_id, CaptureInfo, Clock};

/// Longest wait for `chronyc tracking` at start.
const CHRONYC_WAIT: Duration = Duration::from_secs(2);

/// This capture: its id (`flag`, else the pod's name, else host and port of `listen`, the
/// bound listener), its start (now) and its clock.
pub(crate) fn capture_info(flag: Option<&str>, listen: SocketAddr) -> CaptureInfo {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    CaptureInfo {
        id: capture_id(flag, |k| std::env::var(k).ok(), hostname, listen),
        started_us: wire::clock::epoch_us(),
        clock: read_clock(),
    }
}

/// The clock's offset by `chronyc -n tracking`, within [`CHRONYC_WAIT`].
fn read_clock() -> Clock {
    let child = Command::new("chronyc")
        .args(["-n", "tracking"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return Clock::unknown(format!("no clock reference (chronyc: {e})")),
    };
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(status)) => {
                return Clock::unknown(format!("chronyc tracking exited with {status}"))
            }
            Ok(None) if start.elapsed() < CHRONYC_WAIT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Clock::unknown(format!(
                    "chronyc tracking did not answer within {CHRONYC_WAIT:?}"
                ));
            }
            Err(e) => return Clock::unknown(format!("chronyc tracking: {e}")),
        }
    }
    match child.wait_with_output() {
        Ok(o) => Clock::from_chronyc_tracking(&String::from_utf8_lossy(&o.stdout)),
        Err(e) => Clock::unknown(format!("chronyc tracking: {e}")),
    }
}
