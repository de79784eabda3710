//! `attnc._attnc`, the native half of the Python package `attnc`
//! (`python/attnc/__init__.py` is the other): the library pipeline
//! (`attnc_runtime::pipeline`) behind a few functions. It is thin by
//! design: it converts arrays (a shape and little-endian bytes) and errors,
//! and calls the pipeline; it computes nothing itself.
//!
//! Errors become the package's exceptions with the CLI's codes and text
//! (`SpecError` carries the rendered diagnostic and the first error's file,
//! line and column); a panic, which would be a bug in attnc, becomes
//! `attnc.Error` rather than crossing into Python.

use attnc_compiler::opt::cost::{self, Mode};
use attnc_compiler::plan::Dtype;
use attnc_runtime::bind::{DEFAULT_MAX_FLOPS, DEFAULT_MEMORY_BUDGET};
use attnc_runtime::cuda::{Cuda, DeviceTensor, Kernels};
use attnc_runtime::gpu::emit::Target as Source;
use attnc_runtime::pipeline::{self, Backend, Compiler, Error, Program, Training};
use attnc_runtime::{nvidia, RunError, Tensor};
use dlpack::{HostArray, OutType};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

mod dlpack;

mod exceptions {
    use pyo3::create_exception;
    use pyo3::exceptions::PyException;
    create_exception!(attnc, Error, PyException, "Any error attnc reports; `.code` is its diagnostic code.");
    create_exception!(attnc, SpecError, Error, "A spec that does not compile: `.code`, `.file`, `.line`, `.column`.");
    create_exception!(attnc, InputError, Error, "Tensors that do not fit the spec: `.code`, `.tensor`.");
    create_exception!(attnc, DeviceError, Error, "No device for the backend, or the device refused or failed.");
    create_exception!(attnc, SettingError, Error, "A parameter, backend, dtype or target that does not apply.");
    create_exception!(
        attnc,
        NonFiniteError,
        Error,
        "Outputs that hold NaN or an infinity, with `finite=True` (E0605)."
    );
}

/// The specs shipped in `stdlib/`, by name, so that the package finds them
/// from any directory.
const STDLIB: &[(&str, &str)] = &[
    ("alibi", include_str!("../../stdlib/alibi.attn")),
    ("diff", include_str!("../../stdlib/diff.attn")),
    ("document", include_str!("../../stdlib/document.attn")),
    ("dr_grpo", include_str!("../../stdlib/dr_grpo.attn")),
    ("gdpo", include_str!("../../stdlib/gdpo.attn")),
    ("gpt_oss", include_str!("../../stdlib/gpt_oss.attn")),
    ("gqa", include_str!("../../stdlib/gqa.attn")),
    ("grpo", include_str!("../../stdlib/grpo.attn")),
    ("iha", include_str!("../../stdlib/iha.attn")),
    ("iha_decode", include_str!("../../stdlib/iha_decode.attn")),
    ("kvcache", include_str!("../../stdlib/kvcache.attn")),
    ("maxrl", include_str!("../../stdlib/maxrl.attn")),
    ("mha", include_str!("../../stdlib/mha.attn")),
    ("mqa", include_str!("../../stdlib/mqa.attn")),
    ("odrpo", include_str!("../../stdlib/odrpo.attn")),
    ("paged", include_str!("../../stdlib/paged.attn")),
    ("prefix_lm", include_str!("../../stdlib/prefix_lm.attn")),
    ("relative_bias", include_str!("../../stdlib/relative_bias.attn")),
    ("rloo", include_str!("../../stdlib/rloo.attn")),
    ("sigmoid", include_str!("../../stdlib/sigmoid.attn")),
    ("sinks", include_str!("../../stdlib/sinks.attn")),
    ("softcap", include_str!("../../stdlib/softcap.attn")),
    ("talking_heads", include_str!("../../stdlib/talking_heads.attn")),
];

/// Run `f`, turning a panic into `attnc.Error`.
fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(exceptions::Error::new_err(format!("internal error (a bug in attnc; please report it): {what}")))
    })
}

/// 1-based line and column (in characters) of byte `at` of `source`, as the diagnostics print them.
fn line_column(source: &str, at: usize) -> (usize, usize) {
    let at = (0..=at.min(source.len())).rev().find(|i| source.is_char_boundary(*i)).unwrap_or(0);
    let before = &source[..at];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (before.matches('\n').count() + 1, before[line_start..].chars().count() + 1)
}

