//! IHA decoding (`stdlib/iha_decode.attn`, docs/semantics.md §2 and §8): one
//! step over the cache of earlier tokens' pseudo-keys and pseudo-values.
//! The interpreter, decoding token by token from an empty cache, gives every
//! row of `iha.attn`'s output over the whole sequence, and the cache it
//! builds from `k_new`, `v_new` is the whole sequence's interleaved
//! pseudo-keys (RoPE applied) and pseudo-values; the wgpu kernels, plain and
//! optimized, agree with the interpreter on a cache of several tiles.

mod common;

use attnc_compiler::opt::{self, Config};
use attnc_compiler::plan;
use attnc_runtime::gpu::exec::Gpu;
use attnc_runtime::rng::Rng;
use attnc_runtime::{bind, relative_error, Tensor};
use common::*;
use std::collections::{BTreeMap, BTreeSet};

const WEIGHTS: [&str; 8] = ["w_q", "w_k", "w_v", "w_o", "alpha_q", "alpha_k", "alpha_v", "r"];

#[derive(Clone, Debug)]
struct Case {
    h: usize,
    p: usize,
    d: usize,
    mask: &'static str,
    window: Option<usize>,
    collapse: &'static str,
    rope: Option<f64>,
}

impl Case {
    fn sets(&self, n: usize) -> Vec<(&'static str, String)> {
        let mut s = vec![
            ("H", self.h.to_string()),
            ("P", self.p.to_string()),
            ("d", self.d.to_string()),
            ("N", n.to_string()),
            ("B", "2".to_string()),
            ("mask", self.mask.to_string()),
            ("collapse", self.collapse.to_string()),
        ];
        s.extend(self.window.map(|w| ("window", w.to_string())));
        s.extend(self.rope.map(|r| ("rope", r.to_string())));
        s
    }

    /// Weights with the shapes of `iha.attn` (and of `iha_decode.attn`).
    fn weights(&self, seed: u64) -> BTreeMap<String, Tensor> {
        let (h, p, d) = (self.h, self.p, self.d);
        let shapes: [Vec<usize>; 8] = [
            vec![h * d, h * d],
            vec![h * d, h * d],
            vec![h * d, h * d],
            vec![h * d, h * d],
            vec![h, h, p],
            vec![h, h, p],
            vec![h, h, p],
            vec![h, h * p],
        ];
        WEIGHTS
            .iter()
            .zip(shapes)
            .map(|(name, shape)| (name.to_string(), random(&mut Rng::for_input(seed, name), &shape)))
            .collect()
    }
}

fn cases() -> Vec<Case> {
    let c = |h, p, d, mask, window, collapse, rope| Case { h, p, d, mask, window, collapse, rope };
    vec![
        c(2, 2, 8, "flat_causal", None, "global", None),
        c(2, 2, 8, "token_causal", None, "global", Some(10000.0)),
        c(3, 3, 6, "flat_causal", Some(2), "per_head", Some(100.0)),
        c(2, 1, 16, "token_causal", Some(3), "global", None),
        c(1, 4, 10, "token_causal", None, "per_head", Some(500.0)),
        c(2, 3, 4, "flat_causal", None, "global", Some(10000.0)),
    ]
}

/// Rows `t .. t + 1` of axis 1 of `x: [B, T, D]`.
fn token(x: &Tensor, t: usize) -> Tensor {
    let (b, n, dd) = (x.shape[0], x.shape[1], x.shape[2]);
    let data = (0..b).flat_map(|bi| x.data[(bi * n + t) * dd..(bi * n + t + 1) * dd].iter().copied()).collect();
    Tensor::new(vec![b, 1, dd], data)
}

/// Asserts |a − b| ≤ tol · (1 + |b|) for every element (NaN fails).
fn assert_each(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    assert_eq!(a.shape, b.shape, "{what}: shapes differ");
    for (i, (x, y)) in a.data.iter().zip(&b.data).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}: element {i} is {x}, expected {y}");
    }
}

