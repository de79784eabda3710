//! `attnc run`: a spec on given or drawn inputs, within the memory and work
//! limits, its outputs (and drawn inputs) written to one safetensors file.

use super::{fail, not_an_input, program, report, Failed};
use crate::args::RunArgs;
use crate::progress::Ui;
use attnc_compiler::{opt, Code};
use attnc_runtime::{io, RunError, Tensor};

pub fn run(a: RunArgs, ui: &Ui) -> Result<(), Failed> {
    let spec = program(&a.spec.file, &a.spec.sizes.set, ui)?;
    let program = spec.ir();
    let rfail = |e: RunError| report(e.code(), e);
    not_an_input(&a.out, &[a.inputs.as_deref()], "the input file")?;
    let (dtype, file_dtype) = a.dtype.split();
    let backend = a.backend.pipeline();
    let (budget, max_flops) = (a.memory_budget, a.max_flops);
    // Memory and work limits, checked once the sizes are known and before any
    // work (for `--seed`, before drawing the inputs).
    let mut bound = match (&a.inputs, a.seed) {
        (Some(path), _) => {
            let integers = attnc_runtime::bind::integer_inputs(program);
            let bound = spec.bind(io::read_tensors(path, &integers).map_err(rfail)?).map_err(fail)?;
            bound.check_limits(backend, budget, max_flops).map_err(fail)?;
            bound
        }
        (None, Some(s)) => {
            spec.sized().and_then(|b| b.check_limits(backend, budget, max_flops)).map_err(fail)?;
            let _step = ui.step("drawing the inputs");
            spec.seeded(s).map_err(fail)?
        }
        (None, None) => unreachable!("clap requires --inputs or --seed"),
    };
    if a.check_inputs {
        for input in &program.inputs {
            let t = &bound.inputs()[&input.name];
            match t.non_finite() {
                None => eprintln!("input `{}`: all {} values finite", input.name, t.len()),
                Some((first, nan, inf)) => eprintln!(
                    "input `{}`: {nan} NaN and {inf} infinite values (first at flat index {first}); they propagate through the computation per IEEE 754",
                    input.name
                ),
            }
        }
    }
    if a.optimize {
        let _step = ui.step("optimizing");
        let cfg = opt::Config { target: a.target.target(), mode: a.mode.mode(), ..Default::default() };
        let (b, optimized) = bound.optimize_with(&cfg);
        if optimized.hit_limit {
            eprintln!("note: the optimizer stopped early: {}", optimized.stop);
        }
        bound = b;
    }
    bound = bound.in_dtype(dtype).with_compute_units(a.units.compute_units);
    let by_name = {
        let _step = ui.step("running");
        bound.run(backend).map_err(fail)?
    };
    let outputs: Vec<Tensor> = program.outputs.iter().map(|(n, _)| by_name[n].clone()).collect();
    for ((name, _), t) in program.outputs.iter().zip(&outputs) {
        let Some(what) = t.describe_non_finite(name) else { continue };
        if a.finite {
            return Err(report(Code::NonFinite, format_args!("{what} (`--finite`; nothing written)")));
        }
        eprintln!("warning: {what}");
    }
    let mut named: Vec<(String, &Tensor)> = program.outputs.iter().map(|(n, _)| n.clone()).zip(&outputs).collect();
    if a.seed.is_some() {
        named.extend(program.inputs.iter().map(|i| (i.name.clone(), &bound.inputs()[&i.name])));
    }
    io::write_tensors(&a.out, &named, file_dtype).map_err(rfail)?;
    let dims_text: Vec<String> = bound.dims().iter().map(|(k, v)| format!("{k}={v}")).collect();
    for (name, t) in &named[..program.outputs.len()] {
        eprintln!("wrote {name} {:?} ({}) to {}", t.shape, dims_text.join(" "), a.out.display());
    }
    Ok(())
}
