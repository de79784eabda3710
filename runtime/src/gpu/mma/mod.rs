//! Matrix-instruction kernels: the GEMM and attention for half precision on
//! devices with cooperative matrices (CUDA tensor cores through cubecl's
//! `cmma`, which cubecl-cpp emits as `nvcuda::wmma` fragments).
//!
//! Both kernels stage their operands in one shared array of the storage
//! type and multiply 16×16×16 fragments, one plane (warp) of 32 units per
//! 16-row strip; accumulators are f32. The fragment operations come in two
//! implementations with the same meaning ([`Frags`]): `Hardware` emits
//! `cmma` (whose register layout is the device's), `Software` computes each
//! unit's share of the product from shared memory with plain loads. The
//! software form runs anywhere, so lavapipe tests every index, copy, mask and
//! epilogue of these kernels; only the three `cmma` calls are the device's.
//!
//! Since a hardware fragment's layout is opaque, every result leaves through
//! shared memory: a plane stores its accumulator to an f32 scratch tile of
//! 16×16 and each unit reads back row `lane / 2`, columns `8·(lane % 2)..+8`.

mod flash;
mod flash_grad;
mod trips;

pub use flash::build_attention;
pub use flash_grad::{build_grad_kv, build_grad_q};
pub use trips::software_trips;

use super::attention as att;
use super::gemm;
use super::kernels::{self as k, Operand, Stored};
use super::kit::launch::{Inputs, Shape, ROW_I, ROW_OUT, ROW_Q};
use super::kit::source::{InPages, InPagesExpand, InView, InViewExpand, KeySource, KeySourceExpand};
use super::kit::walk::{self as tiles, SET_K, SET_V};
use super::kit::{mask, norm, pair, source};
use crate::gpu::kernels::Vecs;
use attnc_compiler::plan::{Dtype, RowView, ATTN_ROWS, GEMM_ROWS, GEMM_UNITS};
use cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use cubecl::prelude::*;

/// Fragment side.
pub const F: usize = 16;
/// Units of a plane (a CUDA warp).
pub const WARP: usize = 32;

type HwAcc = <cmma::Matrix<f32> as CubeType>::ExpandType;

/// The fragment kernels' settings (attention's, forward and backward): hardware or software fragments, the
/// storage type and the shared memory it has.
#[derive(Clone, Copy)]
pub struct FragDevice {
    pub hardware: bool,
    pub dtype: Dtype,
    pub shared_limit: usize,
}

/// A fragment attention kernel's head widths, in vectors: padded with zeros
/// to whole fragments (`dpl`, `epl`; `dp`, `ep` in floats) and as they are
/// (`dl`, `el`).
pub(crate) struct FragWidths {
    pub dp: usize,
    pub ep: usize,
    pub dpl: usize,
    pub epl: usize,
    pub dl: usize,
    pub el: usize,
}

impl FragWidths {
    /// The widths of launch `a`, whose units own one row each and whose
    /// other side comes in tiles of `tile` rows (whole fragments).
    pub(crate) fn of(a: &Shape, tile: usize) -> FragWidths {
        assert_eq!(a.tiles.unit_rows, 1, "fragment kernels own one row per unit");
        assert!(tile.is_multiple_of(F), "tiles of whole fragments");
        let (dp, ep, lanes) = (a.g.d.next_multiple_of(F), a.g.e.next_multiple_of(F), a.lanes);
        FragWidths { dp, ep, dpl: dp / lanes, epl: ep / lanes, dl: a.g.d / lanes, el: a.g.e / lanes }
    }
}

impl FragDevice {
    /// Whether operands are rounded on their way to shared memory: TF32 on
    /// tensor cores, which would otherwise drop an f32's low bits (software
    /// multiplies the f32 values).
    pub fn rounds(&self) -> bool {
        self.hardware && self.dtype == Dtype::Tf32
    }
}

