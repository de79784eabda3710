//! Golden emitted source: for every stdlib spec at a small fixed size, the
//! WGSL and CUDA of every kernel and the manifest, produced without a device.
//! Kernels are named by the plan, so the text is the same in debug and release.

mod common;

use attnc_runtime::bind;
use attnc_runtime::gpu::{emit, plan};
use common::*;

fn small(spec: &str) -> Vec<(&'static str, String)> {
    let s: &[(&'static str, &str)] = match spec {
        "iha" => &[("H", "2"), ("P", "2"), ("d", "4"), ("N", "5"), ("rope", "10000.0")],
        "mha" | "gqa" => &[("H", "2"), ("H_kv", "1"), ("d", "4"), ("N", "5")],
        "mqa" => &[("H", "2"), ("d", "4"), ("N", "5")],
        "gdpo" => &[("B", "2"), ("G", "3"), ("C", "2")],
        _ => &[("B", "2"), ("G", "3")],
    };
    s.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

#[test]
fn emitted_source_for_every_stdlib_spec() {
    for spec in stdlib_names() {
        let c = compile_stdlib(&spec, &small(&spec));
        let dims = bind::default_dims(&c.program).unwrap();
        let p = plan::plan(&c.program, &dims);
        for target in [emit::Target::Wgsl, emit::Target::Cuda] {
            let (files, manifest) = emit::emit(&p, target).unwrap();
            let (again, _) = emit::emit(&p, target).unwrap();
            assert_eq!(files, again, "emission is not deterministic for {spec}");
            let mut text = serde_json::to_string_pretty(&manifest).unwrap();
            for (name, source) in &files {
                text.push_str(&format!("\n\n==== {name} ====\n{source}"));
            }
            insta::assert_snapshot!(format!("{spec}_{}", target.extension()), text);
        }
    }
}
