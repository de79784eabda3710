//! Score and mask functions compiled into attention kernels: the host walks
//! a function's expression (`ir::FExpr`, dims already replaced by their
//! values) and emits each node through a small `#[cube]` helper. Ints are
//! 32-bit in kernels; a read of a captured tensor clamps each index into
//! its axis (docs/language.md, "Score and mask functions").

use super::kernels::{self as k, math, Stored};
use super::kit::mask::MASKED;
use attnc_compiler::grad::read_partials;
use attnc_compiler::ir::{FBin, FExpr, Func, UnaryOp, READ_BOX};
use attnc_compiler::plan::{value_elements, Dtype, KernelFns};
use attnc_compiler::sparsity::{reads, TileFns};

/// The largest magnitude a bound takes (WGSL has no infinite literals).
const BIG: f32 = 3.0e38;
use cubecl::prelude::*;

/// The expanded `usize`, `f32` and `bool` of `#[cube]` code, as the hooks
/// and the function emitters pass them.
type Ix = NativeExpand<usize>;
type Fl = NativeExpand<f32>;
type Bl = NativeExpand<bool>;

/// A tensor a function reads: its buffer (bound after the kernel's own),
/// shape, and elements a value (`plan::Plan::elements_per_value`).
pub struct Capture {
    pub buf: NativeExpand<[Stored]>,
    pub shape: Vec<usize>,
    pub digits: usize,
}

/// An attention kernel's functions and what they read.
pub struct Fns {
    pub score: Option<Func>,
    pub mask: Option<Func>,
    pub tiles: Option<TileFns>,
    pub captures: Vec<Capture>,
    /// The capture holding a softmax's sink logits (`[H]`).
    pub sink: Option<usize>,
    /// The reads `prep_hook` made before a `#[cube]` kernel's tile loop.
    pub prepared: std::cell::RefCell<Vec<Fl>>,
}

