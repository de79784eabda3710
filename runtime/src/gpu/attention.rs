//! What every attention kernel shares: the launch's [`Shape`], the
//! per-cube setup (which query rows, which band of key tiles the mask
//! leaves), the masks, query loads, the online-softmax state and the output
//! store. The kernels are `attention_tiled` (CPU-tiled), `attention_split`
//! (register-tiled) and `mma::flash` (tensor-core fragments); which key
//! tiles a cube walks is `tiles`.

use super::func::{Fns, Indices};
use super::kernels::{self as k, shifted, visible, Stored, MASK_CAUSAL, MASK_NONE, MASK_TOKEN_CAUSAL};
use attnc_compiler::plan::{AttnTiles, RowView, ATTN_ROWS};
use cubecl::prelude::*;

pub(super) use super::kernels::{MASKED, M_INIT};

/// Slots of the per-cube setup array.
pub const SET_K: usize = 0;
pub const SET_V: usize = 1;
pub const SET_FULL0: usize = 2;
pub const SET_FULL1: usize = 3;
pub const SET_VIS0: usize = 4;
pub const SET_VIS1: usize = 5;
/// The cube's first and last query rows.
pub const SET_Q0: usize = 6;
pub const SET_Q1: usize = 7;
const SET_LEN: usize = 8;
/// Slots of a unit's row array ([`row_slots`]).
pub const ROW_Q: usize = 0;
pub const ROW_OUT: usize = 1;
pub const ROW_I: usize = 2;

/// Vector offset of row `r` of head `(b, h)` in a view (strides in vectors).
#[cube]
pub(super) fn view_row(b: usize, h: usize, r: usize, #[comptime] v: RowView) -> usize {
    let at = b * comptime![v.batch] + h * comptime![v.head] + comptime![v.offset];
    row_at(at, r, v)
}

/// `base` plus row `r`'s offset in view `v` (rows in blocks of `v.block`).
#[cube]
pub(super) fn row_at(base: usize, r: usize, #[comptime] v: RowView) -> usize {
    let mut at = base;
    if comptime![v.block == 1] {
        at += r * comptime![v.outer];
    } else {
        at += r / comptime![v.block] * comptime![v.outer] + r % comptime![v.block] * comptime![v.inner];
    }
    at
}

/// First key position (in the masks' shifted coordinates) that position `p` sees.
#[cube]
pub(super) fn key_lo(p: usize, #[comptime] kind: u32, #[comptime] window: usize, #[comptime] block: usize) -> usize {
    let mut lo = 0usize;
    if comptime![window > 0] {
        if comptime![kind == MASK_CAUSAL] {
            let w = comptime![window * block];
            if p + 1 > w {
                lo = p + 1 - w;
            }
        } else {
            let n = p / block;
            if n + 1 > window {
                lo = (n + 1 - window) * block;
            }
        }
    }
    lo
}

/// One past the last key position that position `p` sees (`inf` when unbounded).
#[cube]
pub(super) fn key_hi(
    p: usize,
    #[comptime] kind: u32,
    #[comptime] window: usize,
    #[comptime] block: usize,
    #[comptime] inf: usize,
) -> usize {
    let mut hi = inf.runtime();
    if comptime![kind == MASK_CAUSAL] {
        hi = p + 1;
    } else if comptime![kind == MASK_TOKEN_CAUSAL] {
        hi = (p / block + 1) * block;
    } else if comptime![window > 0] {
        hi = (p / block + window) * block;
    }
    hi
}

/// A shifted position as a row of a side whose positions start at `koff`
/// (keys, or queries with their offset), clamped to `0..=sk`.
#[cube]
pub(super) fn key_row_of(p: usize, #[comptime] koff: usize, #[comptime] sk: usize) -> usize {
    let mut j = 0usize;
    if p > koff {
        j = p - koff;
    }
    if j > sk {
        j = sk;
    }
    j
}

/// This cube's query tile; causal cubes in reverse, since later query tiles
/// see more keys and should start first.
#[cube]
pub(super) fn query_tile(
    #[comptime] s: usize,
    #[comptime] bq: usize,
    #[comptime] kind: u32,
    #[comptime] fold: usize,
) -> usize {
    let mut qt = k::cube_x(fold);
    if comptime![kind != MASK_NONE] {
        qt = comptime![s.div_ceil(bq) - 1] - qt;
    }
    qt
}

