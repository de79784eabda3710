//! Properties of the attention specs under the float64 interpreter, from the
//! identities of docs/semantics.md §1–2, on fresh random inputs and sizes.

mod common;

use attnc_runtime::rng::Rng;
use attnc_runtime::Tensor;
use common::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Sizes of one attention layer.
#[derive(Clone, Debug)]
struct Cfg {
    b: usize,
    n: usize,
    dm: usize,
    h: usize,
    p: usize,
    d: usize,
    window: Option<usize>,
    seed: u64,
}

fn cfg() -> impl Strategy<Value = Cfg> {
    (
        1..=2usize,
        1..=9usize,
        1..=10usize,
        1..=4usize,
        1..=3usize,
        1..=3usize,
        prop::option::of(1..=4usize),
        any::<u64>(),
    )
        .prop_map(|(b, n, dm, h, p, half_d, window, seed)| Cfg { b, n, dm, h, p, d: 2 * half_d, window, seed })
}

fn sets(c: &Cfg, extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut s = vec![("H", c.h.to_string()), ("d", c.d.to_string())];
    if let Some(w) = c.window {
        s.push(("window", w.to_string()));
    }
    s.extend_from_slice(extra);
    s
}

/// x, w_q, w_k, w_v, w_o with `hkv` key/value heads.
fn mha_inputs(c: &Cfg, hkv: usize, rng: &mut Rng) -> BTreeMap<String, Tensor> {
    named(vec![
        ("x", random(rng, &[c.b, c.n, c.dm])),
        ("w_q", random(rng, &[c.dm, c.h * c.d])),
        ("w_k", random(rng, &[c.dm, hkv * c.d])),
        ("w_v", random(rng, &[c.dm, hkv * c.d])),
        ("w_o", random(rng, &[c.h * c.d, c.dm])),
    ])
}

fn identity_alpha(h: usize, p: usize) -> Tensor {
    let mut t = Tensor::zeros(vec![h, h, p]);
    for m in 0..h {
        for j in 0..p {
            t.data[(m * h + m) * p + j] = 1.0;
        }
    }
    t
}

/// r selecting pseudo-output `pick[h]` of each head h, or averaging when `pick` is None.
fn selecting_r(h: usize, p: usize, pick: Option<&[usize]>) -> Tensor {
    let mut t = Tensor::zeros(vec![h, h * p]);
    for hi in 0..h {
        match pick {
            Some(js) => t.data[hi * h * p + hi * p + js[hi]] = 1.0,
            None => (0..p).for_each(|j| t.data[hi * h * p + hi * p + j] = 1.0 / p as f64),
        }
    }
    t
}

fn with_iha_weights(mut inputs: BTreeMap<String, Tensor>, alpha: &Tensor, r: Tensor) -> BTreeMap<String, Tensor> {
    for name in ["alpha_q", "alpha_k", "alpha_v"] {
        inputs.insert(name.into(), alpha.clone());
    }
    inputs.insert("r".into(), r);
    inputs
}

