//! Head mixing inside attention (Talking-Heads Attention, docs/semantics.md
//! §7): the interpreter against an independent float64 implementation of
//! the paper's equations, which materialises every logit (`J`, `L`, `W`,
//! `U` of Shazeer et al., 2020) with nested vectors, and the paper's
//! identities; gradients are checked by central differences in
//! `tests/gradients.rs`.

mod common;

use attnc_runtime::rng::Rng;
use attnc_runtime::Tensor;
use common::*;
use std::collections::BTreeMap;

/// One configuration: query, key, softmax, output and value heads.
#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    hq: usize,
    hk: usize,
    hs: usize,
    ho: usize,
    hv: usize,
    d: usize,
    e: usize,
    m: usize,
    n: usize,
    causal: bool,
    window: Option<usize>,
    logits: bool,
    probs: bool,
    /// `score = |s, ...| c · tanh(s / c)` (softcapping).
    softcap: Option<f64>,
    /// `mask = |b, h, i, j| abs(i - j) <= h + 1` (per softmax head) instead of the built-in mask.
    band: bool,
}

impl Case {
    fn source(&self) -> String {
        let Case { b, hq, hk, hs, ho, hv, d, e, m, n, .. } = *self;
        let mut args = String::new();
        match (self.band, self.causal) {
            (true, _) => args.push_str(", mask = |b, h, i, j| abs(i - j) <= h + 1"),
            (false, true) => args.push_str(", mask = causal"),
            (false, false) => args.push_str(", mask = none"),
        }
        if let Some(w) = self.window {
            args.push_str(&format!(", window = {w}"));
        }
        if let Some(c) = self.softcap {
            args.push_str(&format!(", score = |s, b, h, i, j| {c:?} * tanh(s / {c:?})"));
        }
        let mut decls = String::new();
        if self.logits {
            decls.push_str(&format!("input wl: [{hq}, {hs}]\n"));
            args.push_str(", mix_logits = wl");
        }
        if self.probs {
            decls.push_str(&format!("input wp: [{hs}, {ho}]\n"));
            args.push_str(", mix_probs = wp");
        }
        format!(
            "spec th\ndim B = {b}\ndim M = {m}\ndim N = {n}\ninput q: [B, {hq}, M, {d}]\n\
             input k: [B, {hk}, N, {d}]\ninput v: [B, {hv}, N, {e}]\n{decls}\
             output o = attention(q, k, v{args})\n"
        )
    }

    fn inputs(&self, seed: u64) -> BTreeMap<String, Tensor> {
        let Case { b, hq, hk, hs, ho, hv, d, e, m, n, .. } = *self;
        let mut rng = Rng::for_input(seed, "head mixing");
        // Large enough logits that the softmax is far from uniform.
        let mut big = |shape: &[usize]| {
            let mut t = random(&mut rng, shape);
            t.data.iter_mut().for_each(|x| *x *= 2.5);
            t
        };
        let mut out = named(vec![("q", big(&[b, hq, m, d])), ("k", big(&[b, hk, n, d])), ("v", big(&[b, hv, n, e]))]);
        if self.logits {
            out.insert("wl".into(), big(&[hq, hs]));
        }
        if self.probs {
            out.insert("wp".into(), big(&[hs, ho]));
        }
        out
    }

    /// Whether softmax head `h`'s query row `i` sees key row `j`.
    fn sees(&self, h: usize, i: usize, j: usize) -> bool {
        if self.band {
            return i.abs_diff(j) <= h + 1;
        }
        // Bottom-right alignment: query row i stands at key position i + N − M.
        let (i, j) = (i as i64 + self.n as i64 - self.m as i64, j as i64);
        let w = self.window.map_or(i64::MAX, |w| w as i64);
        match self.causal {
            true => j <= i && i - j < w,
            false => (i - j).abs() < w,
        }
    }
}

type Mat = Vec<Vec<f64>>;

