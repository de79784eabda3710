//! NVIDIA's compilers without a GPU: NVRTC (through cudarc) turns emitted
//! CUDA C++ into PTX with the options the CUDA backend compiles with, `ptxas -v` assembles the PTX and
//! reports each kernel's registers, spills and shared memory, and
//! `cuobjdump -sass` shows the machine code (tensor-core `HMMA`).
//!
//! The tools come from NVIDIA's Python wheels (`nvidia-cuda-nvrtc-cu12`,
//! `nvidia-cuda-nvcc-cu12`, `nvidia-cuda-runtime-cu12`,
//! `nvidia-cuda-cuobjdump`, `nvidia-cuda-nvdisasm`) or a CUDA toolkit; [`Tools::find`] looks where
//! `ATTNC_CUDA_TOOLS` points (a `pip install --target` folder), then in
//! `CUDA_HOME`/`CUDA_PATH` and `/usr/local/cuda`, then on `PATH`. No driver and
//! no GPU are needed.

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// How to install the tools, for messages.
pub const INSTALL_HINT: &str = "install NVIDIA's compilers with `pip install --target DIR nvidia-cuda-nvrtc-cu12 \
nvidia-cuda-nvcc-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` and set ATTNC_CUDA_TOOLS=DIR \
(or set CUDA_HOME to a CUDA toolkit)";

/// A GPU architecture kernels are checked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Sm80,
    Sm90,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Sm80, Arch::Sm90];

    pub fn parse(s: &str) -> Option<Arch> {
        match s {
            "sm_80" => Some(Arch::Sm80),
            "sm_90" => Some(Arch::Sm90),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm90 => "sm_90",
        }
    }

    /// NVRTC's `--gpu-architecture`, as cubecl-cuda 0.11.3 passes it
    /// (`compile_to_ptx`: `sm_90a` from 90 on, else `sm_XY`).
    fn nvrtc_arch(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm90 => "sm_90a",
        }
    }

    /// The per-SM limits occupancy is computed from (CUDA C Programming
    /// Guide, "Compute capabilities" table).
    pub fn limits(self) -> SmLimits {
        match self {
            Arch::Sm80 => SmLimits {
                registers: 65536,
                max_threads: 2048,
                max_blocks: 32,
                shared_per_sm: 164 * 1024,
                shared_per_block: 48 * 1024,
                shared_per_block_optin: 163 * 1024,
            },
            Arch::Sm90 => SmLimits {
                registers: 65536,
                max_threads: 2048,
                max_blocks: 32,
                shared_per_sm: 228 * 1024,
                shared_per_block: 48 * 1024,
                shared_per_block_optin: 227 * 1024,
            },
        }
    }
}

/// What one streaming multiprocessor of an architecture holds.
#[derive(Clone, Copy, Debug)]
pub struct SmLimits {
    pub registers: u32,
    pub max_threads: u32,
    pub max_blocks: u32,
    pub shared_per_sm: u32,
    /// Shared memory a block may use without `cudaFuncSetAttribute`'s opt-in.
    pub shared_per_block: u32,
    pub shared_per_block_optin: u32,
}

/// A kernel's resources as ptxas reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Resources {
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_frame: u32,
    pub static_shared: u32,
}

/// Resources with the launch's shape: occupancy for one architecture.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Occupancy {
    pub blocks_per_sm: u32,
    pub warps_per_sm: u32,
    /// What bounds `blocks_per_sm`: "registers", "shared memory", "threads" or "blocks".
    pub limited_by: &'static str,
}

