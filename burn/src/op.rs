//! A compiled spec as a Burn operation ([`AttncOp`]): named Burn tensors
//! in ([`Inputs`]), checked against the spec (names, shapes, dtype,
//! device) before anything runs; the plan for their sizes (cached); the
//! launches on Burn's own client and buffers ([`crate::backend`]); named
//! tensors out ([`Outputs`]).

use crate::backend::{AttncBackend, Call, Tensors, MAX_INPUTS};
use crate::error::Error;
use attnc_compiler::ir::Program;
use attnc_compiler::plan::{self, BufferRole, Dtype, Plan};
use attnc_compiler::Code;
use attnc_runtime::gpu::exec::Gpu;
use burn::backend::{Dispatch, DispatchDevice, DispatchTensor};
use burn::tensor::{DType, Device, Tensor};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A spec compiled once, run on Burn tensors of any sizes it admits: each
/// set of sizes is planned once and its kernels compiled on first use.
/// Differentiable through Burn's autodiff: the forward of a tracked call
/// runs the gradient program's forward half and keeps the residuals its
/// backward half reads (log-sum-exps, projections, kept products) in the
/// autodiff graph.
#[derive(Clone)]
pub struct AttncOp {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AttncOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AttncOp({})", self.inner.name)
    }
}

/// The inputs' shapes and the inputs autodiff tracks: what a plan is for.
type PlanKey = (Vec<Vec<usize>>, Vec<String>);

struct Inner {
    name: String,
    program: Program,
    plans: Mutex<HashMap<PlanKey, Arc<Planned>>>,
}

/// A plan for one set of sizes, and where each tensor binds in it.
#[derive(Debug)]
pub(crate) struct Planned {
    pub forward: Bound,
    /// The gradient program's plan, for calls that autodiff tracks.
    pub grad: Option<GradBound>,
    /// The program's inputs' and outputs' shapes.
    pub inputs: Vec<Vec<usize>>,
    pub outputs: Vec<Vec<usize>>,
    /// Whether launches are tiled within a GPU's register file.
    pub register_tiles: bool,
}

/// A plan and the buffer each program input and output is.
#[derive(Debug)]
pub(crate) struct Bound {
    pub plan: Plan,
    pub inputs: Vec<Option<usize>>,
    pub outputs: Vec<usize>,
}

/// The gradient program cut for training (`attnc_compiler::grad::split`,
/// as `attnc.torch` trains): a forward that also returns the residuals its
/// backward reads, and a backward that computes only the gradients.
#[derive(Debug)]
pub(crate) struct GradBound {
    /// The forward's plan; its outputs are the spec's, then the residuals.
    pub forward: Bound,
    pub backward: Plan,
    /// What each of the backward's input buffers is.
    pub sources: Vec<(usize, Source)>,
    /// Each program input's gradient buffer in the backward (none: not
    /// differentiated).
    pub grads: Vec<Option<usize>>,
}

/// Where a backward input comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Source {
    /// The spec's input of this index.
    Input(usize),
    /// The cotangent of the spec's output of this index.
    Cotangent(usize),
    /// The forward's output of this index (a spec output or a residual).
    Saved(usize),
}

fn bind(plan: Plan, program: &Program, outputs: &[String]) -> Bound {
    let input = |name: &str| {
        plan.buffers.iter().position(|b| matches!(&b.role, BufferRole::Input { name: n, .. } if n == name))
    };
    let inputs = program.inputs.iter().map(|i| input(&i.name)).collect();
    let outputs =
        outputs.iter().map(|o| plan.outputs.iter().find(|(n, _)| n == o).expect("planned output").1).collect();
    Bound { plan, inputs, outputs }
}

impl AttncOp {
    /// Compiles `source` (a `.attn` spec) with `sets` binding its
    /// parameters (`("P", "4")`, as `attnc --set P=4`).
    pub fn compile(name: &str, source: &str, sets: &[(&str, &str)]) -> Result<AttncOp, Error> {
        let settings: Vec<attnc_compiler::Setting> =
            sets.iter().map(|(n, v)| attnc_compiler::Setting { name: n.to_string(), value: v.to_string() }).collect();
        let compiled = attnc_compiler::compile(source, &settings).map_err(|diags| {
            let code = diags.first().map_or(Code::Internal, |d| d.code);
            Error::new(code, attnc_compiler::render(name, source, &diags))
        })?;
        Ok(AttncOp {
            inner: Arc::new(Inner { name: name.to_string(), program: compiled.program, plans: Mutex::default() }),
        })
    }

