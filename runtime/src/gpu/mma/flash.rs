//! Attention on matrix fragments ([`build_attention`]): the queries and a
//! key and value tile in shared memory, `S = Q·Kᵀ` and `P·V` on fragments.

use super::*;
use crate::gpu::kernels::Vecs;
use crate::gpu::kit::norm::Norm;

/// A copy of `rows` rows of `width` vectors (`used` of them read, the rest
/// zero) into a shared array at `dst`, row `j` being row `min(k0 + j, sk −
/// 1)` of its source; `units` units share it, and each value is rounded to
/// the fragments' operand type where `round` ([`FragDevice::rounds`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct RowCopy {
    pub dst: usize,
    pub rows: usize,
    pub width: usize,
    pub used: usize,
    pub sk: usize,
    pub units: usize,
    pub round: bool,
}

/// Rows `k0 ..` of `src` (a view or a paged cache, `source::KeySource`)
/// from `x` into the shared array, as `c` says.
#[cube]
pub(super) fn copy_rows<N: Size, S: KeySource>(
    x: &[Vector<Stored, N>],
    sh: &mut [Vector<Stored, N>],
    k0: usize,
    src: &S,
    #[comptime] c: RowCopy,
) {
    let (rows, width, units) = comptime![(c.rows, c.width, c.units)];
    #[unroll]
    for i in 0..comptime![(rows * width).div_ceil(units)] {
        let idx = UNIT_POS as usize + comptime![i * units];
        if idx < comptime![rows * width] {
            let j = idx / width;
            let col = idx % width;
            let mut val = Vector::<Stored, N>::cast_from(f32::new(0.0));
            if col < comptime![c.used] {
                val = stage::<N>(x[src.row(min(k0 + j, comptime![c.sk - 1])) + col], comptime![c.round]);
            }
            sh[comptime![c.dst] + idx] = val;
        }
    }
}

/// How a fragment kernel copies key and value tiles into shared memory
/// ([`copy_rows`]): rows under their views, or a paged cache's rows through
/// its block table; `units` units share a copy.
pub(super) struct KvRows<'a> {
    a: &'a Shape,
    units: usize,
    round: bool,
    /// The cube's batch, for a paged cache's block table.
    batch: Option<NativeExpand<usize>>,
}

impl<'a> KvRows<'a> {
    pub(super) fn new(scope: &Scope, a: &'a Shape, units: usize, round: bool) -> KvRows<'a> {
        let batch = a.paged.as_ref().map(|_| a.cube_head(scope).0);
        KvRows { a, units, round, batch }
    }

    /// Rows `k0 ..` of `x` (from `base`, the head's row 0, under `view`)
    /// into `sh` at `dst`: `rows` rows of `width` vectors, `used` of them read.
    pub(super) fn copy<N: Size>(
        &self,
        scope: &Scope,
        x: &Vecs<N>,
        sh: &mut Vecs<N>,
        (k0, base): (NativeExpand<usize>, NativeExpand<usize>),
        (dst, rows, width, used): (usize, usize, usize, usize),
        view: RowView,
    ) {
        let c = RowCopy { dst, rows, width, used, sk: self.a.g.sk, units: self.units, round: self.round };
        match (&self.a.paged, &self.batch) {
            (Some(p), Some(b)) => {
                let src = InPagesExpand { table: &p.table, b: *b, base, pages: p.pages(), outer: view.outer };
                copy_rows::expand::<N, InPages>(scope, x, sh, k0, &src, c)
            }
            _ => copy_rows::expand::<N, InView>(scope, x, sh, k0, &InViewExpand { base, view }, c),
        }
    }
}

/// This unit's query row (`width` vectors, `used` real) into the shared array at `dst + UNIT_POS · width`.
#[cube]
pub(super) fn copy_query<N: Size>(
    q: &[Vector<Stored, N>],
    sh: &mut [Vector<Stored, N>],
    at: usize,
    #[comptime] dst: usize,
    #[comptime] width: usize,
    #[comptime] used: usize,
    #[comptime] round: bool,
) {
    let row = comptime![dst] + UNIT_POS as usize * width;
    #[unroll]
    for c in 0..width {
        let mut val = Vector::<Stored, N>::cast_from(f32::new(0.0));
        if comptime![c < used] {
            val = stage::<N>(q[at + c], round);
        }
        sh[row + c] = val;
    }
}

/// A tile of `bk` shared scores a row, masked by the built-in `mask` when
/// `maskable` (a shape with boundary tiles) and the tile is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ScoreTile {
    bk: usize,
    maskable: bool,
    mask: mask::Mask,
}

