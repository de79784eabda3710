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

use super::define::view;
use super::kernels as k;
use attnc_compiler::plan::{gemm_cols, MixEpilogue, View, GEMM_ROWS, GEMM_UNITS};
use cubecl::prelude::*;

/// Row `m` of this unit, and whether it exists.
#[cube]
fn unit_row(#[comptime] m: usize) -> usize {
    CUBE_POS_Y as usize * comptime![GEMM_UNITS * GEMM_ROWS] + comptime![m * GEMM_UNITS] + UNIT_POS as usize
}

/// `row`, clamped to the last of `rows`.
#[cube]
fn clamp_row(row: usize, #[comptime] rows: usize) -> usize {
    min(row, comptime![rows - 1])
}

/// The vector at `at` of `a`.
#[cube]
fn a_vector<N: Size>(a: &[Vector<f32, N>], at: usize) -> Vector<f32, N> {
    a[at]
}

/// This lane's share `r` of the cube's `cols` vectors of row `kt·L + kk` of `b`
/// (`b_row` vectors a row from `b_offset`), columns clamped to the last of
/// `fl`. With a mixing epilogue (`ce` > 0) the cube's columns are `ce`
/// channel vectors of each head of `dl` vectors, channels clamped to the last.
#[cube]
#[allow(clippy::too_many_arguments)]
#[allow(unused_assignments)]
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
    #[comptime] b_row: usize,
    #[comptime] b_offset: usize,
    #[comptime] ce: usize,
    #[comptime] dl: usize,
) -> Vector<f32, N> {
    let mut c = lane * per + r;
    if c >= cols {
        c = comptime![cols - 1];
    }
    let mut col = 0usize;
    if comptime![ce == 0] {
        col = CUBE_POS_X as usize * cols + c;
        if col >= fl {
            col = comptime![fl - 1];
        }
    } else {
        let ch = min(CUBE_POS_X as usize * ce + c % ce, comptime![dl - 1]);
        col = c / ce * dl + ch;
    }
    b[(kt * lanes + kk) * b_row + col + b_offset]
}

/// Where row `row`'s first output vector goes in the mixing epilogue's
/// `[B, targets, s, dl]` output (vectors).
#[cube]
fn mixed_row(row: usize, #[comptime] s: usize, #[comptime] dl: usize, #[comptime] targets: usize) -> usize {
    row / s * comptime![targets * s * dl] + row % s * dl
}

