//! Attention weights beyond the softmax on the kernels (`weights = sigmoid |
//! linear | hard`, `sink =`; the normaliser `kit::norm::Norm`): forward and
//! gradients against the float64 interpreter on every kernel path that runs
//! them (CPU tiles, register tiles, fragments, split-KV decoding), past
//! several tiles each way, with GQA, unequal lengths, windows and d = 256,
//! and with per-sequence `lengths` over contiguous and paged caches.

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

/// A serving layout of [`Served`]: keys contiguous, or in a paged cache of
/// `page`-row pages.
#[derive(Clone, Copy, Debug)]
struct Served {
    h: usize,
    hk: usize,
    m: usize,
    n: usize,
    d: usize,
    lengths: [usize; 3],
    page: Option<usize>,
}

impl Served {
    /// Page slots a sequence has, and pages in the cache (two spare).
    fn pages(&self) -> Option<(usize, usize, usize)> {
        self.page.map(|p| (p, self.n.div_ceil(p), 3 * self.n.div_ceil(p) + 2))
    }
}

/// Three sequences of `lengths` keys (the queries the last rows of each),
/// causal, with `weights`: `stdlib/kvcache.attn`'s, or `stdlib/paged.attn`'s
/// reading the pages in place.
fn served_spec(c: &Served, weights: &str) -> attnc_compiler::Compiled {
    let Served { h, hk, m, n, d, .. } = *c;
    let (keys, extra, arg) = match c.pages() {
        None => (format!("[3, {hk}, {n}, {d}]"), String::new(), ""),
        Some((ps, mp, nb)) => (
            format!("[{nb}, {ps}, {hk}, {d}]"),
            format!("input pages: [3, {mp}] in integers(0, {})\n", nb - 1),
            ", pages = pages",
        ),
    };
    let source = format!(
        "spec served\ninput q: [3, {h}, {m}, {d}]\ninput k: {keys}\ninput v: {keys}\n{extra}\
         input lengths: [3] in integers(0, {n})\ninput t: [{h}]\n\
         output o = attention(q, k, v, mask = causal, lengths = lengths{arg}, weights = {weights})\n"
    );
    attnc_compiler::compile(&source, &[]).unwrap_or_else(|e| panic!("{}", attnc_compiler::render("s", &source, &e)))
}

/// Inputs of `c`: as [`weighted_inputs`], and a block table that shuffles
/// the cache's pages (two spare ones never read).
fn served_inputs(c: &Served, seed: u64) -> BTreeMap<String, Tensor> {
    let mut rng = Rng::for_input(seed, "served");
    let keys = match c.pages() {
        None => vec![3, c.hk, c.n, c.d],
        Some((ps, _, nb)) => vec![nb, ps, c.hk, c.d],
    };
    let mut q = random(&mut rng, &[3, c.h, c.m, c.d]);
    q.data.iter_mut().for_each(|v| *v *= 3.0);
    let mut t = random(&mut rng, &[c.h]);
    t.data.iter_mut().for_each(|v| *v = 4.0 * *v + (c.n as f64).ln());
    let mut out = named(vec![
        ("q", q),
        ("k", random(&mut rng, &keys)),
        ("v", random(&mut rng, &keys)),
        ("lengths", Tensor::new(vec![3], c.lengths.iter().map(|&l| l as f64).collect())),
        ("t", t),
    ]);
    if let Some((_, mp, nb)) = c.pages() {
        let mut order: Vec<usize> = (0..nb).collect();
        for i in (1..nb).rev() {
            order.swap(i, (rng.unit() * (i + 1) as f64) as usize % (i + 1));
        }
        out.insert("pages".into(), Tensor::new(vec![3, mp], order[..3 * mp].iter().map(|&p| p as f64).collect()));
    }
    out
}

