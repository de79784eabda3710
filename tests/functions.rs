//! Score and mask functions (docs/language.md, "Score and mask functions";
//! docs/semantics.md §6): the stdlib variants against references written
//! here from their papers' formulas, the kernels (forward and backward,
//! f32, wgpu) against the interpreter at several tiles in every dimension,
//! random functions from a generator, and the errors a function can raise.

mod common;

use attnc_compiler::plan;
use attnc_runtime::rng::Rng;
use attnc_runtime::{bind, interp, Tensor};
use common::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// A variant's meaning, written independently of the compiler: the score of
/// scaled logit `s` for (h, i, j), or `None` where the key is hidden.
type Reference = dyn Fn(f64, usize, usize, usize, &BTreeMap<String, Tensor>) -> Option<f64>;

/// `softmax(score) v` per query row from a reference score, in float64:
/// q `[B, H, M, d]`, k and v `[B, H_kv, N, d]`.
fn reference(inputs: &BTreeMap<String, Tensor>, score: &Reference) -> Tensor {
    let (q, k, v) = (&inputs["q"], &inputs["k"], &inputs["v"]);
    let (b, h, m, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (hk, n) = (k.shape[1], k.shape[2]);
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = Tensor::zeros(vec![b, h, m, d]);
    for bi in 0..b {
        for hi in 0..h {
            let g = hi / (h / hk);
            for i in 0..m {
                let z: Vec<Option<f64>> = (0..n)
                    .map(|j| {
                        let dot: f64 = (0..d)
                            .map(|c| q.data[((bi * h + hi) * m + i) * d + c] * k.data[((bi * hk + g) * n + j) * d + c])
                            .sum();
                        score(scale * dot, hi, i, j, inputs)
                    })
                    .collect();
                let max = z.iter().flatten().fold(f64::NEG_INFINITY, |a, b| a.max(*b));
                let total: f64 = z.iter().flatten().map(|x| (x - max).exp()).sum();
                for (j, zj) in z.iter().enumerate() {
                    let Some(zj) = zj else { continue };
                    let p = (zj - max).exp() / total;
                    for c in 0..d {
                        out.data[((bi * h + hi) * m + i) * d + c] += p * v.data[((bi * hk + g) * n + j) * d + c];
                    }
                }
            }
        }
    }
    out
}

fn sets(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// Seeded inputs of a compiled spec, with document ids in runs (a packed
/// row of documents of 1 to 40 tokens), so document masks are not trivial.
fn inputs_of(c: &attnc_compiler::Compiled, seed: u64) -> BTreeMap<String, Tensor> {
    let (drawn, _) = bind::generate_inputs(&c.program, seed).unwrap();
    let mut inputs: BTreeMap<String, Tensor> = c.program.inputs.iter().map(|i| i.name.clone()).zip(drawn).collect();
    if let Some(doc) = inputs.get_mut("doc") {
        let (b, n) = (doc.shape[0], doc.shape[1]);
        let mut rng = Rng::for_input(seed, "documents");
        for bi in 0..b {
            let (mut id, mut left) = (0.0, 0);
            for i in 0..n {
                if left == 0 {
                    id += 1.0 + (rng.unit() * 5.0).floor();
                    left = 1 + (rng.unit() * 40.0) as usize;
                }
                doc.data[bi * n + i] = id;
                left -= 1;
            }
        }
    }
    inputs
}

/// Each stdlib variant's reference, from its paper's formula.
fn variant(name: &str) -> Box<Reference> {
    match name {
        "alibi" => Box::new(|s, h, i, j, t| (j <= i).then(|| s - t["slopes"].data[h] * (i as f64 - j as f64).abs())),
        "softcap" => Box::new(|s, _, i, j, _| (j <= i).then(|| 50.0 * (s / 50.0).tanh())),
        "document" => Box::new(|s, _, i, j, t| (j <= i && t["doc"].data[i] == t["doc"].data[j]).then_some(s)),
        "prefix_lm" => Box::new(|s, _, i, j, _| (j <= i || j < 16).then_some(s)),
        "sinks" => Box::new(|s, _, i, j, _| (j <= i && (i - j < 20 || j < 4)).then_some(s)),
        "relative_bias" => Box::new(|s, h, i, j, t| {
            let r = (i as i64 - j as i64).clamp(-6, 6) + 6;
            (j <= i).then(|| s + t["bias"].data[h * 13 + r as usize])
        }),
        other => panic!("no reference for {other}"),
    }
}

/// The variants' settings for the tests: small heads, GQA where a spec has it.
fn variant_sets(name: &str, n: &str) -> Vec<(&'static str, String)> {
    let mut s = sets(&[("H", "4"), ("H_kv", "2"), ("d", "8"), ("N", n)]);
    match name {
        "alibi" | "softcap" | "relative_bias" => s.push(("M", n.to_string())),
        "sinks" => s.extend(sets(&[("window", "20"), ("sinks", "4")])),
        _ => {}
    }
    if name == "relative_bias" {
        s.push(("R", "6".into()));
    }
    s
}

const VARIANTS: [&str; 6] = ["alibi", "softcap", "document", "prefix_lm", "sinks", "relative_bias"];

#[test]
fn stdlib_variants_match_their_papers_formulas() {
    for (seed, name) in VARIANTS.iter().enumerate() {
        let c = compile_stdlib(name, &variant_sets(name, "45"));
        let inputs = inputs_of(&c, seed as u64);
        let want = reference(&inputs, &*variant(name));
        let got = eval(&c, &inputs).remove("o").unwrap();
        assert!(want.data.iter().any(|x| *x != 0.0), "{name}: the reference is all zero");
        assert_close(&got, &want, 1e-12, name);
    }
}

/// The kernels (forward and the gradient program) against the interpreter,
/// f32 on wgpu, at several tiles in every dimension: N past a thousand,
/// unequal query and key lengths, GQA, d up to 128; relative error ≤ 1e-4
/// and no NaN.
#[test]
fn stdlib_variants_on_the_kernels_match_the_interpreter() {
    let gpu = needs_wgpu();
    let cases: Vec<(&str, Vec<(&'static str, String)>)> = vec![
        ("alibi", sets(&[("H", "2"), ("H_kv", "1"), ("d", "64"), ("M", "333"), ("N", "1100")])),
        ("softcap", sets(&[("H", "2"), ("d", "128"), ("M", "200"), ("N", "201"), ("cap", "2.0")])),
        ("document", sets(&[("H", "2"), ("H_kv", "1"), ("d", "64"), ("N", "1100")])),
        ("prefix_lm", sets(&[("H", "2"), ("d", "32"), ("N", "517"), ("prefix", "100")])),
        ("sinks", sets(&[("H", "4"), ("H_kv", "2"), ("d", "16"), ("N", "1030"), ("window", "64"), ("sinks", "3")])),
        ("relative_bias", sets(&[("H", "2"), ("H_kv", "1"), ("d", "64"), ("M", "300"), ("N", "700"), ("R", "40")])),
    ];
    for (seed, (name, s)) in cases.iter().enumerate() {
        let c = compile_stdlib(name, s);
        let inputs = inputs_of(&c, 100 + seed as u64);
        let (tensors, dims) = bind::bind_inputs(&c.program, inputs.clone(), &Default::default()).unwrap();
        let want = interp::evaluate(&c.program, &tensors, &dims).remove(0);
        let got = gpu.run(&plan::plan(&c.program, &dims), &inputs).unwrap().0.remove(0);
        assert!(got.data.iter().all(|v| !v.is_nan()), "{name}: NaN from the kernels");
        assert_close(&got, &want, 1e-4, &format!("{name} forward {s:?}"));
        // The kernel CUDA runs: rows shared by the lanes of a plane (`attention_split`).
        if seed % 2 == 0 {
            let tiled = needs_wgpu().with_register_tiles();
            let got = tiled.run(&plan::plan(&c.program, &dims), &inputs).unwrap().0.remove(0);
            assert_close(&got, &want, 1e-4, &format!("{name} forward, register tiles"));
        }
    }
    // The gradient programs (dQ, dK, dV through the functions) at smaller sizes.
    for (seed, name) in VARIANTS.iter().enumerate() {
        let c = compile_stdlib(name, &variant_sets(name, "150"));
        let grad = attnc_compiler::grad::differentiate(&c.program, &[]).unwrap();
        let inputs = gradient_inputs(&c, &grad, 200 + seed as u64);
        let (tensors, dims) = bind::bind_inputs(&grad, inputs.clone(), &Default::default()).unwrap();
        let want = interp::evaluate(&grad, &tensors, &dims);
        let got = gpu.run(&plan::plan(&grad, &dims), &inputs).unwrap().0;
        for ((out, _), (g, w)) in grad.outputs.iter().zip(got.iter().zip(&want)) {
            assert!(g.data.iter().all(|v| !v.is_nan()), "{name}: NaN in {out}");
            assert_close(g, w, 1e-4, &format!("{name} {out}"));
        }
    }
}

/// The inputs of `grad`, the gradient program of `c`: `c`'s seeded ones
/// (document ids in runs, …) and cotangents drawn for the rest.
fn gradient_inputs(
    c: &attnc_compiler::Compiled,
    grad: &attnc_compiler::ir::Program,
    seed: u64,
) -> BTreeMap<String, Tensor> {
    let mut inputs = inputs_of(c, seed);
    let (drawn, _) = bind::generate_inputs(grad, seed + 100).unwrap();
    for (input, t) in grad.inputs.iter().zip(drawn) {
        inputs.entry(input.name.clone()).or_insert(t);
    }
    inputs
}

/// In half precision, attention's backward through score and mask
/// functions runs on matrix fragments too (`mma::flash_grad`, fragments in
/// software): dQ, dK and dV of every stdlib variant at several tiles each
/// way (64-row cubes, 16-row tiles) and unequal lengths, GQA, against the
/// same-dtype reference by the half-precision rule; read tensors' gradients
/// (`relative_bias`'s table, `alibi`'s slopes where differentiated) stay on
/// their scalar kernels and are checked alike.
#[test]
fn half_precision_function_gradients_run_on_fragments() {
    use attnc_compiler::plan::{Dtype, KernelSpec};
    let gpu = needs_wgpu().with_software_fragments();
    let dtype = Dtype::F16;
    gpu.supports(dtype).unwrap_or_else(|e| panic!("this test needs {dtype} kernels: {e}"));
    let cases: Vec<(&str, Vec<(&'static str, String)>)> = vec![
        ("alibi", sets(&[("H", "2"), ("H_kv", "1"), ("d", "64"), ("M", "70"), ("N", "300")])),
        ("softcap", sets(&[("H", "2"), ("d", "32"), ("M", "130"), ("N", "130"), ("cap", "2.0")])),
        ("document", sets(&[("H", "2"), ("H_kv", "1"), ("d", "32"), ("N", "333")])),
        ("prefix_lm", sets(&[("H", "2"), ("d", "24"), ("N", "200"), ("prefix", "40")])),
        ("sinks", sets(&[("H", "2"), ("d", "16"), ("N", "400"), ("window", "64"), ("sinks", "3")])),
        ("relative_bias", sets(&[("H", "2"), ("d", "64"), ("M", "100"), ("N", "250"), ("R", "40")])),
    ];
    for (seed, (name, s)) in cases.iter().enumerate() {
        let c = compile_stdlib(name, s);
        let grad = attnc_compiler::grad::differentiate(&c.program, &[]).unwrap();
        let inputs = gradient_inputs(&c, &grad, 500 + seed as u64);
        let (tensors, dims) = bind::bind_inputs(&grad, inputs.clone(), &Default::default()).unwrap();
        let want = interp::evaluate(&grad, &tensors, &dims);
        let plan = plan::plan(&grad, &dims).in_dtype(dtype);
        let kinds: Vec<_> = (plan.launches.iter())
            .filter(|l| matches!(l.spec, KernelSpec::AttentionGrad { .. }) && l.spec.fragments())
            .map(|l| l.spec.kind())
            .collect();
        assert!(kinds.contains(&"attention_grad_q") && kinds.contains(&"attention_grad_kv"), "{name}: {kinds:?}");
        let same = interp::evaluate_planned(&grad, &plan, &tensors);
        let got = gpu.run(&plan, &inputs).unwrap_or_else(|e| panic!("{name}: {e}")).0;
        for (((out, _), (g, w)), r) in grad.outputs.iter().zip(got.iter().zip(&want)).zip(&same) {
            assert!(w.data.iter().any(|v| *v != 0.0), "{name}: {out} is all zero in the reference");
            half_rule(&g.data, &w.data, &r.data, dtype)
                .unwrap_or_else(|e| panic!("{name} {out} in {dtype} on fragments: {e}"));
        }
    }
}

/// In half precision, attention with score and mask functions runs on
/// matrix fragments (the tensor-core kernel, `mma::flash`; fragments
/// computed in software on lavapipe): every stdlib variant, and the padded
/// decode step with `lengths` (a mask function the compiler writes), in f16
/// (wgpu has no bf16; CUDA's bf16 kernels are compiled by
/// `tests/cuda_compile.rs`), several key tiles and unequal lengths, held to
/// the half-precision rule against the same-dtype reference (`common::half_rule`).
#[test]
fn half_precision_functions_run_on_fragments() {
    use attnc_compiler::plan::{Dtype, KernelSpec};
    let gpu = needs_wgpu().with_software_fragments();
    let cases: Vec<(&str, Vec<(&'static str, String)>)> = vec![
        ("alibi", sets(&[("H", "2"), ("H_kv", "1"), ("d", "64"), ("M", "70"), ("N", "300")])),
        ("softcap", sets(&[("H", "2"), ("d", "32"), ("M", "130"), ("N", "130"), ("cap", "2.0")])),
        ("document", sets(&[("H", "2"), ("H_kv", "1"), ("d", "32"), ("N", "333")])),
        ("prefix_lm", sets(&[("H", "2"), ("d", "32"), ("N", "200"), ("prefix", "40")])),
        ("sinks", sets(&[("H", "2"), ("d", "16"), ("N", "400"), ("window", "64"), ("sinks", "3")])),
        ("relative_bias", sets(&[("H", "2"), ("d", "64"), ("M", "100"), ("N", "250"), ("R", "40")])),
        ("kvcache", sets(&[("H", "2"), ("H_kv", "1"), ("d", "64"), ("B", "3"), ("M", "5"), ("N", "300")])),
    ];
    for dtype in [Dtype::F16] {
        gpu.supports(dtype).unwrap_or_else(|e| panic!("this test needs {dtype} kernels: {e}"));
        for (seed, (name, s)) in cases.iter().enumerate() {
            let c = compile_stdlib(name, s);
            let mut inputs = inputs_of(&c, 400 + seed as u64);
            if let Some(lengths) = inputs.get_mut("lengths") {
                lengths.data = vec![300.0, 171.0, 40.0];
            }
            let (tensors, dims) = bind::bind_inputs(&c.program, inputs.clone(), &Default::default()).unwrap();
            let want = interp::evaluate(&c.program, &tensors, &dims).remove(0);
            let plan = plan::plan(&c.program, &dims).in_dtype(dtype);
            let on_fragments =
                plan.launches.iter().any(|l| matches!(l.spec, KernelSpec::Attention { fragments: true, .. }));
            assert!(on_fragments, "{name} in {dtype}: attention is not on fragments");
            let same = interp::evaluate_planned(&c.program, &plan, &tensors).remove(0);
            let got = gpu.run(&plan, &inputs).unwrap_or_else(|e| panic!("{name}: {e}")).0.remove(0);
            assert!(want.data.iter().any(|v| *v != 0.0), "{name}: the reference is all zero");
            half_rule(&got.data, &want.data, &same.data, dtype)
                .unwrap_or_else(|e| panic!("{name} in {dtype} on fragments: {e}"));
        }
    }
}

/// A read outside a captured tensor is an error naming the function, the
/// tensor, the index, its shape and the call.
#[test]
fn an_out_of_range_read_names_the_tensor_and_the_index() {
    let text = "spec oob\nparam H: int = 2\ndim B = 1\ndim N = 6\ninput q: [B, H, N, 4]\ninput k: [B, H, N, 4]\n\
        input v: [B, H, N, 4]\ninput bias: [H, N]\n\
        output o = attention(q, k, v, score = |s, b, h, i, j| s + bias[h, i - j])\n";
    let c = attnc_compiler::compile(text, &[]).unwrap();
    let inputs = inputs_of(&c, 1);
    let (tensors, dims) = bind::bind_inputs(&c.program, inputs, &Default::default()).unwrap();
    let err = interp::try_evaluate(&c.program, &tensors, &dims).unwrap_err().to_string();
    assert_eq!(err, "the score function reads `bias[0, -1]`, outside its shape [2, 6] (at b=0, h=0, i=0, j=1)");
    // The CLI: error E0604 with that message, a non-zero exit, no output file.
    let dir = std::env::temp_dir().join(format!("attnc-oob-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (spec, out) = (dir.join("oob.attn"), dir.join("out.safetensors"));
    std::fs::write(&spec, text).unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_attnc"))
        .args(["run", spec.to_str().unwrap(), "--seed", "1", "--backend", "interp", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "an out-of-range read must fail");
    assert!(stderr.contains("error[E0604]: the score function reads `bias["), "{stderr}");
    assert!(!out.exists(), "nothing is written");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Errors inside a function are diagnostics at the offending text.
#[test]
fn errors_inside_functions_point_at_them() {
    let head = "spec e\ndim N = 6\ninput q: [1, 2, N, 4]\ninput k: [1, 2, N, 4]\ninput v: [1, 2, N, 4]\n\
        input t: [2, N]\nlet u = q * 2.0\n";
    let cases = [
        ("score = |s, b, h, i| s", "E0201", "a score function takes 5 parameters, this one takes 4", "|s, b, h, i| s"),
        ("score = |s, b, h, i, j| s + w", "E0101", "unknown name `w`", "w"),
        ("score = |s, b, h, i, j| s + t", "E0203", "`t` is a tensor: a function reads one entry of it", "t"),
        ("score = |s, b, h, i, j| t[h]", "E0302", "`t` has shape [2, N] (2 axes) but is read with 1 indices", "t[h]"),
        ("score = |s, b, h, i, j| t[h, s]", "E0201", "an index needs an int, found a float", "s"),
        ("score = |s, b, h, i, j| u[0, 0, i, 0]", "E0203", "`u` is computed by the spec", "u"),
        ("score = |s, b, h, i, j| j <= i", "E0201", "a score function returns a float, this one a bool", "j <= i"),
        ("mask = |b, h, i, j| i - j", "E0201", "a mask function returns a bool, this one an int", "i - j"),
        ("mask = |b, h, i, j| i % 2.0 == 0", "E0201", "`%` takes integers", "i % 2.0"),
        ("mask = |b, h, i, j| sinh(i) > 0.0", "E0102", "`sinh` cannot be called inside a mask function", "sinh"),
        ("mask = |b, h, i, i| true", "E0103", "parameter `i` is named twice", "i"),
        (
            "window = |b, h, i, j| true",
            "E0203",
            "argument `window` of `attention` is not a function",
            "|b, h, i, j| true",
        ),
    ];
    for (arg, code, message, at) in cases {
        let text = format!("{head}output o = attention(q, k, v, {arg})\n");
        let start = assert_points_at(&text, code, message, at);
        let out_line = text.lines().last().unwrap();
        assert!(start >= text.len() - out_line.len() - 1, "{arg}: the span is not in the function");
    }
}

/// A grammar-directed generator of score and mask functions: integer index
/// arithmetic, comparisons, logic, `where`, float functions, reads of a
/// captured tensor and dims.
fn int_expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        prop::sample::select(vec!["i", "j", "h", "b", "N", "3", "7", "0", "8", "64"]).prop_map(str::to_string),
    ];
    leaf.prop_recursive(2, 8, 2, |inner| {
        prop_oneof![
            (inner.clone(), prop::sample::select(vec!["+", "-", "*", "%"]), inner.clone())
                .prop_map(|(a, op, b)| format!("({a} {op} {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("floordiv({a}, {b})")),
            inner.clone().prop_map(|a| format!("abs({a})")),
            (inner.clone(), inner).prop_map(|(a, b)| format!("minimum({a}, {b})")),
        ]
    })
}

fn bool_expr() -> impl Strategy<Value = String> {
    let cmp = (int_expr(), prop::sample::select(vec!["<", "<=", "==", "!=", ">", ">="]), int_expr())
        .prop_map(|(a, op, b)| format!("{a} {op} {b}"));
    cmp.prop_recursive(2, 6, 2, |inner| {
        prop_oneof![
            (inner.clone(), prop::sample::select(vec!["and", "or"]), inner.clone())
                .prop_map(|(a, op, b)| format!("({a} {op} {b})")),
            inner.prop_map(|a| format!("not ({a})")),
        ]
    })
}

fn float_expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("s".to_string()),
        int_expr().prop_map(|e| format!("t[h, {e} % N]")),
        int_expr().prop_map(|e| format!("0.01 * {e}")),
    ];
    leaf.prop_recursive(3, 10, 2, |inner| {
        prop_oneof![
            (inner.clone(), prop::sample::select(vec!["+", "-", "*"]), inner.clone())
                .prop_map(|(a, op, b)| format!("({a} {op} {b})")),
            (prop::sample::select(vec!["tanh", "sin", "sigmoid", "softplus", "erf"]), inner.clone())
                .prop_map(|(f, a)| format!("{f}({a})")),
            (bool_expr(), inner.clone(), inner).prop_map(|(c, a, b)| format!("where({c}, {a}, {b})")),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10))]

    /// Random functions on the kernels against the interpreter: every read
    /// stays in range by construction (`t` is indexed modulo its length,
    /// `%` being non-negative), and integer expressions two levels deep stay
    /// within the kernels' 32 bits.
    #[test]
    fn generated_functions_on_the_kernels_match_the_interpreter(
        score in float_expr(), mask in bool_expr(), n in 3usize..80, m in 3usize..80, d in prop::sample::select(vec![4usize, 8, 16, 32]),
        seed in any::<u64>()
    ) {
        let text = format!(
            "spec gen\ndim M = {m}\ndim N = {n}\ninput q: [1, 2, M, {d}]\ninput k: [1, 1, N, {d}]\ninput v: [1, 1, N, {d}]\n\
             input t: [2, N]\noutput o = attention(q, k, v, score = |s, b, h, i, j| {score}, mask = |b, h, i, j| {mask})\n"
        );
        let c = attnc_compiler::compile(&text, &[])
            .unwrap_or_else(|e| panic!("{}\n{}", text, attnc_compiler::render("gen.attn", &text, &e)));
        let inputs = inputs_of(&c, seed);
        let (tensors, dims) = bind::bind_inputs(&c.program, inputs.clone(), &Default::default()).unwrap();
        let want = interp::try_evaluate(&c.program, &tensors, &dims);
        prop_assume!(want.is_ok());
        let want = want.unwrap().remove(0);
        let gpu = needs_wgpu();
        let got = gpu.run(&plan::plan(&c.program, &dims), &inputs).unwrap().0.remove(0);
        prop_assert!(got.data.iter().all(|v| !v.is_nan()), "NaN for\n{}", text);
        let e = attnc_runtime::relative_error(&got.data, &want.data);
        prop_assert!(e <= 1e-4, "kernels differ by {:e} for\n{}", e, text);
    }
}

/// Score functions reading `t` at indices of every kind the kernels group
/// pairs by (neither `i` nor `j`, one of them, only `i − j`) and of kinds
/// they refuse (`i + j`, `i − (j − 1)`), each with a random expression.
fn indexed_reads() -> impl Strategy<Value = String> {
    let index = prop_oneof![
        prop::sample::select(vec![
            "i - j",
            "j - i + 3",
            "abs(i - j) * 3",
            "minimum(i - j, 4)",
            "floordiv(i - j, 3)",
            "(j - i) % 5",
            "i",
            "j",
            "h + b",
            "i + j",
            "i * 2 - j",
            "i - (j - 1)",
        ])
        .prop_map(str::to_string),
        int_expr(),
    ];
    (index.clone(), index, float_expr())
        .prop_map(|(a, b, f)| format!("s * t[h, ({a}) % N] - t[1 - h, ({b}) % N] * tanh({f})"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// The gradient of the tensor random score functions read, on the
    /// kernels against the interpreter (per element 1e-4 of the largest
    /// entry, plus 1e-5 for sums that cancel), wherever the
    /// kernels compute it; where they refuse it (an index of `i` and `j`
    /// other than through `i − j`), the refusal names it. Checks that
    /// `grad::Lines::of` never groups pairs that read different entries.
    #[test]
    fn generated_score_functions_read_gradients_on_the_kernels(
        score in prop_oneof![float_expr(), indexed_reads()], n in 3usize..70, m in 3usize..70, seed in any::<u64>()
    ) {
        let text = format!(
            "spec gen\ndim M = {m}\ndim N = {n}\ninput q: [1, 2, M, 8]\ninput k: [1, 1, N, 8]\ninput v: [1, 1, N, 8]\n\
             weight t: [2, N]\noutput o = attention(q, k, v, mask = causal, score = |s, b, h, i, j| {score})\n"
        );
        let c = compile(&text);
        let grad = attnc_compiler::grad::differentiate(&c.program, &["t".to_string()]).unwrap();
        let mut inputs = inputs_of(&c, seed);
        let (drawn, _) = bind::generate_inputs(&grad, seed ^ 1).unwrap();
        for (input, t) in grad.inputs.iter().zip(drawn) {
            inputs.entry(input.name.clone()).or_insert(t);
        }
        let (tensors, dims) = bind::bind_inputs(&grad, inputs.clone(), &Default::default()).unwrap();
        let want = interp::try_evaluate(&grad, &tensors, &dims);
        prop_assume!(want.is_ok());
        let want = want.unwrap();
        let p = plan::plan(&grad, &dims);
        let gpu = needs_wgpu();
        match p.launches.iter().find_map(|l| l.spec.kernel_gap()) {
            Some(gap) => {
                let err = gpu.run(&p, &inputs).unwrap_err().to_string();
                prop_assert!(err.contains(gap), "{}\n{}", err, text);
            }
            None => {
                let got = gpu.run(&p, &inputs).unwrap().0;
                for (g, w) in got.iter().zip(&want) {
                    prop_assert!(g.data.iter().all(|v| !v.is_nan()), "NaN for\n{}", text);
                    // Per element, against the largest entry, with an absolute floor: an entry
                    // sums up to M·N terms that cancel exactly (to 0 in float64, to ~1e-7 in
                    // f32) where every key's score is the same function of the entry.
                    let top = w.data.iter().fold(0f64, |a, x| a.max(x.abs()));
                    let worst = g.data.iter().zip(&w.data).fold(0f64, |a, (x, y)| a.max((x - y).abs()));
                    prop_assert!(worst <= 1e-4 * top + 1e-5, "kernels differ by {:e} (largest {:e}) for\n{}", worst, top, text);
                }
            }
        }
    }
}

/// The tile functions (`sparsity`) are sound: over tiles of several sizes
/// and places, a tile called empty (`any` false) has no visible pair and a
/// tile called full (`hidden` false) no hidden one, the mask evaluated at
/// every pair by the interpreter. The stdlib masks' tiles are mostly decided
/// (at least one empty or full tile each), as their kernels rely on.
#[test]
fn tile_functions_never_misjudge_a_tile() {
    use attnc_compiler::ir::Op;
    use attnc_runtime::interp::func::{call, Env, FVal};
    for (seed, name) in ["document", "prefix_lm", "sinks"].iter().enumerate() {
        let c = compile_stdlib(name, &variant_sets(name, "300"));
        let inputs = inputs_of(&c, 400 + seed as u64);
        let (_, dims) = bind::bind_inputs(&c.program, inputs.clone(), &Default::default()).unwrap();
        let fns = c.program.nodes.iter().find_map(|n| match &n.op {
            Op::Attention { fns: Some(f), .. } => Some(f.clone()),
            _ => None,
        });
        let fns = fns.expect("a mask function");
        let mask = fns.mask.as_ref().unwrap().resolve(&dims);
        let tiles = attnc_compiler::sparsity::tile_fns(&mask);
        let (any, hidden) = (tiles.any.resolve(&dims), tiles.hidden.resolve(&dims));
        let names: Vec<String> = fns
            .captures
            .iter()
            .map(|id| c.program.inputs.iter().find(|i| i.node == *id).unwrap().name.clone())
            .collect();
        let env = Env { captures: names.iter().map(|n| (n.as_str(), &inputs[n])).collect(), dims: &dims };
        let n = 300usize;
        let (mut empty, mut full) = (0, 0);
        for (bq, bk) in [(64usize, 8usize), (1, 1), (37, 13), (256, 32)] {
            for q0 in (0..n).step_by(bq) {
                for k0 in (0..n).step_by(bk) {
                    let (q1, k1) = ((q0 + bq - 1).min(n - 1), (k0 + bk - 1).min(n - 1));
                    let args = [0, 1, q0, q1, k0, k1].map(|x| FVal::Int(x as i64));
                    let may_see = call(&any, &args, &env, [0, 1, q0, k0]).unwrap() == FVal::Bool(true);
                    let may_hide = call(&hidden, &args, &env, [0, 1, q0, k0]).unwrap() == FVal::Bool(true);
                    let seen: Vec<bool> = (q0..=q1)
                        .flat_map(|i| (k0..=k1).map(move |j| (i, j)))
                        .map(|(i, j)| {
                            let a = [0, 1, i, j].map(|x| FVal::Int(x as i64));
                            call(&mask, &a, &env, [0, 1, i, j]).unwrap() == FVal::Bool(true)
                        })
                        .collect();
                    assert!(may_see || !seen.iter().any(|s| *s), "{name}: tile {q0}..={q1} x {k0}..={k1} called empty");
                    assert!(may_hide || seen.iter().all(|s| *s), "{name}: tile {q0}..={q1} x {k0}..={k1} called full");
                    empty += usize::from(!may_see);
                    full += usize::from(!may_hide);
                }
            }
        }
        assert!(empty > 0 && full > 0, "{name}: {empty} tiles decided empty, {full} full");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The tile functions of generated masks (and of block masks written
    /// with `%`) never call a tile empty or full wrongly.
    #[test]
    fn generated_masks_tile_functions_are_sound(
        mask in prop_oneof![bool_expr(), (1usize..5).prop_map(|k| format!("j <= i and i - i % {} == j - j % {}", 1 << k, 1 << k))],
        bq in 1usize..40, bk in 1usize..20, seed in any::<u64>()
    ) {
        use attnc_runtime::interp::func::{call, Env, FVal};
        let n = 60usize;
        let text = format!(
            "spec gen\ndim N = {n}\ninput q: [1, 2, N, 4]\ninput k: [1, 1, N, 4]\ninput v: [1, 1, N, 4]\n\
             output o = attention(q, k, v, mask = |b, h, i, j| {mask})\n"
        );
        let c = attnc_compiler::compile(&text, &[]).unwrap_or_else(|e| panic!("{}", attnc_compiler::render("gen.attn", &text, &e)));
        let dims = bind::default_dims(&c.program).unwrap();
        let f = c.program.nodes.iter().find_map(|n| match &n.op {
            attnc_compiler::ir::Op::Attention { fns: Some(f), .. } => f.mask.clone(),
            _ => None,
        });
        let m = f.unwrap().resolve(&dims);
        let t = attnc_compiler::sparsity::tile_fns(&m);
        let env = Env { captures: vec![], dims: &dims };
        let mut rng = Rng::for_input(seed, "tiles");
        for _ in 0..20 {
            let (q0, k0, h) = ((rng.unit() * n as f64) as usize, (rng.unit() * n as f64) as usize, (rng.unit() * 2.0) as usize);
            let (q1, k1) = ((q0 + bq - 1).min(n - 1), (k0 + bk - 1).min(n - 1));
            let args = [0, h, q0, q1, k0, k1].map(|x| FVal::Int(x as i64));
            let any = call(&t.any, &args, &env, [0; 4]).unwrap() == FVal::Bool(true);
            let hidden = call(&t.hidden, &args, &env, [0; 4]).unwrap() == FVal::Bool(true);
            for i in q0..=q1 {
                for j in k0..=k1 {
                    let seen = call(&m, &[0, h, i, j].map(|x| FVal::Int(x as i64)), &env, [0; 4]).unwrap() == FVal::Bool(true);
                    prop_assert!(any || !seen, "{}: tile {}..={} x {}..={} called empty, ({}, {}) seen", mask, q0, q1, k0, k1, i, j);
                    prop_assert!(hidden || seen, "{}: tile {}..={} x {}..={} called full, ({}, {}) hidden", mask, q0, q1, k0, k1, i, j);
                }
            }
        }
    }
}

/// The gradients of tensors a score function reads, on the kernels
/// (`plan::reads`: a unit per line of pairs, then a unit per entry), against
/// the interpreter (f32, 1e-4 relative and per element against the largest
/// entry): ALiBi's slopes (lines of query rows), the
/// relative-bias table at `clamp(i − j)` and the issue's `[H, 2N − 1]` table
/// at `i − j + N − 1` (diagonals), a per-key bias (key rows), a tensor read
/// at two indices; several tiles, unequal lengths, GQA. Two runs agree bit
/// for bit. An index of `i` and `j` otherwise is refused by name.
#[test]
fn kernels_compute_the_gradients_of_read_tensors() {
    let gpu = needs_wgpu();
    let inline = |score: &str, table: &str, m: usize, n: usize| {
        format!(
            "spec reads\ndim M = {m}\ndim N = {n}\ninput q: [2, 4, M, 32]\ninput k: [2, 2, N, 32]\n\
             input v: [2, 2, N, 16]\ninput t: {table}\n\
             output o = attention(q, k, v, mask = causal, score = |s, b, h, i, j| {score})\n"
        )
    };
    let cases: Vec<(String, attnc_compiler::Compiled, &str)> = vec![
        (
            "alibi".into(),
            compile_stdlib("alibi", &sets(&[("H", "2"), ("H_kv", "1"), ("d", "64"), ("M", "400"), ("N", "1030")])),
            "slopes",
        ),
        (
            "relative_bias".into(),
            compile_stdlib(
                "relative_bias",
                &sets(&[("H", "2"), ("H_kv", "1"), ("d", "32"), ("M", "300"), ("N", "1030"), ("R", "40")]),
            ),
            "bias",
        ),
        (
            "[H, 2N - 1] at i - j + N - 1".into(),
            compile(&inline("s + t[h, i - j + N - 1]", "[4, 2 * N - 1]", 400, 400)),
            "t",
        ),
        ("per-key bias".into(), compile(&inline("s - 0.5 * t[b, j] * t[b, j]", "[2, N]", 130, 1030)), "t"),
        ("two indices".into(), compile(&inline("s * t[h % 2, 0] + tanh(t[1, j % 3])", "[2, 3]", 100, 300)), "t"),
        // Wide heads: the read kernels' dot products in chunks of d = 128 and 256.
        (
            "relative_bias, d = 128".into(),
            compile_stdlib(
                "relative_bias",
                &sets(&[("H", "2"), ("H_kv", "1"), ("d", "128"), ("M", "150"), ("N", "260"), ("R", "20")]),
            ),
            "bias",
        ),
        (
            "alibi, d = 256".into(),
            compile_stdlib("alibi", &sets(&[("H", "2"), ("H_kv", "2"), ("d", "256"), ("M", "70"), ("N", "300")])),
            "slopes",
        ),
    ];
    for (seed, (name, c, read)) in cases.iter().enumerate() {
        // q, k and v's kernels are held to the interpreter elsewhere (the interpreter's time).
        let wrt = vec![read.to_string()];
        let grad = attnc_compiler::grad::differentiate(&c.program, &wrt).unwrap();
        let mut inputs = inputs_of(c, 400 + seed as u64);
        let (drawn, _) = bind::generate_inputs(&grad, 500 + seed as u64).unwrap();
        for (input, t) in grad.inputs.iter().zip(drawn) {
            inputs.entry(input.name.clone()).or_insert(t);
        }
        let (tensors, dims) = bind::bind_inputs(&grad, inputs.clone(), &Default::default()).unwrap();
        let want = interp::evaluate(&grad, &tensors, &dims);
        let p = plan::plan(&grad, &dims);
        assert!(p.launches.iter().any(|l| l.spec.kind() == "attention_grad_read_sum"), "{name}: {:?}", p.launches);
        // Asked for the read tensor alone, the program computes no dQ, dK or dV.
        let qkv = ["attention_grad_q", "attention_grad_k", "attention_grad_v", "attention_grad_kv"];
        assert!(p.launches.iter().all(|l| !qkv.contains(&l.spec.kind())), "{name}: {:?}", p.launches);
        let got = gpu.run(&p, &inputs).unwrap().0;
        for ((out, _), (g, w)) in grad.outputs.iter().zip(got.iter().zip(&want)) {
            assert!(g.data.iter().all(|v| v.is_finite()), "{name}: not finite in {out}");
            assert_close(g, w, 1e-4, &format!("{name} {out}"));
            let top = w.data.iter().fold(0f64, |a, x| a.max(x.abs()));
            let worst = g.data.iter().zip(&w.data).fold(0f64, |a, (x, y)| a.max((x - y).abs()));
            assert!(worst <= 1e-4 * top, "{name} {out}: an element off by {worst:e} (largest {top:e})");
            assert!(top > 1e-3, "{name} {out}: a degenerate gradient");
        }
        let again = gpu.run(&p, &inputs).unwrap().0;
        for ((out, _), (a, b)) in grad.outputs.iter().zip(got.iter().zip(&again)) {
            let same = a.data.iter().zip(&b.data).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{name} {out}: two runs differ");
        }
    }
    // An index of i and j other than through i - j: refused by name, writing nothing.
    let c = compile(&inline("s + t[i % 3, j % 3]", "[3, 3]", 20, 20).replace("input t:", "weight t:"));
    let grad = attnc_compiler::grad::differentiate(&c.program, &["t".to_string()]).unwrap();
    let (drawn, _) = bind::generate_inputs(&grad, 1).unwrap();
    let inputs: BTreeMap<String, Tensor> = grad.inputs.iter().map(|i| i.name.clone()).zip(drawn).collect();
    let (_, dims) = bind::bind_inputs(&grad, inputs.clone(), &Default::default()).unwrap();
    let err = gpu.run(&plan::plan(&grad, &dims), &inputs).unwrap_err().to_string();
    assert!(err.contains("attention_grad_read") && err.contains("other than i - j"), "{err}");
    assert!(err.contains("--backend interp"), "{err}");
    // Not differentiated by default, a weight though it is, as the kernels refuse it.
    let g = attnc_compiler::grad::differentiate(&c.program, &[]).unwrap();
    assert!(g.outputs.iter().all(|(n, _)| n != "grad_t"), "t differentiated by default");
}

fn compile(text: &str) -> attnc_compiler::Compiled {
    attnc_compiler::compile(text, &[]).unwrap_or_else(|e| panic!("{}", attnc_compiler::render("x.attn", text, &e)))
}

/// The cost model prices dK and dV as their kernels walk: the tiled kernels
/// skip the query tiles a mask function hides (as dQ skips key tiles), so
/// their work is discounted by the visited fraction; the fragment kernels
/// (half precision) walk the whole band, so theirs is not.
#[test]
fn dk_dv_are_priced_as_their_kernels_walk() {
    let sets = [("N", "1024".to_string()), ("window", "64".to_string())];
    let c = compile_stdlib("sinks", &sets);
    let grad = attnc_compiler::grad::differentiate(&c.program, &[]).unwrap();
    let (tensors, _) = bind::generate_inputs(&grad, 3).unwrap();
    let inputs: BTreeMap<_, _> = grad.inputs.iter().map(|i| i.name.clone()).zip(tensors).collect();
    let (_, dims) = bind::bind_inputs(&grad, inputs, &Default::default()).unwrap();
    let kv = |p: &plan::Plan| -> Vec<(f64, f64, bool)> {
        (p.launches.iter())
            .filter(|l| matches!(l.spec, plan::KernelSpec::AttentionGrad { wrt: attnc_compiler::ir::AttnArg::K, .. }))
            .map(|l| (l.flops, plan::visited_fraction(&l.spec), l.spec.fragments()))
            .collect()
    };
    let tiled = kv(&plan::plan(&grad, &dims));
    let frags = kv(&plan::plan(&grad, &dims).in_dtype(plan::Dtype::F16));
    assert_eq!(tiled.len(), 1, "one dK launch (with dV): {tiled:?}");
    let ((flops, seen, on), (frag_flops, _, frag_on)) = (tiled[0], frags[0]);
    assert!(!on && frag_on, "f32 tiled, f16 on fragments: {tiled:?} {frags:?}");
    assert!(seen < 0.5, "a window of 64 of 1024 keys hides most tiles: visited {seen}");
    let full = flops / seen;
    assert!((frag_flops - full).abs() <= 1e-9 * full, "fragments priced at the whole band: {frag_flops} vs {full}");
}
