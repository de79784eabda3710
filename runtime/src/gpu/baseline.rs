//! The baselines `attnc bench` compares with on the same device, in the
//! plan's dtype: plain attention against cubek-attention 0.3.1 (CubeCL's own
//! FlashAttention: the `Unit` strategy in f32, the tensor-core
//! `BlackboxAccelerated` one in half precision), each GEMM against
//! cubek-matmul 0.3.1 (`Strategy::Auto`).

use super::device::elem_type;
use super::exec::{Gpu, GpuError};
use crate::rng::Rng;
use attnc_compiler::plan::Dtype;
use cubecl::std::tensor::TensorHandle;
use cubecl::zspace::Shape;
use cubek_attention::forward::definition::{AccumulatorPrecision, AttentionGlobalTypes, AttentionOptions};
use cubek_attention::forward::launch::{launch_ref, BlueprintStrategy, Strategy};
use cubek_attention::forward::routines::blackbox_accelerated::BlackboxAcceleratedStrategy;
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

/// A random row-major tensor of `shape` in `dtype` on the device.
fn random_tensor<const D: usize>(gpu: &Gpu, shape: [usize; D], dtype: Dtype, rng: &mut Rng) -> TensorHandle {
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n).map(|_| 2.0 * rng.unit() - 1.0).collect();
    let handle = gpu.client().create_from_slice(&crate::dtype::encode(dtype, &data));
    TensorHandle::new_contiguous(Shape::new(shape), handle, elem_type(dtype))
}

/// Seconds per call of cubek-matmul on random `[m, k] · [k, n]`.
pub fn time_cubek_matmul(
    gpu: &Gpu,
    [m, k, n]: [usize; 3],
    dtype: Dtype,
    warmup: usize,
    iters: usize,
) -> Result<Vec<f64>, GpuError> {
    let ty = elem_type(dtype);
    let mut rng = Rng::for_input(0, "cubek-matmul");
    let (a, b) = (random_tensor(gpu, [m, k], dtype, &mut rng), random_tensor(gpu, [k, n], dtype, &mut rng));
    let out = TensorHandle::new_contiguous(Shape::new([m, n]), gpu.client().empty(dtype.size() * m * n), ty);
    time_calls(gpu, warmup, iters, || {
        cubek_matmul::launch::launch_ref(
            &cubek_matmul::strategy::Strategy::Auto,
            gpu.client(),
            InputBinding::Normal(a.clone().binding(), ty),
            InputBinding::Normal(b.clone().binding(), ty),
            out.clone().binding(),
            &mut MatmulElems::from_single_dtype(ty),
        )
        .map_err(|e| GpuError::Launch("cubek-matmul".into(), format!("{e:?}")))
    })
}

/// Seconds per call of cubek's attention on random `[b, h, s, d]` tensors
/// in `dtype`, after `warmup` calls (the first compiles), synchronising
/// around each call, and the strategy timed: in half precision the
/// tensor-core `BlackboxAccelerated` one where the device runs it, else
/// `Unit` (as in f32).
pub fn time_cubek_attention(
    gpu: &Gpu,
    shape: [usize; 4],
    causal: bool,
    dtype: Dtype,
    warmup: usize,
    iters: usize,
) -> Result<(Vec<f64>, &'static str), GpuError> {
    let client = gpu.client();
    let ty = elem_type(dtype);
    let mut rng = Rng::for_input(0, "cubek");
    let mut draw = || random_tensor(gpu, shape, dtype, &mut rng);
    let (q, k, v) = (draw(), draw(), draw());
    let n: usize = shape.iter().product();
    let out = TensorHandle::new_contiguous(Shape::new(shape), client.empty(dtype.size() * n), ty);
    let dtypes = AttentionGlobalTypes::from_single_float_dtype(ty, AttentionGlobalTypes::mask_dtype(client));
    let strategy = |accelerated: bool| match accelerated {
        false => Strategy::Unit(BlueprintStrategy::Inferred(())),
        true => Strategy::BlackboxAccelerated(BlueprintStrategy::Inferred(BlackboxAcceleratedStrategy {
            num_planes: 1,
            seq_q: 1,
            seq_kv: 1,
        })),
    };
    let run = |accelerated: bool| {
        time_calls(gpu, warmup, iters, || {
            launch_ref(
                strategy(accelerated),
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
    };
    match dtype {
        Dtype::F32 | Dtype::Tf32 => run(false).map(|t| (t, "Unit")),
        _ => run(true).map(|t| (t, "BlackboxAccelerated")).or_else(|_| run(false).map(|t| (t, "Unit"))),
    }
}
