//! Building the request a trace row stands for.
//!
//! Every row goes to its own API's endpoint ([`wire::api::Api`]). A row with a recorded body
//! is sent as recorded (the model may be rewritten, and a streamed completions or chat
//! request gets `stream_options.include_usage` so output tokens come from usage). A row
//! without one gets a request built in its API's shape (completions `prompt`; chat
//! `messages`; Responses `input` and `max_output_tokens`; Messages `messages` of content
//! blocks and `max_tokens`; embeddings `input`; rerank `query` and `documents`; score
//! `text_1` and `text_2`) whose prompt is synthesized to the recorded length (see
//! [`crate::prompt`] for how the text is drawn), and whose output length follows
//! `--output-len` (with `ignore_eos` for a fixed length, on every generation API).
//!
//! A Responses turn chained to its parent (`parent_link` = `previous_response`) carries a
//! placeholder for its `previous_response_id` ([`BuiltRequest::parent_id_at`]): the run puts
//! the id the candidate gave its parent there once the parent answered
//! ([`BuiltRequest::set_parent_id`]).
//!
//! What is counted as the prompt's length depends on the endpoint: for completions, the
//! text's tokens plus the special tokens the tokenizer adds (a BOS for Llama 3, none for Qwen
//! or tiktoken) equal `prompt_tokens`; for chat, the **content** of the single user message
//! has exactly `prompt_tokens` tokens. The server's `usage.prompt_tokens` adds its chat
//! template (role markers, BOS, a default system prompt): a few tokens to a few dozen
//! depending on the model (ChatML/Qwen: 9, Llama 3 with its date header: ~25); that overhead
//! is not compensated.

use std::ops::Range;

use bytes::Bytes;
use serde_json::{json, Value};
use trace_format::{ParentLink, TraceRecord};
use wire::api::Api;

use crate::config::{OutputLen, RequestOptions};
use crate::prompt::{filler_prompt, image, stable_hash};

/// What a chained turn's body holds where its parent's response id goes (a JSON string no
/// client sends: it cannot be met elsewhere in a body).
const PARENT_ID_PLACEHOLDER: &str = "\u{0}llmreplay-parent-response-id\u{0}";

/// A request ready to send.
#[derive(Debug, Clone)]
pub struct BuiltRequest {
    /// Path, e.g. `/v1/completions`.
    pub endpoint: String,
    /// The API it speaks (how its answer is read).
    pub api: Api,
    /// Whether the response will be streamed.
    pub stream: bool,
    /// The JSON body.
    pub body: Bytes,
    /// `max_tokens` sent, when known.
    pub max_tokens: Option<i64>,
    /// Where the recorded client cancelled it, to cancel the replayed one at the same point.
    pub cancel: Option<CancelAt>,
    /// What the captured row was, for the outcome taxonomy (`trace_format::cause`).
    pub captured: Captured,
    /// A chained Responses turn: where in `body` its `previous_response_id` goes (the JSON
    /// string there is a placeholder until [`BuiltRequest::set_parent_id`]).
    pub parent_id_at: Option<Range<usize>>,
}

impl BuiltRequest {
    /// Puts the id the candidate gave the parent in the body, as its `previous_response_id`
    /// (a no-op for a request that names no parent).
    pub fn set_parent_id(&mut self, id: &str) {
        let Some(at) = self.parent_id_at.take() else {
            return;
        };
        let id = Value::from(id).to_string();
        let mut b = Vec::with_capacity(self.body.len() + id.len());
        b.extend_from_slice(&self.body[..at.start]);
        b.extend_from_slice(id.as_bytes());
        b.extend_from_slice(&self.body[at.end..]);
        self.body = Bytes::from(b);
    }
}

/// `obj` serialized, with `previous_response_id` set to the placeholder when `chained`:
/// the body and where the placeholder is.
fn serialize(
    mut obj: serde_json::Map<String, Value>,
    chained: bool,
) -> (Bytes, Option<Range<usize>>) {
    if chained {
        obj.insert("previous_response_id".into(), json!(PARENT_ID_PLACEHOLDER));
    }
    let body = serde_json::to_vec(&Value::Object(obj)).expect("JSON values serialize");
    let at = chained
        .then(|| {
            let needle = Value::from(PARENT_ID_PLACEHOLDER).to_string();
            memchr::memmem::find(&body, needle.as_bytes()).map(|i| i..i + needle.len())
        })
        .flatten();
    (Bytes::from(body), at)
}