/// This unit's row of a key tile's shared scores from `row` (`t.bk` of
/// them), scaled and, on a masked tile, masked in place (rather than held:
/// a unit already holds its output row, up to 128 floats, in registers).
#[cube]
fn scale_and_mask(
    scores: &mut [f32],
    row: usize,
    i: usize,
    k0: usize,
    scale: f32,
    masked: bool,
    #[comptime] t: ScoreTile,
) {
    let bk = comptime![t.bk];
    #[unroll]
    for jj in 0..bk {
        scores[row + jj] = scores[row + jj] * scale;
    }
    if comptime![t.maskable] {
        if masked {
            #[unroll]
            for jj in 0..bk {
                scores[row + jj] = mask::mask_score(scores[row + jj], i, k0, jj, comptime![t.mask]);
            }
        }
    }
}

/// The online softmax of this unit's row over one key tile of scores at
/// `scores[row ..]` (`bk`, scaled and masked): updates the state `[max,
/// sum]`, rescales the accumulator `o`, `o_rest` (`c`, see [`HELD`]) and
/// writes the probabilities, in the storage type, at `dst + row / N` of the
/// shared array.
#[cube]
fn softmax_tile<N: Size>(
    scores: &[f32],
    row: usize,
    sh: &mut [Vector<Stored, N>],
    state: &mut Array<f32>,
    acc: &mut RowAcc<'_>,
    #[comptime] probs: (usize, usize, Norm),
) {
    let (dst, bk, rule) = comptime![probs];
    let mut m = state[0];
    #[unroll]
    for jj in 0..bk {
        m = max(m, scores[row + jj]);
    }
    let mut sum = f32::new(0.0);
    #[unroll]
    for v in 0..comptime![bk / N::value()] {
        let mut p = Vector::<f32, N>::empty();
        #[unroll]
        for x in 0..N::value() {
            let e = norm::weight(scores[row + comptime![v * N::value() + x]], m, rule);
            sum += e;
            p.insert(x, e);
        }
        sh[comptime![dst] + row / N::value() + v] = Vector::<Stored, N>::cast_from(p);
    }
    let alpha = norm::advance(state, m, sum, rule);
    #[unroll]
    for x in 0..comptime![acc.held] {
        acc.o[x] = acc.o[x] * alpha;
    }
    #[unroll]
    for x in 0..comptime![acc.width - acc.held] {
        let at = rest_at(x, comptime![acc.units]);
        acc.rest[at] = acc.rest[at] * alpha;
    }
}

/// The f32 accumulator of each unit's output row, `width` columns in a cube
/// of `units` rows: columns below `held` in registers (`o`), the rest in
/// shared memory (`rest`, column-major, [`rest_at`]).
#[derive(CubeType)]
pub(super) struct RowAcc<'a> {
    pub o: Array<f32>,
    pub rest: &'a mut [f32],
    #[cube(comptime)]
    pub width: usize,
    #[cube(comptime)]
    pub held: usize,
    #[cube(comptime)]
    pub units: usize,
}

/// Where column `c` of the shared rest of this unit's output row is, in a
/// cube of `units` units: column-major, `c · units + UNIT_POS`.
#[cube]
pub(super) fn rest_at(#[comptime] c: usize, #[comptime] units: usize) -> usize {
    comptime![c * units] + UNIT_POS as usize
}

/// Zeroes this unit's column of the shared rest of the output rows.
#[cube]
pub(super) fn zero_rest(o_rest: &mut [f32], #[comptime] rest: usize, #[comptime] units: usize) {
    #[unroll]
    for c in 0..rest {
        o_rest[rest_at(c, units)] = f32::new(0.0);
    }
}