/// The whole sequence's pseudo-keys and pseudo-values, as `iha.attn` forms
/// them (its steps 1 to 3, copied), to check the cache the steps build.
const PSEUDO: &str = "spec pseudo
param H: int = 8
param P: int = 2
param d: int = 64
param rope: float? = none
dim B = 1
dim N = 64
dim D = H * d
input x: [B, N, D]
input w_k: [D, H * d]
input w_v: [D, H * d]
input alpha_k: [H, H, P]
input alpha_v: [H, H, P]
output kt = rope(interleave(mix_heads(split_heads(x @ w_k, H), alpha_k)), base = rope)
output vt = interleave(mix_heads(split_heads(x @ w_v, H), alpha_v))
";

#[test]
fn decoding_token_by_token_gives_every_row_of_the_full_forward() {
    let tokens = 9;
    for (ci, case) in cases().into_iter().enumerate() {
        let weights = case.weights(ci as u64);
        let dd = case.h * case.d;
        let x = random(&mut Rng::for_input(ci as u64, "x"), &[2, tokens, dd]);
        let mut full_inputs = weights.clone();
        full_inputs.insert("x".into(), x.clone());
        let full = eval(&compile_stdlib("iha", &case.sets(tokens)), &full_inputs);
        let y_full = &full["y"];

        // Decode from an empty cache, appending each step's rows.
        let empty = Tensor::new(vec![2, case.h, 0, case.d], vec![]);
        let (mut k_cache, mut v_cache) = (empty.clone(), empty);
        for t in 0..tokens {
            let step = compile_stdlib("iha_decode", &case.sets(t + 1));
            let mut inputs = weights.clone();
            inputs.insert("x".into(), token(&x, t));
            inputs.insert("k_cache".into(), k_cache.clone());
            inputs.insert("v_cache".into(), v_cache.clone());
            let out = eval(&step, &inputs);
            let what = format!("{case:?} token {t}");
            assert_close(&out["y"], &token(y_full, t), 1e-12, &what);
            assert_each(&out["y"], &token(y_full, t), 1e-12, &what);
            assert_eq!(out["k_new"].shape, vec![2, case.h, case.p, case.d], "{what}: k_new's shape");
            k_cache = k_cache.concat(&out["k_new"], 2);
            v_cache = v_cache.concat(&out["v_new"], 2);
        }

        // The cache the steps built is the whole sequence's pseudo-keys and -values.
        let sets: Vec<attnc_compiler::Setting> = case.sets(tokens)[..4]
            .iter()
            .chain(&case.sets(tokens)[4..5])
            .chain(case.rope.map(|r| ("rope", r.to_string())).as_ref())
            .map(|(n, v)| attnc_compiler::Setting { name: n.to_string(), value: v.clone() })
            .collect();
        let pseudo = attnc_compiler::compile(PSEUDO, &sets).unwrap_or_else(|d| panic!("{d:?}"));
        let mut inputs: BTreeMap<String, Tensor> =
            ["w_k", "w_v", "alpha_k", "alpha_v"].iter().map(|n| (n.to_string(), weights[*n].clone())).collect();
        inputs.insert("x".into(), x.clone());
        let whole = eval(&pseudo, &inputs);
        assert_close(&k_cache, &whole["kt"], 1e-12, &format!("{case:?}: the key cache"));
        assert_close(&v_cache, &whole["vt"], 1e-12, &format!("{case:?}: the value cache"));
    }
}

fn wgpu() -> Gpu {
    Gpu::wgpu().unwrap_or_else(|e| panic!("this test needs a device: {e}"))
}

