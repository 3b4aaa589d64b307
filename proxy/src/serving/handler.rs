//! The request handler: what the proxy does with each request once its head is read.
//!
//! CONNECT, and absolute-form requests for another host, are refused (this is not an open
//! proxy). Requests of a recorded API ([`recorded_api`]: completions, chat, Responses,
//! Messages, embeddings, rerank, score) are read whole (they are small), may get
//! `stream_options` injected (chat and completions streams), are sent by
//! [`Forward::send_lean`](crate::upstream::route::Forward::send_lean) (else
//! [`Forward::send_generation`](crate::upstream::route::Forward::send_generation)) and recorded: a
//! [`Recording`] per request, and the response body an [`ObservedBody`]. Everything else
//! streams through untouched.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use trace_format::{Outcome, TraceRecord};
use wire::api::Api;

use crate::config::{Privacy, UsageMode};
use crate::phases::Phases;
use crate::recording::request::{inject_usage, RequestInfo};
use crate::recording::row::{ObservedBody, Recording};
use crate::serving::limits::{BodyTimeout, TimedBody};
use crate::serving::state::Shared;
use crate::upstream::route::{strip_hop_by_hop, ClientAddr};
use crate::upstream::{BoxError, UpstreamBody};

/// The response body type of the proxy. Built once per response and pinned where hyper
/// polls it: its size costs nothing per frame, while boxing the upstream body would cost an
/// allocation on every forwarded response.
#[allow(clippy::large_enum_variant)]
pub(crate) enum ProxyBody {
    Observed(Box<ObservedBody>),
    Stream(UpstreamBody),
    Full(Full<Bytes>),
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Observed(b) => Pin::new(b.as_mut()).poll_frame(cx),
            ProxyBody::Stream(b) => b.poll_frame(cx),
            ProxyBody::Full(b) => Pin::new(b).poll_frame(cx).map_err(|e| match e {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Observed(b) => b.is_end_stream(),
            ProxyBody::Stream(b) => b.is_end_stream(),
            ProxyBody::Full(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Observed(b) => b.size_hint(),
            ProxyBody::Stream(b) => b.size_hint(),
            ProxyBody::Full(b) => b.size_hint(),
        }
    }
}

/// 408 for a request body that came too slowly; the connection is not kept (the rest of
/// the body was never read).
fn body_timeout_response(message: &str) -> Response<ProxyBody> {
    let mut r = error_response(
        StatusCode::REQUEST_TIMEOUT,
        "invalid_request_error",
        message,
    );
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

fn error_response(status: StatusCode, kind: &str, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "error": {"message": message, "type": kind, "code": status.as_u16()}
    })
    .to_string();
    let mut r = Response::new(ProxyBody::Full(Full::new(Bytes::from(body))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Whether reading a request body failed because it ended early (the client went away), as
/// opposed to bytes that break its framing (hyper's decoder reports those as `InvalidInput`
/// or `InvalidData`).
fn body_cut_short(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut src = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return !matches!(
                io.kind(),
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData
            );
        }
        src = s.source();
    }
    true
}

/// The API of a request capture records ([`Api::of`]: POST to a completions, chat,
/// Responses, Messages, embeddings, rerank or score path); None for what it passes through.
pub(crate) fn recorded_api(method: &Method, path: &str) -> Option<Api> {
    Api::of(method == Method::POST, path)
}

/// A cheap deterministic sampling draw per request number.
use trace_format::fnv::drawn as sampled;

/// The request's W3C trace context, recorded in `rec` (`trace_id`, `span_id`): the client's
/// valid `traceparent`, left unchanged; else, when `start` (capture's id prefix) is given, a
/// new one derived from it and the request id, put in `headers` in place of an invalid one
/// (so the upstream's spans join the row). Returns whether capture started the trace.
fn trace_context(
    headers: &mut http::HeaderMap,
    start: Option<&str>,
    rec: &mut TraceRecord,
) -> bool {
    use trace_format::tracectx::{TraceContext, TRACEPARENT};
    let mut sent = headers.get_all(TRACEPARENT).iter();
    // Two traceparent headers are as invalid as a malformed one.
    let client = match (sent.next(), sent.next()) {
        (Some(v), None) => v.to_str().ok().and_then(TraceContext::parse),
        _ => None,
    };
    if let Some(c) = client {
        c.fill(rec);
        return false;
    }
    let Some(scope) = start else { return false };
    let ctx = TraceContext::derive(scope, &rec.request_id);
    if let Ok(v) = HeaderValue::from_bytes(&ctx.value()) {
        headers.insert(TRACEPARENT, v);
        ctx.fill(rec);
        return true;
    }
    false
}

/// Answers `req`, whose head was read at `t0` (`arrival`: the same instant in µs since the
/// epoch) on a connection accepted at `accepted` when it is the connection's first request.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    t0: Instant,
    arrival: i64,
    accepted: Option<Instant>,
) -> std::result::Result<Response<ProxyBody>, Infallible> {
    if req.method() == Method::CONNECT {
        return Ok(error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "CONNECT is not supported: this is a reverse proxy to one upstream",
        ));
    }
    if req.version() != Version::HTTP_2 {
        if let Some(a) = req.uri().authority() {
            if !shared
                .local_authorities
                .iter()
                .any(|l| l.eq_ignore_ascii_case(a.as_str()))
            {
                return Ok(error_response(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "absolute-form request for another host: this is not an open proxy",
                ));
            }
        }
    }
    if recorded_api(req.method(), req.uri().path()).is_some() {
        let (parts, body) = req.into_parts();
        Ok(generation(shared, parts, body, (t0, accepted), arrival).await)
    } else {
        Ok(passthrough(shared, req).await)
    }
}

