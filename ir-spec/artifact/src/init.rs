//! Deterministic initializers for params and states.
//!
//! A param or state declared with an [`Init`] starts from these values ([`values`]; stored
//! by the runtime as [`initial_bytes`]). The random
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
//! - **`warmup_constant`, `warmup_linear`, `warmup_cosine`.** Element `i` is a learning-rate
//!   schedule's rate at step `i` ([`Schedule::lr_at`]).
//! - **`bias_corrections(beta1, beta2)`.** Element `2t + c` is `1 − β_c^t` (`powf` in f64).
//!
//! Values are computed in f64; a consumer storing f32 rounds each to nearest. For an i32 tensor
//! each value is converted as `cast` does (truncation toward zero).

use crate::format_float;
use crate::types::{DType, TensorType};

/// How a param or state gets its first value.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Init {
    Zeros,
    Ones,
    Full(f64),
    Normal {
        mean: f64,
        std: f64,
        seed: u64,
    },
    Uniform {
        lo: f64,
        hi: f64,
        seed: u64,
    },
    /// Element `i`: the learning rate at the 0-based step `i` of a schedule (a table that
    /// `train` reads by its step counter).
    Schedule(Schedule),
    /// A `[N, 2]` table, row `t`: `1 − beta1^t`, `1 − beta2^t` (Adam's bias corrections at
    /// the 1-based step `t`).
    BiasCorrections {
        beta1: f64,
        beta2: f64,
    },
    /// No value of its own: it must be given by a weights file (a model `sinter import` wrote
    /// keeps its weights beside it). Runs refuse to start while such a value is not loaded;
    /// until then its memory holds zeros.
    External,
}

impl Init {
    /// Whether the value must come from a weights file ([`Init::External`]).
    pub fn is_external(&self) -> bool {
        matches!(self, Init::External)
    }
}

/// How a learning rate changes with the step: PyTorch's and Hugging Face's schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ScheduleKind {
    /// `lr` after the warmup.
    Constant,
    /// From `lr` down to `min_lr` in a straight line over the steps after the warmup.
    Linear,
    /// From `lr` down to `min_lr` along half a cosine over the steps after the warmup.
    Cosine,
}

impl ScheduleKind {
    pub const ALL: [ScheduleKind; 3] = [
        ScheduleKind::Constant,
        ScheduleKind::Linear,
        ScheduleKind::Cosine,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::Constant => "constant",
            ScheduleKind::Linear => "linear",
            ScheduleKind::Cosine => "cosine",
        }
    }

    pub fn from_name(name: &str) -> Option<ScheduleKind> {
        ScheduleKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The name of its initializer in the text format.
    pub fn init_name(self) -> &'static str {
        match self {
            ScheduleKind::Constant => "warmup_constant",
            ScheduleKind::Linear => "warmup_linear",
            ScheduleKind::Cosine => "warmup_cosine",
        }
    }
}

/// A learning-rate schedule over 0-based steps `s`, as Hugging Face's
/// `get_{constant,linear,cosine}_schedule_with_warmup` (and `..._with_min_lr`) compute it:
/// `lr · s / warmup` while `s < warmup`; then `lr` (constant) or, with
/// `p = min(1, (s − warmup) / (total_steps − warmup))`, `min_lr + (lr − min_lr) · (1 − p)`
/// (linear) or `min_lr + (lr − min_lr) · ½ (1 + cos(π p))` (cosine). From `total_steps` on it
/// stays at `min_lr` (Hugging Face's cosine would rise again).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Schedule {
    pub kind: ScheduleKind,
    pub lr: f64,
    pub warmup: u64,
    /// Unused by the constant schedule.
    pub total_steps: u64,
    /// Unused by the constant schedule.
    pub min_lr: f64,
}

impl Schedule {
    /// The learning rate at the 0-based step `s`, in f64.
    pub fn lr_at(&self, s: u64) -> f64 {
        if s < self.warmup {
            return self.lr * s as f64 / self.warmup as f64;
        }
        let decay = self.total_steps.saturating_sub(self.warmup).max(1) as f64;
        let p = ((s - self.warmup) as f64 / decay).min(1.0);
        let span = self.lr - self.min_lr;
        match self.kind {
            ScheduleKind::Constant => self.lr,
            ScheduleKind::Linear => self.min_lr + span * (1.0 - p),
            ScheduleKind::Cosine => {
                self.min_lr + span * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
            }
        }
    }

