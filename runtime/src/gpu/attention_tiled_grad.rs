//! Attention's query gradient on the forward's tiling (`KernelSpec::tiled_grad`),
//! assembled on the host like `attention_tiled`: a cube owns the query rows
//! of one (batch, head), `R` a unit, and holds per row its query (scaled),
//! its output-gradient `dO_i`, `D_i = dO_i · O_i`, its log-sum-exp and the
//! accumulator `dQ_i` in registers as vectors. It walks the key tiles the
//! forward walks (`kit::walk::KeyWalk`: the mask's band, a mask function's
//! listed tiles); per tile, each key row is loaded once (by the lanes of a
//! plane, then broadcast) for every row's score, the scores are masked and
//! go through the score function as in the forward (`kit::pair::mask_scores`),
//! then each value and key row is loaded once more for
//! `P_ij = exp(score − lse_i)`, `dS_ij = P_ij (dO_i · v_j − D_i)` (times the
//! score function's slope) and `dQ_i += dS_ij k_j`; finally
//! `dQ_i · scale` is stored. A hidden or masked key scores [`MASKED`] and
//! weighs 0; a row that saw no key (its log-sum-exp below
//! `NO_KEYS_BELOW`) gets 0. Every sum runs in one unit in a fixed order:
//! deterministic, as the shared-memory kernels (`attention_grad`).

use super::attention::{load_query, row_slots};
use super::attention_tiled::shared_row;
use super::func::Indices;
use super::kernels::{self as k, Stored};
use super::kit::launch::{Shape, ROW_I, ROW_OUT, ROW_Q};
use super::kit::norm;
use super::kit::norm::grad_weight;
use super::kit::pair::{mask_scores, pair_score, times_slope};
use super::kit::source::{key_address, view_row};
use super::kit::walk::{in_parts, setup, walk_query_tiles, KeyWalk, TileAt, SET_K, SET_V};
use crate::gpu::kernels::Vecs;
use attnc_compiler::plan::{RowView, ATTN_ROWS};
use cubecl::prelude::*;

/// What a dK/dV launch writes: `out` (dK where `wrt_k`, else dV), and
/// dV's buffer and layout beside dK's where one launch writes both.
pub struct KvOuts<'a, N: Size> {
    pub out: &'a mut Vecs<N>,
    pub wrt_k: bool,
    pub dv: Option<(&'a mut Vecs<N>, RowView)>,
}

/// The buffers of a `dQ` launch (in vectors, but the log-sum-exp).
pub struct GradBuffers<'a, N: Size> {
    pub q: &'a Vecs<N>,
    pub k: &'a Vecs<N>,
    pub v: &'a Vecs<N>,
    pub o: &'a Vecs<N>,
    pub dout: &'a Vecs<N>,
    pub lse: &'a NativeExpand<[Stored]>,
    /// The layouts of `o` and `dout`, in vectors.
    pub side: [RowView; 2],
    /// The attention's scale.
    pub scale: f32,
}

/// Emit `dQ` (row-major `[B, H, S, d]`, `a.views[3]`) for vectors of `N`
/// (`lanes` floats); `views`: the layouts of `o` and `dout`.
pub fn build_grad_q<N: Size>(scope: &Scope, b: &GradBuffers<N>, out: &mut Vecs<N>, a: &Shape, plane: u32) {
    let ([ov, dov], scale, lanes) = (b.side, b.scale, a.lanes);
    let (dl, el) = (a.g.d / lanes, a.g.e / lanes);
    let (bk, nr) = (a.tiles.key_tile, a.tiles.unit_rows);
    let bq = a.tiles.cube_rows();
    let set = setup::expand(scope, a.g, bq, bk, a.views, 0);
    // `row_slots` of these views give the rows of `o` (ROW_Q) and `dout` (ROW_OUT).
    let side_views = [ov, a.views[1], a.views[2], dov];
    let scaled = k::fconst::expand(scope, scale);
    let one = k::fconst::expand(scope, 1.0);
    let mut rows = Vec::with_capacity(nr);
    for r in 0..nr {
        let slots = row_slots::expand(scope, a.g, bq, r, a.views, 0);
        let side = row_slots::expand(scope, a.g, bq, r, side_views, 0);
        let qr = load_query::expand::<N>(scope, b.q, k::uget::expand(scope, &slots, ROW_Q), scaled, dl);
        let dor = load_query::expand::<N>(scope, b.dout, k::uget::expand(scope, &side, ROW_OUT), one, el);
        let or = load_query::expand::<N>(scope, b.o, k::uget::expand(scope, &side, ROW_Q), one, el);
        let delta = row_dot::expand::<N>(scope, &dor, &or, el);
        let lse = norm::row_lse::expand(scope, b.lse, &slots, a.g.s, a.g.fold);
        let acc = k::vzeros::expand::<N>(scope, dl);
        rows.push(GradRow { slots, qr, dor, delta, lse, acc });
    }
    let lane = k::plane_lane::expand(scope, plane.max(1));
    let part = a.tiles.unrolled_rows(2 * dl + el, a.half);
    KeyWalk::new(scope, &set, a, bk).walk(scope, |scope, (kt, masked, hidden)| {
        let k0 = k::mul_const::expand(scope, kt, bk);
        let tile = |scope: &Scope, k0| {
            let at = TileAt { a, set: &set, lane, k0, bk: part, dl, el, plane, masked, hidden };
            let t = GradTile { at, b, rows: &rows };
            t.emit(scope)
        };
        in_parts(scope, k0, bk, part, tile);
    });
    for u in &rows {
        store_scaled::expand::<N>(scope, out, &u.acc, &u.slots, scale, a.g.s, dl);
    }
}

