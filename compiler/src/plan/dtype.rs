//! The storage type of a plan's buffers. Kernels load elements of this type,
//! compute in f32 (products accumulate in f32, softmax statistics are f32)
//! and store their results in it; the host converts to and from float64 at
//! upload and read-back. `tf32` is f32 storage whose GEMMs multiply on
//! TF32 tensor cores (operands with f16's 10-bit mantissa, f32's range).

use super::{frag_grad_tiles, frag_key_tile, value_elements, AttnShape, BufferRole, KernelSpec, Plan};
use crate::ir::AttnArg;
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[default]
    F32,
    F16,
    Bf16,
    /// f32 tensors; GEMM operands multiplied as TF32 on tensor cores.
    Tf32,
}

impl Dtype {
    pub const ALL: [Dtype; 4] = [Dtype::F32, Dtype::F16, Dtype::Bf16, Dtype::Tf32];

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::Tf32 => "tf32",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 | Dtype::Tf32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }

    /// Whether this is a 16-bit type.
    pub fn is_half(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::Bf16)
    }

    /// The type the buffers hold (`tf32` is stored as f32).
    pub fn storage(self) -> Dtype {
        match self {
            Dtype::Tf32 => Dtype::F32,
            d => d,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Dtype, String> {
        Dtype::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown dtype `{s}`; expected one of f32, f16, bf16, tf32"))
    }
}

impl Plan {
    /// The same launches over buffers of `dtype`: each launch moves
    /// `dtype.size()` bytes an element instead of 4.
    /// Half precision tiles attention for matrix fragments where the heads
    /// fit ([`frag_key_tile`], [`frag_grad_tiles`]), and TF32 its backward
    /// (f32 storage fits narrower heads).
    pub fn in_dtype(mut self, dtype: Dtype) -> Plan {
        let ratio = dtype.size() as f64 / self.dtype.size() as f64;
        let bytes = dtype.storage().size();
        for l in &mut self.launches {
            l.bytes *= ratio;
            let lanes = l.spec.line_size();
            match l.spec {
                KernelSpec::Attention { shape: AttnShape { d, e, .. }, ref mut fragments, kv, .. } => {
                    // Split keys run on the scalar kernels; score and mask functions
                    // (lengths among them) and paged caches on fragments too.
                    let scalar = kv.is_some();
                    *fragments = dtype.is_half() && frag_key_tile(d, e, lanes).is_some() && !scalar;
                }
                // dQ, dK and dV (a read tensor's gradient stays scalar).
                KernelSpec::AttentionGrad { shape: AttnShape { d, e, .. }, wrt, fragments: was, .. } => {
                    let rows = matches!(wrt, AttnArg::Q | AttnArg::K | AttnArg::V);
                    let multiplies = dtype.is_half() || dtype == Dtype::Tf32;
                    let on = multiplies && rows && frag_grad_tiles(d, e, bytes).is_some();
                    // The fragment dK/dV kernel walks every query tile of the mask's
                    // band: a mask function's tiles are not skipped there, so not priced so.
                    if on && !was && matches!(wrt, AttnArg::K | AttnArg::V) {
                        l.flops /= super::visited::visited_fraction(&l.spec);
                    }
                    let KernelSpec::AttentionGrad { fragments, tf32, .. } = &mut l.spec else { unreachable!() };
                    *fragments = on;
                    *tf32 = on && dtype == Dtype::Tf32;
                }
                _ => {}
            }
        }
        self.dtype = dtype;
        self
    }

    /// Bytes of buffer `id` on the device.
    pub fn buffer_bytes(&self, id: usize) -> u64 {
        (self.buffers[id].len * self.elements_per_value(id) * self.dtype.size()) as u64
    }

    /// Stored elements a value of buffer `id` takes (digits of integers in half precision).
    pub fn elements_per_value(&self, id: usize) -> usize {
        value_elements(matches!(self.buffers[id].role, BufferRole::Input { integers: true, .. }), self.dtype)
    }
}
