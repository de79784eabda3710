//! Kernel bodies as `#[cube]` functions. `define.rs` calls their generated
//! `expand` functions to build each launch's kernel from the plan; sizes,
//! operators and masks arrive as comptime values, so every kernel is
//! specialised to its spec.
//!
//! Here: indexing, elementwise, layout, reduction and mask kernels and the
//! grid helpers; `group` holds the steps of fused group kernels, `vector`
//! the helpers register-blocked kernels are assembled from.

mod group;
pub mod math;
mod vector;

pub use group::*;
pub use vector::*;

use attnc_compiler::plan::View;
use cubecl::prelude::*;

// The element type of the plan's buffers (`plan::Dtype`), registered in
// each kernel's scope by `define.rs`. Kernels load it into f32, compute in
// f32 and store results back in it; for f32 the casts vanish from the source.
cubecl::define_scalar!(pub Stored);
/// A binding of `N`-float vectors in the storage type, as the host-assembled
/// kernels take their operands.
pub type Vecs<N> = NativeExpand<[Vector<Stored, N>]>;
// The element type of matrix-fragment operands: `Stored`, or TF32 for f32 storage.
cubecl::define_scalar!(pub Operand);

// The parts of a term `((i / div) % modulo) · stride` of a
// [`attnc_compiler::plan::View`]; `view` leaves out the parts that
// cannot change the value.
#[cube]
pub fn idx_div(i: usize, #[comptime] div: usize) -> usize {
    i / div
}

#[cube]
pub fn idx_mod(i: usize, #[comptime] modulo: usize) -> usize {
    i % modulo
}

#[cube]
pub fn idx_mul(i: usize, #[comptime] stride: usize) -> usize {
    i * stride
}

#[cube]
pub fn add_index(a: usize, b: usize) -> usize {
    a + b
}

#[cube]
pub fn const_index(#[comptime] v: usize) -> usize {
    v
}

#[cube]
pub fn below(i: usize, #[comptime] n: usize) -> bool {
    i < n
}

/// Reads the output's length from the `info` buffer, so every kernel uses that
/// binding (wgpu drops unused bindings from layouts derived from WGSL text).
#[cube]
pub fn has_elements(out: &[Stored]) -> bool {
    out.len() > 0
}

#[cube]
pub fn gather(x: &[Stored], out: &mut [Stored], i: usize, ix: usize) {
    out[i] = x[ix];
}

#[cube]
#[allow(clippy::too_many_arguments)]
pub fn select(c: &[Stored], a: &[Stored], b: &[Stored], out: &mut [Stored], i: usize, ic: usize, ia: usize, ib: usize) {
    out[i] = Stored::cast_from(apply_select(f32::cast_from(c[ic]), f32::cast_from(a[ia]), f32::cast_from(b[ib])));
}

#[cube]
pub fn apply_select(c: f32, a: f32, b: f32) -> f32 {
    let mut r = b;
    if c != f32::new(0.0) {
        r = a;
    }
    r
}

/// `out[i] = 1[x[i / (L−1)] >= i % (L−1) + 2]`.
#[cube]
pub fn thresholds(x: &[Stored], out: &mut [Stored], i: usize, #[comptime] levels: usize) {
    out[i] = Stored::cast_from(apply_threshold(f32::cast_from(x[i / comptime![levels - 1]]), i, levels));
}

/// `1[v >= i % (L−1) + 2]`: level `i % (L−1)` of rating `v`.
#[cube]
pub fn apply_threshold(v: f32, i: usize, #[comptime] levels: usize) -> f32 {
    let t = i % comptime![levels - 1];
    let mut r = f32::new(0.0);
    if v >= f32::cast_from(t + 2) {
        r = f32::new(1.0);
    }
    r
}