impl Resources {
    /// Theoretical occupancy of blocks of `threads` with `dynamic_shared`
    /// bytes of dynamic shared memory, by the occupancy calculator's rules:
    /// registers are allocated per warp in units of 256, shared memory per
    /// block in units of 128 bytes plus 1 KiB the system reserves.
    pub fn occupancy(&self, arch: Arch, threads: u32, dynamic_shared: u32) -> Occupancy {
        let lim = arch.limits();
        let warps = threads.div_ceil(32).max(1);
        let regs_per_warp = (self.registers.max(1) * 32).div_ceil(256) * 256;
        let by_regs = (lim.registers / regs_per_warp) / warps;
        let shared = (self.static_shared + dynamic_shared).div_ceil(128) * 128 + 1024;
        let by_shared = lim.shared_per_sm / shared;
        let by_threads = lim.max_threads / (warps * 32);
        let (blocks, limited_by) =
            [(by_regs, "registers"), (by_shared, "shared memory"), (by_threads, "threads"), (lim.max_blocks, "blocks")]
                .into_iter()
                .min_by_key(|(n, _)| *n)
                .expect("four limits");
        Occupancy { blocks_per_sm: blocks, warps_per_sm: blocks * warps, limited_by }
    }
}

/// Why a compile failed: NVRTC's or ptxas's own words.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("NVIDIA's compilers were not found ({0}); {INSTALL_HINT}")]
    Missing(String),
    #[error("NVRTC failed to compile `{kernel}` for {arch}:\n{log}")]
    Nvrtc { kernel: String, arch: &'static str, log: String },
    #[error("ptxas failed on `{kernel}` for {arch}:\n{log}")]
    Ptxas { kernel: String, arch: &'static str, log: String },
    #[error("{0}")]
    Io(String),
}

/// NVRTC through cudarc, and the CUDA headers the kernels include.
///
/// cudarc opens NVRTC by its library name; the file found here (a wheel's
/// `libnvrtc.so.12` is on no search path) is opened first and stays open,
/// so the loader hands cudarc that library for the same name.
pub struct Nvrtc {
    includes: Vec<PathBuf>,
    /// NVRTC's (major, minor) version.
    pub version: (i32, i32),
    _lib: &'static libloading::Library,
}

/// The folders NVIDIA's tools are looked for under, in order: `ATTNC_CUDA_TOOLS`
/// (a `pip install --target` folder or a Python `site-packages`), `CUDA_HOME`,
/// `CUDA_PATH`, `/usr/local/cuda`.
fn roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = vec![];
    for var in ["ATTNC_CUDA_TOOLS", "CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            roots.extend(std::env::split_paths(&v));
        }
    }
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots
}

fn under(roots: &[PathBuf], rel: &[&str]) -> Option<PathBuf> {
    first_existing(roots.iter().flat_map(|r| rel.iter().map(move |p| r.join(p))))
}

