//! The inference surface (docs/semantics.md §8): attention over a padded
//! key/value cache with per-sequence `lengths` and FlashAttention's one-sided
//! windows. The interpreter against a float64 reference written here in
//! FlashAttention's own terms (its test's `construct_local_mask` with a key
//! padding mask), on its kvcache grid; the wgpu kernels (forward, the
//! register-tiled forward CUDA runs, and the gradient program) against the
//! interpreter; bad lengths refused before any launch.

mod common;

use attnc_compiler::plan;
use attnc_runtime::gpu::exec::Gpu;
use attnc_runtime::io::{encode, FileDtype};
use attnc_runtime::rng::Rng;
use attnc_runtime::{bind, interp, Tensor};
use common::*;
use std::collections::{BTreeMap, BTreeSet};

/// One configuration of `stdlib/kvcache.attn`.
#[derive(Clone, Debug)]
struct Case {
    h: usize,
    h_kv: usize,
    d: usize,
    m: usize,
    n: usize,
    causal: bool,
    left: Option<usize>,
    right: Option<usize>,
    lengths: Vec<usize>,
}

impl Case {
    fn sets(&self) -> Vec<(&'static str, String)> {
        let mut s = vec![
            ("H", self.h.to_string()),
            ("H_kv", self.h_kv.to_string()),
            ("d", self.d.to_string()),
            ("M", self.m.to_string()),
            ("N", self.n.to_string()),
            ("B", self.lengths.len().to_string()),
            ("mask", if self.causal { "causal" } else { "none" }.to_string()),
        ];
        s.extend(self.left.map(|l| ("window_left", l.to_string())));
        s.extend(self.right.map(|r| ("window_right", r.to_string())));
        s
    }
}

/// Inputs of `case`: q, k, v uniform in [-1, 1), except the cache rows past
/// each sequence's length, which hold large values (keys ×8, values +100)
/// so that a kernel reading padding into its softmax fails loudly.
fn inputs(case: &Case, seed: u64) -> BTreeMap<String, Tensor> {
    let mut rng = Rng::for_input(seed, "kvcache");
    let b = case.lengths.len();
    let q = random(&mut rng, &[b, case.h, case.m, case.d]);
    let mut k = random(&mut rng, &[b, case.h_kv, case.n, case.d]);
    let mut v = random(&mut rng, &[b, case.h_kv, case.n, case.d]);
    for (bi, &len) in case.lengths.iter().enumerate() {
        for g in 0..case.h_kv {
            for j in len..case.n {
                for c in 0..case.d {
                    let at = ((bi * case.h_kv + g) * case.n + j) * case.d + c;
                    k.data[at] *= 8.0;
                    v.data[at] += 100.0;
                }
            }
        }
    }
    let lengths = Tensor::new(vec![b], case.lengths.iter().map(|&l| l as f64).collect());
    named(vec![("q", q), ("k", k), ("v", v), ("lengths", lengths)])
}

/// FlashAttention's reference (`attention_ref` in its tests): per sequence,
/// `sk` = its length and `sq` = M; key `j` of query row `i` is hidden iff
/// `j ≥ sk` (key padding), or `j > min(i + sk − sq + right, sk)`, or
/// `j < i + sk − sq − left` (`construct_local_mask`), causal being
/// `right = 0`; a row that sees no key is 0.
fn reference(case: &Case, t: &BTreeMap<String, Tensor>) -> Tensor {
    let (q, k, v) = (&t["q"], &t["k"], &t["v"]);
    let (h, hk, m, n, d) = (case.h, case.h_kv, case.m, case.n, case.d);
    // Causal is FlashAttention's window (-1, 0), which any right window contains.
    let right = if case.causal { Some(0) } else { case.right.map(|r| r as i64) };
    let mut out = Tensor::zeros(vec![case.lengths.len(), h, m, d]);
    for (bi, &sk) in case.lengths.iter().enumerate() {
        let sk = sk as i64;
        for hi in 0..h {
            let g = hi / (h / hk);
            for i in 0..m {
                let shift = i as i64 + sk - m as i64;
                let hidden = |j: i64| {
                    j >= sk
                        || right.is_some_and(|r| j > (shift + r).min(sk))
                        || case.left.is_some_and(|l| j < shift - l as i64)
                };
                let row = ((bi * h + hi) * m + i) * d;
                let logits: Vec<Option<f64>> = (0..n)
                    .map(|j| {
                        let col = ((bi * hk + g) * n + j) * d;
                        let dot: f64 = (0..d).map(|c| q.data[row + c] * k.data[col + c]).sum();
                        (!hidden(j as i64)).then(|| dot / (d as f64).sqrt())
                    })
                    .collect();
                let max = logits.iter().flatten().fold(f64::NEG_INFINITY, |a, b| a.max(*b));
                let total: f64 = logits.iter().flatten().map(|s| (s - max).exp()).sum();
                for (j, s) in logits.iter().enumerate() {
                    let Some(s) = s else { continue };
                    let p = (s - max).exp() / total;
                    let col = ((bi * hk + g) * n + j) * d;
                    for c in 0..d {
                        out.data[row + c] += p * v.data[col + c];
                    }
                }
            }
        }
    }
    out
}

/// Per element: `|a − b| ≤ tol · max|b|`, no NaN.
fn assert_each(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    let scale = b.data.iter().fold(0.0f64, |s, x| s.max(x.abs()));
    for (i, (x, y)) in a.data.iter().zip(&b.data).enumerate() {
        assert!((x - y).abs() <= tol * scale, "{what}: element {i} is {x}, want {y} (tolerance {tol:e} × {scale})");
    }
}

