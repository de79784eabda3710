//! What one launch computes ([`KernelSpec`]) and the tile shapes every
//! reader of a launch (planner, kernels, emitter, cost model) takes from here.

use super::gemm_tiles::*;
use super::group::GroupStep;
use super::reads::Lines;
use super::split::KvSplit;
use super::tiles::*;
use super::view::{RowView, View};
pub use super::visited::{AttnShape, KernelFns};
use crate::ir::{AttnArg, BinaryOp, ReduceKind, UnaryOp, Weights};
use serde::Serialize;

/// Attention's keys and values in a paged cache (`Op::Paged` read in
/// place): key row `j` of sequence `b` is row `j % page` of page
/// `table[b, j / page]` (of `blocks`; `integers`: the table's digits,
/// `INTEGER_DIGITS`, in half precision).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct PagedRows {
    pub page: usize,
    pub slots: usize,
    pub blocks: usize,
    pub integers: bool,
}

/// What one launch computes. Sizes are comptime constants of the kernel.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KernelSpec {
    /// `out[i] = x[view(i)]`: head splits and merges, interleaving, slices.
    Gather { len: usize, x: View },
    /// `out[i] = op(a[va(i)], b[vb(i)])`.
    Binary { len: usize, op: BinaryOp, a: View, b: View },
    /// `out[i] = op(x[vx(i)])`.
    Unary { len: usize, op: UnaryOp, x: View },
    /// `out[i] = cond[vc(i)] != 0 ? a[va(i)] : b[vb(i)]`.
    Where { len: usize, cond: View, a: View, b: View },
    /// `out[i·(L−1) + t] = x[i] >= t + 2`.
    Thresholds { len: usize, levels: usize },
    /// Tiled `out[rows, f] = a[rows, k] · b[k, f]`: row `r`, column `c` of
    /// `a` at `a_rows(r) + a_cols(c)` (so merged heads, slices and other
    /// layouts are read in place), element `(t, c)` of `b` at
    /// `b_rows(t) + b_cols(c)` (row-major, transposed or merged heads, in
    /// place where [`GemmB`] reads it in vectors).
    /// With `mix`, the epilogue mixes heads instead of storing the product
    /// (see [`MixEpilogue`]); `alpha` is bound after `b`. With `add`, it
    /// stores the product plus an addend of the output's shape, bound after
    /// `b` (`x @ w + y` in one launch: a gradient's sum of products).
    MatMul {
        rows: usize,
        k: usize,
        f: usize,
        a_rows: View,
        a_cols: View,
        b_rows: View,
        b_cols: View,
        #[serde(skip_serializing_if = "Option::is_none")]
        mix: Option<MixEpilogue>,
        /// The epilogue multiplies by this constant (`f64` bits): `(a @ b) * c`
        /// or `(a @ b) / c` in one launch.
        #[serde(skip_serializing_if = "Option::is_none")]
        scale: Option<u64>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        add: bool,
    },
    /// `out[b,h,j,s,e] = Σ_m alpha[m,h,j] · x[b,m,s,e]`, `x[b,m,s,e]` at
    /// `x(index of [b,0,s,e]) + m·x_m` (a head split read in place).
    MixHeads { batch: usize, m: usize, h: usize, p: usize, s: usize, d: usize, x: View, x_m: usize },
    /// `out[r, (h·P+j)·d+e] = Σ_m alpha[m,h,j] · y[r, m·d+e]`, `y[r, m·d+e]`
    /// at `y(index of [r, e]) + m·y_m`.
    MixCols { rows: usize, m: usize, h: usize, p: usize, d: usize, y: View, y_m: usize },
    /// `out[b,h,s,e] = Σ_c r[h,c] · x[b,c,s,e]` (x's heads and pseudo-heads
    /// flattened to c), `x[b,c,s,e]` at `x(index of [b,0,s,e]) + x_c(c)`
    /// (the flattened heads and pseudo-heads of a deinterleaved attention
    /// output step by two strides: read in place).
    Collapse { batch: usize, h: usize, c: usize, s: usize, d: usize, x: View, x_c: View },
    /// `out[r, h·d+e] = Σ_c r[h,c] · y[r, c·d+e]`, `y[r, c·d+e]` at `y(index of [r, e]) + c·y_c`.
    CollapseCols { rows: usize, h: usize, c: usize, d: usize, y: View, y_c: usize },
    /// `out[c·d+e, f] = Σ_h r[h,c] · w[h·d+e, f]`.
    CollapseRows { h: usize, c: usize, d: usize, f: usize },
    /// `out[h, c] = r[h, c]` if `c / block == h`, else 0.
    BlockDiag { h: usize, cols: usize, block: usize },
    /// `out[r, 0..f1] = a[r], out[r, f1..] = b[r]`.
    Concat { rows: usize, f1: usize, f2: usize },
    /// `out[b, h, t, c] = cache[pages[b, t / page], t % page, h, c]` (`Op::Paged`;
    /// `integers`: the table is stored as integer digits, `INTEGER_DIGITS`).
    Paged { batch: usize, slots: usize, blocks: usize, page: usize, heads: usize, width: usize, integers: bool },
    /// Rotate-half RoPE at row position `row % s`; element `i` of the
    /// (row-major) operand at `x(i)`.
    Rope { rows: usize, s: usize, d: usize, base_bits: u64, x: View },
    /// Flash attention: query tiles against key tiles with an online softmax;
    /// `s` query rows, `sk` key rows (queries aligned to the end of the keys).
    Attention {
        #[serde(flatten)]
        shape: AttnShape,
        /// Layouts of the operands and the output (views of their buffers).
        q: RowView,
        k: RowView,
        v: RowView,
        out: RowView,
        /// Tiled for matrix fragments (half precision; see
        /// [`KernelSpec::fragments`]): one query row per unit, key tiles of
        /// [`frag_key_tile`], whichever kernel runs it.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        fragments: bool,
        /// Tiled within a GPU's register file ([`KernelSpec::on_planes`]):
        /// this many units (lanes of one plane) share each query row, each
        /// holding a slice of its channels; 0 is the CPU drivers' tiling
        /// (several whole rows per unit).
        #[serde(default, skip_serializing_if = "is_zero")]
        split: usize,
        /// Split-KV decoding (`Plan::split_kv`): chunks of keys on the
        /// grid's z axis, each writing partial rows (`out` over them) that a
        /// [`KernelSpec::Combine`] launch merges.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kv: Option<KvSplit>,
        /// Keys and values read from a paged cache through a block table
        /// (bound after the captures): `k` and `v` view one page's rows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        paged: Option<PagedRows>,
        /// Also writes each query row's log-sum-exp (what the backward reads,
        /// as [`KernelSpec::AttentionLse`] computes it), row-major
        /// `[batch, h, s]`, to a binding just before `out`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        lse: bool,
    },
    /// Merges split-KV partial rows (`Plan::split_kv`) by their
    /// log-sum-exp into attention's `[batch, h, s, e]` output at `out`
    /// (`weights`: as the attention's; with `sink`, the sink logits are
    /// bound after the partial rows).
    Combine {
        batch: usize,
        h: usize,
        s: usize,
        e: usize,
        kv: KvSplit,
        out: RowView,
        #[serde(default, skip_serializing_if = "Weights::is_softmax")]
        weights: Weights,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        sink: bool,
    },
    /// The gradient of a softmax's sink logits (`sink =`, `[h]`):
    /// `dt_h = −Σ_{b,i} D_{b,h,i} exp(t_h − lse_{b,h,i})`, `D = dO · O` over
    /// rows of `e` floats in layouts `o` and `dout`; a unit a head sums its
    /// rows in order. Binds `o`, `dout`, the log-sum-exp and `t`.
    SinkGrad { batch: usize, h: usize, s: usize, e: usize, o: RowView, dout: RowView },
    /// The log-sum-exp of each query row's scaled visible scores (what
    /// attention's backward saves), `NO_KEYS` for a row that sees none:
    /// a unit per query row, key tiles of `tile` rows staged in shared
    /// memory. Output row-major `[batch, h, s]`.
    AttentionLse {
        #[serde(flatten)]
        shape: AttnShape,
        q: RowView,
        k: RowView,
        tile: usize,
        /// Units sharing each query row ([`KernelSpec::on_planes`]; 0: one).
        #[serde(default, skip_serializing_if = "is_zero")]
        split: usize,
    },
    /// FlashAttention-2's backward in one operand (`wrt`): binds `q`, `k`,
    /// `v`, the forward output `o`, its cotangent `dout` and the rows'
    /// log-sum-exp (row-major `[batch, h, s]`) — `dV` needs only `q`, `k`,
    /// `dout` and the log-sum-exp, and binds only those; writes the gradient of `q`
    /// (a unit per query row, walking key tiles) or of `k` or `v` (a unit
    /// per key row, walking the query tiles of every query head sharing it),
    /// row-major. Probabilities are recomputed from the log-sum-exp tile by
    /// tile in shared memory, never stored; each unit sums its own row in a
    /// fixed order, so results are deterministic.
    AttentionGrad {
        #[serde(flatten)]
        shape: AttnShape,
        wrt: AttnArg,
        q: RowView,
        k: RowView,
        v: RowView,
        o: RowView,
        dout: RowView,
        tile: usize,
        /// Units sharing each row ([`KernelSpec::on_planes`]; 0: one).
        #[serde(default, skip_serializing_if = "is_zero")]
        split: usize,
        /// Where the gradient's rows go (row-major, or the layout of its one
        /// reader that merges heads, so that no copy follows).
        out: RowView,
        /// `dK` (`wrt` is `K`) and `dV` in one walk over the query tiles,
        /// sharing each probability: `dV`'s layout, its binding just before `dK`'s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dv: Option<RowView>,
        /// Tiled for matrix fragments (16-bit and TF32 heads that
        /// [`frag_grad_tiles`] takes): one row a unit, the other side's tiles
        /// of [`frag_grad_tiles`] rows, whichever kernel runs it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        fragments: bool,
        /// The fragments' operands are TF32 in f32 storage (`--dtype
        /// tf32`): tiles sized for 4-byte shared arrays.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        tf32: bool,
    },
    /// The gradient of a tensor the score function reads, first launch
    /// (`plan::reads`): a unit per line of (query, key) pairs of one
    /// (batch, query head) sums `dS_ij · ∂f/∂read` along it, per read of
    /// capture `capture`. Binds `q`, `k`, `v`, `o`, `dout`, the
    /// log-sum-exp and the captures; writes `[reads, batch, h, lines]`.
    AttentionReadLines {
        #[serde(flatten)]
        shape: AttnShape,
        capture: usize,
        reads: usize,
        lines: Lines,
        q: RowView,
        k: RowView,
        v: RowView,
        o: RowView,
        dout: RowView,
    },
    /// Its second launch: a unit per entry of capture `capture` sums the
    /// lines whose read indexes it, in order. Binds the first launch's
    /// sums and the captures.
    AttentionReadSum {
        #[serde(flatten)]
        shape: AttnShape,
        capture: usize,
        reads: usize,
        lines: Lines,
    },
    /// Attention that mixes heads inside the softmax
    /// (`gpu::attention_mixed`; docs/semantics.md §7), forward or a pass of
    /// its backward (`pass`): binds `pass.operands()` of `q`, `k`, `v`, `dO`,
    /// the log-sum-exp and `D`, then the captures (the mixing matrices
    /// among them); a cube holds every head of `mix.rows` query (or key)
    /// rows of a batch. The forward writes through `out`; in the backward
    /// `out` is `dO`'s view and results are row-major ([`MixPass`]).
    MixedAttention {
        #[serde(flatten)]
        shape: AttnShape,
        mix: MixTiles,
        q: RowView,
        k: RowView,
        v: RowView,
        out: RowView,
        #[serde(skip_serializing_if = "MixPass::is_forward")]
        pass: MixPass,
    },
    /// `out[x, y] = Σ_{r,i} a[r, x, i] · b[r, y, i]` for `a: [rows, o1, inner]`
    /// and `b: [rows, o2, inner]` read through their views (of the row-major
    /// index: head splits and interleaving in place): the gradients of
    /// mixing and collapse coefficients, reductions over batch and tokens.
    /// A cube per output element; its units sum strided shares, then a tree
    /// in shared memory (a fixed order: deterministic, no atomics).
    Contract { rows: usize, o1: usize, o2: usize, inner: usize, a: View, b: View },
    /// `out[o] = reduce_r x[base(o) + inner(r)]` over `count` elements.
    Reduce { len: usize, op: ReduceKind, count: usize, base: View, inner: View },
    /// `out[i] = (Σ_r x[base(i) + r·stride] − x[i]) / (n − 1)`.
    LooMean { len: usize, n: usize, stride: usize },
    /// Group-local work fused into one cube per group (see `group.rs`):
    /// `inputs` bindings, then the output of `len` values; `scratch` f32 of shared memory.
    Group { groups: usize, len: usize, inputs: usize, scratch: usize, steps: Vec<GroupStep> },
}

