//! Attention weights beyond the softmax (`weights = softmax | sigmoid |
//! linear | hard`, `sink =`; docs/semantics.md §9) on the float64
//! interpreter, against an independent implementation that materialises
//! every row's scores; the errors that refuse what is not defined or not
//! built yet.

mod common;

use attnc_compiler::ir::Mask;
use attnc_runtime::pipeline::{Backend, Compiler};
use attnc_runtime::rng::Rng;
use attnc_runtime::Tensor;
use common::*;
use std::collections::BTreeMap;

/// A configuration: heads `hq` sharing `hk` key/value heads, `m` queries
/// against `n` keys, a built-in causal mask (queries the last `m` of `n`)
/// or a window, and the weighting.
struct Case {
    hq: usize,
    hk: usize,
    m: usize,
    n: usize,
    d: usize,
    e: usize,
    causal: bool,
    window: Option<usize>,
    weights: &'static str,
    sink: bool,
}

impl Case {
    fn source(&self) -> String {
        let Case { hq, hk, m, n, d, e, causal, window, weights, sink } = *self;
        let mask = if causal { "causal" } else { "none" };
        let window = window.map_or("none".to_string(), |w| w.to_string());
        let sink_decl = if sink { format!("input t: [{hq}]\n") } else { String::new() };
        let sink_arg = if sink { ", sink = t" } else { "" };
        format!(
            "spec w\ninput q: [2, {hq}, {m}, {d}]\ninput k: [2, {hk}, {n}, {d}]\ninput v: [2, {hk}, {n}, {e}]\n{sink_decl}\
             output o = attention(q, k, v, mask = {mask}, window = {window}, weights = {weights}{sink_arg})\n"
        )
    }

    /// The output computed pair by pair, every score of a row materialised.
    fn reference(&self, t: &BTreeMap<String, Tensor>) -> Tensor {
        let Case { hq, hk, m, n, d, e, .. } = *self;
        let (q, k, v) = (&t["q"], &t["k"], &t["v"]);
        let kind = if self.causal { attnc_compiler::ir::MaskKind::Causal } else { attnc_compiler::ir::MaskKind::None };
        let mask = Mask { kind, window: self.window.map(|w| w as u64), block: 1 };
        let scale = 1.0 / (d as f64).sqrt();
        let mut out = Tensor::zeros(vec![2, hq, m, e]);
        for b in 0..2 {
            for h in 0..hq {
                let g = h / (hq / hk);
                for i in 0..m {
                    let seen: Vec<usize> =
                        (0..n).filter(|&j| mask.visible(i as u64, j as u64, m as u64, n as u64)).collect();
                    let s: Vec<f64> = seen
                        .iter()
                        .map(|&j| {
                            let qi = &q.data[((b * hq + h) * m + i) * d..][..d];
                            let kj = &k.data[((b * hk + g) * n + j) * d..][..d];
                            scale * qi.iter().zip(kj).map(|(x, y)| x * y).sum::<f64>()
                        })
                        .collect();
                    if s.is_empty() {
                        continue;
                    }
                    let w: Vec<f64> = match self.weights {
                        "softmax" => {
                            let z = if self.sink { t["t"].data[h].exp() } else { 0.0 };
                            let total: f64 = s.iter().map(|x| x.exp()).sum::<f64>() + z;
                            s.iter().map(|x| x.exp() / total).collect()
                        }
                        "sigmoid" => s.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect(),
                        "linear" => s.clone(),
                        "hard" => {
                            let top = s.iter().cloned().fold(f64::MIN, f64::max);
                            let ties = s.iter().filter(|&&x| x == top).count() as f64;
                            s.iter().map(|&x| if x == top { 1.0 / ties } else { 0.0 }).collect()
                        }
                        other => unreachable!("{other}"),
                    };
                    for (&j, wj) in seen.iter().zip(&w) {
                        for c in 0..e {
                            out.data[((b * hq + h) * m + i) * e + c] += wj * v.data[((b * hk + g) * n + j) * e + c];
                        }
                    }
                }
            }
        }
        out
    }
}

fn compile_case(text: &str) -> attnc_compiler::Compiled {
    attnc_compiler::compile(text, &[])
        .unwrap_or_else(|d| panic!("does not compile:\n{}", attnc_compiler::render("w.attn", text, &d)))
}

