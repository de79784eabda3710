//! The backward of attention that mixes heads inside the softmax
//! (`KernelSpec::MixedAttention`'s passes other than the forward;
//! docs/semantics.md §7), fused like the forward: nothing of size rows ×
//! keys is stored, every sum runs in one unit in a fixed order.
//!
//! With `p = exp(s̃ − lse)` recomputed tile by tile from the saved
//! log-sum-exp, `dp̃[g] = dO[g] · v[kv'(g)]`, `dp[h] = Σ_g wp[h, g] dp̃[g]`,
//! `ds̃[h] = p[h] (dp[h] − D[h])` and `ds[m] = f'(s[m]) Σ_h wl[m, h] ds̃[h]`:
//! - over query rows (a cube holds every head of `rows` of them and walks
//!   the key tiles): `D[h] = Σ_j p dp` (`Delta`); `dQ[m] = scale Σ_j ds[m] k`
//!   (`GradQ`); the mixing matrices' gradients per query row,
//!   `Σ_j s[m] ds̃[h]` (`GradLogits`) and `Σ_j p[h] dp̃[g]` (`GradProbs`),
//!   which a reduction sums;
//! - over key rows (a cube holds every head of `rows` key rows and walks
//!   the query tiles that see them): `dK = scale Σ_i Σ_{m of kh} ds[m] q[m]`
//!   (`GradK`) and `dV = Σ_i Σ_{g of vh} p̃[g] dO[g]` (`GradV`).
//!
//! Products are laid out `(query row, head, key)` in shared memory in both
//! orientations, as [`scores`] writes them.

use super::attention_mixed::{
    dot, load_mixing, mix_entry, probabilities, scores, Block, HeadMix, MixArgs, MixBufs, MixDims, Pairs,
};
use super::kernels::{self as k, Stored};
use super::kit::source::view_row;
use super::kit::walk::{key_tiles, query_tiles};
use attnc_compiler::plan::MixPass;
use cubecl::prelude::*;

/// `dp[h]` of row `r` and key `jj` (products `nt` keys wide).
#[cube]
fn dp_of(
    dpt: &[f32],
    wps: &[f32],
    r: usize,
    h: usize,
    jj: usize,
    #[comptime] m: MixDims,
    #[comptime] nt: usize,
) -> f32 {
    let mix = comptime![HeadMix { n_in: m.ho, n_out: m.hs, nt, transposed: true, mixing: m.probs }];
    mix_entry(dpt, wps, r, h, jj, mix)
}

/// `dp̃ = dO[g]_i · v[kv'(g)]_j` for every (query row, output head, key) of
/// the block of rows `at`.
#[cube]
fn products(bufs: &MixBufs, dpt: &mut [f32], at: &Pairs, #[comptime] blk: Block, #[comptime] args: MixArgs) {
    let (dout, v, b, i0, j0) = (bufs.dout, bufs.v, at.b, at.i0, at.j0);
    let (m, nr, nt) = comptime![(blk.m, blk.nr, blk.nt)];
    let (vv, dov) = comptime![(args.views[2], args.views[3])];
    let g = comptime![m.g];
    let (ho, hv, e, units) = comptime![(m.ho, m.hv, g.e, m.units)];
    let n = comptime![nr * ho * nt];
    for it in 0..comptime![n.div_ceil(units)] {
        let idx = UNIT_POS as usize + it * units;
        if idx < n {
            let go = idx / nt % ho;
            let i = min(i0 + idx / comptime![ho * nt], comptime![g.s - 1]);
            let j = min(j0 + idx % nt, comptime![g.sk - 1]);
            let oa = view_row(b, go, i, dov);
            let va = view_row(b, go / comptime![ho / hv], j, vv);
            dpt[idx] = dot(dout, oa, v, va, e);
        }
    }
}

