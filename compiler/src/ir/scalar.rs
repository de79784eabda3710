//! The elementwise functions on one float64 value: the definition every
//! kernel's code for `UnaryOp` and `BinaryOp` is tested against
//! (`docs/semantics.md` §5). Score and mask functions call the same rules.

use super::{BinaryOp, UnaryOp, GELU_TANH_A, GELU_TANH_C};

pub fn unary(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sigmoid(x),
        // max(x, 0) + log(1 + e^−|x|): no overflow for large |x|.
        UnaryOp::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::Gelu => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        UnaryOp::GeluTanh => 0.5 * x * (1.0 + (GELU_TANH_C * (x + GELU_TANH_A * x * x * x)).tanh()),
        UnaryOp::Erf => libm::erf(x),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Sign => sign(x),
    }
}

pub fn binary(op: BinaryOp, x: f64, y: f64) -> f64 {
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Max => x.max(y),
        BinaryOp::Min => x.min(y),
        BinaryOp::Ge => f64::from(u8::from(x >= y)),
        BinaryOp::Gt => f64::from(u8::from(x > y)),
        BinaryOp::Eq => f64::from(u8::from(x == y)),
        BinaryOp::Pow => x.powf(y),
    }
}

/// `1 / (1 + e^−x)`, computed on the side where the exponential cannot overflow.
fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// −1, 0 or 1; NaN stays NaN (unlike `f64::signum`, which gives 1 at 0).
fn sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        x * 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent values: erf and Φ from tables (Abramowitz & Stegun 7.1),
    /// the rest from their definitions at points where they are exact.
    #[test]
    fn unary_rules_match_known_values() {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
        assert!(close(unary(UnaryOp::Erf, 0.5), 0.520_499_877_813_046_5));
        assert!(close(unary(UnaryOp::Erf, -1.0), -0.842_700_792_949_714_9));
        // Φ(1) = 0.841344746068543.
        assert!(close(unary(UnaryOp::Gelu, 1.0), 0.841_344_746_068_542_9));
        assert!(close(unary(UnaryOp::Sigmoid, 0.0), 0.5));
        assert!(close(unary(UnaryOp::Sigmoid, -800.0), 0.0));
        assert!(close(unary(UnaryOp::Softplus, 0.0), std::f64::consts::LN_2));
        assert!(close(unary(UnaryOp::Softplus, 800.0), 800.0));
        assert!(close(unary(UnaryOp::Silu, 2.0), 2.0 / (1.0 + (-2.0f64).exp())));
        assert!(close(unary(UnaryOp::GeluTanh, 1.0), 0.841_191_990_608_276_8));
        assert_eq!(unary(UnaryOp::Sign, 0.0), 0.0);
        assert_eq!(unary(UnaryOp::Sign, -3.5), -1.0);
        assert!(unary(UnaryOp::Sign, f64::NAN).is_nan());
        assert_eq!(unary(UnaryOp::Floor, -1.5), -2.0);
        assert_eq!(unary(UnaryOp::Ceil, -1.5), -1.0);
        assert!(close(binary(BinaryOp::Pow, 2.0, 0.5), std::f64::consts::SQRT_2));
    }
}
