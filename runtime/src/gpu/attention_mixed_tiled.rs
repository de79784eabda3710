//! Head-mixing attention's forward and log-sum-exp for Mesa's CPU drivers
//! (devices with planes that do not stage tiles in shared memory), in the manner of
//! `attention_tiled.rs`: no shared memory, no barrier.
//!
//! Each unit owns one query row of the cube's `rows` for *every* head: its
//! scaled queries and its output accumulators live in registers, as do the
//! mixing matrices. Both walks go key by key over the band of keys some
//! row of the cube sees. Per key, each key (then value) row is loaded once
//! per plane, every lane loading a share and plane broadcasts passing the
//! rest; the unit computes every query head's logit (then the score
//! function), mixes them by `mix_logits`, masks per softmax head, and in the
//! first walk updates each softmax head's running maximum and sum (one
//! exponential a head and key). The second walk turns the mixed logits into
//! probabilities with the first walk's log-sum-exp, mixes them by
//! `mix_probs` and adds them times the value rows to the accumulators.
//! Every sum runs in one unit in key order: results are deterministic.
//!
//! The launch's cube has `MIX_UNITS` units (the GPU kernel's,
//! `attention_mixed.rs`); the first `rows` of them, or a whole plane when
//! the cube has fewer rows, walk the keys, the others walk none (their loop
//! is empty, which Mesa's drivers skip).

use super::attention::{log_sum_exp, view_row};
use super::attention_grad::{key_tiles, NO_KEYS};
use super::attention_mixed::{seen, MixDims};
use super::func::{score_hook, Hook};
use super::kernels::{self as k, Stored, M_INIT};
use attnc_compiler::plan::RowView;
use cubecl::prelude::*;

/// Units of a cube that walk the keys: its `rows` (a power of two), at
/// least a plane of `plane` units, at most the cube's `units`.
pub fn walking_units(rows: usize, plane: u32, units: usize) -> usize {
    rows.max(plane as usize).min(units)
}

/// Row `at ..` (`n` floats) of `x` into `row` for every unit of a plane of
/// `plane`: each lane loads its share, broadcasts pass the others (1:
/// every unit loads the whole row).
#[cube]
fn load_row(x: &[Stored], at: usize, lane: usize, row: &mut Array<f32>, #[comptime] n: usize, #[comptime] plane: u32) {
    if comptime![plane <= 1] {
        #[unroll]
        for c in 0..n {
            row[c] = f32::cast_from(x[at + c]);
        }
    } else {
        let per = comptime![n.div_ceil(plane as usize)];
        let mut held = Array::<f32>::new(per);
        #[unroll]
        for t in 0..per {
            held[t] = f32::cast_from(x[at + min(lane * per + t, comptime![n - 1])]);
        }
        #[unroll]
        for c in 0..n {
            row[c] = plane_broadcast(held[comptime![c % per]], comptime![(c / per) as u32]);
        }
    }
}

/// The `n` entries of a small matrix, in registers (none read for 0: an
/// identity the spec does not give).
#[cube]
fn held_matrix(src: &[Stored], #[comptime] n: usize) -> Array<f32> {
    let mut a = Array::<f32>::new(comptime![n.max(1)]);
    #[unroll]
    for x in 0..n {
        a[x] = f32::cast_from(src[x]);
    }
    a
}

/// Every softmax head's mixed logit `sm[h]` of query row `i` (queries
/// `qr`, pre-scaled, `[H_q, d]`) against key row `j`; `s` and `krow` are
/// scratch.
#[cube]
#[allow(clippy::too_many_arguments)]
fn mixed_logits(
    qr: &Array<f32>,
    kb: &[Stored],
    wls: &Array<f32>,
    s: &mut Array<f32>,
    sm: &mut Array<f32>,
    krow: &mut Array<f32>,
    b: usize,
    i: usize,
    j: usize,
    lane: usize,
    #[comptime] m: MixDims,
    #[comptime] kv: RowView,
    #[comptime] plane: u32,
    #[comptime] score: Hook,
) {
    let (hq, hk, hs, d) = comptime![(m.g.h, m.g.hk, m.hs, m.g.d)];
    let group = comptime![hq / hk];
    #[unroll]
    for kh in 0..hk {
        load_row(kb, view_row(b, kh, j, kv), lane, krow, d, plane);
        #[unroll]
        for mm in 0..group {
            let mh = comptime![kh * group + mm];
            let mut x = f32::new(0.0);
            #[unroll]
            for c in 0..d {
                x += qr[comptime![mh * d + c]] * krow[c];
            }
            s[mh] = score_hook(x, b, mh, i, j, score.clone());
        }
    }
    #[unroll]
    for h in 0..hs {
        if comptime![m.logits] {
            let mut x = f32::new(0.0);
            #[unroll]
            for mh in 0..hq {
                x += wls[comptime![mh * hs + h]] * s[mh];
            }
            sm[h] = x;
        } else {
            sm[h] = s[h];
        }
    }
}

