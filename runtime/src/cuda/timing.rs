//! `attnc bench --backend cuda`: each launch timed by CUDA events around it
//! on one stream, and whole calls (upload the activations, the per-call
//! launches, read the outputs back) and the weights' preparation by the
//! host's clock; medians after warm-up.

use super::{abi, driver, Cuda, CudaError, Stream};
use crate::gpu::bench::{BenchReport, KernelTiming};
use crate::gpu::emit::Manifest;
use crate::Tensor;
use attnc_compiler::opt::cost::OpCost;
use attnc_compiler::plan::Plan;
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use std::collections::BTreeMap;

/// An event destroyed on drop.
struct Event(sys::CUevent);

impl Event {
    fn new() -> Result<Event, CudaError> {
        cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map(Event).map_err(|e| driver("cuEventCreate", e))
    }

    fn record(&self, stream: &Stream) -> Result<(), CudaError> {
        // SAFETY: an event and a stream of the current context.
        unsafe { cu::event::record(self.0, stream.0) }.map_err(|e| driver("cuEventRecord", e))
    }

    /// Seconds from `self` to `end`, both recorded and complete.
    fn until(&self, end: &Event) -> Result<f64, CudaError> {
        // SAFETY: two recorded events; `end` waited for.
        unsafe {
            cu::event::synchronize(end.0).map_err(|e| driver("cuEventSynchronize", e))?;
            cu::event::elapsed(self.0, end.0).map(|ms| f64::from(ms) / 1e3).map_err(|e| driver("cuEventElapsedTime", e))
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `Event::new`, destroyed once.
        let _ = unsafe { cu::event::destroy(self.0) };
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

/// Time `plan` (emitted as `files` and `manifest`) on `inputs`.
pub fn bench(
    cuda: &Cuda,
    plan: &Plan,
    files: &[(String, String)],
    manifest: Manifest,
    inputs: &BTreeMap<String, Tensor>,
    warmup: usize,
    iters: usize,
) -> Result<BenchReport, CudaError> {
    let iters = iters.max(1);
    let kernels = cuda.load(files, manifest)?;
    let (held, tensors) = kernels.allocate()?;
    let stream = Stream::new()?;
    let s = stream.0 as u64;
    let n = kernels.manifest.launches.len();
    let first = abi::prepared(&kernels.manifest);
    // One call, as `attnc bench` times it on every backend: upload the
    // activations, queue the per-call launches, wait, read the outputs back.
    let call = || -> Result<(), CudaError> {
        kernels.upload(&held, inputs, |weight| !weight)?;
        // SAFETY (every launch here): the tensors and the workspace were allocated at the plan's sizes.
        unsafe { kernels.launch_range(first..n, &tensors, None, s) }?;
        stream.sync("the launches")?;
        kernels.read_outputs(&held).map(|_| ())
    };
    let clock = std::time::Instant::now();
    kernels.upload(&held, inputs, |weight| weight)?;
    unsafe { kernels.launch_range(0..first, &tensors, None, s) }?;
    stream.sync("the weights' preparation")?;
    let prepare = clock.elapsed().as_secs_f64();
    for _ in 0..warmup.max(1) {
        call()?;
    }
    let marks: Vec<Event> = (0..=n).map(|_| Event::new()).collect::<Result<_, _>>()?;
    let mut per: Vec<Vec<f64>> = vec![vec![]; n];
    for _ in 0..iters {
        for (i, mark) in marks[..n].iter().enumerate() {
            mark.record(&stream)?;
            unsafe { kernels.launch_range(i..i + 1, &tensors, None, s) }?;
        }
        marks[n].record(&stream)?;
        for (times, pair) in per.iter_mut().zip(marks.windows(2)) {
            times.push(pair[0].until(&pair[1])?);
        }
    }
    let mut totals = vec![];
    for _ in 0..iters {
        let clock = std::time::Instant::now();
        call()?;
        totals.push(clock.elapsed().as_secs_f64());
    }
    let kernels = plan
        .launches
        .iter()
        .zip(per)
        .map(|(l, times)| KernelTiming {
            name: l.name.clone(),
            kind: l.spec.kind(),
            median: median(times),
            work: OpCost { flops: l.flops, bytes: l.bytes, launches: 1 },
            once: l.prepare,
        })
        .collect();
    Ok(BenchReport {
        device: format!("{} (cuda, sm_{})", cuda.name(), cuda.arch()),
        kernels,
        total: median(totals),
        prepare,
        baseline: None,
        gemms: vec![],
        plain: None,
    })
}