impl Nvrtc {
    /// NVRTC and the CUDA headers (`cuda_fp16.h`), from [`roots`].
    pub fn find() -> Result<Nvrtc, ToolError> {
        static LIB: std::sync::OnceLock<Result<(libloading::Library, PathBuf), String>> = std::sync::OnceLock::new();
        let roots = roots();
        let loaded = LIB.get_or_init(|| {
            let path = under(
                &roots,
                &[
                    "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                    "lib64/libnvrtc.so.12",
                    "lib64/libnvrtc.so",
                    "lib/libnvrtc.so.12",
                ],
            )
            .ok_or_else(|| "no libnvrtc.so.12".to_string())?;
            // SAFETY: opening NVRTC runs its initialisers only.
            let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| format!("{}: {e}", path.display()))?;
            Ok((lib, path))
        });
        let (lib, path) = loaded.as_ref().map_err(|e| ToolError::Missing(e.clone()))?;
        // SAFETY: cudarc's loader probes the library names only.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(ToolError::Missing(format!(
                "{} opened, but not under the name libnvrtc.so.12",
                path.display()
            )));
        }
        let includes: Vec<PathBuf> =
            ["nvidia/cuda_runtime/include", "nvidia/cuda_nvcc/include", "nvidia/cuda_nvrtc/include", "include"]
                .iter()
                .flat_map(|p| roots.iter().map(move |r| r.join(p)))
                .filter(|p| p.exists())
                .collect();
        if !includes.iter().any(|i| i.join("cuda_fp16.h").exists()) {
            return Err(ToolError::Missing("no CUDA headers (cuda_fp16.h)".into()));
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: NVRTC's documented version query into two ints.
        unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| ToolError::Missing(format!("nvrtcVersion: {e:?}")))?;
        Ok(Nvrtc { includes, version: (major, minor), _lib: lib })
    }

    /// The real architectures (`sm_XY` as XY) NVRTC can compile for.
    pub fn architectures(&self) -> Vec<i32> {
        let mut n = 0;
        // SAFETY: NVRTC's documented queries: a count, then that many ints.
        unsafe {
            if cudarc::nvrtc::sys::nvrtcGetNumSupportedArchs(&mut n).result().is_err() {
                return vec![];
            }
            let mut archs = vec![0; n.max(0) as usize];
            match cudarc::nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()).result() {
                Ok(()) => archs,
                Err(_) => vec![],
            }
        }
    }

    /// PTX for `source` compiled with `options`, or NVRTC's log.
    pub fn ptx(&self, source: &str, options: &[String]) -> Result<String, String> {
        self.compile(source, options, |prog| {
            // SAFETY: `prog` compiled; the PTX buffer is sized by NVRTC.
            unsafe { cudarc::nvrtc::result::get_ptx(prog) }
                .map(|p| unsafe { CStr::from_ptr(p.as_ptr()) }.to_string_lossy().into_owned())
                .map_err(|e| format!("nvrtcGetPTX: {e:?}"))
        })
    }

    /// A cubin for `source` compiled with `options` (which name a real
    /// `sm_XY` architecture), or NVRTC's log.
    pub fn cubin(&self, source: &str, options: &[String]) -> Result<Vec<u8>, String> {
        use cudarc::nvrtc::sys;
        self.compile(source, options, |prog| {
            let mut n = 0usize;
            let mut bytes = vec![];
            // SAFETY: `prog` compiled; the buffer is sized by the size query.
            unsafe {
                sys::nvrtcGetCUBINSize(prog, &mut n).result().and_then(|()| {
                    bytes = vec![0u8; n];
                    sys::nvrtcGetCUBIN(prog, bytes.as_mut_ptr() as *mut c_char).result()
                })
            }
            .map(|()| bytes)
            .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))
        })
    }

    /// `source` compiled with `options` plus the include folders, `read`
    /// on success, NVRTC's log on failure.
    fn compile<T>(
        &self,
        source: &str,
        options: &[String],
        read: impl FnOnce(cudarc::nvrtc::sys::nvrtcProgram) -> Result<T, String>,
    ) -> Result<T, String> {
        use cudarc::nvrtc::result;
        let src = CString::new(source).map_err(|_| "source holds a NUL byte".to_string())?;
        let mut options = options.to_vec();
        options.extend(self.includes.iter().map(|i| format!("--include-path={}", i.display())));
        let prog =
            result::create_program(&src, Some(c"kernel.cu")).map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
        // SAFETY: NVRTC's API used as documented: one program created,
        // compiled, read and destroyed here.
        unsafe {
            let out = match result::compile_program(prog, &options) {
                Ok(()) => read(prog),
                Err(_) => Err(result::get_program_log(prog).map_or_else(
                    |e| format!("no log: {e:?}"),
                    |log| CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned(),
                )),
            };
            let _ = result::destroy_program(prog);
            out
        }
    }
}

/// NVRTC, its headers, ptxas and (optionally) cuobjdump.
pub struct Tools {
    pub nvrtc: Nvrtc,
    ptxas: PathBuf,
    cuobjdump: Option<PathBuf>,
}

/// One kernel compiled for one architecture.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub resources: Resources,
    /// Matrix instructions in the PTX (`mma`/`wmma`).
    pub ptx_mma: bool,
    /// `HMMA` instructions in the SASS, where cuobjdump was found (none
    /// where the PTX has no matrix instruction).
    pub sass_hmma: Option<bool>,
}

fn first_existing(candidates: impl IntoIterator<Item = PathBuf>) -> Option<PathBuf> {
    candidates.into_iter().find(|p| p.exists())
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| first_existing(std::env::split_paths(&paths).map(|d| d.join(name))))
}

