//! The built-in masks' closed-form bands ([`mask::key_rows`],
//! [`mask::key_rows_all`], [`mask::query_rows`] and the tiles they give)
//! held to the IR's one definition, `ir::Mask::visible`, and to the
//! interval-arithmetic tile functions (`sparsity`) of the same mask lowered
//! into a mask function: the tile walks of a built-in mask and of its mask
//! function skip the same tiles. The bands run on the device (lavapipe), as
//! the kernels run them.

use super::mask::{self, key_rows, key_rows_all, query_rows, tiles_of, whole_tiles_of, Mask};
use crate::gpu::exec::Gpu;
use crate::interp::func::{call, Env, FVal};
use attnc_compiler::ir::{Mask as IrMask, MaskKind, Op};
use cubecl::prelude::*;

/// Per query tile `u` (rows `u · bq ..`): the key tiles some row sees and
/// the key tiles every row sees whole, at `4u ..`; per key tile `u`: the
/// query tiles some row of which sees it, at `4 · query tiles + 2u ..`.
#[cube(launch_unchecked)]
fn probe(out: &mut [u32], #[comptime] m: Mask, #[comptime] tiles: (usize, usize)) {
    let (bq, bk) = comptime![tiles];
    let (nq, nk) = comptime![(m.s.div_ceil(bq), m.sk.div_ceil(bk))];
    let u = UNIT_POS as usize;
    if u < nq {
        let q0 = u * bq;
        let q1 = min(q0 + comptime![bq - 1], comptime![m.s - 1]);
        let some = tiles_of(key_rows(q0, q1, m), bk);
        let all = whole_tiles_of(key_rows_all(q0, q1, m), comptime![nk + 1], bk);
        out[u * 4] = u32::cast_from(some.lo);
        out[u * 4 + 1] = u32::cast_from(some.hi);
        out[u * 4 + 2] = u32::cast_from(all.lo);
        out[u * 4 + 3] = u32::cast_from(all.hi);
    }
    if u < nk {
        let j0 = u * bk;
        let j1 = min(j0 + comptime![bk - 1], comptime![m.sk - 1]);
        let seen = tiles_of(query_rows(j0, j1, m), bq);
        let at = comptime![nq * 4] + u * 2;
        out[at] = u32::cast_from(seen.lo);
        out[at + 1] = u32::cast_from(seen.hi);
    }
}

/// The tiles `lo .. hi` as a set (none where `hi ≤ lo`).
fn range(lo: u32, hi: u32) -> Vec<usize> {
    (lo as usize..(hi as usize).max(lo as usize)).collect()
}

/// The smallest run of tiles holding `set` (what a band can say), and whether `set` is that run.
fn hull(set: &[usize]) -> (Vec<usize>, bool) {
    match (set.first(), set.last()) {
        (Some(&a), Some(&b)) => ((a..=b).collect(), set.len() == b - a + 1),
        _ => (vec![], true),
    }
}

