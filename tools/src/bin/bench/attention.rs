//! `sinter-bench attention`: an attention's forward and backward (one training step's worth:
//! `O = attention(q, k, v)`, then dQ, dK, dV for the output gradient `dO`), compiled from `.sir`
//! text like any program, once per `--attention` policy (`flash`: the flash kernels the
//! optimizer finds; `unfused`: the optimizer without the attention rules; `auto`: what the cost
//! model picks; `no-opt`: no optimizer at all, every op its own dispatch, as `sinter compile
//! --no-opt`). Per sequence length: the GPU time of the whole step (timestamps, median of the
//! repeats), TFLOP/s as FlashAttention-2 counts them (forward `4·B·H·S²·D`, backward 2.5 times
//! that, halved when causal), the dispatches and the arena, and the largest difference of every
//! result from the first policy's, relative to its max |value|. A policy that cannot compile a
//! length (the `[S, S]` scores exceed a binding) says why and the others go on.

use sinter_compiler::optimize::AttentionPolicy;
use sinter_runtime::Session;
use sinter_runtime::io::{HostTensor, TensorData};

use super::{Failure, Json, Output, Rng, choice, ms};
use sinter_cli::flags::Attention;

/// What to compile: an `--attention` policy of the optimizer, or no optimizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    Flash,
    /// The flash kernels with their products on tensor cores (`f16` operands; as
    /// `sinter compile --tensor-cores`); its results differ from `f32` ones by ~1e-3 relative.
    FlashTc,
    /// The flash kernels with the backward as separate dQ and dK/dV kernels.
    FlashSplit,
    Unfused,
    Auto,
    /// The cost model's pick with tensor cores allowed (`sinter compile --tensor-cores`).
    AutoTc,
    NoOpt,
}

impl Policy {
    fn options(self, max_binding: Option<u64>) -> sinter_compiler::Options {
        let attention = match self {
            Policy::Flash | Policy::FlashTc | Policy::FlashSplit => Attention::Flash,
            Policy::Unfused => Attention::Unfused,
            Policy::Auto | Policy::AutoTc | Policy::NoOpt => Attention::Auto,
        };
        let tensor_cores = matches!(self, Policy::FlashTc | Policy::AutoTc);
        sinter_compiler::Options {
            target: super::bench_target(max_binding, tensor_cores),
            attention: AttentionPolicy::from(attention),
            optimize: self != Policy::NoOpt,
            flash: sinter_compiler::flash::variant::Choices {
                tensor_cores,
                merge_backward: self != Policy::FlashSplit,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn name(self) -> &'static str {
        match self {
            Policy::Flash => "flash",
            Policy::FlashTc => "flash-tc",
            Policy::FlashSplit => "flash-split",
            Policy::Unfused => "unfused",
            Policy::Auto => "auto",
            Policy::AutoTc => "auto-tc",
            Policy::NoOpt => "no-opt",
        }
    }
}

#[derive(clap::Args)]
pub struct AttentionArgs {
    /// Sequence lengths S (queries and keys).
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048,4096")]
    seq: Vec<usize>,
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = 12)]
    heads: usize,
    #[arg(long, default_value_t = 64)]
    head_dim: usize,
    /// A causal mask (the scores of later keys are -inf).
    #[arg(long)]
    causal: bool,
    /// Policies to time, in order; the first is the reference for the others' results.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "flash,unfused,auto,no-opt"
    )]
    policies: Vec<Policy>,
    /// Measured runs (after one warm-up run).
    #[arg(long, default_value_t = 10)]
    repeats: u32,
    /// Largest difference from the reference policy, relative to max |reference|.
    #[arg(long, default_value_t = 1e-3)]
    tolerance: f64,
    /// Largest arena binding the compiler may plan, in bytes.
    #[arg(long)]
    max_binding: Option<u64>,
    /// q, k, v, the output and the output gradient in f16, as autocast gives attention in a
    /// mixed-precision step: the f16 values cast to f32 for `attention`, its output rounded to
    /// f16; the gradients of the f16 inputs are f16.
    #[arg(long)]
    f16: bool,
}