impl Tools {
    /// The tools, from `ATTNC_CUDA_TOOLS` (wheels installed with `pip
    /// install --target`), a CUDA toolkit (`CUDA_HOME`, `CUDA_PATH`,
    /// `/usr/local/cuda`) or `PATH`.
    pub fn find() -> Result<Tools, ToolError> {
        let nvrtc = Nvrtc::find()?;
        let roots = roots();
        let ptxas = under(&roots, &["nvidia/cuda_nvcc/bin/ptxas", "bin/ptxas"])
            .or_else(|| on_path("ptxas"))
            .ok_or_else(|| ToolError::Missing("no ptxas".into()))?;
        let cuobjdump =
            under(&roots, &["nvidia/cu13/bin/cuobjdump", "nvidia/cuda_cuobjdump/bin/cuobjdump", "bin/cuobjdump"])
                .or_else(|| on_path("cuobjdump"));
        Ok(Tools { nvrtc, ptxas, cuobjdump })
    }

    /// Whether SASS can be read (cuobjdump was found).
    pub fn reads_sass(&self) -> bool {
        self.cuobjdump.is_some()
    }

    /// NVRTC's PTX for `source`, with cubecl-cuda 0.11.3's options.
    pub fn ptx(&self, kernel: &str, source: &str, arch: Arch) -> Result<String, ToolError> {
        let options = [format!("--gpu-architecture={}", arch.nvrtc_arch()), "-lineinfo".to_string()];
        self.nvrtc.ptx(source, &options).map_err(|log| ToolError::Nvrtc {
            kernel: kernel.to_string(),
            arch: arch.name(),
            log,
        })
    }

    /// Compile `source` (one kernel, entry `kernel`) for `arch`: NVRTC,
    /// then `ptxas -v`, then the SASS where cuobjdump is there.
    pub fn compile(&self, kernel: &str, source: &str, arch: Arch) -> Result<Compiled, ToolError> {
        let ptx = self.ptx(kernel, source, arch)?;
        let dir = tempdir().map_err(|e| ToolError::Io(format!("cannot make a temporary folder: {e}")))?;
        let ptx_file = dir.0.join("k.ptx");
        let cubin = dir.0.join("k.cubin");
        std::fs::write(&ptx_file, &ptx).map_err(|e| ToolError::Io(format!("{}: {e}", ptx_file.display())))?;
        let out = Command::new(&self.ptxas)
            .arg(format!("-arch={}", arch.nvrtc_arch()))
            .arg("-v")
            .arg(&ptx_file)
            .arg("-o")
            .arg(&cubin)
            .output()
            .map_err(|e| ToolError::Io(format!("cannot run {}: {e}", self.ptxas.display())))?;
        let log = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(ToolError::Ptxas { kernel: kernel.to_string(), arch: arch.name(), log });
        }
        let resources = parse_ptxas(&log).ok_or_else(|| ToolError::Ptxas {
            kernel: kernel.to_string(),
            arch: arch.name(),
            log: format!("no resource report in ptxas's output:\n{log}"),
        })?;
        let ptx_mma = ptx.lines().any(|l| {
            let t = l.trim_start();
            t.starts_with("mma.") || t.starts_with("wmma.mma")
        });
        let sass_hmma = match &self.cuobjdump {
            None => None,
            // ptxas emits tensor-core instructions only for the PTX's
            // matrix instructions: without them the SASS has no HMMA, and
            // cuobjdump (about 1.5 s a kernel, most of the gate's time) is
            // not run.
            Some(_) if !ptx_mma => Some(false),
            Some(tool) => {
                // cuobjdump runs nvdisasm, which the wheels put beside it.
                let mut path = tool.parent().map(Path::to_path_buf).into_iter().collect::<Vec<_>>();
                path.extend(std::env::var_os("PATH").iter().flat_map(std::env::split_paths));
                let out = Command::new(tool)
                    .env("PATH", std::env::join_paths(path).map_err(|e| ToolError::Io(e.to_string()))?)
                    .arg("-sass")
                    .arg(&cubin)
                    .output()
                    .map_err(|e| ToolError::Io(format!("cannot run {}: {e}", tool.display())))?;
                if !out.status.success() {
                    return Err(ToolError::Io(format!(
                        "cuobjdump failed on `{kernel}`: {}",
                        String::from_utf8_lossy(&out.stderr)
                    )));
                }
                Some(String::from_utf8_lossy(&out.stdout).contains("HMMA"))
            }
        };
        Ok(Compiled { resources, ptx_mma, sass_hmma })
    }
}