impl KernelSpec {
    /// Units per cube and cubes for this launch.
    pub fn grid(&self) -> ((u32, u32, u32), (u32, u32, u32)) {
        let units = match self {
            KernelSpec::MatMul { .. } => GEMM_UNITS,
            KernelSpec::Attention { .. } => self.attention_tiles().units(),
            KernelSpec::Group { .. } | KernelSpec::Contract { .. } => GROUP_UNITS,
            KernelSpec::AttentionLse { .. } | KernelSpec::AttentionGrad { .. } => self.attention_tiles().units(),
            KernelSpec::MixedAttention { .. } => MIX_UNITS,
            _ => 256,
        } as u32;
        let (x, y) = self.cubes();
        let z = match self {
            KernelSpec::Attention { kv: Some(kv), .. } => kv.splits as u32,
            _ => 1,
        };
        let counts = if x <= MAX_GRID && y <= MAX_GRID {
            (x as u32, y as u32, z)
        } else {
            // Laid out linearly over all three axes, none past its limit.
            let total = x * y;
            let gx = total.min(MAX_GRID);
            let rest = total.div_ceil(gx);
            let gy = rest.min(MAX_GRID);
            (gx as u32, gy as u32, rest.div_ceil(gy) as u32)
        };
        ((units, 1, 1), counts)
    }

