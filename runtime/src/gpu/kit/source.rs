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

/// Where a head's key (or value) rows are: under a view ([`InView`]) or in
/// a paged cache through its block table ([`InPages`]).
#[cube]
pub trait KeySource {
    /// The vector offset of the head's row `t`.
    fn row(&self, t: usize) -> usize;
}

/// Rows under a view from `base`, the offset of the head's row 0.
#[derive(CubeType)]
pub struct InView {
    pub base: usize,
    #[cube(comptime)]
    pub view: RowView,
}

#[cube]
impl KeySource for InView {
    fn row(&self, t: usize) -> usize {
        row_at(self.base, t, self.view)
    }
}

/// Rows of sequence `b` in a paged cache (`k::page_row`), `outer` vectors
/// a row, from `base`, the offset of the head's row 0 in the first page.
#[derive(CubeType)]
pub struct InPages<'a> {
    pub table: &'a [Stored],
    pub b: usize,
    pub base: usize,
    #[cube(comptime)]
    pub pages: k::Pages,
    #[cube(comptime)]
    pub outer: usize,
}

#[cube]
impl<'a> KeySource for InPages<'a> {
    fn row(&self, t: usize) -> usize {
        self.base + k::page_row(self.table, self.b, t, self.pages) * self.outer
    }
}

/// Key row `k0 + jj` of `src`, clamped to the last of `sk` where `clamp`.
#[cube]
pub fn key_row<S: KeySource>(k0: usize, src: &S, #[comptime] jj: usize, #[comptime] rows: (usize, bool)) -> usize {
    let (sk, clamp) = comptime![rows];
    let mut j = k0 + jj;
    if comptime![clamp] {
        j = min(j, comptime![sk - 1]);
    }
    src.row(j)
}

/// The address of key (or value) row `k0 + jj` under view `v` from the
/// head's base `base`: contiguous, or through the block table of a paged cache.
pub fn key_address(
    scope: &Scope,
    a: &Shape,
    k0: NativeExpand<usize>,
    base: NativeExpand<usize>,
    jj: usize,
    clamp: bool,
    view: RowView,
) -> NativeExpand<usize> {
    let rows = (a.g.sk, clamp);
    match &a.paged {
        None => key_row::expand::<InView>(scope, k0, &InViewExpand { base, view }, jj, rows),
        Some(p) => {
            let (b, _) = a.cube_head(scope);
            let src = InPagesExpand { table: &p.table, b, base, pages: p.pages(), outer: view.outer };
            key_row::expand::<InPages>(scope, k0, &src, jj, rows)
        }
    }
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