/// Store mixed channel `ch` of target `t` for the row starting at `at`, if row and channel exist.
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_mixed<N: Size>(
    out: &mut [Vector<f32, N>],
    row: usize,
    at: usize,
    t: usize,
    v: Vector<f32, N>,
    #[comptime] ch: usize,
    #[comptime] ce: usize,
    #[comptime] rows: usize,
    #[comptime] dl: usize,
    #[comptime] plane_len: usize,
) {
    let channel = CUBE_POS_X as usize * ce + ch;
    if row < rows && channel < dl {
        out[at + t * plane_len + channel] = v;
    }
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

/// A GEMM's sizes (floats) and its operands' addressing (vectors): row `r`,
/// column vector `c` of `a` at `a_rows(r) + a_cols(c)`, row `t` of `b` at
/// `b_offset + t·b_row`.
pub struct Shape {
    pub rows: usize,
    pub kdim: usize,
    pub f: usize,
    pub a_rows: View,
    pub a_cols: View,
    pub b_row: usize,
    pub b_offset: usize,
    /// A mixing epilogue and its coefficients.
    pub mix: Option<(MixEpilogue, NativeExpand<[f32]>)>,
}

/// Emit the GEMM body for vectors of `N` (`lanes` floats, dividing `kdim` and
/// `f`), sharing `b` over planes of `plane` units (1: every unit loads it all).
pub fn build<N: Size>(
    scope: &Scope,
    a: &NativeExpand<[Vector<f32, N>]>,
    b: &NativeExpand<[Vector<f32, N>]>,
    out: &mut NativeExpand<[Vector<f32, N>]>,
    shape: &Shape,
    lanes: usize,
    plane: u32,
) {
    let Shape { rows, kdim, f, b_row, b_offset, .. } = *shape;
    let (kl, fl) = (kdim / lanes, f / lanes);
    let (ce, dl) = shape.mix.as_ref().map_or((0, 0), |(m, _)| (m.channels(lanes), m.d / lanes));
    let cols = match &shape.mix {
        Some((m, _)) => m.m * ce,
        None => gemm_cols(f, lanes),
    };
    let (per, lane) = if plane > 1 {
        (cols.div_ceil(plane as usize), k::plane_lane::expand(scope, plane))
    } else {
        (cols, NativeExpand::from_lit(scope, 0usize))
    };
    let unit_rows: Vec<_> = (0..GEMM_ROWS).map(|m| unit_row::expand(scope, m)).collect();
    // Where each of this unit's rows of `a` starts (the last row for rows past the end).
    let a_starts: Vec<_> = unit_rows
        .iter()
        .map(|r| view(scope, clamp_row::expand(scope, r.clone(), rows), &shape.a_rows, rows))
        .collect();
    let acc = k::vzeros::expand::<N>(scope, GEMM_ROWS * cols);
    let steps = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, kl));
    for_expand(scope, steps, false, |scope, kt| {
        let mut acc = acc;
        let mut sums: Vec<_> = (0..GEMM_ROWS * cols).map(|i| k::vget::expand::<N>(scope, &acc, i)).collect();
        let col = view(scope, kt.clone(), &shape.a_cols, kl);
        let av: Vec<_> = a_starts
            .iter()
            .map(|r| a_vector::expand::<N>(scope, a, k::add_index::expand(scope, r.clone(), col.clone())))
            .collect();
        for kk in 0..lanes {
            let held: Vec<_> = (0..per)
                .map(|r| {
                    b_share::expand::<N>(
                        scope,
                        b,
                        kt.clone(),
                        lane.clone(),
                        lanes,
                        kk,
                        per,
                        r,
                        cols,
                        fl,
                        b_row,
                        b_offset,
                        ce,
                        dl,
                    )
                })
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
    let Some((mix, alpha)) = &shape.mix else {
        for (m, row) in unit_rows.iter().enumerate() {
            for c in 0..cols {
                let v = k::vget::expand::<N>(scope, &acc, m * cols + c);
                store::expand::<N>(scope, out, row.clone(), v, c, rows, cols, fl);
            }
        }
        return;
    };
    // The epilogue: one runtime loop over the h·p targets, each mixing the
    // unit's heads of every row and channel it holds.
    let targets = mix.h * mix.p;
    let starts: Vec<_> = unit_rows.iter().map(|r| mixed_row::expand(scope, r.clone(), mix.s, dl, targets)).collect();
    let range = RangeExpand::new(NativeExpand::from_lit(scope, 0usize), NativeExpand::from_lit(scope, targets));
    for_expand(scope, range, false, |scope, t| {
        let alphas: Vec<_> = (0..mix.m)
            .map(|m| {
                let at = k::add_index::expand(scope, k::const_index::expand(scope, m * targets), t.clone());
                k::read::expand(scope, alpha, at)
            })
            .collect();
        for (r, row) in unit_rows.iter().enumerate() {
            for ch in 0..ce {
                let mut v = k::vzero::expand::<N>(scope);
                for (m, a) in alphas.iter().enumerate() {
                    let y = k::vget::expand::<N>(scope, &acc, r * cols + m * ce + ch);
                    v = k::axpy::expand::<N>(scope, v, a.clone(), y);
                }
                let (row, at) = (row.clone(), starts[r].clone());
                store_mixed::expand::<N>(scope, out, row, at, t.clone(), v, ch, ce, rows, dl, mix.s * dl);
            }
        }
    });
}
