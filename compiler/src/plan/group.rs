//! Group kernels: the per-group work of a reward estimator fused into one
//! launch, one cube per group, every intermediate value in shared memory.
//!
//! A node is *group-local* when it is elementwise, a threshold split, a
//! reduction or a leave-one-out mean that never mixes groups (axis 0 is the
//! group axis of the spec's inputs). Each group-local node read outside that
//! set (or an output) is a *root*: it gets one [`KernelSpec::Group`] computing
//! it from its group-local ancestors, which never touch device memory.
//!
//! `thresholds(r, levels = K)` is not materialised as `[G, K−1]`. Its value is
//! *lifted*: an elementwise function of the indicator `1[r_g ≥ t + 2]` and of
//! values that do not depend on the sample is stored as two rows, its value at
//! indicator 0 and at indicator 1 for every level `t` (`[2, K−1]`). Reducing
//! it over the group needs only the count `c_t` of samples passing level `t`
//! (a histogram of the levels each rating passes, then a suffix sum); reducing
//! it over the levels needs, per sample, one prefix and one suffix of a scan.
//! That is the cumulative-count form of ODRPO (`docs/semantics.md` §4):
//! O(G + K) per group instead of O(G·K). Any other use densifies it.

use super::{reduce_views, row_major_strides, KernelSpec, View};
use crate::cost::op_cost;
use crate::ir::{BinaryOp, Op, Program, ReduceKind, UnaryOp};
use serde::Serialize;
use std::collections::BTreeMap;

/// Shared memory one group kernel may use, in f32 values (16 KiB: WebGPU's
/// guaranteed minimum). A root whose values need more runs unfused.
pub const MAX_SCRATCH: usize = 4096;

/// The operation of a [`GroupStep::Map`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapOp {
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// `where(c, x, y)`: `x` where `c ≠ 0`, else `y`.
    Where,
}

impl MapOp {
    pub fn name(self) -> &'static str {
        match self {
            MapOp::Unary(op) => op.name(),
            MapOp::Binary(op) => op.name(),
            MapOp::Where => "where",
        }
    }
}

impl Serialize for MapOp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// One step of a group kernel; `s` is the group's shared array, `b` the group,
/// `i` ranges over `0..len` (split among the cube's units) unless noted.
/// Every step ends with a barrier.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum GroupStep {
    /// `s[dst + i] = inputs[input][b·stride + i]`.
    Load { dst: usize, len: usize, input: usize, stride: usize },
    /// `s[dst + i] = op(s[args[0](i)], …)`: binary, unary or `where`.
    Map { dst: usize, len: usize, op: MapOp, args: Vec<View> },
    /// `s[dst + i] = 1[s[x(i)] ≥ i % (levels − 1) + 2]` (a dense threshold split).
    Thresholds { dst: usize, len: usize, levels: usize, x: View },
    /// `s[dst + i] = 1[i ≥ l]` for `i < 2l`: a lifted threshold split.
    Indicator { dst: usize, l: usize },
    /// `s[dst + i] = op_{r < count} s[base(i) + r·stride]`.
    Reduce { dst: usize, len: usize, op: ReduceKind, base: View, count: usize, stride: usize },
    /// `s[dst + i] = (Σ_r s[x + base(i) + r·stride] − s[x + i]) / (n − 1)`.
    LooMean { dst: usize, len: usize, x: usize, n: usize, stride: usize },
    /// One unit: levels passed `s[m + g]` by each rating `s[r + g]`, and the
    /// counts `c[t]` at `hist + l + 1` (after a histogram of `l + 1` bins).
    Levels { r: usize, m: usize, hist: usize, g: usize, l: usize },
    /// A lifted value reduced over the group axis, for each level `i < l`.
    LiftReduceGroups { dst: usize, v: usize, c: usize, g: usize, l: usize, op: ReduceKind },
    /// One unit: prefix (indicator 1) and suffix (indicator 0) scans, `2l + 2` values.
    LiftScan { dst: usize, v: usize, l: usize, op: ReduceKind },
    /// A lifted value reduced over the levels, for each sample `i < g`.
    LiftReduceLevels { dst: usize, g: usize, scan: usize, m: usize, l: usize, op: ReduceKind },
    /// `s[dst + g·l + t]` = the lifted value at sample `g`'s indicator for level `t`.
    Densify { dst: usize, v: usize, m: usize, g: usize, l: usize },
    /// `out[b·len + i] = s[src + i]`.
    Store { src: usize, len: usize },
}

