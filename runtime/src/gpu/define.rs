//! Kernels built at run time: one `CubeKernel` type whose `define` turns a
//! plan's [`KernelSpec`] into cubecl IR by calling the `#[cube]` bodies'
//! `expand` functions. Entry points carry the plan's names, so emitted source
//! is the same in debug and release builds.

use super::device::{elem_type, fragment_type, matrix_units, plane_width, stages_gemm, Mma};
use super::func::{self, Fns, Hook};
use super::kernels::{self as k, Stored};
use super::kit::launch::{Dims, Inputs, Paged, Shape, Split};
use super::kit::norm::{self, Norm};
use super::kit::source;
use super::{
    attention_grad, attention_grad_read, attention_split, attention_tiled, attention_tiled_grad, gemm, mixed_launch,
    mma,
};
use crate::gpu::kernels::Vecs;
use attnc_compiler::ir::{AttnArg, BinaryOp, ReduceKind};
use attnc_compiler::plan::group::{GroupStep, MapOp};
use attnc_compiler::plan::{
    value_elements, AttnPath, AttnShape, Dtype, GemmB, KernelSpec, Lines, RowView, GROUP_UNITS,
};
use cubecl::prelude::*;
use std::sync::Arc;

pub struct IrKernel {
    pub name: String,
    pub spec: KernelSpec,
    /// What the kernel's buffers store.
    pub dtype: Dtype,
    /// Units of a plane that share loaded rows by broadcasts (1: none).
    pub plane: u32,
    /// Whether the GEMM stages its tiles in shared memory (see `gemm.rs`);
    /// without, and with planes, head mixing's forward takes its CPU kernel.
    pub staged: bool,
    /// Whether the GEMM and attention multiply matrix fragments (see `mma.rs`).
    pub mma: Mma,
    pub settings: KernelSettings,
    pub props: Arc<DeviceProperties>,
    pub target: Arc<TargetProperties>,
}

impl IrKernel {
    pub fn new(
        name: &str,
        spec: &KernelSpec,
        dtype: Dtype,
        props: Arc<DeviceProperties>,
        target: Arc<TargetProperties>,
    ) -> IrKernel {
        let ((x, y, z), _) = spec.grid();
        let settings = KernelSettings::new(CubeDim::new_3d(x, y, z).into(), ExecutionMode::Checked, AddressType::U32)
            .kernel_name(name);
        let plane = plane_width(&props);
        let staged = stages_gemm(&props);
        let mma = if matrix_units(&props, dtype) && spec.fragments() { Mma::Hardware } else { Mma::Off };
        IrKernel { name: name.to_string(), spec: spec.clone(), dtype, plane, staged, mma, settings, props, target }
            .with_mode()
    }

    /// Kernels binding vectors run unchecked: they clamp every index.
    fn with_mode(mut self) -> IrKernel {
        let vectors = self.vector_lines().is_some();
        self.settings.execution_mode = if vectors { ExecutionMode::Unchecked } else { ExecutionMode::Checked };
        self
    }

    /// The line size of the kernel's vector bindings, if it binds vectors:
    /// GEMM and attention (`KernelSpec::vectorised`), and head mixing on
    /// the CPU drivers' kernel (`mixed_launch::cpu_lines`).
    pub fn vector_lines(&self) -> Option<usize> {
        if self.spec.vectorised() {
            return Some(self.spec.line_size());
        }
        self.mixes_on_cpu().then(|| mixed_launch::cpu_lines(&self.spec))
    }

    /// Whether this is head mixing's forward or log-sum-exp on the CPU
    /// drivers' kernel here (`mixed_launch::on_cpu`).
    fn mixes_on_cpu(&self) -> bool {
        mixed_launch::on_cpu(&self.spec, self.staged, self.plane)
    }

    /// Whether binding `slot` holds scalars in a kernel that binds vectors.
    pub fn scalar_binding(&self, slot: usize) -> bool {
        match self.spec {
            KernelSpec::MixedAttention { pass, .. } if self.mixes_on_cpu() => {
                mixed_launch::cpu_scalar_binding(pass, slot, self.operand_count())
            }
            _ => self.spec.scalar_binding(slot),
        }
    }

    /// The same kernel multiplying fragments in software (where the spec
    /// allows fragments; see `mma.rs`), or as the device chooses (`false`).
    pub fn with_software_fragments(mut self, on: bool) -> IrKernel {
        if on && self.spec.fragments() {
            self.mma = Mma::Software;
        } else if on {
            self.mma = Mma::Off;
        }
        self
    }

    /// The same kernel with the GEMM staged in shared memory or not.
    pub fn with_staging(mut self, staged: bool) -> IrKernel {
        self.staged = staged;
        self.with_mode()
    }

