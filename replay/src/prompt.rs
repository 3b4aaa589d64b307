//! Building the request a trace row stands for.
//!
//! A row with a recorded body is sent as recorded (the model may be rewritten, and a
//! streamed request gets `stream_options.include_usage` so output tokens come from usage).
//! A row without one gets a built completions or chat request whose prompt is a
//! deterministic filler of the recorded length in words, and whose `max_tokens` follows
//! `--output-len`.
//!
//! The filler is a sequence of common English words, each one token for the sim (which
//! counts words) and close to one token for BPE tokenizers; exact-length synthesis for a
//! real tokenizer belongs to the tokens work. It is deterministic for (salt, request id):
//! where the row has `prefix_hashes`, each block's words derive from (salt, block hash) only,
//! so equal hashes give equal text and a candidate's prefix cache sees production's sharing;
//! the rest derives from (salt, request id), so unrelated requests share nothing.

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use trace_format::TraceRecord;

use crate::config::{EndpointKind, OutputLen, RequestOptions};

/// Common English words; each is a single token (with its leading space) in the usual BPE
/// vocabularies.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "she", "other", "its", "may",
    "these", "what", "them", "than", "some", "him", "time", "into", "only", "do", "could", "new",
    "about", "two", "first", "then", "also", "any", "like", "our", "my", "said", "over", "such",
    "us", "made", "many", "after", "most", "should", "out", "way", "even", "each", "very", "well",
    "those", "work", "life", "just", "where", "people", "before", "through", "good", "much", "how",
    "state", "year", "world", "great", "still", "part", "long", "same", "back", "day", "might",
    "own", "under", "never", "being", "last", "water", "house", "light", "school", "small",
    "order", "point", "place", "line", "city", "power", "group", "number", "money", "system",
    "market", "music", "paper", "field", "table", "river", "story", "model", "plant", "road",
    "color", "heart", "board", "stone",
];

/// A stable 64-bit hash (FNV-1a) of text, the same on every machine and run.
pub fn stable_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn mix(a: u64, b: u64) -> u64 {
    // splitmix64 of the pair.
    let mut z = a ^ b.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn push_words(out: &mut String, key: u64, n: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(key);
    for _ in 0..n {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
    }
}

/// A filler prompt of exactly `words` words (see the module doc).
pub fn filler_prompt(
    salt: u64,
    request_key: u64,
    words: usize,
    prefix: Option<(&[u64], usize)>,
) -> String {
    let mut out = String::with_capacity(words * 6);
    let mut written = 0;
    if let Some((hashes, block)) = prefix {
        if block > 0 {
            for h in hashes {
                if written >= words {
                    break;
                }
                let n = block.min(words - written);
                push_words(&mut out, mix(salt, mix(*h, 0x5eed)), n);
                written += n;
            }
        }
    }
    push_words(&mut out, mix(salt, request_key), words - written);
    out
}

/// A request ready to send.
#[derive(Debug, Clone)]
pub struct BuiltRequest {
    /// Path, e.g. `/v1/completions`.
    pub endpoint: String,
    /// Whether the response will be streamed.
    pub stream: bool,
    /// The JSON body.
    pub body: Bytes,
    /// `max_tokens` sent, when known.
    pub max_tokens: Option<i64>,
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
    let (max_tokens, ignore_eos) = match opts.output_len {
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
    let prompt = filler_prompt(
        opts.prompt_salt,
        stable_hash(&rec.request_id),
        prompt_tokens.max(1) as usize,
        prefix,
    );
    let model = opts
        .model
        .as_deref()
        .or(rec.model.as_deref())
        .unwrap_or(model);
    let endpoint = opts.endpoint;
    let mut body = match endpoint {
        EndpointKind::Completions => json!({ "model": model, "prompt": prompt }),
        EndpointKind::Chat => {
            json!({ "model": model, "messages": [{"role": "user", "content": prompt}] })
        }
    };
    let obj = body.as_object_mut().expect("built as an object");
    obj.insert("max_tokens".into(), json!(max_tokens));
    if ignore_eos {
        obj.insert("ignore_eos".into(), json!(true));
    }
    // Built requests stream as the row did, unless streaming is turned off.
    let stream = opts.stream && rec.stream;
    obj.insert("stream".into(), json!(stream));
    if stream {
        obj.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(BuiltRequest {
        endpoint: endpoint.path().to_string(),
        stream,
        body: Bytes::from(serde_json::to_vec(&body).expect("JSON values serialize")),
        max_tokens: Some(max_tokens),
    })
}

fn rebuild_recorded(rec: &TraceRecord, body: &str, opts: &RequestOptions) -> BuiltRequest {
    let endpoint = rec.endpoint.clone();
    match serde_json::from_str::<Value>(body) {
        Ok(Value::Object(mut obj)) => {
            if let Some(m) = &opts.model {
                obj.insert("model".into(), json!(m));
            }
            let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
            if stream {
                let so = obj.entry("stream_options").or_insert_with(|| json!({}));
                if let Some(so) = so.as_object_mut() {
                    so.entry("include_usage").or_insert(json!(true));
                }
            }
            let max_tokens = obj
                .get("max_tokens")
                .or_else(|| obj.get("max_completion_tokens"))
                .and_then(Value::as_i64);
            BuiltRequest {
                endpoint,
                stream,
                body: Bytes::from(
                    serde_json::to_vec(&Value::Object(obj)).expect("JSON values serialize"),
                ),
                max_tokens,
            }
        }
        // Not a JSON object: send the recorded bytes untouched; the outcome records the rest.
        _ => BuiltRequest {
            endpoint,
            stream: rec.stream,
            body: Bytes::from(body.to_string()),
            max_tokens: rec.max_tokens,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn opts() -> RequestOptions {
        RequestOptions {
            endpoint: EndpointKind::Completions,
            model: None,
            output_len: OutputLen::Recorded,
            stream: true,
            prompt_salt: 7,
            headers: vec![],
            api_key: None,
            timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn filler_has_exact_word_count_and_is_deterministic() {
        for n in [0usize, 1, 2, 17, 1000] {
            let p = filler_prompt(1, 2, n, None);
            assert_eq!(p.split_whitespace().count(), n);
            assert_eq!(p, filler_prompt(1, 2, n, None));
        }
        assert_ne!(
            filler_prompt(1, 2, 50, None),
            filler_prompt(2, 2, 50, None),
            "salt changes text"
        );
        assert_ne!(filler_prompt(1, 2, 50, None), filler_prompt(1, 3, 50, None));
    }

    #[test]
    fn equal_block_hashes_share_text_and_differ_after() {
        let a = filler_prompt(9, 100, 40, Some((&[1, 2, 3], 10)));
        let b = filler_prompt(9, 200, 40, Some((&[1, 2, 4], 10)));
        let wa: Vec<&str> = a.split(' ').collect();
        let wb: Vec<&str> = b.split(' ').collect();
        assert_eq!(wa.len(), 40);
        assert_eq!(wa[..20], wb[..20]);
        assert_ne!(wa[20..30], wb[20..30]);
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
