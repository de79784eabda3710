//! The op table: for each operation of [`Op`], its name, its class and its
//! operands, one arm a variant. Its shape rule is documented on the variant
//! (`## Shape rules`) and computed in `infer.rs`; its derivative is
//! `grad::Differentiator::vjp`'s arm; its launch is `plan`'s.

use super::*;

/// What kind of work an operation is: whether it launches, and how the
/// cost model and the planner treat it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// An input or a constant: no work.
    Leaf,
    /// A reindexing the planner reads as a view of its operand: no launch.
    Layout,
    /// A copy of rows into a new buffer (a concatenation, a paged gather).
    Gather,
    /// One output entry from the same entries of its operands (with
    /// broadcasting), or a fixed few of them (RoPE's pairs, thresholds).
    Elementwise,
    /// Entries summed or compared along axes.
    Reduction,
    /// A sum of products over an axis: GEMMs, head mixing and collapse, and
    /// their transposes and gradients.
    Contraction,
    /// Softmax attention, forward or backward.
    Attention,
}

impl OpClass {
    /// Whether the planner gives it a launch of its own.
    pub fn launches(self) -> bool {
        !matches!(self, OpClass::Leaf | OpClass::Layout)
    }
}

/// The tensors attention's functions read, after its own operands.
fn captures(fns: &Option<Box<AttnFns>>) -> Vec<NodeId> {
    fns.as_ref().map_or(vec![], |f| f.captures.clone())
}

