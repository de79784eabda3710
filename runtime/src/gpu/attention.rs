//! The attention kernel, FlashAttention-2 style, assembled on the host from
//! `#[cube]` helpers so that every loop over channels and keys is unrolled.
//!
//! A cube of [`ATTN_ROWS`] units owns `ATTN_ROWS · R` query rows of one
//! (batch, head), `R` rows per unit (rows `u`, `u + ATTN_ROWS`, …; see
//! `plan::AttnTiles`), their queries (pre-scaled) and output
//! accumulators in registers as vectors of the line size. It walks key tiles of `bk` rows: each key row is loaded once
//! per plane, every lane loading its share of the row's vectors, and reaches
//! the other lanes by plane broadcasts. Per tile the scores go to registers,
//! the running max is updated once and the accumulator rescaled once, then
//! `exp(score − max)` weights the value rows.
//!
//! The tiles visited come from the mask, per cube: every visible key lies in
//! an interval of rows per query row, monotone in the row, so the visible
//! tiles are consecutive, the few at either end partly masked and those
//! between seen whole by every row; one loop walks them ([`key_tiles`]), its
//! tile emitted once, and masks a tile's scores only on the boundary (one
//! uniform branch a tile); tiles no row sees are never loaded. Causal cubes
//! run heaviest first.
//!
//! Loop iterations per unit: one per key tile, and per part of a tile
//! unrolled in parts (see `plan::KernelSpec::loop_trips`).

use super::func::{Fns, Indices, Tile};
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
) -> Array<usize> {
    let mut a = Array::<usize>::new(3usize);
    let bh = k::cube_y(fold);
    let i = query_tile(s, bq, kind, fold) * bq + UNIT_POS as usize + comptime![r * ATTN_ROWS];
    let row = min(i, comptime![s - 1]);
    a[ROW_Q] = view_row(bh / h, bh % h, row, comptime![views[0]]);
    a[ROW_OUT] = view_row(bh / h, bh % h, row, comptime![views[3]]);
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
    r[SET_Q0] = q0;
    r[SET_Q1] = q1;
    r
}

/// Whether key tile `kt` is a boundary tile, partly masked for some row of
/// the cube (outside `SET_FULL0..SET_FULL1`).
#[cube]
pub(super) fn boundary_tile(set: &Array<usize>, kt: usize) -> bool {
    kt < set[SET_FULL0] || kt >= set[SET_FULL1]
}

