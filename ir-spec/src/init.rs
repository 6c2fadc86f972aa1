//! Deterministic initializers for params and states.
//!
//! A param or state declared with an [`Init`] starts from [`initial_value`]. The random
//! initializers are specified exactly, so that the interpreter, the artifact writer and any
//! other implementation produce the same numbers:
//!
//! - **Stream.** SplitMix64 with its state set to `seed`: each draw adds
//!   `0x9E3779B97F4A7C15` to the state (wrapping) and returns
//!   `z = state; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
//!   z ^ (z >> 31)` (wrapping multiplications).
//! - **Uniform in [0, 1).** `u = (draw >> 11) · 2⁻⁵³`: the top 53 bits of a draw.
//! - **`uniform(lo, hi)`.** Element `i` (C order) is `lo + (hi − lo) · uᵢ`, one draw per element.
//! - **`normal(mean, std)`.** Box–Muller on consecutive pairs of draws: `u1 = 1 − u` from the
//!   first draw (so `u1 ∈ (0, 1]`), `u2 = u` from the second; `r = √(−2 ln u1)`, `θ = 2π·u2`;
//!   the pair yields `r·cos θ` then `r·sin θ`, consumed in that order by consecutive elements
//!   (C order); with an odd element count the last `r·sin θ` is discarded. Each sample `z`
//!   becomes `mean + std · z`.
//! - **`zeros`, `ones`, `full(v)`.** Every element 0, 1 or `v`.
//!
//! Values are computed in f64; a consumer storing f32 rounds each to nearest. For an i32 tensor
//! each value is converted as `cast` does (truncation toward zero).

use crate::graph::Init;
use crate::interp::Tensor;
use crate::types::{DType, TensorType};

/// SplitMix64: the random stream of the initializers.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits of a draw.
    pub fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The first value of a param or state of type `ty` declared with `init`.
pub fn initial_value(ty: &TensorType, init: &Init) -> Tensor {
    let n = ty.numel();
    let data: Vec<f64> = match *init {
        Init::Zeros => vec![0.0; n],
        Init::Ones => vec![1.0; n],
        Init::Full(v) => vec![v; n],
        Init::Uniform { lo, hi, seed } => {
            let mut rng = SplitMix64::new(seed);
            (0..n).map(|_| lo + (hi - lo) * rng.next_unit()).collect()
        }
        Init::Normal { mean, std, seed } => {
            let mut rng = SplitMix64::new(seed);
            let mut data = Vec::with_capacity(n + 1);
            while data.len() < n {
                let u1 = 1.0 - rng.next_unit();
                let u2 = rng.next_unit();
                let r = (-2.0 * u1.ln()).sqrt();
                let theta = 2.0 * std::f64::consts::PI * u2;
                data.push(mean + std * r * theta.cos());
                data.push(mean + std * r * theta.sin());
            }
            data.truncate(n);
            data
        }
    };
    let data = match ty.dtype {
        DType::F32 => data,
        DType::I32 => data.into_iter().map(|v| (v as i32) as f64).collect(),
    };
    Tensor::new(ty.clone(), data)
}