    /// The launch's cubes as its kernel indexes them: along x and along y.
    pub fn cubes(&self) -> (usize, usize) {
        match self {
            KernelSpec::MatMul { rows, f, mix, .. } => {
                let lanes = self.line_size();
                let x = match mix {
                    Some(mix) => (mix.d / lanes).div_ceil(mix.channels(lanes)),
                    None => (f / lanes).div_ceil(gemm_cols(*f, lanes)),
                };
                (x, rows.div_ceil(GEMM_UNITS * GEMM_ROWS))
            }
            KernelSpec::Attention { shape: AttnShape { batch, h, s, .. }, .. } => {
                (s.div_ceil(self.attention_tiles().cube_rows()), batch * h)
            }
            KernelSpec::MixedAttention { shape: AttnShape { batch, s, sk, .. }, mix, pass, .. } => {
                (if pass.over_keys() { sk } else { s }.div_ceil(mix.rows), *batch)
            }
            KernelSpec::Group { groups, .. } => (*groups, 1),
            KernelSpec::AttentionReadLines { shape: AttnShape { batch, h, s, sk, .. }, lines, .. } => {
                ((batch * h * lines.count(*s, *sk)).div_ceil(256).max(1), 1)
            }
            KernelSpec::Contract { o1, o2, .. } => (o1 * o2, 1),
            KernelSpec::AttentionLse { shape: AttnShape { batch, h, s, .. }, .. } => {
                (s.div_ceil(self.attention_tiles().cube_rows()), batch * h)
            }
            KernelSpec::AttentionGrad { shape: AttnShape { batch, h, hk, s, sk, .. }, wrt, .. } => {
                let rows = self.attention_tiles().cube_rows();
                match wrt {
                    AttnArg::Q | AttnArg::Read(_) => (s.div_ceil(rows), batch * h),
                    AttnArg::K | AttnArg::V => (sk.div_ceil(rows), batch * hk),
                }
            }
            other => (other.len().div_ceil(256).max(1), 1),
        }
    }