    /// The same kernel tiled for the kernel the device takes: head mixing
    /// on the CPU drivers' kernel covers more query rows a cube
    /// (`MixTiles::on_cpu_planes`), which the grid follows.
    pub fn for_device(mut self) -> IrKernel {
        if self.mixes_on_cpu() {
            self.spec = mixed_launch::cpu_tiling(&self.spec, self.plane);
        }
        self
    }

    /// The same kernel sharing rows over planes of `plane` units instead.
    pub fn with_plane(mut self, plane: u32) -> IrKernel {
        self.plane = plane.max(1);
        self.with_mode()
    }

    /// Buffers this kernel binds before its output.
    pub fn operand_count(&self) -> usize {
        match self.spec {
            KernelSpec::Gather { .. } | KernelSpec::Unary { .. } | KernelSpec::Thresholds { .. } => 1,
            KernelSpec::Reduce { .. } | KernelSpec::LooMean { .. } | KernelSpec::BlockDiag { .. } => 1,
            KernelSpec::Attention { ref shape, paged, lse, .. } => {
                3 + captures(shape) + usize::from(paged.is_some()) + usize::from(lse)
            }
            KernelSpec::Where { .. } => 3,
            KernelSpec::MatMul { mix: Some(m), .. } if m.keep => 4,
            KernelSpec::MatMul { mix: Some(_), .. } | KernelSpec::MatMul { add: true, .. } => 3,
            KernelSpec::Group { inputs, .. } => inputs,
            KernelSpec::AttentionGrad { wrt: AttnArg::V, ref shape, .. } => 4 + captures(shape),
            KernelSpec::AttentionGrad { ref shape, dv, .. } => 6 + captures(shape) + usize::from(dv.is_some()),
            KernelSpec::AttentionLse { ref shape, .. } => 2 + captures(shape),
            KernelSpec::AttentionReadLines { ref shape, .. } => 6 + captures(shape),
            KernelSpec::AttentionReadSum { ref shape, .. } => 1 + captures(shape),
            KernelSpec::MixedAttention { ref shape, pass, .. } => pass.operands() + captures(shape),
            KernelSpec::Binary { .. }
            | KernelSpec::Contract { .. }
            | KernelSpec::MatMul { .. }
            | KernelSpec::MixHeads { .. }
            | KernelSpec::MixCols { .. }
            | KernelSpec::Collapse { .. }
            | KernelSpec::CollapseCols { .. }
            | KernelSpec::CollapseRows { .. }
            | KernelSpec::Concat { .. }
            | KernelSpec::Paged { .. }
            | KernelSpec::Rope { .. } => 2,
            KernelSpec::Combine { sink, .. } => 1 + usize::from(sink),
            KernelSpec::SinkGrad { .. } => 4,
        }
    }
}

impl KernelMetadata for IrKernel {
    fn id(&self) -> KernelId {
        KernelId::new::<Self>()
            .address_type(self.settings.address_type)
            .cube_dim(self.settings.cube_dim)
            .mode(self.settings.execution_mode)
            .info(format!("{}:{}:{}:{}:{:?}:{:?}", self.name, self.dtype, self.plane, self.staged, self.mma, self.spec))
    }

    fn address_type(&self) -> ElemType {
        self.settings.address_type.unsigned_type()
    }
}

/// How many tensors attention's functions read.
fn captures(shape: &AttnShape) -> usize {
    shape.fns.as_ref().map_or(0, |f| f.captures.len())
}

/// Attention's functions over the capture buffers `caps` (bound after the launch's operands).
fn hook(shape: &AttnShape, caps: &[NativeExpand<[Stored]>], dtype: Dtype) -> Hook {
    Hook(shape.fns.as_ref().map(|f| std::rc::Rc::new(func::fns_of(f, caps, dtype))))
}

fn reduce_code(op: ReduceKind) -> u32 {
    match op {
        ReduceKind::Sum => k::RED_SUM,
        ReduceKind::Mean => k::RED_MEAN,
        ReduceKind::Max => k::RED_MAX,
        ReduceKind::Min => k::RED_MIN,
        ReduceKind::Count => k::RED_COUNT,
        ReduceKind::Var { bessel: false } => k::RED_VAR,
        ReduceKind::Var { bessel: true } => k::RED_VAR_BESSEL,
    }
}

