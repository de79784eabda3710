//! The cost formulas: a roofline per kernel launch,
//! `time = max(flops / peak, bytes / bandwidth) + launches × launch overhead`,
//! on a target profile, for f32 tensors, and the work of each operation.
//! The plan (what each launch costs) and the optimizer (`opt::cost`, what a
//! whole program costs) both read them; this module reads neither.
//!
//! Layout operations (`split_heads`, `merge_heads`, `interleave`, …) are views:
//! their consumers read through them, so they cost nothing.

use crate::ir::{Mask, Op, Program};

/// A machine described by its ceilings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Target {
    pub name: &'static str,
    /// f32 FLOP/s.
    pub peak_flops: f64,
    /// Bytes/s of device memory.
    pub bandwidth: f64,
    /// Seconds per kernel launch.
    pub launch: f64,
    /// The plane width its kernels are tiled within the register file for
    /// (`plan::choose_path`: CUDA); `None` keeps the plan's tiles.
    pub register_plane: Option<usize>,
    /// Compute units (SMs; cores for the CPU) that split-KV decoding fills
    /// (`Plan::split_kv`).
    pub compute_units: usize,
}

/// NVIDIA H200: ~60 TFLOP/s f32 (790 TFLOP/s is bf16 matrix work, which f32
/// kernels do not use), 4.3 TB/s HBM3e, ~3 µs per launch, 132 SMs.
pub const H200: Target = Target {
    name: "h200",
    peak_flops: 60e12,
    bandwidth: 4.3e12,
    launch: 3e-6,
    register_plane: Some(32),
    compute_units: 132,
};

/// This project's CI machine through lavapipe: 2 cores, AVX2 FMA (≈ 150 GFLOP/s
/// f32), ≈ 20 GB/s, and ≈ 100 µs per launch through Vulkan.
pub const CPU: Target =
    Target { name: "cpu", peak_flops: 150e9, bandwidth: 20e9, launch: 100e-6, register_plane: None, compute_units: 2 };

pub const TARGETS: &[Target] = &[H200, CPU];

impl Target {
    pub fn by_name(name: &str) -> Option<Target> {
        TARGETS.iter().copied().find(|t| t.name == name)
    }
}

/// The work of one operation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpCost {
    pub flops: f64,
    pub bytes: f64,
    pub launches: u32,
}

impl OpCost {
    pub fn time(&self, t: &Target) -> f64 {
        (self.flops / t.peak_flops).max(self.bytes / t.bandwidth) + f64::from(self.launches) * t.launch
    }
    pub fn add(&mut self, o: OpCost) {
        self.flops += o.flops;
        self.bytes += o.bytes;
        self.launches += o.launches;
    }
}

fn numel(s: &[usize]) -> f64 {
    s.iter().map(|&d| d as f64).product()
}

/// Query/key pairs a mask lets through for `sq` query rows against `sk` key
/// rows: each query row's band ([`Mask::key_band`]).
pub fn visible_pairs(mask: &Mask, sq: usize, sk: usize) -> f64 {
    let (sq, sk) = (sq as u64, sk as u64);
    (0..sq).map(|i| mask.key_band(i, sq, sk)).map(|r| (r.end - r.start) as f64).sum()
}

/// Operations per logit of attention's score and mask functions (and,
/// `with_slope`, of the score function's derivative), each counted as one
/// flop. The mask function runs on every pair a visited tile holds, which
/// `visible_pairs` does not count: a mask function is priced as unmasked.
fn function_ops(fns: &Option<Box<crate::ir::AttnFns>>, with_slope: bool) -> f64 {
    let Some(f) = fns else { return 0.0 };
    let score = f
        .score
        .as_ref()
        .map_or(0, |s| s.body.ops() + if with_slope { crate::grad::score_slope(s).body.ops() } else { 0 });
    (score + f.mask.as_ref().map_or(0, |m| m.body.ops())) as f64
}

