//! The GEMM `out[rows, f] = a[rows, k] · b[k, f]`, register-blocked and
//! assembled on the host from `#[cube]` helpers.
//!
//! A cube of [`GEMM_UNITS`] units computes `GEMM_UNITS · GEMM_ROWS` rows by
//! `cols` vectors of the line size; each unit owns [`GEMM_ROWS`] rows (strided
//! by the cube size) and all `cols` column vectors, so it keeps
//! `GEMM_ROWS · cols` vector accumulators in registers. Two ways to feed them:
//!
//! - [`build`] (Mesa's CPU drivers, offline WGSL): per step of one line of
//!   `k`, a unit loads one vector of each of its rows of `a`; the `b` rows'
//!   vectors are loaded once per plane, a share per lane, and reach the other
//!   lanes by plane broadcasts. The one runtime loop walks `k` by lines.
//! - [`build_staged`] (GPUs): the cube copies a stage of [`GEMM_STAGE_K`]
//!   floats of `k` of its `a` rows and `b` columns into shared memory,
//!   coalesced (consecutive units read consecutive vectors) and zero-filled
//!   past `k`, while it computes on the previous stage: two buffers, one
//!   barrier per stage. The runtime loop walks the stages.
//!
//! Prologue and epilogue: `a` is read through row and column views (merged
//! heads, slices of a merged projection), `b` through its views too, along
//! its rows or, transposed (a weight's transpose in a gradient), in
//! `lanes` × `lanes` blocks down its columns that registers transpose
//! ([`GemmB`]), and the
//! epilogue either stores the tile or mixes heads ([`MixEpilogue`]), for which
//! a cube's columns are `ce` channel vectors of each of the `m` heads.

use super::kernels::{self as k, Stored};
use crate::gpu::kernels::Vecs;
use attnc_compiler::plan::{gemm_cols, GemmB, MixEpilogue, View, GEMM_ROWS, GEMM_STAGE_K, GEMM_UNITS};
use cubecl::prelude::*;

/// A GEMM's sizes (floats) and its operands' addressing (vectors): row `r`,
/// column vector `c` of `a` at `a_rows(r) + a_cols(c)`, `b` as [`GemmB`] says.
pub struct Shape {
    pub rows: usize,
    pub kdim: usize,
    pub f: usize,
    pub a_rows: View,
    pub a_cols: View,
    pub b: GemmB,
    /// A mixing epilogue and its coefficients.
    pub mix: Option<(MixEpilogue, NativeExpand<[Stored]>)>,
    /// A constant the epilogue multiplies by.
    pub scale: Option<f32>,
    /// The grid's fold (`plan::KernelSpec::fold_x`).
    pub fold: usize,
}

/// A cube's column tile in vectors and where its results go, the comptime
/// description of a GEMM's epilogue: `cols` vectors; with a mixing epilogue,
/// `ce` channels of each of `m` heads of `dl` vectors, mixed into `targets`
/// heads of `s` rows (`ce`, `m`, `targets`, `s` = 0 without); `fl` vectors a
/// row of `b` and of the output, whose `rows` rows sit in a grid folded by `fold`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Tile {
    pub cols: usize,
    pub ce: usize,
    pub dl: usize,
    pub fl: usize,
    pub rows: usize,
    pub fold: usize,
    pub m: usize,
    pub targets: usize,
    pub s: usize,
}

impl Tile {
    pub(super) fn new(shape: &Shape, lanes: usize) -> Tile {
        let (fl, rows, fold) = (shape.f / lanes, shape.rows, shape.fold);
        match &shape.mix {
            Some((mix, _)) => {
                let ce = mix.channels(lanes);
                let (m, targets, s) = (mix.m, mix.h * mix.p, mix.s);
                Tile { cols: m * ce, ce, dl: mix.d / lanes, fl, rows, fold, m, targets, s }
            }
            None => {
                let cols = gemm_cols(shape.f, lanes);
                Tile { cols, ce: 0, dl: 0, fl, rows, fold, m: 0, targets: 0, s: 0 }
            }
        }
    }
}

/// Row `m` of this unit, and whether it exists.
#[cube]
fn unit_row(#[comptime] m: usize, #[comptime] fold: usize) -> usize {
    k::cube_y(fold) * comptime![GEMM_UNITS * GEMM_ROWS] + comptime![m * GEMM_UNITS] + UNIT_POS as usize
}

