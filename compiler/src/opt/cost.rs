//! The cost of a whole program on a target: the roofline of every launch its
//! plan makes (`crate::cost` has the formulas). In inference, operations on
//! weights alone are computed once at load time and cost nothing per call;
//! in training they are charged every call.

pub use crate::cost::{op_cost, visible_pairs, weight_only, OpCost, Target, CPU, H200, TARGETS};
use crate::ir::Program;
use std::collections::BTreeMap;

/// How a program is charged: per call with its weights prepared, or every
/// launch every step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Weights are frozen: weight-only work is done once, at load time.
    Inference,
    /// Weights change every step: everything is charged every call.
    Training,
}

/// The predicted cost of a whole program: the roofline of every launch its
/// plan makes (`crate::plan`, the one description of what runs), so views
/// cost nothing, copies and fused kernels cost what they are, and in
/// inference the launches that prepare weights are not charged per call.
#[derive(Clone, Debug)]
pub struct ProgramCost {
    pub total: OpCost,
    pub seconds: f64,
    /// `(launch name, cost, seconds)` for every launch charged per call.
    pub launches: Vec<(String, OpCost, f64)>,
    /// `(launch name, tiling)` of attention's launches as the target runs
    /// them (`KernelSpec::tiling_note`).
    pub tiling: Vec<(String, String)>,
    /// Launches that prepare weights, done once (charged per call in training).
    pub prepared: Vec<(String, OpCost, f64)>,
}

pub fn program_cost(p: &Program, dims: &BTreeMap<String, u64>, target: &Target, mode: Mode) -> ProgramCost {
    // Launches with too few cubes for the target are split over their keys,
    // and each launch's kernel is the one the target's planes run.
    let plan = crate::plan::plan(p, dims).split_kv(target.compute_units).on_planes(target.register_plane);
    let mut out =
        ProgramCost { total: OpCost::default(), seconds: 0.0, launches: vec![], prepared: vec![], tiling: vec![] };
    for l in &plan.launches {
        let spec = &l.spec;
        if let Some(gap) = spec.kernel_gap() {
            out.tiling.push((l.name.clone(), format!("no kernel yet: {gap}; priced by its roofline")));
        } else if let Some(note) = spec.tiling_note() {
            out.tiling.push((l.name.clone(), note));
        }
        let c = OpCost { flops: l.flops, bytes: l.bytes, launches: 1 };
        // The work's share slows with the SMs left idle; the launch does not.
        let t = (c.time(target) - target.launch) / attention_occupancy(spec, target) + target.launch;
        if mode == Mode::Inference && l.prepare {
            out.prepared.push((l.name.clone(), c, t));
            continue;
        }
        out.total.add(c);
        out.seconds += t;
        out.launches.push((l.name.clone(), c, t));
    }
    out
}

/// The share of the target's compute units a forward attention launch
/// keeps busy, `min(1, cubes / units)`: its roofline time (not its launch) is divided by it,
/// so a decode step's one cube per batch and head (8 of an H200's 132 SMs)
/// is priced slow, and split-KV decoding ([`crate::plan::Plan::split_kv`])
/// pays. Other launches are priced by their roofline alone.
fn attention_occupancy(spec: &crate::plan::KernelSpec, target: &Target) -> f64 {
    if !matches!(spec, crate::plan::KernelSpec::Attention { .. }) {
        return 1.0;
    }
    let (_, (x, y, z)) = spec.grid();
    ((x as f64 * y as f64 * z as f64) / target.compute_units as f64).min(1.0)
}
