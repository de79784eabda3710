//! The gradient of a tensor that attention's score function reads
//! (`bias[h, i - j + N - 1]`, `slopes[h]`) on the kernels: deterministic, for
//! any number of reads, no float atomics and nothing of size N × N.
//!
//! The gradient sums, over the pairs attention sees, `dS_ij · ∂f/∂read` into
//! the entry each read indexes. Two launches:
//! 1. [`KernelSpec::AttentionReadLines`]: a unit per *line* of pairs of one
//!    (batch, query head) walks it in order, recomputing each pair's
//!    probability and `dS_ij = P_ij (dO_i · v_j − D_i)` as the backward
//!    does, and sums `dS_ij · ∂f/∂read_r` per read `r` of the tensor. Lines
//!    are chosen so that every pair of a line reads the same entry
//!    ([`Lines::of`]): query rows when no read's index depends on `j`, key
//!    rows when none depends on `i`, diagonals (`j − i` fixed) when the
//!    indices see `i` and `j` only through their difference. It writes
//!    `[reads, batch, h, lines]`.
//! 2. [`KernelSpec::AttentionReadSum`]: a unit per entry of the tensor sums,
//!    in line order, the lines whose read indexes it (each line's index is
//!    evaluated at one of its pairs, clamped into the tensor's shape as the
//!    forward's read is).
//!
//! Any other index (one of `i` and `j` apart from `i − j`) is refused by
//! name (`KernelSpec::kernel_gap`); the interpreter computes it.

use super::{BufferRole, KernelSpec, Planner};
use crate::cost::visible_pairs;
use crate::grad::read_partials;
pub use crate::grad::Lines;
use crate::ir::{AttnArg, Mask};

/// Lines a unit of the second launch sums per loop step (unrolled).
pub const SUM_UNROLL: usize = 8;

/// Reads of capture `capture` in attention launch `spec`'s score function
/// and their lines, where the kernels compute its gradient.
fn read_lines(spec: &KernelSpec, capture: usize) -> Option<(usize, Lines)> {
    let KernelSpec::AttentionGrad { shape, .. } = spec else { return None };
    let f = shape.fns.as_ref()?;
    let lines = Lines::on_kernels(f.score.as_ref(), f.mix, capture)?;
    Some((read_partials(f.score.as_ref()?, capture).len(), lines))
}

impl Planner {
    /// An attention gradient launch `grad` with its bindings, as planned for
    /// dQ: by a capture the kernels differentiate, the first of its two
    /// launches (the module doc) is planned and the second returned, its
    /// work in `work`; anything else is returned as it is.
    pub(super) fn grad_read(
        &mut self,
        grad: KernelSpec,
        mut bindings: Vec<usize>,
        work: &mut Option<(f64, f64)>,
    ) -> (KernelSpec, Vec<usize>) {
        let KernelSpec::AttentionGrad { wrt: AttnArg::Read(capture), .. } = grad else { return (grad, bindings) };
        let Some((reads, lines)) = read_lines(&grad, capture) else { return (grad, bindings) };
        let KernelSpec::AttentionGrad { shape, q, k, v, o, dout, .. } = grad else { unreachable!("matched") };
        let count = lines.count(shape.s, shape.sk);
        let partial = self.buffer(&[reads, shape.batch, shape.h, count], BufferRole::Temp);
        let captures: Vec<usize> = bindings[6..].to_vec();
        bindings.push(partial);
        let f = shape.fns.as_ref().expect("a score function");
        // Per pair: q·k and dO·(v − o) (priced as three dot products), the
        // exponential, the function and its partials.
        let ops = f.score.as_ref().map_or(0, |s| s.body.ops()) * (1 + reads);
        // The pairs the built-in mask lets through (the lines walk its band).
        let mask = Mask { kind: shape.mask, window: shape.window.map(|w| w as _), block: shape.block as _ };
        let pairs = (shape.batch * shape.h) as f64 * visible_pairs(&mask, shape.s, shape.sk);
        let flops = pairs * (2 * shape.d + 4 * shape.e + ops + 4) as f64;
        // Each operand read once (the lines re-read rows from cache), the sums written.
        let (rows, keys) = (shape.batch * shape.h * shape.s, shape.batch * shape.hk * shape.sk);
        let lines_len = shape.batch * shape.h * count;
        let bytes = 4.0 * (rows * (shape.d + 2 * shape.e + 1) + keys * (shape.d + shape.e) + reads * lines_len) as f64;
        let capture_len = f.captures[capture].iter().product::<usize>();
        let spec = KernelSpec::AttentionReadLines { shape: shape.clone(), capture, reads, lines, q, k, v, o, dout };
        self.launch(spec, bindings, flops, bytes);
        // Per entry, each line's index evaluated and compared.
        *work = Some(((capture_len * reads * lines_len * (ops + 2)) as f64, 4.0 * (reads * lines_len) as f64));
        let mut sum_bindings = vec![partial];
        sum_bindings.extend(captures);
        (KernelSpec::AttentionReadSum { shape, capture, reads, lines }, sum_bindings)
    }
}
