//! Group-local steps of fused group kernels (`plan::group`): level
//! indicators, threshold counts, lifted reductions and scans.

use super::*;

/// The value of level indicator `i = x·L + l` of a lifted threshold: `x`.
#[cube]
pub fn indicator(i: usize, #[comptime] l: usize) -> f32 {
    let mut r = f32::new(0.0);
    if i >= l {
        r = f32::new(1.0);
    }
    r
}

/// The cumulative-count form of `thresholds` for one group, in O(G + L):
/// `m[g]` = levels rating `r[g]` passes (`#{t < L : r[g] ≥ t + 2}`), and
/// `c[t] = #{g : m[g] > t}` (how many samples pass level `t`), through a
/// histogram of `m` at `hist` (L + 1 entries) with `c` right after it.
#[cube]
pub fn levels(
    s: &mut [f32],
    #[comptime] r: usize,
    #[comptime] m: usize,
    #[comptime] hist: usize,
    #[comptime] g: usize,
    #[comptime] l: usize,
) {
    for t in 0..comptime![l + 1] {
        s[hist + t] = f32::new(0.0);
    }
    for k in 0..g {
        let v = s[r + k];
        let mut passed = 0usize;
        if v >= f32::new(2.0) {
            // NaN fails the comparison above (no level); +inf passes all.
            let f = min(v.floor() - f32::new(1.0), f32::cast_from(l));
            passed = usize::cast_from(f);
        }
        s[m + k] = f32::cast_from(passed);
        s[hist + passed] += f32::new(1.0);
    }
    let mut above = f32::new(0.0);
    for i in 0..l {
        let t = l - 1 - i;
        above += s[hist + t + 1];
        s[hist + l + 1 + t] = above;
    }
}

/// Reduce a lifted value over the group axis at level `i`: `c` samples see
/// `v[L + i]` (indicator 1) and `G − c` see `v[i]` (indicator 0).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn lift_reduce_groups(
    s: &mut [f32],
    i: usize,
    #[comptime] dst: usize,
    #[comptime] v: usize,
    #[comptime] c: usize,
    #[comptime] g: usize,
    #[comptime] l: usize,
    #[comptime] op: u32,
) {
    let n1 = s[c + i];
    let n0 = f32::cast_from(g) - n1;
    let v0 = s[v + i];
    let v1 = s[v + l + i];
    let gf = f32::cast_from(g);
    let mut r = f32::new(0.0);
    if comptime![op == RED_MAX || op == RED_MIN] {
        if n1 == f32::new(0.0) {
            r = v0;
        } else if n0 == f32::new(0.0) {
            r = v1;
        } else if comptime![op == RED_MAX] {
            r = max(v0, v1);
        } else {
            r = min(v0, v1);
        }
    } else if comptime![op == RED_COUNT] {
        if v0 != f32::new(0.0) {
            r += n0;
        }
        if v1 != f32::new(0.0) {
            r += n1;
        }
    } else {
        r = n1 * v1 + n0 * v0;
        if comptime![op != RED_SUM] {
            r = r / gf;
        }
        if comptime![op == RED_VAR || op == RED_VAR_BESSEL] {
            let d0 = v0 - r;
            let d1 = v1 - r;
            let ss = n0 * d0 * d0 + n1 * d1 * d1;
            if comptime![op == RED_VAR] {
                r = ss / gf;
            } else {
                r = ss / (gf - f32::new(1.0));
            }
        }
    }
    s[dst + i] = r;
}

/// Prefix scan of indicator-1 values and suffix scan of indicator-0 values of
/// a lifted value (sums, counts of non-zeros, maxima or minima): `dst[j]` folds
/// `v[L + t]` for `t < j`, `dst[L + 1 + j]` folds `v[t]` for `t ≥ j`.
#[cube]
pub fn lift_scan(
    s: &mut [f32],
    #[comptime] dst: usize,
    #[comptime] v: usize,
    #[comptime] l: usize,
    #[comptime] op: u32,
) {
    let mut init = f32::new(0.0);
    if comptime![op == RED_MAX] {
        init = f32::new(-3.0e38);
    } else if comptime![op == RED_MIN] {
        init = f32::new(3.0e38);
    }
    let mut pre = init;
    s[dst] = pre;
    for t in 0..l {
        pre = scan_step(pre, s[v + l + t], op);
        s[dst + t + 1] = pre;
    }
    let mut suf = init;
    s[dst + comptime![2 * l + 1]] = suf;
    for i in 0..l {
        let t = l - 1 - i;
        suf = scan_step(suf, s[v + t], op);
        s[dst + l + 1 + t] = suf;
    }
}

#[cube]
fn scan_step(acc: f32, x: f32, #[comptime] op: u32) -> f32 {
    let mut r = combine(acc, x, op);
    if comptime![op == RED_COUNT] {
        r = acc;
        if x != f32::new(0.0) {
            r = acc + f32::new(1.0);
        }
    }
    r
}

/// `a` and `b` under reduction `op`: the larger, the smaller, else the sum.
#[cube]
fn combine(a: f32, b: f32, #[comptime] op: u32) -> f32 {
    let mut r = a + b;
    if comptime![op == RED_MAX] {
        r = max(a, b);
    } else if comptime![op == RED_MIN] {
        r = min(a, b);
    }
    r
}

/// Reduce a lifted value over the levels for sample `i`, which passes the
/// first `m[i]` levels: one prefix and one suffix entry of the scan.
#[cube]
pub fn lift_reduce_levels(
    s: &mut [f32],
    i: usize,
    #[comptime] dst: usize,
    #[comptime] scan: usize,
    #[comptime] m: usize,
    #[comptime] l: usize,
    #[comptime] op: u32,
) {
    let k = usize::cast_from(s[m + i]);
    let a = s[scan + k];
    let b = s[scan + l + 1 + k];
    let mut r = combine(a, b, op);
    if comptime![op == RED_MEAN] {
        r = r / f32::cast_from(l);
    }
    s[dst + i] = r;
}

/// The dense `[G, L]` value of a lifted one at `i = g·L + t`.
#[cube]
pub fn densify(
    s: &mut [f32],
    i: usize,
    #[comptime] dst: usize,
    #[comptime] v: usize,
    #[comptime] m: usize,
    #[comptime] l: usize,
) {
    let t = i % l;
    let k = usize::cast_from(s[m + i / l]);
    let mut r = s[v + t];
    if t < k {
        r = s[v + l + t];
    }
    s[dst + i] = r;
}