/// Which nodes are group-local (see the module docs): they carry the group
/// axis (as the spec's non-weight inputs of rank ≥ 2 do) and are computed by
/// an operation a group kernel runs.
pub fn group_local(p: &Program, shapes: &[Vec<usize>]) -> Vec<bool> {
    let mut grouped = vec![false; p.nodes.len()];
    for (i, node) in p.nodes.iter().enumerate() {
        let ops: Vec<usize> = node.op.operands().iter().map(|o| o.0 as usize).collect();
        grouped[i] = match &node.op {
            Op::Input { index } => !p.inputs[*index].weight && shapes[i].len() >= 2,
            Op::Binary { .. } | Op::Unary { .. } | Op::Where { .. } => {
                ops.iter().any(|&o| grouped[o])
                    && ops.iter().all(|&o| !grouped[o] || shapes[o].len() == shapes[i].len())
            }
            Op::Thresholds { .. } => grouped[ops[0]],
            // One loop walks the reduced elements: they must form one strided run.
            Op::Reduce { axes, .. } => {
                grouped[ops[0]] && !axes.contains(&0) && reduce_views(&shapes[ops[0]], axes, 0).1.terms.len() <= 1
            }
            Op::LooMean { axis, .. } => grouped[ops[0]] && *axis != 0,
            _ => false,
        };
    }
    p.nodes.iter().zip(grouped).map(|(node, g)| g && !matches!(node.op, Op::Input { .. })).collect()
}

/// The group-local nodes read by a node that is not, or that are outputs.
pub fn roots(p: &Program, local: &[bool]) -> Vec<bool> {
    let mut root: Vec<bool> =
        (0..p.nodes.len()).map(|i| local[i] && p.outputs.iter().any(|(_, o)| o.0 as usize == i)).collect();
    for (i, node) in p.nodes.iter().enumerate() {
        if !local[i] {
            for o in node.op.operands() {
                root[o.0 as usize] |= local[o.0 as usize];
            }
        }
    }
    root
}

/// The nodes a group kernel for `root` computes, in program order: its
/// group-local ancestors up to other roots (which it reads from memory).
pub fn cone(p: &Program, local: &[bool], roots: &[bool], root: usize) -> Vec<usize> {
    let mut seen = vec![false; root + 1];
    let mut stack = vec![root];
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut seen[n], true) {
            continue;
        }
        stack.extend(p.nodes[n].op.operands().iter().map(|o| o.0 as usize).filter(|&o| local[o] && !roots[o]));
    }
    (0..=root).filter(|&n| seen[n]).collect()
}

/// A planned group kernel: its spec, the nodes bound as its inputs (in
/// binding order), and its roofline work.
pub struct GroupKernel {
    pub spec: KernelSpec,
    pub inputs: Vec<usize>,
    pub flops: f64,
    pub bytes: f64,
}

#[derive(Clone, Copy)]
enum Rep {
    Dense(usize),
    /// `[2, l]` at the offset, lifted from the thresholds node `src`.
    Lifted(usize, usize),
}

/// Per lifted threshold split: sample levels `m`, counts `c`, group size and levels.
#[derive(Clone, Copy)]
struct Levels {
    m: usize,
    c: usize,
    g: usize,
    l: usize,
}

struct Builder<'a> {
    p: &'a Program,
    shapes: &'a [Vec<usize>],
    scratch: usize,
    steps: Vec<GroupStep>,
    inputs: Vec<usize>,
    loads: BTreeMap<(usize, bool), usize>,
    reps: BTreeMap<usize, Rep>,
    dense_lifted: BTreeMap<usize, usize>,
    levels: BTreeMap<usize, Levels>,
    /// Freed `(offset, len)` ranges, by offset.
    free: Vec<(usize, usize)>,
    /// The ranges each node's values occupy.
    owned: BTreeMap<usize, Vec<(usize, usize)>>,
}

