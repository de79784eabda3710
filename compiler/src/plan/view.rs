//! Views: where an operand's elements live in a buffer. Layout operations
//! (head splits and merges, interleaving, slices) and broadcasting are views
//! read by the consumer's loads or written by the producer's stores, not copies.

use serde::Serialize;

/// Where an operand element lives: `offset + Σ_k ((i / div_k) % modulo_k) · stride_k`
/// for output element `i`. Layout changes and broadcasting are views.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct View {
    pub offset: usize,
    pub terms: Vec<(usize, usize, usize)>,
}

impl View {
    /// A view over `refined` (a row-major refinement of the output shape),
    /// with `strides[k]` the operand stride of refined axis `k`.
    pub fn new(refined: &[usize], strides: &[usize], offset: usize) -> View {
        let mut terms = vec![];
        let mut div = 1;
        for k in (0..refined.len()).rev() {
            if refined[k] > 1 && strides[k] != 0 {
                terms.push((div, refined[k], strides[k]));
            }
            div *= refined[k];
        }
        // Merge axes that are contiguous in both spaces (innermost first).
        let mut merged: Vec<(usize, usize, usize)> = vec![];
        for t in terms {
            match merged.last_mut() {
                Some(last) if t.0 == last.0 * last.1 && t.2 == last.2 * last.1 => last.1 *= t.1,
                _ => merged.push(t),
            }
        }
        merged.reverse();
        View { offset, terms: merged }
    }

    /// numpy broadcasting of a row-major `operand` to `out`.
    pub fn broadcast(operand: &[usize], out: &[usize]) -> View {
        Layout::contiguous(operand).broadcast(out).view()
    }

    /// The same view over indices `i` that are multiples of `l`, in vectors
    /// of `l` (offset and result too); `None` unless every term steps by
    /// whole vectors or is the contiguous innermost run.
    pub fn in_vectors(&self, l: usize) -> Option<View> {
        if !self.offset.is_multiple_of(l) {
            return None;
        }
        let terms = self
            .terms
            .iter()
            .map(|&(div, modulo, stride)| match (div, stride) {
                (1, 1) if modulo % l == 0 => Some((1, modulo / l, 1)),
                _ if div % l == 0 && stride % l == 0 => Some((div / l, modulo, stride / l)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        Some(View { offset: self.offset / l, terms })
    }

    /// Offset and strides divided by `l` (indices stay as they are).
    pub fn scaled_down(&self, l: usize) -> View {
        View { offset: self.offset / l, terms: self.terms.iter().map(|&(d, m, s)| (d, m, s / l)).collect() }
    }

    /// The operand index of output element `i` (the host-side definition kernels follow).
    pub fn index(&self, i: usize) -> usize {
        self.offset + self.terms.iter().map(|&(d, m, s)| (i / d) % m * s).sum::<usize>()
    }
}

/// Where row `(b, h, r)` of a `[B, H, S, w]` attention operand or output
/// starts, in floats: `offset + b·batch + h·head + (r / block)·outer + (r % block)·inner`;
/// the row's `w` values are contiguous. Head splits and merges and
/// (de)interleaving of pseudo-heads are such views, so attention reads and
/// writes those layouts in place instead of through copy launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct RowView {
    pub offset: usize,
    pub batch: usize,
    pub head: usize,
    pub block: usize,
    pub outer: usize,
    pub inner: usize,
}

impl RowView {
    /// The float offset of row `(b, h, r)` (the host-side definition kernels follow).
    pub fn row(&self, b: usize, h: usize, r: usize) -> usize {
        self.offset + b * self.batch + h * self.head + r / self.block * self.outer + r % self.block * self.inner
    }

    /// Every offset and stride divided by `l` (all are multiples of it).
    pub fn in_vectors(&self, l: usize) -> RowView {
        let v = |x: usize| {
            debug_assert_eq!(x % l, 0, "a row view stride is not a multiple of the line size");
            x / l
        };
        RowView {
            offset: v(self.offset),
            batch: v(self.batch),
            head: v(self.head),
            block: self.block,
            outer: v(self.outer),
            inner: v(self.inner),
        }
    }
}

/// A reduction of `axes` of a row-major `shape`: the view from each output
/// element to its first input element (`offset` added) and the view over the
/// reduced elements. One loop walks them when the second has at most one term.
pub(crate) fn reduce_views(shape: &[usize], axes: &[usize], offset: usize) -> (View, View) {
    let strides = row_major_strides(shape);
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let pick = |which: &[usize], of: &[usize]| -> Vec<usize> { which.iter().map(|&a| of[a]).collect() };
    (
        View::new(&pick(&kept, shape), &pick(&kept, &strides), offset),
        View::new(&pick(axes, shape), &pick(axes, &strides), 0),
    )
}

pub(crate) fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Where each element of a tensor lives in its buffer: logical axis `k` is a
/// mixed-radix number over the factors `axes[k]` (`(size, stride)`, most
/// significant first), so element `(i_0, …)` is at
/// `offset + Σ_k Σ_f digit_f(i_k) · stride_f`. A row-major tensor has one
/// factor per axis; head splits and merges, (de)interleaving, flattening and
/// column slices only split, merge, reorder and offset factors, so a chain of
/// them is one `Layout` of the buffer its source lives in (as in CuTe's
/// layouts). Consumers read it as a [`View`] or a [`RowView`]; only a layout
/// no consumer can read is copied.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub offset: usize,
    pub axes: Vec<Vec<(usize, usize)>>,
}

impl Layout {
    /// A row-major tensor of `shape`.
    pub fn contiguous(shape: &[usize]) -> Layout {
        let strides = row_major_strides(shape);
        Layout { offset: 0, axes: shape.iter().zip(strides).map(|(&n, s)| vec![(n, s)]).collect() }.simplified()
    }

