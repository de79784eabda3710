//! The normaliser: how a row's scores become weights. Today it is the
//! softmax, computed online (FlashAttention): the running state `[max, sum]`
//! and its update per score or per tile, the finish (`1 / sum`), the
//! log-sum-exp the forward stores for the backward and the backward reads
//! back (probabilities recomputed as `exp(score − lse)`), the split-KV
//! combine rule, and every sentinel for a row that saw no key. Every
//! attention kernel normalises through this module; a new normaliser lands
//! here and only here (docs/extending.md).

use super::launch::{Split, ROW_I, ROW_OUT};
use super::mask::{MASKED, MASKED_BELOW};
use crate::gpu::kernels::{self as k, Stored};
use cubecl::prelude::*;

/// The running max before any key.
pub const M_INIT: f32 = -3.0e38;
/// The log-sum-exp a row that sees no key stores (WGSL has no infinite
/// literals; in f16 it rounds to −∞). Any value below [`NO_KEYS_BELOW`]
/// marks such a row, whose gradients are 0 (its output is the constant 0).
pub const NO_KEYS: f32 = MASKED;
pub const NO_KEYS_BELOW: f32 = MASKED_BELOW;
/// What the backward makes of the log-sum-exp of a row that saw no key
/// ([`read_lse`]): every `exp(score − lse)` is then 0.
pub const DEAD_ROW: f32 = 3.0e38;
/// The log-sum-exp `hi` part of a split-KV chunk whose row sees no key
/// (finite in f16 and bf16; a real one is far above [`NO_KEYS_ABOVE`]).
const NO_KEYS_PARTIAL: f32 = -60000.0;
const NO_KEYS_ABOVE: f32 = -59000.0;

/// `[running max, running sum]` before any key.
#[cube]
pub fn state() -> Array<f32> {
    let mut a = Array::<f32>::new(2usize);
    a[0] = f32::new(M_INIT);
    a[1] = f32::new(0.0);
    a
}

/// A running max and sum.
#[derive(CubeType)]
pub struct Online {
    pub m: f32,
    pub l: f32,
}

/// The state `(m, l)` after one more score `x` (one exponential).
#[cube]
pub fn push(m: f32, l: f32, x: f32) -> Online {
    let gap = x - m;
    let w = (f32::new(0.0) - gap.abs()).exp();
    let mut m2 = m;
    let mut l2 = l;
    if gap > f32::new(0.0) {
        l2 = l * w + f32::new(1.0);
        m2 = x;
    } else {
        l2 += w;
    }
    Online { m: m2, l: l2 }
}

/// What the sum and the accumulator are multiplied by when the running
/// max goes from `m_old` to `m_new`.
#[cube]
pub fn rescale(m_old: f32, m_new: f32) -> f32 {
    (m_old - m_new).exp()
}

/// The unnormalised weight of score `x` under running max `m`.
#[cube]
pub fn weight(x: f32, m: f32) -> f32 {
    (x - m).exp()
}

/// The probability of score `x` of a row whose log-sum-exp is `lse`
/// (from [`read_lse`]): the backward's recomputed softmax.
#[cube]
pub fn prob(x: f32, lse: f32) -> f32 {
    (x - lse).exp()
}

/// One tile of scores against a state (host-assembled kernels): the new
/// max, the rescale factor of the accumulator, and the sum, to which each
/// [`Step::weight`] adds; [`Step::close`] writes the state back.
pub struct Step {
    pub m: NativeExpand<f32>,
    pub corr: NativeExpand<f32>,
    l: NativeExpand<f32>,
}

impl Step {
    /// The step of `state` over `scores`.
    pub fn open(scope: &Scope, state: &NativeExpand<Array<f32>>, scores: &[NativeExpand<f32>]) -> Step {
        let m_old = k::fget::expand(scope, state, 0);
        let m = scores.iter().fold(m_old, |m, s| k::fmax::expand(scope, m, *s));
        let corr = rescale::expand(scope, m_old, m);
        let l = k::fmul::expand(scope, k::fget::expand(scope, state, 1), corr);
        Step { m, corr, l }
    }

    /// The weight of `score`, added to the sum.
    pub fn weight(&mut self, scope: &Scope, score: NativeExpand<f32>) -> NativeExpand<f32> {
        let p = weight::expand(scope, score, self.m);
        self.l = k::fadd::expand(scope, self.l, p);
        p
    }

    /// Writes the new max and sum into `state`.
    pub fn close(&self, scope: &Scope, state: &NativeExpand<Array<f32>>) {
        let mut state = *state;
        k::fset::expand(scope, &mut state, 0, self.m);
        k::fset::expand(scope, &mut state, 1, self.l);
    }
}

/// [`Step`] in a `#[cube]` kernel: the new max is `m`, the tile's weights
/// summed `sum`; returns the rescale factor of the accumulator.
#[cube]
pub fn advance(state: &mut Array<f32>, m: f32, sum: f32) -> f32 {
    let alpha = rescale(state[0], m);
    state[0] = m;
    state[1] = state[1] * alpha + sum;
    alpha
}

