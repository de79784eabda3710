//! The float64 reference interpreter: the definition of what every spec
//! means. Kernels and rewrites are tested against it, so it favours plain
//! loops that read like the equations of `docs/semantics.md` over speed.

mod attention;
mod backward;
pub mod func;
mod mixed;

/// The elementwise rules (`ir::scalar`, which score and mask functions and
/// the cost model share).
pub use attnc_compiler::ir::scalar;

pub use func::{Fault, ReadError};
pub mod reach;

use crate::tensor::Tensor;
use attnc_compiler::ir::*;
pub use attnc_compiler::ir::{concrete, DimValues};
use attnc_compiler::plan::{Dtype, Plan};

/// Evaluate `program` on `inputs` (in declaration order); returns the outputs
/// in declaration order. Panics where a score or mask function reads
/// outside a tensor: [`try_evaluate`] returns that as an error.
pub fn evaluate(program: &Program, inputs: &[Tensor], dims: &DimValues) -> Vec<Tensor> {
    try_evaluate(program, inputs, dims).unwrap_or_else(|e| panic!("{e}"))
}

/// [`evaluate`], with a read outside a captured tensor as an error.
pub fn try_evaluate(program: &Program, inputs: &[Tensor], dims: &DimValues) -> Result<Vec<Tensor>, ReadError> {
    evaluate_with(program, inputs, dims, &Rounding { dtype: None, stored: None })
}

