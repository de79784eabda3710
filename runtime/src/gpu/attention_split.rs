//! Attention tiled within a GPU's register file (`plan::choose_path`):
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
//! kernel's (`kit::walk::setup`), so what a mask means is written once.

use super::attention::{load_query, store_row};
use super::kernels::{self as k, Stored};
use super::kit::launch::{Dims, Inputs, Shape, ROW_I, ROW_OUT, ROW_Q};
use super::kit::norm::{self, store_lse, store_partial, Step};
use super::kit::pair::mask_scores;
use super::kit::source::{key_address, view_row};
use super::kit::walk::{query_tile, setup, KeyWalk, SET_K, SET_V};
use crate::gpu::kernels::Vecs;
use attnc_compiler::plan::RowView;
use cubecl::prelude::*;

/// This unit's query row (`ROW_*` slots: the addresses of its slices of
/// the query and output rows, `dg` and `eg` vectors a lane) and its slice.
#[cube]
fn lane_slots(
    #[comptime] dims: Dims,
    #[comptime] bq: usize,
    #[comptime] dg: usize,
    #[comptime] eg: usize,
    #[comptime] views: [RowView; 4],
    #[comptime] split_stride: usize,
) -> Array<usize> {
    // A fifth slot (the output row's start) where a split's log-sum-exp needs it.
    let mut a = Array::<usize>::new(comptime![if split_stride > 0 { 5usize } else { 4usize }]);
    let (h, g) = comptime![(dims.h, dims.lanes)];
    let bh = k::cube_y(comptime![dims.fold]);
    let unit = UNIT_POS as usize;
    let i = query_tile(dims, bq) * bq + unit / g;
    let row = min(i, comptime![dims.s - 1]);
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
pub fn build<N: Size>(scope: &Scope, x: &Inputs<N>, out: &mut Vecs<N>, scale: NativeExpand<f32>, a: &Shape) {
    let (q, kb, v, lanes) = (x.q, x.k, x.v, a.lanes);
    let g = a.tiles.lanes;
    let (dg, eg) = (a.g.d / lanes / g, a.g.e / lanes / g);
    let (bk, bq) = (a.tiles.key_tile, a.tiles.cube_rows());
    let (split_tiles, split_stride) = a.kv.map_or((0, 0), |kv| (kv.tiles, kv.stride));
    let set = setup::expand(scope, a.g, bq, bk, a.views, split_tiles);
    let rows = lane_slots::expand(scope, a.g, bq, dg, eg, a.views, split_stride);
    let part = k::uget::expand(scope, &rows, PART);
    let qr = load_query::expand::<N>(scope, q, k::uget::expand(scope, &rows, ROW_Q), scale, dg);
    let acc = k::vzeros::expand::<N>(scope, eg);
    let state = norm::start(scope, a);
    let body = Body { a, set: &set, rows: &rows, part, qr: &qr, acc: &acc, state: &state, kb, v, g, dg, eg, bk };
    KeyWalk::new(scope, &set, a, bk).walk(scope, |scope, (kt, masked, hidden)| {
        body.tile(scope, k::mul_const::expand(scope, kt, bk), masked, hidden)
    });
    match a.kv {
        Some(kv) => store_partial::expand::<N>(scope, out, &acc, &state, &rows, OUT_ROW, (a.g.s, eg), (kv, a.g.norm)),
        None => store_row::expand::<N>(scope, out, &acc, &state, &rows, a.g.s, eg, a.g.norm),
    }
    if let Some(lse) = &a.lse {
        // Every lane of a row holds its whole state: they write the same value.
        store_lse::expand(scope, &mut lse.clone_unchecked(), &state, &rows, a.g.s, a.g.fold, a.g.norm);
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
    kb: &'a Vecs<N>,
    v: &'a Vecs<N>,
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
        let mut step = Step::open(scope, a.g.norm, self.state, &scores);
        let mut acc = *self.acc;
        rescale::expand::<N>(scope, &mut acc, step.corr, self.eg);
        for (jj, score) in scores.into_iter().enumerate() {
            let p = step.weight(scope, score);
            let row = key_address(scope, a, k0, v_base, jj, masked.is_some(), a.views[2]);
            let at = k::add_index::expand(scope, row, v_part);
            axpy_slice::expand::<N>(scope, &mut acc, self.v, at, p, self.eg);
        }
        step.close(scope, self.state);
    }
}
