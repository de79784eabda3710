//! The pipeline in one place, for Rust users and for attnc's own CLI and
//! tests: a spec and its settings → a compiled [`Program`] (parameters bound,
//! dims free) → a [`Bound`] program (dims and inputs fixed) → optimized →
//! planned → emitted as kernel source or run on a backend. Every failure is
//! a typed [`Error`].
//!
//! ```no_run
//! use attnc_runtime::pipeline::{Backend, Compiler};
//! let program = Compiler::open("stdlib/iha.attn")?.set("P", 4).set("N", 128).compile()?;
//! let bound = program.seeded(0)?; // inputs drawn from the spec's distributions
//! let y = &bound.run(Backend::Interp)?["y"];
//! # Ok::<(), attnc_runtime::pipeline::Error>(())
//! ```

use crate::cuda::{Cuda, CudaError, Kernels};
use crate::gpu::{emit, exec::Gpu, exec::GpuError};
use crate::{bind, interp, RunError, Tensor};
use attnc_compiler::ir::DimValues;
use attnc_compiler::opt::{self, cost};
use attnc_compiler::plan::{self, Dtype, Plan};
use attnc_compiler::{render, Code, Compiled, Diagnostic, Setting};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Why a step of the pipeline failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec does not compile; `rendered` shows every diagnostic with its
    /// file, line, column and source text.
    #[error("{rendered}")]
    Spec { diagnostics: Vec<Diagnostic>, rendered: String },
    /// A `set` that is not `NAME=VALUE`, or names nothing in the spec.
    #[error("{0}")]
    Setting(String),
    /// Inputs that do not fit the spec: a missing, extra, mis-shaped or
    /// wrong-dtype tensor, a value outside its domain, a size past the limits.
    #[error(transparent)]
    Input(#[from] RunError),
    /// No device, or the device failed.
    #[error(transparent)]
    Device(#[from] GpuError),
    /// The CUDA backend: no driver or device, NVRTC, a launch, memory.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// Kernel source could not be generated.
    #[error("emitting kernel source: {0}")]
    Emit(String),
    /// The spec file could not be read.
    #[error("cannot read `{}`: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// A gradient that does not exist (an input with discrete values, or no input).
    #[error("{}", .0.message)]
    Gradient(attnc_compiler::grad::GradError),
}

impl Error {
    /// The diagnostic code (`attnc explain-error CODE`).
    pub fn code(&self) -> Code {
        match self {
            Error::Spec { diagnostics, .. } => {
                diagnostics.iter().find(|d| d.is_error()).map_or(Code::Internal, |d| d.code)
            }
            Error::Setting(_) => Code::BadSetting,
            Error::Input(e) => e.code(),
            Error::Device(_) => Code::Backend,
            Error::Cuda(e) => e.code(),
            Error::Emit(_) => Code::Internal,
            Error::Read { .. } => Code::Io,
            Error::Gradient(e) => e.code,
        }
    }
}

/// Where a bound program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The float64 reference interpreter.
    Interp,
    /// wgpu: Vulkan, Metal, DX12, WebGPU — or lavapipe on a CPU.
    Wgpu,
    /// CUDA: the emitted kernels through NVRTC and the driver, loaded at run time.
    Cuda,
}

/// A kernel backend's device.
pub enum Device {
    /// cubecl's executor (wgpu here).
    Wgpu(Gpu),
    /// The CUDA launcher of the emitted kernels.
    Cuda(Cuda),
}

impl Backend {
    /// A device for a kernel backend (`None` for the interpreter): CUDA's
    /// device 0 (`CUDA_VISIBLE_DEVICES` picks another).
    pub fn device(self) -> Result<Option<Device>, Error> {
        Ok(match self {
            Backend::Interp => None,
            Backend::Wgpu => Some(Device::Wgpu(Gpu::wgpu()?)),
            Backend::Cuda => Some(Device::Cuda(Cuda::open(0)?)),
        })
    }
}

/// A spec's text and the settings to compile it with.
#[derive(Clone, Debug)]
pub struct Compiler {
    name: String,
    source: String,
    settings: Vec<Setting>,
}

impl Compiler {
    /// A spec given as text; `name` is what diagnostics call it.
    pub fn new(name: impl Into<String>, source: impl Into<String>) -> Compiler {
        Compiler { name: name.into(), source: source.into(), settings: vec![] }
    }

