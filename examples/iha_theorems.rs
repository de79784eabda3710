//! The IHA paper's expressivity results run (arXiv 2602.21371; docs/semantics.md
//! §10): each construction is a spec whose weights are set as its proof sets
//! them, and its output is compared with the closed form, on the float64
//! interpreter and on the kernels (wgpu; lavapipe on a CPU):
//!
//! - inclusion: IHA with one-hot mixing is MHA;
//! - strictness: on repeated tokens IHA gives v·tanh(s), where MHA gives v;
//! - the Polynomial task, k = 4 and 9 (linear attention): [X, AX, …, A^(k−1)X]
//!   from H = P = ⌈√k⌉ heads;
//! - CPM-3's workspace, N_max = 9 and 16 (hard attention): every cyclic
//!   shift from H = P = ⌈√N_max⌉ heads, where MHA needs N_max.
//!
//! `cargo run --release --example iha_theorems` (tests/theorems.rs asserts
//! the same).
#![allow(dead_code)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/constructions.rs"]
mod constructions;

use attnc_compiler::plan;
use attnc_runtime::gpu::exec::Gpu;
use attnc_runtime::{bind, relative_error};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = Gpu::wgpu().map_err(|e| format!("no wgpu device: {e}"))?;
    println!("{:<62} {:>12} {:>12}", "construction", "interpreter", "wgpu");
    for c in constructions::constructions() {
        let got = common::eval(&c.spec, &c.inputs).into_values().next().unwrap();
        let (_, dims) = bind::bind_inputs(&c.spec.program, c.inputs.clone(), &Default::default())?;
        let kernels = gpu.run(&plan::plan(&c.spec.program, &dims), &c.inputs)?.0.remove(0);
        let (e, k) = (relative_error(&got.data, &c.want.data), relative_error(&kernels.data, &c.want.data));
        println!("{:<62} {e:>12.1e} {k:>12.1e}", c.what);
        if !(e <= 1e-9 && k <= 1e-5) {
            return Err(format!(
                "{}: relative error {e:e} (interpreter), {k:e} (wgpu) against the closed form",
                c.what
            )
            .into());
        }
    }
    Ok(())
}