/// One query row of a unit: its addresses, scaled query, output gradient,
/// `D_i`, log-sum-exp (`norm::DEAD_ROW` for a row that saw no key) and `dQ_i`.
struct GradRow<N: Size> {
    slots: NativeExpand<Array<usize>>,
    qr: NativeExpand<Array<Vector<f32, N>>>,
    dor: NativeExpand<Array<Vector<f32, N>>>,
    delta: NativeExpand<f32>,
    lse: NativeExpand<f32>,
    acc: NativeExpand<Array<Vector<f32, N>>>,
}

/// One key tile (or part of one) of one cube ([`TileAt`]) against the unit's rows.
struct GradTile<'a, N: Size> {
    at: TileAt<'a>,
    b: &'a GradBuffers<'a, N>,
    rows: &'a [GradRow<N>],
}

impl<N: Size> GradTile<'_, N> {
    fn emit(&self, scope: &Scope) {
        let a = self.at.a;
        let k_base = k::uget::expand(scope, self.at.set, SET_K);
        let v_base = k::uget::expand(scope, self.at.set, SET_V);
        let clamp = self.at.masked.is_some();
        let key_rows: Vec<_> =
            (0..self.at.bk).map(|jj| key_address(scope, a, self.at.k0, k_base, jj, clamp, a.views[1])).collect();
        let value_rows: Vec<_> =
            (0..self.at.bk).map(|jj| key_address(scope, a, self.at.k0, v_base, jj, clamp, a.views[2])).collect();
        // The scaled logits of every row against every key of the tile.
        let mut logits = vec![Vec::with_capacity(self.at.bk); self.rows.len()];
        for row in &key_rows {
            let keys = shared_row(scope, self.b.k, *row, self.at.dl, self.at.lane, self.at.plane);
            for (u, sc) in self.rows.iter().zip(&mut logits) {
                let mut dot = k::fconst::expand(scope, 0.0);
                for (c, kc) in keys.iter().enumerate() {
                    dot = k::dot_add::expand::<N>(scope, dot, k::vget::expand::<N>(scope, &u.qr, c), *kc);
                }
                sc.push(dot);
            }
        }
        let scores: Vec<_> = (self.rows.iter().zip(&logits))
            .map(|(u, sc)| {
                let i = k::uget::expand(scope, &u.slots, ROW_I);
                mask_scores(scope, sc.clone(), &self.at.masked, self.at.hidden, i, self.at.k0, a)
            })
            .collect();
        let mut accs: Vec<Vec<_>> = (self.rows.iter())
            .map(|u| (0..self.at.dl).map(|c| k::vget::expand::<N>(scope, &u.acc, c)).collect())
            .collect();
        let slope_fns = a.fns.as_ref().filter(|f| f.score.is_some());
        // The cube's batch and head, for the score function's slope.
        let head = slope_fns.map(|_| a.cube_head(scope));
        for jj in 0..self.at.bk {
            let values = shared_row(scope, self.b.v, value_rows[jj], self.at.el, self.at.lane, self.at.plane);
            let keys = shared_row(scope, self.b.k, key_rows[jj], self.at.dl, self.at.lane, self.at.plane);
            for (r, u) in self.rows.iter().enumerate() {
                let mut dp = k::fconst::expand(scope, 0.0);
                for (c, vc) in values.iter().enumerate() {
                    dp = k::dot_add::expand::<N>(scope, dp, k::vget::expand::<N>(scope, &u.dor, c), *vc);
                }
                let p = norm::own_row_prob::expand(scope, scores[r][jj], u.lse, a.g.norm);
                let mut ds = grad_weight::expand(scope, scores[r][jj], u.lse, p, dp, u.delta, a.g.norm);
                if let (Some(fns), Some((b, h))) = (slope_fns, head) {
                    let i = k::uget::expand(scope, &u.slots, ROW_I);
                    let j = k::add_index::expand(scope, self.at.k0, k::const_index::expand(scope, jj));
                    let slope = fns.slope(scope, logits[r][jj], &Indices { b, h, i, j }).expect("a score function");
                    ds = k::fmul::expand(scope, ds, slope);
                }
                for (o, kc) in accs[r].iter_mut().zip(&keys) {
                    *o = k::axpy::expand::<N>(scope, *o, ds, *kc);
                }
            }
        }
        for (u, acc) in self.rows.iter().zip(accs) {
            let mut dst = u.acc;
            for (c, o) in acc.into_iter().enumerate() {
                k::vset::expand::<N>(scope, &mut dst, c, o);
            }
        }
    }
}

