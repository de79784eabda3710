//! An independent float64 implementation of docs/semantics.md §1–2, written
//! directly from the equations with nested vectors (not through the IR or the
//! interpreter), checked against the interpreter and against `attnc run`.

mod common;

use attnc_runtime::io::{decode, encode, FileDtype};
use attnc_runtime::rng::Rng;
use attnc_runtime::Tensor;
use common::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

type M = Vec<Vec<f64>>; // [rows][cols]

fn mat(t: &Tensor, rows: usize, cols: usize, offset: usize) -> M {
    (0..rows).map(|r| t.data[offset + r * cols..offset + (r + 1) * cols].to_vec()).collect()
}

/// Columns `c0..c0+w` of `a`.
fn cols(a: &M, c0: usize, w: usize) -> M {
    a.iter().map(|row| row[c0..c0 + w].to_vec()).collect()
}

fn mul(a: &M, b: &M) -> M {
    let inner = b.len();
    (0..a.len()).map(|i| (0..b[0].len()).map(|j| (0..inner).map(|k| a[i][k] * b[k][j]).sum()).collect()).collect()
}

#[derive(Clone, Copy, Debug)]
enum Vis {
    None,
    Causal,
    TokenCausal,
}

/// docs/semantics.md §2 step 4 (and §1 with P = 1): can virtual query `i` see virtual key `j`?
fn sees(vis: Vis, p: usize, window: Option<usize>, i: usize, j: usize) -> bool {
    let (n, m) = (i / p, j / p);
    match vis {
        Vis::None => window.is_none_or(|w| (n as i64 - m as i64).abs() < w as i64),
        Vis::Causal => j <= i && window.is_none_or(|w| (i as i64 - (w * p) as i64) < j as i64),
        Vis::TokenCausal => m <= n && window.is_none_or(|w| n - m < w),
    }
}

/// softmax(Q Kᵀ / √d + mask) V over a sequence of virtual rows.
fn sdpa(q: &M, k: &M, v: &M, vis: Vis, p: usize, window: Option<usize>) -> M {
    let d = q[0].len() as f64;
    q.iter()
        .enumerate()
        .map(|(i, qi)| {
            let logits: Vec<Option<f64>> = k
                .iter()
                .enumerate()
                .map(|(j, kj)| {
                    sees(vis, p, window, i, j).then(|| qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() / d.sqrt())
                })
                .collect();
            let max = logits.iter().flatten().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = logits.iter().map(|l| l.map_or(0.0, |l| (l - max).exp())).collect();
            let total: f64 = weights.iter().sum();
            (0..v[0].len()).map(|c| weights.iter().zip(v).map(|(w, vr)| w * vr[c]).sum::<f64>() / total).collect()
        })
        .collect()
}

/// Rotate-half RoPE at positions 0, 1, 2, … of the rows.
fn rope(a: &M, base: f64) -> M {
    a.iter()
        .enumerate()
        .map(|(pos, row)| {
            let d = row.len();
            let mut out = row.clone();
            for i in 0..d / 2 {
                let th = pos as f64 / base.powf(2.0 * i as f64 / d as f64);
                out[i] = row[i] * th.cos() - row[i + d / 2] * th.sin();
                out[i + d / 2] = row[i] * th.sin() + row[i + d / 2] * th.cos();
            }
            out
        })
        .collect()
}

struct Layer {
    h: usize,
    hkv: usize,
    p: usize,
    d: usize,
}