impl CubeKernel for IrKernel {
    fn define(&self) -> KernelDefinition {
        let mut builder = KernelBuilder::new(self.settings.clone());
        builder.runtime_properties(self.target.as_ref().clone());
        builder.device_properties(&self.props);
        builder.scope.register_type::<Stored>(elem_type(self.dtype));
        builder.scope.register_type::<k::Operand>(fragment_type(self.dtype));
        if let Some(lines) = self.vector_lines() {
            match lines {
                4 => self.define_vectorized::<Const<4>>(&mut builder),
                2 => self.define_vectorized::<Const<2>>(&mut builder),
                _ => self.define_vectorized::<Const<1>>(&mut builder),
            }
            return builder.build();
        }
        let arg = BufferCompilationArg { inplace: None };
        let mut bufs: Vec<NativeExpand<[Stored]>> =
            (0..=self.operand_count()).map(|_| <[Stored] as LaunchArg>::expand(&arg, &mut builder)).collect();
        let out = bufs.pop().expect("an output buffer");
        let scope: &Scope = &builder.scope;
        let nonempty = k::has_elements::expand(scope, &out);
        if_expand(scope, nonempty, |scope| in_grid(scope, &self.spec, |scope| self.body(scope, &bufs, out)));
        builder.build()
    }
}

impl IrKernel {
    /// GEMM and attention: buffers of vectors of `N` floats.
    fn define_vectorized<N: Size>(&self, builder: &mut KernelBuilder) {
        let arg = BufferCompilationArg { inplace: None };
        let mut bufs: Vec<Vecs<N>> = vec![];
        let mut scalars: Vec<NativeExpand<[Stored]>> = vec![];
        for slot in 0..=self.operand_count() {
            if self.scalar_binding(slot) {
                scalars.push(<[Stored] as LaunchArg>::expand(&arg, builder));
            } else {
                bufs.push(<[Vector<Stored, N>] as LaunchArg>::expand(&arg, builder));
            }
        }
        let scale = match self.spec {
            KernelSpec::Attention { .. } => Some(<f32 as LaunchArg>::expand(&(), builder)),
            _ => None,
        };
        let scope: &Scope = &builder.scope;
        let lanes = self.vector_lines().unwrap_or(1);
        // A log-sum-exp's output is a scalar binding (the last).
        let mut out = if self.scalar_binding(self.operand_count()) {
            bufs[0].clone_unchecked()
        } else {
            bufs.pop().expect("an output buffer")
        };
        let nonempty = k::has_vectors::expand::<N>(scope, &out);
        if_expand(scope, nonempty, |scope| {
            in_grid(scope, &self.spec, |scope| match self.spec {
                KernelSpec::MatMul {
                    rows,
                    k: kk,
                    f,
                    ref a_rows,
                    ref a_cols,
                    ref b_rows,
                    ref b_cols,
                    mix,
                    scale,
                    add,
                } => {
                    let shape = gemm::Shape {
                        rows,
                        kdim: kk,
                        f,
                        a_rows: a_rows.scaled_down(lanes),
                        a_cols: a_cols.in_vectors(lanes).expect("the line size divides the GEMM's columns"),
                        b: GemmB::of(b_rows, b_cols, lanes).expect("the line size reads b in vectors"),
                        mix: mix.map(|m| (m, scalars.pop().expect("the mixing coefficients"))),
                        scale: scale.map(|bits| f64::from_bits(bits) as f32),
                        fold: self.spec.fold_x(),
                    };
                    // The side buffer, bound after `b`: `x @ w + y`'s addend, or where a
                    // mixing epilogue keeps the product.
                    let side = (add || mix.is_some_and(|m| m.keep)).then(|| &bufs[2]);
                    let x = gemm::Operands { a: &bufs[0], b: &bufs[1], side, out: &mut out };
                    if self.mma != Mma::Off {
                        let hardware = self.mma == Mma::Hardware;
                        mma::build_gemm::<N>(scope, x, &shape, lanes, (hardware, self.dtype))
                    } else if self.staged {
                        gemm::build_staged::<N>(scope, x, &shape, lanes)
                    } else {
                        gemm::build::<N>(scope, x, &shape, lanes, self.plane)
                    }
                }
                KernelSpec::AttentionGrad {
                    shape: ref sh, wrt, q, k: kv, v, o, dout, out: grad, dv: dv_view, ..
                } => {
                    // On the forward's tiling: the log-sum-exp and the captures are the scalar bindings;
                    // dV binds q, k, dout (its `v` and `o` are not read).
                    let fns = sh.fns.as_ref().map(|f| func::fns_of(f, &scalars[1..], self.dtype));
                    let shape = self.attention_shape(sh, [q, kv, v, grad], lanes, fns);
                    let dv = wrt == AttnArg::V;
                    let b = attention_tiled_grad::GradBuffers {
                        q: &bufs[0],
                        k: &bufs[1],
                        v: &bufs[if dv { 0 } else { 2 }],
                        o: &bufs[if dv { 0 } else { 3 }],
                        dout: &bufs[if dv { 2 } else { 4 }],
                        lse: &scalars[0],
                        side: [o, dout].map(|view| view.in_vectors(lanes)),
                        scale: sh.scale(),
                    };
                    let (plane, wrt_k) = (self.plane, wrt == AttnArg::K);
                    // dK and dV in one launch: dV's buffer is the last vector binding before dK's.
                    let mut dv = dv_view
                        .map(|view| (bufs.last().expect("dV's binding").clone_unchecked(), view.in_vectors(lanes)));
                    let dv = dv.as_mut().map(|(buf, view)| (buf, *view));
                    let (o, sh) = (&mut out, &shape);
                    match (wrt, self.frag_device()) {
                        (AttnArg::Q, Some(dev)) => mma::build_grad_q::<N>(scope, &b, o, sh, dev),
                        (AttnArg::Q, None) => attention_tiled_grad::build_grad_q::<N>(scope, &b, o, sh, plane),
                        (_, Some(dev)) => mma::build_grad_kv::<N>(
                            scope,
                            &b,
                            attention_tiled_grad::KvOuts { out: o, wrt_k, dv },
                            sh,
                            dev,
                        ),
                        (_, None) => {
                            let outs = attention_tiled_grad::KvOuts { out: o, wrt_k, dv };
                            attention_tiled_grad::build_grad_kv::<N>(scope, &b, outs, sh, plane)
                        }
                    }
                }
                KernelSpec::AttentionLse { shape: ref sh, q, k: kv, .. } => {
                    // The log-sum-exp on the forward's kernel, no value read: the captures
                    // and the output are the scalar bindings.
                    let fns = sh.fns.as_ref().map(|f| func::fns_of(f, &scalars[..scalars.len() - 1], self.dtype));
                    let shape = self.attention_shape(sh, [q, kv, kv, q], lanes, fns);
                    let mut lse = scalars.last().expect("the log-sum-exp binding").clone_unchecked();
                    let scale = k::fconst::expand(scope, sh.scale());
                    let out = attention_tiled::Out::Lse(&mut lse);
                    let x = Inputs { q: &bufs[0], k: &bufs[1], v: &bufs[0] };
                    attention_tiled::build::<N>(scope, &x, out, scale, &shape, self.plane)
                }
                KernelSpec::Attention { shape: ref sh, q, k: kv, v, out: o, .. } => {
                    let caps = captures(sh);
                    let fns = sh.fns.as_ref().map(|f| func::fns_of(f, &scalars[..caps], self.dtype));
                    let mut shape = self.attention_shape(sh, [q, kv, v, o], lanes, fns);
                    if let KernelSpec::Attention { paged: Some(rows), .. } = self.spec {
                        let digits = value_elements(rows.integers, self.dtype);
                        shape.paged = Some(Paged { rows, table: scalars[caps].clone_unchecked(), digits });
                    }
                    if let KernelSpec::Attention { lse: true, .. } = self.spec {
                        shape.lse = Some(scalars.last().expect("the log-sum-exp binding").clone_unchecked());
                    }
                    let scale = scale.expect("attention takes a scale");
                    let x = Inputs { q: &bufs[0], k: &bufs[1], v: &bufs[2] };
                    if let Some(dev) = self.frag_device() {
                        return mma::build_attention::<N>(scope, &x, &mut out, scale, &shape, dev);
                    }
                    if let Some(AttnPath::Lanes(_)) = self.spec.path() {
                        return attention_split::build::<N>(scope, &x, &mut out, scale, &shape);
                    }
                    let out = attention_tiled::Out::Rows(&mut out);
                    attention_tiled::build::<N>(scope, &x, out, scale, &shape, self.plane)
                }
                KernelSpec::MixedAttention { .. } => {
                    mixed_launch::cpu_body::<N>(scope, &bufs, &scalars, &mut out, &self.spec, self.plane, self.dtype)
                }
                _ => unreachable!("only GEMM, attention and head mixing's CPU kernel bind vectors"),
            })
        });
    }

