//! # sinter-onnx
//!
//! ONNX import: an ONNX model (opset 13 and later) becomes an ordinary [`sinter_ir::Graph`] —
//! graph inputs become `input`s, float initializers trainable `param`s, other constants
//! `state`s — plus the values of those params and states, which the command line writes as
//! safetensors beside the `.sir` text. Every ONNX op is translated into sinter's existing op
//! set ([`ops`]); shape computations whose values are known at import time are folded
//! ([`fold`]). An op, attribute value or dtype the translation does not cover is an
//! [`ImportError`] that names the node, the op and what is missing: an import never produces a
//! silently different graph.
//!
//! The protobuf types are generated at build time from the vendored `proto/onnx.proto` by
//! prost-build, with protox as the (pure Rust) protobuf compiler.
//!
//! **Architecture Invariant:** the importer is a front end: it depends on `sinter-ir` only (no
//! compiler, no runtime) and reads bytes, not files.

mod attrs;
pub mod error;
pub mod fold;
mod import;
pub mod literal;
mod names;
pub mod ops;

use std::collections::BTreeMap;

use prost::Message;
use sinter_ir::Graph;
use sinter_ir::interp::Tensor;

pub use error::{ImportError, Problem};
pub use literal::{Elem, Literal};

/// The ONNX protobuf schema (generated).
pub mod proto {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

/// How to import.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Values of the model's dynamic dimensions (`dim_param` names), e.g. `batch = 8`.
    pub dims: BTreeMap<String, usize>,
    /// Graph inputs to treat as constants with these values (they are then not inputs of the
    /// sinter graph, and shape operands fed through them become static).
    pub constants: BTreeMap<String, Literal>,
    /// The sinter graph's name (default: the ONNX graph's name).
    pub name: Option<String>,
}

/// A graph input or output: its ONNX name, its `.sir` name and its element class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub onnx: String,
    pub sir: String,
    pub elem: Elem,
}

/// An imported model.
#[derive(Debug)]
pub struct Imported {
    pub graph: Graph,
    /// The values of the graph's params and states, by `.sir` name (each declared `zeros` in
    /// the graph; load these to run the model).
    pub weights: Vec<(String, Tensor)>,
    pub inputs: Vec<Port>,
    pub outputs: Vec<Port>,
}

/// Imports a serialized ONNX `ModelProto`.
pub fn import(model: &[u8], options: &Options) -> Result<Imported, ImportError> {
    let model = proto::ModelProto::decode(model)?;
    import::import(&model, options)
}

/// Decodes a serialized `TensorProto` (the `.pb` files of ONNX's test data).
pub fn read_tensor(bytes: &[u8]) -> Result<Literal, String> {
    let t = proto::TensorProto::decode(bytes).map_err(|e| e.to_string())?;
    Literal::from_proto(&t)
}
