//! A small deterministic generator (xorshift64*), so every run of a bench sees the same
//! stream.

/// xorshift64* from a seed.
pub struct Rng(pub u64);

impl Rng {
    /// The next value of the stream.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}
