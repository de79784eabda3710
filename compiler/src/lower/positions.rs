//! Attention's positions: per-sequence key counts (`lengths =`) and
//! FlashAttention's one-sided windows (`window_left =`, `window_right =`),
//! lowered into a mask function so that every backend (the interpreter, the
//! forward and backward kernels, their tile skipping) runs them as it runs
//! an author's mask (docs/semantics.md §8).
//!
//! Query row `i` of `M` stands at position `p = i + n − M`, where `n` is the
//! sequence's key count (`lengths[b]`, or all `N` key rows): FlashAttention's
//! bottom-right alignment, as the built-in masks use for `M ≠ N`. Key `j`
//! is visible iff `j < n`, the built-in mask sees it at `(p, j)` (`causal`:
//! `j ≤ p`; `window = w`: `p − j < w`, or `|p − j| < w` unmasked),
//! `p − window_left ≤ j ≤ p + window_right`, and the author's mask
//! function (if any; it sees the stored indices, no alignment) holds.
//! Everything is compared as float: exact below 2^24 rows.

use crate::ir::*;

/// What `lengths`, `window_left` and `window_right` ask for.
pub(super) struct Positions {
    /// The capture holding `lengths`.
    pub lengths: Option<usize>,
    pub left: Option<u64>,
    pub right: Option<u64>,
}

impl Positions {
    pub fn any(&self) -> bool {
        self.lengths.is_some() || self.left.is_some() || self.right.is_some()
    }
}

/// The mask function of `mask` (one row a token) with `pos` applied, over
/// `rows` query rows and `keys` key rows, ANDed with the author's `user`
/// mask function.
pub(super) fn mask_function(mask: Mask, pos: &Positions, rows: &Dim, keys: &Dim, user: Option<Func>) -> Func {
    let bin = |op, a: FExpr, b: FExpr| FExpr::Bin(op, Box::new(a), Box::new(b));
    let float = |e: FExpr| FExpr::ToFloat(Box::new(e));
    let (i, j) = (float(FExpr::Param(2)), float(FExpr::Param(3)));
    let n = match pos.lengths {
        Some(capture) => FExpr::Read { capture, indices: vec![FExpr::Param(0)] },
        None => float(size(keys)),
    };
    let p = bin(FBin::Sub, bin(FBin::Add, i, n.clone()), float(size(rows)));
    let ahead = || bin(FBin::Sub, p.clone(), j.clone());
    let mut conds = vec![];
    if pos.lengths.is_some() {
        conds.push(bin(FBin::Lt, j.clone(), n));
    }
    if mask.kind != MaskKind::None {
        conds.push(bin(FBin::Le, j.clone(), p.clone()));
    }
    if let Some(w) = mask.window {
        let gap = match mask.kind {
            MaskKind::None => FExpr::Unary(UnaryOp::Abs, Box::new(ahead())),
            _ => ahead(),
        };
        conds.push(bin(FBin::Lt, gap, FExpr::Float(w as f64)));
    }
    if let Some(left) = pos.left {
        conds.push(bin(FBin::Le, ahead(), FExpr::Float(left as f64)));
    }
    if let Some(right) = pos.right {
        conds.push(bin(FBin::Ge, ahead(), FExpr::Float(-(right as f64))));
    }
    let params = match &user {
        Some(f) => f.params.clone(),
        None => ["b", "h", "i", "j"].map(String::from).to_vec(),
    };
    conds.extend(user.map(|f| f.body));
    let body = conds.into_iter().reduce(|a, b| bin(FBin::And, a, b)).unwrap_or(FExpr::Bool(true));
    Func { kind: FuncKind::Mask, params, body }
}

/// A size as an int expression: the sum of its terms, each a coefficient times its dims.
fn size(d: &Dim) -> FExpr {
    let bin = |op, a, b| FExpr::Bin(op, Box::new(a), Box::new(b));
    d.terms()
        .map(|(c, syms)| {
            let dims = syms.iter().flat_map(|(s, e)| (0..*e).map(|_| FExpr::Dim(s.clone())));
            let factors: Vec<FExpr> =
                (c != 1 || syms.is_empty()).then_some(FExpr::Int(c)).into_iter().chain(dims).collect();
            factors.into_iter().reduce(|a, b| bin(FBin::Mul, a, b)).unwrap()
        })
        .reduce(|a, b| bin(FBin::Add, a, b))
        .unwrap_or(FExpr::Int(0))
}