/// The same-dtype reference for kernels that store tensors in `dtype`
/// (FlashAttention's test reference): every input and every operation's
/// result rounded to `dtype`, attention's probabilities rounded before they
/// weigh the values; products and softmax statistics stay in float64. It
/// knows nothing of the kernels: it rounds wherever a tensor could be
/// stored. [`evaluate_planned`] rounds where a plan stores.
/// For `tf32` (f32 storage), GEMM operands are rounded to TF32 as the
/// tensor cores read them, and so are attention's backward's (`q`, `k`,
/// `v`, `dO`; not head mixing's). The forward's log-sum-exp stays as the
/// f32 forward computes it.
pub fn evaluate_rounded(program: &Program, inputs: &[Tensor], dims: &DimValues, dtype: Dtype) -> Vec<Tensor> {
    evaluate_with(program, inputs, dims, &Rounding { dtype: Some(dtype), stored: None })
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The same-dtype reference for `plan`'s kernels, which runs `program` in
/// `plan.dtype`: as [`evaluate_rounded`], but a node's value is rounded only
/// where the plan stores it (`Plan::stored`); values that a fused launch
/// keeps in registers (group kernels, GEMM epilogues) stay in float64, as
/// the kernels keep them in f32. Half precision kernels are held to twice
/// this reference's error against [`evaluate`] (see docs/kernels.md, "Half
/// precision"). Rounding where the kernels do not would let the reference's
/// extra roundings cancel by chance where an output is one value broadcast
/// (a group statistic), and so hold the kernels to an error no computation
/// that rounds once could meet.
pub fn evaluate_planned(program: &Program, plan: &Plan, inputs: &[Tensor]) -> Vec<Tensor> {
    assert_eq!(plan.stored.len(), program.nodes.len(), "the plan is of another program");
    evaluate_with(program, inputs, &plan.dims, &Rounding { dtype: Some(plan.dtype), stored: Some(&plan.stored) })
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Where a rounded evaluation rounds: stored values (every node's, or
/// those `stored` marks) to `dtype`, and GEMM operands where they are read
/// in a narrower type than they are stored (TF32).
struct Rounding<'a> {
    dtype: Option<Dtype>,
    stored: Option<&'a [bool]>,
}

impl Rounding<'_> {
    fn store(&self, x: f64) -> f64 {
        self.dtype.map_or(x, |d| crate::dtype::round(d, x))
    }

    /// The type GEMM operands are read in, where narrower than stored.
    fn operand_dtype(&self) -> Option<Dtype> {
        self.dtype.filter(|d| *d == Dtype::Tf32)
    }
}

fn evaluate_with(
    program: &Program,
    inputs: &[Tensor],
    dims: &DimValues,
    rounding: &Rounding,
) -> Result<Vec<Tensor>, ReadError> {
    let round = &|x| rounding.store(x);
    fn operand<'t>(t: &'t Tensor, rounding: &Rounding) -> std::borrow::Cow<'t, Tensor> {
        match rounding.operand_dtype() {
            Some(d) => std::borrow::Cow::Owned(Tensor::new(
                t.shape.clone(),
                t.data.iter().map(|x| crate::dtype::round_operand(d, *x)).collect(),
            )),
            None => std::borrow::Cow::Borrowed(t),
        }
    }
    let mut values: Vec<Tensor> = Vec::with_capacity(program.nodes.len());
    for node in &program.nodes {
        let shape = concrete(&node.shape, dims);
        let v = |id: NodeId| &values[id.0 as usize];
        // The backward's operands as its products read them (TF32: rounded,
        // as on tensor cores; head mixing's kernels multiply in f32).
        let att_operand = |id: &NodeId, fns: &Option<Box<AttnFns>>| match fns.as_ref().is_some_and(|f| f.mixes()) {
            true => std::borrow::Cow::Borrowed(v(*id)),
            false => operand(v(*id), rounding),
        };
        let out = match &node.op {
            Op::Input { index } => inputs[*index].clone(),
            Op::Scalar { value } => Tensor::new(vec![], vec![*value]),
            Op::MatMul { a, b } => matmul(&operand(v(*a), rounding), &operand(v(*b), rounding), shape),
            Op::SplitHeads { x, heads } => split_heads(v(*x), *heads as usize, shape),
            Op::MergeHeads { x } => merge_heads(v(*x), shape),
            Op::MixHeads { x, alpha } => mix_heads(v(*x), v(*alpha), shape),
            Op::Interleave { x } => interleave(v(*x), shape),
            Op::Deinterleave { x, pseudo } => deinterleave(v(*x), *pseudo as usize, shape),
            Op::BlockDiag { r, block } => block_diag(v(*r), *block as usize),
            Op::Collapse { x, r } => collapse(v(*x), v(*r), shape),
            Op::Rope { x, base, offset } => {
                let offset = offset.eval(&|n| dims.get(n).copied()).expect("sizes are checked when dims are bound");
                rope(v(*x), *base, offset as usize, round)
            }
            Op::Paged { cache, pages } => paged(v(*cache), v(*pages), shape),
            Op::Attention { q, k, v: vv, mask, scale, fns } => {
                let sc = scores(program, &values, dims, [v(*q), v(*k)], mask, *scale, fns);
                match fns.as_ref().is_some_and(|f| f.mixes()) {
                    true => mixed::attention(&mixed::Mixed::new(&sc), v(*vv), shape, round)?,
                    false => attention::attention(&sc, v(*vv), shape, round)?,
                }
            }
            Op::Binary { op, a, b } => binary(*op, v(*a), v(*b), shape),
            Op::Unary { op, x } => unary(*op, v(*x)),
            Op::Constant { values, .. } => Tensor::new(shape, values.clone()),
            Op::Reduce { x, kind, axes, .. } => reduce(v(*x), *kind, axes, shape),
            Op::LooMean { x, axis } => loo_mean(v(*x), *axis),
            Op::Where { cond, a, b } => select(v(*cond), v(*a), v(*b), shape),
            Op::Thresholds { x, levels } => thresholds(v(*x), *levels as usize, shape),
            Op::MixCols { y, alpha } => mix_cols(v(*y), v(*alpha), shape),
            Op::CollapseCols { y, r } => collapse_cols(v(*y), v(*r), shape),
            Op::CollapseRows { w, r } => collapse_rows(v(*w), v(*r), shape),
            // Row-major data is unchanged by these: only the shape differs.
            Op::UnflattenHeads { x, .. } | Op::FlattenHeads { x } => Tensor::new(shape, v(*x).data.clone()),
            Op::ConcatCols { a, b } => v(*a).concat(v(*b), v(*a).shape.len() - 1),
            Op::Concat { a, b, axis } => v(*a).concat(v(*b), *axis),
            Op::SliceCols { x, start, len } => {
                slice(v(*x), v(*x).shape.len() - 1, *start as usize, *len as usize, shape)
            }
            Op::Slice { x, axis, at_end, .. } => {
                let (whole, len) = (v(*x).shape[*axis], shape[*axis]);
                slice(v(*x), *axis, if *at_end { whole - len } else { 0 }, len, shape)
            }
            Op::Transpose { x } => backward::transpose(v(*x), shape),
            Op::MatMulAt { a, b } => backward::matmul_at(&operand(v(*a), rounding), &operand(v(*b), rounding), shape),
            Op::Unsqueeze { x, .. } => Tensor::new(shape, v(*x).data.clone()),
            Op::MixHeadsT { y, alpha } => backward::mix_heads_t(v(*y), v(*alpha), shape),
            Op::MixHeadsGrad { x, dy } => backward::mix_heads_grad(v(*x), v(*dy), shape),
            Op::CollapseT { dy, r, .. } => backward::collapse_t(v(*dy), v(*r), shape),
            Op::CollapseGrad { x, dy } => backward::collapse_grad(v(*x), v(*dy), shape),
            Op::AttentionLse { q, k, mask, scale, fns } => {
                let sc = scores(program, &values, dims, [v(*q), v(*k)], mask, *scale, fns);
                match fns.as_ref().is_some_and(|f| f.mixes()) {
                    true => mixed::lse(&mixed::Mixed::new(&sc), shape)?,
                    false => backward::attention_lse(&sc, shape)?,
                }
            }
            Op::MixColsT { dy, alpha } => backward::mix_cols_t(v(*dy), v(*alpha), shape),
            Op::MixColsGrad { y, dy, .. } => backward::mix_cols_grad(v(*y), v(*dy), shape),
            Op::CollapseColsGrad { y, dy, .. } => backward::collapse_cols_grad(v(*y), v(*dy), shape),
            Op::CollapseRowsGrad { w, dy, .. } => backward::collapse_rows_grad(v(*w), v(*dy), shape),
            Op::AttentionDelta { q, k, v: vv, dout, lse, mask, scale, fns } => {
                let sc = scores(program, &values, dims, [v(*q), v(*k)], mask, *scale, fns);
                mixed::delta(&mixed::Mixed::new(&sc), [v(*vv), v(*dout), v(*lse)], shape)?
            }
            Op::AttentionGrad { q, k, v: vv, o, dout, lse, mask, scale, wrt, fns } => {
                let (qr, kr) = (att_operand(q, fns), att_operand(k, fns));
                let sc = scores(program, &values, dims, [&qr, &kr], mask, *scale, fns);
                match fns.as_ref().is_some_and(|f| f.mixes()) {
                    true => mixed::grad(&mixed::Mixed::new(&sc), [v(*vv), v(*dout), v(*lse)], *wrt, shape)?,
                    false => {
                        let (vr, dor) = (att_operand(vv, fns), att_operand(dout, fns));
                        backward::attention_grad(&sc, [&vr, v(*o), &dor, v(*lse)], *wrt, shape)?
                    }
                }
            }
        };
        debug_assert_eq!(out.shape, concrete(&node.shape, dims), "interpreter produced a shape other than the IR's");
        let mut out = out;
        // Integer inputs are exact in every plan (`plan::INTEGER_DIGITS`).
        let integers =
            matches!(node.op, Op::Input { index } if matches!(program.inputs[index].domain, Domain::Integers { .. }));
        if rounding.stored.is_none_or(|s| s[values.len()]) && !integers {
            out.data.iter_mut().for_each(|x| *x = round(*x));
        }
        values.push(out);
    }
    Ok(program.outputs.iter().map(|(_, id)| values[id.0 as usize].clone()).collect())
}

