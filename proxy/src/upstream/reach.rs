//! Whether the upstream can be reached: a check (a TCP connection to the upstream's host and
//! port, closed at once) at start, then every `upstream_check_interval` while it answers,
//! every [`DOWN_EVERY`] while it does not, and at once after a forwarded request could not
//! connect. The result drives the gauge `llmreplay_capture_upstream_up` and the admin
//! listener's `/readyz` (503 while the upstream is unreachable; `/healthz`, liveness, stays
//! 200 while the proxy serves), and every change is logged: capture keeps serving either
//! way (its requests get 502 while the upstream is down), but says so.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::capture_metrics::Metrics;

/// How often an unreachable upstream is checked again.
pub(crate) const DOWN_EVERY: Duration = Duration::from_secs(1);

/// What the proxy knows of the upstream's reachability.
#[derive(Debug)]
pub(crate) struct Reach {
    /// The upstream's base URL, for the log.
    url: String,
    resolver: Arc<wire::Resolver>,
    connect_timeout: Duration,
    /// Holds the gauge `upstream_up`: 1 reachable, 0 not (or not checked yet).
    metrics: Arc<Metrics>,
    /// Whether one check has finished.
    checked: AtomicBool,
    /// Why the last check failed.
    last_error: Mutex<String>,
    /// Wakes the checker before its interval (a forwarded request could not connect).
    wake: Notify,
}

impl Reach {
    /// The reachability of `url` (host and port from `resolver`), shown by the gauge
    /// `upstream_up` of `metrics` once [`Reach::run`] checks it.
    pub(crate) fn new(
        url: &str,
        resolver: Arc<wire::Resolver>,
        connect_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Reach {
        Reach {
            url: url.to_string(),
            resolver,
            connect_timeout,
            metrics,
            checked: AtomicBool::new(false),
            last_error: Mutex::new(String::new()),
            wake: Notify::new(),
        }
    }

    /// A forwarded request could not connect: check now.
    pub(crate) fn connect_failed(&self) {
        self.wake.notify_one();
    }

    /// Why the upstream is not known to be reachable (for `/readyz`); None when it is.
    pub(crate) fn not_ready(&self) -> Option<String> {
        // -1: not checked at all (no checker runs).
        if matches!(self.metrics.upstream_up.load(Relaxed), 1 | -1) {
            return None;
        }
        if !self.checked.load(Relaxed) {
            return Some(format!("the upstream {} is not checked yet", self.url));
        }
        let why = self
            .last_error
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default();
        Some(format!("the upstream {} is unreachable: {why}", self.url))
    }

    /// One check: connects to the upstream's addresses in turn until one accepts. Updates
    /// the gauge and logs a change (the first check only when it fails). Returns whether
    /// the upstream is reachable.
    pub(crate) async fn check(&self) -> bool {
        let result = self.connect().await;
        let first = !self.checked.swap(true, Relaxed);
        let was_up = self
            .metrics
            .upstream_up
            .swap(i64::from(result.is_ok()), Relaxed)
            == 1;
        match result {
            Ok(()) => {
                if !first && !was_up {
                    eprintln!(
                        "llmreplay capture: the upstream {} is reachable again",
                        self.url
                    );
                }
                true
            }
            Err(why) => {
                if first || was_up {
                    eprintln!(
                        "llmreplay capture: warning: the upstream {} {} ({why}); serving \
                         anyway: requests get 502 until it answers, /readyz says 503 and \
                         llmreplay_capture_upstream_up is 0 meanwhile",
                        self.url,
                        if first {
                            "is unreachable"
                        } else {
                            "became unreachable"
                        }
                    );
                }
                if let Ok(mut e) = self.last_error.lock() {
                    *e = why;
                }
                false
            }
        }
    }

    async fn connect(&self) -> Result<(), String> {
        let addrs = self
            .resolver
            .addrs()
            .await
            .map_err(|e| format!("resolving {}: {e}", self.resolver.host()))?;
        let mut last = String::from("no address");
        for a in addrs.iter() {
            match tokio::time::timeout(self.connect_timeout, tokio::net::TcpStream::connect(*a))
                .await
            {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) => last = format!("connecting to {a}: {e}"),
                Err(_) => {
                    last = format!(
                        "connecting to {a}: no answer within {:?}",
                        self.connect_timeout
                    )
                }
            }
        }
        Err(last)
    }

    /// Checks now, then every `every` while the upstream is reachable and every
    /// [`DOWN_EVERY`] while not, and at once when woken, until `stop` turns true.
    pub(crate) async fn run(self: Arc<Self>, every: Duration, mut stop: watch::Receiver<bool>) {
        // Checked from now on: the gauge is shown, 0 until the first check succeeds.
        let _ = self
            .metrics
            .upstream_up
            .compare_exchange(-1, 0, Relaxed, Relaxed);
        loop {
            let up = tokio::select! {
                up = self.check() => up,
                _ = stop.wait_for(|s| *s) => return,
            };
            let wait = if up { every } else { every.min(DOWN_EVERY) };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.wake.notified() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(port: u16) -> (Arc<Reach>, Arc<Metrics>) {
        let m = Arc::new(Metrics::default());
        let r = Reach::new(
            &format!("http://127.0.0.1:{port}"),
            Arc::new(wire::Resolver::new("127.0.0.1", port)),
            Duration::from_secs(5),
            m.clone(),
        );
        (Arc::new(r), m)
    }

    /// Issue 39, finding 5: capture started with its upstream down said nothing and its
    /// health check said ok.
    #[tokio::test]
    async fn a_check_follows_the_upstream_down_and_up_again() {
        // A port nothing listens on: bind one, note it, close it.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let (r, m) = reach(port);
        let up = &m.upstream_up;
        assert_eq!(r.not_ready(), None, "not checking: nothing to say");
        up.store(0, Relaxed); // as the checker does when it starts
        assert!(r.not_ready().unwrap().contains("not checked yet"));
        assert!(!r.check().await);
        assert_eq!(up.load(Relaxed), 0);
        let why = r.not_ready().unwrap();
        assert!(
            why.contains("unreachable") && why.contains(&port.to_string()),
            "{why}"
        );
        // The upstream comes up on that port.
        let l = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        assert!(r.check().await);
        assert_eq!(up.load(Relaxed), 1);
        assert_eq!(r.not_ready(), None);
        drop(l);
        assert!(!r.check().await);
        assert_eq!(up.load(Relaxed), 0);
    }

    /// The checker stops when told to, and a failed forward wakes it before its interval.
    #[tokio::test(start_paused = true)]
    async fn the_checker_is_woken_by_a_failed_connect_and_stops() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (r, m) = reach(l.local_addr().unwrap().port());
        let up = &m.upstream_up;
        let (stop_tx, stop) = watch::channel(false);
        let task = tokio::spawn(r.clone().run(Duration::from_secs(3600), stop));
        while up.load(Relaxed) != 1 {
            tokio::task::yield_now().await;
        }
        drop(l);
        // An hour's interval: only the wake-up checks again.
        r.connect_failed();
        while up.load(Relaxed) != 0 {
            tokio::task::yield_now().await;
        }
        stop_tx.send(true).unwrap();
        task.await.unwrap();
    }
}
