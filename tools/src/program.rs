//! Loading a `.sir` program: read, parse, verify.

use std::path::Path;

use sinter_ir::Graph;

use crate::error::CliError;

/// Reads and parses (which verifies) the program at `path`.
pub fn load(path: &Path) -> Result<Graph, CliError> {
    let src = std::fs::read_to_string(path).map_err(|source| CliError::ReadSource {
        path: path.to_path_buf(),
        source,
    })?;
    sinter_ir::text::parse(&src).map_err(|diagnostics| CliError::Program {
        rendered: diagnostics.render(&path.display().to_string(), &src),
    })
}