/// `row`, clamped to the last of `rows`.
#[cube]
fn clamp_row(row: usize, #[comptime] rows: usize) -> usize {
    min(row, comptime![rows - 1])
}

/// The vector at `at` of `x` (a buffer or the shared stages), in f32.
#[cube]
fn load<E: Float, N: Size>(x: &[Vector<E, N>], at: usize) -> Vector<f32, N> {
    Vector::<f32, N>::cast_from(x[at])
}

/// `x[at]` in f32 if `inside`, else zeros.
#[cube]
fn load_or_zero<N: Size>(x: &[Vector<Stored, N>], at: usize, inside: bool) -> Vector<f32, N> {
    let mut v = Vector::new(f32::new(0.0));
    if inside {
        v = Vector::<f32, N>::cast_from(x[at]);
    }
    v
}

#[cube]
fn put<N: Size>(x: &mut [Vector<f32, N>], at: usize, v: Vector<f32, N>) {
    x[at] = v;
}

/// The column vector of `b` that the cube's column `c` (clamped to the
/// tile) reads: `c` of the cube's block of `cols`, or with a mixing epilogue
/// (`ce` > 0) channel `c % ce` of the block of head `c / ce`; clamped to the
/// last column or channel.
#[cube]
#[allow(unused_assignments)]
pub(super) fn tile_col(
    c: usize,
    #[comptime] cols: usize,
    #[comptime] fl: usize,
    #[comptime] ce: usize,
    #[comptime] dl: usize,
    #[comptime] fold: usize,
) -> usize {
    let c = min(c, comptime![cols - 1]);
    let mut col = 0usize;
    if comptime![ce == 0] {
        col = min(k::cube_x(fold) * cols + c, comptime![fl - 1]);
    } else {
        let ch = min(k::cube_x(fold) * ce + c % ce, comptime![dl - 1]);
        col = c / ce * dl + ch;
    }
    col
}

/// Where the vectors of `b` that column vector `col` needs start within a
/// row (or, transposed, a block of rows): one, or `lanes` columns' each.
fn b_col_starts(scope: &Scope, col: NativeExpand<usize>, shape: &Shape, lanes: usize) -> Vec<NativeExpand<usize>> {
    let fl = shape.f / lanes;
    if !shape.b.transposed {
        return vec![k::view(scope, col, &shape.b.cols, fl)];
    }
    (0..lanes)
        .map(|j| {
            let c = k::add_index::expand(
                scope,
                k::idx_mul::expand(scope, col.clone(), lanes),
                k::const_index::expand(scope, j),
            );
            k::view(scope, c, &shape.b.cols, shape.f)
        })
        .collect()
}

/// One unit's item of a cooperative copy of `b` into a shared stage of
/// `stage_rows` rows of `k` by `pitch` vectors: the row-major vector `idx`
/// of the stage, or transposed the block of `lanes` rows `r·lanes..` at
/// column vector `c`; `starts` as [`b_col_starts`].
pub(super) struct BItem {
    pub(super) idx: NativeExpand<usize>,
    r: NativeExpand<usize>,
    c: NativeExpand<usize>,
    starts: Vec<NativeExpand<usize>>,
}

/// A unit's items of a stage copy of `b` (see [`BItem`]) and how many the cube has.
pub(super) fn b_items(
    scope: &Scope,
    shape: &Shape,
    tile: Tile,
    (stage_rows, pitch): (usize, usize),
    lanes: usize,
) -> (Vec<BItem>, usize) {
    let block = if shape.b.transposed { lanes } else { 1 };
    let count = stage_rows / block * pitch;
    let items = (0..count.div_ceil(GEMM_UNITS))
        .map(|i| {
            let idx = coop::expand(scope, i);
            let c = k::idx_mod::expand(scope, idx.clone(), pitch);
            let r = k::idx_div::expand(scope, idx.clone(), pitch);
            let col = tile_col::expand(scope, c.clone(), tile.cols, tile.fl, tile.ce, tile.dl, shape.fold);
            BItem { idx, r, c, starts: b_col_starts(scope, col, shape, lanes) }
        })
        .collect();
    (items, count)
}

