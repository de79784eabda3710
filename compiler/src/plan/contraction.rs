//! Planning contractions: GEMMs (with a head-mixing or scaling epilogue
//! where the plan fused one), head mixing and collapse, and the transposes
//! and coefficient gradients the backward adds (mixing and collapse with
//! their coefficients read the other way; contractions over batch and tokens).

use super::*;

/// The launch of `site`'s node, an operation of this family.
pub(super) fn plan(pl: &mut Planner, site: &mut Site) -> (KernelSpec, Vec<usize>) {
    let Site { p, i, node, shape, shapes, operands, .. } = *site;
    let sh = |k: usize| shapes[operands[k].0 as usize].clone();
    match &node.op {
        Op::MatMul { .. } => {
            let (spec, bindings, _) = plan_gemm(pl, p, i, None, None, false);
            (spec, bindings)
        }
        Op::MixHeads { x, alpha } if matches!(pl.vals[x.0 as usize], Val::InEpilogue) || pl.kept.contains_key(&i) => {
            let (sx, al) = (sh(0), sh(1));
            let Op::SplitHeads { x: y, .. } = p.nodes[x.0 as usize].op else { unreachable!("a fused head split") };
            // A kept product is stored beside the mixed output (its buffer bound before it).
            let kept = pl.kept.remove(&i);
            let mix = MixEpilogue { m: sx[1], h: al[1], p: al[2], s: sx[2], d: sx[3], keep: kept.is_some() };
            let (spec, bindings, gemm) = plan_gemm(pl, p, y.0 as usize, Some(mix), None, false);
            // The product is not read back; unless kept, it never reaches memory.
            let mixing = op_cost(&node.op, shape, &[sx.clone(), al.clone()]);
            let saved = if kept.is_some() { 4.0 } else { 8.0 } * sx.iter().product::<usize>() as f64;
            site.fused_work = Some((gemm.flops + mixing.flops, gemm.bytes + mixing.bytes - saved));
            (spec, [bindings, vec![pl.contiguous(*alpha)], kept.into_iter().collect()].concat())
        }
        Op::MixHeads { x, alpha } => {
            let (sx, al) = (sh(0), sh(1));
            let (bx, (vx, x_m)) = pl.read(*x, |l| Some((l.view(), l.stride(1)?)));
            let spec =
                KernelSpec::MixHeads { batch: sx[0], m: sx[1], h: al[1], p: al[2], s: sx[2], d: sx[3], x: vx, x_m };
            (spec, vec![bx, pl.contiguous(*alpha)])
        }
        Op::MixCols { y, alpha } => {
            let (sy, al) = (sh(0), sh(1));
            let cols = *sy.last().unwrap();
            let (by, (vy, y_m)) = pl.read(*y, |l| Some((l.view(), l.block_stride(al[0])?)));
            let rows = sy.iter().product::<usize>() / cols;
            let spec = KernelSpec::MixCols { rows, m: al[0], h: al[1], p: al[2], d: cols / al[0], y: vy, y_m };
            (spec, vec![by, pl.contiguous(*alpha)])
        }
        Op::Collapse { x, r } => {
            let (sx, sr) = (sh(0), sh(1));
            let (bx, (vx, x_c)) = pl.read(*x, |l| Some(flat_heads(l)));
            let spec =
                KernelSpec::Collapse { batch: sx[0], h: sr[0], c: sx[1] * sx[2], s: sx[3], d: sx[4], x: vx, x_c };
            (spec, vec![bx, pl.contiguous(*r)])
        }
        Op::CollapseCols { y, r } => {
            let (sy, sr) = (sh(0), sh(1));
            let cols = *sy.last().unwrap();
            let (by, (vy, y_c)) = pl.read(*y, |l| Some((l.view(), l.block_stride(sr[1])?)));
            let rows = sy.iter().product::<usize>() / cols;
            let spec = KernelSpec::CollapseCols { rows, h: sr[0], c: sr[1], d: cols / sr[1], y: vy, y_c };
            (spec, vec![by, pl.contiguous(*r)])
        }
        Op::CollapseRows { w, r } => {
            let (sw, sr) = (sh(0), sh(1));
            let spec = KernelSpec::CollapseRows { h: sr[0], c: sr[1], d: sw[0] / sr[0], f: sw[1] };
            (spec, vec![pl.contiguous(*w), pl.contiguous(*r)])
        }
        // Gradient operations. Transposes of mixing and collapse are
        // mixing and collapse with the coefficients read the other way.
        Op::MixHeadsT { y, alpha } => {
            let (sy, al) = (sh(0), sh(1));
            let (by, (vy, y_c)) = pl.read(*y, |l| Some(flat_heads(l)));
            let spec =
                KernelSpec::Collapse { batch: sy[0], h: al[0], c: sy[1] * sy[2], s: sy[3], d: sy[4], x: vy, x_c: y_c };
            (spec, vec![by, pl.contiguous(*alpha)])
        }
        Op::CollapseT { dy, r, pseudo } => {
            let (sd, sr) = (sh(0), sh(1));
            let (bd, (vd, d_m)) = pl.read(*dy, |l| Some((l.view(), l.stride(1)?)));
            let p = *pseudo as usize;
            let spec =
                KernelSpec::MixHeads { batch: sd[0], m: sr[0], h: sr[1] / p, p, s: sd[2], d: sd[3], x: vd, x_m: d_m };
            (spec, vec![bd, pl.contiguous(*r)])
        }
        Op::MixColsT { dy, alpha } => {
            let (sd, al) = (sh(0), sh(1));
            let (cols, targets) = (*sd.last().unwrap(), al[1] * al[2]);
            let (bd, (vd, d_t)) = pl.read(*dy, |l| Some((l.view(), l.block_stride(targets)?)));
            let rows = sd.iter().product::<usize>() / cols;
            let spec = KernelSpec::CollapseCols { rows, h: al[0], c: targets, d: cols / targets, y: vd, y_c: d_t };
            (spec, vec![bd, pl.contiguous(*alpha)])
        }
        // `aᵀ · b`: the GEMM reading `a`'s columns as its rows.
        Op::MatMulAt { a, b } => {
            let (sa, sb) = (sh(0), sh(1));
            let (kk, f) = (*sa.last().unwrap(), *sb.last().unwrap());
            let rows = sa.iter().product::<usize>().checked_div(kk).unwrap_or(0);
            // `aᵀ` through `a`'s own layout (merged heads, slices): its
            // rows are `a`'s columns and the other way round, no copy.
            let (ba, (a_cols, a_rows)) = pl.read(*a, |l| Some(gemm_a(l)));
            let spec = |(b_rows, b_cols)| KernelSpec::MatMul {
                rows: kk,
                k: rows,
                f,
                a_rows: a_rows.clone(),
                a_cols: a_cols.clone(),
                b_rows,
                b_cols,
                mix: None,
                scale: None,
                add: false,
            };
            let (bb, b_views) = read_gemm_b(pl, *b, &spec);
            (spec(b_views), vec![ba, bb])
        }
        // Coefficient gradients: contractions over batch and tokens.
        Op::MixHeadsGrad { x, dy } => {
            let (sx, sd) = (sh(0), sh(1));
            let ([bx, bd], [a, b]) = viewed(pl, [*x, *dy]);
            let spec = KernelSpec::Contract { rows: sx[0], o1: sx[1], o2: sd[1] * sd[2], inner: sx[2] * sx[3], a, b };
            (spec, vec![bx, bd])
        }
        Op::CollapseGrad { x, dy } => {
            let (sx, sd) = (sh(0), sh(1));
            let ([bd, bx], [a, b]) = viewed(pl, [*dy, *x]);
            let spec = KernelSpec::Contract { rows: sd[0], o1: sd[1], o2: sx[1] * sx[2], inner: sd[2] * sd[3], a, b };
            (spec, vec![bd, bx])
        }
        Op::MixColsGrad { y, dy, m, .. } => {
            let sy = sh(0);
            let cols = *sy.last().unwrap();
            let (o1, o2) = (shape[0], shape[1] * shape[2]);
            let rows = sy.iter().product::<usize>() / cols;
            let ([by, bd], [a, b]) = viewed(pl, [*y, *dy]);
            let spec = KernelSpec::Contract { rows, o1, o2, inner: cols / *m as usize, a, b };
            (spec, vec![by, bd])
        }
        Op::CollapseColsGrad { y, dy, .. } => {
            let sd = sh(1);
            let (o1, o2) = (shape[0], shape[1]);
            let cols = *sd.last().unwrap();
            let rows = sd.iter().product::<usize>() / cols;
            let ([bd, by], [a, b]) = viewed(pl, [*dy, *y]);
            let spec = KernelSpec::Contract { rows, o1, o2, inner: cols / o1, a, b };
            (spec, vec![bd, by])
        }
        Op::CollapseRowsGrad { w, dy, .. } => {
            let sw = sh(0);
            let (o1, o2) = (shape[0], shape[1]);
            let ([bw, bd], [a, b]) = viewed(pl, [*w, *dy]);
            let spec = KernelSpec::Contract { rows: 1, o1, o2, inner: sw[0] / o1 * sw[1], a, b };
            (spec, vec![bw, bd])
        }
        other => unreachable!("`{}` is not an operation of this family (contraction)", other.name()),
    }
}

/// A collapse's operand `[B, H, P, S, d]` (or `[B, C, S, d]`) with its heads
/// flattened: the view of each element and the view of slice `c`'s offset.
fn flat_heads(l: &Layout) -> (View, View) {
    let flat = l.clone().flatten_heads();
    let (sizes, strides): (Vec<usize>, Vec<usize>) = flat.axes[1].iter().copied().unzip();
    (flat.view(), View::new(&sizes, &strides, 0))
}

/// A contraction's operands through their layouts (every layout is a view
/// of the row-major index): their buffers and views.
fn viewed(pl: &mut Planner, ns: [NodeId; 2]) -> ([usize; 2], [View; 2]) {
    let [(b0, v0), (b1, v1)] = ns.map(|n| pl.read(n, |l| Some(l.view())));
    ([b0, b1], [v0, v1])
}
