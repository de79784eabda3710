//! The baseline `attnc bench` compares plain attention with: cubek-attention
//! 0.3.1 (CubeCL's own FlashAttention, `Unit` strategy) on the same device.

use super::exec::{Gpu, GpuError};
use crate::rng::Rng;
use cubecl::prelude::*;
use cubecl::std::tensor::TensorHandle;
use cubecl::zspace::Shape;
use cubek_attention::forward::definition::{AccumulatorPrecision, AttentionGlobalTypes, AttentionOptions};
use cubek_attention::forward::launch::{launch_ref, BlueprintStrategy, Strategy};

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
    let n: usize = shape.iter().product();
    let mut rng = Rng::for_input(0, "cubek");
    let mut make = || {
        let data: Vec<f32> = (0..n).map(|_| (2.0 * rng.unit() - 1.0) as f32).collect();
        TensorHandle::new_contiguous(Shape::new(shape), client.create_from_slice(f32::as_bytes(&data)), f32_ty)
    };
    let (q, k, v) = (make(), make(), make());
    let out = TensorHandle::new_contiguous(Shape::new(shape), client.empty(4 * n), f32_ty);
    let dtypes = AttentionGlobalTypes::from_single_float_dtype(f32_ty, AttentionGlobalTypes::mask_dtype(client));
    let mut times = vec![];
    for i in 0..warmup + iters {
        gpu.sync()?;
        let start = std::time::Instant::now();
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
        .map_err(|e| GpuError::Launch("cubek-attention".into(), format!("{e}")))?;
        gpu.sync()?;
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    Ok(times)
}
