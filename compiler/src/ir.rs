//! The typed IR: a program is an arena of tensor operations in which every
//! operand precedes its user (so a program is already in evaluation order),
//! with symbolic sizes for dims (`B`, `N`, …) and concrete sizes for
//! everything bound from parameters.
//!
//! Each [`Op`] documents its `## Shape rules`; [`Op::infer`] is the single
//! implementation of them, used by lowering and by the validator alike.

use std::collections::BTreeMap;
use std::fmt::{self, Write};

/// A size: `coeff × Π symᵉ`, e.g. `2·N` or `B·N`. Kept normalised (symbols
/// sorted, no zero exponents), so structural equality is size equality.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim {
    coeff: u64,
    syms: Vec<(String, u32)>,
}

impl Dim {
    pub fn known(n: u64) -> Dim {
        Dim { coeff: n, syms: vec![] }
    }
    pub fn sym(name: &str) -> Dim {
        Dim { coeff: 1, syms: vec![(name.to_string(), 1)] }
    }
    /// The concrete size, when no symbol is involved.
    pub fn as_known(&self) -> Option<u64> {
        self.syms.is_empty().then_some(self.coeff)
    }
    pub fn coeff(&self) -> u64 {
        self.coeff
    }
    pub fn symbols(&self) -> impl Iterator<Item = (&str, u32)> {
        self.syms.iter().map(|(s, e)| (s.as_str(), *e))
    }
    pub fn mul(&self, other: &Dim) -> Option<Dim> {
        let mut syms: BTreeMap<String, u32> = self.syms.iter().cloned().collect();
        for (s, e) in &other.syms {
            *syms.entry(s.clone()).or_default() += e;
        }
        Some(Dim { coeff: self.coeff.checked_mul(other.coeff)?, syms: syms.into_iter().collect() })
    }
    /// `self / n` when the coefficient divides exactly.
    pub fn div_exact(&self, n: u64) -> Option<Dim> {
        (n != 0 && self.coeff % n == 0).then(|| Dim { coeff: self.coeff / n, syms: self.syms.clone() })
    }
    /// The concrete size under a binding of every symbol.
    pub fn eval(&self, bind: &impl Fn(&str) -> Option<u64>) -> Option<u64> {
        let mut v = self.coeff;
        for (s, e) in &self.syms {
            for _ in 0..*e {
                v = v.checked_mul(bind(s)?)?;
            }
        }
        Some(v)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if self.coeff != 1 || self.syms.is_empty() {
            parts.push(self.coeff.to_string());
        }
        for (s, e) in &self.syms {
            parts.extend(std::iter::repeat_n(s.clone(), *e as usize));
        }
        f.write_str(&parts.join("*"))
    }
}

/// Concrete values of a program's dims.
pub type DimValues = BTreeMap<String, u64>;

/// The concrete shape of `s` under `dims`. Every dim must be bound.
pub fn concrete(s: &Shape, dims: &DimValues) -> Vec<usize> {
    s.0.iter()
        .map(|d| d.eval(&|n| dims.get(n).copied()).expect("every dim is bound before evaluation") as usize)
        .collect()
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// Axis `i` counted from the end (`back(1)` is the last axis).
    pub fn back(&self, i: usize) -> &Dim {
        &self.0[self.0.len() - i]
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.0.iter().map(Dim::to_string).collect();
        write!(f, "[{}]", dims.join(", "))
    }
}

/// A handle to a node of a [`Program`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

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
        // Shift both sides so nothing is negative: query row i + sk, key row j + sq.
        let (i, j) = (i + sk, j + sq);
        let (n, m) = (i / self.block, j / self.block);
        match self.kind {
            MaskKind::None => self.window.is_none_or(|w| n.abs_diff(m) < w),
            MaskKind::Causal => j <= i && self.window.is_none_or(|w| i - j < w.saturating_mul(self.block)),
            MaskKind::TokenCausal => m <= n && self.window.is_none_or(|w| n - m < w),
        }
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Sqrt,
    Abs,
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
        }
    }
}

impl UnaryOp {
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Abs => "abs",
        }
    }
}

impl ReduceKind {
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
    /// Rotary position embedding by row index `p` along the sequence axis (rotate-half
    /// pairing): for `i < d/2`, angle `p · base^(−2i/d)`,
    /// `out[.., p, i] = x[i]·cos − x[i + d/2]·sin`, `out[.., p, i + d/2] = x[i]·sin + x[i + d/2]·cos`.
    /// ## Shape rules
    /// `x: [..., S, d]` with `d` even → same shape.
    Rope { x: NodeId, base: f64 },
    /// Scaled dot-product attention, one softmax per query row over visible keys;
    /// query head `h` reads key/value head `h / (H / H_kv)`. A row that sees no key is 0.
    /// ## Shape rules
    /// `q: [B, H, S, d]`, `k: [B, H_kv, S, d]`, `v: [B, H_kv, S, e]`, `H_kv` divides `H`,
    /// `S` a multiple of `mask.block` → `[B, H, S, e]`.
    Attention { q: NodeId, k: NodeId, v: NodeId, mask: Mask, scale: f64 },
    /// Elementwise `op(a, b)` with numpy broadcasting.
    /// ## Shape rules
    /// Axes aligned from the end; each pair equal or one of them 1 (or missing).
    Binary { op: BinaryOp, a: NodeId, b: NodeId },
    /// Elementwise `op(x)`.
    /// ## Shape rules
    /// Same shape.
    Unary { op: UnaryOp, x: NodeId },
    /// A constant vector.
    /// ## Shape rules
    /// `[len(values)]`.
    Constant { values: Vec<f64> },
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
    AttentionLse { q: NodeId, k: NodeId, mask: Mask, scale: f64 },
    /// FlashAttention's backward: the gradient of `Attention` in its `wrt`
    /// operand, from the forward output `o`, its cotangent `dout` and the rows'
    /// `lse`; probabilities are recomputed, never stored.
    /// ## Shape rules
    /// As `Attention`'s operands; the result has the shape of `q`, `k` or `v`.
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
    },
}

