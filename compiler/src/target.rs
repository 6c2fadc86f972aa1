//! The target model: everything the compiler assumes about the device an artifact will run on,
//! in one value.
//!
//! A [`Target`] holds the device's limits (binding size, workgroup memory, invocations,
//! workgroups per dimension, the loop budget every artifact keeps for Mesa's software Vulkan),
//! the optional features the compiler may use (`f16`, subgroups, cooperative matrices, a
//! second `vec4` binding of an arena), and the rates the cost model prices kernels with (launch,
//! bandwidth, arithmetic, each matmul block shape, the flash kernels). The cost model
//! (`optimize::extract` through [`crate::matmul`] and [`crate::flash::variant`]) and codegen
//! read it; nothing else keeps device constants.
//!
//! **Presets** ([`Target::named`]): `portable` (the default: any native WebGPU adapter, the
//! H200's measured rates as the best-known ratios), `browser` (what WebGPU in a browser grants:
//! no `f16`, no arena bound twice in a dispatch) and `h200` (the benchmark host, measured:
//! cooperative matrices, 32-wide subgroups, 2 GiB bindings). A target can also be read from a
//! JSON file (`sinter compile --target FILE.json`), such as the one `sinter-bench calibrate`
//! writes from measurements on a device.
//!
//! Only ratios of the rates matter to the cost model's choices; their absolute values are the
//! H200's, in nanoseconds, so estimates read as times there.

use serde::{Deserialize, Serialize};
use sinter_ir::artifact::Storage;
use sinter_ir::{DType, TensorType};

/// The most loop iterations one invocation may run on Mesa's software Vulkan (lavapipe): its
/// LLVM back end keeps one counter per invocation, decremented at every back-edge of every loop,
/// and ends all loops when it reaches zero, without an error. Nesting a long loop does not help;
/// fewer, longer iterations (unrolling) or more invocations do. Codegen picks such forms when a
/// shape needs them; a kernel that still needs more records it (`Dispatch::loop_iterations`) and
/// the runtime refuses to run it on lavapipe rather than return a short result.
pub const LOOP_BUDGET: u64 = 65535;

/// What a device allows and how fast it runs each kind of kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// The preset's name, or what a calibration called its device.
    pub name: String,
    pub limits: Limits,
    pub features: Features,
    pub rates: Rates,
}

/// The device's limits, as WebGPU names them where it has a name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// `max_storage_buffer_binding_size`, bytes: plans larger than this are split over several
    /// arenas, and a tensor larger than this cannot be stored.
    pub max_binding: u64,
    /// `max_compute_workgroup_storage_size`, bytes.
    pub workgroup_bytes: u32,
    /// `max_compute_workgroups_per_dimension`.
    pub workgroups_per_dimension: u32,
    /// Loop iterations (back-edges of all loops together) one invocation may run. Mesa's
    /// software Vulkan ends every loop after 65535 without an error; every preset keeps that
    /// budget so that any artifact also runs there (see [`LOOP_BUDGET`]).
    pub loop_budget: u64,
}

/// Optional device features the compiler may use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Features {
    /// WGSL's `f16` (wgpu's `SHADER_F16`).
    pub f16: bool,
    /// Cooperative matrices of 16 × 16 × 16 `f16` products with `f32` accumulation (wgpu's
    /// experimental `EXPERIMENTAL_COOPERATIVE_MATRIX`), with subgroups of
    /// [`Features::cooperative_subgroup`] invocations to divide their tiles among.
    pub cooperative_matrix: bool,
    /// The subgroup size the cooperative-matrix kernels are written for.
    pub cooperative_subgroup: u32,
    /// The tensor-core matmul's cooperative matrices written out in plain WGSL instead
    /// (`codegen/matmul/coop.rs`): each invocation holds its share of every accumulator and
    /// the subgroups are numbered from the invocation index. Many times slower and needing no
    /// cooperative-matrix feature, it is how the kernel's staging, indexing, edges and
    /// epilogues are tested against the interpreter on adapters without tensor cores (CI's
    /// software Vulkan). The flash kernels' tensor-core forms have no such form: a target with
    /// it does not take them.
    #[serde(default)]
    pub cooperative_emulated: bool,
    /// A kernel may bind an arena a second time as `array<vec4<f32>>` for 16-byte loads. WebGPU
    /// in a browser forbids binding one buffer twice in a dispatch when either binding is
    /// writable.
    pub quad_aliases: bool,
}