/// `out[b,h,j,s,e] = Σ_m alpha[m,h,j] · x[b,m,s,e]`; `sizes`: m, h, p, s, d,
/// and `x_m`, the stride of `x`'s heads from `x0`.
#[cube]
pub fn mix_heads(
    x: &[Stored],
    alpha: &[Stored],
    out: &mut [Stored],
    i: usize,
    x0: usize,
    #[comptime] sizes: (usize, usize, usize, usize, usize, usize),
) {
    let (m, h, p, s, d, x_m) = comptime![sizes];
    let j = (i / (d * s)) % p;
    let hi = (i / (d * s * p)) % h;
    let mut acc = f32::new(0.0);
    for mi in 0..m {
        acc += f32::cast_from(alpha[(mi * h + hi) * p + j]) * f32::cast_from(x[x0 + mi * x_m]);
    }
    out[i] = Stored::cast_from(acc);
}

/// The index of `x[b, 0, s, e]` in a row-major `[B, in_heads, s, d]` operand
/// for output element `i` of a row-major `[B, out_heads, s, d]` result (the
/// operand of `mix_heads` with `out_heads = h·p`, of `collapse` with `h`;
/// with `s = 1`, of `mix_cols` and `collapse_cols` over rows `b`).
#[cube]
pub fn head_source(
    i: usize,
    #[comptime] out_heads: usize,
    #[comptime] in_heads: usize,
    #[comptime] s: usize,
    #[comptime] d: usize,
) -> usize {
    let e = i % d;
    let si = if comptime![s > 1] { (i / d) % s } else { 0usize.runtime() };
    let bi = i / (d * s * out_heads);
    (bi * in_heads * s + si) * d + e
}

/// `out[r, (h·P+j)·d+e] = Σ_m alpha[m,h,j] · y[r, m·d+e]`; `sizes`: m, h,
/// p, d, and `y_m`, the stride of `y`'s heads from `y0`.
#[cube]
pub fn mix_cols(
    y: &[Stored],
    alpha: &[Stored],
    out: &mut [Stored],
    i: usize,
    y0: usize,
    #[comptime] sizes: (usize, usize, usize, usize, usize),
) {
    let (m, h, p, d, y_m) = comptime![sizes];
    let j = (i / d) % p;
    let hi = (i / (d * p)) % h;
    let mut acc = f32::new(0.0);
    for mi in 0..m {
        acc += f32::cast_from(alpha[(mi * h + hi) * p + j]) * f32::cast_from(y[y0 + mi * y_m]);
    }
    out[i] = Stored::cast_from(acc);
}

/// `out[b,h,s,e] = Σ_c r[h,c] · x[b,c,s,e]`.
pub fn collapse(
    scope: &Scope,
    (x, r): (&NativeExpand<[Stored]>, &NativeExpand<[Stored]>),
    out: &mut NativeExpand<[Stored]>,
    i: NativeExpand<usize>,
    x0: NativeExpand<usize>,
    (h, c, s, d): (usize, usize, usize, usize),
    x_c: &View,
) {
    let acc = zeros::expand(scope, 1);
    let hi = collapse_head::expand(scope, i, h, s, d);
    let range = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, c));
    for_expand(scope, range, false, |scope, ci| {
        let at = add_index::expand(scope, x0, view(scope, ci, x_c, c));
        let mut acc = acc;
        collapse_step::expand(scope, &mut acc, x, r, hi, ci, at, c);
    });
    collapse_store::expand(scope, &acc, out, i);
}

/// The head `(i / (d·s)) % h` of output element `i`.
#[cube]
fn collapse_head(i: usize, #[comptime] h: usize, #[comptime] s: usize, #[comptime] d: usize) -> usize {
    (i / (d * s)) % h
}

#[cube]
fn collapse_step(
    acc: &mut Array<f32>,
    x: &[Stored],
    r: &[Stored],
    hi: usize,
    ci: usize,
    at: usize,
    #[comptime] c: usize,
) {
    acc[0] += f32::cast_from(r[hi * c + ci]) * f32::cast_from(x[at]);
}

