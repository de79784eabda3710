//! GEMM tiling: units, rows and columns a cube, shared-memory stages, and
//! the head-mixing epilogue's shape.

use super::View;
use serde::Serialize;

/// A GEMM epilogue that mixes heads: the product's `f = m·d` columns are
/// `m` heads of `d` and its rows `b·s + t`; instead of the product it writes
/// `out[b, h, j, t, e] = Σ_m alpha[m, h, j] · y[b·s + t, m·d + e]`, row-major
/// `[rows / s, h, p, s, d]` — `mix_heads(split_heads(x @ w, m), alpha)` in one
/// launch. A cube's columns are `channels` vectors of each of the `m` heads,
/// so every unit holds all heads of the channels it mixes. With `keep`, it
/// also stores the product (row-major `[rows, f]`, bound before the output):
/// a gradient program's forward, whose coefficient gradient reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct MixEpilogue {
    pub m: usize,
    pub h: usize,
    pub p: usize,
    pub s: usize,
    pub d: usize,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub keep: bool,
}

impl MixEpilogue {
    /// Heads a GEMM tile can hold for the epilogue (one vector of each).
    pub const MAX_HEADS: usize = GEMM_COLS / 4;

    /// Channel vectors (of `lanes` floats) of each head per cube.
    pub fn channels(&self, lanes: usize) -> usize {
        (GEMM_COLS / lanes / self.m).clamp(1, self.d / lanes)
    }
}

/// Units per GEMM cube; each owns [`GEMM_ROWS`] rows of the output.
pub const GEMM_UNITS: usize = 64;
pub const GEMM_ROWS: usize = 4;
/// Output columns (floats) per GEMM cube, at most.
pub const GEMM_COLS: usize = 32;
/// Floats of `k` per shared-memory stage of the staged GEMM (two stages in
/// flight: `2 · (GEMM_UNITS · GEMM_ROWS + cols) · GEMM_STAGE_K` floats).
pub const GEMM_STAGE_K: usize = 8;
/// Column vectors per GEMM cube for `f` output columns in vectors of `lanes`.
pub fn gemm_cols(f: usize, lanes: usize) -> usize {
    gemm_col_cap(lanes).min(f / lanes).max(1)
}

/// The most column vectors a GEMM cube takes in vectors of `lanes`:
/// [`GEMM_COLS`] floats, half as many below vectors of 4, whose scalar loads
/// and addresses NVIDIA's compiler cannot fit in 255 registers at 32
/// columns (a GEMM contracting fewer than 4 rows, a weight gradient of one
/// token, spilled).
pub fn gemm_col_cap(lanes: usize) -> usize {
    if lanes >= 4 {
        GEMM_COLS / lanes
    } else {
        GEMM_COLS / 2 / lanes
    }
}

/// How a GEMM's kernel reads `b` (`[k, f]`, element `(t, c)` at
/// `rows(t) + cols(c)` floats) in vectors of `lanes` floats: along its rows
/// (a vector is `lanes` columns of one row: `b` row-major, or any layout
/// whose columns step by 1 within a vector) or, `transposed`, down its
/// columns (a vector is `lanes` rows of one column: a transposed weight,
/// which the kernel turns into row vectors in registers). Views in vectors:
/// row `t` and column vector `c` at `rows(t) + cols(c)`; transposed, the
/// vector of rows `t·lanes..` of column `c` at `rows(t) + cols(c)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmB {
    pub rows: View,
    pub cols: View,
    pub transposed: bool,
}

impl GemmB {
    /// `b`'s views in vectors of `lanes`, if either form reads it.
    pub fn of(rows: &View, cols: &View, lanes: usize) -> Option<GemmB> {
        let whole = |v: &View| v.offset.is_multiple_of(lanes) && v.terms.iter().all(|t| t.2.is_multiple_of(lanes));
        if let (Some(c), true) = (cols.in_vectors(lanes), whole(rows)) {
            return Some(GemmB { rows: rows.scaled_down(lanes), cols: c, transposed: false });
        }
        match (rows.in_vectors(lanes), whole(cols)) {
            (Some(r), true) => Some(GemmB { rows: r, cols: cols.scaled_down(lanes), transposed: true }),
            _ => None,
        }
    }
}