/// The rates the cost model prices kernels with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Streaming multiprocessors (compute units) that workgroups are spread over.
    pub sms: usize,
    /// Fixed cost of one dispatch, ns.
    pub launch_ns: f64,
    /// Sustained memory bandwidth, bytes per ns.
    pub bytes_per_ns: f64,
    /// Elementwise arithmetic, f32 operations per ns.
    pub flops_per_ns: f64,
    /// Matrix products as extraction prices them, f32 operations per ns: one rate for every
    /// shape, the one the flash rate was fitted against (lowering chooses block shapes by
    /// [`Rates::matmul`]).
    pub product_flops_per_ns: f64,
    /// The tiled matmul's block shapes with their measured throughput ([`crate::matmul`]).
    pub matmul: Vec<MatmulRate>,
    /// Effective bandwidth of the split-K sum, bytes per ns.
    pub split_sum_bytes_per_ns: f64,
    /// Fixed cost of a split-K product's extra pass, ns.
    pub split_sum_ns: f64,
    /// The flash-attention kernels ([`crate::flash::variant`]).
    pub flash: FlashRates,
}

/// The throughput of one matmul block shape.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatmulRate {
    pub tile: crate::matmul::Tile,
    /// Blocks one SM runs at once.
    pub resident: usize,
    /// An SM's throughput with `c` blocks resident (entry `c - 1`, up to `resident`), relative
    /// to a full SM: one block alone does not hide its own latencies.
    pub occupancy: [f64; 8],
    /// TFLOP/s with every SM full.
    pub tflops: f64,
    /// Factor on the time of a split product.
    pub split_penalty: f64,
}

/// The flash-attention kernels' rates.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlashRates {
    /// The `f32` kernels' products, f32 operations per ns (counting the backward's recomputed
    /// products), at full SM balance.
    pub flops_per_ns: f64,
    /// How much faster the tensor-core forward runs its products than the `f32` forward.
    pub tensor_core_forward: f64,
    /// How much faster the tensor-core dQ and dK/dV kernels run each product than the `f32`
    /// whole backward.
    pub tensor_core_backward: f64,
}

/// `[a, b, ..]` padded with ones to the eight entries of [`MatmulRate::occupancy`].
const fn occupancy<const N: usize>(first: [f64; N]) -> [f64; 8] {
    let mut out = [1.0; 8];
    let mut i = 0;
    while i < N {
        out[i] = first[i];
        i += 1;
    }
    out
}

impl Target {
    /// The names [`Target::named`] knows, the default first.
    pub const PRESETS: [&'static str; 3] = ["portable", "browser", "h200"];

    /// The preset called `name` (see the module docs).
    pub fn named(name: &str) -> Option<Target> {
        match name.trim().to_ascii_lowercase().as_str() {
            "portable" => Some(Target::portable()),
            "browser" => Some(Target::browser()),
            "h200" => Some(Target::h200()),
            _ => None,
        }
    }

    /// The H200 benchmark host, through wgpu's Vulkan backend: its limits as the adapter
    /// reports them, and rates measured there (BENCHMARKS.md: "Matmul block shapes", "Flash
    /// tilings", "Tensor cores"; the command that refits them is `sinter-bench calibrate`).
    pub fn h200() -> Target {
        Target {
            name: "h200".into(),
            limits: Limits {
                // 2^31 - 4, not 2^31 (GPU.md)
                max_binding: 2_147_483_644,
                workgroup_bytes: 48 << 10,
                workgroups_per_dimension: 65535,
                loop_budget: LOOP_BUDGET,
            },
            features: Features {
                f16: true,
                cooperative_matrix: true,
                cooperative_subgroup: 32,
                cooperative_emulated: false,
                quad_aliases: true,
            },
            rates: Rates::h200(),
        }
    }

    /// Any native WebGPU adapter with wgpu's default limits: `f16` (most native adapters,
    /// Mesa's software Vulkan included, have it), no cooperative matrices; the H200's rates,
    /// the only ones measured, as the best-known ratios.
    pub fn portable() -> Target {
        Target {
            name: "portable".into(),
            limits: Limits {
                max_binding: 128 << 20,
                workgroup_bytes: 32 << 10,
                workgroups_per_dimension: 65535,
                loop_budget: LOOP_BUDGET,
            },
            features: Features {
                f16: true,
                cooperative_matrix: false,
                cooperative_subgroup: 32,
                cooperative_emulated: false,
                quad_aliases: true,
            },
            rates: Rates::h200(),
        }
    }

    /// This target with cooperative matrices (`sinter compile --tensor-cores`) and at least the
    /// workgroup memory the tensor-core kernels stage: the [`Target::h200`] preset's 48 KiB,
    /// what NVIDIA's Vulkan driver offers (the artifact records each kernel's need, and the
    /// runtime refuses an adapter that offers less).
    pub fn with_tensor_cores(mut self) -> Target {
        self.features.cooperative_matrix = true;
        let wanted = Target::h200().limits.workgroup_bytes;
        self.limits.workgroup_bytes = self.limits.workgroup_bytes.max(wanted);
        self
    }

    /// WebGPU in a browser (checked in headless Chromium's SwiftShader, GPU.md): no `f16`, no
    /// cooperative matrices, no arena bound twice in a dispatch; WebGPU's default limits.
    pub fn browser() -> Target {
        Target {
            name: "browser".into(),
            features: Features {
                f16: false,
                quad_aliases: false,
                ..Target::portable().features
            },
            ..Target::portable()
        }
    }

    /// How a value of `dtype` is stored: f16 values in f16 arenas where the target has f16,
    /// else as f32 words holding f16 numbers; everything else in words.
    pub fn storage(&self, dtype: DType) -> Storage {
        match dtype {
            DType::F16 if self.features.f16 => Storage::Half,
            DType::F16 | DType::F32 | DType::I32 => Storage::Word,
        }
    }

    /// The bytes a tensor of `ty` takes in an arena ([`Target::storage`]).
    pub fn stored_bytes(&self, ty: &TensorType) -> u64 {
        ty.numel() as u64 * self.storage(ty.dtype).bytes()
    }

    /// This target with another binding limit (`sinter compile --max-binding-size`).
    pub fn with_max_binding(mut self, bytes: u64) -> Target {
        self.limits.max_binding = bytes;
        self
    }

    /// The target from a JSON text (as `sinter-bench calibrate` writes it), or what is wrong
    /// with it.
    pub fn from_json(text: &str) -> Result<Target, String> {
        let t: Target = serde_json::from_str(text).map_err(|e| e.to_string())?;
        t.check()?;
        Ok(t)
    }

    /// The target as JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a target serializes")
    }