/// Plan the group kernel for `root`, or `None` when it needs more shared
/// memory than [`MAX_SCRATCH`] (the nodes then run as ordinary kernels).
pub fn group_kernel(
    p: &Program,
    shapes: &[Vec<usize>],
    local: &[bool],
    roots: &[bool],
    root: usize,
) -> Option<GroupKernel> {
    let mut b = Builder {
        p,
        shapes,
        scratch: 0,
        steps: vec![],
        inputs: vec![],
        loads: BTreeMap::new(),
        reps: BTreeMap::new(),
        dense_lifted: BTreeMap::new(),
        levels: BTreeMap::new(),
        free: vec![],
        owned: BTreeMap::new(),
    };
    let nodes = cone(p, local, roots, root);
    // Releasing twice is harmless, so an operand read twice by one node needs no care.
    let operands = |n: usize| -> Vec<usize> { p.nodes[n].op.operands().iter().map(|o| o.0 as usize).collect() };
    let mut last_use: BTreeMap<usize, usize> = BTreeMap::new();
    for &n in &nodes {
        for o in operands(n) {
            last_use.insert(o, n);
        }
    }
    for &n in &nodes {
        b.node(n)?;
        if b.scratch > MAX_SCRATCH {
            return None;
        }
        for o in operands(n) {
            if last_use[&o] == n {
                b.release(o);
            }
        }
    }
    let (src, _) = b.dense(root, true);
    let len: usize = shapes[root][1..].iter().product();
    b.steps.push(GroupStep::Store { src, len });
    if b.scratch > MAX_SCRATCH {
        return None;
    }
    let flops = nodes
        .iter()
        .map(|&n| {
            let operands: Vec<Vec<usize>> =
                p.nodes[n].op.operands().iter().map(|o| shapes[o.0 as usize].clone()).collect();
            op_cost(&p.nodes[n].op, &shapes[n], &operands).flops
        })
        .sum();
    let numel = |n: usize| shapes[n].iter().product::<usize>() as f64;
    let bytes = 4.0 * (b.inputs.iter().map(|&n| numel(n)).sum::<f64>() + numel(root));
    let spec = KernelSpec::Group {
        groups: shapes[root][0],
        len: shapes[root].iter().product(),
        inputs: b.inputs.len(),
        scratch: b.scratch.max(1),
        steps: b.steps,
    };
    Some(GroupKernel { spec, inputs: b.inputs, flops, bytes })
}

