//! Attention weights beyond the softmax on the kernels (`weights = sigmoid |
//! linear | hard`, `sink =`; the normaliser `kit::norm::Norm`): forward and
//! gradients against the float64 interpreter on every kernel path that runs
//! them (CPU tiles, register tiles, fragments, split-KV decoding), past
//! several tiles each way, with GQA, unequal lengths, windows and d = 256.

use super::*;

/// The weightings: a softmax with a learned sink, sigmoid, linear, hard.
const WEIGHTINGS: [&str; 4] = ["softmax, sink = t", "sigmoid", "linear", "hard"];

/// [`Sized`]'s attention with `weights` (and its sink `t: [H]`).
fn weighted_spec(c: &Sized, weights: &str) -> attnc_compiler::Compiled {
    let window = c.window.map_or("none".to_string(), |w| w.to_string());
    let Sized { h, hk, m, n, d, mask, block, .. } = *c;
    let source = format!(
        "spec weighted\ninput q: [1, {h}, {m}, {d}]\ninput k: [1, {hk}, {n}, {d}]\ninput v: [1, {hk}, {n}, {d}]\n\
         input t: [{h}]\n\
         output o = attention(q, k, v, mask = {mask}, window = {window}, block = {block}, weights = {weights})\n"
    );
    attnc_compiler::compile(&source, &[]).unwrap_or_else(|e| panic!("{}", attnc_compiler::render("w", &source, &e)))
}

fn describe(c: &Sized, weights: &str) -> String {
    format!(
        "weights = {weights}: H={} H_kv={} M={} N={} d={} mask={} window={:?}",
        c.h, c.hk, c.m, c.n, c.d, c.mask, c.window
    )
}

/// Inputs for `c`: queries scaled so that the logits span a few units
/// (the softmax neither flat nor one-hot), a sink logit per head around
/// the rows' typical log-sum-exp so that it takes a real share.
fn weighted_inputs(c: &Sized, seed: u64) -> BTreeMap<String, Tensor> {
    let mut rng = Rng::for_input(seed, "weights");
    let mut q = random(&mut rng, &[1, c.h, c.m, c.d]);
    q.data.iter_mut().for_each(|v| *v *= 3.0);
    let mut t = random(&mut rng, &[c.h]);
    t.data.iter_mut().for_each(|v| *v = 4.0 * *v + (c.n as f64).ln());
    named(vec![
        ("q", q),
        ("k", random(&mut rng, &[1, c.hk, c.n, c.d])),
        ("v", random(&mut rng, &[1, c.hk, c.n, c.d])),
        ("t", t),
    ])
}

/// The forward of every weighting on `dev`, row by row against the
/// interpreter, on plan `adjust(plan)`.
fn forward(dev: &Dev, cases: &[Sized], adjust: &dyn Fn(Plan) -> Plan) {
    forward_of(dev, cases, &WEIGHTINGS, adjust)
}

