//! NVIDIA's compilers as CI's GPU stand-in: every CUDA kernel attnc emits is
//! compiled with NVRTC (cubecl-cuda's options) to PTX for sm_80 and sm_90,
//! then assembled by `ptxas -v`. A kernel fails the gate on a compile error,
//! on any spill store or load, on shared memory past what a block gets
//! without opt-in, and (f16, bf16, tf32) where it should multiply on tensor
//! cores but has no `mma` in its PTX or no `HMMA` in its SASS; and any
//! kernel, CUDA or WGSL, over 200 KB of source.
//!
//! The matrix: every stdlib spec × {f32, tf32, f16, bf16} × {forward,
//! gradient program} at the specs' default sizes (the head-mixing specs in
//! f32, and their forward in bf16), and the sizes users run. Users' sizes
//! are checked for both architectures; default sizes for sm_80, and for
//! sm_90 where the kernel multiplies on tensor cores.
//! Without the compilers the test fails, saying how to install them
//! (`.ci/run` does; see the README).

mod common;

use attnc_compiler::plan::{self, Dtype};
use attnc_runtime::bind;
use attnc_runtime::gpu::emit;
use attnc_runtime::nvidia::{self, Arch, Tools};
use common::*;

const DTYPES: [Dtype; 4] = [Dtype::F32, Dtype::Tf32, Dtype::F16, Dtype::Bf16];

/// One program of the matrix: a stdlib spec at some sizes, forward or its
/// gradient program.
struct Case {
    spec: &'static str,
    sets: Vec<(&'static str, String)>,
    grad: bool,
    /// Split-KV decoding for a device of this many compute units.
    units: Option<usize>,
    /// The inputs the gradient program differentiates (empty: the default).
    wrt: Vec<String>,
}

fn case(spec: &'static str, sets: &[(&'static str, &str)], grad: bool) -> Case {
    Case { spec, sets: sets.iter().map(|(k, v)| (*k, v.to_string())).collect(), grad, units: None, wrt: vec![] }
}

/// The sizes users run (issue 25's list).
fn users_sizes() -> Vec<Case> {
    vec![
        case("mha", &[("H", "8"), ("N", "4096"), ("d", "128")], false),
        case("mha", &[("H", "2"), ("N", "2048"), ("d", "256")], false),
        case("gqa", &[("H", "8"), ("H_kv", "2"), ("N", "4096"), ("d", "128")], false),
        case("mqa", &[("H", "8"), ("N", "4096"), ("d", "128")], false),
        case("iha", &[("H", "8"), ("N", "2048"), ("P", "4"), ("d", "64")], false),
        // A decode step: one token.
        case("mha", &[("H", "32"), ("N", "1"), ("d", "128")], false),
        case("mha", &[("H", "8"), ("N", "2048"), ("d", "128")], true),
        case("iha", &[("H", "8"), ("N", "1024"), ("P", "2"), ("d", "64")], true),
        // A decode step over a 32768-row cache split for an H200 (issue 30).
        Case {
            units: Some(132),
            ..case("kvcache", &[("B", "1"), ("H", "8"), ("M", "1"), ("N", "32768"), ("d", "128")], false)
        },
    ]
}

/// Every stdlib spec, and the gradient program of each that has one (an
/// estimator of binary or integer rewards has no continuous input: `attnc
/// compile --grad` refuses it).
fn default_sizes() -> Vec<Case> {
    let names: Vec<&'static str> = stdlib_names().into_iter().map(|n| &*Box::leak(n.into_boxed_str())).collect();
    let differentiable = |s: &str| attnc_compiler::grad::differentiate(&compile_stdlib(s, &[]).program, &[]).is_ok();
    let mut cases: Vec<Case> = names.iter().map(|s| case(s, &[], false)).collect();
    cases.extend(names.iter().filter(|s| differentiable(s)).map(|s| case(s, &[], true)));
    // ALiBi's slopes, an input, are differentiated by name only: their
    // read gradient's kernels (lines of query rows; relative_bias's table,
    // a weight, covers diagonals by default).
    let wrt = ["q", "k", "v", "slopes"].map(str::to_string).to_vec();
    cases.push(Case { wrt, ..case("alibi", &[], true) });
    assert!(cases.len() >= 16, "most stdlib specs have gradient programs");
    cases
}

