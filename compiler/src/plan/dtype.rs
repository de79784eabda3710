//! The storage type of a plan's buffers. Kernels load elements of this type,
//! compute in f32 (products accumulate in f32, softmax statistics are f32)
//! and store their results in it; the host converts to and from float64 at
//! upload and read-back. `tf32` is f32 storage whose GEMMs multiply on
//! TF32 tensor cores (operands with f16's 10-bit mantissa, f32's range).

use super::{value_elements, BufferRole, Plan};
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
    /// Each attention launch's kernel is chosen again for it (`path::choose`:
    /// half precision, and TF32's backward, on matrix fragments where the
    /// heads fit).
    pub fn in_dtype(mut self, dtype: Dtype) -> Plan {
        let ratio = dtype.size() as f64 / self.dtype.size() as f64;
        for l in &mut self.launches {
            l.bytes *= ratio;
        }
        self.dtype = dtype;
        self.choose_paths();
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