#[cube]
fn collapse_store(acc: &Array<f32>, out: &mut [Stored], i: usize) {
    out[i] = Stored::cast_from(acc[0]);
}

/// `out[r, h·d+e] = Σ_c r[h,c] · y[r, c·d+e]`; `sizes`: h, c, d, and
/// `y_c`, the stride of `y`'s heads from `y0`.
#[cube]
pub fn collapse_cols(
    y: &[Stored],
    r: &[Stored],
    out: &mut [Stored],
    i: usize,
    y0: usize,
    #[comptime] sizes: (usize, usize, usize, usize),
) {
    let (h, c, d, y_c) = comptime![sizes];
    let hi = (i / d) % h;
    let mut acc = f32::new(0.0);
    for ci in 0..c {
        acc += f32::cast_from(r[hi * c + ci]) * f32::cast_from(y[y0 + ci * y_c]);
    }
    out[i] = Stored::cast_from(acc);
}

/// `out[c·d+e, f] = Σ_h r[h,c] · w[h·d+e, f]`; `sizes`: h, c, d, f.
#[cube]
pub fn collapse_rows(
    w: &[Stored],
    r: &[Stored],
    out: &mut [Stored],
    i: usize,
    #[comptime] sizes: (usize, usize, usize, usize),
) {
    let (h, c, d, f) = comptime![sizes];
    let col = i % f;
    let e = (i / f) % d;
    let ci = i / (f * d);
    let mut acc = f32::new(0.0);
    for hi in 0..h {
        acc += f32::cast_from(r[hi * c + ci]) * f32::cast_from(w[(hi * d + e) * f + col]);
    }
    out[i] = Stored::cast_from(acc);
}

#[cube]
pub fn block_diag(r: &[Stored], out: &mut [Stored], i: usize, #[comptime] cols: usize, #[comptime] block: usize) {
    let mut v = f32::new(0.0);
    if (i % cols) / block == i / cols {
        v = f32::cast_from(r[i]);
    }
    out[i] = Stored::cast_from(v);
}

#[cube]
pub fn concat(a: &[Stored], b: &[Stored], out: &mut [Stored], i: usize, #[comptime] f1: usize, #[comptime] f2: usize) {
    let c = i % comptime![f1 + f2];
    let row = i / comptime![f1 + f2];
    if c < f1 {
        out[i] = a[row * f1 + c];
    } else {
        out[i] = b[row * f2 + c - f1];
    }
}

/// Entry `i` of a buffer: one element, or an integer stored as `digits`
/// base-256 digits, most significant first (`plan::INTEGER_DIGITS`,
/// `dtype::integer_digits`).
#[cube]
pub fn read_digits(buf: &[Stored], i: usize, #[comptime] digits: usize) -> f32 {
    if comptime![digits == 1] {
        f32::cast_from(buf[i])
    } else {
        let mut v = f32::cast_from(buf[i * digits]);
        #[unroll]
        for k in 1..digits {
            v = v * f32::new(256.0) + f32::cast_from(buf[i * digits + k]);
        }
        v
    }
}

/// A paged cache's comptime layout (`plan::PagedRows`): rows a page, block
/// table entries a sequence, pages in the cache, and the elements an entry
/// takes ([`read_digits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pages {
    pub page: usize,
    pub slots: usize,
    pub blocks: usize,
    pub digits: usize,
}

/// Row `t` of sequence `b` in a paged cache, counted in rows of the cache:
/// row `t % page` of page `table[b, t / page]`, the page clamped into the
/// cache's `blocks` (the host refuses a table outside it before any launch).
#[cube]
pub fn page_row(table: &[Stored], b: usize, t: usize, #[comptime] p: Pages) -> usize {
    let at = read_digits(table, b * comptime![p.slots] + t / comptime![p.page], comptime![p.digits]);
    min(usize::cast_from(max(at, f32::new(0.0))), comptime![p.blocks - 1]) * comptime![p.page] + t % comptime![p.page]
}

