//! Golden emitted source: for every stdlib spec at a small fixed size, the
//! WGSL and CUDA of every kernel and the manifest, produced without a device.
//! Kernels are named by the plan, so the text is the same in debug and release.

mod common;

use attnc_compiler::ir::Op;
use attnc_compiler::plan::{self, group::GroupStep};
use attnc_runtime::bind;
use attnc_runtime::gpu::emit;
use common::*;

fn small(spec: &str) -> Vec<(&'static str, String)> {
    let s: &[(&'static str, &str)] = match spec {
        "iha" | "iha_decode" => &[("H", "2"), ("P", "2"), ("d", "4"), ("N", "5"), ("rope", "10000.0")],
        "mha" | "gqa" => &[("H", "2"), ("H_kv", "1"), ("d", "4"), ("N", "5")],
        "mqa" => &[("H", "2"), ("d", "4"), ("N", "5")],
        "gdpo" => &[("B", "2"), ("G", "3"), ("C", "2")],
        // Attention with score and mask functions over given q, k, v.
        "alibi" | "softcap" => &[("H", "2"), ("H_kv", "1"), ("d", "4"), ("M", "5"), ("N", "7")],
        "relative_bias" => &[("H", "2"), ("H_kv", "1"), ("d", "4"), ("M", "5"), ("N", "7"), ("R", "3")],
        "document" | "prefix_lm" | "sinks" | "sigmoid" => &[("H", "2"), ("H_kv", "1"), ("d", "4"), ("N", "7")],
        "gpt_oss" => &[("H", "2"), ("H_kv", "1"), ("d", "4"), ("N", "7"), ("window", "3")],
        "talking_heads" => &[("H", "2"), ("d", "4"), ("N", "5")],
        "kvcache" => &[("H", "2"), ("H_kv", "1"), ("d", "4"), ("M", "2"), ("N", "7"), ("window_left", "3")],
        "paged" => &[("H", "2"), ("H_kv", "1"), ("d", "4"), ("M", "2"), ("NB", "5"), ("PS", "2"), ("MP", "3")],
        "diff" => &[("H", "2"), ("d", "2"), ("N", "5")],
        _ => &[("B", "2"), ("G", "3")],
    };
    s.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

#[test]
fn emitted_source_for_every_stdlib_spec() {
    for spec in stdlib_names() {
        let c = compile_stdlib(&spec, &small(&spec));
        let dims = bind::default_dims(&c.program).unwrap();
        let p = plan::plan(&c.program, &dims);
        for target in [emit::Target::Wgsl, emit::Target::Cuda] {
            let (files, manifest) = emit::emit(&p, target).unwrap();
            let (again, _) = emit::emit(&p, target).unwrap();
            assert_eq!(files, again, "emission is not deterministic for {spec}");
            let mut text = serde_json::to_string_pretty(&manifest).unwrap();
            for (name, source) in &files {
                text.push_str(&format!("\n\n==== {name} ====\n{source}"));
            }
            insta::assert_snapshot!(format!("{spec}_{}", target.extension()), text);
        }
    }
}

/// Gradient programs emit like any program: deterministic WGSL and CUDA for
/// IHA's whole gradient program, and golden WGSL for the kernels only the
/// backward has (attention's log-sum-exp and dQ/dK/dV, the coefficient
/// contractions), with the manifest's entries for them.
#[test]
fn emitted_source_for_gradient_programs() {
    let c = compile_stdlib("iha", &small("iha"));
    let grad = attnc_compiler::grad::differentiate(&c.program, &[]).unwrap();
    let dims = bind::default_dims(&grad).unwrap();
    let p = plan::plan(&grad, &dims);
    for target in [emit::Target::Wgsl, emit::Target::Cuda] {
        let (files, manifest) = emit::emit(&p, target).unwrap();
        let (again, _) = emit::emit(&p, target).unwrap();
        assert_eq!(files, again, "emission of the gradient program is not deterministic");
        if target != emit::Target::Wgsl {
            continue;
        }
        let backward = |name: &str| ["attention_lse", "attention_grad", "contract"].iter().any(|k| name.contains(k));
        let mut text = String::new();
        for l in manifest.launches.iter().filter(|l| backward(&l.entry)) {
            text.push_str(&format!("{}\n", serde_json::to_string(l).unwrap()));
        }
        for (name, source) in files.iter().filter(|(n, _)| backward(n)) {
            text.push_str(&format!("\n\n==== {name} ====\n{source}"));
        }
        assert!(text.contains("attention_grad_kv") && text.contains("contract"), "{text}");
        insta::assert_snapshot!("iha_grad_backward_wgsl", text);
    }
}

/// The reward estimators run as one group kernel per pass over the groups,
/// and ODRPO's threshold split is never materialised: at G = 64 and K = 100
/// no buffer holds the `[B, G, K − 1]` indicators and each group's shared
/// memory is O(G + K), far below the G·(K − 1) values a dense split needs.
#[test]
fn reward_estimators_are_one_group_pass_in_cumulative_count_form() {
    for spec in ["grpo", "dr_grpo", "rloo", "maxrl", "gdpo", "odrpo"] {
        let c = compile_stdlib(spec, &[]);
        let dims = bind::default_dims(&c.program).unwrap();
        let p = plan::plan(&c.program, &dims);
        let kinds: Vec<&str> = p.launches.iter().map(|l| l.spec.kind()).collect();
        // GDPO standardises over the whole batch: a second pass after the batch statistics.
        let want = if spec == "gdpo" { 2 } else { 1 };
        assert_eq!(kinds.iter().filter(|k| **k == "group").count(), want, "{spec}: {kinds:?}");
        if spec != "gdpo" {
            assert_eq!(kinds, ["group"], "{spec}");
            // What the one launch reads and writes is stored (in the plan's
            // dtype); every value computed between stays in its registers.
            let outputs: Vec<usize> = c.program.outputs.iter().map(|(_, id)| id.0 as usize).collect();
            for (i, node) in c.program.nodes.iter().enumerate() {
                if matches!(node.op, Op::Scalar { .. } | Op::Constant { .. }) {
                    continue; // uploaded constants (stored) or folded into the launch
                }
                let leaf = matches!(node.op, Op::Input { .. });
                assert_eq!(p.stored[i], leaf || outputs.contains(&i), "{spec}: node {i} {:?}", node.op);
            }
        }
    }
    for base in ["grpo", "maxrl", "mean"] {
        let plan_at = |g: usize, k: usize| {
            let sets = [("B", "4".to_string()), ("G", g.to_string()), ("K", k.to_string()), ("base", base.to_string())];
            let c = compile_stdlib("odrpo", &sets);
            plan::plan(&c.program, &bind::default_dims(&c.program).unwrap())
        };
        let step_len = |s: &GroupStep| match *s {
            GroupStep::Load { len, .. }
            | GroupStep::Map { len, .. }
            | GroupStep::Thresholds { len, .. }
            | GroupStep::Reduce { len, .. }
            | GroupStep::LooMean { len, .. }
            | GroupStep::Store { len, .. } => len,
            GroupStep::Indicator { l, .. } | GroupStep::LiftReduceGroups { l, .. } => 2 * l,
            GroupStep::LiftScan { l, .. } => 2 * l + 2,
            GroupStep::Levels { g, l, .. } => g + 2 * l + 1,
            GroupStep::LiftReduceLevels { g, .. } => g,
            GroupStep::Densify { g, l, .. } => g * l,
        };
        let scratch = |g: usize, k: usize| {
            let p = plan_at(g, k);
            assert_eq!(p.launches.len(), 1, "{base}");
            assert!(p.buffers.iter().all(|buf| buf.len < 4 * g * (k - 1)), "{base}: a buffer holds the split");
            match &p.launches[0].spec {
                plan::KernelSpec::Group { scratch, .. } => *scratch as i64,
                other => panic!("{base}: {other:?} is not a group kernel"),
            }
        };
        for (g, k) in [(64, 100), (128, 100), (64, 199), (128, 199)] {
            let p = plan_at(g, k);
            let plan::KernelSpec::Group { steps, .. } = &p.launches[0].spec else { unreachable!() };
            // No step walks the G × (K − 1) split: every one is O(G + K).
            let longest = steps.iter().map(step_len).max().unwrap();
            assert!(longest <= g + 2 * (k + 1), "{base} G = {g} K = {k}: a step of {longest} values");
            assert!(steps.iter().all(|s| !matches!(s, GroupStep::Densify { .. })), "{base}: densified");
            eprintln!("odrpo base={base} G={g} K={k}: {} shared values, {} steps", scratch(g, k), steps.len());
            assert!(scratch(g, k) < (g * (k - 1)) as i64 / 2, "{base}: {} shared values", scratch(g, k));
        }
    }
}

/// Layout is views: head splits and merges, (de)interleaving, flattening and
/// column slices are read or written in place by the kernels next to them, so
/// no attention spec plans a copy launch — not the stdlib specs at several
/// settings (masks, windows, RoPE, both collapses, GQA/MQA), and not any
/// program the optimizer can extract from them (folded, merged, column-map
/// forms). MHA, GQA and MQA are four GEMMs and the attention; IHA is three
/// projections that mix heads in their epilogue, the attention, the collapse
/// and the output GEMM.
#[test]
fn attention_specs_plan_no_copy_launch() {
    use attnc_compiler::opt::{self, rules};
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("mha", &[]),
        ("mha", &[("mask", "none"), ("window", "3")]),
        ("gqa", &[]),
        ("mqa", &[("N", "7")]),
        ("iha", &[]),
        ("iha", &[("rope", "10000.0")]),
        ("iha", &[("collapse", "per_head"), ("mask", "token_causal"), ("window", "2")]),
        ("iha", &[("P", "3"), ("mask", "none"), ("rope", "500.0")]),
        ("iha", &[("N", "1"), ("P", "4")]),
    ];
    for (spec, sets) in cases {
        let mut all = small(spec);
        for (k, v) in *sets {
            all.retain(|(n, _)| n != k);
            all.push((k, v.to_string()));
        }
        if !sets.iter().any(|(k, _)| *k == "rope") {
            all.retain(|(n, _)| *n != "rope");
        }
        let c = compile_stdlib(spec, &all);
        let dims = bind::default_dims(&c.program).unwrap();
        let kinds = |p: &plan::Plan| p.launches.iter().map(|l| l.spec.kind()).collect::<Vec<_>>();
        let p = plan::plan(&c.program, &dims);
        let rope = sets.iter().any(|(k, _)| *k == "rope");
        match *spec {
            "iha" if rope => assert_eq!(
                kinds(&p),
                ["matmul_mix", "rope", "matmul_mix", "rope", "matmul_mix", "attention", "collapse", "matmul"],
                "{spec} {sets:?}"
            ),
            // Per-head collapse uses the block-diagonal of r: work on a weight
            // alone, so it comes first and is done once per set of weights.
            "iha" if sets.contains(&("collapse", "per_head")) => {
                assert_eq!(
                    kinds(&p),
                    ["block_diag", "matmul_mix", "matmul_mix", "matmul_mix", "attention", "collapse", "matmul"],
                    "{spec} {sets:?}"
                );
                assert_eq!(p.prepared(), 1);
            }
            "iha" => assert_eq!(
                kinds(&p),
                ["matmul_mix", "matmul_mix", "matmul_mix", "attention", "collapse", "matmul"],
                "{spec} {sets:?}"
            ),
            _ => assert_eq!(kinds(&p), ["matmul", "matmul", "matmul", "attention", "matmul"], "{spec} {sets:?}"),
        }
        if !sets.contains(&("collapse", "per_head")) {
            assert_eq!(p.prepared(), 0, "{spec} {sets:?}");
        }
        for alt in opt::alternatives(&c.program, &rules::rules()) {
            let p = plan::plan(&alt, &dims);
            let k = kinds(&p);
            assert!(!k.contains(&"gather"), "{spec} {sets:?}: an extracted program copies: {k:?}");
        }
        // The optimizer's choice launches no more per call than the original
        // unless the cost model, which charges every launch of its plan, says
        // it is cheaper (folded and concatenated weights are prepared once).
        for target in [opt::cost::H200, opt::cost::CPU] {
            for n in ["1", "4096"] {
                let mut d = dims.clone();
                d.insert("N".into(), n.parse().unwrap());
                let o = opt::optimize(&c.program, &d, &opt::Config { target, ..Default::default() });
                let per_call = |p: &plan::Plan| p.launches.len() - p.prepared();
                // Plans as the cost model prices them: split for the target's compute units.
                let planned = |p| plan::plan(p, &d).split_kv(target.compute_units);
                let (chosen, original) = (planned(&o.chosen), planned(&c.program));
                assert_eq!(o.chosen_cost.total.launches as usize, per_call(&chosen), "{spec} {sets:?}");
                assert!(
                    per_call(&chosen) <= per_call(&original) || o.chosen_cost.seconds < o.original_cost.seconds,
                    "{spec} {sets:?} N = {n} on {}: {} launches per call against {}",
                    target.name,
                    per_call(&chosen),
                    per_call(&original)
                );
                assert!(o.chosen_cost.seconds <= o.original_cost.seconds);
            }
        }
    }
}

/// The row views attention reads and writes in place (derived from the
/// plan's layouts) address exactly what the copy launches they replace
/// would have gathered: `split_heads` and `interleave` (and so `merge_heads`
/// and `deinterleave`, their inverses).
#[test]
fn row_views_address_what_the_layout_copies_gather() {
    let (b, h, p, s, w) = (2, 3, 4, 5, 8);
    // split_heads of [b, s, h·w] → [b, h, s, w]: the gather's view, as the planner builds it.
    let split = plan::View::new(&[b, h, s, w], &[s * h * w, w, h * w, 1], 0);
    let merged = plan::Layout::contiguous(&[b, s, h * w]).split_heads(h).unwrap().row_view().unwrap();
    // interleave of [b, h, p, s, w] → [b, h, s·p, w].
    let inter = plan::View::new(&[b, h, s, p, w], &[h * p * s * w, p * s * w, w, s * w, 1], 0);
    let pseudo = plan::Layout::contiguous(&[b, h, p, s, w]).interleave().row_view().unwrap();
    for bi in 0..b {
        for hi in 0..h {
            for r in 0..s {
                let i = ((bi * h + hi) * s + r) * w;
                assert_eq!(merged.row(bi, hi, r), split.index(i), "split_heads row ({bi}, {hi}, {r})");
            }
            for r in 0..s * p {
                let i = ((bi * h + hi) * s * p + r) * w;
                assert_eq!(pseudo.row(bi, hi, r), inter.index(i), "interleave row ({bi}, {hi}, {r})");
            }
        }
    }
}

#[test]
fn attention_tiles_stay_within_their_register_and_mask_bounds() {
    use plan::{AttnTiles, ATTN_ROWS};
    let widths = [1usize, 2, 4, 8, 10, 16, 20, 32, 59, 64, 111, 128];
    for &dl in &widths {
        for &el in &widths {
            for s in [1usize, 5, 63, 64, 65, 200, 256, 1000, 1024, 4096, 100_000] {
                for (masked, window_rows) in [(false, 0), (true, 0), (true, 40), (true, 300), (false, 2000)] {
                    let t = AttnTiles::new(dl, el, s, s, masked, window_rows);
                    let what = format!("dl {dl} el {el} s {s} masked {masked} window {window_rows}: {t:?}");
                    assert!(t.unit_rows.is_power_of_two() && (1..=8).contains(&t.unit_rows), "{what}");
                    assert!(t.key_tile.is_power_of_two() && (4..=32).contains(&t.key_tile), "{what}");
                    // Registers: a unit's queries and accumulators.
                    assert!(t.unit_rows == 1 || t.unit_rows * (dl + el) <= 256, "{what}");
                    // Code size: one tile's unrolled vector operations.
                    assert!(t.unit_rows * t.key_tile * (dl + el) <= plan::UNROLL_OPS || t.key_tile == 4, "{what}");
                    // …and the rows unrolled at once, in 32 or 16 bits.
                    for (half, budget) in [(false, plan::UNROLL_OPS), (true, plan::UNROLL_OPS / 2)] {
                        let part = t.unrolled_rows(dl + el, half);
                        assert!(t.key_tile % part == 0, "{what}: part {part}");
                        assert!(part == 1 || t.unit_rows * part * (dl + el) <= budget, "{what}: part {part}");
                    }
                    // A cube never spans more than the queries need…
                    assert!(t.unit_rows == 1 || ATTN_ROWS * t.unit_rows < 2 * s, "{what}");
                    // …nor, under a mask, more than a quarter of them or the window.
                    if masked {
                        assert!(t.unit_rows == 1 || 4 * ATTN_ROWS * t.unit_rows <= s, "{what}");
                    }
                    if window_rows > 0 {
                        assert!(t.unit_rows == 1 || ATTN_ROWS * t.unit_rows <= window_rows, "{what}");
                    }
                }
            }
        }
    }
    // The sizes benchmarked: d = 64 in vectors of 4, N = 1024.
    assert_eq!(
        AttnTiles::new(16, 16, 1024, 1024, false, 0),
        AttnTiles { unit_rows: 8, key_tile: 4, lanes: 1, row_units: ATTN_ROWS }
    );
    assert_eq!(
        AttnTiles::new(16, 16, 1024, 1024, true, 0),
        AttnTiles { unit_rows: 4, key_tile: 8, lanes: 1, row_units: ATTN_ROWS }
    );
    // Fragment tiling (one row, 32 keys at d = 64) run by the CPU kernel: in
    // 16-bit storage it unrolls 16 keys at a time (512 vector operations).
    let frag = AttnTiles { unit_rows: 1, key_tile: 32, lanes: 1, row_units: ATTN_ROWS };
    assert_eq!((frag.unrolled_rows(32, false), frag.unrolled_rows(32, true)), (32, 16));
    // The fragment backward: cubes of 64 rows up to 64-wide heads, one plane
    // of 32 up to 128 where both heads pad alike, none past that; its shared
    // arrays within 32 KiB.
    let units = |d, e| plan::frag_grad_tiles(d, e, 2).map(|t| (t.units(), t.cube_rows(), t.key_tile));
    assert_eq!(units(64, 64), Some((64, 64, 16)));
    assert_eq!(units(6, 6), Some((64, 64, 16)));
    assert_eq!(units(96, 96), Some((32, 32, 16)));
    assert_eq!(units(128, 128), Some((32, 32, 16)));
    assert_eq!(units(120, 128), Some((32, 32, 16)));
    assert_eq!(units(128, 64), None);
    assert_eq!(units(256, 256), None);
    assert!(plan::frag_grad_shared(128, 128, 2, 16, 32) <= plan::FRAG_SHARED);
    assert!(plan::frag_grad_shared(128, 128, 2, 16, 64) > plan::FRAG_SHARED);
    // TF32's f32 storage: the backward's one-plane cubes up to 64-wide heads
    // (64 rows take 33 KB at d = 32), cubes of 64 rows up to 16, none past 64.
    let units32 = |d, e| plan::frag_grad_tiles(d, e, 4).map(|t| (t.units(), t.cube_rows(), t.key_tile));
    assert_eq!(units32(16, 16), Some((64, 64, 16)));
    assert_eq!(units32(32, 32), Some((32, 32, 16)));
    assert_eq!(units32(64, 64), Some((32, 32, 16)));
    assert_eq!(units32(64, 48), None);
    assert_eq!(units32(80, 80), None);
    assert_eq!(plan::frag_grad_shared(32, 32, 4, 16, 64), 33280);
}

/// The plan's layouts read exactly what the layout operations compute: a
/// chain of head splits, merges, interleaves and deinterleaves over a random
/// tensor is planned as one gather through the composed view (or none, when
/// the chain is the identity), and that view, applied on the host, gives the
/// interpreter's output element for element.
mod layouts {
    use super::*;
    use attnc_compiler::ir::BinaryOp;
    use attnc_compiler::plan::BufferRole;
    use attnc_runtime::rng::Rng;
    use proptest::prelude::*;

    /// `(expression, output shape)` chains over `x: [B, N, H·d]`, `N = S·P`.
    fn chains(h: usize, p: usize, h2: usize) -> Vec<String> {
        vec![
            format!("split_heads(x, {h})"),
            format!("merge_heads(split_heads(x, {h}))"),
            format!("deinterleave(split_heads(x, {h}), {p})"),
            format!("interleave(deinterleave(split_heads(x, {h}), {p}))"),
            format!("merge_heads(deinterleave(split_heads(x, {h}), {p}))"),
            format!("split_heads(merge_heads(deinterleave(split_heads(x, {h}), {p})), {h2})"),
            format!("merge_heads(interleave(split_heads(merge_heads(deinterleave(split_heads(x, {h}), {p})), {h2})))"),
            format!("deinterleave(split_heads(x, {h}), {p}) * 2.0 + 1.0"),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]
        #[test]
        fn layout_views_read_what_the_layout_operations_compute(
            b in 1usize..3, s in 1usize..6, p in 1usize..4, h in 1usize..4, d in 1usize..5, seed in 0u64..1000,
        ) {
            // h2 divides p·d so the last split is legal.
            let h2 = if (p * d) % 2 == 0 { 2 } else { 1 };
            for expr in chains(h, p, h2) {
                let src = format!(
                    "spec t\ninput x: [{b}, {}, {}]\noutput y = {expr}\n",
                    s * p,
                    h * d
                );
                let c = attnc_compiler::compile(&src, &[]).unwrap_or_else(|e| panic!("{expr}: {e:?}"));
                let mut rng = Rng::for_input(seed, "x");
                let x = random(&mut rng, &[b, s * p, h * d]);
                let want = eval(&c, &named(vec![("x", x.clone())]))["y"].clone();
                let dims = bind::default_dims(&c.program).unwrap();
                let plan = plan::plan(&c.program, &dims);
                // Run the plan on the host: its gathers and elementwise launches by their views.
                let mut bufs: Vec<Vec<f64>> = plan.buffers.iter().map(|buf| match &buf.role {
                    BufferRole::Input { .. } => x.data.clone(),
                    BufferRole::Constant { values } => values.clone(),
                    BufferRole::Temp => vec![f64::NAN; buf.len],
                }).collect();
                for l in &plan.launches {
                    let out: Vec<f64> = match &l.spec {
                        plan::KernelSpec::Gather { len, x: v } => {
                            (0..*len).map(|i| bufs[l.bindings[0]][v.index(i)]).collect()
                        }
                        plan::KernelSpec::Binary { len, op, a, b } => (0..*len)
                            .map(|i| {
                                let (u, w) = (bufs[l.bindings[0]][a.index(i)], bufs[l.bindings[1]][b.index(i)]);
                                match op {
                                    BinaryOp::Add => u + w,
                                    BinaryOp::Mul => u * w,
                                    other => panic!("{other:?}"),
                                }
                            })
                            .collect(),
                        other => panic!("{expr}: {}", other.kind()),
                    };
                    bufs[*l.bindings.last().unwrap()] = out;
                }
                let got = &bufs[plan.outputs[0].1];
                // A copy only where no mixed-radix view expresses the chain.
                let copies = plan.launches.iter().filter(|l| l.spec.kind() == "gather").count();
                prop_assert!(copies <= 2, "{}: {} copies", expr, copies);
                prop_assert_eq!(got, &want.data, "{}", expr);
            }
        }
    }
}

/// A constant factor on a product is the GEMM's epilogue: `(a @ b) * c`,
/// `c * (a @ b)` and `(a @ b) / c` are one launch; a sum is not a factor.
#[test]
fn constant_factors_fold_into_the_gemm_epilogue() {
    for (expr, kinds, scale) in [
        ("(a @ b) * 0.5", vec!["matmul"], Some(0.5)),
        ("3.0 * (a @ b)", vec!["matmul"], Some(3.0)),
        ("(a @ b) / 4.0", vec!["matmul"], Some(0.25)),
        ("(a @ b) + 1.0", vec!["matmul", "binary"], None),
    ] {
        let src = format!("spec g\ninput a: [30, 8]\ninput b: [8, 12]\noutput y = {expr}\n");
        let c = attnc_compiler::compile(&src, &[]).unwrap();
        let p = plan::plan(&c.program, &bind::default_dims(&c.program).unwrap());
        assert_eq!(p.launches.iter().map(|l| l.spec.kind()).collect::<Vec<_>>(), kinds, "{expr}");
        let plan::KernelSpec::MatMul { scale: got, .. } = p.launches[0].spec else { unreachable!() };
        assert_eq!(got.map(f64::from_bits), scale, "{expr}");
        // A folded factor is no buffer's value: the same-dtype reference
        // does not round it.
        let factor = c.program.nodes.iter().position(|n| matches!(n.op, Op::Scalar { .. })).unwrap();
        assert_eq!(p.stored[factor], scale.is_none(), "{expr}");
    }
}

/// An addend of the product's shape is the GEMM's epilogue: `a @ b + y` and
/// `y + a @ b` are one launch, as is a sum of two products (one GEMM adds
/// the other's result); a broadcast addend is not folded, nor a sum that a
/// group kernel computes (an input's). The product is no buffer's value then.
#[test]
fn addends_fold_into_the_gemm_epilogue() {
    for (expr, kinds) in [
        ("a @ b + y", vec!["matmul_add"]),
        ("y + a @ b", vec!["matmul_add"]),
        ("a @ b + a @ b", vec!["matmul", "matmul_add"]),
        ("a @ b + r", vec!["matmul", "binary"]),
        ("a @ b - y", vec!["matmul", "binary"]),
        ("a @ b + x", vec!["matmul", "group"]),
    ] {
        let src = format!(
            "spec g\ninput a: [30, 8]\ninput b: [8, 12]\nweight y: [30, 12]\nweight r: [12]\ninput x: [30, 12]\noutput o = {expr}\n"
        );
        let c = attnc_compiler::compile(&src, &[]).unwrap();
        let p = plan::plan(&c.program, &bind::default_dims(&c.program).unwrap());
        assert_eq!(p.launches.iter().map(|l| l.spec.kind()).collect::<Vec<_>>(), kinds, "{expr}");
        let fused = kinds.contains(&"matmul_add");
        let product = c.program.nodes.iter().position(|n| matches!(n.op, Op::MatMul { .. })).unwrap();
        assert_eq!(p.stored[product], !fused, "{expr}");
    }
}

/// Emitted CUDA compiles next to host code (nvcc includes `<cstdint>`, whose
/// `int64_t` is `long`): the fixed-width typedefs cubecl's preamble needs
/// under NVRTC are kept for NVRTC only. Checked by compiling every emitted
/// preamble with the system C++ compiler after the host headers, and the
/// unguarded preamble is refused the same way (so the check can fail).
#[test]
fn cuda_preambles_compile_next_to_host_headers() {
    let dir = std::env::temp_dir().join(format!("attnc-preamble-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let host = "#include <cstdint>\n#include <cstddef>\n#define __device__\n#define __align__(x) alignas(x)\n";
    let compiles = |name: &str, preamble: &str| {
        let path = dir.join(format!("{name}.cpp"));
        std::fs::write(&path, format!("{host}{preamble}\nint main() {{ return 0; }}\n")).unwrap();
        let out = std::process::Command::new("c++")
            .args(["-fsyntax-only", "-x", "c++"])
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("this test needs a C++ compiler (`c++`): {e}"));
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    for spec in ["mha", "iha", "grpo"] {
        let c = compile_stdlib(spec, &small(spec));
        let p = plan::plan(&c.program, &bind::default_dims(&c.program).unwrap());
        let (files, _) = emit::emit(&p, emit::Target::Cuda).unwrap();
        for (name, source) in &files {
            let preamble = &source[..source.find("extern \"C\"").expect("a kernel")];
            let (ok, err) = compiles(name, preamble);
            assert!(ok, "{spec} {name}: the preamble does not compile after host headers:\n{err}");
            assert!(preamble.contains("#ifdef __CUDACC_RTC__") && preamble.contains("#include <cstdint>"));
        }
    }
    let unguarded = "typedef signed long long int int64_t;\ntypedef unsigned long long int uint64_t;\n";
    assert!(!compiles("unguarded", unguarded).0, "host headers accept a clashing typedef: the check cannot fail");
    assert_eq!(emit::host_compatible("x\n"), "x\n");
    std::fs::remove_dir_all(&dir).ok();
}

/// Launches fit a real GPU at sizes users run: no kernel needs more than
/// CUDA's default 48 KiB of dynamic shared memory (so none needs an opt-in),
/// whatever the head width or group size, and the manifest says so.
#[test]
fn shared_memory_stays_within_the_default_limit() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        // Attention keeps its rows in registers at any width (d = 256 needed
        // 64 KiB of shared memory in an earlier kernel); N is small only to
        // keep this debug-build test quick.
        ("mha", &[("d", "256"), ("H", "1"), ("N", "5")]),
        ("iha", &[("d", "16"), ("H", "8"), ("P", "8"), ("N", "5"), ("collapse", "per_head")]),
        ("odrpo", &[("G", "1024"), ("K", "100"), ("B", "2")]),
        ("gdpo", &[("G", "4096"), ("C", "8"), ("B", "2")]),
        ("grpo", &[("G", "70000"), ("B", "1")]),
    ];
    for (spec, sets) in cases {
        let c = compile_stdlib(spec, &sets.iter().map(|(k, v)| (*k, v.to_string())).collect::<Vec<_>>());
        let p = plan::plan(&c.program, &bind::default_dims(&c.program).unwrap());
        // The backward's tiles too (d = 256: key and value tiles of 4 rows),
        // for the specs with continuous inputs (ODRPO's ratings are discrete).
        if let Ok(grad) = attnc_compiler::grad::differentiate(&c.program, &[]) {
            let gp = plan::plan(&grad, &bind::default_dims(&grad).unwrap());
            let (_, manifest) = emit::emit(&gp, emit::Target::Cuda).unwrap();
            for l in &manifest.launches {
                let bytes = l.shared_memory_bytes;
                assert!(bytes <= 48 * 1024, "gradient of {spec} {sets:?}: {} needs {bytes} B", l.entry);
            }
        }
        let (_, manifest) = emit::emit(&p, emit::Target::Cuda).unwrap();
        for l in &manifest.launches {
            assert!(
                l.shared_memory_bytes <= 48 * 1024,
                "{spec} {sets:?}: {} needs {} B",
                l.entry,
                l.shared_memory_bytes
            );
        }
    }
}

/// Every launch fits CUDA's and WebGPU's grid limits (65 535 cubes along y
/// and z; WebGPU also along x) at any size under the 2³¹-element limit: the
/// issue's `mha B=256 N=4096 H=8 d=32` (its GEMMs have 4096 row tiles), a
/// batch of 70 000 (batch, head) pairs, 100 000 groups, 2³⁰ elements.
#[test]
fn grids_fit_the_launch_limits_at_any_size() {
    let specs: Vec<(String, Vec<(&str, String)>)> = vec![
        ("mha".into(), vec![("B", "256".into()), ("N", "4096".into()), ("H", "8".into()), ("d", "32".into())]),
        ("mha".into(), vec![("B", "70000".into()), ("N", "2".into()), ("H", "1".into()), ("d", "4".into())]),
        ("grpo".into(), vec![("B", "100000".into()), ("G", "4".into())]),
    ];
    let mut plans: Vec<(String, plan::Plan)> = specs
        .into_iter()
        .map(|(spec, sets)| {
            let c = compile_stdlib(&spec, &sets);
            (format!("{spec} {sets:?}"), plan::plan(&c.program, &bind::default_dims(&c.program).unwrap()))
        })
        .collect();
    let c = attnc_compiler::compile("spec e\ninput a: [1073741824]\noutput y = a * 2.0\n", &[]).unwrap();
    plans.push(("2^30 elements".into(), plan::plan(&c.program, &bind::default_dims(&c.program).unwrap())));
    for (what, p) in &plans {
        for l in &p.launches {
            let ((ux, _, _), (x, y, z)) = l.spec.grid();
            assert!(x <= 65_535 && y <= 65_535 && z <= 65_535, "{what}: {} grid [{x}, {y}, {z}]", l.name);
            // The grid holds every cube the kernel indexes.
            let (cx, cy) = l.spec.cubes();
            assert!((x as usize) * (y as usize) * (z as usize) >= cx * cy, "{what}: {}", l.name);
            if !matches!(l.spec.kind(), "matmul" | "matmul_mix" | "attention" | "group") {
                // Elementwise kernels: a unit per element.
                let units = x as usize * y as usize * z as usize * ux as usize;
                assert!(units >= l.spec.len(), "{what}: {} has {units} units for {}", l.name, l.spec.len());
            }
        }
    }
}

/// Offline CUDA (a GPU: plane operations, 48 KiB) gets the GEMM that stages
/// its tiles in shared memory, double-buffered (up to 18 KiB, a barrier per
/// slice); offline WGSL, which keeps to WebGPU's guaranteed limits, gets the
/// direct-load GEMM with no shared memory.
#[test]
fn gemms_stage_in_shared_memory_on_gpus_only() {
    let c = compile_stdlib("mha", &small("mha"));
    let p = plan::plan(&c.program, &bind::default_dims(&c.program).unwrap());
    let (cuda, cuda_manifest) = emit::emit(&p, emit::Target::Cuda).unwrap();
    let (wgsl, wgsl_manifest) = emit::emit(&p, emit::Target::Wgsl).unwrap();
    for (i, l) in p.launches.iter().enumerate().filter(|(_, l)| l.spec.kind() == "matmul") {
        // Two stages of 256 rows × 8 floats of `a` and 8 × (≤ 32) floats of `b`.
        let bytes = cuda_manifest.launches[i].shared_memory_bytes;
        assert!(bytes > 2 * 256 * 8 * 4 && bytes <= 18432, "{}: {bytes} B", l.name);
        assert!(cuda[i].1.contains("__syncthreads()") && cuda[i].1.contains("extern __shared__"), "{}", l.name);
        assert_eq!(wgsl_manifest.launches[i].shared_memory_bytes, 0, "{}", l.name);
        assert!(!wgsl[i].1.contains("var<workgroup>") && !wgsl[i].1.contains("workgroupBarrier"), "{}", l.name);
    }
}

/// Half precision: with `--dtype bf16` the CUDA GEMMs and attention multiply
/// on tensor cores (`nvcuda::wmma` fragments of `__nv_bfloat16` into f32),
/// deterministically and within 48 KiB of shared memory, GEMMs that mix
/// heads in their epilogue (IHA's projections) included; attention over heads wider than
/// `plan::FRAG_MAX_HEAD`, f32 kernels and WGSL keep the scalar kernels
/// (WGSL f16 declares the `f16` extension; WGSL has no bf16).
#[test]
fn bf16_cuda_kernels_multiply_on_tensor_cores() {
    let wmma = "nvcuda::wmma::mma_sync";
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("mha", &[("H", "2"), ("d", "64"), ("N", "40")]),
        ("mha", &[("H", "1"), ("d", "128"), ("N", "20"), ("mask", "none")]),
        ("iha", &[("H", "2"), ("P", "2"), ("d", "16"), ("N", "10")]),
    ];
    for (spec, sets) in cases {
        let c = compile_stdlib(spec, &sets.iter().map(|(k, v)| (*k, v.to_string())).collect::<Vec<_>>());
        let dims = bind::default_dims(&c.program).unwrap();
        let p = plan::plan(&c.program, &dims).in_dtype(plan::Dtype::Bf16);
        let (files, manifest) = emit::emit(&p, emit::Target::Cuda).unwrap();
        let (again, _) = emit::emit(&p, emit::Target::Cuda).unwrap();
        assert_eq!(files, again, "{spec} {sets:?}: bf16 emission is not deterministic");
        assert_eq!(manifest.dtype, "bf16");
        for (l, ((name, source), info)) in p.launches.iter().zip(files.iter().zip(&manifest.launches)) {
            assert!(info.bindings.iter().all(|b| b.dtype == "bf16"), "{name}");
            assert!(info.shared_memory_bytes <= 48 * 1024, "{name}: {} B", info.shared_memory_bytes);
            match l.spec.kind() {
                "matmul" | "matmul_mix" | "attention" => {
                    assert!(
                        source.contains(wmma)
                            && source.contains("wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __nv_bfloat16"),
                        "{spec} {name}: no bf16 tensor-core product"
                    );
                    assert!(
                        source.contains("wmma::load_matrix_sync") && source.contains("wmma::store_matrix_sync"),
                        "{name}"
                    );
                }
                _ => assert!(!source.contains(wmma), "{spec} {name}: unexpected fragments"),
            }
        }
        // The same plan in f32 and in f16 WGSL: scalar kernels.
        let f32_plan = plan::plan(&c.program, &dims);
        let (files, _) = emit::emit(&f32_plan, emit::Target::Cuda).unwrap();
        assert!(files.iter().all(|(_, s)| !s.contains("wmma")), "{spec}: f32 kernels on tensor cores");
        let (files, _) =
            emit::emit(&plan::plan(&c.program, &dims).in_dtype(plan::Dtype::F16), emit::Target::Wgsl).unwrap();
        assert!(files.iter().all(|(_, s)| s.starts_with("enable f16;")), "{spec}: f16 WGSL without the extension");
        let (files, _) =
            emit::emit(&plan::plan(&c.program, &dims).in_dtype(plan::Dtype::F16), emit::Target::Cuda).unwrap();
        assert!(
            files.iter().any(|(_, s)| s.contains("matrix_a, 16, 16, 16, __half")),
            "{spec}: f16 CUDA without fragments"
        );
    }
    // Heads past 128 keep the scalar attention (its shared memory would pass 48 KiB).
    let c = compile_stdlib("mha", &[("H", "1"), ("d", "256"), ("N", "4")].map(|(k, v)| (k, v.to_string())));
    let p = plan::plan(&c.program, &bind::default_dims(&c.program).unwrap()).in_dtype(plan::Dtype::Bf16);
    let att = p.launches.iter().find(|l| l.spec.kind() == "attention").unwrap();
    assert!(!att.spec.fragments(), "d = 256 attention tiled for fragments");
    let err = emit::emit(&p, emit::Target::Wgsl).err().expect("bf16 WGSL is refused");
    assert!(err.contains("bf16"), "{err}");
}