    /// Refuses a target whose numbers the cost model or codegen cannot use.
    pub fn check(&self) -> Result<(), String> {
        let r = &self.rates;
        let positive = [
            ("rates.launch_ns", r.launch_ns),
            ("rates.bytes_per_ns", r.bytes_per_ns),
            ("rates.flops_per_ns", r.flops_per_ns),
            ("rates.product_flops_per_ns", r.product_flops_per_ns),
            ("rates.split_sum_bytes_per_ns", r.split_sum_bytes_per_ns),
            ("rates.flash.flops_per_ns", r.flash.flops_per_ns),
            (
                "rates.flash.tensor_core_forward",
                r.flash.tensor_core_forward,
            ),
            (
                "rates.flash.tensor_core_backward",
                r.flash.tensor_core_backward,
            ),
        ];
        for (what, v) in positive {
            if !v.is_finite() || v <= 0.0 {
                return Err(format!("{what} must be a positive number, not {v}"));
            }
        }
        if r.sms == 0 {
            return Err("rates.sms must be at least 1".into());
        }
        if !r
            .matmul
            .iter()
            .any(|m| m.tile.form == crate::matmul::Form::Fma)
        {
            return Err("rates.matmul must list at least one fma block shape".into());
        }
        for m in &r.matmul {
            if m.resident == 0 || m.resident > m.occupancy.len() {
                return Err(format!(
                    "rates.matmul: {} blocks resident per SM (1 to {})",
                    m.resident,
                    m.occupancy.len()
                ));
            }
            let positive = |x: f64| x.is_finite() && x > 0.0;
            let rates_positive = positive(m.tflops)
                && positive(m.split_penalty)
                && m.occupancy[..m.resident].iter().all(|&o| positive(o));
            if !rates_positive {
                return Err(format!(
                    "rates.matmul: block shape {} has a rate that is not positive",
                    m.tile
                ));
            }
            crate::matmul::Tile::check(m.tile)?;
        }
        if self.limits.max_binding < 4 {
            return Err("limits.max_binding must be at least 4 bytes".into());
        }
        if self.limits.workgroups_per_dimension == 0 {
            return Err("limits.workgroups_per_dimension must be at least 1".into());
        }
        Ok(())
    }
}

impl Default for Target {
    fn default() -> Target {
        Target::portable()
    }
}

