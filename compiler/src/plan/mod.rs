//! IR → a plan of kernel launches. The plan is plain data, printable and
//! serialisable without any device: which buffers exist, which kernel each
//! launch runs with which comptime parameters, and which buffers it binds.
//! Every size is concrete: a plan is specialised to the bound dims.

mod backward;
mod dtype;
mod gemm;
mod gemm_tiles;
pub mod group;
mod paged;
mod reads;
mod spec;
mod split;
mod tiles;
mod view;
mod visited;

pub use dtype::Dtype;
pub use gemm_tiles::*;
pub use spec::*;
pub use tiles::*;
pub use view::*;

use crate::cost::{op_cost, weight_only};
use crate::ir::{concrete, AttnArg, AttnFns, DimValues, NodeId, Op, Program};
use gemm::{gemm_a, plan_gemm, scale_of};
pub use reads::{Lines, SUM_UNROLL};
use serde::Serialize;
pub use split::{KvSplit, SPLIT_KEYS};
use std::collections::BTreeMap;
use visited::{attn_shape, kernel_fns};
pub use visited::{value_elements, INTEGER_DIGITS};

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum BufferRole {
    /// Uploaded from the input tensor of this name (`weight`: declared `weight`,
    /// so it may stay on the device between calls). `integers`: integers that
    /// only functions and block tables read, stored in half-precision plans as
    /// [`INTEGER_DIGITS`] base-256 digits a value (exact below 2^24).
    Input {
        name: String,
        weight: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        integers: bool,
    },
    /// Uploaded constant values.
    Constant { values: Vec<f64> },
    /// Written by a launch.
    Temp,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Buffer {
    pub id: usize,
    pub len: usize,
    pub shape: Vec<usize>,
    #[serde(flatten)]
    pub role: BufferRole,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Launch {
    /// Entry point, unique in the plan: `attnc_<spec>_<index>_<kind>`.
    pub name: String,
    pub spec: KernelSpec,
    /// Buffers bound in order: operands, then the output.
    pub bindings: Vec<usize>,
    /// After this launch, these temporaries are dead and may be freed.
    pub frees: Vec<usize>,
    /// Roofline work of the operation (the optimizer's cost model).
    pub flops: f64,
    pub bytes: f64,
    /// Work on weights and constants alone: done once per set of weights
    /// ([`Plan::prepared`] launches come first), not on every call.
    pub prepare: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub spec: String,
    pub dims: DimValues,
    pub buffers: Vec<Buffer>,
    pub launches: Vec<Launch>,
    pub outputs: Vec<(String, usize)>,
    /// What every buffer stores (`plan` gives f32; see [`Plan::in_dtype`]).
    pub dtype: Dtype,
    /// For each node of the planned program: whether its value is in a
    /// buffer that a launch reads or writes, so stored in `dtype`. Other
    /// values live in a fused launch's registers (at f32) or are folded into
    /// one as constants. The same-dtype reference rounds where this says
    /// (`interp::evaluate_planned`).
    #[serde(skip)]
    pub stored: Vec<bool>,
}

impl Launch {
    /// The buffers the launch writes: its last [`KernelSpec::outputs`] bindings.
    pub fn outputs(&self) -> &[usize] {
        &self.bindings[self.bindings.len() - self.spec.outputs()..]
    }
}

impl Plan {
    /// How many launches, at the start, prepare the weights: run them once
    /// and the rest on every call while the weights stay the same.
    pub fn prepared(&self) -> usize {
        self.launches.iter().take_while(|l| l.prepare).count()
    }
}

/// Launch `i`'s entry point: `attnc_<spec>_<index>_<kind>`.
fn launch_name(spec: &str, i: usize, kernel: &KernelSpec) -> String {
    format!("attnc_{spec}_{i:02}_{}", kernel.kind())
}

fn push_buffer(buffers: &mut Vec<Buffer>, shape: &[usize], role: BufferRole) -> usize {
    buffers.push(Buffer { id: buffers.len(), len: shape.iter().product(), shape: shape.to_vec(), role });
    buffers.len() - 1
}

/// The nodes that read each node.
fn readers(p: &Program) -> Vec<Vec<usize>> {
    let mut r = vec![vec![]; p.nodes.len()];
    for (i, node) in p.nodes.iter().enumerate() {
        for o in node.op.operands() {
            if !r[o.0 as usize].contains(&i) {
                r[o.0 as usize].push(i);
            }
        }
    }
    r
}

/// The layout attention's output (or a gradient's) is written in when its
/// one reader merges heads or deinterleaves: that reader's row-major buffer,
/// so the layout operation is a view and no copy follows. An output of the
/// program keeps its own row-major buffer.
fn reader_layout(p: &Program, readers: &[Vec<usize>], shapes: &[Vec<usize>], i: usize) -> Option<(Vec<usize>, Layout)> {
    let [c] = readers[i][..] else { return None };
    if p.outputs.iter().any(|(_, o)| o.0 as usize == i) {
        return None;
    }
    let written = match p.nodes[c].op {
        Op::MergeHeads { .. } if shapes[c].len() == 3 => Layout::contiguous(&shapes[c]).split_heads(shapes[i][1]),
        Op::Deinterleave { .. } => Some(Layout::contiguous(&shapes[c]).interleave()),
        _ => None,
    }?;
    Some((shapes[c].clone(), written))
}

/// Where a node's value is.
#[derive(Clone, Debug)]
enum Val {
    /// In buffer `buf` under `layout`. A layout operation's value is its
    /// operand's buffer under a new layout: no launch computes it.
    At { buf: usize, layout: Layout },
    /// Computed inside the group kernels that read it.
    InGroup,
    /// A GEMM (or its head split) whose only reader is fused into its
    /// epilogue (head mixing, a constant factor): planned, as one launch,
    /// where that reader is.
    InEpilogue,
    /// A paged cache's rows that the attention reading them reads in place.
    Paged,
}

struct Planner {
    shapes: Vec<Vec<usize>>,
    buffers: Vec<Buffer>,
    launches: Vec<Launch>,
    vals: Vec<Val>,
    /// Nodes copied to a row-major buffer because a reader could not read their layout.
    copies: BTreeMap<usize, usize>,
    /// Which nodes depend on weights and constants alone.
    weight_only: Vec<bool>,
    /// The node being planned.
    node: usize,
}

impl Planner {
    fn buffer(&mut self, shape: &[usize], role: BufferRole) -> usize {
        push_buffer(&mut self.buffers, shape, role)
    }

    /// A launch computing node `node` (named once the launches are in their final order).
    fn launch_for(&mut self, node: usize, spec: KernelSpec, bindings: Vec<usize>, flops: f64, bytes: f64) {
        let prepare = self.weight_only[node];
        self.launches.push(Launch { name: String::new(), spec, bindings, frees: vec![], flops, bytes, prepare });
    }

    fn launch(&mut self, spec: KernelSpec, bindings: Vec<usize>, flops: f64, bytes: f64) {
        self.launch_for(self.node, spec, bindings, flops, bytes)
    }

    fn at(&self, n: NodeId) -> (usize, Layout) {
        match &self.vals[n.0 as usize] {
            Val::At { buf, layout } => (*buf, layout.clone()),
            Val::InGroup | Val::InEpilogue | Val::Paged => {
                unreachable!("node {} is read only inside a fused launch", n.0)
            }
        }
    }

    /// Node `n` in a row-major buffer of its shape: its own when its layout
    /// is row-major, else a copy (one gather launch, made once per node).
    /// A backward pass of mixed attention: `q`, `k`, `v` and `dO` through
    /// row views, then `rows` (the log-sum-exp, D) and the captures whole.
    fn mixed_backward(
        &mut self,
        shape: AttnShape,
        pass: MixPass,
        fns: &Option<Box<AttnFns>>,
        shapes: &[Vec<usize>],
        [q, k, v, dout]: [NodeId; 4],
        rows: &[NodeId],
    ) -> (KernelSpec, Vec<usize>) {
        let (sq, sv) = (&shapes[q.0 as usize], &shapes[v.0 as usize]);
        let mix = MixTiles::of(fns.as_deref(), shapes, sq, sv).expect("head mixing");
        let mut bindings = vec![];
        let [q, k, v, out] = [q, k, v, dout].map(|x| {
            let (b, view) = self.read(x, Layout::row_view);
            bindings.push(b);
            view
        });
        bindings.extend(rows.iter().map(|r| self.contiguous(*r)));
        bindings.extend(fns.iter().flat_map(|f| f.captures.iter()).map(|c| self.contiguous(*c)));
        (KernelSpec::MixedAttention { shape, mix, q, k, v, out, pass }, bindings)
    }

    fn contiguous(&mut self, n: NodeId) -> usize {
        let (buf, layout) = self.at(n);
        if layout.is_contiguous() {
            return buf;
        }
        if let Some(&copy) = self.copies.get(&(n.0 as usize)) {
            return copy;
        }
        let shape = self.shapes[n.0 as usize].clone();
        let len: usize = shape.iter().product();
        let out = self.buffer(&shape, BufferRole::Temp);
        let spec = KernelSpec::Gather { len, x: layout.view() };
        self.launch_for(n.0 as usize, spec, vec![buf, out], 0.0, 8.0 * len as f64);
        self.copies.insert(n.0 as usize, out);
        out
    }

    /// Node `n`'s row-major buffer, as an output: a buffer of its own shape (a
    /// layout view over a computed buffer of another shape names it anew; an
    /// input's buffer is copied).
    fn output(&mut self, n: NodeId) -> usize {
        let buf = self.contiguous(n);
        let shape = &self.shapes[n.0 as usize];
        if self.buffers[buf].shape == *shape {
            return buf;
        }
        if self.buffers[buf].role == BufferRole::Temp {
            self.buffers[buf].shape = shape.clone();
            return buf;
        }
        let (shape, len) = (shape.clone(), shape.iter().product());
        let out = self.buffer(&shape, BufferRole::Temp);
        let spec = KernelSpec::Gather { len, x: Layout::contiguous(&shape).view() };
        self.launch_for(n.0 as usize, spec, vec![buf, out], 0.0, 8.0 * len as f64);
        out
    }

    /// The value of a layout operation on `n`: `n`'s buffer under `f` of its
    /// layout, or `f` of a row-major copy where `f` cannot express it.
    fn relayout(&mut self, n: NodeId, f: impl Fn(Layout) -> Option<Layout>) -> Val {
        let (buf, layout) = self.at(n);
        if let Some(layout) = f(layout) {
            return Val::At { buf, layout };
        }
        let buf = self.contiguous(n);
        let layout = f(Layout::contiguous(&self.shapes[n.0 as usize])).expect("a row-major layout splits anywhere");
        Val::At { buf, layout }
    }

    /// Node `n` as a reader takes it: `accept` of its layout, or of a
    /// row-major copy where `accept` refuses the layout.
    fn read<T>(&mut self, n: NodeId, accept: impl Fn(&Layout) -> Option<T>) -> (usize, T) {
        let (buf, layout) = self.at(n);
        if let Some(t) = accept(&layout) {
            return (buf, t);
        }
        let buf = self.contiguous(n);
        (buf, accept(&Layout::contiguous(&self.shapes[n.0 as usize])).expect("every reader takes a row-major layout"))
    }
}

/// Plan `p` at the concrete `dims`.
pub fn plan(p: &Program, dims: &DimValues) -> Plan {
    let shapes: Vec<Vec<usize>> = p.nodes.iter().map(|n| concrete(&n.shape, dims)).collect();
    // Group-local work: one group kernel per root; nodes only those kernels
    // read get no launch of their own (unless a root did not fit).
    let local = group::group_local(p, &shapes);
    let roots = group::roots(p, &local);
    let mut fused: BTreeMap<usize, group::GroupKernel> = BTreeMap::new();
    let mut generic = vec![false; p.nodes.len()];
    for r in (0..p.nodes.len()).filter(|&r| roots[r]) {
        match group::group_kernel(p, &shapes, &local, &roots, r) {
            Some(k) => {
                fused.insert(r, k);
            }
            None => group::cone(p, &local, &roots, r).into_iter().for_each(|n| generic[n] = true),
        }
    }
    let readers = readers(p);
    let integers = visited::integer_reads(p);
    let is_output = |n: usize| p.outputs.iter().any(|(_, o)| o.0 as usize == n);
    let mut pl = Planner {
        shapes: shapes.clone(),
        buffers: vec![],
        launches: vec![],
        vals: Vec::with_capacity(p.nodes.len()),
        copies: BTreeMap::new(),
        weight_only: weight_only(p),
        node: 0,
    };
    for (i, node) in p.nodes.iter().enumerate() {
        pl.node = i;
        let shape = shapes[i].clone();
        if let Some(k) = fused.remove(&i) {
            let mut bindings: Vec<usize> = k.inputs.iter().map(|&n| pl.contiguous(NodeId(n as u32))).collect();
            let out = pl.buffer(&shape, BufferRole::Temp);
            bindings.push(out);
            pl.launch(k.spec, bindings, k.flops, k.bytes);
            pl.vals.push(Val::At { buf: out, layout: Layout::contiguous(&shape) });
            continue;
        }
        if local[i] && !generic[i] {
            pl.vals.push(Val::InGroup);
            continue;
        }
        // `mix_heads(split_heads(x @ w, m), alpha)`: one GEMM mixing in its epilogue.
        let only_reader = |n: usize| match readers[n][..] {
            [r] if !is_output(n) => Some(r),
            _ => None,
        };
        let mixed_gemm = |n: usize| -> Option<usize> {
            let Op::MatMul { .. } = node.op else { return None };
            let split = only_reader(n).filter(|&r| {
                matches!(p.nodes[r].op, Op::SplitHeads { heads, .. }
                if heads as usize <= MixEpilogue::MAX_HEADS && shapes[n].len() == 3)
            })?;
            only_reader(split).filter(|&r| matches!(p.nodes[r].op, Op::MixHeads { x, .. } if x.0 as usize == split))
        };
        // `(x @ w) * c` or `(x @ w) / c` with a constant `c`: one GEMM scaling in its epilogue.
        let scaled_gemm = |n: usize| -> Option<usize> {
            let Op::MatMul { .. } = node.op else { return None };
            only_reader(n).filter(|&r| scale_of(p, r).is_some_and(|(mm, _)| mm == n))
        };
        if mixed_gemm(i).is_some() || scaled_gemm(i).is_some() {
            pl.vals.push(Val::InEpilogue);
            continue;
        }
        if matches!(node.op, Op::Paged { .. }) && paged::in_place(p, &readers, i) {
            pl.vals.push(Val::Paged);
            continue;
        }
        if let Op::SplitHeads { x, .. } = node.op {
            if matches!(pl.vals[x.0 as usize], Val::InEpilogue) {
                pl.vals.push(Val::InEpilogue);
                continue;
            }
        }
        // Leaves, layout operations (views of their operand's buffer), and
        // what a training step's forward or dK launch writes beside its output.
        let val = match &node.op {
            Op::AttentionLse { .. } => pl.forward_lse(p, i),
            Op::AttentionGrad { wrt: AttnArg::V, .. } => pl.grad_v_with_k(p, i, reader_layout(p, &readers, &shapes, i)),
            Op::Input { index } => {
                let input = &p.inputs[*index];
                let role = BufferRole::Input { name: input.name.clone(), weight: input.weight, integers: integers[i] };
                Some(Val::At { buf: pl.buffer(&shape, role), layout: Layout::contiguous(&shape) })
            }
            Op::Scalar { value } => {
                let role = BufferRole::Constant { values: vec![*value] };
                Some(Val::At { buf: pl.buffer(&shape, role), layout: Layout::contiguous(&shape) })
            }
            Op::Constant { values, .. } => {
                let role = BufferRole::Constant { values: values.clone() };
                Some(Val::At { buf: pl.buffer(&shape, role), layout: Layout::contiguous(&shape) })
            }
            Op::SplitHeads { x, heads } => Some(pl.relayout(*x, |l| l.split_heads(*heads as usize))),
            Op::MergeHeads { x } => Some(pl.relayout(*x, |l| Some(l.merge_heads()))),
            Op::Interleave { x } => Some(pl.relayout(*x, |l| Some(l.interleave()))),
            Op::Deinterleave { x, pseudo } => Some(pl.relayout(*x, |l| l.deinterleave(*pseudo as usize))),
            Op::UnflattenHeads { x, pseudo } => Some(pl.relayout(*x, |l| l.unflatten_heads(*pseudo as usize))),
            Op::FlattenHeads { x } => Some(pl.relayout(*x, |l| Some(l.flatten_heads()))),
            Op::SliceCols { x, start, len } => Some(pl.relayout(*x, |l| l.slice_cols(*start as usize, *len as usize))),
            Op::Slice { x, axis, at_end, .. } => {
                let (len, whole) = (shape[*axis], shapes[x.0 as usize][*axis]);
                let start = if *at_end { whole - len } else { 0 };
                Some(pl.relayout(*x, |l| l.slice(*axis, start, len)))
            }
            Op::Transpose { x } => Some(pl.relayout(*x, |l| Some(l.transpose()))),
            Op::Unsqueeze { x, axes } => Some(pl.relayout(*x, |l| Some(l.unsqueeze(axes)))),
            _ => None,
        };
        if let Some(val) = val {
            pl.vals.push(val);
            continue;
        }
        let len: usize = shape.iter().product();
        let operands = node.op.operands();
        let sh = |k: usize| shapes[operands[k].0 as usize].clone();
        let mut rope_table: Option<Vec<f64>> = None;
        let mut fused_work: Option<(f64, f64)> = None;
        // Where the launch writes its value: row-major unless a reader's layout is written instead.
        let mut out_shape = shape.clone();
        let mut out_layout = Layout::contiguous(&shape);
        let (spec, mut bindings) = match &node.op {
            Op::Binary { .. } if scale_of(p, i).is_some_and(|(mm, _)| matches!(pl.vals[mm], Val::InEpilogue)) => {
                let (mm, c) = scale_of(p, i).expect("a scaled GEMM");
                let (spec, bindings, gemm) = plan_gemm(&mut pl, p, mm, None, Some(c.to_bits()));
                fused_work = Some((gemm.flops + len as f64, gemm.bytes));
                (spec, bindings)
            }
            Op::Binary { op, a, b } => {
                let (ba, va) = pl.read(*a, |l| Some(l.broadcast(&shape).view()));
                let (bb, vb) = pl.read(*b, |l| Some(l.broadcast(&shape).view()));
                (KernelSpec::Binary { len, op: *op, a: va, b: vb }, vec![ba, bb])
            }
            Op::Unary { op, x } => {
                let (bx, vx) = pl.read(*x, |l| Some(l.view()));
                (KernelSpec::Unary { len, op: *op, x: vx }, vec![bx])
            }
            Op::Where { cond, a, b } => {
                let (bc, vc) = pl.read(*cond, |l| Some(l.broadcast(&shape).view()));
                let (ba, va) = pl.read(*a, |l| Some(l.broadcast(&shape).view()));
                let (bb, vb) = pl.read(*b, |l| Some(l.broadcast(&shape).view()));
                (KernelSpec::Where { len, cond: vc, a: va, b: vb }, vec![bc, ba, bb])
            }
            Op::Thresholds { x, levels } => {
                let spec = KernelSpec::Thresholds { len: sh(0).iter().product(), levels: *levels as usize };
                (spec, vec![pl.contiguous(*x)])
            }
            Op::MatMul { .. } => {
                let (spec, bindings, _) = plan_gemm(&mut pl, p, i, None, None);
                (spec, bindings)
            }
            Op::MixHeads { x, alpha } if matches!(pl.vals[x.0 as usize], Val::InEpilogue) => {
                let (sx, al) = (sh(0), sh(1));
                let Op::SplitHeads { x: y, .. } = p.nodes[x.0 as usize].op else { unreachable!("a fused head split") };
                let mix = MixEpilogue { m: sx[1], h: al[1], p: al[2], s: sx[2], d: sx[3] };
                let (spec, bindings, gemm) = plan_gemm(&mut pl, p, y.0 as usize, Some(mix), None);
                // The product never reaches memory: its write and read are not paid.
                let mixing = op_cost(&node.op, &shape, &[sx.clone(), al.clone()]);
                let saved = 8.0 * sx.iter().product::<usize>() as f64;
                fused_work = Some((gemm.flops + mixing.flops, gemm.bytes + mixing.bytes - saved));
                (spec, [bindings, vec![pl.contiguous(*alpha)]].concat())
            }
            Op::MixHeads { x, alpha } => {
                let (sx, al) = (sh(0), sh(1));
                let (bx, (vx, x_m)) = pl.read(*x, |l| Some((l.view(), l.stride(1)?)));
                let spec =
                    KernelSpec::MixHeads { batch: sx[0], m: sx[1], h: al[1], p: al[2], s: sx[2], d: sx[3], x: vx, x_m };
                (spec, vec![bx, pl.contiguous(*alpha)])
            }
            Op::MixCols { y, alpha } => {
                let (sy, al) = (sh(0), sh(1));
                let cols = *sy.last().unwrap();
                let (by, (vy, y_m)) = pl.read(*y, |l| Some((l.view(), l.block_stride(al[0])?)));
                let rows = sy.iter().product::<usize>() / cols;
                let spec = KernelSpec::MixCols { rows, m: al[0], h: al[1], p: al[2], d: cols / al[0], y: vy, y_m };
                (spec, vec![by, pl.contiguous(*alpha)])
            }
            Op::Collapse { x, r } => {
                let (sx, sr) = (sh(0), sh(1));
                let (bx, (vx, x_c)) = pl.read(*x, |l| {
                    let flat = l.clone().flatten_heads();
                    Some((flat.view(), flat.stride(1)?))
                });
                let spec =
                    KernelSpec::Collapse { batch: sx[0], h: sr[0], c: sx[1] * sx[2], s: sx[3], d: sx[4], x: vx, x_c };
                (spec, vec![bx, pl.contiguous(*r)])
            }
            Op::CollapseCols { y, r } => {
                let (sy, sr) = (sh(0), sh(1));
                let cols = *sy.last().unwrap();
                let (by, (vy, y_c)) = pl.read(*y, |l| Some((l.view(), l.block_stride(sr[1])?)));
                let rows = sy.iter().product::<usize>() / cols;
                let spec = KernelSpec::CollapseCols { rows, h: sr[0], c: sr[1], d: cols / sr[1], y: vy, y_c };
                (spec, vec![by, pl.contiguous(*r)])
            }
            Op::CollapseRows { w, r } => {
                let (sw, sr) = (sh(0), sh(1));
                let spec = KernelSpec::CollapseRows { h: sr[0], c: sr[1], d: sw[0] / sr[0], f: sw[1] };
                (spec, vec![pl.contiguous(*w), pl.contiguous(*r)])
            }
            Op::BlockDiag { r, block } => {
                let sr = sh(0);
                (KernelSpec::BlockDiag { h: sr[0], cols: sr[1], block: *block as usize }, vec![pl.contiguous(*r)])
            }
            Op::ConcatCols { .. } | Op::Concat { .. } => {
                // Along axis k: rows of everything from k on, one after the other.
                let (sa, sb) = (sh(0), sh(1));
                let axis = match node.op {
                    Op::Concat { axis, .. } => axis,
                    _ => sa.len() - 1,
                };
                let rows = sa[..axis].iter().product();
                let (f1, f2) = (sa[axis..].iter().product(), sb[axis..].iter().product());
                let (a, b) = (operands[0], operands[1]);
                (KernelSpec::Concat { rows, f1, f2 }, vec![pl.contiguous(a), pl.contiguous(b)])
            }
            Op::Paged { cache, pages } => {
                let spec = paged::gather(&sh(0), &sh(1), integers[pages.0 as usize]);
                (spec, vec![pl.contiguous(*cache), pl.contiguous(*pages)])
            }
            Op::Rope { x, base, offset } => {
                let sx = sh(0);
                let r = sx.len();
                let (s, d) = (sx[r - 2], sx[r - 1]);
                let offset = offset.eval(&|n| dims.get(n).copied()).expect("sizes are checked when dims are bound");
                // cos and sin per (row, pair) at position offset + row, in float64 on the host.
                let mut table = Vec::with_capacity(s * d);
                for pos in offset..offset + s as u64 {
                    for k in 0..d / 2 {
                        let angle = pos as f64 * base.powf(-2.0 * k as f64 / d as f64);
                        table.extend([angle.cos(), angle.sin()]);
                    }
                }
                rope_table = Some(table);
                let (bx, vx) = pl.read(*x, |l| Some(l.view()));
                (KernelSpec::Rope { rows: len / d, s, d, base_bits: base.to_bits(), x: vx }, vec![bx])
            }
            Op::Attention { q, k, v, mask, scale, fns } => {
                let (sq, sk, sv) = (sh(0), sh(1), sh(2));
                let (bq, vq) = pl.read(*q, Layout::row_view);
                let ((bk, vk), (bv, vv), paged) = paged::keys_values(&mut pl, p, [*k, *v], &integers);
                if let Some((s, w)) = reader_layout(p, &readers, &shapes, i) {
                    (out_shape, out_layout) = (s, w);
                }
                let out = out_layout.row_view().expect("attention writes rows of its output contiguously");
                let shape = attn_shape(&sq, &sk, sv[3], mask, *scale, kernel_fns(fns, &shapes, dims, &integers));
                let spec = match MixTiles::of(fns.as_deref(), &shapes, &sq, &sv) {
                    Some(mix) => {
                        KernelSpec::MixedAttention { shape, mix, q: vq, k: vk, v: vv, out, pass: MixPass::Forward }
                    }
                    None => {
                        let paged_rows = paged.map(|(r, _)| r);
                        KernelSpec::Attention {
                            shape,
                            q: vq,
                            k: vk,
                            v: vv,
                            out,
                            fragments: false,
                            split: 0,
                            kv: None,
                            paged: paged_rows,
                            lse: false,
                        }
                    }
                };
                let mut bindings = vec![bq, bk, bv];
                bindings.extend(fns.iter().flat_map(|f| f.captures.iter()).map(|c| pl.contiguous(*c)));
                bindings.extend(paged.map(|(_, t)| pl.contiguous(t)));
                (spec, bindings)
            }
            Op::Reduce { x, kind, axes, .. } => {
                let sx = sh(0);
                let (bx, (base, inner)) = pl.read(*x, |l| {
                    let (base, inner) = l.reduce_views(axes);
                    (inner.terms.len() <= 1 || l.is_contiguous()).then_some((base, inner))
                });
                let count = axes.iter().map(|&a| sx[a]).product();
                (KernelSpec::Reduce { len, op: *kind, count, base, inner }, vec![bx])
            }
            Op::LooMean { x, axis } => {
                let sx = sh(0);
                let spec = KernelSpec::LooMean { len, n: sx[*axis], stride: row_major_strides(&sx)[*axis] };
                (spec, vec![pl.contiguous(*x)])
            }
            Op::Input { .. }
            | Op::Scalar { .. }
            | Op::Constant { .. }
            | Op::SplitHeads { .. }
            | Op::MergeHeads { .. }
            | Op::Interleave { .. }
            | Op::Deinterleave { .. }
            | Op::UnflattenHeads { .. }
            | Op::FlattenHeads { .. }
            | Op::SliceCols { .. }
            | Op::Slice { .. }
            | Op::Transpose { .. }
            | Op::Unsqueeze { .. } => unreachable!("leaves and layout operations launch nothing"),
            // Gradient operations. Transposes of mixing and collapse are
            // mixing and collapse with the coefficients read the other way.
            Op::MixHeadsT { y, alpha } => {
                let (sy, al) = (sh(0), sh(1));
                let (by, (vy, y_c)) = pl.read(*y, |l| {
                    let flat = l.clone().flatten_heads();
                    Some((flat.view(), flat.stride(1)?))
                });
                let spec = KernelSpec::Collapse {
                    batch: sy[0],
                    h: al[0],
                    c: sy[1] * sy[2],
                    s: sy[3],
                    d: sy[4],
                    x: vy,
                    x_c: y_c,
                };
                (spec, vec![by, pl.contiguous(*alpha)])
            }
            Op::CollapseT { dy, r, pseudo } => {
                let (sd, sr) = (sh(0), sh(1));
                let (bd, (vd, d_m)) = pl.read(*dy, |l| Some((l.view(), l.stride(1)?)));
                let p = *pseudo as usize;
                let spec = KernelSpec::MixHeads {
                    batch: sd[0],
                    m: sr[0],
                    h: sr[1] / p,
                    p,
                    s: sd[2],
                    d: sd[3],
                    x: vd,
                    x_m: d_m,
                };
                (spec, vec![bd, pl.contiguous(*r)])
            }
            Op::MixColsT { dy, alpha } => {
                let (sd, al) = (sh(0), sh(1));
                let (cols, targets) = (*sd.last().unwrap(), al[1] * al[2]);
                let (bd, (vd, d_t)) = pl.read(*dy, |l| Some((l.view(), l.block_stride(targets)?)));
                let rows = sd.iter().product::<usize>() / cols;
                let spec = KernelSpec::CollapseCols { rows, h: al[0], c: targets, d: cols / targets, y: vd, y_c: d_t };
                (spec, vec![bd, pl.contiguous(*alpha)])
            }
            // `aᵀ · b`: the GEMM reading `a`'s columns as its rows.
            Op::MatMulAt { a, b } => {
                let (sa, sb) = (sh(0), sh(1));
                let (kk, f) = (*sa.last().unwrap(), *sb.last().unwrap());
                let rows = sa.iter().product::<usize>().checked_div(kk).unwrap_or(0);
                // `aᵀ` through `a`'s own layout (merged heads, slices): its
                // rows are `a`'s columns and the other way round, no copy.
                let (ba, (a_cols, a_rows)) = pl.read(*a, |l| Some(gemm_a(l)));
                let spec = KernelSpec::MatMul {
                    rows: kk,
                    k: rows,
                    f,
                    a_rows,
                    a_cols,
                    b_row: f,
                    b_offset: 0,
                    mix: None,
                    scale: None,
                };
                (spec, vec![ba, pl.contiguous(*b)])
            }
            // Coefficient gradients: contractions over batch and tokens.
            Op::MixHeadsGrad { x, dy } => {
                let (sx, sd) = (sh(0), sh(1));
                let spec = KernelSpec::Contract { rows: sx[0], o1: sx[1], o2: sd[1] * sd[2], inner: sx[2] * sx[3] };
                (spec, vec![pl.contiguous(*x), pl.contiguous(*dy)])
            }
            Op::CollapseGrad { x, dy } => {
                let (sx, sd) = (sh(0), sh(1));
                let spec = KernelSpec::Contract { rows: sd[0], o1: sd[1], o2: sx[1] * sx[2], inner: sd[2] * sd[3] };
                (spec, vec![pl.contiguous(*dy), pl.contiguous(*x)])
            }
            Op::MixColsGrad { y, dy, m, .. } => {
                let sy = sh(0);
                let cols = *sy.last().unwrap();
                let (o1, o2) = (shape[0], shape[1] * shape[2]);
                let rows = sy.iter().product::<usize>() / cols;
                let spec = KernelSpec::Contract { rows, o1, o2, inner: cols / *m as usize };
                (spec, vec![pl.contiguous(*y), pl.contiguous(*dy)])
            }
            Op::CollapseColsGrad { y, dy, .. } => {
                let sd = sh(1);
                let (o1, o2) = (shape[0], shape[1]);
                let cols = *sd.last().unwrap();
                let rows = sd.iter().product::<usize>() / cols;
                let spec = KernelSpec::Contract { rows, o1, o2, inner: cols / o1 };
                (spec, vec![pl.contiguous(*dy), pl.contiguous(*y)])
            }
            Op::CollapseRowsGrad { w, dy, .. } => {
                let sw = sh(0);
                let (o1, o2) = (shape[0], shape[1]);
                let spec = KernelSpec::Contract { rows: 1, o1, o2, inner: sw[0] / o1 * sw[1] };
                (spec, vec![pl.contiguous(*w), pl.contiguous(*dy)])
            }
            Op::AttentionLse { q, k, mask, scale, fns } => {
                let (sq, sk) = (sh(0), sh(1));
                let (bq, vq) = pl.read(*q, Layout::row_view);
                let (bk, vk) = pl.read(*k, Layout::row_view);
                let shape = attn_shape(&sq, &sk, 0, mask, *scale, kernel_fns(fns, &shapes, dims, &integers));
                let spec = match MixTiles::of(fns.as_deref(), &shapes, &sq, &sk) {
                    Some(mix) => {
                        KernelSpec::MixedAttention { shape, mix, q: vq, k: vk, v: vk, out: vq, pass: MixPass::Lse }
                    }
                    None => KernelSpec::AttentionLse { shape, q: vq, k: vk, tile: grad_key_tile(sq[3], 0), split: 0 },
                };
                let mut bindings = vec![bq, bk];
                bindings.extend(fns.iter().flat_map(|f| f.captures.iter()).map(|c| pl.contiguous(*c)));
                (spec, bindings)
            }
            Op::AttentionDelta { q, k, v, dout, lse, mask, scale, fns } => {
                let shape =
                    attn_shape(&sh(0), &sh(1), sh(2)[3], mask, *scale, kernel_fns(fns, &shapes, dims, &integers));
                pl.mixed_backward(shape, MixPass::Delta, fns, &shapes, [*q, *k, *v, *dout], &[*lse])
            }
            Op::AttentionGrad { q, k, v, o, dout, lse, mask, scale, wrt, fns }
                if MixPass::of(*wrt, fns.as_deref()).is_some() =>
            {
                let shape =
                    attn_shape(&sh(0), &sh(1), sh(2)[3], mask, *scale, kernel_fns(fns, &shapes, dims, &integers));
                let pass = MixPass::of(*wrt, fns.as_deref()).expect("a pass");
                pl.mixed_backward(shape, pass, fns, &shapes, [*q, *k, *v, *dout], &[*lse, *o])
            }
            Op::AttentionGrad { q, k, v, o, dout, lse, mask, scale, wrt, fns } => {
                let (sq, sk, sv) = (sh(0), sh(1), sh(2));
                // dQ, dK or dV in the layout of a head merge that reads it.
                let rows = matches!(wrt, AttnArg::Q | AttnArg::K | AttnArg::V);
                if let Some((s, w)) = reader_layout(p, &readers, &shapes, i).filter(|_| rows) {
                    (out_shape, out_layout) = (s, w);
                }
                let mut views = vec![];
                let mut bindings = vec![];
                for x in [q, k, v, if sh(3).len() == 4 { o } else { dout }, dout] {
                    let (b, view) = pl.read(*x, Layout::row_view);
                    bindings.push(b);
                    views.push(view);
                }
                bindings.push(pl.contiguous(*lse));
                if *wrt == AttnArg::V {
                    // dV reads neither v nor o (wgpu drops unread bindings).
                    bindings.drain(2..4);
                }
                bindings.extend(fns.iter().flat_map(|f| f.captures.iter()).map(|c| pl.contiguous(*c)));
                let spec = KernelSpec::AttentionGrad {
                    shape: attn_shape(&sq, &sk, sv[3], mask, *scale, kernel_fns(fns, &shapes, dims, &integers)),
                    wrt: *wrt,
                    q: views[0],
                    k: views[1],
                    v: views[2],
                    o: views[3],
                    dout: views[4],
                    tile: grad_key_tile(sq[3], sv[3]),
                    split: 0,
                    out: out_layout.row_view().unwrap_or(views[0]),
                    dv: None,
                };
                pl.grad_read(spec, bindings, &mut fused_work)
            }
        };
        if let Some(values) = rope_table {
            let n = values.len();
            bindings.push(pl.buffer(&[n], BufferRole::Constant { values }));
        }
        let out = pl.buffer(&out_shape, BufferRole::Temp);
        bindings.push(out);
        let operand_shapes: Vec<Vec<usize>> = operands.iter().map(|o| shapes[o.0 as usize].clone()).collect();
        let work = op_cost(&node.op, &shape, &operand_shapes);
        let (mut flops, bytes) = fused_work.unwrap_or((work.flops, work.bytes));
        // A mask function's sparsity: the work in the tiles its kernel visits.
        flops *= visited::visited_fraction(&spec);
        pl.launch(spec, bindings, flops, bytes);
        pl.vals.push(Val::At { buf: out, layout: out_layout });
    }
    let outputs: Vec<(String, usize)> = p.outputs.iter().map(|(n, id)| (n.clone(), pl.output(*id))).collect();
    let Planner { buffers, mut launches, vals, .. } = pl;
    let bound =
        |buf: usize| launches.iter().any(|l| l.bindings.contains(&buf)) || outputs.iter().any(|(_, o)| *o == buf);
    let stored = vals.iter().map(|v| matches!(v, Val::At { buf, .. } if bound(*buf))).collect();
    // Weight preparation first (it reads only weights, constants and earlier
    // preparation), then the per-call launches, each in planning order.
    launches.sort_by_key(|l| !l.prepare);
    for (i, l) in launches.iter_mut().enumerate() {
        l.name = launch_name(&p.name, i, &l.spec);
    }
    // Liveness: a temporary dies after its last reader, unless it is an
    // output or prepared (kept for every call).
    let prepared: Vec<usize> = launches.iter().filter(|l| l.prepare).flat_map(|l| l.outputs().to_vec()).collect();
    for b in &buffers {
        if b.role != BufferRole::Temp || outputs.iter().any(|(_, o)| *o == b.id) {
            continue;
        }
        if let Some(last) = launches.iter().rposition(|l| l.bindings.contains(&b.id)) {
            if !launches[last].prepare && prepared.contains(&b.id) {
                continue;
            }
            launches[last].frees.push(b.id);
        }
    }
    Plan { spec: p.name.clone(), dims: dims.clone(), buffers, launches, outputs, dtype: Dtype::F32, stored }
}
