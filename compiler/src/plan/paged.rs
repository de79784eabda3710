//! Paged key/value caches in a plan (`Op::Paged`): read in place by the
//! attention launches that read them (`KernelSpec::Attention::paged`: key
//! row `j` of sequence `b` at page `table[b, j / page]`, row `j % page`),
//! or gathered into sequence order by a launch for any other reader.

use super::{KernelSpec, Layout, PagedRows, Planner, RowView, Val};
use crate::ir::{NodeId, Op, Program};

/// Whether paged node `i` is read only as the keys or values of attention
/// (without head mixing) whose keys and values are both paged by the same
/// block table: those read the cache in place, and no gather is planned.
pub(super) fn in_place(p: &Program, readers: &[Vec<usize>], i: usize) -> bool {
    let Op::Paged { pages, .. } = p.nodes[i].op else { return false };
    let same = |n: crate::ir::NodeId| matches!(p.nodes[n.0 as usize].op, Op::Paged { pages: t, .. } if t == pages);
    !p.outputs.iter().any(|(_, o)| o.0 as usize == i)
        && readers[i].iter().all(|&r| match &p.nodes[r].op {
            Op::Attention { q, k, v, fns, .. } => {
                q.0 as usize != i && same(*k) && same(*v) && !fns.as_ref().is_some_and(|f| f.mixes())
            }
            _ => false,
        })
}

/// How attention reads a cache of shape `[blocks, page, heads, width]`
/// through a table of `slots` pages a sequence: the paging, and the row
/// view within a page (head `h` at `h · width`, rows `heads · width` apart).
pub(super) fn rows(cache: &[usize], slots: usize, integers: bool) -> (PagedRows, RowView) {
    let (row, width) = (cache[2] * cache[3], cache[3]);
    let view = RowView { offset: 0, batch: 0, head: width, block: 1, outer: row, inner: row };
    (PagedRows { page: cache[1], slots, blocks: cache[0], integers }, view)
}

/// The gather launch for readers that take the keys in sequence order.
pub(super) fn gather(cache: &[usize], table: &[usize], integers: bool) -> KernelSpec {
    let [blocks, page, heads, width] = cache[..] else { unreachable!("a paged cache has rank 4") };
    KernelSpec::Paged { batch: table[0], slots: table[1], blocks, page, heads, width, integers }
}

/// Attention's keys and values, each a buffer and a row view: a paged
/// cache read in place (with its paging and block table) where
/// [`in_place`] said so, else through their layouts.
#[allow(clippy::type_complexity)]
pub(super) fn keys_values(
    pl: &mut Planner,
    p: &Program,
    [k, v]: [NodeId; 2],
    integers: &[bool],
) -> ((usize, RowView), (usize, RowView), Option<(PagedRows, NodeId)>) {
    let (Op::Paged { cache: kc, pages }, Op::Paged { cache: vc, .. }, Val::Paged) =
        (&p.nodes[k.0 as usize].op, &p.nodes[v.0 as usize].op, &pl.vals[k.0 as usize])
    else {
        return (pl.read(k, Layout::row_view), pl.read(v, Layout::row_view), None);
    };
    let slots = pl.shapes[pages.0 as usize][1];
    let (rows, view) = self::rows(&pl.shapes[kc.0 as usize], slots, integers[pages.0 as usize]);
    let vview = self::rows(&pl.shapes[vc.0 as usize], slots, rows.integers).1;
    ((pl.contiguous(*kc), view), (pl.contiguous(*vc), vview), Some((rows, *pages)))
}
