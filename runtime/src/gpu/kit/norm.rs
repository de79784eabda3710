//! The normaliser: how a row's scores become weights ([`Norm`], the
//! spec's `weights =` and `sink =`; docs/semantics.md §9). The softmax is
//! computed online (FlashAttention): the running state `[max, sum]` and its
//! update per score or per tile, the finish (`1 / sum`, the sink joining the
//! denominator), the row statistic the forward stores for the backward and
//! the backward reads back (the log-sum-exp: probabilities recomputed as
//! `exp(score − lse)`), each weighting's `dS`, the split-KV combine rule,
//! and every sentinel for a row that saw no key. Every attention kernel
//! normalises through this module; a new normaliser lands here and only
//! here (docs/extending.md).

use super::launch::{Shape, Split, ROW_I, ROW_OUT};
use super::mask::{MASKED, MASKED_BELOW};
use super::source::view_row;
pub use super::weights::Norm;
use crate::gpu::kernels::{self as k, Stored};
use attnc_compiler::plan::RowView;
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

/// A row's state before any key for launch `a`: [`state`], and for
/// [`Norm::Sink`] the sink logit of the cube's query head in slot 2.
pub fn start(scope: &Scope, a: &Shape) -> NativeExpand<Array<f32>> {
    match a.g.norm {
        Norm::Sink => {
            let (_, h) = a.cube_head(scope);
            let t = a.fns.as_ref().and_then(|f| f.sink_logit(scope, h)).expect("a sink is a capture of the functions");
            sink_state::expand(scope, t)
        }
        _ => state::expand(scope),
    }
}

/// [`state`] with the sink logit `t` in slot 2.
#[cube]
fn sink_state(t: f32) -> Array<f32> {
    let mut a = Array::<f32>::new(3usize);
    a[0] = f32::new(M_INIT);
    a[1] = f32::new(0.0);
    a[2] = t;
    a
}

/// A running max and sum.
#[derive(CubeType)]
pub struct Online {
    pub m: f32,
    pub l: f32,
}

/// The state `(m, l)` after one more score `x` (a softmax: one
/// exponential; hard: the ties of a new max restart at 1; no sum: the max
/// alone says whether the row saw a key).
#[cube]
pub fn push(m: f32, l: f32, x: f32, #[comptime] norm: Norm) -> Online {
    if comptime![norm == Norm::Hard] {
        push_hard(m, l, x)
    } else if comptime![norm.sums()] {
        push_exp(m, l, x)
    } else {
        Online { m: max(m, x), l }
    }
}