/// The roofline work of `op` given its output shape and its operands' shapes.
pub fn op_cost(op: &Op, out: &[usize], operands: &[Vec<usize>]) -> OpCost {
    let io_bytes = 4.0 * (numel(out) + operands.iter().map(|s| numel(s)).sum::<f64>());
    let kernel = |flops: f64| OpCost { flops, bytes: io_bytes, launches: 1 };
    match op {
        Op::Input { .. }
        | Op::Scalar { .. }
        | Op::Constant { .. }
        | Op::SplitHeads { .. }
        | Op::MergeHeads { .. }
        | Op::Interleave { .. }
        | Op::Deinterleave { .. }
        | Op::UnflattenHeads { .. }
        | Op::FlattenHeads { .. }
        | Op::SliceCols { .. }
        | Op::Slice { .. }
        | Op::Transpose { .. }
        | Op::Unsqueeze { .. } => OpCost::default(),
        Op::MatMul { .. } => kernel(2.0 * numel(out) * operands[0].last().copied().unwrap_or(1) as f64),
        Op::MixHeads { .. } | Op::MixCols { .. } => kernel(2.0 * numel(out) * operands[1][0] as f64),
        Op::Collapse { .. } | Op::CollapseCols { .. } => kernel(2.0 * numel(out) * operands[1][1] as f64),
        Op::CollapseRows { .. } => kernel(2.0 * numel(out) * operands[1][0] as f64),
        Op::Rope { .. } => kernel(6.0 * numel(out)),
        // A gather: reads the rows it writes (not the whole cache) and the table.
        Op::Paged { .. } => OpCost { flops: 0.0, bytes: 4.0 * (2.0 * numel(out) + numel(&operands[1])), launches: 1 },
        Op::Attention { mask, fns: Some(f), .. } if f.mixes() => {
            // Per (query row, key) pair: every query head's logit, the
            // mixings, each softmax head's exponential and each output
            // head's accumulation.
            let (q, v) = (&operands[0], &operands[2]);
            let (b, hq, s, d, e, ho) = (q[0], q[1], q[2], q[3], v[3], out[1]);
            let hs = f.mix.logits.map_or(hq, |c| operands[3 + c][1]);
            let pairs = b as f64 * visible_pairs(mask, s, v[2]);
            let mixing = f.mix.logits.map_or(0, |_| 2 * hq * hs) + f.mix.probs.map_or(0, |_| 2 * hs * ho);
            let fns = function_ops(&Some(f.clone()), false);
            kernel(pairs * ((hq * 2 * d + mixing + 5 * hs + 2 * ho * e) as f64 + hq as f64 * fns))
        }
        Op::Attention { mask, fns, .. } => {
            let (q, v) = (&operands[0], &operands[2]);
            let (b, h, s, d, e) = (q[0], q[1], q[2], q[3], v[3]);
            let pairs = (b * h) as f64 * visible_pairs(mask, s, v[2]);
            kernel(pairs * (2.0 * d as f64 + 2.0 * e as f64 + 5.0 + function_ops(fns, false)))
        }
        Op::AttentionLse { mask, fns, .. }
        | Op::AttentionDelta { mask, fns, .. }
        | Op::AttentionGrad { mask, fns, .. } => {
            let (q, k) = (&operands[0], &operands[1]);
            let (b, h, s, d) = (q[0], q[1], q[2], q[3]);
            let pairs = (b * h) as f64 * visible_pairs(mask, s, k[2]);
            // The backward recomputes the scores and multiplies twice more per operand.
            let per_pair = if matches!(op, Op::AttentionLse { .. }) {
                2.0 * d as f64 + 3.0 + function_ops(fns, false)
            } else {
                6.0 * d as f64 + 5.0 + function_ops(fns, true)
            };
            kernel(pairs * per_pair)
        }
        Op::MatMulAt { .. } => kernel(2.0 * numel(&operands[0]) * out[1] as f64),
        Op::MixHeadsT { .. } => kernel(2.0 * numel(&operands[0]) * operands[1][0] as f64),
        Op::MixHeadsGrad { .. } => kernel(2.0 * numel(&operands[1]) * operands[0][1] as f64),
        Op::CollapseT { .. } => kernel(2.0 * numel(out) * operands[1][0] as f64),
        Op::CollapseGrad { .. } => kernel(2.0 * numel(&operands[0]) * out[0] as f64),
        Op::MixColsT { .. } => kernel(2.0 * numel(&operands[0]) * operands[1][0] as f64),
        Op::MixColsGrad { .. } => kernel(2.0 * numel(&operands[0]) * (out[1] * out[2]) as f64),
        Op::CollapseColsGrad { .. } => kernel(2.0 * numel(&operands[1]) * out[1] as f64),
        Op::CollapseRowsGrad { .. } => kernel(2.0 * numel(&operands[0]) * out[1] as f64),
        Op::LooMean { .. } => kernel(2.0 * numel(out)),
        Op::Reduce { .. } => kernel(numel(&operands[0])),
        Op::Binary { .. }
        | Op::Unary { .. }
        | Op::Where { .. }
        | Op::Thresholds { .. }
        | Op::BlockDiag { .. }
        | Op::ConcatCols { .. }
        | Op::Concat { .. } => kernel(numel(out)),
    }
}

/// Which nodes depend on weights (and constants) alone.
pub fn weight_only(p: &Program) -> Vec<bool> {
    let mut w = Vec::with_capacity(p.nodes.len());
    for node in &p.nodes {
        let v = match &node.op {
            Op::Input { index } => p.inputs[*index].weight,
            Op::Scalar { .. } | Op::Constant { .. } => true,
            op => op.operands().iter().all(|o| w[o.0 as usize]),
        };
        w.push(v);
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::MaskKind;

    /// The closed-form row counts agree with `Mask::visible`, pair by pair,
    /// for equal and unequal query and key lengths.
    #[test]
    fn visible_pairs_counts_what_the_mask_shows() {
        for kind in [MaskKind::None, MaskKind::Causal, MaskKind::TokenCausal] {
            for window in [None, Some(1), Some(2), Some(5)] {
                for block in [1u64, 2, 3] {
                    for (tq, tk) in [(1u64, 1u64), (4, 4), (1, 6), (3, 7), (6, 2), (5, 5)] {
                        let mask = Mask { kind, window, block };
                        let (sq, sk) = (tq * block, tk * block);
                        let brute = (0..sq).flat_map(|i| (0..sk).map(move |j| (i, j)));
                        let count = brute.filter(|&(i, j)| mask.visible(i, j, sq, sk)).count();
                        assert_eq!(
                            visible_pairs(&mask, sq as usize, sk as usize),
                            count as f64,
                            "{mask:?} sq = {sq} sk = {sk}"
                        );
                    }
                }
            }
        }
    }
}
