//! Attention's backward on matrix fragments ([`build_grad_q`],
//! [`build_grad_kv`]), FlashAttention-2's products on the forward's
//! fragment layout (`flash.rs`): a cube of 64 units (two planes), or of 32
//! for heads past 64, holds as many rows of its own side in shared memory,
//! one a unit, and walks tiles of the other side's rows
//! (`plan::frag_grad_tiles`).
//!
//! - `dQ`: a cube's query rows `Q` and output gradients `dO`; per key tile,
//!   `S = Q·Kᵀ` and `dP = dO·Vᵀ` on fragments into shared f32, then each
//!   unit, for its row, `P = exp(S·scale − lse)` (masked, through the score
//!   function), `dS = P ∘ (dP − D)` (times the score function's slope) in
//!   the storage type, and `dQ += dS·K` on fragments.
//! - `dK`, `dV`: a cube's key rows `K` and values `V`; per query tile of
//!   each query head reading them, `Sᵀ = K·Qᵀ` and `dPᵀ = V·dOᵀ`, each unit
//!   its key row's `Pᵀ` and `dSᵀ`, then `dV += Pᵀ·dO` and `dK += dSᵀ·Q`.
//!
//! `D_i = dO_i · O_i` and the log-sum-exp are read per row as by the scalar
//! kernels (`attention_tiled_grad`). Accumulators are f32, each unit's row
//! in registers up to `flash::HELD` columns and the rest in shared memory;
//! every sum runs in a fixed order, so results are deterministic.

use super::flash::{
    accumulate, accumulators, copy_query, copy_rows, held_columns, products_t, store_columns, unit_scores, KvRows,
    RowCopy, HELD,
};
use super::*;
use crate::gpu::attention_tiled_grad::{key_unit_row, last_row, GradBuffers, KvOuts};
use crate::gpu::func::Indices;
use crate::gpu::kernels::Vecs;

/// Columns `c0 .. c0 + n` of this unit's row (of `cols` elements) of the
/// shared array at `dst` (storage type), from `vals` (f32).
#[cube]
fn put_row<N: Size>(
    sh: &mut [Vector<Stored, N>],
    vals: &Array<f32>,
    #[comptime] dst: usize,
    #[comptime] cols: usize,
    #[comptime] c0: usize,
    #[comptime] n: usize,
    #[comptime] round: bool,
) {
    let at = comptime![dst + c0 / N::value()] + UNIT_POS as usize * comptime![cols / N::value()];
    #[unroll]
    for v in 0..comptime![n / N::value()] {
        let mut p = Vector::<f32, N>::empty();
        #[unroll]
        for c in 0..N::value() {
            p.insert(c, vals[comptime![v * N::value() + c]]);
        }
        sh[at + v] = stage::<N>(Vector::<Stored, N>::cast_from(p), round);
    }
}

/// `D_i = dO_i · O_i`: `dO_i` the shared row at vector `row`, `O_i` at
/// `o_at` of `o`, `n` vectors each.
#[cube]
fn row_delta<N: Size>(
    sh: &[Vector<Stored, N>],
    row: usize,
    o: &[Vector<Stored, N>],
    o_at: usize,
    #[comptime] n: usize,
) -> f32 {
    let mut acc = f32::new(0.0);
    #[unroll]
    for c in 0..n {
        acc += Vector::<f32, N>::cast_from(sh[row + c]).dot(Vector::<f32, N>::cast_from(o[o_at + c]));
    }
    acc
}

/// Vector `dst + UNIT_POS · width`: this unit's row of a shared array of rows of `width` vectors.
#[cube]
fn unit_vectors(#[comptime] dst: usize, #[comptime] width: usize) -> usize {
    comptime![dst] + UNIT_POS as usize * width
}

/// A parked row past the queries ([`park_row`]).
const NO_ROW: u32 = u32::MAX;

/// This unit's output row `at` ([`NO_ROW`] for a row `i` past the `s` queries) into `parked`.
#[cube]
fn park_row(parked: &mut [u32], at: usize, i: usize, #[comptime] s: usize) {
    let mut v = u32::new(NO_ROW as i64);
    if i < s {
        v = u32::cast_from(at);
    }
    parked[UNIT_POS as usize] = v;
}

#[cube]
fn parked_at(parked: &[u32]) -> u32 {
    parked[UNIT_POS as usize]
}