/// TF32 (`--dtype tf32`): f32 buffers, and the CUDA GEMMs (mixing ones
/// included) and attention's backward with heads up to 64 multiply
/// `precision::tf32` 16×16×8 fragments, with operands rounded by
/// `__float_to_tf32` on their way to shared memory; the forward attention,
/// the backward over wider heads and the other kernels are the f32 ones;
/// WGSL refuses it.
#[test]
fn tf32_cuda_gemms_multiply_on_tensor_cores() {
    let fragment = "wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32";
    let mha = |d: &str| compile_stdlib("mha", &[("H", "2"), ("d", d), ("N", "40")].map(|(k, v)| (k, v.to_string())));
    let iha =
        compile_stdlib("iha", &[("H", "2"), ("P", "2"), ("d", "16"), ("N", "10")].map(|(k, v)| (k, v.to_string())));
    let grad = |c: &attnc_compiler::Compiled| attnc_compiler::grad::differentiate(&c.program, &[]).unwrap();
    let programs = [(iha.program.clone(), 1, false), (grad(&mha("64")), 3, false), (grad(&mha("128")), 3, true)];
    for (program, attention_launches, wide) in &programs {
        let dims = bind::default_dims(program).unwrap();
        let p = plan::plan(program, &dims).in_dtype(plan::Dtype::Tf32);
        let (files, manifest) = emit::emit(&p, emit::Target::Cuda).unwrap();
        let (f32_files, _) = emit::emit(&plan::plan(program, &dims), emit::Target::Cuda).unwrap();
        assert_eq!(manifest.dtype, "tf32");
        // Forward attention, and dQ and dK/dV in a gradient program.
        let attention: Vec<_> = p.launches.iter().filter(|l| l.spec.kind().starts_with("attention")).collect();
        assert_eq!(attention.len(), *attention_launches, "{}", program.name);
        let on_fragments = |l: &&plan::Launch| l.spec.fragments() == (l.spec.kind() != "attention" && !*wide);
        assert!(attention.iter().all(on_fragments), "{}: attention's tiling", program.name);
        for ((l, (name, source)), (_, f32_source)) in p.launches.iter().zip(&files).zip(&f32_files) {
            assert!(manifest.launches.iter().all(|i| i.bindings.iter().all(|b| b.dtype == "f32")), "{name}");
            if l.spec.fragments() {
                assert!(source.contains(fragment) && source.contains("wmma::mma_sync"), "{name}: no TF32 product");
                assert!(source.contains("__float_to_tf32("), "{name}: operands not rounded to TF32");
            } else {
                assert_eq!(source, f32_source, "{name}: not the f32 kernel");
            }
        }
    }
    let dims = bind::default_dims(&iha.program).unwrap();
    let p = plan::plan(&iha.program, &dims).in_dtype(plan::Dtype::Tf32);
    let err = emit::emit(&p, emit::Target::Wgsl).err().expect("tf32 WGSL is refused");
    assert!(err.contains("TF32"), "{err}");
}
