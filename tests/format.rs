//! `attnc fmt`: comments and paragraph breaks survive, formatting is
//! idempotent and never changes what a spec means.

mod common;

use attnc_grammar::{comments, format_spec, parse};
use common::{root, stdlib_names, stdlib_source};
use proptest::prelude::*;
use std::process::Command;

fn format(source: &str) -> String {
    let spec = parse(source).unwrap_or_else(|e| panic!("does not parse: {e}\n{source}"));
    format_spec(source, &spec)
}

fn comment_texts(source: &str) -> Vec<String> {
    comments(source).into_iter().map(|c| c.text).collect()
}

/// Formatting `source` keeps its comments in order and its meaning, and a
/// second formatting changes nothing.
fn check_invariants(source: &str) {
    let once = format(source);
    assert_eq!(format(&once), once, "formatting is not idempotent; first pass:\n{once}");
    assert_eq!(comment_texts(&once), comment_texts(source), "comments changed; formatted:\n{once}");
    assert_eq!(
        parse(&once).unwrap().without_spans(),
        parse(source).unwrap().without_spans(),
        "formatting changed the spec:\n{once}"
    );
}

#[test]
fn comments_blank_lines_and_alignment() {
    // Written by hand: what a person expects `attnc fmt` to make of a messy file.
    let source = "# header, before the spec line\nspec  demo   // the name\n\
                  param H: int=8 // heads\nparam d :int = 64      # width\n\n\n\
                  // inputs follow\ninput x: [4,\n  // inside an item\n  H * d]\n\
                  let y = x@x   // a \"quoted\" # and //\n\
                  require H >= 1, \"not // a # comment\"\n\
                  output z = y\n// the end\n";
    let expected = "# header, before the spec line\nspec demo  // the name\n\n\
                    param H: int = 8   // heads\nparam d: int = 64  # width\n\n\
                    // inputs follow\n// inside an item\ninput x: [4, H * d]\n\n\
                    let y = x @ x  // a \"quoted\" # and //\n\n\
                    require H >= 1, \"not // a # comment\"\n\n\
                    output z = y\n\n// the end\n";
    assert_eq!(format(source), expected);
    check_invariants(source);
}

#[test]
fn shipped_specs_and_fixtures_are_formatted_or_format_stably() {
    for name in stdlib_names() {
        let source = stdlib_source(&name);
        assert_eq!(format(&source), source, "stdlib/{name}.attn is not formatted (attnc fmt --write)");
        check_invariants(&source);
    }
    for entry in std::fs::read_dir(root().join("tests/fixtures/ok")).unwrap() {
        let source = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        check_invariants(&source);
    }
}

/// A comment body: includes the characters that start comments and strings.
fn comment_body() -> impl Strategy<Value = String> {
    "[a-z \"#/=:]{0,12}"
}

#[derive(Clone, Debug)]
enum Edit {
    /// Append `// body` (or `# body`) to line `i`.
    Trailing(usize, bool, String),
    /// Insert an own-line comment before line `i`.
    OwnLine(usize, bool, String),
    /// Insert a blank line before line `i`.
    Blank(usize),
    /// Indent line `i`.
    Indent(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<prop::sample::Index>(), any::<bool>(), comment_body()).prop_map(|(i, h, b)| Edit::Trailing(
            i.index(1 << 16),
            h,
            b
        )),
        (any::<prop::sample::Index>(), any::<bool>(), comment_body()).prop_map(|(i, h, b)| Edit::OwnLine(
            i.index(1 << 16),
            h,
            b
        )),
        any::<prop::sample::Index>().prop_map(|i| Edit::Blank(i.index(1 << 16))),
        any::<prop::sample::Index>().prop_map(|i| Edit::Indent(i.index(1 << 16))),
    ]
}

fn apply(source: &str, edits: &[Edit]) -> String {
    let mut lines: Vec<String> = source.lines().map(str::to_string).collect();
    for e in edits {
        let n = lines.len();
        let mark = |hash: bool| if hash { "#" } else { "//" };
        match e {
            Edit::Trailing(i, h, b) => lines[i % n].push_str(&format!("  {} {b}", mark(*h))),
            Edit::OwnLine(i, h, b) => lines.insert(i % (n + 1), format!("{} {b}", mark(*h))),
            Edit::Blank(i) => lines.insert(i % (n + 1), String::new()),
            Edit::Indent(i) => lines[i % n].insert_str(0, "   "),
        }
    }
    lines.join("\n") + "\n"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Random comments, blank lines and indentation added to the shipped
    /// specs: every comment survives in order, fmt(fmt(x)) = fmt(x), and the
    /// spec parses to the same tree.
    #[test]
    fn random_comments_survive_formatting(
        which in any::<prop::sample::Index>(),
        edits in prop::collection::vec(edit(), 0..12),
    ) {
        let names = stdlib_names();
        let source = apply(&stdlib_source(&names[which.index(names.len())]), &edits);
        prop_assume!(parse(&source).is_ok());
        check_invariants(&source);
    }
}

fn attnc(args: &[&str], dir: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_attnc")).args(args).current_dir(dir).output().expect("attnc runs")
}

#[test]
fn fmt_check_and_write() {
    let dir = tempdir();
    let messy = "spec m   // keep me\ndim N=4\ninput x: [N, N]\noutput y = x@x # and me\n";
    std::fs::write(dir.join("m.attn"), messy).unwrap();
    std::fs::write(dir.join("bad.attn"), "spec b\nlet = 3\n").unwrap();

    let check = attnc(&["fmt", "--check", "m.attn"], &dir);
    assert_eq!(check.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&check.stderr).contains("m.attn: not formatted"));
    assert!(check.stdout.is_empty());

    // A syntax error in one file: nothing is written, the error names file:line:col.
    let both = attnc(&["fmt", "--write", "m.attn", "bad.attn"], &dir);
    assert_eq!(both.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&both.stderr).contains("bad.attn:2:"), "{}", String::from_utf8_lossy(&both.stderr));
    assert_eq!(std::fs::read_to_string(dir.join("m.attn")).unwrap(), messy);

    let write = attnc(&["fmt", "--write", "m.attn"], &dir);
    assert!(write.status.success());
    let written = std::fs::read_to_string(dir.join("m.attn")).unwrap();
    assert_eq!(written, "spec m  // keep me\n\ndim N = 4\n\ninput x: [N, N]\n\noutput y = x @ x  # and me\n");
    assert!(attnc(&["fmt", "--check", "m.attn"], &dir).status.success());
    // Printing is the default, and agrees with what --write wrote.
    let printed = attnc(&["fmt", "m.attn"], &dir);
    assert_eq!(String::from_utf8_lossy(&printed.stdout), written);
    // No temporary file is left behind.
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 2, "{left:?}");
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("attnc-fmt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