/// Item `it`'s vectors of stage `s`, as `(place in the stage, vector)`:
/// `load(at, inside)` reads `b` (zero past `k`); a transposed block is
/// turned into the stage's row vectors.
pub(super) fn b_item_vectors<E: Scalar, N: Size>(
    scope: &Scope,
    it: &BItem,
    s: &NativeExpand<usize>,
    shape: &Shape,
    (stage_rows, pitch): (usize, usize),
    lanes: usize,
    load: impl Fn(&Scope, NativeExpand<usize>, NativeExpand<bool>) -> NativeExpand<Vector<E, N>>,
) -> Vec<(NativeExpand<usize>, NativeExpand<Vector<E, N>>)> {
    let kl = shape.kdim / lanes;
    if !shape.b.transposed {
        let krow = k::add_index::expand(scope, k::idx_mul::expand(scope, s.clone(), stage_rows), it.r.clone());
        let inside = k::below::expand(scope, krow.clone(), shape.kdim);
        let start = k::view(scope, krow, &shape.b.rows, shape.kdim);
        return vec![(it.idx.clone(), load(scope, k::add_index::expand(scope, start, it.starts[0].clone()), inside))];
    }
    let kvec = k::add_index::expand(scope, k::idx_mul::expand(scope, s.clone(), stage_rows / lanes), it.r.clone());
    let inside = k::below::expand(scope, kvec.clone(), kl);
    let start = k::view(scope, kvec, &shape.b.rows, kl);
    let block: Vec<_> = it
        .starts
        .iter()
        .map(|x| load(scope, k::add_index::expand(scope, start.clone(), x.clone()), inside.clone()))
        .collect();
    let first = k::idx_mul::expand(scope, it.r.clone(), lanes * pitch);
    (0..lanes)
        .map(|kk| {
            let row = k::add_index::expand(scope, first.clone(), k::const_index::expand(scope, kk * pitch));
            (k::add_index::expand(scope, row, it.c.clone()), k::transposed::<E, N>(scope, &block, kk))
        })
        .collect()
}

/// Row `kt·lanes + kk` of `b`'s start, for the broadcast variant.
#[cube]
fn b_step_row(kt: usize, #[comptime] lanes: usize, #[comptime] kk: usize) -> usize {
    kt * lanes + kk
}

/// This lane's column `lane·per + r`.
#[cube]
fn lane_col(lane: usize, #[comptime] per: usize, #[comptime] r: usize) -> usize {
    lane * per + r
}

/// Store accumulator `v` (with `add`, plus the addend's vector at the same
/// place, rounded once) at row `row`, column vector `c` of the cube, if
/// both exist.
#[cube]
fn store<N: Size>(
    out: &mut [Vector<Stored, N>],
    addend: &[Vector<Stored, N>],
    row: usize,
    v: Vector<f32, N>,
    #[comptime] c: usize,
    #[comptime] tile: Tile,
    #[comptime] add: bool,
) {
    let (rows, cols, fl, fold) = comptime![(tile.rows, tile.cols, tile.fl, tile.fold)];
    let col = k::cube_x(fold) * cols + c;
    if row < rows && col < fl {
        if comptime![add] {
            let at = row * fl + col;
            out[at] = Vector::<Stored, N>::cast_from(v + Vector::<f32, N>::cast_from(addend[at]));
        } else {
            out[row * fl + col] = Vector::<Stored, N>::cast_from(v);
        }
    }
}

/// Store product vector `v` of row `row`, the cube's column `c` of a mixing
/// tile (channel `c % ce` of head `c / ce`), to the kept product `[rows, fl]`, if both exist.
#[cube]
pub(super) fn store_kept<N: Size>(
    out: &mut [Vector<Stored, N>],
    row: usize,
    v: Vector<f32, N>,
    #[comptime] c: usize,
    #[comptime] tile: Tile,
) {
    let (ce, dl, fl, rows, fold) = comptime![(tile.ce, tile.dl, tile.fl, tile.rows, tile.fold)];
    let channel = k::cube_x(fold) * ce + comptime![c % ce];
    if row < rows && channel < dl {
        out[row * fl + comptime![c / ce * dl] + channel] = Vector::<Stored, N>::cast_from(v);
    }
}