/// A temporary folder removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> std::io::Result<TempDir> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "attnc-ptxas-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(TempDir(dir))
}

/// The resources in `ptxas -v`'s report of one kernel:
/// `N bytes stack frame, S bytes spill stores, L bytes spill loads` and
/// `Used R registers, ... B bytes smem, ...`.
pub fn parse_ptxas(log: &str) -> Option<Resources> {
    let number_before = |line: &str, unit: &str| -> Option<u32> {
        let at = line.find(unit)?;
        line[..at].split(|c: char| c == ',' || c == ':').next_back()?.trim().parse().ok()
    };
    let mut r = Resources::default();
    let (mut frame, mut used) = (false, false);
    for line in log.lines() {
        if line.contains("bytes stack frame") {
            r.stack_frame = number_before(line, "bytes stack frame")?;
            r.spill_stores = number_before(line, "bytes spill stores")?;
            r.spill_loads = number_before(line, "bytes spill loads")?;
            frame = true;
        }
        if line.contains("Used") && line.contains("registers") {
            let after = &line[line.find("Used")? + 4..];
            r.registers = after.trim_start().split_whitespace().next()?.parse().ok()?;
            r.static_shared = number_before(line, "bytes smem").unwrap_or(0);
            used = true;
        }
    }
    (frame && used).then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ptxas_reports() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'attention_3' for 'sm_90a'\n\
ptxas info    : Function properties for attention_3\n\
    88 bytes stack frame, 84 bytes spill stores, 80 bytes spill loads\n\
ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem, 400 bytes cmem[0]\n";
        let r = parse_ptxas(log).unwrap();
        assert_eq!(
            r,
            Resources { registers: 255, spill_stores: 84, spill_loads: 80, stack_frame: 88, static_shared: 4096 }
        );
        let plain = "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 40 registers, used 0 barriers, 384 bytes cmem[0]\n";
        assert_eq!(parse_ptxas(plain).unwrap().registers, 40);
        assert_eq!(parse_ptxas("ptxas info : 0 bytes gmem"), None);
    }

    #[test]
    fn occupancy_follows_the_calculator() {
        // 64 threads at 255 registers: 2 warps × 8192 registers → 4 blocks.
        let r = Resources { registers: 255, ..Default::default() };
        assert_eq!(r.occupancy(Arch::Sm90, 64, 0).blocks_per_sm, 4);
        assert_eq!(r.occupancy(Arch::Sm90, 64, 0).limited_by, "registers");
        // 256 threads at 32 registers, 40 KiB shared: shared memory bounds it (228 / 41 → 5).
        let r = Resources { registers: 32, ..Default::default() };
        let o = r.occupancy(Arch::Sm90, 256, 40 * 1024);
        assert_eq!((o.blocks_per_sm, o.warps_per_sm, o.limited_by), (5, 40, "shared memory"));
        // Few registers and little memory: threads bound it.
        assert_eq!(r.occupancy(Arch::Sm80, 1024, 0).blocks_per_sm, 2);
    }
}

/// What `attnc compile --target cuda` reports per launch (and writes into
/// the manifest) when NVIDIA's compilers are found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LaunchResources {
    pub arch: &'static str,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_frame: u32,
    pub static_shared: u32,
    pub dynamic_shared: u32,
    pub threads: u32,
    pub blocks_per_sm: u32,
    pub warps_per_sm: u32,
    pub occupancy_limited_by: &'static str,
    /// Matrix (`mma`) instructions in the PTX.
    pub ptx_mma: bool,
    /// `HMMA` instructions in the SASS (absent where cuobjdump was not found).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sass_hmma: Option<bool>,
}

