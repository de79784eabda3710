//! Executing a plan on a CubeCL client: upload inputs and constants, launch
//! in order, free temporaries after their last reader, read outputs back.
//! The executor keeps its own accounting of device bytes allocated.

use super::define::IrKernel;
use super::kernels::Stored;
use crate::tensor::Tensor;
use attnc_compiler::plan::{BufferRole, Dtype, KernelSpec, Plan, LOOP_TRIPS_CPU};
use cubecl::prelude::*;
/// A device buffer (a view of one) on a client: what [`Gpu::run_resident`] runs on.
pub use cubecl::server::Handle;
use cubecl::wgpu::WgpuDeviceKind;
use std::collections::BTreeMap;

/// Why a plan could not run on a device.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no {0} device is available: {1}")]
    Unavailable(&'static str, String),
    /// A launch that failed: the kernel's name and the device runtime's
    /// whole error chain; shown as one cause line ([`launch_cause`]).
    #[error("kernel `{0}` failed: {cause}", cause = launch_cause(.1))]
    Launch(String, String),
    #[error("input tensor `{0}` is missing")]
    MissingInput(String),
    #[error(
        "kernel `{kernel}` would run {trips} loop iterations per unit, past the {limit} that Mesa's CPU \
         drivers (llvmpipe, lavapipe) run before they leave every loop without a word (wrong results); \
         run these sizes on a GPU or on `--backend interp`"
    )]
    LoopLimit { kernel: String, trips: usize, limit: usize },
    #[error("the {backend} device `{adapter}` cannot run {dtype} kernels ({why}); use {hint}")]
    Dtype { backend: &'static str, adapter: String, dtype: Dtype, why: &'static str, hint: &'static str },
    #[error("kernel `{kernel}` needs {what}, which the kernels do not compute yet; use `--backend interp`")]
    Unsupported { kernel: String, what: &'static str },
}

/// How many buffers the executors of this process have read back to the
/// host: `Gpu::run` and `Gpu::run_prepared` read their outputs;
/// `Gpu::run_resident` reads nothing (what `attnc-burn`'s tests check of
/// a training step).
pub static HOST_READS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether a failed launch shows the device runtime's whole error chain
/// (`attnc -v`) rather than one cause line.
pub static FULL_ERRORS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One line for a failed launch's error chain (cubecl's, as `{:?}` prints
/// it): the shader compiler's first message where a compile failed (its
/// kernel and place), else the chain's innermost cause; the whole chain
/// with [`FULL_ERRORS`].
pub fn launch_cause(chain: &str) -> String {
    if FULL_ERRORS.load(std::sync::atomic::Ordering::Relaxed) {
        return chain.to_string();
    }
    let chain = chain.split("\nBacktrace:").next().unwrap_or(chain);
    let lines: Vec<&str> = chain.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let plain = |l: &&&str| !l.starts_with("Caused by") && !l.starts_with("In ") && !l.starts_with(['┌', '│', '=']);
    let line = match lines.iter().position(|l| l.contains("compilation failed")) {
        Some(i) => {
            let head = lines[i].split(": ").next().unwrap_or(lines[i]);
            let message = lines[i + 1..].iter().find(plain).copied();
            let place = lines[i + 1..].iter().find_map(|l| l.strip_prefix("┌─ "));
            match (message, place) {
                (Some(m), Some(p)) => format!("{head}: {m} ({p})"),
                (Some(m), None) => format!("{head}: {m}"),
                _ => lines[i].to_string(),
            }
        }
        None => lines.iter().rev().find(plain).map_or(chain.trim().to_string(), |l| l.to_string()),
    };
    format!("{line} (`attnc -v` shows the whole chain)")
}

/// A device and its client.
pub struct Gpu {
    client: Client,
    pub backend: &'static str,
    pub adapter: String,
    /// WGSL text by entry point, launched instead of the in-process definitions.
    precompiled: Option<BTreeMap<String, String>>,
    /// Plane width the kernels rely on, instead of the device's (see `device::plane_width`).
    plane: Option<u32>,
    /// Whether GEMMs stage tiles in shared memory, instead of the device's choice.
    staged: Option<bool>,
    /// Fragment kernels with fragments in software wherever a spec allows them.
    software_fragments: bool,
    /// Launches tiled within a GPU's register file (`plan::choose_path`):
    /// off for wgpu (lavapipe's units are CPU vectors).
    register_tiles: bool,
}

/// A kernel whose source was generated earlier (by `attnc compile`).
struct Precompiled {
    settings: KernelSettings,
    entry: String,
    source: String,
}

impl KernelMetadata for Precompiled {
    fn id(&self) -> KernelId {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&self.source, &mut h);
        KernelId::new::<Self>()
            .address_type(self.settings.address_type)
            .cube_dim(self.settings.cube_dim)
            .mode(self.settings.execution_mode)
            .info((self.entry.clone(), std::hash::Hasher::finish(&h)))
    }

    fn address_type(&self) -> ElemType {
        self.settings.address_type.unsigned_type()
    }
}

