//! `sinter-bench`: GPU timings of compiled graphs, measured with GPU timestamp queries.
//!
//! - `sinter-bench matmul --sizes 1024,2048,4096 [--repeats 20]`: `c = matmul(a, b)` for square
//!   f32 matrices, compiled through the text parser like any program; per size the median kernel
//!   time, TFLOP/s, the wall time of a run and the floor (FLOPs over the fp32 peak, bytes over
//!   the copy bandwidth), every run checked against a CPU reference in f64. `--shapes
//!   [B*]MxKxN[:at][:bt],...` times given shapes instead: `B` batch entries, `:at` / `:bt` make
//!   that operand a transposed view (stored `[.., K, M]` / `[.., N, K]`), as in a training step.
//! - `sinter-bench run FILE.sart|FILE.sir [--input NAME=FILE.npy ...] [--repeats 20]`: the
//!   per-kernel profile table of one graph (kernel, pattern, dispatches, median ms, % of the run),
//!   to find the hot kernels. Inputs not given are random.
//!
//! - `sinter-bench attention [--seq 512,1024,2048,4096] [--batch 4] [--heads 12] [--head-dim 64]
//!   [--causal] [--policies flash,unfused,auto]`: an attention's forward and backward, once per
//!   `--attention` policy, the results checked against the first policy's (see `bench/attention.rs`).
//! - `sinter-bench gpt [--layers 12 --width 768 --heads 12 ...]` and `sinter-bench llama
//!   [--layers 30 --width 576 --heads 9 --kv-heads 3 --mlp 1536 --vocab 49152 ...]`: a
//!   generated training step (`tools/src/gpt.rs`, `tools/src/llama.rs`): compile time, the
//!   first two losses, time per step and the kernel profile; the folder it writes is what
//!   `bench/gpt_torch.py` and `bench/llama_torch.py` read.
//! - `sinter-bench calibrate [--base portable] [--sms N] [-o target.json]`: the target model's
//!   rates measured on this device (see `bench/calibrate.rs`), for `sinter compile --target`.
//! - `sinter-bench generate [--batch 1,8] [--prompt-tokens 512] [--new-tokens 256]
//!   [--program FILE.sir] [--profile]`: text generation with the derived prefill and step
//!   programs, GPT-2 small's shape by default (see `bench/generate.rs`); prefill time, decoding
//!   tokens per second, the step checked against the prefill.
//! - `sinter-bench scaling [--nodes 10000]`: compile time of generated programs at N and 4N
//!   nodes (a chain of relus, a training step through a chain); fails when 4N takes more than
//!   `--max-ratio` (8) times as long as N, which a quadratic pass would.
//!
//! `--json` prints one JSON line per result on stdout (the tables go to stderr), in the format
//! `bench/compare.py` reads next to PyTorch's (`bench/torch_matmul.py`).
//!
//! Exit status: 0 ok, 1 a result was wrong (outside `--tolerance`), 2 anything else failed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};

#[path = "bench/attention.rs"]
mod attention;
#[path = "bench/calibrate.rs"]
mod calibrate;
#[path = "bench/generate.rs"]
mod generate;
#[path = "bench/scaling.rs"]
mod scaling;
use sinter_cli::gpt::GptConfig;
use sinter_compiler::matmul::Tile;
use sinter_ir::DType;
use sinter_ir::artifact::Artifact;
use sinter_runtime::io::{HostTensor, TensorData, read_npy};
use sinter_runtime::{AdapterChoice, Profile, ProfileOptions, Session};

/// Paper fp32 FMA peak of the H200 (GPU.md), FLOP/s.
const PEAK_FLOPS: f64 = 67e12;
/// Paper dense f16/bf16 tensor-core peak of the H200, FLOP/s.
const PEAK_TENSOR_FLOPS: f64 = 989e12;
/// Measured device copy bandwidth of the H200 (read + write), bytes/s.
const PEAK_BYTES: f64 = 4.26e12;
/// From this size up, a random sample of outputs is checked instead of all of them.
const SAMPLE_FROM: usize = 2048;

/// Benchmarks of sinter-compiled graphs, timed with GPU timestamps.
#[derive(Parser)]
#[command(name = "sinter-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print one JSON line per result on stdout (human-readable tables go to stderr).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// c = matmul(a, b) for square f32 matrices of each size, checked against a CPU reference.
    Matmul(MatmulArgs),
    /// The per-kernel GPU profile of one graph (.sart, or .sir compiled first).
    Run(RunArgs),
    /// A GPT-2-style training step (generated): compile time, the first two losses, time per
    /// step and the kernel profile; writes the program, its initial weights and the batch for
    /// `bench/gpt_torch.py`.
    Gpt(GptArgs),
    /// A Llama-family training step (generated; default SmolLM2-135M's shape): as `gpt`, for
    /// `bench/llama_torch.py`.
    Llama(LlamaArgs),
    /// Compile time at N and 4N nodes; fails when a pass scales worse than n log n.
    Scaling(scaling::ScalingArgs),
    /// An attention's forward and backward per sequence length, once per attention policy
    /// (flash kernels, unfused, the cost model's pick), results checked against each other.
    Attention(attention::AttentionArgs),
    /// Text generation with the derived prefill and step programs: prefill time and decoding
    /// tokens per second per batch size (GPT-2-style model, or any program).
    Generate(generate::GenerateArgs),
    /// The target model's rates measured on this device (launch, bandwidth, arithmetic, every
    /// matmul block shape), written as a target file for `sinter compile --target FILE.json`.
    Calibrate(calibrate::CalibrateArgs),
}

