//! Numerical edges and limits, each against the float64 interpreter (and the
//! generated kernels on wgpu): huge logits, windows longer than the sequence,
//! N = 1, G = 1, tied groups, ε = 0, sizes past 32-bit indexing, determinism.

mod common;

use attnc_compiler::plan;
use attnc_runtime::gpu::exec::Gpu;
use attnc_runtime::{bind, interp, Tensor};
use common::*;
use std::collections::BTreeMap;

fn sets(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

fn seeded(c: &attnc_compiler::Compiled, seed: u64) -> BTreeMap<String, Tensor> {
    let (tensors, _) = bind::generate_inputs(&c.program, seed).unwrap();
    c.program.inputs.iter().map(|i| i.name.clone()).zip(tensors).collect()
}

fn interp_out(c: &attnc_compiler::Compiled, inputs: &BTreeMap<String, Tensor>) -> Tensor {
    eval(c, inputs).into_values().next().unwrap()
}

fn gpu_out(c: &attnc_compiler::Compiled, inputs: &BTreeMap<String, Tensor>) -> Tensor {
    let gpu = Gpu::wgpu().unwrap_or_else(|e| panic!("this test needs a device: {e}"));
    let (_, dims) = bind::bind_inputs(&c.program, inputs.clone(), &Default::default()).unwrap();
    gpu.run(&plan::plan(&c.program, &dims), inputs).unwrap().0.remove(0)
}

#[test]
fn huge_logits_do_not_overflow_the_online_softmax() {
    for spec in ["mha", "iha"] {
        let c = compile_stdlib(spec, &sets(&[("H", "2"), ("d", "4"), ("N", "33")]));
        let mut inputs = seeded(&c, 1);
        // Logits of order 1e6: exp would overflow without the running max.
        inputs.get_mut("x").unwrap().data.iter_mut().for_each(|v| *v *= 3e3);
        let want = interp_out(&c, &inputs);
        assert!(want.data.iter().all(|v| v.is_finite()));
        let got = gpu_out(&c, &inputs);
        assert!(got.data.iter().all(|v| v.is_finite()), "{spec}: non-finite output");
        assert_close(&got, &want, 1e-4, &format!("{spec} with huge logits"));
    }
}

#[test]
fn a_window_longer_than_the_sequence_is_no_window() {
    let base = sets(&[("H", "2"), ("d", "4"), ("N", "9"), ("mask", "causal")]);
    let plain = compile_stdlib("mha", &base);
    let mut wide = base.clone();
    wide.push(("window", "1000".into()));
    let windowed = compile_stdlib("mha", &wide);
    let inputs = seeded(&plain, 2);
    let want = interp_out(&plain, &inputs);
    assert_close(&interp_out(&windowed, &inputs), &want, 1e-12, "interpreter");
    assert_close(&gpu_out(&windowed, &inputs), &want, 1e-4, "kernels");
}

#[test]
fn a_single_token_attends_to_itself() {
    for (spec, extra) in
        [("mha", vec![]), ("iha", vec![("P", "3"), ("mask", "token_causal")]), ("iha", vec![("mask", "none")])]
    {
        let mut s = sets(&[("H", "2"), ("d", "4"), ("N", "1")]);
        s.extend(sets(&extra));
        let c = compile_stdlib(spec, &s);
        let inputs = seeded(&c, 3);
        let want = interp_out(&c, &inputs);
        assert!(want.data.iter().any(|v| *v != 0.0));
        assert_close(&gpu_out(&c, &inputs), &want, 1e-4, &format!("{spec} N = 1"));
    }
}

#[test]
fn single_samples_tied_groups_and_zero_eps_give_exact_zeros() {
    let one = Tensor::new(vec![3, 1], vec![0.5, 1.0, 0.0]);
    let tied = Tensor::new(vec![2, 4], vec![3.0, 3.0, 3.0, 3.0, 1.0, 2.0, 2.0, 5.0]);
    for (spec, s, t) in [
        ("grpo", sets(&[("eps", "0.0")]), &one),
        ("grpo", sets(&[("eps", "0.0"), ("std", "bessel")]), &tied),
        ("dr_grpo", sets(&[]), &tied),
        ("maxrl", sets(&[("eps", "0.0")]), &Tensor::new(vec![2, 3], vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0])),
        ("odrpo", sets(&[("eps", "0.0"), ("K", "5")]), &tied),
    ] {
        let c = compile_stdlib(spec, &s);
        let inputs = named(vec![("rewards", t.clone())]);
        let want = interp_out(&c, &inputs);
        let got = gpu_out(&c, &inputs);
        assert!(want.data.iter().chain(&got.data).all(|v| v.is_finite()), "{spec}: NaN or inf");
        let g = t.shape[1];
        // The first group is degenerate in every case: exactly zero on both paths.
        assert!(
            want.data[..g].iter().chain(&got.data[..g]).all(|v| *v == 0.0),
            "{spec}: {:?} / {:?}",
            want.data,
            got.data
        );
        assert_close(&got, &want, 1e-5, spec);
    }
}

