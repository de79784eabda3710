//! Golden tests over `tests/fixtures/{ok,err}/*.attn` and `stdlib/*.attn`:
//! one snapshot per input of the canonical text and IR, or of the rendered
//! diagnostics. An error fixture is named after the code it must produce.

mod common;

use attnc_compiler::{compile, render, Setting};
use std::path::Path;

/// `// set: NAME=VALUE` lines at the top of a fixture become `--set`s.
fn settings(source: &str) -> Vec<Setting> {
    source.lines().filter_map(|l| l.strip_prefix("// set:")).map(|s| Setting::parse(s.trim()).unwrap()).collect()
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

fn ok_snapshot(path: &Path) -> String {
    let source = std::fs::read_to_string(path).unwrap();
    let spec = attnc_grammar::parse(&source).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let printed = attnc_grammar::print_spec(&spec);
    let reparsed = attnc_grammar::parse(&printed).expect("the printed spec parses");
    assert_eq!(reparsed.without_spans(), spec.without_spans(), "parse(print(spec)) != spec for {}", path.display());
    assert_eq!(attnc_grammar::print_spec(&reparsed), printed, "printing is not idempotent");
    let compiled = compile(&source, &settings(&source))
        .unwrap_or_else(|d| panic!("{} has errors:\n{}", path.display(), render(&file_name(path), &source, &d)));
    assert!(compiled.warnings.is_empty(), "{} has warnings", path.display());
    assert!(attnc_compiler::valid::validate(&compiled.program).is_empty());
    format!("{printed}\n---- IR ----\n{}", compiled.program.pretty())
}

#[test]
fn ok_fixtures() {
    insta::glob!("fixtures/ok/*.attn", |path| {
        insta::assert_snapshot!(ok_snapshot(path));
    });
}

#[test]
fn stdlib_specs() {
    insta::glob!("../stdlib", "*.attn", |path| {
        insta::assert_snapshot!(ok_snapshot(path));
    });
}

#[test]
fn error_fixtures() {
    let mut codes = std::collections::BTreeSet::new();
    insta::glob!("fixtures/err/*.attn", |path| {
        let source = std::fs::read_to_string(path).unwrap();
        let name = file_name(path);
        let want = name.split('_').next().unwrap().to_string();
        let diags = match compile(&source, &settings(&source)) {
            Ok(_) => panic!("{name} compiled without errors"),
            Err(d) => d,
        };
        assert!(
            diags.iter().any(|d| d.is_error() && d.code.as_str() == want),
            "{name}: expected an error {want}, got {:?}",
            diags.iter().map(|d| d.code.as_str()).collect::<Vec<_>>()
        );
        codes.insert(want);
        insta::assert_snapshot!(render(&name, &source, &diags));
    });
    assert!(codes.len() >= 15, "only {} distinct error codes are covered by fixtures", codes.len());
}

#[test]
fn warning_fixtures() {
    insta::glob!("fixtures/warn/*.attn", |path| {
        let source = std::fs::read_to_string(path).unwrap();
        let name = file_name(path);
        let want = name.split('_').next().unwrap();
        let compiled = compile(&source, &settings(&source)).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        assert!(compiled.warnings.iter().any(|d| !d.is_error() && d.code.as_str() == want), "{name}: no {want}");
        insta::assert_snapshot!(render(&name, &source, &compiled.warnings));
    });
}

/// Every code in the catalogue is exercised: by a spec fixture, or (codes
/// about files, values and devices rather than spec text) by the named test.
#[test]
fn every_code_is_covered_and_explained() {
    let mut covered: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for dir in ["tests/fixtures/err", "tests/fixtures/warn"] {
        for entry in std::fs::read_dir(common::root().join(dir)).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            covered.insert(name.split('_').next().unwrap().to_string());
        }
    }
    let elsewhere = [
        ("E0502", "cli/main.rs: budget_and_io_refusals_have_their_own_codes, interpreter_runs_over_the_work_budget_are_refused_at_once"),
        ("E0601", "cli/main.rs: run_errors_name_the_tensor_and_write_nothing"),
        ("E0603", "cli/main.rs: budget_and_io_refusals_have_their_own_codes"),
        ("E0602", "reward_props.rs: bad_ratings_and_rewards_are_named_errors"),
        ("E0604", "functions.rs: an_out_of_range_read_names_the_tensor_and_the_index"),
        ("E0605", "cli/main.rs: non_finite_outputs_are_named_and_finite_refuses_them"),
        ("E0701", "head_mixing.rs: head_mixing_compiles_forward_and_backward"),
        ("E0702", "cli/main.rs: cuda_backend_without_cuda_is_a_clear_error; cuda_launch.rs: driver_failures_have_their_codes_and_write_nothing"),
        ("E0703", "cuda_launch.rs: driver_failures_have_their_codes_and_write_nothing"),
        ("E0704", "cuda_launch.rs: driver_failures_have_their_codes_and_write_nothing"),
        ("E0705", "cuda_launch.rs: a_kernel_nvrtc_refuses_names_itself_and_the_log"),
        ("E0706", "cuda_launch.rs: driver_failures_have_their_codes_and_write_nothing"),
        ("E0707", "cuda_launch.rs: driver_failures_have_their_codes_and_write_nothing"),
        ("E0708", "cuda_launch.rs: driver_failures_have_their_codes_and_write_nothing"),
        ("E0709", "cuda_launch.rs: the_caller_memory_launcher_uses_the_callers_pointers_and_stream"),
        ("E0801", "gradients.rs: discrete_inputs_have_no_gradient_and_say_so; cli/main.rs: grad_writes_gradients_or_refuses_clearly"),
        ("E0901", "internal: the validator rejecting lowered IR is a compiler bug, unreachable from specs"),
    ];
    // Each test named above exists, and its file asserts the code (`"E0601"`,
    // `error[E0601]` or the `Code` variant).
    for (code, place) in elsewhere.iter().filter(|(_, place)| !place.starts_with("internal")) {
        let variant = attnc_compiler::Code::ALL.iter().find(|c| c.as_str() == *code).expect("a known code");
        let mut asserted = false;
        for part in place.split("; ") {
            let (file, tests) = part.split_once(": ").expect("file: tests");
            let text = std::fs::read_to_string(common::root().join("tests").join(file)).unwrap();
            for test in tests.split(", ") {
                assert!(text.contains(&format!("fn {test}(")), "{code}: no test {test} in {file}");
            }
            asserted |= [format!("\"{code}\""), format!("[{code}]"), format!("Code::{variant:?}")]
                .iter()
                .any(|needle| text.contains(needle.as_str()));
        }
        assert!(asserted, "{code}: {place} never asserts it");
    }
    for code in attnc_compiler::Code::ALL {
        assert!(code.explanation().len() > 20 && !code.title().is_empty(), "{} is not explained", code.as_str());
        assert!(
            covered.contains(code.as_str()) || elsewhere.iter().any(|(c, _)| *c == code.as_str()),
            "no fixture or test covers {}",
            code.as_str()
        );
    }
}

/// `docs/language.md` lists every builtin: its table is the compiler's
/// (`builtins::markdown_table`), between the page's markers.
#[test]
fn the_language_page_lists_every_builtin() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/language.md")).unwrap();
    let start = "<!-- builtins: generated from compiler/src/builtins.rs -->\n";
    let (_, rest) = page.split_once(start).expect("the page's builtin-table marker");
    let (table, _) = rest.split_once("<!-- /builtins -->").expect("the table's end marker");
    let want = attnc_compiler::builtins::markdown_table();
    assert_eq!(table, want, "docs/language.md's builtin table is stale; replace it with:\n{want}");
    for b in attnc_compiler::builtins::Builtin::ALL {
        assert!(table.contains(&format!("| `{}` |", b.name())), "{} is not in docs/language.md", b.name());
    }
}
