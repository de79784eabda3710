//! `attnc`: the command-line driver. Parsing arguments, reading and writing
//! files, and printing diagnostics happen here; everything else is a library call.

use attnc::{Backend as PipelineBackend, Compiler, Error as PipelineError, Program};
use attnc_compiler::opt::{self, cost, cost::Mode, cost::Target};
use attnc_compiler::plan;
use attnc_compiler::{render, Code, Compiled, Diagnostic};
use attnc_runtime::io::FileDtype;
use attnc_runtime::{bind, gpu, io, nvidia, RunError, Tensor};
use clap::{Parser, Subcommand, ValueEnum};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod sweep;

#[derive(Parser)]
#[command(name = "attnc", version, about = "Compile attention and group-advantage specs (.attn) to kernels", long_about = None)]
#[command(after_help = "See 'attnc help <command>' for more information on a specific command.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check specs for errors without running them
    Check {
        /// The .attn files to check
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Bind a parameter or dim: NAME=VALUE (repeatable)
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
    },
    /// Run a spec on input tensors and write its outputs
    Run {
        /// The .attn file to run
        file: PathBuf,
        /// Read input tensors by name from this safetensors file (f32 or f64)
        #[arg(long, value_name = "IN.safetensors", conflicts_with = "seed", required_unless_present = "seed")]
        inputs: Option<PathBuf>,
        /// Draw deterministic random inputs instead, and write them to --out too
        #[arg(long, value_name = "S")]
        seed: Option<u64>,
        /// Where to write the outputs (safetensors)
        #[arg(long, value_name = "OUT.safetensors")]
        out: PathBuf,
        /// Bind a parameter or dim: NAME=VALUE (repeatable)
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Where to execute
        #[arg(long, value_enum, default_value_t = Backend::Interp)]
        backend: Backend,
        /// Element type: f32 or f64 files; f16 or bf16 kernels (wgpu, cuda) store
        /// every tensor in that type and compute in f32, and the file holds f32;
        /// tf32 stores f32 and multiplies GEMMs on TF32 tensor cores (cuda)
        #[arg(long, value_enum, default_value_t = Dtype::F32)]
        dtype: Dtype,
        /// Run the program the optimizer chooses (see `attnc explain`)
        #[arg(long)]
        optimize: bool,
        /// With --optimize: the machine the cost model predicts for
        #[arg(long, value_enum, default_value_t = TargetArg::H200)]
        target: TargetArg,
        /// With --optimize: inference or training
        #[arg(long, value_enum, default_value_t = ModeArg::Inference)]
        mode: ModeArg,
        /// Report NaN and infinite input values (they propagate per IEEE 754 where the spec allows them)
        #[arg(long)]
        check_inputs: bool,
        /// Refuse runs that would need more memory than this many bytes
        #[arg(long, value_name = "BYTES", default_value_t = bind::DEFAULT_MEMORY_BUDGET)]
        memory_budget: u64,
        /// With --backend interp: refuse runs whose work exceeds this many floating-point operations
        #[arg(long, value_name = "FLOPS", default_value_t = bind::DEFAULT_MAX_FLOPS)]
        max_flops: f64,
    },
    /// Emit kernel source (WGSL or CUDA) and a launch manifest, without a device
    Compile {
        file: PathBuf,
        /// Bind a parameter or dim: NAME=VALUE (repeatable); kernels are specialised to the sizes
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Source language
        #[arg(long, value_enum)]
        target: SourceArg,
        /// Folder for the kernels and manifest.json
        #[arg(long, value_name = "DIR", default_value = "kernels")]
        out: PathBuf,
        /// Compile the program the optimizer chooses for the h200 profile
        #[arg(long)]
        optimize: bool,
        /// Element type the kernels store tensors in (they compute in f32); bf16 is CUDA only;
        /// tf32 stores f32 and multiplies GEMMs on TF32 tensor cores (CUDA only)
        #[arg(long, value_enum, default_value_t = KernelDtype::F32)]
        dtype: KernelDtype,
        /// Emit the gradient program's kernels instead (see `attnc grad`): inputs are the
        /// forward inputs and a cotangent `cot_<output>` per output; outputs the forward
        /// outputs and `grad_<input>`
        #[arg(long)]
        grad: bool,
        /// With --grad: the inputs to differentiate by, comma-separated (default: every continuous input)
        #[arg(long, value_delimiter = ',', value_name = "NAME,...", requires = "grad")]
        wrt: Vec<String>,
        /// CUDA architecture the resource table (registers, spills, occupancy) is computed for,
        /// when NVIDIA's compilers are found (ATTNC_CUDA_TOOLS, CUDA_HOME or PATH)
        #[arg(long, value_enum, default_value_t = ArchArg::Sm90)]
        arch: ArchArg,
    },
    /// Time the generated kernels on a device, next to their roofline
    Bench {
        file: PathBuf,
        /// Bind a parameter or dim: NAME=VALUE (repeatable)
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Where to run
        #[arg(long, value_enum, default_value_t = GpuArg::Wgpu)]
        backend: GpuArg,
        /// Timed runs (the median is reported)
        #[arg(long, default_value_t = 10)]
        iters: usize,
        /// Untimed runs first (the first compiles the kernels)
        #[arg(long, default_value_t = 2)]
        warmup: usize,
        /// Roofline profile (default: cpu for wgpu, h200 for cuda)
        #[arg(long, value_enum)]
        target: Option<TargetArg>,
        /// Bench the program the optimizer chooses for the profile
        #[arg(long)]
        optimize: bool,
        /// Bench at each value of a dim or parameter, one row each: NAME=V1,V2,…
        #[arg(long, value_name = "NAME=V1,V2,...")]
        sweep: Option<String>,
        /// Where a sweep writes its plot of GFLOP/s against the swept value
        #[arg(long, value_name = "FILE.svg", default_value = "sweep.svg")]
        plot: PathBuf,
        /// Element type the kernels store tensors in (they compute in f32); tf32: f32
        /// tensors, GEMMs on TF32 tensor cores
        #[arg(long, value_enum, default_value_t = KernelDtype::F32)]
        dtype: KernelDtype,
        /// Time the gradient program instead (a training step's kernels: the forward, the
        /// log-sum-exp, attention's dQ/dK/dV, the weight and coefficient gradients), on the
        /// spec's own inputs and cotangents drawn with seed 0
        #[arg(long)]
        grad: bool,
        /// With --grad: the inputs to differentiate by, comma-separated (default: every continuous input)
        #[arg(long, value_delimiter = ',', value_name = "NAME,...", requires = "grad")]
        wrt: Vec<String>,
        /// Bench on these inputs (safetensors, by name; dims from their shapes) instead of
        /// inputs drawn with seed 0: a mask that reads its inputs (document ids) needs real data
        #[arg(long, value_name = "IN.safetensors")]
        inputs: Option<PathBuf>,
    },
    /// Optimize a spec for a target and explain the choice
    Explain {
        file: PathBuf,
        /// Bind a parameter or dim: NAME=VALUE (repeatable)
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// The machine the cost model predicts for
        #[arg(long, value_enum, default_value_t = TargetArg::H200)]
        target: TargetArg,
        /// Inference folds weight-only work once; training pays it every call
        #[arg(long, value_enum, default_value_t = ModeArg::Inference)]
        mode: ModeArg,
    },
    /// Print the typed IR a spec lowers to
    Ir {
        file: PathBuf,
        /// Bind a parameter or dim: NAME=VALUE (repeatable)
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Print the gradient program instead (see `attnc grad`)
        #[arg(long)]
        grad: bool,
        /// With --grad: the inputs to differentiate by, comma-separated (default: every continuous input)
        #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
        wrt: Vec<String>,
    },
    /// Gradients of a spec's outputs with respect to its inputs (reverse mode)
    Grad {
        /// The .attn file to differentiate
        file: PathBuf,
        /// Read the forward inputs by name from this safetensors file
        #[arg(long, value_name = "IN.safetensors", conflicts_with = "seed", required_unless_present = "seed")]
        inputs: Option<PathBuf>,
        /// Draw deterministic random inputs and cotangents instead, and write them to --out too
        #[arg(long, value_name = "S")]
        seed: Option<u64>,
        /// Cotangents of the outputs, named like them (default: drawn standard normal with --seed, or seed 0)
        #[arg(long, value_name = "DY.safetensors")]
        cotangents: Option<PathBuf>,
        /// Where to write the outputs and `grad_NAME` for each input differentiated (safetensors)
        #[arg(long, value_name = "OUT.safetensors")]
        out: PathBuf,
        /// The inputs to differentiate by, comma-separated (default: every continuous input)
        #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
        wrt: Vec<String>,
        /// Bind a parameter or dim: NAME=VALUE (repeatable)
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Where to execute: the float64 interpreter, or the gradient program's kernels
        #[arg(long, value_enum, default_value_t = Backend::Interp)]
        backend: Backend,
        /// f32 or f64 output file
        #[arg(long, value_enum, default_value_t = FileArg::F32)]
        dtype: FileArg,
    },
    /// Format specs: canonical text with comments and paragraph breaks kept
    Fmt {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Rewrite each file in place (atomically) instead of printing it
        #[arg(long, conflicts_with = "check")]
        write: bool,
        /// Print nothing; exit 1 when a file is not formatted, naming it
        #[arg(long)]
        check: bool,
    },
    /// Explain an error code, e.g. E0301
    ExplainError { code: String },
}