/// Whether `rec` is a Responses turn that continues its parent's response on the server.
fn chained(rec: &TraceRecord) -> bool {
    rec.parent_link == Some(ParentLink::PreviousResponse) && rec.parent_request_id.is_some()
}

/// What the row a request replays was: its status and outcome, and whether the request sends
/// its recorded body or a synthesized one. Copied into the result row (`captured_status`,
/// `captured_outcome`, `synthesized_body`), so the row says whose its outcome is
/// ([`trace_format::Cause::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Captured {
    /// The captured HTTP status.
    pub status: Option<u16>,
    /// The captured outcome.
    pub outcome: trace_format::Outcome,
    /// Whether the body sent was synthesized (the row had none).
    pub synthesized_body: bool,
}

impl Captured {
    /// What `rec` was, sent with a synthesized body or its own.
    pub fn of(rec: &TraceRecord, synthesized_body: bool) -> Captured {
        Captured {
            status: rec.status,
            outcome: rec.outcome,
            synthesized_body,
        }
    }

    /// Writes it into a result row.
    pub fn fill(&self, row: &mut TraceRecord) {
        row.captured_status = self.status;
        row.captured_outcome = Some(self.outcome);
        row.synthesized_body = Some(self.synthesized_body);
    }
}

/// Where a request the recorded client cancelled is cancelled again: after as many output
/// chunks as the recorded client received, or, when it received none, after the time from
/// send to its cancellation. The candidate then sees the load production saw: the request,
/// and its end at the same point, not a full generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelAt {
    /// Output chunks received before cancelling.
    pub after_chunks: Option<usize>,
    /// Time from send to cancelling.
    pub after: Option<std::time::Duration>,
}

impl CancelAt {
    /// The recorded cancellation point of `rec`, if it was cancelled by its client and the
    /// point is known.
    pub fn of(rec: &TraceRecord) -> Option<CancelAt> {
        if rec.outcome != trace_format::Outcome::ClientCancelled {
            return None;
        }
        if !rec.chunk_times_us.is_empty() {
            return Some(CancelAt {
                after_chunks: Some(rec.chunk_times_us.len()),
                after: None,
            });
        }
        let us = rec.e2el_us.filter(|&u| u >= 0)?;
        Some(CancelAt {
            after_chunks: None,
            after: Some(std::time::Duration::from_micros(us as u64)),
        })
    }
}

/// Builds the request for `rec`. `model` is the name to use when neither `--model` nor the
/// row gives one; `block_size` is the trace's prefix-hash block size.
pub fn build_request(
    rec: &TraceRecord,
    opts: &RequestOptions,
    model: &str,
    block_size: Option<usize>,
) -> Result<BuiltRequest, String> {
    if let Some(body) = &rec.body {
        return Ok(rebuild_recorded(rec, body, opts));
    }
    let prompt_tokens = rec.prompt_tokens.filter(|n| *n >= 0).ok_or_else(|| {
        format!(
            "request {}: no body and no prompt_tokens to build one from",
            rec.request_id
        )
    })?;
    let api = opts.endpoint_for(&rec.endpoint);
    let (max_tokens, ignore_eos) = match opts.output_len {
        // An embeddings, rerank or score request generates nothing.
        _ if !api.generates() => (1, false),
        OutputLen::Fixed(n) => (i64::from(n), true),
        OutputLen::Recorded => (
            rec.output_tokens.or(rec.max_tokens).ok_or_else(|| {
                format!(
                    "request {}: no output_tokens or max_tokens recorded (use --output-len N)",
                    rec.request_id
                )
            })?,
            true,
        ),
        OutputLen::Request => (
            rec.max_tokens.or(rec.output_tokens).ok_or_else(|| {
                format!(
                    "request {}: no max_tokens recorded (use --output-len N)",
                    rec.request_id
                )
            })?,
            false,
        ),
    };
    // A recorded failure with 0 output tokens still sends a request: ask for one token.
    let max_tokens = max_tokens.max(1);
    let prefix = rec.prefix_hashes.as_deref().zip(block_size);
    let images = synthetic_images(rec, api);
    // The recorded prompt tokens counted the images: the text is what is left.
    let image_tokens: u64 = images.iter().map(|i| image::estimated_tokens(i.dims)).sum();
    let prompt_tokens = match image_tokens {
        0 => prompt_tokens,
        t => prompt_tokens.saturating_sub(t as i64).max(1),
    };
    let prompt = synthesize_prompt(opts, api, &rec.request_id, prompt_tokens, prefix)?;
    let model = opts
        .model
        .as_deref()
        .or(rec.model.as_deref())
        .unwrap_or(model);
    // Built requests stream as the row did, unless streaming is turned off.
    let stream = opts.stream && rec.stream && api.generates();
    let mut obj = synthesized_body(api, model, prompt, (max_tokens, ignore_eos), stream);
    add_images(api, &mut obj, &images);
    let (body, parent_id_at) = serialize(obj, api == Api::Responses && chained(rec));
    Ok(BuiltRequest {
        endpoint: api.default_path().to_string(),
        api,
        stream,
        body,
        max_tokens: api.generates().then_some(max_tokens),
        cancel: CancelAt::of(rec),
        captured: Captured::of(rec, true),
        parent_id_at,
    })
}

