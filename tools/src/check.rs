//! `sinter check FILE.sir`: parse and verify, then list every named value with its type.

use std::fmt::Write as _;
use std::path::PathBuf;

use sinter_ir::{Graph, ValueDef};

use crate::error::CliError;
use crate::program;

#[derive(clap::Args)]
pub struct Args {
    /// The program to check (.sir), or an ONNX model (.onnx) to import and check.
    file: PathBuf,
    /// For an ONNX model: fix a dynamic dimension, e.g. `--dim batch=8` (repeat for each).
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = crate::program::parse_dim)]
    dims: Vec<crate::program::Dim>,
    /// Also list the values the parser named itself (`_N`, from nested calls and literals).
    #[arg(long)]
    all: bool,
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let graph = program::load_program(&args.file, &args.dims)?.graph;
    crate::console::print(&listing(&graph, args.all))
}

/// One line per value in definition order (`name: type  (origin)`), then the outputs and
/// assignments.
fn listing(graph: &Graph, all: bool) -> String {
    let mut out = String::new();
    for value in &graph.values {
        if !all && Graph::is_generated_name(&value.name) {
            continue;
        }
        let origin = match &value.def {
            ValueDef::Input => "input",
            ValueDef::Param(_) => "param",
            ValueDef::State(_) => "state",
            ValueDef::Node { node, .. } => graph.node(*node).op.name(),
        };
        let _ = writeln!(out, "{}: {}  ({origin})", value.name, value.ty);
    }
    for assign in &graph.assigns {
        let _ = writeln!(
            out,
            "assign {} = {}",
            graph.name_of(assign.target),
            graph.name_of(assign.source)
        );
    }
    let outputs: Vec<&str> = graph.outputs.iter().map(|&v| graph.name_of(v)).collect();
    if outputs.is_empty() {
        out.push_str("output (none)\n");
    } else {
        let _ = writeln!(out, "output {}", outputs.join(", "));
    }
    out
}