/// `Σ_c a[c] · b[c]` over `n` vectors.
#[cube]
fn row_dot<N: Size>(a: &Array<Vector<f32, N>>, b: &Array<Vector<f32, N>>, #[comptime] n: usize) -> f32 {
    let mut acc = f32::new(0.0);
    #[unroll]
    for c in 0..n {
        acc += a[c].dot(b[c]);
    }
    acc
}

/// `out = acc · scale` at the row's `ROW_OUT`, for rows inside the `s` queries.
#[cube]
fn store_scaled<N: Size>(
    out: &mut [Vector<Stored, N>],
    acc: &Array<Vector<f32, N>>,
    rows: &Array<usize>,
    #[comptime] scale: f32,
    #[comptime] s: usize,
    #[comptime] n: usize,
) {
    if rows[ROW_I] < s {
        let base = rows[ROW_OUT];
        #[unroll]
        for c in 0..n {
            out[base + c] = Vector::<Stored, N>::cast_from(acc[c] * Vector::new(f32::new(scale)));
        }
    }
}

/// `dK` (`wrt_k`) or `dV`, row-major `[B, H_kv, S_k, d or e]` (`a.views[3]`),
/// or both (`dv`: `dV`'s buffer beside `dK`'s, sharing every probability),
/// on the same tiling turned around: a cube owns key rows of one (batch,
/// key/value head), `R` a unit, their keys (scaled), values (for `dK`) and
/// accumulators in registers, and walks the query tiles that some of its
/// key rows' positions see (`kit::walk::walk_query_tiles`) of every query
/// head reading that key/value head. Each query row is loaded once a plane
/// and broadcast; every unit computes `D_i` of it. `dV_j += P_ij dO_i`;
/// `dK_j += dS_ij q_i`, stored times `scale`. The mask (built in, then the
/// mask function) is applied to every pair. `dV` binds q, k, dout and the
/// log-sum-exp: `b.v` and `b.o` are not read.
pub fn build_grad_kv<N: Size>(scope: &Scope, b: &GradBuffers<N>, outs: KvOuts<N>, a: &Shape, plane: u32) {
    let KvOuts { out, wrt_k, mut dv } = outs;
    let ([ov, dov], scale, lanes) = (b.side, b.scale, a.lanes);
    let (dl, el) = (a.g.d / lanes, a.g.e / lanes);
    let with_v = dv.is_some();
    let (bq, nr) = (a.tiles.key_tile, a.tiles.unit_rows);
    let cube_rows = a.tiles.cube_rows();
    assert!(nr == 1 || a.tiles.row_units == ATTN_ROWS, "rows a unit in cubes of ATTN_ROWS units (key_unit_row)");
    let bh = k::cube_y::expand(scope, a.g.fold);
    let (bb, kh) = (k::idx_div::expand(scope, bh, a.g.hk), k::idx_mod::expand(scope, bh, a.g.hk));
    let scaled = k::fconst::expand(scope, scale);
    let one = k::fconst::expand(scope, 1.0);
    let mut rows = Vec::with_capacity(nr);
    for r in 0..nr {
        let j = key_unit_row::expand(scope, r, cube_rows, a.g.fold);
        let jc = last_row::expand(scope, j, a.g.sk);
        let kr = load_query::expand::<N>(scope, b.k, view_row::expand(scope, bb, kh, jc, a.views[1]), scaled, dl);
        let vr = wrt_k
            .then(|| load_query::expand::<N>(scope, b.v, view_row::expand(scope, bb, kh, jc, a.views[2]), one, el));
        let acc = k::vzeros::expand::<N>(scope, if wrt_k { dl } else { el });
        let acc_v = with_v.then(|| k::vzeros::expand::<N>(scope, el));
        rows.push(KeyRow { j, jc, kr, vr, acc, acc_v });
    }
    let lane = k::plane_lane::expand(scope, plane.max(1));
    let part = a.tiles.unrolled_rows(
        match (wrt_k, with_v) {
            (true, true) => 2 * dl + 2 * el,
            (true, false) => 2 * dl + el,
            _ => dl + el,
        },
        a.half,
    );
    walk_query_tiles(scope, a, (bb, kh), (bq, cube_rows), true, |scope, hi, i0| {
        let tile = |scope: &Scope, i0| {
            let t =
                KeyTileGrad { a, b, rows: &rows, bb, hi, i0, bq: part, dl, el, lane, plane, views: [ov, dov], wrt_k };
            t.emit(scope)
        };
        in_parts(scope, i0, bq, part, tile);
    });
    let width = if wrt_k { dl } else { el };
    let factor = if wrt_k { scale } else { 1.0 };
    for u in &rows {
        store_key_row::expand::<N>(scope, out, &u.acc, bb, kh, u.j, (width, factor), (a.g.sk, a.views[3]));
        if let (Some((dv, view)), Some(acc_v)) = (dv.as_mut(), &u.acc_v) {
            store_key_row::expand::<N>(scope, dv, acc_v, bb, kh, u.j, (el, 1.0), (a.g.sk, *view));
        }
    }
}