/// The plan of case `c` (its program or gradient program) in `dtype`.
fn plan_of(c: &Case, dtype: Dtype) -> plan::Plan {
    let compiled = compile_stdlib(c.spec, &c.sets);
    let program = if c.grad {
        attnc_compiler::grad::differentiate(&compiled.program, &c.wrt).expect("differentiable")
    } else {
        compiled.program
    };
    let dims = bind::default_dims(&program).expect("default dims");
    let p = plan::plan(&program, &dims).in_dtype(dtype);
    match c.units {
        Some(units) => {
            let p = p.split_kv(units);
            assert!(p.launches.iter().any(|l| l.spec.kind() == "combine"), "{} is split", c.spec);
            p
        }
        None => p,
    }
}

/// Every launch of `c` in `dtype`: (file name, entry, source, threads,
/// dynamic shared memory, whether it multiplies fragments).
fn kernels(c: &Case, dtype: Dtype) -> Vec<(String, String, String, u32, u32, bool)> {
    let p = plan_of(c, dtype);
    let fragments: Vec<bool> = p.launches.iter().map(|l| l.spec.fragments()).collect();
    let (files, manifest) = emit::emit(&p, emit::Target::Cuda).expect("CUDA emission");
    files
        .into_iter()
        .zip(manifest.launches)
        .zip(fragments)
        .map(|(((file, source), l), frag)| {
            (file, l.entry.clone(), source, l.threads(), l.shared_memory_bytes as u32, frag)
        })
        .collect()
}

/// The most source one emitted kernel may have (issue 25: the f32
/// attention was 1.2–1.8 MB, and its compile took minutes).
const MAX_SOURCE: usize = 200 * 1024;

fn tools() -> Tools {
    Tools::find().unwrap_or_else(|e| panic!("this test compiles CUDA with NVIDIA's compilers: {e}"))
}

/// Compile every kernel of `cases` in every dtype for sm_80, and for sm_90
/// too where `all_archs` or the kernel multiplies on tensor cores (all at
/// once, so kernels the matrix repeats compile once), and return one line
/// per problem, and the number of kernels checked.
fn gate(cases: &[Case], all_archs: bool) -> (Vec<String>, usize) {
    let tools = tools();
    assert!(tools.reads_sass(), "cuobjdump was not found: {}", nvidia::INSTALL_HINT);
    // (what, file, entry, source, threads, dynamic shared, tensor cores expected),
    // emitted on every core.
    // Head mixing's kernels differ between dtypes only in their storage
    // type: f32 covers them, and bf16 the forward's (CI's time).
    let mixing = |c: &Case| ["diff", "talking_heads"].contains(&c.spec);
    let jobs: Vec<(&Case, Dtype)> = (cases.iter())
        .flat_map(|c| DTYPES.map(|d| (c, d)))
        .filter(|(c, d)| !mixing(c) || *d == Dtype::F32 || (!c.grad && *d == Dtype::Bf16))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let emitted = std::sync::Mutex::new(vec![vec![]; jobs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..std::thread::available_parallelism().map_or(2, |n| n.get()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((c, dtype)) = jobs.get(i) else { break };
                let what = format!(
                    "{}{} [{}] {}",
                    c.spec,
                    if c.grad { " --grad" } else { "" },
                    c.sets.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "),
                    dtype.name()
                );
                let ks: Vec<_> = kernels(c, *dtype)
                    .into_iter()
                    .map(|(file, entry, source, threads, shared, frag)| {
                        (what.clone(), file, entry, source, threads, shared, frag && *dtype != Dtype::F32)
                    })
                    .collect();
                emitted.lock().unwrap()[i] = ks;
            });
        }
    });
    let all: Vec<_> = emitted.into_inner().unwrap().into_iter().flatten().collect();
    let mut problems = vec![];
    let mut count = 0;
    for arch in Arch::ALL {
        let limit = arch.limits().shared_per_block;
        // sm_90 where it differs (CI's time): every kernel at the sizes
        // users run, and at default sizes those on tensor cores, whose
        // HMMA it checks; sm_80's gate, stricter in shared memory and
        // with the same 255 registers, holds the rest.
        let on = |k: &&(String, String, String, String, u32, u32, bool)| all_archs || arch == Arch::Sm80 || k.6;
        let checked: Vec<_> = all.iter().filter(on).collect();
        let sources: Vec<_> = checked.iter().map(|k| (k.2.as_str(), k.3.as_str(), k.4, k.5)).collect();
        let rs = nvidia::check_sources(&tools, &sources, arch).unwrap_or_else(|e| panic!("{e}"));
        count += checked.len();
        for (k, r) in checked.into_iter().zip(rs) {
            let at = format!("{} {} {}", k.0, k.1, arch.name());
            if r.spill_stores > 0 || r.spill_loads > 0 {
                problems.push(format!(
                    "{at}: spills {} bytes stored, {} loaded ({} registers)",
                    r.spill_stores, r.spill_loads, r.registers
                ));
            }
            if r.static_shared + r.dynamic_shared > limit {
                problems.push(format!(
                    "{at}: {} bytes of shared memory, over the {limit} a block gets without opt-in",
                    r.static_shared + r.dynamic_shared
                ));
            }
            if k.6 && !(r.ptx_mma && r.sass_hmma == Some(true)) {
                problems.push(format!(
                    "{at}: multiplies fragments but has mma in PTX: {}, HMMA in SASS: {:?}",
                    r.ptx_mma, r.sass_hmma
                ));
            }
            if !k.6 && r.sass_hmma == Some(true) {
                problems.push(format!("{at}: HMMA in a kernel planned without fragments"));
            }
        }
    }
    for k in all.iter().filter(|k| k.3.len() > MAX_SOURCE) {
        problems.push(format!("{} {}: {} KB of source, over {} KB", k.0, k.1, k.3.len() / 1024, MAX_SOURCE / 1024));
    }
    eprintln!("{count} kernels checked");
    (problems, count)
}

