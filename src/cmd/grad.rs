//! `attnc grad`: the gradient program run on given or drawn inputs and
//! cotangents; the outputs, `grad_<input>` and whatever was drawn are
//! written to one safetensors file.

use super::{fail, not_an_input, program, report, Failed};
use crate::args::GradArgs;
use crate::progress::Ui;
use attnc_runtime::{io, RunError, Tensor};

pub fn grad(a: GradArgs, ui: &Ui) -> Result<(), Failed> {
    let rfail = |e: RunError| report(e.code(), e);
    let (gradient, integers) = {
        let p = program(&a.spec.file, &a.spec.sizes.set, ui)?;
        let _step = ui.step("differentiating");
        (p.gradient(&a.wrt).map_err(fail)?, attnc_runtime::bind::integer_inputs(p.ir()))
    };
    not_an_input(&a.out, &[a.inputs.as_deref(), a.cotangents.as_deref()], "an input file")?;
    // Cotangents are real: no integer tensor among them.
    let cotangents =
        a.cotangents.as_deref().map(|c| io::read_tensors(c, &Default::default())).transpose().map_err(rfail)?;
    let (dtype, file_dtype) = a.dtype.split();
    let bound = match (&a.inputs, a.seed) {
        (Some(path), _) => {
            gradient.bind(io::read_tensors(path, &integers).map_err(rfail)?, cotangents, 0).map_err(fail)?
        }
        (None, Some(s)) => gradient.seeded(s, cotangents).map_err(fail)?,
        (None, None) => unreachable!("clap requires --inputs or --seed"),
    }
    .in_dtype(dtype);
    let results = {
        let _step = ui.step("running the gradient program");
        bound.run(a.backend.pipeline()).map_err(fail)?
    };
    let ir = gradient.program().ir();
    let mut named: Vec<(String, &Tensor)> = ir.outputs.iter().map(|(n, _)| (n.clone(), &results[n])).collect();
    // What was drawn, so that the run can be reproduced: inputs with --seed, cotangents unless given.
    let forward_inputs = gradient.forward().ir().inputs.len();
    for (index, input) in ir.inputs.iter().enumerate() {
        let drawn = if index < forward_inputs { a.seed.is_some() } else { a.cotangents.is_none() };
        if drawn {
            named.push((input.name.clone(), &bound.inputs()[&input.name]));
        }
    }
    io::write_tensors(&a.out, &named, file_dtype).map_err(rfail)?;
    for (name, t) in &named {
        eprintln!("wrote {name} {:?} to {}", t.shape, a.out.display());
    }
    Ok(())
}
