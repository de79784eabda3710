//! Golden emitted source: for every stdlib spec at a small fixed size, the
//! WGSL and CUDA of every kernel and the manifest, produced without a device.
//! Kernels are named by the plan, so the text is the same in debug and release.

mod common;

use attnc_runtime::bind;
use attnc_runtime::gpu::{emit, group::GroupStep, plan};
use common::*;

fn small(spec: &str) -> Vec<(&'static str, String)> {
    let s: &[(&'static str, &str)] = match spec {
        "iha" => &[("H", "2"), ("P", "2"), ("d", "4"), ("N", "5"), ("rope", "10000.0")],
        "mha" | "gqa" => &[("H", "2"), ("H_kv", "1"), ("d", "4"), ("N", "5")],
        "mqa" => &[("H", "2"), ("d", "4"), ("N", "5")],
        "gdpo" => &[("B", "2"), ("G", "3"), ("C", "2")],
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

/// Attention reads split heads and interleaved pseudo-heads in place and
/// writes merged heads or the deinterleaved layout directly: MHA, GQA and MQA
/// plan no copy launch (four GEMMs and the attention), and IHA none around
/// its attention.
#[test]
fn attention_reads_and_writes_head_layouts_in_place() {
    for spec in ["mha", "gqa", "mqa", "iha"] {
        let c = compile_stdlib(spec, &small(spec).into_iter().filter(|(k, _)| *k != "rope").collect::<Vec<_>>());
        let dims = bind::default_dims(&c.program).unwrap();
        let p = plan::plan(&c.program, &dims);
        let kinds: Vec<&str> = p.launches.iter().map(|l| l.spec.kind()).collect();
        if spec == "iha" {
            // Only the head splits before mixing and the merge after collapsing remain.
            assert_eq!(kinds.iter().filter(|k| **k == "gather").count(), 4, "{spec}: {kinds:?}");
            let at = kinds.iter().position(|k| *k == "attention").unwrap();
            assert_eq!([kinds[at - 1], kinds[at + 1]], ["mix_heads", "collapse"], "{spec}: {kinds:?}");
        } else {
            assert_eq!(kinds, ["matmul", "matmul", "matmul", "attention", "matmul"], "{spec}");
        }
    }
}

/// The row views attention reads and writes in place address exactly what
/// the copy launches they replace would have gathered: `split_heads` and
/// `interleave` (and so `merge_heads` and `deinterleave`, their inverses).
#[test]
fn row_views_address_what_the_layout_copies_gather() {
    let (b, h, p, s, w) = (2, 3, 4, 5, 8);
    // split_heads of [b, s, h·w] → [b, h, s, w]: the gather's view, as the planner builds it.
    let split = plan::View::new(&[b, h, s, w], &[s * h * w, w, h * w, 1], 0);
    let merged = plan::RowView::merged(h, s, w);
    // interleave of [b, h, p, s, w] → [b, h, s·p, w].
    let inter = plan::View::new(&[b, h, s, p, w], &[h * p * s * w, p * s * w, w, s * w, 1], 0);
    let pseudo = plan::RowView::pseudo(h, p, s, w);
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
                    assert!(t.unit_rows * t.key_tile * (dl + el) <= 2048 || t.key_tile == 4, "{what}");
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
    assert_eq!(AttnTiles::new(16, 16, 1024, 1024, false, 0), AttnTiles { unit_rows: 8, key_tile: 8 });
    assert_eq!(AttnTiles::new(16, 16, 1024, 1024, true, 0), AttnTiles { unit_rows: 4, key_tile: 16 });
}