fn case(hs: (usize, usize), d: usize, (m, n): (usize, usize), causal: bool, lengths: &[usize]) -> Case {
    Case { h: hs.0, h_kv: hs.1, d, m, n, causal, left: None, right: None, lengths: lengths.to_vec() }
}

/// FlashAttention's kvcache grid, three sequences of different lengths a
/// batch (one full cache, one partial, one shorter than the queries or
/// empty): one query against hundreds to thousands of keys, chunks of
/// queries, GQA and MQA, causal and not, d ∈ {32, 59, 64, 128}, one-sided
/// windows.
fn grid() -> Vec<Case> {
    let mut cases = vec![
        case((4, 4), 64, (1, 339), true, &[339, 200, 1]),
        case((4, 2), 32, (1, 1024), false, &[700, 1024, 0]),
        case((4, 1), 128, (1, 800), true, &[13, 800, 799]),
        case((2, 2), 59, (3, 256), true, &[256, 130, 2]),
        case((4, 2), 64, (64, 128), true, &[128, 100, 30]),
        case((2, 1), 32, (137, 1000), false, &[1000, 512, 137]),
        case((2, 2), 128, (16, 2048), true, &[2048, 1500, 0]),
    ];
    let mut windowed = case((4, 2), 32, (5, 500), true, &[500, 77, 3]);
    windowed.left = Some(40);
    cases.push(windowed);
    let mut both = case((2, 1), 59, (7, 300), false, &[300, 9, 250]);
    (both.left, both.right) = (Some(20), Some(3));
    cases.push(both);
    let mut right = case((2, 2), 64, (1, 400), false, &[400, 33, 0]);
    right.right = Some(0);
    cases.push(right);
    cases
}

#[test]
fn the_interpreter_matches_flash_attentions_kvcache_reference() {
    for (seed, c) in grid().into_iter().enumerate() {
        let compiled = compile_stdlib("kvcache", &c.sets());
        let t = inputs(&c, seed as u64);
        let want = reference(&c, &t);
        let got = eval(&compiled, &t).remove("o").unwrap();
        assert!(want.data.iter().any(|x| *x != 0.0), "{c:?}: the reference is all zero");
        assert!(want.data.iter().all(|x| x.abs() < 50.0), "{c:?}: the reference read padding");
        assert_close(&got, &want, 1e-12, &format!("{c:?}"));
        assert_each(&got, &want, 1e-10, &format!("{c:?}"));
    }
}

