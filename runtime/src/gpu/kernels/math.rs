//! The elementwise functions in f32, one `#[cube]` helper each; [`unary`]
//! and [`binary`] pick the helper from the IR's operation by an exhaustive
//! `match`, so a new operation cannot compile without its code. The rules
//! are the interpreter's (`ir::scalar`), which the kernels are tested against.

use attnc_compiler::ir::{BinaryOp, UnaryOp, GELU_TANH_A, GELU_TANH_C};
use cubecl::prelude::*;

/// `op(x)` in the kernel being built.
pub fn unary(scope: &Scope, op: UnaryOp, x: NativeExpand<f32>) -> NativeExpand<f32> {
    match op {
        UnaryOp::Neg => neg::expand(scope, x),
        UnaryOp::Sqrt => sqrt::expand(scope, x),
        UnaryOp::Abs => abs::expand(scope, x),
        UnaryOp::Exp => exp::expand(scope, x),
        UnaryOp::Log => log::expand(scope, x),
        UnaryOp::Log1p => log1p::expand(scope, x),
        UnaryOp::Tanh => tanh::expand(scope, x),
        UnaryOp::Sigmoid => sigmoid::expand(scope, x),
        UnaryOp::Softplus => softplus::expand(scope, x),
        UnaryOp::Silu => silu::expand(scope, x),
        UnaryOp::Gelu => gelu::expand(scope, x),
        UnaryOp::GeluTanh => gelu_tanh::expand(scope, x, GELU_TANH_C as f32, GELU_TANH_A as f32),
        UnaryOp::Erf => erf::expand(scope, x),
        UnaryOp::Sin => sin::expand(scope, x),
        UnaryOp::Cos => cos::expand(scope, x),
        UnaryOp::Floor => floor::expand(scope, x),
        UnaryOp::Ceil => ceil::expand(scope, x),
        UnaryOp::Sign => sign::expand(scope, x),
    }
}

/// `op(x, y)` in the kernel being built; comparisons give 1.0 or 0.0.
pub fn binary(scope: &Scope, op: BinaryOp, x: NativeExpand<f32>, y: NativeExpand<f32>) -> NativeExpand<f32> {
    match op {
        BinaryOp::Add => add::expand(scope, x, y),
        BinaryOp::Sub => sub::expand(scope, x, y),
        BinaryOp::Mul => mul::expand(scope, x, y),
        BinaryOp::Div => div::expand(scope, x, y),
        BinaryOp::Max => fmax::expand(scope, x, y),
        BinaryOp::Min => fmin::expand(scope, x, y),
        BinaryOp::Ge => ge::expand(scope, x, y),
        BinaryOp::Gt => gt::expand(scope, x, y),
        BinaryOp::Eq => eq::expand(scope, x, y),
        BinaryOp::Pow => pow::expand(scope, x, y),
    }
}

#[cube]
fn neg(x: f32) -> f32 {
    -x
}

#[cube]
fn sqrt(x: f32) -> f32 {
    x.sqrt()
}

#[cube]
fn abs(x: f32) -> f32 {
    x.abs()
}

#[cube]
fn exp(x: f32) -> f32 {
    x.exp()
}

#[cube]
fn log(x: f32) -> f32 {
    x.ln()
}

#[cube]
fn log1p(x: f32) -> f32 {
    x.log1p()
}

#[cube]
fn tanh(x: f32) -> f32 {
    x.tanh()
}

/// `1 / (1 + e^−x)`: at very negative `x` the exponential is +∞ and the result 0.
#[cube]
fn sigmoid(x: f32) -> f32 {
    f32::new(1.0) / (f32::new(1.0) + (-x).exp())
}

/// `max(x, 0) + log1p(e^−|x|)`, which cannot overflow.
#[cube]
fn softplus(x: f32) -> f32 {
    max(x, f32::new(0.0)) + (-x.abs()).exp().log1p()
}

#[cube]
fn silu(x: f32) -> f32 {
    x / (f32::new(1.0) + (-x).exp())
}

#[cube]
fn gelu(x: f32) -> f32 {
    f32::new(0.5) * x * (f32::new(1.0) + Erf::erf(x * f32::new(core::f32::consts::FRAC_1_SQRT_2)))
}

#[cube]
fn gelu_tanh(x: f32, #[comptime] c: f32, #[comptime] a: f32) -> f32 {
    let u = f32::new(c) * (x + f32::new(a) * x * x * x);
    f32::new(0.5) * x * (f32::new(1.0) + u.tanh())
}

#[cube]
fn erf(x: f32) -> f32 {
    Erf::erf(x)
}

#[cube]
fn sin(x: f32) -> f32 {
    x.sin()
}

#[cube]
fn cos(x: f32) -> f32 {
    x.cos()
}

#[cube]
fn floor(x: f32) -> f32 {
    x.floor()
}

#[cube]
fn ceil(x: f32) -> f32 {
    x.ceil()
}

/// −1, 0 or 1; NaN (neither side of 0) stays NaN.
#[cube]
fn sign(x: f32) -> f32 {
    let mut r = x * f32::new(0.0);
    if x > f32::new(0.0) {
        r = f32::new(1.0);
    }
    if x < f32::new(0.0) {
        r = f32::new(-1.0);
    }
    r
}

#[cube]
fn add(x: f32, y: f32) -> f32 {
    x + y
}

#[cube]
fn sub(x: f32, y: f32) -> f32 {
    x - y
}

#[cube]
fn mul(x: f32, y: f32) -> f32 {
    x * y
}

#[cube]
fn div(x: f32, y: f32) -> f32 {
    x / y
}

#[cube]
fn fmax(x: f32, y: f32) -> f32 {
    max(x, y)
}

#[cube]
fn fmin(x: f32, y: f32) -> f32 {
    min(x, y)
}

#[cube]
fn ge(x: f32, y: f32) -> f32 {
    let mut r = f32::new(0.0);
    if x >= y {
        r = f32::new(1.0);
    }
    r
}

#[cube]
fn gt(x: f32, y: f32) -> f32 {
    let mut r = f32::new(0.0);
    if x > y {
        r = f32::new(1.0);
    }
    r
}

#[cube]
fn eq(x: f32, y: f32) -> f32 {
    let mut r = f32::new(0.0);
    if x == y {
        r = f32::new(1.0);
    }
    r
}

#[cube]
fn pow(x: f32, y: f32) -> f32 {
    x.powf(y)
}
