//! Score and mask functions compiled into attention kernels: the host walks
//! a function's expression (`ir::FExpr`, dims already replaced by their
//! values) and emits each node through a small `#[cube]` helper. Ints are
//! 32-bit in kernels; a read of a captured tensor clamps each index into
//! its axis (docs/language.md, "Score and mask functions").

use super::kernels::{self as k, math, Stored, MASKED};
use attnc_compiler::ir::{FBin, FExpr, Func, UnaryOp};
use cubecl::prelude::*;

/// A tensor a function reads: its buffer (bound after the kernel's own) and shape.
pub struct Capture {
    pub buf: NativeExpand<[Stored]>,
    pub shape: Vec<usize>,
}

/// An attention kernel's functions and what they read.
pub struct Fns {
    pub score: Option<Func>,
    pub mask: Option<Func>,
    pub captures: Vec<Capture>,
}

/// The functions as a comptime argument of the `#[cube]` backward kernels,
/// which call [`score_hook`] and [`slope_hook`] with it:
/// each is the identity without functions.
#[derive(Clone)]
pub struct Hook(pub Option<std::rc::Rc<Fns>>);

// The `#[cube]` kernels call these by name; the macro expands each call to
// the module's `expand`, so the bodies below never run.
pub fn score_hook(_s: f32, _b: usize, _h: usize, _i: usize, _j: usize, _hook: Hook) -> f32 {
    cubecl::unexpanded!()
}
pub fn slope_hook(_x: f32, _s: f32, _b: usize, _h: usize, _i: usize, _j: usize, _hook: Hook) -> f32 {
    cubecl::unexpanded!()
}

/// The score of scaled logit `s` at (b, h, i, j): the score function's
/// value where the mask function lets query `i` see key `j`, [`MASKED`]
/// where not; `s` itself (no instruction) without functions.
pub mod score_hook {
    use super::*;
    pub fn expand(
        scope: &Scope,
        s: NativeExpand<f32>,
        b: NativeExpand<usize>,
        h: NativeExpand<usize>,
        i: NativeExpand<usize>,
        j: NativeExpand<usize>,
        hook: Hook,
    ) -> NativeExpand<f32> {
        let Some(f) = &hook.0 else { return s };
        let at = Indices { b, h, i, j };
        let z = f.score(scope, s, &at);
        match f.visible(scope, &at) {
            Some(seen) => select_float::expand(scope, seen, z, NativeExpand::from_lit(scope, MASKED)),
            None => z,
        }
    }
}

/// `x · ∂score/∂s` at scaled logit `s` (0 where the mask function hides the
/// key); `x` itself without functions.
pub mod slope_hook {
    use super::*;
    pub fn expand(
        scope: &Scope,
        x: NativeExpand<f32>,
        s: NativeExpand<f32>,
        b: NativeExpand<usize>,
        h: NativeExpand<usize>,
        i: NativeExpand<usize>,
        j: NativeExpand<usize>,
        hook: Hook,
    ) -> NativeExpand<f32> {
        let Some(f) = &hook.0 else { return x };
        let at = Indices { b, h, i, j };
        let scaled = match &f.score {
            Some(score) => {
                let slope = attnc_compiler::grad::score_slope(score);
                let mut params = vec![Val::F(s)];
                params.extend(f.index_params(scope, &at));
                let d = f.emit(scope, &slope.body, &params).float();
                math::binary(scope, attnc_compiler::ir::BinaryOp::Mul, x, d)
            }
            None => x,
        };
        match f.visible(scope, &at) {
            Some(seen) => select_float::expand(scope, seen, scaled, NativeExpand::from_lit(scope, 0.0f32)),
            None => scaled,
        }
    }
}

/// A value in the kernel being built.
#[derive(Clone, Copy)]
enum Val {
    I(NativeExpand<i32>),
    F(NativeExpand<f32>),
    B(NativeExpand<bool>),
}

impl Val {
    fn int(self) -> NativeExpand<i32> {
        match self {
            Val::I(v) => v,
            _ => unreachable!("lowering typed this an int"),
        }
    }

    fn float(self) -> NativeExpand<f32> {
        match self {
            Val::F(v) => v,
            _ => unreachable!("lowering typed this a float"),
        }
    }

    fn bool(self) -> NativeExpand<bool> {
        match self {
            Val::B(v) => v,
            _ => unreachable!("lowering typed this a bool"),
        }
    }
}

/// Attention's indices for one call: batch, query head, query row, key row.
pub struct Indices {
    pub b: NativeExpand<usize>,
    pub h: NativeExpand<usize>,
    pub i: NativeExpand<usize>,
    pub j: NativeExpand<usize>,
}

