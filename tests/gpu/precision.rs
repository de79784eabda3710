//! TF32, half precision and matrix fragments (in software here): GEMMs and
//! attention forward and backward, and the half-precision rule's need for
//! the same-dtype reference.

use super::*;

/// TF32 (`--dtype tf32`): f32 tensors whose GEMMs multiply 16×16×8
/// fragments, two per 16 of `k`. wgpu refuses it; with the fragments in
/// software (f32 products) lavapipe checks every copy, fragment step and
/// epilogue, mixing ones included, against the interpreter at f32's
/// tolerance, and within FlashAttention's rule against the reference whose
/// GEMM operands are rounded to TF32. Attention's forward stays the scalar
/// f32 kernel (its backward: [`tf32_attention_backward_on_fragments_matches_the_interpreter`]).
#[test]
pub(crate) fn tf32_gemms_on_fragments_match_the_interpreter() {
    let gpu = needs_wgpu();
    let refused = gpu.supports(Dtype::Tf32).expect_err("wgpu has no TF32 matrix products").to_string();
    assert!(refused.contains("cannot run tf32 kernels") && refused.contains("--dtype f32"), "{refused}");
    let dev = Dev { gpu: gpu.with_software_fragments(), dtype: Dtype::Tf32 };
    let mut cases: Vec<attnc_compiler::Compiled> =
        [("[700, 37]", "[37, 45]"), ("[1030, 64]", "[64, 264]"), ("[3, 5]", "[5, 7]")]
            .iter()
            .map(|(a, b)| {
                attnc_compiler::compile(&format!("spec g\ninput a: {a}\ninput b: {b}\noutput y = a @ b\n"), &[])
                    .unwrap()
            })
            .collect();
    cases.push(compile_stdlib("iha", &sets(&[("H", "4"), ("P", "3"), ("d", "16"), ("N", "70"), ("B", "2")])));
    cases.push(compile_stdlib("mha", &sets(&[("H", "3"), ("d", "40"), ("N", "150")])));
    // `b` read in place and products kept for an epilogue's contraction:
    // on fragments in f16 (`gemms_on_fragments_match_the_interpreter_on_wgpu_f16`),
    // the same kernel whose operands TF32 rounds on staging, as every case
    // here does.
    for c in &cases {
        let name = &c.program.name;
        let inputs = seeded(c, 8);
        let (tensors, dims) = bind::bind_inputs(&c.program, inputs.clone(), &Default::default()).unwrap();
        let want = interp::evaluate(&c.program, &tensors, &dims);
        let same = dev.same(&c.program, &tensors, &dims).unwrap();
        let p = dev.plan(&c.program, &dims);
        let gemms = p.launches.iter().filter(|l| matches!(l.spec, plan::KernelSpec::MatMul { .. }));
        assert!(
            gemms.clone().count() > 0 && gemms.clone().all(|l| l.spec.fragments()),
            "{name}: GEMMs not on fragments"
        );
        let (got, _) = dev.run(&p, &inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
        for ((g, w), r) in got.iter().zip(&want).zip(&same) {
            check_close(Dtype::F32, &g.data, &w.data, None, &format!("{name} (tf32 in software)"));
            check_close(Dtype::Tf32, &g.data, &w.data, Some(&r.data), &format!("{name} (tf32)"));
        }
        // The reference's TF32 operands make a difference, so it is not the f32 one.
        let e = attnc_runtime::relative_error(&same[0].data, &want[0].data);
        assert!(e > 1e-5 && e < 5e-3, "{name}: TF32 reference's relative error {e:e}");
    }
}

/// TF32 attention's backward on matrix fragments (`--dtype tf32`, heads up
/// to 64: f32 storage fills the fragment kernels' shared memory at half the
/// 16-bit width), the fragments in software: dQ and dK/dV in cubes of 64
/// rows (heads up to 16) and of one plane of 32, past several tiles each
/// way, with masks, windows, blocks, GQA, unequal lengths and widths that
/// are not multiples of 16, within FlashAttention's rule against the
/// reference whose backward reads TF32 operands. The forward stays the f32
/// kernel.
#[test]
pub(crate) fn tf32_attention_backward_on_fragments_matches_the_interpreter() {
    let gpu = needs_wgpu();
    let dev = Dev { gpu: gpu.with_software_fragments(), dtype: Dtype::Tf32 };
    let s = |h, hk, m, n, d, mask, window, block| Sized { h, hk, m, n, d, mask, window, block };
    let on_fragments = |p: &Plan, kind: &str| {
        let l: Vec<_> = p.launches.iter().filter(|l| l.spec.kind() == kind).collect();
        let tf32 = |l: &&plan::Launch| matches!(l.spec, plan::KernelSpec::AttentionGrad { tf32: true, .. });
        !l.is_empty() && l.iter().all(|l| l.spec.fragments() && tf32(l))
    };
    let backward = [
        s(2, 1, 300, 1000, 64, "causal", None, 1),
        s(1, 1, 1100, 700, 32, "none", Some(100), 1),
        s(1, 1, 92, 260, 6, "token_causal", Some(3), 4),
    ];
    for c in &backward {
        let grad = attnc_compiler::grad::differentiate(&sized_spec(c).program, &[]).unwrap();
        let p = dev.plan(&grad, &bind::default_dims(&grad).unwrap());
        for kind in ["attention_grad_q", "attention_grad_kv"] {
            assert!(on_fragments(&p, kind), "d = {}: {kind} not tiled for TF32 fragments", c.d);
        }
        let forward = p.launches.iter().filter(|l| l.spec.kind() == "attention");
        assert!(forward.clone().count() == 1 && forward.clone().all(|l| !l.spec.fragments()), "d = {}", c.d);
        let units = if c.d > 16 { 32 } else { plan::ATTN_ROWS };
        let grads = p.launches.iter().filter(|l| matches!(l.spec, plan::KernelSpec::AttentionGrad { .. }));
        assert!(grads.clone().all(|l| l.spec.attention_tiles().units() == units), "d = {}: cube size", c.d);
    }
    for c in &backward {
        let start = std::time::Instant::now();
        attention_gradient_cases(&dev, std::slice::from_ref(c));
        eprintln!("  gradients at M={} N={} d={}: {:.1} s", c.m, c.n, c.d, start.elapsed().as_secs_f64());
    }
    // Past 64 wide, f32 storage does not fit: the scalar kernels.
    let wide =
        attnc_compiler::grad::differentiate(&sized_spec(&s(1, 1, 40, 40, 80, "causal", None, 1)).program, &[]).unwrap();
    let p = dev.plan(&wide, &bind::default_dims(&wide).unwrap());
    let attention = p.launches.iter().filter(|l| l.spec.kind().starts_with("attention"));
    assert!(attention.clone().count() == 3 && attention.clone().all(|l| !l.spec.fragments()), "d = 80 on fragments");
}

/// Attention on matrix fragments (`mma.rs`; half precision, heads up to
/// 128 wide), with the fragments computed in software: the size tier's
/// shapes that fit (every mask, windows, blocks, GQA and MQA, unequal
/// lengths, head widths that are not multiples of 16, read in vectors of 4,
/// 2 and 1) and whole specs. Lavapipe runs the software fragments' barriers
/// slowly, so the lengths are a little shorter than the size tier's.
pub(crate) fn fragment_attention(make: Make, dtype: Dtype) {
    let dev = device(make, dtype).map(|g| g.with_software_fragments());
    let s = |h, hk, m, n, d, mask, window, block| Sized { h, hk, m, n, d, mask, window, block };
    let cases = [
        s(1, 1, 60, 33, 15, "none", None, 1),
        s(1, 1, 1100, 1100, 64, "causal", None, 1),
        s(2, 1, 700, 700, 128, "none", None, 1),
        s(1, 1, 400, 400, 30, "token_causal", None, 4),
        s(2, 2, 1, 1000, 64, "causal", None, 1),
        s(4, 1, 70, 900, 64, "causal", Some(300), 1),
        s(2, 2, 900, 300, 48, "causal", None, 1),
    ];
    for (i, c) in cases.iter().enumerate() {
        let spec = sized_spec(c);
        let dims = bind::default_dims(&spec.program).unwrap();
        let p = dev.plan(&spec.program, &dims);
        assert!(p.launches.iter().all(|l| l.spec.fragments()), "d = {}: not tiled for fragments", c.d);
        let start = std::time::Instant::now();
        run_sized(&dev, c, 300 + i as u64);
        eprintln!("  ({:.1} s)", start.elapsed().as_secs_f64());
    }
    // A whole spec: IHA's interleaved pseudo-heads and RoPE, optimized (its
    // mixing in the GEMMs' epilogues; one fragment kernel is seconds of
    // lavapipe's compile). MHA and IHA without RoPE on fragments:
    // `gemms_on_fragments_match_the_interpreter_on_wgpu_f16`.
    let c = compile_stdlib("iha", &sets(&[("H", "2"), ("P", "3"), ("d", "24"), ("N", "90"), ("rope", "100.0")]));
    check_spec(&dev, &c, &seeded(&c, 12), true, "iha on fragments, optimized");
}

/// FlashAttention's rule needs the same-dtype reference's rounding: f16
/// kernels (scalar and on fragments) pass against the rounded reference
/// and fail once its rounding is taken out (a reference rounded to f32
/// only), so the tolerance is the format's, not a loose constant.
pub(crate) fn half_rule_needs_rounding(make: Make, dtype: Dtype) {
    let c = compile_stdlib("mha", &sets(&[("H", "2"), ("d", "32"), ("N", "300")]));
    let inputs = seeded(&c, 17);
    let (tensors, dims) = bind::bind_inputs(&c.program, inputs.clone(), &Default::default()).unwrap();
    let want = &interp::evaluate(&c.program, &tensors, &dims)[0];
    let same = &same_reference(dtype, &c.program, &tensors, &dims)[0];
    let unrounded = &interp::evaluate_rounded(&c.program, &tensors, &dims, Dtype::F32)[0];
    for fragments in [false, true] {
        let dev = device(make, dtype).map(|g| if fragments { g.with_software_fragments() } else { g });
        let (got, _) = dev.run(&dev.plan(&c.program, &dims), &inputs).unwrap();
        let got = &got[0];
        let ok = half_rule(&got.data, &want.data, &same.data, dtype);
        assert!(ok.is_ok(), "fragments: {fragments}: {ok:?}");
        let bad = half_rule(&got.data, &want.data, &unrounded.data, dtype);
        assert!(bad.is_err(), "fragments: {fragments}: passes without the reference's rounding: {bad:?}");
        eprintln!("fragments: {fragments}: {} / without rounding: {}", ok.unwrap(), bad.unwrap_err());
    }
}

#[test]
pub(crate) fn half_precision_rule_fails_without_the_references_rounding() {
    half_rule_needs_rounding(wgpu, Dtype::F16);
}

/// GEMMs on matrix fragments in 16-bit storage (fragments in software).
/// An f32 plan never multiplies on fragments (`device::matrix_units`): the
/// f32 tests read tiles directly or staged, and TF32's fragments are
/// [`tf32_gemms_on_fragments_match_the_interpreter`]'s.
#[test]
pub(crate) fn gemms_on_fragments_match_the_interpreter_on_wgpu_f16() {
    gemms(wgpu, Dtype::F16, Gemms::Fragments);
}

#[test]
pub(crate) fn fragment_attention_matches_the_interpreter_on_wgpu_f16() {
    fragment_attention(wgpu, Dtype::F16);
}

/// Attention's backward on matrix fragments (`mma/flash_grad.rs`; 16-bit
/// heads up to 128 wide), the fragments computed in software: dQ, dK and dV
/// against the same-dtype reference past several tiles each way (query and
/// key rows past 64-row cubes and 16-row tiles, unequal lengths), with
/// masks, windows, blocks, GQA, and head widths that are not multiples of
/// 16 (zero-padded fragments) read in vectors of 4 and 2.
pub(crate) fn fragment_attention_gradients(make: Make, dtype: Dtype) {
    let dev = device(make, dtype).map(|g| g.with_software_fragments());
    let s = |h, hk, m, n, d, mask, window, block| Sized { h, hk, m, n, d, mask, window, block };
    let cases = [
        s(2, 1, 300, 1000, 64, "causal", None, 1),
        s(1, 1, 92, 260, 6, "token_causal", Some(3), 4),
        // Past 64 wide: cubes of one plane of 32 rows (at d = 128 and
        // these lengths, within Mesa's loop bound with software's products).
        s(1, 1, 640, 1100, 128, "causal", None, 1),
        s(1, 1, 90, 70, 100, "none", Some(20), 1),
    ];
    for c in &cases {
        let spec = sized_spec(c);
        let grad = attnc_compiler::grad::differentiate(&spec.program, &[]).unwrap();
        let dims = bind::default_dims(&grad).unwrap();
        let p = dev.plan(&grad, &dims);
        let backward = p.launches.iter().filter(|l| matches!(l.spec, plan::KernelSpec::AttentionGrad { .. }));
        assert!(backward.clone().count() == 2, "d = {}: {} backward launches", c.d, backward.count());
        assert!(backward.clone().all(|l| l.spec.fragments()), "d = {}: backward not tiled for fragments", c.d);
        let units = if c.d > 64 { 32 } else { plan::ATTN_ROWS };
        assert!(backward.clone().all(|l| l.spec.attention_tiles().units() == units), "d = {}: cube size", c.d);
    }
    attention_gradient_cases(&dev, &cases);
    // Software's products loop over each fragment's depth: at 1500 keys and
    // 1030 queries, past Mesa's loop bound, where the refusal must come
    // before anything runs (lavapipe leaves the loops past it and dQ and dK
    // came out wrong); elsewhere the size runs and is right.
    let long = s(1, 1, 1030, 1500, 128, "causal", None, 1);
    if dev.bounds_loops() {
        let grad = attnc_compiler::grad::differentiate(&sized_spec(&long).program, &[]).unwrap();
        let p = dev.plan(&grad, &bind::default_dims(&grad).unwrap());
        let e = dev.check(&p).expect_err("a fragment backward past Mesa's loop bound is refused");
        assert!(e.to_string().contains("attention_grad") && e.to_string().contains("loop iterations"), "{e}");
    } else {
        attention_gradient_cases(&dev, &[long]);
    }
}

#[test]
pub(crate) fn fragment_attention_gradients_match_the_interpreter_on_wgpu_f16() {
    fragment_attention_gradients(wgpu, Dtype::F16);
}