/// The tensor an input error names (its first `quoted` word).
fn named_tensor(message: &str) -> Option<&str> {
    let start = message.find('`')? + 1;
    Some(&message[start..start + message[start..].find('`')?])
}

/// The package's exception for a pipeline error of the spec `name` (text `source`).
fn py_error(py: Python<'_>, e: Error, name: &str, source: &str) -> PyErr {
    let code = e.code().as_str();
    let err = match &e {
        Error::Spec { diagnostics, rendered } => {
            let err = exceptions::SpecError::new_err(rendered.clone());
            let value = err.value(py);
            let first = diagnostics.iter().find(|d| d.is_error()).and_then(|d| d.primary.as_ref());
            let (line, column) = match first {
                Some((span, _)) => {
                    let (l, c) = line_column(source, span.start);
                    (Some(l), Some(c))
                }
                None => (None, None),
            };
            let _ = value.setattr("file", name);
            let _ = value.setattr("line", line);
            let _ = value.setattr("column", column);
            err
        }
        Error::Input(re) => {
            let err = exceptions::InputError::new_err(re.to_string());
            let _ = err.value(py).setattr("tensor", named_tensor(&re.to_string()));
            err
        }
        Error::Device(d) => {
            let err = exceptions::DeviceError::new_err(d.to_string());
            // What the kernels do not compute (the interpreter does): `.gap`.
            if let attnc_runtime::gpu::exec::GpuError::Unsupported { what, .. } = d {
                let _ = err.value(py).setattr("gap", *what);
            }
            err
        }
        Error::Cuda(c) => exceptions::DeviceError::new_err(c.to_string()),
        Error::Setting(s) => exceptions::SettingError::new_err(s.clone()),
        Error::Gradient(g) => exceptions::SettingError::new_err(g.message.clone()),
        Error::Emit(_) | Error::Read { .. } => exceptions::Error::new_err(e.to_string()),
    };
    let _ = err.value(py).setattr("code", code);
    err
}

fn setting_error(message: String) -> PyErr {
    let err = exceptions::SettingError::new_err(message);
    Python::attach(|py| {
        let _ = err.value(py).setattr("code", attnc_compiler::Code::BadSetting.as_str());
    });
    err
}

fn backend(name: &str) -> PyResult<Backend> {
    match name {
        "interp" => Ok(Backend::Interp),
        "wgpu" => Ok(Backend::Wgpu),
        "cuda" => Ok(Backend::Cuda),
        _ => Err(setting_error(format!("unknown backend `{name}`; expected one of interp, wgpu, cuda"))),
    }
}

/// The kernels' storage type (the CLI's `--dtype`; `f64` runs f32 kernels
/// and returns float64).
fn dtype(name: &str) -> PyResult<Dtype> {
    match name {
        "f64" => Ok(Dtype::F32),
        _ => name.parse::<Dtype>().map_err(|m| setting_error(format!("{m}, or f64 (float64 outputs)"))),
    }
}

/// The element type outputs are returned in.
fn out_type(name: &str) -> PyResult<OutType> {
    OutType::parse(name)
        .ok_or_else(|| setting_error(format!("unknown output type `{name}`; expected f64, f32, f16 or bf16")))
}

fn source(name: &str) -> PyResult<Source> {
    match name {
        "wgsl" => Ok(Source::Wgsl),
        "cuda" => Ok(Source::Cuda),
        _ => Err(setting_error(format!("unknown target `{name}`; expected wgsl or cuda"))),
    }
}

/// An input crossing the boundary: its name and any object with `__dlpack__`.
type Input<'py> = (String, Bound<'py, PyAny>);

/// The outputs of `program` by name, in the spec's order, for Python.
fn host_arrays(program: &Program, outputs: &BTreeMap<String, Tensor>, out: OutType) -> Vec<(String, HostArray)> {
    let order = program.ir().outputs.iter().map(|(n, _)| n);
    order.map(|n| (n.clone(), HostArray::new(&outputs[n], out))).collect()
}

