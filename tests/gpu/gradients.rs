//! Gradient programs on the kernels: attention's backward at real sizes, in
//! 16 bits and tiled within the register file, head mixing's, the
//! estimators', and the backward's memory.

use super::*;

/// Attention's gradient program (`grad.rs`: the log-sum-exp pass and the
/// dQ, dK and dV kernels) at the sizes users run: several query and key
/// tiles, unequal lengths (more keys than queries, and more queries than
/// keys so that rows see no key), GQA and MQA accumulation, every mask,
/// windows, blocks, d from 24 to 256. Every gradient within `TOL` of the
/// float64 interpreter, and bit-identical on a second run.
pub(crate) fn attention_gradients(dev: &Dev) {
    attention_gradients_in(dev, &[]);
}

/// [`attention_gradients`]' cases and `more`.
pub(crate) fn attention_gradients_in(dev: &Dev, more: &[Sized]) {
    let s = |h, hk, m, n, d, mask, window, block| Sized { h, hk, m, n, d, mask, window, block };
    let cases: Vec<Sized> = [
        s(2, 1, 300, 1000, 64, "causal", None, 1),
        s(1, 1, 1100, 1100, 32, "none", Some(100), 1),
        s(2, 2, 70, 45, 256, "causal", None, 1),
        s(3, 1, 200, 200, 24, "token_causal", Some(5), 4),
        s(2, 1, 130, 130, 40, "none", None, 1),
        // Windows against more keys than queries: the bands of tiles the
        // backward walks (`key_tiles`, `query_tiles`) at every mask's edges.
        s(2, 1, 150, 400, 16, "causal", Some(30), 1),
        s(1, 1, 92, 260, 8, "token_causal", Some(3), 4),
        s(1, 1, 100, 332, 8, "none", Some(2), 4),
    ]
    .into_iter()
    .chain(more.iter().cloned())
    .collect();
    attention_gradient_cases(dev, &cases);
}

/// Every gradient of attention at each size within the device dtype's
/// tolerance of the interpreter, and bit-identical on a second run.
pub(crate) fn attention_gradient_cases(dev: &Dev, cases: &[Sized]) {
    for (i, c) in cases.iter().enumerate() {
        let spec = sized_spec(c);
        let grad = attnc_compiler::grad::differentiate(&spec.program, &[]).unwrap();
        let (mut tensors, dims) = bind::generate_inputs(&grad, 40 + i as u64).unwrap();
        // Logits of a few units, so the softmax is neither flat nor one-hot.
        tensors[0].data.iter_mut().for_each(|v| *v *= 2.0);
        let what = format!(
            "gradients of attention H={} H_kv={} M={} N={} d={} mask={} window={:?} block={}",
            c.h, c.hk, c.m, c.n, c.d, c.mask, c.window, c.block
        );
        // The forward writes the log-sum-exp; dK and dV share one launch.
        let kinds = ["attention", "attention_grad_q", "attention_grad_kv"];
        check_gradients(dev, &grad, &tensors, &dims, &kinds, &what);
        let plan = dev.plan(&grad, &dims);
        let kinds: Vec<&str> = plan.launches.iter().map(|l| l.spec.kind()).collect();
        assert!(
            !kinds.iter().any(|k| ["attention_lse", "attention_grad_k", "attention_grad_v"].contains(k)),
            "{what}: {kinds:?}"
        );
    }
}

