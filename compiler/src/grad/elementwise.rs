//! Derivatives of the elementwise functions (docs/semantics.md §5 gives
//! each rule), written once over an [`Algebra`]: IR nodes for gradient
//! programs, function expressions for a score function's slope
//! (`grad::func`).

use super::{Builder, GradError};
use crate::ir::{BinaryOp as B, NodeId, Op, UnaryOp, GELU_TANH_A, GELU_TANH_C};

/// What derivative rules are built with.
pub(crate) trait Algebra {
    type V: Clone;
    type E;
    fn constant(&mut self, c: f64) -> Result<Self::V, Self::E>;
    fn unary(&mut self, op: UnaryOp, x: Self::V) -> Result<Self::V, Self::E>;
    /// An arithmetic operation (`Add`, `Sub`, `Mul`, `Div`, `Pow`).
    fn binary(&mut self, op: B, a: Self::V, b: Self::V) -> Result<Self::V, Self::E>;
    /// `a` where `x > 0`, else `b`.
    fn where_positive(&mut self, x: Self::V, a: Self::V, b: Self::V) -> Result<Self::V, Self::E>;

    /// `c · x`.
    fn times(&mut self, c: f64, x: Self::V) -> Result<Self::V, Self::E> {
        let c = self.constant(c)?;
        self.binary(B::Mul, c, x)
    }

    /// `c + x`.
    fn plus(&mut self, c: f64, x: Self::V) -> Result<Self::V, Self::E> {
        let c = self.constant(c)?;
        self.binary(B::Add, c, x)
    }

    /// `c − x`.
    fn minus(&mut self, c: f64, x: Self::V) -> Result<Self::V, Self::E> {
        let c = self.constant(c)?;
        self.binary(B::Sub, c, x)
    }

    fn mul(&mut self, a: Self::V, b: Self::V) -> Result<Self::V, Self::E> {
        self.binary(B::Mul, a, b)
    }
}

