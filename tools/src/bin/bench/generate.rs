//! `sinter-bench generate`: the speed of text generation with a cache. A language model (the
//! GPT-2-style program of `sinter_cli::gpt`, by default GPT-2 small's shape with context 1024 and
//! vocabulary 2048, or any forward or training program given with `--program`) is compiled into
//! its generation artifact (the prefill and one-token step programs the compiler derives, one
//! per batch size) and run by `sinter_runtime::Generator` with its initializers' random
//! weights: a prompt of `--prompt-tokens` random tokens through the prefill (wall time, median
//! of `--repeats`), then `--new-tokens` greedy tokens, one submission and one logits readback
//! per token (wall time per token and tokens per second over the batch, median of the repeats).
//! Every run checks the step program against the prefill: the logits after 16 prompt tokens fed
//! one by one through the step equal those of the prefill over the same 16. `--profile` adds
//! the GPU time of one step by kernel pattern (timestamps). `bench/generate_torch.py` times the
//! same shapes in PyTorch.

use std::path::PathBuf;
use std::time::Instant;

use sinter_cli::flags::Attention;
use sinter_cli::gpt::program;
use sinter_compiler::generation::compile_generation;
use sinter_ir::decode::DecodeSpec;
use sinter_runtime::io::HostTensor;
use sinter_runtime::{Generator, Sampler, Sampling};

use super::{Failure, GptShape, Json, Output, Rng, choice, ms, pattern_table, seconds};

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// A forward or training program (token ids `ids` [B, T], logits `logits`) instead of the
    /// GPT-2-style one; its context must hold the prompt and the new tokens.
    #[arg(long, value_name = "FILE.sir")]
    program: Option<PathBuf>,
    #[command(flatten)]
    shape: GptShape,
    #[arg(long, default_value_t = 1024)]
    context: usize,
    /// Tokens of the prompt (the prefill program's length).
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens generated after the prompt.
    #[arg(long, default_value_t = 256)]
    new_tokens: usize,
    /// Batch sizes (sequences generated together), one artifact each.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    batch: Vec<usize>,
    /// Timed runs of the prefill and of the decoding (after one untimed run).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Which attention kernels the optimizer may choose (as `sinter compile --attention`).
    #[arg(long, value_enum, default_value_t = Attention::Auto)]
    attention: Attention,
    /// Compile without the e-graph optimizer.
    #[arg(long)]
    no_opt: bool,
    /// Largest arena binding the compiler may plan, in bytes.
    #[arg(long)]
    max_binding: Option<u64>,
    /// Also time one step's kernels with GPU timestamps (by pattern, then by kernel).
    #[arg(long)]
    profile: bool,
}

