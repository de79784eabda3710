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
