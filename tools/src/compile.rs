//! `sinter compile FILE.sir -o FILE.sart [--no-opt] [--attention auto|flash|unfused]
//! [--flash-backward whole|split] [--max-binding-size BYTES] [--dump-after PASS …]`:
//! compile a program into an artifact, optionally printing what chosen passes produced.

use std::path::PathBuf;

use sinter_cli::flags::{Attention, FlashBackward, GenerationFlags};

use clap::builder::PossibleValuesParser;
use sinter_compiler::{Options, Pass};
use sinter_ir::artifact::Artifact;

use crate::error::CliError;
use crate::units;
use crate::{console, program};

#[derive(clap::Args)]
pub struct Args {
    /// The program to compile (.sir), or an ONNX model (.onnx), whose weights the artifact then
    /// carries as initial values.
    file: PathBuf,
    /// For an ONNX model: fix a dynamic dimension, e.g. `--dim batch=8` (repeat for each).
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = program::parse_dim)]
    dims: Vec<program::Dim>,
    /// Where to write the artifact.
    #[arg(short, long, value_name = "FILE.sart")]
    output: PathBuf,
    /// Largest arena storage binding in bytes; larger plans are split over several arenas.
    /// Match it to the target adapter's max_storage_buffer_binding_size.
    #[arg(long, value_name = "BYTES", default_value_t = sinter_compiler::DEFAULT_MAX_BINDING,
          value_parser = clap::value_parser!(u64).range(4..))]
    max_binding_size: u64,
    /// Print what a pass produced, after a header line. Repeat it or separate passes with
    /// commas; `all` dumps every pass.
    #[arg(long, value_name = "PASS", value_delimiter = ',', value_parser = pass_names())]
    dump_after: Vec<String>,
    /// Skip the e-graph optimizer: every primitive becomes its own kernel.
    #[arg(long)]
    no_opt: bool,
    /// Kernels that WebGPU in a browser accepts: no arena bound twice in one dispatch (natively
    /// a matmul reads through a second `vec4` binding of its arena, which browsers forbid).
    #[arg(long)]
    browser: bool,
    /// Which attention kernels the optimizer may choose: `auto` (flash kernels where the cost
    /// model finds them cheaper), `flash` (wherever an attention is found) or `unfused`.
    #[arg(long, value_enum, default_value_t = Attention::Auto)]
    attention: Attention,
    /// An attention's flash backward as one kernel where that pays (`whole`: dQ summed from
    /// per-group partial sums) or as separate dQ and dK/dV kernels (`split`).
    #[arg(long, value_enum, default_value_t = FlashBackward::Whole)]
    flash_backward: FlashBackward,
    /// Run the flash-attention kernels' products on tensor cores (cooperative matrices of f16
    /// operands, f32 accumulation) where its head dimensions allow: faster, 11-bit operands,
    /// and the artifact runs only where wgpu offers cooperative matrices (native Vulkan).
    #[arg(long)]
    tensor_cores: bool,
    /// Write the kernel graph before and after optimization as Graphviz files
    /// DIR/before.dot and DIR/after.dot (`dot -Tsvg DIR/after.dot -o after.svg`).
    #[arg(long, value_name = "DIR")]
    dot: Option<PathBuf>,
    /// Compile a generation artifact for `sinter generate`: the prefill and one-token step
    /// programs that the compiler derives from the program's forward part, with key/value
    /// caches (`--dump-after decode` prints them).
    #[arg(long)]
    generate: bool,
    /// With --generate: what to derive.
    #[command(flatten)]
    generation: GenerationFlags,
}