/// Where row `row`'s first output vector goes in the mixing epilogue's
/// `[B, targets, s, dl]` output (vectors).
#[cube]
pub(super) fn mixed_row(row: usize, #[comptime] tile: Tile) -> usize {
    let (s, dl) = comptime![(tile.s, tile.dl)];
    row / s * comptime![tile.targets * s * dl] + row % s * dl
}

/// Store mixed channel `ch` of target `t` for the row starting at `at`, if row and channel exist.
#[cube]
pub(super) fn store_mixed<N: Size>(
    out: &mut [Vector<Stored, N>],
    row: usize,
    at: usize,
    t: usize,
    v: Vector<f32, N>,
    #[comptime] ch: usize,
    #[comptime] tile: Tile,
) {
    let (ce, rows, dl, fold) = comptime![(tile.ce, tile.rows, tile.dl, tile.fold)];
    let plane_len = comptime![tile.s * dl];
    let channel = k::cube_x(fold) * ce + ch;
    if row < rows && channel < dl {
        out[at + t * plane_len + channel] = Vector::<Stored, N>::cast_from(v);
    }
}

/// Shared memory of `n` vectors.
#[cube]
fn stage<N: Size>(#[comptime] n: usize) -> Shared<[Vector<f32, N>]> {
    Shared::<[Vector<f32, N>]>::new_slice(n)
}

/// `(i % 2) · size`: where stage `i`'s `a` tile starts.
#[cube]
fn stage_base(i: usize, #[comptime] size: usize) -> usize {
    i % 2 * size
}

/// Where stage `i`'s `b` tile starts: after both `a` tiles.
#[cube]
fn b_stage_base(i: usize, #[comptime] a_len: usize, #[comptime] b_len: usize) -> usize {
    comptime![2 * a_len] + i % 2 * b_len
}

/// `i + 1 < n`.
#[cube]
fn has_next(i: usize, #[comptime] n: usize) -> bool {
    i + 1 < n
}

#[cube]
fn next(i: usize) -> usize {
    i + 1
}

#[cube]
pub(super) fn unit_pos() -> usize {
    UNIT_POS as usize
}

/// `UNIT_POS + GEMM_UNITS · i`: this unit's `i`-th element of a cooperative copy.
#[cube]
pub(super) fn coop(#[comptime] i: usize) -> usize {
    UNIT_POS as usize + comptime![i * GEMM_UNITS]
}

/// This unit's element `i` of chunk `c` (of `chunk` elements) of a cooperative copy.
#[cube]
pub(super) fn coop_in(c: usize, #[comptime] i: usize, #[comptime] chunk: usize) -> usize {
    UNIT_POS as usize + c * comptime![chunk * GEMM_UNITS] + comptime![i * GEMM_UNITS]
}

/// The cube's row `local` of `a` (clamped to the last row).
#[cube]
pub(super) fn cube_row(local: usize, #[comptime] rows: usize, #[comptime] fold: usize) -> usize {
    min(k::cube_y(fold) * comptime![GEMM_UNITS * GEMM_ROWS] + local, comptime![rows - 1])
}

/// A GEMM launch's bindings: `a`, `b`, the side buffer (`x @ w + y`'s
/// addend, or where a mixing epilogue keeps the product) and the output.
pub struct Operands<'a, N: Size> {
    pub a: &'a Vecs<N>,
    pub b: &'a Vecs<N>,
    pub side: Option<&'a Vecs<N>>,
    pub out: &'a mut Vecs<N>,
}

