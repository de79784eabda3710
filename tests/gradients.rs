//! Reverse-mode gradients (`compiler::grad`) against central finite
//! differences of the float64 interpreter: for every differentiated input,
//! the gradient's inner product with random directions equals the
//! derivative of ⟨cotangent, output⟩ along them, and small tensors (the
//! mixing coefficients α and the collapse R) are checked element by element.

mod common;

use attnc_compiler::grad::{cotangent_name, differentiate, gradient_name, split};
use attnc_compiler::ir::{Op, Program};
use attnc_compiler::Code;
use attnc_runtime::rng::Rng;
use attnc_runtime::{bind, interp, Tensor};
use common::*;
use std::collections::BTreeMap;

/// Relative error allowed between the gradient and the central difference.
const TOL: f64 = 1e-6;

fn sets(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// ⟨cot, f(inputs)⟩ summed over the outputs.
fn objective(p: &Program, inputs: &BTreeMap<String, Tensor>, cot: &BTreeMap<String, Tensor>) -> f64 {
    let (tensors, dims) = bind::bind_inputs(p, inputs.clone(), &Default::default()).expect("inputs bind");
    let outs = interp::evaluate(p, &tensors, &dims);
    p.outputs
        .iter()
        .zip(&outs)
        .map(|((n, _), y)| y.data.iter().zip(&cot[n].data).map(|(a, b)| a * b).sum::<f64>())
        .sum()
}

/// Checks every gradient of `p` at its seeded inputs; returns the largest relative error.
fn check(p: &Program, seed: u64, what: &str) -> f64 {
    check_wrt(p, seed, what, &[])
}

/// [`check`] of the gradients by `wrt` (every differentiable input when empty).
fn check_wrt(p: &Program, seed: u64, what: &str, wrt: &[String]) -> f64 {
    let g = differentiate(p, wrt).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(attnc_compiler::valid::validate(&g).is_empty(), "{what}: invalid gradient program");
    let (drawn, _) = bind::generate_inputs(&g, seed).unwrap();
    let all: BTreeMap<String, Tensor> = g.inputs.iter().map(|i| i.name.clone()).zip(drawn).collect();
    let forward: BTreeMap<String, Tensor> = p.inputs.iter().map(|i| (i.name.clone(), all[&i.name].clone())).collect();
    let cot: BTreeMap<String, Tensor> =
        p.outputs.iter().map(|(n, _)| (n.clone(), all[&cotangent_name(n)].clone())).collect();
    let (tensors, dims) = bind::bind_inputs(&g, all.clone(), &Default::default()).unwrap();
    let results = interp::evaluate(&g, &tensors, &dims);
    let result = |name: &str| &results[g.outputs.iter().position(|(n, _)| n == name).expect(name)];
    // The forward outputs are the forward program's.
    let (ft, fd) = bind::bind_inputs(p, forward.clone(), &Default::default()).unwrap();
    for ((n, _), y) in p.outputs.iter().zip(interp::evaluate(p, &ft, &fd)) {
        assert_eq!(result(n).data, y.data, "{what}: forward output {n}");
    }
    let mut worst: f64 = 0.0;
    let mut rng = Rng::for_input(seed, "directions");
    for input in &p.inputs {
        let Some(grad) = g.outputs.iter().position(|(n, _)| *n == gradient_name(&input.name)) else { continue };
        let grad = &results[grad];
        let x = &forward[&input.name];
        assert_eq!(grad.shape, x.shape, "{what}: grad_{} shape", input.name);
        assert!(grad.data.iter().all(|v| v.is_finite()), "{what}: grad_{} not finite", input.name);
        let directions: Vec<Vec<f64>> = if x.len() <= 48 {
            (0..x.len()).map(|i| (0..x.len()).map(|j| f64::from(i == j)).collect()).collect()
        } else {
            (0..3).map(|_| (0..x.len()).map(|_| 2.0 * rng.unit() - 1.0).collect()).collect()
        };
        for dir in directions {
            let analytic: f64 = grad.data.iter().zip(&dir).map(|(a, b)| a * b).sum();
            let step = 1e-5 * (1.0 + x.data.iter().map(|v| v.abs()).fold(0.0, f64::max));
            let moved = |sign: f64| {
                let mut inputs = forward.clone();
                let t = inputs.get_mut(&input.name).unwrap();
                t.data.iter_mut().zip(&dir).for_each(|(v, d)| *v += sign * step * d);
                objective(p, &inputs, &cot)
            };
            let numeric = (moved(1.0) - moved(-1.0)) / (2.0 * step);
            let scale = analytic.abs().max(numeric.abs()).max(1e-3);
            let err = (analytic - numeric).abs() / scale;
            assert!(
                err <= TOL,
                "{what}: grad_{}: analytic {analytic:e} vs numeric {numeric:e} (relative {err:e})",
                input.name
            );
            worst = worst.max(err);
        }
    }
    worst
}

/// Attention specs at small sizes: masks, windows, GQA, IHA's masks and
/// collapses, RoPE, a decode step.
fn attention_cases() -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    vec![
        ("mha", sets(&[("H", "2"), ("d", "4"), ("N", "40"), ("mask", "causal")])),
        ("mha", sets(&[("H", "2"), ("d", "3"), ("N", "11"), ("mask", "none"), ("window", "3")])),
        ("mha", sets(&[("H", "4"), ("H_kv", "2"), ("d", "2"), ("N", "7"), ("B", "2")])),
        ("gqa", sets(&[("H", "4"), ("d", "2"), ("N", "6")])),
        ("mqa", sets(&[("H", "3"), ("d", "2"), ("N", "6")])),
        ("iha", sets(&[("H", "2"), ("P", "1"), ("d", "2"), ("N", "6")])),
        ("iha", sets(&[("H", "2"), ("P", "2"), ("d", "4"), ("N", "33"), ("mask", "flat_causal")])),
        ("iha", sets(&[("H", "2"), ("P", "3"), ("d", "2"), ("N", "21"), ("mask", "token_causal"), ("window", "4")])),
        ("iha", sets(&[("H", "3"), ("P", "2"), ("d", "2"), ("N", "5"), ("mask", "none"), ("collapse", "per_head")])),
        ("iha", sets(&[("H", "2"), ("P", "5"), ("d", "2"), ("N", "4"), ("rope", "100.0")])),
        // A decode step: concatenation with the cache and RoPE at an offset.
        ("iha_decode", sets(&[("H", "2"), ("P", "2"), ("d", "4"), ("N", "5"), ("rope", "100.0")])),
        ("iha_decode", sets(&[("H", "2"), ("P", "3"), ("d", "2"), ("N", "3"), ("mask", "token_causal")])),
        (
            "iha",
            sets(&[
                ("H", "2"),
                ("P", "3"),
                ("d", "4"),
                ("N", "4"),
                ("rope", "10.0"),
                ("collapse", "per_head"),
                ("B", "2"),
            ]),
        ),
    ]
}