impl CubeKernel for Precompiled {
    fn define(&self) -> KernelDefinition {
        KernelDefinition {
            body: Scope::root(self.settings.clone()),
            settings: self.settings.clone(),
            info: Default::default(),
        }
    }

    fn source(&self) -> Option<PrecompiledSource> {
        Some(PrecompiledSource { source: self.source.clone(), entrypoint_name: self.entry.clone(), lang: "wgsl" })
    }
}

/// What a run did: bytes of device memory held at most at once (inputs,
/// constants and live temporaries), and launches.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunStats {
    pub peak_bytes: u64,
    pub launches: usize,
}

/// A plan's weights on the device: its weights and constants uploaded and
/// its preparation launches run, for any number of [`Gpu::run_prepared`]
/// calls (each works on a copy of these handles and counts).
#[derive(Clone)]
pub struct Prepared {
    handles: Vec<Option<Handle>>,
    stats: RunStats,
    live: u64,
}

/// What to install where wgpu finds no adapter.
const NO_GPU: &str =
    "on Linux without a GPU, install Mesa's lavapipe: `apt-get install mesa-vulkan-drivers libvulkan1`";

impl Gpu {
    /// The wgpu device: a GPU through Vulkan/Metal/DX12, or Mesa's lavapipe CPU driver.
    pub fn wgpu() -> Result<Gpu, GpuError> {
        let device = [WgpuDeviceKind::DefaultDevice, WgpuDeviceKind::Cpu]
            .into_iter()
            .find_map(|kind| cubecl::Device::wgpu(kind).ok())
            .ok_or_else(|| {
                GpuError::Unavailable("wgpu", format!("no Vulkan, Metal or DX12 adapter was found ({NO_GPU})"))
            })?;
        Gpu::on_wgpu(device)
    }