    /// The fragment kernels' device settings, where this kernel multiplies fragments.
    fn frag_device(&self) -> Option<mma::FragDevice> {
        (self.mma != Mma::Off).then(|| mma::FragDevice {
            hardware: self.mma == Mma::Hardware,
            dtype: self.dtype,
            shared_limit: self.props.hardware.max_shared_memory_size,
        })
    }

    /// An attention launch's shape for the host-assembled kernels, `views`
    /// (of q, k, v and the output) in floats.
    fn attention_shape(&self, sh: &AttnShape, views: [RowView; 4], lanes: usize, fns: Option<Fns>) -> Shape {
        let tiles = self.spec.attention_tiles();
        Shape {
            g: Dims::of(sh, tiles.key_tile, tiles.cube_rows(), tiles.lanes, self.spec.fold_x()),
            views: views.map(|view| view.in_vectors(lanes)),
            lanes,
            tiles,
            half: self.dtype.is_half(),
            fns,
            kv: match self.spec {
                KernelSpec::Attention { kv: Some(kv), .. } => Some(Split {
                    tiles: kv.keys / self.spec.attention_tiles().key_tile,
                    stride: sh.batch * sh.h * sh.s * kv.row / lanes,
                    lo: sh.e / lanes,
                    lse: 2 * sh.e / lanes,
                }),
                _ => None,
            },
            paged: None,
            lse: None,
        }
    }

