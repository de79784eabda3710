//! Kernel source without a device: WGSL through cubecl's WGSL compiler and
//! CUDA C++ through cubecl-cpp, one file per launch, plus a manifest that
//! says how to launch each from one's own host code.

use super::define::IrKernel;
use attnc_compiler::ir::AttnArg;
use attnc_compiler::plan::{AttnPath, BufferRole, Dtype, KernelSpec, Plan, GEMM_ROWS, GEMM_UNITS};
use cubecl::ir::features::Features;
use cubecl::ir::{DeviceIdentity, HardwareProperties, MemoryDeviceProperties};
use cubecl::prelude::*;
use cubecl::Compiler;
use serde::Serialize;
use std::collections::hash_map::{Entry, HashMap};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Wgsl,
    Cuda,
}

impl Target {
    pub fn extension(self) -> &'static str {
        match self {
            Target::Wgsl => "wgsl",
            Target::Cuda => "cu",
        }
    }
}

/// A generic device description for offline compilation (1024 units and
/// 48 KiB of shared memory per cube). CUDA has 32-wide warps and tensor
/// cores for f16, bf16 and tf32 (sm_80 and later); WGSL kernels use no plane
/// operations, so they run on any WebGPU device.
pub fn offline_properties(target: Target) -> Arc<DeviceProperties> {
    let mut features = Features::default();
    if target == Target::Cuda {
        features.plane.insert(cubecl::ir::features::Plane::Ops);
        // Tensor cores as from sm_80: 16×16×16 f16 and bf16, 16×16×8 tf32 fragments into f32.
        for dtype in [Dtype::F16, Dtype::Bf16, Dtype::Tf32] {
            features.matmul.cmma.insert(super::device::fragment_config(dtype));
        }
    }
    Arc::new(DeviceProperties::new(
        features,
        MemoryDeviceProperties::new(u64::MAX, 256),
        HardwareProperties {
            load_width: 128,
            vector_register_count: None,
            plane_size_min: 32,
            plane_size_max: 32,
            max_bindings: 32,
            max_shared_memory_size: 49152,
            max_cube_count: (u32::MAX, u16::MAX as u32, u16::MAX as u32),
            max_units_per_cube: 1024,
            max_cube_dim: (1024, 1024, 1024),
            num_streaming_multiprocessors: None,
            num_tensor_cores: None,
            min_tensor_cores_dim: None,
            num_cpu_cores: None,
            last_level_cache_size: None,
            max_vector_size: VectorSize::MAX,
            cube_mma_reserved_shared_memory: 0,
        },
        cubecl::profile::TimingMethod::Device,
        DeviceIdentity { name: "offline".to_string(), fingerprint: "offline".to_string(), physical: None },
    ))
}

/// The C++ compiler's options as cubecl-cuda 0.11.3 sets them on a device
/// of compute capability 8.0 or later (`CudaRuntime`'s client setup): fast
/// math, `dp4a`, `__grid_constant__` and the fast `tanh`. Its sm_90 extras
/// (clusters, `elect.sync`) change no kernel attnc emits, so `--backend
/// cuda` compiles the text `attnc compile --target cuda` writes.
fn cuda_options() -> cubecl_cpp::shared::CompilationOptions {
    let mut options = cubecl_cpp::shared::CompilationOptions::default();
    let features = &mut options.supports_features;
    features.fast_math = true;
    features.dp4a = true;
    features.grid_constants = true;
    features.fast_tanh = true;
    options
}

