//! `sinter-bench calibrate`: the target model's rates measured on this device, written as a
//! target file for `sinter compile --target FILE.json`.
//!
//! Measured, each the median of `--repeats` runs with GPU timestamps:
//! - `launch_ns`: a chain of 64 one-element dispatches (compiled without the optimizer, one
//!   dispatch per op), the GPU time from the first start to the last end over the dispatches;
//! - `bytes_per_ns`: `y = x + x` over `--elements` f32 values, its bytes over its busy time;
//! - `flops_per_ns`: 64 fused multiply-adds per element over the same values;
//! - every block shape's `tflops` in the base's matmul table: an `--size`³ product forced to
//!   that shape (of `f16` operands for the tensor-core shapes, where the base has cooperative
//!   matrices; elsewhere their rates are kept and said so); and `product_flops_per_ns`, the
//!   f32 product with the block shape the compiler chooses.
//!
//! Kept from the base preset, and said so on stderr: SMs (wgpu does not report them; `--sms`
//! sets them), the block shapes' residency and occupancy curves and split penalties (fitted by
//! hand from block-shape sweeps), the split-K sum's rates and the flash kernels' rates (their
//! fits need the attention sweeps of BENCHMARKS.md).

use std::path::PathBuf;

use sinter_compiler::Target;
use sinter_compiler::matmul::{Form, Tile};
use sinter_runtime::Session;
use sinter_runtime::io::HostTensor;

use super::{Failure, Output, Rng, choice};

#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// The preset (or target file) whose limits, features and unmeasured rates the result
    /// keeps.
    #[arg(long, default_value = "portable")]
    base: String,
    /// The target's name in the file.
    #[arg(long, default_value = "calibrated")]
    name: String,
    /// Where to write the target.
    #[arg(short, long, default_value = "target.json")]
    out: PathBuf,
    /// Matrix side of the timed products.
    #[arg(long, default_value_t = 4096)]
    size: usize,
    /// Elements of the bandwidth and arithmetic kernels.
    #[arg(long, default_value_t = 1 << 24)]
    elements: usize,
    /// Streaming multiprocessors (compute units) of the device, which wgpu does not report.
    #[arg(long)]
    sms: Option<usize>,
    /// Timed runs per measurement (after one warm-up run).
    #[arg(long, default_value_t = 10)]
    repeats: u32,
}

