//! The operations of the IR ([`Op`], with its `## Shape rules`) and their
//! option types: masks, binary, unary and reduction kinds, attention's operands.

use super::*;

/// Which (virtual) keys a query row may see. Rows are positions along the
/// sequence axis; with `block = P` each original token owns `P` consecutive
/// virtual rows (token `n`, pseudo `j` at row `n·P + j`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MaskKind {
    /// Every key is visible.
    None,
    /// Key row `j` is visible from query row `i` iff `j ≤ i` (IHA's `flat_causal`).
    Causal,
    /// Visible iff `j / block ≤ i / block`: a token's pseudo-queries see all of its
    /// own pseudo-keys and those of earlier tokens (IHA's `token_causal`).
    TokenCausal,
}

impl MaskKind {
    pub fn name(self) -> &'static str {
        match self {
            MaskKind::None => "none",
            MaskKind::Causal => "causal",
            MaskKind::TokenCausal => "token_causal",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mask {
    pub kind: MaskKind,
    /// A window of `w` original tokens: `Causal` sees `i − w·block < j ≤ i`;
    /// `TokenCausal` sees tokens `n − w < m ≤ n`; `None` sees `|n − m| < w`
    /// (tokens `n = i / block`, `m = j / block`).
    pub window: Option<u64>,
    /// Virtual rows per original token (IHA's `P`; 1 for ordinary attention).
    pub block: u64,
}

impl Mask {
    /// Whether query row `i` of `sq` sees key row `j` of `sk`: the definition
    /// every backend follows. With `sq ≠ sk` the queries are the *last* `sq`
    /// rows (a decode step over a key/value cache): query `i` stands at row
    /// `i + sk − sq` (FlashAttention's bottom-right alignment). When `sk < sq`
    /// the first `sq − sk` query rows of a causal mask see no key: their
    /// output is 0.
    pub fn visible(&self, i: u64, j: u64, sq: u64, sk: u64) -> bool {
        self.key_band(i, sq, sk).contains(&j)
    }

    /// The key rows query row `i` of `sq` sees among `sk`, `lo..hi`: every
    /// built-in mask shows a query one run of keys. Positions are shifted so
    /// that none is negative: query row `i` stands at `p = i + sk`, key row
    /// `j` at `j + sq` (token `n = p / block` against `m`); `Causal` sees
    /// positions `p − w·block < · ≤ p`, `TokenCausal` tokens `n − w < m ≤ n`,
    /// `None` tokens `|n − m| < w` (everything without a window). This is
    /// the one statement of the masks on the host: [`Mask::visible`] and
    /// the cost model's pair counts read it; the kernels' form is
    /// `gpu::kit::mask`, held to it tile by tile.
    pub fn key_band(&self, i: u64, sq: u64, sk: u64) -> std::ops::Range<u64> {
        let (p, b) = (i + sk, self.block.max(1));
        let n = p / b;
        let (lo, hi) = match (self.kind, self.window) {
            (MaskKind::None, None) => (0, u64::MAX),
            (MaskKind::None, Some(w)) => {
                ((n + 1).saturating_sub(w).saturating_mul(b), n.saturating_add(w).saturating_mul(b))
            }
            (MaskKind::Causal, w) => (w.map_or(0, |w| (p + 1).saturating_sub(w.saturating_mul(b))), p + 1),
            (MaskKind::TokenCausal, w) => (w.map_or(0, |w| (n + 1).saturating_sub(w).saturating_mul(b)), (n + 1) * b),
        };
        // Back to key rows, whose positions start at `sq`.
        let row = |x: u64| x.saturating_sub(sq).min(sk);
        row(lo)..row(hi).max(row(lo))
    }
}

#[cfg(test)]
mod mask_tests {
    use super::*;

    /// The band is the masks' rule pair by pair, as docs/semantics.md
    /// states it (written out here as the check), for equal and unequal
    /// lengths, windows of tokens and blocks of rows.
    #[test]
    fn key_bands_are_the_masks_pairs() {
        let rule = |m: &Mask, i: u64, j: u64, sq: u64, sk: u64| {
            let (i, j) = (i + sk, j + sq);
            let (n, t) = (i / m.block, j / m.block);
            match m.kind {
                MaskKind::None => m.window.is_none_or(|w| n.abs_diff(t) < w),
                MaskKind::Causal => j <= i && m.window.is_none_or(|w| i - j < w * m.block),
                MaskKind::TokenCausal => t <= n && m.window.is_none_or(|w| n - t < w),
            }
        };
        let mut pairs = 0;
        for kind in [MaskKind::None, MaskKind::Causal, MaskKind::TokenCausal] {
            for window in [None, Some(1), Some(2), Some(5)] {
                for block in [1u64, 2, 3] {
                    for (sq, sk) in [(1u64, 1u64), (4, 4), (1, 6), (3, 7), (6, 2), (5, 5), (9, 20), (20, 9)] {
                        let m = Mask { kind, window, block };
                        for i in 0..sq {
                            let band = m.key_band(i, sq, sk);
                            for j in 0..sk {
                                assert_eq!(
                                    band.contains(&j),
                                    rule(&m, i, j, sq, sk),
                                    "{m:?} sq = {sq} sk = {sk} ({i}, {j})"
                                );
                                pairs += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(pairs > 10_000, "{pairs} pairs");
    }
}

/// The kinds of elementwise operation (used by the reward estimators).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    /// 1.0 where `a ≥ b`, else 0.0.
    Ge,
    /// 1.0 where `a > b`, else 0.0.
    Gt,
    /// 1.0 where `a == b`, else 0.0.
    Eq,
    /// `a^b` (`powf`).
    Pow,
}

/// What a `Reduce` computes over its axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    /// The number of non-zero entries.
    Count,
    /// Population variance, or Bessel-corrected (divides by n − 1; n = 1 gives NaN).
    Var {
        bessel: bool,
    },
}

/// `√(2/π)`, the inner factor of GELU's tanh form.
pub const GELU_TANH_C: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of GELU's tanh form.
pub const GELU_TANH_A: f64 = 0.044_715;

/// Elementwise functions of one value; their meaning is
/// `docs/semantics.md` §5 (`ir::scalar`, which the interpreter runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Sqrt,
    Abs,
    Exp,
    Log,
    Log1p,
    Tanh,
    /// `1 / (1 + e^−x)`.
    Sigmoid,
    /// `log(1 + e^x)`.
    Softplus,
    /// `x · sigmoid(x)`.
    Silu,
    /// `x · Φ(x) = x/2 · (1 + erf(x/√2))`.
    Gelu,
    /// `x/2 · (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
    GeluTanh,
    Erf,
    Sin,
    Cos,
    Floor,
    Ceil,
    /// −1, 0 or 1 (NaN stays NaN).
    Sign,
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Ge => "ge",
            BinaryOp::Gt => "gt",
            BinaryOp::Eq => "eq",
            BinaryOp::Pow => "pow",
        }
    }
}

impl UnaryOp {
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Softplus => "softplus",
            UnaryOp::Silu => "silu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Erf => "erf",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Sign => "sign",
        }
    }

    /// Every unary operation, in declaration order.
    pub const ALL: [UnaryOp; 18] = {
        use UnaryOp::*;
        [
            Neg, Sqrt, Abs, Exp, Log, Log1p, Tanh, Sigmoid, Softplus, Silu, Gelu, GeluTanh, Erf, Sin, Cos, Floor, Ceil,
            Sign,
        ]
    };
}

impl BinaryOp {
    /// Every binary operation, in declaration order.
    pub const ALL: [BinaryOp; 10] = {
        use BinaryOp::*;
        [Add, Sub, Mul, Div, Max, Min, Ge, Gt, Eq, Pow]
    };
}

impl ReduceKind {
    /// Every reduction.
    pub const ALL: [ReduceKind; 7] = {
        use ReduceKind::*;
        [Sum, Mean, Max, Min, Count, Var { bessel: false }, Var { bessel: true }]
    };

    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Mean => "mean",
            ReduceKind::Max => "max",
            ReduceKind::Min => "min",
            ReduceKind::Count => "count",
            ReduceKind::Var { bessel: false } => "var",
            ReduceKind::Var { bessel: true } => "var_bessel",
        }
    }
}

