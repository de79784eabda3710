//! Register-blocked kernels (`attention.rs`, `gemm.rs`) are assembled on the
//! host from these helpers: loops over channels and key rows are unrolled
//! there, so values live in registers, and the only loops left in the kernel
//! run over key tiles or K steps (see `plan::LOOP_TRIPS_CPU`).

use super::*;

/// Vector `min(lane·per + r, n − 1)` of the `n`-vector row at `row` of `x`:
/// this lane's share `r` of a row spread over a plane.
#[cube]
pub fn vload_share<N: Size>(
    x: &[Vector<Stored, N>],
    row: usize,
    lane: usize,
    #[comptime] per: usize,
    #[comptime] r: usize,
    #[comptime] n: usize,
) -> Vector<f32, N> {
    if comptime![n == per] {
        // The whole row per unit: no share to clamp.
        Vector::<f32, N>::cast_from(x[row + r])
    } else {
        Vector::<f32, N>::cast_from(x[row + min(lane * per + r, comptime![n - 1])])
    }
}

/// A register array of `n` floats, zeroed.
#[cube]
pub fn zeros(#[comptime] n: usize) -> Array<f32> {
    let mut a = Array::<f32>::new(n);
    zero_floats(&mut a, n);
    a
}

/// Zeroes the first `n` floats of `a`.
#[cube]
pub fn zero_floats(a: &mut Array<f32>, #[comptime] n: usize) {
    #[unroll]
    for c in 0..n {
        a[c] = f32::new(0.0);
    }
}

/// A register array of `n` vectors, zeroed.
#[cube]
pub fn vzeros<N: Size>(#[comptime] n: usize) -> Array<Vector<f32, N>> {
    let mut a = Array::<Vector<f32, N>>::new(n);
    #[unroll]
    for c in 0..n {
        a[c] = Vector::new(f32::new(0.0));
    }
    a
}

/// A zero vector.
#[cube]
pub fn vzero<N: Size>() -> Vector<f32, N> {
    Vector::new(f32::new(0.0))
}

#[cube]
pub fn vget<N: Size>(a: &Array<Vector<f32, N>>, #[comptime] i: usize) -> Vector<f32, N> {
    a[i]
}

#[cube]
pub fn vset<N: Size>(a: &mut Array<Vector<f32, N>>, #[comptime] i: usize, v: Vector<f32, N>) {
    a[i] = v;
}

/// `v` as held by plane lane `lane`.
#[cube]
pub fn from_lane<N: Size>(v: Vector<f32, N>, #[comptime] lane: u32) -> Vector<f32, N> {
    plane_broadcast(v, lane)
}

/// This unit's lane in a plane of `width` units.
#[cube]
pub fn plane_lane(#[comptime] width: u32) -> usize {
    (UNIT_POS_PLANE % width) as usize
}

/// `acc + a·b` summed over the vector's components.
#[cube]
pub fn dot_add<N: Size>(acc: f32, a: Vector<f32, N>, b: Vector<f32, N>) -> f32 {
    acc + a.dot(b)
}

/// `acc + Vector(s)·b`.
#[cube]
pub fn axpy<N: Size>(acc: Vector<f32, N>, s: f32, b: Vector<f32, N>) -> Vector<f32, N> {
    acc + Vector::new(s) * b
}

/// `v · Vector(s)`.
#[cube]
pub fn vscale<N: Size>(v: Vector<f32, N>, s: f32) -> Vector<f32, N> {
    v * Vector::new(s)
}

/// `v` with component `c` set to component `c2` of `w`.
#[cube]
fn take_component<E: Scalar, N: Size>(
    v: Vector<E, N>,
    w: Vector<E, N>,
    #[comptime] c: usize,
    #[comptime] c2: usize,
) -> Vector<E, N> {
    let mut out = v;
    out.insert(c, w.extract(c2));
    out
}

/// Vector `kk` of the transpose of the square block whose vectors are
/// `rows` (one per component): component `j` is component `kk` of `rows[j]`.
pub fn transposed<E: Scalar, N: Size>(
    scope: &Scope,
    rows: &[NativeExpand<Vector<E, N>>],
    kk: usize,
) -> NativeExpand<Vector<E, N>> {
    let mut out = rows[kk];
    for (j, r) in rows.iter().enumerate().filter(|&(j, _)| j != kk) {
        out = take_component::expand::<E, N>(scope, out, *r, j, kk);
    }
    out
}

/// Component `c` of `v`.
#[cube]
pub fn component<N: Size>(v: Vector<f32, N>, #[comptime] c: usize) -> f32 {
    v.extract(c)
}

#[cube]
pub fn fconst(#[comptime] v: f32) -> f32 {
    f32::new(v)
}

/// The float with bits `bits`: how NaN and ±∞ are written, which WGSL has
/// no literal for (`vendor/cubecl-opt` never folds it back into one).
#[cube]
pub fn fbits(#[comptime] bits: u32) -> f32 {
    f32::reinterpret(u32::new(bits as i64))
}

/// A float constant of a score or mask function: a literal, or its bits
/// where it is NaN or infinite ([`fbits`]).
pub fn float_const(scope: &Scope, v: f32) -> NativeExpand<f32> {
    match v.is_finite() {
        true => fconst::expand(scope, v),
        false => fbits::expand(scope, v.to_bits()),
    }
}

#[cube]
pub fn fmax(a: f32, b: f32) -> f32 {
    max(a, b)
}

#[cube]
pub fn fadd(a: f32, b: f32) -> f32 {
    a + b
}

#[cube]
pub fn fmul(a: f32, b: f32) -> f32 {
    a * b
}

#[cube]
pub fn fget(a: &Array<f32>, #[comptime] i: usize) -> f32 {
    a[i]
}

#[cube]
pub fn fset(a: &mut Array<f32>, #[comptime] i: usize, v: f32) {
    a[i] = v;
}

#[cube]
pub fn uget(a: &Array<usize>, #[comptime] i: usize) -> usize {
    a[i]
}

/// `a · c`.
#[cube]
pub fn mul_const(a: usize, #[comptime] c: usize) -> usize {
    a * c
}

/// As [`has_elements`], for a buffer of vectors.
#[cube]
pub fn has_vectors<N: Size>(out: &[Vector<Stored, N>]) -> bool {
    out.len() > 0
}
