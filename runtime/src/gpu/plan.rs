//! IR → a plan of kernel launches. The plan is plain data, printable and
//! serialisable without any device: which buffers exist, which kernel each
//! launch runs with which comptime parameters, and which buffers it binds.
//! Every size is concrete: a plan is specialised to the bound dims.

use super::group::{self, GroupStep};
use crate::interp::{concrete, DimValues};
use attnc_compiler::ir::{BinaryOp, Mask, MaskKind, Op, Program, ReduceKind, UnaryOp};
use attnc_compiler::opt::cost::op_cost;
use serde::Serialize;
use std::collections::BTreeMap;

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

    /// numpy broadcasting of `operand` to `out`.
    pub fn broadcast(operand: &[usize], out: &[usize]) -> View {
        let pad = out.len() - operand.len();
        let mut strides = vec![0; out.len()];
        let mut acc = 1;
        for i in (0..operand.len()).rev() {
            strides[pad + i] = if operand[i] == 1 { 0 } else { acc };
            acc *= operand[i];
        }
        View::new(out, &strides, 0)
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
    /// A row-major `[B, h, s, w]` tensor.
    pub fn contiguous(h: usize, s: usize, w: usize) -> RowView {
        RowView { offset: 0, batch: h * s * w, head: s * w, block: 1, outer: w, inner: 0 }
    }

    /// `split_heads` of a `[B, s, h·w]` tensor (and `merge_heads` into one).
    pub fn merged(h: usize, s: usize, w: usize) -> RowView {
        RowView { offset: 0, batch: s * h * w, head: w, block: 1, outer: h * w, inner: 0 }
    }

    /// `interleave` of a `[B, h, p, s, w]` tensor: row `r` is token `r / p`,
    /// pseudo-head `r % p` (and `deinterleave` into one).
    pub fn pseudo(h: usize, p: usize, s: usize, w: usize) -> RowView {
        RowView { offset: 0, batch: h * p * s * w, head: p * s * w, block: p, outer: w, inner: s * w }
    }

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

pub(crate) fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// What one launch computes. Sizes are comptime constants of the kernel.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KernelSpec {
    /// `out[i] = x[view(i)]`: head splits and merges, interleaving, slices.
    Gather { len: usize, x: View },
    /// `out[i] = op(a[va(i)], b[vb(i)])`.
    Binary { len: usize, op: BinaryOp, a: View, b: View },
    /// `out[i] = op(x[i])`.
    Unary { len: usize, op: UnaryOp },
    /// `out[i] = cond[vc(i)] != 0 ? a[va(i)] : b[vb(i)]`.
    Where { len: usize, cond: View, a: View, b: View },
    /// `out[i·(L−1) + t] = x[i] >= t + 2`.
    Thresholds { len: usize, levels: usize },
    /// Tiled `out[rows, f] = a[rows, k] · b[k, f]`.
    MatMul { rows: usize, k: usize, f: usize },
    /// `out[b,h,j,s,e] = Σ_m alpha[m,h,j] · x[b,m,s,e]`.
    MixHeads { batch: usize, m: usize, h: usize, p: usize, s: usize, d: usize },
    /// `out[r, (h·P+j)·d+e] = Σ_m alpha[m,h,j] · y[r, m·d+e]`.
    MixCols { rows: usize, m: usize, h: usize, p: usize, d: usize },
    /// `out[b,h,s,e] = Σ_c r[h,c] · x[b,c,s,e]` (x's heads and pseudo-heads flattened to c).
    Collapse { batch: usize, h: usize, c: usize, s: usize, d: usize },
    /// `out[r, h·d+e] = Σ_c r[h,c] · y[r, c·d+e]`.
    CollapseCols { rows: usize, h: usize, c: usize, d: usize },
    /// `out[c·d+e, f] = Σ_h r[h,c] · w[h·d+e, f]`.
    CollapseRows { h: usize, c: usize, d: usize, f: usize },
    /// `out[h, c] = r[h, c]` if `c / block == h`, else 0.
    BlockDiag { h: usize, cols: usize, block: usize },
    /// `out[r, 0..f1] = a[r], out[r, f1..] = b[r]`.
    Concat { rows: usize, f1: usize, f2: usize },
    /// Rotate-half RoPE at row position `row % s`.
    Rope { rows: usize, s: usize, d: usize, base_bits: u64 },
    /// Flash attention: query tiles against key tiles with an online softmax;
    /// `s` query rows, `sk` key rows (queries aligned to the end of the keys).
    Attention {
        batch: usize,
        h: usize,
        hk: usize,
        s: usize,
        sk: usize,
        d: usize,
        e: usize,
        mask: MaskKind,
        window: Option<usize>,
        block: usize,
        scale_bits: u64,
        /// Layouts of the operands and the output (views of their buffers).
        q: RowView,
        k: RowView,
        v: RowView,
        out: RowView,
    },
    /// `out[o] = reduce_r x[base(o) + inner(r)]` over `count` elements.
    Reduce { len: usize, op: ReduceKind, count: usize, base: View, inner: View },
    /// `out[i] = (Σ_r x[base(i) + r·stride] − x[i]) / (n − 1)`.
    LooMean { len: usize, n: usize, stride: usize },
    /// Group-local work fused into one cube per group (see `group.rs`):
    /// `inputs` bindings, then the output of `len` values; `scratch` f32 of shared memory.
    Group { groups: usize, len: usize, inputs: usize, scratch: usize, steps: Vec<GroupStep> },
}

