//! Helpers shared by the integration tests.
#![allow(dead_code)]

use attnc_compiler::{compile, render, Compiled, Setting};
use attnc_runtime::{bind, interp, rng::Rng, Tensor};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The names of the shipped specs (`iha`, `odrpo`, …), sorted.
pub fn stdlib_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root().join("stdlib"))
        .expect("stdlib/ exists")
        .map(|e| e.unwrap().path().file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

pub fn stdlib_source(name: &str) -> String {
    std::fs::read_to_string(root().join("stdlib").join(format!("{name}.attn"))).expect("stdlib spec exists")
}

/// Compile a stdlib spec with `--set` pairs; panics with the rendered diagnostics.
pub fn compile_stdlib(name: &str, sets: &[(&str, String)]) -> Compiled {
    let source = stdlib_source(name);
    let settings: Vec<Setting> = sets.iter().map(|(n, v)| Setting { name: n.to_string(), value: v.clone() }).collect();
    compile(&source, &settings)
        .unwrap_or_else(|d| panic!("{name}.attn does not compile:\n{}", render(name, &source, &d)))
}

/// The wgpu executor of this test: on a device of the test's own
/// (`Gpu::wgpu_own_device`), so that tests running side by side compile and
/// launch their kernels side by side, where on one shared device they
/// would take turns on its one thread (lavapipe compiling a kernel is most
/// of a GPU test's time). A finished test's device, its kernels compiled,
/// serves the next test to start.
pub fn wgpu() -> Result<attnc_runtime::gpu::exec::Gpu, attnc_runtime::gpu::exec::GpuError> {
    use attnc_runtime::gpu::exec::Gpu;
    use std::cell::RefCell;
    use std::sync::Mutex;
    static IDLE: Mutex<Vec<Gpu>> = Mutex::new(Vec::new());
    /// This thread's device, back to `IDLE` when the thread (the test) ends.
    struct Held(Option<Gpu>);
    impl Drop for Held {
        fn drop(&mut self) {
            IDLE.lock().unwrap_or_else(|e| e.into_inner()).extend(self.0.take());
        }
    }
    thread_local! {
        static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
    }
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        if held.is_none() {
            let idle = IDLE.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let gpu = match idle {
                Some(g) => g,
                None => Gpu::wgpu_own_device()?,
            };
            *held = Some(Held(Some(gpu)));
        }
        let gpu = held.as_ref().and_then(|h| h.0.as_ref()).expect("held above");
        Ok(Gpu::with_client(gpu.client().clone(), "wgpu", false))
    })
}

/// [`wgpu`], failing the test with a clear message where there is no device.
pub fn needs_wgpu() -> attnc_runtime::gpu::exec::Gpu {
    wgpu().unwrap_or_else(|e| panic!("this test needs a device and found none: {e}"))
}

/// A tensor of uniform values in [-1, 1) drawn from `rng`.
pub fn random(rng: &mut Rng, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    Tensor::new(shape.to_vec(), (0..n).map(|_| 2.0 * rng.unit() - 1.0).collect())
}

/// Run the interpreter on named inputs; outputs by name.
pub fn eval(c: &Compiled, inputs: &BTreeMap<String, Tensor>) -> BTreeMap<String, Tensor> {
    let (tensors, dims) = bind::bind_inputs(&c.program, inputs.clone(), &BTreeSet::new()).expect("inputs bind");
    let outs = interp::evaluate(&c.program, &tensors, &dims);
    c.program.outputs.iter().map(|(n, _)| n.clone()).zip(outs).collect()
}

pub fn named(pairs: Vec<(&str, Tensor)>) -> BTreeMap<String, Tensor> {
    pairs.into_iter().map(|(n, t)| (n.to_string(), t)).collect()
}

/// Asserts ‖a − b‖/‖b‖ ≤ tol and no NaN, with a readable message.
pub fn assert_close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    assert_eq!(a.shape, b.shape, "{what}: shapes differ");
    let e = attnc_runtime::relative_error(&a.data, &b.data);
    assert!(e <= tol, "{what}: relative error {e:e} > {tol:e}");
}

/// Half the distance from 1 to the next value of `dtype`.
pub fn unit_roundoff(dtype: attnc_compiler::plan::Dtype) -> f64 {
    match dtype {
        attnc_compiler::plan::Dtype::F16 | attnc_compiler::plan::Dtype::Tf32 => 2f64.powi(-11),
        attnc_compiler::plan::Dtype::Bf16 => 2f64.powi(-8),
        attnc_compiler::plan::Dtype::F32 => 2f64.powi(-24),
    }
}

/// Largest |x| of `xs` (NaN counts as infinite).
fn max_abs(xs: &[f64]) -> f64 {
    xs.iter().map(|x| if x.is_nan() { f64::INFINITY } else { x.abs() }).fold(0.0, f64::max)
}

fn diff(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x - y).collect()
}

/// FlashAttention's rule for half precision: a kernel storing tensors in
/// `dtype` is as accurate as the format allows when its error against the
/// float64 result `want` is at most twice the error of `same`, a reference
/// that rounds where a `dtype` plan stores (`interp::evaluate_planned`), plus
/// an absolute term of a quarter of the format's unit roundoff times the
/// result's size (two unit roundoffs for results under 64 elements) — both
/// in the largest element and in the 2-norm. Returns why it fails, if it does.
pub fn half_rule(
    got: &[f64],
    want: &[f64],
    same: &[f64],
    dtype: attnc_compiler::plan::Dtype,
) -> Result<String, String> {
    let u = unit_roundoff(dtype);
    if got.iter().any(|v| v.is_nan()) && !want.iter().any(|v| v.is_nan()) {
        return Err("NaN in the kernel's output".into());
    }
    let norm = |x: &[f64]| x.iter().map(|v| v * v).sum::<f64>().sqrt();
    let (e_max, r_max) = (max_abs(&diff(got, want)), max_abs(&diff(same, want)));
    let (e_norm, r_norm) = (norm(&diff(got, want)), norm(&diff(same, want)));
    // A quarter of a unit roundoff of the output's scale; for an output of
    // a few elements, too small a sample for the maxima to follow the
    // reference's, two unit roundoffs (as `check_rows` allows a row).
    let slack = if want.len() < 64 { 2.0 * u } else { u / 4.0 };
    let (abs_max, abs_norm) = (slack * max_abs(want), slack * norm(want));
    let text = format!(
        "max error {e_max:.3e} vs 2 x reference {r_max:.3e} + {abs_max:.3e}; \
         norm error {e_norm:.3e} vs 2 x reference {r_norm:.3e} + {abs_norm:.3e}"
    );
    if e_max <= 2.0 * r_max + abs_max && e_norm <= 2.0 * r_norm + abs_norm {
        Ok(text)
    } else {
        Err(text)
    }
}

/// `text` fails to compile with a diagnostic of `code` whose message
/// contains `message` and whose primary span is exactly the text `at`; the
/// span's start, for further checks.
pub fn assert_points_at(text: &str, code: &str, message: &str, at: &str) -> usize {
    let diags = compile(text, &[]).expect_err(at);
    let d = diags.iter().find(|d| d.code.as_str() == code).unwrap_or_else(|| panic!("{at}: no {code} in {diags:?}"));
    assert!(d.message.contains(message), "{at}: message {:?}", d.message);
    let span = d.primary.as_ref().expect("a located diagnostic").0;
    assert_eq!(&text[span.start..span.end], at, "{message}: points at the wrong text");
    span.start
}

/// The manifest `attnc compile` wrote to `dir`.
pub fn manifest_in(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}