/// The shape of a GPT-2-style model (`sinter_cli::gpt`) but its context and batch; GPT-2
/// small's by default, with a vocabulary of 2048.
#[derive(clap::Args)]
struct GptShape {
    #[arg(long, default_value_t = 12)]
    layers: usize,
    #[arg(long, default_value_t = 768)]
    width: usize,
    #[arg(long, default_value_t = 12)]
    heads: usize,
    #[arg(long, default_value_t = 2048)]
    vocab: usize,
}

impl GptShape {
    fn config(&self, context: usize, batch: usize) -> GptConfig {
        GptConfig {
            layers: self.layers,
            width: self.width,
            heads: self.heads,
            context,
            batch,
            vocab: self.vocab,
        }
    }
}

#[derive(clap::Args)]
struct GptArgs {
    #[command(flatten)]
    shape: GptShape,
    #[arg(long, default_value_t = 512)]
    context: usize,
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[command(flatten)]
    step: StepArgs,
}

/// A Llama-family step; the defaults are SmolLM2-135M's shape with context 512 and batch 4.
#[derive(clap::Args)]
struct LlamaArgs {
    #[arg(long, default_value_t = 30)]
    layers: usize,
    #[arg(long, default_value_t = 576)]
    width: usize,
    #[arg(long, default_value_t = 9)]
    heads: usize,
    /// Key/value heads (dividing --heads).
    #[arg(long, default_value_t = 3)]
    kv_heads: usize,
    /// Width of the SwiGLU MLP.
    #[arg(long, default_value_t = 1536)]
    mlp: usize,
    #[arg(long, default_value_t = 512)]
    context: usize,
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = 49152)]
    vocab: usize,
    /// The rotary embedding's base.
    #[arg(long, default_value_t = 100000.0)]
    rope_theta: f64,
    /// AdamW's learning rate.
    #[arg(long, default_value_t = 3e-4)]
    lr: f64,
    /// AdamW's weight decay (on every param).
    #[arg(long, default_value_t = 0.1)]
    weight_decay: f64,
    #[command(flatten)]
    step: StepArgs,
}

/// What `gpt` and `llama` share: how the generated step is compiled and timed.
#[derive(clap::Args)]
struct StepArgs {
    /// Timed training steps (after three untimed ones).
    #[arg(long, default_value_t = 20)]
    steps: u32,
    /// Profiled steps (GPU timestamps around every dispatch).
    #[arg(long, default_value_t = 3)]
    profile: u32,
    /// Compile without the e-graph optimizer.
    #[arg(long)]
    no_opt: bool,
    /// Which attention kernels the optimizer may choose (as `sinter compile --attention`).
    #[arg(long, value_enum, default_value_t = sinter_cli::flags::Attention::Auto)]
    attention: sinter_cli::flags::Attention,
    /// The flash backward as one kernel or two (as `sinter compile --flash-backward`).
    #[arg(long, value_enum, default_value_t = sinter_cli::flags::FlashBackward::Whole)]
    flash_backward: sinter_cli::flags::FlashBackward,
    /// Flash kernels on tensor cores where they have such forms, and with `--precision mixed`
    /// the f16 matmuls (as `sinter compile --tensor-cores`).
    #[arg(long)]
    tensor_cores: bool,
    /// `mixed`: products in f16 with the gradient scaler, as `sinter compile --precision`
    /// (PyTorch's autocast with a GradScaler).
    #[arg(long, value_enum, default_value_t = sinter_cli::flags::Precision::F32)]
    precision: sinter_cli::flags::Precision,
    /// Only generate and compile (no GPU): compile time and kernel counts.
    #[arg(long)]
    compile_only: bool,
    /// Folder for the program (NAME.sir), config.json, init.safetensors (the initial params),
    /// step1.safetensors (the params after one step), ids.npy and targets.npy; default
    /// NAME-bench.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Largest arena binding the compiler may plan, in bytes.
    #[arg(long)]
    max_binding: Option<u64>,
}

#[derive(clap::Args)]
struct MatmulArgs {
    /// Matrix sizes n (a, b and c are n x n).
    #[arg(long, value_delimiter = ',', default_value = "1024,2048,4096")]
    sizes: Vec<usize>,
    /// Shapes `[B*]MxKxN[:at][:bt]` (e.g. `2048x768x2304`, `48*512x64x512:bt`); replaces --sizes.
    #[arg(long, value_delimiter = ',', value_parser = Shape::parse)]
    shapes: Vec<Shape>,
    /// Measured runs per size (after one warm-up run).
    #[arg(long, default_value_t = 20)]
    repeats: u32,
    /// Output elements checked per run from n = 2048 up (a random sample; all below).
    #[arg(long, default_value_t = 256)]
    samples: usize,
    /// Largest error, relative to max |reference|, that still counts as correct.
    #[arg(long, default_value_t = 1e-4)]
    tolerance: f64,
    /// Seed of the random inputs and the sample.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Largest arena binding the compiler may plan, in bytes (default: the compiler's).
    #[arg(long)]
    max_binding: Option<u64>,
    /// Force a matmul block shape, BMxBNxBKxTMxTN (e.g. 128x128x16x8x8); repeat to compare.
    #[arg(long = "tile", value_parser = Tile::parse)]
    tiles: Vec<Tile>,
    /// Force the number of K chunks (split-K; 1: none; one that does not divide K becomes the
    /// largest count below it that does); repeat to compare.
    #[arg(long = "split", value_parser = clap::value_parser!(u32).range(1..))]
    splits: Vec<u32>,
    /// Operands and product in f16 (f32 accumulation), as autocast runs a linear layer: the
    /// operands are rounded to f16 first, and the reference is their exact product.
    #[arg(long)]
    f16: bool,
    /// Compile for a target with cooperative matrices, so that f16 products run on tensor
    /// cores (as `sinter compile --tensor-cores`).
    #[arg(long)]
    tensor_cores: bool,
}