/// Runs `tile(scope, kt, masked)` for every key tile `kt` the cube sees, in
/// one loop so that the tile's code is emitted once. `masked` is `None`
/// when the shape leaves no tile partly masked (no mask or window, whole
/// tiles), else a flag true on the boundary tiles ([`boundary_tile`]), on
/// which the tile masks its scores and clamps its key rows to the last.
pub(super) fn key_tiles(
    scope: &Scope,
    set: &NativeExpand<Array<usize>>,
    a: &Shape,
    bk: usize,
    mut tile: impl FnMut(&Scope, NativeExpand<usize>, Option<NativeExpand<bool>>),
) {
    if a.kind == MASK_NONE && a.window == 0 && a.sk % bk == 0 {
        let full = RangeExpand::new(k::uget::expand(scope, set, SET_FULL0), k::uget::expand(scope, set, SET_FULL1));
        for_expand(scope, full, false, |scope, kt| tile(scope, kt, None));
    } else {
        let seen = RangeExpand::new(k::uget::expand(scope, set, SET_VIS0), k::uget::expand(scope, set, SET_VIS1));
        for_expand(scope, seen, false, |scope, kt| {
            let masked = boundary_tile::expand(scope, set, kt);
            tile(scope, kt, Some(masked))
        });
    }
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
    let cube = |scope: &Scope| {
        let bh = k::cube_y::expand(scope, a.fold);
        (k::idx_div::expand(scope, bh, a.h), k::idx_mod::expand(scope, bh, a.h))
    };
    let at = |scope: &Scope, b, h, jj: usize| {
        let j = k::add_index::expand(scope, k0, k::const_index::expand(scope, jj));
        Indices { b, h, i, j }
    };
    let scores = match &a.fns {
        Some(fns) if fns.score.is_some() => {
            let (b, h) = cube(scope);
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
            let (b, h) = cube(scope);
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

/// With a mask function, key tile `k0 .. k0 + bk` against the cube's query
/// rows: whether some pair may be seen (else the tile is skipped) and
/// whether the mask may hide some pair (else it is not evaluated); `None`
/// without one (`sparsity`).
/// `prep`: the cube's reads ([`prepare_tiles`]).
pub(super) fn tile_state(
    scope: &Scope,
    set: &NativeExpand<Array<usize>>,
    k0: NativeExpand<usize>,
    bk: usize,
    a: &Shape,
    prep: &[NativeExpand<f32>],
) -> Option<(NativeExpand<bool>, NativeExpand<bool>)> {
    let fns = a.fns.as_ref()?;
    fns.tiles.as_ref()?;
    let mut at = cube_tile(scope, set, a);
    (at.j0, at.j1) = (k0, last_key::expand(scope, k0, bk, a.sk));
    fns.tile(scope, &at, prep, true)
}

/// The cube's batch, head and query rows, as a tile (its key rows unset).
fn cube_tile(scope: &Scope, set: &NativeExpand<Array<usize>>, a: &Shape) -> Tile {
    let bh = k::cube_y::expand(scope, a.fold);
    let (b, h) = (k::idx_div::expand(scope, bh, a.h), k::idx_mod::expand(scope, bh, a.h));
    let (i0, i1) = (k::uget::expand(scope, set, SET_Q0), k::uget::expand(scope, set, SET_Q1));
    Tile { b, h, i0, i1, j0: i0, j1: i1 }
}

/// The reads of the mask's tile functions that are the same for every key
/// tile (`func::Fns::prepare`), made once per cube before the tile loop.
pub(super) fn prepare_tiles(scope: &Scope, set: &NativeExpand<Array<usize>>, a: &Shape) -> Vec<NativeExpand<f32>> {
    match a.fns.as_ref().filter(|f| f.tiles.is_some()) {
        Some(fns) => fns.prepare(scope, &cube_tile(scope, set, a), true),
        None => vec![],
    }
}

/// The most key tiles a cube lists in shared memory ([`walk_tiles`]); past
/// it, each tile is tested in the loop instead.
const LISTED_TILES: usize = 8192;

/// Runs `tile(scope, kt, masked, hidden)` for every key tile `kt` the cube
/// may see: [`key_tiles`]' tiles, and with a mask function's tile functions
/// only those they may see (`hidden`: whether the mask may hide a key of
/// it). The visible tiles are listed first, by one unit, in shared memory,
/// and the loop walks the list: Mesa's CPU drivers run both sides of a
/// branch, so a tile skipped by a branch would cost as much as one computed.
pub(super) fn walk_tiles(
    scope: &Scope,
    set: &NativeExpand<Array<usize>>,
    a: &Shape,
    bk: usize,
    prep: &[NativeExpand<f32>],
    mut tile: impl FnMut(&Scope, NativeExpand<usize>, Option<NativeExpand<bool>>, Option<NativeExpand<bool>>),
) {
    let tiles = a.sk.div_ceil(bk);
    let listed = a.fns.as_ref().is_some_and(|f| f.tiles.is_some());
    if !listed {
        return key_tiles(scope, set, a, bk, |scope, kt, masked| tile(scope, kt, masked, None));
    }
    if tiles > LISTED_TILES {
        return key_tiles(scope, set, a, bk, |scope, kt, masked| {
            let k0 = k::mul_const::expand(scope, kt, bk);
            visit_tile(scope, set, k0, bk, a, prep, |scope, hidden| tile(scope, kt, masked, hidden));
        });
    }
    // Unit 0 lists the tiles (a flag bit marks the mask hiding part of one), the cube waits, all walk.
    let list = tile_list::expand(scope, tiles + 1);
    let first = first_unit::expand(scope);
    if_expand(scope, first, |scope| {
        let mut count = counter::expand(scope);
        key_tiles(scope, set, a, bk, |scope, kt, _| {
            let k0 = k::mul_const::expand(scope, kt, bk);
            let (any, hidden) = tile_state(scope, set, k0, bk, a, prep).expect("tile functions");
            let mut list = list.clone_unchecked();
            if_expand(scope, any, |scope| push_tile::expand(scope, &mut list, &mut count, kt, hidden));
        });
        let mut list = list.clone_unchecked();
        close_list::expand(scope, &mut list, &count, tiles);
    });
    sync_cube::expand(scope);
    let count = listed_count::expand(scope, &list, tiles);
    let masked = !(a.kind == MASK_NONE && a.window == 0 && a.sk % bk == 0);
    let range = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), count);
    for_expand(scope, range, false, |scope, n| {
        let entry = listed_entry::expand(scope, &list, n);
        let kt = entry_tile::expand(scope, entry);
        let masked = masked.then(|| boundary_tile::expand(scope, set, kt));
        tile(scope, kt, masked, Some(entry_hidden::expand(scope, entry)))
    });
}

/// The flag bit of a listed tile: the mask may hide some of its keys.
const HIDDEN_BIT: u32 = 1 << 31;

#[cube]
fn tile_list(#[comptime] n: usize) -> Shared<[u32]> {
    Shared::<[u32]>::new_slice(n)
}

#[cube]
fn first_unit() -> bool {
    UNIT_POS == 0
}

#[cube]
fn counter() -> Array<u32> {
    let mut c = Array::<u32>::new(1usize);
    c[0] = 0u32;
    c
}

#[cube]
fn push_tile(list: &mut [u32], count: &mut Array<u32>, kt: usize, hidden: bool) {
    let mut e = u32::cast_from(kt);
    if hidden {
        e |= u32::new(HIDDEN_BIT as i64);
    }
    list[count[0] as usize] = e;
    count[0] += 1u32;
}

#[cube]
fn close_list(list: &mut [u32], count: &Array<u32>, #[comptime] tiles: usize) {
    list[tiles] = count[0];
}

#[cube]
fn listed_count(list: &[u32], #[comptime] tiles: usize) -> usize {
    list[tiles] as usize
}

#[cube]
fn listed_entry(list: &[u32], n: usize) -> u32 {
    list[n]
}

#[cube]
fn entry_tile(e: u32) -> usize {
    (e & u32::new((HIDDEN_BIT - 1) as i64)) as usize
}

#[cube]
fn entry_hidden(e: u32) -> bool {
    (e & u32::new(HIDDEN_BIT as i64)) != 0u32
}

/// Runs `tile(scope, hidden)` for key tile `k0 ..`, skipped where the mask
/// function sees none of it ([`tile_state`]).
pub(super) fn visit_tile(
    scope: &Scope,
    set: &NativeExpand<Array<usize>>,
    k0: NativeExpand<usize>,
    bk: usize,
    a: &Shape,
    prep: &[NativeExpand<f32>],
    tile: impl FnOnce(&Scope, Option<NativeExpand<bool>>),
) {
    match tile_state(scope, set, k0, bk, a, prep) {
        Some((any, hidden)) => if_expand(scope, any, |scope| tile(scope, Some(hidden))),
        None => tile(scope, None),
    }
}

/// The last key row of tile `k0 ..` of `bk` rows.
#[cube]
fn last_key(k0: usize, #[comptime] bk: usize, #[comptime] sk: usize) -> usize {
    min(k0 + comptime![bk - 1], comptime![sk - 1])
}

/// `score` where `seen`, else [`MASKED`].
#[cube]
fn seen_or_masked(seen: bool, score: f32) -> f32 {
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
}

/// Emit the kernel body for vectors of `N` (`lanes` floats), spreading each
/// key and value row over planes of `plane` units (1: every unit loads whole rows).
#[allow(clippy::too_many_arguments)]
pub fn build<N: Size>(
    scope: &Scope,
    q: &NativeExpand<[Vector<Stored, N>]>,
    kb: &NativeExpand<[Vector<Stored, N>]>,
    v: &NativeExpand<[Vector<Stored, N>]>,
    out: &mut NativeExpand<[Vector<Stored, N>]>,
    scale: NativeExpand<f32>,
    a: &Shape,
    lanes: usize,
    plane: u32,
) {
    let (dl, el) = (a.d / lanes, a.e / lanes);
    let (bk, nr) = (a.tiles.key_tile, a.tiles.unit_rows);
    let bq = ATTN_ROWS * nr;
    let set = setup::expand(scope, a.h, a.hk, a.s, a.sk, bq, bk, a.kind, a.window, a.block, a.views, a.fold);
    let mut units = Vec::with_capacity(nr);
    for r in 0..nr {
        let slots = row_slots::expand(scope, a.h, a.s, bq, a.kind, r, a.views, a.fold);
        let qr = load_query::expand::<N>(scope, q, k::uget::expand(scope, &slots, ROW_Q), scale, dl);
        let acc = k::vzeros::expand::<N>(scope, el);
        let state = softmax_state::expand(scope);
        units.push(UnitRow { slots, qr, acc, state });
    }
    let lane = k::plane_lane::expand(scope, plane.max(1));
    // The tile's rows unrolled at once; a wider tile (fragment tiling) is
    // walked in parts, an online-softmax step each.
    let part = a.tiles.unrolled_rows(dl + el, a.half);
    let prep = prepare_tiles(scope, &set, a);
    walk_tiles(scope, &set, a, bk, &prep, |scope, kt, masked, hidden| {
        let k0 = k::mul_const::expand(scope, kt, bk);
        let tile = |scope: &Scope, k0| {
            let t = KeyTile { a, set: &set, kb, v, rows: &units, lane, k0, bk: part, dl, el, plane, masked, hidden };
            t.emit(scope)
        };
        if part == bk {
            tile(scope, k0);
        } else {
            let parts =
                RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, bk / part));
            for_expand(scope, parts, false, |scope, p| {
                let at = k::mul_const::expand(scope, p, part);
                tile(scope, k::add_index::expand(scope, k0, at))
            });
        }
    });
    for u in &units {
        store_row::expand::<N>(scope, out, &u.acc, &u.state, &u.slots, a.s, el);
    }
}

