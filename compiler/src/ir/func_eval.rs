//! Score, mask and tile functions evaluated in float64 and exact
//! integers (`docs/semantics.md` §6): the meaning every kernel compiles.
//! What leaves mean (dims, reads of captured tensors) is the caller's
//! ([`Leaves`]): the interpreter reads tensors, the cost model has no data.

use super::{scalar, BinaryOp as B, FBin, FExpr};

/// A function's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FVal {
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl FVal {
    pub fn int(self) -> i64 {
        match self {
            FVal::Int(v) => v,
            other => unreachable!("lowering typed this an int, found {other:?}"),
        }
    }

    pub fn float(self) -> f64 {
        match self {
            FVal::Float(v) => v,
            FVal::Int(v) => v as f64,
            FVal::Bool(_) => unreachable!("lowering typed this a float, found a bool"),
        }
    }

    pub fn bool(self) -> bool {
        match self {
            FVal::Bool(v) => v,
            other => unreachable!("lowering typed this a bool, found {other:?}"),
        }
    }
}

/// The values of a function's leaves.
pub trait Leaves {
    type Error;
    fn dim(&self, name: &str) -> i64;
    /// Entry `index` of captured tensor `capture`.
    fn read(&self, capture: usize, index: Vec<i64>) -> Result<f64, Self::Error>;
    /// `FExpr::ReadBound`: the least (`max` false) or greatest entry over the box.
    fn read_bound(&self, capture: usize, lo: &[i64], hi: &[i64], max: bool) -> Result<f64, Self::Error>;
}

/// `e` with the function's parameters `args`.
pub fn eval<L: Leaves>(e: &FExpr, args: &[FVal], leaves: &L) -> Result<FVal, L::Error> {
    let go = |x: &FExpr| eval(x, args, leaves);
    Ok(match e {
        FExpr::Param(n) => args[*n],
        FExpr::Int(v) => FVal::Int(*v),
        FExpr::Float(v) => FVal::Float(*v),
        FExpr::Bool(v) => FVal::Bool(*v),
        FExpr::Dim(d) => FVal::Int(leaves.dim(d)),
        FExpr::Read { capture, indices } => {
            let index: Vec<i64> = indices.iter().map(|x| go(x).map(FVal::int)).collect::<Result<_, _>>()?;
            FVal::Float(leaves.read(*capture, index)?)
        }
        FExpr::ReadBound { capture, lo, hi, max } => {
            let ends = |xs: &[FExpr]| xs.iter().map(|x| go(x).map(FVal::int)).collect::<Result<Vec<i64>, _>>();
            let (lo, hi) = (ends(lo)?, ends(hi)?);
            FVal::Float(leaves.read_bound(*capture, &lo, &hi, *max)?)
        }
        FExpr::ToFloat(x) => FVal::Float(go(x)?.int() as f64),
        FExpr::Neg(x) => match go(x)? {
            FVal::Int(v) => FVal::Int(v.wrapping_neg()),
            v => FVal::Float(-v.float()),
        },
        FExpr::Not(x) => FVal::Bool(!go(x)?.bool()),
        FExpr::Unary(op, x) => match go(x)? {
            FVal::Int(v) => FVal::Int(v.wrapping_abs()),
            v => FVal::Float(scalar::unary(*op, v.float())),
        },
        FExpr::Where(c, a, b) => {
            if go(c)?.bool() {
                go(a)?
            } else {
                go(b)?
            }
        }
        FExpr::Bin(op, a, b) => binary(*op, go(a)?, go(b)?),
    })
}

fn binary(op: FBin, a: FVal, b: FVal) -> FVal {
    match (a, b) {
        (FVal::Bool(x), FVal::Bool(y)) => FVal::Bool(match op {
            FBin::And => x && y,
            FBin::Or => x || y,
            FBin::Eq => x == y,
            FBin::Ne => x != y,
            other => unreachable!("`{}` on bools", other.symbol()),
        }),
        (FVal::Int(x), FVal::Int(y)) => match op {
            FBin::Add => FVal::Int(x.wrapping_add(y)),
            FBin::Sub => FVal::Int(x.wrapping_sub(y)),
            FBin::Mul => FVal::Int(x.wrapping_mul(y)),
            FBin::FloorDiv => FVal::Int(if y == 0 { 0 } else { floor_div(x, y) }),
            FBin::Rem => FVal::Int(if y == 0 { 0 } else { x - y * floor_div(x, y) }),
            FBin::Max => FVal::Int(x.max(y)),
            FBin::Min => FVal::Int(x.min(y)),
            other => FVal::Bool(compare(other, x, y)),
        },
        (x, y) => {
            let (x, y) = (x.float(), y.float());
            match op {
                FBin::Add => FVal::Float(x + y),
                FBin::Sub => FVal::Float(x - y),
                FBin::Mul => FVal::Float(x * y),
                FBin::Div => FVal::Float(x / y),
                FBin::Pow => FVal::Float(scalar::binary(B::Pow, x, y)),
                FBin::Max => FVal::Float(scalar::binary(B::Max, x, y)),
                FBin::Min => FVal::Float(scalar::binary(B::Min, x, y)),
                other => FVal::Bool(compare(other, x, y)),
            }
        }
    }
}

/// A comparison of two ints or two floats (IEEE: NaN compares false but `!=`).
fn compare<T: PartialOrd>(op: FBin, x: T, y: T) -> bool {
    match op {
        FBin::Lt => x < y,
        FBin::Le => x <= y,
        FBin::Gt => x > y,
        FBin::Ge => x >= y,
        FBin::Eq => x == y,
        FBin::Ne => x != y,
        other => unreachable!("`{}` on numbers", other.symbol()),
    }
}

/// ⌊x / y⌋ for y ≠ 0.
fn floor_div(x: i64, y: i64) -> i64 {
    let q = x / y;
    if (x % y != 0) && ((x < 0) != (y < 0)) {
        q - 1
    } else {
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_division_floors_and_remainders_are_non_negative() {
        for (x, y, q, r) in [(7, 2, 3, 1), (-7, 2, -4, 1), (7, -2, -4, -1), (-7, -2, 3, -1), (6, 3, 2, 0), (5, 0, 0, 0)]
        {
            assert_eq!(binary(FBin::FloorDiv, FVal::Int(x), FVal::Int(y)), FVal::Int(q), "floordiv({x}, {y})");
            assert_eq!(binary(FBin::Rem, FVal::Int(x), FVal::Int(y)), FVal::Int(r), "{x} % {y}");
        }
    }
}
