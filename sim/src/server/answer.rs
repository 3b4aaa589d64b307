//! Serving a recorded answer: the matched row's chunks at their offsets from t0, its status,
//! or the connection dropped, as [`Ending`] says.

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::{HeaderValue, Response, StatusCode};
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::time::Instant;

use super::{
    drop_connection, error_response_for, far, gen_response, json_response, unix_now, AppState,
    GenSpec, SimBody, DEFAULT_STALL,
};
use crate::engine::Emit;
use crate::engine_metrics::FinishReason;
use crate::from_trace::{Ending, RecordedAnswer, TraceMock, Unmatched, MATCH_HEADER, ROW_HEADER};
use crate::openai::{ApiError, GenRequest};
use crate::output::Gen;
use crate::tokens::{combine, mix};
use wire::api::Api;

/// What a request asked, as the server parsed it.
pub(crate) struct Asked<'a> {
    pub(crate) api: Api,
    pub(crate) req: &'a GenRequest,
    pub(crate) request_id: Option<&'a str>,
    pub(crate) prompt_key: Option<u64>,
    /// When its headers were read.
    pub(crate) t0: Instant,
}

/// What a recorded stream does after its last recorded chunk.
#[derive(Debug, Clone, Copy)]
enum After {
    /// Nothing: the last chunk finished the response.
    Finish,
    /// The connection is dropped at this offset from t0 (no `[DONE]`).
    DropAt(Duration),
    /// Nothing more is sent until the client goes away (at most [`DEFAULT_STALL`]).
    Hold,
}

fn with_headers(
    mut r: Response<SimBody>,
    how: &'static str,
    row: Option<&str>,
) -> Response<SimBody> {
    r.headers_mut()
        .insert(MATCH_HEADER, HeaderValue::from_static(how));
    if let Some(v) = row.and_then(|id| HeaderValue::from_str(id).ok()) {
        r.headers_mut().insert(ROW_HEADER, v);
    }
    r
}

fn error_kind(status: StatusCode) -> &'static str {
    match status.as_u16() {
        429 => "rate_limit_error",
        404 => "not_found_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    }
}

/// Answers a request from the trace.
pub(crate) async fn respond(st: &AppState, mock: &TraceMock, ask: Asked<'_>) -> Response<SimBody> {
    let (row, how) = match mock.find(ask.request_id, ask.prompt_key) {
        Ok(found) => found,
        Err(Unmatched(message)) => {
            let r = error_response_for(
                ask.api,
                &ApiError {
                    status: StatusCode::NOT_FOUND,
                    message,
                    kind: "not_found_error",
                    code: Some("no_recorded_request"),
                },
            );
            return with_headers(r, "unmatched", None);
        }
    };
    let r = recorded(st, row, &ask).await;
    with_headers(r, how.as_str(), Some(&row.request_id))
}

async fn recorded(st: &AppState, row: &RecordedAnswer, ask: &Asked<'_>) -> Response<SimBody> {
    let t0 = ask.t0;
    let at = |d: Duration| far(t0, d);
    let hold = || tokio::time::sleep(DEFAULT_STALL);
    match &row.ending {
        Ending::Status { status, error } => {
            tokio::time::sleep_until(at(row.e2el)).await;
            let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return error_response_for(
                ask.api,
                &ApiError {
                    status,
                    message: error
                        .clone()
                        .unwrap_or_else(|| format!("recorded HTTP {}", status.as_u16())),
                    kind: error_kind(status),
                    code: None,
                },
            );
        }
        Ending::Reset { began: false } => {
            tokio::time::sleep_until(at(row.e2el)).await;
            return drop_connection();
        }
        Ending::Hold { began: false } => {
            hold().await;
            return drop_connection();
        }
        _ => {}
    }
    let n = st.next_id.load(Ordering::Relaxed);
    let id = st.next_id();
    let prompt_tokens = row
        .prompt_tokens
        .unwrap_or_else(|| u32::try_from(ask.req.prompt.len()).unwrap_or(u32::MAX));
    let gen = Gen::new(
        ask.api,
        &id,
        unix_now(),
        &st.model,
        prompt_tokens,
        combine(st.seed, mix(n)),
    );
    let mut out = st.writer(ask.api, ask.req, gen);
    let finish = match row.ending {
        Ending::Complete { length: true } => FinishReason::Length,
        _ => FinishReason::Stop,
    };
    if !ask.req.stream {
        return match row.ending {
            Ending::Complete { .. } => {
                tokio::time::sleep_until(at(row.e2el)).await;
                let body = out.whole(row.output_tokens, finish);
                json_response(StatusCode::OK, body)
            }
            Ending::Hold { .. } => {
                hold().await;
                drop_connection()
            }
            _ => {
                tokio::time::sleep_until(at(row.e2el)).await;
                drop_connection()
            }
        };
    }
    let (after, target) = match row.ending {
        Ending::Complete { .. } => (After::Finish, row.output_tokens),
        // Never complete: the recorded chunks reach no target.
        Ending::Reset { .. } => (After::DropAt(row.e2el), u32::MAX),
        _ => (After::Hold, u32::MAX),
    };
    // A streamed request for a row recorded whole gets its one chunk at E2EL.
    let chunks = row.chunks.clone();
    gen_response(GenSpec {
        stream: true,
        out,
        start: Box::new(move || recorded_stream(t0, chunks, after)),
        stall: None,
        reset_after: None,
        target,
        finish,
    })
}

/// The recorded chunks on absolute deadlines from `t0`, then what `after` says; ends early
/// when the client goes away.
fn recorded_stream(
    t0: Instant,
    chunks: Vec<(Duration, u32)>,
    after: After,
) -> UnboundedReceiver<Emit> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let n = chunks.len();
        for (i, (at, tokens)) in chunks.into_iter().enumerate() {
            tokio::select! {
                () = tokio::time::sleep_until(far(t0, at)) => {}
                () = tx.closed() => return,
            }
            let last = matches!(after, After::Finish) && i + 1 == n;
            if tx.send(Emit { tokens, last }).is_err() {
                return;
            }
        }
        let end = match after {
            After::Finish => return,
            After::DropAt(d) => far(t0, d),
            After::Hold => Instant::now() + DEFAULT_STALL,
        };
        tokio::select! {
            () = tokio::time::sleep_until(end) => {}
            () = tx.closed() => {}
        }
        // Dropping the sender ends the body without finishing it: the connection is reset.
    });
    rx
}
