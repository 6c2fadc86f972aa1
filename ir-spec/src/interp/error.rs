//! [`EvalError`]: why the reference interpreter refused to run, or stopped.

use crate::infer::TypeError;
use crate::types::TensorType;

/// An error of [`super::evaluate()`] or [`super::eval_node`]. Each message names the tensor at
/// fault, so that `sinter eval` can print it as is.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EvalError {
    #[error("input `{name}` ({expected}) was not given")]
    MissingInput { name: String, expected: TensorType },
    #[error("`{name}` is not an input of the graph")]
    UnknownInput { name: String },
    #[error("input `{name}` must be {expected}, got {actual}")]
    InputType {
        name: String,
        expected: TensorType,
        actual: TensorType,
    },
    #[error("`{name}` is not a param or state of the graph")]
    UnknownPersistent { name: String },
    #[error(
        "`{name}` ({ty}) takes its value from a weights file (`= external`, as `sinter import` \
         writes a model's weights), and none was given for it"
    )]
    MissingWeight { name: String, ty: TensorType },
    #[error("param or state `{name}` must be {expected}, got {actual}")]
    PersistentType {
        name: String,
        expected: TensorType,
        actual: TensorType,
    },
    #[error("`{name}` is {ty}, which holds {expected} elements, but {actual} were given")]
    DataLength {
        name: String,
        ty: TensorType,
        expected: usize,
        actual: usize,
    },
    #[error("`{name}` is an i32 tensor, but element {index} is {value}, not an i32 value")]
    NotAnInteger {
        name: String,
        index: usize,
        value: f64,
    },
    #[error("`{op}`: `{value_name}` holds the index {index}, outside 0..{bound}")]
    IndexOutOfRange {
        op: &'static str,
        value_name: String,
        index: i64,
        bound: usize,
    },
    #[error("`{op}`: the step count `{value_name}` is {step}, but steps count from 1")]
    InvalidStep {
        op: &'static str,
        value_name: String,
        step: f64,
    },
    #[error(
        "`{name}` ({ty}) would bring the interpreter's memory to {needed} bytes, past its budget \
         of {budget} bytes (every value is kept, in f64); evaluate a smaller graph, or raise \
         the budget"
    )]
    MemoryBudget {
        name: String,
        ty: TensorType,
        needed: u64,
        budget: u64,
    },
    #[error("`{op}` has no direct semantics; run the `{pass}` pass first")]
    NeedsPass {
        op: &'static str,
        pass: &'static str,
    },
    #[error("`{op}` does not type-check: {source}")]
    Type {
        op: &'static str,
        #[source]
        source: TypeError,
    },
    #[error("`{op}` produces {expected:?}, but the caller expected {actual:?}")]
    ResultTypes {
        op: &'static str,
        expected: Vec<TensorType>,
        actual: Vec<TensorType>,
    },
}
