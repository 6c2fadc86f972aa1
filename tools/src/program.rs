//! Loading a program: a `.sir` file (read, parse, verify) or an ONNX model (`.onnx`, imported
//! with `sinter_onnx`, its weights kept beside the graph).

use std::collections::BTreeMap;
use std::path::Path;

use sinter_ir::Graph;
use sinter_ir::interp::Tensor;

use crate::error::CliError;

/// A loaded program and, for an imported ONNX model, the values of its params and states.
pub struct Program {
    pub graph: Graph,
    pub weights: Vec<(String, Tensor)>,
}

/// `--dim NAME=VALUE`: a dynamic dimension of an ONNX model fixed to a size.
#[derive(Clone, Debug)]
pub struct Dim {
    pub name: String,
    pub value: usize,
}

/// clap's value parser for `NAME=VALUE`.
pub fn parse_dim(spec: &str) -> Result<Dim, String> {
    let Some((name, value)) = spec.split_once('=') else {
        return Err(format!(
            "expected NAME=VALUE (for example batch=8), got `{spec}`"
        ));
    };
    match value.parse::<usize>() {
        Ok(v) if v >= 1 && !name.is_empty() => Ok(Dim {
            name: name.to_string(),
            value: v,
        }),
        _ => Err(format!(
            "expected a dimension name and a size of at least 1 (for example batch=8), got `{spec}`"
        )),
    }
}

/// Whether `path` names an ONNX model (by its extension).
pub fn is_onnx(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// Reads and parses (which verifies) the `.sir` program at `path`, or imports the ONNX model.
pub fn load(path: &Path) -> Result<Graph, CliError> {
    Ok(load_program(path, &[])?.graph)
}

/// As [`load`], keeping an ONNX model's weights; `dims` fixes its dynamic dimensions.
pub fn load_program(path: &Path, dims: &[Dim]) -> Result<Program, CliError> {
    let bytes = std::fs::read(path).map_err(|source| CliError::ReadSource {
        path: path.to_path_buf(),
        source,
    })?;
    if is_onnx(path) {
        let imported = import(path, &bytes, dims, None)?;
        return Ok(Program {
            graph: imported.graph,
            weights: imported.weights,
        });
    }
    if !dims.is_empty() {
        return Err(CliError::Arg(format!(
            "--dim fixes dimensions of an ONNX model; {} is not one (.onnx)",
            path.display()
        )));
    }
    let name = path.display().to_string();
    let src =
        sinter_ir::text::decode(&bytes).map_err(|(lossy, diagnostics)| CliError::Program {
            rendered: diagnostics.render(&name, &lossy),
        })?;
    let graph = sinter_ir::text::parse(src).map_err(|diagnostics| CliError::Program {
        rendered: diagnostics.render(&name, src),
    })?;
    Ok(Program {
        graph,
        weights: Vec::new(),
    })
}

/// Imports the ONNX model in `bytes` (read from `path`).
pub fn import(
    path: &Path,
    bytes: &[u8],
    dims: &[Dim],
    name: Option<String>,
) -> Result<sinter_onnx::Imported, CliError> {
    let mut fixed = BTreeMap::new();
    for d in dims {
        if fixed.insert(d.name.clone(), d.value).is_some() {
            return Err(CliError::Arg(format!("--dim {} is given twice", d.name)));
        }
    }
    let options = sinter_onnx::Options {
        dims: fixed,
        name,
        ..Default::default()
    };
    sinter_onnx::import(bytes, &options).map_err(|source| CliError::Import {
        path: path.to_path_buf(),
        source,
    })
}
