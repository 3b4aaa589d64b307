//! The per-chunk cost of observing a stream, as capture and replay pay it: SSE parsing, the
//! one-pass classification ([`wire::sse::read_event`]) and the tally
//! ([`wire::response_verdict::StreamTally::note`]), on vLLM-shaped chat and completions streams, with
//! and without reading the chunks' text (capture reads it; replay only with a tokenizer).
//!
//! It prints ns per chunk, but on this noisy machine compare builds by instructions:
//! `valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/chunk_cost`
//! reports the same total twice for the same binary whatever else runs (bench/README.md,
//! "Per-chunk parse cost, A/B"). Uses only the API both sides of an A/B share.
//!
//! The same for the typed streams of OpenAI Responses and Anthropic Messages
//! ([`wire::sse::read_event_of`]), shaped as those APIs send them (event lines, the
//! lifecycle events around the deltas, Messages' `ping`): the third argument picks the API;
//! each API's 3 streams carry the same 500 words (one with 200 reasoning deltas first), so
//! per chunk and per event the APIs compare.
//!
//! usage: chunk_cost [ROUNDS [plain|text [chat|responses|messages]]]   (default 200 rounds of
//! 3 chat-and-completions streams of 500 chunks, both ways)

use std::hint::black_box;
use std::time::Instant;

use wire::api::Api;
use wire::response_verdict::StreamTally;
use wire::sse::{read_event_of, ChunkText, SseParser};

const WORDS: [&str; 5] = [" lorem", " ipsum", " dolor", " sit", " amet\\n"];

/// A Responses stream as OpenAI sends it: `chunks` deltas (`reasoning` reasoning-summary
/// deltas first) between the lifecycle events, each event with its `event:` line.
fn responses_stream(chunks: usize, reasoning: usize) -> Vec<u8> {
    let mut s = String::new();
    let mut seq = 0;
    let mut ev = |s: &mut String, ty: &str, body: String| {
        s.push_str(&format!(
            "event: {ty}\ndata: {{\"type\":\"{ty}\",\"sequence_number\":{seq},{body}}}\n\n"
        ));
        seq += 1;
    };
    let resp = r#""response":{"id":"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b","object":"response","created_at":1741476542,"status":"in_progress","model":"gpt-4.1-2025-04-14","output":[],"usage":null}"#;
    ev(&mut s, "response.created", resp.to_string());
    ev(&mut s, "response.in_progress", resp.to_string());
    ev(&mut s, "response.output_item.added", r#""output_index":0,"item":{"id":"msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b","type":"message","status":"in_progress","role":"assistant","content":[]}"#.to_string());
    ev(&mut s, "response.content_part.added", r#""item_id":"msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}"#.to_string());
    for i in 0..chunks {
        let kind = if i < reasoning {
            "response.reasoning_summary_text.delta"
        } else {
            "response.output_text.delta"
        };
        let body = format!(
            r#""item_id":"msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b","output_index":0,"content_index":0,"delta":"{}","logprobs":[]"#,
            WORDS[i % 5]
        );
        ev(&mut s, kind, body);
    }
    ev(&mut s, "response.output_text.done", r#""item_id":"msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b","output_index":0,"content_index":0,"text":"lorem ipsum""#.to_string());
    ev(
        &mut s,
        "response.completed",
        format!(
            r#""response":{{"id":"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b","object":"response","status":"completed","output":[],"usage":{{"input_tokens":1000,"input_tokens_details":{{"cached_tokens":0}},"output_tokens":{chunks},"output_tokens_details":{{"reasoning_tokens":{reasoning}}},"total_tokens":{}}}}}"#,
            1000 + chunks
        ),
    );
    s.into_bytes()
}

/// A Messages stream as Anthropic sends it: `message_start`, a `ping`, `chunks` deltas
/// (`reasoning` thinking deltas first, each kind in its block), `message_delta`,
/// `message_stop`.
fn messages_stream(chunks: usize, reasoning: usize) -> Vec<u8> {
    let mut s = String::new();
    let ev = |s: &mut String, ty: &str, body: &str| {
        s.push_str(&format!(
            "event: {ty}\ndata: {{\"type\":\"{ty}\"{body}}}\n\n"
        ));
    };
    ev(
        &mut s,
        "message_start",
        r#","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":1000,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}"#,
    );
    ev(&mut s, "ping", "");
    let mut block = 0;
    let open = |s: &mut String, kind: &str, block: usize| {
        ev(
            s,
            "content_block_start",
            &format!(r#","index":{block},"content_block":{{"type":"{kind}","{kind}":""}}"#),
        );
    };
    if reasoning > 0 {
        open(&mut s, "thinking", block);
    } else {
        open(&mut s, "text", block);
    }
    for i in 0..chunks {
        if reasoning > 0 && i == reasoning {
            ev(
                &mut s,
                "content_block_stop",
                &format!(r#","index":{block}"#),
            );
            block += 1;
            open(&mut s, "text", block);
        }
        let (kind, field) = if i < reasoning {
            ("thinking_delta", "thinking")
        } else {
            ("text_delta", "text")
        };
        ev(
            &mut s,
            "content_block_delta",
            &format!(
                r#","index":{block},"delta":{{"type":"{kind}","{field}":"{}"}}"#,
                WORDS[i % 5]
            ),
        );
    }
    ev(
        &mut s,
        "content_block_stop",
        &format!(r#","index":{block}"#),
    );
    ev(
        &mut s,
        "message_delta",
        &format!(
            r#","delta":{{"stop_reason":"end_turn","stop_sequence":null}},"usage":{{"output_tokens":{chunks}}}"#
        ),
    );
    ev(&mut s, "message_stop", "");
    s.into_bytes()
}

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
        let word = WORDS[i % 5];
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
    let modes: &[bool] = match std::env::args().nth(2).as_deref() {
        Some("plain") => &[false],
        Some("text") => &[true],
        _ => &[false, true],
    };
    let (api, streams) = match std::env::args().nth(3).as_deref() {
        Some("responses") => (
            Api::Responses,
            [
                responses_stream(500, 0),
                responses_stream(500, 0),
                responses_stream(500, 200),
            ],
        ),
        Some("messages") => (
            Api::Messages,
            [
                messages_stream(500, 0),
                messages_stream(500, 0),
                messages_stream(500, 200),
            ],
        ),
        _ => (
            Api::Chat,
            [
                stream(true, 500, 0),
                stream(false, 500, 0),
                stream(true, 500, 200),
            ],
        ),
    };
    for &keep_text in modes {
        let mut chunks = 0u64;
        let mut events = 0u64;
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
                        events += 1;
                        let kind = read_event_of(api, ev, keep_text.then_some(&mut text));
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
            "{api} keep_text={keep_text}: {chunks} chunks, {events} events, {:.1} ns/chunk ({kept} text bytes)",
            dt.as_nanos() as f64 / chunks as f64
        );
    }
}
