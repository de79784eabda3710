//! Helpers shared by the integration tests.
#![allow(dead_code)]

use attnc_compiler::{compile, render, Compiled, Setting};
use attnc_runtime::{bind, interp, rng::Rng, Tensor};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

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