#[test]
fn attention_specs_gradients_match_finite_differences() {
    for (i, (spec, s)) in attention_cases().iter().chain(&function_cases()).enumerate() {
        let c = compile_stdlib(spec, s);
        let worst = check(&c.program, 40 + i as u64, &format!("{spec} {s:?}"));
        eprintln!("{spec} {s:?}: worst relative error {worst:.1e}");
    }
}

/// The stdlib variants with score and mask functions (their q, k and v,
/// and relative_bias's table, a weight: by default).
fn function_cases() -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    vec![
        ("alibi", sets(&[("H", "2"), ("H_kv", "1"), ("d", "3"), ("M", "6"), ("N", "9")])),
        ("softcap", sets(&[("H", "2"), ("d", "4"), ("M", "7"), ("N", "7"), ("cap", "0.5")])),
        ("document", sets(&[("H", "2"), ("d", "3"), ("N", "10")])),
        ("prefix_lm", sets(&[("H", "2"), ("d", "3"), ("N", "9"), ("prefix", "4")])),
        ("sinks", sets(&[("H", "2"), ("d", "3"), ("N", "12"), ("window", "3"), ("sinks", "2")])),
        ("relative_bias", sets(&[("H", "2"), ("d", "3"), ("M", "5"), ("N", "8"), ("R", "2")])),
        // The learned sinks (a weight).
        ("gpt_oss", sets(&[("H", "2"), ("H_kv", "1"), ("d", "3"), ("N", "9"), ("window", "4")])),
        // Sigmoid weights, their bias a score function.
        ("sigmoid", sets(&[("H", "2"), ("H_kv", "1"), ("d", "3"), ("N", "9"), ("window", "4")])),
    ]
}