#[derive(clap::Args)]
struct RunArgs {
    /// A compiled artifact (.sart) or a program (.sir), compiled first.
    file: PathBuf,
    /// NAME=FILE.npy; inputs not given get random values (f32 in ±[0.25, 1], i32 zeros).
    #[arg(long = "input", value_name = "NAME=FILE")]
    inputs: Vec<String>,
    /// Measured runs (after one warm-up run).
    #[arg(long, default_value_t = 20)]
    repeats: u32,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Largest arena binding the compiler may plan for a .sir, in bytes.
    #[arg(long)]
    max_binding: Option<u64>,
}

/// Why the benchmark stopped.
enum Failure {
    /// A result was wrong (exit 1).
    Wrong(String),
    /// Anything else (exit 2).
    Error(String),
}

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::Error(e.to_string())
    }
}

/// The optimizer makes and frees millions of small e-graph and program allocations; mimalloc
/// took 28% off the GPT-2-small step's `optimize` against glibc's malloc (BENCHMARKS.md,
/// "Optimizer time").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let out = Output { json: cli.json };
    let result = match &cli.command {
        Command::Matmul(args) => matmul(args, &out),
        Command::Run(args) => run(args, &out),
        Command::Gpt(args) => gpt(args, &out),
        Command::Llama(args) => llama(args, &out),
        Command::Scaling(args) => scaling::scaling(args, &out),
        Command::Attention(args) => attention::attention(args, &out),
        Command::Generate(args) => generate::generate(args, &out),
        Command::Calibrate(args) => calibrate::calibrate(args, &out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Wrong(message)) => {
            eprintln!("sinter-bench: wrong result: {message}");
            ExitCode::from(1)
        }
        Err(Failure::Error(message)) => {
            eprintln!("sinter-bench: error: {message}");
            ExitCode::from(2)
        }
    }
}

/// Where results go: tables to stdout, or JSON lines to stdout and tables to stderr.
struct Output {
    json: bool,
}

impl Output {
    fn table(&self, line: &str) {
        if self.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }

    fn record(&self, fields: &[(&str, Json)]) {
        if self.json {
            let body: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("{}:{}", Json::Str(k.to_string()), v))
                .collect();
            println!("{{{}}}", body.join(","));
        }
    }
}

/// The few JSON values a result line holds.
enum Json {
    Str(String),
    Num(f64),
    Int(u64),
    Bool(bool),
    Null,
}

impl std::fmt::Display for Json {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Json::Str(s) => {
                f.write_str("\"")?;
                for c in s.chars() {
                    match c {
                        '"' => f.write_str("\\\"")?,
                        '\\' => f.write_str("\\\\")?,
                        c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
                        c => write!(f, "{c}")?,
                    }
                }
                f.write_str("\"")
            }
            Json::Num(x) if x.is_finite() => write!(f, "{x}"),
            Json::Num(_) | Json::Null => f.write_str("null"),
            Json::Int(n) => write!(f, "{n}"),
            Json::Bool(b) => write!(f, "{b}"),
        }
    }
}

fn opt_ms(ns: Option<f64>) -> Json {
    ns.map_or(Json::Null, |ns| Json::Num(ns / 1e6))
}

/// splitmix64: small, seeded, good enough for benchmark inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Never zero: magnitude in [0.25, 1], either sign.
    fn nonzero(&mut self) -> f32 {
        let magnitude = 0.25 + 0.75 * self.unit();
        let sign = if self.next() & 1 == 0 { 1.0 } else { -1.0 };
        (sign * magnitude) as f32
    }

    fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n.max(1)
    }
}

fn choice() -> Result<AdapterChoice, Failure> {
    Ok(AdapterChoice {
        profiling: true,
        ..AdapterChoice::from_env()?
    })
}

fn compile(src: &str, file: &str, max_binding: Option<u64>) -> Result<Artifact, Failure> {
    compile_with_tile(src, file, max_binding, None, None, false)
}

fn compile_with_tile(
    src: &str,
    file: &str,
    max_binding: Option<u64>,
    tile: Option<Tile>,
    split: Option<u32>,
    tensor_cores: bool,
) -> Result<Artifact, Failure> {
    let graph = sinter_ir::text::parse(src).map_err(|d| Failure::Error(d.render(file, src)))?;
    let options = sinter_compiler::Options {
        target: bench_target(max_binding, tensor_cores),
        matmul: sinter_compiler::matmul::Forced {
            tile,
            splits: split.map(|s| s as usize),
        },
        ..Default::default()
    };
    Ok(sinter_compiler::compile(&graph, &options)?.artifact)
}

/// The target benchmarks compile for: the portable one with the binding limit `max_binding`
/// where given, and cooperative matrices where `tensor_cores`.
fn bench_target(max_binding: Option<u64>, tensor_cores: bool) -> sinter_compiler::Target {
    let args = sinter_cli::flags::TargetArgs {
        max_binding_size: max_binding,
        tensor_cores,
        ..Default::default()
    };
    args.target()
        .expect("the portable target with these flags is valid")
}

/// Nanoseconds as milliseconds with four significant digits.
fn ms(ns: f64) -> String {
    let ms = ns / 1e6;
    let digits = if ms >= 100.0 {
        1
    } else if ms >= 1.0 || ms.is_nan() || ms <= 0.0 {
        3
    } else {
        // 0.01234 has its first digit at 10^-2: 2 + 3 decimals.
        (3 - ms.log10().floor() as i64).clamp(3, 9) as usize
    };
    format!("{ms:.digits$}")
}

fn seconds(since: Instant) -> f64 {
    since.elapsed().as_secs_f64()
}

// ---------------------------------------------------------------------------------------------
// matmul

