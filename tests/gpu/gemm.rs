//! GEMMs staged or not, on fragments, reading `b` in place, keeping their
//! product; weights prepared once for many calls.

use super::*;

/// How a GEMM reads its tiles: directly (Mesa's CPU drivers), staged in
/// shared memory (the GPU path), or as matrix fragments (`mma.rs`).
#[derive(Clone, Copy)]
pub(crate) enum Gemms {
    Direct,
    Staged,
    Fragments,
}

/// GEMMs at sizes past several tiles in every dimension and at awkward ones
/// (odd widths read as single floats, `k` not a multiple of a stage), with
/// their tiles staged in shared memory (the GPU path; forced here), read
/// directly (Mesa's CPU drivers) or multiplied as matrix fragments (the
/// tensor-core kernels of `mma.rs`, fragments computed in software here):
/// plain products, batched `a`, and whole specs whose GEMMs read merged heads
/// and slices of a merged projection and mix heads in their epilogue.
pub(crate) fn gemms(make: Make, dtype: Dtype, mode: Gemms) {
    let shapes: &[(&str, &str, &str)] = &[
        ("[700, 37]", "[37, 45]", "odd widths"),
        ("[513, 260]", "[260, 96]", "k = 32 stages and a half"),
        ("[3, 5]", "[5, 7]", "smaller than one tile"),
        ("[1030, 64]", "[64, 264]", "several tiles of rows and columns"),
        ("[2, 300, 36]", "[36, 20]", "a batched operand"),
    ];
    let (staged, fragments) = match mode {
        Gemms::Direct => (false, false),
        Gemms::Staged => (true, false),
        Gemms::Fragments => (false, true),
    };
    // In 16-bit storage staged (the kernel is f32's, its loads converting)
    // and on fragments (each fragment kernel is seconds of lavapipe's
    // compile), a subset: the optimized whole specs, whose GEMMs read the
    // merged projections and mix heads in their epilogues, and one kept
    // product's gradient (the collapse over heads at B = 2).
    let subset = fragments || (staged && dtype != Dtype::F32);
    {
        let gpu = device(make, dtype).map(|g| {
            let g = g.with_gemm_staging(staged);
            if fragments {
                g.with_software_fragments()
            } else {
                g
            }
        });
        let staged = if fragments { "fragments".to_string() } else { staged.to_string() };
        for (a, b, what) in shapes {
            let src = format!("spec g\ninput a: {a}\ninput b: {b}\noutput y = a @ b\n");
            let c = attnc_compiler::compile(&src, &[]).unwrap();
            check_spec(&gpu, &c, &seeded(&c, 5), false, &format!("GEMM {a} @ {b} ({what}), staged: {staged}"));
        }
        // Constant factors the epilogue applies (and one it must not: a sum).
        for expr in ["(a @ b) * 0.5", "3.0 * (a @ b)", "(a @ b) / 4.0", "(a @ b) + 1.0"] {
            let src = format!("spec g\ninput a: [300, 36]\ninput b: [36, 20]\noutput y = {expr}\n");
            let c = attnc_compiler::compile(&src, &[]).unwrap();
            check_spec(&gpu, &c, &seeded(&c, 5), false, &format!("{expr}, staged: {staged}"));
        }
        // Addends the epilogue adds (several tiles, odd widths), and a
        // broadcast row it must not.
        for (a, b, expr) in [
            ("[1030, 64]", "[64, 264]", "a @ b + y"),
            ("[700, 37]", "[37, 45]", "y + a @ b"),
            ("[300, 36]", "[36, 20]", "a @ b + r"),
        ] {
            let (rows, f) = (&a[1..a.find(',').unwrap()], &b[b.find(',').unwrap() + 2..b.len() - 1]);
            let src = format!(
                "spec g\ninput a: {a}\ninput b: {b}\nweight y: [{rows}, {f}]\nweight r: [{f}]\noutput o = {expr}\n"
            );
            let c = attnc_compiler::compile(&src, &[]).unwrap();
            check_spec(&gpu, &c, &seeded(&c, 5), false, &format!("{a} {b}: {expr}, staged: {staged}"));
        }
        gemms_reading_b_in_place(&gpu, &staged);
        gemms_keeping_their_product(&gpu, &staged, if subset { 1 } else { 2 });
        let specs: Vec<(&str, Vec<(&'static str, String)>)> = vec![
            ("mha", sets(&[("H", "3"), ("d", "10"), ("N", "150")])),
            ("iha", sets(&[("H", "4"), ("P", "3"), ("d", "16"), ("N", "70"), ("B", "2")])),
            ("iha", sets(&[("H", "2"), ("P", "2"), ("d", "7"), ("N", "300"), ("collapse", "per_head")])),
        ];
        for (spec, s) in specs {
            let c = compile_stdlib(spec, &s);
            for optimize in [false, true].into_iter().filter(|o| *o || !subset) {
                let what = format!("{spec} {s:?} optimized: {optimize}, staged: {staged}");
                check_spec(&gpu, &c, &seeded(&c, 6), optimize, &what);
            }
        }
        // IHA mixes heads in its projections' epilogues, on fragments too.
        let c = compile_stdlib("iha", &sets(&[("H", "4"), ("P", "3"), ("d", "16"), ("N", "70"), ("B", "2")]));
        let dims = bind::default_dims(&c.program).unwrap();
        let p = gpu.plan(&c.program, &dims);
        let mixing = |l: &&plan::Launch| matches!(l.spec, plan::KernelSpec::MatMul { mix: Some(_), .. });
        assert!(p.launches.iter().filter(mixing).count() >= 3, "iha: projections not mixed in GEMM epilogues");
        assert!(p.launches.iter().filter(mixing).all(|l| l.spec.fragments()), "a mixing GEMM not on fragments");
    }
}

/// A GEMM's `b` read in place, in the gradient of `a @ w`: `dA = dY · wᵀ`
/// reads the weight transposed (blocks of `lanes` rows of `w`'s columns,
/// turned into row vectors in registers) and `dW = aᵀ · dY` reads `dY`; no
/// copy launch. At line sizes 4, 2 and 1, past several tiles and at odd
/// widths.
pub(crate) fn gemms_reading_b_in_place(dev: &Dev, path: &str) {
    for (a, w, lanes) in [
        ("[1030, 64]", "[64, 264]", 4),
        ("[300, 38]", "[38, 20]", 2),
        ("[70, 37]", "[37, 45]", 1),
        ("[3, 8]", "[8, 5]", 1),
    ] {
        let src = format!("spec g\nweight a: {a}\nweight w: {w}\noutput y = a @ w\n");
        let c = attnc_compiler::compile(&src, &[]).unwrap();
        let grad = attnc_compiler::grad::differentiate(&c.program, &[]).unwrap();
        let what = format!("gradient of {a} @ {w}, {path}");
        let names: Vec<&str> = grad.outputs.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"grad_a") && names.contains(&"grad_w"), "{what}: outputs {names:?}");
        let (tensors, dims) = bind::generate_inputs(&grad, 11).unwrap();
        let plan = dev.plan(&grad, &dims);
        let kinds: Vec<&str> = plan.launches.iter().map(|l| l.spec.kind()).collect();
        assert!(!kinds.contains(&"gather"), "{what}: a copy launch in {kinds:?}");
        let (rows, k) = (
            a[1..a.find(',').unwrap()].parse::<usize>().unwrap(),
            w[w.find(',').unwrap() + 2..w.len() - 1].parse::<usize>().unwrap(),
        );
        let da = plan
            .launches
            .iter()
            .find_map(|l| match &l.spec {
                plan::KernelSpec::MatMul { rows: r, k: kk, b_rows, b_cols, .. } if *r == rows && *kk == k => {
                    Some((l.spec.line_size(), plan::GemmB::of(b_rows, b_cols, l.spec.line_size()).unwrap()))
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("{what}: no GEMM for dA"));
        assert_eq!(da.0, lanes, "{what}: dA's line size");
        assert_eq!(da.1.transposed, lanes > 1, "{what}: dA reads w transposed");
        check_gradients(dev, &grad, &tensors, &dims, &["matmul"], &what);
    }
}

/// IHA's gradient program mixes its projections in the GEMMs' epilogue as
/// inference does, the GEMM also storing the product that the mixing
/// coefficients' gradients read (`MixEpilogue::keep`): one launch each
/// instead of a GEMM and a `mix_heads`. Both collapses, B = 2, odd sizes
/// (the first `cases` of them).
pub(crate) fn gemms_keeping_their_product(dev: &Dev, path: &str, cases: usize) {
    for s in [
        sets(&[("H", "4"), ("P", "3"), ("d", "16"), ("N", "70"), ("B", "2")]),
        sets(&[("H", "2"), ("P", "2"), ("d", "8"), ("N", "45"), ("collapse", "per_head")]),
    ]
    .iter()
    .take(cases)
    {
        iha_keeping_products(dev, s, 13, path);
    }
}

/// IHA's gradient at settings `s` (inputs drawn with `seed`): three GEMMs
/// keep their product, and every gradient matches the interpreter.
pub(crate) fn iha_keeping_products(dev: &Dev, s: &[(&'static str, String)], seed: u64, path: &str) {
    let c = compile_stdlib("iha", s);
    let grad = attnc_compiler::grad::differentiate(&c.program, &[]).unwrap();
    let (tensors, dims) = bind::generate_inputs(&grad, seed).unwrap();
    let plan = dev.plan(&grad, &dims);
    let kept = |l: &&plan::Launch| {
        matches!(l.spec, plan::KernelSpec::MatMul { mix: Some(plan::MixEpilogue { keep: true, .. }), .. })
    };
    let what = format!("iha {s:?} gradient, {path}");
    assert_eq!(plan.launches.iter().filter(kept).count(), 3, "{what}: q, k and v not mixed in their GEMMs");
    check_gradients(dev, &grad, &tensors, &dims, &["matmul_mix", "contract"], &what);
}

/// [`gemms_keeping_their_product`] at a user's length: IHA's gradient at
/// N = 1030 (2060 pseudo-tokens, past many GEMM and attention tiles and no
/// multiple of any), its three kept products read by the coefficients'
/// gradients, against the interpreter on the device's default path.
#[test]
pub(crate) fn gemms_keeping_their_product_at_a_thousand_tokens() {
    let dev = device(wgpu, Dtype::F32);
    iha_keeping_products(&dev, &sets(&[("H", "2"), ("P", "2"), ("d", "32"), ("N", "1030")]), 17, "default path");
}

/// Weights prepared once serve many calls: the optimized MHA (projections
/// merged on concatenated weights, the concatenation prepared) and IHA with
/// per-head collapse (its block-diagonal prepared) run on fresh activations
/// each call against the same prepared weights, and every call matches the
/// interpreter on those inputs.
pub(crate) fn prepared_calls(gpu: &Dev) {
    let cases = [
        compile_stdlib("mha", &sets(&[("H", "4"), ("d", "16"), ("N", "90")])),
        compile_stdlib("iha", &sets(&[("H", "3"), ("P", "2"), ("d", "8"), ("N", "50"), ("collapse", "per_head")])),
    ];
    for c in &cases {
        let inputs = seeded(c, 30);
        let dims = bind::default_dims(&c.program).unwrap();
        let program = opt::optimize(&c.program, &dims, &Config::default()).chosen;
        let p = gpu.plan(&program, &dims);
        assert!(p.prepared() > 0, "{}: nothing to prepare", c.program.name);
        let prepared = gpu.prepare(&p, &inputs, None).unwrap();
        for call in 0..3u64 {
            let mut call_inputs = inputs.clone();
            let fresh = seeded(c, 100 + call);
            call_inputs.insert("x".into(), fresh["x"].clone());
            let (got, stats) = gpu.run_prepared(&p, &prepared, &call_inputs, None).unwrap();
            assert_eq!(stats.launches, p.launches.len(), "launches so far, preparation included once");
            let (tensors, dims) = bind::bind_inputs(&c.program, call_inputs, &Default::default()).unwrap();
            let want = interp::evaluate(&c.program, &tensors, &dims);
            let same = gpu.same(&c.program, &tensors, &dims);
            let what = format!("{} call {call}", c.program.name);
            check_close(gpu.dtype, &got[0].data, &want[0].data, same.as_ref().map(|s| &s[0].data[..]), &what);
        }
    }
}
