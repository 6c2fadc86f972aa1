//! The reference interpreter: the executable semantics of every op, in f64.
//!
//! This is the oracle that GPU kernels, gradients and rewrites are tested against. Values are
//! dense [`Tensor`]s whose elements are `f64` whatever the dtype: `f32` results are computed and
//! kept in double precision (never rounded to f32), `i32` values are stored exactly. Ops follow
//! PyTorch by name; each family's module documents its corner cases (NaN propagation, `-inf`
//! rows, casts, optimizer conventions).
//!
//! - [`evaluate()`] runs a whole graph: validates the caller's tensors, fills params and states
//!   from their initializers where not given, evaluates nodes in arena order, and returns outputs,
//!   the new values of assigned params/states, and every intermediate value.
//! - [`eval_node`] evaluates one node (used by rewrite tests and GPU differential tests).
//!
//! `grad` has no direct semantics ([`EvalError::NeedsPass`]): run autodiff first. `attention`
//! is evaluated directly; [`crate::expand::expand_composites`] must agree with it.

mod attention;
mod backward;
mod conv;
mod elementwise;
mod embedding;
mod error;
mod evaluate;
mod layout;
mod loss;
mod matmul;
mod node;
mod norm;
mod optim;
mod reduce;
pub mod special;
mod tensor;

pub use elementwise::{scalar, to_i32};
pub use error::EvalError;
pub use evaluate::{DEFAULT_MEMORY_BUDGET, EvalOptions, Evaluation, evaluate, evaluate_with};
pub use node::eval_node;
pub use tensor::Tensor;