/// The body of a built request of `api` for `model`, its prompt `prompt`, asking for
/// `max_tokens` (exactly, with `ignore_eos`), streamed or not.
fn synthesized_body(
    api: Api,
    model: &str,
    prompt: String,
    (max_tokens, ignore_eos): (i64, bool),
    stream: bool,
) -> serde_json::Map<String, Value> {
    // The prompt's words in two parts (a query and a document, two texts to score).
    let half = |p: &str| {
        let words: Vec<&str> = p.split(' ').collect();
        let mid = words.len().div_ceil(2);
        match words.split_at(mid) {
            (a, []) => (a.join(" "), a.join(" ")),
            (a, b) => (a.join(" "), b.join(" ")),
        }
    };
    let (mut body, max_key) = match api {
        Api::Completions => (
            json!({ "model": model, "prompt": prompt }),
            Some("max_tokens"),
        ),
        Api::Chat => (
            json!({ "model": model, "messages": [{"role": "user", "content": prompt}] }),
            Some("max_tokens"),
        ),
        Api::Responses => (
            json!({ "model": model, "input": [{"role": "user", "content": prompt}] }),
            Some("max_output_tokens"),
        ),
        Api::Messages => (
            json!({ "model": model, "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}] }),
            Some("max_tokens"),
        ),
        Api::Embeddings => (json!({ "model": model, "input": prompt }), None),
        Api::Rerank => {
            let (q, d) = half(&prompt);
            (
                json!({ "model": model, "query": q, "documents": [d] }),
                None,
            )
        }
        Api::Score => {
            let (a, b) = half(&prompt);
            (json!({ "model": model, "text_1": a, "text_2": b }), None)
        }
    };
    let mut obj = match body.as_object_mut() {
        Some(o) => std::mem::take(o),
        None => serde_json::Map::new(),
    };
    if let Some(k) = max_key {
        obj.insert(k.into(), json!(max_tokens));
        if ignore_eos {
            obj.insert("ignore_eos".into(), json!(true));
        }
        obj.insert("stream".into(), json!(stream));
        // Only completions and chat take `stream_options`; the typed streams end with their
        // usage anyway.
        if stream && !api.typed_events() {
            obj.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    obj
}

/// The synthetic images of a row recorded without its body ([`image`]): as many as it
/// recorded, for an API whose prompts take images (chat, Responses, Messages).
fn synthetic_images(rec: &TraceRecord, api: Api) -> Vec<image::Png> {
    let n = rec.images.filter(|&n| n > 0).unwrap_or(0) as usize;
    if n == 0 || !matches!(api, Api::Chat | Api::Responses | Api::Messages) {
        return Vec::new();
    }
    let seed = stable_hash(rec.session_id.as_deref().unwrap_or(&rec.request_id));
    let bytes = rec.image_bytes.unwrap_or(0).max(0) as u64;
    image::row_images(n, bytes, rec.image_dims.as_deref().unwrap_or(&[]), seed)
}

/// `images` as parts of the (first) user message of a synthesized body, after its text, in
/// `api`'s shape: chat's `image_url`, Responses' `input_image`, Anthropic's base64 `image`.
fn add_images(api: Api, obj: &mut serde_json::Map<String, Value>, images: &[image::Png]) {
    if images.is_empty() {
        return;
    }
    let (list, text_part) = match api {
        Api::Chat => ("messages", "text"),
        Api::Responses => ("input", "input_text"),
        Api::Messages => ("messages", "text"),
        _ => return,
    };
    let Some(msg) = obj
        .get_mut(list)
        .and_then(Value::as_array_mut)
        .and_then(|m| m.first_mut())
    else {
        return;
    };
    let mut parts = match msg.get_mut("content").map(Value::take) {
        Some(Value::String(t)) => vec![json!({"type": text_part, "text": t})],
        Some(Value::Array(p)) => p,
        _ => Vec::new(),
    };
    parts.extend(images.iter().map(|i| match api {
        Api::Chat => json!({"type": "image_url", "image_url": {"url": i.data_url}}),
        Api::Responses => json!({"type": "input_image", "image_url": i.data_url}),
        _ => json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": i.base64()}}),
    }));
    msg["content"] = Value::Array(parts);
}

/// What replay sends for the rows of a trace, as one console note: their recorded bodies
/// (`--record-bodies full`, ShareGPT), or prompts it synthesizes — word filler without a
/// `--tokenizer` (`tokenizer` = None), exact lengths with one — for `n` rows of which
/// `bodies` have a recorded body.
/// None when there is nothing worth saying (no rows; every prompt built with a tokenizer).
pub fn prompt_source_note(n: usize, bodies: usize, tokenizer: Option<&str>) -> Option<String> {
    let synth = n.saturating_sub(bodies);
    let filler = "word filler, so their token lengths on the target are approximate (give --tokenizer for exact ones)";
    match (bodies, synth, tokenizer) {
        (_, _, _) if n == 0 => None,
        (_, 0, t) => Some(format!(
            "note: replaying the recorded bodies of all {n} rows; no prompts are synthesized{}",
            if t.is_some() { " (--tokenizer is not used)" } else { "" }
        )),
        (0, _, None) => Some(format!(
            "note: no --tokenizer: the {n} rows have no recorded body, so their prompts are synthesized as {filler}"
        )),
        (0, _, Some(_)) => None,
        (b, s, t) => Some(format!(
            "note: replaying the recorded bodies of {b} of {n} rows; the {s} rows without a body get synthesized prompts: {}",
            match t {
                None => filler.to_string(),
                Some(t) => format!("their recorded lengths in tokenizer {t}"),
            }
        )),
    }
}

/// The prompt text of a row without a body: `prompt_tokens` long by `opts.tokenizer` (see
/// the module doc for what is counted), or the word filler without a tokenizer. At least one
/// token: an empty prompt is not a request any server accepts.
pub fn synthesize_prompt(
    opts: &RequestOptions,
    api: Api,
    request_id: &str,
    prompt_tokens: i64,
    prefix: Option<(&[u64], usize)>,
) -> Result<String, String> {
    let key = stable_hash(request_id);
    let n = usize::try_from(prompt_tokens.max(1)).unwrap_or(usize::MAX);
    match &opts.tokenizer {
        None => Ok(filler_prompt(opts.prompt_salt, key, n, prefix)),
        Some(pt) => {
            // A completions prompt is the whole input; the other APIs' text goes inside a
            // template that adds its own special tokens.
            let text_tokens = match api {
                Api::Completions => n
                    .saturating_sub(pt.tokenizer().special_tokens_added())
                    .max(1),
                _ => n,
            };
            pt.synthesize(opts.prompt_salt, key, text_tokens, prefix)
                .map_err(|e| format!("request {request_id}: {e}"))
        }
    }
}

fn rebuild_recorded(rec: &TraceRecord, body: &str, opts: &RequestOptions) -> BuiltRequest {
    let endpoint = rec.endpoint.clone();
    let api = Api::of_endpoint(&endpoint).unwrap_or(Api::Chat);
    match serde_json::from_str::<Value>(body) {
        Ok(Value::Object(mut obj)) => {
            if let Some(m) = &opts.model {
                obj.insert("model".into(), json!(m));
            }
            let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
            if stream && !api.typed_events() {
                let so = obj.entry("stream_options").or_insert_with(|| json!({}));
                if let Some(so) = so.as_object_mut() {
                    so.entry("include_usage").or_insert(json!(true));
                }
            }
            let max_tokens = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
                .iter()
                .find_map(|k| obj.get(*k).and_then(Value::as_i64));
            let chained = api == Api::Responses
                && chained(rec)
                && obj
                    .get("previous_response_id")
                    .is_some_and(|v| !v.is_null());
            let (body, parent_id_at) = serialize(obj, chained);
            BuiltRequest {
                endpoint,
                api,
                stream,
                body,
                max_tokens,
                cancel: CancelAt::of(rec),
                captured: Captured::of(rec, false),
                parent_id_at,
            }
        }
        // Not a JSON object: send the recorded bytes untouched; the outcome records the rest.
        _ => BuiltRequest {
            endpoint,
            api,
            stream: rec.stream,
            body: Bytes::from(body.to_string()),
            max_tokens: rec.max_tokens,
            cancel: CancelAt::of(rec),
            captured: Captured::of(rec, false),
            parent_id_at: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::PromptTokenizer;
    use std::sync::Arc;
    use std::time::Duration;

    fn opts() -> RequestOptions {
        RequestOptions {
            endpoint: None,
            model: None,
            output_len: OutputLen::Recorded,
            stream: true,
            prompt_salt: 7,
            tokenizer: None,
            headers: vec![],
            api_key: None,
            timeout: Duration::from_secs(5),
            ca_cert: None,
            connect_timeout: Duration::from_secs(10),
            pool_idle_timeout: Duration::from_secs(4),
            traceparent: true,
        }
    }

    #[test]
    fn built_request_has_recorded_lengths() {
        let mut rec = TraceRecord::new("r1", 0, "/v1/completions");
        rec.stream = true;
        rec.prompt_tokens = Some(12);
        rec.output_tokens = Some(34);
        let b = build_request(&rec, &opts(), "m", None).unwrap();
        let v: Value = serde_json::from_slice(&b.body).unwrap();
        assert_eq!(v["prompt"].as_str().unwrap().split(' ').count(), 12);
        assert_eq!(v["max_tokens"], 34);
        assert_eq!(v["ignore_eos"], true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["model"], "m");
        rec.prompt_tokens = None;
        assert!(build_request(&rec, &opts(), "m", None)
            .unwrap_err()
            .contains("no body"));
    }

    /// A row recorded with images and no body is sent with as many synthetic images of its
    /// sizes, in each API's image part, its text shortened by their estimated tokens; a
    /// completion takes none.
    #[test]
    fn a_row_with_images_sends_synthetic_images_in_its_apis_shape() {
        for (endpoint, list, kind) in [
            ("/v1/chat/completions", "messages", "image_url"),
            ("/v1/responses", "input", "input_image"),
            ("/v1/messages", "messages", "image"),
        ] {
            let mut rec = TraceRecord::new("r1", 0, endpoint);
            rec.prompt_tokens = Some(2_000);
            rec.output_tokens = Some(3);
            rec.images = Some(2);
            rec.image_bytes = Some(60_000);
            rec.image_dims = Some(vec!["560x280".into(), "56x56".into()]);
            let b = build_request(&rec, &opts(), "m", None).unwrap();
            let v: Value = serde_json::from_slice(&b.body).unwrap();
            let parts = v[list][0]["content"].as_array().expect(endpoint);
            let imgs: Vec<&Value> = parts.iter().filter(|p| p["type"] == kind).collect();
            assert_eq!(imgs.len(), 2, "{endpoint}");
            let text: usize = parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .map(|t| t.split(' ').count())
                .sum();
            // 560x280 is 20x10 tiles, 56x56 2x2: 204 tokens off 2,000.
            assert_eq!(text, 2_000 - 204, "{endpoint}");
            let data = match kind {
                "image_url" => imgs[0]["image_url"]["url"].as_str().unwrap(),
                "input_image" => imgs[0]["image_url"].as_str().unwrap(),
                _ => imgs[0]["source"]["data"].as_str().unwrap(),
            };
            assert!(
                data.len() > 30_000,
                "{endpoint}: {} base64 bytes",
                data.len()
            );
        }
        let mut rec = TraceRecord::new("r1", 0, "/v1/completions");
        rec.prompt_tokens = Some(10);
        rec.output_tokens = Some(3);
        rec.images = Some(1);
        let b = build_request(&rec, &opts(), "m", None).unwrap();
        let v: Value = serde_json::from_slice(&b.body).unwrap();
        assert_eq!(v["prompt"].as_str().unwrap().split(' ').count(), 10);
    }

    /// Lengths from 1 to 100,000 tokens: small ones densely, block edges, and a few large.
    const LENGTHS: &[usize] = &[
        1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 64, 100, 255, 511, 512, 513, 1000, 1023, 2048, 4097,
        8191, 12_345, 31_999, 65_536, 100_000,
    ];

    fn check_exact(pt: &Arc<PromptTokenizer>, lengths: &[usize]) {
        let tok = pt.tokenizer();
        let started = std::time::Instant::now();
        let mut total = 0;
        for (i, &n) in lengths.iter().enumerate() {
            // Alternate rows with and without prefix hashes (16- and 512-token blocks).
            let hashes: Vec<u64> = (0..(n / 16 + 1) as u64)
                .map(|h| h * 7 + i as u64 % 3)
                .collect();
            let prefix = match i % 3 {
                0 => None,
                1 => Some((&hashes[..], 16)),
                _ => Some((&hashes[..], 512)),
            };
            let mut rec = TraceRecord::new(format!("r{i}"), 0, "/v1/completions");
            rec.prompt_tokens = Some(n as i64);
            rec.output_tokens = Some(1);
            rec.prefix_hashes = prefix.map(|(h, _)| h.to_vec());
            let mut o = opts();
            o.tokenizer = Some(pt.clone());
            let b = build_request(&rec, &o, "m", prefix.map(|(_, b)| b)).unwrap();
            let v: Value = serde_json::from_slice(&b.body).unwrap();
            let prompt = v["prompt"].as_str().unwrap();
            assert_eq!(
                tok.encode_with_special(prompt).unwrap().len(),
                n,
                "{}: prompt for {n} tokens",
                tok.name()
            );
            // Every pool word is one token and one whitespace word: the sim agrees.
            assert_eq!(
                prompt.split_whitespace().count(),
                n,
                "{}: words",
                tok.name()
            );
            total += n;
        }
        eprintln!(
            "{}: {} prompts, {total} tokens synthesized and verified in {:?}",
            tok.name(),
            lengths.len(),
            started.elapsed()
        );
    }

    #[test]
    fn synthesized_prompts_have_exact_length_with_cl100k_and_o200k() {
        for name in ["cl100k_base", "o200k_base"] {
            let pt = Arc::new(PromptTokenizer::load(name).unwrap());
            assert!(pt.is_separable(), "{pt:?}");
            assert!(pt.pool_len() >= 200, "{pt:?}");
            check_exact(&pt, LENGTHS);
        }
    }

    #[test]
    fn synthesized_prompts_have_exact_length_with_a_tokenizer_json() {
        let Some(p) = tokenize::test_tokenizer_json("qwen3") else {
            return;
        };
        let pt = Arc::new(PromptTokenizer::load(p.to_str().unwrap()).unwrap());
        assert!(pt.is_separable(), "{pt:?}");
        check_exact(&pt, LENGTHS);
    }

    #[test]
    fn words_tokenizer_synthesis_is_exact_too() {
        let pt = Arc::new(PromptTokenizer::load("words").unwrap());
        check_exact(&pt, &LENGTHS[..20]);
    }

    #[test]
    fn chat_content_is_exact_and_synthesis_is_deterministic() {
        let pt = Arc::new(PromptTokenizer::load("cl100k_base").unwrap());
        let mut rec = TraceRecord::new("chat-1", 0, "/v1/chat/completions");
        rec.prompt_tokens = Some(300);
        rec.output_tokens = Some(5);
        let mut o = opts();
        o.endpoint = Some(crate::config::EndpointKind::Chat);
        o.tokenizer = Some(pt.clone());
        let b1 = build_request(&rec, &o, "m", None).unwrap();
        let b2 = build_request(&rec, &o, "m", None).unwrap();
        assert_eq!(b1.body, b2.body);
        let v: Value = serde_json::from_slice(&b1.body).unwrap();
        let content = v["messages"][0]["content"].as_str().unwrap();
        assert_eq!(pt.tokenizer().count(content).unwrap(), 300);
        // A 0-token row still sends one token.
        rec.prompt_tokens = Some(0);
        let v: Value =
            serde_json::from_slice(&build_request(&rec, &o, "m", None).unwrap().body).unwrap();
        assert_eq!(
            pt.tokenizer()
                .count(v["messages"][0]["content"].as_str().unwrap())
                .unwrap(),
            1
        );
    }

    #[test]
    fn recorded_body_is_kept_with_model_rewrite_and_usage() {
        let mut rec = TraceRecord::new("r1", 0, "/v1/chat/completions");
        rec.body = Some(r#"{"model":"a","messages":[{"role":"user","content":"hi"}],"stream":true,"temperature":0.5}"#.into());
        let mut o = opts();
        o.model = Some("b".into());
        let b = build_request(&rec, &o, "m", None).unwrap();
        let v: Value = serde_json::from_slice(&b.body).unwrap();
        assert_eq!(
            (v["model"].as_str(), v["temperature"].as_f64()),
            (Some("b"), Some(0.5))
        );
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert!(b.stream);
        rec.body = Some("not json".into());
        assert_eq!(
            &build_request(&rec, &o, "m", None).unwrap().body[..],
            b"not json"
        );
    }
}
