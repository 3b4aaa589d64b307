//! OpenTelemetry GenAI spans, as OTLP/JSON lines: each line one `TracesData` object
//! (`{"resourceSpans": [{"scopeSpans": [{"spans": [...]}]}]}`), as the OpenTelemetry
//! Collector's file exporter writes what it receives — from `llmreplay replay` or `capture`
//! with `--otlp-endpoint`, or from any client instrumented with the GenAI semantic conventions.
//!
//! A span whose `gen_ai.operation.name` is an inference (`chat`, `text_completion`,
//! `generate_content`, `embeddings`, and llmreplay's `rerank`, `score`) is one request, id its
//! `llmreplay.request_id`, else `<prefix>:<line>.<n>` (the n-th span of the line): arriving at
//! `startTimeUnixNano`, its end-to-end latency `endTimeUnixNano − startTimeUnixNano` (unknown
//! when the span has no duration: llmreplay's exporter ends a span that never ended at its
//! start), `gen_ai.request.model` (else `gen_ai.response.model`), `gen_ai.request.max_tokens`,
//! `gen_ai.usage.input_tokens` and `output_tokens`, `gen_ai.response.time_to_first_chunk`
//! (s) as TTFT, `http.response.status_code`, the trace id and span id (the parent's when the
//! parent is remote: a span exported for a client's own span). The outcome is
//! `llmreplay.outcome`, else from the span's status (error: an HTTP error when `error.type` is
//! a status code, else an upstream error), with the status message as the error. llmreplay's
//! own attributes give back the rest of what its exporter writes: `llmreplay.endpoint`,
//! `llmreplay.stream`, `llmreplay.run_id`, `llmreplay.target`, `llmreplay.dispatch_lag_us`,
//! and the `llmreplay.chunk` events (chunk times and tokens; none when the exporter dropped
//! some). Without `llmreplay.endpoint` the endpoint is the operation's (`chat` →
//! `/v1/chat/completions`, `text_completion` → `/v1/completions`, ...), and streaming is
//! assumed.
//!
//! Other spans (agents, tools, HTTP) are not requests: they are counted. Incomplete spans
//! import with what they have, the rest counted; a malformed one (a time or id that is not
//! one, an attribute of the wrong type) is an error naming the file, line and field.
//!
//! Not mapped: resource and scope attributes, `server.address` and `server.port`, links,
//! sessions and parents (the conventions carry none between requests).

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

use serde_json::Value;
use telemetry::span::attr;
use trace_format::{Outcome, Result, TokenSource, TraceRecord};

use crate::out::Out;
use crate::rows::{jsonl_rows, Fields};

/// The endpoint of a request span without `llmreplay.endpoint`, by operation; `None` for
/// spans that are not requests.
fn endpoint_of(operation: &str) -> Option<&'static str> {
    Some(match operation {
        "chat" | "generate_content" => "/v1/chat/completions",
        "text_completion" => "/v1/completions",
        "embeddings" => "/v1/embeddings",
        "rerank" => "/v1/rerank",
        "score" => "/score",
        _ => return None,
    })
}

/// What the lines held besides requests.
#[derive(Default)]
struct Tally {
    other_spans: usize,
    unknown: Vec<&'static str>,
}

/// Reads OTLP/JSON trace lines.
pub(crate) fn import(path: &Path, id_prefix: &str, out: &mut Out<'_>) -> Result<()> {
    let mut t = Tally::default();
    jsonl_rows(path, out, |row, rows| {
        let f = Fields::of(row);
        let mut n = 0;
        for (i, rs) in f.array("resourceSpans")?.iter().enumerate() {
            let rs = f.element("resourceSpans", i, rs)?;
            if rs.get("scopeSpans").is_none() {
                continue;
            }
            for (j, ss) in rs.array("scopeSpans")?.iter().enumerate() {
                let ss = rs.element("scopeSpans", j, ss)?;
                if ss.get("spans").is_none() {
                    continue;
                }
                for (k, sp) in ss.array("spans")?.iter().enumerate() {
                    n += 1;
                    let id = format!("{id_prefix}:{}.{n}", row.at.line);
                    match request(&ss.element("spans", k, sp)?, id, &mut t)? {
                        Some(r) => rows.push(r),
                        None => t.other_spans += 1,
                    }
                }
            }
        }
        Ok(())
    })?;
    for field in t.unknown {
        out.unknown(field);
    }
    if t.other_spans > 0 {
        out.stats.notes.push(format!(
            "{} spans that are not GenAI inference requests (agents, tools, HTTP) passed over",
            t.other_spans
        ));
    }
    Ok(())
}