/// Source text of one launch's kernel, the bytes of dynamic shared memory it
/// needs (CUDA), and the plane width it relies on.
pub fn kernel_source(
    name: &str,
    spec: &KernelSpec,
    dtype: Dtype,
    target: Target,
) -> Result<(String, usize, u32), String> {
    match (target, dtype) {
        (Target::Wgsl, Dtype::Bf16) => return Err("WGSL has no bf16 type".into()),
        (Target::Wgsl, Dtype::Tf32) => return Err("WGSL has no TF32 matrix products".into()),
        _ => {}
    }
    let kernel = IrKernel::new(name, spec, dtype, offline_properties(target), Arc::new(TargetProperties::default()));
    let plane = kernel.plane;
    let def = kernel.define();
    match target {
        Target::Wgsl => {
            let shader = cubecl::wgpu::WgslCompiler::default()
                .compile(def, &cubecl::WgpuCompilationOptions::default())
                .map_err(|e| format!("{e:?}"))?;
            Ok((shader.to_string(), 0, plane))
        }
        Target::Cuda => {
            let k = cubecl_cpp::shared::CppCompiler::<cubecl_cpp::target::Cuda>::default()
                .compile(def, &cuda_options())
                .map_err(|e| format!("{e:?}"))?;
            Ok((canonical_names(&host_compatible(&k.source)), k.shared_memory_size, plane))
        }
    }
}

/// `source` with its values (`v` and a number) renumbered in order of first
/// appearance: cubecl-cpp numbers the slices of a kernel's shared-memory
/// block in an order that changes from run to run when it has several
/// arrays, and the text must not.
pub fn canonical_names(source: &str) -> String {
    let mut names: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let bytes = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let (mut i, mut copied) = (0, 0);
    while i < bytes.len() {
        let starts = bytes[i] == b'v' && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric());
        let digits = bytes[i + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
        let ends = bytes.get(i + 1 + digits).is_none_or(|b| !b.is_ascii_alphanumeric());
        if starts && digits > 0 && ends {
            let name = &source[i..i + 1 + digits];
            let next = names.len();
            let n = *names.entry(name).or_insert(next);
            out.push_str(&source[copied..i]);
            out.push_str(&format!("v{n}"));
            i += 1 + digits;
            copied = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&source[copied..]);
    out
}

/// CUDA source that also compiles under nvcc next to host code: cubecl's
/// preamble declares the fixed-width integer types itself, which NVRTC needs
/// but which clash with `<cstdint>`'s (`int64_t` is `long` there); they are
/// kept for NVRTC (`__CUDACC_RTC__`) and replaced by `<cstdint>` elsewhere.
pub fn host_compatible(source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let is_typedef = |l: &str| l.starts_with("typedef ") && l.ends_with("_t;") && !l.contains('{');
    let Some(start) = lines.iter().position(|l| is_typedef(l)) else { return source.to_string() };
    let end = start + lines[start..].iter().take_while(|l| is_typedef(l)).count();
    let mut out: Vec<&str> = lines[..start].to_vec();
    out.push("#ifdef __CUDACC_RTC__");
    out.extend(&lines[start..end]);
    out.push("#else");
    out.push("#include <cstdint>");
    out.push("#endif");
    out.extend(&lines[end..]);
    let mut text = out.join("\n");
    if source.ends_with('\n') {
        text.push('\n');
    }
    text
}

#[derive(Serialize)]
pub struct BindingInfo {
    pub binding: usize,
    pub buffer: usize,
    pub tensor: String,
    pub shape: Vec<usize>,
    pub dtype: &'static str,
    pub access: &'static str,
    /// Floats per element the kernel reads this buffer in (its `info`
    /// length counts such elements).
    pub line_size: usize,
}

#[derive(Serialize)]
pub struct ScalarInfo {
    pub name: &'static str,
    pub dtype: &'static str,
    pub value: f64,
}

#[derive(Serialize)]
pub struct LaunchInfo {
    pub file: String,
    pub entry: String,
    pub kernel: &'static str,
    pub workgroup_size: [u32; 3],
    pub grid: [u32; 3],
    /// How `grid` follows from the sizes: `[x, y, z]` over the names in
    /// `grid_terms` (`ceil`, `min`, `max`, `*`, `/`), then what a `with`
    /// defines and, past 65535 cubes along an axis, how they are laid out.
    pub grid_rule: String,
    /// The value of every name `grid_rule` uses.
    pub grid_terms: std::collections::BTreeMap<&'static str, usize>,
    pub bindings: Vec<BindingInfo>,
    pub scalars: Vec<ScalarInfo>,
    /// The `info` buffer's layout as the kernel declares it.
    pub info_struct: String,
    pub shared_memory_bytes: usize,
    /// Elements per vector in the kernel's buffers (`array<vec4<f32>>` when 4;
    /// a binding's own `line_size` says where one differs): bind the same
    /// data; the lengths in `info` count vectors.
    pub line_size: usize,
    /// Work on weights and constants alone: with the same weights, run it
    /// once and only the other launches per call.
    pub prepare: bool,
    /// Lanes of a plane (subgroup, warp) that share rows by broadcasts: the
    /// device's planes must be at least this wide (1: no plane operations).
    pub plane_width: u32,
    /// CUDA only, where NVIDIA's compilers were found: what ptxas reports
    /// and the occupancy it gives (`attnc compile --arch`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<crate::nvidia::LaunchResources>,
    /// Attention tiled within the register file (CUDA): the tiling and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tiling: Option<String>,
}

/// What register tiling an attention launch has, and why (the manifest's `tiling`).
fn tiling(spec: &KernelSpec) -> Option<String> {
    match spec.path() {
        Some(AttnPath::Lanes(_)) => spec.tiling_note(),
        _ => None,
    }
}

impl LaunchInfo {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.workgroup_size.iter().product()
    }
}

