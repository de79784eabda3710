//! The CUDA launcher's half that needs no GPU, held to the emitted text:
//! the `info` struct packed from the manifest is read back through its own
//! C declaration compiled by the host C++ compiler (size, offsets, every
//! length and scalar where the kernel reads it); each kernel's parameters
//! are the manifest's bindings in order, then the struct; temporaries
//! alive together never share workspace bytes; and every manifest's grid
//! follows from its `grid_rule`, evaluated here by a parser of its own,
//! whose text is true. Without a C++ compiler the test fails, saying so.

mod common;

use attnc_compiler::plan::{self, Dtype, Plan};
use attnc_runtime::bind;
use attnc_runtime::cuda::abi::{self, InfoLayout, Place};
use attnc_runtime::gpu::emit::{self, Manifest};
use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

/// A program of the matrix: a stdlib spec at some sizes, forward or
/// gradient, in a dtype, split for `units` compute units.
struct Case {
    spec: String,
    sets: Vec<(&'static str, String)>,
    grad: bool,
    dtype: Dtype,
    units: Option<usize>,
}

fn case(spec: &str, sets: &[(&'static str, &str)], grad: bool, dtype: Dtype, units: Option<usize>) -> Case {
    let sets = sets.iter().map(|(k, v)| (*k, v.to_string())).collect();
    Case { spec: spec.to_string(), sets, grad, dtype, units }
}

fn plan_of(c: &Case) -> Plan {
    let program = compile_stdlib(&c.spec, &c.sets).program;
    let program = match c.grad {
        true => attnc_compiler::grad::differentiate(&program, &[]).expect("differentiable"),
        false => program,
    };
    let dims = bind::default_dims(&program).expect("default dims");
    let p = plan::plan(&program, &dims).in_dtype(c.dtype);
    c.units.map_or(p.clone(), |u| p.split_kv(u))
}

/// Every stdlib spec forward and (where it has one) its gradient program in
/// f32, the attention specs in bf16 (integer digits of `lengths`, block
/// tables), and the sizes whose grids split over keys or fold past 65535.
fn cases() -> Vec<Case> {
    let mut cases = vec![];
    for name in stdlib_names() {
        let program = compile_stdlib(&name, &[]).program;
        cases.push(case(&name, &[], false, Dtype::F32, None));
        if attnc_compiler::grad::differentiate(&program, &[]).is_ok() {
            cases.push(case(&name, &[], true, Dtype::F32, None));
        }
    }
    for name in ["mha", "kvcache", "paged", "document"] {
        cases.push(case(name, &[], false, Dtype::Bf16, None));
    }
    // The manifest: MHA at N = 1024 split for an H200's 132 SMs.
    cases.push(case("mha", &[("N", "1024")], false, Dtype::F32, Some(132)));
    cases.push(case("kvcache", &[("N", "32768"), ("d", "128")], false, Dtype::Bf16, Some(132)));
    // 70000 groups: a group kernel's cubes past 65535, laid out over the grid.
    cases.push(case("grpo", &[("B", "70000")], false, Dtype::F32, None));
    cases
}

type Emitted = (Case, Vec<(String, String)>, Manifest, Value);

/// Every case emitted for CUDA (once for the three tests).
fn emitted() -> &'static [Emitted] {
    static ALL: std::sync::OnceLock<Vec<Emitted>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        cases()
            .into_iter()
            .map(|c| {
                let (files, manifest) = emit::emit(&plan_of(&c), emit::Target::Cuda).expect("CUDA emission");
                let json = serde_json::to_value(&manifest).expect("the manifest serialises");
                (c, files, manifest, json)
            })
            .collect()
    })
}

fn name(c: &Case) -> String {
    format!("{}{} {} {:?}", c.spec, if c.grad { " --grad" } else { "" }, c.dtype, c.sets)
}

fn uint(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not an unsigned integer"))
}