/// `out[b, h, t, c] = cache[pages[b, t / page], t % page, h, c]` (`Op::Paged`),
/// the cache `heads` heads of `width` elements a row.
#[cube]
pub fn paged(
    cache: &[Stored],
    pages: &[Stored],
    out: &mut [Stored],
    i: usize,
    #[comptime] p: Pages,
    #[comptime] row: (usize, usize),
) {
    let (heads, width) = comptime![row];
    let rows = comptime![p.slots * p.page];
    let c = i % width;
    let t = (i / width) % rows;
    let h = (i / comptime![width * rows]) % heads;
    let b = i / comptime![width * rows * heads];
    out[i] = cache[(page_row(pages, b, t, p) * heads + h) * width + c];
}

/// The index in the row-major operand of the first element of RoPE's pair `i`.
#[cube]
pub fn rope_source(i: usize, #[comptime] d: usize) -> usize {
    let half = comptime![d / 2];
    i / half * d + i % half
}

/// Rotate-half RoPE over rows `(s, d)` (positions, width);
/// `table[(pos·half + k)·2 + {0, 1}]` holds cos and sin (computed on the
/// host in float64). One unit per rotated pair.
#[cube]
pub fn rope(
    x: &[Stored],
    table: &[Stored],
    out: &mut [Stored],
    i: usize,
    ia: usize,
    ib: usize,
    #[comptime] rows: (usize, usize),
) {
    let (s, d) = comptime![rows];
    let half = comptime![d / 2];
    let k = i % half;
    let row = i / half;
    let pos = row % s;
    let c = f32::cast_from(table[(pos * half + k) * 2]);
    let sn = f32::cast_from(table[(pos * half + k) * 2 + 1]);
    let a = f32::cast_from(x[ia]);
    let b = f32::cast_from(x[ib]);
    out[row * d + k] = Stored::cast_from(a * c - b * sn);
    out[row * d + k + half] = Stored::cast_from(a * sn + b * c);
}

pub const RED_SUM: u32 = 0;
pub const RED_MEAN: u32 = 1;
pub const RED_MAX: u32 = 2;
pub const RED_MIN: u32 = 3;
pub const RED_COUNT: u32 = 4;
pub const RED_VAR: u32 = 5;
pub const RED_VAR_BESSEL: u32 = 6;

/// `out[o] = reduce_{r < count} x[base + r·stride]`; variance in two passes.
#[cube]
pub fn reduce<X: Float, O: Float>(
    x: &[X],
    out: &mut [O],
    o: usize,
    base: usize,
    #[comptime] count: usize,
    #[comptime] stride: usize,
    #[comptime] op: u32,
) {
    let mut acc = f32::new(0.0);
    if comptime![op == RED_MAX] {
        acc = f32::cast_from(x[base]);
    }
    if comptime![op == RED_MIN] {
        acc = f32::cast_from(x[base]);
    }
    for r in 0..count {
        let v = f32::cast_from(x[base + r * stride]);
        if comptime![op == RED_MAX] {
            acc = max(acc, v);
        } else if comptime![op == RED_MIN] {
            acc = min(acc, v);
        } else if comptime![op == RED_COUNT] {
            if v != f32::new(0.0) {
                acc += f32::new(1.0);
            }
        } else {
            acc += v;
        }
    }
    if comptime![op == RED_MEAN || op == RED_VAR || op == RED_VAR_BESSEL] {
        acc = acc / f32::cast_from(count);
    }
    if comptime![op == RED_VAR || op == RED_VAR_BESSEL] {
        let mean = acc;
        let mut ss = f32::new(0.0);
        for r in 0..count {
            let dv = f32::cast_from(x[base + r * stride]) - mean;
            ss += dv * dv;
        }
        if comptime![op == RED_VAR] {
            acc = ss / f32::cast_from(count);
        } else {
            acc = ss / (f32::cast_from(count) - f32::new(1.0));
        }
    }
    out[o] = O::cast_from(acc);
}