/// One matmul shape to time: `batch` products of `[m, k]` by `[k, n]`, either operand possibly a
/// transposed view of its storage.
#[derive(Clone, Debug)]
struct Shape {
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    at: bool,
    bt: bool,
    /// `Some(n)` for a square size from `--sizes` (its JSON `n` stays a number).
    square: Option<usize>,
}

impl Shape {
    fn square(n: usize) -> Shape {
        Shape {
            batch: 1,
            m: n,
            k: n,
            n,
            at: false,
            bt: false,
            square: Some(n),
        }
    }

    fn parse(text: &str) -> Result<Shape, String> {
        let mut parts = text.split(':');
        let dims = parts.next().unwrap_or("");
        let (batch, dims) = match dims.split_once('*') {
            Some((b, rest)) => (
                b.parse::<usize>()
                    .map_err(|_| format!("bad batch in `{text}`"))?,
                rest,
            ),
            None => (1, dims),
        };
        let nums: Vec<usize> = dims
            .split('x')
            .map(|d| {
                d.parse::<usize>()
                    .map_err(|_| format!("`{d}` in `{text}` is not a number"))
            })
            .collect::<Result<_, _>>()?;
        let [m, k, n] = nums[..] else {
            return Err(format!("`{text}` needs MxKxN"));
        };
        if batch == 0 || m == 0 || k == 0 || n == 0 {
            return Err(format!("`{text}`: extents must be positive"));
        }
        let (mut at, mut bt) = (false, false);
        for flag in parts {
            match flag {
                "at" => at = true,
                "bt" => bt = true,
                other => return Err(format!("`{other}` in `{text}`: flags are `at` and `bt`")),
            }
        }
        Ok(Shape {
            batch,
            m,
            k,
            n,
            at,
            bt,
            square: None,
        })
    }

    fn label(&self) -> String {
        if let Some(n) = self.square {
            return n.to_string();
        }
        let mut l = String::new();
        if self.batch > 1 {
            l.push_str(&format!("{}*", self.batch));
        }
        l.push_str(&format!("{}x{}x{}", self.m, self.k, self.n));
        if self.at {
            l.push_str(":at");
        }
        if self.bt {
            l.push_str(":bt");
        }
        l
    }

    /// The program: stored operands of `dtype`, transposed into `[.., m, k]` and `[.., k, n]`
    /// views.
    fn program(&self, dtype: DType) -> String {
        let lead = if self.batch > 1 {
            format!("{}, ", self.batch)
        } else {
            String::new()
        };
        let (a_dims, b_dims) = (
            if self.at {
                [self.k, self.m]
            } else {
                [self.m, self.k]
            },
            if self.bt {
                [self.n, self.k]
            } else {
                [self.k, self.n]
            },
        );
        let view = |name: &str, t: bool| {
            if t {
                format!("transpose({name}, dim0=-2, dim1=-1)")
            } else {
                name.to_string()
            }
        };
        format!(
            "graph matmul {{\n  input a: {dtype}[{lead}{}, {}]\n  input b: {dtype}[{lead}{}, {}]\n  \
             c = matmul({}, {})\n  output c\n}}\n",
            a_dims[0],
            a_dims[1],
            b_dims[0],
            b_dims[1],
            view("a", self.at),
            view("b", self.bt)
        )
    }

    /// `a[batch][i][kk]` of the logical operand, from the stored data.
    fn a_at(&self, a: &[f32], bi: usize, i: usize, kk: usize) -> f64 {
        let base = bi * self.m * self.k;
        f64::from(if self.at {
            a[base + kk * self.m + i]
        } else {
            a[base + i * self.k + kk]
        })
    }

    fn b_at(&self, b: &[f32], bi: usize, kk: usize, j: usize) -> f64 {
        let base = bi * self.k * self.n;
        f64::from(if self.bt {
            b[base + j * self.k + kk]
        } else {
            b[base + kk * self.n + j]
        })
    }

    fn flops(&self) -> f64 {
        2.0 * (self.batch * self.m * self.k * self.n) as f64
    }

    fn bytes(&self, dtype: DType) -> f64 {
        let elements = self.batch * (self.m * self.k + self.k * self.n + self.m * self.n);
        (elements * dtype.size_bytes()) as f64
    }
}

/// Output elements checked against a reference computed in f64.
struct Reference {
    /// (row-major index into c, exact value).
    points: Vec<(usize, f64)>,
    max_abs: f64,
}

impl Reference {
    /// Every element (square n below [`SAMPLE_FROM`], or fewer than 2^28 multiply-adds) or
    /// `samples` random ones plus two corners.
    fn new(s: &Shape, a: &[f32], b: &[f32], samples: usize, rng: &mut Rng) -> Reference {
        let total = s.batch * s.m * s.n;
        let all = match s.square {
            Some(n) => n < SAMPLE_FROM,
            None => total * s.k < 1 << 28,
        };
        let dot = |idx: usize| {
            let (bi, r) = (idx / (s.m * s.n), idx % (s.m * s.n));
            let (i, j) = (r / s.n, r % s.n);
            (0..s.k)
                .map(|kk| s.a_at(a, bi, i, kk) * s.b_at(b, bi, kk, j))
                .sum::<f64>()
        };
        let at: Vec<usize> = if all {
            (0..total).collect()
        } else {
            let mut at = vec![0, total - 1];
            at.extend((0..samples).map(|_| rng.below(total)));
            at
        };
        let points: Vec<(usize, f64)> = at.into_iter().map(|idx| (idx, dot(idx))).collect();
        let max_abs = points.iter().fold(0f64, |m, &(_, v)| m.max(v.abs()));
        Reference { points, max_abs }
    }