impl Fns {
    /// The score function of scaled logit `s` (unchanged without one).
    pub fn score(&self, scope: &Scope, s: NativeExpand<f32>, at: &Indices) -> NativeExpand<f32> {
        let Some(f) = &self.score else { return s };
        let mut params = vec![Val::F(s)];
        params.extend(self.index_params(scope, at));
        self.emit(scope, &f.body, &params).float()
    }

    /// Whether the mask function lets the query see the key (`None` without one).
    pub fn visible(&self, scope: &Scope, at: &Indices) -> Option<NativeExpand<bool>> {
        let f = self.mask.as_ref()?;
        let params = self.index_params(scope, at);
        Some(self.emit(scope, &f.body, &params).bool())
    }

    fn index_params(&self, scope: &Scope, at: &Indices) -> Vec<Val> {
        [at.b, at.h, at.i, at.j].into_iter().map(|x| Val::I(to_int::expand(scope, x))).collect()
    }

    fn emit(&self, scope: &Scope, e: &FExpr, params: &[Val]) -> Val {
        let go = |x: &FExpr| self.emit(scope, x, params);
        match e {
            FExpr::Param(n) => params[*n],
            FExpr::Int(v) => Val::I(int_const::expand(scope, i32::try_from(*v).unwrap_or(if *v < 0 { i32::MIN } else { i32::MAX }))),
            FExpr::Float(v) => Val::F(k::fconst::expand(scope, *v as f32)),
            FExpr::Bool(v) => Val::B(bool_const::expand(scope, *v)),
            FExpr::Dim(d) => unreachable!("dim `{d}` is replaced by its value before kernels"),
            FExpr::Read { capture, indices } => {
                let c = &self.captures[*capture];
                let mut flat = int_const::expand(scope, 0);
                for (x, n) in indices.iter().zip(&c.shape) {
                    let at = clamp_index::expand(scope, go(x).int(), *n as i32 - 1);
                    flat = mul_add::expand(scope, flat, *n as i32, at);
                }
                Val::F(k::read::expand::<Stored>(scope, &c.buf, to_index::expand(scope, flat)))
            }
            FExpr::ToFloat(x) => Val::F(to_float::expand(scope, go(x).int())),
            FExpr::Neg(x) => match go(x) {
                Val::I(v) => Val::I(ineg::expand(scope, v)),
                v => Val::F(math::unary(scope, UnaryOp::Neg, v.float())),
            },
            FExpr::Not(x) => Val::B(not::expand(scope, go(x).bool())),
            FExpr::Unary(op, x) => match go(x) {
                Val::I(v) => Val::I(iabs::expand(scope, v)),
                v => Val::F(math::unary(scope, *op, v.float())),
            },
            FExpr::Where(c, a, b) => {
                let (c, a, b) = (go(c).bool(), go(a), go(b));
                match (a, b) {
                    (Val::I(a), Val::I(b)) => Val::I(select_int::expand(scope, c, a, b)),
                    (Val::B(a), Val::B(b)) => Val::B(select_bool::expand(scope, c, a, b)),
                    (a, b) => Val::F(select_float::expand(scope, c, a.float(), b.float())),
                }
            }
            FExpr::Bin(op, a, b) => binary(scope, *op, go(a), go(b)),
        }
    }
}

fn binary(scope: &Scope, op: FBin, a: Val, b: Val) -> Val {
    use attnc_compiler::ir::BinaryOp as B;
    match (a, b) {
        (Val::B(x), Val::B(y)) => Val::B(match op {
            FBin::And => and::expand(scope, x, y),
            FBin::Or => or::expand(scope, x, y),
            FBin::Eq => beq::expand(scope, x, y),
            FBin::Ne => not::expand(scope, beq::expand(scope, x, y)),
            other => unreachable!("`{}` on bools", other.symbol()),
        }),
        (Val::I(x), Val::I(y)) => match op {
            FBin::Add => Val::I(iadd::expand(scope, x, y)),
            FBin::Sub => Val::I(isub::expand(scope, x, y)),
            FBin::Mul => Val::I(imul::expand(scope, x, y)),
            FBin::FloorDiv => Val::I(floor_div::expand(scope, x, y)),
            FBin::Rem => Val::I(rem::expand(scope, x, y)),
            FBin::Max => Val::I(imax::expand(scope, x, y)),
            FBin::Min => Val::I(imin::expand(scope, x, y)),
            FBin::Lt => Val::B(ilt::expand(scope, x, y)),
            FBin::Le => Val::B(not::expand(scope, ilt::expand(scope, y, x))),
            FBin::Gt => Val::B(ilt::expand(scope, y, x)),
            FBin::Ge => Val::B(not::expand(scope, ilt::expand(scope, x, y))),
            FBin::Eq => Val::B(ieq::expand(scope, x, y)),
            FBin::Ne => Val::B(not::expand(scope, ieq::expand(scope, x, y))),
            other => unreachable!("`{}` on ints", other.symbol()),
        },
        (x, y) => {
            let (x, y) = (x.float(), y.float());
            match op {
                FBin::Add => Val::F(math::binary(scope, B::Add, x, y)),
                FBin::Sub => Val::F(math::binary(scope, B::Sub, x, y)),
                FBin::Mul => Val::F(math::binary(scope, B::Mul, x, y)),
                FBin::Div => Val::F(math::binary(scope, B::Div, x, y)),
                FBin::Pow => Val::F(math::binary(scope, B::Pow, x, y)),
                FBin::Max => Val::F(math::binary(scope, B::Max, x, y)),
                FBin::Min => Val::F(math::binary(scope, B::Min, x, y)),
                FBin::Lt => Val::B(flt::expand(scope, x, y)),
                FBin::Le => Val::B(fle::expand(scope, x, y)),
                FBin::Gt => Val::B(flt::expand(scope, y, x)),
                FBin::Ge => Val::B(fle::expand(scope, y, x)),
                FBin::Eq => Val::B(feq::expand(scope, x, y)),
                FBin::Ne => Val::B(not::expand(scope, feq::expand(scope, x, y))),
                other => unreachable!("`{}` on floats", other.symbol()),
            }
        }
    }
}

