//! `sinter eval FILE.sir --input NAME=F.npy … [--weights W.safetensors] [--out DIR]`: run a
//! program on the reference interpreter, after the front-end passes the interpreter needs
//! (composite expansion, and autodiff for `grad`).

use std::collections::HashMap;
use std::path::PathBuf;

use sinter_ir::interp::{self, Tensor};
use sinter_ir::{Graph, ValueDef};
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
    let mut weights = match &args.weights {
        Some(path) => feeds::load_weights(&signature, path)?,
        None => HashMap::new(),
    };
    let persistent = persistent_values(&graph, &mut weights);

    let evaluation = interp::evaluate(&graph, &inputs, &persistent)?;

    let outputs: Vec<(String, HostTensor)> = evaluation
        .outputs
        .iter()
        .map(|(name, t)| (name.clone(), HostTensor::from_interp(t)))
        .collect();
    outputs::report(&outputs, args.out.as_deref())
}

/// The value of every param and state: from the weights file when it has one, else from the
/// declared initializer.
fn persistent_values(
    graph: &Graph,
    weights: &mut HashMap<String, HostTensor>,
) -> HashMap<String, Tensor> {
    graph
        .values
        .iter()
        .filter_map(|v| {
            let init = match &v.def {
                ValueDef::Param(init) | ValueDef::State(init) => init,
                _ => return None,
            };
            let value = match weights.remove(&v.name) {
                Some(t) => t.to_interp(),
                None => sinter_ir::init::initial_value(&v.ty, init),
            };
            Some((v.name.clone(), value))
        })
        .collect()
}
