//! Specs through Burn on wgpu (lavapipe in CI) against attnc's float64
//! interpreter: outputs, and gradients through Burn's autodiff against the
//! interpreter's gradient program at the same cotangent; bad tensors are
//! coded errors before anything runs.

use attnc_burn::{AttncOp, Inputs};
use attnc_runtime::{bind, interp, relative_error, Tensor as Host};
use burn::tensor::{Device, DeviceKind, Tensor, TensorData};

fn device() -> Device {
    Device::wgpu(DeviceKind::DefaultDevice)
}

fn stdlib(name: &str, sets: &[(&str, &str)]) -> AttncOp {
    let path = format!("{}/../stdlib/{name}.attn", env!("CARGO_MANIFEST_DIR"));
    AttncOp::from_file(&path, sets).unwrap_or_else(|e| panic!("{e}"))
}

/// `t` as a Burn tensor of rank `D` on `device`, tracked when `grad`.
fn burn_tensor<const D: usize>(t: &Host, device: &Device, grad: bool) -> Tensor<D> {
    let data: Vec<f32> = t.data.iter().map(|&x| x as f32).collect();
    let t = Tensor::<D>::from_data(TensorData::new(data, t.shape.clone()), device);
    if grad {
        t.require_grad()
    } else {
        t
    }
}

/// A Burn tensor of any rank up to 4.
#[derive(Clone)]
enum Any {
    R1(Tensor<1>),
    R2(Tensor<2>),
    R3(Tensor<3>),
    R4(Tensor<4>),
}

impl Any {
    fn new(t: &Host, device: &Device, grad: bool) -> Any {
        match t.shape.len() {
            1 => Any::R1(burn_tensor(t, device, grad)),
            2 => Any::R2(burn_tensor(t, device, grad)),
            3 => Any::R3(burn_tensor(t, device, grad)),
            4 => Any::R4(burn_tensor(t, device, grad)),
            r => panic!("rank {r}"),
        }
    }

    /// Binds the tensor to spec input `name`.
    fn bind(self, inputs: Inputs, name: &str) -> Inputs {
        match self {
            Any::R1(t) => inputs.with(name, t),
            Any::R2(t) => inputs.with(name, t),
            Any::R3(t) => inputs.with(name, t),
            Any::R4(t) => inputs.with(name, t),
        }
    }

    /// Its gradient in `grads`, if it has one.
    fn grad(&self, grads: &burn::tensor::Gradients) -> Option<Vec<f64>> {
        match self {
            Any::R1(t) => t.grad(grads).map(values),
            Any::R2(t) => t.grad(grads).map(values),
            Any::R3(t) => t.grad(grads).map(values),
            Any::R4(t) => t.grad(grads).map(values),
        }
    }
}

impl Any {
    /// Output `name` of `out`, of rank `rank`.
    fn take(out: &mut attnc_burn::Outputs, name: &str, rank: usize) -> Any {
        match rank {
            1 => Any::R1(out.take(name).unwrap()),
            2 => Any::R2(out.take(name).unwrap()),
            3 => Any::R3(out.take(name).unwrap()),
            4 => Any::R4(out.take(name).unwrap()),
            r => panic!("rank {r}"),
        }
    }

    fn values(&self) -> Vec<f64> {
        match self.clone() {
            Any::R1(t) => values(t),
            Any::R2(t) => values(t),
            Any::R3(t) => values(t),
            Any::R4(t) => values(t),
        }
    }

    /// `Σ self · c`, for `c` drawn on the host.
    fn dot(self, c: &Host, device: &Device) -> Tensor<1> {
        match self {
            Any::R1(t) => (t * burn_tensor::<1>(c, device, false)).sum(),
            Any::R2(t) => (t * burn_tensor::<2>(c, device, false)).sum(),
            Any::R3(t) => (t * burn_tensor::<3>(c, device, false)).sum(),
            Any::R4(t) => (t * burn_tensor::<4>(c, device, false)).sum(),
        }
    }
}

/// Binds host tensor `t` to `name`, whatever its rank.
fn with(inputs: Inputs, name: &str, t: &Host, device: &Device, grad: bool) -> Inputs {
    Any::new(t, device, grad).bind(inputs, name)
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f64> {
    t.into_data().try_to_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
}

/// The relative error of `got` against `want`, within `tol`, no NaN.
fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    assert!(got.iter().all(|x| x.is_finite()), "{what}: not finite");
    assert!(want.iter().any(|x| *x != 0.0), "{what}: the reference is zero");
    let e = relative_error(got, want);
    assert!(e <= tol, "{what}: relative error {e:e} > {tol:e}");
}