    /// Compiles the spec in file `path`.
    pub fn from_file(path: impl AsRef<Path>, sets: &[(&str, &str)]) -> Result<AttncOp, Error> {
        let path = path.as_ref();
        let source = std::fs::read_to_string(path)
            .map_err(|e| Error::new(Code::Io, format!("cannot read {}: {e}", path.display())))?;
        AttncOp::compile(&path.display().to_string(), &source, sets)
    }

    /// The spec's program (its inputs, dims and outputs).
    pub fn program(&self) -> &Program {
        &self.inner.program
    }

    /// Runs the spec on `inputs`, on their device (a cubecl one: wgpu,
    /// CUDA, …) with no copy to the host. The tensors must be f32, each the
    /// shape the spec declares for its name; the dims follow from them.
    pub fn forward(&self, inputs: Inputs) -> Result<Outputs, Error> {
        let program = &self.inner.program;
        let given = attnc_runtime::bind::in_input_order(program, inputs.0, false)?;
        let names = program.inputs.iter().map(|i| i.name.clone());
        let tensors: Vec<(String, Given)> = names.zip(given).collect();
        if let Some((name, t)) = tensors.iter().find(|(_, t)| t.dtype != DType::F32) {
            return Err(Error::new(
                Code::DeviceTensor,
                format!("tensor `{name}` is {:?}; attnc-burn's kernels take F32 tensors", t.dtype),
            ));
        }
        let device = tensors.first().map(|(_, t)| t.device.clone()).ok_or_else(|| {
            Error::new(Code::TensorFile, "the spec has no input tensor to take a device from".to_string())
        })?;
        if let Some((name, t)) = tensors.iter().find(|(_, t)| t.device != device) {
            return Err(Error::new(
                Code::DeviceTensor,
                format!("tensor `{name}` is on {:?}, the others on {device:?}", t.device),
            ));
        }
        let cube = match device.as_dispatch().clone().inner() {
            DispatchDevice::Cube(d) => d,
            other => {
                return Err(Error::new(
                    Code::DeviceTensor,
                    format!(
                        "{other:?} is not a cubecl device (wgpu, CUDA, ROCm, Metal): attnc launches cubecl kernels"
                    ),
                ))
            }
        };
        let register_tiles = crate::backend::register_tiles(&cube);
        let shapes: Vec<Vec<usize>> = tensors.iter().map(|(_, t)| t.shape.clone()).collect();
        let tracked: Vec<String> = tensors.iter().filter(|(_, t)| t.tracked).map(|(n, _)| n.clone()).collect();
        if tensors.len() > MAX_INPUTS {
            return Err(Error::new(
                Code::TensorFile,
                format!(
                    "{}: attnc-burn runs specs of up to {MAX_INPUTS} inputs, not {}",
                    self.inner.name,
                    tensors.len()
                ),
            ));
        }
        let planned = self.planned(&shapes, &tracked, register_tiles)?;
        let gpu = Gpu::with_client(cube.client(), "burn", register_tiles);
        gpu.check(&planned.forward.plan)?;
        if let Some(g) = &planned.grad {
            gpu.check(&g.forward.plan)?;
            gpu.check(&g.backward)?;
        }
        let call = Call { planned: planned.clone() };
        let inputs = Tensors::new(tensors.into_iter().map(|(_, t)| t.tensor).collect());
        let out = <Dispatch as AttncBackend>::attnc_run(call, inputs);
        let names = program.outputs.iter().map(|(n, _)| n.clone());
        Ok(Outputs(names.zip(out.into_iter().zip(planned.outputs.iter().map(Vec::len))).collect()))
    }

