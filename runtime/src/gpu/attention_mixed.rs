//! Attention that mixes heads inside the softmax (Talking-Heads and
//! Differential attention; `KernelSpec::MixedAttention`, docs/semantics.md
//! §7), fused: nothing of size rows × keys is stored.
//!
//! Each softmax head's row needs every query head's logits, so a cube owns
//! `rows` query rows of one batch *for every head*. It walks the key tiles
//! twice. For each tile, the units compute the scores of every (row, query
//! head, key) into shared memory; then each (row, softmax head) mixes them
//! by `mix_logits` and, in the first walk, updates its running maximum and
//! sum (the online softmax). In the second walk, each (row, softmax head)
//! writes its probabilities `exp(s̃ − lse)` for the tile, each (row, output
//! head, key) mixes them by `mix_probs`, and each unit adds its (row,
//! output head, channel) outputs' share of the tile's values to
//! accumulators held in registers. With `lse`, the kernel stops after the
//! first walk and writes each softmax head's log-sum-exp (what the backward
//! saves). Every sum runs in one unit in a fixed order: results are
//! deterministic. Work items are spread over the cube's units; loops over
//! a tile's keys and over the (row, head) items run, the channels of a dot
//! product (up to 64 at a time) and a unit's statistics and accumulators
//! are unrolled (`MixTiles::loop_trips` counts the loops for Mesa's bound).

use super::func::{score_hook, slope_hook, Hook};
use super::kernels::{self as k, Stored};
use super::kit::launch::Dims;
use super::kit::mask::{sees, unmasked};
use super::kit::norm::{self, live, push, Norm};
use super::kit::source::view_row;
use super::kit::walk::key_tiles;
use attnc_compiler::plan::{grad_chunk, RowView};
use cubecl::prelude::*;

/// The comptime sizes of a mixed attention launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MixDims {
    /// Query heads (`h`), key heads, lengths, widths, the mask, key rows a
    /// tile (`tile`), query rows a cube (`rows`); `lanes` is 1.
    pub g: Dims,
    /// Softmax, output and value heads.
    pub hs: usize,
    pub ho: usize,
    pub hv: usize,
    /// Whether `mix_logits` and `mix_probs` are given (else the identity).
    pub logits: bool,
    pub probs: bool,
    pub units: usize,
}

/// The bindings of the `#[cube]` head-mixing kernels: q, k, v, the output's
/// gradient, the saved log-sum-exp and `D`, and the two mixing matrices
/// (a pass that does not read one binds `q` in its place).
#[derive(CubeType)]
pub struct MixBufs<'a> {
    pub q: &'a [Stored],
    pub k: &'a [Stored],
    pub v: &'a [Stored],
    pub dout: &'a [Stored],
    pub lse: &'a [Stored],
    pub delta: &'a [Stored],
    pub wl: &'a [Stored],
    pub wp: &'a [Stored],
}

/// The comptime arguments of a head-mixing launch beside its [`MixDims`]:
/// the layouts of q, k, v and the output (or `dO`), the scale, and the
/// score function and mask function as hooks.
#[derive(Clone)]
pub struct MixArgs {
    pub views: [RowView; 4],
    pub scale: f32,
    pub score: Hook,
    pub mask: Hook,
}

/// Whether softmax head `h`'s query row `i` sees key row `j`: the built-in
/// mask and the mask function (`mask`, a hook without a score function).
#[cube]
pub(super) fn seen(b: usize, h: usize, i: usize, j: usize, #[comptime] g: Dims, #[comptime] mask: Hook) -> bool {
    let mut ok = false;
    if j < comptime![g.sk] {
        if sees(i, j, comptime![g.mask()]) {
            ok = unmasked(score_hook(f32::new(0.0), b, h, i, j, mask));
        }
    }
    ok
}

/// A block of query rows `i0 ..` of batch `b` against key rows `j0 ..`.
#[derive(CubeType)]
pub(super) struct Pairs {
    pub b: usize,
    pub i0: usize,
    pub j0: usize,
}

/// The sizes of a [`Pairs`] block of a launch of `m`: `nr` query rows by
/// `nt` keys; `slopes`: the score function's derivative is wanted too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Block {
    pub m: MixDims,
    pub nr: usize,
    pub nt: usize,
    pub slopes: bool,
}

