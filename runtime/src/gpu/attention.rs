//! What the forward kernels share beyond the kit (`kit/`): a unit's query
//! rows' addresses, the query load and the output row's store. The kernels
//! are `attention_tiled` (CPU-tiled), `attention_split` (register-tiled)
//! and `mma::flash` (tensor-core fragments).

use super::kernels::{self as k, Stored};
use super::kit::launch::{Dims, ROW_I, ROW_OUT, ROW_Q};
use super::kit::norm::{inverse_sum, Norm};
use super::kit::source::view_row;
use super::kit::walk::query_tile;
use attnc_compiler::plan::{RowView, ATTN_ROWS};
use cubecl::prelude::*;

/// Addresses of this unit's `r`-th query row (slots `ROW_*`): the row of
/// the query and of the output (clamped to the last row) and its index.
#[cube]
pub(super) fn row_slots(
    #[comptime] g: Dims,
    #[comptime] bq: usize,
    #[comptime] r: usize,
    #[comptime] views: [RowView; 4],
    #[comptime] split_stride: usize,
) -> Array<usize> {
    let mut a = Array::<usize>::new(3usize);
    let bh = k::cube_y(comptime![g.fold]);
    let i = query_tile(g, bq) * bq + UNIT_POS as usize + comptime![r * ATTN_ROWS];
    let row = min(i, comptime![g.s - 1]);
    let h = comptime![g.h];
    a[ROW_Q] = view_row(bh / h, bh % h, row, comptime![views[0]]);
    a[ROW_OUT] = view_row(bh / h, bh % h, row, comptime![views[3]]);
    // Split-KV: the cube's chunk of partial rows (grid z).
    if comptime![split_stride > 0] {
        a[ROW_OUT] += CUBE_POS_Z as usize * split_stride;
    }
    a[ROW_I] = i;
    a
}

/// This unit's query row, scaled.
#[cube]
pub(super) fn load_query<N: Size>(
    q: &[Vector<Stored, N>],
    base: usize,
    scale: f32,
    #[comptime] dl: usize,
) -> Array<Vector<f32, N>> {
    let mut a = Array::<Vector<f32, N>>::new(dl);
    #[unroll]
    for c in 0..dl {
        a[c] = Vector::<f32, N>::cast_from(q[base + c]) * Vector::new(scale);
    }
    a
}

/// `out = acc / l` (`kit::norm::inverse_sum`); a row that saw no key
/// (`l = 0`) is 0, and NaN stays NaN.
#[cube]
pub(super) fn store_row<N: Size>(
    out: &mut [Vector<Stored, N>],
    acc: &Array<Vector<f32, N>>,
    state: &Array<f32>,
    rows: &Array<usize>,
    #[comptime] s: usize,
    #[comptime] el: usize,
    #[comptime] norm: Norm,
) {
    if rows[ROW_I] < s {
        let inv = inverse_sum(state, norm);
        let base = rows[ROW_OUT];
        #[unroll]
        for c in 0..el {
            out[base + c] = Vector::<Stored, N>::cast_from(acc[c] * Vector::new(inv));
        }
    }
}