    /// The logical shape.
    pub fn shape(&self) -> Vec<usize> {
        self.axes.iter().map(|f| f.iter().map(|x| x.0).product()).collect()
    }

    /// Whether this is the row-major layout of its shape at offset 0.
    pub fn is_contiguous(&self) -> bool {
        *self == Layout::contiguous(&self.shape())
    }

    /// Factors of size 1 dropped, adjacent factors of an axis that step
    /// contiguously fused (an axis of size 1 keeps one factor `(1, 0)`).
    fn simplified(mut self) -> Layout {
        for axis in &mut self.axes {
            let mut fused: Vec<(usize, usize)> = vec![];
            for &(n, s) in axis.iter().filter(|f| f.0 != 1) {
                match fused.last_mut() {
                    Some(last) if last.1 == n * s => *last = (last.0 * n, s),
                    _ => fused.push((n, s)),
                }
            }
            if fused.is_empty() {
                fused.push((1, 0));
            }
            *axis = fused;
        }
        self
    }

    /// Axis `k` split into `(outer, n / outer)`; `None` when its factors do
    /// not divide there.
    fn split(mut self, k: usize, outer: usize) -> Option<Layout> {
        let n: usize = self.axes[k].iter().map(|f| f.0).product();
        if outer == 0 || !n.is_multiple_of(outer) {
            return None;
        }
        let mut inner_left = n / outer;
        let mut inner: Vec<(usize, usize)> = vec![];
        let mut factors = std::mem::take(&mut self.axes[k]);
        while inner_left > 1 {
            let (size, stride) = factors.pop()?;
            if size <= inner_left {
                if !inner_left.is_multiple_of(size) {
                    return None;
                }
                inner_left /= size;
                inner.insert(0, (size, stride));
            } else {
                if size % inner_left != 0 {
                    return None;
                }
                factors.push((size / inner_left, stride * inner_left));
                inner.insert(0, (inner_left, stride));
                inner_left = 1;
            }
        }
        self.axes[k] = factors;
        self.axes.insert(k + 1, inner);
        Some(self.simplified())
    }

    /// Axes `k` and `k + 1` merged into one (`k` the more significant).
    fn merge(mut self, k: usize) -> Layout {
        let inner = self.axes.remove(k + 1);
        self.axes[k].extend(inner);
        self.simplified()
    }

    /// Axes reordered: new axis `i` is old axis `order[i]`.
    fn permute(self, order: &[usize]) -> Layout {
        Layout { offset: self.offset, axes: order.iter().map(|&i| self.axes[i].clone()).collect() }
    }

    /// `split_heads(x, heads)`: `[…, S, H·d]` → `[…, H, S, d]`.
    pub fn split_heads(self, heads: usize) -> Option<Layout> {
        let r = self.axes.len();
        let l = self.split(r - 1, heads)?;
        let mut order: Vec<usize> = (0..r - 2).collect();
        order.extend([r - 1, r - 2, r]);
        Some(l.permute(&order))
    }

    /// `merge_heads(x)`: `[…, H, S, d]` → `[…, S, H·d]`.
    pub fn merge_heads(self) -> Layout {
        let r = self.axes.len();
        let mut order: Vec<usize> = (0..r - 3).collect();
        order.extend([r - 2, r - 3, r - 1]);
        self.permute(&order).merge(r - 2)
    }

    /// `interleave(x)`: `[B, H, P, S, d]` → `[B, H, S·P, d]`.
    pub fn interleave(self) -> Layout {
        self.permute(&[0, 1, 3, 2, 4]).merge(2)
    }