/// An f32 accumulator fragment.
pub enum Acc {
    Hw(HwAcc),
    /// The unit's 8 values: row `lane / 2`, columns `8·(lane % 2)..+8`.
    Sw(NativeExpand<Array<f32>>),
}

/// The fragment operations of one kernel.
pub struct Frags {
    pub hardware: bool,
    lane: NativeExpand<usize>,
    /// This unit's plane.
    pub warp: NativeExpand<usize>,
    /// Fragment depth: 16, or 8 for TF32.
    k: usize,
}

/// The depth of `dtype`'s fragments: 16×16×16 for 16-bit operands, 16×16×8 for TF32.
pub fn fragment_depth(dtype: Dtype) -> usize {
    if dtype == Dtype::Tf32 {
        8
    } else {
        F
    }
}

#[cube]
fn hw_zero(#[comptime] k: usize) -> cmma::Matrix<f32> {
    cmma::Matrix::<f32>::from_value(
        MatrixIdent::Accumulator,
        16usize,
        16usize,
        k,
        MatrixLayout::Undefined,
        f32::new(0.0),
    )
}

/// How a fragment product reads its operands from shared memory: A
/// row-major with row stride `a_stride` elements, B row-major with row
/// stride `b_stride`, or column-major (B's column `c` at `c · b_stride`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Strides {
    a_stride: usize,
    b_stride: usize,
    b_col_major: bool,
}

/// `acc += A · B` for one fragment of depth `k`: A at vector `a_at`, B at
/// vector `b_at` (laid out as `o` says), both read as `Operand`s.
#[cube]
fn hw_mma<N: Size>(
    acc: &cmma::Matrix<f32>,
    x: &[Vector<Stored, N>],
    a_at: usize,
    b_at: usize,
    #[comptime] o: Strides,
    #[comptime] k: usize,
) {
    let (a_stride, b_stride, b_col_major) = comptime![(o.a_stride as u32, o.b_stride as u32, o.b_col_major)];
    let b_layout = comptime![if b_col_major { MatrixLayout::ColMajor } else { MatrixLayout::RowMajor }];
    let mut a =
        unsafe { cmma::Matrix::<Operand>::uninitialized(MatrixIdent::A, 16usize, 16usize, k, MatrixLayout::RowMajor) };
    let mut b = unsafe { cmma::Matrix::<Operand>::uninitialized(MatrixIdent::B, 16usize, 16usize, k, b_layout) };
    cmma::load(&mut a, &x[a_at..], a_stride);
    cmma::load(&mut b, &x[b_at..], b_stride);
    cmma::execute(&a, &b, acc, acc);
}

#[cube]
fn hw_store(acc: &cmma::Matrix<f32>, out: &mut [f32], at: usize, #[comptime] stride: u32) {
    cmma::store(&mut out[at..], acc, stride, MatrixLayout::RowMajor);
}

#[cube]
fn sw_zero() -> Array<f32> {
    let mut a = Array::<f32>::new(8usize);
    #[unroll]
    for c in 0..8usize {
        a[c] = f32::new(0.0);
    }
    a
}

/// Element `i` of a shared array of vectors, in f32.
#[cube]
fn element<N: Size>(x: &[Vector<Stored, N>], i: usize) -> f32 {
    if comptime![N::value() == 1] {
        f32::cast_from(x[i].extract(0usize))
    } else {
        f32::cast_from(x[i / N::value()].extract_dynamic(i % N::value()))
    }
}

