//! `sinter import MODEL.onnx -o MODEL.sir [--weights W.safetensors] [--dim NAME=VALUE …]
//! [--name NAME]`: translate an ONNX model into a `.sir` program and write its weights
//! (initializers and constants) as safetensors beside it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sinter_ir::artifact::{Artifact, Role};
use sinter_ir::interp::Tensor;
use sinter_runtime::io::HostTensor;

use crate::console;
use crate::error::CliError;
use crate::program::{self, Dim};

#[derive(clap::Args)]
pub struct Args {
    /// The ONNX model (opset 13 or later; weights inside the file, not external data).
    file: PathBuf,
    /// Where to write the program.
    #[arg(short, long, value_name = "FILE.sir")]
    output: PathBuf,
    /// Where to write the params and states (default: the output with `.safetensors`).
    #[arg(short, long, value_name = "FILE.safetensors")]
    weights: Option<PathBuf>,
    /// Fix a dynamic dimension of the model's inputs (a `dim_param`), e.g. `--dim batch=8`.
    /// Repeat for each; every dynamic dimension must be fixed.
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = program::parse_dim)]
    dims: Vec<Dim>,
    /// The graph's name in the program (default: the ONNX graph's name).
    #[arg(long)]
    name: Option<String>,
    /// Statements to add at the end of the graph, from a file: typically a loss on an output,
    /// a `train LOSS with adamw(...)` statement and `output LOSS`, which make the program a
    /// training step for `sinter train`. The result is checked like any program.
    #[arg(long, value_name = "FILE.sir")]
    append: Option<PathBuf>,
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let bytes = std::fs::read(&args.file).map_err(|source| CliError::ReadSource {
        path: args.file.clone(),
        source,
    })?;
    let imported = program::import(&args.file, &bytes, &args.dims, args.name.clone())?;
    let weights_path = args
        .weights
        .clone()
        .unwrap_or_else(|| args.output.with_extension("safetensors"));
    let mut text = format!(
        "{}{}",
        header(&args.file, &weights_path, &args.output, &imported),
        sinter_ir::text::print(&imported.graph)
    );
    if let Some(path) = &args.append {
        text = append(text, path, &args.output)?;
    }
    std::fs::write(&args.output, text).map_err(|source| CliError::WriteFile {
        path: args.output.clone(),
        source,
    })?;
    let tensors = host_tensors(&imported.weights);
    sinter_runtime::io::write_safetensors(&weights_path, &tensors)?;
    let values: usize = imported.weights.iter().map(|(_, t)| t.numel()).sum();
    console::println(&format!(
        "imported `{}`: {} sinter ops, {} params and states ({values} values) -> {}, weights -> {}",
        imported.graph.name,
        imported.graph.nodes.len(),
        imported.weights.len(),
        args.output.display(),
        weights_path.display()
    ))?;
    for port in imported.inputs.iter().chain(&imported.outputs) {
        if port.onnx != port.sir {
            console::println(&format!("  ONNX `{}` is `{}`", port.onnx, port.sir))?;
        }
    }
    Ok(())
}

/// `program` with the statements of the file at `path` added before its closing brace, checked
/// by the parser (diagnostics point into the combined text, named as the output).
fn append(program: String, path: &Path, output: &Path) -> Result<String, CliError> {
    let extra = std::fs::read_to_string(path).map_err(|source| CliError::ReadSource {
        path: path.to_path_buf(),
        source,
    })?;
    let Some(end) = program.rfind('}') else {
        return Err(CliError::Arg(
            "the printed program has no closing brace".into(),
        ));
    };
    let text = format!(
        "{}  # added from {}\n{}\n}}\n",
        &program[..end],
        path.display(),
        extra.trim_end()
    );
    sinter_ir::text::parse(&text).map_err(|diagnostics| CliError::Program {
        rendered: diagnostics.render(&output.display().to_string(), &text),
    })?;
    Ok(text)
}

/// Comment lines that say where the program came from and how to run it.
fn header(model: &Path, weights: &Path, output: &Path, imported: &sinter_onnx::Imported) -> String {
    let relative = |p: &Path| {
        match (p.parent(), output.parent()) {
            (Some(a), Some(b)) if a == b => p.file_name().map(PathBuf::from),
            _ => None,
        }
        .unwrap_or_else(|| p.to_path_buf())
        .display()
        .to_string()
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# imported from {} by `sinter import`",
        model.display()
    );
    if !imported.weights.is_empty() {
        let _ = writeln!(
            out,
            "# params and states are declared `zeros`; their values are in {}: run with --weights",
            relative(weights)
        );
    }
    for (what, ports) in [("input", &imported.inputs), ("output", &imported.outputs)] {
        for p in ports.iter().filter(|p| p.onnx != p.sir) {
            let _ = writeln!(out, "# ONNX {what} `{}` is `{}`", p.onnx, p.sir);
        }
    }
    out
}

fn host_tensors(weights: &[(String, Tensor)]) -> Vec<(String, HostTensor)> {
    weights
        .iter()
        .map(|(n, t)| (n.clone(), HostTensor::from_interp(t)))
        .collect()
}

/// Gives the artifact's params and states the imported values as initial bytes (instead of
/// their `zeros` initializers), so the artifact of an `.onnx` model runs without --weights.
pub fn embed_weights(artifact: &mut Artifact, weights: &[(String, Tensor)]) {
    for (name, tensor) in host_tensors(weights) {
        let Some(slot) = artifact
            .tensors
            .iter_mut()
            .find(|t| t.name == name && matches!(t.role, Role::Param | Role::State))
        else {
            // A state the optimizer found unused has no slot.
            continue;
        };
        let bytes = tensor.to_le_bytes();
        let start = artifact.blob.len() as u64;
        artifact.blob.extend_from_slice(&bytes);
        slot.init = Some((start, bytes.len() as u64));
        slot.fill = None;
    }
}