/// What capture says the first time it forwards a method and path it does not record.
fn unrecorded_notice(method: &Method, path: &str) -> String {
    format!(
        "llmreplay capture: forwarding {method} {path} without recording it: only POST to \
         …/completions, …/chat/completions, …/responses, …/messages, …/embeddings, …/rerank \
         and …/score is recorded; this path is passed through as it is, counted in \
         llmreplay_capture_unrecorded_requests_total (said once per method and path)"
    )
}

/// Whether a pass-through request goes by the lean path (the upstream connection pool with
/// its liveness check, retry rule and learned habits): its body has a known length within
/// `--max-request-body` (read whole first), it is not HEAD (whose response has no body to
/// frame) and asks for no protocol upgrade. The rest streams through hyper's client.
fn lean_passthrough(shared: &Shared, req: &Request<Incoming>) -> bool {
    shared.forward.has_lean()
        && req.method() != Method::HEAD
        && !req.headers().contains_key(header::UPGRADE)
        && req
            .body()
            .size_hint()
            .exact()
            .is_some_and(|n| n <= shared.cfg.max_request_body as u64)
}

async fn passthrough(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ProxyBody> {
    shared.metrics.passthrough.fetch_add(1, Relaxed);
    if shared
        .metrics
        .unrecorded
        .count(req.method().as_str(), req.uri().path())
    {
        eprintln!("{}", unrecorded_notice(req.method(), req.uri().path()));
    }
    if lean_passthrough(&shared, &req) {
        let (parts, body) = req.into_parts();
        let body = match read_body(&shared, body).await {
            Ok(b) => b,
            Err(refused) => return refused.response,
        };
        let mut phases = Phases::new(Instant::now());
        let sent = shared.forward.send_lean(&parts, &body, &mut phases).await;
        return match sent {
            Some(Ok((mut parts, body))) => {
                strip_hop_by_hop(&mut parts.headers);
                parts.version = Version::HTTP_11;
                Response::from_parts(parts, ProxyBody::Stream(body))
            }
            Some(Err((_, status, msg))) => error_response(status, "upstream_error", &msg),
            None => error_response(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                "no lean path to the upstream",
            ),
        };
    }
    let (parts, body) = req.into_parts();
    let body = TimedBody::new(body, shared.cfg.client, shared.metrics.clone());
    let too_slow = body.fired();
    let Some(up) = shared
        .forward
        .request(&parts, Either::Right(body.boxed_unsync()), None)
    else {
        return error_response(StatusCode::BAD_REQUEST, "invalid_request_error", "bad path");
    };
    let sent = shared.forward.send(up).await;
    if too_slow.load(Relaxed) {
        return body_timeout_response("request body too slow");
    }
    match sent {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            parts.version = Version::HTTP_11;
            Response::from_parts(parts, ProxyBody::Stream(UpstreamBody::Hyper(body)))
        }
        Err((_, status, msg)) => error_response(status, "upstream_error", &msg),
    }
}

/// A request body that was not read whole: what the client is answered, and what its row
/// (if any) says.
struct BodyRefused {
    /// The row's outcome.
    outcome: Outcome,
    /// The status the client got, when it got one the row should name.
    status: Option<u16>,
    /// The row's error.
    error: String,
    /// The answer.
    response: Response<ProxyBody>,
}

