//! The upstream side: everything that reaches the one upstream and nothing that serves a
//! client or records a row.
//!
//! - [`route`]: the upstream's parsed base URL, the rewrite of a client's request into the
//!   upstream's, and the clients that send it (the lean path, else hyper-util's);
//! - [`lean`]: the lean HTTP/1.1 path over [`wire`]'s connection layer (pool, liveness, the
//!   retry rule, learned habits);
//! - [`reach`]: whether the upstream can be reached (`/readyz`, the `upstream_up` gauge).
//!
//! It may call: `config`, `metrics`, `phases`, `runtime`. The serving side calls it; it never
//! calls back.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use lean::LeanBody;

pub(crate) mod lean;
pub(crate) mod reach;
pub(crate) mod route;

/// The error type of the bodies the proxy streams.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The upstream's response body: from hyper's client, or read in this task
/// ([`lean`]). It lives inside the boxed [`ObservedBody`], so the size of the
/// larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum UpstreamBody {
    Hyper(Incoming),
    Lean(LeanBody),
}

impl UpstreamBody {
    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self {
            UpstreamBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(|e| e.into()),
            UpstreamBody::Lean(b) => Pin::new(b).poll_frame(cx).map_err(|e| e.into()),
        }
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Hyper(b) => b.is_end_stream(),
            UpstreamBody::Lean(b) => b.is_end_stream(),
        }
    }

    pub(crate) fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Hyper(b) => b.size_hint(),
            UpstreamBody::Lean(b) => b.size_hint(),
        }
    }
}