fn assert_gate(cases: &[Case], all_archs: bool) {
    let (problems, count) = gate(cases, all_archs);
    assert!(count > 0, "no kernel was compiled");
    assert!(
        problems.is_empty(),
        "{} of {count} compiled kernels fail the gate:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// WGSL at the same sizes, in f32 and f16 (what wgpu runs): no kernel over
/// [`MAX_SOURCE`] (the CPU drivers' attention unrolled 385–537 KB before
/// `plan::UNROLL_OPS`).
#[test]
fn every_wgsl_kernel_at_users_sizes_stays_within_200_kb() {
    let mut over = vec![];
    let mut count = 0;
    for c in users_sizes() {
        for dtype in [Dtype::F32, Dtype::F16] {
            let (files, _) = emit::emit(&plan_of(&c, dtype), emit::Target::Wgsl).expect("WGSL emission");
            count += files.len();
            for (file, source) in files.iter().filter(|(_, s)| s.len() > MAX_SOURCE) {
                over.push(format!("{} {:?} {}: {file}, {} KB", c.spec, c.sets, dtype.name(), source.len() / 1024));
            }
        }
    }
    assert!(count > 50, "only {count} WGSL kernels emitted");
    assert!(over.is_empty(), "kernels over {} KB:\n{}", MAX_SOURCE / 1024, over.join("\n"));
}

#[test]
fn every_kernel_at_default_sizes_compiles_without_spills() {
    assert_gate(&default_sizes(), false);
}

#[test]
fn every_kernel_at_users_sizes_compiles_without_spills() {
    assert_gate(&users_sizes(), true);
}

/// The bf16 gradient programs' attention backward (dQ; dK and dV in one
/// launch) multiplies on tensor cores: planned on fragments (MHA at its
/// default sizes and with 128-wide heads, cubes of one plane, at N = 2048;
/// IHA at a user's sizes), so the gate above, which compiles each of them,
/// requires `mma` in their PTX and `HMMA` in their SASS for both
/// architectures, and no spills; so is the tf32 backward of heads up to 64
/// (one-plane cubes of f32 rows), and MHA's at d = 64, which the gate's
/// matrix lacks, is compiled and checked here.
#[test]
fn half_and_tf32_attention_backward_multiplies_on_tensor_cores() {
    let tools = tools();
    let iha = || case("iha", &[("H", "8"), ("N", "1024"), ("P", "2"), ("d", "64")], true);
    let tf32_d64 = case("mha", &[("H", "8"), ("N", "2048"), ("d", "64")], true);
    let in_the_gate = [
        (Dtype::Bf16, case("mha", &[], true)),
        (Dtype::Bf16, case("mha", &[("H", "8"), ("N", "2048"), ("d", "128")], true)),
        (Dtype::Bf16, iha()),
        (Dtype::Tf32, iha()),
    ];
    let (default, users) = (default_sizes(), users_sizes());
    for (dtype, c) in in_the_gate.iter().chain([&(Dtype::Tf32, tf32_d64)]) {
        let ks: Vec<_> = (kernels(c, *dtype).into_iter())
            .filter(|k| ["attention_grad_q", "attention_grad_kv"].iter().any(|n| k.0.contains(n)))
            .collect();
        let names: Vec<&str> = ks.iter().map(|k| k.0.as_str()).collect();
        assert_eq!(ks.len(), 2, "{} --grad {dtype}: backward kernels {names:?}", c.spec);
        assert!(ks.iter().all(|k| k.5), "{} --grad {dtype}: {names:?} not planned on fragments", c.spec);
        let gated =
            (default.iter().chain(&users)).any(|g| g.spec == c.spec && g.sets == c.sets && g.grad && g.wrt.is_empty());
        if gated {
            continue;
        }
        let sources: Vec<_> = ks.iter().map(|k| (k.1.as_str(), k.2.as_str(), k.3, k.4)).collect();
        for arch in Arch::ALL {
            let rs = nvidia::check_sources(&tools, &sources, arch).unwrap_or_else(|e| panic!("{e}"));
            for (k, r) in ks.iter().zip(rs) {
                let at = format!("{} --grad {dtype} {} {}", c.spec, k.0, arch.name());
                assert!(r.ptx_mma && r.sass_hmma == Some(true), "{at}: mma {}, HMMA {:?}", r.ptx_mma, r.sass_hmma);
                assert!(r.spill_stores == 0 && r.spill_loads == 0, "{at}: spills ({} registers)", r.registers);
            }
        }
    }
}

/// The gate can fail: a kernel with more live values than its launch
/// bound leaves registers for spills, and ptxas's report says so; a kernel
/// NVRTC rejects is an error with NVRTC's log.
#[test]
fn a_spilling_kernel_is_caught() {
    let tools = tools();
    let source = r#"
extern "C" __global__ void __launch_bounds__(1024) spill(float* out, const float* in) {
    float a[128];
    #pragma unroll
    for (int i = 0; i < 128; ++i) a[i] = in[i * 1024 + threadIdx.x];
    float s = 0.0f;
    #pragma unroll
    for (int i = 0; i < 128; ++i) s += a[i] * a[127 - i] + a[(i * 7) % 128];
    out[threadIdx.x] = s;
}
"#;
    let c = tools.compile("spill", source, Arch::Sm90).expect("compiles");
    assert!(c.resources.spill_stores > 0 && c.resources.spill_loads > 0, "{:?}", c.resources);
    let bad = tools.compile("broken", "extern \"C\" __global__ void broken() { undefined_name(); }", Arch::Sm80);
    let message = bad.expect_err("an undefined name does not compile").to_string();
    assert!(message.contains("NVRTC failed") && message.contains("undefined_name"), "{message}");
}

fn attnc(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_attnc"));
    c.args(args).current_dir(root());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("attnc runs")
}

/// `attnc compile --target cuda` prints one row per kernel and writes the
/// same under each launch's `resources`: at MHA N = 4096, d = 128 in f32
/// (whose attention spilled 85 KB before register tiling) no kernel spills.
/// Without the tools it says so in one line and still writes the kernels.
#[test]
fn compile_reports_resources_per_kernel() {
    tools();
    let dir = std::env::temp_dir().join(format!("attnc-cuda-table-{}", std::process::id()));
    let out = dir.to_str().unwrap();
    let args = ["compile", "stdlib/mha.attn", "--target", "cuda", "--set", "N=4096", "--set", "d=128", "--out", out];
    let o = attnc(&args, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    let rows: Vec<&str> = table.lines().collect();
    assert!(rows[0].starts_with("kernel") && rows[0].contains("regs") && rows[0].contains("sm_90"), "{table}");
    assert_eq!(rows.len(), 6, "a header and one row per launch:\n{table}");
    for row in &rows[1..] {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[2], "0/0", "a kernel spills:\n{table}");
    }
    let manifest = manifest_in(&dir);
    for l in manifest["launches"].as_array().unwrap() {
        let r = &l["resources"];
        assert_eq!(r["arch"], "sm_90", "{l}");
        assert_eq!((r["spill_stores"].as_u64(), r["spill_loads"].as_u64()), (Some(0), Some(0)), "{l}");
        let regs = r["registers"].as_u64().unwrap();
        assert!((1..=255).contains(&regs), "{l}");
        assert!(r["blocks_per_sm"].as_u64().unwrap() >= 1, "{l}");
        if l["kernel"] == "attention" {
            assert!(l["tiling"].as_str().unwrap().starts_with("registers: 4 lane(s)"), "{l}");
        }
    }
    let o = attnc(&[&args[..], &["--arch", "sm_80"]].concat(), &[]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("sm_80"));
    let missing =
        [("ATTNC_CUDA_TOOLS", "/nonexistent"), ("CUDA_HOME", ""), ("CUDA_PATH", ""), ("PATH", "/usr/bin:/bin")];
    let o = attnc(&args, &missing);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stdout.is_empty());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no resource table: NVIDIA's compilers were not found"));
    let manifest = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    assert!(!manifest.contains("\"resources\""));
    std::fs::remove_dir_all(&dir).unwrap();
}