    /// The wgpu executor on a device of its own: the high-performance
    /// adapter on Vulkan, Metal or DX12 (where [`Gpu::wgpu`] looks too; the
    /// GPU tests hold the two to one adapter), opened with the features and
    /// limits cubecl asks for. Every
    /// executor on one device shares the thread that compiles and launches
    /// its kernels, so plans run from several threads at once take turns
    /// there; on devices of their own they run side by side (each device
    /// keeps its own kernel cache and memory pool). A caller that runs
    /// plans from several threads at once opens one per thread.
    pub fn wgpu_own_device() -> Result<Gpu, GpuError> {
        use cubecl::wgpu::{wgpu, RuntimeOptions, WgpuSetup};
        let none = |why: String| GpuError::Unavailable("wgpu", why);
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::PRIMARY,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapter = cubecl::future::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .map_err(|e| none(format!("{e} ({NO_GPU})")))?;
        // As cubecl opens a device for its WGSL compiler (cubecl-wgpu's `backend/wgsl.rs`).
        let (device, queue) = cubecl::future::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: None,
            required_features: adapter.features().difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
            required_limits: adapter.limits(),
            memory_hints: wgpu::MemoryHints::MemoryUsage,
            trace: wgpu::Trace::Off,
            // SAFETY: as cubecl does; attnc's kernels use no passthrough shader.
            experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        }))
        .map_err(|e| none(e.to_string()))?;
        let backend = adapter.get_info().backend;
        let setup = WgpuSetup { instance, adapter, device, queue, backend };
        let device =
            cubecl::wgpu::try_init_device(setup, RuntimeOptions::default()).map_err(|e| none(e.to_string()))?;
        let device = cubecl::Device::wgpu(device.kind).map_err(|e| none(e.to_string()))?;
        Gpu::on_wgpu(device)
    }

    /// The executor on wgpu device `device`, its client created here.
    fn on_wgpu(device: cubecl::Device) -> Result<Gpu, GpuError> {
        let client = std::panic::catch_unwind(|| device.client())
            .map_err(|_| GpuError::Unavailable("wgpu", "creating the device client failed".into()))?;
        Ok(Gpu::with_client(client, "wgpu", false))
    }

    /// The executor on a client of any cubecl runtime (what a Rust
    /// framework such as Burn brings); `backend` names it in messages.
    /// Kernels are tiled within the register file where `register_tiles`
    /// (GPUs), as on the CPU drivers otherwise.
    pub fn with_client(client: Client, backend: &'static str, register_tiles: bool) -> Gpu {
        let adapter = client.properties().identity.name.clone();
        Gpu {
            client,
            backend,
            adapter,
            precompiled: None,
            plane: None,
            staged: None,
            software_fragments: false,
            register_tiles,
        }
    }

    /// Launch the given WGSL sources (by entry point) instead of defining kernels in process.
    pub fn with_precompiled(mut self, sources: BTreeMap<String, String>) -> Gpu {
        self.precompiled = Some(sources);
        self
    }

    /// Kernels share rows over planes of `width` units (1: no plane operations)
    /// rather than the device's smallest plane; `width` must not exceed it.
    pub fn with_plane_width(mut self, width: u32) -> Gpu {
        self.plane = Some(width.max(1));
        self
    }

    /// GEMMs staged in shared memory (`true`) or reading device memory
    /// directly, rather than the device's choice (`device::stages_gemm`);
    /// head-mixing attention's forward follows: staged (or without plane
    /// operations), its GPU kernel (`attention_mixed`), else its CPU one
    /// (`attention_mixed_tiled`).
    pub fn with_gemm_staging(mut self, staged: bool) -> Gpu {
        self.staged = Some(staged);
        self
    }

    /// GEMMs and attention on matrix fragments computed in plain code
    /// (`mma.rs`), wherever the plan's tiling allows them: the fragment
    /// kernels' logic, checked on devices without matrix units.
    pub fn with_software_fragments(mut self) -> Gpu {
        self.software_fragments = true;
        self
    }

    /// Kernels tiled within a GPU's register file, as CUDA runs them
    /// (`attention_split.rs`): their logic, checked on any device.
    pub fn with_register_tiles(mut self) -> Gpu {
        self.register_tiles = true;
        self
    }

    /// `spec`, of a plan of `dtype`, as this device runs it: its kernel
    /// chosen for this device's planes (`plan::choose_path`).
    pub fn tiled(&self, spec: &KernelSpec, dtype: Dtype) -> KernelSpec {
        let plane = self.register_tiles.then(|| super::device::plane_width(self.client.properties()) as usize);
        spec.on_planes(dtype, plane)
    }

    /// Whether this is one of Mesa's CPU drivers, which bound loop iterations.
    pub fn bounds_loops(&self) -> bool {
        super::device::mesa_cpu(&self.adapter)
    }

    /// Whether kernels can store `dtype` here (and for `tf32`, multiply on
    /// TF32 fragments, or emulate them in software), and if not why.
    /// The device's compute units (streaming multiprocessors), where it
    /// reports them (CUDA); split-KV decoding fills them (`Plan::split_kv`).
    pub fn compute_units(&self) -> Option<usize> {
        self.client.properties().hardware.num_streaming_multiprocessors.map(|n| n as usize)
    }

    pub fn supports(&self, dtype: Dtype) -> Result<(), GpuError> {
        let props = self.client.properties();
        let multiplies = dtype != Dtype::Tf32 || self.software_fragments || super::device::matrix_units(props, dtype);
        if props.supports_type(super::device::elem_type(dtype)) && multiplies {
            return Ok(());
        }
        let (why, hint) = match (self.backend, dtype) {
            ("wgpu", Dtype::Tf32) => ("WebGPU and wgpu have no TF32 matrix products", "`--dtype f32`"),
            (_, Dtype::Tf32) => ("it has no TF32 tensor cores (CUDA sm_80 and later)", "`--dtype f32`"),
            ("wgpu", Dtype::Bf16) => ("WebGPU and wgpu have no bf16 type", "`--dtype f16` or `--backend cuda`"),
            ("wgpu", _) => ("the adapter lacks the shader-f16 feature", "`--dtype f32`"),
            _ => ("the device lacks the type", "`--dtype f32`"),
        };
        Err(GpuError::Dtype { backend: self.backend, adapter: self.adapter.clone(), dtype, why, hint })
    }

    /// Refuse a plan this device cannot store or a driver would run wrongly
    /// (before anything runs).
    pub fn check(&self, plan: &Plan) -> Result<(), GpuError> {
        self.supports(plan.dtype)?;
        if let Some((l, what)) = plan.launches.iter().find_map(|l| l.spec.kernel_gap().map(|w| (l, w))) {
            return Err(GpuError::Unsupported { kernel: l.name.clone(), what });
        }
        if !self.bounds_loops() {
            return Ok(());
        }
        let half = plan.dtype.is_half();
        for l in &plan.launches {
            let spec = self.tiled(&l.spec, plan.dtype);
            // Fragments multiplied in software loop over each product (`mma::software_trips`).
            let software = self.software_fragments.then(|| super::mma::software_trips(&spec, plan.dtype, half));
            let trips = software.flatten().unwrap_or_else(|| spec.loop_trips(half));
            if trips > LOOP_TRIPS_CPU {
                return Err(GpuError::LoopLimit { kernel: l.name.clone(), trips, limit: LOOP_TRIPS_CPU });
            }
        }
        Ok(())
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn upload(&self, values: &[f64], dtype: Dtype) -> Handle {
        self.client.create_from_slice(&crate::dtype::encode(dtype, values))
    }

    /// Run `plan` on named inputs; outputs in the plan's order.
    pub fn run(&self, plan: &Plan, inputs: &BTreeMap<String, Tensor>) -> Result<(Vec<Tensor>, RunStats), GpuError> {
        let prepared = self.prepare(plan, inputs, None)?;
        self.run_prepared(plan, &prepared, inputs, None)
    }

    /// Wait until every launch so far has finished.
    pub fn sync(&self) -> Result<(), GpuError> {
        cubecl::future::block_on(self.client.sync()).map_err(|e| GpuError::Launch("sync".into(), format!("{e:?}")))
    }

    /// Upload the plan's weights and constants and run its weight
    /// preparation ([`Plan::prepared`]): what every call with these weights
    /// shares. With `times`, each launch's wall-clock seconds.
    pub fn prepare(
        &self,
        plan: &Plan,
        inputs: &BTreeMap<String, Tensor>,
        times: Option<&mut Vec<f64>>,
    ) -> Result<Prepared, GpuError> {
        self.check(plan)?;
        let mut state = Prepared { handles: vec![None; plan.buffers.len()], stats: RunStats::default(), live: 0 };
        let shared =
            |role: &BufferRole| matches!(role, BufferRole::Input { weight: true, .. } | BufferRole::Constant { .. });
        self.upload_buffers(plan, inputs, &mut state, shared)?;
        self.launch_all(plan, 0..plan.prepared(), &mut state, times)?;
        Ok(state)
    }

    /// One call: upload the activations, run the per-call launches on
    /// `prepared` weights, read the outputs back. With `times`, each
    /// launch's wall-clock seconds.
    pub fn run_prepared(
        &self,
        plan: &Plan,
        prepared: &Prepared,
        inputs: &BTreeMap<String, Tensor>,
        times: Option<&mut Vec<f64>>,
    ) -> Result<(Vec<Tensor>, RunStats), GpuError> {
        let mut state = prepared.clone();
        self.upload_buffers(plan, inputs, &mut state, |role| matches!(role, BufferRole::Input { weight: false, .. }))?;
        self.launch_all(plan, plan.prepared()..plan.launches.len(), &mut state, times)?;
        // Every output read back in one request: one wait for the device,
        // not one an output.
        let handles = plan.outputs.iter().map(|(_, id)| state.handles[*id].clone().expect("outputs stay alive"));
        HOST_READS.fetch_add(plan.outputs.len(), std::sync::atomic::Ordering::Relaxed);
        let read = self.client.read(handles.collect()).map_err(|e| {
            let names: Vec<&str> = plan.outputs.iter().map(|(n, _)| n.as_str()).collect();
            GpuError::Launch(names.join(", "), format!("{e:?}"))
        })?;
        let outputs = plan.outputs.iter().zip(read).map(|((_, id), bytes)| {
            Tensor::new(plan.buffers[*id].shape.clone(), crate::dtype::decode(plan.dtype, &bytes))
        });
        Ok((outputs.collect(), state.stats))
    }

    /// Runs `plan` on device-resident buffers, reading nothing back: what
    /// a framework that owns the tensors calls (`attnc-burn`, with a
    /// gradient program cut by `grad::split`). `handles[id]` holds each of
    /// the plan's input buffers (the caller's tensors: the plan's dtype,
    /// row-major as the plan reads them); constants are uploaded here,
    /// each launch's outputs are allocated on this client and temporaries
    /// are freed after their last reader, as [`Gpu::run`] does. On return
    /// `handles` holds the plan's outputs.
    pub fn run_resident(&self, plan: &Plan, handles: &mut Vec<Option<Handle>>) -> Result<(), GpuError> {
        self.check(plan)?;
        let missing = plan.buffers.iter().find_map(|b| match &b.role {
            BufferRole::Input { name, .. } if handles[b.id].is_none() => Some(name.clone()),
            _ => None,
        });
        if let Some(name) = missing {
            return Err(GpuError::MissingInput(name));
        }
        let mut state = Prepared { handles: std::mem::take(handles), stats: RunStats::default(), live: 0 };
        self.upload_buffers(plan, &BTreeMap::new(), &mut state, |role| matches!(role, BufferRole::Constant { .. }))?;
        let ran = self.launch_all(plan, 0..plan.launches.len(), &mut state, None);
        *handles = state.handles;
        ran
    }

    /// Upload the input (by name) and constant buffers `pick` selects.
    fn upload_buffers(
        &self,
        plan: &Plan,
        inputs: &BTreeMap<String, Tensor>,
        state: &mut Prepared,
        pick: impl Fn(&BufferRole) -> bool,
    ) -> Result<(), GpuError> {
        for b in plan.buffers.iter().filter(|b| pick(&b.role)) {
            let h = match &b.role {
                BufferRole::Input { name, .. } => {
                    let t = inputs.get(name).ok_or_else(|| GpuError::MissingInput(name.clone()))?;
                    match plan.elements_per_value(b.id) {
                        1 => self.upload(&t.data, plan.dtype),
                        _ => self.upload(&crate::dtype::integer_digits(&t.data), plan.dtype),
                    }
                }
                BufferRole::Constant { values } => self.upload(values, plan.dtype),
                BufferRole::Temp => continue,
            };
            state.live += plan.buffer_bytes(b.id);
            state.handles[b.id] = Some(h);
        }
        state.stats.peak_bytes = state.stats.peak_bytes.max(state.live);
        Ok(())
    }

    /// Run `range` of the plan's launches, allocating outputs and freeing
    /// dead temporaries; with `times`, synchronising around each.
    fn launch_all(
        &self,
        plan: &Plan,
        range: std::ops::Range<usize>,
        state: &mut Prepared,
        mut times: Option<&mut Vec<f64>>,
    ) -> Result<(), GpuError> {
        for launch in &plan.launches[range] {
            for &out in launch.outputs() {
                let out_bytes = plan.buffer_bytes(out);
                state.handles[out] = Some(self.client.empty(out_bytes as usize));
                state.live += out_bytes;
            }
            state.stats.peak_bytes = state.stats.peak_bytes.max(state.live);
            if let Some(times) = times.as_deref_mut() {
                self.sync()?;
                let start = std::time::Instant::now();
                self.launch(launch.name.as_str(), &launch.spec, &launch.bindings, plan, &state.handles);
                self.sync()?;
                times.push(start.elapsed().as_secs_f64());
            } else {
                self.launch(launch.name.as_str(), &launch.spec, &launch.bindings, plan, &state.handles);
            }
            state.stats.launches += 1;
            for id in &launch.frees {
                if state.handles[*id].take().is_some() {
                    state.live -= plan.buffer_bytes(*id);
                }
            }
        }
        Ok(())
    }

    fn launch(&self, name: &str, spec: &KernelSpec, bindings: &[usize], plan: &Plan, handles: &[Option<Handle>]) {
        let spec = &self.tiled(spec, plan.dtype);
        let mut kernel = IrKernel::new(
            name,
            spec,
            plan.dtype,
            self.client.properties_shared(),
            self.client.target_properties_shared(),
        );
        if let Some(w) = self.plane {
            kernel = kernel.with_plane(w);
        }
        if let Some(staged) = self.staged {
            kernel = kernel.with_staging(staged);
        }
        kernel = kernel.with_software_fragments(self.software_fragments);
        match self.precompiled.as_ref().and_then(|p| p.get(name)) {
            Some(source) => {
                // Sources `attnc compile` wrote, whose kernels bind as their specs say.
                let binds = Binds::of_spec(&kernel);
                let kernel =
                    Precompiled { settings: kernel.settings.clone(), entry: name.to_string(), source: source.clone() };
                self.launch_kernel(kernel, binds, spec, bindings, plan, handles)
            }
            None => {
                let kernel = kernel.for_device();
                let (binds, spec) = (Binds::of(&kernel), &kernel.spec.clone());
                self.launch_kernel(kernel, binds, spec, bindings, plan, handles)
            }
        }
    }

    fn launch_kernel<K: CubeKernel>(
        &self,
        kernel: K,
        binds: Binds,
        spec: &KernelSpec,
        bindings: &[usize],
        plan: &Plan,
        handles: &[Option<Handle>],
    ) {
        let (_, (gx, gy, gz)) = spec.grid();
        let mut launcher = KernelLauncher::new(binds.settings);
        launcher.with_scope(|scope| {
            scope.device_properties(self.client.properties());
            scope.register_type::<Stored>(super::device::elem_type(plan.dtype));
        });
        for (slot, id) in bindings.iter().enumerate() {
            let written = slot + spec.outputs() >= bindings.len();
            let io = if written { BufferIOAttr::ReadWrite } else { BufferIOAttr::ReadOnly };
            launcher.declare_io(io);
            let handle = handles[*id].clone().expect("operands are alive");
            let len = plan.buffers[*id].len;
            if let Some(lines) = binds.lines.filter(|_| !binds.scalar[slot]) {
                match lines {
                    4 => register_vectors::<Const<4>>(handle, len, &mut launcher),
                    2 => register_vectors::<Const<2>>(handle, len, &mut launcher),
                    _ => register_vectors::<Const<1>>(handle, len, &mut launcher),
                }
            } else {
                let arg = unsafe { BufferArg::from_raw_parts(handle, len) };
                let _ = <[Stored] as LaunchArg>::register(arg, &mut launcher);
            }
        }
        if let KernelSpec::Attention { shape, .. } = spec {
            <f32 as LaunchArg>::register(shape.scale(), &mut launcher);
        }
        launcher.launch(CubeCount::Static(gx, gy, gz), kernel, &self.client);
    }
}

