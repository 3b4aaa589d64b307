//! How cacheable a trace is: the share of its prompt tokens that a prefix cache of a given size
//! would have served from earlier requests.
//!
//! The trace's `prefix_hashes` name each prompt block (of the file's `llmreplay.block_size`
//! tokens) chained to the block before it, as vLLM's prefix cache keys blocks, and as Mooncake's
//! and Qwen's `hash_ids` do (equal leading ids mean a shared prefix). Requests are taken in
//! arrival order. A request's cached prefix is its leading run of blocks that are in the cache
//! when it arrives (the first miss ends it, as in vLLM); afterwards every block of the request is
//! in the cache, the most recently used. A cache of `N` blocks evicts the least recently used
//! block when it is full; `None` is a cache that never evicts (the upper bound).
//!
//! Theoretical on purpose: no block is pinned by a request in flight, and a fully cached prompt
//! counts all its tokens (an engine recomputes at least its last token). Hit tokens are
//! `min(blocks hit × block size, prompt tokens)`: capture hashes full blocks only, Mooncake also
//! names the last partial block.
//!
//! Memory: an LRU cache of `N` blocks holds at most `N` blocks (about 50 bytes each). The
//! unbounded cache keeps every distinct block (about 10–20 bytes each) up to
//! [`UNBOUNDED_CAP_BLOCKS`]; past that it keeps what it has and adds no new block, so its hit
//! rate becomes a lower bound (a block first seen after the cap filled is a miss whenever it
//! recurs) and [`PrefixCacheSummary::unbounded_capped_at`] says so. A 10-million-row capture
//! of 1,000-token prompts in 16-token blocks names up to 600 million blocks: the cap keeps
//! the unbounded line within ~100 MB.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

/// The most distinct blocks the unbounded cache keeps (see the [module](self) documentation).
pub const UNBOUNDED_CAP_BLOCKS: usize = 1 << 22;

/// One cache size's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CacheHitRate {
    /// Capacity in blocks (None: unbounded).
    pub cache_blocks: Option<u64>,
    /// Prompt tokens the cache would have served / prompt tokens of the rows with hashes.
    pub token_hit_rate: f64,
    /// Prompt tokens served from the cache.
    pub hit_tokens: u64,
    /// Blocks found in the cache (leading runs only).
    pub hit_blocks: u64,
    /// Requests with at least one block served from the cache.
    pub requests_hit: u64,
}

/// The cacheability of a trace, for every cache size asked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrefixCacheSummary {
    /// Tokens per block (the trace's `llmreplay.block_size`).
    pub block_size: u32,
    /// Rows that carry prefix hashes (only those are counted).
    pub rows_with_hashes: u64,
    /// Their prompt tokens (the denominator of every rate).
    pub prompt_tokens: u64,
    /// Their blocks.
    pub blocks: u64,
    /// Distinct blocks over the trace: the unbounded cache's final size (at most
    /// [`UNBOUNDED_CAP_BLOCKS`]: at least this many when capped).
    pub distinct_blocks: u64,
    /// Set (to the cap, [`UNBOUNDED_CAP_BLOCKS`]) when the trace had more distinct blocks than the
    /// unbounded cache keeps: its hit rate is then a lower bound, and `distinct_blocks` too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unbounded_capped_at: Option<u64>,
    /// One entry per cache size, unbounded first.
    pub caches: Vec<CacheHitRate>,
}

/// An LRU cache of block hashes (or an unbounded one) that counts what it serves.
#[derive(Debug)]
struct Lru {
    capacity: Option<usize>,
    /// The unbounded cache's blocks (up to [`UNBOUNDED_CAP_BLOCKS`]).
    seen: HashSet<u64>,
    /// The most blocks `seen` keeps, and whether a block was left out for it.
    seen_cap: usize,
    capped: bool,
    /// A bounded cache's blocks → the tick each was last used.
    last_use: HashMap<u64, u64>,
    /// Tick → block, oldest first.
    by_age: BTreeMap<u64, u64>,
    tick: u64,
    hit_tokens: u64,
    hit_blocks: u64,
    requests_hit: u64,
}