#[derive(Serialize)]
pub struct Manifest {
    pub spec: String,
    pub target: &'static str,
    pub dtype: &'static str,
    pub dims: std::collections::BTreeMap<String, u64>,
    pub calling_convention: &'static str,
    pub buffers: Vec<attnc_compiler::plan::Buffer>,
    pub launches: Vec<LaunchInfo>,
    pub outputs: std::collections::BTreeMap<String, usize>,
}

const CONVENTION: &str = "Each launch binds its buffers in the listed order (operands, then the output), \
all row-major in the bindings' `dtype` (the manifest's `dtype`, except that tf32 kernels store f32; kernels compute in f32), followed by one read-only `info` buffer (declared as `info_struct`): the listed scalars \
as f32, padded to a multiple of two, then each bound buffer's length in elements as a u32 in binding \
order, padded to a multiple of two. Kernels are specialised to the listed shapes and do not check indices \
against these lengths: each guards its writes by its own sizes and reads only inside the shapes (the GEMM and \
attention clamp rows and columns to the last one, so a buffer must hold at least its listed `len`); launch \
exactly the listed grid. Buffers with role \
`input` hold the named tensors (one marked `integers` holds integers that attention's functions read: in f16 and \
bf16 each value is three elements, base-256 digits d0, d1, d2 with v = (d0 * 256 + d1) * 256 + d2 and d1, d2 in \
0..256, so the buffer holds 3 * `len` elements), `constant` buffers hold the listed values, `temp` buffers are allocated \
with `len` elements and written by the launch that binds them last. Run the launches in order; \
`outputs` names the buffers to read back. CUDA kernels take their buffers as pointer arguments in the \
same order, then the `info` struct by value (a `__grid_constant__` parameter, as cubecl-cuda passes it on \
sm_70 and later), and `shared_memory_bytes` of dynamic shared memory.";

/// The declaration of the `info` struct in emitted source, on one line.
fn info_struct(source: &str) -> String {
    let Some(start) = source.find("struct info_st") else { return String::new() };
    let end = source[start..].find('}').map_or(source.len(), |e| start + e + 1);
    source[start..end].split_whitespace().collect::<Vec<_>>().join(" ")
}