/// Run `program` on named `inputs`: bound (dims from the shapes, every
/// value checked), within the limits, optimized if asked, in `dtype`.
fn execute(
    py: Python<'_>,
    program: &Program,
    inputs: BTreeMap<String, Tensor>,
    (backend, dtype): (Backend, Dtype),
    optimize: bool,
) -> Result<BTreeMap<String, Tensor>, Error> {
    let mut bound = program.bind(inputs)?;
    bound.check_limits(backend, DEFAULT_MEMORY_BUDGET, DEFAULT_MAX_FLOPS)?;
    if optimize {
        bound = bound.optimize(cost::H200, Mode::Inference);
    }
    let bound = bound.in_dtype(dtype);
    py.detach(|| bound.run(backend))
}

/// A dim as a polynomial: `(coefficient, [(dim, exponent)])` per term.
type Polynomial = Vec<(i64, Vec<(String, u32)>)>;

/// A tensor's name and its shape as polynomials in the dims.
type ShapeRule = (String, Vec<Polynomial>);

/// How `ir`'s shapes follow from its inputs', for a caller that computes
/// them itself (PyTorch's fake tensors, with symbolic sizes): the inputs'
/// and the outputs' shapes as polynomials in the dims, and the dims that
/// parameters fix.
fn shape_rules(ir: &attnc_compiler::ir::Program) -> (Vec<ShapeRule>, Vec<ShapeRule>, Vec<(String, u64)>) {
    let poly = |d: &attnc_compiler::ir::Dim| -> Polynomial { d.terms().map(|(c, m)| (c, m.to_vec())).collect() };
    let rule = |name: &str, node| (name.to_string(), ir.shape(node).0.iter().map(poly).collect());
    let inputs = ir.inputs.iter().map(|i| rule(&i.name, i.node)).collect();
    let outputs = ir.outputs.iter().map(|(n, id)| rule(n, *id)).collect();
    let fixed = ir.dims.iter().filter_map(|d| Some((d.name.clone(), d.default?))).collect();
    (inputs, outputs, fixed)
}

/// A spec's name (as diagnostics print it) and text, to report errors by.
#[derive(Clone)]
struct SpecText {
    name: String,
    text: String,
}

impl SpecText {
    fn fail(&self, py: Python<'_>, e: Error) -> PyErr {
        py_error(py, e, &self.name, &self.text)
    }

    /// Inputs by name, read through DLPack.
    fn tensors(&self, py: Python<'_>, inputs: Vec<Input<'_>>) -> PyResult<BTreeMap<String, Tensor>> {
        let mut out = BTreeMap::new();
        for (name, object) in inputs {
            match dlpack::import(&name, &object)? {
                Ok(t) => out.insert(name, t),
                Err(message) => return Err(self.fail(py, Error::Input(RunError::TensorFile(message)))),
            };
        }
        Ok(out)
    }
}

/// `bound`'s kernels in `dtype`, compiled for CUDA device `device` and loaded.
fn load_cuda(
    py: Python<'_>,
    spec: &SpecText,
    bound: pipeline::Bound,
    dtype: &str,
    device: usize,
) -> PyResult<CudaKernels> {
    let bound = bound.in_dtype(self::dtype(dtype)?);
    let cuda = Cuda::open(device).map_err(|e| spec.fail(py, Error::Cuda(e)))?;
    let kernels = py.detach(|| bound.cuda_kernels(&cuda)).map_err(|e| spec.fail(py, e))?;
    Ok(CudaKernels { kernels })
}

/// A compiled spec: parameters bound, dims free until inputs fix them.
#[pyclass(module = "attnc._attnc", frozen)]
struct NativeProgram {
    spec: SpecText,
    program: Program,
}

impl NativeProgram {
    fn fail(&self, py: Python<'_>, e: Error) -> PyErr {
        self.spec.fail(py, e)
    }

    fn tensors(&self, py: Python<'_>, inputs: Vec<Input<'_>>) -> PyResult<BTreeMap<String, Tensor>> {
        self.spec.tensors(py, inputs)
    }
}

/// A training step's two programs (`Gradient::training`): the forward
/// returns the outputs and the residuals the backward reads; the backward
/// runs only the gradients' launches.
#[pyclass(module = "attnc._attnc", frozen)]
struct NativeTraining {
    spec: SpecText,
    training: Training,
    /// How many of the forward's outputs are the spec's (the residuals follow).
    outputs: usize,
}

