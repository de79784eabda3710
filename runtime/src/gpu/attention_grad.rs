//! Attention's backward, FlashAttention-2 style, and the per-row
//! log-sum-exp it saves (`KernelSpec::AttentionLse`, `KernelSpec::AttentionGrad`).
//!
//! A cube owns `Dims::rows` rows: query rows of one (batch, head) for the
//! log-sum-exp and `dQ`; key rows of one (batch, key/value head) for `dK`
//! and `dV`, which walk the query rows of every query head sharing that
//! key/value head (GQA's accumulation, in the unit's registers). A row
//! belongs to one unit (`plan::ATTN_ROWS` units a cube), or, tiled within
//! a GPU's register file (`KernelSpec::fit_registers`, what CUDA runs), to
//! `Dims::lanes` consecutive lanes of a plane, each holding the channels
//! `c · lanes + lane` of the row and its accumulator (interleaved, so that
//! the lanes read consecutive words of a shared tile) and summing dot
//! products with butterfly shuffles, which every lane reaches: scores are
//! computed for every pair of a visited tile, and the mask decides which
//! update. Each unit holds its own row (or slice) and accumulator in
//! registers; the other side's rows come in tiles of `tile` rows that the
//! cube loads into shared memory together. Probabilities are recomputed per
//! pair from the saved log-sum-exp, `P_ij = exp(scale·q_i·k_j − lse_i)`;
//! with `D_i = dO_i · O_i` and `dS_ij = P_ij (dO_i · v_j − D_i)`:
//! `dQ_i = scale Σ_j dS_ij k_j`, `dK_j = scale Σ_i dS_ij q_i`,
//! `dV_j = Σ_i P_ij dO_i`. A cube walks only the tiles its rows can see
//! through the mask (`key_tiles`, and `query_tiles`, the mask inverted, for
//! a cube of key rows). Nothing of size rows × keys is stored, and every
//! sum runs in one unit in a fixed order: results are deterministic.
//!
//! Loops over channels are unrolled (past 64 channels, in steps of
//! `plan::grad_chunk`); a tile's rows are a loop (unrolling them too made
//! Mesa's compiler take minutes at d = 256), so every row of the other
//! side counts against Mesa's loop bound (`KernelSpec::loop_trips`).

use super::attention::{key_hi, key_lo, key_row_of, log_sum_exp, view_row, M_INIT};
use super::attention_split::xor_add;
use super::func::{prep_hook, score_hook, slope_hook, tile_hook, Hook};
use super::kernels::{self as k, shifted, visible, Stored, MASK_CAUSAL, MASK_TOKEN_CAUSAL};
use attnc_compiler::plan::{grad_chunk, RowView};
use cubecl::prelude::*;

pub use super::attention::NO_KEYS;
pub(super) const NO_KEYS_BELOW: f32 = -1.0e38;

/// The comptime sizes of an attention backward launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dims {
    pub h: usize,
    pub hk: usize,
    pub s: usize,
    pub sk: usize,
    pub d: usize,
    pub e: usize,
    /// `kernels::MASK_*`.
    pub kind: u32,
    /// 0: none.
    pub window: usize,
    pub block: usize,
    /// Rows per shared-memory tile.
    pub tile: usize,
    /// `KernelSpec::fold_x`.
    pub fold: usize,
    /// Units sharing each row, lanes of one plane, each holding the row's
    /// channels `c · lanes + lane` (register tiling; 1: a unit a row).
    pub lanes: usize,
    /// Rows per cube (`AttnTiles::cube_rows`).
    pub rows: usize,
}

impl Dims {
    /// Units per cube.
    fn units(&self) -> usize {
        self.rows * self.lanes
    }
}

impl Dims {
    /// The masks' position of query row 0 and of key row 0: the queries are
    /// the last `s` of `sk` positions (`Mask::visible`), so with unequal
    /// lengths query row `i` is position `i + sk` against key `j + s`.
    fn offsets(&self) -> (usize, usize) {
        if self.s == self.sk {
            (0, 0)
        } else {
            (self.sk, self.s)
        }
    }
}

/// Whether query row `i` sees key row `j` (`Mask::visible`: the queries
/// are the last `s` of `sk` positions).
#[cube]
pub(super) fn sees(i: usize, j: usize, #[comptime] g: Dims) -> bool {
    let (qoff, koff) = comptime![g.offsets()];
    visible(shifted(i, qoff), shifted(j, koff), comptime![g.kind], comptime![g.window], comptime![g.block])
}

