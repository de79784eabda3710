//! The command line: commands, their arguments (shared groups flattened
//! into each command) and the value enums, as clap parses them.

use attnc_compiler::opt::{cost, cost::Mode, cost::Target};
use attnc_compiler::plan;
use attnc_runtime::bind;
use attnc_runtime::io::FileDtype;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "attnc", version, about = "Compile attention and group-advantage specs (.attn) to kernels", long_about = None)]
#[command(after_help = "See 'attnc help <command>' for more information on a specific command.")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// No progress output: no spinner or bar (drawn on a terminal once work lasts 2 s), no
    /// sweep step lines; errors, warnings and results still print
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// A failed kernel launch shows the device runtime's whole error chain
    /// (by default one cause line: the shader compiler's first message)
    #[arg(long, short, global = true)]
    pub verbose: bool,
}

#[derive(Subcommand)]
pub enum Command {
    /// Check specs for errors without running them
    Check(CheckArgs),
    /// Run a spec on input tensors and write its outputs
    Run(RunArgs),
    /// Emit kernel source (WGSL or CUDA) and a launch manifest, without a device
    Compile(CompileArgs),
    /// Time the generated kernels on a device, next to their roofline
    Bench(BenchArgs),
    /// Optimize a spec for a target and explain the choice
    Explain(ExplainArgs),
    /// Print the typed IR a spec lowers to
    Ir(IrArgs),
    /// Gradients of a spec's outputs with respect to its inputs (reverse mode)
    Grad(GradArgs),
    /// Format specs: canonical text with comments and paragraph breaks kept
    Fmt(FmtArgs),
    /// Explain an error code, e.g. E0301
    ExplainError(ExplainErrorArgs),
}

// `attnc check`.
#[derive(Args)]
pub struct CheckArgs {
    /// The .attn files to check
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub sizes: Sizes,
}

// `attnc run`.
#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub spec: Spec,
    #[command(flatten)]
    pub units: Units,
    /// Read input tensors by name from this safetensors file (f32, f64, f16, bf16; i32 or i64 for integer inputs)
    #[arg(long, value_name = "IN.safetensors", conflicts_with = "seed", required_unless_present = "seed")]
    pub inputs: Option<PathBuf>,
    /// Draw deterministic random inputs instead, and write them to --out too
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Where to write the outputs (safetensors)
    #[arg(long, value_name = "OUT.safetensors")]
    pub out: PathBuf,
    /// Where to execute
    #[arg(long, value_enum, default_value_t = Backend::Interp)]
    pub backend: Backend,
    /// Element type: f32 or f64 files; f16 or bf16 kernels (wgpu, cuda) store
    /// every tensor in that type and compute in f32, and the file holds f32;
    /// tf32 stores f32 and multiplies GEMMs on TF32 tensor cores (cuda)
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    pub dtype: Dtype,
    /// Run the program the optimizer chooses (see `attnc explain`)
    #[arg(long)]
    pub optimize: bool,
    /// With --optimize: the machine the cost model predicts for
    #[arg(long, value_enum, default_value_t = TargetArg::H200)]
    pub target: TargetArg,
    /// With --optimize: inference or training
    #[arg(long, value_enum, default_value_t = ModeArg::Inference)]
    pub mode: ModeArg,
    /// Report NaN and infinite input values (they propagate per IEEE 754 where the spec allows them)
    #[arg(long)]
    pub check_inputs: bool,
    /// Refuse (E0605, writing nothing) a run whose outputs hold NaN or an infinity; without it
    /// the run names them on stderr and writes its outputs
    #[arg(long)]
    pub finite: bool,
    /// Refuse runs that would need more memory than this many bytes
    #[arg(long, value_name = "BYTES", default_value_t = bind::DEFAULT_MEMORY_BUDGET)]
    pub memory_budget: u64,
    /// With --backend interp: refuse runs whose work exceeds this many floating-point operations
    #[arg(long, value_name = "FLOPS", default_value_t = bind::DEFAULT_MAX_FLOPS)]
    pub max_flops: f64,
}

// `attnc compile`.
#[derive(Args)]
pub struct CompileArgs {
    #[command(flatten)]
    pub spec: Spec,
    #[command(flatten)]
    pub units: Units,
    /// Source language
    #[arg(long, value_enum)]
    pub target: SourceArg,
    /// Folder for the kernels and manifest.json
    #[arg(long, value_name = "DIR", default_value = "kernels")]
    pub out: PathBuf,
    /// Compile the program the optimizer chooses for the h200 profile
    #[arg(long)]
    pub optimize: bool,
    /// Element type the kernels store tensors in (they compute in f32); bf16 is CUDA only;
    /// tf32 stores f32 and multiplies GEMMs on TF32 tensor cores (CUDA only)
    #[arg(long, value_enum, default_value_t = KernelDtype::F32)]
    pub dtype: KernelDtype,
    #[command(flatten)]
    pub grad: GradProgram,
    /// CUDA architecture the resource table (registers, spills, occupancy) is computed for,
    /// when NVIDIA's compilers are found (ATTNC_CUDA_TOOLS, CUDA_HOME or PATH)
    #[arg(long, value_enum, default_value_t = ArchArg::Sm90)]
    pub arch: ArchArg,
}