const TOL: f64 = 1e-10;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Inclusion (docs/semantics.md §2): identity mixing with R picking one pseudo-output per
    /// head is MHA — any j or the average under `none`/`token_causal`, j = P−1 under
    /// `flat_causal`; windows carry over. P = 1 is included.
    #[test]
    fn iha_with_identity_mixing_is_mha(c in cfg(), mask in 0..3usize, average in any::<bool>()) {
        let mut rng = Rng::for_input(c.seed, "inclusion");
        let (iha_mask, mha_mask) = [("none", "none"), ("token_causal", "causal"), ("flat_causal", "causal")][mask];
        let pick: Vec<usize> = (0..c.h).map(|_| if mask == 2 { c.p - 1 } else { (rng.next_u64() % c.p as u64) as usize }).collect();
        let r = selecting_r(c.h, c.p, if average && mask != 2 { None } else { Some(&pick) });
        let base = mha_inputs(&c, c.h, &mut rng);
        let iha = compile_stdlib("iha", &sets(&c, &[("P", c.p.to_string()), ("mask", iha_mask.into())]));
        let mha = compile_stdlib("mha", &sets(&c, &[("mask", mha_mask.into())]));
        let y_iha = &eval(&iha, &with_iha_weights(base.clone(), &identity_alpha(c.h, c.p), r))["y"];
        let y_mha = &eval(&mha, &base)["y"];
        assert_close(y_iha, y_mha, TOL, "IHA(identity) vs MHA");
    }

    /// GQA with H_kv = H is MHA, and MQA is MHA with H_kv = 1.
    #[test]
    fn gqa_and_mqa_are_mha_special_cases(c in cfg(), causal in any::<bool>()) {
        let mut rng = Rng::for_input(c.seed, "gqa");
        let mask = if causal { "causal" } else { "none" };
        let full = mha_inputs(&c, c.h, &mut rng);
        let gqa = compile_stdlib("gqa", &sets(&c, &[("H_kv", c.h.to_string()), ("mask", mask.into())]));
        let mha = compile_stdlib("mha", &sets(&c, &[("mask", mask.into())]));
        assert_close(&eval(&gqa, &full)["y"], &eval(&mha, &full)["y"], TOL, "GQA(H_kv = H) vs MHA");

        let single = mha_inputs(&c, 1, &mut rng);
        let mqa = compile_stdlib("mqa", &sets(&c, &[("mask", mask.into())]));
        let mha1 = compile_stdlib("mha", &sets(&c, &[("H_kv", "1".into()), ("mask", mask.into())]));
        assert_close(&eval(&mqa, &single)["y"], &eval(&mha1, &single)["y"], TOL, "MQA vs MHA(H_kv = 1)");
    }

    /// Renumbering heads consistently (projections, mixing, collapse) leaves y unchanged.
    #[test]
    fn permuting_heads_leaves_iha_unchanged(c in cfg(), mask in 0..3usize, per_head in any::<bool>(), rope in any::<bool>()) {
        let mut rng = Rng::for_input(c.seed, "perm");
        let (h, p, d) = (c.h, c.p, c.d);
        let mut perm: Vec<usize> = (0..h).collect();
        for i in (1..h).rev() {
            perm.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut inputs = mha_inputs(&c, h, &mut rng);
        for name in ["alpha_q", "alpha_k", "alpha_v"] {
            inputs.insert(name.into(), random(&mut rng, &[h, h, p]));
        }
        inputs.insert("r".into(), random(&mut rng, &[h, h * p]));
        let mut permuted = inputs.clone();
        for name in ["w_q", "w_k", "w_v"] {
            let (src, dst) = (&inputs[name], permuted.get_mut(name).unwrap());
            for row in 0..c.dm {
                for hn in 0..h {
                    for e in 0..d {
                        dst.data[row * h * d + hn * d + e] = src.data[row * h * d + perm[hn] * d + e];
                    }
                }
            }
        }
        for hn in 0..h {
            for e in 0..d {
                for col in 0..c.dm {
                    permuted.get_mut("w_o").unwrap().data[(hn * d + e) * c.dm + col] = inputs["w_o"].data[(perm[hn] * d + e) * c.dm + col];
                }
            }
        }
        for name in ["alpha_q", "alpha_k", "alpha_v"] {
            for m in 0..h {
                for hh in 0..h {
                    for j in 0..p {
                        permuted.get_mut(name).unwrap().data[(m * h + hh) * p + j] = inputs[name].data[(perm[m] * h + perm[hh]) * p + j];
                    }
                }
            }
        }
        for hh in 0..h {
            for h2 in 0..h {
                for j in 0..p {
                    permuted.get_mut("r").unwrap().data[hh * h * p + h2 * p + j] = inputs["r"].data[perm[hh] * h * p + perm[h2] * p + j];
                }
            }
        }
        let mut extra = vec![("P", p.to_string()), ("mask", ["none", "flat_causal", "token_causal"][mask].to_string())];
        extra.push(("collapse", if per_head { "per_head" } else { "global" }.to_string()));
        if rope {
            extra.push(("rope", "100.0".to_string()));
        }
        let iha = compile_stdlib("iha", &sets(&c, &extra));
        assert_close(&eval(&iha, &permuted)["y"], &eval(&iha, &inputs)["y"], TOL, "permuted heads");
    }

    /// Under a causal mask, y at token n does not depend on tokens after n.
    #[test]
    fn causal_outputs_ignore_the_future(c in cfg(), which in 0..3usize, cut in 0..9usize) {
        let mut rng = Rng::for_input(c.seed, "causal");
        let cut = cut % c.n;
        let (spec, extra): (&str, Vec<(&str, String)>) = match which {
            0 => ("mha", vec![("mask", "causal".into())]),
            1 => ("iha", vec![("P", c.p.to_string()), ("mask", "flat_causal".into())]),
            _ => ("iha", vec![("P", c.p.to_string()), ("mask", "token_causal".into()), ("rope", "10000.0".into())]),
        };
        let compiled = compile_stdlib(spec, &sets(&c, &extra));
        let mut inputs = mha_inputs(&c, c.h, &mut rng);
        if spec == "iha" {
            for name in ["alpha_q", "alpha_k", "alpha_v"] {
                inputs.insert(name.into(), random(&mut rng, &[c.h, c.h, c.p]));
            }
            inputs.insert("r".into(), random(&mut rng, &[c.h, c.h * c.p]));
        }
        let mut changed = inputs.clone();
        let x = changed.get_mut("x").unwrap();
        for b in 0..c.b {
            for n in cut + 1..c.n {
                for e in 0..c.dm {
                    x.data[(b * c.n + n) * c.dm + e] = 3.0 * rng.unit() - 1.5;
                }
            }
        }
        let (y0, y1) = (&eval(&compiled, &inputs)["y"], &eval(&compiled, &changed)["y"]);
        let prefix = |t: &Tensor| -> Vec<f64> {
            (0..c.b).flat_map(|b| t.data[b * c.n * c.dm..(b * c.n + cut + 1) * c.dm].to_vec()).collect()
        };
        let (p0, p1) = (prefix(y0), prefix(y1));
        prop_assert!(p0.iter().all(|v| v.is_finite()));
        prop_assert_eq!(p0, p1, "outputs at tokens <= {} changed", cut);
    }
}

