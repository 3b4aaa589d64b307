//! The pacer: one dedicated thread that releases each request at its absolute deadline.
//!
//! tokio's timer wheel has 1 ms granularity, too coarse for sub-millisecond dispatch lag at
//! thousands of requests per second. The pacer thread instead sets its timer slack to 1 ns,
//! sleeps on its channel with a timeout until shortly before the next deadline (so requests
//! the feed builds ahead, and closed-session turns, wake it), spins the last stretch, and
//! then hands the request to the client runtime. Deadlines are absolute (`start + offset`):
//! a late release never delays the ones after it, and a request that reaches the pacer
//! after its deadline (the feed fell behind) is released at once, its lateness measured as
//! dispatch lag. The pacer needs no total: it runs until every sender of its channel is gone
//! and nothing is left to release, or until a [`Stop`] is requested (nothing more is sent).

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::stop::Stop;

/// How long before a deadline the pacer stops sleeping and spins.
const SPIN: Duration = Duration::from_micros(150);
/// Longest sleep between looks at the stop flag.
const POLL: Duration = Duration::from_millis(20);

/// What the pacer receives.
#[derive(Debug)]
pub enum Input<T, M> {
    /// Release `T` at this offset from the start; the `u64` (its schedule position) breaks
    /// ties, so requests due at one instant leave in schedule order.
    At(Duration, u64, T),
    /// Not paced: handed to [`Outlet::pass`] as it arrives.
    Pass(M),
}

/// How a pacer run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PacerEnd {
    /// Requests released.
    pub released: usize,
    /// Requests it held, or received after the stop, that were never released.
    pub unsent: usize,
    /// Whether a stop ended it.
    pub stopped: bool,
}

/// Where the pacer's releases go.
pub trait Outlet<T, M>: Send {
    /// `item` is due now: `offset` from the start, at instant `scheduled`.
    fn dispatch(&mut self, item: T, offset: Duration, scheduled: Instant);
    /// Everything due now was dispatched: an outlet that collects its dispatches hands them
    /// on here, in one go (called after each run of releases, and before [`Outlet::end`]).
    fn flush(&mut self) {}
    /// A message that is not paced.
    fn pass(&mut self, msg: M);
    /// The pacer ended.
    fn end(&mut self, end: PacerEnd);
}

struct Due<T>(Duration, u64, T);

impl<T> PartialEq for Due<T> {
    fn eq(&self, o: &Self) -> bool {
        (self.0, self.1) == (o.0, o.1)
    }
}
impl<T> Eq for Due<T> {}
impl<T> PartialOrd for Due<T> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Due<T> {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.0, self.1).cmp(&(o.0, o.1))
    }
}

/// Takes `inputs`: requests onto the heap (or, `stopped`, counted as unsent: the count is
/// returned), messages to the outlet.
fn take<T, M, O: Outlet<T, M>>(
    inputs: Vec<Input<T, M>>,
    heap: &mut BinaryHeap<Reverse<Due<T>>>,
    out: &mut O,
    stopped: bool,
) -> usize {
    let mut unsent = 0;
    for i in inputs {
        match i {
            Input::At(..) if stopped => unsent += 1,
            Input::At(o, s, t) => heap.push(Reverse(Due(o, s, t))),
            Input::Pass(m) => out.pass(m),
        }
    }
    unsent
}