/// The scores of a block of rows `at` for every query head, `sc[(r·H_q +
/// m)·nt + jj]`: scaled logits, then the score function (a hook without a
/// mask function); with `slopes`, also its derivative at each logit into `sl`.
#[cube]
pub(super) fn scores(
    bufs: &MixBufs,
    sc: &mut [f32],
    sl: &mut [f32],
    at: &Pairs,
    #[comptime] blk: Block,
    #[comptime] args: MixArgs,
) {
    let (q, kb, b, i0, j0) = (bufs.q, bufs.k, at.b, at.i0, at.j0);
    let (m, nr, nt, slopes) = comptime![(blk.m, blk.nr, blk.nt, blk.slopes)];
    let (qv, kv, scale, score) = comptime![(args.views[0], args.views[1], args.scale, args.score.clone())];
    let g = comptime![m.g];
    let (hq, units, d) = comptime![(g.h, m.units, g.d)];
    let n = comptime![nr * hq * nt];
    for it in 0..comptime![n.div_ceil(units)] {
        let idx = UNIT_POS as usize + it * units;
        if idx < n {
            let r = idx / comptime![hq * nt];
            let mh = idx / nt % hq;
            let i = min(i0 + r, comptime![g.s - 1]);
            let j = min(j0 + idx % nt, comptime![g.sk - 1]);
            let qa = view_row(b, mh, i, qv);
            let ka = view_row(b, mh / comptime![g.h / g.hk], j, kv);
            let logit = dot(q, qa, kb, ka, d) * f32::new(scale);
            sc[idx] = score_hook(logit, b, mh, i, j, score.clone());
            if comptime![slopes] {
                sl[idx] = slope_hook(f32::new(1.0), logit, b, mh, i, j, score.clone());
            }
        }
    }
}

/// `Σ_c x[xa + c] · y[ya + c]` over `n` channels: unrolled, in chunks of
/// `grad_chunk(n)` past 64 (each chunk a loop trip).
#[cube]
pub(super) fn dot(x: &[Stored], xa: usize, y: &[Stored], ya: usize, #[comptime] n: usize) -> f32 {
    let ch = comptime![grad_chunk(n)];
    let mut acc = f32::new(0.0);
    if comptime![ch == n] {
        #[unroll]
        for c in 0..n {
            acc += f32::cast_from(x[xa + c]) * f32::cast_from(y[ya + c]);
        }
    } else {
        for c0 in 0..comptime![n / ch] {
            #[unroll]
            for c in 0..ch {
                let at = c0 * ch + c;
                acc += f32::cast_from(x[xa + at]) * f32::cast_from(y[ya + at]);
            }
        }
    }
    acc
}

/// Softmax head `h`'s mixed logit of row `r` and key `jj` of scores `nt`
/// keys wide ([`scores`]).
#[cube]
fn mixed_logit(
    sc: &[f32],
    wls: &[f32],
    r: usize,
    h: usize,
    jj: usize,
    #[comptime] m: MixDims,
    #[comptime] tile: usize,
) -> f32 {
    let mix = comptime![HeadMix { n_in: m.g.h, n_out: m.hs, nt: tile, transposed: false, mixing: m.logits }];
    mix_entry(sc, wls, r, h, jj, mix)
}

/// How [`mix_entry`] mixes `n_in` heads into `n_out`, rows of `nt` entries:
/// by weights `w[a, h]` (`[n_in, n_out]` row-major), or `transposed`, `w[h,
/// a]` (`[n_out, n_in]`); without `mixing`, the identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct HeadMix {
    pub n_in: usize,
    pub n_out: usize,
    pub nt: usize,
    pub transposed: bool,
    pub mixing: bool,
}

/// Head `h`'s entry `jj` of row `r` mixed from `y` (`[rows, n_in, nt]`):
/// `Σ_a w(a, h) · y[r, a, jj]`, or `y[r, h, jj]` without mixing. Every
/// head-mixing step of the `#[cube]` kernels, forward and backward.
#[cube]
pub(super) fn mix_entry(y: &[f32], w: &[f32], r: usize, h: usize, jj: usize, #[comptime] x: HeadMix) -> f32 {
    let (n_in, n_out, nt) = comptime![(x.n_in, x.n_out, x.nt)];
    let mut v = f32::new(0.0);
    if comptime![x.mixing] {
        #[unroll]
        for a in 0..n_in {
            if comptime![x.transposed] {
                v += w[h * n_in + a] * y[(r * n_in + a) * nt + jj];
            } else {
                v += w[a * n_out + h] * y[(r * n_in + a) * nt + jj];
            }
        }
    } else {
        v = y[(r * n_in + h) * nt + jj];
    }
    v
}