/// The resources of an emission's launches, as `attnc compile --target cuda`
/// reports them: compiled for `arch`, written into each launch's
/// `resources`, and returned in launch order. The CLI and the Python package
/// both come here, so their manifests agree.
pub fn annotate(
    tools: &Tools,
    files: &[(String, String)],
    manifest: &mut crate::gpu::emit::Manifest,
    arch: Arch,
) -> Result<Vec<LaunchResources>, ToolError> {
    let sources: Vec<_> = files
        .iter()
        .zip(&manifest.launches)
        .map(|((_, text), l)| (l.entry.as_str(), text.as_str(), l.threads(), l.shared_memory_bytes as u32))
        .collect();
    let resources = check_sources(tools, &sources, arch)?;
    for (l, r) in manifest.launches.iter_mut().zip(&resources) {
        l.resources = Some(r.clone());
    }
    Ok(resources)
}

/// Compile every `(entry, source, threads, dynamic shared bytes)` of an
/// emission for `arch`, in parallel. Kernels that differ only in their
/// entry's name compile once.
pub fn check_sources(
    tools: &Tools,
    sources: &[(&str, &str, u32, u32)],
    arch: Arch,
) -> Result<Vec<LaunchResources>, ToolError> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    // The entry point's name appears once, in its declaration.
    let keys: Vec<String> =
        sources.iter().map(|(entry, source, _, _)| source.replacen(entry, "attnc_kernel", 1)).collect();
    let mut unique: Vec<(&str, &str)> = vec![];
    let mut index: HashMap<&str, usize> = HashMap::new();
    for ((entry, source, _, _), key) in sources.iter().zip(&keys) {
        index.entry(key.as_str()).or_insert_with(|| {
            unique.push((entry, source));
            unique.len() - 1
        });
    }
    let results: Mutex<Vec<Option<Result<Compiled, ToolError>>>> =
        Mutex::new((0..unique.len()).map(|_| None).collect());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).min(unique.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((entry, source)) = unique.get(i) else { break };
                let r = tools.compile(entry, source, arch);
                results.lock().expect("not poisoned")[i] = Some(r);
            });
        }
    });
    let compiled: Vec<Compiled> = results
        .into_inner()
        .expect("not poisoned")
        .into_iter()
        .map(|r| r.expect("every source compiled"))
        .collect::<Result<_, _>>()?;
    Ok(sources
        .iter()
        .zip(&keys)
        .map(|((_, _, threads, dynamic), key)| {
            let c = &compiled[index[key.as_str()]];
            let o = c.resources.occupancy(arch, *threads, *dynamic);
            LaunchResources {
                arch: arch.name(),
                registers: c.resources.registers,
                spill_stores: c.resources.spill_stores,
                spill_loads: c.resources.spill_loads,
                stack_frame: c.resources.stack_frame,
                static_shared: c.resources.static_shared,
                dynamic_shared: *dynamic,
                threads: *threads,
                blocks_per_sm: o.blocks_per_sm,
                warps_per_sm: o.warps_per_sm,
                occupancy_limited_by: o.limited_by,
                ptx_mma: c.ptx_mma,
                sass_hmma: c.sass_hmma,
            }
        })
        .collect())
}

/// The resource table `attnc compile` prints: one row per kernel.
pub fn render_table(files: &[&str], resources: &[LaunchResources]) -> String {
    let width = files.iter().map(|f| f.len()).max().unwrap_or(6).max(6);
    let arch = resources.first().map_or("", |r| r.arch);
    let mut out = format!(
        "{:width$}  {:>4}  {:>11}  {:>13}  {:>7}  {:>16}  {:>8}\n",
        "kernel",
        "regs",
        "spill st/ld",
        "smem st+dyn",
        "threads",
        format!("blocks/SM ({arch})"),
        "warps/SM"
    );
    for (f, r) in files.iter().zip(resources) {
        out.push_str(&format!(
            "{f:width$}  {:>4}  {:>11}  {:>13}  {:>7}  {:>16}  {:>8}\n",
            r.registers,
            format!("{}/{}", r.spill_stores, r.spill_loads),
            format!("{}+{}", r.static_shared, r.dynamic_shared),
            r.threads,
            format!("{} ({})", r.blocks_per_sm, r.occupancy_limited_by),
            r.warps_per_sm,
        ));
    }
    out
}
