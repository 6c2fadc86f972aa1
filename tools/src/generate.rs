//! `sinter generate MODEL --prompt TEXT --max-new-tokens N [--weights W.safetensors]
//! [--temperature T] [--top-k K] [--top-p P] [--seed S] [--vocab vocab.txt] [--samples N] ...`:
//! write text with a language model.
//!
//! MODEL is a `.sir` program (a forward program, or a training program whose forward part is
//! used), an ONNX model, or a generation artifact from `sinter compile --generate`. A program is
//! derived into its prefill and step programs (`sinter_ir::decode`) and compiled first. The
//! prompt and the continuation go to stdout as the tokens come; the speed goes to stderr.
//! Everything that can be checked before the GPU is (the sampling settings, the vocabulary, the
//! prompt, the weights); a program that cannot generate (not causal, logits that are not
//! per position) is an input error (exit 2), like a prompt the vocabulary cannot write.

mod vocab;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use sinter_cli::flags::{Attention, GenerationFlags, TargetArgs};
use sinter_compiler::Options;
use sinter_compiler::generation::{GenerationError, compile_generation};
use sinter_ir::artifact::{Artifact, MAGIC, Role};
use sinter_ir::interp::Tensor;
use sinter_runtime::io::{HostTensor, read_safetensors};
use sinter_runtime::{Generator, Sampling};

use crate::error::CliError;
use crate::{console, program};
use vocab::Vocabulary;

#[derive(clap::Args)]
pub struct Args {
    /// The model: a program (.sir: forward or training program; .onnx), or a generation artifact
    /// (.sart from `sinter compile --generate`).
    model: PathBuf,
    /// The text to continue.
    #[arg(long)]
    prompt: String,
    /// For an ONNX model: fix a dynamic dimension, e.g. `--dim batch=1` (repeat for each).
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = program::parse_dim)]
    dims: Vec<program::Dim>,
    /// Tokens to write after the prompt (per sample).
    #[arg(long, value_name = "N")]
    max_new_tokens: usize,
    /// Params to load by name (e.g. from `sinter train --save-weights`); tensors the model does
    /// not read (an optimizer's moments) are skipped. Without it the program's initializers
    /// give the weights.
    #[arg(short, long, value_name = "FILE.safetensors")]
    weights: Option<PathBuf>,
    /// 0 takes the most likely token each time; above 0 samples from the softmax of the logits
    /// divided by it.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    temperature: f64,
    /// Sample among the K most likely tokens only.
    #[arg(long, value_name = "K")]
    top_k: Option<usize>,
    /// Sample among the most likely tokens whose probabilities reach P together (0 < P <= 1).
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    top_p: Option<f64>,
    /// Seed of the sampling: the same seed writes the same text (by default one from the
    /// clock, printed to stderr).
    #[arg(long)]
    seed: Option<u64>,
    /// The vocabulary: one JSON string per line, line i the text of token i. Without it,
    /// tokens are raw bytes.
    #[arg(long, value_name = "FILE")]
    vocab: Option<PathBuf>,
    /// Tokens the window keeps when the text passes the model's context (default: half the
    /// context; the context itself re-reads the whole window for every token).
    #[arg(long, value_name = "N")]
    keep: Option<usize>,
    #[command(flatten)]
    generation: GenerationFlags,
    /// For a program: compile it without the e-graph optimizer.
    #[arg(long)]
    no_opt: bool,
    /// For a program: which attention kernels the optimizer may choose.
    #[arg(long, value_enum, default_value_t = Attention::Auto)]
    attention: Attention,
    /// For a program: the device to compile for (as `sinter compile`).
    #[command(flatten)]
    target: TargetArgs,
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed.unwrap_or_else(clock_seed),
    };
    sampling.check()?;
    let vocab = match &args.vocab {
        Some(path) => Vocabulary::read(path)?,
        None => Vocabulary::Bytes,
    };
    let prompt = vocab.encode(&args.prompt)?;
    if prompt.is_empty() {
        return Err(CliError::Arg("the prompt is empty".into()));
    }
    let file: Option<HashMap<String, HostTensor>> = match &args.weights {
        Some(path) => Some(read_safetensors(path)?.into_iter().collect()),
        None => None,
    };
    let (artifact, source) = model(args, file.as_ref())?;
    let info = &artifact
        .generation
        .as_ref()
        .expect("model() returns generation artifacts")
        .info;
    let (samples, model_vocab) = (info.batch as usize, info.vocab as usize);
    match &vocab {
        Vocabulary::Bytes if model_vocab > 256 => {
            return Err(CliError::Arg(format!(
                "the model scores {model_vocab} tokens, more than the 256 bytes that stand for \
                 tokens without a vocabulary: give its vocabulary with --vocab"
            )));
        }
        Vocabulary::Bytes => {
            if let Some(&t) = prompt.iter().find(|&&t| t as usize >= model_vocab) {
                return Err(CliError::Arg(format!(
                    "the prompt holds the byte {t}, but the model scores {model_vocab} tokens \
                     (give its vocabulary with --vocab)"
                )));
            }
        }
        Vocabulary::Pieces { .. } if vocab.len() != model_vocab => {
            return Err(CliError::Arg(format!(
                "the vocabulary has {} tokens, but the model scores {model_vocab}",
                vocab.len()
            )));
        }
        Vocabulary::Pieces { .. } => {}
    }
    let weights = match (&args.weights, &file) {
        (Some(path), Some(file)) => select_weights(path, file, &artifact, source.as_ref())?,
        _ => Vec::new(),
    };
    if args.seed.is_none() && sampling.temperature > 0.0 {
        console::eprintln(&format!("seed {}", sampling.seed));
    }

    let mut generator = Generator::load(artifact)?;
    if let Some(keep) = args.keep {
        generator.set_keep(keep)?;
    }
    generator.load_weights(&weights)?;
    let prompts = vec![prompt.clone(); samples];
    let mut text = vec![args.prompt.clone(); samples];
    let mut streams: Vec<_> = (0..samples).map(|_| vocab.decoder()).collect();
    if samples == 1 {
        console::print(&args.prompt)?;
    }
    let start = Instant::now();
    let mut first: Option<Instant> = None;
    let mut failed = None;
    let generated = generator.generate(&prompts, args.max_new_tokens, &sampling, |t| {
        first.get_or_insert_with(Instant::now);
        let piece = streams[t.sequence].push(t.id);
        if samples == 1 {
            if let Err(e) = console::print(&piece) {
                failed = Some(e);
                return false;
            }
        } else {
            text[t.sequence].push_str(&piece);
        }
        true
    })?;
    let end = Instant::now();
    if let Some(e) = failed {
        return Err(e);
    }
    if samples == 1 {
        console::print(&streams[0].finish())?;
        console::println("")?;
    } else {
        for (s, (t, stream)) in text.iter_mut().zip(&mut streams).enumerate() {
            t.push_str(&stream.finish());
            console::println(&format!("--- sample {} ---", s + 1))?;
            console::println(t)?;
        }
    }
    report_speed(prompt.len(), &generated, start, first, end);
    Ok(())
}

