//! The CUDA backend up to the driver call, on a machine without a GPU:
//! `tests/fake_cuda/libcuda.c`, built here as a `libcuda.so.1` that keeps
//! device memory on the host and logs every call, stands in for the
//! driver. `attnc run --backend cuda` (real NVRTC, real cudarc loading)
//! must launch exactly the manifest's kernels, grids, blocks, shared
//! memory, pointers and `info` bytes, copy nothing between launches, and
//! turn each driver failure into its documented code; the caller-memory
//! launcher must use the caller's pointers and stream and copy nothing.
//! Without a C compiler or NVIDIA's compilers (`.ci/run` installs them)
//! the test fails, saying so.

mod common;

use attnc_compiler::Code;
use attnc_runtime::cuda::{abi, Cuda, CudaError, DeviceTensor};
use attnc_runtime::gpu::emit::{self, Manifest};
use attnc_runtime::pipeline::{Bound, Compiler};
use common::root;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("attnc-cuda-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The fake driver, built once into its own folder.
fn fake_driver() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("driver");
        let src = root().join("tests/fake_cuda/libcuda.c");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o"])
            .arg(dir.join("libcuda.so.1"))
            .arg(&src)
            .output()
            .unwrap_or_else(|e| {
                panic!("this test builds a stand-in driver with the C compiler `cc` ({e}); install gcc")
            });
        assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
        dir
    })
    .clone()
}

/// MHA at sizes past one tile, planned as the CLI plans it for the fake
/// device's 132 multiprocessors, and its emitted kernels.
const SETS: [(&str, &str); 3] = [("N", "100"), ("H", "2"), ("d", "16")];

fn emitted() -> (Bound, Vec<(String, String)>, Manifest) {
    let mut c = Compiler::open(root().join("stdlib/mha.attn")).unwrap();
    for (k, v) in SETS {
        c = c.set(k, v);
    }
    let bound = c.compile().unwrap().seeded(0).unwrap();
    let plan = bound.plan_for(Some(132));
    let (files, manifest) = Bound::emit_plan(&plan, emit::Target::Cuda).unwrap();
    (bound, files, manifest)
}

/// FAKE_CUDA_ARGS: each entry's pointer count and info bytes.
fn args_of(manifest: &Manifest) -> String {
    let parts: Vec<String> = (manifest.launches.iter())
        .map(|l| format!("{}={}+{}", l.entry, l.bindings.len(), abi::pack_info(manifest, l).unwrap().len()))
        .collect();
    parts.join(";")
}