/// Starts the pacer for a schedule starting at `start`: it takes `initial` and everything
/// sent on `rx` (in batches), and releases each request at its deadline to `out`.
pub fn spawn_pacer<T, M, O>(
    start: Instant,
    initial: Vec<Input<T, M>>,
    rx: Receiver<Vec<Input<T, M>>>,
    stop: Stop,
    mut out: O,
) -> std::io::Result<JoinHandle<()>>
where
    T: Send + 'static,
    M: Send + 'static,
    O: Outlet<T, M> + 'static,
{
    std::thread::Builder::new()
        .name("llmreplay-pacer".into())
        .spawn(move || {
            wire::clock::fine_timer_slack();
            let mut heap: BinaryHeap<Reverse<Due<T>>> = BinaryHeap::new();
            let mut unsent = take(initial, &mut heap, &mut out, false);
            let mut released = 0usize;
            let mut open = true;
            let stopped = loop {
                if stop.level() > 0 {
                    break true;
                }
                let Some(Reverse(Due(offset, _, _))) = heap.peek() else {
                    if !open {
                        break false;
                    }
                    match rx.recv_timeout(POLL) {
                        Ok(batch) => unsent += take(batch, &mut heap, &mut out, false),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => open = false,
                    }
                    continue;
                };
                let deadline = start + *offset;
                let now = Instant::now();
                if deadline > now + SPIN {
                    let wait = (deadline - now - SPIN).min(POLL);
                    if open {
                        match rx.recv_timeout(wait) {
                            Ok(batch) => unsent += take(batch, &mut heap, &mut out, false),
                            Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => open = false,
                        }
                    } else {
                        std::thread::sleep(wait);
                    }
                    continue;
                }
                while Instant::now() < deadline {
                    std::hint::spin_loop();
                }
                // Release everything now due, in deadline order.
                let now = Instant::now();
                while let Some(Reverse(Due(off, _, _))) = heap.peek() {
                    if start + *off > now {
                        break;
                    }
                    let Some(Reverse(Due(off, _, item))) = heap.pop() else {
                        break;
                    };
                    out.dispatch(item, off, start + off);
                    released += 1;
                }
                out.flush();
                while open {
                    match rx.try_recv() {
                        Ok(batch) => unsent += take(batch, &mut heap, &mut out, false),
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => open = false,
                    }
                }
            };
            if stopped {
                // Nothing more is sent: what is held, and what still arrives, is unsent
                // (messages still pass, so the run learns what the feed says).
                unsent += heap.len();
                drop(heap);
                while let Ok(batch) = rx.try_recv() {
                    unsent += take(batch, &mut BinaryHeap::new(), &mut out, true);
                }
            }
            out.flush();
            out.end(PacerEnd {
                released,
                unsent,
                stopped,
            });
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Releases (item, due, actual), messages passed, and the end.
    type Logged = (
        Vec<(usize, Instant, Instant)>,
        Vec<&'static str>,
        Option<PacerEnd>,
    );

    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Logged>>);

    impl Outlet<usize, &'static str> for Log {
        fn dispatch(&mut self, item: usize, _offset: Duration, at: Instant) {
            self.0.lock().unwrap().0.push((item, at, Instant::now()));
        }
        fn pass(&mut self, m: &'static str) {
            self.0.lock().unwrap().1.push(m);
        }
        fn end(&mut self, e: PacerEnd) {
            self.0.lock().unwrap().2 = Some(e);
        }
    }

    /// Every run of releases is followed by a flush before anything else happens, and the
    /// end by none outstanding: an outlet that collects its dispatches (the run's, which spawns
    /// a burst in one go) never holds a release the pacer counted.
    #[test]
    fn each_run_of_releases_is_flushed_before_the_next_and_before_the_end() {
        #[derive(Default)]
        struct Flushes(Arc<Mutex<Vec<String>>>);
        impl Outlet<usize, ()> for Flushes {
            fn dispatch(&mut self, item: usize, _o: Duration, _at: Instant) {
                self.0.lock().unwrap().push(format!("d{item}"));
            }
            fn flush(&mut self) {
                let mut l = self.0.lock().unwrap();
                if l.last().is_some_and(|e| e.starts_with('d')) {
                    l.push("flush".into());
                }
            }
            fn pass(&mut self, _m: ()) {}
            fn end(&mut self, _e: PacerEnd) {
                self.0.lock().unwrap().push("end".into());
            }
        }
        let log = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now() + Duration::from_millis(2);
        let ms = Duration::from_millis;
        let initial = vec![
            Input::At(ms(0), 0, 0),
            Input::At(ms(0), 1, 1),
            Input::At(ms(0), 2, 2),
            Input::At(ms(200), 3, 3),
        ];
        let (tx, rx) = std::sync::mpsc::channel();
        drop(tx);
        let out = Flushes(log.clone());
        spawn_pacer(start, initial, rx, Stop::new(), out)
            .unwrap()
            .join()
            .unwrap();
        let got = log.lock().unwrap().join(" ");
        assert_eq!(got, "d0 d1 d2 flush d3 flush end");
    }

    #[test]
    fn releases_in_deadline_order_never_early_and_accepts_inserts() {
        let start = Instant::now() + Duration::from_millis(5);
        let log = Log::default();
        let initial = vec![
            Input::At(Duration::from_millis(8), 2, 2),
            Input::At(Duration::from_millis(2), 0, 0),
            Input::Pass("hello"),
            Input::At(Duration::from_millis(4), 1, 1),
        ];
        let (tx, rx) = std::sync::mpsc::channel();
        let h = spawn_pacer(start, initial, rx, Stop::new(), log.clone()).unwrap();
        tx.send(vec![Input::At(Duration::from_millis(6), 3, 3)])
            .unwrap();
        drop(tx);
        h.join().unwrap();
        let got = log.0.lock().unwrap();
        let order: Vec<usize> = got.0.iter().map(|g| g.0).collect();
        assert_eq!(order, vec![0, 1, 3, 2]);
        for (_, at, actual) in got.0.iter() {
            assert!(actual >= at, "released early");
        }
        assert_eq!(got.1, vec!["hello"]);
        assert_eq!(
            got.2,
            Some(PacerEnd {
                released: 4,
                unsent: 0,
                stopped: false
            })
        );
    }

    #[test]
    fn ties_leave_in_schedule_order_and_a_late_arrival_leaves_at_once() {
        let start = Instant::now();
        let log = Log::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = spawn_pacer(start, Vec::new(), rx, Stop::new(), log.clone()).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        // Due 25 ms ago: released at once, with its own deadline (so the lag shows).
        tx.send(vec![
            Input::At(Duration::from_millis(5), 7, 7),
            Input::At(Duration::from_millis(5), 6, 6),
        ])
        .unwrap();
        drop(tx);
        h.join().unwrap();
        let got = log.0.lock().unwrap();
        assert_eq!(got.0.iter().map(|g| g.0).collect::<Vec<_>>(), vec![6, 7]);
        assert_eq!(got.0[0].1, start + Duration::from_millis(5));
        assert!(got.0[0].2 >= start + Duration::from_millis(30));
    }

    #[test]
    fn a_stop_releases_nothing_more_and_counts_what_it_held() {
        let start = Instant::now();
        let log = Log::default();
        let stop = Stop::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let initial = vec![
            Input::At(Duration::ZERO, 0, 0),
            Input::At(Duration::from_secs(3600), 1, 1),
            Input::At(Duration::from_secs(3600), 2, 2),
        ];
        let h = spawn_pacer(start, initial, rx, stop.clone(), log.clone()).unwrap();
        while log.0.lock().unwrap().0.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.request("test");
        h.join().unwrap();
        tx.send(vec![Input::At(Duration::ZERO, 3, 3)]).unwrap_err();
        let got = log.0.lock().unwrap();
        assert_eq!(got.0.len(), 1);
        assert_eq!(
            got.2,
            Some(PacerEnd {
                released: 1,
                unsent: 2,
                stopped: true
            })
        );
    }
}
