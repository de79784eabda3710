//! Generated kernels executed for real, compared with the float64
//! interpreter: one generic body per check, instantiated for each storage type
//! by `backend_tests!` on wgpu (lavapipe in CI), in f32 and f16; the CUDA
//! backend, which launches the emitted text, is checked on a GPU by
//! `bench/device/run.sh`. f32
//! kernels are held to a relative error of `TOL`; half-precision kernels to
//! FlashAttention's rule against a same-dtype reference (`common::half_rule`).
//! A missing device or type fails the test with a clear message; nothing is
//! skipped. By kernel family: `forward.rs`, `gemm.rs`, `gradients.rs`,
//! `precision.rs` (TF32, half precision, fragments), `programs.rs`
//! (precompiled WGSL, level decompositions), `weights.rs` (attention
//! weights beyond the softmax); this file holds the shared
//! checks and `backend_tests!`.

#[path = "../common/mod.rs"]
mod common;
mod forward;
mod gemm;
mod gradients;
mod precision;
mod programs;
mod weights;

use attnc_compiler::ir::{DimValues, Program};
use attnc_compiler::opt::{self, Config};
use attnc_compiler::plan::{self, Dtype, Plan};
use attnc_runtime::gpu::emit;
use attnc_runtime::gpu::exec::{Gpu, GpuError};
use attnc_runtime::rng::Rng;
use attnc_runtime::{bind, interp, Tensor};
use common::*;
use forward::*;
use gemm::*;
use gradients::*;
use programs::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Relative error bound for f32 kernels against the float64 interpreter.
const TOL: f64 = 1e-4;

type Make = fn() -> Result<Gpu, GpuError>;

/// A device and the type its kernels store tensors in.
struct Dev {
    gpu: Gpu,
    dtype: Dtype,
}

impl std::ops::Deref for Dev {
    type Target = Gpu;
    fn deref(&self) -> &Gpu {
        &self.gpu
    }
}

impl Dev {
    fn plan(&self, program: &Program, dims: &DimValues) -> Plan {
        plan_in(self.dtype, program, dims)
    }

    /// The same dtype on a device configured by `f`.
    fn map(self, f: impl FnOnce(Gpu) -> Gpu) -> Dev {
        Dev { gpu: f(self.gpu), dtype: self.dtype }
    }

    fn same(&self, program: &Program, tensors: &[Tensor], dims: &DimValues) -> Option<Vec<Tensor>> {
        (self.dtype != Dtype::F32).then(|| same_reference(self.dtype, program, tensors, dims))
    }
}

fn plan_in(dtype: Dtype, program: &Program, dims: &DimValues) -> Plan {
    plan::plan(program, dims).in_dtype(dtype)
}

/// The same-dtype reference for half precision and TF32: rounded where the
/// `dtype` plan of `program` stores values.
fn same_reference(dtype: Dtype, program: &Program, tensors: &[Tensor], dims: &DimValues) -> Vec<Tensor> {
    interp::evaluate_planned(program, &plan_in(dtype, program, dims), tensors)
}

fn device(make: Make, dtype: Dtype) -> Dev {
    let gpu = make().unwrap_or_else(|e| panic!("this test needs a device and found none: {e}"));
    gpu.supports(dtype).unwrap_or_else(|e| panic!("this test needs {dtype} kernels: {e}"));
    Dev { gpu, dtype }
}

/// `got` against the float64 `want`: within `TOL` relative error in f32;
/// for half precision, within FlashAttention's rule against `same`.
fn check_close(dtype: Dtype, got: &[f64], want: &[f64], same: Option<&[f64]>, what: &str) {
    assert!(got.iter().all(|v| !v.is_nan()), "{what}: NaN in the output");
    match same {
        None => {
            let e = attnc_runtime::relative_error(got, want);
            assert!(e <= TOL, "{what}: relative error {e:e} > {TOL:e}");
        }
        Some(same) => {
            half_rule(got, want, same, dtype).unwrap_or_else(|e| panic!("{what} ({dtype}): {e}"));
        }
    }
}