#[cube]
fn word_index(w: u32) -> usize {
    w as usize
}

#[cube]
fn is_row(w: u32) -> bool {
    w != u32::new(NO_ROW as i64)
}

/// This unit's parked output row ([`park_row`]) and whether it has one.
fn parked_row(scope: &Scope, parked: &NativeExpand<[u32]>) -> (NativeExpand<usize>, NativeExpand<bool>) {
    let w = parked_at::expand(scope, parked);
    (word_index::expand(scope, w), is_row::expand(scope, w))
}

/// dQ's columns a unit holds in registers at least, the rest in shared
/// memory where there is room: at 64, ptxas held the kernel to 128
/// registers and spilled a few bytes (IHA's and ALiBi's f16 backward).
const DQ_HELD: usize = 48;

/// Output columns the backward's units hold in registers at least (dQ's,
/// and dK/dV's), the rest in shared memory where there is room
/// ([`held_columns`]).
#[derive(Clone, Copy)]
pub(super) struct HeldMost {
    pub dq: usize,
    pub kv: usize,
}

/// [`HeldMost`] for `dtype`: in TF32, whose f32 operands take twice the
/// registers of 16 bits in flight, fewer (ptxas spilled 4–28 bytes at 255
/// registers holding 48 and 64, and 4 bytes in one spec's dQ at 32).
pub(super) fn held_most(dtype: Dtype) -> HeldMost {
    if dtype == Dtype::Tf32 {
        HeldMost { dq: 16, kv: 32 }
    } else {
        HeldMost { dq: DQ_HELD, kv: HELD }
    }
}

/// Keys of a dQ row whose `dS` is computed at once.
const DS_CHUNK: usize = 8;

