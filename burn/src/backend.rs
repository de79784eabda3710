//! The Burn backend extension ([`AttncBackend`]): a planned spec's launches
//! on burn-cubecl's tensors, on their client, reading and writing their
//! buffers in place (`Gpu::run_resident`; nothing is read back to the
//! host). Without autodiff the forward plan runs. Under `Autodiff`, a call
//! with a tracked input runs the gradient program's forward phase, keeps
//! the buffers its backward phase reads (`Plan::phases`) in each output's
//! autodiff step, and the backward runs that phase on the output's
//! gradient, registering a gradient for every tracked input the program
//! differentiates.

use crate::op::Planned;
use attnc_runtime::gpu::exec::{Gpu, Handle};
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::{backend_extension, tensor::FloatTensor, Backend, ExtensionType};
use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use std::sync::Arc;

/// One call of a planned spec: what the backends run.
#[derive(Clone, Debug)]
pub struct Call {
    pub(crate) planned: Arc<Planned>,
}

/// The most inputs a spec run through Burn has ([`Tensors`]).
pub const MAX_INPUTS: usize = 16;

/// A spec's input tensors, in declaration order: Burn's dispatch converts
/// tensors held directly in an extension type's variants, not in lists.
#[derive(ExtensionType)]
pub enum Tensors<B: Backend> {
    I1(FloatTensor<B>),
    I2(FloatTensor<B>, FloatTensor<B>),
    I3(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>),
    I4(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>),
    I5(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>),
    I6(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>),
    I7(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>),
    I8(
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    ),
    I9(
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    ),
    I10(
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    ),
    I11(
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    ),
    I12(
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    ),
    I13(
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    ),
    I14(
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    ),
    I15(
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    ),
    I16(
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    ),
}

