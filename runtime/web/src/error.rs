//! The errors of the JavaScript API; JS sees each as an `Error` with this message.

use sinter_artifact::TensorType;
use sinter_artifact::artifact::ArtifactError;
use sinter_runtime::RuntimeError;
use sinter_runtime::io::IoError;
use wasm_bindgen::{JsCast, JsValue};

/// Anything the JavaScript API can fail with: the runtime's errors, plus what only JS values
/// and the network can get wrong.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error(
        "input `{name}` must be {} holding {expected}, but it is {found}",
        array_name(expected)
    )]
    InputKind {
        name: String,
        expected: TensorType,
        found: String,
    },
    #[error(
        "input `{name}` holds {actual} elements, but the graph expects {expected} ({} elements)",
        expected.numel()
    )]
    InputLength {
        name: String,
        expected: TensorType,
        actual: usize,
    },
    #[error("cannot fetch {url}: {reason}")]
    Fetch { url: String, reason: String },
    #[error("a JavaScript call failed: {0}")]
    Js(String),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    Io(#[from] IoError),
}

/// The typed array that carries a tensor of type `ty`, with its article.
pub(crate) fn array_name(ty: &TensorType) -> &'static str {
    match ty.dtype {
        sinter_artifact::DType::F32 | sinter_artifact::DType::F16 => "a Float32Array",
        sinter_artifact::DType::I32 => "an Int32Array",
    }
}

/// The message of a thrown JS value (an `Error`'s message, a string, or its debug form).
pub(crate) fn js_message(value: &JsValue) -> String {
    if let Some(e) = value.dyn_ref::<js_sys::Error>() {
        return String::from(e.message());
    }
    value.as_string().unwrap_or_else(|| format!("{value:?}"))
}
