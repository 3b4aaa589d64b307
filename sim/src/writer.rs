//! The writer of one answer, in its API's shape: completions and chat chunks
//! ([`Formatter`]), Responses and Messages events ([`Typed`]), pooling answers whole.

use std::collections::VecDeque;

use bytes::Bytes;
use serde_json::json;
use wire::api::Api;

use crate::engine_metrics::FinishReason;
use crate::openai::Formatter;
use crate::output::Gen;
use crate::tokens::mix;
use crate::typed::Typed;

/// The writer of one answer, in its API's shape.
pub(crate) enum Writer {
    /// Completions and chat: `data:` chunks ended by `[DONE]`.
    Chunks(Formatter),
    /// Responses and Messages: typed events.
    Typed(Box<Typed>),
    /// Embeddings, rerank, score: answered whole; `entries` answered.
    Pooled { g: Gen, entries: u32 },
}

impl Writer {
    /// The events that open a stream, before any output.
    pub(crate) fn start(&mut self, q: &mut VecDeque<Bytes>) {
        if let Writer::Typed(t) = self {
            t.start(q);
        }
    }

    /// The events of output tokens `from..to` of a response of at most `n` tokens (`first`:
    /// the stream's first; `finish`: its last, ended so).
    pub(crate) fn tokens(
        &mut self,
        q: &mut VecDeque<Bytes>,
        range: (u32, u32),
        (first, finish): (bool, Option<FinishReason>),
        n: u32,
    ) {
        match self {
            Writer::Chunks(f) => f.tokens(q, range, first, finish),
            Writer::Typed(t) => t.tokens(q, range, n),
            Writer::Pooled { .. } => {}
        }
    }

    /// The events that end a stream of `n` output tokens.
    pub(crate) fn end(&mut self, q: &mut VecDeque<Bytes>, n: u32, finish: FinishReason) {
        match self {
            Writer::Chunks(f) => f.end(q, n),
            Writer::Typed(t) => t.end(q, n, finish),
            Writer::Pooled { .. } => {}
        }
    }

    /// The whole answer of `n` output tokens.
    pub(crate) fn whole(&mut self, n: u32, finish: FinishReason) -> Bytes {
        match self {
            Writer::Chunks(f) => f.full_response(n, finish),
            Writer::Typed(t) => t.whole(n, finish),
            Writer::Pooled { g, entries } => pooled(g, *entries),
        }
    }
}

/// Dimensions of the sim's embeddings.
const EMBEDDING_DIMS: u64 = 8;

/// The whole answer of a pooling request of `entries` entries: embeddings (`data` of
/// vectors), rerank (`results` by relevance), score (`data` of scores), each with `usage`.
fn pooled(g: &Gen, entries: u32) -> Bytes {
    let draw = |i: u64, j: u64| (mix(g.text_start ^ mix(i) ^ j) >> 11) as f64 / (1u64 << 53) as f64;
    let usage = json!({"prompt_tokens": g.prompt_tokens, "total_tokens": g.prompt_tokens});
    let n = u64::from(entries.max(1));
    let v = match g.api {
        Api::Rerank => {
            let mut results: Vec<(u64, f64)> = (0..n).map(|i| (i, draw(i, 0))).collect();
            results.sort_by(|a, b| b.1.total_cmp(&a.1));
            json!({
                "id": g.id, "model": g.model, "usage": {"total_tokens": g.prompt_tokens},
                "results": results.iter().map(|(i, s)| json!({"index": i, "relevance_score": s})).collect::<Vec<_>>(),
            })
        }
        Api::Score => json!({
            "id": g.id, "object": "list", "created": g.created, "model": g.model, "usage": usage,
            "data": (0..n).map(|i| json!({"index": i, "object": "score", "score": draw(i, 0)})).collect::<Vec<_>>(),
        }),
        _ => json!({
            "id": g.id, "object": "list", "created": g.created, "model": g.model, "usage": usage,
            "data": (0..n).map(|i| json!({
                "index": i, "object": "embedding",
                "embedding": (0..EMBEDDING_DIMS).map(|j| draw(i, j) * 2.0 - 1.0).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }),
    };
    Bytes::from(v.to_string())
}
