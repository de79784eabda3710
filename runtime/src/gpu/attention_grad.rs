//! Attention's backward, FlashAttention-2 style, and the per-row
//! log-sum-exp it saves (`KernelSpec::AttentionLse`, `KernelSpec::AttentionGrad`).
//!
//! A cube owns `Dims::rows` rows: query rows of one (batch, head) for the
//! log-sum-exp and `dQ`; key rows of one (batch, key/value head) for `dK`
//! and `dV`, which walk the query rows of every query head sharing that
//! key/value head (GQA's accumulation, in the unit's registers). A row
//! belongs to one unit (`plan::ATTN_ROWS` units a cube), or, tiled within
//! a GPU's register file (`plan::choose_path`, what CUDA runs), to
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

use super::attention_split::xor_add;
use super::func::{prep_hook, score_hook, sink_hook, slope_hook, tile_hook, Hook};
use super::kernels::{self as k, Stored};
pub use super::kit::launch::Dims;
use super::kit::mask::sees;
use super::kit::norm::{self, live, push};
use super::kit::source::view_row;
use super::kit::walk::{key_tiles, query_tiles};
use attnc_compiler::plan::{grad_chunk, RowView};
use cubecl::prelude::*;

/// The bindings attention's `#[cube]` backward kernels read: the forward's
/// inputs and output, the output's gradient and the saved log-sum-exp.
#[derive(CubeType)]
pub struct Saved<'a> {
    pub q: &'a [Stored],
    pub k: &'a [Stored],
    pub v: &'a [Stored],
    pub o: &'a [Stored],
    pub dout: &'a [Stored],
    pub lse: &'a [Stored],
}

/// The comptime arguments of a backward launch beside its [`Dims`]: the
/// layouts of q, k, v, o, dout, the gradient and dV, the attention's scale
/// and its score and mask functions.
#[derive(Clone)]
pub struct GradArgs {
    pub views: [RowView; 7],
    pub scale: f32,
    pub hook: Hook,
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

/// The rows of one side of a head as a kernel reads them: their layout,
/// floats a row and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Side {
    view: RowView,
    width: usize,
    rows: usize,
}