fn pass_names() -> PossibleValuesParser {
    PossibleValuesParser::new(Pass::ALL.iter().map(|p| p.name()).chain(["all"]))
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let program = program::load_program(&args.file, &args.dims)?;
    let graph = program.graph;
    let dump_after = Pass::ALL
        .into_iter()
        .filter(|p| {
            args.dump_after
                .iter()
                .any(|name| name == p.name() || name == "all")
        })
        .collect();
    let options = Options {
        max_binding_size: args.max_binding_size,
        dump_after,
        optimize: !args.no_opt,
        quad_aliases: !args.browser,
        dot: args.dot.is_some(),
        attention: args.attention.into(),
        merge_flash_backward: args.flash_backward.merge(),
        tensor_cores: args.tensor_cores,
        ..Options::default()
    };
    if args.generate {
        return compile_generation(args, &graph, &options, &program.weights);
    }
    if options.dump_after.contains(&Pass::Decode) && !args.dump_after.iter().any(|p| p == "all") {
        return Err(CliError::Arg(
            "--dump-after decode prints the programs a generation artifact derives: add \
             --generate"
                .into(),
        ));
    }
    let defaults = GenerationFlags {
        ids: "ids".into(),
        logits: "logits".into(),
        batch: 1,
        prefill: None,
    };
    let g = &args.generation;
    if (&g.ids, &g.logits, g.batch, g.prefill)
        != (
            &defaults.ids,
            &defaults.logits,
            defaults.batch,
            defaults.prefill,
        )
    {
        return Err(CliError::Arg(
            "--ids, --logits, --batch and --prefill describe a generation artifact: add \
             --generate"
                .into(),
        ));
    }
    let (early_dumps, compiled) = sinter_compiler::compile_keeping_dumps(&graph, &options);
    let dumps = match &compiled {
        Ok(c) => &c.dumps,
        Err(_) => &early_dumps,
    };
    for (pass, text) in dumps {
        console::println(&format!("# ==== after {} ====", pass.name()))?;
        console::print(text)?;
        if !text.ends_with('\n') {
            console::println("")?;
        }
    }
    let compiled = compiled?;
    for warning in &compiled.warnings {
        crate::console::eprintln(&format!("warning: {warning}"));
    }
    if let Some(dir) = &args.dot {
        std::fs::create_dir_all(dir).map_err(|source| CliError::WriteFile {
            path: dir.clone(),
            source,
        })?;
        for (name, text) in &compiled.dot {
            let path = dir.join(format!("{name}.dot"));
            std::fs::write(&path, text).map_err(|source| CliError::WriteFile { path, source })?;
        }
    }
    let mut artifact = compiled.artifact;
    crate::import::embed_weights(&mut artifact, &program.weights);
    std::fs::write(&args.output, artifact.to_bytes()).map_err(|source| CliError::WriteFile {
        path: args.output.clone(),
        source,
    })?;
    console::println(&summary(&artifact, &args.output.display().to_string()))
}

/// `sinter compile --generate`: the derived programs compiled into one generation artifact.
fn compile_generation(
    args: &Args,
    graph: &sinter_ir::Graph,
    options: &Options,
    weights: &[(String, sinter_ir::interp::Tensor)],
) -> Result<(), CliError> {
    let mut dumps = Vec::new();
    // an imported model's state values (its mask buffer), which the causal check may read
    let states = (weights.iter())
        .filter(|(name, _)| {
            (graph.lookup(name))
                .is_some_and(|v| matches!(graph.value(v).def, sinter_ir::ValueDef::State(_)))
        })
        .cloned()
        .collect();
    let compiled = sinter_compiler::generation::compile_generation(
        graph,
        &args.generation.spec(),
        &states,
        options,
        &mut dumps,
    );
    for (title, text) in &dumps {
        console::println(&format!("# ==== after {title} ===="))?;
        console::print(text)?;
        if !text.ends_with('\n') {
            console::println("")?;
        }
    }
    let compiled = compiled.map_err(crate::generate::generation_error)?;
    for warning in &compiled.warnings {
        console::eprintln(&format!("warning: {warning}"));
    }
    let mut artifact = compiled.artifact;
    crate::import::embed_weights(&mut artifact, weights);
    std::fs::write(&args.output, artifact.to_bytes()).map_err(|source| CliError::WriteFile {
        path: args.output.clone(),
        source,
    })?;
    let info = &compiled.decoder.info;
    let prefill = &artifact
        .generation
        .as_ref()
        .expect("a generation artifact")
        .prefill;
    console::println(&format!(
        "compiled generation of `{}` (context {}, batch {}, prefill {}, vocabulary {}, {} \
         caches): prefill {} dispatches, step {} dispatches, arena {} -> {}",
        graph.name,
        info.context,
        info.batch,
        info.prefill,
        info.vocab,
        info.caches.len(),
        prefill.dispatches.len(),
        artifact.dispatches.len(),
        units::bytes(artifact.memory.peak_bytes.max(prefill.memory.peak_bytes)),
        args.output.display()
    ))
}

/// `compiled `mlp`: 5 kernels, 10 dispatches, arena 99.4 KiB (lower bound 99.4 KiB, 1.00x) -> PATH`
fn summary(artifact: &Artifact, path: &str) -> String {
    let memory = &artifact.memory;
    format!(
        "compiled `{}`: {} kernels, {} dispatches, arena {} (lower bound {}, {}) -> {path}",
        artifact.graph,
        artifact.kernels.len(),
        artifact.dispatches.len(),
        units::bytes(memory.peak_bytes),
        units::bytes(memory.lower_bound_bytes),
        units::ratio(memory.peak_bytes, memory.lower_bound_bytes),
    )
}