#[test]
fn every_weighting_matches_its_definition() {
    let mut rng = Rng::for_input(50, "weights");
    let shapes =
        [(4, 2, 7, 11, 5, 3, true, None), (3, 1, 9, 9, 4, 6, false, Some(3)), (2, 2, 13, 5, 8, 2, true, Some(2))];
    for weights in ["softmax", "sigmoid", "linear", "hard"] {
        for sink in [false, true] {
            if sink && weights != "softmax" {
                continue;
            }
            for &(hq, hk, m, n, d, e, causal, window) in &shapes {
                let case = Case { hq, hk, m, n, d, e, causal, window, weights, sink };
                let c = compile_case(&case.source());
                let mut inputs = named(vec![
                    ("q", random(&mut rng, &[2, hq, m, d])),
                    ("k", random(&mut rng, &[2, hk, n, d])),
                    ("v", random(&mut rng, &[2, hk, n, e])),
                ]);
                if sink {
                    inputs.insert("t".into(), random(&mut rng, &[hq]));
                }
                let got = &eval(&c, &inputs)["o"];
                let want = case.reference(&inputs);
                assert!(want.data.iter().any(|x| *x != 0.0));
                assert_close(got, &want, 1e-12, &case.source());
            }
        }
    }
}

/// `hard` is exact on ties: integer scores tie, each tied key gets exactly
/// 1/count, and the output is the exact mean of the tied values.
#[test]
fn hard_attention_averages_ties_exactly() {
    let text = "spec hard\ninput q: [1, 1, 3, 2]\ninput k: [1, 1, 4, 2]\ninput v: [1, 1, 4, 1]\n\
                output o = attention(q, k, v, scale = 1.0, weights = hard)\n";
    let c = compile_case(text);
    let q = Tensor::new(vec![1, 1, 3, 2], vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    // Keys: scores per query row: [2, 2, 0, 1], [0, 0, 3, 1], [2, 2, 3, 2].
    let k = Tensor::new(vec![1, 1, 4, 2], vec![2.0, 0.0, 2.0, 0.0, 0.0, 3.0, 1.0, 1.0]);
    let v = Tensor::new(vec![1, 1, 4, 1], vec![1.0, 2.0, 4.0, 8.0]);
    let o = &eval(&c, &named(vec![("q", q), ("k", k), ("v", v)]))["o"];
    assert_eq!(o.data, vec![1.5, 4.0, 4.0]);
}

/// With a sink, a row that sees no key outputs 0 (a mask function hides
/// every key of row 0), and the sink lowers every other row's weights.
#[test]
fn a_sink_joins_the_denominator_and_an_empty_row_stays_zero() {
    let text = "spec sinks\ninput q: [1, 2, 4, 3]\ninput k: [1, 2, 4, 3]\ninput v: [1, 2, 4, 2]\ninput t: [2]\n\
                output o = attention(q, k, v, mask = |b, h, i, j| j < i, sink = t)\n";
    let c = compile_case(text);
    let mut rng = Rng::for_input(51, "weights");
    let mut inputs = named(vec![
        ("q", random(&mut rng, &[1, 2, 4, 3])),
        ("k", random(&mut rng, &[1, 2, 4, 3])),
        ("v", random(&mut rng, &[1, 2, 4, 2])),
        ("t", Tensor::new(vec![2], vec![-30.0, 2.0])),
    ]);
    let with = eval(&c, &inputs)["o"].clone();
    for h in 0..2 {
        assert_eq!(&with.data[h * 8..h * 8 + 2], &[0.0, 0.0], "row 0 of head {h} sees no key");
    }
    // Head 0's sink is negligible (e^-30): the plain softmax's rows; head 1's shrinks them.
    let plain = compile_case(&text.replace(", sink = t", "").replace("input t: [2]\n", ""));
    inputs.remove("t");
    let without = &eval(&plain, &inputs)["o"];
    for x in 2..8 {
        assert!((with.data[x] - without.data[x]).abs() < 1e-12, "head 0, entry {x}");
        let (a, b) = (with.data[8 + x], without.data[8 + x]);
        assert!(a.abs() < b.abs() && a * b > 0.0, "head 1, entry {x}: {a} against {b}");
    }
}

/// Sigmoid attention composes with a score function for its bias (Ramapuram
/// et al.: b = −log N).
#[test]
fn sigmoid_attention_takes_its_bias_from_a_score_function() {
    let text = "spec sig\ndim N = 16\ninput q: [1, 2, N, 4]\ninput k: [1, 2, N, 4]\ninput v: [1, 2, N, 4]\n\
                output o = attention(q, k, v, mask = causal, weights = sigmoid, score = |s, b, h, i, j| s - log(16.0))\n";
    let c = compile_case(text);
    let mut rng = Rng::for_input(52, "weights");
    let inputs = named(vec![
        ("q", random(&mut rng, &[1, 2, 16, 4])),
        ("k", random(&mut rng, &[1, 2, 16, 4])),
        ("v", random(&mut rng, &[1, 2, 16, 4])),
    ]);
    let got = &eval(&c, &inputs)["o"];
    // Shifting q·k by −log N is dividing exp(s) by N inside the sigmoid: σ(s − log N) = e^s / (N + e^s).
    let case =
        Case { hq: 2, hk: 2, m: 16, n: 16, d: 4, e: 4, causal: true, window: None, weights: "linear", sink: false };
    let (q, k, v) = (&inputs["q"], &inputs["k"], &inputs["v"]);
    let mut want = Tensor::zeros(vec![1, 2, 16, 4]);
    for h in 0..2 {
        for i in 0..16 {
            for j in 0..=i {
                let s: f64 =
                    (0..4).map(|c| q.data[(h * 16 + i) * 4 + c] * k.data[(h * 16 + j) * 4 + c]).sum::<f64>() / 2.0;
                let w = s.exp() / (16.0 + s.exp());
                for c in 0..4 {
                    want.data[(h * 16 + i) * 4 + c] += w * v.data[(h * 16 + j) * 4 + c];
                }
            }
        }
    }
    assert_close(got, &want, 1e-12, &case.source());
}

/// What is not defined, or not built yet, is a clear error: a sink with
/// any weighting but softmax names both arguments; a sink of the wrong
/// shape names it; head mixing with another weighting or with a sink is
/// refused; the kernels refuse, by name, what they do not compute yet:
/// hard attention's gradient (the interpreter runs it; tests/gradients.rs
/// checks its gradients).
#[test]
fn what_is_not_defined_or_not_built_is_a_clear_error() {
    let base =
        "spec e\ninput q: [1, 2, 5, 4]\ninput k: [1, 2, 5, 4]\ninput v: [1, 2, 5, 4]\ninput t: [2]\ninput w: [2, 2]\n";
    let refused = |call: &str, code: &str, message: &str, at: &str| {
        let text = format!("{base}output o = {call}\n");
        assert_points_at(&text, code, message, at);
    };
    refused(
        "attention(q, k, v, weights = sigmoid, sink = t)",
        "E0201",
        "`sink` joins a softmax's denominator, but this attention has `weights = sigmoid`",
        "t",
    );
    refused(
        "attention(q, k, v, weights = hard, mix_logits = w)",
        "E0201",
        "head mixing inside attention mixes a softmax's logits and probabilities, not `weights = hard`'s",
        "w",
    );
    // A sink joins one head's denominator; head mixing mixes around the
    // softmaxes (the interpreter once dropped the sink here silently).
    for mix in ["mix_logits", "mix_probs"] {
        refused(
            &format!("attention(q, k, v, sink = t, {mix} = w)"),
            "E0201",
            "`sink` joins one head's softmax denominator, and head mixing inside attention mixes",
            "t",
        );
    }
    refused("attention(q, k, v, weights = relu)", "E0202", "`relu` is not a valid `weights`", "relu");
    let text = format!("{base}output o = attention(q, k, v, sink = w)\n");
    let err = attnc_compiler::compile(&text, &[]).unwrap_err();
    let rendered = attnc_compiler::render("e.attn", &text, &err);
    assert!(rendered.contains("sink (a logit per query head) must have shape [2], not [2, 2]"), "{rendered}");
    // The kernels compute every weighting's forward, and every gradient but
    // hard attention's, which they refuse by name (the interpreter runs it).
    for weights in ["sigmoid", "linear", "hard"] {
        let text = format!("{base}output o = attention(q, k, v, weights = {weights})\n");
        let program = Compiler::new("e.attn", text.as_str()).compile().unwrap();
        let bound = program.seeded(1).unwrap();
        assert!(bound.emit(attnc_runtime::gpu::emit::Target::Wgsl).is_ok(), "{weights} forward emits");
        let gradient = program.gradient(&[]).unwrap().program().seeded(1).unwrap();
        assert!(gradient.run(Backend::Interp).is_ok(), "{weights}: gradients on the interpreter");
        let emitted = gradient.emit(attnc_runtime::gpu::emit::Target::Wgsl);
        match weights {
            "hard" => {
                let err = emitted.err().expect("refused").to_string();
                assert!(err.contains("the gradient of hard attention"), "{weights} gradients: {err}");
            }
            _ => assert!(emitted.is_ok(), "{weights} gradients emit"),
        }
    }
    // A sink and its gradient compile for CUDA.
    let text = format!("{base}output o = attention(q, k, v, sink = t)\n");
    let program = Compiler::new("e.attn", text.as_str()).compile().unwrap();
    assert!(program.seeded(1).unwrap().emit(attnc_runtime::gpu::emit::Target::Cuda).is_ok());
    let gradient = program.gradient(&["t".to_string()]).unwrap().program().seeded(1).unwrap();
    assert!(gradient.emit(attnc_runtime::gpu::emit::Target::Cuda).is_ok(), "the sink's gradient");
}