impl NativeTraining {
    /// One of the two programs on `tensors`, with the settings as Python
    /// names them; the outputs and the element type asked for.
    #[allow(clippy::too_many_arguments)] // the Python call's arguments, passed on
    fn execute(
        &self,
        py: Python<'_>,
        program: &Program,
        tensors: Vec<Input<'_>>,
        backend: &str,
        dtype: &str,
        out: &str,
    ) -> PyResult<(BTreeMap<String, Tensor>, OutType)> {
        let (backend, dtype, out) = (self::backend(backend)?, self::dtype(dtype)?, out_type(out)?);
        let inputs = self.spec.tensors(py, tensors)?;
        let outputs = execute(py, program, inputs, (backend, dtype), false).map_err(|e| self.spec.fail(py, e))?;
        Ok((outputs, out))
    }
}

#[pymethods]
impl NativeTraining {
    /// The residuals, in the backward's input order: names of the
    /// forward's outputs (spec outputs, or `saved_<k>`).
    fn saved(&self) -> Vec<String> {
        self.training.saved.clone()
    }

    /// The forward's and the backward's shape rules (`NativeProgram.shape_rules`).
    #[allow(clippy::type_complexity)]
    fn shape_rules(&self) -> ((Vec<ShapeRule>, Vec<ShapeRule>), (Vec<ShapeRule>, Vec<ShapeRule>), Vec<(String, u64)>) {
        let (fi, fo, fixed) = shape_rules(self.training.forward.ir());
        let (bi, bo, _) = shape_rules(self.training.backward.ir());
        ((fi, fo), (bi, bo), fixed)
    }

    /// The forward's (`half = "forward"`) or the backward's kernels at the
    /// dims the inputs' `shapes` (by name; the backward's include the
    /// residuals and cotangents) give, compiled for CUDA device `device`.
    fn cuda_kernels_at(
        &self,
        py: Python<'_>,
        half: &str,
        shapes: BTreeMap<String, Vec<usize>>,
        dtype: &str,
        device: usize,
    ) -> PyResult<CudaKernels> {
        guarded(|| {
            let program = match half {
                "forward" => &self.training.forward,
                "backward" => &self.training.backward,
                _ => return Err(setting_error(format!("unknown half `{half}`; expected forward or backward"))),
            };
            let bound = program.shaped(&shapes).map_err(|e| self.spec.fail(py, e))?;
            load_cuda(py, &self.spec, bound, dtype, device)
        })
    }

    /// The forward: the spec's outputs in element type `out`, then the
    /// residuals in float32 (float64 when `out` is f64), by name.
    fn forward(
        &self,
        py: Python<'_>,
        tensors: Vec<Input<'_>>,
        backend: &str,
        dtype: &str,
        out: &str,
    ) -> PyResult<Vec<(String, HostArray)>> {
        guarded(|| {
            let forward = &self.training.forward;
            let (outputs, out) = self.execute(py, forward, tensors, backend, dtype, out)?;
            let exact = if out == OutType::F64 { OutType::F64 } else { OutType::Storage(Dtype::F32) };
            let order = forward.ir().outputs.iter().enumerate();
            Ok(order
                .map(|(i, (n, _))| (n.clone(), HostArray::new(&outputs[n], if i < self.outputs { out } else { exact })))
                .collect())
        })
    }

    /// The backward: `grad_<input>` for each differentiated input, given the
    /// spec's inputs, the residuals by name and a cotangent `cot_<output>`
    /// per output; returned as `forward` returns the outputs.
    fn backward(
        &self,
        py: Python<'_>,
        tensors: Vec<Input<'_>>,
        backend: &str,
        dtype: &str,
        out: &str,
    ) -> PyResult<Vec<(String, HostArray)>> {
        guarded(|| {
            let backward = &self.training.backward;
            let (grads, out) = self.execute(py, backward, tensors, backend, dtype, out)?;
            Ok(host_arrays(backward, &grads, out))
        })
    }
}

#[pymethods]
impl NativeProgram {
    /// The typed IR, as `attnc ir` prints it.
    fn ir(&self) -> PyResult<String> {
        guarded(|| Ok(self.program.ir().pretty()))
    }

    /// Warnings found while compiling, rendered (empty when none).
    fn warnings(&self) -> PyResult<String> {
        guarded(|| Ok(self.program.warnings()))
    }

    /// `(name, shape, weight, domain)` of each input in declaration order;
    /// a shape's dims are numbers or symbolic products such as `N*P`.
    fn inputs(&self) -> PyResult<Vec<(String, Vec<String>, bool, String)>> {
        guarded(|| {
            let ir = self.program.ir();
            Ok(ir
                .inputs
                .iter()
                .map(|i| {
                    let shape = ir.shape(i.node).0.iter().map(|d| d.to_string()).collect();
                    (i.name.clone(), shape, i.weight, format!("{:?}", i.domain))
                })
                .collect())
        })
    }

