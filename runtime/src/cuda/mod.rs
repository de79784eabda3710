//! The CUDA backend: the kernels `attnc compile --target cuda` emits,
//! compiled by NVRTC at run time for the device's architecture (cached on
//! disk, `cache.rs`) and launched through the CUDA driver API, both loaded
//! at run time through cudarc (no CUDA toolkit and no LLVM at build time).
//!
//! One launcher, [`Kernels::launch`], runs a plan from its manifest's
//! records alone (`abi.rs`): on device memory and a stream the caller owns,
//! temporaries in a workspace the caller gives (or attnc's own), with no
//! host copy, no synchronisation and no allocation, so a launch sequence
//! can be captured in a CUDA graph. [`Kernels::run`] is the CLI's way in: it
//! allocates, uploads, calls that launcher, and reads the outputs back.

pub mod abi;
pub mod cache;
mod timing;

use crate::gpu::emit::Manifest;
use crate::nvidia::Nvrtc;
use crate::Tensor;
use abi::Place;
use attnc_compiler::plan::BufferRole;
use attnc_compiler::Code;
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use std::collections::BTreeMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

pub use timing::bench;

/// Why the CUDA backend could not run; each variant has its own code.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(
        "no CUDA driver: libcuda.so.1 could not be loaded (no NVIDIA driver on this machine, or not on the \
         loader's path); run on `--backend wgpu` or `--backend interp`"
    )]
    NoDriver,
    #[error("no CUDA device {index}: {why}")]
    NoDevice { index: usize, why: String },
    #[error(
        "NVRTC {}.{} cannot compile for sm_{arch} ({device}); it targets {}; install a newer NVRTC \
         (`pip install nvidia-cuda-nvrtc-cu12`) and point ATTNC_CUDA_TOOLS at it",
        version.0, version.1, targets
    )]
    Architecture { arch: i32, device: String, version: (i32, i32), targets: String },
    #[error("NVRTC failed to compile kernel `{kernel}` for sm_{arch}:\n{log}")]
    Compile { kernel: String, arch: i32, log: String },
    #[error("CUDA launch `{launch}` failed: {message}")]
    Launch { launch: String, message: String },
    #[error("out of CUDA device memory: {bytes} bytes asked for {what}")]
    OutOfMemory { bytes: u64, what: String },
    #[error("the CUDA backend needs NVRTC and the CUDA headers: {0}")]
    Tools(String),
    #[error("{0}")]
    Tensor(String),
}

impl CudaError {
    pub fn code(&self) -> Code {
        match self {
            CudaError::NoDriver => Code::NoCudaDriver,
            CudaError::NoDevice { .. } => Code::NoCudaDevice,
            CudaError::Architecture { .. } => Code::CudaArchitecture,
            CudaError::Compile { .. } => Code::CudaCompile,
            CudaError::Launch { .. } => Code::CudaLaunch,
            CudaError::OutOfMemory { .. } => Code::CudaMemory,
            CudaError::Tools(_) => Code::CudaTools,
            CudaError::Tensor(_) => Code::DeviceTensor,
        }
    }
}

/// A driver error in `what` (a launch's name or a driver call), as the driver words it.
fn driver(what: &str, e: cu::DriverError) -> CudaError {
    let words = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    CudaError::Launch { launch: what.to_string(), message: format!("{:?}: {words}", e.0) }
}

/// A device tensor the caller owns: its address and size in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceTensor {
    pub ptr: u64,
    pub bytes: u64,
}

struct Context {
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    name: String,
    arch: i32,
    units: usize,
    nvrtc: OnceLock<Result<Nvrtc, String>>,
}

// SAFETY: driver handles may be used from any thread once their context is
// current, and every entry point below makes it current first.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the primary context retained in `Cuda::open`.
        let _ = unsafe { cu::primary_ctx::release(self.device) };
    }
}

/// A CUDA device: its primary context (the one PyTorch and the runtime API
/// use, so their pointers are valid here), architecture and size.
#[derive(Clone)]
pub struct Cuda(Arc<Context>);