/// Emit the GEMM body for vectors of `N` (`lanes` floats, dividing `kdim` and
/// `f`), sharing `b` over planes of `plane` units (1: every unit loads it all).
pub fn build<N: Size>(scope: &Scope, x: Operands<N>, shape: &Shape, lanes: usize, plane: u32) {
    let Operands { a, b, side, out } = x;
    let tile = Tile::new(shape, lanes);
    let Tile { cols, ce, dl, fl, .. } = tile;
    let (rows, kl) = (shape.rows, shape.kdim / lanes);
    let (per, lane) = if plane > 1 {
        (cols.div_ceil(plane as usize), k::plane_lane::expand(scope, plane))
    } else {
        (cols, NativeExpand::from_lit(scope, 0usize))
    };
    let unit_rows: Vec<_> = (0..GEMM_ROWS).map(|m| unit_row::expand(scope, m, shape.fold)).collect();
    // Where each of this unit's rows of `a` starts (the last row for rows past the end).
    let a_starts: Vec<_> = unit_rows
        .iter()
        .map(|r| k::view(scope, clamp_row::expand(scope, r.clone(), rows), &shape.a_rows, rows))
        .collect();
    // Where the columns of `b` this lane loads start (fixed for the whole product).
    let b_cols: Vec<_> = (0..per)
        .map(|r| {
            let col =
                tile_col::expand(scope, lane_col::expand(scope, lane.clone(), per, r), cols, fl, ce, dl, shape.fold);
            b_col_starts(scope, col, shape, lanes)
        })
        .collect();
    let acc = k::vzeros::expand::<N>(scope, GEMM_ROWS * cols);
    // A plane whose rows all lie past the end (a short `a`, as at decode)
    // skips the product: its loads and broadcasts serve only itself.
    let active = plane_has_rows::expand(scope, plane.max(1), rows, shape.fold);
    if_expand(scope, active, |scope| {
        let steps = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, kl));
        for_expand(scope, steps, false, |scope, kt| {
            let mut acc = acc;
            update::<N>(scope, &mut acc, GEMM_ROWS * cols, |sums| {
                let col = k::view(scope, kt.clone(), &shape.a_cols, kl);
                let av: Vec<_> = a_starts
                    .iter()
                    .map(|r| load::expand::<Stored, N>(scope, a, k::add_index::expand(scope, r.clone(), col.clone())))
                    .collect();
                let load_b = |start: &NativeExpand<usize>, at: &NativeExpand<usize>| {
                    load::expand::<Stored, N>(scope, b, k::add_index::expand(scope, start.clone(), at.clone()))
                };
                // Transposed, each column's block of `lanes` rows, loaded once per step.
                let blocks: Vec<Vec<_>> = if shape.b.transposed {
                    let start = k::view(scope, kt.clone(), &shape.b.rows, kl);
                    b_cols.iter().map(|starts| starts.iter().map(|x| load_b(&start, x)).collect()).collect()
                } else {
                    vec![]
                };
                for kk in 0..lanes {
                    let held: Vec<_> = if shape.b.transposed {
                        blocks.iter().map(|blk| k::transposed::<f32, N>(scope, blk, kk)).collect()
                    } else {
                        let row = b_step_row::expand(scope, kt.clone(), lanes, kk);
                        let start = k::view(scope, row, &shape.b.rows, shape.kdim);
                        b_cols.iter().map(|starts| load_b(&start, &starts[0])).collect()
                    };
                    rank_one::<N>(scope, sums, &av, kk, cols, |c| {
                        if plane > 1 {
                            k::from_lane::expand::<N>(scope, held[c % per].clone(), (c / per) as u32)
                        } else {
                            held[c].clone()
                        }
                    });
                }
            });
        });
    });
    epilogue::<N>(scope, out, side, &acc, &unit_rows, shape, tile);
}

/// Whether this unit's plane of `plane` units owns a row below `rows`
/// (its first unit's first row is the plane's smallest).
#[cube]
fn plane_has_rows(#[comptime] plane: u32, #[comptime] rows: usize, #[comptime] fold: usize) -> bool {
    let first = (UNIT_POS - UNIT_POS % plane) as usize;
    k::cube_y(fold) * comptime![GEMM_UNITS * GEMM_ROWS] + first < rows
}

