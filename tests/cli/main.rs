//! The `attnc` command line, run as a user would: exit codes, messages, and
//! that a failed run writes nothing.

mod bench;
#[path = "../common/mod.rs"]
mod common;

use attnc_runtime::io::{decode, encode, FileDtype};
use attnc_runtime::Tensor;
use common::{manifest_in, root};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn attnc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attnc")).args(args).current_dir(root()).output().expect("attnc runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("attnc-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The kernel kind of each launch in `manifest`.
fn kernel_kinds(manifest: &serde_json::Value) -> Vec<&str> {
    manifest["launches"].as_array().unwrap().iter().map(|l| l["kernel"].as_str().unwrap()).collect()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn check_accepts_every_stdlib_spec() {
    let specs: Vec<String> = common::stdlib_names().iter().map(|n| format!("stdlib/{n}.attn")).collect();
    assert!(specs.len() >= 4);
    let mut args = vec!["check"];
    args.extend(specs.iter().map(String::as_str));
    let o = attnc(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).is_empty(), "stdlib specs have diagnostics:\n{}", stderr(&o));
}

#[test]
fn check_reports_every_error_fixture_with_location_and_exit_1() {
    for entry in std::fs::read_dir(root().join("tests/fixtures/err")).unwrap() {
        let path = entry.unwrap().path();
        let source = std::fs::read_to_string(&path).unwrap();
        let mut args = vec!["check".to_string(), path.display().to_string()];
        for set in source.lines().filter_map(|l| l.strip_prefix("// set:")) {
            args.push("--set".into());
            args.push(set.trim().into());
        }
        let o = attnc(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let err = stderr(&o);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let code = name.split('_').next().unwrap();
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains(&format!("error[{code}]")), "{name} did not report {code}:\n{err}");
        assert!(!err.contains("panicked"), "{name} panicked:\n{err}");
        if !code.starts_with("E05") {
            // Spec errors point at file:line:col.
            assert!(err.contains(&format!("{}:", path.display())), "{name}: no file:line:col in\n{err}");
        }
    }
}

#[test]
fn seeded_runs_are_reproducible_and_can_be_fed_back() {
    let dir = scratch("seed");
    let (a, b, c) = (dir.join("a.safetensors"), dir.join("b.safetensors"), dir.join("c.safetensors"));
    let args = |out: &Path| {
        vec!["run", "stdlib/iha.attn", "--seed", "3", "--set", "N=5", "--set", "H=2", "--set", "d=4", "--out"]
            .into_iter()
            .map(String::from)
            .chain([s(out).to_string()])
            .collect::<Vec<_>>()
    };
    for out in [&a, &b] {
        let o = attnc(&args(out).iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let bytes = std::fs::read(&a).unwrap();
    assert_eq!(bytes, std::fs::read(&b).unwrap(), "two runs with the same seed differ");
    let tensors = decode(&bytes).unwrap();
    let names: Vec<&str> = tensors.keys().map(String::as_str).collect();
    assert_eq!(names, ["alpha_k", "alpha_q", "alpha_v", "r", "w_k", "w_o", "w_q", "w_v", "x", "y"]);
    assert_eq!(tensors["y"].shape, [1, 5, 8]);
    assert!(tensors["x"].data.iter().any(|v| *v != tensors["x"].data[0]), "inputs are constant");
    // Feeding the file back (y is ignored as an output) reproduces y bit for bit.
    let o = attnc(&["run", "stdlib/iha.attn", "--inputs", s(&a), "--out", s(&c), "--set", "H=2", "--set", "d=4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(decode(&std::fs::read(&c).unwrap()).unwrap()["y"], tensors["y"]);
    std::fs::remove_dir_all(&dir).ok();
}

/// Writes `tensors` as an input file, runs mha on it, and returns the failure text;
/// asserts the run failed and wrote nothing.
fn failing_run(name: &str, bytes: Vec<u8>, extra: &[&str]) -> String {
    let dir = scratch(name);
    let (inp, out) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
    std::fs::write(&inp, bytes).unwrap();
    let mut args =
        vec!["run", "stdlib/mha.attn", "--inputs", s(&inp), "--out", s(&out), "--set", "H=2", "--set", "d=4"];
    args.extend_from_slice(extra);
    let o = attnc(&args);
    assert!(!o.status.success(), "{name}: the run succeeded");
    assert!(!out.exists(), "{name}: a failed run wrote its output");
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 1, "{name}: temporary files left behind: {leftovers:?}");
    std::fs::remove_dir_all(&dir).ok();
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{name} panicked: {err}");
    err
}

fn mha_inputs(n: usize, skip: Option<&str>) -> Vec<(String, Tensor)> {
    let t = |shape: Vec<usize>| {
        let len = shape.iter().product::<usize>();
        Tensor::new(shape, (0..len).map(|i| (i as f64 * 0.37).sin()).collect())
    };
    [("x", vec![1, n, 8]), ("w_q", vec![8, 8]), ("w_k", vec![8, 8]), ("w_v", vec![8, 8]), ("w_o", vec![8, 8])]
        .into_iter()
        .filter(|(name, _)| Some(*name) != skip)
        .map(|(name, shape)| (name.to_string(), t(shape)))
        .collect()
}

fn file(tensors: &[(String, Tensor)]) -> Vec<u8> {
    encode(&tensors.iter().map(|(n, t)| (n.clone(), t)).collect::<Vec<_>>(), FileDtype::F32).unwrap()
}

#[test]
fn run_errors_name_the_tensor_and_write_nothing() {
    let err = failing_run("missing", file(&mha_inputs(3, Some("w_k"))), &[]);
    assert!(err.contains("missing tensor `w_k`") && err.contains("error[E0601]"), "{err}");

    let mut extra = mha_inputs(3, None);
    extra.push(("bias".into(), Tensor::zeros(vec![2])));
    let err = failing_run("extra", file(&extra), &[]);
    assert!(err.contains("unexpected tensor `bias`"), "{err}");

    let mut wrong = mha_inputs(3, None);
    wrong[1].1 = Tensor::zeros(vec![8, 6]);
    let err = failing_run("shape", file(&wrong), &[]);
    assert!(err.contains("`w_q`") && err.contains("[8, 6]") && err.contains("[D, 8]"), "{err}");

    let mut rank = mha_inputs(3, None);
    rank[0].1 = Tensor::zeros(vec![3, 8]);
    let err = failing_run("rank", file(&rank), &[]);
    assert!(err.contains("`x`") && err.contains("[3, 8]") && err.contains("[B, N, D]"), "{err}");

    let mut bytes = file(&mha_inputs(3, None));
    let header = String::from_utf8_lossy(&bytes[8..]).into_owned();
    let pos = header.find("\"F32\"").unwrap() + 8;
    bytes[pos..pos + 5].copy_from_slice(b"\"U32\"");
    let err = failing_run("wrong-dtype", bytes, &[]);
    assert!(err.contains("has dtype U32") && err.contains("F32, F64, F16, BF16, I32 and I64"), "{err}");

    // A float input stored as integers would take rounded values silently:
    // refused, naming the tensor, its dtype and what is read for it.
    let mut bytes = file(&mha_inputs(3, None));
    let header = String::from_utf8_lossy(&bytes[8..]).into_owned();
    let x = header.find("\"x\"").unwrap();
    let pos = x + header[x..].find("\"F32\"").unwrap() + 8;
    bytes[pos..pos + 5].copy_from_slice(b"\"I32\"");
    let err = failing_run("int-x", bytes, &[]);
    assert!(err.contains("error[E0601]") && err.contains("tensor `x` has dtype I32"), "{err}");
    assert!(err.contains("not an integer input") && err.contains("F32, F64, F16 or BF16"), "{err}");

    let bytes = file(&mha_inputs(3, None));
    let err = failing_run("truncated", bytes[..bytes.len() - 10].to_vec(), &[]);
    assert!(err.contains("not a valid safetensors file"), "{err}");

    let err = failing_run("set", file(&mha_inputs(3, None)), &["--set", "N=4"]);
    assert!(err.contains("--set N=4") && err.contains("N = 3"), "{err}");

    let err = failing_run("unknown-set", file(&mha_inputs(3, None)), &["--set", "heads=2"]);
    assert!(err.contains("no parameter or dim `heads`"), "{err}");

    let err = failing_run("typed-set", file(&mha_inputs(3, None)), &["--set", "mask=causl"]);
    assert!(err.contains("did you mean `causal`"), "{err}");
}

#[test]
fn run_refuses_to_overwrite_its_input() {
    let dir = scratch("overwrite");
    let inp = dir.join("in.safetensors");
    let bytes = file(&mha_inputs(2, None));
    std::fs::write(&inp, &bytes).unwrap();
    let o = attnc(&["run", "stdlib/mha.attn", "--inputs", s(&inp), "--out", s(&inp), "--set", "H=2", "--set", "d=4"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("refusing to overwrite"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&inp).unwrap(), bytes);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn interpreter_runs_over_the_work_budget_are_refused_at_once() {
    let dir = scratch("work");
    let out = dir.join("y.safetensors");
    // A million tokens pass the memory checks (x is 16 M values) but would keep
    // the float64 interpreter busy for hours: refused before any work.
    let big = ["--set", "N=1000000", "--set", "H=2", "--set", "d=8"];
    let o = attnc(&[&["run", "stdlib/mha.attn", "--seed", "0", "--out", s(&out)][..], &big[..]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("--max-flops") && err.contains("N=1000000") && err.contains("error[E0502]"), "{err}");
    assert!(!out.exists());
    // The limit is the flag's: a small run passes by default and is refused under a tiny budget.
    let small = ["run", "stdlib/mha.attn", "--seed", "0", "--out", s(&out), "--set", "H=2", "--set", "d=4"];
    let o = attnc(&[&small[..], &["--max-flops", "1000"][..]].concat());
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("over --max-flops 1.000e3"), "{}", stderr(&o));
    assert!(!out.exists());
    let o = attnc(&small);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn help_lists_the_commands() {
    let o = attnc(&["--help"]);
    let out = String::from_utf8_lossy(&o.stdout);
    for cmd in ["check", "run", "compile", "bench", "explain", "ir", "fmt", "explain-error"] {
        assert!(out.contains(cmd), "--help does not mention `{cmd}`:\n{out}");
    }
    let o = attnc(&["help", "run"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("--inputs") && out.contains("--seed") && out.contains("--set"), "{out}");
    let o = attnc(&["explain-error", "E0301"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("shape mismatch"));
}

#[test]
fn optimized_runs_match_and_explain_reports_the_choice() {
    let dir = scratch("optimize");
    let (a, b) = (dir.join("a.safetensors"), dir.join("b.safetensors"));
    let base =
        ["run", "stdlib/iha.attn", "--seed", "5", "--set", "N=1", "--set", "P=3", "--set", "H=4", "--set", "d=8"];
    let o = attnc(&[&base[..], &["--out", s(&a)]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let o = attnc(&[&base[..], &["--out", s(&b), "--optimize", "--target", "cpu"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let (ya, yb) =
        (&decode(&std::fs::read(&a).unwrap()).unwrap()["y"], &decode(&std::fs::read(&b).unwrap()).unwrap()["y"]);
    let e = attnc_runtime::relative_error(&yb.data, &ya.data);
    assert!(e <= 1e-5, "optimized run differs: relative error {e:e}");
    // MHA merges its projections (the concatenated weights prepared once).
    let o = attnc(&["explain", "stdlib/mha.attn", "--set", "N=1", "--target", "cpu"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("chosen:") && out.contains("concat_cols"), "{out}");
    assert!(out.contains("once, to prepare the weights"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Gradient programs planned as forward ones (issue 29): every layout a
/// view (a transposed weight, merged or split heads, a deinterleaved
/// attention output), so no copy launch; the forward attention writes the
/// log-sum-exp, so no separate launch for it; IHA's projections mix in
/// their GEMMs' epilogue. At the issue's sizes MHA takes 15 launches and
/// IHA 24 (the issue asks at most 18 and 28; held at today's counts).
#[test]
fn gradient_programs_compile_without_copies_in_few_launches() {
    let dir = scratch("grad-launches");
    for (spec, p, most) in [("mha", None, 15), ("iha", Some("P=2"), 24)] {
        let out = dir.join(spec);
        let mut args = vec!["compile", "--grad", "--target", "cuda", "-q", "--out", s(&out)];
        let file = format!("stdlib/{spec}.attn");
        args.extend([file.as_str(), "--set", "N=1024", "--set", "d=64", "--set", "H=4"]);
        args.extend(p.iter().flat_map(|p| ["--set", *p]));
        let o = attnc(&args);
        assert!(o.status.success(), "{spec}: {}", stderr(&o));
        let manifest = manifest_in(&out);
        let kinds = kernel_kinds(&manifest);
        for needed in ["attention", "attention_grad_q", "attention_grad_kv", "matmul"] {
            assert!(kinds.contains(&needed), "{spec}: no {needed} launch in {kinds:?}");
        }
        if spec == "iha" {
            let mixed = kinds.iter().filter(|k| **k == "matmul_mix").count();
            assert_eq!(mixed, 3, "{spec}: q, k and v not mixed in their GEMMs: {kinds:?}");
        }
        assert!(kinds.len() <= most, "{spec}: {} launches (at most {most}): {kinds:?}", kinds.len());
        for refused in ["gather", "attention_lse"] {
            assert!(!kinds.contains(&refused), "{spec}: a {refused} launch in {kinds:?}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn compile_writes_kernels_and_a_manifest_without_a_device() {
    let dir = scratch("compile");
    let compile = |target: &str, out: &Path| {
        let o =
            attnc(&["compile", "stdlib/iha.attn", "--set", "H=4", "--set", "P=2", "--target", target, "--out", s(out)]);
        assert!(o.status.success(), "{}", stderr(&o));
    };
    for target in ["cuda", "wgsl"] {
        let out = dir.join(target);
        compile(target, &out);
        let manifest = manifest_in(&out);
        let launches = manifest["launches"].as_array().unwrap();
        assert!(launches.iter().any(|l| l["kernel"] == "attention"));
        for l in launches {
            let file = out.join(l["file"].as_str().unwrap());
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(text.contains(l["entry"].as_str().unwrap()), "{} does not define its entry point", file.display());
            assert!(!l["bindings"].as_array().unwrap().is_empty());
        }
        assert_eq!(manifest["outputs"]["y"].as_u64().is_some(), true);
        // Generated code is deterministic: a second process writes the same
        // files byte for byte.
        let again = dir.join(format!("{target}-again"));
        compile(target, &again);
        let listing = |d: &Path| {
            let mut names: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name()).collect();
            names.sort();
            names
        };
        assert_eq!(listing(&out), listing(&again), "{target}: different files");
        for name in listing(&out) {
            let (a, b) = (std::fs::read(out.join(&name)).unwrap(), std::fs::read(again.join(&name)).unwrap());
            assert!(a == b, "{target}: {name:?} differs between two compiles");
        }
    }
    // A spec error writes nothing.
    let bad = dir.join("bad");
    let o = attnc(&["compile", "stdlib/iha.attn", "--set", "P=0", "--target", "wgsl", "--out", s(&bad)]);
    assert!(!o.status.success() && !bad.exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn cuda_backend_without_cuda_is_a_clear_error() {
    let dir = scratch("cuda");
    let out = dir.join("y.safetensors");
    let o = attnc(&["run", "stdlib/grpo.attn", "--seed", "0", "--out", s(&out), "--backend", "cuda"]);
    let err = stderr(&o);
    assert!(!o.status.success() && !out.exists(), "{err}");
    // CUDA is in every build; without the driver's library the error names it.
    assert!(err.contains("error[E0702]") && err.contains("libcuda.so.1") && !err.contains("panicked"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn check_inputs_reports_nan_and_attention_propagates_it() {
    let dir = scratch("nan");
    let (inp, out) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
    let mut tensors = mha_inputs(3, None);
    tensors[0].1.data[5] = f64::NAN; // x[0, 0, 5]: token 0
    std::fs::write(&inp, file(&tensors)).unwrap();
    for backend in ["interp", "wgpu"] {
        let o = attnc(&[
            "run",
            "stdlib/mha.attn",
            "--inputs",
            s(&inp),
            "--out",
            s(&out),
            "--set",
            "H=2",
            "--set",
            "d=4",
            "--check-inputs",
            "--backend",
            backend,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("input `x`: 1 NaN and 0 infinite values"), "{}", stderr(&o));
        let y = &decode(&std::fs::read(&out).unwrap()).unwrap()["y"];
        // Causal attention: token 0's NaN reaches every token's output.
        assert!(y.data.iter().all(|v| v.is_nan()), "{backend}: NaN did not propagate: {:?}", y.data);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `--dtype`: f16 kernels on wgpu (lavapipe has shader-f16) write an f32
/// file close to the interpreter's; bf16 on wgpu, any half dtype on the
/// interpreter and bf16 WGSL are clear errors that write nothing; `compile
/// --dtype bf16 --target cuda` writes a bf16 manifest.
#[test]
fn half_precision_dtypes_run_compile_or_refuse_clearly() {
    let dir = scratch("dtype");
    let (half, exact) = (dir.join("half.safetensors"), dir.join("exact.safetensors"));
    let base = ["run", "stdlib/mha.attn", "--seed", "3", "--set", "N=40", "--set", "H=2", "--set", "d=16"];
    let o = attnc(&[&base[..], &["--out", s(&exact)]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let o = attnc(&[&base[..], &["--out", s(&half), "--backend", "wgpu", "--dtype", "f16"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&half).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8_lossy(&bytes[8..8 + header_len]).into_owned();
    assert!(header.contains("\"F32\"") && !header.contains("F16"), "f16 runs write f32 files: {header}");
    let (y16, y) = (&decode(&bytes).unwrap()["y"], &decode(&std::fs::read(&exact).unwrap()).unwrap()["y"]);
    let e = attnc_runtime::relative_error(&y16.data, &y.data);
    assert!(e > 1e-5 && e < 5e-3, "f16 relative error {e:e}: not half precision, or not close");
    for (extra, needle) in [
        (&["--backend", "wgpu", "--dtype", "bf16"][..], "cannot run bf16 kernels (WebGPU and wgpu have no bf16 type)"),
        (&["--backend", "wgpu", "--dtype", "tf32"][..], "cannot run tf32 kernels (WebGPU and wgpu have no TF32"),
        (&["--dtype", "f16"][..], "interpreter computes in float64"),
        (&["--dtype", "tf32"][..], "interpreter computes in float64"),
    ] {
        let out = dir.join("refused.safetensors");
        let o = attnc(&[&base[..], &["--out", s(&out)], extra].concat());
        let err = stderr(&o);
        assert!(!o.status.success() && !out.exists() && err.contains(needle) && !err.contains("panicked"), "{err}");
    }
    let k = dir.join("k");
    let o = attnc(&["compile", "stdlib/mha.attn", "--target", "wgsl", "--dtype", "bf16", "--out", s(&k)]);
    assert!(!o.status.success() && !k.exists() && stderr(&o).contains("WGSL has no bf16"), "{}", stderr(&o));
    let o = attnc(&["compile", "stdlib/mha.attn", "--target", "wgsl", "--dtype", "tf32", "--out", s(&k)]);
    assert!(!o.status.success() && !k.exists() && stderr(&o).contains("WGSL has no TF32"), "{}", stderr(&o));
    let o =
        attnc(&["compile", "stdlib/mha.attn", "--set", "N=8", "--target", "cuda", "--dtype", "bf16", "--out", s(&k)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let manifest = manifest_in(&k);
    assert_eq!(manifest["dtype"], "bf16");
    let t = dir.join("t");
    let o =
        attnc(&["compile", "stdlib/mha.attn", "--set", "N=8", "--target", "cuda", "--dtype", "tf32", "--out", s(&t)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let manifest = manifest_in(&t);
    assert_eq!(manifest["dtype"], "tf32");
    std::fs::remove_dir_all(&dir).ok();
}

/// `attnc grad`: seeded inputs and cotangents, or files; `--wrt`; the
/// forward outputs are `run`'s; on wgpu the gradients match the
/// interpreter's; discrete inputs and unknown names are refused with
/// nothing written; `ir --grad` prints the gradient program and
/// `compile --grad` emits its kernels.
#[test]
fn grad_writes_gradients_or_refuses_clearly() {
    let dir = scratch("grad");
    let sets = ["--set", "H=2", "--set", "P=2", "--set", "d=4", "--set", "N=6"];
    let read = |p: &Path| decode(&std::fs::read(p).unwrap()).unwrap();
    let (g, y) = (dir.join("g.safetensors"), dir.join("y.safetensors"));
    let o = attnc(&[&["grad", "stdlib/iha.attn", "--seed", "4", "--dtype", "f64", "--out", s(&g)][..], &sets].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let o = attnc(&[&["run", "stdlib/iha.attn", "--seed", "4", "--dtype", "f64", "--out", s(&y)][..], &sets].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let (gf, yf) = (read(&g), read(&y));
    assert_eq!(gf["y"].data, yf["y"].data, "the gradient run's forward output is run's");
    for name in ["x", "w_q", "w_k", "w_v", "w_o", "alpha_q", "alpha_k", "alpha_v", "r"] {
        let grad = &gf[&format!("grad_{name}")];
        assert_eq!(grad.shape, gf[name].shape, "grad_{name}");
        assert!(grad.data.iter().any(|v| *v != 0.0) && grad.data.iter().all(|v| v.is_finite()), "grad_{name}");
        assert_eq!(gf[name].data, yf[name].data, "input {name} drawn as run draws it");
    }
    assert_eq!(gf["cot_y"].shape, gf["y"].shape);
    // The same inputs and cotangents from files give the same gradients.
    let (inputs, cots, again) = (dir.join("in.safetensors"), dir.join("dy.safetensors"), dir.join("again.safetensors"));
    std::fs::copy(&y, &inputs).unwrap();
    let dy = Tensor::new(gf["cot_y"].shape.clone(), gf["cot_y"].data.clone());
    std::fs::write(&cots, encode(&[("y".to_string(), &dy)], FileDtype::F64).unwrap()).unwrap();
    let args = ["grad", "stdlib/iha.attn", "--inputs", s(&inputs), "--cotangents", s(&cots), "--wrt", "alpha_q,r"];
    let o = attnc(&[&args[..], &["--dtype", "f64", "--out", s(&again)], &sets].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let af = read(&again);
    assert_eq!(af.keys().collect::<Vec<_>>(), ["grad_alpha_q", "grad_r", "y"]);
    assert_eq!(af["grad_alpha_q"].data, gf["grad_alpha_q"].data);
    assert_eq!(af["grad_r"].data, gf["grad_r"].data);
    for (extra, needle) in [
        (&["stdlib/odrpo.attn", "--wrt", "rewards"][..], "error[E0801]: input `rewards` takes discrete values"),
        (&["stdlib/mha.attn", "--wrt", "nope"][..], "`nope` is not an input"),
    ] {
        let out = dir.join("refused.safetensors");
        let o = attnc(&[&["grad"][..], extra, &["--seed", "1", "--out", s(&out)]].concat());
        let err = stderr(&o);
        assert!(!o.status.success() && !out.exists() && err.contains(needle) && !err.contains("panicked"), "{err}");
    }
    // The kernels: every gradient within 1e-4 of the interpreter's.
    let w = dir.join("w.safetensors");
    let o =
        attnc(&[&["grad", "stdlib/iha.attn", "--seed", "4", "--backend", "wgpu", "--out", s(&w)][..], &sets].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let wf = read(&w);
    for name in ["x", "w_q", "w_k", "w_v", "w_o", "alpha_q", "alpha_k", "alpha_v", "r"] {
        let e = attnc_runtime::relative_error(&wf[&format!("grad_{name}")].data, &gf[&format!("grad_{name}")].data);
        assert!(e <= 1e-4, "grad_{name} on wgpu: relative error {e:e}");
    }
    // `compile --grad`: the gradient program's kernels and manifest.
    let k = dir.join("kernels");
    let o = attnc(&[&["compile", "stdlib/iha.attn", "--grad", "--target", "wgsl", "--out", s(&k)][..], &sets].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let manifest = manifest_in(&k);
    let kinds = kernel_kinds(&manifest);
    // The forward writes the log-sum-exp; dK and dV come from one launch.
    for kind in ["attention", "attention_grad_q", "attention_grad_kv", "contract"] {
        assert!(kinds.contains(&kind), "no {kind} kernel in {kinds:?}");
    }
    for kind in ["attention_lse", "attention_grad_k", "attention_grad_v"] {
        assert!(!kinds.contains(&kind), "a separate {kind} kernel in {kinds:?}");
    }
    assert!(manifest["outputs"]["grad_alpha_q"].as_u64().is_some() && manifest["outputs"]["y"].as_u64().is_some());
    let o = attnc(&["ir", "stdlib/mha.attn", "--grad", "--wrt", "w_q"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && text.contains("attention_grad_q") && text.contains("output grad_w_q"), "{text}");
    assert!(!text.contains("output grad_w_k"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `attnc grad --dtype f16` runs the half-precision gradient kernels on
/// wgpu (every tensor stored in f16, f32 accumulation) and writes an f32
/// file; at N = 1500 past many tiles each gradient holds against the
/// float64 interpreter within docs/gradients.md's rule for half precision:
/// relative error (2-norm) at most 8u and every element within 16u of the
/// largest, u = 2⁻¹¹ f16's unit roundoff. bf16 on wgpu and half precision
/// on the interpreter are refused as `run` refuses them, nothing written.
#[test]
fn grad_runs_the_half_precision_gradient_kernels() {
    let dir = scratch("grad_half");
    let sets = ["--set", "N=1500", "--set", "H=2", "--set", "d=32", "--set", "B=1"];
    let read = |p: &Path| decode(&std::fs::read(p).unwrap()).unwrap();
    let (exact, half) = (dir.join("exact.safetensors"), dir.join("half.safetensors"));
    for (file, extra) in [(&exact, &["--dtype", "f64"][..]), (&half, &["--backend", "wgpu", "--dtype", "f16"])] {
        let o = attnc(&[&["grad", "stdlib/mha.attn", "--seed", "8", "--out", s(file)][..], extra, &sets].concat());
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let header = String::from_utf8_lossy(&std::fs::read(&half).unwrap()[..400]).into_owned();
    assert!(header.contains("\"F32\"") && !header.contains("F16"), "f16 gradients write f32 files: {header}");
    let (want, got, u) = (read(&exact), read(&half), 2f64.powi(-11));
    for name in ["y", "grad_x", "grad_w_q", "grad_w_k", "grad_w_v", "grad_w_o"] {
        let (g, w) = (&got[name].data, &want[name].data);
        assert!(g.iter().all(|v| v.is_finite()), "{name}: not finite");
        let e = attnc_runtime::relative_error(g, w);
        let largest = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let worst = g.iter().zip(w).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        // Within the rule, and half precision for real: not the f32 kernels' error.
        let ok = e <= 8.0 * u && worst <= 16.0 * u * largest && e > 1e-5;
        assert!(ok, "{name}: relative {e:e}, worst element {worst:e} of {largest:e}");
    }
    for (extra, needle) in [
        (&["--backend", "wgpu", "--dtype", "bf16"][..], "cannot run bf16 kernels (WebGPU and wgpu have no bf16 type)"),
        (&["--dtype", "f16"][..], "interpreter computes in float64"),
    ] {
        let out = dir.join("refused.safetensors");
        let o = attnc(
            &[&["grad", "stdlib/mha.attn", "--seed", "1", "--set", "N=20", "--out", s(&out)][..], extra].concat(),
        );
        let err = stderr(&o);
        assert!(!o.status.success() && !out.exists() && err.contains(needle) && !err.contains("panicked"), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Refusals carry codes of their own, whose `explain-error` texts say what
/// they mean: the memory budget (E0502) and an unreadable spec (E0603).
#[test]
fn budget_and_io_refusals_have_their_own_codes() {
    let dir = scratch("codes");
    let out = dir.join("y.safetensors");
    let o = attnc(&["run", "stdlib/mha.attn", "--seed", "0", "--set", "N=2000000", "--out", s(&out)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.starts_with("error[E0502]") && err.contains("memory budget") && err.contains("--memory-budget"),
        "{err}"
    );
    assert!(!out.exists());
    let missing = dir.join("missing.attn");
    let o = attnc(&["run", s(&missing), "--seed", "0", "--out", s(&out)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.starts_with("error[E0603]") && err.contains(s(&missing)) && err.contains("No such file"), "{err}");
    assert!(!out.exists());
    for (code, words) in [("E0502", "memory budget"), ("E0603", "could not be read or written")] {
        let o = attnc(&["explain-error", code]);
        assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains(words), "{code}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Sizes with sums and differences: a dim solved from an axis `2·N − 1`, and
/// a size negative at the bound dims refused, naming the tensor, with
/// nothing written.
#[test]
fn sizes_with_differences_solve_dims_and_refuse_negative_sizes() {
    let dir = scratch("differences");
    let spec = dir.join("rel.attn");
    std::fs::write(
        &spec,
        "spec rel\ndim N = 6\ndim K = 3\ninput bias: [2 * N - 1]\ninput extra: [N - K]\n\
         output o = bias * 2.0\noutput e = extra + 1.0\n",
    )
    .unwrap();
    let inputs = dir.join("in.safetensors");
    let tensors = vec![
        ("bias".to_string(), Tensor::new(vec![9], (0..9).map(|i| i as f64).collect())),
        ("extra".to_string(), Tensor::new(vec![2], vec![1.0, -1.0])),
    ];
    std::fs::write(&inputs, file(&tensors)).unwrap();
    let out = dir.join("out.safetensors");
    let o = attnc(&["run", s(&spec), "--inputs", s(&inputs), "--out", s(&out), "--set", "K=3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // N = 5 solved from bias's 9 rows, so extra has 5 - 3 = 2.
    assert!(String::from_utf8_lossy(&o.stdout).contains("N=5") || stderr(&o).contains("N=5"), "{}", stderr(&o));

    let out2 = dir.join("out2.safetensors");
    let o = attnc(&["run", s(&spec), "--seed", "1", "--set", "N=2", "--out", s(&out2)]);
    assert!(!o.status.success(), "a negative size ran");
    let err = stderr(&o);
    assert!(
        err.contains("E0305") && err.contains("`extra`") && err.contains("N - K") && err.contains("negative"),
        "{err}"
    );
    assert!(!out2.exists(), "a refused run wrote its output");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--quiet` (before or after the command) silences progress only: a sweep's
/// step lines go, its table and plot stay; a run's outputs and messages are
/// the same. (Spinners and bars draw only on a terminal, never here.)
#[test]
fn quiet_silences_progress_and_nothing_else() {
    let dir = scratch("quiet");
    let plot = dir.join("sweep.svg");
    let sweep = ["bench", "stdlib/grpo.attn", "--sweep", "G=4,8", "--iters", "1", "--warmup", "0", "--plot", s(&plot)];
    let loud = attnc(&sweep);
    assert!(loud.status.success(), "{}", stderr(&loud));
    assert!(stderr(&loud).contains("[1/2] G=4 ...") && stderr(&loud).contains("[2/2] G=8 ..."), "{}", stderr(&loud));
    std::fs::remove_file(&plot).unwrap();
    let quiet = attnc(&[&["--quiet"][..], &sweep].concat());
    assert!(quiet.status.success(), "{}", stderr(&quiet));
    assert!(!stderr(&quiet).contains("[1/2]"), "{}", stderr(&quiet));
    assert_eq!(quiet.stdout, loud.stdout, "the table does not depend on --quiet");
    assert_eq!(String::from_utf8_lossy(&quiet.stdout).lines().count(), 3, "a header and a row a value");
    assert!(plot.exists(), "the plot is written with --quiet");

    let (a, b) = (dir.join("a.safetensors"), dir.join("b.safetensors"));
    let run = |out: &Path, quiet: &[&str]| {
        let args = [&["run", "stdlib/mha.attn", "--seed", "3", "--set", "N=40", "--out", s(out)], quiet].concat();
        attnc(&args)
    };
    let (loud, quiet) = (run(&a, &[]), run(&b, &["-q"]));
    assert!(loud.status.success() && quiet.status.success(), "{}{}", stderr(&loud), stderr(&quiet));
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert_eq!(stderr(&loud).replace(s(&a), "OUT"), stderr(&quiet).replace(s(&b), "OUT"));
    std::fs::remove_dir_all(&dir).ok();
}

/// An output holding NaN is named on stderr (its count and first index) and
/// written; `--finite` refuses it with E0605 and writes nothing. A NaN score
/// at one (i, j) makes that query row's output NaN in the interpreter, and
/// only that row (docs/semantics.md §5).
#[test]
fn non_finite_outputs_are_named_and_finite_refuses_them() {
    let dir = scratch("non-finite");
    let spec = dir.join("nan.attn");
    std::fs::write(
        &spec,
        "spec nan\ndim N = 6\ninput q: [1, 1, N, 4]\ninput k: [1, 1, N, 4]\ninput v: [1, 1, N, 4]\n\
         output o = attention(q, k, v, score = |s, b, h, i, j| where(i == 3 and j == 2, log(-1.0), s))\n",
    )
    .unwrap();
    let out = dir.join("o.safetensors");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", s(&spec), "--seed", "3", "--out", s(&out)];
        args.extend_from_slice(extra);
        attnc(&args)
    };
    let warned = run(&[]);
    assert!(warned.status.success(), "{}", stderr(&warned));
    let err = stderr(&warned);
    assert!(
        err.contains("warning: output `o` holds 4 NaN and 0 infinite value(s)") && err.contains("[0, 0, 3, 0]"),
        "{err}"
    );
    let o = decode(&std::fs::read(&out).unwrap()).unwrap().remove("o").unwrap();
    for (at, v) in o.data.iter().enumerate() {
        assert_eq!(v.is_nan(), at / 4 == 3, "element {at} is {v}");
    }
    std::fs::remove_file(&out).unwrap();
    let refused = run(&["--finite"]);
    assert!(!refused.status.success() && !out.exists(), "--finite refuses and writes nothing");
    let err = stderr(&refused);
    assert!(err.contains("error[E0605]") && err.contains("output `o` holds 4 NaN"), "{err}");
    let explained = attnc(&["explain-error", "E0605"]);
    assert!(String::from_utf8_lossy(&explained.stdout).contains("--finite"), "E0605 is explained");
    std::fs::remove_dir_all(&dir).ok();
}