/// Attention's functions `f` over the capture buffers `caps` (bound after
/// the launch's operands); `dtype`: the plan's storage, in which integer
/// captures may be digits.
pub fn fns_of(f: &KernelFns, caps: &[NativeExpand<[Stored]>], dtype: Dtype) -> Fns {
    let digits = |i: usize| value_elements(f.integers.get(i) == Some(&true), dtype);
    Fns {
        score: f.score.clone(),
        mask: f.mask.clone(),
        tiles: f.tiles.clone(),
        sink: f.sink,
        prepared: Default::default(),
        captures: (caps.iter().zip(&f.captures).enumerate())
            .map(|(i, (buf, shape))| Capture { buf: (*buf).clone_unchecked(), shape: shape.clone(), digits: digits(i) })
            .collect(),
    }
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
#[allow(clippy::too_many_arguments)]
pub fn tile_hook(
    _b: usize,
    _h: usize,
    _r0: usize,
    _r1: usize,
    _t: usize,
    _tile: usize,
    _n: usize,
    _keys: bool,
    _hook: Hook,
) -> bool {
    cubecl::unexpanded!()
}
pub fn prep_hook(_b: usize, _h: usize, _r0: usize, _r1: usize, _keys: bool, _hook: Hook) {
    cubecl::unexpanded!()
}
pub fn sink_hook(_h: usize, _hook: Hook) -> f32 {
    cubecl::unexpanded!()
}
#[allow(clippy::too_many_arguments)]
pub fn read_hook(
    _acc: &mut Array<f32>,
    _x: f32,
    _s: f32,
    _b: usize,
    _h: usize,
    _i: usize,
    _j: usize,
    _capture: usize,
    _hook: Hook,
) {
    cubecl::unexpanded!()
}
pub fn index_hook(_b: usize, _h: usize, _i: usize, _j: usize, _capture: usize, _read: usize, _hook: Hook) -> usize {
    cubecl::unexpanded!()
}

/// `acc[r] += x · ∂score/∂read_r` at scaled logit `s`, for each distinct
/// read `r` of capture `capture` in the score function
/// (`grad::read_partials`' order), where the mask function lets query `i`
/// see key `j` (the gradient of a tensor the score function reads).
pub mod read_hook {
    use super::*;
    #[allow(clippy::too_many_arguments)]
    pub fn expand(
        scope: &Scope,
        acc: &mut NativeExpand<Array<f32>>,
        x: Fl,
        s: Fl,
        b: Ix,
        h: Ix,
        i: Ix,
        j: Ix,
        capture: usize,
        hook: Hook,
    ) {
        let f = hook.0.as_ref().expect("a score function reads the tensor");
        let score = f.score.as_ref().expect("a score function reads the tensor");
        let at = Indices { b, h, i, j };
        let params = score_params(scope, s, &at);
        let seen = f.visible(scope, &at);
        for (r, (_, partial)) in read_partials(score, capture).iter().enumerate() {
            let d = f.emit(scope, &partial.body, &params, &[]).float();
            let v = math::binary(scope, attnc_compiler::ir::BinaryOp::Mul, x, d);
            add_at::expand(scope, acc, r, zero_where_hidden(scope, v, seen));
        }
    }
}

/// The entry (row-major, each axis clamped into the shape as a read is)
/// that read `read` of capture `capture` in the score function indexes at
/// (b, h, i, j).
pub mod index_hook {
    use super::*;
    #[allow(clippy::too_many_arguments)]
    pub fn expand(scope: &Scope, b: Ix, h: Ix, i: Ix, j: Ix, capture: usize, read: usize, hook: Hook) -> Ix {
        let f = hook.0.as_ref().expect("a score function reads the tensor");
        let score = f.score.as_ref().expect("a score function reads the tensor");
        let (indices, _) = &read_partials(score, capture)[read];
        // The index functions see ints only: the logit is never read.
        let params = score_params(scope, NativeExpand::from_lit(scope, 0.0f32), &Indices { b, h, i, j });
        let flat = f.flat_index(scope, capture, indices, &params, &[]);
        to_index::expand(scope, flat)
    }
}

/// Makes the reads of the tile functions that are the same for every tile
/// the cube walks ([`Fns::prepare`]) where it is called, before the tile
/// loop, for [`tile_hook`] inside it; nothing without a mask function.
pub mod prep_hook {
    use super::*;
    pub fn expand(scope: &Scope, b: Ix, h: Ix, r0: Ix, r1: Ix, keys: bool, hook: Hook) {
        if let Some(f) = hook.0.as_ref() {
            let at = Tile { b, h, i0: r0, i1: r1, j0: r0, j1: r1 };
            let reads = f.prepare(scope, &at, keys);
            *f.prepared.borrow_mut() = reads;
        }
    }
}

/// Whether some pair of the cube's rows `r0..=r1` and the other side's tile
/// `t` (rows `t·tile ..`, of `n`) may be seen through the mask function
/// (true, emitting nothing, without one): the backward skips the
/// computation of tiles where not. `keys`: the tile is of key rows (and the
/// cube's rows are queries), else of query rows.
pub mod tile_hook {
    use super::*;
    #[allow(clippy::too_many_arguments)]
    pub fn expand(
        scope: &Scope,
        b: Ix,
        h: Ix,
        r0: Ix,
        r1: Ix,
        t: Ix,
        tile: usize,
        n: usize,
        keys: bool,
        hook: Hook,
    ) -> Bl {
        let Some(fns) = hook.0.as_ref().filter(|f| f.tiles.is_some()) else {
            return NativeExpand::from_lit(scope, true);
        };
        let t0 = k::mul_const::expand(scope, t, tile);
        let t1 = tile_last::expand(scope, t0, tile, n);
        let at = if keys {
            Tile { b, h, i0: r0, i1: r1, j0: t0, j1: t1 }
        } else {
            Tile { b, h, i0: t0, i1: t1, j0: r0, j1: r1 }
        };
        let prep = fns.prepared.borrow().clone();
        fns.tile(scope, &at, &prep, keys).expect("tile functions").0
    }
}

/// The last row of the tile `t0 ..` of `tile` rows, of `n`.
#[cube]
fn tile_last(t0: usize, #[comptime] tile: usize, #[comptime] n: usize) -> usize {
    min(t0 + comptime![tile - 1], comptime![n - 1])
}

/// The score of scaled logit `s` at (b, h, i, j): the score function's
/// value where the mask function lets query `i` see key `j`, [`MASKED`]
/// where not; `s` itself (no instruction) without functions.
/// Query head `h`'s sink logit (`sink =`); 0 without one.
pub mod sink_hook {
    use super::*;
    pub fn expand(scope: &Scope, h: Ix, hook: Hook) -> Fl {
        let sink = hook.0.as_ref().and_then(|f| f.sink_logit(scope, h));
        sink.unwrap_or_else(|| k::fconst::expand(scope, 0.0))
    }
}

pub mod score_hook {
    use super::*;
    pub fn expand(scope: &Scope, s: Fl, b: Ix, h: Ix, i: Ix, j: Ix, hook: Hook) -> Fl {
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
    #[allow(clippy::too_many_arguments)]
    pub fn expand(scope: &Scope, x: Fl, s: Fl, b: Ix, h: Ix, i: Ix, j: Ix, hook: Hook) -> Fl {
        let Some(f) = &hook.0 else { return x };
        let at = Indices { b, h, i, j };
        let scaled = match f.slope(scope, s, &at) {
            Some(d) => math::binary(scope, attnc_compiler::ir::BinaryOp::Mul, x, d),
            None => x,
        };
        zero_where_hidden(scope, scaled, f.visible(scope, &at))
    }
}

/// `scaled` where `seen` (everywhere without a mask function), else 0.
fn zero_where_hidden(scope: &Scope, scaled: Fl, seen: Option<Bl>) -> Fl {
    match seen {
        Some(seen) => select_float::expand(scope, seen, scaled, NativeExpand::from_lit(scope, 0.0f32)),
        None => scaled,
    }
}

/// Indices as a function's int parameters.
fn ints(scope: &Scope, xs: &[Ix]) -> Vec<Val> {
    xs.iter().map(|x| Val::I(to_int::expand(scope, *x))).collect()
}

/// A score function's parameters: the scaled logit `s` and the pair's indices.
fn score_params(scope: &Scope, s: Fl, at: &Indices) -> Vec<Val> {
    let mut params = vec![Val::F(s)];
    params.extend(ints(scope, &[at.b, at.h, at.i, at.j]));
    params
}

/// A value in the kernel being built.
#[derive(Clone, Copy)]
enum Val {
    I(NativeExpand<i32>),
    F(Fl),
    B(Bl),
}

impl Val {
    fn int(self) -> NativeExpand<i32> {
        match self {
            Val::I(v) => v,
            _ => unreachable!("lowering typed this an int"),
        }
    }

    fn float(self) -> Fl {
        match self {
            Val::F(v) => v,
            _ => unreachable!("lowering typed this a float"),
        }
    }

    fn bool(self) -> Bl {
        match self {
            Val::B(v) => v,
            _ => unreachable!("lowering typed this a bool"),
        }
    }
}

/// A tile: batch, query head, query rows `i0..=i1`, key rows `j0..=j1`.
pub struct Tile {
    pub b: Ix,
    pub h: Ix,
    pub i0: Ix,
    pub i1: Ix,
    pub j0: Ix,
    pub j1: Ix,
}

/// Attention's indices for one call: batch, query head, query row, key row.
pub struct Indices {
    pub b: Ix,
    pub h: Ix,
    pub i: Ix,
    pub j: Ix,
}

impl Fns {
    /// Query head `h`'s sink logit (`sink =`), where there is a sink.
    pub fn sink_logit(&self, scope: &Scope, h: Ix) -> Option<Fl> {
        self.sink.map(|c| k::read::expand::<Stored>(scope, &self.captures[c].buf, h))
    }

    /// The score function of scaled logit `s` (unchanged without one).
    pub fn score(&self, scope: &Scope, s: Fl, at: &Indices) -> Fl {
        let Some(f) = &self.score else { return s };
        self.emit(scope, &f.body, &score_params(scope, s, at), &[]).float()
    }

    /// `∂score/∂s`, the score function's derivative at scaled logit `s`
    /// (`None` without one).
    pub fn slope(&self, scope: &Scope, s: Fl, at: &Indices) -> Option<Fl> {
        let slope = attnc_compiler::grad::score_slope(self.score.as_ref()?);
        Some(self.emit(scope, &slope.body, &score_params(scope, s, at), &[]).float())
    }

    /// Whether the mask function lets the query see the key (`None` without one).
    pub fn visible(&self, scope: &Scope, at: &Indices) -> Option<Bl> {
        let f = self.mask.as_ref()?;
        let params = ints(scope, &[at.b, at.h, at.i, at.j]);
        Some(self.emit(scope, &f.body, &params, &[]).bool())
    }

    /// Of query rows `i0..=i1` against key rows `j0..=j1`: whether some pair
    /// may be seen, and whether some may be hidden (`sparsity`); `None`
    /// without a mask function.
    /// `prep`: the reads [`Fns::prepare`] made for the cube, `keys` as there.
    pub fn tile(&self, scope: &Scope, at: &Tile, prep: &[Fl], keys: bool) -> Option<(Bl, Bl)> {
        let t = self.tiles.as_ref()?;
        let params = ints(scope, &[at.b, at.h, at.i0, at.i1, at.j0, at.j1]);
        let cache: Vec<(FExpr, Fl)> = reads(t, keys).0.into_iter().zip(prep.iter().copied()).collect();
        let any = self.emit(scope, &t.any.body, &params, &cache).bool();
        Some((any, self.emit(scope, &t.hidden.body, &params, &cache).bool()))
    }

    /// The tile functions' reads that are the same for every tile the cube
    /// walks (`sparsity::reads`), made once: `at`'s tiled side is ignored
    /// (`keys`: the cube walks key tiles).
    pub fn prepare(&self, scope: &Scope, at: &Tile, keys: bool) -> Vec<Fl> {
        let Some(t) = &self.tiles else { return vec![] };
        let params = ints(scope, &[at.b, at.h, at.i0, at.i1, at.j0, at.j1]);
        reads(t, keys).0.iter().map(|e| self.emit(scope, e, &params, &[]).float()).collect()
    }

    /// The row-major entry of capture `capture` at `indices`, each clamped into its axis.
    fn flat_index(
        &self,
        scope: &Scope,
        capture: usize,
        indices: &[FExpr],
        params: &[Val],
        cache: &[(FExpr, Fl)],
    ) -> NativeExpand<i32> {
        let mut flat = int_const::expand(scope, 0);
        for (x, n) in indices.iter().zip(&self.captures[capture].shape) {
            let at = clamp_index::expand(scope, self.emit(scope, x, params, cache).int(), *n as i32 - 1);
            flat = mul_add::expand(scope, flat, *n as i32, at);
        }
        flat
    }

    fn emit(&self, scope: &Scope, e: &FExpr, params: &[Val], cache: &[(FExpr, Fl)]) -> Val {
        let go = |x: &FExpr| self.emit(scope, x, params, cache);
        if let Some((_, v)) = cache.iter().find(|(c, _)| c == e) {
            return Val::F(*v);
        }
        match e {
            FExpr::Param(n) => params[*n],
            FExpr::Int(v) => {
                Val::I(int_const::expand(scope, i32::try_from(*v).unwrap_or(if *v < 0 { i32::MIN } else { i32::MAX })))
            }
            FExpr::Float(v) => Val::F(k::float_const(scope, *v as f32)),
            FExpr::Bool(v) => Val::B(bool_const::expand(scope, *v)),
            FExpr::Dim(d) => unreachable!("dim `{d}` is replaced by its value before kernels"),
            FExpr::Read { capture, indices } => {
                let (c, flat) = (&self.captures[*capture], self.flat_index(scope, *capture, indices, params, cache));
                Val::F(k::read_digits::expand(scope, &c.buf, to_index::expand(scope, flat), c.digits))
            }
            FExpr::ReadBound { capture, lo, hi, max } => {
                let c = &self.captures[*capture];
                let rank = c.shape.len();
                let (mut los, mut his) = (int_zeros::expand(scope, rank), int_zeros::expand(scope, rank));
                for (a, (l, h)) in lo.iter().zip(hi).enumerate() {
                    int_set::expand(scope, &mut los, a, go(l).int());
                    int_set::expand(scope, &mut his, a, go(h).int());
                }
                let shape: Vec<u32> = c.shape.iter().map(|n| *n as u32).collect();
                Val::F(read_bound::expand(scope, &c.buf, &los, &his, shape, *max, c.digits))
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
            // By a power of two: an arithmetic shift floors, a mask leaves the
            // non-negative remainder (two's complement), without a division.
            FExpr::Bin(op @ (FBin::FloorDiv | FBin::Rem), a, c) if matches!(**c, FExpr::Int(c) if c > 0 && c <= 1 << 30 && (c as u64).is_power_of_two()) =>
            {
                // A constant shift is folded here: cubecl's own folding of
                // `-5 >> 6` is not the arithmetic shift (found by
                // tests/differential.rs).
                if let Some(v) = constant_int(e) {
                    return Val::I(int_const::expand(scope, v));
                }
                let FExpr::Int(c) = **c else { unreachable!() };
                let x = go(a).int();
                Val::I(match op {
                    FBin::FloorDiv => shift_right::expand(scope, x, c.trailing_zeros() as i32),
                    _ => low_bits::expand(scope, x, (c - 1) as i32),
                })
            }
            FExpr::Bin(op, a, b) => binary(scope, *op, go(a), go(b)),
        }
    }
}

/// `e`'s value where it is an int constant (no parameter, read or dim).
fn constant_int(e: &FExpr) -> Option<i32> {
    use attnc_compiler::ir::func_eval::{eval, FVal, NoData};
    let mut constant = true;
    e.walk(&mut |x| {
        constant &= !matches!(x, FExpr::Param(_) | FExpr::Read { .. } | FExpr::ReadBound { .. } | FExpr::Dim(_))
    });
    match constant.then(|| eval(e, &[], &NoData)) {
        Some(Ok(FVal::Int(v))) => i32::try_from(v).ok(),
        _ => None,
    }
}

/// `x >> k` (arithmetic: ⌊x / 2^k⌋).
#[cube]
fn shift_right(x: i32, #[comptime] k: i32) -> i32 {
    x >> i32::new(k as i64)
}

/// `x & m` (for `m = 2^k − 1`: `x mod 2^k`, non-negative).
#[cube]
fn low_bits(x: i32, #[comptime] m: i32) -> i32 {
    x & i32::new(m as i64)
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
            FBin::Add => Val::I(math::add::expand::<i32>(scope, x, y)),
            FBin::Sub => Val::I(math::sub::expand::<i32>(scope, x, y)),
            FBin::Mul => Val::I(math::mul::expand::<i32>(scope, x, y)),
            FBin::FloorDiv => Val::I(floor_div::expand(scope, x, y)),
            FBin::Rem => Val::I(rem::expand(scope, x, y)),
            FBin::Max => Val::I(math::maximum::expand::<i32>(scope, x, y)),
            FBin::Min => Val::I(math::minimum::expand::<i32>(scope, x, y)),
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
fn int_zeros(#[comptime] n: usize) -> Array<i32> {
    let mut a = Array::<i32>::new(n);
    #[unroll]
    for k in 0..n {
        a[k] = i32::new(0);
    }
    a
}

#[cube]
fn int_set(a: &mut Array<i32>, #[comptime] k: usize, v: i32) {
    a[k] = v;
}

#[cube]
fn add_at(a: &mut Array<f32>, #[comptime] k: usize, v: f32) {
    a[k] += v;
}

/// The least (or, `max`, greatest) entry of `buf` (of `shape`) over the box
/// `lo..=hi`, each axis clamped into the shape; ∓[`BIG`] past `READ_BOX`
/// entries, ±[`BIG`] for an empty box (`ir::FExpr::ReadBound`).
#[cube]
fn read_bound(
    buf: &[Stored],
    lo: &Array<i32>,
    hi: &Array<i32>,
    #[comptime] shape: Vec<u32>,
    #[comptime] greatest: bool,
    #[comptime] digits: usize,
) -> f32 {
    let rank = comptime![shape.len()];
    let mut first = Array::<i32>::new(rank);
    let mut width = Array::<i32>::new(rank);
    let mut count = i32::new(1);
    #[unroll]
    for a in 0..rank {
        let last = comptime![shape[a] as i64 - 1];
        let l = clamp_index(lo[a], last as i32);
        let w = clamp_index(hi[a], last as i32) + i32::new(1) - l;
        first[a] = l;
        width[a] = max(w, i32::new(0));
        count *= width[a];
    }
    let mut best = f32::new(BIG);
    if comptime![greatest] {
        best = f32::new(-BIG);
    }
    if count > i32::new(READ_BOX as i64) {
        best = -best;
    } else {
        for k in 0..count {
            let mut rest = k;
            let mut flat = i32::new(0);
            let mut stride = i32::new(1);
            #[unroll]
            for r in 0..rank {
                let a = comptime![rank - 1 - r];
                flat += (first[a] + rest % width[a]) * stride;
                rest /= width[a];
                stride *= i32::new(comptime![shape[a] as i64]);
            }
            let v = k::read_digits(buf, usize::cast_from(flat), digits);
            if comptime![greatest] {
                best = max(best, v);
            } else {
                best = min(best, v);
            }
        }
    }
    best
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
fn ineg(x: i32) -> i32 {
    -x
}

#[cube]
fn iabs(x: i32) -> i32 {
    max(x, -x)
}

/// ⌊x / y⌋ (0 for y = 0), without branches; the hardware's division
/// truncates toward zero, so a quotient of operands of opposite signs that
/// leaves a remainder is one too large.
#[cube]
fn floor_div(x: i32, y: i32) -> i32 {
    let zero = y == i32::new(0);
    let d = select(zero, i32::new(1), y);
    let q = x / d;
    // Signs differ: the sign bit of x ^ d (cubecl-cpp has no bool `!=`).
    let adjust = q * d != x && (x ^ d) < i32::new(0);
    select(zero, i32::new(0), q - select(adjust, i32::new(1), i32::new(0)))
}

/// `x − y·⌊x / y⌋` (0 for y = 0).
#[cube]
fn rem(x: i32, y: i32) -> i32 {
    select(y == i32::new(0), i32::new(0), x - y * floor_div(x, y))
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
    // `y` where `x`, else `!y` (cubecl-cpp has no bool `==`).
    select(x, y, !y)
}

#[cube]
fn select_int(c: bool, a: i32, b: i32) -> i32 {
    select(c, a, b)
}

#[cube]
fn select_float(c: bool, a: f32, b: f32) -> f32 {
    select(c, a, b)
}

#[cube]
fn select_bool(c: bool, a: bool, b: bool) -> bool {
    select(c, a, b)
}