impl Builder<'_> {
    /// First-fit in the freed ranges, else at the end; `owner`'s ranges are
    /// released after its last reader (see [`group_kernel`]).
    fn alloc(&mut self, owner: Option<usize>, n: usize) -> usize {
        let off = match self.free.iter().position(|&(_, len)| len >= n) {
            Some(k) => {
                let (off, len) = self.free[k];
                if len == n {
                    self.free.remove(k);
                } else {
                    self.free[k] = (off + n, len - n);
                }
                off
            }
            None => match self.free.last() {
                Some(&(off, len)) if off + len == self.scratch => {
                    self.free.pop();
                    self.scratch = off + n;
                    off
                }
                _ => {
                    self.scratch += n;
                    self.scratch - n
                }
            },
        };
        if let Some(o) = owner {
            self.owned.entry(o).or_default().push((off, n));
        }
        off
    }

    fn release(&mut self, owner: usize) {
        for (off, n) in self.owned.remove(&owner).unwrap_or_default() {
            let k = self.free.partition_point(|&(o, _)| o < off);
            self.free.insert(k, (off, n));
        }
        // Coalesce neighbours.
        let mut merged: Vec<(usize, usize)> = vec![];
        for &(off, n) in &self.free {
            match merged.last_mut() {
                Some(last) if last.0 + last.1 == off => last.1 += n,
                _ => merged.push((off, n)),
            }
        }
        self.free = merged;
    }

    /// A dense, group-local copy of node `o` and its per-group shape. A node
    /// outside the group kernel is loaded: its group's slice when `per_group`
    /// (same rank as the reader, axis 0 the group axis), else all of it.
    fn dense(&mut self, o: usize, per_group: bool) -> (usize, Vec<usize>) {
        let shape = self.shapes[o].clone();
        if let Some(&rep) = self.reps.get(&o) {
            let off = match rep {
                Rep::Dense(off) => off,
                Rep::Lifted(v, src) => match self.dense_lifted.get(&o) {
                    Some(&d) => d,
                    None => {
                        let Levels { m, g, l, .. } = self.levels[&src];
                        let dst = self.alloc(Some(o), g * l);
                        self.steps.push(GroupStep::Densify { dst, v, m, g, l });
                        self.dense_lifted.insert(o, dst);
                        dst
                    }
                },
            };
            return (off, shape[1..].to_vec());
        }
        let key = (o, per_group);
        let local_shape = if per_group { shape[1..].to_vec() } else { shape.clone() };
        if let Some(&off) = self.loads.get(&key) {
            return (off, local_shape);
        }
        let input = match self.inputs.iter().position(|&n| n == o) {
            Some(k) => k,
            None => {
                self.inputs.push(o);
                self.inputs.len() - 1
            }
        };
        let len: usize = local_shape.iter().product();
        let stride = if per_group && shape[0] > 1 { len } else { 0 };
        let dst = self.alloc(Some(o), len);
        self.steps.push(GroupStep::Load { dst, len, input, stride });
        self.loads.insert(key, dst);
        (dst, local_shape)
    }

    fn node(&mut self, n: usize) -> Option<()> {
        let shape = self.shapes[n].clone();
        let rank = shape.len();
        let ls = shape[1..].to_vec();
        let len: usize = ls.iter().product();
        let ops: Vec<usize> = self.p.nodes[n].op.operands().iter().map(|o| o.0 as usize).collect();
        let rep = match &self.p.nodes[n].op {
            op @ (Op::Binary { .. } | Op::Unary { .. } | Op::Where { .. }) => {
                let name = match op {
                    Op::Binary { op, .. } => MapOp::Binary(*op),
                    Op::Unary { op, .. } => MapOp::Unary(*op),
                    _ => MapOp::Where,
                };
                match self.lift_source(n, &ops) {
                    Some(src) => {
                        let l = self.levels[&src].l;
                        let it = [2, l];
                        let mut args = vec![];
                        for &o in &ops {
                            let rep = self.reps.get(&o).copied();
                            args.push(match rep {
                                Some(Rep::Lifted(v, _)) => View::new(&[2 * l], &[1], v),
                                _ => {
                                    let (off, lso) = self.dense(o, self.shapes[o].len() == rank);
                                    let mut v = View::broadcast(&lso, &it);
                                    v.offset += off;
                                    v
                                }
                            });
                        }
                        let dst = self.alloc(Some(n), 2 * l);
                        self.steps.push(GroupStep::Map { dst, len: 2 * l, op: name, args });
                        Rep::Lifted(dst, src)
                    }
                    None => {
                        let mut args = vec![];
                        for &o in &ops {
                            let (off, lso) = self.dense(o, self.shapes[o].len() == rank);
                            let mut v = View::broadcast(&lso, &ls);
                            v.offset += off;
                            args.push(v);
                        }
                        let dst = self.alloc(Some(n), len);
                        self.steps.push(GroupStep::Map { dst, len, op: name, args });
                        Rep::Dense(dst)
                    }
                }
            }
            Op::Thresholds { levels, .. } => {
                let (levels, x) = (*levels as usize, ops[0]);
                let l = levels - 1;
                if self.shapes[x].len() == 2 {
                    let (r, _) = self.dense(x, true);
                    let g = self.shapes[x][1];
                    let m = self.alloc(None, g);
                    let hist = self.alloc(None, 2 * l + 1);
                    self.steps.push(GroupStep::Levels { r, m, hist, g, l });
                    self.levels.insert(n, Levels { m, c: hist + l + 1, g, l });
                    let dst = self.alloc(Some(n), 2 * l);
                    self.steps.push(GroupStep::Indicator { dst, l });
                    Rep::Lifted(dst, n)
                } else {
                    let (off, _) = self.dense(x, true);
                    let dst = self.alloc(Some(n), len);
                    let xv = View::new(&[len / l, l], &[1, 0], off);
                    self.steps.push(GroupStep::Thresholds { dst, len, levels, x: xv });
                    Rep::Dense(dst)
                }
            }
            Op::Reduce { kind, axes, .. } => {
                let x = ops[0];
                let op = *kind;
                let lifted = match self.reps.get(&x) {
                    Some(&Rep::Lifted(v, src)) => Some((v, self.levels[&src])),
                    _ => None,
                };
                match (lifted, &axes[..]) {
                    (Some((v, lv)), [1]) => {
                        let dst = self.alloc(Some(n), lv.l);
                        self.steps.push(GroupStep::LiftReduceGroups { dst, v, c: lv.c, g: lv.g, l: lv.l, op });
                        Rep::Dense(dst)
                    }
                    (Some((v, lv)), [2]) if !matches!(kind, ReduceKind::Var { .. }) => {
                        let scan = self.alloc(Some(usize::MAX), 2 * lv.l + 2);
                        self.steps.push(GroupStep::LiftScan { dst: scan, v, l: lv.l, op });
                        let dst = self.alloc(Some(n), lv.g);
                        self.steps.push(GroupStep::LiftReduceLevels { dst, g: lv.g, scan, m: lv.m, l: lv.l, op });
                        self.release(usize::MAX);
                        Rep::Dense(dst)
                    }
                    _ => {
                        let (off, xs) = self.dense(x, true);
                        // Axes of the per-group shape are one less than the node's.
                        let axes: Vec<usize> = axes.iter().map(|a| a - 1).collect();
                        let (base, inner) = reduce_views(&xs, &axes, off);
                        let dst = self.alloc(Some(n), len);
                        self.steps.push(GroupStep::Reduce {
                            dst,
                            len,
                            op,
                            base,
                            count: axes.iter().map(|&a| xs[a]).product(),
                            stride: inner.terms.first().map_or(0, |t| t.2),
                        });
                        Rep::Dense(dst)
                    }
                }
            }
            Op::LooMean { axis, .. } => {
                let (x, xs) = self.dense(ops[0], true);
                let dst = self.alloc(Some(n), len);
                let (n_ax, stride) = (xs[axis - 1], row_major_strides(&xs)[axis - 1]);
                self.steps.push(GroupStep::LooMean { dst, len, x, n: n_ax, stride });
                Rep::Dense(dst)
            }
            _ => return None,
        };
        self.reps.insert(n, rep);
        Some(())
    }

    /// The threshold split an elementwise node can stay lifted over: its
    /// lifted operands share one, it has that split's shape, and its other
    /// operands do not vary along the sample axis.
    fn lift_source(&self, n: usize, ops: &[usize]) -> Option<usize> {
        let shape = &self.shapes[n];
        let mut src = None;
        for &o in ops {
            if let Some(&Rep::Lifted(_, s)) = self.reps.get(&o) {
                if src.is_some_and(|t| t != s) {
                    return None;
                }
                src = Some(s);
            }
        }
        let src = src?;
        if shape != &self.shapes[src] {
            return None;
        }
        for &o in ops {
            if matches!(self.reps.get(&o), Some(Rep::Lifted(..))) {
                continue;
            }
            let os = &self.shapes[o];
            // The operand's per-group shape, right-aligned to [G, L].
            let lso: Vec<usize> =
                if self.reps.contains_key(&o) || os.len() == shape.len() { os[1..].to_vec() } else { os.clone() };
            if lso.len() >= 2 && lso[lso.len() - 2] != 1 {
                return None;
            }
        }
        Some(src)
    }
}

/// Loop iterations one unit runs over all `steps` (see `KernelSpec::loop_trips`):
/// element loops are unrolled by chunks of the cube, and each chunk runs the
/// step's inner loop.
pub fn loop_trips(steps: &[GroupStep]) -> usize {
    let chunks = |len: usize| len.div_ceil(super::GROUP_UNITS);
    steps
        .iter()
        .map(|step| match *step {
            GroupStep::Reduce { len, op, count, .. } => {
                chunks(len) * if matches!(op, ReduceKind::Var { .. }) { 2 * count } else { count }
            }
            GroupStep::LooMean { len, n, .. } => chunks(len) * n,
            GroupStep::Levels { g, l, .. } => g + 2 * l + 1,
            GroupStep::LiftScan { l, .. } => 2 * l,
            _ => 0,
        })
        .sum()
}
