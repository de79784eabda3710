//! No silent clamp: a score or mask function that would read outside a
//! captured tensor, or leave 32-bit integers, is refused (E0604) before any
//! backend runs it (`interp::reach`), naming the call the interpreter would
//! fail at; the kernels, which clamp and wrap, never see it. Held to the
//! interpreter on generated functions, and on the CLI for wgpu.

mod common;
#[path = "common/specgen.rs"]
mod specgen;

use attnc_runtime::{bind, interp, Tensor};
use common::*;
use proptest::prelude::*;
use specgen::{bool_expr, float_expr, mask_body, score_body};
use std::collections::BTreeMap;

/// A spec of two batches, two query heads on one key head, `t: [2, N]` and
/// `u: [N]` to read, and the functions given.
fn spec(m: usize, n: usize, score: &str, mask: Option<&str>) -> String {
    let mask = mask.map(|b| format!(", mask = |b, h, i, j| {b}")).unwrap_or_default();
    format!(
        "spec gen\ndim M = {m}\ndim N = {n}\ninput q: [2, 2, M, 8]\ninput k: [2, 1, N, 8]\ninput v: [2, 1, N, 8]\n\
         input t: [2, N]\ninput u: [N]\noutput o = attention(q, k, v, score = |s, b, h, i, j| {score}{mask})\n"
    )
}

fn seeded(c: &attnc_compiler::Compiled, seed: u64) -> BTreeMap<String, Tensor> {
    let (drawn, _) = bind::generate_inputs(&c.program, seed).unwrap();
    c.program.inputs.iter().map(|i| i.name.clone()).zip(drawn).collect()
}

