//! `attnc compile`: kernel source and a launch manifest, written only once
//! everything is generated (and, for CUDA, accepted by NVIDIA's compilers
//! where they are found).

use super::{fail, program, report, Failed};
use crate::args::{ArchArg, CompileArgs, SourceArg};
use crate::progress::Ui;
use attnc_compiler::opt::{cost, cost::Mode};
use attnc_compiler::Code;
use attnc_runtime::{gpu, io, nvidia};

pub fn compile(a: CompileArgs, ui: &Ui) -> Result<(), Failed> {
    let arch = match a.arch {
        ArchArg::Sm80 => nvidia::Arch::Sm80,
        ArchArg::Sm90 => nvidia::Arch::Sm90,
    };
    // Without a device: an H200's SMs for CUDA; WebGPU devices vary.
    let units = a.units.compute_units.or(matches!(a.target, SourceArg::Cuda).then_some(cost::H200.compute_units));
    let mut p = program(&a.spec.file, &a.spec.sizes.set, ui)?;
    if let Some(wrt) = a.grad.wrt() {
        let _step = ui.step("differentiating");
        p = p.gradient(wrt).map_err(fail)?.program().clone();
    }
    let mut bound = p.sized().map_err(fail)?.in_dtype(a.dtype.dtype()).with_compute_units(units);
    if a.optimize {
        let _step = ui.step("optimizing");
        bound = bound.optimize(cost::H200, Mode::Inference);
    }
    let target = match a.target {
        SourceArg::Wgsl => gpu::emit::Target::Wgsl,
        SourceArg::Cuda => gpu::emit::Target::Cuda,
    };
    // Everything is generated before anything is written.
    let (files, mut manifest) = {
        let _step = ui.step("emitting kernels");
        bound.emit(target).map_err(fail)?
    };
    if target == gpu::emit::Target::Cuda {
        let _step = ui.step(format!("compiling {} kernels with NVRTC and ptxas", files.len()));
        cuda_resources(&files, &mut manifest, arch)?;
    }
    let manifest = serde_json::to_string_pretty(&manifest).expect("the manifest serialises") + "\n";
    let out = &a.out;
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
