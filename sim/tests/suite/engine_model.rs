//! The engine model on tokio's paused clock: exact, instant, deterministic.

use std::sync::Arc;
use std::time::Duration;

use sim::{Engine, FinishReason, Metrics, Profile};
use tokio::time::Instant;

/// Per-request outcome: TTFT, emission times, tokens.
struct Run {
    ttft: Duration,
    e2e: Duration,
    tokens: u32,
    chunks: u32,
}

impl Run {
    fn tpot(&self) -> Duration {
        (self.e2e - self.ttft) / (self.tokens - 1)
    }
}

fn prompt(salt: u64, words: usize) -> Vec<u64> {
    (0..words as u64).map(|i| salt * 1_000_003 + i).collect()
}

async fn run_one(engine: Engine, prompt: Vec<u64>, out: u32) -> Run {
    let t0 = Instant::now();
    let mut rx = engine.submit(&prompt, out, FinishReason::Length);
    let mut first = None;
    let mut tokens = 0;
    let mut chunks = 0;
    let mut last = t0;
    while let Some(e) = rx.recv().await {
        let now = Instant::now();
        first.get_or_insert(now - t0);
        tokens += e.tokens;
        chunks += 1;
        last = now;
        if e.last {
            break;
        }
    }
    Run {
        ttft: first.expect("at least one emission"),
        e2e: last - t0,
        tokens,
        chunks,
    }
}

async fn run_many(engine: &Engine, n: usize, words: usize, out: u32) -> Vec<Run> {
    let handles: Vec<_> = (0..n)
        .map(|i| tokio::spawn(run_one(engine.clone(), prompt(i as u64 + 1, words), out)))
        .collect();
    let mut runs = Vec::new();
    for h in handles {
        runs.push(h.await.expect("task"));
    }
    runs
}

fn mean(d: impl Iterator<Item = Duration>) -> Duration {
    let v: Vec<_> = d.collect();
    v.iter().sum::<Duration>() / v.len() as u32
}

/// tokio's timer wakes on whole milliseconds (rounding deadlines up); the engine keeps exact
/// deadlines internally, so an observed time is at most 1 ms late.
const MS: Duration = Duration::from_millis(1);

fn assert_close(got: Duration, want: Duration) {
    assert!(
        got >= want && got <= want + MS,
        "got {got:?}, want {want:?}"
    );
}

fn tiny() -> (Engine, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new("t"));
    let (engine, _task) = Engine::spawn(Profile::named("tiny").unwrap(), 1, metrics.clone());
    (engine, metrics)
}

#[tokio::test(start_paused = true)]
async fn single_request_ttft_is_overhead_plus_prefill() {
    let (engine, metrics) = tiny();
    let p = Profile::named("tiny").unwrap();
    let r = run_one(engine, prompt(1, 100), 10).await;
    let expect = p.step_overhead + p.prefill_per_token * 100;
    assert_close(r.ttft, expect);
    assert_eq!(r.tokens, 10);
    assert_eq!(r.chunks, 10);
    // decode step: overhead + one sequence + its KV (100..109 tokens)
    let tpot = r.tpot();
    assert!(tpot >= p.step_overhead + p.decode_per_seq + p.kv_read_per_token * 100);
    assert!(tpot <= p.step_overhead + p.decode_per_seq + p.kv_read_per_token * 110 + MS);
    let m = metrics.snapshot();
    assert_eq!(m.prompt_tokens_total, 100);
    assert_eq!(m.generation_tokens_total, 10);
    assert_eq!(m.request_success_length, 1);
    assert_eq!(m.ttft.count(), 1);
    assert_eq!(m.itl.count(), 9);
    assert_eq!(m.num_requests_running, 0);
    assert_eq!(m.kv_cache_usage_perc, 0.0);
}

#[tokio::test(start_paused = true)]
async fn latency_flat_below_knee_and_climbs_above() {
    let (engine, _) = tiny();
    let one = run_many(&engine, 1, 32, 32).await;
    let two = run_many(&engine, 2, 32, 32).await;
    let many = run_many(&engine, 64, 32, 32).await;
    let ttft1 = mean(one.iter().map(|r| r.ttft));
    let ttft2 = mean(two.iter().map(|r| r.ttft));
    let ttft64 = mean(many.iter().map(|r| r.ttft));
    let tpot1 = mean(one.iter().map(Run::tpot));
    let tpot2 = mean(two.iter().map(Run::tpot));
    // Below the knee: concurrency 2 costs (almost) nothing.
    assert!(
        ttft2.as_secs_f64() < ttft1.as_secs_f64() * 1.15,
        "{ttft1:?} {ttft2:?}"
    );
    assert!(
        tpot2.as_secs_f64() < tpot1.as_secs_f64() * 1.10,
        "{tpot1:?} {tpot2:?}"
    );
    // Far above max_num_seqs (8): requests queue, TTFT climbs by an order of magnitude.
    assert!(ttft64 > ttft1 * 10, "{ttft1:?} {ttft64:?}");
    assert!(many.iter().all(|r| r.tokens == 32));
}

#[tokio::test(start_paused = true)]
async fn repeated_prompt_hits_prefix_cache() {
    let (engine, metrics) = tiny();
    let p = Profile::named("tiny").unwrap();
    let first = run_one(engine.clone(), prompt(7, 256), 4).await;
    let second = run_one(engine.clone(), prompt(7, 256), 4).await;
    assert_close(first.ttft, p.step_overhead + p.prefill_per_token * 256);
    // 15 of 16 blocks cached (the last block is always recomputed)
    assert_close(second.ttft, p.step_overhead + p.prefill_per_token * 16);
    assert!(second.ttft + Duration::from_millis(10) < first.ttft);
    let m = metrics.snapshot();
    assert_eq!(m.prefix_cache_queries_total, 512);
    assert_eq!(m.prefix_cache_hits_total, 240);
    // a different prompt does not hit
    let third = run_one(engine, prompt(8, 256), 4).await;
    assert_eq!(third.ttft, first.ttft);
    assert_eq!(metrics.snapshot().prefix_cache_hits_total, 240);
}

