//! A grammar-directed generator of random *valid* specs (elementwise,
//! broadcasting and reduction statements over two inputs): every generated
//! spec checks without errors, prints and parses back, and gives the same
//! values from the interpreter, the optimizer's program and the kernels.

mod common;

use attnc_compiler::opt::{self, Config};
use attnc_compiler::plan;
use attnc_runtime::rng::Rng;
use attnc_runtime::{bind, interp, Tensor};
use proptest::prelude::*;

/// One statement: an operator and indices of earlier values (0 = a, 1 = b).
#[derive(Clone, Debug)]
enum Stmt {
    Binary(&'static str, usize, usize),
    Call2(&'static str, usize, usize),
    Unary(&'static str, usize),
    Affine(usize, f64, f64),
    Select(usize, usize),
    Reduce(&'static str, usize, bool),
    /// One of [`FUNCTIONS`] of a value (and of an input).
    Function(&'static str, usize, usize),
}

/// The elementwise builtins as the generator writes them: `{x}` an earlier
/// value, `{b}` an input (|b| ≤ 1); each form keeps values bounded.
const FUNCTIONS: [(&str, &str); 17] = [
    ("exp", "exp(-abs({x}))"),
    ("log", "log(abs({x}) + 1.0)"),
    ("log1p", "log1p(abs({x}))"),
    ("tanh", "tanh({x})"),
    ("sigmoid", "sigmoid({x})"),
    ("softplus", "softplus({x})"),
    ("silu", "silu({x})"),
    ("gelu", "gelu({x})"),
    ("gelu_tanh", "gelu({x}, approximate = tanh)"),
    ("erf", "erf({x})"),
    ("sin", "sin({x})"),
    ("cos", "cos({x})"),
    ("floor", "floor({x} * 2.5)"),
    ("ceil", "ceil({x} * 2.5)"),
    ("sign", "sign({x})"),
    ("pow", "pow(abs({x}) + 0.5, {b})"),
    ("clamp", "clamp({x}, -0.5, {b})"),
];

fn stmt() -> impl Strategy<Value = Stmt> {
    let i = 0..64usize;
    prop_oneof![
        (prop::sample::select(vec!["+", "-", "*"]), i.clone(), i.clone()).prop_map(|(o, a, b)| Stmt::Binary(o, a, b)),
        (prop::sample::select(vec!["maximum", "minimum"]), i.clone(), i.clone())
            .prop_map(|(f, a, b)| Stmt::Call2(f, a, b)),
        (prop::sample::select(vec!["abs", "neg", "sqrt_abs", "safe_div"]), i.clone())
            .prop_map(|(f, a)| Stmt::Unary(f, a)),
        (prop::sample::select(FUNCTIONS.iter().map(|(name, _)| *name).collect::<Vec<_>>()), i.clone(), i.clone())
            .prop_map(|(f, a, b)| Stmt::Function(f, a, b)),
        (i.clone(), -1.5..1.5f64, -1.0..1.0f64).prop_map(|(a, m, c)| Stmt::Affine(a, m, c)),
        (i.clone(), i.clone()).prop_map(|(a, b)| Stmt::Select(a, b)),
        (prop::sample::select(vec!["mean", "max", "min", "sum", "std", "count"]), i, any::<bool>())
            .prop_map(|(f, a, all)| Stmt::Reduce(f, a, all)),
    ]
}

fn render(b: usize, g: usize, stmts: &[Stmt]) -> String {
    let mut names = vec!["a".to_string(), "b".to_string()];
    let mut text = format!(
        "spec generated\n\ndim B = {b}\ndim G = {g}\n\ninput a: [B, G] in finite\ninput b: [B, G] in finite\n\n"
    );
    for (k, s) in stmts.iter().enumerate() {
        let n = |i: &usize| names[i % names.len()].clone();
        let expr = match s {
            // Products only with an input (|a|, |b| ≤ 1), so values cannot blow up.
            Stmt::Binary("*", x, y) => format!("{} * {}", n(x), names[y % 2]),
            Stmt::Binary(o, x, y) => format!("{} {o} {}", n(x), n(y)),
            Stmt::Call2(f, x, y) => format!("{f}({}, {})", n(x), n(y)),
            Stmt::Unary("abs", x) => format!("abs({})", n(x)),
            Stmt::Unary("neg", x) => format!("-{}", n(x)),
            Stmt::Unary("sqrt_abs", x) => format!("sqrt(abs({}))", n(x)),
            Stmt::Unary(_, x) => format!("{} / (abs({}) + 1.0)", n(x), n(&(x + 1))),
            Stmt::Affine(x, m, c) => format!("{} * {m:?} + {c:?}", n(x)),
            Stmt::Select(x, y) => format!("where({} > {}, {}, {})", n(x), n(y), n(y), n(x)),
            Stmt::Reduce(f, x, all) => format!("{f}({}, axis = {})", n(x), if *all { "all" } else { "1" }),
            Stmt::Function(f, x, y) => {
                let form = FUNCTIONS.iter().find(|(name, _)| name == f).unwrap().1;
                form.replace("{x}", &n(x)).replace("{b}", &names[y % 2])
            }
        };
        let name = format!("t{k}");
        text.push_str(&format!("let {name} = {expr}\n"));
        names.push(name);
    }
    text.push_str(&format!("\noutput out = {} + a\n", names.last().unwrap()));
    text
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn generated_specs_agree_everywhere(b in 1..=4usize, g in 1..=6usize, stmts in prop::collection::vec(stmt(), 1..8), seed in any::<u64>()) {
        let text = render(b, g, &stmts);
        let compiled = attnc_compiler::compile(&text, &[])
            .unwrap_or_else(|d| panic!("generated spec has errors:\n{}\n{}", text, attnc_compiler::render("gen.attn", &text, &d)));
        let spec = attnc_grammar::parse(&text).unwrap();
        prop_assert_eq!(attnc_grammar::parse(&attnc_grammar::print_spec(&spec)).unwrap().without_spans(), spec.without_spans());

        let mut rng = Rng::for_input(seed, "generated");
        let mut draw = || Tensor::new(vec![b, g], (0..b * g).map(|_| 2.0 * rng.unit() - 1.0).collect());
        let inputs = common::named(vec![("a", draw()), ("b", draw())]);
        let (tensors, dims) = bind::bind_inputs(&compiled.program, inputs.clone(), &Default::default()).unwrap();
        let want = interp::evaluate(&compiled.program, &tensors, &dims).remove(0);
        prop_assert!(want.data.iter().all(|v| v.is_finite()), "non-finite interpreter output for\n{}", text);

        let chosen = opt::optimize(&compiled.program, &dims, &Config::default()).chosen;
        let again = interp::evaluate(&chosen, &tensors, &dims).remove(0);
        prop_assert!(attnc_runtime::relative_error(&again.data, &want.data) <= 1e-12);

        let gpu = common::needs_wgpu();
        let got = gpu.run(&plan::plan(&compiled.program, &dims), &inputs).unwrap().0.remove(0);
        let e = attnc_runtime::relative_error(&got.data, &want.data);
        prop_assert!(e <= 1e-4, "kernels differ by {:e} for\n{}", e, text);

        // The gradient program on the kernels against the interpreter's.
        let grad = attnc_compiler::grad::differentiate(&compiled.program, &[]).unwrap();
        let mut inputs = inputs;
        inputs.insert("cot_out".to_string(), draw());
        let (tensors, dims) = bind::bind_inputs(&grad, inputs.clone(), &Default::default()).unwrap();
        let want = interp::evaluate(&grad, &tensors, &dims);
        let got = gpu.run(&plan::plan(&grad, &dims), &inputs).unwrap().0;
        for ((name, _), (g, w)) in grad.outputs.iter().zip(got.iter().zip(&want)) {
            prop_assert!(g.data.iter().all(|v| !v.is_nan()), "NaN in {} for\n{}", name, text);
            let e = attnc_runtime::relative_error(&g.data, &w.data);
            prop_assert!(e <= 1e-4, "kernel {} differs by {:e} for\n{}", name, e, text);
        }
    }
}

/// ⟨cot, out⟩ of a generated spec at inputs `a`, `b`.
fn objective(p: &attnc_compiler::ir::Program, a: &Tensor, b: &Tensor, cot: &Tensor) -> f64 {
    let inputs = common::named(vec![("a", a.clone()), ("b", b.clone())]);
    let (tensors, dims) = bind::bind_inputs(p, inputs, &Default::default()).unwrap();
    interp::evaluate(p, &tensors, &dims)[0].data.iter().zip(&cot.data).map(|(x, c)| x * c).sum()
}

/// Checks every element of both inputs' gradients of spec `text` (inputs
/// `a`, `b` of shape [b, g], output `out`) against central differences.
/// Where a difference quotient does not settle (two step sizes disagree: a
/// kink of `abs`, `where`, `max` or a steep `sqrt` lies within the step) the
/// element is not compared; each compared one must agree within 1e-6.
/// Returns how many were compared, of how many.
fn check_gradients(text: &str, b: usize, g: usize, seed: u64) -> (usize, usize) {
    let p = attnc_compiler::compile(text, &[]).unwrap().program;
    let grad = attnc_compiler::grad::differentiate(&p, &[]).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(attnc_compiler::valid::validate(&grad).is_empty());
    let mut rng = Rng::for_input(seed, "gradients");
    let mut draw = || Tensor::new(vec![b, g], (0..b * g).map(|_| 2.0 * rng.unit() - 1.0).collect());
    let (a, bb, cot) = (draw(), draw(), draw());
    let inputs = common::named(vec![("a", a.clone()), ("b", bb.clone()), ("cot_out", cot.clone())]);
    let (tensors, dims) = bind::bind_inputs(&grad, inputs, &Default::default()).unwrap();
    let results = interp::evaluate(&grad, &tensors, &dims);
    let (mut compared, mut total) = (0, 0);
    for (which, x) in [("a", &a), ("b", &bb)] {
        let at = grad.outputs.iter().position(|(n, _)| *n == format!("grad_{which}")).unwrap();
        let analytic = &results[at];
        for i in 0..x.len() {
            let quotient = |h: f64| {
                let moved = |s: f64| {
                    let mut y = x.clone();
                    y.data[i] += s * h;
                    if which == "a" {
                        objective(&p, &y, &bb, &cot)
                    } else {
                        objective(&p, &a, &y, &cot)
                    }
                };
                (moved(1.0) - moved(-1.0)) / (2.0 * h)
            };
            let (coarse, fine) = (quotient(1e-4), quotient(2.5e-5));
            let scale = analytic.data[i].abs().max(fine.abs()).max(1.0);
            total += 1;
            if (coarse - fine).abs() > 1e-7 * scale {
                continue; // not smooth at this scale: no derivative to compare with
            }
            compared += 1;
            let err = (analytic.data[i] - fine).abs() / scale;
            assert!(err <= 1e-6, "grad_{which}[{i}]: {} vs {fine} for\n{text}", analytic.data[i]);
        }
    }
    (compared, total)
}

/// Every operation the generator writes, in one spec, each on the output's path.
#[test]
fn every_generated_operation_has_a_checked_gradient() {
    let text = "spec every\n\ndim B = 3\ndim G = 5\n\ninput a: [B, G] in finite\ninput b: [B, G] in finite\n\n\
        let t0 = a + b\nlet t1 = t0 - a * b\nlet t2 = maximum(t1, b)\nlet t3 = minimum(t2, a)\n\
        let t4 = abs(t3) + -t1\nlet t5 = sqrt(abs(t4) + 0.5)\nlet t6 = t5 / (abs(a) + 1.0)\n\
        let t7 = t6 * 0.7 + 0.2\nlet t8 = where(t7 > b, b, t7)\n\
        let t9 = mean(t8, axis = 1) + max(t6, axis = 1) + min(t5, axis = all) + sum(t2, axis = 1)\n\
        let t10 = std(t7, axis = 1) + std(t8, axis = all) + count(t3, axis = 1)\n\
        output out = t9 * t10 + a\n";
    let (compared, total) = check_gradients(text, 3, 5, 11);
    assert!(compared * 10 >= total * 9, "only {compared} of {total} derivatives settled");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Reverse-mode gradients of generated specs (elementwise operations,
    /// broadcasting, `where`, every reduction) against central differences,
    /// element by element; at least half must settle (see `check_gradients`).
    #[test]
    fn generated_specs_gradients_match_finite_differences(
        b in 1..=3usize, g in 2..=5usize, stmts in prop::collection::vec(stmt(), 1..8), seed in any::<u64>()
    ) {
        let text = render(b, g, &stmts);
        let (compared, total) = check_gradients(&text, b, g, seed);
        prop_assert!(2 * compared >= total, "only {} of {} derivatives settled for\n{}", compared, total, text);
    }
}

/// Every elementwise builtin in one spec, each on the output's path: the
/// gradients against central differences, and the kernels (forward and
/// gradient program, N = 3000 elements, not a multiple of any tile) against
/// the interpreter (relative error ≤ 1e-5; every element within 1e-4 of
/// its reference, relative to max(1, |reference|)).
#[test]
fn every_elementwise_function_has_a_checked_gradient_and_kernel() {
    let unary: Vec<&str> = attnc_compiler::ir::UnaryOp::ALL.iter().map(|op| op.name()).collect();
    for name in unary.iter().filter(|n| **n != "neg" && **n != "sqrt" && **n != "abs") {
        assert!(FUNCTIONS.iter().any(|(f, _)| f == name), "the generator never writes `{name}`");
    }
    let mut text = String::from(
        "spec every\n\ndim B = 3\ndim G = 1000\n\ninput a: [B, G] in finite\ninput b: [B, G] in finite\n\n",
    );
    let mut terms = vec![];
    for (k, (_, form)) in FUNCTIONS.iter().enumerate() {
        let x = if k % 2 == 0 { "a" } else { "a * 1.7 - b" };
        text.push_str(&format!("let f{k} = {}\n", form.replace("{x}", &format!("({x})")).replace("{b}", "b")));
        terms.push(format!("f{k} * {:?}", 0.3 + 0.1 * k as f64));
    }
    text.push_str(&format!("\noutput out = {}\n", terms.join(" + ")));
    let small = text.replace("dim G = 1000", "dim G = 4");
    let (compared, total) = check_gradients(&small, 3, 4, 5);
    assert!(compared * 10 >= total * 9, "only {compared} of {total} derivatives settled");

    let compiled = attnc_compiler::compile(&text, &[])
        .unwrap_or_else(|d| panic!("{}", attnc_compiler::render("every.attn", &text, &d)));
    let grad = attnc_compiler::grad::differentiate(&compiled.program, &[]).unwrap();
    let mut rng = Rng::for_input(9, "every");
    let mut draw = || Tensor::new(vec![3, 1000], (0..3000).map(|_| 4.0 * rng.unit() - 2.0).collect());
    let inputs = common::named(vec![("a", draw()), ("b", draw()), ("cot_out", draw())]);
    let gpu = common::needs_wgpu();
    for p in [&compiled.program, &grad] {
        let inputs: std::collections::BTreeMap<_, _> = inputs
            .iter()
            .filter(|(n, _)| p.inputs.iter().any(|i| &i.name == *n))
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        let (tensors, dims) = bind::bind_inputs(p, inputs.clone(), &Default::default()).unwrap();
        let want = interp::evaluate(p, &tensors, &dims);
        let got = gpu.run(&plan::plan(p, &dims), &inputs).unwrap().0;
        for ((name, _), (g, w)) in p.outputs.iter().zip(got.iter().zip(&want)) {
            assert!(w.data.iter().all(|v| v.is_finite()), "reference {name} is not finite");
            let e = attnc_runtime::relative_error(&g.data, &w.data);
            assert!(e <= 1e-5, "kernel {name} differs by {e:e}");
            for (i, (x, y)) in g.data.iter().zip(&w.data).enumerate() {
                assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "{name}[{i}]: kernel {x} vs interpreter {y}");
            }
        }
    }
}