/// One decode step on wgpu (its program as written and as optimized)
/// against the interpreter, over a random cache of `n - 1` tokens.
fn check_on_wgpu(gpu: &Gpu, case: &Case, n: usize, seed: u64) {
    let c = compile_stdlib("iha_decode", &case.sets(n));
    let mut inputs = case.weights(seed);
    let (h, p, d) = (case.h, case.p, case.d);
    let mut rng = Rng::for_input(seed, "cache");
    inputs.insert("x".into(), random(&mut rng, &[2, 1, h * d]));
    inputs.insert("k_cache".into(), random(&mut rng, &[2, h, (n - 1) * p, d]));
    inputs.insert("v_cache".into(), random(&mut rng, &[2, h, (n - 1) * p, d]));
    let want = eval(&c, &inputs);
    let (tensors, dims) = bind::bind_inputs(&c.program, inputs.clone(), &BTreeSet::new()).expect("inputs bind");
    let named_inputs: BTreeMap<String, Tensor> =
        c.program.inputs.iter().map(|i| i.name.clone()).zip(tensors.iter().cloned()).collect();
    let optimized = opt::optimize(&c.program, &dims, &Config::default()).chosen;
    for (program, how) in [(&c.program, "as written"), (&optimized, "optimized")] {
        let outs = gpu.run(&plan::plan(program, &dims), &named_inputs).unwrap_or_else(|e| panic!("{e}")).0;
        for ((name, _), got) in program.outputs.iter().zip(&outs) {
            let what = format!("{case:?} N={n} {how}: {name}");
            let e = relative_error(&got.data, &want[name].data);
            assert!(e <= 1e-4, "{what}: relative error {e:e} > 1e-4");
            assert_each(got, &want[name], 1e-4, &what);
        }
    }
}

#[test]
fn the_kernels_match_the_interpreter_over_a_cache_of_several_tiles() {
    let gpu = wgpu();
    let c = |h, p, d, mask, window, collapse, rope| Case { h, p, d, mask, window, collapse, rope };
    // 1100 tokens of 2 pseudo-heads: 2198 cache rows; 700 of 3 with d = 128 and a window.
    check_on_wgpu(&gpu, &c(2, 2, 64, "flat_causal", None, "global", Some(10000.0)), 1100, 1);
    check_on_wgpu(&gpu, &c(2, 3, 128, "token_causal", Some(300), "per_head", Some(10000.0)), 700, 2);
    // Awkward small sizes: the first token (an empty cache) and the second.
    check_on_wgpu(&gpu, &c(3, 2, 24, "token_causal", None, "global", None), 1, 3);
    check_on_wgpu(&gpu, &c(3, 3, 10, "flat_causal", Some(1), "global", Some(100.0)), 2, 4);
}

/// The gradient program of a decode step (the concatenations' gradients
/// are slices, read as views) on wgpu against the interpreter.
#[test]
fn the_gradient_program_runs_on_wgpu() {
    let gpu = wgpu();
    let case = Case { h: 2, p: 3, d: 16, mask: "flat_causal", window: None, collapse: "global", rope: Some(100.0) };
    let c = compile_stdlib("iha_decode", &case.sets(70));
    let g = attnc_compiler::grad::differentiate(&c.program, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(g.outputs.iter().any(|(n, _)| n == "grad_k_cache"), "the cache has a gradient");
    let (drawn, _) = bind::generate_inputs(&g, 5).unwrap();
    let inputs: BTreeMap<String, Tensor> = g.inputs.iter().map(|i| i.name.clone()).zip(drawn).collect();
    let want = eval(&attnc_compiler::Compiled { program: g.clone(), ..c.clone() }, &inputs);
    let (_, dims) = bind::bind_inputs(&g, inputs.clone(), &BTreeSet::new()).unwrap();
    let outs = gpu.run(&plan::plan(&g, &dims), &inputs).unwrap_or_else(|e| panic!("{e}")).0;
    for ((name, _), got) in g.outputs.iter().zip(&outs) {
        let e = relative_error(&got.data, &want[name].data);
        assert!(e <= 1e-4, "{name}: relative error {e:e} > 1e-4");
        assert_each(got, &want[name], 1e-4, name);
    }
}