    /// `(name, shape)` of each output.
    fn outputs(&self) -> PyResult<Vec<(String, Vec<String>)>> {
        guarded(|| {
            let ir = self.program.ir();
            Ok(ir
                .outputs
                .iter()
                .map(|(n, id)| (n.clone(), ir.shape(*id).0.iter().map(|d| d.to_string()).collect()))
                .collect())
        })
    }

    /// Inputs drawn with `seed` from the spec's distributions at the default dims (float64).
    fn sample(&self, py: Python<'_>, seed: u64) -> PyResult<Vec<(String, HostArray)>> {
        guarded(|| {
            let sized = self.program.sized().map_err(|e| self.fail(py, e))?;
            sized
                .check_limits(Backend::Interp, DEFAULT_MEMORY_BUDGET, DEFAULT_MAX_FLOPS)
                .map_err(|e| self.fail(py, e))?;
            let bound = self.program.seeded(seed).map_err(|e| self.fail(py, e))?;
            Ok(bound.inputs().iter().map(|(n, t)| (n.clone(), HostArray::new(t, OutType::F64))).collect())
        })
    }

    /// Run on `tensors` (any DLPack producer, by input name); the outputs in
    /// the element type `out` (f64, f32, f16 or bf16). An output holding NaN
    /// or an infinity is a `RuntimeWarning` naming it and its first such
    /// index, or with `finite` a `NonFiniteError` (E0605), as `attnc run
    /// [--finite]` reports it.
    #[pyo3(signature = (tensors, backend, dtype, optimize, out, finite=false))]
    #[allow(clippy::too_many_arguments)] // the Python signature
    fn run(
        &self,
        py: Python<'_>,
        tensors: Vec<Input<'_>>,
        backend: &str,
        dtype: &str,
        optimize: bool,
        out: &str,
        finite: bool,
    ) -> PyResult<Vec<(String, HostArray)>> {
        guarded(|| {
            let (backend, dtype, out) = (self::backend(backend)?, self::dtype(dtype)?, out_type(out)?);
            let inputs = self.tensors(py, tensors)?;
            let outputs =
                execute(py, &self.program, inputs, (backend, dtype), optimize).map_err(|e| self.fail(py, e))?;
            for (name, _) in &self.program.ir().outputs {
                let Some(what) = outputs[name].describe_non_finite(name) else { continue };
                if finite {
                    let err = exceptions::NonFiniteError::new_err(format!("{what} (`finite=True`)"));
                    let _ = err.value(py).setattr("code", attnc_compiler::Code::NonFinite.as_str());
                    return Err(err);
                }
                let warning = std::ffi::CString::new(what).expect("messages hold no NUL");
                PyErr::warn(py, &py.get_type::<pyo3::exceptions::PyRuntimeWarning>(), &warning, 1)?;
            }
            Ok(host_arrays(&self.program, &outputs, out))
        })
    }

    /// Gradients (reverse mode): the forward outputs and `grad_<input>` for
    /// each input of `wrt` (when empty: every continuous input but an
    /// `input` a score function reads), given a cotangent per output (named
    /// like it); returned as `run` returns.
    #[pyo3(signature = (tensors, cotangents, wrt, backend, dtype, out))]
    #[allow(clippy::too_many_arguments)] // the Python signature
    fn grad(
        &self,
        py: Python<'_>,
        tensors: Vec<Input<'_>>,
        cotangents: Vec<Input<'_>>,
        wrt: Vec<String>,
        backend: &str,
        dtype: &str,
        out: &str,
    ) -> PyResult<Vec<(String, HostArray)>> {
        guarded(|| {
            let (backend, dtype, out) = (self::backend(backend)?, self::dtype(dtype)?, out_type(out)?);
            let gradient = self.program.gradient(&wrt).map_err(|e| self.fail(py, e))?;
            let (inputs, cotangents) = (self.tensors(py, tensors)?, self.tensors(py, cotangents)?);
            let bound = gradient.bind(inputs, Some(cotangents), 0).map_err(|e| self.fail(py, e))?;
            bound.check_limits(backend, DEFAULT_MEMORY_BUDGET, DEFAULT_MAX_FLOPS).map_err(|e| self.fail(py, e))?;
            let bound = bound.in_dtype(dtype);
            let outputs = py.detach(|| bound.run(backend)).map_err(|e| self.fail(py, e))?;
            Ok(host_arrays(gradient.program(), &outputs, out))
        })
    }