/// `ds̃ = p (dp − D)` into `dst`, then (with `to_scores`) `ds[m] = f'(s[m])
/// Σ_h wl[m, h] ds̃[h]` into `sc`, for query rows (`nr`) against keys (`nt`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn score_grads(
    sc: &mut [f32],
    sl: &[f32],
    pr: &[f32],
    dpt: &[f32],
    dd: &[f32],
    dst: &mut [f32],
    wls: &[f32],
    wps: &[f32],
    #[comptime] m: MixDims,
    #[comptime] nr: usize,
    #[comptime] nt: usize,
    #[comptime] to_scores: bool,
    #[comptime] slopes: bool,
) {
    let (hq, hs, units) = comptime![(m.g.h, m.hs, m.units)];
    let stats = comptime![nr * hs];
    for jj in 0..nt {
        #[unroll]
        for it in 0..comptime![stats.div_ceil(units)] {
            let idx = UNIT_POS as usize + comptime![it * units];
            if idx < stats {
                let dp = dp_of(dpt, wps, idx / hs, idx % hs, jj, m, nt);
                dst[idx * nt + jj] = pr[idx * nt + jj] * (dp - dd[idx]);
            }
        }
    }
    sync_cube();
    if comptime![to_scores] {
        let n = comptime![nr * hq * nt];
        for it in 0..comptime![n.div_ceil(units)] {
            let idx = UNIT_POS as usize + it * units;
            if idx < n {
                let r = idx / comptime![hq * nt];
                let mh = idx / nt % hq;
                let jj = idx % nt;
                let mut x = f32::new(0.0);
                if comptime![m.logits] {
                    #[unroll]
                    for h in 0..hs {
                        x += wls[mh * hs + h] * dst[(r * hs + h) * nt + jj];
                    }
                } else {
                    x = dst[(r * hs + mh) * nt + jj];
                }
                if comptime![slopes] {
                    x *= sl[idx];
                }
                sc[idx] = x;
            }
        }
        sync_cube();
    }
}

/// The passes over query rows: `D`, `dQ`, and the mixing matrices'
/// gradients per query row.
#[cube]
pub fn rows_grad(
    bufs: &MixBufs,
    out: &mut [Stored],
    #[comptime] m: MixDims,
    #[comptime] args: MixArgs,
    #[comptime] pass: MixPass,
    #[comptime] slopes: bool,
) {
    let (views, scale, mask) = comptime![(args.views, args.scale, args.mask.clone())];
    let g = comptime![m.g];
    let (rows, tile, units) = comptime![(g.rows, g.tile, m.units)];
    let (hq, hs, ho, d) = comptime![(g.h, m.hs, m.ho, g.d)];
    let stats = comptime![rows * hs];
    let outs = comptime![match pass {
        MixPass::GradQ => rows * hq * d,
        MixPass::GradLogits => rows * hq * hs,
        MixPass::GradProbs => rows * hs * ho,
        _ => 0,
    }];
    let n_acc = comptime![outs.div_ceil(units).max(1)];
    let b = k::cube_y(comptime![g.fold]);
    let r0 = k::cube_x(comptime![g.fold]) * rows;
    let r1 = min(r0 + comptime![rows - 1], comptime![g.s - 1]);
    let mut sc = Shared::<[f32]>::new_slice(comptime![rows * hq * tile]);
    let mut sl = Shared::<[f32]>::new_slice(comptime![if slopes { rows * hq * tile } else { 1 }]);
    let mut pr = Shared::<[f32]>::new_slice(comptime![rows * hs * tile]);
    let mut dpt = Shared::<[f32]>::new_slice(comptime![rows * ho * tile]);
    let mut dst = Shared::<[f32]>::new_slice(comptime![rows * hs * tile]);
    let mut wls = Shared::<[f32]>::new_slice(comptime![if m.logits { hq * hs } else { 1 }]);
    let mut wps = Shared::<[f32]>::new_slice(comptime![if m.probs { hs * ho } else { 1 }]);
    let mut ls = Shared::<[f32]>::new_slice(stats);
    let mut dd = Shared::<[f32]>::new_slice(stats);
    load_mixing(bufs, &mut wls, &mut wps, m);
    #[unroll]
    for it in 0..comptime![stats.div_ceil(units)] {
        let idx = UNIT_POS as usize + comptime![it * units];
        if idx < stats {
            let at = (b * hs + idx % hs) * comptime![g.s] + min(r0 + idx / hs, comptime![g.s - 1]);
            ls[idx] = f32::cast_from(bufs.lse[at]);
            let mut x = f32::new(0.0);
            if comptime![pass != MixPass::Delta] {
                x = f32::cast_from(bufs.delta[at]);
            }
            dd[idx] = x;
        }
    }
    let mut acc = Array::<f32>::new(n_acc);
    #[unroll]
    for a in 0..n_acc {
        acc[a] = f32::new(0.0);
    }
    sync_cube();
    let band = key_tiles(r0, r1, g);
    for t in band.lo..band.hi {
        let j0 = t * tile;
        let blk = comptime![Block { m, nr: rows, nt: tile, slopes }];
        let at = Pairs { b, i0: r0, j0 };
        scores(bufs, &mut sc, &mut sl, &at, blk, args.clone());
        sync_cube();
        probabilities(&sc, &wls, &ls, &mut pr, &at, blk, mask.clone());
        products(bufs, &mut dpt, &at, blk, args.clone());
        sync_cube();
        if comptime![pass == MixPass::Delta] {
            for jj in 0..tile {
                #[unroll]
                for it in 0..comptime![stats.div_ceil(units)] {
                    let idx = UNIT_POS as usize + comptime![it * units];
                    if idx < stats {
                        dd[idx] += pr[idx * tile + jj] * dp_of(&dpt, &wps, idx / hs, idx % hs, jj, m, tile);
                    }
                }
            }
        } else if comptime![pass == MixPass::GradProbs] {
            for jj in 0..tile {
                #[unroll]
                for a in 0..n_acc {
                    let idx = UNIT_POS as usize + comptime![a * units];
                    if idx < outs {
                        let r = idx / comptime![hs * ho];
                        let h = idx / ho % hs;
                        acc[a] += pr[(r * hs + h) * tile + jj] * dpt[(r * ho + idx % ho) * tile + jj];
                    }
                }
            }
        } else {
            let to_scores = comptime![pass == MixPass::GradQ];
            score_grads(&mut sc, &sl, &pr, &dpt, &dd, &mut dst, &wls, &wps, m, rows, tile, to_scores, slopes);
            for jj in 0..tile {
                #[unroll]
                for a in 0..n_acc {
                    let idx = UNIT_POS as usize + comptime![a * units];
                    if idx < outs {
                        if comptime![pass == MixPass::GradQ] {
                            let r = idx / comptime![hq * d];
                            let mh = idx / d % hq;
                            let j = min(j0 + jj, comptime![g.sk - 1]);
                            let kr = view_row(b, mh / comptime![hq / g.hk], j, comptime![views[1]]);
                            acc[a] += sc[(r * hq + mh) * tile + jj] * f32::cast_from(bufs.k[kr + idx % d]);
                        } else {
                            let r = idx / comptime![hq * hs];
                            let mh = idx / hs % hq;
                            acc[a] += sc[(r * hq + mh) * tile + jj] * dst[(r * hs + idx % hs) * tile + jj];
                        }
                    }
                }
            }
        }
        sync_cube();
    }
    if comptime![pass == MixPass::Delta] {
        #[unroll]
        for it in 0..comptime![stats.div_ceil(units)] {
            let idx = UNIT_POS as usize + comptime![it * units];
            let i = r0 + idx / hs;
            if idx < stats && i < comptime![g.s] {
                out[(b * hs + idx % hs) * comptime![g.s] + i] = Stored::cast_from(dd[idx]);
            }
        }
    } else {
        // dQ row-major [B, H_q, S, d]; the matrices' per-row gradients
        // [B, S, rows, cols]: a unit's item `r·X + x` is row r0 + r's entry x.
        let per_row = comptime![outs / rows];
        #[unroll]
        for a in 0..n_acc {
            let idx = UNIT_POS as usize + comptime![a * units];
            let i = r0 + idx / per_row;
            if idx < outs && i < comptime![g.s] {
                if comptime![pass == MixPass::GradQ] {
                    let mh = idx / d % hq;
                    let at = ((b * hq + mh) * comptime![g.s] + i) * d + idx % d;
                    out[at] = Stored::cast_from(acc[a] * f32::new(scale));
                } else {
                    out[(b * comptime![g.s] + i) * per_row + idx % per_row] = Stored::cast_from(acc[a]);
                }
            }
        }
    }
}