/// Tiles `lo .. hi` of the other side that a cube walks.
#[derive(CubeType)]
pub(super) struct Tiles {
    pub lo: usize,
    pub hi: usize,
}

/// The tiles of `tile` rows holding rows `lo .. hi` (none when empty).
#[cube]
fn tiles_of(lo: usize, hi: usize, #[comptime] tile: usize) -> Tiles {
    let t0 = lo / tile;
    let mut t1 = (hi + comptime![tile - 1]) / tile;
    if hi <= lo {
        t1 = t0;
    }
    Tiles { lo: t0, hi: t1 }
}

/// The key tiles that some query row `q0 ..= q1` sees (a mask's band,
/// as the forward's `setup` finds it): the others are never loaded.
#[cube]
pub(super) fn key_tiles(q0: usize, q1: usize, #[comptime] g: Dims) -> Tiles {
    let (qoff, koff) = comptime![g.offsets()];
    let lo = key_lo(shifted(q0, qoff), comptime![g.kind], comptime![g.window], comptime![g.block]);
    let hi =
        key_hi(shifted(q1, qoff), comptime![g.kind], comptime![g.window], comptime![g.block], comptime![g.sk + koff]);
    tiles_of(key_row_of(lo, koff, comptime![g.sk]), key_row_of(hi, koff, comptime![g.sk]), comptime![g.tile])
}

/// First query position that sees key position `p` (`visible`, inverted).
#[cube]
fn query_lo(p: usize, #[comptime] kind: u32, #[comptime] window: usize, #[comptime] block: usize) -> usize {
    let mut lo = 0usize;
    if comptime![kind == MASK_CAUSAL] {
        lo = p;
    } else if comptime![kind == MASK_TOKEN_CAUSAL] {
        lo = p / block * block;
    } else if comptime![window > 0] {
        let m = p / block;
        if m + 1 > window {
            lo = (m + 1 - window) * block;
        }
    }
    lo
}

/// One past the last query position that sees key position `p` (`inf` when unbounded).
#[cube]
fn query_hi(
    p: usize,
    #[comptime] kind: u32,
    #[comptime] window: usize,
    #[comptime] block: usize,
    #[comptime] inf: usize,
) -> usize {
    let mut hi = inf.runtime();
    if comptime![window > 0] {
        if comptime![kind == MASK_CAUSAL] {
            hi = p + comptime![window * block];
        } else {
            hi = (p / block + window) * block;
        }
    }
    hi
}

/// The query tiles holding some query row that sees a key row `j0 ..= j1`.
#[cube]
pub(super) fn query_tiles(j0: usize, j1: usize, #[comptime] g: Dims) -> Tiles {
    let (qoff, koff) = comptime![g.offsets()];
    let lo = query_lo(shifted(j0, koff), comptime![g.kind], comptime![g.window], comptime![g.block]);
    let hi =
        query_hi(shifted(j1, koff), comptime![g.kind], comptime![g.window], comptime![g.block], comptime![g.s + qoff]);
    tiles_of(key_row_of(lo, qoff, comptime![g.s]), key_row_of(hi, qoff, comptime![g.s]), comptime![g.tile])
}

/// The first and last rows (of `n`) of this unit's cube.
#[cube]
fn cube_rows(#[comptime] n: usize, #[comptime] g: Dims) -> Array<usize> {
    let mut a = Array::<usize>::new(2usize);
    let r0 = k::cube_x(comptime![g.fold]) * comptime![g.rows];
    a[0] = r0;
    a[1] = min(r0 + comptime![g.rows - 1], comptime![n - 1]);
    a
}

/// `at` plus this unit's lane among the `lanes` sharing its row: where its
/// channels of a row starting at `at` begin ([`at_channel`]).
#[cube]
fn plus_lane(at: usize, #[comptime] lanes: usize) -> usize {
    if comptime![lanes == 1] {
        at
    } else {
        at + UNIT_POS as usize % lanes
    }
}

/// Channel `c` of a unit's slice starting at `at` (from [`plus_lane`]).
#[cube]
fn at_channel(at: usize, c: usize, #[comptime] lanes: usize) -> usize {
    if comptime![lanes == 1] {
        at + c
    } else {
        at + c * lanes
    }
}