/// Output columns a unit of fragment attention holds in registers at
/// least; the rest of a wider row lives in shared memory, column-major
/// (`[c · units + UNIT_POS]`, each unit its own column of banks): with 128
/// floats held a unit needed more than CUDA's 255 registers a thread.
pub(super) const HELD: usize = 64;

/// Output columns held in registers for rows of `ep` columns in a cube of
/// `units` rows, the kernel's other shared arrays taking `base` bytes of
/// the device's `limit`: all past `most` ([`HELD`] for the forward) that do
/// not fit in shared memory (the forward at d = 128: 64 on CUDA, 46 KB in
/// all; on lavapipe's 32 KB, 7 of 128 columns go to shared memory).
pub(super) fn held_columns(ep: usize, base: usize, limit: usize, most: usize, units: usize) -> usize {
    // Slack for each shared array's alignment.
    let room = limit.saturating_sub(base + 128) / (4 * units);
    ep - ep.saturating_sub(most).min(room)
}

/// Output column `c` of this unit's row += `scratch[at + c - c0]` for the
/// 16 columns of a fragment from `c0`: in registers below `held`, else in
/// the shared rest.
#[cube]
pub(super) fn add_fragment_row(acc: &mut RowAcc<'_>, scratch: &[f32], at: usize, #[comptime] c0: usize) {
    let (held, units) = comptime![(acc.held, acc.units)];
    if comptime![c0 >= held && units < ATTN_ROWS] {
        // All in shared memory, in the backward of wide heads: a loop (less
        // code than 16 unrolled adds; unrolled elsewhere, where ptxas held
        // the loop's kernels to fewer registers and spilled).
        for c in 0..16usize {
            let r = comptime![(c0 - held) * units] + c * units + UNIT_POS as usize;
            acc.rest[r] += scratch[at + c];
        }
    } else {
        #[unroll]
        for c in 0..16usize {
            if comptime![c0 + c < held] {
                acc.o[comptime![c0] + c] += scratch[at + c];
            } else {
                acc.rest[rest_at(comptime![c0 + c - held], units)] += scratch[at + c];
            }
        }
    }
}

/// The accumulator of each unit's row (`width` columns) in a cube of
/// `units`: registers up to `held`, the rest in shared memory, zeroed by its
/// own unit (no barrier: only that unit touches it); `spare` stands for the
/// rest where there is none.
pub(super) fn accumulators(
    scope: &Scope,
    width: usize,
    held: usize,
    units: usize,
    spare: &NativeExpand<[f32]>,
) -> Accumulator {
    let o = k::zeros::expand(scope, held);
    let rest = if width > held {
        let mut r = floats_in_shared(scope, (width - held) * units);
        zero_rest::expand(scope, &mut r, width - held, units);
        r
    } else {
        spare.clone_unchecked()
    };
    Accumulator { o, rest, width, held, units }
}

/// The host's handle on a kernel's [`RowAcc`] ([`accumulators`]).
pub(super) struct Accumulator {
    o: NativeExpand<Array<f32>>,
    rest: NativeExpand<[f32]>,
    width: usize,
    pub held: usize,
    units: usize,
}