/// `window = w` on a causal mask is `window_left = w − 1`; `window_right = 0`
/// unmasked is causal; with every sequence full, `lengths` changes nothing.
#[test]
fn positions_agree_with_the_built_in_masks() {
    let base = case((2, 1), 16, (9, 70), true, &[70, 70]);
    let t = inputs(&base, 7);
    let mut plain = t.clone();
    plain.remove("lengths");
    let run = |text: &str, sets: Vec<(&'static str, String)>, t: &BTreeMap<String, Tensor>| {
        let settings: Vec<_> =
            sets.iter().map(|(n, v)| attnc_compiler::Setting { name: n.to_string(), value: v.clone() }).collect();
        let c = attnc_compiler::compile(text, &settings).unwrap_or_else(|d| panic!("{d:?}"));
        eval(&c, t).remove("o").unwrap()
    };
    let sets = |extra: &[(&'static str, &str)]| {
        let mut s = base.sets();
        s.retain(|(k, _)| *k != "mask");
        s.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        s
    };
    let with = |extra: &[(&'static str, &str)]| run(&stdlib_source("kvcache"), sets(extra), &t);
    // kvcache.attn without `lengths`: positions over all N keys.
    let text = stdlib_source("kvcache")
        .replace(", lengths = lengths", "")
        .replace("input lengths: [B] in integers(0, N)  // keys held per sequence\n", "");
    let without = |extra: &[(&'static str, &str)]| run(&text, sets(extra), &plain);
    assert_close(&with(&[("mask", "causal")]), &without(&[("mask", "causal")]), 1e-12, "full lengths, causal");
    assert_close(&with(&[("mask", "none")]), &without(&[("mask", "none")]), 1e-12, "full lengths, unmasked");
    let causal = with(&[("mask", "causal")]);
    assert_close(&with(&[("mask", "none"), ("window_right", "0")]), &causal, 1e-12, "window_right = 0 is causal");
    // The built-in window (`p − j < 6`) is window_left = 5.
    let built_in = "spec w\ndim B = 2\ndim M = 9\ndim N = 70\ninput q: [B, 2, M, 16]\ninput k: [B, 1, N, 16]\n\
        input v: [B, 1, N, 16]\noutput o = attention(q, k, v, mask = causal, window = 6)\n";
    let windowed = without(&[("mask", "causal"), ("window_left", "5")]);
    assert_close(&run(built_in, vec![], &plain), &windowed, 1e-12, "window 6 = window_left 5");
    assert!(windowed.data.iter().any(|x| *x != 0.0) && windowed.data != causal.data);
}

fn on_kernels(gpu: &Gpu, c: &Case, seed: u64) {
    let compiled = compile_stdlib("kvcache", &c.sets());
    let t = inputs(c, seed);
    let (tensors, dims) = bind::bind_inputs(&compiled.program, t.clone(), &BTreeSet::new()).unwrap();
    let want = interp::evaluate(&compiled.program, &tensors, &dims).remove(0);
    let got = gpu.run(&plan::plan(&compiled.program, &dims), &t).unwrap().0.remove(0);
    assert!(got.data.iter().all(|v| !v.is_nan()), "{c:?}: NaN from the kernels");
    assert_close(&got, &want, 1e-4, &format!("{c:?} on the kernels"));
    assert_each(&got, &want, 1e-4, &format!("{c:?} on the kernels"));
}

/// f32 on wgpu against the interpreter: relative error ≤ 1e-4 and every
/// element within 1e-4 of the largest; the kernel CUDA runs (rows shared by
/// a plane's lanes) on a second device handle.
#[test]
fn the_kernels_match_the_interpreter() {
    let gpu = needs_wgpu();
    let mut cases = grid();
    cases.truncate(7);
    cases.push(grid()[7].clone());
    cases.push(grid()[8].clone());
    for (seed, c) in cases.iter().enumerate() {
        on_kernels(&gpu, c, 100 + seed as u64);
    }
    let tiled = needs_wgpu().with_register_tiles();
    for (seed, c) in grid().iter().enumerate().filter(|(i, _)| [1, 3, 5, 8].contains(i)) {
        on_kernels(&tiled, c, 200 + seed as u64);
    }
}

/// The gradient program (dq, dk, dv) with lengths on wgpu against the
/// interpreter; padding rows of dk and dv are exactly 0.
#[test]
fn the_backward_with_lengths_matches_the_interpreter() {
    let gpu = needs_wgpu();
    for (seed, c) in [case((4, 2), 32, (40, 300), true, &[300, 120, 17]), case((2, 1), 59, (5, 517), false, &[3, 517])]
        .iter()
        .enumerate()
    {
        let compiled = compile_stdlib("kvcache", &c.sets());
        let grad = attnc_compiler::grad::differentiate(&compiled.program, &[]).unwrap();
        let mut t = inputs(c, 300 + seed as u64);
        let mut rng = Rng::for_input(seed as u64, "cotangent");
        t.insert("cot_o".into(), random(&mut rng, &[c.lengths.len(), c.h, c.m, c.d]));
        let (tensors, dims) = bind::bind_inputs(&grad, t.clone(), &BTreeSet::new()).unwrap();
        let want = interp::evaluate(&grad, &tensors, &dims);
        let got = gpu.run(&plan::plan(&grad, &dims), &t).unwrap().0;
        for ((name, _), (g, w)) in grad.outputs.iter().zip(got.iter().zip(&want)) {
            assert!(g.data.iter().all(|v| !v.is_nan()), "{c:?}: NaN in {name}");
            assert_close(g, w, 1e-4, &format!("{c:?} {name}"));
            if name == "grad_k" || name == "grad_v" {
                let (bi, len) = (0..c.lengths.len()).map(|b| (b, c.lengths[b])).min_by_key(|x| x.1).unwrap();
                let row = ((bi * c.h_kv) * c.n + len) * c.d;
                assert!(w.data[row..row + c.d].iter().all(|x| *x == 0.0), "{name}: padding gets no gradient");
                assert!(
                    g.data[row..row + c.d].iter().all(|x| *x == 0.0),
                    "{name}: padding gets no gradient on the kernels"
                );
            }
        }
    }
}

/// A length past the cache, negative or fractional is refused before any
/// launch, naming the tensor, the sequence and the value; the CLI exits
/// non-zero and writes nothing.
#[test]
fn bad_lengths_are_refused() {
    let c = case((2, 1), 8, (2, 40), true, &[40, 3, 0]);
    let compiled = compile_stdlib("kvcache", &c.sets());
    for (bad, shown) in [(41.0, "41"), (-1.0, "-1"), (2.5, "2.5")] {
        let mut t = inputs(&c, 1);
        t.get_mut("lengths").unwrap().data[1] = bad;
        let err = bind::bind_inputs(&compiled.program, t, &BTreeSet::new()).unwrap_err().to_string();
        assert!(err.contains("`lengths`[1]") && err.contains(shown) && err.contains("0..=40"), "{err}");
    }
    let dir = std::env::temp_dir().join(format!("attnc-kvcache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut t = inputs(&c, 1);
    t.get_mut("lengths").unwrap().data[2] = 77.0;
    let pairs: Vec<(String, &Tensor)> = t.iter().map(|(n, t)| (n.clone(), t)).collect();
    let (file, out) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
    std::fs::write(&file, encode(&pairs, FileDtype::F32).unwrap()).unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_attnc"))
        .args(["run", "stdlib/kvcache.attn", "--inputs", file.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .args(["--set", "H=2", "--set", "H_kv=1", "--set", "d=8", "--backend", "wgpu"])
        .current_dir(root())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "a bad length must fail");
    assert!(stderr.contains("`lengths`[2] (sequence 2") && stderr.contains("77"), "{stderr}");
    assert!(!out.exists(), "nothing is written");
}

/// Lengths and block tables come as I32 or I64 in users' files: the run
/// equals the one from f32 lengths.
#[test]
fn integer_tensor_files_are_read() {
    use safetensors::tensor::{Dtype, TensorView};
    let c = case((2, 1), 8, (2, 40), true, &[40, 3, 0]);
    let t = inputs(&c, 4);
    let dir = std::env::temp_dir().join(format!("attnc-kvcache-int-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |name: &str, bytes: Vec<u8>| {
        let (file, out) = (dir.join(format!("{name}.safetensors")), dir.join(format!("{name}-out.safetensors")));
        std::fs::write(&file, bytes).unwrap();
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_attnc"))
            .args(["run", "stdlib/kvcache.attn", "--inputs", file.to_str().unwrap(), "--out", out.to_str().unwrap()])
            .args(["--set", "H=2", "--set", "H_kv=1", "--set", "d=8"])
            .current_dir(root())
            .status()
            .unwrap();
        assert!(status.success(), "{name}");
        attnc_runtime::io::read_tensors(&out, &Default::default()).unwrap().remove("o").unwrap()
    };
    let floats: Vec<(String, &Tensor)> = t.iter().map(|(n, t)| (n.clone(), t)).collect();
    let want = run("f32", encode(&floats, FileDtype::F32).unwrap());
    for (dtype, width) in [(Dtype::I32, 4), (Dtype::I64, 8)] {
        let ints: Vec<u8> = t["lengths"]
            .data
            .iter()
            .flat_map(
                |v| if width == 4 { (*v as i32).to_le_bytes().to_vec() } else { (*v as i64).to_le_bytes().to_vec() },
            )
            .collect();
        let rest: Vec<Vec<u8>> = t
            .iter()
            .filter(|(n, _)| *n != "lengths")
            .map(|(_, t)| t.data.iter().flat_map(|v| (*v as f32).to_le_bytes()).collect())
            .collect();
        let mut views = vec![("lengths".to_string(), TensorView::new(dtype, vec![3], &ints).unwrap())];
        for ((n, tensor), bytes) in t.iter().filter(|(n, _)| *n != "lengths").zip(&rest) {
            views.push((n.clone(), TensorView::new(Dtype::F32, tensor.shape.clone(), bytes).unwrap()));
        }
        let got = run(&format!("{dtype:?}"), safetensors::serialize(views, &None).unwrap());
        assert_eq!(got.data, want.data, "{dtype:?} lengths");
    }
}

/// `integers(0, N)` and a function's dims follow the dims the input tensors
/// fix, not the spec's defaults.
#[test]
fn dims_come_from_the_tensors() {
    // N = 256 by default; these tensors have N = 300 and a length of 290.
    let c = case((2, 1), 8, (3, 300), true, &[290, 300]);
    let t = inputs(&c, 9);
    let defaults = compile_stdlib("kvcache", &[("H", "2".into()), ("H_kv", "1".into()), ("d", "8".into())]);
    let got = eval(&defaults, &t).remove("o").unwrap();
    assert_close(&got, &reference(&c, &t), 1e-12, "dims from the tensors");
}

/// In f16 (integers exact only up to 2048) lengths past 2048 still hide
/// exactly the padding: a half-precision plan stores the integers the mask
/// reads as base-256 digits (`plan::INTEGER_DIGITS`). A length of 2999
/// rounded to f16 would be 3000 and read a padding row of values near 100.
/// Held to FlashAttention's rule against the same-dtype reference.
#[test]
fn half_precision_kernels_read_lengths_exactly() {
    use attnc_compiler::plan::Dtype;
    let gpu = needs_wgpu();
    gpu.supports(Dtype::F16).unwrap_or_else(|e| panic!("this test needs f16 kernels: {e}"));
    let c = case((2, 1), 32, (3, 3001), true, &[2999, 2051, 3001]);
    let compiled = compile_stdlib("kvcache", &c.sets());
    let t = inputs(&c, 21);
    let (tensors, dims) = bind::bind_inputs(&compiled.program, t.clone(), &BTreeSet::new()).unwrap();
    let want = interp::evaluate(&compiled.program, &tensors, &dims).remove(0);
    let plan = plan::plan(&compiled.program, &dims).in_dtype(Dtype::F16);
    assert!(plan.buffers.iter().any(|b| plan.elements_per_value(b.id) == plan::INTEGER_DIGITS), "lengths as digits");
    let same = interp::evaluate_planned(&compiled.program, &plan, &tensors).remove(0);
    let got = gpu.run(&plan, &t).unwrap().0.remove(0);
    assert!(want.data.iter().all(|x| x.abs() < 50.0), "the reference read padding");
    half_rule(&got.data, &want.data, &same.data, Dtype::F16).unwrap_or_else(|e| panic!("f16 with lengths: {e}"));
}

/// Integers a function reads are exact in kernels below 2^24; a larger one
/// is refused by name before a run.
#[test]
fn integers_past_two_to_the_24_are_refused() {
    let text = "spec big\ndim B = 1\ndim N = 4\ninput q: [B, 1, N, 2]\ninput k: [B, 1, N, 2]\ninput v: [B, 1, N, 2]\n\
        input doc: [B, N] in integers(0, 100000000)\n\
        output o = attention(q, k, v, mask = |b, h, i, j| doc[b, i] == doc[b, j])\n";
    let c = attnc_compiler::compile(text, &[]).unwrap();
    let (drawn, _) = bind::generate_inputs(&c.program, 3).unwrap();
    let mut t: BTreeMap<String, Tensor> = c.program.inputs.iter().map(|i| i.name.clone()).zip(drawn).collect();
    t.get_mut("doc").unwrap().data = vec![5.0, 16_777_215.0, 16_777_216.0, 0.0];
    let err = bind::check_exact_reads(&c.program, &t).unwrap_err().to_string();
    assert!(err.contains("`doc`[2] is 16777216") && err.contains("2^24"), "{err}");
    t.get_mut("doc").unwrap().data[2] = 7.0;
    bind::check_exact_reads(&c.program, &t).unwrap();
}

/// Errors in the serving arguments point at the argument, with a hint.
#[test]
fn serving_argument_errors_point_at_them() {
    let head = "spec e\ndim B = 2\ndim N = 6\ninput q: [B, 2, N, 4]\ninput k: [B, 2, N, 4]\ninput v: [B, 2, N, 4]\n\
        input lengths: [B] in integers(0, N)\ninput wide: [B, 2] in integers(0, N)\nlet twice = lengths * 2.0\n";
    let cases = [
        ("lengths = wide", "E0301", "`lengths` has shape [B, 2], but attention's batch wants [B]", "wide"),
        ("lengths = twice", "E0203", "`lengths` must be an input", "twice"),
        ("lengths = lengths, block = 2", "E0201", "count rows one a token", "2"),
        ("mask = |b, h, i, j| j <= i, window_left = 3", "E0201", "a window applies to the built-in masks", "3"),
        ("window_right = -1", "E0201", "must be an integer of at least 0", "-1"),
    ];
    for (arg, code, message, at) in cases {
        assert_points_at(&format!("{head}output o = attention(q, k, v, {arg})\n"), code, message, at);
    }
    // Unused serving arguments are allowed as `none`, even with a mask function.
    let text = format!("{head}output o = attention(q, k, v, mask = |b, h, i, j| j <= i, window_left = none)\n");
    let text = text.replace("input wide: [B, 2] in integers(0, N)\n", "").replace("let twice = lengths * 2.0\n", "");
    let text = text.replace("input lengths: [B] in integers(0, N)\n", "");
    attnc_compiler::compile(&text, &[]).unwrap_or_else(|d| panic!("{d:?}"));
}

/// `case`'s contiguous inputs laid out as a paged cache of `page`-row pages
/// (FlashAttention's `block_table`): the sequences' pages shuffled over a
/// cache with two spare pages, spare pages and rows past a sequence's cache
/// holding large values, so a wrong page or row read fails loudly.
fn paged_inputs(c: &Case, t: &BTreeMap<String, Tensor>, page: usize, seed: u64) -> BTreeMap<String, Tensor> {
    let (b, hk, n, d) = (c.lengths.len(), c.h_kv, c.n, c.d);
    let slots = n.div_ceil(page);
    let blocks = b * slots + 2;
    let mut rng = Rng::for_input(seed, "pages");
    let mut order: Vec<usize> = (0..blocks).collect();
    for i in (1..blocks).rev() {
        order.swap(i, (rng.unit() * (i + 1) as f64) as usize % (i + 1));
    }
    let mut table = Tensor::zeros(vec![b, slots]);
    let mut caches = [(); 2].map(|_| Tensor::new(vec![blocks, page, hk, d], vec![300.0; blocks * page * hk * d]));
    for bi in 0..b {
        for slot in 0..slots {
            let p = order[bi * slots + slot];
            table.data[bi * slots + slot] = p as f64;
            for r in 0..page {
                let row = slot * page + r;
                for g in 0..hk {
                    for ch in 0..d {
                        let at = ((p * page + r) * hk + g) * d + ch;
                        for (cache, name) in caches.iter_mut().zip(["k", "v"]) {
                            cache.data[at] =
                                if row < n { t[name].data[((bi * hk + g) * n + row) * d + ch] } else { -300.0 };
                        }
                    }
                }
            }
        }
    }
    let [k_cache, v_cache] = caches;
    named(vec![
        ("q", t["q"].clone()),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("pages", table),
        ("lengths", t["lengths"].clone()),
    ])
}

fn paged_sets(c: &Case, page: usize) -> Vec<(&'static str, String)> {
    let slots = c.n.div_ceil(page);
    let mut s = c.sets();
    s.retain(|(k, _)| *k != "N");
    s.extend([("PS", page.to_string()), ("MP", slots.to_string()), ("NB", (c.lengths.len() * slots + 2).to_string())]);
    s
}

/// A paged cache (page sizes 1, 16 and 256, as FlashAttention tests) gives
/// what the contiguous cache gives: the interpreter against the kvcache
/// reference, the kernels reading the pages in place (both kernels, f32;
/// f16 for one case) against the interpreter.
#[test]
fn paged_caches_match_the_reference() {
    let gpu = needs_wgpu();
    let tiled = needs_wgpu().with_register_tiles();
    let grid = grid();
    for (n, c) in grid.iter().enumerate() {
        let t = inputs(c, 500 + n as u64);
        let want = reference(c, &t);
        for (k, page) in [1, 16, 256].into_iter().enumerate() {
            if page == 1 && c.n > 800 {
                continue; // a thousand one-row pages: the interpreter's time, nothing new
            }
            let compiled = compile_stdlib("paged", &paged_sets(c, page));
            let p = paged_inputs(c, &t, page, n as u64);
            let got = eval(&compiled, &p).remove("o").unwrap();
            assert_close(&got, &want, 1e-12, &format!("{c:?}, pages of {page}"));
            if (n + k) % 3 == 0 {
                let (_, dims) = bind::bind_inputs(&compiled.program, p.clone(), &BTreeSet::new()).unwrap();
                let plan = plan::plan(&compiled.program, &dims);
                // Attention reads the pages in place: no gather launch.
                assert_eq!(
                    plan.launches.len(),
                    1,
                    "{:?}",
                    plan.launches.iter().map(|l| l.spec.kind()).collect::<Vec<_>>()
                );
                let dev = if n % 2 == 0 { &gpu } else { &tiled };
                let on = dev.run(&plan, &p).unwrap().0.remove(0);
                assert_close(&on, &got, 1e-4, &format!("{c:?}, pages of {page}, on the kernels"));
                assert_each(&on, &got, 1e-4, &format!("{c:?}, pages of {page}, on the kernels"));
            }
        }
    }
    // f16, with page indices past f16's integers (2048 one-row pages).
    let c = case((2, 1), 16, (2, 1100), true, &[1100, 1000]);
    let t = inputs(&c, 9);
    let compiled = compile_stdlib("paged", &paged_sets(&c, 1));
    let p = paged_inputs(&c, &t, 1, 9);
    let (tensors, dims) = bind::bind_inputs(&compiled.program, p.clone(), &BTreeSet::new()).unwrap();
    let want = interp::evaluate(&compiled.program, &tensors, &dims).remove(0);
    let plan = plan::plan(&compiled.program, &dims).in_dtype(attnc_compiler::plan::Dtype::F16);
    let same = interp::evaluate_planned(&compiled.program, &plan, &tensors).remove(0);
    let got = gpu.run(&plan, &p).unwrap().0.remove(0);
    half_rule(&got.data, &want.data, &same.data, attnc_compiler::plan::Dtype::F16)
        .unwrap_or_else(|e| panic!("f16 paged: {e}"));
    // In half precision paged attention runs on matrix fragments (the
    // tensor-core kernel, fragments in software here), reading the pages in
    // place: one-row pages as above, and pages of 16 at d = 64.
    let fragments = needs_wgpu().with_software_fragments();
    for (c, page) in [(c, 1), (case((2, 1), 64, (3, 700), false, &[700, 333, 17]), 16)] {
        let t = inputs(&c, 10);
        let compiled = compile_stdlib("paged", &paged_sets(&c, page));
        let p = paged_inputs(&c, &t, page, 10);
        let (tensors, dims) = bind::bind_inputs(&compiled.program, p.clone(), &BTreeSet::new()).unwrap();
        let want = interp::evaluate(&compiled.program, &tensors, &dims).remove(0);
        let plan = plan::plan(&compiled.program, &dims).in_dtype(attnc_compiler::plan::Dtype::F16);
        let kinds: Vec<&str> = plan.launches.iter().map(|l| l.spec.kind()).collect();
        assert_eq!(kinds, ["attention"], "read in place, one launch");
        assert!(plan.launches[0].spec.fragments(), "paged attention in f16 is on fragments");
        let same = interp::evaluate_planned(&compiled.program, &plan, &tensors).remove(0);
        let got = fragments.run(&plan, &p).unwrap().0.remove(0);
        half_rule(&got.data, &want.data, &same.data, attnc_compiler::plan::Dtype::F16)
            .unwrap_or_else(|e| panic!("f16 paged on fragments, pages of {page}: {e}"));
    }
}

/// A page index outside the cache, or a fractional one, is refused before
/// any launch, naming the sequence, its page slot and the value; a paged
/// cache has no gradient.
#[test]
fn bad_block_tables_are_refused() {
    let c = case((2, 1), 8, (2, 40), true, &[40, 3, 0]);
    let compiled = compile_stdlib("paged", &paged_sets(&c, 16));
    for (bad, shown) in [(11.0, "11"), (-1.0, "-1"), (0.5, "0.5")] {
        let mut p = paged_inputs(&c, &inputs(&c, 1), 16, 1);
        p.get_mut("pages").unwrap().data[4] = bad;
        let err = bind::bind_inputs(&compiled.program, p, &BTreeSet::new()).unwrap_err().to_string();
        assert!(err.contains("`pages`[1, 1] (sequence 1's page 1)") && err.contains(shown), "{err}");
        assert!(err.contains("the cache has 11 pages"), "{err}");
    }
    let err = attnc_compiler::grad::differentiate(&compiled.program, &[]).unwrap_err().to_string();
    assert!(err.contains("a paged key/value cache has no gradient"), "{err}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Random serving configurations (sizes that are multiples of no tile,
    /// lengths anywhere in 0..=N, windows, GQA, page sizes) on the
    /// interpreter against the kvcache reference, contiguous and paged.
    #[test]
    fn random_serving_configurations_match_the_reference(
        heads in proptest::sample::select(vec![(1usize, 1usize), (2, 1), (3, 3), (4, 2)]),
        d in 1usize..20,
        m in 1usize..9,
        n in 1usize..90,
        fractions in proptest::collection::vec(0.0f64..=1.0, 1..4),
        causal in proptest::bool::ANY,
        left in proptest::option::of(0usize..30),
        right in proptest::option::of(0usize..30),
        page in 1usize..40,
        seed in 0u64..1000,
    ) {
        let lengths: Vec<usize> = fractions.iter().map(|f| (f * n as f64).round() as usize).collect();
        let c = Case { h: heads.0, h_kv: heads.1, d, m, n, causal, left, right, lengths };
        let t = inputs(&c, seed);
        let want = reference(&c, &t);
        let got = eval(&compile_stdlib("kvcache", &c.sets()), &t).remove("o").unwrap();
        proptest::prop_assert!(attnc_runtime::relative_error(&got.data, &want.data) <= 1e-12 || want.data.iter().all(|x| *x == 0.0));
        proptest::prop_assert!(got.data.iter().zip(&want.data).all(|(a, b)| (a - b).abs() <= 1e-12));
        let paged = eval(&compile_stdlib("paged", &paged_sets(&c, page)), &paged_inputs(&c, &t, page, seed))
            .remove("o")
            .unwrap();
        proptest::prop_assert!(paged.data.iter().zip(&want.data).all(|(a, b)| (a - b).abs() <= 1e-12));
    }
}

/// `lengths` composes with an author's mask function and with head mixing
/// inside attention: each equals the spec that writes the lengths into its
/// mask function by hand (interpreter), and runs on the kernels (wgpu f32,
/// against the interpreter).
#[test]
fn lengths_compose_with_functions_and_head_mixing() {
    let gpu = needs_wgpu();
    let head = "spec c\ndim B = 3\ndim M = 5\ndim N = 300\ninput q: [B, 4, M, 16]\ninput k: [B, 2, N, 16]\n\
        input v: [B, 2, N, 16]\ninput lengths: [B] in integers(0, N)\ninput doc: [B, N] in integers(0, 1000)\n\
        input wl: [4, 4]\ninput wp: [4, 4]\n";
    let cases = [
        (
            "lengths = lengths, mask = |b, h, i, j| doc[b, j] < 600",
            "mask = |b, h, i, j| j < lengths[b] and doc[b, j] < 600",
        ),
        (
            "lengths = lengths, mask = causal, mix_logits = wl, mix_probs = wp",
            "mask = |b, h, i, j| j < lengths[b] and j <= i + lengths[b] - M, mix_logits = wl, mix_probs = wp",
        ),
    ];
    for (seed, (arg, by_hand)) in cases.into_iter().enumerate() {
        let compile = |a: &str| {
            let mut text = format!("{head}output o = attention(q, k, v, {a})\n");
            // Inputs a case does not read are not declared (E0402).
            for (name, line) in
                [("doc", "input doc: [B, N] in integers(0, 1000)\n"), ("wl", "input wl: [4, 4]\ninput wp: [4, 4]\n")]
            {
                if !a.contains(name) {
                    text = text.replace(line, "");
                }
            }
            attnc_compiler::compile(&text, &[]).unwrap_or_else(|d| panic!("{a}: {d:?}"))
        };
        let (c, hand) = (compile(arg), compile(by_hand));
        let (drawn, _) = bind::generate_inputs(&c.program, 40 + seed as u64).unwrap();
        let mut t: BTreeMap<String, Tensor> = c.program.inputs.iter().map(|i| i.name.clone()).zip(drawn).collect();
        t.get_mut("lengths").unwrap().data = vec![300.0, 123.0, 2.0];
        let want = eval(&hand, &t).remove("o").unwrap();
        let got = eval(&c, &t).remove("o").unwrap();
        assert!(want.data.iter().any(|x| *x != 0.0), "{arg}: all zero");
        assert_close(&got, &want, 1e-12, arg);
        let (_, dims) = bind::bind_inputs(&c.program, t.clone(), &BTreeSet::new()).unwrap();
        let on = gpu.run(&plan::plan(&c.program, &dims), &t).unwrap().0.remove(0);
        assert_close(&on, &want, 1e-4, &format!("{arg} on the kernels"));
        assert_each(&on, &want, 1e-4, &format!("{arg} on the kernels"));
    }
}

/// Split-KV decoding (`Plan::split_kv`): chunks of keys on the grid's z,
/// merged by a combine launch, on both kernels that run it (the CPU
/// drivers' and, by register tiles, CUDA's) against the interpreter, f32
/// (1e-4) and f16 (FlashAttention's rule: the partial rows keep f32's
/// precision in two parts); with lengths, windows, GQA, unequal tiles.
#[test]
fn split_kv_decoding_matches_the_interpreter() {
    use attnc_compiler::plan::{Dtype, KernelSpec};
    let gpu = needs_wgpu();
    let tiled = needs_wgpu().with_register_tiles();
    let grid = grid();
    for (n, c) in [&grid[0], &grid[1], &grid[2], &grid[6], &grid[7], &grid[9]].into_iter().enumerate() {
        let compiled = compile_stdlib("kvcache", &c.sets());
        let t = inputs(c, 700 + n as u64);
        let (tensors, dims) = bind::bind_inputs(&compiled.program, t.clone(), &BTreeSet::new()).unwrap();
        let want = interp::evaluate(&compiled.program, &tensors, &dims).remove(0);
        let plan = plan::plan(&compiled.program, &dims).split_kv(64);
        let splits = plan.launches.iter().find_map(|l| match &l.spec {
            KernelSpec::Attention { kv: Some(kv), .. } => Some(kv.splits),
            _ => None,
        });
        let splits = splits.unwrap_or_else(|| panic!("{c:?}: not split"));
        assert!(splits >= 2 && plan.launches.iter().any(|l| matches!(l.spec, KernelSpec::Combine { .. })));
        for (dev, what) in [(&gpu, "cpu tiles"), (&tiled, "register tiles")] {
            let got = dev.run(&plan, &t).unwrap().0.remove(0);
            let label = format!("{c:?} split {splits} ways, {what}");
            assert_close(&got, &want, 1e-4, &label);
            assert_each(&got, &want, 1e-4, &label);
        }
        if n % 2 == 0 {
            // Queries ×6: sharper softmaxes, log-sum-exps near 40.
            let mut t = t.clone();
            t.get_mut("q").unwrap().data.iter_mut().for_each(|x| *x *= 6.0);
            let (tensors, _) = bind::bind_inputs(&compiled.program, t.clone(), &BTreeSet::new()).unwrap();
            let want = interp::evaluate(&compiled.program, &tensors, &dims).remove(0);
            let half = plan.clone().in_dtype(Dtype::F16);
            let same = interp::evaluate_planned(&compiled.program, &half, &tensors).remove(0);
            let got = gpu.run(&half, &t).unwrap().0.remove(0);
            half_rule(&got.data, &want.data, &same.data, Dtype::F16)
                .unwrap_or_else(|e| panic!("{c:?} split in f16: {e}"));
        }
    }
}

/// `attnc compile` of a decode step (B = 1, H = 8, M = 1, N = 32768,
/// d = 128, bf16, CUDA) splits its keys for an H200 by default: at least 128
/// attention cubes and a combine launch; `--compute-units 0` does not split.
#[test]
fn a_cuda_decode_step_fills_an_h200() {
    let dir = std::env::temp_dir().join(format!("attnc-decode-{}", std::process::id()));
    let cubes = |units: &[&str]| {
        let out = dir.join(units.join("-"));
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_attnc"))
            .args(["compile", "stdlib/kvcache.attn", "--target", "cuda", "--dtype", "bf16", "--out"])
            .arg(&out)
            .args(["--set", "B=1", "--set", "H=8", "--set", "M=1", "--set", "N=32768", "--set", "d=128"])
            .args(units)
            .env("ATTNC_CUDA_TOOLS", "/nonexistent")
            .current_dir(root())
            .output()
            .unwrap();
        assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
        let manifest = manifest_in(&out);
        let launches = manifest["launches"].as_array().unwrap().clone();
        let count =
            |l: &serde_json::Value| l["grid"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).product::<u64>();
        let attention: u64 =
            launches.iter().filter(|l| l["entry"].as_str().unwrap().ends_with("attention")).map(count).sum();
        let combine = launches.iter().any(|l| l["entry"].as_str().unwrap().ends_with("combine"));
        (attention, combine)
    };
    let (split, combined) = cubes(&[]);
    assert!(split >= 128 && combined, "{split} attention cubes, combine launch: {combined}");
    assert_eq!(cubes(&["--compute-units", "0"]), (8, false));
}

/// `attnc run --compute-units` plans split-KV decoding on wgpu: the split
/// run differs from the unsplit one in its rounding only (relative 1e-5).
#[test]
fn run_splits_with_compute_units() {
    let dir = std::env::temp_dir().join(format!("attnc-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |units: &str| {
        let out = dir.join(format!("o{units}.safetensors"));
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_attnc"))
            .args(["run", "stdlib/kvcache.attn", "--seed", "2", "--backend", "wgpu", "--compute-units", units])
            .args(["--set", "B=2", "--set", "H=4", "--set", "d=64", "--set", "M=37", "--set", "N=3001"])
            .args(["--set", "window_left=700", "--out"])
            .arg(&out)
            .current_dir(root())
            .output()
            .unwrap();
        assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
        attnc_runtime::io::read_tensors(&out, &Default::default()).unwrap().remove("o").unwrap()
    };
    let (split, whole) = (run("64"), run("0"));
    assert_ne!(split.data, whole.data, "--compute-units 64 splits (12 chunks of 256 keys), so its rounding differs");
    assert_close(&split, &whole, 1e-5, "split against unsplit");
}

/// With head mixing inside attention, whose kernels take keys in sequence
/// order, a paged cache is gathered by its own launch (`KernelSpec::Paged`):
/// that path on wgpu against the interpreter.
#[test]
fn paged_caches_under_head_mixing_are_gathered() {
    let text = "spec g\ndim B = 2\ndim NB = 9\ndim PS = 16\ndim MP = 4\ninput q: [B, 4, 3, 16]\n\
        input k_cache: [NB, PS, 2, 16]\ninput v_cache: [NB, PS, 2, 16]\ninput pages: [B, MP] in integers(0, NB - 1)\n\
        input lengths: [B] in integers(0, MP * PS)\ninput wl: [4, 4]\n\
        output o = attention(q, k_cache, v_cache, pages = pages, lengths = lengths, mask = causal, mix_logits = wl)\n";
    let c = attnc_compiler::compile(text, &[]).unwrap_or_else(|d| panic!("{d:?}"));
    let (drawn, dims) = bind::generate_inputs(&c.program, 5).unwrap();
    let t: BTreeMap<String, Tensor> = c.program.inputs.iter().map(|i| i.name.clone()).zip(drawn).collect();
    let want = eval(&c, &t).remove("o").unwrap();
    let plan = plan::plan(&c.program, &dims);
    let kinds: Vec<&str> = plan.launches.iter().map(|l| l.spec.kind()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "paged").count(), 2, "{kinds:?}");
    let got = needs_wgpu().run(&plan, &t).unwrap().0.remove(0);
    assert!(want.data.iter().any(|x| *x != 0.0));
    assert_close(&got, &want, 1e-4, "paged under head mixing");
    assert_each(&got, &want, 1e-4, "paged under head mixing");
}
