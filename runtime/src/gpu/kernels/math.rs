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
        BinaryOp::Add => add::expand::<f32>(scope, x, y),
        BinaryOp::Sub => sub::expand::<f32>(scope, x, y),
        BinaryOp::Mul => mul::expand::<f32>(scope, x, y),
        BinaryOp::Div => div::expand(scope, x, y),
        BinaryOp::Max => maximum::expand::<f32>(scope, x, y),
        BinaryOp::Min => minimum::expand::<f32>(scope, x, y),
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

/// The helpers that are one method of `f32`: `name => method`.
macro_rules! methods {
    ($($name:ident => $method:ident),* $(,)?) => {$(
        #[cube]
        fn $name(x: f32) -> f32 {
            x.$method()
        }
    )*};
}

methods!(sqrt => sqrt, abs => abs, exp => exp, log => ln, log1p => log1p, tanh => tanh, sin => sin, cos => cos,
    floor => floor, ceil => ceil);

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

/// `x + y` in f32, or in i32 for the functions' integer arithmetic
/// (`gpu::func`), as [`sub`] and [`mul`].
#[cube]
pub(crate) fn add<T: Numeric>(x: T, y: T) -> T {
    x + y
}

#[cube]
pub(crate) fn sub<T: Numeric>(x: T, y: T) -> T {
    x - y
}

#[cube]
pub(crate) fn mul<T: Numeric>(x: T, y: T) -> T {
    x * y
}

#[cube]
fn div(x: f32, y: f32) -> f32 {
    x / y
}

#[cube]
pub(crate) fn maximum<T: Numeric>(x: T, y: T) -> T {
    max(x, y)
}

#[cube]
pub(crate) fn minimum<T: Numeric>(x: T, y: T) -> T {
    min(x, y)
}

#[cube]
fn ge(x: f32, y: f32) -> f32 {
    select(x >= y, f32::new(1.0), f32::new(0.0))
}

#[cube]
fn gt(x: f32, y: f32) -> f32 {
    select(x > y, f32::new(1.0), f32::new(0.0))
}

#[cube]
fn eq(x: f32, y: f32) -> f32 {
    select(x == y, f32::new(1.0), f32::new(0.0))
}

#[cube]
fn pow(x: f32, y: f32) -> f32 {
    x.powf(y)
}
