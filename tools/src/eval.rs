//! `sinter eval FILE.sir --input NAME=F.npy … [--weights W.safetensors] [--out DIR]`: run a
//! program on the reference interpreter, after the front-end passes the interpreter needs
//! (composite expansion, and autodiff for `grad`).

use std::collections::HashMap;
use std::path::PathBuf;

use sinter_ir::interp::{self, Tensor};
use sinter_runtime::io::HostTensor;

use crate::error::CliError;
use crate::feeds::{self, Feed, Signature};
use crate::outputs;
use crate::program;

#[derive(clap::Args)]
pub struct Args {
    /// The program to run.
    file: PathBuf,
    /// An input tensor: the input's name and a .npy file (f32 or i32, C order). Repeat for each
    /// input.
    #[arg(short, long = "input", value_name = "NAME=FILE", value_parser = feeds::parse_feed)]
    inputs: Vec<Feed>,
    /// Params and states by name; those the file lacks start from their initializers.
    #[arg(short, long, value_name = "FILE.safetensors")]
    weights: Option<PathBuf>,
    /// Directory to write each output to, as NAME.npy (created if needed).
    #[arg(short, long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Memory the interpreter may use, in GiB (it keeps every value in f64); a graph that
    /// needs more is refused before it allocates.
    #[arg(long, value_name = "GIB", default_value_t = 4.0, value_parser = parse_gib)]
    max_memory: f64,
}

fn parse_gib(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("expected a positive number of GiB, got `{text}`")),
    }
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let graph = program::load(&args.file)?;
    let graph = sinter_ir::expand::expand_composites(&graph);
    let differentiated = sinter_compiler::autodiff::differentiate(&graph)?;
    for warning in &differentiated.warnings {
        crate::console::eprintln(&format!("warning: {warning}"));
    }
    let graph = differentiated.graph;

    let signature = Signature::of_graph(&graph);
    let inputs: HashMap<String, Tensor> = feeds::load_inputs(&signature, &args.inputs)?
        .into_iter()
        .map(|(name, t)| (name, t.to_interp()))
        .collect();
    // Params and states the weights file lacks start from their initializers, which the
    // interpreter materializes within its memory budget.
    let persistent: HashMap<String, Tensor> = match &args.weights {
        Some(path) => feeds::load_weights(&signature, path)?
            .into_iter()
            .map(|(name, t)| (name, t.to_interp()))
            .collect(),
        None => HashMap::new(),
    };
    let options = interp::EvalOptions {
        memory_budget: (args.max_memory * f64::from(1u32 << 30)) as u64,
        ..Default::default()
    };
    let evaluation = interp::evaluate_with(&graph, &inputs, &persistent, &options)?;

    let outputs: Vec<(String, HostTensor)> = evaluation
        .outputs
        .iter()
        .map(|(name, t)| (name.clone(), HostTensor::from_interp(t)))
        .collect();
    outputs::report(&outputs, args.out.as_deref())
}
