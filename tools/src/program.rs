//! Loading a `.sir` program: read, parse, verify.

use std::path::Path;

use sinter_ir::Graph;

use crate::error::CliError;

/// Reads and parses (which verifies) the program at `path`.
pub fn load(path: &Path) -> Result<Graph, CliError> {
    let bytes = std::fs::read(path).map_err(|source| CliError::ReadSource {
        path: path.to_path_buf(),
        source,
    })?;
    let name = path.display().to_string();
    let src =
        sinter_ir::text::decode(&bytes).map_err(|(lossy, diagnostics)| CliError::Program {
            rendered: diagnostics.render(&name, &lossy),
        })?;
    sinter_ir::text::parse(src).map_err(|diagnostics| CliError::Program {
        rendered: diagnostics.render(&name, src),
    })
}
