//! The pair step of a tile: a query row's scores against key rows, through
//! the score function, the mask function and the built-in mask, as one
//! host-assembled step the forward and the backward kernels share (a
//! pair's weight and `dS` are the normaliser's: `norm::prob`,
//! `norm::grad_weight`).

use super::launch::Shape;
use super::mask::{mask_score, mask_tile, seen_or_masked};
use crate::gpu::func::Indices;
use crate::gpu::kernels as k;
use cubecl::prelude::*;

/// [`mask_tile`] over the tile's scores as host-side values: they go through
/// a register array and come back masked (unchanged with no `masked` flag
/// and no mask function). Score and mask functions (`a.fns`) apply first:
/// the score function to every scaled logit, the mask function (its hidden
/// keys set to `mask::MASKED`) on every tile, or, with `hidden` (the tile's
/// classification, `walk::KeyWalk`), only where it may hide a key.
pub fn mask_scores(
    scope: &Scope,
    scores: Vec<NativeExpand<f32>>,
    masked: &Option<NativeExpand<bool>>,
    hidden: Option<NativeExpand<bool>>,
    i: NativeExpand<usize>,
    k0: NativeExpand<usize>,
    a: &Shape,
) -> Vec<NativeExpand<f32>> {
    let bk = scores.len();
    let at = |scope: &Scope, b, h, jj: usize| {
        let j = k::add_index::expand(scope, k0, k::const_index::expand(scope, jj));
        Indices { b, h, i, j }
    };
    let scores = match &a.fns {
        Some(fns) if fns.score.is_some() => {
            let (b, h) = a.cube_head(scope);
            (scores.into_iter().enumerate()).map(|(jj, s)| fns.score(scope, s, &at(scope, b, h, jj))).collect()
        }
        _ => scores,
    };
    let mask_fn = a.fns.as_ref().filter(|f| f.mask.is_some());
    if masked.is_none() && mask_fn.is_none() {
        return scores;
    }
    let mut arr = k::zeros::expand(scope, bk);
    for (jj, sc) in scores.into_iter().enumerate() {
        k::fset::expand(scope, &mut arr, jj, sc);
    }
    if let Some(fns) = mask_fn {
        let apply = |scope: &Scope, arr: &mut NativeExpand<Array<f32>>| {
            let (b, h) = a.cube_head(scope);
            for jj in 0..bk {
                let seen = fns.visible(scope, &at(scope, b, h, jj)).expect("a mask function");
                let v = seen_or_masked::expand(scope, seen, k::fget::expand(scope, arr, jj));
                k::fset::expand(scope, arr, jj, v);
            }
        };
        match hidden {
            Some(hidden) => if_expand(scope, hidden, |scope| apply(scope, &mut arr)),
            None => apply(scope, &mut arr),
        }
    }
    if let Some(masked) = masked {
        mask_tile::expand(scope, &mut arr, *masked, i, k0, bk, a.mask());
    }
    (0..bk).map(|jj| k::fget::expand(scope, &arr, jj)).collect()
}

/// One pair's score where the backward walks pairs one at a time: the score
/// function of the scaled `logit` at `at` (the pair's clamped indices),
/// then the built-in mask of query row `i` against key row `j`, then the
/// mask function.
pub fn pair_score(
    scope: &Scope,
    a: &Shape,
    logit: NativeExpand<f32>,
    i: NativeExpand<usize>,
    j: NativeExpand<usize>,
    at: &Indices,
) -> NativeExpand<f32> {
    let fns = a.fns.as_ref();
    let score = fns.map_or(logit, |f| f.score(scope, logit, at));
    let score = mask_score::expand(scope, score, i, j, 0, a.mask());
    match fns.and_then(|f| f.visible(scope, at)) {
        Some(seen) => seen_or_masked::expand(scope, seen, score),
        None => score,
    }
}

/// `ds` times the score function's slope at `logit` (the pair at `at`);
/// `ds` itself without a score function.
pub fn times_slope(
    scope: &Scope,
    a: &Shape,
    ds: NativeExpand<f32>,
    logit: NativeExpand<f32>,
    at: &Indices,
) -> NativeExpand<f32> {
    match a.fns.as_ref().and_then(|f| f.slope(scope, logit, at)) {
        Some(slope) => k::fmul::expand(scope, ds, slope),
        None => ds,
    }
}