/// C++ that reads each launch's packed `info` bytes through the launch's
/// own declaration and prints, a line each: size, field offsets, values.
fn reader(json: &Value, packed: &[Vec<u8>]) -> String {
    let mut cpp = String::from("#include <cstdint>\n#include <cstddef>\n#include <cstdio>\n#include <cstring>\n");
    let mut main = String::from("int main() {\n");
    for (i, (l, bytes)) in json["launches"].as_array().unwrap().iter().zip(packed).enumerate() {
        let decl = l["info_struct"].as_str().unwrap();
        if decl.is_empty() {
            main.push_str(&format!("  std::printf(\"L{i} none\\n\");\n"));
            continue;
        }
        let layout = InfoLayout::parse(decl).unwrap();
        let data: Vec<String> = bytes.iter().map(|b| b.to_string()).collect();
        cpp.push_str(&format!(
            "namespace n{i} {{ {decl};\nconst unsigned char bytes[] = {{{}}};\nvoid print() {{\n  info_st s; std::memcpy(&s, bytes, sizeof bytes);\n  std::printf(\"L{i} %zu %zu\", sizeof(info_st), sizeof bytes);\n",
            data.join(",")
        ));
        for f in &layout.fields {
            let (n, fmt, cast) = match f.ty.as_str() {
                "float" => (&f.name, "%.9g", "(double)"),
                _ => (&f.name, "%llu", "(unsigned long long)"),
            };
            cpp.push_str(&format!("  std::printf(\" {n}@%zu\", offsetof(info_st, {n}));\n"));
            cpp.push_str(&format!(
                "  for (int k = 0; k < {}; k++) std::printf(\"%s{fmt}\", k ? \",\" : \"=\", {cast}s.{n}[k]);\n",
                f.count
            ));
        }
        cpp.push_str("  std::printf(\"\\n\");\n}\n}\n");
        main.push_str(&format!("  n{i}::print();\n"));
    }
    cpp + &main + "}\n"
}

