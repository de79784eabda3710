//! `attnc`: the command-line driver. Parsing arguments, reading and writing
//! files, and printing diagnostics happen here; everything else is a library call.

use attnc::{Backend as PipelineBackend, Compiler, Error as PipelineError, Program};
use attnc_compiler::opt::{self, cost, cost::Mode, cost::Target};
use attnc_compiler::plan;
use attnc_compiler::{render, Code, Compiled, Diagnostic};
use attnc_runtime::io::FileDtype;
use attnc_runtime::{gpu, io, nvidia, RunError, Tensor};
use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod args;
mod sweep;

use args::*;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { files, sizes } => check(&files, &sizes.set),
        Command::Run {
            spec: Spec { file, sizes: Sizes { set } },
            units: Units { compute_units },
            inputs,
            seed,
            out,
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
            let limits = Limits { memory_budget, max_flops, compute_units };
            run(&file, inputs.as_deref(), seed, &out, &set, dtype, opt, backend, check_inputs, limits)
        }
        Command::Compile {
            spec: Spec { file, sizes: Sizes { set } },
            units: Units { compute_units },
            target,
            out,
            optimize,
            dtype,
            grad,
            arch,
        } => {
            let wrt = grad.wrt();
            let arch = match arch {
                ArchArg::Sm80 => nvidia::Arch::Sm80,
                ArchArg::Sm90 => nvidia::Arch::Sm90,
            };
            // Without a device: an H200's SMs for CUDA; WebGPU devices vary.
            let units = compute_units.or(matches!(target, SourceArg::Cuda).then_some(cost::H200.compute_units));
            compile(&file, &set, target, &out, optimize, dtype.dtype(), wrt, arch, units)
        }
        Command::Bench {
            spec: Spec { file, sizes: Sizes { set } },
            units: Units { compute_units: units },
            backend,
            iters,
            warmup,
            target,
            optimize,
            sweep,
            plot,
            dtype,
            grad,
            inputs,
        } => {
            let wrt = grad.wrt().map(<[String]>::to_vec);
            let opts = BenchOpts { backend, iters, warmup, target, optimize, dtype: dtype.dtype(), wrt, inputs, units };
            match sweep {
                None => bench(&file, &set, &opts).map(|(text, _)| print!("{text}")),
                Some(sweep) => bench_sweep(&file, &set, &opts, &sweep, &plot),
            }
        }
        Command::Explain { spec: Spec { file, sizes: Sizes { set } }, target, mode } => {
            explain(&file, &set, target.target(), mode.mode())
        }
        Command::Ir { spec: Spec { file, sizes: Sizes { set } }, grad } => match grad.wrt() {
            None => load(&file, &set).map(|c| print!("{}", c.program.pretty())),
            Some(wrt) => program(&file, &set)
                .and_then(|p| p.gradient(wrt).map_err(|e| report(e.code(), e)))
                .map(|g| print!("{}", g.program().ir().pretty())),
        },
        Command::Grad {
            spec: Spec { file, sizes: Sizes { set } },
            inputs,
            seed,
            cotangents,
            out,
            wrt,
            backend,
            dtype,
        } => {
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
    units: Option<usize>,
) -> Result<(), Failed> {
    let fail = |e: PipelineError| report(e.code(), e);
    let mut p = program(file, set)?;
    if let Some(wrt) = grad {
        p = p.gradient(wrt).map_err(fail)?.program().clone();
    }
    let mut bound = p.sized().map_err(fail)?.in_dtype(dtype).with_compute_units(units);
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
    /// `--compute-units`: split-KV decoding's device size.
    units: Option<usize>,
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
    let mut bound = bound.in_dtype(o.dtype).with_compute_units(o.units);
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
    let result = gpu::bench::bench(&gpu, &bound.plan_on(Some(&gpu)), bound.inputs(), o.warmup, o.iters)
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
    /// `--compute-units`: split-KV decoding's device size.
    compute_units: Option<usize>,
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
    let Limits { memory_budget, max_flops, compute_units } = limits;
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
    bound = bound.in_dtype(dtype).with_compute_units(compute_units);
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
