//! # sinter-runtime
//!
//! Loads a compiled sinter artifact (`.sart`) and runs it on a GPU through wgpu: no compiler
//! linked in. Loading picks an adapter (Vulkan first; see [`AdapterChoice`]), creates a device
//! with exactly the features and limits the artifact declares, and builds every buffer, pipeline
//! and bind group once. A run validates the named inputs against the manifest, records every
//! dispatch into one command buffer, submits once and reads the named outputs back. Params and
//! states stay on the GPU between runs; [`Session::weights`] and [`Session::load_weights`] move
//! them in and out, [`Session::save_weights`] as safetensors. A session loaded with
//! [`AdapterChoice::profiling`] times every dispatch with GPU timestamps ([`Session::profile`]).
//! A [`Generator`] runs a generation artifact's prefill and step programs over one set of
//! arenas and samples tokens from them ([`generate`], [`sample`]).
//!
//! ```no_run
//! use sinter_runtime::Session;
//! use sinter_runtime::io::HostTensor;
//!
//! let mut session = Session::from_file("mlp.sart")?;
//! let x = HostTensor::f32(vec![2, 3], vec![0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
//! let labels = HostTensor::i32(vec![2], vec![1, 0]);
//! let outputs = session.run(&[("x", &x), ("labels", &labels)])?;
//! for (name, tensor) in outputs.iter() {
//!     println!("{name}: {}", tensor.ty());
//! }
//! let loss = outputs.get("loss").expect("the graph outputs `loss`");
//! session.save_weights("mlp.safetensors")?;
//! # let _ = loss;
//! # Ok::<(), sinter_runtime::RuntimeError>(())
//! ```
//!
//! Errors are values ([`RuntimeError`]), never panics: a missing adapter, a feature or limit the
//! adapter lacks, a damaged artifact, a kernel that fails to build, an input of the wrong type.
//!
//! **Architecture Invariant:** the runtime never links the compiler; it knows the artifact
//! schema (`sinter_artifact::artifact`) and nothing of the IR's ops.
//!
//! **Architecture Invariant:** only `native.rs` (blocking wrappers, files), the native half of
//! `readback.rs` (`device.poll`) and the native pipeline threads of `session.rs` block or touch
//! the file system; the core is async and builds for `wasm32-unknown-unknown`, where nothing
//! blocks (pollster is not even linked) and wgpu runs on the browser's WebGPU (crate
//! `sinter-web` under `runtime/web` is its JavaScript API).

pub mod io;

pub mod device;
pub mod error;
pub mod generate;
#[cfg(not(target_arch = "wasm32"))]
mod native;
mod plan;
pub mod profile;
mod readback;
pub mod sample;
pub mod session;

pub use device::{AdapterChoice, Gpu, adapter_name, describe_adapter, list_adapters};
pub use error::RuntimeError;
pub use generate::{Generator, Token};
#[cfg(not(target_arch = "wasm32"))]
pub use native::{available_adapters, read_artifact};
pub use profile::{DispatchTime, KernelTime, Profile, ProfileOptions, TimestampMode};
pub use sample::{Sampler, Sampling};
pub use session::{LoadReport, Outputs, Session};
pub use sinter_artifact::artifact::Artifact;