impl Accumulator {
    /// `f` on the accumulator as a kernel argument (handles on the same
    /// registers and shared memory).
    pub(super) fn with<R>(&self, f: impl FnOnce(&mut RowAccExpand<'_>) -> R) -> R {
        let mut rest = self.rest.clone_unchecked();
        let (width, held, units) = (self.width, self.held, self.units);
        f(&mut RowAccExpand { o: self.o.clone(), rest: &mut rest, width, held, units })
    }

    /// Zeroes the accumulator, registers and shared rest.
    pub(super) fn reset(&self, scope: &Scope) {
        k::zero_floats::expand(scope, &mut self.o.clone(), self.held);
        if self.width > self.held {
            zero_rest::expand(scope, &mut self.rest.clone_unchecked(), self.width - self.held, self.units);
        }
    }
}

/// Where this unit's row of a tile's `bk` shared scores starts.
#[cube]
pub(super) fn unit_scores(#[comptime] bk: usize) -> usize {
    UNIT_POS as usize * bk
}

/// Where this unit's row sits in its plane's 32×16 scratch tile: `warp · 512 + lane · 16`.
#[cube]
pub(super) fn scratch_row() -> usize {
    UNIT_POS as usize / 32 * 512 + UNIT_POS as usize % 32 * 16
}

/// `out = o / l` for this unit's row, if it exists (a row that saw no key is 0).
#[cube]
fn store_row<N: Size>(
    out: &mut [Vector<Stored, N>],
    acc: &RowAcc<'_>,
    state: &Array<f32>,
    slots: &Array<usize>,
    #[comptime] s: usize,
    #[comptime] el: usize,
    #[comptime] rule: Norm,
) {
    let inv = norm::inverse_sum(state, rule);
    store_columns::<N>(out, acc, inv, slots[ROW_OUT], slots[ROW_I] < s, (0usize, el));
}

/// `out[at ..]`: `n` vectors of this unit's row from column `c0` (`cols`),
/// times `factor`, if `inside`.
#[cube]
pub(super) fn store_columns<N: Size>(
    out: &mut [Vector<Stored, N>],
    acc: &RowAcc<'_>,
    factor: f32,
    at: usize,
    inside: bool,
    #[comptime] cols: (usize, usize),
) {
    let (c0, n) = comptime![cols];
    let (held, units) = comptime![(acc.held, acc.units)];
    // Vectors from `split` on lie wholly in the shared rest: a loop in the
    // backward of wide heads (as in `add_fragment_row`).
    let split = comptime![if units < ATTN_ROWS { held.saturating_sub(c0).div_ceil(N::value()).min(n) } else { n }];
    if inside {
        #[unroll]
        for c in 0..split {
            let mut v = Vector::<f32, N>::empty();
            #[unroll]
            for x in 0..N::value() {
                let col = comptime![c0 + c * N::value() + x];
                if comptime![col < held] {
                    v.insert(x, acc.o[col] * factor);
                } else {
                    v.insert(x, acc.rest[rest_at(comptime![col - held], units)] * factor);
                }
            }
            out[at + c] = Vector::<Stored, N>::cast_from(v);
        }
        if comptime![split < n] {
            for c in split..n {
                let mut v = Vector::<f32, N>::empty();
                // Rest column `c0 + c·N − held`: `split` is where it is 0 or more.
                let col = (c - split) * N::value() + comptime![split * N::value() + c0 - held];
                let first = col * units + UNIT_POS as usize;
                #[unroll]
                for x in 0..N::value() {
                    v.insert(x, acc.rest[first + comptime![x * units]] * factor);
                }
                out[at + c] = Vector::<Stored, N>::cast_from(v);
            }
        }
    }
}

/// `c[plane's 32 rows, tile] = A·Bᵀ` for each of `cols / 16` column
/// fragments: A's rows at vector `a_off` of `x` (this plane's 32 of them,
/// `a_width` elements each, `depth` of them multiplied), Bᵀ's columns the
/// rows at `b_off` (as wide). Stored row-major at `out`, rows `cols` apart.
pub(super) fn products_t<N: Size>(
    scope: &Scope,
    frags: &Frags,
    x: &Vecs<N>,
    out: &mut NativeExpand<[f32]>,
    (a_off, b_off): (usize, usize),
    a_width: usize,
    cols: usize,
) {
    let (warp, lanes) = (&frags.warp, N::value());
    let wl = a_width / lanes;
    for rf in 0..2 {
        for cf in 0..cols / F {
            let mut acc = frags.zero(scope);
            for ks in 0..a_width / F {
                let a_at = scaled_add::expand(scope, warp.clone(), 32 * wl, a_off + rf * F * wl + ks * F / lanes);
                let b_at = k::const_index::expand(scope, b_off + cf * F * wl + ks * F / lanes);
                frags.mma::<N>(scope, &mut acc, x, (a_at, a_width), (b_at, a_width, true));
            }
            let at = scaled_add::expand(scope, warp.clone(), 32 * cols, rf * F * cols + cf * F);
            frags.store(scope, &acc, out, at, cols);
        }
    }
}

/// Each unit's row `+= W·B`, 16 columns at a time through the f32 scratch
/// `sf`: W the plane's 32 rows of `depth` elements at vector `w_off` of
/// `x`, B `depth` rows of `b_width` elements at vector `b_off` (row-major,
/// where the kernel picks it); the columns land at `c0 ..` of the unit's
/// row in `acc`.
pub(super) fn accumulate<N: Size>(
    scope: &Scope,
    frags: &Frags,
    x: &Vecs<N>,
    sf: &NativeExpand<[f32]>,
    acc: &Accumulator,
    (w_off, depth): (usize, usize),
    (b_off, b_width, c0): (NativeExpand<usize>, usize, usize),
) {
    let (warp, lanes) = (&frags.warp, N::value());
    let row = scratch_row::expand(scope);
    for cf in 0..b_width / F {
        for rf in 0..2 {
            let mut acc = frags.zero(scope);
            for ks in 0..depth / F {
                let a_at = scaled_add::expand(
                    scope,
                    warp.clone(),
                    32 * depth / lanes,
                    w_off + (rf * F * depth + ks * F) / lanes,
                );
                let b_at = k::add_index::expand(
                    scope,
                    b_off.clone(),
                    k::const_index::expand(scope, ks * F * b_width / lanes + cf * F / lanes),
                );
                frags.mma::<N>(scope, &mut acc, x, (a_at, depth), (b_at, b_width, false));
            }
            let at = scaled_add::expand(scope, warp.clone(), 32 * F, rf * F * F);
            frags.store(scope, &acc, &mut sf.clone_unchecked(), at, F);
        }
        k::barrier::expand(scope);
        acc.with(|r| add_fragment_row::expand(scope, r, sf, row.clone(), c0 + cf * F));
        k::barrier::expand(scope);
    }
}

/// Attention on matrix fragments for a cube of `ATTN_ROWS` units (two
/// planes) and as many query rows, one per unit, over key tiles of
/// `plan::frag_key_tile`: the queries, each key and value tile and the tile's
/// probabilities sit in one shared array of the storage type (head widths
/// padded with zeros to multiples of 16); `S = Q·Kᵀ` goes through shared f32
/// scores, each unit runs the online softmax of its row and keeps its output
/// row in f32 registers, and `P·V` comes back through the same f32 scratch.
pub fn build_attention<N: Size>(
    scope: &Scope,
    x: &Inputs<N>,
    out: &mut Vecs<N>,
    scale: NativeExpand<f32>,
    a: &Shape,
    dev: FragDevice,
) {
    let (q, kb, v, lanes) = (x.q, x.k, x.v, a.lanes);
    let FragDevice { hardware, dtype, shared_limit } = dev;
    let (bq, bk) = (ATTN_ROWS, a.tiles.key_tile);
    let FragWidths { dp, ep, dpl, epl, dl, el } = FragWidths::of(a, bk);
    let q_off = 0;
    let k_off = q_off + bq * dpl;
    let v_off = k_off + bk * dpl;
    let p_off = v_off + bk * epl;
    let len = p_off + bq * bk / lanes;
    let mut x = vectors_in_shared::<N>(scope, len);
    let sf = floats_in_shared(scope, (bq * bk).max(bq * F));
    let frags = Frags::new(scope, hardware, dtype);
    let set = tiles::setup::expand(scope, a.g, bq, bk, a.views, 0);
    let slots = att::row_slots::expand(scope, a.g, bq, 0, a.views, 0);
    let i = k::uget::expand(scope, &slots, ROW_I);
    copy_query::expand::<N>(scope, q, &mut x, k::uget::expand(scope, &slots, ROW_Q), q_off, dpl, dl, dev.rounds());
    let base = len * lanes * dtype.storage().size() + (bq * bk).max(bq * F) * 4;
    let held = held_columns(ep, base, shared_limit, HELD, ATTN_ROWS);
    let acc = accumulators(scope, ep, held, ATTN_ROWS, &sf);
    let state = norm::start(scope, a);
    let (k_base, v_base) = (k::uget::expand(scope, &set, SET_K), k::uget::expand(scope, &set, SET_V));
    // Score and mask functions: each unit applies them to its own row of the
    // shared scores (scaled first), before the online softmax.
    let walk = tiles::KeyWalk::new(scope, &set, a, bk);
    let tile = |scope: &Scope, (kt, masked, hidden): tiles::TileFlags| {
        let k0 = k::mul_const::expand(scope, kt, bk);
        let mut xs = x.clone_unchecked();
        let rows = KvRows::new(scope, a, ATTN_ROWS, dev.rounds());
        rows.copy::<N>(scope, kb, &mut xs, (k0, k_base), (k_off, bk, dpl, dl), a.views[1]);
        rows.copy::<N>(scope, v, &mut xs, (k0, v_base), (v_off, bk, epl, el), a.views[2]);
        k::barrier::expand(scope);
        // Scores: plane `warp`'s 32 rows (2 fragments) by the tile's keys.
        products_t::<N>(scope, &frags, &x, &mut sf.clone_unchecked(), (q_off, k_off), dp, bk);
        k::barrier::expand(scope);
        let with_fns = a.fns.is_some();
        if with_fns {
            let row = unit_scores::expand(scope, bk);
            let scores: Vec<_> = (0..bk)
                .map(|jj| {
                    let at = k::add_index::expand(scope, row.clone(), k::const_index::expand(scope, jj));
                    k::fmul::expand(scope, k::read::expand::<f32>(scope, &sf, at), scale.clone())
                })
                .collect();
            let scores = pair::mask_scores(scope, scores, &masked, hidden, i.clone(), k0.clone(), a);
            for (jj, v) in scores.into_iter().enumerate() {
                let at = k::add_index::expand(scope, row.clone(), k::const_index::expand(scope, jj));
                k::write::expand::<f32>(scope, &mut sf.clone_unchecked(), at, v);
            }
        }
        let (row, mut st) = (unit_scores::expand(scope, bk), state.clone());
        // Scaled (and masked) already where functions applied.
        let scale = if with_fns { k::fconst::expand(scope, 1.0) } else { scale.clone() };
        let t = ScoreTile { bk, maskable: masked.is_some() && !with_fns, mask: a.mask() };
        let masked = masked.unwrap_or_else(|| NativeExpand::from_lit(scope, false));
        scale_and_mask::expand(scope, &mut sf.clone_unchecked(), row.clone(), i.clone(), k0, scale, masked, t);
        acc.with(|r| softmax_tile::expand::<N>(scope, &sf, row, &mut xs, &mut st, r, (p_off, bk, a.g.norm)));
        k::barrier::expand(scope);
        // P·V, 16 output columns at a time through the scratch.
        let b_v = (k::const_index::expand(scope, v_off), ep, 0);
        accumulate::<N>(scope, &frags, &x, &sf, &acc, (p_off, bk), b_v);
    };
    walk.visit(scope, tile);
    acc.with(|r| store_row::expand::<N>(scope, out, r, &state, &slots, a.g.s, el, a.g.norm));
    if let Some(lse) = &a.lse {
        norm::store_lse::expand(scope, &mut lse.clone_unchecked(), &state, &slots, a.g.s, a.g.fold, a.g.norm);
    }
}

#[cfg(test)]
mod tests {
    use super::{held_columns, HELD};

    /// Fragment attention at d = 128 in f16 (30 KiB of other shared arrays):
    /// CUDA's 48 KiB take the 64 columns past `HELD`; lavapipe's 32 KiB take
    /// 7, so the software-fragment tests there run the shared path too.
    #[test]
    fn output_columns_past_the_register_budget_go_to_shared_memory() {
        assert_eq!(held_columns(128, 30720, 49152, HELD, 64), 64);
        assert_eq!(held_columns(128, 30720, 32768, HELD, 64), 121);
        assert_eq!(held_columns(128, 30720, 16384, HELD, 64), 128);
        assert_eq!(held_columns(64, 28672, 49152, HELD, 64), 64);
        assert_eq!(held_columns(96, 24576, 49152, HELD, 64), 64);
        // A plane of 32 rows: each column of the rest takes 128 bytes.
        assert_eq!(held_columns(128, 30720, 32768, HELD, 32), 113);
    }
}
