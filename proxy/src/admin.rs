//! The admin endpoints: `/metrics` (Prometheus text), `/healthz` (liveness: 503 while
//! draining or for 2 s after the proxy listener failed an accept) and `/readyz` (readiness:
//! as `/healthz`, and 503 while the upstream is unreachable, see [`crate::upstream::reach`]), and
//! `POST /shadow/off` / `POST /shadow/on` (shadow traffic stopped or resumed live, see
//! [`crate::shadow`]). The admin listener's accept loop is in [`crate::lifecycle`].

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::Full;

use crate::serving::state::Shared;

/// The answer to an admin request `method` for `path` at `now_us` (µs since the epoch).
pub(crate) fn admin_response(
    shared: &Shared,
    method: &Method,
    path: &str,
    now_us: i64,
) -> Response<Full<Bytes>> {
    let saturated = now_us - shared.accept_failed_us.load(Relaxed) < 2_000_000;
    let (status, ctype, body) = match path {
        "/metrics" => {
            let mut text = shared.metrics.render();
            if let Some(s) = &shared.shadow {
                s.render(&mut text);
            }
            (StatusCode::OK, "text/plain; version=0.0.4", text)
        }
        "/shadow/off" | "/shadow/on" => match &shared.shadow {
            None => (
                StatusCode::NOT_FOUND,
                "text/plain",
                "no --shadow configured\n".into(),
            ),
            Some(_) if method != Method::POST => (
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "POST only\n".into(),
            ),
            Some(s) => {
                let on = path == "/shadow/on";
                s.set(on);
                let body = if on { "shadow on\n" } else { "shadow off\n" };
                (StatusCode::OK, "text/plain", body.into())
            }
        },
        "/healthz" | "/readyz" if shared.draining.load(Relaxed) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "draining\n".into(),
        ),
        "/healthz" | "/readyz" if saturated => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "saturated: the proxy listener failed to accept in the last 2 s (out of descriptors?)\n"
                .into(),
        ),
        "/readyz" => match shared.forward.reach().not_ready() {
            Some(why) => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", why + "\n"),
            None => (StatusCode::OK, "text/plain", "ready\n".into()),
        },
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".into()),
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}
