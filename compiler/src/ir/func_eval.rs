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
    /// Integer `e` evaluates to `value`, outside 32 bits ([`int32`]).
    fn overflow(&self, e: &FExpr, value: i128) -> Self::Error;
}

/// A function's integers are 32-bit (as in every kernel): `v` if it fits,
/// else the error of an overflow. The interpreter computes exactly and
/// refuses what a kernel would wrap.
pub fn int32(v: i128) -> Option<i64> {
    (i32::MIN as i128..=i32::MAX as i128).contains(&v).then_some(v as i64)
}

/// Leaves without data (plans, constants): every read fails, and so does
/// an overflow; a dim is resolved before.
pub struct NoData;

impl Leaves for NoData {
    type Error = ();
    fn dim(&self, name: &str) -> i64 {
        unreachable!("dim `{name}` is resolved in plans")
    }
    fn read(&self, _: usize, _: Vec<i64>) -> Result<f64, ()> {
        Err(())
    }
    fn read_bound(&self, _: usize, _: &[i64], _: &[i64], _: bool) -> Result<f64, ()> {
        Err(())
    }
    fn overflow(&self, _: &FExpr, _: i128) {}
}

/// `e` with the function's parameters `args`.
pub fn eval<L: Leaves>(e: &FExpr, args: &[FVal], leaves: &L) -> Result<FVal, L::Error> {
    let go = |x: &FExpr| eval(x, args, leaves);
    Ok(match e {
        FExpr::Param(n) => args[*n],
        FExpr::Int(v) => checked(e, *v as i128, leaves)?,
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
            FVal::Int(v) => checked(e, -(v as i128), leaves)?,
            v => FVal::Float(-v.float()),
        },
        FExpr::Not(x) => FVal::Bool(!go(x)?.bool()),
        FExpr::Unary(op, x) => match go(x)? {
            FVal::Int(v) => checked(e, (v as i128).abs(), leaves)?,
            v => FVal::Float(scalar::unary(*op, v.float())),
        },
        FExpr::Where(c, a, b) => {
            if go(c)?.bool() {
                go(a)?
            } else {
                go(b)?
            }
        }
        FExpr::Bin(op, a, b) => match binary(*op, go(a)?, go(b)?) {
            Exact::Int(v) => checked(e, v, leaves)?,
            Exact::Val(v) => v,
        },
    })
}

/// An int result, or the leaves' overflow error.
fn checked<L: Leaves>(e: &FExpr, v: i128, leaves: &L) -> Result<FVal, L::Error> {
    int32(v).map(FVal::Int).ok_or_else(|| leaves.overflow(e, v))
}

/// A binary operation's result: an exact integer (checked by the caller), or a value.
#[derive(Debug, PartialEq)]
pub(crate) enum Exact {
    Int(i128),
    Val(FVal),
}

pub(crate) fn binary(op: FBin, a: FVal, b: FVal) -> Exact {
    match (a, b) {
        (FVal::Int(x), FVal::Int(y)) => int_binary(op, x as i128, y as i128),
        (x, y) => Exact::Val(value_binary(op, x, y)),
    }
}

/// `op` on exact integers: arithmetic as `Exact::Int`, comparisons as values.
fn int_binary(op: FBin, x: i128, y: i128) -> Exact {
    Exact::Int(match op {
        FBin::Add => x + y,
        FBin::Sub => x - y,
        FBin::Mul => x * y,
        FBin::FloorDiv => {
            if y == 0 {
                0
            } else {
                floor_div(x, y)
            }
        }
        FBin::Rem => {
            if y == 0 {
                0
            } else {
                x - y * floor_div(x, y)
            }
        }
        FBin::Max => x.max(y),
        FBin::Min => x.min(y),
        other => return Exact::Val(FVal::Bool(compare(other, x, y))),
    })
}

pub(crate) fn value_binary(op: FBin, a: FVal, b: FVal) -> FVal {
    match (a, b) {
        (FVal::Bool(x), FVal::Bool(y)) => FVal::Bool(match op {
            FBin::And => x && y,
            FBin::Or => x || y,
            FBin::Eq => x == y,
            FBin::Ne => x != y,
            other => unreachable!("`{}` on bools", other.symbol()),
        }),
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
pub(crate) fn floor_div(x: i128, y: i128) -> i128 {
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
            assert_eq!(binary(FBin::FloorDiv, FVal::Int(x), FVal::Int(y)), Exact::Int(q), "floordiv({x}, {y})");
            assert_eq!(binary(FBin::Rem, FVal::Int(x), FVal::Int(y)), Exact::Int(r), "{x} % {y}");
        }
    }
}
