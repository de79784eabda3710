//! Head-mixing attention's forward and log-sum-exp for Mesa's CPU drivers
//! (devices with planes that do not stage tiles in shared memory), in the manner of
//! `attention_tiled.rs`: no shared memory, no barrier.
//!
//! One plane walks a cube's keys; each of its units owns [`unit_rows`]
//! query rows of the cube (rows `u`, `u + plane`, …) for *every* head:
//! their scaled queries and output accumulators live in registers, as do
//! the mixing matrices. Both walks go key by key over the band of keys some
//! row of the cube sees. Per key, each key (then value) row is loaded once
//! per plane, every lane loading a share in vectors and plane broadcasts
//! passing the rest, and serves all of the plane's rows (on lavapipe a
//! load costs far more than the arithmetic it feeds, so rows a load set
//! the speed; `plan::MixTiles::on_cpu_planes` picks them). For each row the
//! unit computes every query head's logit (then the score function), mixes
//! them by `mix_logits`, masks per softmax head, and in the first walk
//! updates each softmax head's running maximum and sum (one exponential a
//! head and key). The second walk turns the mixed logits into
//! probabilities with the first walk's log-sum-exp, mixes them by
//! `mix_probs` and adds them times the value rows to the accumulators.
//! Every sum runs in one unit in key order: results are deterministic.
//!
//! Rows are bound in vectors (`mixed_launch::cpu_lines`): Mesa's CPU
//! drivers branch per lane on each load and store, and the shader's
//! branches, not its arithmetic, bound lavapipe's compile time.
//!
//! The launch's cube has `MIX_UNITS` units (the GPU kernel's,
//! `attention_mixed.rs`); its first plane walks the keys, the others walk
//! none (their loop is empty, which Mesa's drivers skip).

use super::attention_mixed::{seen, MixArgs, MixDims};
use super::func::{score_hook, Hook};
use super::kernels::{self as k, Stored};
use super::kit::norm::{self, push, Norm};
use super::kit::source::view_row;
use super::kit::walk::key_tiles;
use attnc_compiler::plan::RowView;
use cubecl::prelude::*;

/// The bindings of the CPU head-mixing kernel: q, k and v in vectors of
/// `N` (the log-sum-exp binds `q` for `v`), and the two mixing matrices.
#[derive(CubeType)]
pub struct MixRows<'a, N: Size> {
    pub q: &'a [Vector<Stored, N>],
    pub k: &'a [Vector<Stored, N>],
    pub v: &'a [Vector<Stored, N>],
    pub wl: &'a [Stored],
    pub wp: &'a [Stored],
}

/// Query rows each walking unit of a cube of `rows` holds (one plane of
/// `plane` units walks; `rows` and `plane` are powers of two).
pub fn unit_rows(rows: usize, plane: u32) -> usize {
    (rows / plane.max(1) as usize).max(1)
}

/// Query row `t` of unit `u` in the cube of `rows` starting at `r0`
/// (clamped into the cube and the `s` query rows): rows `u`, `u + stride`,
/// … of the cube.
#[cube]
fn row_of(
    r0: usize,
    u: usize,
    #[comptime] t: usize,
    #[comptime] rows: usize,
    #[comptime] per: usize,
    #[comptime] s: usize,
) -> usize {
    min(r0 + min(u + comptime![t * (rows / per)], comptime![rows - 1]), comptime![s - 1])
}

