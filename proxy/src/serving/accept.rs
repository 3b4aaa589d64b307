//! What the accept loops do when `accept(2)` fails: back off and count, and (for the admin
//! listener) the spare descriptor that lets it answer when the proxy's connections have
//! taken all the others.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::capture_metrics::Metrics;

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

/// Connections an accept loop takes from the listen queue before it lets the runtime run
/// them (see [`AcceptTurns`]).
pub(crate) const ACCEPT_BATCH: usize = 8;

/// Paces an accept loop in a burst: connections are taken [`ACCEPT_BATCH`] at a time (or
/// until the listen queue is empty), then the runtime runs the new connections' tasks and
/// everything else that is ready before the loop takes the next batch.
///
/// One connection per turn left a burst waiting in the listen queue for as many turns as it
/// had connections, each turn as long as the streams already being served make it: with
/// `--threads 1`, 500 connections at once and 100-token streams, the last was accepted
/// 682 ms after the first and TTFT p99 was 0.7–1.1 s. A batch, not the whole queue: several
/// serving threads share the one listen queue (`wire::listen::bind_group`), and each wakes
/// for it and takes its share.
///
/// A small batch, since a new connection's task does its whole request path on its first
/// poll (its request read and sent upstream without waiting for the reactor, see
/// `wire::direct`): the connections of one batch wait in line for each other's request
/// paths (about 80 µs each), and those still in the listen queue go to whichever serving
/// thread comes for them first. Added TTFT p99 in bursts through capture (bench/run.sh
/// burst, 4 rounds each): 26.5 ms with batches of 8 against 34.3 ms with 64 at 500
/// connections, 42 against 59 ms at 1,000.
///
/// But a fixed batch per turn made the accept rate depend on how long the runtime's turns
/// are, and streams make them long: in a 1,000-connection burst the first streams start
/// forwarding chunks (TTFT 50 ms) while the burst is still in the listen queue, each turn
/// then ran hundreds of ready streams, and the accepts slowed down, which left more of the
/// burst behind streams. Two rounds of six had their accepts spread over 177 and 227 ms
/// instead of 72–89 (the client's own pace) and added TTFT p99 of 121 and 192 ms instead of
/// 29–37 (bench/out/20261204T015107Z). So a batch is [`ACCEPT_BATCH`] for each
/// [`ACCEPT_PERIOD`] the last turn took, up to [`MAX_ACCEPT_BATCH`]: at least that many
/// accepts per period, however busy the runtime.
#[derive(Debug)]
pub(crate) struct AcceptTurns {
    taken: usize,
    batch: usize,
}

/// The runtime time for which an accept loop takes [`ACCEPT_BATCH`] more connections in its
/// next batch (see [`AcceptTurns`]).
pub(crate) const ACCEPT_PERIOD: Duration = Duration::from_millis(1);

/// The largest batch, whatever the turns take.
pub(crate) const MAX_ACCEPT_BATCH: usize = 64;

impl Default for AcceptTurns {
    fn default() -> Self {
        AcceptTurns {
            taken: 0,
            batch: ACCEPT_BATCH,
        }
    }
}

impl AcceptTurns {
    /// A connection was accepted (and its task spawned): at the end of a batch, the
    /// runtime's turn, whose length sizes the next batch.
    pub(crate) async fn accepted(&mut self) {
        self.taken += 1;
        if self.taken >= self.batch {
            self.taken = 0;
            let start = tokio::time::Instant::now();
            tokio::task::yield_now().await;
            self.batch = batch_for(start.elapsed());
        }
    }
}

/// The batch after a turn of `turn`: [`ACCEPT_BATCH`] per [`ACCEPT_PERIOD`], within
/// [`ACCEPT_BATCH`]..=[`MAX_ACCEPT_BATCH`].
fn batch_for(turn: Duration) -> usize {
    let periods = turn.as_nanos() / ACCEPT_PERIOD.as_nanos().max(1);
    (ACCEPT_BATCH as u128 * periods).clamp(ACCEPT_BATCH as u128, MAX_ACCEPT_BATCH as u128) as usize
}

/// How the admin listener's rescue keeps the serving threads' accepts off the descriptor it
/// frees (see `serve_admin` in [`crate::lifecycle`]).
///
/// A flag alone was not enough: a serving thread that had read the flag clear and was then
/// preempted before its `accept(2)` (or was parked in its accept, waiting for the listen
/// queue) took the freed descriptor for one more proxy connection, and `/healthz` went
/// unanswered while the proxy was saturated. So each serving accept counts itself
/// [`inside`](HoldOff::accept) from before it reads the flag until its accept returns, a
/// rescue [`hold`](HoldOff::hold)s: sets the flag, wakes the accepts parked in the listen
/// queue (they come round and see it), and frees its descriptor only once none is inside.
/// The flag and the count are sequentially consistent, so either an accept sees the flag or
/// the rescue sees the accept.
#[derive(Debug, Default)]
pub(crate) struct HoldOff {
    held: AtomicBool,
    inside: AtomicUsize,
    wake: Notify,
}