/// The counter-example of docs/semantics.md: under `flat_causal`, selecting j = 0 is not MHA
/// (it sees one copy of its own token but P copies of each earlier one).
#[test]
fn flat_causal_selecting_first_pseudo_head_is_not_mha() {
    let c = Cfg { b: 1, n: 5, dm: 6, h: 2, p: 3, d: 4, window: None, seed: 7 };
    let mut rng = Rng::for_input(c.seed, "counter");
    let base = mha_inputs(&c, c.h, &mut rng);
    let r = selecting_r(c.h, c.p, Some(&[0, 0]));
    let iha = compile_stdlib("iha", &sets(&c, &[("P", "3".into()), ("mask", "flat_causal".into())]));
    let mha = compile_stdlib("mha", &sets(&c, &[("mask", "causal".into())]));
    let y_iha = &eval(&iha, &with_iha_weights(base.clone(), &identity_alpha(c.h, c.p), r))["y"];
    let y_mha = &eval(&mha, &base)["y"];
    let e = attnc_runtime::relative_error(&y_iha.data, &y_mha.data);
    assert!(e > 1e-3, "selecting j = 0 under flat_causal unexpectedly matched MHA (error {e:e})");
    // Token 0 sees only itself in both, so its row agrees.
    assert_close(
        &Tensor::new(vec![6], y_iha.data[..6].to_vec()),
        &Tensor::new(vec![6], y_mha.data[..6].to_vec()),
        1e-12,
        "token 0",
    );
}
