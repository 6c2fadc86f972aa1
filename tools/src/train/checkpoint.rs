//! Training checkpoints: `--save-checkpoint DIR` writes what a run needs to go on exactly where
//! it stopped, `--resume DIR` reads it back.
//!
//! A checkpoint folder holds `weights.safetensors` (every param and state: the optimizer's
//! moments, its step counter, gradient sums, by name) and `checkpoint.json`: the program's
//! graph name, the runs done, the shuffle seed, and the data set's sample count and batch size.
//! The batch of run `k` is a function of `k` and the seed alone ([`super::data`]), so restoring
//! the weights and continuing the run count gives the same steps as a run that never stopped,
//! bit for bit.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sinter_runtime::Session;

use crate::error::CliError;

pub const WEIGHTS: &str = "weights.safetensors";
pub const STATE: &str = "checkpoint.json";

/// Where a run stood when its checkpoint was saved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The training program's graph name.
    pub graph: String,
    /// Runs (steps) done so far; the next run takes batch `runs`.
    pub runs: u64,
    /// `--shuffle-seed` of the run (none: file order).
    pub shuffle_seed: Option<u64>,
    /// The data set's samples and batch size, checked on resuming.
    pub samples: usize,
    pub batch: usize,
}

impl Checkpoint {
    /// Writes the session's weights and `self` into `dir` (created if needed).
    pub fn save(&self, dir: &Path, session: &Session) -> Result<(), CliError> {
        std::fs::create_dir_all(dir).map_err(|source| CliError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        session.save_weights(dir.join(WEIGHTS))?;
        let text = serde_json::to_string_pretty(self).expect("a checkpoint serializes");
        let path = dir.join(STATE);
        std::fs::write(&path, text + "\n").map_err(|source| CliError::WriteFile { path, source })
    }

    /// Reads `dir`'s `checkpoint.json`.
    pub fn load(dir: &Path) -> Result<Checkpoint, CliError> {
        let path = dir.join(STATE);
        let text = std::fs::read_to_string(&path).map_err(|source| CliError::ReadSource {
            path: path.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| {
            CliError::Arg(format!(
                "{} is not a checkpoint written by `sinter train --save-checkpoint`: {e}",
                path.display()
            ))
        })
    }

    /// The weights file of a checkpoint in `dir`.
    pub fn weights(dir: &Path) -> PathBuf {
        dir.join(WEIGHTS)
    }

    /// Why this checkpoint cannot continue a run of `graph` over `samples` samples in batches of
    /// `batch`, shuffled with `seed`, if it cannot.
    pub fn check(
        &self,
        dir: &Path,
        graph: &str,
        samples: usize,
        batch: usize,
        seed: Option<u64>,
    ) -> Result<(), CliError> {
        let problem = if self.graph != graph {
            Some(format!(
                "it was saved by a run of graph `{}`, not `{graph}`",
                self.graph
            ))
        } else if (self.samples, self.batch) != (samples, batch) {
            Some(format!(
                "it was saved over {} samples in batches of {}, not {samples} in batches of \
                 {batch}, so the batches would differ",
                self.samples, self.batch
            ))
        } else if seed.is_some() && seed != self.shuffle_seed {
            Some(format!(
                "it was saved by a run with --shuffle-seed {}; leave --shuffle-seed out to \
                 continue with it",
                self.shuffle_seed
                    .map_or_else(|| "none (file order)".to_string(), |s| s.to_string())
            ))
        } else {
            None
        };
        match problem {
            Some(why) => Err(CliError::Arg(format!(
                "cannot resume from {}: {why}",
                dir.display()
            ))),
            None => Ok(()),
        }
    }
}