    /// How the shapes follow from the inputs': `(inputs, outputs, fixed)`,
    /// each shape a list of polynomials `[(coefficient, [(dim, exponent)])]`
    /// in the dims, and the dims parameters fix with their values.
    fn shape_rules(&self) -> (Vec<ShapeRule>, Vec<ShapeRule>, Vec<(String, u64)>) {
        shape_rules(self.program.ir())
    }

    /// The training step's programs for the gradients by `wrt` (every
    /// continuous input when empty).
    fn training(&self, py: Python<'_>, wrt: Vec<String>) -> PyResult<NativeTraining> {
        guarded(|| {
            let gradient = self.program.gradient(&wrt).map_err(|e| self.fail(py, e))?;
            let outputs = self.program.ir().outputs.len();
            Ok(NativeTraining { spec: self.spec.clone(), training: gradient.training(), outputs })
        })
    }

    /// Kernel source `[(file, text)]` and the manifest as JSON, at the default dims.
    fn emit(
        &self,
        py: Python<'_>,
        target: &str,
        dtype: &str,
        optimize: bool,
        arch: &str,
    ) -> PyResult<(Vec<(String, String)>, String)> {
        guarded(|| {
            let (target, dtype) = (source(target)?, self::dtype(dtype)?);
            let Some(arch) = nvidia::Arch::parse(arch) else {
                return Err(setting_error(format!("unknown arch `{arch}`; expected sm_80 or sm_90")));
            };
            let mut bound = self.program.sized().map_err(|e| self.fail(py, e))?.in_dtype(dtype);
            if optimize {
                bound = bound.optimize(cost::H200, Mode::Inference);
            }
            let (files, mut manifest) = bound.emit(target).map_err(|e| self.fail(py, e))?;
            // As `attnc compile`: where NVIDIA's compilers are found, each
            // CUDA launch carries its registers, spills and occupancy.
            if target == Source::Cuda {
                if let Ok(tools) = nvidia::Tools::find() {
                    nvidia::annotate(&tools, &files, &mut manifest, arch)
                        .map_err(|e| exceptions::DeviceError::new_err(e.to_string()))?;
                }
            }
            Ok((files, serde_json::to_string_pretty(&manifest).expect("the manifest serialises")))
        })
    }

    /// The program's kernels at its compiled sizes, compiled for CUDA
    /// device `device` and loaded there, to launch on device memory the
    /// caller owns (`CudaKernels.launch`).
    fn cuda_kernels(&self, py: Python<'_>, dtype: &str, device: usize) -> PyResult<CudaKernels> {
        guarded(|| {
            let bound = self.program.sized().map_err(|e| self.fail(py, e))?;
            load_cuda(py, &self.spec, bound, dtype, device)
        })
    }

    /// [`NativeProgram::cuda_kernels`] at the dims the inputs' `shapes`
    /// (by name) give: for tensors that already live on the device.
    fn cuda_kernels_at(
        &self,
        py: Python<'_>,
        shapes: BTreeMap<String, Vec<usize>>,
        dtype: &str,
        device: usize,
    ) -> PyResult<CudaKernels> {
        guarded(|| {
            let bound = self.program.shaped(&shapes).map_err(|e| self.fail(py, e))?;
            load_cuda(py, &self.spec, bound, dtype, device)
        })
    }

    /// The optimizer's report, as `attnc explain` prints it.
    fn explain(&self, py: Python<'_>, target: &str, mode: &str) -> PyResult<String> {
        guarded(|| {
            let Some(t) = cost::TARGETS.iter().find(|t| t.name == target) else {
                let names: Vec<&str> = cost::TARGETS.iter().map(|t| t.name).collect();
                return Err(setting_error(format!("unknown target `{target}`; expected one of {}", names.join(", "))));
            };
            let mode = match mode {
                "inference" => Mode::Inference,
                "training" => Mode::Training,
                _ => return Err(setting_error(format!("unknown mode `{mode}`; expected inference or training"))),
            };
            self.program.explain(*t, mode).map_err(|e| self.fail(py, e))
        })
    }
}