impl<B: Backend> Tensors<B> {
    /// `inputs` (1 to [`MAX_INPUTS`] of them, which `AttncOp::forward` checks).
    pub(crate) fn new(inputs: Vec<FloatTensor<B>>) -> Tensors<B> {
        let n = inputs.len();
        let mut it = inputs.into_iter();
        match n {
            1 => Tensors::I1(it.next().expect("counted")),
            2 => Tensors::I2(it.next().expect("counted"), it.next().expect("counted")),
            3 => Tensors::I3(it.next().expect("counted"), it.next().expect("counted"), it.next().expect("counted")),
            4 => Tensors::I4(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            5 => Tensors::I5(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            6 => Tensors::I6(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            7 => Tensors::I7(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            8 => Tensors::I8(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            9 => Tensors::I9(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            10 => Tensors::I10(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            11 => Tensors::I11(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            12 => Tensors::I12(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            13 => Tensors::I13(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            14 => Tensors::I14(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            15 => Tensors::I15(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            16 => Tensors::I16(
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
                it.next().expect("counted"),
            ),
            n => unreachable!("{n} inputs"),
        }
    }

    fn into_vec(self) -> Vec<FloatTensor<B>> {
        match self {
            Tensors::I1(t0) => vec![t0],
            Tensors::I2(t0, t1) => vec![t0, t1],
            Tensors::I3(t0, t1, t2) => vec![t0, t1, t2],
            Tensors::I4(t0, t1, t2, t3) => vec![t0, t1, t2, t3],
            Tensors::I5(t0, t1, t2, t3, t4) => vec![t0, t1, t2, t3, t4],
            Tensors::I6(t0, t1, t2, t3, t4, t5) => vec![t0, t1, t2, t3, t4, t5],
            Tensors::I7(t0, t1, t2, t3, t4, t5, t6) => vec![t0, t1, t2, t3, t4, t5, t6],
            Tensors::I8(t0, t1, t2, t3, t4, t5, t6, t7) => vec![t0, t1, t2, t3, t4, t5, t6, t7],
            Tensors::I9(t0, t1, t2, t3, t4, t5, t6, t7, t8) => vec![t0, t1, t2, t3, t4, t5, t6, t7, t8],
            Tensors::I10(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9) => vec![t0, t1, t2, t3, t4, t5, t6, t7, t8, t9],
            Tensors::I11(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10) => {
                vec![t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10]
            }
            Tensors::I12(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11) => {
                vec![t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11]
            }
            Tensors::I13(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12) => {
                vec![t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12]
            }
            Tensors::I14(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13) => {
                vec![t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13]
            }
            Tensors::I15(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14) => {
                vec![t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14]
            }
            Tensors::I16(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15) => {
                vec![t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15]
            }
        }
    }
}

/// Runs a compiled attnc spec on a backend's tensors: the program's inputs
/// in declaration order, its outputs in order.
/// [`AttncOp::forward`](crate::AttncOp::forward) calls it.
#[backend_extension(Autodiff, Cube)]
pub trait AttncBackend: Backend {
    fn attnc_run(call: Call, #[extension_type] inputs: Tensors<Self>) -> Vec<FloatTensor<Self>>;
}

/// Whether attnc tiles launches within the register file on `device`: on
/// CUDA GPUs; not on wgpu, as `Gpu::wgpu` (lavapipe's units are CPU vectors).
pub(crate) fn register_tiles(device: &burn_cubecl::CubeDevice) -> bool {
    matches!(device, cubecl::Device::Cuda(_))
}

/// The executor on `t`'s client.
fn executor(t: &CubeTensor, planned: &Planned) -> Gpu {
    Gpu::with_client(t.client.clone(), "burn", planned.register_tiles)
}

/// `t` in the layout attnc's plans read: contiguous, row-major, untiled
/// (a copy by Burn's own kernel only where it is not already).
fn handle(t: CubeTensor) -> (Handle, CubeTensor) {
    let t = into_contiguous(t);
    (t.handle.clone(), t)
}

/// A tensor of `shape` over buffer `h` of `like`'s client and device.
fn tensor(like: &CubeTensor, h: Handle, shape: &[usize]) -> CubeTensor {
    CubeTensor::new_contiguous(like.client.clone(), like.device.clone(), Shape::from(shape.to_vec()), h, DType::F32)
}

/// Panics with attnc's message: `AttncOp::forward` checked the tensors
/// and the plan on this device, so a failure here is a bug.
fn ran(r: Result<(), attnc_runtime::gpu::exec::GpuError>) {
    if let Err(e) = r {
        panic!("attnc-burn: a checked plan failed to run: {e}");
    }
}

/// The forward plan on `inputs`: the outputs.
fn forward(planned: &Planned, inputs: Vec<CubeTensor>) -> Vec<CubeTensor> {
    let f = &planned.forward;
    let mut handles: Vec<Option<Handle>> = vec![None; f.plan.buffers.len()];
    let inputs: Vec<CubeTensor> = inputs.into_iter().map(|t| handle(t).1).collect();
    for (t, b) in inputs.iter().zip(&f.inputs) {
        if let Some(b) = b {
            handles[*b] = Some(t.handle.clone());
        }
    }
    let all: Vec<usize> = (0..f.plan.launches.len()).collect();
    ran(executor(&inputs[0], planned).run_resident(&f.plan, &all, &mut handles, &f.outputs));
    (f.outputs.iter().zip(&planned.outputs))
        .map(|(b, shape)| tensor(&inputs[0], handles[*b].clone().expect("an output"), shape))
        .collect()
}

impl AttncBackend for CubeBackend {
    fn attnc_run(call: Call, inputs: Tensors<Self>) -> Vec<FloatTensor<Self>> {
        forward(&call.planned, inputs.into_vec())
    }
}

/// What a tracked call's backward reads: the inputs, and the buffers the
/// gradient program's forward phase saved for its backward phase.
#[derive(Debug)]
struct Saved {
    planned: Arc<Planned>,
    inputs: Vec<CubeTensor>,
    handles: Vec<Option<Handle>>,
}

/// The autodiff step of output `output` of a call with `N` inputs.
#[derive(Debug)]
struct Step<const N: usize> {
    output: usize,
}

impl<const N: usize> Backward<CubeBackend, N> for Step<N> {
    type State = Arc<Saved>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let saved = ops.state;
        let g = saved.planned.grad.as_ref().expect("a tracked call is planned with its gradient program");
        let (cot, out_grad) = handle(grads.consume::<CubeBackend>(&ops.node));
        let like = &saved.inputs[0];
        let mut handles = saved.handles.clone();
        let plan = &g.bound.plan;
        // This output's cotangent; the others' are zero in its step.
        for (k, c) in g.cotangents.iter().enumerate() {
            if let Some(c) = c {
                handles[*c] = Some(if k == self.output {
                    cot.clone()
                } else {
                    like.client.create_from_slice(&vec![0u8; plan.buffer_bytes(*c) as usize])
                });
            }
        }
        let wanted: Vec<usize> = g.grads.iter().flatten().copied().collect();
        ran(executor(like, &saved.planned).run_resident(plan, &g.phases.second, &mut handles, &wanted));
        drop(out_grad);
        for ((parent, grad), shape) in ops.parents.iter().zip(&g.grads).zip(&saved.planned.inputs) {
            if let (Some(node), Some(b)) = (parent, grad) {
                let h = handles[*b].clone().expect("a gradient output");
                grads.register::<CubeBackend>(node.id, tensor(like, h, shape));
            }
        }
    }
}

/// A tracked call with `N` inputs: the gradient program's forward phase,
/// each output's step keeping what its backward phase reads.
fn tracked<const N: usize, C: CheckpointStrategy>(
    call: Call,
    inputs: Vec<FloatTensor<Autodiff<CubeBackend, C>>>,
) -> Vec<FloatTensor<Autodiff<CubeBackend, C>>> {
    let planned = call.planned;
    let outputs = planned.outputs.len();
    let guards = |inputs: &[FloatTensor<Autodiff<CubeBackend, C>>]| -> [NodeGuard; N] {
        let v: Vec<NodeGuard> = inputs.iter().map(|t| t.node()).collect();
        v.try_into().unwrap_or_else(|_| unreachable!("N inputs"))
    };
    let steps: Vec<_> = (0..outputs)
        .map(|output| Step::<N> { output }.prepare::<C>(guards(&inputs)).compute_bound().stateful())
        .collect();
    let primitives: Vec<CubeTensor> = inputs.into_iter().map(|t| handle(t.into_primitive()).1).collect();
    if steps.iter().all(|s| matches!(s, OpsKind::UnTracked(_))) || planned.grad.is_none() {
        let out = forward(&planned, primitives);
        return steps
            .into_iter()
            .zip(out)
            .map(|(s, o)| match s {
                OpsKind::Tracked(p) => {
                    p.finish(Arc::new(Saved { planned: planned.clone(), inputs: vec![], handles: vec![] }), o)
                }
                OpsKind::UnTracked(p) => p.finish(o),
            })
            .collect();
    }
    let g = planned.grad.as_ref().expect("checked above");
    let plan = &g.bound.plan;
    let mut handles: Vec<Option<Handle>> = vec![None; plan.buffers.len()];
    for (t, b) in primitives.iter().zip(&g.bound.inputs) {
        if let Some(b) = b {
            handles[*b] = Some(t.handle.clone());
        }
    }
    let keep: Vec<usize> = g.bound.outputs.iter().chain(&g.phases.saved).copied().collect();
    ran(executor(&primitives[0], &planned).run_resident(plan, &g.phases.first, &mut handles, &keep));
    let outs: Vec<CubeTensor> = (g.bound.outputs.iter().zip(&planned.outputs))
        .map(|(b, shape)| tensor(&primitives[0], handles[*b].clone().expect("an output"), shape))
        .collect();
    // Only what the backward phase reads is kept (and the inputs, bound by index).
    let kept: Vec<Option<Handle>> = (handles.iter().enumerate())
        .map(|(b, h)| h.clone().filter(|_| g.phases.saved.contains(&b) || g.bound.inputs.contains(&Some(b))))
        .collect();
    let saved = Arc::new(Saved { planned: planned.clone(), inputs: primitives, handles: kept });
    steps
        .into_iter()
        .zip(outs)
        .map(|(s, o)| match s {
            OpsKind::Tracked(p) => p.finish(saved.clone(), o),
            OpsKind::UnTracked(p) => p.finish(o),
        })
        .collect()
}

/// Calls `tracked::<N, C>` for the number of inputs, up to 16.
macro_rules! by_inputs {
    ($n:expr, $call:expr, $inputs:expr, $($k:literal)*) => {
        match $n {
            $($k => tracked::<$k, C>($call, $inputs),)*
            n => panic!("attnc-burn differentiates specs of up to 16 inputs; this one has {n}"),
        }
    };
}

impl<C: CheckpointStrategy> AttncBackend for Autodiff<CubeBackend, C> {
    fn attnc_run(call: Call, inputs: Tensors<Self>) -> Vec<FloatTensor<Self>> {
        let inputs = inputs.into_vec();
        by_inputs!(inputs.len(), call, inputs, 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    }
}