/// `out[o + i] = (Σ_r x[x0 + base + r·stride] − x[x0 + i]) / (n − 1)`, `base` = `i`
/// with its axis coordinate zeroed.
#[cube]
pub fn loo_mean<X: Float, O: Float>(
    x: &[X],
    out: &mut [O],
    i: usize,
    #[comptime] x0: usize,
    #[comptime] o: usize,
    #[comptime] n: usize,
    #[comptime] stride: usize,
) {
    let base = x0 + i - (i / stride) % n * stride;
    let mut sum = f32::new(0.0);
    for r in 0..n {
        sum += f32::cast_from(x[base + r * stride]);
    }
    out[o + i] = O::cast_from((sum - f32::cast_from(x[x0 + i])) / f32::cast_from(n - 1));
}

/// `out[o] = Σ_{r,i} a[r, o / o2, i] · b[r, o % o2, i]` for the cube's
/// output `o` (`KernelSpec::Contract`), the operands read through views of
/// their row-major index: each of the cube's 256 units sums a strided share,
/// then a tree in shared memory halves them in a fixed order
/// (deterministic, no atomics).
pub fn contract(
    scope: &Scope,
    (a, b): (&NativeExpand<[Stored]>, &NativeExpand<[Stored]>),
    out: &mut NativeExpand<[Stored]>,
    (rows, o1, o2, inner): (usize, usize, usize, usize),
    (va, vb): (&View, &View),
    fold: usize,
) {
    let o = cube_x::expand(scope, fold);
    let acc = zeros::expand(scope, 1);
    let range = RangeExpand::new(
        NativeExpand::from_lit(scope, 0usize),
        NativeExpand::from_lit(scope, (rows * inner).div_ceil(256)),
    );
    for_expand(scope, range, false, |scope, t| {
        let idx = contract_element::expand(scope, t);
        let ia = contract_index::expand(scope, idx, o, o2, true, o1, inner);
        let ib = contract_index::expand(scope, idx, o, o2, false, o2, inner);
        let (ia, ib) = (view(scope, ia, va, rows * o1 * inner), view(scope, ib, vb, rows * o2 * inner));
        let mut acc = acc;
        contract_step::expand(scope, &mut acc, a, b, idx, ia, ib, rows * inner);
    });
    contract_finish::expand(scope, &acc, out, o);
}

/// Element `t·256 + unit` of the `rows · inner` a unit sums.
#[cube]
fn contract_element(t: usize) -> usize {
    t * 256 + UNIT_POS as usize
}

/// The row-major index of `a[r, o / o2, i]` (`first`) or `b[r, o % o2, i]`
/// for element `idx = r·inner + i`, in an operand of `n` rows of `inner`.
#[cube]
fn contract_index(
    idx: usize,
    o: usize,
    #[comptime] o2: usize,
    #[comptime] first: bool,
    #[comptime] n: usize,
    #[comptime] inner: usize,
) -> usize {
    let mut x = o % o2;
    if comptime![first] {
        x = o / o2;
    }
    (idx / inner * n + x) * inner + idx % inner
}

#[cube]
fn contract_step(
    acc: &mut Array<f32>,
    a: &[Stored],
    b: &[Stored],
    idx: usize,
    ia: usize,
    ib: usize,
    #[comptime] count: usize,
) {
    if idx < count {
        acc[0] += f32::cast_from(a[ia]) * f32::cast_from(b[ib]);
    }
}

/// The tree over the cube's partial sums; unit 0 stores the total at `o`.
#[cube]
fn contract_finish(acc: &Array<f32>, out: &mut [Stored], o: usize) {
    let unit = UNIT_POS as usize;
    let mut partial = Shared::<[f32]>::new_slice(256usize);
    partial[unit] = acc[0];
    sync_cube();
    #[unroll]
    for level in 0..8 {
        let half = comptime![128usize >> level];
        if unit < half {
            partial[unit] += partial[unit + half];
        }
        sync_cube();
    }
    if unit == 0 {
        out[o] = Stored::cast_from(partial[0]);
    }
}