    /// Steps after which the rate no longer changes: a table of `steps() + 1` entries read at
    /// `min(s, steps())` gives every step's rate.
    pub fn steps(&self) -> u64 {
        match self.kind {
            ScheduleKind::Constant => self.warmup,
            ScheduleKind::Linear | ScheduleKind::Cosine => self.total_steps.max(self.warmup),
        }
    }
}

/// Rows of a [`Init::BiasCorrections`] table that give every step's corrections when read at
/// `min(t, rows − 1)`: past the last, both round to 1 in f32 (`beta^t < 2⁻²⁵`). At most 2²⁴ + 1
/// (f32 counts steps exactly up to 2²⁴).
pub fn bias_correction_rows(beta1: f64, beta2: f64) -> u64 {
    let saturated = |beta: f64| {
        if beta <= 0.0 {
            return 1;
        }
        // beta^t < 2^-25 from t > -25 ln 2 / ln beta on
        let t = (-25.0 * std::f64::consts::LN_2 / beta.ln()).floor() as u64 + 1;
        t.min(1 << 24)
    };
    saturated(beta1).max(saturated(beta2)) + 1
}

impl Eq for Init {}

/// As the text format writes it: `zeros`, `full(0.5)`, `normal(std=0.02, seed=1)`, ...;
/// arguments equal to their default (compared bit for bit) are omitted.
impl std::fmt::Display for Init {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let arg = |name: &str, v: f64, default: f64| {
            (v.to_bits() != default.to_bits()).then(|| format!("{name}={}", format_float(v)))
        };
        let seed = |s: u64| (s != 0).then(|| format!("seed={s}"));
        let (name, args) = match *self {
            Init::Zeros => return f.write_str("zeros"),
            Init::Ones => return f.write_str("ones"),
            Init::External => return f.write_str("external"),
            Init::Full(v) => return write!(f, "full({})", format_float(v)),
            Init::Normal { mean, std, seed: s } => (
                "normal",
                [arg("std", std, 1.0), arg("mean", mean, 0.0), seed(s)],
            ),
            Init::Uniform { lo, hi, seed: s } => {
                ("uniform", [arg("lo", lo, 0.0), arg("hi", hi, 1.0), seed(s)])
            }
            Init::Schedule(s) => {
                let mut args = vec![format!("lr={}", format_float(s.lr))];
                args.push(format!("warmup={}", s.warmup));
                if s.kind != ScheduleKind::Constant {
                    args.push(format!("total_steps={}", s.total_steps));
                    args.extend(arg("min_lr", s.min_lr, 0.0));
                }
                return write!(f, "{}({})", s.kind.init_name(), args.join(", "));
            }
            Init::BiasCorrections { beta1, beta2 } => {
                return write!(
                    f,
                    "bias_corrections(beta1={}, beta2={})",
                    format_float(beta1),
                    format_float(beta2)
                );
            }
        };
        let args: Vec<String> = args.into_iter().flatten().collect();
        if args.is_empty() {
            f.write_str(name)
        } else {
            write!(f, "{name}({})", args.join(", "))
        }
    }
}