/// `v` summed over the `lanes` units sharing a row (consecutive lanes of a
/// plane, a power of two): `log2 lanes` butterfly shuffles, which every
/// unit of the plane must reach together.
#[cube]
fn lane_sum(v: f32, #[comptime] lanes: usize) -> f32 {
    let mut x = v;
    if comptime![lanes > 1] {
        x = xor_add(x, 1u32);
    }
    if comptime![lanes > 2] {
        x = xor_add(x, 2u32);
    }
    if comptime![lanes > 4] {
        x = xor_add(x, 4u32);
    }
    if comptime![lanes > 8] {
        x = xor_add(x, 8u32);
    }
    x
}

/// Tile `t` (rows `t·rows ..`, clamped to the last of `n`) of `width`
/// floats a row of head `(b, hh)` of `x` into `tile`, the cube's units
/// sharing the copy.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_tile(
    x: &[Stored],
    tile: &mut [f32],
    b: usize,
    hh: usize,
    t: usize,
    #[comptime] v: RowView,
    #[comptime] width: usize,
    #[comptime] n: usize,
    #[comptime] g: Dims,
) {
    let (rows, units) = comptime![(g.tile, g.units())];
    #[unroll]
    for c in 0..comptime![(rows * width).div_ceil(units)] {
        let idx = UNIT_POS as usize + comptime![c * units];
        if idx < comptime![rows * width] {
            let r = min(t * rows + idx / width, comptime![n - 1]);
            tile[idx] = f32::cast_from(x[view_row(b, hh, r, v) + idx % width]);
        }
    }
}

/// This unit's slice (`width / lanes` floats) of row `r` of head `(b, hh)`
/// of `x`, `width` floats a row, into registers.
#[cube]
fn load_row(
    x: &[Stored],
    b: usize,
    hh: usize,
    r: usize,
    #[comptime] v: RowView,
    #[comptime] width: usize,
    #[comptime] lanes: usize,
) -> Array<f32> {
    let at = plus_lane(view_row(b, hh, r, v), lanes);
    let n = comptime![width / lanes];
    let mut a = Array::<f32>::new(n);
    let ch = comptime![grad_chunk(n)];
    if comptime![ch == n] {
        #[unroll]
        for c in 0..n {
            a[c] = f32::cast_from(x[at_channel(at, c, lanes)]);
        }
    } else {
        for c0 in 0..comptime![n / ch] {
            #[unroll]
            for c in 0..ch {
                a[c0 * ch + c] = f32::cast_from(x[at_channel(at + c0 * comptime![ch * lanes], c, lanes)]);
            }
        }
    }
    a
}

/// `Σ_c a[c] · tile[channel c of at]` over this unit's `n / lanes`
/// channels of a row of `n` starting at `at` (a part of the row's sum:
/// [`lane_sum`] completes it).
#[cube]
fn dot_tile(a: &Array<f32>, tile: &[f32], at: usize, #[comptime] n: usize, #[comptime] lanes: usize) -> f32 {
    let at = plus_lane(at, lanes);
    let n = comptime![n / lanes];
    let mut acc = f32::new(0.0);
    let ch = comptime![grad_chunk(n)];
    if comptime![ch == n] {
        #[unroll]
        for c in 0..n {
            acc += a[c] * tile[at_channel(at, c, lanes)];
        }
    } else {
        for c0 in 0..comptime![n / ch] {
            #[unroll]
            for c in 0..ch {
                acc += a[c0 * ch + c] * tile[at_channel(at + c0 * comptime![ch * lanes], c, lanes)];
            }
        }
    }
    acc
}

/// `acc[c] += w · tile[channel c of at]` over this unit's `n / lanes`
/// channels of a row of `n` starting at `at`.
#[cube]
fn axpy_tile(acc: &mut Array<f32>, w: f32, tile: &[f32], at: usize, #[comptime] n: usize, #[comptime] lanes: usize) {
    let at = plus_lane(at, lanes);
    let n = comptime![n / lanes];
    let ch = comptime![grad_chunk(n)];
    if comptime![ch == n] {
        #[unroll]
        for c in 0..n {
            acc[c] += w * tile[at_channel(at, c, lanes)];
        }
    } else {
        for c0 in 0..comptime![n / ch] {
            #[unroll]
            for c in 0..ch {
                acc[c0 * ch + c] += w * tile[at_channel(at + c0 * comptime![ch * lanes], c, lanes)];
            }
        }
    }
}

