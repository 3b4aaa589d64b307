//! The state every connection of a running proxy shares (built by [`crate::lifecycle::start`]).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};
use std::sync::Arc;

use http::header::HeaderName;

use crate::capture_metrics::Metrics;
use crate::config::ProxyConfig;
use crate::recording::prompts::PromptQueue;
use crate::recording::row::Recorder;
use crate::serving::accept::HoldOff;
use crate::upstream::route::Forward;

/// State shared by every connection.
pub(crate) struct Shared {
    pub(crate) cfg: ProxyConfig,
    /// The upstream and the clients that reach it.
    pub(crate) forward: Forward,
    /// Prompts waiting to be tokenized.
    pub(crate) prompts: Arc<PromptQueue>,
    pub(crate) metrics: Arc<Metrics>,
    /// Where finished rows go.
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) next_id: AtomicU64,
    pub(crate) id_prefix: String,
    /// The authorities an absolute-form request may name: this proxy's and the upstream's.
    pub(crate) local_authorities: Vec<String>,
    pub(crate) session_header: Option<HeaderName>,
    /// Set when the proxy stops accepting: `/healthz` answers 503.
    pub(crate) draining: AtomicBool,
    /// When the proxy listener last failed an accept (µs since the epoch; 0: never):
    /// `/healthz` answers 503 for 2 s after one.
    pub(crate) accept_failed_us: AtomicI64,
    /// Held while the admin listener gives up its spare descriptor to accept one connection
    /// with it: the serving threads' accept loops hold off meanwhile, so the freed descriptor
    /// goes to the admin connection, not to one more proxy connection.
    pub(crate) admin_rescue: HoldOff,
    /// Cuts the lean path's connections in the shutdown's last stage (hyper's connections
    /// watch the `hard` channel of [`crate::lifecycle`]).
    pub(crate) cut: crate::serving::cut::Cut,
    /// Shadow traffic (`--shadow`), when configured.
    pub(crate) shadow: Option<Arc<crate::shadow::Shadow>>,
}
