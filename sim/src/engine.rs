//! The simulated engine: one task doing vLLM V1-like continuous batching in real time, so that
//! latency is flat at low load and climbs past a knee, as on a GPU.
//!
//! Each step the scheduler serves the running sequences first (a decoding sequence takes one
//! token of the `max_num_batched_tokens` budget, an unfinished prefill takes what is left, in
//! FIFO order), then admits waiting requests in FIFO order while the budget, `max_num_seqs`
//! and the KV cache allow. A request is admitted only when blocks for its whole uncached
//! prompt fit; decoding grows KV usage, and when a block cannot be found the most recently
//! admitted running request is preempted (recompute: its blocks are freed and it goes back to
//! the front of the queue). Full prompt blocks are kept in a prefix cache keyed by chained
//! block hashes; cached blocks skip prefill and are evicted LRU when space is needed.
//!
//! The step's duration follows the [`Profile`] cost model; the engine sleeps until the step's
//! absolute end (`step_end = step_start + duration`), then emits tokens: a sequence whose
//! prefill completed emits its first chunk, every decoding sequence emits the next one. Each
//! emission carries up to `tokens_per_chunk` tokens (as with speculative decoding, whose
//! accepted tokens arrive together). An idle engine waits on its queue without spinning.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::engine_metrics::{FinishReason, Metrics};
use crate::profile::Profile;
use crate::tokens::block_hashes;

/// One emission of the engine to a request: a chunk of tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emit {
    /// Number of tokens in this chunk (>= 1).
    pub tokens: u32,
    /// True on the request's last chunk.
    pub last: bool,
}

struct Submission {
    id: u64,
    prompt_len: u32,
    hashes: Vec<u64>,
    output_tokens: u32,
    finish: FinishReason,
    arrival: Instant,
    tx: mpsc::UnboundedSender<Emit>,
}

/// Handle to a running engine task. Cloning is cheap; the task ends once every handle is
/// dropped and its work is done.
#[derive(Clone, Debug)]
pub struct Engine {
    tx: mpsc::UnboundedSender<Submission>,
    block_size: u32,
    capacity_tokens: u64,
    next_id: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Submission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Submission").field("id", &self.id).finish()
    }
}

impl Engine {
    /// Spawns the engine task on the current tokio runtime.
    ///
    /// `tokens_per_chunk` (clamped to >= 1) tokens are emitted per sequence and step.
    pub fn spawn(
        profile: Profile,
        tokens_per_chunk: u32,
        metrics: Arc<Metrics>,
    ) -> (Engine, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let engine = Engine {
            tx,
            block_size: profile.block_size.max(1),
            capacity_tokens: u64::from(profile.num_gpu_blocks) * u64::from(profile.block_size),
            next_id: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        };
        let core = Core::new(profile, tokens_per_chunk.max(1), metrics);
        let task = tokio::spawn(run(core, rx));
        (engine, task)
    }

    /// Submits a request: `prompt` holds one hash per prompt token (equal hashes = equal
    /// tokens, for the prefix cache); the request generates `output_tokens` (>= 1) tokens and
    /// is counted as finished for `finish`. Returns the stream of emissions; dropping it
    /// aborts the request (its KV is freed at the next step). If the request can never fit
    /// in the KV cache, the stream ends without any emission.
    pub fn submit(
        &self,
        prompt: &[u64],
        output_tokens: u32,
        finish: FinishReason,
    ) -> mpsc::UnboundedReceiver<Emit> {
        let (tx, rx) = mpsc::unbounded_channel();
        let prompt_len = u32::try_from(prompt.len()).unwrap_or(u32::MAX);
        let total = u64::from(prompt_len.max(1)) + u64::from(output_tokens);
        if output_tokens == 0 || total > self.capacity_tokens {
            return rx; // tx dropped: the stream ends at once
        }
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = self.tx.send(Submission {
            id,
            prompt_len,
            hashes: block_hashes(prompt, self.block_size),
            output_tokens,
            finish,
            arrival: Instant::now(),
            tx,
        });
        rx
    }
}