/// A seed from the clock, for sampling without `--seed`.
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Tokens per second to stderr: the prompt through the prefill (to the first token), then the
/// rest, one submission per token.
fn report_speed(
    prompt: usize,
    generated: &[Vec<i32>],
    start: Instant,
    first: Option<Instant>,
    end: Instant,
) {
    let Some(first) = first else {
        return;
    };
    let per_sequence = generated.first().map_or(0, Vec::len);
    let total: usize = generated.iter().map(Vec::len).sum();
    let prefill = (first - start).as_secs_f64();
    let decode = (end - first).as_secs_f64();
    let steps = per_sequence.saturating_sub(1);
    let rate = if decode > 0.0 {
        format!("{:.1} tokens/s", (steps * generated.len()) as f64 / decode)
    } else {
        "-".into()
    };
    console::eprintln(&format!(
        "prompt {prompt} tokens in {:.1} ms; {total} tokens generated, {steps} steps in {:.3} s: \
         {rate}",
        prefill * 1e3,
        decode
    ));
}

/// The generation artifact of `args.model` (compiled from a program when it is one), with the
/// program when there is one. The causal check may read the values of the program's states
/// that an ONNX model or the weights `file` give (an imported model's mask buffer).
fn model(
    args: &Args,
    file: Option<&HashMap<String, HostTensor>>,
) -> Result<(Artifact, Option<sinter_ir::Graph>), CliError> {
    let path = &args.model;
    let bytes = std::fs::read(path).map_err(|source| CliError::ReadSource {
        path: path.to_path_buf(),
        source,
    })?;
    if bytes.starts_with(&MAGIC) {
        let artifact = crate::artifact::read(path)?;
        if artifact.generation.is_none() {
            return Err(CliError::Arg(format!(
                "{} is not a generation artifact: compile the model with `sinter compile \
                 --generate`, or give its .sir program",
                path.display()
            )));
        }
        return Ok((artifact, None));
    }
    let program = program::load_program(path, &args.dims)?;
    let graph = &program.graph;
    let is_state = |name: &str| {
        graph
            .lookup(name)
            .is_some_and(|v| matches!(graph.value(v).def, sinter_ir::ValueDef::State(_)))
    };
    let mut states: HashMap<String, Tensor> = (program.weights.iter())
        .filter(|(name, _)| is_state(name))
        .cloned()
        .collect();
    for (name, t) in file.into_iter().flatten() {
        if is_state(name) {
            states.insert(name.clone(), t.to_interp());
        }
    }
    let options = Options {
        target: args.target.target().map_err(CliError::Arg)?,
        optimize: !args.no_opt,
        attention: args.attention.into(),
        ..Options::default()
    };
    let spec = args.generation.spec();
    let compiled = compile_generation(graph, &spec, &states, &options, &mut Vec::new())
        .map_err(generation_error)?;
    for warning in &compiled.warnings {
        console::eprintln(&format!("warning: {warning}"));
    }
    let mut artifact = compiled.artifact;
    crate::import::embed_weights(&mut artifact, &program.weights);
    Ok((artifact, Some(program.graph)))
}