/// As [`hw_mma`], the unit's 8 accumulators (products in f32: the operand
/// type's rounding, TF32's, is the device's).
#[cube]
fn sw_mma<N: Size>(
    acc: &mut Array<f32>,
    x: &[Vector<Stored, N>],
    a_at: usize,
    b_at: usize,
    lane: usize,
    #[comptime] o: Strides,
    #[comptime] k: usize,
) {
    let (a_stride, b_stride, b_col_major) = comptime![(o.a_stride, o.b_stride, o.b_col_major)];
    let r = lane / 2;
    let c0 = lane % 2 * 8;
    let a0 = a_at * N::value() + r * a_stride;
    let b0 = b_at * N::value();
    for kk in 0..k {
        let a = element::<N>(x, a0 + kk);
        #[unroll]
        for c in 0..8usize {
            let mut bi = b0 + kk * b_stride + c0 + c;
            if comptime![b_col_major] {
                bi = b0 + (c0 + c) * b_stride + kk;
            }
            acc[c] += a * element::<N>(x, bi);
        }
    }
}

#[cube]
fn sw_store(acc: &Array<f32>, out: &mut [f32], at: usize, lane: usize, #[comptime] stride: usize) {
    let base = at + lane / 2 * stride + lane % 2 * 8;
    #[unroll]
    for c in 0..8usize {
        out[base + c] = acc[c];
    }
}

/// This unit's plane and lane.
#[cube]
fn warp_of() -> usize {
    UNIT_POS as usize / 32
}

#[cube]
fn lane_of() -> usize {
    UNIT_POS as usize % 32
}

impl Frags {
    pub fn new(scope: &Scope, hardware: bool, dtype: Dtype) -> Frags {
        let lane = lane_of::expand(scope);
        Frags { hardware, lane, warp: warp_of::expand(scope), k: fragment_depth(dtype) }
    }

    pub fn zero(&self, scope: &Scope) -> Acc {
        if self.hardware {
            Acc::Hw(hw_zero::expand(scope, self.k))
        } else {
            Acc::Sw(sw_zero::expand(scope))
        }
    }

    /// `acc += A · B` for 16 of the inner dimension from the shared array
    /// `x` (see [`hw_mma`]), in fragments of depth `k`: A at vector `a_at`
    /// with row stride `a_stride` elements, B at `b_at`, row-major with row
    /// stride `b_stride` or column-major (`b_col_major`).
    pub fn mma<N: Size>(
        &self,
        scope: &Scope,
        acc: &mut Acc,
        x: &Vecs<N>,
        (a_at, a_stride): (NativeExpand<usize>, usize),
        (b_at, b_stride, b_col_major): (NativeExpand<usize>, usize, bool),
    ) {
        let o = Strides { a_stride, b_stride, b_col_major };
        let (k, lanes) = (self.k, N::value());
        for step in 0..F / k {
            // Vectors from the first fragment's start to this one's along the inner dimension.
            let (a_step, b_step) =
                (step * k / lanes, if b_col_major { step * k / lanes } else { step * k * b_stride / lanes });
            let a_at = k::add_index::expand(scope, a_at.clone(), k::const_index::expand(scope, a_step));
            let b_at = k::add_index::expand(scope, b_at.clone(), k::const_index::expand(scope, b_step));
            match acc {
                Acc::Hw(m) => hw_mma::expand::<N>(scope, m, x, a_at, b_at, o, k),
                Acc::Sw(a) => sw_mma::expand::<N>(scope, a, x, a_at, b_at, self.lane.clone(), o, k),
            }
        }
    }

    /// Store `acc` as a row-major 16×16 tile at `at` of `out`, rows `stride` apart.
    pub fn store(
        &self,
        scope: &Scope,
        acc: &Acc,
        out: &mut NativeExpand<[f32]>,
        at: NativeExpand<usize>,
        stride: usize,
    ) {
        match acc {
            Acc::Hw(m) => hw_store::expand(scope, m, out, at, stride as u32),
            Acc::Sw(a) => sw_store::expand(scope, a, out, at, self.lane.clone(), stride),
        }
    }
}

/// Shared memory of `n` vectors, aligned for fragment loads.
#[cube]
fn shared_vectors<N: Size>(#[comptime] n: usize) -> Shared<[Vector<Stored, N>]> {
    Shared::<[Vector<Stored, N>]>::new_aligned_slice(n, 32usize)
}