/// A span's attributes, typed, each error naming the span and the attribute.
struct Attrs<'a> {
    span: &'a Fields<'a>,
    by_key: HashMap<&'a str, &'a Value>,
}

impl<'a> Attrs<'a> {
    /// The `attributes` of `f` (a span or an event): `[{"key", "value": {"<type>Value": v}}]`.
    fn of(f: &'a Fields<'a>) -> Result<Attrs<'a>> {
        let mut by_key = HashMap::new();
        if f.get("attributes").is_some() {
            for (i, kv) in f.array("attributes")?.iter().enumerate() {
                let kv = f.element("attributes", i, kv)?;
                let key = kv.obj.get("key").and_then(Value::as_str);
                let key = key.ok_or_else(|| kv.bad("key", "missing or not a string"))?;
                if let Some(v) = kv.obj.get("value").and_then(Value::as_object) {
                    if let Some((_, v)) = v.iter().next() {
                        by_key.insert(key, v);
                    }
                }
            }
        }
        Ok(Attrs { span: f, by_key })
    }

    fn bad(&self, key: &str, v: &Value, what: &str) -> trace_format::Error {
        self.span
            .bad(&format!("attributes[{key}]"), format!("{v} is not {what}"))
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>> {
        self.by_key
            .get(key)
            .map(|v| v.as_str().ok_or_else(|| self.bad(key, v, "a string")))
            .transpose()
    }

    /// An integer (OTLP/JSON writes int64 as a string; a number is accepted).
    fn int(&self, key: &str) -> Result<Option<i64>> {
        self.by_key
            .get(key)
            .map(|v| {
                v.as_i64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                    .ok_or_else(|| self.bad(key, v, "an integer"))
            })
            .transpose()
    }

    fn count(&self, key: &str) -> Result<Option<i64>> {
        match self.int(key)? {
            Some(n) if n < 0 => Err(self.bad(key, &Value::from(n), "a non-negative integer")),
            n => Ok(n),
        }
    }

    fn f64(&self, key: &str) -> Result<Option<f64>> {
        self.by_key
            .get(key)
            .map(|v| {
                v.as_f64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                    .filter(|x: &f64| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| self.bad(key, v, "a non-negative number"))
            })
            .transpose()
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.by_key
            .get(key)
            .map(|v| v.as_bool().ok_or_else(|| self.bad(key, v, "a boolean")))
            .transpose()
    }
}

/// A time in ns since the epoch (a string, as OTLP/JSON writes uint64, or a number).
fn nanos(f: &Fields<'_>, field: &str) -> Result<Option<u64>> {
    f.get(field)
        .map(|v| {
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .filter(|ns| *ns <= i64::MAX as u64)
                .ok_or_else(|| f.bad(field, format!("{v} is not a time in ns")))
        })
        .transpose()
}

/// A trace or span id: hex of `bytes` bytes (lower-cased); empty is none.
fn hex_id(f: &Fields<'_>, field: &str, bytes: usize) -> Result<Option<String>> {
    match f.opt_str(field)? {
        None => Ok(None),
        Some(s) if s.len() == 2 * bytes && s.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(Some(s.to_ascii_lowercase()))
        }
        Some(s) => Err(f.bad(field, format!("{s:?} is not {bytes} bytes of hex"))),
    }
}