/// Forward outputs through Burn equal the interpreter's (f32 kernels,
/// relative error ≤ 1e-4), for MHA at N = 1100 (past several tiles), IHA with its
/// projections, a score function (ALiBi) and talking heads (head mixing
/// inside attention), on a plain (not autodiff) device.
#[test]
fn forward_through_burn_matches_the_interpreter() {
    let device = device();
    for (spec, sets) in [
        ("mha", vec![("H", "4"), ("N", "1100"), ("d", "64")]),
        ("iha", vec![("H", "4"), ("P", "2"), ("N", "130"), ("d", "32")]),
        ("alibi", vec![("H", "4"), ("N", "200"), ("d", "32")]),
        ("talking_heads", vec![("H", "4"), ("N", "150"), ("d", "16")]),
    ] {
        let op = stdlib(spec, &sets);
        let program = op.program().clone();
        let (tensors, dims) = bind::generate_inputs(&program, 11).unwrap();
        let want = interp::evaluate(&program, &tensors, &dims);
        let mut inputs = Inputs::new();
        for (i, t) in program.inputs.iter().zip(&tensors) {
            inputs = with(inputs, &i.name, t, &device, false);
        }
        let mut out = op.forward(inputs).unwrap_or_else(|e| panic!("{spec}: {e}"));
        for ((name, _), w) in program.outputs.iter().zip(&want) {
            let got = Any::take(&mut out, name, w.shape.len()).values();
            close(&got, &w.data, 1e-4, &format!("{spec} {name}"));
        }
    }
}

/// Gradients through Burn's autodiff (loss = Σ o · c for a drawn `c`)
/// equal the interpreter's gradient program at cotangent `c`, for every
/// input: MHA's q, k, v at N = 1030; IHA's projections and mixing weights; ALiBi's
/// slopes (tracked, so differentiated although `attnc grad` skips them);
/// talking heads' mixing matrices; gpt-oss's learned sinks (GQA, a
/// window); a learned relative-position bias table.
#[test]
fn gradients_through_burn_autodiff_match_the_interpreter() {
    let device = device().autodiff();
    for (spec, sets) in [
        ("mha", vec![("H", "2"), ("N", "1030"), ("d", "32")]),
        ("iha", vec![("H", "2"), ("P", "2"), ("N", "100"), ("d", "16")]),
        ("alibi", vec![("H", "2"), ("N", "150"), ("d", "16")]),
        ("talking_heads", vec![("H", "4"), ("N", "90"), ("d", "8")]),
        ("gpt_oss", vec![("H", "4"), ("H_kv", "2"), ("N", "120"), ("d", "16"), ("window", "50")]),
        ("relative_bias", vec![("H", "2"), ("M", "70"), ("N", "110"), ("d", "16"), ("R", "40")]),
    ] {
        let op = stdlib(spec, &sets);
        let program = op.program().clone();
        let (tensors, dims) = bind::generate_inputs(&program, 21).unwrap();
        let names: Vec<String> = program.inputs.iter().map(|i| i.name.clone()).collect();
        let grad = attnc_compiler::grad::differentiate(&program, &names).unwrap();
        let (out_name, out_node) = &program.outputs[0];
        let shape = attnc_compiler::ir::concrete(&program.nodes[out_node.0 as usize].shape, &dims);
        let mut rng = attnc_runtime::rng::Rng::for_input(3, "cot");
        let cot = Host::new(shape.clone(), (0..shape.iter().product()).map(|_| rng.unit() * 2.0 - 1.0).collect());
        let mut all = tensors.clone();
        all.push(cot.clone());
        let want = interp::evaluate(&grad, &all, &dims);
        let leaves: Vec<Any> = tensors.iter().map(|t| Any::new(t, &device, true)).collect();
        let mut inputs = Inputs::new();
        for (i, t) in program.inputs.iter().zip(&leaves) {
            inputs = t.clone().bind(inputs, &i.name);
        }
        let mut out = op.forward(inputs).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let o = Any::take(&mut out, out_name, shape.len());
        close(&o.values(), &want[0].data, 1e-4, &format!("{spec}: {out_name} on the autodiff device"));
        let loss = o.dot(&cot, &device);
        let grads = loss.backward();
        for (name, leaf) in names.iter().zip(&leaves) {
            let at = grad.outputs.iter().position(|(n, _)| *n == format!("grad_{name}")).unwrap();
            let got = leaf.grad(&grads).unwrap_or_else(|| panic!("{spec}: no gradient for {name}"));
            close(&got, &want[at].data, 1e-4, &format!("{spec}: the gradient of {name}"));
        }
    }
}

/// Causal attention of q, k, v `[1, 2, n, 8]`, and inputs drawn with `seed`.
fn causal(n: usize, seed: u64) -> (AttncOp, Vec<Host>) {
    let source = format!(
        "spec plain\ninput q: [1, 2, {n}, 8]\ninput k: [1, 2, {n}, 8]\ninput v: [1, 2, {n}, 8]\n\
         output o = attention(q, k, v, mask = causal)\n"
    );
    let op = AttncOp::compile("plain.attn", &source, &[]).unwrap();
    let (tensors, _) = bind::generate_inputs(op.program(), seed).unwrap();
    (op, tensors)
}

