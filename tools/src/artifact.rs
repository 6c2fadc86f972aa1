//! Reading a `.sart` artifact for `run` and `inspect`: a file that is missing, not an artifact,
//! truncated, corrupted or of another format version is an input error that names the file.

use std::path::Path;

use sinter_ir::artifact::{Artifact, ArtifactError};

use crate::error::CliError;

/// Reads and checks the artifact at `path` (header, checksum, manifest, cross-references).
pub fn read(path: &Path) -> Result<Artifact, CliError> {
    let bytes = std::fs::read(path).map_err(|source| CliError::ReadSource {
        path: path.to_path_buf(),
        source,
    })?;
    Artifact::from_bytes(&bytes).map_err(|source| {
        let hint = match source {
            ArtifactError::TooShort(_) | ArtifactError::BadMagic if looks_like_program(&bytes) => {
                " (it looks like a .sir program: compile it first with `sinter compile FILE.sir -o FILE.sart`)"
            }
            _ => "",
        };
        CliError::BadArtifact {
            path: path.to_path_buf(),
            source,
            hint,
        }
    })
}

fn looks_like_program(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_ok_and(|text| {
        text.lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .is_some_and(|l| l.starts_with("graph"))
    })
}