// `attnc bench`.
#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub spec: Spec,
    #[command(flatten)]
    pub units: Units,
    /// Where to run
    #[arg(long, value_enum, default_value_t = GpuArg::Wgpu)]
    pub backend: GpuArg,
    /// Timed runs (the median is reported)
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Untimed runs first (the first compiles the kernels)
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Roofline profile (default: cpu for wgpu, h200 for cuda)
    #[arg(long, value_enum)]
    pub target: Option<TargetArg>,
    /// Bench the program the optimizer chooses for the profile
    #[arg(long)]
    pub optimize: bool,
    /// Bench at each value of a dim or parameter, one row each: NAME=V1,V2,…
    #[arg(long, value_name = "NAME=V1,V2,...")]
    pub sweep: Option<String>,
    /// Where a sweep writes its plot of GFLOP/s against the swept value
    #[arg(long, value_name = "FILE.svg", default_value = "sweep.svg")]
    pub plot: PathBuf,
    /// Element type the kernels store tensors in (they compute in f32); tf32: f32
    /// tensors, GEMMs on TF32 tensor cores
    #[arg(long, value_enum, default_value_t = KernelDtype::F32)]
    pub dtype: KernelDtype,
    #[command(flatten)]
    pub grad: GradProgram,
    /// Bench on these inputs (safetensors, by name; dims from their shapes) instead of
    /// inputs drawn with seed 0: a mask that reads its inputs (document ids) needs real data
    #[arg(long, value_name = "IN.safetensors")]
    pub inputs: Option<PathBuf>,
}

impl BenchArgs {
    /// `--warmup` and `--iters`.
    pub fn reps(&self) -> attnc_runtime::gpu::bench::Reps {
        attnc_runtime::gpu::bench::Reps { warmup: self.warmup, iters: self.iters }
    }
}

// `attnc explain`.
#[derive(Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub spec: Spec,
    /// The machine the cost model predicts for
    #[arg(long, value_enum, default_value_t = TargetArg::H200)]
    pub target: TargetArg,
    /// Inference folds weight-only work once; training pays it every call
    #[arg(long, value_enum, default_value_t = ModeArg::Inference)]
    pub mode: ModeArg,
}

// `attnc ir`.
#[derive(Args)]
pub struct IrArgs {
    #[command(flatten)]
    pub spec: Spec,
    #[command(flatten)]
    pub grad: GradProgram,
}

// `attnc grad`.
#[derive(Args)]
pub struct GradArgs {
    #[command(flatten)]
    pub spec: Spec,
    /// Read the forward inputs by name from this safetensors file
    #[arg(long, value_name = "IN.safetensors", conflicts_with = "seed", required_unless_present = "seed")]
    pub inputs: Option<PathBuf>,
    /// Draw deterministic random inputs and cotangents instead, and write them to --out too
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Cotangents of the outputs, named like them (default: drawn standard normal with --seed, or seed 0)
    #[arg(long, value_name = "DY.safetensors")]
    pub cotangents: Option<PathBuf>,
    /// Where to write the outputs and `grad_NAME` for each input differentiated (safetensors)
    #[arg(long, value_name = "OUT.safetensors")]
    pub out: PathBuf,
    /// The inputs to differentiate by, comma-separated (default: every continuous input
    /// but an `input` a score function reads, such as ALiBi's slopes)
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    pub wrt: Vec<String>,
    /// Where to execute: the float64 interpreter, or the gradient program's kernels
    #[arg(long, value_enum, default_value_t = Backend::Interp)]
    pub backend: Backend,
    /// Element type, as `attnc run` takes it: f32 or f64 files; f16 or bf16
    /// gradient kernels (wgpu, cuda) store every tensor in that type and
    /// compute in f32 (the tensor-core backward kernels), and the file holds
    /// f32; tf32 stores f32 and multiplies GEMMs on TF32 tensor cores (cuda)
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    pub dtype: Dtype,
}

// `attnc fmt`.
#[derive(Args)]
pub struct FmtArgs {
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Rewrite each file in place (atomically) instead of printing it
    #[arg(long, conflicts_with = "check")]
    pub write: bool,
    /// Print nothing; exit 1 when a file is not formatted, naming it
    #[arg(long)]
    pub check: bool,
}

