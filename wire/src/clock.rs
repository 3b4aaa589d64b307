//! The clocks every crate reads, in one place: the wall-clock stamp of "now" and the fine
//! timer slack of a thread that sleeps until deadlines.
//!
//! A stamp is not a duration: the wall clock of a VM can run ~0.5% off the monotonic clock
//! for minutes, so durations are measured with [`std::time::Instant`] and only stamps (and
//! kernel receive times, see [`crate::rxstamp`]) use these functions.

use std::time::{SystemTime, UNIX_EPOCH};

/// The wall clock, ns since the Unix epoch (0 for a clock set before 1970).
pub fn epoch_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// The wall clock, µs since the Unix epoch (0 for a clock set before 1970).
pub fn epoch_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Sets the calling thread's timer slack to 1 ns, so its sleeps end at their deadline rather
/// than up to the default 50 µs after it (Linux `PR_SET_TIMERSLACK`; elsewhere nothing).
/// Affects only the calling thread: call it first thing in a thread that paces deadlines.
pub fn fine_timer_slack() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes an integer and affects only the calling thread; the
    // unused arguments are zero as prctl(2) asks.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamps_agree_and_move_forward() {
        let ns = epoch_ns();
        let us = epoch_us();
        assert!(ns > 1_600_000_000_000_000_000, "{ns}");
        assert!(
            us >= ns / 1_000 && us - ns / 1_000 < 1_000_000,
            "{us} vs {ns}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_timer_slack_is_one_ns_on_this_thread_only() {
        std::thread::spawn(|| {
            fine_timer_slack();
            // SAFETY: PR_GET_TIMERSLACK reads the calling thread's slack.
            let slack = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
            assert_eq!(slack, 1);
        })
        .join()
        .unwrap();
        // SAFETY: as above.
        let here = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
        assert_ne!(here, 1, "another thread's slack is untouched");
    }
}