/// The forward of `c` with each of `weightings` on `dev` (plan `adjust`ed)
/// against the interpreter, row by row: rows that see no key are 0.
fn served_forward(dev: &Dev, c: &Served, weightings: &[&str], seed: u64, adjust: &dyn Fn(Plan) -> Plan) {
    for &weights in weightings {
        let spec = served_spec(c, weights);
        let inputs = served_inputs(c, seed);
        let (tensors, dims) = bind::bind_inputs(&spec.program, inputs.clone(), &Default::default()).unwrap();
        let want = interp::evaluate(&spec.program, &tensors, &dims).remove(0);
        let empty = want.data.chunks(c.d).filter(|r| r.iter().all(|x| *x == 0.0)).count();
        assert!(empty > 0 && empty < want.data.len() / c.d, "{c:?}: {empty} rows see no key");
        let plan = adjust(dev.plan(&spec.program, &dims));
        let what = format!(
            "weights = {weights}, {c:?}, {:?}",
            plan.launches.iter().map(|l| l.spec.kind()).collect::<Vec<_>>()
        );
        if c.page.is_some() {
            assert!(plan.launches.iter().all(|l| l.spec.kind() != "gather"), "{what}: pages not read in place");
        }
        let same = dev.same(&spec.program, &tensors, &dims).map(|mut o| o.remove(0));
        let (got, _) = dev.run(&plan, &inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
        check_rows(dev.dtype, &got[0], &want, same.as_ref(), &what);
    }
}

/// Every weighting with per-sequence `lengths` (one sequence shorter than
/// its queries, so rows that see no key: 0 with a sink too), with keys
/// contiguous and paged (pages read in place, shuffled), a decode row
/// split over its keys, gradients (q, k, v and the sink) with lengths, and
/// f16 on fragments over pages.
#[test]
pub(crate) fn attention_weights_with_lengths_and_pages_match_the_interpreter() {
    let f32s = device(wgpu, Dtype::F32);
    let tiled = device(wgpu, Dtype::F32).map(|g| g.with_register_tiles());
    let contiguous = Served { h: 4, hk: 2, m: 40, n: 1100, d: 64, lengths: [1100, 333, 17], page: None };
    served_forward(&f32s, &contiguous, &WEIGHTINGS, 800, &|p| p);
    let paged = Served { lengths: [1100, 500, 0], page: Some(16), ..contiguous };
    served_forward(&f32s, &paged, &WEIGHTINGS, 801, &|p| p);
    served_forward(&tiled, &paged, &WEIGHTINGS, 802, &|p| p);
    // A decode row over up to 3000 keys, in chunks of 64 merged per weighting.
    let decode = Served { h: 2, hk: 1, m: 1, n: 3000, d: 32, lengths: [3000, 1234, 0], page: None };
    let split = |p: Plan| {
        let p = p.split_kv(64);
        assert!(p.launches.iter().any(|l| matches!(l.spec, plan::KernelSpec::Combine { .. })), "not split");
        p
    };
    served_forward(&f32s, &decode, &WEIGHTINGS, 803, &split);
    let fragments = device(wgpu, Dtype::F16).map(|g| g.with_software_fragments());
    served_forward(&fragments, &paged, &WEIGHTINGS[..2], 804, &|p| {
        assert!(p.launches.iter().all(|l| l.spec.fragments()), "paged f16 attention is on fragments");
        p
    });
    // Gradients with lengths (a paged cache has none; hard's q and k
    // gradients are 0 and its v gradient is the interpreter's).
    let c = Served { m: 30, n: 700, lengths: [700, 250, 17], ..contiguous };
    for (i, weights) in WEIGHTINGS[..3].iter().enumerate() {
        let spec = served_spec(&c, weights);
        let sink = weights.contains("sink");
        let wrt: Vec<String> = ["q", "k", "v", "t"][..3 + usize::from(sink)].iter().map(|x| x.to_string()).collect();
        let grad = attnc_compiler::grad::differentiate(&spec.program, &wrt).unwrap();
        let mut inputs = served_inputs(&c, 810 + i as u64);
        let mut rng = Rng::for_input(i as u64, "cotangent");
        inputs.insert("cot_o".into(), random(&mut rng, &[3, c.h, c.m, c.d]));
        let (tensors, dims) = bind::bind_inputs(&grad, inputs, &Default::default()).unwrap();
        let mut kinds = vec!["attention", "attention_grad_q", "attention_grad_kv"];
        kinds.extend(sink.then_some("sink_grad"));
        check_gradients(&f32s, &grad, &tensors, &dims, &kinds, &format!("gradients of weights = {weights}, {c:?}"));
    }
}