/// A program that cannot generate is the command's input error (exit 2); one whose derived
/// programs do not compile is the program's (exit 1).
pub fn generation_error(e: GenerationError) -> CliError {
    match e {
        GenerationError::Decode(d) => {
            CliError::Arg(format!("cannot generate with this program: {d}"))
        }
        GenerationError::Compile { source, .. } => CliError::Compile(source),
    }
}

/// The model's params and states from the safetensors file at `path`: every param must be
/// there, with its type; tensors the model does not read are skipped (those of the source
/// program, such as an optimizer's moments, and a mixed-precision run's loss scale silently;
/// others with a warning).
fn select_weights(
    path: &Path,
    file: &HashMap<String, HostTensor>,
    artifact: &Artifact,
    source: Option<&sinter_ir::Graph>,
) -> Result<Vec<(String, HostTensor)>, CliError> {
    let mut weights = Vec::new();
    let caches = &artifact
        .generation
        .as_ref()
        .expect("a generation artifact")
        .info
        .caches;
    for slot in artifact
        .slots(Role::State)
        .filter(|s| !caches.contains(&s.name))
    {
        if let Some(t) = file.get(&slot.name) {
            if t.ty() != slot.ty {
                return Err(CliError::Feed(format!(
                    "{}: state `{}` must be {}, but the file holds {}",
                    path.display(),
                    slot.name,
                    slot.ty,
                    t.ty()
                )));
            }
            weights.push((slot.name.clone(), t.clone()));
        }
    }
    for slot in artifact.slots(Role::Param) {
        let Some(t) = file.get(&slot.name) else {
            return Err(CliError::Feed(format!(
                "{}: the model's param `{}` ({}) is not in the file",
                path.display(),
                slot.name,
                slot.ty
            )));
        };
        if t.ty() != slot.ty {
            return Err(CliError::Feed(format!(
                "{}: weight `{}` must be {}, but the file holds {}",
                path.display(),
                slot.name,
                slot.ty,
                t.ty()
            )));
        }
        weights.push((slot.name.clone(), t.clone()));
    }
    let mut unknown: Vec<&str> = file
        .keys()
        .map(String::as_str)
        .filter(|n| (artifact.tensors.iter()).all(|s| s.name != *n || s.role == Role::Output))
        .filter(|n| source.is_none_or(|g| g.lookup(n).is_none_or(|v| !g.value(v).is_persistent())))
        .filter(|n| !sinter_compiler::loss_scale::STATES.contains(n))
        .collect();
    unknown.sort_unstable();
    if !unknown.is_empty() {
        console::eprintln(&format!(
            "warning: {} holds {} tensor(s) the model does not read: {}",
            path.display(),
            unknown.len(),
            unknown.join(", ")
        ));
    }
    Ok(weights)
}