/// A serving accept between its look at the flag and its end.
pub(crate) struct Inside<'a>(&'a HoldOff);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, SeqCst);
    }
}

/// Accepts held off until dropped.
pub(crate) struct Held<'a>(&'a HoldOff);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.held.store(false, SeqCst);
    }
}

impl HoldOff {
    fn enter(&self) -> Inside<'_> {
        self.inside.fetch_add(1, SeqCst);
        Inside(self)
    }

    /// A serving thread's accept on `listener`, or `None` when a rescue holds accepts off
    /// (after a 1 ms pause) or began while it waited: the loop comes round and asks again.
    pub(crate) async fn accept(
        &self,
        listener: &TcpListener,
    ) -> Option<std::io::Result<(TcpStream, SocketAddr)>> {
        // Registered before the flag is read, so a rescue that begins after it is seen.
        let woken = self.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let inside = self.enter();
        if self.held.load(SeqCst) {
            drop(inside);
            tokio::time::sleep(Duration::from_millis(1)).await;
            return None;
        }
        let r = tokio::select! {
            biased;
            _ = woken => None,
            r = listener.accept() => Some(r),
        };
        drop(inside);
        r
    }

    /// Holds the serving accepts off and waits until none is inside (at most `bound`: a
    /// thread busy with a long turn of its runtime comes round late).
    pub(crate) async fn hold(&self, bound: Duration) -> Held<'_> {
        self.held.store(true, SeqCst);
        let held = Held(self);
        self.wake.notify_waiters();
        let deadline = tokio::time::Instant::now() + bound;
        while self.inside.load(SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        held
    }
}