/// The forward (or, with `lse`, each softmax head's log-sum-exp,
/// row-major `[B, H_s, S]`) of attention mixing heads by `wl` and `wp`, on
/// planes of `plane` units.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn mixed_rows(
    q: &[Stored],
    kb: &[Stored],
    v: &[Stored],
    wl: &[Stored],
    wp: &[Stored],
    out: &mut [Stored],
    #[comptime] m: MixDims,
    #[comptime] views: [RowView; 4],
    #[comptime] scale: f32,
    #[comptime] lse: bool,
    #[comptime] plane: u32,
    #[comptime] score: Hook,
    #[comptime] mask: Hook,
) {
    let g = comptime![m.g];
    let (rows, tile) = comptime![(g.rows, g.tile)];
    let (hq, hs, ho, hv, d, e) = comptime![(g.h, m.hs, m.ho, m.hv, g.d, g.e)];
    let b = k::cube_y(comptime![g.fold]);
    let r0 = k::cube_x(comptime![g.fold]) * rows;
    let u = UNIT_POS as usize;
    let i = min(r0 + min(u, comptime![rows - 1]), comptime![g.s - 1]);
    let lane = k::plane_lane(plane);
    let wls = held_matrix(wl, comptime![if m.logits { hq * hs } else { 0 }]);
    let wps = held_matrix(wp, comptime![if m.probs { hs * ho } else { 0 }]);
    let mut qr = Array::<f32>::new(comptime![hq * d]);
    #[unroll]
    for mh in 0..hq {
        let at = view_row(b, mh, i, comptime![views[0]]);
        #[unroll]
        for c in 0..d {
            qr[comptime![mh * d + c]] = f32::cast_from(q[at + c]) * f32::new(scale);
        }
    }
    // The keys some row of the cube sees; none for the units that do not walk.
    let band = key_tiles(r0, min(r0 + comptime![rows - 1], comptime![g.s - 1]), g);
    let j0 = band.lo * tile;
    let mut j1 = max(min(band.hi * tile, comptime![g.sk]), j0);
    if u >= comptime![walking_units(rows, plane, m.units)] {
        j1 = j0;
    }
    let mut s = Array::<f32>::new(hq);
    let mut sm = Array::<f32>::new(hs);
    let mut krow = Array::<f32>::new(d);
    // The first walk: each softmax head's running maximum and sum.
    let mut mx = Array::<f32>::new(hs);
    let mut l = Array::<f32>::new(hs);
    #[unroll]
    for h in 0..hs {
        mx[h] = f32::new(M_INIT);
        l[h] = f32::new(0.0);
    }
    for j in j0..j1 {
        mixed_logits(&qr, kb, &wls, &mut s, &mut sm, &mut krow, b, i, j, lane, m, views[1], plane, score.clone());
        #[unroll]
        for h in 0..hs {
            if seen(b, h, i, j, g, mask.clone()) {
                let x = sm[h];
                let gap = x - mx[h];
                let t = (f32::new(0.0) - gap.abs()).exp();
                if gap > f32::new(0.0) {
                    l[h] = l[h] * t + f32::new(1.0);
                    mx[h] = x;
                } else {
                    l[h] += t;
                }
            }
        }
    }
    // The log-sum-exp, in place of the maximum.
    #[unroll]
    for h in 0..hs {
        mx[h] = log_sum_exp(mx[h], l[h], NO_KEYS);
    }
    let stores = u < rows && r0 + u < comptime![g.s];
    if comptime![lse] {
        if stores {
            #[unroll]
            for h in 0..hs {
                out[(b * hs + h) * comptime![g.s] + r0 + u] = Stored::cast_from(mx[h]);
            }
        }
    } else {
        // The second walk: probabilities, mixed, times the values.
        let mut acc = Array::<f32>::new(comptime![ho * e]);
        #[unroll]
        for x in 0..comptime![ho * e] {
            acc[x] = f32::new(0.0);
        }
        let mut p = Array::<f32>::new(hs);
        let mut pt = Array::<f32>::new(ho);
        let mut vrow = Array::<f32>::new(e);
        let group = comptime![ho / hv];
        for j in j0..j1 {
            mixed_logits(&qr, kb, &wls, &mut s, &mut sm, &mut krow, b, i, j, lane, m, views[1], plane, score.clone());
            #[unroll]
            for h in 0..hs {
                let mut x = f32::new(0.0);
                if seen(b, h, i, j, g, mask.clone()) {
                    x = (sm[h] - mx[h]).exp();
                }
                p[h] = x;
            }
            #[unroll]
            for go in 0..ho {
                if comptime![m.probs] {
                    let mut x = f32::new(0.0);
                    #[unroll]
                    for h in 0..hs {
                        x += wps[comptime![h * ho + go]] * p[h];
                    }
                    pt[go] = x;
                } else {
                    pt[go] = p[go];
                }
            }
            #[unroll]
            for vh in 0..hv {
                load_row(v, view_row(b, vh, j, comptime![views[2]]), lane, &mut vrow, e, plane);
                #[unroll]
                for gg in 0..group {
                    let go = comptime![vh * group + gg];
                    let w = pt[go];
                    #[unroll]
                    for c in 0..e {
                        acc[comptime![go * e + c]] += w * vrow[c];
                    }
                }
            }
        }
        if stores {
            #[unroll]
            for go in 0..ho {
                let at = view_row(b, go, r0 + u, comptime![views[3]]);
                #[unroll]
                for c in 0..e {
                    out[at + c] = Stored::cast_from(acc[comptime![go * e + c]]);
                }
            }
        }
    }
}
