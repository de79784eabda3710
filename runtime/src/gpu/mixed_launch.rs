//! Which kernel runs a launch of head-mixing attention
//! (`KernelSpec::MixedAttention`), with what sizes: the pass (`MixPass`)
//! and the device pick `attention_mixed`, `attention_mixed_tiled` or a
//! backward pass of `attention_mixed_grad`.

use super::attention_grad::Dims;
use super::func::Hook;
use super::kernels::Stored;
use super::{attention_mixed, attention_mixed_grad, attention_mixed_tiled};
use attnc_compiler::plan::{AttnShape, MixPass, MixTiles, RowView, MIX_UNITS};
use cubecl::prelude::*;

/// Attention mixing heads inside the softmax (`attention_mixed`): `q`, `k`,
/// `v` (not for the log-sum-exp), then the captures, the mixing matrices
/// among them; the score and mask functions as two hooks (the score is of a
/// query head, the mask of a softmax head: `hooks`, made by `define`), the
/// built-in mask `kind` (`kernels::MASK_*`). With `cpu` (devices with
/// planes that do not stage tiles in shared memory: Mesa's CPU drivers) the
/// forward and log-sum-exp run on `attention_mixed_tiled`, on planes of
/// `plane` units.
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
    plane: u32,
    cpu: bool,
    [sc, mk]: [Hook; 2],
    kind: u32,
) {
    let AttnShape { h, hk, s, sk, d, e, window, block, .. } = *shape;
    let f = shape.fns.as_ref().expect("head mixing is in the functions");
    let caps = &bufs[pass.operands()..];
    let g = Dims {
        h,
        hk,
        s,
        sk,
        d,
        e,
        kind,
        window: window.unwrap_or(0),
        block,
        tile: mix.tile,
        fold,
        lanes: 1,
        rows: mix.rows,
    };
    let MixTiles { hs, ho, hv, logits, probs, .. } = mix;
    let m = attention_mixed::MixDims { g, hs, ho, hv, logits, probs, units: MIX_UNITS };
    let matrix = |c: Option<usize>| c.map_or(&bufs[0], |c| &caps[c]);
    let (wl, wp) = (matrix(f.mix.logits), matrix(f.mix.probs));
    let (q, kb, scale) = (&bufs[0], &bufs[1], shape.scale());
    // Operands a pass does not bind are never read: `q` stands in.
    let at = |i: usize| if i < pass.operands() { &bufs[i] } else { &bufs[0] };
    let (v, dout, lse, delta) = (at(2), at(3), at(4), at(5));
    let slopes = f.score.is_some();
    match pass {
        MixPass::Forward | MixPass::Lse if cpu => {
            let lse = pass == MixPass::Lse;
            attention_mixed_tiled::mixed_rows::expand(
                scope, q, kb, v, wl, wp, &mut out, m, views, scale, lse, plane, sc, mk,
            )
        }
        MixPass::Forward | MixPass::Lse => {
            let lse = pass == MixPass::Lse;
            attention_mixed::mixed::expand(scope, q, kb, v, wl, wp, &mut out, m, views, scale, lse, sc, mk)
        }
        MixPass::GradK | MixPass::GradV => attention_mixed_grad::keys_grad::expand(
            scope, q, kb, v, dout, lse, delta, wl, wp, &mut out, m, views, scale, pass, slopes, sc, mk,
        ),
        _ => attention_mixed_grad::rows_grad::expand(
            scope, q, kb, v, dout, lse, delta, wl, wp, &mut out, m, views, scale, pass, slopes, sc, mk,
        ),
    }
}
