//! Non-finite constants in score functions — NaN and ±∞, written or folded
//! — emit valid kernels on every target (WGSL has no literal for them: they
//! are written as bit patterns, and `vendor/cubecl-opt` folds no operation
//! into one) and run as the interpreter runs them.

mod common;

use attnc_compiler::plan;
use attnc_runtime::bind;
use attnc_runtime::gpu::emit;
use attnc_runtime::gpu::exec::Gpu;
use attnc_runtime::nvidia::{Arch, Tools};
use common::eval;

/// Score functions holding NaN and ±∞ constants on a branch or bound that
/// the drawn scores never take (|s| is far below 1000 and 1e38): the
/// constants are in the kernels and the outputs are checkable. `1e39` is ∞
/// in f32 (written as bits), `log(-1.0)` and `1.0 / 0.0` constants the
/// kernel compiler would fold.
const EXACT: [&str; 4] = [
    "where(s > 1000.0, log(-1.0), s)",
    "where(s < 1e39, s, 1e39)",
    "where(s < -1000.0, 1.0 / 0.0, s)",
    "where(s > -1e39, s, -1e39)",
];

/// Score functions whose every score is NaN or infinite: their kernels
/// compile and run (what a NaN score does to the softmax is not yet the
/// same on the kernels as on the interpreter, which propagates it).
const EVERYWHERE: [&str; 2] = ["s / 0.0 + log(-1.0)", "s + 1e39"];

/// The spec of attention with score function `score`, and its plan.
fn spec(score: &str) -> (attnc_compiler::Compiled, plan::Plan) {
    let text = format!(
        "spec consts\ndim N = 40\ninput q: [1, 2, N, 8]\ninput k: [1, 2, N, 8]\ninput v: [1, 2, N, 8]\n\
         output o = attention(q, k, v, score = |s, b, h, i, j| {score})\n"
    );
    let c = attnc_compiler::compile(&text, &[])
        .unwrap_or_else(|e| panic!("{}", attnc_compiler::render("consts.attn", &text, &e)));
    let dims = bind::default_dims(&c.program).unwrap();
    let planned = plan::plan(&c.program, &dims);
    (c, planned)
}

/// On wgpu (lavapipe) the kernels with these constants compile and run;
/// where the constants are not taken the outputs equal the interpreter's to
/// 1e-4 of the largest (f32 kernels against float64), element by element,
/// with no NaN.
#[test]
fn non_finite_constants_run_on_wgpu() {
    let gpu = Gpu::wgpu().unwrap_or_else(|e| panic!("this test needs a device: {e}"));
    for score in EXACT.into_iter().chain(EVERYWHERE) {
        let (c, planned) = spec(score);
        let (drawn, _) = bind::generate_inputs(&c.program, 7).unwrap();
        let inputs = c.program.inputs.iter().map(|i| i.name.clone()).zip(drawn).collect();
        let want = eval(&c, &inputs).remove("o").unwrap();
        let got = gpu.run(&planned, &inputs).unwrap_or_else(|e| panic!("`{score}` on wgpu: {e}")).0.remove(0);
        if EVERYWHERE.contains(&score) {
            continue;
        }
        let top = want.data.iter().fold(0f64, |a, x| a.max(x.abs()));
        assert!(top > 0.1, "`{score}`: the reference is not trivial");
        for (at, (g, w)) in got.data.iter().zip(&want.data).enumerate() {
            let same = w.is_finite() && g.is_finite() && (g - w).abs() <= 1e-4 * top + 1e-6;
            assert!(same, "`{score}`: element {at} is {g} on wgpu, {w} on the interpreter");
        }
    }
}

/// The same kernels' CUDA source compiles under NVRTC for sm_80 and sm_90.
#[test]
fn non_finite_constants_compile_for_cuda() {
    let tools = Tools::find().unwrap_or_else(|e| panic!("this test compiles CUDA with NVIDIA's compilers: {e}"));
    for score in EXACT.into_iter().chain(EVERYWHERE) {
        let (_, planned) = spec(score);
        let (files, manifest) = emit::emit(&planned, emit::Target::Cuda).unwrap();
        for ((_, source), l) in files.iter().zip(&manifest.launches) {
            for arch in [Arch::Sm80, Arch::Sm90] {
                tools.compile(&l.entry, source, arch).unwrap_or_else(|e| panic!("`{score}` for {arch:?}: {e}"));
            }
        }
    }
}