/// Store this unit's `n / lanes` channels `acc` of a row of `n` starting at `at` of `out`.
#[cube]
fn store_row(out: &mut [Stored], acc: &Array<f32>, at: usize, #[comptime] n: usize, #[comptime] lanes: usize) {
    let at = plus_lane(at, lanes);
    #[unroll]
    for c in 0..comptime![n / lanes] {
        out[at_channel(at, c, lanes)] = Stored::cast_from(acc[c]);
    }
}

/// This unit's row: the cube's first plus its position (past the last
/// row for a unit of the last cube with nothing to do).
#[cube]
fn unit_row(#[comptime] g: Dims) -> usize {
    let r0 = k::cube_x(comptime![g.fold]) * comptime![g.rows];
    if comptime![g.lanes == 1] {
        r0 + UNIT_POS as usize
    } else {
        r0 + UNIT_POS as usize / comptime![g.lanes]
    }
}

/// A unit's query row `i` of query head `hi` (key/value head `kh`) of batch
/// `b` (`bh = b·H + hi`); `real` is false for a unit past the last row,
/// which computes on the last row and writes nothing.
#[derive(CubeType)]
struct QueryRow {
    bh: usize,
    b: usize,
    hi: usize,
    kh: usize,
    i: usize,
    real: bool,
}

#[cube]
fn query_row(#[comptime] g: Dims) -> QueryRow {
    let bh = k::cube_y(comptime![g.fold]);
    let hi = bh % comptime![g.h];
    let row = unit_row(g);
    QueryRow {
        bh,
        b: bh / comptime![g.h],
        hi,
        kh: hi / comptime![g.h / g.hk],
        i: min(row, comptime![g.s - 1]),
        real: row < comptime![g.s],
    }
}

/// `D_i = dO_i · O_i`, given this unit's slice of `dO_i` (of `e` values)
/// and query row `i` of head `(b, hi)` of `o`, summed over the row's lanes.
#[cube]
#[allow(clippy::too_many_arguments)]
fn delta_row(
    dor: &Array<f32>,
    o: &[Stored],
    b: usize,
    hi: usize,
    i: usize,
    #[comptime] ov: RowView,
    #[comptime] e: usize,
    #[comptime] lanes: usize,
) -> f32 {
    let or = load_row(o, b, hi, i, ov, e, lanes);
    let mut delta = f32::new(0.0);
    #[unroll]
    for c in 0..comptime![e / lanes] {
        delta += dor[c] * or[c];
    }
    lane_sum(delta, lanes)
}

/// The log-sum-exp of each query row's scaled visible scores, row-major
/// `[B, H, S]` (`NO_KEYS` for a row that sees none).
#[cube]
pub fn lse(
    q: &[Stored],
    kb: &[Stored],
    out: &mut [Stored],
    #[comptime] g: Dims,
    #[comptime] qv: RowView,
    #[comptime] kv: RowView,
    #[comptime] scale: f32,
    #[comptime] hook: Hook,
) {
    let QueryRow { bh, b, hi, kh, i, real } = query_row(g);
    let qr = load_row(q, b, hi, i, qv, comptime![g.d], comptime![g.lanes]);
    let mut kt = Shared::<[f32]>::new_slice(comptime![g.tile * g.d]);
    let mut m = f32::new(M_INIT);
    let mut l = f32::new(0.0);
    let rows = cube_rows(comptime![g.s], g);
    let band = key_tiles(rows[0], rows[1], g);
    prep_hook(b, hi, rows[0], rows[1], true, hook.clone());
    for t in band.lo..band.hi {
        load_tile(kb, &mut kt, b, kh, t, kv, comptime![g.d], comptime![g.sk], g);
        sync_cube();
        if tile_hook(b, hi, rows[0], rows[1], t, comptime![g.tile], comptime![g.sk], true, hook.clone()) {
            for jj in 0..comptime![g.tile] {
                let j = t * comptime![g.tile] + jj;
                // Every lane of the plane sums its part, seen or not (the shuffles).
                let dot = lane_sum(
                    dot_tile(&qr, &kt, jj * comptime![g.d], comptime![g.d], comptime![g.lanes]),
                    comptime![g.lanes],
                );
                if j < comptime![g.sk] && sees(i, j, g) {
                    let sc = score_hook(dot * f32::new(scale), b, hi, i, j, hook.clone());
                    let mn = max(m, sc);
                    l = l * (m - mn).exp() + (sc - mn).exp();
                    m = mn;
                }
            }
        }
        sync_cube();
    }
    if real && plus_lane(0usize, comptime![g.lanes]) == 0 {
        out[bh * comptime![g.s] + i] = Stored::cast_from(log_sum_exp(m, l, NO_KEYS));
    }
}