/// `out[b, h, t] = cache[pages[b, t / PS], t % PS, h]` (docs/semantics.md §8).
/// Block tables are checked before a run (`bind::check_tables`); an entry
/// outside the cache is clamped here, as the kernels do.
fn paged(cache: &Tensor, pages: &Tensor, shape: Vec<usize>) -> Tensor {
    let [blocks, ps, h, d] = cache.shape[..] else { unreachable!("a paged cache has rank 4") };
    let slots = pages.shape[1];
    let mut out = Tensor::zeros(shape);
    let rows = slots * ps;
    for (i, o) in out.data.iter_mut().enumerate() {
        let (c, t, hh, b) = (i % d, (i / d) % rows, (i / (d * rows)) % h, i / (d * rows * h));
        let p = (pages.data[b * slots + t / ps].max(0.0) as usize).min(blocks - 1);
        *o = cache.data[((p * ps + t % ps) * h + hh) * d + c];
    }
    out
}

fn matmul(a: &Tensor, b: &Tensor, shape: Vec<usize>) -> Tensor {
    let (k, f) = (b.shape[0], b.shape[1]);
    let rows = a.len() / k;
    let mut out = Tensor::zeros(shape);
    for r in 0..rows {
        for c in 0..f {
            let mut acc = 0.0;
            for i in 0..k {
                acc += a.data[r * k + i] * b.data[i * f + c];
            }
            out.data[r * f + c] = acc;
        }
    }
    out
}