    /// When an axis of [`KernelSpec::cubes`] is past [`MAX_GRID`], the
    /// cubes are laid out linearly over the grid's three axes and a GEMM,
    /// attention or group kernel recovers its position from the linear index:
    /// then its cubes along x (and every cube past `x · y` does nothing), else 0.
    pub fn fold_x(&self) -> usize {
        let (x, y) = self.cubes();
        let positional = matches!(
            self,
            KernelSpec::MatMul { .. }
                | KernelSpec::Attention { .. }
                | KernelSpec::Group { .. }
                | KernelSpec::Contract { .. }
                | KernelSpec::AttentionLse { .. }
                | KernelSpec::AttentionGrad { .. }
                | KernelSpec::MixedAttention { .. }
        );
        if positional && (x > MAX_GRID || y > MAX_GRID) {
            x
        } else {
            0
        }
    }

    /// Number of output elements.
    pub fn len(&self) -> usize {
        match *self {
            KernelSpec::Gather { len, .. }
            | KernelSpec::Binary { len, .. }
            | KernelSpec::Unary { len, .. }
            | KernelSpec::Where { len, .. }
            | KernelSpec::Reduce { len, .. }
            | KernelSpec::LooMean { len, .. }
            | KernelSpec::Group { len, .. } => len,
            KernelSpec::Thresholds { len, levels } => len * (levels - 1),
            KernelSpec::MatMul { rows, mix: Some(m), .. } => rows * m.h * m.p * m.d,
            KernelSpec::MatMul { rows, f, .. } => rows * f,
            KernelSpec::MixHeads { batch, h, p, s, d, .. } => batch * h * p * s * d,
            KernelSpec::MixCols { rows, h, p, d, .. } => rows * h * p * d,
            KernelSpec::Collapse { batch, h, s, d, .. } => batch * h * s * d,
            KernelSpec::CollapseCols { rows, h, d, .. } => rows * h * d,
            KernelSpec::CollapseRows { c, d, f, .. } => c * d * f,
            KernelSpec::BlockDiag { h, cols, .. } => h * cols,
            KernelSpec::Concat { rows, f1, f2 } => rows * (f1 + f2),
            KernelSpec::Paged { batch, slots, page, heads, width, .. } => batch * slots * page * heads * width,
            KernelSpec::Combine { batch, h, s, e, .. } => batch * h * s * e,
            KernelSpec::SinkGrad { h, .. } => h,
            KernelSpec::Rope { rows, d, .. } => rows * d / 2,
            KernelSpec::Attention { shape: AttnShape { batch, h, s, e, .. }, .. } => batch * h * s * e,
            KernelSpec::AttentionLse { shape: AttnShape { batch, h, s, .. }, .. } => batch * h * s,
            KernelSpec::MixedAttention { shape: AttnShape { batch, h, hk, s, sk, d, e, .. }, mix, pass, .. } => {
                mix.len(pass, [batch, h, hk, s, sk, d, e])
            }
            KernelSpec::AttentionGrad { shape: AttnShape { batch, h, hk, s, sk, d, e, ref fns, .. }, wrt, .. } => {
                match wrt {
                    AttnArg::Q => batch * h * s * d,
                    AttnArg::K => batch * hk * sk * d,
                    AttnArg::V => batch * hk * sk * e,
                    AttnArg::Read(c) => fns.as_ref().map_or(0, |f| f.captures[c].iter().product()),
                }
            }
            KernelSpec::Contract { o1, o2, .. } => o1 * o2,
            KernelSpec::AttentionReadLines { shape: AttnShape { batch, h, s, sk, .. }, reads, lines, .. } => {
                reads * batch * h * lines.count(s, sk)
            }
            KernelSpec::AttentionReadSum { ref shape, capture, .. } => {
                shape.fns.as_ref().map_or(0, |f| f.captures[capture].iter().product())
            }
        }
    }