impl Lru {
    fn new(capacity: Option<usize>) -> Lru {
        Lru {
            capacity,
            seen: HashSet::new(),
            seen_cap: UNBOUNDED_CAP_BLOCKS,
            capped: false,
            last_use: HashMap::new(),
            by_age: BTreeMap::new(),
            tick: 0,
            hit_tokens: 0,
            hit_blocks: 0,
            requests_hit: 0,
        }
    }

    fn contains(&self, h: &u64) -> bool {
        match self.capacity {
            None => self.seen.contains(h),
            Some(_) => self.last_use.contains_key(h),
        }
    }

    fn observe(&mut self, hashes: &[u64], prompt_tokens: u64, block_size: u32) {
        let hit = hashes.iter().take_while(|h| self.contains(h)).count() as u64;
        self.hit_blocks += hit;
        self.hit_tokens += (hit * u64::from(block_size)).min(prompt_tokens);
        self.requests_hit += u64::from(hit > 0);
        let Some(cap) = self.capacity else {
            for &h in hashes {
                if self.seen.len() < self.seen_cap {
                    self.seen.insert(h);
                } else if !self.seen.contains(&h) {
                    self.capped = true;
                }
            }
            return;
        };
        if cap == 0 {
            return;
        }
        for &h in hashes {
            self.tick += 1;
            if let Some(t) = self.last_use.insert(h, self.tick) {
                self.by_age.remove(&t);
            }
            self.by_age.insert(self.tick, h);
        }
        while self.last_use.len() > cap {
            let Some((_, h)) = self.by_age.pop_first() else {
                break;
            };
            self.last_use.remove(&h);
        }
    }
}

/// Feeds requests in arrival order to one cache per size and reports each.
#[derive(Debug)]
pub struct PrefixCacheSim {
    block_size: u32,
    caches: Vec<Lru>,
    rows: u64,
    prompt_tokens: u64,
    blocks: u64,
}

impl PrefixCacheSim {
    /// An unbounded cache plus one LRU cache per entry of `sizes` (blocks), in that order.
    pub fn new(block_size: u32, sizes: &[u64]) -> PrefixCacheSim {
        let mut caches = vec![Lru::new(None)];
        caches.extend(
            sizes
                .iter()
                .map(|&n| Lru::new(Some(usize::try_from(n).unwrap_or(usize::MAX)))),
        );
        PrefixCacheSim {
            block_size: block_size.max(1),
            caches,
            rows: 0,
            prompt_tokens: 0,
            blocks: 0,
        }
    }

    /// One request, in arrival order. `prompt_tokens` None: its blocks are taken as full.
    pub fn observe(&mut self, hashes: &[u64], prompt_tokens: Option<i64>) {
        let full = hashes.len() as u64 * u64::from(self.block_size);
        let tokens = prompt_tokens.map_or(full, |t| t.max(0) as u64);
        self.rows += 1;
        self.prompt_tokens += tokens;
        self.blocks += hashes.len() as u64;
        for c in &mut self.caches {
            c.observe(hashes, tokens, self.block_size);
        }
    }