fn split_heads(x: &Tensor, heads: usize, shape: Vec<usize>) -> Tensor {
    let r = x.shape.len();
    let (s, w) = (x.shape[r - 2], x.shape[r - 1]);
    let d = w / heads;
    let pre = x.len() / (s * w);
    let mut out = Tensor::zeros(shape);
    for p in 0..pre {
        for si in 0..s {
            for h in 0..heads {
                for e in 0..d {
                    out.data[((p * heads + h) * s + si) * d + e] = x.data[(p * s + si) * w + h * d + e];
                }
            }
        }
    }
    out
}

fn merge_heads(x: &Tensor, shape: Vec<usize>) -> Tensor {
    let r = x.shape.len();
    let (heads, s, d) = (x.shape[r - 3], x.shape[r - 2], x.shape[r - 1]);
    let pre = x.len() / (heads * s * d);
    let mut out = Tensor::zeros(shape);
    for p in 0..pre {
        for h in 0..heads {
            for si in 0..s {
                for e in 0..d {
                    out.data[(p * s + si) * heads * d + h * d + e] = x.data[((p * heads + h) * s + si) * d + e];
                }
            }
        }
    }
    out
}

fn mix_heads(x: &Tensor, alpha: &Tensor, shape: Vec<usize>) -> Tensor {
    let (b, m, s, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (h, p) = (alpha.shape[1], alpha.shape[2]);
    let mut out = Tensor::zeros(shape);
    for bi in 0..b {
        for hi in 0..h {
            for j in 0..p {
                for si in 0..s {
                    for e in 0..d {
                        let mut acc = 0.0;
                        for mi in 0..m {
                            acc += alpha.data[(mi * h + hi) * p + j] * x.data[((bi * m + mi) * s + si) * d + e];
                        }
                        out.data[(((bi * h + hi) * p + j) * s + si) * d + e] = acc;
                    }
                }
            }
        }
    }
    out
}

fn interleave(x: &Tensor, shape: Vec<usize>) -> Tensor {
    let (b, h, p, s, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3], x.shape[4]);
    let mut out = Tensor::zeros(shape);
    for bh in 0..b * h {
        for j in 0..p {
            for si in 0..s {
                for e in 0..d {
                    out.data[(bh * s * p + si * p + j) * d + e] = x.data[((bh * p + j) * s + si) * d + e];
                }
            }
        }
    }
    out
}

fn deinterleave(x: &Tensor, p: usize, shape: Vec<usize>) -> Tensor {
    let (b, h, sp, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let s = sp / p;
    let mut out = Tensor::zeros(shape);
    for bh in 0..b * h {
        for j in 0..p {
            for si in 0..s {
                for e in 0..d {
                    out.data[((bh * p + j) * s + si) * d + e] = x.data[(bh * sp + si * p + j) * d + e];
                }
            }
        }
    }
    out
}

fn block_diag(r: &Tensor, block: usize) -> Tensor {
    let cols = r.shape[1];
    let mut out = r.clone();
    for (i, v) in out.data.iter_mut().enumerate() {
        if (i % cols) / block != i / cols {
            *v = 0.0;
        }
    }
    out
}

fn collapse(x: &Tensor, r: &Tensor, shape: Vec<usize>) -> Tensor {
    let (b, hs, p, s, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3], x.shape[4]);
    let h = r.shape[0];
    let mut out = Tensor::zeros(shape);
    for bi in 0..b {
        for hi in 0..h {
            for si in 0..s {
                for e in 0..d {
                    let mut acc = 0.0;
                    for hp in 0..hs {
                        for j in 0..p {
                            acc += r.data[hi * hs * p + hp * p + j]
                                * x.data[((((bi * hs + hp) * p + j) * s) + si) * d + e];
                        }
                    }
                    out.data[((bi * h + hi) * s + si) * d + e] = acc;
                }
            }
        }
    }
    out
}