/// The probabilities `pr[(r·H_s + h)·nt + jj]` of a block of rows `at`,
/// from the rows' log-sum-exp `ls[r·H_s + h]`; 0 where the key is hidden or
/// the row is past the queries.
#[cube]
pub(super) fn probabilities(
    sc: &[f32],
    wls: &[f32],
    ls: &[f32],
    pr: &mut [f32],
    at: &Pairs,
    #[comptime] blk: Block,
    #[comptime] mask: Hook,
) {
    let (b, i0, j0) = (at.b, at.i0, at.j0);
    let (m, nr, nt) = comptime![(blk.m, blk.nr, blk.nt)];
    let (hs, units) = comptime![(m.hs, m.units)];
    let stats = comptime![nr * hs];
    for jj in 0..nt {
        #[unroll]
        for it in 0..comptime![stats.div_ceil(units)] {
            let idx = UNIT_POS as usize + comptime![it * units];
            if idx < stats {
                let (r, h) = (idx / hs, idx % hs);
                let i = i0 + r;
                let l = ls[idx];
                let mut p = f32::new(0.0);
                if i < comptime![m.g.s] && live(l) && seen(b, h, i, j0 + jj, m.g, mask.clone()) {
                    p = norm::prob(mixed_logit(sc, wls, r, h, jj, m, nt), l, Norm::Softmax);
                }
                pr[idx * nt + jj] = p;
            }
        }
    }
}

/// The mixing matrices a launch of `m` mixes by, into shared memory: `wl`
/// (`[H_q, H_s]`) and `wp` (`[H_s, H_o]`), each only where given.
#[cube]
pub(super) fn load_mixing(bufs: &MixBufs, wls: &mut [f32], wps: &mut [f32], #[comptime] m: MixDims) {
    let (hq, hs, ho, units) = comptime![(m.g.h, m.hs, m.ho, m.units)];
    if comptime![m.logits] {
        load_matrix(bufs.wl, wls, comptime![hq * hs], units);
    }
    if comptime![m.probs] {
        load_matrix(bufs.wp, wps, comptime![hs * ho], units);
    }
}

/// `dst[i] = src[i]` for the `n` entries of a small matrix, the cube's
/// units sharing the copy.
#[cube]
fn load_matrix(src: &[Stored], dst: &mut [f32], #[comptime] n: usize, #[comptime] units: usize) {
    #[unroll]
    for it in 0..comptime![n.div_ceil(units)] {
        let idx = UNIT_POS as usize + comptime![it * units];
        if idx < n {
            dst[idx] = f32::cast_from(src[idx]);
        }
    }
}

/// The forward (or, with `lse`, each softmax head's log-sum-exp,
/// row-major `[B, H_s, S]`) of attention mixing heads by `wl` and `wp`
/// (unread where `MixDims` says the identity).
#[cube]
pub fn mixed(
    bufs: &MixBufs,
    out: &mut [Stored],
    #[comptime] m: MixDims,
    #[comptime] args: MixArgs,
    #[comptime] lse: bool,
) {
    let mask = comptime![args.mask.clone()];
    let g = comptime![m.g];
    let (rows, tile, units) = comptime![(g.rows, g.tile, m.units)];
    let (hq, hs, ho) = comptime![(g.h, m.hs, m.ho)];
    let stats = comptime![rows * hs];
    let b = k::cube_y(comptime![g.fold]);
    let r0 = k::cube_x(comptime![g.fold]) * rows;
    let r1 = min(r0 + comptime![rows - 1], comptime![g.s - 1]);
    let mut sc = Shared::<[f32]>::new_slice(comptime![rows * hq * tile]);
    let mut sl = Shared::<[f32]>::new_slice(1usize);
    let mut wls = Shared::<[f32]>::new_slice(comptime![if m.logits { hq * hs } else { 1 }]);
    let mut wps = Shared::<[f32]>::new_slice(comptime![if m.probs { hs * ho } else { 1 }]);
    let mut st_m = Shared::<[f32]>::new_slice(stats);
    let mut st_l = Shared::<[f32]>::new_slice(stats);
    load_mixing(bufs, &mut wls, &mut wps, m);
    #[unroll]
    for it in 0..comptime![stats.div_ceil(units)] {
        let idx = UNIT_POS as usize + comptime![it * units];
        if idx < stats {
            st_m[idx] = f32::new(norm::M_INIT);
            st_l[idx] = f32::new(0.0);
        }
    }
    sync_cube();
    let band = key_tiles(r0, r1, g);
    // The first walk: each softmax head's running maximum and sum.
    for t in band.lo..band.hi {
        let blk = comptime![Block { m, nr: rows, nt: tile, slopes: false }];
        scores(bufs, &mut sc, &mut sl, &Pairs { b, i0: r0, j0: t * tile }, blk, args.clone());
        sync_cube();
        for jj in 0..tile {
            let j = t * tile + jj;
            #[unroll]
            for it in 0..comptime![stats.div_ceil(units)] {
                let idx = UNIT_POS as usize + comptime![it * units];
                if idx < stats {
                    let (r, h) = (idx / hs, idx % hs);
                    if seen(b, h, min(r0 + r, comptime![g.s - 1]), j, g, mask.clone()) {
                        let x = mixed_logit(&sc, &wls, r, h, jj, m, tile);
                        let st = push(st_m[idx], st_l[idx], x, Norm::Softmax);
                        st_m[idx] = st.m;
                        st_l[idx] = st.l;
                    }
                }
            }
        }
        sync_cube();
    }
    // The log-sum-exp, in place of the maximum.
    #[unroll]
    for it in 0..comptime![stats.div_ceil(units)] {
        let idx = UNIT_POS as usize + comptime![it * units];
        if idx < stats {
            st_m[idx] = norm::finish_lse(st_m[idx], st_l[idx]);
        }
    }
    sync_cube();
    if comptime![lse] {
        #[unroll]
        for it in 0..comptime![stats.div_ceil(units)] {
            let idx = UNIT_POS as usize + comptime![it * units];
            let r = idx / hs;
            if idx < stats && r0 + r < comptime![g.s] {
                out[(b * hs + idx % hs) * comptime![g.s] + r0 + r] = Stored::cast_from(st_m[idx]);
            }
        }
    } else {
        walk_values(bufs, out, &wls, &wps, &st_m, b, r0, band.lo, band.hi, m, args);
    }
}