/// The row of one span, if it is a GenAI inference request.
fn request(sp: &Fields<'_>, id: String, t: &mut Tally) -> Result<Option<TraceRecord>> {
    let a = Attrs::of(sp)?;
    let Some(endpoint) = a.str(attr::OPERATION)?.and_then(endpoint_of) else {
        return Ok(None);
    };
    let endpoint = a.str(attr::ENDPOINT)?.unwrap_or(endpoint);
    let start =
        nanos(sp, "startTimeUnixNano")?.ok_or_else(|| sp.bad("startTimeUnixNano", "missing"))?;
    let id = a.str(attr::REQUEST_ID)?.map_or(id, str::to_string);
    let mut r = TraceRecord::new(id, (start / 1000) as i64, endpoint);
    r.e2el_us = match nanos(sp, "endTimeUnixNano")? {
        Some(end) if end > start => Some(((end - start) / 1000) as i64),
        _ => {
            t.unknown
                .push("endTimeUnixNano (a span without a duration)");
            None
        }
    };
    r.stream = a.bool(attr::STREAM)?.unwrap_or(true);
    r.model = match a.str(attr::REQUEST_MODEL)? {
        Some(m) => Some(m.to_string()),
        None => a.str("gen_ai.response.model")?.map(str::to_string),
    };
    r.max_tokens = a.count(attr::REQUEST_MAX_TOKENS)?;
    r.prompt_tokens = a.count(attr::INPUT_TOKENS)?;
    r.output_tokens = a.count(attr::OUTPUT_TOKENS)?;
    for (known, field) in [
        (r.prompt_tokens.is_some(), attr::INPUT_TOKENS),
        (r.output_tokens.is_some(), attr::OUTPUT_TOKENS),
    ] {
        if !known {
            t.unknown.push(field);
        }
    }
    r.prompt_tokens_source = r.prompt_tokens.map(|_| TokenSource::Recorded);
    r.output_tokens_source = r.output_tokens.map(|_| TokenSource::Recorded);
    r.ttft_us = a
        .f64(attr::TTFC)?
        .filter(|_| r.stream)
        .map(|s| (s * 1e6).round() as i64);
    r.status = match a.int(attr::HTTP_STATUS)? {
        None => None,
        Some(s) => Some(
            u16::try_from(s)
                .map_err(|_| a.bad(attr::HTTP_STATUS, &Value::from(s), "an HTTP status"))?,
        ),
    };
    outcome(sp, &a, &mut r)?;
    r.trace_id = hex_id(sp, "traceId", 16)?;
    // Bit 9 of the flags: the parent is remote — the span was exported for a client's span.
    let remote_parent = sp.opt_count("flags")?.is_some_and(|f| f & 0x200 != 0);
    r.span_id = hex_id(
        sp,
        if remote_parent {
            "parentSpanId"
        } else {
            "spanId"
        },
        8,
    )?;
    r.run_id = a.str(attr::RUN_ID)?.map(str::to_string);
    r.target = a.str(attr::TARGET)?.map(str::to_string);
    r.dispatch_lag_us = a.int(attr::DISPATCH_LAG_US)?;
    chunks(sp, start, &mut r, t)?;
    Ok(Some(r))
}

/// The outcome and error of a span.
fn outcome(sp: &Fields<'_>, a: &Attrs<'_>, r: &mut TraceRecord) -> Result<()> {
    let error_type = a.str(attr::ERROR_TYPE)?;
    let status = match sp.get("status") {
        Some(_) => Some(sp.object("status")?),
        None => None,
    };
    let failed = status
        .as_ref()
        .and_then(|s| s.get("code"))
        .is_some_and(|c| c.as_i64() == Some(2) || c.as_str() == Some("STATUS_CODE_ERROR"));
    r.outcome = match a.str(attr::OUTCOME)? {
        Some(o) => {
            Outcome::from_str(o).map_err(|_| a.bad(attr::OUTCOME, &Value::from(o), "an outcome"))?
        }
        None if !failed => Outcome::Ok,
        None if error_type.is_some_and(|e| e.parse::<u16>().is_ok()) => Outcome::HttpError,
        None => Outcome::UpstreamError,
    };
    if r.outcome != Outcome::Ok {
        // The exporter writes the error type as the message when the row had no error text.
        let message = match &status {
            Some(s) => s.opt_str("message")?,
            None => None,
        };
        r.error = message.filter(|m| Some(m.as_str()) != error_type);
    }
    Ok(())
}