/// Addresses of this unit's `r`-th query row (slots `ROW_*`): the row of
/// the query and of the output (clamped to the last row) and its index.
#[cube]
pub(super) fn row_slots(
    #[comptime] h: usize,
    #[comptime] s: usize,
    #[comptime] bq: usize,
    #[comptime] kind: u32,
    #[comptime] r: usize,
    #[comptime] views: [RowView; 4],
    #[comptime] fold: usize,
    #[comptime] split_stride: usize,
) -> Array<usize> {
    let mut a = Array::<usize>::new(3usize);
    let bh = k::cube_y(fold);
    let i = query_tile(s, bq, kind, fold) * bq + UNIT_POS as usize + comptime![r * ATTN_ROWS];
    let row = min(i, comptime![s - 1]);
    a[ROW_Q] = view_row(bh / h, bh % h, row, comptime![views[0]]);
    a[ROW_OUT] = view_row(bh / h, bh % h, row, comptime![views[3]]);
    // Split-KV: the cube's chunk of partial rows (grid z).
    if comptime![split_stride > 0] {
        a[ROW_OUT] += CUBE_POS_Z as usize * split_stride;
    }
    a[ROW_I] = i;
    a
}

/// The cube's key and value bases and key-tile ranges (slots `SET_*`), for
/// query tiles of `bq` rows.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn setup(
    #[comptime] h: usize,
    #[comptime] hk: usize,
    #[comptime] s: usize,
    #[comptime] sk: usize,
    #[comptime] bq: usize,
    #[comptime] bk: usize,
    #[comptime] kind: u32,
    #[comptime] window: usize,
    #[comptime] block: usize,
    #[comptime] views: [RowView; 4],
    #[comptime] fold: usize,
    #[comptime] split_tiles: usize,
) -> Array<usize> {
    let mut r = Array::<usize>::new(comptime![SET_LEN]);
    let bh = k::cube_y(fold);
    let g = (bh % h) / comptime![h / hk];
    let q0 = query_tile(s, bq, kind, fold) * bq;
    let q1 = min(q0 + comptime![bq - 1], comptime![s - 1]);
    let b = bh / h;
    r[SET_K] = view_row(b, g, 0, comptime![views[1]]);
    r[SET_V] = view_row(b, g, 0, comptime![views[2]]);
    // Queries are the last `s` of `sk` positions: query row `i` is position
    // `i + sk` against key position `j + s` (as `Mask::visible`).
    let qoff = comptime![if s == sk { 0 } else { sk }];
    let koff = comptime![if s == sk { 0 } else { s }];
    let inf = comptime![sk + koff];
    let (p0, p1) = (shifted(q0, qoff), shifted(q1, qoff));
    // Keys some row sees, and keys every row sees.
    let any0 = key_row_of(key_lo(p0, kind, window, block), koff, sk);
    let any1 = key_row_of(key_hi(p1, kind, window, block, inf), koff, sk);
    let all0 = key_row_of(key_lo(p1, kind, window, block), koff, sk);
    let all1 = key_row_of(key_hi(p0, kind, window, block, inf), koff, sk);
    let vis0 = any0 / bk;
    let mut vis1 = (any1 + comptime![bk - 1]) / bk;
    if any1 <= any0 {
        vis1 = vis0;
    }
    let mut full0 = (all0 + comptime![bk - 1]) / bk;
    let mut full1 = all1 / bk;
    if all1 <= all0 || full1 <= full0 {
        full0 = vis1;
        full1 = vis1;
    }
    r[SET_FULL0] = full0;
    r[SET_FULL1] = full1;
    r[SET_VIS0] = vis0;
    r[SET_VIS1] = vis1;
    if comptime![split_tiles > 0] {
        split_range(&mut r, split_tiles);
    }
    r[SET_Q0] = q0;
    r[SET_Q1] = q1;
    r
}

/// Split-KV: narrows the cube's key tiles (`SET_*`) to its chunk of
/// `tiles` key tiles (the grid's z), keeping `vis0 ≤ full0 ≤ full1 ≤ vis1`.
#[cube]
fn split_range(r: &mut Array<usize>, #[comptime] tiles: usize) {
    let lo = CUBE_POS_Z as usize * tiles;
    let vis0 = max(r[SET_VIS0], lo);
    let vis1 = max(min(r[SET_VIS1], lo + tiles), vis0);
    let full0 = min(max(r[SET_FULL0], vis0), vis1);
    r[SET_FULL1] = min(max(r[SET_FULL1], full0), vis1);
    r[SET_FULL0] = full0;
    r[SET_VIS0] = vis0;
    r[SET_VIS1] = vis1;
}

