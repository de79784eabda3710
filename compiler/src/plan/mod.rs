//! IR → a plan of kernel launches. The plan is plain data, printable and
//! serialisable without any device: which buffers exist, which kernel each
//! launch runs with which comptime parameters, and which buffers it binds.
//! Every size is concrete: a plan is specialised to the bound dims.

mod attention;
mod backward;
mod contraction;
mod dtype;
mod elementwise;
mod gemm;
mod gemm_tiles;
pub mod group;
mod paged;
mod path;
mod reads;
mod spec;
mod split;
mod tiles;
mod trips;
mod view;
mod visited;

pub use dtype::Dtype;
pub use gemm_tiles::*;
pub use path::{choose as choose_path, AttnPath};
pub use spec::*;
pub use tiles::*;
pub use view::*;

use crate::cost::{op_cost, weight_only};
use crate::ir::{concrete, AttnArg, AttnFns, DimValues, NodeId, Op, OpClass, Program};
use gemm::{addend_of, gemm_a, plan_gemm, read_gemm_b, scale_of};
pub use reads::{Lines, SUM_UNROLL};
use serde::Serialize;
pub use split::{KvSplit, SPLIT_KEYS};
use std::collections::BTreeMap;
use visited::{attn_shape, kernel_fns};
pub use visited::{value_elements, visited_fraction, INTEGER_DIGITS};

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

/// `mix_heads(split_heads(x @ w, m), alpha)` at GEMM node `mm` (a split
/// the mixing epilogue can hold), every other reader of the product or the
/// split after the mixing: the mixing node, whose launch is the GEMM mixing
/// in its epilogue, and whether that GEMM also keeps (stores) the product,
/// because something else reads it (a gradient's coefficient contraction)
/// or it is an output.
fn mixing_gemm(p: &Program, readers: &[Vec<usize>], shapes: &[Vec<usize>], mm: usize) -> Option<(usize, bool)> {
    let Op::MatMul { .. } = p.nodes[mm].op else { return None };
    if shapes[mm].len() != 3 {
        return None;
    }
    let split = readers[mm]
        .iter()
        .copied()
        .find(|&r| matches!(p.nodes[r].op, Op::SplitHeads { heads, .. } if heads as usize <= MixEpilogue::MAX_HEADS))?;
    let mix = readers[split]
        .iter()
        .copied()
        .find(|&r| matches!(p.nodes[r].op, Op::MixHeads { x, .. } if x.0 as usize == split))?;
    let mut others = readers[mm].iter().chain(&readers[split]).filter(|&&r| r != split && r != mix).peekable();
    let is_output = |n: usize| p.outputs.iter().any(|(_, o)| o.0 as usize == n);
    let keep = others.peek().is_some() || is_output(mm) || is_output(split);
    others.all(|&r| r > mix).then_some((mix, keep))
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
    /// Mixing nodes whose GEMM also stores its product, to the buffer given.
    kept: BTreeMap<usize, usize>,
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

/// The node being planned, as an op family's planner sees it, and what the
/// planner may set besides the launch.
struct Site<'a> {
    p: &'a Program,
    i: usize,
    node: &'a crate::ir::Node,
    shape: &'a Vec<usize>,
    shapes: &'a Vec<Vec<usize>>,
    dims: &'a DimValues,
    /// Which nodes are integers only functions and block tables read.
    integers: &'a Vec<bool>,
    readers: &'a Vec<Vec<usize>>,
    /// The output's entries.
    len: usize,
    operands: &'a [NodeId],
    /// Where the launch writes its value: row-major unless a reader's layout is written instead.
    out_shape: Vec<usize>,
    out_layout: Layout,
    /// RoPE's cos/sin table, bound after the operands.
    rope_table: Option<Vec<f64>>,
    /// (flops, bytes) of a launch that does more than its node (a fused epilogue).
    fused_work: Option<(f64, f64)>,
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
        kept: BTreeMap::new(),
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
        let only_reader = |n: usize| match readers[n][..] {
            [r] if !is_output(n) => Some(r),
            _ => None,
        };
        // `mix_heads(split_heads(x @ w, m), alpha)`: one GEMM mixing in its
        // epilogue, which stores the product too where it is read again.
        let mixing = mixing_gemm(p, &readers, &shapes, i);
        // `(x @ w) * c` or `(x @ w) / c` with a constant `c`: one GEMM scaling in its epilogue.
        let scaled_gemm = |n: usize| -> Option<usize> {
            let Op::MatMul { .. } = node.op else { return None };
            only_reader(n).filter(|&r| scale_of(p, r).is_some_and(|(mm, _)| mm == n))
        };
        // `x @ w + y` with `y` of the sum's shape: one GEMM adding `y` in its
        // epilogue (unless the sum belongs to a group kernel).
        let added_gemm = |n: usize| -> Option<usize> {
            let Op::MatMul { .. } = node.op else { return None };
            only_reader(n).filter(|&r| !local[r] && addend_of(p, &shapes, r).is_some_and(|(mm, _)| mm == n))
        };
        if mixing.is_some_and(|(_, keep)| !keep) || scaled_gemm(i).is_some() || added_gemm(i).is_some() {
            pl.vals.push(Val::InEpilogue);
            continue;
        }
        // A kept product gets its buffer now and is written at the mixing's
        // place in the order (its other readers all come after).
        if let Some((mix, true)) = mixing {
            let buf = pl.buffer(&shape, BufferRole::Temp);
            pl.kept.insert(mix, buf);
            pl.vals.push(Val::At { buf, layout: Layout::contiguous(&shape) });
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
        let mut site = Site {
            p,
            i,
            node,
            shape: &shape,
            shapes: &shapes,
            dims,
            integers: &integers,
            readers: &readers,
            len,
            operands: &operands,
            out_shape: shape.clone(),
            out_layout: Layout::contiguous(&shape),
            rope_table: None,
            fused_work: None,
        };
        let (spec, mut bindings) = match node.op.class() {
            OpClass::Elementwise | OpClass::Reduction | OpClass::Gather => elementwise::plan(&mut pl, &mut site),
            OpClass::Contraction => contraction::plan(&mut pl, &mut site),
            OpClass::Attention => attention::plan(&mut pl, &mut site),
            OpClass::Leaf | OpClass::Layout => unreachable!("leaves and layout operations launch nothing"),
        };
        let Site { out_shape, out_layout, rope_table, fused_work, .. } = site;
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