/// Reads a request body whole, within `--max-request-body` and the client's body timeouts.
async fn read_body<B>(shared: &Shared, body: B) -> Result<Bytes, BodyRefused>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let body = TimedBody::new(body, shared.cfg.client, shared.metrics.clone());
    let e = match Limited::new(body, shared.cfg.max_request_body)
        .collect()
        .await
    {
        Ok(b) => return Ok(b.to_bytes()),
        Err(e) => e,
    };
    if let Some(t) = e.downcast_ref::<BodyTimeout>() {
        // Nothing was forwarded: the client hears 408, the row says the proxy's client
        // timeout ended it.
        let msg = t.to_string();
        return Err(BodyRefused {
            outcome: Outcome::Timeout,
            status: Some(408),
            response: body_timeout_response(&msg),
            error: msg,
        });
    }
    if e.downcast_ref::<http_body_util::LengthLimitError>()
        .is_some()
    {
        let msg = format!("request body over {} bytes", shared.cfg.max_request_body);
        return Err(BodyRefused {
            outcome: Outcome::HttpError,
            status: Some(413),
            response: error_response(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", &msg),
            error: msg,
        });
    }
    let bad_body = error_response(StatusCode::BAD_REQUEST, "invalid_request_error", "bad body");
    if body_cut_short(&*e) {
        return Err(BodyRefused {
            outcome: Outcome::ClientCancelled,
            status: None,
            error: format!("reading the request body: {e}"),
            response: bad_body,
        });
    }
    // A body that breaks its own framing (a bad chunk): the client's error, answered 400,
    // and recorded as what the client got.
    let mut msg = format!("malformed request body: {e}");
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    Err(BodyRefused {
        outcome: Outcome::HttpError,
        status: Some(400),
        error: msg,
        response: bad_body,
    })
}

/// Answers and records a generation request (`parts`, its body still to be read from
/// `body`), whose head was read at `t0` (`arrival`, µs since the epoch) on a connection
/// accepted at `accepted` when it is the connection's first request. hyper's server gives
/// its `Incoming`, the lean path ([`crate::serving::lean`]) a body read from its own buffer.
pub(crate) async fn generation<B>(
    shared: Arc<Shared>,
    parts: http::request::Parts,
    body: B,
    t0: (Instant, Option<Instant>),
    arrival: i64,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    match read_generation(&shared, parts, body, t0, arrival).await {
        Ok(g) => forward_generation(shared, g).await,
        Err(refused) => refused,
    }
}

/// A generation request whose body is read: what [`forward_generation`] sends.
pub(crate) struct ReadGeneration {
    recording: Recording,
    parts: http::request::Parts,
    body: Bytes,
}

/// The first half of [`generation`]: starts the row and reads the body (`Err`: the answer
/// to a body that was too slow, too large, cut short or malformed, its row finished).
pub(crate) async fn read_generation<B>(
    shared: &Arc<Shared>,
    mut parts: http::request::Parts,
    body: B,
    (t0, accepted): (Instant, Option<Instant>),
    arrival: i64,
) -> Result<ReadGeneration, Response<ProxyBody>>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let n = shared.next_id.fetch_add(1, Relaxed);
    let path = parts.uri.path().to_string();
    let mut rec = TraceRecord::new(format!("{}-{n:08x}", shared.id_prefix), arrival, path);
    if let Some(h) = &shared.session_header {
        rec.session_id = parts
            .headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
    }
    let mut recording = Recording::new(
        shared.recorder.clone(),
        t0,
        rec,
        sampled(n, shared.cfg.sample_rate),
    );
    recording.phases.accepted = accepted;
    if recording.sampled() {
        let peer = parts.extensions.get::<ClientAddr>().map(|c| c.0);
        recording.seen.client = crate::linking::agents::client_key(peer, &parts.headers);
    }
    recording.trace_started = trace_context(
        &mut parts.headers,
        shared.cfg.traceparent.then_some(shared.id_prefix.as_str()),
        &mut recording.rec,
    );
    let body = match read_body(shared, body).await {
        Ok(b) => b,
        Err(refused) => {
            recording.rec.status = refused.status;
            recording.finish(refused.outcome, Some(refused.error), Instant::now());
            return Err(refused.response);
        }
    };
    Ok(ReadGeneration {
        recording,
        parts,
        body,
    })
}