/// `dQ`, row-major `[B, H, S, d]`: a unit (or `lanes` units) per query row
/// walks the key and value tiles of its key/value head.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn grad_q(
    q: &[Stored],
    kb: &[Stored],
    v: &[Stored],
    o: &[Stored],
    dout: &[Stored],
    lse: &[Stored],
    out: &mut [Stored],
    #[comptime] g: Dims,
    #[comptime] views: [RowView; 7],
    #[comptime] scale: f32,
    #[comptime] hook: Hook,
) {
    let lanes = comptime![g.lanes];
    let QueryRow { bh, b, hi, kh, i, real } = query_row(g);
    let qr = load_row(q, b, hi, i, comptime![views[0]], comptime![g.d], lanes);
    let dor = load_row(dout, b, hi, i, comptime![views[4]], comptime![g.e], lanes);
    let delta = delta_row(&dor, o, b, hi, i, comptime![views[3]], comptime![g.e], lanes);
    let l = f32::cast_from(lse[bh * comptime![g.s] + i]);
    let live = real && l > f32::new(NO_KEYS_BELOW);
    let mut dq = k::zeros(comptime![g.d / g.lanes]);
    let mut kt = Shared::<[f32]>::new_slice(comptime![g.tile * g.d]);
    let mut vt = Shared::<[f32]>::new_slice(comptime![g.tile * g.e]);
    let rows = cube_rows(comptime![g.s], g);
    let band = key_tiles(rows[0], rows[1], g);
    prep_hook(b, hi, rows[0], rows[1], true, hook.clone());
    for t in band.lo..band.hi {
        load_tile(kb, &mut kt, b, kh, t, comptime![views[1]], comptime![g.d], comptime![g.sk], g);
        load_tile(v, &mut vt, b, kh, t, comptime![views[2]], comptime![g.e], comptime![g.sk], g);
        sync_cube();
        if tile_hook(b, hi, rows[0], rows[1], t, comptime![g.tile], comptime![g.sk], true, hook.clone()) {
            for jj in 0..comptime![g.tile] {
                let j = t * comptime![g.tile] + jj;
                let sc =
                    lane_sum(dot_tile(&qr, &kt, jj * comptime![g.d], comptime![g.d], lanes), lanes) * f32::new(scale);
                let dp = lane_sum(dot_tile(&dor, &vt, jj * comptime![g.e], comptime![g.e], lanes), lanes);
                if live && j < comptime![g.sk] && sees(i, j, g) {
                    let p = (score_hook(sc, b, hi, i, j, hook.clone()) - l).exp();
                    let ds = slope_hook(p * (dp - delta), sc, b, hi, i, j, hook.clone()) * f32::new(scale);
                    axpy_tile(&mut dq, ds, &kt, jj * comptime![g.d], comptime![g.d], lanes);
                }
            }
        }
        sync_cube();
    }
    if real {
        store_row(out, &dq, view_row(b, hi, i, comptime![views[5]]), comptime![g.d], lanes);
    }
}