    fn body(&self, scope: &Scope, bufs: &[NativeExpand<[Stored]>], mut out: NativeExpand<[Stored]>) {
        let spec = &self.spec;
        let fold = spec.fold_x();
        if let KernelSpec::Group { len, groups, scratch, ref steps, .. } = *spec {
            group_body(scope, bufs, out, steps, scratch, len / groups, fold);
        } else if let KernelSpec::Contract { rows, o1, o2, inner, ref a, ref b } = *spec {
            k::contract(scope, (&bufs[0], &bufs[1]), &mut out, (rows, o1, o2, inner), (a, b), fold);
        } else if let KernelSpec::AttentionLse { ref shape, q, k: kv, tile, .. } = *spec {
            let g = grad_dims(spec, shape, tile, fold);
            let hook = hook(shape, &bufs[2..], self.dtype);
            let args = attention_grad::GradArgs { views: [q, kv, q, q, q, q, q], scale: shape.scale(), hook };
            attention_grad::lse::expand(scope, &bufs[0], &bufs[1], &mut out, g, args);
        } else if let KernelSpec::MixedAttention { ref shape, mix, q, k: kv, v, out: o, pass } = *spec {
            let hooks = mixed_launch::hooks(shape, &bufs[pass.operands()..], self.dtype);
            mixed_launch::body(scope, bufs, out, shape, mix, [q, kv, v, o], pass, fold, hooks);
        } else if let KernelSpec::AttentionReadLines { ref shape, capture, reads, lines, q, k: kv, v, o, dout } = *spec
        {
            let (g, walk) = read_dims(spec, shape, capture, reads, lines);
            let i = ABSOLUTE_POS::expand(scope);
            let inside = k::below::expand(scope, i, shape.batch * shape.h * lines.count(shape.s, shape.sk));
            if_expand(scope, inside, |scope| {
                let views = [q, kv, v, o, dout, dout, dout];
                let args =
                    attention_grad::GradArgs { views, scale: shape.scale(), hook: hook(shape, &bufs[6..], self.dtype) };
                attention_grad_read::read_lines::expand(scope, &saved(bufs), &mut out, i, g, walk, args)
            });
        } else if let KernelSpec::AttentionReadSum { ref shape, capture, reads, lines } = *spec {
            let (g, walk) = read_dims(spec, shape, capture, reads, lines);
            let i = ABSOLUTE_POS::expand(scope);
            let inside = k::below::expand(scope, i, spec.len());
            if_expand(scope, inside, |scope| {
                let hk = hook(shape, &bufs[1..], self.dtype);
                let mut acc = k::fconst::expand(scope, 0.0);
                for r in 0..reads {
                    let share = attention_grad_read::read_sum::expand(scope, &bufs[0], i, g, walk, r, hk.clone());
                    acc = k::math::binary(scope, BinaryOp::Add, acc, share);
                }
                k::write::expand::<Stored>(scope, &mut out, i, acc);
            });
        } else if let KernelSpec::AttentionGrad { ref shape, wrt, q, k: kv, v, o, dout, tile, out: to, dv, .. } = *spec
        {
            let g = grad_dims(spec, shape, tile, fold);
            let (scale, views) = (shape.scale(), [q, kv, v, o, dout, to, dv.unwrap_or(to)]);
            let b = bufs;
            match wrt {
                AttnArg::Q => {
                    let args = attention_grad::GradArgs { views, scale, hook: hook(shape, &b[6..], self.dtype) };
                    attention_grad::grad_q::expand(scope, &saved(b), &mut out, g, args)
                }
                AttnArg::K => {
                    // dV beside dK: its buffer after the captures.
                    let with_v = dv.is_some();
                    let caps = captures(shape);
                    let mut dv = if with_v { b[6 + caps].clone_unchecked() } else { out.clone_unchecked() };
                    let args =
                        attention_grad::GradArgs { views, scale, hook: hook(shape, &b[6..6 + caps], self.dtype) };
                    attention_grad::grad_kv::expand(scope, &saved(b), &mut out, &mut dv, g, args, (true, with_v))
                }
                // dV binds q, k, dout and the log-sum-exp; `v` and `o` are not read.
                AttnArg::V => {
                    let mut unused = out.clone_unchecked();
                    let x =
                        attention_grad::SavedExpand { q: &b[0], k: &b[1], v: &b[0], o: &b[0], dout: &b[2], lse: &b[3] };
                    let args = attention_grad::GradArgs { views, scale, hook: hook(shape, &b[4..], self.dtype) };
                    attention_grad::grad_kv::expand(scope, &x, &mut out, &mut unused, g, args, (false, false))
                }
                AttnArg::Read(_) => unreachable!("refused before building (`KernelSpec::kernel_gap`)"),
            }
        } else {
            let i = ABSOLUTE_POS::expand(scope);
            let len = match spec {
                KernelSpec::Rope { rows, d, .. } => rows * d / 2,
                other => other.len(),
            };
            let inside = k::below::expand(scope, i, len);
            if_expand(scope, inside, |scope| match spec {
                KernelSpec::Gather { x, .. } => {
                    let ix = k::view(scope, i, x, len);
                    k::gather::expand(scope, &bufs[0], &mut out, i, ix);
                }
                KernelSpec::Binary { op, a, b, .. } => {
                    let (ia, ib) = (k::view(scope, i, a, len), k::view(scope, i, b, len));
                    let (x, y) = (
                        k::read::expand::<Stored>(scope, &bufs[0], ia),
                        k::read::expand::<Stored>(scope, &bufs[1], ib),
                    );
                    let v = k::math::binary(scope, *op, x, y);
                    k::write::expand::<Stored>(scope, &mut out, i, v);
                }
                KernelSpec::Unary { op, x, .. } => {
                    let ix = k::view(scope, i, x, len);
                    let v = k::math::unary(scope, *op, k::read::expand::<Stored>(scope, &bufs[0], ix));
                    k::write::expand::<Stored>(scope, &mut out, i, v);
                }
                KernelSpec::Where { cond, a, b, .. } => {
                    let (ic, ia, ib) =
                        (k::view(scope, i, cond, len), k::view(scope, i, a, len), k::view(scope, i, b, len));
                    k::select::expand(scope, &bufs[0], &bufs[1], &bufs[2], &mut out, i, ic, ia, ib);
                }
                KernelSpec::Thresholds { levels, .. } => k::thresholds::expand(scope, &bufs[0], &mut out, i, *levels),
                KernelSpec::MixHeads { batch, m, h, p, s, d, x, x_m } => {
                    let src = k::head_source::expand(scope, i, h * p, *m, *s, *d);
                    let x0 = k::view(scope, src, x, batch * m * s * d);
                    k::mix_heads::expand(scope, &bufs[0], &bufs[1], &mut out, i, x0, (*m, *h, *p, *s, *d, *x_m))
                }
                KernelSpec::MixCols { rows, m, h, p, d, y, y_m } => {
                    let src = k::head_source::expand(scope, i, h * p, *m, 1, *d);
                    let y0 = k::view(scope, src, y, rows * m * d);
                    k::mix_cols::expand(scope, &bufs[0], &bufs[1], &mut out, i, y0, (*m, *h, *p, *d, *y_m))
                }
                KernelSpec::Collapse { batch, h, c, s, d, x, x_c } => {
                    let src = k::head_source::expand(scope, i, *h, *c, *s, *d);
                    let x0 = k::view(scope, src, x, batch * c * s * d);
                    k::collapse(scope, (&bufs[0], &bufs[1]), &mut out, i, x0, (*h, *c, *s, *d), x_c)
                }
                KernelSpec::CollapseCols { rows, h, c, d, y, y_c } => {
                    let src = k::head_source::expand(scope, i, *h, *c, 1, *d);
                    let y0 = k::view(scope, src, y, rows * c * d);
                    k::collapse_cols::expand(scope, &bufs[0], &bufs[1], &mut out, i, y0, (*h, *c, *d, *y_c))
                }
                KernelSpec::CollapseRows { h, c, d, f } => {
                    k::collapse_rows::expand(scope, &bufs[0], &bufs[1], &mut out, i, (*h, *c, *d, *f))
                }
                KernelSpec::BlockDiag { cols, block, .. } => {
                    k::block_diag::expand(scope, &bufs[0], &mut out, i, *cols, *block)
                }
                KernelSpec::Concat { f1, f2, .. } => {
                    k::concat::expand(scope, &bufs[0], &bufs[1], &mut out, i, *f1, *f2)
                }
                KernelSpec::Combine { batch, h, s, e, kv, out: o, weights, sink } => {
                    let at = source::combined_at::expand(scope, i, *h, *s, *e, *o);
                    let rows = batch * h * s;
                    let rule = Norm::of_weights(*weights, *sink);
                    let (heads, row, lanes) = ((*h, *s), kv.row, kv.lanes);
                    let c = norm::Chunks { splits: kv.splits, rows, e: *e, row, lanes, norm: rule, heads };
                    norm::combine::expand(scope, &bufs[0], &bufs[bufs.len() - 1], &mut out, i, at, c)
                }
                KernelSpec::SinkGrad { batch, h, s, e, o, dout } => {
                    let c = norm::SinkRows { batch: *batch, heads: *h, s: *s, e: *e, o: *o, dout: *dout };
                    norm::sink_grad::expand(scope, &bufs[0], &bufs[1], &bufs[2], &bufs[3], &mut out, i, c)
                }
                KernelSpec::Paged { slots, blocks, page, heads, width, integers, .. } => {
                    let p = k::Pages {
                        page: *page,
                        slots: *slots,
                        blocks: *blocks,
                        digits: value_elements(*integers, self.dtype),
                    };
                    k::paged::expand(scope, &bufs[0], &bufs[1], &mut out, i, p, (*heads, *width))
                }
                KernelSpec::Rope { rows, s, d, x, .. } => {
                    let first = k::rope_source::expand(scope, i, *d);
                    let second = k::add_index::expand(scope, first, k::const_index::expand(scope, d / 2));
                    let (ia, ib) = (k::view(scope, first, x, rows * d), k::view(scope, second, x, rows * d));
                    k::rope::expand(scope, &bufs[0], &bufs[1], &mut out, i, ia, ib, (*s, *d))
                }
                KernelSpec::Reduce { op, count, base, inner, .. } => {
                    let b = k::view(scope, i, base, len);
                    let stride = inner.terms.first().map_or(0, |t| t.2);
                    k::reduce::expand::<Stored, Stored>(
                        scope,
                        &bufs[0],
                        &mut out,
                        i,
                        b,
                        *count,
                        stride,
                        reduce_code(*op),
                    );
                }
                KernelSpec::LooMean { n, stride, .. } => {
                    k::loo_mean::expand::<Stored, Stored>(scope, &bufs[0], &mut out, i, 0, 0, *n, *stride)
                }
                KernelSpec::MatMul { .. }
                | KernelSpec::Attention { .. }
                | KernelSpec::Group { .. }
                | KernelSpec::Contract { .. }
                | KernelSpec::AttentionLse { .. }
                | KernelSpec::MixedAttention { .. }
                | KernelSpec::AttentionReadLines { .. }
                | KernelSpec::AttentionReadSum { .. }
                | KernelSpec::AttentionGrad { .. } => unreachable!(),
            });
        }
    }
}