    /// A spec file.
    pub fn open(path: impl AsRef<Path>) -> Result<Compiler, Error> {
        let path = path.as_ref();
        let source =
            std::fs::read_to_string(path).map_err(|source| Error::Read { path: path.to_path_buf(), source })?;
        Ok(Compiler::new(path.display().to_string(), source))
    }

    /// Bind a parameter or a dim (`--set NAME=VALUE`).
    pub fn set(mut self, name: &str, value: impl ToString) -> Compiler {
        self.settings.push(Setting { name: name.to_string(), value: value.to_string() });
        self
    }

    /// Bind `NAME=VALUE` settings as the CLI takes them.
    pub fn settings<S: AsRef<str>>(mut self, sets: &[S]) -> Result<Compiler, Error> {
        for s in sets {
            self.settings.push(Setting::parse(s.as_ref()).map_err(Error::Setting)?);
        }
        Ok(self)
    }

    /// Parse, bind the parameters, lower and check.
    pub fn compile(&self) -> Result<Program, Error> {
        match attnc_compiler::compile(&self.source, &self.settings) {
            Ok(compiled) => Ok(Program { compiler: self.clone(), compiled }),
            Err(diagnostics) => {
                let rendered = render(&self.name, &self.source, &diagnostics);
                Err(Error::Spec { diagnostics, rendered })
            }
        }
    }
}

/// A compiled spec: parameters bound, dims free until inputs fix them.
#[derive(Clone, Debug)]
pub struct Program {
    compiler: Compiler,
    compiled: Compiled,
}

impl Program {
    /// The typed IR.
    pub fn ir(&self) -> &attnc_compiler::ir::Program {
        &self.compiled.program
    }

    /// The compiler's result: the IR, the bound parameters, the warnings.
    pub fn compiled(&self) -> &Compiled {
        &self.compiled
    }

    /// At the default dims (and those set), without inputs: enough to
    /// optimize, plan and emit, not to run.
    pub fn sized(&self) -> Result<Bound, Error> {
        Ok(self.without_inputs(self.default_dims()?))
    }

    /// At `dims`, without inputs.
    fn without_inputs(&self, dims: DimValues) -> Bound {
        Bound {
            original: self.ir().clone(),
            chosen: self.ir().clone(),
            dims,
            inputs: BTreeMap::new(),
            dtype: Dtype::F32,
            compute_units: None,
        }
    }

    /// The optimizer's report at the default dims for `target` in `mode`
    /// (`attnc explain`): the candidates, their costs and the choice.
    pub fn explain(&self, target: cost::Target, mode: cost::Mode) -> Result<String, Error> {
        let dims = self.default_dims()?;
        let cfg = opt::Config { target, mode, explain: true, ..Default::default() };
        Ok(opt::optimize(self.ir(), &dims, &cfg).report(&target, mode, &dims))
    }

    /// The gradient program with respect to the inputs `wrt` (every input
    /// with continuous values when empty): see `compiler::grad`.
    pub fn gradient(&self, wrt: &[String]) -> Result<Gradient, Error> {
        let program = attnc_compiler::grad::differentiate(self.ir(), wrt).map_err(Error::Gradient)?;
        let compiled = Compiled { program, params: self.compiled.params.clone(), warnings: vec![] };
        Ok(Gradient { forward: self.clone(), program: Program { compiler: self.compiler.clone(), compiled } })
    }

    /// Warnings found while compiling, rendered (empty when none).
    pub fn warnings(&self) -> String {
        match self.compiled.warnings.is_empty() {
            true => String::new(),
            false => render(&self.compiler.name, &self.compiler.source, &self.compiled.warnings),
        }
    }

    /// The dims as the defaults and the settings give them.
    pub fn default_dims(&self) -> Result<DimValues, Error> {
        Ok(bind::default_dims(self.ir())?)
    }

    /// Dims named in the settings, which inputs must agree with.
    fn explicit_dims(&self) -> BTreeSet<String> {
        let dims = &self.ir().dims;
        self.compiler.settings.iter().map(|s| s.name.clone()).filter(|n| dims.iter().any(|d| &d.name == n)).collect()
    }

    /// Bind named input tensors: dims from their shapes, every tensor and
    /// value checked against the spec.
    pub fn bind(&self, inputs: BTreeMap<String, Tensor>) -> Result<Bound, Error> {
        let (tensors, dims) = bind::bind_inputs(self.ir(), inputs, &self.explicit_dims())?;
        Ok(self.bound(tensors, dims))
    }