/// docs/semantics.md §2 for one batch row `x` ([N][D]); with P = 1, identity α and R = I it is §1.
#[allow(clippy::too_many_arguments)]
fn iha_ref(
    l: &Layer,
    x: &M,
    w: &BTreeMap<String, Tensor>,
    vis: Vis,
    window: Option<usize>,
    per_head: bool,
    rope_base: Option<f64>,
) -> M {
    let (h, p, d, n) = (l.h, l.p, l.d, x.len());
    let dm = x[0].len();
    let proj = |name: &str, heads: usize| -> Vec<M> {
        let wm = mat(&w[name], dm, heads * d, 0);
        (0..heads).map(|m| mul(x, &cols(&wm, m * d, d))).collect()
    };
    let (q, k, v) = (proj("w_q", h), proj("w_k", l.hkv), proj("w_v", l.hkv));
    let alpha = |name: &str, m: usize, hh: usize, j: usize| w[name].data[(m * h + hh) * p + j];
    let mut heads_out: Vec<Vec<M>> = Vec::new(); // [h][j] -> N×d
    for hh in 0..h {
        let g = hh / (h / l.hkv);
        // Pseudo-heads (step 2), interleaved token-major (step 3): row n·P + j.
        let mut rows = [vec![], vec![], vec![]];
        for t in 0..n {
            for j in 0..p {
                for (which, src, name) in [(0, &q, "alpha_q"), (1, &k, "alpha_k"), (2, &v, "alpha_v")] {
                    let row: Vec<f64> = if w.contains_key(name) {
                        (0..d).map(|e| (0..h).map(|m| alpha(name, m, hh, j) * src[m][t][e]).sum()).collect()
                    } else {
                        src[if which == 0 { hh } else { g }][t].clone()
                    };
                    rows[which].push(row);
                }
            }
        }
        let [mut qt, mut kt, vt] = rows;
        if let Some(base) = rope_base {
            qt = rope(&qt, base);
            kt = rope(&kt, base);
        }
        let ot = sdpa(&qt, &kt, &vt, vis, p, window);
        heads_out.push((0..p).map(|j| (0..n).map(|t| ot[t * p + j].clone()).collect()).collect());
    }
    // Step 5: collapse; step 6: output projection.
    let wo = mat(&w["w_o"], h * d, dm, 0);
    let mut y = vec![vec![0.0; dm]; n];
    for hh in 0..h {
        let mut o = vec![vec![0.0; d]; n];
        for (h2, per) in heads_out.iter().enumerate() {
            for (j, oj) in per.iter().enumerate() {
                let coeff = match w.get("r") {
                    Some(r) if !per_head || h2 == hh => r.data[hh * h * p + h2 * p + j],
                    Some(_) => 0.0,
                    None => f64::from(u8::from(h2 == hh)),
                };
                for t in 0..n {
                    for e in 0..d {
                        o[t][e] += coeff * oj[t][e];
                    }
                }
            }
        }
        let part = mul(&o, &wo[hh * d..(hh + 1) * d].to_vec());
        for t in 0..n {
            for c in 0..dm {
                y[t][c] += part[t][c];
            }
        }
    }
    y
}

fn reference(
    l: &Layer,
    b: usize,
    inputs: &BTreeMap<String, Tensor>,
    vis: Vis,
    window: Option<usize>,
    per_head: bool,
    rope: Option<f64>,
) -> Tensor {
    let x = &inputs["x"];
    let (n, dm) = (x.shape[1], x.shape[2]);
    let data = (0..b)
        .flat_map(|bi| iha_ref(l, &mat(x, n, dm, bi * n * dm), inputs, vis, window, per_head, rope).concat())
        .collect();
    Tensor::new(vec![b, n, dm], data)
}

#[derive(Clone, Debug)]
struct Case {
    b: usize,
    n: usize,
    dm: usize,
    h: usize,
    p: usize,
    d: usize,
    mask: usize,
    window: Option<usize>,
    per_head: bool,
    rope: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        1..=2usize,
        1..=7usize,
        1..=9usize,
        1..=3usize,
        1..=3usize,
        1..=3usize,
        0..3usize,
        prop::option::of(1..=3usize),
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(b, n, dm, h, p, hd, mask, window, per_head, rope, seed)| Case {
            b,
            n,
            dm,
            h,
            p,
            d: 2 * hd,
            mask,
            window,
            per_head,
            rope,
            seed,
        })
}

fn iha_inputs(c: &Case) -> BTreeMap<String, Tensor> {
    let mut rng = Rng::for_input(c.seed, "reference");
    let (h, p, d, dm) = (c.h, c.p, c.d, c.dm);
    named(vec![
        ("x", random(&mut rng, &[c.b, c.n, dm])),
        ("w_q", random(&mut rng, &[dm, h * d])),
        ("w_k", random(&mut rng, &[dm, h * d])),
        ("w_v", random(&mut rng, &[dm, h * d])),
        ("w_o", random(&mut rng, &[h * d, dm])),
        ("alpha_q", random(&mut rng, &[h, h, p])),
        ("alpha_k", random(&mut rng, &[h, h, p])),
        ("alpha_v", random(&mut rng, &[h, h, p])),
        ("r", random(&mut rng, &[h, h * p])),
    ])
}

fn iha_sets(c: &Case) -> Vec<(&'static str, String)> {
    let mut s = vec![
        ("H", c.h.to_string()),
        ("P", c.p.to_string()),
        ("d", c.d.to_string()),
        ("mask", ["none", "flat_causal", "token_causal"][c.mask].to_string()),
        ("collapse", if c.per_head { "per_head" } else { "global" }.to_string()),
    ];
    if let Some(w) = c.window {
        s.push(("window", w.to_string()));
    }
    if c.rope {
        s.push(("rope", "50.0".to_string()));
    }
    s
}

