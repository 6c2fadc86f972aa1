//! Deterministic initializers for params and states (defined in `sinter_artifact::init`, which
//! the runtime shares; re-exported here with the interpreter's [`initial_value`]).
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
//! Values are computed in f64; a consumer storing f32 rounds each to nearest, and an f16 tensor's
//! values are rounded to f16 here. For an i32 tensor each value is converted as `cast` does
//! (truncation toward zero).

pub use sinter_artifact::init::*;

use crate::interp::Tensor;
use crate::types::{DType, TensorType};

/// The first value of a param or state of type `ty` declared with `init`.
pub fn initial_value(ty: &TensorType, init: &Init) -> Tensor {
    let data = values(init, ty.numel())
        .map(|v| match ty.dtype {
            DType::F32 => v,
            DType::I32 => (v as i32) as f64,
            // an f16 tensor holds f16 numbers (its arithmetic is not f16: IR.md)
            DType::F16 => DType::F16.round(v),
        })
        .collect();
    Tensor::new(ty.clone(), data)
}