/// An operand of attention (what `AttentionGrad` differentiates by).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnArg {
    Q,
    K,
    V,
}

impl AttnArg {
    pub fn name(self) -> &'static str {
        match self {
            AttnArg::Q => "q",
            AttnArg::K => "k",
            AttnArg::V => "v",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError {
    pub kind: ShapeErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeErrorKind {
    Mismatch,
    Rank,
    NotDivisible,
    BadSize,
}

fn err<T>(kind: ShapeErrorKind, message: String) -> Result<T, ShapeError> {
    Err(ShapeError { kind, message })
}

fn want_rank(what: &str, s: &Shape, rank: usize) -> Result<(), ShapeError> {
    if s.rank() != rank {
        return err(ShapeErrorKind::Rank, format!("{what} must have {rank} axes, but has shape {s}"));
    }
    Ok(())
}

fn want_min_rank(what: &str, s: &Shape, rank: usize) -> Result<(), ShapeError> {
    if s.rank() < rank {
        return err(ShapeErrorKind::Rank, format!("{what} must have at least {rank} axes, but has shape {s}"));
    }
    Ok(())
}

impl Op {
    /// Operands in order.
    pub fn operands(&self) -> Vec<NodeId> {
        match *self {
            Op::Input { .. } | Op::Scalar { .. } | Op::Constant { .. } => vec![],
            Op::Reduce { x, .. } | Op::LooMean { x, .. } | Op::Thresholds { x, .. } => vec![x],
            Op::Where { cond, a, b } => vec![cond, a, b],
            Op::MixCols { y, alpha } => vec![y, alpha],
            Op::CollapseCols { y, r } => vec![y, r],
            Op::CollapseRows { w, r } => vec![w, r],
            Op::UnflattenHeads { x, .. } | Op::FlattenHeads { x } | Op::SliceCols { x, .. } => vec![x],
            Op::ConcatCols { a, b } => vec![a, b],
            Op::MatMul { a, b } | Op::Binary { a, b, .. } => vec![a, b],
            Op::SplitHeads { x, .. }
            | Op::MergeHeads { x }
            | Op::Interleave { x }
            | Op::Deinterleave { x, .. }
            | Op::Rope { x, .. }
            | Op::Unary { x, .. } => vec![x],
            Op::MixHeads { x, alpha } => vec![x, alpha],
            Op::BlockDiag { r, .. } => vec![r],
            Op::Collapse { x, r } => vec![x, r],
            Op::Attention { q, k, v, .. } => vec![q, k, v],
            Op::Transpose { x } | Op::Unsqueeze { x, .. } => vec![x],
            Op::MatMulAt { a, b } => vec![a, b],
            Op::MixHeadsT { y, alpha } => vec![y, alpha],
            Op::MixHeadsGrad { x, dy } | Op::CollapseGrad { x, dy } => vec![x, dy],
            Op::CollapseT { dy, r, .. } => vec![dy, r],
            Op::AttentionLse { q, k, .. } => vec![q, k],
            Op::MixColsT { dy, alpha } => vec![dy, alpha],
            Op::MixColsGrad { y, dy, .. } | Op::CollapseColsGrad { y, dy, .. } => vec![y, dy],
            Op::CollapseRowsGrad { w, dy, .. } => vec![w, dy],
            Op::AttentionGrad { q, k, v, o, dout, lse, .. } => vec![q, k, v, o, dout, lse],
        }
    }

    /// Rewrites every operand handle through `f`.
    pub fn map_operands(&mut self, mut f: impl FnMut(NodeId) -> NodeId) {
        match self {
            Op::Input { .. } | Op::Scalar { .. } | Op::Constant { .. } => {}
            Op::MatMul { a, b } | Op::Binary { a, b, .. } | Op::ConcatCols { a, b } => {
                *a = f(*a);
                *b = f(*b);
            }
            Op::MixCols { y: x, alpha: y } | Op::CollapseCols { y: x, r: y } | Op::CollapseRows { w: x, r: y } => {
                *x = f(*x);
                *y = f(*y);
            }
            Op::UnflattenHeads { x, .. } | Op::FlattenHeads { x } | Op::SliceCols { x, .. } => *x = f(*x),
            Op::SplitHeads { x, .. }
            | Op::MergeHeads { x }
            | Op::Interleave { x }
            | Op::Deinterleave { x, .. }
            | Op::Rope { x, .. }
            | Op::Unary { x, .. }
            | Op::Reduce { x, .. }
            | Op::LooMean { x, .. }
            | Op::Thresholds { x, .. }
            | Op::BlockDiag { r: x, .. } => *x = f(*x),
            Op::MixHeads { x, alpha: y } | Op::Collapse { x, r: y } => {
                *x = f(*x);
                *y = f(*y);
            }
            Op::Attention { q: a, k: b, v: c, .. } | Op::Where { cond: a, a: b, b: c } => {
                *a = f(*a);
                *b = f(*b);
                *c = f(*c);
            }
            Op::Transpose { x } | Op::Unsqueeze { x, .. } => *x = f(*x),
            Op::MatMulAt { a: x, b: y }
            | Op::MixHeadsT { y: x, alpha: y }
            | Op::MixHeadsGrad { x, dy: y }
            | Op::CollapseGrad { x, dy: y }
            | Op::CollapseT { dy: x, r: y, .. }
            | Op::AttentionLse { q: x, k: y, .. }
            | Op::MixColsT { dy: x, alpha: y }
            | Op::MixColsGrad { y: x, dy: y, .. }
            | Op::CollapseColsGrad { y: x, dy: y, .. }
            | Op::CollapseRowsGrad { w: x, dy: y, .. } => {
                *x = f(*x);
                *y = f(*y);
            }
            Op::AttentionGrad { q, k, v, o, dout, lse, .. } => {
                for id in [q, k, v, o, dout, lse] {
                    *id = f(*id);
                }
            }
        }
    }

    /// The result shape, from the operands' shapes. `Input` has no rule here:
    /// its shape is the declaration's.
    pub fn infer(&self, shape: &dyn Fn(NodeId) -> Shape) -> Result<Shape, ShapeError> {
        use ShapeErrorKind::*;
        Ok(match *self {
            Op::Input { .. } => unreachable!("inputs carry their declared shape"),
            Op::Scalar { .. } => Shape(vec![]),
            Op::MatMul { a, b } => {
                let (sa, sb) = (shape(a), shape(b));
                want_min_rank("the left operand of `@`", &sa, 2)?;
                want_rank("the right operand of `@` (a weight matrix)", &sb, 2)?;
                if sa.back(1) != &sb.0[0] {
                    return err(
                        Mismatch,
                        format!("cannot multiply {sa} by {sb}: inner sizes {} and {} differ", sa.back(1), sb.0[0]),
                    );
                }
                let mut out = sa.0.clone();
                *out.last_mut().unwrap() = sb.0[1].clone();
                Shape(out)
            }
            Op::SplitHeads { x, heads } => {
                let s = shape(x);
                want_min_rank("the operand of `split_heads`", &s, 2)?;
                if heads == 0 {
                    return err(BadSize, "the number of heads must be at least 1".into());
                }
                let Some(d) = s.back(1).div_exact(heads) else {
                    return err(NotDivisible, format!("the last axis of {s} does not split into {heads} heads"));
                };
                let mut out = s.0[..s.rank() - 1].to_vec();
                out.insert(s.rank() - 2, Dim::known(heads));
                out.push(d);
                Shape(out)
            }
            Op::MergeHeads { x } => {
                let s = shape(x);
                want_min_rank("the operand of `merge_heads`", &s, 3)?;
                let r = s.rank();
                let merged =
                    s.0[r - 3].mul(&s.0[r - 1]).ok_or(ShapeError { kind: BadSize, message: "size overflow".into() })?;
                let mut out = s.0[..r - 3].to_vec();
                out.push(s.0[r - 2].clone());
                out.push(merged);
                Shape(out)
            }
            Op::MixHeads { x, alpha } => {
                let (sx, sa) = (shape(x), shape(alpha));
                want_rank("the operand of `mix_heads`", &sx, 4)?;
                want_rank("the mixing coefficients", &sa, 3)?;
                if sa.0[0] != sx.0[1] {
                    return err(
                        Mismatch,
                        format!(
                            "mixing coefficients {sa} expect {} source heads, but the operand {sx} has {}",
                            sa.0[0], sx.0[1]
                        ),
                    );
                }
                Shape(vec![sx.0[0].clone(), sa.0[1].clone(), sa.0[2].clone(), sx.0[2].clone(), sx.0[3].clone()])
            }
            Op::Interleave { x } => {
                let s = shape(x);
                want_rank("the operand of `interleave`", &s, 5)?;
                let rows = s.0[3].mul(&s.0[2]).ok_or(ShapeError { kind: BadSize, message: "size overflow".into() })?;
                Shape(vec![s.0[0].clone(), s.0[1].clone(), rows, s.0[4].clone()])
            }
            Op::Deinterleave { x, pseudo } => {
                let s = shape(x);
                want_rank("the operand of `deinterleave`", &s, 4)?;
                let Some(n) = s.0[2].div_exact(pseudo) else {
                    return err(
                        NotDivisible,
                        format!("the sequence axis {} of {s} is not a multiple of {pseudo} pseudo-heads", s.0[2]),
                    );
                };
                Shape(vec![s.0[0].clone(), s.0[1].clone(), Dim::known(pseudo), n, s.0[3].clone()])
            }
            Op::BlockDiag { r, block } => {
                let s = shape(r);
                want_rank("the collapse matrix", &s, 2)?;
                if s.0[0].mul(&Dim::known(block)).as_ref() != Some(&s.0[1]) {
                    return err(
                        Mismatch,
                        format!("a per-head collapse matrix must be [H, H*{block}], but has shape {s}"),
                    );
                }
                s
            }
            Op::Collapse { x, r } => {
                let (sx, sr) = (shape(x), shape(r));
                want_rank("the operand of `collapse`", &sx, 5)?;
                want_rank("the collapse matrix", &sr, 2)?;
                let cols = sx.0[1].mul(&sx.0[2]);
                if cols.as_ref() != Some(&sr.0[1]) {
                    return err(
                        Mismatch,
                        format!(
                            "collapse matrix {sr} must have {} columns (heads × pseudo-heads of {sx})",
                            cols.map_or("?".into(), |c| c.to_string())
                        ),
                    );
                }
                Shape(vec![sx.0[0].clone(), sr.0[0].clone(), sx.0[3].clone(), sx.0[4].clone()])
            }
            Op::Rope { x, .. } => {
                let s = shape(x);
                want_min_rank("the operand of `rope`", &s, 2)?;
                if s.back(1).as_known().is_none_or(|d| d % 2 != 0) {
                    return err(
                        NotDivisible,
                        format!("rope needs an even, known head width, but the operand has shape {s}"),
                    );
                }
                s
            }
            Op::Attention { q, k, v, mask, .. } => {
                let (sq, sk, sv) = (shape(q), shape(k), shape(v));
                want_rank("the queries", &sq, 4)?;
                want_rank("the keys", &sk, 4)?;
                want_rank("the values", &sv, 4)?;
                if sk.0[..3] != sv.0[..3] {
                    return err(Mismatch, format!("keys {sk} and values {sv} differ in batch, heads or length"));
                }
                if sq.0[0] != sk.0[0] || sq.0[3] != sk.0[3] {
                    return err(Mismatch, format!("queries {sq} and keys {sk} differ in batch or width"));
                }
                let (hq, hk) = (sq.0[1].as_known(), sk.0[1].as_known());
                match (hq, hk) {
                    (Some(hq), Some(hk)) if hk > 0 && hq % hk == 0 => {}
                    _ => {
                        return err(
                            NotDivisible,
                            format!("key/value heads ({}) must divide query heads ({})", sk.0[1], sq.0[1]),
                        )
                    }
                }
                for axis in [&sq.0[2], &sk.0[2]] {
                    if mask.block == 0 || axis.div_exact(mask.block).is_none() {
                        return err(
                            NotDivisible,
                            format!("the sequence axis {axis} is not a multiple of the block size {}", mask.block),
                        );
                    }
                }
                if mask.window == Some(0) {
                    return err(BadSize, "the window must be at least 1 token".into());
                }
                Shape(vec![sq.0[0].clone(), sq.0[1].clone(), sq.0[2].clone(), sv.0[3].clone()])
            }
            Op::Transpose { x } => {
                let s = shape(x);
                want_rank("the operand of a transpose", &s, 2)?;
                Shape(vec![s.0[1].clone(), s.0[0].clone()])
            }
            Op::MatMulAt { a, b } => {
                let (sa, sb) = (shape(a), shape(b));
                want_min_rank("the left operand of `aᵀ·b`", &sa, 1)?;
                if sa.rank() != sb.rank() || sa.0[..sa.rank() - 1] != sb.0[..sb.rank() - 1] {
                    return err(Mismatch, format!("`aᵀ·b` needs equal leading axes, but has {sa} and {sb}"));
                }
                Shape(vec![sa.back(1).clone(), sb.back(1).clone()])
            }
            Op::Unsqueeze { x, ref axes } => {
                let s = shape(x);
                let rank = s.rank() + axes.len();
                if axes.windows(2).any(|w| w[0] >= w[1]) || axes.iter().any(|a| *a >= rank) {
                    return err(BadSize, format!("cannot insert axes {axes:?} into {s}"));
                }
                let mut rest = s.0.into_iter();
                Shape((0..rank).map(|i| if axes.contains(&i) { Dim::known(1) } else { rest.next().unwrap() }).collect())
            }
            Op::MixHeadsT { y, alpha } => {
                let (sy, sa) = (shape(y), shape(alpha));
                want_rank("the operand of a transposed head mixing", &sy, 5)?;
                want_rank("the mixing coefficients", &sa, 3)?;
                if sa.0[1..] != sy.0[1..3] {
                    return err(Mismatch, format!("mixing coefficients {sa} do not match the mixed heads {sy}"));
                }
                Shape(vec![sy.0[0].clone(), sa.0[0].clone(), sy.0[3].clone(), sy.0[4].clone()])
            }
            Op::MixHeadsGrad { x, dy } => {
                let (sx, sy) = (shape(x), shape(dy));
                want_rank("the mixed operand", &sx, 4)?;
                want_rank("the mixing's cotangent", &sy, 5)?;
                if sx.0[0] != sy.0[0] || sx.0[2..] != sy.0[3..] {
                    return err(Mismatch, format!("head mixing's operand {sx} and cotangent {sy} differ"));
                }
                Shape(vec![sx.0[1].clone(), sy.0[1].clone(), sy.0[2].clone()])
            }
            Op::CollapseT { dy, r, pseudo } => {
                let (sy, sr) = (shape(dy), shape(r));
                want_rank("the collapse's cotangent", &sy, 4)?;
                want_rank("the collapse matrix", &sr, 2)?;
                let Some(heads) = sr.0[1].div_exact(pseudo).filter(|_| sr.0[0] == sy.0[1]) else {
                    return err(
                        Mismatch,
                        format!("collapse matrix {sr} does not match cotangent {sy} and P = {pseudo}"),
                    );
                };
                Shape(vec![sy.0[0].clone(), heads, Dim::known(pseudo), sy.0[2].clone(), sy.0[3].clone()])
            }
            Op::CollapseGrad { x, dy } => {
                let (sx, sy) = (shape(x), shape(dy));
                want_rank("the collapsed operand", &sx, 5)?;
                want_rank("the collapse's cotangent", &sy, 4)?;
                if sx.0[0] != sy.0[0] || sx.0[3..] != sy.0[2..] {
                    return err(Mismatch, format!("collapse's operand {sx} and cotangent {sy} differ"));
                }
                let cols =
                    sx.0[1].mul(&sx.0[2]).ok_or(ShapeError { kind: BadSize, message: "size overflow".into() })?;
                Shape(vec![sy.0[1].clone(), cols])
            }
            Op::MixColsT { dy, alpha } => {
                let (sy, sa) = (shape(dy), shape(alpha));
                want_min_rank("the cotangent of a column mixing", &sy, 1)?;
                want_rank("the mixing coefficients", &sa, 3)?;
                let targets =
                    sa.0[1].mul(&sa.0[2]).ok_or(ShapeError { kind: BadSize, message: "size overflow".into() })?;
                let d = match (sy.back(1).as_known(), targets.as_known()) {
                    (Some(cols), Some(t)) if t > 0 && cols % t == 0 => cols / t,
                    _ => return err(NotDivisible, format!("columns of {sy} do not split over {sa}'s targets")),
                };
                let mut out = sy.0.clone();
                *out.last_mut().unwrap() = sa.0[0].mul(&Dim::known(d)).unwrap();
                Shape(out)
            }
            Op::MixColsGrad { y, dy, m, h, p } => {
                let (sy, sd) = (shape(y), shape(dy));
                want_min_rank("a mixed operand", &sy, 1)?;
                if sy.rank() != sd.rank() || sy.0[..sy.rank() - 1] != sd.0[..sd.rank() - 1] {
                    return err(Mismatch, format!("column mixing's operand {sy} and cotangent {sd} differ"));
                }
                Shape(vec![Dim::known(m), Dim::known(h), Dim::known(p)])
            }
            Op::CollapseColsGrad { y, dy, h } => {
                let (sy, sd) = (shape(y), shape(dy));
                want_min_rank("a collapsed operand", &sy, 1)?;
                if sy.rank() != sd.rank() || sy.0[..sy.rank() - 1] != sd.0[..sd.rank() - 1] {
                    return err(Mismatch, format!("column collapse's operand {sy} and cotangent {sd} differ"));
                }
                let c = match (sy.back(1).as_known(), sd.back(1).as_known()) {
                    (Some(yc), Some(dc)) if h > 0 && dc % h == 0 && dc / h > 0 && yc % (dc / h) == 0 => yc / (dc / h),
                    _ => return err(NotDivisible, format!("{sy} and {sd} do not split into {h} heads")),
                };
                Shape(vec![Dim::known(h), Dim::known(c)])
            }
            Op::CollapseRowsGrad { w, dy, h } => {
                let (sw, sd) = (shape(w), shape(dy));
                want_rank("the folded weight", &sw, 2)?;
                want_rank("its cotangent", &sd, 2)?;
                let c = match (sw.0[0].as_known(), sd.0[0].as_known()) {
                    (Some(wr), Some(dr)) if h > 0 && wr % h == 0 && wr / h > 0 && dr % (wr / h) == 0 => dr / (wr / h),
                    _ => return err(NotDivisible, format!("{sw} and {sd} do not split into {h} heads")),
                };
                Shape(vec![Dim::known(h), Dim::known(c)])
            }
            Op::AttentionLse { q, k, .. } => {
                let (sq, sk) = (shape(q), shape(k));
                want_rank("the queries", &sq, 4)?;
                want_rank("the keys", &sk, 4)?;
                Shape(sq.0[..3].to_vec())
            }
            Op::AttentionGrad { q, k, v, o, dout, lse, wrt, .. } => {
                let (sq, so, sd, sl) = (shape(q), shape(o), shape(dout), shape(lse));
                if so != sd || sl.0[..] != sq.0[..3] {
                    return err(
                        Mismatch,
                        format!("attention's output {so}, cotangent {sd} and row statistics {sl} differ"),
                    );
                }
                match wrt {
                    AttnArg::Q => sq,
                    AttnArg::K => shape(k),
                    AttnArg::V => shape(v),
                }
            }
            Op::Binary { a, b, op } => broadcast(&shape(a), &shape(b))
                .map_err(|m| ShapeError { kind: Mismatch, message: format!("`{op:?}`: {m}") })?,
            Op::Unary { x, .. } => shape(x),
            Op::Constant { ref values } => Shape(vec![Dim::known(values.len() as u64)]),
            Op::Reduce { x, ref axes, keepdim, .. } => {
                let s = shape(x);
                if axes.is_empty() || axes.windows(2).any(|w| w[0] >= w[1]) || axes.iter().any(|a| *a >= s.rank()) {
                    return err(Rank, format!("cannot reduce axes {axes:?} of {s}"));
                }
                let dims = s.0.iter().enumerate().filter_map(|(i, d)| match (axes.contains(&i), keepdim) {
                    (false, _) => Some(d.clone()),
                    (true, true) => Some(Dim::known(1)),
                    (true, false) => None,
                });
                Shape(dims.collect())
            }
            Op::LooMean { x, axis } => {
                let s = shape(x);
                if axis >= s.rank() {
                    return err(Rank, format!("axis {axis} is out of range for {s}"));
                }
                s
            }
            Op::Where { cond, a, b } => {
                let mismatch = |m| ShapeError { kind: Mismatch, message: format!("`where`: {m}") };
                let ab = broadcast(&shape(a), &shape(b)).map_err(mismatch)?;
                broadcast(&shape(cond), &ab).map_err(mismatch)?
            }
            Op::MixCols { y, alpha } => {
                let (sy, sa) = (shape(y), shape(alpha));
                want_min_rank("the operand of a column mix", &sy, 1)?;
                want_rank("the mixing coefficients", &sa, 3)?;
                let (Some(m), Some(h), Some(p)) = (sa.0[0].as_known(), sa.0[1].as_known(), sa.0[2].as_known()) else {
                    return err(NotDivisible, format!("mixing coefficients {sa} must have known sizes"));
                };
                let Some(d) = sy.back(1).div_exact(m) else {
                    return err(NotDivisible, format!("the last axis of {sy} does not split into {m} heads"));
                };
                let mut out = sy.0.clone();
                *out.last_mut().unwrap() = d.mul(&Dim::known(h * p)).unwrap();
                Shape(out)
            }
            Op::CollapseCols { y, r } => {
                let (sy, sr) = (shape(y), shape(r));
                want_min_rank("the operand of a column collapse", &sy, 1)?;
                want_rank("the collapse matrix", &sr, 2)?;
                let (Some(h), Some(c)) = (sr.0[0].as_known(), sr.0[1].as_known()) else {
                    return err(NotDivisible, format!("collapse matrix {sr} must have known sizes"));
                };
                let Some(d) = sy.back(1).div_exact(c) else {
                    return err(NotDivisible, format!("the last axis of {sy} does not split into {c} pseudo-heads"));
                };
                let mut out = sy.0.clone();
                *out.last_mut().unwrap() = d.mul(&Dim::known(h)).unwrap();
                Shape(out)
            }
            Op::CollapseRows { w, r } => {
                let (sw, sr) = (shape(w), shape(r));
                want_rank("the projection", &sw, 2)?;
                want_rank("the collapse matrix", &sr, 2)?;
                let (Some(h), Some(c)) = (sr.0[0].as_known(), sr.0[1].as_known()) else {
                    return err(NotDivisible, format!("collapse matrix {sr} must have known sizes"));
                };
                let Some(d) = sw.0[0].div_exact(h) else {
                    return err(NotDivisible, format!("the rows of {sw} do not split into {h} heads"));
                };
                Shape(vec![d.mul(&Dim::known(c)).unwrap(), sw.0[1].clone()])
            }
            Op::UnflattenHeads { x, pseudo } => {
                let s = shape(x);
                want_rank("the operand of `unflatten_heads`", &s, 4)?;
                let Some(h) = s.0[1].div_exact(pseudo) else {
                    return err(NotDivisible, format!("the head axis of {s} is not a multiple of {pseudo}"));
                };
                Shape(vec![s.0[0].clone(), h, Dim::known(pseudo), s.0[2].clone(), s.0[3].clone()])
            }
            Op::FlattenHeads { x } => {
                let s = shape(x);
                want_rank("the operand of `flatten_heads`", &s, 5)?;
                let hp = s.0[1].mul(&s.0[2]).ok_or(ShapeError { kind: BadSize, message: "size overflow".into() })?;
                Shape(vec![s.0[0].clone(), hp, s.0[3].clone(), s.0[4].clone()])
            }
            Op::ConcatCols { a, b } => {
                let (sa, sb) = (shape(a), shape(b));
                want_min_rank("a concatenated operand", &sa, 1)?;
                let same_rows = sa.rank() == sb.rank() && sa.0[..sa.rank() - 1] == sb.0[..sb.rank() - 1];
                match (sa.back(1).as_known(), sb.back(1).as_known()) {
                    (Some(x), Some(y)) if same_rows => {
                        let mut out = sa.0.clone();
                        *out.last_mut().unwrap() = Dim::known(x + y);
                        Shape(out)
                    }
                    _ => return err(Mismatch, format!("cannot concatenate the columns of {sa} and {sb}")),
                }
            }
            Op::SliceCols { x, start, len } => {
                let s = shape(x);
                want_min_rank("a sliced tensor", &s, 1)?;
                match s.back(1).as_known() {
                    Some(f) if len >= 1 && start.checked_add(len).is_some_and(|end| end <= f) => {
                        let mut out = s.0.clone();
                        *out.last_mut().unwrap() = Dim::known(len);
                        Shape(out)
                    }
                    _ => return err(Mismatch, format!("columns {start}..{} are out of range for {s}", start + len)),
                }
            }
            Op::Thresholds { x, levels } => {
                if levels < 2 {
                    return err(BadSize, format!("an ordinal decomposition needs at least 2 levels, not {levels}"));
                }
                let mut s = shape(x);
                s.0.push(Dim::known(levels - 1));
                s
            }
        })
    }
}

/// The numpy broadcast of two shapes.
pub fn broadcast(a: &Shape, b: &Shape) -> Result<Shape, String> {
    let rank = a.rank().max(b.rank());
    let one = Dim::known(1);
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = if i < rank - a.rank() { &one } else { &a.0[i - (rank - a.rank())] };
        let db = if i < rank - b.rank() { &one } else { &b.0[i - (rank - b.rank())] };
        out.push(if da == db || *db == one {
            da.clone()
        } else if *da == one {
            db.clone()
        } else {
            return Err(format!("shapes {a} and {b} do not broadcast"));
        });
    }
    Ok(Shape(out))
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub shape: Shape,
}

/// How `--seed` draws an input. Every value is a pure function of the seed
/// and the input's name (see the runtime's generator).
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    Uniform {
        lo: f64,
        hi: f64,
    },
    Normal {
        mean: f64,
        std: f64,
    },
    /// Integers `lo..=hi`, as floats.
    Integers {
        lo: i64,
        hi: i64,
    },
    Bernoulli {
        p: f64,
    },
}

/// The values an input may hold (`input r: [B, G] in integers(1, K)`); checked
/// before a run, with the offending index named.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Domain {
    /// Anything, NaN and infinities included (they propagate per IEEE).
    Any,
    /// Finite numbers.
    Finite,
    /// Integers `lo..=hi`.
    Integers { lo: i64, hi: i64 },
    /// 0 or 1.
    Binary,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    pub name: String,
    pub node: NodeId,
    pub init: Init,
    pub domain: Domain,
    /// Declared with `weight`: fixed across calls in inference.
    pub weight: bool,
}

