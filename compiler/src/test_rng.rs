//! A xorshift64 stream for the unit tests' reproducible random cases.

pub struct Rng(pub u64);

impl Rng {
    /// The next number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