fn buffer_name(plan: &Plan, id: usize) -> String {
    match &plan.buffers[id].role {
        BufferRole::Input { name, .. } => name.clone(),
        BufferRole::Constant { .. } => format!("const{id}"),
        BufferRole::Temp => plan.outputs.iter().find(|(_, o)| *o == id).map_or(format!("tmp{id}"), |(n, _)| n.clone()),
    }
}

/// A launch's grid rule and the values of its names (the manifest's
/// `grid_rule` and `grid_terms`); `tests/cuda_abi.rs` evaluates every rule.
fn grid_rule(spec: &KernelSpec) -> (String, std::collections::BTreeMap<&'static str, usize>) {
    let lanes = spec.line_size();
    let rows = || spec.attention_tiles().cube_rows();
    let (rule, terms): (String, Vec<(&'static str, usize)>) = match spec {
        KernelSpec::MatMul { mix: Some(m), rows, .. } => (
            format!("[ceil(d / line_size / channels), ceil(rows / {}), 1]", GEMM_UNITS * GEMM_ROWS),
            vec![("d", m.d), ("line_size", lanes), ("channels", m.channels(lanes)), ("rows", *rows)],
        ),
        KernelSpec::MatMul { f, rows, .. } => (
            format!(
                "[ceil(f / line_size / cols), ceil(rows / {}), 1] with cols = max(1, min({}, f / line_size))",
                GEMM_UNITS * GEMM_ROWS,
                attnc_compiler::plan::gemm_col_cap(lanes),
            ),
            vec![
                ("f", *f),
                ("line_size", lanes),
                ("cols", attnc_compiler::plan::gemm_cols(*f, lanes)),
                ("rows", *rows),
            ],
        ),
        KernelSpec::Attention { shape, kv, .. } => {
            let chunks = kv.as_ref().map_or(1, |kv| kv.splits);
            let z = if chunks > 1 { "chunks" } else { "1" };
            let mut terms = vec![("s", shape.s), ("batch", shape.batch), ("h", shape.h)];
            if chunks > 1 {
                terms.push(("chunks", chunks));
            }
            (format!("[ceil(s / {}), batch * h, {z}]", rows()), terms)
        }
        KernelSpec::AttentionLse { shape, .. }
        | KernelSpec::AttentionGrad { shape, wrt: AttnArg::Q | AttnArg::Read(_), .. } => (
            format!("[ceil(s / {}), batch * h, 1]", rows()),
            vec![("s", shape.s), ("batch", shape.batch), ("h", shape.h)],
        ),
        KernelSpec::AttentionGrad { shape, .. } => (
            format!("[ceil(sk / {}), batch * hk, 1]", rows()),
            vec![("sk", shape.sk), ("batch", shape.batch), ("hk", shape.hk)],
        ),
        KernelSpec::MixedAttention { shape, mix, pass, .. } => {
            let (name, n) = if pass.over_keys() { ("sk", shape.sk) } else { ("s", shape.s) };
            (format!("[ceil({name} / {}), batch, 1]", mix.rows), vec![(name, n), ("batch", shape.batch)])
        }
        KernelSpec::Group { groups, .. } => ("[groups, 1, 1]".to_string(), vec![("groups", *groups)]),
        KernelSpec::Contract { o1, o2, .. } => {
            ("[o1 * o2, 1, 1] (a cube per output element)".to_string(), vec![("o1", *o1), ("o2", *o2)])
        }
        KernelSpec::AttentionReadLines { shape, lines, .. } => (
            "[max(1, ceil(batch * h * lines / 256)), 1, 1]".to_string(),
            vec![("batch", shape.batch), ("h", shape.h), ("lines", lines.count(shape.s, shape.sk))],
        ),
        other => ("[max(1, ceil(elements / 256)), 1, 1]".to_string(), vec![("elements", other.len())]),
    };
    let (x, y) = spec.cubes();
    let (_, (gx, gy, _)) = spec.grid();
    let rule = if (gx as usize, gy as usize) == (x, y) {
        rule
    } else {
        format!(
            "{rule}: {x} x {y} cubes, more than 65535 along an axis, laid out linearly over [x, y, z] \
             (x fastest); cubes past {} do nothing",
            x * y
        )
    };
    (rule, terms.into_iter().collect())
}

/// Every kernel's source (file name, text) and the manifest, for `attnc compile`.
pub fn emit(plan: &Plan, target: Target) -> Result<(Vec<(String, String)>, Manifest), String> {
    let mut files = vec![];
    let mut launches = vec![];
    // Launches of the same kernel (a program's projections, a backward's
    // GEMMs) differ only in their entry's name: each is built once.
    let mut built: HashMap<String, (String, String, usize, u32)> = HashMap::new();
    for (i, l) in plan.launches.iter().enumerate() {
        if let Some(what) = l.spec.kernel_gap() {
            return Err(format!("kernel `{}` needs {what}, which the kernels do not compute yet", l.name));
        }
        // CUDA's kernels are tiled within the register file; WGSL keeps the plan's tiles.
        let spec = match target {
            Target::Cuda => l.spec.on_planes(plan.dtype, Some(32)),
            Target::Wgsl => l.spec.clone(),
        };
        let l = &attnc_compiler::plan::Launch { spec, ..l.clone() };
        let (source, shared, plane_width) = match built.entry(format!("{:?}", l.spec)) {
            Entry::Occupied(e) => {
                let (entry, source, shared, plane) = e.get();
                (source.replace(entry.as_str(), &l.name), *shared, *plane)
            }
            Entry::Vacant(e) => {
                let (source, shared, plane) = kernel_source(&l.name, &l.spec, plan.dtype, target)?;
                e.insert((l.name.clone(), source.clone(), shared, plane));
                (source, shared, plane)
            }
        };
        let info_struct = info_struct(&source);
        let shared = shared.max(match l.spec {
            KernelSpec::Group { scratch, .. } => scratch * 4,
            _ => 0,
        });
        let file = format!("{i:02}_{}.{}", l.spec.kind(), target.extension());
        files.push((file.clone(), source));
        let ((wx, wy, wz), (gx, gy, gz)) = l.spec.grid();
        let bindings = l
            .bindings
            .iter()
            .enumerate()
            .map(|(slot, id)| BindingInfo {
                binding: slot,
                buffer: *id,
                tensor: buffer_name(plan, *id),
                shape: plan.buffers[*id].shape.clone(),
                dtype: plan.dtype.storage().name(),
                access: if slot + l.spec.outputs() >= l.bindings.len() { "read_write" } else { "read" },
                line_size: l.spec.binding_line_size(slot),
            })
            .collect();
        let scalars = match &l.spec {
            KernelSpec::Attention { shape, .. } => {
                vec![ScalarInfo { name: "scale", dtype: "f32", value: f64::from_bits(shape.scale_bits) }]
            }
            _ => vec![],
        };
        let (grid_rule, grid_terms) = grid_rule(&l.spec);
        launches.push(LaunchInfo {
            file,
            entry: l.name.clone(),
            kernel: l.spec.kind(),
            workgroup_size: [wx, wy, wz],
            grid: [gx, gy, gz],
            grid_rule,
            grid_terms,
            bindings,
            scalars,
            info_struct,
            shared_memory_bytes: shared,
            line_size: l.spec.line_size(),
            prepare: l.prepare,
            plane_width,
            resources: None,
            tiling: tiling(&l.spec),
        });
    }
    let manifest = Manifest {
        spec: plan.spec.clone(),
        target: match target {
            Target::Wgsl => "wgsl",
            Target::Cuda => "cuda",
        },
        dtype: plan.dtype.name(),
        dims: plan.dims.clone(),
        calling_convention: CONVENTION,
        buffers: plan.buffers.clone(),
        launches,
        outputs: plan.outputs.iter().cloned().collect(),
    };
    Ok((files, manifest))
}
