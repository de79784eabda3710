//! Score and mask functions evaluated in float64 and exact integers
//! (`docs/semantics.md` §6): the meaning every kernel compiles.

use super::scalar;
use crate::tensor::Tensor;
use attnc_compiler::ir::{AttnFns, DimValues, FBin, FExpr, Func, Program};
use std::fmt;

/// A function's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FVal {
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl FVal {
    fn int(self) -> i64 {
        match self {
            FVal::Int(v) => v,
            other => unreachable!("lowering typed this an int, found {other:?}"),
        }
    }

    fn float(self) -> f64 {
        match self {
            FVal::Float(v) => v,
            other => unreachable!("lowering typed this a float, found {other:?}"),
        }
    }

    fn bool(self) -> bool {
        match self {
            FVal::Bool(v) => v,
            other => unreachable!("lowering typed this a bool, found {other:?}"),
        }
    }
}

/// A read past the end of a captured tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadError {
    pub tensor: String,
    pub index: Vec<i64>,
    pub shape: Vec<usize>,
    /// Where: `score` or `mask`, and the call's (b, h, i, j).
    pub func: &'static str,
    pub at: [usize; 4],
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let index: Vec<String> = self.index.iter().map(i64::to_string).collect();
        let [b, h, i, j] = self.at;
        write!(
            f,
            "the {} function reads `{}[{}]`, outside its shape {:?} (at b={b}, h={h}, i={i}, j={j})",
            self.func,
            self.tensor,
            index.join(", "),
            self.shape
        )
    }
}

/// What a function's leaves refer to: the captured tensors (with their
/// input names) and the dims' values.
pub struct Env<'a> {
    pub captures: Vec<(&'a str, &'a Tensor)>,
    pub dims: &'a DimValues,
}

impl<'a> Env<'a> {
    /// The environment of attention `fns` in `program`, whose node values so far are `values`.
    pub fn new(program: &'a Program, fns: &AttnFns, values: &'a [Tensor], dims: &'a DimValues) -> Env<'a> {
        let captures = fns
            .captures
            .iter()
            .map(|c| {
                let name = match program.nodes[c.0 as usize].op {
                    attnc_compiler::ir::Op::Input { index } => program.inputs[index].name.as_str(),
                    _ => "a computed tensor",
                };
                (name, &values[c.0 as usize])
            })
            .collect();
        Env { captures, dims }
    }
}

/// Calls `func` on `args` (its parameters' values); `at` is the (b, h, i, j)
/// an error names.
pub fn call(func: &Func, args: &[FVal], env: &Env, at: [usize; 4]) -> Result<FVal, ReadError> {
    eval(&func.body, args, env, &|tensor, index, shape| ReadError {
        tensor: tensor.to_string(),
        index,
        shape,
        func: func.kind.name(),
        at,
    })
}

type OnError<'e> = dyn Fn(&str, Vec<i64>, Vec<usize>) -> ReadError + 'e;

fn eval(e: &FExpr, args: &[FVal], env: &Env, err: &OnError) -> Result<FVal, ReadError> {
    let go = |x: &FExpr| eval(x, args, env, err);
    Ok(match e {
        FExpr::Param(n) => args[*n],
        FExpr::Int(v) => FVal::Int(*v),
        FExpr::Float(v) => FVal::Float(*v),
        FExpr::Bool(v) => FVal::Bool(*v),
        FExpr::Dim(d) => FVal::Int(env.dims[d] as i64),
        FExpr::Read { capture, indices } => {
            let (name, t) = env.captures[*capture];
            let index: Vec<i64> = indices.iter().map(|x| go(x).map(FVal::int)).collect::<Result<_, _>>()?;
            let mut flat = 0usize;
            for (i, n) in index.iter().zip(&t.shape) {
                if *i < 0 || *i as usize >= *n {
                    return Err(err(name, index, t.shape.clone()));
                }
                flat = flat * n + *i as usize;
            }
            FVal::Float(t.data[flat])
        }
        FExpr::ReadBound { capture, lo, hi, max } => {
            let (_, t) = env.captures[*capture];
            let ends = |xs: &[FExpr]| xs.iter().map(|x| go(x).map(FVal::int)).collect::<Result<Vec<i64>, _>>();
            let (lo, hi) = (ends(lo)?, ends(hi)?);
            FVal::Float(read_bound(t, &lo, &hi, *max))
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
    use attnc_compiler::ir::BinaryOp as B;
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
            FBin::Lt => FVal::Bool(x < y),
            FBin::Le => FVal::Bool(x <= y),
            FBin::Gt => FVal::Bool(x > y),
            FBin::Ge => FVal::Bool(x >= y),
            FBin::Eq => FVal::Bool(x == y),
            FBin::Ne => FVal::Bool(x != y),
            other => unreachable!("`{}` on ints", other.symbol()),
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
                FBin::Lt => FVal::Bool(x < y),
                FBin::Le => FVal::Bool(x <= y),
                FBin::Gt => FVal::Bool(x > y),
                FBin::Ge => FVal::Bool(x >= y),
                FBin::Eq => FVal::Bool(x == y),
                FBin::Ne => FVal::Bool(x != y),
                other => unreachable!("`{}` on floats", other.symbol()),
            }
        }
    }
}

/// The least (or, `max`, greatest) entry of `t` over the box `lo..=hi`,
/// each axis clamped into the shape; ∓∞ past `READ_BOX` entries, ±∞ (no
/// entry) for an empty box.
fn read_bound(t: &Tensor, lo: &[i64], hi: &[i64], max: bool) -> f64 {
    let clamp = |x: i64, n: usize| x.clamp(0, n as i64 - 1) as usize;
    let axes: Vec<(usize, usize)> =
        t.shape.iter().zip(lo.iter().zip(hi)).map(|(n, (l, h))| (clamp(*l, *n), clamp(*h, *n))).collect();
    let count: usize = axes.iter().map(|(l, h)| (h + 1).saturating_sub(*l)).product();
    let (none, all) = if max { (f64::NEG_INFINITY, f64::INFINITY) } else { (f64::INFINITY, f64::NEG_INFINITY) };
    if count > attnc_compiler::ir::READ_BOX {
        return all;
    }
    let mut best = none;
    for k in 0..count {
        let (mut rest, mut flat, mut stride) = (k, 0, 1);
        for ((l, h), n) in axes.iter().zip(&t.shape).rev() {
            let w = h + 1 - l;
            flat += (l + rest % w) * stride;
            rest /= w;
            stride *= n;
        }
        let v = t.data[flat];
        best = if max { best.max(v) } else { best.min(v) };
    }
    best
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
