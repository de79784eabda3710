//! Deterministic input generation for `--seed`: SplitMix64 streams keyed by
//! the seed and the input's name, using integer and basic float arithmetic
//! only, so every machine draws bit-identical values.

use attnc_compiler::ir::{DimValues, Init};

pub struct Rng(u64);

impl Rng {
    /// A stream for one named input under one seed.
    pub fn for_input(seed: u64, name: &str) -> Rng {
        // FNV-1a of the name, mixed with the seed.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        Rng(seed ^ h.rotate_left(17))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// One draw at the run's `dims`, already rounded to f32 (inputs are stored as f32).
    pub fn draw(&mut self, init: &Init, dims: &DimValues) -> f64 {
        let v = match *init {
            Init::Uniform { lo, hi } => lo + (hi - lo) * self.unit(),
            // Irwin–Hall: the sum of 12 uniforms minus 6 has mean 0 and variance 1.
            Init::Normal { mean, std } => mean + std * ((0..12).map(|_| self.unit()).sum::<f64>() - 6.0),
            Init::Integers { lo, ref hi } => {
                let hi = hi.at(dims).max(lo);
                (lo + (self.next_u64() % (hi - lo + 1) as u64) as i64) as f64
            }
            Init::Bernoulli { p } => f64::from(u8::from(self.unit() < p)),
        };
        v as f32 as f64
    }
}
