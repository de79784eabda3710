//! Planning attention: the forward kernel (tiled, or with heads mixed inside
//! it), the log-sum-exp and delta rows the backward saves, and the backward
//! launches by operand (FlashAttention's dQ and dK/dV, mixed backward
//! passes, and the gradients of tensors a score function reads).

use super::*;

/// The launch of `site`'s node, an operation of this family.
pub(super) fn plan(pl: &mut Planner, site: &mut Site) -> (KernelSpec, Vec<usize>) {
    let Site { p, i, node, shapes, dims, integers, readers, operands, .. } = *site;
    let sh = |k: usize| shapes[operands[k].0 as usize].clone();
    match &node.op {
        Op::Attention { q, k, v, mask, scale, fns } => {
            let (sq, sk, sv) = (sh(0), sh(1), sh(2));
            let (bq, vq) = pl.read(*q, Layout::row_view);
            let ((bk, vk), (bv, vv), paged) = paged::keys_values(pl, p, [*k, *v], integers);
            if let Some((s, w)) = reader_layout(p, readers, shapes, i) {
                (site.out_shape, site.out_layout) = (s, w);
            }
            let out = site.out_layout.row_view().expect("attention writes rows of its output contiguously");
            let shape = attn_shape(&sq, &sk, sv[3], mask, *scale, kernel_fns(fns, shapes, dims, integers));
            let spec = match MixTiles::of(fns.as_deref(), shapes, &sq, &sv) {
                Some(mix) => {
                    KernelSpec::MixedAttention { shape, mix, q: vq, k: vk, v: vv, out, pass: MixPass::Forward }
                }
                None => {
                    let paged_rows = paged.map(|(r, _)| r);
                    KernelSpec::Attention {
                        shape,
                        q: vq,
                        k: vk,
                        v: vv,
                        out,
                        fragments: false,
                        split: 0,
                        kv: None,
                        paged: paged_rows,
                        lse: false,
                    }
                }
            };
            let mut bindings = vec![bq, bk, bv];
            bindings.extend(fns.iter().flat_map(|f| f.captures.iter()).map(|c| pl.contiguous(*c)));
            bindings.extend(paged.map(|(_, t)| pl.contiguous(t)));
            (spec, bindings)
        }
        Op::AttentionLse { q, k, mask, scale, fns } => {
            let (sq, sk) = (sh(0), sh(1));
            let (bq, vq) = pl.read(*q, Layout::row_view);
            let (bk, vk) = pl.read(*k, Layout::row_view);
            let shape = attn_shape(&sq, &sk, 0, mask, *scale, kernel_fns(fns, shapes, dims, integers));
            let spec = match MixTiles::of(fns.as_deref(), shapes, &sq, &sk) {
                Some(mix) => {
                    KernelSpec::MixedAttention { shape, mix, q: vq, k: vk, v: vk, out: vq, pass: MixPass::Lse }
                }
                None => KernelSpec::AttentionLse { shape, q: vq, k: vk, tile: grad_key_tile(sq[3], 0), split: 0 },
            };
            let mut bindings = vec![bq, bk];
            bindings.extend(fns.iter().flat_map(|f| f.captures.iter()).map(|c| pl.contiguous(*c)));
            (spec, bindings)
        }
        Op::AttentionDelta { q, k, v, dout, lse, mask, scale, fns } => {
            let shape = attn_shape(&sh(0), &sh(1), sh(2)[3], mask, *scale, kernel_fns(fns, shapes, dims, integers));
            pl.mixed_backward(shape, MixPass::Delta, fns, shapes, [*q, *k, *v, *dout], &[*lse])
        }
        Op::AttentionGrad { q, k, v, o, dout, lse, mask, scale, wrt, fns }
            if MixPass::of(*wrt, fns.as_deref()).is_some() =>
        {
            let shape = attn_shape(&sh(0), &sh(1), sh(2)[3], mask, *scale, kernel_fns(fns, shapes, dims, integers));
            let pass = MixPass::of(*wrt, fns.as_deref()).expect("a pass");
            pl.mixed_backward(shape, pass, fns, shapes, [*q, *k, *v, *dout], &[*lse, *o])
        }
        Op::AttentionGrad { o, dout, lse, wrt: AttnArg::Read(c), fns: Some(f), .. } if f.sink == Some(*c) => {
            let (sq, sv) = (sh(0), sh(2));
            let (bo, vo) = pl.read(*o, Layout::row_view);
            let (bd, vd) = pl.read(*dout, Layout::row_view);
            let spec = KernelSpec::SinkGrad { batch: sq[0], h: sq[1], s: sq[2], e: sv[3], o: vo, dout: vd };
            (spec, vec![bo, bd, pl.contiguous(*lse), pl.contiguous(f.captures[*c])])
        }
        Op::AttentionGrad { q, k, v, o, dout, lse, mask, scale, wrt, fns } => {
            let (sq, sk, sv) = (sh(0), sh(1), sh(2));
            // dQ, dK or dV in the layout of a head merge that reads it.
            let rows = matches!(wrt, AttnArg::Q | AttnArg::K | AttnArg::V);
            if let Some((s, w)) = reader_layout(p, readers, shapes, i).filter(|_| rows) {
                (site.out_shape, site.out_layout) = (s, w);
            }
            let mut views = vec![];
            let mut bindings = vec![];
            for x in [q, k, v, if sh(3).len() == 4 { o } else { dout }, dout] {
                let (b, view) = pl.read(*x, Layout::row_view);
                bindings.push(b);
                views.push(view);
            }
            bindings.push(pl.contiguous(*lse));
            if *wrt == AttnArg::V {
                // dV reads neither v nor o (wgpu drops unread bindings).
                bindings.drain(2..4);
            }
            bindings.extend(fns.iter().flat_map(|f| f.captures.iter()).map(|c| pl.contiguous(*c)));
            let spec = KernelSpec::AttentionGrad {
                shape: attn_shape(&sq, &sk, sv[3], mask, *scale, kernel_fns(fns, shapes, dims, integers)),
                wrt: *wrt,
                q: views[0],
                k: views[1],
                v: views[2],
                o: views[3],
                dout: views[4],
                tile: grad_key_tile(sq[3], sv[3]),
                split: 0,
                out: site.out_layout.row_view().unwrap_or(views[0]),
                dv: None,
                fragments: false,
                tf32: false,
            };
            pl.grad_read(spec, bindings, &mut site.fused_work)
        }
        other => unreachable!("`{}` is not an operation of this family (attention)", other.name()),
    }
}