/// Talking-Heads Attention from the paper's equations: per batch, logits
/// `J[m] = f(scale · Q[m] K[kv(m)]ᵀ)`, `L[h] = Σ_m J[m] · P_l[m, h]`,
/// `W[h] = softmax(L[h])` over the keys each row sees, `U[g] = Σ_h W[h] · P_w[h, g]`,
/// `O[g] = U[g] V[kv(g)]`.
fn reference(c: &Case, x: &BTreeMap<String, Tensor>) -> Tensor {
    let Case { b, hq, hk, hs, ho, hv, d, e, m, n, .. } = *c;
    let scale = 1.0 / (d as f64).sqrt();
    let at = |t: &Tensor, idx: [usize; 4]| {
        let s = &t.shape;
        t.data[((idx[0] * s[1] + idx[1]) * s[2] + idx[2]) * s[3] + idx[3]]
    };
    let eye = |r: usize, col: usize| f64::from(r == col);
    let wl = |r: usize, col: usize| x.get("wl").map_or(eye(r, col), |w| w.data[r * hs + col]);
    let wp = |r: usize, col: usize| x.get("wp").map_or(eye(r, col), |w| w.data[r * ho + col]);
    let mut out = Tensor::zeros(vec![b, ho, m, e]);
    for bi in 0..b {
        let j_logits: Vec<Mat> = (0..hq)
            .map(|h| {
                let g = h / (hq / hk);
                (0..m)
                    .map(|i| {
                        (0..n)
                            .map(|j| {
                                let s = scale
                                    * (0..d)
                                        .map(|t| at(&x["q"], [bi, h, i, t]) * at(&x["k"], [bi, g, j, t]))
                                        .sum::<f64>();
                                c.softcap.map_or(s, |cap| cap * (s / cap).tanh())
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let weights: Vec<Mat> = (0..hs)
            .map(|h| {
                (0..m)
                    .map(|i| {
                        let l: Vec<Option<f64>> = (0..n)
                            .map(|j| c.sees(h, i, j).then(|| (0..hq).map(|mm| j_logits[mm][i][j] * wl(mm, h)).sum()))
                            .collect();
                        let max = l.iter().flatten().copied().fold(f64::NEG_INFINITY, f64::max);
                        let z: f64 = l.iter().flatten().map(|s| (s - max).exp()).sum();
                        l.iter().map(|s| s.map_or(0.0, |s| (s - max).exp() / z)).collect()
                    })
                    .collect()
            })
            .collect();
        for g in 0..ho {
            for i in 0..m {
                for j in 0..n {
                    let u: f64 = (0..hs).map(|h| weights[h][i][j] * wp(h, g)).sum();
                    for t in 0..e {
                        out.data[((bi * ho + g) * m + i) * e + t] += u * at(&x["v"], [bi, g / (ho / hv), j, t]);
                    }
                }
            }
        }
    }
    out
}

fn cases() -> Vec<Case> {
    let base = Case {
        b: 1,
        hq: 4,
        hk: 4,
        hs: 4,
        ho: 4,
        hv: 4,
        d: 8,
        e: 8,
        m: 13,
        n: 13,
        causal: true,
        window: None,
        logits: true,
        probs: true,
        softcap: None,
        band: false,
    };
    vec![
        base,
        Case { causal: false, b: 2, d: 5, e: 3, ..base },
        // Decode-like: fewer queries than keys; and more (the first rows see nothing).
        Case { m: 5, n: 17, window: Some(6), ..base },
        Case { m: 11, n: 6, ..base },
        Case { causal: false, window: Some(3), probs: false, ..base },
        Case { logits: false, hk: 2, hv: 1, ..base },
        // Rectangular: 3 query heads, 5 softmax heads, 2 output heads (GQA on both sides).
        Case { hq: 3, hk: 1, hs: 5, ho: 2, hv: 1, e: 6, ..base },
        Case { hq: 2, hk: 2, hs: 6, ho: 6, hv: 3, softcap: Some(1.5), m: 9, n: 14, ..base },
        Case { band: true, softcap: Some(2.0), hs: 3, ho: 2, hv: 2, ..base },
    ]
}

#[test]
fn the_interpreter_follows_the_papers_equations() {
    for (i, case) in cases().into_iter().enumerate() {
        let src = case.source();
        let c = attnc_compiler::compile(&src, &[]).unwrap_or_else(|d| panic!("{src}\n{d:?}"));
        let x = case.inputs(100 + i as u64);
        let got = &eval(&c, &x)["o"];
        let want = reference(&case, &x);
        assert!(want.data.iter().any(|v| v.abs() > 0.1), "{case:?}: a degenerate reference");
        let e = attnc_runtime::relative_error(&got.data, &want.data);
        assert!(e <= 1e-12, "{case:?}: relative error {e:e}");
        let worst = got.data.iter().zip(&want.data).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst <= 1e-12, "{case:?}: an element differs by {worst:e}");
    }
}

/// The paper's identities: identity matrices give plain attention, and a
/// permutation of the softmax heads (mix_logits = P, mix_probs = Pᵀ)
/// changes nothing.
#[test]
fn identity_and_permutation_mixing_are_plain_attention() {
    let case = Case { hq: 4, hk: 2, hs: 4, ho: 4, hv: 2, ..cases()[0] };
    let plain = Case { logits: false, probs: false, ..case };
    let c_plain = attnc_compiler::compile(&plain.source(), &[]).unwrap();
    let c_mixed = attnc_compiler::compile(&case.source(), &[]).unwrap();
    let mut x = case.inputs(7);
    let want = eval(&c_plain, &plain.inputs(7))["o"].clone();
    assert_eq!(x["q"].data, plain.inputs(7)["q"].data, "the same draws");
    let perm = [2, 0, 3, 1];
    for (name, matrix) in [("identity", [0, 1, 2, 3]), ("permutation", perm)] {
        let p: Vec<f64> = (0..16).map(|r| f64::from(matrix[r / 4] == r % 4)).collect();
        let pt: Vec<f64> = (0..16).map(|r| f64::from(matrix[r % 4] == r / 4)).collect();
        x.insert("wl".into(), Tensor::new(vec![4, 4], p));
        x.insert("wp".into(), Tensor::new(vec![4, 4], pt));
        let got = &eval(&c_mixed, &x)["o"];
        let e = attnc_runtime::relative_error(&got.data, &want.data);
        assert!(e <= 1e-14, "{name}: relative error {e:e}");
    }
}

#[test]
fn mixing_matrices_of_the_wrong_shape_are_refused() {
    let case = cases()[0];
    let bad = case.source().replace("input wp: [4, 4]", "input wp: [3, 4]");
    let d = attnc_compiler::compile(&bad, &[]).unwrap_err();
    let text = attnc_compiler::render("th.attn", &bad, &d);
    assert!(text.contains("mix_probs (softmax heads × output heads) must have shape [4, H_o], not [3, 4]"), "{text}");
    let bad = case.source().replace("input wl: [4, 4]", "input wl: [4, 4, 1]");
    let text = attnc_compiler::render("th.attn", &bad, &attnc_compiler::compile(&bad, &[]).unwrap_err());
    assert!(text.contains("mix_logits (query heads × softmax heads) must have shape [4, H_s]"), "{text}");
}

/// `stdlib/diff.attn` against the Differential Transformer's equations
/// written out per head: `(softmax(Q1 K1ᵀ/√d) − λ softmax(Q2 K2ᵀ/√d)) V`,
/// λ re-parametrised, RMS-normalised over the head's 2d channels, scaled by
/// `1 − λ_init`, heads concatenated and projected.
#[test]
fn differential_attention_follows_the_papers_equations() {
    for (seed, (h, d, n, layer, causal)) in
        [(2, 3, 11, 1, true), (3, 2, 7, 4, false), (1, 4, 5, 2, true)].into_iter().enumerate()
    {
        let sets: Vec<(&str, String)> = vec![
            ("H", h.to_string()),
            ("d", d.to_string()),
            ("N", n.to_string()),
            ("layer", layer.to_string()),
            ("mask", if causal { "causal" } else { "none" }.to_string()),
        ];
        let c = compile_stdlib("diff", &sets);
        let (drawn, _) = attnc_runtime::bind::generate_inputs(&c.program, 20 + seed as u64).unwrap();
        let x: BTreeMap<String, Tensor> = c.program.inputs.iter().map(|i| i.name.clone()).zip(drawn).collect();
        let got = &eval(&c, &x)["y"];
        let width = 2 * h * d;
        let mat = |name: &str, rows: usize, cols: usize| -> Mat {
            (0..rows).map(|r| x[name].data[r * cols..(r + 1) * cols].to_vec()).collect()
        };
        let mul = |a: &Mat, b: &Mat| -> Mat {
            (0..a.len())
                .map(|i| (0..b[0].len()).map(|j| (0..b.len()).map(|t| a[i][t] * b[t][j]).sum()).collect())
                .collect()
        };
        let xs = mat("x", n, width);
        let (q, k, v) = (
            mul(&xs, &mat("w_q", width, width)),
            mul(&xs, &mat("w_k", width, width)),
            mul(&xs, &mat("w_v", width, width)),
        );
        let dot = |a: &str, b: &str| x[a].data.iter().zip(&x[b].data).map(|(p, q)| p * q).sum::<f64>();
        let lambda_init = 0.8 - 0.6 * (-0.3 * (layer as f64 - 1.0)).exp();
        let lam = dot("lambda_q1", "lambda_k1").exp() - dot("lambda_q2", "lambda_k2").exp() + lambda_init;
        let softmax = |head: usize| -> Mat {
            (0..n)
                .map(|i| {
                    let s: Vec<Option<f64>> = (0..n)
                        .map(|j| {
                            (!causal || j <= i).then(|| {
                                (0..d).map(|t| q[i][head * d + t] * k[j][head * d + t]).sum::<f64>() / (d as f64).sqrt()
                            })
                        })
                        .collect();
                    let max = s.iter().flatten().copied().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = s.iter().flatten().map(|x| (x - max).exp()).sum();
                    s.iter().map(|x| x.map_or(0.0, |x| (x - max).exp() / z)).collect()
                })
                .collect()
        };
        let mut concat = vec![vec![0.0; width]; n];
        for head in 0..h {
            let (a1, a2) = (softmax(head), softmax(h + head));
            for i in 0..n {
                let o: Vec<f64> = (0..2 * d)
                    .map(|c| (0..n).map(|j| (a1[i][j] - lam * a2[i][j]) * v[j][head * 2 * d + c]).sum())
                    .collect();
                let rms = (o.iter().map(|x| x * x).sum::<f64>() / (2 * d) as f64 + 1e-5).sqrt();
                for c in 0..2 * d {
                    concat[i][head * 2 * d + c] = o[c] / rms * x["gain"].data[c] * (1.0 - lambda_init);
                }
            }
        }
        let want: Vec<f64> = mul(&concat, &mat("w_o", width, width)).concat();
        let e = attnc_runtime::relative_error(&got.data, &want);
        assert!(e <= 1e-12, "diff {sets:?}: relative error {e:e}");
        assert!(want.iter().any(|v| v.abs() > 0.1), "a degenerate reference");
    }
}

/// The stdlib specs run on the interpreter and compile to kernels, forward
/// and backward; the gradient of a tensor a score function reads (next to
/// head mixing) is refused by name on the kernels, writing nothing.
#[test]
fn head_mixing_compiles_forward_and_backward() {
    let dir = std::env::temp_dir().join(format!("attnc-head-mixing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bin = env!("CARGO_BIN_EXE_attnc");
    let attnc = |args: &[&str], out: &std::path::Path, spec: &std::path::Path| {
        std::process::Command::new(bin).args(args).arg("--out").arg(out).arg(spec).output().unwrap()
    };
    let names = |dir: &std::path::Path| -> Vec<String> {
        (std::fs::read_dir(dir).unwrap()).map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
    };
    for spec in ["stdlib/talking_heads.attn", "stdlib/diff.attn"] {
        let spec = root().join(spec);
        let out = dir.join("y.safetensors");
        let o = attnc(&["run", "--seed", "3", "--set", "N=9", "--set", "H=2", "--set", "d=4"], &out, &spec);
        assert!(o.status.success() && out.exists(), "{}", String::from_utf8_lossy(&o.stderr));
        for target in ["wgsl", "cuda"] {
            let kernels = dir.join(format!("kernels-{target}"));
            let o = attnc(&["compile", "--target", target, "--set", "N=9"], &kernels, &spec);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            assert!(names(&kernels).iter().any(|n| n.contains("attention_mixed")), "{:?}", names(&kernels));
            let grads = dir.join(format!("grad-{target}"));
            let o = attnc(&["compile", "--grad", "--target", target, "--set", "N=9"], &grads, &spec);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            for pass in ["lse", "delta", "grad_q", "grad_k", "grad_v"] {
                let kernel = format!("attention_mixed_{pass}");
                assert!(names(&grads).iter().any(|n| n.contains(&kernel)), "no {kernel} in {:?}", names(&grads));
            }
        }
    }
    let reads = dir.join("reads.attn");
    std::fs::write(
        &reads,
        "spec reads\ninput q: [1, 2, 8, 4]\ninput k: [1, 2, 8, 4]\ninput v: [1, 2, 8, 4]\ninput t: [2]\n\
         input wl: [2, 2]\noutput o = attention(q, k, v, mix_logits = wl, score = |s, b, h, i, j| s * t[h])\n",
    )
    .unwrap();
    let grads = dir.join("grad-reads");
    let o = attnc(&["compile", "--grad", "--wrt", "t,q", "--target", "wgsl"], &grads, &reads);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("error[E0701]") && err.contains("a tensor a score function reads"), "{err}");
    assert!(!grads.exists(), "a refused compile wrote {}", grads.display());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Memory stays O(N·H·d): the plan of Talking-Heads attention at N = 8192
/// has no buffer of N² elements, and its attention is one fused launch
/// (the manifest's) whose shared memory is independent of N.
#[test]
fn talking_heads_at_8192_tokens_stores_no_logits() {
    let c = compile_stdlib("talking_heads", &[("N", "8192".to_string()), ("H", "8".to_string())]);
    let dims = attnc_runtime::bind::default_dims(&c.program).unwrap();
    let plan = attnc_compiler::plan::plan(&c.program, &dims);
    let n2 = 8192 * 8192;
    for b in &plan.buffers {
        assert!(b.len < n2, "buffer {} of {:?} holds {} elements", b.id, b.shape, b.len);
    }
    let (_, manifest) = attnc_runtime::gpu::emit::emit(&plan, attnc_runtime::gpu::emit::Target::Cuda).unwrap();
    let attention: Vec<_> = manifest.launches.iter().filter(|l| l.entry.contains("attention")).collect();
    assert_eq!(attention.len(), 1, "one attention launch");
    assert!(attention[0].entry.contains("attention_mixed"), "{}", attention[0].entry);
    assert!(
        attention[0].shared_memory_bytes <= 48 * 1024,
        "{} bytes of shared memory",
        attention[0].shared_memory_bytes
    );
}

/// The CPU drivers' kernel (`attention_mixed_tiled`) covers one plane's
/// rows a cube, several a unit: at the bench's sizes (H = 8, d = 64, planes
/// of 8) 4 rows a unit, so each loaded key row serves 32 query rows as in
/// plain attention; wider heads fewer rows (the unrolled code's budget),
/// narrow heads no more than 4, short sequences no more rows than they
/// have. The plan's own tiling (the GPU kernel's) is unchanged.
#[test]
fn the_cpu_kernel_shares_each_key_row_over_a_planes_rows() {
    use attnc_compiler::plan::{MixTiles, MIX_CPU_ROWS, MIX_CPU_UNROLL};
    // [H_q, d, H_o, e, S, plane] → rows a cube.
    for ([hq, d, ho, e, s, plane], rows) in [
        ([8, 64, 8, 64, 1024, 8], 32),
        ([8, 64, 8, 64, 1024, 16], 64),
        ([8, 64, 8, 128, 1024, 8], 16),
        ([16, 64, 16, 64, 1024, 8], 16),
        ([2, 16, 2, 16, 1024, 8], 8 * MIX_CPU_ROWS),
        ([4, 32, 4, 32, 20, 8], 32),
        ([4, 32, 4, 32, 12, 8], 16),
        ([4, 32, 4, 32, 5, 8], 8),
        ([4, 32, 4, 32, 300, 2], 8),
    ] {
        let gpu = MixTiles::new(hq, [hq, ho, ho], e, s, [true, true]);
        let cpu = gpu.on_cpu_planes([hq, d, e, s], plane);
        assert_eq!(cpu.rows, rows, "H_q = {hq}, d = {d}, H_o = {ho}, e = {e}, S = {s}, plane {plane}");
        let per = (cpu.rows / plane).max(1);
        assert!(per <= MIX_CPU_ROWS && (per == 1 || per * (hq * d + ho * e) <= MIX_CPU_UNROLL));
        assert_eq!(MixTiles { rows: gpu.rows, ..cpu }, gpu, "only the rows change");
    }
}