    /// Largest |got - exact| over the checked elements, relative to max |exact|.
    fn error(&self, got: &[f32]) -> f64 {
        let worst = self.points.iter().fold(0f64, |m, &(idx, exact)| {
            let e = (f64::from(got[idx]) - exact).abs();
            if e.is_nan() { f64::INFINITY } else { m.max(e) }
        });
        worst / self.max_abs.max(f64::MIN_POSITIVE)
    }
}

fn f32_data<'a>(outputs: &'a sinter_runtime::Outputs, name: &str) -> Option<&'a [f32]> {
    match &outputs.get(name)?.data {
        TensorData::F32(v) => Some(v),
        TensorData::I32(_) | TensorData::F16(_) => None,
    }
}

fn matmul(args: &MatmulArgs, out: &Output) -> Result<(), Failure> {
    let mut wrong = Vec::new();
    let tiles: Vec<Option<Tile>> = if args.tiles.is_empty() {
        vec![None]
    } else {
        args.tiles.iter().copied().map(Some).collect()
    };
    let shapes: Vec<Shape> = if args.shapes.is_empty() {
        if args.sizes.contains(&0) {
            return Err(Failure::Error("sizes must be positive".into()));
        }
        args.sizes.iter().map(|&n| Shape::square(n)).collect()
    } else {
        args.shapes.clone()
    };
    let splits: Vec<Option<u32>> = if args.splits.is_empty() {
        vec![None]
    } else {
        args.splits.iter().copied().map(Some).collect()
    };
    let mut runs: Vec<(Shape, Option<Tile>, Option<u32>)> = Vec::new();
    for s in &shapes {
        for &t in &tiles {
            for &split in &splits {
                runs.push((s.clone(), t, split));
            }
        }
    }
    for (i, (shape, tile, split)) in runs.into_iter().enumerate() {
        let label = shape.label();
        let dtype = if args.f16 { DType::F16 } else { DType::F32 };
        let src = shape.program(dtype);
        let t = Instant::now();
        let artifact = compile_with_tile(
            &src,
            "matmul.sir",
            args.max_binding,
            tile,
            split,
            args.tensor_cores,
        )?;
        let compile_s = seconds(t);
        let tile_name = tile.map_or_else(|| "default".to_string(), |t| t.to_string());
        let split_name = split.map_or_else(|| "default".to_string(), |s| s.to_string());
        let arenas = artifact.arenas.len();
        let t = Instant::now();
        let mut session = Session::load_with(artifact, &choice()?)?;
        let load_s = seconds(t);

        let mut rng = Rng(args.seed ^ (shape.m as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        // f16 operands: the values rounded to f16, so that the reference is their product
        let round = |x: f32| match dtype {
            DType::F16 => half::f16::from_f32(x).to_f32(),
            _ => x,
        };
        let random = |rng: &mut Rng, len: usize| {
            (0..len).map(|_| round(rng.nonzero())).collect::<Vec<f32>>()
        };
        let a = random(&mut rng, shape.batch * shape.m * shape.k);
        let b = random(&mut rng, shape.batch * shape.k * shape.n);
        let t = Instant::now();
        let reference = Reference::new(&shape, &a, &b, args.samples.max(256), &mut rng);
        let reference_s = seconds(t);
        let lead: Vec<usize> = if shape.batch > 1 {
            vec![shape.batch]
        } else {
            vec![]
        };
        let dims = |x: [usize; 2]| lead.iter().copied().chain(x).collect::<Vec<usize>>();
        let tensor = |shape: Vec<usize>, data: Vec<f32>| match dtype {
            DType::F16 => {
                HostTensor::f16(shape, data.into_iter().map(half::f16::from_f32).collect())
            }
            _ => HostTensor::f32(shape, data),
        };
        let a = tensor(
            dims(if shape.at {
                [shape.k, shape.m]
            } else {
                [shape.m, shape.k]
            }),
            a,
        );
        let b = tensor(
            dims(if shape.bt {
                [shape.n, shape.k]
            } else {
                [shape.k, shape.n]
            }),
            b,
        );

        let mut worst = 0f64;
        let mut checked_runs = 0u32;
        let profile = session.profile_each(
            &[("a", &a), ("b", &b)],
            &ProfileOptions::new(args.repeats),
            |_, outputs| {
                let err = match outputs.get("c").map(|c| &c.data) {
                    Some(TensorData::F32(c)) => reference.error(c),
                    Some(TensorData::F16(c)) => {
                        reference.error(&c.iter().map(|x| x.to_f32()).collect::<Vec<f32>>())
                    }
                    _ => f64::INFINITY,
                };
                worst = worst.max(err);
                checked_runs += 1;
            },
        )?;
        let flops = shape.flops();
        let peak = if dtype == DType::F16 && args.tensor_cores {
            PEAK_TENSOR_FLOPS
        } else {
            PEAK_FLOPS
        };
        let flop_floor = flops / peak * 1e9;
        let byte_floor = shape.bytes(dtype) / PEAK_BYTES * 1e9;
        let floor_ns = flop_floor.max(byte_floor);
        let kernel_ns = profile.busy_ns;
        let tflops = flops / kernel_ns / 1e3;
        let ok = worst <= args.tolerance;
        if i == 0 {
            eprintln!("# {} ({})", profile.adapter, profile.mode);
            out.table(&format!(
                "{:>18}  {:>10}  {:>8}  {:>9}  {:>9}  {:>9}  {:>6}  {:>11}  {:>8}",
                "n",
                "kernel ms",
                "TFLOP/s",
                "gpu ms",
                "wall ms",
                "floor ms",
                "%peak",
                "max rel err",
                "checked"
            ));
        }
        out.table(&format!(
            "{:>18}  {:>10}  {:>8.3}  {:>9}  {:>9}  {:>9}  {:>6.1}  {:>11.2e}  {:>8}",
            label,
            ms(kernel_ns),
            tflops,
            ms(profile.gpu_ns),
            ms(profile.wall_ns.unwrap_or(f64::NAN)),
            ms(floor_ns),
            100.0 * floor_ns / kernel_ns,
            worst,
            format!("{}x{}", reference.points.len(), checked_runs),
        ));
        eprintln!(
            "#   {label} tile {tile_name} split {split_name}: {} dispatch(es), {} kernel(s), {arenas} arena(s); compile {compile_s:.2} s, \
             load {load_s:.2} s, reference {reference_s:.2} s; floor: FLOPs {} ms, bytes {} ms",
            profile.dispatches.len(),
            profile.kernels.len(),
            ms(flop_floor),
            ms(byte_floor),
        );
        out.record(&[
            ("bench", Json::Str("matmul".into())),
            ("impl", Json::Str("sinter".into())),
            ("dtype", Json::Str(dtype.to_string())),
            ("tensor_cores", Json::Bool(args.tensor_cores)),
            (
                "n",
                shape
                    .square
                    .map_or_else(|| Json::Str(label.clone()), |n| Json::Int(n as u64)),
            ),
            ("batch", Json::Int(shape.batch as u64)),
            ("m", Json::Int(shape.m as u64)),
            ("k", Json::Int(shape.k as u64)),
            ("cols", Json::Int(shape.n as u64)),
            ("tile", Json::Str(tile_name.clone())),
            ("split", Json::Str(split_name.clone())),
            ("repeats", Json::Int(u64::from(args.repeats))),
            ("kernel_ms", Json::Num(kernel_ns / 1e6)),
            ("gpu_ms", Json::Num(profile.gpu_ns / 1e6)),
            ("wall_ms", opt_ms(profile.wall_ns)),
            ("tflops", Json::Num(tflops)),
            ("floor_ms", Json::Num(floor_ns / 1e6)),
            ("flop_floor_ms", Json::Num(flop_floor / 1e6)),
            ("byte_floor_ms", Json::Num(byte_floor / 1e6)),
            ("dispatches", Json::Int(profile.dispatches.len() as u64)),
            ("max_rel_err", Json::Num(worst)),
            ("checked", Json::Int(reference.points.len() as u64)),
            ("ok", Json::Bool(ok)),
            ("timestamps", Json::Str(format!("{:?}", profile.mode))),
            ("adapter", Json::Str(profile.adapter.clone())),
        ]);
        if !ok {
            wrong.push(format!(
                "{label}: max error {worst:.3e} of max |ref| exceeds {:e}",
                args.tolerance
            ));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(Failure::Wrong(wrong.join("; ")))
    }
}

// ---------------------------------------------------------------------------------------------
// run

fn load_artifact(path: &Path, max_binding: Option<u64>) -> Result<Artifact, Failure> {
    if path.extension().is_some_and(|e| e == "sir") {
        let src = std::fs::read_to_string(path)
            .map_err(|e| Failure::Error(format!("cannot read {}: {e}", path.display())))?;
        compile(&src, &path.display().to_string(), max_binding)
    } else {
        Ok(sinter_runtime::read_artifact(path)?)
    }
}

fn run(args: &RunArgs, out: &Output) -> Result<(), Failure> {
    let t = Instant::now();
    let artifact = load_artifact(&args.file, args.max_binding)?;
    let prepare_s = seconds(t);
    let mut given: Vec<(String, HostTensor)> = Vec::new();
    for spec in &args.inputs {
        let Some((name, file)) = spec
            .split_once('=')
            .filter(|(n, f)| !n.is_empty() && !f.is_empty())
        else {
            return Err(Failure::Error(format!(
                "--input expects NAME=FILE.npy, got `{spec}`"
            )));
        };
        given.push((name.to_string(), read_npy(Path::new(file))?));
    }
    let mut rng = Rng(args.seed);
    let mut generated = Vec::new();
    for slot in artifact.slots(sinter_ir::artifact::Role::Input) {
        if given.iter().any(|(n, _)| n == &slot.name) {
            continue;
        }
        let shape = slot.ty.shape.clone();
        let count: usize = shape.iter().product();
        let tensor = match slot.ty.dtype {
            DType::F32 => HostTensor::f32(shape, (0..count).map(|_| rng.nonzero()).collect()),
            DType::I32 => HostTensor::i32(shape, vec![0; count]),
            DType::F16 => HostTensor::f16(
                shape,
                (0..count)
                    .map(|_| half::f16::from_f32(rng.nonzero()))
                    .collect(),
            ),
        };
        generated.push(slot.name.clone());
        given.push((slot.name.clone(), tensor));
    }
    if !generated.is_empty() {
        eprintln!("# random inputs: {}", generated.join(", "));
    }
    let t = Instant::now();
    let mut session = Session::load_with(artifact, &choice()?)?;
    let load_s = seconds(t);
    let feeds: Vec<(&str, &HostTensor)> = given.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let profile = session.profile(&feeds, args.repeats)?;
    eprintln!(
        "# {}: {} in {prepare_s:.2} s, loaded in {load_s:.2} s",
        args.file.display(),
        if args.file.extension().is_some_and(|e| e == "sir") {
            "compiled"
        } else {
            "read"
        },
    );
    out.table(&profile.to_string());
    record_run(&args.file, &profile, out);
    Ok(())
}

fn record_run(file: &Path, p: &Profile, out: &Output) {
    let file = file.display().to_string();
    let share = |ns: f64| if p.gpu_ns > 0.0 { ns / p.gpu_ns } else { 0.0 };
    for k in &p.kernels {
        out.record(&[
            ("bench", Json::Str("run".into())),
            ("file", Json::Str(file.clone())),
            ("kernel", Json::Str(k.name.clone())),
            ("pattern", Json::Str(k.pattern.clone())),
            ("dispatches", Json::Int(k.dispatches as u64)),
            ("median_ms", Json::Num(k.median_ns / 1e6)),
            ("share", Json::Num(share(k.median_ns))),
        ]);
    }
    out.record(&[
        ("bench", Json::Str("run".into())),
        ("file", Json::Str(file)),
        ("kernel", Json::Null),
        ("repeats", Json::Int(u64::from(p.repeats))),
        ("dispatches", Json::Int(p.dispatches.len() as u64)),
        ("gpu_ms", Json::Num(p.gpu_ns / 1e6)),
        ("busy_ms", Json::Num(p.busy_ns / 1e6)),
        ("wall_ms", opt_ms(p.wall_ns)),
        ("timestamps", Json::Str(format!("{:?}", p.mode))),
        ("adapter", Json::Str(p.adapter.clone())),
    ]);
}

// ---------------------------------------------------------------------------------------------
// gpt

fn gpt(args: &GptArgs, out: &Output) -> Result<(), Failure> {
    use sinter_cli::gpt::program;
    let cfg = args.shape.config(args.context, args.batch);
    cfg.check().map_err(Failure::Error)?;
    let bench = StepBench {
        name: "gpt",
        src: program(&cfg),
        ints: vec![
            ("layers", cfg.layers),
            ("width", cfg.width),
            ("heads", cfg.heads),
            ("context", cfg.context),
            ("batch", cfg.batch),
            ("vocab", cfg.vocab),
        ],
        floats: vec![("lr", 3e-4), ("weight_decay", 0.1)],
        params: cfg.params(),
    };
    step_bench(&bench, &args.step, out)
}

fn llama(args: &LlamaArgs, out: &Output) -> Result<(), Failure> {
    use sinter_cli::llama::{LlamaConfig, program};
    let cfg = LlamaConfig {
        layers: args.layers,
        width: args.width,
        heads: args.heads,
        kv_heads: args.kv_heads,
        mlp: args.mlp,
        vocab: args.vocab,
        context: args.context,
        batch: args.batch,
        rope_theta: args.rope_theta,
        lr: args.lr,
        weight_decay: args.weight_decay,
        ..LlamaConfig::SMOLLM2_135M
    };
    cfg.check().map_err(Failure::Error)?;
    let bench = StepBench {
        name: "llama",
        src: program(&cfg),
        ints: vec![
            ("layers", cfg.layers),
            ("width", cfg.width),
            ("heads", cfg.heads),
            ("kv_heads", cfg.kv_heads),
            ("mlp", cfg.mlp),
            ("context", cfg.context),
            ("batch", cfg.batch),
            ("vocab", cfg.vocab),
        ],
        floats: vec![
            ("rope_theta", cfg.rope_theta),
            ("norm_eps", cfg.norm_eps),
            ("lr", cfg.lr),
            ("weight_decay", cfg.weight_decay),
        ],
        params: cfg.params(),
    };
    step_bench(&bench, &args.step, out)
}

/// A generated training step to compile and time.
struct StepBench {
    /// The bench's name: the JSON lines' `bench`, the program's file name and default folder.
    name: &'static str,
    src: String,
    /// The model's shape (`batch`, `context` and `vocab` among them), for the table, the JSON
    /// line and config.json.
    ints: Vec<(&'static str, usize)>,
    /// Its other settings, for config.json.
    floats: Vec<(&'static str, f64)>,
    params: usize,
}

impl StepBench {
    fn int(&self, name: &str) -> usize {
        self.ints
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    }

    /// config.json, for the PyTorch scripts.
    fn config(&self) -> String {
        let ints = self.ints.iter().map(|(k, v)| format!("\"{k}\":{v}"));
        let floats = self.floats.iter().map(|(k, v)| format!("\"{k}\":{v:?}"));
        format!("{{{}}}\n", ints.chain(floats).collect::<Vec<_>>().join(","))
    }
}

/// Compiles `b`'s program; unless `--compile-only`, trains it on one random batch: the first
/// two losses, the wall time per step and the kernel profile. Writes what the PyTorch scripts
/// read into the output folder.
fn step_bench(b: &StepBench, args: &StepArgs, out: &Output) -> Result<(), Failure> {
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}-bench", b.name)));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Failure::Error(format!("cannot create {}: {e}", dir.display())))?;
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes)
            .map_err(|e| Failure::Error(format!("cannot write {}: {e}", path.display())))
    };
    let file = format!("{}.sir", b.name);
    write(&file, b.src.as_bytes())?;
    write("config.json", b.config().as_bytes())?;

    let t = Instant::now();
    let graph =
        sinter_ir::text::parse(&b.src).map_err(|d| Failure::Error(d.render(&file, &b.src)))?;
    let options = sinter_compiler::Options {
        target: bench_target(args.max_binding, args.tensor_cores),
        optimize: !args.no_opt,
        attention: args.attention.into(),
        flash: sinter_compiler::flash::variant::Choices {
            tensor_cores: args.tensor_cores,
            merge_backward: args.flash_backward.merge(),
            ..Default::default()
        },
        precision: args.precision.into(),
        ..Default::default()
    };
    let compiled = sinter_compiler::compile(&graph, &options)?;
    let compile_s = seconds(t);
    let optimize_s = compiled
        .optimize
        .as_ref()
        .map_or(0.0, |r| r.total_time.as_secs_f64());
    let artifact = compiled.artifact;
    use sinter_cli::flags::Attention;
    let impl_name = match (args.no_opt, args.attention, args.tensor_cores) {
        (true, _, _) => "sinter-no-opt",
        (false, Attention::Auto, false) => "sinter",
        (false, Attention::Auto, true) => "sinter-tc",
        (false, Attention::Flash, false) => "sinter-flash",
        (false, Attention::Flash, true) => "sinter-flash-tc",
        (false, Attention::Unfused, _) => "sinter-unfused",
    };
    let impl_name = match args.precision {
        sinter_cli::flags::Precision::F32 => impl_name.to_string(),
        sinter_cli::flags::Precision::Mixed => format!("{impl_name}-mixed"),
    };
    let shape: Vec<String> = b.ints.iter().map(|(k, v)| format!("{k} {v}")).collect();
    out.table(&format!(
        "# {} ({}; {:.1} M params): compiled in {compile_s:.2} s (optimize {optimize_s:.2} s), {} kernels, {} dispatches, arena {:.1} MiB",
        b.name,
        shape.join(", "),
        b.params as f64 / 1e6,
        artifact.kernels.len(),
        artifact.dispatches.len(),
        artifact.memory.peak_bytes as f64 / (1 << 20) as f64
    ));
    if let Some(r) = &compiled.optimize {
        out.table(&format!("{r}"));
    }
    let mut fields = vec![
        ("bench", Json::Str(b.name.into())),
        ("impl", Json::Str(impl_name.clone())),
    ];
    fields.extend(b.ints.iter().map(|&(k, v)| (k, Json::Int(v as u64))));
    fields.extend([
        ("compile_s", Json::Num(compile_s)),
        ("optimize_s", Json::Num(optimize_s)),
        ("kernels", Json::Int(artifact.kernels.len() as u64)),
        ("dispatches", Json::Int(artifact.dispatches.len() as u64)),
        ("arena_bytes", Json::Int(artifact.memory.peak_bytes)),
    ]);
    if args.compile_only {
        out.record(&fields);
        return Ok(());
    }

    // the batch: random tokens, each target the next token
    let mut rng = Rng(7);
    let (shape, vocab) = (vec![b.int("batch"), b.int("context")], b.int("vocab"));
    let n = shape[0] * shape[1];
    let ids: Vec<i32> = (0..n).map(|_| rng.below(vocab) as i32).collect();
    let targets: Vec<i32> = (0..n).map(|_| rng.below(vocab) as i32).collect();
    let ids = HostTensor::i32(shape.clone(), ids);
    let targets = HostTensor::i32(shape, targets);
    sinter_runtime::io::write_npy(&dir.join("ids.npy"), &ids)?;
    sinter_runtime::io::write_npy(&dir.join("targets.npy"), &targets)?;

    let t = Instant::now();
    let mut session = Session::load_with(artifact, &choice()?)?;
    let load_s = seconds(t);
    let params = |session: &Session| -> Result<Vec<(String, HostTensor)>, Failure> {
        Ok(session
            .weights()?
            .into_iter()
            .filter(|(name, _)| {
                graph
                    .lookup(name)
                    .is_some_and(|v| matches!(graph.value(v).def, sinter_ir::ValueDef::Param(_)))
            })
            .collect())
    };
    sinter_runtime::io::write_safetensors(&dir.join("init.safetensors"), &params(&session)?)?;
    let feeds = [("ids", &ids), ("targets", &targets)];
    let loss = |o: &sinter_runtime::Outputs| -> f64 {
        f32_data(o, "loss").map_or(f64::NAN, |v| f64::from(v[0]))
    };
    let loss0 = loss(&session.run_reading(&feeds, &["loss"])?);
    sinter_runtime::io::write_safetensors(&dir.join("step1.safetensors"), &params(&session)?)?;
    let loss1 = loss(&session.run_reading(&feeds, &["loss"])?);
    session.run_reading(&feeds, &["loss"])?;
    let t = Instant::now();
    for _ in 1..args.steps {
        session.run_reading(&feeds, &[])?;
    }
    let last = loss(&session.run_reading(&feeds, &["loss"])?);
    let step_ms = seconds(t) * 1e3 / f64::from(args.steps.max(1));
    let profile = session.profile(&feeds, args.profile.max(1))?;
    out.table(&format!(
        "# loaded in {load_s:.2} s; loss {loss0:.6} then {loss1:.6} ({} steps later {last:.4}); {step_ms:.3} ms per step (wall), {:.3} ms of kernels (GPU timestamps)",
        args.steps,
        profile.gpu_ns / 1e6
    ));
    out.table(&pattern_table(&profile));
    out.table(&profile.to_string());
    fields.extend([
        ("loss0", Json::Num(loss0)),
        ("loss1", Json::Num(loss1)),
        ("loss_last", Json::Num(last)),
        ("steps", Json::Int(u64::from(args.steps))),
        ("step_ms", Json::Num(step_ms)),
        ("gpu_ms", Json::Num(profile.gpu_ns / 1e6)),
        ("busy_ms", Json::Num(profile.busy_ns / 1e6)),
        ("adapter", Json::Str(profile.adapter.clone())),
    ]);
    out.record(&fields);
    Ok(())
}

/// GPU time by kernel pattern, largest first.
fn pattern_table(p: &Profile) -> String {
    let mut by: Vec<(String, usize, f64)> = Vec::new();
    for k in &p.kernels {
        match by.iter_mut().find(|(name, _, _)| *name == k.pattern) {
            Some(e) => {
                e.1 += k.dispatches;
                e.2 += k.median_ns;
            }
            None => by.push((k.pattern.clone(), k.dispatches, k.median_ns)),
        }
    }
    by.sort_by(|a, b| b.2.total_cmp(&a.2));
    let mut s = String::from("pattern              dispatches   ms       share\n");
    for (name, d, ns) in by {
        let share = if p.gpu_ns > 0.0 { ns / p.gpu_ns } else { 0.0 };
        s.push_str(&format!(
            "{name:<20} {d:>10}   {:<8} {:>5.1}%\n",
            ms(ns),
            share * 100.0
        ));
    }
    s
}