/// The passes over key rows: `dK` and `dV`.
#[cube]
pub fn keys_grad(
    bufs: &MixBufs,
    out: &mut [Stored],
    #[comptime] m: MixDims,
    #[comptime] args: MixArgs,
    #[comptime] pass: MixPass,
    #[comptime] slopes: bool,
) {
    let (views, scale, mask) = comptime![(args.views, args.scale, args.mask.clone())];
    let g = comptime![m.g];
    // `rows` key rows a cube, query tiles of `tile` rows.
    let (nk, nq, units) = comptime![(g.rows, g.tile, m.units)];
    let (hq, hk, hs, ho, hv, d, e) = comptime![(g.h, g.hk, m.hs, m.ho, m.hv, g.d, g.e)];
    let dk = comptime![pass == MixPass::GradK];
    let (heads, width) = comptime![if dk { (hk, d) } else { (hv, e) }];
    let outs = comptime![nk * heads * width];
    let n_acc = comptime![outs.div_ceil(units)];
    let stats = comptime![nq * hs];
    let b = k::cube_y(comptime![g.fold]);
    let j0 = k::cube_x(comptime![g.fold]) * nk;
    let j1 = min(j0 + comptime![nk - 1], comptime![g.sk - 1]);
    let mut sc = Shared::<[f32]>::new_slice(comptime![nq * hq * nk]);
    let mut sl = Shared::<[f32]>::new_slice(comptime![if slopes { nq * hq * nk } else { 1 }]);
    let mut pr = Shared::<[f32]>::new_slice(comptime![nq * hs * nk]);
    let mut dpt = Shared::<[f32]>::new_slice(comptime![nq * ho * nk]);
    let mut dst = Shared::<[f32]>::new_slice(comptime![nq * hs.max(ho) * nk]);
    let mut wls = Shared::<[f32]>::new_slice(comptime![if m.logits { hq * hs } else { 1 }]);
    let mut wps = Shared::<[f32]>::new_slice(comptime![if m.probs { hs * ho } else { 1 }]);
    let mut ls = Shared::<[f32]>::new_slice(stats);
    let mut dd = Shared::<[f32]>::new_slice(stats);
    load_mixing(bufs, &mut wls, &mut wps, m);
    let mut acc = Array::<f32>::new(n_acc);
    #[unroll]
    for a in 0..n_acc {
        acc[a] = f32::new(0.0);
    }
    let band = query_tiles(j0, j1, g);
    for tq in band.lo..band.hi {
        let i0 = tq * nq;
        #[unroll]
        for it in 0..comptime![stats.div_ceil(units)] {
            let idx = UNIT_POS as usize + comptime![it * units];
            if idx < stats {
                let at = (b * hs + idx % hs) * comptime![g.s] + min(i0 + idx / hs, comptime![g.s - 1]);
                ls[idx] = f32::cast_from(bufs.lse[at]);
                dd[idx] = f32::cast_from(bufs.delta[at]);
            }
        }
        let blk = comptime![Block { m, nr: nq, nt: nk, slopes: slopes && dk }];
        let at = Pairs { b, i0, j0 };
        scores(bufs, &mut sc, &mut sl, &at, blk, args.clone());
        sync_cube();
        probabilities(&sc, &wls, &ls, &mut pr, &at, blk, mask.clone());
        products(bufs, &mut dpt, &at, blk, args.clone());
        sync_cube();
        if comptime![dk] {
            score_grads(&mut sc, &sl, &pr, &dpt, &dd, &mut dst, &wls, &wps, m, nq, nk, true, slopes);
        } else {
            // The output heads' mixed probabilities, into `dst`.
            let n = comptime![nq * ho * nk];
            for it in 0..comptime![n.div_ceil(units)] {
                let idx = UNIT_POS as usize + it * units;
                if idx < n {
                    let r = idx / comptime![ho * nk];
                    let go = idx / nk % ho;
                    let jj = idx % nk;
                    let mix = comptime![HeadMix { n_in: hs, n_out: ho, nt: nk, transposed: false, mixing: m.probs }];
                    dst[idx] = mix_entry(&pr, &wps, r, go, jj, mix);
                }
            }
            sync_cube();
        }
        for ii in 0..nq {
            let i = min(i0 + ii, comptime![g.s - 1]);
            #[unroll]
            for a in 0..n_acc {
                let idx = UNIT_POS as usize + comptime![a * units];
                if idx < outs {
                    let jj = idx / comptime![heads * width];
                    let hh = idx / width % heads;
                    let c = idx % width;
                    if comptime![dk] {
                        #[unroll]
                        for gm in 0..comptime![hq / hk] {
                            let mh = hh * comptime![hq / hk] + gm;
                            let qa = view_row(b, mh, i, comptime![views[0]]);
                            acc[a] += sc[(ii * hq + mh) * nk + jj] * f32::cast_from(bufs.q[qa + c]);
                        }
                    } else {
                        #[unroll]
                        for gm in 0..comptime![ho / hv] {
                            let go = hh * comptime![ho / hv] + gm;
                            let oa = view_row(b, go, i, comptime![views[3]]);
                            acc[a] += dst[(ii * ho + go) * nk + jj] * f32::cast_from(bufs.dout[oa + c]);
                        }
                    }
                }
            }
        }
        sync_cube();
    }
    #[unroll]
    for a in 0..n_acc {
        let idx = UNIT_POS as usize + comptime![a * units];
        let j = j0 + idx / comptime![heads * width];
        if idx < outs && j < comptime![g.sk] {
            let hh = idx / width % heads;
            let at = ((b * heads + hh) * comptime![g.sk] + j) * width + idx % width;
            let mut x = acc[a];
            if comptime![dk] {
                x *= f32::new(scale);
            }
            out[at] = Stored::cast_from(x);
        }
    }
}
