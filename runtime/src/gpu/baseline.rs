//! The baselines `attnc bench` compares with on the same device: plain
//! attention against cubek-attention 0.3.1 (CubeCL's own FlashAttention,
//! `Unit` strategy), each GEMM against cubek-matmul 0.3.1 (`Strategy::Auto`).

use super::exec::{Gpu, GpuError};
use crate::rng::Rng;
use cubecl::prelude::*;
use cubecl::std::tensor::TensorHandle;
use cubecl::zspace::Shape;
use cubek_attention::forward::definition::{AccumulatorPrecision, AttentionGlobalTypes, AttentionOptions};
use cubek_attention::forward::launch::{launch_ref, BlueprintStrategy, Strategy};
use cubek_matmul::definition::MatmulElems;
use cubek_std::InputBinding;

/// Seconds per call of `f`, after `warmup` calls (the first compiles), synchronising around each call.
fn time_calls(
    gpu: &Gpu,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<(), GpuError>,
) -> Result<Vec<f64>, GpuError> {
    let mut times = vec![];
    for i in 0..warmup + iters {
        gpu.sync()?;
        let start = std::time::Instant::now();
        f()?;
        gpu.sync()?;
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    Ok(times)
}

/// A random row-major f32 tensor of `shape` on the device.
fn random_tensor<const D: usize>(gpu: &Gpu, shape: [usize; D], rng: &mut Rng) -> TensorHandle {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| (2.0 * rng.unit() - 1.0) as f32).collect();
    let handle = gpu.client().create_from_slice(f32::as_bytes(&data));
    TensorHandle::new_contiguous(Shape::new(shape), handle, f32::elem_type_native())
}

/// Seconds per call of cubek-matmul on random `[m, k] · [k, n]`.
pub fn time_cubek_matmul(gpu: &Gpu, [m, k, n]: [usize; 3], warmup: usize, iters: usize) -> Result<Vec<f64>, GpuError> {
    let f32_ty = f32::elem_type_native();
    let mut rng = Rng::for_input(0, "cubek-matmul");
    let (a, b) = (random_tensor(gpu, [m, k], &mut rng), random_tensor(gpu, [k, n], &mut rng));
    let out = TensorHandle::new_contiguous(Shape::new([m, n]), gpu.client().empty(4 * m * n), f32_ty);
    time_calls(gpu, warmup, iters, || {
        cubek_matmul::launch::launch_ref(
            &cubek_matmul::strategy::Strategy::Auto,
            gpu.client(),
            InputBinding::Normal(a.clone().binding(), f32_ty),
            InputBinding::Normal(b.clone().binding(), f32_ty),
            out.clone().binding(),
            &mut MatmulElems::from_single_dtype(f32_ty),
        )
        .map_err(|e| GpuError::Launch("cubek-matmul".into(), format!("{e:?}")))
    })
}

/// Seconds per call of cubek's attention on random `[b, h, s, d]` tensors,
/// after `warmup` calls (the first compiles), synchronising around each call.
pub fn time_cubek_attention(
    gpu: &Gpu,
    shape: [usize; 4],
    causal: bool,
    warmup: usize,
    iters: usize,
) -> Result<Vec<f64>, GpuError> {
    let client = gpu.client();
    let f32_ty = f32::elem_type_native();
    let mut rng = Rng::for_input(0, "cubek");
    let (q, k, v) =
        (random_tensor(gpu, shape, &mut rng), random_tensor(gpu, shape, &mut rng), random_tensor(gpu, shape, &mut rng));
    let n: usize = shape.iter().product();
    let out = TensorHandle::new_contiguous(Shape::new(shape), client.empty(4 * n), f32_ty);
    let dtypes = AttentionGlobalTypes::from_single_float_dtype(f32_ty, AttentionGlobalTypes::mask_dtype(client));
    time_calls(gpu, warmup, iters, || {
        launch_ref(
            Strategy::Unit(BlueprintStrategy::Inferred(())),
            client,
            q.clone().binding(),
            k.clone().binding(),
            v.clone().binding(),
            None,
            out.clone().binding(),
            &dtypes,
            AttentionOptions { causal, accumulator_precision: AccumulatorPrecision::default() },
        )
        .map_err(|e| GpuError::Launch("cubek-attention".into(), format!("{e}")))
    })
}
