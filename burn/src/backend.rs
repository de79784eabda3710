//! The Burn backend extension ([`AttncBackend`]): a planned spec's launches
//! on burn-cubecl's tensors, on their client, reading and writing their
//! buffers in place (`Gpu::run_resident`; nothing is read back to the
//! host). Without autodiff the forward plan runs. Under `Autodiff`, a call
//! with a tracked input runs the gradient program's forward half
//! (`attnc_compiler::grad::split`), keeps the residuals it returns in each
//! output's autodiff step, and the step's backward runs the backward half
//! on them and the output's gradient, registering a gradient for every
//! tracked input the program differentiates.

use crate::op::{Bound, Planned, Source};
use attnc_compiler::plan::Plan;
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

/// `Tensors::new` (from 1 to [`MAX_INPUTS`] inputs, which
/// `AttncOp::forward` checks) and `Tensors::into_vec`.
macro_rules! conversions {
    ($($n:literal => $v:ident($($t:ident),+);)+) => {
        impl<B: Backend> Tensors<B> {
            pub(crate) fn new(inputs: Vec<FloatTensor<B>>) -> Tensors<B> {
                let n = inputs.len();
                let mut it = inputs.into_iter();
                match n {
                    $($n => {
                        $(let $t = it.next().expect("counted");)+
                        Tensors::$v($($t),+)
                    })+
                    n => unreachable!("{n} inputs"),
                }
            }

            fn into_vec(self) -> Vec<FloatTensor<B>> {
                match self {
                    $(Tensors::$v($($t),+) => vec![$($t),+],)+
                }
            }
        }
    };
}

conversions! {
    1 => I1(a);
    2 => I2(a, b);
    3 => I3(a, b, c);
    4 => I4(a, b, c, d);
    5 => I5(a, b, c, d, e);
    6 => I6(a, b, c, d, e, f);
    7 => I7(a, b, c, d, e, f, g);
    8 => I8(a, b, c, d, e, f, g, h);
    9 => I9(a, b, c, d, e, f, g, h, i);
    10 => I10(a, b, c, d, e, f, g, h, i, j);
    11 => I11(a, b, c, d, e, f, g, h, i, j, k);
    12 => I12(a, b, c, d, e, f, g, h, i, j, k, l);
    13 => I13(a, b, c, d, e, f, g, h, i, j, k, l, m);
    14 => I14(a, b, c, d, e, f, g, h, i, j, k, l, m, n);
    15 => I15(a, b, c, d, e, f, g, h, i, j, k, l, m, n, o);
    16 => I16(a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p);
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

/// A tensor of `shape` over buffer `h` of `like`'s client and device.
fn tensor(like: &CubeTensor, h: Handle, shape: &[usize]) -> CubeTensor {
    CubeTensor::new_contiguous(like.client.clone(), like.device.clone(), Shape::from(shape.to_vec()), h, DType::F32)
}

/// Runs `plan` on the buffers `handles` binds (its inputs) and returns
/// them with its outputs; panics with attnc's message, as
/// `AttncOp::forward` checked the tensors and the plan on this device (a
/// failure here is a bug).
fn run(plan: &Plan, like: &CubeTensor, planned: &Planned, mut handles: Vec<Option<Handle>>) -> Vec<Option<Handle>> {
    let gpu = Gpu::with_client(like.client.clone(), "burn", planned.register_tiles);
    if let Err(e) = gpu.run_resident(plan, &mut handles) {
        panic!("attnc-burn: a checked plan failed to run: {e}");
    }
    handles
}

/// `bound`'s plan on `inputs` (contiguous, the program's in order): the
/// buffers of its outputs.
fn run_bound(bound: &Bound, planned: &Planned, inputs: &[CubeTensor]) -> Vec<Handle> {
    let mut handles: Vec<Option<Handle>> = vec![None; bound.plan.buffers.len()];
    for (t, b) in inputs.iter().zip(&bound.inputs) {
        if let Some(b) = b {
            handles[*b] = Some(t.handle.clone());
        }
    }
    let handles = run(&bound.plan, &inputs[0], planned, handles);
    bound.outputs.iter().map(|b| handles[*b].clone().expect("an output")).collect()
}

/// The forward plan on `inputs`: the outputs. Every tensor attnc reads is
/// first put in the layout its plans read (contiguous, row-major,
/// untiled), by Burn's own copy kernel only where it is not already.
fn forward(planned: &Planned, inputs: Vec<CubeTensor>) -> Vec<CubeTensor> {
    let inputs: Vec<CubeTensor> = inputs.into_iter().map(into_contiguous).collect();
    let outputs = run_bound(&planned.forward, planned, &inputs);
    outputs.into_iter().zip(&planned.outputs).map(|(h, shape)| tensor(&inputs[0], h, shape)).collect()
}

impl AttncBackend for CubeBackend {
    fn attnc_run(call: Call, inputs: Tensors<Self>) -> Vec<FloatTensor<Self>> {
        forward(&call.planned, inputs.into_vec())
    }
}

/// What a tracked call's backward reads: the inputs, and the forward
/// half's outputs (the spec's, then the residuals).
#[derive(Debug)]
struct Saved {
    planned: Arc<Planned>,
    inputs: Vec<CubeTensor>,
    outputs: Vec<Handle>,
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
        let cot = into_contiguous(grads.consume::<CubeBackend>(&ops.node));
        let like = &saved.inputs[0];
        let plan = &g.backward;
        let mut handles: Vec<Option<Handle>> = vec![None; plan.buffers.len()];
        for &(b, source) in &g.sources {
            handles[b] = Some(match source {
                Source::Input(i) => saved.inputs[i].handle.clone(),
                Source::Saved(k) => saved.outputs[k].clone(),
                Source::Cotangent(k) if k == self.output => cot.handle.clone(),
                // The other outputs' cotangents are zero in this output's step.
                Source::Cotangent(_) => like.client.create_from_slice(&vec![0u8; plan.buffer_bytes(b) as usize]),
            });
        }
        let handles = run(plan, like, &saved.planned, handles);
        for ((parent, grad), shape) in ops.parents.iter().zip(&g.grads).zip(&saved.planned.inputs) {
            if let (Some(node), Some(b)) = (parent, grad) {
                let h = handles[*b].clone().expect("a gradient output");
                grads.register::<CubeBackend>(node.id, tensor(like, h, shape));
            }
        }
    }
}