#[test]
fn every_iha_weight_has_a_gradient_including_alpha_and_r() {
    let c = compile_stdlib("iha", &sets(&[("H", "2"), ("P", "3"), ("d", "2"), ("N", "5")]));
    let g = differentiate(&c.program, &[]).unwrap();
    let names: Vec<&str> = g.outputs.iter().map(|(n, _)| n.as_str()).collect();
    for input in ["x", "w_q", "w_k", "w_v", "w_o", "alpha_q", "alpha_k", "alpha_v", "r"] {
        assert!(names.contains(&gradient_name(input).as_str()), "no grad_{input} in {names:?}");
    }
    // Only what is asked for.
    let only = differentiate(&c.program, &["alpha_k".into(), "r".into()]).unwrap();
    let names: Vec<&str> = only.outputs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["y", "grad_alpha_k", "grad_r"]);
}

#[test]
fn reward_estimators_gradients_match_finite_differences() {
    let cases: Vec<(&str, Vec<(&'static str, String)>)> = vec![
        ("grpo", sets(&[])),
        ("grpo", sets(&[("std", "bessel"), ("G", "5")])),
        ("dr_grpo", sets(&[])),
        ("rloo", sets(&[("G", "3")])),
        ("gdpo", sets(&[("C", "2")])),
    ];
    for (i, (spec, s)) in cases.iter().enumerate() {
        let c = compile_stdlib(spec, s);
        check(&c.program, 70 + i as u64, &format!("{spec} {s:?}"));
    }
}

#[test]
fn discrete_inputs_have_no_gradient_and_say_so() {
    for (spec, input) in [("odrpo", "rewards"), ("maxrl", "rewards")] {
        let c = compile_stdlib(spec, &[]);
        let e = differentiate(&c.program, &[input.to_string()]).expect_err("a discrete input");
        assert_eq!(e.code, Code::NoGradient);
        assert!(e.message.contains(input) && e.message.contains("discrete"), "{}", e.message);
        assert!(differentiate(&c.program, &[]).is_err(), "{spec}: nothing to differentiate");
    }
    let c = compile_stdlib("mha", &[]);
    let e = differentiate(&c.program, &["nope".into()]).unwrap_err();
    assert!(e.code == Code::NoGradient && e.message.contains("not an input"), "{}", e.message);
}

#[test]
fn gradients_are_bit_identical_run_to_run() {
    let c = compile_stdlib("iha", &sets(&[("H", "2"), ("P", "2"), ("d", "4"), ("N", "8")]));
    let g = differentiate(&c.program, &[]).unwrap();
    assert_eq!(g, differentiate(&c.program, &[]).unwrap(), "the gradient program is deterministic");
    let (t, d) = bind::generate_inputs(&g, 3).unwrap();
    let a = interp::evaluate(&g, &t, &d);
    let b = interp::evaluate(&g, &t, &d);
    for (x, y) in a.iter().zip(&b) {
        assert!(x.data.iter().zip(&y.data).all(|(p, q)| p.to_bits() == q.to_bits()));
    }
}

/// Gradient programs are ordinary programs: the optimizer takes them (priced
/// node by node, since no kernel plans them yet) and its choice computes
/// the same gradients; `explain --mode training` prices the step.
#[test]
fn gradient_programs_optimize_and_explain() {
    let c = compile_stdlib("iha", &sets(&[("H", "2"), ("P", "2"), ("d", "4"), ("N", "8")]));
    let g = differentiate(&c.program, &[]).unwrap();
    let (t, dims) = bind::generate_inputs(&g, 9).unwrap();
    let o = attnc_compiler::opt::optimize(&g, &dims, &attnc_compiler::opt::Config::default());
    assert!(attnc_compiler::valid::validate(&o.chosen).is_empty());
    let (a, b) = (interp::evaluate(&g, &t, &dims), interp::evaluate(&o.chosen, &t, &dims));
    for (x, y) in a.iter().zip(&b) {
        assert_close(x, y, 1e-12, "optimized gradient program");
    }
    let p = attnc_runtime::pipeline::Compiler::new("iha", stdlib_source("iha")).set("N", 8).compile().unwrap();
    let text = p.explain(attnc_compiler::opt::cost::CPU, attnc_compiler::opt::cost::Mode::Training).unwrap();
    let ratio: f64 = text
        .split("the step costs ")
        .nth(1)
        .and_then(|s| s.split('x').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no training step in:\n{text}"));
    assert!(ratio > 1.5 && ratio < 10.0, "a training step costs {ratio}x the forward");
    assert!(text.contains("gradients of x, w_q") && text.contains("training step of the chosen program"), "{text}");
}

/// The optimizer's folded programs (mixing folded into the projections,
/// collapse into the output projection, merged projections) have the
/// original's gradients: differentiating the chosen program gives the same
/// values as differentiating the original (two independent derivations).
#[test]
fn optimized_programs_have_the_originals_gradients() {
    use attnc_compiler::opt::{self, cost, Config};
    let cases: Vec<(&str, Vec<(&'static str, String)>)> = vec![
        ("iha", sets(&[("H", "2"), ("P", "3"), ("d", "4"), ("N", "1")])),
        ("iha", sets(&[("H", "3"), ("P", "2"), ("d", "2"), ("N", "1"), ("collapse", "per_head")])),
        ("iha", sets(&[("H", "2"), ("P", "2"), ("d", "4"), ("N", "6")])),
        ("mha", sets(&[("H", "2"), ("d", "4"), ("N", "5")])),
    ];
    let mut folded = 0;
    for (spec, s) in &cases {
        let c = compile_stdlib(spec, s);
        let dims = bind::default_dims(&c.program).unwrap();
        for target in [cost::H200, cost::CPU] {
            for mode in [cost::Mode::Inference, cost::Mode::Training] {
                let chosen = opt::optimize(&c.program, &dims, &Config { target, mode, ..Default::default() }).chosen;
                if chosen == c.program {
                    continue;
                }
                let what = format!("{spec} {s:?} {} {mode:?}", target.name);
                let g = match differentiate(&chosen, &[]) {
                    Ok(g) => g,
                    Err(e) => panic!("{what}: {e}\n{}", chosen.pretty()),
                };
                folded += 1;
                let want = differentiate(&c.program, &[]).unwrap();
                let (t, d) = bind::generate_inputs(&want, 21).unwrap();
                let (a, b) = (interp::evaluate(&want, &t, &d), interp::evaluate(&g, &t, &d));
                for (((name, _), x), y) in want.outputs.iter().zip(&a).zip(&b) {
                    assert_close(x, y, 1e-10, &format!("{what}: {name}"));
                }
            }
        }
    }
    assert!(folded >= 3, "the optimizer folded only {folded} of the cases");
}

/// A standard deviation of equal values (a GRPO group whose rewards all
/// agree; `std` over one element) has no derivative: its gradient is taken
/// as 0 there, as `abs` takes sign(0) = 0, and no NaN reaches the inputs.
#[test]
fn equal_values_pass_back_finite_gradients() {
    let c = compile_stdlib("grpo", &sets(&[("B", "2"), ("G", "4")]));
    let g = differentiate(&c.program, &[]).unwrap();
    let rewards = Tensor::new(vec![2, 4], vec![1.0, 1.0, 1.0, 1.0, 0.5, -0.5, 2.0, 0.0]);
    let cot = Tensor::new(vec![2, 4], vec![0.3, -1.0, 0.2, 0.5, 1.0, 0.1, -0.4, 0.7]);
    let inputs = named(vec![("rewards", rewards), ("cot_advantages", cot)]);
    let (t, d) = bind::bind_inputs(&g, inputs, &Default::default()).unwrap();
    let out = interp::evaluate(&g, &t, &d);
    let grad = &out[g.outputs.iter().position(|(n, _)| n == "grad_rewards").unwrap()];
    assert!(grad.data.iter().all(|v| v.is_finite()), "{:?}", grad.data);
    let single = attnc_compiler::compile(
        "spec z\ndim B = 2\ndim G = 3\ninput a: [B, G] in finite\nlet s = std(max(a, axis = all), axis = 1)\noutput out = s + a\n",
        &[],
    )
    .unwrap();
    let g = differentiate(&single.program, &[]).unwrap();
    let (t, d) = bind::generate_inputs(&g, 1).unwrap();
    let grad = &interp::evaluate(&g, &t, &d)[1];
    assert!(grad.data.iter().all(|v| v.is_finite()), "{:?}", grad.data);
}

/// Gradients of the tensors a score function reads (ALiBi's slopes, a
/// relative-bias table, a tensor read twice and at two indices), by the
/// interpreter, against central differences; a weight by default, an input
/// by name (tests/functions.rs holds the kernels to the interpreter).
#[test]
fn tensors_read_by_score_functions_have_gradients() {
    let names = |xs: &[&str]| -> Vec<String> { xs.iter().map(|x| x.to_string()).collect() };
    let alibi = compile_stdlib("alibi", &sets(&[("H", "2"), ("H_kv", "1"), ("d", "3"), ("M", "6"), ("N", "9")]));
    check_wrt(&alibi.program, 91, "alibi slopes", &names(&["slopes", "q"]));
    let rel = compile_stdlib("relative_bias", &sets(&[("H", "2"), ("d", "3"), ("M", "5"), ("N", "8"), ("R", "2")]));
    check_wrt(&rel.program, 92, "relative bias", &names(&["bias", "k"]));
    let twice = "spec twice\ndim N = 7\ninput q: [1, 2, N, 3]\ninput k: [1, 2, N, 3]\ninput v: [1, 2, N, 3]\n\
        input t: [2, N]\noutput o = attention(q, k, v, mask = causal, \
        score = |s, b, h, i, j| s * t[h, j] + tanh(t[h, j] * t[1 - h, i]) - t[0, 0])\n";
    let c = attnc_compiler::compile(twice, &[]).unwrap();
    check_wrt(&c.program, 93, "a tensor read three ways", &names(&["t"]));
    // A weight the kernels differentiate is by default; an input (ALiBi's fixed slopes) by name only.
    let default = |c: &attnc_compiler::Compiled| differentiate(&c.program, &[]).unwrap().outputs;
    assert!(default(&rel).iter().any(|(n, _)| n == "grad_bias"), "bias not differentiated by default");
    assert!(default(&alibi).iter().all(|(n, _)| n != "grad_slopes"), "slopes differentiated by default");
}

/// Head mixing inside attention (Talking-Heads): every gradient, the mixing
/// matrices' element by element, with masks, windows, GQA, unequal query and
/// key counts, rectangular matrices, a per-head mask function and a score
/// function whose read tensor is differentiated too.
#[test]
fn head_mixing_gradients_match_finite_differences() {
    let th = [
        sets(&[("H", "3"), ("d", "2"), ("N", "7")]),
        sets(&[("H", "4"), ("H_kv", "2"), ("d", "2"), ("N", "6"), ("B", "2"), ("mask", "none"), ("window", "3")]),
    ];
    for (i, s) in th.iter().enumerate() {
        let c = compile_stdlib("talking_heads", s);
        let g = differentiate(&c.program, &[]).unwrap();
        for w in ["grad_w_l", "grad_w_p"] {
            assert!(g.outputs.iter().any(|(n, _)| n == w), "{w} is differentiated by default");
        }
        check(&c.program, 60 + i as u64, &format!("talking_heads {s:?}"));
    }
    for (i, s) in [
        sets(&[("H", "2"), ("d", "2"), ("N", "6")]),
        sets(&[("H", "1"), ("d", "3"), ("N", "5"), ("mask", "none"), ("layer", "3")]),
    ]
    .iter()
    .enumerate()
    {
        check(&compile_stdlib("diff", s).program, 65 + i as u64, &format!("diff {s:?}"));
    }
    let core = "spec th\ndim M = 5\ndim N = 7\ninput q: [1, 3, M, 3]\ninput k: [1, 1, N, 3]\ninput v: [1, 1, N, 2]\n\
        input t: [3]\ninput wl: [3, 4]\ninput wp: [4, 2]\noutput o = attention(q, k, v, \
        mask = |b, h, i, j| abs(i - j) <= h + 1, score = |s, b, h, i, j| 2.0 * tanh(s / 2.0) - t[h] * abs(i - j), \
        mix_logits = wl, mix_probs = wp)\n";
    let c = attnc_compiler::compile(core, &[]).unwrap();
    let all: Vec<String> = ["q", "k", "v", "t", "wl", "wp"].iter().map(|x| x.to_string()).collect();
    check_wrt(&c.program, 70, "rectangular mixing with functions", &all);
    let causal = core.replace("mask = |b, h, i, j| abs(i - j) <= h + 1", "mask = causal, window = 4");
    let c = attnc_compiler::compile(&causal, &[]).unwrap();
    check_wrt(&c.program, 71, "rectangular mixing, causal window, M < N", &all);
}

/// The training halves (`grad::split`): the forward computes the outputs
/// and the residuals, the backward the gradients from the inputs, those
/// residuals and the cotangents; together they give the gradient program's
/// results bit for bit on the interpreter, and the backward repeats no
/// forward attention.
#[test]
fn training_halves_compute_the_gradient_program() {
    let others = [
        ("talking_heads", sets(&[("H", "4"), ("H_kv", "2"), ("d", "2"), ("N", "6"), ("B", "2")])),
        ("diff", sets(&[("H", "2"), ("d", "2"), ("N", "6")])),
        ("grpo", sets(&[("std", "bessel"), ("G", "5")])),
        ("rloo", sets(&[("G", "3")])),
        ("gdpo", sets(&[("C", "2")])),
    ];
    let cases = attention_cases().into_iter().chain(function_cases()).chain(others);
    for (i, (spec, s)) in cases.enumerate() {
        let what = format!("{spec} {s:?}");
        let p = compile_stdlib(spec, &s).program;
        let g = differentiate(&p, &[]).unwrap();
        let halves = split(&g, p.inputs.len(), p.outputs.len());
        for half in [&halves.forward, &halves.backward] {
            let problems = attnc_compiler::valid::validate(half);
            assert!(problems.is_empty(), "{what}: {} invalid: {problems:?}", half.name);
        }
        let (drawn, _) = bind::generate_inputs(&g, 70 + i as u64).unwrap();
        let all: BTreeMap<String, Tensor> = g.inputs.iter().map(|i| i.name.clone()).zip(drawn).collect();
        let run = |q: &Program, given: &BTreeMap<String, Tensor>| {
            let (tensors, dims) = bind::bind_inputs(q, given.clone(), &Default::default())
                .unwrap_or_else(|e| panic!("{what}: {}: {e}", q.name));
            let outs = interp::evaluate(q, &tensors, &dims);
            q.outputs.iter().map(|(n, _)| n.clone()).zip(outs).collect::<BTreeMap<_, _>>()
        };
        let whole = run(&g, &all);
        let inputs = p.inputs.iter().map(|i| (i.name.clone(), all[&i.name].clone())).collect();
        let forward = run(&halves.forward, &inputs);
        let mut given = all.clone();
        for name in &halves.saved {
            given.insert(name.clone(), forward[name].clone());
        }
        let backward = run(&halves.backward, &given);
        for (name, _) in &p.outputs {
            assert_eq!(forward[name].data, whole[name].data, "{what}: output {name}");
        }
        let grads = &g.outputs[p.outputs.len()..];
        assert_eq!(backward.len(), grads.len(), "{what}: the backward's outputs are the gradients");
        for (name, _) in grads {
            assert_eq!(backward[name].data, whole[name].data, "{what}: {name}");
        }
        let attention = |q: &Program| {
            q.nodes.iter().filter(|n| matches!(n.op, Op::Attention { .. } | Op::AttentionLse { .. })).count()
        };
        assert_eq!(attention(&halves.backward), 0, "{what}: the backward recomputes attention");
        if attention(&p) > 0 {
            assert!(!halves.saved.is_empty(), "{what}: attention's backward saves nothing");
        }
        assert_eq!(attention(&halves.forward), attention(&g), "{what}");
        if spec == "mha" {
            // FlashAttention's residuals: q, k, v, o and the rows' log-sum-exp.
            assert_eq!(halves.saved.len(), 5, "{what}: {:?}", halves.saved);
        }
    }
}

/// Attention weights beyond the softmax (docs/semantics.md §9) on the
/// interpreter: sigmoid, linear and hard weights and a softmax's learned
/// sink, with GQA, M ≠ N, a causal mask, a window and a score function;
/// the sink's gradient included, also where a row sees no key (its
/// output is the constant 0). Hard attention's q and k gradients are 0 (the
/// argmax is piecewise constant; random scores do not tie).
#[test]
fn attention_weights_gradients_match_finite_differences() {
    let head = "dim M = 6\ndim N = 9\ninput q: [2, 4, M, 3]\ninput k: [2, 2, N, 3]\ninput v: [2, 2, N, 2]\n";
    let cases = [
        "output o = attention(q, k, v, mask = causal, weights = sigmoid)",
        "output o = attention(q, k, v, mask = none, window = 3, weights = sigmoid, score = |s, b, h, i, j| s - log(9.0))",
        "output o = attention(q, k, v, mask = causal, weights = linear)",
        "output o = attention(q, k, v, weights = hard, score = |s, b, h, i, j| 2.0 * tanh(s))",
        "weight sinks: [4]\noutput o = attention(q, k, v, mask = causal, sink = sinks)",
        "weight sinks: [4]\noutput o = attention(q, k, v, mask = |b, h, i, j| j < i, sink = sinks)",
    ];
    for (i, body) in cases.iter().enumerate() {
        let text = format!("spec w\n{head}{body}\n");
        let c = attnc_compiler::compile(&text, &[])
            .unwrap_or_else(|d| panic!("{}", attnc_compiler::render("w", &text, &d)));
        let g = differentiate(&c.program, &[]).unwrap();
        let names: Vec<&str> = g.outputs.iter().map(|(n, _)| n.as_str()).collect();
        if body.contains("sink") {
            assert!(names.contains(&"grad_sinks"), "a learned sink is differentiated by default: {names:?}");
        }
        let worst = check(&c.program, 90 + i as u64, body);
        eprintln!("{body}: worst relative error {worst:.1e}");
        if body.contains("hard") {
            let (drawn, _) = bind::generate_inputs(&g, 7).unwrap();
            let (tensors, dims) = bind::bind_inputs(
                &g,
                g.inputs.iter().map(|i| i.name.clone()).zip(drawn).collect(),
                &Default::default(),
            )
            .unwrap();
            let out = interp::evaluate(&g, &tensors, &dims);
            for name in ["grad_q", "grad_k"] {
                let at = g.outputs.iter().position(|(n, _)| n == name).unwrap();
                assert!(out[at].data.iter().all(|x| *x == 0.0), "hard attention's {name} is 0");
            }
            let at = g.outputs.iter().position(|(n, _)| n == "grad_v").unwrap();
            assert!(out[at].data.iter().any(|x| *x != 0.0), "hard attention's grad_v is Pᵀ·dO");
        }
    }
}
