//! The forward kernels against the interpreter: every stdlib spec, the size
//! tier, register tiling, head mixing, plane widths, folded grids, the loop
//! limit, random configurations and linear memory.

use super::*;

/// Every stdlib spec, at sizes that are not multiples of any tile.
pub(crate) fn stdlib_specs(gpu: &Dev) {
    let attention = [("H", "3"), ("d", "6"), ("N", "37"), ("B", "2")];
    let cases: Vec<(&str, Vec<(&'static str, String)>)> = vec![
        ("mha", sets(&[("mask", "causal")])),
        ("mha", sets(&[("mask", "none"), ("window", "5")])),
        ("mha", sets(&[("H", "4"), ("H_kv", "2"), ("mask", "causal"), ("window", "3")])),
        ("gqa", sets(&[("H", "4")])),
        ("mqa", sets(&[])),
        ("iha", sets(&[("P", "3")])),
        (
            "iha",
            sets(&[
                ("P", "2"),
                ("mask", "token_causal"),
                ("window", "4"),
                ("collapse", "per_head"),
                ("rope", "10000.0"),
            ]),
        ),
        ("iha", sets(&[("P", "1"), ("mask", "none")])),
        ("grpo", sets(&[("B", "5"), ("G", "7")])),
        ("grpo", sets(&[("std", "bessel"), ("B", "3"), ("G", "2")])),
        ("dr_grpo", sets(&[("B", "5"), ("G", "7")])),
        ("rloo", sets(&[("B", "5"), ("G", "7")])),
        ("maxrl", sets(&[("B", "6"), ("G", "5")])),
        ("gdpo", sets(&[("B", "3"), ("G", "7"), ("C", "2")])),
        ("odrpo", sets(&[("B", "5"), ("G", "9")])),
        ("odrpo", sets(&[("base", "maxrl"), ("K", "7"), ("normalize_active", "true"), ("batch_norm", "true")])),
        ("odrpo", sets(&[("base", "mean"), ("K", "4"), ("weights", "[0.5, 1.0, 2.0]")])),
    ];
    for (spec, mut s) in cases {
        if ["mha", "gqa", "mqa", "iha"].contains(&spec) {
            for (k, v) in attention {
                if !s.iter().any(|(n, _)| *n == k) {
                    s.push((k, v.to_string()));
                }
            }
        }
        let c = compile_stdlib(spec, &s);
        let inputs = seeded(&c, 11);
        check_spec(gpu, &c, &inputs, false, &format!("{spec} {s:?}"));
        if spec == "iha" || spec == "mha" {
            check_spec(gpu, &c, &inputs, true, &format!("{spec} {s:?} optimized"));
        }
    }
}

/// One attention launch at a size users run: `h` query heads over `hk`
/// key/value heads, `m` queries against `n` keys (queries aligned to the
/// last keys), head width `d`.
#[derive(Clone)]
pub(crate) struct Sized {
    pub(crate) h: usize,
    pub(crate) hk: usize,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) d: usize,
    pub(crate) mask: &'static str,
    pub(crate) window: Option<usize>,
    pub(crate) block: usize,
}

pub(crate) fn sized_spec(c: &Sized) -> attnc_compiler::Compiled {
    let window = c.window.map_or("none".to_string(), |w| w.to_string());
    let source = format!(
        "spec sized\ninput q: [1, {h}, {m}, {d}]\ninput k: [1, {hk}, {n}, {d}]\ninput v: [1, {hk}, {n}, {d}]\n\
         output o = attention(q, k, v, mask = {mask}, window = {window}, block = {block})\n",
        h = c.h,
        hk = c.hk,
        m = c.m,
        n = c.n,
        d = c.d,
        mask = c.mask,
        block = c.block,
    );
    attnc_compiler::compile(&source, &[]).unwrap_or_else(|e| panic!("{}", attnc_compiler::render("sized", &source, &e)))
}

