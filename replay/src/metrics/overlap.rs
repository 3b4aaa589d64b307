//! The run's peak concurrency in bounded memory: the requests' (start, end) intervals kept
//! exactly up to [`EXACT_CAP`], then starts and ends counted per time bucket.

use trace_format::quantiles::EXACT_CAP;

/// Buckets of start and end counts once the intervals passed [`EXACT_CAP`] (4 MiB).
pub(super) const EVENT_BUCKETS: usize = 1 << 19;

/// The requests' (start, end) for their peak concurrency: exact up to [`EXACT_CAP`], then
/// starts and ends counted per time bucket (see [`super::Metrics::max_concurrent_requests`]).
/// Requests that end as they start (a failed connect) are never in flight and not kept.
#[derive(Default)]
pub(super) struct Overlap {
    pub(super) exact: Vec<(i64, i64)>,
    pub(super) events: Option<Events>,
}

impl Overlap {
    pub(super) fn add(&mut self, start: i64, end: i64) {
        if end <= start {
            return;
        }
        if let Some(ev) = &mut self.events {
            ev.add(start, end);
        } else if self.exact.len() < EXACT_CAP {
            self.exact.push((start, end));
        } else {
            let mut ev = Events::default();
            for &(s, e) in &self.exact {
                ev.add(s, e);
            }
            ev.add(start, end);
            self.exact = Vec::new();
            self.events = Some(ev);
        }
    }

    pub(super) fn max(&mut self) -> usize {
        match &self.events {
            None => max_overlap(&mut self.exact),
            Some(ev) => ev.max(),
        }
    }

    pub(super) fn retained(&self) -> usize {
        self.exact.len() + self.events.as_ref().map_or(0, |e| e.counts.len())
    }
}

/// Starts and ends per bucket of `width` µs (a power of two), `counts[0]` being bucket
/// `lo` (µs / width); at most [`EVENT_BUCKETS`] buckets: a wider span doubles the width.
pub(super) struct Events {
    pub(super) width: i64,
    pub(super) lo: i64,
    pub(super) counts: Vec<(u32, u32)>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            width: 1,
            lo: 0,
            counts: Vec::new(),
        }
    }
}

impl Events {
    pub(super) fn add(&mut self, start: i64, end: i64) {
        let i = self.slot(start);
        self.counts[i].0 = self.counts[i].0.saturating_add(1);
        let i = self.slot(end);
        self.counts[i].1 = self.counts[i].1.saturating_add(1);
    }

    /// The index in `counts` of the bucket of `t`, widening or extending as needed.
    pub(super) fn slot(&mut self, t: i64) -> usize {
        if self.counts.is_empty() {
            self.lo = t.div_euclid(self.width);
            self.counts.push((0, 0));
        }
        loop {
            let b = t.div_euclid(self.width);
            let hi = self.lo + self.counts.len() as i64 - 1;
            let (lo, hi) = (self.lo.min(b), hi.max(b));
            if hi - lo < EVENT_BUCKETS as i64 {
                break;
            }
            if !self.trim() {
                self.widen();
            }
        }
        let b = t.div_euclid(self.width);
        if b < self.lo {
            // Extend by at least the current length (within the bound), so that rows
            // arriving in descending order cost amortised O(1).
            let need = (self.lo - b) as usize;
            let room = EVENT_BUCKETS - self.counts.len() - need;
            let grow = need + self.counts.len().min(room);
            self.counts.splice(0..0, std::iter::repeat_n((0, 0), grow));
            self.lo -= grow as i64;
        }
        let at = (b - self.lo) as usize;
        if at >= self.counts.len() {
            self.counts.resize(at + 1, (0, 0));
        }
        at
    }

    /// Drops empty buckets at either end (the room left by extending ahead); whether any.
    pub(super) fn trim(&mut self) -> bool {
        let Some(first) = self.counts.iter().position(|&c| c != (0, 0)) else {
            return false;
        };
        let last = self
            .counts
            .iter()
            .rposition(|&c| c != (0, 0))
            .unwrap_or(first);
        if first == 0 && last + 1 == self.counts.len() {
            return false;
        }
        self.counts.truncate(last + 1);
        self.counts.drain(..first);
        self.lo += first as i64;
        true
    }

    /// Doubles the width, merging pairs of buckets.
    pub(super) fn widen(&mut self) {
        let lo = self.lo.div_euclid(2);
        let hi = (self.lo + self.counts.len() as i64 - 1).div_euclid(2);
        let mut counts = vec![(0u32, 0u32); (hi - lo + 1) as usize];
        for (k, &(s, e)) in self.counts.iter().enumerate() {
            let c = &mut counts[((self.lo + k as i64).div_euclid(2) - lo) as usize];
            c.0 = c.0.saturating_add(s);
            c.1 = c.1.saturating_add(e);
        }
        self.width *= 2;
        self.lo = lo;
        self.counts = counts;
    }

    /// An upper bound on the peak: the requests in flight when a bucket began plus those
    /// that started in it.
    pub(super) fn max(&self) -> usize {
        let (mut cur, mut best) = (0i64, 0i64);
        for &(s, e) in &self.counts {
            best = best.max(cur + i64::from(s));
            cur += i64::from(s) - i64::from(e);
        }
        best.max(0) as usize
    }
}

/// Most intervals overlapping at one instant (an end at t frees its slot before a start at t).
pub fn max_overlap(intervals: &mut [(i64, i64)]) -> usize {
    let mut ev: Vec<(i64, i32)> = Vec::with_capacity(intervals.len() * 2);
    for &(s, e) in intervals.iter() {
        ev.push((s, 1));
        ev.push((e.max(s), -1));
    }
    ev.sort_unstable();
    let (mut cur, mut best) = (0i64, 0i64);
    for (_, d) in ev {
        cur += i64::from(d);
        best = best.max(cur);
    }
    best as usize
}