/// The `llmreplay.chunk` events: chunk times (µs after the start) and tokens, when none were
/// dropped.
fn chunks(sp: &Fields<'_>, start: u64, r: &mut TraceRecord, t: &mut Tally) -> Result<()> {
    if sp.get("events").is_none() {
        return Ok(());
    }
    if sp.opt_count("droppedEventsCount")?.unwrap_or(0) > 0 {
        t.unknown
            .push("llmreplay.chunk events (some dropped by the exporter)");
        return Ok(());
    }
    let mut tokens = Vec::new();
    for (i, ev) in sp.array("events")?.iter().enumerate() {
        let ev = sp.element("events", i, ev)?;
        if ev.opt_str("name")?.as_deref() != Some(attr::CHUNK_EVENT) {
            continue;
        }
        let at = nanos(&ev, "timeUnixNano")?.ok_or_else(|| ev.bad("timeUnixNano", "missing"))?;
        r.chunk_times_us
            .push((at.saturating_sub(start) / 1000) as i64);
        let ea = Attrs::of(&ev)?;
        tokens.push(ea.int(attr::CHUNK_TOKENS)?.map(|k| k as i32));
    }
    if !tokens.is_empty() {
        r.chunk_tokens = tokens.into_iter().collect();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{detect, import_file, Format, ImportOptions};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, TracesData};
    use telemetry::span::{row_span, Server, SpanId};

    /// Rows of every kind llmreplay's exporter writes: streamed with chunks, an HTTP error
    /// on the Responses API, a cut stream (no duration), not streamed, a client's span.
    fn rows() -> Vec<TraceRecord> {
        let mut out = Vec::new();
        for i in 0..5i64 {
            let endpoint = ["/v1/chat/completions", "/v1/responses", "/v1/messages"];
            let mut r = TraceRecord::new(
                format!("run:{i}"),
                1_760_000_000_000_000 + i * 1_234_567,
                endpoint[i as usize % 3],
            );
            r.model = Some("Qwen/Qwen3-8B".into());
            r.stream = i != 3;
            r.prompt_tokens = Some(100 + i);
            r.output_tokens = Some(10 + i);
            r.prompt_tokens_source = Some(TokenSource::Recorded);
            r.output_tokens_source = Some(TokenSource::Recorded);
            r.max_tokens = (i % 2 == 0).then_some(64);
            r.status = Some(200);
            r.ttft_us = r.stream.then_some(12_345 + i);
            r.e2el_us = Some(250_000 + i);
            r.chunk_times_us = vec![12_345 + i, 20_000, 250_000 + i];
            r.chunk_tokens = Some(vec![1, 4, 5]);
            r.trace_id = Some(format!("{:032x}", 0xabc0 + i));
            r.span_id = Some(format!("{:016x}", 0x10 + i));
            r.run_id = Some("run-1".into());
            r.target = Some("candidate".into());
            r.dispatch_lag_us = Some(7 * i);
            out.push(r);
        }
        out[1].status = Some(500);
        out[1].outcome = Outcome::HttpError;
        out[2].outcome = Outcome::UpstreamError;
        out[2].error = Some("stream cut after 3 chunks".into());
        out[2].e2el_us = None;
        out[3].chunk_times_us.clear();
        out[3].chunk_tokens = None;
        out
    }

    /// What `--otlp-endpoint` exports, as a collector's file exporter writes it (OTLP/JSON, a
    /// `TracesData` per line), imports back to the rows exported.
    #[test]
    fn llmreplays_own_spans_import_back_to_the_same_rows() {
        let rows = rows();
        let server = Server::from_url("http://127.0.0.1:8000");
        let spans: Vec<Span> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let whose = if i == 4 { SpanId::Parent } else { SpanId::Own };
                row_span(r, whose, server.as_ref(), 64).unwrap()
            })
            .collect();
        // A tool span beside them is not a request.
        let mut tool = spans[0].clone();
        tool.attributes.retain(|kv| kv.key != attr::OPERATION);
        let line = |spans: Vec<Span>| {
            let data = TracesData {
                resource_spans: vec![ResourceSpans {
                    scope_spans: vec![ScopeSpans {
                        spans,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            };
            serde_json::to_string(&data).unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("spans.jsonl");
        let mut rest = spans[2..].to_vec();
        rest.push(tool);
        let text = format!("{}\n{}\n", line(spans[..2].to_vec()), line(rest));
        std::fs::write(&p, text).unwrap();
        assert_eq!(detect(&p).unwrap(), Format::Otel);
        let (got, stats) = import_file(&p, &ImportOptions::default(), "o").unwrap();
        assert_eq!(got.len(), rows.len());
        for (g, r) in got.iter().zip(&rows) {
            assert_eq!(g, r, "{}", r.request_id);
        }
        assert!(stats
            .notes
            .iter()
            .any(|n| n.starts_with("1 spans that are not")));
        assert_eq!(
            stats.unknown.values().sum::<usize>(),
            1,
            "{:?}",
            stats.unknown
        );
    }

    /// A span with more chunk events than the exporter keeps has no chunk times (not a
    /// truncated list); a bad attribute names its line and field.
    #[test]
    fn dropped_chunks_are_unknown_and_bad_spans_name_line_and_field() {
        let mut r = rows().remove(0);
        r.chunk_times_us = (0..10).collect();
        r.chunk_tokens = None;
        let span = row_span(&r, SpanId::Own, None, 4).unwrap();
        let data = TracesData {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![span],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.jsonl");
        std::fs::write(&p, serde_json::to_string(&data).unwrap()).unwrap();
        let (got, stats) = import_file(&p, &ImportOptions::default(), "o").unwrap();
        assert!(got[0].chunk_times_us.is_empty());
        assert_eq!(stats.unknown.len(), 1);
        let bad = r#"{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "1", "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}, {"key": "gen_ai.usage.input_tokens", "value": {"stringValue": "many"}}]}]}]}]}"#;
        std::fs::write(&p, format!("\n{bad}\n")).unwrap();
        let e = import_file(&p, &ImportOptions::default(), "o")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("s.jsonl:2: ") && e.contains("gen_ai.usage.input_tokens"),
            "{e}"
        );
    }
}