/// Emit the staged GEMM body (see the module documentation).
pub fn build_staged<N: Size>(scope: &Scope, x: Operands<N>, shape: &Shape, lanes: usize) {
    let Operands { a, b, side, out } = x;
    let tile = Tile::new(shape, lanes);
    let cols = tile.cols;
    let (rows, kl) = (shape.rows, shape.kdim / lanes);
    let kv = GEMM_STAGE_K / lanes; // vectors of `k` per stage and row of `a`
    let stages = kl.div_ceil(kv);
    let cube_rows = GEMM_UNITS * GEMM_ROWS;
    let (a_len, b_len) = (cube_rows * kv, GEMM_STAGE_K * cols);
    // One shared array (two `a` stages, then two `b` stages): cubecl-cpp
    // declares several in an order that changes between runs.
    let shared: NativeExpand<[Vector<f32, N>]> = (*stage::expand::<N>(scope, 2 * (a_len + b_len))).clone_unchecked();
    // The cooperative copy's fixed parts: rows of `a` and columns of `b` each unit copies.
    let a_copy: Vec<_> = (0..a_len / GEMM_UNITS)
        .map(|i| {
            let idx = coop::expand(scope, i);
            let local = k::idx_div::expand(scope, idx.clone(), kv);
            let row = cube_row::expand(scope, local, rows, shape.fold);
            (idx.clone(), k::view(scope, row, &shape.a_rows, rows), k::idx_mod::expand(scope, idx, kv))
        })
        .collect();
    let (b_copy, b_count) = b_items(scope, shape, tile, (GEMM_STAGE_K, cols), lanes);
    // Copy stage `s` into the buffer of its parity.
    let copy = |scope: &Scope, s: NativeExpand<usize>| {
        let mut stage = shared.clone_unchecked();
        let base_a = stage_base::expand(scope, s.clone(), a_len);
        for (idx, row_start, kq) in &a_copy {
            let kvec = k::add_index::expand(scope, k::idx_mul::expand(scope, s.clone(), kv), kq.clone());
            let inside = k::below::expand(scope, kvec.clone(), kl);
            let col = k::view(scope, kvec, &shape.a_cols, kl);
            let v = load_or_zero::expand::<N>(scope, a, k::add_index::expand(scope, row_start.clone(), col), inside);
            put::expand::<N>(scope, &mut stage, k::add_index::expand(scope, base_a.clone(), idx.clone()), v);
        }
        let base_b = b_stage_base::expand(scope, s.clone(), a_len, b_len);
        let load_b = |scope: &Scope, at, inside| load_or_zero::expand::<N>(scope, b, at, inside);
        for it in &b_copy {
            let vectors = b_item_vectors::<f32, N>(scope, it, &s, shape, (GEMM_STAGE_K, cols), lanes, load_b);
            let exists = k::below::expand(scope, it.idx.clone(), b_count);
            if_expand(scope, exists, |scope| {
                for (at, v) in vectors {
                    put::expand::<N>(scope, &mut stage, k::add_index::expand(scope, base_b.clone(), at), v);
                }
            });
        }
    };
    copy(scope, NativeExpand::from_lit(scope, 0usize));
    k::barrier::expand(scope);
    let acc = k::vzeros::expand::<N>(scope, GEMM_ROWS * cols);
    let range = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, stages));
    for_expand(scope, range, false, |scope, s| {
        let more = has_next::expand(scope, s.clone(), stages);
        let s_next = next::expand(scope, s.clone());
        if_expand(scope, more, |scope| copy(scope, s_next));
        let mut acc = acc;
        update::<N>(scope, &mut acc, GEMM_ROWS * cols, |sums| {
            let (base_a, base_b) =
                (stage_base::expand(scope, s.clone(), a_len), b_stage_base::expand(scope, s, a_len, b_len));
            for kq in 0..kv {
                let av: Vec<_> = (0..GEMM_ROWS)
                    .map(|m| {
                        let at = k::const_index::expand(scope, (m * GEMM_UNITS) * kv + kq);
                        let unit = k::idx_mul::expand(scope, unit_pos::expand(scope), kv);
                        let at = k::add_index::expand(scope, k::add_index::expand(scope, base_a.clone(), at), unit);
                        load::expand::<f32, N>(scope, &shared, at)
                    })
                    .collect();
                for kk in 0..lanes {
                    rank_one::<N>(scope, sums, &av, kk, cols, |c| {
                        let at = k::const_index::expand(scope, (kq * lanes + kk) * cols + c);
                        load::expand::<f32, N>(scope, &shared, k::add_index::expand(scope, base_b.clone(), at))
                    });
                }
            }
        });
        k::barrier::expand(scope);
    });
    let unit_rows: Vec<_> = (0..GEMM_ROWS).map(|m| unit_row::expand(scope, m, shape.fold)).collect();
    epilogue::<N>(scope, out, side, &acc, &unit_rows, shape, tile);
}

