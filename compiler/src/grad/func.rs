//! The derivative of a score function by its scaled logit `s` (its first
//! parameter), as another function: attention's backward multiplies
//! `dS_ij` by it. Forward mode over the expression, with the elementwise
//! rules of `elementwise`; int and bool sub-expressions do not depend on `s`.

use super::elementwise::{pow_partials, unary_derivative, Algebra};
use crate::ir::{BinaryOp, FBin, FExpr, FType, Func, HeadMix, UnaryOp};
use serde::Serialize;
use std::convert::Infallible;

/// `∂f/∂s` of score function `f`, a function of the same parameters.
pub fn score_slope(f: &Func) -> Func {
    let types = f.kind.params();
    let body = derivative(&f.body, types, &|e| *e == FExpr::Param(0));
    Func { kind: f.kind, params: f.params.clone(), body }
}

/// Per distinct read of captured tensor `capture` in score function `f`:
/// the read's indices and `∂f/∂(the value read)`, both functions of `f`'s
/// parameters. The gradient of the tensor sums, over the pairs attention
/// sees, `dS_ij` times each partial into the entry its read indexes.
pub fn read_partials(f: &Func, capture: usize) -> Vec<(Vec<FExpr>, Func)> {
    let mut reads: Vec<FExpr> = vec![];
    f.body.walk(&mut |e| {
        if matches!(e, FExpr::Read { capture: c, .. } if *c == capture) && !reads.contains(e) {
            reads.push(e.clone());
        }
    });
    let types = f.kind.params();
    reads
        .into_iter()
        .map(|r| {
            let FExpr::Read { indices, .. } = &r else { unreachable!("a read") };
            let body = derivative(&f.body, types, &|e| *e == r);
            (indices.clone(), Func { kind: f.kind, params: f.params.clone(), body })
        })
        .collect()
}

/// `∂e/∂x` where `wrt` picks the nodes that are `x` (the parameter `s`, or
/// one read of a tensor).
fn derivative(e: &FExpr, types: &[FType], wrt: &dyn Fn(&FExpr) -> bool) -> FExpr {
    let a = &mut Exprs;
    if wrt(e) {
        return FExpr::Float(1.0);
    }
    if e.ty(types) != FType::Float {
        return FExpr::Float(0.0);
    }
    let d = |x: &FExpr| derivative(x, types, wrt);
    match e {
        FExpr::Param(_) | FExpr::Float(_) | FExpr::Read { .. } | FExpr::ToFloat(_) => FExpr::Float(0.0),
        FExpr::ReadBound { .. } => unreachable!("tile functions are not differentiated"),
        FExpr::Int(_) | FExpr::Bool(_) | FExpr::Dim(_) | FExpr::Not(_) => FExpr::Float(0.0),
        FExpr::Neg(x) => ok(a.times(-1.0, d(x))),
        FExpr::Where(c, x, y) => FExpr::Where(c.clone(), Box::new(d(x)), Box::new(d(y))),
        FExpr::Unary(op, x) => match ok(unary_derivative(a, *op, (**x).clone(), e.clone())) {
            Some(slope) => ok(a.mul(slope, d(x))),
            None => FExpr::Float(0.0),
        },
        FExpr::Bin(op, x, y) => {
            let (dx, dy) = (d(x), d(y));
            let (x, y) = ((**x).clone(), (**y).clone());
            match op {
                FBin::Add => ok(a.binary(BinaryOp::Add, dx, dy)),
                FBin::Sub => ok(a.binary(BinaryOp::Sub, dx, dy)),
                FBin::Mul => {
                    let l = ok(a.mul(dx, y));
                    let r = ok(a.mul(x, dy));
                    ok(a.binary(BinaryOp::Add, l, r))
                }
                FBin::Div => {
                    // (dx − (x/y) dy) / y.
                    let r = ok(a.mul(e.clone(), dy));
                    let num = ok(a.binary(BinaryOp::Sub, dx, r));
                    ok(a.binary(BinaryOp::Div, num, y))
                }
                FBin::Pow => {
                    let [px, py] = ok(pow_partials(a, x, y, e.clone()));
                    let l = ok(a.mul(px, dx));
                    let r = ok(a.mul(py, dy));
                    ok(a.binary(BinaryOp::Add, l, r))
                }
                // The chosen operand's derivative; ties go to the first (as the IR's rule).
                FBin::Max => FExpr::Where(Box::new(bin(FBin::Ge, x, y)), Box::new(dx), Box::new(dy)),
                FBin::Min => FExpr::Where(Box::new(bin(FBin::Ge, y, x)), Box::new(dx), Box::new(dy)),
                other => unreachable!("`{}` is not a float operation", other.symbol()),
            }
        }
    }
}

fn ok<T>(r: Result<T, Infallible>) -> T {
    match r {
        Ok(x) => x,
        Err(never) => match never {},
    }
}

fn bin(op: FBin, a: FExpr, b: FExpr) -> FExpr {
    FExpr::Bin(op, Box::new(a), Box::new(b))
}

/// Function expressions, folding the zeros and ones forward mode produces.
struct Exprs;

impl Algebra for Exprs {
    type V = FExpr;
    type E = Infallible;

