//! One row as one OTLP span, with the GenAI semantic conventions (v1.41, see the crate doc).

use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span, status, Span, Status};
use trace_format::tracectx::{self, TraceContext};
use trace_format::{Outcome, TraceRecord};

/// Attribute names (the conventions', and ours under `llmreplay.`).
pub mod attr {
    /// `chat` or `text_completion`.
    pub const OPERATION: &str = "gen_ai.operation.name";
    /// The model asked for.
    pub const REQUEST_MODEL: &str = "gen_ai.request.model";
    /// `max_tokens` asked for.
    pub const REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
    /// Prompt tokens.
    pub const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    /// Output tokens.
    pub const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    /// Time to the first chunk, seconds (streamed responses).
    pub const TTFC: &str = "gen_ai.response.time_to_first_chunk";
    /// The server's host.
    pub const SERVER_ADDRESS: &str = "server.address";
    /// The server's port.
    pub const SERVER_PORT: &str = "server.port";
    /// HTTP status.
    pub const HTTP_STATUS: &str = "http.response.status_code";
    /// On failures: the status code (HTTP errors) or the outcome.
    pub const ERROR_TYPE: &str = "error.type";
    /// The row's request id.
    pub const REQUEST_ID: &str = "llmreplay.request_id";
    /// The row's endpoint (the operation name does not tell chat completions, Responses and
    /// Messages apart).
    pub const ENDPOINT: &str = "llmreplay.endpoint";
    /// The row's outcome.
    pub const OUTCOME: &str = "llmreplay.outcome";
    /// Replay: the run id.
    pub const RUN_ID: &str = "llmreplay.run_id";
    /// Replay: the target's name.
    pub const TARGET: &str = "llmreplay.target";
    /// Whether the response was streamed.
    pub const STREAM: &str = "llmreplay.stream";
    /// Replay: the client's own delay, µs.
    pub const DISPATCH_LAG_US: &str = "llmreplay.dispatch_lag_us";
    /// Chunks received (events are kept up to a cap).
    pub const CHUNKS: &str = "llmreplay.chunks";
    /// Per-chunk event name.
    pub const CHUNK_EVENT: &str = "llmreplay.chunk";
    /// Per-chunk event: tokens in the chunk, when known.
    pub const CHUNK_TOKENS: &str = "llmreplay.chunk.tokens";
}

/// Where the requests went: `server.address` and `server.port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Host.
    pub address: String,
    /// Port.
    pub port: u16,
}

impl Server {
    /// From a base URL (`http://host:port/...`); `None` when it names no host.
    pub fn from_url(url: &str) -> Option<Server> {
        let o = wire::origin::Origin::parse(url).ok()?;
        Some(Server {
            address: o.host,
            port: o.port,
        })
    }
}

/// The `gen_ai.operation.name` of an endpoint: `chat` (chat completions, Responses,
/// Anthropic Messages), `embeddings`, `rerank`, `score`, else `text_completion`.
pub fn operation(endpoint: &str) -> &'static str {
    use wire::api::Api;
    match Api::of_endpoint(endpoint) {
        Some(Api::Chat | Api::Responses | Api::Messages) => "chat",
        Some(Api::Embeddings) => "embeddings",
        Some(Api::Rerank) => "rerank",
        Some(Api::Score) => "score",
        Some(Api::Completions) | None => "text_completion",
    }
}

/// The `error.type` of a failed row: its status for an HTTP error, else its outcome.
pub fn error_type(rec: &TraceRecord) -> Option<String> {
    match rec.outcome {
        Outcome::Ok => None,
        Outcome::HttpError => Some(
            rec.status
                .map_or_else(|| "http_error".into(), |s| s.to_string()),
        ),
        o => Some(o.as_str().to_string()),
    }
}

fn kv(key: &str, v: Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

fn s(key: &str, v: impl Into<String>) -> KeyValue {
    kv(key, Value::StringValue(v.into()))
}

fn i(key: &str, v: i64) -> KeyValue {
    kv(key, Value::IntValue(v))
}

/// Whose span the row's `span_id` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanId {
    /// Ours: the span exported is the one the upstream's span is a child of (replay; capture
    /// when it started the trace).
    Own,
    /// The client's (capture forwarded its `traceparent` unchanged): the span exported gets
    /// an id of its own and is the client span's child, a sibling of the server's.
    Parent,
}

