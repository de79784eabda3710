//! Host conversions between float64 tensors and the bytes of a plan's
//! storage type ([`Dtype`]): the only place values are rounded to it.
//! Uploads round to nearest, ties to even (from float64 directly, so a
//! value is rounded once); read-back widens exactly.

use attnc_compiler::plan::Dtype;
use half::{bf16, f16};

/// `x` rounded to `dtype` and widened back.
pub fn round(dtype: Dtype, x: f64) -> f64 {
    match dtype {
        Dtype::F32 => x as f32 as f64,
        Dtype::F16 => f16::from_f64(x).to_f64(),
        Dtype::Bf16 => bf16::from_f64(x).to_f64(),
    }
}

/// `values` in `dtype`, little-endian, as a device buffer holds them.
pub fn encode(dtype: Dtype, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    for &x in values {
        match dtype {
            Dtype::F32 => out.extend((x as f32).to_le_bytes()),
            Dtype::F16 => out.extend(f16::from_f64(x).to_le_bytes()),
            Dtype::Bf16 => out.extend(bf16::from_f64(x).to_le_bytes()),
        }
    }
    out
}

/// The values of a device buffer of `dtype`.
pub fn decode(dtype: Dtype, bytes: &[u8]) -> Vec<f64> {
    match dtype {
        Dtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64).collect(),
        Dtype::F16 => bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        Dtype::Bf16 => bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_through_the_rounding() {
        let xs = [0.0, -1.5, 1.0 / 3.0, 65504.0, 1e-8, 3.0e38, -0.1];
        for dtype in Dtype::ALL {
            let back = decode(dtype, &encode(dtype, &xs));
            assert_eq!(back.len(), xs.len());
            for (b, x) in back.iter().zip(xs) {
                assert_eq!(*b, round(dtype, x), "{dtype} {x}");
            }
        }
        // Independent spot checks: f16 has 10 fraction bits, bf16 7.
        assert_eq!(round(Dtype::F16, 1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(round(Dtype::F16, 1.0 + 3.0 / 2048.0), 1.0 + 2.0 / 1024.0);
        assert_eq!(round(Dtype::Bf16, 1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round(Dtype::Bf16, 1.0 + 3.0 / 256.0), 1.0 + 2.0 / 128.0);
        assert!(round(Dtype::F16, 1e5).is_infinite());
    }
}