/// A symbolic size and the value it takes when no tensor fixes it (`--seed`).
#[derive(Clone, Debug, PartialEq)]
pub struct DimDecl {
    pub name: String,
    pub default: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub name: String,
    pub dims: Vec<DimDecl>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<Input>,
    pub outputs: Vec<(String, NodeId)>,
}

impl Program {
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }
    pub fn shape(&self, id: NodeId) -> &Shape {
        &self.node(id).shape
    }
    pub fn input_shape(&self, index: usize) -> &Shape {
        self.shape(self.inputs[index].node)
    }

    /// Removes nodes no output depends on (inputs always stay: they are the
    /// spec's interface), renumbering the rest in order.
    pub fn prune_dead(&mut self) {
        let mut live = vec![false; self.nodes.len()];
        for (_, id) in &self.outputs {
            live[id.0 as usize] = true;
        }
        for input in &self.inputs {
            live[input.node.0 as usize] = true;
        }
        for i in (0..self.nodes.len()).rev() {
            if live[i] {
                for operand in self.nodes[i].op.operands() {
                    live[operand.0 as usize] = true;
                }
            }
        }
        let mut new_id = vec![NodeId(u32::MAX); self.nodes.len()];
        let mut kept = Vec::new();
        for (i, node) in std::mem::take(&mut self.nodes).into_iter().enumerate() {
            if live[i] {
                new_id[i] = NodeId(kept.len() as u32);
                kept.push(node);
            }
        }
        for node in &mut kept {
            node.op.map_operands(|id| new_id[id.0 as usize]);
        }
        self.nodes = kept;
        self.inputs.iter_mut().for_each(|i| i.node = new_id[i.node.0 as usize]);
        self.outputs.iter_mut().for_each(|o| o.1 = new_id[o.1 .0 as usize]);
    }

    /// A readable listing, one node per line; stable text for snapshots.
    pub fn pretty(&self) -> String {
        let mask_text = |mask: &Mask| {
            let window = mask.window.map_or("none".into(), |w| w.to_string());
            format!("mask={}, window={window}, block={}", mask.kind.name(), mask.block)
        };
        let mut out = format!("program {}\n", self.name);
        for d in &self.dims {
            let _ = writeln!(out, "  dim {}{}", d.name, d.default.map_or(String::new(), |v| format!(" = {v}")));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let desc = match &n.op {
                Op::Input { index } => {
                    let input = &self.inputs[*index];
                    let kind = if input.weight { "weight" } else { "input" };
                    match input.domain {
                        Domain::Any => format!("{kind} {}", input.name),
                        Domain::Finite => format!("{kind} {} in finite", input.name),
                        Domain::Binary => format!("{kind} {} in binary", input.name),
                        Domain::Integers { lo, hi } => format!("{kind} {} in integers({lo}, {hi})", input.name),
                    }
                }
                Op::Scalar { value } => format!("scalar {value:?}"),
                Op::MatMul { a, b } => format!("matmul {a}, {b}"),
                Op::SplitHeads { x, heads } => format!("split_heads {x}, heads={heads}"),
                Op::MergeHeads { x } => format!("merge_heads {x}"),
                Op::MixHeads { x, alpha } => format!("mix_heads {x}, {alpha}"),
                Op::Interleave { x } => format!("interleave {x}"),
                Op::Deinterleave { x, pseudo } => format!("deinterleave {x}, pseudo={pseudo}"),
                Op::BlockDiag { r, block } => format!("block_diag {r}, block={block}"),
                Op::Collapse { x, r } => format!("collapse {x}, {r}"),
                Op::Rope { x, base } => format!("rope {x}, base={base:?}"),
                Op::Attention { q, k, v, mask, scale } => {
                    format!("attention {q}, {k}, {v}, {}, scale={scale:?}", mask_text(mask))
                }
                Op::Binary { op, a, b } => format!("{} {a}, {b}", op.name()),
                Op::Unary { op, x } => format!("{} {x}", op.name()),
                Op::Constant { values } => format!("constant {values:?}"),
                Op::Reduce { x, kind, axes, keepdim } => {
                    format!("reduce_{} {x}, axes={axes:?}, keepdim={keepdim}", kind.name())
                }
                Op::LooMean { x, axis } => format!("loo_mean {x}, axis={axis}"),
                Op::Where { cond, a, b } => format!("where {cond}, {a}, {b}"),
                Op::Thresholds { x, levels } => format!("thresholds {x}, levels={levels}"),
                Op::MixCols { y, alpha } => format!("mix_cols {y}, {alpha}"),
                Op::CollapseCols { y, r } => format!("collapse_cols {y}, {r}"),
                Op::CollapseRows { w, r } => format!("collapse_rows {w}, {r}"),
                Op::UnflattenHeads { x, pseudo } => format!("unflatten_heads {x}, pseudo={pseudo}"),
                Op::FlattenHeads { x } => format!("flatten_heads {x}"),
                Op::ConcatCols { a, b } => format!("concat_cols {a}, {b}"),
                Op::SliceCols { x, start, len } => format!("slice_cols {x}, start={start}, len={len}"),
                Op::Transpose { x } => format!("transpose {x}"),
                Op::MatMulAt { a, b } => format!("matmul_at {a}, {b}"),
                Op::Unsqueeze { x, axes } => format!("unsqueeze {x}, axes={axes:?}"),
                Op::MixHeadsT { y, alpha } => format!("mix_heads_t {y}, {alpha}"),
                Op::MixHeadsGrad { x, dy } => format!("mix_heads_grad {x}, {dy}"),
                Op::CollapseT { dy, r, pseudo } => format!("collapse_t {dy}, {r}, pseudo={pseudo}"),
                Op::CollapseGrad { x, dy } => format!("collapse_grad {x}, {dy}"),
                Op::AttentionLse { q, k, mask, scale } => {
                    format!("attention_lse {q}, {k}, {}, scale={scale:?}", mask_text(mask))
                }
                Op::MixColsT { dy, alpha } => format!("mix_cols_t {dy}, {alpha}"),
                Op::MixColsGrad { y, dy, m, h, p } => format!("mix_cols_grad {y}, {dy}, m={m}, h={h}, p={p}"),
                Op::CollapseColsGrad { y, dy, h } => format!("collapse_cols_grad {y}, {dy}, h={h}"),
                Op::CollapseRowsGrad { w, dy, h } => format!("collapse_rows_grad {w}, {dy}, h={h}"),
                Op::AttentionGrad { q, k, v, o, dout, lse, mask, scale, wrt } => format!(
                    "attention_grad_{} {q}, {k}, {v}, {o}, {dout}, {lse}, {}, scale={scale:?}",
                    format!("{wrt:?}").to_lowercase(),
                    mask_text(mask)
                ),
            };
            let _ = writeln!(out, "  %{i} = {desc} : {}", n.shape);
        }
        for (name, id) in &self.outputs {
            let _ = writeln!(out, "  output {name} = {id}");
        }
        out
    }
}
