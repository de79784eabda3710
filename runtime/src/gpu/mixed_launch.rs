//! Which kernel runs a launch of head-mixing attention
//! (`KernelSpec::MixedAttention`), with what sizes: the pass (`MixPass`)
//! and the device pick `attention_mixed`, `attention_mixed_tiled` (the
//! CPU drivers' forward and log-sum-exp, bound in vectors: `cpu_body`) or a
//! backward pass of `attention_mixed_grad`.

use super::func::{fns_of, Fns, Hook};
use super::kernels::Stored;
use super::kit::launch::Dims;
use super::{attention_mixed, attention_mixed_grad, attention_mixed_tiled};
use crate::gpu::kernels::Vecs;
use attnc_compiler::plan::{line_size, AttnShape, Dtype, KernelSpec, MixPass, MixTiles, RowView, MIX_UNITS};
use cubecl::prelude::*;

/// Whether `spec` runs on the CPU drivers' kernel
/// (`attention_mixed_tiled`): head mixing's forward or log-sum-exp with
/// GEMMs not `staged`, planes of `plane` units, and heads within
/// `plan::MIX_CPU_FLOATS`.
pub(super) fn on_cpu(spec: &KernelSpec, staged: bool, plane: u32) -> bool {
    match *spec {
        KernelSpec::MixedAttention { ref shape, mix, pass: MixPass::Forward | MixPass::Lse, .. } => {
            !staged && plane > 1 && mix.on_cpu(shape.h, shape.d, shape.e)
        }
        _ => false,
    }
}

/// `spec` as the CPU kernel tiles it on planes of `plane` units
/// (`MixTiles::on_cpu_planes`): more query rows a cube.
pub(super) fn cpu_tiling(spec: &KernelSpec, plane: u32) -> KernelSpec {
    let mut spec = spec.clone();
    if let KernelSpec::MixedAttention { ref shape, ref mut mix, .. } = spec {
        *mix = mix.on_cpu_planes([shape.h, shape.d, shape.e, shape.s], plane as usize);
    }
    spec
}

/// The line size the CPU kernel loads and stores rows in: the widest that
/// divides `d`, `e` and every offset and stride of its views.
pub(super) fn cpu_lines(spec: &KernelSpec) -> usize {
    let KernelSpec::MixedAttention { ref shape, q, k: kv, v, out, pass, .. } = *spec else { return 1 };
    let lse = pass == MixPass::Lse;
    let views: &[RowView] = if lse { &[q, kv] } else { &[q, kv, v, out] };
    let mut ns = vec![shape.d, if lse { shape.d } else { shape.e }];
    for view in views {
        ns.extend([view.offset, view.batch, view.head, view.outer, view.inner]);
    }
    line_size(&ns)
}

/// Whether binding `slot` of the CPU kernel of `pass` (`operands` bindings
/// before the output) holds scalars: the captures (the mixing matrices
/// among them) and a log-sum-exp's output; the rows are vectors.
pub(super) fn cpu_scalar_binding(pass: MixPass, slot: usize, operands: usize) -> bool {
    slot >= pass.operands() && (pass == MixPass::Lse || slot < operands)
}

/// Head mixing's functions over the capture buffers `caps` as two hooks:
/// the score function alone (of a query head) and the mask function alone
/// (of a softmax head); empty where the spec has none.
pub(super) fn hooks(shape: &AttnShape, caps: &[NativeExpand<[Stored]>], dtype: Dtype) -> [Hook; 2] {
    let f = shape.fns.as_ref().expect("head mixing is in the functions");
    let fns = fns_of(f, caps, dtype);
    [true, false].map(|score| {
        let keep = if score { f.score.is_some() } else { f.mask.is_some() };
        Hook(keep.then(|| {
            let (score, mask) = if score { (fns.score.clone(), None) } else { (None, fns.mask.clone()) };
            std::rc::Rc::new(Fns { score, mask, tiles: None, ..fns_of(f, caps, dtype) })
        }))
    })
}

/// The kernels' sizes of head mixing of `shape`, tiled by `mix`, folding
/// `fold` cubes into the grid's x.
fn mix_dims(shape: &AttnShape, mix: MixTiles, fold: usize) -> attention_mixed::MixDims {
    let g = Dims::of(shape, mix.tile, mix.rows, 1, fold);
    let MixTiles { hs, ho, hv, logits, probs, .. } = mix;
    attention_mixed::MixDims { g, hs, ho, hv, logits, probs, units: MIX_UNITS }
}