    /// At the dims the inputs' `shapes` (by name) give, without their
    /// values: enough to plan and load kernels for tensors that live on a
    /// device ([`Bound::cuda_kernels`]); nothing checks their values.
    pub fn shaped(&self, shapes: &BTreeMap<String, Vec<usize>>) -> Result<Bound, Error> {
        let mut ordered = Vec::new();
        for input in &self.ir().inputs {
            let shape = shapes
                .get(&input.name)
                .ok_or_else(|| RunError::TensorFile(format!("missing tensor `{}`", input.name)))?;
            ordered.push(shape.as_slice());
        }
        let dims = bind::solve_dims(self.ir(), &ordered, &self.explicit_dims())?;
        Ok(self.without_inputs(dims))
    }

    /// Inputs drawn with `seed` from the spec's distributions at the default dims.
    pub fn seeded(&self, seed: u64) -> Result<Bound, Error> {
        let (tensors, dims) = bind::generate_inputs(self.ir(), seed)?;
        Ok(self.bound(tensors, dims))
    }

    fn bound(&self, tensors: Vec<Tensor>, dims: DimValues) -> Bound {
        let inputs = self.ir().inputs.iter().map(|i| i.name.clone()).zip(tensors).collect();
        Bound {
            original: self.ir().clone(),
            chosen: self.ir().clone(),
            dims,
            inputs,
            dtype: Dtype::F32,
            compute_units: None,
        }
    }
}

/// A spec's gradient program (`attnc grad`): the forward outputs and, from
/// a cotangent `cot_<output>` for each output, `grad_<input>` for each
/// differentiated input.
#[derive(Clone, Debug)]
pub struct Gradient {
    forward: Program,
    program: Program,
}

impl Gradient {
    /// The gradient program, to print, optimize, plan or run like any other.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The gradient program cut for training (`compiler::grad::split`): a
    /// forward that also returns the residuals its backward reads, and a
    /// backward that runs only the gradients' launches on them.
    pub fn training(&self) -> Training {
        let forward = self.forward.ir();
        let split = attnc_compiler::grad::split(self.program.ir(), forward.inputs.len(), forward.outputs.len());
        let program = |ir| Program {
            compiler: self.forward.compiler.clone(),
            compiled: Compiled { program: ir, params: self.forward.compiled.params.clone(), warnings: vec![] },
        };
        Training { forward: program(split.forward), backward: program(split.backward), saved: split.saved }
    }

    /// The forward program it differentiates.
    pub fn forward(&self) -> &Program {
        &self.forward
    }

    /// The forward's inputs drawn with `seed` from the spec's distributions
    /// at the default dims (as `attnc grad --seed` draws them), and the
    /// cotangents as [`Gradient::bind`] takes them.
    pub fn seeded(&self, seed: u64, cotangents: Option<BTreeMap<String, Tensor>>) -> Result<Bound, Error> {
        let drawn = self.forward.seeded(seed)?;
        self.bind(drawn.inputs, cotangents, seed)
    }

    /// Bind the forward inputs (dims from their shapes) and the cotangents,
    /// named like the outputs; without `cotangents`, they are drawn with
    /// `seed` (standard normal, as `--seed` draws `cot_<output>`).
    pub fn bind(
        &self,
        inputs: BTreeMap<String, Tensor>,
        cotangents: Option<BTreeMap<String, Tensor>>,
        seed: u64,
    ) -> Result<Bound, Error> {
        let forward = self.forward.bind(inputs)?;
        let mut all = forward.inputs.clone();
        let outputs = &self.forward.ir().outputs;
        match cotangents {
            Some(mut given) => {
                for (name, _) in outputs {
                    let t = given.remove(name).ok_or_else(|| {
                        RunError::TensorFile(format!(
                            "missing cotangent `{name}` (one tensor per output, named like it)"
                        ))
                    })?;
                    all.insert(attnc_compiler::grad::cotangent_name(name), t);
                }
                if let Some(extra) = given.keys().next() {
                    let names: Vec<&str> = outputs.iter().map(|(n, _)| n.as_str()).collect();
                    let message =
                        format!("unexpected cotangent `{extra}`: the spec's outputs are {}", names.join(", "));
                    return Err(RunError::TensorFile(message).into());
                }
            }
            None => {
                let ir = self.program.ir();
                for (index, input) in ir.inputs.iter().enumerate().skip(self.forward.ir().inputs.len()) {
                    all.insert(input.name.clone(), bind::draw_input(ir, index, &forward.dims, seed));
                }
            }
        }
        self.program.bind(all)
    }
}