/// Tensors that do not fit the spec are attnc's coded errors, naming the
/// tensor and both sides, before anything runs: a missing or unknown
/// input, a wrong shape, a dtype the kernels do not take, tensors on two
/// devices, an unknown output or a rank that is not the output's.
#[test]
fn tensors_that_do_not_fit_are_coded_errors() {
    let device = device();
    let (op, tensors) = causal(40, 1);
    let t = |i: usize| Any::new(&tensors[i], &device, false);
    let code = |r: Result<attnc_burn::Outputs, attnc_burn::Error>| match r {
        Ok(_) => panic!("accepted"),
        Err(e) => (e.code.as_str(), e.to_string()),
    };
    // `v` missing.
    let (c, m) = code(op.forward(t(1).bind(t(0).bind(Inputs::new(), "q"), "k")));
    assert!(c == "E0601" && m.contains("missing tensor `v`"), "{c}: {m}");
    // An input the spec does not have.
    let all = || t(2).bind(t(1).bind(t(0).bind(Inputs::new(), "q"), "k"), "v");
    let (c, m) = code(op.forward(t(0).bind(all(), "bias")));
    assert!(c == "E0601" && m.contains("unexpected tensor `bias`") && m.contains("q, k, v"), "{c}: {m}");
    // `k` of the wrong shape: 39 rows where q has 40.
    let short = Tensor::<4>::zeros([1, 2, 39, 8], &device);
    let (c, m) = code(op.forward(t(2).bind(t(0).bind(Inputs::new(), "q").with("k", short), "v")));
    assert!(c == "E0601" && m.contains("tensor `k` has shape [1, 2, 39, 8]"), "{c}: {m}");
    // f16 tensors: the kernels take f32 here.
    let Any::R4(q) = t(0) else { unreachable!() };
    let half = q.cast(burn::tensor::FloatDType::F16);
    let (c, m) = code(op.forward(t(2).bind(t(1).bind(Inputs::new().with("q", half), "k"), "v")));
    assert!(c == "E0709" && m.contains("tensor `q` is F16") && m.contains("F32"), "{c}: {m}");
    // Tensors on two devices (two wgpu devices of the one adapter here).
    let other = Device::wgpu(DeviceKind::Cpu);
    assert_ne!(other, device);
    let elsewhere = Any::new(&tensors[1], &other, false);
    let (c, m) = code(op.forward(t(2).bind(elsewhere.bind(t(0).bind(Inputs::new(), "q"), "k"), "v")));
    assert!(c == "E0709" && m.contains("tensor `k` is on") && m.contains("the others on"), "{c}: {m}");
    // Outputs: a name the spec does not have, and the wrong rank.
    let mut out = op.forward(all()).unwrap();
    let e = out.take::<4>("y").map(|_| ()).unwrap_err();
    assert!(e.code.as_str() == "E0601" && e.to_string().contains("outputs are o"), "{e}");
    let e = out.take::<3>("o").map(|_| ()).unwrap_err();
    assert!(e.code.as_str() == "E0302" && e.to_string().contains("rank 4, not 3"), "{e}");
    assert!(out.take::<4>("o").is_ok());
    // A spec that does not compile: its code, file:line:col and hint.
    let e = AttncOp::compile("bad.attn", "spec bad\ninput q: [2]\noutput o = nope(q)\n", &[]).err().unwrap();
    assert!(e.code.as_str() == "E0102" && e.to_string().contains("bad.attn:3:"), "{e}");
}

/// An input that is a view, not laid out as the plan reads it (a
/// transposed tensor: strides, not row-major), is made contiguous first
/// and gives what its row-major copy gives: the interpreter's output.
#[test]
fn strided_views_are_read_as_their_values() {
    let device = device();
    let (op, tensors) = causal(70, 2);
    let shape: &[usize] = &[1, 2, 70, 8];
    let dims = bind::solve_dims(op.program(), &[shape; 3], &Default::default()).unwrap();
    let want = interp::evaluate(op.program(), &tensors, &dims).remove(0);
    // k stored as [1, 2, 8, 70] and handed over as its transpose.
    let k = &tensors[1];
    let mut stored = vec![0.0; k.data.len()];
    for h in 0..2 {
        for j in 0..70 {
            for c in 0..8 {
                stored[(h * 8 + c) * 70 + j] = k.data[(h * 70 + j) * 8 + c] as f32;
            }
        }
    }
    let view = Tensor::<4>::from_data(TensorData::new(stored, [1, 2, 8, 70]), &device).swap_dims(2, 3);
    let inputs = Any::new(&tensors[2], &device, false)
        .bind(Any::new(&tensors[0], &device, false).bind(Inputs::new(), "q").with("k", view), "v");
    let got = values(op.forward(inputs).unwrap().take::<4>("o").unwrap());
    close(&got, &want.data, 1e-4, "o with k a transposed view");
}