/// The forward of `weightings` on `dev`: each distinct size is a kernel
/// lavapipe compiles (CI's time), so the paths past the CPU tiles run
/// the cases that differ per weighting.
fn forward_of(dev: &Dev, cases: &[Sized], weightings: &[&str], adjust: &dyn Fn(Plan) -> Plan) {
    for (i, c) in cases.iter().enumerate() {
        for &weights in weightings {
            let spec = weighted_spec(c, weights);
            let inputs = weighted_inputs(c, 500 + i as u64);
            let want = &eval(&spec, &inputs)["o"];
            let dims = bind::default_dims(&spec.program).unwrap();
            let ordered: Vec<Tensor> = ["q", "k", "v", "t"].iter().map(|n| inputs[*n].clone()).collect();
            let same = dev.same(&spec.program, &ordered, &dims).map(|mut o| o.remove(0));
            let what = describe(c, weights);
            let plan = adjust(dev.plan(&spec.program, &dims));
            let (got, _) = dev.run(&plan, &inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
            check_rows(dev.dtype, &got[0], want, same.as_ref(), &what);
        }
    }
}

/// dQ, dK, dV of `weightings` (not hard, whose gradient the kernels
/// refuse), and the sink's gradient, against the interpreter.
fn gradients(dev: &Dev, cases: &[Sized], weightings: &[&str], kinds: &[&str]) {
    for (i, c) in cases.iter().enumerate() {
        for weights in weightings {
            let spec = weighted_spec(c, weights);
            // The sink's own gradient too (`sink_grad`).
            let sink = weights.contains("sink");
            let wrt: Vec<String> =
                ["q", "k", "v", "t"][..3 + usize::from(sink)].iter().map(|x| x.to_string()).collect();
            let grad = attnc_compiler::grad::differentiate(&spec.program, &wrt).unwrap();
            let mut kinds = kinds.to_vec();
            if sink {
                kinds.push("sink_grad");
            }
            let mut inputs = weighted_inputs(c, 600 + i as u64);
            let (tensors, dims) = bind::generate_inputs(&grad, 600 + i as u64).unwrap();
            let named: BTreeMap<String, Tensor> =
                grad.inputs.iter().map(|x| x.name.clone()).zip(tensors.iter().cloned()).collect();
            // The spec's inputs as drawn above, the cotangent as generated.
            for (name, t) in named {
                inputs.entry(name).or_insert(t);
            }
            let tensors: Vec<Tensor> = grad.inputs.iter().map(|x| inputs[&x.name].clone()).collect();
            check_gradients(dev, &grad, &tensors, &dims, &kinds, &format!("gradients of {}", describe(c, weights)));
        }
    }
}

fn s(h: usize, hk: usize, m: usize, n: usize, d: usize, mask: &'static str, window: Option<usize>) -> Sized {
    Sized { h, hk, m, n, d, mask, window, block: 1 }
}

/// The CPU drivers' tiled kernels (what wgpu runs on lavapipe), f32 (f16:
/// on fragments, below): GQA past several tiles with N in the thousands
/// and M ≠ N, a window, d = 256, and an awkward small size.
#[test]
pub(crate) fn attention_weights_match_the_interpreter() {
    let dev = &device(wgpu, Dtype::F32);
    let cases = [
        s(4, 2, 300, 1100, 64, "causal", Some(700)),
        s(2, 1, 40, 70, 256, "none", Some(30)),
        s(3, 3, 5, 3, 6, "none", None),
    ];
    forward(dev, &cases, &|p| p);
    let kinds = ["attention", "attention_grad_q", "attention_grad_kv"];
    gradients(dev, &[s(2, 1, 130, 1030, 64, "causal", None)], &WEIGHTINGS[..3], &kinds);
    // d = 256: the sink (the softmax's arms and the sink's own gradient).
    gradients(dev, &[s(1, 1, 40, 70, 256, "causal", None)], &WEIGHTINGS[..1], &kinds);
}

/// Register tiles (what CUDA runs in f32).
#[test]
pub(crate) fn attention_weights_on_register_tiles_match_the_interpreter() {
    let dev = device(wgpu, Dtype::F32).map(|g| g.with_register_tiles());
    let cases = [s(4, 2, 300, 1100, 64, "causal", Some(500))];
    forward(&dev, &cases, &|p| p);
    gradients(&dev, &cases, &WEIGHTINGS[..2], &["attention", "attention_grad_q", "attention_grad_kv"]);
}

/// Matrix fragments in f16 (computed in software here): forward and backward.
#[test]
pub(crate) fn attention_weights_on_fragments_match_the_interpreter() {
    let dev = device(wgpu, Dtype::F16).map(|g| g.with_software_fragments());
    let cases = [s(2, 1, 300, 1000, 64, "causal", Some(400))];
    for c in &cases {
        let spec = weighted_spec(c, "sigmoid");
        let p = dev.plan(&spec.program, &bind::default_dims(&spec.program).unwrap());
        assert!(p.launches.iter().all(|l| l.spec.fragments()), "d = {}: not tiled for fragments", c.d);
    }
    // Hard and linear forward; the sink and sigmoid forward and backward
    // (each weighting's arms differ in the softmax's place; linear's
    // gradient is sigmoid's without the slope, both run on CPU tiles).
    forward_of(&dev, &cases, &["hard", "linear"], &|p| p);
    gradients(&dev, &cases, &WEIGHTINGS[..2], &["attention", "attention_grad_q", "attention_grad_kv"]);
}

/// Split-KV decoding: chunks merged per weighting (the log-sum-exp and
/// the sink's term; sums; max and ties), on CPU and register tiles, with
/// a window that leaves early chunks with no key.
#[test]
pub(crate) fn attention_weights_split_over_keys_match_the_interpreter() {
    let split = |p: Plan| {
        let p = p.split_kv(64);
        assert!(p.launches.iter().any(|l| matches!(l.spec, plan::KernelSpec::Combine { .. })), "not split");
        p
    };
    let cases = [s(2, 1, 1, 3000, 64, "causal", None), s(4, 2, 3, 2100, 32, "causal", Some(700))];
    forward(&device(wgpu, Dtype::F32), &cases, &split);
    forward(&device(wgpu, Dtype::F32).map(|g| g.with_register_tiles()), &cases, &split);
    forward(&device(wgpu, Dtype::F16), &cases[..1], &split);
}

/// Hard attention on scores that tie (integer queries and keys, scale 1,
/// so that the scores are exact in f32): every
/// path's output is the interpreter's up to f32's rounding, each row the
/// mean of exactly its tied values.
#[test]
pub(crate) fn hard_attention_on_the_kernels_is_exact_on_ties() {
    // Scale 1: the kernels scale q before the dot products, which with
    // 1/√8 would round tied integer scores apart.
    let c = s(2, 1, 90, 700, 8, "causal", None);
    let spec = weighted_spec(&c, "hard, scale = 1.0");
    let mut rng = Rng::for_input(77, "ties");
    let mut integers = |shape: &[usize]| {
        let mut t = random(&mut rng, shape);
        t.data.iter_mut().for_each(|v| *v = (*v * 2.0).round());
        t
    };
    let inputs = named(vec![
        ("q", integers(&[1, 2, 90, 8])),
        ("k", integers(&[1, 1, 700, 8])),
        ("v", integers(&[1, 1, 700, 8])),
        ("t", integers(&[2])),
    ]);
    // Ties do occur: rows whose maximal score is taken by several keys.
    let (q, k) = (&inputs["q"], &inputs["k"]);
    let tied = (0..2 * 90)
        .filter(|r| {
            let i = r % 90 + 700 - 90;
            let score = |j: usize| (0..8).map(|x| q.data[r * 8 + x] * k.data[j * 8 + x]).sum::<f64>();
            let top = (0..=i).map(score).fold(f64::MIN, f64::max);
            (0..=i).filter(|&j| score(j) == top).count() > 1
        })
        .count();
    assert!(tied > 20, "only {tied} rows tie");
    let want = &eval(&spec, &inputs)["o"];
    let dims = bind::default_dims(&spec.program).unwrap();
    let plain = device(wgpu, Dtype::F32);
    let tiled = device(wgpu, Dtype::F32).map(|g| g.with_register_tiles());
    for (dev, what) in [(&plain, "cpu tiles"), (&tiled, "register tiles")] {
        for split in [false, true] {
            let p = dev.plan(&spec.program, &dims);
            let p = if split { p.split_kv(64) } else { p };
            let combined = p.launches.iter().any(|l| matches!(l.spec, plan::KernelSpec::Combine { .. }));
            assert_eq!(combined, split, "{what}: split {split}");
            let got = dev.run(&p, &inputs).unwrap_or_else(|e| panic!("{what}: {e}")).0.remove(0);
            // The tied sets exactly: each entry a mean of integers, to f32's
            // rounding of `sum · (1 / ties)` (a wrong set is off by ≥ 1/N²).
            for (x, (g, w)) in got.data.iter().zip(&want.data).enumerate() {
                assert!((g - w).abs() <= 4e-7 * w.abs().max(1.0), "{what}, split {split}: entry {x}: {g} against {w}");
            }
        }
    }
}