impl Rates {
    /// Measured on the H200 (see [`Target::h200`]).
    pub fn h200() -> Rates {
        use crate::matmul::Tile;
        Rates {
            sms: 132,
            launch_ns: 4000.0,
            bytes_per_ns: 3000.0,
            flops_per_ns: 30000.0,
            product_flops_per_ns: 25000.0,
            matmul: vec![
                // Alone, LARGE's blocks ran at 37.5 TFLOP/s (4096^3 and the GPT-2-small shapes);
                // inside the GPT-2-small step its 2048x768x3072 products ran 13-16% slower than
                // that (and slower than WIDE's 16-deep slabs, which kept their speed), so the
                // model takes the in-step rate. LARGE's chunked products ran ~10% slower than
                // their block counts predict, MEDIUM's ~5%, WIDE's not.
                MatmulRate {
                    tile: Tile::LARGE,
                    resident: 2,
                    occupancy: occupancy([0.72, 1.0]),
                    tflops: 32.5,
                    split_penalty: 1.1,
                },
                MatmulRate {
                    tile: Tile::WIDE,
                    resident: 3,
                    occupancy: occupancy([0.68, 0.92, 1.0]),
                    tflops: 30.0,
                    split_penalty: 1.0,
                },
                MatmulRate {
                    tile: Tile::MEDIUM,
                    resident: 8,
                    occupancy: occupancy([0.5]),
                    tflops: 26.0,
                    split_penalty: 1.05,
                },
                MatmulRate {
                    tile: Tile::SMALL,
                    resident: 8,
                    occupancy: occupancy([0.5]),
                    tflops: 6.0,
                    split_penalty: 1.0,
                },
                // The tensor-core block shapes (products of f16 operands): rates at 4096^3 from
                // `sinter-bench calibrate --base h200 --sms 132` on an H100 (BENCHMARKS.md, "The
                // residual stream stored, and the tensor-core block shapes calibrated"); their
                // residency and occupancy are priors (larger blocks keep fewer per SM). Only
                // products of f16 operands choose among them.
                MatmulRate {
                    tile: Tile::TC_HUGE,
                    resident: 1,
                    occupancy: occupancy([1.0]),
                    tflops: 156.75,
                    split_penalty: 1.1,
                },
                // two stages, which measured faster than one on every shape (BENCHMARKS.md,
                // "The paired epilogue withdrawn, two-stage slabs measured")
                MatmulRate {
                    tile: Tile {
                        stages: 2,
                        ..Tile::TC_LARGE
                    },
                    resident: 2,
                    occupancy: occupancy([0.7, 1.0]),
                    tflops: 113.8,
                    split_penalty: 1.1,
                },
                MatmulRate {
                    tile: Tile::TC_WIDE,
                    resident: 3,
                    occupancy: occupancy([0.6, 0.9, 1.0]),
                    tflops: 129.1,
                    split_penalty: 1.05,
                },
                MatmulRate {
                    tile: Tile::TC_MEDIUM,
                    resident: 4,
                    occupancy: occupancy([0.5, 0.8, 0.95, 1.0]),
                    tflops: 82.0,
                    split_penalty: 1.05,
                },
                MatmulRate {
                    tile: Tile::TC_SMALL,
                    resident: 6,
                    occupancy: occupancy([0.4, 0.7, 0.85, 0.95, 1.0, 1.0]),
                    tflops: 68.5,
                    split_penalty: 1.0,
                },
            ],
            split_sum_bytes_per_ns: 1e3,
            split_sum_ns: 2e3,
            flash: FlashRates {
                // fitted to the 128 × 64 tiling (the default) at S = 512 to 4096, head dim 64,
                // causal and not, so that the model's flash-to-unfused ratio follows the
                // measured one
                flops_per_ns: 16000.0,
                tensor_core_forward: 2.07,
                tensor_core_backward: 2.7,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_round_trip_through_json_and_pass_their_check() {
        for name in Target::PRESETS {
            let t = Target::named(name).expect("a preset");
            assert_eq!(t.name, name);
            t.check().expect("presets are usable");
            assert_eq!(Target::from_json(&t.to_json()).as_ref(), Ok(&t));
        }
        assert_eq!(Target::default(), Target::named("portable").unwrap());
        assert!(Target::named("h100").is_none());
    }

    #[test]
    fn unusable_targets_are_refused_naming_the_field() {
        let mut t = Target::h200();
        t.rates.bytes_per_ns = 0.0;
        let err = Target::from_json(&t.to_json()).unwrap_err();
        assert!(err.contains("rates.bytes_per_ns"), "{err}");
        let mut t = Target::h200();
        t.rates.matmul[0].resident = 9;
        let err = Target::from_json(&t.to_json()).unwrap_err();
        assert!(err.contains("resident"), "{err}");
        assert!(Target::from_json("{").is_err());
    }
}