/// The cube's batch and head.
pub(super) fn cube_head(scope: &Scope, a: &Shape) -> (NativeExpand<usize>, NativeExpand<usize>) {
    let bh = k::cube_y::expand(scope, a.fold);
    (k::idx_div::expand(scope, bh, a.h), k::idx_mod::expand(scope, bh, a.h))
}

/// Masks the scores of a boundary tile (`masked`) for query row `i` of key
/// rows `k0 ..`: one uniform branch a tile, the full tiles pass unchanged.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn mask_tile(
    scores: &mut Array<f32>,
    masked: bool,
    i: usize,
    k0: usize,
    #[comptime] bk: usize,
    #[comptime] s: usize,
    #[comptime] sk: usize,
    #[comptime] kind: u32,
    #[comptime] window: usize,
    #[comptime] block: usize,
) {
    if masked {
        #[unroll]
        for jj in 0..bk {
            scores[jj] = mask_score(scores[jj], i, k0, jj, s, sk, kind, window, block);
        }
    }
}

/// [`mask_tile`] over the tile's scores as host-side values: they go through
/// a register array and come back masked (unchanged with no `masked` flag
/// and no mask function). Score and mask functions (`a.fns`) apply first:
/// the score function to every scaled logit, the mask function (its hidden
/// keys set to [`MASKED`]) on every tile, or, with `hidden` (the tile's
/// classification, [`tile_state`]), only where it may hide a key.
#[allow(clippy::too_many_arguments)]
pub(super) fn mask_scores(
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
            let (b, h) = cube_head(scope, a);
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
            let (b, h) = cube_head(scope, a);
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
        mask_tile::expand(scope, &mut arr, *masked, i, k0, bk, a.s, a.sk, a.kind, a.window, a.block);
    }
    (0..bk).map(|jj| k::fget::expand(scope, &arr, jj)).collect()
}

/// `score` where `seen`, else [`MASKED`].
#[cube]
pub(super) fn seen_or_masked(seen: bool, score: f32) -> f32 {
    select(seen, score, f32::new(MASKED))
}

/// Vector offset of key row `k0 + jj` (clamped to the last) in view `v`, from
/// the offset `base` of row 0 of the head.
#[cube]
pub(super) fn key_row(
    k0: usize,
    base: usize,
    #[comptime] jj: usize,
    #[comptime] sk: usize,
    #[comptime] clamp: bool,
    #[comptime] v: RowView,
) -> usize {
    let mut j = k0 + jj;
    if comptime![clamp] {
        j = min(j, comptime![sk - 1]);
    }
    row_at(base, j, v)
}

/// `score` if query row `i` sees key row `k0 + jj`, else [`MASKED`].
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn mask_score(
    score: f32,
    i: usize,
    k0: usize,
    #[comptime] jj: usize,
    #[comptime] s: usize,
    #[comptime] sk: usize,
    #[comptime] kind: u32,
    #[comptime] window: usize,
    #[comptime] block: usize,
) -> f32 {
    let j = k0 + jj;
    let qoff = comptime![if s == sk { 0 } else { sk }];
    let koff = comptime![if s == sk { 0 } else { s }];
    let mut r = f32::new(MASKED);
    if j < sk && visible(shifted(i, qoff), shifted(j, koff), kind, window, block) {
        r = score;
    }
    r
}

/// This unit's query row, scaled.
#[cube]
pub(super) fn load_query<N: Size>(
    q: &[Vector<Stored, N>],
    base: usize,
    scale: f32,
    #[comptime] dl: usize,
) -> Array<Vector<f32, N>> {
    let mut a = Array::<Vector<f32, N>>::new(dl);
    #[unroll]
    for c in 0..dl {
        a[c] = Vector::<f32, N>::cast_from(q[base + c]) * Vector::new(scale);
    }
    a
}

/// `[running max, running sum]`.
#[cube]
pub(super) fn softmax_state() -> Array<f32> {
    let mut a = Array::<f32>::new(2usize);
    a[0] = f32::new(M_INIT);
    a[1] = f32::new(0.0);
    a
}

/// `1 / l` of a softmax state `[max, l]`, or 0 for a row that saw no key (`l = 0`).
#[cube]
pub(super) fn inverse_sum(state: &Array<f32>) -> f32 {
    let l = state[1];
    let mut inv = f32::new(0.0);
    if l != f32::new(0.0) {
        inv = f32::new(1.0) / l;
    }
    inv
}

