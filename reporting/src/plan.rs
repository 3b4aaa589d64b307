//! The capacity plan: replicas and cost to carry a target load within the SLO, from a
//! capacity answer ([`CapacityAnswer::capacity_rps`]). Its own module, used by `sweep`, `results` and the reports.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{json, Value};

use crate::capacity::CapacityAnswer;

/// Hours in a month for the cost estimate (365 × 24 / 12).
pub const HOURS_PER_MONTH: f64 = 730.0;

/// Where the target load of a capacity plan comes from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadSource {
    /// `--target-qps`.
    TargetQps,
    /// The captured trace's peak 1-second arrival rate.
    TracePeak,
}

/// Replicas and cost to serve a target load within the SLO.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapacityPlan {
    /// Which configuration.
    pub name: String,
    /// Requests/s one replica serves within the SLO: [`CapacityAnswer::capacity_rps`].
    pub per_replica_rps: f64,
    /// The load to serve, req/s.
    pub target_qps: f64,
    /// Where it came from.
    pub target_source: LoadSource,
    /// Replicas that carry the load: ceil(target / per replica).
    pub replicas_for_load: u64,
    /// Independent failure domains, each able to carry the whole load (`--redundancy`).
    pub redundancy: u32,
    /// replicas_for_load × redundancy.
    pub replicas: u64,
    /// Fraction of the fleet's SLO capacity the target uses.
    pub utilization: f64,
    /// `--cost-per-hour` of one replica.
    pub cost_per_hour: Option<f64>,
    /// replicas × cost_per_hour × 730.
    pub monthly_cost: Option<f64>,
    /// The plan in one sentence.
    pub sentence: String,
}

/// The capacity plan of an answer, or None without a capacity (no SLO met, or no SLOs).
pub fn plan(
    a: &CapacityAnswer,
    target_qps: f64,
    source: LoadSource,
    redundancy: u32,
    cost_per_hour: Option<f64>,
) -> Option<CapacityPlan> {
    let per = a.capacity_rps().filter(|t| *t > 0.0)?;
    if !(target_qps.is_finite() && target_qps > 0.0) {
        return None;
    }
    let redundancy = redundancy.max(1);
    let for_load = (target_qps / per).ceil().max(1.0) as u64;
    let replicas = for_load * u64::from(redundancy);
    let monthly = cost_per_hour.map(|c| c * replicas as f64 * HOURS_PER_MONTH);
    let src = match source {
        LoadSource::TargetQps => "--target-qps",
        LoadSource::TracePeak => "the capture's peak 1-second arrival rate",
    };
    let mut sentence = format!(
        "{}: {:.2} req/s ({src}) / {:.2} req/s per replica within the SLO = {for_load} replica{}; x{redundancy} redundancy = {replicas} replica{}",
        a.name,
        target_qps,
        per,
        if for_load == 1 { "" } else { "s" },
        if replicas == 1 { "" } else { "s" },
    );
    if let (Some(c), Some(m)) = (cost_per_hour, monthly) {
        let _ = write!(sentence, ", {m:.0}/month at {c}/hour each");
    }
    sentence.push('.');
    Some(CapacityPlan {
        name: a.name.clone(),
        per_replica_rps: per,
        target_qps,
        target_source: source,
        replicas_for_load: for_load,
        redundancy,
        replicas,
        utilization: target_qps / (per * replicas as f64),
        cost_per_hour,
        monthly_cost: monthly,
        sentence,
    })
}

/// Inputs of a capacity plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanInputs {
    /// `--target-qps` (None: the trace's peak arrival rate).
    pub target_qps: Option<f64>,
    /// `--redundancy`.
    pub redundancy: u32,
    /// `--cost-per-hour`.
    pub cost_per_hour: Option<f64>,
}

impl Default for PlanInputs {
    fn default() -> Self {
        PlanInputs {
            target_qps: None,
            redundancy: 2,
            cost_per_hour: None,
        }
    }
}

/// JSON of an answer (for the sweep file and reports).
pub fn answer_json(a: &CapacityAnswer, plan: Option<&CapacityPlan>) -> Value {
    let mut v = json!(a);
    if let (Some(p), Some(o)) = (plan, v.as_object_mut()) {
        o.insert("plan".into(), json!(p));
    }
    v
}