    /// `deinterleave(x, P)`: `[B, H, S·P, d]` → `[B, H, P, S, d]`.
    pub fn deinterleave(self, pseudo: usize) -> Option<Layout> {
        let s = self.shape()[2] / pseudo.max(1);
        Some(self.split(2, s)?.permute(&[0, 1, 3, 2, 4]))
    }

    /// `unflatten_heads(x, P)`: `[B, H·P, S, d]` → `[B, H, P, S, d]`.
    pub fn unflatten_heads(self, pseudo: usize) -> Option<Layout> {
        let h = self.shape()[1] / pseudo.max(1);
        self.split(1, h)
    }

    /// `flatten_heads(x)`: `[B, H, P, S, d]` → `[B, H·P, S, d]`.
    pub fn flatten_heads(self) -> Layout {
        self.merge(1)
    }

    /// `transpose(x)`: `[K, F]` → `[F, K]`.
    pub fn transpose(self) -> Layout {
        self.permute(&[1, 0])
    }

    /// `unsqueeze(x, axes)`: size-1 axes inserted at `axes` (sorted) of the result.
    pub fn unsqueeze(mut self, axes: &[usize]) -> Layout {
        for &a in axes {
            self.axes.insert(a, vec![(1, 0)]);
        }
        self
    }

    /// `slice_cols(x, start, len)`: columns `start..start + len` of the last axis.
    pub fn slice_cols(self, start: usize, len: usize) -> Option<Layout> {
        let last = self.axes.len().checked_sub(1)?;
        self.slice(last, start, len)
    }

    /// Entries `start .. start + len` of `axis`, when that axis is one run of a stride.
    pub fn slice(mut self, axis: usize, start: usize, len: usize) -> Option<Layout> {
        let parts = self.axes.get_mut(axis)?;
        match parts[..] {
            [(_, stride)] => {
                self.offset += start * stride;
                *parts = vec![(len, stride)];
                Some(self.simplified())
            }
            _ => None,
        }
    }

    /// Broadcast (numpy rules) to `out`: missing leading axes and axes of
    /// size 1 repeat with stride 0.
    pub fn broadcast(&self, out: &[usize]) -> Layout {
        let pad = out.len() - self.axes.len();
        let axes = (0..out.len())
            .map(|k| match k.checked_sub(pad).map(|a| &self.axes[a]) {
                Some(f) if f.iter().map(|x| x.0).product::<usize>() == out[k] => f.clone(),
                _ => vec![(out[k], 0)],
            })
            .collect();
        Layout { offset: self.offset, axes }
    }

    /// The buffer index of logical element `i` (row-major over the shape) as a [`View`].
    pub fn view(&self) -> View {
        let (sizes, strides): (Vec<usize>, Vec<usize>) = self.axes.iter().flatten().copied().unzip();
        View::new(&sizes, &strides, self.offset)
    }

    /// The stride of axis `k` when it is one factor (a size-1 axis: 0).
    pub fn stride(&self, k: usize) -> Option<usize> {
        single_stride(&self.axes[k])
    }

    /// The stride between the `blocks` equal blocks of the last axis, when
    /// each block starts a fixed distance after the previous one.
    pub fn block_stride(&self, blocks: usize) -> Option<usize> {
        let r = self.axes.len();
        self.clone().split(r - 1, blocks)?.stride(r - 1)
    }

    /// A reduction over `axes`: the view from each output element to its
    /// first reduced element and the view over the reduced elements.
    pub fn reduce_views(&self, axes: &[usize]) -> (View, View) {
        let pick = |keep: bool| -> (Vec<usize>, Vec<usize>) {
            (0..self.axes.len()).filter(|a| axes.contains(a) != keep).flat_map(|a| self.axes[a].clone()).unzip()
        };
        let ((ks, kst), (rs, rst)) = (pick(true), pick(false));
        (View::new(&ks, &kst, self.offset), View::new(&rs, &rst, 0))
    }

    /// A 4-axis `[B, H, S, w]` layout whose rows are contiguous as a [`RowView`].
    pub fn row_view(&self) -> Option<RowView> {
        let [b, h, r, w] = &self.axes[..] else { return None };
        if w.len() != 1 || (w[0].0 > 1 && w[0].1 != 1) {
            return None;
        }
        let (batch, head) = (single_stride(b)?, single_stride(h)?);
        let (block, outer, inner) = match r[..] {
            [(_, s)] => (1, s, 0),
            [(_, so), (p, si)] => (p, so, si),
            _ => return None,
        };
        Some(RowView { offset: self.offset, batch, head, block, outer, inner })
    }
}

/// The stride of an axis made of one factor.
fn single_stride(factors: &[(usize, usize)]) -> Option<usize> {
    match factors {
        [(_, s)] => Some(*s),
        _ => None,
    }
}
