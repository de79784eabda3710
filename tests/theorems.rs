//! The IHA paper's expressivity results (arXiv 2602.21371; docs/semantics.md
//! §10) as executable checks: each construction's weights set as its proof
//! sets them, its output against the closed form, on the float64
//! interpreter (1e-9), on wgpu's kernels (1e-5), and compiled for CUDA.
//!
//! - inclusion: IHA with one-hot mixing is MHA;
//! - strictness: on repeated tokens IHA gives v·tanh(s), where MHA gives v;
//! - the Polynomial task (k = 4, 9; linear attention): H = P = ⌈√k⌉ heads
//!   over positional features X̂ = [X, I_N] give [X, AX, …, A^(P²−1)X];
//! - CPM-3's workspace (N_max = 9, 16; hard attention): H = P = ⌈√N_max⌉
//!   heads give every cyclic shift of the input, as MHA does with N_max.

mod common;
#[path = "common/constructions.rs"]
mod constructions;

use attnc_compiler::plan::{self, Dtype};
use attnc_runtime::bind;
use attnc_runtime::gpu::emit;
use attnc_runtime::gpu::exec::Gpu;
use attnc_runtime::nvidia::{self, Arch, Tools};
use common::*;
use constructions::*;

/// Checks `c` on the interpreter and on wgpu against its closed form.
fn holds(c: &Construction, gpu: &Gpu) {
    let got = eval(&c.spec, &c.inputs).into_values().next().unwrap();
    assert!(got.data.iter().all(|v| v.is_finite()), "{}: non-finite output", c.what);
    assert_close(&got, &c.want, 1e-9, &format!("{} on the interpreter", c.what));
    let (_, dims) = bind::bind_inputs(&c.spec.program, c.inputs.clone(), &Default::default()).unwrap();
    let p = plan::plan(&c.spec.program, &dims);
    let (mut outs, _) = gpu.run(&p, &c.inputs).unwrap_or_else(|e| panic!("{} on wgpu: {e}", c.what));
    let got = outs.remove(0);
    assert!(got.data.iter().all(|v| v.is_finite()), "{}: non-finite output on wgpu", c.what);
    assert_close(&got, &c.want, 1e-5, &format!("{} on wgpu", c.what));
    eprintln!("{}: holds", c.what);
}

#[test]
fn the_papers_constructions_hold_on_the_interpreter_and_wgpu() {
    let gpu = Gpu::wgpu().unwrap_or_else(|e| panic!("this test needs a device and found none: {e}"));
    let cs = constructions();
    for c in &cs {
        holds(c, &gpu);
    }
    // MHA on repeated tokens is v whatever s: linear where IHA is not.
    let c = &cs[1];
    let mha = compile(
        "mha",
        "spec m\ninput q: [1, 1, 5, 4]\ninput k: [1, 1, 5, 4]\ninput v: [1, 1, 5, 4]\noutput o = attention(q, k, v)\n",
    );
    let mut inputs = c.inputs.clone();
    inputs.retain(|k, _| ["q", "k", "v"].contains(&k.as_str()));
    let got = eval(&mha, &inputs).remove("o").unwrap();
    assert_close(&got, &inputs["v"], 1e-12, "MHA on repeated tokens");
    let e = attnc_runtime::relative_error(&got.data, &c.want.data);
    assert!(e > 0.05, "the strictness witness is not strict: MHA within {e:e} of v·tanh(s)");
}

/// Every kernel of the constructions compiles for CUDA (sm_80 and sm_90)
/// with no spills.
#[test]
fn the_papers_constructions_compile_for_cuda() {
    let tools = Tools::find().unwrap_or_else(|e| panic!("this test compiles CUDA with NVIDIA's compilers: {e}"));
    let mut files = vec![];
    for c in constructions() {
        let (_, dims) = bind::bind_inputs(&c.spec.program, c.inputs.clone(), &Default::default()).unwrap();
        let p = plan::plan(&c.spec.program, &dims).in_dtype(Dtype::F32);
        let (emitted, manifest) = emit::emit(&p, emit::Target::Cuda).expect("CUDA emission");
        for ((_, source), l) in emitted.into_iter().zip(manifest.launches) {
            files.push((c.what.clone(), l.entry.clone(), source, l.threads(), l.shared_memory_bytes as u32));
        }
    }
    let sources: Vec<_> = files.iter().map(|f| (f.1.as_str(), f.2.as_str(), f.3, f.4)).collect();
    assert!(sources.len() >= 8, "only {} kernels", sources.len());
    for arch in Arch::ALL {
        let rs = nvidia::check_sources(&tools, &sources, arch).unwrap_or_else(|e| panic!("{e}"));
        for (f, r) in files.iter().zip(rs) {
            assert!(r.spill_stores == 0 && r.spill_loads == 0, "{} {} {}: spills", f.0, f.1, arch.name());
        }
    }
}