pub fn calibrate(args: &CalibrateArgs, out: &Output) -> Result<(), Failure> {
    let base = match Target::named(&args.base) {
        Some(t) => t,
        None => {
            let text = std::fs::read_to_string(&args.base).map_err(|e| {
                Failure::Error(format!(
                    "`{}` is no preset ({}) and cannot be read: {e}",
                    args.base,
                    Target::PRESETS.join(", ")
                ))
            })?;
            Target::from_json(&text).map_err(Failure::Error)?
        }
    };
    if args.size == 0 || args.elements == 0 || args.repeats == 0 {
        return Err(Failure::Error(
            "--size, --elements and --repeats must be positive".into(),
        ));
    }
    let mut target = base.clone();
    target.name = args.name.clone();
    if let Some(sms) = args.sms {
        target.rates.sms = sms;
    }
    let mut rng = Rng(1);
    let measure = |src: &str, optimize: bool, tile: Option<Tile>, rng: &mut Rng| {
        time(src, optimize, tile, &base, args.repeats, rng)
    };

    // launch: 64 dependent one-element dispatches
    let mut chain = String::from("graph launch {\n  input x: f32[1]\n  y0 = add(x, 1.0)\n");
    for i in 1..64 {
        chain.push_str(&format!("  y{i} = mul(y{}, 0.5)\n", i - 1));
    }
    chain.push_str("  output y63\n}\n");
    let (gpu_ns, _, dispatches) = measure(&chain, false, None, &mut rng)?;
    target.rates.launch_ns = gpu_ns / dispatches as f64;

    // bandwidth: read n, write n
    let n = args.elements;
    let copy =
        format!("graph bandwidth {{\n  input x: f32[{n}]\n  y = add(x, x)\n  output y\n}}\n");
    let (_, busy_ns, _) = measure(&copy, true, None, &mut rng)?;
    target.rates.bytes_per_ns = (8 * n) as f64 / busy_ns;

    // arithmetic: 64 multiply-adds per element, fused into one kernel
    let mut math =
        format!("graph arithmetic {{\n  input x: f32[{n}]\n  h0 = add(mul(x, 0.999), 0.001)\n");
    for i in 1..64 {
        math.push_str(&format!("  h{i} = add(mul(h{}, 0.999), 0.001)\n", i - 1));
    }
    math.push_str("  output h63\n}\n");
    let (_, busy_ns, _) = measure(&math, true, None, &mut rng)?;
    target.rates.flops_per_ns = (128 * n) as f64 / busy_ns;

    // products
    let s = args.size;
    let product = format!(
        "graph product {{\n  input a: f32[{s}, {s}]\n  input b: f32[{s}, {s}]\n  c = matmul(a, b)\n  output c\n}}\n"
    );
    let flops = 2.0 * (s as f64).powi(3);
    let (_, busy_ns, _) = measure(&product, true, None, &mut rng)?;
    target.rates.product_flops_per_ns = flops / busy_ns;
    // the tensor-core shapes time a product of f16 operands, where the base has them
    let half_product = product.replace("f32[", "f16[");
    let tensor_cores = base.features.cooperative_matrix && base.features.f16;
    let mut kept = Vec::new();
    for rate in &mut target.rates.matmul {
        let src = match rate.tile.form {
            Form::Fma => &product,
            Form::TensorCores if tensor_cores => &half_product,
            Form::TensorCores => {
                kept.push(rate.tile.to_string());
                continue;
            }
        };
        let (_, busy_ns, _) = measure(src, true, Some(rate.tile), &mut rng)?;
        rate.tflops = flops / busy_ns / 1e3;
    }

    let r = &target.rates;
    out.table(&format!(
        "# {}: launch {:.2} µs, {:.0} GB/s, {:.1} elementwise TFLOP/s, products {:.1} TFLOP/s \
         ({}³; by block shape: {})",
        args.name,
        r.launch_ns / 1e3,
        r.bytes_per_ns,
        r.flops_per_ns / 1e3,
        r.product_flops_per_ns / 1e3,
        s,
        r.matmul
            .iter()
            .map(|m| format!("{} {:.2}", m.tile, m.tflops))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    eprintln!(
        "# kept from `{}`: {} SMs{}, block residency and occupancy, split penalties, the \
         split-K sum's and the flash kernels' rates{}",
        base.name,
        target.rates.sms,
        if args.sms.is_some() { " (--sms)" } else { "" },
        if kept.is_empty() {
            String::new()
        } else {
            format!(
                ", and the tensor-core shapes' rates ({}: the base has no cooperative matrices)",
                kept.join(", ")
            )
        }
    );
    std::fs::write(&args.out, target.to_json())
        .map_err(|e| Failure::Error(format!("cannot write {}: {e}", args.out.display())))?;
    eprintln!("# -> {}", args.out.display());
    Ok(())
}

/// `(gpu_ns, busy_ns, dispatches)` of `src` compiled for `base` (optimized or not, its products
/// forced to `tile`), medians over `repeats` runs on random inputs.
fn time(
    src: &str,
    optimize: bool,
    tile: Option<Tile>,
    base: &Target,
    repeats: u32,
    rng: &mut Rng,
) -> Result<(f64, f64, usize), Failure> {
    let graph =
        sinter_ir::text::parse(src).map_err(|d| Failure::Error(d.render("calibrate", src)))?;
    let options = sinter_compiler::Options {
        target: base.clone(),
        optimize,
        matmul: sinter_compiler::matmul::Forced { tile, splits: None },
        ..Default::default()
    };
    let artifact = sinter_compiler::compile(&graph, &options)?.artifact;
    let inputs: Vec<(String, HostTensor)> = artifact
        .slots(sinter_ir::artifact::Role::Input)
        .map(|slot| {
            let shape = slot.ty.shape.clone();
            let count: usize = shape.iter().product();
            let data: Vec<f32> = (0..count).map(|_| rng.nonzero()).collect();
            let tensor = match slot.ty.dtype {
                sinter_ir::DType::F16 => {
                    HostTensor::f16(shape, data.into_iter().map(half::f16::from_f32).collect())
                }
                _ => HostTensor::f32(shape, data),
            };
            (slot.name.clone(), tensor)
        })
        .collect();
    let mut session = Session::load_with(artifact, &choice()?)?;
    let feeds: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let profile = session.profile(&feeds, repeats)?;
    Ok((profile.gpu_ns, profile.busy_ns, profile.dispatches.len()))
}
