//! Attention tiled within a GPU's register file (`KernelSpec::fit_registers`):
//! what CUDA runs in f32 and tf32, and in half precision past the
//! fragment kernel's head widths.
//!
//! The CPU drivers' kernel (`attention_tiled.rs`) gives a unit several whole query
//! rows and unrolls whole key tiles: right for lavapipe, where a unit's
//! values are LLVM vectors, but on a GPU a unit holding `d + e` floats per
//! row spills past 255 registers (85 KB of local memory per kernel at
//! d = 128, measured with ptxas). Here `g` consecutive lanes of a plane
//! share each query row, each holding `1/g` of its query and output
//! channels (at most `plan::REGISTER_FLOATS` floats). Per key row a lane
//! multiplies its channels and the row's lanes sum their parts with `log2 g`
//! butterfly shuffles, so every lane of the row holds the whole score and
//! runs the same online softmax; each lane accumulates its own output
//! channels. A cube is 64 query rows (32 at eight lanes a row, so that a
//! cube of at most 256 threads may use 255 registers each); key tiles,
//! masks, the tiles visited and the heaviest-first order are the CPU
//! kernel's (`attention::setup`), so what a mask means is written once.

use super::attention::{
    key_address, load_query, mask_scores, query_tile, setup, softmax_state, store_lse, store_partial, store_row,
    view_row, Shape, ROW_I, ROW_OUT, ROW_Q, SET_K, SET_V,
};
use super::kernels::{self as k, Stored};
use super::tiles::{prepare_tiles, walk_tiles};
use attnc_compiler::plan::RowView;
use cubecl::prelude::*;

/// This unit's query row (`ROW_*` slots: the addresses of its slices of
/// the query and output rows, `dg` and `eg` vectors a lane) and its slice.
#[cube]
#[allow(clippy::too_many_arguments)]
fn lane_slots(
    #[comptime] h: usize,
    #[comptime] s: usize,
    #[comptime] bq: usize,
    #[comptime] kind: u32,
    #[comptime] g: usize,
    #[comptime] dg: usize,
    #[comptime] eg: usize,
    #[comptime] views: [RowView; 4],
    #[comptime] fold: usize,
    #[comptime] split_stride: usize,
) -> Array<usize> {
    // A fifth slot (the output row's start) where a split's log-sum-exp needs it.
    let mut a = Array::<usize>::new(comptime![if split_stride > 0 { 5usize } else { 4usize }]);
    let bh = k::cube_y(fold);
    let unit = UNIT_POS as usize;
    let i = query_tile(s, bq, kind, fold) * bq + unit / g;
    let row = min(i, comptime![s - 1]);
    let part = unit % g;
    a[ROW_Q] = view_row(bh / h, bh % h, row, comptime![views[0]]) + part * dg;
    // Split-KV: the cube's chunk of partial rows (grid z).
    let out = view_row(bh / h, bh % h, row, comptime![views[3]]);
    a[ROW_OUT] = out + part * eg;
    a[ROW_I] = i;
    a[PART] = part;
    if comptime![split_stride > 0] {
        // Split-KV: the cube's chunk of partial rows (grid z).
        let chunk = out + CUBE_POS_Z as usize * split_stride;
        a[ROW_OUT] = chunk + part * eg;
        a[OUT_ROW] = chunk;
    }
    a
}

/// The slots of [`lane_slots`] holding the unit's slice of its row and the
/// start of its output row.
const PART: usize = 3;
const OUT_ROW: usize = 4;

/// `v` plus lane `lane ^ mask`'s `v`: one butterfly step of a sum over the
/// lanes sharing a row.
#[cube]
pub(super) fn xor_add(v: f32, #[comptime] mask: u32) -> f32 {
    v + plane_shuffle_xor(v, mask)
}

/// `acc + q · x[at .. at + n]`.
#[cube]
fn dot_slice<N: Size>(q: &Array<Vector<f32, N>>, x: &[Vector<Stored, N>], at: usize, #[comptime] n: usize) -> f32 {
    let mut acc = f32::new(0.0);
    #[unroll]
    for c in 0..n {
        acc += q[c].dot(Vector::<f32, N>::cast_from(x[at + c]));
    }
    acc
}

/// `acc · corr + p · x[at .. at + n]`, in place.
#[cube]
fn axpy_slice<N: Size>(
    acc: &mut Array<Vector<f32, N>>,
    x: &[Vector<Stored, N>],
    at: usize,
    p: f32,
    #[comptime] n: usize,
) {
    #[unroll]
    for c in 0..n {
        acc[c] += Vector::new(p) * Vector::<f32, N>::cast_from(x[at + c]);
    }
}

/// `acc · corr`, in place.
#[cube]
fn rescale<N: Size>(acc: &mut Array<Vector<f32, N>>, corr: f32, #[comptime] n: usize) {
    #[unroll]
    for c in 0..n {
        acc[c] *= Vector::new(corr);
    }
}