    fn constant(&mut self, c: f64) -> Result<FExpr, Infallible> {
        Ok(FExpr::Float(c))
    }

    fn unary(&mut self, op: UnaryOp, x: FExpr) -> Result<FExpr, Infallible> {
        Ok(FExpr::Unary(op, Box::new(x)))
    }

    fn binary(&mut self, op: BinaryOp, a: FExpr, b: FExpr) -> Result<FExpr, Infallible> {
        let zero = |x: &FExpr| matches!(x, FExpr::Float(v) if *v == 0.0);
        let one = |x: &FExpr| matches!(x, FExpr::Float(v) if *v == 1.0);
        Ok(match op {
            BinaryOp::Add if zero(&a) => b,
            BinaryOp::Add | BinaryOp::Sub if zero(&b) => a,
            BinaryOp::Mul if zero(&a) || zero(&b) => FExpr::Float(0.0),
            BinaryOp::Mul if one(&a) => b,
            BinaryOp::Mul | BinaryOp::Div if one(&b) => a,
            BinaryOp::Add => bin(FBin::Add, a, b),
            BinaryOp::Sub => bin(FBin::Sub, a, b),
            BinaryOp::Mul => bin(FBin::Mul, a, b),
            BinaryOp::Div => bin(FBin::Div, a, b),
            BinaryOp::Pow => bin(FBin::Pow, a, b),
            BinaryOp::Max | BinaryOp::Min | BinaryOp::Ge | BinaryOp::Gt | BinaryOp::Eq => {
                unreachable!("derivative rules build arithmetic only")
            }
        })
    }

    fn where_positive(&mut self, x: FExpr, a: FExpr, b: FExpr) -> Result<FExpr, Infallible> {
        Ok(FExpr::Where(Box::new(bin(FBin::Gt, x, FExpr::Float(0.0))), Box::new(a), Box::new(b)))
    }
}

/// The score function's parameters: `s, b, h, i, j`.
const I: usize = 3;
const J: usize = 4;

/// How the kernels walk the (query, key) pairs to differentiate a tensor the
/// score function reads (`plan::reads`): in lines whose every pair reads
/// the same entry, so that a unit sums a line alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lines {
    /// A line per query row `i`, over every key `j`.
    Rows,
    /// A line per key row `j`, over every query `i`.
    Keys,
    /// A line per difference `j − i`, from its first pair.
    Diagonals,
}

impl Lines {
    /// The lines the kernels walk to differentiate the reads of capture
    /// `capture` by attention's score function: `None` where the kernels
    /// refuse it (no score function, head mixing inside the softmax, or an
    /// index no line walks; the interpreter computes it). The one rule for
    /// the gradient's default inputs and the plan.
    pub fn on_kernels(score: Option<&Func>, mix: HeadMix, capture: usize) -> Option<Lines> {
        if !mix.is_identity() {
            return None;
        }
        Lines::of(score?, capture)
    }

    /// The lines for the reads of capture `capture` in score function
    /// `score`: `None` when some index depends on `i` and `j` otherwise than
    /// through `i − j`.
    pub fn of(score: &Func, capture: usize) -> Option<Lines> {
        let reads = read_partials(score, capture);
        let indices: Vec<&FExpr> = reads.iter().flat_map(|(idx, _)| idx).collect();
        if !indices.iter().any(|e| uses(e, J)) {
            Some(Lines::Rows)
        } else if !indices.iter().any(|e| uses(e, I)) {
            Some(Lines::Keys)
        } else if indices.iter().all(|e| through_difference(e)) {
            Some(Lines::Diagonals)
        } else {
            None
        }
    }

    /// Lines per (batch, query head) of `s` query rows against `sk` keys.
    pub fn count(self, s: usize, sk: usize) -> usize {
        match self {
            Lines::Rows => s,
            Lines::Keys => sk,
            Lines::Diagonals if s == 0 || sk == 0 => 0,
            Lines::Diagonals => s + sk - 1,
        }
    }
}

/// Whether parameter `p` occurs in `e`.
fn uses(e: &FExpr, p: usize) -> bool {
    let mut found = false;
    e.walk(&mut |x| found |= *x == FExpr::Param(p));
    found
}

/// Whether `i` and `j` occur in `e` only as `i − j` or `j − i`.
fn through_difference(e: &FExpr) -> bool {
    match e {
        FExpr::Bin(FBin::Sub, a, b)
            if matches!((&**a, &**b), (FExpr::Param(I), FExpr::Param(J)) | (FExpr::Param(J), FExpr::Param(I))) =>
        {
            true
        }
        FExpr::Param(p) => *p != I && *p != J,
        FExpr::Int(_) | FExpr::Float(_) | FExpr::Bool(_) | FExpr::Dim(_) => true,
        FExpr::Read { indices, .. } => indices.iter().all(through_difference),
        FExpr::ReadBound { lo, hi, .. } => lo.iter().chain(hi).all(through_difference),
        FExpr::ToFloat(x) | FExpr::Neg(x) | FExpr::Not(x) | FExpr::Unary(_, x) => through_difference(x),
        FExpr::Bin(_, a, b) => through_difference(a) && through_difference(b),
        FExpr::Where(c, a, b) => through_difference(c) && through_difference(a) && through_difference(b),
    }
}
