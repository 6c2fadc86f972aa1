//! Errors of the compiler's passes.

/// Why a graph could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(
        "`{value}` is computed by `grad`, which needs the autodiff pass; sinter cannot compile it yet"
    )]
    NeedsAutodiff { value: String },
    #[error(
        "tensor `{name}` needs {bytes} bytes, more than the largest storage binding allowed ({limit} bytes); \
         split it or raise --max-binding-size"
    )]
    TensorTooLarge {
        name: String,
        bytes: u64,
        limit: u64,
    },
    #[error(
        "arena {arena} would need {elements} elements, past the 2^32 that 32-bit kernel indexing addresses"
    )]
    IndexSpace { arena: usize, elements: u64 },
    #[error("the {kernel} kernel cannot handle this shape: {what}")]
    KernelLimit { kernel: &'static str, what: String },
    #[error("internal compiler error: kernel `{kernel}` is not valid WGSL:\n{diagnostic}")]
    InvalidWgsl { kernel: String, diagnostic: String },
    /// A value an op restricts (an index, a step count) that neither a known range nor a
    /// run-time check of an input, param or state covers.
    #[error("{what}\n  = help: {help}")]
    Unproven { what: String, help: String },
    #[error(transparent)]
    Autodiff(#[from] crate::autodiff::AutodiffError),
    /// A setting from the environment that names nothing.
    #[error("{what}: expected one of {expected}")]
    Setting { what: String, expected: String },
    /// The target cannot store a tensor of this dtype at the program's interface.
    #[error(
        "{role} `{name}` is {dtype}, and target `{target}` has no {dtype} storage\n  = help: \
         {help}"
    )]
    Storage {
        role: &'static str,
        name: String,
        dtype: sinter_ir::DType,
        target: String,
        help: String,
    },
    #[error("internal compiler error: {0}")]
    Internal(String),
}