#[cube]
fn shared_floats(#[comptime] n: usize) -> Shared<[f32]> {
    Shared::<[f32]>::new_aligned_slice(n, 32usize)
}

/// [`shared_vectors`] as the host-assembled kernels hold it.
fn vectors_in_shared<N: Size>(scope: &Scope, n: usize) -> Vecs<N> {
    (*shared_vectors::expand::<N>(scope, n)).clone_unchecked()
}

/// [`shared_floats`] as the host-assembled kernels hold it.
fn floats_in_shared(scope: &Scope, n: usize) -> NativeExpand<[f32]> {
    (*shared_floats::expand(scope, n)).clone_unchecked()
}

/// `x[at]` if `inside`, else zeros, in the storage type.
#[cube]
fn load_or_zero<N: Size>(x: &[Vector<Stored, N>], at: usize, inside: bool) -> Vector<Stored, N> {
    let mut v = Vector::<Stored, N>::cast_from(f32::new(0.0));
    if inside {
        v = x[at];
    }
    v
}

#[cube]
fn put<N: Size>(x: &mut [Vector<Stored, N>], at: usize, v: Vector<Stored, N>) {
    x[at] = v;
}

/// `v` rounded to the fragments' operand type (TF32: to nearest, as
/// `__float_to_tf32` rounds; tensor cores would otherwise drop the low bits).
#[cube]
fn to_operand<N: Size>(v: Vector<Stored, N>) -> Vector<Stored, N> {
    let mut out = v;
    #[unroll]
    for c in 0..N::value() {
        out.insert(c, Stored::cast_from(Operand::cast_from(v.extract(c))));
    }
    out
}

/// `v` on its way to a shared operand array: rounded to the operand type
/// where `round` (TF32 on tensor cores, [`FragDevice::rounds`]).
#[cube]
fn stage<N: Size>(v: Vector<Stored, N>, #[comptime] round: bool) -> Vector<Stored, N> {
    if comptime![round] {
        to_operand::<N>(v)
    } else {
        v
    }
}

/// `w · stride + c`: the start of plane `w`'s share, or a fragment's offset.
#[cube]
fn scaled_add(w: usize, #[comptime] stride: usize, #[comptime] c: usize) -> usize {
    w * stride + c
}

/// The vector of scratch row `lane / 2`, columns `8·(lane % 2) + v·N ..`, scaled.
#[cube]
fn scratch_vector<N: Size>(s: &[f32], at: usize, lane: usize, #[comptime] v: usize, scale: f32) -> Vector<f32, N> {
    let base = at + lane / 2 * 16 + lane % 2 * 8 + comptime![v * N::value()];
    let mut out = Vector::<f32, N>::empty();
    #[unroll]
    for c in 0..N::value() {
        out.insert(c, s[base + c] * scale);
    }
    out
}

/// Store `v` (with `add`, plus the addend's vector at the same place,
/// rounded once) at output row `row`, tile column `tc` (floats, of the
/// cube's `tile.cols` vectors), if both exist.
#[cube]
fn store_out<N: Size>(
    out: &mut [Vector<Stored, N>],
    addend: &[Vector<Stored, N>],
    v: Vector<f32, N>,
    row: usize,
    lane: usize,
    #[comptime] place: (usize, bool),
    #[comptime] tile: gemm::Tile,
) {
    let (tc, add) = comptime![place];
    let (rows, fold) = comptime![(tile.rows, tile.fold)];
    let (cw, f) = comptime![(tile.cols * N::value(), tile.fl * N::value())];
    let t = tc + lane % 2 * 8;
    let col = k::cube_x(fold) * cw + t;
    if row < rows && t < cw && col < f {
        let at = (row * f + col) / N::value();
        if comptime![add] {
            out[at] = Vector::<Stored, N>::cast_from(v + Vector::<f32, N>::cast_from(addend[at]));
        } else {
            out[at] = Vector::<Stored, N>::cast_from(v);
        }
    }
}