/// Cases of the generated comparison: 300, or `ATTNC_REACH_CASES` (the
/// long campaign of bench/RESULTS.md).
fn cases() -> u32 {
    std::env::var("ATTNC_REACH_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// The check against the interpreter's own evaluation: it refuses every
    /// program the interpreter fails on, at the same call with the same
    /// words, and passes every other, except a fault it reports as behind a
    /// condition it cannot decide (`maybe`: on the logit `s`).
    #[test]
    fn the_check_refuses_exactly_what_the_interpreter_fails_on(
        score in score_body(), mask in prop::option::of(mask_body()),
        m in 1usize..40, n in 1usize..40, seed in any::<u64>()
    ) {
        let text = spec(m, n, &score, mask.as_deref());
        let c = match attnc_compiler::compile(&text, &[]) {
            Ok(c) => c,
            // Generated text may be refused (a constant the language rejects): with a code, never a panic.
            Err(d) => { prop_assert!(!d.is_empty()); return Ok(()); }
        };
        let inputs = seeded(&c, seed);
        let (tensors, dims) = bind::bind_inputs(&c.program, inputs, &Default::default()).unwrap();
        let checked = interp::reach::check(&c.program, Some(&tensors), &dims);
        let ran = interp::try_evaluate(&c.program, &tensors, &dims);
        match (&checked, &ran) {
            (Ok(()), Ok(_)) => {}
            (Err(e), Err(want)) if !e.maybe => prop_assert_eq!(e.to_string(), want.to_string(), "{}", text),
            (Err(e), _) if e.maybe => {}
            _ => prop_assert!(false, "check {:?} but the interpreter {:?} for\n{}", checked, ran.map(|_| ()), text),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// Without the tensors' data (device-resident inputs) the check is
    /// conservative: it passes no program that fails with the data.
    #[test]
    fn without_data_the_check_refuses_at_least_as_much(
        score in float_expr(true), mask in bool_expr(false), m in 1usize..30, n in 1usize..30, seed in any::<u64>()
    ) {
        let text = spec(m, n, &score, Some(&mask));
        let Ok(c) = attnc_compiler::compile(&text, &[]) else { return Ok(()) };
        let (tensors, dims) = bind::bind_inputs(&c.program, seeded(&c, seed), &Default::default()).unwrap();
        if interp::reach::check(&c.program, Some(&tensors), &dims).is_err() {
            prop_assert!(interp::reach::check(&c.program, None, &dims).is_err(), "{}", text);
        }
    }
}

/// Every shipped spec with functions is proved whole (its reads stay in
/// range at every call, with or without data).
#[test]
fn shipped_specs_pass_the_check() {
    for name in stdlib_names() {
        let c = compile_stdlib(&name, &[]);
        let dims = bind::default_dims(&c.program).unwrap();
        interp::reach::check(&c.program, None, &dims).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// The cases on the CLI, wgpu against the interpreter: the same
/// code and words, a non-zero exit, no output file; the guarded read and
/// the causal one run, equal to the interpreter, at N past several tiles.
#[test]
fn out_of_range_calls_are_refused_on_wgpu_as_on_the_interpreter() {
    needs_wgpu();
    let dir = std::env::temp_dir().join(format!("attnc-reach-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |text: &str, backend: &str| {
        let (path, out) = (dir.join("f.attn"), dir.join(format!("{backend}.safetensors")));
        let _ = std::fs::remove_file(&out);
        std::fs::write(&path, text).unwrap();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_attnc"))
            .args(["run", path.to_str().unwrap(), "--seed", "3", "--backend", backend])
            .args(["--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        (
            o.status.success(),
            stderr,
            out.exists().then(|| attnc_runtime::io::read_tensors(&out, &Default::default()).unwrap()),
        )
    };
    let refused = [
        (
            "s + t[h, i * 100000 * 100000]",
            "causal",
            "the score function's integer `((i * 100000) * 100000)` is 10000000000, outside 32 bits",
        ),
        (
            "s + t[h, i - j]",
            "none",
            "the score function reads `t[0, -1]`, outside its shape [2, 1030] (at b=0, h=0, i=0, j=1)",
        ),
        (
            "s + u[j + 1]",
            "causal",
            "the score function reads `u[1030]`, outside its shape [1030] (at b=0, h=0, i=1029, j=1029)",
        ),
    ];
    for (score, mask, words) in refused {
        let text = format!(
            "spec r\ndim N = 1030\ninput q: [1, 2, N, 16]\ninput k: [1, 2, N, 16]\ninput v: [1, 2, N, 16]\n\
             input t: [2, N]\ninput u: [N]\noutput o = attention(q, k, v, mask = {mask}, score = |s, b, h, i, j| {score})\n"
        );
        for backend in ["interp", "wgpu"] {
            let (ok, stderr, out) = run(&text, backend);
            assert!(!ok && out.is_none(), "{backend} ran `{score}`");
            assert!(stderr.contains(&format!("error[E0604]: {words}")), "{backend}, `{score}`:\n{stderr}");
        }
    }
    // In range wherever the pair is visible (query row i stands at key
    // position i + N - M): by the causal mask, by `where`.
    for (score, mask) in
        [("s + t[h, i + (N - M) - j]", "causal"), ("where(i + 200 >= j, s + t[h, i + 200 - j], s - 1.0)", "none")]
    {
        let text = format!(
            "spec r\ndim M = 1100\ndim N = 1300\ninput q: [1, 2, M, 64]\ninput k: [1, 2, N, 64]\ninput v: [1, 2, N, 64]\n\
             input t: [2, N]\noutput o = attention(q, k, v, mask = {mask}, score = |s, b, h, i, j| {score})\n"
        );
        let (_, e1, want) = run(&text, "interp");
        let (_, e2, got) = run(&text, "wgpu");
        let (want, got) = (want.unwrap_or_else(|| panic!("{e1}")), got.unwrap_or_else(|| panic!("{e2}")));
        let e = attnc_runtime::relative_error(&got["o"].data, &want["o"].data);
        assert!(e <= 1e-4 && got["o"].data.iter().all(|v| v.is_finite()), "`{score}`: relative error {e:e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
