//! `sinter eval FILE.sir --input NAME=F.npy … [--weights W.safetensors] [--out DIR]`: run a
//! program on the reference interpreter, after the front-end passes the interpreter needs
//! (composite expansion, and autodiff for `grad`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sinter_ir::Graph;

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
    let program = program::load_program(&args.file, &[])?;
    let source = program.graph;
    let graph = sinter_ir::expand::expand_composites(&source);
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
    // Params and states the weights file lacks take an ONNX model's own weights, or start
    // from their initializers, which the interpreter materializes within its memory budget.
    let mut persistent: HashMap<String, Tensor> = program.weights.into_iter().collect();
    if let Some(path) = &args.weights {
        persistent.extend(
            feeds::load_weights(&signature, path)?
                .into_iter()
                .map(|(name, t)| (name, t.to_interp())),
        );
    }
    let options = interp::EvalOptions {
        memory_budget: (args.max_memory * f64::from(1u32 << 30)) as u64,
        ..Default::default()
    };
    let evaluation =
        interp::evaluate_with(&graph, &inputs, &persistent, &options).map_err(|e| match e {
            interp::EvalError::MemoryBudget { ref name, .. } => {
                let origin = origin(&source, &graph, name, &args.file);
                CliError::Arg(format!("{e}{origin}"))
            }
            other => CliError::Eval(other),
        })?;

    let outputs: Vec<(String, HostTensor)> = evaluation
        .outputs
        .iter()
        .map(|(name, t)| (name.clone(), HostTensor::from_interp(t)))
        .collect();
    outputs::report(&outputs, args.out.as_deref())
}

/// Where the value `name` of the evaluated graph comes from in the program's file: `" (at
/// FILE:LINE, `NAME = ...`)"` for a value the file defines, or for a value the front end
/// generated (an expanded composite, a gradient) the nearest value it was computed from that the
/// file defines; empty when none is found.
fn origin(source: &Graph, evaluated: &Graph, name: &str, file: &Path) -> String {
    let Some(start) = evaluated.lookup(name) else {
        return String::new();
    };
    // breadth first, to the first value the source graph names: through the values computed
    // from it (what it was generated for), else through its operands
    let mut readers: std::collections::HashMap<sinter_ir::ValueId, Vec<sinter_ir::ValueId>> =
        std::collections::HashMap::new();
    for node in &evaluated.nodes {
        for &input in &node.inputs {
            readers.entry(input).or_default().extend(&node.outputs);
        }
    }
    let named = |forward: bool| -> Option<String> {
        let mut queue = std::collections::VecDeque::from([start]);
        let mut seen = std::collections::HashSet::from([start]);
        while let Some(v) = queue.pop_front() {
            let n = evaluated.name_of(v);
            if source.lookup(n).is_some() {
                return Some(n.to_string());
            }
            let next: Vec<sinter_ir::ValueId> = if forward {
                readers.get(&v).cloned().unwrap_or_default()
            } else {
                evaluated
                    .producer(v)
                    .map(|node| evaluated.node(node).inputs.clone())
                    .unwrap_or_default()
            };
            queue.extend(next.into_iter().filter(|&x| seen.insert(x)));
        }
        None
    };
    let Some(found) = named(true).or_else(|| named(false)) else {
        return String::new();
    };
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let line = text.lines().position(|l| defines(l, &found));
    let place = match line {
        Some(i) => format!("{}:{}", file.display(), i + 1),
        None => file.display().to_string(),
    };
    if found == name {
        format!(" (defined at {place})")
    } else {
        format!(" (generated from `{found}`, defined at {place})")
    }
}

/// Whether a program line defines `name` (`name = ...`, `a, name = ...`, or a declaration).
fn defines(line: &str, name: &str) -> bool {
    let code = line.split('#').next().unwrap_or("").trim();
    let code = ["input ", "param ", "state "]
        .iter()
        .find_map(|k| code.strip_prefix(k))
        .map_or(code, |rest| rest.split(':').next().unwrap_or(""));
    let lhs = code.split('=').next().unwrap_or("");
    lhs.split(',').any(|n| n.trim() == name)
}
