//! Training steps planned as FlashAttention-2 plans them: the forward
//! attention launch also writes the log-sum-exp its backward reads (no
//! launch recomputing it), and `dK` and `dV` come from one launch that walks
//! the query tiles once for both.

use super::{BufferRole, KernelSpec, Layout, Planner, Val};
use crate::ir::{AttnArg, Op, Program};

impl Planner {
    /// The launch whose one output is node `f`'s buffer, if its spec `fits`.
    fn launch_of(&self, f: usize, fits: impl Fn(&KernelSpec) -> bool) -> Option<usize> {
        let Val::At { buf, .. } = self.vals[f] else { return None };
        let at = self.launches.iter().rposition(|l| l.outputs() == [buf])?;
        fits(&self.launches[at].spec).then_some(at)
    }

    /// A new buffer of `shape` that launch `at` writes just before its own
    /// output (its spec says so).
    fn second_output(&mut self, at: usize, shape: &[usize]) -> usize {
        let buf = self.buffer(shape, BufferRole::Temp);
        let launch = &mut self.launches[at];
        let out = launch.bindings.len() - 1;
        launch.bindings.insert(out, buf);
        launch.bytes += 4.0 * shape.iter().product::<usize>() as f64;
        buf
    }

    /// Node `n`, an `AttentionLse`, from the forward attention launch over
    /// the same queries, keys, mask, scale and functions, if one was planned
    /// and can write it (plain attention; not mixing heads, paged or split).
    pub(super) fn forward_lse(&mut self, p: &Program, n: usize) -> Option<Val> {
        let Op::AttentionLse { q, k, mask, scale, ref fns } = p.nodes[n].op else { return None };
        let forward = (0..n).find(|&f| {
            matches!(&p.nodes[f].op, Op::Attention { q: q2, k: k2, mask: m2, scale: s2, fns: f2, .. }
                if (*q2, *k2, m2, *s2, f2) == (q, k, &mask, scale, fns))
        })?;
        let at =
            self.launch_of(forward, |s| matches!(s, KernelSpec::Attention { lse: false, kv: None, paged: None, .. }))?;
        let shape = self.shapes[n].clone();
        let lse = self.second_output(at, &shape);
        if let KernelSpec::Attention { lse: writes, .. } = &mut self.launches[at].spec {
            *writes = true;
        }
        Some(Val::At { buf: lse, layout: Layout::contiguous(&shape) })
    }

    /// Node `n`, an `AttentionGrad` by `V`, from the launch of the gradient by
    /// `K` with the same operands, if one was planned on the tiled kernels:
    /// that launch also writes `dV` (`KernelSpec::AttentionGrad::dv`), in the
    /// layout `written` (`reader_layout`: a head merge that reads it) if given.
    pub(super) fn grad_v_with_k(
        &mut self,
        p: &Program,
        n: usize,
        written: Option<(Vec<usize>, Layout)>,
    ) -> Option<Val> {
        let Op::AttentionGrad { wrt: AttnArg::V, .. } = p.nodes[n].op else { return None };
        let same = |f: usize| match (&p.nodes[f].op, &p.nodes[n].op) {
            (
                Op::AttentionGrad { wrt: AttnArg::K, q, k, v, o, dout, lse, mask, scale, fns },
                Op::AttentionGrad {
                    q: q2, k: k2, v: v2, o: o2, dout: d2, lse: l2, mask: m2, scale: s2, fns: f2, ..
                },
            ) => (q, k, v, o, dout, lse, mask, scale, fns) == (q2, k2, v2, o2, d2, l2, m2, s2, f2),
            _ => false,
        };
        let grad_k = (0..n).find(|&f| same(f))?;
        let at =
            self.launch_of(grad_k, |s| matches!(s, KernelSpec::AttentionGrad { wrt: AttnArg::K, dv: None, .. }))?;
        let shape = self.shapes[n].clone();
        let (buf_shape, layout) = written.unwrap_or_else(|| (shape.clone(), Layout::contiguous(&shape)));
        let dv = self.second_output(at, &buf_shape);
        let launch = &mut self.launches[at];
        if let KernelSpec::AttentionGrad { dv: written, .. } = &mut launch.spec {
            *written = Some(layout.row_view().expect("gradients are written in rows"));
        }
        launch.flops *= 1.5;
        Some(Val::At { buf: dv, layout })
    }
}