/// Tile `t` (rows `t·rows ..`, clamped to the last of `side.rows`) of
/// `side.width` floats a row of head `(b, hh)` of `x` into `tile`, the
/// cube's units sharing the copy.
#[cube]
fn load_tile(
    x: &[Stored],
    tile: &mut [f32],
    b: usize,
    hh: usize,
    t: usize,
    #[comptime] side: Side,
    #[comptime] g: Dims,
) {
    let (v, width, n) = comptime![(side.view, side.width, side.rows)];
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
/// and query row `i` of head `(b, hi)` of `o`, summed over the row's lanes
/// (`g.e` values, `g.lanes` lanes).
#[cube]
fn delta_row(
    dor: &Array<f32>,
    o: &[Stored],
    b: usize,
    hi: usize,
    i: usize,
    #[comptime] ov: RowView,
    #[comptime] g: Dims,
) -> f32 {
    let (e, lanes) = comptime![(g.e, g.lanes)];
    let or = load_row(o, b, hi, i, ov, e, lanes);
    let mut delta = f32::new(0.0);
    #[unroll]
    for c in 0..comptime![e / lanes] {
        delta += dor[c] * or[c];
    }
    lane_sum(delta, lanes)
}

/// The log-sum-exp of each query row's scaled visible scores, row-major
/// `[B, H, S]` (`NO_KEYS` for a row that sees none); of `args.views`, q's
/// and k's are read.
#[cube]
pub fn lse(q: &[Stored], kb: &[Stored], out: &mut [Stored], #[comptime] g: Dims, #[comptime] args: GradArgs) {
    let (qv, kv, scale, hook) = comptime![(args.views[0], args.views[1], args.scale, args.hook.clone())];
    let QueryRow { bh, b, hi, kh, i, real } = query_row(g);
    let qr = load_row(q, b, hi, i, qv, comptime![g.d], comptime![g.lanes]);
    let mut kt = Shared::<[f32]>::new_slice(comptime![g.tile * g.d]);
    let mut m = f32::new(norm::M_INIT);
    let mut l = f32::new(0.0);
    let sink = sink_hook(hi, hook.clone());
    let rows = cube_rows(comptime![g.s], g);
    let band = key_tiles(rows[0], rows[1], g);
    prep_hook(b, hi, rows[0], rows[1], true, hook.clone());
    for t in band.lo..band.hi {
        load_tile(kb, &mut kt, b, kh, t, comptime![Side { view: kv, width: g.d, rows: g.sk }], g);
        sync_cube();
        if tile_hook(b, hi, rows[0], rows[1], t, comptime![g.tile], comptime![g.sk], true, hook.clone()) {
            for jj in 0..comptime![g.tile] {
                let j = t * comptime![g.tile] + jj;
                // Every lane of the plane sums its part, seen or not (the shuffles).
                let dot = lane_sum(
                    dot_tile(&qr, &kt, jj * comptime![g.d], comptime![g.d], comptime![g.lanes]),
                    comptime![g.lanes],
                );
                if j < comptime![g.sk] && sees(i, j, comptime![g.mask()]) {
                    let sc = score_hook(dot * f32::new(scale), b, hi, i, j, hook.clone());
                    let st = push(m, l, sc, comptime![g.norm]);
                    m = st.m;
                    l = st.l;
                }
            }
        }
        sync_cube();
    }
    if real && plus_lane(0usize, comptime![g.lanes]) == 0 {
        out[bh * comptime![g.s] + i] = Stored::cast_from(norm::stat(m, l, sink, comptime![g.norm]));
    }
}

/// `dQ`, row-major `[B, H, S, d]`: a unit (or `lanes` units) per query row
/// walks the key and value tiles of its key/value head.
#[cube]
pub fn grad_q(x: &Saved, out: &mut [Stored], #[comptime] g: Dims, #[comptime] args: GradArgs) {
    let (views, scale, hook) = comptime![(args.views, args.scale, args.hook.clone())];
    let lanes = comptime![g.lanes];
    let QueryRow { bh, b, hi, kh, i, real } = query_row(g);
    let qr = load_row(x.q, b, hi, i, comptime![views[0]], comptime![g.d], lanes);
    let dor = load_row(x.dout, b, hi, i, comptime![views[4]], comptime![g.e], lanes);
    let delta = delta_row(&dor, x.o, b, hi, i, comptime![views[3]], g);
    let l = f32::cast_from(x.lse[bh * comptime![g.s] + i]);
    let alive = real && live(l);
    let mut dq = k::zeros(comptime![g.d / g.lanes]);
    let mut kt = Shared::<[f32]>::new_slice(comptime![g.tile * g.d]);
    let mut vt = Shared::<[f32]>::new_slice(comptime![g.tile * g.e]);
    let rows = cube_rows(comptime![g.s], g);
    let band = key_tiles(rows[0], rows[1], g);
    prep_hook(b, hi, rows[0], rows[1], true, hook.clone());
    for t in band.lo..band.hi {
        load_tile(x.k, &mut kt, b, kh, t, comptime![Side { view: views[1], width: g.d, rows: g.sk }], g);
        load_tile(x.v, &mut vt, b, kh, t, comptime![Side { view: views[2], width: g.e, rows: g.sk }], g);
        sync_cube();
        if tile_hook(b, hi, rows[0], rows[1], t, comptime![g.tile], comptime![g.sk], true, hook.clone()) {
            for jj in 0..comptime![g.tile] {
                let j = t * comptime![g.tile] + jj;
                let sc =
                    lane_sum(dot_tile(&qr, &kt, jj * comptime![g.d], comptime![g.d], lanes), lanes) * f32::new(scale);
                let dp = lane_sum(dot_tile(&dor, &vt, jj * comptime![g.e], comptime![g.e], lanes), lanes);
                if alive && j < comptime![g.sk] && sees(i, j, comptime![g.mask()]) {
                    let x = score_hook(sc, b, hi, i, j, hook.clone());
                    let p = norm::prob(x, l, comptime![g.norm]);
                    let ds = norm::grad_weight(x, l, p, dp, delta, comptime![g.norm]);
                    let ds = slope_hook(ds, sc, b, hi, i, j, hook.clone()) * f32::new(scale);
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
pub fn grad_kv(
    x: &Saved,
    out: &mut [Stored],
    out_v: &mut [Stored],
    #[comptime] g: Dims,
    #[comptime] args: GradArgs,
    #[comptime] wrt: (bool, bool),
) {
    let (wrt_k, with_v) = comptime![wrt];
    let (views, scale, hook) = comptime![(args.views, args.scale, args.hook.clone())];
    let lanes = comptime![g.lanes];
    let bh = k::cube_y(comptime![g.fold]);
    let b = bh / comptime![g.hk];
    let kh = bh % comptime![g.hk];
    let row = unit_row(g);
    let real = row < comptime![g.sk];
    let j = min(row, comptime![g.sk - 1]);
    let kr = load_row(x.k, b, kh, j, comptime![views[1]], comptime![g.d], lanes);
    let width = comptime![if wrt_k { g.d } else { g.e }];
    let mut acc = k::zeros(comptime![width / g.lanes]);
    let mut acc_v = k::zeros(comptime![if with_v { g.e / g.lanes } else { 1 }]);
    let vr = if comptime![wrt_k] {
        load_row(x.v, b, kh, j, comptime![views[2]], comptime![g.e], lanes)
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
            load_tile(x.q, &mut qt, b, hi, t, comptime![Side { view: views[0], width: g.d, rows: g.s }], g);
            load_tile(x.dout, &mut dt, b, hi, t, comptime![Side { view: views[4], width: g.e, rows: g.s }], g);
            let i = min(t * comptime![g.tile] + mine, comptime![g.s - 1]);
            if comptime![wrt_k] {
                // Every row of lanes sums a D_i (the shuffles); the first `tile` rows keep theirs.
                let dor = load_row(x.dout, b, hi, i, comptime![views[4]], comptime![g.e], lanes);
                let delta = delta_row(&dor, x.o, b, hi, i, comptime![views[3]], g);
                if fetches {
                    st[comptime![g.tile] + mine] = delta;
                }
            }
            if fetches {
                st[mine] = f32::cast_from(x.lse[(b * comptime![g.h] + hi) * comptime![g.s] + i]);
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
                    if real && i < comptime![g.s] && live(l) && sees(i, j, comptime![g.mask()]) {
                        let x = score_hook(sc, b, hi, i, j, hook.clone());
                        let p = norm::prob(x, l, comptime![g.norm]);
                        if comptime![wrt_k] {
                            let ds = norm::grad_weight(x, l, p, dp, st[comptime![g.tile] + ii], comptime![g.norm]);
                            let ds = slope_hook(ds, sc, b, hi, i, j, hook.clone()) * f32::new(scale);
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