async fn run(mut core: Core, mut rx: mpsc::UnboundedReceiver<Submission>) {
    let mut step_start: Option<Instant> = None;
    loop {
        while let Ok(s) = rx.try_recv() {
            core.add(s);
        }
        core.drop_cancelled();
        if core.is_idle() {
            core.publish_gauges();
            step_start = None;
            match rx.recv().await {
                Some(s) => core.add(s),
                None => return,
            }
            continue;
        }
        // Absolute deadlines: a busy engine starts each step where the previous one ended.
        let start = match step_start {
            Some(t) => t,
            None => Instant::now(),
        };
        let dur = core.schedule(start);
        let end = start
            .checked_add(dur)
            .unwrap_or_else(|| start + Duration::from_secs(365 * 86_400));
        tokio::time::sleep_until(end).await;
        core.complete(end);
        step_start = Some(end);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    None,
    Prefill(u32),
    Decode(u32),
}

struct Seq {
    prompt_len: u32,
    hashes: Vec<u64>,
    target: u32,
    finish: FinishReason,
    out: u32,
    /// Tokens whose KV is computed (prefill progress, then context length).
    computed: u32,
    /// Tokens to compute before the next emission (prompt, plus earlier output after a
    /// preemption).
    prefill_target: u32,
    /// Number of leading prompt blocks registered in the prefix cache.
    registered: usize,
    blocks: Vec<u32>,
    arrival: Instant,
    queued_observed: bool,
    last_emit: Option<Instant>,
    work: Work,
    tx: mpsc::UnboundedSender<Emit>,
}

#[derive(Clone, Copy)]
struct Block {
    refs: u32,
    hash: Option<u64>,
    /// Generation stamp: a free-queue entry is valid only while it matches.
    gen: u32,
}

/// KV block pool with an LRU prefix cache (vLLM's free-block queue: freed blocks go to the
/// tail, allocation takes the head and evicts its cached hash).
struct Kv {
    blocks: Vec<Block>,
    free: VecDeque<(u32, u32)>,
    free_count: usize,
    cached: HashMap<u64, u32>,
}

impl Kv {
    fn new(n: u32) -> Self {
        let blocks = vec![
            Block {
                refs: 0,
                hash: None,
                gen: 0
            };
            n as usize
        ];
        Kv {
            blocks,
            free: (0..n).map(|i| (i, 0)).collect(),
            free_count: n as usize,
            cached: HashMap::new(),
        }
    }

    fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        1.0 - self.free_count as f64 / self.blocks.len() as f64
    }

    fn is_free_entry(&self, (id, gen): (u32, u32)) -> bool {
        let b = &self.blocks[id as usize];
        b.refs == 0 && b.gen == gen
    }

    /// Takes a free block (evicting its cached hash); caller checked `free_count`.
    fn alloc(&mut self) -> Option<u32> {
        while let Some(entry) = self.free.pop_front() {
            if !self.is_free_entry(entry) {
                continue;
            }
            let id = entry.0;
            let b = &mut self.blocks[id as usize];
            b.refs = 1;
            b.gen = b.gen.wrapping_add(1);
            if let Some(h) = b.hash.take() {
                if self.cached.get(&h) == Some(&id) {
                    self.cached.remove(&h);
                }
            }
            self.free_count -= 1;
            return Some(id);
        }
        None
    }

    /// Takes a reference on a cached block (removing it from the free queue if unused).
    fn touch(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        if b.refs == 0 {
            b.gen = b.gen.wrapping_add(1);
            self.free_count -= 1;
        }
        b.refs += 1;
    }

    /// Releases blocks, last first, so a sequence's tail is evicted before its head.
    fn release(&mut self, blocks: &mut Vec<u32>) {
        while let Some(id) = blocks.pop() {
            let b = &mut self.blocks[id as usize];
            b.refs = b.refs.saturating_sub(1);
            if b.refs == 0 {
                b.gen = b.gen.wrapping_add(1);
                self.free.push_back((id, b.gen));
                self.free_count += 1;
            }
        }
        if self.free.len() > 2 * self.blocks.len() + 64 {
            let blocks = &self.blocks;
            self.free.retain(|&(id, gen)| {
                blocks[id as usize].refs == 0 && blocks[id as usize].gen == gen
            });
        }
    }

    fn register(&mut self, id: u32, hash: u64) {
        if self.cached.contains_key(&hash) {
            return;
        }
        self.blocks[id as usize].hash = Some(hash);
        self.cached.insert(hash, id);
    }
}

struct Core {
    p: Profile,
    k: u32,
    metrics: Arc<Metrics>,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    kv: Kv,
}

