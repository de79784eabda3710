//! Where a kernel's rows are: a head's rows under a view (`plan::RowView`),
//! and key and value rows, contiguous or in a paged cache through its block
//! table (`plan::PagedRows`).

use super::launch::Shape;
use crate::gpu::kernels::{self as k, Stored};
use attnc_compiler::plan::RowView;
use cubecl::prelude::*;

/// Vector offset of row `r` of head `(b, h)` in a view (strides in vectors).
#[cube]
pub fn view_row(b: usize, h: usize, r: usize, #[comptime] v: RowView) -> usize {
    let at = b * comptime![v.batch] + h * comptime![v.head] + comptime![v.offset];
    row_at(at, r, v)
}

/// `base` plus row `r`'s offset in view `v` (rows in blocks of `v.block`).
#[cube]
pub fn row_at(base: usize, r: usize, #[comptime] v: RowView) -> usize {
    let mut at = base;
    if comptime![v.block == 1] {
        at += r * comptime![v.outer];
    } else {
        at += r / comptime![v.block] * comptime![v.outer] + r % comptime![v.block] * comptime![v.inner];
    }
    at
}

/// Vector offset of key row `k0 + jj` (clamped to the last) in view `v`, from
/// the offset `base` of row 0 of the head.
#[cube]
pub fn key_row(
    k0: usize,
    base: usize,
    #[comptime] jj: usize,
    #[comptime] sk: usize,
    #[comptime] clamp: bool,
    #[comptime] v: RowView,
) -> usize {
    let mut j = k0 + jj;
    if comptime![clamp] {
        j = min(j, comptime![sk - 1]);
    }
    row_at(base, j, v)
}

/// The address of key (or value) row `k0 + jj` under view `v` from the
/// head's base: [`key_row`], or through the block table of a paged cache.
#[allow(clippy::too_many_arguments)]
pub fn key_address(
    scope: &Scope,
    a: &Shape,
    k0: NativeExpand<usize>,
    base: NativeExpand<usize>,
    jj: usize,
    clamp: bool,
    v: RowView,
) -> NativeExpand<usize> {
    match &a.paged {
        None => key_row::expand(scope, k0, base, jj, a.g.sk, clamp, v),
        Some(p) => {
            let (b, _) = a.cube_head(scope);
            let r = p.rows;
            paged_key_row::expand(
                scope, &p.table, b, k0, base, jj, a.g.sk, clamp, v.outer, r.page, r.slots, r.blocks, p.digits,
            )
        }
    }
}

/// [`key_row`] in a paged cache ([`k::page_row`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn paged_key_row(
    table: &[Stored],
    b: usize,
    k0: usize,
    base: usize,
    #[comptime] jj: usize,
    #[comptime] sk: usize,
    #[comptime] clamp: bool,
    #[comptime] outer: usize,
    #[comptime] page: usize,
    #[comptime] slots: usize,
    #[comptime] blocks: usize,
    #[comptime] digits: usize,
) -> usize {
    let mut j = k0 + jj;
    if comptime![clamp] {
        j = min(j, comptime![sk - 1]);
    }
    base + k::page_row(table, b, j, slots, page, blocks, digits) * outer
}

/// The output address of element `i` of a split-KV launch's merged rows
/// `[b, h, row, c]` (`e` floats a row) under the attention's view `out`.
#[cube]
pub fn combined_at(
    i: usize,
    #[comptime] h: usize,
    #[comptime] s: usize,
    #[comptime] e: usize,
    #[comptime] out: RowView,
) -> usize {
    let r = i / e;
    view_row(r / comptime![h * s], (r / s) % h, r % s, out) + i % e
}