// Group kernels (`KernelSpec::Group`): one cube per group; every value of the
// group lives in one shared array `s`, at offsets fixed by the plan.

/// A shared array of `n` words (a tile list, parked row addresses).
#[cube]
pub fn shared_words(#[comptime] n: usize) -> Shared<[u32]> {
    Shared::<[u32]>::new_slice(n)
}

/// The group's shared array of `n` values.
#[cube]
pub fn group_scratch(#[comptime] n: usize) -> Shared<[f32]> {
    Shared::<[f32]>::new_slice(n)
}

/// The group this cube computes.
#[cube]
pub fn group_index(#[comptime] fold: usize) -> usize {
    cube_x(fold)
}

/// This cube's index counting along x, then y, then z.
#[cube]
pub fn linear_cube() -> usize {
    ((CUBE_POS_Z * CUBE_COUNT_Y + CUBE_POS_Y) * CUBE_COUNT_X + CUBE_POS_X) as usize
}

/// This cube's position along its launch's x axis (`plan::KernelSpec::cubes`):
/// `CUBE_POS_X`, or from the linear index when the grid is folded
/// (`fold` = cubes along x; 0: not folded).
#[cube]
pub fn cube_x(#[comptime] fold: usize) -> usize {
    if comptime![fold > 0] {
        linear_cube() % fold
    } else {
        CUBE_POS_X as usize
    }
}

/// This cube's position along its launch's y axis (see [`cube_x`]).
#[cube]
pub fn cube_y(#[comptime] fold: usize) -> usize {
    if comptime![fold > 0] {
        linear_cube() / fold
    } else {
        CUBE_POS_Y as usize
    }
}

/// Whether this cube is one of the launch's `total` cubes (a folded grid has a few more).
#[cube]
pub fn cube_in_grid(#[comptime] total: usize) -> bool {
    linear_cube() < total
}

/// This unit's `chunk`-th element: `UNIT_POS + chunk · CUBE_DIM`.
#[cube]
pub fn unit_element(#[comptime] chunk: usize) -> usize {
    UNIT_POS as usize + comptime![chunk * 256]
}

#[cube]
pub fn is_first_unit() -> bool {
    UNIT_POS == 0
}

#[cube]
pub fn barrier() {
    sync_cube();
}

#[cube]
pub fn read<T: Float>(x: &[T], i: usize) -> f32 {
    f32::cast_from(x[i])
}

#[cube]
pub fn write<T: Float>(out: &mut [T], i: usize, v: f32) {
    out[i] = T::cast_from(v);
}

#[cube]
pub fn group_offset(b: usize, #[comptime] stride: usize) -> usize {
    b * stride
}

/// `v(i)` for `i < range`, leaving out divisions by 1, remainders that
/// cannot wrap and multiplications by 1.
pub fn view(scope: &Scope, i: NativeExpand<usize>, v: &View, range: usize) -> NativeExpand<usize> {
    let mut acc: Option<NativeExpand<usize>> = None;
    for &(div, modulo, stride) in &v.terms {
        let mut t = i;
        if div > 1 {
            t = idx_div::expand(scope, t, div);
        }
        if range.div_ceil(div) > modulo {
            t = idx_mod::expand(scope, t, modulo);
        }
        if stride != 1 {
            t = idx_mul::expand(scope, t, stride);
        }
        acc = Some(match acc {
            Some(a) => add_index::expand(scope, a, t),
            None => t,
        });
    }
    match acc {
        Some(a) if v.offset == 0 => a,
        Some(a) => add_index::expand(scope, a, const_index::expand(scope, v.offset)),
        None => const_index::expand(scope, v.offset),
    }
}