impl KernelSpec {
    /// Units per cube and cubes for this launch.
    pub fn grid(&self) -> ((u32, u32, u32), (u32, u32, u32)) {
        let linear = |len: usize| ((256, 1, 1), ((len.div_ceil(256)).max(1) as u32, 1, 1));
        match self {
            KernelSpec::MatMul { rows, k, f } => {
                let cols = gemm_cols(*f, line_size(&[*k, *f]));
                let x = (f / line_size(&[*k, *f])).div_ceil(cols);
                ((GEMM_UNITS as u32, 1, 1), (x as u32, rows.div_ceil(GEMM_UNITS * GEMM_ROWS) as u32, 1))
            }
            KernelSpec::Attention { batch, h, s, .. } => {
                let rows = ATTN_ROWS * self.attention_tiles().unit_rows;
                ((ATTN_ROWS as u32, 1, 1), (s.div_ceil(rows) as u32, (batch * h) as u32, 1))
            }
            KernelSpec::Group { groups, .. } => ((GROUP_UNITS as u32, 1, 1), (*groups as u32, 1, 1)),
            other => linear(other.len()),
        }
    }

    /// Number of output elements.
    pub fn len(&self) -> usize {
        match *self {
            KernelSpec::Gather { len, .. }
            | KernelSpec::Binary { len, .. }
            | KernelSpec::Unary { len, .. }
            | KernelSpec::Where { len, .. }
            | KernelSpec::Reduce { len, .. }
            | KernelSpec::LooMean { len, .. }
            | KernelSpec::Group { len, .. } => len,
            KernelSpec::Thresholds { len, levels } => len * (levels - 1),
            KernelSpec::MatMul { rows, f, .. } => rows * f,
            KernelSpec::MixHeads { batch, h, p, s, d, .. } => batch * h * p * s * d,
            KernelSpec::MixCols { rows, h, p, d, .. } => rows * h * p * d,
            KernelSpec::Collapse { batch, h, s, d, .. } => batch * h * s * d,
            KernelSpec::CollapseCols { rows, h, d, .. } => rows * h * d,
            KernelSpec::CollapseRows { c, d, f, .. } => c * d * f,
            KernelSpec::BlockDiag { h, cols, .. } => h * cols,
            KernelSpec::Concat { rows, f1, f2 } => rows * (f1 + f2),
            KernelSpec::Rope { rows, d, .. } => rows * d / 2,
            KernelSpec::Attention { batch, h, s, e, .. } => batch * h * s * e,
        }
    }