/// How a kernel binds its buffers: its settings, the line size of its
/// vector bindings (none: every binding scalar) and which are scalar.
struct Binds {
    settings: KernelSettings,
    lines: Option<usize>,
    scalar: Vec<bool>,
}

impl Binds {
    fn of(kernel: &IrKernel) -> Binds {
        let scalar = (0..=kernel.operand_count()).map(|slot| kernel.scalar_binding(slot)).collect();
        Binds { settings: kernel.settings.clone(), lines: kernel.vector_lines(), scalar }
    }

    /// As the spec alone says (the kernels `attnc compile` emits).
    fn of_spec(kernel: &IrKernel) -> Binds {
        let spec = &kernel.spec;
        let scalar = (0..=kernel.operand_count()).map(|slot| spec.scalar_binding(slot)).collect();
        let mut settings = kernel.settings.clone();
        settings.execution_mode = if spec.vectorised() { ExecutionMode::Unchecked } else { ExecutionMode::Checked };
        Binds { settings, lines: spec.vectorised().then(|| spec.line_size()), scalar }
    }
}

/// Bind `len` elements as `len / N` vectors.
fn register_vectors<N: Size>(handle: Handle, len: usize, launcher: &mut KernelLauncher) {
    let arg = unsafe { BufferArg::from_raw_parts(handle, len / N::value()) };
    let _ = <[Vector<Stored, N>] as LaunchArg>::register(arg, launcher);
}

