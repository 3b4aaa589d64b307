//! The known-capacity timing ([`crate::Timing::Slots`]): `slots` requests at a time, each
//! holding its slot for a fixed service time; the rest wait, first come first served. Its
//! capacity is exactly `slots / service` requests per second, the ground truth a sweep's
//! capacity answer is tested against.
//!
//! The schedule is booked on the slots' own clock, not on when timers fire: a request starts
//! when the slot that frees first frees (or when it arrives, if later) and frees it exactly
//! `service` after that start, so a late timer on a loaded machine delays a response without
//! lowering the capacity.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The slots: when each frees next.
#[derive(Debug)]
pub(crate) struct Slots {
    free_at: Mutex<BinaryHeap<Reverse<Instant>>>,
    service: Duration,
}

impl Slots {
    /// `slots` (≥ 1, see [`crate::Timing::Slots`]) free from `now`.
    pub(crate) fn new(slots: u32, service: Duration, now: Instant) -> Slots {
        Slots {
            free_at: Mutex::new((0..slots.max(1)).map(|_| Reverse(now)).collect()),
            service,
        }
    }

    /// The service time of every request.
    pub(crate) fn service(&self) -> Duration {
        self.service
    }

    /// Books the slot that frees first for a request that arrived at `now`: it starts when
    /// that slot frees (or at `now`, if later) and holds it for the service time. Returns
    /// the start. Requests booked in turn start in turn (FIFO).
    pub(crate) fn book(&self, now: Instant) -> Instant {
        let mut h = self.free_at.lock().unwrap_or_else(|e| e.into_inner());
        let free = h.pop().map_or(now, |Reverse(t)| t);
        let start = free.max(now);
        h.push(Reverse(start + self.service));
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_beyond_the_slots_wait_in_turn_and_capacity_is_slots_over_service() {
        let t0 = Instant::now();
        let s = Slots::new(4, Duration::from_millis(20), t0);
        // 1000 requests at once: four start now, the next four 20 ms later, and so on.
        let starts: Vec<Instant> = (0..1000).map(|_| s.book(t0)).collect();
        for (i, st) in starts.iter().enumerate() {
            assert_eq!(
                *st - t0,
                Duration::from_millis(20 * (i as u64 / 4)),
                "request {i}"
            );
        }
        // The last of them ends at 250 × 20 ms: 1000 requests in 5 s = 200 req/s = 4 / 20 ms.
        let end = *starts.last().unwrap() + s.service();
        assert_eq!(end - t0, Duration::from_secs(5));
    }

    #[test]
    fn a_request_arriving_to_a_free_slot_starts_at_once() {
        let t0 = Instant::now();
        let s = Slots::new(2, Duration::from_millis(20), t0);
        assert_eq!(s.book(t0), t0);
        // 30 ms later both slots are free again: no wait, whatever was booked before.
        let later = t0 + Duration::from_millis(30);
        assert_eq!(s.book(later), later);
        assert_eq!(s.book(later), later);
        // The third waits for the first slot to free, 20 ms after the earliest booking now.
        assert_eq!(s.book(later), later + Duration::from_millis(20));
    }
}