/// The second walk: probabilities, mixed by `wps`, times the values,
/// accumulated per (row, output head, channel) and stored.
#[cube]
#[allow(clippy::too_many_arguments)]
fn walk_values(
    bufs: &MixBufs,
    out: &mut [Stored],
    wls: &[f32],
    wps: &[f32],
    lse: &[f32],
    b: usize,
    r0: usize,
    t0: usize,
    t1: usize,
    #[comptime] m: MixDims,
    #[comptime] args: MixArgs,
) {
    let (views, mask) = comptime![(args.views, args.mask.clone())];
    let g = comptime![m.g];
    let (rows, tile, units) = comptime![(g.rows, g.tile, m.units)];
    let (hs, ho, hv, e) = comptime![(m.hs, m.ho, m.hv, g.e)];
    let mixed_n = comptime![rows * ho * tile];
    let outs = comptime![rows * ho * e];
    let n_acc = comptime![outs.div_ceil(units)];
    let mut sc = Shared::<[f32]>::new_slice(comptime![rows * comptime![g.h] * tile]);
    let mut sl = Shared::<[f32]>::new_slice(1usize);
    let mut pr = Shared::<[f32]>::new_slice(comptime![rows * hs * tile]);
    let mut pt = Shared::<[f32]>::new_slice(comptime![if m.probs { mixed_n } else { 1 }]);
    let mut acc = Array::<f32>::new(n_acc);
    #[unroll]
    for a in 0..n_acc {
        acc[a] = f32::new(0.0);
    }
    for t in t0..t1 {
        let blk = comptime![Block { m, nr: rows, nt: tile, slopes: false }];
        let at = Pairs { b, i0: r0, j0: t * tile };
        scores(bufs, &mut sc, &mut sl, &at, blk, args.clone());
        sync_cube();
        probabilities(&sc, wls, lse, &mut pr, &at, blk, mask.clone());
        sync_cube();
        if comptime![m.probs] {
            for it in 0..comptime![mixed_n.div_ceil(units)] {
                let idx = UNIT_POS as usize + it * units;
                if idx < mixed_n {
                    let r = idx / comptime![ho * tile];
                    let go = idx / tile % ho;
                    let jj = idx % tile;
                    let mix = comptime![HeadMix { n_in: hs, n_out: ho, nt: tile, transposed: false, mixing: true }];
                    pt[idx] = mix_entry(&pr, wps, r, go, jj, mix);
                }
            }
            sync_cube();
        }
        for jj in 0..tile {
            let j = t * tile + jj;
            if j < comptime![g.sk] {
                #[unroll]
                for a in 0..n_acc {
                    let idx = UNIT_POS as usize + comptime![a * units];
                    if idx < outs {
                        let go = idx / e % ho;
                        let w = (idx / comptime![ho * e] * ho + go) * tile + jj;
                        let mut p = pr[w];
                        if comptime![m.probs] {
                            p = pt[w];
                        }
                        let vh = go / comptime![ho / hv];
                        acc[a] += p * f32::cast_from(bufs.v[view_row(b, vh, j, comptime![views[2]]) + idx % e]);
                    }
                }
            }
        }
        sync_cube();
    }
    #[unroll]
    for a in 0..n_acc {
        let idx = UNIT_POS as usize + comptime![a * units];
        let r = idx / comptime![ho * e];
        if idx < outs && r0 + r < comptime![g.s] {
            let go = idx / e % ho;
            out[view_row(b, go, r0 + r, comptime![views[3]]) + idx % e] = Stored::cast_from(acc[a]);
        }
    }
}