/// `1 / l` of a state `[m, l]`, or 0 for a row that saw no key (`l = 0`).
#[cube]
pub fn inverse_sum(state: &Array<f32>) -> f32 {
    let l = state[1];
    let mut inv = f32::new(0.0);
    if l != f32::new(0.0) {
        inv = f32::new(1.0) / l;
    }
    inv
}

/// A row's log-sum-exp from its running max `m` and sum `l`: `m + ln(l)`,
/// or `empty` for a row that saw no key.
#[cube]
pub fn log_sum_exp(m: f32, l: f32, #[comptime] empty: f32) -> f32 {
    let mut v = f32::new(empty);
    if l > f32::new(0.0) {
        v = m + l.ln();
    }
    v
}

/// [`log_sum_exp`] of a finished row, [`NO_KEYS`] for one that saw no key.
#[cube]
pub fn finish_lse(m: f32, l: f32) -> f32 {
    log_sum_exp(m, l, NO_KEYS)
}

/// Stores the log-sum-exp of query row `rows[ROW_I]` of the cube's
/// `[b·H + h]` at `[b·H + h, i]` (row-major `[B, H, S]`), for rows inside
/// the `s` queries.
#[cube]
pub fn store_lse(
    out: &mut [Stored],
    state: &Array<f32>,
    rows: &Array<usize>,
    #[comptime] s: usize,
    #[comptime] fold: usize,
) {
    let i = rows[ROW_I];
    if i < s {
        let v = finish_lse(state[0], state[1]);
        out[k::cube_y(fold) * comptime![s] + i] = Stored::cast_from(v);
    }
}

/// Whether a stored log-sum-exp `l` is a row's that saw a key.
#[cube]
pub fn live(l: f32) -> bool {
    l > f32::new(NO_KEYS_BELOW)
}

/// The stored log-sum-exp at `lse[at]` for [`prob`]: [`DEAD_ROW`] where
/// the row saw no key.
#[cube]
pub fn read_lse(lse: &[Stored], at: usize) -> f32 {
    let l = f32::cast_from(lse[at]);
    select(live(l), l, f32::new(DEAD_ROW))
}

/// The log-sum-exp of the unit's query row (`rows`: its `ROW_*` slots,
/// clamped to the last of `s`) of the cube's `[b·H + h]`, [`DEAD_ROW`]
/// where the row saw no key.
#[cube]
pub fn row_lse(lse: &[Stored], rows: &Array<usize>, #[comptime] s: usize, #[comptime] fold: usize) -> f32 {
    let bh = k::cube_y(fold);
    let i = min(rows[ROW_I], comptime![s - 1]);
    read_lse(lse, bh * comptime![s] + i)
}

/// The log-sum-exp of query row `i` of head `(b, hi)` of `h`, [`DEAD_ROW`]
/// past the last of `s` rows or where the row saw no key.
#[cube]
pub fn query_lse(lse: &[Stored], b: usize, hi: usize, i: usize, #[comptime] h: usize, #[comptime] s: usize) -> f32 {
    let mut l = f32::new(DEAD_ROW);
    if i < s {
        l = read_lse(lse, (b * comptime![h] + hi) * comptime![s] + i);
    }
    l
}

/// A split-KV partial row (`plan::KvSplit`) of `el` vectors, of `s` rows (`shape`): `x = acc / l` as `hi` (stored)
/// and `lo = x − hi` at `lo` vectors on, and the row's log-sum-exp likewise
/// at `rows[base] + lse` (`NO_KEYS_PARTIAL` for a row that saw no key).
#[cube]
pub fn store_partial<N: Size>(
    out: &mut [Vector<Stored, N>],
    acc: &Array<Vector<f32, N>>,
    state: &Array<f32>,
    rows: &Array<usize>,
    #[comptime] base: usize,
    #[comptime] shape: (usize, usize),
    #[comptime] split: Split,
) {
    let (s, el) = comptime![shape];
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

/// The sizes of a split-KV combine: `splits` chunks of `rows` partial rows
/// of `row` floats, `e` output floats a row, `lanes` floats a vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Chunks {
    pub splits: usize,
    pub rows: usize,
    pub e: usize,
    pub row: usize,
    pub lanes: usize,
}

/// Merges the partial rows of element `i` ([`Chunks`]) by their
/// log-sum-exp into `out[at]`; 0 where no chunk saw a key.
#[cube]
pub fn combine(p: &[Stored], out: &mut [Stored], i: usize, at: usize, #[comptime] c: Chunks) {
    let (splits, rows, e, row, lanes) = comptime![(c.splits, c.rows, c.e, c.row, c.lanes)];
    let (ch, r) = (i % e, i / e);
    let mut m = f32::new(M_INIT);
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
            num += w * (f32::cast_from(p[at0 + ch]) + f32::cast_from(p[at0 + e + ch]));
            den += w;
        }
    }
    let mut v = f32::new(0.0);
    if den > f32::new(0.0) {
        v = num / den;
    }
    out[at] = Stored::cast_from(v);
}