fn run_cli(mode: &str, log: &Path, out: &Path, args: &str, tools: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_attnc"));
    cmd.args(["run", "stdlib/mha.attn", "--seed", "0", "--backend", "cuda", "--out"]).arg(out);
    for (k, v) in SETS {
        cmd.args(["--set", &format!("{k}={v}")]);
    }
    cmd.current_dir(root())
        .env("LD_LIBRARY_PATH", fake_driver())
        .env("FAKE_CUDA_MODE", mode)
        .env("FAKE_CUDA_LOG", log)
        .env("FAKE_CUDA_ARGS", args)
        .env("ATTNC_CACHE_DIR", log.with_extension("cache"));
    if !tools {
        cmd.env("ATTNC_CUDA_TOOLS", "/nonexistent").env_remove("CUDA_HOME").env_remove("CUDA_PATH");
    }
    cmd.output().expect("attnc runs")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_cli_launches_the_manifest_on_the_driver_and_copies_nothing_between_launches() {
    let dir = scratch("run");
    let (_, _, manifest) = emitted();
    let (log, out) = (dir.join("log"), dir.join("y.safetensors"));
    let o = run_cli("", &log, &out, &args_of(&manifest), true);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && out.exists(), "{err}");
    let log = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    let launches: Vec<Vec<&str>> =
        lines.iter().filter(|l| l.starts_with("launch ")).map(|l| l.split(' ').collect()).collect();
    assert_eq!(launches.len(), manifest.launches.len(), "{log}");
    // Allocations by address, and where the launches sit among the copies.
    let allocs: BTreeMap<u64, u64> = (lines.iter())
        .filter_map(|l| l.strip_prefix("alloc "))
        .map(|l| l.split_once(' ').map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())).unwrap())
        .collect();
    let first = lines.iter().position(|l| l.starts_with("launch ")).unwrap();
    let last = lines.iter().rposition(|l| l.starts_with("launch ")).unwrap();
    assert!(!lines[first..last]
        .iter()
        .any(|l| l.starts_with("htod") || l.starts_with("dtoh") || l.starts_with("alloc")));
    let sync = lines.iter().position(|l| l.starts_with("sync ")).unwrap();
    assert!(
        sync > last && lines[..first].iter().any(|l| l.starts_with("htod")),
        "copies in, launches, sync, copies out"
    );
    assert_eq!(lines.iter().filter(|l| l.starts_with("module")).count(), manifest.launches.len());
    let layout = abi::Layout::of(&manifest);
    let mut seen: BTreeMap<usize, u64> = BTreeMap::new();
    // attnc's own workspace: the last allocation before the launches.
    let workspace = (lines[..first].iter().rev())
        .find_map(|l| l.strip_prefix("alloc "))
        .map(|l| l.split(' ').next().unwrap().parse::<u64>().unwrap());
    for (words, l) in launches.iter().zip(&manifest.launches) {
        assert_eq!(words[1], l.entry);
        let grid: Vec<u32> = words[5..8].iter().map(|w| w.parse().unwrap()).collect();
        let block: Vec<u32> = words[9..12].iter().map(|w| w.parse().unwrap()).collect();
        assert_eq!((grid.as_slice(), block.as_slice()), (&l.grid[..], &l.workgroup_size[..]), "{}", l.entry);
        assert_eq!(words[13], l.shared_memory_bytes.to_string());
        let pointers: Vec<u64> = words[15..15 + l.bindings.len()].iter().map(|w| w.parse().unwrap()).collect();
        assert_eq!(words[15 + l.bindings.len()], "info");
        assert_eq!(
            words.get(16 + l.bindings.len()).copied().unwrap_or(""),
            hex(&abi::pack_info(&manifest, l).unwrap())
        );
        for (b, p) in l.bindings.iter().zip(pointers) {
            // A buffer keeps its address; it lies inside one allocation that holds it.
            assert_eq!(*seen.entry(b.buffer).or_insert(p), p, "{}: buffer {}", l.entry, b.buffer);
            let (base, size) = allocs.range(..=p).next_back().map(|(a, s)| (*a, *s)).unwrap();
            assert!(
                p + abi::buffer_bytes(&manifest, b.buffer) <= base + size,
                "{}: buffer {} outside",
                l.entry,
                b.buffer
            );
            if let abi::Place::Workspace(offset) = layout.places[b.buffer] {
                assert_eq!(Some(p - offset), workspace, "{}: temporary {} at its offset", l.entry, b.buffer);
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn driver_failures_have_their_codes_and_write_nothing() {
    let dir = scratch("fail");
    let (_, _, manifest) = emitted();
    let cases = [
        ("nodevice", true, "E0703", "CUDA_ERROR_NO_DEVICE"),
        ("oom", true, "E0707", "bytes asked for"),
        ("launch", true, "E0706", manifest.launches[0].entry.as_str()),
        ("sm35", true, "E0704", "sm_35"),
        ("", false, "E0708", "NVRTC"),
    ];
    for (mode, tools, code, words) in cases {
        let (log, out) = (dir.join(format!("log-{mode}")), dir.join(format!("y-{mode}.safetensors")));
        let o = run_cli(mode, &log, &out, &args_of(&manifest), tools);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && !out.exists(), "{mode}: {err}");
        assert!(err.contains(&format!("error[{code}]")) && err.contains(words), "{mode}: {err}");
        assert!(!err.contains("panicked"), "{mode}: {err}");
    }
    // No driver library at all.
    let out = dir.join("y.safetensors");
    let o = Command::new(env!("CARGO_BIN_EXE_attnc"))
        .args(["run", "stdlib/grpo.attn", "--seed", "0", "--backend", "cuda", "--out"])
        .arg(&out)
        .current_dir(root())
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && !out.exists() && !err.contains("panicked"), "{err}");
    assert!(err.contains("error[E0702]") && err.contains("libcuda.so.1"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `attnc bench --backend cuda` runs through the driver's events and
/// prints a report of every launch (the stand-in's clock: 10 µs a record).
#[test]
fn bench_on_cuda_times_every_launch_with_events() {
    let dir = scratch("bench");
    let (_, _, manifest) = emitted();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_attnc"));
    cmd.args(["bench", "stdlib/mha.attn", "--backend", "cuda", "--iters", "3", "--warmup", "1"]);
    for (k, v) in SETS {
        cmd.args(["--set", &format!("{k}={v}")]);
    }
    let o = cmd
        .current_dir(root())
        .env("LD_LIBRARY_PATH", fake_driver())
        .env("FAKE_CUDA_LOG", dir.join("log"))
        .env("FAKE_CUDA_ARGS", args_of(&manifest))
        .env("ATTNC_CACHE_DIR", dir.join("cache"))
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert!(out.contains("fake H200 (cuda, sm_90)"), "{out}");
    // Each launch timed alone, between two events: one tick of the stand-in's clock.
    for l in &manifest.launches {
        let line = out.lines().find(|line| line.starts_with(&l.entry));
        assert!(line.is_some_and(|line| line.contains("10.000 µs")), "{}:\n{out}", l.entry);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_kernel_nvrtc_refuses_names_itself_and_the_log() {
    let nvrtc = attnc_runtime::nvidia::Nvrtc::find().unwrap_or_else(|e| panic!("{e}"));
    let e =
        attnc_runtime::cuda::cache::cubin(&nvrtc, "attnc_broken_00", "extern \"C\" __global__ void f() { nope; }", 90)
            .expect_err("NVRTC refuses it");
    assert_eq!(e.code(), Code::CudaCompile);
    let text = e.to_string();
    assert!(text.contains("attnc_broken_00") && text.contains("sm_90") && text.contains("nope"), "{text}");
}

/// The launcher on the caller's memory, in this process, on the fake
/// driver loaded by path (the loader then hands it to cudarc by name).
#[test]
fn the_caller_memory_launcher_uses_the_callers_pointers_and_stream() {
    let dir = fake_driver();
    let log = scratch("caller").join("log");
    std::env::set_var("FAKE_CUDA_LOG", &log);
    std::env::set_var("ATTNC_CACHE_DIR", log.with_extension("cache"));
    let (bound, _, manifest) = emitted();
    std::env::set_var("FAKE_CUDA_ARGS", args_of(&manifest));
    // SAFETY: a C library of plain functions; kept loaded for the process.
    let lib = unsafe { libloading::Library::new(dir.join("libcuda.so.1")) }.unwrap();
    std::mem::forget(lib);
    let cuda = Cuda::open(0).unwrap();
    assert_eq!((cuda.arch(), cuda.compute_units(), cuda.name()), (90, 132, "fake H200"));
    let kernels = bound.cuda_kernels(&cuda).unwrap();
    assert_eq!(kernels.manifest().launches.len(), manifest.launches.len());
    // The caller's tensors at made-up addresses, sized as the plan asks.
    let sizes = kernels.tensor_bytes();
    let mut tensors: BTreeMap<String, DeviceTensor> = BTreeMap::new();
    for (i, (name, bytes)) in sizes.iter().enumerate() {
        tensors
            .insert(name.clone(), DeviceTensor { ptr: 0x7000_0000_0000 + (i as u64) * 0x1_0000_0000, bytes: *bytes });
    }
    let workspace = DeviceTensor { ptr: 0x6000_0000_0000, bytes: kernels.workspace_bytes() };
    std::fs::remove_file(&log).ok();
    // SAFETY: the fake driver reads no pointer it is given.
    unsafe { kernels.launch(&tensors, Some(workspace), 0x5eed) }.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let launches: Vec<&str> = text.lines().filter(|l| l.starts_with("launch ")).collect();
    assert_eq!(launches.len(), manifest.launches.len(), "{text}");
    assert_eq!(text.lines().count(), launches.len(), "nothing but launches: {text}");
    let by_name: BTreeMap<&str, u64> = tensors.iter().map(|(n, t)| (n.as_str(), t.ptr)).collect();
    let layout = abi::Layout::of(&manifest);
    for (line, l) in launches.iter().zip(&manifest.launches) {
        let words: Vec<&str> = line.split(' ').collect();
        assert_eq!(words[3], (0x5eed).to_string(), "the caller's stream");
        for (b, w) in l.bindings.iter().zip(&words[15..]) {
            let want = match &layout.places[b.buffer] {
                abi::Place::Tensor(n) => by_name[n.as_str()],
                abi::Place::Workspace(o) => workspace.ptr + o,
                abi::Place::Constant => continue,
            };
            assert_eq!(w.parse::<u64>().unwrap(), want, "{}: buffer {}", l.entry, b.buffer);
        }
    }
    // A missing tensor, a small one and a small workspace are coded errors naming both sizes.
    let (name, bytes) = sizes.iter().next().unwrap();
    let mut small = tensors.clone();
    small.insert(name.clone(), DeviceTensor { ptr: 1 << 40, bytes: bytes - 1 });
    let mut missing = tensors.clone();
    missing.remove(name);
    let tiny = DeviceTensor { ptr: 1 << 40, bytes: workspace.bytes - 1 };
    for (t, w, words) in [
        (&small, Some(workspace), format!("holds {} bytes; it needs {bytes}", bytes - 1)),
        (&missing, Some(workspace), format!("no device tensor `{name}`")),
        (&tensors, Some(tiny), format!("this plan needs {}", workspace.bytes)),
    ] {
        let e: CudaError = unsafe { kernels.launch(t, w, 0) }.unwrap_err();
        assert_eq!(e.code(), Code::DeviceTensor);
        assert!(e.to_string().contains(&words), "{e}");
    }
}
