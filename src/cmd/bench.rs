//! `attnc bench`: time the generated kernels on a device next to their
//! roofline and the library baselines; `--sweep` benches at each value of a
//! dim, a row each, and plots them (`crate::sweep`).

use super::sweep;
use super::{fail, program, report, Failed};
use crate::args::{BenchArgs, GpuArg};
use crate::progress::Ui;
use attnc_compiler::opt::{cost, cost::Mode};
use attnc_compiler::Code;
use attnc_runtime::gpu::emit::Target as Source;
use attnc_runtime::pipeline::{Bound, Compiler, Device};
use attnc_runtime::{gpu, io};

pub fn bench(a: BenchArgs, ui: &Ui) -> Result<(), Failed> {
    match &a.sweep {
        None => once(&a, &a.spec.sizes.set, ui).map(|(text, _)| print!("{text}")),
        Some(values) => sweep(&a, values, ui),
    }
}

/// One benchmark: the rendered report, and the report.
fn once(a: &BenchArgs, set: &[String], ui: &Ui) -> Result<(String, gpu::bench::BenchReport), Failed> {
    let program = program(&a.spec.file, set, ui)?;
    let given = match &a.inputs {
        Some(path) => {
            let integers = attnc_runtime::bind::integer_inputs(program.ir());
            Some(io::read_tensors(path, &integers).map_err(|e| report(e.code(), e))?)
        }
        None => None,
    };
    let bound = match (a.grad.wrt(), given) {
        (None, None) => program.seeded(0).map_err(fail)?,
        (None, Some(inputs)) => program.bind(inputs).map_err(fail)?,
        (Some(wrt), None) => program.gradient(wrt).map_err(fail)?.seeded(0, None).map_err(fail)?,
        (Some(wrt), Some(inputs)) => program.gradient(wrt).map_err(fail)?.bind(inputs, None, 0).map_err(fail)?,
    };
    let mut bound = bound.in_dtype(a.dtype.dtype()).with_compute_units(a.units.compute_units);
    let target = match (a.target, a.backend) {
        (Some(t), _) => t.target(),
        (None, GpuArg::Wgpu) => cost::CPU,
        (None, GpuArg::Cuda) => cost::H200,
    };
    if a.optimize {
        // A gradient program is priced as it runs: as one program.
        let _step = ui.step("optimizing");
        bound = bound.optimize(target, Mode::Inference);
    }
    bound.check_reads(Some(&bound.tensors().map_err(fail)?)).map_err(fail)?;
    let gpu = match a.backend.pipeline().device().map_err(fail)?.expect("a kernel backend has a device") {
        Device::Wgpu(gpu) => gpu,
        Device::Cuda(cuda) => {
            let plan = bound.plan_for(Some(cuda.compute_units()));
            let (files, manifest) = Bound::emit_plan(&plan, Source::Cuda).map_err(fail)?;
            let _step = ui.step(format!("timing {} launches on {}", plan.launches.len(), cuda.name()));
            let result = attnc_runtime::cuda::bench(&cuda, &plan, &files, manifest, bound.inputs(), a.warmup, a.iters)
                .map_err(|e| report(e.code(), e))?;
            return Ok((result.render(&target, a.iters), result));
        }
    };
    let plan = bound.plan_on(Some(&gpu));
    let _step = ui.step(format!(
        "timing {} launches: {} warm-up and {} timed runs, then the baselines",
        plan.launches.len(),
        a.warmup,
        a.iters
    ));
    let mut result = gpu::bench::bench(&gpu, &plan, bound.inputs(), a.reps()).map_err(|e| report(Code::Backend, e))?;
    if let Some(p) = gpu::bench::plain_attention_source(&plan) {
        let ours = result.kernels.iter().find(|k| k.name == p.launch).map(|k| k.median);
        let plain = plain_attention(&p.source, &bound, &gpu, a);
        let gpu::bench::PlainSource { launch, what, beyond, .. } = p;
        result.plain = ours.map(|ours| gpu::bench::PlainBaseline { launch, ours, plain, what, beyond });
    }
    Ok((result.render(&target, a.iters), result))
}

/// The plain attention kernel's median time on `gpu` for `source` (a spec
/// of plain attention alone, `plain_attention_source`), in the benchmark's
/// storage, on inputs drawn from its distributions.
fn plain_attention(source: &str, bench: &Bound, gpu: &gpu::exec::Gpu, a: &BenchArgs) -> Result<f64, String> {
    let program = Compiler::new("plain attention", source).compile().map_err(|e| e.to_string())?;
    let bound = program.seeded(0).map_err(|e| e.to_string())?.in_dtype(bench.dtype());
    let plan = bound.plan_on(Some(gpu));
    gpu::bench::time_plain_attention(gpu, &plan, bound.inputs(), a.reps())
}

/// `--sweep NAME=V1,V2,…`: a benchmark per value, a row each, and a plot.
fn sweep(a: &BenchArgs, sweep: &str, ui: &Ui) -> Result<(), Failed> {
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
    let bar = ui.bar(values.len() as u64, format!("sweeping {name}"));
    for (i, v) in values.iter().enumerate() {
        ui.note(&bar, &format!("[{}/{}] {name}={v} ...", i + 1, values.len()));
        bar.set_message(format!("{name}={v}"));
        let mut sets: Vec<String> =
            a.spec.sizes.set.iter().filter(|s| s.split('=').next() != Some(name)).cloned().collect();
        sets.push(format!("{name}={v}"));
        let (_, r) = once(a, &sets, &ui.under_bar())?;
        device = r.device.clone();
        let p = sweep::Point::of(*v, &r);
        println!("{}", sweep::row(&p));
        points.push(p);
        bar.inc();
    }
    drop(bar);
    sweep::plot(&a.plot, name, &device, &points).map_err(|e| report(Code::TensorFile, e))?;
    eprintln!("wrote the plot to {}", a.plot.display());
    Ok(())
}