    /// Register-blocked kernels (`attention.rs`, `gemm.rs`): their buffers are
    /// vectors of [`KernelSpec::line_size`] floats, every read clamped and
    /// every write guarded by construction.
    pub fn vectorised(&self) -> bool {
        matches!(
            self,
            KernelSpec::MatMul { .. } | KernelSpec::Attention { .. } | KernelSpec::AttentionLse { split: 0, .. }
        ) || self.tiled_grad()
    }

    /// An attention gradient on the forward's tiling (several rows a unit
    /// in vectors, the other side's tiles unrolled;
    /// `gpu::attention_tiled_grad`): `dQ`, `dK` and `dV` on the CPU
    /// drivers' tiling and on fragments (not `AttnPath::Lanes`). Tiled within
    /// a GPU's register file they stage tiles in shared memory, a row a unit
    /// (`gpu::attention_grad`).
    pub fn tiled_grad(&self) -> bool {
        let rows = matches!(self, KernelSpec::AttentionGrad { wrt: AttnArg::Q | AttnArg::K | AttnArg::V, .. });
        rows && !matches!(self.path(), Some(super::AttnPath::Lanes(_)))
    }

    /// Whether a kernel on matrix fragments may compute this launch on the
    /// plan's grid: any GEMM (its mixing epilogue included), attention tiled for it.
    pub fn fragments(&self) -> bool {
        match self {
            KernelSpec::MatMul { .. } => true,
            KernelSpec::Attention { fragments, .. } | KernelSpec::AttentionGrad { fragments, .. } => *fragments,
            _ => false,
        }
    }