    /// The plan for inputs of `shapes` with `tracked` (inputs autodiff
    /// differentiates) asking for the gradient program's.
    fn planned(&self, shapes: &[Vec<usize>], tracked: &[String], tiles: bool) -> Result<Arc<Planned>, Error> {
        let key = (shapes.to_vec(), tracked.to_vec());
        if let Some(p) = self.inner.plans.lock().expect("plans").get(&key) {
            return Ok(p.clone());
        }
        let program = &self.inner.program;
        let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
        let dims = attnc_runtime::bind::solve_dims(program, &refs, &BTreeSet::new())?;
        // The tensors stay on the device: a read's range may not rest on their entries.
        attnc_runtime::interp::reach::check(program, None, &dims)
            .map_err(|e| Error::new(Code::OutOfRange, format!("{}: {e}", self.inner.name)))?;
        let outputs: Vec<String> = program.outputs.iter().map(|(n, _)| n.clone()).collect();
        let forward = bind(plan::plan(program, &dims).in_dtype(Dtype::F32), program, &outputs);
        let grad = if tracked.is_empty() {
            None
        } else {
            // The inputs differentiated by default, and every other that autodiff tracks.
            let mut wrt = attnc_compiler::grad::differentiable_inputs(program);
            for name in tracked {
                if !wrt.contains(name) {
                    wrt.push(name.clone());
                }
            }
            let grad = attnc_compiler::grad::differentiate(program, &wrt)
                .map_err(|e| Error::new(Code::NoGradient, format!("{}: {e}", self.inner.name)))?;
            let split = attnc_compiler::grad::split(&grad, program.inputs.len(), outputs.len());
            let kept: Vec<String> = split.forward.outputs.iter().map(|(n, _)| n.clone()).collect();
            let forward = bind(plan::plan(&split.forward, &dims).in_dtype(Dtype::F32), program, &kept);
            let backward = plan::plan(&split.backward, &dims).in_dtype(Dtype::F32);
            let sources = (backward.buffers.iter())
                .filter_map(|b| match &b.role {
                    BufferRole::Input { name, .. } => Some((b.id, name)),
                    _ => None,
                })
                .map(|(id, name)| {
                    let at = |names: Vec<String>| names.iter().position(|n| n == name);
                    let cotangents = outputs.iter().map(|o| attnc_compiler::grad::cotangent_name(o)).collect();
                    let source = at(program.inputs.iter().map(|i| i.name.clone()).collect())
                        .map(Source::Input)
                        .or_else(|| at(cotangents).map(Source::Cotangent))
                        .or_else(|| at(kept.clone()).map(Source::Saved))
                        .expect("a backward input is a spec input, a cotangent or a saved output");
                    (id, source)
                })
                .collect();
            let grads = (program.inputs.iter())
                .map(|i| backward.outputs.iter().find(|(n, _)| *n == format!("grad_{}", i.name)).map(|o| o.1))
                .collect();
            Some(GradBound { forward, backward, sources, grads })
        };
        let outputs = (program.outputs.iter())
            .map(|(_, node)| attnc_compiler::ir::concrete(&program.nodes[node.0 as usize].shape, &dims))
            .collect();
        let planned = Arc::new(Planned { forward, grad, inputs: shapes.to_vec(), outputs, register_tiles: tiles });
        self.inner.plans.lock().expect("plans").insert(key, planned.clone());
        Ok(planned)
    }
}

/// A tensor given for a spec input: the dispatch tensor and what the
/// checks read before it is consumed.
struct Given {
    tensor: DispatchTensor,
    shape: Vec<usize>,
    dtype: DType,
    device: Device,
    tracked: bool,
}

/// A call's input tensors by the spec's input names, of any ranks.
#[derive(Default)]
pub struct Inputs(BTreeMap<String, Given>);

impl Inputs {
    pub fn new() -> Inputs {
        Inputs::default()
    }

    /// Binds `tensor` to the spec input `name`.
    pub fn with<const D: usize>(mut self, name: &str, tensor: Tensor<D>) -> Inputs {
        let given = Given {
            shape: tensor.shape().as_slice().to_vec(),
            dtype: tensor.dtype(),
            device: tensor.device(),
            tracked: tensor.is_require_grad(),
            tensor: tensor.into_dispatch(),
        };
        self.0.insert(name.to_string(), given);
        self
    }
}

/// A call's outputs by the spec's output names.
pub struct Outputs(BTreeMap<String, (DispatchTensor, usize)>);

impl Outputs {
    /// Output `name` as a tensor of rank `D`.
    pub fn take<const D: usize>(&mut self, name: &str) -> Result<Tensor<D>, Error> {
        let names: Vec<String> = self.0.keys().cloned().collect();
        let (t, rank) = self.0.remove(name).ok_or_else(|| {
            Error::new(Code::TensorFile, format!("no output `{name}`: the spec's outputs are {}", names.join(", ")))
        })?;
        if rank != D {
            self.0.insert(name.to_string(), (t, rank));
            return Err(Error::new(Code::RankMismatch, format!("output `{name}` has rank {rank}, not {D}")));
        }
        Ok(Tensor::from_dispatch(t))
    }
}