/// Update `n` accumulators held in registers: `f` changes their values.
fn update<N: Size>(
    scope: &Scope,
    acc: &mut NativeExpand<Array<Vector<f32, N>>>,
    n: usize,
    f: impl FnOnce(&mut [NativeExpand<Vector<f32, N>>]),
) {
    let mut sums: Vec<_> = (0..n).map(|i| k::vget::expand::<N>(scope, acc, i)).collect();
    f(&mut sums);
    for (i, s) in sums.into_iter().enumerate() {
        k::vset::expand::<N>(scope, acc, i, s);
    }
}

/// One step of `k`: each of the unit's rows, component `kk` of its `a`
/// vector in `av`, times every column vector `b(c)` of the step's row of
/// `b`, added to `sums[row · cols + c]`.
fn rank_one<N: Size>(
    scope: &Scope,
    sums: &mut [NativeExpand<Vector<f32, N>>],
    av: &[NativeExpand<Vector<f32, N>>],
    kk: usize,
    cols: usize,
    mut b: impl FnMut(usize) -> NativeExpand<Vector<f32, N>>,
) {
    let scalars: Vec<_> = av.iter().map(|v| k::component::expand::<N>(scope, v.clone(), kk)).collect();
    for c in 0..cols {
        let bc = b(c);
        for (m, x) in scalars.iter().enumerate() {
            let s = &mut sums[m * cols + c];
            *s = k::axpy::expand::<N>(scope, s.clone(), x.clone(), bc.clone());
        }
    }
}

/// Store the accumulators (plus the addend's entries, with one: `side`),
/// or mix heads from them: one runtime loop over the h·p targets, each
/// mixing the unit's heads of every row and channel it holds (a kept
/// product stored to `side` first).
fn epilogue<N: Size>(
    scope: &Scope,
    out: &mut Vecs<N>,
    side: Option<&Vecs<N>>,
    acc: &NativeExpand<Array<Vector<f32, N>>>,
    unit_rows: &[NativeExpand<usize>],
    shape: &Shape,
    tile: Tile,
) {
    let Tile { cols, ce, .. } = tile;
    let scaled = |scope: &Scope, v: NativeExpand<Vector<f32, N>>| match shape.scale {
        Some(c) => k::vscale::expand::<N>(scope, v, NativeExpand::from_lit(scope, c)),
        None => v,
    };
    let Some((mix, alpha)) = &shape.mix else {
        // Without an addend, `store` reads none: the output stands in.
        let (addend, y) = match side {
            Some(y) => (true, y.clone_unchecked()),
            None => (false, (*out).clone_unchecked()),
        };
        for (m, row) in unit_rows.iter().enumerate() {
            for c in 0..cols {
                let v = scaled(scope, k::vget::expand::<N>(scope, acc, m * cols + c));
                let (row, add) = (row.clone(), addend);
                store::expand::<N>(scope, out, &y, row, v, c, tile, add);
            }
        }
        return;
    };
    if mix.keep {
        let mut kept = side.expect("a kept product's buffer").clone_unchecked();
        for (m, row) in unit_rows.iter().enumerate() {
            for c in 0..cols {
                let v = k::vget::expand::<N>(scope, acc, m * cols + c);
                store_kept::expand::<N>(scope, &mut kept, row.clone(), v, c, tile);
            }
        }
    }
    let targets = tile.targets;
    let starts: Vec<_> = unit_rows.iter().map(|r| mixed_row::expand(scope, r.clone(), tile)).collect();
    let range = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, targets));
    for_expand(scope, range, false, |scope, t| {
        let alphas: Vec<_> = (0..mix.m)
            .map(|m| {
                let at = k::add_index::expand(scope, k::const_index::expand(scope, m * targets), t.clone());
                k::read::expand::<Stored>(scope, alpha, at)
            })
            .collect();
        for (r, row) in unit_rows.iter().enumerate() {
            for ch in 0..ce {
                let mut v = k::vzero::expand::<N>(scope);
                for (m, a) in alphas.iter().enumerate() {
                    let y = k::vget::expand::<N>(scope, acc, r * cols + m * ce + ch);
                    v = k::axpy::expand::<N>(scope, v, a.clone(), y);
                }
                let v = scaled(scope, v);
                let (row, at) = (row.clone(), starts[r].clone());
                store_mixed::expand::<N>(scope, out, row, at, t.clone(), v, ch, tile);
            }
        }
    });
}