    /// What a launch that [`KernelSpec::on_planes`] may split holds in
    /// registers per row, for one lane a row; `None` for any other.
    pub fn row_floats(&self) -> Option<RowFloats> {
        let lanes = self.line_size();
        Some(match *self {
            KernelSpec::Attention { shape: AttnShape { d, e, .. }, fragments: false, .. } => {
                RowFloats { held: d + e, what: "query and output", widths: (d / lanes, e / lanes), widest: 8 }
            }
            KernelSpec::AttentionLse { shape: AttnShape { d, .. }, .. } => {
                RowFloats { held: d, what: "query", widths: (d, d), widest: 16 }
            }
            // dQ: q, dO and the accumulator (and o's slice for D_i); dK: k,
            // v and the accumulator; dV: k and the accumulator.
            KernelSpec::AttentionGrad { shape: AttnShape { d, e, .. }, wrt, dv, fragments: false, .. } => {
                let (held, what) = match wrt {
                    AttnArg::Q | AttnArg::Read(_) => (2 * d + 2 * e, "query, output, output-gradient and dQ"),
                    AttnArg::K if dv.is_some() => (2 * d + 2 * e, "key, value, dK and dV"),
                    AttnArg::K => (2 * d + e, "key, value and dK"),
                    AttnArg::V => (d + e, "key and dV"),
                };
                RowFloats { held, what, widths: (d, e), widest: 16 }
            }
            _ => return None,
        })
    }

    /// The tiling of an attention launch (any other launch: a single unit row
    /// and key tile, unused).
    pub fn attention_tiles(&self) -> AttnTiles {
        match *self {
            KernelSpec::Attention { split: lanes @ 1.., shape: AttnShape { sk, .. }, .. } => AttnTiles {
                unit_rows: 1,
                key_tile: REGISTER_KEY_TILE.min(sk.next_power_of_two().max(4)),
                lanes,
                row_units: ATTN_ROWS,
            },
            KernelSpec::Attention { fragments: true, shape: AttnShape { d, e, .. }, .. } => AttnTiles {
                unit_rows: 1,
                key_tile: frag_key_tile(d, e, self.line_size()).expect("tiled for fragments where they fit"),
                lanes: 1,
                row_units: ATTN_ROWS,
            },
            KernelSpec::Attention { shape: ref sh @ AttnShape { s, sk, d, e, window, block, .. }, .. } => {
                let l = self.line_size();
                AttnTiles::new(d / l, e / l, s, sk, sh.masked(), window.unwrap_or(0) * block)
            }
            KernelSpec::AttentionGrad { shape: AttnShape { d, e, .. }, fragments: true, tf32, .. } => {
                frag_grad_tiles(d, e, frag_bytes(tf32)).expect("tiled for fragments where they fit")
            }
            // Per pair, dQ and dK take two dot products and an update (the
            // forward's tiling at widths `2 dl + el`), dV one of each
            // (`dl + el`); dK and dV tile key rows against query tiles.
            KernelSpec::AttentionGrad {
                shape: ref sh @ AttnShape { s, sk, d, e, window, block, .. }, wrt, dv, ..
            } if self.tiled_grad() => {
                let (l, masked) = (self.line_size(), sh.masked());
                let w = window.unwrap_or(0) * block;
                match wrt {
                    AttnArg::V => AttnTiles::new(d / l, e / l, sk, s, masked, w),
                    AttnArg::K if dv.is_some() => AttnTiles::new(2 * d / l, 2 * e / l, sk, s, masked, w),
                    AttnArg::K => AttnTiles::new(2 * d / l, e / l, sk, s, masked, w),
                    _ => AttnTiles::new(2 * d / l, e / l, s, sk, masked, w),
                }
            }
            // The forward's kernel without values.
            KernelSpec::AttentionLse {
                shape: ref sh @ AttnShape { s, sk, d, window, block, .. }, split: 0, ..
            } => {
                let l = self.line_size();
                AttnTiles::new(d / l, 0, s, sk, sh.masked(), window.unwrap_or(0) * block)
            }
            KernelSpec::AttentionLse { tile, split, .. } | KernelSpec::AttentionGrad { tile, split, .. } => {
                AttnTiles { unit_rows: 1, key_tile: tile, lanes: split.max(1), row_units: ATTN_ROWS }
            }
            _ => AttnTiles { unit_rows: 1, key_tile: 1, lanes: 1, row_units: ATTN_ROWS },
        }
    }

