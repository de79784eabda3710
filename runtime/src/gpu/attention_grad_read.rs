//! The gradient of a tensor attention's score function reads
//! (`KernelSpec::AttentionReadLines`, `KernelSpec::AttentionReadSum`;
//! `plan::reads` says why two launches and what a line is).
//!
//! [`read_lines`]: a unit per line of (query, key) pairs of one (batch,
//! query head) walks it in order and, per pair the masks let through,
//! recomputes `P_ij = exp(score(scale·q_i·k_j) − lse_i)` and
//! `dS_ij = P_ij (dO_i · v_j − D_i)` (`D_i = dO_i · O_i`) and adds
//! `dS_ij · ∂score/∂read_r` to its sum of each read `r`. [`read_sum`]: a unit
//! per entry of the tensor adds, line by line in a fixed order, the sums of
//! the lines whose read indexes it. Every sum runs in one unit in one order:
//! results are deterministic. A line walks only the pairs the built-in mask
//! may let through; rows are read from global memory a pair at a time (no
//! shared tiles): this is the simple kernel, not a fast one.

use super::attention_grad::{GradArgs, Saved};
use super::func::{index_hook, read_hook, score_hook, Hook};
use super::kernels::{self as k, Stored};
use super::kit::launch::Dims;
use super::kit::mask::sees;
use super::kit::norm::{self, live, Norm};
use super::kit::source::view_row;
use super::kit::walk::{key_tiles, query_tiles};
use attnc_compiler::plan::{read_chunk, Lines, SUM_UNROLL};
use cubecl::prelude::*;

/// What both launches walk: the lines and, of the tensor, its reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Walk {
    pub batch: usize,
    pub lines: Lines,
    pub reads: usize,
    pub capture: usize,
}

impl Walk {
    /// Lines per (batch, head).
    fn count(&self, g: &Dims) -> usize {
        self.lines.count(g.s, g.sk)
    }
}

/// A line's first pair and its length.
#[derive(CubeType)]
struct Line {
    i: usize,
    j: usize,
    n: usize,
}

/// Line `l` (`Lines`): query rows step along keys, key rows along
/// queries, diagonals along both.
#[cube]
fn line_start(l: usize, #[comptime] lines: Lines, #[comptime] s: usize, #[comptime] sk: usize) -> Line {
    let mut i = l;
    let mut j = 0usize;
    let mut n = sk.runtime();
    if comptime![lines == Lines::Keys] {
        i = 0usize;
        j = l;
        n = s.runtime();
    } else if comptime![lines == Lines::Diagonals] {
        i = 0usize;
        if l + 1 >= s {
            j = l + 1 - s;
        } else {
            i = comptime![s.saturating_sub(1)] - l;
        }
        n = min(comptime![s] - i, comptime![sk] - j);
    }
    Line { i, j, n }
}

/// `Σ_c x[xa + c] · (y[ya + c] − z[za + c])` over `n` channels (`z` read
/// only with `minus`; `of` = `(n, minus)`), `read_chunk(n)` channels unrolled a loop step, so that
/// CUDA's compiler does not hold every row's loads at once (it spilled).
#[cube]
fn dot(
    x: &[Stored],
    xa: usize,
    y: &[Stored],
    ya: usize,
    z: &[Stored],
    za: usize,
    #[comptime] of: (usize, bool),
) -> f32 {
    let (n, minus) = comptime![of];
    let ch = comptime![read_chunk(n)];
    let mut acc = f32::new(0.0);
    for c0 in 0..comptime![n / ch] {
        let c1 = c0 * ch;
        #[unroll]
        for c in 0..ch {
            let mut w = f32::cast_from(y[ya + c1 + c]);
            if comptime![minus] {
                w -= f32::cast_from(z[za + c1 + c]);
            }
            acc += f32::cast_from(x[xa + c1 + c]) * w;
        }
    }
    acc
}