    /// Register-blocked kernels (`attention.rs`, `gemm.rs`): their buffers are
    /// vectors of [`KernelSpec::line_size`] floats, every read clamped and
    /// every write guarded by construction.
    pub fn vectorised(&self) -> bool {
        matches!(self, KernelSpec::MatMul { .. } | KernelSpec::Attention { .. })
    }

    /// The tiling of an attention launch (any other launch: a single unit row
    /// and key tile, unused).
    pub fn attention_tiles(&self) -> AttnTiles {
        match *self {
            KernelSpec::Attention { s, sk, d, e, mask, window, block, .. } => {
                let l = line_size(&[d, e]);
                AttnTiles::new(
                    d / l,
                    e / l,
                    s,
                    sk,
                    mask != MaskKind::None || window.is_some(),
                    window.unwrap_or(0) * block,
                )
            }
            _ => AttnTiles { unit_rows: 1, key_tile: 1 },
        }
    }

    /// The vector width (floats) of the kernel's loads and stores.
    pub fn line_size(&self) -> usize {
        match *self {
            KernelSpec::MatMul { k, f, .. } => line_size(&[k, f]),
            KernelSpec::Attention { d, e, .. } => line_size(&[d, e]),
            _ => 1,
        }
    }

    /// The most loop iterations one unit runs (every loop, nested ones
    /// multiplied), for drivers that bound them ([`LOOP_TRIPS_CPU`]).
    pub fn loop_trips(&self) -> usize {
        match *self {
            KernelSpec::MatMul { k, f, .. } => k / line_size(&[k, f]),
            KernelSpec::Attention { sk, .. } => 2 * sk.div_ceil(self.attention_tiles().key_tile) + 2,
            KernelSpec::MixHeads { m, .. } => m,
            KernelSpec::MixCols { m, .. } => m,
            KernelSpec::Collapse { c, .. } | KernelSpec::CollapseCols { c, .. } => c,
            KernelSpec::CollapseRows { h, .. } => h,
            KernelSpec::Reduce { op, count, .. } => {
                if matches!(op, ReduceKind::Var { .. }) {
                    2 * count
                } else {
                    count
                }
            }
            KernelSpec::LooMean { n, .. } => n,
            KernelSpec::Group { ref steps, .. } => group::loop_trips(steps),
            _ => 1,
        }
    }

    /// A short name for the kernel kind (`matmul`, `attention`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            KernelSpec::Gather { .. } => "gather",
            KernelSpec::Binary { .. } => "binary",
            KernelSpec::Unary { .. } => "unary",
            KernelSpec::Where { .. } => "where",
            KernelSpec::Thresholds { .. } => "thresholds",
            KernelSpec::MatMul { .. } => "matmul",
            KernelSpec::MixHeads { .. } => "mix_heads",
            KernelSpec::MixCols { .. } => "mix_cols",
            KernelSpec::Collapse { .. } => "collapse",
            KernelSpec::CollapseCols { .. } => "collapse_cols",
            KernelSpec::CollapseRows { .. } => "collapse_rows",
            KernelSpec::BlockDiag { .. } => "block_diag",
            KernelSpec::Concat { .. } => "concat",
            KernelSpec::Rope { .. } => "rope",
            KernelSpec::Attention { .. } => "attention",
            KernelSpec::Reduce { .. } => "reduce",
            KernelSpec::LooMean { .. } => "loo_mean",
            KernelSpec::Group { .. } => "group",
        }
    }
}

/// Units per GEMM cube; each owns [`GEMM_ROWS`] rows of the output.
pub const GEMM_UNITS: usize = 64;
pub const GEMM_ROWS: usize = 4;
/// Output columns (floats) per GEMM cube, at most.
pub const GEMM_COLS: usize = 32;
/// Units per attention cube; each owns `AttnTiles::unit_rows` query rows.
pub const ATTN_ROWS: usize = 64;
/// Loop iterations one unit may run on Mesa's CPU drivers (llvmpipe,
/// lavapipe): they count every loop back-edge of an invocation against one
/// limit of 65 535 and, past it, leave every loop silently. Kernels unroll
/// their inner loops so that only tiles and steps count (see [`KernelSpec::loop_trips`]).
pub const LOOP_TRIPS_CPU: usize = 65_000;