    /// The vector width (floats) of the kernel's loads and stores.
    pub fn line_size(&self) -> usize {
        match *self {
            KernelSpec::MatMul { k, f, ref a_rows, ref a_cols, ref b_rows, ref b_cols, mix, .. } => [4, 2, 1]
                .into_iter()
                .find(|&l| {
                    line_size(&[k, f, a_rows.offset, mix.map_or(f, |m| m.d)]) >= l
                        && GemmB::of(b_rows, b_cols, l).is_some()
                        && a_rows.terms.iter().all(|t| t.2 % l == 0)
                        && a_cols.in_vectors(l).is_some()
                })
                .unwrap_or(1),
            KernelSpec::Attention { shape: AttnShape { d, e, .. }, q, k, v, out, .. } => {
                let mut ns = vec![d, e];
                for view in [q, k, v, out] {
                    ns.extend([view.offset, view.batch, view.head, view.outer, view.inner]);
                }
                line_size(&ns)
            }
            KernelSpec::AttentionLse { shape: AttnShape { d, .. }, q, k, split: 0, .. } => {
                let mut ns = vec![d];
                for view in [q, k] {
                    ns.extend([view.offset, view.batch, view.head, view.outer, view.inner]);
                }
                line_size(&ns)
            }
            KernelSpec::AttentionGrad { shape: AttnShape { d, e, .. }, q, k, v, o, dout, .. } if self.tiled_grad() => {
                let mut ns = vec![d, e];
                for view in [q, k, v, o, dout] {
                    ns.extend([view.offset, view.batch, view.head, view.outer, view.inner]);
                }
                line_size(&ns)
            }
            _ => 1,
        }
    }

    /// Floats per element of binding `slot` (operands in order, then the
    /// output): the line size, except a mixing epilogue's coefficients.
    pub fn binding_line_size(&self, slot: usize) -> usize {
        if self.vectorised() && !self.scalar_binding(slot) {
            self.line_size()
        } else {
            1
        }
    }

    /// How many bindings the launch writes, the last ones: its output and,
    /// before it, a second one (attention's log-sum-exp, `dV` beside `dK`, a
    /// mixing GEMM's kept product).
    pub fn outputs(&self) -> usize {
        match self {
            KernelSpec::Attention { lse: true, .. } | KernelSpec::AttentionGrad { dv: Some(_), .. } => 2,
            KernelSpec::MatMul { mix: Some(m), .. } if m.keep => 2,
            _ => 1,
        }
    }

    /// Whether a vectorised kernel reads binding `slot` as single floats.
    pub fn scalar_binding(&self, slot: usize) -> bool {
        match self {
            KernelSpec::MatMul { mix: Some(_), .. } => slot == 2,
            // The tensors score and mask functions read, after q, k and v,
            // then a block table, then the log-sum-exp written.
            KernelSpec::Attention { shape: AttnShape { fns, .. }, paged, lse, .. } => {
                let scalars = fns.as_ref().map_or(0, |f| f.captures.len()) + usize::from(paged.is_some());
                (3..3 + scalars + usize::from(*lse)).contains(&slot)
            }
            // The log-sum-exp: q and k in vectors; the captures and the output.
            KernelSpec::AttentionLse { split: 0, .. } => slot >= 2,
            // dQ and dK: q, k, v, o, dout, then the log-sum-exp and the
            // captures; dV: q, k, dout, the log-sum-exp, the captures.
            KernelSpec::AttentionGrad { shape: AttnShape { fns, .. }, wrt, .. } if self.tiled_grad() => {
                let lse = if *wrt == AttnArg::V { 3 } else { 5 };
                (lse..=lse + fns.as_ref().map_or(0, |f| f.captures.len())).contains(&slot)
            }
            _ => false,
        }
    }

    /// What the kernels cannot compute yet for this launch, if anything.
    /// The attention functions of an attention launch, if it has any.
    pub fn attn_fns(&self) -> Option<&super::KernelFns> {
        match self {
            KernelSpec::Attention { shape, .. }
            | KernelSpec::AttentionLse { shape, .. }
            | KernelSpec::AttentionGrad { shape, .. }
            | KernelSpec::AttentionReadLines { shape, .. }
            | KernelSpec::AttentionReadSum { shape, .. }
            | KernelSpec::MixedAttention { shape, .. } => shape.fns.as_ref(),
            _ => None,
        }
    }

