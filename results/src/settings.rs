//! The settings a run was made with, as its result reports them and as a `--results` file
//! records them for `merge` ([`RunSettings`]).

use serde::{Deserialize, Serialize};

use crate::doc::{RequestRate, ResultDoc};

/// The settings a run was made with that its result reports: what `merge` takes from the
/// shards' files (replay writes it with `--results`, under [`RunSettings::META_KEY`]) so a
/// merged result says what the shards ran with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunSettings {
    /// `tokenizer_id`.
    pub tokenizer_id: Option<String>,
    /// `request_rate`.
    pub request_rate: RequestRate,
    /// `burstiness`.
    pub burstiness: Option<f64>,
    /// `max_concurrency`.
    pub max_concurrency: Option<u64>,
    /// `llmreplay.trace.arrivals`.
    pub arrivals: String,
    /// `llmreplay.trace.speedup`.
    pub speedup: Option<f64>,
    /// `llmreplay.trace.start_offset_s`.
    pub start_offset_s: f64,
    /// `llmreplay.trace.window_s`.
    pub window_s: Option<f64>,
    /// `llmreplay.trace.sample_ratio`.
    pub sample_ratio: Option<f64>,
    /// `llmreplay.trace.max_requests`.
    pub max_requests: Option<u64>,
    /// `llmreplay.trace.session_mode`.
    pub session_mode: String,
    /// `llmreplay.trace.seed`.
    pub seed: u64,
    /// `llmreplay.trace.prompt_salt`.
    pub prompt_salt: u64,
}

impl RunSettings {
    /// The Parquet metadata key of a `--results` file that holds them (JSON).
    pub const META_KEY: &'static str = "result_settings";

    /// The settings as `doc` reports them.
    pub fn of_doc(doc: &ResultDoc) -> RunSettings {
        let v = &doc.vllm;
        let t = doc.ours().trace.clone();
        RunSettings {
            tokenizer_id: v.tokenizer_id.clone(),
            request_rate: v.request_rate,
            burstiness: v.burstiness,
            max_concurrency: v.max_concurrency,
            arrivals: t.arrivals,
            speedup: t.speedup,
            start_offset_s: t.start_offset_s,
            window_s: t.window_s,
            sample_ratio: t.sample_ratio,
            max_requests: t.max_requests,
            session_mode: t.session_mode,
            seed: t.seed,
            prompt_salt: t.prompt_salt,
        }
    }

    /// Writes them into `doc`.
    pub fn apply(&self, doc: &mut ResultDoc) {
        let v = &mut doc.vllm;
        v.tokenizer_id = self.tokenizer_id.clone();
        v.request_rate = self.request_rate;
        v.burstiness = self.burstiness;
        v.max_concurrency = self.max_concurrency;
        if let Some(o) = doc.llmreplay.as_mut() {
            let t = &mut o.trace;
            t.arrivals = self.arrivals.clone();
            t.speedup = self.speedup;
            t.start_offset_s = self.start_offset_s;
            t.window_s = self.window_s;
            t.sample_ratio = self.sample_ratio;
            t.max_requests = self.max_requests;
            t.session_mode = self.session_mode.clone();
            t.seed = self.seed;
            t.prompt_salt = self.prompt_salt;
        }
    }

    /// As the metadata value.
    pub fn to_meta(&self) -> String {
        serde_json::to_string(&serde_json::to_value(self).expect("settings serialize"))
            .expect("a JSON value always serializes")
    }
}