/// A program's kernels loaded on a CUDA device, launched on the caller's
/// device pointers and stream: no host copy, no synchronisation, nothing
/// allocated once the workspace exists.
#[pyclass(module = "attnc._attnc", frozen)]
struct CudaKernels {
    kernels: Kernels,
}

fn device_tensor((ptr, bytes): (u64, u64)) -> DeviceTensor {
    DeviceTensor { ptr, bytes }
}

#[pymethods]
impl CudaKernels {
    /// Bytes of workspace a launch needs.
    fn workspace_bytes(&self) -> u64 {
        self.kernels.workspace_bytes()
    }

    /// The bytes each input and output must hold, by name.
    fn tensor_bytes(&self) -> BTreeMap<String, u64> {
        self.kernels.tensor_bytes()
    }

    /// The manifest, as JSON.
    fn manifest(&self) -> String {
        serde_json::to_string_pretty(self.kernels.manifest()).expect("the manifest serialises")
    }

    /// Allocate attnc's own workspace now, so that launches given none
    /// allocate nothing (before a CUDA graph capture).
    fn reserve_workspace(&self) -> PyResult<()> {
        self.kernels.reserve_workspace().map(|_| ()).map_err(|e| exceptions::DeviceError::new_err(e.to_string()))
    }

    /// Queue every launch on `stream` (a `CUstream` as an int) over
    /// `tensors` (name → (device pointer, bytes)) and `workspace`.
    #[pyo3(signature = (tensors, stream, workspace=None))]
    fn launch(
        &self,
        py: Python<'_>,
        tensors: BTreeMap<String, (u64, u64)>,
        stream: u64,
        workspace: Option<(u64, u64)>,
    ) -> PyResult<()> {
        let tensors = tensors.into_iter().map(|(n, t)| (n, device_tensor(t))).collect();
        // SAFETY: the caller vouches for its pointers (docs/python.md); the
        // sizes are checked against the plan's before anything is queued.
        unsafe { self.kernels.launch(&tensors, workspace.map(device_tensor), stream) }.map_err(|e| {
            let err = exceptions::DeviceError::new_err(e.to_string());
            let _ = err.value(py).setattr("code", e.code().as_str());
            err
        })
    }
}

/// Compile the spec `source` (diagnostics call it `name`) with `settings`.
#[pyfunction]
fn compile(py: Python<'_>, name: String, source: String, settings: Vec<(String, String)>) -> PyResult<NativeProgram> {
    guarded(|| {
        let compiler = settings.iter().fold(Compiler::new(&name, &source), |c, (k, v)| c.set(k, v));
        let program = compiler.compile().map_err(|e| py_error(py, e, &name, &source))?;
        Ok(NativeProgram { spec: SpecText { name, text: source }, program })
    })
}

/// The text of the stdlib spec `name` (`iha`, `odrpo`, ...), if there is one.
#[pyfunction]
fn stdlib(name: &str) -> Option<&'static str> {
    STDLIB.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}

/// The name of the wgpu adapter attnc would run on (a GPU, or Mesa's
/// lavapipe on the CPU), or `None` when there is none.
#[pyfunction]
fn wgpu_adapter(py: Python<'_>) -> Option<String> {
    py.detach(|| attnc_runtime::gpu::exec::Gpu::wgpu().ok().map(|g| g.adapter))
}

/// The stdlib's spec names.
#[pyfunction]
fn stdlib_names() -> Vec<&'static str> {
    STDLIB.iter().map(|(n, _)| *n).collect()
}

#[pymodule]
fn _attnc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<exceptions::Error>())?;
    m.add("SpecError", py.get_type::<exceptions::SpecError>())?;
    m.add("InputError", py.get_type::<exceptions::InputError>())?;
    m.add("DeviceError", py.get_type::<exceptions::DeviceError>())?;
    m.add("SettingError", py.get_type::<exceptions::SettingError>())?;
    m.add("NonFiniteError", py.get_type::<exceptions::NonFiniteError>())?;
    m.add("TENSOR_FILE_CODE", attnc_compiler::Code::TensorFile.as_str())?;
    m.add_class::<NativeProgram>()?;
    m.add_class::<HostArray>()?;
    m.add_class::<CudaKernels>()?;
    m.add_class::<NativeTraining>()?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(stdlib, m)?)?;
    m.add_function(wrap_pyfunction!(stdlib_names, m)?)?;
    m.add_function(wrap_pyfunction!(wgpu_adapter, m)?)?;
    Ok(())
}
