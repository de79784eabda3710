//! The group advantage estimators of docs/semantics.md §3–4: each stdlib spec
//! against a float64 implementation written directly from the formulas (not
//! through the IR), and the identities the paper states, on random groups.

mod common;

use attnc_runtime::Tensor;
use common::*;
use proptest::prelude::*;

type Groups = Vec<Vec<f64>>;

fn run(spec: &str, sets: &[(&str, String)], rewards: &Groups) -> Groups {
    let (b, g) = (rewards.len(), rewards[0].len());
    let t = Tensor::new(vec![b, g], rewards.concat());
    let out = &eval(&compile_stdlib(spec, sets), &named(vec![("rewards", t)]))["advantages"];
    assert_eq!(out.shape, [b, g]);
    out.data.chunks(g).map(<[f64]>::to_vec).collect()
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

fn all_equal(xs: &[f64]) -> bool {
    xs.iter().all(|x| *x == xs[0])
}

/// Population (or Bessel) standard deviation.
fn stdev(xs: &[f64], bessel: bool) -> f64 {
    let m = mean(xs);
    let n = if bessel { xs.len() as f64 - 1.0 } else { xs.len() as f64 };
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n).sqrt()
}

fn grpo(r: &[f64], eps: f64, bessel: bool) -> Vec<f64> {
    if all_equal(r) {
        return vec![0.0; r.len()];
    }
    let (m, s) = (mean(r), stdev(r, bessel));
    r.iter().map(|x| (x - m) / (s + eps)).collect()
}

fn dr_grpo(r: &[f64]) -> Vec<f64> {
    if all_equal(r) {
        return vec![0.0; r.len()];
    }
    let m = mean(r);
    r.iter().map(|x| x - m).collect()
}

fn rloo(r: &[f64]) -> Vec<f64> {
    if all_equal(r) {
        return vec![0.0; r.len()];
    }
    let g = r.len();
    (0..g).map(|i| r[i] - (0..g).filter(|j| *j != i).map(|j| r[j]).sum::<f64>() / (g as f64 - 1.0)).collect()
}