/// Over every built-in mask × window × block × lengths (`M = N`, `M < N`,
/// `M > N`, whole tokens) × tile sizes: the kernels' key band of each query tile is
/// exactly the key tiles some of its pairs see (`Mask::visible`, pair by
/// pair), its whole band exactly the complete key tiles all of whose pairs
/// are seen, and the query band of each key tile exactly the query tiles
/// that see it. With one row a token (what `lengths` and one-sided windows
/// lower), the same mask written as a mask function gives tile functions
/// that call exactly the tiles outside the band empty and the whole tiles
/// full. 1,000-odd configurations, each a launch.
#[test]
fn built_in_bands_are_the_visible_tiles_and_the_mask_functions_tiles() {
    let gpu = Gpu::wgpu().unwrap_or_else(|e| panic!("this test needs a device: {e}"));
    let client = gpu.client();
    let (mut checked, mut with_fns) = (0, 0);
    for kind in [MaskKind::None, MaskKind::Causal, MaskKind::TokenCausal] {
        for window in [None, Some(1u64), Some(2), Some(5)] {
            for block in [1u64, 3] {
                if kind == MaskKind::None && window.is_none() && block > 1 {
                    continue;
                }
                // Lengths in tokens of `block` rows (attention refuses others).
                for (ts, tk) in [(37usize, 37usize), (64, 64), (5, 70), (70, 29), (1, 100), (33, 96)] {
                    let (s, sk) = (ts * block as usize, tk * block as usize);
                    let ir = IrMask { kind, window, block };
                    let fns = (block == 1).then(|| tile_functions(&ir, s, sk));
                    for (bq, bk) in [(8usize, 16usize), (32, 8), (5, 7), (16, 64)] {
                        let m = Mask {
                            kind: mask::mask_code(kind),
                            window: window.unwrap_or(0) as usize,
                            block: block as usize,
                            s,
                            sk,
                        };
                        let (nq, nk) = (s.div_ceil(bq), sk.div_ceil(bk));
                        let len = nq * 4 + nk * 2;
                        let out = client.empty(len * 4);
                        unsafe {
                            probe::launch_unchecked(
                                client,
                                CubeCount::Static(1, 1, 1),
                                CubeDim::new_1d(nq.max(nk) as u32),
                                BufferArg::from_raw_parts(out.clone(), len),
                                m,
                                (bq, bk),
                            )
                        };
                        let got = u32::from_bytes(&client.read_one_unchecked(out)).to_vec();
                        let what = format!("{ir:?} M = {s} N = {sk}, tiles {bq} x {bk}");
                        let seen = |i: usize, j: usize| ir.visible(i as u64, j as u64, s as u64, sk as u64);
                        let rows = |t: usize, b: usize, n: usize| t * b..((t + 1) * b).min(n);
                        for qt in 0..nq {
                            let pairs =
                                |kt: usize| rows(qt, bq, s).flat_map(move |i| rows(kt, bk, sk).map(move |j| (i, j)));
                            let some: Vec<usize> = (0..nk).filter(|&kt| pairs(kt).any(|(i, j)| seen(i, j))).collect();
                            let whole: Vec<usize> = (0..nk)
                                .filter(|&kt| (kt + 1) * bk <= sk && pairs(kt).all(|(i, j)| seen(i, j)))
                                .collect();
                            let (band, runs) = hull(&some);
                            assert!(runs, "{what}: query tile {qt} sees key tiles {some:?}, not one run");
                            assert_eq!(
                                range(got[qt * 4], got[qt * 4 + 1]),
                                band,
                                "{what}: key band of query tile {qt}"
                            );
                            let (full, runs) = hull(&whole);
                            assert!(runs, "{what}: query tile {qt} sees key tiles {whole:?} whole, not one run");
                            assert_eq!(
                                range(got[qt * 4 + 2], got[qt * 4 + 3]),
                                full,
                                "{what}: whole band of query tile {qt}"
                            );
                            if let Some((any, hidden, dims)) = &fns {
                                for kt in 0..nk {
                                    let (q, k) = (rows(qt, bq, s), rows(kt, bk, sk));
                                    let args =
                                        [0, 0, q.start, q.end - 1, k.start, k.end - 1].map(|x| FVal::Int(x as i64));
                                    let env = Env { captures: vec![], dims };
                                    let may_see = call(any, &args, &env, [0; 4]).unwrap() == FVal::Bool(true);
                                    let may_hide = call(hidden, &args, &env, [0; 4]).unwrap() == FVal::Bool(true);
                                    assert_eq!(may_see, band.contains(&kt), "{what}: tile ({qt}, {kt}) empty or not");
                                    let complete = (kt + 1) * bk <= sk;
                                    if complete {
                                        assert_eq!(
                                            !may_hide,
                                            full.contains(&kt),
                                            "{what}: tile ({qt}, {kt}) full or not"
                                        );
                                    }
                                }
                                with_fns += 1;
                            }
                        }
                        for kt in 0..nk {
                            let pairs =
                                |qt: usize| rows(qt, bq, s).flat_map(move |i| rows(kt, bk, sk).map(move |j| (i, j)));
                            let seen_by: Vec<usize> =
                                (0..nq).filter(|&qt| pairs(qt).any(|(i, j)| seen(i, j))).collect();
                            let (band, runs) = hull(&seen_by);
                            assert!(runs, "{what}: key tile {kt} is seen by query tiles {seen_by:?}, not one run");
                            let at = nq * 4 + kt * 2;
                            assert_eq!(range(got[at], got[at + 1]), band, "{what}: query band of key tile {kt}");
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(
        checked > 400 && with_fns > 1000,
        "{checked} configurations, {with_fns} query tiles against tile functions"
    );
}

/// The tile functions (`any`, `hidden`) of `mask` lowered into a mask
/// function, as a spec with `window_right` (which changes no key here) lowers it.
fn tile_functions(
    mask: &IrMask,
    s: usize,
    sk: usize,
) -> (attnc_compiler::ir::Func, attnc_compiler::ir::Func, attnc_compiler::ir::DimValues) {
    let name = match mask.kind {
        MaskKind::None => "none",
        MaskKind::Causal => "causal",
        MaskKind::TokenCausal => "token_causal",
    };
    let window = mask.window.map_or(String::new(), |w| format!(", window = {w}"));
    let text = format!(
        "spec bands\ndim M = {s}\ndim N = {sk}\ninput q: [1, 1, M, 4]\ninput k: [1, 1, N, 4]\ninput v: [1, 1, N, 4]\n\
         output o = attention(q, k, v, mask = {name}{window}, window_right = {})\n",
        s + sk
    );
    let c = attnc_compiler::compile(&text, &[])
        .unwrap_or_else(|e| panic!("{}", attnc_compiler::render("bands.attn", &text, &e)));
    let dims = crate::bind::default_dims(&c.program).unwrap();
    let f = c.program.nodes.iter().find_map(|n| match &n.op {
        Op::Attention { fns: Some(f), mask, .. } => {
            assert_eq!(mask.kind, MaskKind::None, "the built-in mask is lowered into the function");
            f.mask.clone()
        }
        _ => None,
    });
    let m = f.expect("a mask function").resolve(&dims);
    let t = attnc_compiler::sparsity::tile_fns(&m);
    (t.any.resolve(&dims), t.hidden.resolve(&dims), dims)
}
