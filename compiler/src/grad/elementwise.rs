//! Derivatives of the elementwise functions, as IR nodes of the operand `x`
//! and the result `y` (docs/semantics.md §5 gives each rule).

use super::{Builder, GradError};
use crate::ir::{BinaryOp as B, NodeId, Op, UnaryOp, GELU_TANH_A, GELU_TANH_C};

impl Builder {
    fn unary(&mut self, op: UnaryOp, x: NodeId) -> Result<NodeId, GradError> {
        self.push(Op::Unary { op, x })
    }

    /// `c · x`.
    fn times(&mut self, c: f64, x: NodeId) -> Result<NodeId, GradError> {
        let c = self.scalar(c)?;
        self.binary(B::Mul, c, x)
    }

    /// `c + x`.
    fn plus(&mut self, c: f64, x: NodeId) -> Result<NodeId, GradError> {
        let c = self.scalar(c)?;
        self.binary(B::Add, c, x)
    }

    /// `c − x`.
    fn minus(&mut self, c: f64, x: NodeId) -> Result<NodeId, GradError> {
        let c = self.scalar(c)?;
        self.binary(B::Sub, c, x)
    }

    /// `d op(x) / dx` of `y = op(x)` for the smooth functions (`Neg`, `Sqrt`
    /// and `Abs` have their own rules in `vjp`); `None` for the piecewise
    /// constant ones, whose derivative is 0 wherever it exists.
    pub(super) fn unary_derivative(&mut self, op: UnaryOp, x: NodeId, y: NodeId) -> Result<Option<NodeId>, GradError> {
        let d = match op {
            UnaryOp::Neg | UnaryOp::Sqrt | UnaryOp::Abs => unreachable!("`{}` has its own rule", op.name()),
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Sign => return Ok(None),
            UnaryOp::Exp => y,
            UnaryOp::Log => {
                let one = self.scalar(1.0)?;
                self.binary(B::Div, one, x)?
            }
            UnaryOp::Log1p => {
                let (one, den) = (self.scalar(1.0)?, self.plus(1.0, x)?);
                self.binary(B::Div, one, den)?
            }
            UnaryOp::Tanh => {
                let yy = self.binary(B::Mul, y, y)?;
                self.minus(1.0, yy)?
            }
            UnaryOp::Sigmoid => {
                let rest = self.minus(1.0, y)?;
                self.binary(B::Mul, y, rest)?
            }
            UnaryOp::Softplus => self.unary(UnaryOp::Sigmoid, x)?,
            UnaryOp::Silu => {
                // s · (1 + x (1 − s)), s = sigmoid(x).
                let s = self.unary(UnaryOp::Sigmoid, x)?;
                let rest = self.minus(1.0, s)?;
                let xr = self.binary(B::Mul, x, rest)?;
                let inner = self.plus(1.0, xr)?;
                self.binary(B::Mul, s, inner)?
            }
            UnaryOp::Gelu => {
                // Φ(x) + x φ(x): Φ = (1 + erf(x/√2)) / 2, φ = e^{−x²/2} / √(2π).
                let scaled = self.times(std::f64::consts::FRAC_1_SQRT_2, x)?;
                let erf = self.unary(UnaryOp::Erf, scaled)?;
                let one_plus = self.plus(1.0, erf)?;
                let cdf = self.times(0.5, one_plus)?;
                let pdf = self.normal_pdf(x)?;
                let xpdf = self.binary(B::Mul, x, pdf)?;
                self.binary(B::Add, cdf, xpdf)?
            }
            UnaryOp::GeluTanh => {
                // t = tanh(c (x + a x³)): (1 + t)/2 + x (1 − t²) c (1 + 3a x²) / 2.
                let xx = self.binary(B::Mul, x, x)?;
                let xxx = self.binary(B::Mul, xx, x)?;
                let cubic = self.times(GELU_TANH_A, xxx)?;
                let inner = self.binary(B::Add, x, cubic)?;
                let u = self.times(GELU_TANH_C, inner)?;
                let t = self.unary(UnaryOp::Tanh, u)?;
                let half = self.plus(1.0, t)?;
                let left = self.times(0.5, half)?;
                let tt = self.binary(B::Mul, t, t)?;
                let sech2 = self.minus(1.0, tt)?;
                let slope_x = self.times(3.0 * GELU_TANH_A, xx)?;
                let slope_1 = self.plus(1.0, slope_x)?;
                let slope = self.times(0.5 * GELU_TANH_C, slope_1)?;
                let xs = self.binary(B::Mul, x, sech2)?;
                let right = self.binary(B::Mul, xs, slope)?;
                self.binary(B::Add, left, right)?
            }
            UnaryOp::Erf => {
                // 2/√π · e^{−x²} = 2 √2 · φ(√2 x).
                let xx = self.binary(B::Mul, x, x)?;
                let neg = self.times(-1.0, xx)?;
                let e = self.unary(UnaryOp::Exp, neg)?;
                self.times(std::f64::consts::FRAC_2_SQRT_PI, e)?
            }
            UnaryOp::Sin => self.unary(UnaryOp::Cos, x)?,
            UnaryOp::Cos => {
                let s = self.unary(UnaryOp::Sin, x)?;
                self.times(-1.0, s)?
            }
        };
        Ok(Some(d))
    }

    /// The standard normal density `e^{−x²/2} / √(2π)`.
    fn normal_pdf(&mut self, x: NodeId) -> Result<NodeId, GradError> {
        let xx = self.binary(B::Mul, x, x)?;
        let neg = self.times(-0.5, xx)?;
        let e = self.unary(UnaryOp::Exp, neg)?;
        self.times(0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2, e)
    }

    /// The cotangents of `a` and `b` for `y = a^b` (broadcast shapes): `g b a^(b−1)`
    /// and `g y ln a` where `a > 0` (0 elsewhere, where `ln a` is not real).
    pub(super) fn pow_vjp(&mut self, a: NodeId, b: NodeId, y: NodeId, g: NodeId) -> Result<[NodeId; 2], GradError> {
        let b1 = self.plus(-1.0, b)?;
        let pw = self.binary(B::Pow, a, b1)?;
        let slope = self.binary(B::Mul, b, pw)?;
        let ga = self.binary(B::Mul, g, slope)?;
        let zero = self.scalar(0.0)?;
        let positive = self.binary(B::Gt, a, zero)?;
        let ln = self.unary(UnaryOp::Log, a)?;
        let gy = self.binary(B::Mul, g, y)?;
        let gl = self.binary(B::Mul, gy, ln)?;
        let gb = self.push(Op::Where { cond: positive, a: gl, b: zero })?;
        Ok([ga, gb])
    }
}