/// A descriptor to hold in reserve (see `serve_admin` in [`crate::lifecycle`]).
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A rescue waits for a serving accept that had already read the flag clear (here: one
    /// held inside, as a thread preempted before its `accept(2)` is), and only then frees
    /// its descriptor; the accept that comes round meanwhile holds off. With the flag and a
    /// fixed 2 ms pause (the design before), the descriptor was freed while that accept was
    /// still to run, and it took it.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_rescue_waits_for_an_accept_already_past_its_check() {
        let h = Arc::new(HoldOff::default());
        let preempted = h.enter();
        let hold = tokio::spawn({
            let h = h.clone();
            async move {
                let _held = h.hold(Duration::from_secs(1)).await;
                tokio::time::Instant::now()
            }
        });
        let t0 = tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !hold.is_finished(),
            "the rescue went on with an accept inside"
        );
        drop(preempted);
        let freed_at = hold.await.unwrap();
        assert!(freed_at - t0 >= Duration::from_millis(50));
        assert!(freed_at - t0 < Duration::from_millis(60));
        assert_eq!(h.inside.load(SeqCst), 0);
        assert!(!h.held.load(SeqCst), "the hold ends with the rescue");

        // Bounded: an accept that never comes round does not keep /healthz waiting.
        let stuck = h.enter();
        let t0 = tokio::time::Instant::now();
        drop(h.hold(Duration::from_millis(100)).await);
        assert!(tokio::time::Instant::now() - t0 >= Duration::from_millis(100));
        drop(stuck);
    }

    /// An accept parked on an empty listen queue is woken by a rescue and leaves without
    /// taking a connection; while the hold lasts, accepts take none even with one queued;
    /// after it, the queued connection is accepted.
    #[tokio::test(flavor = "current_thread")]
    async fn accepts_parked_in_the_listen_queue_come_round_for_a_rescue() {
        let listener = Arc::new(wire::listen::bind("127.0.0.1:0".parse().unwrap()).unwrap());
        let addr = listener.local_addr().unwrap();
        let h = Arc::new(HoldOff::default());
        let parked = tokio::spawn({
            let (h, l) = (h.clone(), listener.clone());
            async move { h.accept(&l).await.map(|r| r.is_ok()) }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(h.inside.load(SeqCst), 1, "the accept waits inside");
        let held = tokio::time::timeout(Duration::from_secs(2), h.hold(Duration::from_secs(5)))
            .await
            .expect("the parked accept came round");
        assert_eq!(parked.await.unwrap(), None, "woken without a connection");
        let client = std::net::TcpStream::connect(addr).unwrap();
        for _ in 0..3 {
            assert!(
                h.accept(&listener).await.is_none(),
                "accepted during the hold"
            );
        }
        drop(held);
        let got = tokio::time::timeout(Duration::from_secs(2), h.accept(&listener)).await;
        assert!(
            matches!(got, Ok(Some(Ok(_)))),
            "the queued connection after the hold"
        );
        assert_eq!(h.inside.load(SeqCst), 0);
        drop(client);
    }

    /// `n` connections the kernel has completed into a listen queue, beside a task that
    /// counts the turns of the runtime it gets, each taking `turn` of the (paused) clock.
    struct QueuedBurst {
        listener: TcpListener,
        _clients: Vec<std::net::TcpStream>,
        turns: Arc<AtomicUsize>,
        stop: Arc<AtomicBool>,
        counter: tokio::task::JoinHandle<()>,
    }

    impl QueuedBurst {
        fn start(n: usize, turn: Duration) -> Self {
            let listener = wire::listen::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let addr = listener.local_addr().unwrap();
            // Blocking connects: the kernel completes each handshake into the listen queue.
            let clients = (0..n)
                .map(|_| std::net::TcpStream::connect(addr).unwrap())
                .collect();
            let turns = Arc::new(AtomicUsize::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let counter = tokio::spawn({
                let (turns, stop) = (turns.clone(), stop.clone());
                async move {
                    while !stop.load(Relaxed) {
                        turns.fetch_add(1, Relaxed);
                        if !turn.is_zero() {
                            tokio::time::advance(turn).await;
                        }
                        tokio::task::yield_now().await;
                    }
                }
            });
            QueuedBurst {
                listener,
                _clients: clients,
                turns,
                stop,
                counter,
            }
        }

        /// The turns the counting task got.
        async fn finish(self) -> usize {
            let taken = self.turns.load(Relaxed);
            self.stop.store(true, Relaxed);
            self.counter.await.unwrap();
            taken
        }
    }

    /// A burst waits in the listen queue for a few of the runtime's turns, not for one turn
    /// per connection: 300 connections queued at once, an accept loop paced by
    /// [`AcceptTurns`] spawning a task per connection (as the proxy's does), beside a task
    /// that counts the turns it gets. All 300 are accepted within one turn per batch; with a
    /// yield after every accept (the loop before) it got 300.
    #[tokio::test(flavor = "current_thread")]
    async fn a_burst_is_accepted_in_a_few_turns_not_one_per_connection() {
        const N: usize = 300;
        let burst = QueuedBurst::start(N, Duration::ZERO);
        let served = Arc::new(AtomicUsize::new(0));
        let mut pacing = AcceptTurns::default();
        for _ in 0..N {
            let (sock, _) = burst.listener.accept().await.unwrap();
            let served = served.clone();
            tokio::spawn(async move {
                served.fetch_add(1, Relaxed);
                drop(sock);
            });
            pacing.accepted().await;
        }
        let taken = burst.finish().await;
        // Every connection's task ran: the batches are served, not only accepted.
        tokio::task::yield_now().await;
        assert_eq!(served.load(Relaxed), N);
        assert!(
            taken <= N / ACCEPT_BATCH + 3,
            "accepting {N} queued connections took {taken} turns of the runtime"
        );
        assert!(taken < N / 4, "{taken} turns (ACCEPT_BATCH {ACCEPT_BATCH})");
    }

    #[test]
    fn the_batch_grows_with_the_turn() {
        assert_eq!(batch_for(Duration::ZERO), ACCEPT_BATCH);
        assert_eq!(batch_for(ACCEPT_PERIOD), ACCEPT_BATCH);
        assert_eq!(batch_for(ACCEPT_PERIOD * 3), 3 * ACCEPT_BATCH);
        assert_eq!(batch_for(Duration::from_secs(1)), MAX_ACCEPT_BATCH);
    }

    /// When every turn of the runtime is long (streams to forward), the burst is still taken
    /// at [`ACCEPT_BATCH`] per [`ACCEPT_PERIOD`] of turns, not [`ACCEPT_BATCH`] per turn: 300
    /// queued connections beside a task whose every turn takes 3 periods (the paused clock
    /// moved on by it) are accepted in about a third of the turns a fixed batch needed
    /// (it needed 300 / 8 = 38).
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn long_turns_take_larger_batches() {
        const N: usize = 300;
        let burst = QueuedBurst::start(N, ACCEPT_PERIOD * 3);
        let mut pacing = AcceptTurns::default();
        for _ in 0..N {
            let (sock, _) = burst.listener.accept().await.unwrap();
            drop(sock);
            pacing.accepted().await;
        }
        let taken = burst.finish().await;
        assert!(
            taken <= N / (3 * ACCEPT_BATCH) + 4,
            "accepting {N} queued connections beside long turns took {taken} turns"
        );
    }
}