    pub fn kernel_gap(&self) -> Option<&'static str> {
        if let Some(f) = self.attn_fns() {
            let plain = f.weights.is_softmax() && f.sink.is_none();
            match self {
                KernelSpec::AttentionGrad { .. } if f.weights == Weights::Hard => {
                    return Some("the gradient of hard attention (the interpreter computes it)")
                }
                KernelSpec::AttentionReadLines { .. } | KernelSpec::AttentionReadSum { .. } if !plain => {
                    return Some(
                        "the gradient of a tensor a score function reads, with weights other than a plain \
                         softmax (the interpreter computes it)",
                    )
                }
                _ => {}
            }
        }
        match self {
            KernelSpec::MixedAttention { shape, mix, .. } if mix.shared_floats(shape.h) > MIX_SHARED => {
                Some("more heads than one cube's shared memory holds, for head mixing inside attention")
            }
            KernelSpec::AttentionGrad { wrt: AttnArg::Read(_), .. } => Some(
                "the gradient of a tensor a score function reads at an index of both i and j other than i - j, \
                 or next to head mixing (the interpreter computes it)",
            ),
            _ => None,
        }
    }

    /// A short name for the kernel kind (`matmul`, `attention`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            KernelSpec::Gather { .. } => "gather",
            KernelSpec::Binary { .. } => "binary",
            KernelSpec::Unary { .. } => "unary",
            KernelSpec::Where { .. } => "where",
            KernelSpec::Thresholds { .. } => "thresholds",
            KernelSpec::MatMul { mix: Some(_), .. } => "matmul_mix",
            KernelSpec::MatMul { add: true, .. } => "matmul_add",
            KernelSpec::MatMul { .. } => "matmul",
            KernelSpec::MixHeads { .. } => "mix_heads",
            KernelSpec::MixCols { .. } => "mix_cols",
            KernelSpec::Collapse { .. } => "collapse",
            KernelSpec::CollapseCols { .. } => "collapse_cols",
            KernelSpec::CollapseRows { .. } => "collapse_rows",
            KernelSpec::BlockDiag { .. } => "block_diag",
            KernelSpec::Concat { .. } => "concat",
            KernelSpec::Paged { .. } => "paged",
            KernelSpec::Combine { .. } => "combine",
            KernelSpec::SinkGrad { .. } => "sink_grad",
            KernelSpec::Rope { .. } => "rope",
            KernelSpec::Attention { .. } => "attention",
            KernelSpec::Reduce { .. } => "reduce",
            KernelSpec::LooMean { .. } => "loo_mean",
            KernelSpec::Group { .. } => "group",
            KernelSpec::Contract { .. } => "contract",
            KernelSpec::AttentionLse { .. } => "attention_lse",
            KernelSpec::MixedAttention { pass, .. } => pass.name(),
            KernelSpec::AttentionGrad { wrt: AttnArg::Q, .. } => "attention_grad_q",
            KernelSpec::AttentionGrad { wrt: AttnArg::K, dv: Some(_), .. } => "attention_grad_kv",
            KernelSpec::AttentionGrad { wrt: AttnArg::K, .. } => "attention_grad_k",
            KernelSpec::AttentionGrad { wrt: AttnArg::V, .. } => "attention_grad_v",
            KernelSpec::AttentionGrad { wrt: AttnArg::Read(_), .. } | KernelSpec::AttentionReadLines { .. } => {
                "attention_grad_read"
            }
            KernelSpec::AttentionReadSum { .. } => "attention_grad_read_sum",
        }
    }
}

/// The most cubes along any grid axis that every backend launches (CUDA's y
/// and z limit, WebGPU's limit on all three).
pub const MAX_GRID: usize = 65_535;

/// Loop iterations one unit may run on Mesa's CPU drivers (llvmpipe,
/// lavapipe): they count every loop back-edge of an invocation against one
/// limit of 65 535 and, past it, leave every loop silently. Kernels unroll
/// their inner loops so that only tiles and steps count (see [`KernelSpec::loop_trips`]).
pub const LOOP_TRIPS_CPU: usize = 65_000;

/// The widest vector (4, 2 or 1 floats) dividing every length in `ns`.
pub fn line_size(ns: &[usize]) -> usize {
    [4, 2, 1].into_iter().find(|l| ns.iter().all(|n| n % l == 0)).unwrap_or(1)
}

/// The floats a launch holds in registers per row ([`KernelSpec::row_floats`]).
#[derive(Clone, Copy, Debug)]
pub struct RowFloats {
    pub held: usize,
    /// What they are, in words.
    pub what: &'static str,
    /// The vector counts of its two rows, which a lane count must divide.
    pub widths: (usize, usize),
    /// Lanes a row at most.
    pub widest: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Units per group-kernel cube (`kernels::unit_element` strides by it).
pub const GROUP_UNITS: usize = 256;
