//! The parts of the result document the engine measures as typed values
//! (`replay::coverage::Coverage`, `replay::server_metrics`, `replay::soak`), as the document
//! writes them: the requests behind each metric, the server's histograms beside the client's
//! TTFT, the slices of a run and the drift over them. Re-exported by [`crate::doc`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use replay::server_metrics::HistogramSummary;
use replay::soak::Slice;

/// `llmreplay.metric_requests`: the completed requests behind each latency metric
/// (`replay::coverage::Coverage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MetricRequests {
    /// Completed streamed requests with a first output chunk.
    pub ttft: u64,
    /// Completed streamed requests with more than one output token.
    pub tpot: u64,
    /// Completed streamed requests with two or more output chunks.
    pub itl: u64,
    /// Completed requests with an end time.
    pub e2el: u64,
    /// Completed requests that were not streamed.
    pub not_streamed: u64,
    /// Completed streamed requests with one output token or none (absent from results
    /// that predate it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub single_token: Option<u64>,
}

impl From<replay::coverage::Coverage> for MetricRequests {
    fn from(c: replay::coverage::Coverage) -> MetricRequests {
        MetricRequests {
            ttft: c.ttft as u64,
            tpot: c.tpot as u64,
            itl: c.itl as u64,
            e2el: c.e2el as u64,
            not_streamed: c.not_streamed as u64,
            single_token: Some(c.single_token as u64),
        }
    }
}

/// `llmreplay.server_histograms`: the server's histograms over the run (`--server-metrics`),
/// each by its name (`ttft_ms`, `queue_time_ms`, …), with the client's TTFT beside them.
/// Written keys sorted, like every key of the document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerHistogramsDoc {
    /// The client's mean TTFT, ms (null when not a number).
    pub client_ttft_mean_ms: Option<f64>,
    /// Client mean TTFT − the server's, ms: present when the server counted TTFTs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_gap_ms: Option<f64>,
    /// Each histogram by its name.
    #[serde(flatten)]
    pub histograms: BTreeMap<String, HistogramSummary>,
}

/// `llmreplay.slices` (`--slice`): the run cut into slices of `slice_s` and the drift of its
/// figures over them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlicesDoc {
    /// Slice width, s.
    pub slice_s: f64,
    /// Every slice, empty ones included (a stall is a finding).
    pub slices: Vec<Slice>,
    /// The drift of p95 TTFT, p95 TPOT and the completion rate.
    pub drift: DriftDoc,
}

/// `llmreplay.slices.drift`: the trend of three per-slice series (null with fewer than two
/// full slices with a value).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DriftDoc {
    /// p95 TTFT per slice, ms.
    pub p95_ttft_ms: Option<TrendDoc>,
    /// p95 TPOT per slice, ms.
    pub p95_tpot_ms: Option<TrendDoc>,
    /// Completions per second per slice.
    pub completed_per_s: Option<TrendDoc>,
}

/// The trend of one per-slice series (`replay::soak::Trend`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrendDoc {
    /// Slices with a value.
    pub slices: u64,
    /// Value in the first slice with one.
    pub first: f64,
    /// Value in the last slice with one.
    pub last: f64,
    /// last / first (null when first is 0).
    pub ratio: Option<f64>,
    /// Least-squares slope, units per hour.
    pub slope_per_hour: f64,
}

impl From<replay::soak::Trend> for TrendDoc {
    fn from(t: replay::soak::Trend) -> TrendDoc {
        TrendDoc {
            slices: t.slices as u64,
            first: t.first,
            last: t.last,
            ratio: t.ratio.is_finite().then_some(t.ratio),
            slope_per_hour: t.slope_per_hour,
        }
    }
}
