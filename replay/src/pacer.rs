//! The pacer: one dedicated thread that releases each request at its absolute deadline.
//!
//! tokio's timer wheel has 1 ms granularity, too coarse for sub-millisecond dispatch lag at
//! thousands of requests per second. The pacer thread instead sets its timer slack to 1 ns,
//! sleeps on a channel with a timeout until shortly before the next deadline (so newly
//! scheduled closed-session turns wake it), spins the last stretch, and then hands the
//! request to the client runtime. Deadlines are absolute (`start + offset`): a late
//! release never delays the ones after it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::mpsc::{RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long before a deadline the pacer stops sleeping and spins.
const SPIN: Duration = Duration::from_micros(150);

/// A request to release: (offset from start, plan index).
pub type Release = (Duration, usize);

/// Starts the pacer. It releases `initial` and anything sent on the returned channel, calling
/// `dispatch(index, scheduled_instant)` at each deadline, and stops after `total` releases.
pub fn spawn_pacer<F>(
    start: Instant,
    initial: Vec<Release>,
    total: usize,
    mut dispatch: F,
) -> std::io::Result<(Sender<Release>, JoinHandle<()>)>
where
    F: FnMut(usize, Instant) + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel::<Release>();
    let handle = std::thread::Builder::new()
        .name("llmreplay-pacer".into())
        .spawn(move || {
            wire::clock::fine_timer_slack();
            let mut heap: BinaryHeap<Reverse<Release>> = initial.into_iter().map(Reverse).collect();
            let mut released = 0usize;
            while released < total {
                let Some(&Reverse((offset, _))) = heap.peek() else {
                    // Nothing due until a running turn schedules its successor.
                    match rx.recv() {
                        Ok(r) => heap.push(Reverse(r)),
                        Err(_) => break,
                    }
                    continue;
                };
                let deadline = start + offset;
                let now = Instant::now();
                if deadline > now + SPIN {
                    match rx.recv_timeout(deadline - now - SPIN) {
                        Ok(r) => heap.push(Reverse(r)),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => {
                            // No more inserts can come; sleep the rest plainly.
                            let now = Instant::now();
                            if deadline > now + SPIN {
                                std::thread::sleep(deadline - now - SPIN);
                            }
                        }
                    }
                    continue;
                }
                while Instant::now() < deadline {
                    std::hint::spin_loop();
                }
                // Release everything now due, in deadline order.
                let now = Instant::now();
                while let Some(&Reverse((off, idx))) = heap.peek() {
                    if start + off > now {
                        break;
                    }
                    heap.pop();
                    dispatch(idx, start + off);
                    released += 1;
                }
                while let Ok(r) = rx.try_recv() {
                    heap.push(Reverse(r));
                }
            }
        })?;
    Ok((tx, handle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn releases_in_deadline_order_never_early_and_accepts_inserts() {
        let start = Instant::now() + Duration::from_millis(5);
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        let initial = vec![
            (Duration::from_millis(8), 2),
            (Duration::from_millis(2), 0),
            (Duration::from_millis(4), 1),
        ];
        let (tx, h) = spawn_pacer(start, initial, 4, move |i, at| {
            g.lock().unwrap().push((i, at, Instant::now()));
        })
        .unwrap();
        tx.send((Duration::from_millis(6), 3)).unwrap();
        h.join().unwrap();
        let got = got.lock().unwrap();
        let order: Vec<usize> = got.iter().map(|g| g.0).collect();
        assert_eq!(order, vec![0, 1, 3, 2]);
        for (_, at, actual) in got.iter() {
            assert!(actual >= at, "released early");
        }
    }
}