/// Every output row against the interpreter: a row that sees no key is
/// exactly 0; every other row, and the whole output, within `TOL` relative
/// error (f32) or FlashAttention's rule against the same-dtype reference `same`.
pub(crate) fn check_rows(dtype: Dtype, got: &Tensor, want: &Tensor, same: Option<&Tensor>, what: &str) {
    assert_eq!(got.shape, want.shape, "{what}: shape");
    let width = *want.shape.last().unwrap();
    let mut zero_rows = 0;
    let same_rows = |r: usize| same.map(|s| &s.data[r * width..][..width]);
    for (r, (g, w)) in got.data.chunks(width).zip(want.data.chunks(width)).enumerate() {
        assert!(g.iter().all(|v| v.is_finite()), "{what}: row {r} is not finite: {g:?}");
        if w.iter().all(|v| *v == 0.0) {
            assert!(g.iter().all(|v| *v == 0.0), "{what}: fully masked row {r} is {g:?}, not 0");
            zero_rows += 1;
            continue;
        }
        match same_rows(r) {
            // A row of a few elements is too small a sample for the rule's
            // maxima: each row within twice the reference's relative error
            // plus two unit roundoffs; the whole output below to the rule.
            Some(sr) => {
                let (e, re) = (attnc_runtime::relative_error(g, w), attnc_runtime::relative_error(sr, w));
                let bound = 2.0 * re + 2.0 * unit_roundoff(dtype);
                assert!(e <= bound, "{what} ({dtype}): row {r} relative error {e:e} > {bound:e}");
            }
            None => check_close(dtype, g, w, None, &format!("{what}: row {r}")),
        }
    }
    check_close(dtype, &got.data, &want.data, same.map(|s| &s.data[..]), what);
    let e = attnc_runtime::relative_error(&got.data, &want.data);
    eprintln!("{what} ({dtype}): relative error {e:.2e}, {zero_rows} fully masked rows");
}