pub fn generate(args: &GenerateArgs, out: &Output) -> Result<(), Failure> {
    let (name, src) = match &args.program {
        Some(path) => {
            let src = std::fs::read_to_string(path)
                .map_err(|e| Failure::Error(format!("cannot read {}: {e}", path.display())))?;
            let stem = path
                .file_stem()
                .map_or("program".into(), |s| s.to_string_lossy().into_owned());
            (stem, src)
        }
        None => {
            let cfg = args.shape.config(args.context, 1);
            cfg.check().map_err(Failure::Error)?;
            (format!("gpt{}x{}", cfg.layers, cfg.width), program(&cfg))
        }
    };
    let graph = sinter_ir::text::parse(&src).map_err(|d| Failure::Error(d.render(&name, &src)))?;
    let options = sinter_compiler::Options {
        target: super::bench_target(args.max_binding, false),
        optimize: !args.no_opt,
        attention: args.attention.into(),
        ..Default::default()
    };
    let impl_name = match (args.no_opt, args.attention) {
        (true, _) => "sinter-no-opt",
        (false, Attention::Auto) => "sinter",
        (false, Attention::Flash) => "sinter-flash",
        (false, Attention::Unfused) => "sinter-unfused",
    };
    for &batch in &args.batch {
        let spec = DecodeSpec::sized(batch, args.prompt_tokens);
        let t = Instant::now();
        let compiled = compile_generation(
            &graph,
            &spec,
            &Default::default(),
            &options,
            &mut Vec::new(),
        )
        .map_err(|e| Failure::Error(e.to_string()))?;
        let compile_s = seconds(t);
        let info = compiled.decoder.info.clone();
        let context = info.context as usize;
        if args.prompt_tokens + args.new_tokens > context {
            return Err(Failure::Error(format!(
                "{} prompt tokens and {} new ones pass the context {context}: the window would \
                 slide (raise --context)",
                args.prompt_tokens, args.new_tokens
            )));
        }
        let artifact = compiled.artifact;
        let prefill_dispatches = artifact
            .generation
            .as_ref()
            .map_or(0, |g| g.prefill.dispatches.len());
        let step_dispatches = artifact.dispatches.len();
        out.table(&format!(
            "# {name} batch {batch}: context {context}, vocabulary {}, {} caches; compiled in \
             {compile_s:.2} s; prefill {prefill_dispatches} dispatches, step {step_dispatches} \
             dispatches",
            info.vocab,
            info.caches.len()
        ));
        let t = Instant::now();
        let mut generator = Generator::load_with(artifact, &choice()?)?;
        let load_s = seconds(t);
        let mut rng = Rng(11 + batch as u64);
        let vocab = info.vocab as usize;
        let prompts: Vec<Vec<i32>> = (0..batch)
            .map(|_| {
                (0..args.prompt_tokens)
                    .map(|_| rng.below(vocab) as i32)
                    .collect()
            })
            .collect();
        let error = check_steps(&mut generator, &prompts)?;

        let mut greedy = Sampler::new(Sampling::greedy())?;
        let mut prefill_ms = Vec::new();
        let mut token_ms = Vec::new();
        for run in 0..=args.repeats {
            let t = Instant::now();
            let mut logits = generator.start(&prompts)?;
            let prefill = seconds(t) * 1e3;
            let t = Instant::now();
            for _ in 1..args.new_tokens {
                let next = logits
                    .iter()
                    .map(|row| greedy.choose(row).map(|i| i as i32))
                    .collect::<Result<Vec<i32>, _>>()?;
                logits = generator.push(&next)?;
            }
            let per_token = seconds(t) * 1e3 / (args.new_tokens.max(2) - 1) as f64;
            if run > 0 {
                prefill_ms.push(prefill);
                token_ms.push(per_token);
            }
        }
        let prefill_ms = median(&mut prefill_ms);
        let token_ms = median(&mut token_ms);
        let tokens_per_s = batch as f64 * 1e3 / token_ms;
        let prefill_tokens_per_s = (batch * args.prompt_tokens) as f64 * 1e3 / prefill_ms;
        out.table(&format!(
            "loaded in {load_s:.2} s; prefill of {} tokens x {batch}: {} ms ({prefill_tokens_per_s:.0} \
             tokens/s); decoding: {} ms per step, {tokens_per_s:.1} tokens/s; steps against the \
             prefill: {error:.2e}",
            args.prompt_tokens,
            ms(prefill_ms * 1e6),
            ms(token_ms * 1e6),
        ));
        let mut fields = vec![
            ("bench", Json::Str("generate".into())),
            ("impl", Json::Str(impl_name.into())),
            ("model", Json::Str(name.clone())),
            ("batch", Json::Int(batch as u64)),
            ("context", Json::Int(context as u64)),
            ("vocab", Json::Int(info.vocab)),
            ("prompt_tokens", Json::Int(args.prompt_tokens as u64)),
            ("new_tokens", Json::Int(args.new_tokens as u64)),
            ("compile_s", Json::Num(compile_s)),
            ("prefill_dispatches", Json::Int(prefill_dispatches as u64)),
            ("step_dispatches", Json::Int(step_dispatches as u64)),
            ("prefill_ms", Json::Num(prefill_ms)),
            ("token_ms", Json::Num(token_ms)),
            ("tokens_per_s", Json::Num(tokens_per_s)),
            ("check_error", Json::Num(error)),
        ];
        if args.profile {
            let (_, step) = generator.sessions_mut();
            let ids = HostTensor::i32(vec![batch, 1], vec![1; batch]);
            let pos = HostTensor::i32(vec![], vec![args.prompt_tokens as i32]);
            let feeds = [(info.ids.as_str(), &ids), (info.position.as_str(), &pos)];
            let profile = step.profile(&feeds, 20)?;
            out.table(&format!(
                "one step: {} ms of kernels (GPU timestamps)",
                ms(profile.gpu_ns)
            ));
            out.table(&pattern_table(&profile));
            out.table(&profile.to_string());
            fields.push(("step_gpu_ms", Json::Num(profile.gpu_ns / 1e6)));
            fields.push(("adapter", Json::Str(profile.adapter.clone())));
        }
        out.record(&fields);
    }
    Ok(())
}

/// The step program against the prefill: the largest difference, relative to the largest
/// |logit|, between the logits after 16 prompt tokens fed one by one through the step and
/// those of the prefill over the same tokens. Fails past 1e-3.
fn check_steps(generator: &mut Generator, prompts: &[Vec<i32>]) -> Result<f64, Failure> {
    let n = prompts[0].len().min(16);
    let heads: Vec<Vec<i32>> = prompts.iter().map(|p| p[..n].to_vec()).collect();
    let whole = generator.start(&heads)?;
    let firsts: Vec<Vec<i32>> = prompts.iter().map(|p| p[..1].to_vec()).collect();
    let mut stepped = generator.start(&firsts)?;
    for i in 1..n {
        let column: Vec<i32> = prompts.iter().map(|p| p[i]).collect();
        stepped = generator.push(&column)?;
    }
    let (mut err, mut scale) = (0.0f64, 1.0f64);
    for (a, b) in whole.iter().flatten().zip(stepped.iter().flatten()) {
        if !a.is_finite() || !b.is_finite() {
            return Err(Failure::Wrong(format!(
                "a logit is not finite ({a} by the prefill, {b} by the steps)"
            )));
        }
        err = err.max(f64::from((a - b).abs()));
        scale = scale.max(f64::from(a.abs()));
    }
    let err = err / scale;
    if err > 1e-3 {
        return Err(Failure::Wrong(format!(
            "the step's logits after {n} tokens differ from the prefill's by {err:.2e}"
        )));
    }
    Ok(err)
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}