/// Emit the kernel body for vectors of `N` (`lanes` floats).
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
) {
    let g = a.tiles.lanes;
    let (dg, eg) = (a.d / lanes / g, a.e / lanes / g);
    let (bk, bq) = (a.tiles.key_tile, a.tiles.cube_rows());
    let (split_tiles, split_stride) = a.kv.map_or((0, 0), |kv| (kv.tiles, kv.stride));
    let set =
        setup::expand(scope, a.h, a.hk, a.s, a.sk, bq, bk, a.kind, a.window, a.block, a.views, a.fold, split_tiles);
    let rows = lane_slots::expand(scope, a.h, a.s, bq, a.kind, g, dg, eg, a.views, a.fold, split_stride);
    let part = k::uget::expand(scope, &rows, PART);
    let qr = load_query::expand::<N>(scope, q, k::uget::expand(scope, &rows, ROW_Q), scale, dg);
    let acc = k::vzeros::expand::<N>(scope, eg);
    let state = softmax_state::expand(scope);
    let body = Body { a, set: &set, rows: &rows, part, qr: &qr, acc: &acc, state: &state, kb, v, g, dg, eg, bk };
    let prep = prepare_tiles(scope, &set, a);
    walk_tiles(scope, &set, a, bk, &prep, |scope, kt, masked, hidden| {
        body.tile(scope, k::mul_const::expand(scope, kt, bk), masked, hidden)
    });
    match a.kv {
        Some(kv) => store_partial::expand::<N>(scope, out, &acc, &state, &rows, OUT_ROW, a.s, eg, kv),
        None => store_row::expand::<N>(scope, out, &acc, &state, &rows, a.s, eg),
    }
    if let Some(lse) = &a.lse {
        // Every lane of a row holds its whole state: they write the same value.
        store_lse::expand(scope, &mut lse.clone_unchecked(), &state, &rows, a.s, a.fold);
    }
}

/// What every key tile of a unit reads and updates.
struct Body<'a, N: Size> {
    a: &'a Shape,
    set: &'a NativeExpand<Array<usize>>,
    rows: &'a NativeExpand<Array<usize>>,
    part: NativeExpand<usize>,
    qr: &'a NativeExpand<Array<Vector<f32, N>>>,
    acc: &'a NativeExpand<Array<Vector<f32, N>>>,
    state: &'a NativeExpand<Array<f32>>,
    kb: &'a NativeExpand<[Vector<Stored, N>]>,
    v: &'a NativeExpand<[Vector<Stored, N>]>,
    g: usize,
    dg: usize,
    eg: usize,
    bk: usize,
}

impl<N: Size> Body<'_, N> {
    /// One key tile starting at key row `k0`: the tile's scores (each a
    /// sum over the row's lanes), one rescale, then the value rows.
    fn tile(
        &self,
        scope: &Scope,
        k0: NativeExpand<usize>,
        masked: Option<NativeExpand<bool>>,
        hidden: Option<NativeExpand<bool>>,
    ) {
        let a = self.a;
        let k_base = k::uget::expand(scope, self.set, SET_K);
        let v_base = k::uget::expand(scope, self.set, SET_V);
        let i = k::uget::expand(scope, self.rows, ROW_I);
        let k_part = k::mul_const::expand(scope, self.part, self.dg);
        let v_part = k::mul_const::expand(scope, self.part, self.eg);
        let mut scores = Vec::with_capacity(self.bk);
        for jj in 0..self.bk {
            let row = key_address(scope, a, k0, k_base, jj, masked.is_some(), a.views[1]);
            let at = k::add_index::expand(scope, row, k_part);
            let dot = dot_slice::expand::<N>(scope, self.qr, self.kb, at, self.dg);
            // The row's lanes (consecutive, `g` a power of two) sum their parts.
            scores.push((0..self.g.trailing_zeros()).fold(dot, |v, b| xor_add::expand(scope, v, 1 << b)));
        }
        let scores = mask_scores(scope, scores, &masked, hidden, i, k0, a);
        let m_old = k::fget::expand(scope, self.state, 0);
        let m_new = scores.iter().fold(m_old, |m, s| k::fmax::expand(scope, m, *s));
        let corr = k::exp_diff::expand(scope, m_old, m_new);
        let mut l = k::fmul::expand(scope, k::fget::expand(scope, self.state, 1), corr);
        let mut acc = *self.acc;
        rescale::expand::<N>(scope, &mut acc, corr, self.eg);
        for (jj, score) in scores.into_iter().enumerate() {
            let p = k::exp_diff::expand(scope, score, m_new);
            l = k::fadd::expand(scope, l, p);
            let row = key_address(scope, a, k0, v_base, jj, masked.is_some(), a.views[2]);
            let at = k::add_index::expand(scope, row, v_part);
            axpy_slice::expand::<N>(scope, &mut acc, self.v, at, p, self.eg);
        }
        let mut state = *self.state;
        k::fset::expand(scope, &mut state, 0, m_new);
        k::fset::expand(scope, &mut state, 1, l);
    }
}