pub(crate) fn run_sized(dev: &Dev, c: &Sized, seed: u64) {
    let spec = sized_spec(c);
    let mut rng = Rng::for_input(seed, "sized");
    let inputs = named(vec![
        ("q", random(&mut rng, &[1, c.h, c.m, c.d])),
        ("k", random(&mut rng, &[1, c.hk, c.n, c.d])),
        ("v", random(&mut rng, &[1, c.hk, c.n, c.d])),
    ]);
    // Logits of a few units, so the softmax is neither flat nor one-hot.
    let mut inputs = inputs;
    let q = inputs.get_mut("q").unwrap();
    q.data.iter_mut().for_each(|v| *v *= 3.0);
    let want = &eval(&spec, &inputs)["o"];
    let dims = bind::default_dims(&spec.program).unwrap();
    let ordered: Vec<Tensor> = ["q", "k", "v"].iter().map(|n| inputs[*n].clone()).collect();
    let same = dev.same(&spec.program, &ordered, &dims).map(|mut o| o.remove(0));
    let what = format!(
        "attention H={} H_kv={} M={} N={} d={} mask={} window={:?} block={}",
        c.h, c.hk, c.m, c.n, c.d, c.mask, c.window, c.block
    );
    let (got, _) = dev.run(&dev.plan(&spec.program, &dims), &inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
    check_rows(dev.dtype, &got[0], want, same.as_ref(), &what);
}

/// The size tier: attention at the sizes users run, every head width the
/// kernels specialise differently (vectors of 4, 2 and 1; key tiles of 4 to
/// 32), square and unequal lengths, GQA and MQA, every mask and window.
/// Before the tiled kernels, Mesa's CPU drivers cut every loop of the old
/// kernel short from N·d ≈ 30 000 and these rows came back wrong.
pub(crate) fn size_tier(gpu: &Dev) {
    let s = |h, hk, m, n, d, mask, window, block| Sized { h, hk, m, n, d, mask, window, block };
    let cases = [
        s(1, 1, 4096, 4096, 64, "causal", None, 1),
        s(2, 1, 1500, 1500, 128, "none", None, 1),
        s(1, 1, 1000, 1000, 256, "causal", Some(300), 1),
        s(1, 1, 777, 777, 8, "none", Some(100), 1),
        s(4, 2, 700, 700, 32, "causal", None, 1),
        s(1, 1, 612, 612, 40, "token_causal", Some(40), 3),
        s(1, 1, 900, 900, 59, "token_causal", None, 4),
        s(1, 1, 520, 520, 80, "none", None, 1),
        s(1, 1, 480, 480, 111, "causal", None, 1),
        s(2, 2, 1, 3000, 64, "causal", None, 1),
        s(4, 1, 70, 2500, 64, "causal", Some(500), 1),
        s(2, 2, 2100, 300, 48, "causal", None, 1),
        s(1, 1, 1200, 333, 16, "none", None, 1),
    ];
    for (i, c) in cases.iter().enumerate() {
        run_sized(gpu, c, 100 + i as u64);
    }
}

/// Attention tiled within a GPU's register file (what CUDA runs in f32,
/// tf32 and past the fragment kernel's heads: several lanes per query row,
/// `attention_split.rs`), forced on this device: every lanes-per-row width
/// (1, 2, 4, 8 for d = 8 … 256), vectors of 4 and 1, thousands of rows,
/// unequal lengths, GQA and MQA, every mask and window; and every stdlib spec
/// through its layouts (IHA's interleaved pseudo-heads).
pub(crate) fn register_tiles(make: Make, dtype: Dtype) {
    let dev = device(make, dtype).map(|g| g.with_register_tiles());
    let s = |h, hk, m, n, d, mask, window, block| Sized { h, hk, m, n, d, mask, window, block };
    let cases = [
        s(1, 1, 1536, 1536, 64, "causal", None, 1),
        s(2, 1, 700, 700, 128, "none", None, 1),
        s(1, 1, 400, 400, 256, "causal", Some(150), 1),
        s(1, 1, 777, 777, 8, "none", Some(100), 1),
        s(1, 1, 612, 612, 40, "token_causal", Some(40), 3),
        s(1, 1, 600, 600, 59, "token_causal", None, 4),
        s(2, 2, 1, 3000, 64, "causal", None, 1),
        s(4, 1, 70, 2500, 64, "causal", Some(500), 1),
        s(2, 2, 1200, 300, 48, "causal", None, 1),
        s(1, 1, 1200, 333, 16, "none", None, 1),
    ];
    for (i, c) in cases.iter().enumerate() {
        run_sized(&dev, c, 300 + i as u64);
    }
    stdlib_specs(&dev);
}

/// The reproduction and IHA at real sizes: P up to 8, both
/// collapses, RoPE, through the whole spec (projections, mixing, collapse).
pub(crate) fn stdlib_at_real_sizes(gpu: &Dev) {
    let cases: Vec<(&str, Vec<(&'static str, String)>)> = vec![
        ("mha", sets(&[("H", "1"), ("d", "64"), ("N", "480")])),
        ("gqa", sets(&[("H", "4"), ("d", "32"), ("N", "600")])),
        ("iha", sets(&[("H", "2"), ("P", "8"), ("d", "32"), ("N", "160"), ("rope", "10000.0")])),
        (
            "iha",
            sets(&[
                ("H", "2"),
                ("P", "4"),
                ("d", "40"),
                ("N", "300"),
                ("mask", "token_causal"),
                ("window", "64"),
                ("collapse", "per_head"),
            ]),
        ),
    ];
    for (spec, s) in cases {
        let c = compile_stdlib(spec, &s);
        let inputs = seeded(&c, 21);
        check_spec(gpu, &c, &inputs, true, &format!("{spec} {s:?} optimized"));
    }
}

/// Head mixing inside attention (docs/semantics.md §7) on its fused
/// kernels, past several cubes and key tiles in each direction: masks and
/// windows, unequal lengths both ways (the first rows of a causal mask see
/// nothing), GQA on keys and values, rectangular matrices, either matrix
/// alone, wide values, a score function with a per-head mask function, odd
/// widths, a head of 256 over a thousand keys; and the stdlib's Talking-Heads and
/// Differential layers, optimized. The forward runs on the device's kernel
/// (on Mesa's CPU drivers `attention_mixed_tiled`, also on narrower planes)
/// and, in f32, on the GPU kernel (`attention_mixed`, forced by staging).
pub(crate) fn head_mixing(make: Make, dtype: Dtype) {
    let core = mixing_core;
    let both = "mix_logits = wl, mix_probs = wp";
    let specs = [
        core([4, 4, 4, 4, 4], [32, 32, 150, 150, 1], &format!("mask = causal, {both}")),
        core([4, 2, 4, 4, 2], [24, 24, 40, 200, 2], &format!("mask = none, window = 40, {both}")),
        core([3, 1, 5, 2, 1], [16, 40, 77, 77, 1], &format!("mask = causal, {both}")),
        core([4, 4, 4, 4, 4], [16, 16, 90, 50, 1], "mask = causal, mix_logits = wl"),
        core([4, 4, 4, 2, 2], [64, 128, 70, 70, 1], "mask = causal, mix_probs = wp"),
        core(
            [2, 2, 3, 2, 2],
            [32, 32, 100, 100, 1],
            &format!(
                "mask = |b, h, i, j| abs(i - j) <= 8 * (h + 1), score = |s, b, h, i, j| 2.0 * tanh(s / 2.0), {both}"
            ),
        ),
        // Odd widths: rows bound as scalars on the CPU kernel (vectors of 1).
        core([2, 2, 3, 2, 2], [6, 5, 70, 45, 2], &format!("mask = causal, {both}")),
        core([2, 1, 3, 2, 1], [256, 48, 203, 1100, 1], &format!("mask = causal, window = 700, {both}")),
    ];
    let dev = device(make, dtype);
    // In 16-bit storage, a subset (the kernel is the same; lavapipe's time is not).
    let half = dtype != Dtype::F32;
    let gpu_kernel = (!half).then(|| device(make, dtype).map(|g| g.with_gemm_staging(true)));
    for (i, src) in specs.iter().enumerate().filter(|(i, _)| !half || [0, 2, 5].contains(i)) {
        let c = attnc_compiler::compile(src, &[]).unwrap_or_else(|d| panic!("{src}: {d:?}"));
        let inputs = seeded(&c, 30 + i as u64);
        check_spec(&dev, &c, &inputs, false, src);
        // The GPU kernel, but for the widest head (lavapipe's time).
        if let Some(g) = gpu_kernel.as_ref().filter(|_| i + 1 < specs.len()) {
            check_spec(g, &c, &inputs, false, &format!("{src} on the GPU kernel"));
        }
    }
    for w in [2, 4] {
        let c = attnc_compiler::compile(&specs[0], &[]).unwrap();
        let g = device(make, dtype).map(|g| g.with_plane_width(w));
        check_spec(&g, &c, &seeded(&c, 36), false, &format!("{} at plane width {w}", specs[0]));
    }
    for (spec, s) in [
        ("talking_heads", sets(&[("H", "4"), ("d", "32"), ("N", "120")])),
        ("diff", sets(&[("H", "2"), ("d", "32"), ("N", "100")])),
    ]
    .into_iter()
    .take(if half { 1 } else { 2 })
    {
        let c = compile_stdlib(spec, &s);
        check_spec(&dev, &c, &seeded(&c, 40), true, &format!("{spec} {s:?}"));
    }
}

/// A spec of attention over given `q`, `k`, `v` (`[hq, hk, hs, ho, hv]`
/// heads, `[d, e, M, N, B]` sizes) with `args`, declaring the mixing
/// matrices `wl`, `wp` that `args` name.
pub(crate) fn mixing_core([hq, hk, hs, ho, hv]: [usize; 5], [d, e, m, n, b]: [usize; 5], args: &str) -> String {
    let logits = if args.contains("mix_logits") { format!("input wl: [{hq}, {hs}]\n") } else { String::new() };
    let probs = if args.contains("mix_probs") { format!("input wp: [{hs}, {ho}]\n") } else { String::new() };
    format!(
        "spec th\ndim B = {b}\ninput q: [B, {hq}, {m}, {d}]\ninput k: [B, {hk}, {n}, {d}]\n\
         input v: [B, {hv}, {n}, {e}]\n{logits}{probs}output o = attention(q, k, v, {args})\n"
    )
}

/// The backward of head mixing on its kernels (`D`, `dQ`, `dK`, `dV` and
/// both matrices' per-row gradients, summed by a reduction) against the
/// interpreter, with the same variety as the forward; bit-identical on a
/// second run.
pub(crate) fn head_mixing_gradients(dev: &Dev) {
    let both = "mix_logits = wl, mix_probs = wp";
    let mut programs: Vec<(String, Program)> = [
        mixing_core([4, 4, 4, 4, 4], [16, 16, 70, 70, 1], &format!("mask = causal, {both}")),
        mixing_core([4, 2, 4, 4, 2], [16, 16, 35, 90, 2], &format!("mask = none, window = 30, {both}")),
        mixing_core([3, 1, 5, 2, 1], [8, 24, 50, 50, 1], &format!("mask = causal, {both}")),
        mixing_core([4, 4, 4, 4, 4], [8, 8, 60, 35, 1], "mask = causal, mix_logits = wl"),
        mixing_core(
            [2, 2, 3, 2, 2],
            [16, 16, 60, 60, 1],
            &format!(
                "mask = |b, h, i, j| abs(i - j) <= 8 * (h + 1), score = |s, b, h, i, j| 2.0 * tanh(s / 2.0), {both}"
            ),
        ),
    ]
    .into_iter()
    .map(|src| {
        let c = attnc_compiler::compile(&src, &[]).unwrap_or_else(|d| panic!("{src}: {d:?}"));
        (src, c.program)
    })
    .collect();
    for (spec, s) in [
        ("talking_heads", sets(&[("H", "3"), ("d", "16"), ("N", "50")])),
        ("diff", sets(&[("H", "2"), ("d", "16"), ("N", "45")])),
    ] {
        programs.push((format!("{spec} {s:?}"), compile_stdlib(spec, &s).program));
    }
    for (i, (what, program)) in programs.iter().enumerate() {
        let grad = attnc_compiler::grad::differentiate(program, &[]).unwrap();
        let (tensors, dims) = bind::generate_inputs(&grad, 50 + i as u64).unwrap();
        let kinds =
            ["attention_mixed_lse", "attention_mixed_delta", "attention_mixed_grad_q", "attention_mixed_grad_k"];
        check_gradients(dev, &grad, &tensors, &dims, &kinds, what);
    }
}

/// Narrower planes than the device's (and none) give the same answers.
pub(crate) fn plane_widths(make: Make, dtype: Dtype) {
    for w in [1, 2, 4] {
        let gpu = device(make, dtype).map(|g| g.with_plane_width(w));
        run_sized(&gpu, &Sized { h: 2, hk: 1, m: 300, n: 300, d: 40, mask: "causal", window: None, block: 1 }, 7);
        let c = compile_stdlib("mha", &sets(&[("H", "3"), ("d", "10"), ("N", "150")]));
        check_spec(&gpu, &c, &seeded(&c, 8), false, &format!("mha at plane width {w}"));
    }
}

/// Launches past 65 535 cubes along an axis (CUDA's y and z limit,
/// WebGPU's on every axis) are laid out over three axes and give the same
/// answers: attention over 70 000 (batch, head) pairs, a group kernel over
/// 70 000 groups, a GEMM of 2²⁴ + 300 rows (one column: wgpu binds at
/// most 128 MiB) and an elementwise kernel of 2²⁴ + 300 elements.
pub(crate) fn folded_grids(gpu: &Dev) {
    let big = (1usize << 24) + 300;
    let cases = [
        ("attention".to_string(), "spec a\ninput q: [70000, 1, 2, 4]\ninput k: [70000, 1, 2, 4]\ninput v: [70000, 1, 2, 4]\noutput y = attention(q, k, v, mask = causal)\n".to_string()),
        ("group".to_string(), "spec g\ninput r: [70000, 3]\noutput y = r - mean(r, axis = 1, keepdim = true)\n".to_string()),
        ("gemm".to_string(), format!("spec m\ninput a: [{big}, 1]\ninput b: [1, 1]\noutput y = a @ b\n")),
        ("elementwise".to_string(), format!("spec e\ninput a: [{big}]\noutput y = a * a\n")),
    ];
    for (what, src) in &cases {
        let c = attnc_compiler::compile(src, &[]).unwrap_or_else(|e| panic!("{what}: {e:?}"));
        let dims = bind::default_dims(&c.program).unwrap();
        let p = gpu.plan(&c.program, &dims);
        let folded = p.launches.iter().any(|l| l.spec.grid().1 .1 > 1 || l.spec.fold_x() > 0);
        assert!(folded, "{what}: no launch was folded");
        for l in &p.launches {
            let (_, (x, y, z)) = l.spec.grid();
            assert!(x <= 65_535 && y <= 65_535 && z <= 65_535, "{what}: grid {x} {y} {z}");
        }
        check_spec(gpu, &c, &seeded(&c, 9), false, &format!("{what} on a folded grid"));
    }
}

/// A launch past the loop iterations Mesa's CPU drivers run is refused with
/// a clear error there, never run wrongly; elsewhere it runs and is right.
pub(crate) fn loop_limit(gpu: &Dev) {
    let source = "spec long\ninput x: [2, 70000]\noutput y = sum(x, axis = 1)\n";
    let c = attnc_compiler::compile(source, &[]).unwrap();
    let inputs = seeded(&c, 3);
    let dims = bind::default_dims(&c.program).unwrap();
    let p = gpu.plan(&c.program, &dims);
    match gpu.run(&p, &inputs) {
        Err(e) => {
            assert!(gpu.bounds_loops(), "refused on a driver without the limit: {e}");
            let msg = e.to_string();
            assert!(msg.contains("loop iterations") && msg.contains("65000"), "unclear refusal: {msg}");
        }
        Ok(_) => {
            assert!(!gpu.bounds_loops(), "{}: ran a launch past its loop limit", gpu.adapter);
            check_spec(gpu, &c, &inputs, false, "a reduction over 70 000 elements");
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Cfg {
    pub(crate) h: usize,
    pub(crate) kv_div: usize,
    pub(crate) p: usize,
    pub(crate) d: usize,
    pub(crate) n: usize,
    pub(crate) b: usize,
    pub(crate) mask: usize,
    pub(crate) window: Option<usize>,
    pub(crate) rope: bool,
    pub(crate) optimize: bool,
    pub(crate) seed: u64,
}

pub(crate) fn cfg() -> impl Strategy<Value = Cfg> {
    (
        1..=4usize,
        0..2usize,
        1..=3usize,
        prop_oneof![1..=5usize, 6..=40usize],
        // Past several query (64) and key (4 to 32) tiles.
        prop_oneof![1..=70usize, 71..=260usize],
        1..=2usize,
        0..3usize,
        prop::option::of(1..=6usize),
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(h, kv_div, p, hd, n, b, mask, window, rope, optimize, seed)| Cfg {
            h,
            kv_div,
            p,
            d: 2 * hd,
            n,
            b,
            mask,
            window,
            rope,
            optimize,
            seed,
        })
}

pub(crate) fn random_config(gpu: &Dev, c: &Cfg) {
    let mut s = sets(&[]);
    s.extend([("H", c.h.to_string()), ("d", c.d.to_string()), ("N", c.n.to_string()), ("B", c.b.to_string())]);
    if let Some(w) = c.window {
        s.push(("window", w.to_string()));
    }
    let spec = if c.p > 1 || c.rope {
        s.push(("P", c.p.to_string()));
        s.push(("mask", ["none", "flat_causal", "token_causal"][c.mask].to_string()));
        if c.rope {
            s.push(("rope", "500.0".to_string()));
        }
        "iha"
    } else {
        let hkv = if c.kv_div == 1 && c.h % 2 == 0 { c.h / 2 } else { c.h };
        s.push(("H_kv", hkv.to_string()));
        s.push(("mask", if c.mask == 0 { "none" } else { "causal" }.to_string()));
        "mha"
    };
    let compiled = compile_stdlib(spec, &s);
    let mut rng = Rng::for_input(c.seed, "gpu");
    let mut inputs = seeded(&compiled, rng.next_u64());
    // Fresh activations with large entries, so the online softmax sees big
    // logits. Not in half precision: there logits in the hundreds make the
    // output ill-conditioned (a change of one unit in the last place of a
    // query moves whole rows of probabilities), and every 16-bit
    // computation, the same-dtype reference included, lands far from the
    // float64 result; half precision is held to FlashAttention's rule on the
    // spec's own N(0, 1) activations, as FlashAttention's tests do.
    if gpu.dtype == Dtype::F32 {
        let x = inputs.get_mut("x").unwrap();
        x.data.iter_mut().for_each(|v| *v = 8.0 * (2.0 * rng.unit() - 1.0));
    }
    check_spec(gpu, &compiled, &inputs, c.optimize, &format!("{spec} {s:?}"));
}

/// The attention kernel never holds the (N·P)² score matrix: at a size where
/// that matrix alone outweighs every input and output, the executor's own
/// accounting of device memory stays below it.
pub(crate) fn attention_memory_is_linear(gpu: &Dev) {
    let c = compile_stdlib("iha", &sets(&[("H", "1"), ("P", "8"), ("d", "4"), ("N", "96"), ("mask", "flat_causal")]));
    let inputs = seeded(&c, 3);
    let dims = bind::default_dims(&c.program).unwrap();
    let p = gpu.plan(&c.program, &dims);
    let (_, stats) = gpu.run(&p, &inputs).unwrap();
    let (s, size) = (96 * 8, gpu.dtype.size() as u64);
    let score_bytes = (s * s) as u64 * size;
    let io_bytes: u64 = inputs.values().map(|t| size * t.len() as u64).sum::<u64>() + size * 96 * 4;
    eprintln!("peak {} B, score matrix {score_bytes} B, inputs and outputs {io_bytes} B", stats.peak_bytes);
    assert!(score_bytes > io_bytes, "the size does not make the score matrix dominant");
    assert!(
        stats.peak_bytes < score_bytes,
        "peak device memory {} B is not below the score matrix's {score_bytes} B",
        stats.peak_bytes
    );
    assert!(stats.peak_bytes >= io_bytes, "the accounting misses inputs: {} < {io_bytes}", stats.peak_bytes);
}