/// SplitMix64's increment γ.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64: the random stream of the initializers.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The stream of `seed` after `draws` draws (SplitMix64 is counter-based: the state after
    /// `k` draws is `seed + k · γ`).
    pub fn after(seed: u64, draws: usize) -> SplitMix64 {
        SplitMix64 {
            state: seed.wrapping_add((draws as u64).wrapping_mul(GAMMA)),
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
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

/// Whether `init`'s arguments are valid: a finite mean and a finite, non-negative std; finite
/// uniform bounds with `lo < hi`. The error names the offending argument and says why.
pub fn check(init: &Init) -> Result<(), (&'static str, String)> {
    match *init {
        Init::Normal { mean, .. } if !mean.is_finite() => {
            Err(("mean", format!("mean={mean} must be finite")))
        }
        Init::Normal { std, .. } if !(std >= 0.0 && std.is_finite()) => {
            Err(("std", format!("std={std} must be finite and not negative")))
        }
        Init::Uniform { lo, hi, .. } if !(lo.is_finite() && hi.is_finite()) => Err((
            "hi",
            format!("uniform bounds lo={lo}, hi={hi} must be finite"),
        )),
        Init::Uniform { lo, hi, .. } if hi <= lo => {
            Err(("hi", format!("uniform needs lo < hi, got lo={lo}, hi={hi}")))
        }
        Init::Schedule(s) if !(s.lr >= 0.0 && s.lr.is_finite()) => {
            Err(("lr", format!("lr={} must be finite and not negative", s.lr)))
        }
        Init::Schedule(s)
            if s.kind != ScheduleKind::Constant && !(s.min_lr >= 0.0 && s.min_lr <= s.lr) =>
        {
            Err((
                "min_lr",
                format!("min_lr={} must lie between 0 and lr={}", s.min_lr, s.lr),
            ))
        }
        Init::Schedule(s) if s.kind != ScheduleKind::Constant && s.total_steps <= s.warmup => {
            Err((
                "total_steps",
                format!(
                    "total_steps={} must pass warmup={}",
                    s.total_steps, s.warmup
                ),
            ))
        }
        Init::BiasCorrections { beta1, beta2 }
            if !((0.0..1.0).contains(&beta1) && (0.0..1.0).contains(&beta2)) =>
        {
            Err((
                "beta1",
                format!("betas {beta1} and {beta2} must lie in [0, 1)"),
            ))
        }
        _ => Ok(()),
    }
}

/// The first value of a param or state as the runtime stores it (the interpreter's
/// `initial_value` holds the f64 values): each value rounded to f32 or f16 (or truncated to i32),
/// little-endian, without holding the f64 values. Large tensors are generated in parallel
/// (natively): the stream is counter-based, so each chunk starts at its own draw.
pub fn initial_bytes(ty: &TensorType, init: &Init) -> Vec<u8> {
    let n = ty.numel();
    let size = ty.dtype.size_bytes();
    let mut out = vec![0u8; n * size];
    let write = |start: usize, part: &mut [u8]| {
        for (v, dst) in values_from(init, start).zip(part.chunks_exact_mut(size)) {
            match ty.dtype {
                DType::F32 => dst.copy_from_slice(&(v as f32).to_le_bytes()),
                DType::I32 => dst.copy_from_slice(&(v as i32).to_le_bytes()),
                DType::F16 => dst.copy_from_slice(&half::f16::from_f32(v as f32).to_le_bytes()),
            }
        }
    };
    let threads = if cfg!(target_arch = "wasm32") {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |t| t.get())
    };
    // even chunks, so that no Box–Muller pair straddles two
    let chunk = n.div_ceil(threads).max(1 << 16).next_multiple_of(2);
    if threads == 1 || n <= chunk {
        write(0, &mut out);
        return out;
    }
    std::thread::scope(|scope| {
        for (i, part) in out.chunks_mut(chunk * size).enumerate() {
            scope.spawn(move || write(i * chunk, part));
        }
    });
    out
}

/// The `n` values of `init` in C order, in f64 (see the module docs).
pub fn values(init: &Init, n: usize) -> impl Iterator<Item = f64> + '_ {
    values_from(init, 0).take(n)
}

/// The values of `init` from element `start` (even for `normal`) on, in C order.
fn values_from(init: &Init, start: usize) -> impl Iterator<Item = f64> + '_ {
    // a uniform draws once per element, a normal twice per pair of elements
    let mut rng = match *init {
        Init::Uniform { seed, .. } | Init::Normal { seed, .. } => SplitMix64::after(seed, start),
        _ => SplitMix64::new(0),
    };
    // the second sample `z = r · sin θ` of the last Box–Muller pair
    let mut pending: Option<f64> = None;
    let mut index = start;
    std::iter::repeat(()).map(move |_| match *init {
        Init::Schedule(s) => {
            index += 1;
            s.lr_at(index as u64 - 1)
        }
        Init::BiasCorrections { beta1, beta2 } => {
            index += 1;
            let (t, column) = ((index - 1) / 2, (index - 1) % 2);
            let beta = if column == 0 { beta1 } else { beta2 };
            1.0 - beta.powf(t as f64)
        }
        Init::Zeros | Init::External => 0.0,
        Init::Ones => 1.0,
        Init::Full(v) => v,
        Init::Uniform { lo, hi, .. } => lo + (hi - lo) * rng.next_unit(),
        Init::Normal { mean, std, .. } => {
            if let Some(z) = pending.take() {
                return mean + std * z;
            }
            let u1 = 1.0 - rng.next_unit();
            let u2 = rng.next_unit();
            let r = (-2.0 * u1.ln()).sqrt();
            let theta = 2.0 * std::f64::consts::PI * u2;
            pending = Some(r * theta.sin());
            mean + std * (r * theta.cos())
        }
    })
}
