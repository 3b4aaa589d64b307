//! The threads that serve client connections. With one (the default of [`crate::start`]),
//! the proxy serves on the caller's tokio runtime. With `threads > 1`, as nginx's workers:
//! every thread has its own single-threaded runtime and its own handle of the one listening
//! socket ([`wire::listen::bind_group`]), accepts its own connections and serves each
//! to its end, and reaches the upstream through its own connection pool, so no task, socket
//! or pooled connection moves between threads, and a forwarded event wakes no other thread
//! (a work-stealing runtime moves tasks between its workers: futex wake-ups and context
//! switches on every hand-over).

use std::cell::Cell;
use std::future::Future;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The serving thread this code runs on: 0 for the caller's runtime (and anything not on a
/// serving thread), 1.. for the threads [`spawn`] starts.
pub(crate) fn index() -> usize {
    INDEX.with(Cell::get)
}

/// The nice value of the proxy's threads that record rather than serve (the prompt runners,
/// the trace writer): in a burst the kernel gives the serving threads the CPU first, and
/// these still get about a tenth of a contended core (CFS weights 110 against 1,024), so they
/// are never starved; the writer's queue absorbs what they defer.
pub(crate) const BACKGROUND_NICE: i64 = 10;

/// Lowers the calling thread's CPU priority to [`BACKGROUND_NICE`] (on Linux, where a
/// thread's nice value is its own; elsewhere nothing). A failure leaves it as it was.
pub(crate) fn background() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority takes plain integers; `who` 0 is the calling thread on Linux.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, BACKGROUND_NICE as libc::c_int);
    }
}

/// A ready socket's task waits behind at most this many polls of other tasks before the
/// runtime looks for I/O again (tokio's default is 61).
///
/// A serving thread's run queue is never empty in a burst: each new connection's task does
/// its request path on its first poll (about 80 µs), so at 61 polls per look the reactor was
/// asked for ready sockets every few milliseconds, and the first chunks of the streams that
/// had started waited that long in the kernel. Same-run A/B at 1,000 connections, 15 rounds
/// each (`bench/run.sh burst`), added TTFT p99 median of rounds: 61 gave 106.6 ms against
/// 73.8 for 16 (`bench/out/20261204T043116Z`; one-sided permutation p = 0.02); 8 gave 90.0
/// against 65.1 for 16 (`…044530Z`, p = 0.01), as with hyper earlier; 32 was level with 16
/// (`…045428Z`). At 500 connections none of them differed beyond the rounds' noise. A
/// later 15-round run against the build with 61 (`…050346Z`) found the two level at every
/// size (75.9 against 76.5 ms at 1,000): kept for the mechanism above (the test below),
/// which no run found to cost anything beyond noise.
pub(crate) const EVENT_INTERVAL: u32 = 16;

/// The runtime of a serving thread (the caller's, through [`crate::serving_runtime`], and
/// every one [`spawn`] starts): single-threaded, I/O and timers, [`EVENT_INTERVAL`].
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .event_interval(EVENT_INTERVAL)
        .build()
}

/// Starts serving thread `i` (named `capture-serve-<i>`): faults in `warm_heap` bytes of its
/// heap ([`crate::runtime::heap`]), then a single-threaded runtime runs `work` to its end and drops
/// whatever tasks are left.
pub(crate) fn spawn<F, Fut>(
    i: usize,
    warm_heap: usize,
    work: F,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let rt = runtime()?;
    std::thread::Builder::new()
        .name(format!("capture-serve-{i}"))
        .spawn(move || {
            INDEX.with(|c| c.set(i));
            if warm_heap > 0 {
                crate::runtime::heap::warm(warm_heap);
            }
            rt.block_on(work());
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    /// A task that is always ready: it wakes itself at every poll (straight into the run
    /// queue, as a task with work left does; `yield_now` would wait for the reactor) and
    /// counts its polls.
    struct Busy {
        polls: Arc<AtomicU64>,
        stop: Arc<AtomicBool>,
        left: Option<u32>,
    }

    impl Future for Busy {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Relaxed);
            let stopped = self.stop.load(Relaxed);
            match &mut self.left {
                Some(0) => return Poll::Ready(()),
                Some(n) => *n -= 1,
                None if stopped => return Poll::Ready(()),
                None => {}
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// On a serving thread's runtime, a socket that became readable while other tasks are
    /// always ready is served after a few of their polls, not after tokio's default of 61:
    /// four always-ready tasks, and a byte written to a socket 20 times at different points
    /// of the runtime's cycle; the most polls of the busy tasks between a write and its read
    /// was 61 with the default, and is 16 (at most 24 allowed: the queue ahead of it).
    #[test]
    fn a_ready_socket_waits_behind_few_polls_of_busy_tasks() {
        let rt = runtime().unwrap();
        let worst = rt.block_on(async {
            let polls = Arc::new(AtomicU64::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            for _ in 0..4 {
                tokio::spawn(Busy {
                    polls: polls.clone(),
                    stop: stop.clone(),
                    left: None,
                });
            }
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let a = tokio::net::TcpStream::connect(l.local_addr().unwrap())
                .await
                .unwrap();
            let (b, _) = l.accept().await.unwrap();
            let mut worst = 0;
            for i in 0..20 {
                // This task's own polls between rounds move the write along the cycle.
                Busy {
                    polls: Arc::new(AtomicU64::new(0)),
                    stop: stop.clone(),
                    left: Some(i * 3),
                }
                .await;
                assert_eq!(a.try_write(b"x").unwrap(), 1);
                let at = polls.load(Relaxed);
                b.readable().await.unwrap();
                worst = worst.max(polls.load(Relaxed) - at);
                // Read until it would block, so the next round waits for the reactor again.
                let mut buf = [0u8; 8];
                while b.try_read(&mut buf).is_ok_and(|n| n > 0) {}
            }
            stop.store(true, Relaxed);
            worst
        });
        assert!(
            worst <= 24,
            "a ready socket waited behind {worst} polls of busy tasks"
        );
    }
}