/// The bindings of attention's `#[cube]` backward kernels, the first six.
fn saved(b: &[NativeExpand<[Stored]>]) -> attention_grad::SavedExpand<'_> {
    attention_grad::SavedExpand { q: &b[0], k: &b[1], v: &b[2], o: &b[3], dout: &b[4], lse: &b[5] }
}

/// The comptime sizes of attention's backward launches.
fn grad_dims(spec: &KernelSpec, a: &AttnShape, tile: usize, fold: usize) -> Dims {
    let tiles = spec.attention_tiles();
    Dims::of(a, tile, tiles.cube_rows(), tiles.lanes, fold)
}

/// A read gradient's sizes ([`attention_grad_read`]; no tiles, a unit a line).
fn read_dims(
    spec: &KernelSpec,
    a: &AttnShape,
    capture: usize,
    reads: usize,
    lines: Lines,
) -> (Dims, attention_grad_read::Walk) {
    let g = Dims { tile: 1, lanes: 1, rows: 1, ..grad_dims(spec, a, 1, 0) };
    (g, attention_grad_read::Walk { batch: a.batch, lines, reads, capture })
}

/// `f` in the cubes of the launch: all of them, or with a folded grid
/// (`KernelSpec::fold_x`) those below its logical count.
fn in_grid(scope: &Scope, spec: &KernelSpec, f: impl FnOnce(&Scope)) {
    if spec.fold_x() == 0 {
        return f(scope);
    }
    let (x, y) = spec.cubes();
    let inside = k::cube_in_grid::expand(scope, x * y);
    if_expand(scope, inside, f);
}

