//! What the accept loops do when `accept(2)` fails: back off and count, and (for the admin
//! listener) the spare descriptor that lets it answer when the proxy's connections have
//! taken all the others.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;

/// Backs off failed accepts (EMFILE and ENFILE above all: retrying at once spins while the
/// descriptors stay gone), counts every one, and logs at most one line per 5 s.
pub(crate) struct AcceptBackoff {
    listener: &'static str,
    delay: Duration,
    unreported: u64,
    last_report: Option<Instant>,
}

impl AcceptBackoff {
    /// A backoff for the listener called `listener` in its log line.
    pub(crate) fn new(listener: &'static str) -> Self {
        AcceptBackoff {
            listener,
            delay: Duration::ZERO,
            unreported: 0,
            last_report: None,
        }
    }

    /// An accept succeeded: the next failure starts from the shortest delay.
    pub(crate) fn ok(&mut self) {
        self.delay = Duration::ZERO;
    }

    /// An accept failed with `e`: count it, maybe log it, and sleep the doubled delay.
    pub(crate) async fn failed(&mut self, e: &std::io::Error, metrics: &Metrics) {
        metrics.accept_errors.fetch_add(1, Relaxed);
        self.unreported += 1;
        let now = Instant::now();
        if self
            .last_report
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(5))
        {
            eprintln!(
                "llmreplay capture: accept failed on the {} listener: {e} ({} failure(s) since \
                 the last report; backing off; all counted in llmreplay_capture_accept_errors_total)",
                self.listener, self.unreported
            );
            self.unreported = 0;
            self.last_report = Some(now);
        }
        self.delay = (self.delay * 2).clamp(Duration::from_millis(5), Duration::from_millis(100));
        tokio::time::sleep(self.delay).await;
    }
}

/// A descriptor to hold in reserve (see `serve_admin` in [`crate::server`]).
pub(crate) fn spare_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// The process (EMFILE) or the system (ENFILE) is out of descriptors.
pub(crate) fn fd_exhausted(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        // EMFILE, ENFILE (the same numbers on Linux, the BSDs and macOS).
        matches!(e.raw_os_error(), Some(24 | 23))
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}