/// The span of `rec` (`None` for a row without a trace id: no `traceparent` was sent, so no
/// server span could join it either). At most `max_events` per-chunk events.
pub fn row_span(
    rec: &TraceRecord,
    whose: SpanId,
    server: Option<&Server>,
    max_events: usize,
) -> Option<Span> {
    let trace_id = tracectx::hex::<16>(rec.trace_id.as_deref()?)?;
    let row_span = rec.span_id.as_deref().and_then(tracectx::hex::<8>);
    let (span_id, parent) = match (whose, row_span) {
        (SpanId::Own, Some(id)) => (id, Vec::new()),
        (SpanId::Parent, Some(p)) => (
            TraceContext::derive(rec.trace_id.as_deref()?, &rec.request_id).span_id,
            p.to_vec(),
        ),
        (_, None) => (
            TraceContext::derive(rec.trace_id.as_deref()?, &rec.request_id).span_id,
            Vec::new(),
        ),
    };
    let op = operation(&rec.endpoint);
    let model = rec.model.as_deref().unwrap_or("");
    let start_ns = (rec.arrival_time_us.max(0) as u64).saturating_mul(1_000);
    let at = |us: i64| start_ns.saturating_add((us.max(0) as u64).saturating_mul(1_000));
    let end_ns = at(rec.e2el_us.unwrap_or(0));

    let mut a = vec![s(attr::OPERATION, op)];
    if !model.is_empty() {
        a.push(s(attr::REQUEST_MODEL, model));
    }
    if let Some(m) = rec.max_tokens {
        a.push(i(attr::REQUEST_MAX_TOKENS, m));
    }
    if let Some(n) = rec.prompt_tokens {
        a.push(i(attr::INPUT_TOKENS, n));
    }
    if let Some(n) = rec.output_tokens {
        a.push(i(attr::OUTPUT_TOKENS, n));
    }
    if let Some(t) = rec.ttft_us.filter(|_| rec.stream) {
        a.push(kv(attr::TTFC, Value::DoubleValue(t as f64 / 1e6)));
    }
    if let Some(sv) = server {
        a.push(s(attr::SERVER_ADDRESS, sv.address.as_str()));
        a.push(i(attr::SERVER_PORT, i64::from(sv.port)));
    }
    if let Some(st) = rec.status {
        a.push(i(attr::HTTP_STATUS, i64::from(st)));
    }
    let err = error_type(rec);
    if let Some(e) = &err {
        a.push(s(attr::ERROR_TYPE, e.as_str()));
    }
    a.push(s(attr::REQUEST_ID, rec.request_id.as_str()));
    a.push(s(attr::ENDPOINT, rec.endpoint.as_str()));
    a.push(s(attr::OUTCOME, rec.outcome.as_str()));
    a.push(kv(attr::STREAM, Value::BoolValue(rec.stream)));
    if let Some(r) = &rec.run_id {
        a.push(s(attr::RUN_ID, r.as_str()));
    }
    if let Some(t) = &rec.target {
        a.push(s(attr::TARGET, t.as_str()));
    }
    if let Some(l) = rec.dispatch_lag_us {
        a.push(i(attr::DISPATCH_LAG_US, l));
    }
    a.push(i(attr::CHUNKS, rec.chunk_times_us.len() as i64));

    let events: Vec<span::Event> = rec
        .chunk_times_us
        .iter()
        .take(max_events)
        .enumerate()
        .map(|(n, &t)| {
            let mut ea = Vec::new();
            if let Some(k) = rec.chunk_tokens.as_ref().and_then(|v| v.get(n)) {
                ea.push(i(attr::CHUNK_TOKENS, i64::from(*k)));
            }
            span::Event {
                time_unix_nano: at(t),
                name: attr::CHUNK_EVENT.to_string(),
                attributes: ea,
                dropped_attributes_count: 0,
            }
        })
        .collect();
    let status = match &err {
        None => Status {
            code: status::StatusCode::Ok as i32,
            message: String::new(),
        },
        Some(e) => Status {
            code: status::StatusCode::Error as i32,
            message: rec.error.clone().unwrap_or_else(|| e.clone()),
        },
    };
    Some(Span {
        trace_id: trace_id.to_vec(),
        span_id: span_id.to_vec(),
        parent_span_id: parent,
        flags: 0x100 | u32::from(whose == SpanId::Parent) << 9,
        name: if model.is_empty() {
            op.to_string()
        } else {
            format!("{op} {model}")
        },
        kind: span::SpanKind::Client as i32,
        start_time_unix_nano: start_ns,
        end_time_unix_nano: end_ns,
        attributes: a,
        dropped_events_count: rec.chunk_times_us.len().saturating_sub(max_events) as u32,
        events,
        status: Some(status),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_api_has_its_operation_name() {
        for (endpoint, op) in [
            ("/v1/chat/completions", "chat"),
            ("/v1/responses", "chat"),
            ("/v1/messages", "chat"),
            ("/v1/completions", "text_completion"),
            ("/v1/embeddings", "embeddings"),
            ("/v1/rerank", "rerank"),
            ("/score", "score"),
        ] {
            assert_eq!(operation(endpoint), op, "{endpoint}");
        }
    }

    fn row() -> TraceRecord {
        let mut r = TraceRecord::new("r1", 1_700_000_000_000_000, "/v1/chat/completions");
        r.model = Some("m".into());
        r.stream = true;
        r.prompt_tokens = Some(12);
        r.output_tokens = Some(3);
        r.status = Some(200);
        r.ttft_us = Some(25_000);
        r.e2el_us = Some(90_000);
        r.chunk_times_us = vec![25_000, 50_000, 90_000];
        r.chunk_tokens = Some(vec![1, 1, 1]);
        TraceContext::derive("run", "r1").fill(&mut r);
        r
    }

    fn get<'a>(sp: &'a Span, key: &str) -> Option<&'a Value> {
        sp.attributes
            .iter()
            .find(|k| k.key == key)
            .and_then(|k| k.value.as_ref()?.value.as_ref())
    }

    #[test]
    fn a_row_is_one_client_span_with_the_genai_attributes() {
        let r = row();
        let sv = Server::from_url("http://127.0.0.1:8000/v1").unwrap();
        let sp = row_span(&r, SpanId::Own, Some(&sv), 2).unwrap();
        assert_eq!(sp.name, "chat m");
        assert_eq!(sp.kind, span::SpanKind::Client as i32);
        assert_eq!(tracectx::to_hex(&sp.trace_id), r.trace_id.clone().unwrap());
        assert_eq!(tracectx::to_hex(&sp.span_id), r.span_id.clone().unwrap());
        assert!(sp.parent_span_id.is_empty());
        assert_eq!(sp.end_time_unix_nano - sp.start_time_unix_nano, 90_000_000);
        assert_eq!(get(&sp, attr::INPUT_TOKENS), Some(&Value::IntValue(12)));
        assert_eq!(get(&sp, attr::OUTPUT_TOKENS), Some(&Value::IntValue(3)));
        assert_eq!(get(&sp, attr::TTFC), Some(&Value::DoubleValue(0.025)));
        assert_eq!(
            get(&sp, attr::SERVER_ADDRESS),
            Some(&Value::StringValue("127.0.0.1".into()))
        );
        assert_eq!(get(&sp, attr::SERVER_PORT), Some(&Value::IntValue(8000)));
        assert_eq!(get(&sp, attr::ERROR_TYPE), None);
        assert_eq!((sp.events.len(), sp.dropped_events_count), (2, 1));
        assert_eq!(
            sp.events[1].time_unix_nano - sp.start_time_unix_nano,
            50_000_000
        );
    }

    /// Capture forwarded the client's context: the span is the client span's child, with an
    /// id of its own; a failure says its type and the status is an error.
    #[test]
    fn a_forwarded_context_makes_a_child_span_and_failures_say_why() {
        let mut r = row();
        r.endpoint = "/v1/completions".into();
        r.outcome = Outcome::HttpError;
        r.status = Some(503);
        r.error = Some("overloaded".into());
        let sp = row_span(&r, SpanId::Parent, None, 0).unwrap();
        assert_eq!(sp.name, "text_completion m");
        assert_eq!(
            tracectx::to_hex(&sp.parent_span_id),
            r.span_id.clone().unwrap()
        );
        assert_ne!(sp.span_id, sp.parent_span_id);
        assert_eq!(
            get(&sp, attr::ERROR_TYPE),
            Some(&Value::StringValue("503".into()))
        );
        let st = sp.status.unwrap();
        assert_eq!((st.code, st.message.as_str()), (2, "overloaded"));
        r.trace_id = None;
        assert!(row_span(&r, SpanId::Own, None, 0).is_none());
    }
}