/// A training step's two programs ([`Gradient::training`]).
#[derive(Clone, Debug)]
pub struct Training {
    /// The spec's inputs → its outputs, then the residuals `saved_<k>`.
    pub forward: Program,
    /// The spec's inputs, the cotangents `cot_<output>` and the tensors
    /// `saved` names → `grad_<input>` for each differentiated input.
    pub backward: Program,
    /// The forward's outputs the backward reads, by name.
    pub saved: Vec<String>,
}

/// A program at concrete dims with its inputs, optionally optimized.
#[derive(Clone, Debug)]
pub struct Bound {
    original: attnc_compiler::ir::Program,
    chosen: attnc_compiler::ir::Program,
    dims: DimValues,
    inputs: BTreeMap<String, Tensor>,
    dtype: Dtype,
    /// Split-KV decoding for a device of this many compute units
    /// (`Plan::split_kv`); `None`: the device's own count, where it reports one.
    compute_units: Option<usize>,
}

impl Bound {
    /// Plan attention for a device of `units` compute units (SMs): launches
    /// that give fewer than `2 · units` cubes are split over their keys
    /// (`Plan::split_kv`); 0 never splits. Without it, a device's own count
    /// is used where it reports one (CUDA), and nothing is split otherwise.
    pub fn with_compute_units(mut self, units: Option<usize>) -> Bound {
        self.compute_units = units;
        self
    }

