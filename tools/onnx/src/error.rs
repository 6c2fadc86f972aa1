//! [`ImportError`]: every way an import fails. Errors about one node name the node, its op and
//! what is missing; nothing here panics on a malformed or unsupported model.

use sinter_ir::GraphError;

/// A failed import.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("not an ONNX model: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("the model has no graph")]
    NoGraph,
    #[error(
        "the model imports opset {version} of the default ONNX domain; sinter imports opset 13 \
         and later (convert it with onnx.version_converter.convert_version(model, 13))"
    )]
    OldOpset { version: i64 },
    #[error("the model imports no opset of the default ONNX domain")]
    NoOpset,
    /// A graph input or output whose type sinter cannot give a fixed shape or dtype.
    #[error("{what} `{name}`: {problem}")]
    Port {
        what: &'static str,
        name: String,
        problem: String,
    },
    /// Dynamic dimensions that no `--dim NAME=VALUE` fixed.
    #[error(
        "dynamic dimension{} {} left open; fix each with --dim NAME=VALUE",
        if names.len() > 1 { "s" } else { "" },
        names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
    )]
    OpenDims { names: Vec<String> },
    /// A `--dim NAME=VALUE` that names no dynamic dimension of the model.
    #[error(
        "--dim {name}: the model has no dynamic dimension `{name}`{}",
        known_list(known)
    )]
    UnknownDim { name: String, known: Vec<String> },
    #[error("initializer `{name}`: {problem}")]
    Initializer { name: String, problem: String },
    /// A node that cannot be imported.
    #[error("node `{node}` ({op}): {problem}")]
    Node {
        node: String,
        op: String,
        problem: Box<Problem>,
    },
    #[error("graph output `{name}` is not computed by any node, input or initializer")]
    UnknownOutput { name: String },
}

fn known_list(known: &[String]) -> String {
    if known.is_empty() {
        " (it has none)".to_string()
    } else {
        format!(" (it has {})", known.join(", "))
    }
}

/// What is wrong with one node; [`ImportError::Node`] adds the node and op.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    /// An op sinter has no translation for (`why` says what it would need).
    #[error("unsupported op: {why}")]
    UnsupportedOp { why: String },
    /// An attribute value, dtype, shape or operand combination the translation does not cover.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An operand that must be known at import time (a shape, axes, pads) is computed at run time.
    #[error(
        "{0} must be known at import time (a constant, an initializer or computed from shapes)"
    )]
    NotStatic(String),
    /// The model breaks ONNX's own rules (a missing required attribute, a wrong operand count).
    #[error("invalid model: {0}")]
    Invalid(String),
    /// sinter's verifier refused the translated node (shapes that do not agree, for example).
    #[error("sinter rejected the translation: {0}")]
    Graph(#[from] GraphError),
}

impl Problem {
    pub(crate) fn unsupported(message: impl Into<String>) -> Problem {
        Problem::Unsupported(message.into())
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Problem {
        Problem::Invalid(message.into())
    }
}