// `attnc explain-error`.
#[derive(Args)]
pub struct ExplainErrorArgs {
    pub code: String,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Backend {
    /// The float64 reference interpreter
    Interp,
    /// Generated kernels on wgpu (Vulkan, Metal, DX12; lavapipe on a CPU)
    Wgpu,
    /// Generated kernels on CUDA (needs the `cuda` build feature and a driver)
    Cuda,
}

impl Backend {
    pub fn pipeline(self) -> attnc::Backend {
        match self {
            Backend::Interp => attnc::Backend::Interp,
            Backend::Wgpu => attnc::Backend::Wgpu,
            Backend::Cuda => attnc::Backend::Cuda,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum TargetArg {
    /// NVIDIA H200 (f32 roofline)
    H200,
    /// A 2-core CPU through lavapipe
    Cpu,
}

impl TargetArg {
    pub fn target(self) -> Target {
        match self {
            TargetArg::H200 => cost::H200,
            TargetArg::Cpu => cost::CPU,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum GpuArg {
    Wgpu,
    Cuda,
}

impl GpuArg {
    pub fn pipeline(self) -> attnc::Backend {
        match self {
            GpuArg::Wgpu => attnc::Backend::Wgpu,
            GpuArg::Cuda => attnc::Backend::Cuda,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ArchArg {
    #[value(name = "sm_80")]
    Sm80,
    #[value(name = "sm_90")]
    Sm90,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum SourceArg {
    /// WGSL for wgpu/WebGPU
    Wgsl,
    /// CUDA C++ for NVRTC
    Cuda,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    Inference,
    Training,
}

impl ModeArg {
    pub fn mode(self) -> Mode {
        match self {
            ModeArg::Inference => Mode::Inference,
            ModeArg::Training => Mode::Training,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Dtype {
    F32,
    F64,
    F16,
    Bf16,
    Tf32,
}

impl Dtype {
    /// What the kernels store, and what the file holds.
    pub fn split(self) -> (plan::Dtype, FileDtype) {
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
pub enum KernelDtype {
    F32,
    F16,
    Bf16,
    Tf32,
}

impl KernelDtype {
    pub fn dtype(self) -> plan::Dtype {
        match self {
            KernelDtype::F32 => plan::Dtype::F32,
            KernelDtype::F16 => plan::Dtype::F16,
            KernelDtype::Bf16 => plan::Dtype::Bf16,
            KernelDtype::Tf32 => plan::Dtype::Tf32,
        }
    }
}

/// The spec a command reads and the sizes it binds (one group, flattened
/// into each command that takes a spec).
#[derive(Args)]
pub struct Spec {
    /// The .attn file
    pub file: PathBuf,
    #[command(flatten)]
    pub sizes: Sizes,
}

/// Sizes bound on the command line.
#[derive(Args)]
pub struct Sizes {
    /// Bind a parameter or dim: NAME=VALUE (repeatable; kernels are specialised to the sizes)
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub set: Vec<String>,
}

/// `--grad` and `--wrt` (compile, bench, ir): the gradient program instead
/// of the forward.
#[derive(Args)]
pub struct GradProgram {
    /// Take the gradient program instead of the forward (see `attnc grad`): compile its
    /// kernels, time a training step's kernels (on cotangents drawn with seed 0), or print
    /// its IR. Its inputs are the forward inputs and a cotangent `cot_<output>` per output,
    /// its outputs the forward outputs and `grad_<input>`
    #[arg(long)]
    pub grad: bool,
    /// With --grad: the inputs to differentiate by, comma-separated (default: every continuous
    /// input but an `input` a score function reads, such as ALiBi's slopes)
    #[arg(long, value_delimiter = ',', value_name = "NAME,...", requires = "grad")]
    pub wrt: Vec<String>,
}

impl GradProgram {
    /// The inputs to differentiate by, with `--grad`.
    pub fn wrt(&self) -> Option<&[String]> {
        self.grad.then_some(&self.wrt)
    }
}

/// Split-KV decoding's device size (one group, flattened into `run`,
/// `compile` and `bench`).
#[derive(Args, Clone, Copy)]
pub struct Units {
    /// Compute units (SMs) to fill: an attention launch with fewer than twice as many cubes
    /// (a decode step's few queries against many keys) is split over its keys, with a launch
    /// that combines the chunks (split-KV decoding); 0 never splits. Default: the device's own
    /// count where it reports one (CUDA; lavapipe reports none), 132 (an H200) for
    /// `compile --target cuda`
    #[arg(long, value_name = "N")]
    pub compute_units: Option<usize>,
}