/// `f(i)` for every `i < len`, split among the cube's units.
fn for_each_element(scope: &Scope, len: usize, f: impl Fn(&Scope, NativeExpand<usize>)) {
    for chunk in 0..len.div_ceil(GROUP_UNITS) {
        let i = k::unit_element::expand(scope, chunk);
        let inside = k::below::expand(scope, i, len);
        if_expand(scope, inside, |scope| f(scope, i));
    }
}

/// One unit runs `f`.
fn first_unit(scope: &Scope, f: impl FnOnce(&Scope)) {
    let first = k::is_first_unit::expand(scope);
    if_expand(scope, first, f);
}

fn offset(scope: &Scope, i: NativeExpand<usize>, by: usize) -> NativeExpand<usize> {
    let c = k::const_index::expand(scope, by);
    k::add_index::expand(scope, c, i)
}

/// A group kernel: its steps in order, each over the group's shared array, a barrier after each.
fn group_body(
    scope: &Scope,
    bufs: &[NativeExpand<[Stored]>],
    out: NativeExpand<[Stored]>,
    steps: &[GroupStep],
    scratch: usize,
    out_len: usize,
    fold: usize,
) {
    let shared = k::group_scratch::expand(scope, scratch);
    let b = k::group_index::expand(scope, fold);
    for step in steps {
        let mut s: NativeExpand<[f32]> = (*shared).clone_unchecked();
        match step {
            GroupStep::Load { dst, len, input, stride } => for_each_element(scope, *len, |scope, i| {
                let base = k::group_offset::expand(scope, b, *stride);
                let v = k::read::expand::<Stored>(scope, &bufs[*input], k::add_index::expand(scope, base, i));
                k::write::expand::<f32>(scope, &mut s.clone_unchecked(), offset(scope, i, *dst), v);
            }),
            GroupStep::Map { dst, len, op, args } => for_each_element(scope, *len, |scope, i| {
                let xs: Vec<NativeExpand<f32>> =
                    args.iter().map(|a| k::read::expand::<f32>(scope, &s, k::view(scope, i, a, *len))).collect();
                let v = match (*op, &xs[..]) {
                    (MapOp::Where, [c, x, y]) => k::apply_select::expand(scope, *c, *x, *y),
                    (MapOp::Unary(op), [x]) => k::math::unary(scope, op, *x),
                    (MapOp::Binary(op), [x, y]) => k::math::binary(scope, op, *x, *y),
                    (op, xs) => unreachable!("`{}` is planned with {} operands", op.name(), xs.len()),
                };
                k::write::expand::<f32>(scope, &mut s.clone_unchecked(), offset(scope, i, *dst), v);
            }),
            GroupStep::Thresholds { dst, len, levels, x } => for_each_element(scope, *len, |scope, i| {
                let v = k::read::expand::<f32>(scope, &s, k::view(scope, i, x, *len));
                let r = k::apply_threshold::expand(scope, v, i, *levels);
                k::write::expand::<f32>(scope, &mut s.clone_unchecked(), offset(scope, i, *dst), r);
            }),
            GroupStep::Indicator { dst, l } => for_each_element(scope, 2 * l, |scope, i| {
                let r = k::indicator::expand(scope, i, *l);
                k::write::expand::<f32>(scope, &mut s.clone_unchecked(), offset(scope, i, *dst), r);
            }),
            GroupStep::Reduce { dst, len, op, base, count, stride } => for_each_element(scope, *len, |scope, i| {
                let from = k::view(scope, i, base, *len);
                let o = offset(scope, i, *dst);
                k::reduce::expand::<f32, f32>(
                    scope,
                    &s,
                    &mut s.clone_unchecked(),
                    o,
                    from,
                    *count,
                    *stride,
                    reduce_code(*op),
                );
            }),
            GroupStep::LooMean { dst, len, x, n, stride } => for_each_element(scope, *len, |scope, i| {
                k::loo_mean::expand::<f32, f32>(scope, &s, &mut s.clone_unchecked(), i, *x, *dst, *n, *stride);
            }),
            GroupStep::Levels { r, m, hist, g, l } => {
                first_unit(scope, |scope| k::levels::expand(scope, &mut s, *r, *m, *hist, *g, *l))
            }
            GroupStep::LiftReduceGroups { dst, v, c, g, l, op } => for_each_element(scope, *l, |scope, i| {
                k::lift_reduce_groups::expand(
                    scope,
                    &mut s.clone_unchecked(),
                    i,
                    *dst,
                    *v,
                    *c,
                    *g,
                    *l,
                    reduce_code(*op),
                );
            }),
            GroupStep::LiftScan { dst, v, l, op } => {
                first_unit(scope, |scope| k::lift_scan::expand(scope, &mut s, *dst, *v, *l, reduce_code(*op)))
            }
            GroupStep::LiftReduceLevels { dst, g, scan, m, l, op } => for_each_element(scope, *g, |scope, i| {
                k::lift_reduce_levels::expand(
                    scope,
                    &mut s.clone_unchecked(),
                    i,
                    *dst,
                    *scan,
                    *m,
                    *l,
                    reduce_code(*op),
                );
            }),
            GroupStep::Densify { dst, v, m, g, l } => for_each_element(scope, g * l, |scope, i| {
                k::densify::expand(scope, &mut s.clone_unchecked(), i, *dst, *v, *m, *l);
            }),
            GroupStep::Store { src, len } => for_each_element(scope, *len, |scope, i| {
                let v = k::read::expand::<f32>(scope, &s, offset(scope, i, *src));
                let base = k::group_offset::expand(scope, b, out_len);
                k::write::expand::<Stored>(scope, &mut out.clone_unchecked(), k::add_index::expand(scope, base, i), v);
            }),
        }
        k::barrier::expand(scope);
    }
}