/// The mixing matrices among the captures `caps` (`fallback` where the spec
/// gives none: never read).
fn matrices<'a, T>(shape: &AttnShape, caps: &'a [T], fallback: &'a T) -> (&'a T, &'a T) {
    let f = shape.fns.as_ref().expect("head mixing is in the functions");
    let matrix = |c: Option<usize>| c.map_or(fallback, |c| &caps[c]);
    (matrix(f.mix.logits), matrix(f.mix.probs))
}

/// Attention mixing heads inside the softmax (`attention_mixed`) on
/// devices that stage tiles in shared memory, every pass; the backward
/// passes everywhere: `q`, `k`, `v` (not for the log-sum-exp), then the
/// captures, the mixing matrices among them; the score and mask functions
/// as two hooks (the score is of a query head, the mask of a softmax head:
/// `hooks`, made by `define`).
#[allow(clippy::too_many_arguments)]
pub(super) fn body(
    scope: &Scope,
    bufs: &[NativeExpand<[Stored]>],
    mut out: NativeExpand<[Stored]>,
    shape: &AttnShape,
    mix: MixTiles,
    views: [RowView; 4],
    pass: MixPass,
    fold: usize,
    [sc, mk]: [Hook; 2],
) {
    let m = mix_dims(shape, mix, fold);
    let (wl, wp) = matrices(shape, &bufs[pass.operands()..], &bufs[0]);
    let (q, kb, scale) = (&bufs[0], &bufs[1], shape.scale());
    // Operands a pass does not bind are never read: `q` stands in.
    let at = |i: usize| if i < pass.operands() { &bufs[i] } else { &bufs[0] };
    let (v, dout, lse, delta) = (at(2), at(3), at(4), at(5));
    let slopes = shape.fns.as_ref().is_some_and(|f| f.score.is_some());
    let x = attention_mixed::MixBufsExpand { q, k: kb, v, dout, lse, delta, wl, wp };
    let args = attention_mixed::MixArgs { views, scale, score: sc, mask: mk };
    match pass {
        MixPass::Forward | MixPass::Lse => {
            attention_mixed::mixed::expand(scope, &x, &mut out, m, args, pass == MixPass::Lse)
        }
        MixPass::GradK | MixPass::GradV => {
            attention_mixed_grad::keys_grad::expand(scope, &x, &mut out, m, args, pass, slopes)
        }
        _ => attention_mixed_grad::rows_grad::expand(scope, &x, &mut out, m, args, pass, slopes),
    }
}

/// Head mixing's forward (into `out`, in vectors of `N`) or log-sum-exp on
/// the CPU drivers' kernel (`attention_mixed_tiled`), on planes of `plane`
/// units: `rows` binds `q`, `k` (and `v` for the forward) in vectors,
/// `scalars` the captures, then a log-sum-exp's output.
pub(super) fn cpu_body<N: Size>(
    scope: &Scope,
    rows: &[Vecs<N>],
    scalars: &[NativeExpand<[Stored]>],
    out: &mut Vecs<N>,
    spec: &KernelSpec,
    plane: u32,
    dtype: Dtype,
) {
    let KernelSpec::MixedAttention { ref shape, mix, q, k: kv, v, out: o, pass } = *spec else {
        unreachable!("the CPU kernel runs head mixing")
    };
    let lanes = N::value();
    let views = [q, kv, v, o].map(|view| view.in_vectors(lanes));
    let lse = pass == MixPass::Lse;
    let caps = &scalars[..scalars.len() - usize::from(lse)];
    let [sc, mk] = hooks(shape, caps, dtype);
    let mut lse_out = scalars.last().expect("a capture or the output").clone_unchecked();
    let m = mix_dims(shape, mix, spec.fold_x());
    let (wl, wp) = matrices(shape, caps, &lse_out);
    let (wl, wp) = (wl.clone_unchecked(), wp.clone_unchecked());
    let (q, kb) = (&rows[0], &rows[1]);
    let v = if lse { q } else { &rows[2] };
    let x = attention_mixed_tiled::MixRowsExpand { q, k: kb, v, wl: &wl, wp: &wp };
    let args = attention_mixed::MixArgs { views, scale: shape.scale(), score: sc, mask: mk };
    attention_mixed_tiled::mixed_rows::expand::<N>(scope, &x, out, &mut lse_out, m, args, lse, plane)
}