#[tokio::test(start_paused = true)]
async fn kv_pressure_preempts_and_everything_completes() {
    let (engine, metrics) = tiny();
    // 8 x (64 prompt + 128 output) = 1536 tokens > 1024 KV tokens
    let runs = run_many(&engine, 8, 64, 128).await;
    assert!(runs.iter().all(|r| r.tokens == 128));
    let m = metrics.snapshot();
    assert!(m.num_preemptions_total > 0, "no preemption");
    assert_eq!(m.request_success_length, 8);
    assert_eq!(m.generation_tokens_total, 8 * 128);
    assert_eq!(m.num_requests_running, 0);
    assert_eq!(m.num_requests_waiting, 0);
    assert_eq!(m.kv_cache_usage_perc, 0.0);
}

#[tokio::test(start_paused = true)]
async fn kv_full_prompt_waits_for_space() {
    let (engine, metrics) = tiny();
    // Two 500-word prompts take 64 blocks (the whole cache); the third must wait for one
    // of them to finish, although max_num_seqs would admit it.
    let runs = run_many(&engine, 3, 500, 8).await;
    let first_done = runs[..2].iter().map(|r| r.e2e).min().unwrap();
    assert!(
        runs[2].ttft > first_done,
        "{:?} vs {:?}",
        runs[2].ttft,
        first_done
    );
    let m = metrics.snapshot();
    assert_eq!(m.queue_time.count(), 3);
    assert!(m.queue_time.sum() > first_done.as_secs_f64() * 0.9);
}

#[tokio::test(start_paused = true)]
async fn dropped_request_frees_its_kv() {
    let (engine, metrics) = tiny();
    let mut rx = engine.submit(&prompt(1, 200), 500, FinishReason::Length);
    let first = rx.recv().await.expect("first token");
    assert_eq!(first.tokens, 1);
    assert!(metrics.snapshot().kv_cache_usage_perc > 0.0);
    drop(rx);
    // the next request still runs, and the aborted one is gone
    let r = run_one(engine, prompt(2, 10), 3).await;
    assert_eq!(r.tokens, 3);
    let m = metrics.snapshot();
    assert_eq!(m.num_requests_running, 0);
    assert_eq!(m.kv_cache_usage_perc, 0.0);
    assert_eq!(m.request_success_length, 1);
}

#[tokio::test(start_paused = true)]
async fn tokens_per_chunk_coalesces() {
    let metrics = Arc::new(Metrics::new("t"));
    let (engine, _task) = Engine::spawn(Profile::named("tiny").unwrap(), 4, metrics.clone());
    let r = run_one(engine, prompt(1, 10), 10).await;
    assert_eq!(r.tokens, 10);
    assert_eq!(r.chunks, 3);
    assert_eq!(metrics.snapshot().generation_tokens_total, 10);
}

#[tokio::test(start_paused = true)]
async fn oversized_request_ends_without_tokens() {
    let (engine, _) = tiny();
    let mut rx = engine.submit(&prompt(1, 2000), 10, FinishReason::Length);
    assert!(rx.recv().await.is_none());
}

#[test]
fn profiles_are_valid_and_described() {
    assert_eq!(Profile::names()[0], "llama-3.1-8b-h100");
    for name in Profile::names() {
        let p = Profile::named(name).unwrap();
        assert_eq!(&p.name, name);
        let d = p.describe();
        assert!(d.contains("max_num_seqs") && d.contains("sources"), "{d}");
    }
    assert!(Profile::named("nope").is_none());
    let p = Profile::named("llama-3.1-8b-h100").unwrap();
    assert_eq!(p.max_num_seqs, 256);
    assert_eq!(p.max_num_batched_tokens, 8192);
    assert!(
        p.step_overhead >= Duration::from_millis(5) && p.step_overhead <= Duration::from_millis(7)
    );
}

#[tokio::test(start_paused = true)]
async fn llama_profile_flat_then_knee() {
    let p = Profile::named("llama-3.1-8b-h100").unwrap();
    let metrics = Arc::new(Metrics::new("t"));
    let (engine, _task) = Engine::spawn(p.clone(), 1, metrics.clone());
    let one = run_many(&engine, 1, 1000, 64).await;
    let r = &one[0];
    // TTFT = 5.5 ms + 1000 x 40.6 us = 46.1 ms; TPOT about 5.6 ms
    assert_close(r.ttft, p.step_overhead + p.prefill_per_token * 1000);
    let tpot1 = r.tpot();
    assert!(tpot1 > Duration::from_micros(5_500) && tpot1 < Duration::from_micros(6_000));
    let four = run_many(&engine, 4, 1000, 64).await;
    let tpot4 = mean(four.iter().map(Run::tpot));
    assert!(
        tpot4.as_secs_f64() < tpot1.as_secs_f64() * 1.2,
        "{tpot1:?} {tpot4:?}"
    );
    // 1024 at once: 4x max_num_seqs, so most of them queue
    let many = run_many(&engine, 1024, 1000, 64).await;
    let ttft_many = mean(many.iter().map(|r| r.ttft));
    let tpot_many = mean(many.iter().map(Run::tpot));
    assert!(ttft_many > r.ttft * 10, "{ttft_many:?}");
    assert!(tpot_many > tpot1 * 2, "{tpot_many:?}");
    assert_eq!(metrics.snapshot().request_success_length, 1 + 4 + 1024);
}
