//! Planning elementwise operations, reductions and gathers: one launch
//! each over the output's entries, its operands read through their layouts
//! (broadcasts and views) where the kernel can, else from row-major copies.
//! A constant scale of a GEMM's result is the GEMM's epilogue instead.

use super::*;

/// The launch of `site`'s node, an operation of this family.
pub(super) fn plan(pl: &mut Planner, site: &mut Site) -> (KernelSpec, Vec<usize>) {
    let Site { p, i, node, shape, shapes, dims, integers, len, operands, .. } = *site;
    let sh = |k: usize| shapes[operands[k].0 as usize].clone();
    match &node.op {
        // `(x @ w) * c`: the GEMM, with the scale in its epilogue.
        Op::Binary { .. } if scale_of(p, i).is_some_and(|(mm, _)| matches!(pl.vals[mm], Val::InEpilogue)) => {
            let (mm, c) = scale_of(p, i).expect("a scaled GEMM");
            let (spec, bindings, gemm) = plan_gemm(pl, p, mm, None, Some(c.to_bits()), false);
            site.fused_work = Some((gemm.flops + len as f64, gemm.bytes));
            (spec, bindings)
        }
        // `x @ w + y`: the GEMM, adding `y` in its epilogue.
        Op::Binary { .. } if addend_of(p, shapes, i).is_some_and(|(mm, _)| matches!(pl.vals[mm], Val::InEpilogue)) => {
            let (mm, y) = addend_of(p, shapes, i).expect("a GEMM and its addend");
            let (spec, mut bindings, gemm) = plan_gemm(pl, p, mm, None, None, true);
            bindings.push(pl.contiguous(y));
            // The product is never stored and read back; the addend is read once.
            site.fused_work = Some((gemm.flops + len as f64, gemm.bytes + 4.0 * len as f64));
            (spec, bindings)
        }
        Op::Binary { op, a, b } => {
            let (ba, va) = pl.read(*a, |l| Some(l.broadcast(shape).view()));
            let (bb, vb) = pl.read(*b, |l| Some(l.broadcast(shape).view()));
            (KernelSpec::Binary { len, op: *op, a: va, b: vb }, vec![ba, bb])
        }
        Op::Unary { op, x } => {
            let (bx, vx) = pl.read(*x, |l| Some(l.view()));
            (KernelSpec::Unary { len, op: *op, x: vx }, vec![bx])
        }
        Op::Where { cond, a, b } => {
            let (bc, vc) = pl.read(*cond, |l| Some(l.broadcast(shape).view()));
            let (ba, va) = pl.read(*a, |l| Some(l.broadcast(shape).view()));
            let (bb, vb) = pl.read(*b, |l| Some(l.broadcast(shape).view()));
            (KernelSpec::Where { len, cond: vc, a: va, b: vb }, vec![bc, ba, bb])
        }
        Op::Thresholds { x, levels } => {
            let spec = KernelSpec::Thresholds { len: sh(0).iter().product(), levels: *levels as usize };
            (spec, vec![pl.contiguous(*x)])
        }
        Op::BlockDiag { r, block } => {
            let sr = sh(0);
            (KernelSpec::BlockDiag { h: sr[0], cols: sr[1], block: *block as usize }, vec![pl.contiguous(*r)])
        }
        Op::ConcatCols { .. } | Op::Concat { .. } => {
            // Along axis k: rows of everything from k on, one after the other.
            let (sa, sb) = (sh(0), sh(1));
            let axis = match node.op {
                Op::Concat { axis, .. } => axis,
                _ => sa.len() - 1,
            };
            let rows = sa[..axis].iter().product();
            let (f1, f2) = (sa[axis..].iter().product(), sb[axis..].iter().product());
            let (a, b) = (operands[0], operands[1]);
            (KernelSpec::Concat { rows, f1, f2 }, vec![pl.contiguous(a), pl.contiguous(b)])
        }
        Op::Paged { cache, pages } => {
            let spec = paged::gather(&sh(0), &sh(1), integers[pages.0 as usize]);
            (spec, vec![pl.contiguous(*cache), pl.contiguous(*pages)])
        }
        Op::Rope { x, base, offset } => {
            let sx = sh(0);
            let r = sx.len();
            let (s, d) = (sx[r - 2], sx[r - 1]);
            let offset = offset.eval(&|n| dims.get(n).copied()).expect("sizes are checked when dims are bound");
            // cos and sin per (row, pair) at position offset + row, in float64 on the host.
            let mut table = Vec::with_capacity(s * d);
            for pos in offset..offset + s as u64 {
                for k in 0..d / 2 {
                    let angle = pos as f64 * base.powf(-2.0 * k as f64 / d as f64);
                    table.extend([angle.cos(), angle.sin()]);
                }
            }
            site.rope_table = Some(table);
            let (bx, vx) = pl.read(*x, |l| Some(l.view()));
            (KernelSpec::Rope { rows: len / d, s, d, base_bits: base.to_bits(), x: vx }, vec![bx])
        }
        Op::Reduce { x, kind, axes, .. } => {
            let sx = sh(0);
            let (bx, (base, inner)) = pl.read(*x, |l| {
                let (base, inner) = l.reduce_views(axes);
                (inner.terms.len() <= 1 || l.is_contiguous()).then_some((base, inner))
            });
            let count = axes.iter().map(|&a| sx[a]).product();
            (KernelSpec::Reduce { len, op: *kind, count, base, inner }, vec![bx])
        }
        Op::LooMean { x, axis } => {
            let sx = sh(0);
            let spec = KernelSpec::LooMean { len, n: sx[*axis], stride: row_major_strides(&sx)[*axis] };
            (spec, vec![pl.contiguous(*x)])
        }
        other => {
            unreachable!("`{}` is not an operation of this family (elementwise, reduction or gather)", other.name())
        }
    }
}