/// Draws the spec's inputs with its own distributions at the bound sizes.
fn seeded(c: &attnc_compiler::Compiled, seed: u64) -> BTreeMap<String, Tensor> {
    let (tensors, _) = bind::generate_inputs(&c.program, seed).expect("dims have defaults");
    c.program.inputs.iter().map(|i| i.name.clone()).zip(tensors).collect()
}

/// Runs `c` on the device (optionally its optimized program) and on the
/// interpreter; asserts every output agrees.
fn check_spec(dev: &Dev, c: &attnc_compiler::Compiled, inputs: &BTreeMap<String, Tensor>, optimize: bool, what: &str) {
    let (tensors, dims) = bind::bind_inputs(&c.program, inputs.clone(), &Default::default()).expect("inputs bind");
    let want = interp::evaluate(&c.program, &tensors, &dims);
    let program =
        if optimize { opt::optimize(&c.program, &dims, &Config::default()).chosen } else { c.program.clone() };
    let same = dev.same(&program, &tensors, &dims);
    let (got, _) = dev.run(&dev.plan(&program, &dims), inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
    for (i, ((name, _), (g, w))) in c.program.outputs.iter().zip(got.iter().zip(&want)).enumerate() {
        assert_eq!(g.shape, w.shape, "{what}: output {name} shape");
        let same = same.as_ref().map(|s| &s[i].data[..]);
        check_close(dev.dtype, &g.data, &w.data, same, &format!("{what}: output {name}"));
    }
}

fn sets(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

macro_rules! backend_tests {
    ($name:ident, $make:expr, $dtype:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn stdlib_specs_match_the_interpreter() {
                stdlib_specs(&device($make, $dtype));
            }

            #[test]
            fn attention_size_tier_matches_the_interpreter_row_by_row() {
                size_tier(&device($make, $dtype));
            }

            #[test]
            fn register_tiled_attention_matches_the_interpreter() {
                register_tiles($make, $dtype);
            }

            #[test]
            fn stdlib_specs_at_real_sizes_match_the_interpreter() {
                stdlib_at_real_sizes(&device($make, $dtype));
            }

            #[test]
            fn head_mixing_matches_the_interpreter() {
                head_mixing($make, $dtype);
            }

            #[test]
            fn narrower_plane_widths_match_the_interpreter() {
                plane_widths($make, $dtype);
            }

            #[test]
            fn gemms_read_directly_match_the_interpreter() {
                gemms($make, $dtype, Gemms::Direct);
            }

            #[test]
            fn gemms_staged_match_the_interpreter() {
                gemms($make, $dtype, Gemms::Staged);
            }

            #[test]
            fn prepared_weights_serve_many_calls() {
                prepared_calls(&device($make, $dtype));
            }

            #[test]
            fn grids_past_65535_cubes_fold_and_match_the_interpreter() {
                folded_grids(&device($make, $dtype));
            }

            #[test]
            fn launches_past_a_drivers_loop_limit_are_refused_or_right() {
                loop_limit(&device($make, $dtype));
            }

            #[test]
            fn attention_memory_stays_linear() {
                attention_memory_is_linear(&device($make, $dtype));
            }

            #[test]
            fn backward_memory_stays_linear() {
                gradient_memory_is_linear(&device($make, $dtype));
            }

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(10))]
                #[test]
                fn random_configs_match_the_interpreter(c in cfg()) {
                    random_config(&device($make, $dtype), &c);
                }
            }

            #[test]
            fn level_decompositions_proptest_found_match_the_interpreter() {
                let dev = device($make, $dtype);
                found_decompositions().iter().for_each(|d| decomposition(&dev, d));
            }

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(24))]
                #[test]
                fn random_level_decompositions_match_the_interpreter(d in decomp()) {
                    decomposition(&device($make, $dtype), &d);
                }
            }
        }
    };
}

backend_tests!(wgpu, common::wgpu, Dtype::F32);
backend_tests!(wgpu_f16, common::wgpu, Dtype::F16);