const VIS: [Vis; 3] = [Vis::None, Vis::Causal, Vis::TokenCausal];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn interpreter_matches_iha_equations(c in case()) {
        let inputs = iha_inputs(&c);
        let layer = Layer { h: c.h, hkv: c.h, p: c.p, d: c.d };
        let want = reference(&layer, c.b, &inputs, VIS[c.mask], c.window, c.per_head, c.rope.then_some(50.0));
        let got = &eval(&compile_stdlib("iha", &iha_sets(&c)), &inputs)["y"];
        assert_close(got, &want, 1e-10, "iha interpreter vs equations");
    }

    #[test]
    fn interpreter_matches_mha_equations(c in case(), kv_div in 0..3usize) {
        let hkv = [c.h, 1, if c.h % 2 == 0 { c.h / 2 } else { c.h }][kv_div];
        let mut inputs = iha_inputs(&c);
        let mut rng = Rng::for_input(c.seed, "kv");
        for name in ["w_k", "w_v"] {
            inputs.insert(name.into(), random(&mut rng, &[c.dm, hkv * c.d]));
        }
        for name in ["alpha_q", "alpha_k", "alpha_v", "r"] {
            inputs.remove(name);
        }
        let causal = c.mask != 0;
        let layer = Layer { h: c.h, hkv, p: 1, d: c.d };
        let want = reference(&layer, c.b, &inputs, if causal { Vis::Causal } else { Vis::None }, c.window, false, None);
        let mut sets = vec![("H", c.h.to_string()), ("H_kv", hkv.to_string()), ("d", c.d.to_string()), ("mask", if causal { "causal" } else { "none" }.to_string())];
        if let Some(w) = c.window {
            sets.push(("window", w.to_string()));
        }
        let got = &eval(&compile_stdlib("mha", &sets), &inputs)["y"];
        assert_close(got, &want, 1e-10, "mha interpreter vs equations");
    }
}

/// `attnc run --inputs` on stdlib/iha.attn and stdlib/mha.attn reproduces the equations.
#[test]
fn cli_run_reproduces_the_equations() {
    let dir = std::env::temp_dir().join(format!("attnc-reference-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        Case { b: 2, n: 5, dm: 7, h: 3, p: 2, d: 4, mask: 1, window: None, per_head: false, rope: true, seed: 1 },
        Case { b: 1, n: 6, dm: 5, h: 2, p: 3, d: 2, mask: 2, window: Some(2), per_head: true, rope: false, seed: 2 },
        Case { b: 1, n: 4, dm: 6, h: 4, p: 1, d: 2, mask: 0, window: None, per_head: false, rope: false, seed: 3 },
    ];
    for (i, c) in cases.iter().enumerate() {
        for spec in ["iha", "mha"] {
            let mut inputs = iha_inputs(c);
            let mut sets = iha_sets(c);
            if spec == "mha" {
                for name in ["alpha_q", "alpha_k", "alpha_v", "r"] {
                    inputs.remove(name);
                }
                sets = vec![
                    ("H", c.h.to_string()),
                    ("d", c.d.to_string()),
                    ("mask", if c.mask == 0 { "none" } else { "causal" }.into()),
                ];
            }
            let inp = dir.join(format!("in{i}{spec}.safetensors"));
            let out = dir.join(format!("out{i}{spec}.safetensors"));
            let list: Vec<(String, &Tensor)> = inputs.iter().map(|(k, v)| (k.clone(), v)).collect();
            std::fs::write(&inp, encode(&list, FileDtype::F64).unwrap()).unwrap();
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_attnc"));
            cmd.arg("run")
                .arg(root().join(format!("stdlib/{spec}.attn")))
                .arg("--inputs")
                .arg(&inp)
                .arg("--out")
                .arg(&out)
                .args(["--dtype", "f64"]);
            for (k, v) in &sets {
                cmd.arg("--set").arg(format!("{k}={v}"));
            }
            let status = cmd.output().unwrap();
            assert!(status.status.success(), "attnc run failed: {}", String::from_utf8_lossy(&status.stderr));
            let got = decode(&std::fs::read(&out).unwrap()).unwrap().remove("y").expect("output y");
            let want = if spec == "iha" {
                let layer = Layer { h: c.h, hkv: c.h, p: c.p, d: c.d };
                reference(&layer, c.b, &inputs, VIS[c.mask], c.window, c.per_head, c.rope.then_some(50.0))
            } else {
                let layer = Layer { h: c.h, hkv: c.h, p: 1, d: c.d };
                reference(&layer, c.b, &inputs, if c.mask == 0 { Vis::None } else { Vis::Causal }, None, false, None)
            };
            assert_close(&got, &want, 1e-10, &format!("attnc run {spec} case {i}"));
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