fn compile_and_run(cpp: &str, tag: &str) -> String {
    let dir = std::env::temp_dir().join(format!("attnc-abi-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("abi.cpp"), dir.join("abi"));
    std::fs::write(&src, cpp).unwrap();
    let out = Command::new("c++").args(["-std=c++17", "-O0", "-o"]).arg(&exe).arg(&src).output().unwrap_or_else(|e| {
        panic!("this test compiles the emitted info structs with the host C++ compiler `c++`, which did not run ({e}); install g++")
    });
    assert!(out.status.success(), "c++ failed:\n{}\n{cpp}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(run.stdout).unwrap()
}

/// `extern "C" __global__ void ... ENTRY(PARAMS) {`: the parameters.
fn parameters<'a>(source: &'a str, entry: &str) -> Vec<&'a str> {
    let at = source.find(&format!(" {entry}(")).unwrap_or_else(|| panic!("no declaration of `{entry}`"));
    let open = at + entry.len() + 2;
    let close = open + source[open..].find(')').unwrap();
    source[open..close].split(',').map(str::trim).collect()
}

#[test]
fn info_structs_and_parameters_follow_the_manifest() {
    let mut checked = 0;
    for (n, (c, files, manifest, json)) in emitted().iter().enumerate() {
        let what = name(c);
        let packed = abi::infos(manifest).unwrap();
        let printed = compile_and_run(&reader(json, &packed), &n.to_string());
        let launches = json["launches"].as_array().unwrap();
        for (i, ((l, line), (_, source))) in launches.iter().zip(printed.lines()).zip(files).enumerate() {
            let entry = l["entry"].as_str().unwrap();
            let bindings = l["bindings"].as_array().unwrap();
            // The kernel's parameters: a pointer per binding in order, then the struct by value.
            let params = parameters(source, entry);
            let decl = l["info_struct"].as_str().unwrap();
            let pointers = params.iter().take_while(|p| p.contains('*')).count();
            assert_eq!(pointers, bindings.len(), "{what}: {entry}'s pointer parameters: {params:?}");
            assert_eq!(params.len(), pointers + usize::from(!decl.is_empty()), "{what}: {entry}: {params:?}");
            if !decl.is_empty() {
                assert!(params.last().unwrap().contains("info_st"), "{what}: {entry}: {params:?}");
            }
            let mut words = line.split(' ');
            assert_eq!(words.next(), Some(format!("L{i}").as_str()), "{what}: {line}");
            if decl.is_empty() {
                assert_eq!(words.next(), Some("none"));
                continue;
            }
            let layout = InfoLayout::parse(decl).unwrap();
            let (size, given): (usize, usize) =
                (words.next().unwrap().parse().unwrap(), words.next().unwrap().parse().unwrap());
            assert_eq!((layout.size, given), (size, size), "{what}: {entry}: sizeof({decl})");
            for (f, word) in layout.fields.iter().zip(words) {
                let (head, values) = word.split_once('=').unwrap();
                assert_eq!(head, format!("{}@{}", f.name, f.offset), "{what}: {entry}: offset of {} in {decl}", f.name);
                // f32 values as C prints them (9 digits: exact once read back as f32).
                let values: Vec<f64> = (values.split(','))
                    .map(|v| v.parse::<u64>().map(|u| u as f64).unwrap_or_else(|_| v.parse::<f32>().unwrap() as f64))
                    .collect();
                // What the manifest says each slot holds, read from its JSON.
                let expected: Vec<f64> = match f.name.as_str() {
                    "static_meta" => bindings
                        .iter()
                        .map(|b| {
                            (uint(&json["buffers"][uint(&b["buffer"]) as usize]["len"]) / uint(&b["line_size"])) as f64
                        })
                        .collect(),
                    "scalars_f32" => l["scalars"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|s| s["value"].as_f64().unwrap() as f32 as f64)
                        .collect(),
                    other => panic!("{what}: {entry}: unexpected field {other}"),
                };
                assert!(values.len() >= expected.len(), "{what}: {entry}: {} too short", f.name);
                assert_eq!(&values[..expected.len()], &expected[..], "{what}: {entry}: {} through C", f.name);
                assert!(values[expected.len()..].iter().all(|v| *v == 0.0), "{what}: {entry}: padding");
                checked += 1;
            }
        }
    }
    assert!(checked > 200, "{checked} fields checked");
}

#[test]
fn temporaries_alive_together_never_share_workspace_bytes() {
    for (c, _, manifest, json) in emitted() {
        let what = name(c);
        let layout = abi::Layout::of(manifest);
        let launches = json["launches"].as_array().unwrap();
        let span = |id: usize| -> (usize, usize) {
            let uses: Vec<usize> = (launches.iter().enumerate())
                .filter(|(_, l)| l["bindings"].as_array().unwrap().iter().any(|b| uint(&b["buffer"]) as usize == id))
                .map(|(i, _)| i)
                .collect();
            (*uses.first().unwrap_or(&0), *uses.last().unwrap_or(&0))
        };
        let mut temps = vec![];
        for (id, b) in json["buffers"].as_array().unwrap().iter().enumerate() {
            let output = json["outputs"].as_object().unwrap().values().any(|o| uint(o) as usize == id);
            let place = &layout.places[id];
            match (b["role"].as_str().unwrap(), output) {
                ("input", _) => assert_eq!(place, &Place::Tensor(b["name"].as_str().unwrap().into()), "{what}"),
                (_, true) => assert!(matches!(place, Place::Tensor(_)), "{what}: output {id}"),
                ("constant", false) => assert_eq!(place, &Place::Constant, "{what}"),
                _ => {
                    let Place::Workspace(offset) = *place else { panic!("{what}: temporary {id} at {place:?}") };
                    let elements = uint(&b["len"]) * if c.dtype.is_half() { 2 } else { 4 };
                    assert_eq!(offset % abi::ALIGN, 0, "{what}: temporary {id} aligned");
                    assert!(offset + elements <= layout.workspace_bytes, "{what}: temporary {id} inside");
                    temps.push((id, offset, offset + elements, span(id)));
                }
            }
        }
        for (i, a) in temps.iter().enumerate() {
            for b in &temps[i + 1..] {
                let together = a.3 .0 <= b.3 .1 && b.3 .0 <= a.3 .1;
                let share = a.1 < b.2 && b.1 < a.2;
                assert!(!(together && share), "{what}: temporaries {} and {} overlap: {a:?} {b:?}", a.0, b.0);
            }
        }
        // Every call's pointers are its bindings' addresses, in order.
        let infos = abi::infos(manifest).unwrap();
        let calls = abi::calls(manifest, &infos, 0..manifest.launches.len(), |id| 0x1000_0000 + 0x10_0000 * id as u64);
        for (call, l) in calls.iter().zip(launches) {
            let want: Vec<u64> = (l["bindings"].as_array().unwrap().iter())
                .map(|b| 0x1000_0000 + 0x10_0000 * uint(&b["buffer"]))
                .collect();
            assert_eq!(call.pointers, want, "{what}: {}", call.entry);
            assert_eq!(
                call.grid.map(u64::from).to_vec(),
                l["grid"].as_array().unwrap().iter().map(uint).collect::<Vec<_>>()
            );
        }
    }
}

/// A rule's expression evaluated over its terms: numbers, names, `+ - * /`,
/// parentheses, `ceil`, `min`, `max`.
struct Eval<'a> {
    text: &'a [u8],
    at: usize,
    terms: &'a BTreeMap<String, f64>,
    used: Vec<String>,
}