fn maxrl(r: &[f64], eps: f64) -> Vec<f64> {
    if all_equal(r) {
        return vec![0.0; r.len()];
    }
    let m = mean(r);
    r.iter().map(|x| (x - m) / (m + eps)).collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Base {
    Grpo,
    Maxrl,
    Mean,
}

#[derive(Clone, Debug)]
struct Odrpo {
    k: usize,
    base: Base,
    eps: f64,
    weights: Option<Vec<f64>>,
    normalize_active: bool,
    batch_norm: bool,
}

/// docs/semantics.md §4 through the counts form: per group, a cumulative histogram of
/// ratings gives, for each threshold, how many samples pass it.
fn odrpo(ratings: &Groups, o: &Odrpo) -> Groups {
    let mut out: Groups = ratings
        .iter()
        .map(|r| {
            let g = r.len();
            let mut hist = vec![0usize; o.k + 2];
            for x in r {
                hist[*x as usize] += 1;
            }
            let mut at_least = vec![0usize; o.k + 2]; // at_least[tau] = #(r >= tau)
            for tau in (1..=o.k).rev() {
                at_least[tau] = at_least[tau + 1] + hist[tau];
            }
            let mut a = vec![0.0; g];
            let mut active = 0usize;
            for tau in 2..=o.k {
                let c = at_least[tau];
                if c == 0 || c == g {
                    continue;
                }
                active += 1;
                let p = c as f64 / g as f64;
                let norm = match o.base {
                    Base::Grpo => (p * (1.0 - p)).sqrt() + o.eps,
                    Base::Maxrl => p + o.eps,
                    Base::Mean => 1.0,
                };
                let w = o.weights.as_ref().map_or(1.0, |w| w[tau - 2]);
                for (ai, x) in a.iter_mut().zip(r) {
                    let b = if *x >= tau as f64 { 1.0 } else { 0.0 };
                    *ai += w * (b - p) / norm;
                }
            }
            if o.normalize_active {
                a.iter_mut().for_each(|v| *v /= active.max(1) as f64);
            }
            a
        })
        .collect();
    if o.batch_norm {
        let flat = out.concat();
        let (m, s) = (mean(&flat), stdev(&flat, false));
        for row in &mut out {
            row.iter_mut().for_each(|v| *v = if s > 0.0 { (*v - m) / (s + o.eps) } else { 0.0 });
        }
    }
    out
}

fn odrpo_sets(o: &Odrpo) -> Vec<(&'static str, String)> {
    let mut s = vec![
        ("K", o.k.to_string()),
        ("base", format!("{:?}", o.base).to_lowercase()),
        ("eps", format!("{:?}", o.eps)),
        ("normalize_active", o.normalize_active.to_string()),
        ("batch_norm", o.batch_norm.to_string()),
    ];
    if let Some(w) = &o.weights {
        let items: Vec<String> = w.iter().map(|x| format!("{x:?}")).collect();
        s.push(("weights", format!("[{}]", items.join(", "))));
    }
    s
}

/// Max |a − b| ≤ tol, no NaN anywhere.
fn assert_near(got: &Groups, want: &Groups, tol: f64, what: &str) {
    for (gr, wr) in got.iter().zip(want) {
        for (x, y) in gr.iter().zip(wr) {
            assert!(!x.is_nan() && (x - y).abs() <= tol * (1.0 + y.abs()), "{what}: got {got:?}, want {want:?}");
        }
    }
}

/// B groups of G ratings in 1..=K, with ties likely when K is small.
fn ratings(max_k: usize, min_g: usize) -> impl Strategy<Value = (usize, Groups)> {
    (2..=max_k, 1..=4usize, min_g..=7usize).prop_flat_map(|(k, b, g)| {
        (Just(k), prop::collection::vec(prop::collection::vec((1..=k).prop_map(|x| x as f64), g), b))
    })
}

fn real_groups(min_g: usize) -> impl Strategy<Value = Groups> {
    (1..=4usize, min_g..=7usize).prop_flat_map(|(b, g)| {
        prop::collection::vec(prop::collection::vec(prop_oneof![-3.0..3.0f64, Just(0.5), Just(1.0)], g), b)
    })
}

fn binary_groups() -> impl Strategy<Value = Groups> {
    (1..=4usize, 1..=7usize).prop_flat_map(|(b, g)| {
        prop::collection::vec(prop::collection::vec(prop::sample::select(vec![0.0, 1.0]), g), b)
    })
}

const TOL: f64 = 1e-12;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn grpo_family_matches_formulas(r in real_groups(1), bessel in any::<bool>(), eps in prop_oneof![Just(0.0), Just(1e-6), Just(1e-4)]) {
        let std = if bessel { "bessel" } else { "population" };
        let want: Groups = r.iter().map(|g| grpo(g, eps, bessel)).collect();
        assert_near(&run("grpo", &[("eps", format!("{eps:?}")), ("std", std.into())], &r), &want, TOL, "grpo");
        let want: Groups = r.iter().map(|g| dr_grpo(g)).collect();
        assert_near(&run("dr_grpo", &[], &r), &want, TOL, "dr_grpo");
    }

    #[test]
    fn rloo_matches_formula_and_scaled_dr_grpo(r in real_groups(2)) {
        let got = run("rloo", &[], &r);
        assert_near(&got, &r.iter().map(|g| rloo(g)).collect(), TOL, "rloo");
        let g = r[0].len() as f64;
        let scaled: Groups = run("dr_grpo", &[], &r).iter().map(|row| row.iter().map(|v| v * g / (g - 1.0)).collect()).collect();
        assert_near(&got, &scaled, 1e-10, "rloo = G/(G-1) dr_grpo");
    }

    #[test]
    fn maxrl_matches_formula(r in binary_groups(), eps in prop_oneof![Just(0.0), Just(1e-6)]) {
        let want: Groups = r.iter().map(|g| maxrl(g, eps)).collect();
        assert_near(&run("maxrl", &[("eps", format!("{eps:?}"))], &r), &want, TOL, "maxrl");
    }

    #[test]
    fn gdpo_matches_formula(b in 1..=3usize, g in 1..=5usize, c in 1..=3usize, seed in any::<u64>()) {
        let mut rng = attnc_runtime::rng::Rng::for_input(seed, "gdpo");
        let data: Vec<f64> = (0..b * g * c).map(|_| (4.0 * rng.unit()).floor() / 2.0).collect();
        let t = Tensor::new(vec![b, g, c], data.clone());
        let got = &eval(&compile_stdlib("gdpo", &[]), &named(vec![("rewards", t)]))["advantages"];
        let mut total = vec![vec![0.0; g]; b];
        for bi in 0..b {
            for ci in 0..c {
                let comp: Vec<f64> = (0..g).map(|gi| data[(bi * g + gi) * c + ci]).collect();
                for (gi, a) in grpo(&comp, 1e-6, false).iter().enumerate() {
                    total[bi][gi] += a;
                }
            }
        }
        let flat = total.concat();
        let (m, s) = (mean(&flat), stdev(&flat, false));
        let want: Vec<f64> = flat.iter().map(|v| if s > 0.0 { (v - m) / (s + 1e-6) } else { 0.0 }).collect();
        let e = got.data.iter().zip(&want).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        prop_assert!(e <= 1e-9 && got.data.iter().all(|v| v.is_finite()), "gdpo: max error {}", e);
    }

    #[test]
    fn odrpo_matches_the_counts_form(
        (k, r) in ratings(10, 1),
        base in prop::sample::select(vec![Base::Grpo, Base::Maxrl, Base::Mean]),
        eps in prop_oneof![Just(0.0), Just(1e-6)],
        weighted in any::<bool>(),
        normalize_active in any::<bool>(),
        batch_norm in any::<bool>(),
    ) {
        let weights = weighted.then(|| (0..k - 1).map(|i| 0.5 + i as f64 * 0.25).collect());
        let o = Odrpo { k, base, eps, weights, normalize_active, batch_norm };
        assert_near(&run("odrpo", &odrpo_sets(&o), &r), &odrpo(&r, &o), 1e-10, "odrpo");
    }

    /// `mean` base with unit weights is Dr. GRPO on the raw rating.
    #[test]
    fn odrpo_mean_is_dr_grpo((k, r) in ratings(10, 1)) {
        let o = Odrpo { k, base: Base::Mean, eps: 1e-6, weights: None, normalize_active: false, batch_norm: false };
        assert_near(&run("odrpo", &odrpo_sets(&o), &r), &run("dr_grpo", &[], &r), 1e-12, "odrpo(mean) vs dr_grpo");
    }

    /// K = 2 is the base estimator on the binary reward 1[r >= 2].
    #[test]
    fn odrpo_with_two_levels_is_its_base_estimator(r in binary_groups(), eps in prop_oneof![Just(0.0), Just(1e-6)]) {
        let ratings: Groups = r.iter().map(|g| g.iter().map(|b| b + 1.0).collect()).collect();
        for (base, spec, sets) in [
            (Base::Grpo, "grpo", vec![("eps", format!("{eps:?}"))]),
            (Base::Maxrl, "maxrl", vec![("eps", format!("{eps:?}"))]),
            (Base::Mean, "dr_grpo", vec![]),
        ] {
            let o = Odrpo { k: 2, base, eps, weights: None, normalize_active: false, batch_norm: false };
            assert_near(&run("odrpo", &odrpo_sets(&o), &ratings), &run(spec, &sets, &r), 1e-12, &format!("odrpo K=2 {base:?} vs {spec}"));
        }
    }

    /// All-equal groups get exactly zero; centred estimators sum to zero per group.
    #[test]
    fn degenerate_groups_are_zero_and_advantages_are_centred((k, mut r) in ratings(6, 1), which in 0..3usize, value in 1..=6usize) {
        let v = value.min(k) as f64;
        let row = which % r.len();
        r[row].iter_mut().for_each(|x| *x = v);
        let specs: Vec<(&str, Vec<(&str, String)>)> = vec![
            ("grpo", vec![]),
            ("dr_grpo", vec![]),
            ("maxrl", vec![]),
            ("odrpo", vec![("K", k.to_string())]),
            ("odrpo", vec![("K", k.to_string()), ("base", "maxrl".into()), ("normalize_active", "true".into())]),
            ("odrpo", vec![("K", k.to_string()), ("base", "mean".into())]),
        ];
        for (spec, sets) in specs {
            let input: Groups = if spec == "maxrl" { r.iter().map(|g| g.iter().map(|x| f64::from(*x >= 2.0)).collect()).collect() } else { r.clone() };
            let out = run(spec, &sets, &input);
            for (gi, (row, rin)) in out.iter().zip(&input).enumerate() {
                prop_assert!(row.iter().all(|v| v.is_finite()), "{} gave a non-finite advantage", spec);
                if all_equal(rin) {
                    prop_assert!(row.iter().all(|v| *v == 0.0), "{} group {} is all-equal but got {:?}", spec, gi, row);
                }
                let total: f64 = row.iter().sum();
                prop_assert!(total.abs() <= 1e-9 * (1.0 + row.iter().map(|v| v.abs()).sum::<f64>()), "{} group {} sums to {}", spec, gi, total);
            }
        }
        if r[0].len() >= 2 {
            let out = run("rloo", &[], &r);
            prop_assert!(out.iter().zip(&r).all(|(row, rin)| !all_equal(rin) || row.iter().all(|v| *v == 0.0)));
        }
    }
}