/// The widest vector (4, 2 or 1 floats) dividing every length in `ns`.
pub fn line_size(ns: &[usize]) -> usize {
    [4, 2, 1].into_iter().find(|l| ns.iter().all(|n| n % l == 0)).unwrap_or(1)
}

/// Column vectors per GEMM cube for `f` output columns in vectors of `lanes`.
pub fn gemm_cols(f: usize, lanes: usize) -> usize {
    (GEMM_COLS / lanes).min(f / lanes).max(1)
}

/// How an attention launch is tiled: query rows per unit and key rows per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnTiles {
    /// Query rows each unit owns; a cube owns `ATTN_ROWS · unit_rows`.
    pub unit_rows: usize,
    /// Key rows per tile (one softmax rescale each).
    pub key_tile: usize,
}

impl AttnTiles {
    /// Tiles for `dl` query and `el` value vectors a row, `s` queries over
    /// `sk` keys, `masked` when some key tiles are partly visible and
    /// `window_rows` the rows a window spans (0: none).
    ///
    /// Every key and value row a plane loads serves all `unit_rows` rows of
    /// a unit, so more rows per unit amortise the loads, broadcasts and
    /// tile bookkeeping; the registers held (`unit_rows · (dl + el)`
    /// vectors) and the unrolled tile (`unit_rows · key_tile · (dl + el)`
    /// vector operations) are bounded, and under a mask or window a cube
    /// spans at most a quarter of the queries or the window, so that few of
    /// the pairs it computes are masked.
    pub fn new(dl: usize, el: usize, s: usize, sk: usize, masked: bool, window_rows: usize) -> AttnTiles {
        let width = (dl + el).max(1);
        let pow2_floor = |x: usize| 1usize << x.max(1).ilog2();
        let mut rows = pow2_floor((256 / width).clamp(1, 8)).min(pow2_floor(s.div_ceil(ATTN_ROWS)));
        if masked {
            rows = rows.min(pow2_floor(s / (4 * ATTN_ROWS)));
        }
        if window_rows > 0 {
            rows = rows.min(pow2_floor(window_rows / ATTN_ROWS));
        }
        let key_tile = pow2_floor((2048 / (rows * width)).clamp(4, 32)).min(sk.next_power_of_two().max(4));
        AttnTiles { unit_rows: rows, key_tile }
    }
}

