//! The library pipeline as a Rust user calls it: compile → bind → optimize →
//! plan → emit / run, and its typed errors.

mod common;

use attnc::{Backend, Compiler, Error, Mode, Source, Tensor, CPU};
use attnc_compiler::Code;
use std::collections::BTreeMap;

fn iha() -> Compiler {
    Compiler::open(common::root().join("stdlib/iha.attn")).unwrap().set("H", 2).set("P", 3).set("d", 8).set("N", 40)
}

/// Seeded inputs through the interpreter, the optimized program and the
/// kernels (wgpu) agree; the plan and the emitted source describe the same launches.
#[test]
fn a_spec_compiles_binds_optimizes_plans_emits_and_runs() {
    let bound = iha().compile().unwrap().seeded(3).unwrap();
    assert_eq!(bound.dims()["N"], 40);
    let want = bound.interpret().unwrap();
    let optimized = bound.clone().optimize(CPU, Mode::Inference);
    let got = optimized.run(Backend::Wgpu).unwrap_or_else(|e| panic!("this test needs a device: {e}"));
    let e = attnc::relative_error(&got["y"].data, &want["y"].data);
    assert!(e <= 1e-4 && got["y"].data.iter().all(|v| v.is_finite()), "relative error {e:e}");
    let plan = optimized.plan();
    let (files, manifest) = optimized.emit(Source::Wgsl).unwrap();
    assert_eq!(files.len(), plan.launches.len());
    assert_eq!(manifest.launches.len(), plan.launches.len());
    // Inputs given by name bind with dims from their shapes.
    let rebound = iha().compile().unwrap().bind(bound.inputs().clone()).unwrap();
    assert_eq!(rebound.interpret().unwrap()["y"].data, want["y"].data);
}

/// Failures are typed, carry their diagnostic code and say what is wrong.
#[test]
fn failures_are_typed_errors_with_codes() {
    let bad = Compiler::new("bad.attn", "spec bad\ninput x: [4, 4]\noutput y = x @ w\n").compile().unwrap_err();
    assert!(matches!(bad, Error::Spec { .. }));
    assert_eq!(bad.code(), Code::UnknownName);
    let text = bad.to_string();
    assert!(text.contains("bad.attn:3:") && text.contains('w'), "{text}");

    let missing = Compiler::open("no/such/spec.attn").unwrap_err();
    assert!(matches!(missing, Error::Read { .. }) && missing.to_string().contains("no/such/spec.attn"));

    let setting = iha().settings(&["P"]).unwrap_err();
    assert!(matches!(setting, Error::Setting(_)) && setting.code() == Code::BadSetting);

    let program = iha().compile().unwrap();
    let mut inputs: BTreeMap<String, Tensor> = program.seeded(0).unwrap().inputs().clone();
    inputs.insert("alpha_q".into(), Tensor::new(vec![2, 2], vec![0.5; 4]));
    let wrong = program.bind(inputs).unwrap_err();
    assert!(matches!(wrong, Error::Input(_)), "{wrong:?}");
    assert!(wrong.to_string().contains("alpha_q"), "{wrong}");
}

/// A program sized without inputs plans and emits but does not run (the
/// error names the missing input), and a backend without a device is a
/// typed error, not a panic (CI's machine has no NVIDIA driver: `Cuda`,
/// E0702; on one with a GPU the call succeeds instead).
#[test]
fn missing_inputs_and_devices_are_typed_errors() {
    let sized = iha().compile().unwrap().sized().unwrap();
    assert!(!sized.plan().launches.is_empty());
    assert!(sized.emit(Source::Cuda).is_ok());
    let err = sized.run(Backend::Interp).unwrap_err();
    assert!(matches!(err, Error::Input(_)) && err.to_string().contains("`x`"), "{err}");
    match Backend::Cuda.device() {
        Err(e @ Error::Cuda(_)) => assert_eq!(e.code(), Code::NoCudaDriver, "{e}"),
        Err(other) => panic!("not a device error: {other:?}"),
        Ok(device) => assert!(device.is_some(), "a kernel backend without a device"),
    }
}