/// The worked example of docs/semantics.md §4 (G = 8, K = 10, `grpo` base, ε = 1e-6).
#[test]
fn worked_example_reproduces() {
    let r: Groups = vec![vec![8.0, 6.0, 7.0, 9.0, 5.0, 7.0, 8.0, 6.0]];
    let got = run("odrpo", &[], &r);
    let want = [2.07, -2.07, 0.0, 5.09, -5.09, 0.0, 2.07, -2.07];
    for (x, y) in got[0].iter().zip(want) {
        assert!((x - y).abs() <= 1e-2, "odrpo worked example: got {:?}", got[0]);
    }
    let got = run("grpo", &[], &r);
    let want = [0.82, -0.82, 0.0, 1.63, -1.63, 0.0, 0.82, -0.82];
    for (x, y) in got[0].iter().zip(want) {
        assert!((x - y).abs() <= 1e-2, "grpo worked example: got {:?}", got[0]);
    }
}

mod cli {
    use super::*;
    use attnc_runtime::io::{decode, encode, FileDtype};
    use std::process::Command;

    /// Runs `attnc run SPEC --inputs` on `rewards`; Ok(advantages) or Err(stderr),
    /// checking that a failed run wrote nothing.
    fn attnc_run(spec: &str, rewards: &Tensor, sets: &[(&str, String)]) -> Result<Vec<f64>, String> {
        let dir =
            std::env::temp_dir().join(format!("attnc-rewards-{}-{spec}-{}", std::process::id(), rewards.data.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let (inp, out) = (dir.join("r.safetensors"), dir.join("a.safetensors"));
        std::fs::write(&inp, encode(&[("rewards".to_string(), rewards)], FileDtype::F32).unwrap()).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_attnc"));
        cmd.arg("run").arg(root().join(format!("stdlib/{spec}.attn"))).arg("--inputs").arg(&inp).arg("--out").arg(&out);
        for (k, v) in sets {
            cmd.arg("--set").arg(format!("{k}={v}"));
        }
        let o = cmd.output().unwrap();
        let result = if o.status.success() {
            Ok(decode(&std::fs::read(&out).unwrap()).unwrap()["advantages"].data.clone())
        } else {
            assert!(!out.exists(), "a failed run wrote {}", out.display());
            Err(String::from_utf8_lossy(&o.stderr).into_owned())
        };
        std::fs::remove_dir_all(&dir).ok();
        result
    }

    #[test]
    fn odrpo_cli_gives_the_formula_advantages() {
        let r: Groups =
            vec![vec![7.0, 1.0, 3.0, 3.0, 5.0], vec![2.0, 2.0, 2.0, 2.0, 2.0], vec![1.0, 7.0, 6.0, 2.0, 4.0]];
        let t = Tensor::new(vec![3, 5], r.concat());
        let got = attnc_run("odrpo", &t, &[("base", "maxrl".into()), ("K", "7".into())]).unwrap();
        let o = Odrpo { k: 7, base: Base::Maxrl, eps: 1e-6, weights: None, normalize_active: false, batch_norm: false };
        let want = odrpo(&r, &o).concat();
        for (x, y) in got.iter().zip(&want) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "got {got:?}, want {want:?}");
        }
        // Every other reward spec through the CLI, against its formula (f32 output).
        for (spec, f) in [("grpo", grpo_default as fn(&[f64]) -> Vec<f64>), ("dr_grpo", dr_grpo), ("rloo", rloo)] {
            let got = attnc_run(spec, &t, &[]).unwrap();
            let want: Vec<f64> = r.iter().flat_map(|g| f(g)).collect();
            for (x, y) in got.iter().zip(&want) {
                assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{spec}: got {got:?}, want {want:?}");
            }
        }
        let bin = Tensor::new(vec![2, 3], vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        let got = attnc_run("maxrl", &bin, &[]).unwrap();
        let want = [maxrl(&[1.0, 0.0, 0.0], 1e-6), maxrl(&[1.0, 1.0, 1.0], 1e-6)].concat();
        assert!(
            got.iter().zip(&want).all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs())),
            "maxrl: {got:?} vs {want:?}"
        );
    }

    fn grpo_default(r: &[f64]) -> Vec<f64> {
        grpo(r, 1e-6, false)
    }

    #[test]
    fn bad_ratings_and_rewards_are_named_errors() {
        let t = Tensor::new(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 8.0, 1.0]);
        let err = attnc_run("odrpo", &t, &[("K", "7".into())]).unwrap_err();
        assert!(err.contains("group 1, sample 1") && err.contains("8") && err.contains("1..=7"), "{err}");
        assert!(err.contains("error[E0602]"), "{err}");

        let t = Tensor::new(vec![2, 3], vec![1.0, 2.5, 3.0, 4.0, 5.0, 1.0]);
        let err = attnc_run("odrpo", &t, &[]).unwrap_err();
        assert!(err.contains("group 0, sample 1") && err.contains("2.5"), "{err}");

        for spec in ["grpo", "dr_grpo", "rloo", "odrpo"] {
            let t = Tensor::new(vec![2, 2], vec![1.0, 2.0, f64::NAN, 1.0]);
            let err = attnc_run(spec, &t, &[]).unwrap_err();
            assert!(err.contains("group 1, sample 0") && err.contains("NaN"), "{spec}: {err}");
        }

        let t = Tensor::new(vec![1, 3], vec![1.0, 0.5, 0.0]);
        let err = attnc_run("maxrl", &t, &[]).unwrap_err();
        assert!(err.contains("group 0, sample 1") && err.contains("0 or 1"), "{err}");

        let t = Tensor::new(vec![3, 1], vec![1.0, 0.5, 0.0]);
        let err = attnc_run("rloo", &t, &[]).unwrap_err();
        assert!(err.contains("leave-one-out") && err.contains("has 1"), "{err}");
        assert!(attnc_run("grpo", &t, &[]).unwrap().iter().all(|v| *v == 0.0), "G = 1 GRPO is all zero");

        let t = Tensor::new(vec![1, 3], vec![1.0, 2.0, 3.0]);
        let err = attnc_run("odrpo", &t, &[("K", "1".into())]).unwrap_err();
        assert!(err.contains("K must be at least 2"), "{err}");
        let err = attnc_run("odrpo", &t, &[("weights", "[1.0, 2.0]".into())]).unwrap_err();
        assert!(err.contains("needs 9 values") && err.contains("has 2"), "{err}");
    }
}