/// `round` applies to the cosines and sines, which a same-dtype computation
/// keeps in its storage type (as the kernels' table does).
fn rope(x: &Tensor, base: f64, offset: usize, round: &dyn Fn(f64) -> f64) -> Tensor {
    let r = x.shape.len();
    let (s, d) = (x.shape[r - 2], x.shape[r - 1]);
    let half = d / 2;
    let mut out = x.clone();
    for row in 0..x.len() / d {
        let pos = (offset + row % s) as f64;
        for i in 0..half {
            let angle = pos * base.powf(-2.0 * i as f64 / d as f64);
            let (sin, cos) = angle.sin_cos();
            let (sin, cos) = (round(sin), round(cos));
            let (a, b) = (x.data[row * d + i], x.data[row * d + i + half]);
            out.data[row * d + i] = a * cos - b * sin;
            out.data[row * d + i + half] = a * sin + b * cos;
        }
    }
    out
}

/// `round` applies to the probabilities before they weigh the values.
/// Attention's scores of operands `q`, `k` with the functions' environment.
fn scores<'a>(
    program: &'a Program,
    values: &'a [Tensor],
    dims: &'a DimValues,
    [q, k]: [&'a Tensor; 2],
    mask: &'a Mask,
    scale: f64,
    fns: &'a Option<Box<AttnFns>>,
) -> attention::Scores<'a> {
    let fns = fns.as_deref().map(|f| (f, func::Env::new(program, f, values, dims)));
    attention::Scores::new([q, k], mask, scale, fns)
}

/// Row-major strides of `shape` aligned to `rank` axes, 0 on broadcast axes.
fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let pad = out.len() - shape.len();
    let mut strides = vec![0; out.len()];
    let mut acc = 1;
    for i in (0..shape.len()).rev() {
        strides[pad + i] = if shape[i] == 1 && out[pad + i] != 1 { 0 } else { acc };
        acc *= shape[i];
    }
    strides
}

/// `out[i] = f(operands at i)` under numpy broadcasting.
fn broadcast_map(shape: Vec<usize>, operands: &[&Tensor], f: impl Fn(&[f64]) -> f64) -> Tensor {
    let strides: Vec<Vec<usize>> = operands.iter().map(|t| broadcast_strides(&t.shape, &shape)).collect();
    let mut out = Tensor::zeros(shape.clone());
    let mut idx = vec![0usize; shape.len()];
    let mut args = vec![0.0; operands.len()];
    for o in out.data.iter_mut() {
        for ((arg, t), st) in args.iter_mut().zip(operands).zip(&strides) {
            *arg = t.data[idx.iter().zip(st).map(|(i, s)| i * s).sum::<usize>()];
        }
        *o = f(&args);
        for axis in (0..shape.len()).rev() {
            idx[axis] += 1;
            if idx[axis] < shape[axis] {
                break;
            }
            idx[axis] = 0;
        }
    }
    out
}

fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, shape: Vec<usize>) -> Tensor {
    broadcast_map(shape, &[a, b], |v| scalar::binary(op, v[0], v[1]))
}

fn select(cond: &Tensor, a: &Tensor, b: &Tensor, shape: Vec<usize>) -> Tensor {
    broadcast_map(shape, &[cond, a, b], |v| if v[0] != 0.0 { v[1] } else { v[2] })
}

/// For each element of a tensor of `shape`, the flat index of the reduction
/// slot it falls into when `axes` are reduced.
fn reduction_slots(shape: &[usize], axes: &[usize]) -> Vec<usize> {
    let n: usize = shape.iter().product();
    let mut slots = Vec::with_capacity(n);
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        let mut slot = 0;
        for (axis, (&i, &len)) in idx.iter().zip(shape).enumerate() {
            if !axes.contains(&axis) {
                slot = slot * len + i;
            }
        }
        slots.push(slot);
        for axis in (0..shape.len()).rev() {
            idx[axis] += 1;
            if idx[axis] < shape[axis] {
                break;
            }
            idx[axis] = 0;
        }
    }
    slots
}