/// `d op(x) / dx` of `y = op(x)`; `None` for the piecewise constant
/// functions, whose derivative is 0 wherever it exists.
pub(crate) fn unary_derivative<A: Algebra>(a: &mut A, op: UnaryOp, x: A::V, y: A::V) -> Result<Option<A::V>, A::E> {
    let d = match op {
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Sign => return Ok(None),
        UnaryOp::Neg => a.constant(-1.0)?,
        UnaryOp::Abs => a.unary(UnaryOp::Sign, x)?,
        UnaryOp::Sqrt => {
            // 1 / (2 √x); 0 at 0, where √ has no derivative.
            let (one, twice) = (a.constant(1.0)?, a.times(2.0, y.clone())?);
            let q = a.binary(B::Div, one, twice)?;
            let zero = a.constant(0.0)?;
            a.where_positive(y, q, zero)?
        }
        UnaryOp::Exp => y,
        UnaryOp::Log => {
            let one = a.constant(1.0)?;
            a.binary(B::Div, one, x)?
        }
        UnaryOp::Log1p => {
            let (one, den) = (a.constant(1.0)?, a.plus(1.0, x)?);
            a.binary(B::Div, one, den)?
        }
        UnaryOp::Tanh => {
            let yy = a.mul(y.clone(), y)?;
            a.minus(1.0, yy)?
        }
        UnaryOp::Sigmoid => {
            let rest = a.minus(1.0, y.clone())?;
            a.mul(y, rest)?
        }
        UnaryOp::Softplus => a.unary(UnaryOp::Sigmoid, x)?,
        UnaryOp::Silu => {
            // s · (1 + x (1 − s)), s = sigmoid(x).
            let s = a.unary(UnaryOp::Sigmoid, x.clone())?;
            let rest = a.minus(1.0, s.clone())?;
            let xr = a.mul(x, rest)?;
            let inner = a.plus(1.0, xr)?;
            a.mul(s, inner)?
        }
        UnaryOp::Gelu => {
            // Φ(x) + x φ(x): Φ = (1 + erf(x/√2)) / 2, φ = e^{−x²/2} / √(2π).
            let scaled = a.times(std::f64::consts::FRAC_1_SQRT_2, x.clone())?;
            let erf = a.unary(UnaryOp::Erf, scaled)?;
            let one_plus = a.plus(1.0, erf)?;
            let cdf = a.times(0.5, one_plus)?;
            let xx = a.mul(x.clone(), x.clone())?;
            let neg = a.times(-0.5, xx)?;
            let e = a.unary(UnaryOp::Exp, neg)?;
            let pdf = a.times(0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2, e)?;
            let xpdf = a.mul(x, pdf)?;
            a.binary(B::Add, cdf, xpdf)?
        }
        UnaryOp::GeluTanh => {
            // t = tanh(c (x + a x³)): (1 + t)/2 + x (1 − t²) c (1 + 3a x²) / 2.
            let xx = a.mul(x.clone(), x.clone())?;
            let xxx = a.mul(xx.clone(), x.clone())?;
            let cubic = a.times(GELU_TANH_A, xxx)?;
            let inner = a.binary(B::Add, x.clone(), cubic)?;
            let u = a.times(GELU_TANH_C, inner)?;
            let t = a.unary(UnaryOp::Tanh, u)?;
            let half = a.plus(1.0, t.clone())?;
            let left = a.times(0.5, half)?;
            let tt = a.mul(t.clone(), t)?;
            let sech2 = a.minus(1.0, tt)?;
            let slope_x = a.times(3.0 * GELU_TANH_A, xx)?;
            let slope_1 = a.plus(1.0, slope_x)?;
            let slope = a.times(0.5 * GELU_TANH_C, slope_1)?;
            let xs = a.mul(x, sech2)?;
            let right = a.mul(xs, slope)?;
            a.binary(B::Add, left, right)?
        }
        UnaryOp::Erf => {
            let xx = a.mul(x.clone(), x)?;
            let neg = a.times(-1.0, xx)?;
            let e = a.unary(UnaryOp::Exp, neg)?;
            a.times(std::f64::consts::FRAC_2_SQRT_PI, e)?
        }
        UnaryOp::Sin => a.unary(UnaryOp::Cos, x)?,
        UnaryOp::Cos => {
            let s = a.unary(UnaryOp::Sin, x)?;
            a.times(-1.0, s)?
        }
    };
    Ok(Some(d))
}

/// The partial derivatives of `y = a^b`: by `a`, `b a^(b−1)`; by `b`,
/// `y ln a` where `a > 0` (0 elsewhere, where `ln a` is not real).
pub(crate) fn pow_partials<A: Algebra>(al: &mut A, a: A::V, b: A::V, y: A::V) -> Result<[A::V; 2], A::E> {
    let b1 = al.plus(-1.0, b.clone())?;
    let pw = al.binary(B::Pow, a.clone(), b1)?;
    let da = al.mul(b, pw)?;
    let ln = al.unary(UnaryOp::Log, a.clone())?;
    let yl = al.mul(y, ln)?;
    let zero = al.constant(0.0)?;
    let db = al.where_positive(a, yl, zero)?;
    Ok([da, db])
}

impl Algebra for Builder {
    type V = NodeId;
    type E = GradError;

    fn constant(&mut self, c: f64) -> Result<NodeId, GradError> {
        self.scalar(c)
    }

    fn unary(&mut self, op: UnaryOp, x: NodeId) -> Result<NodeId, GradError> {
        self.push(Op::Unary { op, x })
    }

    fn binary(&mut self, op: B, a: NodeId, b: NodeId) -> Result<NodeId, GradError> {
        self.push(Op::Binary { op, a, b })
    }

    fn where_positive(&mut self, x: NodeId, a: NodeId, b: NodeId) -> Result<NodeId, GradError> {
        let zero = self.scalar(0.0)?;
        let cond = self.push(Op::Binary { op: B::Gt, a: x, b: zero })?;
        self.push(Op::Where { cond, a, b })
    }
}
