//! The tree's shape, checked (an invariant of ARCHITECTURE.md): no module of
//! a crate imports another that imports it back, by any chain of `crate::`
//! and `super::` paths (a module and its own submodules aside), and no Rust
//! file of the repository (tests, examples and fuzz targets included;
//! vendored sources aside) is over 800 lines.

mod common;

use common::root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates' source folders.
const CRATES: [&str; 5] = ["grammar/src", "compiler/src", "runtime/src", "src", "python/src"];
const MAX_LINES: usize = 800;

type Module = Vec<String>;

/// Each `.rs` file under `dir` by its module path (`a/mod.rs` and `a.rs`
/// are `a`; `lib.rs` and `main.rs` are the root), with its text.
fn sources(dir: &Path) -> BTreeMap<Module, String> {
    let mut out = BTreeMap::new();
    for path in rust_files(dir) {
        let rel = path.strip_prefix(dir).unwrap().with_extension("");
        let mut m: Module = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
            m.pop();
        }
        // `main.rs` beside `lib.rs` is its own crate's root: keep both apart.
        let key = if path.ends_with("main.rs") && m.is_empty() { vec!["<main>".into()] } else { m };
        out.insert(key, std::fs::read_to_string(&path).unwrap());
    }
    out
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let (mut files, mut stack) = (vec![], vec![dir.to_path_buf()]);
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The text without comments and without its `#[cfg(test)]` tail.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

fn ident(s: &str) -> (&str, &str) {
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// The paths a `crate::`/`super::` path at the start of `s` names, as
/// segments after the prefix (braced groups expand to each first segment).
fn paths(s: &str) -> Vec<Vec<String>> {
    let (mut segs, mut rest) = (vec![], s);
    loop {
        let (id, r) = ident(rest);
        if id.is_empty() {
            if let Some(inner) = r.strip_prefix('{') {
                let mut depth = 0;
                let mut out = vec![];
                let mut start = 0;
                for (i, c) in inner.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            out.push(&inner[start..i]);
                            break;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            out.push(&inner[start..i]);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                return out
                    .into_iter()
                    .flat_map(|item| paths(item.trim_start()))
                    .map(|p| segs.iter().cloned().chain(p).collect())
                    .collect();
            }
            return vec![segs];
        }
        segs.push(id.to_string());
        match r.strip_prefix("::") {
            Some(r) => rest = r,
            None => return vec![segs],
        }
    }
}

/// Module → the other modules of its crate it names (not its ancestors or
/// descendants).
fn graph(mods: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut g: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, text) in mods {
        let text = code(text);
        for (at, _) in text.match_indices("crate::").chain(text.match_indices("super::")) {
            if text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            // `super::super::…` climbs once per `super`.
            let mut base: Module = if text[at..].starts_with("crate") { vec![] } else { m.clone() };
            let mut rest = &text[at..];
            if rest.starts_with("crate::") {
                rest = &rest["crate::".len()..];
            }
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            for p in paths(rest) {
                let full: Module = base.iter().cloned().chain(p).collect();
                let Some(target) = (0..=full.len()).rev().map(|k| full[..k].to_vec()).find(|t| mods.contains_key(t))
                else {
                    continue;
                };
                let related = target.starts_with(m) || m.starts_with(&target);
                if !related {
                    g.entry(m.clone()).or_default().insert(target);
                }
            }
        }
    }
    g
}

/// A cycle of `g`, if it has one, as the modules along it.
fn cycle(g: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn visit(
        g: &BTreeMap<Module, BTreeSet<Module>>,
        m: &Module,
        path: &mut Vec<Module>,
        done: &mut BTreeSet<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            return Some(path[i..].to_vec());
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.clone());
        for next in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(g, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.clone());
        None
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|m| visit(g, m, &mut vec![], &mut done))
}

fn show(c: &[Module]) -> String {
    c.iter().map(|m| if m.is_empty() { "crate".to_string() } else { m.join("::") }).collect::<Vec<_>>().join(" -> ")
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    for dir in CRATES {
        let mods = sources(&root().join(dir));
        assert!(!mods.is_empty(), "{dir}: no sources");
        let g = graph(&mods);
        if let Some(c) = cycle(&g) {
            panic!("{dir}: import circle {} -> {}", show(&c), show(&c[..1]));
        }
    }
}

/// The check finds circles: direct, through `super::`, in braced groups and
/// over three modules; and leaves a module and its submodules alone.
#[test]
fn the_circle_check_finds_circles() {
    let mods = |files: &[(&str, &str)]| -> BTreeMap<Module, String> {
        files
            .iter()
            .map(|(m, t)| (m.split("::").filter(|s| !s.is_empty()).map(String::from).collect(), t.to_string()))
            .collect()
    };
    let circles = [
        vec![("", ""), ("a", "use crate::b::X;"), ("b", "use crate::a::{self, Y};")],
        vec![("", ""), ("p", ""), ("p::a", "use super::b;"), ("p::b", "fn f() { super::{c, a}::g(); }"), ("p::c", "")],
        vec![("", ""), ("a", "use crate::b;"), ("b", "use crate::c::Z;"), ("c", "pub use crate::{a, d};"), ("d", "")],
    ];
    for files in circles {
        assert!(cycle(&graph(&mods(&files))).is_some(), "missed the circle in {files:?}");
    }
    let fine = [
        vec![("", ""), ("a", "mod sub; use sub::X;"), ("a::sub", "use super::Y;"), ("b", "use crate::a::sub::X;")],
        vec![("", ""), ("a", "// crate::b in a comment"), ("b", "use crate::a;")],
        vec![("", ""), ("a", "use crate::b;\n#[cfg(test)]\nmod tests { use crate::b; }"), ("b", "")],
    ];
    for files in fine {
        let c = cycle(&graph(&mods(&files)));
        assert!(c.is_none(), "a circle where there is none in {files:?}: {c:?}");
    }
}