/// `dQ` on fragments (`KernelSpec::AttentionGrad` with `wrt` Q and
/// `fragments`): see the module doc. `views`: the layouts of `o` and `dout`.
pub fn build_grad_q<N: Size>(scope: &Scope, b: &GradBuffers<N>, out: &mut Vecs<N>, a: &Shape, dev: FragDevice) {
    let ([ov, dov], scale, lanes) = (b.side, b.scale, a.lanes);
    let (bq, bk) = (a.tiles.units(), a.tiles.key_tile);
    let FragWidths { dp, ep, dpl, epl, dl, el } = FragWidths::of(a, bk);
    let q_off = 0;
    let do_off = q_off + bq * dpl;
    let k_off = do_off + bq * epl;
    let v_off = k_off + bk * dpl;
    let ds_off = v_off + bk * epl;
    let (len, floats) = (ds_off + bq * bk / lanes, (bq * bk).max(bq * F));
    let mut x = vectors_in_shared::<N>(scope, len);
    let sf = floats_in_shared(scope, floats);
    let dpf = floats_in_shared(scope, bq * bk);
    let frags = Frags::new(scope, dev.hardware, dev.dtype);
    let set = tiles::setup::expand(scope, a.g, bq, bk, a.views, 0);
    let slots = att::row_slots::expand(scope, a.g, bq, 0, a.views, 0);
    // `row_slots` of these views: the rows of `o` (ROW_Q) and `dout` (ROW_OUT).
    let side = att::row_slots::expand(scope, a.g, bq, 0, [ov, a.views[1], a.views[2], dov], 0);
    let i = k::uget::expand(scope, &slots, ROW_I);
    copy_query::expand::<N>(scope, b.q, &mut x, k::uget::expand(scope, &slots, ROW_Q), q_off, dpl, dl, dev.rounds());
    copy_query::expand::<N>(
        scope,
        b.dout,
        &mut x,
        k::uget::expand(scope, &side, ROW_OUT),
        do_off,
        epl,
        el,
        dev.rounds(),
    );
    let own = unit_vectors::expand(scope, do_off, epl);
    let delta = row_delta::expand::<N>(scope, &x, own, b.o, k::uget::expand(scope, &side, ROW_Q), el);
    let lse = norm::row_lse::expand(scope, b.lse, &slots, a.g.s, a.g.fold);
    // The vectors, the two f32 products and the parked rows.
    let base = len * lanes * dev.dtype.storage().size() + (floats + bq * bk + bq) * 4;
    let held = held_columns(dp, base, dev.shared_limit, held_most(dev.dtype).dq, bq);
    let acc = accumulators(scope, dp, held, bq, &sf);
    let (k_base, v_base) = (k::uget::expand(scope, &set, SET_K), k::uget::expand(scope, &set, SET_V));
    let scale_c = k::fconst::expand(scope, scale);
    let slope_fns = a.fns.as_ref().filter(|f| f.score.is_some());
    let head = slope_fns.map(|_| a.cube_head(scope));
    let walk = tiles::KeyWalk::new(scope, &set, a, bk);
    let tile = |scope: &Scope, (kt, masked, hidden): tiles::TileFlags| {
        let k0 = k::mul_const::expand(scope, kt, bk);
        let mut xs = x.clone_unchecked();
        let rows = KvRows::new(scope, a, bq, dev.rounds());
        rows.copy::<N>(scope, b.k, &mut xs, (k0, k_base), (k_off, bk, dpl, dl), a.views[1]);
        rows.copy::<N>(scope, b.v, &mut xs, (k0, v_base), (v_off, bk, epl, el), a.views[2]);
        k::barrier::expand(scope);
        // S = Q·Kᵀ and dP = dO·Vᵀ, each plane its 32 rows by the tile's keys.
        products_t::<N>(scope, &frags, &x, &mut sf.clone_unchecked(), (q_off, k_off), dp, bk);
        products_t::<N>(scope, &frags, &x, &mut dpf.clone_unchecked(), (do_off, v_off), ep, bk);
        k::barrier::expand(scope);
        // This unit's row: P, dS = P (dP − D) (times the slope), in the
        // storage type, 8 keys at a time (fewer live registers; the logits
        // are read again for the slope).
        let row = unit_scores::expand(scope, bk);
        let at = |jj: usize| k::add_index::expand(scope, row, k::const_index::expand(scope, jj));
        let logit = |jj: usize| k::fmul::expand(scope, k::read::expand::<f32>(scope, &sf, at(jj)), scale_c);
        for c0 in (0..bk).step_by(DS_CHUNK) {
            let kc = k::add_index::expand(scope, k0, k::const_index::expand(scope, c0));
            let logits = (c0..c0 + DS_CHUNK).map(logit).collect();
            let scores = pair::mask_scores(scope, logits, &masked, hidden, i, kc, a);
            let mut ds_row = k::zeros::expand(scope, DS_CHUNK);
            for (jc, score) in scores.into_iter().enumerate() {
                let jj = c0 + jc;
                let p = norm::own_row_prob::expand(scope, score, lse, a.g.norm);
                let dp = k::read::expand::<f32>(scope, &dpf, at(jj));
                let mut ds = norm::grad_weight::expand(scope, score, lse, p, dp, delta, a.g.norm);
                if let (Some(fns), Some((b, h))) = (slope_fns, head) {
                    let j = k::add_index::expand(scope, k0, k::const_index::expand(scope, jj));
                    let slope = fns.slope(scope, logit(jj), &Indices { b, h, i, j }).expect("a score function");
                    ds = k::fmul::expand(scope, ds, slope);
                }
                k::fset::expand(scope, &mut ds_row, jc, ds);
            }
            put_row::expand::<N>(scope, &mut xs, &ds_row, ds_off, bk, c0, DS_CHUNK, dev.rounds());
        }
        k::barrier::expand(scope);
        // dQ += dS·K.
        let b_k = (k::const_index::expand(scope, k_off), dp, 0);
        accumulate::<N>(scope, &frags, &x, &sf, &acc, (ds_off, bk), b_k);
    };
    // Where the row's dQ goes waits in shared memory: kept in a register
    // across the walk, used only after it, ptxas spilled it to reach an
    // occupancy the kernel's shared memory rules out anyway.
    let mut parked: NativeExpand<[u32]> = (*k::shared_words::expand(scope, bq)).clone_unchecked();
    park_row::expand(scope, &mut parked, k::uget::expand(scope, &slots, ROW_OUT), i, a.g.s);
    walk.visit(scope, tile);
    let (at, inside) = parked_row(scope, &parked);
    acc.with(|r| store_columns::expand::<N>(scope, out, r, scale_c, at, inside, (0, dl)));
}

/// A query tile of [`build_grad_kv`]'s walk: its head `(b, hi)` and first row.
#[derive(CubeType)]
struct QueryTile {
    b: usize,
    hi: usize,
    i0: usize,
}