/// Units per group-kernel cube (`kernels::unit_element` strides by it).
pub const GROUP_UNITS: usize = 256;

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum BufferRole {
    /// Uploaded from the input tensor of this name.
    Input { name: String },
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
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub spec: String,
    pub dims: DimValues,
    pub buffers: Vec<Buffer>,
    pub launches: Vec<Launch>,
    pub outputs: Vec<(String, usize)>,
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

/// Plan `p` at the concrete `dims`.
pub fn plan(p: &Program, dims: &DimValues) -> Plan {
    let shapes: Vec<Vec<usize>> = p.nodes.iter().map(|n| concrete(&n.shape, dims)).collect();
    let mut buffers: Vec<Buffer> = vec![];
    let mut launches: Vec<Launch> = vec![];
    let mut node_buf: Vec<usize> = Vec::with_capacity(p.nodes.len());
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
    // Layout operations attention reads or writes in place (see `RowView`).
    let readers = readers(p);
    let is_output = |n: usize| p.outputs.iter().any(|(_, o)| o.0 as usize == n);
    let attention_only = |n: usize| {
        !is_output(n)
            && !readers[n].is_empty()
            && readers[n].iter().all(|&r| matches!(p.nodes[r].op, Op::Attention { .. }))
    };
    let mut read_views: BTreeMap<usize, (usize, RowView)> = BTreeMap::new();
    let mut written_by: BTreeMap<usize, usize> = BTreeMap::new();
    for (i, node) in p.nodes.iter().enumerate() {
        if let Some(&writer) = written_by.get(&i) {
            node_buf.push(node_buf[writer]); // the attention launch wrote this layout
            continue;
        }
        if shapes[i].len() == 4 && attention_only(i) {
            let view = match node.op {
                Op::SplitHeads { x, .. } if shapes[x.0 as usize].len() == 3 => {
                    let [_, h, s, w] = shapes[i][..] else { unreachable!() };
                    Some((x.0 as usize, RowView::merged(h, s, w)))
                }
                Op::Interleave { x } => {
                    let [_, h, pp, s, w] = shapes[x.0 as usize][..] else { unreachable!() };
                    Some((x.0 as usize, RowView::pseudo(h, pp, s, w)))
                }
                _ => None,
            };
            if let Some((src, view)) = view {
                if node_buf[src] != usize::MAX {
                    read_views.insert(i, (node_buf[src], view));
                    node_buf.push(usize::MAX); // read in place by the attention launches
                    continue;
                }
            }
        }
        if let Some(k) = fused.remove(&i) {
            let mut bindings: Vec<usize> = k.inputs.iter().map(|&n| node_buf[n]).collect();
            let out = push_buffer(&mut buffers, &shapes[i], BufferRole::Temp);
            bindings.push(out);
            node_buf.push(out);
            let name = format!("attnc_{}_{:02}_{}", p.name, launches.len(), k.spec.kind());
            launches.push(Launch { name, spec: k.spec, bindings, frees: vec![], flops: k.flops, bytes: k.bytes });
            continue;
        }
        if local[i] && !generic[i] {
            node_buf.push(usize::MAX); // computed inside the group kernels that read it
            continue;
        }
        let shape = shapes[i].clone();
        let len: usize = shape.iter().product();
        let operands = node.op.operands();
        let mut rope_table: Option<Vec<f64>> = None;
        let mut bindings_override: Option<Vec<usize>> = None;
        let mut out_shape: Option<Vec<usize>> = None;
        let sh = |k: usize| shapes[operands[k].0 as usize].clone();
        let spec = match &node.op {
            Op::Input { index } => {
                node_buf.push(push_buffer(
                    &mut buffers,
                    &shape,
                    BufferRole::Input { name: p.inputs[*index].name.clone() },
                ));
                continue;
            }
            Op::Scalar { value } => {
                node_buf.push(push_buffer(&mut buffers, &shape, BufferRole::Constant { values: vec![*value] }));
                continue;
            }
            Op::Constant { values } => {
                node_buf.push(push_buffer(&mut buffers, &shape, BufferRole::Constant { values: values.clone() }));
                continue;
            }
            // Same row-major data: the output aliases the operand.
            Op::UnflattenHeads { x, .. } | Op::FlattenHeads { x } => {
                node_buf.push(node_buf[x.0 as usize]);
                continue;
            }
            Op::SplitHeads { heads, .. } => {
                let x = sh(0);
                let r = x.len();
                let (s, w) = (x[r - 2], x[r - 1]);
                let (h, d) = (*heads as usize, w / *heads as usize);
                let pre: usize = x[..r - 2].iter().product();
                KernelSpec::Gather { len, x: View::new(&[pre, h, s, d], &[s * w, d, w, 1], 0) }
            }
            Op::MergeHeads { .. } => {
                let x = sh(0);
                let r = x.len();
                let (h, s, d) = (x[r - 3], x[r - 2], x[r - 1]);
                let pre: usize = x[..r - 3].iter().product();
                KernelSpec::Gather { len, x: View::new(&[pre, s, h, d], &[h * s * d, d, s * d, 1], 0) }
            }
            Op::Interleave { .. } => {
                let [b, h, pp, s, d] = sh(0)[..] else { unreachable!() };
                KernelSpec::Gather {
                    len,
                    x: View::new(&[b, h, s, pp, d], &[h * pp * s * d, pp * s * d, d, s * d, 1], 0),
                }
            }
            Op::Deinterleave { pseudo, .. } => {
                let [b, h, sp, d] = sh(0)[..] else { unreachable!() };
                let pp = *pseudo as usize;
                let s = sp / pp;
                KernelSpec::Gather { len, x: View::new(&[b, h, pp, s, d], &[h * sp * d, sp * d, d, pp * d, 1], 0) }
            }
            Op::SliceCols { start, len: n, .. } => {
                let x = sh(0);
                let f = *x.last().unwrap();
                let rows = x.iter().product::<usize>() / f;
                KernelSpec::Gather { len, x: View::new(&[rows, *n as usize], &[f, 1], *start as usize) }
            }
            Op::Binary { op, .. } => KernelSpec::Binary {
                len,
                op: *op,
                a: View::broadcast(&sh(0), &shape),
                b: View::broadcast(&sh(1), &shape),
            },
            Op::Unary { op, .. } => KernelSpec::Unary { len, op: *op },
            Op::Where { .. } => KernelSpec::Where {
                len,
                cond: View::broadcast(&sh(0), &shape),
                a: View::broadcast(&sh(1), &shape),
                b: View::broadcast(&sh(2), &shape),
            },
            Op::Thresholds { levels, .. } => {
                KernelSpec::Thresholds { len: sh(0).iter().product(), levels: *levels as usize }
            }
            Op::MatMul { .. } => {
                let (a, b) = (sh(0), sh(1));
                let k = *a.last().unwrap();
                KernelSpec::MatMul { rows: a.iter().product::<usize>() / k, k, f: b[1] }
            }
            Op::MixHeads { .. } => {
                let (x, al) = (sh(0), sh(1));
                KernelSpec::MixHeads { batch: x[0], m: x[1], h: al[1], p: al[2], s: x[2], d: x[3] }
            }
            Op::MixCols { .. } => {
                let (y, al) = (sh(0), sh(1));
                let cols = *y.last().unwrap();
                KernelSpec::MixCols {
                    rows: y.iter().product::<usize>() / cols,
                    m: al[0],
                    h: al[1],
                    p: al[2],
                    d: cols / al[0],
                }
            }
            Op::Collapse { .. } => {
                let (x, r) = (sh(0), sh(1));
                KernelSpec::Collapse { batch: x[0], h: r[0], c: x[1] * x[2], s: x[3], d: x[4] }
            }
            Op::CollapseCols { .. } => {
                let (y, r) = (sh(0), sh(1));
                let cols = *y.last().unwrap();
                KernelSpec::CollapseCols { rows: y.iter().product::<usize>() / cols, h: r[0], c: r[1], d: cols / r[1] }
            }
            Op::CollapseRows { .. } => {
                let (w, r) = (sh(0), sh(1));
                KernelSpec::CollapseRows { h: r[0], c: r[1], d: w[0] / r[0], f: w[1] }
            }
            Op::BlockDiag { block, .. } => {
                let r = sh(0);
                KernelSpec::BlockDiag { h: r[0], cols: r[1], block: *block as usize }
            }
            Op::ConcatCols { .. } => {
                let (a, b) = (sh(0), sh(1));
                KernelSpec::Concat { rows: a[0], f1: a[1], f2: b[1] }
            }
            Op::Rope { base, .. } => {
                let x = sh(0);
                let r = x.len();
                let (s, d) = (x[r - 2], x[r - 1]);
                // cos and sin per (position, pair), in float64 on the host.
                let mut table = Vec::with_capacity(s * d);
                for pos in 0..s {
                    for k in 0..d / 2 {
                        let angle = pos as f64 * base.powf(-2.0 * k as f64 / d as f64);
                        table.extend([angle.cos(), angle.sin()]);
                    }
                }
                rope_table = Some(table);
                KernelSpec::Rope { rows: len / d, s, d, base_bits: base.to_bits() }
            }
            Op::Attention { mask, scale, .. } => {
                let (q, k, v) = (sh(0), sh(1), sh(2));
                let Mask { kind, window, block } = *mask;
                let view = |n: usize, shape: &[usize]| match read_views.get(&(operands[n].0 as usize)) {
                    Some(&(buf, view)) => (buf, view),
                    None => (node_buf[operands[n].0 as usize], RowView::contiguous(shape[1], shape[2], shape[3])),
                };
                let views = [view(0, &q), view(1, &k), view(2, &v)];
                bindings_override = Some(views.iter().map(|(b, _)| *b).collect());
                // One reader that merges heads or deinterleaves: write its layout.
                let mut out = RowView::contiguous(q[1], q[2], v[3]);
                if let [c] = readers[i][..] {
                    let written = match p.nodes[c].op {
                        Op::MergeHeads { .. } if shapes[c].len() == 3 => Some(RowView::merged(q[1], q[2], v[3])),
                        Op::Deinterleave { pseudo, .. } => {
                            let pp = pseudo as usize;
                            Some(RowView::pseudo(q[1], pp, q[2] / pp, v[3]))
                        }
                        _ => None,
                    };
                    if let Some(w) = written.filter(|_| !is_output(i)) {
                        out = w;
                        out_shape = Some(shapes[c].clone());
                        written_by.insert(c, i);
                    }
                }
                KernelSpec::Attention {
                    batch: q[0],
                    h: q[1],
                    hk: k[1],
                    s: q[2],
                    sk: k[2],
                    d: q[3],
                    e: v[3],
                    mask: kind,
                    window: window.map(|w| w as usize),
                    block: block as usize,
                    scale_bits: scale.to_bits(),
                    q: views[0].1,
                    k: views[1].1,
                    v: views[2].1,
                    out,
                }
            }
            Op::Reduce { kind, axes, .. } => {
                let x = sh(0);
                let (base, inner) = reduce_views(&x, axes, 0);
                let count = axes.iter().map(|&a| x[a]).product();
                KernelSpec::Reduce { len, op: *kind, count, base, inner }
            }
            Op::LooMean { axis, .. } => {
                let x = sh(0);
                KernelSpec::LooMean { len, n: x[*axis], stride: row_major_strides(&x)[*axis] }
            }
        };
        let mut bindings: Vec<usize> =
            bindings_override.unwrap_or_else(|| operands.iter().map(|o| node_buf[o.0 as usize]).collect());
        if let Some(values) = rope_table {
            let n = values.len();
            bindings.push(push_buffer(&mut buffers, &[n], BufferRole::Constant { values }));
        }
        let out = push_buffer(&mut buffers, out_shape.as_ref().unwrap_or(&shape), BufferRole::Temp);
        bindings.push(out);
        node_buf.push(out);
        let name = format!("attnc_{}_{:02}_{}", p.name, launches.len(), spec.kind());
        let operand_shapes: Vec<Vec<usize>> = operands.iter().map(|o| shapes[o.0 as usize].clone()).collect();
        let work = op_cost(&node.op, &shape, &operand_shapes);
        launches.push(Launch { name, spec, bindings, frees: vec![], flops: work.flops, bytes: work.bytes });
    }
    let outputs: Vec<(String, usize)> = p.outputs.iter().map(|(n, id)| (n.clone(), node_buf[id.0 as usize])).collect();
    // Liveness: a temporary dies after its last reader, unless it is an output.
    for b in &buffers {
        if b.role != BufferRole::Temp || outputs.iter().any(|(_, o)| *o == b.id) {
            continue;
        }
        if let Some(last) = launches.iter().rposition(|l| l.bindings.contains(&b.id)) {
            launches[last].frees.push(b.id);
        }
    }
    Plan { spec: p.name.clone(), dims: dims.clone(), buffers, launches, outputs }
}