#[cube]
fn push_exp(m: f32, l: f32, x: f32) -> Online {
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

#[cube]
fn push_hard(m: f32, l: f32, x: f32) -> Online {
    let mut m2 = m;
    let mut l2 = l;
    if x > m {
        l2 = f32::new(1.0);
        m2 = x;
    } else if x == m {
        l2 += f32::new(1.0);
    } else if x.is_nan() {
        // A NaN score makes the row NaN, as in the interpreter.
        l2 = x;
    }
    Online { m: m2, l: l2 }
}

/// What the sum and the accumulator are multiplied by when the running
/// max goes from `m_old` to `m_new`.
#[cube]
pub fn rescale(m_old: f32, m_new: f32, #[comptime] norm: Norm) -> f32 {
    if comptime![norm == Norm::Hard] {
        select(m_new > m_old, f32::new(0.0), f32::new(1.0))
    } else if comptime![norm.sums()] {
        (m_old - m_new).exp()
    } else {
        f32::new(1.0)
    }
}

/// The unnormalised weight of score `x` under running max `m`.
#[cube]
pub fn weight(x: f32, m: f32, #[comptime] norm: Norm) -> f32 {
    if comptime![norm == Norm::Sigmoid] {
        sigmoid(x)
    } else if comptime![norm == Norm::Linear] {
        // NaN compares false: it stays, and makes the row NaN.
        select(x < f32::new(MASKED_BELOW), f32::new(0.0), x)
    } else if comptime![norm == Norm::Hard] {
        select(x == m, f32::new(1.0), select(x.is_nan(), x, f32::new(0.0)))
    } else {
        (x - m).exp()
    }
}

/// `1 / (1 + e^−x)`, as `r²` with `r = 1 / √(1 + e^−x)`: 0 for a masked
/// score. No division: CUDA's IEEE `/` is a subroutine call per weight,
/// and its `tanh` branches; either made fragment kernels spill.
#[cube]
fn sigmoid(x: f32) -> f32 {
    let r = (f32::new(1.0) + (f32::new(0.0) - x).exp()).inverse_sqrt();
    r * r
}

/// The backward's weight of score `x` in a row whose statistic is `lse`
/// (from [`read_lse`]): a softmax's `exp(score − lse)`; 0 in a row that saw
/// no key or that the kernel walks past its queries ([`DEAD_ROW`]). Hard
/// attention's gradient is not computed by the kernels
/// (`KernelSpec::kernel_gap`).
#[cube]
pub fn prob(x: f32, lse: f32, #[comptime] norm: Norm) -> f32 {
    if comptime![norm.sums()] {
        (x - lse).exp()
    } else {
        select(lse < f32::new(DEAD_ROW), weight(x, lse, norm), f32::new(0.0))
    }
}

/// [`prob`] in a dQ kernel's own query row, which is stored only where it
/// is one of the queries: sigmoid and linear weights need no row statistic
/// there (a hidden key's score already weighs 0), which keeps the f16 dQ
/// on fragments within its registers on sm_90.
#[cube]
pub fn own_row_prob(x: f32, lse: f32, #[comptime] norm: Norm) -> f32 {
    if comptime![norm == Norm::Sigmoid || norm == Norm::Linear] {
        weight(x, lse, norm)
    } else {
        prob(x, lse, norm)
    }
}

/// `dL/d(score)` of a pair of weight `p` (from [`prob`]), score `x` and row
/// statistic `lse`: a softmax's `p (dp − D)`, a sigmoid's `p (1 − p) dp`,
/// linear attention's `dp` where the pair is seen.
#[cube]
pub fn grad_weight(x: f32, lse: f32, p: f32, dp: f32, delta: f32, #[comptime] norm: Norm) -> f32 {
    if comptime![norm == Norm::Sigmoid] {
        p * (f32::new(1.0) - p) * dp
    } else if comptime![norm == Norm::Linear] {
        select(lse < f32::new(DEAD_ROW) && x > f32::new(MASKED_BELOW), dp, f32::new(0.0))
    } else if comptime![norm == Norm::Hard] {
        f32::new(0.0)
    } else {
        p * (dp - delta)
    }
}

/// One tile of scores against a state (host-assembled kernels): the new
/// max, the rescale factor of the accumulator, and the sum, to which each
/// [`Step::weight`] adds; [`Step::close`] writes the state back.
pub struct Step {
    pub m: NativeExpand<f32>,
    pub corr: NativeExpand<f32>,
    l: NativeExpand<f32>,
    norm: Norm,
}

impl Step {
    /// The step of `state` over `scores`.
    pub fn open(scope: &Scope, norm: Norm, state: &NativeExpand<Array<f32>>, scores: &[NativeExpand<f32>]) -> Step {
        let m_old = k::fget::expand(scope, state, 0);
        let m = scores.iter().fold(m_old, |m, s| k::fmax::expand(scope, m, *s));
        let corr = rescale::expand(scope, m_old, m, norm);
        let l = k::fget::expand(scope, state, 1);
        let l = if norm.sums() { k::fmul::expand(scope, l, corr) } else { l };
        Step { m, corr, l, norm }
    }

    /// The weight of `score`, added to the sum.
    pub fn weight(&mut self, scope: &Scope, score: NativeExpand<f32>) -> NativeExpand<f32> {
        let p = weight::expand(scope, score, self.m, self.norm);
        if self.norm.sums() {
            self.l = k::fadd::expand(scope, self.l, p);
        }
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
pub fn advance(state: &mut Array<f32>, m: f32, sum: f32, #[comptime] norm: Norm) -> f32 {
    let alpha = rescale(state[0], m, norm);
    state[0] = m;
    if comptime![norm.sums()] {
        state[1] = state[1] * alpha + sum;
    }
    alpha
}

/// What a finished row's accumulator is multiplied by: `1 / sum`, with the
/// sink's term joining the sum, or 0 for a row that saw no key (`sum = 0`);
/// 1 for weights that are not normalised.
#[cube]
pub fn inverse_sum(state: &Array<f32>, #[comptime] norm: Norm) -> f32 {
    if comptime![norm == Norm::Sink] {
        inverse_with_sink(state)
    } else if comptime![norm.sums()] {
        inverse(state)
    } else {
        f32::new(1.0)
    }
}

#[cube]
fn inverse(state: &Array<f32>) -> f32 {
    let l = state[1];
    let mut inv = f32::new(0.0);
    if l != f32::new(0.0) {
        inv = f32::new(1.0) / l;
    }
    inv
}

/// Both terms against the larger of the max and the sink (slot 2).
#[cube]
fn inverse_with_sink(state: &Array<f32>) -> f32 {
    let l = state[1];
    let mut inv = f32::new(0.0);
    if l != f32::new(0.0) {
        let (m, t) = (state[0], state[2]);
        let top = max(m, t);
        let a = (m - top).exp();
        inv = a / (l * a + (t - top).exp());
    }
    inv
}

/// A row's log-sum-exp from its running max `m` and sum `l`: `m + ln(l)`
/// (NaN where a NaN score made the sum NaN), or `empty` for a row that saw
/// no key.
#[cube]
pub fn log_sum_exp(m: f32, l: f32, #[comptime] empty: f32) -> f32 {
    let mut v = f32::new(empty);
    if l != f32::new(0.0) {
        v = m + l.ln();
    }
    v
}

/// [`log_sum_exp`] of a finished row, [`NO_KEYS`] for one that saw no key.
#[cube]
pub fn finish_lse(m: f32, l: f32) -> f32 {
    log_sum_exp(m, l, NO_KEYS)
}

/// The statistic the backward reads of a finished row (its state), or
/// [`NO_KEYS`] for a row that saw no key: a softmax's log-sum-exp, the
/// sink's term in it; hard attention's max. Always 0 for sigmoid and linear
/// weights: a pair's weight and its gradient follow from its own score (a
/// hidden key's is 0), so the backward needs nothing of the row, and the
/// forward keeps no running max (which made the bf16 fragment forward with
/// this store spill on sm_80).
#[cube]
pub fn row_stat(state: &Array<f32>, #[comptime] norm: Norm) -> f32 {
    if comptime![norm == Norm::Sink] {
        stat(state[0], state[1], state[2], norm)
    } else {
        stat(state[0], state[1], f32::new(0.0), norm)
    }
}

/// [`row_stat`] of a running max `m`, sum `l` and sink logit `t`.
#[cube]
pub fn stat(m: f32, l: f32, t: f32, #[comptime] norm: Norm) -> f32 {
    if comptime![norm == Norm::Sink] {
        lse_with_sink(m, l, t)
    } else if comptime![norm == Norm::Softmax] {
        finish_lse(m, l)
    } else if comptime![norm == Norm::Hard] {
        select(l > f32::new(0.0), m, f32::new(NO_KEYS))
    } else {
        f32::new(0.0)
    }
}

#[cube]
fn lse_with_sink(m: f32, l: f32, t: f32) -> f32 {
    let mut v = f32::new(NO_KEYS);
    if l != f32::new(0.0) {
        let top = max(m, t);
        v = top + (l * (m - top).exp() + (t - top).exp()).ln();
    }
    v
}

/// Stores the statistic ([`row_stat`]) of query row `rows[ROW_I]` of the
/// cube's `[b·H + h]` at `[b·H + h, i]` (row-major `[B, H, S]`), for rows
/// inside the `s` queries.
#[cube]
pub fn store_lse(
    out: &mut [Stored],
    state: &Array<f32>,
    rows: &Array<usize>,
    #[comptime] s: usize,
    #[comptime] fold: usize,
    #[comptime] norm: Norm,
) {
    let i = rows[ROW_I];
    if i < s {
        let v = row_stat(state, norm);
        out[k::cube_y(fold) * comptime![s] + i] = Stored::cast_from(v);
    }
}

/// Whether a stored log-sum-exp `l` is a row's that saw a key (a NaN one
/// is: its NaN reaches the row's weights, as in the interpreter).
#[cube]
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub fn live(l: f32) -> bool {
    // Unordered: true for NaN (one comparison; lavapipe may fold it to
    // `l > …`, which WGSL's arithmetic allows).
    !(l <= f32::new(NO_KEYS_BELOW))
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

/// A split-KV partial row (`plan::KvSplit`) of `el` vectors, of `s` rows
/// (`shape`): `x = acc / l` as `hi` (stored) and `lo = x − hi` at `lo`
/// vectors on, and the row's statistic likewise at `rows[base] + lse`: a
/// softmax's log-sum-exp (`NO_KEYS_PARTIAL` for a row that saw no key; the
/// sink joins at the [`combine`]); hard attention's max and ties; nothing
/// for sums ([`Norm::sums`]).
#[cube]
pub fn store_partial<N: Size>(
    out: &mut [Vector<Stored, N>],
    acc: &Array<Vector<f32, N>>,
    state: &Array<f32>,
    rows: &Array<usize>,
    #[comptime] base: usize,
    #[comptime] shape: (usize, usize),
    #[comptime] split: (Split, Norm),
) {
    let (s, el) = comptime![shape];
    let (split, norm) = comptime![(split.0, split.1.partial())];
    if rows[ROW_I] < s {
        let inv = inverse_sum(state, norm);
        let at = rows[ROW_OUT];
        #[unroll]
        for c in 0..el {
            let x = acc[c] * Vector::new(inv);
            let hi = Vector::<Stored, N>::cast_from(x);
            out[at + c] = hi;
            out[at + comptime![split.lo] + c] = Vector::<Stored, N>::cast_from(x - Vector::<f32, N>::cast_from(hi));
        }
        let row = rows[base] + comptime![split.lse];
        if comptime![norm == Norm::Hard] {
            out[row] = Vector::new(Stored::cast_from(state[0]));
            out[row + 1] = Vector::new(Stored::cast_from(state[1]));
        } else if comptime![norm == Norm::Softmax] {
            let lse = log_sum_exp(state[0], state[1], NO_KEYS_PARTIAL);
            let hi = Stored::cast_from(lse);
            out[row] = Vector::new(hi);
            out[row + 1] = Vector::new(Stored::cast_from(lse - f32::cast_from(hi)));
        }
    }
}

/// The sizes of a split-KV combine: `splits` chunks of `rows` partial rows
/// of `row` floats, `e` output floats a row, `lanes` floats a vector; the
/// normaliser, and for a sink, the `(heads, queries)` of each row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Chunks {
    pub splits: usize,
    pub rows: usize,
    pub e: usize,
    pub row: usize,
    pub lanes: usize,
    pub norm: Norm,
    pub heads: (usize, usize),
}

/// Merges the partial rows of element `i` ([`Chunks`]) into `out[at]`: a
/// softmax's by their log-sum-exp, the sink `sink[h]` joining the
/// denominator of a row some chunk saw a key of; hard attention's by their
/// max and ties; others summed. 0 where no chunk saw a key.
#[cube]
pub fn combine(p: &[Stored], sink: &[Stored], out: &mut [Stored], i: usize, at: usize, #[comptime] c: Chunks) {
    let (splits, rows, e, row, lanes) = comptime![(c.splits, c.rows, c.e, c.row, c.lanes)];
    let norm = comptime![c.norm];
    let (ch, r) = (i % e, i / e);
    let mut v = f32::new(0.0);
    if comptime![norm == Norm::Hard] {
        // The chunks' max, then their means weighted by their ties.
        let mut m = f32::new(M_INIT);
        for z in 0..splits {
            let at0 = (z * rows + r) * row + comptime![2 * e];
            if f32::cast_from(p[at0 + lanes]) > f32::new(0.0) {
                m = max(m, f32::cast_from(p[at0]));
            }
        }
        let mut num = f32::new(0.0);
        let mut den = f32::new(0.0);
        for z in 0..splits {
            let at0 = (z * rows + r) * row;
            let ties = f32::cast_from(p[at0 + comptime![2 * e + lanes]]);
            if ties > f32::new(0.0) && f32::cast_from(p[at0 + comptime![2 * e]]) == m {
                num += ties * (f32::cast_from(p[at0 + ch]) + f32::cast_from(p[at0 + e + ch]));
                den += ties;
            }
        }
        if den > f32::new(0.0) {
            v = num / den;
        }
    } else if comptime![norm.sums()] {
        let mut m = f32::new(M_INIT);
        for z in 0..splits {
            let at0 = (z * rows + r) * row + comptime![2 * e];
            let hi = f32::cast_from(p[at0]);
            if hi > f32::new(NO_KEYS_ABOVE) {
                m = max(m, hi + f32::cast_from(p[at0 + lanes]));
            }
        }
        let mut t = f32::new(M_INIT);
        if comptime![norm == Norm::Sink] {
            // The sink of the row's head, where some chunk saw a key.
            let (h, s) = comptime![c.heads];
            if m > f32::new(M_INIT) {
                t = f32::cast_from(sink[(r / s) % h]);
                m = max(m, t);
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
        if den > f32::new(0.0) {
            if comptime![norm == Norm::Sink] {
                den += (t - m).exp();
            }
            v = num / den;
        }
    } else {
        // Unnormalised weights: the chunks' sums add up.
        for z in 0..splits {
            let at0 = (z * rows + r) * row;
            v += f32::cast_from(p[at0 + ch]) + f32::cast_from(p[at0 + e + ch]);
        }
    }
    out[at] = Stored::cast_from(v);
}

/// The rows a sink's gradient sums ([`sink_grad`]): `batch × s` rows per
/// head of `heads`, each `e` floats of `o` and of `dout` in their layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SinkRows {
    pub batch: usize,
    pub heads: usize,
    pub s: usize,
    pub e: usize,
    pub o: RowView,
    pub dout: RowView,
}

/// The gradient of head `h`'s sink logit `t[h]`: the sink's weight in a
/// row is `exp(t − lse)` and it carries no value, so
/// `dt = −Σ_{b,i} D_i exp(t − lse_i)` with `D_i = dO_i · O_i`, over the rows
/// that saw a key, summed by one unit in a fixed order (deterministic).
#[cube]
pub fn sink_grad(
    o: &[Stored],
    dout: &[Stored],
    lse: &[Stored],
    sink: &[Stored],
    out: &mut [Stored],
    h: usize,
    #[comptime] c: SinkRows,
) {
    let t = f32::cast_from(sink[h]);
    let mut acc = f32::new(0.0);
    for b in 0..c.batch {
        for i in 0..c.s {
            let l = f32::cast_from(lse[(b * comptime![c.heads] + h) * comptime![c.s] + i]);
            if live(l) {
                let (ro, rd) = (view_row(b, h, i, comptime![c.o]), view_row(b, h, i, comptime![c.dout]));
                let mut delta = f32::new(0.0);
                #[unroll]
                for x in 0..c.e {
                    delta += f32::cast_from(o[ro + x]) * f32::cast_from(dout[rd + x]);
                }
                acc += delta * (t - l).exp();
            }
        }
    }
    out[h] = Stored::cast_from(f32::new(0.0) - acc);
}