impl Cuda {
    /// Device `index`; a coded error, never a panic, without a driver or device.
    pub fn open(index: usize) -> Result<Cuda, CudaError> {
        // SAFETY: probes the library names only.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        let no_device = |why: String| CudaError::NoDevice { index, why };
        cu::init().map_err(|e| no_device(format!("the driver did not initialise ({:?})", e.0)))?;
        let count = cu::device::get_count().map_err(|e| no_device(format!("{:?}", e.0)))?;
        if index >= count.max(0) as usize {
            return Err(no_device(format!("the driver reports {count} device(s)")));
        }
        let device = cu::device::get(index as i32).map_err(|e| no_device(format!("{:?}", e.0)))?;
        // SAFETY: `device` came from the driver; the context is released on drop.
        let ctx = unsafe { cu::primary_ctx::retain(device) }.map_err(|e| driver("cuDevicePrimaryCtxRetain", e))?;
        // Held from here so that an error below releases the context (Drop).
        let mut context = Context { device, ctx, name: String::new(), arch: 0, units: 0, nvrtc: OnceLock::new() };
        // SAFETY: the context just retained.
        unsafe { cu::ctx::set_current(ctx) }.map_err(|e| driver("cuCtxSetCurrent", e))?;
        let attribute =
            |a| unsafe { cu::device::get_attribute(device, a) }.map_err(|e| driver("cuDeviceGetAttribute", e));
        use sys::CUdevice_attribute::*;
        let (major, minor) = (
            attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        context.arch = major * 10 + minor;
        context.units = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(0) as usize;
        context.name = cu::device::get_name(device).unwrap_or_else(|_| format!("CUDA device {index}"));
        Ok(Cuda(Arc::new(context)))
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Compute capability as `major * 10 + minor` (90 for an H100 or H200).
    pub fn arch(&self) -> i32 {
        self.0.arch
    }

    /// Streaming multiprocessors (split-KV decoding fills them).
    pub fn compute_units(&self) -> usize {
        self.0.units
    }

    fn current(&self) -> Result<(), CudaError> {
        // SAFETY: the context this device retained.
        unsafe { cu::ctx::set_current(self.0.ctx) }.map_err(|e| driver("cuCtxSetCurrent", e))
    }

    fn nvrtc(&self) -> Result<&Nvrtc, CudaError> {
        let found = self.0.nvrtc.get_or_init(|| Nvrtc::find().map_err(|e| e.to_string()));
        let nvrtc = found.as_ref().map_err(|e| CudaError::Tools(e.clone()))?;
        let targets = nvrtc.architectures();
        if !targets.is_empty() && !targets.contains(&self.0.arch) {
            let targets = targets.iter().map(|a| format!("sm_{a}")).collect::<Vec<_>>().join(", ");
            return Err(CudaError::Architecture {
                arch: self.0.arch,
                device: self.0.name.clone(),
                version: nvrtc.version,
                targets,
            });
        }
        Ok(nvrtc)
    }

    /// The emitted kernels (`files` and `manifest` as `emit::emit` returns
    /// them for the CUDA target) compiled for this device and loaded, the
    /// plan's constants uploaded.
    pub fn load(&self, files: &[(String, String)], manifest: Manifest) -> Result<Kernels, CudaError> {
        self.current()?;
        let nvrtc = self.nvrtc()?;
        let arch = self.0.arch;
        let sources: BTreeMap<&str, &str> = files.iter().map(|(f, s)| (f.as_str(), s.as_str())).collect();
        // A thread a launch: each launch's source (its own entry name) compiles
        // once, and a later load of the same sizes finds it in the disk cache.
        let cubins: Vec<Result<Vec<u8>, CudaError>> = std::thread::scope(|scope| {
            let jobs: Vec<_> = manifest
                .launches
                .iter()
                .map(|l| {
                    let source = sources.get(l.file.as_str()).copied();
                    let entry = l.entry.as_str();
                    scope.spawn(move || match source {
                        Some(source) => cache::cubin(nvrtc, entry, source, arch),
                        None => Err(CudaError::Tools(format!("no source `{}` for launch `{entry}`", l.file))),
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|j| j.join().unwrap_or_else(|_| Err(CudaError::Tools("NVRTC panicked".into()))))
                .collect()
        });
        let mut kernels = Kernels {
            cuda: self.clone(),
            layout: abi::Layout::of(&manifest),
            infos: abi::infos(&manifest).map_err(CudaError::Tensor)?,
            dtype: abi::dtype(&manifest).map_err(CudaError::Tensor)?,
            modules: vec![],
            functions: vec![],
            constants: BTreeMap::new(),
            pool: Mutex::new(None),
            manifest,
        };
        for (l, cubin) in kernels.manifest.launches.iter().zip(cubins) {
            let cubin = cubin?;
            // SAFETY: a cubin NVRTC wrote for this device's architecture.
            let module = unsafe { cu::module::load_data(cubin.as_ptr() as *const c_void) }
                .map_err(|e| driver(&format!("{} (cuModuleLoadData)", l.entry), e))?;
            kernels.modules.push(module);
            let name = CString::new(l.entry.as_str()).expect("entry names are identifiers");
            // SAFETY: the module just loaded, which defines the entry.
            let function = unsafe { cu::module::get_function(module, name) }
                .map_err(|e| driver(&format!("{} (cuModuleGetFunction)", l.entry), e))?;
            // SAFETY: a function of a loaded module; the size the kernel was built for.
            unsafe {
                cu::function::set_function_attribute(
                    function,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    l.shared_memory_bytes as i32,
                )
            }
            .map_err(|e| driver(&format!("{} (shared memory of {} bytes)", l.entry, l.shared_memory_bytes), e))?;
            kernels.functions.push(function);
        }
        for (id, b) in kernels.manifest.buffers.iter().enumerate() {
            if let (BufferRole::Constant { values }, Place::Constant) = (&b.role, &kernels.layout.places[id]) {
                let dtype = kernels.dtype;
                let alloc = Alloc::new(abi::buffer_bytes(&kernels.manifest, id), &format!("constant {id}"))?;
                alloc.upload(&crate::dtype::encode(dtype, values))?;
                kernels.constants.insert(id, alloc);
            }
        }
        Ok(kernels)
    }
}

/// A device allocation freed on drop.
pub struct Alloc {
    pub ptr: u64,
    pub bytes: u64,
}

impl Alloc {
    /// `bytes` (at least 1) of device memory, for `what` (named in the error).
    pub fn new(bytes: u64, what: &str) -> Result<Alloc, CudaError> {
        // SAFETY: a plain allocation in the current context.
        match unsafe { cu::malloc_sync(bytes.max(1) as usize) } {
            Ok(ptr) => Ok(Alloc { ptr, bytes }),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(CudaError::OutOfMemory { bytes, what: what.to_string() })
            }
            Err(e) => Err(driver(&format!("cuMemAlloc for {what}"), e)),
        }
    }

    fn upload(&self, bytes: &[u8]) -> Result<(), CudaError> {
        // SAFETY: `bytes` fits: every caller sizes the allocation from the same buffer.
        unsafe { cu::memcpy_htod_sync(self.ptr, &bytes[..bytes.len().min(self.bytes as usize)]) }
            .map_err(|e| driver("cuMemcpyHtoD", e))
    }

    fn download(&self) -> Result<Vec<u8>, CudaError> {
        let mut bytes = vec![0u8; self.bytes as usize];
        // SAFETY: the allocation holds `bytes` bytes.
        unsafe { cu::memcpy_dtoh_sync(&mut bytes, self.ptr) }.map_err(|e| driver("cuMemcpyDtoH", e))?;
        Ok(bytes)
    }

    pub fn tensor(&self) -> DeviceTensor {
        DeviceTensor { ptr: self.ptr, bytes: self.bytes }
    }
}

impl Drop for Alloc {
    fn drop(&mut self) {
        // SAFETY: allocated by `Alloc::new`, freed once.
        let _ = unsafe { cu::free_sync(self.ptr) };
    }
}

/// A stream of attnc's own, destroyed on drop.
struct Stream(sys::CUstream);

impl Stream {
    fn new() -> Result<Stream, CudaError> {
        cu::stream::create(cu::stream::StreamKind::NonBlocking).map(Stream).map_err(|e| driver("cuStreamCreate", e))
    }

    fn sync(&self, what: &str) -> Result<(), CudaError> {
        // SAFETY: a stream created by `Stream::new`.
        unsafe { cu::stream::synchronize(self.0) }.map_err(|e| driver(what, e))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by `Stream::new`, destroyed once.
        let _ = unsafe { cu::stream::destroy(self.0) };
    }
}

/// Allocations by buffer id, freed on drop.
type Held = Vec<(usize, Alloc)>;

/// A plan's kernels loaded on a device: launched from its manifest alone.
pub struct Kernels {
    manifest: Manifest,
    layout: abi::Layout,
    /// Each launch's `info` bytes, packed once.
    infos: Vec<Vec<u8>>,
    /// The buffers' storage type.
    dtype: attnc_compiler::plan::Dtype,
    modules: Vec<sys::CUmodule>,
    /// One function per launch.
    functions: Vec<sys::CUfunction>,
    constants: BTreeMap<usize, Alloc>,
    /// attnc's own workspace, made at the first launch that gives none.
    pool: Mutex<Option<Alloc>>,
    /// Last: fields drop in order, and the allocations above are freed
    /// before the context they live in may be released.
    cuda: Cuda,
}

// SAFETY: as for `Context`: every entry point makes the context current.
unsafe impl Send for Kernels {}
unsafe impl Sync for Kernels {}

impl Drop for Kernels {
    fn drop(&mut self) {
        let _ = self.cuda.current();
        for m in self.modules.drain(..) {
            // SAFETY: loaded by `Cuda::load`, unloaded once.
            let _ = unsafe { cu::module::unload(m) };
        }
    }
}

impl Kernels {
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Bytes of workspace a launch needs for the plan's temporaries.
    pub fn workspace_bytes(&self) -> u64 {
        self.layout.workspace_bytes
    }

    /// The bytes each input and output the caller passes must hold, by name.
    pub fn tensor_bytes(&self) -> BTreeMap<String, u64> {
        self.layout
            .places
            .iter()
            .enumerate()
            .filter_map(|(id, p)| match p {
                Place::Tensor(name) => Some((name.clone(), abi::buffer_bytes(&self.manifest, id))),
                _ => None,
            })
            .collect()
    }

    /// Run on host tensors (the CLI's way): allocate every input and
    /// output, upload the inputs, launch on a stream of its own, wait once,
    /// and read the outputs back, by name.
    pub fn run(&self, inputs: &BTreeMap<String, Tensor>) -> Result<BTreeMap<String, Tensor>, CudaError> {
        let (held, tensors) = self.allocate()?;
        self.upload(&held, inputs, |_| true)?;
        let stream = Stream::new()?;
        // SAFETY: every tensor and the workspace are allocations of the sizes the plan needs.
        unsafe { self.launch(&tensors, None, stream.0 as u64) }?;
        stream.sync("the launches")?;
        self.read_outputs(&held)
    }

    /// Make attnc's own workspace now (a synchronous allocation), so that
    /// later launches without one allocate nothing (a CUDA graph capture).
    pub fn reserve_workspace(&self) -> Result<u64, CudaError> {
        self.cuda.current()?;
        let mut pool = self.pool.lock().expect("not poisoned");
        if pool.is_none() {
            *pool = Some(Alloc::new(self.layout.workspace_bytes, "the workspace")?);
        }
        Ok(pool.as_ref().map_or(0, |a| a.ptr))
    }

    /// Run every launch on `stream` (a `CUstream`; 0 is the legacy default
    /// stream): inputs and outputs are the caller's `tensors` by name,
    /// temporaries in `workspace` (at least [`Kernels::workspace_bytes`])
    /// or attnc's own. Returns once the launches are queued.
    ///
    /// # Safety
    /// Each pointer must be device memory of this device's context, holding
    /// at least the bytes given, alive until the stream has run the launches.
    pub unsafe fn launch(
        &self,
        tensors: &BTreeMap<String, DeviceTensor>,
        workspace: Option<DeviceTensor>,
        stream: u64,
    ) -> Result<(), CudaError> {
        self.launch_range(0..self.manifest.launches.len(), tensors, workspace, stream)
    }

    /// [`Kernels::launch`] for the launches `range` (the first
    /// [`abi::prepared`] prepare the weights and may run once).
    ///
    /// # Safety
    /// As for [`Kernels::launch`].
    pub unsafe fn launch_range(
        &self,
        range: std::ops::Range<usize>,
        tensors: &BTreeMap<String, DeviceTensor>,
        workspace: Option<DeviceTensor>,
        stream: u64,
    ) -> Result<(), CudaError> {
        let addresses = self.addresses(tensors, workspace)?;
        let calls = abi::calls(&self.manifest, &self.infos, range.clone(), |id| addresses[id]);
        for (call, f) in calls.iter().zip(&self.functions[range]) {
            self.queue(call, *f, stream)?;
        }
        Ok(())
    }

    /// Every buffer's device address, each caller buffer checked against
    /// the bytes it must hold.
    fn addresses(
        &self,
        tensors: &BTreeMap<String, DeviceTensor>,
        workspace: Option<DeviceTensor>,
    ) -> Result<Vec<u64>, CudaError> {
        self.cuda.current()?;
        let workspace = match workspace {
            Some(w) if w.bytes < self.layout.workspace_bytes => {
                return Err(CudaError::Tensor(format!(
                    "the workspace holds {} bytes; this plan needs {} (workspace_bytes())",
                    w.bytes, self.layout.workspace_bytes
                )))
            }
            Some(w) => w.ptr,
            None if self.layout.workspace_bytes == 0 => 0,
            None => self.reserve_workspace()?,
        };
        let needs = |id: usize| {
            let b = &self.manifest.buffers[id];
            format!("{} bytes ({:?} in {})", abi::buffer_bytes(&self.manifest, id), b.shape, self.manifest.dtype)
        };
        (self.layout.places.iter().enumerate())
            .map(|(id, place)| match place {
                Place::Constant => Ok(self.constants.get(&id).map_or(0, |a| a.ptr)),
                Place::Workspace(offset) => Ok(workspace + offset),
                Place::Tensor(name) => match tensors.get(name) {
                    None => {
                        Err(CudaError::Tensor(format!("no device tensor `{name}` was given; it needs {}", needs(id))))
                    }
                    Some(t) if t.bytes < abi::buffer_bytes(&self.manifest, id) => Err(CudaError::Tensor(format!(
                        "device tensor `{name}` holds {} bytes; it needs {}",
                        t.bytes,
                        needs(id)
                    ))),
                    Some(t) => Ok(t.ptr),
                },
            })
            .collect()
    }

    /// Queue one call on `stream`.
    unsafe fn queue(&self, call: &abi::Call, f: sys::CUfunction, stream: u64) -> Result<(), CudaError> {
        // The driver reads each parameter through its address (and writes none).
        let mut params: Vec<*mut c_void> = call.pointers.iter().map(|p| p as *const u64 as *mut c_void).collect();
        if !call.info.is_empty() {
            params.push(call.info.as_ptr() as *mut c_void);
        }
        let [gx, gy, gz] = call.grid;
        let [bx, by, bz] = call.block;
        cu::launch_kernel(f, (gx, gy, gz), (bx, by, bz), call.shared_bytes, stream as sys::CUstream, &mut params)
            .map_err(|e| driver(call.entry, e))
    }

    /// Device buffers for every input and output.
    fn allocate(&self) -> Result<(Held, BTreeMap<String, DeviceTensor>), CudaError> {
        self.cuda.current()?;
        let (mut held, mut tensors) = (vec![], BTreeMap::new());
        for (id, place) in self.layout.places.iter().enumerate() {
            let Place::Tensor(name) = place else { continue };
            let alloc = Alloc::new(abi::buffer_bytes(&self.manifest, id), &format!("tensor `{name}`"))?;
            tensors.insert(name.clone(), alloc.tensor());
            held.push((id, alloc));
        }
        Ok((held, tensors))
    }

    /// Upload the inputs `pick` selects (by whether they are weights) into `held`.
    fn upload(
        &self,
        held: &Held,
        inputs: &BTreeMap<String, Tensor>,
        pick: impl Fn(bool) -> bool,
    ) -> Result<(), CudaError> {
        let dtype = self.dtype;
        for (id, alloc) in held {
            let BufferRole::Input { name, integers, weight } = &self.manifest.buffers[*id].role else { continue };
            if !pick(*weight) {
                continue;
            }
            let t = inputs.get(name).ok_or_else(|| CudaError::Tensor(format!("input tensor `{name}` is missing")))?;
            let values = match *integers && dtype.is_half() {
                true => crate::dtype::integer_digits(&t.data),
                false => t.data.clone(),
            };
            alloc.upload(&crate::dtype::encode(dtype, &values))?;
        }
        Ok(())
    }

    /// The outputs, read back from `held` after the launches ran.
    fn read_outputs(&self, held: &Held) -> Result<BTreeMap<String, Tensor>, CudaError> {
        let dtype = self.dtype;
        let mut out = BTreeMap::new();
        for (name, id) in &self.manifest.outputs {
            let alloc = held.iter().find(|(i, _)| i == id).map(|(_, a)| a).expect("outputs are allocated");
            let data = crate::dtype::decode(dtype, &alloc.download()?);
            out.insert(name.clone(), Tensor::new(self.manifest.buffers[*id].shape.clone(), data));
        }
        Ok(out)
    }
}