/// `dK` (`wrt_k`) or `dV`, row-major `[B, H_kv, S_k, d or e]`: a unit (or
/// `lanes` units) per key row walks the query tiles of every query head
/// that reads its key/value head. `v` and `o` are read for `dK` only. With
/// `with_v` (and `wrt_k`), `dV` too, into `out_v`, from the same probabilities.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn grad_kv(
    q: &[Stored],
    kb: &[Stored],
    v: &[Stored],
    o: &[Stored],
    dout: &[Stored],
    lse: &[Stored],
    out: &mut [Stored],
    out_v: &mut [Stored],
    #[comptime] g: Dims,
    #[comptime] views: [RowView; 7],
    #[comptime] scale: f32,
    #[comptime] wrt_k: bool,
    #[comptime] with_v: bool,
    #[comptime] hook: Hook,
) {
    let lanes = comptime![g.lanes];
    let bh = k::cube_y(comptime![g.fold]);
    let b = bh / comptime![g.hk];
    let kh = bh % comptime![g.hk];
    let row = unit_row(g);
    let real = row < comptime![g.sk];
    let j = min(row, comptime![g.sk - 1]);
    let kr = load_row(kb, b, kh, j, comptime![views[1]], comptime![g.d], lanes);
    let width = comptime![if wrt_k { g.d } else { g.e }];
    let mut acc = k::zeros(comptime![width / g.lanes]);
    let mut acc_v = k::zeros(comptime![if with_v { g.e / g.lanes } else { 1 }]);
    let vr = if comptime![wrt_k] {
        load_row(v, b, kh, j, comptime![views[2]], comptime![g.e], lanes)
    } else {
        k::zeros(1usize)
    };
    let mut qt = Shared::<[f32]>::new_slice(comptime![g.tile * g.d]);
    let mut dt = Shared::<[f32]>::new_slice(comptime![g.tile * g.e]);
    // Per query row of the tile: its log-sum-exp, then (dK) its D_i.
    let mut st = Shared::<[f32]>::new_slice(comptime![2 * g.tile]);
    let rows = cube_rows(comptime![g.sk], g);
    let band = query_tiles(rows[0], rows[1], g);
    // The tile row whose log-sum-exp and D_i this unit's row of lanes fetches.
    let mine = (UNIT_POS as usize / lanes) % comptime![g.tile];
    let fetches = UNIT_POS as usize / lanes < comptime![g.tile] && plus_lane(0usize, lanes) == 0;
    for hq in 0..comptime![g.h / g.hk] {
        let hi = kh * comptime![g.h / g.hk] + hq;
        prep_hook(b, hi, rows[0], rows[1], false, hook.clone());
        for t in band.lo..band.hi {
            load_tile(q, &mut qt, b, hi, t, comptime![views[0]], comptime![g.d], comptime![g.s], g);
            load_tile(dout, &mut dt, b, hi, t, comptime![views[4]], comptime![g.e], comptime![g.s], g);
            let i = min(t * comptime![g.tile] + mine, comptime![g.s - 1]);
            if comptime![wrt_k] {
                // Every row of lanes sums a D_i (the shuffles); the first `tile` rows keep theirs.
                let dor = load_row(dout, b, hi, i, comptime![views[4]], comptime![g.e], lanes);
                let delta = delta_row(&dor, o, b, hi, i, comptime![views[3]], comptime![g.e], lanes);
                if fetches {
                    st[comptime![g.tile] + mine] = delta;
                }
            }
            if fetches {
                st[mine] = f32::cast_from(lse[(b * comptime![g.h] + hi) * comptime![g.s] + i]);
            }
            sync_cube();
            if tile_hook(b, hi, rows[0], rows[1], t, comptime![g.tile], comptime![g.s], false, hook.clone()) {
                for ii in 0..comptime![g.tile] {
                    let i = t * comptime![g.tile] + ii;
                    let l = st[ii];
                    let sc = lane_sum(dot_tile(&kr, &qt, ii * comptime![g.d], comptime![g.d], lanes), lanes)
                        * f32::new(scale);
                    let dp = if comptime![wrt_k] {
                        lane_sum(dot_tile(&vr, &dt, ii * comptime![g.e], comptime![g.e], lanes), lanes)
                    } else {
                        f32::new(0.0)
                    };
                    if real && i < comptime![g.s] && l > f32::new(NO_KEYS_BELOW) && sees(i, j, g) {
                        let p = (score_hook(sc, b, hi, i, j, hook.clone()) - l).exp();
                        if comptime![wrt_k] {
                            let ds = slope_hook(p * (dp - st[comptime![g.tile] + ii]), sc, b, hi, i, j, hook.clone())
                                * f32::new(scale);
                            axpy_tile(&mut acc, ds, &qt, ii * comptime![g.d], comptime![g.d], lanes);
                            if comptime![with_v] {
                                axpy_tile(&mut acc_v, p, &dt, ii * comptime![g.e], comptime![g.e], lanes);
                            }
                        } else {
                            axpy_tile(&mut acc, p, &dt, ii * comptime![g.e], comptime![g.e], lanes);
                        }
                    }
                }
            }
            sync_cube();
        }
    }
    if real {
        store_row(out, &acc, view_row(b, kh, j, comptime![views[5]]), width, lanes);
        if comptime![with_v] {
            store_row(out_v, &acc_v, view_row(b, kh, j, comptime![views[6]]), comptime![g.e], lanes);
        }
    }
}