impl Eval<'_> {
    fn skip(&mut self) {
        while self.text.get(self.at) == Some(&b' ') {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.skip();
        let hit = self.text.get(self.at) == Some(&c);
        self.at += usize::from(hit);
        hit
    }

    fn expr(&mut self) -> f64 {
        let mut v = self.term();
        loop {
            if self.eat(b'+') {
                v += self.term();
            } else if self.eat(b'-') {
                v -= self.term();
            } else {
                return v;
            }
        }
    }

    fn term(&mut self) -> f64 {
        let mut v = self.factor();
        loop {
            if self.eat(b'*') {
                v *= self.factor();
            } else if self.eat(b'/') {
                v /= self.factor();
            } else {
                return v;
            }
        }
    }

    fn factor(&mut self) -> f64 {
        self.skip();
        if self.eat(b'(') {
            let v = self.expr();
            assert!(self.eat(b')'), "unbalanced parentheses");
            return v;
        }
        let start = self.at;
        while self.text.get(self.at).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') {
            self.at += 1;
        }
        let word = std::str::from_utf8(&self.text[start..self.at]).unwrap().to_string();
        assert!(!word.is_empty(), "expected a value at {}", self.at);
        if self.eat(b'(') {
            let mut args = vec![self.expr()];
            while self.eat(b',') {
                args.push(self.expr());
            }
            assert!(self.eat(b')'), "unclosed call of {word}");
            return match (word.as_str(), args.as_slice()) {
                ("ceil", [a]) => a.ceil(),
                ("max", [a, b]) => a.max(*b),
                ("min", [a, b]) => a.min(*b),
                _ => panic!("unknown function {word}/{}", args.len()),
            };
        }
        if let Ok(n) = word.parse::<f64>() {
            return n;
        }
        self.used.push(word.clone());
        *self.terms.get(&word).unwrap_or_else(|| panic!("`{word}` is not among the terms {:?}", self.terms))
    }
}

#[test]
fn every_grid_follows_from_its_rule_and_the_rule_is_true() {
    let mut folded = 0;
    let mut split = 0;
    for (c, _, _, json) in emitted() {
        let what = name(c);
        for l in json["launches"].as_array().unwrap() {
            let rule = l["grid_rule"].as_str().unwrap();
            let entry = l["entry"].as_str().unwrap();
            let terms: BTreeMap<String, f64> =
                l["grid_terms"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), uint(v) as f64)).collect();
            let grid: Vec<u64> = l["grid"].as_array().unwrap().iter().map(uint).collect();
            let mut e = Eval { text: rule.as_bytes(), at: 0, terms: &terms, used: vec![] };
            assert!(e.eat(b'['), "{what}: {entry}: `{rule}`");
            let mut axes = vec![e.expr()];
            while e.eat(b',') {
                axes.push(e.expr());
            }
            assert!(e.eat(b']') && axes.len() == 3, "{what}: {entry}: `{rule}`");
            let axes: Vec<u64> = axes.iter().map(|v| *v as u64).collect();
            let rest = std::str::from_utf8(&e.text[e.at..]).unwrap().to_string();
            // `with NAME = EXPR` defines a term: it must hold.
            if let Some(def) = rest.trim_start().strip_prefix("with ") {
                let (name, expr) = def.split_once(" = ").unwrap();
                let expr = expr.split(':').next().unwrap();
                let mut d = Eval { text: expr.as_bytes(), at: 0, terms: &terms, used: vec![] };
                assert_eq!(d.expr(), terms[name], "{what}: {entry}: `{def}`");
                e.used.extend(d.used);
            }
            for t in terms.keys() {
                assert!(e.used.contains(t), "{what}: {entry}: term `{t}` unused by `{rule}`");
            }
            assert!(grid[1] <= 65535 && grid[2] <= 65535, "{what}: {entry}: grid {grid:?}");
            match rest.split_once(": ").filter(|(_, s)| s.contains("laid out linearly")) {
                None => assert_eq!(axes, grid, "{what}: {entry}: `{rule}` with {terms:?}"),
                Some((_, text)) => {
                    folded += 1;
                    let claim = format!(
                        "{} x {} cubes, more than 65535 along an axis, laid out linearly over [x, y, z] (x fastest); cubes past {} do nothing",
                        axes[0], axes[1], axes[0] * axes[1]
                    );
                    assert_eq!(text, claim, "{what}: {entry}");
                    assert!(axes[0] > 65535 || axes[1] > 65535, "{what}: {entry}: folded without need");
                    assert!(grid[0] <= 65535 && grid.iter().product::<u64>() >= axes[0] * axes[1], "{what}: {entry}");
                }
            }
            split += usize::from(axes[2] > 1);
        }
    }
    assert!(folded >= 1 && split >= 2, "the matrix folds ({folded}) and splits ({split}) grids");
}