/// Output row `cube_y · 256 + warp · 128 + r · 16 + i` (`i` of the fragment's 16 rows).
#[cube]
fn gemm_row(warp: usize, i: usize, #[comptime] r: usize, #[comptime] fold: usize) -> usize {
    k::cube_y(fold) * comptime![GEMM_UNITS * GEMM_ROWS] + warp * comptime![8 * F] + comptime![r * F] + i
}

/// The f32 vector at `at` of a shared array of floats.
#[cube]
fn scratch_f32<N: Size>(s: &[f32], at: usize) -> Vector<f32, N> {
    let mut out = Vector::<f32, N>::empty();
    #[unroll]
    for c in 0..N::value() {
        out.insert(c, s[at + c]);
    }
    out
}

/// A unit's output row in a plane's strip of the mixing epilogue: the row,
/// where its `m` heads' channels lie in the scratch (`ce` channel vectors of
/// each head, head after head), and the parity of the targets (or kept
/// channels) it stores.
#[derive(CubeType)]
struct StripRow {
    row: usize,
    at: usize,
    half: usize,
}

/// The mixing epilogue for one output row `r`: for every target `t ≡ half
/// (mod 2)` of the `targets` = h·p, store `scale · Σ_m alpha[m, t] · y_m`
/// (see `gemm::epilogue`, the same sums).
#[cube]
fn mix_row<N: Size>(
    out: &mut [Vector<Stored, N>],
    scratch: &[f32],
    alpha: &[Stored],
    r: &StripRow,
    scale: f32,
    #[comptime] tile: gemm::Tile,
) {
    let (m, ce, targets) = comptime![(tile.m, tile.ce, tile.targets)];
    let (row, at, half) = (r.row, r.at, r.half);
    let start = gemm::mixed_row(row, tile);
    for t2 in 0..comptime![targets.div_ceil(2)] {
        let t = t2 * 2 + half;
        if t < targets {
            #[unroll]
            for ch in 0..ce {
                let mut v = k::vzero::<N>();
                #[unroll]
                for h in 0..m {
                    let y = scratch_f32::<N>(scratch, at + comptime![(h * ce + ch) * N::value()]);
                    v = k::axpy::<N>(v, k::read::<Stored>(alpha, h * targets + t), y);
                }
                gemm::store_mixed::<N>(out, row, start, t, k::vscale::<N>(v, scale), ch, tile);
            }
        }
    }
}

/// A kept product's row `r`: the channels of parity `half` stored to the
/// product `[rows, fl]` (`gemm::store_kept`'s places), if they exist.
#[cube]
fn keep_row<N: Size>(out: &mut [Vector<Stored, N>], scratch: &[f32], r: &StripRow, #[comptime] tile: gemm::Tile) {
    let (m, ce, dl, fl, rows, fold) = comptime![(tile.m, tile.ce, tile.dl, tile.fl, tile.rows, tile.fold)];
    let (row, at, half) = (r.row, r.at, r.half);
    #[unroll]
    for h in 0..m {
        #[unroll]
        for ch in 0..ce {
            let channel = k::cube_x(fold) * ce + ch;
            if comptime![ch % 2] == half && row < rows && channel < dl {
                let v = scratch_f32::<N>(scratch, at + comptime![(h * ce + ch) * N::value()]);
                out[row * fl + comptime![h * dl] + channel] = Vector::<Stored, N>::cast_from(v);
            }
        }
    }
}