/// The second half of [`generation`]: records what the body says, sends it upstream and
/// answers with the upstream's response (its body observed) or the failure.
pub(crate) async fn forward_generation(
    shared: Arc<Shared>,
    g: ReadGeneration,
) -> Response<ProxyBody> {
    let ReadGeneration {
        mut recording,
        parts,
        body,
    } = g;
    let info = RequestInfo::parse(&body);
    {
        let r = &mut recording.rec;
        r.request_bytes = body.len() as i64;
        r.model = info.model.clone();
        r.stream = info.stream;
        r.max_tokens = info.max_tokens;
        if shared.cfg.privacy == Privacy::Full {
            r.body = Some(String::from_utf8_lossy(&body).into_owned());
        }
    }
    // Tokenizing the prompt for its prefix hashes can take milliseconds: it runs on the
    // prompt runners (batched, parsed there, see [`crate::recording::prompts`]) while the request is
    // forwarded, and the writer thread joins it before writing the row. Without hashes to
    // keep, the body is only parsed there (the chat chain); its tokens are counted only when
    // the upstream reports no usage.
    if recording.sampled() && info.object {
        let tokenize = shared.cfg.privacy.hashes();
        recording.prompt = Some(shared.prompts.submit(recording.api, body.clone(), tokenize));
    }
    // Responses and Messages streams report their usage themselves.
    let usage = if recording.api.typed_events() {
        UsageMode::Off
    } else {
        shared.cfg.usage
    };
    let (up_body, strip) = match inject_usage(&body, &info, usage) {
        Some((b, s)) => (Bytes::from(b), s),
        None => (body, Default::default()),
    };
    drop(info);
    if let Some(shadow) = &shared.shadow {
        if recording.sampled() {
            shadow.mirror(&mut recording, &parts, &up_body, strip);
        }
    }
    let sent = match shared
        .forward
        .send_lean(&parts, &up_body, &mut recording.phases)
        .await
    {
        Some(sent) => sent,
        None => {
            let len = up_body.len();
            let Some(up) =
                shared
                    .forward
                    .request(&parts, Either::Left(Full::new(up_body.clone())), Some(len))
            else {
                recording.finish(Outcome::HttpError, Some("bad path".into()), Instant::now());
                return error_response(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "bad path",
                );
            };
            shared.forward.send_generation(up).await
        }
    };
    match sent {
        Ok((mut parts, body)) => {
            recording.rec.status = Some(parts.status.as_u16());
            strip_hop_by_hop(&mut parts.headers);
            parts.version = Version::HTTP_11;
            let sse = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
            if sse && strip.any() {
                parts.headers.remove(header::CONTENT_LENGTH);
            }
            let observed = ObservedBody::new(
                body,
                sse,
                strip,
                recording,
                shared.cfg.idle_timeout,
                shared.cfg.max_sse_event,
            );
            Response::from_parts(parts, ProxyBody::Observed(Box::new(observed)))
        }
        Err((outcome, status, msg)) => {
            recording.finish(outcome, Some(msg.clone()), Instant::now());
            error_response(status, "upstream_error", &msg)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(tp: &[&str]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for v in tp {
            h.append("traceparent", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    /// A client's valid context is left as it is and recorded; none, an invalid one or two
    /// are replaced by one capture starts (recorded); with no start (`--no-traceparent`)
    /// nothing is added or changed.
    #[test]
    fn a_clients_context_is_kept_else_capture_starts_one() {
        let mut h = headers(&[CLIENT]);
        let mut rec = TraceRecord::new("p-1", 0, "/v1/completions");
        assert!(!trace_context(&mut h, Some("p"), &mut rec));
        assert_eq!(h.get("traceparent").unwrap(), CLIENT);
        assert_eq!(
            (rec.trace_id.as_deref(), rec.span_id.as_deref()),
            (
                Some("4bf92f3577b34da6a3ce929d0e0e4736"),
                Some("00f067aa0ba902b7")
            )
        );
        for sent in [&[][..], &["00-bad-01"], &[CLIENT, CLIENT]] {
            let mut h = headers(sent);
            let mut rec = TraceRecord::new("p-2", 0, "/v1/completions");
            assert!(trace_context(&mut h, Some("p"), &mut rec), "{sent:?}");
            let all: Vec<_> = h.get_all("traceparent").iter().collect();
            assert_eq!(all.len(), 1, "{sent:?}");
            let c = trace_format::tracectx::TraceContext::parse(all[0].to_str().unwrap()).unwrap();
            assert_eq!(c, trace_format::tracectx::TraceContext::derive("p", "p-2"));
            assert_eq!(rec.trace_id, Some(c.trace_hex()));
            assert_eq!(rec.span_id, Some(c.span_hex()));
        }
        let mut h = headers(&["00-bad-01"]);
        let mut rec = TraceRecord::new("p-3", 0, "/v1/completions");
        assert!(!trace_context(&mut h, None, &mut rec));
        assert_eq!(h.get("traceparent").unwrap(), "00-bad-01");
        assert_eq!(rec.trace_id, None);
        let mut h = headers(&[CLIENT]);
        assert!(!trace_context(&mut h, None, &mut rec));
        assert_eq!(rec.span_id.as_deref(), Some("00f067aa0ba902b7"));
    }
}