/// The program: a step's attention forward and backward, `w` standing for `dO`; with `f16`,
/// on f16 values as autocast writes it (see [`AttentionArgs::f16`]).
pub fn program(b: usize, h: usize, s: usize, d: usize, causal: bool, f16: bool) -> String {
    let shape = format!("[{b}, {h}, {s}, {d}]");
    if f16 {
        let wide = |x: &str| format!("cast({x}, dtype=\"f32\")");
        return format!(
            "graph attention_step {{\n  input q: f16{shape}\n  input k: f16{shape}\n  input v: f16{shape}\n  input w: f16{shape}\n  o = cast(attention({}, {}, {}, causal={causal}), dtype=\"f16\")\n  loss = sum(cast(mul(o, w), dtype=\"f32\"))\n  dq, dk, dv = grad(loss, q, k, v)\n  output o, dq, dk, dv\n}}\n",
            wide("q"),
            wide("k"),
            wide("v")
        );
    }
    let t = format!("f32{shape}");
    format!(
        "graph attention_step {{\n  input q: {t}\n  input k: {t}\n  input v: {t}\n  input w: {t}\n  o = attention(q, k, v, causal={causal})\n  loss = sum(mul(o, w))\n  dq, dk, dv = grad(loss, q, k, v)\n  output o, dq, dk, dv\n}}\n"
    )
}

/// FLOPs of the step as FlashAttention-2 counts them.
fn flops(b: usize, h: usize, s: usize, d: usize, causal: bool) -> f64 {
    let forward = 4.0 * (b * h * d) as f64 * (s as f64) * (s as f64);
    3.5 * forward * if causal { 0.5 } else { 1.0 }
}

const RESULTS: [&str; 4] = ["o", "dq", "dk", "dv"];

