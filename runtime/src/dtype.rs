//! Host conversions between float64 tensors and the bytes of a plan's
//! storage type ([`Dtype`]): the only place values are rounded to it.
//! Uploads round to nearest, ties to even (from float64 directly, so a
//! value is rounded once); read-back widens exactly.

use attnc_compiler::plan::Dtype;
use half::{bf16, f16};

/// `x` rounded to `dtype`'s storage type and widened back.
pub fn round(dtype: Dtype, x: f64) -> f64 {
    match dtype.storage() {
        Dtype::F32 | Dtype::Tf32 => x as f32 as f64,
        Dtype::F16 => f16::from_f64(x).to_f64(),
        Dtype::Bf16 => bf16::from_f64(x).to_f64(),
    }
}

/// Integers as `plan::INTEGER_DIGITS` base-256 digits each, most
/// significant first (`v = (d0 · 256 + d1) · 256 + d2`, `d1` and `d2` in
/// `0..256`): how a half-precision plan stores the integers attention's
/// functions read, every digit exact in f16 and bf16 for `|v| < 2^24`.
pub fn integer_digits(values: &[f64]) -> Vec<f64> {
    let digits = attnc_compiler::plan::INTEGER_DIGITS;
    let mut out = Vec::with_capacity(values.len() * digits);
    for v in values {
        let mut rest = *v;
        let mut low = [0.0; 8];
        for d in low.iter_mut().take(digits - 1) {
            *d = rest.rem_euclid(256.0);
            rest = (rest - *d) / 256.0;
        }
        out.push(rest);
        out.extend(low[..digits - 1].iter().rev());
    }
    out
}

/// `values` in `dtype`, little-endian, as a device buffer holds them.
pub fn encode(dtype: Dtype, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    for &x in values {
        match dtype.storage() {
            Dtype::F32 | Dtype::Tf32 => out.extend((x as f32).to_le_bytes()),
            Dtype::F16 => out.extend(f16::from_f64(x).to_le_bytes()),
            Dtype::Bf16 => out.extend(bf16::from_f64(x).to_le_bytes()),
        }
    }
    out
}

/// The values of a device buffer of `dtype`.
pub fn decode(dtype: Dtype, bytes: &[u8]) -> Vec<f64> {
    match dtype.storage() {
        Dtype::F32 | Dtype::Tf32 => {
            bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64).collect()
        }
        Dtype::F16 => bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        Dtype::Bf16 => bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
    }
}

/// `x` as a GEMM operand of `dtype` multiplies it: rounded to TF32 (an f32
/// with its mantissa cut to 10 bits, to nearest, ties to even) for `tf32`,
/// else as stored.
pub fn round_operand(dtype: Dtype, x: f64) -> f64 {
    if dtype != Dtype::Tf32 {
        return round(dtype, x);
    }
    let bits = (x as f32).to_bits();
    if !(x as f32).is_finite() {
        return x as f32 as f64;
    }
    // Round away the low 13 bits, to nearest with ties to even.
    let half = 0x0fff + ((bits >> 13) & 1);
    f32::from_bits(bits.wrapping_add(half) & !0x1fff) as f64
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
        // TF32 keeps f32's range and f16's 10-bit mantissa.
        assert_eq!(round_operand(Dtype::Tf32, 1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(round_operand(Dtype::Tf32, 1.0 + 3.0 / 2048.0), 1.0 + 2.0 / 1024.0);
        assert_eq!(round_operand(Dtype::Tf32, 1e30), round_operand(Dtype::Tf32, 1e30 * (1.0 + 1e-5)));
        assert!(round_operand(Dtype::Tf32, 1e30).is_finite());
        assert_eq!(round(Dtype::Tf32, 1.0 + 1.0 / 4096.0), 1.0 + 1.0 / 4096.0);
    }
}