fn blocks_for(tokens: u32, bs: u32) -> usize {
    tokens.div_ceil(bs) as usize
}

fn scale(d: Duration, n: u64) -> Duration {
    let nanos = d.as_nanos().saturating_mul(u128::from(n));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

impl Core {
    fn new(p: Profile, k: u32, metrics: Arc<Metrics>) -> Self {
        let kv = Kv::new(p.num_gpu_blocks);
        Core {
            p,
            k,
            metrics,
            waiting: VecDeque::new(),
            running: Vec::new(),
            kv,
        }
    }

    fn add(&mut self, s: Submission) {
        let prompt = s.prompt_len.max(1);
        self.waiting.push_back(Seq {
            prompt_len: s.prompt_len,
            hashes: s.hashes,
            target: s.output_tokens,
            finish: s.finish,
            out: 0,
            computed: 0,
            prefill_target: prompt,
            registered: 0,
            blocks: Vec::new(),
            arrival: s.arrival,
            queued_observed: false,
            last_emit: None,
            work: Work::None,
            tx: s.tx,
        });
    }

    fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    fn publish_gauges(&self) {
        self.metrics
            .update()
            .gauges(self.running.len(), self.waiting.len(), self.kv.usage());
    }

    /// Removes requests whose client went away, freeing their KV.
    fn drop_cancelled(&mut self) {
        self.waiting.retain(|s| !s.tx.is_closed());
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].tx.is_closed() {
                let mut s = self.running.remove(i);
                self.kv.release(&mut s.blocks);
            } else {
                i += 1;
            }
        }
    }

    fn preempt_last(&mut self) {
        if let Some(mut s) = self.running.pop() {
            self.kv.release(&mut s.blocks);
            s.computed = 0;
            s.registered = 0;
            s.work = Work::None;
            s.prefill_target = s.prompt_len.max(1).saturating_add(s.out);
            self.waiting.push_front(s);
            self.metrics.update().preemption();
        }
    }

    /// Plans one step starting at `now`; returns its duration.
    fn schedule(&mut self, now: Instant) -> Duration {
        let bs = self.p.block_size;
        let mut budget = self.p.max_num_batched_tokens;
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() {
            let s = &mut self.running[i];
            s.work = Work::None;
            if s.computed < s.prefill_target {
                let n = (s.prefill_target - s.computed).min(budget);
                if n > 0 {
                    s.work = Work::Prefill(n);
                    budget -= n;
                }
                i += 1;
                continue;
            }
            if budget == 0 {
                i += 1;
                continue;
            }
            let n = self.k.min(s.target - s.out).max(1);
            let need = blocks_for(s.computed + n, bs).saturating_sub(s.blocks.len());
            let mut scheduled = false;
            loop {
                if need <= self.kv.free_count {
                    let s = &mut self.running[i];
                    for _ in 0..need {
                        if let Some(b) = self.kv.alloc() {
                            s.blocks.push(b);
                        }
                    }
                    s.work = Work::Decode(n);
                    budget -= 1;
                    scheduled = true;
                    break;
                }
                let victim = self.running.len() - 1;
                self.preempt_last();
                preempted = true;
                if victim == i {
                    break;
                }
            }
            if scheduled {
                i += 1;
            }
        }

        if !preempted {
            self.admit(now, &mut budget);
        }

        let mut prefill = 0u64;
        let mut decoding = 0u64;
        let mut kv_tokens = 0u64;
        for s in &self.running {
            match s.work {
                Work::Prefill(n) => prefill += u64::from(n),
                Work::Decode(_) => {
                    decoding += 1;
                    kv_tokens += u64::from(s.computed);
                }
                Work::None => {}
            }
        }
        if prefill == 0 && decoding == 0 {
            // Nothing fits (cannot happen with validated requests); drop the head so the
            // engine never spins.
            if self.running.is_empty() {
                self.waiting.pop_front();
            }
        }
        self.p
            .step_overhead
            .saturating_add(scale(self.p.prefill_per_token, prefill))
            .saturating_add(scale(self.p.decode_per_seq, decoding))
            .saturating_add(scale(self.p.kv_read_per_token, kv_tokens))
    }

    fn admit(&mut self, now: Instant, budget: &mut u32) {
        let bs = self.p.block_size;
        while *budget > 0 && self.running.len() < self.p.max_num_seqs as usize {
            let Some(s) = self.waiting.front() else {
                break;
            };
            // Prefix cache lookup: leading full blocks, never the whole prompt (the last
            // token is always recomputed, as in vLLM).
            let max_hit = ((s.prefill_target - 1) / bs) as usize;
            let mut hits = Vec::new();
            for h in s.hashes.iter().take(max_hit) {
                match self.kv.cached.get(h) {
                    Some(&b) => hits.push(b),
                    None => break,
                }
            }
            let total = blocks_for(s.prefill_target, bs);
            let new_blocks = total - hits.len();
            let hit_unused = hits
                .iter()
                .filter(|&&b| self.kv.blocks[b as usize].refs == 0)
                .count();
            if new_blocks > self.kv.free_count.saturating_sub(hit_unused) {
                break; // head-of-line: wait for KV
            }
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            for &b in &hits {
                self.kv.touch(b);
                s.blocks.push(b);
            }
            for _ in 0..new_blocks {
                if let Some(b) = self.kv.alloc() {
                    s.blocks.push(b);
                }
            }
            let hit_tokens = hits.len() as u32 * bs;
            s.computed = hit_tokens;
            s.registered = hits.len();
            let n = (s.prefill_target - s.computed).min(*budget);
            *budget -= n;
            s.work = Work::Prefill(n);
            {
                let mut m = self.metrics.update();
                m.prefix_cache(s.prefill_target, hit_tokens);
                if !s.queued_observed {
                    m.queue_time(now.saturating_duration_since(s.arrival));
                }
            }
            s.queued_observed = true;
            self.running.push(s);
        }
    }

    /// Finishes the step that ended at `end`: emits tokens, retires finished requests.
    fn complete(&mut self, end: Instant) {
        let bs = self.p.block_size;
        let k = self.k;
        let metrics = Arc::clone(&self.metrics);
        let mut m = metrics.update();
        let mut i = 0;
        while i < self.running.len() {
            let s = &mut self.running[i];
            let emit = match s.work {
                Work::None => None,
                Work::Prefill(n) => {
                    s.computed += n;
                    let full = ((s.computed.min(s.prompt_len)) / bs) as usize;
                    while s.registered < full.min(s.hashes.len()) {
                        let j = s.registered;
                        if let Some(&b) = s.blocks.get(j) {
                            self.kv.register(b, s.hashes[j]);
                        }
                        s.registered += 1;
                    }
                    if s.computed >= s.prefill_target {
                        Some(k.min(s.target - s.out))
                    } else {
                        None
                    }
                }
                Work::Decode(n) => {
                    s.computed += n;
                    Some(n)
                }
            };
            s.work = Work::None;
            let mut remove = false;
            if let Some(n) = emit {
                match s.last_emit {
                    None => {
                        m.ttft(end.saturating_duration_since(s.arrival));
                        m.prompt_tokens(s.prompt_len);
                    }
                    Some(t) => m.itl(end.saturating_duration_since(t)),
                }
                s.last_emit = Some(end);
                s.out += n;
                m.generation_tokens(n);
                let last = s.out >= s.target;
                if s.tx.send(Emit { tokens: n, last }).is_err() {
                    remove = true;
                } else if last {
                    m.e2e(end.saturating_duration_since(s.arrival));
                    m.success(s.finish);
                    remove = true;
                }
            }
            if remove {
                let mut s = self.running.remove(i);
                self.kv.release(&mut s.blocks);
            } else {
                i += 1;
            }
        }
        m.gauges(self.running.len(), self.waiting.len(), self.kv.usage());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_alloc_release_and_cache() {
        let mut kv = Kv::new(4);
        let a = kv.alloc().unwrap();
        let b = kv.alloc().unwrap();
        assert_eq!(kv.free_count, 2);
        kv.register(a, 11);
        let mut v = vec![a, b];
        kv.release(&mut v);
        assert_eq!(kv.free_count, 4);
        assert_eq!(kv.cached.get(&11), Some(&a));
        kv.touch(a);
        assert_eq!(kv.free_count, 3);
        // allocate everything else: the cached-and-touched block must not be handed out
        let mut got = Vec::new();
        while let Some(x) = kv.alloc() {
            got.push(x);
        }
        assert_eq!(got.len(), 3);
        assert!(!got.contains(&a));
        assert_eq!(kv.free_count, 0);
    }
}