#[test]
fn sizes_past_32_bit_indexing_are_refused_before_allocating() {
    let c = compile_stdlib("mha", &sets(&[("N", "50000000")]));
    let err = bind::generate_inputs(&c.program, 0).unwrap_err().to_string();
    assert!(err.contains("32-bit") && err.contains("`x`"), "{err}");
    let c = compile_stdlib("iha", &sets(&[("N", "4611686018427387904")]));
    let err = bind::default_dims(&c.program).and_then(|d| bind::check_sizes(&c.program, &d)).unwrap_err().to_string();
    assert!(err.contains("32-bit"), "{err}");
    let c = compile_stdlib("mha", &sets(&[("N", "200000"), ("H", "2"), ("d", "8")]));
    let dims = bind::default_dims(&c.program).unwrap();
    let err = bind::check_budget(&c.program, &dims, 1 << 20).unwrap_err().to_string();
    assert!(err.contains("memory budget"), "{err}");
}

#[test]
fn the_pipeline_is_deterministic() {
    for spec in ["iha", "odrpo"] {
        let c = compile_stdlib(spec, &[]);
        let inputs = seeded(&c, 9);
        let (a, b) = (interp_out(&c, &inputs), interp_out(&c, &inputs));
        assert!(
            a.data.iter().zip(&b.data).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{spec}: interpreter not bit-identical"
        );
        let again = compile_stdlib(spec, &[]);
        assert_eq!(c.program, again.program);
        let (tensors, dims) = bind::generate_inputs(&c.program, 9).unwrap();
        let (tensors2, _) = bind::generate_inputs(&c.program, 9).unwrap();
        assert_eq!(tensors, tensors2, "{spec}: seeded inputs differ");
        assert_eq!(interp::evaluate(&c.program, &tensors, &dims), interp::evaluate(&again.program, &tensors2, &dims));
    }
}

#[test]
fn a_one_megabyte_spec_is_checked_and_a_larger_one_refused() {
    let mut text = String::from("spec big\ndim B = 2\ndim G = 3\ninput a: [B, G] in finite\nlet t0 = a\n");
    let mut i = 1;
    while text.len() < 1_000_000 {
        text.push_str(&format!("let t{i} = t{} + a * 0.5\n", i - 1));
        i += 1;
    }
    text.push_str(&format!("output y = t{}\n", i - 1));
    assert!(text.len() <= attnc_grammar::MAX_SOURCE_BYTES);
    let compiled = attnc_compiler::compile(&text, &[]).expect("a long valid spec checks");
    assert_eq!(compiled.program.outputs.len(), 1);
    let too_big = text + &" ".repeat(attnc_grammar::MAX_SOURCE_BYTES);
    let err = attnc_compiler::compile(&too_big, &[]).unwrap_err();
    assert_eq!(err[0].code, attnc_compiler::Code::TooLarge);
}