/// A tracked call with `N` inputs: the gradient program's forward half,
/// each output's step keeping the residuals its backward half reads.
fn tracked<const N: usize, C: CheckpointStrategy>(
    call: Call,
    inputs: Vec<FloatTensor<Autodiff<CubeBackend, C>>>,
) -> Vec<FloatTensor<Autodiff<CubeBackend, C>>> {
    let planned = call.planned;
    let guards = |inputs: &[FloatTensor<Autodiff<CubeBackend, C>>]| -> [NodeGuard; N] {
        let v: Vec<NodeGuard> = inputs.iter().map(|t| t.node()).collect();
        v.try_into().unwrap_or_else(|_| unreachable!("N inputs"))
    };
    let steps: Vec<_> = (0..planned.outputs.len())
        .map(|output| Step::<N> { output }.prepare::<C>(guards(&inputs)).compute_bound().stateful())
        .collect();
    let primitives: Vec<CubeTensor> = inputs.into_iter().map(|t| into_contiguous(t.into_primitive())).collect();
    let g = match &planned.grad {
        Some(g) if steps.iter().any(|s| matches!(s, OpsKind::Tracked(_))) => g,
        // Nothing to differentiate: the plain forward.
        _ => {
            let out = forward(&planned, primitives);
            let untracked = |s| match s {
                OpsKind::UnTracked(p) => p,
                OpsKind::Tracked(_) => unreachable!("a tracked call is planned with its gradient program"),
            };
            return steps.into_iter().zip(out).map(|(s, o)| untracked(s).finish(o)).collect();
        }
    };
    let outputs = run_bound(&g.forward, &planned, &primitives);
    let outs: Vec<CubeTensor> =
        (outputs.iter().zip(&planned.outputs)).map(|(h, shape)| tensor(&primitives[0], h.clone(), shape)).collect();
    let saved = Arc::new(Saved { planned: planned.clone(), inputs: primitives, outputs });
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