/// Runs gradient program `grad` on the device: its plan has launches of
/// every one of `kinds`, every output is within the dtype's tolerance of the
/// interpreter (and not all zeros there), and a second run is bit-identical.
pub(crate) fn check_gradients(
    dev: &Dev,
    grad: &Program,
    tensors: &[Tensor],
    dims: &DimValues,
    kinds: &[&str],
    what: &str,
) {
    let inputs: BTreeMap<String, Tensor> =
        grad.inputs.iter().map(|i| i.name.clone()).zip(tensors.iter().cloned()).collect();
    let want = interp::evaluate(grad, tensors, dims);
    let plan = dev.plan(grad, dims);
    let planned: Vec<&str> = plan.launches.iter().map(|l| l.spec.kind()).collect();
    for kind in kinds {
        assert!(planned.contains(kind), "{what}: no {kind} launch in {planned:?}");
    }
    let (got, _) = dev.run(&plan, &inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
    let same = dev.same(grad, tensors, dims);
    for (n, ((name, _), (g, w))) in grad.outputs.iter().zip(got.iter().zip(&want)).enumerate() {
        assert_eq!(g.shape, w.shape, "{what}: {name}");
        assert!(w.data.iter().any(|v| *v != 0.0), "{what}: {name} is all zeros in the reference");
        let same = same.as_ref().map(|s| &s[n].data[..]);
        check_close(dev.dtype, &g.data, &w.data, same, &format!("{what}: {name}"));
    }
    let (again, _) = dev.run(&plan, &inputs).unwrap();
    for ((name, _), (a, b)) in grad.outputs.iter().zip(again.iter().zip(&got)) {
        let same = a.data.iter().zip(&b.data).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{what}: {name} differs between two runs");
    }
}

/// The backward's peak device memory is O(N·P·d): IHA's gradient program
/// at a size where the pseudo-token score matrix (N·P × N·P) outweighs
/// every input, cotangent and gradient stays below that matrix.
pub(crate) fn gradient_memory_is_linear(gpu: &Dev) {
    let c = compile_stdlib("iha", &sets(&[("H", "1"), ("P", "8"), ("d", "4"), ("N", "96"), ("mask", "flat_causal")]));
    let grad = attnc_compiler::grad::differentiate(&c.program, &[]).unwrap();
    let (tensors, dims) = bind::generate_inputs(&grad, 3).unwrap();
    let inputs: BTreeMap<String, Tensor> =
        grad.inputs.iter().map(|i| i.name.clone()).zip(tensors.iter().cloned()).collect();
    let (outputs, stats) = gpu.run(&gpu.plan(&grad, &dims), &inputs).unwrap();
    let (s, size) = (96 * 8, gpu.dtype.size() as u64);
    let score_bytes = (s * s) as u64 * size;
    let io = inputs.values().map(|t| t.len()).sum::<usize>() + outputs.iter().map(|t| t.len()).sum::<usize>();
    let io_bytes = size * io as u64;
    eprintln!("backward peak {} B, score matrix {score_bytes} B, inputs and outputs {io_bytes} B", stats.peak_bytes);
    assert!(score_bytes > 4 * io_bytes, "the size does not make the score matrix dominant");
    assert!(
        stats.peak_bytes < score_bytes / 2,
        "the backward's peak device memory {} B is not well below the score matrix's {score_bytes} B",
        stats.peak_bytes
    );
    assert!(stats.peak_bytes >= io_bytes, "the accounting misses inputs: {} < {io_bytes}", stats.peak_bytes);
}

#[test]
pub(crate) fn head_mixing_gradients_match_the_interpreter() {
    head_mixing_gradients(&device(wgpu, Dtype::F32));
}

#[test]
pub(crate) fn attention_gradients_match_the_interpreter_at_real_sizes() {
    attention_gradients(&device(wgpu, Dtype::F32));
}

/// The backward with 16-bit storage (loads convert, sums stay f32)
/// against the same-dtype reference: masks, GQA, unequal lengths, d = 256.
#[test]
pub(crate) fn half_attention_gradients_match_the_interpreter() {
    let s = |h, hk, m, n, d, mask, window, block| Sized { h, hk, m, n, d, mask, window, block };
    let cases = [
        s(2, 1, 300, 1000, 64, "causal", None, 1),
        s(3, 1, 200, 200, 24, "token_causal", Some(5), 4),
        s(2, 2, 70, 45, 256, "causal", None, 1),
        // The fragment tiling of heads past 64 (cubes of 32 rows) on the scalar kernel.
        s(1, 1, 150, 270, 128, "none", Some(60), 1),
        s(1, 1, 1030, 1500, 128, "causal", None, 1),
    ];
    attention_gradient_cases(&device(wgpu, Dtype::F16), &cases);
}

/// The backward tiled within a GPU's register file, as CUDA runs it
/// (`plan::choose_path`): rows shared by 1 to 8 lanes (as many as
/// the device's plane holds), each with an interleaved slice of the row's
/// channels, partial dot products summed by shuffles.
#[test]
pub(crate) fn register_tiled_attention_gradients_match_the_interpreter() {
    let dev = device(wgpu, Dtype::F32).map(|g| g.with_register_tiles());
    let s = |h, hk, m, n, d, mask, window, block| Sized { h, hk, m, n, d, mask, window, block };
    let more = [s(1, 1, 260, 700, 128, "causal", None, 1), s(2, 1, 333, 333, 96, "none", Some(40), 1)];
    // Every lane count of register tiling (`plan::choose_path`) that the plane allows is exercised.
    let plane = attnc_runtime::gpu::device::plane_width(dev.gpu.client().properties()) as usize;
    let mut widths = std::collections::BTreeSet::new();
    for d in [8, 16, 24, 32, 40, 64, 96, 128, 256] {
        let c = sized_spec(&s(1, 1, 64, 64, d, "none", None, 1));
        let grad = attnc_compiler::grad::differentiate(&c.program, &[]).unwrap();
        let dims = bind::default_dims(&grad).unwrap();
        let p = dev.plan(&grad, &dims);
        for l in &p.launches {
            if let plan::KernelSpec::AttentionGrad { .. } = l.spec {
                widths.insert(dev.gpu.tiled(&l.spec, p.dtype).attention_tiles().lanes);
            }
        }
    }
    let want: std::collections::BTreeSet<usize> = [1, 2, 4, 8].into_iter().filter(|w| *w <= plane).collect();
    assert_eq!(widths, want, "lane counts of the backward on a plane of {plane}");
    attention_gradients_in(&dev, &more);
}

/// The estimators' gradient programs (elementwise operations, reductions,
/// `where`, leave-one-out means, and `unsqueeze`, a layout) run on the
/// kernels and match the interpreter, at batch sizes past a group kernel's
/// tile and at odd group sizes; gradient programs with operations no kernel
/// computes yet (attention's) are refused by name before any work.
#[test]
pub(crate) fn estimator_gradients_run_on_kernels() {
    use attnc_runtime::pipeline::{Backend, Compiler};
    let cases: &[(&str, &[&str])] = &[
        ("grpo", &["B=300", "G=7"]),
        ("grpo", &["B=5", "G=33", "std=bessel"]),
        ("dr_grpo", &["B=257", "G=6"]),
        ("rloo", &["B=70", "G=3"]),
        ("gdpo", &["B=40", "G=9", "C=4"]),
    ];
    for (spec, sets) in cases {
        let program = Compiler::new(*spec, common::stdlib_source(spec)).settings(sets).unwrap().compile().unwrap();
        let bound = program.gradient(&[]).unwrap().program().seeded(11).unwrap();
        let want = bound.run(Backend::Interp).unwrap();
        let got = bound.run_on(&needs_wgpu()).unwrap_or_else(|e| panic!("{spec} {sets:?}: {e}"));
        for (name, w) in &want {
            let g = &got[name];
            assert!(g.data.iter().all(|v| !v.is_nan()), "{spec} {name}: NaN");
            let e = attnc_runtime::relative_error(&g.data, &w.data);
            assert!(e <= TOL, "{spec} {sets:?} {name}: relative error {e:e}");
        }
    }
}

/// Attention's gradient programs run on the kernels (the log-sum-exp pass,
/// FlashAttention-2's dQ and dK/dV kernels, the mixing and collapse
/// gradients as contractions, weight gradients as GEMMs over transposed
/// operands) and match the float64 interpreter within `TOL`, for every
/// stdlib attention spec and input (`alpha_*` and `r` included), past
/// several tiles of rows and keys, with each mask, a window, RoPE, both
/// collapses, P ∈ {1, 2, 3, 5} and GQA/MQA sharing.
#[test]
pub(crate) fn attention_gradients_run_on_kernels() {
    use attnc_runtime::pipeline::{Backend, Compiler};
    let cases: &[(&str, &[&str])] = &[
        ("mha", &["N=150", "H=2", "d=16"]),
        ("gqa", &["N=97", "H=4", "H_kv=2", "d=8", "window=10"]),
        ("mqa", &["N=70", "H=3", "d=12", "mask=none"]),
        ("iha", &["N=75", "H=2", "P=2", "d=8"]),
        ("iha", &["N=40", "H=2", "P=3", "d=8", "mask=token_causal", "collapse=per_head"]),
        ("iha", &["N=33", "H=3", "P=1", "d=4", "mask=none", "window=4"]),
        ("iha", &["N=26", "H=2", "P=5", "d=8", "rope=10000.0", "window=3"]),
    ];
    for (spec, sets) in cases {
        let program = Compiler::new(*spec, common::stdlib_source(spec)).settings(sets).unwrap().compile().unwrap();
        let bound = program.gradient(&[]).unwrap().program().seeded(5).unwrap();
        let want = bound.run(Backend::Interp).unwrap();
        let got = bound.run_on(&needs_wgpu()).unwrap_or_else(|e| panic!("{spec} {sets:?}: {e}"));
        assert!(want.keys().any(|n| n.starts_with("grad_")), "{spec}: no gradients");
        for (name, w) in &want {
            let g = &got[name];
            assert!(g.data.iter().all(|v| !v.is_nan()), "{spec} {name}: NaN");
            let e = attnc_runtime::relative_error(&g.data, &w.data);
            assert!(e <= TOL, "{spec} {sets:?} {name}: relative error {e:e}");
        }
    }
}

/// A training step in two halves (`Gradient::training`): the forward's
/// kernels also return the residuals (q, k, v, o and the rows' log-sum-exp
/// for attention), the backward's run only the gradients' launches on them,
/// and the gradients match the float64 interpreter's gradient program
/// within `TOL`, past several tiles of rows and keys.
#[test]
pub(crate) fn training_halves_run_on_kernels() {
    use attnc_runtime::pipeline::{Backend, Compiler};
    let cases: &[(&str, &[&str])] = &[
        ("mha", &["N=1000", "H=2", "d=16", "B=2"]),
        ("iha", &["N=150", "H=2", "P=2", "d=8", "window=40"]),
        ("talking_heads", &["N=90", "H=4", "H_kv=2", "d=8"]),
        ("alibi", &["N=130", "M=70", "H=2", "d=8"]),
        ("grpo", &["B=40", "G=9"]),
    ];
    for (spec, sets) in cases {
        let program = Compiler::new(*spec, common::stdlib_source(spec)).settings(sets).unwrap().compile().unwrap();
        let gradient = program.gradient(&[]).unwrap();
        let whole = gradient.seeded(21, None).unwrap();
        let want = whole.run(Backend::Interp).unwrap();
        let training = gradient.training();
        let forward_inputs = program.ir().inputs.iter().map(|i| (i.name.clone(), whole.inputs()[&i.name].clone()));
        let forward = training.forward.bind(forward_inputs.collect()).unwrap();
        let outputs = forward.run_on(&needs_wgpu()).unwrap_or_else(|e| panic!("{spec} {sets:?}: forward: {e}"));
        let mut given = whole.inputs().clone();
        given.extend(training.saved.iter().map(|n| (n.clone(), outputs[n].clone())));
        let backward = training.backward.bind(given).unwrap();
        let got = backward.run_on(&needs_wgpu()).unwrap_or_else(|e| panic!("{spec} {sets:?}: backward: {e}"));
        let results = program.ir().outputs.iter().map(|(n, _)| (n, &outputs[n])).chain(got.iter());
        let mut checked = 0;
        for (name, g) in results {
            assert!(g.data.iter().all(|v| !v.is_nan()), "{spec} {name}: NaN");
            let e = attnc_runtime::relative_error(&g.data, &want[name].data);
            assert!(e <= TOL, "{spec} {sets:?} {name}: relative error {e:e}");
            checked += 1;
        }
        assert_eq!(checked, want.len(), "{spec}: every output and gradient");
        let launches =
            |b: &attnc_runtime::pipeline::Bound| b.plan().launches.iter().map(|l| l.spec.kind()).collect::<Vec<_>>();
        let (all, back) = (launches(&whole), launches(&backward));
        let fwd = launches(&forward);
        assert!(back.len() < all.len(), "{spec}: backward {back:?} vs whole {all:?}");
        // No launch runs twice: the halves together launch at most what the
        // gradient program does (fewer where the backward fuses better).
        assert!(fwd.len() + back.len() <= all.len(), "{spec}: {fwd:?} + {back:?} vs {all:?}");
        assert!(!back.iter().any(|k| *k == "attention" || *k == "attention_lse"), "{spec}: {back:?}");
        eprintln!(
            "{spec} {sets:?}: launches: gradient program {}, forward {} + backward {}",
            all.len(),
            fwd.len(),
            back.len()
        );
    }
}
