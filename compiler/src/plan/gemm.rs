//! Planning GEMMs: how a matrix product reads its operands through their
//! layouts, and what a product's epilogue can absorb: a constant factor, or
//! an addend of its shape.

use super::{KernelSpec, Layout, MixEpilogue, Planner, View};
use crate::cost::op_cost;
use crate::ir::{BinaryOp, NodeId, Op, Program};

/// A GEMM's `a` operand: the view of each row's start and of each column
/// within a row.
pub(super) fn gemm_a(l: &Layout) -> (View, View) {
    let r = l.axes.len();
    let (sizes, strides): (Vec<usize>, Vec<usize>) = l.axes[..r - 1].iter().flatten().copied().unzip();
    let (cs, cst): (Vec<usize>, Vec<usize>) = l.axes[r - 1].iter().copied().unzip();
    (View::new(&sizes, &strides, l.offset), View::new(&cs, &cst, 0))
}

/// A GEMM's `b` operand `[…, k, f]` through its layout (rows and columns
/// views, as [`gemm_a`]) where that keeps the kernel's line size (`spec` of
/// the views is the GEMM), else a row-major copy: a transposed weight or
/// merged heads are read in place, a layout that would make the kernel
/// scalar is copied.
pub(super) fn read_gemm_b(
    pl: &mut Planner,
    b: NodeId,
    spec: &impl Fn((View, View)) -> KernelSpec,
) -> (usize, (View, View)) {
    let best = spec(gemm_a(&Layout::contiguous(&pl.shapes[b.0 as usize]))).line_size();
    pl.read(b, |l| {
        let views = gemm_a(l);
        (spec(views.clone()).line_size() >= best).then_some(views)
    })
}

/// The GEMM of node `mm` (its operands read through their layouts) with an
/// epilogue, its bindings and the product's own work.
pub(super) fn plan_gemm(
    pl: &mut Planner,
    p: &Program,
    mm: usize,
    mix: Option<MixEpilogue>,
    scale: Option<u64>,
    add: bool,
) -> (KernelSpec, Vec<usize>, crate::cost::OpCost) {
    let Op::MatMul { a, b } = p.nodes[mm].op else { unreachable!("node {mm} is a GEMM") };
    let (sa, sb) = (pl.shapes[a.0 as usize].clone(), pl.shapes[b.0 as usize].clone());
    let k = *sa.last().unwrap();
    let (ba, (a_rows, a_cols)) = pl.read(a, |l| Some(gemm_a(l)));
    let rows = sa.iter().product::<usize>() / k;
    let spec = |(b_rows, b_cols)| KernelSpec::MatMul {
        rows,
        k,
        f: sb[1],
        a_rows: a_rows.clone(),
        a_cols: a_cols.clone(),
        b_rows,
        b_cols,
        mix,
        scale,
        add,
    };
    let (bb, b_views) = read_gemm_b(pl, b, &spec);
    let spec = spec(b_views);
    let work = op_cost(&p.nodes[mm].op, &pl.shapes[mm], &[sa, sb]);
    (spec, vec![ba, bb], work)
}

/// For `x @ w + y` or `y + x @ w` at node `n`: the product's node and the
/// addend `y`, which has the sum's shape (no broadcast) and is not the product.
pub(super) fn addend_of(p: &Program, shapes: &[Vec<usize>], n: usize) -> Option<(usize, NodeId)> {
    let Op::Binary { op: BinaryOp::Add, a, b } = p.nodes[n].op else { return None };
    let product = |x: NodeId| matches!(p.nodes[x.0 as usize].op, Op::MatMul { .. }).then_some(x.0 as usize);
    let (mm, y) = match (product(a), product(b)) {
        (Some(x), _) => (x, b),
        (None, Some(x)) => (x, a),
        _ => return None,
    };
    let same = shapes[y.0 as usize] == shapes[n] && shapes[mm] == shapes[n];
    (same && y.0 as usize != mm).then_some((mm, y))
}

/// For `(x @ w) * c`, `c * (x @ w)` or `(x @ w) / c` at node `n` with a
/// constant `c`: the product's node and the factor.
pub(super) fn scale_of(p: &Program, n: usize) -> Option<(usize, f64)> {
    let Op::Binary { op, a, b } = p.nodes[n].op else { return None };
    let constant = |x: NodeId| match p.nodes[x.0 as usize].op {
        Op::Scalar { value } => Some(value),
        _ => None,
    };
    let product = |x: NodeId| matches!(p.nodes[x.0 as usize].op, Op::MatMul { .. }).then_some(x.0 as usize);
    match op {
        BinaryOp::Mul => match (product(a), product(b)) {
            (Some(x), _) => Some((x, constant(b)?)),
            (None, Some(x)) => Some((x, constant(a)?)),
            _ => None,
        },
        BinaryOp::Div => Some((product(a)?, 1.0 / constant(b)?)),
        _ => None,
    }
}