/// Attention whose queries are the last `M` of `N` tokens (a decode step over
/// a key/value cache, FlashAttention's bottom-right alignment).
fn cross_spec(mask: &str, window: Option<u64>, p: u64, m: u64, n: u64) -> attnc_compiler::Compiled {
    let window = window.map_or("none".to_string(), |w| w.to_string());
    let source = format!(
        "spec cross\ninput q: [2, 2, {sq}, 4]\ninput k: [2, 2, {sk}, 4]\ninput v: [2, 2, {sk}, 4]\n\
         output o = attention(q, k, v, mask = {mask}, window = {window}, block = {p}, scale = 0.5)\n",
        sq = m * p,
        sk = n * p
    );
    attnc_compiler::compile(&source, &[]).unwrap_or_else(|e| panic!("{}", attnc_compiler::render("cross", &source, &e)))
}

/// With fewer keys than queries, a causal query before the first key sees
/// nothing: its row is exactly 0 (not NaN) in the interpreter and the kernels.
/// Every other row equals the square attention in which the same query sits
/// at its aligned position, so decoding over a cache matches a full prefill.
#[test]
fn fully_masked_rows_are_zero_and_decode_rows_match_the_prefill() {
    let mut rng = attnc_runtime::rng::Rng::for_input(7, "cross");
    for mask in ["causal", "token_causal", "none"] {
        for window in [None, Some(2)] {
            for p in [1u64, 2] {
                for (m, n) in [(5u64, 9u64), (9, 5), (1, 9), (37, 6)] {
                    let what = format!("{mask} window {window:?} P = {p} M = {m} N = {n}");
                    let cross = cross_spec(mask, window, p, m, n);
                    let square = cross_spec(mask, window, p, n, n);
                    let mut inputs = seeded(&cross, rng.next_u64());
                    inputs.values_mut().for_each(|t| t.data.iter_mut().for_each(|v| *v = 2.0 * rng.unit() - 1.0));
                    let got = interp_out(&cross, &inputs);
                    // Square queries: row r = i + (N − M)·P holds cross query i.
                    let (rows_q, rows_k, d) = ((m * p) as usize, (n * p) as usize, 4usize);
                    let mut sq_inputs = inputs.clone();
                    let q = &inputs["q"];
                    let mut qs = random(&mut rng, &[2, 2, rows_k, d]);
                    for bh in 0..4 {
                        for i in 0..rows_q {
                            if let Some(r) = (i + rows_k).checked_sub(rows_q) {
                                let (src, dst) = ((bh * rows_q + i) * d, (bh * rows_k + r) * d);
                                qs.data[dst..dst + d].copy_from_slice(&q.data[src..src + d]);
                            }
                        }
                    }
                    sq_inputs.insert("q".into(), qs);
                    let want = interp_out(&square, &sq_inputs);
                    let mut masked = 0;
                    for bh in 0..4 {
                        for i in 0..rows_q {
                            let row = &got.data[(bh * rows_q + i) * d..][..d];
                            match (i + rows_k).checked_sub(rows_q) {
                                Some(r) => {
                                    let w = &want.data[(bh * rows_k + r) * d..][..d];
                                    let err = row.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                                    assert!(err <= 1e-12, "{what}: row {i} differs from the prefill by {err}");
                                }
                                None if mask != "none" => {
                                    assert!(row.iter().all(|v| *v == 0.0), "{what}: masked row {i} is {row:?}");
                                    masked += 1;
                                }
                                None => {}
                            }
                        }
                    }
                    assert_eq!(masked > 0, m > n && mask != "none", "{what}: {masked} fully masked rows");
                    let on_gpu = gpu_out(&cross, &inputs);
                    assert!(on_gpu.data.iter().all(|v| !v.is_nan()), "{what}: NaN from the kernels");
                    assert_close(&on_gpu, &got, 1e-4, &what);
                    for bh in 0..4 {
                        for i in 0..rows_q.saturating_sub(rows_k) {
                            if mask != "none" {
                                let row = &on_gpu.data[(bh * rows_q + i) * d..][..d];
                                assert!(row.iter().all(|v| *v == 0.0), "{what}: kernel masked row {i} is {row:?}");
                            }
                        }
                    }
                }
            }
        }
    }
}