/// One key row of a unit: its index (past the last for a unit with none),
/// the index clamped, its key (scaled) and value (for `dK`), and the accumulator.
struct KeyRow<N: Size> {
    j: NativeExpand<usize>,
    jc: NativeExpand<usize>,
    kr: NativeExpand<Array<Vector<f32, N>>>,
    vr: Option<NativeExpand<Array<Vector<f32, N>>>>,
    acc: NativeExpand<Array<Vector<f32, N>>>,
    /// `dV`'s accumulator, when the launch also writes it.
    acc_v: Option<NativeExpand<Array<Vector<f32, N>>>>,
}

/// Query rows `i0 .. i0 + bq` of head `hi` against a cube's key rows.
struct KeyTileGrad<'a, N: Size> {
    a: &'a Shape,
    b: &'a GradBuffers<'a, N>,
    rows: &'a [KeyRow<N>],
    bb: NativeExpand<usize>,
    hi: NativeExpand<usize>,
    i0: NativeExpand<usize>,
    bq: usize,
    dl: usize,
    el: usize,
    lane: NativeExpand<usize>,
    plane: u32,
    /// Layouts of `o` and `dout`.
    views: [RowView; 2],
    wrt_k: bool,
}

impl<N: Size> KeyTileGrad<'_, N> {
    fn emit(&self, scope: &Scope) {
        let a = self.a;
        let mut accs: Vec<Vec<_>> = (self.rows.iter())
            .map(|u| {
                let n = if self.wrt_k { self.dl } else { self.el };
                (0..n).map(|c| k::vget::expand::<N>(scope, &u.acc, c)).collect()
            })
            .collect();
        let mut accs_v: Vec<Option<Vec<_>>> = (self.rows.iter())
            .map(|u| u.acc_v.as_ref().map(|acc| (0..self.el).map(|c| k::vget::expand::<N>(scope, acc, c)).collect()))
            .collect();
        for ii in 0..self.bq {
            let i = k::add_index::expand(scope, self.i0, k::const_index::expand(scope, ii));
            let ic = last_row::expand(scope, i, a.g.s);
            let load = |x, view, n| {
                let at = view_row::expand(scope, self.bb, self.hi, ic, view);
                shared_row(scope, x, at, n, self.lane, self.plane)
            };
            let q = load(self.b.q, a.views[0], self.dl);
            let dout = load(self.b.dout, self.views[1], self.el);
            let lse = norm::query_lse::expand(scope, self.b.lse, self.bb, self.hi, i, a.g.h, a.g.s);
            let delta = self.wrt_k.then(|| {
                let o = load(self.b.o, self.views[0], self.el);
                let mut delta = k::fconst::expand(scope, 0.0);
                for (x, y) in dout.iter().zip(&o) {
                    delta = k::dot_add::expand::<N>(scope, delta, *x, *y);
                }
                delta
            });
            for ((u, acc), acc_v) in self.rows.iter().zip(&mut accs).zip(&mut accs_v) {
                let mut logit = k::fconst::expand(scope, 0.0);
                for (c, qc) in q.iter().enumerate() {
                    logit = k::dot_add::expand::<N>(scope, logit, *qc, k::vget::expand::<N>(scope, &u.kr, c));
                }
                let at = Indices { b: self.bb, h: self.hi, i: ic, j: u.jc };
                let score = pair_score(scope, a, logit, i, u.j, &at);
                let p = norm::prob::expand(scope, score, lse, a.g.norm);
                if let Some(acc_v) = acc_v {
                    for (o, dc) in acc_v.iter_mut().zip(&dout) {
                        *o = k::axpy::expand::<N>(scope, *o, p, *dc);
                    }
                }
                match (&u.vr, delta) {
                    (Some(vr), Some(delta)) => {
                        let mut dp = k::fconst::expand(scope, 0.0);
                        for (c, dc) in dout.iter().enumerate() {
                            dp = k::dot_add::expand::<N>(scope, dp, *dc, k::vget::expand::<N>(scope, vr, c));
                        }
                        let ds = grad_weight::expand(scope, score, lse, p, dp, delta, a.g.norm);
                        let ds = times_slope(scope, a, ds, logit, &at);
                        for (o, qc) in acc.iter_mut().zip(&q) {
                            *o = k::axpy::expand::<N>(scope, *o, ds, *qc);
                        }
                    }
                    _ => {
                        for (o, dc) in acc.iter_mut().zip(&dout) {
                            *o = k::axpy::expand::<N>(scope, *o, p, *dc);
                        }
                    }
                }
            }
        }
        for ((u, acc), acc_v) in self.rows.iter().zip(accs).zip(accs_v) {
            let mut dst = u.acc;
            for (c, o) in acc.into_iter().enumerate() {
                k::vset::expand::<N>(scope, &mut dst, c, o);
            }
            if let (Some(mut dst), Some(acc_v)) = (u.acc_v, acc_v) {
                for (c, o) in acc_v.into_iter().enumerate() {
                    k::vset::expand::<N>(scope, &mut dst, c, o);
                }
            }
        }
    }
}

