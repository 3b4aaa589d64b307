//! Stopping a run early. The first request (SIGINT, SIGTERM, a sink that cannot write) stops
//! sending and lets the requests in flight finish up to a deadline; a second stops at once.
//! The run then returns what it measured, marked [`Interrupted`].

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// How far a stop has gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopState {
    /// No stop requested.
    Running,
    /// Stop sending; let requests in flight finish up to the drain deadline.
    Drain {
        /// Why (e.g. "SIGTERM").
        reason: String,
    },
    /// Stop now: requests in flight are cancelled (recorded as cancelled).
    Now {
        /// Why the run stopped in the first place (the first request's reason).
        reason: String,
    },
}

impl StopState {
    /// The reason of a requested stop.
    pub fn reason(&self) -> Option<&str> {
        match self {
            StopState::Running => None,
            StopState::Drain { reason } | StopState::Now { reason } => Some(reason),
        }
    }
}

/// A handle to stop a run; clones share one state. Cheap to poll from any thread.
#[derive(Debug, Clone)]
pub struct Stop {
    level: Arc<AtomicU8>,
    tx: Arc<watch::Sender<StopState>>,
}

impl Default for Stop {
    fn default() -> Self {
        Self::new()
    }
}

impl Stop {
    /// A handle with no stop requested.
    pub fn new() -> Self {
        Stop {
            level: Arc::new(AtomicU8::new(0)),
            tx: Arc::new(watch::channel(StopState::Running).0),
        }
    }

    /// Requests a stop: the first call drains, any later one stops at once.
    pub fn request(&self, reason: &str) {
        // The level first: a watcher woken by the state change reads the new level.
        let _ = self
            .level
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| Some((l + 1).min(2)));
        self.tx.send_modify(|s| {
            *s = match s {
                StopState::Running => StopState::Drain {
                    reason: reason.to_string(),
                },
                StopState::Drain { reason } | StopState::Now { reason } => StopState::Now {
                    reason: std::mem::take(reason),
                },
            }
        });
    }

    /// 0 = running, 1 = draining, 2 = stop now (a relaxed atomic load, for hot loops).
    pub fn level(&self) -> u8 {
        self.level.load(Ordering::Relaxed)
    }

    /// The current state.
    pub fn state(&self) -> StopState {
        self.tx.borrow().clone()
    }

    /// A receiver that wakes on every change (`changed().await`).
    pub fn subscribe(&self) -> watch::Receiver<StopState> {
        self.tx.subscribe()
    }
}

/// How an interrupted run ended, for the result and the console ("partial").
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Interrupted {
    /// Why it stopped (e.g. "SIGTERM").
    pub reason: String,
    /// Schedule offset at which the stop came: how much of the schedule ran.
    pub after: Duration,
    /// Requests sent before the stop.
    pub sent: usize,
    /// Requests of the selection never sent, where known (the rest of the trace is not read
    /// after a stop to count them when that would take long).
    pub not_sent: Option<usize>,
    /// Requests in flight at the drain deadline (or at a second stop), recorded as cancelled.
    pub cancelled: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_request_drains_second_stops_now_and_keeps_the_first_reason() {
        let s = Stop::new();
        let mut rx = s.subscribe();
        assert_eq!((s.level(), s.state()), (0, StopState::Running));
        s.clone().request("SIGTERM");
        assert!(rx.has_changed().unwrap());
        assert_eq!(s.level(), 1);
        assert_eq!(
            rx.borrow_and_update().clone(),
            StopState::Drain {
                reason: "SIGTERM".into()
            }
        );
        s.request("SIGINT");
        s.request("SIGINT");
        assert_eq!(s.level(), 2);
        assert_eq!(
            s.state(),
            StopState::Now {
                reason: "SIGTERM".into()
            }
        );
        assert_eq!(s.state().reason(), Some("SIGTERM"));
    }
}