/// Operation enums serialise (in plans and manifests) as their names.
macro_rules! serialize_as_name {
    ($($t:ty),*) => {$(
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }
    )*};
}
serialize_as_name!(BinaryOp, UnaryOp, ReduceKind, MaskKind, AttnArg);

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// The `index`-th declared input.
    /// ## Shape rules
    /// The declared shape.
    Input { index: usize },
    /// A constant scalar.
    /// ## Shape rules
    /// `[]`.
    Scalar { value: f64 },
    /// `a · b`, contracting the last axis of `a` with the first of the matrix `b`.
    /// ## Shape rules
    /// `a: [..., M, K]`, `b: [K, F]` → `[..., M, F]`.
    MatMul { a: NodeId, b: NodeId },
    /// Splits the last axis into heads and moves the head axis before the sequence axis.
    /// ## Shape rules
    /// `x: [..., S, H·d]` → `[..., H, S, d]`; `out[.., h, s, e] = x[.., s, h·d + e]`.
    SplitHeads { x: NodeId, heads: u64 },
    /// The inverse of `SplitHeads`.
    /// ## Shape rules
    /// `x: [..., H, S, d]` → `[..., S, H·d]`.
    MergeHeads { x: NodeId },
    /// A contraction over the head axis: `out[b,h,j,s,e] = Σ_m alpha[m,h,j] · x[b,m,s,e]`.
    /// ## Shape rules
    /// `x: [B, M, S, d]`, `alpha: [M, H, P]` → `[B, H, P, S, d]`.
    MixHeads { x: NodeId, alpha: NodeId },
    /// Token-major interleave: `out[b,h,s·P + j,e] = x[b,h,j,s,e]`.
    /// ## Shape rules
    /// `x: [B, H, P, S, d]` → `[B, H, S·P, d]`.
    Interleave { x: NodeId },
    /// The inverse of `Interleave` with `pseudo = P`.
    /// ## Shape rules
    /// `x: [B, H, S·P, d]` → `[B, H, P, S, d]`.
    Deinterleave { x: NodeId, pseudo: u64 },
    /// Keeps the per-head blocks of a collapse matrix: `out[h, h'·P + j] = r[h, h'·P + j]` if `h' = h`, else 0.
    /// ## Shape rules
    /// `r: [H, H·P]` → `[H, H·P]`, with `P = block`.
    BlockDiag { r: NodeId, block: u64 },
    /// A contraction over (source head, pseudo): `out[b,h,s,e] = Σ_{h',j} r[h, h'·P + j] · x[b,h',j,s,e]`.
    /// ## Shape rules
    /// `x: [B, H', P, S, d]`, `r: [H, H'·P]` → `[B, H, S, d]`.
    Collapse { x: NodeId, r: NodeId },
    /// Rotary position embedding at position `p = offset + s` for row `s` of the
    /// sequence axis (rotate-half pairing; a decode step's rows continue a
    /// cache's positions): for `i < d/2`, angle `p · base^(−2i/d)`,
    /// `out[.., s, i] = x[i]·cos − x[i + d/2]·sin`, `out[.., s, i + d/2] = x[i]·sin + x[i + d/2]·cos`.
    /// ## Shape rules
    /// `x: [..., S, d]` with `d` even → same shape.
    Rope { x: NodeId, base: f64, offset: Dim },
    /// `a` and `b` joined along `axis` (a key/value cache and a decode step's new rows).
    /// ## Shape rules
    /// `a: [.., A, ..]`, `b: [.., C, ..]`, equal but for `axis` → `[.., A + C, ..]`.
    Concat { a: NodeId, b: NodeId, axis: usize },
    /// `len` entries along `axis`, from its start or (`at_end`) up to its end
    /// (the parts of a concatenation's gradient).
    /// ## Shape rules
    /// `x: [.., A, ..]` → `[.., len, ..]`, `len ≤ A`.
    Slice { x: NodeId, axis: usize, len: Dim, at_end: bool },
    /// The rows of a paged key/value cache in sequence order (FlashAttention's
    /// `block_table`): `out[b, h, t] = cache[pages[b, t / PS], t % PS, h]`.
    /// ## Shape rules
    /// `cache: [NB, PS, H, d]`, `pages: [B, MP]` → `[B, H, MP·PS, d]`.
    Paged { cache: NodeId, pages: NodeId },
    /// Scaled dot-product attention, one softmax per query row over visible keys;
    /// query head `h` reads key/value head `h / (H / H_kv)`. A row that sees no key is 0.
    /// ## Shape rules
    /// `q: [B, H, S, d]`, `k: [B, H_kv, S, d]`, `v: [B, H_kv, S, e]`, `H_kv` divides `H`,
    /// `S` a multiple of `mask.block` → `[B, H, S, e]`.
    /// Score and mask functions (`fns`) apply to every logit after scaling.
    Attention { q: NodeId, k: NodeId, v: NodeId, mask: Mask, scale: f64, fns: Option<Box<AttnFns>> },
    /// Elementwise `op(a, b)` with numpy broadcasting.
    /// ## Shape rules
    /// Axes aligned from the end; each pair equal or one of them 1 (or missing).
    Binary { op: BinaryOp, a: NodeId, b: NodeId },
    /// Elementwise `op(x)`.
    /// ## Shape rules
    /// Same shape.
    Unary { op: UnaryOp, x: NodeId },
    /// A constant tensor, `values` row-major.
    /// ## Shape rules
    /// `shape`, whose product is `len(values)`.
    Constant { values: Vec<f64>, shape: Vec<u64> },
    /// A reduction over `axes` (sorted, distinct).
    /// ## Shape rules
    /// The reduced axes become 1 with `keepdim`, else disappear.
    Reduce { x: NodeId, kind: ReduceKind, axes: Vec<usize>, keepdim: bool },
    /// Leave-one-out mean along `axis`: `out[.., i, ..] = (Σ_j x[.., j, ..] − x[.., i, ..]) / (n − 1)`;
    /// the axis must have at least 2 entries at run time.
    /// ## Shape rules
    /// Same shape.
    LooMean { x: NodeId, axis: usize },
    /// Elementwise `cond ≠ 0 ? a : b` (the other branch is never evaluated for the result,
    /// so a NaN there does not leak).
    /// ## Shape rules
    /// The broadcast of the three shapes.
    Where { cond: NodeId, a: NodeId, b: NodeId },
    /// Ordinal decomposition of ratings into `levels − 1` indicators:
    /// `out[.., t] = 1[x ≥ t + 2]` for thresholds τ = t + 2 = 2..levels.
    /// ## Shape rules
    /// `x: [...]` → `[..., levels − 1]`.
    Thresholds { x: NodeId, levels: u64 },
    /// Head mixing as a linear map on the last axis (columns), with `d = cols / M`:
    /// `out[.., (h·P + j)·d + e] = Σ_m alpha[m,h,j] · y[.., m·d + e]`. Applied to a
    /// weight matrix it gives the folded projection W̃ of docs/semantics.md §2.
    /// ## Shape rules
    /// `y: [..., M·d]`, `alpha: [M, H, P]` → `[..., H·P·d]`.
    MixCols { y: NodeId, alpha: NodeId },
    /// Collapse as a linear map on the last axis, with `d = cols / C`:
    /// `out[.., h·d + e] = Σ_c r[h, c] · y[.., c·d + e]`.
    /// ## Shape rules
    /// `y: [..., C·d]`, `r: [H, C]` → `[..., H·d]`.
    CollapseCols { y: NodeId, r: NodeId },
    /// Collapse folded into the rows of an output projection, with `d = rows / H`:
    /// `out[c·d + e, f] = Σ_h r[h, c] · w[h·d + e, f]` (W̃_O of docs/semantics.md §2).
    /// ## Shape rules
    /// `w: [H·d, F]`, `r: [H, C]` → `[C·d, F]`.
    CollapseRows { w: NodeId, r: NodeId },
    /// Splits the head axis into (head, pseudo): `out[b, h, j, ..] = x[b, h·P + j, ..]`.
    /// ## Shape rules
    /// `x: [B, H·P, S, d]` → `[B, H, P, S, d]`.
    UnflattenHeads { x: NodeId, pseudo: u64 },
    /// The inverse of `UnflattenHeads`.
    /// ## Shape rules
    /// `x: [B, H, P, S, d]` → `[B, H·P, S, d]`.
    FlattenHeads { x: NodeId },
    /// Concatenation along the last axis (of two matrices' columns, as the optimizer merges weights).
    /// ## Shape rules
    /// `a: [..., F1]`, `b: [..., F2]` with equal leading axes → `[..., F1 + F2]` (known sizes).
    ConcatCols { a: NodeId, b: NodeId },
    /// Columns `start .. start + len` of the last axis.
    /// ## Shape rules
    /// `x: [..., F]` with `start + len ≤ F` (known) → `[..., len]`.
    SliceCols { x: NodeId, start: u64, len: u64 },

    // The operations below appear in gradient programs (`grad.rs`) only.
    /// The transpose of a matrix.
    /// ## Shape rules
    /// `x: [K, F]` → `[F, K]`.
    Transpose { x: NodeId },
    /// `aᵀ · b` over all leading axes: `out[k, f] = Σ_r a[r, k] · b[r, f]` with `r`
    /// running over every leading index (a weight's gradient).
    /// ## Shape rules
    /// `a: [..., K]`, `b: [..., F]` with equal leading axes → `[K, F]`.
    MatMulAt { a: NodeId, b: NodeId },
    /// Size-1 axes inserted so that they stand at `axes` (sorted) of the result.
    /// ## Shape rules
    /// `x` of rank `r` → rank `r + len(axes)`.
    Unsqueeze { x: NodeId, axes: Vec<usize> },
    /// The transpose of `MixHeads` in `x`: `out[b,m,s,e] = Σ_{h,j} alpha[m,h,j] · y[b,h,j,s,e]`.
    /// ## Shape rules
    /// `y: [B, H, P, S, d]`, `alpha: [M, H, P]` → `[B, M, S, d]`.
    MixHeadsT { y: NodeId, alpha: NodeId },
    /// The gradient of `MixHeads` in `alpha`: `out[m,h,j] = Σ_{b,s,e} x[b,m,s,e] · dy[b,h,j,s,e]`.
    /// ## Shape rules
    /// `x: [B, M, S, d]`, `dy: [B, H, P, S, d]` → `[M, H, P]`.
    MixHeadsGrad { x: NodeId, dy: NodeId },
    /// The transpose of `Collapse` in `x`: `out[b,h',j,s,e] = Σ_h r[h, h'·P + j] · dy[b,h,s,e]`.
    /// ## Shape rules
    /// `dy: [B, H, S, d]`, `r: [H, H'·P]` → `[B, H', P, S, d]` with `P = pseudo`.
    CollapseT { dy: NodeId, r: NodeId, pseudo: u64 },
    /// The gradient of `Collapse` in `r`: `out[h, h'·P + j] = Σ_{b,s,e} dy[b,h,s,e] · x[b,h',j,s,e]`.
    /// ## Shape rules
    /// `x: [B, H', P, S, d]`, `dy: [B, H, S, d]` → `[H, H'·P]`.
    CollapseGrad { x: NodeId, dy: NodeId },
    /// The transpose of `MixCols` in `y`: `out[.., m·d + e] = Σ_{h,j} alpha[m,h,j] · dy[.., (h·P + j)·d + e]`.
    /// ## Shape rules
    /// `dy: [..., H·P·d]`, `alpha: [M, H, P]` → `[..., M·d]`.
    MixColsT { dy: NodeId, alpha: NodeId },
    /// The gradient of `MixCols` in `alpha`: `out[m,h,j] = Σ_{r,e} y[r, m·d + e] · dy[r, (h·P + j)·d + e]`
    /// over every leading index `r`.
    /// ## Shape rules
    /// `y: [..., M·d]`, `dy: [..., H·P·d]` (equal leading axes) → `[M, H, P]` with `M = m`, `H = h`, `P = p`.
    MixColsGrad { y: NodeId, dy: NodeId, m: u64, h: u64, p: u64 },
    /// The gradient of `CollapseCols` in `r`: `out[h, c] = Σ_{r,e} dy[r, h·d + e] · y[r, c·d + e]`.
    /// ## Shape rules
    /// `y: [..., C·d]`, `dy: [..., H·d]` (equal leading axes) → `[H, C]` with `H = h`.
    CollapseColsGrad { y: NodeId, dy: NodeId, h: u64 },
    /// The gradient of `CollapseRows` in `r`: `out[h, c] = Σ_{e,f} w[h·d + e, f] · dy[c·d + e, f]`.
    /// ## Shape rules
    /// `w: [H·d, F]`, `dy: [C·d, F]` → `[H, C]` with `H = h`.
    CollapseRowsGrad { w: NodeId, dy: NodeId, h: u64 },
    /// Per query row of `Attention`, the log-sum-exp of its scaled visible
    /// scores (−∞ for a row that sees no key): what the backward saves.
    /// ## Shape rules
    /// `q: [B, H, S, d]`, `k: [B, H_kv, S_k, d]` → `[B, H, S]`.
    AttentionLse { q: NodeId, k: NodeId, mask: Mask, scale: f64, fns: Option<Box<AttnFns>> },
    /// With head mixing inside attention (docs/semantics.md §7), per query
    /// row and softmax head `h`, `D[h] = Σ_j p[h, j] · dp[h, j]` with
    /// `dp[h, j] = Σ_g wp[h, g] · dO[g] · v[kv'(g), j]`: what the backward's
    /// `ds̃ = p (dp − D)` subtracts (without mixing it is `rowsum(dO ∘ O)`,
    /// which the backward kernels compute themselves).
    /// ## Shape rules
    /// `q`, `k`, `v` as `Attention`'s, `dout` its output's shape, `lse`
    /// `AttentionLse`'s → `[B, H_s, S]`.
    AttentionDelta {
        q: NodeId,
        k: NodeId,
        v: NodeId,
        dout: NodeId,
        lse: NodeId,
        mask: Mask,
        scale: f64,
        fns: Option<Box<AttnFns>>,
    },
    /// FlashAttention's backward: the gradient of `Attention` in its `wrt`
    /// operand, from the forward output `o`, its cotangent `dout` and the rows'
    /// `lse`; probabilities are recomputed, never stored.
    /// With head mixing, `o` is `AttentionDelta`'s `D` and the gradient of
    /// a mixing matrix comes per query row, to be summed over batch and rows.
    /// ## Shape rules
    /// As `Attention`'s operands; the result has the shape of `q`, `k` or `v`
    /// (of a read tensor; `[B, S, rows, cols]` for a mixing matrix).
    AttentionGrad {
        q: NodeId,
        k: NodeId,
        v: NodeId,
        o: NodeId,
        dout: NodeId,
        lse: NodeId,
        mask: Mask,
        scale: f64,
        wrt: AttnArg,
        fns: Option<Box<AttnFns>>,
    },
}

/// An operand of attention (what `AttentionGrad` differentiates by).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnArg {
    Q,
    K,
    V,
    /// The `n`-th tensor the score function reads (`AttnFns::captures`).
    Read(usize),
}

impl AttnArg {
    pub fn name(self) -> &'static str {
        match self {
            AttnArg::Q => "q",
            AttnArg::K => "k",
            AttnArg::V => "v",
            AttnArg::Read(_) => "read",
        }
    }
}