/// Line `line` (of every (batch, head)'s `Walk::count`) writes its sum of
/// each read `r` at `out[(r · batch · h + bh) · count + l]`.
#[cube]
pub fn read_lines(
    x: &Saved,
    out: &mut [Stored],
    line: usize,
    #[comptime] g: Dims,
    #[comptime] walk: Walk,
    #[comptime] args: GradArgs,
) {
    let (views, scale, hook) = comptime![(args.views, args.scale, args.hook.clone())];
    let count = comptime![walk.count(&g)];
    let bh = line / count;
    let l = line % count;
    let b = bh / comptime![g.h];
    let hi = bh % comptime![g.h];
    let kh = hi / comptime![g.h / g.hk];
    let start = line_start(l, comptime![walk.lines], comptime![g.s], comptime![g.sk]);
    // The steps the built-in mask may let through: a row's band of keys
    // (`key_tiles` of one-row tiles), a key's band of queries; a diagonal
    // is seen whole or not at all where blocks are single rows.
    let mut first = 0usize;
    let mut last = start.n;
    if comptime![walk.lines == Lines::Rows] {
        let band = key_tiles(start.i, start.i, g);
        first = band.lo;
        last = min(band.hi, start.n);
    } else if comptime![walk.lines == Lines::Keys] {
        let band = query_tiles(start.j, start.j, g);
        first = band.lo;
        last = min(band.hi, start.n);
    } else if comptime![g.block == 1] {
        if start.n > 0 && !sees(start.i, start.j, comptime![g.mask()]) {
            last = 0;
        }
    }
    let mut acc = k::zeros(comptime![walk.reads]);
    for t in first..last {
        let mut i = start.i;
        let mut j = start.j;
        if comptime![walk.lines != Lines::Keys] {
            j += t;
        }
        if comptime![walk.lines != Lines::Rows] {
            i += t;
        }
        let lv = f32::cast_from(x.lse[bh * comptime![g.s] + i]);
        if live(lv) && sees(i, j, comptime![g.mask()]) {
            let (qa, ka) = (view_row(b, hi, i, comptime![views[0]]), view_row(b, kh, j, comptime![views[1]]));
            let (va, oa) = (view_row(b, kh, j, comptime![views[2]]), view_row(b, hi, i, comptime![views[3]]));
            let da = view_row(b, hi, i, comptime![views[4]]);
            let sc = dot(x.q, qa, x.k, ka, x.k, ka, comptime![(g.d, false)]) * f32::new(scale);
            // dO_i · v_j − D_i in one pass.
            let dp = dot(x.dout, da, x.v, va, x.o, oa, comptime![(g.e, true)]);
            let p = norm::prob(score_hook(sc, b, hi, i, j, hook.clone()), lv, Norm::Softmax);
            read_hook(&mut acc, p * dp, sc, b, hi, i, j, comptime![walk.capture], hook.clone());
        }
    }
    #[unroll]
    for r in 0..comptime![walk.reads] {
        out[(r * comptime![walk.batch * g.h] + bh) * count + l] = Stored::cast_from(acc[r]);
    }
}

/// Entry `e`'s share of read `read`: the sums [`read_lines`] wrote of the
/// lines whose read indexes `e` (at the line's first pair), in order.
#[cube]
pub fn read_sum(
    sums: &[Stored],
    e: usize,
    #[comptime] g: Dims,
    #[comptime] walk: Walk,
    #[comptime] read: usize,
    #[comptime] hook: Hook,
) -> f32 {
    let count = comptime![walk.count(&g)];
    let mut acc = f32::new(0.0);
    for bh in 0..comptime![walk.batch * g.h] {
        let b = bh / comptime![g.h];
        let hi = bh % comptime![g.h];
        let at = (comptime![read * walk.batch * g.h] + bh) * count;
        for l0 in 0..comptime![count.div_ceil(SUM_UNROLL)] {
            #[unroll]
            for u in 0..SUM_UNROLL {
                let l = l0 * SUM_UNROLL + u;
                if l < count {
                    let start = line_start(l, comptime![walk.lines], comptime![g.s], comptime![g.sk]);
                    if index_hook(b, hi, start.i, start.j, comptime![walk.capture], read, hook.clone()) == e {
                        acc += f32::cast_from(sums[at + l]);
                    }
                }
            }
        }
    }
    acc
}