/// `out = acc / l`; a row that saw no key (`l = 0`) is 0, and NaN stays NaN.
#[cube]
pub(super) fn store_row<N: Size>(
    out: &mut [Vector<Stored, N>],
    acc: &Array<Vector<f32, N>>,
    state: &Array<f32>,
    rows: &Array<usize>,
    #[comptime] s: usize,
    #[comptime] el: usize,
) {
    if rows[ROW_I] < s {
        let inv = inverse_sum(state);
        let base = rows[ROW_OUT];
        #[unroll]
        for c in 0..el {
            out[base + c] = Vector::<Stored, N>::cast_from(acc[c] * Vector::new(inv));
        }
    }
}

/// The log-sum-exp a row that sees no key stores (WGSL has no infinite
/// literals; in f16 it rounds to −∞). Any value below
/// `attention_grad::NO_KEYS_BELOW` marks such a row, whose gradients are 0
/// (its output is the constant 0).
pub const NO_KEYS: f32 = MASKED;

/// A softmax row's log-sum-exp from its running maximum `m` and sum `l`
/// (of `e^(x − m)`): `m + ln(l)`, or `empty` for a row that saw no key.
#[cube]
pub(super) fn log_sum_exp(m: f32, l: f32, #[comptime] empty: f32) -> f32 {
    let mut v = f32::new(empty);
    if l > f32::new(0.0) {
        v = m + l.ln();
    }
    v
}

/// The row's log-sum-exp `max + ln(sum)` at `[b·H + h, i]`, `NO_KEYS` for a
/// row that saw no key (`sum = 0`), for rows inside the `s` queries.
#[cube]
pub(super) fn store_lse(
    out: &mut [Stored],
    state: &Array<f32>,
    rows: &Array<usize>,
    #[comptime] s: usize,
    #[comptime] fold: usize,
) {
    let i = rows[ROW_I];
    if i < s {
        let v = log_sum_exp(state[0], state[1], NO_KEYS);
        out[k::cube_y(fold) * comptime![s] + i] = Stored::cast_from(v);
    }
}

/// The attention launch's shape, as the plan gives it.
pub struct Shape {
    pub h: usize,
    pub hk: usize,
    pub s: usize,
    pub sk: usize,
    pub d: usize,
    pub e: usize,
    pub kind: u32,
    pub window: usize,
    pub block: usize,
    /// Layouts of q, k, v and the output, strides in vectors.
    pub views: [RowView; 4],
    pub tiles: AttnTiles,
    /// The grid's fold (`plan::KernelSpec::fold_x`).
    pub fold: usize,
    /// 16-bit storage (each load also converts).
    pub half: bool,
    /// Score and mask functions and the tensors they read.
    pub fns: Option<Fns>,
    /// Split-KV decoding (`plan::KvSplit`), in the kernel's units.
    pub kv: Option<Split>,
    /// Keys and values in a paged cache, and its block table.
    pub paged: Option<Paged>,
    /// Where to write each query row's log-sum-exp beside its output
    /// (`plan::KernelSpec::Attention::lse`, for the backward), row-major `[B, H, S]`.
    pub lse: Option<NativeExpand<[Stored]>>,
}

/// A paged cache read in place (`plan::PagedRows`): its block table (a
/// binding after the captures) and the elements an entry takes.
pub struct Paged {
    pub rows: attnc_compiler::plan::PagedRows,
    pub table: NativeExpand<[Stored]>,
    pub digits: usize,
}

/// The address of key (or value) row `k0 + jj` under view `v` from the
/// head's base: [`key_row`], or through the block table of a paged cache.
#[allow(clippy::too_many_arguments)]
pub(super) fn key_address(
    scope: &Scope,
    a: &Shape,
    k0: NativeExpand<usize>,
    base: NativeExpand<usize>,
    jj: usize,
    clamp: bool,
    v: RowView,
) -> NativeExpand<usize> {
    match &a.paged {
        None => key_row::expand(scope, k0, base, jj, a.sk, clamp, v),
        Some(p) => {
            let (b, _) = cube_head(scope, a);
            let r = p.rows;
            paged_key_row::expand(
                scope, &p.table, b, k0, base, jj, a.sk, clamp, v.outer, r.page, r.slots, r.blocks, p.digits,
            )
        }
    }
}

/// [`key_row`] in a paged cache ([`k::page_row`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn paged_key_row(
    table: &[Stored],
    b: usize,
    k0: usize,
    base: usize,
    #[comptime] jj: usize,
    #[comptime] sk: usize,
    #[comptime] clamp: bool,
    #[comptime] outer: usize,
    #[comptime] page: usize,
    #[comptime] slots: usize,
    #[comptime] blocks: usize,
    #[comptime] digits: usize,
) -> usize {
    let mut j = k0 + jj;
    if comptime![clamp] {
        j = min(j, comptime![sk - 1]);
    }
    base + k::page_row(table, b, j, slots, page, blocks, digits) * outer
}

