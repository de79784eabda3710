//! What a device offers and how the kernels adapt to it: matrix units and
//! fragment types, Mesa's CPU drivers, staged GEMMs, the plane width.

use super::mma;
use attnc_compiler::plan::{Dtype, GEMM_COLS, GEMM_ROWS, GEMM_STAGE_K, GEMM_UNITS};
use cubecl::ir::ElemType;
use cubecl::prelude::*;

/// How the GEMM and attention multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mma {
    /// The scalar kernels (`gemm.rs`, `attention.rs`).
    Off,
    /// Fragment kernels (`mma.rs`) with the fragments computed in plain code.
    Software,
    /// Fragment kernels on the device's matrix units (`cmma`).
    Hardware,
}

/// The fragment shape the kernels use, for `dtype` operands and f32
/// accumulators: 16×16×16, or 16×16×8 for TF32.
pub fn fragment_config(dtype: Dtype) -> cubecl::ir::features::MmaConfig {
    let f = mma::F as u32;
    let (operand, cd_type) = (fragment_type(dtype), elem_type(Dtype::F32));
    let k = mma::fragment_depth(dtype) as u32;
    cubecl::ir::features::MmaConfig { a_type: operand, b_type: operand, cd_type, m: f, n: f, k }
}

/// Whether the device multiplies fragments of `dtype` into f32 (CUDA tensor
/// cores for f16, bf16 and tf32); f32 kernels stay scalar.
pub fn matrix_units(props: &DeviceProperties, dtype: Dtype) -> bool {
    dtype != Dtype::F32 && props.features.matmul.cmma.contains(&fragment_config(dtype))
}

/// The cubecl element type of `dtype`'s buffers.
pub fn elem_type(dtype: Dtype) -> ElemType {
    use cubecl::ir::FloatKind;
    ElemType::Float(match dtype.storage() {
        Dtype::F32 | Dtype::Tf32 => FloatKind::F32,
        Dtype::F16 => FloatKind::F16,
        Dtype::Bf16 => FloatKind::BF16,
    })
}

/// The cubecl element type of `dtype`'s fragment operands (`tf32` for TF32).
pub fn fragment_type(dtype: Dtype) -> ElemType {
    match dtype {
        Dtype::Tf32 => ElemType::Float(cubecl::ir::FloatKind::TF32),
        d => elem_type(d),
    }
}

/// Whether an adapter is one of Mesa's CPU drivers (llvmpipe, lavapipe):
/// 8-wide planes that wgpu does not advertise, and a bound on loop iterations.
pub fn mesa_cpu(adapter: &str) -> bool {
    adapter.starts_with("llvmpipe")
}

/// Whether GEMMs stage their `a` and `b` tiles in shared memory, double
/// buffered: on GPUs (devices with plane operations that are not Mesa's CPU
/// drivers, where shared memory is no faster than the cache) with room for
/// the stages. Offline WGSL has no plane operations, so it keeps to WebGPU's
/// guaranteed 16 KiB of shared memory.
pub fn stages_gemm(props: &DeviceProperties) -> bool {
    let need = 2 * (GEMM_UNITS * GEMM_ROWS + GEMM_COLS) * GEMM_STAGE_K * 4;
    props.features.plane.contains(cubecl::ir::features::Plane::Ops)
        && !mesa_cpu(&props.identity.name)
        && props.hardware.max_shared_memory_size >= need
}

/// The plane width kernels may rely on: the device's smallest plane when it
/// has plane operations (Mesa's CPU drivers have them), else 1.
pub fn plane_width(props: &DeviceProperties) -> u32 {
    let ops = props.features.plane.contains(cubecl::ir::features::Plane::Ops) || mesa_cpu(&props.identity.name);
    let w = props.hardware.plane_size_min.min(32);
    if ops && w > 1 {
        1 << w.ilog2()
    } else {
        1
    }
}
