//! The GEMM `out[rows, f] = a[rows, k] · b[k, f]`, register-blocked and
//! assembled on the host from `#[cube]` helpers.
//!
//! A cube of [`GEMM_UNITS`] units computes `GEMM_UNITS · GEMM_ROWS` rows by
//! `cols` vectors of the line size; each unit owns [`GEMM_ROWS`] rows (strided
//! by the cube size) and all `cols` column vectors, so it keeps
//! `GEMM_ROWS · cols` vector accumulators in registers. Per step of one line
//! of `k`, a unit loads one vector of each of its rows of `a`; the `b` rows'
//! vectors are loaded once per plane, a share per lane, and reach the other
//! lanes by plane broadcasts. The one runtime loop walks `k` by lines.

use super::kernels as k;
use super::plan::{gemm_cols, GEMM_ROWS, GEMM_UNITS};
use cubecl::prelude::*;

/// Row `m` of this unit, and whether it exists.
#[cube]
fn unit_row(#[comptime] m: usize) -> usize {
    CUBE_POS_Y as usize * comptime![GEMM_UNITS * GEMM_ROWS] + comptime![m * GEMM_UNITS] + UNIT_POS as usize
}

/// Vector `kt` of row `row` (clamped to the last) of `a`, `kl` vectors a row.
#[cube]
fn a_vector<N: Size>(
    a: &[Vector<f32, N>],
    row: usize,
    kt: usize,
    #[comptime] rows: usize,
    #[comptime] kl: usize,
) -> Vector<f32, N> {
    let mut r = row;
    if r >= rows {
        r = comptime![rows - 1];
    }
    a[r * kl + kt]
}

/// This lane's share `r` of the cube's `cols` vectors of row `kt·L + kk` of `b`
/// (`fl` vectors a row), columns clamped to the last.
#[cube]
#[allow(clippy::too_many_arguments)]
fn b_share<N: Size>(
    b: &[Vector<f32, N>],
    kt: usize,
    lane: usize,
    #[comptime] lanes: usize,
    #[comptime] kk: usize,
    #[comptime] per: usize,
    #[comptime] r: usize,
    #[comptime] cols: usize,
    #[comptime] fl: usize,
) -> Vector<f32, N> {
    let mut c = lane * per + r;
    if c >= cols {
        c = comptime![cols - 1];
    }
    let mut col = CUBE_POS_X as usize * cols + c;
    if col >= fl {
        col = comptime![fl - 1];
    }
    b[(kt * lanes + kk) * fl + col]
}

/// Store accumulator `v` at row `row`, column vector `c` of the cube, if both exist.
#[cube]
fn store<N: Size>(
    out: &mut [Vector<f32, N>],
    row: usize,
    v: Vector<f32, N>,
    #[comptime] c: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] fl: usize,
) {
    let col = CUBE_POS_X as usize * cols + c;
    if row < rows && col < fl {
        out[row * fl + col] = v;
    }
}

/// Emit the GEMM body for vectors of `N` (`lanes` floats, dividing `kdim` and
/// `f`), sharing `b` over planes of `plane` units (1: every unit loads it all).
#[allow(clippy::too_many_arguments)]
pub fn build<N: Size>(
    scope: &Scope,
    a: &NativeExpand<[Vector<f32, N>]>,
    b: &NativeExpand<[Vector<f32, N>]>,
    out: &mut NativeExpand<[Vector<f32, N>]>,
    rows: usize,
    kdim: usize,
    f: usize,
    lanes: usize,
    plane: u32,
) {
    let (kl, fl) = (kdim / lanes, f / lanes);
    let cols = gemm_cols(f, lanes);
    let (per, lane) = if plane > 1 {
        (cols.div_ceil(plane as usize), k::plane_lane::expand(scope, plane))
    } else {
        (cols, NativeExpand::from_lit(scope, 0usize))
    };
    let unit_rows: Vec<_> = (0..GEMM_ROWS).map(|m| unit_row::expand(scope, m)).collect();
    let acc = k::vzeros::expand::<N>(scope, GEMM_ROWS * cols);
    let steps = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, kl));
    for_expand(scope, steps, false, |scope, kt| {
        let mut acc = acc;
        let mut sums: Vec<_> = (0..GEMM_ROWS * cols).map(|i| k::vget::expand::<N>(scope, &acc, i)).collect();
        let av: Vec<_> =
            unit_rows.iter().map(|r| a_vector::expand::<N>(scope, a, r.clone(), kt.clone(), rows, kl)).collect();
        for kk in 0..lanes {
            let held: Vec<_> = (0..per)
                .map(|r| b_share::expand::<N>(scope, b, kt.clone(), lane.clone(), lanes, kk, per, r, cols, fl))
                .collect();
            let scalars: Vec<_> = av.iter().map(|v| k::component::expand::<N>(scope, v.clone(), kk)).collect();
            for c in 0..cols {
                let bc = if plane > 1 {
                    k::from_lane::expand::<N>(scope, held[c % per].clone(), (c / per) as u32)
                } else {
                    held[c].clone()
                };
                for (m, x) in scalars.iter().enumerate() {
                    let s = &mut sums[m * cols + c];
                    *s = k::axpy::expand::<N>(scope, s.clone(), x.clone(), bc.clone());
                }
            }
        }
        for (i, s) in sums.into_iter().enumerate() {
            k::vset::expand::<N>(scope, &mut acc, i, s);
        }
    });
    for (m, row) in unit_rows.iter().enumerate() {
        for c in 0..cols {
            let v = k::vget::expand::<N>(scope, &acc, m * cols + c);
            store::expand::<N>(scope, out, row.clone(), v, c, rows, cols, fl);
        }
    }
}