    /// The result (None when no request carried hashes).
    pub fn finish(self) -> Option<PrefixCacheSummary> {
        if self.rows == 0 {
            return None;
        }
        let total = self.prompt_tokens;
        let unbounded = &self.caches[0];
        let (distinct_blocks, capped) = (unbounded.seen.len() as u64, unbounded.capped);
        Some(PrefixCacheSummary {
            block_size: self.block_size,
            rows_with_hashes: self.rows,
            prompt_tokens: total,
            blocks: self.blocks,
            distinct_blocks,
            unbounded_capped_at: capped.then_some(unbounded.seen_cap as u64),
            caches: self
                .caches
                .into_iter()
                .map(|c| CacheHitRate {
                    cache_blocks: c.capacity.map(|n| n as u64),
                    token_hit_rate: if total == 0 {
                        0.0
                    } else {
                        c.hit_tokens as f64 / total as f64
                    },
                    hit_tokens: c.hit_tokens,
                    hit_blocks: c.hit_blocks,
                    requests_hit: c.requests_hit,
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Worked by hand, block size 4:
    /// r1 [1,2,3] 12 tokens: nothing cached.                     cache {1,2,3}
    /// r2 [1,2,4] 11 tokens: 1,2 hit (8 tokens).                  cache {1,2,3,4}
    /// r3 [5,2]    8 tokens: 5 misses, so 2 does not count (0).   cache {1,2,3,4,5}
    /// r4 [1,2,3] 10 tokens: 3 blocks hit, 12 capped at 10.
    /// Unbounded: 18 of 41 tokens. With 3 blocks (LRU): after r2 the cache is {2,1,4} (3 was
    /// least recent), after r3 {4,5,2} (1 evicted, then 2 touched again), so r4 hits nothing:
    /// 8 of 41.
    #[test]
    fn leading_runs_in_arrival_order_with_lru_eviction() {
        let mut s = PrefixCacheSim::new(4, &[3, 0]);
        s.observe(&[1, 2, 3], Some(12));
        s.observe(&[1, 2, 4], Some(11));
        s.observe(&[5, 2], Some(8));
        s.observe(&[1, 2, 3], Some(10));
        let r = s.finish().unwrap();
        assert_eq!((r.rows_with_hashes, r.prompt_tokens, r.blocks), (4, 41, 11));
        assert_eq!(r.distinct_blocks, 5);
        let c: Vec<_> = r
            .caches
            .iter()
            .map(|c| (c.cache_blocks, c.hit_tokens, c.hit_blocks, c.requests_hit))
            .collect();
        assert_eq!(
            c,
            vec![(None, 18, 5, 2), (Some(3), 8, 2, 1), (Some(0), 0, 0, 0)]
        );
        assert!((r.caches[0].token_hit_rate - 18.0 / 41.0).abs() < 1e-12);
    }

    /// Past its cap the unbounded cache keeps what it has: blocks first seen after it filled
    /// miss, so its rate is a lower bound and says so; bounded caches are unaffected.
    #[test]
    fn the_unbounded_cache_is_capped_and_then_a_lower_bound() {
        let mut s = PrefixCacheSim::new(4, &[10]);
        s.caches[0].seen_cap = 3;
        s.observe(&[1, 2, 3], Some(12));
        s.observe(&[1, 2, 3], Some(12)); // 3 hits
        s.observe(&[4, 5], Some(8)); // 4, 5 left out of the full unbounded cache
        s.observe(&[4, 5], Some(8)); // unbounded: misses; LRU 10: 2 hits
        let r = s.finish().unwrap();
        assert_eq!(r.unbounded_capped_at, Some(3));
        assert_eq!(r.distinct_blocks, 3);
        assert_eq!((r.caches[0].hit_blocks, r.caches[0].hit_tokens), (3, 12));
        assert_eq!((r.caches[1].hit_blocks, r.caches[1].hit_tokens), (5, 20));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["unbounded_capped_at"], 3);

        let mut s = PrefixCacheSim::new(4, &[]);
        s.observe(&[1, 2, 3], Some(12));
        let json = serde_json::to_value(s.finish().unwrap()).unwrap();
        assert!(json.get("unbounded_capped_at").is_none(), "{json}");
    }

    #[test]
    fn no_hashes_means_no_summary_and_unknown_lengths_count_full_blocks() {
        assert_eq!(PrefixCacheSim::new(16, &[]).finish(), None);
        let mut s = PrefixCacheSim::new(16, &[]);
        s.observe(&[7, 8], None);
        s.observe(&[7, 8], None);
        let r = s.finish().unwrap();
        assert_eq!(r.prompt_tokens, 64);
        assert_eq!(r.caches[0].hit_tokens, 32);
    }
}