/// What [`tile_stats`] reads: `bq` rows of head `h` of `s` rows, `dO` the
/// shared tile at `do_off` (`epl` vectors a row, `el` of them read), `O`
/// under the view `ov`, and whether `D` is wanted (`delta`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct StatsOf {
    do_off: usize,
    ov: RowView,
    bq: usize,
    epl: usize,
    el: usize,
    h: usize,
    s: usize,
    delta: bool,
}

/// A query tile's log-sum-exp (`stats[u]`) and `D_i` (`stats[bq + u]`,
/// with `delta`), one row a unit of the first `bq`: query row `i0 + u` of
/// the tile's head; `dO_i` from the shared tile, `O_i` from `o`.
#[cube]
fn tile_stats<N: Size>(
    stats: &mut [f32],
    lse: &[Stored],
    sh: &[Vector<Stored, N>],
    o: &[Vector<Stored, N>],
    t: &QueryTile,
    #[comptime] c: StatsOf,
) {
    let (b, hi) = (t.b, t.hi);
    let u = UNIT_POS as usize;
    if u < comptime![c.bq] {
        let i = t.i0 + u;
        stats[u] = norm::query_lse(lse, b, hi, i, comptime![c.h], comptime![c.s]);
        if comptime![c.delta] {
            let at = source::view_row(b, hi, min(i, comptime![c.s - 1]), comptime![c.ov]);
            stats[comptime![c.bq] + u] =
                row_delta::<N>(sh, comptime![c.do_off] + u * comptime![c.epl], o, at, comptime![c.el]);
        }
    }
}

/// What a walk of [`build_grad_kv`] over the query tiles accumulates.
enum Walk {
    /// `dK` (columns from 0) if `k`, `dV` (after dK's) if `v`.
    Fixed { k: bool, v: bool },
    /// `dV` where the flag holds (the first pass of a runtime loop over
    /// the two), else `dK`, both from column 0.
    Either(NativeExpand<bool>),
}

