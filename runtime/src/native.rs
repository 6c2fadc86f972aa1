//! The native layer: blocking wrappers around the async core, and the file system.
//!
//! Everything a browser lacks (blocking on a future, reading files) lives here; the rest of the
//! crate is async and file-free, so it can run under WebGPU later.

use std::path::Path;

use sinter_artifact::artifact::Artifact;

use crate::device::{AdapterChoice, describe_adapter, list_adapters};
use crate::error::RuntimeError;
use crate::generate::{Generator, Token};
use crate::io::{self, HostTensor};
use crate::profile::{Profile, ProfileOptions};
use crate::sample::Sampling;
use crate::session::{Outputs, Session};

/// Reads and checks an artifact file.
pub fn read_artifact(path: impl AsRef<Path>) -> Result<Artifact, RuntimeError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| RuntimeError::ReadArtifact {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Artifact::from_bytes(&bytes)?)
}

fn read_file(path: &Path) -> Result<Vec<u8>, io::IoError> {
    std::fs::read(path).map_err(|source| io::IoError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), io::IoError> {
    std::fs::write(path, bytes).map_err(|source| io::IoError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a `.npy` file (see [`io::npy_from_bytes`]).
pub fn read_npy(path: &Path) -> Result<HostTensor, io::IoError> {
    io::npy_from_bytes(path, &read_file(path)?)
}

/// Writes `t` as a `.npy` file (see [`io::npy_to_bytes`]).
pub fn write_npy(path: &Path, t: &HostTensor) -> Result<(), io::IoError> {
    write_file(path, &io::npy_to_bytes(path, t)?)
}

/// Reads every tensor of a safetensors file, sorted by name.
pub fn read_safetensors(path: &Path) -> Result<Vec<(String, HostTensor)>, io::IoError> {
    io::safetensors_from_bytes(path, &read_file(path)?)
}

/// Writes named tensors as a safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[(String, HostTensor)]) -> Result<(), io::IoError> {
    write_file(path, &io::safetensors_to_bytes(path, tensors)?)
}

/// One line per adapter that the environment (`SINTER_BACKEND`, `WGPU_BACKEND`) allows, best
/// first; the first (or the first matching `SINTER_ADAPTER`) is the one a session uses.
pub fn available_adapters() -> Result<Vec<String>, RuntimeError> {
    let choice = AdapterChoice::from_env()?;
    let adapters = pollster::block_on(list_adapters(&choice));
    Ok(adapters
        .iter()
        .map(|a| describe_adapter(&a.get_info()))
        .collect())
}

impl Session {
    /// Loads an artifact on the adapter the environment selects (see [`AdapterChoice::from_env`]).
    pub fn load(artifact: Artifact) -> Result<Session, RuntimeError> {
        Session::load_with(artifact, &AdapterChoice::from_env()?)
    }

    pub fn load_with(artifact: Artifact, choice: &AdapterChoice) -> Result<Session, RuntimeError> {
        pollster::block_on(Session::load_async(artifact, choice))
    }

    /// Reads an artifact file and loads it.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Session, RuntimeError> {
        Session::load(read_artifact(path)?)
    }

    /// Runs the graph once with named inputs; returns the named outputs in manifest order.
    pub fn run(&mut self, inputs: &[(&str, &HostTensor)]) -> Result<Outputs, RuntimeError> {
        pollster::block_on(self.run_async(inputs))
    }

    /// Runs the graph `steps` times with the same inputs; returns the last step's outputs.
    pub fn run_steps(
        &mut self,
        steps: u32,
        inputs: &[(&str, &HostTensor)],
    ) -> Result<Outputs, RuntimeError> {
        pollster::block_on(self.run_steps_async(steps, inputs))
    }

    /// Runs the graph once to warm up, then `repeats` times with a GPU timestamp around every
    /// dispatch (see [`crate::profile`]). The session must be loaded with
    /// [`AdapterChoice::profiling`].
    pub fn profile(
        &mut self,
        inputs: &[(&str, &HostTensor)],
        repeats: u32,
    ) -> Result<Profile, RuntimeError> {
        self.profile_each(inputs, &ProfileOptions::new(repeats), |_, _| {})
    }

    /// [`Session::profile`] with options, calling `each_run(run, outputs)` after every measured
    /// run (to check each run's results).
    pub fn profile_each(
        &mut self,
        inputs: &[(&str, &HostTensor)],
        options: &ProfileOptions,
        each_run: impl FnMut(u32, &Outputs),
    ) -> Result<Profile, RuntimeError> {
        pollster::block_on(self.profile_async(inputs, options, each_run))
    }

    /// Runs the graph once; reads back only the outputs named in `read` (see
    /// [`Session::run_reading_async`]: with none, it returns without waiting for the GPU).
    pub fn run_reading(
        &mut self,
        inputs: &[(&str, &HostTensor)],
        read: &[&str],
    ) -> Result<Outputs, RuntimeError> {
        pollster::block_on(self.run_reading_async(inputs, read))
    }

    /// The current value of a param or state.
    pub fn read_persistent(&self, name: &str) -> Result<HostTensor, RuntimeError> {
        pollster::block_on(self.read_persistent_async(name))
    }

    /// Every param and state with its current value, in manifest order.
    pub fn weights(&self) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        pollster::block_on(self.weights_async())
    }

    /// Writes every param and state to a safetensors file.
    pub fn save_weights(&self, path: impl AsRef<Path>) -> Result<(), RuntimeError> {
        Ok(io::write_safetensors(path.as_ref(), &self.weights()?)?)
    }

    /// Loads params and states from a safetensors file (see [`Session::load_weights`]).
    pub fn load_weights_file(&mut self, path: impl AsRef<Path>) -> Result<(), RuntimeError> {
        let weights = io::read_safetensors(path.as_ref())?;
        self.load_weights(&weights)
    }
}

impl Generator {
    /// Loads a generation artifact on the adapter the environment selects.
    pub fn load(artifact: Artifact) -> Result<Generator, RuntimeError> {
        Generator::load_with(artifact, &AdapterChoice::from_env()?)
    }

    pub fn load_with(
        artifact: Artifact,
        choice: &AdapterChoice,
    ) -> Result<Generator, RuntimeError> {
        pollster::block_on(Generator::load_async(artifact, choice))
    }

    /// See [`Generator::start_async`].
    pub fn start(&mut self, prompts: &[Vec<i32>]) -> Result<Vec<Vec<f32>>, RuntimeError> {
        pollster::block_on(self.start_async(prompts))
    }

    /// See [`Generator::push_async`].
    pub fn push(&mut self, next: &[i32]) -> Result<Vec<Vec<f32>>, RuntimeError> {
        pollster::block_on(self.push_async(next))
    }

    /// See [`Generator::generate_async`].
    pub fn generate(
        &mut self,
        prompts: &[Vec<i32>],
        max_new: usize,
        sampling: &Sampling,
        on_token: impl FnMut(&Token) -> bool,
    ) -> Result<Vec<Vec<i32>>, RuntimeError> {
        pollster::block_on(self.generate_async(prompts, max_new, sampling, on_token))
    }
}
