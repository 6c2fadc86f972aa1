//! # sinter-ir
//!
//! The intermediate representation of sinter: element and tensor [types], the [op table](op),
//! the [graph], shape and dtype [inference](infer), and the reference semantics.
//!
//! **Architecture Invariant:** this crate depends on no compiler or GPU crate (no egg, naga or
//! wgpu): it is the contract both the compiler and the runtime build against.

pub use sinter_artifact::artifact;
pub use sinter_artifact::generation;
pub mod attr;
pub mod decode;
pub mod decompose;
pub mod diag;
pub mod expand;
pub mod graph;
pub mod infer;
pub mod init;
pub mod interp;
pub mod op;
pub mod text;
pub mod train;
pub use sinter_artifact::types;

pub use attr::{Attr, Attrs, GeluForm, Key, MaskKind, Reduction, key};
pub use graph::{Assign, Graph, GraphError, Init, Node, NodeId, Value, ValueDef, ValueId};
pub use infer::{Blame, TypeError};
pub use op::{Op, OpClass, OpSpec};
pub use types::{DType, Shape, TensorType};