/// `dK` (`wrt_k`) or `dV`, or both (`dv`: `dV`'s buffer and layout beside
/// `dK`'s), on fragments: see the module doc. Bindings as
/// `attention_tiled_grad::build_grad_kv`'s. Both in cubes of one plane
/// (heads past 64, `d` and `e` padded alike) take a loop of two walks over
/// the query tiles, `dV`'s and then `dK`'s, the second computing `Sᵀ`
/// again: the accumulators of both rows (256 columns a unit at d = 128) are
/// more than CUDA's registers and 48 KiB of shared memory hold, and one
/// walk's code run twice keeps the kernel's source within bounds.
pub fn build_grad_kv<N: Size>(scope: &Scope, b: &GradBuffers<N>, outs: KvOuts<N>, a: &Shape, dev: FragDevice) {
    let KvOuts { out, wrt_k, mut dv } = outs;
    let ([ov, dov], scale, lanes) = (b.side, b.scale, a.lanes);
    let (rows, bq) = (a.tiles.units(), a.tiles.key_tile);
    let with_v = dv.is_some() || !wrt_k;
    let FragWidths { dp, ep, dpl, epl, dl, el } = FragWidths::of(a, bq);
    let twice = wrt_k && with_v && rows < ATTN_ROWS;
    assert!(!twice || dp == ep, "two walks accumulate dK and dV in the same columns");
    // Own keys and (for dK) values, the query and output-gradient tile, the tile's P or dS.
    let k_off = 0;
    let v_off = k_off + rows * dpl;
    let q_off = v_off + if wrt_k { rows * epl } else { 0 };
    let do_off = q_off + bq * dpl;
    let pd_off = do_off + bq * epl;
    let (len, floats) = (pd_off + rows * bq / lanes, (rows * bq).max(rows * F));
    let mut x = vectors_in_shared::<N>(scope, len);
    let sf = floats_in_shared(scope, floats);
    // dPᵀ only for dK.
    let dp_floats = if wrt_k { rows * bq } else { 1 };
    let dpf = floats_in_shared(scope, dp_floats);
    let stats = floats_in_shared(scope, 2 * bq);
    let frags = Frags::new(scope, dev.hardware, dev.dtype);
    let bh = k::cube_y::expand(scope, a.g.fold);
    let (bb, kh) = (k::idx_div::expand(scope, bh, a.g.hk), k::idx_mod::expand(scope, bh, a.g.hk));
    let j = key_unit_row::expand(scope, 0, rows, a.g.fold);
    let jc = last_row::expand(scope, j.clone(), a.g.sk);
    let key_at = source::view_row::expand(scope, bb.clone(), kh.clone(), jc.clone(), a.views[1]);
    copy_query::expand::<N>(scope, b.k, &mut x, key_at, k_off, dpl, dl, dev.rounds());
    if wrt_k {
        let value_at = source::view_row::expand(scope, bb.clone(), kh.clone(), jc.clone(), a.views[2]);
        copy_query::expand::<N>(scope, b.v, &mut x, value_at, v_off, epl, el, dev.rounds());
    }
    // Accumulator columns: dK's `dp`, then dV's `ep` (one of them a walk when twice).
    let k_cols = if wrt_k && !twice { dp } else { 0 };
    let width = if twice { dp } else { k_cols + if with_v { ep } else { 0 } };
    let base = len * lanes * dev.dtype.storage().size() + (floats + dp_floats + 2 * bq) * 4;
    let held = held_columns(width, base, dev.shared_limit, held_most(dev.dtype).kv, rows);
    let acc = accumulators(scope, width, held, rows, &sf);
    let scale_c = k::fconst::expand(scope, scale);
    let walk = |scope: &Scope, walk: &Walk| {
        let dk = match walk {
            Walk::Fixed { k, .. } => *k,
            Walk::Either(_) => true,
        };
        tiles::walk_query_tiles(scope, a, (bb.clone(), kh.clone()), (bq, rows), false, |scope, hi, i0| {
            let mut xs = x.clone_unchecked();
            let row0 = k::const_index::expand(scope, 0);
            let q_base = source::view_row::expand(scope, bb.clone(), hi.clone(), row0.clone(), a.views[0]);
            let do_base = source::view_row::expand(scope, bb.clone(), hi.clone(), row0, dov);
            let c = RowCopy { dst: q_off, rows: bq, width: dpl, used: dl, sk: a.g.s, units: rows, round: dev.rounds() };
            copy_rows::expand::<N, InView>(
                scope,
                b.q,
                &mut xs,
                i0.clone(),
                &InViewExpand { base: q_base, view: a.views[0] },
                c,
            );
            let c =
                RowCopy { dst: do_off, rows: bq, width: epl, used: el, sk: a.g.s, units: rows, round: dev.rounds() };
            copy_rows::expand::<N, InView>(
                scope,
                b.dout,
                &mut xs,
                i0.clone(),
                &InViewExpand { base: do_base, view: dov },
                c,
            );
            k::barrier::expand(scope);
            let mut st = stats.clone_unchecked();
            let (bb, hi0, i00) = (bb.clone(), hi.clone(), i0.clone());
            let c = StatsOf { do_off, ov, bq, epl, el, h: a.g.h, s: a.g.s, delta: dk };
            let t = QueryTileExpand { b: bb, hi: hi0, i0: i00 };
            tile_stats::expand::<N>(scope, &mut st, b.lse, &x, b.o, &t, c);
            // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, each plane its 32 key rows by the tile's queries.
            products_t::<N>(scope, &frags, &x, &mut sf.clone_unchecked(), (k_off, q_off), dp, bq);
            let d_p =
                |scope: &Scope| products_t::<N>(scope, &frags, &x, &mut dpf.clone_unchecked(), (v_off, do_off), ep, bq);
            match walk {
                Walk::Fixed { k: true, .. } => d_p(scope),
                Walk::Either(v_pass) => if_else_expand(scope, v_pass.clone(), |_| {}).or_else(scope, d_p),
                Walk::Fixed { .. } => {}
            }
            k::barrier::expand(scope);
            // This unit's key row against the tile's queries: P and dS.
            let row = unit_scores::expand(scope, bq);
            let at = |jj: usize| k::add_index::expand(scope, row.clone(), k::const_index::expand(scope, jj));
            let mut p_row = k::zeros::expand(scope, bq);
            let mut ds_row = k::zeros::expand(scope, bq);
            for ii in 0..bq {
                let i = k::add_index::expand(scope, i0.clone(), k::const_index::expand(scope, ii));
                let ic = last_row::expand(scope, i.clone(), a.g.s);
                let logit = k::fmul::expand(scope, k::read::expand::<f32>(scope, &sf, at(ii)), scale_c.clone());
                let pair = Indices { b: bb.clone(), h: hi.clone(), i: ic, j: jc.clone() };
                let score = pair::pair_score(scope, a, logit.clone(), i, j.clone(), &pair);
                let lse = k::read::expand::<f32>(scope, &stats, k::const_index::expand(scope, ii));
                let p = norm::prob::expand(scope, score.clone(), lse.clone(), a.g.norm);
                k::fset::expand(scope, &mut p_row, ii, p.clone());
                if dk {
                    let delta = k::read::expand::<f32>(scope, &stats, k::const_index::expand(scope, bq + ii));
                    let dp = k::read::expand::<f32>(scope, &dpf, at(ii));
                    let ds = norm::grad_weight::expand(scope, score, lse, p.clone(), dp, delta, a.g.norm);
                    let mut ds = pair::times_slope(scope, a, ds, logit, &pair);
                    if let Walk::Either(v_pass) = walk {
                        ds = select::expand(scope, v_pass.clone(), p, ds);
                    }
                    k::fset::expand(scope, &mut ds_row, ii, ds);
                }
            }
            let (w, pd) = ((pd_off, bq), |xs: &mut Vecs<N>, r| {
                put_row::expand::<N>(scope, xs, r, pd_off, bq, 0, bq, dev.rounds());
                k::barrier::expand(scope);
            });
            match walk {
                Walk::Either(v_pass) => {
                    // dV += Pᵀ·dO where the flag holds, else dK += dSᵀ·Q (`ds_row` holds the one).
                    pd(&mut xs, &ds_row);
                    let (qa, da) = (k::const_index::expand(scope, q_off), k::const_index::expand(scope, do_off));
                    let b_at = (select::expand(scope, v_pass.clone(), da, qa), dp, 0);
                    accumulate::<N>(scope, &frags, &x, &sf, &acc, w, b_at);
                }
                Walk::Fixed { k: wk, v: wv } => {
                    if *wv {
                        // dV += Pᵀ·dO.
                        pd(&mut xs, &p_row);
                        let b_do = (k::const_index::expand(scope, do_off), ep, k_cols);
                        accumulate::<N>(scope, &frags, &x, &sf, &acc, w, b_do);
                    }
                    if *wk {
                        // dK += dSᵀ·Q (after dV's reads of P: `accumulate` ends on a barrier).
                        pd(&mut xs, &ds_row);
                        let b_q = (k::const_index::expand(scope, q_off), dp, 0);
                        accumulate::<N>(scope, &frags, &x, &sf, &acc, w, b_q);
                    }
                }
            }
        });
    };
    let inside = k::below::expand(scope, j.clone(), a.g.sk);
    let out_at = source::view_row::expand(scope, bb.clone(), kh.clone(), j.clone(), a.views[3]);
    let one = k::fconst::expand(scope, 1.0);
    let store_k = |scope: &Scope, out: &mut Vecs<N>| {
        let (at, inside) = (out_at.clone(), inside.clone());
        acc.with(|r| store_columns::expand::<N>(scope, out, r, scale_c.clone(), at, inside, (0, dl)))
    };
    let store_v = |scope: &Scope, buf: &mut Vecs<N>, at, c0| {
        acc.with(|r| store_columns::expand::<N>(scope, buf, r, one.clone(), at, inside.clone(), (c0, el)))
    };
    if twice {
        let (dv, view) = dv.as_mut().expect("dK and dV");
        let dv_at = source::view_row::expand(scope, bb.clone(), kh.clone(), j.clone(), *view);
        let passes = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, 2usize));
        for_expand(scope, passes, false, |scope, pass| {
            let v_pass = k::below::expand(scope, pass, 1);
            acc.reset(scope);
            walk(scope, &Walk::Either(v_pass.clone()));
            if_else_expand(scope, v_pass, |scope| store_v(scope, &mut dv.clone_unchecked(), dv_at.clone(), 0))
                .or_else(scope, |scope| store_k(scope, &mut out.clone_unchecked()));
        });
        return;
    }
    walk(scope, &Walk::Fixed { k: wrt_k, v: with_v });
    if wrt_k {
        store_k(scope, out);
    }
    match dv.as_mut() {
        Some((dv, view)) => {
            let dv_at = source::view_row::expand(scope, bb.clone(), kh.clone(), j.clone(), *view);
            store_v(scope, dv, dv_at, k_cols);
        }
        None if !wrt_k => store_v(scope, out, out_at.clone(), 0),
        None => {}
    }
}