/// This unit's `r`-th key row (past the last for a unit with none).
#[cube]
pub(super) fn key_unit_row(#[comptime] r: usize, #[comptime] cube_rows: usize, #[comptime] fold: usize) -> usize {
    k::cube_x(fold) * cube_rows + UNIT_POS as usize + comptime![r * ATTN_ROWS]
}

/// Row `i` clamped to the last of `n`.
#[cube]
pub(super) fn last_row(i: usize, #[comptime] n: usize) -> usize {
    min(i, comptime![n - 1])
}

/// `out = acc · factor` (`n` vectors, `row`) at key row `j` of head `(b,
/// kh)` under view `v`, for rows inside the `sk` keys.
#[cube]
fn store_key_row<N: Size>(
    out: &mut [Vector<Stored, N>],
    acc: &Array<Vector<f32, N>>,
    b: usize,
    kh: usize,
    j: usize,
    #[comptime] row: (usize, f32),
    #[comptime] keys: (usize, RowView),
) {
    let ((n, factor), (sk, v)) = comptime![(row, keys)];
    if j < sk {
        let base = view_row(b, kh, j, v);
        #[unroll]
        for c in 0..n {
            out[base + c] = Vector::<Stored, N>::cast_from(acc[c] * Vector::new(f32::new(factor)));
        }
    }
}