#[cube]
fn to_int(x: usize) -> i32 {
    i32::cast_from(x)
}

#[cube]
fn to_index(x: i32) -> usize {
    usize::cast_from(x)
}

#[cube]
fn to_float(x: i32) -> f32 {
    f32::cast_from(x)
}

#[cube]
fn int_const(#[comptime] v: i32) -> i32 {
    i32::new(v as i64)
}

#[cube]
fn bool_const(#[comptime] v: bool) -> bool {
    let mut r = false;
    if comptime![v] {
        r = true;
    }
    r
}

/// `x` clamped into `0..=last`.
#[cube]
fn clamp_index(x: i32, #[comptime] last: i32) -> i32 {
    min(max(x, i32::new(0)), i32::new(last as i64))
}

/// `acc · n + x`: a row-major index, one axis at a time.
#[cube]
fn mul_add(acc: i32, #[comptime] n: i32, x: i32) -> i32 {
    acc * i32::new(n as i64) + x
}

#[cube]
fn iadd(x: i32, y: i32) -> i32 {
    x + y
}

#[cube]
fn isub(x: i32, y: i32) -> i32 {
    x - y
}

#[cube]
fn imul(x: i32, y: i32) -> i32 {
    x * y
}

#[cube]
fn ineg(x: i32) -> i32 {
    -x
}

#[cube]
fn iabs(x: i32) -> i32 {
    max(x, -x)
}

#[cube]
fn imax(x: i32, y: i32) -> i32 {
    max(x, y)
}

#[cube]
fn imin(x: i32, y: i32) -> i32 {
    min(x, y)
}

/// ⌊x / y⌋ (0 for y = 0); the hardware's division truncates toward zero.
#[cube]
fn floor_div(x: i32, y: i32) -> i32 {
    let mut q = i32::new(0);
    if y != i32::new(0) {
        q = x / y;
        if q * y != x && (x < i32::new(0)) != (y < i32::new(0)) {
            q -= i32::new(1);
        }
    }
    q
}

/// `x − y·⌊x / y⌋` (0 for y = 0).
#[cube]
fn rem(x: i32, y: i32) -> i32 {
    let mut r = i32::new(0);
    if y != i32::new(0) {
        r = x - y * floor_div(x, y);
    }
    r
}

#[cube]
fn ilt(x: i32, y: i32) -> bool {
    x < y
}

#[cube]
fn ieq(x: i32, y: i32) -> bool {
    x == y
}

#[cube]
fn flt(x: f32, y: f32) -> bool {
    x < y
}

#[cube]
fn fle(x: f32, y: f32) -> bool {
    x <= y
}

#[cube]
fn feq(x: f32, y: f32) -> bool {
    x == y
}

#[cube]
fn and(x: bool, y: bool) -> bool {
    x && y
}

#[cube]
fn or(x: bool, y: bool) -> bool {
    x || y
}

#[cube]
fn not(x: bool) -> bool {
    !x
}

#[cube]
fn beq(x: bool, y: bool) -> bool {
    x == y
}

#[cube]
fn select_int(c: bool, a: i32, b: i32) -> i32 {
    let mut r = b;
    if c {
        r = a;
    }
    r
}

#[cube]
fn select_float(c: bool, a: f32, b: f32) -> f32 {
    let mut r = b;
    if c {
        r = a;
    }
    r
}

#[cube]
fn select_bool(c: bool, a: bool, b: bool) -> bool {
    let mut r = b;
    if c {
        r = a;
    }
    r
}
