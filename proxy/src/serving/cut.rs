//! The cut of a shutdown's last stage (the connections left after the drain timeout are
//! dropped), without a lock at every wake-up of every connection.
//!
//! A connection's task used to wait for the cut with `watch::Receiver::wait_for` in a
//! `select!` beside its work. A `select!` polls every branch at every wake-up, and each poll
//! of a watch's `changed()` takes the lock of the channel's waiter list, which every
//! connection of every serving thread shares: one more contended lock for each forwarded
//! chunk. Here a connection registers its task's waker once ([`Cut::until`]), looks at one
//! flag at each wake-up, and [`Cut::cut`] wakes them all.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

/// The connections waiting to be cut, by serving thread (each registers with its own
/// thread's list, so they contend only with the cut).
#[derive(Debug)]
pub(crate) struct Cut {
    done: AtomicBool,
    next: AtomicU64,
    shards: Vec<Mutex<HashMap<u64, Waker>>>,
}

impl Cut {
    /// A cut for `threads` serving threads.
    pub(crate) fn new(threads: usize) -> Cut {
        Cut {
            done: AtomicBool::new(false),
            next: AtomicU64::new(0),
            shards: (0..threads.max(1)).map(|_| Mutex::default()).collect(),
        }
    }

    /// Cuts: every [`until`](Cut::until) still running ends with `None` at its next poll,
    /// and each is woken for it.
    pub(crate) fn cut(&self) {
        self.done.store(true, SeqCst);
        for s in &self.shards {
            let woken: Vec<Waker> = lock(s).drain().map(|(_, w)| w).collect();
            for w in woken {
                w.wake();
            }
        }
    }

    /// Runs `work` to its end, or until the cut (`None`; `work` is dropped then).
    pub(crate) fn until<F: Future>(&self, work: F) -> Until<'_, F> {
        Until {
            cut: self,
            work,
            key: None,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What [`Cut::until`] returns.
pub(crate) struct Until<'a, F> {
    cut: &'a Cut,
    work: F,
    /// (shard, key, the waker registered) once registered.
    key: Option<(usize, u64, Waker)>,
}

impl<F: Future> Future for Until<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        // SAFETY: `work` is never moved out of the pinned `Until`; the other fields are not
        // structurally pinned.
        let this = unsafe { self.get_unchecked_mut() };
        let cut = this.cut;
        if cut.done.load(SeqCst) {
            return Poll::Ready(None);
        }
        let stale = match &this.key {
            None => true,
            Some((_, _, w)) => !w.will_wake(cx.waker()),
        };
        if stale {
            let (shard, key) = match &this.key {
                Some((s, k, _)) => (*s, *k),
                None => (
                    crate::runtime::threads::index() % cut.shards.len(),
                    cut.next.fetch_add(1, SeqCst),
                ),
            };
            lock(&cut.shards[shard]).insert(key, cx.waker().clone());
            this.key = Some((shard, key, cx.waker().clone()));
            // A cut between the look above and the insert did not see this waker.
            if cut.done.load(SeqCst) {
                return Poll::Ready(None);
            }
        }
        // SAFETY: see above; `work` stays where it is.
        let work = unsafe { Pin::new_unchecked(&mut this.work) };
        work.poll(cx).map(Some)
    }
}

impl<F> Drop for Until<'_, F> {
    fn drop(&mut self) {
        if let Some((shard, key, _)) = self.key.take() {
            lock(&self.cut.shards[shard]).remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_cut_ends_what_is_waiting_and_what_comes_after() {
        let cut = Arc::new(Cut::new(2));
        let c = cut.clone();
        let waiting = tokio::spawn(async move {
            c.until(tokio::time::sleep(Duration::from_secs(3600)))
                .await
                .is_none()
        });
        let finished = cut.until(async { 7 }).await;
        assert_eq!(finished, Some(7));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            lock(&cut.shards[0]).len(),
            1,
            "one waiting, the finished one gone"
        );
        cut.cut();
        assert!(waiting.await.unwrap(), "cut, not slept out");
        assert!(cut.until(async { 7 }).await.is_none(), "after the cut");
        assert!(cut.shards.iter().all(|s| lock(s).is_empty()));
    }
}