#[derive(Clone, Copy, ValueEnum)]
enum Backend {
    /// The float64 reference interpreter
    Interp,
    /// Generated kernels on wgpu (Vulkan, Metal, DX12; lavapipe on a CPU)
    Wgpu,
    /// Generated kernels on CUDA (needs the `cuda` build feature and a driver)
    Cuda,
}

#[derive(Clone, Copy, ValueEnum)]
enum TargetArg {
    /// NVIDIA H200 (f32 roofline)
    H200,
    /// A 2-core CPU through lavapipe
    Cpu,
}

impl TargetArg {
    fn target(self) -> Target {
        match self {
            TargetArg::H200 => cost::H200,
            TargetArg::Cpu => cost::CPU,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum GpuArg {
    Wgpu,
    Cuda,
}

#[derive(Clone, Copy, ValueEnum)]
enum ArchArg {
    #[value(name = "sm_80")]
    Sm80,
    #[value(name = "sm_90")]
    Sm90,
}

#[derive(Clone, Copy, ValueEnum)]
enum SourceArg {
    /// WGSL for wgpu/WebGPU
    Wgsl,
    /// CUDA C++ for NVRTC
    Cuda,
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Inference,
    Training,
}

impl ModeArg {
    fn mode(self) -> Mode {
        match self {
            ModeArg::Inference => Mode::Inference,
            ModeArg::Training => Mode::Training,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Dtype {
    F32,
    F64,
    F16,
    Bf16,
    Tf32,
}

impl Dtype {
    /// What the kernels store, and what the file holds.
    fn split(self) -> (plan::Dtype, FileDtype) {
        match self {
            Dtype::F32 => (plan::Dtype::F32, FileDtype::F32),
            Dtype::F64 => (plan::Dtype::F32, FileDtype::F64),
            Dtype::F16 => (plan::Dtype::F16, FileDtype::F32),
            Dtype::Bf16 => (plan::Dtype::Bf16, FileDtype::F32),
            Dtype::Tf32 => (plan::Dtype::Tf32, FileDtype::F32),
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum FileArg {
    F32,
    F64,
}

impl FileArg {
    fn file(self) -> FileDtype {
        match self {
            FileArg::F32 => FileDtype::F32,
            FileArg::F64 => FileDtype::F64,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum KernelDtype {
    F32,
    F16,
    Bf16,
    Tf32,
}

impl KernelDtype {
    fn dtype(self) -> plan::Dtype {
        match self {
            KernelDtype::F32 => plan::Dtype::F32,
            KernelDtype::F16 => plan::Dtype::F16,
            KernelDtype::Bf16 => plan::Dtype::Bf16,
            KernelDtype::Tf32 => plan::Dtype::Tf32,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { files, set } => check(&files, &set),
        Command::Run {
            file,
            inputs,
            seed,
            out,
            set,
            backend,
            dtype,
            optimize,
            target,
            mode,
            check_inputs,
            memory_budget,
            max_flops,
        } => {
            let opt =
                optimize.then(|| opt::Config { target: target.target(), mode: mode.mode(), ..Default::default() });
            let limits = Limits { memory_budget, max_flops };
            run(&file, inputs.as_deref(), seed, &out, &set, dtype, opt, backend, check_inputs, limits)
        }
        Command::Compile { file, set, target, out, optimize, dtype, grad, wrt, arch } => {
            let wrt = grad.then_some(&wrt[..]);
            let arch = match arch {
                ArchArg::Sm80 => nvidia::Arch::Sm80,
                ArchArg::Sm90 => nvidia::Arch::Sm90,
            };
            compile(&file, &set, target, &out, optimize, dtype.dtype(), wrt, arch)
        }
        Command::Bench {
            file,
            set,
            backend,
            iters,
            warmup,
            target,
            optimize,
            sweep,
            plot,
            dtype,
            grad,
            wrt,
            inputs,
        } => {
            let wrt = grad.then_some(wrt);
            let opts = BenchOpts { backend, iters, warmup, target, optimize, dtype: dtype.dtype(), wrt, inputs };
            match sweep {
                None => bench(&file, &set, &opts).map(|(text, _)| print!("{text}")),
                Some(sweep) => bench_sweep(&file, &set, &opts, &sweep, &plot),
            }
        }
        Command::Explain { file, set, target, mode } => explain(&file, &set, target.target(), mode.mode()),
        Command::Ir { file, set, grad: false, .. } => load(&file, &set).map(|c| print!("{}", c.program.pretty())),
        Command::Ir { file, set, grad: true, wrt } => program(&file, &set)
            .and_then(|p| p.gradient(&wrt).map_err(|e| report(e.code(), e)))
            .map(|g| print!("{}", g.program().ir().pretty())),
        Command::Grad { file, inputs, seed, cotangents, out, wrt, set, backend, dtype } => {
            let files = GradFiles { inputs: inputs.as_deref(), cotangents: cotangents.as_deref(), out: &out };
            grad(&file, &set, files, seed, &wrt, backend, dtype.file())
        }
        Command::Fmt { files, write, check } => fmt_files(&files, write, check),
        Command::ExplainError { code } => explain_error(&code),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failed) => ExitCode::FAILURE,
    }
}

/// The command failed and has already said why on stderr.
struct Failed;

fn report(code: Code, message: impl std::fmt::Display) -> Failed {
    eprintln!("error[{}]: {message}", code.as_str());
    Failed
}

fn read_source(file: &Path) -> Result<String, Failed> {
    std::fs::read_to_string(file).map_err(|e| report(Code::Io, format_args!("cannot read `{}`: {e}", file.display())))
}

/// Compile a file through the library pipeline, printing its diagnostics
/// (warnings included).
fn program(file: &Path, set: &[String]) -> Result<Program, Failed> {
    let name = file.display().to_string();
    let compiler = Compiler::new(&name, read_source(file)?);
    let compiled = compiler.settings(set).map_err(|e| report(e.code(), e))?.compile();
    match compiled {
        Ok(p) => {
            eprint!("{}", p.warnings());
            Ok(p)
        }
        Err(PipelineError::Spec { diagnostics, rendered }) => {
            eprint!("{rendered}");
            let errors = diagnostics.iter().filter(|d| d.is_error()).count();
            eprintln!("error: `{name}` has {errors} error{}", if errors == 1 { "" } else { "s" });
            Err(Failed)
        }
        Err(e) => Err(report(e.code(), e)),
    }
}

fn load(file: &Path, set: &[String]) -> Result<Compiled, Failed> {
    program(file, set).map(|p| p.compiled().clone())
}

fn check(files: &[PathBuf], set: &[String]) -> Result<(), Failed> {
    let mut ok = true;
    for f in files {
        ok &= load(f, set).is_ok();
    }
    ok.then_some(()).ok_or(Failed)
}

/// `attnc fmt`: every file is read and parsed before any is written or
/// printed, so a syntax error in one leaves all of them untouched.
fn fmt_files(files: &[PathBuf], write: bool, check: bool) -> Result<(), Failed> {
    let mut formatted = vec![];
    let mut ok = true;
    for file in files {
        let source = read_source(file)?;
        match attnc_grammar::parse(&source) {
            Ok(spec) => formatted.push((file, attnc_grammar::format_spec(&source, &spec), source)),
            Err(e) => {
                let d: Diagnostic = attnc_compiler::syntax_diagnostic(&e);
                eprint!("{}", render(&file.display().to_string(), &source, &[d]));
                ok = false;
            }
        }
    }
    if !ok {
        return Err(Failed);
    }
    for (file, text, source) in formatted {
        if check {
            if text != source {
                eprintln!("{}: not formatted (run `attnc fmt --write {}`)", file.display(), file.display());
                ok = false;
            }
        } else if write {
            if text != source {
                attnc_runtime::io::write_atomic(file, text.as_bytes()).map_err(|e| {
                    eprintln!("error: {e}");
                    Failed
                })?;
            }
        } else {
            print!("{text}");
        }
    }
    ok.then_some(()).ok_or(Failed)
}

fn explain_error(code: &str) -> Result<(), Failed> {
    match Code::parse(code) {
        Some(c) => {
            println!("{}: {}\n\n{}", c.as_str(), c.title(), c.explanation());
            Ok(())
        }
        None => {
            Err(report(Code::BadSetting, format_args!("`{code}` is not an attnc error code; codes look like E0301")))
        }
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

fn compile(
    file: &Path,
    set: &[String],
    target: SourceArg,
    out: &Path,
    optimize: bool,
    dtype: plan::Dtype,
    grad: Option<&[String]>,
    arch: nvidia::Arch,
) -> Result<(), Failed> {
    let fail = |e: PipelineError| report(e.code(), e);
    let mut p = program(file, set)?;
    if let Some(wrt) = grad {
        p = p.gradient(wrt).map_err(fail)?.program().clone();
    }
    let mut bound = p.sized().map_err(fail)?.in_dtype(dtype);
    if optimize {
        bound = bound.optimize(cost::H200, Mode::Inference);
    }
    let target = match target {
        SourceArg::Wgsl => gpu::emit::Target::Wgsl,
        SourceArg::Cuda => gpu::emit::Target::Cuda,
    };
    // Everything is generated before anything is written.
    let (files, mut manifest) = bound.emit(target).map_err(fail)?;
    if target == gpu::emit::Target::Cuda {
        cuda_resources(&files, &mut manifest, arch)?;
    }
    let manifest = serde_json::to_string_pretty(&manifest).expect("the manifest serialises") + "\n";
    std::fs::create_dir_all(out)
        .map_err(|e| report(Code::TensorFile, format_args!("cannot create `{}`: {e}", out.display())))?;
    for (name, text) in files.iter().chain([&("manifest.json".to_string(), manifest)]) {
        io::write_atomic(&out.join(name), text.as_bytes()).map_err(|e| report(e.code(), e))?;
    }
    eprintln!("wrote {} kernels and manifest.json to {}", files.len(), out.display());
    Ok(())
}

/// Compile the CUDA kernels with NVRTC and ptxas where they are found: a
/// resource table on stdout and in the manifest; a kernel they reject is an
/// error (nothing is written). Without them, one line says so.
fn cuda_resources(
    files: &[(String, String)],
    manifest: &mut gpu::emit::Manifest,
    arch: nvidia::Arch,
) -> Result<(), Failed> {
    let tools = match nvidia::Tools::find() {
        Ok(tools) => tools,
        Err(e) => {
            eprintln!("note: no resource table: {e}");
            return Ok(());
        }
    };
    let resources = nvidia::annotate(&tools, files, manifest, arch).map_err(|e| report(Code::Backend, e))?;
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    print!("{}", nvidia::render_table(&names, &resources));
    Ok(())
}

struct BenchOpts {
    backend: GpuArg,
    iters: usize,
    warmup: usize,
    target: Option<TargetArg>,
    optimize: bool,
    dtype: plan::Dtype,
    /// `--grad`: the gradient program, by these inputs.
    wrt: Option<Vec<String>>,
    /// `--inputs`: the tensors to bench on (else drawn with seed 0).
    inputs: Option<PathBuf>,
}

/// One benchmark: the rendered report, and the report.
fn bench(file: &Path, set: &[String], o: &BenchOpts) -> Result<(String, gpu::bench::BenchReport), Failed> {
    let fail = |e: PipelineError| report(e.code(), e);
    let program = program(file, set)?;
    let given = match &o.inputs {
        Some(path) => Some(io::read_tensors(path).map_err(|e| report(e.code(), e))?),
        None => None,
    };
    let bound = match (&o.wrt, given) {
        (None, None) => program.seeded(0).map_err(fail)?,
        (None, Some(inputs)) => program.bind(inputs).map_err(fail)?,
        (Some(wrt), None) => program.gradient(wrt).map_err(fail)?.seeded(0, None).map_err(fail)?,
        (Some(wrt), Some(inputs)) => program.gradient(wrt).map_err(fail)?.bind(inputs, None, 0).map_err(fail)?,
    };
    let mut bound = bound.in_dtype(o.dtype);
    let target = match (o.target, o.backend) {
        (Some(t), _) => t.target(),
        (None, GpuArg::Wgpu) => cost::CPU,
        (None, GpuArg::Cuda) => cost::H200,
    };
    if o.optimize {
        // A gradient program is priced as it runs: as one program.
        bound = bound.optimize(target, Mode::Inference);
    }
    let backend = match o.backend {
        GpuArg::Wgpu => PipelineBackend::Wgpu,
        GpuArg::Cuda => PipelineBackend::Cuda,
    };
    let gpu = backend.device().map_err(fail)?.expect("a kernel backend has a device");
    let result = gpu::bench::bench(&gpu, &bound.plan(), bound.inputs(), o.warmup, o.iters)
        .map_err(|e| report(Code::Backend, e))?;
    Ok((result.render(&target, o.iters), result))
}

/// `--sweep NAME=V1,V2,…`: a benchmark per value, a row each, and a plot.
fn bench_sweep(file: &Path, set: &[String], o: &BenchOpts, sweep: &str, plot: &Path) -> Result<(), Failed> {
    let bad = |why: &str| report(Code::BadSetting, format_args!("--sweep `{sweep}`: {why} (expected NAME=V1,V2,…)"));
    let (name, values) = sweep.split_once('=').ok_or_else(|| bad("no `=`"))?;
    let values: Vec<u64> = values
        .split(',')
        .map(|v| v.trim().parse::<u64>().map_err(|_| bad(&format!("`{v}` is not a whole number"))))
        .collect::<Result<_, _>>()?;
    if name.is_empty() || values.is_empty() {
        return Err(bad("no name or no values"));
    }
    println!("{}", sweep::header(name));
    let mut points = vec![];
    let mut device = String::new();
    for (i, v) in values.iter().enumerate() {
        eprintln!("[{}/{}] {name}={v} ...", i + 1, values.len());
        let mut sets: Vec<String> = set.iter().filter(|s| s.split('=').next() != Some(name)).cloned().collect();
        sets.push(format!("{name}={v}"));
        let (_, r) = bench(file, &sets, o)?;
        device = r.device.clone();
        let p = sweep::Point::of(*v, &r);
        println!("{}", sweep::row(&p));
        points.push(p);
    }
    sweep::plot(plot, name, &device, &points).map_err(|e| report(Code::TensorFile, e))?;
    eprintln!("wrote the plot to {}", plot.display());
    Ok(())
}

fn explain(file: &Path, set: &[String], target: Target, mode: Mode) -> Result<(), Failed> {
    let text = program(file, set)?.explain(target, mode).map_err(|e| report(e.code(), e))?;
    print!("{text}");
    Ok(())
}

/// The files `grad` reads and writes.
struct GradFiles<'a> {
    inputs: Option<&'a Path>,
    cotangents: Option<&'a Path>,
    out: &'a Path,
}

fn grad(
    file: &Path,
    set: &[String],
    files: GradFiles,
    seed: Option<u64>,
    wrt: &[String],
    backend: Backend,
    file_dtype: FileDtype,
) -> Result<(), Failed> {
    let pfail = |e: PipelineError| report(e.code(), e);
    let fail = |e: RunError| report(e.code(), e);
    let gradient = program(file, set)?.gradient(wrt).map_err(pfail)?;
    for path in [files.inputs, files.cotangents].into_iter().flatten() {
        if same_file(path, files.out) {
            let message = format_args!("--out `{}` is an input file; refusing to overwrite it", files.out.display());
            return Err(report(Code::TensorFile, message));
        }
    }
    let cotangents = files.cotangents.map(io::read_tensors).transpose().map_err(fail)?;
    let bound = match (files.inputs, seed) {
        (Some(path), _) => gradient.bind(io::read_tensors(path).map_err(fail)?, cotangents, 0).map_err(pfail)?,
        (None, Some(s)) => gradient.seeded(s, cotangents).map_err(pfail)?,
        (None, None) => unreachable!("clap requires --inputs or --seed"),
    };
    let backend = match backend {
        Backend::Interp => PipelineBackend::Interp,
        Backend::Wgpu => PipelineBackend::Wgpu,
        Backend::Cuda => PipelineBackend::Cuda,
    };
    let results = bound.run(backend).map_err(pfail)?;
    let ir = gradient.program().ir();
    let mut named: Vec<(String, &Tensor)> = ir.outputs.iter().map(|(n, _)| (n.clone(), &results[n])).collect();
    // What was drawn, so that the run can be reproduced: inputs with --seed, cotangents unless given.
    let forward_inputs = gradient.forward().ir().inputs.len();
    for (index, input) in ir.inputs.iter().enumerate() {
        let drawn = if index < forward_inputs { seed.is_some() } else { files.cotangents.is_none() };
        if drawn {
            named.push((input.name.clone(), &bound.inputs()[&input.name]));
        }
    }
    io::write_tensors(files.out, &named, file_dtype).map_err(fail)?;
    for (name, t) in &named {
        eprintln!("wrote {name} {:?} to {}", t.shape, files.out.display());
    }
    Ok(())
}

/// What one `run` may use.
struct Limits {
    memory_budget: u64,
    max_flops: f64,
}

fn run(
    file: &Path,
    inputs: Option<&Path>,
    seed: Option<u64>,
    out: &Path,
    set: &[String],
    dtype: Dtype,
    optimize: Option<opt::Config>,
    backend: Backend,
    check_inputs: bool,
    limits: Limits,
) -> Result<(), Failed> {
    let Limits { memory_budget, max_flops } = limits;
    let spec = self::program(file, set)?;
    let program = spec.ir();
    let fail = |e: RunError| report(e.code(), e);
    if let Some(inp) = inputs {
        if same_file(inp, out) {
            return Err(report(
                Code::TensorFile,
                format_args!("--out `{}` is the input file; refusing to overwrite it", out.display()),
            ));
        }
    }
    let pfail = |e: PipelineError| report(e.code(), e);
    let (dtype, file_dtype) = dtype.split();
    let backend = match backend {
        Backend::Interp => PipelineBackend::Interp,
        Backend::Wgpu => PipelineBackend::Wgpu,
        Backend::Cuda => PipelineBackend::Cuda,
    };
    // Memory and work limits, checked once the sizes are known and before any
    // work (for `--seed`, before drawing the inputs).
    let mut bound = match (inputs, seed) {
        (Some(path), _) => {
            let bound = spec.bind(io::read_tensors(path).map_err(fail)?).map_err(pfail)?;
            bound.check_limits(backend, memory_budget, max_flops).map_err(pfail)?;
            bound
        }
        (None, Some(s)) => {
            spec.sized().and_then(|b| b.check_limits(backend, memory_budget, max_flops)).map_err(pfail)?;
            spec.seeded(s).map_err(pfail)?
        }
        (None, None) => unreachable!("clap requires --inputs or --seed"),
    };
    if check_inputs {
        for input in &program.inputs {
            let t = &bound.inputs()[&input.name];
            let nan = t.data.iter().filter(|v| v.is_nan()).count();
            let inf = t.data.iter().filter(|v| v.is_infinite()).count();
            match t.data.iter().position(|v| !v.is_finite()) {
                None => eprintln!("input `{}`: all {} values finite", input.name, t.len()),
                Some(first) => eprintln!(
                    "input `{}`: {nan} NaN and {inf} infinite values (first at flat index {first}); they propagate through the computation per IEEE 754",
                    input.name
                ),
            }
        }
    }
    if let Some(cfg) = optimize {
        let (b, optimized) = bound.optimize_with(&cfg);
        if optimized.hit_limit {
            eprintln!("note: the optimizer stopped early: {}", optimized.stop);
        }
        bound = b;
    }
    bound = bound.in_dtype(dtype);
    let by_name = bound.run(backend).map_err(pfail)?;
    let outputs: Vec<Tensor> = program.outputs.iter().map(|(n, _)| by_name[n].clone()).collect();
    let mut named: Vec<(String, &Tensor)> = program.outputs.iter().map(|(n, _)| n.clone()).zip(&outputs).collect();
    if seed.is_some() {
        named.extend(program.inputs.iter().map(|i| (i.name.clone(), &bound.inputs()[&i.name])));
    }
    io::write_tensors(out, &named, file_dtype).map_err(fail)?;
    let dims_text: Vec<String> = bound.dims().iter().map(|(k, v)| format!("{k}={v}")).collect();
    for (name, t) in &named[..program.outputs.len()] {
        eprintln!("wrote {name} {:?} ({}) to {}", t.shape, dims_text.join(" "), out.display());
    }
    Ok(())
}