/// A split-KV launch's chunks in a kernel's units: key tiles per chunk,
/// and, in vectors, the chunks' stride in the partial output and the
/// offsets within a partial row of its `lo` parts and its log-sum-exp.
#[derive(Clone, Copy)]
pub struct Split {
    pub tiles: usize,
    pub stride: usize,
    pub lo: usize,
    pub lse: usize,
}

/// The log-sum-exp `hi` part of a split-KV chunk whose row sees no key
/// (finite in f16 and bf16; a real one is far above [`NO_KEYS_ABOVE`]).
const NO_KEYS_PARTIAL: f32 = -60000.0;
const NO_KEYS_ABOVE: f32 = -59000.0;

/// A split-KV partial row (`plan::KvSplit`): `x = acc / l` as `hi` (stored)
/// and `lo = x − hi` at `lo` vectors on, and the row's log-sum-exp likewise
/// at `rows[base] + lse` (`NO_KEYS_PARTIAL` for a row that saw no key).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn store_partial<N: Size>(
    out: &mut [Vector<Stored, N>],
    acc: &Array<Vector<f32, N>>,
    state: &Array<f32>,
    rows: &Array<usize>,
    #[comptime] base: usize,
    #[comptime] s: usize,
    #[comptime] el: usize,
    #[comptime] split: Split,
) {
    if rows[ROW_I] < s {
        let inv = inverse_sum(state);
        let at = rows[ROW_OUT];
        #[unroll]
        for c in 0..el {
            let x = acc[c] * Vector::new(inv);
            let hi = Vector::<Stored, N>::cast_from(x);
            out[at + c] = hi;
            out[at + comptime![split.lo] + c] = Vector::<Stored, N>::cast_from(x - Vector::<f32, N>::cast_from(hi));
        }
        let lse = log_sum_exp(state[0], state[1], NO_KEYS_PARTIAL);
        let hi = Stored::cast_from(lse);
        let row = rows[base] + comptime![split.lse];
        out[row] = Vector::new(hi);
        out[row + 1] = Vector::new(Stored::cast_from(lse - f32::cast_from(hi)));
    }
}

/// The output address of element `i` of a split-KV launch's merged rows
/// `[b, h, row, c]` (`e` floats a row) under the attention's view `out`.
#[cube]
pub(super) fn combined_at(
    i: usize,
    #[comptime] h: usize,
    #[comptime] s: usize,
    #[comptime] e: usize,
    #[comptime] out: RowView,
) -> usize {
    let r = i / e;
    view_row(r / comptime![h * s], (r / s) % h, r % s, out) + i % e
}

/// Merges the `splits` partial rows of element `i` (`plan::KvSplit`;
/// `rows` rows a chunk, `row` floats a partial row, `lanes` floats a
/// vector) by their log-sum-exp into `out[at]`; 0 where no chunk saw a key.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn combine(
    p: &[Stored],
    out: &mut [Stored],
    i: usize,
    at: usize,
    #[comptime] splits: usize,
    #[comptime] rows: usize,
    #[comptime] e: usize,
    #[comptime] row: usize,
    #[comptime] lanes: usize,
) {
    let (c, r) = (i % e, i / e);
    let mut m = f32::new(-3.0e38);
    for z in 0..splits {
        let at0 = (z * rows + r) * row + comptime![2 * e];
        let hi = f32::cast_from(p[at0]);
        if hi > f32::new(NO_KEYS_ABOVE) {
            m = max(m, hi + f32::cast_from(p[at0 + lanes]));
        }
    }
    let mut num = f32::new(0.0);
    let mut den = f32::new(0.0);
    for z in 0..splits {
        let at0 = (z * rows + r) * row;
        let hi = f32::cast_from(p[at0 + comptime![2 * e]]);
        if hi > f32::new(NO_KEYS_ABOVE) {
            let w = (hi + f32::cast_from(p[at0 + comptime![2 * e + lanes]]) - m).exp();
            num += w * (f32::cast_from(p[at0 + c]) + f32::cast_from(p[at0 + e + c]));
            den += w;
        }
    }
    let mut v = f32::new(0.0);
    if den > f32::new(0.0) {
        v = num / den;
    }
    out[at] = Stored::cast_from(v);
}