impl Op {
    /// The operation's name (in `explain`, in messages and in egg's opaque
    /// nodes); the IR printer refines it with the kind for `Binary`, `Unary`,
    /// `Reduce` and `AttentionGrad`.
    pub fn name(&self) -> &'static str {
        self.row().0
    }

    pub fn class(&self) -> OpClass {
        self.row().1
    }

    /// The table: name and class.
    fn row(&self) -> (&'static str, OpClass) {
        use OpClass::*;
        match self {
            Op::Input { .. } => ("input", Leaf),
            Op::Scalar { .. } => ("scalar", Leaf),
            Op::Constant { .. } => ("constant", Leaf),
            Op::SplitHeads { .. } => ("split_heads", Layout),
            Op::MergeHeads { .. } => ("merge_heads", Layout),
            Op::Interleave { .. } => ("interleave", Layout),
            Op::Deinterleave { .. } => ("deinterleave", Layout),
            Op::UnflattenHeads { .. } => ("unflatten_heads", Layout),
            Op::FlattenHeads { .. } => ("flatten_heads", Layout),
            Op::SliceCols { .. } => ("slice_cols", Layout),
            Op::Slice { .. } => ("slice", Layout),
            Op::Transpose { .. } => ("transpose", Layout),
            Op::Unsqueeze { .. } => ("unsqueeze", Layout),
            Op::Concat { .. } => ("concat", Gather),
            Op::ConcatCols { .. } => ("concat_cols", Gather),
            Op::Paged { .. } => ("paged", Gather),
            Op::Binary { .. } => ("binary", Elementwise),
            Op::Unary { .. } => ("unary", Elementwise),
            Op::Where { .. } => ("where", Elementwise),
            Op::Rope { .. } => ("rope", Elementwise),
            Op::Thresholds { .. } => ("thresholds", Elementwise),
            Op::BlockDiag { .. } => ("block_diag", Elementwise),
            Op::Reduce { .. } => ("reduce", Reduction),
            Op::LooMean { .. } => ("loo_mean", Reduction),
            Op::MatMul { .. } => ("matmul", Contraction),
            Op::MatMulAt { .. } => ("matmul_at", Contraction),
            Op::MixHeads { .. } => ("mix_heads", Contraction),
            Op::MixHeadsT { .. } => ("mix_heads_t", Contraction),
            Op::MixHeadsGrad { .. } => ("mix_heads_grad", Contraction),
            Op::Collapse { .. } => ("collapse", Contraction),
            Op::CollapseT { .. } => ("collapse_t", Contraction),
            Op::CollapseGrad { .. } => ("collapse_grad", Contraction),
            Op::MixCols { .. } => ("mix_cols", Contraction),
            Op::MixColsT { .. } => ("mix_cols_t", Contraction),
            Op::MixColsGrad { .. } => ("mix_cols_grad", Contraction),
            Op::CollapseCols { .. } => ("collapse_cols", Contraction),
            Op::CollapseColsGrad { .. } => ("collapse_cols_grad", Contraction),
            Op::CollapseRows { .. } => ("collapse_rows", Contraction),
            Op::CollapseRowsGrad { .. } => ("collapse_rows_grad", Contraction),
            Op::Attention { .. } => ("attention", Attention),
            Op::AttentionLse { .. } => ("attention_lse", Attention),
            Op::AttentionDelta { .. } => ("attention_delta", Attention),
            Op::AttentionGrad { .. } => ("attention_grad", Attention),
        }
    }

    /// Attention's functions, on the forward and on its gradient operations.
    pub fn attn_fns(&self) -> Option<&AttnFns> {
        match self {
            Op::Attention { fns, .. }
            | Op::AttentionLse { fns, .. }
            | Op::AttentionDelta { fns, .. }
            | Op::AttentionGrad { fns, .. } => fns.as_deref(),
            _ => None,
        }
    }

    /// Operands in order.
    pub fn operands(&self) -> Vec<NodeId> {
        match *self {
            Op::Input { .. } | Op::Scalar { .. } | Op::Constant { .. } => vec![],
            Op::Reduce { x, .. } | Op::LooMean { x, .. } | Op::Thresholds { x, .. } => vec![x],
            Op::Where { cond, a, b } => vec![cond, a, b],
            Op::MixCols { y, alpha } => vec![y, alpha],
            Op::CollapseCols { y, r } => vec![y, r],
            Op::CollapseRows { w, r } => vec![w, r],
            Op::UnflattenHeads { x, .. } | Op::FlattenHeads { x } | Op::SliceCols { x, .. } | Op::Slice { x, .. } => {
                vec![x]
            }
            Op::ConcatCols { a, b } | Op::Concat { a, b, .. } => vec![a, b],
            Op::MatMul { a, b } | Op::Binary { a, b, .. } => vec![a, b],
            Op::SplitHeads { x, .. }
            | Op::MergeHeads { x }
            | Op::Interleave { x }
            | Op::Deinterleave { x, .. }
            | Op::Rope { x, .. }
            | Op::Unary { x, .. } => vec![x],
            Op::MixHeads { x, alpha } => vec![x, alpha],
            Op::Paged { cache, pages } => vec![cache, pages],
            Op::BlockDiag { r, .. } => vec![r],
            Op::Collapse { x, r } => vec![x, r],
            Op::Attention { q, k, v, ref fns, .. } => [q, k, v].into_iter().chain(captures(fns)).collect(),
            Op::Transpose { x } | Op::Unsqueeze { x, .. } => vec![x],
            Op::MatMulAt { a, b } => vec![a, b],
            Op::MixHeadsT { y, alpha } => vec![y, alpha],
            Op::MixHeadsGrad { x, dy } | Op::CollapseGrad { x, dy } => vec![x, dy],
            Op::CollapseT { dy, r, .. } => vec![dy, r],
            Op::AttentionLse { q, k, ref fns, .. } => [q, k].into_iter().chain(captures(fns)).collect(),
            Op::MixColsT { dy, alpha } => vec![dy, alpha],
            Op::MixColsGrad { y, dy, .. } | Op::CollapseColsGrad { y, dy, .. } => vec![y, dy],
            Op::CollapseRowsGrad { w, dy, .. } => vec![w, dy],
            Op::AttentionGrad { q, k, v, o, dout, lse, ref fns, .. } => {
                [q, k, v, o, dout, lse].into_iter().chain(captures(fns)).collect()
            }
            Op::AttentionDelta { q, k, v, dout, lse, ref fns, .. } => {
                [q, k, v, dout, lse].into_iter().chain(captures(fns)).collect()
            }
        }
    }

    /// Rewrites every operand handle through `f`.
    pub fn map_operands(&mut self, mut f: impl FnMut(NodeId) -> NodeId) {
        match self {
            Op::Input { .. } | Op::Scalar { .. } | Op::Constant { .. } => {}
            Op::MatMul { a, b } | Op::Binary { a, b, .. } | Op::ConcatCols { a, b } | Op::Concat { a, b, .. } => {
                *a = f(*a);
                *b = f(*b);
            }
            Op::MixCols { y: x, alpha: y } | Op::CollapseCols { y: x, r: y } | Op::CollapseRows { w: x, r: y } => {
                *x = f(*x);
                *y = f(*y);
            }
            Op::UnflattenHeads { x, .. } | Op::FlattenHeads { x } | Op::SliceCols { x, .. } | Op::Slice { x, .. } => {
                *x = f(*x)
            }
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
            Op::MixHeads { x, alpha: y } | Op::Collapse { x, r: y } | Op::Paged { cache: x, pages: y } => {
                *x = f(*x);
                *y = f(*y);
            }
            Op::Attention { q: a, k: b, v: c, fns, .. } => {
                *a = f(*a);
                *b = f(*b);
                *c = f(*c);
                fns.iter_mut().flat_map(|x| x.captures.iter_mut()).for_each(|x| *x = f(*x));
            }
            Op::AttentionLse { q: a, k: b, fns, .. } => {
                *a = f(*a);
                *b = f(*b);
                fns.iter_mut().flat_map(|x| x.captures.iter_mut()).for_each(|x| *x = f(*x));
            }
            Op::Where { cond: a, a: b, b: c } => {
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
            | Op::MixColsT { dy: x, alpha: y }
            | Op::MixColsGrad { y: x, dy: y, .. }
            | Op::CollapseColsGrad { y: x, dy: y, .. }
            | Op::CollapseRowsGrad { w: x, dy: y, .. } => {
                *x = f(*x);
                *y = f(*y);
            }
            Op::AttentionGrad { q, k, v, o, dout, lse, fns, .. } => {
                for id in [q, k, v, o, dout, lse] {
                    *id = f(*id);
                }
                fns.iter_mut().flat_map(|x| x.captures.iter_mut()).for_each(|x| *x = f(*x));
            }
            Op::AttentionDelta { q, k, v, dout, lse, fns, .. } => {
                for id in [q, k, v, dout, lse] {
                    *id = f(*id);
                }
                fns.iter_mut().flat_map(|x| x.captures.iter_mut()).for_each(|x| *x = f(*x));
            }
        }
    }
}
