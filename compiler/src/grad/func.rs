//! The derivative of a score function by its scaled logit `s` (its first
//! parameter), as another function: attention's backward multiplies
//! `dS_ij` by it. Forward mode over the expression, with the elementwise
//! rules of `elementwise`; int and bool sub-expressions do not depend on `s`.

use super::elementwise::{pow_partials, unary_derivative, Algebra};
use crate::ir::{BinaryOp, FBin, FExpr, FType, Func, UnaryOp};
use std::convert::Infallible;

/// `∂f/∂s` of score function `f`, a function of the same parameters.
pub fn score_slope(f: &Func) -> Func {
    let types = f.kind.params();
    let body = derivative(&f.body, types);
    Func { kind: f.kind, params: f.params.clone(), body }
}

fn derivative(e: &FExpr, types: &[FType]) -> FExpr {
    let a = &mut Exprs;
    if e.ty(types) != FType::Float {
        return FExpr::Float(0.0);
    }
    let d = |x: &FExpr| derivative(x, types);
    match e {
        FExpr::Param(0) => FExpr::Float(1.0),
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
