//! The per-chunk cost of observing a stream, as capture and replay pay it: SSE parsing, the
//! one-pass classification ([`wire::sse::read_event`]) and the tally
//! ([`wire::verdict::StreamTally::note`]), on vLLM-shaped chat and completions streams, with
//! and without reading the chunks' text (capture reads it; replay only with a tokenizer).
//!
//! It prints ns per chunk, but on this noisy machine compare builds by instructions:
//! `valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/chunk_cost`
//! reports the same total twice for the same binary whatever else runs (bench/README.md,
//! "Per-chunk parse cost, A/B"). Uses only the API both sides of an A/B share.
//!
//! usage: chunk_cost [ROUNDS [plain|text]]   (default 200 rounds of 3 streams of 500 chunks,
//! both ways)

use std::hint::black_box;
use std::time::Instant;

use wire::sse::{read_event, ChunkText, SseParser};
use wire::verdict::StreamTally;

/// One stream's bytes: a chat stream (role chunk, content chunks, usage, `[DONE]`) or a
/// completions one, with `reasoning` leading reasoning chunks when asked.
fn stream(chat: bool, chunks: usize, reasoning: usize) -> Vec<u8> {
    let mut s = String::new();
    let head = r#"{"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1733000000,"model":"meta-llama/Llama-3.1-8B-Instruct","#;
    if chat {
        s.push_str(&format!(
            "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        ));
    }
    for i in 0..chunks {
        let word = [" lorem", " ipsum", " dolor", " sit", " amet\\n"][i % 5];
        let choice = match (chat, i < reasoning) {
            (true, true) => format!(
                "{{\"index\":0,\"delta\":{{\"reasoning_content\":\"{word}\"}},\"logprobs\":null,\"finish_reason\":null}}"
            ),
            (true, false) => format!(
                "{{\"index\":0,\"delta\":{{\"content\":\"{word}\"}},\"logprobs\":null,\"finish_reason\":null}}"
            ),
            (false, _) => format!(
                "{{\"index\":0,\"text\":\"{word}\",\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}}"
            ),
        };
        s.push_str(&format!("data: {head}\"choices\":[{choice}]}}\n\n"));
    }
    s.push_str(&format!(
        "data: {head}\"choices\":[],\"usage\":{{\"prompt_tokens\":1000,\"total_tokens\":{},\"completion_tokens\":{chunks}}}}}\n\ndata: [DONE]\n\n",
        1000 + chunks
    ));
    s.into_bytes()
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let streams = [
        stream(true, 500, 0),
        stream(false, 500, 0),
        stream(true, 500, 200),
    ];
    let modes: &[bool] = match std::env::args().nth(2).as_deref() {
        Some("plain") => &[false],
        Some("text") => &[true],
        _ => &[false, true],
    };
    for &keep_text in modes {
        let mut chunks = 0u64;
        let mut text = ChunkText::default();
        let mut kept = 0usize;
        let t0 = Instant::now();
        for _ in 0..rounds {
            for s in &streams {
                let mut parser = SseParser::new();
                let mut tally = StreamTally::with_capacity(512);
                // Frames as a socket delivers them: one event or a few at a time.
                for (i, frame) in s.chunks(173).enumerate() {
                    parser.feed(frame, |ev| {
                        let kind = read_event(ev, keep_text.then_some(&mut text));
                        if tally.note(i as i64, kind) {
                            kept += text.output.len();
                        }
                    });
                }
                chunks += tally.chunk_times_us.len() as u64;
                black_box(&tally);
            }
        }
        let dt = t0.elapsed();
        println!(
            "keep_text={keep_text}: {chunks} chunks, {:.1} ns/chunk ({kept} text bytes)",
            dt.as_nanos() as f64 / chunks as f64
        );
    }
}
