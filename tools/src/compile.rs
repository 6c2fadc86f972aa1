//! `sinter compile FILE.sir -o FILE.sart [--target NAME|FILE.json] [--no-opt]
//! [--attention auto|flash|unfused] [--flash-backward whole|split] [--max-binding-size BYTES]
//! [--dump-after PASS …]`: compile a program into an artifact, optionally printing what chosen
//! passes produced.

use std::path::PathBuf;

use sinter_cli::flags::{
    Attention, FlashBackward, FlashTile, GenerationFlags, Precision, TargetArgs,
};

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
    #[command(flatten)]
    target: TargetArgs,
    /// Print what a pass produced, after a header line. Repeat it or separate passes with
    /// commas; `all` dumps every pass, `list` names them with what each does.
    #[arg(long, value_name = "PASS", value_delimiter = ',', value_parser = pass_names())]
    dump_after: Vec<String>,
    /// Skip the e-graph optimizer: every primitive becomes its own kernel.
    #[arg(long)]
    no_opt: bool,
    /// Which attention kernels the optimizer may choose: `auto` (flash kernels where the cost
    /// model finds them cheaper), `flash` (wherever an attention is found) or `unfused`.
    #[arg(long, value_enum, default_value_t = Attention::Auto)]
    attention: Attention,
    /// An attention's flash backward as one kernel where that pays (`whole`: dQ summed from
    /// per-group partial sums) or as separate dQ and dK/dV kernels (`split`).
    #[arg(long, value_enum, default_value_t = FlashBackward::Whole)]
    flash_backward: FlashBackward,
    /// `mixed`: the program's products in f16 (matmul, conv2d, attention operands and the
    /// values between them), reductions, softmax, norms and losses in f32, params kept in f32
    /// and gradients scaled, as PyTorch's autocast with a GradScaler; `f32`: as declared.
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    precision: Precision,
    /// The flash-attention kernels' tiling (for experiments; `b` is the fastest measured).
    #[arg(long, value_enum, default_value_t = FlashTile::B)]
    flash_tile: FlashTile,
    /// Print every pass with its time and counts (nodes, kernels, bytes) to stderr.
    #[arg(long)]
    time_passes: bool,
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
    PossibleValuesParser::new(
        Pass::ALL
            .iter()
            .map(|p| p.name())
            .chain(["all", "list", "optimize", "schedule"]),
    )
}

pub fn run(args: &Args) -> Result<(), CliError> {
    if args.dump_after.iter().any(|name| name == "list") {
        return console::print(&Pass::list());
    }
    let program = program::load_program(&args.file, &args.dims)?;
    let graph = program.graph;
    let dump_after: Vec<Pass> = if args.dump_after.iter().any(|name| name == "all") {
        Pass::ALL.to_vec()
    } else {
        args.dump_after
            .iter()
            .filter_map(|name| Pass::named(name))
            .collect()
    };
    let options = Options {
        target: args.target.target().map_err(CliError::Arg)?,
        dump_after,
        optimize: !args.no_opt,
        dot: args.dot.is_some(),
        attention: args.attention.into(),
        flash: sinter_compiler::flash::variant::Choices {
            tiling: args.flash_tile.into(),
            tensor_cores: args.target.tensor_cores,
            merge_backward: args.flash_backward.merge(),
        },
        precision: args.precision.into(),
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
    if args.time_passes {
        for record in &compiled.passes {
            console::eprintln(&record.to_string());
        }
    }
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