#[cfg(test)]
mod tests {
    /// A shader that naga refused, as cubecl's chain reached the CLI
    /// (`f32(NaN)` before `tests/constants.rs`'s fix): one line, the
    /// compiler's message and place.
    #[test]
    fn a_failed_compile_is_one_cause_line() {
        let chain = "Several failures at once\nCaused by:\n  The bytes were never written (failure #4, still claiming 1 buffer(s))\n\
Caused by:\n  A launch error happened\nCaused by:\n  A compilation error happened during launch\nCaused by:\n  \
An error caused the compilation to fail\nCaused by:\n  WGSL compilation failed for kernel `attnc_t_00_attention`: Validation Error\n\n\
Caused by:\n  In Device::create_shader_module, label = 'attnc_t_00_attention'\n    \n\
Shader 'attnc_t_00_attention' parsing error: no definition in scope for identifier: `NaN`\n     ┌─ wgsl:1531:17\n     │\n\
1531 │ let v5290 = f32(NaN);\n     │                 ^^^ unknown identifier\n\n\n\nBacktrace:\nNo backtrace available\n\
Asked at:\nNo backtrace available";
        assert_eq!(
            super::launch_cause(chain),
            "WGSL compilation failed for kernel `attnc_t_00_attention`: Shader 'attnc_t_00_attention' parsing error: \
             no definition in scope for identifier: `NaN` (wgsl:1531:17) (`attnc -v` shows the whole chain)"
        );
        // Not a compile: the innermost cause.
        let run = "Several failures at once\nCaused by:\n  A launch error happened\nCaused by:\n  out of memory\n\nBacktrace:\nNo backtrace available";
        assert_eq!(super::launch_cause(run), "out of memory (`attnc -v` shows the whole chain)");
    }
}