fn reduce(x: &Tensor, kind: ReduceKind, axes: &[usize], shape: Vec<usize>) -> Tensor {
    let slots = reduction_slots(&x.shape, axes);
    let count: usize = axes.iter().map(|a| x.shape[*a]).product();
    let mut out = Tensor::zeros(shape);
    match kind {
        ReduceKind::Sum | ReduceKind::Mean | ReduceKind::Var { .. } => {
            for (v, s) in x.data.iter().zip(&slots) {
                out.data[*s] += v;
            }
            if kind != ReduceKind::Sum {
                out.data.iter_mut().for_each(|v| *v /= count as f64);
            }
            if let ReduceKind::Var { bessel } = kind {
                let mean = out.data.clone();
                out.data.iter_mut().for_each(|v| *v = 0.0);
                for (v, s) in x.data.iter().zip(&slots) {
                    out.data[*s] += (v - mean[*s]) * (v - mean[*s]);
                }
                let n = if bessel { count as f64 - 1.0 } else { count as f64 };
                out.data.iter_mut().for_each(|v| *v /= n);
            }
        }
        ReduceKind::Max | ReduceKind::Min => {
            let max = kind == ReduceKind::Max;
            out.data.iter_mut().for_each(|v| *v = if max { f64::NEG_INFINITY } else { f64::INFINITY });
            for (v, s) in x.data.iter().zip(&slots) {
                out.data[*s] = if max { out.data[*s].max(*v) } else { out.data[*s].min(*v) };
            }
        }
        ReduceKind::Count => {
            for (v, s) in x.data.iter().zip(&slots) {
                out.data[*s] += f64::from(u8::from(*v != 0.0));
            }
        }
    }
    out
}

fn loo_mean(x: &Tensor, axis: usize) -> Tensor {
    let slots = reduction_slots(&x.shape, &[axis]);
    let n = x.shape[axis] as f64;
    let mut sums = vec![0.0; x.len() / x.shape[axis].max(1)];
    for (v, s) in x.data.iter().zip(&slots) {
        sums[*s] += v;
    }
    let data = x.data.iter().zip(&slots).map(|(v, s)| (sums[*s] - v) / (n - 1.0)).collect();
    Tensor { shape: x.shape.clone(), data }
}

fn thresholds(x: &Tensor, levels: usize, shape: Vec<usize>) -> Tensor {
    let data = x.data.iter().flat_map(|v| (2..=levels).map(move |tau| f64::from(u8::from(*v >= tau as f64)))).collect();
    Tensor::new(shape, data)
}

fn unary(op: UnaryOp, x: &Tensor) -> Tensor {
    Tensor { shape: x.shape.clone(), data: x.data.iter().map(|v| scalar::unary(op, *v)).collect() }
}

fn mix_cols(y: &Tensor, alpha: &Tensor, shape: Vec<usize>) -> Tensor {
    let (m, h, p) = (alpha.shape[0], alpha.shape[1], alpha.shape[2]);
    let cols = *y.shape.last().unwrap();
    let d = cols / m;
    let out_cols = h * p * d;
    let mut out = Tensor::zeros(shape);
    for row in 0..y.len() / cols {
        for hi in 0..h {
            for j in 0..p {
                for e in 0..d {
                    let mut acc = 0.0;
                    for mi in 0..m {
                        acc += alpha.data[(mi * h + hi) * p + j] * y.data[row * cols + mi * d + e];
                    }
                    out.data[row * out_cols + (hi * p + j) * d + e] = acc;
                }
            }
        }
    }
    out
}

fn collapse_cols(y: &Tensor, r: &Tensor, shape: Vec<usize>) -> Tensor {
    let (h, c) = (r.shape[0], r.shape[1]);
    let cols = *y.shape.last().unwrap();
    let d = cols / c;
    let mut out = Tensor::zeros(shape);
    for row in 0..y.len() / cols {
        for hi in 0..h {
            for e in 0..d {
                let mut acc = 0.0;
                for ci in 0..c {
                    acc += r.data[hi * c + ci] * y.data[row * cols + ci * d + e];
                }
                out.data[row * h * d + hi * d + e] = acc;
            }
        }
    }
    out
}

fn collapse_rows(w: &Tensor, r: &Tensor, shape: Vec<usize>) -> Tensor {
    let (h, c) = (r.shape[0], r.shape[1]);
    let (rows, f) = (w.shape[0], w.shape[1]);
    let d = rows / h;
    let mut out = Tensor::zeros(shape);
    for ci in 0..c {
        for e in 0..d {
            for col in 0..f {
                let mut acc = 0.0;
                for hi in 0..h {
                    acc += r.data[hi * c + ci] * w.data[(hi * d + e) * f + col];
                }
                out.data[(ci * d + e) * f + col] = acc;
            }
        }
    }
    out
}

/// Entries `start .. start + len` of `axis`.
fn slice(x: &Tensor, axis: usize, start: usize, len: usize, shape: Vec<usize>) -> Tensor {
    let rows: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    let f = x.shape[axis] * inner;
    let data =
        (0..rows).flat_map(|r| x.data[r * f + start * inner..r * f + (start + len) * inner].iter().copied()).collect();
    Tensor::new(shape, data)
}