pub fn attention(args: &AttentionArgs, out: &Output) -> Result<(), Failure> {
    let (b, h, d) = (args.batch, args.heads, args.head_dim);
    out.table(&format!(
        "# attention forward + backward, batch {b}, {h} heads, head dim {d}{}{}; {} runs each",
        if args.causal { ", causal" } else { "" },
        if args.f16 { ", f16" } else { "" },
        args.repeats
    ));
    out.table(
        "S       policy    kernel ms  TFLOP/s  dispatches  flash  arena MiB  max rel diff  note",
    );
    let mut wrong = Vec::new();
    let choice = choice()?;
    for &s in &args.seq {
        let src = program(b, h, s, d, args.causal, args.f16);
        let graph = sinter_ir::text::parse(&src)
            .map_err(|e| Failure::Error(e.render("attention.sir", &src)))?;
        let mut rng = Rng(s as u64);
        let numel = b * h * s * d;
        let shape = vec![b, h, s, d];
        let inputs: Vec<(&str, HostTensor)> = ["q", "k", "v", "w"]
            .into_iter()
            .map(|name| {
                let data: Vec<f32> = (0..numel).map(|_| rng.nonzero()).collect();
                let t = if args.f16 {
                    HostTensor::f16(
                        shape.clone(),
                        data.into_iter().map(half::f16::from_f32).collect(),
                    )
                } else {
                    HostTensor::f32(shape.clone(), data)
                };
                (name, t)
            })
            .collect();
        let feeds: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (*n, t)).collect();
        let mut reference: Option<Vec<Vec<f32>>> = None;
        for &policy in &args.policies {
            let name = policy.name();
            let options = policy.options(args.max_binding);
            let mut fields = vec![
                ("bench", Json::Str("attention".into())),
                (
                    "impl",
                    Json::Str(match policy {
                        Policy::Auto => "sinter".into(),
                        _ => format!("sinter-{name}"),
                    }),
                ),
                ("n", Json::Str(label(b, h, s, d, args.causal))),
                ("batch", Json::Int(b as u64)),
                ("heads", Json::Int(h as u64)),
                ("seq", Json::Int(s as u64)),
                ("head_dim", Json::Int(d as u64)),
                ("causal", Json::Bool(args.causal)),
                ("f16", Json::Bool(args.f16)),
            ];
            let artifact = match sinter_compiler::compile(&graph, &options) {
                Ok(c) => c.artifact,
                Err(e) => {
                    let why = e.to_string();
                    out.table(&format!(
                        "{s:<7} {name:<9} {:>9}  {:>7}  {:>10}  {:>5}  {:>9}  {:>12}  cannot compile: {}",
                        "-",
                        "-",
                        "-",
                        "-",
                        "-",
                        "-",
                        why.lines().next().unwrap_or("")
                    ));
                    fields.push(("error", Json::Str(why)));
                    out.record(&fields);
                    continue;
                }
            };
            let flash = artifact
                .kernels
                .iter()
                .filter(|k| k.pattern.starts_with("flash_attention"))
                .count();
            let (dispatches, arena) = (artifact.dispatches.len(), artifact.memory.peak_bytes);
            let mut session = Session::load_with(artifact, &choice)?;
            let results = session.run_reading(&feeds, &RESULTS)?;
            let values: Vec<Vec<f32>> = RESULTS
                .iter()
                .map(|r| match results.get(r).map(|t| &t.data) {
                    Some(TensorData::F32(v)) => v.clone(),
                    Some(TensorData::F16(v)) => v.iter().map(|x| x.to_f32()).collect(),
                    _ => Vec::new(),
                })
                .collect();
            let diff = match &reference {
                None => {
                    reference = Some(values);
                    0.0
                }
                Some(reference) => reference
                    .iter()
                    .zip(&values)
                    .map(|(r, v)| relative_diff(r, v))
                    .fold(0.0, f64::max),
            };
            let profile = session.profile(&feeds, args.repeats.max(1))?;
            let tflops = flops(b, h, s, d, args.causal) / profile.gpu_ns / 1e3;
            let ok = diff <= args.tolerance;
            if !ok {
                wrong.push(format!("S = {s}, {name}: max rel diff {diff:.2e}"));
            }
            out.table(&format!(
                "{s:<7} {name:<9} {:>9}  {tflops:>7.2}  {dispatches:>10}  {flash:>5}  {:>9.1}  {diff:>12.2e}  {}",
                ms(profile.gpu_ns),
                arena as f64 / (1 << 20) as f64,
                if ok { "" } else { "WRONG" }
            ));
            fields.extend([
                ("kernel_ms", Json::Num(profile.gpu_ns / 1e6)),
                ("tflops", Json::Num(tflops)),
                ("dispatches", Json::Int(dispatches as u64)),
                ("flash_kernels", Json::Int(flash as u64)),
                ("arena_bytes", Json::Int(arena)),
                ("max_rel_diff", Json::Num(diff)),
                ("ok", Json::Bool(ok)),
                ("adapter", Json::Str(profile.adapter.clone())),
            ]);
            out.record(&fields);
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(Failure::Wrong(wrong.join("; ")))
    }
}

/// The key `bench/compare.py` pairs results by.
fn label(b: usize, h: usize, s: usize, d: usize, causal: bool) -> String {
    format!("{b}x{h}x{s}x{d}{}", if causal { "c" } else { "" })
}

/// max |r − v| / max |r|; NaN where either has one.
fn relative_diff(r: &[f32], v: &[f32]) -> f64 {
    if r.len() != v.len() {
        return f64::INFINITY;
    }
    let scale = r.iter().fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
    let worst = r
        .iter()
        .zip(v)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs())
        .fold(0.0f64, |m, x| if x.is_nan() { f64::NAN } else { m.max(x) });
    worst / scale.max(f64::MIN_POSITIVE)
}