/// One query row of a unit: its addresses, scaled query, accumulator and
/// softmax state `[running max, running sum]`.
struct UnitRow<N: Size> {
    slots: NativeExpand<Array<usize>>,
    qr: NativeExpand<Array<Vector<f32, N>>>,
    acc: NativeExpand<Array<Vector<f32, N>>>,
    state: NativeExpand<Array<f32>>,
}

/// One key tile of one cube, starting at key row `k0`.
struct KeyTile<'a, N: Size> {
    a: &'a Shape,
    set: &'a NativeExpand<Array<usize>>,
    kb: &'a NativeExpand<[Vector<Stored, N>]>,
    v: &'a NativeExpand<[Vector<Stored, N>]>,
    rows: &'a [UnitRow<N>],
    lane: NativeExpand<usize>,
    k0: NativeExpand<usize>,
    bk: usize,
    dl: usize,
    el: usize,
    plane: u32,
    masked: Option<NativeExpand<bool>>,
    /// Whether the mask function may hide a key of the tile (`tile_state`).
    hidden: Option<NativeExpand<bool>>,
}

impl<N: Size> KeyTile<'_, N> {
    /// The `n` vectors of row `row` of `x`, in chunk order: loaded by their
    /// lanes and broadcast when rows are spread over a plane.
    fn row(
        &self,
        scope: &Scope,
        x: &NativeExpand<[Vector<Stored, N>]>,
        row: NativeExpand<usize>,
        n: usize,
    ) -> Vec<NativeExpand<Vector<f32, N>>> {
        if self.plane <= 1 {
            let zero = NativeExpand::from_lit(scope, 0usize);
            return (0..n).map(|c| k::vload_share::expand::<N>(scope, x, row, zero, n, c, n)).collect();
        }
        let per = n.div_ceil(self.plane as usize);
        let held: Vec<_> = (0..per).map(|r| k::vload_share::expand::<N>(scope, x, row, self.lane, per, r, n)).collect();
        (0..n).map(|c| k::from_lane::expand::<N>(scope, held[c % per], (c / per) as u32)).collect()
    }

    /// Every key row of the tile is loaded once and serves each of the
    /// unit's query rows; then one rescale per row, and each value row is
    /// loaded once and accumulated into every row.
    fn emit(&self, scope: &Scope) {
        let a = self.a;
        let k_base = k::uget::expand(scope, self.set, SET_K);
        let v_base = k::uget::expand(scope, self.set, SET_V);
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|u| {
                let i = k::uget::expand(scope, &u.slots, ROW_I);
                let qr: Vec<_> = (0..self.dl).map(|c| k::vget::expand::<N>(scope, &u.qr, c)).collect();
                (i, qr)
            })
            .collect();
        let mut scores = vec![Vec::with_capacity(self.bk); rows.len()];
        let mut value_rows = Vec::with_capacity(self.bk);
        for jj in 0..self.bk {
            let clamp = self.masked.is_some();
            let row = key_row::expand(scope, self.k0, k_base, jj, a.sk, clamp, a.views[1]);
            value_rows.push(key_row::expand(scope, self.k0, v_base, jj, a.sk, clamp, a.views[2]));
            let keys = self.row(scope, self.kb, row, self.dl);
            for ((_, qr), sc) in rows.iter().zip(&mut scores) {
                let mut dot = k::fconst::expand(scope, 0.0);
                for (qc, kc) in qr.iter().zip(&keys) {
                    dot = k::dot_add::expand::<N>(scope, dot, *qc, *kc);
                }
                sc.push(dot);
            }
        }
        let scores: Vec<_> = (rows.iter().zip(scores))
            .map(|((i, _), sc)| mask_scores(scope, sc, &self.masked, self.hidden, *i, self.k0, a))
            .collect();
        // One rescale per row and tile.
        let mut outs = vec![];
        let mut m_news = vec![];
        let mut ls = vec![];
        for (u, sc) in self.rows.iter().zip(&scores) {
            let m_old = k::fget::expand(scope, &u.state, 0);
            let m_new = sc.iter().fold(m_old, |m, s| k::fmax::expand(scope, m, *s));
            let corr = k::exp_diff::expand(scope, m_old, m_new);
            ls.push(k::fmul::expand(scope, k::fget::expand(scope, &u.state, 1), corr));
            outs.push(
                (0..self.el)
                    .map(|c| k::vscale::expand::<N>(scope, k::vget::expand::<N>(scope, &u.acc, c), corr))
                    .collect::<Vec<_>>(),
            );
            m_news.push(m_new);
        }
        for (jj, row) in value_rows.into_iter().enumerate() {
            let vals = self.row(scope, self.v, row, self.el);
            for r in 0..self.rows.len() {
                let p = k::exp_diff::expand(scope, scores[r][jj], m_news[r]);
                ls[r] = k::fadd::expand(scope, ls[r], p);
                for (o, vc) in outs[r].iter_mut().zip(&vals) {
                    *o = k::axpy::expand::<N>(scope, *o, p, *vc);
                }
            }
        }
        for (r, u) in self.rows.iter().enumerate() {
            let mut acc = u.acc;
            let mut state = u.state;
            for (c, o) in outs[r].iter().enumerate() {
                k::vset::expand::<N>(scope, &mut acc, c, *o);
            }
            k::fset::expand(scope, &mut state, 0, m_news[r]);
            k::fset::expand(scope, &mut state, 1, ls[r]);
        }
    }
}