/// Row `at ..` (`n` vectors) of `x` into `row` for every unit of a plane
/// of `plane`: each lane loads its share, broadcasts pass the others (1:
/// every unit loads the whole row).
#[cube]
fn load_row<N: Size>(
    x: &[Vector<Stored, N>],
    at: usize,
    lane: usize,
    row: &mut Array<Vector<f32, N>>,
    #[comptime] n: usize,
    #[comptime] plane: u32,
) {
    let per = comptime![if plane <= 1 { n } else { n.div_ceil(plane as usize) }];
    let mut held = Array::<Vector<f32, N>>::new(per);
    #[unroll]
    for t in 0..per {
        held[t] = k::vload_share::<N>(x, at, lane, per, t, n);
    }
    #[unroll]
    for c in 0..n {
        if comptime![plane <= 1] {
            row[c] = held[c];
        } else {
            row[c] = k::from_lane::<N>(held[comptime![c % per]], comptime![(c / per) as u32]);
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

/// Every softmax head's mixed logit `sm[t·H_s + h]` of the unit's query
/// rows `t` ([`unit_rows`] of them; queries `qr`, pre-scaled, `[rows, H_q,
/// d]`) against key row `j` of view `kv`: each key row is loaded once and
/// serves every row; rows in vectors of `N`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn mixed_logits<N: Size>(
    qr: &Array<Vector<f32, N>>,
    kb: &[Vector<Stored, N>],
    wls: &Array<f32>,
    sm: &mut Array<f32>,
    j: usize,
    #[comptime] m: MixDims,
    #[comptime] kv: RowView,
    #[comptime] plane: u32,
    #[comptime] score: Hook,
) {
    let (hq, hk, hs, d) = comptime![(m.g.h, m.g.hk, m.hs, m.g.d / N::value())];
    let (rows, sq) = comptime![(m.g.rows, m.g.s)];
    let (group, per) = comptime![(hq / hk, unit_rows(rows, plane))];
    let (u, lane) = (UNIT_POS as usize, k::plane_lane(plane));
    let b = k::cube_y(comptime![m.g.fold]);
    let r0 = k::cube_x(comptime![m.g.fold]) * rows;
    let mut s = Array::<f32>::new(comptime![per * hq]);
    let mut krow = Array::<Vector<f32, N>>::new(d);
    #[unroll]
    for kh in 0..hk {
        load_row::<N>(kb, view_row(b, kh, j, kv), lane, &mut krow, d, plane);
        #[unroll]
        for t in 0..per {
            let i = row_of(r0, u, t, rows, per, sq);
            #[unroll]
            for mm in 0..group {
                let mh = comptime![kh * group + mm];
                let mut x = f32::new(0.0);
                #[unroll]
                for c in 0..d {
                    x += qr[comptime![(t * hq + mh) * d + c]].dot(krow[c]);
                }
                s[comptime![t * hq + mh]] = score_hook(x, b, mh, i, j, score.clone());
            }
        }
    }
    #[unroll]
    for t in 0..per {
        mix_row(&s, wls, sm, t, hq, hs, comptime![m.logits]);
    }
}

/// Row `t` of `x` (`[.., n_in]`) mixed by the row-major `[n_in, n_out]`
/// matrix `w` into row `t` of `y` (`[.., n_out]`), or copied without a
/// matrix (`given` false: the identity, `n_in = n_out`).
#[cube]
fn mix_row(
    x: &Array<f32>,
    w: &Array<f32>,
    y: &mut Array<f32>,
    #[comptime] t: usize,
    #[comptime] n_in: usize,
    #[comptime] n_out: usize,
    #[comptime] given: bool,
) {
    #[unroll]
    for o in 0..n_out {
        if comptime![given] {
            let mut acc = f32::new(0.0);
            #[unroll]
            for i in 0..n_in {
                acc += w[comptime![i * n_out + o]] * x[comptime![t * n_in + i]];
            }
            y[comptime![t * n_out + o]] = acc;
        } else {
            y[comptime![t * n_out + o]] = x[comptime![t * n_in + o]];
        }
    }
}

/// The forward into `out` (or, with `lse`, each softmax head's
/// log-sum-exp into `lse_out`, row-major `[B, H_s, S]`) of attention
/// mixing heads by `wl` and `wp`, on planes of `plane` units, each walking
/// unit holding [`unit_rows`] rows; rows in vectors of `N` (`views` too).
#[cube]
pub fn mixed_rows<N: Size>(
    bufs: &MixRows<N>,
    out: &mut [Vector<Stored, N>],
    lse_out: &mut [Stored],
    #[comptime] m: MixDims,
    #[comptime] args: MixArgs,
    #[comptime] lse: bool,
    #[comptime] plane: u32,
) {
    let (views, scale, score, mask) = comptime![(args.views, args.scale, args.score.clone(), args.mask.clone())];
    let g = comptime![m.g];
    let (rows, tile) = comptime![(g.rows, g.tile)];
    let (hq, hs, ho, hv) = comptime![(g.h, m.hs, m.ho, m.hv)];
    let (d, e) = comptime![(g.d / N::value(), g.e / N::value())];
    let per = comptime![unit_rows(rows, plane)];
    let stride = comptime![rows / per];
    let b = k::cube_y(comptime![g.fold]);
    let r0 = k::cube_x(comptime![g.fold]) * rows;
    let u = UNIT_POS as usize;
    let lane = k::plane_lane(plane);
    let wls = held_matrix(bufs.wl, comptime![if m.logits { hq * hs } else { 0 }]);
    let wps = held_matrix(bufs.wp, comptime![if m.probs { hs * ho } else { 0 }]);
    let mut qr = Array::<Vector<f32, N>>::new(comptime![per * hq * d]);
    #[unroll]
    for t in 0..per {
        let i = row_of(r0, u, t, rows, per, comptime![g.s]);
        #[unroll]
        for mh in 0..hq {
            let at = view_row(b, mh, i, comptime![views[0]]);
            #[unroll]
            for c in 0..d {
                qr[comptime![(t * hq + mh) * d + c]] =
                    Vector::<f32, N>::cast_from(bufs.q[at + c]) * Vector::new(f32::new(scale));
            }
        }
    }
    // The keys some row of the cube sees; none for the units that do not walk.
    let band = key_tiles(r0, min(r0 + comptime![rows - 1], comptime![g.s - 1]), g);
    let j0 = band.lo * tile;
    let mut j1 = max(min(band.hi * tile, comptime![g.sk]), j0);
    if u >= comptime![(plane as usize).min(m.units)] {
        j1 = j0;
    }
    let mut sm = Array::<f32>::new(comptime![per * hs]);
    // The first walk: each softmax head's running maximum and sum.
    let mut mx = Array::<f32>::new(comptime![per * hs]);
    let mut l = Array::<f32>::new(comptime![per * hs]);
    #[unroll]
    for x in 0..comptime![per * hs] {
        mx[x] = f32::new(norm::M_INIT);
        l[x] = f32::new(0.0);
    }
    for j in j0..j1 {
        mixed_logits::<N>(&qr, bufs.k, &wls, &mut sm, j, m, views[1], plane, score.clone());
        #[unroll]
        for t in 0..per {
            let i = row_of(r0, u, t, rows, per, comptime![g.s]);
            #[unroll]
            for h in 0..hs {
                let at = comptime![t * hs + h];
                if seen(b, h, i, j, g, mask.clone()) {
                    let st = push(mx[at], l[at], sm[at], Norm::Softmax);
                    mx[at] = st.m;
                    l[at] = st.l;
                }
            }
        }
    }
    // The log-sum-exp, in place of the maximum.
    #[unroll]
    for x in 0..comptime![per * hs] {
        mx[x] = norm::finish_lse(mx[x], l[x]);
    }
    if comptime![lse] {
        #[unroll]
        for t in 0..per {
            let r = u + comptime![t * stride];
            if u < stride && r0 + r < comptime![g.s] {
                #[unroll]
                for h in 0..hs {
                    lse_out[(b * hs + h) * comptime![g.s] + r0 + r] = Stored::cast_from(mx[comptime![t * hs + h]]);
                }
            }
        }
    } else {
        // The second walk: probabilities, mixed, times the values.
        let mut acc = Array::<Vector<f32, N>>::new(comptime![per * ho * e]);
        #[unroll]
        for x in 0..comptime![per * ho * e] {
            acc[x] = Vector::new(f32::new(0.0));
        }
        let mut p = Array::<f32>::new(comptime![per * hs]);
        let mut pt = Array::<f32>::new(comptime![per * ho]);
        let mut vrow = Array::<Vector<f32, N>>::new(e);
        let group = comptime![ho / hv];
        for j in j0..j1 {
            mixed_logits::<N>(&qr, bufs.k, &wls, &mut sm, j, m, views[1], plane, score.clone());
            #[unroll]
            for t in 0..per {
                let i = row_of(r0, u, t, rows, per, comptime![g.s]);
                #[unroll]
                for h in 0..hs {
                    let mut x = f32::new(0.0);
                    if seen(b, h, i, j, g, mask.clone()) {
                        x = norm::prob(sm[comptime![t * hs + h]], mx[comptime![t * hs + h]], Norm::Softmax);
                    }
                    p[comptime![t * hs + h]] = x;
                }
                mix_row(&p, &wps, &mut pt, t, hs, ho, comptime![m.probs]);
            }
            #[unroll]
            for vh in 0..hv {
                load_row::<N>(bufs.v, view_row(b, vh, j, comptime![views[2]]), lane, &mut vrow, e, plane);
                #[unroll]
                for t in 0..per {
                    #[unroll]
                    for gg in 0..group {
                        let go = comptime![vh * group + gg];
                        let w = pt[comptime![t * ho + go]];
                        #[unroll]
                        for c in 0..e {
                            acc[comptime![(t * ho + go) * e + c]] += Vector::new(w) * vrow[c];
                        }
                    }
                }
            }
        }
        #[unroll]
        for t in 0..per {
            let r = u + comptime![t * stride];
            if u < stride && r0 + r < comptime![g.s] {
                #[unroll]
                for go in 0..ho {
                    let at = view_row(b, go, r0 + r, comptime![views[3]]);
                    #[unroll]
                    for c in 0..e {
                        out[at + c] = Vector::<Stored, N>::cast_from(acc[comptime![(t * ho + go) * e + c]]);
                    }
                }
            }
        }
    }
}