/// Folders whose Rust files are not ours: third-party sources and build output.
const NOT_OURS: [&str; 4] = ["vendor", "target", "fuzz/target", ".git"];

#[test]
fn no_rust_file_is_over_800_lines() {
    let mut long = vec![];
    let ours = |p: &Path| !NOT_OURS.iter().any(|d| p.starts_with(root().join(d)));
    let top: Vec<PathBuf> = std::fs::read_dir(root()).unwrap().map(|e| e.unwrap().path()).collect();
    let mut files: Vec<PathBuf> = top.iter().filter(|p| p.is_dir() && ours(p)).flat_map(|d| rust_files(d)).collect();
    files.retain(|p| ours(p));
    assert!(files.iter().any(|p| p.starts_with(root().join("tests"))), "tests/ is checked");
    for path in files {
        let n = std::fs::read_to_string(&path).unwrap().lines().count();
        if n > MAX_LINES {
            long.push(format!("{} ({n} lines)", path.display()));
        }
    }
    assert!(long.is_empty(), "over {MAX_LINES} lines:\n{}", long.join("\n"));
}

/// Whether `source` defines `name`: an item, a field or variant (`name:`,
/// `name {`, `name(`, `name,` opening a line), a scalar a cubecl macro
/// defines (`!(pub name)`), or a re-export.
fn defines(source: &str, name: &str) -> bool {
    let item = ["fn", "struct", "enum", "const", "static", "type", "trait", "mod", "macro_rules!"]
        .iter()
        .any(|kw| source.split(&format!("{kw} {name}")).skip(1).any(|rest| !rest.starts_with(is_ident)));
    let member = source.lines().any(|l| {
        let t = l.trim_start();
        let t = t.strip_prefix("pub(crate) ").or_else(|| t.strip_prefix("pub ")).unwrap_or(t);
        t.strip_prefix(name).is_some_and(|rest| rest.trim_start().starts_with(['{', '(', ',', ':']))
    });
    let reexport =
        source.lines().any(|l| l.trim_start().starts_with("pub use") && l.split(is_not_ident).any(|w| w == name));
    item || member || reexport || source.contains(&format!("!(pub {name})"))
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_not_ident(c: char) -> bool {
    !is_ident(c)
}

/// ARCHITECTURE.md names code as `module::name` or `Type::name`: each must
/// still exist — `name` defined in a file of that module (`module.rs` or
/// under `module/`), or, for a type, the type (or enum variant) and `name`
/// somewhere in our sources.
#[test]
fn every_name_architecture_md_cites_exists() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let files: Vec<PathBuf> =
        CRATES.iter().chain(&["tests", "examples"]).flat_map(|dir| rust_files(&root().join(dir))).collect();
    let sources: Vec<(PathBuf, String)> =
        files.into_iter().map(|p| (p.clone(), std::fs::read_to_string(&p).unwrap())).collect();
    let foreign = ["std", "cubecl", "cubek", "egg", "crate", "super", "attnc", "attnc_runtime", "attnc_compiler"];
    let mut cited = 0;
    let mut missing = vec![];
    for quoted in text.split('`').skip(1).step_by(2) {
        let path = quoted.strip_suffix("()").unwrap_or(quoted);
        let segments: Vec<&str> = path.split("::").collect();
        if segments.len() < 2 || segments.iter().any(|s| s.is_empty() || !s.chars().all(is_ident)) {
            continue;
        }
        let (owner, name) = (segments[segments.len() - 2], segments[segments.len() - 1]);
        if foreign.contains(&segments[0]) || foreign.contains(&owner) {
            continue;
        }
        cited += 1;
        let found = if owner.starts_with(|c: char| c.is_ascii_uppercase()) {
            let owner_exists = sources.iter().any(|(_, s)| defines(s, owner));
            owner_exists && sources.iter().any(|(_, s)| defines(s, name))
        } else {
            sources.iter().any(|(p, s)| {
                let in_module =
                    p.file_stem().is_some_and(|f| f == owner) || p.components().any(|c| c.as_os_str() == owner);
                in_module && defines(s, name)
            })
        };
        if !found {
            missing.push(path.to_string());
        }
    }
    assert!(cited > 40, "only {cited} names cited: is the scan reading ARCHITECTURE.md?");
    assert!(missing.is_empty(), "ARCHITECTURE.md cites names that no longer exist: {missing:?}");
    assert!(!defines("fn walk_tiles_x() {}", "walk_tiles") && defines("pub fn walk_tiles(", "walk_tiles"));
}