/// The GEMM on matrix fragments, for a cube of `plan::GEMM_UNITS` (two
/// planes) over `GEMM_UNITS · GEMM_ROWS` = 256 rows and the scalar GEMM's
/// columns (so the plan's grid serves both): per stage of 16 of `k`, the
/// cube copies its `a` rows and `b` columns into shared memory (zero past
/// `k`; `b`'s columns padded to a multiple of 16), then each plane
/// multiplies its 128 rows. With a mixing epilogue the cube's columns are
/// `ce` channels of each of the `m` heads, as in the scalar GEMM; a plane
/// stores a strip of 16 rows by all of them to its scratch, and each unit
/// mixes one row for half of the targets. `hardware`: `cmma` fragments, else
/// [`Frags`]' software ones; `dtype`: the storage type.
pub fn build_gemm<N: Size>(
    scope: &Scope,
    x: gemm::Operands<N>,
    shape: &gemm::Shape,
    lanes: usize,
    (hardware, dtype): (bool, Dtype),
) {
    let gemm::Operands { a, b, side, out } = x;
    let (rows, kdim) = (shape.rows, shape.kdim);
    let tile = gemm::Tile::new(shape, lanes);
    let gemm::Tile { cols, .. } = tile;
    let kl = kdim / lanes;
    let cw = cols * lanes;
    let bw = cw.next_multiple_of(F);
    let cube_rows = GEMM_UNITS * GEMM_ROWS;
    let kv = F / lanes; // vectors of a stage's `k` per row of `a`
    let (a_len, b_len) = (cube_rows * kv, F * bw / lanes);
    let stages = kl.div_ceil(kv);
    let x = vectors_in_shared::<N>(scope, a_len + b_len);
    // A plane's strip of 16 rows: one fragment, or every column with a mixing epilogue.
    let strip = if shape.mix.is_some() { bw } else { F };
    let mut scratch = floats_in_shared(scope, GEMM_UNITS / WARP * F * strip);
    let frags = Frags::new(scope, hardware, dtype);
    let (warp, lane) = (warp_of::expand(scope), lane_of::expand(scope));
    // Fixed parts of the cooperative copies: rows of `a`, columns of `b`.
    let a_entry = |scope: &Scope, idx: NativeExpand<usize>| {
        let local = k::idx_div::expand(scope, idx.clone(), kv);
        let row = gemm::cube_row::expand(scope, local, rows, shape.fold);
        (idx.clone(), k::view(scope, row, &shape.a_rows, rows), k::idx_mod::expand(scope, idx, kv))
    };
    // Scalar operands (an `a` read transposed) copy 64 values of `a` a unit
    // per stage: unrolled and hoisted, they took every register beside the
    // 128 accumulators (TF32 spilled, by ptxas), so past 16 they are copied
    // in a loop of 16 at a time, their addresses computed there.
    let copies = a_len / GEMM_UNITS;
    let chunk = copies.min(16);
    let a_copy: Vec<_> = if chunk == copies {
        (0..copies).map(|i| a_entry(scope, gemm::coop::expand(scope, i))).collect()
    } else {
        vec![]
    };
    let (b_copy, b_count) = gemm::b_items(scope, shape, tile, (F, bw / lanes), lanes);
    // TF32 operands are rounded on their way to shared memory (on the device; software fragments multiply in f32).
    let rounded = |scope: &Scope, v| stage::expand::<N>(scope, v, hardware && dtype == Dtype::Tf32);
    let mut accs: Vec<Acc> = (0..8 * bw / F).map(|_| frags.zero(scope)).collect();
    let range = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, stages));
    for_expand(scope, range, false, |scope, s| {
        let mut stage = x.clone_unchecked();
        let copy_a = |scope: &Scope, stage: &mut Vecs<N>, (idx, row_start, kq)| {
            let kvec = k::add_index::expand(scope, k::idx_mul::expand(scope, s.clone(), kv), kq);
            let inside = k::below::expand(scope, kvec.clone(), kl);
            let col = k::view(scope, kvec, &shape.a_cols, kl);
            let v = load_or_zero::expand::<N>(scope, a, k::add_index::expand(scope, row_start, col), inside);
            put::expand::<N>(scope, stage, idx, rounded(scope, v));
        };
        if chunk == copies {
            for e in &a_copy {
                copy_a(scope, &mut stage, e.clone());
            }
        } else {
            let range =
                RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, copies / chunk));
            for_expand(scope, range, false, |scope, c| {
                for i in 0..chunk {
                    let idx = gemm::coop_in::expand(scope, c.clone(), i, chunk);
                    copy_a(scope, &mut stage.clone_unchecked(), a_entry(scope, idx));
                }
            });
        }
        let load_b = |scope: &Scope, at, inside| load_or_zero::expand::<N>(scope, b, at, inside);
        for it in &b_copy {
            let vectors = gemm::b_item_vectors::<Stored, N>(scope, it, &s, shape, (F, bw / lanes), lanes, load_b);
            let exists = k::below::expand(scope, it.idx.clone(), b_count);
            if_expand(scope, exists, |scope| {
                for (at, v) in vectors {
                    let at = k::add_index::expand(scope, k::const_index::expand(scope, a_len), at);
                    put::expand::<N>(scope, &mut stage, at, rounded(scope, v));
                }
            });
        }
        k::barrier::expand(scope);
        for (i, acc) in accs.iter_mut().enumerate() {
            let (r, c) = (i / (bw / F), i % (bw / F));
            // Plane `warp`'s rows start at `warp · 128 · kv` vectors of `a`; B's fragment `c` after `a`.
            let a_at = scaled_add::expand(scope, warp.clone(), 8 * F * kv, r * F * kv);
            let b_at = k::const_index::expand(scope, a_len + c * F / lanes);
            frags.mma::<N>(scope, acc, &x, (a_at, F), (b_at, bw, false));
        }
        k::barrier::expand(scope);
    });
    let scale = NativeExpand::from_lit(scope, shape.scale.unwrap_or(1.0));
    let at = scaled_add::expand(scope, warp.clone(), F * strip, 0);
    if let Some((mix, alpha)) = &shape.mix {
        // Row `lane % 16` of the strip, targets of parity `lane / 16`.
        let (i, half) = (k::idx_mod::expand(scope, lane.clone(), F), k::idx_div::expand(scope, lane.clone(), F));
        let row_at = k::add_index::expand(scope, at.clone(), k::idx_mul::expand(scope, i.clone(), bw));
        for r in 0..8 {
            for c in 0..bw / F {
                let tile_at = k::add_index::expand(scope, at.clone(), k::const_index::expand(scope, c * F));
                frags.store(scope, &accs[r * (bw / F) + c], &mut scratch, tile_at, bw);
            }
            k::barrier::expand(scope);
            let row = gemm_row::expand(scope, warp.clone(), i.clone(), r, shape.fold);
            let r = StripRowExpand { row, at: row_at.clone(), half: half.clone() };
            mix_row::expand::<N>(scope, out, &scratch, alpha, &r, scale.clone(), tile);
            if mix.keep {
                let mut kept = side.expect("a kept product's buffer").clone_unchecked();
                keep_row::expand::<N>(scope, &mut kept, &scratch, &r, tile);
            }
            k::barrier::expand(scope);
        }
        return;
    }
    let i = k::idx_div::expand(scope, lane.clone(), 2);
    // Without an addend, `store_out` reads none: the output stands in.
    let (addend, y) = match side {
        Some(y) => (true, y.clone_unchecked()),
        None => (false, (*out).clone_unchecked()),
    };
    for (n, acc) in accs.iter().enumerate() {
        let (r, c) = (n / (bw / F), n % (bw / F));
        frags.store(scope, acc, &mut scratch, at.clone(), F);
        k::barrier::expand(scope);
        let row = gemm_row::expand(scope, warp.clone(), i.clone(), r, shape.fold);
        for v in 0..8 / lanes {
            let (row, lane, tc) = (row.clone(), lane.clone(), c * F + v * lanes);
            let val = scratch_vector::expand::<N>(scope, &scratch, at.clone(), lane.clone(), v, scale.clone());
            store_out::expand::<N>(scope, out, &y, val, row, lane, (tc, addend), tile);
        }
        k::barrier::expand(scope);
    }
}