    /// Kernels that store every tensor in `dtype` (computing in f32); the
    /// interpreter always computes in float64.
    pub fn in_dtype(mut self, dtype: Dtype) -> Bound {
        self.dtype = dtype;
        self
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    pub fn dims(&self) -> &DimValues {
        &self.dims
    }

    /// The inputs by name (drawn ones included).
    pub fn inputs(&self) -> &BTreeMap<String, Tensor> {
        &self.inputs
    }

    /// The program that runs: the original or the optimizer's choice.
    pub fn program(&self) -> &attnc_compiler::ir::Program {
        &self.chosen
    }

    /// Replace the program by the one the optimizer predicts cheapest on `target` in `mode`.
    pub fn optimize(self, target: cost::Target, mode: cost::Mode) -> Bound {
        self.optimize_with(&opt::Config { target, mode, ..Default::default() }).0
    }

    /// As [`Bound::optimize`] with a full configuration; also returns the report's data.
    pub fn optimize_with(mut self, cfg: &opt::Config) -> (Bound, opt::Optimized) {
        let o = opt::optimize(&self.original, &self.dims, cfg);
        self.chosen = o.chosen.clone();
        (self, o)
    }

    /// The launches that compute it (plain data, no device).
    pub fn plan(&self) -> Plan {
        self.plan_on(None)
    }

    /// The launches that compute it on `gpu` (split for its compute units
    /// unless [`Bound::with_compute_units`] says otherwise).
    pub fn plan_on(&self, gpu: Option<&Gpu>) -> Plan {
        self.plan_for(gpu.and_then(Gpu::compute_units))
    }

    /// The launches split for `units` compute units (unless
    /// [`Bound::with_compute_units`] says otherwise).
    pub fn plan_for(&self, units: Option<usize>) -> Plan {
        let plan = plan::plan(&self.chosen, &self.dims).in_dtype(self.dtype);
        match self.compute_units.or(units) {
            Some(units) if units > 0 => plan.split_kv(units),
            _ => plan,
        }
    }

    /// Kernel source for every launch (file name, text) and the manifest.
    pub fn emit(&self, target: emit::Target) -> Result<(Vec<(String, String)>, emit::Manifest), Error> {
        match (target, self.dtype) {
            (emit::Target::Wgsl, Dtype::Bf16) => {
                return Err(Error::Setting(
                    "--dtype bf16: WGSL has no bf16 type; emit bf16 kernels with `--target cuda`, or use `--dtype f16`"
                        .into(),
                ))
            }
            (emit::Target::Wgsl, Dtype::Tf32) => {
                return Err(Error::Setting(
                    "--dtype tf32: WGSL has no TF32 matrix products; emit tf32 kernels with `--target cuda`, or use `--dtype f32`"
                        .into(),
                ))
            }
            _ => {}
        }
        Self::emit_plan(&self.plan(), target)
    }

    /// Kernel source and manifest of `plan`.
    pub fn emit_plan(plan: &Plan, target: emit::Target) -> Result<(Vec<(String, String)>, emit::Manifest), Error> {
        if let Some((l, what)) = plan.launches.iter().find_map(|l| l.spec.kernel_gap().map(|w| (l, w))) {
            return Err(Error::Device(GpuError::Unsupported { kernel: l.name.clone(), what }));
        }
        emit::emit(plan, target).map_err(Error::Emit)
    }

    /// The kernels of this program loaded on `cuda`, to launch on device
    /// memory and a stream the caller owns ([`Kernels::launch`]); bf16 and
    /// tf32 as [`Bound::in_dtype`] says.
    pub fn cuda_kernels(&self, cuda: &Cuda) -> Result<Kernels, Error> {
        self.check_reads(self.tensors().ok().as_deref())?;
        let plan = self.plan_for(Some(cuda.compute_units()));
        let (files, manifest) = Self::emit_plan(&plan, emit::Target::Cuda)?;
        Ok(cuda.load(&files, manifest)?)
    }

    /// Refuse, before any work, sizes past `memory_budget` bytes (and, on
    /// the interpreter, past `max_flops`).
    pub fn check_limits(&self, backend: Backend, memory_budget: u64, max_flops: f64) -> Result<(), Error> {
        bind::check_budget(&self.original, &self.dims, memory_budget)?;
        if backend == Backend::Interp {
            bind::check_work(&self.original, &self.dims, max_flops)?;
        }
        Ok(())
    }

    /// Run on `backend`; the outputs by name.
    pub fn run(&self, backend: Backend) -> Result<BTreeMap<String, Tensor>, Error> {
        match backend.device()? {
            None if self.dtype != Dtype::F32 => Err(Error::Setting(format!(
                "--dtype {} applies to the kernel backends (wgpu, cuda); the interpreter computes in float64",
                self.dtype
            ))),
            None => self.interpret(),
            Some(Device::Wgpu(gpu)) => self.run_on(&gpu),
            Some(Device::Cuda(cuda)) => self.run_cuda(&cuda),
        }
    }

    /// Run on a CUDA device: the emitted kernels, uploaded inputs, outputs read back.
    pub fn run_cuda(&self, cuda: &Cuda) -> Result<BTreeMap<String, Tensor>, Error> {
        self.tensors()?;
        bind::check_exact_reads(&self.chosen, &self.inputs)?;
        Ok(self.cuda_kernels(cuda)?.run(&self.inputs)?)
    }

    /// Run the kernels on a device one already has.
    pub fn run_on(&self, gpu: &Gpu) -> Result<BTreeMap<String, Tensor>, Error> {
        self.check_reads(Some(&self.tensors()?))?;
        bind::check_exact_reads(&self.chosen, &self.inputs)?;
        let (outputs, _) = gpu.run(&self.plan_on(Some(gpu)), &self.inputs)?;
        Ok(self.name_outputs(outputs))
    }

    /// The float64 interpreter's outputs (the program's meaning).
    pub fn interpret(&self) -> Result<BTreeMap<String, Tensor>, Error> {
        let tensors = self.tensors()?;
        self.check_reads(Some(&tensors))?;
        let outputs = interp::try_evaluate(&self.chosen, &tensors, &self.dims)
            .map_err(|e| RunError::OutOfRange(e.to_string()))?;
        Ok(self.name_outputs(outputs))
    }

    /// Refuse (E0604) a program whose score or mask function may read
    /// outside a captured tensor or leave 32-bit integers for some call
    /// (`interp::reach`), before any backend runs it. The captured tensors'
    /// entries count where `tensors` (the inputs in declaration order) are given.
    pub fn check_reads(&self, tensors: Option<&[Tensor]>) -> Result<(), Error> {
        interp::reach::check(&self.chosen, tensors, &self.dims).map_err(|e| RunError::OutOfRange(e.to_string()))?;
        Ok(())
    }

    /// The inputs in declaration order; an error for a program bound without them.
    pub fn tensors(&self) -> Result<Vec<Tensor>, Error> {
        let named = |i: &attnc_compiler::ir::Input| {
            self.inputs.get(&i.name).cloned().ok_or_else(|| {
                RunError::TensorFile(format!("input `{}` is not bound (bind inputs or draw them with a seed)", i.name))
            })
        };
        Ok(self.original.inputs.iter().map(named).collect::<Result<_, _>>()?)
    }

    fn name_outputs(&self, outputs: Vec<Tensor>) -> BTreeMap<String, Tensor> {
        self.original.outputs.iter().map(|(n, _)| n.clone()).zip(outputs).collect()
    }
}
